/*
 * osu_pt2pt: point-to-point latency and bandwidth between two MPI ranks,
 * measured the way the OSU Micro-Benchmarks do (see the "OSU method"
 * section of the project's anchors notes), so that figures for the udbtl
 * BTL can be set beside published osu_latency / osu_bw tables and beside
 * Open MPI's own tcp BTL run through this very program.
 *
 *   osu_pt2pt latency   [options]   one-way latency in microseconds
 *   osu_pt2pt bandwidth [options]   streaming bandwidth in MB/s (1 MB = 1e6 B)
 *
 * Options:
 *   -m SIZE   smallest message (default 1); suffixes k/K and m/M (binary)
 *   -M SIZE   largest message (default 4M)
 *   -i N      timed iterations for every size (default: OSU's per-size counts)
 *   -x N      warmup iterations for every size (default: OSU's per-size counts)
 *   -W N      bandwidth window: sends in flight per iteration (default 64)
 *
 * Sizes run from -m, doubling, up to -M (1, 2, 4, 8, ... 4 MiB by default).
 *
 * Output (rank 0, stdout): one header line starting with '#' that names the
 * mode and the unit, then one "size value" line per size. Scripts read the
 * lines that do not start with '#'.
 *
 * The program checks no data: it is a benchmark. Buffers are written once
 * before timing so that page faults of first touch stay out of the timed
 * loops. Progress is whatever the MPI library does inside its blocking and
 * wait calls (ob1 busy-polls), which is what a latency benchmark wants on a
 * machine where waking a sleeping process costs tens of microseconds.
 */
#include <mpi.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Above this size a message is "large" and runs fewer iterations: the same
 * threshold and counts as OSU, so a run takes seconds, not minutes, while
 * each timed loop still spans many milliseconds. */
#define LARGE_SIZE 8192

#define LAT_ITERS 10000
#define LAT_WARMUP 100
#define LAT_ITERS_LARGE 1000
#define LAT_WARMUP_LARGE 10

#define BW_ITERS 100
#define BW_WARMUP 10
#define BW_ITERS_LARGE 20
#define BW_WARMUP_LARGE 2
#define BW_WINDOW 64

/* OSU's point-to-point sweep stops at 1 MiB. Beyond it (2 and 4 MiB here)
 * a tenth of the large latency count and a quarter of the large bandwidth
 * count (each iteration of which moves a whole window) still time loops of
 * hundreds of milliseconds or more, and keep a slow transport's run (4 MiB
 * ping-pongs at a hundred MB/s) within the comparison script's per-run
 * limit. */
#define HUGE_SIZE ((size_t)1 << 20)
#define LAT_ITERS_HUGE 100
#define LAT_WARMUP_HUGE 5
#define BW_ITERS_HUGE 5
#define BW_WARMUP_HUGE 1

/* Distinct tags keep the acknowledgement from ever matching a data receive. */
#define TAG_DATA 1
#define TAG_ACK 2

/* Largest size accepted; 1 GiB per message is far beyond any useful run and
 * keeps window * size within size_t on every platform we care about. */
#define SIZE_LIMIT ((size_t)1 << 30)

enum mode { MODE_LATENCY, MODE_BANDWIDTH };

struct options {
    enum mode mode;
    size_t min_size;
    size_t max_size;
    long iters;  /* < 0: per-size default */
    long warmup; /* < 0: per-size default */
    long window;
    int shared; /* -S: every receive of a window into one buffer */
};

static int rank;

static void usage(FILE *to)
{
    fprintf(to,
            "usage: osu_pt2pt latency|bandwidth [-m MIN] [-M MAX] [-i ITERS] [-x WARMUP] [-W WINDOW] [-S]\n"
            "  sizes double from MIN (default 1) to MAX (default 4M); k/m suffixes are binary\n"
            "  -i/-x override the per-size iteration/warmup counts; -W is the bandwidth window (64)\n"
            "  -S receives the whole window into one buffer, as the original osu_bw does\n"
            "     (its receives overlap, which MPI does not allow; the default gives each its own)\n"
            "  run with exactly 2 ranks\n");
}

/* Rank 0 alone reports problems so that the message appears once. */
static void complain(const char *what, const char *arg)
{
    if (rank == 0) {
        fprintf(stderr, "osu_pt2pt: %s%s%s\n", what, arg ? ": " : "", arg ? arg : "");
        usage(stderr);
    }
}

/* Parses a size such as 64, 8k, 4M. Returns 0 on anything malformed. */
static size_t parse_size(const char *text)
{
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || text[0] == '-')
        return 0;
    switch (*end) {
    case 'k': case 'K': value <<= 10; end++; break;
    case 'm': case 'M': value <<= 20; end++; break;
    default: break;
    }
    if (*end != '\0' || value > SIZE_LIMIT)
        return 0;
    return (size_t)value;
}

