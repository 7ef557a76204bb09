/* Container tests: writer -> bytes -> reader round trips, writer refusals,
 * exhaustive truncation and bit-flip damage, hand-crafted malformed files,
 * odd addresses, allocation failure, multi-commit (torn tail) files, stream
 * groups (one STRM section holds a segment of every index stream, or of the
 * token stream; segments of later commits cut and extend them), and
 * codebooks (embedded CBK1, codebook files, CBRF references and attach,
 * the index-stream set and symbol range of spec 11.8).
 *
 * Hot loops use EXPECT (an `if` around ck_abort_msg) instead of ck_assert:
 * Check records the location of every passing ck_assert, which is slow in
 * loops of tens of thousands of iterations. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "codec/codec.h"
#include "common/hash.h"
#include "common/le.h"
#include "fkvf.h"
#include "format/format.h"
#include "testutil.h"

/* rc must be `want`; print the handle's message otherwise */
#define RC_R(r, expr, want)                                                                \
    do {                                                                                   \
        int rc_ = (expr);                                                                  \
        if (rc_ != (want))                                                                 \
            ck_abort_msg("%s:%d: %s -> %s, want %s (%s)", __FILE__, __LINE__, #expr,       \
                         fkvf_error_name(rc_), fkvf_error_name(want),                      \
                         fkvf_reader_message(r));                                          \
    } while (0)
#define RC_W(w, expr, want)                                                                \
    do {                                                                                   \
        int rc_ = (expr);                                                                  \
        if (rc_ != (want))                                                                 \
            ck_abort_msg("%s:%d: %s -> %s, want %s (%s)", __FILE__, __LINE__, #expr,       \
                         fkvf_error_name(rc_), fkvf_error_name(want),                      \
                         fkvf_writer_message(w));                                          \
    } while (0)
#define OK_R(r, expr) RC_R(r, expr, FKVF_OK)
#define OK_W(w, expr) RC_W(w, expr, FKVF_OK)

/* ==== the archive model: what a test writes and expects to read back ======== */

#define MAX_STREAMS 80

/* One stream as the reader serves it: an index stream (its group's codec)
 * or the token stream. */
typedef struct tstream {
    uint64_t id;
    fkvf_stream_spec spec; /* the codec of its group */
    uint32_t *sym;
    size_t n;
} tstream;

typedef struct model {
    fkvf_writer_options opts;
    fkvf_desc desc;
    uint64_t n_positions, n_archived;
    size_t row_bytes;
    uint8_t *rows;       /* n_positions rows (archived positions' rows are not written) */
    int meta;            /* write the standard metadata set */
    unsigned exac_flags; /* extra section flags for EXAC (FKVF_SECTION_DEFLATE) */
    int split_tail;      /* tail exact rows in two EXAC sections */
    int extra;           /* add unknown optional sections XTRA (and XTRZ deflated) */
    uint8_t extra_data[300];
    /* the index streams in canonical order (spec 11.2), then the token stream */
    tstream st[MAX_STREAMS];
    size_t n_st;
    int has_index, has_tokens;
    fkvf_stream_spec ispec, tspec; /* the codecs of the two groups */
    int codes_by_stream; /* index codes given one array per stream (pos_stride 1) */
    /* embedded codebook (spec 13), written right after DESC */
    int cb;
    unsigned cb_flags; /* extra section flags for CBK1 (FKVF_SECTION_DEFLATE) */
    fkvf_codebook_shape cbs;
    uint8_t *cb_tables; /* fkvf_codebook_size(&cbs) - 64 bytes */
    size_t cb_tables_size;
    /* cb == 2: a CBRF reference instead (spec 13.5) */
    uint8_t cb_hash[16];
    const char *cb_name;
} model;

#define XTRA FKVF_FOURCC('X', 'T', 'R', 'A')
#define XTRZ FKVF_FOURCC('X', 'T', 'R', 'Z')

static fkvf_stream_spec mkspec(fkvf_profile profile, unsigned bits, uint32_t alphabet)
{
    fkvf_stream_spec s;
    memset(&s, 0, sizeof s);
    s.profile = profile;
    s.symbol_bits = bits;
    s.alphabet = alphabet;
    return s;
}

/* `n` symbols below `range`, the extremes of the range included. */
static uint32_t *make_symbols(size_t n, uint64_t range, int quad, uint64_t seed)
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

static uint64_t spec_range(const fkvf_stream_spec *s)
{
    return s->profile == FKVF_PROFILE_QUAD ? UINT64_C(1) << s->symbol_bits : s->alphabet;
}

static size_t model_n_index(const model *m)
{
    return m->has_index ? (size_t)m->desc.n_layers * m->desc.n_kv_heads *
                              (m->cbs.k_stages + m->cbs.v_stages)
                        : 0;
}

/* The index group (spec 11.2): one stream per (layer, head, K|V, stage) of
 * the codebook, in canonical order, each of n_archived symbols below the
 * codebook size k. Call before model_tokens. */
