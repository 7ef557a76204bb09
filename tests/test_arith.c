/* The arithmetic restore and random access share (common/rope.h, common/half.h,
 * common/stage_sum.h, common/cpu.h): the stage sum's scalar, 4-lane and AVX
 * paths agree, the RoPE rotate kernel's scalar and AVX paths agree bit for
 * bit with each other and with fkvf_rope_apply_f32, the F16C store agrees with
 * the scalar f32 -> f16 conversion on every value decoding can produce, and on
 * the sample archive (keys archived before RoPE) fkvf_reader_read, for whole
 * selections, single positions (point access) and parts of them, gives
 * exactly the bytes of fkvf_reader_restore in every output dtype and both
 * layouts. tests/test_access.c does the same on synthetic archives of many
 * shapes; tests/test_quant.c compares the decoder's kernels with its portable
 * path. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "fkvf.h"
#include "half.h"
#include "rope.h"
#include "stage_sum.h"
#include "testutil.h"

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

START_TEST(cpu_features_consistent)
{
    /* F16C and AVX2 are only reported where AVX runs */
    ck_assert(!fkvf_cpu_f16c() || fkvf_cpu_avx());
    ck_assert(!fkvf_cpu_avx2() || fkvf_cpu_avx());
    /* asked twice, the same answers (the F16C answer is cached) */
    ck_assert_int_eq(fkvf_cpu_f16c(), fkvf_cpu_f16c());
    ck_assert_int_eq(fkvf_cpu_avx(), fkvf_cpu_avx());
}
END_TEST

/* ---- the stage sum: every path the same additions ---------------------------- */

START_TEST(stage_sum_paths_agree)
{
    enum { DMAX = 133, NS = 16 };
    static float tab[NS][DMAX];
    tu_rng g = {13};
    for (int s = 0; s < NS; s++)
        for (int d = 0; d < DMAX; d++) {
            double m = (double)(tu_next(&g) >> 11) / 9007199254740992.0;
            float x = (float)ldexp(m, (int)tu_below(&g, 30) - 10);
            if (tu_below(&g, 50) == 0)
                x = 3.0e38f; /* sums overflow to infinity, +inf - inf gives NaN */
            tab[s][d] = tu_below(&g, 2) ? -x : x;
        }
    const float *rows[NS];
    float a[DMAX], b[DMAX];
    for (unsigned ns = 0; ns <= NS; ns++)
        for (uint32_t dim = 1; dim <= DMAX; dim += ns % 2 ? 1 : 7) {
            for (unsigned s = 0; s < ns; s++)
                rows[s] = tab[(s * 5 + dim) % NS];
            fkvf_stage_sum(a, rows, ns, dim, 0);
            for (uint32_t d = 0; d < dim; d++)
                EXPECTF(f2u(a[d]) == f2u(fkvf_stage_sum1(rows, ns, d)),
                        "ns %u dim %u component %u: vector and scalar sums differ", ns, dim, d);
            if (!fkvf_cpu_avx())
                continue;
            fkvf_stage_sum(b, rows, ns, dim, 1);
            EXPECTF(memcmp(a, b, dim * sizeof(float)) == 0, "ns %u dim %u: AVX sum differs",
                    ns, dim);
        }
}
END_TEST

/* ---- RoPE: one kernel, its scalar and AVX paths, fkvf_rope_apply_f32 ------- */

/* a value as decoding produces them: finite sums of every magnitude, and
 * (rarely) infinities from overflowing sums; never a NaN input */
static float key_value(tu_rng *g)
{
    uint32_t kind = tu_below(g, 64);
    if (kind == 0)
        return tu_below(g, 2) ? INFINITY : -INFINITY;
    if (kind == 1)
        return tu_below(g, 2) ? 3.0e38f : -3.0e38f;
    if (kind == 2)
        return u2f(tu_below(g, 0x800000u)); /* subnormal */
    double m = (double)(tu_next(g) >> 11) / 9007199254740992.0;
    float x = (float)ldexp(m, (int)tu_below(g, 40) - 20);
    return tu_below(g, 2) ? -x : x;
}

