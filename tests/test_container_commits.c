/* Container tests, commits: two commits and torn tails, and an archive growing over several commits of one writer.
 * The archive model and the hand-crafting helpers are in container_model.h.
 *
 * Hot loops use EXPECT (an `if` around ck_abort_msg) instead of ck_assert:
 * Check records the location of every passing ck_assert, which is slow in
 * loops of tens of thousands of iterations. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "codec/codec.h"
#include "common/le.h"
#include "fkvf.h"
#include "format/format.h"
#include "container_model.h"
#include "testutil.h"

/* ==== 9. two commits, torn tails ================================================== */

typedef struct two {
    model m;
    tu_buf b;       /* commit 1 + commit 2 */
    size_t s1;      /* end of commit 1 */
    uint8_t row9[1024];
} two;

/* Commit 2 (hand-built, spec 7.3-7.4): a META that replaces commit 1's and an
 * EXAC that overrides position 9. */
static void build_two(two *t, uint64_t seq2, uint64_t prev_delta)
{
    model_small(&t->m);
    tu_buf c1;
    build(&t->m, &c1);
    t->s1 = c1.size;
    craft c;
    memset(&c, 0, sizeof c);
    c.b = c1; /* take over the bytes */
    mbuild mb;
    memset(&mb, 0, sizeof mb);
    mb_u64(&mb, "commit", 2);
    mb_add(&mb, "note", FKVF_META_UTF8, "second", 6);
    cr_plain(&c, FKVF_SECTION_META, 0, 0, mb.b.data, mb.b.size);
    tu_buf_free(&mb.b);
    ck_assert_uint_le(t->m.row_bytes, sizeof t->row9);
    tu_rng rng = {77};
    for (size_t i = 0; i < t->m.row_bytes; i++)
        t->row9[i] = (uint8_t)tu_next(&rng);
    uint8_t *ex = calloc(1, 64 + t->m.row_bytes);
    fkvf_exac_hdr eh = {9, 1, (uint8_t)t->m.desc.dtype};
    fkvf_exac_hdr_write(ex, &eh);
    memcpy(ex + 64, t->row9, t->m.row_bytes);
    cr_plain(&c, FKVF_SECTION_EXAC, FKVF_SECTION_REQUIRED, 9, ex, 64 + t->m.row_bytes);
    free(ex);
    cr_commit(&c, seq2, t->s1 - 64 - prev_delta, t->m.n_positions, t->m.n_archived);
    t->b = c.b;
}

static void two_free(two *t)
{
    tu_buf_free(&t->b);
    model_free(&t->m);
}

/* Commit 1's contents, as served from a file with a torn tail. */
static void check_commit1(fkvf_reader *r, const two *t, size_t len)
{
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    EXPECT(ai.n_commits == 1);
    EXPECT(ai.file_size == len);
    EXPECT(ai.committed_size == t->s1);
    EXPECTF(ai.torn_bytes == len - t->s1, "torn %llu, len %zu", (unsigned long long)ai.torn_bytes,
            len);
    EXPECT(ai.torn_bytes > 0);
    fkvf_meta_entry e;
    RC_R(r, fkvf_reader_meta_find(r, "run.steps", &e), FKVF_OK);
    EXPECT(e.u64 == UINT64_C(0xFFFFFFFFFFFFFFFA));
    RC_R(r, fkvf_reader_meta_find(r, "commit", &e), FKVF_E_NOT_FOUND);
    const void *row;
    size_t rb;
    OK_R(r, fkvf_reader_exact_row(r, 9, &row, &rb));
    EXPECT(memcmp(row, t->m.rows + 9 * t->m.row_bytes, rb) == 0);
    size_t idx;
    uint32_t out[10];
    OK_R(r, fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &idx));
    OK_R(r, fkvf_reader_stream_read(r, idx, 0, out, 10));
    EXPECT(memcmp(out, model_token_stream((model *)&t->m)->sym, sizeof out) == 0);
}

START_TEST(second_commit_is_served)
{
    two t;
    build_two(&t, 2, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, t.b.data, t.b.size, FKVF_OPEN_STRICT, NULL));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_uint_eq(ai.n_commits, 2);
    ck_assert_uint_eq(ai.committed_size, t.b.size);
    ck_assert_uint_eq(ai.torn_bytes, 0);
    ck_assert_uint_eq(ai.n_sections, model_n_sections(&t.m) + 2);
    /* later META replaces earlier META (spec 7.3) */
    size_t n;
    OK_R(r, fkvf_reader_meta_count(r, &n));
    ck_assert_uint_eq(n, 2);
    fkvf_meta_entry e;
    OK_R(r, fkvf_reader_meta_find(r, "commit", &e));
    ck_assert_uint_eq(e.u64, 2);
    RC_R(r, fkvf_reader_meta_find(r, "run.steps", &e), FKVF_E_NOT_FOUND);
    /* the latest EXAC covering a position wins */
    const void *row;
    size_t rb;
    OK_R(r, fkvf_reader_exact_row(r, 9, &row, &rb));
    ck_assert(memcmp(row, t.row9, rb) == 0);
    OK_R(r, fkvf_reader_exact_row(r, 8, &row, &rb));
    ck_assert(memcmp(row, t.m.rows + 8 * t.m.row_bytes, rb) == 0);
    /* streams and descriptor from commit 1 */
    check_desc(r, &t.m.desc);
    for (size_t i = 0; i < t.m.n_st; i++)
        check_stream(r, &t.m.st[i], i);
    /* sections carry their commit */
    fkvf_section_info si;
    OK_R(r, fkvf_reader_section(r, ai.n_sections - 1, &si));
    ck_assert_uint_eq(si.commit_seq, 2);
    ck_assert_uint_ge(si.offset, t.s1);
    OK_R(r, fkvf_reader_section(r, 0, &si));
    ck_assert_uint_eq(si.commit_seq, 1);
    check_sections(r, t.b.data, t.b.size);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    two_free(&t);
}
END_TEST

