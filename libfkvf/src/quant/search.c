/* Nearest-centroid search: binary32 scores ||c||^2 - 2<x, c> computed four
 * vectors at a time from a panel copy of a table (fkvfq_scores4) or sixteen
 * at a time from its rows (fkvfq_scores_rows; the same bits), then an exact
 * pick among the near-best (binary64). Also the search layout of a table:
 * norms, cmax, duplicate rows, panels. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "half.h"
#include "quant.h"

static int rows_equal(const float *a, const float *b, uint32_t dim)
{
    for (uint32_t d = 0; d < dim; d++)
        if (!(a[d] == b[d]))
            return 0;
    return 1;
}

/* slots of the duplicate check's hash table: a power of two >= 2k */
static size_t dup_slots(uint32_t k)
{
    size_t n = 32;
    while (n < 2 * (size_t)k)
        n *= 2;
    return n;
}

/* ||c||^2 of one row (the search layout's definition; any fixed order
 * would do: the norm only filters candidates, within fkvfq_pick's rounding
 * bound, and equal rows must get equal norms): eight binary64 partial sums,
 * element d to sum d mod 8 in order of d, each square of a binary32 element
 * exact in binary64 and added with one rounding (no fused multiply-add:
 * -ffp-contract=off), then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)). */
/* the partial sums s of whole blocks of 8 done up to element d: the tail
 * added to sums 0.., then the sums added pairwise (both kernels end so) */
static inline __attribute__((always_inline)) double norm2_finish(double s[8], const float *r,
                                                                 uint32_t d, uint32_t dim)
{
    for (int l = 0; d < dim; d++, l++)
        s[l] += (double)r[d] * r[d];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* norm2_finish for f16 rows: the tail widened exactly first */
static inline __attribute__((always_inline)) double norm2_finish16(double s[8], const uint16_t *r,
                                                                   uint32_t d, uint32_t dim)
{
    float t[8];
    uint32_t n = dim - d; /* < 8 */
    for (uint32_t i = 0; i < n; i++)
        t[i] = fkvf_cvt_f16_to_f32(r[d + i]);
    return norm2_finish(s, t, 0, n);
}

static double norm2_portable(const float *r, uint32_t dim)
{
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t d = 0;
    for (; d + 8 <= dim; d += 8)
        for (int l = 0; l < 8; l++)
            s[l] += (double)r[d + l] * r[d + l];
    return norm2_finish(s, r, d, dim);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* norm2_portable for each of k rows, the eight partial sums in the lanes
 * of one register: the same additions */
__attribute__((target("avx512f"))) static void norms_avx512(const float *rows, uint32_t k,
                                                            uint32_t dim, double *n2)
{
    for (uint32_t c = 0; c < k; c++) {
        const float *r = rows + (size_t)c * dim;
        __m512d acc = _mm512_setzero_pd();
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8) {
            __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(r + d));
            acc = _mm512_add_pd(acc, _mm512_mul_pd(v, v));
        }
        double s[8];
        _mm512_storeu_pd(s, acc);
        n2[c] = norm2_finish(s, r, d, dim);
    }
}
#define Q_HAVE_NORMS512 1

/* norms_avx512 for f16 rows, each element widened exactly (the same
 * additions); returns nonzero if an element is an infinity or a NaN */
__attribute__((target("avx512f,f16c"))) static unsigned norms16_avx512(const uint16_t *rows,
                                                                      uint32_t k, uint32_t dim,
                                                                      double *n2)
{
    const __m128i ex = _mm_set1_epi16(0x7C00);
    __m128i bad = _mm_setzero_si128();
    for (uint32_t c = 0; c < k; c++) {
        const uint16_t *r = rows + (size_t)c * dim;
        __m512d acc = _mm512_setzero_pd();
        uint32_t d = 0;
        for (; d + 8 <= dim; d += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(r + d));
            bad = _mm_or_si128(bad, _mm_cmpeq_epi16(_mm_and_si128(h, ex), ex));
            __m512d v = _mm512_cvtps_pd(_mm256_cvtph_ps(h));
            acc = _mm512_add_pd(acc, _mm512_mul_pd(v, v));
        }
        double s[8];
        _mm512_storeu_pd(s, acc);
        for (uint32_t t = d; t < dim; t++) /* all bits set, as _mm_cmpeq_epi16 sets them */
            bad = _mm_or_si128(bad, _mm_set1_epi16((short)-((r[t] & 0x7C00u) == 0x7C00u)));
        n2[c] = norm2_finish16(s, r, d, dim);
    }
    return (unsigned)_mm_movemask_epi8(bad);
}
#endif

/* rows a and b of f16 values equal as binary32 values */
static int rows_equal16(const uint16_t *a, const uint16_t *b, uint32_t dim)
{
    for (uint32_t d = 0; d < dim; d++)
        if (!(fkvf_cvt_f16_to_f32(a[d]) == fkvf_cvt_f16_to_f32(b[d])))
            return 0;
    return 1;
}

static void dup_mark(const float *rows, const uint16_t *rows16, uint32_t k, uint32_t dim,
                     float *norms, void *scratch);

/* the norms of a panel of 16 rows into norms, their largest into *mx */
static void panel_norms(const double *n2, float *norms, double *mx)
{
    for (int i = 0; i < FKVFQ_PANEL; i++) {
        norms[i] = (float)n2[i];
        if (n2[i] > *mx)
            *mx = n2[i];
    }
}

/* a little above the true maximum norm */
static double norm_bound(double mx) { return sqrt(mx) * (1 + 0x1p-40); }

