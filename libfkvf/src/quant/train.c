/* RVQ training: per (layer, head or pooled, K|V), stage by stage, k-means
 * with k-means++ seeding, Lloyd iterations and empty-cluster repair on the
 * residuals the encoder leaves after the previous stages. Deterministic:
 * one splitmix64 stream per table and stage derived from the seed, a fixed
 * evaluation order, exact (binary64-checked) assignments, binary64 means. */
#include <math.h>
#include <string.h>

#include "alloc.h"
#include "cbk1_layout.h"
#include "ckd.h"
#include "cpu.h"
#include "half.h"
#include "parallel.h"
#include "quant.h"
#include "metric_matrix.h"
#include "rope.h"

/* ---- PRNG (splitmix64) -------------------------------------------------------- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

typedef struct q_rng {
    uint64_t s;
} q_rng;

static uint64_t rng_next(q_rng *r) { return mix64(r->s += UINT64_C(0x9E3779B97F4A7C15)); }
/* uniform in [0, 1) with 53 bits */
static double rng_unit(q_rng *r) { return (double)(rng_next(r) >> 11) * 0x1p-53; }
/* uniform in [0, n), n >= 1 (n < 2^53 here) */
static size_t rng_below(q_rng *r, size_t n)
{
    size_t i = (size_t)(rng_unit(r) * (double)n);
    return i < n ? i : n - 1;
}

/* ---- parameters ------------------------------------------------------------------- */

FKVF_API void fkvf_rvq_params_init(fkvf_rvq_params *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->k = 256;
    p->k_stages = 4;
    p->v_stages = 2;
    p->pooled = 0;
    p->table_dtype = FKVF_DTYPE_F16;
    p->seed = 0;
    p->max_iters = 25;
    p->samples_per_centroid = 256;
    p->n_threads = 1;
}

/* 1 if the element at p (dtype dt) is not finite */
static int elem_nonfinite(fkvf_dtype dt, const uint8_t *p)
{
    if (dt == FKVF_DTYPE_F16)
        return (p[1] & 0x7C) == 0x7C;
    if (dt == FKVF_DTYPE_BF16)
        return (p[1] & 0x7F) == 0x7F && (p[0] & 0x80);
    return (p[3] & 0x7F) == 0x7F && (p[2] & 0x80);
}

/* ---- k-means on n vectors of dim ---------------------------------------------- */

typedef struct km {
    const fkvf_allocator *a;
    float *x;         /* n * dim training vectors (residuals), updated in place */
    float *xt;        /* dim * seed_ld(n): the vectors transposed for seeding
                       * (seed_update_avx512; allocated on CPUs that run
                       * it), or NULL */
    size_t n;
    uint32_t dim, k;
    uint32_t *asg, *prev; /* n */
    double *err;      /* n: exact squared distance to the assigned centroid
                       * (km_errors, when a repair needs them; seeding's
                       * distances before that) */
    double *xx;       /* n: fkvfq_norm2 of each vector (km_stage) */
    double *cum;      /* n: seeding's running sums of err */
    double *sums;     /* k * dim */
    size_t *counts;   /* k */
    float *scores;    /* FKVFQ_BLOCK * k */
    float *pmin;      /* FKVFQ_BLOCK * k / FKVFQ_PANEL */
    void *prep;       /* fkvfq_prepare_scratch(k) */
    /* the table being trained lives in the handle's arrays */
    float *rows, *panels, *norms;
    double *cmax;
    /* training under a metric (spec 13.8): the vectors are U x, the table
     * U c; u the table's factor (dim x dim, NULL: Euclidean), orig the table
     * in the codebook's own frame (k * dim), sol dim doubles of scratch */
    const double *u;
    float *orig;
    double *sol;
    /* Exact skipping of assignments (km_assign): near[i] the centroid the
     * last assignment picked for vector i (before any repair), ub[i] an
     * upper bound of its true Euclidean distance to that centroid and lb[i]
     * a lower bound of its distance to every other centroid, both for the
     * table old (k * dim, the table of that assignment) moved by mv (k:
     * upper bounds of each centroid's move since); bounds 0 until an
     * assignment has set them (not after one on a table with duplicates) */
    uint32_t *near;
    double *ub, *lb, *mv;
    float *old;
    uint8_t *need; /* n: km_assign's scratch */
    int bounds;
    /* statistics */
    size_t repairs;   /* empty clusters re-seeded */
    uint32_t iters;   /* Lloyd iterations run in the last stage */
} km;

static fkvfq_table km_table(const km *m)
{
    fkvfq_table t;
    t.rows = m->rows;
    t.panels = m->panels;
    t.norms = m->norms;
    t.cmax = *m->cmax;
    t.k = m->k;
    t.dim = m->dim;
    return t;
}

/* squared distance in binary32 with eight fixed lanes (vectorizes the same
 * way everywhere, so seeding is reproducible), summed in binary64 */
static double dist_lanes(const float *x, const float *c, uint32_t dim)
{
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t d = 0;
    for (; d + 8 <= dim; d += 8)
        for (int l = 0; l < 8; l++) {
            float e = x[d + l] - c[d + l];
            acc[l] += e * e;
        }
    for (int l = 0; d < dim; d++, l++) {
        float e = x[d] - c[d];
        acc[l] += e * e;
    }
    double s = 0;
    for (int l = 0; l < 8; l++)
        s += acc[l];
    return s;
}

/* d2[i] = dist_lanes(x_i, c) (first) or min(d2[i], dist_lanes(x_i, c)) for
 * every i; returns the sum of the new d2[i] in order i = 0..n-1 from 0, and
 * cum[i] = that sum after term i (the running sums k-means++ samples from). */
static double seed_update_portable(const float *x, size_t n, uint32_t dim, const float *c,
                                   double *d2, double *cum, int first)
{
    double total = 0;
    for (size_t i = 0; i < n; i++) {
        double e = dist_lanes(x + i * dim, c, dim);
        if (first || e < d2[i])
            d2[i] = e;
        total += d2[i];
        cum[i] = total;
    }
    return total;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define Q_SEED_AVX2 1
#include <immintrin.h>
/* The same, four vectors at a time: each vector's eight binary32 lanes as
 * in dist_lanes (a short last block reads zeros, and adding +0 to a lane
 * changes nothing), the lanes transposed so that the four binary64 sums run
 * side by side in the same order l = 0..7; the total in order i. */
__attribute__((target("avx2"))) static double seed_update_avx2(const float *x, size_t n,
                                                               uint32_t dim, const float *c,
                                                               double *d2, double *cum,
                                                               int first)
{
    const uint32_t full = dim / 8 * 8, rem = dim - full;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rem), lane);
    double total = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256 acc[4];
        for (int p = 0; p < 4; p++) {
            const float *xp = x + (i + (size_t)p) * dim;
            __m256 a = _mm256_setzero_ps();
            uint32_t d = 0;
            for (; d < full; d += 8) {
                __m256 e = _mm256_sub_ps(_mm256_loadu_ps(xp + d), _mm256_loadu_ps(c + d));
                a = _mm256_add_ps(a, _mm256_mul_ps(e, e));
            }
            if (rem) {
                __m256 e = _mm256_sub_ps(_mm256_maskload_ps(xp + d, tail),
                                         _mm256_maskload_ps(c + d, tail));
                a = _mm256_add_ps(a, _mm256_mul_ps(e, e));
            }
            acc[p] = a;
        }
        __m128 l0 = _mm256_castps256_ps128(acc[0]), l1 = _mm256_castps256_ps128(acc[1]);
        __m128 l2 = _mm256_castps256_ps128(acc[2]), l3 = _mm256_castps256_ps128(acc[3]);
        __m128 h0 = _mm256_extractf128_ps(acc[0], 1), h1 = _mm256_extractf128_ps(acc[1], 1);
        __m128 h2 = _mm256_extractf128_ps(acc[2], 1), h3 = _mm256_extractf128_ps(acc[3], 1);
        _MM_TRANSPOSE4_PS(l0, l1, l2, l3); /* l0 = lane 0 of the four vectors, ... */
        _MM_TRANSPOSE4_PS(h0, h1, h2, h3);
        __m256d sm = _mm256_setzero_pd();
        sm = _mm256_add_pd(sm, _mm256_cvtps_pd(l0));
        sm = _mm256_add_pd(sm, _mm256_cvtps_pd(l1));
        sm = _mm256_add_pd(sm, _mm256_cvtps_pd(l2));
        sm = _mm256_add_pd(sm, _mm256_cvtps_pd(l3));
        sm = _mm256_add_pd(sm, _mm256_cvtps_pd(h0));
        sm = _mm256_add_pd(sm, _mm256_cvtps_pd(h1));
        sm = _mm256_add_pd(sm, _mm256_cvtps_pd(h2));
        sm = _mm256_add_pd(sm, _mm256_cvtps_pd(h3));
        __m256d old = _mm256_loadu_pd(d2 + i);
        __m256d nw = first ? sm : _mm256_blendv_pd(old, sm, _mm256_cmp_pd(sm, old, _CMP_LT_OQ));
        _mm256_storeu_pd(d2 + i, nw);
        double v[4];
        _mm256_storeu_pd(v, nw);
        for (int p = 0; p < 4; p++) {
            total += v[p];
            cum[i + (size_t)p] = total;
        }
    }
    for (; i < n; i++) {
        double e = dist_lanes(x + i * dim, c, dim);
        if (first || e < d2[i])
            d2[i] = e;
        total += d2[i];
        cum[i] = total;
    }
    return total;
}
#endif

