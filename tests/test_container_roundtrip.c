/* Container tests, round trips: writer -> bytes -> reader for every codec, dtype and option; the reader API's argument errors.
 * The archive model and the hand-crafting helpers are in container_model.h.
 *
 * Hot loops use EXPECT (an `if` around ck_abort_msg) instead of ck_assert:
 * Check records the location of every passing ck_assert, which is slow in
 * loops of tens of thousands of iterations. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "codec/codec.h"
#include "common/le.h"
#include "fkvf.h"
#include "format/format.h"
#include "container_model.h"
#include "testutil.h"

/* ==== 1. round trips ============================================================ */

START_TEST(roundtrip_small_f16)
{
    model m;
    model_small(&m);
    roundtrip_memory(&m);
    model_free(&m);
}
END_TEST

START_TEST(roundtrip_many_streams_bf16_deflate_small_blocks)
{
    model m;
    model_many(&m, FKVF_DTYPE_BF16);
    roundtrip_memory(&m);
    model_free(&m);
}
END_TEST

/* One index group per codec: every quad width (the odd multiples of 2,
 * 6, 10, 14, ..., with alignment unit 64; others 32, 16, 8, 4), ngon
 * alphabets (N = 3, 4, 16, 256, 4096) and explicit ngon r and L; index
 * codes given per position and per stream; token streams of several codecs.
 * A 2-layer, 2-head cache, 2 key and 1 value stages of a pooled k = 4096
 * codebook, 150 archived positions over 128-byte blocks. */
static void model_codec_case(model *m, const codec_choice *ix, const codec_choice *tk, int i)
{
    memset(m, 0, sizeof *m);
    fkvf_writer_options_init(&m->opts);
    m->opts.required_features = FKVF_FEAT_NGON;
    m->opts.sync = FKVF_SYNC_NONE;
    m->opts.block_size = i % 3 == 0 ? 0 : 128;
    fkvf_desc *d = &m->desc;
    d->n_layers = 2;
    d->n_kv_heads = 2;
    d->key_dim = 2;
    d->value_dim = 3;
    d->dtype = FKVF_DTYPE_F16;
    d->n_sinks = 1;
    m->n_positions = 1 + 150 + 2;
    m->n_archived = 150;
    model_rows(m, 60 + (uint64_t)i);
    model_codebook(m, 4096, 2, 1, FKVF_DTYPE_F16, 1, 61);
    model_index(m, ix->profile, ix->bits, ix->alphabet, 1000 * (uint64_t)i);
    model_tokens(m, tk->profile, tk->bits, tk->alphabet, 7 + (uint64_t)i);
    m->codes_by_stream = i & 1;
    ck_assert_uint_eq(m->n_st, 2 * 2 * 3 + 1);
}

START_TEST(roundtrip_index_codecs)
{
    static const codec_choice ix[] = {
        {FKVF_PROFILE_QUAD, 2, 0},  {FKVF_PROFILE_QUAD, 4, 0},  {FKVF_PROFILE_QUAD, 6, 0},
        {FKVF_PROFILE_QUAD, 8, 0},  {FKVF_PROFILE_QUAD, 10, 0}, {FKVF_PROFILE_QUAD, 12, 0},
        {FKVF_PROFILE_QUAD, 14, 0}, {FKVF_PROFILE_QUAD, 16, 0}, {FKVF_PROFILE_QUAD, 18, 0},
        {FKVF_PROFILE_QUAD, 20, 0}, {FKVF_PROFILE_QUAD, 22, 0}, {FKVF_PROFILE_QUAD, 24, 0},
        {FKVF_PROFILE_QUAD, 26, 0}, {FKVF_PROFILE_QUAD, 28, 0}, {FKVF_PROFILE_QUAD, 30, 0},
        {FKVF_PROFILE_QUAD, 32, 0}, {FKVF_PROFILE_NGON, 0, 3},  {FKVF_PROFILE_NGON, 0, 4},
        {FKVF_PROFILE_NGON, 0, 16}, {FKVF_PROFILE_NGON, 0, 256}, {FKVF_PROFILE_NGON, 0, 4096}};
    static const codec_choice tk[] = {
        {FKVF_PROFILE_QUAD, 32, 0}, {FKVF_PROFILE_NGON, 0, 300}, {FKVF_PROFILE_QUAD, 2, 0},
        {FKVF_PROFILE_NGON, 0, 16}, {FKVF_PROFILE_QUAD, 18, 0}};
    static const uint32_t units[] = {64, 32, 64, 16, 64, 32, 64, 8, 64, 32, 64,
                                     16, 64, 32, 64, 4};
    size_t n = sizeof ix / sizeof ix[0];
    for (size_t i = 0; i < n; i++) {
        model m;
        model_codec_case(&m, &ix[i], &tk[i % 5], (int)i);
        if (i < 16)
            ck_assert_uint_eq(fkvf_stream_spec_align(&m.ispec), units[i]);
        roundtrip_memory(&m);
        model_free(&m);
    }
    /* explicit r and L: 150 = 21 spans of 7 + a partial span of 3 */
    model m;
    codec_choice n3 = {FKVF_PROFILE_NGON, 0, 3};
    model_codec_case(&m, &n3, &tk[0], 99);
    model_index_rl(&m, 0.3, 7);
    ck_assert_uint_eq(fkvf_stream_spec_align(&m.ispec), 7);
    roundtrip_memory(&m);
    model_free(&m);
}
END_TEST

