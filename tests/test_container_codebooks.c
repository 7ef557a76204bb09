/* Container tests, codebooks (spec 13): embedded CBK1, codebook files, CBRF references and attach, the index-stream set (spec 11.8), section placement rules and scale.
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
#include "common/hash.h"
#include "common/le.h"
#include "fkvf.h"
#include "format/format.h"
#include "container_model.h"
#include "testutil.h"

/* ==== 10. codebooks (spec 13) ==================================================== */

/* A codebook file (spec 13.4): no DESC, one CBK1, optional META. */
static void write_codebook_file(const fkvf_codebook_shape *shape, const uint8_t *tables,
                                size_t tsize, unsigned flags, tu_buf *out)
{
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.required_features = (flags & FKVF_SECTION_DEFLATE) ? FKVF_FEAT_DEFLATE : 0;
    o.sync = FKVF_SYNC_NONE;
    fkvf_writer *w = new_writer(out, &o);
    OK_W(w, fkvf_writer_meta_utf8(w, "train.corpus", "tiny"));
    OK_W(w, fkvf_writer_add_codebooks(w, shape, tables, tsize, flags));
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
}

static void hash_of(const fkvf_codebook_shape *shape, const uint8_t *tables, size_t tsize,
                    uint8_t out[16])
{
    size_t n;
    uint8_t *p = cbk1_bytes(shape, tables, tsize, &n);
    fkvf_codebook_hash(p, n, out);
    free(p);
}

START_TEST(codebook_embedded_round_trip)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL));
    const void *p = check_codebook(r, &m.cbs, m.cb_tables, m.cb_tables_size);
    fkvf_section_info si;
    ck_assert_uint_ne(find_section(r, FKVF_SECTION_CBK1, 0, &si), SIZE_MAX);
    ck_assert_ptr_eq(p, b.data + si.offset); /* zero copy */
    ck_assert_uint_eq(si.flags, FKVF_SECTION_REQUIRED);
    /* spec 13.2: 64 + n_layers * n_heads * k * (k_stages * key_dim + v_stages * value_dim) * 2 */
    ck_assert_uint_eq(si.size, 64 + 2 * 2 * 16 * (8 + 8) * 2);
    ck_assert_uint_eq(fkvf_codebook_size(&m.cbs), si.size);
    /* the hash is that of the contents alone (spec 13.3) */
    uint8_t h1[16], h2[16];
    OK_R(r, fkvf_reader_codebook(r, NULL, NULL, NULL, h1));
    fkvf_xxh3_128(b.data + si.offset, (size_t)si.size, h2);
    ck_assert(memcmp(h1, h2, 16) == 0);
    /* embedded: no reference; its hash and name outputs are left alone */
    int ext = -1;
    uint8_t rh[16];
    memset(rh, 0xAB, sizeof rh);
    const char *nm = "untouched";
    OK_R(r, fkvf_reader_codebook_ref(r, &ext, rh, &nm));
    ck_assert_int_eq(ext, 0);
    ck_assert_uint_eq(rh[0], 0xAB);
    ck_assert_str_eq(nm, "untouched");
    /* nothing to attach */
    fkvf_reader *r2 = NULL;
    OK_R(r2, fkvf_reader_open_memory(&r2, b.data, b.size, 0, NULL));
    RC_R(r, fkvf_reader_attach_codebook(r, r2), FKVF_E_STATE);
    fkvf_reader_free(r2);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);

    /* a different table gives a different hash */
    model m2;
    model_small(&m2);
    m2.cb_tables[0] ^= 1;
    build(&m2, &b);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    OK_R(r, fkvf_reader_codebook(r, NULL, NULL, NULL, h2));
    ck_assert(memcmp(h1, h2, 16) != 0);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m2);
    model_free(&m);
}
END_TEST