/* floats per vector of the transposed copy: n rounded up to 16 */
static size_t seed_ld(size_t n) { return (n + 15) / 16 * 16; }

/* The vectors in groups of 16, each group transposed (element d of vector
 * 16g + j at xt[(g * dim + d) * 16 + j]: a group's elements are contiguous,
 * read in order); the padding lanes of the last group 0. */
static void seed_transpose(const float *x, size_t n, uint32_t dim, float *xt)
{
    for (size_t g = 0; g < seed_ld(n) / 16; g++)
        for (uint32_t d = 0; d < dim; d++) {
            float *o = xt + (g * dim + d) * 16;
            for (size_t j = 0; j < 16; j++) {
                size_t i = g * 16 + j;
                o[j] = i < n ? x[i * dim + d] : 0.0f;
            }
        }
}

#ifdef Q_SEED_AVX2
#define Q_SEED_AVX512 1
/* The same on the transposed vectors, sixteen at a time, one per lane:
 * accumulator l holds every vector's binary32 lane l of dist_lanes (element
 * d goes to lane d mod 8, in order of d: the additions of dist_lanes, each
 * product rounded before it is added), then the binary64 sums 0 + lane 0 +
 * ... + lane 7 in that order, eight vectors per register; the total in
 * order i. The same values as seed_update_portable. */
__attribute__((target("avx512f,avx2"))) static double
seed_update_avx512(const float *xt, size_t n, uint32_t dim, const float *c, double *d2,
                   double *cum, int first)
{
    double total = 0;
    for (size_t i = 0; i < n; i += 16) {
        const float *g = xt + i * dim; /* group i / 16 */
        __m512 acc[8];
        for (int l = 0; l < 8; l++)
            acc[l] = _mm512_setzero_ps();
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8)
            for (int l = 0; l < 8; l++) {
                __m512 e = _mm512_sub_ps(_mm512_loadu_ps(g + (size_t)(d + l) * 16),
                                         _mm512_set1_ps(c[d + l]));
                acc[l] = _mm512_add_ps(acc[l], _mm512_mul_ps(e, e));
            }
        for (int l = 0; d < dim; d++, l++) {
            __m512 e = _mm512_sub_ps(_mm512_loadu_ps(g + (size_t)d * 16),
                                     _mm512_set1_ps(c[d]));
            acc[l] = _mm512_add_ps(acc[l], _mm512_mul_ps(e, e));
        }
        const size_t left = n - i;
        for (int half = 0; half < 2 && (size_t)half * 8 < left; half++) {
            __m512d sm = _mm512_setzero_pd();
            for (int l = 0; l < 8; l++) {
                __m256 a = half ? _mm256_castpd_ps(_mm512_extractf64x4_pd(
                                      _mm512_castps_pd(acc[l]), 1))
                                : _mm512_castps512_ps256(acc[l]);
                sm = _mm512_add_pd(sm, _mm512_cvtps_pd(a));
            }
            const size_t cnt = left - (size_t)half * 8 < 8 ? left - (size_t)half * 8 : 8;
            const __mmask8 m = (__mmask8)((1u << cnt) - 1);
            double *dp = d2 + i + (size_t)half * 8;
            __m512d nw = sm;
            if (!first) {
                __m512d old = _mm512_maskz_loadu_pd(m, dp);
                nw = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(sm, old, _CMP_LT_OQ), old, sm);
            }
            _mm512_mask_storeu_pd(dp, m, nw);
            double v[8];
            _mm512_storeu_pd(v, nw);
            for (size_t j = 0; j < cnt; j++) {
                total += v[j];
                cum[i + (size_t)half * 8 + j] = total;
            }
        }
    }
    return total;
}
#endif

/* xt: the transposed vectors (seed_transpose) or NULL */
static double seed_update(const float *x, const float *xt, size_t n, uint32_t dim,
                          const float *c, double *d2, double *cum, int first)
{
#ifdef Q_SEED_AVX512
    if (xt && fkvf_cpu_avx512())
        return seed_update_avx512(xt, n, dim, c, d2, cum, first);
#else
    (void)xt;
#endif
#ifdef Q_SEED_AVX2
    if (fkvf_cpu_avx2())
        return seed_update_avx2(x, n, dim, c, d2, cum, first);
#endif
    return seed_update_portable(x, n, dim, c, d2, cum, first);
}

size_t fkvfq_seed_scratch(size_t n, uint32_t dim) { return seed_ld(n) * dim; }

double fkvfq_seed_update_isa(int isa, const float *x, size_t n, uint32_t dim, const float *c,
                             double *d2, double *cum, int first, float *xt)
{
    (void)isa; /* only the x86-64 kernels are chosen by it */
#ifdef Q_SEED_AVX512
    if (isa >= FKVFQ_ISA_AVX512 && fkvf_cpu_avx512()) {
        seed_transpose(x, n, dim, xt);
        return seed_update_avx512(xt, n, dim, c, d2, cum, first);
    }
#else
    (void)xt;
#endif
#ifdef Q_SEED_AVX2
    if (isa >= FKVFQ_ISA_AVX2 && fkvf_cpu_avx2())
        return seed_update_avx2(x, n, dim, c, d2, cum, first);
#endif
    return seed_update_portable(x, n, dim, c, d2, cum, first);
}

/* k-means++: first centre uniform, then each next one with probability
 * proportional to the squared distance to the nearest chosen centre. When
 * every point coincides with a centre the next is drawn uniformly. The
 * distances are updated and summed in one pass (the same values, the same
 * order as a separate summing pass). */
