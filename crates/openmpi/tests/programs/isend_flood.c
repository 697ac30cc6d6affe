/*
 * ob1's flow control under load (the mechanism of Open MPI issue #3845):
 * one rank posts many large nonblocking sends, and many eager ones, while
 * its peer only receives; then the other way. A BTL whose sends complete
 * at once without callbacks, and whose fragments a large transfer can use
 * up, leaves ob1 waiting for a completion callback that never comes.
 *
 *   isend_flood [messages] [pingpong]
 *
 * Rank pairs (0,1), (2,3)... flood each other. The eager messages are of
 * two lengths: short ones, and ones longer than a datagram on every path
 * (which udbtl sends from the user's buffer in such a stream). With
 * `pingpong`, the pairs instead bounce `messages` of the longer eager
 * length back and forth, one at a time. Prints "OK isend_flood rank R of N"
 * per rank.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LARGE (1 << 20)
/* Under ob1's eager limit with udbtl (66 KiB with its header), above the
 * payload of one datagram on loopback (65 451 bytes) and at MTU 1500. */
#define MEDIUM 66000
#define SMALL 512

static int rank, size;

static void fail(const char *what)
{
    fprintf(stderr, "FAIL rank %d: %s\n", rank, what);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static unsigned char byte_of(int message, size_t i)
{
    return (unsigned char) (message * 29 + i * 7);
}

static size_t length_of(int message, int count)
{
    return message < count ? LARGE : message % 2 ? MEDIUM : SMALL;
}

/* `sender` sends `count` large and `count` eager messages to `receiver`,
 * every one posted before any completes; the receiver posts all its
 * receives and waits for them. */
static void flood(int sender, int receiver, int count)
{
    int total = 2 * count;
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * total);
    unsigned char **bufs = malloc(sizeof(unsigned char *) * total);
    if (!reqs || !bufs) {
        fail("out of memory");
    }
    for (int m = 0; m < total; ++m) {
        size_t len = length_of(m, count);
        bufs[m] = malloc(len);
        if (!bufs[m]) {
            fail("out of memory");
        }
        if (rank == sender) {
            for (size_t i = 0; i < len; ++i) {
                bufs[m][i] = byte_of(m, i);
            }
            MPI_Isend(bufs[m], (int) len, MPI_BYTE, receiver, m, MPI_COMM_WORLD, &reqs[m]);
        } else {
            memset(bufs[m], 0, len);
            MPI_Irecv(bufs[m], (int) len, MPI_BYTE, sender, m, MPI_COMM_WORLD, &reqs[m]);
        }
    }
    MPI_Waitall(total, reqs, MPI_STATUSES_IGNORE);
    for (int m = 0; m < total; ++m) {
        size_t len = length_of(m, count);
        if (rank == receiver) {
            for (size_t i = 0; i < len; ++i) {
                if (bufs[m][i] != byte_of(m, i)) {
                    fail("data differs");
                }
            }
        }
        free(bufs[m]);
    }
    free(bufs);
    free(reqs);
}

/* `count` MEDIUM messages to `peer` and back, one at a time, each checked. */
static void pingpong(int peer, int count)
{
    unsigned char *buf = malloc(MEDIUM);
    if (!buf) {
        fail("out of memory");
    }
    for (int m = 0; m < count; ++m) {
        int first = rank < peer;
        for (int leg = 0; leg < 2; ++leg) {
            if (first == (leg == 0)) {
                for (size_t i = 0; i < MEDIUM; ++i) {
                    buf[i] = byte_of(m + leg, i);
                }
                MPI_Send(buf, MEDIUM, MPI_BYTE, peer, m, MPI_COMM_WORLD);
            } else {
                MPI_Recv(buf, MEDIUM, MPI_BYTE, peer, m, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for (size_t i = 0; i < MEDIUM; ++i) {
                    if (buf[i] != byte_of(m + leg, i)) {
                        fail("data differs");
                    }
                }
            }
        }
    }
    free(buf);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int count = argc > 1 ? atoi(argv[1]) : 64;
    int ping = argc > 2 && 0 == strcmp(argv[2], "pingpong");
    int peer = rank ^ 1;
    if (peer < size && ping) {
        pingpong(peer, count);
    } else if (peer < size) {
        int low = rank < peer ? rank : peer, high = rank < peer ? peer : rank;
        flood(low, high, count);
        flood(high, low, count);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    printf("OK isend_flood rank %d of %d\n", rank, size);
    MPI_Finalize();
    return 0;
}
