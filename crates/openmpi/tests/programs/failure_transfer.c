/* Endless large-message traffic for the failure tests (tests/failure.rs).
 *
 *   failure_transfer TAG [SECONDS [BYTES]]
 *
 * Rank 0 streams BYTES-long messages (default 8 MiB) to every other rank in
 * turn, for SECONDS (default 300), then tells them to stop. The test kills or
 * stops a rank in the middle and expects the job to end non-zero long before
 * SECONDS; a clean exit therefore means that no failure was noticed.
 *
 * Rank 0 only sends: while it waits in a send, its transport holds
 * unacknowledged data for the peer, which is what lets a transport notice
 * that the peer stopped answering. (A rank that only waits to receive has
 * nothing outstanding and cannot tell a silent peer from a slow one.)
 *
 * TAG is not used: it makes this job's command lines unique, so the test can
 * find exactly its own processes with pgrep -f.
 *
 * Each rank prints "PID <rank> <pid>" at start so that the test can signal
 * it, and rank 0 prints "ROUND <n>" after each round to show that data flows.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static uint64_t word(uint64_t round, int peer, size_t i) {
    return (round * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)peer << 56) ^ i;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    printf("PID %d %ld\n", rank, (long)getpid());
    fflush(stdout);
    if (argc < 2 || size < 2) {
        if (rank == 0) fprintf(stderr, "usage: mpirun -np N>=2 failure_transfer TAG [SECONDS [BYTES]]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double seconds = argc > 2 ? atof(argv[2]) : 300.0;
    size_t bytes = argc > 3 ? (size_t)atol(argv[3]) : (size_t)8 << 20;
    size_t words = bytes / sizeof(uint64_t);
    if (words < 2) words = 2;
    uint64_t *buf = malloc(words * sizeof(uint64_t));
    if (!buf) MPI_Abort(MPI_COMM_WORLD, 2);

    /* Word 0 carries the round number, or UINT64_MAX to stop. */
    uint64_t round = 0;
    if (rank == 0) {
        double start = MPI_Wtime();
        for (round = 1; MPI_Wtime() - start < seconds; round++) {
            for (int peer = 1; peer < size; peer++) {
                buf[0] = round;
                for (size_t i = 1; i < words; i++) buf[i] = word(round, peer, i);
                MPI_Send(buf, (int)words, MPI_UINT64_T, peer, 1, MPI_COMM_WORLD);
            }
            printf("ROUND %llu\n", (unsigned long long)round);
            fflush(stdout);
        }
        buf[0] = UINT64_MAX;
        for (int peer = 1; peer < size; peer++)
            MPI_Send(buf, 1, MPI_UINT64_T, peer, 1, MPI_COMM_WORLD);
        printf("DONE after %llu rounds: no failure was noticed\n", (unsigned long long)round - 1);
        fflush(stdout);
    } else {
        for (;;) {
            MPI_Recv(buf, (int)words, MPI_UINT64_T, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (buf[0] == UINT64_MAX) break;
            round = buf[0];
            /* Check the ends and a stride through the middle: enough to see a
             * misplaced fragment without slowing the stream. */
            for (size_t i = 1; i < words; i += (i < 64 || i > words - 64) ? 1 : 4093) {
                if (buf[i] != word(round, rank, i)) {
                    fprintf(stderr, "rank %d: round %llu word %zu is wrong\n", rank,
                            (unsigned long long)round, i);
                    MPI_Abort(MPI_COMM_WORLD, 3);
                }
            }
        }
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
