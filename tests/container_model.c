/* The container tests' archive model (what a test writes and expects to
 * read back), the checks that read it back, temporary files, and the
 * helpers that hand-craft files byte by byte: shared by the
 * test_container_*.c suites (container_model.h documents each). */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "codec/codec.h"
#include "common/hash.h"
#include "common/le.h"
#include "fkvf.h"
#include "format/format.h"
#include "container_model.h"
#include "testutil.h"

/* ==== the archive model: what a test writes and expects to read back ======== */

fkvf_stream_spec mkspec(fkvf_profile profile, unsigned bits, uint32_t alphabet)
{
    fkvf_stream_spec s;
    memset(&s, 0, sizeof s);
    s.profile = profile;
    s.symbol_bits = bits;
    s.alphabet = alphabet;
    return s;
}

uint32_t *make_symbols(size_t n, uint64_t range, int quad, uint64_t seed)
{
    uint32_t *sym = calloc(n + 1, sizeof *sym);
    ck_assert_ptr_nonnull(sym);
    tu_rng rng = {seed};
    for (size_t i = 0; i < n; i++) {
        if ((range & (range - 1)) == 0)
            sym[i] = (uint32_t)(tu_next(&rng) & (range - 1));
        else
            sym[i] = tu_below(&rng, (uint32_t)range);
    }
    if (n >= 2 && quad) {
        sym[0] = 0;
        sym[n - 1] = (uint32_t)(range - 1);
    } else if (n >= 2) {
        sym[0] = (uint32_t)(range - 1);
        sym[n - 1] = 0;
    }
    return sym;
}

uint64_t spec_range(const fkvf_stream_spec *s)
{
    return s->profile == FKVF_PROFILE_QUAD ? UINT64_C(1) << s->symbol_bits : s->alphabet;
}

size_t model_n_index(const model *m)
{
    return m->has_index ? (size_t)m->desc.n_layers * m->desc.n_kv_heads *
                              (m->cbs.k_stages + m->cbs.v_stages)
                        : 0;
}

void model_index(model *m, fkvf_profile profile, unsigned bits, uint32_t alphabet,
                 uint64_t seed)
{
    ck_assert(m->cb);
    ck_assert(!m->has_index && !m->has_tokens);
    m->has_index = 1;
    m->ispec = mkspec(profile, bits, alphabet);
    uint64_t range = spec_range(&m->ispec);
    if (range > m->cbs.k)
        range = m->cbs.k;
    unsigned ks = m->cbs.k_stages, per = ks + m->cbs.v_stages;
    for (uint32_t l = 0; l < m->desc.n_layers; l++)
        for (uint32_t h = 0; h < m->desc.n_kv_heads; h++)
            for (unsigned j = 0; j < per; j++) {
                ck_assert_uint_lt(m->n_st, MAX_STREAMS);
                tstream *s = &m->st[m->n_st++];
                unsigned kv = j >= ks, stage = kv ? j - ks : j;
                s->id = FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, l, h, kv, stage);
                s->spec = m->ispec;
                s->n = (size_t)m->n_archived;
                s->sym = make_symbols(s->n, range, profile == FKVF_PROFILE_QUAD, seed + m->n_st);
            }
    ck_assert_uint_eq(m->n_st, model_n_index(m));
}

void model_index_rl(model *m, double r, uint32_t span)
{
    m->ispec.r = r;
    m->ispec.span_symbols = span;
    for (size_t i = 0; i < model_n_index(m); i++)
        m->st[i].spec = m->ispec;
}

void model_tokens(model *m, fkvf_profile profile, unsigned bits, uint32_t alphabet,
                  uint64_t seed)
{
    ck_assert(!m->has_tokens);
    ck_assert_uint_lt(m->n_st, MAX_STREAMS);
    m->has_tokens = 1;
    m->tspec = mkspec(profile, bits, alphabet);
    tstream *s = &m->st[m->n_st++];
    s->id = FKVF_STREAM_ID_TOKENS;
    s->spec = m->tspec;
    s->n = (size_t)m->n_positions;
    s->sym = make_symbols(s->n, spec_range(&m->tspec), profile == FKVF_PROFILE_QUAD, seed);
}

tstream *model_token_stream(model *m)
{
    ck_assert(m->has_tokens);
    return &m->st[m->n_st - 1];
}

size_t model_stream_of(const model *m, uint64_t id)
{
    for (size_t i = 0; i < m->n_st; i++)
        if (m->st[i].id == id)
            return i;
    ck_abort_msg("no stream %016llx in the model", (unsigned long long)id);
    return SIZE_MAX;
}

const uint16_t f16_palette[16] = {0x0000, 0x3C00, 0xBC00, 0x3800, 0x4000, 0x3555,
                                         0x0001, 0x7BFF, 0xFBFF, 0x8000, 0x2E66, 0xC200,
                                         0x1234, 0x5A5A, 0x03FF, 0x4248};

const uint32_t f32_palette[16] = {
    0x00000000, 0x3F800000, 0xBF800000, 0x3F000000, 0x40000000, 0x3EAAAAAB,
    0x00000001, 0x7F7FFFFF, 0xFF7FFFFF, 0x80000000, 0x3DCCCCCD, 0xC0490FDB,
    0x12345678, 0x5A5A5A5A, 0x007FFFFF, 0x42C80000};

uint8_t *make_tables(const fkvf_codebook_shape *s, uint64_t seed, size_t *size)
{
    uint64_t total = fkvf_codebook_size(s);
    ck_assert_uint_ge(total, 64);
    *size = (size_t)(total - 64);
    uint8_t *t = malloc(*size ? *size : 1);
    ck_assert_ptr_nonnull(t);
    tu_rng rng = {seed};
    if (s->dtype == FKVF_DTYPE_F16)
        for (size_t i = 0; i < *size; i += 2)
            fkvf_st16(t + i, f16_palette[tu_next(&rng) & 15]);
    else
        for (size_t i = 0; i < *size; i += 4)
            fkvf_st32(t + i, f32_palette[tu_next(&rng) & 15]);
    return t;
}

void shape_for(fkvf_codebook_shape *s, const fkvf_desc *d, uint32_t k, uint8_t ks,
               uint8_t vs, fkvf_dtype dtype, int pooled)
{
    memset(s, 0, sizeof *s);
    s->n_layers = d->n_layers;
    s->n_heads = pooled ? 1 : d->n_kv_heads;
    s->key_dim = d->key_dim;
    s->value_dim = d->value_dim;
    s->k = k;
    s->k_stages = ks;
    s->v_stages = vs;
    s->dtype = dtype;
    s->pooled = (uint8_t)pooled;
}

void model_codebook(model *m, uint32_t k, uint8_t ks, uint8_t vs, fkvf_dtype dtype,
                    int pooled, uint64_t seed)
{
    shape_for(&m->cbs, &m->desc, k, ks, vs, dtype, pooled);
    free(m->cb_tables);
    m->cb_tables = make_tables(&m->cbs, seed, &m->cb_tables_size);
    m->cb = 1;
}

void model_rows(model *m, uint64_t seed)
{
    m->row_bytes = (size_t)fkvf_desc_row_bytes(&m->desc);
    ck_assert_uint_gt(m->row_bytes, 0);
    size_t n = (size_t)m->n_positions * m->row_bytes;
    m->rows = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(m->rows);
    tu_rng rng = {seed};
    for (size_t i = 0; i < n; i++)
        m->rows[i] = (uint8_t)tu_next(&rng);
}

