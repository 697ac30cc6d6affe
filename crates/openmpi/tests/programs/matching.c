/*
 * matching: receives that do not name their message up front, and
 * synchronous sends.
 *
 * Usage: matching [--large BYTES]
 *
 *   1. Wildcards: every rank (rank 0 too) sends PER_RANK messages to rank 0,
 *      each with its own tag and size; rank 0 takes them all with
 *      MPI_ANY_SOURCE / MPI_ANY_TAG and checks that the status names a
 *      source and tag that were sent, that the count fits that message, that
 *      the content is that message's, and that none arrives twice.
 *   2. MPI_Probe then MPI_Recv: every rank sends messages of sizes its right
 *      neighbour cannot know in advance; the neighbour probes, sizes its
 *      buffer from the probed count and receives exactly that message.
 *   3. The same with MPI_Iprobe, polled until a message shows up.
 *   4. MPI_Ssend between partners (rank ^ 1), and MPI_Issend, whose
 *      completion must wait for the matching receive: the sender checks that
 *      it is still incomplete while the receiver has provably not posted the
 *      receive yet (it is waiting for a "go" message the sender only sends
 *      afterwards).
 * Sizes run from 0 bytes to --large (default 1 MiB), so both the eager and
 * the rendezvous protocols meet each kind of receive.
 *
 * Works with any number of ranks; alone, a rank talks to itself.
 */
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PER_RANK 12
#define GUARD 32
#define GUARD_BYTE 0x5A

static int rank, nprocs;
static size_t large = 1 << 20;

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static void fill(unsigned char *buf, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = mix(seed ^ (i / 8) * 0x100000001B3ull);
        memcpy(buf + i, &w, n - i < 8 ? n - i : 8);
    }
}

static void fail(const char *phase, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void fail(const char *phase, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "matching: rank %d: %s: ", rank, phase);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        fail("malloc", "out of memory (%zu bytes)", n);
    return p;
}

/* Message i of a sender, in phases where the receiver must not know the
 * size: a spread from empty through small, around 64 KiB (typical eager
 * limits) and up to `large`, depending on sender and i so that neighbours
 * send different sequences. */
static size_t size_of(int src, int i)
{
    static const size_t base[PER_RANK] = {0, 1, 7, 100, 4096, 65000, 65536,
                                          70000, 131072, 300000, 0, 0};
    size_t s = base[(i + src) % PER_RANK];
    if (s == 0 && (i + src) % PER_RANK >= 10)
        s = large - (size_t)((i + src) % PER_RANK - 10) * 4097;
    return s > large ? large : s;
}

static uint64_t seed_of(int phase, int src, int tag)
{
    return mix(((uint64_t)phase << 56) ^ ((uint64_t)src << 32) ^
               (uint64_t)tag);
}

/* Checks the content and guard of a message received into buf. */
static void check(const char *phase, const unsigned char *buf, size_t n,
                  uint64_t seed, unsigned char *scratch)
{
    fill(scratch, n, seed);
    for (size_t i = 0; i < n; i++)
        if (buf[i] != scratch[i])
            fail(phase, "wrong byte at offset %zu of %zu", i, n);
    for (size_t i = 0; i < GUARD; i++)
        if (buf[n + i] != GUARD_BYTE)
            fail(phase, "wrote past the end of %zu bytes (offset %zu)", n,
                 n + i);
}

static void expect_status(const char *phase, const MPI_Status *st, int src,
                          int tag, size_t n)
{
    int count;
    MPI_Get_count(st, MPI_BYTE, &count);
    if (st->MPI_SOURCE != src)
        fail(phase, "status source %d, expected %d", st->MPI_SOURCE, src);
    if (st->MPI_TAG != tag)
        fail(phase, "status tag %d, expected %d", st->MPI_TAG, tag);
    if ((size_t)count != n)
        fail(phase, "status count %d, expected %zu", count, n);
}

