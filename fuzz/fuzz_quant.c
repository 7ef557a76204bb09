/* Fuzz target: the RVQ quantizer (spec 13) with input-chosen shapes, tables
 * and rows. Properties checked:
 *  - fkvf_rvq_from_tables accepts finite tables of a valid shape and gives
 *    them back bit-identical (fkvf_rvq_tables); the decode-only handle
 *    decodes identically;
 *  - every code of fkvf_rvq_encode is below k; greedy codes are, stage by
 *    stage, the exact nearest centroid of the binary32 residual (binary64
 *    distance, ties to the smallest index) when values are small enough
 *    that nothing overflows;
 *  - beam search's final error is never larger than greedy's;
 *  - fkvf_rvq_decode is the binary32 sum of the chosen centroids in stage
 *    order (spec 13.6), keys then rotated to their position when a rope is
 *    given (fkvf_rope_apply_f32); a code >= k is FKVF_E_RANGE;
 *  - training on a few input-derived rows succeeds, is deterministic and
 *    its codes are in range.
 * Shapes are tiny (k 16 or 32, dims <= 8, <= 16 rows) so a run is fast. */
#include <math.h>

#include "fuzz_util.h"
#include "fkvf.h"

#define MAXR 16

typedef struct shape_ctx {
    fkvf_codebook_shape cs;
    uint32_t heads; /* heads of the rows */
    size_t row_elems, cpp;
} shape_ctx;

/* a small finite value: multiples of 1/64 in [-4, 4) (exact in f16) */
static float tame(fz *f) { return (float)((int8_t)fz_u8(f)) / 32.0f; }

static void store_elem(fkvf_dtype dt, uint8_t *p, float v)
{
    if (dt == FKVF_DTYPE_F32) {
        memcpy(p, &v, 4);
    } else {
        uint16_t h = dt == FKVF_DTYPE_F16 ? fkvf_f32_to_f16(v) : fkvf_f32_to_bf16(v);
        p[0] = (uint8_t)h;
        p[1] = (uint8_t)(h >> 8);
    }
}