START_TEST(torn_second_commit_falls_back_to_first)
{
    two t;
    build_two(&t, 2, 0);
    size_t total = t.b.size;
    ck_assert_uint_gt(total - t.s1, 3 * 64);
    for (size_t len = t.s1 + 1; len < total; len++) {
        uint8_t *c = malloc(len);
        memcpy(c, t.b.data, len);
        fkvf_reader *r = NULL;
        RC_R(r, fkvf_reader_open_memory(&r, c, len, 0, NULL), FKVF_OK);
        check_commit1(r, &t, len);
        RC_R(r, fkvf_reader_verify(r), FKVF_E_TORN);
        EXPECT(strstr(fkvf_reader_message(r), "torn") != NULL);
        fkvf_reader_free(r);
        r = NULL;
        int rc = fkvf_reader_open_memory(&r, c, len, FKVF_OPEN_STRICT, NULL);
        EXPECTF(rc == FKVF_E_TORN, "strict, length %zu: %s", len, fkvf_error_name(rc));
        EXPECT(r != NULL && strlen(fkvf_reader_message(r)) > 0);
        fkvf_reader_free(r);
        free(c);
    }
    /* exactly commit 1: clean */
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, t.b.data, t.s1, FKVF_OPEN_STRICT, NULL));
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    /* garbage appended to the complete file: commit 2 with a torn tail */
    uint8_t *g = calloc(1, total + 100);
    memcpy(g, t.b.data, total);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, g, total + 100, 0, NULL));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_uint_eq(ai.n_commits, 2);
    ck_assert_uint_eq(ai.torn_bytes, 100);
    RC_R(r, fkvf_reader_verify(r), FKVF_E_TORN);
    fkvf_reader_free(r);
    free(g);
    two_free(&t);
}
END_TEST

START_TEST(damaged_second_commit_falls_back_to_first)
{
    /* commit 2 is complete but its trailer, directory or a section is
     * damaged: the reader serves commit 1 and reports the rest as torn */
    two t;
    build_two(&t, 2, 0);
    size_t total = t.b.size;
    layout l = layout_of(t.b.data, total);
    uint64_t spots[] = {l.trailer_off + 3, l.trailer_off + 60, l.dir_off + 70};
    for (size_t i = 0; i < 3; i++) {
        t.b.data[spots[i]] ^= 4;
        fkvf_reader *r = NULL;
        OK_R(r, fkvf_reader_open_memory(&r, t.b.data, total, 0, NULL));
        check_commit1(r, &t, total);
        fkvf_reader_free(r);
        r = NULL;
        RC_R(r, fkvf_reader_open_memory(&r, t.b.data, total, FKVF_OPEN_STRICT, NULL), FKVF_E_TORN);
        fkvf_reader_free(r);
        t.b.data[spots[i]] ^= 4;
    }
    two_free(&t);
}
END_TEST

START_TEST(broken_chain_is_not_trusted)
{
    /* commit_seq 3 after 1: the chain is broken. The last 64 bytes are a
     * valid trailer, so the file is clean and rejected with CHAIN; commit 1
     * is not served (spec 7.2 rule 1) */
    two t;
    build_two(&t, 3, 0);
    fkvf_reader *r = NULL;
    RC_R(r, fkvf_reader_open_memory(&r, t.b.data, t.b.size, 0, NULL), FKVF_E_CHAIN);
    ck_assert(strstr(fkvf_reader_message(r), "commit_seq") != NULL);
    fkvf_reader_free(r);
    r = NULL;
    RC_R(r, fkvf_reader_open_memory(&r, t.b.data, t.b.size, FKVF_OPEN_STRICT, NULL),
         FKVF_E_CHAIN);
    ck_assert(strstr(fkvf_reader_message(r), "commit") != NULL);
    fkvf_reader_free(r);
    /* and the same file with a torn tail: candidates whose chain is broken
     * are skipped, commit 1 is served with the rest as torn */
    uint8_t *g = calloc(1, t.b.size + 64);
    memcpy(g, t.b.data, t.b.size);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, g, t.b.size + 64, 0, NULL));
    check_commit1(r, &t, t.b.size + 64);
    fkvf_reader_free(r);
    free(g);
    two_free(&t);
    /* prev_trailer pointing 64 bytes before commit 1's trailer */
    build_two(&t, 2, 64);
    r = NULL;
    RC_R(r, fkvf_reader_open_memory(&r, t.b.data, t.b.size, 0, NULL), FKVF_E_CHAIN);
    ck_assert(strstr(fkvf_reader_message(r), "earlier trailer") != NULL);
    fkvf_reader_free(r);
    two_free(&t);
}
END_TEST