static void model_index(model *m, fkvf_profile profile, unsigned bits, uint32_t alphabet,
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

/* Explicit ngon r and L for the index group. */
static void model_index_rl(model *m, double r, uint32_t span)
{
    m->ispec.r = r;
    m->ispec.span_symbols = span;
    for (size_t i = 0; i < model_n_index(m); i++)
        m->st[i].spec = m->ispec;
}

/* The token stream: n_positions symbols over the codec's whole alphabet. */
static void model_tokens(model *m, fkvf_profile profile, unsigned bits, uint32_t alphabet,
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

static tstream *model_token_stream(model *m)
{
    ck_assert(m->has_tokens);
    return &m->st[m->n_st - 1];
}

static size_t model_stream_of(const model *m, uint64_t id)
{
    for (size_t i = 0; i < m->n_st; i++)
        if (m->st[i].id == id)
            return i;
    ck_abort_msg("no stream %016llx in the model", (unsigned long long)id);
    return SIZE_MAX;
}

/* Finite f16 / f32 values, from a palette of 16 so that tables deflate. */
static const uint16_t f16_palette[16] = {0x0000, 0x3C00, 0xBC00, 0x3800, 0x4000, 0x3555,
                                         0x0001, 0x7BFF, 0xFBFF, 0x8000, 0x2E66, 0xC200,
                                         0x1234, 0x5A5A, 0x03FF, 0x4248};
static const uint32_t f32_palette[16] = {
    0x00000000, 0x3F800000, 0xBF800000, 0x3F000000, 0x40000000, 0x3EAAAAAB,
    0x00000001, 0x7F7FFFFF, 0xFF7FFFFF, 0x80000000, 0x3DCCCCCD, 0xC0490FDB,
    0x12345678, 0x5A5A5A5A, 0x007FFFFF, 0x42C80000};

static uint8_t *make_tables(const fkvf_codebook_shape *s, uint64_t seed, size_t *size)
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

static void shape_for(fkvf_codebook_shape *s, const fkvf_desc *d, uint32_t k, uint8_t ks,
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

/* An embedded codebook matching the descriptor; set it before the streams. */
static void model_codebook(model *m, uint32_t k, uint8_t ks, uint8_t vs, fkvf_dtype dtype,
                           int pooled, uint64_t seed)
{
    shape_for(&m->cbs, &m->desc, k, ks, vs, dtype, pooled);
    free(m->cb_tables);
    m->cb_tables = make_tables(&m->cbs, seed, &m->cb_tables_size);
    m->cb = 1;
}

static void model_rows(model *m, uint64_t seed)
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

static void model_free(model *m)
{
    free(m->rows);
    free(m->cb_tables);
    for (size_t i = 0; i < m->n_st; i++)
        free(m->st[i].sym);
    memset(m, 0, sizeof *m);
}

static const uint8_t weights16[16] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE,
                                      0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF};

/* The small archive of the damage tests: DESC, CBK1 (k, one key and one
 * value stage, per head), META, EXAC (three sections), VTXS, the index group
 * (2 layers x 2 heads x 2 stages = 8 streams of 5 symbols, codec `ix`) and
 * the token stream (quad 32 bits, 10 symbols).
 * S = 2, n_positions = 10, n_archived = 5: exact rows 0..1 and 7..9. */
static void model_small_codec(model *m, uint32_t k, fkvf_profile profile, unsigned bits,
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

/* ngon index streams with N = k (k = 16: one span of 5 symbols each) */
static void model_small_k(model *m, uint32_t k)
{
    model_small_codec(m, k, FKVF_PROFILE_NGON, 0, k);
}

static void model_small(model *m) { model_small_k(m, 16); }

/* Many blocks, deflated exact rows and codebook, extra sections. The
 * codebook is pooled with k = 4096, so the 12-bit quad index streams use
 * their whole alphabet; 32 index streams (4 layers x 4 heads x one key and
 * one value stage) of 300 symbols in one segment over 64-byte blocks, and a
 * quad 32 token stream. */
static void model_many(model *m, fkvf_dtype dtype)
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

/* f32, no RoPE, no ids, every position exact (n_positions < n_sinks). */
static void model_all_exact(model *m)
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

/* the standard metadata set */
static const uint8_t blob5[5] = {0, 1, 2, 0xFF, 0};
#define N_META 10

static int write_meta(fkvf_writer *w)
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

static uint64_t model_sinks(const model *m)
{
    return m->desc.n_sinks < m->n_positions ? m->desc.n_sinks : m->n_positions;
}

/* Symbols [first, first + count) of the model's index streams as uint16
 * codes, in the layout the model asks for; *ps, *cs: the strides. */
static uint16_t *model_codes(const model *m, uint64_t first, uint64_t count, size_t *ps,
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

/* The index segment [first, first + count) of the model's streams. */
static int write_index_segment(const model *m, fkvf_writer *w, uint64_t first, uint64_t count)
{
    size_t ps, cs;
    uint16_t *codes = model_codes(m, first, count, &ps, &cs);
    int rc = fkvf_writer_add_index_segment(w, &m->ispec, first, count, codes, ps, cs);
    free(codes);
    return rc;
}

static int write_streams(const model *m, fkvf_writer *w);

/* Everything up to and including finish; the first error. The index
 * segment has as many symbols as the first index stream of the model. */
static int write_model(const model *m, fkvf_writer *w)
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

/* Write a model to memory. */
static void build(const model *m, tu_buf *out)
{
    memset(out, 0, sizeof *out);
    fkvf_sink sink = tu_buf_sink(out);
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_sink(&w, &sink, &m->opts, NULL));
    OK_W(w, write_model(m, w));
    fkvf_writer_free(w);
    ck_assert_uint_eq(out->size % 64, 0);
}

/* The model's index and token segments (one each). */
static int write_streams(const model *m, fkvf_writer *w)
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

static size_t model_n_sections(const model *m)
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

/* Data bytes of `n` symbols of one stream of this codec (spec 11.3). */
static uint64_t stream_bytes_of(const fkvf_stream_spec *s, uint64_t n)
{
    if (s->profile == FKVF_PROFILE_QUAD)
        return (n * s->symbol_bits + 127) / 128 * 16;
    uint32_t L = fkvf_stream_spec_align(s);
    ck_assert_uint_gt(L, 0);
    return (n + L - 1) / L * 16;
}

/* Size of a STRM section (spec 11.3) of n_streams streams of n symbols. */
static uint64_t strm_size_of(const fkvf_stream_spec *s, uint64_t n, uint64_t n_streams,
                             uint32_t block_size)
{
    uint64_t data = stream_bytes_of(s, n) * n_streams;
    uint64_t nb = (data + block_size - 1) / block_size;
    return (64 + 8 * nb + 63) / 64 * 64 + data;
}

/* ==== reading back ================================================================ */

static size_t find_section(fkvf_reader *r, uint32_t type, uint64_t key, fkvf_section_info *out)
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

static void check_desc(fkvf_reader *r, const fkvf_desc *want)
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

static void check_meta_entry(const fkvf_meta_entry *e, const char *key, fkvf_meta_type type,
                             const void *value, size_t value_len)
{
    ck_assert_uint_eq(e->key_len, strlen(key));
    ck_assert(memcmp(e->key, key, e->key_len) == 0);
    ck_assert_int_eq(e->type, type);
    ck_assert_uint_eq(e->value_len, value_len);
    if (value_len)
        ck_assert(memcmp(e->value, value, value_len) == 0);
}

static void check_meta(fkvf_reader *r)
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

/* the vertex table of N from the file (spec 10) */
static double *read_vtxs(fkvf_reader *r, uint32_t n)
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

/* A stream of the served commit equals `ts`: info (its group's codec, n_seg
 * segments holding `stored` data bytes of it), every read path, CGR points. */
static void check_stream_seg(fkvf_reader *r, const tstream *ts, uint64_t seed, size_t n_seg,
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

/* A stream of a single-segment group. */
static void check_stream(fkvf_reader *r, const tstream *ts, uint64_t seed)
{
    check_stream_seg(r, ts, seed, 1, stream_bytes_of(&ts->spec, ts->n));
}

static void check_sections(fkvf_reader *r, const uint8_t *file, size_t file_size)
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

static void check_exact(fkvf_reader *r, const model *m)
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

/* The CBK1 contents of spec 13.1-13.2, laid out here from the spec's table
 * (not with the library's helpers). */
static uint8_t *cbk1_bytes(const fkvf_codebook_shape *s, const uint8_t *tables, size_t tsize,
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

static void check_shape_eq(const fkvf_codebook_shape *a, const fkvf_codebook_shape *b)
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

/* fkvf_reader_codebook serves exactly this codebook; its hash is XXH3-128
 * of the contents (spec 13.3). Returns the contents pointer. */
static const void *check_codebook(fkvf_reader *r, const fkvf_codebook_shape *shape,
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

static void hex16(const uint8_t h[16], char out[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* Read back and compare everything of a clean single-commit archive. */
static void check_model(fkvf_reader *r, const model *m, const uint8_t *file, size_t size)
{
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_uint_eq(ai.format_major, FKVF_FORMAT_MAJOR);
    ck_assert_uint_eq(ai.format_minor, FKVF_FORMAT_MINOR);
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

static void roundtrip_memory(const model *m)
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

static char *make_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/fkvf-test-XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    ck_assert_msg(d != NULL, "mkdtemp: %s", strerror(errno));
    return strdup(d);
}

static size_t dir_entries(const char *dir)
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

static void rm_tmpdir(char *dir)
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

static int path_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* ==== hand-crafting files (format helpers + hash) ================================= */

typedef struct craft {
    tu_buf b;
    fkvf_dirent e[64];
    size_t n;
} craft;

static void cr_bytes(craft *c, const void *p, size_t n)
{
    fkvf_sink s = tu_buf_sink(&c->b);
    if (n)
        ck_assert_int_eq(s.write(s.opaque, p, n), (long long)n);
}

static void cr_pad(craft *c)
{
    static const uint8_t z[64];
    if (c->b.size % 64)
        cr_bytes(c, z, 64 - c->b.size % 64);
}

static void cr_header(craft *c, uint16_t major, uint16_t minor, uint64_t req, uint64_t opt)
{
    memset(c, 0, sizeof *c);
    fkvf_header h = {major, minor, req, opt};
    uint8_t hb[64];
    fkvf_header_write(hb, &h);
    cr_bytes(c, hb, 64);
}

/* Append a section's stored bytes (aligned) and record its entry. */
static size_t cr_section(craft *c, uint32_t type, uint32_t flags, uint64_t key, const void *stored,
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

static size_t cr_plain(craft *c, uint32_t type, uint32_t flags, uint64_t key, const void *p,
                       size_t n)
{
    return cr_section(c, type, flags, key, p, n, n);
}

/* Offset the directory will get. */
static uint64_t cr_dir_off(craft *c)
{
    cr_pad(c);
    return c->b.size;
}

/* Directory + trailer of a commit. */
static void cr_commit(craft *c, uint64_t seq, uint64_t prev, uint64_t n_pos, uint64_t n_arch)
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

/* A DESC section's bytes. */
static uint8_t *desc_bytes(const fkvf_desc *d, size_t *n)
{
    *n = fkvf_desc_size(d);
    uint8_t *p = malloc(*n);
    ck_assert_ptr_nonnull(p);
    fkvf_desc_write(p, d);
    return p;
}

static void simple_desc(fkvf_desc *d)
{
    memset(d, 0, sizeof *d);
    d->n_layers = 1;
    d->n_kv_heads = 1;
    d->key_dim = 4;
    d->value_dim = 4;
    d->dtype = FKVF_DTYPE_F16;
    d->model_id = "model"; /* 133-byte DESC: 59 padding bytes follow */
}

static void cr_desc(craft *c, uint32_t extra_flags)
{
    fkvf_desc d;
    simple_desc(&d);
    size_t n;
    uint8_t *p = desc_bytes(&d, &n);
    cr_plain(c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | extra_flags, 0, p, n);
    free(p);
}

/* META section bytes builder */
typedef struct mbuild {
    tu_buf b;
    uint32_t n;
} mbuild;

static void mb_add(mbuild *m, const char *key, uint8_t type, const void *v, uint32_t vl)
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

static void mb_u64(mbuild *m, const char *key, uint64_t v)
{
    uint8_t b[8];
    fkvf_st64(b, v);
    mb_add(m, key, FKVF_META_U64, b, 8);
}

/* Recompute, for the last commit, every directory entry checksum, the
 * directory checksum and the trailer checksum (after editing payloads). */
static void refresh_last_commit(uint8_t *b, size_t size)
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

/* The segment header of spec 11.2 at p, read field by field (no checks). */
static fkvf_strm_hdr strm_hdr_at(const uint8_t *p)
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

/* Recompute a STRM section's head checksum and block checksums (spec 11.2-11.4). */
static void refresh_strm(uint8_t *b, uint64_t off)
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

/* A STRM section from the header fields in h (derived sizes filled in here)
 * and `data` (data_bytes bytes, NULL = zeros), with valid checksums, as the
 * next section of c. */
static size_t cr_strm(craft *c, fkvf_strm_hdr h, const uint8_t *data)
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

/* Take over a complete file for editing its last commit: the bytes before
 * that commit's directory, and its entries (to drop, change or add to, then
 * cr_commit again with the returned directory header's values). */
static fkvf_dirhdr cr_from_file(craft *c, const uint8_t *b, size_t size)
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

/* Start a further commit after a complete file. */
static void cr_append(craft *c, const uint8_t *b, size_t size)
{
    memset(c, 0, sizeof *c);
    cr_bytes(c, b, size);
}

static size_t cr_find(const craft *c, uint32_t type, uint64_t key)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i].type == type && c->e[i].key == key)
            return i;
    ck_abort_msg("no such entry");
    return SIZE_MAX;
}

static void cr_drop(craft *c, size_t i)
{
    ck_assert_uint_lt(i, c->n);
    memmove(&c->e[i], &c->e[i + 1], (c->n - i - 1) * sizeof c->e[0]);
    c->n--;
}

/* Recompute the entry checksums of the pending commit (after editing bytes). */
static void cr_rehash(craft *c)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i].offset + c->e[i].stored_size <= c->b.size)
            c->e[i].checksum = fkvf_xxh3_64(c->b.data + c->e[i].offset,
                                            (size_t)c->e[i].stored_size, c->e[i].offset);
}

/* CBRF contents (spec 13.5). */
static uint8_t *cbrf_bytes(const uint8_t hash[16], const char *name, size_t *n)
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

/* Open a copy of exactly `n` bytes (so over-reads are caught by ASan), keep
 * the message, free everything. */
static int try_open(const uint8_t *p, size_t n, unsigned flags, char *msg, size_t msg_size)
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
typedef struct codec_choice {
    fkvf_profile profile;
    unsigned bits;     /* quad */
    uint32_t alphabet; /* ngon */
} codec_choice;

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

/* ==== 2. writer determinism and atomic create ===================================== */

START_TEST(writer_is_deterministic_through_sink)
{
    model m;
    model_many(&m, FKVF_DTYPE_F32);
    tu_buf a, b;
    build(&m, &a);
    build(&m, &b);
    ck_assert_uint_eq(a.size, b.size);
    ck_assert(memcmp(a.data, b.data, a.size) == 0);
    tu_buf_free(&a);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(writer_is_deterministic_through_file)
{
    model m;
    model_small(&m);
    char *dir = make_tmpdir();
    char p1[600], p2[600];
    snprintf(p1, sizeof p1, "%s/one.fkvf", dir);
    snprintf(p2, sizeof p2, "%s/two.fkvf", dir);
    const char *paths[2] = {p1, p2};
    for (int i = 0; i < 2; i++) {
        fkvf_writer *w = NULL;
        m.opts.sync = i ? FKVF_SYNC_NONE : FKVF_SYNC_COMMIT; /* the sync path must not change the bytes */
        OK_W(w, fkvf_writer_create_file(&w, paths[i], &m.opts, NULL));
        OK_W(w, write_model(&m, w));
        fkvf_writer_free(w);
    }
    size_t n1, n2;
    uint8_t *f1 = tu_slurp(p1, &n1), *f2 = tu_slurp(p2, &n2);
    ck_assert_uint_eq(n1, n2);
    ck_assert(memcmp(f1, f2, n1) == 0);
    tu_buf b;
    build(&m, &b);
    ck_assert_uint_eq(b.size, n1);
    ck_assert(memcmp(b.data, f1, n1) == 0);
    ck_assert_uint_eq(dir_entries(dir), 2); /* no temp files left */
    tu_buf_free(&b);
    free(f1);
    free(f2);
    rm_tmpdir(dir);
    model_free(&m);
}
END_TEST

START_TEST(writer_create_file_is_atomic)
{
    model m;
    model_small(&m);
    char *dir = make_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/atomic.fkvf", dir);

    /* abandoned before finish: neither the file nor a temp file remains */
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_file(&w, path, &m.opts, NULL));
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    ck_assert(!path_exists(path));
    ck_assert_uint_eq(dir_entries(dir), 1); /* the temp file */
    fkvf_writer_free(w);
    ck_assert(!path_exists(path));
    ck_assert_uint_eq(dir_entries(dir), 0);

    /* a failed finish (inconsistent archive) leaves nothing behind either */
    w = NULL;
    OK_W(w, fkvf_writer_create_file(&w, path, &m.opts, NULL));
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_set_positions(w, 10, 5));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    ck_assert(!path_exists(path));
    fkvf_writer_free(w);
    ck_assert_uint_eq(dir_entries(dir), 0);

    /* finished: the file exists under its name only, and opens */
    w = NULL;
    OK_W(w, fkvf_writer_create_file(&w, path, &m.opts, NULL));
    OK_W(w, write_model(&m, w));
    ck_assert(path_exists(path));
    ck_assert_uint_eq(dir_entries(dir), 1);
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE); /* finished once */
    RC_W(w, fkvf_writer_meta_u64(w, "late", 1), FKVF_E_STATE);
    fkvf_writer_free(w);
    ck_assert(path_exists(path));
    ck_assert_uint_eq(dir_entries(dir), 1);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL));
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    check_model(r, &m, NULL, (size_t)st.st_size);
    fkvf_reader_free(r);

    /* replacing an existing file is atomic too: the old one stays until finish */
    w = NULL;
    model m2;
    model_all_exact(&m2);
    OK_W(w, fkvf_writer_create_file(&w, path, &m2.opts, NULL));
    OK_W(w, fkvf_writer_set_desc(w, &m2.desc));
    r = NULL;
    OK_R(r, fkvf_reader_open_file(&r, path, 0, NULL));
    fkvf_reader_free(r);
    fkvf_writer_free(w);
    r = NULL;
    OK_R(r, fkvf_reader_open_file(&r, path, 0, NULL));
    check_model(r, &m, NULL, (size_t)st.st_size);
    fkvf_reader_free(r);
    ck_assert_uint_eq(dir_entries(dir), 1);

    /* a directory that does not exist: IO, message, nothing created */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/missing/x.fkvf", dir);
    w = NULL;
    ck_assert_int_eq(fkvf_writer_create_file(&w, bad, &m.opts, NULL), FKVF_E_IO);
    ck_assert_ptr_nonnull(w);
    ck_assert(strlen(fkvf_writer_message(w)) > 0);
    fkvf_writer_free(w);
    ck_assert_uint_eq(dir_entries(dir), 1);

    model_free(&m2);
    rm_tmpdir(dir);
    model_free(&m);
}
END_TEST

/* fkvf_writer_options.no_replace: an existing PATH is never replaced, not
 * even one that appears while the file is written (another process). */
START_TEST(writer_no_replace_keeps_existing_file)
{
    model m;
    model_small(&m);
    char *dir = make_tmpdir();
    char path[600], link_path[620];
    snprintf(path, sizeof path, "%s/keep.fkvf", dir);
    fkvf_writer_options o = m.opts;
    o.no_replace = 1;
    static const char other[] = "someone else's file\n";
    fkvf_error_info e;

    /* PATH exists at create: FKVF_E_EXISTS, nothing written */
    tu_write_file(path, other, sizeof other);
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_file(&w, path, &o, NULL), FKVF_E_EXISTS);
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(fkvf_writer_error(w, &e), FKVF_OK);
    ck_assert_int_eq(e.code, FKVF_E_EXISTS);
    ck_assert_str_eq(e.file, path);
    ck_assert(e.offset == FKVF_ERROR_NO_OFFSET && e.clause == NULL);
    ck_assert_str_eq(e.message, fkvf_writer_message(w));
    fkvf_writer_free(w);
    ck_assert_uint_eq(dir_entries(dir), 1);

    /* a dangling symbolic link is a file at PATH too (rename would replace it) */
    snprintf(link_path, sizeof link_path, "%s/dangling.fkvf", dir);
    ck_assert_int_eq(symlink("no-such-target", link_path), 0);
    w = NULL;
    ck_assert_int_eq(fkvf_writer_create_file(&w, link_path, &o, NULL), FKVF_E_EXISTS);
    fkvf_writer_free(w);
    ck_assert_int_eq(unlink(link_path), 0);

    /* PATH appears between create and finish: finish refuses, the other
     * file keeps its bytes, the temporary file goes away with free() */
    ck_assert_int_eq(unlink(path), 0);
    w = NULL;
    OK_W(w, fkvf_writer_create_file(&w, path, &o, NULL));
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    tu_write_file(path, other, sizeof other);
    OK_W(w, fkvf_writer_set_positions(w, 0, 0));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_EXISTS);
    ck_assert_int_eq(fkvf_writer_error(w, &e), FKVF_OK);
    ck_assert_int_eq(e.code, FKVF_E_EXISTS);
    fkvf_writer_free(w);
    size_t n;
    uint8_t *got = tu_slurp(path, &n);
    ck_assert_uint_eq(n, sizeof other);
    ck_assert(!memcmp(got, other, n));
    free(got);
    ck_assert_uint_eq(dir_entries(dir), 1);

    /* no file at PATH: the archive is put in place under its name only */
    ck_assert_int_eq(unlink(path), 0);
    w = NULL;
    OK_W(w, fkvf_writer_create_file(&w, path, &o, NULL));
    OK_W(w, write_model(&m, w));
    fkvf_writer_free(w);
    ck_assert_uint_eq(dir_entries(dir), 1);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL));
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_nlink, 1);
    check_model(r, &m, NULL, (size_t)st.st_size);
    fkvf_reader_free(r);

    /* the default replaces it */
    fkvf_writer_options_init(&o);
    ck_assert_int_eq(o.no_replace, 0);
    rm_tmpdir(dir);
    model_free(&m);
}
END_TEST

