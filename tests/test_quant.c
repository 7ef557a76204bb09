/* Quantizer tests (spec 8.1, 13): f16 / bf16 conversions, RoPE, the exact
 * nearest-centroid search, RVQ training, greedy and beam encoding, decoding,
 * codebook tables accepted by the writer, determinism, allocation failure
 * and argument checks.
 *
 * Hot loops use EXPECT (an `if` around ck_abort_msg) instead of ck_assert,
 * which records every passing check and is slow in long loops. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fkvf.h"
#include "half.h"
#include "quant/quant.h"
#include "testutil.h"

#define OK(expr) ck_assert_int_eq((expr), FKVF_OK)

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The library's element arrays (rows, tables, fkvf_convert's buffers,
 * decoded rows) are little-endian bytes; the tests compute host values
 * (tu_ld32le, tu_le_f32_copy: testutil.h). st_f32le: store host value v as
 * the little-endian element p. */
static void st_f32le(float *p, float v)
{
    memcpy(p, &v, sizeof v);
    tu_le_f32(p, 1);
}
static void st16le(uint16_t *p, uint16_t v)
{
    *p = v;
    tu_le_u16(p, 1);
}

/* uniform in [-1, 1) */
static double urand(tu_rng *r) { return (double)(tu_next(r) >> 11) * 0x1p-52 - 1.0; }
/* roughly normal (sum of four uniforms), unit variance */
static double nrand(tu_rng *r)
{
    return (urand(r) + urand(r) + urand(r) + urand(r)) * 0.8660254037844386;
}

/* ---- f16 / bf16 --------------------------------------------------------------- */

/* Reference conversions by search: the binary16 (or bfloat16) value nearest
 * to x, ties to the even pattern, values past the largest finite one by at
 * least half a step going to infinity (treated as the next step). */
