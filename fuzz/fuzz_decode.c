/* Fuzz target: open an archive, then decode everything the reader can
 * decode, with bounded work per input, and check that the ways of reading
 * the same data agree:
 *  - fkvf_reader_restore of all positions at once == position by position,
 *    in every dtype; exact positions restore to their EXAC row;
 *  - fkvf_reader_read (ROWS and HEADS layouts, the whole cache and an
 *    input-chosen selection of layers, heads, parts) == the matching
 *    elements of fkvf_reader_restore;
 *  - every stream: fkvf_reader_stream_read == _get == _read_u8, quad
 *    points == the digit recurrence over the symbols, search context ==
 *    the symbols before t;
 *  - the codebook's size and content hash; metadata; section data; verify.
 * Three kinds of input:
 *  - bytes starting with the FKVF magic are opened as they are (any result
 *    is fine, but no crash, leak, or disagreement between the accessors);
 *  - bytes starting with the magic whose first byte is 0x88 instead of 0x89
 *    are given the right magic and every checksum the target can find is
 *    recomputed (header, each commit's trailer and directory, the sections
 *    they list, STRM segment headers and blocks), so that mutations reach
 *    the checks behind the checksums; then as above;
 *  - anything else is a recipe: shapes, codecs, positions, rows, codes and
 *    tokens for the writer, which writes a valid archive into memory (one
 *    or two commits); then open + verify must succeed and every row, code
 *    and token must come back exactly (archived rows: the RVQ decoding of
 *    their codes, spec 13.6). */
#include <math.h>

#include "codec/codec.h"
#include "common/hash.h"
#include "fkvf.h"
#include "fuzz_util.h"

#define MAX_ROW_BYTES (1u << 16)
#define MAX_POS 64

static const fkvf_dtype dtypes[3] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16, FKVF_DTYPE_F32};

static size_t dsize(fkvf_dtype d) { return d == FKVF_DTYPE_F32 ? 4 : 2; }

/* ---- checks on any opened archive ------------------------------------- */

static void check_streams(fkvf_reader *r, size_t n_streams, int valid)
{
    for (size_t i = 0; i < n_streams && i < 8; i++) {
        fkvf_stream_info si;
        if (fkvf_reader_stream_info(r, i, &si) != FKVF_OK) {
            FZ_CHECK(!valid);
            continue;
        }
        size_t n = si.length < 300 ? (size_t)si.length : 300;
        uint32_t sym[300], s1;
        uint8_t s8[300];
        int rc = fkvf_reader_stream_read(r, i, 0, sym, n);
        FZ_CHECK(!valid || rc == FKVF_OK);
        if (rc != FKVF_OK)
            continue;
        FZ_CHECK(fkvf_reader_stream_read(r, i, si.length, sym + 0, 1) != FKVF_OK);
        int small = si.profile == FKVF_PROFILE_QUAD ? si.symbol_bits <= 8 : si.alphabet <= 256;
        int rc8 = fkvf_reader_stream_read_u8(r, i, 0, s8, n);
        FZ_CHECK(small ? rc8 == FKVF_OK : rc8 == FKVF_E_INVALID_ARG);
        for (size_t t = 0; t < n; t++) {
            if (small)
                FZ_CHECK(s8[t] == sym[t]);
            FZ_CHECK(fkvf_reader_stream_get(r, i, t, &s1) == FKVF_OK && s1 == sym[t]);
            if (si.profile == FKVF_PROFILE_QUAD && si.alphabet)
                FZ_CHECK(sym[t] < si.alphabet);
            if (si.profile == FKVF_PROFILE_NGON)
                FZ_CHECK(sym[t] < si.alphabet);
        }
        for (size_t t = 0; t < n; t += 1 + n / 8) {
            fkvf_point p;
            FZ_CHECK(fkvf_reader_stream_point(r, i, t, &p) == FKVF_OK);
            if (si.profile == FKVF_PROFILE_QUAD) {
                uint64_t x, y;
                fkvf_quad_point_ref(sym, t, si.symbol_bits, &x, &y);
                FZ_CHECK(p.x == x && p.y == y);
            } else {
                FZ_CHECK(isfinite(p.fx) && isfinite(p.fy) && p.fx * p.fx + p.fy * p.fy <= 1.0 + 1e-9);
            }
            uint32_t ctx[40];
            size_t got = 0;
            size_t want = fz_range(&(fz){(const uint8_t *)&t, sizeof t}, 1, 40);
            FZ_CHECK(fkvf_search_context(r, i, t, want, ctx, &got) == FKVF_OK);
            size_t m = want < t + 1 ? want : t + 1;
            FZ_CHECK(got == m && memcmp(ctx, sym + t + 1 - m, m * sizeof *ctx) == 0);
        }
        size_t idx;
        /* an index stream named by the layer table of an external codebook
         * not attached (spec 11.2) has no id to find it by */
        if (si.id == FKVF_STREAM_ID_UNNAMED)
            FZ_CHECK(fkvf_reader_stream_find(r, si.id, &idx) == FKVF_E_NOT_FOUND);
        else
            FZ_CHECK(fkvf_reader_stream_find(r, si.id, &idx) == FKVF_OK && idx == i);
        for (size_t s = 0; s < si.n_segments && s < 4; s++) {
            size_t sec;
            uint64_t first, count;
            FZ_CHECK(fkvf_reader_stream_segment(r, i, s, &sec, &first, &count) == FKVF_OK);
        }
    }
}

