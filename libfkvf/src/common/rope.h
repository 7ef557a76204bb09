/* RoPE arithmetic (spec 8.1), the one copy of it: the parameter check, the
 * angle table (theta^(-2i / rope_dims), then cos and sin of t times it, in
 * binary64) and the rotation of a key's pairs (x0 c - x1 s, x0 s + x1 c in
 * binary64, no fused multiply-add: the library is compiled with
 * -ffp-contract=off; one rounding to binary32).
 *
 * Training and encoding rotate keys back by -angle; decoding
 * (fkvf_rvq_decode, hence restore) and random access (fkvf_reader_read)
 * rotate them by +angle with the same table and the same pair rotation,
 * scalar or four pairs at a time (fkvf_rope_turn / fkvf_rope_turn4: the same
 * operations lane by lane), so that restore and random access agree bit for
 * bit by construction. */
#ifndef FKVF_COMMON_ROPE_H
#define FKVF_COMMON_ROPE_H

#include <stdint.h>

#include "fkvf.h"

/* 1 if the parameters are usable for keys of key_dim components. */
int fkvf_rope_valid(const fkvf_rope *r, uint32_t key_dim);
/* theta^(-2i / rope_dims) for every pair i (rope_dims/2 values). */
void fkvf_rope_freqs(const fkvf_rope *r, double *freqs);
/* cos and sin of angle(t, i) = t * freqs[i] for every pair i: cs[i] = cos,
 * cs[rope_dims/2 + i] = sin, binary64. The same values as fkvf_rope_apply_*. */
void fkvf_rope_angles(const fkvf_rope *r, const double *freqs, uint64_t t, double *cs);
/* Rotate binary32 values v by +angle (inverse = 0) or -angle (inverse = 1):
 * computed in binary64, rounded once at the end (bit-identical to
 * fkvf_rope_apply_f32). avx != 0 (the caller checked fkvf_cpu_avx()) lets
 * the forward rotation run four pairs at a time; the result is the same. */
void fkvf_rope_rotate_f32(const fkvf_rope *r, const double *cs, int inverse, float *v, int avx);

/* Key retrieval's mean query (fkvf_search_keys), in place: q (binary64, at
 * least rope_dims components) becomes the mean over the positions p = first
 * .. first + count - 1 of R(p)^T q, R(p) the rotation of spec 8.1 to p, so
 * that q . c is then the mean of q . R(p) c over those p for every key c
 * archived before rotation (pairs that turn fast over the range average
 * out). Components beyond rope_dims are left alone. count >= 1; the sums of
 * cos and sin over the range in closed form. r must be valid; freqs is
 * fkvf_rope_freqs' table for r. */
void fkvf_rope_mean_transpose(const fkvf_rope *r, const double *freqs, double *q, uint64_t first,
                              uint64_t count);

/* One pair (x0, x1) rotated by the angle of cosine c and sine s. */
static inline void fkvf_rope_turn(double c, double s, double *x0, double *x1)
{
    double a = *x0, b = *x1;
    *x0 = a * c - b * s;
    *x1 = a * s + b * c;
}

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define FKVF_HAVE_ROPE_AVX 1
#include <immintrin.h>
/* fkvf_rope_turn on four pairs (x0[j], x1[j]) with cosines co[0..3] and
 * sines si[0..3], each result rounded to binary32: the same operations in
 * four binary64 lanes. */
static inline __attribute__((target("avx"))) void fkvf_rope_turn4(__m128 x0f, __m128 x1f,
                                                                  const double *co,
                                                                  const double *si, __m128 *y0,
                                                                  __m128 *y1)
{
    __m256d x0 = _mm256_cvtps_pd(x0f), x1 = _mm256_cvtps_pd(x1f);
    __m256d c = _mm256_loadu_pd(co), s = _mm256_loadu_pd(si);
    *y0 = _mm256_cvtpd_ps(_mm256_sub_pd(_mm256_mul_pd(x0, c), _mm256_mul_pd(x1, s)));
    *y1 = _mm256_cvtpd_ps(_mm256_add_pd(_mm256_mul_pd(x0, s), _mm256_mul_pd(x1, c)));
}
#endif

#endif
