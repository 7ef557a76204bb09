/* quad codec (spec 12.1): b-bit symbols as b/2 base-4 digits, CGR on the
 * unit square with r = 1/2 in 64-bit fixed point. Because the Morton value of
 * a span's anchor is the packed bitstream itself, encoding is bit packing
 * (LSB first, little-endian, 16-byte units) and decoding is bit extraction.
 *
 * Every byte of serialized data is read and written through le.h; the
 * compilers turn the byte-wise helpers into plain loads and stores. */
#include <string.h>

#include "ckd.h"
#include "codec.h"
#include "le.h"

static int bits_ok(unsigned bits) { return bits >= 2 && bits <= 32 && (bits & 1u) == 0; }

static uint32_t sym_mask(unsigned bits)
{
    return bits >= 32 ? UINT32_MAX : (((uint32_t)1 << bits) - 1u);
}

int fkvf_quad_data_bytes(uint64_t n, unsigned bits, uint64_t *out)
{
    uint64_t nbits;
    if (!bits_ok(bits) || !fkvf_mul64(n, bits, &nbits))
        return 0;
    /* ceil(nbits / 128) * 16 <= 2^60 + 16: no overflow possible. */
    *out = fkvf_ceildiv(nbits, 128) * 16u;
    return 1;
}

unsigned fkvf_quad_span_symbols(unsigned bits) { return bits_ok(bits) ? 128u / bits : 0u; }

/* Load up to 8 bytes starting at byte index `byte` (which may be past the
 * end); bytes outside [0, size) read as zero. */
static uint64_t ld_bounded(const uint8_t *d, size_t size, uint64_t byte)
{
    if (byte < size && size - byte >= 8)
        return fkvf_ld64(d + byte);
    uint64_t v = 0;
    for (unsigned i = 0; i < 8; i++) {
        uint64_t b = byte + i;
        if (b >= byte && b < size)
            v |= (uint64_t)d[b] << (8 * i);
    }
    return v;
}

/* 64 bits of the bitstream starting at bit `pos` (>= 0); bits outside the
 * data are zero. */
static uint64_t bits64_at(const uint8_t *d, size_t size, uint64_t pos)
{
    uint64_t byte = pos >> 3;
    unsigned sh = (unsigned)(pos & 7u);
    uint64_t v = ld_bounded(d, size, byte);
    if (sh) {
        v >>= sh;
        uint64_t nb = byte + 8;
        if (nb > byte && nb < size)
            v |= (uint64_t)d[nb] << (64 - sh);
    }
    return v;
}

/* Are the symbols [first, first+n) of `bits` bits all inside data_size
 * bytes? (The decoders then index with size_t safely.) */
static int symbols_inside(size_t data_size, unsigned bits, uint64_t first, size_t n)
{
    uint64_t end, endbits;
    return fkvf_add64(first, (uint64_t)n, &end) && fkvf_mul64(end, bits, &endbits) &&
           fkvf_ceildiv(endbits, 8) <= (uint64_t)data_size;
}

/* 8/16-bit encode fast paths, same shape as widen8/16; they return the OR
 * of the symbols for the range check. */
static uint32_t narrow8(const uint32_t *restrict sym, uint8_t *restrict out, size_t n)
{
    uint32_t any = 0;
    size_t i = 0;
    for (; n - i >= 16; i += 16)
        for (size_t k = 0; k < 16; k++) {
            any |= sym[i + k];
            out[i + k] = (uint8_t)sym[i + k];
        }
    for (; i < n; i++) {
        any |= sym[i];
        out[i] = (uint8_t)sym[i];
    }
    return any;
}

static uint32_t narrow16(const uint32_t *restrict sym, uint8_t *restrict out, size_t n)
{
    uint32_t any = 0;
    size_t i = 0;
    for (; n - i >= 16; i += 16)
        for (size_t k = 0; k < 16; k++) {
            any |= sym[i + k];
            fkvf_st16(out + 2 * (i + k), (uint16_t)sym[i + k]);
        }
    for (; i < n; i++) {
        any |= sym[i];
        fkvf_st16(out + 2 * i, (uint16_t)sym[i]);
    }
    return any;
}

