/* Check suite for the symbol codecs (spec 12): quad, ngon and the appender.
 *
 * Expected values come from code written here, independently of the code
 * under test where possible: a bit-by-bit packer for quad, the digit
 * recurrence for quad points, a plain forward loop for ngon anchors and
 * points, and an exhaustive argmin for the canonical ngon decoder. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"
#include "sym_appender.h"
#include "testutil.h"

static const uint32_t NGON_NS[] = {2, 3, 4, 5, 8, 16, 64, 256, 1024, 65536};
#define N_NGON ((int)(sizeof NGON_NS / sizeof NGON_NS[0]))

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static double bitsd(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* Random symbols with the extremes well represented. */
static void fill_symbols(tu_rng *rng, uint32_t *s, size_t n, uint64_t alphabet)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t v = tu_next(rng);
        switch (v & 7) {
        case 0: s[i] = 0; break;
        case 1: s[i] = (uint32_t)(alphabet - 1); break;
        default: s[i] = (uint32_t)((v >> 8) % alphabet); break;
        }
    }
}

/* ======================================================================== */
/* quad                                                                      */
/* ======================================================================== */

/* Naive packer: symbol t's bit i goes to stream bit t*bits + i, stream bit k
 * is bit k%8 of byte k/8. */
static void naive_pack(const uint32_t *s, size_t n, unsigned bits, uint8_t *out, size_t size)
{
    memset(out, 0, size);
    for (size_t t = 0; t < n; t++)
        for (unsigned i = 0; i < bits; i++)
            if ((s[t] >> i) & 1u) {
                size_t k = t * bits + i;
                out[k / 8] |= (uint8_t)(1u << (k % 8));
            }
}

/* The digit recurrence of spec 12.1, advanced by one symbol. */
static void quad_step(uint32_t sym, unsigned bits, uint64_t *x, uint64_t *y)
{
    for (unsigned i = 0; i < bits / 2; i++) {
        unsigned q = (sym >> (2 * i)) & 3u;
        *x = (*x >> 1) | ((uint64_t)(q & 1u) << 63);
        *y = (*y >> 1) | ((uint64_t)(q >> 1) << 63);
    }
}

START_TEST(quad_sizes)
{
    uint64_t v = 7;
    ck_assert_int_eq(fkvf_quad_data_bytes(0, 8, &v), 1);
    ck_assert_uint_eq(v, 0);
    ck_assert_int_eq(fkvf_quad_data_bytes(1, 8, &v), 1);
    ck_assert_uint_eq(v, 16);
    ck_assert_int_eq(fkvf_quad_data_bytes(16, 8, &v), 1);
    ck_assert_uint_eq(v, 16);
    ck_assert_int_eq(fkvf_quad_data_bytes(17, 8, &v), 1);
    ck_assert_uint_eq(v, 32);
    ck_assert_int_eq(fkvf_quad_data_bytes(21, 6, &v), 1); /* 126 bits */
    ck_assert_uint_eq(v, 16);
    ck_assert_int_eq(fkvf_quad_data_bytes(22, 6, &v), 1); /* 132 bits */
    ck_assert_uint_eq(v, 32);
    ck_assert_int_eq(fkvf_quad_data_bytes(UINT64_C(1) << 59, 32, &v), 0); /* overflow */
    ck_assert_int_eq(fkvf_quad_data_bytes(UINT64_MAX / 32, 32, &v), 1);
    v = 99;
    ck_assert_int_eq(fkvf_quad_data_bytes(5, 7, &v), 0); /* odd bits */
    ck_assert_int_eq(fkvf_quad_data_bytes(5, 0, &v), 0);
    ck_assert_int_eq(fkvf_quad_data_bytes(5, 34, &v), 0);
    ck_assert_uint_eq(v, 99);
    ck_assert_uint_eq(fkvf_quad_span_symbols(2), 64);
    ck_assert_uint_eq(fkvf_quad_span_symbols(6), 21);
    ck_assert_uint_eq(fkvf_quad_span_symbols(8), 16);
    ck_assert_uint_eq(fkvf_quad_span_symbols(30), 4);
    ck_assert_uint_eq(fkvf_quad_span_symbols(32), 4);
    ck_assert_uint_eq(fkvf_quad_span_symbols(3), 0);
}
END_TEST

/* Everything about one quad stream of n symbols. */
static void quad_check_stream(unsigned bits, size_t n, uint64_t seed, int all_points)
{
    tu_rng rng = {seed};
    uint64_t alpha = UINT64_C(1) << bits;
    uint32_t *s = tu_xcalloc(n, sizeof *s), *o = tu_xcalloc(n + 1, sizeof *o);
    fill_symbols(&rng, s, n, alpha);
    uint64_t size64;
    ck_assert(fkvf_quad_data_bytes(n, bits, &size64));
    size_t size = (size_t)size64;
    ck_assert_uint_eq(size % 16, 0);
    ck_assert_uint_eq(size, (n * bits + 127) / 128 * 16);
    uint8_t *enc = tu_xcalloc(size + 1, 1), *ref = tu_xcalloc(size + 1, 1);
    memset(enc, 0xA5, size + 1); /* encode must write every byte, padding included */
    ck_assert_int_eq(fkvf_quad_encode(s, n, bits, enc, size), FKVF_OK);
    ck_assert_uint_eq(enc[size], 0xA5); /* and nothing past the end */
    naive_pack(s, n, bits, ref, size);
    ck_assert_mem_eq(enc, ref, size);
    ck_assert_int_eq(fkvf_quad_padding_zero(enc, size, bits, n), 1);

    /* read from an odd address */
    uint8_t *d = tu_dup_odd(enc, size);
    ck_assert_ptr_nonnull(d);
    ck_assert_int_eq(fkvf_quad_decode(d, size, bits, 0, n, o), FKVF_OK);
    ck_assert_mem_eq(o, s, n * sizeof *s);
    for (size_t t = 0; t < n; t++)
        ck_assert_uint_eq(fkvf_quad_get(d, size, bits, t), s[t]);
    /* sub-ranges */
    for (int k = 0; k < 20 && n; k++) {
        size_t first = tu_below(&rng, (uint32_t)n), cnt = tu_below(&rng, (uint32_t)(n - first + 1));
        if (k == 0) {
            first = n - 1;
            cnt = 1;
        }
        memset(o, 0xEE, (n + 1) * sizeof *o);
        ck_assert_int_eq(fkvf_quad_decode(d, size, bits, first, cnt, o), FKVF_OK);
        ck_assert_mem_eq(o, s + first, cnt * sizeof *s);
        ck_assert_uint_eq(o[cnt], 0xEEEEEEEEu);
    }
    /* out of range: one symbol past the end of the data */
    size_t cap = size * 8 / bits; /* symbols that fit in the data */
    ck_assert_int_eq(fkvf_quad_decode(d, size, bits, 0, cap + 1, o), FKVF_E_RANGE);
    ck_assert_int_eq(fkvf_quad_decode(d, size, bits, cap, 1, o), FKVF_E_RANGE);
    ck_assert_int_eq(fkvf_quad_decode(d, size, bits, UINT64_MAX, 2, o), FKVF_E_RANGE);
    ck_assert_int_eq(fkvf_quad_decode(d, size, bits, cap, 0, o), FKVF_OK);

    /* points: the recurrence run here, and the reference in the library */
    uint64_t x = 0, y = 0;
    for (size_t t = 0; t < n; t++) {
        quad_step(s[t], bits, &x, &y);
        if (!all_points && t % 97 != 0 && t + 1 != n)
            continue;
        uint64_t px, py;
        fkvf_quad_point(d, size, bits, t, &px, &py);
        ck_assert_uint_eq(px, x);
        ck_assert_uint_eq(py, y);
        if (t < 300) {
            fkvf_quad_point_ref(s, t, bits, &px, &py);
            ck_assert_uint_eq(px, x);
            ck_assert_uint_eq(py, y);
        }
    }
    /* a full span's anchor, read as a 128-bit Morton value, is its bytes */
    size_t per = 128 / bits;
    if (128 % bits == 0 && n >= per) {
        uint64_t px, py;
        fkvf_quad_point(d, size, bits, per - 1, &px, &py);
        uint64_t lo = 0, hi = 0;
        for (int i = 0; i < 8; i++) {
            lo |= (uint64_t)enc[i] << (8 * i);
            hi |= (uint64_t)enc[8 + i] << (8 * i);
        }
        uint64_t zx = 0, zy = 0;
        for (int i = 0; i < 32; i++) {
            zx |= ((lo >> (2 * i)) & 1) << i | ((hi >> (2 * i)) & 1) << (i + 32);
            zy |= ((lo >> (2 * i + 1)) & 1) << i | ((hi >> (2 * i + 1)) & 1) << (i + 32);
        }
        ck_assert_uint_eq(px, zx);
        ck_assert_uint_eq(py, zy);
    }
    /* padding: any set bit after the last symbol is caught */
    if (n * bits < size * 8) {
        size_t k = n * bits + tu_below(&rng, (uint32_t)(size * 8 - n * bits));
        d[k / 8] ^= (uint8_t)(1u << (k % 8));
        ck_assert_int_eq(fkvf_quad_padding_zero(d, size, bits, n), 0);
        d[k / 8] ^= (uint8_t)(1u << (k % 8));
        ck_assert_int_eq(fkvf_quad_padding_zero(d, size, bits, n), 1);
    }
    tu_free_odd(d);
    free(s);
    free(o);
    free(enc);
    free(ref);
}