START_TEST(rope_kernel_paths_agree)
{
    static const uint32_t dims[] = {2, 4, 6, 8, 10, 12, 14, 16, 18, 24, 30, 32, 64, 126, 128};
    static const uint64_t ts[] = {0, 1, 2, 7, 255, 1000, 123457, (1ull << 40) + 3};
    const int avx = fkvf_cpu_avx();
    tu_rng g = {2026};
    enum { EXTRA = 3, DMAX = 128 + EXTRA };
    float v[DMAX], a[DMAX], b[DMAX], c[DMAX];
    double freqs[64], cs[128];
    size_t compared_avx = 0;
    for (uint8_t layout = 1; layout <= 2; layout++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
            for (int th = 0; th < 2; th++) {
                const fkvf_rope r = {layout, dims[di], th ? 500000.0 : 10000.0};
                const size_t D = dims[di] + EXTRA;
                ck_assert(fkvf_rope_valid(&r, (uint32_t)D));
                fkvf_rope_freqs(&r, freqs);
                for (size_t ti = 0; ti < sizeof ts / sizeof ts[0]; ti++) {
                    fkvf_rope_angles(&r, freqs, ts[ti], cs);
                    for (int inverse = 0; inverse < 2; inverse++)
                        for (int rep = 0; rep < 4; rep++) {
                            for (size_t d = 0; d < D; d++)
                                v[d] = key_value(&g);
                            memcpy(a, v, sizeof v);
                            memcpy(b, v, sizeof v);
                            memcpy(c, v, sizeof v);
                            fkvf_rope_rotate_f32(&r, cs, inverse, a, 0);
                            ck_assert_int_eq(fkvf_rope_apply_f32(&r, ts[ti], inverse, c, D),
                                             FKVF_OK);
                            EXPECTF(memcmp(a, c, D * sizeof(float)) == 0,
                                    "layout %u dims %u t %llu inverse %d: kernel != "
                                    "fkvf_rope_apply_f32",
                                    layout, r.rope_dims, (unsigned long long)ts[ti], inverse);
                            /* the components past rope_dims are untouched */
                            EXPECT(memcmp(a + r.rope_dims, v + r.rope_dims,
                                          EXTRA * sizeof(float)) == 0);
                            if (!avx)
                                continue;
                            fkvf_rope_rotate_f32(&r, cs, inverse, b, 1);
                            for (size_t d = 0; d < D; d++)
                                EXPECTF(f2u(a[d]) == f2u(b[d]),
                                        "layout %u dims %u t %llu inverse %d component %zu: "
                                        "scalar %a (0x%08x), AVX %a (0x%08x)",
                                        layout, r.rope_dims, (unsigned long long)ts[ti],
                                        inverse, d, (double)a[d], f2u(a[d]), (double)b[d],
                                        f2u(b[d]));
                            compared_avx++;
                        }
                }
            }
    if (avx)
        ck_assert_uint_gt(compared_avx, 0);
    else
        fprintf(stderr, "test_arith: no AVX on this CPU; the AVX rotation was not compared\n");
}
END_TEST

/* ---- the F16C store ------------------------------------------------------------ */

#ifdef FKVF_HAVE_F16C
/* fkvf_f16c_put8 of the 8 values at src */
__attribute__((target("avx,f16c"))) static void put8(const float *src, uint8_t *dst)
{
    fkvf_f16c_put8(_mm256_loadu_ps(src), dst);
}
#endif

START_TEST(f16c_store_matches_scalar)
{
#ifdef FKVF_HAVE_F16C
    if (!fkvf_cpu_f16c()) {
        fprintf(stderr, "test_arith: no F16C on this CPU; the F16C store was not compared\n");
        return;
    }
    enum { N = 65536 * 2 + 4096 };
    float *f = malloc(N * sizeof(float));
    uint8_t *got = malloc(2 * N + 1), *want = malloc(2 * N);
    ck_assert(f && got && want);
    size_t n = 0;
    tu_rng g = {16};
    /* every f16 value (quiet NaNs included), and the midpoints between
     * neighbours with their neighbours (the rounding ties) */
    for (uint32_t h = 0; h < 65536; h++) {
        float x = fkvf_f16_to_f32((uint16_t)h);
        if (isnan(x) && !(f2u(x) & 0x400000u))
            x = u2f(f2u(x) | 0x400000u); /* signaling: see common/half.h */
        f[n++] = x;
        if ((h & 0x7C00u) != 0x7C00u && (h & 0x7FFFu) != 0x7BFFu) {
            float mid = (float)(((double)fkvf_f16_to_f32((uint16_t)h) +
                                 (double)fkvf_f16_to_f32((uint16_t)(h + 1))) /
                                2);
            f[n++] = tu_below(&g, 3) == 0 ? nextafterf(mid, 0) : mid;
        }
    }
    while (n < N) { /* any binary32 pattern but a signaling NaN */
        float x = u2f((uint32_t)tu_next(&g));
        if (isnan(x))
            x = u2f(f2u(x) | 0x400000u);
        f[n++] = x;
    }
    for (size_t i = 0; i < N; i++) {
        uint16_t h = fkvf_f32_to_f16(f[i]);
        memcpy(want + 2 * i, &h, 2);
    }
    /* at an odd address, whole and in every tail length */
    fkvf_f16c_store(got + 1, f, N);
    EXPECT(memcmp(got + 1, want, 2 * (size_t)N) == 0);
    for (size_t len = 0; len <= 40; len++)
        for (size_t off = 0; off + len <= N; off += 4099) {
            memset(got, 0xA5, 2 * len + 1);
            fkvf_f16c_store(got, f + off, len);
            EXPECTF(memcmp(got, want + 2 * off, 2 * len) == 0, "length %zu at %zu", len, off);
            EXPECTF(got[2 * len] == 0xA5, "length %zu: wrote past the end", len);
        }
    for (size_t i = 0; i + 8 <= N; i += 8) {
        uint8_t h8[16];
        put8(f + i, h8);
        EXPECTF(memcmp(h8, want + 2 * i, 16) == 0, "put8 at %zu", i);
    }
    free(f);
    free(got);
    free(want);
#else
    fprintf(stderr, "test_arith: no F16C store in this build\n");
#endif
}
END_TEST

/* ---- the sample archive: random access against restore ---------------------- */

typedef struct sample {
    uint8_t *file;
    size_t size;
    fkvf_reader *r;
    fkvf_desc d;
    fkvf_archive_info info;
} sample;

static void sample_open(sample *s)
{
    const char *src = getenv("FKVF_SRCDIR");
    ck_assert_ptr_nonnull(src);
    char path[4096];
    int pn = snprintf(path, sizeof path, "%s/testdata/sample.fkvf", src);
    ck_assert(pn > 0 && (size_t)pn < sizeof path);
    s->file = tu_slurp(path, &s->size);
    ck_assert_uint_gt(s->size, 0);
    ck_assert_int_eq(fkvf_reader_open_memory(&s->r, s->file, s->size, 0, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_desc(s->r, &s->d), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_info(s->r, &s->info), FKVF_OK);
    /* what this test is about: archived keys stored before RoPE */
    ck_assert_uint_eq(s->d.key_storage, 1);
    ck_assert_uint_gt(s->d.rope_dims, 0);
    ck_assert_uint_gt(s->info.n_archived, 0);
}

static void sample_close(sample *s)
{
    fkvf_reader_free(s->r);
    free(s->file);
}

/* The elements of req, in its layout, picked from restored rows (dtype of
 * element size es, rb bytes per row). */
static void pick(const sample *s, const uint8_t *rows, size_t rb, size_t es,
                 const fkvf_read_request *q, uint8_t *out)
{
    const size_t H = s->d.n_kv_heads, dk = s->d.key_dim, dv = s->d.value_dim;
    const uint32_t nl = q->layer_count ? q->layer_count : s->d.n_layers - q->layer_first;
    const uint32_t nh = q->head_count ? q->head_count : s->d.n_kv_heads - q->head_first;
    const unsigned parts = q->parts ? q->parts : FKVF_PART_KEYS | FKVF_PART_VALUES;
    size_t o = 0;
#define SRC(pos, l, h, kv)                                                                  \
    (rows + (pos) * rb +                                                                    \
     ((size_t)(l) * H * (dk + dv) + ((kv) ? H * dk + (size_t)(h) * dv : (size_t)(h) * dk)) * es)
#define PUT(pos, l, h, kv)                                                                  \
    do {                                                                                    \
        size_t n_ = ((kv) ? dv : dk) * es;                                                  \
        memcpy(out + o, SRC(pos, l, h, kv), n_);                                            \
        o += n_;                                                                            \
    } while (0)
    if (q->layout == FKVF_LAYOUT_ROWS) {
        for (uint64_t i = 0; i < q->count; i++)
            for (uint32_t li = 0; li < nl; li++)
                for (unsigned kv = 0; kv < 2; kv++)
                    if (parts & (kv ? FKVF_PART_VALUES : FKVF_PART_KEYS))
                        for (uint32_t hi = 0; hi < nh; hi++)
                            PUT(q->first + i, q->layer_first + li, q->head_first + hi, kv);
    } else {
        for (uint32_t li = 0; li < nl; li++)
            for (unsigned kv = 0; kv < 2; kv++)
                if (parts & (kv ? FKVF_PART_VALUES : FKVF_PART_KEYS))
                    for (uint32_t hi = 0; hi < nh; hi++)
                        for (uint64_t i = 0; i < q->count; i++)
                            PUT(q->first + i, q->layer_first + li, q->head_first + hi, kv);
    }
#undef PUT
#undef SRC
}

/* fkvf_reader_read(q) equals the same elements of the restored rows */
static void check_read(sample *s, const uint8_t *rows, size_t rb, size_t es,
                       const fkvf_read_request *q)
{
    size_t n = 0;
    ck_assert_int_eq(fkvf_reader_read_size(s->r, q, &n), FKVF_OK);
    uint8_t *got = malloc(n + 1), *want = malloc(n + 1);
    ck_assert(got && want);
    memset(got, 0xA5, n + 1);
    pick(s, rows, rb, es, q, want);
    EXPECTF(fkvf_reader_read(s->r, q, got, n) == FKVF_OK, "%s", fkvf_reader_message(s->r));
    EXPECTF(memcmp(got, want, n) == 0,
            "positions [%llu, +%llu) layers %u+%u heads %u+%u parts %u dtype %d layout %d: "
            "random access differs from restore",
            (unsigned long long)q->first, (unsigned long long)q->count, q->layer_first,
            q->layer_count, q->head_first, q->head_count, q->parts, (int)q->dtype,
            (int)q->layout);
    EXPECT(got[n] == 0xA5);
    free(got);
    free(want);
}

START_TEST(sample_read_matches_restore)
{
    static const fkvf_dtype dts[] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16, FKVF_DTYPE_F32};
    const fkvf_dtype dt = dts[_i];
    sample s;
    sample_open(&s);
    const uint64_t N = s.info.n_positions, S = s.d.n_sinks;
    size_t rb;
    ck_assert_int_eq(fkvf_reader_row_bytes(s.r, dt, &rb), FKVF_OK);
    const size_t es = dt == FKVF_DTYPE_F32 ? 4 : 2;
    uint8_t *rows = malloc(N * rb);
    ck_assert_ptr_nonnull(rows);
    ck_assert_int_eq(fkvf_reader_restore(s.r, 0, N, dt, rows, N * rb), FKVF_OK);
    const uint32_t L = s.d.n_layers, H = s.d.n_kv_heads;
    for (int layout = 0; layout < 2; layout++) {
        const fkvf_layout lo = layout ? FKVF_LAYOUT_HEADS : FKVF_LAYOUT_ROWS;
        /* everything */
        fkvf_read_request q = {0, N, 0, 0, 0, 0, 0, dt, lo};
        check_read(&s, rows, rb, es, &q);
        /* point access: each position alone, all of it and its keys only */
        for (uint64_t t = 0; t < N; t++) {
            fkvf_read_request p = {t, 1, 0, 0, 0, 0, 0, dt, lo};
            check_read(&s, rows, rb, es, &p);
            p.parts = FKVF_PART_KEYS;
            p.layer_first = (uint32_t)(t % L);
            p.layer_count = 1;
            p.head_first = (uint32_t)(t % H);
            p.head_count = 1;
            check_read(&s, rows, rb, es, &p);
        }
        /* the archived positions and their edges, parts of layers and heads */
        fkvf_read_request a = {S ? S - 1 : 0, s.info.n_archived + 2, 1, L - 1, 1, H - 1,
                               FKVF_PART_KEYS, dt, lo};
        check_read(&s, rows, rb, es, &a);
        a.parts = FKVF_PART_VALUES;
        check_read(&s, rows, rb, es, &a);
        a.first = S + 3;
        a.count = 5;
        a.parts = 0;
        a.layer_first = L / 2;
        a.layer_count = 1;
        check_read(&s, rows, rb, es, &a);
    }
    free(rows);
    sample_close(&s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("arith");
    TCase *tc = tcase_create("arith");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, cpu_features_consistent);
    tcase_add_test(tc, stage_sum_paths_agree);
    tcase_add_test(tc, rope_kernel_paths_agree);
    tcase_add_test(tc, f16c_store_matches_scalar);
    tcase_add_loop_test(tc, sample_read_matches_restore, 0, 3);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