int fkvf_quad_encode(const uint32_t *sym, size_t n, unsigned bits, uint8_t *out, size_t out_size)
{
    uint64_t need;
    if (!fkvf_quad_data_bytes((uint64_t)n, bits, &need))
        return FKVF_E_INVALID_ARG;
    if (need > (uint64_t)out_size || (n && (!sym || !out)))
        return FKVF_E_INVALID_ARG;
    if (need == 0)
        return FKVF_OK;
    size_t pos = 0;
    uint32_t any = 0; /* OR of all symbols: validated once at the end */
    if (bits == 8) {
        any = narrow8(sym, out, n);
        pos = n;
    } else if (bits == 16) {
        any = narrow16(sym, out, n);
        pos = 2 * n;
    } else if (bits == 32) {
        for (size_t i = 0; i < n; i++)
            fkvf_st32(out + 4 * i, sym[i]);
        pos = 4 * n;
    } else {
        /* Bit accumulator: acc holds nacc (< 64) pending bits. */
        uint64_t acc = 0;
        unsigned nacc = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t s = sym[i];
            any |= sym[i];
            acc |= s << nacc;
            nacc += bits;
            if (nacc >= 64) {
                fkvf_st64(out + pos, acc);
                pos += 8;
                nacc -= 64;
                acc = nacc ? s >> (bits - nacc) : 0;
            }
        }
        while (nacc > 0) {
            out[pos++] = (uint8_t)acc;
            acc >>= 8;
            nacc = nacc > 8 ? nacc - 8 : 0;
        }
    }
    if (bits < 32 && (any >> bits))
        return FKVF_E_SYMBOL; /* out holds garbage; the caller discards it */
    /* Zero padding up to the end of the last 16-byte unit (spec 11.7). */
    memset(out + pos, 0, (size_t)need - pos);
    return FKVF_OK;
}

/* 8/16-bit decode fast paths. Blocks of 16 with a constant inner trip
 * count and restrict pointers (uint8_t may alias anything), kept out of line
 * so that the restrict promise survives: compilers vectorize these even at
 * -O2, where GCC's cheap cost model leaves a loop of unknown length scalar. */
__attribute__((noinline)) static void widen8(const uint8_t *restrict p, uint32_t *restrict out, size_t n)
{
    size_t i = 0;
    for (; n - i >= 16; i += 16)
        for (size_t k = 0; k < 16; k++)
            out[i + k] = p[i + k];
    for (; i < n; i++)
        out[i] = p[i];
}

__attribute__((noinline)) static void widen16(const uint8_t *restrict p, uint32_t *restrict out, size_t n)
{
    size_t i = 0;
    for (; n - i >= 16; i += 16)
        for (size_t k = 0; k < 16; k++)
            out[i + k] = fkvf_ld16(p + 2 * (i + k));
    for (; i < n; i++)
        out[i] = fkvf_ld16(p + 2 * i);
}

int fkvf_quad_decode(const uint8_t *data, size_t data_size, unsigned bits, uint64_t first,
                     size_t n, uint32_t *out)
{
    if (!bits_ok(bits))
        return FKVF_E_INVALID_ARG;
    if (!symbols_inside(data_size, bits, first, n))
        return FKVF_E_RANGE;
    if (n == 0)
        return FKVF_OK;
    if (!data || !out)
        return FKVF_E_INVALID_ARG;
    /* From here every symbol lies inside data, so first*bits/8 < data_size
     * and the index arithmetic below fits in size_t. */
    if (bits == 8) {
        widen8(data + (size_t)first, out, n);
        return FKVF_OK;
    }
    if (bits == 16) {
        widen16(data + 2 * (size_t)first, out, n);
        return FKVF_OK;
    }
    if (bits == 32) {
        const uint8_t *p = data + 4 * (size_t)first;
        for (size_t i = 0; i < n; i++)
            out[i] = fkvf_ld32(p + 4 * i);
        return FKVF_OK;
    }
    const uint32_t mask = sym_mask(bits);
    uint64_t pos = first * bits;
    size_t i = 0;
    /* Main loop: an 8-byte load at pos/8 stays inside data. A symbol needs
     * at most 7 + 32 bits, so one load always suffices. */
    for (; i < n; i++, pos += bits) {
        uint64_t byte = pos >> 3;
        if (data_size < 8 || byte > (uint64_t)data_size - 8)
            break;
        out[i] = (uint32_t)(fkvf_ld64(data + byte) >> (pos & 7u)) & mask;
    }
    for (; i < n; i++, pos += bits)
        out[i] = (uint32_t)bits64_at(data, data_size, pos) & mask;
    return FKVF_OK;
}

int fkvf_quad_decode_u8(const uint8_t *data, size_t data_size, unsigned bits, uint64_t first,
                        size_t n, uint8_t *out)
{
    if (!bits_ok(bits) || bits > 8)
        return FKVF_E_INVALID_ARG;
    if (!symbols_inside(data_size, bits, first, n))
        return FKVF_E_RANGE;
    if (n == 0)
        return FKVF_OK;
    if (!data || !out)
        return FKVF_E_INVALID_ARG;
    if (bits == 8) {
        /* the packed stream is the byte array of symbols (spec 12.1.4) */
        memcpy(out, data + (size_t)first, n);
        return FKVF_OK;
    }
    const unsigned per = 8 / bits; /* widths 2 and 4: symbols never straddle bytes */
    const uint8_t mask = (uint8_t)((1u << bits) - 1u);
    uint64_t pos = first * bits;
    size_t i = 0;
    if (8 % bits == 0) {
        for (; i < n && (pos & 7u); i++, pos += bits)
            out[i] = (uint8_t)(data[pos >> 3] >> (pos & 7u)) & mask;
        for (; i + per <= n; i += per, pos += 8) {
            uint8_t b = data[pos >> 3];
            for (unsigned k = 0; k < per; k++)
                out[i + k] = (uint8_t)(b >> (k * bits)) & mask;
        }
    }
    for (; i < n; i++, pos += bits)
        out[i] = (uint8_t)bits64_at(data, data_size, pos) & mask;
    return FKVF_OK;
}

