/* The appender (fkvf.h "appender", spec 7.4-7.7, 14.3) and the recovery of
 * a torn tail (fkvf_archive_recover, case "append"): positions appended
 * and committed in batches come back as a reader restores them; exact
 * positions bit for bit, archived ones as the codebook reconstructs them.
 * Fault tests (case "faults"): the last commit cut at every byte, a failing
 * write / short write / sync at every call of a commit, SIGKILL of an
 * appending process, the k-th allocation failing for every k, misuse. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fkvf.h"
#include "testutil.h"

#define L 2
#define H 2
#define D 8
#define ROW_ELEMS (L * H * 2 * D)
#define ROW_BYTES (ROW_ELEMS * 2)

static char tmpdir[64];

static void make_dir(void) { tu_tmpdir_make(tmpdir, sizeof tmpdir, "append"); }

static void path_in(char *out, size_t n, const char *name) { tu_tmp_path(out, n, tmpdir, name); }

/* f16 rows of positions [first, first+n), deterministic per position, as
 * the library takes and gives rows: little-endian element bytes. */
static void gen_rows(uint16_t *out, uint64_t first, size_t n)
{
    tu_f16_rows(out, first, n, ROW_ELEMS, 1);
}

static fkvf_desc test_desc(int pre_rope)
{
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = L;
    d.n_kv_heads = H;
    d.key_dim = d.value_dim = D;
    d.dtype = FKVF_DTYPE_F16;
    d.n_sinks = 3;
    d.window = 5;
    if (pre_rope) {
        d.key_transform = 1;
        d.rope_layout = 1;
        d.key_storage = 1;
        d.rope_dims = D;
        d.rope_theta = 10000.0;
    }
    d.model_id = "test/append";
    return d;
}

static fkvf_rvq *train_codebook(int pre_rope)
{
    enum { NT = 256 };
    uint16_t *rows = malloc((size_t)NT * ROW_BYTES);
    ck_assert_ptr_nonnull(rows);
    gen_rows(rows, 1000000, NT);
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = L;
    p.n_kv_heads = H;
    p.key_dim = p.value_dim = D;
    p.k = 16;
    p.k_stages = 2;
    p.v_stages = 1;
    p.max_iters = 4;
    fkvf_rope rope = {1, D, 10000.0};
    if (pre_rope)
        p.key_rope = &rope;
    fkvf_rows blk = {rows, NT, FKVF_DTYPE_F16, 1000000};
    fkvf_rvq *q = NULL;
    ck_assert_int_eq(fkvf_rvq_train(&q, &p, &blk, 1, NULL), FKVF_OK);
    free(rows);
    return q;
}

/* What a reader must restore for position p of an archive with S sinks and
 * A archived positions: the row itself, or decode(encode(row)). */
static void expected_row(const fkvf_rvq *q, int pre_rope, uint64_t p, int archived, uint16_t *out)
{
    gen_rows(out, p, 1);
    if (!archived)
        return;
    fkvf_rope rope = {1, D, 10000.0};
    size_t cpp = fkvf_rvq_codes_per_position(q);
    uint16_t codes[64];
    ck_assert_uint_le(cpp, 64);
    fkvf_rows r = {out, 1, FKVF_DTYPE_F16, p};
    ck_assert_int_eq(fkvf_rvq_encode(q, &r, pre_rope ? &rope : NULL, 0, codes, cpp, 1), FKVF_OK);
    uint16_t tmp[ROW_ELEMS];
    ck_assert_int_eq(fkvf_rvq_decode(q, codes, cpp, 1, 1, p, pre_rope ? &rope : NULL,
                                     FKVF_DTYPE_F16, tmp, sizeof tmp),
                     FKVF_OK);
    memcpy(out, tmp, sizeof tmp);
}

/* Open the file with a reader and compare every position. */
static void check_file(const char *path, const fkvf_rvq *q, int pre_rope, uint64_t n_want,
                       uint64_t a_want, const uint32_t *tokens)
{
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL);
    ck_assert_msg(rc == FKVF_OK, "%s: %s", fkvf_error_name(rc), fkvf_reader_message(r));
    ck_assert_int_eq(fkvf_reader_verify(r), FKVF_OK);
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    ck_assert_uint_eq(ai.n_positions, n_want);
    ck_assert_uint_eq(ai.n_archived, a_want);
    uint16_t *got = malloc((size_t)(n_want ? n_want : 1) * ROW_BYTES);
    ck_assert_ptr_nonnull(got);
    rc = fkvf_reader_restore(r, 0, n_want, FKVF_DTYPE_F16, got, (size_t)n_want * ROW_BYTES);
    ck_assert_msg(rc == FKVF_OK, "restore: %s", fkvf_reader_message(r));
    fkvf_desc d;
    ck_assert_int_eq(fkvf_reader_desc(r, &d), FKVF_OK);
    for (uint64_t p = 0; p < n_want; p++) {
        int archived = p >= d.n_sinks && p < d.n_sinks + a_want;
        uint16_t want[ROW_ELEMS];
        expected_row(q, pre_rope, p, archived, want);
        EXPECTF(memcmp(got + p * ROW_ELEMS, want, ROW_BYTES) == 0,
                "position %llu (%s) differs", (unsigned long long)p,
                archived ? "archived" : "exact");
    }
    if (tokens) {
        size_t ti;
        ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &ti), FKVF_OK);
        uint32_t *t = malloc((size_t)(n_want ? n_want : 1) * sizeof *t);
        ck_assert_int_eq(fkvf_reader_stream_read(r, ti, 0, t, (size_t)n_want), FKVF_OK);
        ck_assert(memcmp(t, tokens, (size_t)n_want * sizeof *t) == 0);
        free(t);
    }
    free(got);
    fkvf_reader_free(r);
}

static void append_n(fkvf_appender *a, uint64_t first, size_t n, uint32_t *tokens_all, int tok)
{
    uint16_t *rows = malloc((n ? n : 1) * ROW_BYTES);
    ck_assert_ptr_nonnull(rows);
    gen_rows(rows, first, n);
    uint32_t *t = NULL;
    if (tok) {
        t = tokens_all + first;
        for (size_t i = 0; i < n; i++)
            t[i] = (uint32_t)((first + i) * 7919 % 1000);
    }
    int rc = fkvf_appender_append(a, rows, n * ROW_BYTES, n, t);
    ck_assert_msg(rc == FKVF_OK, "append: %s", fkvf_appender_message(a));
    free(rows);
}

static uint64_t archived_after(uint64_t n, int has_cb)
{
    return has_cb && n > 3 + 5 ? n - 3 - 5 : 0;
}

static void run_batches(int pre_rope, int with_cb, int ngon, const size_t *batches, size_t nb,
                        int reopen_every)
{
    make_dir();
    char path[128];
    path_in(path, sizeof path, "a.fkvf");
    fkvf_rvq *q = with_cb ? train_codebook(pre_rope) : NULL;
    fkvf_desc d = test_desc(pre_rope);
    fkvf_append_create c;
    memset(&c, 0, sizeof c);
    c.desc = &d;
    c.codebook = q;
    if (ngon) {
        c.index_codec.profile = FKVF_PROFILE_NGON;
        c.index_codec.alphabet = 16;
    }
    c.token_codec.profile = FKVF_PROFILE_QUAD;
    c.token_codec.symbol_bits = 10;
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.block_size = 64;
    fkvf_appender *a = NULL;
    int rc = fkvf_appender_create(&a, path, &c, &o, NULL);
    ck_assert_msg(rc == FKVF_OK, "create: %s %s", fkvf_error_name(rc), fkvf_appender_message(a));
    uint32_t tokens[4096];
    uint64_t n = 0;
    /* zero rows with token ids before the appender has a token buffer: a
     * no-op (was a memcpy to a NULL buffer: UBSan, found by replay_append) */
    append_n(a, 0, 0, tokens, 1);
    for (size_t i = 0; i < nb; i++) {
        append_n(a, n, batches[i], tokens, 1);
        n += batches[i];
        rc = fkvf_appender_commit(a);
        ck_assert_msg(rc == FKVF_OK, "commit %zu: %s", i, fkvf_appender_message(a));
        fkvf_append_info st;
        ck_assert_int_eq(fkvf_appender_info(a, &st), FKVF_OK);
        ck_assert_uint_eq(st.n_positions, n);
        ck_assert_uint_eq(st.n_archived, archived_after(n, with_cb));
        ck_assert_uint_eq(st.pending, 0);
        if (reopen_every && (i + 1) % (size_t)reopen_every == 0) {
            fkvf_appender_free(a);
            a = NULL;
            rc = fkvf_appender_open(&a, path, &o, NULL);
            ck_assert_msg(rc == FKVF_OK, "reopen: %s", fkvf_appender_message(a));
            check_file(path, q, pre_rope, n, archived_after(n, with_cb), tokens);
        }
    }
    fkvf_appender_free(a);
    check_file(path, q, pre_rope, n, archived_after(n, with_cb), tokens);
    fkvf_rvq_free(q);
    unlink(path);
    rmdir(tmpdir);
}

