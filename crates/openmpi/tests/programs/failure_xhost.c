/* Point-to-point and collectives with every result checked, for the
 * two-host test (tests/twohosts.rs): small enough to read, and covering the
 * paths a BTL serves (eager, rendezvous, many peers at once, both directions).
 * Exits non-zero (MPI_Abort) at the first wrong byte; prints "XHOST OK" from
 * each rank, with its network namespace, when everything matched.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size;

static void fail(const char *what, long detail) {
    fprintf(stderr, "rank %d: %s is wrong (%ld)\n", rank, what, detail);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

static unsigned char byte(int from, int to, size_t i) {
    return (unsigned char)(from * 31 + to * 7 + i * 13 + (i >> 8));
}

/* Each rank sends to the next and receives from the previous, at sizes from
 * empty to several datagrams' worth and past the eager limit. */
static void ring(void) {
    static const size_t sizes[] = {0, 1, 8, 1000, 4096, 65536, 1 << 20, 4 << 20};
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    unsigned char *out = malloc(4 << 20), *in = malloc(4 << 20);
    if (!out || !in) fail("malloc", 0);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        for (size_t i = 0; i < n; i++) out[i] = byte(rank, next, i);
        memset(in, 0, n);
        MPI_Status st;
        MPI_Sendrecv(out, (int)n, MPI_BYTE, next, (int)s, in, (int)n, MPI_BYTE, prev, (int)s,
                     MPI_COMM_WORLD, &st);
        int got;
        MPI_Get_count(&st, MPI_BYTE, &got);
        if ((size_t)got != n) fail("ring message length", got);
        for (size_t i = 0; i < n; i++)
            if (in[i] != byte(prev, rank, i)) fail("ring message byte", (long)i);
    }
    free(out);
    free(in);
}

/* Many small nonblocking messages to every peer at once, received by
 * wildcard: order per (source, tag) must hold. */
static void burst(void) {
    enum { COUNT = 200 };
    int *out = malloc(sizeof(int) * COUNT * size), *in = malloc(sizeof(int) * COUNT * size);
    MPI_Request *req = malloc(sizeof(MPI_Request) * 2 * COUNT * size);
    int *next_seq = calloc(size, sizeof(int));
    if (!out || !in || !req || !next_seq) fail("malloc", 0);
    int r = 0;
    for (int k = 0; k < COUNT * size; k++)
        MPI_Irecv(&in[k], 1, MPI_INT, MPI_ANY_SOURCE, 7, MPI_COMM_WORLD, &req[r++]);
    for (int k = 0; k < COUNT; k++)
        for (int p = 0; p < size; p++) {
            out[k * size + p] = rank * 100000 + k;
            MPI_Isend(&out[k * size + p], 1, MPI_INT, p, 7, MPI_COMM_WORLD, &req[r++]);
        }
    MPI_Waitall(r, req, MPI_STATUSES_IGNORE);
    /* Receives match in posting order, so each source's values appear in
     * the order it sent them. */
    for (int k = 0; k < COUNT * size; k++) {
        int from = in[k] / 100000, seq = in[k] % 100000;
        if (from < 0 || from >= size || seq != next_seq[from]) fail("burst order", in[k]);
        next_seq[from]++;
    }
    free(out);
    free(in);
    free(req);
    free(next_seq);
}

static void collectives(void) {
    /* Bcast of 1 MiB from the last rank (on the other host from rank 0). */
    size_t n = 1 << 20;
    unsigned char *buf = malloc(n);
    if (!buf) fail("malloc", 0);
    int root = size - 1;
    for (size_t i = 0; i < n; i++) buf[i] = rank == root ? byte(root, 0, i) : 0;
    MPI_Bcast(buf, (int)n, MPI_BYTE, root, MPI_COMM_WORLD);
    for (size_t i = 0; i < n; i++)
        if (buf[i] != byte(root, 0, i)) fail("bcast byte", (long)i);
    free(buf);

    /* Allreduce of 100000 doubles: element i sums to size*i + size*(size-1)/2. */
    enum { N = 100000 };
    double *x = malloc(sizeof(double) * N), *sum = malloc(sizeof(double) * N);
    if (!x || !sum) fail("malloc", 0);
    for (int i = 0; i < N; i++) x[i] = i + rank;
    MPI_Allreduce(x, sum, N, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < N; i++)
        if (sum[i] != (double)size * i + size * (size - 1) / 2.0) fail("allreduce element", i);
    free(x);
    free(sum);

    /* Alltoall: block j of rank r's output goes to rank j. */
    enum { B = 3000 };
    int *a = malloc(sizeof(int) * B * size), *b = malloc(sizeof(int) * B * size);
    if (!a || !b) fail("malloc", 0);
    for (int j = 0; j < size; j++)
        for (int i = 0; i < B; i++) a[j * B + i] = (rank * size + j) * B + i;
    MPI_Alltoall(a, B, MPI_INT, b, B, MPI_INT, MPI_COMM_WORLD);
    for (int j = 0; j < size; j++)
        for (int i = 0; i < B; i++)
            if (b[j * B + i] != (j * size + rank) * B + i) fail("alltoall element", j * B + i);
    free(a);
    free(b);

    MPI_Barrier(MPI_COMM_WORLD);
}

/* Gathers each rank's network namespace: shows where the ranks ran. */
static void where(void) {
    char ns[64] = "?";
    ssize_t len = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    ns[len > 0 ? len : 1] = '\0';
    char *all = rank == 0 ? malloc(64 * (size_t)size) : NULL;
    MPI_Gather(ns, 64, MPI_CHAR, all, 64, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        for (int r = 0; r < size; r++) printf("rank %d: %s\n", r, all + 64 * r);
        free(all);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    for (int round = 0; round < rounds; round++) {
        ring();
        burst();
        collectives();
    }
    where();
    printf("XHOST OK rank %d of %d\n", rank, size);
    MPI_Finalize();
    return 0;
}
