/* fkvf_archive_compact (fkvf.h "operations on a whole archive file"): an archive of several commits
 * with a torn tail rewritten as one commit, to a new file and in place
 * (also through a symbolic link); every position restores bit for bit as
 * in the input, the token stream and the search indexes come along. The
 * refusals: dst exists (no_replace), src locked by an appender, src is
 * dst, a file that is no archive, an external codebook not given. The
 * k-th allocation failing for every k (the I/O failure loop is
 * test_inject's compact scenarios). */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* realpath */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fkvf.h"
#include "testutil.h"

#define L 2
#define H 2
#define D 8
#define ROW_ELEMS (L * H * 2 * D)
#define ROW_BYTES (ROW_ELEMS * 2)
#define SINKS 3
#define WINDOW 5

static char tmpdir[64];

static void make_dir(void) { tu_tmpdir_make(tmpdir, sizeof tmpdir, "compact"); }

static void path_in(char *out, size_t n, const char *name) { tu_tmp_path(out, n, tmpdir, name); }

/* Files in tmpdir (temporary files left behind show up here). */
static int n_files(void)
{
    DIR *d = opendir(tmpdir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void remove_dir(void) { tu_tmpdir_remove(tmpdir); }

static int same_bytes(const char *a, const char *b)
{
    size_t na, nb;
    uint8_t *pa = tu_read_file(a, &na, NULL), *pb = tu_read_file(b, &nb, NULL);
    int same = pa && pb && na == nb && !memcmp(pa, pb, na);
    free(pa);
    free(pb);
    return same;
}

/* f16 rows of positions [first, first+n), deterministic per position, as
 * the library takes rows: little-endian element bytes. */
static void gen_rows(uint16_t *out, uint64_t first, size_t n)
{
    tu_f16_rows(out, first, n, ROW_ELEMS, 7);
}

static fkvf_rvq *train(void)
{
    enum { NT = 128 };
    uint16_t *rows = malloc((size_t)NT * ROW_BYTES);
    ck_assert_ptr_nonnull(rows);
    gen_rows(rows, 5000, NT);
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = L;
    p.n_kv_heads = H;
    p.key_dim = p.value_dim = D;
    p.k = 16;
    p.k_stages = 2;
    p.v_stages = 1;
    p.max_iters = 3;
    fkvf_rows blk = {rows, NT, FKVF_DTYPE_F16, 0};
    fkvf_rvq *q = NULL;
    ck_assert_int_eq(fkvf_rvq_train(&q, &p, &blk, 1, NULL), FKVF_OK);
    free(rows);
    return q;
}

/* The fixture archive: commits of the given batches (with token ids), the
 * last one cut in half, so that the file has a torn tail. *commits: the
 * complete commits, *positions: the positions they hold. ext: the codebook
 * is the codebook file cb (else embedded). */
static const size_t batches[] = {4, 9, 1, 13, 6, 20, 3, 11};
enum { N_BATCHES = sizeof batches / sizeof batches[0] };

static void build(const char *path, fkvf_reader *cb, uint64_t *commits, uint64_t *positions)
{
    fkvf_rvq *q = cb ? NULL : train();
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = L;
    d.n_kv_heads = H;
    d.key_dim = d.value_dim = D;
    d.dtype = FKVF_DTYPE_F16;
    d.n_sinks = SINKS;
    d.window = WINDOW;
    d.model_id = "test/compact";
    fkvf_append_create c;
    memset(&c, 0, sizeof c);
    c.desc = &d;
    c.codebook = q;
    c.codebook_ref = cb;
    c.codebook_name = "cb.fkvf";
    c.token_codec.profile = FKVF_PROFILE_QUAD;
    c.token_codec.symbol_bits = 10;
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.block_size = 64;
    o.no_auto_compact = 1; /* many commits, for the compaction under test */
    fkvf_appender *a = NULL;
    int rc = fkvf_appender_create(&a, path, &c, &o, NULL);
    ck_assert_msg(rc == FKVF_OK, "create: %s", fkvf_appender_message(a));
    uint64_t n = 0, before_last = 0, n_before_last = 0, seq_before_last = 0;
    uint16_t rows[32 * ROW_ELEMS];
    uint32_t tok[32];
    for (size_t i = 0; i < N_BATCHES; i++) {
        fkvf_append_info st;
        ck_assert_int_eq(fkvf_appender_info(a, &st), FKVF_OK);
        before_last = st.file_size;
        n_before_last = n;
        seq_before_last = st.commit_seq;
        gen_rows(rows, n, batches[i]);
        for (size_t t = 0; t < batches[i]; t++)
            tok[t] = (uint32_t)((n + t) * 7919 % 1000);
        ck_assert_int_eq(fkvf_appender_append(a, rows, batches[i] * ROW_BYTES, batches[i], tok),
                         FKVF_OK);
        rc = fkvf_appender_commit(a);
        ck_assert_msg(rc == FKVF_OK, "commit: %s", fkvf_appender_message(a));
        n += batches[i];
    }
    fkvf_append_info st;
    ck_assert_int_eq(fkvf_appender_info(a, &st), FKVF_OK);
    fkvf_appender_free(a);
    fkvf_rvq_free(q);
    /* the last commit torn: cut in the middle */
    ck_assert_int_eq(truncate(path, (off_t)(before_last + (st.file_size - before_last) / 2)), 0);
    *commits = seq_before_last;
    *positions = n_before_last;
}

/* A codebook file (no descriptor) of a trained quantizer. */
static void build_cb(const char *path)
{
    fkvf_rvq *q = train();
    fkvf_codebook_shape sh;
    uint32_t heads;
    fkvf_rvq_shape(q, &sh, &heads);
    size_t n = fkvf_rvq_tables_size(q);
    void *t = malloc(n);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(fkvf_rvq_tables(q, t, n), FKVF_OK);
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    wo.sync = FKVF_SYNC_NONE;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_file(&w, path, &wo, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, t, n, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
    free(t);
    fkvf_rvq_free(q);
}

/* Everything a reader serves of a file: positions restored, token ids. */
typedef struct snap {
    uint64_t n, archived, commits, torn;
    uint16_t *rows;
    uint32_t *tok;
    size_t n_tok;
} snap;

static void snap_take(const char *path, fkvf_reader *cb, snap *s)
{
    memset(s, 0, sizeof *s);
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, path, 0, NULL);
    ck_assert_msg(rc == FKVF_OK, "%s: %s", path, fkvf_reader_message(r));
    if (cb)
        ck_assert_int_eq(fkvf_reader_attach_codebook(r, cb), FKVF_OK);
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    s->n = ai.n_positions;
    s->archived = ai.n_archived;
    s->commits = ai.n_commits;
    s->torn = ai.torn_bytes;
    s->rows = malloc((size_t)s->n * ROW_BYTES + 1);
    ck_assert_ptr_nonnull(s->rows);
    rc = fkvf_reader_restore(r, 0, s->n, FKVF_DTYPE_F16, s->rows, (size_t)s->n * ROW_BYTES);
    ck_assert_msg(rc == FKVF_OK, "restore: %s", fkvf_reader_message(r));
    size_t ti;
    fkvf_stream_info si;
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &ti), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_stream_info(r, ti, &si), FKVF_OK);
    s->n_tok = (size_t)si.length;
    s->tok = malloc(s->n_tok * sizeof *s->tok + 1);
    ck_assert_ptr_nonnull(s->tok);
    ck_assert_int_eq(fkvf_reader_stream_read(r, ti, 0, s->tok, s->n_tok), FKVF_OK);
    fkvf_reader_free(r);
}