START_TEST(codebook_size_of_shapes)
{
    fkvf_codebook_shape s = {1, 1, 1, 1, 16, 0, 0, FKVF_DTYPE_F16, 0, NULL};
    ck_assert_uint_eq(fkvf_codebook_size(&s), 64); /* no stages: the header alone */
    s.k_stages = 1;
    ck_assert_uint_eq(fkvf_codebook_size(&s), 64 + 16 * 2);
    s = (fkvf_codebook_shape){1, 1, 16384, 16384, 4096, 16, 16, FKVF_DTYPE_F32, 0, NULL};
    ck_assert_uint_eq(fkvf_codebook_size(&s), 64 + (UINT64_C(1) << 33));
    s = (fkvf_codebook_shape){1024, 1024, 1, 1, 16, 1, 0, FKVF_DTYPE_F16, 0, NULL};
    ck_assert_uint_eq(fkvf_codebook_size(&s), 64 + (UINT64_C(1) << 25));
    s = (fkvf_codebook_shape){3, 1, 5, 7, 64, 2, 3, FKVF_DTYPE_F32, 1, NULL};
    ck_assert_uint_eq(fkvf_codebook_size(&s), 64 + 3 * 64 * (2 * 5 + 3 * 7) * 4);
    /* beyond 2^48 */
    s = (fkvf_codebook_shape){1024, 1024, 16384, 16384, 4096, 16, 16, FKVF_DTYPE_F32, 0, NULL};
    ck_assert_uint_eq(fkvf_codebook_size(&s), 0);
    /* fields out of range (spec 13.1) */
    static const fkvf_codebook_shape bad[] = {
        {0, 1, 4, 4, 16, 1, 1, FKVF_DTYPE_F16, 0, NULL},    {1025, 1, 4, 4, 16, 1, 1, FKVF_DTYPE_F16, 0, NULL},
        {1, 0, 4, 4, 16, 1, 1, FKVF_DTYPE_F16, 0, NULL},    {1, 1025, 4, 4, 16, 1, 1, FKVF_DTYPE_F16, 0, NULL},
        {1, 1, 0, 4, 16, 1, 1, FKVF_DTYPE_F16, 0, NULL},    {1, 1, 16385, 4, 16, 1, 1, FKVF_DTYPE_F16, 0, NULL},
        {1, 1, 4, 0, 16, 1, 1, FKVF_DTYPE_F16, 0, NULL},    {1, 1, 4, 4, 8, 1, 1, FKVF_DTYPE_F16, 0, NULL},
        {1, 1, 4, 4, 15, 1, 1, FKVF_DTYPE_F16, 0, NULL},    {1, 1, 4, 4, 48, 1, 1, FKVF_DTYPE_F16, 0, NULL},
        {1, 1, 4, 4, 8192, 1, 1, FKVF_DTYPE_F16, 0, NULL},  {1, 1, 4, 4, 16, 17, 1, FKVF_DTYPE_F16, 0, NULL},
        {1, 1, 4, 4, 16, 1, 17, FKVF_DTYPE_F16, 0, NULL},   {1, 1, 4, 4, 16, 1, 1, FKVF_DTYPE_BF16, 0, NULL},
        {1, 1, 4, 4, 16, 1, 1, (fkvf_dtype)0, 0, NULL},     {1, 2, 4, 4, 16, 1, 1, FKVF_DTYPE_F16, 1, NULL},
        {1, 1, 4, 4, 16, 1, 1, FKVF_DTYPE_F16, 2, NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(fkvf_codebook_size(&bad[i]) == 0, "case %zu", i);
    ck_assert_uint_eq(fkvf_codebook_size(NULL), 0);
}
END_TEST

START_TEST(codebook_pooled_per_layer)
{
    model m;
    memset(&m, 0, sizeof m);
    fkvf_writer_options_init(&m.opts);
    m.opts.required_features = FKVF_FEAT_NGON;
    m.opts.sync = FKVF_SYNC_NONE;
    simple_desc(&m.desc);
    m.desc.n_layers = 2;
    m.desc.n_kv_heads = 3;
    m.desc.value_dim = 2;
    m.desc.n_sinks = 1;
    m.n_positions = 6;
    m.n_archived = 4;
    model_rows(&m, 8);
    model_codebook(&m, 32, 2, 1, FKVF_DTYPE_F32, 1, 9);
    ck_assert_uint_eq(m.cbs.n_heads, 1);
    model_index(&m, FKVF_PROFILE_QUAD, 6, 0, 5);
    ck_assert_uint_eq(m.n_st, 2 * 3 * 3); /* every head has its streams */
    roundtrip_memory(&m);
    /* pooled means n_heads = 1; per head it must equal n_kv_heads */
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    fkvf_codebook_shape s = m.cbs;
    s.n_heads = 3;
    RC_W(w, fkvf_writer_add_codebooks(w, &s, m.cb_tables, 3 * m.cb_tables_size, 0),
         FKVF_E_INVALID_ARG);
    assert_msg_names(w, "13.1");
    s.pooled = 0;
    s.n_heads = 1;
    RC_W(w, fkvf_writer_add_codebooks(w, &s, m.cb_tables, m.cb_tables_size, 0),
         FKVF_E_INVALID_ARG);
    assert_msg_names(w, "13.7");
    /* f32 centroids must be finite too (spec 13.2) */
    static const uint32_t nonfinite32[] = {0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001};
    for (size_t i = 0; i < sizeof nonfinite32 / sizeof nonfinite32[0]; i++) {
        uint8_t *bad = malloc(m.cb_tables_size);
        memcpy(bad, m.cb_tables, m.cb_tables_size);
        fkvf_st32(bad + m.cb_tables_size - 4 * (i + 1), nonfinite32[i]);
        RC_W(w, fkvf_writer_add_codebooks(w, &m.cbs, bad, m.cb_tables_size, 0),
             FKVF_E_INVALID_ARG);
        assert_msg_names(w, "not finite");
        free(bad);
    }
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    fkvf_writer_free(w);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(codebook_deflated)
{
    model m;
    model_small(&m);
    m.opts.required_features |= FKVF_FEAT_DEFLATE;
    m.cb_flags = FKVF_SECTION_DEFLATE;
    roundtrip_memory(&m); /* flags, stored_size < size, contents, hash */
    tu_buf b;
    build(&m, &b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    uint8_t hd[16], hp[16];
    const void *p;
    size_t n;
    OK_R(r, fkvf_reader_codebook(r, NULL, &p, &n, hd));
    fkvf_section_info si;
    find_section(r, FKVF_SECTION_CBK1, 0, &si);
    ck_assert_uint_eq(si.flags, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE);
    ck_assert_uint_eq(n, si.size);
    ck_assert((uintptr_t)p < (uintptr_t)b.data || (uintptr_t)p >= (uintptr_t)(b.data + b.size));
    /* the hash does not depend on compression (spec 13.3) */
    hash_of(&m.cbs, m.cb_tables, m.cb_tables_size, hp);
    ck_assert(memcmp(hd, hp, 16) == 0);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    /* a deflated CBK1 needs the feature bit */
    m.opts.required_features &= ~FKVF_FEAT_DEFLATE;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    RC_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size,
                                      FKVF_SECTION_DEFLATE),
         FKVF_E_INVALID_ARG);
    assert_msg_names(w, "FKVF_FEAT_DEFLATE");
    fkvf_writer_free(w);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* With zero stages the sum is the zero vector (spec 13.6): archived
 * positions need a codebook but no index stream. */
/* A codebook without stages: an index group would have no streams (spec
 * 11.2: at least one stage), so such an archive cannot archive positions;
 * with every position exact it is valid. */
START_TEST(codebook_without_stages)
{
    model m;
    memset(&m, 0, sizeof m);
    fkvf_writer_options_init(&m.opts);
    m.opts.sync = FKVF_SYNC_NONE;
    simple_desc(&m.desc);
    m.desc.dtype = FKVF_DTYPE_BF16;
    m.desc.n_sinks = 1;
    m.n_positions = 5;
    m.n_archived = 0;
    model_rows(&m, 6);
    model_codebook(&m, 16, 0, 0, FKVF_DTYPE_F32, 0, 1);
    ck_assert_uint_eq(m.cb_tables_size, 0);
    model_tokens(&m, FKVF_PROFILE_QUAD, 16, 0, 3);
    roundtrip_memory(&m);
    /* no index group may exist */
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, NULL, 0, 0));
    fkvf_stream_spec q = mkspec(FKVF_PROFILE_QUAD, 4, 0);
    uint16_t codes[3] = {0, 1, 2};
    RC_W(w, fkvf_writer_add_index_segment(w, &q, 0, 3, codes, 1, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "stage");
    RC_W(w, fkvf_writer_add_index_segment(w, &q, 0, 0, NULL, 1, 1), FKVF_E_INVALID_ARG);
    /* so archived positions are refused */
    OK_W(w, fkvf_writer_add_exact(w, 0, 5, m.rows, 5 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_set_positions(w, 5, 3));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    assert_msg_names(w, "index streams");
    OK_W(w, fkvf_writer_set_positions(w, 5, 0));
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    /* and by the reader: the valid file with n_archived = 3 */
    craft c;
    fkvf_dirhdr dh = cr_from_file(&c, b.data, b.size);
    ck_assert_uint_eq(dh.n_archived, 0);
    cr_commit(&c, 1, 0, 5, 3);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "3 archived positions but no index streams");
    tu_buf_free(&c.b);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* An index group needs a codebook even when nothing is archived (spec 11.8):
 * the writer cannot produce one without, and the reader refuses it. */
START_TEST(index_group_without_codebook)
{
    model m;
    model_small(&m);
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    fkvf_stream_spec q = {FKVF_PROFILE_QUAD, 8, 0, 0, 0};
    RC_W(w, fkvf_writer_add_index_segment(w, &q, 0, 0, NULL, 1, 1), FKVF_E_STATE);
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    OK_W(w, fkvf_writer_add_index_segment(w, &q, 0, 0, NULL, 1, 1));
    OK_W(w, fkvf_writer_add_exact(w, 0, 5, m.rows, 5 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_set_positions(w, 5, 0));
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL));
    fkvf_reader_free(r);
    /* the same file without its CBK1 entry */
    craft c;
    fkvf_dirhdr dh = cr_from_file(&c, b.data, b.size);
    cr_drop(&c, cr_find(&c, FKVF_SECTION_CBK1, 0));
    cr_commit(&c, 1, 0, dh.n_positions, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "index streams but no codebook");
    tu_buf_free(&c.b);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(codebook_file_without_desc)
{
    model m;
    model_small(&m);
    for (int deflated = 0; deflated < 2; deflated++) {
        tu_buf cf;
        write_codebook_file(&m.cbs, m.cb_tables, m.cb_tables_size,
                            deflated ? FKVF_SECTION_DEFLATE : 0, &cf);
        fkvf_reader *r = NULL;
        OK_R(r, fkvf_reader_open_memory(&r, cf.data, cf.size, FKVF_OPEN_STRICT, NULL));
        fkvf_archive_info ai;
        OK_R(r, fkvf_reader_info(r, &ai));
        ck_assert_int_eq(ai.has_desc, 0);
        ck_assert_uint_eq(ai.n_positions, 0);
        ck_assert_uint_eq(ai.n_archived, 0);
        ck_assert_uint_eq(ai.n_streams, 0);
        ck_assert_uint_eq(ai.n_sections, 2); /* CBK1, META */
        fkvf_desc d;
        RC_R(r, fkvf_reader_desc(r, &d), FKVF_E_NOT_FOUND);
        fkvf_meta_entry e;
        OK_R(r, fkvf_reader_meta_find(r, "train.corpus", &e));
        check_codebook(r, &m.cbs, m.cb_tables, m.cb_tables_size);
        uint8_t h[16], want[16];
        OK_R(r, fkvf_reader_codebook(r, NULL, NULL, NULL, h));
        hash_of(&m.cbs, m.cb_tables, m.cb_tables_size, want);
        ck_assert(memcmp(h, want, 16) == 0);
        int ext = -1;
        OK_R(r, fkvf_reader_codebook_ref(r, &ext, NULL, NULL));
        ck_assert_int_eq(ext, 0);
        OK_R(r, fkvf_reader_verify(r));
        fkvf_reader_free(r);
        tu_buf_free(&cf);
    }
    /* what a codebook file cannot hold (spec 13.4): the writer refuses */
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    OK_W(w, fkvf_writer_set_positions(w, 1, 0));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    assert_msg_names(w, "13.4");
    fkvf_writer_free(w);
    tu_buf_free(&b);
    w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    fkvf_stream_spec tok = mkspec(FKVF_PROFILE_QUAD, 32, 0);
    OK_W(w, fkvf_writer_add_token_segment(w, &tok, 0, NULL, 0));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    assert_msg_names(w, "13.4");
    RC_W(w, fkvf_writer_add_exact(w, 0, 1, m.rows, m.row_bytes, 0), FKVF_E_STATE);
    RC_W(w, write_index_segment(&m, w, 0, 5), FKVF_E_STATE);
    fkvf_writer_free(w);
    tu_buf_free(&b);
    /* a codebook file never refers to another codebook */
    fkvf_writer_options o = m.opts;
    o.required_features |= FKVF_FEAT_EXTERNAL_CODEBOOK;
    w = new_writer(&b, &o);
    uint8_t h[16] = {1};
    RC_W(w, fkvf_writer_add_codebook_ref(w, &m.cbs, h, "x"), FKVF_E_STATE);
    assert_msg_names(w, "13.4");
    fkvf_writer_free(w);
    tu_buf_free(&b);
    /* a codebook first, then a matching descriptor: an archive */
    w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    fkvf_desc d = m.desc;
    d.value_dim = 4;
    RC_W(w, fkvf_writer_set_desc(w, &d), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "13.7");
    d = m.desc;
    d.n_kv_heads = 1;
    RC_W(w, fkvf_writer_set_desc(w, &d), FKVF_E_INVALID_ARG);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_int_eq(ai.has_desc, 1);
    check_codebook(r, &m.cbs, m.cb_tables, m.cb_tables_size);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* An archive with a CBRF reference, plus the matching codebook file. */
static void external_pair(model *m, tu_buf *archive, tu_buf *cbfile, const char *name)
{
    write_codebook_file(&m->cbs, m->cb_tables, m->cb_tables_size, 0, cbfile);
    m->cb = 2;
    m->cb_name = name;
    m->opts.required_features |= FKVF_FEAT_EXTERNAL_CODEBOOK;
    hash_of(&m->cbs, m->cb_tables, m->cb_tables_size, m->cb_hash);
    build(m, archive);
}

START_TEST(external_codebook_attach)
{
    model m;
    model_small(&m);
    tu_buf ab, cb;
    external_pair(&m, &ab, &cb, "codebooks/tiny-\xC3\xA9.fkvf");
    roundtrip_memory(&m); /* everything but the codebook is served unattached */
    char hx[33];
    hex16(m.cb_hash, hx);
    fkvf_reader *r = NULL, *c = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, ab.data, ab.size, FKVF_OPEN_STRICT, NULL));
    OK_R(c, fkvf_reader_open_memory(&c, cb.data, cb.size, FKVF_OPEN_STRICT, NULL));
    int ext = 0;
    uint8_t rh[16];
    const char *nm = NULL;
    OK_R(r, fkvf_reader_codebook_ref(r, &ext, rh, &nm));
    ck_assert_int_eq(ext, 1);
    ck_assert(memcmp(rh, m.cb_hash, 16) == 0);
    ck_assert_str_eq(nm, "codebooks/tiny-\xC3\xA9.fkvf");
    /* before attach: CODEBOOK, naming the hash */
    RC_R(r, fkvf_reader_codebook(r, NULL, NULL, NULL, NULL), FKVF_E_CODEBOOK);
    ck_assert_msg(strstr(fkvf_reader_message(r), hx) != NULL, "%s", fkvf_reader_message(r));
    OK_R(r, fkvf_reader_verify(r));
    /* attach the right file */
    OK_R(r, fkvf_reader_attach_codebook(r, c));
    const void *p = check_codebook(r, &m.cbs, m.cb_tables, m.cb_tables_size);
    fkvf_section_info si;
    ck_assert_uint_ne(find_section(c, FKVF_SECTION_CBK1, 0, &si), SIZE_MAX);
    ck_assert_ptr_eq(p, cb.data + si.offset); /* the codebook file's bytes */
    OK_R(r, fkvf_reader_codebook_ref(r, &ext, rh, &nm));
    ck_assert_int_eq(ext, 1);
    OK_R(r, fkvf_reader_verify(r)); /* now with the symbol check */
    for (size_t i = 0; i < m.n_st; i++)
        check_stream(r, &m.st[i], i);
    fkvf_reader_free(r);
    fkvf_reader_free(c);
    /* the name is optional */
    tu_buf ab2;
    m.cb_name = NULL;
    build(&m, &ab2);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, ab2.data, ab2.size, 0, NULL));
    OK_R(r, fkvf_reader_codebook_ref(r, &ext, rh, &nm));
    ck_assert_str_eq(nm, "");
    fkvf_reader_free(r);
    tu_buf_free(&ab2);
    tu_buf_free(&ab);
    tu_buf_free(&cb);
    model_free(&m);
}
END_TEST

/* attach must fail with CODEBOOK naming the expected hash; the archive
 * stays usable and a right file can be attached afterwards. */
static void expect_attach_fails(const tu_buf *archive, const tu_buf *cand,
                                const uint8_t expected[16], const char *needle)
{
    char hx[33];
    hex16(expected, hx);
    fkvf_reader *r = NULL, *c = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, archive->data, archive->size, 0, NULL));
    OK_R(c, fkvf_reader_open_memory(&c, cand->data, cand->size, 0, NULL));
    RC_R(r, fkvf_reader_attach_codebook(r, c), FKVF_E_CODEBOOK);
    const char *msg = fkvf_reader_message(r);
    ck_assert_msg(strstr(msg, hx) != NULL, "message \"%s\" lacks the hash %s", msg, hx);
    ck_assert_msg(strstr(msg, needle) != NULL, "message \"%s\" lacks \"%s\"", msg, needle);
    RC_R(r, fkvf_reader_codebook(r, NULL, NULL, NULL, NULL), FKVF_E_CODEBOOK);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    fkvf_reader_free(c);
}

