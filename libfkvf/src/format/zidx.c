/* ZIDX and ZPOS search index layout (spec 20). */
#include "format/zidx.h"

#include <string.h>

#include "le.h"

#define Z_MAX_SIZE (UINT64_C(1) << 48)

int fkvf_zidx_is_index(uint32_t type)
{
    return type == FKVF_SECTION_ZIDX || type == FKVF_SECTION_ZPOS;
}

uint16_t fkvf_zidx_entry_size(uint32_t type, uint8_t profile, uint64_t n)
{
    if (type == FKVF_SECTION_ZPOS)
        return n <= (UINT64_C(1) << 32) ? FKVF_ZPOS_ENTRY32 : FKVF_ZPOS_ENTRY64;
    return profile == FKVF_PROFILE_QUAD ? FKVF_ZIDX_QUAD_ENTRY : FKVF_ZIDX_NGON_ENTRY;
}

uint64_t fkvf_zidx_size(uint32_t type, uint8_t profile, uint64_t n)
{
    uint64_t es = fkvf_zidx_entry_size(type, profile, n);
    if (n > (Z_MAX_SIZE - FKVF_ZIDX_HDR_SIZE) / es)
        return 0;
    return FKVF_ZIDX_HDR_SIZE + n * es;
}

uint64_t fkvf_zpos_at(const uint8_t *entries, uint16_t es, uint64_t i)
{
    return es == FKVF_ZPOS_ENTRY32 ? fkvf_ld32(entries + (size_t)i * 4)
                                   : fkvf_ld64(entries + (size_t)i * 8);
}

int fkvf_zidx_hdr_parse(uint32_t type, const uint8_t *p, uint64_t size, uint64_t key,
                        uint64_t off, fkvf_zidx_hdr *h, fkvf_diag *d)
{
    const char *tn = type == FKVF_SECTION_ZPOS ? "ZPOS" : "ZIDX";
    const char *cl = type == FKVF_SECTION_ZPOS ? "20.7" : "20.2";
    if (size < FKVF_ZIDX_HDR_SIZE)
        return fkvf_fail(d, FKVF_E_TRUNCATED, off, cl,
                         "%s section of %llu bytes, shorter than its 64-byte header", tn,
                         (unsigned long long)size);
    fkvf_rd c = fkvf_rd_make(p, FKVF_ZIDX_HDR_SIZE);
    memset(h, 0, sizeof *h);
    h->stream_id = fkvf_rd_u64(&c);
    h->profile = fkvf_rd_u8(&c);
    h->bits = fkvf_rd_u8(&c);
    h->entry_size = fkvf_rd_u16(&c);
    h->alphabet = fkvf_rd_u32(&c);
    h->n_indexed = fkvf_rd_u64(&c);
    h->r = fkvf_rd_f64(&c);
    h->span = fkvf_rd_u32(&c);
    const uint8_t *res = fkvf_rd_take(&c, 28);
    if (!fkvf_rd_ok(&c) || !res)
        return fkvf_fail(d, FKVF_E_TRUNCATED, off, cl, "%s header truncated", tn);
    for (int i = 0; i < 28; i++)
        if (res[i])
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 36 + (uint64_t)i, cl,
                             "%s reserved byte %d is not zero", tn, 36 + i);
    if (h->stream_id != key)
        return fkvf_fail(d, FKVF_E_CORRUPT, off, cl,
                         "%s.stream_id %016llx differs from the directory key %016llx", tn,
                         (unsigned long long)h->stream_id, (unsigned long long)key);
    unsigned want_es = fkvf_zidx_entry_size(type, h->profile, h->n_indexed);
    if (h->profile == FKVF_PROFILE_QUAD) {
        if (h->bits < 2 || h->bits > 32 || h->bits % 2 || h->alphabet || h->span ||
            h->entry_size != want_es || fkvf_ld64(p + 24) != 0)
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 8, cl,
                             "%s quad header: bits %u, alphabet %u, L %u, entry_size %u "
                             "(want even bits 2..32, alphabet 0, L 0, r 0, entry_size %u)",
                             tn, h->bits, h->alphabet, h->span, h->entry_size, want_es);
    } else if (h->profile == FKVF_PROFILE_NGON) {
        if (h->bits || h->alphabet < 2 || h->alphabet > 65536 || h->entry_size != want_es ||
            !(h->r > 0.0 && h->r <= 0.5) || h->span < 1 || h->span > 44)
            return fkvf_fail(d, FKVF_E_CORRUPT, off + 8, cl,
                             "%s ngon header: bits %u, alphabet %u, r %.17g, L %u, "
                             "entry_size %u out of range (want %u)",
                             tn, h->bits, h->alphabet, h->r, h->span, h->entry_size, want_es);
    } else {
        return fkvf_fail(d, FKVF_E_CORRUPT, off + 8, cl, "%s.profile %u unknown", tn,
                         h->profile);
    }
    uint64_t want = fkvf_zidx_size(type, h->profile, h->n_indexed);
    if (!want)
        return fkvf_fail(d, FKVF_E_LIMIT, off + 16, cl,
                         "%s.n_indexed %llu: the section would exceed 2^48 bytes", tn,
                         (unsigned long long)h->n_indexed);
    if (size != want)
        return fkvf_fail(d, size < want ? FKVF_E_TRUNCATED : FKVF_E_CORRUPT, off, cl,
                         "%s section of %llu bytes, %llu entries need %llu", tn,
                         (unsigned long long)size, (unsigned long long)h->n_indexed,
                         (unsigned long long)want);
    return FKVF_OK;
}

