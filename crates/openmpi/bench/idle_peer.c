/*
 * idle_peer: what an idle peer's BTL costs shared-memory traffic. Ranks 0
 * and 1 (on one host) ping-pong 8 bytes, through vader; rank 2 (on another
 * host) is reached once at the start, through the network BTL under test,
 * so that the BML registers that BTL's progress in ranks 0 and 1, and then
 * sleeps until the ping-pong is over. Every opal_progress of ranks 0 and 1
 * calls the network BTL's progress too: an idle one should cost nothing.
 *
 *   idle_peer [iterations] [batches]
 *
 * Rank 2 sleeps between rare probes (it must not take a CPU from the
 * ping-pong on a small machine). Output (rank 0, stdout): one line
 * "latency_us MEDIAN min MIN" over the batches, one-way microseconds.
 */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int compare(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int iterations = argc > 1 ? atoi(argv[1]) : 20000;
    int batches = argc > 2 ? atoi(argv[2]) : 15;
    if (size != 3 || iterations < 1 || batches < 1 || batches > 1000) {
        if (0 == rank) {
            fprintf(stderr, "idle_peer: run with 3 ranks (2 on one host, 1 on another)\n");
        }
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    /* Everyone meets everyone once: the far rank is added (and its BTL's
     * progress registered) in ranks 0 and 1. */
    int token = rank;
    for (int peer = 0; peer < size; ++peer) {
        if (peer != rank) {
            int got;
            MPI_Sendrecv(&token, 1, MPI_INT, peer, 1, &got, 1, MPI_INT, peer, 1, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
        }
    }
    if (2 == rank) {
        /* Idle: sleep, and look now and then for the word that it is over. */
        int done = 0;
        struct timespec nap = {.tv_sec = 0, .tv_nsec = 2000000};
        while (!done) {
            MPI_Iprobe(0, 3, MPI_COMM_WORLD, &done, MPI_STATUS_IGNORE);
            nanosleep(&nap, NULL);
        }
        MPI_Recv(&token, 1, MPI_INT, 0, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
        char message[8] = {0};
        int peer = 1 - rank;
        double *results = malloc(sizeof(double) * (size_t) batches);
        for (int b = -1; b < batches; ++b) {
            double start = MPI_Wtime();
            for (int i = 0; i < iterations; ++i) {
                if (0 == rank) {
                    MPI_Send(message, 8, MPI_CHAR, peer, 2, MPI_COMM_WORLD);
                    MPI_Recv(message, 8, MPI_CHAR, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(message, 8, MPI_CHAR, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(message, 8, MPI_CHAR, peer, 2, MPI_COMM_WORLD);
                }
            }
            /* Batch -1 warms up. */
            if (b >= 0) {
                results[b] = (MPI_Wtime() - start) * 1e6 / (2.0 * iterations);
            }
        }
        if (0 == rank) {
            MPI_Send(&token, 1, MPI_INT, 2, 3, MPI_COMM_WORLD);
            qsort(results, (size_t) batches, sizeof(double), compare);
            printf("latency_us %.4f min %.4f\n", results[batches / 2], results[0]);
        }
        free(results);
    }
    MPI_Finalize();
    return 0;
}
