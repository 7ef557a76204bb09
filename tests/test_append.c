/* The appender (fkvf.h "appender", spec 7.4-7.7, 14.3): positions appended
 * and committed in batches come back as a reader restores them; exact
 * positions bit for bit, archived ones as the codebook reconstructs them. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fkvf.h"
#include "testutil.h"

#define L 2
#define H 2
#define D 8
#define ROW_ELEMS (L * H * 2 * D)
#define ROW_BYTES (ROW_ELEMS * 2)

static char tmpdir[64];

static void make_dir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fkvf-append-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void path_in(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", tmpdir, name);
}

/* f16 rows of positions [first, first+n), deterministic per position. */
static void gen_rows(uint16_t *out, uint64_t first, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        tu_rng rng = {(first + i) * 0x9E3779B97F4A7C15u + 1};
        for (size_t e = 0; e < ROW_ELEMS; e++) {
            double v = (double)(tu_next(&rng) >> 11) / 9007199254740992.0 * 4.0 - 2.0;
            out[i * ROW_ELEMS + e] = fkvf_f32_to_f16((float)v);
        }
    }
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
    for (size_t i = 0; i < nb; i++) {
        append_n(a, n, batches[i], tokens, 1);
        n += batches[i];
        rc = fkvf_appender_commit(a);
        ck_assert_msg(rc == FKVF_OK, "commit %zu: %s", i, fkvf_appender_message(a));
        fkvf_appender_state st;
        ck_assert_int_eq(fkvf_appender_state_get(a, &st), FKVF_OK);
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

static Suite *suite(void)
{
    Suite *s = suite_create("append");
    TCase *t = tcase_create("append");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, append_batches_quad);
    tcase_add_test(t, append_batches_reopen);
    tcase_add_test(t, append_batches_ngon);
    tcase_add_test(t, append_without_codebook_all_exact);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