void fkvfq_table_norms(const float *rows, uint32_t k, uint32_t dim, float *norms, double *cmax,
                       void *scratch)
{
    /* ||c||^2 (norm2_portable) of every row, rounded to binary32 */
    double mx = 0;
    for (uint32_t c0 = 0; c0 < k; c0 += FKVFQ_PANEL) {
        double n2[FKVFQ_PANEL];
        const float *r = rows + (size_t)c0 * dim;
#ifdef Q_HAVE_NORMS512
        if (fkvf_cpu_avx512())
            norms_avx512(r, FKVFQ_PANEL, dim, n2);
        else
#endif
            for (int i = 0; i < FKVFQ_PANEL; i++)
                n2[i] = norm2_portable(r + (size_t)i * dim, dim);
        panel_norms(n2, norms + c0, &mx);
    }
    *cmax = norm_bound(mx);
    dup_mark(rows, NULL, k, dim, norms, scratch);
}

int fkvfq_table_norms16_usable(void)
{
#ifdef Q_HAVE_NORMS512
    return fkvf_cpu_avx512() && fkvf_cpu_f16c();
#else
    return 0;
#endif
}

int fkvfq_table_norms16(const uint16_t *rows, uint32_t k, uint32_t dim, float *norms,
                        double *cmax, void *scratch)
{
#ifdef Q_HAVE_NORMS512
    double mx = 0;
    unsigned bad = 0;
    for (uint32_t c0 = 0; c0 < k; c0 += FKVFQ_PANEL) {
        double n2[FKVFQ_PANEL];
        bad |= norms16_avx512(rows + (size_t)c0 * dim, FKVFQ_PANEL, dim, n2);
        panel_norms(n2, norms + c0, &mx);
    }
    if (bad)
        return 0;
    *cmax = norm_bound(mx);
    dup_mark(NULL, rows, k, dim, norms, scratch);
    return 1;
#else
    (void)rows;
    (void)k;
    (void)dim;
    (void)norms;
    (void)cmax;
    (void)scratch;
    return 0;
#endif
}

/* Duplicates (rows, or rows16 when rows is NULL) marked in norms. */
static void dup_mark(const float *rows, const uint16_t *rows16, uint32_t k, uint32_t dim,
                     float *norms, void *scratch)
{
    /* A centroid equal to one with a smaller index can never be the nearest
     * (ties go to the smaller index): an infinite norm keeps it out of the
     * candidates, so degenerate tables (all-zero late stages trained on
     * exhausted residuals) do not make every search a full re-check. Equal
     * rows have equal norms: a hash table keyed by the binary32 norm holds
     * the first centroid of every distinct row seen so far (equality of rows
     * is transitive, so comparing with those finds every duplicate); rows
     * are compared only when the norms are equal. An infinite norm (overflow)
     * stays infinite and is not entered. */
    uint32_t *slot = scratch;
    const size_t ns = dup_slots(k), mask = ns - 1;
    for (size_t i = 0; i < ns; i++)
        slot[i] = UINT32_MAX;
    for (uint32_t c = 0; c < k; c++) {
        float nc = norms[c];
        if (!isfinite(nc))
            continue;
        uint32_t bits;
        memcpy(&bits, &nc, sizeof bits);
        size_t h = (size_t)((bits * UINT64_C(0x9E3779B97F4A7C15)) >> 40) & mask;
        int dup = 0;
        for (; slot[h] != UINT32_MAX; h = (h + 1) & mask) {
            uint32_t e = slot[h];
            if (norms[e] == nc &&
                (rows ? rows_equal(rows + (size_t)e * dim, rows + (size_t)c * dim, dim)
                      : rows_equal16(rows16 + (size_t)e * dim, rows16 + (size_t)c * dim, dim))) {
                dup = 1;
                break;
            }
        }
        if (dup)
            norms[c] = INFINITY;
        else
            slot[h] = c;
    }
}

/* elements d0.. of the panel of 16 rows at r into pan (the copy's order) */
static void panel_copy(const float *r, uint32_t dim, uint32_t d0, float *pan)
{
    for (uint32_t d = d0; d < dim; d++)
        for (int i = 0; i < FKVFQ_PANEL; i++)
            pan[(size_t)d * FKVFQ_PANEL + i] = r[(size_t)i * dim + d];
}

#ifdef Q_HAVE_NORMS512
/* The same copy, 16 x 16 blocks transposed in registers: element d of
 * row i of a block goes to lane i of output d (exact copies of the values;
 * the elements past the last whole block as panel_copy). */
__attribute__((target("avx512f"))) static void panels_avx512(const float *rows, uint32_t k,
                                                             uint32_t dim, float *panels)
{
    for (uint32_t p = 0; p < k; p += FKVFQ_PANEL) {
        float *pan = panels + (size_t)p * dim;
        const float *r = rows + (size_t)p * dim;
        uint32_t d0 = 0;
        for (; d0 + 16 <= dim; d0 += 16) {
            __m512 a[16], b[16];
            for (int i = 0; i < 16; i++)
                a[i] = _mm512_loadu_ps(r + (size_t)i * dim + d0);
            /* pairs of rows interleaved within 128-bit lanes */
            for (int i = 0; i < 16; i += 2) {
                b[i] = _mm512_unpacklo_ps(a[i], a[i + 1]);
                b[i + 1] = _mm512_unpackhi_ps(a[i], a[i + 1]);
            }
            /* a[4g + m], 128-bit lane L: element 4L + m of rows 4g..4g+3 */
            for (int g = 0; g < 4; g++) {
                const __m512 *u = b + 4 * g;
                a[4 * g] = _mm512_shuffle_ps(u[0], u[2], _MM_SHUFFLE(1, 0, 1, 0));
                a[4 * g + 1] = _mm512_shuffle_ps(u[0], u[2], _MM_SHUFFLE(3, 2, 3, 2));
                a[4 * g + 2] = _mm512_shuffle_ps(u[1], u[3], _MM_SHUFFLE(1, 0, 1, 0));
                a[4 * g + 3] = _mm512_shuffle_ps(u[1], u[3], _MM_SHUFFLE(3, 2, 3, 2));
            }
            /* output 4L + m: lane L of a[m], a[4 + m], a[8 + m], a[12 + m] */
            for (int m = 0; m < 4; m++) {
                __m512 x = _mm512_shuffle_f32x4(a[m], a[4 + m], _MM_SHUFFLE(2, 0, 2, 0));
                __m512 y = _mm512_shuffle_f32x4(a[m], a[4 + m], _MM_SHUFFLE(3, 1, 3, 1));
                __m512 z = _mm512_shuffle_f32x4(a[8 + m], a[12 + m], _MM_SHUFFLE(2, 0, 2, 0));
                __m512 w = _mm512_shuffle_f32x4(a[8 + m], a[12 + m], _MM_SHUFFLE(3, 1, 3, 1));
                float *o = pan + (size_t)d0 * FKVFQ_PANEL;
                _mm512_storeu_ps(o + (size_t)m * FKVFQ_PANEL,
                                 _mm512_shuffle_f32x4(x, z, _MM_SHUFFLE(2, 0, 2, 0)));
                _mm512_storeu_ps(o + (size_t)(8 + m) * FKVFQ_PANEL,
                                 _mm512_shuffle_f32x4(x, z, _MM_SHUFFLE(3, 1, 3, 1)));
                _mm512_storeu_ps(o + (size_t)(4 + m) * FKVFQ_PANEL,
                                 _mm512_shuffle_f32x4(y, w, _MM_SHUFFLE(2, 0, 2, 0)));
                _mm512_storeu_ps(o + (size_t)(12 + m) * FKVFQ_PANEL,
                                 _mm512_shuffle_f32x4(y, w, _MM_SHUFFLE(3, 1, 3, 1)));
            }
        }
        panel_copy(r, dim, d0, pan);
    }
}
#endif

