/* Restore paths the other suites do not reach (coverage, issue 6):
 *  - a codebook of 4 MiB or more with the default allocator: its tables go to
 *    memory aligned for transparent huge pages (read/restore.c hp_alloc);
 *    restored rows must equal fkvf_rvq_decode of the stored codes, and those
 *    of a reader with its own allocator (which is used as given). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "fkvf.h"
#include "testutil.h"

/* 2 layers x 2 heads x (2 + 2 stages) x 1024 centroids x 64 dims x 4 bytes
 * = 4 MiB of binary32 tables: the threshold of the huge-page allocation */
enum { L = 2, H = 2, D = 64, K = 1024, KS = 2, VS = 2, NP = 24 };

START_TEST(restore_huge_codebook)
{
    fkvf_codebook_shape cs;
    memset(&cs, 0, sizeof cs);
    cs.n_layers = L;
    cs.n_heads = H;
    cs.key_dim = cs.value_dim = D;
    cs.k = K;
    cs.k_stages = KS;
    cs.v_stages = VS;
    cs.dtype = FKVF_DTYPE_F16;
    const size_t n_el = (size_t)L * H * (KS + VS) * K * D;
    ck_assert_uint_eq(fkvf_codebook_size(&cs), 64 + n_el * 2);
    uint16_t *tables = malloc(n_el * 2);
    ck_assert_ptr_nonnull(tables);
    tu_rng rng = {7};
    for (size_t i = 0; i < n_el; i++)
        tables[i] = fkvf_f32_to_f16((float)((int)tu_below(&rng, 4001) - 2000) / 1000.0f);
    tu_le_u16(tables, n_el); /* CBK1 tables are little-endian bytes (fkvf.h) */
    const size_t cpp = (size_t)L * H * (KS + VS);
    uint16_t *codes = malloc(cpp * NP * sizeof *codes);
    ck_assert_ptr_nonnull(codes);
    for (size_t i = 0; i < cpp * NP; i++)
        codes[i] = (uint16_t)tu_below(&rng, K);

    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = L;
    d.n_kv_heads = H;
    d.key_dim = d.value_dim = D;
    d.dtype = FKVF_DTYPE_F16;
    tu_buf out;
    memset(&out, 0, sizeof out);
    fkvf_sink sink = tu_buf_sink(&out);
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, NULL, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &cs, tables, n_el * 2, 0), FKVF_OK);
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.profile = FKVF_PROFILE_QUAD;
    sp.symbol_bits = 10;
    ck_assert_int_eq(fkvf_writer_add_index_segment(w, &sp, 0, NP, codes, cpp, 1), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_positions(w, NP, NP), FKVF_OK);
    ck_assert_msg(fkvf_writer_finish(w) == FKVF_OK, "%s", fkvf_writer_message(w));
    fkvf_writer_free(w);

    /* what spec 13.6 says the rows are: the decoded codes */
    fkvf_rvq *q = NULL;
    ck_assert_int_eq(fkvf_rvq_from_tables_decode(&q, &cs, 0, tables, n_el * 2, NULL), FKVF_OK);
    size_t rb = (size_t)L * H * 2 * D * 4;
    float *want = malloc(NP * rb), *got = malloc(NP * rb), *got2 = malloc(NP * rb);
    ck_assert(want && got && got2);
    ck_assert_int_eq(fkvf_rvq_decode(q, codes, cpp, 1, NP, 0, NULL, FKVF_DTYPE_F32, want, NP * rb),
                     FKVF_OK);
    fkvf_rvq_free(q);

    /* the default allocator: the tables take the huge-page path */
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, out.data, out.size, FKVF_OPEN_STRICT, NULL),
                     FKVF_OK);
    ck_assert_msg(fkvf_reader_restore(r, 0, NP, FKVF_DTYPE_F32, got, NP * rb) == FKVF_OK, "%s",
                  fkvf_reader_message(r));
    ck_assert_int_eq(fkvf_reader_verify(r), FKVF_OK);
    fkvf_reader_free(r);
    ck_assert_mem_eq(got, want, NP * rb);

    /* a caller's allocator is used as given (and is used) */
    tu_alloc cnt = {0};
    fkvf_allocator al = tu_alloc_hook(&cnt);
    ck_assert_int_eq(fkvf_reader_open_memory(&r, out.data, out.size, FKVF_OPEN_STRICT, &al),
                     FKVF_OK);
    long before = cnt.calls;
    ck_assert_int_eq(fkvf_reader_restore(r, 0, NP, FKVF_DTYPE_F32, got2, NP * rb), FKVF_OK);
    ck_assert_int_gt(cnt.calls, before); /* the codebook was built with it */
    fkvf_reader_free(r);
    ck_assert_mem_eq(got2, want, NP * rb);

    free(want);
    free(got);
    free(got2);
    free(codes);
    free(tables);
    tu_buf_free(&out);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cover_restore");
    TCase *t = tcase_create("restore");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, restore_huge_codebook);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
