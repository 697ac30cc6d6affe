/*
 * Asks for MPI_THREAD_MULTIPLE, which udbtl does not support: with
 * `--mca btl self,udbtl` the job must fail at MPI_Init, with Open MPI's
 * unreachable-peers message, instead of running udbtl unsafely.
 */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    int provided;
    int rank;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (0 == rank) {
        printf("OK thread_multiple provided=%d\n", provided);
    }
    MPI_Finalize();
    return 0;
}
