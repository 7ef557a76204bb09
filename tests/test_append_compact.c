/* The appender's automatic compaction (fkvf.h fkvf_appender_commit,
 * docs/appending.md): after a commit that leaves the file larger than
 * compact_ratio x its live bytes, the archive is rewritten as its
 * compaction and renamed over the path.
 *  - identical: at every commit the file restores every position and token
 *    as computed here from the rows (exact rows as appended, archived ones
 *    as decode(encode(row))), and a file the appender just compacted is
 *    byte for byte fkvf_archive_compact of an archive grown without it;
 *  - footprint: st_size and st_blocks * 512 <= 1.5x the size of a fresh
 *    fkvf_archive_compact of the file, after every commit;
 *  - faults: a failing write / short write / sync at every I/O call, and
 *    the k-th allocation failing for every k, of a commit that compacts:
 *    the path opens at the last commit and restores it bit for bit, no
 *    temporary file stays, and the handle goes on when the commit returned
 *    FKVF_OK;
 *  - SIGKILL: a child appends with compactions all the time and is killed
 *    at random times: the file holds every position it reported committed;
 *    the next open removes a leftover temporary file;
 *  - the lock, readers of the old file, the options. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fkvf.h"
#include "testutil.h"

#define L 2
#define H 2
#define D 16
#define S 3
#define W 16
#define ROW_ELEMS (L * H * 2 * D)
#define ROW_BYTES (ROW_ELEMS * 2)
#define BATCH 8

static char tmpdir[64];
static fkvf_rvq *Q;

static void make_dir(void) { tu_tmpdir_make(tmpdir, sizeof tmpdir, "acompact"); }

static void path_in(char *out, size_t n, const char *name) { tu_tmp_path(out, n, tmpdir, name); }

/* f16 rows of positions [first, first+n), deterministic per position, as
 * the library takes and gives rows: little-endian element bytes. */
static void gen_rows(uint16_t *out, uint64_t first, size_t n)
{
    tu_f16_rows(out, first, n, ROW_ELEMS, 7);
}

static uint32_t token_of(uint64_t p)
{
    return (uint32_t)((p * 7919u + 13u) % 65536u);
}

static void train(void)
{
    enum { NT = 512 };
    uint16_t *rows = malloc((size_t)NT * ROW_BYTES);
    ck_assert_ptr_nonnull(rows);
    gen_rows(rows, 1000000, NT);
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = L;
    p.n_kv_heads = H;
    p.key_dim = p.value_dim = D;
    p.k = 64;
    p.k_stages = 2;
    p.v_stages = 1;
    p.max_iters = 3;
    fkvf_rows blk = {rows, NT, FKVF_DTYPE_F16, 1000000};
    ck_assert_int_eq(fkvf_rvq_train(&Q, &p, &blk, 1, NULL), FKVF_OK);
    free(rows);
}

static void setup(void)
{
    make_dir();
    train();
}

static void teardown(void)
{
    fkvf_rvq_free(Q);
    Q = NULL;
    tu_tmpdir_remove(tmpdir);
}

/* Create path (no positions) with the codebook Q and a 16-bit token stream. */
static void create(const char *path, const fkvf_append_options *o)
{
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = L;
    d.n_kv_heads = H;
    d.key_dim = d.value_dim = D;
    d.dtype = FKVF_DTYPE_F16;
    d.n_sinks = S;
    d.window = W;
    d.model_id = "test/append-compact";
    fkvf_append_create c;
    memset(&c, 0, sizeof c);
    c.desc = &d;
    c.codebook = Q;
    c.token_codec.profile = FKVF_PROFILE_QUAD;
    c.token_codec.symbol_bits = 16;
    fkvf_appender *a = NULL;
    int rc = fkvf_appender_create(&a, path, &c, o, NULL);
    ck_assert_msg(rc == FKVF_OK, "create: %s", fkvf_appender_message(a));
    fkvf_appender_free(a);
}

