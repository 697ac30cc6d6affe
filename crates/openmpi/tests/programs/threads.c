/*
 * MPI_THREAD_MULTIPLE under load: THREADS threads per rank, each on its own
 * duplicate of MPI_COMM_WORLD, at once: a ring exchange of every size class
 * (tiny, eager, a rendezvous and a pipelined one) with nonblocking sends
 * and receives, checked byte by byte, then allreduce, bcast and alltoall.
 *
 *   threads [iterations]
 *
 * Prints "OK threads rank R of N provided=P" per rank.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4

static int rank, size, iterations = 20;
static MPI_Comm comms[THREADS];
static const size_t sizes[] = {1, 100, 1000, 12000, 70000, 600000};
#define NSIZES ((int) (sizeof(sizes) / sizeof(sizes[0])))

static void fail(const char *what, int thread, int iteration)
{
    fprintf(stderr, "FAIL rank %d thread %d iteration %d: %s\n", rank, thread, iteration, what);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* The byte at `i` of what `from` sends in `thread`'s `iteration`. */
static unsigned char byte_of(int from, int thread, int iteration, size_t i)
{
    return (unsigned char) (from * 131 + thread * 31 + iteration * 7 + i * 13);
}

static void *work(void *arg)
{
    int t = (int) (intptr_t) arg;
    MPI_Comm comm = comms[t];
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    size_t max = sizes[NSIZES - 1];
    unsigned char *out = malloc(max), *in = malloc(max);
    int *all_out = malloc(sizeof(int) * size), *all_in = malloc(sizeof(int) * size);
    if (!out || !in || !all_out || !all_in) {
        fail("out of memory", t, 0);
    }
    for (int it = 0; it < iterations; ++it) {
        for (int s = 0; s < NSIZES; ++s) {
            size_t n = sizes[s];
            for (size_t i = 0; i < n; ++i) {
                out[i] = byte_of(rank, t, it, i);
            }
            memset(in, 0, (size_t) n);
            MPI_Request reqs[2];
            MPI_Irecv(in, (int) n, MPI_BYTE, left, s, comm, &reqs[0]);
            MPI_Isend(out, (int) n, MPI_BYTE, right, s, comm, &reqs[1]);
            MPI_Waitall(2, reqs, MPI_STATUSES_IGNORE);
            for (size_t i = 0; i < n; ++i) {
                if (in[i] != byte_of(left, t, it, i)) {
                    fail("ring data differs", t, it);
                }
            }
        }
        int mine = rank + t + it, sum = 0;
        MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, comm);
        if (sum != size * (size - 1) / 2 + size * (t + it)) {
            fail("allreduce", t, it);
        }
        int root = it % size, value = rank == root ? 1000 * t + it : -1;
        MPI_Bcast(&value, 1, MPI_INT, root, comm);
        if (value != 1000 * t + it) {
            fail("bcast", t, it);
        }
        for (int p = 0; p < size; ++p) {
            all_out[p] = rank * 10000 + p * 100 + t + it;
        }
        MPI_Alltoall(all_out, 1, MPI_INT, all_in, 1, MPI_INT, comm);
        for (int p = 0; p < size; ++p) {
            if (all_in[p] != p * 10000 + rank * 100 + t + it) {
                fail("alltoall", t, it);
            }
        }
    }
    free(out);
    free(in);
    free(all_out);
    free(all_in);
    return NULL;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (provided != MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "rank %d: provided thread level %d, not MPI_THREAD_MULTIPLE\n", rank,
                provided);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (argc > 1) {
        iterations = atoi(argv[1]);
    }
    /* Duplicating is collective: every rank in the same order, before the
     * threads start. */
    for (int t = 0; t < THREADS; ++t) {
        MPI_Comm_dup(MPI_COMM_WORLD, &comms[t]);
    }
    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; ++t) {
        if (0 != pthread_create(&threads[t], NULL, work, (void *) (intptr_t) t)) {
            fail("pthread_create", t, 0);
        }
    }
    for (int t = 0; t < THREADS; ++t) {
        pthread_join(threads[t], NULL);
    }
    for (int t = 0; t < THREADS; ++t) {
        MPI_Comm_free(&comms[t]);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    printf("OK threads rank %d of %d provided=%d\n", rank, size, provided);
    MPI_Finalize();
    return 0;
}