START_TEST(quad_roundtrip_widths)
{
    unsigned bits = 2 + 2 * (unsigned)_i; /* 2..32 */
    size_t per = 128 / bits;
    const size_t lens[] = {0,       1,       per - 1, per,     per + 1, 2 * per,
                           2 * per + 1, 64, 65,      127,     128,     129,
                           1000,    4099};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
        quad_check_stream(bits, lens[k], 1000 * bits + k, lens[k] <= 1000);
}
END_TEST

START_TEST(quad_large)
{
    /* >= 10^6 symbols: the 8/16-bit fast paths and the generic path */
    const unsigned widths[] = {8, 16, 6};
    for (int w = 0; w < 3; w++) {
        unsigned bits = widths[w];
        size_t n = 1000003;
        tu_rng rng = {77 + (uint64_t)w};
        uint32_t *s = tu_xcalloc(n, sizeof *s), *o = tu_xcalloc(n, sizeof *o);
        fill_symbols(&rng, s, n, UINT64_C(1) << bits);
        uint64_t size;
        ck_assert(fkvf_quad_data_bytes(n, bits, &size));
        uint8_t *enc = tu_xcalloc((size_t)size, 1), *ref = tu_xcalloc((size_t)size, 1);
        ck_assert_int_eq(fkvf_quad_encode(s, n, bits, enc, (size_t)size), FKVF_OK);
        naive_pack(s, n, bits, ref, (size_t)size);
        ck_assert_mem_eq(enc, ref, (size_t)size);
        ck_assert_int_eq(fkvf_quad_decode(enc, (size_t)size, bits, 0, n, o), FKVF_OK);
        ck_assert_mem_eq(o, s, n * sizeof *s);
        for (size_t t = 0; t < n; t += 1 + tu_below(&rng, 50))
            ck_assert_uint_eq(fkvf_quad_get(enc, (size_t)size, bits, t), s[t]);
        ck_assert_uint_eq(fkvf_quad_get(enc, (size_t)size, bits, n - 1), s[n - 1]);
        ck_assert_int_eq(fkvf_quad_padding_zero(enc, (size_t)size, bits, n), 1);
        free(s);
        free(o);
        free(enc);
        free(ref);
    }
}
END_TEST

/* Byte output for widths <= 8 equals the naive packer's symbols at every
 * (first, n), from an odd address; wider widths are refused. */
START_TEST(quad_decode_u8)
{
    tu_rng rng = {0xB17E5};
    enum { N = 700 };
    uint32_t s[N];
    for (unsigned bits = 2; bits <= 8; bits += 2) {
        for (size_t t = 0; t < N; t++)
            s[t] = tu_below(&rng, 1u << bits);
        size_t size = (N * bits + 127) / 128 * 16;
        uint8_t packed[N * 2];
        naive_pack(s, N, bits, packed, size);
        uint8_t *odd = tu_dup_odd(packed, size);
        uint8_t out[N + 1];
        for (size_t first = 0; first < 40; first++)
            for (size_t n = 0; first + n <= N; n += 1 + n / 3) {
                memset(out, 0xEE, sizeof out);
                ck_assert_int_eq(fkvf_quad_decode_u8(odd, size, bits, first, n, out), FKVF_OK);
                for (size_t k = 0; k < n; k++)
                    ck_assert_uint_eq(out[k], s[first + k]);
                ck_assert_uint_eq(out[n], 0xEE); /* nothing written past n */
            }
        ck_assert_int_eq(fkvf_quad_decode_u8(odd, size, bits, 0, N + 200, out), FKVF_E_RANGE);
        tu_free_odd(odd);
    }
    uint8_t d[16] = {0}, o[4];
    ck_assert_int_eq(fkvf_quad_decode_u8(d, 16, 10, 0, 1, o), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_quad_decode_u8(d, 16, 7, 0, 1, o), FKVF_E_INVALID_ARG);
}
END_TEST

START_TEST(quad_rejects)
{
    uint8_t out[64];
    for (unsigned bits = 2; bits < 32; bits += 2) {
        uint32_t s[3] = {0, (uint32_t)1 << bits, 1};
        ck_assert_int_eq(fkvf_quad_encode(s, 3, bits, out, sizeof out), FKVF_E_SYMBOL);
        s[1] = UINT32_MAX;
        ck_assert_int_eq(fkvf_quad_encode(s, 3, bits, out, sizeof out), FKVF_E_SYMBOL);
        s[1] = ((uint32_t)1 << bits) - 1;
        ck_assert_int_eq(fkvf_quad_encode(s, 3, bits, out, sizeof out), FKVF_OK);
    }
    uint32_t s[3] = {UINT32_MAX, 0, UINT32_MAX};
    ck_assert_int_eq(fkvf_quad_encode(s, 3, 32, out, sizeof out), FKVF_OK);
    ck_assert_int_eq(fkvf_quad_encode(s, 3, 32, out, 15), FKVF_E_INVALID_ARG); /* too small */
    ck_assert_int_eq(fkvf_quad_encode(s, 3, 7, out, sizeof out), FKVF_E_INVALID_ARG);
    uint32_t o[3];
    ck_assert_int_eq(fkvf_quad_decode(out, 16, 5, 0, 1, o), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_quad_encode(NULL, 0, 8, NULL, 0), FKVF_OK);
}
END_TEST

