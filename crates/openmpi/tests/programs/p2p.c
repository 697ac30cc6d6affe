/*
 * p2p: point-to-point transfers of every interesting size, checked byte by
 * byte.
 *
 * Usage: p2p [--max BYTES] [--big BYTES] [THRESHOLD...]
 *
 * The sizes are 0..8, every power of two up to --max (default 64 MiB), and
 * around each THRESHOLD given on the command line (the BTL's eager_limit,
 * rndv_eager_limit and max_send_size): T-1, T and T+1, plus the same three
 * a header's length below T, because ob1 puts its own header in front of the
 * user data, so the user size at which ob1 changes protocol or fragments
 * lies a few tens of bytes below the BTL's number.
 *
 * For each size, four exchanges run:
 *   1. blocking MPI_Send / MPI_Recv between partners (rank ^ 1),
 *   2. MPI_Sendrecv between the same partners,
 *   3. MPI_Isend / MPI_Irecv / MPI_Waitall between the same partners,
 *   4. a ring: every rank exchanges with both neighbours at once
 *      (nonblocking), so every pair of neighbours talks, in both directions.
 * A rank without a partner (the last one when the size is odd) sends to
 * itself in 2 and 3, and skips 1 (a blocking send to oneself beyond the
 * eager limit would wait forever for the receive posted after it).
 * Sizes above --big (default 4 MiB) only run exchange 3: the protocol is
 * the same at every size by then, and these are what take the time.
 *
 * Every message is filled from a pattern seeded by sender, size, exchange and
 * direction, so a byte delivered to the wrong offset, from the wrong message
 * or from a stale buffer is caught.  The receive buffer is poisoned with the
 * complement of the expected bytes (so every byte that is never written
 * differs), and guard bytes after it catch writes past the message.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 64
#define GUARD_BYTE 0xA5
#define MAX_SIZES 256

static int rank, nprocs;

/* splitmix64 finaliser: cheap, and every output bit depends on every input
 * bit, so nearby offsets and seeds give unrelated bytes. */
static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The byte pattern of one message: 8 bytes per hash, so filling and checking
 * 64 MiB stays well under a second. */
static void fill(unsigned char *buf, size_t n, uint64_t seed)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w = mix(seed ^ (i / 8) * 0x100000001B3ull);
        memcpy(buf + i, &w, 8);
    }
    if (i < n) {
        uint64_t w = mix(seed ^ (i / 8) * 0x100000001B3ull);
        memcpy(buf + i, &w, n - i);
    }
}

static uint64_t seed_of(int src, size_t size, int exchange, int direction)
{
    return mix(((uint64_t)src << 48) ^ ((uint64_t)exchange << 40) ^
               ((uint64_t)direction << 36) ^ (uint64_t)size);
}

/* Makes every byte of the receive area differ from what should arrive, and
 * sets the guard after it. */
static void poison(unsigned char *buf, size_t n, uint64_t seed)
{
    fill(buf, n, seed);
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)~buf[i];
    memset(buf + n, GUARD_BYTE, GUARD);
}