START_TEST(external_codebook_attach_rejects)
{
    model m;
    model_small(&m);
    tu_buf ab, good;
    external_pair(&m, &ab, &good, "good.fkvf");
    /* another codebook of the same shape: a different content hash */
    size_t tn;
    uint8_t *other_t = make_tables(&m.cbs, 99, &tn);
    tu_buf other;
    write_codebook_file(&m.cbs, other_t, tn, 0, &other);
    expect_attach_fails(&ab, &other, m.cb_hash, "content hash");
    /* not a codebook file: an archive (with an embedded codebook, even) */
    model e;
    model_small(&e);
    tu_buf arch;
    build(&e, &arch);
    expect_attach_fails(&ab, &arch, m.cb_hash, "not a codebook file");
    expect_attach_fails(&ab, &ab, m.cb_hash, "not a codebook file");
    /* a codebook whose shape does not fit the descriptor (key_dim 4, not 8),
     * referred to by its hash */
    fkvf_codebook_shape bs = m.cbs;
    bs.key_dim = 4;
    uint8_t *bad_t = make_tables(&bs, 5, &tn);
    tu_buf bad;
    write_codebook_file(&bs, bad_t, tn, 0, &bad);
    model m2;
    model_small(&m2);
    tu_buf ab2, unused;
    external_pair(&m2, &ab2, &unused, "bad.fkvf");
    tu_buf_free(&ab2);
    hash_of(&bs, bad_t, tn, m2.cb_hash); /* the writer cannot know the shape behind a hash */
    build(&m2, &ab2);
    expect_attach_fails(&ab2, &bad, m2.cb_hash, "shape");
    /* a codebook with two key stages: the archive's index streams (one key
     * stage) do not match it */
    fkvf_codebook_shape ss = m.cbs;
    ss.k_stages = 2;
    uint8_t *st_t = make_tables(&ss, 6, &tn);
    tu_buf stages;
    write_codebook_file(&ss, st_t, tn, 0, &stages);
    tu_buf_free(&ab2);
    hash_of(&ss, st_t, tn, m2.cb_hash);
    build(&m2, &ab2);
    expect_attach_fails(&ab2, &stages, m2.cb_hash, "index stream");
    /* after failed attempts, the right file attaches */
    fkvf_reader *r = NULL, *c = NULL, *o = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, ab.data, ab.size, 0, NULL));
    OK_R(c, fkvf_reader_open_memory(&c, good.data, good.size, 0, NULL));
    OK_R(o, fkvf_reader_open_memory(&o, other.data, other.size, 0, NULL));
    RC_R(r, fkvf_reader_attach_codebook(r, o), FKVF_E_CODEBOOK);
    OK_R(r, fkvf_reader_attach_codebook(r, c));
    check_codebook(r, &m.cbs, m.cb_tables, m.cb_tables_size);
    fkvf_reader_free(r);
    fkvf_reader_free(o);
    fkvf_reader_free(c);

    free(other_t);
    free(bad_t);
    free(st_t);
    tu_buf_free(&ab);
    tu_buf_free(&ab2);
    tu_buf_free(&unused);
    tu_buf_free(&good);
    tu_buf_free(&other);
    tu_buf_free(&arch);
    tu_buf_free(&bad);
    tu_buf_free(&stages);
    model_free(&m2);
    model_free(&e);
    model_free(&m);
}
END_TEST

/* A handle whose open failed serves nothing: its state is partly loaded.
 * Attaching such a codebook file (here a CBK1 two bytes short, whose shape
 * was parsed before the size check failed) used to succeed and then hand
 * out a shape that its contents do not hold. */
START_TEST(failed_open_handle_serves_nothing)
{
    model m;
    model_small(&m);
    size_t cn;
    uint8_t *cbk = cbk1_bytes(&m.cbs, m.cb_tables, m.cb_tables_size, &cn);
    craft c;
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk, cn - 2);
    cr_commit(&c, 1, 0, 0, 0);
    /* an archive that refers to exactly those bytes */
    m.cb = 2;
    m.cb_name = "short.fkvf";
    m.opts.required_features |= FKVF_FEAT_EXTERNAL_CODEBOOK;
    fkvf_codebook_hash(cbk, cn - 2, m.cb_hash);
    tu_buf ab;
    build(&m, &ab);
    fkvf_reader *r = NULL, *cf = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, ab.data, ab.size, 0, NULL));
    ck_assert_int_eq(fkvf_reader_open_memory(&cf, c.b.data, c.b.size, 0, NULL), FKVF_E_TRUNCATED);
    ck_assert_ptr_nonnull(cf);
    char msg[600];
    snprintf(msg, sizeof msg, "%s", fkvf_reader_message(cf));
    ck_assert_msg(strstr(msg, "CBK1") != NULL, "%s", msg);
    RC_R(r, fkvf_reader_attach_codebook(r, cf), FKVF_E_INVALID_ARG);
    RC_R(r, fkvf_reader_codebook(r, NULL, NULL, NULL, NULL), FKVF_E_CODEBOOK);
    /* no query answers on the failed handle, and its message stays */
    fkvf_archive_info ai;
    fkvf_codebook_shape sh;
    size_t n;
    const void *p;
    ck_assert_int_eq(fkvf_reader_info(cf, &ai), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_reader_codebook(cf, &sh, &p, &n, NULL), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_reader_section_data(cf, 0, &p, &n), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_reader_meta_count(cf, &n), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_reader_verify(cf), FKVF_E_STATE);
    ck_assert_str_eq(fkvf_reader_message(cf), msg);
    fkvf_reader_free(cf);
    fkvf_reader_free(r);
    tu_buf_free(&ab);
    tu_buf_free(&c.b);
    free(cbk);
    model_free(&m);
}
END_TEST

/* An attached codebook with a smaller k than the symbols need: attach
 * succeeds (shape and stages fit), verify reports SYMBOL (spec 11.8). */
START_TEST(external_codebook_smaller_k_fails_verify)
{
    model m;
    model_small_k(&m, 32); /* symbols up to 31 */
    tu_buf ab, cb32;
    external_pair(&m, &ab, &cb32, "k32.fkvf");
    fkvf_codebook_shape s16 = m.cbs;
    s16.k = 16;
    size_t tn;
    uint8_t *t16 = make_tables(&s16, 7, &tn);
    tu_buf cb16;
    write_codebook_file(&s16, t16, tn, 0, &cb16);
    hash_of(&s16, t16, tn, m.cb_hash);
    tu_buf_free(&ab);
    build(&m, &ab);
    fkvf_reader *r = NULL, *c = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, ab.data, ab.size, 0, NULL));
    OK_R(c, fkvf_reader_open_memory(&c, cb16.data, cb16.size, 0, NULL));
    OK_R(r, fkvf_reader_verify(r)); /* k unknown yet */
    OK_R(r, fkvf_reader_attach_codebook(r, c));
    RC_R(r, fkvf_reader_verify(r), FKVF_E_SYMBOL);
    ck_assert(strstr(fkvf_reader_message(r), "k = 16") != NULL);
    fkvf_reader_free(r);
    fkvf_reader_free(c);
    free(t16);
    tu_buf_free(&ab);
    tu_buf_free(&cb32);
    tu_buf_free(&cb16);
    model_free(&m);
}
END_TEST