START_TEST(quad_point_edges)
{
    /* short streams: the window reaches before bit 0 */
    const uint32_t s[3] = {0x3, 0x1, 0x2};
    uint8_t d[16];
    ck_assert_int_eq(fkvf_quad_encode(s, 3, 2, d, 16), FKVF_OK);
    uint64_t x, y;
    fkvf_quad_point(d, 16, 2, 0, &x, &y); /* digit 3 -> (1, 1) */
    ck_assert_uint_eq(x, UINT64_C(1) << 63);
    ck_assert_uint_eq(y, UINT64_C(1) << 63);
    fkvf_quad_point(d, 16, 2, 2, &x, &y); /* digits 3,1,2: x = 0.011b, y = 0.101b */
    ck_assert_uint_eq(x, UINT64_C(3) << 61);
    ck_assert_uint_eq(y, UINT64_C(5) << 61);
    /* 32-bit symbols: the first point is the symbol de-interleaved */
    const uint32_t w[1] = {0xFFFF0000u};
    ck_assert_int_eq(fkvf_quad_encode(w, 1, 32, d, 16), FKVF_OK);
    fkvf_quad_point(d, 16, 32, 0, &x, &y);
    ck_assert_uint_eq(x, UINT64_C(0xFF00) << 48);
    ck_assert_uint_eq(y, UINT64_C(0xFF00) << 48);
}
END_TEST

/* ======================================================================== */
/* ngon                                                                      */
/* ======================================================================== */

/* The spec's forward map, written again here. */
static void fwd(const fkvf_ngon *g, const uint32_t *s, size_t len, double *ax, double *ay)
{
    double x = 0.0, y = 0.0;
    for (size_t k = 0; k < len; k++) {
        double vx = g->vx[s[k]], vy = g->vy[s[k]];
        x = vx + g->r * (x - vx);
        y = vy + g->r * (y - vy);
    }
    *ax = x;
    *ay = y;
}

/* The spec's argmin, exhaustively: first c with the least distance. */
static uint32_t naive_argmin(const fkvf_ngon *g, double px, double py)
{
    uint32_t best = 0;
    double bd = 0;
    for (uint32_t c = 0; c < g->n; c++) {
        double dx = px - g->vx[c], dy = py - g->vy[c];
        double d = dx * dx + dy * dy;
        if (c == 0 || d < bd) {
            bd = d;
            best = c;
        }
    }
    return best;
}

static void ngon_init_ok(fkvf_ngon *g, uint32_t n, double r, uint32_t span)
{
    int rc = fkvf_ngon_init(g, n, r, span, NULL, NULL);
    ck_assert_msg(rc == FKVF_OK, "ngon_init(%u) = %d", n, rc);
}

START_TEST(ngon_vertices_and_limits)
{
    for (int i = 0; i < N_NGON; i++) {
        uint32_t n = NGON_NS[i];
        double *xy = tu_xcalloc(2 * (size_t)n, sizeof *xy);
        fkvf_ngon_make_vertices(n, xy);
        ck_assert(dbits(xy[0]) == dbits(1.0) && dbits(xy[1]) == dbits(0.0));
        for (uint32_t c = 0; c < n; c++) {
            double a = 2.0 * 3.14159265358979323846 * c / n;
            ck_assert_double_eq_tol(xy[2 * c], cos(a), 2e-15);
            ck_assert_double_eq_tol(xy[2 * c + 1], sin(a), 2e-15);
            /* mirror symmetry holds exactly */
            if (c) {
                ck_assert(dbits(xy[2 * c]) == dbits(xy[2 * (n - c)]));
                ck_assert(dbits(xy[2 * c + 1]) == dbits(-xy[2 * (n - c) + 1]) ||
                          (xy[2 * c + 1] == 0 && xy[2 * (n - c) + 1] == 0));
            }
        }
        double rn = fkvf_ngon_rmax(n);
        ck_assert(dbits(rn) == dbits(fkvf_ngon_rmax_table(n, xy)));
        /* 1/r_N = 2 (1 + sum_{k=1}^{N/4} cos(2 pi k / N)) */
        double s = 1.0;
        for (uint32_t k = 1; k <= n / 4; k++)
            s += cos(2.0 * 3.14159265358979323846 * k / n);
        ck_assert_double_eq_tol(rn, 1.0 / (2.0 * s), 1e-12 * rn);
        ck_assert_int_eq(fkvf_ngon_check_params(n, xy, rn, fkvf_ngon_max_span(rn)), FKVF_OK);
        free(xy);
    }
    ck_assert(fkvf_ngon_rmax(2) == 0.5 && fkvf_ngon_rmax(3) == 0.5 && fkvf_ngon_rmax(4) == 0.5);
    ck_assert_double_eq_tol(fkvf_ngon_rmax(256), 0.012124, 5e-7);
    ck_assert(fkvf_ngon_rmax(1) == 0.0 && fkvf_ngon_rmax(65537) == 0.0);
    /* L_max: q^L <= 2^44 */
    ck_assert_uint_eq(fkvf_ngon_max_span(0.5), 44);
    ck_assert_uint_eq(fkvf_ngon_max_span(0.25), 22);
    ck_assert_uint_eq(fkvf_ngon_max_span(1.0 / 1024), 4);
    ck_assert_uint_eq(fkvf_ngon_max_span(fkvf_ngon_rmax(256)), 6);
    ck_assert_uint_eq(fkvf_ngon_max_span(fkvf_ngon_rmax(65536)), 3);
    ck_assert_uint_eq(fkvf_ngon_max_span(0.0), 0);
    ck_assert_uint_eq(fkvf_ngon_max_span(-0.5), 0);
    ck_assert_uint_eq(fkvf_ngon_max_span(NAN), 0);
    ck_assert_uint_eq(fkvf_ngon_max_span(INFINITY), 0);
    ck_assert_uint_eq(fkvf_ngon_max_span(1e-300), 0); /* q = 1e300 > 2^44 */
    /* independent check of the L_max definition for a few ratios */
    for (int i = 0; i < N_NGON; i++) {
        double r = fkvf_ngon_rmax(NGON_NS[i]);
        uint32_t l = fkvf_ngon_max_span(r);
        double q = 1.0 / r, p = 1.0;
        for (uint32_t k = 0; k < l; k++)
            p *= q;
        ck_assert(p <= 0x1p44 && p * q > 0x1p44);
    }
}
END_TEST