START_TEST(roundtrip_f32_every_position_exact)
{
    model m;
    model_all_exact(&m);
    roundtrip_memory(&m);
    model_free(&m);
}
END_TEST

START_TEST(roundtrip_exact_rows_each_dtype)
{
    static const fkvf_dtype dts[] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16, FKVF_DTYPE_F32};
    for (size_t i = 0; i < 3; i++) {
        model m;
        model_small(&m);
        free(m.rows);
        m.desc.dtype = dts[i];
        model_rows(&m, 40 + i);
        ck_assert_uint_eq(m.row_bytes, 2 * 2 * 16 * (dts[i] == FKVF_DTYPE_F32 ? 4 : 2));
        roundtrip_memory(&m);
        /* and deflated */
        m.opts.required_features |= FKVF_FEAT_DEFLATE;
        m.exac_flags = FKVF_SECTION_DEFLATE;
        roundtrip_memory(&m);
        model_free(&m);
    }
}
END_TEST

START_TEST(roundtrip_empty_archive)
{
    model m;
    memset(&m, 0, sizeof m);
    fkvf_writer_options_init(&m.opts);
    simple_desc(&m.desc);
    model_rows(&m, 5);
    roundtrip_memory(&m);
    /* with empty groups: index streams need a codebook; with n_archived = 0
     * they have no symbols (segments of 64 bytes) */
    model_codebook(&m, 64, 2, 1, FKVF_DTYPE_F32, 0, 4);
    model_index(&m, FKVF_PROFILE_QUAD, 6, 0, 1);
    model_tokens(&m, FKVF_PROFILE_QUAD, 32, 0, 2);
    ck_assert_uint_eq(m.n_st, 3 + 1);
    roundtrip_memory(&m);
    model_free(&m);
    /* the same with ngon groups (N = 5 for both: one VTXS) */
    memset(&m, 0, sizeof m);
    fkvf_writer_options_init(&m.opts);
    m.opts.required_features = FKVF_FEAT_NGON;
    simple_desc(&m.desc);
    model_rows(&m, 5);
    model_codebook(&m, 64, 2, 1, FKVF_DTYPE_F32, 0, 4);
    model_index(&m, FKVF_PROFILE_NGON, 0, 5, 3);
    model_tokens(&m, FKVF_PROFILE_NGON, 0, 5, 4);
    ck_assert_uint_eq(model_n_sections(&m), 5); /* DESC CBK1 VTXS STRM STRM */
    roundtrip_memory(&m);
    model_free(&m);
}
END_TEST