static const size_t mixed[] = {1, 1, 2, 1, 7, 16, 3, 1, 33, 64, 5, 1, 1, 17, 100, 2};

START_TEST(append_batches_quad)
{
    run_batches(0, 1, 0, mixed, sizeof mixed / sizeof mixed[0], 0);
}
END_TEST

START_TEST(append_batches_reopen)
{
    run_batches(1, 1, 0, mixed, sizeof mixed / sizeof mixed[0], 3);
}
END_TEST

START_TEST(append_batches_ngon)
{
    run_batches(0, 1, 1, mixed, sizeof mixed / sizeof mixed[0], 4);
}
END_TEST

START_TEST(append_without_codebook_all_exact)
{
    run_batches(0, 0, 0, mixed, 8, 2);
}
END_TEST

/* ---- fault tests (issue 4): torn tails, failing I/O, kills, allocation
 * failures. Archive shape as above (S = 3, W = 5, k = 16: 4-bit index
 * symbols, unit 32; 10-bit token ids, unit 64). ---- */

static uint32_t token_of(uint64_t p)
{
    return (uint32_t)(p * 7919 % 1000);
}

/* Queue positions [first, first+n) with their token ids; returns the rc. */
static int append_range(fkvf_appender *a, uint64_t first, size_t n)
{
    uint16_t *rows = malloc((n ? n : 1) * ROW_BYTES);
    uint32_t *t = malloc((n ? n : 1) * sizeof *t);
    if (!rows || !t) {
        free(rows);
        free(t);
        return -1;
    }
    gen_rows(rows, first, n);
    for (size_t i = 0; i < n; i++)
        t[i] = token_of(first + i);
    int rc = fkvf_appender_append(a, rows, n * ROW_BYTES, n, t);
    free(rows);
    free(t);
    return rc;
}

static void fault_create_desc(fkvf_desc *d, fkvf_append_create *c, const fkvf_rvq *q)
{
    *d = test_desc(0);
    memset(c, 0, sizeof *c);
    c->desc = d;
    c->codebook = q;
    c->token_codec.profile = FKVF_PROFILE_QUAD;
    c->token_codec.symbol_bits = 10;
}

static void fault_opts(fkvf_append_options *o, unsigned sync)
{
    fkvf_append_options_init(o);
    o->sync = sync;
    o->block_size = 64;
    /* these tests count the commits of a file and the calls of one commit;
     * the automatic compaction's own are test_append_compact's */
    o->no_auto_compact = 1;
}

/* A file with commits of the given batch sizes after commit 1. */
static uint64_t build(const char *path, const fkvf_rvq *q, unsigned sync, const size_t *batches,
                      size_t nb)
{
    fkvf_desc d;
    fkvf_append_create c;
    fault_create_desc(&d, &c, q);
    fkvf_append_options o;
    fault_opts(&o, sync);
    fkvf_appender *a = NULL;
    int rc = fkvf_appender_create(&a, path, &c, &o, NULL);
    ck_assert_msg(rc == FKVF_OK, "create: %s", fkvf_appender_message(a));
    uint64_t n = 0;
    for (size_t i = 0; i < nb; i++) {
        ck_assert_int_eq(append_range(a, n, batches[i]), FKVF_OK);
        n += batches[i];
        rc = fkvf_appender_commit(a);
        ck_assert_msg(rc == FKVF_OK, "commit: %s", fkvf_appender_message(a));
    }
    fkvf_appender_free(a);
    return n;
}

static uint64_t file_len(const char *path)
{
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    return (uint64_t)sb.st_size;
}

/* What a reader serves: every position restored, and the token stream. */
typedef struct snap {
    uint64_t n, A, committed, torn;
    uint16_t *rows;
    uint32_t *tok;
} snap;

static void snap_take(fkvf_reader *r, snap *s)
{
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    s->n = ai.n_positions;
    s->A = ai.n_archived;
    s->committed = ai.committed_size;
    s->torn = ai.torn_bytes;
    s->rows = malloc((size_t)(s->n + 1) * ROW_BYTES);
    s->tok = malloc((size_t)(s->n + 1) * sizeof *s->tok);
    ck_assert(s->rows && s->tok);
    int rc = fkvf_reader_restore(r, 0, s->n, FKVF_DTYPE_F16, s->rows, (size_t)s->n * ROW_BYTES);
    EXPECTF(rc == FKVF_OK, "restore: %s", fkvf_reader_message(r));
    size_t ti;
    EXPECT(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &ti) == FKVF_OK);
    EXPECT(fkvf_reader_stream_read(r, ti, 0, s->tok, (size_t)s->n) == FKVF_OK);
}

static void snap_free(snap *s)
{
    free(s->rows);
    free(s->tok);
    s->rows = NULL;
    s->tok = NULL;
}

static int snap_same(const snap *a, const snap *b)
{
    return a->n == b->n && a->A == b->A &&
           memcmp(a->rows, b->rows, (size_t)a->n * ROW_BYTES) == 0 &&
           memcmp(a->tok, b->tok, (size_t)a->n * sizeof *a->tok) == 0;
}

static void snap_file(const char *path, unsigned flags, snap *s)
{
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, path, flags, NULL);
    ck_assert_msg(rc == FKVF_OK, "%s: %s: %s", path, fkvf_error_name(rc),
                  r ? fkvf_reader_message(r) : "");
    snap_take(r, s);
    fkvf_reader_free(r);
}

/* Every restored position is the deterministic row of that position (exact)
 * or decode(encode(row)) (archived), every token id token_of(p), and the
 * archive's shape is that of the appender's policy (S = 3, W = 5). */
static void snap_expect(const snap *s, const fkvf_rvq *q)
{
    EXPECTF(s->A == archived_after(s->n, 1), "n %llu: A %llu", (unsigned long long)s->n,
            (unsigned long long)s->A);
    for (uint64_t p = 0; p < s->n; p++) {
        uint16_t want[ROW_ELEMS];
        int archived = p >= 3 && p < 3 + s->A;
        expected_row(q, 0, p, archived, want);
        EXPECTF(memcmp(s->rows + p * ROW_ELEMS, want, ROW_BYTES) == 0,
                "position %llu of %llu differs", (unsigned long long)p,
                (unsigned long long)s->n);
        EXPECTF(s->tok[p] == token_of(p), "token %llu", (unsigned long long)p);
    }
}