static double f16_value(uint16_t h) /* finite or the pseudo-step 0x7C00 = 65536 */
{
    int e = (h >> 10) & 0x1F;
    int m = h & 0x3FF;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return (h & 0x8000) ? -v : v;
}
static uint16_t ref_f32_to_f16(float x)
{
    if (isnan(x))
        return 0; /* not used for NaN */
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    /* binary search over the positive patterns 0..0x7C00 (0x7C00 as 65536) */
    unsigned lo = 0, hi = 0x7C00;
    while (lo < hi) { /* first pattern with value >= a */
        unsigned mid = (lo + hi) / 2;
        if (f16_value((uint16_t)mid) < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    unsigned up = lo;
    if (up == 0 || f16_value((uint16_t)up) == a)
        return (uint16_t)(sign | up);
    unsigned dn = up - 1;
    double du = f16_value((uint16_t)up) - a, dd = a - f16_value((uint16_t)dn);
    unsigned r = du < dd ? up : (dd < du ? dn : ((up & 1) ? dn : up));
    if (isinf(x))
        r = 0x7C00;
    return (uint16_t)(sign | r);
}
static double bf16_value(uint16_t b) /* positive patterns; 0x7F80 as 2^128 */
{
    if ((b & 0x7FFF) == 0x7F80)
        return ldexp(1, 128);
    return fabs((double)u2f((uint32_t)b << 16));
}
static uint16_t ref_f32_to_bf16(float x)
{
    uint32_t u = f2u(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    if (isinf(x))
        return (uint16_t)(sign | 0x7F80);
    uint16_t dn = (uint16_t)((u >> 16) & 0x7FFF), up = (uint16_t)(dn + 1);
    double a = fabs((double)x);
    if (bf16_value(dn) == a)
        return (uint16_t)(sign | dn);
    double dd = a - bf16_value(dn), du = bf16_value(up) - a;
    uint16_t r = du < dd ? up : (dd < du ? dn : ((dn & 1) ? up : dn));
    return (uint16_t)(sign | r);
}

START_TEST(f16_hand_values)
{
    static const struct {
        float f;
        uint16_t h;
    } to16[] = {
        {0.0f, 0x0000},         {-0.0f, 0x8000},        {1.0f, 0x3C00},
        {-2.0f, 0xC000},        {0.5f, 0x3800},         {65504.0f, 0x7BFF},
        {65519.99f, 0x7BFF},    {65520.0f, 0x7C00},     {1e10f, 0x7C00},
        {-1e10f, 0xFC00},       {0x1p-14f, 0x0400},     {0x1p-24f, 0x0001},
        {0x1p-25f, 0x0000},     {0x1.8p-24f, 0x0002},   {0x1.4p-24f, 0x0001},
        {0x1p-26f, 0x0000},     {-0x1p-24f, 0x8001},    {0x1.ff8p-15f, 0x03FF},
        {0x1.ffcp-15f, 0x0400}, {0x1.ff0p-15f, 0x03FE}, {0x1.fecp-15f, 0x03FE},
        {0.1f, 0x2E66},         {1.0f / 3.0f, 0x3555},
        {1.0f + 0x1p-11f, 0x3C00}, {1.0f + 0x1.8p-10f, 0x3C02},
        {1.0f + 0x1p-10f, 0x3C01}, {3.140625f, 0x4248}, {1e-30f, 0x0000},
        {INFINITY, 0x7C00},     {-INFINITY, 0xFC00},
    };
    for (size_t i = 0; i < sizeof to16 / sizeof to16[0]; i++) {
        uint16_t h = fkvf_f32_to_f16(to16[i].f);
        ck_assert_msg(h == to16[i].h, "f16(%a) = 0x%04x, want 0x%04x", (double)to16[i].f, h,
                      to16[i].h);
    }
    /* NaN stays NaN with its top payload bits; a payload that would vanish
     * becomes the quiet bit */
    ck_assert_uint_eq(fkvf_f32_to_f16(u2f(0x7FC00000)), 0x7E00);
    ck_assert_uint_eq(fkvf_f32_to_f16(u2f(0xFFC00000)), 0xFE00);
    ck_assert_uint_eq(fkvf_f32_to_f16(u2f(0x7F800001)), 0x7E00);
    ck_assert_uint_eq(fkvf_f32_to_f16(u2f(0x7F802000)), 0x7C01);
    ck_assert_uint_eq(fkvf_f32_to_f16(u2f(0x7FFFFFFF)), 0x7FFF);
    /* f16 -> f32 */
    ck_assert(fkvf_f16_to_f32(0x3C00) == 1.0f);
    ck_assert(fkvf_f16_to_f32(0xC000) == -2.0f);
    ck_assert(fkvf_f16_to_f32(0x7BFF) == 65504.0f);
    ck_assert(fkvf_f16_to_f32(0x0001) == 0x1p-24f);
    ck_assert(fkvf_f16_to_f32(0x03FF) == 0x1.ff8p-15f);
    ck_assert(fkvf_f16_to_f32(0x0400) == 0x1p-14f);
    ck_assert_uint_eq(f2u(fkvf_f16_to_f32(0x8000)), 0x80000000u);
    ck_assert(isinf(fkvf_f16_to_f32(0x7C00)) && fkvf_f16_to_f32(0x7C00) > 0);
    ck_assert(isinf(fkvf_f16_to_f32(0xFC00)) && fkvf_f16_to_f32(0xFC00) < 0);
    ck_assert_uint_eq(f2u(fkvf_f16_to_f32(0x7E00)), 0x7FC00000u);
    ck_assert_uint_eq(f2u(fkvf_f16_to_f32(0x7C01)), 0x7F802000u);
}
END_TEST

START_TEST(bf16_hand_values)
{
    static const struct {
        uint32_t f;
        uint16_t b;
    } tob[] = {
        {0x3F800000, 0x3F80}, /* 1 */
        {0x40490FDB, 0x4049}, /* pi: rounds down */
        {0x3F808000, 0x3F80}, /* 1 + 2^-8: tie to even (down) */
        {0x3F818000, 0x3F82}, /* tie, odd below: up */
        {0x3F808001, 0x3F81}, /* just above the tie */
        {0x7F7FFFFF, 0x7F80}, /* FLT_MAX rounds to infinity */
        {0x7F7F7FFF, 0x7F7F}, /* below the tie stays finite */
        {0x00000001, 0x0000}, /* tiny subnormal */
        {0x00008000, 0x0000}, /* subnormal tie to even */
        {0x00018000, 0x0002}, /* subnormal tie, odd below: up */
        {0x80000000, 0x8000}, /* -0 */
        {0xC0000000, 0xC000}, /* -2 */
        {0x7F800000, 0x7F80}, /* inf */
        {0xFF800000, 0xFF80}, /* -inf */
        {0x7FC00000, 0x7FC0}, /* quiet NaN */
        {0x7F800001, 0x7FC0}, /* NaN whose payload would vanish */
        {0x7FA10000, 0x7FA1}, /* NaN payload kept */
    };
    for (size_t i = 0; i < sizeof tob / sizeof tob[0]; i++) {
        uint16_t b = fkvf_f32_to_bf16(u2f(tob[i].f));
        ck_assert_msg(b == tob[i].b, "bf16(0x%08x) = 0x%04x, want 0x%04x", tob[i].f, b, tob[i].b);
    }
    ck_assert(fkvf_bf16_to_f32(0x3F80) == 1.0f);
    ck_assert_uint_eq(f2u(fkvf_bf16_to_f32(0x7FA1)), 0x7FA10000u);
}
END_TEST

/* every f16 pattern: exact value, round trip through f32, block paths equal */
START_TEST(f16_every_pattern)
{
    uint16_t *h = tu_xcalloc(65536, 2), *h2 = tu_xcalloc(65536, 2);
    float *f = tu_xcalloc(65536, sizeof(float));
    for (uint32_t i = 0; i < 65536; i++) {
        h[i] = (uint16_t)i;
        float v = fkvf_f16_to_f32((uint16_t)i);
        int e = (i >> 10) & 0x1F;
        if (e == 0x1F) {
            EXPECTF((i & 0x3FF) ? isnan(v) : isinf(v), "0x%04x", i);
        } else {
            EXPECTF((double)v == f16_value((uint16_t)i), "0x%04x -> %a", i, (double)v);
            EXPECT(!!signbit(v) == ((i & 0x8000) != 0));
        }
        EXPECTF(fkvf_f32_to_f16(v) == i, "round trip 0x%04x -> 0x%04x", i, fkvf_f32_to_f16(v));
        /* and bf16 patterns through f32 */
        EXPECTF(fkvf_f32_to_bf16(fkvf_bf16_to_f32((uint16_t)i)) == i, "bf16 0x%04x", i);
    }
    /* from here on h is the patterns' little-endian image, as fkvf_convert
     * and fkvfq_load take them */
    tu_le_u16(h, 65536);
    /* bulk (vectorized) paths, at an odd address; f holds little-endian
     * binary32 (tu_ld32le reads its bits) */
    uint8_t *odd = tu_dup_odd(h, 65536 * 2);
    OK(fkvf_convert(FKVF_DTYPE_F32, f, FKVF_DTYPE_F16, odd, 65536));
    for (uint32_t i = 0; i < 65536; i++)
        EXPECTF(tu_ld32le(&f[i]) == f2u(fkvf_f16_to_f32((uint16_t)i)), "bulk 0x%04x", i);
    OK(fkvf_convert(FKVF_DTYPE_F16, odd, FKVF_DTYPE_F32, f, 65536));
    memcpy(h2, odd, 65536 * 2);
    EXPECT(memcmp(h2, h, 65536 * 2) == 0);
    OK(fkvf_convert(FKVF_DTYPE_F32, f, FKVF_DTYPE_BF16, odd, 65536));
    for (uint32_t i = 0; i < 65536; i++)
        EXPECTF(tu_ld32le(&f[i]) == ((uint32_t)i << 16), "bulk bf16 0x%04x", i);
    OK(fkvf_convert(FKVF_DTYPE_BF16, odd, FKVF_DTYPE_F32, f, 65536));
    memcpy(h2, odd, 65536 * 2);
    EXPECT(memcmp(h2, h, 65536 * 2) == 0);
    /* fkvfq_load (F16C where the CPU has it) equal to the portable load on
     * every pattern, at an odd address, with a tail of 3 and blocks of 8
     * that mix signaling NaNs with ordinary values */
    {
        memcpy(odd, h, 65536 * 2);
        float *g = tu_xcalloc(65536, sizeof(float));
        fkvf_dtype dts[2] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16};
        for (int k = 0; k < 2; k++)
            for (size_t start = 0; start < 2; start++) {
                size_t n = 65536 - 3 - start * 0x7C01; /* start 1: from 0x7C01, sNaNs first */
                fkvfq_load(dts[k], odd + 2 * start * 0x7C01, f, n);
                fkvfq_load_portable(dts[k], odd + 2 * start * 0x7C01, g, n);
                for (size_t i = 0; i < n; i++)
                    EXPECTF(f2u(f[i]) == f2u(g[i]), "load dtype %d pattern 0x%04zx: %08x, %08x",
                            (int)dts[k], i + start * 0x7C01, f2u(f[i]), f2u(g[i]));
            }
        free(g);
    }
    tu_free_odd(odd);
    free(h);
    free(h2);
    free(f);
}
END_TEST

/* f32 -> f16 / bf16 against the search reference, scalar and every block
 * path (portable and the CPU's), on edge values and random patterns */
START_TEST(f32_to_half_against_reference)
{
    enum { N = 1 << 18 };
    float *f = tu_xcalloc(N, sizeof(float));
    uint16_t *a = tu_xcalloc(N, 2), *b = tu_xcalloc(N, 2);
    tu_rng r = {42};
    size_t n = 0;
    /* around every f16 step boundary region: halfway points and neighbours */
    for (uint32_t h = 0; h < 0x7C00 && n + 6 < N; h += 7) {
        double lo = f16_value((uint16_t)h), hi = f16_value((uint16_t)(h + 1));
        float mid = (float)((lo + hi) / 2);
        f[n++] = mid;
        f[n++] = nextafterf(mid, 0);
        f[n++] = nextafterf(mid, INFINITY);
        f[n++] = -mid;
    }
    while (n < N / 2) {
        /* random values in and around the f16 range */
        int e = (int)tu_below(&r, 60) - 40;
        f[n++] = (float)ldexp(urand(&r), e);
    }
    while (n < N)
        f[n++] = u2f((uint32_t)tu_next(&r)); /* any pattern, NaN included */
    for (size_t i = 0; i < N; i++) {
        uint16_t h = fkvf_f32_to_f16(f[i]);
        if (isnan(f[i])) {
            EXPECT((h & 0x7C00) == 0x7C00 && (h & 0x3FF));
            EXPECT((h & 0x8000) == ((f2u(f[i]) >> 16) & 0x8000));
            EXPECT((h & 0x3FF) == (((f2u(f[i]) >> 13) & 0x3FF) ? ((f2u(f[i]) >> 13) & 0x3FF)
                                                              : 0x200));
        } else {
            EXPECTF(h == ref_f32_to_f16(f[i]), "f16(%a) = 0x%04x, ref 0x%04x", (double)f[i], h,
                    ref_f32_to_f16(f[i]));
        }
        uint16_t bb = fkvf_f32_to_bf16(f[i]);
        if (isnan(f[i]))
            EXPECT((bb & 0x7F80) == 0x7F80 && (bb & 0x7F));
        else
            EXPECTF(bb == ref_f32_to_bf16(f[i]), "bf16(%a) = 0x%04x, ref 0x%04x", (double)f[i],
                    bb, ref_f32_to_bf16(f[i]));
    }
    /* block paths bit-identical to the scalar ones (odd lengths for tails) */
    fkvf_dtype dts[2] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16};
    for (int k = 0; k < 2; k++) {
        size_t m = N - 3;
        fkvfq_store(dts[k], f, (uint8_t *)a, m);
        fkvfq_store_portable(dts[k], f, (uint8_t *)b, m);
        tu_le_u16(a, m); /* stored little-endian: to host values */
        tu_le_u16(b, m);
        for (size_t i = 0; i < m; i++) {
            uint16_t want = k == 0 ? fkvf_f32_to_f16(f[i]) : fkvf_f32_to_bf16(f[i]);
            EXPECTF(a[i] == want && b[i] == want, "dtype %d block %zu: %04x %04x want %04x",
                    (int)dts[k], i, a[i], b[i], want);
        }
    }
    free(f);
    free(a);
    free(b);
}
END_TEST

START_TEST(convert_args)
{
    float f[3] = {1, 2, 3};
    uint16_t h[3];
    tu_le_f32(f, 3); /* fkvf_convert's elements are little-endian */
    ck_assert_int_eq(fkvf_convert((fkvf_dtype)0, h, FKVF_DTYPE_F32, f, 3), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_convert(FKVF_DTYPE_F16, h, (fkvf_dtype)4, f, 3), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_convert(FKVF_DTYPE_F16, NULL, FKVF_DTYPE_F32, f, 3), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_convert(FKVF_DTYPE_F16, h, FKVF_DTYPE_F32, NULL, 3), FKVF_E_INVALID_ARG);
    OK(fkvf_convert(FKVF_DTYPE_F16, NULL, FKVF_DTYPE_F32, NULL, 0));
    OK(fkvf_convert(FKVF_DTYPE_F16, h, FKVF_DTYPE_F32, f, 3));
    ck_assert_uint_eq(tu_ld16le(&h[2]), 0x4200);
    float g[3];
    OK(fkvf_convert(FKVF_DTYPE_F32, g, FKVF_DTYPE_F32, f, 3));
    ck_assert(tu_ldf32le(&g[1]) == 2.0f);
}
END_TEST

/* ---- RoPE --------------------------------------------------------------------------- */

START_TEST(rope_hand_example)
{
    /* theta 10000, rope_dims 4, dim 6, t = 1: pair angles 1 and 10000^-1/2 = 0.01 */
    fkvf_rope il = {1, 4, 10000.0}, hs = {2, 4, 10000.0};
    double v[6] = {1, 2, 3, 4, 5, 6};
    OK(fkvf_rope_apply_f64(&il, 1, 0, v, 6));
    /* interleaved pairs (0,1) by 1 rad, (2,3) by 0.01 rad */
    const double want_il[6] = {1 * cos(1.0) - 2 * sin(1.0), 1 * sin(1.0) + 2 * cos(1.0),
                               3 * cos(0.01) - 4 * sin(0.01), 3 * sin(0.01) + 4 * cos(0.01), 5,
                               6};
    const double hand_il[4] = {-1.1426396637476532, 1.922075596544176, 2.9598506679133294,
                               4.029799501669161};
    for (int i = 0; i < 6; i++)
        ck_assert_msg(fabs(v[i] - want_il[i]) < 1e-12, "il %d: %.17g vs %.17g", i, v[i],
                      want_il[i]);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(fabs(v[i] - hand_il[i]) < 1e-12, "il hand %d", i);
    ck_assert(v[4] == 5 && v[5] == 6);
    /* half-split pairs (0,2) by 1 rad, (1,3) by 0.01 rad */
    double w[6] = {1, 2, 3, 4, 5, 6};
    OK(fkvf_rope_apply_f64(&hs, 1, 0, w, 6));
    const double hand_hs[4] = {-1.9841106485555495, 1.959900667496664, 2.4623779024123156,
                               4.019799668334994};
    for (int i = 0; i < 4; i++)
        ck_assert_msg(fabs(w[i] - hand_hs[i]) < 1e-12, "hs hand %d: %.17g", i, w[i]);
    ck_assert(w[4] == 5 && w[5] == 6);
    /* position 0 is the identity */
    double z[6] = {1, 2, 3, 4, 5, 6};
    OK(fkvf_rope_apply_f64(&hs, 0, 0, z, 6));
    for (int i = 0; i < 6; i++)
        ck_assert(z[i] == i + 1);
    /* f32 agrees with the f64 result rounded once */
    float vf[6] = {1, 2, 3, 4, 5, 6};
    OK(fkvf_rope_apply_f32(&il, 1, 0, vf, 6));
    for (int i = 0; i < 6; i++)
        ck_assert(vf[i] == (float)v[i]);
    /* un-rotating gives the input back */
    OK(fkvf_rope_apply_f64(&il, 1, 1, v, 6));
    for (int i = 0; i < 6; i++)
        ck_assert(fabs(v[i] - (i + 1)) < 1e-14);
}
END_TEST

START_TEST(rope_roundtrip)
{
    tu_rng r = {7};
    const uint64_t ts[] = {0, 1, 2, 17, 1000, 65535, UINT64_C(1) << 20, UINT64_C(1) << 40};
    const uint32_t dims[][2] = {{2, 2}, {8, 8}, {64, 64}, {64, 32}, {10, 4}, {128, 128}};
    for (int layout = 1; layout <= 2; layout++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
                uint32_t dim = dims[di][0];
                fkvf_rope rp = {(uint8_t)layout, dims[di][1], ti % 2 ? 10000.0 : 500000.0};
                double v[128], o[128];
                float vf[128], of[128];
                double n2 = 0;
                for (uint32_t j = 0; j < dim; j++) {
                    o[j] = v[j] = nrand(&r) * 3;
                    of[j] = vf[j] = (float)o[j];
                    n2 += o[j] * o[j];
                }
                OK(fkvf_rope_apply_f64(&rp, ts[ti], 0, v, dim));
                double m2 = 0;
                for (uint32_t j = 0; j < dim; j++)
                    m2 += v[j] * v[j];
                EXPECT(fabs(m2 - n2) < 1e-12 * n2); /* a rotation keeps the norm */
                for (uint32_t j = dims[di][1]; j < dim; j++)
                    EXPECT(v[j] == o[j]); /* components past rope_dims untouched */
                OK(fkvf_rope_apply_f64(&rp, ts[ti], 1, v, dim));
                for (uint32_t j = 0; j < dim; j++)
                    EXPECTF(fabs(v[j] - o[j]) < 1e-12, "layout %d dim %u t %llu j %u: %g", layout,
                            dim, (unsigned long long)ts[ti], j, v[j] - o[j]);
                OK(fkvf_rope_apply_f32(&rp, ts[ti], 0, vf, dim));
                OK(fkvf_rope_apply_f32(&rp, ts[ti], 1, vf, dim));
                for (uint32_t j = 0; j < dim; j++)
                    EXPECTF(fabsf(vf[j] - of[j]) <= 4e-7f * (1 + fabsf(of[j])),
                            "f32 layout %d j %u: %g vs %g", layout, j, (double)vf[j],
                            (double)of[j]);
            }
}
END_TEST

/* fkvf_rope_table + fkvf_rope_apply_table_f64 give the bits of
 * fkvf_rope_apply_f64, both directions, every layout and rope_dims */
START_TEST(rope_table_same_bits)
{
    tu_rng r = {11};
    const uint64_t ts[] = {0, 1, 3, 999, 65535, UINT64_C(1) << 33};
    const uint32_t dims[][2] = {{2, 2}, {8, 8}, {64, 32}, {10, 4}, {128, 128}};
    for (int layout = 1; layout <= 2; layout++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++)
                for (int inv = 0; inv <= 1; inv++) {
                    uint32_t dim = dims[di][0];
                    fkvf_rope rp = {(uint8_t)layout, dims[di][1], ti % 2 ? 10000.0 : 1e6};
                    double a[128], b[128], cs[128];
                    for (uint32_t j = 0; j < dim; j++)
                        a[j] = b[j] = nrand(&r) * 5;
                    OK(fkvf_rope_apply_f64(&rp, ts[ti], inv, a, dim));
                    OK(fkvf_rope_table(&rp, ts[ti], cs, rp.rope_dims));
                    OK(fkvf_rope_apply_table_f64(&rp, cs, inv, b, dim));
                    EXPECTF(memcmp(a, b, dim * sizeof(double)) == 0,
                            "layout %d dims %u/%u t %llu inverse %d", layout, dim, rp.rope_dims,
                            (unsigned long long)ts[ti], inv);
                }
    fkvf_rope rp = {1, 8, 10000.0};
    double cs[8], v[8] = {0};
    EXPECT(fkvf_rope_table(&rp, 1, cs, 7) == FKVF_E_INVALID_ARG); /* n < rope_dims */
    EXPECT(fkvf_rope_table(NULL, 1, cs, 8) == FKVF_E_INVALID_ARG);
    EXPECT(fkvf_rope_table(&rp, 1, NULL, 8) == FKVF_E_INVALID_ARG);
    OK(fkvf_rope_table(&rp, 1, cs, 8));
    EXPECT(fkvf_rope_apply_table_f64(&rp, NULL, 0, v, 8) == FKVF_E_INVALID_ARG);
    EXPECT(fkvf_rope_apply_table_f64(&rp, cs, 0, v, 6) == FKVF_E_INVALID_ARG); /* dim < dims */
    EXPECT(fkvf_rope_apply_table_f64(NULL, cs, 0, v, 8) == FKVF_E_INVALID_ARG);
}
END_TEST

START_TEST(rope_invalid)
{
    double v[8] = {0};
    float f[8] = {0};
    const fkvf_rope bad[] = {
        {0, 4, 10000}, {3, 4, 10000}, {1, 3, 10000}, {1, 0, 10000}, {1, 10, 10000},
        {1, 4, 0},     {2, 4, -1},    {1, 4, NAN},   {1, 4, INFINITY},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(fkvf_rope_apply_f64(&bad[i], 3, 0, v, 8), FKVF_E_INVALID_ARG);
        ck_assert_int_eq(fkvf_rope_apply_f32(&bad[i], 3, 1, f, 8), FKVF_E_INVALID_ARG);
    }
    fkvf_rope ok = {1, 8, 10000};
    ck_assert_int_eq(fkvf_rope_apply_f64(NULL, 0, 0, v, 8), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rope_apply_f64(&ok, 0, 0, NULL, 8), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rope_apply_f64(&ok, 0, 0, v, 6), FKVF_E_INVALID_ARG); /* dims > dim */
    OK(fkvf_rope_apply_f64(&ok, 0, 0, v, 8));
}
END_TEST

/* ---- the nearest-centroid search (internal) -------------------------------------- */

static uint32_t brute_nearest(const float *x, const float *rows, uint32_t k, uint32_t dim)
{
    uint32_t best = 0;
    double bd = fkvfq_dist(x, rows, dim);
    for (uint32_t c = 1; c < k; c++) {
        double d = fkvfq_dist(x, rows + (size_t)c * dim, dim);
        if (d < bd) {
            bd = d;
            best = c;
        }
    }
    return best;
}

/* Every kernel set picks the brute-force nearest on random tables, including
 * duplicated centroids, exact ties and near-ties (k = 80: the AVX-512
 * kernel's passes of 64 centroids and its single-panel tail). */
START_TEST(search_picks_true_nearest)
{
    const uint32_t ks[] = {16, 32, 80, 256};
    const uint32_t dims[] = {1, 3, 8, 17, 64, 67};
    tu_rng r = {99};
    for (size_t ki = 0; ki < 4; ki++)
        for (size_t di = 0; di < 6; di++) {
            uint32_t k = ks[ki], dim = dims[di];
            float *rows = tu_xcalloc((size_t)k * dim, sizeof(float));
            float *pan = tu_xcalloc((size_t)k * dim, sizeof(float));
            float *norms = tu_xcalloc(k, sizeof(float)), *sc = tu_xcalloc(4 * (size_t)k, sizeof(float));
            float *pm = tu_xcalloc(4 * (size_t)k / 16, sizeof(float));
            void *prep = tu_xcalloc(1, fkvfq_prepare_scratch(k));
            for (size_t i = 0; i < (size_t)k * dim; i++)
                rows[i] = (float)urand(&r);
            /* duplicates of earlier rows and a coarse grid (many ties) */
            memcpy(rows + (size_t)(k - 1) * dim, rows + 2 * (size_t)dim, dim * sizeof(float));
            memcpy(rows + (size_t)(k / 2) * dim, rows + 2 * (size_t)dim, dim * sizeof(float));
            for (uint32_t c = 3; c < 8; c++)
                for (uint32_t d = 0; d < dim; d++)
                    rows[(size_t)c * dim + d] = (float)((int)(c + d) % 3 - 1) * 0.5f;
            double cmax;
            fkvfq_table_prepare(rows, k, dim, pan, norms, &cmax, prep);
            EXPECT(isinf(norms[k - 1]) && isinf(norms[k / 2]) && isfinite(norms[2]));
            fkvfq_table t = {rows, pan, norms, cmax, k, dim};
            for (int it = 0; it < 200; it++) {
                float x[4][67];
                for (int j = 0; j < 4; j++)
                    for (uint32_t d = 0; d < dim; d++) {
                        switch ((it + j) % 4) {
                        case 0: /* random */
                            x[j][d] = (float)urand(&r);
                            break;
                        case 1: /* near a centroid */
                            x[j][d] = rows[(size_t)(it % k) * dim + d] + (float)urand(&r) * 1e-3f;
                            break;
                        case 2: /* equidistant from the grid rows */
                            x[j][d] = 0.0f;
                            break;
                        default: /* exactly on a duplicated centroid */
                            x[j][d] = rows[2 * (size_t)dim + d];
                        }
                    }
                const float *xp[4] = {x[0], x[1], x[2], x[3]};
                /* every kernel set this CPU runs, for the scores and the pick
                 * (each pick on each set's scores), and fkvfq_scores4 /
                 * fkvfq_pick themselves (kern = -1) */
                for (int kern = -1; kern <= fkvfq_isa(); kern++) {
                    if (kern < 0)
                        fkvfq_scores4(&t, xp, sc, pm);
                    else
                        fkvfq_scores4_isa(kern, &t, xp, sc, pm);
                    for (int pk = -1; pk <= fkvfq_isa(); pk++)
                        for (int j = 0; j < 4; j++) {
                            double dd = -1;
                            const float *sj = sc + (size_t)j * k, *pj = pm + (size_t)j * (k / 16);
                            uint32_t got = pk < 0 ? fkvfq_pick(&t, x[j], sj, pj, &dd)
                                                  : fkvfq_pick_isa(pk, &t, x[j], sj, pj, &dd);
                            uint32_t want = brute_nearest(x[j], rows, k, dim);
                            EXPECTF(got == want,
                                    "k %u dim %u it %d j %d kernel %d pick %d: %u, want %u", k,
                                    dim, it, j, kern, pk, got, want);
                            EXPECT(dd == fkvfq_dist(x[j], rows + (size_t)want * dim, dim));
                            /* without dist: the same centroid */
                            EXPECT((pk < 0 ? fkvfq_pick(&t, x[j], sj, pj, NULL)
                                           : fkvfq_pick_isa(pk, &t, x[j], sj, pj, NULL)) == want);
                        }
                }
            }
            free(rows);
            free(pan);
            free(norms);
            free(sc);
            free(pm);
            free(prep);
        }
}
END_TEST

/* fkvfq_table_norms16 (f16 rows read in place) gives fkvfq_table_norms'
 * norms, cmax and duplicate marks on the widened rows bit for bit: dims
 * around the lanes of 8 (tails), magnitudes across the f16 range,
 * subnormals, duplicates (-0 equal to +0, a repeat of row 0 far down), and
 * refuses an infinity or a NaN anywhere, tail included */
START_TEST(table_norms16_matches_binary32)
{
    if (!fkvfq_table_norms16_usable())
        return; /* the f16 path is not taken on this CPU */
    const uint32_t dims[] = {1, 7, 8, 9, 16, 64, 67};
    const uint32_t k = 64;
    tu_rng r = {29};
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
        uint32_t dim = dims[di];
        uint16_t *h = tu_xcalloc((size_t)k * dim, sizeof *h);
        float *f = tu_xcalloc((size_t)k * dim, sizeof *f);
        float *nw = tu_xcalloc(k, sizeof *nw), *ng = tu_xcalloc(k, sizeof *ng);
        void *scr = tu_xcalloc(fkvfq_prepare_scratch(k), 1);
        for (size_t i = 0; i < (size_t)k * dim; i++)
            h[i] = fkvf_f32_to_f16((float)ldexp(urand(&r) * 2 - 1, (int)(urand(&r) * 30) - 20));
        memcpy(h + 5 * (size_t)dim, h, dim * sizeof *h);  /* row 5 = row 0 */
        memcpy(h + 63 * (size_t)dim, h, dim * sizeof *h); /* row 63 = row 0 */
        for (uint32_t d = 0; d < dim; d++) {              /* row 9 = row 7 with -0 for +0 */
            h[7 * (size_t)dim + d] = d % 2 ? 0x0000 : 0x3C00;
            h[9 * (size_t)dim + d] = d % 2 ? 0x8000 : 0x3C00;
        }
        h[11 * (size_t)dim] = 0x0001; /* the smallest subnormal */
        for (size_t i = 0; i < (size_t)k * dim; i++)
            f[i] = fkvf_f16_to_f32(h[i]);
        double cw = -1, cg = -2;
        fkvfq_table_norms(f, k, dim, nw, &cw, scr);
        ck_assert_int_eq(fkvfq_table_norms16(h, k, dim, ng, &cg, scr), 1);
        EXPECTF(!memcmp(nw, ng, k * sizeof *nw) && !memcmp(&cw, &cg, sizeof cw),
                "dim %u: norms or cmax differ", dim);
        EXPECTF(isinf(ng[5]) && isinf(ng[63]) && isinf(ng[9]) && !isinf(ng[0]) &&
                    !isinf(ng[7]),
                "dim %u: duplicates not marked", dim);
        /* an infinity, then a NaN, in the first row, the middle, the tail */
        const size_t at[] = {0, (size_t)k * dim / 2, (size_t)k * dim - 1};
        for (int v = 0; v < 2; v++)
            for (size_t a = 0; a < 3; a++) {
                uint16_t keep = h[at[a]];
                h[at[a]] = v ? 0x7E01 : 0xFC00;
                EXPECTF(fkvfq_table_norms16(h, k, dim, ng, &cg, scr) == 0,
                        "dim %u: %s at %zu accepted", dim, v ? "NaN" : "-inf", at[a]);
                h[at[a]] = keep;
            }
        free(h);
        free(f);
        free(nw);
        free(ng);
        free(scr);
    }
}
END_TEST

/* ---- k-means (internal) ---------------------------------------------------------- */

/* k-means++ seeding's distance update: every kernel set gives the portable
 * values bit for bit (n around the AVX-512 kernel's groups of 16 and its
 * halves of 8, dim around the lanes of 8), first and later updates, with
 * ties between old and new distances and a not-a-number vector */