/* Parses a positive count. Returns -1 on anything malformed. */
static long parse_count(const char *text)
{
    char *end;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < 1)
        return -1;
    return value;
}

/* Returns 0 when the arguments are usable, 1 for --help, -1 on error. */
static int parse_args(int argc, char **argv, struct options *o)
{
    o->min_size = 1;
    o->max_size = (size_t)4 << 20;
    o->iters = -1;
    o->warmup = -1;
    o->window = BW_WINDOW;
    o->shared = 0;

    if (argc < 2) {
        complain("missing mode", NULL);
        return -1;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        if (rank == 0)
            usage(stdout);
        return 1;
    }
    if (strcmp(argv[1], "latency") == 0) {
        o->mode = MODE_LATENCY;
    } else if (strcmp(argv[1], "bandwidth") == 0) {
        o->mode = MODE_BANDWIDTH;
    } else {
        complain("unknown mode", argv[1]);
        return -1;
    }

    /* The mode is positional and comes first; getopt reads the rest. A
     * leading '+' stops glibc from permuting stray operands to the front. */
    optind = 2;
    opterr = 0; /* our own messages, from rank 0 only */
    int c;
    while ((c = getopt(argc, argv, "+hm:M:i:x:W:S")) != -1) {
        switch (c) {
        case 'h':
            if (rank == 0)
                usage(stdout);
            return 1;
        case 'm':
            if ((o->min_size = parse_size(optarg)) == 0) {
                complain("bad -m size", optarg);
                return -1;
            }
            break;
        case 'M':
            if ((o->max_size = parse_size(optarg)) == 0) {
                complain("bad -M size", optarg);
                return -1;
            }
            break;
        case 'i':
            if ((o->iters = parse_count(optarg)) < 0) {
                complain("bad -i count", optarg);
                return -1;
            }
            break;
        case 'x':
            /* Zero warmup is legitimate (e.g. a quick smoke run). */
            if (strcmp(optarg, "0") == 0)
                o->warmup = 0;
            else if ((o->warmup = parse_count(optarg)) < 0) {
                complain("bad -x count", optarg);
                return -1;
            }
            break;
        case 'W':
            if ((o->window = parse_count(optarg)) < 0) {
                complain("bad -W window", optarg);
                return -1;
            }
            break;
        case 'S':
            o->shared = 1;
            break;
        default:
            complain("unknown option or missing value", argv[optind - 1]);
            return -1;
        }
    }
    if (optind < argc) {
        complain("unexpected argument", argv[optind]);
        return -1;
    }
    if (o->min_size > o->max_size) {
        complain("-m is larger than -M", NULL);
        return -1;
    }
    if (o->mode == MODE_BANDWIDTH && (size_t)o->window > SIZE_MAX / o->max_size) {
        complain("-W times -M does not fit in memory", NULL);
        return -1;
    }
    return 0;
}

/* Allocates and writes every byte once: first-touch page faults (and, for
 * the receiver, any lazy zero pages) then happen here, not in a timed loop. */