/* (a) Cut the last commit at every byte. */
START_TEST(fault_torn_every_cut)
{
    make_dir();
    char path[128], cut_path[128];
    path_in(path, sizeof path, "a.fkvf");
    path_in(cut_path, sizeof cut_path, "cut.fkvf");
    fkvf_rvq *q = train_codebook(0);
    /* 30 positions: A = 22 (a partial unit of 32), tokens a partial unit of 64 */
    static const size_t batches[] = {4, 7, 19};
    uint64_t n_prev = build(path, q, FKVF_SYNC_NONE, batches, 3);
    ck_assert_uint_eq(n_prev, 30);
    snap prev;
    snap_file(path, FKVF_OPEN_STRICT, &prev);
    ck_assert_uint_eq(prev.A, 22);
    snap_expect(&prev, q);
    const uint64_t n0 = file_len(path);
    ck_assert_uint_eq(prev.committed, n0);
    /* the last commit: 13 positions (index segment rewriting the partial
     * unit and crossing into the next, exact rows, token segment) */
    fkvf_append_options o;
    fault_opts(&o, FKVF_SYNC_NONE);
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    ck_assert_int_eq(append_range(a, 30, 13), FKVF_OK);
    ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
    fkvf_appender_free(a);
    size_t n1;
    uint8_t *full = tu_slurp(path, &n1);
    ck_assert_uint_gt(n1, n0 + 256);
    snap last;
    snap_file(path, FKVF_OPEN_STRICT, &last);
    ck_assert_uint_eq(last.n, 43);
    snap_expect(&last, q);

    uint8_t *buf = malloc(n1);
    ck_assert_ptr_nonnull(buf);
    size_t cases = 0;
    for (uint64_t cut = n0; cut < n1; cut++) {
        /* a private copy, so that a reader that looked past `cut` would
         * be caught by ASan rather than read the rest of the commit */
        memcpy(buf, full, (size_t)cut);
        fkvf_reader *r = NULL;
        int rc = fkvf_reader_open_memory(&r, buf, (size_t)cut, 0, NULL);
        EXPECTF(rc == FKVF_OK, "cut %llu: %s %s", (unsigned long long)cut, fkvf_error_name(rc),
                r ? fkvf_reader_message(r) : "");
        snap s;
        snap_take(r, &s);
        EXPECTF(s.torn == cut - n0 && s.committed == n0, "cut %llu: torn %llu committed %llu",
                (unsigned long long)cut, (unsigned long long)s.torn,
                (unsigned long long)s.committed);
        EXPECTF(snap_same(&s, &prev), "cut %llu: served contents differ from the previous commit",
                (unsigned long long)cut);
        /* a full pass finds the served commit sound and names the torn tail */
        rc = fkvf_reader_verify(r);
        EXPECTF(rc == (cut == n0 ? FKVF_OK : FKVF_E_TORN), "cut %llu: verify: %s %s", (unsigned long long)cut,
                fkvf_error_name(rc), fkvf_reader_message(r));
        /* nothing of the new commit is served */
        uint16_t row[ROW_ELEMS];
        const void *v;
        size_t vb;
        uint32_t sym;
        size_t ti;
        EXPECT(fkvf_reader_restore(r, 30, 1, FKVF_DTYPE_F16, row, sizeof row) != FKVF_OK);
        EXPECT(fkvf_reader_exact_row(r, 42, &v, &vb) != FKVF_OK);
        EXPECT(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &ti) == FKVF_OK);
        EXPECT(fkvf_reader_stream_get(r, ti, 30, &sym) != FKVF_OK);
        fkvf_reader_free(r);
        snap_free(&s);
        r = NULL;
        rc = fkvf_reader_open_memory(&r, buf, (size_t)cut, FKVF_OPEN_STRICT, NULL);
        EXPECTF(rc == (cut == n0 ? FKVF_OK : FKVF_E_TORN), "cut %llu strict: %s",
                (unsigned long long)cut, fkvf_error_name(rc));
        fkvf_reader_free(r);
        cases++;
    }
    ck_assert_uint_eq(cases, n1 - n0);

    /* the appender refuses a torn file unless asked to recover; recovered,
     * it truncates and the same commit again gives the same bytes */
    for (uint64_t cut = n0 + 1; cut < n1; cut += (cut - n0) % 64 == 1 ? 62 : 1) {
        tu_write_file(cut_path, full, (size_t)cut);
        fkvf_append_options ro;
        fault_opts(&ro, FKVF_SYNC_NONE);
        a = NULL;
        int rc = fkvf_appender_open(&a, cut_path, &ro, NULL);
        EXPECTF(rc == FKVF_E_TORN, "cut %llu: appender open %s", (unsigned long long)cut,
                fkvf_error_name(rc));
        EXPECT(a && strlen(fkvf_appender_message(a)) > 0);
        fkvf_appender_free(a);
        EXPECT(file_len(cut_path) == cut); /* refused: untouched */
        ro.recover = 1;
        a = NULL;
        rc = fkvf_appender_open(&a, cut_path, &ro, NULL);
        EXPECTF(rc == FKVF_OK, "cut %llu: recover: %s", (unsigned long long)cut,
                fkvf_appender_message(a));
        fkvf_append_info st;
        EXPECT(fkvf_appender_info(a, &st) == FKVF_OK);
        EXPECT(st.recovered_bytes == cut - n0 && st.n_positions == 30 && st.n_archived == 22);
        EXPECT(file_len(cut_path) == n0);
        EXPECT(append_range(a, 30, 13) == FKVF_OK);
        EXPECT(fkvf_appender_commit(a) == FKVF_OK);
        fkvf_appender_free(a);
        size_t m;
        uint8_t *again = tu_slurp(cut_path, &m);
        EXPECTF(m == n1 && memcmp(again, full, n1) == 0,
                "cut %llu: the recovered commit differs from the original", (unsigned long long)cut);
        free(again);
        unlink(cut_path);
    }
    free(buf);
    free(full);
    snap_free(&prev);
    snap_free(&last);
    fkvf_rvq_free(q);
    unlink(path);
    rmdir(tmpdir);
}
END_TEST

/* (b) A failing file system under the appender. */
typedef struct fault_io {
    int armed;
    int writes, syncs;         /* calls while armed */
    int fail_write, fail_sync; /* 1-based call to fail; 0 never */
    int err;                   /* errno of a failure */
    int short_first;           /* the failing write first writes half */
    int broken;                /* after a short write every write fails */
} fault_io;

static long long fio_write(void *opaque, int fd, const void *data, size_t size)
{
    fault_io *f = opaque;
    if (f->broken) {
        errno = f->err;
        return -1;
    }
    if (f->armed && ++f->writes == f->fail_write) {
        if (f->short_first && size > 1) {
            f->broken = 1;
            return (long long)write(fd, data, size / 2);
        }
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

/* Writes a commit makes: per section one (an EXAC section stored as is
 * two: its header, then the caller's rows, not copied together), plus one
 * for the zero padding after it when it does not end at a multiple of 64;
 * the directory; the trailer (spec 7.6). */
static int expected_writes(const uint8_t *file, size_t size, uint64_t seq)
{
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, file, size, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    ck_assert_uint_eq(ai.n_commits, seq);
    int n = 2, secs = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        ck_assert_int_eq(fkvf_reader_section(r, i, &si), FKVF_OK);
        if (si.commit_seq != seq)
            continue;
        secs++;
        n += 1 + ((si.offset + si.stored_size) % 64 != 0);
        n += si.type == FKVF_SECTION_EXAC && !(si.flags & FKVF_SECTION_DEFLATE);
    }
    ck_assert_int_eq(secs, 3); /* index streams, exact rows, token stream */
    fkvf_reader_free(r);
    return n;
}

static void io_faults(size_t last_batch, int want_pad)
{
    make_dir();
    char path[128], base_path[128];
    path_in(path, sizeof path, "a.fkvf");
    path_in(base_path, sizeof base_path, "base.fkvf");
    fkvf_rvq *q = train_codebook(0);
    static const size_t batches[] = {4, 7, 19};
    build(base_path, q, FKVF_SYNC_COMMIT, batches, 3);
    size_t n0;
    uint8_t *base = tu_slurp(base_path, &n0);
    snap prev;
    snap_file(base_path, FKVF_OPEN_STRICT, &prev);
    ck_assert_uint_eq(prev.n, 30);

    /* a clean commit through the counting wrapper: the reference */
    fault_io f;
    memset(&f, 0, sizeof f);
    fkvf_io io = {fio_write, fio_sync, &f};
    fkvf_append_options o;
    fault_opts(&o, FKVF_SYNC_COMMIT);
    o.io = &io;
    tu_write_file(path, base, n0);
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    ck_assert_int_eq(append_range(a, 30, last_batch), FKVF_OK);
    f.armed = 1;
    ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
    fkvf_appender_free(a);
    size_t n1;
    uint8_t *ref = tu_slurp(path, &n1);
    const int n_writes = f.writes, n_syncs = f.syncs;
    ck_assert_int_eq(n_writes, expected_writes(ref, n1, 5));
    ck_assert_int_eq(n_writes, (want_pad ? 7 : 6));
    ck_assert_int_eq(n_syncs, 2); /* before and after the trailer */

    static const struct {
        int err, short_first, sync;
    } modes[] = {{EIO, 0, 0}, {ENOSPC, 0, 0}, {EIO, 1, 0}, {ENOSPC, 1, 0}, {EIO, 0, 1}};
    int cases = 0;
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        int kmax = modes[mi].sync ? n_syncs : n_writes;
        for (int k = 1; k <= kmax; k++) {
            tu_write_file(path, base, n0);
            memset(&f, 0, sizeof f);
            f.err = modes[mi].err;
            f.short_first = modes[mi].short_first;
            if (modes[mi].sync)
                f.fail_sync = k;
            else
                f.fail_write = k;
            a = NULL;
            ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
            ck_assert_int_eq(append_range(a, 30, last_batch), FKVF_OK);
            f.armed = 1;
            int rc = fkvf_appender_commit(a);
            EXPECTF(rc == FKVF_E_IO, "mode %zu, call %d: commit gave %s", mi, k,
                    fkvf_error_name(rc));
            EXPECT(modes[mi].sync ? f.syncs == k : f.writes == k);
            const char *msg = fkvf_appender_message(a);
            EXPECTF(strlen(msg) > 0 && strstr(msg, modes[mi].sync ? "sync" : "write"),
                    "mode %zu, call %d: message '%s'", mi, k, msg);
            /* the writer's message is quoted once: the file named at the
             * start only, one code tag at the end (it was "PATH: exact
             * rows: PATH: offset N: write: ... [FKVF_E_IO] [FKVF_E_IO]") */
            const char *tag = strstr(msg, " [FKVF_E_IO]");
            EXPECTF(tag && !strstr(tag + 2, "[FKVF_E_") && tag[12] == 0,
                    "mode %zu, call %d: code tags in '%s'", mi, k, msg);
            EXPECTF(!strncmp(msg, path, strlen(path)) && !strstr(msg + 1, path),
                    "mode %zu, call %d: the file named more than once in '%s'", mi, k, msg);
            /* the handle is done */
            EXPECT(append_range(a, 30, 1) == FKVF_E_IO);
            EXPECT(fkvf_appender_commit(a) == FKVF_E_IO);
            EXPECT(fkvf_appender_sync(a) == FKVF_E_IO);
            fkvf_appender_free(a);
            /* the file is the previous commit, clean */
            EXPECTF(file_len(path) == n0, "mode %zu, call %d: %llu bytes, want %zu", mi, k,
                    (unsigned long long)file_len(path), n0);
            snap s;
            snap_file(path, FKVF_OPEN_STRICT, &s);
            EXPECT(s.torn == 0 && snap_same(&s, &prev));
            snap_free(&s);
            /* and it continues: the same commit gives the reference bytes */
            fkvf_append_options o2;
            fault_opts(&o2, FKVF_SYNC_COMMIT);
            a = NULL;
            ck_assert_int_eq(fkvf_appender_open(&a, path, &o2, NULL), FKVF_OK);
            ck_assert_int_eq(append_range(a, 30, last_batch), FKVF_OK);
            ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
            fkvf_appender_free(a);
            size_t m;
            uint8_t *again = tu_slurp(path, &m);
            EXPECTF(m == n1 && memcmp(again, ref, n1) == 0, "mode %zu, call %d: continued file differs",
                    mi, k);
            free(again);
            cases++;
        }
    }
    ck_assert_int_eq(cases, 4 * n_writes + n_syncs);
    free(base);
    free(ref);
    snap_free(&prev);
    fkvf_rvq_free(q);
    unlink(path);
    unlink(base_path);
    rmdir(tmpdir);
}