static void snap_free(snap *s)
{
    free(s->rows);
    free(s->tok);
}

/* dst is one commit (strict, verified) that serves what src served. */
static void expect_compacted(const char *dst, const snap *src, fkvf_reader *cb)
{
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, dst, FKVF_OPEN_STRICT, NULL);
    ck_assert_msg(rc == FKVF_OK, "%s: %s", dst, fkvf_reader_message(r));
    if (cb)
        ck_assert_int_eq(fkvf_reader_attach_codebook(r, cb), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_verify(r), FKVF_OK);
    fkvf_reader_free(r);
    snap s;
    snap_take(dst, cb, &s);
    ck_assert_uint_eq(s.commits, 1);
    ck_assert_uint_eq(s.torn, 0);
    ck_assert_uint_eq(s.n, src->n);
    ck_assert_uint_eq(s.archived, src->archived);
    ck_assert(!memcmp(s.rows, src->rows, (size_t)s.n * ROW_BYTES));
    ck_assert_uint_eq(s.n_tok, src->n_tok);
    ck_assert(!memcmp(s.tok, src->tok, s.n_tok * sizeof *s.tok));
    snap_free(&s);
}

START_TEST(compact_to_new_file)
{
    make_dir();
    char src[128], dst[128], copy[128];
    path_in(src, sizeof src, "a.fkvf");
    path_in(dst, sizeof dst, "c.fkvf");
    path_in(copy, sizeof copy, "orig");
    uint64_t commits, positions;
    build(src, NULL, &commits, &positions);
    size_t n;
    uint8_t *orig = tu_slurp(src, &n);
    tu_write_file(copy, orig, n);
    snap s;
    snap_take(src, NULL, &s);
    ck_assert_uint_eq(s.commits, commits);
    ck_assert_uint_gt(commits, 5);
    ck_assert_uint_gt(s.torn, 0);
    ck_assert_uint_eq(s.n, positions);

    fkvf_compact_options o;
    fkvf_compact_options_init(&o);
    o.no_replace = 1;
    o.sync = FKVF_SYNC_NONE;
    fkvf_archive_op *c = NULL;
    fkvf_compact_result res;
    int rc = fkvf_archive_compact(&c, src, dst, &o, &res);
    fkvf_error_info e;
    ck_assert_int_eq(fkvf_archive_op_error(c, &e), FKVF_OK);
    ck_assert_msg(rc == FKVF_OK, "%s", e.message);
    ck_assert_int_eq(e.code, FKVF_OK);
    ck_assert_str_eq(e.message, "");
    ck_assert_str_eq(res.path, dst);
    ck_assert_uint_eq(res.commits_before, commits);
    ck_assert_uint_eq(res.size_before, n);
    ck_assert_uint_eq(res.torn_bytes, s.torn);
    ck_assert_uint_eq(res.positions, positions);
    ck_assert_uint_eq(res.archived, positions - SINKS - WINDOW);
    ck_assert_uint_eq(res.exact, SINKS + WINDOW);
    ck_assert_uint_eq(res.search_indexes, 0);
    struct stat st;
    ck_assert_int_eq(stat(dst, &st), 0);
    ck_assert_uint_eq(res.size, (uint64_t)st.st_size);
    ck_assert_uint_lt(res.size, n);
    fkvf_archive_op_free(c);
    expect_compacted(dst, &s, NULL);
    ck_assert(same_bytes(src, copy)); /* the input as it was */

    /* without a handle: the same file */
    char dst2[128];
    path_in(dst2, sizeof dst2, "c2.fkvf");
    ck_assert_int_eq(fkvf_archive_compact(NULL, src, dst2, NULL, &res), FKVF_OK);
    ck_assert_ptr_null(res.path);
    ck_assert(same_bytes(dst, dst2));
    /* a compacted file compacts to itself */
    char dst3[128];
    path_in(dst3, sizeof dst3, "c3.fkvf");
    ck_assert_int_eq(fkvf_archive_compact(NULL, dst, dst3, NULL, &res), FKVF_OK);
    ck_assert_uint_eq(res.commits_before, 1);
    ck_assert(same_bytes(dst, dst3));
    ck_assert_int_eq(n_files(), 5);
    free(orig);
    snap_free(&s);
    remove_dir();
}
END_TEST

