/*
 * halo: a one-dimensional halo exchange, the communication pattern of a
 * stencil code. Every rank swaps a halo of each size with both neighbours on
 * a ring (MPI_Irecv, MPI_Isend, MPI_Waitall), then touches its own halo as a
 * stand-in for the computation, for a number of steps per size. Rank 0
 * prints one line per size: the size, and the wall-clock microseconds one
 * step took, the slowest rank's.
 *
 * usage: halo [--steps N] [--min BYTES] [--max BYTES]
 *        (default 200 steps, 1 KiB to 64 KiB, doubling)
 *
 * Meant to run with more ranks than CPUs (4 ranks on 2 CPUs across two
 * hosts), where ranks are descheduled while their peers send.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long parse(const char *text, const char *what)
{
    char *end;
    long value = strtol(text, &end, 10);
    if (end == text || value <= 0) {
        fprintf(stderr, "halo: %s must be a positive number, not '%s'\n", what, text);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if ('K' == *end || 'k' == *end) {
        value <<= 10;
    } else if ('M' == *end || 'm' == *end) {
        value <<= 20;
    }
    return value;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long steps = 200, min = 1024, max = 65536;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (0 == strcmp(argv[i], "--steps")) {
            steps = parse(argv[i + 1], "--steps");
        } else if (0 == strcmp(argv[i], "--min")) {
            min = parse(argv[i + 1], "--min");
        } else if (0 == strcmp(argv[i], "--max")) {
            max = parse(argv[i + 1], "--max");
        } else {
            if (0 == rank) {
                fprintf(stderr, "halo: unknown argument '%s'\n", argv[i]);
            }
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    int left = (rank + size - 1) % size, right = (rank + 1) % size;
    char *send_left = malloc(max), *send_right = malloc(max);
    char *recv_left = malloc(max), *recv_right = malloc(max);
    if (NULL == send_left || NULL == send_right || NULL == recv_left || NULL == recv_right) {
        fprintf(stderr, "halo: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(send_left, rank, max);
    memset(send_right, rank, max);
    if (0 == rank) {
        printf("# halo: %d ranks, %ld steps per size; size_bytes us_per_step\n", size, steps);
    }
    for (long bytes = min; bytes <= max; bytes *= 2) {
        MPI_Barrier(MPI_COMM_WORLD);
        double start = MPI_Wtime();
        long checksum = 0;
        for (long step = 0; step < steps; ++step) {
            MPI_Request requests[4];
            MPI_Irecv(recv_left, (int) bytes, MPI_CHAR, left, 1, MPI_COMM_WORLD, &requests[0]);
            MPI_Irecv(recv_right, (int) bytes, MPI_CHAR, right, 2, MPI_COMM_WORLD, &requests[1]);
            MPI_Isend(send_right, (int) bytes, MPI_CHAR, right, 1, MPI_COMM_WORLD, &requests[2]);
            MPI_Isend(send_left, (int) bytes, MPI_CHAR, left, 2, MPI_COMM_WORLD, &requests[3]);
            MPI_Waitall(4, requests, MPI_STATUSES_IGNORE);
            /* The computation: read what arrived, update what goes next. */
            for (long i = 0; i < bytes; i += 64) {
                checksum += recv_left[i] + recv_right[i];
                send_left[i] = (char) (send_left[i] + 1);
                send_right[i] = (char) (send_right[i] + 1);
            }
        }
        double elapsed = (MPI_Wtime() - start) / (double) steps, slowest;
        MPI_Reduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (0 == rank) {
            printf("%ld %.2f\n", bytes, slowest * 1e6);
        }
        if (checksum == -1) {
            printf("unreachable\n");
        }
    }
    free(send_left);
    free(send_right);
    free(recv_left);
    free(recv_right);
    MPI_Finalize();
    return 0;
}