START_TEST(ngon_check_params)
{
    const uint32_t n = 16;
    double xy[32], bad[32];
    fkvf_ngon_make_vertices(n, xy);
    double rn = fkvf_ngon_rmax_table(n, xy);
    uint32_t lm = fkvf_ngon_max_span(rn);
    ck_assert_int_eq(fkvf_ngon_check_params(n, xy, rn, lm), FKVF_OK);
    ck_assert_int_eq(fkvf_ngon_check_params(n, xy, rn, 1), FKVF_OK);
    ck_assert_int_eq(fkvf_ngon_check_params(n, xy, rn / 3, fkvf_ngon_max_span(rn / 3)), FKVF_OK);
    /* N */
    ck_assert_int_eq(fkvf_ngon_check_params(1, xy, 0.5, 1), FKVF_E_CORRUPT);
    ck_assert_int_eq(fkvf_ngon_check_params(0, xy, 0.5, 1), FKVF_E_CORRUPT);
    ck_assert_int_eq(fkvf_ngon_check_params(65537, xy, 0.5, 1), FKVF_E_CORRUPT);
    ck_assert_int_eq(fkvf_ngon_check_params(n, NULL, rn, 1), FKVF_E_CORRUPT);
    /* r */
    ck_assert_int_eq(fkvf_ngon_check_params(n, xy, 0.0, 1), FKVF_E_CORRUPT);
    ck_assert_int_eq(fkvf_ngon_check_params(n, xy, -rn, 1), FKVF_E_CORRUPT);
    ck_assert_int_eq(fkvf_ngon_check_params(n, xy, NAN, 1), FKVF_E_CORRUPT);
    ck_assert_int_eq(fkvf_ngon_check_params(n, xy, INFINITY, 1), FKVF_E_CORRUPT);
    ck_assert_int_eq(fkvf_ngon_check_params(n, xy, nextafter(rn, 1.0), 1), FKVF_E_CORRUPT);
    ck_assert_int_eq(fkvf_ngon_check_params(n, xy, 0.5, 1), FKVF_E_CORRUPT);
    /* span */
    ck_assert_int_eq(fkvf_ngon_check_params(n, xy, rn, 0), FKVF_E_CORRUPT);
    ck_assert_int_eq(fkvf_ngon_check_params(n, xy, rn, lm + 1), FKVF_E_CORRUPT);
    ck_assert_int_eq(fkvf_ngon_check_params(n, xy, rn, 65), FKVF_E_LIMIT);
    /* table */
    memcpy(bad, xy, sizeof bad);
    bad[0] = nextafter(1.0, 2.0);
    ck_assert_int_eq(fkvf_ngon_check_params(n, bad, rn, 1), FKVF_E_CORRUPT);
    memcpy(bad, xy, sizeof bad);
    bad[1] = -0.0; /* V(0) = (1, 0) exactly, +0 */
    ck_assert_int_eq(fkvf_ngon_check_params(n, bad, rn, 1), FKVF_E_CORRUPT);
    memcpy(bad, xy, sizeof bad);
    bad[11] = NAN;
    ck_assert_int_eq(fkvf_ngon_check_params(n, bad, rn, 1), FKVF_E_CORRUPT);
    memcpy(bad, xy, sizeof bad);
    bad[20] = INFINITY;
    ck_assert_int_eq(fkvf_ngon_check_params(n, bad, rn, 1), FKVF_E_CORRUPT);
    memcpy(bad, xy, sizeof bad);
    bad[30] *= 1.0 + 0x1p-38; /* norm^2 off by ~2^-38 |x|^2 */
    bad[31] *= 1.0 + 0x1p-38;
    ck_assert_int_eq(fkvf_ngon_check_params(n, bad, rn, 1), FKVF_E_CORRUPT);
    memcpy(bad, xy, sizeof bad);
    bad[30] *= 1.0 + 0x1p-44; /* within 2^-40: accepted */
    bad[31] *= 1.0 + 0x1p-44;
    ck_assert_int_eq(fkvf_ngon_check_params(n, bad, rn, 1), FKVF_OK);
    memcpy(bad, xy, sizeof bad);
    bad[4] = 0.0; /* V(2) = (0, 0) */
    bad[5] = 0.0;
    ck_assert_int_eq(fkvf_ngon_check_params(n, bad, rn, 1), FKVF_E_CORRUPT);
    /* r is checked against the table's own r_N: a table with larger x for
     * k <= N/4 lowers r_N */
    memcpy(bad, xy, sizeof bad);
    bad[2] = 1.0; /* V(1) = (1, 0) */
    bad[3] = 0.0;
    ck_assert_int_eq(fkvf_ngon_check_params(n, bad, rn, 1), FKVF_E_CORRUPT);
    ck_assert_int_eq(fkvf_ngon_check_params(n, bad, fkvf_ngon_rmax_table(n, bad), 1), FKVF_OK);

    /* init applies the same checks and fills defaults */
    fkvf_ngon g;
    ck_assert_int_eq(fkvf_ngon_init(&g, n, rn, 65, xy, NULL), FKVF_E_LIMIT);
    ck_assert_int_eq(fkvf_ngon_init(&g, n, 0.5, 0, xy, NULL), FKVF_E_CORRUPT);
    ck_assert_int_eq(fkvf_ngon_init(&g, 1, 0, 0, NULL, NULL), FKVF_E_CORRUPT);
    ck_assert_int_eq(fkvf_ngon_init(&g, n, 0, 0, bad, NULL), FKVF_OK);
    fkvf_ngon_fini(&g);
    ck_assert_int_eq(fkvf_ngon_init(&g, n, 0, 0, xy, NULL), FKVF_OK);
    ck_assert(dbits(g.r) == dbits(rn));
    ck_assert_uint_eq(g.span, lm);
    fkvf_ngon_fini(&g);
    fkvf_ngon_fini(&g); /* idempotent */
}
END_TEST

/* Everything about one ngon stream of n symbols. */
/* regular = 0: a table on which the unverified fast decoder may guess
 * wrong, so only verified decoding is checked. */
static void ngon_check_stream(const fkvf_ngon *g, size_t n, uint64_t seed, int all_points,
                              int regular)
{
    tu_rng rng = {seed};
    const uint32_t L = g->span;
    uint32_t *s = tu_xcalloc(n, sizeof *s), *o = tu_xcalloc(n + 1, sizeof *o);
    fill_symbols(&rng, s, n, g->n);
    uint64_t size64;
    ck_assert(fkvf_ngon_data_bytes(g, n, &size64));
    size_t size = (size_t)size64;
    ck_assert_uint_eq(size, (n + L - 1) / L * 16);
    uint8_t *enc = tu_xcalloc(size + 1, 1);
    enc[size] = 0x5A;
    ck_assert_int_eq(fkvf_ngon_encode(g, s, n, enc, size), FKVF_OK);
    ck_assert_uint_eq(enc[size], 0x5A);
    /* anchors = the forward map of each span, as f64 LE */
    for (size_t j = 0; j * L < n; j++) {
        size_t len = n - j * L < L ? n - j * L : L;
        double ax, ay;
        fwd(g, s + j * L, len, &ax, &ay);
        uint64_t ux = 0, uy = 0;
        for (int i = 0; i < 8; i++) {
            ux |= (uint64_t)enc[16 * j + i] << (8 * i);
            uy |= (uint64_t)enc[16 * j + 8 + i] << (8 * i);
        }
        ck_assert_uint_eq(ux, dbits(ax));
        ck_assert_uint_eq(uy, dbits(ay));
        /* the canonical decoder is the exhaustive argmin, and so is the
         * fast one */
        uint32_t tmp[64], tmpf[64];
        fkvf_ngon_decode_span_canonical(g, ax, ay, (uint32_t)len, tmp);
        fkvf_ngon_decode_span_fast(g, ax, ay, (uint32_t)len, tmpf);
        ck_assert_mem_eq(tmpf, tmp, len * sizeof *tmp);
        double px = ax, py = ay;
        for (size_t k = len; k > 0; k--) {
            uint32_t c = naive_argmin(g, px, py);
            ck_assert_uint_eq(tmp[k - 1], c);
            ck_assert_uint_eq(c, s[j * L + k - 1]);
            px = g->vx[c] + (px - g->vx[c]) / g->r;
            py = g->vy[c] + (py - g->vy[c]) / g->r;
        }
    }
    uint8_t *d = tu_dup_odd(enc, size);
    ck_assert_ptr_nonnull(d);
    for (int verify = !regular; verify < 2; verify++) {
        memset(o, 0xEE, (n + 1) * sizeof *o);
        ck_assert_int_eq(fkvf_ngon_decode(g, d, size, n, 0, n, o, verify), FKVF_OK);
        ck_assert_mem_eq(o, s, n * sizeof *s);
        ck_assert_uint_eq(o[n], 0xEEEEEEEEu);
    }
    for (size_t t = 0; t < n; t++) {
        uint32_t v = UINT32_MAX;
        ck_assert_int_eq(fkvf_ngon_get(g, d, size, n, t, &v), FKVF_OK);
        ck_assert_uint_eq(v, s[t]);
        if (!all_points && t % 41 != 0 && t + 1 != n)
            continue;
        double px, py, ex, ey;
        ck_assert_int_eq(fkvf_ngon_point(g, d, size, n, t, &px, &py), FKVF_OK);
        size_t cnt = t + 1 < L ? t + 1 : L;
        fwd(g, s + t + 1 - cnt, cnt, &ex, &ey);
        ck_assert_uint_eq(dbits(px), dbits(ex));
        ck_assert_uint_eq(dbits(py), dbits(ey));
    }
    for (int k = 0; k < 30 && n; k++) {
        size_t first = tu_below(&rng, (uint32_t)n), cnt = tu_below(&rng, (uint32_t)(n - first + 1));
        if (k < 3) { /* span-aligned and boundary-crossing cases */
            first = k == 0 ? 0 : k == 1 ? (n > L ? L : 0) : (n > L ? L - 1 : 0);
            cnt = n - first;
        }
        memset(o, 0xEE, (n + 1) * sizeof *o);
        ck_assert_int_eq(fkvf_ngon_decode(g, d, size, n, first, cnt, o, (k & 1) || !regular),
                         FKVF_OK);
        ck_assert_mem_eq(o, s + first, cnt * sizeof *s);
        ck_assert_uint_eq(o[cnt], 0xEEEEEEEEu);
    }
    /* ranges */
    uint32_t v;
    double px, py;
    ck_assert_int_eq(fkvf_ngon_get(g, d, size, n, n, &v), FKVF_E_RANGE);
    ck_assert_int_eq(fkvf_ngon_point(g, d, size, n, n, &px, &py), FKVF_E_RANGE);
    ck_assert_int_eq(fkvf_ngon_decode(g, d, size, n, 0, n + 1, o, 1), FKVF_E_RANGE);
    ck_assert_int_eq(fkvf_ngon_decode(g, d, size, n, UINT64_MAX, 2, o, 1), FKVF_E_RANGE);
    if (n) {
        ck_assert_int_eq(fkvf_ngon_decode(g, d, size - 1, n, 0, 1, o, 1), FKVF_E_RANGE);
        ck_assert_int_eq(fkvf_ngon_get(g, d, size - 16, n, 0, &v), FKVF_E_RANGE);
    }
    ck_assert_int_eq(fkvf_ngon_decode(g, d, size, n, n, 0, o, 1), FKVF_OK);
    tu_free_odd(d);
    free(s);
    free(o);
    free(enc);
}

