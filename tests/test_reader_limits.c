/* Work and memory a reader spends are bounded by the file's bytes, not by
 * counts the file declares: regression tests for declared sizes that once
 * turned a tiny file into a large allocation. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "fkvf.h"
#include "testutil.h"

/* A valid archive of a model with 1024 layers x 1024 KV heads and a codebook
 * of 16 + 16 stages (referred to by hash): 2^25 index streams, no position.
 * A few hundred bytes; the reader must not spend memory per stream. */
START_TEST(many_declared_streams_cost_no_memory)
{
    tu_buf b;
    memset(&b, 0, sizeof b);
    fkvf_sink sink = tu_buf_sink(&b);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.required_features = FKVF_FEAT_EXTERNAL_CODEBOOK;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = d.n_kv_heads = 1024;
    d.key_dim = d.value_dim = 1;
    d.dtype = FKVF_DTYPE_F16;
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    fkvf_codebook_shape cs = {1024, 1024, 1, 1, 16, 16, 16, FKVF_DTYPE_F16, 0, NULL};
    uint8_t hash[16] = {1, 2, 3};
    ck_assert_int_eq(fkvf_writer_add_codebook_ref(w, &cs, hash, "big"), FKVF_OK);
    fkvf_stream_spec sp = {FKVF_PROFILE_QUAD, 4, 0, 0, 0};
    ck_assert_int_eq(fkvf_writer_add_index_segment(w, &sp, 0, 0, NULL, 0, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
    ck_assert_uint_lt(b.size, 2048);

    tu_alloc c = {0};
    fkvf_allocator al = tu_alloc_hook(&c);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, &al), FKVF_OK);
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    ck_assert_uint_eq(ai.n_streams, (size_t)1 << 25);
    /* the last stream, by index and by id */
    size_t idx;
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID(0, 1023, 1023, 1, 15), &idx),
                     FKVF_OK);
    ck_assert_uint_eq(idx, ((size_t)1 << 25) - 1);
    fkvf_stream_info si;
    ck_assert_int_eq(fkvf_reader_stream_info(r, idx, &si), FKVF_OK);
    ck_assert_uint_eq(si.id, FKVF_STREAM_ID(0, 1023, 1023, 1, 15));
    ck_assert_uint_eq(si.length, 0);
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID(0, 1024, 0, 0, 0), &idx),
                     FKVF_E_NOT_FOUND);
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID(0, 0, 0, 0, 16), &idx),
                     FKVF_E_NOT_FOUND);
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &idx), FKVF_E_NOT_FOUND);
    ck_assert_int_eq(fkvf_reader_verify(r), FKVF_OK);
    fkvf_reader_free(r);
    ck_assert_msg(c.peak < (size_t)1 << 20, "peak %zu bytes for a %zu-byte file", c.peak, b.size);
    ck_assert_uint_eq(c.bytes, 0);
    tu_buf_free(&b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reader_limits");
    TCase *t = tcase_create("reader_limits");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, many_declared_streams_cost_no_memory);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
