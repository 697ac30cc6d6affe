/*
 * Dynamic processes: the parent job spawns CHILDREN children, and the two
 * jobs talk over the intercommunicator: point-to-point both ways, then an
 * intercommunicator allreduce and bcast, every result checked.
 *
 * Prints "OK spawn parent R of N" per parent rank and "OK spawn child R of
 * C" per child.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHILDREN 2

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm parent, inter;
    MPI_Comm_get_parent(&parent);
    int child = MPI_COMM_NULL != parent;
    if (child) {
        inter = parent;
    } else {
        int errors[CHILDREN];
        MPI_Comm_spawn(argv[0], MPI_ARGV_NULL, CHILDREN, MPI_INFO_NULL, 0, MPI_COMM_WORLD,
                       &inter, errors);
        for (int i = 0; i < CHILDREN; ++i) {
            check(MPI_SUCCESS == errors[i], "spawn");
        }
    }
    int remote;
    MPI_Comm_remote_size(inter, &remote);
    check(remote == (child ? remote : CHILDREN), "remote group size");

    /* Point-to-point: parent 0 greets every child (a large message too),
     * each child answers. */
    static char big[300000];
    if (!child && 0 == rank) {
        for (int c = 0; c < CHILDREN; ++c) {
            int hello = 100 + c;
            MPI_Send(&hello, 1, MPI_INT, c, 1, inter);
            memset(big, 'a' + c, sizeof(big));
            MPI_Send(big, sizeof(big), MPI_CHAR, c, 2, inter);
            int answer = 0;
            MPI_Recv(&answer, 1, MPI_INT, c, 3, inter, MPI_STATUS_IGNORE);
            check(answer == 200 + c, "child's answer");
        }
    } else if (child) {
        int hello = 0;
        MPI_Recv(&hello, 1, MPI_INT, 0, 1, inter, MPI_STATUS_IGNORE);
        check(hello == 100 + rank, "parent's greeting");
        MPI_Recv(big, sizeof(big), MPI_CHAR, 0, 2, inter, MPI_STATUS_IGNORE);
        for (size_t i = 0; i < sizeof(big); ++i) {
            check(big[i] == 'a' + rank, "parent's large message");
        }
        int answer = 200 + rank;
        MPI_Send(&answer, 1, MPI_INT, 0, 3, inter);
    }

    /* Collectives across the two groups: each side gets the sum of the
     * other side's values. */
    int mine = child ? 1000 + rank : rank, theirs = 0;
    MPI_Allreduce(&mine, &theirs, 1, MPI_INT, MPI_SUM, inter);
    int want = 0;
    for (int r = 0; r < remote; ++r) {
        want += child ? r : 1000 + r;
    }
    check(theirs == want, "intercommunicator allreduce");
    int value = child ? -1 : 4242;
    if (child) {
        MPI_Bcast(&value, 1, MPI_INT, 0, inter);
    } else {
        MPI_Bcast(&value, 1, MPI_INT, 0 == rank ? MPI_ROOT : MPI_PROC_NULL, inter);
    }
    check(value == 4242, "intercommunicator bcast");

    MPI_Comm_disconnect(&inter);
    printf("OK spawn %s %d of %d\n", child ? "child" : "parent", rank, size);
    MPI_Finalize();
    return 0;
}
