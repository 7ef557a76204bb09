/* The encoder's search gives today's indices (issue 16): fkvf_rvq_encode
 * against (a) a plain binary64 exhaustive argmin written here (greedy: the
 * exact nearest centroid of the binary32 residual, sum over d in order,
 * ties to the smallest index) and (b) the encoder before the blocked kernel
 * (tests/encode_ref.c: greedy and beam, RoPE, pooled, GQA). Data: random,
 * clustered, duplicated centroids, exact ties between two centroids, vectors
 * equal to a centroid, zero vectors, large and tiny magnitudes; k = 16 ..
 * 1024, dims 1 .. 256 (odd ones too), f16 / bf16 / f32 rows. Also: the
 * kernel on rows scores as fkvfq_scores4 bit for bit, and the search
 * layout (panels, norms, cmax, duplicates) equals a straightforward
 * reference. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "encode_ref.h"
#include "fkvf.h"
#include "quant/quant.h"
#include "testutil.h"

static double urand(tu_rng *r) { return (double)(tu_next(r) >> 11) * 0x1p-52 - 1.0; }
static double nrand(tu_rng *r)
{
    return (urand(r) + urand(r) + urand(r) + urand(r)) * 0.8660254037844386;
}

enum { D_RANDOM, D_CLUSTER, D_DUPS, D_TIES, D_EQUAL, D_ZERO, D_LARGE, D_TINY, D_KINDS };
static const char *kind_name[D_KINDS] = {"random", "clustered", "duplicates", "ties",
                                         "equal", "zero", "large", "tiny"};

/* magnitude of a data kind (so that f16 neither overflows nor flushes) */
static double kind_scale(int kind, fkvf_dtype dt)
{
    if (kind == D_LARGE)
        return dt == FKVF_DTYPE_F32 ? 1e15 : 1000.0;
    if (kind == D_TINY)
        return dt == FKVF_DTYPE_F32 ? 1e-15 : 1e-3;
    return 1.0;
}

/* centroid values exact in every table dtype (multiples of 1/8 up to 8,
 * times a power of two) */
static float grid(tu_rng *r, double scale)
{
    return (float)(ldexp((double)((int)tu_below(r, 129) - 64), -3) * scale);
}

typedef struct shape_case {
    uint32_t layers, heads, kv_heads, kdim, vdim, k;
    uint8_t ks, vs, pooled;
} shape_case;

/* f32 CBK1 tables for a case, host values; stage s of a table set scaled
 * by 2^-s */
static float *make_tables(const shape_case *c, int kind, fkvf_dtype dt, tu_rng *r, size_t *n)
{
    size_t tabs = (size_t)c->layers * (c->pooled ? 1 : c->heads);
    size_t per = (size_t)c->k * ((size_t)c->ks * c->kdim + (size_t)c->vs * c->vdim);
    float *t = malloc(tabs * per * sizeof(float));
    ck_assert_ptr_nonnull(t);
    double sc = kind_scale(kind, dt);
    size_t o = 0;
    for (size_t tab = 0; tab < tabs; tab++)
        for (unsigned kv = 0; kv < 2; kv++) {
            unsigned ns = kv ? c->vs : c->ks;
            uint32_t dim = kv ? c->vdim : c->kdim;
            for (unsigned s = 0; s < ns; s++) {
                double ss = ldexp(sc, -(int)s);
                for (uint32_t ci = 0; ci < c->k; ci++) {
                    float *row = t + o + (size_t)ci * dim;
                    for (uint32_t d = 0; d < dim; d++)
                        row[d] = grid(r, ss);
                    if (kind == D_DUPS && ci > 0 && tu_below(r, 3) == 0)
                        memcpy(row, t + o + (size_t)tu_below(r, ci) * dim, dim * sizeof(float));
                    if (kind == D_ZERO && tu_below(r, 2))
                        memset(row, 0, dim * sizeof(float));
                    if (kind == D_TIES && (ci & 1)) {
                        /* rows ci-1 and ci mirror around a centre m: m +- v,
                         * so the vector m is at exactly the same distance */
                        float *prev = row - dim;
                        for (uint32_t d = 0; d < dim; d++) {
                            float m = grid(r, ss), v = (float)(ldexp(1, -3) * ss);
                            prev[d] = m + v;
                            row[d] = m - v;
                        }
                    }
                }
                o += (size_t)c->k * dim;
            }
        }
    *n = o;
    return t;
}