/* The mode of a written file: 0666 less the umask by default (as open(2)
 * and fopen give; it was always 0644), or exactly opts.mode. Each umask in a
 * child process (the umask is per process). */
static unsigned written_mode(const char *path, unsigned umask_bits, unsigned opt_mode)
{
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        umask((mode_t)umask_bits);
        model m;
        model_small(&m);
        fkvf_writer_options o = m.opts;
        o.mode = opt_mode;
        fkvf_writer *w = NULL;
        unlink(path);
        if (fkvf_writer_create_file(&w, path, &o, NULL) != FKVF_OK || write_model(&m, w) != FKVF_OK)
            _exit(1);
        fkvf_writer_free(w);
        model_free(&m);
        _exit(0);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return (unsigned)st.st_mode & 07777;
}

START_TEST(writer_file_mode)
{
    char *dir = make_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/mode.fkvf", dir);
    ck_assert_uint_eq(written_mode(path, 077, 0), 0600);
    ck_assert_uint_eq(written_mode(path, 022, 0), 0644);
    ck_assert_uint_eq(written_mode(path, 002, 0), 0664);
    /* opts.mode: exactly these bits, whatever the umask */
    ck_assert_uint_eq(written_mode(path, 022, 0600), 0600);
    ck_assert_uint_eq(written_mode(path, 077, 0640), 0640);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    ck_assert_uint_eq(o.mode, 0);
    unlink(path);
    rm_tmpdir(dir);
}
END_TEST

/* The fields of fkvf_reader_error / fkvf_appender_error on known-corrupt
 * files of the conformance suite: the class and clause its manifest lists,
 * and the offset of the field the spec's header table places the fault in
 * (hdr_byte_order: byte_order at offset 16; hdr_major_2: format_major at
 * offset 10, spec 3). */
START_TEST(error_info_of_conformance_files)
{
    const char *src = getenv("FKVF_SRCDIR");
    ck_assert_msg(src != NULL, "FKVF_SRCDIR not set");
    static const struct {
        const char *name;
        uint64_t offset;
    } cases[] = {{"hdr_byte_order.fkvf", 16}, {"hdr_major_2.fkvf", 10}};
    char path[1024];
    snprintf(path, sizeof path, "%s/conformance/manifest.tsv", src);
    size_t msize;
    uint8_t *mtext = tu_slurp(path, &msize);
    char *manifest = realloc(mtext, msize + 1);
    ck_assert_ptr_nonnull(manifest);
    manifest[msize] = 0;
    char *dir = make_tmpdir();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* the manifest row: name, verify, open, class, clause, ... */
        char key[128];
        snprintf(key, sizeof key, "\n%s\t", cases[i].name);
        char *row = strstr(manifest, key);
        ck_assert_msg(row != NULL, "%s not in the manifest", cases[i].name);
        char cls[32], clause[64];
        ck_assert_int_eq(sscanf(row + 1, "%*[^\t]\t%*[^\t]\t%*[^\t]\t%31[^\t]\t%63[^\t]", cls,
                                clause),
                         2);
        char want_name[48];
        snprintf(want_name, sizeof want_name, "FKVF_E_%s", cls);

        snprintf(path, sizeof path, "%s/conformance/files/%s", src, cases[i].name);
        fkvf_reader *r = NULL;
        int rc = fkvf_reader_open_file(&r, path, 0, NULL);
        ck_assert_str_eq(fkvf_error_name(rc), want_name);
        fkvf_error_info e;
        ck_assert_int_eq(fkvf_reader_error(r, &e), FKVF_OK);
        ck_assert_int_eq(e.code, rc);
        ck_assert_uint_eq(e.offset, cases[i].offset);
        ck_assert_ptr_nonnull(e.clause);
        /* "3.1" is the clause of "§3.1 step 4" */
        char cited[32];
        snprintf(cited, sizeof cited, "\xc2\xa7%s", e.clause);
        ck_assert_msg(!strncmp(clause, cited, strlen(cited)) &&
                          (clause[strlen(cited)] == ' ' || clause[strlen(cited)] == ',' ||
                           !clause[strlen(cited)]),
                      "%s: clause %s, the manifest has %s", cases[i].name, e.clause, clause);
        ck_assert_str_eq(e.file, path);
        ck_assert_str_eq(e.message, fkvf_reader_message(r));
        fkvf_reader_free(r);

        /* the appender keeps the fields of the reader's error */
        size_t n;
        uint8_t *bytes = tu_slurp(path, &n);
        char copy[700];
        snprintf(copy, sizeof copy, "%s/%s", dir, cases[i].name);
        tu_write_file(copy, bytes, n);
        free(bytes);
        fkvf_appender *a = NULL;
        ck_assert_int_eq(fkvf_appender_open(&a, copy, NULL, NULL), rc);
        ck_assert_ptr_nonnull(a);
        ck_assert_int_eq(fkvf_appender_error(a, &e), FKVF_OK);
        ck_assert_int_eq(e.code, rc);
        ck_assert_uint_eq(e.offset, cases[i].offset);
        ck_assert_ptr_nonnull(e.clause);
        ck_assert_msg(!strncmp(clause, cited, strlen(cited)), "appender: clause %s", e.clause);
        fkvf_appender_free(a);
    }
    free(manifest);
    rm_tmpdir(dir);
}
END_TEST

/* ==== 3. the writer refuses inconsistent archives ================================= */

static fkvf_writer *new_writer(tu_buf *b, const fkvf_writer_options *o)
{
    memset(b, 0, sizeof *b);
    fkvf_sink sink = tu_buf_sink(b);
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_sink(&w, &sink, o, NULL));
    return w;
}

static void assert_msg_names(fkvf_writer *w, const char *what)
{
    const char *msg = fkvf_writer_message(w);
    ck_assert_ptr_nonnull(msg);
    ck_assert_msg(strlen(msg) > 0, "empty writer message");
    ck_assert_msg(strstr(msg, what) != NULL, "message \"%s\" does not name \"%s\"", msg, what);
}

