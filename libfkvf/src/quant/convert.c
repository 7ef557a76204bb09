/* Element conversions (f16, bf16, f32). */
#include <string.h>

#include "half.h"
#include "le.h"
#include "cpu.h"
#include "quant.h"

#define Q_LE_HOST FKVF_HOST_LE

static inline uint16_t q_ld16(const uint8_t *p)
{
#if Q_LE_HOST
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
#else
    return fkvf_ld16(p);
#endif
}
static inline void q_st16(uint8_t *p, uint16_t v)
{
#if Q_LE_HOST
    memcpy(p, &v, sizeof v);
#else
    fkvf_st16(p, v);
#endif
}
size_t fkvfq_dtype_size(fkvf_dtype dt)
{
    switch (dt) {
    case FKVF_DTYPE_F16:
    case FKVF_DTYPE_BF16:
        return 2;
    case FKVF_DTYPE_F32:
        return 4;
    }
    return 0;
}

#if defined(FKVF_HAVE_F16C) && Q_LE_HOST
#define Q_LOAD_F16C 1
/* f16 -> f32 with vcvtph2ps, 8 lanes at a time: exact, the same bits as
 * fkvf_cvt_f16_to_f32 on every pattern but the signaling NaNs (the
 * instruction sets their quiet bit), so a block with an infinity or NaN
 * lane (exponent all ones) goes through the scalar conversion instead.
 * bf16 -> f32 is a shift of the 16 bits into the upper half. */
__attribute__((target("avx2,f16c"))) static void load_f16c(fkvf_dtype dt, const uint8_t *src,
                                                          float *dst, size_t n)
{
    size_t i = 0;
    const __m128i em = _mm_set1_epi16(0x7C00);
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i));
        if (dt == FKVF_DTYPE_BF16) {
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                          _mm256_cvtepu16_epi32(h), 16)));
            continue;
        }
        if (_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(h, em), em))) {
            for (size_t j = i; j < i + 8; j++)
                dst[j] = fkvf_cvt_f16_to_f32(q_ld16(src + 2 * j));
            continue;
        }
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) {
        uint16_t v = q_ld16(src + 2 * i);
        dst[i] = dt == FKVF_DTYPE_F16 ? fkvf_cvt_f16_to_f32(v) : fkvf_cvt_bf16_to_f32(v);
    }
}
#endif

void fkvfq_load(fkvf_dtype dt, const uint8_t *src, float *dst, size_t n)
{
#ifdef Q_LOAD_F16C
    if (dt != FKVF_DTYPE_F32 && fkvf_cpu_f16c() && fkvf_cpu_avx2()) {
        load_f16c(dt, src, dst, n);
        return;
    }
#endif
    fkvfq_load_portable(dt, src, dst, n);
}

void fkvfq_load_portable(fkvf_dtype dt, const uint8_t *src, float *dst, size_t n)
{
    size_t i = 0;
    if (dt == FKVF_DTYPE_F16 || dt == FKVF_DTYPE_BF16) {
        uint16_t h[FKVF_CVT_BLOCK];
        for (; i + FKVF_CVT_BLOCK <= n; i += FKVF_CVT_BLOCK) {
#if Q_LE_HOST
            memcpy(h, src + 2 * i, sizeof h);
#else
            for (int j = 0; j < FKVF_CVT_BLOCK; j++)
                h[j] = fkvf_ld16(src + 2 * (i + j));
#endif
            if (dt == FKVF_DTYPE_F16)
                fkvf_cvt_f16_to_f32_blk(h, dst + i);
            else
                fkvf_cvt_bf16_to_f32_blk(h, dst + i);
        }
        for (; i < n; i++) {
            uint16_t v = q_ld16(src + 2 * i);
            dst[i] = dt == FKVF_DTYPE_F16 ? fkvf_cvt_f16_to_f32(v) : fkvf_cvt_bf16_to_f32(v);
        }
    } else {
#if Q_LE_HOST
        if (n)
            memcpy(dst, src, n * sizeof(float));
#else
        for (; i < n; i++)
            dst[i] = fkvf_cvt_bits_f32(fkvf_ld32(src + 4 * i));
#endif
    }
}