/* Queue positions [first, first+n). */
static int append_range(fkvf_appender *a, uint64_t first, size_t n)
{
    uint16_t rows[BATCH * ROW_ELEMS];
    uint32_t tok[BATCH];
    ck_assert_uint_le(n, BATCH);
    gen_rows(rows, first, n);
    for (size_t i = 0; i < n; i++)
        tok[i] = token_of(first + i);
    return fkvf_appender_append(a, rows, n * ROW_BYTES, n, tok);
}

/* What a reader must restore for positions [0, n): the rows of the sinks and
 * the window, decode(encode(row)) for the archived ones. */
static uint16_t *expected(uint64_t n)
{
    uint16_t *out = malloc((size_t)(n ? n : 1) * ROW_BYTES);
    ck_assert_ptr_nonnull(out);
    gen_rows(out, 0, (size_t)n);
    uint64_t A = n > S + W ? n - S - W : 0;
    size_t cpp = fkvf_rvq_codes_per_position(Q);
    uint16_t codes[64], tmp[ROW_ELEMS];
    ck_assert_uint_le(cpp, 64);
    for (uint64_t p = S; p < S + A; p++) {
        fkvf_rows r = {out + p * ROW_ELEMS, 1, FKVF_DTYPE_F16, p};
        ck_assert_int_eq(fkvf_rvq_encode(Q, &r, NULL, 0, codes, cpp, 1), FKVF_OK);
        ck_assert_int_eq(fkvf_rvq_decode(Q, codes, cpp, 1, 1, p, NULL, FKVF_DTYPE_F16, tmp,
                                         sizeof tmp),
                         FKVF_OK);
        memcpy(out + p * ROW_ELEMS, tmp, sizeof tmp);
    }
    return out;
}

/* The file at path opens (torn tail allowed unless strict) and holds
 * positions [0, n) with their rows and tokens as expected; returns n, which
 * must be in [n_min, n_max]. want (NULL: computed here) holds the n rows. */
static uint64_t check_file(const char *path, uint64_t n_min, uint64_t n_max, int strict,
                           const uint16_t *want)
{
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, path, strict ? FKVF_OPEN_STRICT : 0, NULL);
    EXPECTF(rc == FKVF_OK, "%s: %s", path, fkvf_reader_message(r));
    rc = fkvf_reader_verify(r); /* a kill in a commit leaves a torn tail */
    EXPECTF(rc == FKVF_OK || (!strict && rc == FKVF_E_TORN), "verify: %s",
            fkvf_reader_message(r));
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    uint64_t n = ai.n_positions;
    EXPECTF(n >= n_min && n <= n_max, "%s: %llu positions, want %llu..%llu", path,
            (unsigned long long)n, (unsigned long long)n_min, (unsigned long long)n_max);
    EXPECT(ai.n_archived == (n > S + W ? n - S - W : 0));
    uint16_t *exp = want ? NULL : expected(n);
    uint16_t *got = malloc((size_t)(n ? n : 1) * ROW_BYTES);
    uint32_t *tok = malloc((size_t)(n ? n : 1) * sizeof *tok);
    ck_assert(got && tok);
    rc = fkvf_reader_restore(r, 0, n, FKVF_DTYPE_F16, got, (size_t)n * ROW_BYTES);
    EXPECTF(rc == FKVF_OK, "restore: %s", fkvf_reader_message(r));
    EXPECTF(memcmp(got, want ? want : exp, (size_t)n * ROW_BYTES) == 0,
            "%s: restored rows differ (%llu positions)", path, (unsigned long long)n);
    size_t ti;
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &ti), FKVF_OK);
    if (n)
        ck_assert_int_eq(fkvf_reader_stream_read(r, ti, 0, tok, (size_t)n), FKVF_OK);
    for (uint64_t p = 0; p < n; p++)
        EXPECTF(tok[p] == token_of(p), "token %llu", (unsigned long long)p);
    free(exp);
    free(got);
    free(tok);
    fkvf_reader_free(r);
    return n;
}