void fkvfq_table_panels(const float *rows, uint32_t k, uint32_t dim, float *panels)
{
#ifdef Q_HAVE_NORMS512
    if (fkvf_cpu_avx512()) {
        panels_avx512(rows, k, dim, panels);
        return;
    }
#endif
    /* written in their own order, the rows read 16 at a time */
    for (uint32_t p = 0; p < k; p += FKVFQ_PANEL)
        panel_copy(rows + (size_t)p * dim, dim, 0, panels + (size_t)p * dim);
}

void fkvfq_table_prepare(const float *rows, uint32_t k, uint32_t dim, float *panels,
                         float *norms, double *cmax, void *scratch)
{
    fkvfq_table_panels(rows, k, dim, panels);
    fkvfq_table_norms(rows, k, dim, norms, cmax, scratch);
}

size_t fkvfq_prepare_scratch(uint32_t k) { return dup_slots(k) * sizeof(uint32_t); }

/* The scoring kernels: four vectors against a panel of centroids at a time,
 * so every centroid element loaded is used four times, with the
 * accumulators held in registers (explicit vectors: GCC at -O2 keeps array
 * accumulators in memory). Every lane accumulates its dot product in order
 * d = 0..dim-1, with or without fused multiply-add; fkvfq_pick's rounding
 * bound covers both. */

/* pmin[j * (k/16) + p] = smallest of scores[j * k + 16p .. 16p + 15] */
static void panel_mins(const float *scores, uint32_t k, float *pmin)
{
    for (size_t i = 0; i < (size_t)FKVFQ_BLOCK * k; i += FKVFQ_PANEL) {
        float m = scores[i];
        for (int l = 1; l < FKVFQ_PANEL; l++)
            m = scores[i + l] < m ? scores[i + l] : m;
        pmin[i / FKVFQ_PANEL] = m;
    }
}

#if defined(__GNUC__) || defined(__clang__)
typedef float q_v4 __attribute__((vector_size(16)));