START_TEST(writer_refuses_stream_length_mismatch)
{
    model m;
    model_small(&m);
    m.st[0].n = 4; /* the index segment: n_archived is 5 */
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    RC_W(w, write_model(&m, w), FKVF_E_STATE);
    assert_msg_names(w, "index streams have 4 symbols");
    assert_msg_names(w, "11.6");
    fkvf_writer_free(w);
    tu_buf_free(&b);
    /* the token stream must have n_positions symbols */
    m.st[0].n = 5;
    model_token_stream(&m)->n = 5;
    w = new_writer(&b, &m.opts);
    RC_W(w, write_model(&m, w), FKVF_E_STATE);
    assert_msg_names(w, "token stream has 5 symbols");
    fkvf_writer_free(w);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(writer_refuses_uncovered_exact_position)
{
    model m;
    model_small(&m);
    m.split_tail = 0;
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_add_exact(w, 0, 2, m.rows, 2 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_add_exact(w, 7, 2, m.rows, 2 * m.row_bytes, 0)); /* 9 missing */
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    OK_W(w, write_streams(&m, w));
    OK_W(w, fkvf_writer_set_positions(w, 10, 5));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    assert_msg_names(w, "exact position 9");
    /* still open: add the row and finish */
    OK_W(w, fkvf_writer_add_exact(w, 9, 1, m.rows + 9 * m.row_bytes, m.row_bytes, 0));
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);

    /* a sink position uncovered */
    w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_add_exact(w, 1, 1, m.rows, m.row_bytes, 0));
    OK_W(w, fkvf_writer_set_positions(w, 2, 0));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    assert_msg_names(w, "exact position 0");
    fkvf_writer_free(w);
    tu_buf_free(&b);

    /* n_archived that does not fit after the sinks (index streams of 2
     * symbols, 2 sinks, 3 positions) */
    w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    OK_W(w, write_index_segment(&m, w, 0, 2));
    OK_W(w, fkvf_writer_add_exact(w, 0, 3, m.rows, 3 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_set_positions(w, 3, 2));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    assert_msg_names(w, "n_archived");
    fkvf_writer_free(w);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(writer_refuses_duplicate_and_reserved_meta_keys)
{
    tu_buf b;
    fkvf_writer *w = new_writer(&b, NULL);
    OK_W(w, fkvf_writer_meta_u64(w, "k", 1));
    RC_W(w, fkvf_writer_meta_u64(w, "k", 1), FKVF_E_DUP_KEY);
    assert_msg_names(w, "\"k\"");
    RC_W(w, fkvf_writer_meta_utf8(w, "k", "x"), FKVF_E_DUP_KEY); /* any type */
    OK_W(w, fkvf_writer_meta_u64(w, "kk", 1));                   /* prefix is fine */
    RC_W(w, fkvf_writer_meta_bool(w, "fkvf.version", 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "fkvf.");
    RC_W(w, fkvf_writer_meta_u64(w, "fkvf.", 1), FKVF_E_INVALID_ARG);
    OK_W(w, fkvf_writer_meta_u64(w, "fkvf", 1)); /* not the reserved prefix */
    OK_W(w, fkvf_writer_meta_u64(w, "FKVF.x", 1));
    RC_W(w, fkvf_writer_meta_u64(w, "", 1), FKVF_E_INVALID_ARG);
    char long_key[300];
    memset(long_key, 'a', sizeof long_key);
    long_key[256] = 0;
    RC_W(w, fkvf_writer_meta_u64(w, long_key, 1), FKVF_E_INVALID_ARG);
    long_key[255] = 0;
    OK_W(w, fkvf_writer_meta_u64(w, long_key, 1)); /* 255 bytes is the maximum */
    RC_W(w, fkvf_writer_meta_u64(w, "bad\xC0\x80", 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_meta_utf8(w, "v", "\xED\xA0\x80"), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_meta_u64(w, NULL, 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_meta_bytes(w, "nb", NULL, 3), FKVF_E_INVALID_ARG);
    /* without a descriptor the file must be a codebook file (spec 13.4):
     * metadata alone is refused, a codebook makes it valid */
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    assert_msg_names(w, "13.4");
    fkvf_desc sd;
    simple_desc(&sd);
    fkvf_codebook_shape cs;
    shape_for(&cs, &sd, 16, 1, 0, FKVF_DTYPE_F16, 0);
    size_t tn;
    uint8_t *tables = make_tables(&cs, 1, &tn);
    OK_W(w, fkvf_writer_add_codebooks(w, &cs, tables, tn, 0));
    free(tables);
    /* the refused calls left nothing behind: the file holds 5 entries */
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    size_t n;
    OK_R(r, fkvf_reader_meta_count(r, &n));
    ck_assert_uint_eq(n, 5);
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_int_eq(ai.has_desc, 0);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);
}
END_TEST

START_TEST(writer_refuses_ngon_without_feature)
{
    model m;
    model_small(&m); /* ngon index streams */
    m.opts.required_features = 0;
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    RC_W(w, write_index_segment(&m, w, 0, 5), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "FKVF_FEAT_NGON");
    /* the token stream too */
    fkvf_stream_spec tg = mkspec(FKVF_PROFILE_NGON, 0, 16);
    RC_W(w, fkvf_writer_add_token_segment(w, &tg, 0, model_token_stream(&m)->sym, 0),
         FKVF_E_INVALID_ARG);
    assert_msg_names(w, "FKVF_FEAT_NGON");
    fkvf_writer_free(w);
    tu_buf_free(&b);
    /* deflate without its feature bit */
    w = new_writer(&b, &m.opts);
    RC_W(w, fkvf_writer_add_section(w, XTRA, FKVF_SECTION_DEFLATE, 0, "x", 1),
         FKVF_E_INVALID_ARG);
    assert_msg_names(w, "FKVF_FEAT_DEFLATE");
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    RC_W(w, fkvf_writer_add_exact(w, 0, 1, m.rows, m.row_bytes, FKVF_SECTION_DEFLATE),
         FKVF_E_INVALID_ARG);
    fkvf_writer_free(w);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* Index codes of 8 streams x 5 positions, one row per position, all `v`
 * except code[at] = bad. */
static void fill_codes(uint16_t codes[40], uint16_t v, size_t at, uint16_t bad)
{
    for (size_t i = 0; i < 40; i++)
        codes[i] = v;
    if (at < 40)
        codes[at] = bad;
}

START_TEST(writer_refuses_bad_streams)
{
    model m;
    model_small(&m); /* codebook k = 16, one key and one value stage: 8 index streams */
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    /* a symbol outside the codec's alphabet is the caller's error (was SYMBOL) */
    fkvf_stream_spec q = mkspec(FKVF_PROFILE_QUAD, 8, 0);
    uint32_t sym[5] = {1, 2, 256, 3, 4}; /* 256 needs 9 bits */
    RC_W(w, fkvf_writer_add_token_segment(w, &q, 0, sym, 5), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "outside the alphabet");
    uint16_t codes[40];
    q.symbol_bits = 2;
    fill_codes(codes, 1, 8 * 2 + 7, 4); /* position 2 of stream 7: below k, not 2 bits */
    RC_W(w, fkvf_writer_add_index_segment(w, &q, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "outside the alphabet");
    assert_msg_names(w, "stream 7");
    /* an index symbol >= k, whatever the codec could hold (spec 11.8), in
     * either code layout */
    q.symbol_bits = 8;
    fill_codes(codes, 15, 8 * 4 + 3, 16);
    RC_W(w, fkvf_writer_add_index_segment(w, &q, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "k = 16");
    assert_msg_names(w, "index stream 3, symbol 4 is 16");
    fill_codes(codes, 0, 5 * 6 + 1, 255); /* stream 6, position 1: pos_stride 1, code_stride 5 */
    RC_W(w, fkvf_writer_add_index_segment(w, &q, 0, 5, codes, 1, 5), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "index stream 6, symbol 1 is 255");
    fill_codes(codes, 15, 40, 0);
    static const unsigned bad_bits[] = {0, 1, 3, 7, 33, 34, 64};
    for (size_t i = 0; i < sizeof bad_bits / sizeof bad_bits[0]; i++) {
        q.symbol_bits = bad_bits[i];
        RC_W(w, fkvf_writer_add_index_segment(w, &q, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
        assert_msg_names(w, "symbol_bits");
        RC_W(w, fkvf_writer_add_token_segment(w, &q, 0, sym, 0), FKVF_E_INVALID_ARG);
        ck_assert_uint_eq(fkvf_stream_spec_align(&q), 0);
    }
    /* ngon symbol >= N (N < k) */
    fkvf_stream_spec g = mkspec(FKVF_PROFILE_NGON, 0, 8);
    fill_codes(codes, 7, 20, 8);
    RC_W(w, fkvf_writer_add_index_segment(w, &g, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "outside the alphabet");
    /* ngon symbol >= k (N > k) */
    g.alphabet = 32;
    fill_codes(codes, 7, 20, 20);
    RC_W(w, fkvf_writer_add_index_segment(w, &g, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "k = 16");
    g.alphabet = 1;
    RC_W(w, fkvf_writer_add_index_segment(w, &g, 0, 0, NULL, 8, 1), FKVF_E_INVALID_ARG);
    g.alphabet = 16;
    g.r = 0.9; /* > r_N */
    RC_W(w, fkvf_writer_add_index_segment(w, &g, 0, 0, NULL, 8, 1), FKVF_E_INVALID_ARG);
    g.r = 0;
    g.span_symbols = fkvf_ngon_max_span(fkvf_ngon_rmax(16)) + 1; /* > L_max(r) */
    RC_W(w, fkvf_writer_add_index_segment(w, &g, 0, 0, NULL, 8, 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_token_segment(w, &g, 0, NULL, 0), FKVF_E_INVALID_ARG);
    g.span_symbols = 0;
    fkvf_stream_spec ok = mkspec(FKVF_PROFILE_QUAD, 8, 0);
    ok.profile = (fkvf_profile)3;
    RC_W(w, fkvf_writer_add_index_segment(w, &ok, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "profile");
    ck_assert_uint_eq(fkvf_stream_spec_align(&ok), 0);
    ck_assert_uint_eq(fkvf_stream_spec_align(NULL), 0);
    ok.profile = FKVF_PROFILE_QUAD;
    /* missing arguments */
    RC_W(w, fkvf_writer_add_index_segment(w, NULL, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_index_segment(w, &ok, 0, 5, NULL, 8, 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_token_segment(w, NULL, 0, sym, 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_token_segment(w, &ok, 0, NULL, 1), FKVF_E_INVALID_ARG);
    /* a first segment must start at 0 (aligned and not beyond the length) */
    RC_W(w, fkvf_writer_add_index_segment(w, &ok, 16, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "at most their length 0");
    RC_W(w, fkvf_writer_add_index_segment(w, &ok, 8, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "multiple of 16");
    fill_codes(codes, 15, 40, 0);
    /* refused calls wrote nothing: the group takes its first segment now;
     * a second one with another codec is refused (spec 11.6) */
    OK_W(w, fkvf_writer_add_index_segment(w, &ok, 0, 5, codes, 8, 1));
    fkvf_stream_spec ok2 = mkspec(FKVF_PROFILE_QUAD, 6, 0);
    RC_W(w, fkvf_writer_add_index_segment(w, &ok2, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "codec differs");
    /* the same codec again replaces the streams from `first` on */
    OK_W(w, fkvf_writer_add_index_segment(w, &ok, 0, 5, codes, 8, 1));
    OK_W(w, fkvf_writer_add_token_segment(w, &m.tspec, 0, model_token_stream(&m)->sym, 10));
    OK_W(w, fkvf_writer_add_exact(w, 0, 2, m.rows, 2 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_add_exact(w, 7, 3, m.rows + 7 * m.row_bytes, 3 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_set_positions(w, 10, 5));
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_uint_eq(ai.n_sections, 2 + 2 + 3); /* DESC CBK1, STRM x2 + STRM, EXAC x2 */
    for (size_t j = 0; j < 8; j++) {
        fkvf_stream_info si;
        OK_R(r, fkvf_reader_stream_info(r, j, &si));
        ck_assert_uint_eq(si.n_segments, 1); /* the second replaced the first */
        uint32_t out[5];
        OK_R(r, fkvf_reader_stream_read(r, j, 0, out, 5));
        for (size_t i = 0; i < 5; i++)
            ck_assert_uint_eq(out[i], 15);
    }
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

typedef struct desc_case {
    const char *field; /* the message must name it */
    void (*mutate)(fkvf_desc *d);
} desc_case;

static void dm_layers0(fkvf_desc *d) { d->n_layers = 0; }
static void dm_layers_big(fkvf_desc *d) { d->n_layers = 1025; }
static void dm_heads0(fkvf_desc *d) { d->n_kv_heads = 0; }
static void dm_heads_big(fkvf_desc *d) { d->n_kv_heads = 1025; }
static void dm_kdim0(fkvf_desc *d) { d->key_dim = 0; }
static void dm_kdim_big(fkvf_desc *d) { d->key_dim = 16385; }
static void dm_vdim0(fkvf_desc *d) { d->value_dim = 0; }
static void dm_dtype0(fkvf_desc *d) { d->dtype = (fkvf_dtype)0; }
static void dm_dtype4(fkvf_desc *d) { d->dtype = (fkvf_dtype)4; }
static void dm_transform2(fkvf_desc *d) { d->key_transform = 2; }
static void dm_layout0(fkvf_desc *d) { d->rope_layout = 0; }
static void dm_layout3(fkvf_desc *d) { d->rope_layout = 3; }
static void dm_storage2(fkvf_desc *d) { d->key_storage = 2; }
static void dm_rdims_odd(fkvf_desc *d) { d->rope_dims = 7; }
static void dm_rdims0(fkvf_desc *d) { d->rope_dims = 0; }
static void dm_rdims_big(fkvf_desc *d) { d->rope_dims = 10; }
static void dm_theta0(fkvf_desc *d) { d->rope_theta = 0.0; }
static void dm_theta_neg(fkvf_desc *d) { d->rope_theta = -1.0; }
static void dm_theta_nan(fkvf_desc *d) { d->rope_theta = NAN; }
static void dm_theta_inf(fkvf_desc *d) { d->rope_theta = INFINITY; }
static void dm_norope_fields(fkvf_desc *d)
{
    d->key_transform = 0; /* rope_dims etc. still set */
}
static void dm_norope_theta(fkvf_desc *d)
{
    d->key_transform = d->rope_layout = d->key_storage = 0;
    d->rope_dims = 0;
    d->rope_theta = 1.0;
}
static void dm_hash_kind3(fkvf_desc *d) { d->weights_hash_kind = 3; }
static void dm_hash_tail(fkvf_desc *d) { d->weights_hash[16] = 1; } /* kind 2: 16 bytes */
static void dm_hash_none(fkvf_desc *d) { d->weights_hash_kind = 0; }
static void dm_model_utf8(fkvf_desc *d) { d->model_id = "bad\xFF"; }
static void dm_tok_utf8(fkvf_desc *d) { d->tokenizer_id = "\xC0\x80"; }
static char long_id[5000];
static void dm_model_long(fkvf_desc *d)
{
    memset(long_id, 'm', 4097);
    long_id[4097] = 0;
    d->model_id = long_id;
}

START_TEST(writer_refuses_invalid_descriptor_fields)
{
    static const desc_case cases[] = {
        {"n_layers", dm_layers0},        {"n_layers", dm_layers_big},
        {"n_kv_heads", dm_heads0},       {"n_kv_heads", dm_heads_big},
        {"key_dim", dm_kdim0},           {"key_dim", dm_kdim_big},
        {"value_dim", dm_vdim0},         {"dtype", dm_dtype0},
        {"dtype", dm_dtype4},            {"key_transform", dm_transform2},
        {"rope_layout", dm_layout0},     {"rope_layout", dm_layout3},
        {"key_storage", dm_storage2},    {"rope_dims", dm_rdims_odd},
        {"rope_dims", dm_rdims0},        {"rope_dims", dm_rdims_big},
        {"rope_theta", dm_theta0},       {"rope_theta", dm_theta_neg},
        {"rope_theta", dm_theta_nan},    {"rope_theta", dm_theta_inf},
        {"RoPE", dm_norope_fields},      {"RoPE", dm_norope_theta},
        {"weights_hash_kind", dm_hash_kind3}, {"weights_hash", dm_hash_tail},
        {"weights_hash", dm_hash_none},  {"model_id", dm_model_utf8},
        {"tokenizer_id", dm_tok_utf8},   {"model_id", dm_model_long},
    };
    model m;
    model_small(&m);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fkvf_desc d = m.desc;
        cases[i].mutate(&d);
        tu_buf b;
        fkvf_writer *w = new_writer(&b, &m.opts);
        int rc = fkvf_writer_set_desc(w, &d);
        ck_assert_msg(rc == FKVF_E_INVALID_ARG, "case %zu (%s): %s", i, cases[i].field,
                      fkvf_error_name(rc));
        assert_msg_names(w, cases[i].field);
        assert_msg_names(w, "[FKVF_E_INVALID_ARG]"); /* said FKVF_E_CORRUPT */
        /* the writer is still usable: the valid descriptor is accepted */
        OK_W(w, fkvf_writer_set_desc(w, &m.desc));
        RC_W(w, fkvf_writer_set_desc(w, &m.desc), FKVF_E_STATE); /* only once */
        fkvf_writer_free(w);
        tu_buf_free(&b);
    }
    /* limits that are valid */
    fkvf_desc d = m.desc;
    d.rope_dims = d.key_dim; /* rope_dims == key_dim */
    memset(long_id, 'm', 4096);
    long_id[4096] = 0;
    d.model_id = long_id;
    d.tokenizer_id = NULL;
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &d));
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_desc got;
    OK_R(r, fkvf_reader_desc(r, &got));
    ck_assert_uint_eq(strlen(got.model_id), 4096);
    ck_assert_str_eq(got.tokenizer_id, "");
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* Spec 3.4: optional feature bits 1-63 are reserved and writers write 0;
 * the writer passed any bits through into the header. */
START_TEST(writer_refuses_unknown_optional_features)
{
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    const uint64_t bad[] = {UINT64_C(1) << 1, UINT64_C(1) << 63,
                            FKVF_OPTFEAT_TOKEN_STREAM | (UINT64_C(1) << 5)};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o.optional_features = bad[i];
        tu_buf b;
        memset(&b, 0, sizeof b);
        fkvf_sink sink = tu_buf_sink(&b);
        fkvf_writer *w = NULL;
        ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_E_INVALID_ARG);
        ck_assert_ptr_nonnull(w);
        assert_msg_names(w, "optional_features");
        ck_assert_uint_eq(b.size, 0); /* not even the header */
        fkvf_writer_free(w);
        tu_buf_free(&b);
    }
    o.optional_features = FKVF_OPTFEAT_TOKEN_STREAM;
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &o);
    fkvf_writer_free(w);
    tu_buf_free(&b);
}
END_TEST

START_TEST(writer_refuses_misuse)
{
    model m;
    model_small(&m);
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    RC_W(w, fkvf_writer_add_exact(w, 0, 1, m.rows, m.row_bytes, 0), FKVF_E_STATE);
    assert_msg_names(w, "descriptor");
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    RC_W(w, fkvf_writer_add_exact(w, 0, 1, m.rows, m.row_bytes - 1, 0), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "rows");
    RC_W(w, fkvf_writer_add_exact(w, 0, 1, m.rows, m.row_bytes, 0x80), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_exact(w, UINT64_MAX, 2, m.rows, 2 * m.row_bytes, 0), FKVF_E_LIMIT);
    RC_W(w, fkvf_writer_set_positions(w, 3, 4), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "n_archived");
    static const uint32_t dedicated[] = {
        FKVF_SECTION_DESC, FKVF_SECTION_META, FKVF_SECTION_EXAC, FKVF_SECTION_STRM,
        FKVF_SECTION_DIRC, FKVF_SECTION_VTXS, FKVF_SECTION_CBK1, FKVF_SECTION_CBRF};
    for (size_t i = 0; i < sizeof dedicated / sizeof dedicated[0]; i++) {
        RC_W(w, fkvf_writer_add_section(w, dedicated[i], FKVF_SECTION_REQUIRED, 0, "x", 1),
             FKVF_E_INVALID_ARG);
        assert_msg_names(w, "dedicated");
    }
    RC_W(w, fkvf_writer_add_section(w, XTRA, 4, 0, "x", 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_section(w, XTRA, 0, 0, NULL, 1), FKVF_E_INVALID_ARG);
    /* positions recorded without a descriptor */
    tu_buf b2;
    fkvf_writer *w2 = new_writer(&b2, &m.opts);
    OK_W(w2, fkvf_writer_set_positions(w2, 1, 0));
    RC_W(w2, fkvf_writer_finish(w2), FKVF_E_STATE);
    fkvf_writer_free(w2);
    tu_buf_free(&b2);
    /* nothing at all: without a descriptor the file must be a codebook file */
    w2 = new_writer(&b2, &m.opts);
    RC_W(w2, fkvf_writer_finish(w2), FKVF_E_STATE);
    assert_msg_names(w2, "codebook");
    fkvf_writer_free(w2);
    tu_buf_free(&b2);
    fkvf_writer_free(w);
    tu_buf_free(&b);
    /* bad options */
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.block_size = 100;
    memset(&b, 0, sizeof b);
    fkvf_sink sink = tu_buf_sink(&b);
    w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "block_size");
    ck_assert_int_eq(fkvf_writer_set_desc(w, &m.desc), FKVF_E_INVALID_ARG); /* sticky */
    fkvf_writer_free(w);
    o.block_size = 0;
    o.required_features = 1u << 7;
    w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "required_features");
    fkvf_writer_free(w);
    o.required_features = 0;
    o.deflate_level = 10;
    w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_E_INVALID_ARG);
    fkvf_writer_free(w);
    fkvf_sink nosink = {NULL, NULL, NULL};
    w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &nosink, NULL, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(w);
    ck_assert_int_eq(fkvf_writer_create_file(&w, "", NULL, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(w);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

static long long failing_write(void *opaque, const void *data, size_t size)
{
    int *budget = opaque;
    (void)data;
    if (*budget <= 0) {
        errno = ENOSPC;
        return -1;
    }
    /* short writes: at most 7 bytes at a time */
    size_t n = size < 7 ? size : 7;
    if ((int)n > *budget)
        n = (size_t)*budget;
    *budget -= (int)n;
    return (long long)n;
}

START_TEST(writer_sink_error_is_sticky_io)
{
    model m;
    model_small(&m);
    tu_buf ref;
    build(&m, &ref);
    for (int budget0 = 0; budget0 < (int)ref.size; budget0 += 97) {
        int budget = budget0;
        fkvf_sink sink = {failing_write, NULL, &budget};
        fkvf_writer *w = NULL;
        int rc = fkvf_writer_create_sink(&w, &sink, &m.opts, NULL);
        if (rc == FKVF_OK)
            rc = write_model(&m, w);
        ck_assert_msg(rc == FKVF_E_IO, "budget %d: %s", budget0, fkvf_error_name(rc));
        ck_assert_ptr_nonnull(w);
        ck_assert_msg(strstr(fkvf_writer_message(w), "write") != NULL, "%s",
                      fkvf_writer_message(w));
        /* every later call reports the failure */
        ck_assert_int_eq(fkvf_writer_meta_u64(w, "z", 1), FKVF_E_IO);
        ck_assert_int_eq(fkvf_writer_finish(w), FKVF_E_IO);
        fkvf_writer_free(w);
    }
    /* short writes alone are retried to completion */
    int budget = INT32_MAX;
    fkvf_sink sink = {failing_write, NULL, &budget};
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_sink(&w, &sink, &m.opts, NULL));
    OK_W(w, write_model(&m, w));
    fkvf_writer_free(w);
    ck_assert_int_eq(INT32_MAX - budget, (int)ref.size);
    tu_buf_free(&ref);
    model_free(&m);
}
END_TEST

/* ==== 4. every truncation ======================================================= */

START_TEST(every_truncation_fails_truncated)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    ck_assert_uint_gt(b.size, 1024);
    ck_assert_uint_lt(b.size, 8192);
    /* A single-commit file has one trailer, at its very end: any prefix lacks
     * it (or lacks the header), so every prefix is TRUNCATED (spec 3.1, 7.2). */
    char msg[600];
    for (size_t len = 0; len < b.size; len++) {
        msg[0] = 0;
        int rc = try_open(b.data, len, 0, msg, sizeof msg);
        EXPECTF(rc == FKVF_E_TRUNCATED, "length %zu: %s (%s)", len, fkvf_error_name(rc), msg);
        EXPECTF(fkvf_error_class(rc) == FKVF_ERRCLASS_FORMAT, "length %zu", len);
        EXPECTF(strlen(msg) > 0 && strstr(msg, "TRUNCATED") != NULL, "length %zu: message %s",
                len, msg);
        int rc2 = try_open(b.data, len, FKVF_OPEN_STRICT, NULL, 0);
        EXPECTF(rc2 == FKVF_E_TRUNCATED, "strict length %zu: %s", len, fkvf_error_name(rc2));
    }
    /* the full file opens */
    ck_assert_int_eq(try_open(b.data, b.size, 0, NULL, 0), FKVF_OK);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(truncated_files_on_disk)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    char *dir = make_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/t.fkvf", dir);
    for (size_t len = 0; len < b.size; len += len < 200 ? 1 : 37) {
        tu_write_file(path, b.data, len);
        fkvf_reader *r = NULL;
        int rc = fkvf_reader_open_file(&r, path, 0, NULL);
        EXPECTF(rc == FKVF_E_TRUNCATED, "length %zu: %s", len, fkvf_error_name(rc));
        EXPECT(r != NULL && strstr(fkvf_reader_message(r), path) != NULL);
        fkvf_reader_free(r);
    }
    rm_tmpdir(dir);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* ==== 5. bit flips ============================================================= */

typedef struct layout {
    uint64_t dir_off, dir_size, trailer_off;
} layout;

static layout layout_of(const uint8_t *b, size_t size)
{
    layout l;
    l.trailer_off = size - 64;
    l.dir_off = fkvf_ld64(b + l.trailer_off + 16);
    l.dir_size = fkvf_ld64(b + l.trailer_off + 24);
    return l;
}

/* expected open result of flipping a bit in header byte i (spec 3.1 order) */
static int header_flip_code(size_t i)
{
    if (i < 9)
        return FKVF_E_BAD_MAGIC;
    if (i == 10 || i == 11)
        return FKVF_E_VERSION;
    if (i >= 16 && i < 20)
        return FKVF_E_BYTE_ORDER;
    return FKVF_E_CHECKSUM;
}

static void flip_range(uint8_t *c, size_t size, uint64_t from, uint64_t to, const char *what,
                       int (*code_of)(size_t rel))
{
    char msg[600];
    for (uint64_t i = from; i < to; i++)
        for (int bit = 0; bit < 8; bit++) {
            c[i] ^= (uint8_t)(1u << bit);
            int rc = try_open(c, size, 0, msg, sizeof msg);
            int want = code_of((size_t)(i - from));
            EXPECTF(rc == want, "%s byte %llu bit %d: %s, want %s (%s)", what,
                    (unsigned long long)i, bit, fkvf_error_name(rc), fkvf_error_name(want), msg);
            EXPECTF(strlen(msg) > 0, "%s byte %llu: empty message", what, (unsigned long long)i);
            c[i] ^= (uint8_t)(1u << bit);
        }
}

static int dir_flip_code(size_t i)
{
    (void)i;
    return FKVF_E_CHECKSUM;
}

static int trailer_flip_code(size_t i) { return i < 8 ? FKVF_E_TRUNCATED : FKVF_E_CHECKSUM; }

START_TEST(every_header_bit_flip)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    flip_range(b.data, b.size, 0, 64, "header", header_flip_code);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(every_directory_bit_flip)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    layout l = layout_of(b.data, b.size);
    ck_assert_uint_eq(l.dir_off + l.dir_size, l.trailer_off);
    flip_range(b.data, b.size, l.dir_off, l.dir_off + l.dir_size, "directory", dir_flip_code);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(every_trailer_bit_flip)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    layout l = layout_of(b.data, b.size);
    flip_range(b.data, b.size, l.trailer_off, b.size, "trailer", trailer_flip_code);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* Flips in section bytes: open or verify fails with CHECKSUM; flips in the
 * padding between sections: open succeeds, verify reports PADDING. */
START_TEST(every_payload_bit_flip)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    layout l = layout_of(b.data, b.size);
    /* which bytes belong to a section */
    uint8_t *in_sec = calloc(b.size, 1);
    ck_assert_ptr_nonnull(in_sec);
    {
        fkvf_reader *r = NULL;
        OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
        fkvf_archive_info ai;
        OK_R(r, fkvf_reader_info(r, &ai));
        /* DESC CBK1 META EXACx3 VTXS STRMx2 */
        ck_assert_uint_eq(ai.n_sections, 9);
        ck_assert_uint_eq(ai.n_sections, model_n_sections(&m));
        for (size_t i = 0; i < ai.n_sections; i++) {
            fkvf_section_info si;
            OK_R(r, fkvf_reader_section(r, i, &si));
            memset(in_sec + si.offset, 1, (size_t)si.stored_size);
        }
        fkvf_reader_free(r);
    }
    uint8_t *c = malloc(b.size);
    ck_assert_ptr_nonnull(c);
    memcpy(c, b.data, b.size);
    size_t n_sec = 0, n_pad = 0, at_open = 0;
    for (uint64_t i = 64; i < l.dir_off; i++)
        for (int bit = 0; bit < 8; bit++) {
            c[i] ^= (uint8_t)(1u << bit);
            fkvf_reader *r = NULL;
            int rc = fkvf_reader_open_memory(&r, c, b.size, 0, NULL);
            if (in_sec[i]) {
                n_sec++;
                if (rc == FKVF_OK)
                    rc = fkvf_reader_verify(r);
                else
                    at_open++;
                EXPECTF(rc == FKVF_E_CHECKSUM, "section byte %llu bit %d: %s (%s)",
                        (unsigned long long)i, bit, fkvf_error_name(rc),
                        fkvf_reader_message(r));
            } else {
                n_pad++;
                EXPECTF(rc == FKVF_OK, "padding byte %llu: open %s (%s)", (unsigned long long)i,
                        fkvf_error_name(rc), fkvf_reader_message(r));
                rc = fkvf_reader_verify(r);
                EXPECTF(rc == FKVF_E_PADDING, "padding byte %llu bit %d: verify %s",
                        (unsigned long long)i, bit, fkvf_error_name(rc));
                EXPECT(strstr(fkvf_reader_message(r), "padding") != NULL);
            }
            fkvf_reader_free(r);
            c[i] ^= (uint8_t)(1u << bit);
        }
    ck_assert_uint_gt(n_sec, 8 * 1000);
    ck_assert_uint_gt(n_pad, 8 * 50);
    ck_assert_uint_gt(at_open, 0);
    ck_assert_uint_lt(at_open, n_sec); /* some are caught only by the lazy checks */
    free(c);
    free(in_sec);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* Lazy path: a flipped data byte is caught by the block checksum on first
 * touch, without verify; blocks not touched stay readable. */
/* Lazy path: a flipped data byte is caught by the block checksum on first
 * touch, without verify; blocks not touched stay readable. Every stream of
 * a group lives in one section: the flip is in the last symbol of stream s
 * (its own block), and stream s's first symbol and the other streams'
 * symbols in other blocks still read back. */
START_TEST(stream_block_flip_caught_on_first_touch)
{
    model m;
    model_many(&m, FKVF_DTYPE_F16);
    tu_buf b;
    build(&m, &b);
    for (size_t s = 0; s < m.n_st; s++) {
        const tstream *ts = &m.st[s];
        int tok = (ts->id >> 56) == FKVF_STREAM_KIND_TOKENS;
        fkvf_reader *r = NULL;
        OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
        fkvf_section_info si;
        ck_assert_uint_ne(find_section(r, FKVF_SECTION_STRM, tok, &si), SIZE_MAX);
        fkvf_reader_free(r);
        /* derive the layout from the header */
        fkvf_strm_hdr h;
        char msg[600];
        fkvf_diag d;
        memset(&d, 0, sizeof d);
        ck_assert_int_eq(fkvf_strm_hdr_parse(b.data + si.offset, si.stored_size, si.offset, &h, &d),
                         FKVF_OK);
        ck_assert_uint_eq(h.n_streams, tok ? 1 : 32);
        ck_assert_uint_gt(h.n_blocks, 1);
        ck_assert_int_eq(ts->spec.profile, FKVF_PROFILE_QUAD);
        /* the byte holding the first bit of the last symbol of stream s */
        uint64_t j = tok ? 0 : s;
        uint64_t rel = j * h.stream_bytes + (uint64_t)(ts->n - 1) * h.bits / 8;
        uint64_t at = si.offset + h.data_off + rel;
        uint64_t blk = rel / h.block_size;
        ck_assert_uint_ne(blk, j * h.stream_bytes / h.block_size);
        b.data[at] ^= 0x10;
        r = NULL;
        OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
        size_t idx;
        OK_R(r, fkvf_reader_stream_find(r, ts->id, &idx));
        ck_assert_uint_eq(idx, s);
        uint32_t sym;
        OK_R(r, fkvf_reader_stream_get(r, idx, 0, &sym)); /* its first block is fine */
        ck_assert_uint_eq(sym, ts->sym[0]);
        int rc = fkvf_reader_stream_get(r, idx, ts->n - 1, &sym);
        snprintf(msg, sizeof msg, "%s", fkvf_reader_message(r));
        ck_assert_msg(rc == FKVF_E_CHECKSUM, "stream %zu: %s (%s)", s, fkvf_error_name(rc), msg);
        ck_assert_msg(strstr(msg, "block") != NULL, "%s", msg);
        uint32_t *all = calloc(ts->n, sizeof *all);
        RC_R(r, fkvf_reader_stream_read(r, idx, 0, all, ts->n), FKVF_E_CHECKSUM);
        /* another stream of the group whose symbols lie in other blocks */
        if (!tok) {
            size_t o = s < 16 ? 31 : 0;
            uint64_t o0 = o * h.stream_bytes / h.block_size,
                     o1 = (o * h.stream_bytes + h.stream_bytes - 1) / h.block_size;
            ck_assert(blk < o0 || blk > o1);
            OK_R(r, fkvf_reader_stream_read(r, o, 0, all, m.st[o].n));
            ck_assert(memcmp(all, m.st[o].sym, m.st[o].n * sizeof *all) == 0);
        }
        free(all);
        RC_R(r, fkvf_reader_verify(r), FKVF_E_CHECKSUM);
        fkvf_reader_free(r);
        b.data[at] ^= 0x10;
    }
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* An ngon anchor changed by one ulp, with every checksum recomputed so
 * only the span check (spec 12.2) can see it: SPAN from reads and verify. */
/* An ngon anchor changed by one ulp, with every checksum recomputed so
 * only the span check (spec 12.2) can see it: SPAN from reads and verify.
 * With 64-byte blocks, the index streams of model_small (one 16-byte span
 * each) share a block four at a time: streams 4..7 fail, 0..3 do not. */
START_TEST(ngon_anchor_with_matching_checksums_fails_span)
{
    model m;
    model_small(&m);
    m.opts.block_size = 64;
    tu_buf b;
    build(&m, &b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_section_info si;
    uint64_t id = FKVF_STREAM_ID(0, 1, 1, 1, 0); /* canonical index 7 */
    size_t j = model_stream_of(&m, id);
    ck_assert_uint_eq(j, 7);
    ck_assert_int_eq(m.ispec.profile, FKVF_PROFILE_NGON);
    ck_assert_uint_ne(find_section(r, FKVF_SECTION_STRM, FKVF_STREAM_GROUP_INDEX, &si), SIZE_MAX);
    fkvf_reader_free(r);
    /* spec 11.3: 8 streams x one span = 128 bytes in two 64-byte blocks;
     * the table of 2 checksums, data at align64(64 + 16) = 128 */
    ck_assert_uint_eq(si.stored_size, 128 + 8 * 16);
    uint64_t data_start = si.offset + 128, anchor = data_start + 16 * j;
    double ax = fkvf_ldf64(b.data + anchor);
    uint64_t bits;
    memcpy(&bits, &ax, 8);
    bits ^= 1; /* one ulp */
    fkvf_st64(b.data + anchor, bits);
    /* block 1's checksum (spec 11.4): seed = absolute offset of the block */
    fkvf_st64(b.data + si.offset + 64 + 8,
              fkvf_xxh3_64(b.data + data_start + 64, 64, data_start + 64));
    refresh_last_commit(b.data, b.size);

    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    size_t idx;
    OK_R(r, fkvf_reader_stream_find(r, id, &idx));
    uint32_t out[10];
    RC_R(r, fkvf_reader_stream_read(r, idx, 0, out, 5), FKVF_E_SPAN);
    ck_assert(strstr(fkvf_reader_message(r), "span") != NULL);
    RC_R(r, fkvf_reader_stream_get(r, idx, 2, out), FKVF_E_SPAN);
    /* a stream of the same block: the block's spans are checked together */
    RC_R(r, fkvf_reader_stream_read(r, 4, 0, out, 5), FKVF_E_SPAN);
    /* the streams of block 0 and the token stream are unaffected */
    for (size_t k = 0; k < 4; k++) {
        OK_R(r, fkvf_reader_stream_read(r, k, 0, out, 5));
        ck_assert(memcmp(out, m.st[k].sym, 5 * sizeof *out) == 0);
    }
    OK_R(r, fkvf_reader_stream_read(r, 8, 0, out, 10));
    ck_assert(memcmp(out, model_token_stream(&m)->sym, sizeof out) == 0);
    fkvf_reader_free(r);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    RC_R(r, fkvf_reader_verify(r), FKVF_E_SPAN);
    fkvf_reader_free(r);

    /* a non-finite anchor is SPAN too */
    fkvf_stf64(b.data + anchor, NAN);
    fkvf_st64(b.data + si.offset + 64 + 8,
              fkvf_xxh3_64(b.data + data_start + 64, 64, data_start + 64));
    refresh_last_commit(b.data, b.size);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    RC_R(r, fkvf_reader_verify(r), FKVF_E_SPAN);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* ==== 6. hand-crafted malformed files ============================================ */

/* The baseline the crafted tests mutate: header, DESC (133 bytes, then 59
 * padding bytes), an optional unknown section, directory, trailer. */
static void craft_base(craft *c, uint64_t req)
{
    cr_header(c, 1, 0, req, 0);
    cr_desc(c, 0);
    cr_plain(c, XTRA, 0, 0, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
             64);
}

static int open_craft(craft *c, unsigned flags, char *msg, size_t msg_size)
{
    return try_open(c->b.data, c->b.size, flags, msg, msg_size);
}

#define EXPECT_OPEN(c, want, needle)                                                    \
    do {                                                                                \
        char m_[600];                                                                   \
        int rc_ = open_craft(c, 0, m_, sizeof m_);                                      \
        ck_assert_msg(rc_ == (want), "open: %s, want %s (%s)", fkvf_error_name(rc_),     \
                      fkvf_error_name(want), m_);                                       \
        ck_assert_msg(strstr(m_, needle) != NULL, "message \"%s\" lacks \"%s\"", m_,    \
                      needle);                                                          \
    } while (0)

START_TEST(crafted_baseline_is_valid)
{
    craft c;
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, FKVF_OPEN_STRICT, NULL));
    OK_R(r, fkvf_reader_verify(r));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_uint_eq(ai.n_sections, 2);
    fkvf_desc d;
    OK_R(r, fkvf_reader_desc(r, &d));
    ck_assert_str_eq(d.model_id, "model");
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_non_fkvf_file_accepted)
{
    static const char png[] = "\x89PNG\r\n\x1a\n and then some more bytes of a png file.....";
    char msg[600];
    ck_assert_int_eq(try_open((const uint8_t *)png, sizeof png, 0, msg, sizeof msg),
                     FKVF_E_BAD_MAGIC);
    ck_assert(strstr(msg, "magic") != NULL);
    ck_assert_int_eq(try_open((const uint8_t *)"\x89", 1, 0, NULL, 0), FKVF_E_TRUNCATED);
    ck_assert_int_eq(try_open((const uint8_t *)"X", 1, 0, NULL, 0), FKVF_E_BAD_MAGIC);
    craft c;
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    c.b.data[1] = 'G'; /* "\x89GKVF..." */
    EXPECT_OPEN(&c, FKVF_E_BAD_MAGIC, "3.1");
    c.b.data[1] = 'F';
    c.b.data[8] = 0x0B;
    EXPECT_OPEN(&c, FKVF_E_BAD_MAGIC, "magic");
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_major_version_2_read_as_v1)
{
    craft c;
    cr_header(&c, 2, 0, 0, 0); /* checksum valid for major 2 */
    cr_desc(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_VERSION, "format_major");
    tu_buf_free(&c.b);
    /* minor versions are compatible (spec 3.2) */
    cr_header(&c, 1, 7, 0, UINT64_C(1) << 63); /* and unknown optional bits are ignored */
    cr_desc(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_uint_eq(ai.format_minor, 7);
    ck_assert_uint_eq(ai.optional_features, UINT64_C(1) << 63);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_big_endian_file_misread)
{
    craft c;
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    /* a big-endian writer stores 0x0A0B0C0D as 0A 0B 0C 0D */
    uint8_t *h = c.b.data;
    h[16] = 0x0A, h[17] = 0x0B, h[18] = 0x0C, h[19] = 0x0D;
    fkvf_st64(h + 56, fkvf_xxh3_64(h, 56, 0));
    EXPECT_OPEN(&c, FKVF_E_BYTE_ORDER, "big-endian");
    h[16] = 0x0D, h[17] = 0x0C, h[18] = 0x0B, h[19] = 0x00;
    fkvf_st64(h + 56, fkvf_xxh3_64(h, 56, 0));
    EXPECT_OPEN(&c, FKVF_E_BYTE_ORDER, "byte_order");
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_unknown_required_feature_ignored)
{
    for (int bit = 3; bit < 64; bit += 5) {
        craft c;
        craft_base(&c, UINT64_C(1) << bit);
        cr_commit(&c, 1, 0, 0, 0);
        EXPECT_OPEN(&c, FKVF_E_FEATURE, "required_features");
        tu_buf_free(&c.b);
    }
    /* header field checks in spec 3.1 order: reserved bytes -> CORRUPT */
    craft c;
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    c.b.data[44] = 1;
    fkvf_st64(c.b.data + 56, fkvf_xxh3_64(c.b.data, 56, 0));
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "reserved");
    c.b.data[44] = 0;
    fkvf_st16(c.b.data + 14, 128);
    fkvf_st64(c.b.data + 56, fkvf_xxh3_64(c.b.data, 56, 0));
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "header_size");
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_misaligned_section_offset_accepted)
{
    craft c;
    craft_base(&c, 0);
    c.e[1].offset += 8;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_ALIGN, "4.1");
    tu_buf_free(&c.b);
    /* a misaligned directory offset in the trailer */
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    uint64_t t = c.b.size - 64;
    fkvf_st64(c.b.data + t + 16, fkvf_ld64(c.b.data + t + 16) + 8);
    fkvf_st64(c.b.data + t + 56, fkvf_xxh3_64(c.b.data + t, 56, t));
    EXPECT_OPEN(&c, FKVF_E_ALIGN, "dir_offset");
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_overlapping_sections_accepted)
{
    craft c;
    craft_base(&c, 0);
    c.e[1].offset = c.e[0].offset; /* both at 64 */
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_OVERLAP, "overlaps");
    tu_buf_free(&c.b);
    /* out of order */
    craft_base(&c, 0);
    fkvf_dirent t = c.e[0];
    c.e[0] = c.e[1];
    c.e[1] = t;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_OVERLAP, "4.5");
    tu_buf_free(&c.b);
    /* one byte of overlap */
    craft_base(&c, 0);
    c.e[0].stored_size = c.e[0].size = c.e[1].offset - c.e[0].offset + 1;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_OVERLAP, "4.5");
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_section_reaching_into_directory)
{
    craft c;
    craft_base(&c, 0);
    uint64_t dir = cr_dir_off(&c);
    c.e[1].stored_size = c.e[1].size = dir - c.e[1].offset + 1;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_BOUNDS, "4.5");
    tu_buf_free(&c.b);
    /* exactly up to the directory is fine as far as bounds go (the
     * checksum, over the 40 bytes written, then fails) */
    cr_header(&c, 1, 0, 0, 0);
    cr_desc(&c, 0);
    cr_plain(&c, XTRA, 0, 0, "0123456789012345678901234567890123456789", 40);
    dir = cr_dir_off(&c);
    c.e[1].stored_size = c.e[1].size = dir - c.e[1].offset;
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    RC_R(r, fkvf_reader_verify(r), FKVF_E_CHECKSUM);
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    /* far beyond the file, and wrapping around */
    craft_base(&c, 0);
    c.e[1].offset = UINT64_C(1) << 40;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_BOUNDS, "outside");
    tu_buf_free(&c.b);
    /* the largest size spec 4.2 allows (2^48) still fails on bounds */
    craft_base(&c, 0);
    c.e[1].stored_size = c.e[1].size = UINT64_C(1) << 48;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_BOUNDS, "outside");
    tu_buf_free(&c.b);
    /* an offset near 2^64 whose end wraps around to a small value (bug
     * guard: the end was computed without an overflow check) */
    craft_base(&c, 0);
    c.e[1].offset = UINT64_MAX - 63;
    c.e[1].stored_size = c.e[1].size = 128;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_BOUNDS, "outside");
    tu_buf_free(&c.b);
    craft_base(&c, 0);
    c.e[1].offset = UINT64_MAX - 63;
    c.e[1].stored_size = c.e[1].size = UINT64_C(1) << 48;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_BOUNDS, "outside");
    tu_buf_free(&c.b);
    /* inside the header */
    craft_base(&c, 0);
    c.e[0].offset = 0;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_BOUNDS, "outside");
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_nonzero_padding_unnoticed)
{
    craft c;
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    /* DESC is 133 bytes at 64: padding 197..255 */
    uint64_t pad = 64 + 133 + 10;
    ck_assert_uint_eq(c.b.data[pad], 0);
    c.b.data[pad] = 0x01;
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL)); /* fast path */
    RC_R(r, fkvf_reader_verify(r), FKVF_E_PADDING);
    ck_assert(strstr(fkvf_reader_message(r), "207") != NULL); /* names the offset */
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    /* padding before the trailer is not possible (the directory is a multiple
     * of 64); unused bits after a quad stream's last symbol (spec 11.7) */
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_section_info si;
    ck_assert_uint_ne(find_section(r, FKVF_SECTION_STRM, FKVF_STREAM_GROUP_TOKENS, &si),
                      SIZE_MAX);
    fkvf_reader_free(r);
    /* the token stream, 10 symbols of 32 bits: bytes 40..47 of the third
     * 16-byte unit are padding */
    ck_assert_uint_eq(si.stored_size, 128 + 48);
    uint64_t data = si.offset + 128;
    b.data[data + 44] = 0x80;
    refresh_strm(b.data, si.offset);
    refresh_last_commit(b.data, b.size);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    size_t idx;
    uint32_t out[10];
    OK_R(r, fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &idx));
    OK_R(r, fkvf_reader_stream_read(r, idx, 0, out, 10));
    ck_assert(memcmp(out, model_token_stream(&m)->sym, sizeof out) == 0);
    RC_R(r, fkvf_reader_verify(r), FKVF_E_PADDING);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* Full verification parses every META section, also one a later commit
 * replaced (spec 1.3.3, 9.3); the ordinary path reads only the one in
 * effect. Found by the second reader (conformance/pyreader). */
/* A codebook element that is not finite breaks a writer rule (spec 13.2;
 * fkvf validate --strict W-CBK1-FINITE), which full verification does not
 * check; restoring an archived row from it fails with CORRUPT (the reader
 * used to report FKVF_E_INVALID_ARG, a caller error, spec 16.3). Found by
 * the second reader (conformance/pyreader). */
/* An EXAC count whose rows exceed 2^48 bytes is LIMIT even though the
 * section is also shorter than they need (spec 14.2, 15, 16.2); libfkvf
 * said TRUNCATED unless count * row_bytes overflowed 64 bits. Found by the
 * second reader (conformance/pyreader). */
START_TEST(exac_count_beyond_limit)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    uint64_t exac = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        OK_R(r, fkvf_reader_section(r, i, &si));
        if (si.type == FKVF_SECTION_EXAC && !(si.flags & FKVF_SECTION_DEFLATE))
            exac = si.offset;
    }
    fkvf_reader_free(r);
    ck_assert_uint_gt(exac, 0);
    fkvf_st64(b.data + exac + 8, UINT64_C(1) << 44); /* x 128-byte rows > 2^48, no overflow */
    refresh_last_commit(b.data, b.size);
    r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL), FKVF_E_LIMIT);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(codebook_value_not_finite)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    uint64_t cbk = 0, cbk_n = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        OK_R(r, fkvf_reader_section(r, i, &si));
        if (si.type == FKVF_SECTION_CBK1) {
            ck_assert_uint_eq(si.flags & FKVF_SECTION_DEFLATE, 0);
            cbk = si.offset;
            cbk_n = si.stored_size;
        }
    }
    fkvf_reader_free(r);
    ck_assert_uint_gt(cbk_n, 64 + 10);
    fkvf_st16(b.data + cbk + 64 + 2 * 5, 0x7C00); /* +inf in f16 */
    refresh_last_commit(b.data, b.size);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    size_t rb;
    OK_R(r, fkvf_reader_row_bytes(r, FKVF_DTYPE_F32, &rb));
    float *out = malloc(rb);
    ck_assert_ptr_nonnull(out);
    RC_R(r, fkvf_reader_restore(r, m.desc.n_sinks, 1, FKVF_DTYPE_F32, out, rb), FKVF_E_CORRUPT);
    OK_R(r, fkvf_reader_verify(r));
    free(out);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(verify_replaced_meta)
{
    mbuild mb;
    memset(&mb, 0, sizeof mb);
    mb_u64(&mb, "alpha", 1);
    mb_u64(&mb, "alpha", 2);
    craft c;
    craft_base(&c, 0);
    cr_plain(&c, FKVF_SECTION_META, 0, 0, mb.b.data, mb.b.size);
    cr_commit(&c, 1, 0, 0, 0);
    tu_buf_free(&mb.b);
    uint64_t t1 = c.b.size - 64;
    memset(&mb, 0, sizeof mb);
    mb_u64(&mb, "alpha", 3);
    cr_plain(&c, FKVF_SECTION_META, 0, 0, mb.b.data, mb.b.size);
    cr_commit(&c, 2, t1, 0, 0);
    tu_buf_free(&mb.b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, FKVF_OPEN_STRICT, NULL));
    fkvf_meta_entry e;
    OK_R(r, fkvf_reader_meta_find(r, "alpha", &e));
    ck_assert_uint_eq(e.u64, 3);
    RC_R(r, fkvf_reader_verify(r), FKVF_E_DUP_KEY);
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_duplicate_meta_keys_ambiguous)
{
    mbuild mb;
    memset(&mb, 0, sizeof mb);
    mb_u64(&mb, "alpha", 1);
    mb_u64(&mb, "beta", 2);
    mb_u64(&mb, "alpha", 3);
    craft c;
    craft_base(&c, 0);
    cr_plain(&c, FKVF_SECTION_META, 0, 0, mb.b.data, mb.b.size);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL)); /* META is lazy */
    size_t n;
    RC_R(r, fkvf_reader_meta_count(r, &n), FKVF_E_DUP_KEY);
    ck_assert(strstr(fkvf_reader_message(r), "alpha") != NULL);
    fkvf_meta_entry e;
    RC_R(r, fkvf_reader_meta_find(r, "beta", &e), FKVF_E_DUP_KEY);
    RC_R(r, fkvf_reader_meta(r, 0, &e), FKVF_E_DUP_KEY);
    RC_R(r, fkvf_reader_verify(r), FKVF_E_DUP_KEY);
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    tu_buf_free(&mb.b);

    /* the same keys far apart in a larger table */
    memset(&mb, 0, sizeof mb);
    char key[32];
    for (int i = 0; i < 500; i++) {
        snprintf(key, sizeof key, "key.%d", i);
        mb_u64(&mb, key, (uint64_t)i);
    }
    mb_u64(&mb, "key.0", 9);
    craft_base(&c, 0);
    cr_plain(&c, FKVF_SECTION_META, 0, 0, mb.b.data, mb.b.size);
    cr_commit(&c, 1, 0, 0, 0);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    RC_R(r, fkvf_reader_verify(r), FKVF_E_DUP_KEY);
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    tu_buf_free(&mb.b);
}
END_TEST

