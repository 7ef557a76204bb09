/* Vectors from f16 rows to f16 with AVX-512 (vec16.h): one at a time, or a
 * pass of positions times vectors. */
#include "vec16.h"

#include "cpu.h"

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define VEC16_X86 1
#include <immintrin.h>

#define V16 __attribute__((target("avx512f")))
#define V16I __attribute__((target("avx512f"), always_inline)) inline

/* components d..d+15 of the sum of the rows, from +0.0 in stage order */
static V16I __m512 sum16(const void *const *rows, unsigned ns, uint32_t d)
{
    __m512 a = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (unsigned s = 0; s < ns; s++)
        a = _mm512_add_ps(a, _mm512_cvtph_ps(_mm256_loadu_si256(
                                 (const __m256i *)(const void *)((const uint16_t *)rows[s] + d))));
    return a;
}

static V16I __m256 lo8(__m512 a)
{
    return _mm512_castps512_ps256(a);
}

static V16I __m256 hi8(__m512 a)
{
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
}

static V16I __m512 join8(__m256 lo, __m256 hi)
{
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)),
                                               _mm256_castps_pd(hi), 1));
}

/* fkvf_rope_turn (rope.h) on eight pairs (x0[j], x1[j]), cosines co[0..7],
 * sines si[0..7]: x0 c - x1 s and x0 s + x1 c in binary64 (no fused
 * multiply-add: the build passes -ffp-contract=off), each rounded once */
static V16I void turn8(__m256 x0f, __m256 x1f, const double *co, const double *si,
                             __m256 *y0, __m256 *y1)
{
    __m512d x0 = _mm512_cvtps_pd(x0f), x1 = _mm512_cvtps_pd(x1f);
    __m512d c = _mm512_loadu_pd(co), s = _mm512_loadu_pd(si);
    *y0 = _mm512_cvtpd_ps(_mm512_sub_pd(_mm512_mul_pd(x0, c), _mm512_mul_pd(x1, s)));
    *y1 = _mm512_cvtpd_ps(_mm512_add_pd(_mm512_mul_pd(x0, s), _mm512_mul_pd(x1, c)));
}

/* 16 lanes as f16 at dst (32 bytes; nt: 16-byte aligned, streamed) */
static V16I void put16(uint8_t *dst, __m512 a, int nt)
{
    __m256i h = _mm512_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT);
    if (nt) {
        _mm_stream_si128((__m128i *)(void *)dst, _mm256_castsi256_si128(h));
        _mm_stream_si128((__m128i *)(void *)(dst + 16), _mm256_extracti128_si256(h, 1));
    } else {
        _mm256_storeu_si256((__m256i *)(void *)dst, h);
    }
}

/* the vector at dst: store_avx512 below; always inlined so that a constant
 * ns unrolls the stage loops */
static V16I void
vec_body(uint8_t *dst, const void *const *rows, unsigned ns, uint32_t dim, uint8_t layout,
         uint32_t rd, const double *cs, int nt)
{
    const uint32_t half = rd / 2;
    const double *co = cs, *si = cs + half;
    __m256 y0, y1, z0, z1;
    if (rd && layout == 2) { /* pairs (i, i + half): blocks d and d + half together */
        for (uint32_t d = 0; d < half; d += 16) {
            __m512 a = sum16(rows, ns, d), b = sum16(rows, ns, d + half);
            turn8(lo8(a), lo8(b), co + d, si + d, &y0, &y1);
            turn8(hi8(a), hi8(b), co + d + 8, si + d + 8, &z0, &z1);
            put16(dst + 2 * d, join8(y0, z0), nt);
            put16(dst + 2 * (d + half), join8(y1, z1), nt);
        }
    } else if (rd) { /* pairs (2i, 2i + 1): block d holds pairs d/2 .. d/2 + 7 */
        const __m512i split = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11,
                                                13, 15);
        const __m512i back = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14,
                                               7, 15);
        for (uint32_t d = 0; d < rd; d += 16) {
            __m512 x = _mm512_permutexvar_ps(split, sum16(rows, ns, d));
            turn8(lo8(x), hi8(x), co + d / 2, si + d / 2, &y0, &y1);
            put16(dst + 2 * d, _mm512_permutexvar_ps(back, join8(y0, y1)), nt);
        }
    }
    for (uint32_t d = rd; d < dim; d += 16)
        put16(dst + 2 * d, sum16(rows, ns, d), nt);
}

