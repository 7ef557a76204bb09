/* Element conversions (f16, bf16, f32) and the RoPE rotation of spec 8.1. */
#include <math.h>
#include <string.h>

#include "half.h"
#include "le.h"
#include "cpu.h"
#include "quant.h"

#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define Q_LE_HOST 1
#else
#define Q_LE_HOST 0
#endif

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

void fkvfq_load(fkvf_dtype dt, const uint8_t *src, float *dst, size_t n)
{
    size_t i = 0;
    if (dt == FKVF_DTYPE_F16 || dt == FKVF_DTYPE_BF16) {
        uint16_t h[FKVFQ_CVT];
        for (; i + FKVFQ_CVT <= n; i += FKVFQ_CVT) {
#if Q_LE_HOST
            memcpy(h, src + 2 * i, sizeof h);
#else
            for (int j = 0; j < FKVFQ_CVT; j++)
                h[j] = fkvf_ld16(src + 2 * (i + j));
#endif
            if (dt == FKVF_DTYPE_F16)
                fkvfq_f16_to_f32_blk(h, dst + i);
            else
                fkvfq_bf16_to_f32_blk(h, dst + i);
        }
        for (; i < n; i++) {
            uint16_t v = q_ld16(src + 2 * i);
            dst[i] = dt == FKVF_DTYPE_F16 ? fkvfq_f16_to_f32(v) : fkvfq_bf16_to_f32(v);
        }
    } else {
#if Q_LE_HOST
        if (n)
            memcpy(dst, src, n * sizeof(float));
#else
        for (; i < n; i++)
            dst[i] = fkvfq_bits_f32(fkvf_ld32(src + 4 * i));
#endif
    }
}

#if defined(FKVFQ_HAVE_VEC) && defined(__x86_64__) && Q_LE_HOST
#define Q_STORE_AVX2 1
/* the same with 8-lane vectors, for CPUs with AVX2 */
__attribute__((target("avx2"))) static void store_avx2(fkvf_dtype dt, const float *src,
                                                       uint8_t *dst, size_t n)
{
    size_t i = 0;
    uint16_t h[8];
    if (dt == FKVF_DTYPE_F16) {
        for (; i + 8 <= n; i += 8) {
            fkvfq_f32_to_f16_8(src + i, h);
            memcpy(dst + 2 * i, h, sizeof h);
        }
        for (; i < n; i++)
            q_st16(dst + 2 * i, fkvfq_f32_to_f16(src[i]));
    } else {
        for (; i + 8 <= n; i += 8) {
            fkvfq_f32_to_bf16_8(src + i, h);
            memcpy(dst + 2 * i, h, sizeof h);
        }
        for (; i < n; i++)
            q_st16(dst + 2 * i, fkvfq_f32_to_bf16(src[i]));
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
        uint16_t h[FKVFQ_CVT];
        for (; i + FKVFQ_CVT <= n; i += FKVFQ_CVT) {
            if (dt == FKVF_DTYPE_F16)
                fkvfq_f32_to_f16_blk(src + i, h);
            else
                fkvfq_f32_to_bf16_blk(src + i, h);
#if Q_LE_HOST
            memcpy(dst + 2 * i, h, sizeof h);
#else
            for (int j = 0; j < FKVFQ_CVT; j++)
                fkvf_st16(dst + 2 * (i + j), h[j]);
#endif
        }
        for (; i < n; i++)
            q_st16(dst + 2 * i,
                   dt == FKVF_DTYPE_F16 ? fkvfq_f32_to_f16(src[i]) : fkvfq_f32_to_bf16(src[i]));
    } else {
#if Q_LE_HOST
        if (n)
            memcpy(dst, src, n * sizeof(float));
#else
        for (; i < n; i++)
            fkvf_st32(dst + 4 * i, fkvfq_f32_bits(src[i]));
#endif
    }
}

FKVF_API uint16_t fkvf_f32_to_f16(float f) { return fkvfq_f32_to_f16(f); }
FKVF_API float fkvf_f16_to_f32(uint16_t h) { return fkvfq_f16_to_f32(h); }
FKVF_API uint16_t fkvf_f32_to_bf16(float f) { return fkvfq_f32_to_bf16(f); }
FKVF_API float fkvf_bf16_to_f32(uint16_t b) { return fkvfq_bf16_to_f32(b); }

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

/* ---- RoPE (spec 8.1) ------------------------------------------------------- */

int fkvfq_rope_valid(const fkvf_rope *r, uint32_t key_dim)
{
    return r && (r->layout == 1 || r->layout == 2) && r->rope_dims >= 2 &&
           r->rope_dims % 2 == 0 && r->rope_dims <= key_dim && isfinite(r->theta) &&
           r->theta > 0;
}

/* theta^(-2i / rope_dims) */
static double inv_freq(const fkvf_rope *r, uint32_t i)
{
    return pow(r->theta, -(double)(2 * (uint64_t)i) / (double)r->rope_dims);
}