static void km_seed(km *m, q_rng *r)
{
    const size_t n = m->n;
    const uint32_t dim = m->dim;
    double *d2 = m->err;
    size_t first = rng_below(r, n);
    memcpy(m->rows, m->x + first * dim, dim * sizeof(float));
    const float *xt = NULL;
    if (m->xt && fkvf_cpu_avx512()) {
        seed_transpose(m->x, n, dim, m->xt);
        xt = m->xt;
    }
    double *cum = m->cum;
    double total = seed_update(m->x, xt, n, dim, m->rows, d2, cum, 1);
    for (uint32_t j = 1; j < m->k; j++) {
        size_t pick;
        if (total > 0) {
            /* the first i whose running sum of d2 (in order i) exceeds u:
             * cum holds those sums (non-decreasing: every d2 >= 0), and an i
             * where the sum first exceeds u has d2[i] > 0; when none does
             * (rounding: u == total), the last i with d2[i] > 0 */
            double u = rng_unit(r) * total;
            size_t lo = 0, hi = n; /* cum[i] <= u for i < lo, > u for i >= hi */
            while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (cum[mid] > u)
                    hi = mid;
                else
                    lo = mid + 1;
            }
            pick = lo;
            if (pick == n) {
                pick = n - 1;
                while (pick > 0 && !(d2[pick] > 0))
                    pick--;
            }
        } else {
            pick = rng_below(r, n);
        }
        float *c = m->rows + (size_t)j * dim;
        memcpy(c, m->x + pick * dim, dim * sizeof(float));
        total = seed_update(m->x, xt, n, dim, c, d2, cum, 0);
    }
}

#ifdef Q_SEED_AVX512
/* sum over d of (x[d] - c[d])^2 in binary64 in any order: eight lanes,
 * two accumulators, fused multiply-adds (a bound's input: within
 * km_gamma of the true value as fkvfq_dist is, not the same bits) */
__attribute__((target("avx512f"))) static double km_dist_avx512(const float *x, const float *c,
                                                                uint32_t dim)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    uint32_t d = 0;
    for (; d + 16 <= dim; d += 16) {
        __m512d e0 = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + d)),
                                   _mm512_cvtps_pd(_mm256_loadu_ps(c + d)));
        __m512d e1 = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + d + 8)),
                                   _mm512_cvtps_pd(_mm256_loadu_ps(c + d + 8)));
        a0 = _mm512_fmadd_pd(e0, e0, a0);
        a1 = _mm512_fmadd_pd(e1, e1, a1);
    }
    double s = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
    for (; d < dim; d++) {
        double e = (double)x[d] - (double)c[d];
        s += e * e;
    }
    return s;
}
#endif

/* A squared distance for the bounds (any order of the additions) */
static double km_dist(const float *x, const float *c, uint32_t dim)
{
#ifdef Q_SEED_AVX512
    if (fkvf_cpu_avx512())
        return km_dist_avx512(x, c, dim);
#endif
    return fkvfq_dist(x, c, dim);
}

/* Relative error bound of a binary64 distance over dim elements (fkvfq_dist:
 * each difference and square rounded once, dim - 1 additions of
 * non-negative terms) against the true squared distance, with room. */
static double km_gamma(uint32_t dim) { return (double)(dim + 4) * 0x1p-52; }

/* Bounds of vector x after a full search picked a (at squared distance da,
 * km_dist)
 * from scores sc and panel minimums pm: ub an upper bound of the true
 * distance to a, lb a lower bound of the true distance to every other
 * centroid: ||x||^2 + (the smallest binary32 score of another centroid)
 * - E (fkvfq_score_bound: every score lies within E of its exact value,
 * and the true squared distance is ||x||^2 + that value). */
static void km_bound_set(const km *m, const fkvfq_table *t, size_t i, uint32_t a, double da,
                         const float *sc, const float *pm)
{
    const uint32_t np = m->k / FKVFQ_PANEL, pa = a / FKVFQ_PANEL;
    const double g = km_gamma(m->dim);
    float f2 = INFINITY;
    for (uint32_t p = 0; p < np; p++)
        if (p != pa && pm[p] < f2)
            f2 = pm[p];
    for (uint32_t c = pa * FKVFQ_PANEL; c < (pa + 1) * FKVFQ_PANEL; c++)
        if (c != a && sc[c] < f2)
            f2 = sc[c];
    /* less the rounding of these three binary64 operations (the sum may
     * cancel: absolute, of the largest magnitude) */
    double xx = m->xx[i], e = fkvfq_score_bound(t, xx), f = (double)f2;
    double l2 = xx * (1 - g) + f - e - 0x1p-50 * (xx + fabs(f) + e);
    m->ub[i] = sqrt(da / (1 - g)) * (1 + 0x1p-40);
    m->lb[i] = l2 > 0 ? sqrt(l2) * (1 - 0x1p-40) : 0;
}

/* ub, lb prove the nearest strict: every binary64 distance to another
 * centroid above the one to near[i] */
static int km_proves(double ub, double lb, double g)
{
    return ub * ub * (1 + g) < lb * lb * (1 - g);
}

/* centroids that moved the most, checked one by one (km_bound_move) */
#define Q_MOVERS 8

/* The Q_MOVERS centroids that moved most (mv) into jo, and the largest
 * move of the others; 0 if k <= Q_MOVERS. */
static double km_movers(const km *m, uint32_t jo[Q_MOVERS])
{
    if (m->k <= Q_MOVERS)
        return 0;
    unsigned nj = 0;
    for (uint32_t j = 0; j < m->k; j++) {
        unsigned pos = nj < Q_MOVERS ? nj++ : Q_MOVERS;
        if (pos == Q_MOVERS && !(m->mv[j] > m->mv[jo[Q_MOVERS - 1]]))
            continue;
        if (pos == Q_MOVERS)
            pos = Q_MOVERS - 1;
        while (pos > 0 && m->mv[j] > m->mv[jo[pos - 1]]) {
            jo[pos] = jo[pos - 1];
            pos--;
        }
        jo[pos] = j;
    }
    double rest = 0;
    for (uint32_t j = 0; j < m->k; j++) {
        int in = 0;
        for (unsigned q = 0; q < Q_MOVERS; q++)
            in |= jo[q] == j;
        if (!in && m->mv[j] > rest)
            rest = m->mv[j];
    }
    return rest;
}

/* A lower bound of vector i's true distance to each of the movers jo other
 * than near[i] (+infinity when near[i] is the only one), given ub (its
 * distance to near[i] is at most that), lb0 (its bound before the move)
 * and cc (k * Q_MOVERS lower bounds of the distances between every
 * centroid and each mover, or NULL): first the triangle inequality,
 * through the mover's old place and through near[i]; a mover whose bound
 * so stays below lb (the bound of the others) is measured. */
static double km_movers_bound(const km *m, size_t i, const uint32_t jo[Q_MOVERS], double g,
                              double ub, double lb0, double lb, const double *cc)
{
    const uint32_t dim = m->dim, a = m->near[i];
    double lo = INFINITY;
    for (unsigned q = 0; q < Q_MOVERS; q++) {
        if (jo[q] == a)
            continue;
        double t = (lb0 - m->mv[jo[q]]) * (1 - 0x1p-40);
        if (cc) {
            double u = (cc[(size_t)a * Q_MOVERS + q] - ub) * (1 - 0x1p-40);
            t = u > t ? u : t;
        }
        if (!(t >= lb)) {
            double e = km_dist(m->x + i * dim, m->rows + (size_t)jo[q] * dim, dim);
            double u = e > 0 ? sqrt(e / (1 + g)) * (1 - 0x1p-40) : 0;
            t = u > t ? u : t;
        }
        t = t > 0 ? t : 0;
        lo = t < lo ? t : lo;
    }
    return lo;
}

/* cc of km_movers_bound into m->sums (free until km_update), when it has
 * room (dim >= Q_MOVERS); else NULL */
static const double *km_movers_cc(km *m, const uint32_t jo[Q_MOVERS], double g)
{
    if (m->dim < Q_MOVERS)
        return NULL;
    double *cc = m->sums;
    for (uint32_t j = 0; j < m->k; j++)
        for (unsigned q = 0; q < Q_MOVERS; q++) {
            double e = km_dist(m->rows + (size_t)j * m->dim, m->rows + (size_t)jo[q] * m->dim,
                               m->dim);
            cc[(size_t)j * Q_MOVERS + q] = e > 0 ? sqrt(e / (1 + g)) * (1 - 0x1p-40) : 0;
        }
    return cc;
}