static inline q_v4 v4_load(const float *p)
{
    q_v4 v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void v4_store(float *p, q_v4 v) { memcpy(p, &v, sizeof v); }

/* 128-bit vectors (SSE2, NEON, or scalarized by the compiler): half a panel
 * (8 centroids) per pass, 8 accumulators. */
static void scores4_generic(const fkvfq_table *t, const float *const x[FKVFQ_BLOCK],
                            float *scores, float *pmin)
{
    const uint32_t k = t->k, dim = t->dim;
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    for (uint32_t p = 0; p < k; p += 8) {
        const float *pan = t->panels + (size_t)(p / FKVFQ_PANEL) * FKVFQ_PANEL * dim +
                           p % FKVFQ_PANEL;
        q_v4 a00 = {0, 0, 0, 0}, a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
             a30 = a00, a31 = a00;
        for (uint32_t d = 0; d < dim; d++) {
            const float *c = pan + (size_t)d * FKVFQ_PANEL;
            q_v4 c0 = v4_load(c), c1 = v4_load(c + 4);
            float v0 = x0[d], v1 = x1[d], v2 = x2[d], v3 = x3[d];
            a00 += v0 * c0;
            a01 += v0 * c1;
            a10 += v1 * c0;
            a11 += v1 * c1;
            a20 += v2 * c0;
            a21 += v2 * c1;
            a30 += v3 * c0;
            a31 += v3 * c1;
        }
        q_v4 n0 = v4_load(t->norms + p), n1 = v4_load(t->norms + p + 4);
        v4_store(scores + p, n0 - 2.0f * a00);
        v4_store(scores + p + 4, n1 - 2.0f * a01);
        v4_store(scores + k + p, n0 - 2.0f * a10);
        v4_store(scores + k + p + 4, n1 - 2.0f * a11);
        v4_store(scores + 2 * (size_t)k + p, n0 - 2.0f * a20);
        v4_store(scores + 2 * (size_t)k + p + 4, n1 - 2.0f * a21);
        v4_store(scores + 3 * (size_t)k + p, n0 - 2.0f * a30);
        v4_store(scores + 3 * (size_t)k + p + 4, n1 - 2.0f * a31);
    }
    panel_mins(scores, k, pmin);
}
#else
/* plain C for other compilers */
static void scores4_generic(const fkvfq_table *t, const float *const x[FKVFQ_BLOCK],
                            float *scores, float *pmin)
{
    const uint32_t k = t->k, dim = t->dim;
    for (unsigned j = 0; j < FKVFQ_BLOCK; j++)
        for (uint32_t c = 0; c < k; c++) {
            const float *pan = t->panels + (size_t)(c / FKVFQ_PANEL) * FKVFQ_PANEL * dim +
                               c % FKVFQ_PANEL;
            float a = 0;
            for (uint32_t d = 0; d < dim; d++)
                a += x[j][d] * pan[(size_t)d * FKVFQ_PANEL];
            scores[j * (size_t)k + c] = t->norms[c] - 2.0f * a;
        }
    panel_mins(scores, k, pmin);
}
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define Q_HAVE_AVX2 1
#include <immintrin.h>

/* AVX2 + FMA: a whole panel (16 centroids = 2 registers) per pass, 8
 * accumulators. */
__attribute__((target("avx2,fma"))) static void scores4_avx2(const fkvfq_table *t,
                                                             const float *const x[FKVFQ_BLOCK],
                                                             float *scores, float *pmin)
{
    const uint32_t k = t->k, dim = t->dim;
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    const __m256 two = _mm256_set1_ps(2.0f);
    for (uint32_t p = 0; p < k; p += FKVFQ_PANEL) {
        const float *pan = t->panels + (size_t)p * dim;
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00,
               a21 = a00, a30 = a00, a31 = a00;
        for (uint32_t d = 0; d < dim; d++) {
            const float *c = pan + (size_t)d * FKVFQ_PANEL;
            __m256 c0 = _mm256_loadu_ps(c), c1 = _mm256_loadu_ps(c + 8), b;
            b = _mm256_broadcast_ss(x0 + d);
            a00 = _mm256_fmadd_ps(b, c0, a00);
            a01 = _mm256_fmadd_ps(b, c1, a01);
            b = _mm256_broadcast_ss(x1 + d);
            a10 = _mm256_fmadd_ps(b, c0, a10);
            a11 = _mm256_fmadd_ps(b, c1, a11);
            b = _mm256_broadcast_ss(x2 + d);
            a20 = _mm256_fmadd_ps(b, c0, a20);
            a21 = _mm256_fmadd_ps(b, c1, a21);
            b = _mm256_broadcast_ss(x3 + d);
            a30 = _mm256_fmadd_ps(b, c0, a30);
            a31 = _mm256_fmadd_ps(b, c1, a31);
        }
        /* norm - 2 * acc; 2 * acc is exact, so one rounding as in the generic path */
        __m256 n0 = _mm256_loadu_ps(t->norms + p), n1 = _mm256_loadu_ps(t->norms + p + 8);
        __m256 s0, s1, mn;
        const size_t np = k / FKVFQ_PANEL, pi = p / FKVFQ_PANEL;
#define Q_OUT(j, lo, hi)                                                                   \
    s0 = _mm256_fnmadd_ps(two, lo, n0);                                                    \
    s1 = _mm256_fnmadd_ps(two, hi, n1);                                                    \
    _mm256_storeu_ps(scores + (j) * (size_t)k + p, s0);                                    \
    _mm256_storeu_ps(scores + (j) * (size_t)k + p + 8, s1);                                \
    mn = _mm256_min_ps(s0, s1);                                                            \
    mn = _mm256_min_ps(mn, _mm256_permute2f128_ps(mn, mn, 1));                             \
    mn = _mm256_min_ps(mn, _mm256_shuffle_ps(mn, mn, _MM_SHUFFLE(1, 0, 3, 2)));            \
    mn = _mm256_min_ps(mn, _mm256_shuffle_ps(mn, mn, _MM_SHUFFLE(2, 3, 0, 1)));            \
    pmin[(j) * np + pi] = _mm256_cvtss_f32(mn);
        Q_OUT(0, a00, a01)
        Q_OUT(1, a10, a11)
        Q_OUT(2, a20, a21)
        Q_OUT(3, a30, a31)
#undef Q_OUT
    }
}
/* AVX2 + FMA on the rows themselves (no panel copy): sixteen vectors in the
 * lanes of two registers (given transposed), four centroids at a time, two
 * accumulators per centroid (six loads per eight fused multiply-adds, as in
 * scores4_avx2). Every lane performs scores4_avx2's operations on the same
 * (vector, centroid) pair in the same order (fma(x[d], c[d], acc) for d =
 * 0..dim-1, then norm - 2 * acc with one rounding; the product inside a
 * fused multiply-add is exact, so the operand order does not matter), and
 * the panel minimums are reduced from the stored scores as there:
 * bit-identical scores and minimums, not-a-number ones included. */
__attribute__((target("avx2,fma"))) static inline void store4x8(__m256 c0, __m256 c1,
                                                                __m256 c2, __m256 c3,
                                                                float *s, size_t k,
                                                                unsigned n)
{
    /* c_i lane j = score of vector j, centroid i: vector j's four scores
     * go to s[j * k .. + 3] */
    __m256 t0 = _mm256_unpacklo_ps(c0, c1), t1 = _mm256_unpackhi_ps(c0, c1);
    __m256 t2 = _mm256_unpacklo_ps(c2, c3), t3 = _mm256_unpackhi_ps(c2, c3);
    __m256 v[4];
    v[0] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)); /* vectors 0 | 4 */
    v[1] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)); /* 1 | 5 */
    v[2] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)); /* 2 | 6 */
    v[3] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2)); /* 3 | 7 */
    for (unsigned j = 0; j < 4 && j < n; j++)
        _mm_storeu_ps(s + j * k, _mm256_castps256_ps128(v[j]));
    for (unsigned j = 4; j < 8 && j < n; j++)
        _mm_storeu_ps(s + j * k, _mm256_extractf128_ps(v[j - 4], 1));
}