START_TEST(ngon_roundtrip)
{
    fkvf_ngon g;
    uint32_t n = NGON_NS[_i];
    ngon_init_ok(&g, n, 0, 0);
    const size_t L = g.span;
    const size_t lens[] = {0, 1, L - 1, L, L + 1, 2 * L, 2 * L + 1, 4 * L, 5 * L - 1,
                           64, 65, 127, 128, 129, 3001};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
        ngon_check_stream(&g, lens[k], 31 * n + k, lens[k] < 1000, 1);
    fkvf_ngon_fini(&g);
    /* a smaller ratio and a shorter span than the maximum */
    ngon_init_ok(&g, n, fkvf_ngon_rmax(n) * 0.75, 0);
    ck_assert_uint_eq(g.span, fkvf_ngon_max_span(g.r));
    ngon_check_stream(&g, 300, 7 * n, 1, 1);
    fkvf_ngon_fini(&g);
    ngon_init_ok(&g, n, 0, 1);
    ngon_check_stream(&g, 200, 9 * n, 1, 1);
    fkvf_ngon_fini(&g);
}
END_TEST

START_TEST(ngon_large)
{
    const uint32_t ns[2] = {256, 16};
    for (int i = 0; i < 2; i++) {
        fkvf_ngon g;
        ngon_init_ok(&g, ns[i], 0, 0);
        size_t n = 1000001;
        tu_rng rng = {4242 + (uint64_t)i};
        uint32_t *s = tu_xcalloc(n, sizeof *s), *o = tu_xcalloc(n, sizeof *o);
        fill_symbols(&rng, s, n, g.n);
        uint64_t size;
        ck_assert(fkvf_ngon_data_bytes(&g, n, &size));
        uint8_t *enc = tu_xcalloc((size_t)size, 1);
        ck_assert_int_eq(fkvf_ngon_encode(&g, s, n, enc, (size_t)size), FKVF_OK);
        for (int verify = 0; verify < 2; verify++) {
            memset(o, 0, n * sizeof *o);
            ck_assert_int_eq(fkvf_ngon_decode(&g, enc, (size_t)size, n, 0, n, o, verify), FKVF_OK);
            ck_assert_mem_eq(o, s, n * sizeof *s);
        }
        for (size_t t = 0; t < n; t += 1 + tu_below(&rng, 500)) {
            uint32_t v;
            ck_assert_int_eq(fkvf_ngon_get(&g, enc, (size_t)size, n, t, &v), FKVF_OK);
            ck_assert_uint_eq(v, s[t]);
        }
        free(s);
        free(o);
        free(enc);
        fkvf_ngon_fini(&g);
    }
}
END_TEST

/* The canonical decoder, and the fast one, equal the exhaustive argmin on
 * arbitrary points, ties included. */
START_TEST(ngon_canonical_equals_exhaustive)
{
    fkvf_ngon g;
    uint32_t n = NGON_NS[_i];
    ngon_init_ok(&g, n, 0, 0);
    tu_rng rng = {999 + n};
    const int count = n >= 65536 ? 300 : n >= 1024 ? 2000 : 5000;
    for (int i = 0; i < count + 64; i++) {
        double px, py;
        uint32_t c = tu_below(&rng, n), c2 = (c + 1 + tu_below(&rng, 3)) % n;
        double u = (double)(tu_next(&rng) >> 11) * 0x1p-53;
        switch (i < count ? i % 10 : 10 + (i - count) % 16) {
        case 0: /* random in the disk of radius 1.5 */
            px = 3 * u - 1.5;
            py = 3.0 * (double)(tu_next(&rng) >> 11) * 0x1p-53 - 1.5;
            break;
        case 1: /* near a vertex */
            px = g.vx[c] + (u - 0.5) * 1e-3;
            py = g.vy[c] + ((double)(tu_next(&rng) >> 11) * 0x1p-53 - 0.5) * 1e-3;
            break;
        case 2: /* on the segment between two vertices (bisector ties) */
            px = 0.5 * (g.vx[c] + g.vx[c2]);
            py = 0.5 * (g.vy[c] + g.vy[c2]);
            break;
        case 3: /* on the ray of a vertex, any radius */
            px = g.vx[c] * u * 3;
            py = g.vy[c] * u * 3;
            break;
        case 4: /* on the bisector ray of two neighbours */
            px = (g.vx[c] + g.vx[(c + 1) % n]) * u;
            py = (g.vy[c] + g.vy[(c + 1) % n]) * u;
            break;
        case 5: /* tiny */
            px = (u - 0.5) * 1e-300;
            py = (u - 0.25) * 1e-310;
            break;
        case 6: /* far */
            px = (u - 0.5) * 1e6;
            py = (u - 0.3) * 1e7;
            break;
        case 7: /* very far: beyond the bounded search */
            px = (u - 0.5) * 1e200;
            py = -(u - 0.7) * 1e300;
            break;
        case 8: /* a vertex exactly */
            px = g.vx[c];
            py = g.vy[c];
            break;
        case 9: /* a real backward point: the anchor of a short span */
        {
            uint32_t s[2] = {c, c2};
            fwd(&g, s, 1 + (i & 1), &px, &py);
            break;
        }
        default: { /* fixed specials */
            static const double sp[16][2] = {
                {0, 0},      {-0.0, 0},    {0, -0.0},  {-0.0, -0.0}, {1, 0},     {-1, 0},
                {0, 1},      {0, -1},      {0.5, 0.5}, {-0.5, 0.5},  {1e-320, 0}, {0, 1e-320},
                {1e154, 1e154}, {-1e154, 1e154}, {0x1p500, 0}, {0, -0x1p501}};
            px = sp[(i - count) % 16][0];
            py = sp[(i - count) % 16][1];
            break;
        }
        }
        uint32_t got, fast;
        uint32_t want = naive_argmin(&g, px, py);
        fkvf_ngon_decode_span_canonical(&g, px, py, 1, &got);
        ck_assert_msg(got == want, "N=%u p=(%a, %a): %u vs %u", n, px, py, got, want);
        /* the fast decoder certifies its answer or falls back: same result */
        fkvf_ngon_decode_span_fast(&g, px, py, 1, &fast);
        ck_assert_msg(fast == want, "fast N=%u p=(%a, %a): %u vs %u", n, px, py, fast, want);
    }
    /* non-finite points are defined too (first vertex) */
    uint32_t got;
    fkvf_ngon_decode_span_canonical(&g, NAN, 0.5, 1, &got);
    ck_assert_uint_eq(got, naive_argmin(&g, NAN, 0.5));
    fkvf_ngon_decode_span_canonical(&g, INFINITY, -INFINITY, 1, &got);
    ck_assert_uint_eq(got, naive_argmin(&g, INFINITY, -INFINITY));
    fkvf_ngon_fini(&g);
}
END_TEST