void fkvf_zidx_hdr_write(uint8_t *p, const fkvf_zidx_hdr *h)
{
    memset(p, 0, FKVF_ZIDX_HDR_SIZE);
    fkvf_st64(p, h->stream_id);
    p[8] = h->profile;
    p[9] = h->bits;
    fkvf_st16(p + 10, h->entry_size);
    fkvf_st32(p + 12, h->alphabet);
    fkvf_st64(p + 16, h->n_indexed);
    if (h->profile == FKVF_PROFILE_NGON)
        fkvf_stf64(p + 24, h->r);
    fkvf_st32(p + 32, h->span);
}

uint32_t fkvf_zidx_quant(double v)
{
    double q = (v + 1.0) * 2147483648.0;
    if (!(q > 0.0))
        return 0;
    if (q >= 4294967295.0)
        return UINT32_MAX;
    return (uint32_t)q;
}

static uint64_t spread32(uint32_t v)
{
    uint64_t x = v;
    x = (x | (x << 16)) & UINT64_C(0x0000FFFF0000FFFF);
    x = (x | (x << 8)) & UINT64_C(0x00FF00FF00FF00FF);
    x = (x | (x << 4)) & UINT64_C(0x0F0F0F0F0F0F0F0F);
    x = (x | (x << 2)) & UINT64_C(0x3333333333333333);
    x = (x | (x << 1)) & UINT64_C(0x5555555555555555);
    return x;
}

static uint32_t pack32(uint64_t x)
{
    x &= UINT64_C(0x5555555555555555);
    x = (x | (x >> 1)) & UINT64_C(0x3333333333333333);
    x = (x | (x >> 2)) & UINT64_C(0x0F0F0F0F0F0F0F0F);
    x = (x | (x >> 4)) & UINT64_C(0x00FF00FF00FF00FF);
    x = (x | (x >> 8)) & UINT64_C(0x0000FFFF0000FFFF);
    x = (x | (x >> 16)) & UINT64_C(0x00000000FFFFFFFF);
    return (uint32_t)x;
}

uint64_t fkvf_zidx_morton32(uint32_t x, uint32_t y) { return spread32(x) | (spread32(y) << 1); }

void fkvf_zidx_morton64(uint64_t x, uint64_t y, uint64_t *hi, uint64_t *lo)
{
    *lo = fkvf_zidx_morton32((uint32_t)x, (uint32_t)y);
    *hi = fkvf_zidx_morton32((uint32_t)(x >> 32), (uint32_t)(y >> 32));
}

void fkvf_zidx_unmorton64(uint64_t hi, uint64_t lo, uint64_t *x, uint64_t *y)
{
    *x = (uint64_t)pack32(lo) | ((uint64_t)pack32(hi) << 32);
    *y = (uint64_t)pack32(lo >> 1) | ((uint64_t)pack32(hi >> 1) << 32);
}