/* n rows (spec 14.2) of dtype dt, little-endian elements (fkvf_rows), drawn
 * near the stage-0 centroids of the tables (host values; or copies of them,
 * or their tie centres, or zeros) */
static void *make_rows(const shape_case *c, int kind, fkvf_dtype dt, const float *tables,
                       size_t n, tu_rng *r)
{
    size_t H = c->kv_heads, es = dt == FKVF_DTYPE_F32 ? 4 : 2;
    size_t re = (size_t)c->layers * H * (c->kdim + c->vdim);
    uint8_t *out = malloc(n * re * es);
    ck_assert_ptr_nonnull(out);
    size_t per = (size_t)c->k * ((size_t)c->ks * c->kdim + (size_t)c->vs * c->vdim);
    double sc = kind_scale(kind, dt);
    for (size_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < c->layers; l++)
            for (size_t h = 0; h < H; h++)
                for (unsigned kv = 0; kv < 2; kv++) {
                    uint32_t dim = kv ? c->vdim : c->kdim;
                    size_t tab = (size_t)l * (c->pooled ? 1 : c->heads) + (c->pooled ? 0 : h);
                    const float *t0 = tables + tab * per +
                                      (kv ? (size_t)c->ks * c->k * c->kdim : 0);
                    if (kv ? !c->vs : !c->ks)
                        t0 = NULL;
                    size_t eo = (size_t)l * H * (c->kdim + c->vdim) +
                                (kv ? H * c->kdim + h * c->vdim : h * c->kdim);
                    const float *cen = t0 ? t0 + (size_t)tu_below(r, c->k) * dim : NULL;
                    const float *cen2 = cen && ((cen - t0) / dim) % 2 == 0 ? cen + dim : NULL;
                    int mode = tu_below(r, 4);
                    for (uint32_t d = 0; d < dim; d++) {
                        double v;
                        if (kind == D_RANDOM || !cen)
                            v = nrand(r) * 4 * sc;
                        else if (kind == D_ZERO && mode == 0)
                            v = 0;
                        else if (kind == D_TIES && cen2 && mode != 0)
                            v = 0.5 * ((double)cen[d] + cen2[d]); /* the centre: exact */
                        else if ((kind == D_EQUAL || kind == D_DUPS) && mode != 0)
                            v = cen[d];
                        else
                            v = cen[d] + nrand(r) * 0.3 * sc;
                        float f = (float)v;
                        uint8_t *p = out + (i * re + eo + d) * es;
                        if (dt == FKVF_DTYPE_F32) {
                            memcpy(p, &f, 4);
                        } else {
                            uint16_t hbits = dt == FKVF_DTYPE_F16 ? fkvf_f32_to_f16(f)
                                                                  : fkvf_f32_to_bf16(f);
                            memcpy(p, &hbits, 2);
                        }
                    }
                }
    tu_le_swap(out, n * re, es);
    return out;
}

/* the plain reference: greedy exhaustive argmin in binary64 (no RoPE) of
 * little-endian rows */
static void plain_greedy(const fkvf_rvq *q, const shape_case *c, fkvf_dtype dt,
                         const void *rows, size_t n, uint16_t *codes)
{
    size_t H = c->kv_heads, es = dt == FKVF_DTYPE_F32 ? 4 : 2;
    size_t re = (size_t)c->layers * H * (c->kdim + c->vdim), m = (size_t)c->ks + c->vs;
    float x[256];
    for (size_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < c->layers; l++)
            for (size_t h = 0; h < H; h++)
                for (unsigned kv = 0; kv < 2; kv++) {
                    uint32_t dim = kv ? c->vdim : c->kdim;
                    unsigned ns = kv ? c->vs : c->ks;
                    size_t eo = (size_t)l * H * (c->kdim + c->vdim) +
                                (kv ? H * c->kdim + h * c->vdim : h * c->kdim);
                    const uint8_t *p = (const uint8_t *)rows + (i * re + eo) * es;
                    for (uint32_t d = 0; d < dim; d++) {
                        if (dt == FKVF_DTYPE_F32) {
                            x[d] = tu_ldf32le(p + 4 * d);
                        } else {
                            uint16_t b = tu_ld16le(p + 2 * d);
                            x[d] = dt == FKVF_DTYPE_F16 ? fkvf_f16_to_f32(b) : fkvf_bf16_to_f32(b);
                        }
                    }
                    for (unsigned s = 0; s < ns; s++) {
                        const float *t = fkvf_rvq_centroids(q, l, (uint32_t)h, kv, s);
                        uint32_t best = 0;
                        double bd = 0;
                        for (uint32_t ci = 0; ci < c->k; ci++) {
                            double e = 0;
                            for (uint32_t d = 0; d < dim; d++) {
                                double df = (double)x[d] - t[(size_t)ci * dim + d];
                                e += df * df;
                            }
                            if (ci == 0 || e < bd) {
                                bd = e;
                                best = ci;
                            }
                        }
                        codes[i * (c->layers * H * m) + (l * H + h) * m + (kv ? c->ks : 0) + s] =
                            (uint16_t)best;
                        for (uint32_t d = 0; d < dim; d++)
                            x[d] -= t[(size_t)best * dim + d];
                    }
                }
}