void model_free(model *m)
{
    free(m->rows);
    free(m->cb_tables);
    for (size_t i = 0; i < m->n_st; i++)
        free(m->st[i].sym);
    memset(m, 0, sizeof *m);
}

const uint8_t weights16[16] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE,
                                      0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF};

void model_small_codec(model *m, uint32_t k, fkvf_profile profile, unsigned bits,
                       uint32_t alphabet)
{
    memset(m, 0, sizeof *m);
    fkvf_writer_options_init(&m->opts);
    m->opts.required_features = FKVF_FEAT_NGON;
    m->opts.sync = FKVF_SYNC_NONE;
    fkvf_desc *d = &m->desc;
    d->n_layers = 2;
    d->n_kv_heads = 2;
    d->key_dim = 8;
    d->value_dim = 8;
    d->dtype = FKVF_DTYPE_F16;
    d->key_transform = 1;
    d->rope_layout = 2;
    d->key_storage = 1;
    d->rope_dims = 8;
    d->rope_theta = 10000.0;
    d->n_sinks = 2;
    d->window = 3;
    d->model_id = "org/tiny-kv-\xC3\xA9";
    d->tokenizer_id = "tok-v1";
    d->weights_hash_kind = 2;
    memcpy(d->weights_hash, weights16, 16);
    m->n_positions = 10;
    m->n_archived = 5;
    m->meta = 1;
    m->split_tail = 1;
    model_rows(m, 1);
    model_codebook(m, k, 1, 1, FKVF_DTYPE_F16, 0, 14);
    model_index(m, profile, bits, alphabet, 11);
    model_tokens(m, FKVF_PROFILE_QUAD, 32, 0, 13);
    ck_assert_uint_eq(m->n_st, 2 * 2 * 2 + 1);
}

void model_small_k(model *m, uint32_t k)
{
    model_small_codec(m, k, FKVF_PROFILE_NGON, 0, k);
}

void model_small(model *m) { model_small_k(m, 16); }

void model_many(model *m, fkvf_dtype dtype)
{
    memset(m, 0, sizeof *m);
    fkvf_writer_options_init(&m->opts);
    m->opts.required_features = FKVF_FEAT_NGON | FKVF_FEAT_DEFLATE;
    m->opts.optional_features = FKVF_OPTFEAT_TOKEN_STREAM;
    m->opts.block_size = 64; /* many blocks per segment */
    m->opts.deflate_level = 9;
    m->opts.sync = FKVF_SYNC_NONE;
    fkvf_desc *d = &m->desc;
    d->n_layers = 4;
    d->n_kv_heads = 4;
    d->key_dim = 4;
    d->value_dim = 4;
    d->dtype = dtype;
    d->key_transform = 1;
    d->rope_layout = 1;
    d->key_storage = 0;
    d->rope_dims = 2;
    d->rope_theta = 500000.0;
    d->n_sinks = 2;
    d->window = 1024;
    d->model_id = "meta-llama/Llama-3.1-8B";
    d->tokenizer_id = "\xE2\x82\xAC-tok \xF0\x9F\xA6\x99";
    d->weights_hash_kind = 1;
    for (int i = 0; i < 32; i++)
        d->weights_hash[i] = (uint8_t)(0xA0 + i);
    m->n_positions = 2 + 300 + 7;
    m->n_archived = 300;
    m->meta = 1;
    m->split_tail = 1;
    m->exac_flags = FKVF_SECTION_DEFLATE;
    m->extra = 1;
    for (size_t i = 0; i < sizeof m->extra_data; i++)
        m->extra_data[i] = (uint8_t)(i % 7);
    model_rows(m, 2);
    model_codebook(m, 4096, 1, 1, FKVF_DTYPE_F16, 1, 3);
    m->cb_flags = FKVF_SECTION_DEFLATE;
    model_index(m, FKVF_PROFILE_QUAD, 12, 0, 100);
    model_tokens(m, FKVF_PROFILE_QUAD, 32, 0, 99);
    ck_assert_uint_eq(m->n_st, 4 * 4 * 2 + 1);
}

void model_all_exact(model *m)
{
    memset(m, 0, sizeof *m);
    fkvf_writer_options_init(&m->opts);
    m->opts.sync = FKVF_SYNC_NONE;
    fkvf_desc *d = &m->desc;
    d->n_layers = 3;
    d->n_kv_heads = 1;
    d->key_dim = 5;
    d->value_dim = 3;
    d->dtype = FKVF_DTYPE_F32;
    d->n_sinks = 4;
    d->weights_hash_kind = 0;
    m->n_positions = 3;
    m->n_archived = 0;
    model_rows(m, 3);
    model_tokens(m, FKVF_PROFILE_QUAD, 16, 0, 31);
}

const uint8_t blob5[5] = {0, 1, 2, 0xFF, 0};

int write_meta(fkvf_writer *w)
{
    int rc;
    if ((rc = fkvf_writer_meta_u64(w, "run.steps", UINT64_C(0xFFFFFFFFFFFFFFFA))) ||
        (rc = fkvf_writer_meta_i64(w, "run.delta", INT64_MIN + 7)) ||
        (rc = fkvf_writer_meta_f64(w, "run.temp", 0.1)) ||
        (rc = fkvf_writer_meta_bool(w, "run.ok", 7)) ||
        (rc = fkvf_writer_meta_bool(w, "run.notok", 0)) ||
        (rc = fkvf_writer_meta_utf8(w, "model.name", "Llama-\xC3\xBC-\xF0\x9F\xA6\x99")) ||
        (rc = fkvf_writer_meta_bytes(w, "blob", blob5, sizeof blob5)) ||
        (rc = fkvf_writer_meta_utf8(w, "empty.str", "")) ||
        (rc = fkvf_writer_meta_bytes(w, "empty.bytes", NULL, 0)) ||
        (rc = fkvf_writer_meta_utf8(w, "\xD0\xBA\xD0\xBB\xD1\x8E\xD1\x87",
                                    "\xD0\xB7\xD0\xBD\xD0\xB0\xD1\x87")))
        return rc;
    return FKVF_OK;
}

uint64_t model_sinks(const model *m)
{
    return m->desc.n_sinks < m->n_positions ? m->desc.n_sinks : m->n_positions;
}

uint16_t *model_codes(const model *m, uint64_t first, uint64_t count, size_t *ps,
                      size_t *cs)
{
    size_t ni = model_n_index(m), n = (size_t)count;
    uint16_t *codes = calloc(n * ni + 1, sizeof *codes);
    ck_assert_ptr_nonnull(codes);
    *ps = m->codes_by_stream ? 1 : ni;
    *cs = m->codes_by_stream ? n : 1;
    for (size_t j = 0; j < ni; j++)
        for (size_t i = 0; i < n; i++)
            codes[i * *ps + j * *cs] = (uint16_t)m->st[j].sym[first + i];
    return codes;
}

int write_index_segment(const model *m, fkvf_writer *w, uint64_t first, uint64_t count)
{
    size_t ps, cs;
    uint16_t *codes = model_codes(m, first, count, &ps, &cs);
    int rc = fkvf_writer_add_index_segment(w, &m->ispec, first, count, codes, ps, cs);
    free(codes);
    return rc;
}

