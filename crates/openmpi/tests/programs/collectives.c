/*
 * collectives: every common collective, checked element by element.
 *
 * Usage: collectives [--max BYTES]
 *
 * Each collective runs with per-rank blocks of 1 int, 100 ints and --max
 * bytes (default 1 MiB) of ints, so the collective algorithms' small-message
 * and large-message paths (and ob1's eager and rendezvous protocols under
 * them) are all used.  The rooted ones change root every round.  Then
 * MPI_Comm_split cuts the world into even and odd ranks, in reverse order,
 * and collectives run again on the halves.
 *
 * Values are hashes of (origin rank, element, round), so a block from the
 * wrong rank or at the wrong place is caught; reductions use values small
 * enough that a sum over all ranks cannot overflow.  Receive buffers start
 * as -1, which no value ever is, so an element never written is caught too;
 * the v-variants leave holes between blocks and check they stay -1.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int wrank, wsize;

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The value origin `from` contributes at element `i` of round `round`, for
 * destination `to` where that matters (alltoall); never negative. */
static int val(int from, int to, size_t i, int round)
{
    return (int)(mix(((uint64_t)from << 48) ^ ((uint64_t)to << 40) ^
                     ((uint64_t)round << 32) ^ i) &
                 0x7FFFFFFF);
}

/* A value to reduce: 20 bits, so 2048 ranks could add them up in an int. */
static int small(int from, size_t i, int round)
{
    return val(from, 0, i, round) & 0xFFFFF;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "collectives: rank %d: out of memory\n", wrank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return p;
}

static int *ints(size_t n)
{
    int *p = xmalloc(n * sizeof(int));
    for (size_t i = 0; i < n; i++)
        p[i] = -1;
    return p;
}