START_TEST(compact_in_place)
{
    make_dir();
    char src[128], ref[128];
    path_in(src, sizeof src, "a.fkvf");
    path_in(ref, sizeof ref, "ref.fkvf");
    uint64_t commits, positions;
    build(src, NULL, &commits, &positions);
    snap s;
    snap_take(src, NULL, &s);
    ck_assert_int_eq(fkvf_archive_compact(NULL, src, ref, NULL, NULL), FKVF_OK);
    ck_assert_int_eq(chmod(src, 0600), 0);
    fkvf_compact_options o;
    fkvf_compact_options_init(&o);
    o.in_place = 1;
    fkvf_archive_op *c = NULL;
    fkvf_compact_result res;
    int rc = fkvf_archive_compact(&c, src, NULL, &o, &res);
    fkvf_error_info e;
    fkvf_archive_op_error(c, &e);
    ck_assert_msg(rc == FKVF_OK, "%s", e.message);
    ck_assert_uint_eq(res.commits_before, commits);
    ck_assert_uint_gt(res.torn_bytes, 0);
    char *real = realpath(src, NULL);
    ck_assert_str_eq(res.path, real);
    free(real);
    fkvf_archive_op_free(c);
    expect_compacted(src, &s, NULL);
    ck_assert(same_bytes(src, ref));
    struct stat st;
    ck_assert_int_eq(stat(src, &st), 0);
    ck_assert_uint_eq(st.st_mode & 07777, 0600); /* the file keeps its permissions */
    /* dst naming the same file is fine in place; another file is not */
    ck_assert_int_eq(fkvf_archive_compact(NULL, src, src, &o, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_archive_compact(&c, src, ref, &o, NULL), FKVF_E_INVALID_ARG);
    fkvf_archive_op_error(c, &e);
    ck_assert_ptr_nonnull(strstr(e.message, "another file"));
    fkvf_archive_op_free(c);
    ck_assert_int_eq(n_files(), 2);
    snap_free(&s);
    remove_dir();
}
END_TEST

/* In place through a symbolic link: the file it points to is compacted,
 * the link stays a link to it. */
START_TEST(compact_in_place_link)
{
    make_dir();
    char src[128], link[128];
    path_in(src, sizeof src, "target.fkvf");
    path_in(link, sizeof link, "link.fkvf");
    uint64_t commits, positions;
    build(src, NULL, &commits, &positions);
    snap s;
    snap_take(src, NULL, &s);
    ck_assert_int_eq(symlink("target.fkvf", link), 0);
    fkvf_compact_options o;
    fkvf_compact_options_init(&o);
    o.in_place = 1;
    fkvf_archive_op *c = NULL;
    fkvf_compact_result res;
    ck_assert_int_eq(fkvf_archive_compact(&c, link, NULL, &o, &res), FKVF_OK);
    char *real = realpath(src, NULL);
    ck_assert_str_eq(res.path, real);
    free(real);
    fkvf_archive_op_free(c);
    struct stat st;
    ck_assert_int_eq(lstat(link, &st), 0);
    ck_assert(S_ISLNK(st.st_mode));
    expect_compacted(src, &s, NULL);
    snap_free(&s);
    remove_dir();
}
END_TEST

START_TEST(compact_dst_exists)
{
    make_dir();
    char src[128], dst[128];
    path_in(src, sizeof src, "a.fkvf");
    path_in(dst, sizeof dst, "c.fkvf");
    uint64_t commits, positions;
    build(src, NULL, &commits, &positions);
    tu_write_file(dst, "keep me", 7);
    fkvf_compact_options o;
    fkvf_compact_options_init(&o);
    o.no_replace = 1;
    fkvf_archive_op *c = NULL;
    ck_assert_int_eq(fkvf_archive_compact(&c, src, dst, &o, NULL), FKVF_E_EXISTS);
    fkvf_error_info e;
    ck_assert_int_eq(fkvf_archive_op_error(c, &e), FKVF_OK);
    ck_assert_int_eq(e.code, FKVF_E_EXISTS);
    ck_assert_str_eq(e.file, dst);
    ck_assert_ptr_nonnull(strstr(e.message, dst));
    fkvf_archive_op_free(c);
    size_t n;
    uint8_t *p = tu_slurp(dst, &n);
    ck_assert_uint_eq(n, 7);
    ck_assert(!memcmp(p, "keep me", 7));
    free(p);
    ck_assert_int_eq(n_files(), 2); /* no temporary file left */
    /* without no_replace it is replaced */
    snap s;
    snap_take(src, NULL, &s);
    o.no_replace = 0;
    ck_assert_int_eq(fkvf_archive_compact(NULL, src, dst, &o, NULL), FKVF_OK);
    expect_compacted(dst, &s, NULL);
    snap_free(&s);
    /* dst naming src (another spelling) is refused, with or without no_replace */
    char alias[160];
    snprintf(alias, sizeof alias, "%s/./a.fkvf", tmpdir);
    ck_assert_int_eq(fkvf_archive_compact(&c, src, alias, &o, NULL), FKVF_E_INVALID_ARG);
    fkvf_archive_op_error(c, &e);
    ck_assert_ptr_nonnull(strstr(e.message, "same file"));
    fkvf_archive_op_free(c);
    ck_assert_uint_eq(fkvf_archive_compact(NULL, src, NULL, &o, NULL), FKVF_E_INVALID_ARG);
    ck_assert_uint_eq(fkvf_archive_compact(NULL, NULL, dst, &o, NULL), FKVF_E_INVALID_ARG);
    o.sync = 9;
    ck_assert_uint_eq(fkvf_archive_compact(&c, src, dst, &o, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(c);
    remove_dir();
}
END_TEST

START_TEST(compact_src_locked)
{
    make_dir();
    char src[128], dst[128], copy[128];
    path_in(src, sizeof src, "a.fkvf");
    path_in(dst, sizeof dst, "c.fkvf");
    path_in(copy, sizeof copy, "orig");
    uint64_t commits, positions;
    build(src, NULL, &commits, &positions);
    fkvf_append_options ao;
    fkvf_append_options_init(&ao);
    ao.recover = 1;
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, src, &ao, NULL), FKVF_OK); /* cuts the torn tail */
    size_t n;
    uint8_t *orig = tu_slurp(src, &n);
    tu_write_file(copy, orig, n);
    free(orig);
    fkvf_compact_options o;
    fkvf_compact_options_init(&o);
    o.in_place = 1;
    fkvf_archive_op *c = NULL;
    ck_assert_int_eq(fkvf_archive_compact(&c, src, NULL, &o, NULL), FKVF_E_IO);
    fkvf_error_info e;
    ck_assert_int_eq(fkvf_archive_op_error(c, &e), FKVF_OK);
    ck_assert_int_eq(e.code, FKVF_E_IO);
    ck_assert_str_eq(e.file, src);
    ck_assert_ptr_nonnull(e.clause);
    ck_assert_str_eq(e.clause, "7.4");
    ck_assert_uint_eq(e.offset, FKVF_ERROR_NO_OFFSET);
    ck_assert_ptr_nonnull(strstr(e.message, "another appender has it open"));
    fkvf_archive_op_free(c);
    ck_assert(same_bytes(src, copy));
    /* to another file it reads the committed data, lock or not */
    snap s;
    snap_take(src, NULL, &s);
    ck_assert_int_eq(fkvf_archive_compact(NULL, src, dst, NULL, NULL), FKVF_OK);
    expect_compacted(dst, &s, NULL);
    /* the appender gone, in place works */
    fkvf_appender_free(a);
    ck_assert_int_eq(fkvf_archive_compact(NULL, src, NULL, &o, NULL), FKVF_OK);
    expect_compacted(src, &s, NULL);
    snap_free(&s);
    remove_dir();
}
END_TEST

/* Errors of the reader reach the caller with their file and code. */
START_TEST(compact_not_an_archive)
{
    make_dir();
    char src[128], dst[128];
    path_in(src, sizeof src, "junk.fkvf");
    path_in(dst, sizeof dst, "c.fkvf");
    uint8_t junk[256];
    memset(junk, 'j', sizeof junk);
    tu_write_file(src, junk, sizeof junk);
    fkvf_archive_op *c = NULL;
    ck_assert_int_eq(fkvf_archive_compact(&c, src, dst, NULL, NULL), FKVF_E_BAD_MAGIC);
    fkvf_error_info e;
    ck_assert_int_eq(fkvf_archive_op_error(c, &e), FKVF_OK);
    ck_assert_int_eq(e.code, FKVF_E_BAD_MAGIC);
    ck_assert_str_eq(e.file, src);
    ck_assert_uint_eq(e.offset, 0);
    ck_assert_ptr_nonnull(e.clause);
    ck_assert_ptr_nonnull(e.field); /* the reader's field, kept */
    ck_assert_str_eq(e.field, "header.magic");
    /* the file named once, the code once */
    ck_assert_ptr_null(strstr(e.message + strlen(src), src));
    const char *tag = strstr(e.message, "[FKVF_E_BAD_MAGIC]");
    ck_assert_ptr_nonnull(tag);
    ck_assert_ptr_null(strstr(tag + 1, "[FKVF_E_BAD_MAGIC]"));
    fkvf_archive_op_free(c);
    ck_assert_int_eq(access(dst, F_OK), -1);
    /* a missing file */
    path_in(src, sizeof src, "missing.fkvf");
    ck_assert_int_eq(fkvf_archive_compact(&c, src, dst, NULL, NULL), FKVF_E_IO);
    ck_assert_int_eq(fkvf_archive_op_error(c, NULL), FKVF_E_INVALID_ARG); /* out NULL */
    fkvf_archive_op_free(c);
    /* not a handle */
    ck_assert_int_eq(fkvf_archive_op_error(NULL, &e), FKVF_E_STATE);
    ck_assert_int_eq(e.code, FKVF_E_STATE);
    ck_assert_int_eq(fkvf_archive_op_error(NULL, NULL), FKVF_E_INVALID_ARG);
    fkvf_archive_op_free(NULL);
    remove_dir();
}
END_TEST

/* An archive that refers to a codebook file keeps the reference; without
 * the codebook file it is refused. */
START_TEST(compact_external_codebook)
{
    make_dir();
    char src[128], dst[128], cbp[128];
    path_in(src, sizeof src, "a.fkvf");
    path_in(dst, sizeof dst, "c.fkvf");
    path_in(cbp, sizeof cbp, "cb.fkvf");
    build_cb(cbp);
    fkvf_reader *cb = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&cb, cbp, 0, NULL), FKVF_OK);
    uint64_t commits, positions;
    build(src, cb, &commits, &positions);
    snap s;
    snap_take(src, cb, &s);
    fkvf_archive_op *c = NULL;
    ck_assert_int_eq(fkvf_archive_compact(&c, src, dst, NULL, NULL), FKVF_E_CODEBOOK);
    fkvf_error_info e;
    fkvf_archive_op_error(c, &e);
    ck_assert_str_eq(e.file, src);
    fkvf_archive_op_free(c);
    ck_assert_int_eq(access(dst, F_OK), -1);
    fkvf_compact_options o;
    fkvf_compact_options_init(&o);
    o.codebook_file = cb;
    ck_assert_int_eq(fkvf_archive_compact(NULL, src, dst, &o, NULL), FKVF_OK);
    expect_compacted(dst, &s, cb);
    /* the codebook file is an input: never dst */
    ck_assert_int_eq(fkvf_archive_compact(&c, src, cbp, &o, NULL), FKVF_E_INVALID_ARG);
    fkvf_archive_op_free(c);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, dst, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    int ext = 0;
    uint8_t h1[16], h2[16];
    const char *name = NULL;
    ck_assert_int_eq(fkvf_reader_codebook_ref(r, &ext, h1, &name), FKVF_OK);
    ck_assert_int_eq(ext, 1);
    ck_assert_str_eq(name, "cb.fkvf");
    ck_assert_int_eq(fkvf_reader_codebook(cb, NULL, NULL, NULL, h2), FKVF_OK);
    ck_assert(!memcmp(h1, h2, 16));
    fkvf_reader_free(r);
    fkvf_reader_free(cb);
    snap_free(&s);
    remove_dir();
}
END_TEST