START_TEST(writer_refuses_codebook_misuse)
{
    static char long_id[5000];
    model m;
    model_small(&m);
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    /* index streams need the descriptor and the codebook first */
    RC_W(w, write_index_segment(&m, w, 0, 5), FKVF_E_STATE);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    RC_W(w, write_index_segment(&m, w, 0, 5), FKVF_E_STATE);
    assert_msg_names(w, "codebook");
    OK_W(w, fkvf_writer_add_token_segment(w, &m.tspec, 0, model_token_stream(&m)->sym, 10));
    /* bad codebook arguments */
    fkvf_codebook_shape s = m.cbs;
    s.k = 24;
    RC_W(w, fkvf_writer_add_codebooks(w, &s, m.cb_tables, m.cb_tables_size, 0),
         FKVF_E_INVALID_ARG);
    assert_msg_names(w, "13.1");
    s = m.cbs;
    s.key_dim = 4;
    RC_W(w, fkvf_writer_add_codebooks(w, &s, m.cb_tables, (size_t)fkvf_codebook_size(&s) - 64, 0),
         FKVF_E_INVALID_ARG);
    assert_msg_names(w, "13.7");
    s = m.cbs;
    s.n_layers = 1;
    RC_W(w, fkvf_writer_add_codebooks(w, &s, m.cb_tables, (size_t)fkvf_codebook_size(&s) - 64, 0),
         FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size - 2, 0),
         FKVF_E_INVALID_ARG);
    assert_msg_names(w, "13.2");
    RC_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size + 64, 0),
         FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_codebooks(w, &m.cbs, NULL, m.cb_tables_size, 0), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_codebooks(w, NULL, m.cb_tables, m.cb_tables_size, 0),
         FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0x80),
         FKVF_E_INVALID_ARG);
    /* centroids must be finite (spec 13.2): f16 infinity and NaN, anywhere */
    static const uint16_t nonfinite16[] = {0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF};
    for (size_t i = 0; i < sizeof nonfinite16 / sizeof nonfinite16[0]; i++) {
        uint8_t *bad = malloc(m.cb_tables_size);
        memcpy(bad, m.cb_tables, m.cb_tables_size);
        size_t at = (i * 977) % (m.cb_tables_size / 2);
        fkvf_st16(bad + 2 * at, nonfinite16[i]);
        RC_W(w, fkvf_writer_add_codebooks(w, &m.cbs, bad, m.cb_tables_size, 0),
             FKVF_E_INVALID_ARG);
        assert_msg_names(w, "not finite");
        free(bad);
    }
    /* a reference needs the EXTERNAL_CODEBOOK feature */
    RC_W(w, fkvf_writer_add_codebook_ref(w, &m.cbs, m.cb_hash, "x"), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "FKVF_FEAT_EXTERNAL_CODEBOOK");
    /* refused calls changed nothing: the codebook can still be added, once */
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    RC_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0),
         FKVF_E_STATE);
    assert_msg_names(w, "already");
    OK_W(w, write_index_segment(&m, w, 0, 5));
    OK_W(w, fkvf_writer_add_exact(w, 0, 2, m.rows, 2 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_add_exact(w, 7, 3, m.rows + 7 * m.row_bytes, 3 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_set_positions(w, 10, 5));
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);

    /* references */
    fkvf_writer_options o = m.opts;
    o.required_features |= FKVF_FEAT_EXTERNAL_CODEBOOK;
    w = new_writer(&b, &o);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    RC_W(w, fkvf_writer_add_codebook_ref(w, &m.cbs, NULL, "x"), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_codebook_ref(w, NULL, m.cb_hash, "x"), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_codebook_ref(w, &m.cbs, m.cb_hash, "bad\xFF"), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "UTF-8");
    memset(long_id, 'n', 4097);
    long_id[4097] = 0;
    RC_W(w, fkvf_writer_add_codebook_ref(w, &m.cbs, m.cb_hash, long_id), FKVF_E_INVALID_ARG);
    s = m.cbs;
    s.value_dim = 4;
    RC_W(w, fkvf_writer_add_codebook_ref(w, &s, m.cb_hash, "x"), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "13.7");
    long_id[4096] = 0; /* 4096 bytes is the maximum */
    OK_W(w, fkvf_writer_add_codebook_ref(w, &m.cbs, m.cb_hash, long_id));
    RC_W(w, fkvf_writer_add_codebook_ref(w, &m.cbs, m.cb_hash, "x"), FKVF_E_STATE);
    RC_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0),
         FKVF_E_STATE);
    /* index streams are checked against the referenced shape: its k, and
     * its stages make the group's streams (spec 11.2) */
    size_t ps, cs;
    uint16_t *codes = model_codes(&m, 0, 5, &ps, &cs);
    codes[2 * ps + 5 * cs] = 16;
    RC_W(w, fkvf_writer_add_index_segment(w, &m.ispec, 0, 5, codes, ps, cs), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "k = 16");
    codes[2 * ps + 5 * cs] = 15;
    OK_W(w, fkvf_writer_add_index_segment(w, &m.ispec, 0, 5, codes, ps, cs));
    free(codes);
    OK_W(w, fkvf_writer_add_exact(w, 0, 2, m.rows, 2 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_add_exact(w, 7, 3, m.rows + 7 * m.row_bytes, 3 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_set_positions(w, 10, 5));
    OK_W(w, fkvf_writer_finish(w));
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_stream_info si;
    OK_R(r, fkvf_reader_stream_info(r, 7, &si));
    ck_assert_uint_eq(si.id, FKVF_STREAM_ID(0, 1, 1, 1, 0));
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    fkvf_writer_free(w);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* The archive of model_small with quad 8-bit index streams (one 16-byte
 * span each, so the segment's size does not depend on symbol_count 1..16). */
static void model_small_quad8(model *m) { model_small_codec(m, 16, FKVF_PROFILE_QUAD, 8, 0); }

/* Patch the header of the STRM section of `group` in the last commit of a
 * file (byte `at` of the header set to v, 1/4/8 bytes wide), refresh its
 * checksums and the commit's; optionally set the directory key. Returns the
 * open result with its message. */
static int open_patched_strm(const tu_buf *file, uint64_t group, size_t at, unsigned width,
                             uint64_t v, int64_t new_key, char *msg, size_t msg_size)
{
    craft c;
    fkvf_dirhdr dh = cr_from_file(&c, file->data, file->size);
    size_t k = cr_find(&c, FKVF_SECTION_STRM, group);
    uint8_t *h = c.b.data + c.e[k].offset;
    if (width == 1)
        h[at] = (uint8_t)v;
    else if (width == 4)
        fkvf_st32(h + at, (uint32_t)v);
    else
        fkvf_st64(h + at, v);
    refresh_strm(c.b.data, c.e[k].offset);
    if (new_key >= 0)
        c.e[k].key = (uint64_t)new_key;
    cr_rehash(&c);
    cr_commit(&c, 1, 0, dh.n_positions, dh.n_archived);
    int rc = open_craft(&c, 0, msg, msg_size);
    tu_buf_free(&c.b);
    return rc;
}

#define EXPECT_PATCHED(file, group, at, width, v, key, want, needle)                          \
    do {                                                                                   \
        char m_[600];                                                                      \
        int rc_ = open_patched_strm(file, group, at, width, v, key, m_, sizeof m_);        \
        ck_assert_msg(rc_ == (want), "patch %s@%d=%llu: %s, want %s (%s)", #group, (int)(at), \
                      (unsigned long long)(v), fkvf_error_name(rc_), fkvf_error_name(want), m_); \
        ck_assert_msg(strstr(m_, needle) != NULL, "message \"%s\" lacks \"%s\"", m_, needle); \
    } while (0)

START_TEST(missing_index_group)
{
    /* writer: archived positions without the index streams */
    model m;
    model_small(&m);
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    OK_W(w, fkvf_writer_add_exact(w, 0, 2, m.rows, 2 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_add_exact(w, 7, 3, m.rows + 7 * m.row_bytes, 3 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_add_token_segment(w, &m.tspec, 0, model_token_stream(&m)->sym, 10));
    OK_W(w, fkvf_writer_set_positions(w, 10, 5));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    assert_msg_names(w, "11.8");
    assert_msg_names(w, "index streams");
    /* still open: add them and finish */
    OK_W(w, write_index_segment(&m, w, 0, 5));
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    tu_buf_free(&b);
    /* writer: archived positions without a codebook (spec 13.7) */
    w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_add_exact(w, 0, 2, m.rows, 2 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_add_exact(w, 7, 3, m.rows + 7 * m.row_bytes, 3 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_add_token_segment(w, &m.tspec, 0, model_token_stream(&m)->sym, 10));
    OK_W(w, fkvf_writer_set_positions(w, 10, 5));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    assert_msg_names(w, "13.7");
    fkvf_writer_free(w);
    tu_buf_free(&b);

    /* reader: the same files, built by hand from a valid one */
    build(&m, &b);
    craft c;
    fkvf_dirhdr dh = cr_from_file(&c, b.data, b.size);
    cr_drop(&c, cr_find(&c, FKVF_SECTION_STRM, FKVF_STREAM_GROUP_INDEX));
    cr_commit(&c, 1, 0, dh.n_positions, dh.n_archived);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "5 archived positions but no index streams");
    tu_buf_free(&c.b);
    /* and with n_archived = 0 (the recent window grown over them) it is valid */
    dh = cr_from_file(&c, b.data, b.size);
    cr_drop(&c, cr_find(&c, FKVF_SECTION_STRM, FKVF_STREAM_GROUP_INDEX));
    {
        uint8_t *ex = calloc(1, 64 + 5 * m.row_bytes);
        fkvf_exac_hdr eh = {2, 5, (uint8_t)m.desc.dtype};
        fkvf_exac_hdr_write(ex, &eh);
        memcpy(ex + 64, m.rows + 2 * m.row_bytes, 5 * m.row_bytes);
        cr_plain(&c, FKVF_SECTION_EXAC, FKVF_SECTION_REQUIRED, 2, ex, 64 + 5 * m.row_bytes);
        free(ex);
    }
    cr_commit(&c, 1, 0, dh.n_positions, 0);
    ck_assert_int_eq(open_craft(&c, FKVF_OPEN_STRICT, NULL, 0), FKVF_OK);
    tu_buf_free(&c.b);
    /* without CBK1 */
    dh = cr_from_file(&c, b.data, b.size);
    cr_drop(&c, cr_find(&c, FKVF_SECTION_CBK1, 0));
    cr_commit(&c, 1, 0, dh.n_positions, dh.n_archived);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "13.7");
    tu_buf_free(&c.b);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* Group-level rules of the segment header (spec 11.2, 11.6, 11.8), each on
 * an otherwise valid file with every checksum recomputed. */
START_TEST(strm_group_header_rules)
{
    model m;
    model_small_quad8(&m);
    tu_buf b;
    build(&m, &b);
    ck_assert_int_eq(try_open(b.data, b.size, FKVF_OPEN_STRICT, NULL, 0), FKVF_OK);
    const uint64_t IX = FKVF_STREAM_GROUP_INDEX, TK = FKVF_STREAM_GROUP_TOKENS;
    /* unchanged: valid */
    EXPECT_PATCHED(&b, IX, 8, 1, FKVF_PROFILE_QUAD, -1, FKVF_OK, "");
    /* unknown group key (header and directory agree) */
    EXPECT_PATCHED(&b, IX, 0, 8, 2, 2, FKVF_E_CORRUPT, "STRM.group: 2 unknown");
    EXPECT_PATCHED(&b, TK, 0, 8, UINT64_C(1) << 56, (int64_t)1 << 56, FKVF_E_CORRUPT,
                   "unknown");
    /* the header's group differs from the directory key */
    EXPECT_PATCHED(&b, TK, 0, 8, 1, 0, FKVF_E_CORRUPT, "differs from the directory key");
    /* reserved bytes 52..55 */
    EXPECT_PATCHED(&b, IX, 52, 4, 1, -1, FKVF_E_CORRUPT, "reserved");
    EXPECT_PATCHED(&b, TK, 55, 1, 0x80, -1, FKVF_E_CORRUPT, "reserved");
    /* stage counts of the index group: 0..16 each, at least one */
    EXPECT_PATCHED(&b, IX, 10, 1, 17, -1, FKVF_E_CORRUPT, "stages");
    EXPECT_PATCHED(&b, IX, 11, 1, 17, -1, FKVF_E_CORRUPT, "stages");
    {
        craft c; /* both 0 */
        fkvf_dirhdr dh = cr_from_file(&c, b.data, b.size);
        size_t k = cr_find(&c, FKVF_SECTION_STRM, IX);
        c.b.data[c.e[k].offset + 10] = 0;
        c.b.data[c.e[k].offset + 11] = 0;
        refresh_strm(c.b.data, c.e[k].offset);
        cr_rehash(&c);
        cr_commit(&c, 1, 0, dh.n_positions, dh.n_archived);
        EXPECT_OPEN(&c, FKVF_E_CORRUPT, "0 key and 0 value stages");
        tu_buf_free(&c.b);
    }
    /* 2 + 1 stages: n_streams 8 does not match the descriptor (spec 11.2) */
    EXPECT_PATCHED(&b, IX, 10, 1, 2, -1, FKVF_E_CORRUPT, "(2 + 1) stages need 12");
    /* stage counts that keep n_streams (2 x 2 x 2) but differ from the
     * codebook's 1 + 1 (spec 11.8): CORRUPT with an embedded codebook */
    {
        craft c;
        fkvf_dirhdr dh = cr_from_file(&c, b.data, b.size);
        size_t k = cr_find(&c, FKVF_SECTION_STRM, IX);
        c.b.data[c.e[k].offset + 10] = 2;
        c.b.data[c.e[k].offset + 11] = 0;
        refresh_strm(c.b.data, c.e[k].offset);
        cr_rehash(&c);
        cr_commit(&c, 1, 0, dh.n_positions, dh.n_archived);
        EXPECT_OPEN(&c, FKVF_E_CORRUPT, "the index streams have 2 key and 0 value stages, the "
                                        "codebook 1 and 1");
        tu_buf_free(&c.b);
    }
    /* the token group: no stages, one stream */
    EXPECT_PATCHED(&b, TK, 10, 1, 1, -1, FKVF_E_CORRUPT, "token group");
    EXPECT_PATCHED(&b, TK, 48, 4, 2, -1, FKVF_E_CORRUPT, "token group");
    EXPECT_PATCHED(&b, TK, 48, 4, 0, -1, FKVF_E_CORRUPT, "token group");
    EXPECT_PATCHED(&b, IX, 48, 4, 0, -1, FKVF_E_CORRUPT, "n_streams");
    /* first_symbol not a multiple of the alignment unit: 16 for b = 8, 4
     * for b = 32 */
    EXPECT_PATCHED(&b, IX, 16, 8, 8, -1, FKVF_E_CORRUPT, "alignment unit 16");
    EXPECT_PATCHED(&b, TK, 16, 8, 2, -1, FKVF_E_CORRUPT, "alignment unit 4");
    /* aligned, but beyond the (empty) streams */
    EXPECT_PATCHED(&b, IX, 16, 8, 16, -1, FKVF_E_CORRUPT, "beyond the streams' length 0");
    EXPECT_PATCHED(&b, TK, 16, 8, 4, -1, FKVF_E_CORRUPT, "beyond");
    /* group lengths must equal n_archived / n_positions (same size: one span) */
    EXPECT_PATCHED(&b, IX, 24, 8, 4, -1, FKVF_E_CORRUPT, "index streams have 4 symbols");
    EXPECT_PATCHED(&b, IX, 24, 8, 16, -1, FKVF_E_CORRUPT, "index streams have 16 symbols");
    /* a size that the header does not imply */
    EXPECT_PATCHED(&b, IX, 24, 8, 17, -1, FKVF_E_TRUNCATED, "STRM");
    EXPECT_PATCHED(&b, TK, 24, 8, 2, -1, FKVF_E_CORRUPT, "STRM");
    /* n_streams must be n_layers x n_kv_heads x stages: 7 (with a section of
     * 7 streams, so that its size is right) */
    {
        craft c;
        fkvf_dirhdr dh = cr_from_file(&c, b.data, b.size);
        size_t k = cr_find(&c, FKVF_SECTION_STRM, IX);
        fkvf_strm_hdr h = strm_hdr_at(c.b.data + c.e[k].offset);
        ck_assert_uint_eq(h.n_streams, 8);
        cr_drop(&c, k);
        h.n_streams = 7;
        cr_strm(&c, h, NULL);
        cr_commit(&c, 1, 0, dh.n_positions, dh.n_archived);
        EXPECT_OPEN(&c, FKVF_E_CORRUPT, "STRM.n_streams 7: 2 layers x 2 heads x (1 + 1) stages "
                                        "need 8");
        tu_buf_free(&c.b);
        /* and 16 = 2 x 2 x (2 + 2), with the codebook's 1 + 1: stages */
        dh = cr_from_file(&c, b.data, b.size);
        k = cr_find(&c, FKVF_SECTION_STRM, IX);
        cr_drop(&c, k);
        h.n_streams = 16;
        h.k_stages = h.v_stages = 2;
        cr_strm(&c, h, NULL);
        cr_commit(&c, 1, 0, dh.n_positions, dh.n_archived);
        EXPECT_OPEN(&c, FKVF_E_CORRUPT, "stages");
        tu_buf_free(&c.b);
    }
    /* the index group in a file without DESC (a codebook file) */
    {
        craft c;
        cr_header(&c, 1, 0, 0, 0);
        size_t cn;
        uint8_t *cbk = cbk1_bytes(&m.cbs, m.cb_tables, m.cb_tables_size, &cn);
        cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk, cn);
        free(cbk);
        fkvf_strm_hdr h;
        memset(&h, 0, sizeof h);
        h.group = IX;
        h.profile = FKVF_PROFILE_QUAD;
        h.bits = 8;
        h.k_stages = h.v_stages = 1;
        h.n_streams = 8;
        h.block_size = 4096;
        cr_strm(&c, h, NULL);
        cr_commit(&c, 1, 0, 0, 0);
        EXPECT_OPEN(&c, FKVF_E_CORRUPT, "n_streams");
        tu_buf_free(&c.b);
    }
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* The raw route: a valid file with a k = 32 codebook whose CBK1 header is
 * then patched to k = 16 (and f32, so the size still fits the shape). */
START_TEST(index_symbol_beyond_k_fails_verify)
{
    model m;
    model_small_k(&m, 32);
    int has_big = 0;
    for (size_t i = 0; i < m.n_st; i++)
        if ((m.st[i].id >> 56) == FKVF_STREAM_KIND_INDEX)
            for (size_t t = 0; t < m.st[i].n; t++)
                has_big |= m.st[i].sym[t] >= 16;
    ck_assert(has_big);
    tu_buf b;
    build(&m, &b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    OK_R(r, fkvf_reader_verify(r));
    fkvf_section_info si;
    ck_assert_uint_ne(find_section(r, FKVF_SECTION_CBK1, 0, &si), SIZE_MAX);
    fkvf_reader_free(r);
    ck_assert_uint_eq(fkvf_ld32(b.data + si.offset + 16), 32);
    fkvf_st32(b.data + si.offset + 16, 16);
    b.data[si.offset + 22] = FKVF_DTYPE_F32;
    refresh_last_commit(b.data, b.size);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_codebook_shape s;
    OK_R(r, fkvf_reader_codebook(r, &s, NULL, NULL, NULL));
    ck_assert_uint_eq(s.k, 16);
    ck_assert_int_eq(s.dtype, FKVF_DTYPE_F32);
    RC_R(r, fkvf_reader_verify(r), FKVF_E_SYMBOL);
    ck_assert(strstr(fkvf_reader_message(r), "k = 16") != NULL);
    ck_assert(strstr(fkvf_reader_message(r), "11.8") != NULL);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(second_codebook_section_is_corrupt)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    size_t cn;
    uint8_t *cbk = cbk1_bytes(&m.cbs, m.cb_tables, m.cb_tables_size, &cn);
    /* a second CBK1 in commit 2 */
    craft c;
    cr_append(&c, b.data, b.size);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk, cn);
    cr_commit(&c, 2, b.size - 64, m.n_positions, m.n_archived);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "second codebook");
    tu_buf_free(&c.b);
    /* two in one commit */
    fkvf_desc d = m.desc;
    size_t dn;
    uint8_t *dp = desc_bytes(&d, &dn);
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED, 0, dp, dn);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk, cn);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL)); /* one is fine */
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED, 0, dp, dn);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk, cn);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk, cn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "13.7");
    tu_buf_free(&c.b);
    /* CBK1 and CBRF */
    size_t rn;
    uint8_t h[16];
    hash_of(&m.cbs, m.cb_tables, m.cb_tables_size, h);
    uint8_t *ref = cbrf_bytes(h, "x", &rn);
    cr_header(&c, 1, 0, FKVF_FEAT_EXTERNAL_CODEBOOK, 0);
    cr_plain(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED, 0, dp, dn);
    cr_plain(&c, FKVF_SECTION_CBRF, FKVF_SECTION_REQUIRED, 0, ref, rn);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk, cn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "second codebook");
    tu_buf_free(&c.b);
    free(ref);
    free(dp);
    free(cbk);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(desc_placement_rules)
{
    model m;
    model_small(&m);
    size_t cn, dn;
    uint8_t *cbk = cbk1_bytes(&m.cbs, m.cb_tables, m.cb_tables_size, &cn);
    uint8_t *dp = desc_bytes(&m.desc, &dn);
    /* commit 1 is a codebook file; commit 2 adds DESC (spec 8.3) */
    craft c;
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk, cn);
    cr_commit(&c, 1, 0, 0, 0);
    size_t s1 = c.b.size;
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, s1, FKVF_OPEN_STRICT, NULL));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_int_eq(ai.has_desc, 0);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    cr_plain(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED, 0, dp, dn);
    cr_commit(&c, 2, s1 - 64, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "commit 1");
    tu_buf_free(&c.b);
    /* DESC with key 1 */
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED, 1, dp, dn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "key");
    tu_buf_free(&c.b);
    /* a second DESC in commit 2 */
    tu_buf b;
    build(&m, &b);
    cr_append(&c, b.data, b.size);
    cr_plain(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED, 0, dp, dn);
    cr_commit(&c, 2, b.size - 64, m.n_positions, m.n_archived);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "second DESC");
    tu_buf_free(&c.b);
    tu_buf_free(&b);
    free(cbk);
    free(dp);
    model_free(&m);
}
END_TEST