static void expect(const char *what, size_t n, size_t at, int got, int want)
{
    if (got == want)
        return;
    fprintf(stderr,
            "collectives: world rank %d: %s (%zu ints per block): element "
            "%zu is %d, expected %d\n",
            wrank, what, n, at, got, want);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Counts that differ per rank (and per pair) for the v-variants, with a
 * hole of `HOLE` ints after every block. */
#define HOLE 3
static size_t vcount(size_t n, int a, int b)
{
    return n + (size_t)((a * 7 + b * 3) % 5);
}

/* All collectives on `comm` with `n` ints per block.  `round` tells the
 * calls apart in the values. */
static void all_collectives(MPI_Comm comm, size_t n, int round)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int root = round % size;
    int cn = (int)n;
    size_t total = n * (size_t)size;
    int *send = ints(total + 8 * (size_t)size);
    int *recv = ints((n + 8 + HOLE) * (size_t)size);

    /* A barrier has nothing to check but that it returns on every rank
     * (which the collectives after it depend on). */
    MPI_Barrier(comm);

    /* bcast: the root's values reach everyone. */
    int *buf = ints(n);
    if (rank == root)
        for (size_t i = 0; i < n; i++)
            buf[i] = val(root, 0, i, round);
    MPI_Bcast(buf, cn, MPI_INT, root, comm);
    for (size_t i = 0; i < n; i++)
        expect("Bcast", n, i, buf[i], val(root, 0, i, round));

    /* reduce (sum) to the root, allreduce (sum and max) to all. */
    for (size_t i = 0; i < n; i++)
        buf[i] = small(rank, i, round);
    int *out = ints(n);
    MPI_Reduce(buf, out, cn, MPI_INT, MPI_SUM, root, comm);
    if (rank == root)
        for (size_t i = 0; i < n; i++) {
            int sum = 0;
            for (int r = 0; r < size; r++)
                sum += small(r, i, round);
            expect("Reduce(SUM)", n, i, out[i], sum);
        }
    MPI_Allreduce(buf, out, cn, MPI_INT, MPI_SUM, comm);
    for (size_t i = 0; i < n; i++) {
        int sum = 0;
        for (int r = 0; r < size; r++)
            sum += small(r, i, round);
        expect("Allreduce(SUM)", n, i, out[i], sum);
    }
    MPI_Allreduce(buf, out, cn, MPI_INT, MPI_MAX, comm);
    for (size_t i = 0; i < n; i++) {
        int max = 0;
        for (int r = 0; r < size; r++)
            if (small(r, i, round) > max)
                max = small(r, i, round);
        expect("Allreduce(MAX)", n, i, out[i], max);
    }
    free(out);

    /* gather to the root, allgather to all. */
    for (size_t i = 0; i < n; i++)
        buf[i] = val(rank, 0, i, round);
    MPI_Gather(buf, cn, MPI_INT, recv, cn, MPI_INT, root, comm);
    if (rank == root)
        for (int r = 0; r < size; r++)
            for (size_t i = 0; i < n; i++)
                expect("Gather", n, r * n + i, recv[r * n + i],
                       val(r, 0, i, round));
    for (size_t i = 0; i < total; i++)
        recv[i] = -1;
    MPI_Allgather(buf, cn, MPI_INT, recv, cn, MPI_INT, comm);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i++)
            expect("Allgather", n, r * n + i, recv[r * n + i],
                   val(r, 0, i, round));
    free(buf);

    /* gatherv / allgatherv: rank r contributes vcount(n, r, 0) ints; the
     * blocks land HOLE ints apart and the holes stay untouched. */
    int *counts = xmalloc((size_t)size * sizeof(int));
    int *displs = xmalloc((size_t)size * sizeof(int));
    int at = 0;
    for (int r = 0; r < size; r++) {
        counts[r] = (int)vcount(n, r, 0);
        displs[r] = at;
        at += counts[r] + HOLE;
    }
    int mine = counts[rank];
    for (int i = 0; i < mine; i++)
        send[i] = val(rank, 1, (size_t)i, round);
    for (int pass = 0; pass < 2; pass++) {
        const char *what = pass ? "Allgatherv" : "Gatherv";
        for (int i = 0; i < at; i++)
            recv[i] = -1;
        if (pass)
            MPI_Allgatherv(send, mine, MPI_INT, recv, counts, displs,
                           MPI_INT, comm);
        else
            MPI_Gatherv(send, mine, MPI_INT, recv, counts, displs, MPI_INT,
                        root, comm);
        if (pass || rank == root)
            for (int r = 0; r < size; r++) {
                for (int i = 0; i < counts[r]; i++)
                    expect(what, n, (size_t)(displs[r] + i),
                           recv[displs[r] + i], val(r, 1, (size_t)i, round));
                for (int h = 0; h < HOLE; h++)
                    expect(what, n, (size_t)(displs[r] + counts[r] + h),
                           recv[displs[r] + counts[r] + h], -1);
            }
    }

    /* scatter: block r of the root goes to rank r. */
    if (rank == root)
        for (int r = 0; r < size; r++)
            for (size_t i = 0; i < n; i++)
                send[r * n + i] = val(root, r, i, round);
    for (size_t i = 0; i < n + 1; i++)
        recv[i] = -1;
    MPI_Scatter(send, cn, MPI_INT, recv, cn, MPI_INT, root, comm);
    for (size_t i = 0; i < n; i++)
        expect("Scatter", n, i, recv[i], val(root, rank, i, round));
    expect("Scatter (past the block)", n, n, recv[n], -1);

    /* scatterv: the root's blocks, HOLE ints apart, of differing counts. */
    if (rank == root)
        for (int r = 0; r < size; r++)
            for (int i = 0; i < counts[r]; i++)
                send[displs[r] + i] = val(root, r + 100, (size_t)i, round);
    for (int i = 0; i < mine + 1; i++)
        recv[i] = -1;
    MPI_Scatterv(send, counts, displs, MPI_INT, recv, mine, MPI_INT, root,
                 comm);
    for (int i = 0; i < mine; i++)
        expect("Scatterv", n, (size_t)i, recv[i],
               val(root, rank + 100, (size_t)i, round));
    expect("Scatterv (past the block)", n, (size_t)mine, recv[mine], -1);

    /* alltoall: block d of rank s goes to rank d. */
    for (int d = 0; d < size; d++)
        for (size_t i = 0; i < n; i++)
            send[d * n + i] = val(rank, d, i, round);
    for (size_t i = 0; i < total; i++)
        recv[i] = -1;
    MPI_Alltoall(send, cn, MPI_INT, recv, cn, MPI_INT, comm);
    for (int s = 0; s < size; s++)
        for (size_t i = 0; i < n; i++)
            expect("Alltoall", n, s * n + i, recv[s * n + i],
                   val(s, rank, i, round));

    /* alltoallv: rank s sends vcount(n, s, d) ints to rank d. */
    int *scounts = xmalloc((size_t)size * sizeof(int));
    int *sdispls = xmalloc((size_t)size * sizeof(int));
    int sat = 0;
    at = 0;
    for (int p = 0; p < size; p++) {
        scounts[p] = (int)vcount(n, rank, p);
        sdispls[p] = sat;
        sat += scounts[p];
        counts[p] = (int)vcount(n, p, rank);
        displs[p] = at;
        at += counts[p] + HOLE;
    }
    for (int d = 0; d < size; d++)
        for (int i = 0; i < scounts[d]; i++)
            send[sdispls[d] + i] = val(rank, d + 200, (size_t)i, round);
    for (int i = 0; i < at; i++)
        recv[i] = -1;
    MPI_Alltoallv(send, scounts, sdispls, MPI_INT, recv, counts, displs,
                  MPI_INT, comm);
    for (int s = 0; s < size; s++) {
        for (int i = 0; i < counts[s]; i++)
            expect("Alltoallv", n, (size_t)(displs[s] + i),
                   recv[displs[s] + i], val(s, rank + 200, (size_t)i, round));
        for (int h = 0; h < HOLE; h++)
            expect("Alltoallv", n, (size_t)(displs[s] + counts[s] + h),
                   recv[displs[s] + counts[s] + h], -1);
    }

    free(scounts);
    free(sdispls);
    free(counts);
    free(displs);
    free(send);
    free(recv);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    size_t max = 1 << 20;
    if (argc > 2 && strcmp(argv[1], "--max") == 0)
        max = (size_t)atoll(argv[2]);
    const size_t blocks[] = {1, 100, max / sizeof(int)};
    const int nblocks = sizeof blocks / sizeof blocks[0];

    int round = 0;
    for (int b = 0; b < nblocks; b++)
        all_collectives(MPI_COMM_WORLD, blocks[b], round++);

    /* Even and odd ranks, each half in reverse world order. */
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, wrank % 2, wsize - wrank, &half);
    int hrank, hsize;
    MPI_Comm_rank(half, &hrank);
    MPI_Comm_size(half, &hsize);
    int want_size = (wsize - wrank % 2 + 1) / 2;
    /* The highest world rank of this parity is rank 0 of the half. */
    int want_rank = (wsize - 1 - wrank) / 2;
    if (hsize != want_size || hrank != want_rank) {
        fprintf(stderr,
                "collectives: world rank %d: split gave rank %d of %d, "
                "expected %d of %d\n",
                wrank, hrank, hsize, want_rank, want_size);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* The half's members, gathered over the half, must be this parity's
     * world ranks in the order the keys ask for. */
    int *members = ints((size_t)hsize);
    MPI_Allgather(&wrank, 1, MPI_INT, members, 1, MPI_INT, half);
    for (int r = 0; r < hsize; r++) {
        int want = wsize - 1 - r * 2;
        if ((want - wrank) % 2 != 0)
            want--;
        expect("Comm_split membership", 1, (size_t)r, members[r], want);
    }
    free(members);
    for (int b = 0; b < nblocks; b++)
        all_collectives(half, blocks[b], round++);
    MPI_Comm_free(&half);

    int ok = 1, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (wrank == 0 && all_ok)
        printf("OK collectives (%d ranks, blocks up to %zu bytes)\n", wsize,
               max);
    MPI_Finalize();
    return 0;
}
