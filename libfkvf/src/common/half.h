/* Scalar f16 / bf16 <-> f32 conversions (IEEE 754 round to nearest, ties to
 * even), written branch-free so that loops over them vectorize.
 *
 *  - f32 -> f16: overflow (|x| >= 65520) gives infinity, subnormal results
 *    are rounded correctly, NaN stays NaN with the top 10 payload bits kept
 *    (the quiet bit is set only if the kept payload would be zero), so every
 *    f16 bit pattern survives f16 -> f32 -> f16 unchanged.
 *  - f32 -> bf16: the rounded upper half; NaN handled the same way.
 *  - f16 / bf16 -> f32: exact.
 *
 * The subnormal f16 path relies on a binary32 addition rounding to nearest
 * even (the default environment, no flush-to-zero).
 *
 * The library's one copy of these conversions: fkvf_convert and
 * fkvf_f32_to_f16 & co (quant/convert.c), training, encoding and decoding
 * use them, and read/ through fkvf_convert and the F16C store below. */
#ifndef FKVF_COMMON_HALF_H
#define FKVF_COMMON_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fkvf_cvt_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float fkvf_cvt_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float fkvf_cvt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7FFFu; /* exponent and mantissa */
    /* normal: move the fields into place and rebias the exponent 15 -> 127 */
    uint32_t normal = (em << 13) + UINT32_C(0x38000000);
    /* infinity / NaN: all-ones exponent, payload moved to the top */
    uint32_t special = (em << 13) | UINT32_C(0x7F800000);
    /* zero / subnormal: em units of 2^-24; exact in binary32 */
    uint32_t sub = fkvf_cvt_f32_bits((float)em * 0x1p-24f);
    uint32_t r = em >= 0x7C00u ? special : (em >= 0x0400u ? normal : sub);
    return fkvf_cvt_bits_f32(r | sign);
}