/* Files in tmpdir whose name has ".autocompact". */
static int leftovers(void)
{
    int n = 0;
    DIR *dh = opendir(tmpdir);
    ck_assert_ptr_nonnull(dh);
    struct dirent *e;
    while ((e = readdir(dh)) != NULL)
        n += strstr(e->d_name, ".autocompact") != NULL;
    closedir(dh);
    return n;
}

static uint64_t commit_seq(fkvf_appender *a)
{
    fkvf_append_info ai;
    ck_assert_int_eq(fkvf_appender_info(a, &ai), FKVF_OK);
    return ai.commit_seq;
}

static void compact_to(const char *src, const char *dst)
{
    fkvf_compact_options co;
    fkvf_compact_options_init(&co);
    co.sync = FKVF_SYNC_NONE;
    fkvf_archive_op *op = NULL;
    int rc = fkvf_archive_compact(&op, src, dst, &co, NULL);
    fkvf_error_info e;
    fkvf_archive_op_error(op, &e);
    ck_assert_msg(rc == FKVF_OK, "compact %s: %s", src, e.message);
    fkvf_archive_op_free(op);
}

static int same_bytes(const char *p1, const char *p2)
{
    size_t n1, n2;
    uint8_t *b1 = tu_slurp(p1, &n1), *b2 = tu_slurp(p2, &n2);
    int same = n1 == n2 && memcmp(b1, b2, n1) == 0;
    free(b1);
    free(b2);
    return same;
}

/* ---- identical results, footprint ------------------------------------------ */

/* Grow path with auto-compaction (ratio; 0: the default) and ref without,
 * BATCH positions per commit, to n positions; after every commit check the
 * live file's contents and footprint, and that a file just compacted is
 * fkvf_archive_compact of ref, byte for byte. Returns the compactions. */
static int grow_and_check(double ratio, uint64_t n, double *peak)
{
    char path[128], ref[128], c1[128], c2[128];
    path_in(path, sizeof path, "live.fkvf");
    path_in(ref, sizeof ref, "ref.fkvf");
    path_in(c1, sizeof c1, "c1.fkvf");
    path_in(c2, sizeof c2, "c2.fkvf");
    fkvf_append_options o, ro;
    fkvf_append_options_init(&o);
    fkvf_append_options_init(&ro);
    o.sync = ro.sync = FKVF_SYNC_NONE;
    o.compact_ratio = ratio;
    ro.no_auto_compact = 1;
    create(path, &o);
    create(ref, &ro);
    fkvf_appender *a = NULL, *b = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_appender_open(&b, ref, &ro, NULL), FKVF_OK);
    uint16_t *want = expected(n);
    int compactions = 0;
    *peak = 0;
    for (uint64_t p = 0; p < n; p += BATCH) {
        ck_assert_int_eq(append_range(a, p, BATCH), FKVF_OK);
        ck_assert_int_eq(append_range(b, p, BATCH), FKVF_OK);
        int rc = fkvf_appender_commit(a);
        ck_assert_msg(rc == FKVF_OK && !fkvf_appender_message(a)[0], "commit at %llu: %s",
                      (unsigned long long)p, fkvf_appender_message(a));
        ck_assert_int_eq(fkvf_appender_commit(b), FKVF_OK);
        /* the positions archived up to here are the same in both files:
         * compare with the rows computed for n only where they agree */
        uint64_t m = p + BATCH;
        uint16_t *w = m == n ? want : NULL;
        check_file(path, m, m, 1, w);
        compact_to(path, c2);
        struct stat sl, sc;
        ck_assert_int_eq(stat(path, &sl), 0);
        ck_assert_int_eq(stat(c2, &sc), 0);
        double rs = (double)sl.st_size / (double)sc.st_size,
               rb = (double)sl.st_blocks / (double)sc.st_blocks;
        EXPECTF(rs <= 1.5 && rb <= 1.5,
                "after %llu positions: %lld bytes (%lld blocks), compacted %lld (%lld): "
                "%.3fx, %.3fx", (unsigned long long)m, (long long)sl.st_size,
                (long long)sl.st_blocks, (long long)sc.st_size, (long long)sc.st_blocks, rs, rb);
        if (rs > *peak)
            *peak = rs;
        if (commit_seq(a) == 1) {
            compactions++;
            compact_to(ref, c1);
            EXPECTF(same_bytes(path, c1), "after %llu positions: the compacted file differs "
                    "from fkvf_archive_compact of the same archive", (unsigned long long)m);
        }
        EXPECT(leftovers() == 0);
    }
    fkvf_appender_free(a);
    fkvf_appender_free(b);
    free(want);
    return compactions;
}