/* Search indexes: one rebuilt per stream that had one (two stale ones of
 * the token stream in the input give one). */
/* An archive at src (made in the test directory) with two commits that
 * index its token stream (ZIDX), the second index replacing the first. */
static void build_indexed(const char *src)
{
    uint64_t commits, positions;
    build(src, NULL, &commits, &positions);
    fkvf_append_options ao;
    fkvf_append_options_init(&ao);
    ao.recover = 1;
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, src, &ao, NULL), FKVF_OK); /* cuts the torn tail */
    fkvf_appender_free(a);
    for (int round = 0; round < 2; round++) {
        fkvf_reader *r = NULL;
        ck_assert_int_eq(fkvf_reader_open_file(&r, src, 0, NULL), FKVF_OK);
        size_t ti;
        ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &ti), FKVF_OK);
        void *zd = NULL;
        size_t zn = 0;
        uint64_t zk = 0;
        ck_assert_int_eq(fkvf_search_index_build(r, ti, &zd, &zn, &zk, NULL), FKVF_OK);
        fkvf_reader_free(r);
        fkvf_section_add sec = {FKVF_SECTION_ZPOS, 0, zk, zd, zn};
        ck_assert_int_eq(fkvf_archive_append_sections(NULL, src, &sec, 1, FKVF_SYNC_NONE),
                         FKVF_OK);
        fkvf_search_buffer_free(zd, NULL);
    }
}