static void check_codebook(fkvf_reader *r)
{
    fkvf_codebook_shape cs;
    const void *c;
    size_t sz;
    uint8_t h[16], h2[16];
    if (fkvf_reader_codebook(r, &cs, &c, &sz, h) != FKVF_OK)
        return;
    FZ_CHECK(fkvf_codebook_size(&cs) == sz);
    fkvf_codebook_hash(c, sz, h2);
    FZ_CHECK(memcmp(h, h2, 16) == 0);
    /* an encoder metric the reader hands out passed spec 13.8's checks:
     * every matrix is what the quantizer accepts, and a handle of these
     * tables takes it */
    fkvf_rvq_metric m;
    if (fkvf_reader_metric(r, &m) != FKVF_OK)
        return;
    FZ_CHECK(m.keys || m.values);
    for (unsigned kv = 0; kv < 2; kv++) {
        const float *a = kv ? m.values : m.keys;
        uint32_t dim = kv ? cs.value_dim : cs.key_dim;
        size_t n_tabs = (size_t)cs.n_layers * cs.n_heads, nn = (size_t)dim * dim;
        for (size_t t = 0; a && t < n_tabs && t < 4; t++)
            FZ_CHECK(fkvf_metric_matrix_check(a + t * nn, dim, NULL) == 0);
    }
}

/* element e of a restored row (layout 14.2) from layer l, head h, kv, d */
static size_t row_elem(const fkvf_desc *d, uint32_t l, uint32_t h, unsigned kv, uint32_t x)
{
    size_t per_layer = (size_t)d->n_kv_heads * (d->key_dim + d->value_dim);
    size_t o = (size_t)l * per_layer;
    if (kv == 0)
        return o + (size_t)h * d->key_dim + x;
    return o + (size_t)d->n_kv_heads * d->key_dim + (size_t)h * d->value_dim + x;
}