START_TEST(vtxs_twice_for_one_n_is_corrupt)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_section_info si;
    ck_assert_uint_ne(find_section(r, FKVF_SECTION_VTXS, 16, &si), SIZE_MAX);
    fkvf_reader_free(r);
    const uint8_t *vt = b.data + si.offset;
    size_t vn = (size_t)si.size;
    /* again in commit 2 */
    craft c;
    cr_append(&c, b.data, b.size);
    cr_plain(&c, FKVF_SECTION_VTXS, FKVF_SECTION_REQUIRED, 16, vt, vn);
    cr_commit(&c, 2, b.size - 64, m.n_positions, m.n_archived);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "second VTXS");
    tu_buf_free(&c.b);
    /* twice in one commit */
    cr_header(&c, 1, 0, FKVF_FEAT_NGON, 0);
    cr_desc(&c, 0);
    cr_plain(&c, FKVF_SECTION_VTXS, FKVF_SECTION_REQUIRED, 16, vt, vn);
    cr_plain(&c, FKVF_SECTION_VTXS, FKVF_SECTION_REQUIRED, 16, vt, vn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "10.3");
    tu_buf_free(&c.b);
    /* once, unused by any stream: allowed */
    cr_header(&c, 1, 0, FKVF_FEAT_NGON, 0);
    cr_desc(&c, 0);
    cr_plain(&c, FKVF_SECTION_VTXS, FKVF_SECTION_REQUIRED, 16, vt, vn);
    cr_commit(&c, 1, 0, 0, 0);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* VTXS bytes of the libm table for N (spec 10.1). */
static uint8_t *vtxs_bytes(uint32_t n, double *r, uint32_t *span, size_t *size)
{
    double *xy = calloc(2 * (size_t)n, sizeof(double));
    ck_assert_ptr_nonnull(xy);
    fkvf_ngon_make_vertices(n, xy);
    *r = fkvf_ngon_rmax_table(n, xy);
    *span = fkvf_ngon_max_span(*r);
    *size = 8 + 16 * (size_t)n;
    uint8_t *p = calloc(1, *size);
    ck_assert_ptr_nonnull(p);
    fkvf_st32(p, n);
    for (size_t k = 0; k < 2 * (size_t)n; k++)
        fkvf_stf64(p + 8 + 8 * k, xy[k]);
    free(xy);
    return p;
}

/* An empty ngon token stream segment (64 bytes) for the next section of c. */
static void cr_empty_ngon_tokens(craft *c, uint32_t n, double r, uint32_t span)
{
    fkvf_strm_hdr h;
    memset(&h, 0, sizeof h);
    h.group = FKVF_STREAM_GROUP_TOKENS;
    h.n_streams = 1;
    h.profile = FKVF_PROFILE_NGON;
    h.alphabet = n;
    h.span_symbols = span;
    h.block_size = 4096;
    h.r = r;
    uint8_t hdr[64];
    fkvf_strm_hdr_write(hdr, &h, cr_dir_off(c));
    cr_plain(c, FKVF_SECTION_STRM, FKVF_SECTION_REQUIRED, FKVF_STREAM_GROUP_TOKENS, hdr, 64);
}

/* Spec 10.3: an ngon segment needs a VTXS for N in its own commit or an
 * earlier one; one added by a later commit does not count (it did). */
START_TEST(vtxs_in_a_later_commit_does_not_count)
{
    double r;
    uint32_t span;
    size_t vn;
    uint8_t *vt = vtxs_bytes(16, &r, &span, &vn);
    craft c;
    /* VTXS after the segment in the same commit: fine */
    cr_header(&c, 1, 0, FKVF_FEAT_NGON, 0);
    cr_desc(&c, 0);
    cr_empty_ngon_tokens(&c, 16, r, span);
    cr_plain(&c, FKVF_SECTION_VTXS, FKVF_SECTION_REQUIRED, 16, vt, vn);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *rd = NULL;
    OK_R(rd, fkvf_reader_open_memory(&rd, c.b.data, c.b.size, FKVF_OPEN_STRICT, NULL));
    OK_R(rd, fkvf_reader_verify(rd));
    fkvf_reader_free(rd);
    tu_buf_free(&c.b);
    /* VTXS only in commit 2, the segment in commit 1 */
    cr_header(&c, 1, 0, FKVF_FEAT_NGON, 0);
    cr_desc(&c, 0);
    cr_empty_ngon_tokens(&c, 16, r, span);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "VTXS"); /* commit 1 alone */
    uint64_t t1 = c.b.size - 64;
    cr_plain(&c, FKVF_SECTION_VTXS, FKVF_SECTION_REQUIRED, 16, vt, vn);
    cr_commit(&c, 2, t1, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "10.3");
    tu_buf_free(&c.b);
    free(vt);
}
END_TEST

/* Full verification parses every VTXS, also one no stream uses (spec
 * 1.3.3, 10.1, 10.2); open may leave it alone (spec 7.5). */