/* Move the bounds to the table in rows: mv[j] >= how far centroid j moved
 * from old; vectors whose bounds still prove near[i] the strict nearest
 * keep it without a search (0 in need[i]), the others are marked 1. When a
 * few centroids moved much more than the rest (an empty cluster re-seeded
 * far away), the lower bound drops by the largest move of the rest and
 * those few are measured. */
static void km_bound_move(km *m, uint8_t *need)
{
    const uint32_t dim = m->dim;
    const double g = km_gamma(dim);
    double mx = 0;
    for (uint32_t j = 0; j < m->k; j++) {
        double s = km_dist(m->rows + (size_t)j * dim, m->old + (size_t)j * dim, dim);
        m->mv[j] = sqrt(s / (1 - g)) * (1 + 0x1p-40);
        mx = m->mv[j] > mx ? m->mv[j] : mx;
    }
    if (!isfinite(mx)) {
        memset(need, 1, m->n);
        return;
    }
    uint32_t jo[Q_MOVERS];
    double rest = km_movers(m, jo);
    const int few = m->k > Q_MOVERS && rest < 0.75 * mx;
    const double drop = few ? rest : mx;
    const double *cc = few ? km_movers_cc(m, jo, g) : NULL;
    for (size_t i = 0; i < m->n; i++) {
        double ub = (m->ub[i] + m->mv[m->near[i]]) * (1 + 0x1p-40);
        double lb = (m->lb[i] - drop) * (1 - 0x1p-40);
        int tight = 0;
        lb = lb > 0 ? lb : 0;
        need[i] = 1;
        if (!km_proves(ub, lb, g)) { /* the distance to near[i] itself */
            double d = km_dist(m->x + i * dim, m->rows + (size_t)m->near[i] * dim, dim);
            ub = sqrt(d / (1 - g)) * (1 + 0x1p-40);
            tight = 1;
        }
        if (km_proves(ub, lb, g) && few) {
            double lj = km_movers_bound(m, i, jo, g, ub, m->lb[i], lb, cc);
            lb = lj < lb ? lj : lb;
            if (!km_proves(ub, lb, g) && !tight) {
                double d = km_dist(m->x + i * dim, m->rows + (size_t)m->near[i] * dim, dim);
                ub = sqrt(d / (1 - g)) * (1 + 0x1p-40);
            }
        }
        m->ub[i] = ub;
        m->lb[i] = lb;
        need[i] = !km_proves(ub, lb, g);
    }
}

/* 1 if the prepared table has a duplicate row (an infinite norm) */
static int km_has_dup(const km *m)
{
    for (uint32_t j = 0; j < m->k; j++)
        if (!isfinite(m->norms[j]))
            return 1;
    return 0;
}

/* exact nearest centroid of every vector: asg (and near). With bounds from
 * the last assignment, a vector they prove keeps its centroid is not
 * searched: the same result (the nearest is the strict nearest there). */
static void km_assign(km *m)
{
    fkvfq_table_prepare(m->rows, m->k, m->dim, m->panels, m->norms, m->cmax, m->prep);
    fkvfq_table t = km_table(m);
    uint8_t *need = m->need;
    if (m->bounds)
        km_bound_move(m, need);
    else
        memset(need, 1, m->n);
    const int keep = !km_has_dup(m);
    size_t idx[FKVFQ_BLOCK], i = 0;
    while (i < m->n) {
        unsigned nq = 0;
        for (; i < m->n && nq < FKVFQ_BLOCK; i++) {
            if (need[i])
                idx[nq++] = i;
            else
                m->asg[i] = m->near[i];
        }
        if (!nq)
            break;
        const float *xp[FKVFQ_BLOCK];
        for (unsigned u = 0; u < FKVFQ_BLOCK; u++)
            xp[u] = m->x + idx[u < nq ? u : nq - 1] * m->dim;
        fkvfq_scores4(&t, xp, m->scores, m->pmin);
        for (unsigned u = 0; u < nq; u++) {
            const float *sc = m->scores + u * m->k, *pm = m->pmin + u * (m->k / FKVFQ_PANEL);
            uint32_t a = fkvfq_pick_xx(&t, xp[u], m->xx[idx[u]], sc, pm, NULL);
            m->asg[idx[u]] = m->near[idx[u]] = a;
            if (keep)
                km_bound_set(m, &t, idx[u], a,
                             km_dist(xp[u], m->rows + (size_t)a * m->dim, m->dim), sc, pm);
        }
    }
    /* a table with duplicates: its bounds would leave out the later copies */
    m->bounds = keep;
    if (keep)
        memcpy(m->old, m->rows, (size_t)m->k * m->dim * sizeof(float));
}

/* err: the exact distance of every vector to its assigned centroid, four
 * at a time (fkvfq_dist4: the same values as fkvfq_dist) */
static void km_errors(km *m)
{
    for (size_t i0 = 0; i0 < m->n; i0 += 4) {
        const float *xp[4], *cp[4];
        double e[4];
        for (size_t u = 0; u < 4; u++) {
            size_t i = i0 + u < m->n ? i0 + u : m->n - 1;
            xp[u] = m->x + i * m->dim;
            cp[u] = m->rows + (size_t)m->asg[i] * m->dim;
        }
        fkvfq_dist4(xp, cp, m->dim, e);
        for (size_t u = 0; u < 4 && i0 + u < m->n; u++)
            m->err[i0 + u] = e[u];
    }
}

/* Give every empty cluster the point that is worst served by its own
 * centroid (largest err, ties to the lowest index), taken from a cluster
 * that keeps at least one point. The errors are computed when the first
 * empty cluster is found (most assignments have none). */
static void km_repair(km *m)
{
    memset(m->counts, 0, m->k * sizeof(size_t));
    for (size_t i = 0; i < m->n; i++)
        m->counts[m->asg[i]]++;
    int have_err = 0;
    for (uint32_t j = 0; j < m->k; j++) {
        if (m->counts[j])
            continue;
        if (!have_err) {
            km_errors(m);
            have_err = 1;
        }
        size_t worst = m->n;
        for (size_t i = 0; i < m->n; i++)
            if (m->counts[m->asg[i]] > 1 && (worst == m->n || m->err[i] > m->err[worst]))
                worst = i;
        if (worst == m->n)
            return; /* fewer distinct donors than clusters: leave the rest as seeded */
        m->counts[m->asg[worst]]--;
        m->asg[worst] = j;
        m->counts[j] = 1;
        m->err[worst] = 0;
        m->repairs++;
    }
}

#ifdef Q_SEED_AVX512
/* km_update's sums with AVX-512: each element's binary64 additions in
 * index order, eight elements per register (the same values) */
__attribute__((target("avx512f"))) static void km_sums_avx512(km *m)
{
    const uint32_t dim = m->dim;
    for (size_t i = 0; i < m->n; i++) {
        double *s = m->sums + (size_t)m->asg[i] * dim;
        const float *x = m->x + i * dim;
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8)
            _mm512_storeu_pd(s + d, _mm512_add_pd(_mm512_loadu_pd(s + d),
                                                  _mm512_cvtps_pd(_mm256_loadu_ps(x + d))));
        for (; d < dim; d++)
            s[d] += x[d];
    }
}
#endif

/* centroids = means of their clusters (binary64 sums in index order) */
static void km_update(km *m)
{
    const uint32_t dim = m->dim;
    memset(m->sums, 0, (size_t)m->k * dim * sizeof(double));
#ifdef Q_SEED_AVX512
    if (fkvf_cpu_avx512())
        km_sums_avx512(m);
    else
#endif
        for (size_t i = 0; i < m->n; i++) {
            double *s = m->sums + (size_t)m->asg[i] * dim;
            const float *x = m->x + i * dim;
            for (uint32_t d = 0; d < dim; d++)
                s[d] += x[d];
        }
    for (uint32_t j = 0; j < m->k; j++) {
        if (!m->counts[j])
            continue;
        double inv = (double)m->counts[j];
        for (uint32_t d = 0; d < dim; d++)
            m->rows[(size_t)j * dim + d] = (float)(m->sums[(size_t)j * dim + d] / inv);
    }
}