static const shape_case shapes[] = {
    /* layers heads kv_heads kdim vdim k ks vs pooled */
    {2, 3, 3, 64, 64, 256, 3, 2, 0},   /* GPT-2-like, small */
    {1, 2, 2, 1, 3, 16, 2, 1, 0},      /* dims 1 and 3, k = 16 */
    {1, 1, 1, 7, 5, 32, 2, 2, 0},      /* odd dims */
    {1, 1, 4, 65, 33, 64, 2, 1, 1},    /* pooled: one table set for 4 KV heads */
    {1, 2, 2, 256, 17, 16, 1, 1, 0},   /* dim 256 */
    {1, 1, 1, 24, 8, 1024, 1, 1, 0},   /* k = 1024 */
    {1, 1, 1, 16, 16, 64, 0, 2, 0},    /* values only */
};

static void run_case(const shape_case *c, int kind, fkvf_dtype dt, size_t n, uint64_t seed)
{
    tu_rng r = {seed};
    size_t nt;
    float *tables = make_tables(c, kind, dt, &r, &nt);
    fkvf_codebook_shape sh = {c->layers, c->pooled ? 1 : c->heads, c->kdim, c->vdim, c->k,
                              c->ks, c->vs, FKVF_DTYPE_F32, c->pooled, NULL};
    /* the library takes the tables as little-endian bytes */
    float *tle = tu_le_f32_copy(tables, nt);
    fkvf_rvq *q;
    ck_assert_int_eq(fkvf_rvq_from_tables(&q, &sh, c->kv_heads, tle, nt * 4, NULL), FKVF_OK);
    void *rows = make_rows(c, kind, dt, tables, n, &r);
    size_t nc = fkvf_rvq_codes_per_position(q);
    uint16_t *a = malloc(n * nc * 2), *b = malloc(n * nc * 2);
    ck_assert(a && b);
    /* the same tables rounded to f16 (when they fit: inf is no codebook): a
     * handle of them read in place (fkvf_rvq_from_tables16_encode) must give
     * the codes of a handle of their binary32 widening in every case below */
    fkvf_rvq *w32 = NULL, *w16 = NULL;
    uint16_t *t16 = fkvfq_decode16_available() ? malloc(nt * 2) : NULL;
    int fits16 = t16 != NULL;
    if (t16) {
        ck_assert_int_eq(fkvf_convert(FKVF_DTYPE_F16, t16, FKVF_DTYPE_F32, tle, nt), FKVF_OK);
        for (size_t i = 0; i < nt; i++)
            fits16 &= (tu_ld16le(&t16[i]) & 0x7C00u) != 0x7C00u;
    }
    if (fits16) {
        fkvf_codebook_shape s16 = sh;
        s16.dtype = FKVF_DTYPE_F16;
        ck_assert_int_eq(fkvf_rvq_from_tables(&w32, &s16, c->kv_heads, t16, nt * 2, NULL), FKVF_OK);
        ck_assert_int_eq(fkvf_rvq_from_tables16_encode(&w16, &s16, c->kv_heads, t16, nt * 2, NULL),
                         FKVF_OK);
    }
    fkvf_rows rw = {rows, n, dt, 17};
    const fkvf_rope rope = {2, c->kdim & ~1u, 10000.0};
    const unsigned beams[] = {1, 3, 8};
    for (int ri = 0; ri < 2; ri++) {
        const fkvf_rope *kr = ri && c->kdim >= 2 ? &rope : NULL;
        if (ri && !kr)
            continue;
        for (size_t bi = 0; bi < sizeof beams / sizeof *beams; bi++) {
            memset(a, 0xAA, n * nc * 2);
            memset(b, 0x55, n * nc * 2);
            ck_assert_int_eq(fkvf_rvq_encode(q, &rw, kr, beams[bi], a, nc, 1), FKVF_OK);
            ck_assert_int_eq(encode_ref(q, &rw, kr, beams[bi], b, nc, 1), FKVF_OK);
            for (size_t i = 0; i < n * nc; i++)
                EXPECTF(a[i] == b[i],
                        "%s data, k=%u, dims %u/%u, dtype %d, rope %d, beam %u: code %zu of "
                        "position %zu is %u, the reference encoder gives %u",
                        kind_name[kind], c->k, c->kdim, c->vdim, (int)dt, ri, beams[bi], i % nc,
                        i / nc, a[i], b[i]);
            if (beams[bi] == 1 && !kr) {
                plain_greedy(q, c, dt, rows, n, b);
                for (size_t i = 0; i < n * nc; i++)
                    EXPECTF(a[i] == b[i],
                            "%s data, k=%u, dims %u/%u, dtype %d: code %zu of position %zu is "
                            "%u, the exact argmin is %u",
                            kind_name[kind], c->k, c->kdim, c->vdim, (int)dt, i % nc, i / nc,
                            a[i], b[i]);
            }
            if (!fits16)
                continue;
            memset(a, 0xAA, n * nc * 2);
            memset(b, 0x55, n * nc * 2);
            ck_assert_int_eq(fkvf_rvq_encode(w16, &rw, kr, beams[bi], a, nc, 1), FKVF_OK);
            ck_assert_int_eq(fkvf_rvq_encode(w32, &rw, kr, beams[bi], b, nc, 1), FKVF_OK);
            EXPECTF(!memcmp(a, b, n * nc * 2),
                    "%s data, k=%u, dims %u/%u, dtype %d, rope %d, beam %u: f16 tables in "
                    "place give other codes than their binary32 widening",
                    kind_name[kind], c->k, c->kdim, c->vdim, (int)dt, ri, beams[bi]);
        }
    }
    fkvf_rvq_free(w32);
    fkvf_rvq_free(w16);
    free(t16);
    fkvf_rvq_free(q);
    free(tables);
    free(tle);
    free(rows);
    free(a);
    free(b);
}

