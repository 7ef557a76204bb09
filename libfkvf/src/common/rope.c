/* RoPE (spec 8.1): the parameter check, the angle table and the rotation of
 * keys, used by training and encoding (keys rotated back to position 0), by
 * decoding (fkvf_rvq_decode: restore) and by random access (fkvf_reader_read),
 * and behind fkvf_rope_apply_f64 / _f32. */
#include <math.h>
#include <string.h>

#include "rope.h"

int fkvf_rope_valid(const fkvf_rope *r, uint32_t key_dim)
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

void fkvf_rope_freqs(const fkvf_rope *r, double *freqs)
{
    for (uint32_t i = 0; i < r->rope_dims / 2; i++)
        freqs[i] = inv_freq(r, i);
}

void fkvf_rope_angles(const fkvf_rope *r, const double *freqs, uint64_t t, double *cs)
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

void fkvf_rope_rotate_f32(const fkvf_rope *r, const double *cs, int inverse, float *v)
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
    if (!rope || !vec || dim > UINT32_MAX || !fkvf_rope_valid(rope, (uint32_t)dim))
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