START_TEST(identical_and_small_default)
{
    double peak;
    int nc = grow_and_check(0, 1200, &peak);
    /* the default compacts (the bound would fail without: 1200 rows of 256
     * bytes are 300 KB of dead rows against ~60 KB compacted) */
    ck_assert_int_ge(nc, 3);
    ck_assert_double_le(peak, 1.5);
}
END_TEST

START_TEST(identical_low_ratio)
{
    double peak;
    int nc = grow_and_check(1.02, 400, &peak);
    ck_assert_int_ge(nc, 20); /* nearly every commit */
}
END_TEST

/* Without it (the old behaviour), the same growth breaks the bound: the
 * footprint check above can fail. */
START_TEST(off_grows)
{
    char path[128], c2[128];
    path_in(path, sizeof path, "off.fkvf");
    path_in(c2, sizeof c2, "c2.fkvf");
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.no_auto_compact = 1;
    create(path, &o);
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    for (uint64_t p = 0; p < 1200; p += BATCH) {
        ck_assert_int_eq(append_range(a, p, BATCH), FKVF_OK);
        ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
    }
    ck_assert_uint_eq(commit_seq(a), 1 + 1200 / BATCH);
    fkvf_appender_free(a);
    compact_to(path, c2);
    struct stat sl, sc;
    ck_assert_int_eq(stat(path, &sl), 0);
    ck_assert_int_eq(stat(c2, &sc), 0);
    ck_assert_int_gt(sl.st_size, 3 * sc.st_size);
    check_file(path, 1200, 1200, 1, NULL);
}
END_TEST

/* ---- faults ----------------------------------------------------------------- */

typedef struct fault_io {
    int armed, writes, syncs;
    int fail_write, fail_sync, err, short_first;
} fault_io;

static long long fio_write(void *opaque, int fd, const void *data, size_t size)
{
    fault_io *f = opaque;
    if (f->armed && ++f->writes == f->fail_write) {
        if (f->short_first && size > 1) {
            f->fail_write = -1; /* the retry of the rest fails */
            return (long long)write(fd, data, size / 2);
        }
        errno = f->err;
        return -1;
    }
    if (f->armed && f->fail_write == -1) {
        f->fail_write = 0;
        errno = f->err;
        return -1;
    }
    return (long long)write(fd, data, size);
}

static int fio_sync(void *opaque, int fd)
{
    fault_io *f = opaque;
    if (f->armed && ++f->syncs == f->fail_sync) {
        errno = f->err;
        return -1;
    }
    return fdatasync(fd);
}

enum { N0 = 304 }; /* positions of the base file, 38 commits */

/* A base file of N0 positions in 38 commits, grown without compaction. */
static void make_base(const char *base)
{
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.no_auto_compact = 1;
    create(base, &o);
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, base, &o, NULL), FKVF_OK);
    for (uint64_t p = 0; p < N0; p += BATCH) {
        ck_assert_int_eq(append_range(a, p, BATCH), FKVF_OK);
        ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
    }
    fkvf_appender_free(a);
}

/* After a commit of positions N0..N0+8 under a fault (rc its result): the
 * path holds N0 or N0 + 8 positions (N0 + 8 when rc is FKVF_OK), bit for bit,
 * and no temporary file stays; when the handle goes on (rc FKVF_OK), a
 * further commit lands in the file at the path. Returns 1 when the
 * compaction failed (the message says so) but the commit stood. */
