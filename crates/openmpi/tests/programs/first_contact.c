/*
 * First contact in one direction for every pair of ranks, before any other
 * traffic between them: with Open MPI's default lazy add of remote
 * processes, the receiver's BTL has not added the sender when the first
 * datagram arrives.
 *
 *   first_contact down   each higher rank sends first to every lower one
 *   first_contact up     each lower rank sends first to every higher one
 *
 * Then every pair answers the other way, exchanges a message large enough
 * for a rendezvous both ways, and the ranks run collectives; every result is
 * checked. Prints "OK first_contact rank R of N in NETNS" (the network
 * namespace, which stands for the host on the stand-in hosts).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LARGE (1 << 20)

static int rank, size;

static void check(int ok, const char *what, int peer)
{
    if (!ok) {
        fprintf(stderr, "FAIL rank %d (peer %d): %s\n", rank, peer, what);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

/* The first message of the pair, from `from` to `to`. */
static void first(int from, int to)
{
    int value = from * 1000 + to;
    if (rank == from) {
        MPI_Send(&value, 1, MPI_INT, to, 1, MPI_COMM_WORLD);
    } else if (rank == to) {
        int got = -1;
        MPI_Recv(&got, 1, MPI_INT, from, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        check(got == value, "first message", from);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int down = argc > 1 && 0 == strcmp(argv[1], "down");
    if (argc < 2 || (!down && 0 != strcmp(argv[1], "up"))) {
        if (0 == rank) {
            fprintf(stderr, "usage: first_contact down|up\n");
        }
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    /* Down: a rank first hears from every higher rank, then greets every
     * lower one; up is the mirror. No pair has spoken before. */
    if (down) {
        for (int p = size - 1; p > rank; --p) {
            first(p, rank);
        }
        for (int p = rank - 1; p >= 0; --p) {
            first(rank, p);
        }
    } else {
        for (int p = 0; p < rank; ++p) {
            first(p, rank);
        }
        for (int p = rank + 1; p < size; ++p) {
            first(rank, p);
        }
    }
    /* Answers the other way, and a rendezvous both ways, pair by pair. */
    unsigned char *out = malloc(LARGE), *in = malloc(LARGE);
    check(NULL != out && NULL != in, "out of memory", rank);
    for (int p = 0; p < size; ++p) {
        if (p == rank) {
            continue;
        }
        for (int i = 0; i < LARGE; ++i) {
            out[i] = (unsigned char) (rank * 31 + p * 7 + i);
        }
        MPI_Sendrecv(out, LARGE, MPI_BYTE, p, 2, in, LARGE, MPI_BYTE, p, 2, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        for (int i = 0; i < LARGE; ++i) {
            check(in[i] == (unsigned char) (p * 31 + rank * 7 + i), "rendezvous data", p);
        }
    }
    free(out);
    free(in);
    int sum = 0;
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    check(sum == size * (size - 1) / 2, "allreduce", -1);
    int *all = malloc(sizeof(int) * (size_t) size);
    MPI_Allgather(&rank, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD);
    for (int p = 0; p < size; ++p) {
        check(all[p] == p, "allgather", p);
    }
    free(all);
    MPI_Barrier(MPI_COMM_WORLD);
    /* The network namespace stands for the host: the stand-in hosts share a
     * hostname. */
    char netns[256] = "";
    ssize_t len = readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
    netns[len > 0 ? len : 0] = '\0';
    printf("OK first_contact rank %d of %d in %s\n", rank, size, netns);
    MPI_Finalize();
    return 0;
}