static V16 void store_avx512(uint8_t *dst, const void *const *rows, unsigned ns, uint32_t dim,
                             uint8_t layout, uint32_t rd, const double *cs, int nt)
{
    vec_body(dst, rows, ns, dim, layout, rd, cs, nt);
}

/* vector v of the pass's position i (output row at row, angles cs): its
 * rows found from the codes, those of position i + p->prefetch prefetched
 * when ahead; always inlined so that a constant ns unrolls every stage loop */
static V16I void one_vec(const fkvf_vec16_pass *p, const fkvf_vec16_vec *v, size_t i,
                         const double *cs, int ahead, unsigned ns, int nt)
{
    const size_t cst = p->code_stride;
    const uint16_t *cp = v->code + i * p->pos_stride;
    const void *rows[16];
#pragma GCC unroll 16
    for (unsigned s = 0; s < ns; s++)
        rows[s] = v->tab + s * v->stage_stride + (size_t)cp[s * cst] * v->dim;
    if (ahead) {
        const uint16_t *cq = cp + p->prefetch * p->pos_stride;
#pragma GCC unroll 16
        for (unsigned s = 0; s < ns; s++) {
            const char *r =
                (const char *)(v->tab + s * v->stage_stride + (size_t)cq[s * cst] * v->dim);
            for (size_t b = 0; b < v->dim * sizeof(uint16_t); b += 64)
                _mm_prefetch(r + b, _MM_HINT_T0);
        }
    }
    vec_body(v->dst + i * v->dst_stride, rows, ns, v->dim, v->layout, v->rd, cs, nt);
}

/* the pass, nt fixed for the compiler; one_vec with ns a constant for the
 * usual stage counts */
static V16I void group_body(const fkvf_vec16_pass *p, int nt)
{
    for (size_t i = 0; i < p->n_pos; i++) {
        const double *cs = p->cs ? p->cs + i * p->cs_stride : NULL;
        const int ahead = p->prefetch && i + p->prefetch < p->n_pos;
        for (unsigned j = 0; j < p->nv; j++) {
            const fkvf_vec16_vec *v = &p->v[j];
            switch (v->ns) {
            case 1: one_vec(p, v, i, cs, ahead, 1, nt); break;
            case 2: one_vec(p, v, i, cs, ahead, 2, nt); break;
            case 3: one_vec(p, v, i, cs, ahead, 3, nt); break;
            case 4: one_vec(p, v, i, cs, ahead, 4, nt); break;
            case 8: one_vec(p, v, i, cs, ahead, 8, nt); break;
            default: one_vec(p, v, i, cs, ahead, v->ns, nt); break;
            }
        }
    }
}

static V16 void group_avx512(const fkvf_vec16_pass *p)
{
    if (p->nt)
        group_body(p, 1);
    else
        group_body(p, 0);
}
#endif

int fkvf_vec16_usable(uint32_t dim, uint32_t rd, uint8_t layout)
{
#ifdef VEC16_X86
    if (!fkvf_cpu_avx512() || dim % 16 || rd > dim)
        return 0;
    if (rd == 0)
        return 1;
    return layout == 2 ? rd % 32 == 0 : layout == 1 ? rd % 16 == 0 : 0;
#else
    (void)dim;
    (void)rd;
    (void)layout;
    return 0;
#endif
}

void fkvf_vec16_group(const fkvf_vec16_pass *p)
{
#ifdef VEC16_X86
    group_avx512(p);
#else
    (void)p;
#endif
}

void fkvf_vec16_store(uint8_t *dst, const void *const *rows, unsigned ns, uint32_t dim,
                      uint8_t layout, uint32_t rd, const double *cs, int nt)
{
#ifdef VEC16_X86
    store_avx512(dst, rows, ns, dim, layout, rd, cs, nt);
#else
    (void)nt;
    (void)dst;
    (void)rows;
    (void)ns;
    (void)dim;
    (void)layout;
    (void)rd;
    (void)cs;
#endif
}