/* v rounded to a table dtype (F16: clamped to its range first) */
static float km_round(float v, fkvf_dtype dtype)
{
    if (dtype == FKVF_DTYPE_F16) {
        if (v > 65504.0f)
            v = 65504.0f;
        else if (v < -65504.0f)
            v = -65504.0f;
        v = fkvf_cvt_f16_to_f32(fkvf_cvt_f32_to_f16(v));
    }
    return v;
}

/* Train one stage: the table ends up in m->rows (rounded to dtype, prepared)
 * and the vectors in m->x become their residuals. */
static void km_stage(km *m, q_rng *r, uint32_t max_iters, fkvf_dtype dtype, const float *init)
{
    m->bounds = 0;
    for (size_t i = 0; i < m->n; i++)
        m->xx[i] = fkvfq_norm2(m->x + i * m->dim, m->dim);
    if (init)
        memcpy(m->rows, init, (size_t)m->k * m->dim * sizeof(float));
    else
        km_seed(m, r);
    m->iters = 0;
    for (uint32_t it = 0; it < max_iters; it++) {
        m->iters = it + 1;
        km_assign(m);
        km_repair(m);
        if (it > 0 && !memcmp(m->asg, m->prev, m->n * sizeof(uint32_t)))
            break; /* stable: the centroids already are these clusters' means */
        km_update(m);
        uint32_t *t = m->prev;
        m->prev = m->asg;
        m->asg = t;
    }
    size_t total = (size_t)m->k * m->dim;
    if (m->u) {
        /* rounded in the codebook's frame (what a file stores), then mapped
         * back as the encoder maps it (fkvf_rvq_set_metric: U c) */
        for (uint32_t j = 0; j < m->k; j++) {
            float *row = m->rows + (size_t)j * m->dim, *o = m->orig + (size_t)j * m->dim;
            fkvfq_metric_solve(m->u, m->dim, row, m->sol);
            for (uint32_t d = 0; d < m->dim; d++)
                o[d] = km_round((float)m->sol[d], dtype);
            fkvf_metric_apply(m->u, m->dim, o, row);
        }
    } else {
        for (size_t i = 0; i < total; i++)
            m->rows[i] = km_round(m->rows[i], dtype);
        if (m->orig) /* a Euclidean part of a metric training: the same frame */
            memcpy(m->orig, m->rows, total * sizeof(float));
    }
    /* residuals through the encoder's own search on the final table */
    km_assign(m);
    for (size_t i = 0; i < m->n; i++) {
        float *x = m->x + i * m->dim;
        const float *c = m->rows + (size_t)m->asg[i] * m->dim;
        for (uint32_t d = 0; d < m->dim; d++)
            x[d] -= c[d];
    }
}

int fkvfq_kmeans(const fkvf_allocator *alloc, const float *x, size_t n, uint32_t dim,
                 uint32_t k, const float *init, uint64_t seed, uint32_t max_iters,
                 float *centroids, uint32_t *asg, size_t *repairs, uint32_t *iters)
{
    if (!x || !n || !dim || k < FKVFQ_PANEL || k % FKVFQ_PANEL || !max_iters || !centroids)
        return FKVF_E_INVALID_ARG;
    km m;
    memset(&m, 0, sizeof m);
    size_t nd = n * dim, kd = (size_t)k * dim; /* test sizes */
    double cmax = 0;
    m.a = alloc;
    m.n = n;
    m.dim = dim;
    m.k = k;
    m.rows = centroids;
    m.cmax = &cmax;
    int ok = (m.x = fkvf_calloc(alloc, nd, sizeof(float))) &&
             (!fkvf_cpu_avx512() ||
              (m.xt = fkvf_calloc(alloc, seed_ld(n), (size_t)dim * sizeof(float)))) &&
             (m.asg = fkvf_calloc(alloc, n, sizeof(uint32_t))) &&
             (m.prev = fkvf_calloc(alloc, n, sizeof(uint32_t))) &&
             (m.err = fkvf_calloc(alloc, n, sizeof(double))) &&
             (m.xx = fkvf_calloc(alloc, n, sizeof(double))) &&
             (m.cum = fkvf_calloc(alloc, n, sizeof(double))) &&
             (m.sums = fkvf_calloc(alloc, kd, sizeof(double))) &&
             (m.counts = fkvf_calloc(alloc, k, sizeof(size_t))) &&
             (m.scores = fkvf_calloc(alloc, (size_t)FKVFQ_BLOCK * k, sizeof(float))) &&
             (m.pmin = fkvf_calloc(alloc, (size_t)FKVFQ_BLOCK * (k / FKVFQ_PANEL), sizeof(float))) &&
             (m.prep = fkvf_malloc(alloc, fkvfq_prepare_scratch(k))) &&
             (m.panels = fkvf_calloc(alloc, kd, sizeof(float))) &&
             (m.norms = fkvf_calloc(alloc, k, sizeof(float))) &&
             (m.near = fkvf_calloc(alloc, n, sizeof(uint32_t))) &&
             (m.ub = fkvf_calloc(alloc, n, sizeof(double))) &&
             (m.lb = fkvf_calloc(alloc, n, sizeof(double))) &&
             (m.mv = fkvf_calloc(alloc, k, sizeof(double))) &&
             (m.old = fkvf_calloc(alloc, kd, sizeof(float))) &&
             (m.need = fkvf_calloc(alloc, n, 1));
    if (ok) {
        memcpy(m.x, x, nd * sizeof(float));
        q_rng r = {seed};
        km_stage(&m, &r, max_iters, FKVF_DTYPE_F32, init);
        /* km_stage leaves the final assignment in asg */
        if (asg)
            memcpy(asg, m.asg, n * sizeof(uint32_t));
        if (repairs)
            *repairs = m.repairs;
        if (iters)
            *iters = m.iters;
    }
    fkvf_free(alloc, m.x);
    fkvf_free(alloc, m.xt);
    fkvf_free(alloc, m.asg);
    fkvf_free(alloc, m.prev);
    fkvf_free(alloc, m.err);
    fkvf_free(alloc, m.xx);
    fkvf_free(alloc, m.cum);
    fkvf_free(alloc, m.sums);
    fkvf_free(alloc, m.counts);
    fkvf_free(alloc, m.scores);
    fkvf_free(alloc, m.pmin);
    fkvf_free(alloc, m.prep);
    fkvf_free(alloc, m.panels);
    fkvf_free(alloc, m.norms);
    fkvf_free(alloc, m.near);
    fkvf_free(alloc, m.ub);
    fkvf_free(alloc, m.lb);
    fkvf_free(alloc, m.mv);
    fkvf_free(alloc, m.old);
    fkvf_free(alloc, m.need);
    return ok ? FKVF_OK : FKVF_E_NOMEM;
}

/* ---- training driver ---------------------------------------------------------- */

/* the most bytes of RoPE cosines and sines kept for all training rows (8192
 * rows of head dim 64: 4 MiB) */
#define Q_CS_ALL_BYTES ((size_t)32 << 20)