/* 1. Wildcard receives at rank 0. */
static void wildcards(unsigned char *scratch)
{
    /* Tags are unique per message of a sender: 1000 + i.  Sizes depend on
     * the tag, so a status whose tag and count disagree is caught. */
    unsigned char *out[PER_RANK];
    MPI_Request req[PER_RANK];
    for (int i = 0; i < PER_RANK; i++) {
        size_t n = size_of(rank, i);
        out[i] = xmalloc(n);
        fill(out[i], n, seed_of(1, rank, 1000 + i));
        MPI_Isend(out[i], (int)n, MPI_BYTE, 0, 1000 + i, MPI_COMM_WORLD,
                  &req[i]);
    }
    if (rank == 0) {
        char *seen = calloc((size_t)nprocs * PER_RANK, 1);
        unsigned char *in = xmalloc(large + GUARD);
        for (int k = 0; k < nprocs * PER_RANK; k++) {
            MPI_Status st;
            memset(in, GUARD_BYTE, large + GUARD);
            MPI_Recv(in, (int)large, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG,
                     MPI_COMM_WORLD, &st);
            int src = st.MPI_SOURCE, i = st.MPI_TAG - 1000;
            if (src < 0 || src >= nprocs || i < 0 || i >= PER_RANK)
                fail("ANY_SOURCE/ANY_TAG", "bogus source %d or tag %d",
                     src, st.MPI_TAG);
            if (seen[src * PER_RANK + i]++)
                fail("ANY_SOURCE/ANY_TAG", "message %d from %d twice", i,
                     src);
            size_t n = size_of(src, i);
            expect_status("ANY_SOURCE/ANY_TAG", &st, src, 1000 + i, n);
            /* The receive buffer is `large`, longer than most messages:
             * nothing past the message may change. */
            fill(scratch, n, seed_of(1, src, 1000 + i));
            if (memcmp(in, scratch, n) != 0)
                fail("ANY_SOURCE/ANY_TAG", "wrong content from %d tag %d",
                     src, st.MPI_TAG);
            for (size_t b = n; b < large + GUARD; b++)
                if (in[b] != GUARD_BYTE)
                    fail("ANY_SOURCE/ANY_TAG",
                         "wrote past %zu bytes (offset %zu)", n, b);
        }
        free(in);
        free(seen);
    }
    MPI_Waitall(PER_RANK, req, MPI_STATUSES_IGNORE);
    for (int i = 0; i < PER_RANK; i++)
        free(out[i]);
}

/* 2 and 3. Probe (blocking or polled) and receive what was probed. */
static void probes(int phase, int poll, unsigned char *scratch)
{
    const char *name = poll ? "Iprobe" : "Probe";
    int right = (rank + 1) % nprocs, left = (rank + nprocs - 1) % nprocs;
    unsigned char *out[PER_RANK];
    MPI_Request req[PER_RANK];
    for (int i = 0; i < PER_RANK; i++) {
        size_t n = size_of(rank + phase, i);
        out[i] = xmalloc(n);
        fill(out[i], n, seed_of(phase, rank, 2000 + i));
        MPI_Isend(out[i], (int)n, MPI_BYTE, right, 2000 + i, MPI_COMM_WORLD,
                  &req[i]);
    }
    for (int k = 0; k < PER_RANK; k++) {
        MPI_Status st;
        if (poll) {
            int found = 0;
            while (!found)
                MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD,
                           &found, &st);
        } else {
            MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
        }
        int i = st.MPI_TAG - 2000, count;
        MPI_Get_count(&st, MPI_BYTE, &count);
        if (st.MPI_SOURCE != left || i < 0 || i >= PER_RANK)
            fail(name, "probed source %d tag %d", st.MPI_SOURCE, st.MPI_TAG);
        size_t n = size_of(left + phase, i);
        if ((size_t)count != n)
            fail(name, "probed count %d, expected %zu", count, n);
        /* Exactly the probed size: a receive that is too short would fail
         * with MPI_ERR_TRUNCATE, so this also proves the count right. */
        unsigned char *in = xmalloc((size_t)count + GUARD);
        memset(in, GUARD_BYTE, (size_t)count + GUARD);
        MPI_Status rst;
        MPI_Recv(in, count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG,
                 MPI_COMM_WORLD, &rst);
        expect_status(name, &rst, left, 2000 + i, n);
        check(name, in, n, seed_of(phase, left, 2000 + i), scratch);
        free(in);
    }
    MPI_Waitall(PER_RANK, req, MPI_STATUSES_IGNORE);
    for (int i = 0; i < PER_RANK; i++)
        free(out[i]);
    /* The next phase must not find this phase's messages with its probes. */
    MPI_Barrier(MPI_COMM_WORLD);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 4. Synchronous sends between partners. */
