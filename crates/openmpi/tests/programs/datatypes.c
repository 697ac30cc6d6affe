/*
 * datatypes: non-contiguous derived datatypes on the wire.
 *
 * Usage: datatypes [--max BYTES]
 *
 * Three layouts, each at a few scales from a handful of bytes up to about
 * --max bytes of data (default 1 MiB, well past any eager limit, so ob1
 * pipelines them through its convertor in fragments):
 *   - vector:  blocks of 3 doubles every 5 doubles (MPI_Type_vector),
 *   - indexed: blocks of 1..4 ints at irregular, growing displacements
 *              (MPI_Type_indexed),
 *   - struct:  records whose char, double, short[3] and long long fields are
 *              sent while the padding and an `unsent` field between them are
 *              not (MPI_Type_create_struct, resized to the record so that a
 *              count of records lines up with a C array).
 *
 * The test knows each layout independently of MPI, as a list of byte ranges,
 * so it can say what must arrive where.  For every layout and scale:
 *   1. derived to derived, with the partner (rank ^ 1, or oneself): the
 *      ranges hold the sender's bytes, and every gap byte of the receive
 *      buffer still holds what it held before;
 *   2. derived to contiguous, around the ring: the receiver gets exactly the
 *      ranges' bytes, in address order, and nothing more;
 *   3. contiguous to derived, the other way around the ring.
 */
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nprocs;

/* The C record behind the struct layout.  The compiler puts padding after
 * `c` and after `s`; `unsent` is data the type leaves out on purpose. */
struct record {
    char c;
    double d;
    short s[3];
    int unsent;
    long long q;
};

/* One layout at one scale: what to pass to MPI, and where its bytes are. */
struct layout {
    const char *name;
    MPI_Datatype type;
    int count;       /* of `type` */
    size_t span;     /* bytes from the buffer start to past the last one */
    size_t nranges;
    size_t *offset;  /* ascending byte offsets of the ranges */
    size_t *length;
    size_t data;     /* sum of lengths: the packed size */
};

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Arbitrary bytes; only their equality matters, not their meaning as
 * doubles or ints (MPI moves them as-is between like processes). */
static void fill(unsigned char *buf, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = mix(seed ^ (i / 8) * 0x100000001B3ull);
        memcpy(buf + i, &w, n - i < 8 ? n - i : 8);
    }
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "datatypes: rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return p;
}

