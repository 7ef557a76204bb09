/* The reconstruction of a quantized vector (spec 13.6): per component the
 * binary32 sum +0.0 + row 0 + row 1 + ... of its stage centroids, in stage
 * order. The one copy of this sum, used by fkvf_rvq_decode (restore) and
 * fkvf_reader_read (random access); its vector forms do the same additions
 * lane by lane, so every path gives the same bits. */
#ifndef FKVF_COMMON_STAGE_SUM_H
#define FKVF_COMMON_STAGE_SUM_H

#include <stdint.h>

/* Component d of the sum of rows[0..ns). */
static inline float fkvf_stage_sum1(const float *const *rows, unsigned ns, uint32_t d)
{
    float a = 0.0f;
    for (unsigned s = 0; s < ns; s++)
        a += rows[s][d];
    return a;
}

/* acc[0..dim) = the sum of rows[0..ns) (ns <= 16). avx != 0 (the caller
 * checked fkvf_cpu_avx()) sums 8 components at a time; the result is the
 * same. */
void fkvf_stage_sum(float *acc, const float *const *rows, unsigned ns, uint32_t dim, int avx);

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define FKVF_HAVE_STAGE_SUM_AVX 1
#include <immintrin.h>
/* Components d..d+7 of the sum, in one register. */
static inline __attribute__((target("avx"))) __m256 fkvf_stage_sum8(const float *const *rows,
                                                                   unsigned ns, uint32_t d)
{
    __m256 a = _mm256_setzero_ps();
    for (unsigned s = 0; s < ns; s++)
        a = _mm256_add_ps(a, _mm256_loadu_ps(rows[s] + d));
    return a;
}
#endif

#endif