__attribute__((target("avx2,fma"))) static void scores_rows_avx2(const fkvfq_table *t,
                                                                 const float *xt, unsigned n,
                                                                 float *scores, float *pmin)
{
    const uint32_t k = t->k, dim = t->dim;
    const size_t np = k / FKVFQ_PANEL;
    const __m256 two = _mm256_set1_ps(2.0f);
    for (uint32_t c0 = 0; c0 < k; c0 += 4) {
        const float *r0 = t->rows + (size_t)c0 * dim, *r1 = r0 + dim, *r2 = r1 + dim,
                    *r3 = r2 + dim;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0,
               b2 = a0, b3 = a0, c;
        for (uint32_t d = 0; d < dim; d++) {
            const float *xd = xt + (size_t)d * FKVFQ_LANES;
            __m256 xa = _mm256_loadu_ps(xd), xb = _mm256_loadu_ps(xd + 8);
            c = _mm256_broadcast_ss(r0 + d);
            a0 = _mm256_fmadd_ps(xa, c, a0);
            b0 = _mm256_fmadd_ps(xb, c, b0);
            c = _mm256_broadcast_ss(r1 + d);
            a1 = _mm256_fmadd_ps(xa, c, a1);
            b1 = _mm256_fmadd_ps(xb, c, b1);
            c = _mm256_broadcast_ss(r2 + d);
            a2 = _mm256_fmadd_ps(xa, c, a2);
            b2 = _mm256_fmadd_ps(xb, c, b2);
            c = _mm256_broadcast_ss(r3 + d);
            a3 = _mm256_fmadd_ps(xa, c, a3);
            b3 = _mm256_fmadd_ps(xb, c, b3);
        }
        const float *nm = t->norms + c0;
        __m256 n0 = _mm256_broadcast_ss(nm), n1 = _mm256_broadcast_ss(nm + 1),
               n2 = _mm256_broadcast_ss(nm + 2), n3 = _mm256_broadcast_ss(nm + 3);
        store4x8(_mm256_fnmadd_ps(two, a0, n0), _mm256_fnmadd_ps(two, a1, n1),
                 _mm256_fnmadd_ps(two, a2, n2), _mm256_fnmadd_ps(two, a3, n3), scores + c0, k,
                 n);
        if (n > 8)
            store4x8(_mm256_fnmadd_ps(two, b0, n0), _mm256_fnmadd_ps(two, b1, n1),
                     _mm256_fnmadd_ps(two, b2, n2), _mm256_fnmadd_ps(two, b3, n3),
                     scores + 8 * (size_t)k + c0, k, n - 8);
        if ((c0 + 4) % FKVFQ_PANEL)
            continue;
        /* a panel complete: its minimums, reduced as scores4_avx2 does */
        const uint32_t p = c0 + 4 - FKVFQ_PANEL;
        for (unsigned j = 0; j < n; j++) {
            const float *sj = scores + (size_t)j * k + p;
            __m256 mn = _mm256_min_ps(_mm256_loadu_ps(sj), _mm256_loadu_ps(sj + 8));
            mn = _mm256_min_ps(mn, _mm256_permute2f128_ps(mn, mn, 1));
            mn = _mm256_min_ps(mn, _mm256_shuffle_ps(mn, mn, _MM_SHUFFLE(1, 0, 3, 2)));
            mn = _mm256_min_ps(mn, _mm256_shuffle_ps(mn, mn, _MM_SHUFFLE(2, 3, 0, 1)));
            pmin[j * np + p / FKVFQ_PANEL] = _mm256_cvtss_f32(mn);
        }
    }
}

/* AVX-512: four panels (64 centroids = 4 registers) per pass, 16
 * accumulators (four loads and four broadcasts per sixteen fused
 * multiply-adds). Every lane performs scores4_avx2's operations on the same
 * (vector, centroid) pair in the same order (fma(x[d], c[d], acc) for d =
 * 0..dim-1, then norm - 2 * acc with one rounding), and each panel's
 * minimum is reduced from its two halves with scores4_avx2's sequence:
 * bit-identical scores and minimums, not-a-number ones included. A k that
 * is not a multiple of 64 ends with single panels. */
#define Q_HAVE_AVX512 1
#define Q_512 __attribute__((target("avx512f,avx2,fma")))