START_TEST(verify_checks_unused_vertex_tables)
{
    double r;
    uint32_t span;
    size_t vn;
    uint8_t *vt = vtxs_bytes(16, &r, &span, &vn);
    const struct {
        size_t at;      /* u16 to store (SIZE_MAX: none): the top of an f64 */
        uint16_t value;
        size_t cut;     /* bytes removed from the end */
        int want;
        const char *needle;
    } cases[] = {
        {SIZE_MAX, 0, 0, FKVF_OK, ""},
        {8 + 8 + 6, 0x3ff0, 0, FKVF_E_CORRUPT, "10.2"},      /* V(0).y = 1.0 */
        {8 + 16 * 3 + 6, 0x4010, 0, FKVF_E_CORRUPT, "10.2"}, /* V(3).x about 4: |V|^2 off */
        {8 + 16 * 5 + 6, 0x7ff8, 0, FKVF_E_CORRUPT, "10.2"}, /* V(5).x NaN */
        {SIZE_MAX, 0, 16, FKVF_E_TRUNCATED, "10.1"},
        {4, 1, 0, FKVF_E_CORRUPT, "10.1"},                   /* reserved field */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *p = malloc(vn);
        memcpy(p, vt, vn);
        if (cases[i].at != SIZE_MAX)
            fkvf_st16(p + cases[i].at, cases[i].value);
        craft c;
        cr_header(&c, 1, 0, FKVF_FEAT_NGON, 0);
        cr_desc(&c, 0);
        cr_plain(&c, FKVF_SECTION_VTXS, FKVF_SECTION_REQUIRED, 16, p, vn - cases[i].cut);
        cr_commit(&c, 1, 0, 0, 0);
        fkvf_reader *rd = NULL;
        OK_R(rd, fkvf_reader_open_memory(&rd, c.b.data, c.b.size, 0, NULL));
        int rc = fkvf_reader_verify(rd);
        ck_assert_msg(rc == cases[i].want, "case %zu: %s (%s)", i, fkvf_error_name(rc),
                      fkvf_reader_message(rd));
        ck_assert_msg(strstr(fkvf_reader_message(rd), cases[i].needle) != NULL, "case %zu: %s",
                      i, fkvf_reader_message(rd));
        fkvf_reader_free(rd);
        tu_buf_free(&c.b);
        free(p);
    }
    free(vt);
}
END_TEST

/* A quad token-stream segment of b = 8 for the next section of c; `pad`
 * goes into the first unused data byte (0 keeps the segment valid). */
static void cr_quad_tokens(craft *c, uint64_t first, const uint8_t *sym, uint64_t count,
                           uint8_t pad)
{
    fkvf_strm_hdr h;
    memset(&h, 0, sizeof h);
    h.group = FKVF_STREAM_GROUP_TOKENS;
    h.n_streams = 1;
    h.profile = FKVF_PROFILE_QUAD;
    h.bits = 8;
    h.first_symbol = first;
    h.symbol_count = count;
    h.block_size = 4096;
    ck_assert_int_eq(fkvf_strm_hdr_derive(&h), FKVF_OK);
    ck_assert_uint_gt(h.data_bytes, count);
    uint8_t *p = calloc(1, (size_t)h.section_size);
    ck_assert_ptr_nonnull(p);
    memcpy(p + h.data_off, sym, (size_t)count);
    p[h.data_off + count] = pad;
    uint64_t off = cr_dir_off(c);
    fkvf_strm_hdr_write(p, &h, off);
    ck_assert_uint_eq(h.n_blocks, 1);
    fkvf_st64(p + 64, fkvf_xxh3_64(p + h.data_off, (size_t)h.data_bytes, off + h.data_off));
    cr_plain(c, FKVF_SECTION_STRM, FKVF_SECTION_REQUIRED, FKVF_STREAM_GROUP_TOKENS, p,
             (size_t)h.section_size);
    free(p);
}

/* Full verification covers stream segments that later segments replaced
 * (spec 1.3.3: every stream block and padding bit of the committed part);
 * it used to check only the effective ones. */
START_TEST(verify_checks_replaced_segments)
{
    static const uint8_t tok[2] = {7, 9};
    uint8_t rows[64 + 2 * 16];
    memset(rows, 0, sizeof rows);
    fkvf_exac_hdr eh = {0, 2, FKVF_DTYPE_F16};
    fkvf_exac_hdr_write(rows, &eh);
    for (int bad = 0; bad < 2; bad++) {
        craft c;
        cr_header(&c, 1, 0, 0, 0);
        cr_desc(&c, 0);
        cr_plain(&c, FKVF_SECTION_EXAC, FKVF_SECTION_REQUIRED, 0, rows, sizeof rows);
        cr_quad_tokens(&c, 0, tok, 2, bad ? 0x40 : 0); /* non-zero unused bits */
        cr_commit(&c, 1, 0, 2, 0);
        uint64_t t1 = c.b.size - 64;
        cr_quad_tokens(&c, 0, tok, 2, 0); /* replaces the whole first segment */
        cr_commit(&c, 2, t1, 2, 0);
        fkvf_reader *r = NULL;
        OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, FKVF_OPEN_STRICT, NULL));
        fkvf_stream_info si;
        OK_R(r, fkvf_reader_stream_info(r, 0, &si));
        ck_assert_uint_eq(si.n_segments, 1);
        RC_R(r, fkvf_reader_verify(r), bad ? FKVF_E_PADDING : FKVF_OK);
        if (bad)
            ck_assert_msg(strstr(fkvf_reader_message(r), "11.7") != NULL, "%s",
                          fkvf_reader_message(r));
        fkvf_reader_free(r);
        tu_buf_free(&c.b);
    }
}
END_TEST

/* Clear REQUIRED on one entry of the last directory; open still works
 * (readers process known types whatever the flag), verify is CORRUPT. */
static void expect_unflagged_fails_verify(const tu_buf *file, uint32_t type, const char *name)
{
    uint8_t *c = malloc(file->size);
    memcpy(c, file->data, file->size);
    layout l = layout_of(c, file->size);
    uint32_t n = fkvf_ld32(c + l.dir_off + 4);
    int found = 0;
    for (uint32_t k = 0; k < n && !found; k++) {
        uint8_t *e = c + l.dir_off + 64 + 64 * (size_t)k;
        if (fkvf_ld32(e) == type) {
            ck_assert_uint_eq(fkvf_ld32(e + 4) & FKVF_SECTION_REQUIRED, FKVF_SECTION_REQUIRED);
            fkvf_st32(e + 4, fkvf_ld32(e + 4) & ~FKVF_SECTION_REQUIRED);
            found = 1;
        }
    }
    ck_assert_msg(found, "no %s section", name);
    refresh_last_commit(c, file->size);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c, file->size, 0, NULL));
    RC_R(r, fkvf_reader_verify(r), FKVF_E_CORRUPT);
    const char *msg = fkvf_reader_message(r);
    ck_assert_msg(strstr(msg, name) != NULL && strstr(msg, "REQUIRED") != NULL, "%s", msg);
    fkvf_reader_free(r);
    free(c);
}