START_TEST(compact_rebuilds_search_index)
{
    make_dir();
    char src[128], dst[128];
    path_in(src, sizeof src, "a.fkvf");
    path_in(dst, sizeof dst, "c.fkvf");
    build_indexed(src);
    fkvf_compact_result res;
    ck_assert_int_eq(fkvf_archive_compact(NULL, src, dst, NULL, &res), FKVF_OK);
    ck_assert_uint_eq(res.search_indexes, 1);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, dst, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_verify(r), FKVF_OK);
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    size_t nz = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        ck_assert_int_eq(fkvf_reader_section(r, i, &si), FKVF_OK);
        if (si.type == FKVF_SECTION_ZPOS) {
            nz++;
            ck_assert_uint_eq(si.key, FKVF_STREAM_ID_TOKENS);
        }
    }
    ck_assert_uint_eq(nz, 1);
    fkvf_reader_free(r);
    remove_dir();
}
END_TEST

/* ---- the k-th allocation fails ---------------------------------------------- */

static void alloc_loop(int in_place)
{
    make_dir();
    char src[128], dst[128], copy[128];
    path_in(src, sizeof src, "a.fkvf");
    path_in(dst, sizeof dst, "c.fkvf");
    path_in(copy, sizeof copy, "orig");
    uint64_t commits, positions;
    build(src, NULL, &commits, &positions); /* with its torn tail */
    size_t n;
    uint8_t *orig = tu_slurp(src, &n);
    tu_write_file(copy, orig, n);
    snap s;
    snap_take(src, NULL, &s);
    tu_alloc cnt;
    fkvf_allocator al = tu_alloc_hook(&cnt);
    fkvf_compact_options o;
    fkvf_compact_options_init(&o);
    o.alloc = &al;
    o.in_place = in_place;
    o.sync = FKVF_SYNC_NONE;
    /* the clean run counts the allocations */
    memset(&cnt, 0, sizeof cnt);
    ck_assert_int_eq(fkvf_archive_compact(NULL, src, in_place ? NULL : dst, &o, NULL), FKVF_OK);
    ck_assert_int_eq(cnt.live, 0);
    long total = cnt.calls, absorbed = 0;
    const char *result = in_place ? src : dst;
    expect_compacted(result, &s, NULL);
    for (long k = 1; k <= total; k++) {
        if (in_place)
            tu_write_file(src, orig, n);
        else
            unlink(dst);
        memset(&cnt, 0, sizeof cnt);
        cnt.fail_at = k;
        fkvf_archive_op *c = NULL;
        int rc = fkvf_archive_compact(&c, src, in_place ? NULL : dst, &o, NULL);
        if (rc == FKVF_OK) { /* a failure the library works around (a memo it does without) */
            absorbed++;
            fkvf_archive_op_free(c);
            EXPECTF(cnt.live == 0, "k %ld: %ld blocks leaked", k, cnt.live);
            expect_compacted(result, &s, NULL);
            continue;
        }
        fkvf_error_info e;
        EXPECTF(rc == FKVF_E_NOMEM, "k %ld: %s", k, fkvf_error_name(rc));
        if (c) {
            ck_assert_int_eq(fkvf_archive_op_error(c, &e), FKVF_OK);
            EXPECTF(e.code == FKVF_E_NOMEM && e.message[0], "k %ld: no message", k);
        }
        fkvf_archive_op_free(c);
        EXPECTF(cnt.live == 0, "k %ld: %ld blocks leaked", k, cnt.live);
        EXPECTF(n_files() == 2, "k %ld: %d files (a temporary file left?)", k, n_files());
        EXPECTF(same_bytes(src, copy), "k %ld: the input changed", k);
    }
    ck_assert_int_lt(absorbed, total / 4);
    ck_assert_int_gt(total, 10);
    free(orig);
    snap_free(&s);
    remove_dir();
}