START_TEST(roundtrip_through_file)
{
    model m;
    model_many(&m, FKVF_DTYPE_F16);
    char *dir = make_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/a.fkvf", dir);
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_file(&w, path, &m.opts, NULL));
    OK_W(w, write_model(&m, w));
    fkvf_writer_free(w);
    size_t size;
    uint8_t *bytes = tu_slurp(path, &size);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_file(&r, path, 0, NULL));
    check_model(r, &m, NULL, size);
    fkvf_reader_free(r);
    /* same bytes as a sink writer */
    tu_buf b;
    build(&m, &b);
    ck_assert_uint_eq(b.size, size);
    ck_assert(memcmp(b.data, bytes, size) == 0);
    tu_buf_free(&b);
    free(bytes);
    rm_tmpdir(dir);
    model_free(&m);
}
END_TEST

START_TEST(sinks_exact_and_archived_positions)
{
    model m;
    model_small(&m);
    ck_assert_uint_eq(m.desc.n_sinks, 2);
    tu_buf b;
    build(&m, &b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    static const int want[10] = {1, 1, 0, 0, 0, 0, 0, 1, 1, 1};
    for (uint64_t p = 0; p < 10; p++) {
        int is = -1;
        OK_R(r, fkvf_reader_is_exact(r, p, &is));
        ck_assert_int_eq(is, want[p]);
    }
    /* index streams hold n_archived = 5 symbols, the token stream n_positions */
    size_t idx;
    fkvf_stream_info si;
    OK_R(r, fkvf_reader_stream_find(r, FKVF_STREAM_ID(0, 0, 0, 0, 0), &idx));
    OK_R(r, fkvf_reader_stream_info(r, idx, &si));
    ck_assert_uint_eq(si.length, 5);
    OK_R(r, fkvf_reader_stream_find(r, FKVF_STREAM_ID(0, 1, 1, 1, 0), &idx));
    OK_R(r, fkvf_reader_stream_info(r, idx, &si));
    ck_assert_uint_eq(si.length, 5);
    ck_assert_int_eq(si.profile, FKVF_PROFILE_NGON);
    OK_R(r, fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &idx));
    OK_R(r, fkvf_reader_stream_info(r, idx, &si));
    ck_assert_uint_eq(si.length, 10);
    /* the two tail EXAC sections: 7 and 8..9 */
    fkvf_section_info sec;
    ck_assert_uint_ne(find_section(r, FKVF_SECTION_EXAC, 0, &sec), SIZE_MAX);
    ck_assert_uint_eq(sec.size, 64 + 2 * m.row_bytes);
    ck_assert_uint_ne(find_section(r, FKVF_SECTION_EXAC, 7, &sec), SIZE_MAX);
    ck_assert_uint_eq(sec.size, 64 + 1 * m.row_bytes);
    ck_assert_uint_ne(find_section(r, FKVF_SECTION_EXAC, 8, &sec), SIZE_MAX);
    ck_assert_uint_eq(sec.size, 64 + 2 * m.row_bytes);
    check_exact(r, &m);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(unknown_optional_section_is_skipped)
{
    model m;
    model_small(&m);
    m.extra = 1;
    for (size_t i = 0; i < sizeof m.extra_data; i++)
        m.extra_data[i] = (uint8_t)(i * 31);
    roundtrip_memory(&m); /* checks the section is listed, readable, and verify passes */
    model_free(&m);
}
END_TEST

START_TEST(unknown_required_section_is_rejected)
{
    model m;
    model_small(&m);
    tu_buf b;
    memset(&b, 0, sizeof b);
    fkvf_sink sink = tu_buf_sink(&b);
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_sink(&w, &sink, &m.opts, NULL));
    OK_W(w, fkvf_writer_add_section(w, FKVF_FOURCC('X', 'R', 'E', 'Q'), FKVF_SECTION_REQUIRED, 0,
                                    "abc", 3));
    OK_W(w, write_model(&m, w));
    fkvf_writer_free(w);
    char msg[600];
    ck_assert_int_eq(try_open(b.data, b.size, 0, msg, sizeof msg), FKVF_E_SECTION);
    ck_assert_msg(strstr(msg, "XREQ") != NULL, "message does not name the type: %s", msg);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(deflated_sections_read_back_equal)
{
    /* a 1 MiB run of zeros compresses close to zlib's maximum ratio: the
     * bomb limit of spec 4.4 must not reject what zlib itself produces */
    size_t big = 1u << 20;
    uint8_t *zeros = calloc(big, 1);
    ck_assert_ptr_nonnull(zeros);
    model m;
    model_small(&m);
    m.opts.required_features |= FKVF_FEAT_DEFLATE;
    m.exac_flags = FKVF_SECTION_DEFLATE;
    tu_buf b;
    memset(&b, 0, sizeof b);
    fkvf_sink sink = tu_buf_sink(&b);
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_sink(&w, &sink, &m.opts, NULL));
    OK_W(w, fkvf_writer_add_section(w, XTRZ, FKVF_SECTION_DEFLATE, 1, zeros, big));
    OK_W(w, fkvf_writer_add_section(w, XTRZ, FKVF_SECTION_DEFLATE, 2, "", 0));
    OK_W(w, fkvf_writer_add_section(w, XTRZ, FKVF_SECTION_DEFLATE, 3, m.rows, m.row_bytes));
    OK_W(w, write_model(&m, w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_section_info si;
    size_t i = find_section(r, XTRZ, 1, &si);
    ck_assert_uint_ne(i, SIZE_MAX);
    ck_assert_uint_eq(si.size, big);
    ck_assert_uint_lt(si.stored_size, big / 500);
    const void *p;
    size_t n;
    OK_R(r, fkvf_reader_section_data(r, i, &p, &n));
    ck_assert_uint_eq(n, big);
    ck_assert(memcmp(p, zeros, big) == 0);
    i = find_section(r, XTRZ, 2, &si);
    OK_R(r, fkvf_reader_section_data(r, i, &p, &n));
    ck_assert_uint_eq(n, 0);
    i = find_section(r, XTRZ, 3, &si);
    OK_R(r, fkvf_reader_section_data(r, i, &p, &n));
    ck_assert_uint_eq(n, m.row_bytes);
    ck_assert(memcmp(p, m.rows, n) == 0);
    /* deflated EXAC sections */
    size_t e = find_section(r, FKVF_SECTION_EXAC, 0, &si);
    ck_assert_uint_eq(si.flags, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE);
    ck_assert_uint_eq(si.size, 64 + 2 * m.row_bytes);
    OK_R(r, fkvf_reader_section_data(r, e, &p, &n));
    ck_assert_uint_eq(fkvf_ld64(p), 0);
    ck_assert_uint_eq(fkvf_ld64((const uint8_t *)p + 8), 2);
    check_exact(r, &m);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
    free(zeros);
}
END_TEST

/* Bug guard: fkvf_reader_verify freed and re-inflated the buffers of
 * deflated sections, so views handed out before (exact rows, section data,
 * metadata) dangled afterwards. */
START_TEST(verify_keeps_earlier_views_of_deflated_sections)
{
    model m;
    model_many(&m, FKVF_DTYPE_F16);
    tu_buf b;
    build(&m, &b);
    /* an allocator that never reuses memory and poisons what is freed, so a
     * stale view reads 0xDD even without ASan */
    tu_alloc q = {.quarantine = 1};
    fkvf_allocator qa = tu_alloc_hook(&q);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, &qa));
    const void *row;
    size_t rb;
    OK_R(r, fkvf_reader_exact_row(r, 0, &row, &rb));
    size_t xi = find_section(r, XTRZ, 8, NULL);
    const void *xd;
    size_t xn;
    OK_R(r, fkvf_reader_section_data(r, xi, &xd, &xn));
    OK_R(r, fkvf_reader_verify(r));
    OK_R(r, fkvf_reader_verify(r));
    ck_assert(memcmp(row, m.rows, rb) == 0);
    ck_assert(memcmp(xd, m.extra_data, xn) == 0);
    const void *row2;
    OK_R(r, fkvf_reader_exact_row(r, 0, &row2, &rb));
    ck_assert_ptr_eq(row2, row);
    fkvf_reader_free(r);
    tu_alloc_release(&q);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(reader_api_argument_errors)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(NULL, b.data, b.size, 0, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_open_memory(&r, NULL, 10, 0, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(r);
    ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, 0x80, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(r);
    ck_assert_int_eq(fkvf_reader_open_file(&r, NULL, 0, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_open_file(&r, "/nonexistent/dir/x.fkvf", 0, NULL), FKVF_E_IO);
    ck_assert_ptr_nonnull(r); /* the handle carries the message */
    ck_assert(strlen(fkvf_reader_message(r)) > 0);
    fkvf_reader_free(r);
    r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, "/", 0, NULL), FKVF_E_IO);
    fkvf_reader_free(r);
    r = NULL;
    /* NULL handles */
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(NULL, &ai), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_reader_verify(NULL), FKVF_E_STATE);
    ck_assert_ptr_nonnull(fkvf_reader_message(NULL));
    fkvf_reader_free(NULL);
    /* a writer handle is not a reader */
    tu_buf wb;
    memset(&wb, 0, sizeof wb);
    fkvf_sink sink = tu_buf_sink(&wb);
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_sink(&w, &sink, NULL, NULL));
    ck_assert_int_eq(fkvf_reader_info((const fkvf_reader *)(void *)w, &ai), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_writer_finish((fkvf_writer *)NULL), FKVF_E_STATE);
    fkvf_writer_free(w);
    tu_buf_free(&wb);

    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    ck_assert_int_eq(fkvf_reader_info(r, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_desc(r, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_meta_count(r, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_meta(r, 0, NULL), FKVF_E_INVALID_ARG);
    fkvf_meta_entry e;
    ck_assert_int_eq(fkvf_reader_meta_find(r, NULL, &e), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_section(r, 0, NULL), FKVF_E_INVALID_ARG);
    const void *p;
    size_t n;
    ck_assert_int_eq(fkvf_reader_section_data(r, 0, NULL, &n), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_section_data(r, 0, &p, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_stream_count(r, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_stream_info(r, 0, NULL), FKVF_E_INVALID_ARG);
    fkvf_stream_info si;
    ck_assert_int_eq(fkvf_reader_stream_info(r, m.n_st, &si), FKVF_E_RANGE);
    ck_assert_int_eq(fkvf_reader_stream_find(r, 0, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_stream_read(r, 0, 0, NULL, 1), FKVF_E_INVALID_ARG);
    uint32_t s;
    ck_assert_int_eq(fkvf_reader_stream_get(r, m.n_st, 0, &s), FKVF_E_RANGE);
    ck_assert_int_eq(fkvf_reader_stream_point(r, 0, 0, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_exact_row(r, 0, NULL, &n), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_is_exact(r, 0, NULL), FKVF_E_INVALID_ARG);
    /* codebook calls */
    ck_assert_int_eq(fkvf_reader_codebook(NULL, NULL, NULL, NULL, NULL), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_reader_codebook_ref(r, NULL, NULL, NULL), FKVF_E_INVALID_ARG);
    int ext;
    ck_assert_int_eq(fkvf_reader_codebook_ref(NULL, &ext, NULL, NULL), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_reader_attach_codebook(r, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_attach_codebook(r, r), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_attach_codebook(NULL, r), FKVF_E_STATE);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* ==== suite ====================================================================== */

int main(void)
{
    Suite *s = suite_create("container_roundtrip");
    TCase *t = tcase_create("roundtrip");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, roundtrip_small_f16);
    tcase_add_test(t, roundtrip_many_streams_bf16_deflate_small_blocks);
    tcase_add_test(t, roundtrip_index_codecs);
    tcase_add_test(t, roundtrip_f32_every_position_exact);
    tcase_add_test(t, roundtrip_exact_rows_each_dtype);
    tcase_add_test(t, roundtrip_empty_archive);
    tcase_add_test(t, roundtrip_through_file);
    tcase_add_test(t, sinks_exact_and_archived_positions);
    tcase_add_test(t, unknown_optional_section_is_skipped);
    tcase_add_test(t, unknown_required_section_is_rejected);
    tcase_add_test(t, deflated_sections_read_back_equal);
    tcase_add_test(t, verify_keeps_earlier_views_of_deflated_sections);
    tcase_add_test(t, reader_api_argument_errors);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
