#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int sizes[] = {8192, 16384, 32768, 65536, 131072};
    char *buf = malloc(1 << 20);
    for (int s = 0; s < 5; ++s) {
        int n = 2000, size = sizes[s];
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        for (int i = 0; i < n; ++i) {
            if (rank == 0) MPI_Send(buf, size, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
            else MPI_Recv(buf, size, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
        if (rank == 1) MPI_Send(buf, 1, MPI_CHAR, 0, 2, MPI_COMM_WORLD);
        else MPI_Recv(buf, 1, MPI_CHAR, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        t = MPI_Wtime() - t;
        if (rank == 0) printf("%d %.2f MB/s %.2f us/msg\n", size, (double) n * size / t / 1e6, t / n * 1e6);
    }
    MPI_Finalize();
    return 0;
}
