/* Bounds-checked little-endian access. Every byte libfkvf reads from a file
 * goes through these helpers (or fkvf_rd_* cursors below). */
#ifndef FKVF_COMMON_LE_H
#define FKVF_COMMON_LE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* 1 on a little-endian host, where an array of host integers or floats
 * already is its little-endian byte image (shortcuts use memcpy then); 0
 * elsewhere (s390x, scripts/test-cross.sh), where every element goes through
 * the helpers below. */
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define FKVF_HOST_LE 1
#else
#define FKVF_HOST_LE 0
#endif

/* Unchecked loads/stores on byte pointers: any alignment, any host order.
 * Callers have already checked the range. */
static inline uint16_t fkvf_ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t fkvf_ld32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t fkvf_ld64(const uint8_t *p)
{
    return (uint64_t)fkvf_ld32(p) | ((uint64_t)fkvf_ld32(p + 4) << 32);
}
static inline double fkvf_ldf64(const uint8_t *p)
{
    uint64_t u = fkvf_ld64(p);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}
static inline float fkvf_ldf32(const uint8_t *p)
{
    uint32_t u = fkvf_ld32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline void fkvf_st16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void fkvf_st32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static inline void fkvf_st64(uint8_t *p, uint64_t v)
{
    fkvf_st32(p, (uint32_t)v);
    fkvf_st32(p + 4, (uint32_t)(v >> 32));
}
static inline void fkvf_stf32(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    fkvf_st32(p, u);
}
static inline void fkvf_stf64(uint8_t *p, double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    fkvf_st64(p, u);
}

/* A bounds-checked read cursor over [base, base+size). Reads past the end
 * set `bad` and return zero; callers test fkvf_rd_ok() once at the end. */
typedef struct fkvf_rd {
    const uint8_t *base;
    size_t size;
    size_t pos;
    int bad;
} fkvf_rd;

static inline fkvf_rd fkvf_rd_make(const void *base, size_t size)
{
    fkvf_rd r;
    r.base = (const uint8_t *)base;
    r.size = size;
    r.pos = 0;
    r.bad = 0;
    return r;
}
static inline int fkvf_rd_has(const fkvf_rd *r, size_t n)
{
    return !r->bad && r->pos <= r->size && r->size - r->pos >= n;
}
static inline const uint8_t *fkvf_rd_take(fkvf_rd *r, size_t n)
{
    if (!fkvf_rd_has(r, n)) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *p = r->base + r->pos;
    r->pos += n;
    return p;
}
static inline uint8_t fkvf_rd_u8(fkvf_rd *r)
{
    const uint8_t *p = fkvf_rd_take(r, 1);
    return p ? p[0] : 0;
}
static inline uint16_t fkvf_rd_u16(fkvf_rd *r)
{
    const uint8_t *p = fkvf_rd_take(r, 2);
    return p ? fkvf_ld16(p) : 0;
}
static inline uint32_t fkvf_rd_u32(fkvf_rd *r)
{
    const uint8_t *p = fkvf_rd_take(r, 4);
    return p ? fkvf_ld32(p) : 0;
}
static inline uint64_t fkvf_rd_u64(fkvf_rd *r)
{
    const uint8_t *p = fkvf_rd_take(r, 8);
    return p ? fkvf_ld64(p) : 0;
}
static inline double fkvf_rd_f64(fkvf_rd *r)
{
    const uint8_t *p = fkvf_rd_take(r, 8);
    return p ? fkvf_ldf64(p) : 0.0;
}
static inline int fkvf_rd_ok(const fkvf_rd *r) { return !r->bad; }

/* Checked range test: does [off, off+len) fit in [0, size)? */
static inline int fkvf_range_ok(uint64_t off, uint64_t len, uint64_t size)
{
    return off <= size && len <= size - off;
}

/* n host binary32 values to their little-endian byte image, in place
 * (nothing to do on a little-endian host). */
static inline void fkvf_f32_to_le_inplace(float *v, size_t n)
{
#if !FKVF_HOST_LE
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, v + i, sizeof u);
        fkvf_st32((uint8_t *)(void *)(v + i), u);
    }
#else
    (void)v;
    (void)n;
#endif
}

#endif