int write_model(const model *m, fkvf_writer *w)
{
    int rc;
    if ((rc = fkvf_writer_set_desc(w, &m->desc)))
        return rc;
    if (m->cb == 1 && (rc = fkvf_writer_add_codebooks(w, &m->cbs, m->cb_tables,
                                                      m->cb_tables_size, m->cb_flags)))
        return rc;
    if (m->cb == 2 && (rc = fkvf_writer_add_codebook_ref(w, &m->cbs, m->cb_hash, m->cb_name)))
        return rc;
    if (m->meta && (rc = write_meta(w)))
        return rc;
    uint64_t S = model_sinks(m), rb = m->row_bytes;
    if (S && (rc = fkvf_writer_add_exact(w, 0, S, m->rows, (size_t)(S * rb), m->exac_flags)))
        return rc;
    uint64_t tf = S + m->n_archived, tn = m->n_positions - tf;
    if (tn) {
        uint64_t a = m->split_tail && tn >= 2 ? 1 : tn;
        if ((rc = fkvf_writer_add_exact(w, tf, a, m->rows + tf * rb, (size_t)(a * rb),
                                        m->exac_flags)))
            return rc;
        if (a < tn && (rc = fkvf_writer_add_exact(w, tf + a, tn - a, m->rows + (tf + a) * rb,
                                                  (size_t)((tn - a) * rb), m->exac_flags)))
            return rc;
    }
    if ((rc = write_streams(m, w)))
        return rc;
    if (m->extra) {
        if ((rc = fkvf_writer_add_section(w, XTRA, 0, 7, m->extra_data, sizeof m->extra_data)))
            return rc;
        if ((m->opts.required_features & FKVF_FEAT_DEFLATE) &&
            (rc = fkvf_writer_add_section(w, XTRZ, FKVF_SECTION_DEFLATE, 8, m->extra_data,
                                          sizeof m->extra_data)))
            return rc;
    }
    if ((rc = fkvf_writer_set_positions(w, m->n_positions, m->n_archived)))
        return rc;
    return fkvf_writer_finish(w);
}

void build(const model *m, tu_buf *out)
{
    memset(out, 0, sizeof *out);
    fkvf_sink sink = tu_buf_sink(out);
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_sink(&w, &sink, &m->opts, NULL));
    OK_W(w, write_model(m, w));
    fkvf_writer_free(w);
    ck_assert_uint_eq(out->size % 64, 0);
}

int write_streams(const model *m, fkvf_writer *w)
{
    int rc;
    if (m->has_index && (rc = write_index_segment(m, w, 0, m->st[0].n)))
        return rc;
    if (m->has_tokens) {
        const tstream *t = &m->st[m->n_st - 1];
        if ((rc = fkvf_writer_add_token_segment(w, &m->tspec, 0, t->sym, t->n)))
            return rc;
    }
    return FKVF_OK;
}

size_t model_n_sections(const model *m)
{
    size_t n = 1 + (m->has_index ? 1 : 0) + (m->has_tokens ? 1 : 0) + (m->meta ? 1 : 0) +
               (m->cb ? 1 : 0);
    uint64_t S = model_sinks(m), tn = m->n_positions - S - m->n_archived;
    n += (S ? 1 : 0) + (tn ? (m->split_tail && tn >= 2 ? 2 : 1) : 0);
    int ing = m->has_index && m->ispec.profile == FKVF_PROFILE_NGON;
    int tng = m->has_tokens && m->tspec.profile == FKVF_PROFILE_NGON;
    n += (size_t)ing + (size_t)tng;
    if (ing && tng && m->ispec.alphabet == m->tspec.alphabet)
        n--; /* one VTXS per N */
    if (m->extra)
        n += (m->opts.required_features & FKVF_FEAT_DEFLATE) ? 2 : 1;
    return n;
}

uint64_t stream_bytes_of(const fkvf_stream_spec *s, uint64_t n)
{
    if (s->profile == FKVF_PROFILE_QUAD)
        return (n * s->symbol_bits + 127) / 128 * 16;
    uint32_t L = fkvf_stream_spec_align(s);
    ck_assert_uint_gt(L, 0);
    return (n + L - 1) / L * 16;
}

uint64_t strm_size_of(const fkvf_stream_spec *s, uint64_t n, uint64_t n_streams,
                      uint32_t block_size)
{
    uint64_t data = stream_bytes_of(s, n) * n_streams;
    uint64_t nb = (data + block_size - 1) / block_size;
    return (64 + 8 * nb + 63) / 64 * 64 + data;
}

/* ==== reading back ================================================================ */

size_t find_section(fkvf_reader *r, uint32_t type, uint64_t key, fkvf_section_info *out)
{
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    size_t found = SIZE_MAX;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        OK_R(r, fkvf_reader_section(r, i, &si));
        if (si.type == type && si.key == key) {
            found = i; /* the latest wins */
            if (out)
                *out = si;
        }
    }
    return found;
}

void check_desc(fkvf_reader *r, const fkvf_desc *want)
{
    fkvf_desc d;
    OK_R(r, fkvf_reader_desc(r, &d));
    ck_assert_uint_eq(d.n_layers, want->n_layers);
    ck_assert_uint_eq(d.n_kv_heads, want->n_kv_heads);
    ck_assert_uint_eq(d.key_dim, want->key_dim);
    ck_assert_uint_eq(d.value_dim, want->value_dim);
    ck_assert_int_eq(d.dtype, want->dtype);
    ck_assert_uint_eq(d.key_transform, want->key_transform);
    ck_assert_uint_eq(d.rope_layout, want->rope_layout);
    ck_assert_uint_eq(d.key_storage, want->key_storage);
    ck_assert_uint_eq(d.rope_dims, want->rope_dims);
    ck_assert(memcmp(&d.rope_theta, &want->rope_theta, sizeof(double)) == 0);
    ck_assert_uint_eq(d.n_sinks, want->n_sinks);
    ck_assert_uint_eq(d.window, want->window);
    ck_assert_ptr_nonnull(d.model_id);
    ck_assert_ptr_nonnull(d.tokenizer_id);
    ck_assert_str_eq(d.model_id, want->model_id ? want->model_id : "");
    ck_assert_str_eq(d.tokenizer_id, want->tokenizer_id ? want->tokenizer_id : "");
    ck_assert_uint_eq(d.weights_hash_kind, want->weights_hash_kind);
    ck_assert(memcmp(d.weights_hash, want->weights_hash, 32) == 0);
}

void check_meta_entry(const fkvf_meta_entry *e, const char *key, fkvf_meta_type type,
                      const void *value, size_t value_len)
{
    ck_assert_uint_eq(e->key_len, strlen(key));
    ck_assert(memcmp(e->key, key, e->key_len) == 0);
    ck_assert_int_eq(e->type, type);
    ck_assert_uint_eq(e->value_len, value_len);
    if (value_len)
        ck_assert(memcmp(e->value, value, value_len) == 0);
}