static void fail(const struct layout *l, const char *how, int peer,
                 const char *what, size_t at)
{
    fprintf(stderr,
            "datatypes: rank %d: %s, %s with rank %d (%zu bytes of data): "
            "%s at byte %zu\n",
            rank, l->name, how, peer, l->data, what, at);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void add_range(struct layout *l, size_t *cap, size_t off, size_t len)
{
    if (l->nranges == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        l->offset = realloc(l->offset, *cap * sizeof(size_t));
        l->length = realloc(l->length, *cap * sizeof(size_t));
        if (!l->offset || !l->length) {
            fprintf(stderr, "datatypes: rank %d: out of memory\n", rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    l->offset[l->nranges] = off;
    l->length[l->nranges] = len;
    l->nranges++;
    l->data += len;
    if (off + len > l->span)
        l->span = off + len;
}

/* `blocks` blocks of 3 doubles, 5 doubles apart. */
static struct layout vector_layout(int blocks)
{
    struct layout l = {.name = "vector", .count = 1};
    size_t cap = 0;
    MPI_Type_vector(blocks, 3, 5, MPI_DOUBLE, &l.type);
    MPI_Type_commit(&l.type);
    for (int b = 0; b < blocks; b++)
        add_range(&l, &cap, (size_t)b * 5 * sizeof(double),
                  3 * sizeof(double));
    return l;
}

/* `blocks` blocks of ints: block b is 1 + b % 4 ints long and starts
 * 1 + b % 3 ints after the previous one ends. */
static struct layout indexed_layout(int blocks)
{
    struct layout l = {.name = "indexed", .count = 1};
    size_t cap = 0;
    int *lens = xmalloc((size_t)blocks * sizeof(int));
    int *displs = xmalloc((size_t)blocks * sizeof(int));
    int at = 0;
    for (int b = 0; b < blocks; b++) {
        at += 1 + b % 3;
        lens[b] = 1 + b % 4;
        displs[b] = at;
        at += lens[b];
        add_range(&l, &cap, (size_t)displs[b] * sizeof(int),
                  (size_t)lens[b] * sizeof(int));
    }
    MPI_Type_indexed(blocks, lens, displs, MPI_INT, &l.type);
    MPI_Type_commit(&l.type);
    free(lens);
    free(displs);
    return l;
}

/* `records` struct records, each sending c, d, s and q only. */
static struct layout struct_layout(int records)
{
    struct layout l = {.name = "struct", .count = records};
    size_t cap = 0;
    int lens[4] = {1, 1, 3, 1};
    MPI_Aint displs[4] = {offsetof(struct record, c),
                          offsetof(struct record, d),
                          offsetof(struct record, s),
                          offsetof(struct record, q)};
    MPI_Datatype types[4] = {MPI_CHAR, MPI_DOUBLE, MPI_SHORT, MPI_LONG_LONG};
    MPI_Datatype raw;
    MPI_Type_create_struct(4, lens, displs, types, &raw);
    /* The extent of `raw` ends at q; resizing to the C record's size makes
     * record i of the message start where the C array's record i does. */
    MPI_Type_create_resized(raw, 0, sizeof(struct record), &l.type);
    MPI_Type_commit(&l.type);
    MPI_Type_free(&raw);
    const size_t field_size[4] = {sizeof(char), sizeof(double),
                                  3 * sizeof(short), sizeof(long long)};
    for (int r = 0; r < records; r++)
        for (int f = 0; f < 4; f++)
            add_range(&l, &cap, (size_t)r * sizeof(struct record) +
                                    (size_t)displs[f],
                      field_size[f]);
    return l;
}

static void free_layout(struct layout *l)
{
    MPI_Type_free(&l->type);
    free(l->offset);
    free(l->length);
}

/* Checks that a derived receive put `sent` (the sender's whole buffer) into
 * the ranges of `got` and left its gaps as `before`. */
static void check_scattered(const struct layout *l, const char *how, int peer,
                            const unsigned char *got, const unsigned char *sent,
                            const unsigned char *before, size_t buflen)
{
    size_t pos = 0;
    for (size_t r = 0; r <= l->nranges; r++) {
        size_t start = r < l->nranges ? l->offset[r] : buflen;
        /* gap before range r (or after the last range) */
        for (; pos < start; pos++)
            if (got[pos] != before[pos])
                fail(l, how, peer, "a gap byte changed", pos);
        if (r == l->nranges)
            break;
        for (; pos < start + l->length[r]; pos++)
            if (got[pos] != sent[pos])
                fail(l, how, peer, "wrong data byte", pos);
    }
}

static int check_type_size(const struct layout *l)
{
    int size;
    MPI_Type_size(l->type, &size);
    return (size_t)size * (size_t)l->count == l->data;
}

static void run(struct layout *l)
{
    if (!check_type_size(l))
        fail(l, "MPI_Type_size", rank, "disagrees with the test's layout", 0);

    int partner = (rank ^ 1) < nprocs ? (rank ^ 1) : rank;
    int right = (rank + 1) % nprocs, left = (rank + nprocs - 1) % nprocs;
    /* A few bytes past the span show that nothing lands beyond it. */
    size_t buflen = l->span + 64;
    unsigned char *out = xmalloc(buflen), *in = xmalloc(buflen);
    unsigned char *expect = xmalloc(buflen), *before = xmalloc(buflen);
    int packed = (int)l->data;
    MPI_Status st;
    int got;

    /* 1. derived to derived.  The sender's gaps hold bytes too, so a
     * transport that copied whole spans would be caught. */
    fill(out, buflen, mix(rank * 3 + 1 + l->data));
    fill(expect, buflen, mix(partner * 3 + 1 + l->data));
    fill(before, buflen, mix(~(uint64_t)rank ^ l->data));
    memcpy(in, before, buflen);
    MPI_Sendrecv(out, l->count, l->type, partner, 1, in, l->count, l->type,
                 partner, 1, MPI_COMM_WORLD, &st);
    MPI_Get_count(&st, l->type, &got);
    if (got != l->count)
        fail(l, "derived to derived", partner, "wrong count", (size_t)got);
    check_scattered(l, "derived to derived", partner, in, expect, before,
                    buflen);

    /* 2. derived to contiguous, rightwards: the packed bytes, in order. */
    fill(out, buflen, mix(rank * 3 + 2 + l->data));
    fill(expect, buflen, mix(left * 3 + 2 + l->data));
    memset(in, 0xEE, buflen);
    MPI_Sendrecv(out, l->count, l->type, right, 2, in, packed, MPI_BYTE, left,
                 2, MPI_COMM_WORLD, &st);
    MPI_Get_count(&st, MPI_BYTE, &got);
    if (got != packed)
        fail(l, "derived to contiguous", left, "wrong byte count",
             (size_t)got);
    size_t pos = 0;
    for (size_t r = 0; r < l->nranges; r++) {
        if (memcmp(in + pos, expect + l->offset[r], l->length[r]) != 0)
            fail(l, "derived to contiguous", left, "wrong data in range",
                 pos);
        pos += l->length[r];
    }
    for (; pos < buflen; pos++)
        if (in[pos] != 0xEE)
            fail(l, "derived to contiguous", left, "wrote past the data", pos);

    /* 3. contiguous to derived, leftwards: the sender's packed bytes are
     * spread over the ranges of the receive buffer, in order. */
    fill(out, (size_t)packed, mix(rank * 3 + 3 + l->data));
    fill(before, buflen, mix(~(uint64_t)rank * 7 ^ l->data));
    memcpy(in, before, buflen);
    MPI_Sendrecv(out, packed, MPI_BYTE, left, 3, in, l->count, l->type, right,
                 3, MPI_COMM_WORLD, &st);
    fill(out, (size_t)packed, mix(right * 3 + 3 + l->data));
    memcpy(expect, before, buflen);
    pos = 0;
    for (size_t r = 0; r < l->nranges; r++) {
        memcpy(expect + l->offset[r], out + pos, l->length[r]);
        pos += l->length[r];
    }
    check_scattered(l, "contiguous to derived", right, in, expect, before,
                    buflen);

    free(out);
    free(in);
    free(expect);
    free(before);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    size_t max = 1 << 20;
    if (argc > 2 && strcmp(argv[1], "--max") == 0)
        max = (size_t)atoll(argv[2]);

    /* Amounts of data: tiny (40 bytes, a block or two), then fractions of
     * `max` below, around and well above the usual eager limits. */
    const size_t divisors[] = {0, 64, 16, 4, 1}; /* 0: 40 bytes */
    int cases = 0;
    for (size_t f = 0; f < sizeof divisors / sizeof divisors[0]; f++) {
        size_t bytes = divisors[f] ? max / divisors[f] : 40;
        /* vector: 24 data bytes per block */
        struct layout v = vector_layout((int)(bytes / 24 ? bytes / 24 : 1));
        run(&v);
        free_layout(&v);
        /* indexed: 10 bytes per block on average */
        struct layout x = indexed_layout((int)(bytes / 10 ? bytes / 10 : 1));
        run(&x);
        free_layout(&x);
        /* struct: 23 data bytes per record */
        struct layout s = struct_layout((int)(bytes / 23 ? bytes / 23 : 1));
        run(&s);
        free_layout(&s);
        cases += 3;
    }

    int ok = 1, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (rank == 0 && all_ok)
        printf("OK datatypes (%d ranks, %d cases up to %zu bytes of data)\n",
               nprocs, cases, max);
    MPI_Finalize();
    return 0;
}
