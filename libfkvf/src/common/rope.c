/* RoPE (spec 8.1): the parameter check, the angle table and the rotation of
 * keys, used by training and encoding (keys rotated back to position 0), by
 * decoding (fkvf_rvq_decode: restore) and by random access (fkvf_reader_read),
 * and behind fkvf_rope_apply_f64 / _f32. */
#include <math.h>

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

/* components of pair i: interleaved (2i, 2i+1), half-split (i, i + rope_dims/2) */
static inline size_t pair_j0(const fkvf_rope *r, uint32_t i)
{
    return r->layout == 1 ? 2 * (size_t)i : i;
}
static inline size_t pair_j1(const fkvf_rope *r, uint32_t i)
{
    return r->layout == 1 ? 2 * (size_t)i + 1 : (size_t)i + r->rope_dims / 2;
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

/* pair i of binary32 values: a[i * step] and b[i * step], cosine c, sine s */
static inline void turn_f32(float *a, float *b, size_t step, uint32_t i, double c, double s)
{
    double x0 = a[i * step], x1 = b[i * step];
    fkvf_rope_turn(c, s, &x0, &x1);
    a[i * step] = (float)x0;
    b[i * step] = (float)x1;
}

#ifdef FKVF_HAVE_ROPE_AVX
/* The forward rotation of the first pairs, four at a time (fkvf_rope_turn4);
 * returns how many pairs it did. */
__attribute__((target("avx"))) static uint32_t rotate_avx(uint8_t layout, uint32_t half,
                                                          const double *co, const double *si,
                                                          float *v)
{
    uint32_t i = 0;
    __m128 y0, y1;
    if (layout == 2) { /* pairs (i, i + half) */
        for (; i + 4 <= half; i += 4) {
            fkvf_rope_turn4(_mm_loadu_ps(v + i), _mm_loadu_ps(v + half + i), co + i, si + i, &y0,
                            &y1);
            _mm_storeu_ps(v + i, y0);
            _mm_storeu_ps(v + half + i, y1);
        }
    } else { /* pairs (2i, 2i + 1): even and odd components of 8 */
        for (; i + 4 <= half; i += 4) {
            __m128 a = _mm_loadu_ps(v + 2 * i), b = _mm_loadu_ps(v + 2 * i + 4);
            fkvf_rope_turn4(_mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)), co + i, si + i, &y0,
                            &y1);
            _mm_storeu_ps(v + 2 * i, _mm_unpacklo_ps(y0, y1));
            _mm_storeu_ps(v + 2 * i + 4, _mm_unpackhi_ps(y0, y1));
        }
    }
    return i;
}
#endif

void fkvf_rope_rotate_f32(const fkvf_rope *r, const double *cs, int inverse, float *v, int avx)
{
    const uint32_t half = r->rope_dims / 2;
    /* R(-a): cos(-a) = cos a, sin(-a) = -sin a */
    const double *co = cs, *si = cs + half, sg = inverse ? -1.0 : 1.0;
    float *a = v, *b = r->layout == 2 ? v + half : v + 1;
    const size_t step = r->layout == 2 ? 1 : 2;
    uint32_t i = 0;
#ifdef FKVF_HAVE_ROPE_AVX
    if (avx && !inverse)
        i = rotate_avx(r->layout, half, co, si, v);
#else
    (void)avx;
#endif
    /* in blocks of four pairs the compiler can vectorize, then the tail */
    for (; i + 4 <= half; i += 4)
        for (uint32_t j = i; j < i + 4; j++)
            turn_f32(a, b, step, j, co[j], sg * si[j]);
    for (; i < half; i++)
        turn_f32(a, b, step, i, co[i], sg * si[i]);
}

void fkvf_rope_mean_transpose(const fkvf_rope *r, const double *freqs, double *q, uint64_t first,
                              uint64_t count)
{
    const double n = (double)count;
    for (uint32_t i = 0; i < r->rope_dims / 2; i++) {
        /* sum_{j < n} e^{i w (first + j)} = e^{i w (first + (n - 1) / 2)} sin(n w / 2) / sin(w / 2) */
        const double w = freqs[i], h = sin(w / 2);
        const double mid = ((double)first + (n - 1) / 2) * w;
        const double f = h != 0 ? sin(n * w / 2) / h / n : 1.0;
        const double c = f * cos(mid), s = f * sin(mid); /* mean cos, mean sin */
        double *x0 = q + pair_j0(r, i), *x1 = q + pair_j1(r, i);
        const double a = *x0, b = *x1; /* R^T (a, b) = (a c + b s, b c - a s) */
        *x0 = a * c + b * s;
        *x1 = b * c - a * s;
    }
}

static int rope_args(const fkvf_rope *rope, const void *vec, size_t dim)
{
    if (!rope || !vec || dim > UINT32_MAX || !fkvf_rope_valid(rope, (uint32_t)dim))
        return FKVF_E_INVALID_ARG;
    return FKVF_OK;
}

/* fkvf_rope_apply_*: vd (binary64) or vf (binary32) rotated pair by pair */
static int apply(const fkvf_rope *rope, uint64_t t, int inverse, double *vd, float *vf,
                 size_t dim)
{
    int rc = rope_args(rope, vd ? (const void *)vd : (const void *)vf, dim);
    for (uint32_t i = 0; !rc && i < rope->rope_dims / 2; i++) {
        double cs[2];
        size_t j0 = pair_j0(rope, i), j1 = pair_j1(rope, i);
        cs_of(inv_freq(rope, i), t, cs);
        if (inverse) /* R(-a) */
            cs[1] = -cs[1];
        if (vd)
            fkvf_rope_turn(cs[0], cs[1], vd + j0, vd + j1);
        else
            turn_f32(vf + j0, vf + j1, 0, 0, cs[0], cs[1]);
    }
    return rc;
}

FKVF_API int fkvf_rope_apply_f64(const fkvf_rope *rope, uint64_t t, int inverse, double *vec,
                                 size_t dim)
{
    return apply(rope, t, inverse, vec, NULL, dim);
}

FKVF_API int fkvf_rope_table(const fkvf_rope *rope, uint64_t t, double *cs, size_t n)
{
    if (!rope || !cs || !fkvf_rope_valid(rope, rope->rope_dims) || n < rope->rope_dims)
        return FKVF_E_INVALID_ARG;
    uint32_t half = rope->rope_dims / 2;
    for (uint32_t i = 0; i < half; i++) {
        double pc[2];
        cs_of(inv_freq(rope, i), t, pc); /* as apply: the same bits */
        cs[i] = pc[0];
        cs[half + i] = pc[1];
    }
    return FKVF_OK;
}

FKVF_API int fkvf_rope_apply_table_f64(const fkvf_rope *rope, const double *cs, int inverse,
                                       double *vec, size_t dim)
{
    int rc = rope_args(rope, vec, dim);
    if (rc || !cs)
        return rc ? rc : FKVF_E_INVALID_ARG;
    uint32_t half = rope->rope_dims / 2;
    for (uint32_t i = 0; i < half; i++)
        fkvf_rope_turn(cs[i], inverse ? -cs[half + i] : cs[half + i], vec + pair_j0(rope, i),
                       vec + pair_j1(rope, i));
    return FKVF_OK;
}

FKVF_API int fkvf_rope_apply_f32(const fkvf_rope *rope, uint64_t t, int inverse, float *vec,
                                 size_t dim)
{
    return apply(rope, t, inverse, NULL, vec, dim);
}