START_TEST(encode_matches_references)
{
    const shape_case *c = &shapes[_i];
    const fkvf_dtype dts[3] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16, FKVF_DTYPE_F32};
    size_t n = c->k >= 1024 || c->kdim >= 256 ? 13 : 41; /* odd: partial groups and chunks */
    for (int kind = 0; kind < D_KINDS; kind++)
        for (int di = 0; di < 3; di++)
            run_case(c, kind, dts[di], n, 1000u * (uint64_t)_i + 10u * kind + di);
}
END_TEST

/* more positions than one chunk of the encoder (64), at the GPT-2 head dim */
START_TEST(encode_many_positions)
{
    const shape_case c = {1, 2, 2, 64, 64, 256, 2, 2, 0};
    run_case(&c, D_CLUSTER, FKVF_DTYPE_F16, 300, 99);
}
END_TEST

/* the scores of fkvfq_scores_rows equal fkvfq_scores4's bit for bit (and
 * the portable paths each other's), for every group size, with infinite and
 * not-a-number inputs too (whose panel minimums depend on the reduction) */
START_TEST(rows_scores_bit_identical)
{
    const uint32_t dims[] = {1, 3, 8, 17, 64, 255};
    tu_rng r = {7};
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
        for (int special = 0; special < 2; special++) {
            uint32_t dim = dims[di], k = 64;
            size_t np = k / FKVFQ_PANEL;
            float *rows = malloc((size_t)k * dim * 4), *pan = malloc((size_t)k * dim * 4);
            float *norms = malloc(k * 4), *x = malloc((size_t)FKVFQ_LANES * dim * 4);
            float *xt = malloc((size_t)FKVFQ_LANES * dim * 4);
            float *s1 = malloc((size_t)FKVFQ_LANES * k * 4), *s2 = malloc((size_t)4 * k * 4);
            float *p1 = malloc((size_t)FKVFQ_LANES * np * 4), *p2 = malloc((size_t)4 * np * 4);
            void *scr = malloc(fkvfq_prepare_scratch(k));
            ck_assert(rows && pan && norms && x && xt && s1 && s2 && p1 && p2 && scr);
            for (size_t i = 0; i < (size_t)k * dim; i++)
                rows[i] = special && tu_below(&r, 4) == 0 ? 0.0f : (float)(nrand(&r) * 3);
            for (size_t i = 0; i < (size_t)FKVFQ_LANES * dim; i++) {
                x[i] = (float)(nrand(&r) * 3);
                if (special && tu_below(&r, 3) == 0)
                    x[i] = tu_below(&r, 2) ? INFINITY : -INFINITY; /* inf * 0 = NaN */
            }
            fkvfq_table t = {rows, pan, norms, 0, k, dim};
            fkvfq_table_prepare(rows, k, dim, pan, norms, &t.cmax, scr);
            for (int port = 0; port < 2; port++)
                for (unsigned n = 1; n <= FKVFQ_LANES; n++) {
                    fkvfq_transpose_lanes(x, dim, n, dim, xt);
                    (port ? fkvfq_scores_rows_portable : fkvfq_scores_rows)(&t, xt, n, s1, p1);
                    for (unsigned j = 0; j < n; j++) {
                        const float *v = x + (size_t)j * dim;
                        const float *xp[4] = {v, v, v, v};
                        (port ? fkvfq_scores4_portable : fkvfq_scores4)(&t, xp, s2, p2);
                        EXPECTF(!memcmp(s1 + (size_t)j * k, s2, k * 4) &&
                                    !memcmp(p1 + (size_t)j * np, p2, np * 4),
                                "dim %u, group of %u, portable %d, special %d: vector %u's "
                                "scores differ",
                                dim, n, port, special, j);
                    }
                }
            free(rows);
            free(pan);
            free(norms);
            free(x);
            free(xt);
            free(s1);
            free(s2);
            free(p1);
            free(p2);
            free(scr);
        }
}
END_TEST