uint32_t fkvf_quad_get(const uint8_t *data, size_t data_size, unsigned bits, uint64_t t)
{
    uint64_t pos;
    if (!bits_ok(bits) || !fkvf_mul64(t, bits, &pos))
        return 0;
    uint64_t byte = pos >> 3;
    if (data_size >= 8 && byte <= (uint64_t)data_size - 8)
        return (uint32_t)(fkvf_ld64(data + byte) >> (pos & 7u)) & sym_mask(bits);
    return (uint32_t)bits64_at(data, data_size, pos) & sym_mask(bits);
}

/* Keep the even bits of v, packed into the low 32 bits. */
static uint64_t compact_even(uint64_t v)
{
    v &= UINT64_C(0x5555555555555555);
    v = (v | (v >> 1)) & UINT64_C(0x3333333333333333);
    v = (v | (v >> 2)) & UINT64_C(0x0F0F0F0F0F0F0F0F);
    v = (v | (v >> 4)) & UINT64_C(0x00FF00FF00FF00FF);
    v = (v | (v >> 8)) & UINT64_C(0x0000FFFF0000FFFF);
    v = (v | (v >> 16)) & UINT64_C(0x00000000FFFFFFFF);
    return v;
}

void fkvf_quad_point(const uint8_t *data, size_t data_size, unsigned bits, uint64_t t,
                     uint64_t *x, uint64_t *y)
{
    uint64_t end, endbits;
    uint64_t lo = 0, hi = 0; /* z = hi:lo = bits [endbits-128, endbits) */
    if (bits_ok(bits) && fkvf_add64(t, 1, &end) && fkvf_mul64(end, bits, &endbits)) {
        if (endbits >= 128) {
            lo = bits64_at(data, data_size, endbits - 128);
            hi = bits64_at(data, data_size, endbits - 64);
        } else if (endbits > 64) {
            /* window starts before bit 0: z = stream << (128 - endbits) */
            unsigned s = (unsigned)(128 - endbits); /* 1..63 */
            uint64_t w0 = bits64_at(data, data_size, 0);
            uint64_t w1 = bits64_at(data, data_size, 64) & ((UINT64_C(1) << (endbits - 64)) - 1);
            lo = w0 << s;
            hi = (w1 << s) | (w0 >> (64 - s));
        } else {
            /* endbits in 1..64: only hi is non-zero */
            uint64_t w0 = bits64_at(data, data_size, 0);
            if (endbits < 64)
                w0 &= (UINT64_C(1) << endbits) - 1;
            hi = endbits == 64 ? w0 : w0 << (64 - endbits);
        }
    }
    *x = compact_even(lo) | (compact_even(hi) << 32);
    *y = compact_even(lo >> 1) | (compact_even(hi >> 1) << 32);
}

void fkvf_quad_point_ref(const uint32_t *sym, uint64_t t, unsigned bits, uint64_t *x,
                         uint64_t *y)
{
    uint64_t px = 0, py = 0;
    for (uint64_t k = 0; k <= t; k++) {
        for (unsigned i = 0; i < bits / 2; i++) {
            unsigned q = (unsigned)(sym[k] >> (2 * i)) & 3u;
            px = (px >> 1) | ((uint64_t)(q & 1u) << 63);
            py = (py >> 1) | ((uint64_t)(q >> 1) << 63);
        }
    }
    *x = px;
    *y = py;
}

int fkvf_quad_padding_zero(const uint8_t *data, size_t data_size, unsigned bits, uint64_t n)
{
    uint64_t start, total;
    if (!fkvf_mul64(n, bits, &start) || !fkvf_quad_data_bytes(n, bits, &total))
        return 0;
    if (total > (uint64_t)data_size)
        total = data_size;
    uint64_t byte = start >> 3;
    if (byte >= total)
        return 1;
    unsigned sh = (unsigned)(start & 7u);
    if (sh) {
        if (data[byte] >> sh)
            return 0;
        byte++;
    }
    for (; byte < total; byte++)
        if (data[byte])
            return 0;
    return 1;
}