/* 13 positions: the index segment crosses a unit, every section ends at a
 * multiple of 64; 8: the token segment (48 bytes of data) is followed by
 * a padding write */
START_TEST(fault_io_every_call)
{
    io_faults(13, 0);
    io_faults(8, 1);
}
END_TEST

/* fkvf_appender_sync of a FKVF_SYNC_NONE appender fails: a failed fdatasync
 * may have dropped the pages it could not write (Linux reports the error
 * once, then marks them clean), so a later sync must not report the commits
 * durable: the handle refuses further calls. */
START_TEST(fault_sync_now_fails)
{
    make_dir();
    char path[128];
    path_in(path, sizeof path, "s.fkvf");
    fkvf_rvq *q = train_codebook(0);
    static const size_t batches[] = {4, 7};
    build(path, q, FKVF_SYNC_NONE, batches, 2);
    fault_io f;
    memset(&f, 0, sizeof f);
    f.err = EIO;
    f.fail_sync = 1;
    fkvf_io io = {fio_write, fio_sync, &f};
    fkvf_append_options o;
    fault_opts(&o, FKVF_SYNC_NONE);
    o.io = &io;
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    f.armed = 1;
    ck_assert_int_eq(append_range(a, 11, 19), FKVF_OK);
    ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
    ck_assert_int_eq(f.syncs, 0); /* FKVF_SYNC_NONE: none in the commit */
    ck_assert_int_eq(fkvf_appender_sync(a), FKVF_E_IO);
    ck_assert_ptr_nonnull(strstr(fkvf_appender_message(a), "fdatasync"));
    ck_assert_int_eq(fkvf_appender_sync(a), FKVF_E_IO); /* not a false success */
    ck_assert_int_eq(f.syncs, 1);
    ck_assert_int_eq(append_range(a, 30, 1), FKVF_E_IO);
    ck_assert_int_eq(fkvf_appender_commit(a), FKVF_E_IO);
    fkvf_appender_free(a);
    /* the commit made before is in the file (the process did not crash) */
    snap s;
    snap_file(path, FKVF_OPEN_STRICT, &s);
    ck_assert_uint_eq(s.n, 30);
    snap_expect(&s, q);
    snap_free(&s);
    fkvf_rvq_free(q);
    unlink(path);
    rmdir(tmpdir);
}
END_TEST

/* A token id the token codec cannot hold (10-bit quad: >= 1024). Whatever
 * the call that reports it, the file must not be left with bytes after its
 * last commit, and the handle must not keep failing on the same queue. */
START_TEST(fault_token_out_of_range)
{
    make_dir();
    char path[128];
    path_in(path, sizeof path, "t.fkvf");
    fkvf_rvq *q = train_codebook(0);
    static const size_t batches[] = {4, 7, 19};
    build(path, q, FKVF_SYNC_NONE, batches, 3);
    const uint64_t n0 = file_len(path);
    fkvf_append_options o;
    fault_opts(&o, FKVF_SYNC_NONE);
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    uint16_t rows[13 * ROW_ELEMS];
    uint32_t tok[13];
    gen_rows(rows, 30, 13);
    for (int i = 0; i < 13; i++)
        tok[i] = token_of(30 + (uint64_t)i);
    tok[7] = 1024;
    int rc = fkvf_appender_append(a, rows, sizeof rows, 13, tok);
    int at_append = rc != FKVF_OK;
    if (rc == FKVF_OK)
        rc = fkvf_appender_commit(a);
    ck_assert_int_eq(rc, FKVF_E_INVALID_ARG);
    ck_assert_uint_gt(strlen(fkvf_appender_message(a)), 0);
    /* nothing of it reached the file */
    ck_assert_uint_eq(file_len(path), n0);
    if (at_append) { /* refused before queuing: the handle goes on */
        fkvf_append_info st;
        ck_assert_int_eq(fkvf_appender_info(a, &st), FKVF_OK);
        ck_assert_uint_eq(st.pending, 0);
        ck_assert_int_eq(append_range(a, 30, 5), FKVF_OK);
        ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
        fkvf_appender_free(a);
        snap s;
        snap_file(path, FKVF_OPEN_STRICT, &s);
        ck_assert_uint_eq(s.n, 35);
        snap_expect(&s, q);
        snap_free(&s);
        fkvf_rvq_free(q);
        unlink(path);
        rmdir(tmpdir);
        return;
    }
    fkvf_appender_free(a);
    snap s;
    snap_file(path, FKVF_OPEN_STRICT, &s);
    ck_assert_uint_eq(s.n, 30);
    snap_free(&s);
    /* a new appender continues */
    a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    ck_assert_int_eq(append_range(a, 30, 13), FKVF_OK);
    ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
    fkvf_appender_free(a);
    snap_file(path, FKVF_OPEN_STRICT, &s);
    ck_assert_uint_eq(s.n, 43);
    snap_expect(&s, q);
    snap_free(&s);
    fkvf_rvq_free(q);
    unlink(path);
    rmdir(tmpdir);
}
END_TEST

/* (c) SIGKILL an appending process at a random moment. */
static void kill_rounds(unsigned sync, int rounds, uint64_t seed, uint32_t max_us)
{
    make_dir();
    fkvf_rvq *q = train_codebook(0);
    tu_rng rng = {seed};
    uint64_t max_seen = 0;
    int torn_rounds = 0;
    /* a kill inside a commit is a matter of timing (rare when commits are
     * quick and the machine loaded): up to 4 x rounds until one was seen */
    for (int round = 0; round < rounds || (torn_rounds == 0 && round < 4 * rounds); round++) {
        char path[128];
        path_in(path, sizeof path, "k.fkvf");
        unlink(path);
        build(path, q, sync, NULL, 0);
        int fds[2];
        ck_assert_int_eq(pipe(fds), 0);
        uint64_t child_seed = tu_next(&rng);
        fflush(NULL);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            close(fds[0]);
            tu_rng cr = {child_seed};
            fkvf_append_options o;
            fault_opts(&o, sync);
            fkvf_appender *a = NULL;
            if (fkvf_appender_open(&a, path, &o, NULL) != FKVF_OK)
                _exit(3);
            uint64_t n = 0;
            if (write(fds[1], &n, sizeof n) != (ssize_t)sizeof n) /* ready */
                _exit(5);
            while (n < 4000) {
                size_t m = 1 + tu_below(&cr, 40);
                if (append_range(a, n, m) != FKVF_OK || fkvf_appender_commit(a) != FKVF_OK)
                    _exit(4);
                n += m;
                if (write(fds[1], &n, sizeof n) != (ssize_t)sizeof n)
                    _exit(5);
            }
            for (;;)
                pause();
        }
        close(fds[1]);
        /* wait for the child to be ready and to report 0..7 commits (so that
         * the kills spread over many commits however fast the machine is),
         * then let it run a random while longer */
        uint64_t last = 0, v;
        uint32_t wait_commits = tu_below(&rng, 8);
        for (uint32_t i = 0; i <= wait_commits; i++)
            if (read(fds[0], &v, sizeof v) == (ssize_t)sizeof v)
                last = v;
        uint32_t us = tu_below(&rng, max_us);
        struct timespec ts = {0, (long)us * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                      "round %d: the child failed (status %d)", round, status);
        while (read(fds[0], &v, sizeof v) == (ssize_t)sizeof v)
            last = v;
        close(fds[0]);
        snap s;
        snap_file(path, 0, &s);
        ck_assert_msg(s.n >= last, "round %d: %llu positions, the child committed %llu", round,
                      (unsigned long long)s.n, (unsigned long long)last);
        snap_expect(&s, q);
        torn_rounds += s.torn > 0;
        if (s.n > max_seen)
            max_seen = s.n;
        /* recover and continue */
        fkvf_append_options o;
        fault_opts(&o, sync);
        o.recover = 1;
        fkvf_appender *a = NULL;
        ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
        ck_assert_int_eq(append_range(a, s.n, 9), FKVF_OK);
        ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
        fkvf_appender_free(a);
        snap s2;
        snap_file(path, FKVF_OPEN_STRICT, &s2);
        ck_assert_uint_eq(s2.n, s.n + 9);
        snap_expect(&s2, q);
        snap_free(&s);
        snap_free(&s2);
        unlink(path);
    }
    /* the kills did not all land before the first commit */
    ck_assert_uint_gt(max_seen, 0);
    ck_assert_int_ge(torn_rounds, 1); /* and some of them inside a commit */
    fkvf_rvq_free(q);
    rmdir(tmpdir);
}