/* the AVX-512 scoring kernel's scores and panel minimums equal the AVX2
 * kernel's bit for bit (the same operations per lane), for every k shape
 * of its passes (64 centroids at a time, then single panels), with
 * infinite and not-a-number inputs too; skipped parts say so */
START_TEST(scores_isa_bit_identical)
{
    if (fkvfq_isa() < FKVFQ_ISA_AVX512) {
        fprintf(stderr, "scores_isa_bit_identical: no AVX-512 on this CPU, AVX2 only\n");
        if (fkvfq_isa() < FKVFQ_ISA_AVX2)
            return;
    }
    const uint32_t ks[] = {16, 48, 64, 80, 256, 1024}, dims[] = {1, 7, 64, 130};
    tu_rng r = {21};
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
        for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
            for (int special = 0; special < 2; special++) {
                uint32_t k = ks[ki], dim = dims[di];
                size_t np = k / FKVFQ_PANEL;
                float *rows = malloc((size_t)k * dim * 4), *pan = malloc((size_t)k * dim * 4);
                float *norms = malloc(k * 4), *x = malloc((size_t)4 * dim * 4);
                float *s1 = malloc((size_t)4 * k * 4), *s2 = malloc((size_t)4 * k * 4);
                float *p1 = malloc((size_t)4 * np * 4), *p2 = malloc((size_t)4 * np * 4);
                void *scr = malloc(fkvfq_prepare_scratch(k));
                ck_assert(rows && pan && norms && x && s1 && s2 && p1 && p2 && scr);
                for (size_t i = 0; i < (size_t)k * dim; i++)
                    rows[i] = special && tu_below(&r, 4) == 0 ? 0.0f : (float)(nrand(&r) * 3);
                for (size_t i = 0; i < (size_t)4 * dim; i++) {
                    x[i] = (float)(nrand(&r) * 3);
                    if (special && tu_below(&r, 5) == 0)
                        x[i] = tu_below(&r, 2) ? INFINITY : -INFINITY;
                }
                fkvfq_table t = {rows, pan, norms, 0, k, dim};
                fkvfq_table_prepare(rows, k, dim, pan, norms, &t.cmax, scr);
                const float *xp[4] = {x, x + dim, x + 2 * (size_t)dim, x + 3 * (size_t)dim};
                fkvfq_scores4_isa(FKVFQ_ISA_AVX512, &t, xp, s1, p1);
                fkvfq_scores4_isa(FKVFQ_ISA_AVX2, &t, xp, s2, p2);
                EXPECTF(!memcmp(s1, s2, (size_t)4 * k * 4) && !memcmp(p1, p2, 4 * np * 4),
                        "k %u dim %u special %d: AVX-512 and AVX2 scores differ", k, dim,
                        special);
                free(rows);
                free(pan);
                free(norms);
                free(x);
                free(s1);
                free(s2);
                free(p1);
                free(p2);
                free(scr);
            }
}
END_TEST