/* the smallest of a panel's 16 scores, reduced as scores4_avx2 does */
static Q_512 inline float panel_min512(__m512 s)
{
    __m256 s0 = _mm512_castps512_ps256(s),
           s1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
    __m256 mn = _mm256_min_ps(s0, s1);
    mn = _mm256_min_ps(mn, _mm256_permute2f128_ps(mn, mn, 1));
    mn = _mm256_min_ps(mn, _mm256_shuffle_ps(mn, mn, _MM_SHUFFLE(1, 0, 3, 2)));
    mn = _mm256_min_ps(mn, _mm256_shuffle_ps(mn, mn, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm256_cvtss_f32(mn);
}

Q_512 static void scores4_avx512(const fkvfq_table *t, const float *const x[FKVFQ_BLOCK],
                                 float *scores, float *pmin)
{
    const uint32_t k = t->k, dim = t->dim;
    const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    const __m512 two = _mm512_set1_ps(2.0f);
    const size_t np = k / FKVFQ_PANEL, pstride = (size_t)FKVFQ_PANEL * dim;
    uint32_t p = 0;
    for (; p + 4 * FKVFQ_PANEL <= k; p += 4 * FKVFQ_PANEL) {
        const float *pan = t->panels + (size_t)p * dim;
        __m512 a[4][4];
        for (int j = 0; j < 4; j++)
            for (int i = 0; i < 4; i++)
                a[j][i] = _mm512_setzero_ps();
        for (uint32_t d = 0; d < dim; d++) {
            const float *c = pan + (size_t)d * FKVFQ_PANEL;
            __m512 c0 = _mm512_loadu_ps(c), c1 = _mm512_loadu_ps(c + pstride),
                   c2 = _mm512_loadu_ps(c + 2 * pstride), c3 = _mm512_loadu_ps(c + 3 * pstride);
            __m512 b = _mm512_set1_ps(x0[d]);
            a[0][0] = _mm512_fmadd_ps(b, c0, a[0][0]);
            a[0][1] = _mm512_fmadd_ps(b, c1, a[0][1]);
            a[0][2] = _mm512_fmadd_ps(b, c2, a[0][2]);
            a[0][3] = _mm512_fmadd_ps(b, c3, a[0][3]);
            b = _mm512_set1_ps(x1[d]);
            a[1][0] = _mm512_fmadd_ps(b, c0, a[1][0]);
            a[1][1] = _mm512_fmadd_ps(b, c1, a[1][1]);
            a[1][2] = _mm512_fmadd_ps(b, c2, a[1][2]);
            a[1][3] = _mm512_fmadd_ps(b, c3, a[1][3]);
            b = _mm512_set1_ps(x2[d]);
            a[2][0] = _mm512_fmadd_ps(b, c0, a[2][0]);
            a[2][1] = _mm512_fmadd_ps(b, c1, a[2][1]);
            a[2][2] = _mm512_fmadd_ps(b, c2, a[2][2]);
            a[2][3] = _mm512_fmadd_ps(b, c3, a[2][3]);
            b = _mm512_set1_ps(x3[d]);
            a[3][0] = _mm512_fmadd_ps(b, c0, a[3][0]);
            a[3][1] = _mm512_fmadd_ps(b, c1, a[3][1]);
            a[3][2] = _mm512_fmadd_ps(b, c2, a[3][2]);
            a[3][3] = _mm512_fmadd_ps(b, c3, a[3][3]);
        }
        for (int i = 0; i < 4; i++) {
            const uint32_t pc = p + (uint32_t)i * FKVFQ_PANEL;
            __m512 n = _mm512_loadu_ps(t->norms + pc);
            for (int j = 0; j < 4; j++) {
                __m512 s = _mm512_fnmadd_ps(two, a[j][i], n);
                _mm512_storeu_ps(scores + (size_t)j * k + pc, s);
                pmin[(size_t)j * np + pc / FKVFQ_PANEL] = panel_min512(s);
            }
        }
    }
    for (; p < k; p += FKVFQ_PANEL) {
        const float *pan = t->panels + (size_t)p * dim;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (uint32_t d = 0; d < dim; d++) {
            __m512 c = _mm512_loadu_ps(pan + (size_t)d * FKVFQ_PANEL);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(x0[d]), c, a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(x1[d]), c, a1);
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(x2[d]), c, a2);
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(x3[d]), c, a3);
        }
        __m512 n = _mm512_loadu_ps(t->norms + p), acc[4] = {a0, a1, a2, a3};
        for (int j = 0; j < 4; j++) {
            __m512 s = _mm512_fnmadd_ps(two, acc[j], n);
            _mm512_storeu_ps(scores + (size_t)j * k + p, s);
            pmin[(size_t)j * np + p / FKVFQ_PANEL] = panel_min512(s);
        }
    }
}
#endif

/* the portable path on rows: per (vector, centroid) the plain binary32 sum
 * of products in order d = 0..dim-1, then norm - 2 * sum, as scores4_generic
 * computes each lane; panel minimums as panel_mins */
static void scores_rows_generic(const fkvfq_table *t, const float *xt, unsigned n,
                                float *scores, float *pmin)
{
    const uint32_t k = t->k, dim = t->dim;
    for (unsigned j = 0; j < n; j++) {
        float *sc = scores + (size_t)j * k;
        for (uint32_t c = 0; c < k; c++) {
            const float *row = t->rows + (size_t)c * dim;
            float a = 0;
            for (uint32_t d = 0; d < dim; d++)
                a += xt[(size_t)d * FKVFQ_LANES + j] * row[d];
            sc[c] = t->norms[c] - 2.0f * a;
        }
        for (uint32_t p = 0; p < k; p += FKVFQ_PANEL) {
            float m = sc[p];
            for (int l = 1; l < FKVFQ_PANEL; l++)
                m = sc[p + l] < m ? sc[p + l] : m;
            pmin[(size_t)j * (k / FKVFQ_PANEL) + p / FKVFQ_PANEL] = m;
        }
    }
}

void fkvfq_transpose_lanes(const float *x, size_t xstride, unsigned n, uint32_t dim, float *xt)
{
    for (unsigned j = 0; j < FKVFQ_LANES; j++) {
        const float *v = x + (size_t)(j < n ? j : n - 1) * xstride;
        for (uint32_t d = 0; d < dim; d++)
            xt[(size_t)d * FKVFQ_LANES + j] = v[d];
    }
}

void fkvfq_scores_rows(const fkvfq_table *t, const float *xt, unsigned n, float *scores,
                       float *pmin)
{
#ifdef Q_HAVE_AVX2
    if (fkvf_cpu_avx2()) {
        scores_rows_avx2(t, xt, n, scores, pmin);
        return;
    }
#endif
    scores_rows_generic(t, xt, n, scores, pmin);
}

void fkvfq_scores_rows_portable(const fkvfq_table *t, const float *xt, unsigned n,
                                float *scores, float *pmin)
{
    scores_rows_generic(t, xt, n, scores, pmin);
}

int fkvfq_isa(void)
{
#ifdef Q_HAVE_AVX512
    if (fkvf_cpu_avx512())
        return FKVFQ_ISA_AVX512;
#endif
#ifdef Q_HAVE_AVX2
    if (fkvf_cpu_avx2())
        return FKVFQ_ISA_AVX2;
#endif
    return FKVFQ_ISA_PORTABLE;
}

void fkvfq_scores4_isa(int isa, const fkvfq_table *t, const float *const x[FKVFQ_BLOCK],
                       float *scores, float *pmin)
{
    if (isa > fkvfq_isa())
        isa = fkvfq_isa();
#ifdef Q_HAVE_AVX512
    if (isa == FKVFQ_ISA_AVX512) {
        scores4_avx512(t, x, scores, pmin);
        return;
    }
#endif
#ifdef Q_HAVE_AVX2
    if (isa == FKVFQ_ISA_AVX2) {
        scores4_avx2(t, x, scores, pmin);
        return;
    }
#endif
    scores4_generic(t, x, scores, pmin);
}