START_TEST(ngon_rejects_symbols)
{
    for (int i = 0; i < N_NGON; i++) {
        fkvf_ngon g;
        ngon_init_ok(&g, NGON_NS[i], 0, 0);
        size_t n = 3 * g.span + 1;
        uint32_t *s = tu_xcalloc(n, sizeof *s);
        uint8_t *out = tu_xcalloc(16 * n, 1);
        s[n - 1] = g.n;
        ck_assert_int_eq(fkvf_ngon_encode(&g, s, n, out, 16 * n), FKVF_E_SYMBOL);
        s[n - 1] = UINT32_MAX;
        ck_assert_int_eq(fkvf_ngon_encode(&g, s, n, out, 16 * n), FKVF_E_SYMBOL);
        s[n - 1] = g.n - 1;
        ck_assert_int_eq(fkvf_ngon_encode(&g, s, n, out, 16 * n), FKVF_OK);
        ck_assert_int_eq(fkvf_ngon_encode(&g, s, n, out, 16 * 3), FKVF_E_INVALID_ARG);
        free(s);
        free(out);
        fkvf_ngon_fini(&g);
    }
}
END_TEST

/* Golden anchors: a fixed N=5 table (glibc's values, spelled out so that no
 * libm is involved) and 1000 fixed spans hashed bit for bit. Catches any
 * build whose arithmetic differs from the spec's binary64 without FMA (a
 * compiler contracting a*b+c into fma changes this hash). */
START_TEST(ngon_golden)
{
    static const double xy[10] = {
        0x1p+0,  0x0p+0,  0x1.3c6ef372fe94fp-2,  0x1.e6f0e134454ffp-1,  -0x1.9e3779b97f4a8p-1,
        0x1.2cf2304755a5ep-1,  -0x1.9e3779b97f4a8p-1,  -0x1.2cf2304755a5ep-1,
        0x1.3c6ef372fe94fp-2,  -0x1.e6f0e134454ffp-1};
    fkvf_ngon g;
    ck_assert_int_eq(fkvf_ngon_init(&g, 5, 0, 0, xy, NULL), FKVF_OK);
    ck_assert_uint_eq(dbits(g.r), dbits(0x1.8722191a02d61p-2));
    ck_assert_uint_eq(g.span, 31);
    uint64_t h = 0, st = 1;
    for (int i = 0; i < 1000; i++) {
        uint32_t sy[31], len = 1 + (uint32_t)(i % 31), back[31];
        for (uint32_t k = 0; k < len; k++) {
            st = st * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
            sy[k] = (uint32_t)(st >> 33) % 5;
        }
        double ax, ay;
        fkvf_ngon_encode_span(&g, sy, len, &ax, &ay);
        h = (h ^ dbits(ax)) * UINT64_C(0x100000001b3);
        h = (h ^ dbits(ay)) * UINT64_C(0x100000001b3);
        ck_assert_int_eq(fkvf_ngon_decode_span(&g, ax, ay, len, back), FKVF_OK);
        ck_assert_mem_eq(back, sy, len * sizeof *sy);
    }
    ck_assert_uint_eq(h, UINT64_C(0xd14f7321cb8264b1));
    /* one span spelled out */
    const uint32_t s7[7] = {0, 2, 4, 1, 1, 3, 0};
    double ax, ay;
    fkvf_ngon_encode_span(&g, s7, 7, &ax, &ay);
    ck_assert_uint_eq(dbits(ax), dbits(0x1.deb26da5900aap-2));
    ck_assert_uint_eq(dbits(ay), dbits(-0x1.e848de286dbp-6));
    fkvf_ngon_fini(&g);
}
END_TEST

/* The writer's obligation: with spans longer than L_max (forced here past
 * the check of init), some spans no longer decode back and encode and the
 * appender refuse them with FKVF_E_CODEC. */
START_TEST(ngon_encode_refuses)
{
    fkvf_ngon g;
    ngon_init_ok(&g, 4, 0, 0);
    g.span = 64; /* q^64 = 2^64: far past 2^53 */
    tu_rng rng = {17};
    uint32_t s[64 * 50];
    fill_symbols(&rng, s, 64 * 50, 4);
    uint8_t out[16 * 50];
    ck_assert_int_eq(fkvf_ngon_encode(&g, s, 64 * 50, out, sizeof out), FKVF_E_CODEC);
    fkvf_sym_appender a;
    ck_assert_int_eq(fkvf_sym_appender_init_ngon(&a, &g, NULL), FKVF_OK);
    int rc = FKVF_OK;
    size_t k = 0;
    for (; k < 64 * 50 && rc == FKVF_OK; k++)
        rc = fkvf_sym_appender_push(&a, s[k]);
    ck_assert_int_eq(rc, FKVF_E_CODEC);
    ck_assert_uint_eq(k % 64, 0);  /* refused when a span completes */
    ck_assert_uint_eq(a.n, k - 1); /* and the symbol was not appended */
    fkvf_sym_appender_fini(&a);
    fkvf_ngon_fini(&g);
}
END_TEST

/* Corrupted anchors: every single-bit flip, and non-finite values. A flip
 * gives FKVF_E_SPAN, or else lands exactly on the anchor of another
 * sequence: then the decoder must return symbols that re-encode to the
 * corrupted anchor bit for bit (so they differ from the written ones; the
 * container's checksums, not the codec, catch such a flip). That happens:
 * a sign flip gives the mirrored sequence (the tables are exactly
 * symmetric), and for N = 2, 4 (r = 1/2, dyadic anchors) a flip of a high
 * mantissa bit gives another dyadic anchor. For N >= 16 only sign flips can
 * be accepted. */