START_TEST(seed_update_kernels_agree)
{
    const size_t ns[] = {1, 7, 8, 9, 15, 16, 17, 33, 100};
    const uint32_t dims[] = {1, 5, 8, 9, 16, 64, 67};
    tu_rng r = {17};
    for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
        for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
            size_t n = ns[ni];
            uint32_t dim = dims[di];
            float *x = tu_xcalloc(n * dim, sizeof(float)), *c = tu_xcalloc(3 * (size_t)dim, 4);
            float *xt = tu_xcalloc(fkvfq_seed_scratch(n, dim), sizeof(float));
            double *want = tu_xcalloc(n, sizeof(double)), *got = tu_xcalloc(n, sizeof(double));
            double *cw = tu_xcalloc(n, sizeof(double)), *cg = tu_xcalloc(n, sizeof(double));
            /* magnitudes 2^-20..2^20: lane sums whose binary64 total
             * depends on the order of the additions */
            for (size_t i = 0; i < n * dim; i++)
                x[i] = (float)ldexp(urand(&r) * 4, (int)(urand(&r) * 20));
            if (n > 3)
                x[3 * (size_t)dim] = NAN;
            for (size_t i = 0; i < 3 * (size_t)dim; i++)
                c[i] = (float)(urand(&r) * 4);
            memcpy(c + 2 * (size_t)dim, x, dim * sizeof(float)); /* ties: vector 0 */
            for (int isa = FKVFQ_ISA_AVX2; isa <= fkvfq_isa(); isa++)
                for (int u = 0; u < 3; u++) {
                    const float *cu = c + (size_t)u * dim;
                    if (u == 0) {
                        for (size_t i = 0; i < n; i++)
                            want[i] = got[i] = -1;
                    }
                    double tw = fkvfq_seed_update_isa(FKVFQ_ISA_PORTABLE, x, n, dim, cu, want,
                                                      cw, u == 0, xt);
                    double tg = fkvfq_seed_update_isa(isa, x, n, dim, cu, got, cg, u == 0, xt);
                    EXPECTF(!memcmp(want, got, n * sizeof(double)) &&
                                !memcmp(&tw, &tg, sizeof tw) &&
                                !memcmp(cw, cg, n * sizeof(double)) &&
                                !memcmp(&cw[n - 1], &tw, sizeof tw),
                            "n %zu dim %u set %d update %d: distances or running sums differ", n,
                            dim, isa, u);
                }
            free(x);
            free(c);
            free(xt);
            free(want);
            free(got);
            free(cw);
            free(cg);
        }
}
END_TEST

/* 16 well-separated clusters in 8 dimensions: k-means++ and Lloyd find them */
START_TEST(kmeans_finds_separated_clusters)
{
    enum { K = 16, DIM = 8, PER = 50, N = K * PER };
    tu_rng r = {5};
    float centers[K][DIM], *x = tu_xcalloc(N * DIM, sizeof(float)), cent[K * DIM];
    for (int c = 0; c < K; c++)
        for (int d = 0; d < DIM; d++)
            centers[c][d] = (float)(((c >> (d % 4)) & 1) * 20 + (d >= 4 ? c * 3 : 0) +
                                    urand(&r));
    for (int i = 0; i < N; i++)
        for (int d = 0; d < DIM; d++)
            x[i * DIM + d] = centers[i % K][d] + (float)(nrand(&r) * 0.1);
    for (uint64_t seed = 1; seed <= 5; seed++) {
        size_t repairs;
        uint32_t iters, asg[N];
        OK(fkvfq_kmeans(NULL, x, N, DIM, K, NULL, seed, 50, cent, asg, &repairs, &iters));
        EXPECTF(iters < 50, "seed %llu: no convergence", (unsigned long long)seed);
        /* every true centre has a centroid within noise distance, and points of
         * one true cluster share one centroid */
        for (int c = 0; c < K; c++) {
            double best = 1e30;
            for (int j = 0; j < K; j++) {
                double d2 = 0;
                for (int d = 0; d < DIM; d++)
                    d2 += pow(cent[j * DIM + d] - centers[c][d], 2);
                best = fmin(best, d2);
            }
            EXPECTF(best < 0.1, "seed %llu: cluster %d missed (%g)", (unsigned long long)seed, c,
                    best);
            for (int i = c + K; i < N; i += K)
                EXPECT(asg[i] == asg[c]);
        }
    }
    free(x);
}
END_TEST

/* a centroid that attracts no point is re-seeded from the worst-fitted point */
START_TEST(kmeans_repairs_empty_clusters)
{
    enum { K = 16, DIM = 4, N = 64 };
    tu_rng r = {11};
    float x[N * DIM], init[K * DIM], cent[K * DIM];
    for (int i = 0; i < N * DIM; i++)
        x[i] = (float)urand(&r);
    /* an outlier far from everything */
    for (int d = 0; d < DIM; d++)
        x[7 * DIM + d] = 50.0f;
    /* initial centroids: 15 on data points, one far from all data, which
     * stays empty without repair */
    for (int j = 0; j < K; j++)
        for (int d = 0; d < DIM; d++)
            init[j * DIM + d] = j == 5 ? -1000.0f : x[(j * 3 + 1) * DIM + d];
    size_t repairs = 0;
    uint32_t asg[N];
    OK(fkvfq_kmeans(NULL, x, N, DIM, K, init, 0, 20, cent, asg, &repairs, NULL));
    ck_assert_uint_ge(repairs, 1);
    /* no centroid left far away; every cluster used; the outlier has its own */
    int used[K] = {0};
    for (int i = 0; i < N; i++)
        used[asg[i]]++;
    for (int j = 0; j < K; j++) {
        ck_assert_int_gt(used[j], 0);
        ck_assert(fabsf(cent[j * DIM]) < 60.0f);
    }
    ck_assert_int_eq(used[asg[7]], 1);
    ck_assert(cent[asg[7] * DIM] == 50.0f);

    /* duplicate points: fewer distinct points than clusters must not hang or
     * fail, and every point is represented exactly */
    float dup[N * DIM];
    for (int i = 0; i < N; i++)
        for (int d = 0; d < DIM; d++)
            dup[i * DIM + d] = (float)(i % 5) + (float)d * 0.25f;
    repairs = 0;
    OK(fkvfq_kmeans(NULL, dup, N, DIM, K, NULL, 3, 20, cent, asg, &repairs, NULL));
    ck_assert_uint_ge(repairs, 1); /* the seeding had to duplicate centres */
    for (int i = 0; i < N; i++)
        for (int d = 0; d < DIM; d++)
            ck_assert(cent[asg[i] * DIM + d] == dup[i * DIM + d]);
}
END_TEST

/* ---- synthetic caches ---------------------------------------------------------------- */

typedef struct cache_shape {
    uint32_t L, H, Dk, Dv;
} cache_shape;

static size_t row_elems(const cache_shape *s) { return (size_t)s->L * s->H * (s->Dk + s->Dv); }
static size_t key_off(const cache_shape *s, uint32_t l, uint32_t h)
{
    return (size_t)l * s->H * (s->Dk + s->Dv) + (size_t)h * s->Dk;
}
static size_t val_off(const cache_shape *s, uint32_t l, uint32_t h)
{
    return (size_t)l * s->H * (s->Dk + s->Dv) + (size_t)s->H * s->Dk + (size_t)h * s->Dv;
}

/* n rows (f32, host values: tu_le_f32_copy gives what the library takes) with
 * clustered keys and values: the cluster centres depend on
 * `dist_seed` only, the samples on `seed`, so two seeds give training and
 * held-out data of one distribution. With `rope`, keys are rotated to their
 * position (first + i) as a model caches them. */
static float *gen_rows(const cache_shape *s, size_t n, uint64_t dist_seed, uint64_t seed,
                       const fkvf_rope *rope, uint64_t first)
{
    enum { NC = 12 };
    size_t re = row_elems(s);
    float *rows = tu_xcalloc(n * re, sizeof(float));
    uint32_t dmax = s->Dk > s->Dv ? s->Dk : s->Dv;
    float *cent = tu_xcalloc((size_t)NC * dmax, sizeof(float));
    tu_rng rs = {seed};
    for (uint32_t l = 0; l < s->L; l++)
        for (uint32_t h = 0; h < s->H; h++)
            for (int kv = 0; kv < 2; kv++) {
                uint32_t dim = kv ? s->Dv : s->Dk;
                tu_rng rc = {dist_seed * 1000003u + l * 1009u + h * 17u + (uint64_t)kv};
                for (size_t i = 0; i < (size_t)NC * dim; i++)
                    cent[i] = (float)(nrand(&rc) * (kv ? 1.0 : 2.0));
                for (size_t i = 0; i < n; i++) {
                    float *v = rows + i * re + (kv ? val_off(s, l, h) : key_off(s, l, h));
                    uint32_t c = tu_below(&rs, NC);
                    for (uint32_t d = 0; d < dim; d++)
                        v[d] = cent[(size_t)c * dim + d] + (float)(nrand(&rs) * 0.3);
                    if (!kv && (i % 13) == 0)
                        v[0] += 6.0f; /* an outlier channel */
                    if (!kv && rope)
                        ck_assert_int_eq(fkvf_rope_apply_f32(rope, first + i, 0, v, dim), FKVF_OK);
                }
            }
    free(cent);
    return rows;
}

static fkvf_rvq *train(const cache_shape *s, const float *rows, size_t n, uint32_t k, int ks,
                       int vs, int pooled, uint64_t seed, const fkvf_rope *rope)
{
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = s->L;
    p.n_kv_heads = s->H;
    p.key_dim = s->Dk;
    p.value_dim = s->Dv;
    p.k = k;
    p.k_stages = (uint8_t)ks;
    p.v_stages = (uint8_t)vs;
    p.pooled = (uint8_t)pooled;
    p.seed = seed;
    p.key_rope = rope;
    float *le = tu_le_f32_copy(rows, n * row_elems(s));
    fkvf_rows blk = {le, n, FKVF_DTYPE_F32, 0};
    fkvf_rvq *q = NULL;
    OK(fkvf_rvq_train(&q, &p, &blk, 1, NULL));
    ck_assert_ptr_nonnull(q);
    free(le);
    return q;
}

/* squared reconstruction error of keys and values (binary64) after
 * encode -> decode to f32 (rows: host values) */
static void recon_error(const fkvf_rvq *q, const cache_shape *s, const float *rows, size_t n,
                        const fkvf_rope *rope, unsigned beam, double *ek, double *ev)
{
    size_t nc = fkvf_rvq_codes_per_position(q), re = row_elems(s);
    uint16_t *codes = tu_xcalloc(n * nc + 1, sizeof(uint16_t));
    float *out = tu_xcalloc(n * re, sizeof(float)), *le = tu_le_f32_copy(rows, n * re);
    fkvf_rows blk = {le, n, FKVF_DTYPE_F32, 0};
    OK(fkvf_rvq_encode(q, &blk, rope, beam, codes, nc, 1));
    OK(fkvf_rvq_decode(q, codes, nc, 1, n, 0, rope, FKVF_DTYPE_F32, out, n * re * 4));
    tu_le_f32(out, n * re);
    *ek = *ev = 0;
    for (size_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < s->L; l++)
            for (uint32_t h = 0; h < s->H; h++) {
                size_t ko = i * re + key_off(s, l, h), vo = i * re + val_off(s, l, h);
                *ek += fkvfq_dist(rows + ko, out + ko, s->Dk);
                *ev += fkvfq_dist(rows + vo, out + vo, s->Dv);
            }
    free(codes);
    free(out);
    free(le);
}

/* ---- RVQ ----------------------------------------------------------------------------- */

/* Adding a stage never increases the reconstruction error, on the training
 * data and on held-out data of the same distribution. */
START_TEST(rvq_error_falls_with_stages)
{
    cache_shape s = {2, 2, 16, 8};
    size_t n = 1500, nh = 700;
    float *tr = gen_rows(&s, n, 1, 100, NULL, 0), *ho = gen_rows(&s, nh, 1, 200, NULL, 0);
    for (int pooled = 0; pooled <= 1; pooled++) {
        fkvf_rvq *q = train(&s, tr, n, 32, 4, 3, pooled, 9, NULL);
        double pk[2] = {INFINITY, INFINITY}, pv[2] = {INFINITY, INFINITY};
        for (int m = 0; m <= 4; m++) {
            fkvf_rvq *sub;
            OK(fkvf_rvq_subset(&sub, q, (unsigned)m, (unsigned)(m < 3 ? m : 3)));
            for (int set = 0; set < 2; set++) {
                double ek, ev;
                recon_error(sub, &s, set ? ho : tr, set ? nh : n, NULL, 0, &ek, &ev);
                ck_assert_msg(ek <= pk[set], "pooled %d set %d: key error %g after %d stages > %g",
                              pooled, set, ek, m, pk[set]);
                ck_assert_msg(ev <= pv[set], "pooled %d set %d: value error %g > %g", pooled, set,
                              ev, pv[set]);
                if (m > 0 && m <= 2) /* real progress in the first stages */
                    ck_assert(ek < 0.9 * pk[set]);
                pk[set] = ek;
                pv[set] = ev;
            }
            fkvf_rvq_free(sub);
        }
        fkvf_rvq_free(q);
    }
    free(tr);
    free(ho);
}
END_TEST

/* Every code is the exact nearest centroid of the residual left by the
 * earlier stages (brute force, binary64, ties to the smallest index), for
 * per-head and pooled codebooks, keys as cached and un-rotated. */
START_TEST(rvq_encode_is_exact_greedy)
{
    cache_shape s = {2, 3, 12, 10};
    fkvf_rope rope = {2, 8, 10000.0};
    size_t n = 150; /* more than one encoder chunk */
    float *rows = gen_rows(&s, n, 2, 300, &rope, 0);
    size_t re = row_elems(&s);
    for (int variant = 0; variant < 3; variant++) {
        const fkvf_rope *rp = variant == 2 ? &rope : NULL;
        fkvf_rvq *q = train(&s, rows, n, 16, 3, 2, variant == 1, 4, rp);
        size_t nc = fkvf_rvq_codes_per_position(q);
        ck_assert_uint_eq(nc, (size_t)s.L * s.H * 5);
        /* stream-major layout this time */
        uint16_t *codes = tu_xcalloc(n * nc, sizeof(uint16_t));
        float *le = tu_le_f32_copy(rows, n * re);
        fkvf_rows blk = {le, n, FKVF_DTYPE_F32, 0};
        OK(fkvf_rvq_encode(q, &blk, rp, 0, codes, 1, n));
        float x[16];
        for (size_t i = 0; i < n; i++)
            for (uint32_t l = 0; l < s.L; l++)
                for (uint32_t h = 0; h < s.H; h++)
                    for (unsigned kv = 0; kv < 2; kv++) {
                        uint32_t dim = kv ? s.Dv : s.Dk;
                        unsigned ns = kv ? 2 : 3;
                        memcpy(x, rows + i * re + (kv ? val_off(&s, l, h) : key_off(&s, l, h)),
                               dim * sizeof(float));
                        if (!kv && rp)
                            OK(fkvf_rope_apply_f32(rp, i, 1, x, dim));
                        for (unsigned st = 0; st < ns; st++) {
                            const float *c = fkvf_rvq_centroids(q, l, h, kv, st);
                            ck_assert_ptr_nonnull(c);
                            size_t j = ((size_t)l * s.H + h) * 5 + (kv ? 3 + st : st);
                            uint32_t want = brute_nearest(x, c, 16, dim);
                            uint16_t got = codes[j * n + i];
                            EXPECTF(got == want, "variant %d pos %zu l%u h%u kv%u s%u: %u want %u",
                                    variant, i, l, h, kv, st, got, want);
                            for (uint32_t d = 0; d < dim; d++)
                                x[d] -= c[(size_t)want * dim + d];
                        }
                    }
        /* the position-major layout gives the same codes */
        uint16_t *pm = tu_xcalloc(n * nc, sizeof(uint16_t));
        OK(fkvf_rvq_encode(q, &blk, rp, 1, pm, nc, 1));
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < nc; j++)
                EXPECT(pm[i * nc + j] == codes[j * n + i]);
        free(pm);
        free(le);
        free(codes);
        fkvf_rvq_free(q);
    }
    free(rows);
}
END_TEST

/* Decoding equals the reference of spec 13.6 computed here: binary32 sum in
 * stage order from +0.0, rotation, one rounding to the output type. */
START_TEST(rvq_decode_matches_reference)
{
    cache_shape s = {2, 2, 40, 24}; /* dims that are not multiples of 16 */
    fkvf_rope rope = {1, 32, 10000.0};
    size_t n = 600; /* more than one decode chunk */
    float *rows = gen_rows(&s, 200, 3, 400, NULL, 0);
    size_t re = row_elems(&s);
    tu_rng r = {17};
    for (int pooled = 0; pooled <= 1; pooled++) {
        fkvf_rvq *q = train(&s, rows, 200, 16, 3, 2, pooled, 1, NULL);
        size_t nc = fkvf_rvq_codes_per_position(q);
        uint16_t *codes = tu_xcalloc(n * nc, sizeof(uint16_t));
        for (size_t i = 0; i < n * nc; i++)
            codes[i] = (uint16_t)tu_below(&r, 16);
        float *ref = tu_xcalloc(re, sizeof(float));
        uint8_t *out = tu_xcalloc(n * re, 4);
        const fkvf_dtype dts[3] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16, FKVF_DTYPE_F32};
        for (int rp = 0; rp <= 1; rp++)
            for (int di = 0; di < 3; di++) {
                size_t es = dts[di] == FKVF_DTYPE_F32 ? 4 : 2;
                uint64_t first = 1000;
                OK(fkvf_rvq_decode(q, codes, nc, 1, n, first, rp ? &rope : NULL, dts[di], out,
                                   n * re * es));
                for (size_t i = 0; i < n; i++) {
                    for (uint32_t l = 0; l < s.L; l++)
                        for (uint32_t h = 0; h < s.H; h++)
                            for (unsigned kv = 0; kv < 2; kv++) {
                                uint32_t dim = kv ? s.Dv : s.Dk;
                                unsigned ns = kv ? 2 : 3;
                                float *v = ref + (kv ? val_off(&s, l, h) : key_off(&s, l, h));
                                for (uint32_t d = 0; d < dim; d++)
                                    v[d] = 0.0f;
                                for (unsigned st = 0; st < ns; st++) {
                                    size_t j = ((size_t)l * s.H + h) * 5 + (kv ? 3 + st : st);
                                    const float *c = fkvf_rvq_centroids(q, l, h, kv, st) +
                                                     (size_t)codes[i * nc + j] * dim;
                                    for (uint32_t d = 0; d < dim; d++)
                                        v[d] += c[d];
                                }
                                if (!kv && rp)
                                    OK(fkvf_rope_apply_f32(&rope, first + i, 0, v, dim));
                            }
                    const uint8_t *o = out + i * re * es;
                    for (size_t e = 0; e < re; e++) {
                        uint32_t got, want;
                        if (es == 4) {
                            got = tu_ld32le(o + 4 * e);
                            want = f2u(ref[e]);
                        } else {
                            got = tu_ld16le(o + 2 * e);
                            want = dts[di] == FKVF_DTYPE_F16 ? fkvf_f32_to_f16(ref[e])
                                                             : fkvf_f32_to_bf16(ref[e]);
                        }
                        EXPECTF(got == want, "pooled %d rope %d dtype %d pos %zu elem %zu", pooled,
                                rp, (int)dts[di], i, e);
                    }
                }
            }
        /* a code out of range: FKVF_E_RANGE, nothing written */
        codes[(n - 1) * nc + nc - 1] = 16;
        memset(out, 0xAB, n * re * 4);
        ck_assert_int_eq(fkvf_rvq_decode(q, codes, nc, 1, n, 0, NULL, FKVF_DTYPE_F32, out,
                                         n * re * 4),
                         FKVF_E_RANGE);
        ck_assert_uint_eq(out[0], 0xAB);
        ck_assert_uint_eq(out[n * re * 4 - 1], 0xAB);
        /* the same with one array per stream (pos_stride 1, restore's
         * layout), the bad code in the middle of the last stream's */
        uint16_t *sm = malloc(n * nc * sizeof *sm);
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < nc; j++)
                sm[j * n + i] = codes[i * nc + j] & 15;
        sm[(nc - 1) * n + n / 2] = 16;
        ck_assert_int_eq(fkvf_rvq_decode(q, sm, 1, n, n, 0, NULL, FKVF_DTYPE_F32, out,
                                         n * re * 4),
                         FKVF_E_RANGE);
        ck_assert_uint_eq(out[0], 0xAB);
        ck_assert_uint_eq(out[n * re * 4 - 1], 0xAB);
        sm[(nc - 1) * n + n / 2] = 15;
        OK(fkvf_rvq_decode(q, sm, 1, n, n, 0, NULL, FKVF_DTYPE_F32, out, n * re * 4));
        free(sm);
        free(ref);
        free(out);
        free(codes);
        fkvf_rvq_free(q);
    }
    free(rows);
}
END_TEST