static int params_check(const fkvf_rvq_params *p, const fkvf_rows *blocks, size_t n_blocks,
                        size_t *total_rows)
{
    if (!p || !blocks || !n_blocks || p->n_layers < 1 || p->n_layers > 1024 ||
        p->n_kv_heads < 1 || p->n_kv_heads > 1024 || p->key_dim < 1 || p->key_dim > 16384 ||
        p->value_dim < 1 || p->value_dim > 16384 || p->k < 16 || p->k > 4096 ||
        (p->k & (p->k - 1)) || p->k_stages > 16 || p->v_stages > 16 || p->pooled > 1 ||
        (p->table_dtype != FKVF_DTYPE_F16 && p->table_dtype != FKVF_DTYPE_F32) ||
        p->max_iters < 1 || p->samples_per_centroid < 1 ||
        (p->key_rope && !fkvf_rope_valid(p->key_rope, p->key_dim)))
        return FKVF_E_INVALID_ARG;
    if (p->layer_stages &&
        fkvf_cbk1_table_bad(p->layer_stages, p->n_layers, p->k_stages, p->v_stages))
        return FKVF_E_INVALID_ARG;
    size_t n = 0;
    for (size_t b = 0; b < n_blocks; b++) {
        const fkvf_rows *r = &blocks[b];
        if (!fkvfq_dtype_size(r->dtype) || (r->n_rows && !r->data) ||
            (r->n_rows && r->first_position > UINT64_MAX - (r->n_rows - 1)) ||
            !fkvf_addsz(n, r->n_rows, &n))
            return FKVF_E_INVALID_ARG;
    }
    if (!n)
        return FKVF_E_INVALID_ARG;
    *total_rows = n;
    return FKVF_OK;
}

/* One worker's scratch: the sample of the table it trains and k-means'
 * working arrays (km), for one table at a time. */
typedef struct tr_scratch {
    float *x, *xt;
    uint32_t *asg, *prev;
    double *err, *xx, *cum, *sums;
    size_t *counts;
    float *scores, *pmin;
    void *prep;
    double *cs;  /* one row's RoPE cosines and sines, when not kept for all rows */
    double *sol; /* under a metric: dmax doubles */
    float *mt;   /* under a metric: dmax floats */
    uint32_t *near; /* km's bounds: n, n, n, k, k * dmax, n */
    double *ub, *lb, *mv;
    float *old;
    uint8_t *need;
} tr_scratch;

static void tr_free(const fkvf_allocator *a, tr_scratch *w)
{
    fkvf_free(a, w->x);
    fkvf_free(a, w->xt);
    fkvf_free(a, w->asg);
    fkvf_free(a, w->prev);
    fkvf_free(a, w->err);
    fkvf_free(a, w->xx);
    fkvf_free(a, w->cum);
    fkvf_free(a, w->sums);
    fkvf_free(a, w->counts);
    fkvf_free(a, w->scores);
    fkvf_free(a, w->pmin);
    fkvf_free(a, w->prep);
    fkvf_free(a, w->cs);
    fkvf_free(a, w->sol);
    fkvf_free(a, w->mt);
    fkvf_free(a, w->near);
    fkvf_free(a, w->ub);
    fkvf_free(a, w->lb);
    fkvf_free(a, w->mv);
    fkvf_free(a, w->old);
    fkvf_free(a, w->need);
}

/* Scratch for n training vectors of at most dmax dimensions; 0 when out of
 * memory (w then holds what was allocated, for tr_free). */
static int tr_alloc(const fkvf_allocator *a, tr_scratch *w, size_t n, uint32_t dmax, uint32_t k,
                    uint32_t one_cs, int metric)
{
    memset(w, 0, sizeof *w);
    int ok = (w->x = fkvf_calloc(a, n, (size_t)dmax * sizeof(float))) &&
             (!fkvf_cpu_avx512() ||
              (w->xt = fkvf_calloc(a, seed_ld(n), (size_t)dmax * sizeof(float)))) &&
             (w->asg = fkvf_calloc(a, n, sizeof(uint32_t))) &&
             (w->prev = fkvf_calloc(a, n, sizeof(uint32_t))) &&
             (w->err = fkvf_calloc(a, n, sizeof(double))) &&
             (w->xx = fkvf_calloc(a, n, sizeof(double))) &&
             (w->cum = fkvf_calloc(a, n, sizeof(double))) &&
             (w->sums = fkvf_calloc(a, (size_t)k * dmax, sizeof(double))) &&
             (w->counts = fkvf_calloc(a, k, sizeof(size_t))) &&
             (w->scores = fkvf_calloc(a, (size_t)FKVFQ_BLOCK * k, sizeof(float))) &&
             (w->pmin = fkvf_calloc(a, (size_t)FKVFQ_BLOCK * (k / FKVFQ_PANEL), sizeof(float))) &&
             (w->prep = fkvf_malloc(a, fkvfq_prepare_scratch(k))) &&
             (w->near = fkvf_calloc(a, n, sizeof(uint32_t))) &&
             (w->ub = fkvf_calloc(a, n, sizeof(double))) &&
             (w->lb = fkvf_calloc(a, n, sizeof(double))) &&
             (w->mv = fkvf_calloc(a, k, sizeof(double))) &&
             (w->old = fkvf_calloc(a, (size_t)k * dmax, sizeof(float))) &&
             (w->need = fkvf_calloc(a, n, 1));
    if (ok && one_cs)
        ok = (w->cs = fkvf_calloc(a, one_cs, sizeof(double))) != NULL;
    if (ok && metric)
        ok = (w->sol = fkvf_calloc(a, dmax, sizeof(double))) &&
             (w->mt = fkvf_calloc(a, dmax, sizeof(float)));
    return ok;
}

/* Bytes of tr_alloc's scratch for n vectors (an upper bound: the AVX-512
 * transposed copy counted whether made or not). */
static size_t tr_scratch_bytes(size_t n, uint32_t dmax, uint32_t k, uint32_t one_cs)
{
    size_t per_row = 2 * (size_t)dmax * sizeof(float) + 3 * sizeof(uint32_t) +
                     5 * sizeof(double) + 1; /* x, xt; asg, prev, near; err..lb; need */
    size_t per_k = (size_t)dmax * (sizeof(double) + sizeof(float)) + sizeof(size_t) +
                   sizeof(double) + (size_t)FKVFQ_BLOCK * sizeof(float) * 2; /* sums, old, ... */
    size_t a, b;
    if (!fkvf_mulsz(seed_ld(n), per_row, &a) || !fkvf_mulsz(k, per_k, &b) ||
        !fkvf_addsz(a, b, &a) || !fkvf_addsz(a, fkvfq_prepare_scratch(k), &a) ||
        !fkvf_addsz(a, (size_t)one_cs * sizeof(double) + (size_t)dmax * 12, &a))
        return SIZE_MAX;
    return a;
}

unsigned fkvfq_train_threads(unsigned n_threads, size_t scratch_bytes)
{
    size_t fit = scratch_bytes ? FKVFQ_TRAIN_SCRATCH_BYTES / scratch_bytes : SIZE_MAX;
    if (fit < 1)
        fit = 1;
    return n_threads > fit ? (unsigned)fit : n_threads;
}

/* One training: what every table's work reads (shared, unchanged while the
 * tables train) and where it writes (q's arrays and orig: each table its
 * own part). Item i is table set (layer, head, K|V) = (i / 2 / n_heads,
 * i / 2 % n_heads, i % 2), the order of spec 13.2. */
typedef struct tr_job {
    const fkvf_rvq_params *p;
    const fkvf_rows *blocks;
    size_t n_blocks;
    fkvf_rvq *q;
    const fkvf_codebook_shape *want; /* the stage counts per layer */
    size_t elems_per_row, pop, n;    /* row elements; vectors per table; sampled */
    uint32_t rd;                     /* rope_dims, 0 without un-rotation */
    const double *freqs;             /* rd / 2 */
    const double *cs_all;            /* every row's angles (rows * rd), or NULL */
    const double *uk, *uv;           /* the metric's factors, or NULL */
    float *orig;                     /* under a metric: the tables in their own frame */
    tr_scratch *w;                   /* one per worker */
    fkvf_par_lock lock;              /* the progress count */
    uint64_t done, todo;
} tr_job;

/* The seed of table set (l, hh, kv): the stages' seeds derive from it. */
static q_rng tr_rng(uint64_t seed, uint32_t l, uint32_t hh, unsigned kv)
{
    q_rng r = {mix64(seed ^ mix64(((uint64_t)l << 32) | ((uint64_t)hh << 8) |
                                  ((uint64_t)kv << 1) | 1u))};
    return r;
}