/* Compare a read of req (layout, selection) with the restored rows. */
static void check_read(fkvf_reader *r, const fkvf_desc *d, const fkvf_read_request *q,
                       const uint8_t *rest, size_t es, int valid)
{
    size_t need = 0;
    int rc = fkvf_reader_read_size(r, q, &need);
    if (rc != FKVF_OK || need > (1u << 20)) {
        FZ_CHECK(!valid || rc == FKVF_OK);
        return;
    }
    uint8_t *out = malloc(need ? need : 1);
    FZ_CHECK(out);
    rc = fkvf_reader_read(r, q, out, need);
    FZ_CHECK(!valid || rc == FKVF_OK);
    if (need)
        FZ_CHECK(fkvf_reader_read(r, q, out, need - 1) == FKVF_E_INVALID_ARG);
    if (rc == FKVF_OK && rest) {
        uint32_t lc = q->layer_count ? q->layer_count : d->n_layers - q->layer_first;
        uint32_t hc = q->head_count ? q->head_count : d->n_kv_heads - q->head_first;
        unsigned parts = q->parts ? q->parts : 3;
        size_t row_elems = (size_t)d->n_layers * d->n_kv_heads * (d->key_dim + d->value_dim);
        size_t o = 0;
        for (uint32_t li = 0; li < lc && q->layout == FKVF_LAYOUT_HEADS; li++)
            for (unsigned kv = 0; kv < 2; kv++) {
                if (!(parts & (1u << kv)))
                    continue;
                uint32_t dim = kv ? d->value_dim : d->key_dim;
                for (uint32_t hi = 0; hi < hc; hi++)
                    for (uint64_t p = 0; p < q->count; p++)
                        for (uint32_t x = 0; x < dim; x++, o++) {
                            size_t e = p * row_elems +
                                       row_elem(d, q->layer_first + li, q->head_first + hi, kv, x);
                            FZ_CHECK(memcmp(out + o * es, rest + e * es, es) == 0);
                        }
            }
        for (uint64_t p = 0; p < q->count && q->layout == FKVF_LAYOUT_ROWS; p++)
            for (uint32_t li = 0; li < lc; li++)
                for (unsigned kv = 0; kv < 2; kv++) {
                    if (!(parts & (1u << kv)))
                        continue;
                    uint32_t dim = kv ? d->value_dim : d->key_dim;
                    for (uint32_t hi = 0; hi < hc; hi++)
                        for (uint32_t x = 0; x < dim; x++, o++) {
                            size_t e = p * row_elems +
                                       row_elem(d, q->layer_first + li, q->head_first + hi, kv, x);
                            FZ_CHECK(memcmp(out + o * es, rest + e * es, es) == 0);
                        }
                }
        FZ_CHECK(o * es == need);
    }
    free(out);
}

static void check_rows(fkvf_reader *r, const fkvf_archive_info *ai, fz *f, int valid)
{
    fkvf_desc d;
    if (fkvf_reader_desc(r, &d) != FKVF_OK) {
        FZ_CHECK(!valid);
        return;
    }
    uint64_t n = ai->n_positions < MAX_POS ? ai->n_positions : MAX_POS;
    for (int di = 0; di < 3; di++) {
        fkvf_dtype dt = dtypes[di];
        size_t rb = 0, es = dsize(dt);
        if (fkvf_reader_row_bytes(r, dt, &rb) != FKVF_OK || rb == 0 || rb > MAX_ROW_BYTES)
            continue;
        uint8_t *all = malloc(rb * (n ? n : 1)), *one = malloc(rb);
        FZ_CHECK(all && one);
        int rc_all = fkvf_reader_restore(r, 0, n, dt, all, rb * n);
        FZ_CHECK(!valid || rc_all == FKVF_OK);
        for (uint64_t p = 0; p < n; p++) {
            int rc = fkvf_reader_restore(r, p, 1, dt, one, rb);
            FZ_CHECK(!valid || rc == FKVF_OK);
            if (rc == FKVF_OK && rc_all == FKVF_OK)
                FZ_CHECK(memcmp(one, all + p * rb, rb) == 0);
            int ex = -1;
            if (fkvf_reader_is_exact(r, p, &ex) == FKVF_OK && ex == 1 && dt == d.dtype &&
                rc == FKVF_OK) {
                const void *row;
                size_t rbytes;
                int rx = fkvf_reader_exact_row(r, p, &row, &rbytes);
                FZ_CHECK(!valid || rx == FKVF_OK);
                if (rx == FKVF_OK)
                    FZ_CHECK(rbytes == rb && memcmp(row, one, rb) == 0);
            }
        }
        if (n)
            FZ_CHECK(fkvf_reader_restore(r, 0, 1, dt, one, rb - 1) != FKVF_OK);
        FZ_CHECK(fkvf_reader_restore(r, ai->n_positions, 1, dt, one, rb) != FKVF_OK);
        /* reads: everything, then a chosen selection, both layouts */
        const uint8_t *rest = rc_all == FKVF_OK ? all : NULL;
        for (int lay = 0; lay < 2; lay++) {
            fkvf_read_request q;
            memset(&q, 0, sizeof q);
            q.count = n;
            q.dtype = dt;
            q.layout = lay ? FKVF_LAYOUT_HEADS : FKVF_LAYOUT_ROWS;
            check_read(r, &d, &q, rest, es, valid);
            if (!d.n_layers || !d.n_kv_heads || !n)
                continue;
            q.first = fz_range(f, 0, (uint32_t)n - 1);
            q.count = fz_range(f, 0, (uint32_t)(n - q.first));
            q.layer_first = fz_range(f, 0, d.n_layers - 1);
            q.layer_count = fz_range(f, 0, d.n_layers - q.layer_first);
            q.head_first = fz_range(f, 0, d.n_kv_heads - 1);
            q.head_count = fz_range(f, 0, d.n_kv_heads - q.head_first);
            q.parts = fz_range(f, 0, 3);
            check_read(r, &d, &q, rest ? rest + q.first * rb : NULL, es, valid);
        }
        free(all);
        free(one);
    }
}