/* Spec 7.2 rule 1: the last 64 bytes are a valid trailer, so the file is
 * clean; damage to an earlier commit is CHAIN and nothing is served. */
START_TEST(clean_file_with_damaged_earlier_commit_is_chain)
{
    two t;
    build_two(&t, 2, 0);
    layout l1 = layout_of(t.b.data, t.s1); /* commit 1 */
    static const struct {
        int rel; /* 0 trailer, 1 directory */
        uint64_t at;
        const char *needle;
    } spots[] = {{0, 0, "TRUNCATED"}, {0, 20, "CHECKSUM"}, {0, 60, "CHECKSUM"},
                 {1, 0, "CHECKSUM"},  {1, 70, "CHECKSUM"}};
    for (size_t i = 0; i < sizeof spots / sizeof spots[0]; i++) {
        uint64_t at = (spots[i].rel ? l1.dir_off : l1.trailer_off) + spots[i].at;
        t.b.data[at] ^= 0x40;
        for (int strict = 0; strict < 2; strict++) {
            char msg[600];
            int rc = try_open(t.b.data, t.b.size, strict ? FKVF_OPEN_STRICT : 0, msg,
                              sizeof msg);
            ck_assert_msg(rc == FKVF_E_CHAIN, "spot %zu strict %d: %s (%s)", i, strict,
                          fkvf_error_name(rc), msg);
            ck_assert_msg(strstr(msg, "earlier trailer") != NULL, "%s", msg);
            ck_assert_msg(strstr(msg, spots[i].needle) != NULL, "%s", msg);
        }
        t.b.data[at] ^= 0x40;
    }
    /* undamaged: both commits */
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, t.b.data, t.b.size, FKVF_OPEN_STRICT, NULL));
    fkvf_reader_free(r);
    two_free(&t);
}
END_TEST

/* ==== 9b. a growing archive: several commits of one writer ======================= */

/* Three commits of fkvf_writer_commit / finish (spec 7.6, 11.6): every
 * commit archives more positions (index segments from the last aligned
 * boundary at or below the old length, re-writing the partial tail), extends
 * the token stream, and adds EXAC rows for its new exact positions. The
 * symbols a commit writes past the next commit's cut point differ from the
 * final ones (alt), so a cut that did not take effect shows. */
#define G_COMMITS 3
typedef struct growth {
    model m;                     /* final state: streams of A[2] / P[2] symbols */
    uint64_t P[G_COMMITS], A[G_COMMITS];
    uint64_t fi[G_COMMITS], ft[G_COMMITS]; /* first_symbol of each commit's segments */
    uint64_t exf[G_COMMITS], exn[G_COMMITS]; /* the tail EXAC of each commit */
    uint8_t row1[1024];          /* commit 3 overrides sink position 1 */
    tu_buf b;
    size_t end[G_COMMITS];       /* file length after each commit */
} growth;

static uint32_t g_alt(const growth *g, size_t j, uint32_t v)
{
    const tstream *s = &g->m.st[j];
    uint64_t range = spec_range(&s->spec);
    if (j < model_n_index(&g->m) && range > g->m.cbs.k)
        range = g->m.cbs.k;
    return (uint32_t)((v + 1) % range);
}

/* Symbol t of stream j as commit c (0-based) leaves it. */
static uint32_t g_sym(const growth *g, size_t c, size_t j, uint64_t t)
{
    int idx = j < model_n_index(&g->m);
    uint64_t next = c + 1 < G_COMMITS ? (idx ? g->fi[c + 1] : g->ft[c + 1]) : UINT64_MAX;
    uint32_t v = g->m.st[j].sym[t];
    return t >= next ? g_alt(g, j, v) : v;
}

static uint64_t g_len(const growth *g, size_t c, size_t j)
{
    return j < model_n_index(&g->m) ? g->A[c] : g->P[c];
}

/* The row of exact position p as commit c leaves it. */
static const uint8_t *g_row(const growth *g, size_t c, uint64_t p)
{
    if (p == 1 && c == 2)
        return g->row1;
    return g->m.rows + p * g->m.row_bytes;
}

/* Commit c's segments: stream symbols [f, len) as this commit writes them. */
static int g_write_segments(const growth *g, fkvf_writer *w, size_t c)
{
    const model *m = &g->m;
    size_t ni = model_n_index(m);
    uint64_t f = g->fi[c], n = g->A[c] - f;
    uint16_t *codes = calloc((size_t)(n * ni) + 1, sizeof *codes);
    ck_assert_ptr_nonnull(codes);
    for (size_t j = 0; j < ni; j++)
        for (uint64_t i = 0; i < n; i++)
            codes[i * ni + j] = (uint16_t)g_sym(g, c, j, f + i);
    int rc = fkvf_writer_add_index_segment(w, &m->ispec, f, n, codes, ni, 1);
    free(codes);
    if (rc)
        return rc;
    f = g->ft[c];
    n = g->P[c] - f;
    uint32_t *tok = calloc((size_t)n + 1, sizeof *tok);
    ck_assert_ptr_nonnull(tok);
    for (uint64_t i = 0; i < n; i++)
        tok[i] = g_sym(g, c, ni, f + i);
    rc = fkvf_writer_add_token_segment(w, &m->tspec, f, tok, (size_t)n);
    free(tok);
    return rc;
}

