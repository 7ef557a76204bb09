/* Helpers shared by the fuzz targets (header only, static functions): a
 * consumer that takes parameters from the front of the input (zeros once
 * it is used up) and a check that aborts with a message, so that a failed
 * property is a crash for libFuzzer and a failed test for the replay
 * driver. */
#ifndef FKVF_FUZZ_UTIL_H
#define FKVF_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fz {
    const uint8_t *p;
    size_t n;
} fz;

static inline uint8_t fz_u8(fz *f)
{
    if (!f->n)
        return 0;
    f->n--;
    return *f->p++;
}

static inline uint16_t fz_u16(fz *f)
{
    uint16_t a = fz_u8(f);
    return (uint16_t)(a | (uint16_t)(fz_u8(f) << 8));
}

static inline uint32_t fz_u32(fz *f)
{
    uint32_t a = fz_u16(f);
    return a | ((uint32_t)fz_u16(f) << 16);
}

static inline uint64_t fz_u64(fz *f)
{
    uint64_t a = fz_u32(f);
    return a | ((uint64_t)fz_u32(f) << 32);
}

/* A value in [lo, hi] (hi - lo < 2^32). */
static inline uint32_t fz_range(fz *f, uint32_t lo, uint32_t hi)
{
    uint32_t span = hi - lo + 1;
    uint32_t v = span <= 256 ? fz_u8(f) : span <= 65536 ? fz_u16(f) : fz_u32(f);
    return span ? lo + v % span : v;
}

/* Copy up to n bytes (zeros after the end of the input). */
static inline void fz_fill(fz *f, void *out, size_t n)
{
    size_t k = n < f->n ? n : f->n;
    if (k)
        memcpy(out, f->p, k);
    memset((uint8_t *)out + k, 0, n - k);
    f->p += k;
    f->n -= k;
}

#define FZ_CHECK(cond)                                                                   \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                     \
        }                                                                                \
    } while (0)

#endif