/* cos and sin of angle(t, i) = t * theta^(-2i / rope_dims), binary64 */
static void cs_of(double freq, uint64_t t, double cs[2])
{
    double a = (double)t * freq;
    cs[0] = cos(a);
    cs[1] = sin(a);
}

static void pair_cs(const fkvf_rope *r, uint64_t t, uint32_t i, double cs[2])
{
    cs_of(inv_freq(r, i), t, cs);
}

/* components of pair i: interleaved (2i, 2i+1), half-split (i, i + rope_dims/2) */
static inline size_t pair_j0(const fkvf_rope *r, uint32_t i)
{
    return r->layout == 1 ? 2 * (size_t)i : i;
}
static inline size_t pair_j1(const fkvf_rope *r, uint32_t i)
{
    return r->layout == 1 ? 2 * (size_t)i + 1 : (size_t)i + r->rope_dims / 2;
}

/* R(a) on one pair; inverse = R(-a) (cos(-a) = cos a, sin(-a) = -sin a) */
static inline void rot_pair(const double cs[2], int inverse, double *x0, double *x1)
{
    double c = cs[0], s = inverse ? -cs[1] : cs[1];
    double a = *x0, b = *x1;
    *x0 = a * c - b * s;
    *x1 = a * s + b * c;
}

void fkvfq_rope_freqs(const fkvf_rope *r, double *freqs)
{
    for (uint32_t i = 0; i < r->rope_dims / 2; i++)
        freqs[i] = inv_freq(r, i);
}

void fkvfq_rope_angles(const fkvf_rope *r, const double *freqs, uint64_t t, double *cs)
{
    uint32_t half = r->rope_dims / 2;
    for (uint32_t i = 0; i < half; i++) {
        double pc[2];
        cs_of(freqs[i], t, pc);
        cs[i] = pc[0];
        cs[half + i] = pc[1];
    }
}

/* Pairs i0..i0+3 (or the tail) of a vector of T (float or double), in
 * binary64: the same operations as rot_pair, in blocks the compiler can
 * vectorize. A: first components, B: second ones, step between pairs. */
#define Q_ROT_BLOCKS(T, A, B, STEP)                                                        \
    do {                                                                                   \
        uint32_t i = 0;                                                                    \
        for (; i + 4 <= half; i += 4)                                                      \
            for (int j = 0; j < 4; j++) {                                                  \
                double c = co[i + j], s = sg * si[i + j];                                  \
                double x0 = (A)[(size_t)(i + j) * (STEP)], x1 = (B)[(size_t)(i + j) * (STEP)]; \
                (A)[(size_t)(i + j) * (STEP)] = (T)(x0 * c - x1 * s);                      \
                (B)[(size_t)(i + j) * (STEP)] = (T)(x0 * s + x1 * c);                      \
            }                                                                              \
        for (; i < half; i++) {                                                            \
            double c = co[i], s = sg * si[i];                                              \
            double x0 = (A)[(size_t)i * (STEP)], x1 = (B)[(size_t)i * (STEP)];             \
            (A)[(size_t)i * (STEP)] = (T)(x0 * c - x1 * s);                                \
            (B)[(size_t)i * (STEP)] = (T)(x0 * s + x1 * c);                                \
        }                                                                                  \
    } while (0)

void fkvfq_rope_rotate_f32(const fkvf_rope *r, const double *cs, int inverse, float *v)
{
    const uint32_t half = r->rope_dims / 2;
    const double *co = cs, *si = cs + half, sg = inverse ? -1.0 : 1.0;
    if (r->layout == 2)
        Q_ROT_BLOCKS(float, v, v + half, 1);
    else
        Q_ROT_BLOCKS(float, v, v + 1, 2);
}

static int rope_args(const fkvf_rope *rope, const void *vec, size_t dim)
{
    if (!rope || !vec || dim > UINT32_MAX || !fkvfq_rope_valid(rope, (uint32_t)dim))
        return FKVF_E_INVALID_ARG;
    return FKVF_OK;
}

FKVF_API int fkvf_rope_apply_f64(const fkvf_rope *rope, uint64_t t, int inverse, double *vec,
                                 size_t dim)
{
    int rc = rope_args(rope, vec, dim);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < rope->rope_dims / 2; i++) {
        double cs[2];
        pair_cs(rope, t, i, cs);
        rot_pair(cs, inverse != 0, vec + pair_j0(rope, i), vec + pair_j1(rope, i));
    }
    return FKVF_OK;
}

FKVF_API int fkvf_rope_apply_f32(const fkvf_rope *rope, uint64_t t, int inverse, float *vec,
                                 size_t dim)
{
    int rc = rope_args(rope, vec, dim);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < rope->rope_dims / 2; i++) {
        double cs[2];
        pair_cs(rope, t, i, cs);
        size_t j0 = pair_j0(rope, i), j1 = pair_j1(rope, i);
        double x0 = vec[j0], x1 = vec[j1];
        rot_pair(cs, inverse != 0, &x0, &x1);
        vec[j0] = (float)x0;
        vec[j1] = (float)x1;
    }
    return FKVF_OK;
}
