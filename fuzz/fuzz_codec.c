/* Fuzz target: round trip of the stream codecs of spec 12 (codec/codec.h)
 * with parameters and symbols chosen by the input.
 *  quad: width b (even 2..32); encode -> decode == symbols, decode_u8 and
 *    get agree, padding zero, every point equals the digit recurrence of
 *    12.1 (fkvf_quad_point_ref), the O(1)-append encoder gives the same
 *    bytes; a symbol >= 2^b is FKVF_E_SYMBOL and nothing else.
 *  ngon: N 2..300, r in (0, r_N], span 1..L_max(r); encode either refuses
 *    (FKVF_E_CODEC, FKVF_E_SYMBOL for a symbol >= N) or its anchors decode
 *    (verified) back to the symbols, get agrees, points are the forward map
 *    of the last min(t+1, L) symbols, and the appender writes the same
 *    anchors. Sizes are bounded so one run stays fast. */
#include <math.h>

#include "codec/codec.h"
#include "fuzz_util.h"
#include "sym_appender.h"

#define MAX_SYM 600

static void fuzz_quad(fz *f)
{
    unsigned bits = 2u * (1u + fz_u8(f) % 16u);
    uint8_t mode = fz_u8(f);
    size_t n = fz_range(f, 0, MAX_SYM);
    uint32_t *sym = calloc(n ? n : 1, sizeof *sym);
    FZ_CHECK(sym);
    uint32_t mask = bits == 32 ? 0xFFFFFFFFu : (1u << bits) - 1u;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = fz_u32(f);
        sym[i] = (mode & 1) ? v : v & mask; /* mode bit 0: unmasked symbols */
        if (sym[i] > mask)
            bad = 1;
    }
    uint64_t bytes = 0;
    FZ_CHECK(fkvf_quad_data_bytes(n, bits, &bytes));
    FZ_CHECK(bytes == ((uint64_t)n * bits + 127) / 128 * 16);
    uint8_t *data = malloc(bytes ? bytes : 1);
    FZ_CHECK(data);
    int rc = fkvf_quad_encode(sym, n, bits, data, (size_t)bytes);
    if (bad) {
        FZ_CHECK(rc == FKVF_E_SYMBOL);
        goto out;
    }
    FZ_CHECK(rc == FKVF_OK);
    FZ_CHECK(fkvf_quad_padding_zero(data, (size_t)bytes, bits, n) == 1);
    uint32_t *dec = calloc(n ? n : 1, sizeof *dec);
    FZ_CHECK(dec);
    FZ_CHECK(fkvf_quad_decode(data, (size_t)bytes, bits, 0, n, dec) == FKVF_OK);
    FZ_CHECK(n == 0 || memcmp(dec, sym, n * sizeof *sym) == 0);
    /* a sub-range, and one past the end */
    if (n) {
        size_t a = fz_range(f, 0, (uint32_t)n - 1), c = fz_range(f, 0, (uint32_t)(n - a));
        memset(dec, 0, n * sizeof *dec);
        FZ_CHECK(fkvf_quad_decode(data, (size_t)bytes, bits, a, c, dec) == FKVF_OK);
        FZ_CHECK(c == 0 || memcmp(dec, sym + a, c * sizeof *sym) == 0);
    }
    uint64_t cap = bytes * 8 / bits; /* symbols the padded bytes hold */
    FZ_CHECK(fkvf_quad_decode(data, (size_t)bytes, bits, cap, 1, dec) == FKVF_E_RANGE);
    if (bits <= 8) {
        uint8_t *d8 = calloc(n ? n : 1, 1);
        FZ_CHECK(d8);
        FZ_CHECK(fkvf_quad_decode_u8(data, (size_t)bytes, bits, 0, n, d8) == FKVF_OK);
        for (size_t i = 0; i < n; i++)
            FZ_CHECK(d8[i] == sym[i]);
        free(d8);
    } else {
        uint8_t d8[1];
        FZ_CHECK(fkvf_quad_decode_u8(data, (size_t)bytes, bits, 0, 1, d8) == FKVF_E_INVALID_ARG);
    }
    for (size_t t = 0; t < n; t++) {
        FZ_CHECK(fkvf_quad_get(data, (size_t)bytes, bits, t) == sym[t]);
        if (t < 64 || t + 8 >= n || t % 37 == 0) {
            uint64_t x, y, rx, ry;
            fkvf_quad_point(data, (size_t)bytes, bits, t, &x, &y);
            fkvf_quad_point_ref(sym, t, bits, &rx, &ry);
            FZ_CHECK(x == rx && y == ry);
        }
    }
    free(dec);
    /* the appender writes the same bytes, also when read in between */
    fkvf_sym_appender ap;
    FZ_CHECK(fkvf_sym_appender_init_quad(&ap, bits, NULL) == FKVF_OK);
    size_t step = 1 + (mode >> 1) % 97;
    for (size_t i = 0; i < n; i++) {
        FZ_CHECK(fkvf_sym_appender_push(&ap, sym[i]) == FKVF_OK);
        const uint8_t *ad;
        size_t as;
        if ((i + 1) % step == 0 || i + 1 == n) {
            FZ_CHECK(fkvf_sym_appender_bytes(&ap, &ad, &as) == FKVF_OK);
            uint64_t want;
            FZ_CHECK(fkvf_quad_data_bytes(i + 1, bits, &want) && want == as);
            if (i + 1 == n)
                FZ_CHECK(as == bytes && memcmp(ad, data, as) == 0);
        }
    }
    fkvf_sym_appender_fini(&ap);
