/* Overflow-checked size arithmetic. Each returns 1 on success, 0 on overflow
 * (and then *out is unspecified). */
#ifndef FKVF_COMMON_CKD_H
#define FKVF_COMMON_CKD_H

#include <stddef.h>
#include <stdint.h>

static inline int fkvf_add64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}
static inline int fkvf_mul64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline int fkvf_addsz(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }
static inline int fkvf_mulsz(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
/* u64 -> size_t without truncation */
static inline int fkvf_tosz(uint64_t v, size_t *out)
{
    if (v > (uint64_t)SIZE_MAX)
        return 0;
    *out = (size_t)v;
    return 1;
}
/* round up to a multiple of 64 */
static inline int fkvf_align64(uint64_t v, uint64_t *out)
{
    if (v > UINT64_MAX - 63)
        return 0;
    *out = (v + 63) & ~(uint64_t)63;
    return 1;
}
/* ceil(a / b), b > 0 */
static inline uint64_t fkvf_ceildiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

#endif