void check_meta(fkvf_reader *r)
{
    size_t n;
    OK_R(r, fkvf_reader_meta_count(r, &n));
    ck_assert_uint_eq(n, N_META);
    uint8_t v[8];
    fkvf_meta_entry e, f;

    OK_R(r, fkvf_reader_meta(r, 0, &e));
    fkvf_st64(v, UINT64_C(0xFFFFFFFFFFFFFFFA));
    check_meta_entry(&e, "run.steps", FKVF_META_U64, v, 8);
    ck_assert_uint_eq(e.u64, UINT64_C(0xFFFFFFFFFFFFFFFA));

    OK_R(r, fkvf_reader_meta(r, 1, &e));
    fkvf_st64(v, (uint64_t)(INT64_MIN + 7));
    check_meta_entry(&e, "run.delta", FKVF_META_I64, v, 8);
    ck_assert(e.i64 == INT64_MIN + 7);

    OK_R(r, fkvf_reader_meta(r, 2, &e));
    fkvf_stf64(v, 0.1);
    check_meta_entry(&e, "run.temp", FKVF_META_F64, v, 8);
    ck_assert(e.f64 == 0.1);

    OK_R(r, fkvf_reader_meta(r, 3, &e));
    v[0] = 1;
    check_meta_entry(&e, "run.ok", FKVF_META_BOOL, v, 1);
    ck_assert_uint_eq(e.u64, 1);

    OK_R(r, fkvf_reader_meta(r, 4, &e));
    v[0] = 0;
    check_meta_entry(&e, "run.notok", FKVF_META_BOOL, v, 1);
    ck_assert_uint_eq(e.u64, 0);

    OK_R(r, fkvf_reader_meta(r, 5, &e));
    const char *nm = "Llama-\xC3\xBC-\xF0\x9F\xA6\x99";
    check_meta_entry(&e, "model.name", FKVF_META_UTF8, nm, strlen(nm));

    OK_R(r, fkvf_reader_meta(r, 6, &e));
    check_meta_entry(&e, "blob", FKVF_META_BYTES, blob5, 5);

    OK_R(r, fkvf_reader_meta(r, 7, &e));
    check_meta_entry(&e, "empty.str", FKVF_META_UTF8, NULL, 0);
    OK_R(r, fkvf_reader_meta(r, 8, &e));
    check_meta_entry(&e, "empty.bytes", FKVF_META_BYTES, NULL, 0);
    OK_R(r, fkvf_reader_meta(r, 9, &e));
    check_meta_entry(&e, "\xD0\xBA\xD0\xBB\xD1\x8E\xD1\x87", FKVF_META_UTF8,
                     "\xD0\xB7\xD0\xBD\xD0\xB0\xD1\x87", 8);

    RC_R(r, fkvf_reader_meta(r, N_META, &e), FKVF_E_RANGE);

    /* every entry by key equals the entry by index */
    for (size_t i = 0; i < n; i++) {
        OK_R(r, fkvf_reader_meta(r, i, &e));
        char key[256];
        memcpy(key, e.key, e.key_len);
        key[e.key_len] = 0;
        OK_R(r, fkvf_reader_meta_find(r, key, &f));
        ck_assert_ptr_eq(f.key, e.key);
        ck_assert_ptr_eq(f.value, e.value);
        ck_assert_int_eq(f.type, e.type);
        ck_assert_uint_eq(f.u64, e.u64);
    }
    RC_R(r, fkvf_reader_meta_find(r, "run", &f), FKVF_E_NOT_FOUND);
    RC_R(r, fkvf_reader_meta_find(r, "run.steps.", &f), FKVF_E_NOT_FOUND);
    RC_R(r, fkvf_reader_meta_find(r, "", &f), FKVF_E_NOT_FOUND);
}

double *read_vtxs(fkvf_reader *r, uint32_t n)
{
    size_t i = find_section(r, FKVF_SECTION_VTXS, n, NULL);
    ck_assert_uint_ne(i, SIZE_MAX);
    const void *p;
    size_t size;
    OK_R(r, fkvf_reader_section_data(r, i, &p, &size));
    ck_assert_uint_eq(size, 8 + 16 * (size_t)n);
    const uint8_t *b = p;
    ck_assert_uint_eq(fkvf_ld32(b), n);
    double *xy = malloc(2 * (size_t)n * sizeof *xy);
    ck_assert_ptr_nonnull(xy);
    for (size_t k = 0; k < 2 * (size_t)n; k++)
        xy[k] = fkvf_ldf64(b + 8 + 8 * k);
    ck_assert(xy[0] == 1.0 && xy[1] == 0.0);
    return xy;
}