/* A growing archive whose index group has codec ix and token stream tk. */
static void build_growth(growth *g, const codec_choice *ix, const codec_choice *tk)
{
    memset(g, 0, sizeof *g);
    model *m = &g->m;
    fkvf_writer_options_init(&m->opts);
    m->opts.required_features = FKVF_FEAT_NGON;
    m->opts.optional_features = FKVF_OPTFEAT_TOKEN_STREAM;
    m->opts.sync = FKVF_SYNC_NONE;
    m->opts.block_size = 128;
    fkvf_desc *d = &m->desc;
    d->n_layers = 2;
    d->n_kv_heads = 2;
    d->key_dim = 4;
    d->value_dim = 4;
    d->dtype = FKVF_DTYPE_F16;
    d->n_sinks = 2;
    d->window = 30;
    d->model_id = "grow";
    static const uint64_t P[G_COMMITS] = {110, 180, 300}, A[G_COMMITS] = {100, 150, 270};
    memcpy(g->P, P, sizeof P);
    memcpy(g->A, A, sizeof A);
    m->n_positions = P[2];
    m->n_archived = A[2];
    model_rows(m, 70);
    model_codebook(m, 64, 2, 1, FKVF_DTYPE_F16, 0, 71);
    model_index(m, ix->profile, ix->bits, ix->alphabet, 72);
    model_tokens(m, tk->profile, tk->bits, tk->alphabet, 73);
    uint32_t ui = fkvf_stream_spec_align(&m->ispec), ut = fkvf_stream_spec_align(&m->tspec);
    ck_assert_uint_gt(ui, 0);
    ck_assert_uint_gt(ut, 0);
    for (size_t c = 1; c < G_COMMITS; c++) {
        /* the last aligned boundary at or below the old length */
        g->fi[c] = A[c - 1] / ui * ui;
        g->ft[c] = P[c - 1] / ut * ut;
    }
    /* the tail EXAC of each commit; commit 2's starts 4 rows early (rows of
     * positions that are archived: allowed and ignored, spec 14.3) */
    g->exf[0] = 2 + A[0];
    g->exf[1] = 2 + A[1] - 4;
    g->exf[2] = 2 + A[2];
    for (size_t c = 0; c < G_COMMITS; c++)
        g->exn[c] = P[c] - g->exf[c];
    tu_rng rng = {74};
    ck_assert_uint_le(m->row_bytes, sizeof g->row1);
    for (size_t i = 0; i < m->row_bytes; i++)
        g->row1[i] = (uint8_t)tu_next(&rng);

    fkvf_sink sink = tu_buf_sink(&g->b);
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_sink(&w, &sink, &m->opts, NULL));
    OK_W(w, fkvf_writer_set_desc(w, &m->desc));
    OK_W(w, fkvf_writer_add_codebooks(w, &m->cbs, m->cb_tables, m->cb_tables_size, 0));
    OK_W(w, write_meta(w));
    OK_W(w, fkvf_writer_add_exact(w, 0, 2, m->rows, 2 * m->row_bytes, 0));
    for (size_t c = 0; c < G_COMMITS; c++) {
        if (c == 1)
            OK_W(w, fkvf_writer_meta_u64(w, "commit", 2));
        if (c == 2)
            OK_W(w, fkvf_writer_add_exact(w, 1, 1, g->row1, m->row_bytes, 0));
        OK_W(w, fkvf_writer_add_exact(w, g->exf[c], g->exn[c],
                                      m->rows + g->exf[c] * m->row_bytes,
                                      (size_t)(g->exn[c] * m->row_bytes), 0));
        OK_W(w, g_write_segments(g, w, c));
        OK_W(w, fkvf_writer_set_positions(w, g->P[c], g->A[c]));
        if (c + 1 < G_COMMITS)
            OK_W(w, fkvf_writer_commit(w));
        else
            OK_W(w, fkvf_writer_finish(w));
        g->end[c] = g->b.size;
        ck_assert_uint_eq(g->end[c] % 64, 0);
    }
    fkvf_writer_free(w);
}

static void growth_free(growth *g)
{
    tu_buf_free(&g->b);
    model_free(&g->m);
}

/* Data bytes of stream j in the segments of commits 0..c that remain. */
static uint64_t g_stored(const growth *g, size_t c, size_t j)
{
    int idx = j < model_n_index(&g->m);
    const fkvf_stream_spec *sp = idx ? &g->m.ispec : &g->m.tspec;
    uint64_t sum = 0;
    for (size_t k = 0; k <= c; k++) {
        uint64_t f = idx ? g->fi[k] : g->ft[k];
        uint64_t len = idx ? g->A[k] : g->P[k];
        /* a segment is dropped when a later one of commits <= c starts at or before it */
        int dropped = 0;
        for (size_t l = k + 1; l <= c; l++)
            dropped |= (idx ? g->fi[l] : g->ft[l]) <= f;
        if (!dropped)
            sum += stream_bytes_of(sp, len - f);
    }
    return sum;
}

static size_t g_segments(const growth *g, size_t c, size_t j)
{
    int idx = j < model_n_index(&g->m);
    size_t n = 0;
    for (size_t k = 0; k <= c; k++) {
        int dropped = 0;
        for (size_t l = k + 1; l <= c; l++)
            dropped |= (idx ? g->fi[l] : g->ft[l]) <= (idx ? g->fi[k] : g->ft[k]);
        n += !dropped;
    }
    return n;
}