static float load_elem(fkvf_dtype dt, const uint8_t *p)
{
    if (dt == FKVF_DTYPE_F32) {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    uint16_t h = (uint16_t)(p[0] | p[1] << 8);
    return dt == FKVF_DTYPE_F16 ? fkvf_f16_to_f32(h) : fkvf_bf16_to_f32(h);
}

/* offset (elements) of vector (l, h, kv) in a row of spec 14.2 */
static size_t vec_off(const shape_ctx *s, uint32_t l, uint32_t h, unsigned kv)
{
    size_t per_layer = (size_t)s->heads * (s->cs.key_dim + s->cs.value_dim);
    size_t o = l * per_layer;
    if (kv == 0)
        return o + (size_t)h * s->cs.key_dim;
    return o + (size_t)s->heads * s->cs.key_dim + (size_t)h * s->cs.value_dim;
}

static size_t code_idx(const shape_ctx *s, uint32_t l, uint32_t h, unsigned kv, unsigned st)
{
    /* spec 11.2 (P(l) with a layer table): the order the codes follow */
    uint64_t j = fkvf_index_stream_ord(&s->cs, s->heads, l, h, kv, st);
    FZ_CHECK(j != UINT64_MAX);
    return (size_t)j;
}

/* binary32 decoding of one vector from codes (stage order, +0.0 start) */
static void ref_decode(const fkvf_rvq *q, const shape_ctx *s, const uint16_t *codes, uint32_t l,
                       uint32_t h, unsigned kv, float *out)
{
    unsigned ns = kv == 0 ? fkvf_layer_k_stages(&s->cs, l) : fkvf_layer_v_stages(&s->cs, l);
    uint32_t dim = kv == 0 ? s->cs.key_dim : s->cs.value_dim;
    for (uint32_t d = 0; d < dim; d++)
        out[d] = 0.0f;
    for (unsigned st = 0; st < ns; st++) {
        const float *c = fkvf_rvq_centroids(q, l, h, kv, st);
        FZ_CHECK(c);
        uint16_t code = codes[code_idx(s, l, h, kv, st)];
        for (uint32_t d = 0; d < dim; d++)
            out[d] += c[(size_t)code * dim + d];
    }
}

static double dist64(const float *x, const float *c, uint32_t dim)
{
    double acc = 0;
    for (uint32_t d = 0; d < dim; d++) {
        double e = (double)x[d] - (double)c[d];
        acc += e * e;
    }
    return acc;
}

static void check_codebook(fz *f)
{
    shape_ctx s;
    memset(&s, 0, sizeof s);
    uint8_t m = fz_u8(f);
    int tame_vals = !(m & 1);
    s.cs.n_layers = 1 + (m >> 1) % 2;
    s.cs.pooled = (m >> 2) & 1;
    s.heads = 1 + (m >> 3) % 2;
    s.cs.n_heads = s.cs.pooled ? 1 : s.heads;
    s.cs.dtype = (m >> 4) & 1 ? FKVF_DTYPE_F32 : FKVF_DTYPE_F16;
    s.cs.k = (m >> 5) & 1 ? 32 : 16;
    uint8_t m2 = fz_u8(f);
    s.cs.k_stages = m2 % 4;
    s.cs.v_stages = (m2 >> 2) % 4;
    uint8_t m3 = fz_u8(f);
    s.cs.key_dim = 1 + m3 % 8;
    s.cs.value_dim = 1 + (m3 >> 3) % 8;
    /* stage counts per layer (format 1.1, spec 13.1): the header's are the maxima */
    uint8_t lst[2 * 4];
    if (m3 >> 6) {
        s.cs.n_layers = 1 + (m3 >> 6); /* 2, 3 or 4 layers */
        unsigned mk = 0, mv = 0;
        for (uint32_t l = 0; l < s.cs.n_layers; l++) {
            uint8_t b = fz_u8(f);
            lst[2 * l] = b % 4;
            lst[2 * l + 1] = (b >> 2) % 4;
            mk = lst[2 * l] > mk ? lst[2 * l] : mk;
            mv = lst[2 * l + 1] > mv ? lst[2 * l + 1] : mv;
        }
        s.cs.k_stages = (uint8_t)mk;
        s.cs.v_stages = (uint8_t)mv;
        s.cs.layer_stages = lst;
    }
    fkvf_dtype rdt = (fkvf_dtype)(1 + (m2 >> 4) % 3);
    uint64_t cbk = fkvf_codebook_size(&s.cs);
    FZ_CHECK(cbk >= 64);
    size_t tsize = (size_t)(cbk - fkvf_codebook_tables_offset(&s.cs));
    size_t es = s.cs.dtype == FKVF_DTYPE_F32 ? 4 : 2;
    uint8_t *tables = malloc(tsize + 1);
    FZ_CHECK(tables);
    if (tame_vals) {
        for (size_t i = 0; i < tsize / es; i++)
            store_elem(s.cs.dtype, tables + i * es, tame(f));
    } else {
        fz_fill(f, tables, tsize);
    }
    fkvf_rvq *q = NULL, *qd = NULL;
    int rc = fkvf_rvq_from_tables(&q, &s.cs, s.heads, tables, tsize, NULL);
    if (tame_vals)
        FZ_CHECK(rc == FKVF_OK);
    if (rc != FKVF_OK) {
        FZ_CHECK(rc == FKVF_E_INVALID_ARG && !q);
        free(tables);
        return;
    }
    FZ_CHECK(fkvf_rvq_from_tables_decode(&qd, &s.cs, s.heads, tables, tsize, NULL) == FKVF_OK);
    /* tables come back bit-identical */
    FZ_CHECK(fkvf_rvq_tables_size(q) == tsize);
    uint8_t *back = malloc(tsize + 1);
    FZ_CHECK(back);
    FZ_CHECK(fkvf_rvq_tables(q, back, tsize) == FKVF_OK && memcmp(back, tables, tsize) == 0);
    free(back);
    fkvf_codebook_shape got;
    uint32_t gh;
    fkvf_rvq_shape(q, &got, &gh);
    FZ_CHECK(gh == s.heads && got.k == s.cs.k && got.k_stages == s.cs.k_stages &&
             got.v_stages == s.cs.v_stages && got.key_dim == s.cs.key_dim);

    s.cpp = fkvf_rvq_codes_per_position(q);
    FZ_CHECK(s.cpp == fkvf_index_stream_count(&s.cs, s.heads));
    /* the handle keeps a table only when the layers' counts differ */
    if (got.layer_stages)
        FZ_CHECK(s.cs.layer_stages &&
                 !memcmp(got.layer_stages, s.cs.layer_stages, 2 * (size_t)s.cs.n_layers));
    else if (s.cs.layer_stages)
        for (uint32_t l = 1; l < s.cs.n_layers; l++)
            FZ_CHECK(lst[2 * l] == lst[0] && lst[2 * l + 1] == lst[1]);
    s.row_elems = (size_t)s.cs.n_layers * s.heads * (s.cs.key_dim + s.cs.value_dim);
    size_t es_r = rdt == FKVF_DTYPE_F32 ? 4 : 2;
    size_t n = fz_range(f, 1, MAXR);
    uint8_t *rows = malloc(n * s.row_elems * es_r);
    FZ_CHECK(rows);
    if (tame_vals) {
        for (size_t i = 0; i < n * s.row_elems; i++)
            store_elem(rdt, rows + i * es_r, tame(f));
    } else {
        fz_fill(f, rows, n * s.row_elems * es_r);
    }
    fkvf_rows rw = {rows, n, rdt, 0};
    uint16_t *codes = calloc(n * s.cpp + 1, sizeof *codes);
    uint16_t *bcodes = calloc(n * s.cpp + 1, sizeof *bcodes);
    FZ_CHECK(codes && bcodes);
    FZ_CHECK(fkvf_rvq_encode(q, &rw, NULL, 1, codes, s.cpp, 1) == FKVF_OK);
    FZ_CHECK(fkvf_rvq_encode(qd, &rw, NULL, 1, bcodes, s.cpp, 1) == FKVF_E_STATE);
    for (size_t i = 0; i < n * s.cpp; i++)
        FZ_CHECK(codes[i] < s.cs.k);
    unsigned beam = 2 + fz_u8(f) % 7;
    FZ_CHECK(fkvf_rvq_encode(q, &rw, NULL, beam, bcodes, s.cpp, 1) == FKVF_OK);
    for (size_t i = 0; i < n * s.cpp; i++)
        FZ_CHECK(bcodes[i] < s.cs.k);

    float x[8], res[8], dg[8], db[8];
    for (size_t i = 0; i < n && tame_vals; i++)
        for (uint32_t l = 0; l < s.cs.n_layers; l++)
            for (uint32_t h = 0; h < s.heads; h++)
                for (unsigned kv = 0; kv < 2; kv++) {
                    uint32_t dim = kv == 0 ? s.cs.key_dim : s.cs.value_dim;
                    unsigned ns = kv == 0 ? fkvf_layer_k_stages(&s.cs, l)
                                          : fkvf_layer_v_stages(&s.cs, l);
                    const uint8_t *src = rows + (i * s.row_elems + vec_off(&s, l, h, kv)) * es_r;
                    for (uint32_t d = 0; d < dim; d++)
                        res[d] = x[d] = load_elem(rdt, src + d * es_r);
                    /* greedy: each stage the exact nearest centroid */
                    for (unsigned st = 0; st < ns; st++) {
                        const float *c = fkvf_rvq_centroids(q, l, h, kv, st);
                        uint32_t best = 0;
                        double bd = INFINITY;
                        for (uint32_t j = 0; j < s.cs.k; j++) {
                            double dj = dist64(res, c + (size_t)j * dim, dim);
                            if (dj < bd) {
                                bd = dj;
                                best = j;
                            }
                        }
                        uint16_t got_c = codes[i * s.cpp + code_idx(&s, l, h, kv, st)];
                        FZ_CHECK(dist64(res, c + (size_t)got_c * dim, dim) == bd);
                        FZ_CHECK(got_c == best);
                        for (uint32_t d = 0; d < dim; d++)
                            res[d] -= c[(size_t)got_c * dim + d];
                    }
                    /* beam is never worse than greedy */
                    ref_decode(q, &s, codes + i * s.cpp, l, h, kv, dg);
                    ref_decode(q, &s, bcodes + i * s.cpp, l, h, kv, db);
                    FZ_CHECK(dist64(x, db, dim) <= dist64(x, dg, dim));
                }

    /* an encoder metric (spec 13.8): built from the input, SPD (B B^T + c I)
     * or raw bytes; set_metric takes it exactly when every matrix passes
     * fkvf_metric_matrix_check; then the first stage picks the centroid of
     * least e^T M e (within the rounding of the binary32 transform), and the
     * identity metric changes no code */
    {
        uint8_t mm = fz_u8(f);
        int raw = mm & 1, ident = (mm >> 1) & 1;
        size_t n_tabs = (size_t)s.cs.n_layers * s.cs.n_heads;
        float *mt[2] = {NULL, NULL};
        int all_ok = 1;
        for (unsigned kv = 0; kv < 2; kv++) {
            uint32_t dim = kv ? s.cs.value_dim : s.cs.key_dim;
            size_t nn = (size_t)dim * dim;
            if (!((mm >> (2 + kv)) & 1) && kv == 1 && mt[0])
                continue; /* keys only */
            mt[kv] = malloc(n_tabs * nn * sizeof(float) + 1);
            FZ_CHECK(mt[kv]);
            for (size_t t = 0; t < n_tabs; t++) {
                float *a = mt[kv] + t * nn;
                if (raw) {
                    fz_fill(f, (uint8_t *)a, nn * sizeof(float));
                } else {
                    float b[64];
                    for (size_t i = 0; i < nn; i++)
                        b[i] = ident ? 0.0f : tame(f);
                    for (uint32_t i = 0; i < dim; i++)
                        for (uint32_t j = i; j < dim; j++) {
                            double v = i == j ? (ident ? 1.0 : 0.25) : 0.0;
                            for (uint32_t p = 0; p < dim; p++)
                                v += (double)b[i * dim + p] * b[j * dim + p];
                            a[i * dim + j] = a[j * dim + i] = (float)v;
                        }
                }
                all_ok &= fkvf_metric_matrix_check(a, dim, NULL) == 0;
            }
        }
        fkvf_rvq_metric met = {mt[0], mt[1]};
        rc = fkvf_rvq_set_metric(q, &met);
        /* raw bytes (of the metric or the tables) may pass the check and
         * still be refused: U c beyond binary32 for huge values */
        FZ_CHECK(all_ok ? rc == FKVF_OK || ((raw || !tame_vals) && rc == FKVF_E_INVALID_ARG)
                        : rc == FKVF_E_INVALID_ARG);
        FZ_CHECK(fkvf_rvq_get_metric(q, NULL) == (rc == FKVF_OK));
        if (rc == FKVF_OK) {
            uint16_t *mc = calloc(n * s.cpp + 1, sizeof *mc);
            FZ_CHECK(mc);
            FZ_CHECK(fkvf_rvq_encode(q, &rw, NULL, 1 + (mm >> 4) % 3, mc, s.cpp, 1) == FKVF_OK);
            for (size_t i = 0; i < n * s.cpp; i++)
                FZ_CHECK(mc[i] < s.cs.k);
            /* (raw: the matrices are the input's bytes, whatever ident says;
             * they may be far too ill-conditioned for the tolerance below) */
            if (ident && !raw && tame_vals && (mm >> 4) % 3 == 0)
                FZ_CHECK(!memcmp(mc, codes, n * s.cpp * sizeof *mc));
            for (size_t i = 0; i < n && tame_vals && !ident && !raw; i++)
                for (uint32_t l = 0; l < s.cs.n_layers; l++)
                    for (uint32_t h = 0; h < s.heads; h++)
                        for (unsigned kv = 0; kv < 2; kv++) {
                            uint32_t dim = kv == 0 ? s.cs.key_dim : s.cs.value_dim;
                            unsigned ns = kv == 0 ? fkvf_layer_k_stages(&s.cs, l)
                                                  : fkvf_layer_v_stages(&s.cs, l);
                            if (!ns || (mm >> 4) % 3 != 0)
                                continue;
                            const float *a = mt[kv] ? mt[kv] + ((size_t)l * s.cs.n_heads +
                                                                (s.cs.pooled ? 0 : h)) *
                                                                   dim * dim
                                                    : NULL;
                            const uint8_t *src =
                                rows + (i * s.row_elems + vec_off(&s, l, h, kv)) * es_r;
                            for (uint32_t d = 0; d < dim; d++)
                                x[d] = load_elem(rdt, src + d * es_r);
                            const float *c = fkvf_rvq_centroids(q, l, h, kv, 0);
                            double best = INFINITY, gotd = 0;
                            uint16_t got_c = mc[i * s.cpp + code_idx(&s, l, h, kv, 0)];
                            for (uint32_t j = 0; j < s.cs.k; j++) {
                                double e[8], dj = 0;
                                for (uint32_t d = 0; d < dim; d++)
                                    e[d] = (double)x[d] - c[(size_t)j * dim + d];
                                for (uint32_t u = 0; u < dim; u++)
                                    for (uint32_t v = 0; v < dim; v++)
                                        dj += e[u] * (a ? (double)a[u * dim + v] : u == v) * e[v];
                                best = dj < best ? dj : best;
                                if (j == got_c)
                                    gotd = dj;
                            }
                            FZ_CHECK(gotd <= best * (1 + 1e-3) + 1e-3);
                        }
            free(mc);
        }
        FZ_CHECK(fkvf_rvq_set_metric(q, NULL) == FKVF_OK);
        free(mt[0]);
        free(mt[1]);
    }

    /* decode input-chosen codes (some may be >= k) */
    uint16_t *dcodes = calloc(n * s.cpp + 1, sizeof *dcodes);
    FZ_CHECK(dcodes);
    int over = 0;
    uint8_t cm = fz_u8(f);
    for (size_t i = 0; i < n * s.cpp; i++) {
        uint16_t v = fz_u16(f);
        dcodes[i] = (cm & 1) ? v : (uint16_t)(v % s.cs.k);
        over |= dcodes[i] >= s.cs.k;
    }
    fkvf_rope rope = {(uint8_t)(1 + ((cm >> 1) & 1)), 0, 10000.0};
    rope.rope_dims = 2 * (1 + (uint32_t)fz_u8(f) % 4);
    int use_rope = (cm >> 2) & 1 && rope.rope_dims <= s.cs.key_dim;
    uint64_t first = (cm >> 3) & 1 ? fz_u64(f) >> 8 : fz_u8(f);
    size_t obytes = n * s.row_elems * 4;
    float *out = malloc(obytes), *out2 = malloc(obytes);
    FZ_CHECK(out && out2);
    rc = fkvf_rvq_decode(q, dcodes, s.cpp, 1, n, first, use_rope ? &rope : NULL, FKVF_DTYPE_F32,
                         out, obytes);
    if (over) {
        FZ_CHECK(rc == FKVF_E_RANGE);
    } else {
        FZ_CHECK(rc == FKVF_OK);
        FZ_CHECK(fkvf_rvq_decode(qd, dcodes, s.cpp, 1, n, first, use_rope ? &rope : NULL,
                                 FKVF_DTYPE_F32, out2, obytes) == FKVF_OK);
        FZ_CHECK(memcmp(out, out2, obytes) == 0);
        FZ_CHECK(fkvf_rvq_decode(q, dcodes, s.cpp, 1, n, first, NULL, FKVF_DTYPE_F32, out2,
                                 obytes - 1) != FKVF_OK);
        for (size_t i = 0; i < n; i++)
            for (uint32_t l = 0; l < s.cs.n_layers; l++)
                for (uint32_t h = 0; h < s.heads; h++)
                    for (unsigned kv = 0; kv < 2; kv++) {
                        uint32_t dim = kv == 0 ? s.cs.key_dim : s.cs.value_dim;
                        ref_decode(q, &s, dcodes + i * s.cpp, l, h, kv, dg);
                        if (kv == 0 && use_rope)
                            FZ_CHECK(fkvf_rope_apply_f32(&rope, first + i, 0, dg, dim) ==
                                     FKVF_OK);
                        FZ_CHECK(memcmp(dg, out + i * s.row_elems + vec_off(&s, l, h, kv),
                                        dim * sizeof(float)) == 0);
                    }
    }
    free(out);
    free(out2);
    free(dcodes);
    free(codes);
    free(bcodes);
    free(rows);
    fkvf_rvq_free(q);
    fkvf_rvq_free(qd);
    free(tables);
}

static void check_train(fz *f)
{
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    uint8_t m = fz_u8(f);
    p.n_layers = 1;
    p.n_kv_heads = 1 + m % 2;
    p.key_dim = 1 + (m >> 1) % 4;
    p.value_dim = 1 + (m >> 3) % 4;
    p.k = 16;
    uint8_t m2 = fz_u8(f);
    p.k_stages = (uint8_t)(m2 % 3);
    p.v_stages = (uint8_t)((m2 >> 2) % 3);
    p.pooled = (m2 >> 4) & 1;
    p.table_dtype = (m2 >> 5) & 1 ? FKVF_DTYPE_F32 : FKVF_DTYPE_F16;
    p.max_iters = 1 + (m >> 5) % 3;
    p.samples_per_centroid = 1 + fz_u8(f) % 4;
    p.seed = fz_u64(f);
    size_t row_elems = (size_t)p.n_kv_heads * (p.key_dim + p.value_dim);
    size_t n = fz_range(f, 1, 48);
    uint8_t *rows = malloc(n * row_elems * 2);
    FZ_CHECK(rows);
    for (size_t i = 0; i < n * row_elems; i++)
        store_elem(FKVF_DTYPE_F16, rows + 2 * i, tame(f));
    fkvf_rows rw = {rows, n, FKVF_DTYPE_F16, 0};
    fkvf_rvq *a = NULL, *b = NULL;
    FZ_CHECK(fkvf_rvq_train(&a, &p, &rw, 1, NULL) == FKVF_OK);
    FZ_CHECK(fkvf_rvq_train(&b, &p, &rw, 1, NULL) == FKVF_OK);
    size_t ts = fkvf_rvq_tables_size(a);
    FZ_CHECK(ts == fkvf_rvq_tables_size(b));
    uint8_t *ta = malloc(ts + 1), *tb = malloc(ts + 1);
    FZ_CHECK(ta && tb);
    FZ_CHECK(fkvf_rvq_tables(a, ta, ts) == FKVF_OK && fkvf_rvq_tables(b, tb, ts) == FKVF_OK);
    FZ_CHECK(memcmp(ta, tb, ts) == 0);
    size_t cpp = fkvf_rvq_codes_per_position(a);
    uint16_t *codes = calloc(n * cpp + 1, sizeof *codes);
    FZ_CHECK(codes);
    FZ_CHECK(fkvf_rvq_encode(a, &rw, NULL, 1, codes, cpp, 1) == FKVF_OK);
    for (size_t i = 0; i < n * cpp; i++)
        FZ_CHECK(codes[i] < 16);
    free(codes);
    free(ta);
    free(tb);
    fkvf_rvq_free(a);
    fkvf_rvq_free(b);
    free(rows);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    uint8_t sel = fz_u8(&f);
    if (sel % 8 == 7)
        check_train(&f);
    else
        check_codebook(&f);
    return 0;
}
