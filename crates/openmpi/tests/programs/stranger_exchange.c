/*
 * stranger_exchange: two ranks exchange checked messages until a stranger is
 * done sending forged datagrams to them, then one more round trip, so that
 * what the stranger sent has been read: it must neither crash a rank, nor
 * end the job, nor reach a message.
 *
 * usage: stranger_exchange DIR
 *
 * Each rank writes its process id to DIR/pid.<rank>; rank 0 stops the
 * exchange once DIR/done exists (the stranger makes it after its last
 * datagram), and says OK stranger_exchange if every message was right.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 2 || size != 2) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np 2 stranger_exchange DIR\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/pid.%d", argv[1], rank);
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "%ld\n", (long) getpid()) < 0 || fclose(f) != 0) {
        perror(path);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    snprintf(path, sizeof path, "%s/done", argv[1]);

    /* message[0] counts up, message[1] says whether it is the last. */
    int message[2] = {0, 0}, bad = 0;
    for (int i = 0;; i++) {
        if (rank == 0) {
            message[0] = i;
            message[1] = access(path, F_OK) == 0;
            MPI_Send(message, 2, MPI_INT, 1, 7, MPI_COMM_WORLD);
            int echo[2];
            MPI_Recv(echo, 2, MPI_INT, 1, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            bad += echo[0] != message[0] || echo[1] != message[1];
        } else {
            MPI_Recv(message, 2, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            bad += message[0] != i;
            MPI_Send(message, 2, MPI_INT, 0, 8, MPI_COMM_WORLD);
        }
        if (message[1])
            break;
        if (i % 100 == 99)
            usleep(1000);
    }
    int all_bad = 0;
    MPI_Reduce(&bad, &all_bad, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        if (all_bad)
            printf("stranger_exchange: %d messages wrong\n", all_bad);
        else
            printf("OK stranger_exchange\n");
    }
    MPI_Finalize();
    return all_bad != 0;
}