/* Everything the reader serves equals commit c of the model; `full` also
 * checks points, every read path and the info of every stream. */
static void check_growth(fkvf_reader *r, const growth *g, size_t c, int full)
{
    const model *m = &g->m;
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    EXPECT(ai.n_commits == c + 1);
    EXPECT(ai.committed_size == g->end[c]);
    EXPECT(ai.n_positions == g->P[c] && ai.n_archived == g->A[c]);
    EXPECT(ai.n_streams == m->n_st);
    uint32_t out[400];
    for (size_t j = 0; j < m->n_st; j++) {
        uint64_t len = g_len(g, c, j);
        fkvf_stream_info si;
        OK_R(r, fkvf_reader_stream_info(r, j, &si));
        EXPECT(si.id == m->st[j].id);
        EXPECTF(si.length == len, "commit %zu stream %zu: length %llu, want %llu", c + 1, j,
                (unsigned long long)si.length, (unsigned long long)len);
        EXPECTF(si.n_segments == g_segments(g, c, j), "commit %zu stream %zu: %zu segments",
                c + 1, j, si.n_segments);
        EXPECTF(si.stored_bytes == g_stored(g, c, j), "commit %zu stream %zu: %llu bytes",
                c + 1, j, (unsigned long long)si.stored_bytes);
        ck_assert_uint_le(len, 400);
        OK_R(r, fkvf_reader_stream_read(r, j, 0, out, (size_t)len));
        for (uint64_t t = 0; t < len; t++)
            EXPECTF(out[t] == g_sym(g, c, j, t), "commit %zu stream %zu symbol %llu: %u, want %u",
                    c + 1, j, (unsigned long long)t, out[t], g_sym(g, c, j, t));
        uint32_t s1;
        RC_R(r, fkvf_reader_stream_get(r, j, len, &s1), FKVF_E_RANGE);
    }
    for (uint64_t p = 0; p < g->P[c]; p++) {
        int want = p < 2 || p >= 2 + g->A[c], is = -1;
        OK_R(r, fkvf_reader_is_exact(r, p, &is));
        EXPECTF(is == want, "commit %zu: is_exact(%llu) = %d", c + 1, (unsigned long long)p, is);
        if (!want)
            continue;
        const void *row;
        size_t rb;
        OK_R(r, fkvf_reader_exact_row(r, p, &row, &rb));
        EXPECTF(rb == m->row_bytes && memcmp(row, g_row(g, c, p), rb) == 0,
                "commit %zu: row %llu differs", c + 1, (unsigned long long)p);
    }
    fkvf_meta_entry e;
    RC_R(r, fkvf_reader_meta_find(r, "commit", &e), c >= 1 ? FKVF_OK : FKVF_E_NOT_FOUND);
    RC_R(r, fkvf_reader_meta_find(r, "run.steps", &e), c >= 1 ? FKVF_E_NOT_FOUND : FKVF_OK);
    if (full) {
        /* every symbol, point and path against the model (check_stream_seg) */
        for (size_t j = 0; j < m->n_st; j++) {
            tstream ts = m->st[j];
            ts.n = (size_t)g_len(g, c, j);
            ts.sym = calloc(ts.n + 1, sizeof *ts.sym);
            ck_assert_ptr_nonnull(ts.sym);
            for (size_t t = 0; t < ts.n; t++)
                ts.sym[t] = g_sym(g, c, j, t);
            check_stream_seg(r, &ts, 500 + j, g_segments(g, c, j), g_stored(g, c, j));
            free(ts.sym);
        }
    }
}

static const codec_choice g_codecs[][2] = {
    {{FKVF_PROFILE_QUAD, 6, 0}, {FKVF_PROFILE_QUAD, 32, 0}},  /* units 64 and 4 */
    {{FKVF_PROFILE_NGON, 0, 64}, {FKVF_PROFILE_NGON, 0, 300}}, /* units L */
    {{FKVF_PROFILE_QUAD, 8, 0}, {FKVF_PROFILE_QUAD, 10, 0}},  /* units 16 and 64 */
};

START_TEST(three_commits_grow_the_streams)
{
    growth g;
    build_growth(&g, &g_codecs[_i][0], &g_codecs[_i][1]);
    const model *m = &g.m;
    /* commit 2 and 3 segments start below the old lengths (the tail is
     * re-written), except where the old length is aligned */
    ck_assert_uint_lt(g.fi[1], g.A[0]);
    ck_assert_uint_lt(g.fi[2], g.A[1]);
    /* the trailers chain (spec 6, 7.4) */
    for (size_t c = 0; c < G_COMMITS; c++) {
        const uint8_t *t = g.b.data + g.end[c] - 64;
        ck_assert_uint_eq(fkvf_ld64(t + 8), c + 1);
        ck_assert_uint_eq(fkvf_ld64(t + 40), c ? g.end[c - 1] - 64 : 0);
        ck_assert_uint_eq(fkvf_ld64(t + 48), g.end[c]);
    }
    /* every commit, served from its prefix of the file (clean, strict) */
    for (size_t c = 0; c < G_COMMITS; c++) {
        fkvf_reader *r = NULL;
        OK_R(r, fkvf_reader_open_memory(&r, g.b.data, g.end[c], FKVF_OPEN_STRICT, NULL));
        check_growth(r, &g, c, 1);
        OK_R(r, fkvf_reader_verify(r));
        fkvf_reader_free(r);
    }
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, g.b.data, g.b.size, 0, NULL));
    /* sections carry their commits; each commit holds one segment per group */
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    size_t strm[G_COMMITS] = {0}, vtxs = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        OK_R(r, fkvf_reader_section(r, i, &si));
        ck_assert_uint_ge(si.commit_seq, 1);
        ck_assert_uint_le(si.commit_seq, G_COMMITS);
        ck_assert_uint_ge(si.offset, si.commit_seq > 1 ? g.end[si.commit_seq - 2] : 64);
        ck_assert_uint_lt(si.offset, g.end[si.commit_seq - 1]);
        if (si.type == FKVF_SECTION_STRM)
            strm[si.commit_seq - 1]++;
        vtxs += si.type == FKVF_SECTION_VTXS;
    }
    for (size_t c = 0; c < G_COMMITS; c++)
        ck_assert_uint_eq(strm[c], 2);
    /* a vertex table once per N, in commit 1 */
    ck_assert_uint_eq(vtxs, m->ispec.profile == FKVF_PROFILE_NGON ? 2 : 0);
    check_sections(r, g.b.data, g.b.size);
    fkvf_reader_free(r);
    growth_free(&g);
}
END_TEST