static int after_fault(fkvf_appender *a, const char *path, int rc, const char *what, int k)
{
    int compaction_failed = 0;
    if (rc == FKVF_OK) {
        const char *m = fkvf_appender_message(a);
        compaction_failed = m[0] != 0;
        EXPECTF(!m[0] || (strstr(m, "auto-compaction") && !strncmp(m, path, strlen(path))),
                "%s %d: message '%s'", what, k, m);
        static int shown;
        if (m[0] && shown++ < 2) /* for the log: what a caller sees */
            fprintf(stderr, "%s %d: %s\n", what, k, m);
        EXPECT(leftovers() == 0);
        check_file(path, N0 + BATCH, N0 + BATCH, 1, NULL);
        /* the handle goes on, on the file at the path */
        EXPECTF(append_range(a, N0 + BATCH, BATCH) == FKVF_OK, "%s %d", what, k);
        EXPECTF(fkvf_appender_commit(a) == FKVF_OK, "%s %d: commit after: %s", what, k,
                fkvf_appender_message(a));
        check_file(path, N0 + 2 * BATCH, N0 + 2 * BATCH, 1, NULL);
    } else {
        /* the commit failed (its own writes), or the directory sync after
         * the rename: the path is the last commit either way */
        EXPECT(leftovers() == 0);
        if (strstr(fkvf_appender_message(a), "auto-compaction")) /* after the rename */
            EXPECTF(fkvf_appender_commit(a) == rc, "%s %d: the handle should have failed",
                    what, k);
        (void)check_file(path, N0, N0 + BATCH, 0, NULL);
    }
    return compaction_failed;
}

START_TEST(faults_io_every_call)
{
    char base[128], path[128];
    path_in(base, sizeof base, "base.fkvf");
    path_in(path, sizeof path, "a.fkvf");
    make_base(base);
    size_t n0;
    uint8_t *bytes = tu_slurp(base, &n0);
    fault_io f;
    fkvf_io io = {fio_write, fio_sync, &f};
    static const unsigned syncs[] = {FKVF_SYNC_COMMIT, FKVF_SYNC_NONE};
    int fallback = 0, cases = 0;
    for (size_t si = 0; si < 2; si++) {
        fkvf_append_options o;
        fkvf_append_options_init(&o);
        o.sync = syncs[si];
        o.io = &io;
        o.compact_ratio = 1.05;
        /* the clean run: the commit compacts; count its calls */
        tu_write_file(path, bytes, n0);
        memset(&f, 0, sizeof f);
        fkvf_appender *a = NULL;
        ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
        ck_assert_int_eq(append_range(a, N0, BATCH), FKVF_OK);
        f.armed = 1;
        ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
        ck_assert_uint_eq(commit_seq(a), 1); /* compacted */
        fkvf_appender_free(a);
        const int n_writes = f.writes, n_syncs = f.syncs;
        /* the compaction's own: its sections, two syncs of the new file and
         * one of the directory, besides the commit's */
        ck_assert_int_gt(n_writes, 10);
        ck_assert_int_ge(n_syncs, 3);
        static const struct {
            int err, short_first, sync;
        } modes[] = {{ENOSPC, 0, 0}, {EIO, 1, 0}, {EIO, 0, 1}};
        for (size_t mi = 0; mi < 3; mi++) {
            int kmax = modes[mi].sync ? n_syncs : n_writes;
            for (int k = 1; k <= kmax; k++) {
                tu_write_file(path, bytes, n0);
                memset(&f, 0, sizeof f);
                f.err = modes[mi].err;
                f.short_first = modes[mi].short_first;
                if (modes[mi].sync)
                    f.fail_sync = k;
                else
                    f.fail_write = k;
                a = NULL;
                ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
                ck_assert_int_eq(append_range(a, N0, BATCH), FKVF_OK);
                f.armed = 1;
                int rc = fkvf_appender_commit(a);
                f.armed = 0;
                char what[64];
                snprintf(what, sizeof what, "sync %u mode %zu call", syncs[si], mi);
                EXPECTF(rc == FKVF_OK || rc == FKVF_E_IO, "%s %d: %s", what, k,
                        fkvf_error_name(rc));
                fallback += after_fault(a, path, rc, what, k);
                fkvf_appender_free(a);
                cases++;
            }
        }
    }
    /* most calls are the compaction's: the commit stood and the handle went
     * on after its failure */
    ck_assert_int_gt(fallback, cases / 2);
    free(bytes);
}
END_TEST