START_TEST(fault_kill_sync_none)
{
    kill_rounds(FKVF_SYNC_NONE, 30, 11, 5000);
}
END_TEST

START_TEST(fault_kill_sync_commit)
{
    kill_rounds(FKVF_SYNC_COMMIT, 30, 12, 50000); /* two fdatasyncs per commit */
}
END_TEST

/* ---- a commit written in pieces (fkvf.h fkvf_appender_append): with the
 * queue's bound made small (fkvf_appender_set_queue_bytes), appends write
 * the positions whose place is decided before the commit; what the file
 * restores to must not change, nor must a failure or a crash before the
 * commit leave anything of it. Archive shape as above (S = 3, W = 5, k =
 * 16: 4-bit index symbols, unit 32). ---- */

typedef struct spill_plan {
    int pre_rope, ngon, with_cb;
    size_t queue;          /* fkvf_appender_set_queue_bytes; 0: the default */
    size_t piece;          /* positions per fkvf_appender_append; 0: the whole commit */
    const size_t *commits; /* positions per commit */
    size_t n_commits;
    int reopen; /* a new appender for every commit */
} spill_plan;

/* A new archive at path grown as the plan says; the token ids in tokens. */
static uint64_t spill_build(const char *path, const fkvf_rvq *q, const spill_plan *p,
                            uint32_t *tokens)
{
    fkvf_desc d = test_desc(p->pre_rope);
    fkvf_append_create c;
    memset(&c, 0, sizeof c);
    c.desc = &d;
    c.codebook = p->with_cb ? q : NULL;
    if (p->ngon) {
        c.index_codec.profile = FKVF_PROFILE_NGON;
        c.index_codec.alphabet = 16;
    }
    c.token_codec.profile = FKVF_PROFILE_QUAD;
    c.token_codec.symbol_bits = 10;
    fkvf_append_options o;
    fault_opts(&o, FKVF_SYNC_NONE);
    unlink(path);
    fkvf_appender *a = NULL;
    int rc = fkvf_appender_create(&a, path, &c, &o, NULL);
    ck_assert_msg(rc == FKVF_OK, "create: %s", fkvf_appender_message(a));
    uint64_t n = 0;
    for (size_t i = 0; i < p->n_commits; i++) {
        if (p->reopen && i) {
            fkvf_appender_free(a);
            a = NULL;
            ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
        }
        ck_assert_int_eq(fkvf_appender_set_queue_bytes(a, p->queue), FKVF_OK);
        size_t m = p->commits[i], step = p->piece ? p->piece : m;
        for (size_t j = 0; j < m; j += step)
            append_n(a, n + j, m - j < step ? m - j : step, tokens, 1);
        n += m;
        rc = fkvf_appender_commit(a);
        ck_assert_msg(rc == FKVF_OK, "commit %zu: %s", i, fkvf_appender_message(a));
    }
    fkvf_appender_free(a);
    return n;
}

/* STRM sections of the index group, and EXAC sections, of commit seq. */
static void commit_sections(const char *path, uint64_t seq, int *n_index, int *n_exact)
{
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    *n_index = *n_exact = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        ck_assert_int_eq(fkvf_reader_section(r, i, &si), FKVF_OK);
        if (si.commit_seq != seq)
            continue;
        *n_index += si.type == FKVF_SECTION_STRM && si.key == 0; /* the index group */
        *n_exact += si.type == FKVF_SECTION_EXAC;
    }
    fkvf_reader_free(r);
}

/* One variant: the reference (the default queue, one call per commit: no
 * spill), the same commits with a small queue in one call per commit and
 * in calls of 13 positions, and with another small queue. */
static void spill_variant(int pre_rope, int ngon, int with_cb, int reopen)
{
    make_dir();
    char ref[128], one[128], pieces[128], other[128];
    path_in(ref, sizeof ref, "ref.fkvf");
    path_in(one, sizeof one, "one.fkvf");
    path_in(pieces, sizeof pieces, "pieces.fkvf");
    path_in(other, sizeof other, "other.fkvf");
    fkvf_rvq *q = with_cb ? train_codebook(pre_rope) : NULL;
    static const size_t commits[] = {150, 7, 300, 1, 64};
    spill_plan p = {pre_rope, ngon, with_cb, 0, 0, commits, 5, reopen};
    uint32_t tokens[1024];
    uint64_t n = spill_build(ref, q, &p, tokens);
    p.queue = 1; /* one alignment unit of rows */
    ck_assert_uint_eq(spill_build(one, q, &p, tokens), n);
    p.piece = 13;
    ck_assert_uint_eq(spill_build(pieces, q, &p, tokens), n);
    p.piece = 0;
    p.queue = 41 * ROW_BYTES;
    ck_assert_uint_eq(spill_build(other, q, &p, tokens), n);
    /* every position as the codebook gives it, independently of the code */
    check_file(one, q, pre_rope, n, archived_after(n, with_cb), tokens);
    check_file(other, q, pre_rope, n, archived_after(n, with_cb), tokens);
    /* the same as the reference, and the same bytes however the rows of a
     * commit were split between calls */
    snap a, b, c;
    snap_file(ref, FKVF_OPEN_STRICT, &a);
    snap_file(one, FKVF_OPEN_STRICT, &b);
    snap_file(other, FKVF_OPEN_STRICT, &c);
    EXPECT(snap_same(&a, &b) && snap_same(&a, &c));
    snap_free(&a);
    snap_free(&b);
    snap_free(&c);
    size_t s1, s2;
    uint8_t *f1 = tu_slurp(one, &s1), *f2 = tu_slurp(pieces, &s2);
    EXPECT(s1 == s2 && memcmp(f1, f2, s1) == 0);
    free(f1);
    free(f2);
    /* the 300-position commit (commit 4) was written in pieces with the
     * small queue, in one index segment (one EXAC section without a
     * codebook) with the default one */
    int ri, rx, si, sx;
    commit_sections(ref, 4, &ri, &rx);
    commit_sections(one, 4, &si, &sx);
    if (with_cb) {
        EXPECTF(ri == 1 && si > 3, "index segments of commit 4: %d and %d", ri, si);
    } else {
        EXPECTF(ri == 0 && si == 0 && rx == 1 && sx > 3, "EXAC sections of commit 4: %d and %d",
                rx, sx);
    }
    fkvf_rvq_free(q);
    unlink(ref);
    unlink(one);
    unlink(pieces);
    unlink(other);
    rmdir(tmpdir);
}

START_TEST(append_spill_same_rows)
{
    spill_variant(0, 0, 1, 0);
    spill_variant(1, 0, 1, 1); /* keys before RoPE, reopened after every commit */
    spill_variant(0, 1, 1, 0); /* ngon */
    spill_variant(0, 0, 0, 1); /* no codebook: every position exact */
}
END_TEST

/* A file of 30 committed positions (A = 22: a partial unit) at path, its
 * bytes in *base (n0), its contents in *prev. */
static uint8_t *spill_base(const char *path, const fkvf_rvq *q, size_t *n0, snap *prev)
{
    static const size_t batches[] = {4, 7, 19};
    build(path, q, FKVF_SYNC_COMMIT, batches, 3);
    uint8_t *base = tu_slurp(path, n0);
    snap_file(path, FKVF_OPEN_STRICT, prev);
    ck_assert_uint_eq(prev->n, 30);
    return base;
}

/* 150 positions after the 30, in calls of 50, with a queue of one unit:
 * the appends write index segments (and the commit the rest). The first
 * failing call's code into *rc_out (FKVF_OK: none), the call in *at (0..2
 * the appends, 3 the commit). */
static void spill_run(fkvf_appender *a, int *rc_out, int *at)
{
    *rc_out = FKVF_OK;
    *at = -1;
    ck_assert_int_eq(fkvf_appender_set_queue_bytes(a, 1), FKVF_OK);
    for (int i = 0; i < 4; i++) {
        int rc = i < 3 ? append_range(a, 30 + 50 * (uint64_t)i, 50) : fkvf_appender_commit(a);
        if (rc != FKVF_OK) {
            *rc_out = rc;
            *at = i;
            return;
        }
    }
}