void check_stream_seg(fkvf_reader *r, const tstream *ts, uint64_t seed, size_t n_seg,
                      uint64_t stored)
{
    size_t idx;
    OK_R(r, fkvf_reader_stream_find(r, ts->id, &idx));
    fkvf_stream_info si;
    OK_R(r, fkvf_reader_stream_info(r, idx, &si));
    ck_assert_uint_eq(si.id, ts->id);
    ck_assert_int_eq(si.profile, ts->spec.profile);
    ck_assert_uint_eq(si.length, ts->n);
    ck_assert_uint_eq(si.n_segments, n_seg);
    ck_assert_uint_eq(si.stored_bytes, stored);
    ck_assert_uint_eq(si.align, fkvf_stream_spec_align(&ts->spec));
    uint64_t group = (ts->id >> 56) == FKVF_STREAM_KIND_TOKENS ? FKVF_STREAM_GROUP_TOKENS
                                                               : FKVF_STREAM_GROUP_INDEX;
    fkvf_section_info sec;
    ck_assert_uint_ne(find_section(r, FKVF_SECTION_STRM, group, &sec), SIZE_MAX);
    ck_assert_uint_eq(sec.flags, FKVF_SECTION_REQUIRED);
    unsigned bits = ts->spec.symbol_bits;
    uint32_t L;
    if (ts->spec.profile == FKVF_PROFILE_QUAD) {
        ck_assert_uint_eq(si.symbol_bits, bits);
        ck_assert_uint_eq(si.alphabet, bits < 32 ? UINT32_C(1) << bits : 0);
        ck_assert_uint_eq(si.span_symbols, 128 / bits);
        /* 128 / gcd(b, 128) (spec 11.6) */
        uint32_t g = 2;
        while (bits % (2 * g) == 0 && g < 128)
            g *= 2;
        ck_assert_uint_eq(si.align, 128 / g);
        L = 0;
    } else {
        ck_assert_uint_eq(si.alphabet, ts->spec.alphabet);
        double want_r = ts->spec.r != 0.0 ? ts->spec.r : fkvf_ngon_rmax(ts->spec.alphabet);
        ck_assert(si.r == want_r);
        L = ts->spec.span_symbols ? ts->spec.span_symbols : fkvf_ngon_max_span(si.r);
        ck_assert_uint_eq(si.span_symbols, L);
        ck_assert_uint_eq(si.align, L);
        ck_assert_uint_ge(L, 1);
    }

    size_t n = ts->n;
    uint32_t *out = calloc(n + 1, sizeof *out);
    ck_assert_ptr_nonnull(out);
    OK_R(r, fkvf_reader_stream_read(r, idx, 0, out, n));
    for (size_t t = 0; t < n; t++)
        EXPECTF(out[t] == ts->sym[t], "stream %016llx read: symbol %zu is %u, want %u",
                (unsigned long long)ts->id, t, out[t], ts->sym[t]);
    for (size_t t = 0; t < n; t++) {
        uint32_t s = 0xDEADBEEF;
        RC_R(r, fkvf_reader_stream_get(r, idx, t, &s), FKVF_OK);
        EXPECTF(s == ts->sym[t], "stream %016llx get(%zu) = %u, want %u",
                (unsigned long long)ts->id, t, s, ts->sym[t]);
    }
    tu_rng rng = {seed};
    for (int k = 0; k < 20 && n; k++) {
        size_t a = tu_below(&rng, (uint32_t)n), c = tu_below(&rng, (uint32_t)(n - a + 1));
        memset(out, 0xFF, (n + 1) * sizeof *out);
        OK_R(r, fkvf_reader_stream_read(r, idx, a, out, c));
        EXPECT(memcmp(out, ts->sym + a, c * sizeof *out) == 0);
        EXPECT(out[c] == UINT32_MAX); /* nothing written past count */
    }
    /* bounds */
    OK_R(r, fkvf_reader_stream_read(r, idx, n, out, 0));
    RC_R(r, fkvf_reader_stream_read(r, idx, n, out, 1), FKVF_E_RANGE);
    RC_R(r, fkvf_reader_stream_read(r, idx, 0, out, n + 1), FKVF_E_RANGE);
    RC_R(r, fkvf_reader_stream_read(r, idx, UINT64_MAX, out, 2), FKVF_E_RANGE);
    /* byte output: symbols that fit a byte read back equal; others refused */
    int fits = ts->spec.profile == FKVF_PROFILE_QUAD ? bits <= 8 : si.alphabet <= 256;
    uint8_t *b8 = calloc(n + 1, 1);
    ck_assert_ptr_nonnull(b8);
    if (fits) {
        OK_R(r, fkvf_reader_stream_read_u8(r, idx, 0, b8, n));
        for (size_t t = 0; t < n; t++)
            EXPECTF(b8[t] == ts->sym[t], "stream %016llx read_u8: symbol %zu is %u, want %u",
                    (unsigned long long)ts->id, t, b8[t], ts->sym[t]);
        if (n > 3) {
            b8[n - 3] = 0xA5; /* first byte past the read below */
            OK_R(r, fkvf_reader_stream_read_u8(r, idx, 1, b8, n - 3));
            EXPECT(b8[0] == ts->sym[1] && b8[n - 4] == ts->sym[n - 3] && b8[n - 3] == 0xA5);
        }
        RC_R(r, fkvf_reader_stream_read_u8(r, idx, 0, b8, n + 1), FKVF_E_RANGE);
    } else {
        RC_R(r, fkvf_reader_stream_read_u8(r, idx, 0, b8, n), FKVF_E_INVALID_ARG);
    }
    free(b8);
    uint32_t s1;
    RC_R(r, fkvf_reader_stream_get(r, idx, n, &s1), FKVF_E_RANGE);
    fkvf_point pt;
    RC_R(r, fkvf_reader_stream_point(r, idx, n, &pt), FKVF_E_RANGE);

    /* CGR points (spec 12), against the spec's recurrences */
    double *xy = ts->spec.profile == FKVF_PROFILE_NGON ? read_vtxs(r, ts->spec.alphabet) : NULL;
    for (size_t t = 0; t < n; t++) {
        OK_R(r, fkvf_reader_stream_point(r, idx, t, &pt));
        if (ts->spec.profile == FKVF_PROFILE_QUAD) {
            uint64_t x, y;
            fkvf_quad_point_ref(ts->sym, t, bits, &x, &y);
            EXPECTF(pt.x == x && pt.y == y, "quad point %zu", t);
        } else {
            size_t first = t + 1 >= L ? t + 1 - L : 0;
            double px = 0.0, py = 0.0;
            for (size_t k = first; k <= t; k++) {
                double vx = xy[2 * ts->sym[k]], vy = xy[2 * ts->sym[k] + 1];
                px = vx + si.r * (px - vx);
                py = vy + si.r * (py - vy);
            }
            EXPECTF(memcmp(&px, &pt.fx, 8) == 0 && memcmp(&py, &pt.fy, 8) == 0,
                    "ngon point %zu: (%.17g, %.17g) want (%.17g, %.17g)", t, pt.fx, pt.fy, px,
                    py);
        }
    }
    free(xy);
    free(out);
}

void check_stream(fkvf_reader *r, const tstream *ts, uint64_t seed)
{
    check_stream_seg(r, ts, seed, 1, stream_bytes_of(&ts->spec, ts->n));
}

void check_sections(fkvf_reader *r, const uint8_t *file, size_t file_size)
{
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    uint64_t prev_end = 64;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        OK_R(r, fkvf_reader_section(r, i, &si));
        ck_assert_uint_eq(si.offset % 64, 0);
        ck_assert_uint_ge(si.offset, prev_end);
        ck_assert_uint_le(si.offset + si.stored_size, file_size);
        prev_end = si.offset + si.stored_size;
        ck_assert_uint_ge(si.commit_seq, 1);
        ck_assert_uint_le(si.commit_seq, ai.n_commits);
        ck_assert_uint_ne(si.type, FKVF_SECTION_DIRC);
        ck_assert_uint_eq(si.flags & ~3u, 0);
        if (file)
            ck_assert_uint_eq(si.checksum, fkvf_xxh3_64(file + si.offset, si.stored_size,
                                                        si.offset));
        const void *p;
        size_t size;
        OK_R(r, fkvf_reader_section_data(r, i, &p, &size));
        ck_assert_uint_eq(size, si.size);
        if (!(si.flags & FKVF_SECTION_DEFLATE)) {
            ck_assert_uint_eq(si.size, si.stored_size);
            if (file)
                ck_assert_ptr_eq(p, file + si.offset); /* zero copy */
        }
        if (si.type == FKVF_SECTION_DESC || si.type == FKVF_SECTION_EXAC ||
            si.type == FKVF_SECTION_STRM || si.type == FKVF_SECTION_VTXS ||
            si.type == FKVF_SECTION_CBK1 || si.type == FKVF_SECTION_CBRF)
            ck_assert_uint_eq(si.flags & FKVF_SECTION_REQUIRED, FKVF_SECTION_REQUIRED);
    }
    fkvf_section_info si;
    RC_R(r, fkvf_reader_section(r, ai.n_sections, &si), FKVF_E_RANGE);
    const void *p;
    size_t size;
    RC_R(r, fkvf_reader_section_data(r, ai.n_sections, &p, &size), FKVF_E_RANGE);
}

void check_exact(fkvf_reader *r, const model *m)
{
    uint64_t S = m->desc.n_sinks;
    for (uint64_t p = 0; p < m->n_positions; p++) {
        int want = p < S || p >= S + m->n_archived, is = -1;
        OK_R(r, fkvf_reader_is_exact(r, p, &is));
        EXPECTF(is == want, "is_exact(%llu) = %d", (unsigned long long)p, is);
        const void *row = NULL;
        size_t rb = 0;
        if (want) {
            OK_R(r, fkvf_reader_exact_row(r, p, &row, &rb));
            EXPECT(rb == m->row_bytes);
            EXPECTF(memcmp(row, m->rows + p * m->row_bytes, rb) == 0, "row %llu differs",
                    (unsigned long long)p);
        } else {
            RC_R(r, fkvf_reader_exact_row(r, p, &row, &rb), FKVF_E_RANGE);
        }
    }
    int is;
    RC_R(r, fkvf_reader_is_exact(r, m->n_positions, &is), FKVF_E_RANGE);
    const void *row;
    size_t rb;
    RC_R(r, fkvf_reader_exact_row(r, m->n_positions, &row, &rb), FKVF_E_RANGE);
    RC_R(r, fkvf_reader_exact_row(r, UINT64_MAX, &row, &rb), FKVF_E_RANGE);
}