static void decode_all(fkvf_reader *r, fz *f, int valid)
{
    fkvf_archive_info ai;
    FZ_CHECK(fkvf_reader_info(r, &ai) == FKVF_OK);
    FZ_CHECK(ai.committed_size <= ai.file_size && ai.torn_bytes == ai.file_size - ai.committed_size);
    FZ_CHECK(ai.n_archived <= ai.n_positions);
    size_t nm = 0;
    if (fkvf_reader_meta_count(r, &nm) == FKVF_OK)
        for (size_t i = 0; i < nm && i < 64; i++) {
            fkvf_meta_entry e;
            int rc = fkvf_reader_meta(r, i, &e);
            FZ_CHECK(!valid || rc == FKVF_OK);
        }
    for (size_t i = 0; i < ai.n_sections && i < 64; i++) {
        fkvf_section_info si;
        const void *p;
        size_t sz;
        FZ_CHECK(fkvf_reader_section(r, i, &si) == FKVF_OK);
        int rc = fkvf_reader_section_data(r, i, &p, &sz);
        FZ_CHECK(!valid || rc == FKVF_OK);
        if (rc == FKVF_OK)
            FZ_CHECK(sz == si.size);
    }
    check_codebook(r);
    check_streams(r, ai.n_streams, valid);
    check_rows(r, &ai, f, valid);
    int rc = fkvf_reader_verify(r);
    FZ_CHECK(!valid || rc == FKVF_OK);
}

/* ---- checksum fixing (spec 3, 4.2, 6, 11.2-11.4) ---------------------- */

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* [off, off + len) inside a buffer of n bytes? */
static int inside(uint64_t off, uint64_t len, size_t n)
{
    return off <= n && len <= n - off;
}

/* STRM segment at [off, off + sz): header checksum and block checksums */
static void fix_strm(uint8_t *b, size_t n, uint64_t off, uint64_t sz)
{
    if (sz < 64 || !inside(off, sz, n))
        return;
    const uint8_t *h = b + off;
    unsigned prof = h[8], bits = h[9];
    uint64_t count = rd64(h + 24);
    uint32_t span = rd32(h + 32), bs = rd32(h + 36), ns = rd32(h + 48);
    uint64_t sb;
    if (prof == 1 && bits >= 2 && bits <= 32 && count <= (UINT64_C(1) << 40))
        sb = (count * bits + 127) / 128 * 16;
    else if (prof == 2 && span >= 1 && count <= (UINT64_C(1) << 48))
        sb = (count + span - 1) / span * 16;
    else
        return;
    if (bs < 64 || ns == 0 || sb > (UINT64_C(1) << 48) / ns)
        goto head;
    uint64_t db = sb * ns, nb = (db + bs - 1) / bs, doff = (64 + 8 * nb + 63) / 64 * 64;
    if (doff > sz || db > sz - doff || 64 + 8 * nb > sz)
        goto head;
    for (uint64_t i = 0; i < nb; i++) {
        uint64_t start = off + doff + i * bs, len = db - i * bs < bs ? db - i * bs : bs;
        wr64(b + off + 64 + 8 * i, fkvf_xxh3_64(b + start, (size_t)len, start));
    }
head:
    wr64(b + off + 56, fkvf_xxh3_64(b + off, 56, off));
}