static inline uint16_t fkvf_cvt_f32_to_f16(float f)
{
    uint32_t x = fkvf_cvt_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & UINT32_C(0x7FFFFFFF);
    /* normal results (2^-14 <= |f| < 65520): drop 13 mantissa bits with
     * round-half-even; a carry out of the mantissa bumps the exponent, which
     * is what rounding up to the next binade (or to infinity) means */
    uint32_t nrm = (a - UINT32_C(0x38000000) + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
    /* subnormal results (|f| < 2^-14): in [0.5, 1) binary32 steps are 2^-24,
     * the f16 subnormal unit, so adding 0.5 rounds |f| to that grid */
    uint32_t sub = fkvf_cvt_f32_bits(fkvf_cvt_bits_f32(a) + 0.5f) - UINT32_C(0x3F000000);
    uint32_t pay = (a >> 13) & 0x3FFu;
    uint32_t nan = 0x7C00u | pay | (pay == 0 ? 0x200u : 0u);
    uint32_t r = a > UINT32_C(0x7F800000)
                     ? nan
                     : (a >= UINT32_C(0x477FF000) ? 0x7C00u
                                                  : (a >= UINT32_C(0x38800000) ? nrm : sub));
    return (uint16_t)(r | sign);
}

static inline float fkvf_cvt_bf16_to_f32(uint16_t b)
{
    return fkvf_cvt_bits_f32((uint32_t)b << 16);
}

static inline uint16_t fkvf_cvt_f32_to_bf16(float f)
{
    uint32_t x = fkvf_cvt_f32_bits(f);
    uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    uint32_t hi = x >> 16;
    uint32_t nan = hi | ((hi & 0x7Fu) == 0 ? 0x40u : 0u);
    uint32_t r = (x & UINT32_C(0x7FFFFFFF)) > UINT32_C(0x7F800000) ? nan : rounded;
    return (uint16_t)r;
}

/* ---- blocks of FKVF_CVT_BLOCK elements ---------------------------------------------
 * The same conversions on fixed-size blocks, bit-identical to the scalar
 * functions above (tests compare them on every f16 pattern and many f32
 * ones). With GCC or clang they use the compilers' generic vector types:
 * branch-free lane-wise integer and float operations, lowered to whatever
 * vector unit the target (or a function's target attribute) has. Vectors
 * never cross a function boundary by value, so there is no vector ABI
 * involved. Halves are host-order uint16; callers handle byte order. */
#define FKVF_CVT_BLOCK 16

#if defined(__GNUC__) || defined(__clang__)
#define FKVF_CVT_HAVE_VEC 1
/* 4 lanes: one SSE2 / NEON register (wider generic vectors are lowered lane
 * by lane for comparisons on SSE2) */
#define FKVF_CVT_VBYTES 16
#define FKVF_CVT_VSFX _4
#include "half_vec.h"
/* 8 lanes: for functions compiled with target("avx2") */
#define FKVF_CVT_VBYTES 32
#define FKVF_CVT_VSFX _8
#include "half_vec.h"

static inline void fkvf_cvt_f32_to_f16_blk(const float *src, uint16_t *out)
{
    for (int i = 0; i < FKVF_CVT_BLOCK; i += 4)
        fkvf_cvt_f32_to_f16_4(src + i, out + i);
}
static inline void fkvf_cvt_f16_to_f32_blk(const uint16_t *h, float *dst)
{
    for (int i = 0; i < FKVF_CVT_BLOCK; i += 4)
        fkvf_cvt_f16_to_f32_4(h + i, dst + i);
}
static inline void fkvf_cvt_f32_to_bf16_blk(const float *src, uint16_t *out)
{
    for (int i = 0; i < FKVF_CVT_BLOCK; i += 4)
        fkvf_cvt_f32_to_bf16_4(src + i, out + i);
}
static inline void fkvf_cvt_bf16_to_f32_blk(const uint16_t *h, float *dst)
{
    for (int i = 0; i < FKVF_CVT_BLOCK; i += 4)
        fkvf_cvt_bf16_to_f32_4(h + i, dst + i);
}
#else
static inline void fkvf_cvt_f32_to_f16_blk(const float *src, uint16_t *out)
{
    for (int i = 0; i < FKVF_CVT_BLOCK; i++)
        out[i] = fkvf_cvt_f32_to_f16(src[i]);
}
static inline void fkvf_cvt_f16_to_f32_blk(const uint16_t *h, float *dst)
{
    for (int i = 0; i < FKVF_CVT_BLOCK; i++)
        dst[i] = fkvf_cvt_f16_to_f32(h[i]);
}
static inline void fkvf_cvt_f32_to_bf16_blk(const float *src, uint16_t *out)
{
    for (int i = 0; i < FKVF_CVT_BLOCK; i++)
        out[i] = fkvf_cvt_f32_to_bf16(src[i]);
}
static inline void fkvf_cvt_bf16_to_f32_blk(const uint16_t *h, float *dst)
{
    for (int i = 0; i < FKVF_CVT_BLOCK; i++)
        dst[i] = fkvf_cvt_bf16_to_f32(h[i]);
}
#endif

/* ---- F16C (x86-64 with GCC or clang) -------------------------------------------
 * binary32 -> f16 with the vcvtps2ph instruction, round to nearest even (the
 * immediate; MXCSR not consulted): the same bits as fkvf_cvt_f32_to_f16 on every
 * finite value, on infinities and on every quiet NaN (payload truncated, quiet
 * bit kept). It would differ only on signaling NaNs (the instruction sets the
 * quiet bit), which decoding cannot produce: table entries are finite, sums of
 * finite binary32 values are finite or infinite, and the rotation's only NaN
 * is the default (quiet) NaN of inf - inf. The one copy of this store, used by
 * fkvf_rvq_decode (restore) and fkvf_reader_read (random access); callers
 * check fkvf_cpu_f16c() (common/cpu.h) first. */
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define FKVF_HAVE_F16C 1
#include <immintrin.h>

/* 8 lanes of a as f16 at dst (16 bytes, any alignment) */
static inline __attribute__((target("avx,f16c"))) void fkvf_f16c_put8(__m256 a, uint8_t *dst)
{
    _mm_storeu_si128((__m128i *)(void *)dst, _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
}

/* n values at src as f16 at dst (little-endian, any alignment): blocks of 8
 * by fkvf_f16c_put8, the tail by fkvf_cvt_f32_to_f16 */
static inline __attribute__((target("avx,f16c"))) void fkvf_f16c_store(uint8_t *dst,
                                                                       const float *src,
                                                                       size_t n)
{
    size_t whole = n - n % 8; /* the tail counted apart: gcc -O3 misreads a
                               * loop that goes on from the blocks' index */
    for (size_t i = 0; i < whole; i += 8)
        fkvf_f16c_put8(_mm256_loadu_ps(src + i), dst + 2 * i);
    for (size_t k = 0; k < n % 8; k++) {
        uint16_t h = fkvf_cvt_f32_to_f16(src[whole + k]);
        memcpy(dst + 2 * (whole + k), &h, sizeof h);
    }
}
#endif

#endif