/* spec 4.4: size <= 2^40 and size <= 1032 * stored_size + 64, else LIMIT,
 * checked from the directory before anything is allocated. */
START_TEST(guard_deflate_bomb_declaration)
{
    static const uint8_t junk[100] = {1, 2, 3};
    /* (sizes above 2^48 are the LIMIT of spec 4.2 instead: see
     * directory_entry_limits) */
    static const uint64_t sizes[] = {1032 * 100 + 65, 1032 * 100 + 1031, 1032 * 101,
                                     UINT64_C(1) << 39, (UINT64_C(1) << 40) + 1,
                                     UINT64_C(1) << 48};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        craft c;
        craft_base(&c, FKVF_FEAT_DEFLATE);
        cr_section(&c, FKVF_FOURCC('B', 'O', 'M', 'B'), FKVF_SECTION_DEFLATE, 0, junk,
                   sizeof junk, sizes[i]);
        cr_commit(&c, 1, 0, 0, 0);
        char msg[600];
        int rc = open_craft(&c, 0, msg, sizeof msg);
        ck_assert_msg(rc == FKVF_E_LIMIT, "size %llu: %s (%s)", (unsigned long long)sizes[i],
                      fkvf_error_name(rc), msg);
        ck_assert(strstr(msg, "4.4") != NULL);
        tu_buf_free(&c.b);
    }
    /* at the limit: accepted by the directory check; the stream is junk -> DEFLATE */
    craft c;
    craft_base(&c, FKVF_FEAT_DEFLATE);
    cr_section(&c, FKVF_FOURCC('B', 'O', 'M', 'B'), FKVF_SECTION_DEFLATE, 0, junk, sizeof junk,
               1032 * 100 + 64);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    const void *p;
    size_t n;
    RC_R(r, fkvf_reader_section_data(r, 2, &p, &n), FKVF_E_DEFLATE);
    RC_R(r, fkvf_reader_verify(r), FKVF_E_DEFLATE);
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    /* deflate without the header's feature bit */
    craft_base(&c, 0);
    cr_section(&c, FKVF_FOURCC('B', 'O', 'M', 'B'), FKVF_SECTION_DEFLATE, 0, junk, sizeof junk,
               200);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "DEFLATE feature");
    tu_buf_free(&c.b);
}
END_TEST