void fkvfq_scores4_portable(const fkvfq_table *t, const float *const x[FKVFQ_BLOCK],
                            float *scores, float *pmin)
{
    scores4_generic(t, x, scores, pmin);
}

void fkvfq_scores4(const fkvfq_table *t, const float *const x[FKVFQ_BLOCK], float *scores,
                   float *pmin)
{
    fkvfq_scores4_isa(FKVFQ_ISA_AVX512, t, x, scores, pmin);
}

/* sum over d of (x[d] - c[d])^2 in binary64, in order (fkvfq_dist; inlined
 * into the kernels that call it, which then run it in their own encoding) */
static inline __attribute__((always_inline)) double dist_inl(const float *x, const float *c,
                                                            uint32_t dim)
{
    double s = 0;
    for (uint32_t d = 0; d < dim; d++) {
        double e = (double)x[d] - (double)c[d];
        s += e * e;
    }
    return s;
}

double fkvfq_dist(const float *x, const float *c, uint32_t dim) { return dist_inl(x, c, dim); }

/* dist_inl(x[i], c[i]) for i < 4: four independent chains, each the
 * additions of dist_inl in its order (the same values) */
static inline __attribute__((always_inline)) void dist4_inl(const float *const x[4],
                                                           const float *const c[4],
                                                           uint32_t dim, double out[4])
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (uint32_t d = 0; d < dim; d++) {
        double e0 = (double)x[0][d] - (double)c[0][d], e1 = (double)x[1][d] - (double)c[1][d],
               e2 = (double)x[2][d] - (double)c[2][d], e3 = (double)x[3][d] - (double)c[3][d];
        s0 += e0 * e0;
        s1 += e1 * e1;
        s2 += e2 * e2;
        s3 += e3 * e3;
    }
    out[0] = s0;
    out[1] = s1;
    out[2] = s2;
    out[3] = s3;
}

void fkvfq_dist4(const float *const x[4], const float *const c[4], uint32_t dim, double out[4])
{
    dist4_inl(x, c, dim, out);
}

/* the smallest binary32 value above f, for f finite or -infinity (f below
 * the value it is to bound: never +infinity or not-a-number here) */