/* A truncation at every byte inside the last commit serves commit 2,
 * bit-identically to the file that ends there; strict open is TORN. */
START_TEST(torn_third_commit_serves_the_second)
{
    growth g;
    build_growth(&g, &g_codecs[_i][0], &g_codecs[_i][1]);
    size_t e2 = g.end[1], e3 = g.end[2];
    ck_assert_uint_gt(e3 - e2, 1024);
    /* what commit 2 serves: its sections' bytes */
    fkvf_reader *r2 = NULL;
    OK_R(r2, fkvf_reader_open_memory(&r2, g.b.data, e2, FKVF_OPEN_STRICT, NULL));
    fkvf_archive_info a2;
    OK_R(r2, fkvf_reader_info(r2, &a2));
    for (size_t len = e2 + 1; len < e3; len++) {
        uint8_t *c = malloc(len);
        ck_assert_ptr_nonnull(c);
        memcpy(c, g.b.data, len);
        fkvf_reader *r = NULL;
        RC_R(r, fkvf_reader_open_memory(&r, c, len, 0, NULL), FKVF_OK);
        fkvf_archive_info ai;
        OK_R(r, fkvf_reader_info(r, &ai));
        EXPECTF(ai.torn_bytes == len - e2, "length %zu: torn %llu", len,
                (unsigned long long)ai.torn_bytes);
        EXPECT(ai.file_size == len);
        EXPECT(ai.n_sections == a2.n_sections);
        check_growth(r, &g, 1, len == e3 - 1);
        for (size_t i = 0; i < ai.n_sections; i++) {
            fkvf_section_info s, s2;
            OK_R(r, fkvf_reader_section(r, i, &s));
            OK_R(r2, fkvf_reader_section(r2, i, &s2));
            EXPECT(memcmp(&s, &s2, sizeof s) == 0);
            const void *p, *p2;
            size_t n, n2;
            OK_R(r, fkvf_reader_section_data(r, i, &p, &n));
            OK_R(r2, fkvf_reader_section_data(r2, i, &p2, &n2));
            EXPECT(n == n2 && memcmp(p, p2, n) == 0);
        }
        RC_R(r, fkvf_reader_verify(r), FKVF_E_TORN);
        fkvf_reader_free(r);
        r = NULL;
        int rc = fkvf_reader_open_memory(&r, c, len, FKVF_OPEN_STRICT, NULL);
        EXPECTF(rc == FKVF_E_TORN, "strict, length %zu: %s", len, fkvf_error_name(rc));
        fkvf_reader_free(r);
        free(c);
    }
    fkvf_reader_free(r2);
    growth_free(&g);
}
END_TEST