/* Every write and sync of a commit written in pieces fails in turn (an
 * error, or a short write after which every write fails): the failing call
 * (an append or the commit) says so, the handle is done, the file is the
 * previous commit again, byte for byte, and continues. With a codebook the
 * appends write index segments; without one, EXAC sections. */
static void spill_io_faults(int with_cb)
{
    make_dir();
    char path[128], base_path[128];
    path_in(path, sizeof path, "a.fkvf");
    path_in(base_path, sizeof base_path, "base.fkvf");
    fkvf_rvq *q = with_cb ? train_codebook(0) : NULL;
    size_t n0;
    snap prev;
    uint8_t *base = spill_base(base_path, q, &n0, &prev);

    fault_io f;
    memset(&f, 0, sizeof f);
    fkvf_io io = {fio_write, fio_sync, &f};
    fkvf_append_options o;
    fault_opts(&o, FKVF_SYNC_COMMIT);
    o.io = &io;
    /* the reference: the writes of the appends, then of the commit */
    tu_write_file(path, base, n0);
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    f.armed = 1;
    int rc, at, cum[4]; /* writes made by the end of each call */
    ck_assert_int_eq(fkvf_appender_set_queue_bytes(a, 1), FKVF_OK);
    for (int i = 0; i < 4; i++) {
        rc = i < 3 ? append_range(a, 30 + 50 * (uint64_t)i, 50) : fkvf_appender_commit(a);
        ck_assert_int_eq(rc, FKVF_OK);
        cum[i] = f.writes;
    }
    fkvf_appender_free(a);
    const int n_writes = f.writes, n_syncs = f.syncs, writes_appends = cum[2];
    /* every call wrote: the appends before the commit */
    ck_assert(cum[0] > 0 && cum[1] > cum[0] && cum[2] > cum[1] && cum[3] > cum[2]);
    ck_assert_int_eq(n_syncs, 2);
    size_t n1;
    uint8_t *ref = tu_slurp(path, &n1);
    snap last;
    snap_file(path, FKVF_OPEN_STRICT, &last);
    ck_assert_uint_eq(last.n, 180);
    if (q)
        snap_expect(&last, q);
    int si, sx;
    commit_sections(path, 5, &si, &sx);
    ck_assert_int_gt(q ? si : sx, 2);

    static const struct {
        int err, short_first, sync;
    } modes[] = {{EIO, 0, 0}, {ENOSPC, 0, 0}, {EIO, 1, 0}, {ENOSPC, 1, 0}, {EIO, 0, 1}};
    int cases = 0, in_appends = 0;
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        int kmax = modes[mi].sync ? n_syncs : n_writes;
        for (int k = 1; k <= kmax; k++) {
            tu_write_file(path, base, n0);
            memset(&f, 0, sizeof f);
            f.err = modes[mi].err;
            f.short_first = modes[mi].short_first;
            if (modes[mi].sync)
                f.fail_sync = k;
            else
                f.fail_write = k;
            a = NULL;
            ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
            f.armed = 1;
            spill_run(a, &rc, &at);
            EXPECTF(rc == FKVF_E_IO, "mode %zu, call %d: %s at call %d", mi, k,
                    fkvf_error_name(rc), at);
            /* the call that failed is the one that made the failing write */
            int want_at = 3;
            for (int i = 2; i >= 0 && !modes[mi].sync; i--)
                want_at = k <= cum[i] ? i : want_at;
            EXPECTF(at == want_at, "mode %zu, call %d failed in call %d, not %d", mi, k, at,
                    want_at);
            in_appends += at < 3;
            EXPECTF(strstr(fkvf_appender_message(a), modes[mi].sync ? "sync" : "write"),
                    "mode %zu, call %d: message '%s'", mi, k, fkvf_appender_message(a));
            /* the handle is done */
            EXPECT(append_range(a, 30, 1) == FKVF_E_IO);
            EXPECT(fkvf_appender_commit(a) == FKVF_E_IO);
            fkvf_appender_free(a);
            /* nothing of the commit is left: the previous one, clean */
            EXPECTF(file_len(path) == n0, "mode %zu, call %d: %llu bytes, want %zu", mi, k,
                    (unsigned long long)file_len(path), n0);
            snap s;
            snap_file(path, FKVF_OPEN_STRICT, &s);
            EXPECT(s.torn == 0 && snap_same(&s, &prev));
            snap_free(&s);
            /* and it continues: the same appends give the reference bytes */
            fkvf_append_options o2;
            fault_opts(&o2, FKVF_SYNC_COMMIT);
            a = NULL;
            ck_assert_int_eq(fkvf_appender_open(&a, path, &o2, NULL), FKVF_OK);
            spill_run(a, &rc, &at);
            EXPECT(rc == FKVF_OK);
            fkvf_appender_free(a);
            size_t m;
            uint8_t *again = tu_slurp(path, &m);
            EXPECTF(m == n1 && memcmp(again, ref, n1) == 0,
                    "mode %zu, call %d: continued file differs", mi, k);
            free(again);
            cases++;
        }
    }
    ck_assert_int_eq(cases, 4 * n_writes + n_syncs);
    ck_assert_int_eq(in_appends, 4 * writes_appends); /* failures inside the appends seen */
    free(base);
    free(ref);
    snap_free(&prev);
    snap_free(&last);
    fkvf_rvq_free(q);
    unlink(path);
    unlink(base_path);
    rmdir(tmpdir);
}

START_TEST(fault_spill_io_every_call)
{
    spill_io_faults(1);
    spill_io_faults(0);
}
END_TEST

/* Queued positions written before a commit that never comes: freeing the
 * appender cuts them off (the file is the previous commit, clean); a
 * process killed before the commit leaves them as a torn tail, which
 * readers ignore (serving the previous commit) and recovery cuts off. */
START_TEST(spill_uncommitted)
{
    make_dir();
    char path[128], base_path[128];
    path_in(path, sizeof path, "a.fkvf");
    path_in(base_path, sizeof base_path, "base.fkvf");
    fkvf_rvq *q = train_codebook(0);
    size_t n0;
    snap prev;
    uint8_t *base = spill_base(base_path, q, &n0, &prev);
    fkvf_append_options o;
    fault_opts(&o, FKVF_SYNC_NONE);

    /* freed without a commit */
    tu_write_file(path, base, n0);
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_appender_set_queue_bytes(a, 1), FKVF_OK);
    ck_assert_int_eq(append_range(a, 30, 150), FKVF_OK);
    uint64_t grown = file_len(path);
    fkvf_append_info st;
    ck_assert_int_eq(fkvf_appender_info(a, &st), FKVF_OK);
    fkvf_appender_free(a);
    ck_assert_uint_gt(grown, n0); /* it did write */
    EXPECT(st.pending == 150 && st.n_positions == 30 && st.file_size == n0);
    EXPECT(file_len(path) == n0);
    snap s;
    snap_file(path, FKVF_OPEN_STRICT, &s);
    EXPECT(snap_same(&s, &prev));
    snap_free(&s);

    /* killed before the commit */
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        a = NULL;
        if (fkvf_appender_open(&a, path, &o, NULL) != FKVF_OK ||
            fkvf_appender_set_queue_bytes(a, 1) != FKVF_OK || append_range(a, 30, 150) != FKVF_OK)
            _exit(3);
        kill(getpid(), SIGKILL);
        _exit(4);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    ck_assert_uint_gt(file_len(path), n0);
    snap_file(path, 0, &s);
    EXPECT(s.torn == file_len(path) - n0 && s.committed == n0 && snap_same(&s, &prev));
    snap_free(&s);
    fkvf_reader *r = NULL;
    EXPECT(fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL) == FKVF_E_TORN);
    fkvf_reader_free(r);
    fkvf_recover_options ro;
    fkvf_recover_options_init(&ro);
    fkvf_recover_result res;
    fkvf_archive_op *op = NULL;
    EXPECT(fkvf_archive_recover(&op, path, &ro, &res) == FKVF_OK);
    fkvf_archive_op_free(op);
    EXPECT(file_len(path) == n0);
    snap_file(path, FKVF_OPEN_STRICT, &s);
    EXPECT(snap_same(&s, &prev));
    snap_free(&s);
    free(base);
    snap_free(&prev);
    fkvf_rvq_free(q);
    unlink(path);
    unlink(base_path);
    rmdir(tmpdir);
}
END_TEST

/* (d) The k-th allocation fails, for every k. */
static int tmp_files_in(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp-"))
            n++;
    closedir(d);
    return n;
}

/* (e) A torn tail, and the k-th allocation of the reader's open failing, for
 * every k: the open fails with FKVF_E_NOMEM or serves the last complete
 * commit, never an earlier one (the torn-tail scan took an allocation
 * failure at the last valid trailer for a broken chain and went on to an
 * earlier trailer: the reader served an older commit, and a recovery cut
 * complete commits off). */