START_TEST(unflagged_known_sections_fail_verify)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    expect_unflagged_fails_verify(&b, FKVF_SECTION_STRM, "STRM");
    expect_unflagged_fails_verify(&b, FKVF_SECTION_DESC, "DESC");
    expect_unflagged_fails_verify(&b, FKVF_SECTION_VTXS, "VTXS");
    expect_unflagged_fails_verify(&b, FKVF_SECTION_CBK1, "CBK1");
    expect_unflagged_fails_verify(&b, FKVF_SECTION_EXAC, "EXAC");
    /* META with REQUIRED set is fine (writers SHOULD leave it clear) */
    uint8_t *c = malloc(b.size);
    memcpy(c, b.data, b.size);
    layout l = layout_of(c, b.size);
    uint32_t n = fkvf_ld32(c + l.dir_off + 4);
    for (uint32_t k = 0; k < n; k++) {
        uint8_t *e = c + l.dir_off + 64 + 64 * (size_t)k;
        if (fkvf_ld32(e) == FKVF_SECTION_META)
            fkvf_st32(e + 4, FKVF_SECTION_REQUIRED);
    }
    refresh_last_commit(c, b.size);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c, b.size, 0, NULL));
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    free(c);
    tu_buf_free(&b);
    /* CBRF */
    tu_buf cb;
    external_pair(&m, &b, &cb, "x");
    expect_unflagged_fails_verify(&b, FKVF_SECTION_CBRF, "CBRF");
    tu_buf_free(&cb);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(codebook_section_fields)
{
    fkvf_desc d;
    simple_desc(&d); /* 1 layer, 1 head, dims 4/4 */
    fkvf_codebook_shape s;
    shape_for(&s, &d, 16, 1, 1, FKVF_DTYPE_F16, 0);
    size_t tn, cn, rn;
    uint8_t *t = make_tables(&s, 1, &tn);
    uint8_t *cbk = cbk1_bytes(&s, t, tn, &cn);
    uint8_t h[16];
    fkvf_codebook_hash(cbk, cn, h);
    uint8_t *ref = cbrf_bytes(h, "name", &rn);
    craft c;
    /* baseline */
    cr_header(&c, 1, 0, 0, 0);
    cr_desc(&c, 0);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk, cn);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    check_codebook(r, &s, t, tn);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&c.b);

    /* CBK1 header fields and size (spec 13.1-13.2, 13.7) */
    const struct {
        size_t at;     /* byte to change, or SIZE_MAX: size change only */
        uint8_t value;
        long delta;    /* bytes added to / removed from the section */
        int want;
        const char *needle;
    } cases[] = {
        {30, 1, 0, FKVF_E_CORRUPT, "reserved"},
        {63, 1, 0, FKVF_E_CORRUPT, "reserved"},
        {16, 24, 0, FKVF_E_CORRUPT, "shape"},        /* k = 24 */
        {22, FKVF_DTYPE_BF16, 0, FKVF_E_CORRUPT, "shape"},
        {23, 2, 0, FKVF_E_CORRUPT, "shape"},          /* pooled 2 */
        {20, 17, 0, FKVF_E_CORRUPT, "shape"},         /* k_stages 17 */
        {SIZE_MAX, 0, -2, FKVF_E_TRUNCATED, "13.2"},
        {SIZE_MAX, 0, 2, FKVF_E_CORRUPT, "13.2"},
        {SIZE_MAX, 0, -(long)(cn - 40), FKVF_E_TRUNCATED, "header"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *p = malloc(cn + 2);
        memcpy(p, cbk, cn);
        p[cn] = p[cn + 1] = 0;
        if (cases[i].at != SIZE_MAX)
            p[cases[i].at] = cases[i].value;
        cr_header(&c, 1, 0, 0, 0);
        cr_desc(&c, 0);
        cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, p,
                 (size_t)((long)cn + cases[i].delta));
        cr_commit(&c, 1, 0, 0, 0);
        char msg[600];
        int rc = open_craft(&c, 0, msg, sizeof msg);
        ck_assert_msg(rc == cases[i].want, "case %zu: %s (%s)", i, fkvf_error_name(rc), msg);
        ck_assert_msg(strstr(msg, cases[i].needle) != NULL, "case %zu: %s", i, msg);
        tu_buf_free(&c.b);
        free(p);
    }
    /* a valid shape that does not match the descriptor: two layers */
    fkvf_codebook_shape s2 = s;
    s2.n_layers = 2;
    size_t tn2, cn2;
    uint8_t *t2 = make_tables(&s2, 2, &tn2);
    uint8_t *cbk2 = cbk1_bytes(&s2, t2, tn2, &cn2);
    cr_header(&c, 1, 0, 0, 0);
    cr_desc(&c, 0);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk2, cn2);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "does not match");
    tu_buf_free(&c.b);
    /* pooled with one head matches any head count */
    s2 = s;
    s2.pooled = 1;
    free(cbk2);
    cbk2 = cbk1_bytes(&s2, t, tn, &cn2);
    cr_header(&c, 1, 0, 0, 0);
    cr_desc(&c, 0);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk2, cn2);
    cr_commit(&c, 1, 0, 0, 0);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    check_codebook(r, &s2, t, tn);
    fkvf_reader_free(r);
    tu_buf_free(&c.b);

    /* CBRF fields (spec 13.5) */
    cr_header(&c, 1, 0, FKVF_FEAT_EXTERNAL_CODEBOOK, 0);
    cr_desc(&c, 0);
    cr_plain(&c, FKVF_SECTION_CBRF, FKVF_SECTION_REQUIRED, 0, ref, rn);
    cr_commit(&c, 1, 0, 0, 0);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    int ext;
    const char *nm;
    uint8_t rh[16];
    OK_R(r, fkvf_reader_codebook_ref(r, &ext, rh, &nm));
    ck_assert_int_eq(ext, 1);
    ck_assert_str_eq(nm, "name");
    ck_assert(memcmp(rh, h, 16) == 0);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    const struct {
        size_t at;
        uint8_t value;
        long delta;
        int want;
        const char *needle;
    } rcases[] = {
        {24, 0xFF, 0, FKVF_E_CORRUPT, "UTF-8"},
        {20, 1, 0, FKVF_E_CORRUPT, "reserved"},
        {SIZE_MAX, 0, -1, FKVF_E_TRUNCATED, "13.5"},
        {SIZE_MAX, 0, 1, FKVF_E_CORRUPT, "13.5"},
        {SIZE_MAX, 0, -(long)rn + 10, FKVF_E_TRUNCATED, "13.5"},
        {17, 0x10, 0, FKVF_E_LIMIT, "name_len"}, /* name_len 4096 + 4 */
    };
    for (size_t i = 0; i < sizeof rcases / sizeof rcases[0]; i++) {
        uint8_t *p = calloc(1, rn + 2);
        memcpy(p, ref, rn);
        if (rcases[i].at != SIZE_MAX)
            p[rcases[i].at] = rcases[i].value;
        cr_header(&c, 1, 0, FKVF_FEAT_EXTERNAL_CODEBOOK, 0);
        cr_desc(&c, 0);
        cr_plain(&c, FKVF_SECTION_CBRF, FKVF_SECTION_REQUIRED, 0, p,
                 (size_t)((long)rn + rcases[i].delta));
        cr_commit(&c, 1, 0, 0, 0);
        char msg[600];
        int rc = open_craft(&c, 0, msg, sizeof msg);
        ck_assert_msg(rc == rcases[i].want, "CBRF case %zu: %s (%s)", i, fkvf_error_name(rc),
                      msg);
        ck_assert_msg(strstr(msg, rcases[i].needle) != NULL, "CBRF case %zu: %s", i, msg);
        tu_buf_free(&c.b);
        free(p);
    }
    /* CBRF without the header's EXTERNAL_CODEBOOK bit (spec 3.3) */
    cr_header(&c, 1, 0, 0, 0);
    cr_desc(&c, 0);
    cr_plain(&c, FKVF_SECTION_CBRF, FKVF_SECTION_REQUIRED, 0, ref, rn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "EXTERNAL_CODEBOOK");
    tu_buf_free(&c.b);
    /* keys of META, CBK1, CBRF must be 0 (spec 4.3) */
    cr_header(&c, 1, 0, 0, 0);
    cr_desc(&c, 0);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 1, cbk, cn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "key");
    tu_buf_free(&c.b);
    cr_header(&c, 1, 0, FKVF_FEAT_EXTERNAL_CODEBOOK, 0);
    cr_desc(&c, 0);
    cr_plain(&c, FKVF_SECTION_CBRF, FKVF_SECTION_REQUIRED, 2, ref, rn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "key");
    tu_buf_free(&c.b);
    mbuild mb;
    memset(&mb, 0, sizeof mb);
    mb_u64(&mb, "a", 1);
    cr_header(&c, 1, 0, 0, 0);
    cr_desc(&c, 0);
    cr_plain(&c, FKVF_SECTION_META, 0, 3, mb.b.data, mb.b.size);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "META key");
    tu_buf_free(&c.b);
    tu_buf_free(&mb.b);
    free(cbk2);
    free(t2);
    free(ref);
    free(cbk);
    free(t);
}
END_TEST

/* Spec 13.2, 15: a CBK1 header whose fields are all in range but whose
 * tables would exceed 2^48 bytes is LIMIT (it was reported as CORRUPT). */
START_TEST(cbk1_size_beyond_limit_is_limit)
{
    fkvf_codebook_shape big = {1024, 1024, 16384, 16384, 4096, 16, 16, FKVF_DTYPE_F32, 0, NULL};
    uint8_t hdr[64];
    fkvf_cbk1_hdr_write(hdr, &big);
    craft c;
    cr_header(&c, 1, 0, 0, 0);
    cr_desc(&c, 0);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, hdr, sizeof hdr);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_LIMIT, "2^48");
    tu_buf_free(&c.b);
    /* one field out of range is still CORRUPT */
    big.k = 8192;
    fkvf_cbk1_hdr_write(hdr, &big);
    cr_header(&c, 1, 0, 0, 0);
    cr_desc(&c, 0);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, hdr, sizeof hdr);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "shape");
    tu_buf_free(&c.b);
}
END_TEST

/* Spec 13.4: a file without DESC must be a codebook file. */
START_TEST(crafted_file_without_desc)
{
    fkvf_desc d;
    simple_desc(&d);
    fkvf_codebook_shape s;
    shape_for(&s, &d, 16, 1, 0, FKVF_DTYPE_F16, 0);
    size_t tn, cn;
    uint8_t *t = make_tables(&s, 3, &tn);
    uint8_t *cbk = cbk1_bytes(&s, t, tn, &cn);
    craft c;
    /* nothing but an unknown optional section */
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, XTRA, 0, 0, "abc", 3);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "13.4");
    tu_buf_free(&c.b);
    /* metadata only */
    mbuild mb;
    memset(&mb, 0, sizeof mb);
    mb_u64(&mb, "a", 1);
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, FKVF_SECTION_META, 0, 0, mb.b.data, mb.b.size);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "13.4");
    tu_buf_free(&c.b);
    /* a codebook file: CBK1 and META */
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk, cn);
    cr_plain(&c, FKVF_SECTION_META, 0, 0, mb.b.data, mb.b.size);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, FKVF_OPEN_STRICT, NULL));
    OK_R(r, fkvf_reader_verify(r));
    check_codebook(r, &s, t, tn);
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    /* ... with positions */
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk, cn);
    cr_commit(&c, 1, 0, 1, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "13.4");
    tu_buf_free(&c.b);
    /* ... with exact rows */
    uint8_t ex[64 + 32];
    memset(ex, 0, sizeof ex);
    fkvf_exac_hdr eh = {0, 1, FKVF_DTYPE_F16};
    fkvf_exac_hdr_write(ex, &eh);
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cbk, cn);
    cr_plain(&c, FKVF_SECTION_EXAC, FKVF_SECTION_REQUIRED, 0, ex, sizeof ex);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "DESC");
    tu_buf_free(&c.b);
    /* ... with a CBRF instead of the CBK1 */
    uint8_t h[16] = {0};
    size_t rn;
    uint8_t *ref = cbrf_bytes(h, "", &rn);
    cr_header(&c, 1, 0, FKVF_FEAT_EXTERNAL_CODEBOOK, 0);
    cr_plain(&c, FKVF_SECTION_CBRF, FKVF_SECTION_REQUIRED, 0, ref, rn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "13.4");
    tu_buf_free(&c.b);
    free(ref);
    tu_buf_free(&mb.b);
    free(cbk);
    free(t);
}
END_TEST

/* Spec 4.2, 4.7, 15: sizes over 2^48 are LIMIT, before bounds; DIRC is
 * never a section. */
START_TEST(directory_entry_limits)
{
    static const struct {
        uint64_t offset_add, stored, size;
        uint32_t flags;
        int want;
    } cases[] = {
        {0, (UINT64_C(1) << 48) + 1, (UINT64_C(1) << 48) + 1, 0, FKVF_E_LIMIT},
        {0, UINT64_MAX, UINT64_MAX, 0, FKVF_E_LIMIT},
        {UINT64_C(1) << 40, UINT64_MAX - 63, UINT64_MAX - 63, 0, FKVF_E_LIMIT},
        {0, 64, (UINT64_C(1) << 48) + 1, FKVF_SECTION_DEFLATE, FKVF_E_LIMIT},
        {0, UINT64_C(1) << 48, UINT64_C(1) << 48, 0, FKVF_E_BOUNDS},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        craft c;
        craft_base(&c, FKVF_FEAT_DEFLATE);
        c.e[1].offset += cases[i].offset_add;
        c.e[1].stored_size = cases[i].stored;
        c.e[1].size = cases[i].size;
        c.e[1].flags = cases[i].flags;
        cr_commit(&c, 1, 0, 0, 0);
        char msg[600];
        int rc = open_craft(&c, 0, msg, sizeof msg);
        ck_assert_msg(rc == cases[i].want, "case %zu: %s (%s)", i, fkvf_error_name(rc), msg);
        if (rc == FKVF_E_LIMIT)
            ck_assert_msg(strstr(msg, "2^48") != NULL, "case %zu: %s", i, msg);
        tu_buf_free(&c.b);
    }
    craft c;
    craft_base(&c, 0);
    c.e[1].type = FKVF_SECTION_DIRC;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "never listed");
    tu_buf_free(&c.b);
}
END_TEST

/* Spec 6.2 steps 4, 7 and 8. */
START_TEST(trailer_limits)
{
    craft c;
    craft_base(&c, 0);
    cr_commit(&c, (UINT64_C(1) << 24) + 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_LIMIT, "2^24");
    tu_buf_free(&c.b);
    craft_base(&c, 0);
    cr_commit(&c, UINT64_MAX, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_LIMIT, "commit_seq");
    tu_buf_free(&c.b);
    /* 2^24 itself passes step 4 and then fails its back link */
    craft_base(&c, 0);
    cr_commit(&c, UINT64_C(1) << 24, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CHAIN, "prev_trailer");
    tu_buf_free(&c.b);
    craft_base(&c, 0);
    cr_commit(&c, 0, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "commit_seq");
    tu_buf_free(&c.b);
    /* a back link near 2^64 whose end wraps around (bug guard: it was
     * accepted and the chain walk read far outside the file) */
    craft_base(&c, 0);
    cr_commit(&c, 2, UINT64_MAX - 63, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CHAIN, "prev_trailer");
    tu_buf_free(&c.b);

    /* dir_size over 64 + 64 * 2^20, in a file long enough for it to end at
     * the trailer: LIMIT before the directory is hashed */
    for (int over = 0; over < 2; over++) {
        uint64_t dir_size = 64 + 64 * ((UINT64_C(1) << 20) + (uint64_t)over);
        size_t size = (size_t)(64 + dir_size + 64);
        uint8_t *f = calloc(1, size);
        ck_assert_ptr_nonnull(f);
        fkvf_header h = {1, 0, 0, 0};
        fkvf_header_write(f, &h);
        uint64_t toff = 64 + dir_size;
        fkvf_trailer t = {1, 64, dir_size, 12345, 0, toff + 64};
        fkvf_trailer_write(f + toff, &t, toff);
        fkvf_reader *r = NULL;
        int rc = fkvf_reader_open_memory(&r, f, size, 0, NULL);
        if (over) {
            ck_assert_msg(rc == FKVF_E_LIMIT, "%s (%s)", fkvf_error_name(rc),
                          fkvf_reader_message(r));
            ck_assert(strstr(fkvf_reader_message(r), "dir_size") != NULL);
        } else {
            ck_assert_msg(rc == FKVF_E_CHECKSUM, "%s (%s)", fkvf_error_name(rc),
                          fkvf_reader_message(r));
        }
        fkvf_reader_free(r);
        free(f);
    }
}
END_TEST

