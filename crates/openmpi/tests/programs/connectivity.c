/*
 * connectivity: every pair of ranks can talk, both ways.
 *
 * For each pair (i, j) with i < j, in a fixed order everyone knows, rank i
 * sends a message naming the pair to rank j, which checks it and answers
 * with its own; the other ranks take no part.  Pairs go one after another,
 * so a pair whose connection cannot be established hangs or fails on its
 * own, and `-v` says which pair is being tried.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#define TAG 301

int main(int argc, char **argv)
{
    int rank, size, verbose = argc > 1 && strcmp(argv[1], "-v") == 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    for (int i = 0; i < size; i++) {
        for (int j = i + 1; j < size; j++) {
            if (rank != i && rank != j)
                continue;
            int other = rank == i ? j : i;
            /* The message names sender and receiver, so a misrouted one is
             * caught; the reply swaps them. */
            int out[2] = {rank, other}, in[2] = {-1, -1};
            if (rank == i) {
                if (verbose)
                    printf("connectivity: checking %d <-> %d\n", i, j);
                MPI_Send(out, 2, MPI_INT, j, TAG, MPI_COMM_WORLD);
                MPI_Recv(in, 2, MPI_INT, j, TAG, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(in, 2, MPI_INT, i, TAG, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
                MPI_Send(out, 2, MPI_INT, i, TAG, MPI_COMM_WORLD);
            }
            if (in[0] != other || in[1] != rank) {
                fprintf(stderr,
                        "connectivity: rank %d got {%d, %d} from %d\n", rank,
                        in[0], in[1], other);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
    }

    /* Only after everyone's pairs are done may rank 0 say so. */
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("OK connectivity (%d ranks, %d pairs)\n", size,
               size * (size - 1) / 2);
    MPI_Finalize();
    return 0;
}