START_TEST(ngon_corrupt_anchor)
{
    fkvf_ngon g;
    uint32_t n = NGON_NS[_i];
    ngon_init_ok(&g, n, 0, 0);
    const uint32_t L = g.span;
    tu_rng rng = {31337 + n};
    uint32_t s[64], o[64];
    int accepted = 0;
    for (int rep = 0; rep < 6; rep++) {
        uint32_t len = rep == 0 ? L : 1 + tu_below(&rng, L);
        fill_symbols(&rng, s, len, n);
        if (rep == 1)
            for (uint32_t k = 0; k < len; k++)
                s[k] = 0; /* y = +0 exactly: the sign flip of 0 must be caught */
        double ax, ay;
        fwd(&g, s, len, &ax, &ay);
        ck_assert_int_eq(fkvf_ngon_decode_span(&g, ax, ay, len, o), FKVF_OK);
        ck_assert_mem_eq(o, s, len * sizeof *s);
        for (int b = 0; b < 128; b++) {
            double cx = ax, cy = ay;
            if (b < 64)
                cx = bitsd(dbits(ax) ^ (UINT64_C(1) << b));
            else
                cy = bitsd(dbits(ay) ^ (UINT64_C(1) << (b - 64)));
            int rc = fkvf_ngon_decode_span(&g, cx, cy, len, o);
            if (rc == FKVF_OK) {
                double rx, ry;
                fwd(&g, o, len, &rx, &ry);
                ck_assert(dbits(rx) == dbits(cx) && dbits(ry) == dbits(cy));
                ck_assert(memcmp(o, s, len * sizeof *s) != 0);
                ck_assert_msg(n < 16 || b == 63 || b == 127, "N=%u bit %d flip accepted", n, b);
                accepted++;
            } else {
                ck_assert_int_eq(rc, FKVF_E_SPAN);
            }
            /* the stream decoder reports it too, verified */
            uint8_t buf[16];
            for (int i = 0; i < 8; i++) {
                buf[i] = (uint8_t)(dbits(cx) >> (8 * i));
                buf[8 + i] = (uint8_t)(dbits(cy) >> (8 * i));
            }
            uint32_t v;
            if (rc != FKVF_OK) {
                ck_assert_int_eq(fkvf_ngon_decode(&g, buf, 16, len, 0, len, o, 1), FKVF_E_SPAN);
                ck_assert_int_eq(fkvf_ngon_get(&g, buf, 16, len, len - 1, &v), FKVF_E_SPAN);
            }
        }
        const double nf[] = {NAN, -NAN, INFINITY, -INFINITY};
        for (int i = 0; i < 4; i++) {
            ck_assert_int_eq(fkvf_ngon_decode_span(&g, nf[i], ay, len, o), FKVF_E_SPAN);
            ck_assert_int_eq(fkvf_ngon_decode_span(&g, ax, nf[i], len, o), FKVF_E_SPAN);
            /* the unverified decoder must still be safe */
            fkvf_ngon_decode_span_fast(&g, nf[i], nf[3 - i], len, o);
            for (uint32_t k = 0; k < len; k++)
                ck_assert_uint_lt(o[k], n);
        }
    }
    /* far-away and interior anchors */
    const double junk[][2] = {{0, 0}, {1e300, -1e300}, {2.5, 0}, {0.01, 0.02}, {-1, 1}};
    for (int i = 0; i < 5; i++) {
        int rc = fkvf_ngon_decode_span(&g, junk[i][0], junk[i][1], L, o);
        if (rc == FKVF_OK) {
            double rx, ry;
            fwd(&g, o, L, &rx, &ry);
            ck_assert(dbits(rx) == dbits(junk[i][0]) && dbits(ry) == dbits(junk[i][1]));
        } else {
            ck_assert_int_eq(rc, FKVF_E_SPAN);
        }
    }
    if (n >= 16)
        ck_assert_int_le(accepted, 12); /* sign flips only */
    fkvf_ngon_fini(&g);
}
END_TEST

/* A valid but irregular table (vertices past N/4 shuffled, so index order
 * is not angular order): everything still round-trips, and the fast decoder
 * still gives the canonical symbols. */
START_TEST(ngon_shuffled_table)
{
    const uint32_t ns[3] = {16, 256, 1024};
    for (int i = 0; i < 3; i++) {
        uint32_t n = ns[i];
        double *xy = tu_xcalloc(2 * (size_t)n, sizeof *xy);
        fkvf_ngon_make_vertices(n, xy);
        tu_rng rng = {n};
        for (uint32_t c = n - 1; c > n / 4 + 1; c--) {
            uint32_t k = n / 4 + 1 + tu_below(&rng, c - n / 4);
            double tx = xy[2 * c], ty = xy[2 * c + 1];
            xy[2 * c] = xy[2 * k];
            xy[2 * c + 1] = xy[2 * k + 1];
            xy[2 * k] = tx;
            xy[2 * k + 1] = ty;
        }
        fkvf_ngon g;
        ck_assert_int_eq(fkvf_ngon_init(&g, n, 0, 0, xy, NULL), FKVF_OK);
        ngon_check_stream(&g, 2000, 5 + n, 0, 1);
        fkvf_ngon_fini(&g);
        free(xy);
    }
}
END_TEST

/* A table at the edge of the norm tolerance (|V|^2 up to 2^-40 off): the
 * fast decoder's certificate widens with the table's worst norm, and both
 * decoders still equal the exhaustive argmin, also next to bisectors. */
START_TEST(ngon_perturbed_table)
{
    const uint32_t ns[3] = {16, 256, 65536};
    for (int i = 0; i < 3; i++) {
        uint32_t n = ns[i];
        double *xy = tu_xcalloc(2 * (size_t)n, sizeof *xy);
        fkvf_ngon_make_vertices(n, xy);
        tu_rng rng = {3 * n};
        for (uint32_t c = 1; c < n; c++) {
            double f = 1.0 + ((double)(tu_next(&rng) >> 11) * 0x1p-53 * 2.0 - 1.0) * 0x1p-42;
            xy[2 * c] *= f;
            xy[2 * c + 1] *= f;
        }
        fkvf_ngon g;
        ck_assert_int_eq(fkvf_ngon_init(&g, n, 0, 0, xy, NULL), FKVF_OK);
        for (int k = 0; k < 3000; k++) {
            uint32_t c = tu_below(&rng, n), c2 = (c + 1) % n;
            double u = (double)(tu_next(&rng) >> 11) * 0x1p-53;
            double w = (double)(tu_next(&rng) >> 11) * 0x1p-53 - 0.5;
            double px, py;
            if (k & 1) { /* near the bisector of two neighbours, at radius ~u*2 */
                double e = w * 1e-13;
                px = (g.vx[c] * (0.5 + e) + g.vx[c2] * (0.5 - e)) * 2 * u;
                py = (g.vy[c] * (0.5 + e) + g.vy[c2] * (0.5 - e)) * 2 * u;
            } else { /* close to a vertex */
                px = g.vx[c] * (1 - g.r * u) + w * g.r;
                py = g.vy[c] * (1 - g.r * u) - w * g.r;
            }
            uint32_t want = naive_argmin(&g, px, py), got, fast;
            fkvf_ngon_decode_span_canonical(&g, px, py, 1, &got);
            fkvf_ngon_decode_span_fast(&g, px, py, 1, &fast);
            ck_assert_uint_eq(got, want);
            ck_assert_uint_eq(fast, want);
        }
        ngon_check_stream(&g, 1000, 11 + n, 0, 1);
        fkvf_ngon_fini(&g);
        free(xy);
    }
}
END_TEST

START_TEST(ngon_allocator)
{
    for (int i = 0; i < N_NGON; i += 3) {
        tu_alloc cnt = {0};
        fkvf_allocator a = tu_alloc_hook(&cnt);
        fkvf_ngon g;
        ck_assert_int_eq(fkvf_ngon_init(&g, NGON_NS[i], 0, 0, NULL, &a), FKVF_OK);
        long calls = cnt.calls;
        ck_assert_int_gt(cnt.live, 0);
        fkvf_ngon_fini(&g);
        ck_assert_int_eq(cnt.live, 0);
        for (long k = 1; k <= calls; k++) {
            tu_alloc c2 = {.fail_at = k};
            fkvf_allocator a2 = tu_alloc_hook(&c2);
            ck_assert_int_eq(fkvf_ngon_init(&g, NGON_NS[i], 0, 0, NULL, &a2), FKVF_E_NOMEM);
            ck_assert_int_eq(c2.live, 0);
            fkvf_ngon_fini(&g); /* safe after a failed init */
        }
    }
}
END_TEST

/* ======================================================================== */
/* appender                                                                  */
/* ======================================================================== */