uint8_t *cbk1_bytes(const fkvf_codebook_shape *s, const uint8_t *tables, size_t tsize,
                    size_t *n)
{
    *n = 64 + tsize;
    uint8_t *p = calloc(1, *n);
    ck_assert_ptr_nonnull(p);
    fkvf_st32(p + 0, s->n_layers);
    fkvf_st32(p + 4, s->n_heads);
    fkvf_st32(p + 8, s->key_dim);
    fkvf_st32(p + 12, s->value_dim);
    fkvf_st32(p + 16, s->k);
    p[20] = s->k_stages;
    p[21] = s->v_stages;
    p[22] = (uint8_t)s->dtype;
    p[23] = s->pooled;
    if (tsize)
        memcpy(p + 64, tables, tsize);
    return p;
}

void check_shape_eq(const fkvf_codebook_shape *a, const fkvf_codebook_shape *b)
{
    ck_assert_uint_eq(a->n_layers, b->n_layers);
    ck_assert_uint_eq(a->n_heads, b->n_heads);
    ck_assert_uint_eq(a->key_dim, b->key_dim);
    ck_assert_uint_eq(a->value_dim, b->value_dim);
    ck_assert_uint_eq(a->k, b->k);
    ck_assert_uint_eq(a->k_stages, b->k_stages);
    ck_assert_uint_eq(a->v_stages, b->v_stages);
    ck_assert_int_eq(a->dtype, b->dtype);
    ck_assert_uint_eq(a->pooled, b->pooled);
}

const void *check_codebook(fkvf_reader *r, const fkvf_codebook_shape *shape,
                           const uint8_t *tables, size_t tsize)
{
    fkvf_codebook_shape got;
    const void *p = NULL;
    size_t n = 0;
    uint8_t h[16], want_h[16], lib_h[16];
    memset(&got, 0xEE, sizeof got);
    OK_R(r, fkvf_reader_codebook(r, &got, &p, &n, h));
    check_shape_eq(&got, shape);
    ck_assert_uint_eq(n, fkvf_codebook_size(shape));
    size_t wn;
    uint8_t *want = cbk1_bytes(shape, tables, tsize, &wn);
    ck_assert_uint_eq(n, wn);
    ck_assert(memcmp(p, want, n) == 0);
    fkvf_xxh3_128(want, wn, want_h);
    fkvf_codebook_hash(p, n, lib_h);
    ck_assert(memcmp(h, want_h, 16) == 0);
    ck_assert(memcmp(h, lib_h, 16) == 0);
    free(want);
    /* every output is optional */
    OK_R(r, fkvf_reader_codebook(r, NULL, NULL, NULL, NULL));
    return p;
}

void hex16(const uint8_t h[16], char out[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", h[i]);
}

void check_model(fkvf_reader *r, const model *m, const uint8_t *file, size_t size)
{
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_uint_eq(ai.format_major, FKVF_FORMAT_MAJOR);
    ck_assert_uint_eq(ai.format_minor, (m->opts.required_features & FKVF_FEAT_LAYER_STAGES) ? 1u : 0u);
    ck_assert_uint_eq(ai.required_features, m->opts.required_features);
    ck_assert_uint_eq(ai.optional_features, m->opts.optional_features);
    ck_assert_uint_eq(ai.file_size, size);
    ck_assert_uint_eq(ai.committed_size, size);
    ck_assert_uint_eq(ai.torn_bytes, 0);
    ck_assert_uint_eq(ai.n_commits, 1);
    ck_assert_uint_eq(ai.n_positions, m->n_positions);
    ck_assert_uint_eq(ai.n_archived, m->n_archived);
    ck_assert_uint_eq(ai.n_streams, m->n_st);
    ck_assert_int_eq(ai.has_desc, 1);
    ck_assert_uint_eq(ai.n_sections, model_n_sections(m));
    size_t ns;
    OK_R(r, fkvf_reader_stream_count(r, &ns));
    ck_assert_uint_eq(ns, m->n_st);

    check_desc(r, &m->desc);
    if (m->meta) {
        check_meta(r);
    } else {
        size_t n = 99;
        OK_R(r, fkvf_reader_meta_count(r, &n));
        ck_assert_uint_eq(n, 0);
        fkvf_meta_entry e;
        RC_R(r, fkvf_reader_meta(r, 0, &e), FKVF_E_RANGE);
        RC_R(r, fkvf_reader_meta_find(r, "run.steps", &e), FKVF_E_NOT_FOUND);
    }
    check_exact(r, m);
    int ext = -1;
    uint8_t ref_hash[16];
    const char *ref_name = NULL;
    OK_R(r, fkvf_reader_codebook_ref(r, &ext, ref_hash, &ref_name));
    ck_assert_int_eq(ext, m->cb == 2);
    if (m->cb == 2) {
        /* an external codebook that is not attached (spec 13.5) */
        ck_assert(memcmp(ref_hash, m->cb_hash, 16) == 0);
        ck_assert_str_eq(ref_name, m->cb_name ? m->cb_name : "");
        RC_R(r, fkvf_reader_codebook(r, NULL, NULL, NULL, NULL), FKVF_E_CODEBOOK);
        char hx[33];
        hex16(m->cb_hash, hx);
        ck_assert(strstr(fkvf_reader_message(r), hx) != NULL);
        fkvf_section_info si;
        ck_assert_uint_ne(find_section(r, FKVF_SECTION_CBRF, 0, &si), SIZE_MAX);
        ck_assert_uint_eq(si.flags, FKVF_SECTION_REQUIRED);
        ck_assert_uint_eq(si.size, 24 + (m->cb_name ? strlen(m->cb_name) : 0));
    } else if (m->cb) {
        check_codebook(r, &m->cbs, m->cb_tables, m->cb_tables_size);
        fkvf_section_info si;
        ck_assert_uint_ne(find_section(r, FKVF_SECTION_CBK1, 0, &si), SIZE_MAX);
        ck_assert_uint_eq(si.flags, FKVF_SECTION_REQUIRED | m->cb_flags);
        ck_assert_uint_eq(si.size, fkvf_codebook_size(&m->cbs));
        if (m->cb_flags & FKVF_SECTION_DEFLATE)
            ck_assert_uint_lt(si.stored_size, si.size);
    } else {
        RC_R(r, fkvf_reader_codebook(r, NULL, NULL, NULL, NULL), FKVF_E_NOT_FOUND);
    }
    for (size_t i = 0; i < m->n_st; i++) {
        check_stream(r, &m->st[i], 1000 + i);
        /* index streams first, in canonical order, then the token stream */
        fkvf_stream_info si;
        size_t idx = SIZE_MAX;
        OK_R(r, fkvf_reader_stream_info(r, i, &si));
        ck_assert_uint_eq(si.id, m->st[i].id);
        OK_R(r, fkvf_reader_stream_find(r, m->st[i].id, &idx));
        ck_assert_uint_eq(idx, i);
    }
    /* one STRM section per group, holding all its streams (spec 11.2-11.3) */
    uint32_t bs = m->opts.block_size ? m->opts.block_size : 4096;
    for (unsigned g = 0; g < 2; g++) {
        fkvf_section_info sec;
        size_t at = find_section(r, FKVF_SECTION_STRM, g, &sec);
        int has = g == FKVF_STREAM_GROUP_INDEX ? m->has_index : m->has_tokens;
        ck_assert_uint_eq(at != SIZE_MAX, has);
        if (!has)
            continue;
        const fkvf_stream_spec *sp = g == FKVF_STREAM_GROUP_INDEX ? &m->ispec : &m->tspec;
        uint64_t n = g == FKVF_STREAM_GROUP_INDEX ? m->n_archived : m->n_positions;
        uint64_t nstr = g == FKVF_STREAM_GROUP_INDEX ? model_n_index(m) : 1;
        ck_assert_uint_eq(sec.size, strm_size_of(sp, n, nstr, bs));
        ck_assert_uint_eq(sec.stored_size, sec.size);
    }
    size_t idx;
    RC_R(r, fkvf_reader_stream_find(r, FKVF_STREAM_ID(0, 0, 0, 0, 200), &idx),
         FKVF_E_NOT_FOUND);
    RC_R(r, fkvf_reader_stream_find(r, FKVF_STREAM_ID(0, m->desc.n_layers, 0, 0, 0), &idx),
         FKVF_E_NOT_FOUND);
    check_sections(r, file, size);
    if (m->extra) {
        size_t xi = find_section(r, XTRA, 7, NULL);
        ck_assert_uint_ne(xi, SIZE_MAX);
        const void *p;
        size_t n;
        OK_R(r, fkvf_reader_section_data(r, xi, &p, &n));
        ck_assert_uint_eq(n, sizeof m->extra_data);
        ck_assert(memcmp(p, m->extra_data, n) == 0);
        if (m->opts.required_features & FKVF_FEAT_DEFLATE) {
            fkvf_section_info si;
            xi = find_section(r, XTRZ, 8, &si);
            ck_assert_uint_ne(xi, SIZE_MAX);
            ck_assert_uint_eq(si.flags, FKVF_SECTION_DEFLATE);
            ck_assert_uint_lt(si.stored_size, si.size); /* it did compress */
            OK_R(r, fkvf_reader_section_data(r, xi, &p, &n));
            ck_assert_uint_eq(n, sizeof m->extra_data);
            ck_assert(memcmp(p, m->extra_data, n) == 0);
        }
    }
    OK_R(r, fkvf_reader_verify(r));
    /* everything still readable after verify */
    check_exact(r, m);
}

void roundtrip_memory(const model *m)
{
    tu_buf b;
    build(m, &b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    check_model(r, m, b.data, b.size);
    fkvf_reader_free(r);
    /* strict open of a clean file is the same */
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL));
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);
}