START_TEST(faults_alloc_every_call)
{
    char base[128], path[128];
    path_in(base, sizeof base, "base.fkvf");
    path_in(path, sizeof path, "a.fkvf");
    make_base(base);
    size_t n0;
    uint8_t *bytes = tu_slurp(base, &n0);
    tu_alloc ca;
    fkvf_allocator al = tu_alloc_hook(&ca);
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.compact_ratio = 1.05;
    long total = 0;
    int fallback = 0;
    for (long k = 0;; k++) {
        tu_write_file(path, bytes, n0);
        memset(&ca, 0, sizeof ca);
        fkvf_appender *a = NULL;
        ck_assert_int_eq(fkvf_appender_open(&a, path, &o, &al), FKVF_OK);
        ck_assert_int_eq(append_range(a, N0, BATCH), FKVF_OK);
        long before = ca.calls;
        ca.fail_at = k ? before + k : 0;
        int rc = fkvf_appender_commit(a);
        ca.fail_at = 0;
        if (k == 0) {
            ck_assert_int_eq(rc, FKVF_OK);
            ck_assert_uint_eq(commit_seq(a), 1);
            total = ca.calls - before;
            ck_assert_int_gt(total, 5);
        }
        EXPECTF(rc == FKVF_OK || rc == FKVF_E_NOMEM, "alloc %ld: %s", k, fkvf_error_name(rc));
        fallback += after_fault(a, path, rc, "alloc", (int)k);
        fkvf_appender_free(a);
        EXPECTF(ca.live == 0, "alloc %ld: %ld blocks leaked", k, ca.live);
        if (k >= total)
            break;
    }
    ck_assert_int_gt(fallback, (int)(total / 2));
    free(bytes);
}
END_TEST

/* ---- SIGKILL ---------------------------------------------------------------- */

enum { KILL_MAX = 2400 };

/* The child: continue path, BATCH positions per commit, reporting each
 * committed count (the high bit: the commit compacted). Never returns. */
static void child_loop(const char *path, int wfd)
{
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.compact_ratio = 1.1;
    o.recover = 1;
    fkvf_appender *a = NULL;
    if (fkvf_appender_open(&a, path, &o, NULL) != FKVF_OK)
        _exit(3);
    fkvf_append_info ai;
    fkvf_appender_info(a, &ai);
    for (uint64_t p = ai.n_positions; p < KILL_MAX; p += BATCH) {
        if (append_range(a, p, BATCH) != FKVF_OK || fkvf_appender_commit(a) != FKVF_OK ||
            fkvf_appender_message(a)[0])
            _exit(4);
        uint64_t rep = (p + BATCH) | (commit_seq(a) == 1 ? UINT64_C(1) << 63 : 0);
        if (write(wfd, &rep, sizeof rep) != (ssize_t)sizeof rep)
            _exit(5);
    }
    fkvf_appender_free(a);
    _exit(0);
}