START_TEST(fault_alloc_torn_open)
{
    make_dir();
    char path[128];
    path_in(path, sizeof path, "t.fkvf");
    fkvf_rvq *q = train_codebook(0);
    static const size_t b[] = {4, 9, 13, 2};
    uint64_t n = build(path, q, FKVF_SYNC_NONE, b, 4);
    size_t sz;
    uint8_t *p = tu_slurp(path, &sz);
    uint8_t *torn = malloc(sz + 100);
    ck_assert_ptr_nonnull(torn);
    memcpy(torn, p, sz);
    memset(torn + sz, 'x', 100);
    tu_write_file(path, torn, sz + 100);
    tu_alloc ca;
    fkvf_allocator al = tu_alloc_hook(&ca);
    long total = 0;
    for (long k = 0;; k++) {
        memset(&ca, 0, sizeof ca);
        ca.fail_at = k;
        fkvf_reader *r = NULL;
        int rc = fkvf_reader_open_file(&r, path, 0, &al);
        if (k == 0) {
            ck_assert_int_eq(rc, FKVF_OK);
            total = ca.calls;
        }
        if (rc == FKVF_OK) {
            fkvf_archive_info ai;
            ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
            EXPECTF(ai.n_commits == 5 && ai.n_positions == n && ai.committed_size == sz &&
                        ai.torn_bytes == 100,
                    "k %ld: opened at commit %llu (%llu positions), not at commit 5", k,
                    (unsigned long long)ai.n_commits, (unsigned long long)ai.n_positions);
        } else {
            EXPECTF(rc == FKVF_E_NOMEM, "k %ld: %s", k, fkvf_error_name(rc));
        }
        fkvf_reader_free(r);
        EXPECTF(ca.live == 0, "k %ld: %ld blocks leaked", k, (long)ca.live);
        if (k >= total)
            break;
    }
    free(p);
    free(torn);
    fkvf_rvq_free(q);
    unlink(path);
    rmdir(tmpdir);
}
END_TEST

START_TEST(fault_alloc_every_call)
{
    make_dir();
    char path[128];
    path_in(path, sizeof path, "m.fkvf");
    fkvf_rvq *q = train_codebook(0);
    fkvf_desc d;
    fkvf_append_create c;
    fault_create_desc(&d, &c, q);
    fkvf_append_options o;
    fault_opts(&o, FKVF_SYNC_NONE);
    static tu_alloc ca; /* the handles keep a pointer to the allocator */
    static fkvf_allocator al;
    al = tu_alloc_hook(&ca);
    long k;
    long failures = 0;
    for (k = 1; k < 100000; k++) {
        memset(&ca, 0, sizeof ca);
        ca.fail_at = k;
        unlink(path);
        fkvf_appender *a = NULL;
        int rc = fkvf_appender_create(&a, path, &c, &o, &al);
        const char *step = "create";
        /* create, two commits, reopen, one more commit */
        static const size_t cut[] = {0, 6, 30, 43};
        for (int i = 0; rc == FKVF_OK && i < 3; i++) {
            if (i == 2) {
                step = "reopen";
                fkvf_appender_free(a);
                a = NULL;
                if ((rc = fkvf_appender_open(&a, path, &o, &al)))
                    break;
            }
            step = "append";
            if ((rc = append_range(a, cut[i], cut[i + 1] - cut[i])))
                break;
            step = "commit";
            rc = fkvf_appender_commit(a);
        }
        EXPECTF(rc == FKVF_OK || rc == FKVF_E_NOMEM, "allocation %ld: %s gave %s (%s)", k, step,
                fkvf_error_name(rc), a ? fkvf_appender_message(a) : "");
        EXPECTF(rc == FKVF_OK || ca.failed, "allocation %ld: %s failed without a failed allocation",
                k, step);
        if (rc && a)
            EXPECTF(strlen(fkvf_appender_message(a)) > 0 || !strcmp(step, "create"),
                    "allocation %ld: %s: no message", k, step);
        fkvf_appender_free(a);
        EXPECTF(ca.live == 0, "allocation %ld (%s): %ld blocks leaked", k, step, ca.live);
        EXPECTF(tmp_files_in(tmpdir) == 0, "allocation %ld: a temporary file was left", k);
        /* the file, if made, opens clean at a commit of the sequence */
        struct stat sb;
        if (stat(path, &sb) == 0) {
            snap s;
            snap_file(path, FKVF_OPEN_STRICT, &s);
            EXPECTF(s.n == 0 || s.n == 6 || s.n == 30 || s.n == 43, "allocation %ld: n %llu", k,
                    (unsigned long long)s.n);
            snap_expect(&s, q);
            if (!ca.failed)
                EXPECT(s.n == 43);
            snap_free(&s);
        } else {
            EXPECTF(rc && !strcmp(step, "create"), "allocation %ld: no file after %s", k, step);
        }
        if (!ca.failed)
            break;
        failures++;
    }
    ck_assert_msg(!ca.failed, "did not get through without a failure");
    ck_assert_int_gt(failures, 100); /* it did inject many */
    fkvf_rvq_free(q);
    unlink(path);
    rmdir(tmpdir);
}
END_TEST

START_TEST(append_misuse)
{
    make_dir();
    char path[128];
    path_in(path, sizeof path, "u.fkvf");
    fkvf_rvq *q = train_codebook(0);
    static const size_t b[] = {10};
    build(path, q, FKVF_SYNC_NONE, b, 1);
    fkvf_append_options o;
    fault_opts(&o, FKVF_SYNC_NONE);
    fkvf_appender *a = NULL, *a2 = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    /* one appender per file */
    ck_assert_int_eq(fkvf_appender_open(&a2, path, &o, NULL), FKVF_E_IO);
    ck_assert_ptr_nonnull(strstr(fkvf_appender_message(a2), "lock"));
    ck_assert_int_eq(fkvf_appender_append(a2, NULL, 0, 0, NULL), FKVF_E_IO);
    fkvf_appender_free(a2);
    /* wrong sizes, NULL rows, missing or unwanted tokens */
    uint16_t rows[2 * ROW_ELEMS];
    uint32_t tok[2] = {1, 2};
    gen_rows(rows, 10, 2);
    ck_assert_int_eq(fkvf_appender_append(a, rows, 2 * ROW_BYTES - 1, 2, tok), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_appender_append(a, rows, 2 * ROW_BYTES + 2, 2, tok), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_appender_append(a, rows, ROW_BYTES, 2, tok), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_appender_append(a, NULL, 2 * ROW_BYTES, 2, tok), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_appender_append(a, rows, 2 * ROW_BYTES, 2, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_appender_append(a, rows, SIZE_MAX, SIZE_MAX / 2, tok),
                     FKVF_E_INVALID_ARG);
    ck_assert_uint_gt(strlen(fkvf_appender_message(a)), 0);
    fkvf_append_info st;
    ck_assert_int_eq(fkvf_appender_info(a, &st), FKVF_OK);
    ck_assert_uint_eq(st.pending, 0); /* nothing was queued */
    ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK); /* nothing to commit */
    /* the handle still works */
    ck_assert_int_eq(append_range(a, 10, 2), FKVF_OK);
    ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
    fkvf_appender_free(a);
    a = NULL;
    /* the lock went with the handle */
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_OK);
    fkvf_appender_free(a);
    snap s;
    snap_file(path, FKVF_OPEN_STRICT, &s);
    ck_assert_uint_eq(s.n, 12);
    snap_expect(&s, q);
    snap_free(&s);
    /* tokens for an archive without a token stream */
    char p2[128];
    path_in(p2, sizeof p2, "nt.fkvf");
    fkvf_desc d = test_desc(0);
    fkvf_append_create c;
    memset(&c, 0, sizeof c);
    c.desc = &d;
    c.codebook = q;
    ck_assert_int_eq(fkvf_appender_create(&a, p2, &c, &o, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_appender_append(a, rows, 2 * ROW_BYTES, 2, tok), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_appender_append(a, rows, 2 * ROW_BYTES, 2, NULL), FKVF_OK);
    fkvf_appender_free(a); /* drops the queued positions */
    /* create never replaces a file */
    a = NULL;
    ck_assert_int_eq(fkvf_appender_create(&a, p2, &c, &o, NULL), FKVF_E_EXISTS);
    fkvf_appender_free(a);
    /* NULL handles */
    fkvf_appender_free(NULL);
    ck_assert_int_eq(fkvf_appender_commit(NULL), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_appender_sync(NULL), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_appender_append(NULL, rows, ROW_BYTES, 1, NULL), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_appender_info(NULL, &st), FKVF_E_STATE);
    ck_assert_ptr_nonnull(fkvf_appender_message(NULL));
    ck_assert_int_eq(fkvf_appender_open(NULL, path, &o, NULL), FKVF_E_INVALID_ARG);
    fkvf_rvq_free(q);
    unlink(path);
    unlink(p2);
    rmdir(tmpdir);
}
END_TEST