/* the search layout against a straightforward reference: panel element
 * (d, i), norm = eight binary64 partial sums (d mod 8) added pairwise,
 * rounded to binary32, infinite for a row equal to an earlier one, cmax
 * above the largest norm */
START_TEST(prepare_matches_reference)
{
    const uint32_t ks[] = {16, 64, 1024}, dims[] = {1, 5, 64};
    tu_rng r = {11};
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 3; b++) {
            uint32_t k = ks[a], dim = dims[b];
            float *rows = malloc((size_t)k * dim * 4), *pan = malloc((size_t)k * dim * 4);
            float *norms = malloc(k * 4);
            void *scr = malloc(fkvfq_prepare_scratch(k));
            ck_assert(rows && pan && norms && scr);
            for (uint32_t c = 0; c < k; c++) {
                float *row = rows + (size_t)c * dim;
                unsigned m = tu_below(&r, 6);
                if (c && m == 0) /* a copy of an earlier row */
                    memcpy(row, rows + (size_t)tu_below(&r, c) * dim, dim * 4);
                else if (m == 1) /* all zero, sign bits varying: -0 == +0 */
                    for (uint32_t d = 0; d < dim; d++)
                        row[d] = tu_below(&r, 2) ? -0.0f : 0.0f;
                else if (m == 2 && c) /* same norm as an earlier row, other elements */
                    for (uint32_t d = 0; d < dim; d++)
                        row[d] = -rows[(size_t)(c - 1) * dim + dim - 1 - d];
                else if (m == 3) /* magnitudes 2^-30..2^30: huge and tiny squares in one sum */
                    for (uint32_t d = 0; d < dim; d++)
                        row[d] = ldexpf(1.0f + (float)tu_below(&r, 1000) / 1000.0f,
                                        (int)tu_below(&r, 61) - 30);
                else
                    for (uint32_t d = 0; d < dim; d++)
                        row[d] = (float)((int)tu_below(&r, 5) - 2);
            }
            double cmax;
            fkvfq_table_prepare(rows, k, dim, pan, norms, &cmax, scr);
            double mx = 0;
            for (uint32_t c = 0; c < k; c++) {
                const float *row = rows + (size_t)c * dim;
                /* the norm: eight binary64 partial sums (element d to sum
                 * d mod 8), added pairwise */
                double ps[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                for (uint32_t d = 0; d < dim; d++) {
                    ps[d % 8] += (double)row[d] * row[d];
                    EXPECT(!memcmp(&pan[(size_t)(c / 16) * 16 * dim + (size_t)d * 16 + c % 16],
                                   &row[d], 4));
                }
                double n2 = ((ps[0] + ps[1]) + (ps[2] + ps[3])) + ((ps[4] + ps[5]) + (ps[6] + ps[7]));
                mx = n2 > mx ? n2 : mx;
                int dup = 0;
                for (uint32_t e = 0; e < c && !dup; e++) {
                    dup = 1;
                    for (uint32_t d = 0; d < dim; d++)
                        if (!(rows[(size_t)e * dim + d] == row[d]))
                            dup = 0;
                }
                float want = dup ? INFINITY : (float)n2;
                EXPECTF(!memcmp(&norms[c], &want, 4), "k %u dim %u: norm of %u is %g, want %g",
                        k, dim, c, (double)norms[c], (double)want);
            }
            EXPECT(cmax >= sqrt(mx) && cmax <= sqrt(mx) * (1 + 0x1p-30) + 1e-300);
            free(rows);
            free(pan);
            free(norms);
            free(scr);
        }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("encode_exact");
    TCase *tc = tcase_create("core");
    /* natively the suite takes seconds; under qemu user-mode emulation
     * (scripts/test-cross.sh --full, s390x) encode_matches_references' first
     * shape alone takes about 950 s, past the 600 s this was */
    tcase_set_timeout(tc, 3000);
    tcase_add_loop_test(tc, encode_matches_references, 0, (int)(sizeof shapes / sizeof *shapes));
    tcase_add_test(tc, encode_many_positions);
    tcase_add_test(tc, rows_scores_bit_identical);
    tcase_add_test(tc, scores_isa_bit_identical);
    tcase_add_test(tc, prepare_matches_reference);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