START_TEST(sigkill_random)
{
    char path[128];
    path_in(path, sizeof path, "k.fkvf");
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    create(path, &o);
    tu_rng rng = {20261201};
    uint64_t have = 0;
    int compactions = 0, left = 0, iters = 0;
    for (int it = 0; it < 40; it++) {
        int pfd[2];
        ck_assert_int_eq(pipe(pfd), 0);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            close(pfd[0]);
            child_loop(path, pfd[1]);
        }
        close(pfd[1]);
        struct timespec ts = {0, (long)(5000000 + tu_below(&rng, 150000000))};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        uint64_t rep, last = have;
        while (read(pfd[0], &rep, sizeof rep) == (ssize_t)sizeof rep) {
            compactions += (int)(rep >> 63);
            last = rep & ~(UINT64_C(1) << 63);
        }
        close(pfd[0]);
        int st;
        ck_assert_int_eq(waitpid(pid, &st, 0), pid);
        EXPECTF(WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) == 0),
                "iteration %d: child status %d", it, st);
        /* every reported commit is there, bit for bit (a torn tail is
         * ignored by a reader) */
        uint64_t n = check_file(path, last, KILL_MAX, 0, NULL);
        left += leftovers() > 0;
        /* the next appender's open cleans a leftover temporary file */
        fkvf_appender *a = NULL;
        fkvf_append_options ro = o;
        ro.recover = 1;
        ck_assert_int_eq(fkvf_appender_open(&a, path, &ro, NULL), FKVF_OK);
        EXPECTF(leftovers() == 0, "iteration %d: a temporary file stayed", it);
        fkvf_appender_free(a);
        have = n;
        iters++;
        if (n >= KILL_MAX) {
            unlink(path);
            create(path, &o);
            have = 0;
        }
    }
    ck_assert_int_eq(iters, 40);
    fprintf(stderr, "sigkill_random: %d compactions reported, %d kills left a temporary file\n",
            compactions, left);
    /* the children compacted all along (about 100 on an idle machine) */
    ck_assert_int_ge(compactions, 10);
}
END_TEST

/* ---- lock, readers, options, leftovers --------------------------------------- */

START_TEST(lock_and_readers)
{
    char path[128];
    path_in(path, sizeof path, "l.fkvf");
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.compact_ratio = 1.02;
    create(path, &o);
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    for (uint64_t p = 0; p < 80; p += BATCH) {
        ck_assert_int_eq(append_range(a, p, BATCH), FKVF_OK);
        ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
    }
    /* a reader of the file as it is now */
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, 0, NULL), FKVF_OK);
    struct stat s0, s1;
    ck_assert_int_eq(stat(path, &s0), 0);
    int compacted = 0;
    for (uint64_t p = 80; p < 160; p += BATCH) {
        ck_assert_int_eq(append_range(a, p, BATCH), FKVF_OK);
        ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
        compacted |= commit_seq(a) == 1;
        /* a second appender is refused, whichever file the path names */
        fkvf_appender *b = NULL;
        EXPECT(fkvf_appender_open(&b, path, &o, NULL) == FKVF_E_IO);
        fkvf_appender_free(b);
    }
    ck_assert(compacted);
    ck_assert_int_eq(stat(path, &s1), 0);
    ck_assert(s0.st_ino != s1.st_ino); /* replaced */
    /* the old reader still reads its file: 80 positions as committed then */
    uint16_t *want = expected(80), *got = malloc(80 * ROW_BYTES);
    ck_assert_ptr_nonnull(got);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, 80, FKVF_DTYPE_F16, got, 80 * ROW_BYTES),
                     FKVF_OK);
    ck_assert(memcmp(got, want, 80 * ROW_BYTES) == 0);
    fkvf_reader_free(r);
    fkvf_appender_free(a);
    /* an in-place compaction and a reopen after auto-compactions */
    fkvf_compact_options co;
    fkvf_compact_options_init(&co);
    co.in_place = 1;
    ck_assert_int_eq(fkvf_archive_compact(NULL, path, NULL, &co, NULL), FKVF_OK);
    check_file(path, 160, 160, 1, NULL);
    free(want);
    free(got);
}
END_TEST

START_TEST(options_checked)
{
    char path[128];
    path_in(path, sizeof path, "o.fkvf");
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    ck_assert(o.compact_ratio == 0 && o.no_auto_compact == 0);
    o.sync = FKVF_SYNC_NONE;
    create(path, &o);
    static const double bad[] = {-1, 0.5, 1.0, 1e7};
    for (size_t i = 0; i < 4; i++) {
        o.compact_ratio = bad[i];
        fkvf_appender *a = NULL;
        EXPECTF(fkvf_appender_open(&a, path, &o, NULL) == FKVF_E_INVALID_ARG, "ratio %g",
                bad[i]);
        EXPECT(strstr(fkvf_appender_message(a), "compact_ratio") != NULL);
        fkvf_appender_free(a);
    }
    o.compact_ratio = NAN;
    fkvf_appender *a = NULL;
    EXPECT(fkvf_appender_open(&a, path, &o, NULL) == FKVF_E_INVALID_ARG);
    fkvf_appender_free(a);
    o.compact_ratio = 1.0000001;
    a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    fkvf_appender_free(a);
}
END_TEST