static char *touched(size_t bytes, int fill)
{
    char *p = malloc(bytes);
    if (p == NULL) {
        fprintf(stderr, "osu_pt2pt: rank %d: cannot allocate %zu bytes\n", rank, bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(p, fill, bytes);
    return p;
}

static long iters_for(const struct options *o, size_t size)
{
    if (o->iters > 0)
        return o->iters;
    if (o->mode == MODE_LATENCY)
        return size > HUGE_SIZE ? LAT_ITERS_HUGE : size > LARGE_SIZE ? LAT_ITERS_LARGE : LAT_ITERS;
    return size > HUGE_SIZE ? BW_ITERS_HUGE : size > LARGE_SIZE ? BW_ITERS_LARGE : BW_ITERS;
}

static long warmup_for(const struct options *o, size_t size)
{
    if (o->warmup >= 0)
        return o->warmup;
    if (o->mode == MODE_LATENCY)
        return size > HUGE_SIZE ? LAT_WARMUP_HUGE : size > LARGE_SIZE ? LAT_WARMUP_LARGE : LAT_WARMUP;
    return size > HUGE_SIZE ? BW_WARMUP_HUGE : size > LARGE_SIZE ? BW_WARMUP_LARGE : BW_WARMUP;
}

/*
 * Ping-pong: rank 0 sends, rank 1 answers with a message of the same size.
 * Blocking send and receive, as osu_latency does, so each round trip is one
 * message each way and nothing overlaps. Only rank 0's clock matters; it
 * starts after the warmup rounds, which settle connection setup, eager
 * buffers and caches. One-way latency is half the mean round trip.
 */
static double latency(char *sbuf, char *rbuf, size_t size, long warmup, long iters)
{
    int count = (int)size;
    double start = 0.0;
    for (long i = 0; i < warmup + iters; i++) {
        if (i == warmup)
            start = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(sbuf, count, MPI_CHAR, 1, TAG_DATA, MPI_COMM_WORLD);
            MPI_Recv(rbuf, count, MPI_CHAR, 1, TAG_DATA, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(rbuf, count, MPI_CHAR, 0, TAG_DATA, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(sbuf, count, MPI_CHAR, 0, TAG_DATA, MPI_COMM_WORLD);
        }
    }
    double elapsed = MPI_Wtime() - start;
    return elapsed * 1e6 / (2.0 * (double)iters);
}

/*
 * Streaming: per iteration rank 0 posts `window` nonblocking sends and rank
 * 1 the matching nonblocking receives; when rank 1 has all of them it sends
 * a short acknowledgement, and rank 0 waits for it before the next
 * iteration. The acknowledgement makes rank 0's clock cover delivery, not
 * just local completion of the sends (which for eager messages may only
 * mean "copied"), and keeps unexpected messages from piling up at rank 1.
 *
 * All sends read one buffer (MPI allows sends to share a buffer); each
 * receive gets its own slot, because receives in flight may not overlap.
 */
static double bandwidth(char *sbuf, char *rslots, size_t size, size_t stride, long window,
                        long warmup, long iters, MPI_Request *reqs)
{
    int count = (int)size;
    int ack = 0; /* its content does not matter, only its arrival */
    double start = 0.0;
    for (long i = 0; i < warmup + iters; i++) {
        if (i == warmup)
            start = MPI_Wtime();
        if (rank == 0) {
            for (long w = 0; w < window; w++)
                MPI_Isend(sbuf, count, MPI_CHAR, 1, TAG_DATA, MPI_COMM_WORLD, &reqs[w]);
            MPI_Waitall((int)window, reqs, MPI_STATUSES_IGNORE);
            MPI_Recv(&ack, 1, MPI_INT, 1, TAG_ACK, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (long w = 0; w < window; w++)
                MPI_Irecv(rslots + (size_t)w * stride, count, MPI_CHAR, 0, TAG_DATA,
                          MPI_COMM_WORLD, &reqs[w]);
            MPI_Waitall((int)window, reqs, MPI_STATUSES_IGNORE);
            MPI_Send(&ack, 1, MPI_INT, 0, TAG_ACK, MPI_COMM_WORLD);
        }
    }
    double elapsed = MPI_Wtime() - start;
    return (double)size * (double)window * (double)iters / elapsed / 1e6;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int size_world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size_world);

    /* Every rank parses the same arguments, so all agree on whether to go
     * on without having to talk about it. */
    struct options o;
    int parsed = parse_args(argc, argv, &o);
    if (parsed != 0) {
        MPI_Finalize();
        return parsed > 0 ? 0 : 2;
    }
    if (size_world != 2) {
        if (rank == 0)
            fprintf(stderr, "osu_pt2pt: needs exactly 2 ranks, got %d\n", size_world);
        MPI_Finalize();
        return 2;
    }
    if (o.max_size > (size_t)INT32_MAX) {
        complain("-M exceeds an MPI count", NULL);
        MPI_Finalize();
        return 2;
    }

    /* Rank 1 of the bandwidth test needs a receive slot per window entry;
     * everyone else needs one buffer each way. */
    int streaming = o.mode == MODE_BANDWIDTH;
    size_t rbytes =
        streaming && rank == 1 && !o.shared ? o.max_size * (size_t)o.window : o.max_size;
    char *sbuf = touched(o.max_size, 'a' + rank);
    char *rbuf = touched(rbytes, 0);
    MPI_Request *reqs = NULL;
    if (streaming) {
        reqs = malloc(sizeof *reqs * (size_t)o.window);
        if (reqs == NULL)
            MPI_Abort(MPI_COMM_WORLD, 1);
    }

    if (rank == 0) {
        if (streaming)
            printf("# bandwidth: size_bytes MB/s (window %ld)\n", o.window);
        else
            printf("# latency: size_bytes one-way_us\n");
        fflush(stdout);
    }

    for (size_t size = o.min_size; size <= o.max_size; size *= 2) {
        long iters = iters_for(&o, size);
        long warmup = warmup_for(&o, size);
        /* Start each size together, so neither rank's setup of the previous
         * one leaks into this one's clock. */
        MPI_Barrier(MPI_COMM_WORLD);
        double value = streaming
                           ? bandwidth(sbuf, rbuf, size, o.shared ? 0 : size, o.window, warmup,
                                       iters, reqs)
                           : latency(sbuf, rbuf, size, warmup, iters);
        if (rank == 0) {
            if (streaming)
                printf("%zu %.2f\n", size, value);
            else
                printf("%zu %.3f\n", size, value);
            /* Flushed per line: a run killed by a timeout still shows how far
             * it got. */
            fflush(stdout);
        }
        if (size > SIZE_LIMIT / 2)
            break; /* doubling again would pass any -M we accept */
    }

    free(reqs);
    free(rbuf);
    free(sbuf);
    MPI_Finalize();
    return 0;
}