#if defined(FKVF_CVT_HAVE_VEC) && defined(__x86_64__) && Q_LE_HOST
#define Q_STORE_AVX2 1
/* the same with 8-lane vectors, for CPUs with AVX2 */
__attribute__((target("avx2"))) static void store_avx2(fkvf_dtype dt, const float *src,
                                                       uint8_t *dst, size_t n)
{
    size_t i = 0;
    uint16_t h[8];
    if (dt == FKVF_DTYPE_F16) {
        for (; i + 8 <= n; i += 8) {
            fkvf_cvt_f32_to_f16_8(src + i, h);
            memcpy(dst + 2 * i, h, sizeof h);
        }
        for (; i < n; i++)
            q_st16(dst + 2 * i, fkvf_cvt_f32_to_f16(src[i]));
    } else {
        for (; i + 8 <= n; i += 8) {
            fkvf_cvt_f32_to_bf16_8(src + i, h);
            memcpy(dst + 2 * i, h, sizeof h);
        }
        for (; i < n; i++)
            q_st16(dst + 2 * i, fkvf_cvt_f32_to_bf16(src[i]));
    }
}
#endif

void fkvfq_store(fkvf_dtype dt, const float *src, uint8_t *dst, size_t n)
{
#ifdef Q_STORE_AVX2
    if (dt != FKVF_DTYPE_F32 && fkvf_cpu_avx2()) {
        store_avx2(dt, src, dst, n);
        return;
    }
#endif
    fkvfq_store_portable(dt, src, dst, n);
}

void fkvfq_store_portable(fkvf_dtype dt, const float *src, uint8_t *dst, size_t n)
{
    size_t i = 0;
    if (dt == FKVF_DTYPE_F16 || dt == FKVF_DTYPE_BF16) {
        uint16_t h[FKVF_CVT_BLOCK];
        for (; i + FKVF_CVT_BLOCK <= n; i += FKVF_CVT_BLOCK) {
            if (dt == FKVF_DTYPE_F16)
                fkvf_cvt_f32_to_f16_blk(src + i, h);
            else
                fkvf_cvt_f32_to_bf16_blk(src + i, h);
#if Q_LE_HOST
            memcpy(dst + 2 * i, h, sizeof h);
#else
            for (int j = 0; j < FKVF_CVT_BLOCK; j++)
                fkvf_st16(dst + 2 * (i + j), h[j]);
#endif
        }
        for (; i < n; i++)
            q_st16(dst + 2 * i, dt == FKVF_DTYPE_F16 ? fkvf_cvt_f32_to_f16(src[i])
                                                     : fkvf_cvt_f32_to_bf16(src[i]));
    } else {
#if Q_LE_HOST
        if (n)
            memcpy(dst, src, n * sizeof(float));
#else
        for (; i < n; i++)
            fkvf_st32(dst + 4 * i, fkvf_cvt_f32_bits(src[i]));
#endif
    }
}

FKVF_API uint16_t fkvf_f32_to_f16(float f) { return fkvf_cvt_f32_to_f16(f); }
FKVF_API float fkvf_f16_to_f32(uint16_t h) { return fkvf_cvt_f16_to_f32(h); }
FKVF_API uint16_t fkvf_f32_to_bf16(float f) { return fkvf_cvt_f32_to_bf16(f); }
FKVF_API float fkvf_bf16_to_f32(uint16_t b) { return fkvf_cvt_bf16_to_f32(b); }

FKVF_API int fkvf_convert(fkvf_dtype to, void *dst, fkvf_dtype from, const void *src, size_t n)
{
    size_t es_from = fkvfq_dtype_size(from), es_to = fkvfq_dtype_size(to);
    if (!es_from || !es_to || (n && (!dst || !src)))
        return FKVF_E_INVALID_ARG;
    const uint8_t *s = src;
    uint8_t *d = dst;
    if (to == from) {
        if (n)
            memcpy(d, s, n * es_to); /* n * es_to bytes exist by contract */
        return FKVF_OK;
    }
    float tmp[256];
    for (size_t i = 0; i < n; i += 256) {
        size_t m = n - i < 256 ? n - i : 256;
        fkvfq_load(from, s + i * es_from, tmp, m);
        fkvfq_store(to, tmp, d + i * es_to, m);
    }
    return FKVF_OK;
}