/* The decoder's kernels (AVX2 + F16C where the CPU has them) and its
 * portable code against a plain implementation of spec 13.6 / 8.1 written
 * here: binary32 sums of the centroids in stage order from +0.0, then for a
 * key before RoPE the rotation of pair i by angle t * theta^(-2i / rope_dims)
 * (cos and sin in binary64, x0 c - x1 s and x0 s + x1 c in binary64, each
 * rounded once to binary32), then the conversion to the output dtype (the
 * search-based references above). Random tables with magnitudes from f16
 * subnormals to near FLT_MAX (sums that overflow to infinity, rotations of
 * infinities that give NaN), random codes, both layouts, full and partial
 * rotary dims with pair counts that are and are not multiples of four, dims
 * that are not multiples of eight, all three output dtypes, two decode
 * chunks; every element compared bit for bit. */
static uint32_t ref_out_bits(fkvf_dtype dt, float v)
{
    if (dt == FKVF_DTYPE_F32)
        return f2u(v);
    if (isnan(v)) /* the references above leave NaN out: the kept-payload rule */
        return dt == FKVF_DTYPE_F16 ? fkvf_f32_to_f16(v) : fkvf_f32_to_bf16(v);
    return dt == FKVF_DTYPE_F16 ? ref_f32_to_f16(v) : ref_f32_to_bf16(v);
}

START_TEST(rvq_decode_kernels_match_plain_reference)
{
    static const struct {
        uint32_t L, H, Dk, Dv, k;
        unsigned ks, vs;
        fkvf_rope rope;
        uint64_t first;
        size_t n, code_stride;
    } cases[] = {
        {2, 3, 64, 64, 64, 4, 2, {1, 64, 10000.0}, 0, 600, 1},
        {2, 3, 64, 64, 64, 4, 2, {2, 64, 10000.0}, 123456789, 600, 1},
        {1, 2, 40, 24, 32, 3, 2, {1, 22, 500000.0}, 1000, 530, 2}, /* 11 pairs */
        {1, 2, 40, 24, 32, 3, 2, {2, 20, 10000.0}, 77, 530, 1},    /* 10 pairs */
        {1, 1, 20, 12, 16, 2, 3, {2, 16, 1.5}, 5, 40, 1},          /* 8 pairs, tail dims */
        {1, 2, 40, 16, 32, 2, 1, {1, 24, 10000.0}, 9, 70, 1},      /* 12 pairs, 2 plain blocks */
        {1, 2, 44, 8, 32, 2, 1, {2, 32, 10000.0}, 11, 70, 1},      /* 16 pairs, block + tail */
        {1, 2, 10, 10, 16, 1, 1, {1, 2, 10000.0}, 3, 20, 1},       /* one pair */
    };
    const fkvf_dtype dts[3] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16, FKVF_DTYPE_F32};
    tu_rng r = {4242};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const uint32_t L = cases[ci].L, H = cases[ci].H, Dk = cases[ci].Dk, Dv = cases[ci].Dv;
        const uint32_t k = cases[ci].k;
        const unsigned ks = cases[ci].ks, vs = cases[ci].vs, m = ks + vs;
        const size_t n = cases[ci].n, cst = cases[ci].code_stride;
        fkvf_codebook_shape sh = {L, H, Dk, Dv, k, (uint8_t)ks, (uint8_t)vs, FKVF_DTYPE_F32, 0, NULL};
        size_t nf = (size_t)L * H * k * (ks * Dk + vs * Dv);
        float *tab = tu_xcalloc(nf, sizeof(float));
        for (size_t i = 0; i < nf; i++) {
            uint32_t kind = tu_below(&r, 64);
            double v = nrand(&r);
            if (kind < 4) /* two of these with one sign overflow binary32 */
                v = (tu_below(&r, 2) ? 1 : -1) * 0x1.8p127 * (1 + urand(&r) * 0.25);
            else if (kind < 8)
                v *= ldexp(1.0, (int)tu_below(&r, 24) - 30); /* f16 / bf16 small and subnormal */
            else if (kind < 12)
                v *= 30000.0; /* near the f16 overflow threshold */
            tab[i] = (float)v;
        }
        tu_le_f32(tab, nf); /* tables are little-endian bytes */
        fkvf_rvq *q;
        OK(fkvf_rvq_from_tables(&q, &sh, 0, tab, nf * sizeof(float), NULL));
        const size_t nc = fkvf_rvq_codes_per_position(q), ps = nc * cst + 3;
        uint16_t *codes = tu_xcalloc(n * ps, sizeof(uint16_t));
        for (size_t i = 0; i < n * ps; i++)
            codes[i] = (uint16_t)tu_below(&r, k);
        const size_t re = (size_t)L * H * (Dk + Dv);
        float *ref = tu_xcalloc(n * re, sizeof(float));
        uint8_t *o1 = tu_xcalloc(n * re, 4), *o2 = tu_xcalloc(n * re, 4);
        for (int rp = 0; rp <= 1; rp++) {
            const fkvf_rope *rope = &cases[ci].rope;
            const uint64_t first = cases[ci].first;
            /* the reference rows */
            for (size_t i = 0; i < n; i++)
                for (uint32_t l = 0; l < L; l++)
                    for (uint32_t h = 0; h < H; h++)
                        for (unsigned kv = 0; kv < 2; kv++) {
                            const uint32_t dim = kv ? Dv : Dk;
                            const unsigned ns = kv ? vs : ks;
                            float *v = ref + i * re + (size_t)l * H * (Dk + Dv) +
                                       (kv ? (size_t)H * Dk + (size_t)h * Dv : (size_t)h * Dk);
                            for (uint32_t d = 0; d < dim; d++) {
                                float a = 0.0f;
                                for (unsigned st = 0; st < ns; st++) {
                                    size_t cj = ((size_t)l * H + h) * m + (kv ? ks : 0) + st;
                                    const float *c = fkvf_rvq_centroids(q, l, h, kv, st) +
                                                     (size_t)codes[i * ps + cj * cst] * dim;
                                    a += c[d];
                                }
                                v[d] = a;
                            }
                            if (kv || !rp)
                                continue;
                            const uint32_t half = rope->rope_dims / 2;
                            for (uint32_t p = 0; p < half; p++) {
                                double fr = pow(rope->theta,
                                                -(double)(2 * p) / (double)rope->rope_dims);
                                double ang = (double)(first + i) * fr;
                                double c = cos(ang), sn = sin(ang);
                                size_t j0 = rope->layout == 1 ? 2 * (size_t)p : p;
                                size_t j1 = rope->layout == 1 ? 2 * (size_t)p + 1 : p + half;
                                double x0 = v[j0], x1 = v[j1];
                                v[j0] = (float)(x0 * c - x1 * sn);
                                v[j1] = (float)(x0 * sn + x1 * c);
                            }
                        }
            for (int di = 0; di < 3; di++) {
                const fkvf_dtype dt = dts[di];
                const size_t es = dt == FKVF_DTYPE_F32 ? 4 : 2;
                memset(o1, 0xA5, n * re * 4);
                memset(o2, 0x5A, n * re * 4);
                OK(fkvf_rvq_decode(q, codes, ps, cst, n, first, rp ? rope : NULL, dt, o1,
                                   n * re * es));
                OK(fkvfq_rvq_decode_portable(q, codes, ps, cst, n, first, rp ? rope : NULL, dt,
                                             o2, n * re * es));
                for (size_t e = 0; e < n * re; e++) {
                    uint32_t want = ref_out_bits(dt, ref[e]), g1 = 0, g2 = 0;
                    if (es == 4) {
                        g1 = tu_ld32le(o1 + 4 * e);
                        g2 = tu_ld32le(o2 + 4 * e);
                    } else {
                        g1 = tu_ld16le(o1 + 2 * e);
                        g2 = tu_ld16le(o2 + 2 * e);
                    }
                    EXPECTF(g1 == want && g2 == want,
                            "case %zu rope %d dtype %d elem %zu (pos %zu): fast 0x%x portable "
                            "0x%x want 0x%x",
                            ci, rp, (int)dt, e % re, e / re, g1, g2, want);
                }
                if (ci == 0 && di == 0 && rp) { /* the extremes were exercised */
                    size_t n_inf = 0, n_nan = 0, n_sub = 0;
                    for (size_t e = 0; e < n * re; e++) {
                        n_inf += isinf(ref[e]) != 0;
                        n_nan += isnan(ref[e]) != 0;
                        n_sub += ref[e] != 0 && fabsf(ref[e]) < 0x1p-14f;
                    }
                    ck_assert_msg(n_inf > 0 && n_nan > 0 && n_sub > 0, "inf %zu nan %zu sub %zu",
                                  n_inf, n_nan, n_sub);
                }
            }
        }
        /* range: the largest code passes, k and any higher bit fail */
        const uint16_t bad[3] = {(uint16_t)k, (uint16_t)(k | 1u), 0x8000};
        for (int b = 0; b < 3; b++) {
            size_t at = (n - 1) * ps + (nc - 1) * cst;
            uint16_t keep = codes[at];
            codes[at] = bad[b];
            ck_assert_int_eq(fkvf_rvq_decode(q, codes, ps, cst, n, 0, NULL, FKVF_DTYPE_F32, o1,
                                             n * re * 4),
                             FKVF_E_RANGE);
            codes[at] = keep;
        }
        codes[0] = (uint16_t)(k - 1);
        OK(fkvf_rvq_decode(q, codes, ps, cst, n, 0, NULL, FKVF_DTYPE_F32, o1, n * re * 4));
        free(tab);
        free(codes);
        free(ref);
        free(o1);
        free(o2);
        fkvf_rvq_free(q);
    }
}
END_TEST

/* f16 codebooks take the decoder's f16 path on chunks of 64 positions or
 * more (tables copied to f16 a group of heads at a time, output written
 * with non-temporal stores when aligned) and a prefetching binary32 path on
 * shorter ones; both must give the portable code's bytes. f16 tables from
 * subnormal to near the f16 maximum, signed zeros, random codes; both code
 * layouts; RoPE off, whole-block (interleaved and half-split) and partial
 * rotary dims; dims with tails; pooled tables for 4 KV heads; K stages 0;
 * head groups smaller than a layer (k = 512: 2 + 1 heads of 393 KB in the
 * 1 MB copy; k = 1024: one head a group) and tables too large for the
 * f16 copy; chunk tails on either side of 64 positions (rope_dims 1024:
 * 256 positions per chunk); calls of 1..65 rows in every case; an output
 * 2 bytes off alignment; f16, bf16 and f32 out. */
/* fkvf_rvq_decode_to: every layer range, both layouts, rows placed at an
 * offset inside a larger output, on 1 and 3 threads, binary32 and f16
 * in-place tables, a per-layer stage table; each vector must equal the
 * portable whole-row decode's (rearranged here), and the rows outside the
 * target range must stay untouched. */
static const uint8_t dt_stages[6] = {4, 2, 1, 3, 0, 2};

/* The element offset of vector (selected layer ls, head h, kv) of row
 * `row` in an output of n_out rows of nsel layers holding `parts`, rows
 * (heads 0) or heads-first (heads 1), as fkvf_rvq_decode_to documents it
 * (written here from that text, not from the library's code). */
typedef struct dt_geom {
    uint32_t H, Dk, Dv, nsel;
    unsigned parts;
    int heads;
    size_t n_out;
} dt_geom;

static size_t sel_index(const dt_geom *g, uint32_t ls, uint32_t h, unsigned kv, size_t row)
{
    size_t dk = g->parts & 1u ? g->Dk : 0, dv = g->parts & 2u ? g->Dv : 0;
    size_t E = (size_t)g->H * (dk + dv);
    size_t in = kv ? (size_t)g->H * dk + (size_t)h * g->Dv : (size_t)h * g->Dk;
    if (g->heads)
        return (ls * E + in) * g->n_out + row * (kv ? g->Dv : g->Dk);
    return row * g->nsel * E + ls * E + in;
}

/* Vectors of one fkvf_rvq_decode_to output (rows [row0, row0 + n) of g,
 * layers l0..) that differ from ref (the whole rows of n positions, every
 * layer and part), plus bytes outside the rows that are not 0xA5. */
static size_t target_mismatches(const uint8_t *out, const uint8_t *ref, const dt_geom *g,
                                uint32_t L, uint32_t l0, size_t row0, size_t n, size_t es)
{
    dt_geom all = {g->H, g->Dk, g->Dv, L, 3u, 0, n};
    size_t bad = 0;
    for (size_t row = 0; row < g->n_out; row++)
        for (uint32_t ls = 0; ls < g->nsel; ls++)
            for (uint32_t h = 0; h < g->H; h++)
                for (unsigned kv = 0; kv < 2; kv++) {
                    if (!(g->parts >> kv & 1u))
                        continue;
                    size_t dim = kv ? g->Dv : g->Dk;
                    const uint8_t *got = out + sel_index(g, ls, h, kv, row) * es;
                    if (row < row0 || row >= row0 + n) {
                        for (size_t b = 0; b < dim * es; b++)
                            bad += got[b] != 0xA5;
                        continue;
                    }
                    size_t w = sel_index(&all, l0 + ls, h, kv, row - row0);
                    bad += memcmp(got, ref + w * es, dim * es) != 0;
                }
    return bad;
}

/* Training's worker count under its scratch budget: what the threads ask
 * for while their scratch fits FKVFQ_TRAIN_SCRATCH_BYTES, fewer when it
 * does not, never none. */
START_TEST(train_threads_within_scratch_budget)
{
    const size_t B = FKVFQ_TRAIN_SCRATCH_BYTES;
    ck_assert_uint_eq(fkvfq_train_threads(64, 9u << 20), 64);          /* 576 MiB */
    ck_assert_uint_eq(fkvfq_train_threads(64, (size_t)69 << 20), B / ((size_t)69 << 20));
    ck_assert_uint_le(fkvfq_train_threads(64, (size_t)69 << 20) * ((size_t)69 << 20), B);
    ck_assert_uint_eq(fkvfq_train_threads(256, B / 256), 256);         /* exactly fits */
    ck_assert_uint_eq(fkvfq_train_threads(256, B / 256 + 1), 255);
    ck_assert_uint_eq(fkvfq_train_threads(4, B + 1), 1);               /* one always runs */
    ck_assert_uint_eq(fkvfq_train_threads(4, SIZE_MAX), 1);
    ck_assert_uint_eq(fkvfq_train_threads(1, 0), 1);
    ck_assert_uint_eq(fkvfq_train_threads(7, 0), 7);
}
END_TEST