static void fix_checksums(uint8_t *b, size_t n)
{
    static const uint8_t tmagic[8] = {0x89, 'F', 'K', 'V', 'T', 'R', 'L', '\n'};
    if (n < 64)
        return;
    wr64(b + 56, fkvf_xxh3_64(b, 56, 0));
    for (size_t t = 64; t + 64 <= n; t += 64) {
        if (memcmp(b + t, tmagic, 8) != 0)
            continue;
        uint64_t doff = rd64(b + t + 16), dsz = rd64(b + t + 24);
        if (inside(doff, dsz, n) && dsz >= 64 && memcmp(b + doff, "DIRC", 4) == 0) {
            uint64_t ne = (dsz - 64) / 64;
            for (uint64_t e = 0; e < ne && e < 4096; e++) {
                uint8_t *en = b + doff + 64 + 64 * e;
                uint64_t off = rd64(en + 8), sz = rd64(en + 16);
                if (!inside(off, sz, n))
                    continue;
                if (memcmp(en, "STRM", 4) == 0)
                    fix_strm(b, n, off, sz);
                wr64(en + 40, fkvf_xxh3_64(b + off, (size_t)sz, off));
            }
            wr64(b + t + 32, fkvf_xxh3_64(b + doff, (size_t)dsz, doff));
        }
        wr64(b + t + 56, fkvf_xxh3_64(b + t, 56, t));
    }
}

/* ---- the recipe: a valid archive from the writer ------------------------ */

typedef struct membuf {
    uint8_t *p;
    size_t n, cap;
} membuf;

static long long mem_write(void *opaque, const void *data, size_t size)
{
    membuf *m = opaque;
    if (m->n + size > m->cap) {
        size_t c = m->cap ? m->cap : 4096;
        while (c < m->n + size)
            c *= 2;
        uint8_t *np = realloc(m->p, c);
        if (!np)
            return -1;
        m->p = np;
        m->cap = c;
    }
    memcpy(m->p + m->n, data, size);
    m->n += size;
    return (long long)size;
}