static void fail(const char *what, int src, size_t size, const char *detail)
{
    fprintf(stderr, "p2p: rank %d: %s from rank %d, size %zu: %s\n", rank,
            what, src, size, detail);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Checks a received message against the pattern, its guard and its status. */
static void check(const char *what, const unsigned char *buf, size_t n,
                  uint64_t seed, int src, const MPI_Status *status,
                  unsigned char *scratch)
{
    char detail[160];
    if (status) {
        int count;
        MPI_Get_count(status, MPI_BYTE, &count);
        if ((size_t)count != n || status->MPI_SOURCE != src) {
            snprintf(detail, sizeof detail,
                     "status says %d bytes from rank %d", count,
                     status->MPI_SOURCE);
            fail(what, src, n, detail);
        }
    }
    fill(scratch, n, seed);
    if (memcmp(buf, scratch, n) != 0) {
        size_t i = 0;
        while (buf[i] == scratch[i])
            i++;
        snprintf(detail, sizeof detail,
                 "first wrong byte at offset %zu: got 0x%02x, want 0x%02x", i,
                 buf[i], scratch[i]);
        fail(what, src, n, detail);
    }
    for (size_t i = 0; i < GUARD; i++) {
        if (buf[n + i] != GUARD_BYTE) {
            snprintf(detail, sizeof detail, "wrote past the end (offset %zu)",
                     n + i);
            fail(what, src, n, detail);
        }
    }
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

static void add(size_t *sizes, int *count, long long s, size_t max)
{
    if (s >= 0 && (size_t)s <= max && *count < MAX_SIZES)
        sizes[(*count)++] = (size_t)s;
}

/* The sorted, de-duplicated list of sizes to try. */
static int size_list(size_t *sizes, size_t max, int nthresh, char **thresh)
{
    /* ob1 header lengths to subtract from each threshold: the match header,
     * and the larger rendezvous and fragment headers, with some slack for
     * padding in other builds. */
    static const int headers[] = {14, 16, 24, 32, 40, 48};
    int count = 0;
    for (long long s = 0; s <= 8; s++)
        add(sizes, &count, s, max);
    for (long long s = 16; (size_t)s <= max; s *= 2)
        add(sizes, &count, s, max);
    for (int t = 0; t < nthresh; t++) {
        long long T = atoll(thresh[t]);
        if (T <= 0)
            continue;
        for (int d = -1; d <= 1; d++) {
            add(sizes, &count, T + d, max);
            for (size_t h = 0; h < sizeof headers / sizeof headers[0]; h++)
                add(sizes, &count, T - headers[h] + d, max);
        }
    }
    qsort(sizes, (size_t)count, sizeof sizes[0], cmp_size);
    int unique = 0;
    for (int i = 0; i < count; i++)
        if (unique == 0 || sizes[unique - 1] != sizes[i])
            sizes[unique++] = sizes[i];
    return unique;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "p2p: rank %d: out of memory (%zu bytes)\n", rank, n);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return p;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);

    size_t max = (size_t)64 << 20, big = (size_t)4 << 20;
    int first = 1;
    while (first + 1 < argc && strncmp(argv[first], "--", 2) == 0) {
        if (strcmp(argv[first], "--max") == 0)
            max = (size_t)atoll(argv[first + 1]);
        else if (strcmp(argv[first], "--big") == 0)
            big = (size_t)atoll(argv[first + 1]);
        else
            break;
        first += 2;
    }
    size_t sizes[MAX_SIZES];
    int nsizes = size_list(sizes, max, argc - first, argv + first);
    size_t largest = sizes[nsizes - 1];

    /* Two outgoing and two incoming messages are in flight at once in the
     * ring; the scratch buffer holds the expected pattern. */
    unsigned char *send0 = xmalloc(largest + GUARD);
    unsigned char *send1 = xmalloc(largest + GUARD);
    unsigned char *recv0 = xmalloc(largest + GUARD);
    unsigned char *recv1 = xmalloc(largest + GUARD);
    unsigned char *scratch = xmalloc(largest + GUARD);

    /* Partners: 0-1, 2-3, ...; an odd last rank pairs with itself. */
    int partner = (rank ^ 1) < nprocs ? (rank ^ 1) : rank;
    int right = (rank + 1) % nprocs, left = (rank + nprocs - 1) % nprocs;

    for (int s = 0; s < nsizes; s++) {
        size_t n = sizes[s];
        int count = (int)n;
        MPI_Status st[4];
        MPI_Request req[4];
        /* Tags differ per size so that a message of one size can never be
         * taken for one of the next. */
        int tag = s * 8;

        /* 1. Blocking send and receive; the lower rank sends first so the
         * pair cannot both block in a rendezvous send. */
        int all = n <= big;

        if (all && partner != rank) {
            fill(send0, n, seed_of(rank, n, 1, 0));
            poison(recv0, n, seed_of(partner, n, 1, 0));
            if (rank < partner) {
                MPI_Send(send0, count, MPI_BYTE, partner, tag + 1,
                         MPI_COMM_WORLD);
                MPI_Recv(recv0, count, MPI_BYTE, partner, tag + 1,
                         MPI_COMM_WORLD, &st[0]);
            } else {
                MPI_Recv(recv0, count, MPI_BYTE, partner, tag + 1,
                         MPI_COMM_WORLD, &st[0]);
                MPI_Send(send0, count, MPI_BYTE, partner, tag + 1,
                         MPI_COMM_WORLD);
            }
            check("Send/Recv", recv0, n, seed_of(partner, n, 1, 0), partner,
                  &st[0], scratch);
        }

        /* 2. Sendrecv. */
        if (all) {
            fill(send0, n, seed_of(rank, n, 2, 0));
            poison(recv0, n, seed_of(partner, n, 2, 0));
            MPI_Sendrecv(send0, count, MPI_BYTE, partner, tag + 2, recv0,
                         count, MPI_BYTE, partner, tag + 2, MPI_COMM_WORLD,
                         &st[0]);
            check("Sendrecv", recv0, n, seed_of(partner, n, 2, 0), partner,
                  &st[0], scratch);
        }

        /* 3. Nonblocking, receive posted after the send on purpose (the
         * message may arrive unexpected), completed together. */
        fill(send0, n, seed_of(rank, n, 3, 0));
        poison(recv0, n, seed_of(partner, n, 3, 0));
        MPI_Isend(send0, count, MPI_BYTE, partner, tag + 3, MPI_COMM_WORLD,
                  &req[0]);
        MPI_Irecv(recv0, count, MPI_BYTE, partner, tag + 3, MPI_COMM_WORLD,
                  &req[1]);
        MPI_Waitall(2, req, st);
        check("Isend/Irecv", recv0, n, seed_of(partner, n, 3, 0), partner,
              &st[1], scratch);

        /* 4. Ring, both directions at once.  Direction 0 travels right,
         * direction 1 travels left; distinct tags keep them apart when left
         * and right are the same rank (2 ranks) or oneself (1 rank). */
        if (!all)
            continue;
        fill(send0, n, seed_of(rank, n, 4, 0));
        fill(send1, n, seed_of(rank, n, 4, 1));
        poison(recv0, n, seed_of(left, n, 4, 0));
        poison(recv1, n, seed_of(right, n, 4, 1));
        MPI_Irecv(recv0, count, MPI_BYTE, left, tag + 4, MPI_COMM_WORLD,
                  &req[0]);
        MPI_Irecv(recv1, count, MPI_BYTE, right, tag + 5, MPI_COMM_WORLD,
                  &req[1]);
        MPI_Isend(send0, count, MPI_BYTE, right, tag + 4, MPI_COMM_WORLD,
                  &req[2]);
        MPI_Isend(send1, count, MPI_BYTE, left, tag + 5, MPI_COMM_WORLD,
                  &req[3]);
        MPI_Waitall(4, req, st);
        check("ring (rightwards)", recv0, n, seed_of(left, n, 4, 0), left,
              &st[0], scratch);
        check("ring (leftwards)", recv1, n, seed_of(right, n, 4, 1), right,
              &st[1], scratch);
    }

    /* Nobody reports success until every rank has checked everything. */
    int ok = 1, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (rank == 0 && all_ok)
        printf("OK p2p (%d ranks, %d sizes up to %zu bytes)\n", nprocs,
               nsizes, largest);

    free(send0);
    free(send1);
    free(recv0);
    free(recv1);
    free(scratch);
    MPI_Finalize();
    return 0;
}