static uint8_t *zcompress(const void *p, size_t n, size_t *zn)
{
    uLongf bound = compressBound((uLong)n);
    uint8_t *z = malloc(bound);
    ck_assert_ptr_nonnull(z);
    ck_assert_int_eq(compress2(z, &bound, p, (uLong)n, 9), Z_OK);
    *zn = bound;
    return z;
}

START_TEST(guard_corrupt_deflate_served_as_data)
{
    fkvf_desc d;
    simple_desc(&d);
    d.model_id = "a model id long enough that the descriptor compresses well well well well";
    size_t dn, zn;
    uint8_t *dp = desc_bytes(&d, &dn);
    uint8_t *z = zcompress(dp, dn, &zn);
    craft c;
    /* sanity: the intact deflated DESC opens */
    cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
    cr_section(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, z, zn, dn);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    fkvf_desc got;
    OK_R(r, fkvf_reader_desc(r, &got));
    ck_assert_str_eq(got.model_id, d.model_id);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    /* every single-byte change of the stream (checksums recomputed): DEFLATE */
    for (size_t i = 0; i < zn; i++) {
        z[i] ^= 0x20;
        cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
        cr_section(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, z, zn,
                   dn);
        cr_commit(&c, 1, 0, 0, 0);
        char msg[600];
        int rc = open_craft(&c, 0, msg, sizeof msg);
        EXPECTF(rc == FKVF_E_DEFLATE, "byte %zu: %s (%s)", i, fkvf_error_name(rc), msg);
        tu_buf_free(&c.b);
        z[i] ^= 0x20;
    }
    /* declared size one more / one less than the stream gives */
    for (int delta = -1; delta <= 1; delta += 2) {
        cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
        cr_section(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, z, zn,
                   (uint64_t)((long long)dn + delta));
        cr_commit(&c, 1, 0, 0, 0);
        EXPECT_OPEN(&c, FKVF_E_DEFLATE, "4.4");
        tu_buf_free(&c.b);
    }
    /* a truncated stream, and bytes after the stream */
    cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
    cr_section(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, z, zn - 3,
               dn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_DEFLATE, "4.4");
    tu_buf_free(&c.b);
    uint8_t *z2 = malloc(zn + 4);
    memcpy(z2, z, zn);
    memcpy(z2 + zn, "tail", 4);
    cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
    cr_section(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, z2, zn + 4,
               dn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_DEFLATE, "after the stream");
    tu_buf_free(&c.b);
    /* a raw (not zlib-wrapped) payload */
    cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
    cr_section(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, dp, dn,
               dn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_DEFLATE, "4.4");
    tu_buf_free(&c.b);
    /* STRM is never deflated (spec 4.4) */
    cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
    cr_desc(&c, 0);
    cr_section(&c, FKVF_SECTION_STRM, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, z, zn, dn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "never deflated");
    tu_buf_free(&c.b);
    free(z2);
    free(z);
    free(dp);
}
END_TEST