static void synchronous(unsigned char *scratch)
{
    static const size_t sizes[] = {0, 1, 1000, 65536, 200000};
    int partner = (rank ^ 1) < nprocs ? (rank ^ 1) : rank;
    int lower = rank <= partner;
    unsigned char *out = xmalloc(large + GUARD);
    unsigned char *in = xmalloc(large + GUARD);
    for (size_t s = 0; s <= sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = s < sizeof sizes / sizeof sizes[0] ? sizes[s] : large;
        int tag = 3000 + (int)s * 4;
        MPI_Status st;

        /* Blocking MPI_Ssend: lower sends first, as with MPI_Send. */
        if (partner != rank) {
            fill(out, n, seed_of(4, rank, tag));
            memset(in, GUARD_BYTE, n + GUARD);
            if (lower) {
                MPI_Ssend(out, (int)n, MPI_BYTE, partner, tag, MPI_COMM_WORLD);
                MPI_Recv(in, (int)n, MPI_BYTE, partner, tag, MPI_COMM_WORLD,
                         &st);
            } else {
                MPI_Recv(in, (int)n, MPI_BYTE, partner, tag, MPI_COMM_WORLD,
                         &st);
                MPI_Ssend(out, (int)n, MPI_BYTE, partner, tag, MPI_COMM_WORLD);
            }
            expect_status("Ssend", &st, partner, tag, n);
            check("Ssend", in, n, seed_of(4, partner, tag), scratch);
        }

        /* MPI_Issend: the lower rank (or a lone rank, to itself) sends and
         * must stay incomplete until the receiver has its "go". */
        int go = 1;
        if (lower) {
            MPI_Request sreq, rreq = MPI_REQUEST_NULL;
            fill(out, n, seed_of(5, rank, tag));
            MPI_Issend(out, (int)n, MPI_BYTE, partner, tag + 1,
                       MPI_COMM_WORLD, &sreq);
            /* Give the message time to reach the partner and be held there
             * unmatched; a completion now would break MPI_Issend's
             * guarantee. */
            double until = now() + 0.02;
            while (now() < until) {
                int done;
                MPI_Test(&sreq, &done, MPI_STATUS_IGNORE);
                if (done)
                    fail("Issend", "completed before the receive of %zu "
                         "bytes was posted", n);
            }
            if (partner == rank) {
                memset(in, GUARD_BYTE, n + GUARD);
                MPI_Irecv(in, (int)n, MPI_BYTE, rank, tag + 1, MPI_COMM_WORLD,
                          &rreq);
            } else {
                MPI_Send(&go, 1, MPI_INT, partner, tag + 2, MPI_COMM_WORLD);
            }
            MPI_Wait(&sreq, MPI_STATUS_IGNORE);
            if (partner == rank) {
                MPI_Wait(&rreq, &st);
                expect_status("Issend", &st, rank, tag + 1, n);
                check("Issend", in, n, seed_of(5, rank, tag), scratch);
            }
        } else {
            MPI_Recv(&go, 1, MPI_INT, partner, tag + 2, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            memset(in, GUARD_BYTE, n + GUARD);
            MPI_Recv(in, (int)n, MPI_BYTE, partner, tag + 1, MPI_COMM_WORLD,
                     &st);
            expect_status("Issend", &st, partner, tag + 1, n);
            check("Issend", in, n, seed_of(5, partner, tag), scratch);
        }
    }
    free(out);
    free(in);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    if (argc > 2 && strcmp(argv[1], "--large") == 0)
        large = (size_t)atoll(argv[2]);
    if (large < 300000)
        large = 300000;

    unsigned char *scratch = xmalloc(large + GUARD);
    wildcards(scratch);
    MPI_Barrier(MPI_COMM_WORLD);
    probes(2, 0, scratch);
    probes(3, 1, scratch);
    synchronous(scratch);

    int ok = 1, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (rank == 0 && all_ok)
        printf("OK matching (%d ranks)\n", nprocs);
    free(scratch);
    MPI_Finalize();
    return 0;
}