/* ==== files ====================================================================== */

char *make_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/fkvf-test-XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    ck_assert_msg(d != NULL, "mkdtemp: %s", strerror(errno));
    return strdup(d);
}

size_t dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

void rm_tmpdir(char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[1024];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

int path_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* ==== hand-crafting files (format helpers + hash) ================================= */

void cr_bytes(craft *c, const void *p, size_t n)
{
    fkvf_sink s = tu_buf_sink(&c->b);
    if (n)
        ck_assert_int_eq(s.write(s.opaque, p, n), (long long)n);
}

void cr_pad(craft *c)
{
    static const uint8_t z[64];
    if (c->b.size % 64)
        cr_bytes(c, z, 64 - c->b.size % 64);
}

void cr_header(craft *c, uint16_t major, uint16_t minor, uint64_t req, uint64_t opt)
{
    memset(c, 0, sizeof *c);
    fkvf_header h = {major, minor, req, opt};
    uint8_t hb[64];
    fkvf_header_write(hb, &h);
    cr_bytes(c, hb, 64);
}

size_t cr_section(craft *c, uint32_t type, uint32_t flags, uint64_t key, const void *stored,
                  size_t stored_n, uint64_t size)
{
    ck_assert_uint_lt(c->n, sizeof c->e / sizeof c->e[0]);
    cr_pad(c);
    fkvf_dirent *e = &c->e[c->n];
    memset(e, 0, sizeof *e);
    e->type = type;
    e->flags = flags;
    e->offset = c->b.size;
    e->stored_size = stored_n;
    e->size = size;
    e->key = key;
    cr_bytes(c, stored, stored_n);
    e->checksum = fkvf_xxh3_64(c->b.data + e->offset, stored_n, e->offset);
    return c->n++;
}

size_t cr_plain(craft *c, uint32_t type, uint32_t flags, uint64_t key, const void *p,
                size_t n)
{
    return cr_section(c, type, flags, key, p, n, n);
}

uint64_t cr_dir_off(craft *c)
{
    cr_pad(c);
    return c->b.size;
}

void cr_commit(craft *c, uint64_t seq, uint64_t prev, uint64_t n_pos, uint64_t n_arch)
{
    uint64_t dir_off = cr_dir_off(c);
    uint8_t blk[64];
    fkvf_dirhdr dh = {(uint32_t)c->n, seq, n_pos, n_arch};
    fkvf_dirhdr_write(blk, &dh);
    cr_bytes(c, blk, 64);
    for (size_t i = 0; i < c->n; i++) {
        fkvf_dirent_write(blk, &c->e[i]);
        cr_bytes(c, blk, 64);
    }
    uint64_t dir_size = c->b.size - dir_off;
    fkvf_trailer t = {seq, dir_off, dir_size, fkvf_xxh3_64(c->b.data + dir_off, dir_size, dir_off),
                      prev, c->b.size + 64};
    fkvf_trailer_write(blk, &t, c->b.size);
    cr_bytes(c, blk, 64);
    c->n = 0;
}

uint8_t *desc_bytes(const fkvf_desc *d, size_t *n)
{
    *n = fkvf_desc_size(d);
    uint8_t *p = malloc(*n);
    ck_assert_ptr_nonnull(p);
    fkvf_desc_write(p, d);
    return p;
}

void simple_desc(fkvf_desc *d)
{
    memset(d, 0, sizeof *d);
    d->n_layers = 1;
    d->n_kv_heads = 1;
    d->key_dim = 4;
    d->value_dim = 4;
    d->dtype = FKVF_DTYPE_F16;
    d->model_id = "model"; /* 133-byte DESC: 59 padding bytes follow */
}

void cr_desc(craft *c, uint32_t extra_flags)
{
    fkvf_desc d;
    simple_desc(&d);
    size_t n;
    uint8_t *p = desc_bytes(&d, &n);
    cr_plain(c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | extra_flags, 0, p, n);
    free(p);
}

void mb_add(mbuild *m, const char *key, uint8_t type, const void *v, uint32_t vl)
{
    fkvf_sink s = tu_buf_sink(&m->b);
    if (m->b.size == 0) {
        uint8_t z[8] = {0};
        s.write(s.opaque, z, 8);
    }
    uint8_t h[8];
    fkvf_st16(h, (uint16_t)strlen(key));
    h[2] = type;
    h[3] = 0;
    fkvf_st32(h + 4, vl);
    s.write(s.opaque, h, 8);
    s.write(s.opaque, key, strlen(key));
    if (vl)
        s.write(s.opaque, v, vl);
    m->n++;
    fkvf_st32(m->b.data, m->n);
}

void mb_u64(mbuild *m, const char *key, uint64_t v)
{
    uint8_t b[8];
    fkvf_st64(b, v);
    mb_add(m, key, FKVF_META_U64, b, 8);
}

void refresh_last_commit(uint8_t *b, size_t size)
{
    uint64_t toff = size - 64;
    uint64_t dir_off = fkvf_ld64(b + toff + 16), dir_size = fkvf_ld64(b + toff + 24);
    uint32_t n = fkvf_ld32(b + dir_off + 4);
    for (uint32_t k = 0; k < n; k++) {
        uint8_t *e = b + dir_off + 64 + 64 * (size_t)k;
        uint64_t off = fkvf_ld64(e + 8), stored = fkvf_ld64(e + 16);
        fkvf_st64(e + 40, fkvf_xxh3_64(b + off, (size_t)stored, off));
    }
    fkvf_st64(b + toff + 32, fkvf_xxh3_64(b + dir_off, (size_t)dir_size, dir_off));
    fkvf_st64(b + toff + 56, fkvf_xxh3_64(b + toff, 56, toff));
}

fkvf_strm_hdr strm_hdr_at(const uint8_t *p)
{
    fkvf_strm_hdr h;
    memset(&h, 0, sizeof h);
    h.group = fkvf_ld64(p);
    h.profile = p[8];
    h.bits = p[9];
    h.k_stages = p[10];
    h.v_stages = p[11];
    h.alphabet = fkvf_ld32(p + 12);
    h.first_symbol = fkvf_ld64(p + 16);
    h.symbol_count = fkvf_ld64(p + 24);
    h.span_symbols = fkvf_ld32(p + 32);
    h.block_size = fkvf_ld32(p + 36);
    h.r = fkvf_ldf64(p + 40);
    h.n_streams = fkvf_ld32(p + 48);
    return h;
}

void refresh_strm(uint8_t *b, uint64_t off)
{
    fkvf_strm_hdr h = strm_hdr_at(b + off);
    ck_assert_int_eq(fkvf_strm_hdr_derive(&h), FKVF_OK);
    for (uint64_t j = 0; j < h.n_blocks; j++) {
        uint64_t start = j * h.block_size;
        uint64_t len = h.data_bytes - start < h.block_size ? h.data_bytes - start : h.block_size;
        uint64_t abs = off + h.data_off + start;
        fkvf_st64(b + off + 64 + 8 * j, fkvf_xxh3_64(b + abs, (size_t)len, abs));
    }
    fkvf_st64(b + off + 56, fkvf_xxh3_64(b + off, 56, off));
}

size_t cr_strm(craft *c, fkvf_strm_hdr h, const uint8_t *data)
{
    ck_assert_int_eq(fkvf_strm_hdr_derive(&h), FKVF_OK);
    uint8_t *p = calloc(1, (size_t)h.section_size);
    ck_assert_ptr_nonnull(p);
    if (data && h.data_bytes)
        memcpy(p + h.data_off, data, (size_t)h.data_bytes);
    uint64_t off = cr_dir_off(c);
    for (uint64_t j = 0; j < h.n_blocks; j++) {
        uint64_t start = j * h.block_size;
        uint64_t len = h.data_bytes - start < h.block_size ? h.data_bytes - start : h.block_size;
        fkvf_st64(p + 64 + 8 * j,
                  fkvf_xxh3_64(p + h.data_off + start, (size_t)len, off + h.data_off + start));
    }
    fkvf_strm_hdr_write(p, &h, off);
    size_t k = cr_plain(c, FKVF_SECTION_STRM, FKVF_SECTION_REQUIRED, h.group, p,
                        (size_t)h.section_size);
    free(p);
    return k;
}

fkvf_dirhdr cr_from_file(craft *c, const uint8_t *b, size_t size)
{
    memset(c, 0, sizeof *c);
    uint64_t toff = size - 64;
    uint64_t dir_off = fkvf_ld64(b + toff + 16);
    fkvf_dirhdr dh;
    fkvf_diag d;
    memset(&d, 0, sizeof d);
    ck_assert_int_eq(fkvf_dirhdr_parse(b + dir_off, dir_off, &dh, &d), FKVF_OK);
    ck_assert_uint_le(dh.entry_count, sizeof c->e / sizeof c->e[0]);
    cr_bytes(c, b, (size_t)dir_off);
    for (uint32_t k = 0; k < dh.entry_count; k++)
        fkvf_dirent_read(b + dir_off + 64 + 64 * (size_t)k, &c->e[c->n++]);
    return dh;
}

void cr_append(craft *c, const uint8_t *b, size_t size)
{
    memset(c, 0, sizeof *c);
    cr_bytes(c, b, size);
}

size_t cr_find(const craft *c, uint32_t type, uint64_t key)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i].type == type && c->e[i].key == key)
            return i;
    ck_abort_msg("no such entry");
    return SIZE_MAX;
}