out:
    free(data);
    free(sym);
}

static void fuzz_ngon(fz *f)
{
    uint32_t N = 2 + fz_u16(f) % 299u;
    uint16_t rq = fz_u16(f);
    uint8_t sq = fz_u8(f);
    uint8_t mode = fz_u8(f);
    double rmax = fkvf_ngon_rmax(N);
    double r = (rq & 0x8000) ? rmax * (double)((rq & 0x7FFF) + 1) / 32768.0 : 0.0;
    uint32_t lmax = fkvf_ngon_max_span(r > 0 ? r : rmax);
    uint32_t span = sq == 0 || lmax == 0 ? 0 : 1 + (uint32_t)(sq - 1) % (lmax < 64 ? lmax : 64);
    fkvf_ngon g;
    memset(&g, 0, sizeof g);
    if (fkvf_ngon_init(&g, N, r, span, NULL, NULL) != FKVF_OK) {
        fkvf_ngon_fini(&g);
        return;
    }
    const uint32_t L = g.span;
    FZ_CHECK(L >= 1 && L <= 64);
    size_t n = fz_range(f, 0, 300);
    uint32_t *sym = calloc(n ? n : 1, sizeof *sym);
    FZ_CHECK(sym);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t v = fz_u16(f);
        sym[i] = (mode & 1) ? v : v % N;
        if (sym[i] >= N)
            bad = 1;
    }
    uint64_t bytes = 0;
    FZ_CHECK(fkvf_ngon_data_bytes(&g, n, &bytes) == 1 || n == 0);
    FZ_CHECK(bytes == ((uint64_t)n + L - 1) / L * 16);
    uint8_t *data = malloc(bytes ? bytes : 1);
    FZ_CHECK(data);
    int rc = fkvf_ngon_encode(&g, sym, n, data, (size_t)bytes);
    if (bad) {
        FZ_CHECK(rc == FKVF_E_SYMBOL);
        goto out;
    }
    FZ_CHECK(rc == FKVF_OK || rc == FKVF_E_CODEC);
    if (rc != FKVF_OK)
        goto out;
    uint32_t *dec = calloc(n ? n : 1, sizeof *dec);
    FZ_CHECK(dec);
    FZ_CHECK(fkvf_ngon_decode(&g, data, (size_t)bytes, n, 0, n, dec, 1) == FKVF_OK);
    FZ_CHECK(n == 0 || memcmp(dec, sym, n * sizeof *sym) == 0);
    if (n) {
        size_t a = fz_range(f, 0, (uint32_t)n - 1), c = fz_range(f, 0, (uint32_t)(n - a));
        memset(dec, 0, n * sizeof *dec);
        FZ_CHECK(fkvf_ngon_decode(&g, data, (size_t)bytes, n, a, c, dec, (mode >> 1) & 1) ==
                 FKVF_OK);
        FZ_CHECK(c == 0 || memcmp(dec, sym + a, c * sizeof *sym) == 0);
        FZ_CHECK(fkvf_ngon_decode(&g, data, (size_t)bytes, n, n, 1, dec, 1) != FKVF_OK);
    }
    for (size_t t = 0; t < n; t++) {
        uint32_t s;
        FZ_CHECK(fkvf_ngon_get(&g, data, (size_t)bytes, n, t, &s) == FKVF_OK && s == sym[t]);
        if (t < 16 || t + 4 >= n || t % 29 == 0) {
            double px, py, ex, ey;
            FZ_CHECK(fkvf_ngon_point(&g, data, (size_t)bytes, n, t, &px, &py) == FKVF_OK);
            uint32_t m = t + 1 < L ? (uint32_t)(t + 1) : L;
            fkvf_ngon_encode_span(&g, sym + t + 1 - m, m, &ex, &ey);
            FZ_CHECK(memcmp(&px, &ex, sizeof px) == 0 && memcmp(&py, &ey, sizeof py) == 0);
        }
    }
    free(dec);
    fkvf_sym_appender ap;
    FZ_CHECK(fkvf_sym_appender_init_ngon(&ap, &g, NULL) == FKVF_OK);
    size_t step = 1 + (mode >> 2) % 61;
    for (size_t i = 0; i < n; i++) {
        FZ_CHECK(fkvf_sym_appender_push(&ap, sym[i]) == FKVF_OK);
        if ((i + 1) % step == 0 || i + 1 == n) {
            const uint8_t *ad;
            size_t as;
            FZ_CHECK(fkvf_sym_appender_bytes(&ap, &ad, &as) == FKVF_OK);
            FZ_CHECK(as == ((i + 1) + L - 1) / L * 16);
            if (i + 1 == n)
                FZ_CHECK(as == bytes && memcmp(ad, data, as) == 0);
        }
    }
    fkvf_sym_appender_fini(&ap);
out:
    free(data);
    free(sym);
    fkvf_ngon_fini(&g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    if (fz_u8(&f) & 1)
        fuzz_ngon(&f);
    else
        fuzz_quad(&f);
    return 0;
}