START_TEST(leftovers_swept_at_open)
{
    char path[128], junk[160], other[160], longer[160];
    path_in(path, sizeof path, "s.fkvf");
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    create(path, &o);
    snprintf(junk, sizeof junk, "%s.autocompact", path);
    snprintf(other, sizeof other, "%s/t.fkvf.autocompact", tmpdir);
    snprintf(longer, sizeof longer, "%s.autocompact-x", path);
    tu_write_file(junk, "x", 1);
    tu_write_file(other, "x", 1);
    tu_write_file(longer, "x", 1);
    /* a reader ignores it */
    check_file(path, 0, 0, 1, NULL);
    ck_assert_int_eq(access(junk, F_OK), 0);
    /* a second appender refused by the lock removes nothing */
    fkvf_appender *a = NULL, *b = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    ck_assert_int_ne(access(junk, F_OK), 0); /* removed by the open */
    tu_write_file(junk, "x", 1);
    ck_assert_int_eq(fkvf_appender_open(&b, path, &o, NULL), FKVF_E_IO);
    fkvf_appender_free(b);
    ck_assert_int_eq(access(junk, F_OK), 0);
    fkvf_appender_free(a);
    /* only this file's names: another archive's and a longer name stay */
    ck_assert_int_eq(access(other, F_OK), 0);
    ck_assert_int_eq(access(longer, F_OK), 0);
    /* through a symbolic link: next to the file it points to */
    char link[128];
    path_in(link, sizeof link, "link.fkvf");
    ck_assert_int_eq(symlink(path, link), 0);
    a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, link, &o, NULL), FKVF_OK);
    ck_assert_int_ne(access(junk, F_OK), 0);
    fkvf_appender_free(a);
}
END_TEST

/* Through a symbolic link, the file it points to is replaced; the link stays. */
START_TEST(through_symlink)
{
    char path[128], link[128];
    path_in(path, sizeof path, "t.fkvf");
    path_in(link, sizeof link, "tl.fkvf");
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.compact_ratio = 1.02;
    create(path, &o);
    ck_assert_int_eq(symlink("t.fkvf", link), 0);
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, link, &o, NULL), FKVF_OK);
    int compacted = 0;
    for (uint64_t p = 0; p < 120; p += BATCH) {
        ck_assert_int_eq(append_range(a, p, BATCH), FKVF_OK);
        ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
        compacted |= commit_seq(a) == 1;
    }
    fkvf_appender_free(a);
    ck_assert(compacted);
    struct stat sb;
    ck_assert_int_eq(lstat(link, &sb), 0);
    ck_assert(S_ISLNK(sb.st_mode));
    check_file(path, 120, 120, 1, NULL);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("append_compact");
    TCase *t = tcase_create("identical");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_set_timeout(t, 300);
    tcase_add_test(t, identical_and_small_default);
    tcase_add_test(t, identical_low_ratio);
    tcase_add_test(t, off_grows);
    suite_add_tcase(s, t);
    t = tcase_create("faults");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_set_timeout(t, 600);
    tcase_add_test(t, faults_io_every_call);
    tcase_add_test(t, faults_alloc_every_call);
    tcase_add_test(t, sigkill_random);
    suite_add_tcase(s, t);
    t = tcase_create("misc");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_set_timeout(t, 120);
    tcase_add_test(t, lock_and_readers);
    tcase_add_test(t, options_checked);
    tcase_add_test(t, leftovers_swept_at_open);
    tcase_add_test(t, through_symlink);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