/* fkvf_archive_recover: a torn tail cut off under the appender's lock (a dry
 * run only reports), a clean file untouched, the refusals with their error
 * fields. */
START_TEST(archive_recover)
{
    make_dir();
    char path[128], copy[128];
    path_in(path, sizeof path, "r.fkvf");
    path_in(copy, sizeof copy, "r.copy");
    fkvf_rvq *q = train_codebook(0);
    static const size_t b[] = {4, 9, 13};
    uint64_t n = build(path, q, FKVF_SYNC_NONE, b, 3);
    snap clean;
    snap_file(path, FKVF_OPEN_STRICT, &clean);
    uint64_t committed = file_len(path);
    /* a torn tail: 100 bytes of an append that did not complete */
    size_t sz;
    uint8_t *p = tu_slurp(path, &sz);
    uint8_t *torn = malloc(sz + 100);
    ck_assert_ptr_nonnull(torn);
    memcpy(torn, p, sz);
    memset(torn + sz, 'x', 100);
    tu_write_file(path, torn, sz + 100);
    tu_write_file(copy, torn, sz + 100);
    fkvf_archive_op *op = NULL;
    fkvf_recover_options o;
    fkvf_recover_options_init(&o);
    o.dry_run = 1;
    fkvf_recover_result res;
    ck_assert_int_eq(fkvf_archive_recover(&op, path, &o, &res), FKVF_OK);
    ck_assert_uint_eq(res.torn_bytes, 100);
    ck_assert_uint_eq(res.file_size, sz + 100);
    ck_assert_uint_eq(res.committed_size, committed);
    ck_assert_uint_eq(res.commits, 4);
    ck_assert_uint_eq(res.positions, n);
    ck_assert_int_eq(res.truncated, 0);
    fkvf_archive_op_free(op);
    ck_assert_uint_eq(file_len(path), sz + 100);
    /* refused while another process (here: another open file) holds the lock */
    o.dry_run = 0;
    int fd = open(path, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(flock(fd, LOCK_EX | LOCK_NB), 0);
    ck_assert_int_eq(fkvf_archive_recover(&op, path, &o, &res), FKVF_E_IO);
    fkvf_error_info e;
    ck_assert_int_eq(fkvf_archive_op_error(op, &e), FKVF_OK);
    ck_assert_int_eq(e.code, FKVF_E_IO);
    ck_assert_str_eq(e.file, path);
    ck_assert_ptr_nonnull(e.clause);
    ck_assert_str_eq(e.clause, "7.4");
    fkvf_archive_op_free(op);
    close(fd);
    ck_assert_uint_eq(file_len(path), sz + 100);
    /* cut: the file opens strict at the same commit and serves the same */
    ck_assert_int_eq(fkvf_archive_recover(NULL, path, &o, &res), FKVF_OK);
    ck_assert_int_eq(res.truncated, 1);
    ck_assert_uint_eq(res.torn_bytes, 100);
    ck_assert_uint_eq(file_len(path), committed);
    snap after;
    snap_file(path, FKVF_OPEN_STRICT, &after);
    ck_assert(snap_same(&after, &clean));
    snap_free(&after);
    /* clean: nothing to do, nothing written */
    ck_assert_int_eq(fkvf_archive_recover(&op, path, NULL, &res), FKVF_OK);
    ck_assert_int_eq(res.truncated, 0);
    ck_assert_uint_eq(res.torn_bytes, 0);
    ck_assert_int_eq(fkvf_archive_op_error(op, &e), FKVF_OK);
    ck_assert_int_eq(e.code, FKVF_OK);
    fkvf_archive_op_free(op);
    ck_assert_uint_eq(file_len(path), committed);
    /* not an FKVF file: the reader's error, with its file and clause */
    memset(torn, 'j', 256);
    tu_write_file(path, torn, 256);
    ck_assert_int_eq(fkvf_archive_recover(&op, path, &o, &res), FKVF_E_BAD_MAGIC);
    ck_assert_int_eq(fkvf_archive_op_error(op, &e), FKVF_OK);
    ck_assert_str_eq(e.file, path);
    ck_assert_uint_eq(e.offset, 0);
    ck_assert_ptr_nonnull(strstr(e.message, "not an FKVF file"));
    fkvf_archive_op_free(op);
    ck_assert_uint_eq(file_len(path), 256);
    unlink(path);
    ck_assert_int_eq(fkvf_archive_recover(NULL, path, &o, &res), FKVF_E_IO);
    ck_assert_int_eq(fkvf_archive_recover(NULL, NULL, &o, &res), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_archive_op_error(NULL, &e), FKVF_E_STATE);
    snap_free(&clean);
    free(p);
    free(torn);
    fkvf_rvq_free(q);
    unlink(copy);
    rmdir(tmpdir);
}
END_TEST

/* One durability option, one meaning: the writer and the appender take the
 * same sync values and refuse any other (the writer's was an int no_sync,
 * where any value was accepted). */
START_TEST(sync_option_values)
{
    static const unsigned ok[] = {FKVF_SYNC_COMMIT, FKVF_SYNC_NONE};
    for (size_t i = 0; i < 2; i++) {
        tu_buf b = {0};
        fkvf_sink sink = tu_buf_sink(&b);
        fkvf_writer_options wo;
        fkvf_writer_options_init(&wo);
        ck_assert_uint_eq(wo.sync, FKVF_SYNC_COMMIT);
        wo.sync = ok[i];
        fkvf_writer *w = NULL;
        ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &wo, NULL), FKVF_OK);
        fkvf_writer_free(w);
        tu_buf_free(&b);
    }
    tu_buf b = {0};
    fkvf_sink sink = tu_buf_sink(&b);
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    wo.sync = 2;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &wo, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fkvf_writer_message(w), "options.sync"));
    fkvf_writer_free(w);
    tu_buf_free(&b);
    /* the appender: open and create refuse it, and create makes no file */
    make_dir();
    char path[128], p2[128];
    path_in(path, sizeof path, "s.fkvf");
    path_in(p2, sizeof p2, "s2.fkvf");
    fkvf_rvq *q = train_codebook(0);
    static const size_t batches[] = {4};
    build(path, q, FKVF_SYNC_NONE, batches, 1);
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    ck_assert_uint_eq(o.sync, FKVF_SYNC_COMMIT);
    o.sync = 2;
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_E_INVALID_ARG);
    fkvf_appender_free(a);
    fkvf_desc d = test_desc(0);
    fkvf_append_create c;
    memset(&c, 0, sizeof c);
    c.desc = &d;
    c.codebook = q;
    a = NULL;
    ck_assert_int_eq(fkvf_appender_create(&a, p2, &c, &o, NULL), FKVF_E_INVALID_ARG);
    fkvf_appender_free(a);
    ck_assert_int_eq(access(p2, F_OK), -1);
    /* the whole-file operations take the same values */
    fkvf_recover_options ro;
    fkvf_recover_options_init(&ro);
    ck_assert_uint_eq(ro.sync, FKVF_SYNC_COMMIT);
    ro.sync = 2;
    ck_assert_int_eq(fkvf_archive_recover(NULL, path, &ro, NULL), FKVF_E_INVALID_ARG);
    fkvf_compact_options co;
    fkvf_compact_options_init(&co);
    ck_assert_uint_eq(co.sync, FKVF_SYNC_COMMIT);
    co.sync = 2;
    ck_assert_int_eq(fkvf_archive_compact(NULL, path, p2, &co, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(access(p2, F_OK), -1);
    fkvf_rvq_free(q);
    unlink(path);
    rmdir(tmpdir);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("append");
    TCase *t = tcase_create("append");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, append_batches_quad);
    tcase_add_test(t, append_batches_reopen);
    tcase_add_test(t, append_batches_ngon);
    tcase_add_test(t, append_without_codebook_all_exact);
    tcase_add_test(t, append_spill_same_rows);
    tcase_add_test(t, archive_recover);
    suite_add_tcase(s, t);
    TCase *f = tcase_create("faults");
    tcase_set_timeout(f, 300);
    tcase_add_test(f, fault_torn_every_cut);
    tcase_add_test(f, fault_io_every_call);
    tcase_add_test(f, fault_spill_io_every_call);
    tcase_add_test(f, spill_uncommitted);
    tcase_add_test(f, fault_sync_now_fails);
    tcase_add_test(f, fault_token_out_of_range);
    tcase_add_test(f, fault_kill_sync_none);
    tcase_add_test(f, fault_kill_sync_commit);
    tcase_add_test(f, fault_alloc_every_call);
    tcase_add_test(f, fault_alloc_torn_open);
    tcase_add_test(f, append_misuse);
    tcase_add_test(f, sync_option_values);
    suite_add_tcase(s, f);
    return s;
}

int main(void)
{
    return tu_run_suite(suite());
}