START_TEST(rvq_decode_to_matches_rows)
{
    static const struct {
        uint32_t L, H, Dk, Dv, k;
        unsigned ks, vs, per_layer;
        fkvf_rope rope;
    } cases[] = {
        {3, 2, 64, 64, 32, 4, 2, 0, {2, 64, 10000.0}},
        {3, 3, 40, 24, 16, 3, 2, 0, {1, 22, 500000.0}},
        {3, 2, 32, 32, 16, 4, 3, 1, {2, 32, 10000.0}},
    };
    const fkvf_dtype dts[3] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16, FKVF_DTYPE_F32};
    const size_t n = 150, pad = 7, row0 = 5, n_out = n + pad;
    tu_rng r = {4242};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const uint32_t L = cases[ci].L, H = cases[ci].H, Dk = cases[ci].Dk, Dv = cases[ci].Dv;
        fkvf_codebook_shape sh = {L, H, Dk, Dv, cases[ci].k, (uint8_t)cases[ci].ks,
                                  (uint8_t)cases[ci].vs, FKVF_DTYPE_F16, 0,
                                  cases[ci].per_layer ? dt_stages : NULL};
        size_t nf = (size_t)(fkvf_codebook_size(&sh) - fkvf_codebook_tables_offset(&sh)) / 2;
        ck_assert_uint_gt(nf, 0);
        uint16_t *tab = tu_xcalloc(nf, sizeof(uint16_t));
        for (size_t i = 0; i < nf; i++)
            tab[i] = fkvf_f32_to_f16((float)nrand(&r));
        tu_le_u16(tab, nf);
        fkvf_rvq *hs[2] = {NULL, NULL};
        OK(fkvf_rvq_from_tables_decode(&hs[0], &sh, H, tab, nf * 2, NULL));
        if (fkvfq_decode16_available())
            OK(fkvf_rvq_from_tables16_borrow(&hs[1], &sh, H, tab, nf * 2, NULL));
        const size_t nc = fkvf_rvq_codes_per_position(hs[0]), re = (size_t)L * H * (Dk + Dv);
        uint16_t *codes = tu_xcalloc(n * nc, sizeof(uint16_t)); /* stream-major */
        for (size_t i = 0; i < n * nc; i++)
            codes[i] = (uint16_t)tu_below(&r, cases[ci].k);
        uint8_t *ref = tu_xcalloc(n * re, 4), *out = tu_xcalloc(n_out * re * 4 + 64, 1);
        size_t bad = 0, calls = 0;
        for (int hi = 0; hi < 2; hi++)
            for (int rp = 0; rp <= 1; rp++)
                for (int di = 0; di < 3; di++) {
                    fkvf_rvq *q = hs[hi];
                    if (!q)
                        continue;
                    const fkvf_dtype dt = dts[di];
                    const size_t es = dt == FKVF_DTYPE_F32 ? 4 : 2;
                    const fkvf_rope *rope = rp ? &cases[ci].rope : NULL;
                    OK(fkvfq_rvq_decode_portable(hs[0], codes, 1, n, n, 77, rope, dt, ref,
                                                 n * re * es));
                    for (uint32_t l0 = 0; l0 < L; l0++)
                        for (uint32_t nl = 1; l0 + nl <= L; nl++)
                            for (unsigned parts = 1; parts <= 3; parts++)
                                for (int heads = 0; heads <= 1; heads++) {
                                    fkvf_rvq_set_threads(q, 1 + 2 * (calls % 2));
                                    /* the codes of layers l0.. (stream-major: contiguous) */
                                    size_t j0 = 0;
                                    for (uint32_t l = 0; l < l0; l++)
                                        j0 += (size_t)H * (fkvf_layer_k_stages(&sh, l) +
                                                           fkvf_layer_v_stages(&sh, l));
                                    fkvf_rvq_decode_target t = {
                                        l0, nl, heads ? FKVF_LAYOUT_HEADS : FKVF_LAYOUT_ROWS,
                                        n_out, row0, parts == 3 ? 0 : parts};
                                    dt_geom g = {H, Dk, Dv, nl, parts, heads, n_out};
                                    size_t sel = (size_t)nl * H *
                                                 ((parts & 1u ? Dk : 0) + (parts & 2u ? Dv : 0)) *
                                                 es * n_out;
                                    memset(out, 0xA5, sel + 64);
                                    OK(fkvf_rvq_decode_to(q, &t, codes + j0 * n, 1, n, n, 77,
                                                          rope, dt, out, sel));
                                    calls++;
                                    bad += target_mismatches(out, ref, &g, L, l0, row0, n, es);
                                    for (size_t b = sel; b < sel + 64; b++) /* nothing after */
                                        bad += out[b] != 0xA5;
                                }
                    EXPECTF(bad == 0, "case %zu handle %d rope %d dtype %d: %zu vectors differ",
                            ci, hi, rp, (int)dt, bad);
                }
        ck_assert_uint_gt(calls, 0);
        /* refusals: a bad layout, layers or rows outside, a small buffer */
        fkvf_rvq_decode_target t = {0, L, (fkvf_layout)2, n_out, 0, 0};
        ck_assert_int_eq(fkvf_rvq_decode_to(hs[0], &t, codes, 1, n, n, 0, NULL, FKVF_DTYPE_F32,
                                            out, n_out * re * 4),
                         FKVF_E_INVALID_ARG);
        t.layout = FKVF_LAYOUT_HEADS;
        t.parts = 4;
        ck_assert_int_eq(fkvf_rvq_decode_to(hs[0], &t, codes, 1, n, n, 0, NULL, FKVF_DTYPE_F32,
                                            out, n_out * re * 4),
                         FKVF_E_INVALID_ARG);
        t.parts = 0;
        t.layer_first = 1;
        ck_assert_int_eq(fkvf_rvq_decode_to(hs[0], &t, codes, 1, n, n, 0, NULL, FKVF_DTYPE_F32,
                                            out, n_out * re * 4),
                         FKVF_E_INVALID_ARG);
        t.layer_first = 0;
        t.row_first = pad + 1;
        ck_assert_int_eq(fkvf_rvq_decode_to(hs[0], &t, codes, 1, n, n, 0, NULL, FKVF_DTYPE_F32,
                                            out, n_out * re * 4),
                         FKVF_E_INVALID_ARG);
        t.row_first = 0;
        ck_assert_int_eq(fkvf_rvq_decode_to(hs[0], &t, codes, 1, n, n, 0, NULL, FKVF_DTYPE_F32,
                                            out, n_out * re * 4 - 1),
                         FKVF_E_INVALID_ARG);
        ck_assert_int_eq(fkvf_rvq_decode_to(hs[0], NULL, codes, 1, n, n, 0, NULL, FKVF_DTYPE_F32,
                                            out, n_out * re * 4),
                         FKVF_E_INVALID_ARG);
        fkvf_rvq_free(hs[0]);
        fkvf_rvq_free(hs[1]);
        free(codes);
        free(ref);
        free(out);
        free(tab);
    }
}
END_TEST

START_TEST(rvq_decode_f16_tables_match_portable)
{
    static const struct {
        uint32_t L, H, Dk, Dv, k;
        unsigned ks, vs, pooled, kvh;
        fkvf_rope rope;
        uint64_t first;
        size_t n;
    } cases[] = {
        {2, 3, 64, 64, 64, 4, 2, 0, 3, {2, 64, 10000.0}, 0, 600},
        {2, 3, 64, 64, 64, 4, 2, 0, 3, {1, 64, 10000.0}, 123456789, 600},
        {1, 2, 40, 24, 32, 3, 2, 0, 2, {1, 22, 500000.0}, 1000, 200}, /* partial, 11 pairs */
        {1, 3, 20, 12, 16, 2, 3, 0, 3, {2, 16, 1.5}, 5, 100},         /* tail dims */
        {2, 1, 32, 32, 32, 3, 2, 1, 4, {2, 32, 10000.0}, 17, 130},    /* pooled, 4 KV heads */
        {1, 2, 16, 16, 16, 0, 2, 0, 2, {2, 16, 10000.0}, 3, 100},     /* no K stages */
        {1, 3, 64, 64, 512, 4, 2, 0, 3, {1, 64, 10000.0}, 9, 70},     /* groups of 2 + 1 heads */
        {1, 2, 64, 64, 1024, 4, 2, 0, 2, {2, 64, 10000.0}, 9, 70},    /* one head per group */
        {1, 1, 64, 64, 4096, 8, 4, 0, 1, {2, 64, 10000.0}, 9, 70},    /* no f16 copy */
        {1, 2, 1024, 8, 16, 2, 1, 0, 2, {2, 1024, 10000.0}, 0, 600},  /* chunks 256+256+88 */
        {1, 2, 1024, 8, 16, 2, 1, 0, 2, {1, 1024, 10000.0}, 0, 530},  /* 256+256+18 */
    };
    const fkvf_dtype dts[3] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16, FKVF_DTYPE_F32};
    const size_t small[] = {1, 5, 16, 63, 64, 65};
    tu_rng r = {9090};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const uint32_t L = cases[ci].L, H = cases[ci].H, Dk = cases[ci].Dk, Dv = cases[ci].Dv;
        const uint32_t k = cases[ci].k, kvh = cases[ci].kvh;
        const unsigned ks = cases[ci].ks, vs = cases[ci].vs;
        fkvf_codebook_shape sh = {L, H, Dk, Dv, k, (uint8_t)ks, (uint8_t)vs, FKVF_DTYPE_F16,
                                  (uint8_t)cases[ci].pooled, NULL};
        size_t nf = (size_t)L * H * k * (ks * Dk + vs * Dv);
        uint16_t *tab = tu_xcalloc(nf, sizeof(uint16_t));
        for (size_t i = 0; i < nf; i++) {
            uint32_t kind = tu_below(&r, 64);
            double v = nrand(&r);
            if (kind < 4)
                v = (tu_below(&r, 2) ? 1 : -1) * 60000.0; /* sums beyond the f16 maximum */
            else if (kind < 8)
                v *= ldexp(1.0, (int)tu_below(&r, 12) - 24); /* f16 subnormals */
            else if (kind < 10)
                v = tu_below(&r, 2) ? -0.0 : 0.0;
            tab[i] = fkvf_f32_to_f16((float)v);
        }
        tu_le_u16(tab, nf); /* tables are little-endian bytes */
        fkvf_rvq *q;
        OK(fkvf_rvq_from_tables_decode(&q, &sh, kvh, tab, nf * sizeof(uint16_t), NULL));
        /* the same tables read in place (restore's handle), where the CPU
         * has the kernel: every call below decoded with it too */
        fkvf_rvq *qb = NULL;
        if (fkvfq_decode16_available())
            OK(fkvf_rvq_from_tables16_borrow(&qb, &sh, kvh, tab, nf * sizeof(uint16_t), NULL));
        const size_t n = cases[ci].n, nc = fkvf_rvq_codes_per_position(q);
        uint16_t *codes = tu_xcalloc(n * nc, sizeof(uint16_t));
        for (size_t i = 0; i < n * nc; i++)
            codes[i] = (uint16_t)tu_below(&r, k);
        const size_t re = (size_t)L * kvh * (Dk + Dv), bytes = n * re * 4;
        uint8_t *o1 = tu_xcalloc(bytes + 16, 1), *o2 = tu_xcalloc(bytes + 16, 1);
        for (int rp = 0; rp <= 1; rp++)
            for (int lay = 0; lay <= 1; lay++) /* pos-major, stream-major codes */
                for (int di = 0; di < 3; di++) {
                    const fkvf_dtype dt = dts[di];
                    const size_t es = dt == FKVF_DTYPE_F32 ? 4 : 2, ps = lay ? 1 : nc;
                    const size_t cst = lay ? n : 1, size = n * re * es;
                    const fkvf_rope *rope = rp ? &cases[ci].rope : NULL;
                    const uint64_t first = cases[ci].first;
                    for (size_t off = 0; off <= (ci == 0 ? 2 : 0); off += 2) {
                        memset(o1, 0xA5, bytes + 16);
                        memset(o2, 0x5A, bytes + 16);
                        OK(fkvf_rvq_decode(q, codes, ps, cst, n, first, rope, dt, o1 + off,
                                           size));
                        OK(fkvfq_rvq_decode_portable(q, codes, ps, cst, n, first, rope, dt,
                                                     o2 + off, size));
                        EXPECTF(memcmp(o1 + off, o2 + off, size) == 0,
                                "case %zu rope %d layout %d dtype %d offset %zu differs", ci, rp,
                                lay, (int)dt, off);
                        if (!qb)
                            continue;
                        memset(o1, 0xA5, bytes + 16);
                        OK(fkvf_rvq_decode(qb, codes, ps, cst, n, first, rope, dt, o1 + off,
                                           size));
                        EXPECTF(memcmp(o1 + off, o2 + off, size) == 0,
                                "borrowed: case %zu rope %d layout %d dtype %d offset %zu differs",
                                ci, rp, lay, (int)dt, off);
                    }
                    if (lay)
                        continue;
                    /* short calls: the prefetching binary32 path and its
                     * boundary with the f16 path */
                    for (size_t si = 0; si < sizeof small / sizeof small[0]; si++) {
                        size_t c = small[si], at = n - c, sz = c * re * es;
                        memset(o1, 0xA5, bytes + 16);
                        OK(fkvf_rvq_decode(q, codes + at * nc, nc, 1, c, first + at, rope, dt,
                                           o1, sz));
                        OK(fkvfq_rvq_decode_portable(q, codes, nc, 1, n, first, rope, dt, o2,
                                                     size));
                        EXPECTF(memcmp(o1, o2 + at * re * es, sz) == 0,
                                "case %zu rope %d dtype %d: %zu rows at %zu differ", ci, rp,
                                (int)dt, c, at);
                        if (!qb)
                            continue;
                        memset(o1, 0xA5, bytes + 16);
                        OK(fkvf_rvq_decode(qb, codes + at * nc, nc, 1, c, first + at, rope, dt,
                                           o1, sz));
                        EXPECTF(memcmp(o1, o2 + at * re * es, sz) == 0,
                                "borrowed: case %zu rope %d dtype %d: %zu rows at %zu differ", ci,
                                rp, (int)dt, c, at);
                    }
                }
        free(tab);
        free(codes);
        free(o1);
        free(o2);
        fkvf_rvq_free(q);
        fkvf_rvq_free(qb);
    }
}
END_TEST

/* fkvf_rvq_from_tables16_borrow takes only what it can decode in place: f16 tables of
 * exactly the shape's size, all finite, 2-byte aligned, on a CPU with the
 * kernel (else FKVF_E_UNSUPPORTED, the caller's cue to build binary32
 * tables); the handle has no binary32 rows, the portable decoder refuses it,
 * and it reads the caller's bytes (a change to them shows in its output). */