START_TEST(guard_structural_field_errors)
{
    craft c;
    fkvf_desc d;
    size_t dn;
    uint8_t *dp;
    /* a second DESC */
    craft_base(&c, 0);
    cr_desc(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "second DESC");
    tu_buf_free(&c.b);
    /* a DESC field out of range (checksums valid) */
    simple_desc(&d);
    dp = desc_bytes(&d, &dn);
    dp[16] = 9; /* dtype */
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED, 0, dp, dn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "dtype");
    tu_buf_free(&c.b);
    /* DESC lengths that do not match the section */
    dp[16] = FKVF_DTYPE_F16;
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED, 0, dp, dn - 1);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_TRUNCATED, "DESC");
    tu_buf_free(&c.b);
    free(dp);
    /* unknown directory flag bits, non-zero reserved entry bytes */
    craft_base(&c, 0);
    c.e[1].flags = 4;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "flag");
    tu_buf_free(&c.b);
    /* size != stored_size without deflate */
    craft_base(&c, 0);
    c.e[1].size = 65;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "stored_size");
    tu_buf_free(&c.b);
    /* directory commit_seq differs from the trailer's */
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    {
        layout l = layout_of(c.b.data, c.b.size);
        fkvf_st64(c.b.data + l.dir_off + 8, 2);
        refresh_last_commit(c.b.data, c.b.size);
    }
    EXPECT_OPEN(&c, FKVF_E_CHAIN, "commit_seq");
    tu_buf_free(&c.b);
    /* positions without exact rows */
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 3, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "not covered");
    tu_buf_free(&c.b);
    /* n_archived > n_positions */
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 3, 4);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "n_archived");
    tu_buf_free(&c.b);
    /* commit 1 with a prev_trailer */
    craft_base(&c, 0);
    cr_commit(&c, 1, 128, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CHAIN, "prev_trailer");
    tu_buf_free(&c.b);
}
END_TEST

/* ==== 7. odd addresses ========================================================== */

START_TEST(odd_address_buffers)
{
    model m;
    model_many(&m, FKVF_DTYPE_BF16);
    tu_buf b;
    build(&m, &b);
    uint8_t *odd = tu_dup_odd(b.data, b.size);
    ck_assert_ptr_nonnull(odd);
    ck_assert_uint_eq((uintptr_t)odd % 2, 1);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, odd, b.size, 0, NULL));
    check_model(r, &m, odd, b.size);
    fkvf_reader_free(r);
    tu_free_odd(odd);
    /* and the small archive */
    model m2;
    model_small(&m2);
    tu_buf b2;
    build(&m2, &b2);
    odd = tu_dup_odd(b2.data, b2.size);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, odd, b2.size, 0, NULL));
    check_model(r, &m2, odd, b2.size);
    fkvf_reader_free(r);
    tu_free_odd(odd);
    tu_buf_free(&b2);
    model_free(&m2);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* ==== 8. allocation failure ======================================================= */