START_TEST(appender_quad)
{
    const unsigned widths[] = {2, 4, 6, 8, 10, 16, 22, 30, 32};
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
        unsigned bits = widths[w];
        const size_t n = 300;
        tu_rng rng = {bits};
        uint32_t s[300];
        fill_symbols(&rng, s, n, UINT64_C(1) << bits);
        tu_alloc cnt = {0};
        fkvf_allocator al = tu_alloc_hook(&cnt);
        fkvf_sym_appender a;
        ck_assert_int_eq(fkvf_sym_appender_init_quad(&a, bits, &al), FKVF_OK);
        uint8_t ref[1216];
        for (size_t k = 0; k <= n; k++) {
            const uint8_t *d;
            size_t size;
            ck_assert_int_eq(fkvf_sym_appender_bytes(&a, &d, &size), FKVF_OK);
            uint64_t want;
            ck_assert(fkvf_quad_data_bytes(k, bits, &want));
            ck_assert_uint_eq(size, want);
            ck_assert_int_eq(fkvf_quad_encode(s, k, bits, ref, sizeof ref), FKVF_OK);
            if (size)
                ck_assert_mem_eq(d, ref, size);
            if (k == n)
                break;
            if (bits < 32)
                ck_assert_int_eq(fkvf_sym_appender_push(&a, (uint32_t)1 << bits), FKVF_E_SYMBOL);
            ck_assert_int_eq(fkvf_sym_appender_push(&a, s[k]), FKVF_OK);
        }
        ck_assert_uint_eq(a.n, n);
        fkvf_sym_appender_fini(&a);
        ck_assert_int_eq(cnt.live, 0);
    }
    fkvf_sym_appender a;
    ck_assert_int_eq(fkvf_sym_appender_init_quad(&a, 7, NULL), FKVF_E_INVALID_ARG);
    fkvf_sym_appender_fini(&a);
}
END_TEST

START_TEST(appender_ngon)
{
    const uint32_t ns[] = {3, 4, 16, 256, 65536};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        fkvf_ngon g;
        ngon_init_ok(&g, ns[i], 0, 0);
        const size_t n = 3 * g.span + 40 < 200 ? 3 * g.span + 40 : 200;
        tu_rng rng = {ns[i] + 1};
        uint32_t s[200];
        fill_symbols(&rng, s, n, g.n);
        fkvf_sym_appender a;
        ck_assert_int_eq(fkvf_sym_appender_init_ngon(&a, &g, NULL), FKVF_OK);
        uint8_t ref[16 * 200];
        for (size_t k = 0; k <= n; k++) {
            const uint8_t *d;
            size_t size;
            ck_assert_int_eq(fkvf_sym_appender_bytes(&a, &d, &size), FKVF_OK);
            ck_assert_uint_eq(size, (k + g.span - 1) / g.span * 16);
            ck_assert_int_eq(fkvf_ngon_encode(&g, s, k, ref, sizeof ref), FKVF_OK);
            if (size)
                ck_assert_mem_eq(d, ref, size);
            if (k == n)
                break;
            ck_assert_int_eq(fkvf_sym_appender_push(&a, g.n), FKVF_E_SYMBOL);
            ck_assert_int_eq(fkvf_sym_appender_push(&a, s[k]), FKVF_OK);
        }
        /* bytes() twice in a row gives the same */
        const uint8_t *d1, *d2;
        size_t z1, z2;
        ck_assert_int_eq(fkvf_sym_appender_bytes(&a, &d1, &z1), FKVF_OK);
        ck_assert_int_eq(fkvf_sym_appender_bytes(&a, &d2, &z2), FKVF_OK);
        ck_assert_uint_eq(z1, z2);
        ck_assert_mem_eq(d2, ref, z2);
        /* decodable */
        uint32_t o[200];
        ck_assert_int_eq(fkvf_ngon_decode(&g, d2, z2, n, 0, n, o, 1), FKVF_OK);
        ck_assert_mem_eq(o, s, n * sizeof *s);
        fkvf_sym_appender_fini(&a);
        fkvf_ngon_fini(&g);
    }
}
END_TEST

START_TEST(appender_large)
{
    /* amortized O(1): a million pushes */
    fkvf_sym_appender a;
    ck_assert_int_eq(fkvf_sym_appender_init_quad(&a, 8, NULL), FKVF_OK);
    for (uint32_t k = 0; k < 1000000; k++)
        ck_assert_int_eq(fkvf_sym_appender_push(&a, k & 255), FKVF_OK);
    const uint8_t *d;
    size_t size;
    ck_assert_int_eq(fkvf_sym_appender_bytes(&a, &d, &size), FKVF_OK);
    ck_assert_uint_eq(size, 1000000);
    for (uint32_t k = 0; k < 1000000; k += 4999)
        ck_assert_uint_eq(d[k], k & 255);
    fkvf_sym_appender_fini(&a);

    fkvf_ngon g;
    ngon_init_ok(&g, 256, 0, 0);
    ck_assert_int_eq(fkvf_sym_appender_init_ngon(&a, &g, NULL), FKVF_OK);
    tu_rng rng = {5};
    const size_t n = 200000;
    uint32_t *s = tu_xcalloc(n, sizeof *s), *o = tu_xcalloc(n, sizeof *o);
    fill_symbols(&rng, s, n, 256);
    for (size_t k = 0; k < n; k++)
        ck_assert_int_eq(fkvf_sym_appender_push(&a, s[k]), FKVF_OK);
    ck_assert_int_eq(fkvf_sym_appender_bytes(&a, &d, &size), FKVF_OK);
    ck_assert_int_eq(fkvf_ngon_decode(&g, d, size, n, 0, n, o, 1), FKVF_OK);
    ck_assert_mem_eq(o, s, n * sizeof *s);
    free(s);
    free(o);
    fkvf_sym_appender_fini(&a);
    fkvf_ngon_fini(&g);
}
END_TEST

static Suite *codec_suite(void)
{
    Suite *su = suite_create("codec");
    TCase *tq = tcase_create("quad");
    tcase_set_timeout(tq, 300);
    tcase_add_test(tq, quad_sizes);
    tcase_add_loop_test(tq, quad_roundtrip_widths, 0, 16);
    tcase_add_test(tq, quad_large);
    tcase_add_test(tq, quad_decode_u8);
    tcase_add_test(tq, quad_rejects);
    tcase_add_test(tq, quad_point_edges);
    suite_add_tcase(su, tq);

    TCase *tn = tcase_create("ngon");
    tcase_set_timeout(tn, 300);
    tcase_add_test(tn, ngon_vertices_and_limits);
    tcase_add_test(tn, ngon_check_params);
    tcase_add_loop_test(tn, ngon_roundtrip, 0, N_NGON);
    tcase_add_test(tn, ngon_large);
    tcase_add_loop_test(tn, ngon_canonical_equals_exhaustive, 0, N_NGON);
    tcase_add_test(tn, ngon_rejects_symbols);
    tcase_add_test(tn, ngon_encode_refuses);
    tcase_add_test(tn, ngon_golden);
    tcase_add_loop_test(tn, ngon_corrupt_anchor, 0, N_NGON);
    tcase_add_test(tn, ngon_shuffled_table);
    tcase_add_test(tn, ngon_perturbed_table);
    tcase_add_test(tn, ngon_allocator);
    suite_add_tcase(su, tn);

    TCase *ta = tcase_create("appender");
    tcase_set_timeout(ta, 300);
    tcase_add_test(ta, appender_quad);
    tcase_add_test(ta, appender_ngon);
    tcase_add_test(ta, appender_large);
    suite_add_tcase(su, ta);
    return su;
}

int main(void)
{
    return tu_run_suite(codec_suite());
}