static inline __attribute__((always_inline)) float next_up(float f)
{
    if (f == 0)
        return 0x1p-149f;
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    b = f > 0 ? b + 1 : b - 1;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* The threshold of fkvfq_pick: the best binary32 score (the smallest panel
 * minimum) plus twice the rounding bound E, rounded up to binary32. Rounding
 * bound (u = 2^-24): the binary32 score of c differs from the exact
 * ||c||^2 - 2<x, c> by at most u*||c||^2 (norm), 2*gamma_dim*||x||*||c||
 * (dot product, Cauchy-Schwarz) and u*|score| (subtraction), all below
 * u*(dim+2)*(cmax^2 + 2*||x||*cmax). E doubles that and adds a term for
 * underflow. The true nearest centroid scores at most 2E above the best
 * binary32 score, so only scores up to there are re-checked. xx is ||x||^2
 * (pick_xx). */
static inline __attribute__((always_inline)) double score_bound(const fkvfq_table *t, double xx)
{
    double xn = sqrt(xx) * (1 + 0x1p-40), cm = t->cmax;
    return (double)(t->dim + 4) * 0x1p-23 * (cm * cm + 2 * xn * cm) + (double)t->dim * 0x1p-120;
}

double fkvfq_score_bound(const fkvfq_table *t, double xx) { return score_bound(t, xx); }

static inline __attribute__((always_inline)) float pick_threshold(const fkvfq_table *t,
                                                                  const float *pmin, double xx)
{
    const uint32_t np = t->k / FKVFQ_PANEL;
    float bs = pmin[0];
    for (uint32_t p = 1; p < np; p++)
        bs = pmin[p] < bs ? pmin[p] : bs;
    double e = score_bound(t, xx);
    double thr = (double)bs + 2 * e;
    float thrf = (float)thr;
    if ((double)thrf < thr)
        thrf = next_up(thrf);
    return thrf;
}

/* ||x||^2 in binary64: four partial sums (element d to sum d mod 4 while
 * four remain, the rest to sum 0), added as (s0 + s1) + (s2 + s3) */
static double pick_xx_portable(const float *x, uint32_t dim)
{
    double xl[4] = {0, 0, 0, 0};
    uint32_t d = 0;
    for (; d + 4 <= dim; d += 4)
        for (int l = 0; l < 4; l++)
            xl[l] += (double)x[d + l] * x[d + l];
    for (; d < dim; d++)
        xl[0] += (double)x[d] * x[d];
    return (xl[0] + xl[1]) + (xl[2] + xl[3]);
}

/* The exact re-check among the candidates (scores <= thrf) of the panels
 * from first / FKVFQ_PANEL on: the smallest binary64 distance, ties to the
 * smallest index (candidates compared in index order; their distances
 * computed four at a time). *pd receives it. Inlined into each pick, so that
 * it runs in that pick's instruction encoding (a call from the AVX-512 pick
 * into legacy-SSE code ran this loop twice as slow). */
static inline __attribute__((always_inline)) uint32_t
pick_recheck(const fkvfq_table *t, const float *x, const float *scores, const float *pmin,
             float thrf, uint32_t first, double *pd)
{
    const uint32_t np = t->k / FKVFQ_PANEL, dim = t->dim;
    uint32_t pick = first, idx[4];
    const float *rp[4], *const xs[4] = {x, x, x, x};
    double best = -1, dd[4];
    unsigned nq = 0;
    for (uint32_t p = first / FKVFQ_PANEL; p < np; p++) {
        if (!(pmin[p] <= thrf))
            continue;
        for (uint32_t c = p * FKVFQ_PANEL; c < (p + 1) * FKVFQ_PANEL; c++) {
            if (!(scores[c] <= thrf))
                continue;
            idx[nq] = c;
            rp[nq++] = t->rows + (size_t)c * dim;
            if (nq < 4)
                continue;
            dist4_inl(xs, rp, dim, dd);
            for (unsigned i = 0; i < 4; i++)
                if (best < 0 || dd[i] < best) {
                    best = dd[i];
                    pick = idx[i];
                }
            nq = 0;
        }
    }
    for (unsigned i = 0; i < nq; i++) {
        double dc = dist_inl(x, rp[i], dim);
        if (best < 0 || dc < best) {
            best = dc;
            pick = idx[i];
        }
    }
    *pd = best;
    return pick;
}

/* xx < 0: compute ||x||^2 here */
static uint32_t pick_portable(const fkvfq_table *t, const float *x, double xx,
                              const float *scores, const float *pmin, double *dist)
{
    const uint32_t np = t->k / FKVFQ_PANEL;
    const float thrf = pick_threshold(t, pmin, xx >= 0 ? xx : pick_xx_portable(x, t->dim));
    /* candidates: scores <= thrf, found through the panel minimums */
    uint32_t pick = 0, first = UINT32_MAX, nc = 0;
    double pd = -1;
    for (uint32_t p = 0; p < np && nc < 2; p++) {
        if (!(pmin[p] <= thrf))
            continue;
        for (uint32_t c = p * FKVFQ_PANEL; c < (p + 1) * FKVFQ_PANEL; c++)
            if (scores[c] <= thrf) {
                if (first == UINT32_MAX)
                    first = c;
                if (++nc == 2)
                    break;
            }
    }
    if (nc == 1)
        pick = first;
    else if (nc > 1)
        pick = pick_recheck(t, x, scores, pmin, thrf, first, &pd);
    /* nc == 0: not-a-number inputs; centroid 0 */
    if (dist)
        *dist = pd >= 0 ? pd : dist_inl(x, t->rows + (size_t)pick * t->dim, t->dim);
    return pick;
}

#ifdef Q_HAVE_AVX512
/* The same with AVX-512: ||x||^2 (unless given) with the four partial sums
 * in the lanes of one register (the same additions in the same order), the
 * candidates counted from comparison masks instead of branches. */
Q_512 static uint32_t pick_avx512(const fkvfq_table *t, const float *x, double xx,
                                  const float *scores, const float *pmin, double *dist)
{
    const uint32_t np = t->k / FKVFQ_PANEL, dim = t->dim;
    if (!(xx >= 0)) {
        __m256d acc = _mm256_setzero_pd();
        uint32_t d = 0;
        for (; d + 4 <= dim; d += 4) {
            __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + d));
            acc = _mm256_add_pd(acc, _mm256_mul_pd(v, v));
        }
        double xl[4];
        _mm256_storeu_pd(xl, acc);
        for (; d < dim; d++)
            xl[0] += (double)x[d] * x[d];
        xx = (xl[0] + xl[1]) + (xl[2] + xl[3]);
    }
    const float thrf = pick_threshold(t, pmin, xx);
    const __m512 th = _mm512_set1_ps(thrf);
    uint32_t first = UINT32_MAX, nc = 0;
    for (uint32_t p0 = 0; p0 < np && nc < 2; p0 += 32) {
        /* the panel minimums were just stored one by one: scalar loads
         * (a vector load of them waits for the stores to retire) */
        uint32_t pm = 0, pe = np - p0 < 32 ? np - p0 : 32;
        for (uint32_t i = 0; i < pe; i++)
            pm |= (uint32_t)(pmin[p0 + i] <= thrf) << i;
        while (pm && nc < 2) {
            uint32_t p = p0 + (uint32_t)__builtin_ctz(pm);
            pm &= pm - 1;
            unsigned cm = _mm512_cmp_ps_mask(_mm512_loadu_ps(scores + (size_t)p * FKVFQ_PANEL),
                                             th, _CMP_LE_OQ);
            if (!cm)
                continue;
            if (first == UINT32_MAX)
                first = p * FKVFQ_PANEL + (uint32_t)__builtin_ctz(cm);
            nc += (uint32_t)__builtin_popcount(cm);
        }
    }
    uint32_t pick = 0;
    double pd = -1;
    if (nc == 1)
        pick = first;
    else if (nc > 1)
        pick = pick_recheck(t, x, scores, pmin, thrf, first, &pd);
    if (dist)
        *dist = pd >= 0 ? pd : dist_inl(x, t->rows + (size_t)pick * dim, dim);
    return pick;
}
#endif

uint32_t fkvfq_pick_isa(int isa, const fkvfq_table *t, const float *x, const float *scores,
                        const float *pmin, double *dist)
{
#ifdef Q_HAVE_AVX512
    if (isa >= FKVFQ_ISA_AVX512 && fkvf_cpu_avx512())
        return pick_avx512(t, x, -1, scores, pmin, dist);
#endif
    (void)isa;
    return pick_portable(t, x, -1, scores, pmin, dist);
}

uint32_t fkvfq_pick(const fkvfq_table *t, const float *x, const float *scores,
                    const float *pmin, double *dist)
{
    return fkvfq_pick_isa(FKVFQ_ISA_AVX512, t, x, scores, pmin, dist);
}

double fkvfq_norm2(const float *x, uint32_t dim) { return pick_xx_portable(x, dim); }

uint32_t fkvfq_pick_xx(const fkvfq_table *t, const float *x, double xx, const float *scores,
                       const float *pmin, double *dist)
{
#ifdef Q_HAVE_AVX512
    if (fkvf_cpu_avx512())
        return pick_avx512(t, x, xx, scores, pmin, dist);
#endif
    return pick_portable(t, x, xx, scores, pmin, dist);
}