/* Read everything; the first error. */
static int read_everything(fkvf_reader *r)
{
    int rc;
    fkvf_archive_info ai;
    if ((rc = fkvf_reader_info(r, &ai)))
        return rc;
    fkvf_desc d;
    if (ai.has_desc && (rc = fkvf_reader_desc(r, &d)))
        return rc;
    size_t n;
    if ((rc = fkvf_reader_meta_count(r, &n)))
        return rc;
    for (size_t i = 0; i < n; i++) {
        fkvf_meta_entry e;
        if ((rc = fkvf_reader_meta(r, i, &e)))
            return rc;
    }
    fkvf_meta_entry e;
    if ((rc = fkvf_reader_meta_find(r, "blob", &e)) && rc != FKVF_E_NOT_FOUND)
        return rc;
    for (uint64_t p = 0; p < ai.n_positions; p++) {
        int is;
        const void *row;
        size_t rb;
        if ((rc = fkvf_reader_is_exact(r, p, &is)))
            return rc;
        if (is && (rc = fkvf_reader_exact_row(r, p, &row, &rb)))
            return rc;
    }
    for (size_t s = 0; s < ai.n_streams; s++) {
        fkvf_stream_info si;
        if ((rc = fkvf_reader_stream_info(r, s, &si)))
            return rc;
        uint32_t *out = malloc((size_t)si.length * sizeof *out + 4);
        rc = fkvf_reader_stream_read(r, s, 0, out, (size_t)si.length);
        free(out);
        if (rc)
            return rc;
        for (uint64_t t = 0; t < si.length; t++) {
            fkvf_point pt;
            if ((rc = fkvf_reader_stream_point(r, s, t, &pt)))
                return rc;
        }
    }
    for (size_t i = 0; i < ai.n_sections; i++) {
        const void *p;
        if ((rc = fkvf_reader_section_data(r, i, &p, &n)))
            return rc;
    }
    fkvf_codebook_shape cs;
    const void *cp;
    uint8_t h[16];
    if ((rc = fkvf_reader_codebook(r, &cs, &cp, &n, h)) && rc != FKVF_E_NOT_FOUND)
        return rc;
    return fkvf_reader_verify(r);
}

static void alloc_failure_reader(const uint8_t *data, size_t size, const char *path, int sticky)
{
    long k;
    for (k = 1;; k++) {
        /* the k-th allocation fails (and every later one if sticky); fresh
         * blocks are garbage (0xA5) with a NUL byte after them */
        tu_alloc f = {.fail_at = k, .fail_after = sticky, .fill = 1};
        fkvf_allocator a = tu_alloc_hook(&f);
        fkvf_reader *r = NULL;
        int rc = path ? fkvf_reader_open_file(&r, path, 0, &a)
                      : fkvf_reader_open_memory(&r, data, size, 0, &a);
        if (rc == FKVF_OK)
            rc = read_everything(r);
        EXPECTF(rc == FKVF_OK || rc == FKVF_E_NOMEM, "k=%ld sticky=%d: %s (%s)", k, sticky,
                fkvf_error_name(rc), fkvf_reader_message(r));
        EXPECTF(rc == FKVF_OK || f.failed, "k=%ld: error without an allocation failure", k);
        if (rc == FKVF_E_NOMEM && r)
            EXPECTF(strlen(fkvf_reader_message(r)) > 0, "k=%ld: NOMEM without a message", k);
        fkvf_reader_free(r);
        EXPECTF(f.live == 0, "k=%ld sticky=%d: %ld blocks leaked", k, sticky, f.live);
        if (!f.failed) {
            EXPECT(rc == FKVF_OK);
            break;
        }
    }
    ck_assert_int_gt(k, 5); /* the reader does allocate */
}

START_TEST(alloc_failure_open_and_read)
{
    model m;
    model_small(&m);
    m.opts.required_features |= FKVF_FEAT_DEFLATE;
    m.exac_flags = FKVF_SECTION_DEFLATE;
    m.extra = 1;
    tu_buf b;
    build(&m, &b);
    alloc_failure_reader(b.data, b.size, NULL, 0);
    alloc_failure_reader(b.data, b.size, NULL, 1);
    char *dir = make_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/f.fkvf", dir);
    tu_write_file(path, b.data, b.size);
    alloc_failure_reader(NULL, 0, path, 0);
    rm_tmpdir(dir);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(alloc_failure_write)
{
    model m;
    model_small(&m);
    m.opts.required_features |= FKVF_FEAT_DEFLATE;
    m.exac_flags = FKVF_SECTION_DEFLATE;
    m.extra = 1;
    tu_buf ref;
    build(&m, &ref);
    for (int sticky = 0; sticky < 2; sticky++) {
        long k;
        for (k = 1;; k++) {
            tu_alloc f = {.fail_at = k, .fail_after = sticky, .fill = 1};
            fkvf_allocator a = tu_alloc_hook(&f);
            tu_buf b;
            memset(&b, 0, sizeof b);
            fkvf_sink sink = tu_buf_sink(&b);
            fkvf_writer *w = NULL;
            int rc = fkvf_writer_create_sink(&w, &sink, &m.opts, &a);
            if (rc == FKVF_OK)
                rc = write_model(&m, w);
            EXPECTF(rc == FKVF_OK || rc == FKVF_E_NOMEM, "k=%ld: %s (%s)", k,
                    fkvf_error_name(rc), fkvf_writer_message(w));
            if (rc == FKVF_OK) /* no silently dropped content */
                EXPECTF(b.size == ref.size && memcmp(b.data, ref.data, b.size) == 0,
                        "k=%ld: output differs", k);
            else if (w)
                EXPECT(strlen(fkvf_writer_message(w)) > 0);
            fkvf_writer_free(w);
            EXPECTF(f.live == 0, "k=%ld: %ld blocks leaked", k, f.live);
            tu_buf_free(&b);
            if (!f.failed) {
                EXPECT(rc == FKVF_OK);
                break;
            }
        }
        ck_assert_int_gt(k, 5);
    }
    tu_buf_free(&ref);
    model_free(&m);
}
END_TEST

/* Bug guard: when the path copy failed but the temp-path buffer was
 * allocated, fkvf_writer_free read the uninitialized temp path and passed
 * it to unlink(). The trap file is named like the garbage our allocator
 * leaves in fresh blocks. */
START_TEST(alloc_failure_create_file_leaves_nothing)
{
    model m;
    model_small(&m);
    tu_buf ref;
    build(&m, &ref);
    char *dir = make_tmpdir();
    int cwd = open(".", O_RDONLY);
    ck_assert_int_ge(cwd, 0);
    ck_assert_int_eq(chdir(dir), 0);
    const char *path = "w.fkvf"; /* relative: the temp path has 6 + 16 bytes */
    char trap[6 + 16 + 1];
    memset(trap, 0xA5, 6 + 16);
    trap[6 + 16] = 0;
    tu_write_file(trap, "trap", 4);
    for (int sticky = 0; sticky < 2; sticky++) {
        long k;
        for (k = 1;; k++) {
            tu_alloc f = {.fail_at = k, .fail_after = sticky, .fill = 1};
            fkvf_allocator a = tu_alloc_hook(&f);
            fkvf_writer *w = NULL;
            int rc = fkvf_writer_create_file(&w, path, &m.opts, &a);
            if (rc == FKVF_OK)
                rc = write_model(&m, w);
            EXPECTF(rc == FKVF_OK || rc == FKVF_E_NOMEM, "k=%ld: %s", k, fkvf_error_name(rc));
            fkvf_writer_free(w);
            EXPECTF(f.live == 0, "k=%ld: %ld blocks leaked", k, f.live);
            EXPECTF(path_exists(trap), "k=%ld: writer_free unlinked an unrelated file", k);
            if (rc == FKVF_OK) {
                size_t n;
                uint8_t *got = tu_slurp(path, &n);
                EXPECT(n == ref.size && memcmp(got, ref.data, n) == 0);
                free(got);
                unlink(path);
            }
            EXPECTF(dir_entries(".") == 1, "k=%ld: %zu files in the directory", k,
                    dir_entries("."));
            if (!f.failed)
                break;
        }
    }
    ck_assert_int_eq(fchdir(cwd), 0);
    close(cwd);
    rm_tmpdir(dir);
    tu_buf_free(&ref);
    model_free(&m);
}
END_TEST

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
    fkvf_codebook_shape s = {1, 1, 1, 1, 16, 0, 0, FKVF_DTYPE_F16, 0};
    ck_assert_uint_eq(fkvf_codebook_size(&s), 64); /* no stages: the header alone */
    s.k_stages = 1;
    ck_assert_uint_eq(fkvf_codebook_size(&s), 64 + 16 * 2);
    s = (fkvf_codebook_shape){1, 1, 16384, 16384, 4096, 16, 16, FKVF_DTYPE_F32, 0};
    ck_assert_uint_eq(fkvf_codebook_size(&s), 64 + (UINT64_C(1) << 33));
    s = (fkvf_codebook_shape){1024, 1024, 1, 1, 16, 1, 0, FKVF_DTYPE_F16, 0};
    ck_assert_uint_eq(fkvf_codebook_size(&s), 64 + (UINT64_C(1) << 25));
    s = (fkvf_codebook_shape){3, 1, 5, 7, 64, 2, 3, FKVF_DTYPE_F32, 1};
    ck_assert_uint_eq(fkvf_codebook_size(&s), 64 + 3 * 64 * (2 * 5 + 3 * 7) * 4);
    /* beyond 2^48 */
    s = (fkvf_codebook_shape){1024, 1024, 16384, 16384, 4096, 16, 16, FKVF_DTYPE_F32, 0};
    ck_assert_uint_eq(fkvf_codebook_size(&s), 0);
    /* fields out of range (spec 13.1) */
    static const fkvf_codebook_shape bad[] = {
        {0, 1, 4, 4, 16, 1, 1, FKVF_DTYPE_F16, 0},    {1025, 1, 4, 4, 16, 1, 1, FKVF_DTYPE_F16, 0},
        {1, 0, 4, 4, 16, 1, 1, FKVF_DTYPE_F16, 0},    {1, 1025, 4, 4, 16, 1, 1, FKVF_DTYPE_F16, 0},
        {1, 1, 0, 4, 16, 1, 1, FKVF_DTYPE_F16, 0},    {1, 1, 16385, 4, 16, 1, 1, FKVF_DTYPE_F16, 0},
        {1, 1, 4, 0, 16, 1, 1, FKVF_DTYPE_F16, 0},    {1, 1, 4, 4, 8, 1, 1, FKVF_DTYPE_F16, 0},
        {1, 1, 4, 4, 15, 1, 1, FKVF_DTYPE_F16, 0},    {1, 1, 4, 4, 48, 1, 1, FKVF_DTYPE_F16, 0},
        {1, 1, 4, 4, 8192, 1, 1, FKVF_DTYPE_F16, 0},  {1, 1, 4, 4, 16, 17, 1, FKVF_DTYPE_F16, 0},
        {1, 1, 4, 4, 16, 1, 17, FKVF_DTYPE_F16, 0},   {1, 1, 4, 4, 16, 1, 1, FKVF_DTYPE_BF16, 0},
        {1, 1, 4, 4, 16, 1, 1, (fkvf_dtype)0, 0},     {1, 2, 4, 4, 16, 1, 1, FKVF_DTYPE_F16, 1},
        {1, 1, 4, 4, 16, 1, 1, FKVF_DTYPE_F16, 2},
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
    fkvf_codebook_shape big = {1024, 1024, 16384, 16384, 4096, 16, 16, FKVF_DTYPE_F32, 0};
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

static Suite *container_suite(void)
{
    Suite *s = suite_create("container");
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

    t = tcase_create("writer");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, writer_is_deterministic_through_sink);
    tcase_add_test(t, writer_is_deterministic_through_file);
    tcase_add_test(t, writer_create_file_is_atomic);
    tcase_add_test(t, writer_no_replace_keeps_existing_file);
    tcase_add_test(t, writer_file_mode);
    tcase_add_test(t, error_info_of_conformance_files);
    tcase_add_test(t, writer_refuses_stream_length_mismatch);
    tcase_add_test(t, writer_refuses_uncovered_exact_position);
    tcase_add_test(t, writer_refuses_duplicate_and_reserved_meta_keys);
    tcase_add_test(t, writer_refuses_ngon_without_feature);
    tcase_add_test(t, writer_refuses_bad_streams);
    tcase_add_test(t, writer_refuses_invalid_descriptor_fields);
    tcase_add_test(t, writer_refuses_misuse);
    tcase_add_test(t, writer_refuses_unknown_optional_features);
    tcase_add_test(t, writer_sink_error_is_sticky_io);
    suite_add_tcase(s, t);

    t = tcase_create("damage");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, every_truncation_fails_truncated);
    tcase_add_test(t, truncated_files_on_disk);
    tcase_add_test(t, every_header_bit_flip);
    tcase_add_test(t, every_directory_bit_flip);
    tcase_add_test(t, every_trailer_bit_flip);
    tcase_add_test(t, every_payload_bit_flip);
    tcase_add_test(t, stream_block_flip_caught_on_first_touch);
    tcase_add_test(t, ngon_anchor_with_matching_checksums_fails_span);
    suite_add_tcase(s, t);

    t = tcase_create("crafted");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, crafted_baseline_is_valid);
    tcase_add_test(t, guard_non_fkvf_file_accepted);
    tcase_add_test(t, guard_major_version_2_read_as_v1);
    tcase_add_test(t, guard_big_endian_file_misread);
    tcase_add_test(t, guard_unknown_required_feature_ignored);
    tcase_add_test(t, guard_misaligned_section_offset_accepted);
    tcase_add_test(t, guard_overlapping_sections_accepted);
    tcase_add_test(t, guard_section_reaching_into_directory);
    tcase_add_test(t, guard_nonzero_padding_unnoticed);
    tcase_add_test(t, guard_duplicate_meta_keys_ambiguous);
    tcase_add_test(t, guard_deflate_bomb_declaration);
    tcase_add_test(t, verify_replaced_meta);
    tcase_add_test(t, codebook_value_not_finite);
    tcase_add_test(t, exac_count_beyond_limit);
    tcase_add_test(t, guard_corrupt_deflate_served_as_data);
    tcase_add_test(t, guard_structural_field_errors);
    suite_add_tcase(s, t);

    t = tcase_create("memory");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, odd_address_buffers);
    tcase_add_test(t, alloc_failure_open_and_read);
    tcase_add_test(t, alloc_failure_write);
    tcase_add_test(t, alloc_failure_create_file_leaves_nothing);
    suite_add_tcase(s, t);

    t = tcase_create("commits");
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

    t = tcase_create("codebook");
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
    return s;
}

int main(void)
{
    return tu_run_suite(container_suite());
}