/* The training vectors of table set (l, hh, kv) into w->x: a deterministic
 * selection sampling (Knuth's algorithm S) of n of the pop vectors, in
 * population order (block, row, head), keys un-rotated at their position.
 * *got: how many. FKVF_E_INVALID_ARG when an un-rotated key is not finite. */
static int tr_sample(const tr_job *j, tr_scratch *w, q_rng *r, uint32_t l, uint32_t hh,
                     unsigned kv, size_t *got_out)
{
    const fkvf_rvq_params *p = j->p;
    const uint32_t H = p->n_kv_heads, Dk = p->key_dim, Dv = p->value_dim, rd = j->rd;
    const uint32_t dim = kv == 0 ? Dk : Dv;
    uint32_t h_lo = p->pooled ? 0 : hh, h_hi = p->pooled ? H : hh + 1;
    size_t seen = 0, got = 0, row = 0, n = j->n, pop = j->pop;
    int rc = FKVF_OK;
    for (size_t b = 0; b < j->n_blocks && got < n; b++) {
        const fkvf_rows *blk = &j->blocks[b];
        size_t es = fkvfq_dtype_size(blk->dtype), rb = j->elems_per_row * es;
        for (size_t i = 0; i < blk->n_rows && got < n; i++, row++) {
            int have_cs = j->cs_all != NULL;
            const double *cs = j->cs_all ? j->cs_all + row * rd : w->cs;
            for (uint32_t h = h_lo; h < h_hi && got < n; h++, seen++) {
                if ((double)(pop - seen) * rng_unit(r) >= (double)(n - got))
                    continue;
                size_t base = (size_t)l * H * ((size_t)Dk + Dv);
                size_t off = kv == 0 ? base + (size_t)h * Dk : base + (size_t)H * Dk + (size_t)h * Dv;
                float *x = w->x + got * dim;
                fkvfq_load(blk->dtype, (const uint8_t *)blk->data + i * rb + off * es, x, dim);
                if (kv == 0 && rd) {
                    if (!have_cs) {
                        fkvf_rope_angles(p->key_rope, j->freqs, blk->first_position + i, w->cs);
                        have_cs = 1;
                    }
                    fkvf_rope_rotate_f32(p->key_rope, cs, 1, x, 0);
                    for (uint32_t d = 0; d < dim; d++)
                        if (!isfinite(x[d]))
                            rc = FKVF_E_INVALID_ARG;
                }
                got++;
            }
        }
    }
    *got_out = got;
    return rc;
}

/* One stage table trained: report it (one call at a time, done counting up) */
static void tr_progress(tr_job *j)
{
    if (!j->p->progress)
        return;
    fkvf_par_enter(&j->lock);
    j->done++;
    j->p->progress(j->p->progress_opaque, j->done, j->todo);
    fkvf_par_leave(&j->lock);
}

/* The stages of table set `item` (tr_job), on worker `worker`'s scratch. */
static int tr_table(tr_job *j, unsigned worker, size_t item)
{
    fkvf_rvq *q = j->q;
    const fkvf_codebook_shape *sh = &q->shape;
    uint32_t l = (uint32_t)(item / 2 / sh->n_heads), hh = (uint32_t)(item / 2 % sh->n_heads);
    unsigned kv = (unsigned)(item % 2);
    unsigned ns = kv == 0 ? fkvf_layer_k_stages(j->want, l) : fkvf_layer_v_stages(j->want, l);
    if (!ns)
        return FKVF_OK;
    tr_scratch *w = &j->w[worker];
    const uint32_t dim = kv == 0 ? sh->key_dim : sh->value_dim;
    const size_t tab = (size_t)l * sh->n_heads + hh;
    q_rng r = tr_rng(j->p->seed, l, hh, kv);
    size_t got;
    int rc = tr_sample(j, w, &r, l, hh, kv, &got);
    if (rc)
        return rc;
    const double *u = kv == 0 ? j->uk : j->uv;
    if (u) { /* the metric's frame: U x */
        u += tab * dim * dim;
        for (size_t i = 0; i < got; i++) {
            fkvf_metric_apply(u, dim, w->x + i * dim, w->mt);
            memcpy(w->x + i * dim, w->mt, dim * sizeof(float));
        }
    }
    km m;
    memset(&m, 0, sizeof m);
    m.a = &q->alloc;
    m.u = u;
    m.sol = w->sol;
    m.x = w->x;
    m.xt = w->xt;
    m.n = got;
    m.dim = dim;
    m.k = sh->k;
    m.asg = w->asg;
    m.prev = w->prev;
    m.err = w->err;
    m.xx = w->xx;
    m.cum = w->cum;
    m.sums = w->sums;
    m.counts = w->counts;
    m.scores = w->scores;
    m.pmin = w->pmin;
    m.prep = w->prep;
    m.near = w->near;
    m.ub = w->ub;
    m.lb = w->lb;
    m.mv = w->mv;
    m.old = w->old;
    m.need = w->need;
    for (unsigned s = 0; s < ns; s++) {
        size_t off = fkvfq_table_off(q, tab, kv, s);
        size_t si = tab * ((size_t)sh->k_stages + sh->v_stages) +
                    (kv == 0 ? s : (size_t)sh->k_stages + s);
        m.rows = q->rows + off;
        m.orig = j->orig ? j->orig + off : NULL;
        m.panels = q->panels + off;
        m.norms = q->norms + si * sh->k;
        m.cmax = &q->cmax[si];
        q_rng rs = {mix64(r.s ^ mix64(UINT64_C(0x5157) + s))};
        km_stage(&m, &rs, j->p->max_iters, sh->dtype, NULL);
        w->asg = m.asg; /* km_stage swaps them */
        w->prev = m.prev;
        tr_progress(j);
    }
    return FKVF_OK;
}

static int tr_item(void *ctx, unsigned worker, size_t item)
{
    return tr_table(ctx, worker, item);
}

/* The codebook shape params ask for (without the layer table). */
static fkvf_codebook_shape train_shape(const fkvf_rvq_params *p)
{
    fkvf_codebook_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.n_layers = p->n_layers;
    sh.n_heads = p->pooled ? 1 : p->n_kv_heads;
    sh.key_dim = p->key_dim;
    sh.value_dim = p->value_dim;
    sh.k = p->k;
    sh.k_stages = p->k_stages;
    sh.v_stages = p->v_stages;
    sh.dtype = p->table_dtype;
    sh.pooled = p->pooled;
    return sh;
}

/* Every element of every block finite, and the blocks' sizes computable:
 * FKVF_OK, else FKVF_E_INVALID_ARG. */
static int blocks_finite(const fkvf_rows *blocks, size_t n_blocks, size_t elems_per_row)
{
    for (size_t b = 0; b < n_blocks; b++) {
        size_t es = fkvfq_dtype_size(blocks[b].dtype), rb, all;
        if (!fkvf_mulsz(elems_per_row, es, &rb) || !fkvf_mulsz(rb, blocks[b].n_rows, &all))
            return FKVF_E_INVALID_ARG;
        const uint8_t *d = blocks[b].data;
        for (size_t i = 0; i < all; i += es)
            if (elem_nonfinite(blocks[b].dtype, d + i))
                return FKVF_E_INVALID_ARG;
    }
    return FKVF_OK;
}

/* Train every table set of j->q on j->p's threads: the workers' scratch
 * and the rotation's angles made, the tables trained, the scratch freed.
 * total_rows: the rows of all blocks. */