START_TEST(rvq_borrow_f16_checks)
{
    fkvf_codebook_shape sh = {1, 2, 8, 8, 16, 2, 1, FKVF_DTYPE_F16, 0, NULL};
    const size_t nf = (size_t)2 * 16 * (2 * 8 + 8), bytes = nf * sizeof(uint16_t);
    uint16_t *tab = tu_xcalloc(nf + 1, sizeof(uint16_t));
    for (size_t i = 0; i < nf; i++)
        st16le(&tab[i], fkvf_f32_to_f16((float)i / 64.0f)); /* tables: little-endian */
    fkvf_rvq *b = (fkvf_rvq *)(uintptr_t)1;
    if (!fkvfq_decode16_available()) {
        ck_assert_int_eq(fkvf_rvq_from_tables16_borrow(&b, &sh, 2, tab, bytes, NULL), FKVF_E_UNSUPPORTED);
        ck_assert_ptr_null(b);
        free(tab);
        return;
    }
    ck_assert_int_eq(fkvf_rvq_from_tables16_borrow(NULL, &sh, 2, tab, bytes, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_from_tables16_borrow(&b, &sh, 2, tab, bytes - 2, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(b);
    ck_assert_int_eq(fkvf_rvq_from_tables16_borrow(&b, &sh, 2, tab, bytes + 2, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_from_tables16_borrow(&b, &sh, 2, NULL, bytes, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_from_tables16_borrow(&b, &sh, 3, tab, bytes, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_from_tables16_borrow(&b, &sh, 2, (const uint8_t *)(const void *)tab + 1,
                                          bytes, NULL),
                     FKVF_E_UNSUPPORTED);
    fkvf_codebook_shape s32 = sh;
    s32.dtype = FKVF_DTYPE_F32;
    ck_assert_int_eq(fkvf_rvq_from_tables16_borrow(&b, &s32, 2, tab, bytes * 2, NULL), FKVF_E_UNSUPPORTED);
    /* an infinity, a NaN, anywhere: refused as from_tables refuses them */
    const uint16_t bad[3] = {0x7C00, 0xFC00, 0x7E01};
    for (int i = 0; i < 3; i++) {
        uint16_t keep = tab[nf - 1 - (size_t)i * 100];
        st16le(&tab[nf - 1 - (size_t)i * 100], bad[i]);
        ck_assert_int_eq(fkvf_rvq_from_tables16_borrow(&b, &sh, 2, tab, bytes, NULL), FKVF_E_INVALID_ARG);
        /* the encoding handle checks them table by table, building its norms */
        fkvf_rvq *e = (fkvf_rvq *)(uintptr_t)1;
        ck_assert_int_eq(fkvf_rvq_from_tables16_encode(&e, &sh, 2, tab, bytes, NULL),
                         FKVF_E_INVALID_ARG);
        ck_assert_ptr_null(e);
        tab[nf - 1 - (size_t)i * 100] = keep;
    }
    for (size_t at = 0; at < nf; at += 97) { /* a NaN in every table in turn */
        uint16_t keep = tab[at];
        st16le(&tab[at], 0x7E00);
        fkvf_rvq *e = (fkvf_rvq *)(uintptr_t)1;
        ck_assert_int_eq(fkvf_rvq_from_tables16_encode(&e, &sh, 2, tab, bytes, NULL),
                         FKVF_E_INVALID_ARG);
        tab[at] = keep;
    }
    /* the largest finite values are taken */
    st16le(&tab[0], 0x7BFF);
    st16le(&tab[1], 0xFBFF);
    OK(fkvf_rvq_from_tables16_borrow(&b, &sh, 2, tab, bytes, NULL));
    ck_assert_ptr_null(b->rows);
    fkvf_codebook_shape got;
    uint32_t kvh;
    fkvf_rvq_shape(b, &got, &kvh);
    ck_assert_uint_eq(got.k, 16);
    ck_assert_uint_eq(kvh, 2);
    uint16_t codes[6] = {0};
    uint16_t out[2 * 16];
    ck_assert_int_eq(fkvfq_rvq_decode_portable(b, codes, 6, 1, 1, 0, NULL, FKVF_DTYPE_F16, out,
                                               sizeof out),
                     FKVF_E_UNSUPPORTED);
    /* position 0, all codes 0: key of head 0 = rows 0 of stages 0 and 1 summed;
     * element 0 is 65504 + tab[128], element 1 is -65504 + tab[129] */
    ck_assert_int_eq(fkvf_rvq_decode(b, codes, 6, 1, 1, 0, NULL, FKVF_DTYPE_F32, NULL, 0),
                     FKVF_E_INVALID_ARG);
    float o32[2 * 16];
    OK(fkvf_rvq_decode(b, codes, 6, 1, 1, 0, NULL, FKVF_DTYPE_F32, o32, sizeof o32));
    ck_assert_float_eq(tu_ldf32le(&o32[0]), 65504.0f + fkvf_f16_to_f32(tu_ld16le(&tab[128])));
    ck_assert_float_eq(tu_ldf32le(&o32[1]), -65504.0f + fkvf_f16_to_f32(tu_ld16le(&tab[129])));
    st16le(&tab[128], fkvf_f32_to_f16(1.0f)); /* borrowed: the next decode reads the change */
    OK(fkvf_rvq_decode(b, codes, 6, 1, 1, 0, NULL, FKVF_DTYPE_F32, o32, sizeof o32));
    ck_assert_float_eq(tu_ldf32le(&o32[0]), 65505.0f);
    /* no binary32 tables: centroids NULL, subset refused (they read NULL
     * rows before), encode refused; the tables are the f16 bytes. The same
     * for an encoding handle of the same tables, which also encodes. */
    fkvf_rvq *e = NULL;
    ck_assert_int_eq(fkvf_rvq_from_tables16_encode(&e, &s32, 2, tab, bytes * 2, NULL),
                     FKVF_E_UNSUPPORTED);
    ck_assert_ptr_null(e);
    OK(fkvf_rvq_from_tables16_encode(&e, &sh, 2, tab, bytes, NULL));
    fkvf_rvq *hs[2] = {b, e};
    uint16_t *back = tu_xcalloc(nf, sizeof(uint16_t));
    for (int i = 0; i < 2; i++) {
        fkvf_rvq *sub = (fkvf_rvq *)(uintptr_t)1;
        ck_assert_ptr_null(fkvf_rvq_centroids(hs[i], 0, 0, 0, 0));
        ck_assert_int_eq(fkvf_rvq_subset(&sub, hs[i], 1, 1), FKVF_E_STATE);
        ck_assert_ptr_null(sub);
        ck_assert_uint_eq(fkvf_rvq_tables_size(hs[i]), bytes);
        OK(fkvf_rvq_tables(hs[i], back, bytes));
        ck_assert(!memcmp(back, tab, bytes));
    }
    float x[2 * (2 * 8 + 8)] = {0};
    fkvf_rows one = {x, 1, FKVF_DTYPE_F32, 0};
    ck_assert_int_eq(fkvf_rvq_encode(b, &one, NULL, 1, codes, 6, 1), FKVF_E_STATE);
    OK(fkvf_rvq_encode(e, &one, NULL, 1, codes, 6, 1));
    free(back);
    fkvf_rvq_free(e);
    fkvf_rvq_free(b);
    free(tab);
}
END_TEST

/* Beam search never ends worse than greedy, per vector, and finds better
 * paths on some. Width 1 is greedy. */
START_TEST(rvq_beam_not_worse_than_greedy)
{
    cache_shape s = {1, 2, 16, 16};
    size_t n = 300;
    float *tr = gen_rows(&s, 800, 4, 500, NULL, 0), *x = gen_rows(&s, n, 4, 600, NULL, 0);
    fkvf_rvq *q = train(&s, tr, 800, 16, 4, 2, 0, 2, NULL);
    size_t nc = fkvf_rvq_codes_per_position(q), re = row_elems(&s);
    float *xle = tu_le_f32_copy(x, n * re);
    fkvf_rows blk = {xle, n, FKVF_DTYPE_F32, 0};
    uint16_t *g = tu_xcalloc(n * nc, 2), *b = tu_xcalloc(n * nc, 2);
    float *og = tu_xcalloc(n * re, 4), *ob = tu_xcalloc(n * re, 4);
    OK(fkvf_rvq_encode(q, &blk, NULL, 0, g, nc, 1));
    OK(fkvf_rvq_encode(q, &blk, NULL, 1, b, nc, 1));
    ck_assert(memcmp(g, b, n * nc * 2) == 0);
    OK(fkvf_rvq_decode(q, g, nc, 1, n, 0, NULL, FKVF_DTYPE_F32, og, n * re * 4));
    tu_le_f32(og, n * re);
    const unsigned widths[] = {2, 3, 4, 8, 64};
    for (size_t wi = 0; wi < 5; wi++) {
        OK(fkvf_rvq_encode(q, &blk, NULL, widths[wi], b, nc, 1));
        OK(fkvf_rvq_decode(q, b, nc, 1, n, 0, NULL, FKVF_DTYPE_F32, ob, n * re * 4));
        tu_le_f32(ob, n * re);
        double tg = 0, tb = 0;
        int better = 0;
        for (size_t i = 0; i < n; i++)
            for (uint32_t h = 0; h < s.H; h++)
                for (int kv = 0; kv < 2; kv++) {
                    size_t o = i * re + (kv ? val_off(&s, 0, h) : key_off(&s, 0, h));
                    double eg = fkvfq_dist(x + o, og + o, 16), eb = fkvfq_dist(x + o, ob + o, 16);
                    EXPECTF(eb <= eg, "width %u pos %zu: beam %g > greedy %g", widths[wi], i, eb,
                            eg);
                    better += eb < eg;
                    tg += eg;
                    tb += eb;
                }
        ck_assert_msg(better > 0, "width %u never improved on greedy", widths[wi]);
        ck_assert(tb < tg);
    }
    ck_assert_int_eq(fkvf_rvq_encode(q, &blk, NULL, FKVF_RVQ_MAX_BEAM + 1, b, nc, 1),
                     FKVF_E_INVALID_ARG);
    free(g);
    free(b);
    free(og);
    free(ob);
    free(tr);
    free(x);
    free(xle);
    fkvf_rvq_free(q);
}
END_TEST

static uint8_t *tables_of(const fkvf_rvq *q, size_t *size)
{
    *size = fkvf_rvq_tables_size(q);
    uint8_t *t = tu_xcalloc(*size, 1);
    OK(fkvf_rvq_tables(q, t, *size));
    return t;
}

/* Same seed: identical tables, byte for byte (also when the data come in two
 * blocks); another seed: different tables. The first stages of a deeper
 * codebook equal a shallower one's. */
START_TEST(rvq_deterministic)
{
    cache_shape s = {2, 2, 8, 8};
    size_t n = 600;
    float *rows = gen_rows(&s, n, 5, 700, NULL, 0);
    size_t sa, sb, sc, sd;
    fkvf_rvq *a = train(&s, rows, n, 16, 3, 2, 0, 77, NULL);
    fkvf_rvq *b = train(&s, rows, n, 16, 3, 2, 0, 77, NULL);
    fkvf_rvq *c = train(&s, rows, n, 16, 3, 2, 0, 78, NULL);
    uint8_t *ta = tables_of(a, &sa), *tb = tables_of(b, &sb), *tc = tables_of(c, &sc);
    ck_assert_uint_eq(sa, sb);
    ck_assert(memcmp(ta, tb, sa) == 0);
    ck_assert_uint_eq(sa, sc);
    ck_assert(memcmp(ta, tc, sa) != 0);

    /* the same rows as two blocks */
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = s.L;
    p.n_kv_heads = s.H;
    p.key_dim = s.Dk;
    p.value_dim = s.Dv;
    p.k = 16;
    p.k_stages = 3;
    p.v_stages = 2;
    p.seed = 77;
    size_t re = row_elems(&s);
    float *le = tu_le_f32_copy(rows, n * re);
    fkvf_rows two[2] = {{le, 250, FKVF_DTYPE_F32, 0},
                        {le + 250 * re, n - 250, FKVF_DTYPE_F32, 250}};
    fkvf_rvq *d;
    OK(fkvf_rvq_train(&d, &p, two, 2, NULL));
    uint8_t *td = tables_of(d, &sd);
    ck_assert(memcmp(ta, td, sa) == 0);

    /* a shallower codebook is a prefix of a deeper one */
    fkvf_rvq *e = train(&s, rows, n, 16, 1, 1, 0, 77, NULL), *sub;
    OK(fkvf_rvq_subset(&sub, a, 1, 1));
    size_t se, ss;
    uint8_t *te = tables_of(e, &se), *tsub = tables_of(sub, &ss);
    ck_assert_uint_eq(se, ss);
    ck_assert(memcmp(te, tsub, se) == 0);

    free(ta);
    free(tb);
    free(tc);
    free(td);
    free(te);
    free(tsub);
    fkvf_rvq_free(a);
    fkvf_rvq_free(b);
    fkvf_rvq_free(c);
    fkvf_rvq_free(d);
    fkvf_rvq_free(e);
    fkvf_rvq_free(sub);
    free(le);
    free(rows);
}
END_TEST

/* Shapes of per-head and pooled codebooks; the writer accepts the tables as
 * they are and a reader gives them back; loading them reproduces the
 * codebook. */
START_TEST(rvq_shapes_and_writer)
{
    cache_shape s = {3, 4, 8, 12};
    size_t n = 300;
    float *rows = gen_rows(&s, n, 6, 800, NULL, 0), *le = tu_le_f32_copy(rows, n * row_elems(&s));
    for (int pooled = 0; pooled <= 1; pooled++)
        for (int f32 = 0; f32 <= 1; f32++) {
            fkvf_rvq_params p;
            fkvf_rvq_params_init(&p);
            p.n_layers = s.L;
            p.n_kv_heads = s.H;
            p.key_dim = s.Dk;
            p.value_dim = s.Dv;
            p.k = 32;
            p.k_stages = 2;
            p.v_stages = 1;
            p.pooled = (uint8_t)pooled;
            p.table_dtype = f32 ? FKVF_DTYPE_F32 : FKVF_DTYPE_F16;
            fkvf_rows blk = {le, n, FKVF_DTYPE_F32, 0};
            fkvf_rvq *q;
            OK(fkvf_rvq_train(&q, &p, &blk, 1, NULL));
            fkvf_codebook_shape sh;
            uint32_t nkv;
            fkvf_rvq_shape(q, &sh, &nkv);
            ck_assert_uint_eq(sh.n_layers, 3);
            ck_assert_uint_eq(sh.n_heads, pooled ? 1 : 4);
            ck_assert_uint_eq(nkv, 4);
            ck_assert_uint_eq(sh.key_dim, 8);
            ck_assert_uint_eq(sh.value_dim, 12);
            ck_assert_uint_eq(sh.k, 32);
            ck_assert_uint_eq(sh.k_stages, 2);
            ck_assert_uint_eq(sh.v_stages, 1);
            ck_assert_uint_eq(sh.pooled, (unsigned)pooled);
            ck_assert_int_eq(sh.dtype, f32 ? FKVF_DTYPE_F32 : FKVF_DTYPE_F16);
            ck_assert_uint_eq(fkvf_rvq_codes_per_position(q), 3 * 4 * 3);
            size_t tsz = fkvf_rvq_tables_size(q);
            ck_assert_uint_eq(tsz, fkvf_codebook_size(&sh) - 64);
            ck_assert_uint_eq(tsz, (size_t)3 * (pooled ? 1 : 4) * 32 * (2 * 8 + 12) * (f32 ? 4 : 2));
            /* pooled: every head sees the same tables */
            const float *c0 = fkvf_rvq_centroids(q, 1, 0, 0, 1), *c3 = fkvf_rvq_centroids(q, 1, 3, 0, 1);
            ck_assert(pooled ? c0 == c3 : c0 != c3);
            ck_assert_ptr_null(fkvf_rvq_centroids(q, 3, 0, 0, 0));
            ck_assert_ptr_null(fkvf_rvq_centroids(q, 0, 4, 0, 0));
            ck_assert_ptr_null(fkvf_rvq_centroids(q, 0, 0, 0, 2));
            ck_assert_ptr_null(fkvf_rvq_centroids(q, 0, 0, 1, 1));
            ck_assert_ptr_null(fkvf_rvq_centroids(q, 0, 0, 2, 0));
            uint8_t *t = tu_xcalloc(tsz, 1);
            ck_assert_int_eq(fkvf_rvq_tables(q, t, tsz - 1), FKVF_E_INVALID_ARG);
            OK(fkvf_rvq_tables(q, t, tsz));

            /* a codebook file through the writer and back */
            tu_buf buf = {0};
            fkvf_sink sink = tu_buf_sink(&buf);
            fkvf_writer_options wo;
            fkvf_writer_options_init(&wo);
            wo.sync = FKVF_SYNC_NONE;
            fkvf_writer *w;
            OK(fkvf_writer_create_sink(&w, &sink, &wo, NULL));
            ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, t, tsz, 0), FKVF_OK);
            OK(fkvf_writer_finish(w));
            fkvf_writer_free(w);
            fkvf_reader *rd;
            OK(fkvf_reader_open_memory(&rd, buf.data, buf.size, FKVF_OPEN_STRICT, NULL));
            fkvf_codebook_shape rsh;
            const void *contents;
            size_t csz;
            uint8_t hash[16];
            OK(fkvf_reader_codebook(rd, &rsh, &contents, &csz, hash));
            ck_assert_uint_eq(csz, tsz + 64);
            ck_assert(memcmp((const uint8_t *)contents + 64, t, tsz) == 0);
            ck_assert(rsh.n_layers == sh.n_layers && rsh.n_heads == sh.n_heads &&
                      rsh.key_dim == sh.key_dim && rsh.value_dim == sh.value_dim &&
                      rsh.k == sh.k && rsh.k_stages == sh.k_stages &&
                      rsh.v_stages == sh.v_stages && rsh.dtype == sh.dtype &&
                      rsh.pooled == sh.pooled);
            fkvf_rvq *q2;
            OK(fkvf_rvq_from_tables(&q2, &rsh, pooled ? 4 : 0, (const uint8_t *)contents + 64,
                                    tsz, NULL));
            size_t t2sz;
            uint8_t *t2 = tables_of(q2, &t2sz);
            ck_assert(t2sz == tsz && memcmp(t2, t, tsz) == 0);
            /* and it encodes the same */
            size_t nc = fkvf_rvq_codes_per_position(q);
            uint16_t *c1 = tu_xcalloc(n * nc, 2), *c2 = tu_xcalloc(n * nc, 2);
            OK(fkvf_rvq_encode(q, &blk, NULL, 0, c1, nc, 1));
            OK(fkvf_rvq_encode(q2, &blk, NULL, 0, c2, nc, 1));
            ck_assert(memcmp(c1, c2, n * nc * 2) == 0);
            free(c1);
            free(c2);
            free(t2);
            fkvf_rvq_free(q2);
            fkvf_reader_free(rd);
            tu_buf_free(&buf);
            free(t);
            fkvf_rvq_free(q);
        }
    free(le);
    free(rows);
}
END_TEST

/* Keys rotated by RoPE: archiving them un-rotated (key_rope given) is much
 * more accurate than as cached; encoding with key_rope equals encoding the
 * keys un-rotated by hand. */
START_TEST(rvq_keys_before_rope)
{
    cache_shape s = {1, 2, 16, 8};
    fkvf_rope rope = {2, 16, 10000.0};
    size_t n = 1200, nh = 400;
    float *tr = gen_rows(&s, n, 7, 900, &rope, 0);
    float *ho = gen_rows(&s, nh, 7, 901, &rope, 0);
    fkvf_rvq *asis = train(&s, tr, n, 32, 2, 1, 0, 3, NULL);
    fkvf_rvq *pre = train(&s, tr, n, 32, 2, 1, 0, 3, &rope);
    double ek_a, ev_a, ek_p, ev_p;
    recon_error(asis, &s, ho, nh, NULL, 0, &ek_a, &ev_a);
    recon_error(pre, &s, ho, nh, &rope, 0, &ek_p, &ev_p);
    ck_assert_msg(ek_p < 0.5 * ek_a, "pre-rope key error %g vs as-is %g", ek_p, ek_a);
    ck_assert(ev_p == ev_a); /* values do not depend on the key mode */

    /* by hand: un-rotate the rows, encode without rope */
    size_t re = row_elems(&s), nc = fkvf_rvq_codes_per_position(pre);
    float *un = tu_xcalloc(nh * re, sizeof(float));
    memcpy(un, ho, nh * re * sizeof(float));
    for (size_t i = 0; i < nh; i++)
        for (uint32_t h = 0; h < s.H; h++)
            OK(fkvf_rope_apply_f32(&rope, i, 1, un + i * re + key_off(&s, 0, h), s.Dk));
    uint16_t *c1 = tu_xcalloc(nh * nc, 2), *c2 = tu_xcalloc(nh * nc, 2);
    float *hle = tu_le_f32_copy(ho, nh * re);
    tu_le_f32(un, nh * re);
    fkvf_rows b1 = {hle, nh, FKVF_DTYPE_F32, 0}, b2 = {un, nh, FKVF_DTYPE_F32, 0};
    OK(fkvf_rvq_encode(pre, &b1, &rope, 0, c1, nc, 1));
    OK(fkvf_rvq_encode(pre, &b2, NULL, 0, c2, nc, 1));
    ck_assert(memcmp(c1, c2, nh * nc * 2) == 0);
    free(c1);
    free(c2);
    free(hle);
    free(un);
    free(tr);
    free(ho);
    fkvf_rvq_free(asis);
    fkvf_rvq_free(pre);
}
END_TEST

/* f16 and bf16 input rows encode like their f32 values */
START_TEST(rvq_input_dtypes)
{
    cache_shape s = {1, 2, 8, 8};
    size_t n = 200, re = row_elems(&s);
    float *rows = gen_rows(&s, n, 8, 1000, NULL, 0);
    fkvf_rvq *q = train(&s, rows, n, 16, 2, 2, 0, 5, NULL);
    size_t nc = fkvf_rvq_codes_per_position(q);
    tu_le_f32(rows, n * re); /* from here on the library's little-endian rows */
    for (int k = 0; k < 2; k++) {
        fkvf_dtype dt = k ? FKVF_DTYPE_BF16 : FKVF_DTYPE_F16;
        uint8_t *h = tu_xcalloc(n * re, 2);
        float *back = tu_xcalloc(n * re, 4);
        OK(fkvf_convert(dt, h, FKVF_DTYPE_F32, rows, n * re));
        OK(fkvf_convert(FKVF_DTYPE_F32, back, dt, h, n * re));
        uint8_t *odd = tu_dup_odd(h, n * re * 2);
        fkvf_rows b1 = {odd, n, dt, 0}, b2 = {back, n, FKVF_DTYPE_F32, 0};
        uint16_t *c1 = tu_xcalloc(n * nc, 2), *c2 = tu_xcalloc(n * nc, 2);
        OK(fkvf_rvq_encode(q, &b1, NULL, 0, c1, nc, 1));
        OK(fkvf_rvq_encode(q, &b2, NULL, 0, c2, nc, 1));
        ck_assert(memcmp(c1, c2, n * nc * 2) == 0);
        tu_free_odd(odd);
        free(h);
        free(back);
        free(c1);
        free(c2);
    }
    /* non-finite inputs: encoding still gives codes in range */
    st_f32le(&rows[3], NAN);
    st_f32le(&rows[re + 1], INFINITY);
    uint16_t *c = tu_xcalloc(n * nc, 2);
    fkvf_rows b = {rows, n, FKVF_DTYPE_F32, 0};
    OK(fkvf_rvq_encode(q, &b, NULL, 0, c, nc, 1));
    OK(fkvf_rvq_encode(q, &b, NULL, 4, c, nc, 1));
    for (size_t i = 0; i < n * nc; i++)
        EXPECT(c[i] < 16);
    free(c);
    free(rows);
    fkvf_rvq_free(q);
}
END_TEST

/* ---- arguments ------------------------------------------------------------------------ */

START_TEST(rvq_invalid_arguments)
{
    cache_shape s = {1, 2, 8, 8};
    size_t n = 64, re = row_elems(&s);
    float *rows = gen_rows(&s, n, 9, 1100, NULL, 0);
    tu_le_f32(rows, n * re); /* the library's little-endian rows */
    fkvf_rvq_params p0;
    fkvf_rvq_params_init(&p0);
    ck_assert_uint_eq(p0.k, 256);
    ck_assert_uint_eq(p0.k_stages, 4);
    ck_assert_uint_eq(p0.v_stages, 2);
    ck_assert_int_eq(p0.table_dtype, FKVF_DTYPE_F16);
    p0.n_layers = s.L;
    p0.n_kv_heads = s.H;
    p0.key_dim = s.Dk;
    p0.value_dim = s.Dv;
    p0.k = 16;
    fkvf_rows blk = {rows, n, FKVF_DTYPE_F32, 0};
    fkvf_rvq *q = (fkvf_rvq *)(uintptr_t)1;
    fkvf_rope badrope = {1, 9, 10000}, bigrope = {1, 10, 10000};
    for (int c = 0; c < 20; c++) {
        fkvf_rvq_params p = p0;
        fkvf_rows b = blk;
        size_t nb = 1;
        switch (c) {
        case 0: p.k = 8; break;
        case 1: p.k = 24; break;
        case 2: p.k = 8192; break;
        case 3: p.k_stages = 17; break;
        case 4: p.v_stages = 200; break;
        case 5: p.n_layers = 0; break;
        case 6: p.n_kv_heads = 1025; break;
        case 7: p.key_dim = 0; break;
        case 8: p.value_dim = 16385; break;
        case 9: p.table_dtype = FKVF_DTYPE_BF16; break;
        case 10: p.max_iters = 0; break;
        case 11: p.samples_per_centroid = 0; break;
        case 12: p.pooled = 2; break;
        case 13: p.key_rope = &badrope; break;
        case 14: p.key_rope = &bigrope; break;
        case 15: b.dtype = (fkvf_dtype)7; break;
        case 16: b.n_rows = 0; break; /* no training data */
        case 17: nb = 0; break;
        case 18: b.data = NULL; break;
        default: b.first_position = UINT64_MAX; break;
        }
        ck_assert_msg(fkvf_rvq_train(&q, &p, &b, nb, NULL) == FKVF_E_INVALID_ARG, "case %d", c);
        ck_assert_ptr_null(q);
        q = (fkvf_rvq *)(uintptr_t)1;
    }
    ck_assert_int_eq(fkvf_rvq_train(NULL, &p0, &blk, 1, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_train(&q, NULL, &blk, 1, NULL), FKVF_E_INVALID_ARG);
    /* non-finite training data */
    uint8_t keep[4];
    memcpy(keep, &rows[5], 4);
    st_f32le(&rows[5], NAN);
    ck_assert_int_eq(fkvf_rvq_train(&q, &p0, &blk, 1, NULL), FKVF_E_INVALID_ARG);
    st_f32le(&rows[5], -INFINITY);
    ck_assert_int_eq(fkvf_rvq_train(&q, &p0, &blk, 1, NULL), FKVF_E_INVALID_ARG);
    memcpy(&rows[5], keep, 4);
    uint16_t h16[2] = {0x3C00, 0x7C00}; /* key 1.0, value infinity */
    tu_le_u16(h16, 2);
    fkvf_rows hb = {h16, 1, FKVF_DTYPE_F16, 0};
    fkvf_rvq_params p1 = p0;
    p1.n_layers = p1.n_kv_heads = p1.key_dim = p1.value_dim = 1;
    p1.k_stages = 0; /* values only, and the one value is infinite */
    ck_assert_int_eq(fkvf_rvq_train(&q, &p1, &hb, 1, NULL), FKVF_E_INVALID_ARG);

    OK(fkvf_rvq_train(&q, &p0, &blk, 1, NULL));
    size_t nc = fkvf_rvq_codes_per_position(q);
    uint16_t *codes = tu_xcalloc(n * nc, 2);
    float *out = tu_xcalloc(n * re, 4);
    fkvf_rope okrope = {2, 8, 10000};
    /* encode */
    ck_assert_int_eq(fkvf_rvq_encode(NULL, &blk, NULL, 0, codes, nc, 1), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_encode(q, NULL, NULL, 0, codes, nc, 1), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_encode(q, &blk, &badrope, 0, codes, nc, 1), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_encode(q, &blk, NULL, 0, NULL, nc, 1), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_encode(q, &blk, NULL, 0, codes, 0, 1), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_encode(q, &blk, NULL, 0, codes, nc, 0), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_encode(q, &blk, NULL, 0, codes, SIZE_MAX / 2, 1), FKVF_E_INVALID_ARG);
    fkvf_rows bad = blk;
    bad.dtype = (fkvf_dtype)0;
    ck_assert_int_eq(fkvf_rvq_encode(q, &bad, NULL, 0, codes, nc, 1), FKVF_E_INVALID_ARG);
    bad = blk;
    bad.n_rows = SIZE_MAX / 8;
    ck_assert_int_eq(fkvf_rvq_encode(q, &bad, NULL, 0, codes, nc, 1), FKVF_E_INVALID_ARG);
    bad = blk;
    bad.first_position = UINT64_MAX - 2;
    ck_assert_int_eq(fkvf_rvq_encode(q, &bad, &okrope, 0, codes, nc, 1), FKVF_E_INVALID_ARG);
    bad.n_rows = 0; /* nothing to do */
    OK(fkvf_rvq_encode(q, &bad, NULL, 0, NULL, 0, 0));
    OK(fkvf_rvq_encode(q, &blk, &okrope, 0, codes, nc, 1));
    /* decode */
    size_t osz = n * re * 4;
    ck_assert_int_eq(fkvf_rvq_decode(NULL, codes, nc, 1, n, 0, NULL, FKVF_DTYPE_F32, out, osz),
                     FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_decode(q, codes, nc, 1, n, 0, NULL, FKVF_DTYPE_F32, out, osz - 1),
                     FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_decode(q, codes, nc, 1, n, 0, NULL, (fkvf_dtype)5, out, osz),
                     FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_decode(q, codes, nc, 1, n, 0, &badrope, FKVF_DTYPE_F32, out, osz),
                     FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_decode(q, NULL, nc, 1, n, 0, NULL, FKVF_DTYPE_F32, out, osz),
                     FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_decode(q, codes, nc, 1, n, 0, NULL, FKVF_DTYPE_F32, NULL, osz),
                     FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_decode(q, codes, nc, 0, n, 0, NULL, FKVF_DTYPE_F32, out, osz),
                     FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_decode(q, codes, nc, 1, n, UINT64_MAX, NULL, FKVF_DTYPE_F32, out,
                                     osz),
                     FKVF_E_INVALID_ARG);
    OK(fkvf_rvq_decode(q, codes, nc, 1, 0, 0, NULL, FKVF_DTYPE_F32, NULL, 0));
    OK(fkvf_rvq_decode(q, codes, nc, 1, n, 0, &okrope, FKVF_DTYPE_F32, out, osz));
    /* subset, tables, from_tables */
    fkvf_rvq *sub = (fkvf_rvq *)(uintptr_t)1;
    ck_assert_int_eq(fkvf_rvq_subset(&sub, q, 5, 0), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(sub);
    ck_assert_int_eq(fkvf_rvq_subset(&sub, q, 0, 3), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_subset(&sub, NULL, 0, 0), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_subset(NULL, q, 0, 0), FKVF_E_INVALID_ARG);
    OK(fkvf_rvq_subset(&sub, q, 0, 0)); /* no stages: zero vectors */
    ck_assert_uint_eq(fkvf_rvq_codes_per_position(sub), 0);
    ck_assert_uint_eq(fkvf_rvq_tables_size(sub), 0);
    OK(fkvf_rvq_decode(sub, NULL, 0, 0, n, 0, NULL, FKVF_DTYPE_F32, out, osz));
    for (size_t i = 0; i < n * re; i++)
        EXPECT(tu_ldf32le(&out[i]) == 0.0f);
    OK(fkvf_rvq_encode(sub, &blk, NULL, 0, NULL, 0, 0));
    fkvf_rvq_free(sub);
    ck_assert_int_eq(fkvf_rvq_tables(NULL, out, 4), FKVF_E_INVALID_ARG);
    ck_assert_uint_eq(fkvf_rvq_tables_size(NULL), 0);
    ck_assert_uint_eq(fkvf_rvq_codes_per_position(NULL), 0);
    fkvf_codebook_shape sh;
    fkvf_rvq_shape(q, &sh, NULL);
    size_t tsz;
    uint8_t *t = tables_of(q, &tsz);
    fkvf_rvq *q2 = (fkvf_rvq *)(uintptr_t)1;
    ck_assert_int_eq(fkvf_rvq_from_tables(&q2, &sh, 0, t, tsz - 2, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(q2);
    ck_assert_int_eq(fkvf_rvq_from_tables(&q2, &sh, 3, t, tsz, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_from_tables(&q2, NULL, 0, t, tsz, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_from_tables(&q2, &sh, 0, NULL, tsz, NULL), FKVF_E_INVALID_ARG);
    fkvf_codebook_shape bs = sh;
    bs.pooled = 1; /* pooled with n_heads 2 */
    ck_assert_int_eq(fkvf_rvq_from_tables(&q2, &bs, 0, t, tsz, NULL), FKVF_E_INVALID_ARG);
    bs = sh;
    bs.dtype = FKVF_DTYPE_BF16;
    ck_assert_int_eq(fkvf_rvq_from_tables(&q2, &bs, 0, t, tsz, NULL), FKVF_E_INVALID_ARG);
    t[10] = 0x00; /* an f16 infinity */
    t[11] = 0x7C;
    ck_assert_int_eq(fkvf_rvq_from_tables(&q2, &sh, 0, t, tsz, NULL), FKVF_E_INVALID_ARG);
    free(t);
    fkvf_rvq_free(NULL);
    free(codes);
    free(out);
    free(rows);
    fkvf_rvq_free(q);
}
END_TEST

/* ---- allocation failure ---------------------------------------------------------------- */

/* Every allocation failing in turn: FKVF_E_NOMEM, nothing leaked, and the
 * operation succeeds once the allocator stops failing. */
START_TEST(rvq_allocation_failures)
{
    cache_shape s = {2, 2, 8, 8};
    size_t n = 80, re = row_elems(&s);
    fkvf_rope rope = {1, 8, 10000};
    float *rows = gen_rows(&s, n, 10, 1200, &rope, 0);
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = s.L;
    p.n_kv_heads = s.H;
    p.key_dim = s.Dk;
    p.value_dim = s.Dv;
    p.k = 16;
    p.k_stages = 2;
    p.v_stages = 1;
    p.key_rope = &rope;
    tu_le_f32(rows, n * re); /* the library's little-endian rows */
    fkvf_rows blk = {rows, n, FKVF_DTYPE_F32, 0};
    size_t nc = (size_t)s.L * s.H * 3, tsz = 0;
    uint16_t *codes = tu_xcalloc(n * nc, 2);
    float *out = tu_xcalloc(n * re, 4);
    uint8_t *tables = NULL;
    fkvf_codebook_shape sh;
    for (int op = 0; op < 7; op++) {
        int done = 0;
        for (long k = 0; !done; k++) {
            ck_assert_int_lt(k, 1000);
            /* k allocations succeed, then every one fails */
            tu_alloc fa = {.fail_at = k + 1, .fail_after = 1};
            fkvf_allocator al = tu_alloc_hook(&fa);
            tu_alloc fb = {0};
            fkvf_allocator ok = tu_alloc_hook(&fb);
            fkvf_rvq *q = NULL, *base = NULL;
            int rc;
            /* a codebook made with an allocator that fails later */
            if (op >= 2) {
                OK(fkvf_rvq_from_tables(&base, &sh, 0, tables, tsz, &ok));
                base->alloc = al; /* its later allocations go through the failing one */
            }
            switch (op) {
            case 0: {
                fkvf_rvq_params pp = p;
                pp.pooled = 0;
                rc = fkvf_rvq_train(&q, &pp, &blk, 1, &al);
                break;
            }
            case 1:
                rc = fkvf_rvq_from_tables(&q, &sh, 0, tables, tsz, &al);
                break;
            case 2:
                rc = fkvf_rvq_subset(&q, base, 1, 1);
                break;
            case 3:
                rc = fkvf_rvq_encode(base, &blk, &rope, 0, codes, nc, 1);
                break;
            case 4:
                rc = fkvf_rvq_encode(base, &blk, &rope, 3, codes, nc, 1);
                break;
            case 5:
                rc = fkvf_rvq_decode(base, codes, nc, 1, n, 0, &rope, FKVF_DTYPE_F16, out,
                                     n * re * 2);
                break;
            default:
                rc = fkvf_rvq_decode(base, codes, nc, 1, n, 0, NULL, FKVF_DTYPE_F32, out,
                                     n * re * 4);
                break;
            }
            EXPECTF(rc == FKVF_OK || rc == FKVF_E_NOMEM, "op %d k %ld: %s", op, k,
                    fkvf_error_name(rc));
            if (rc == FKVF_E_NOMEM)
                EXPECTF(q == NULL, "op %d k %ld: handle on failure", op, k);
            if (op == 0 && rc == FKVF_OK) {
                fkvf_rvq_shape(q, &sh, NULL);
                tsz = fkvf_rvq_tables_size(q);
                tables = tu_xcalloc(tsz, 1);
                OK(fkvf_rvq_tables(q, tables, tsz));
            }
            fkvf_rvq_free(q);
            if (base) {
                base->alloc = ok;
                fkvf_rvq_free(base);
            }
            EXPECTF(fa.live == 0, "op %d k %ld: %ld allocations leaked", op, k, fa.live);
            EXPECTF(fb.live == 0, "op %d k %ld: %ld base allocations leaked", op, k, fb.live);
            done = rc == FKVF_OK;
            if (!done)
                EXPECTF(fa.failed, "op %d k %ld: NOMEM without a failed allocation", op,
                        k);
        }
    }
    free(tables);
    free(codes);
    free(out);
    free(rows);
}
END_TEST

/* The shape of the automatic-k and pays rules' tests: L = H = 2, Dk = Dv = 8,
 * K x4 V x2 stages, f16 tables, k = 16. */
static fkvf_codebook_shape rule_shape(void)
{
    fkvf_codebook_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.n_layers = 2;
    sh.n_heads = 2;
    sh.key_dim = 8;
    sh.value_dim = 8;
    sh.k_stages = 4;
    sh.v_stages = 2;
    sh.dtype = FKVF_DTYPE_F16;
    sh.k = 16;
    return sh;
}

/* The automatic k (docs/codebooks.md): L = H = 2, Dk = Dv = 8, K x4 V x2,
 * f16. The codebook is 64 + 2*2*k*(4*8 + 2*8)*2 = 64 + 384k bytes and n rows
 * are 128n fp16 bytes, so k qualifies when 4 (64 + 384k) <= 128n, i.e.
 * n >= 2 + 12k, and 4k <= n: k = 16 from n = 194, 32 from 386, 64 from 770,
 * 128 from 1538, 256 from 3074 on. */
START_TEST(codebook_auto_k_rule)
{
    fkvf_codebook_shape sh = rule_shape();
    ck_assert_uint_eq(fkvf_codebook_size(&sh), 64 + 384 * 16);
    sh.k = 999; /* ignored */
    ck_assert_uint_eq(fkvf_codebook_auto_k(&sh, 2, 0), 0);
    ck_assert_uint_eq(fkvf_codebook_auto_k(&sh, 2, 193), 0);
    ck_assert_uint_eq(fkvf_codebook_auto_k(&sh, 2, 194), 16);
    ck_assert_uint_eq(fkvf_codebook_auto_k(&sh, 2, 385), 16);
    ck_assert_uint_eq(fkvf_codebook_auto_k(&sh, 2, 386), 32);
    ck_assert_uint_eq(fkvf_codebook_auto_k(&sh, 2, 770), 64);
    ck_assert_uint_eq(fkvf_codebook_auto_k(&sh, 2, 1537), 64);
    ck_assert_uint_eq(fkvf_codebook_auto_k(&sh, 2, 1538), 128);
    ck_assert_uint_eq(fkvf_codebook_auto_k(&sh, 2, 3074), 256);
    ck_assert_uint_eq(fkvf_codebook_auto_k(&sh, 2, UINT64_MAX), 256); /* capped, no overflow */
    /* pooled: one table set per layer, 64 + 2*k*48*2 = 64 + 192k bytes,
     * the rows still 128n: n >= 2 + 6k and n >= 4k, so k = 16 from 98 */
    sh.pooled = 1;
    sh.n_heads = 1;
    ck_assert_uint_eq(fkvf_codebook_auto_k(&sh, 2, 97), 0);
    ck_assert_uint_eq(fkvf_codebook_auto_k(&sh, 2, 98), 16);
    /* an invalid shape (no layers): no k */
    sh.n_layers = 0;
    ck_assert_uint_eq(fkvf_codebook_auto_k(&sh, 2, 100000), 0);
    ck_assert_uint_eq(fkvf_codebook_auto_k(NULL, 2, 100000), 0);
}
END_TEST

/* Whether an embedded codebook pays (the all-exact rule of fkvf pack): the
 * shape of codebook_auto_k_rule with k = 16 is 64 + 384 * 16 = 6208 bytes;
 * the indices of a row are 2 layers * 2 heads * 6 stages * 4 bits (k - 1 =
 * 15) / 8 = 12 bytes. f16 rows are 2 * 2 * 16 * 2 = 128 bytes: it pays when
 * 6208 + 12n < 128n, i.e. n > 53.5; f32 rows (256 bytes) when 6208 + 12n <
 * 256n, n > 25.4. k = 256: 64 + 384 * 256 = 98368 bytes, 8-bit indices, 24
 * bytes a row: 98368 + 24n < 128n from n = 946 (104n > 98368 at 945.8). */
START_TEST(codebook_pays_rule)
{
    fkvf_codebook_shape sh = rule_shape();
    double idx = -1;
    ck_assert_int_eq(fkvf_codebook_pays(&sh, 2, 53, 128, &idx), 0);
    ck_assert(idx == 53.0 * 12);
    ck_assert_int_eq(fkvf_codebook_pays(&sh, 2, 54, 128, &idx), 1);
    ck_assert(idx == 54.0 * 12);
    ck_assert_int_eq(fkvf_codebook_pays(&sh, 2, 25, 256, NULL), 0);
    ck_assert_int_eq(fkvf_codebook_pays(&sh, 2, 26, 256, NULL), 1);
    ck_assert_int_eq(fkvf_codebook_pays(&sh, 2, 0, 128, &idx), 0); /* no rows: never */
    ck_assert(idx == 0.0);
    sh.k = 256;
    ck_assert_int_eq(fkvf_codebook_pays(&sh, 2, 945, 128, NULL), 0);
    ck_assert_int_eq(fkvf_codebook_pays(&sh, 2, 946, 128, NULL), 1);
    /* an invalid shape (k not a power of two), NULL: no */
    sh.k = 17;
    idx = -1;
    ck_assert_int_eq(fkvf_codebook_pays(&sh, 2, 100000, 128, &idx), 0);
    ck_assert(idx == 0.0);
    ck_assert_int_eq(fkvf_codebook_pays(NULL, 2, 100000, 128, &idx), 0);
}
END_TEST

/* A codebook file (2 layers, 1 head, key_dim 8, k 16, one key stage, zero
 * tables) with the train.* entries given (NULL / 0 / -1: left out; dims_u64
 * 0: train.rope_dims as the f64 9.5, of the wrong type), in buf. */
static fkvf_reader *cb_with_train(tu_buf *buf, const char *keys, double theta, int64_t dims,
                                  const char *layout)
{
    fkvf_codebook_shape sh = {2, 1, 8, 8, 16, 1, 0, FKVF_DTYPE_F32, 0, NULL};
    size_t tsz = (size_t)(fkvf_codebook_size(&sh) - 64);
    void *t = tu_xcalloc(tsz, 1);
    fkvf_sink sink = tu_buf_sink(buf);
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    wo.sync = FKVF_SYNC_NONE;
    fkvf_writer *w;
    OK(fkvf_writer_create_sink(&w, &sink, &wo, NULL));
    if (keys)
        OK(fkvf_writer_meta_utf8(w, "train.keys", keys));
    if (theta != 0)
        OK(fkvf_writer_meta_f64(w, "train.rope_theta", theta));
    if (dims > 0)
        OK(fkvf_writer_meta_u64(w, "train.rope_dims", (uint64_t)dims));
    else if (dims == 0)
        OK(fkvf_writer_meta_f64(w, "train.rope_dims", 9.5));
    if (layout)
        OK(fkvf_writer_meta_utf8(w, "train.rope_layout", layout));
    OK(fkvf_writer_add_codebooks(w, &sh, t, tsz, 0));
    OK(fkvf_writer_finish(w));
    fkvf_writer_free(w);
    free(t);
    fkvf_reader *r;
    OK(fkvf_reader_open_memory(&r, buf->data, buf->size, FKVF_OPEN_STRICT, NULL));
    return r;
}

/* The defaults of a caller that gave nothing: pre-RoPE, theta 10000, every
 * dim, interleaved. */
static fkvf_key_settings keys_default(void)
{
    fkvf_key_settings k;
    memset(&k, 0, sizeof k);
    k.pre_rope = 1;
    k.layout = 1;
    k.theta = 10000.0;
    return k;
}

/* fkvf_codebook_key_settings: settings not given are taken from the
 * train.* entries, given ones that contradict them clash (keys always,
 * RoPE settings only for un-rotated keys), invalid entries are ignored. */
START_TEST(codebook_key_settings_rule)
{
    tu_buf b1 = {0}, b2 = {0}, b3 = {0}, b4 = {0};
    fkvf_reader *hs = cb_with_train(&b1, "pre-rope", 500000.0, 4, "half-split");
    fkvf_reader *asis = cb_with_train(&b2, "as-is", 500000.0, 4, "half-split");
    fkvf_reader *bad = cb_with_train(&b3, "before", -1.0, 10, "zigzag"); /* all invalid */
    fkvf_reader *none = cb_with_train(&b4, NULL, 0, 0, NULL); /* rope_dims an f64 */
    fkvf_key_clash c;
    /* nothing given: everything taken */
    fkvf_key_settings k = keys_default();
    OK(fkvf_codebook_key_settings(hs, 8, &k, &c));
    ck_assert_ptr_null(c.setting);
    ck_assert_uint_eq(k.pre_rope, 1);
    ck_assert(k.theta == 500000.0);
    ck_assert_uint_eq(k.dims, 4);
    ck_assert_uint_eq(k.layout, 2);
    ck_assert_uint_eq(k.layout_taken, 1);
    k = keys_default();
    OK(fkvf_codebook_key_settings(asis, 8, &k, &c));
    ck_assert_uint_eq(k.pre_rope, 0);
    /* given keys against the training: a clash, unless the keys are not rotated */
    k = keys_default();
    k.keys_set = 1;
    ck_assert_int_eq(fkvf_codebook_key_settings(asis, 8, &k, &c), FKVF_E_CODEBOOK);
    ck_assert_str_eq(c.setting, "keys");
    ck_assert_str_eq(c.trained, "as-is");
    ck_assert_str_eq(c.given, "pre-rope");
    ck_assert(k.theta == 500000.0); /* not given: taken all the same */
    k.no_rope = 1;
    OK(fkvf_codebook_key_settings(asis, 8, &k, &c));
    /* given RoPE settings: a clash with un-rotated keys only */
    k = keys_default();
    k.theta_set = 1;
    ck_assert_int_eq(fkvf_codebook_key_settings(hs, 8, &k, &c), FKVF_E_CODEBOOK);
    ck_assert_str_eq(c.setting, "rope_theta");
    ck_assert_str_eq(c.trained, "500000");
    ck_assert_str_eq(c.given, "10000");
    ck_assert_uint_eq(k.dims, 4); /* later settings still taken */
    k = keys_default();
    k.theta_set = 1;
    OK(fkvf_codebook_key_settings(asis, 8, &k, &c)); /* as-is keys: theta does not matter */
    ck_assert(k.theta == 10000.0);
    k = keys_default();
    k.dims_set = 1; /* dims 0: key_dim, 8, against 4 */
    ck_assert_int_eq(fkvf_codebook_key_settings(hs, 8, &k, &c), FKVF_E_CODEBOOK);
    ck_assert_str_eq(c.setting, "rope_dims");
    ck_assert_str_eq(c.trained, "4");
    ck_assert_str_eq(c.given, "8");
    k = keys_default();
    k.dims_set = 1;
    k.dims = 4;
    k.layout_set = 1;
    ck_assert_int_eq(fkvf_codebook_key_settings(hs, 8, &k, &c), FKVF_E_CODEBOOK);
    ck_assert_str_eq(c.setting, "rope_layout");
    ck_assert_str_eq(c.trained, "half-split");
    ck_assert_str_eq(c.given, "interleaved");
    ck_assert_uint_eq(k.layout_taken, 0);
    /* the first clash wins: keys before theta */
    k = keys_default();
    k.pre_rope = 0;
    k.keys_set = k.theta_set = 1;
    ck_assert_int_eq(fkvf_codebook_key_settings(hs, 8, &k, &c), FKVF_E_CODEBOOK);
    ck_assert_str_eq(c.setting, "keys");
    /* dims above key_dim (4 > 2), invalid or missing entries: ignored */
    k = keys_default();
    OK(fkvf_codebook_key_settings(hs, 2, &k, &c));
    ck_assert_uint_eq(k.dims, 0);
    fkvf_key_settings k0 = keys_default();
    k = k0;
    k.keys_set = k.theta_set = k.dims_set = k.layout_set = 1;
    k0 = k;
    OK(fkvf_codebook_key_settings(bad, 8, &k, &c));
    ck_assert(!memcmp(&k, &k0, sizeof k));
    OK(fkvf_codebook_key_settings(none, 8, &k, &c));
    ck_assert(!memcmp(&k, &k0, sizeof k));
    ck_assert_int_eq(fkvf_codebook_key_settings(NULL, 8, &k, &c), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_codebook_key_settings(hs, 8, NULL, &c), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_codebook_key_settings(hs, 8, &k, NULL), FKVF_E_INVALID_ARG);
    fkvf_reader_free(hs);
    fkvf_reader_free(asis);
    fkvf_reader_free(bad);
    fkvf_reader_free(none);
    tu_buf_free(&b1);
    tu_buf_free(&b2);
    tu_buf_free(&b3);
    tu_buf_free(&b4);
}
END_TEST

/* A codebook loaded for decoding only decodes exactly as the full handle
 * (the same tables), refuses to encode, and its subsets stay decode-only. */
START_TEST(rvq_decode_only_handle)
{
    tu_rng r = {77};
    fkvf_codebook_shape sh = {2, 3, 8, 6, 16, 3, 2, FKVF_DTYPE_F32, 0, NULL};
    size_t nf = (size_t)2 * 3 * 16 * (3 * 8 + 2 * 6);
    float *tab = tu_xcalloc(nf, sizeof(float));
    for (size_t i = 0; i < nf; i++)
        tab[i] = (float)((double)tu_below(&r, 20001) / 1000.0 - 10.0);
    tu_le_f32(tab, nf); /* tables are little-endian bytes */
    fkvf_rvq *full, *dec;
    OK(fkvf_rvq_from_tables(&full, &sh, 0, tab, nf * sizeof(float), NULL));
    OK(fkvf_rvq_from_tables_decode(&dec, &sh, 0, tab, nf * sizeof(float), NULL));
    const size_t nc = fkvf_rvq_codes_per_position(full), n = 37;
    ck_assert_uint_eq(fkvf_rvq_codes_per_position(dec), nc);
    uint16_t *codes = tu_xcalloc(n * nc, sizeof(uint16_t));
    for (size_t i = 0; i < n * nc; i++)
        codes[i] = (uint16_t)tu_below(&r, 16);
    const size_t rb = (size_t)2 * 3 * (8 + 6) * 4;
    uint8_t *a = tu_xcalloc(n, rb), *b = tu_xcalloc(n, rb);
    fkvf_rope rope = {2, 6, 10000.0};
    for (int rp = 0; rp < 2; rp++)
        for (int dt = FKVF_DTYPE_F16; dt <= FKVF_DTYPE_F32; dt++) {
            memset(a, 0xAB, n * rb);
            memset(b, 0xCD, n * rb);
            OK(fkvf_rvq_decode(full, codes, nc, 1, n, 5, rp ? &rope : NULL, (fkvf_dtype)dt, a,
                               n * rb));
            OK(fkvf_rvq_decode(dec, codes, nc, 1, n, 5, rp ? &rope : NULL, (fkvf_dtype)dt, b,
                               n * rb));
            /* f16 and bf16 rows are half as long as the f32 buffer */
            ck_assert(memcmp(a, b, n * rb / (dt == FKVF_DTYPE_F32 ? 1 : 2)) == 0);
        }
    for (unsigned st = 0; st < 3; st++)
        ck_assert(memcmp(fkvf_rvq_centroids(full, 1, 2, 0, st),
                         fkvf_rvq_centroids(dec, 1, 2, 0, st), 16 * 8 * sizeof(float)) == 0);
    /* encoding needs the search layout */
    float *rows = tu_xcalloc(n, rb);
    fkvf_rows in = {rows, n, FKVF_DTYPE_F32, 0};
    OK(fkvf_rvq_encode(full, &in, NULL, 0, codes, nc, 1));
    ck_assert_int_eq(fkvf_rvq_encode(dec, &in, NULL, 0, codes, nc, 1), FKVF_E_STATE);
    fkvf_rvq *sub;
    OK(fkvf_rvq_subset(&sub, dec, 2, 1));
    ck_assert_int_eq(fkvf_rvq_encode(sub, &in, NULL, 0, codes, fkvf_rvq_codes_per_position(sub),
                                     1),
                     FKVF_E_STATE);
    fkvf_rvq_free(sub);
    fkvf_rvq_free(full);
    fkvf_rvq_free(dec);
    free(rows);
    free(a);
    free(b);
    free(codes);
    free(tab);
}
END_TEST

static Suite *quant_suite(void)
{
    Suite *su = suite_create("quant");
    TCase *tc = tcase_create("convert");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, f16_hand_values);
    tcase_add_test(tc, bf16_hand_values);
    tcase_add_test(tc, f16_every_pattern);
    tcase_add_test(tc, f32_to_half_against_reference);
    tcase_add_test(tc, convert_args);
    suite_add_tcase(su, tc);

    TCase *tr = tcase_create("rope");
    tcase_add_test(tr, rope_hand_example);
    tcase_add_test(tr, rope_roundtrip);
    tcase_add_test(tr, rope_table_same_bits);
    tcase_add_test(tr, rope_invalid);
    suite_add_tcase(su, tr);

    TCase *tk = tcase_create("search");
    tcase_set_timeout(tk, 120);
    tcase_add_test(tk, search_picks_true_nearest);
    tcase_add_test(tk, seed_update_kernels_agree);
    tcase_add_test(tk, table_norms16_matches_binary32);
    tcase_add_test(tk, kmeans_finds_separated_clusters);
    tcase_add_test(tk, kmeans_repairs_empty_clusters);
    suite_add_tcase(su, tk);

    TCase *tq = tcase_create("rvq");
    tcase_set_timeout(tq, 120);
    tcase_add_test(tq, rvq_error_falls_with_stages);
    tcase_add_test(tq, rvq_encode_is_exact_greedy);
    tcase_add_test(tq, rvq_decode_matches_reference);
    tcase_add_test(tq, rvq_decode_kernels_match_plain_reference);
    tcase_add_test(tq, rvq_decode_f16_tables_match_portable);
    tcase_add_test(tq, rvq_decode_to_matches_rows);
    tcase_add_test(tq, train_threads_within_scratch_budget);
    tcase_add_test(tq, rvq_borrow_f16_checks);
    tcase_add_test(tq, rvq_beam_not_worse_than_greedy);
    tcase_add_test(tq, rvq_deterministic);
    tcase_add_test(tq, rvq_shapes_and_writer);
    tcase_add_test(tq, rvq_keys_before_rope);
    tcase_add_test(tq, rvq_input_dtypes);
    tcase_add_test(tq, rvq_invalid_arguments);
    tcase_add_test(tq, rvq_allocation_failures);
    tcase_add_test(tq, rvq_decode_only_handle);
    tcase_add_test(tq, codebook_auto_k_rule);
    tcase_add_test(tq, codebook_pays_rule);
    tcase_add_test(tq, codebook_key_settings_rule);
    suite_add_tcase(su, tq);
    return su;
}

int main(void)
{
    return tu_run_suite(quant_suite());
}
