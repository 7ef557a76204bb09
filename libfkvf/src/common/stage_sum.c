/* The sum of a vector's stage centroids (stage_sum.h). */
#include <string.h>

#include "stage_sum.h"

#ifdef FKVF_HAVE_STAGE_SUM_AVX
__attribute__((target("avx"))) static uint32_t sum_avx(float *acc, const float *const *rows,
                                                       unsigned ns, uint32_t dim)
{
    uint32_t d = 0;
    for (; d + 8 <= dim; d += 8)
        _mm256_storeu_ps(acc + d, fkvf_stage_sum8(rows, ns, d));
    return d;
}
#endif

void fkvf_stage_sum(float *acc, const float *const *rows, unsigned ns, uint32_t dim, int avx)
{
    uint32_t d = 0;
#ifdef FKVF_HAVE_STAGE_SUM_AVX
    if (avx)
        d = sum_avx(acc, rows, ns, dim);
#else
    (void)avx;
#endif
#if defined(__GNUC__) || defined(__clang__)
    /* 4 lanes: one SSE2 / NEON register */
    typedef float v4 __attribute__((vector_size(16)));
    for (; d + 4 <= dim; d += 4) {
        v4 a = {0, 0, 0, 0}, x;
        for (unsigned s = 0; s < ns; s++) {
            memcpy(&x, rows[s] + d, sizeof x);
            a += x;
        }
        memcpy(acc + d, &a, sizeof a);
    }
#endif
    for (; d < dim; d++)
        acc[d] = fkvf_stage_sum1(rows, ns, d);
}
