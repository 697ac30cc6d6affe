/*
 * hello: every rank says who it is, and rank 0 lists them all.
 *
 * Like the classic MPI "hello world", each rank prints its rank, the world
 * size and the MPI library it runs on.  It goes one step further so that it
 * also moves a little data both ways: the greetings are gathered at rank 0,
 * which checks that each came from the rank it claims, and then tells
 * everyone how many it found good; each rank checks that number before
 * rank 0 says OK.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GREETING 128

int main(int argc, char **argv)
{
    int rank, size, len;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    char greeting[GREETING];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_library_version(version, &len);
    /* Only the first line: Open MPI's string also names its repository. */
    version[strcspn(version, "\n,")] = '\0';

    memset(greeting, 0, sizeof greeting);
    snprintf(greeting, sizeof greeting, "Hello, world, I am %d of %d (%.64s)",
             rank, size, version);
    printf("%s\n", greeting);
    fflush(stdout);

    char *all = NULL;
    if (rank == 0) {
        all = malloc((size_t)size * GREETING);
        if (!all)
            MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Gather(greeting, GREETING, MPI_CHAR, all, GREETING, MPI_CHAR, 0,
               MPI_COMM_WORLD);
    int good = 0;
    if (rank == 0) {
        for (int r = 0; r < size; r++) {
            char want[GREETING];
            snprintf(want, sizeof want, "Hello, world, I am %d of %d (", r,
                     size);
            if (strncmp(all + (size_t)r * GREETING, want, strlen(want)) == 0)
                good++;
            else
                fprintf(stderr, "hello: greeting %d is \"%.*s\"\n", r,
                        GREETING, all + (size_t)r * GREETING);
        }
        free(all);
    }
    MPI_Bcast(&good, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (good != size) {
        fprintf(stderr, "hello: rank %d: %d of %d greetings were good\n",
                rank, good, size);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0)
        printf("OK hello (%d ranks)\n", size);

    MPI_Finalize();
    return 0;
}