static void store_tame(fkvf_dtype dt, uint8_t *p, fz *f)
{
    float v = (float)((int8_t)fz_u8(f)) / 16.0f;
    if (dt == FKVF_DTYPE_F32) {
        memcpy(p, &v, 4);
        return;
    }
    uint16_t h = dt == FKVF_DTYPE_F16 ? fkvf_f32_to_f16(v) : fkvf_f32_to_bf16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static unsigned bits_for(uint32_t alphabet)
{
    unsigned b = 2;
    while (b < 32 && ((uint64_t)1 << b) < alphabet)
        b += 2;
    return b;
}

static void recipe(fz *f)
{
    uint8_t m0 = fz_u8(f), m1 = fz_u8(f), m2 = fz_u8(f), m3 = fz_u8(f);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = 1 + m0 % 2;
    d.n_kv_heads = 1 + (m0 >> 1) % 2;
    d.key_dim = 2 * (1 + (m0 >> 2) % 3);
    d.value_dim = 1 + (m0 >> 4) % 6;
    d.dtype = dtypes[m1 % 3];
    if ((m1 >> 2) & 1) {
        d.key_transform = 1;
        d.rope_layout = 1 + ((m1 >> 3) & 1);
        d.key_storage = (m1 >> 4) & 1;
        d.rope_dims = 2 * (1 + (uint32_t)(m1 >> 5) % (d.key_dim / 2));
        d.rope_theta = 10000.0;
    }
    uint32_t N = fz_range(f, 1, 48);
    d.n_sinks = fz_range(f, 0, 4);
    uint32_t W = fz_range(f, 0, N);
    d.window = W;
    uint32_t S = d.n_sinks < N ? d.n_sinks : N;
    uint32_t A = N > S + W ? N - S - W : 0;
    d.model_id = (m2 & 1) ? "fuzz-model" : NULL;
    d.tokenizer_id = (m2 & 2) ? "fuzz-tok" : NULL;

    fkvf_codebook_shape cs;
    memset(&cs, 0, sizeof cs);
    cs.n_layers = d.n_layers;
    cs.pooled = (m2 >> 2) & 1;
    cs.n_heads = cs.pooled ? 1 : d.n_kv_heads;
    cs.key_dim = d.key_dim;
    cs.value_dim = d.value_dim;
    cs.k = (m2 >> 3) & 1 ? 32 : 16;
    cs.k_stages = (uint8_t)((m2 >> 4) % 3);
    cs.v_stages = (uint8_t)((m2 >> 6) % 3);
    if (A && !cs.k_stages && !cs.v_stages)
        cs.k_stages = 1; /* archived positions need index streams */
    cs.dtype = (m3 & 1) ? FKVF_DTYPE_F32 : FKVF_DTYPE_F16;
    int with_cb = A > 0 || ((m3 >> 1) & 1);
    int ngon_ix = (m3 >> 2) & 1, deflate = (m3 >> 3) & 1, tokens_on = (m3 >> 4) & 1;
    int ngon_tok = (m3 >> 5) & 1, two_commits = (m3 >> 6) & 1;

    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.block_size = 64u * (1u + fz_u8(f) % 8u);
    if (ngon_ix || ngon_tok)
        o.required_features |= FKVF_FEAT_NGON;
    if (deflate)
        o.required_features |= FKVF_FEAT_DEFLATE;
    if (tokens_on)
        o.optional_features |= FKVF_OPTFEAT_TOKEN_STREAM;
    membuf mb = {NULL, 0, 0};
    fkvf_sink sink = {mem_write, NULL, &mb};
    fkvf_writer *w = NULL;
    FZ_CHECK(fkvf_writer_create_sink(&w, &sink, &o, NULL) == FKVF_OK);
    FZ_CHECK(fkvf_writer_set_desc(w, &d) == FKVF_OK);

    size_t row_elems = (size_t)d.n_layers * d.n_kv_heads * (d.key_dim + d.value_dim);
    size_t rb = row_elems * dsize(d.dtype);
    uint8_t *rows = malloc(rb * N);
    FZ_CHECK(rows);
    for (size_t i = 0; i < row_elems * N; i++)
        store_tame(d.dtype, rows + i * dsize(d.dtype), f);
    unsigned sflags = deflate ? FKVF_SECTION_DEFLATE : 0;
    if (S)
        FZ_CHECK(fkvf_writer_add_exact(w, 0, S, rows, S * rb, sflags) == FKVF_OK);
    if (N > S + A)
        FZ_CHECK(fkvf_writer_add_exact(w, S + A, N - S - A, rows + (S + A) * rb,
                                       (N - S - A) * rb, 0) == FKVF_OK);
    uint8_t *tables = NULL;
    size_t tsize = 0;
    if (with_cb) {
        uint64_t cb = fkvf_codebook_size(&cs);
        FZ_CHECK(cb >= 64);
        tsize = (size_t)(cb - 64);
        tables = malloc(tsize + 1);
        FZ_CHECK(tables);
        for (size_t i = 0; i < tsize / dsize(cs.dtype); i++)
            store_tame(cs.dtype, tables + i * dsize(cs.dtype), f);
        FZ_CHECK(fkvf_writer_add_codebooks(w, &cs, tables, tsize, sflags) == FKVF_OK);
    }
    size_t cpp = (size_t)d.n_layers * d.n_kv_heads * (cs.k_stages + cs.v_stages);
    uint16_t *codes = calloc((size_t)A * cpp + 1, sizeof *codes);
    FZ_CHECK(codes);
    fkvf_stream_spec isp;
    memset(&isp, 0, sizeof isp);
    if (ngon_ix) {
        isp.profile = FKVF_PROFILE_NGON;
        isp.alphabet = cs.k;
    } else {
        isp.profile = FKVF_PROFILE_QUAD;
        isp.symbol_bits = bits_for(cs.k) + 2u * (fz_u8(f) % 3u);
    }
    if (A && cpp) {
        for (size_t i = 0; i < (size_t)A * cpp; i++)
            codes[i] = (uint16_t)(fz_u8(f) % cs.k);
        FZ_CHECK(fkvf_writer_add_index_segment(w, &isp, 0, A, codes, cpp, 1) == FKVF_OK);
    }
    uint32_t *tok = calloc(N, sizeof *tok);
    FZ_CHECK(tok);
    fkvf_stream_spec tsp;
    memset(&tsp, 0, sizeof tsp);
    uint32_t talpha;
    if (ngon_tok) {
        tsp.profile = FKVF_PROFILE_NGON;
        tsp.alphabet = talpha = 2 + fz_u8(f) % 200u;
    } else {
        tsp.profile = FKVF_PROFILE_QUAD;
        tsp.symbol_bits = 2u * (1u + fz_u8(f) % 16u);
        talpha = tsp.symbol_bits >= 32 ? 0 : 1u << tsp.symbol_bits;
    }
    for (uint32_t i = 0; i < N; i++) {
        uint32_t v = fz_u32(f);
        tok[i] = talpha ? v % talpha : v;
    }
    uint32_t align = fkvf_stream_spec_align(&tsp);
    FZ_CHECK(align >= 1);
    uint32_t cut = two_commits ? (N / 2) / align * align : N;
    if (tokens_on)
        FZ_CHECK(fkvf_writer_add_token_segment(w, &tsp, 0, tok, cut) == FKVF_OK);
    FZ_CHECK(fkvf_writer_meta_u64(w, "fuzz.n", N) == FKVF_OK);
    FZ_CHECK(fkvf_writer_meta_utf8(w, "fuzz.s", "a") == FKVF_OK);
    int rc, commits = 1;
    if (two_commits) {
        /* commit 1 holds the first `cut` positions when the token stream is
         * split; with archived positions that is often inconsistent (exact
         * rows missing, index length): the writer must refuse that commit
         * with FKVF_E_STATE and stay usable */
        if (!tokens_on || cut == N)
            FZ_CHECK(fkvf_writer_set_positions(w, N, A) == FKVF_OK);
        else
            FZ_CHECK(fkvf_writer_set_positions(w, cut, A && cut >= S + A ? A : 0) == FKVF_OK);
        rc = fkvf_writer_commit(w);
        if (rc != FKVF_OK && rc != FKVF_E_STATE)
            fprintf(stderr, "commit: %s\n", fkvf_writer_message(w));
        FZ_CHECK(rc == FKVF_OK || rc == FKVF_E_STATE);
        if (rc == FKVF_OK) {
            commits = 2;
            FZ_CHECK(fkvf_writer_meta_utf8(w, "fuzz.s", "second") == FKVF_OK);
        }
        if (tokens_on && cut < N)
            FZ_CHECK(fkvf_writer_add_token_segment(w, &tsp, cut, tok + cut, N - cut) ==
                     FKVF_OK);
    }
    FZ_CHECK(fkvf_writer_set_positions(w, N, A) == FKVF_OK);
    rc = fkvf_writer_finish(w);
    if (rc != FKVF_OK)
        fprintf(stderr, "finish: %s\n", fkvf_writer_message(w));
    FZ_CHECK(rc == FKVF_OK);

    /* read back */
    fkvf_reader *r = NULL;
    FZ_CHECK(fkvf_reader_open_memory(&r, mb.p, mb.n, FKVF_OPEN_STRICT, NULL) == FKVF_OK);
    fkvf_archive_info ai;
    FZ_CHECK(fkvf_reader_info(r, &ai) == FKVF_OK);
    FZ_CHECK(ai.n_positions == N && ai.n_archived == A && ai.torn_bytes == 0);
    FZ_CHECK(ai.n_commits == (uint64_t)commits);
    FZ_CHECK(fkvf_reader_verify(r) == FKVF_OK);
    fkvf_meta_entry me;
    FZ_CHECK(fkvf_reader_meta_find(r, "fuzz.s", &me) == FKVF_OK);
    FZ_CHECK(me.value_len == (commits == 2 ? 6u : 1u));
    /* exact rows and codes */
    uint8_t *one = malloc(rb), *f32 = malloc(row_elems * 4), *ref = malloc(row_elems * 4);
    FZ_CHECK(one && f32 && ref);
    fkvf_rvq *q = NULL;
    if (with_cb && A)
        FZ_CHECK(fkvf_rvq_from_tables_decode(&q, &cs, d.n_kv_heads, tables, tsize, NULL) ==
                 FKVF_OK);
    fkvf_rope rope = {d.rope_layout, d.rope_dims, d.rope_theta};
    for (uint32_t p = 0; p < N; p++) {
        int ex;
        FZ_CHECK(fkvf_reader_is_exact(r, p, &ex) == FKVF_OK);
        FZ_CHECK(ex == (p < S || p >= S + A));
        if (ex) {
            FZ_CHECK(fkvf_reader_restore(r, p, 1, d.dtype, one, rb) == FKVF_OK);
            FZ_CHECK(memcmp(one, rows + (size_t)p * rb, rb) == 0);
        } else {
            FZ_CHECK(fkvf_reader_restore(r, p, 1, FKVF_DTYPE_F32, f32, row_elems * 4) ==
                     FKVF_OK);
            FZ_CHECK(fkvf_rvq_decode(q, codes + (size_t)(p - S) * cpp, cpp, 1, 1, p,
                                     d.key_storage ? &rope : NULL, FKVF_DTYPE_F32, ref,
                                     row_elems * 4) == FKVF_OK);
            FZ_CHECK(memcmp(f32, ref, row_elems * 4) == 0);
        }
    }
    fkvf_rvq_free(q);
    free(one);
    free(f32);
    free(ref);
    /* streams: the index streams hold the codes, the token stream the ids */
    if (A && cpp) {
        uint32_t *sym = malloc(A * sizeof *sym);
        FZ_CHECK(sym);
        size_t j = 0;
        for (uint32_t l = 0; l < d.n_layers; l++)
            for (uint32_t h = 0; h < d.n_kv_heads; h++)
                for (unsigned kv = 0; kv < 2; kv++)
                    for (unsigned st = 0; st < (kv ? cs.v_stages : cs.k_stages); st++, j++) {
                        size_t si;
                        FZ_CHECK(fkvf_reader_stream_find(
                                     r, FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, l, h, kv, st),
                                     &si) == FKVF_OK);
                        FZ_CHECK(fkvf_reader_stream_read(r, si, 0, sym, A) == FKVF_OK);
                        for (uint32_t t = 0; t < A; t++)
                            FZ_CHECK(sym[t] == codes[(size_t)t * cpp + j]);
                    }
        free(sym);
    }
    if (tokens_on) {
        size_t si;
        uint32_t *sym = malloc(N * sizeof *sym);
        FZ_CHECK(sym);
        FZ_CHECK(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &si) == FKVF_OK);
        FZ_CHECK(fkvf_reader_stream_read(r, si, 0, sym, N) == FKVF_OK);
        FZ_CHECK(memcmp(sym, tok, N * sizeof *sym) == 0);
        free(sym);
    }
    decode_all(r, f, 1);
    fkvf_reader_free(r);
    free(tok);
    free(codes);
    free(tables);
    free(rows);
    fkvf_writer_free(w);
    free(mb.p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t magic[4] = {0x89, 'F', 'K', 'V'};
    static const uint8_t fixme[4] = {0x88, 'F', 'K', 'V'};
    int fix = size >= 4 && memcmp(data, fixme, 4) == 0;
    if ((size >= 4 && memcmp(data, magic, 4) == 0) || fix) {
        uint8_t *copy = NULL;
        if (fix) {
            if (!(copy = malloc(size)))
                return 0;
            memcpy(copy, data, size);
            copy[0] = 0x89;
            fix_checksums(copy, size);
            data = copy;
        }
        /* the selection parameters come from the file's last bytes */
        fz f = {data + size - (size < 16 ? size : 16), size < 16 ? size : 16};
        fkvf_reader *r = NULL;
        if (fkvf_reader_open_memory(&r, data, size, 0, NULL) == FKVF_OK)
            decode_all(r, &f, 0);
        fkvf_reader_free(r);
        free(copy);
        return 0;
    }
    fz f = {data, size};
    recipe(&f);
    return 0;
}