void cr_drop(craft *c, size_t i)
{
    ck_assert_uint_lt(i, c->n);
    memmove(&c->e[i], &c->e[i + 1], (c->n - i - 1) * sizeof c->e[0]);
    c->n--;
}

void cr_rehash(craft *c)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i].offset + c->e[i].stored_size <= c->b.size)
            c->e[i].checksum = fkvf_xxh3_64(c->b.data + c->e[i].offset,
                                            (size_t)c->e[i].stored_size, c->e[i].offset);
}

uint8_t *cbrf_bytes(const uint8_t hash[16], const char *name, size_t *n)
{
    size_t nl = strlen(name);
    *n = 24 + nl;
    uint8_t *p = calloc(1, *n);
    ck_assert_ptr_nonnull(p);
    memcpy(p, hash, 16);
    fkvf_st32(p + 16, (uint32_t)nl);
    memcpy(p + 24, name, nl);
    return p;
}

int try_open(const uint8_t *p, size_t n, unsigned flags, char *msg, size_t msg_size)
{
    uint8_t *c = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(c);
    if (n)
        memcpy(c, p, n);
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_memory(&r, c, n, flags, NULL);
    if (msg)
        snprintf(msg, msg_size, "%s", r ? fkvf_reader_message(r) : "(no handle)");
    fkvf_reader_free(r);
    free(c);
    return rc;
}

/* ==== shared by several sections ============================================= */

fkvf_writer *new_writer(tu_buf *b, const fkvf_writer_options *o)
{
    memset(b, 0, sizeof *b);
    fkvf_sink sink = tu_buf_sink(b);
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_sink(&w, &sink, o, NULL));
    return w;
}

void assert_msg_names(fkvf_writer *w, const char *what)
{
    const char *msg = fkvf_writer_message(w);
    ck_assert_ptr_nonnull(msg);
    ck_assert_msg(strlen(msg) > 0, "empty writer message");
    ck_assert_msg(strstr(msg, what) != NULL, "message \"%s\" does not name \"%s\"", msg, what);
}

layout layout_of(const uint8_t *b, size_t size)
{
    layout l;
    l.trailer_off = size - 64;
    l.dir_off = fkvf_ld64(b + l.trailer_off + 16);
    l.dir_size = fkvf_ld64(b + l.trailer_off + 24);
    return l;
}

void craft_base(craft *c, uint64_t req)
{
    cr_header(c, 1, 0, req, 0);
    cr_desc(c, 0);
    cr_plain(c, XTRA, 0, 0, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
             64);
}

int open_craft(craft *c, unsigned flags, char *msg, size_t msg_size)
{
    return try_open(c->b.data, c->b.size, flags, msg, msg_size);
}
