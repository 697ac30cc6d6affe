/*
 * udbtl's counters through the MPI tools interface: finds the performance
 * variables btl_udbtl_sent and btl_udbtl_received, reads them before and
 * after a ring exchange, and checks that they counted it; then finds the
 * module's own btl_udbtl_gets_local and btl_udbtl_eager_lent, and checks
 * that the latter counted a stream of 64 eager messages from rank 0 to
 * rank 1 longer than a datagram (udbtl lends such a stream's buffers).
 *
 * Prints "OK mpit rank R sent=S received=V" per rank.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

static int rank;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "FAIL rank %d: %s\n", rank, what);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

/* The index of performance variable `wanted`, or -1. */
static int find_pvar(const char *wanted)
{
    int count = 0;
    MPI_T_pvar_get_num(&count);
    for (int i = 0; i < count; ++i) {
        char name[256], desc[1024];
        int name_len = sizeof(name), desc_len = sizeof(desc);
        int verbosity, var_class, bind, readonly, continuous, atomic;
        MPI_Datatype type;
        MPI_T_enum enumtype;
        if (MPI_SUCCESS != MPI_T_pvar_get_info(i, name, &name_len, &verbosity, &var_class, &type,
                                               &enumtype, desc, &desc_len, &bind, &readonly,
                                               &continuous, &atomic)) {
            continue;
        }
        if (0 == strcmp(name, wanted)) {
            check(MPI_T_PVAR_CLASS_COUNTER == var_class, "a counter");
            check(MPI_UNSIGNED_LONG_LONG == type, "unsigned long long");
            return i;
        }
    }
    return -1;
}

static unsigned long long read_pvar(MPI_T_pvar_session session, MPI_T_pvar_handle handle)
{
    unsigned long long value = 0;
    check(MPI_SUCCESS == MPI_T_pvar_read(session, handle, &value), "MPI_T_pvar_read");
    return value;
}

int main(int argc, char **argv)
{
    int provided, size;
    MPI_Init(&argc, &argv);
    MPI_T_init_thread(MPI_THREAD_SINGLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    int sent_index = find_pvar("btl_udbtl_sent");
    int received_index = find_pvar("btl_udbtl_received");
    check(sent_index >= 0 && received_index >= 0, "udbtl's counters are listed");
    MPI_T_pvar_session session;
    MPI_T_pvar_handle sent, received;
    int count;
    MPI_T_pvar_session_create(&session);
    MPI_T_pvar_handle_alloc(session, sent_index, NULL, &sent, &count);
    MPI_T_pvar_handle_alloc(session, received_index, NULL, &received, &count);

    unsigned long long sent_before = read_pvar(session, sent);
    unsigned long long received_before = read_pvar(session, received);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (int i = 0; i < 100; ++i) {
        int out = rank * 1000 + i, in = -1;
        MPI_Sendrecv(&out, 1, MPI_INT, right, i, &in, 1, MPI_INT, left, i, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        check(in == left * 1000 + i, "ring data");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    unsigned long long sent_after = read_pvar(session, sent);
    unsigned long long received_after = read_pvar(session, received);
    if (size > 1) {
        check(sent_after >= sent_before + 100, "btl_udbtl_sent counted the ring");
        check(received_after >= received_before + 100, "btl_udbtl_received counted the ring");
    }

    int local_index = find_pvar("btl_udbtl_gets_local");
    int lent_index = find_pvar("btl_udbtl_eager_lent");
    check(local_index >= 0 && lent_index >= 0, "the module's own counters are listed");
    MPI_T_pvar_handle lent;
    MPI_T_pvar_handle_alloc(session, lent_index, NULL, &lent, &count);
    unsigned long long lent_before = read_pvar(session, lent);
    enum { STREAM = 64, MEDIUM = 66000 };
    static unsigned char stream[STREAM][MEDIUM];
    MPI_Request reqs[STREAM];
    if (size > 1 && rank < 2) {
        for (int i = 0; i < STREAM; ++i) {
            if (0 == rank) {
                memset(stream[i], i, MEDIUM);
                MPI_Isend(stream[i], MEDIUM, MPI_BYTE, 1, i, MPI_COMM_WORLD, &reqs[i]);
            } else {
                MPI_Irecv(stream[i], MEDIUM, MPI_BYTE, 0, i, MPI_COMM_WORLD, &reqs[i]);
            }
        }
        MPI_Waitall(STREAM, reqs, MPI_STATUSES_IGNORE);
        for (int i = 0; 1 == rank && i < STREAM; ++i) {
            check(stream[i][0] == (unsigned char) i && stream[i][MEDIUM - 1] == (unsigned char) i,
                  "stream data");
        }
    }
    unsigned long long lent_after = read_pvar(session, lent);
    if (size > 1 && 0 == rank) {
        check(lent_after > lent_before, "btl_udbtl_eager_lent counted the stream");
    }

    MPI_T_pvar_handle_free(session, &lent);
    MPI_T_pvar_handle_free(session, &sent);
    MPI_T_pvar_handle_free(session, &received);
    MPI_T_pvar_session_free(&session);
    printf("OK mpit rank %d sent=%llu received=%llu\n", rank, sent_after, received_after);
    MPI_T_finalize();
    MPI_Finalize();
    return 0;
}