static int tr_tables(tr_job *j, const fkvf_allocator *a, size_t total_rows)
{
    const fkvf_rvq_params *p = j->p;
    const fkvf_codebook_shape *sh = &j->q->shape;
    const uint32_t dmax = p->key_dim > p->value_dim ? p->key_dim : p->value_dim, rd = j->rd;
    /* the rotation's cosines and sines of every row, computed once for all
     * key tables when they take at most Q_CS_ALL_BYTES (else per row and
     * table, into one row's worth per worker) */
    size_t csb;
    double *freqs = NULL, *cs_all = NULL;
    const int keep_cs = rd && fkvf_mulsz(total_rows, (size_t)rd * sizeof(double), &csb) &&
                        csb <= Q_CS_ALL_BYTES && sh->k_stages;
    const size_t items = (size_t)sh->n_layers * sh->n_heads * 2;
    /* as many workers as the threads asked for, the items and the scratch
     * budget allow (each holds one table's sample and k-means' arrays) */
    const unsigned nt = fkvfq_train_threads(
        fkvf_par_threads(p->n_threads),
        tr_scratch_bytes(j->n, dmax, p->k, rd && !keep_cs ? rd : 0));
    const unsigned nw = fkvf_par_workers(nt, items);
    tr_scratch *ws = fkvf_calloc(a, nw, sizeof(tr_scratch));
    int ok = ws != NULL, rc = FKVF_OK;
    for (unsigned i = 0; ok && i < nw; i++)
        ok = tr_alloc(a, &ws[i], j->n, dmax, p->k, rd && !keep_cs ? rd : 0, p->metric != NULL);
    if (ok && rd)
        ok = (freqs = fkvf_calloc(a, rd / 2, sizeof(double))) &&
             (!keep_cs || (cs_all = fkvf_calloc(a, total_rows, (size_t)rd * sizeof(double))));
    if (ok) {
        if (rd)
            fkvf_rope_freqs(p->key_rope, freqs);
        if (cs_all)
            for (size_t b = 0, row = 0; b < j->n_blocks; b++)
                for (size_t i = 0; i < j->blocks[b].n_rows; i++, row++)
                    fkvf_rope_angles(p->key_rope, freqs, j->blocks[b].first_position + i,
                                     cs_all + row * rd);
        j->freqs = freqs;
        j->cs_all = cs_all;
        j->w = ws;
        for (uint32_t l = 0; l < sh->n_layers; l++)
            j->todo += (uint64_t)sh->n_heads * (fkvf_layer_k_stages(j->want, l) +
                                                (uint64_t)fkvf_layer_v_stages(j->want, l));
        rc = fkvf_par_for(nt, items, tr_item, j); /* one worker: this thread, in order */
    } else {
        rc = FKVF_E_NOMEM;
    }
    for (unsigned i = 0; ws && i < nw; i++)
        tr_free(a, &ws[i]);
    fkvf_free(a, ws);
    fkvf_free(a, freqs);
    fkvf_free(a, cs_all);
    return rc;
}

/* Under a metric: *q replaced by the handle of the tables in the codebook's
 * own frame, orig (fkvf_rvq_set_metric later gives it the encoder's U c
 * again). *q is freed either way; NULL on failure. */
static int tr_unmetric(fkvf_rvq **q, const fkvf_codebook_shape *sh, uint32_t heads,
                       const float *orig, const fkvf_allocator *a)
{
    fkvf_rvq *oq = NULL;
    size_t es = sh->dtype == FKVF_DTYPE_F16 ? 2 : 4, nb = (*q)->n_floats * es;
    uint8_t *raw = fkvf_malloc(a, nb ? nb : 1);
    int rc = FKVF_E_NOMEM;
    if (raw) {
        fkvfq_store(sh->dtype, orig, raw, (*q)->n_floats);
        rc = fkvf_rvq_from_tables(&oq, sh, heads, raw, nb, a);
        fkvf_free(a, raw);
    }
    fkvf_rvq_free(*q);
    *q = oq;
    return rc;
}

/* The trained handle as the caller gets it: prepared for encoding, or each
 * layer's tables taken into a per-layer handle (want has a layer table),
 * and the metric set. Frees q on failure. */
static int tr_finish(fkvf_rvq **out, fkvf_rvq *q, const fkvf_codebook_shape *want,
                     int prepared, const fkvf_rvq_metric *metric)
{
    int rc = FKVF_OK;
    const int per_layer = !fkvfq_lay_uniform(want);
    /* a per-layer training's handle is only the source of its layers' tables
     * (and one from fkvf_rvq_from_tables is prepared already) */
    if (!per_layer && !prepared && (rc = fkvfq_rvq_prepare(q))) {
        fkvf_rvq_free(q);
        return rc;
    }
    if (per_layer) {
        fkvf_rvq *lq;
        rc = fkvfq_rvq_take_layers(&lq, q, want);
        fkvf_rvq_free(q);
        if (rc)
            return rc;
        q = lq;
    }
    if (metric && (rc = fkvf_rvq_set_metric(q, metric))) {
        fkvf_rvq_free(q);
        return rc;
    }
    *out = q;
    return FKVF_OK;
}

FKVF_API int fkvf_rvq_train(fkvf_rvq **out, const fkvf_rvq_params *p,
                            const fkvf_rows *blocks, size_t n_blocks,
                            const fkvf_allocator *alloc)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    size_t total_rows;
    int rc = params_check(p, blocks, n_blocks, &total_rows);
    if (rc)
        return rc;
    fkvf_codebook_shape sh = train_shape(p);
    /* per-layer counts: the tables of every layer trained up to its own
     * counts in a handle of the maxima (the stages a layer does not use stay
     * untrained), then each layer's taken into a per-layer handle. Stage s
     * of a table depends only on the stages before it (and the seed), so a
     * layer's tables are those a uniform training at its counts makes. */
    fkvf_codebook_shape want = sh;
    want.layer_stages = p->layer_stages;
    const uint32_t H = p->n_kv_heads;
    /* row geometry and a full pass for non-finite values */
    size_t elems_per_row = (size_t)p->n_layers * H * ((size_t)p->key_dim + p->value_dim);
    if ((rc = blocks_finite(blocks, n_blocks, elems_per_row)))
        return rc;

    /* a metric is checked, and factored, before any work */
    double *uk = NULL, *uv = NULL;
    float *orig = NULL;
    if (p->metric && (rc = fkvfq_metric_factor(alloc, &sh, p->metric, &uk, &uv)))
        return rc;
    fkvf_rvq *q;
    if ((rc = fkvfq_rvq_alloc(&q, &sh, H, 0, alloc))) {
        fkvf_free(alloc, uk);
        fkvf_free(alloc, uv);
        return rc;
    }
    const fkvf_allocator al = q->alloc, *a = &al; /* outlives q (replaced under a metric) */
    /* training vectors per table: at most samples_per_centroid * k */
    size_t pop, cap;
    if (!fkvf_mulsz(total_rows, p->pooled ? H : 1, &pop))
        rc = FKVF_E_NOMEM;
    if (!fkvf_mulsz(p->samples_per_centroid, p->k, &cap))
        cap = SIZE_MAX;
    /* under a metric: the tables in the codebook's frame (q's rows hold U c,
     * what the encoder will search) */
    if (!rc && p->metric &&
        !(orig = fkvf_calloc(a, q->n_floats ? q->n_floats : 1, sizeof(float))))
        rc = FKVF_E_NOMEM;
    if (!rc) {
        tr_job j = {p, blocks, n_blocks, q, &want, elems_per_row, pop, pop < cap ? pop : cap,
                    p->key_rope ? p->key_rope->rope_dims : 0, NULL, NULL, uk, uv, orig, NULL,
                    FKVF_PAR_LOCK_INIT, 0, 0};
        rc = tr_tables(&j, a, total_rows);
    }
    fkvf_free(a, uk);
    fkvf_free(a, uv);
    const int from_tables = orig != NULL; /* tr_unmetric's handle is prepared */
    if (!rc && orig)
        rc = tr_unmetric(&q, &sh, H, orig, a);
    fkvf_free(a, orig);
    if (rc) {
        fkvf_rvq_free(q);
        return rc;
    }
    return tr_finish(out, q, &want, from_tables, p->metric);
}