START_TEST(writer_refuses_bad_later_commits)
{
    growth g;
    build_growth(&g, &g_codecs[0][0], &g_codecs[0][1]); /* quad 6: unit 64 */
    model *m = &g.m;
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m->opts);
    OK_W(w, fkvf_writer_set_desc(w, &m->desc));
    OK_W(w, fkvf_writer_add_codebooks(w, &m->cbs, m->cb_tables, m->cb_tables_size, 0));
    OK_W(w, write_meta(w));
    OK_W(w, fkvf_writer_add_exact(w, 0, 2, m->rows, 2 * m->row_bytes, 0));
    OK_W(w, fkvf_writer_add_exact(w, g.exf[0], g.exn[0], m->rows + g.exf[0] * m->row_bytes,
                                  (size_t)(g.exn[0] * m->row_bytes), 0));
    OK_W(w, g_write_segments(&g, w, 0));
    OK_W(w, fkvf_writer_set_positions(w, g.P[0], g.A[0]));
    OK_W(w, fkvf_writer_commit(w));
    size_t end1 = b.size;
    /* the descriptor belongs in commit 1; the codebook cannot be replaced */
    RC_W(w, fkvf_writer_set_desc(w, &m->desc), FKVF_E_STATE);
    assert_msg_names(w, "already set");
    RC_W(w, fkvf_writer_add_codebooks(w, &m->cbs, m->cb_tables, m->cb_tables_size, 0),
         FKVF_E_STATE);
    size_t ni = model_n_index(m);
    uint16_t *codes = model_codes(m, 0, 100, &(size_t){0}, &(size_t){0});
    /* first_symbol not a multiple of 64 (100 is the old length) */
    RC_W(w, fkvf_writer_add_index_segment(w, &m->ispec, 100, 10, codes, ni, 1),
         FKVF_E_INVALID_ARG);
    assert_msg_names(w, "multiple of 64");
    RC_W(w, fkvf_writer_add_index_segment(w, &m->ispec, 32, 10, codes, ni, 1),
         FKVF_E_INVALID_ARG);
    /* beyond the old length */
    RC_W(w, fkvf_writer_add_index_segment(w, &m->ispec, 128, 10, codes, ni, 1),
         FKVF_E_INVALID_ARG);
    assert_msg_names(w, "at most their length 100");
    /* another codec than commit 1's: quad 8, quad 4 (64 symbols fit), ngon */
    fkvf_stream_spec other = mkspec(FKVF_PROFILE_QUAD, 8, 0);
    RC_W(w, fkvf_writer_add_index_segment(w, &other, 64, 10, codes, ni, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "codec differs");
    other = mkspec(FKVF_PROFILE_NGON, 0, 64);
    RC_W(w, fkvf_writer_add_index_segment(w, &other, 0, 10, codes, ni, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "codec differs");
    other = mkspec(FKVF_PROFILE_QUAD, 16, 0);
    RC_W(w, fkvf_writer_add_token_segment(w, &other, 108, model_token_stream(m)->sym, 2),
         FKVF_E_INVALID_ARG);
    assert_msg_names(w, "token stream: codec differs");
    uint32_t tk[4] = {1, 2, 3, 4};
    RC_W(w, fkvf_writer_add_token_segment(w, &m->tspec, 110, tk, 4), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "multiple of 4");
    RC_W(w, fkvf_writer_add_token_segment(w, &m->tspec, 112, tk, 4), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "at most their length 110");
    /* n_archived grown without index symbols: the commit is refused */
    OK_W(w, fkvf_writer_set_positions(w, g.P[0], g.A[0] + 1));
    RC_W(w, fkvf_writer_commit(w), FKVF_E_STATE);
    assert_msg_names(w, "index streams have 100 symbols, need 101");
    OK_W(w, fkvf_writer_set_positions(w, g.P[0], g.A[0]));
    /* refused calls wrote nothing: a commit of nothing new, then finish adds
     * no third commit */
    OK_W(w, fkvf_writer_commit(w));
    size_t end2 = b.size;
    ck_assert_uint_eq(end2 - end1, 128); /* an empty directory and a trailer */
    OK_W(w, fkvf_writer_finish(w));
    ck_assert_uint_eq(b.size, end2);
    RC_W(w, fkvf_writer_commit(w), FKVF_E_STATE);
    fkvf_writer_free(w);
    free(codes);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_uint_eq(ai.n_commits, 2);
    ck_assert_uint_eq(ai.n_archived, g.A[0]);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);
    /* a codebook file's first commit, then a descriptor: too late (spec 8.3) */
    w = new_writer(&b, &m->opts);
    OK_W(w, fkvf_writer_add_codebooks(w, &m->cbs, m->cb_tables, m->cb_tables_size, 0));
    OK_W(w, fkvf_writer_commit(w));
    RC_W(w, fkvf_writer_set_desc(w, &m->desc), FKVF_E_STATE);
    assert_msg_names(w, "belongs in commit 1");
    RC_W(w, write_index_segment(m, w, 0, 5), FKVF_E_STATE);
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL));
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_uint_eq(ai.n_commits, 1);
    ck_assert_int_eq(ai.has_desc, 0);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    growth_free(&g);
}
END_TEST

/* A file writer's commits reach the final path at finish (spec 7.6: the
 * temporary file is renamed into place), with the same bytes as a sink. */
START_TEST(file_writer_commits_appear_at_finish)
{
    growth g;
    build_growth(&g, &g_codecs[1][0], &g_codecs[1][1]);
    model *m = &g.m;
    char *dir = make_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/grow.fkvf", dir);
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_file(&w, path, &m->opts, NULL));
    OK_W(w, fkvf_writer_set_desc(w, &m->desc));
    OK_W(w, fkvf_writer_add_codebooks(w, &m->cbs, m->cb_tables, m->cb_tables_size, 0));
    OK_W(w, write_meta(w));
    OK_W(w, fkvf_writer_add_exact(w, 0, 2, m->rows, 2 * m->row_bytes, 0));
    for (size_t c = 0; c < G_COMMITS; c++) {
        if (c == 1)
            OK_W(w, fkvf_writer_meta_u64(w, "commit", 2));
        if (c == 2)
            OK_W(w, fkvf_writer_add_exact(w, 1, 1, g.row1, m->row_bytes, 0));
        OK_W(w, fkvf_writer_add_exact(w, g.exf[c], g.exn[c], m->rows + g.exf[c] * m->row_bytes,
                                      (size_t)(g.exn[c] * m->row_bytes), 0));
        OK_W(w, g_write_segments(&g, w, c));
        OK_W(w, fkvf_writer_set_positions(w, g.P[c], g.A[c]));
        OK_W(w, fkvf_writer_commit(w));
        ck_assert(!path_exists(path));
        ck_assert_uint_eq(dir_entries(dir), 1); /* the temporary file */
    }
    OK_W(w, fkvf_writer_finish(w)); /* nothing new: no fourth commit */
    fkvf_writer_free(w);
    ck_assert_uint_eq(dir_entries(dir), 1);
    size_t size;
    uint8_t *bytes = tu_slurp(path, &size);
    ck_assert_uint_eq(size, g.b.size);
    ck_assert(memcmp(bytes, g.b.data, size) == 0);
    free(bytes);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL));
    check_growth(r, &g, 2, 1);
    fkvf_reader_free(r);
    rm_tmpdir(dir);
    growth_free(&g);
}
END_TEST

