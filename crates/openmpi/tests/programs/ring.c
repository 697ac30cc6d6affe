/*
 * ring: a counter goes around the ranks until it runs out.
 *
 * Rank 0 starts a counter at LAPS and sends it to rank 1, which passes it to
 * rank 2, and so on; each time it comes back to rank 0, rank 0 takes one off
 * before sending it round again.  Every rank stops after passing on a 0, and
 * rank 0 finally takes the 0 back from the last rank, so that no message is
 * left in flight.  Every rank checks each value it sees and how many it saw.
 */
#include <mpi.h>
#include <stdio.h>

#define LAPS 10
#define TAG 201

int main(int argc, char **argv)
{
    int rank, size, value = LAPS;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;

    /* Alone, rank 0 sends to itself; a one-int message is sent eagerly, so
     * the send completes before the matching receive. */
    if (rank == 0) {
        printf("ring: rank 0 sends %d around %d ranks\n", value, size);
        MPI_Send(&value, 1, MPI_INT, next, TAG, MPI_COMM_WORLD);
    }

    /* Rank 0 sees LAPS-1 .. 0 after its decrement; the others see
     * LAPS .. 0 as they arrive. */
    int seen = 0, expect = rank == 0 ? LAPS - 1 : LAPS;
    for (;;) {
        MPI_Recv(&value, 1, MPI_INT, prev, TAG, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
        if (rank == 0)
            value--;
        if (value != expect) {
            fprintf(stderr, "ring: rank %d got %d, expected %d\n", rank,
                    value, expect);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        expect--;
        seen++;
        MPI_Send(&value, 1, MPI_INT, next, TAG, MPI_COMM_WORLD);
        if (value == 0)
            break;
    }
    /* The 0 that rank 0 sent comes back once more from the last rank. */
    if (rank == 0) {
        MPI_Recv(&value, 1, MPI_INT, prev, TAG, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
        if (value != 0) {
            fprintf(stderr, "ring: rank 0 got %d back, expected 0\n", value);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }

    /* Each rank saw the values from its first expectation down to 0. */
    if (seen != (rank == 0 ? LAPS : LAPS + 1)) {
        fprintf(stderr, "ring: rank %d saw %d values\n", rank, seen);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0)
        printf("OK ring (%d ranks, %d laps)\n", size, LAPS);
    MPI_Finalize();
    return 0;
}