/* Spec 14.3 coverage of exact positions by many EXAC sections: the writer's
 * and the reader's checks walked every section for every covered run,
 * O(sections^2) (hours for a hostile file of a few million sections); they
 * now sort once. 100000 one-row sections, added last position first, must
 * take well under the tcase timeout. */
START_TEST(many_exact_sections_are_checked_fast)
{
    enum { N = 100000 };
    fkvf_desc d;
    simple_desc(&d); /* rows of 16 bytes */
    uint8_t row[16];
    memset(row, 0x3c, sizeof row);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &o);
    OK_W(w, fkvf_writer_set_desc(w, &d));
    for (uint64_t p = N; p-- > 1;) {
        row[0] = (uint8_t)p;
        OK_W(w, fkvf_writer_add_exact(w, p, 1, row, sizeof row, 0));
    }
    OK_W(w, fkvf_writer_set_positions(w, N, 0));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE); /* position 0 has no row */
    assert_msg_names(w, "exact position 0 ");
    OK_W(w, fkvf_writer_add_exact(w, 0, 1, row, sizeof row, 0));
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL));
    const void *rp;
    size_t rb;
    OK_R(r, fkvf_reader_exact_row(r, 12345, &rp, &rb));
    ck_assert_uint_eq(rb, 16);
    ck_assert_uint_eq(((const uint8_t *)rp)[0], (uint8_t)12345);
    fkvf_reader_free(r);
    /* move the row of position 0 (the last entry) beyond n: the reader names
     * the gap */
    layout l = layout_of(b.data, b.size);
    uint32_t ne = fkvf_ld32(b.data + l.dir_off + 4);
    uint8_t *e = b.data + l.dir_off + 64 + 64 * (size_t)(ne - 1);
    ck_assert_uint_eq(fkvf_ld32(e), FKVF_SECTION_EXAC);
    ck_assert_uint_eq(fkvf_ld64(e + 32), 0);
    fkvf_st64(e + 32, N);
    fkvf_st64(b.data + fkvf_ld64(e + 8), N);
    refresh_last_commit(b.data, b.size);
    char msg[600];
    ck_assert_int_eq(try_open(b.data, b.size, 0, msg, sizeof msg), FKVF_E_CORRUPT);
    ck_assert_msg(strstr(msg, "exact position 0 ") != NULL, "%s", msg);
    tu_buf_free(&b);
}
END_TEST

/* A file of n_layers x 1024 heads empty index streams (one key stage of a
 * pooled codebook, n_archived = 0): one 64-byte STRM section holds them all. */
static void build_many_streams(tu_buf *out, uint32_t n_layers)
{
    craft c;
    cr_header(&c, 1, 0, 0, 0);
    fkvf_desc d;
    simple_desc(&d);
    d.n_layers = n_layers;
    d.n_kv_heads = 1024;
    size_t dn;
    uint8_t *dp = desc_bytes(&d, &dn);
    cr_plain(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED, 0, dp, dn);
    free(dp);
    fkvf_codebook_shape cs;
    shape_for(&cs, &d, 16, 1, 0, FKVF_DTYPE_F16, 1);
    size_t tn, cn;
    uint8_t *t = make_tables(&cs, 1, &tn);
    uint8_t *cb = cbk1_bytes(&cs, t, tn, &cn);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, cb, cn);
    free(cb);
    free(t);
    fkvf_strm_hdr h;
    memset(&h, 0, sizeof h);
    h.group = FKVF_STREAM_GROUP_INDEX;
    h.profile = FKVF_PROFILE_QUAD;
    h.bits = 4;
    h.k_stages = 1;
    h.n_streams = n_layers * 1024;
    h.block_size = 4096;
    uint8_t blk[64];
    fkvf_strm_hdr_write(blk, &h, cr_dir_off(&c));
    cr_plain(&c, FKVF_SECTION_STRM, FKVF_SECTION_REQUIRED, FKVF_STREAM_GROUP_INDEX, blk, 64);
    cr_commit(&c, 1, 0, 0, 0);
    *out = c.b;
}

/* Opening a file of many streams looked each segment's stream up by a
 * linear search over the streams so far, O(streams^2), and gave every
 * stream room for 16 segments (about 2 KB for a 64-byte section). */
/* Opening a file of many streams looked each segment's stream up by a
 * linear search over the streams so far, O(streams^2), and gave every
 * stream room for 16 segments (about 2 KB for a 64-byte section). Now a
 * group of 2^20 streams is one section; its streams cost a few words each. */
START_TEST(many_streams_open_fast)
{
    enum { N = 1024 * 1024 };
    tu_buf b;
    build_many_streams(&b, 1024);
    /* the peak of the bytes handed out; realloc moves (old and new count) */
    tu_alloc q = {.move = 1};
    fkvf_allocator a = tu_alloc_hook(&q);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, &a));
    ck_assert_msg(q.peak < (size_t)N * 64, "%zu bytes for %d streams", q.peak, (int)N);
    size_t n, idx;
    OK_R(r, fkvf_reader_stream_count(r, &n));
    ck_assert_uint_eq(n, N);
    /* canonical order: (layer * n_kv_heads + head) * stages + stage */
    OK_R(r, fkvf_reader_stream_find(r, FKVF_STREAM_ID(0, 7, 100, 0, 0), &idx));
    ck_assert_uint_eq(idx, 7 * 1024 + 100);
    fkvf_stream_info si;
    OK_R(r, fkvf_reader_stream_info(r, N - 1, &si));
    ck_assert_uint_eq(si.id, FKVF_STREAM_ID(0, 1023, 1023, 0, 0));
    ck_assert_uint_eq(si.length, 0);
    ck_assert_uint_eq(si.n_segments, 1);
    ck_assert_uint_eq(si.align, 32);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    ck_assert_uint_eq(q.bytes, 0);
    tu_buf_free(&b);
}
END_TEST

/* fkvf_reader_meta walked the section from its start for every entry, so
 * fkvf_reader_meta_find was O(entries^2) per call (and listing all entries
 * too): seconds per lookup in a 65536-entry section. */
START_TEST(meta_lookup_is_fast)
{
    enum { N = 65536 };
    mbuild mb;
    memset(&mb, 0, sizeof mb);
    static const uint8_t f = 0;
    for (uint32_t i = 0; i < N; i++) {
        char key[4] = {(char)(0x21 + i % 94), (char)(0x21 + i / 94 % 94), (char)(0x21 + i / 8836),
                       0};
        mb_add(&mb, key, FKVF_META_BOOL, &f, 1);
    }
    craft c;
    cr_header(&c, 1, 0, 0, 0);
    cr_desc(&c, 0);
    cr_plain(&c, FKVF_SECTION_META, 0, 0, mb.b.data, mb.b.size);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, FKVF_OPEN_STRICT, NULL));
    size_t n;
    OK_R(r, fkvf_reader_meta_count(r, &n));
    ck_assert_uint_eq(n, N);
    for (uint32_t i = N - 8; i < N; i++) {
        char key[4] = {(char)(0x21 + i % 94), (char)(0x21 + i / 94 % 94), (char)(0x21 + i / 8836),
                       0};
        fkvf_meta_entry e;
        OK_R(r, fkvf_reader_meta_find(r, key, &e));
        ck_assert_uint_eq(e.key_len, 3);
        ck_assert_int_eq(memcmp(e.key, key, 3), 0);
        ck_assert_int_eq(e.type, FKVF_META_BOOL);
    }
    RC_R(r, fkvf_reader_meta_find(r, "none", NULL), FKVF_E_INVALID_ARG);
    fkvf_meta_entry e;
    RC_R(r, fkvf_reader_meta_find(r, "none", &e), FKVF_E_NOT_FOUND);
    OK_R(r, fkvf_reader_verify(r)); /* parses the section again */
    OK_R(r, fkvf_reader_meta(r, N - 1, &e));
    ck_assert_int_eq(memcmp(e.key, "2H(", 3), 0); /* i = 65535 */
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    tu_buf_free(&mb.b);
}
END_TEST

/* ==== suite ====================================================================== */

int main(void)
{
    Suite *s = suite_create("container_codebooks");
    TCase *t = tcase_create("codebook");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, codebook_embedded_round_trip);
    tcase_add_test(t, codebook_size_of_shapes);
    tcase_add_test(t, codebook_pooled_per_layer);
    tcase_add_test(t, codebook_deflated);
    tcase_add_test(t, codebook_without_stages);
    tcase_add_test(t, codebook_file_without_desc);
    tcase_add_test(t, index_group_without_codebook);
    tcase_add_test(t, external_codebook_attach);
    tcase_add_test(t, external_codebook_attach_rejects);
    tcase_add_test(t, failed_open_handle_serves_nothing);
    tcase_add_test(t, external_codebook_smaller_k_fails_verify);
    tcase_add_test(t, writer_refuses_codebook_misuse);
    tcase_add_test(t, missing_index_group);
    tcase_add_test(t, strm_group_header_rules);
    tcase_add_test(t, index_symbol_beyond_k_fails_verify);
    tcase_add_test(t, second_codebook_section_is_corrupt);
    tcase_add_test(t, codebook_section_fields);
    tcase_add_test(t, cbk1_size_beyond_limit_is_limit);
    tcase_add_test(t, crafted_file_without_desc);
    suite_add_tcase(s, t);
    t = tcase_create("rules");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, desc_placement_rules);
    tcase_add_test(t, vtxs_twice_for_one_n_is_corrupt);
    tcase_add_test(t, vtxs_in_a_later_commit_does_not_count);
    tcase_add_test(t, verify_checks_unused_vertex_tables);
    tcase_add_test(t, verify_checks_replaced_segments);
    tcase_add_test(t, unflagged_known_sections_fail_verify);
    tcase_add_test(t, directory_entry_limits);
    tcase_add_test(t, trailer_limits);
    suite_add_tcase(s, t);
    t = tcase_create("scale");
    tcase_set_timeout(t, 10); /* 0.5 s here (1.5 s with sanitizers); 15 s when quadratic */
    tcase_add_test(t, many_exact_sections_are_checked_fast);
    tcase_add_test(t, many_streams_open_fast);
    tcase_add_test(t, meta_lookup_is_fast);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