/* The rebuilt search indexes come from the caller's allocator too: some
 * failing allocation is the index build's (fkvf_compact_options.alloc was
 * not passed to fkvf_search_index_build, which then used malloc). */
START_TEST(compact_search_index_caller_allocator)
{
    make_dir();
    char src[128], dst[128];
    path_in(src, sizeof src, "a.fkvf");
    path_in(dst, sizeof dst, "c.fkvf");
    build_indexed(src);
    tu_alloc cnt;
    memset(&cnt, 0, sizeof cnt);
    fkvf_allocator al = tu_alloc_hook(&cnt);
    fkvf_compact_options o;
    fkvf_compact_options_init(&o);
    o.alloc = &al;
    o.sync = FKVF_SYNC_NONE;
    fkvf_compact_result res;
    ck_assert_int_eq(fkvf_archive_compact(NULL, src, dst, &o, &res), FKVF_OK);
    ck_assert_uint_eq(res.search_indexes, 1);
    ck_assert_int_eq(cnt.live, 0);
    long total = cnt.calls, in_index = 0;
    for (long k = 1; k <= total; k++) {
        unlink(dst);
        memset(&cnt, 0, sizeof cnt);
        cnt.fail_at = k;
        fkvf_archive_op *c = NULL;
        int rc = fkvf_archive_compact(&c, src, dst, &o, NULL);
        fkvf_error_info e;
        if (rc == FKVF_E_NOMEM && fkvf_archive_op_error(c, &e) == FKVF_OK &&
            strstr(e.message, "search index"))
            in_index++;
        fkvf_archive_op_free(c);
        EXPECTF(cnt.live == 0, "k %ld: %ld blocks leaked", k, cnt.live);
    }
    ck_assert_int_gt(in_index, 0);
    remove_dir();
}
END_TEST

START_TEST(compact_alloc_every_call) { alloc_loop(0); }
END_TEST

START_TEST(compact_in_place_alloc_every_call) { alloc_loop(1); }
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("compact");
    TCase *t = tcase_create("compact");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, compact_to_new_file);
    tcase_add_test(t, compact_in_place);
    tcase_add_test(t, compact_in_place_link);
    tcase_add_test(t, compact_dst_exists);
    tcase_add_test(t, compact_src_locked);
    tcase_add_test(t, compact_not_an_archive);
    tcase_add_test(t, compact_external_codebook);
    tcase_add_test(t, compact_rebuilds_search_index);
    tcase_add_test(t, compact_search_index_caller_allocator);
    tcase_add_test(t, compact_alloc_every_call);
    tcase_add_test(t, compact_in_place_alloc_every_call);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