/* Crafted later segments that break spec 11.6 (the reader's side): commit 2
 * of a valid file with a segment of another codec, another stage split, a
 * misaligned or too-late first_symbol. */
START_TEST(later_segment_rules)
{
    growth g;
    build_growth(&g, &g_codecs[2][0], &g_codecs[2][1]); /* quad 8 index (unit 16), quad 10 tokens */
    size_t e1 = g.end[0];
    const uint8_t *b = g.b.data;
    struct {
        uint64_t group;
        int field; /* 0 bits, 1 stages, 2 first_symbol */
        uint64_t v;
        int want;
        const char *needle;
    } cases[] = {
        {FKVF_STREAM_GROUP_INDEX, 2, 96, FKVF_OK, ""},        /* valid: 96 = 6 x 16 <= 100 */
        {FKVF_STREAM_GROUP_INDEX, 2, 100, FKVF_E_CORRUPT, "alignment unit 16"},
        {FKVF_STREAM_GROUP_INDEX, 2, 112, FKVF_E_CORRUPT, "beyond the streams' length 100"},
        {FKVF_STREAM_GROUP_INDEX, 0, 6, FKVF_E_CORRUPT, "differ from the group's earlier"},
        {FKVF_STREAM_GROUP_INDEX, 1, 0, FKVF_E_CORRUPT, "differ from the group's earlier"},
        {FKVF_STREAM_GROUP_TOKENS, 2, 64, FKVF_OK, ""},
        {FKVF_STREAM_GROUP_TOKENS, 2, 96, FKVF_E_CORRUPT, "alignment unit 64"},
        {FKVF_STREAM_GROUP_TOKENS, 2, 128, FKVF_E_CORRUPT, "beyond"},
        {FKVF_STREAM_GROUP_TOKENS, 0, 12, FKVF_E_CORRUPT, "differ"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        craft c;
        cr_append(&c, b, e1);
        /* the index and token segments of commit 1, re-made */
        size_t ki = SIZE_MAX, kt = SIZE_MAX;
        {
            fkvf_reader *r = NULL;
            OK_R(r, fkvf_reader_open_memory(&r, b, e1, 0, NULL));
            ki = find_section(r, FKVF_SECTION_STRM, FKVF_STREAM_GROUP_INDEX, NULL);
            kt = find_section(r, FKVF_SECTION_STRM, FKVF_STREAM_GROUP_TOKENS, NULL);
            fkvf_section_info si;
            OK_R(r, fkvf_reader_section(r, cases[i].group ? kt : ki, &si));
            fkvf_reader_free(r);
            fkvf_strm_hdr h = strm_hdr_at(b + si.offset);
            uint64_t f = cases[i].field == 2 ? cases[i].v : h.first_symbol;
            if (cases[i].field == 0)
                h.bits = (uint8_t)cases[i].v;
            if (cases[i].field == 1) { /* 1 + 2 stages instead of 2 + 1: same n_streams */
                h.k_stages = 1;
                h.v_stages = 2;
            }
            /* symbols [f, old length) again */
            uint64_t old_len = h.first_symbol + h.symbol_count;
            h.first_symbol = f;
            h.symbol_count = f <= old_len ? old_len - f : 0;
            cr_strm(&c, h, NULL);
        }
        cr_commit(&c, 2, e1 - 64, g.P[0], g.A[0]);
        char msg[600];
        int rc = open_craft(&c, FKVF_OPEN_STRICT, msg, sizeof msg);
        ck_assert_msg(rc == cases[i].want, "case %zu: %s, want %s (%s)", i, fkvf_error_name(rc),
                      fkvf_error_name(cases[i].want), msg);
        ck_assert_msg(strstr(msg, cases[i].needle) != NULL, "case %zu: %s", i, msg);
        tu_buf_free(&c.b);
    }
    growth_free(&g);
}
END_TEST

/* ==== suite ====================================================================== */

int main(void)
{
    Suite *s = suite_create("container_commits");
    TCase *t = tcase_create("commits");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, second_commit_is_served);
    tcase_add_test(t, torn_second_commit_falls_back_to_first);
    tcase_add_test(t, damaged_second_commit_falls_back_to_first);
    tcase_add_test(t, broken_chain_is_not_trusted);
    tcase_add_test(t, clean_file_with_damaged_earlier_commit_is_chain);
    tcase_add_loop_test(t, three_commits_grow_the_streams, 0, 3);
    tcase_add_loop_test(t, torn_third_commit_serves_the_second, 0, 3);
    tcase_add_test(t, writer_refuses_bad_later_commits);
    tcase_add_test(t, file_writer_commits_appear_at_finish);
    tcase_add_test(t, later_segment_rules);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
