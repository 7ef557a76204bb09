/* fkvf_reader_read (random access): every selection of positions, layers,
 * heads, parts, layouts and output dtypes is bit-identical to the same
 * elements of fkvf_reader_restore; archives of several commits whose later
 * index segments cut and extend the streams; f16 / bf16 / f32 caches, keys
 * as cached and before RoPE, quad and ngon index codecs; damaged blocks fail
 * only the reads that touch them; argument and range errors; allocation
 * failures. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fkvf.h"
#include "error.h"
#include "format/format.h"
#include "hash.h"
#include "testutil.h"

/* ---- archives ------------------------------------------------------------ */

typedef struct cfg {
    const char *name;
    uint32_t L, H, dk, dv;
    fkvf_dtype dt;
    uint8_t rope_layout; /* 0: keys as cached; 1 / 2: archived before RoPE */
    uint32_t rope_dims;
    fkvf_profile prof;
    unsigned bits; /* quad */
    uint32_t k;
    uint8_t ks, vs;
    fkvf_dtype tdt;
    uint8_t pooled;
    uint32_t S;
    int n_commits;
    uint64_t A[3], N[3], seg_first[3];
    uint32_t block;
    int deflate_exac;
    int huge; /* centroids of magnitudes up to 2^127 */
} cfg;

static const cfg cfgs[] = {
    {"f16 quad4 pre-RoPE half-split, 3 commits", 3, 4, 8, 8, FKVF_DTYPE_F16, 2, 8,
     FKVF_PROFILE_QUAD, 4, 16, 2, 1, FKVF_DTYPE_F16, 0, 3, 3, {100, 150, 120}, {130, 170, 160},
     {0, 64, 96}, 64, 0, 0},
    {"bf16 quad8 pooled keys as cached, 2 commits", 2, 3, 16, 8, FKVF_DTYPE_BF16, 0, 0,
     FKVF_PROFILE_QUAD, 8, 32, 3, 2, FKVF_DTYPE_F32, 1, 4, 2, {50, 90, 0}, {70, 100, 0},
     {0, 48, 0}, 128, 0, 0},
    {"f32 ngon16 pre-RoPE interleaved partial, 3 commits", 2, 2, 12, 10, FKVF_DTYPE_F32, 1, 8,
     FKVF_PROFILE_NGON, 0, 16, 1, 3, FKVF_DTYPE_F16, 0, 2, 3, {40, 80, 70}, {60, 90, 75},
     {0, 32, 48}, 64, 0, 0},
    {"f16 quad6 k64 pre-RoPE, deflated EXAC", 2, 2, 8, 8, FKVF_DTYPE_F16, 2, 4, FKVF_PROFILE_QUAD,
     6, 64, 4, 2, FKVF_DTYPE_F32, 0, 1, 1, {70, 0, 0}, {100, 0, 0}, {0, 0, 0}, 4096, 1, 0},
    {"f32 quad16 no value stages", 1, 2, 4, 4, FKVF_DTYPE_F32, 0, 0, FKVF_PROFILE_QUAD, 16, 16, 1,
     0, FKVF_DTYPE_F32, 0, 0, 2, {30, 46, 0}, {35, 50, 0}, {0, 24, 0}, 64, 0, 0},
    /* heads wider than the output staging buffer (8192 values per run) */
    {"f16 wide heads (2 x 4160 dims) pre-RoPE", 1, 2, 4160, 4160, FKVF_DTYPE_F16, 2, 64,
     FKVF_PROFILE_QUAD, 4, 16, 1, 1, FKVF_DTYPE_F16, 0, 2, 1, {12, 0, 0}, {20, 0, 0}, {0, 0, 0},
     4096, 0, 0},
    /* many positions: several LAYOUT_HEADS blocks (128 positions each with
     * rope_dims 128), some of them across segments */
    {"f16 quad8 pre-RoPE 128 dims, 700 positions, 3 commits", 1, 2, 128, 4, FKVF_DTYPE_F16, 2,
     128, FKVF_PROFILE_QUAD, 8, 16, 2, 1, FKVF_DTYPE_F16, 0, 2, 3, {300, 600, 650},
     {320, 650, 700}, {0, 288, 592}, 64, 0, 0},
    /* f32 centroids up to 2^127: sums overflow to infinities, rotations of
     * infinities give NaNs; every output dtype must still match restore */
    {"bf16 quad4 huge centroids, pre-RoPE", 2, 2, 8, 8, FKVF_DTYPE_BF16, 2, 8, FKVF_PROFILE_QUAD,
     4, 16, 3, 2, FKVF_DTYPE_F32, 0, 1, 1, {40, 0, 0}, {50, 0, 0}, {0, 0, 0}, 64, 0, 1},
    /* f16 tables read as stored by LAYOUT_ROWS (access.c, sum16): pooled
     * (one table set per layer), odd dims (the scalar tail of every row),
     * GPT-2's K x4 V x2 stages, sinks, a second segment */
    {"f16 quad8 pooled f16 tables, dims 12 / 7, pre-RoPE, 2 commits", 2, 3, 12, 7, FKVF_DTYPE_F16,
     2, 12, FKVF_PROFILE_QUAD, 8, 16, 4, 2, FKVF_DTYPE_F16, 1, 2, 2, {40, 70, 0}, {56, 86, 0},
     {0, 32, 0}, 64, 0, 0},
    /* f16 tables with 16-bit index symbols (read_codes' general path) and no
     * key stages (keys are zero vectors) */
    {"bf16 quad16 f16 tables, no key stages, dims 8 / 9", 1, 2, 8, 9, FKVF_DTYPE_BF16, 0, 0,
     FKVF_PROFILE_QUAD, 16, 16, 0, 3, FKVF_DTYPE_F16, 0, 0, 1, {30, 0, 0}, {40, 0, 0}, {0, 0, 0},
     64, 0, 0},
    /* f16 tables to f16 output in registers (common/vec16.c, on CPUs with
     * AVX-512): half-split over all 64 key dims with GPT-2's K x4 V x2;
     * interleaved over 32 of 48 key dims; half-split over 16 of 32 key dims
     * (not whole 32-lane blocks: keys staged, values in registers) */
    {"f16 quad8 f16 tables, dims 64 / 32, half-split all dims", 2, 3, 64, 32, FKVF_DTYPE_F16, 2,
     64, FKVF_PROFILE_QUAD, 8, 16, 4, 2, FKVF_DTYPE_F16, 0, 2, 2, {40, 70, 0}, {56, 86, 0},
     {0, 32, 0}, 64, 0, 0},
    {"bf16 quad8 f16 tables, dims 48 / 16, interleaved 32 dims", 2, 2, 48, 16, FKVF_DTYPE_BF16, 1,
     32, FKVF_PROFILE_QUAD, 8, 32, 3, 1, FKVF_DTYPE_F16, 0, 3, 1, {50, 0, 0}, {60, 0, 0},
     {0, 0, 0}, 64, 0, 0},
    {"f16 quad8 f16 tables, dims 32 / 16, half-split 16 dims", 1, 2, 32, 16, FKVF_DTYPE_F16, 2,
     16, FKVF_PROFILE_QUAD, 8, 16, 2, 2, FKVF_DTYPE_F16, 0, 1, 1, {30, 0, 0}, {40, 0, 0},
     {0, 0, 0}, 64, 0, 0},
    /* k = 512: the index row cache keeps two bytes a code */
    {"f32 quad16 k 512, pre-RoPE, 2 commits", 1, 2, 8, 8, FKVF_DTYPE_F32, 2, 8,
     FKVF_PROFILE_QUAD, 16, 512, 2, 1, FKVF_DTYPE_F16, 0, 2, 2, {40, 70, 0}, {50, 80, 0},
     {0, 32, 0}, 64, 0, 0},
};
#define N_CFGS (sizeof cfgs / sizeof cfgs[0])

static size_t esize(fkvf_dtype d) { return d == FKVF_DTYPE_F32 ? 4 : 2; }

/* a random value of dtype d at p, little-endian (the library's element
 * arrays, fkvf.h): full-precision significands, magnitudes 2^-8 .. 2, so
 * that binary32 sums round (and their order matters) */
static void put_rand(tu_rng *g, fkvf_dtype d, uint8_t *p)
{
    double m = (double)(tu_next(g) >> 11) / 9007199254740992.0; /* [0, 1) */
    float x = (float)(m * (double)(1u << tu_below(g, 10)) / 256.0);
    if (tu_below(g, 2))
        x = -x;
    if (d == FKVF_DTYPE_F32) {
        tu_le_f32(&x, 1);
        memcpy(p, &x, 4);
        return;
    }
    uint16_t h = d == FKVF_DTYPE_F16 ? fkvf_f32_to_f16(x) : fkvf_f32_to_bf16(x);
    tu_le_u16(&h, 1);
    memcpy(p, &h, 2);
}

static size_t row_bytes(const cfg *c)
{
    return (size_t)c->L * c->H * (c->dk + c->dv) * esize(c->dt);
}

static void build(const cfg *c, tu_buf *file)
{
    memset(file, 0, sizeof *file);
    tu_rng g = {(uint64_t)c->L * 1000 + c->H * 100 + c->dk + c->bits};
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.block_size = c->block;
    if (c->prof == FKVF_PROFILE_NGON)
        o.required_features |= FKVF_FEAT_NGON;
    if (c->deflate_exac)
        o.required_features |= FKVF_FEAT_DEFLATE;
    fkvf_sink sk = tu_buf_sink(file);
    fkvf_writer *w;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sk, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = c->L;
    d.n_kv_heads = c->H;
    d.key_dim = c->dk;
    d.value_dim = c->dv;
    d.dtype = c->dt;
    if (c->rope_layout) {
        d.key_transform = 1;
        d.rope_layout = c->rope_layout;
        d.key_storage = 1;
        d.rope_dims = c->rope_dims;
        d.rope_theta = c->rope_layout == 1 ? 500000.0 : 10000.0;
    }
    d.n_sinks = c->S;
    d.window = 16;
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    unsigned xf = c->deflate_exac ? FKVF_SECTION_DEFLATE : 0;
    size_t rb = row_bytes(c), es = esize(c->dt);
    uint64_t nmax = c->N[0] > c->N[1] ? c->N[0] : c->N[1];
    nmax = nmax > c->N[2] ? nmax : c->N[2];
    uint8_t *rows = malloc(nmax * rb + 1);
    for (size_t i = 0; i < nmax * rb / es; i++)
        put_rand(&g, c->dt, rows + i * es);
    if (c->S)
        ck_assert_int_eq(fkvf_writer_add_exact(w, 0, c->S, rows, c->S * rb, xf), FKVF_OK);
    /* codebook: random tables */
    fkvf_codebook_shape sh = {c->L, c->pooled ? 1 : c->H, c->dk, c->dv, c->k, c->ks, c->vs,
                              c->tdt, c->pooled, NULL};
    size_t tsz = (size_t)fkvf_codebook_size(&sh) - 64;
    uint8_t *tab = malloc(tsz + 1);
    for (size_t i = 0; i < tsz / esize(c->tdt); i++) {
        put_rand(&g, c->tdt, tab + i * esize(c->tdt));
        if (c->huge && tu_below(&g, 3) != 0) { /* +-(1..2) * 1e38 */
            float f = (1.0f + (float)tu_below(&g, 1000) / 1000.0f) * 1.0e38f;
            if (tu_below(&g, 2))
                f = -f;
            tu_le_f32(&f, 1);
            memcpy(tab + i * 4, &f, 4);
        }
    }
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, tab, tsz, 0), FKVF_OK);
    free(tab);
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.profile = c->prof;
    sp.symbol_bits = c->bits;
    sp.alphabet = c->prof == FKVF_PROFILE_NGON ? c->k : 0;
    size_t ns = (size_t)c->L * c->H * (c->ks + c->vs);
    for (int ci = 0; ci < c->n_commits; ci++) {
        uint64_t f = c->seg_first[ci], n = c->A[ci] - f;
        uint16_t *codes = malloc((n * ns + 1) * sizeof *codes);
        for (size_t i = 0; i < n * ns; i++)
            codes[i] = (uint16_t)tu_below(&g, c->k);
        ck_assert_msg(fkvf_writer_add_index_segment(w, &sp, f, n, codes, ns, 1) == FKVF_OK,
                      "%s: %s", c->name, fkvf_writer_message(w));
        free(codes);
        /* new rows for the recent window: later commits overwrite rows an
         * earlier one stored (the last covering EXAC section wins) */
        uint64_t e0 = c->S + c->A[ci], e1 = c->N[ci];
        for (size_t i = e0 * rb / es; i < e1 * rb / es; i++)
            put_rand(&g, c->dt, rows + i * es);
        if (e1 > e0)
            ck_assert_int_eq(fkvf_writer_add_exact(w, e0, e1 - e0, rows + e0 * rb,
                                                   (e1 - e0) * rb, xf),
                             FKVF_OK);
        ck_assert_int_eq(fkvf_writer_set_positions(w, c->N[ci], c->A[ci]), FKVF_OK);
        if (ci + 1 < c->n_commits)
            ck_assert_msg(fkvf_writer_commit(w) == FKVF_OK, "%s", fkvf_writer_message(w));
    }
    ck_assert_msg(fkvf_writer_finish(w) == FKVF_OK, "%s", fkvf_writer_message(w));
    fkvf_writer_free(w);
    free(rows);
}

/* ---- the reference: restore, then pick the selected elements ------------- */

typedef struct fx {
    const cfg *c;
    tu_buf file;
    uint64_t N, A;
    uint8_t *ref[4]; /* restore of every position, per dtype (index = dtype) */
} fx;

static void fx_open(fx *x, const cfg *c)
{
    memset(x, 0, sizeof *x);
    x->c = c;
    build(c, &x->file);
    x->N = c->N[c->n_commits - 1];
    x->A = c->A[c->n_commits - 1];
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, x->file.data, x->file.size, 0, NULL), FKVF_OK);
    for (int dt = 1; dt <= 3; dt++) {
        size_t rb;
        ck_assert_int_eq(fkvf_reader_row_bytes(r, (fkvf_dtype)dt, &rb), FKVF_OK);
        x->ref[dt] = malloc(rb * x->N);
        ck_assert_msg(fkvf_reader_restore(r, 0, x->N, (fkvf_dtype)dt, x->ref[dt], rb * x->N) ==
                          FKVF_OK,
                      "%s", fkvf_reader_message(r));
    }
    fkvf_reader_free(r);
}

static void fx_close(fx *x)
{
    for (int dt = 1; dt <= 3; dt++)
        free(x->ref[dt]);
    tu_buf_free(&x->file);
}

/* The expected output of req, from the restored rows (independent of the
 * library's layout code). Returns its size; *out malloc'd. */
static size_t expect(const fx *x, const fkvf_read_request *q, uint8_t **out)
{
    const cfg *c = x->c;
    size_t es = esize(q->dtype), rb = row_bytes(c) / esize(c->dt) * es;
    uint32_t nl = q->layer_count ? q->layer_count : c->L - q->layer_first;
    uint32_t nh = q->head_count ? q->head_count : c->H - q->head_first;
    unsigned parts = q->parts ? q->parts : 3;
    size_t n = 0, cap = (size_t)q->count * nl * nh * (c->dk + c->dv) * es;
    uint8_t *o = malloc(cap + 1);
    const uint8_t *ref = x->ref[q->dtype];
#define VEC(p, l, h, kv)                                                                       \
    (ref + (size_t)(p) * rb +                                                                  \
     ((size_t)(l) * c->H * (c->dk + c->dv) + ((kv) ? c->H * c->dk + (size_t)(h) * c->dv        \
                                                   : (size_t)(h) * c->dk)) * es)
    if (q->layout == FKVF_LAYOUT_ROWS) {
        for (uint64_t p = q->first; p < q->first + q->count; p++)
            for (uint32_t l = q->layer_first; l < q->layer_first + nl; l++)
                for (unsigned kv = 0; kv < 2; kv++) {
                    if (!(parts & (1u << kv)))
                        continue;
                    size_t dim = kv ? c->dv : c->dk;
                    for (uint32_t h = q->head_first; h < q->head_first + nh; h++) {
                        memcpy(o + n, VEC(p, l, h, kv), dim * es);
                        n += dim * es;
                    }
                }
    } else {
        for (uint32_t l = q->layer_first; l < q->layer_first + nl; l++)
            for (unsigned kv = 0; kv < 2; kv++) {
                if (!(parts & (1u << kv)))
                    continue;
                size_t dim = kv ? c->dv : c->dk;
                for (uint32_t h = q->head_first; h < q->head_first + nh; h++)
                    for (uint64_t p = q->first; p < q->first + q->count; p++) {
                        memcpy(o + n, VEC(p, l, h, kv), dim * es);
                        n += dim * es;
                    }
            }
    }
#undef VEC
    *out = o;
    return n;
}

static fkvf_read_request random_req(tu_rng *g, const fx *x)
{
    const cfg *c = x->c;
    fkvf_read_request q;
    memset(&q, 0, sizeof q);
    q.first = tu_below(g, (uint32_t)x->N);
    switch (tu_below(g, 4)) {
    case 0:
        q.count = 1;
        break;
    case 1:
        q.count = tu_below(g, 8);
        break;
    default:
        q.count = tu_below(g, (uint32_t)(x->N - q.first) + 1);
    }
    if (q.first + q.count > x->N)
        q.count = x->N - q.first;
    q.layer_first = tu_below(g, c->L);
    q.layer_count = tu_below(g, c->L - q.layer_first + 1);
    q.head_first = tu_below(g, c->H);
    q.head_count = tu_below(g, c->H - q.head_first + 1);
    q.parts = tu_below(g, 4);
    q.dtype = (fkvf_dtype)(1 + tu_below(g, 3));
    q.layout = (fkvf_layout)tu_below(g, 2);
    return q;
}

static void check_req(fkvf_reader *r, const fx *x, const fkvf_read_request *q, int i)
{
    uint8_t *want;
    size_t n = expect(x, q, &want), sz = 0;
    ck_assert_int_eq(fkvf_reader_read_size(r, q, &sz), FKVF_OK);
    EXPECTF(sz == n, "%s: request %d: size %zu, expected %zu", x->c->name, i, sz, n);
    uint8_t *got = malloc(n + 8);
    memset(got, 0xA5, n + 8);
    int rc = fkvf_reader_read(r, q, got, n);
    EXPECTF(rc == FKVF_OK, "%s: request %d: %s", x->c->name, i, fkvf_reader_message(r));
    EXPECTF(memcmp(got, want, n) == 0,
            "%s: request %d (first %llu count %llu layers %u+%u heads %u+%u parts %u dtype %d "
            "layout %d) differs from restore",
            x->c->name, i, (unsigned long long)q->first, (unsigned long long)q->count,
            q->layer_first, q->layer_count, q->head_first, q->head_count, q->parts,
            (int)q->dtype, (int)q->layout);
    EXPECTF(got[n] == 0xA5 && got[n + 7] == 0xA5, "%s: request %d wrote past its size",
            x->c->name, i);
    free(got);
    free(want);
}

START_TEST(read_matches_restore)
{
    const cfg *c = &cfgs[_i];
    fx x;
    fx_open(&x, c);
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, x.file.data, x.file.size, 0, NULL), FKVF_OK);
    fkvf_archive_info info;
    ck_assert_int_eq(fkvf_reader_info(r, &info), FKVF_OK);
    ck_assert_uint_eq(info.n_commits, (uint64_t)c->n_commits);
    if (c->huge) { /* the reference holds infinities and NaNs */
        size_t ninf = 0, nnan = 0, ne = row_bytes(c) / esize(c->dt) * x.N;
        for (size_t i = 0; i < ne; i++) {
            float f = tu_ldf32le(x.ref[FKVF_DTYPE_F32] + 4 * i);
            ninf += f - f != 0.0f && f == f;
            nnan += f != f;
        }
        ck_assert_uint_gt(ninf, 0);
        ck_assert_uint_gt(nnan, 0);
    }
    ck_assert_uint_eq(info.n_archived, x.A);
    /* everything, both layouts, every dtype */
    for (int dt = 1; dt <= 3; dt++)
        for (int lay = 0; lay < 2; lay++) {
            fkvf_read_request q = {0, x.N, 0, 0, 0, 0, 0, (fkvf_dtype)dt, (fkvf_layout)lay};
            check_req(r, &x, &q, -1);
        }
    /* every head of each range of layers, both parts and each alone, from a
     * position before the first archived one and from one inside the run
     * (the decoder's bulk path when 64 or more archived positions remain),
     * both layouts, every dtype, on 1 and 3 threads */
    uint64_t starts[2] = {c->S > 0 ? c->S - 1 : 0, c->S + 3};
    for (unsigned th = 1; th <= 3; th += 2) {
        ck_assert_int_eq(fkvf_reader_set_threads(r, th), FKVF_OK);
        for (int si = 0; si < 2; si++)
            for (uint32_t l0 = 0; l0 < c->L; l0++)
                for (uint32_t nl = 1; l0 + nl <= c->L; nl++)
                    for (int dt = 1; dt <= 3; dt++)
                        for (int lay = 0; lay < 4; lay++) {
                            uint64_t f = starts[si] < x.N ? starts[si] : 0;
                            /* both parts in both layouts; keys alone heads-first,
                             * values alone as rows */
                            unsigned parts = lay < 2 ? 0 : lay == 2 ? 1 : 2;
                            fkvf_read_request q = {f,     x.N - f, l0, nl, 0, 0, parts,
                                                   (fkvf_dtype)dt, (fkvf_layout)(lay == 1 || lay == 2)};
                            check_req(r, &x, &q, -2);
                        }
    }
    ck_assert_int_eq(fkvf_reader_set_threads(r, 1), FKVF_OK);
    /* each position alone, all of it */
    for (uint64_t p = 0; p < x.N; p++) {
        fkvf_read_request q = {p, 1, 0, 0, 0, 0, 0, c->dt, FKVF_LAYOUT_ROWS};
        check_req(r, &x, &q, (int)p);
    }
    /* the same backwards in every dtype (access.c's index row cache: blocks
     * cached above, some evicted by their slot's other blocks), then runs of
     * 2..15 positions, all of them (runs through the cache) */
    for (uint64_t p = x.N; p-- > 0;) {
        fkvf_read_request q = {p, 1, 0, 0, 0, 0, 0, (fkvf_dtype)(1 + p % 3), FKVF_LAYOUT_ROWS};
        check_req(r, &x, &q, 2000 + (int)p);
    }
    tu_rng gr = {99 + (uint64_t)_i};
    for (int i = 0; i < 200; i++) {
        uint64_t n = 2 + tu_below(&gr, 14), p = tu_below(&gr, (uint32_t)x.N);
        fkvf_read_request q = {p, p + n > x.N ? x.N - p : n, 0, 0, 0, 0, 0,
                               (fkvf_dtype)(1 + tu_below(&gr, 3)), FKVF_LAYOUT_ROWS};
        check_req(r, &x, &q, 3000 + i);
    }
    /* random selections */
    tu_rng g = {1234 + (uint64_t)_i};
    for (int i = 0; i < 600; i++) {
        fkvf_read_request q = random_req(&g, &x);
        check_req(r, &x, &q, i);
    }
    fkvf_reader_free(r);
    /* a fresh reader (nothing verified yet) for single-head reads */
    ck_assert_int_eq(fkvf_reader_open_memory(&r, x.file.data, x.file.size, 0, NULL), FKVF_OK);
    for (int i = 0; i < 300; i++) {
        fkvf_read_request q = random_req(&g, &x);
        q.layer_count = 1;
        q.head_count = 1;
        q.count = q.count > 3 ? 3 : q.count;
        check_req(r, &x, &q, 1000 + i);
    }
    fkvf_reader_free(r);
    fx_close(&x);
}
END_TEST

/* The index row cache under budgets of one slot (every block evicts the
 * last), of two slots and a byte, and of 0 (no cache): single positions
 * forwards and backwards and runs of 2..15 positions, all equal to restore;
 * fkvf_reader_set_row_cache's handle check. */
START_TEST(row_cache_budgets)
{
    const cfg *c = &cfgs[_i];
    fx x;
    fx_open(&x, c);
    /* a slot: 16 positions of every stream's code, a byte each when k <= 256 */
    const size_t slot = 16 * (size_t)c->L * c->H * (c->ks + c->vs) * (c->k <= 256 ? 1 : 2);
    const size_t budgets[] = {slot, 2 * slot + 1, 0};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
        fkvf_reader *r;
        ck_assert_int_eq(fkvf_reader_open_memory(&r, x.file.data, x.file.size, 0, NULL),
                         FKVF_OK);
        ck_assert_int_eq(fkvf_reader_set_row_cache(r, budgets[b]), FKVF_OK);
        for (uint64_t p = 0; p < x.N; p++) {
            fkvf_read_request q = {p, 1, 0, 0, 0, 0, 0, c->dt, FKVF_LAYOUT_ROWS};
            check_req(r, &x, &q, (int)p);
        }
        for (uint64_t p = x.N; p-- > 0;) {
            fkvf_read_request q = {p, 1, 0, 0, 0, 0, 0, FKVF_DTYPE_F32, FKVF_LAYOUT_ROWS};
            check_req(r, &x, &q, 1000 + (int)p);
        }
        /* single positions at random, more than a window of the cache's hit
         * rate: with one slot it falls below the floor and fills stop for a
         * while (hits still served), then start again */
        tu_rng h = {77 + (uint64_t)_i};
        for (int i = 0; i < 2500; i++) {
            fkvf_read_request q = {tu_below(&h, (uint32_t)x.N), 1, 0, 0, 0, 0, 0, c->dt,
                                   FKVF_LAYOUT_ROWS};
            check_req(r, &x, &q, 3000 + i);
        }
        /* a new budget mid-way frees the cache; reads go on */
        ck_assert_int_eq(fkvf_reader_set_row_cache(r, budgets[(b + 1) % 3]), FKVF_OK);
        tu_rng g = {5 + (uint64_t)_i};
        for (int i = 0; i < 100; i++) {
            uint64_t n = 1 + tu_below(&g, 15), p = tu_below(&g, (uint32_t)x.N);
            fkvf_read_request q = {p, p + n > x.N ? x.N - p : n, 0, 0, 0, 0, 0, c->dt,
                                   FKVF_LAYOUT_ROWS};
            check_req(r, &x, &q, 2000 + i);
        }
        fkvf_reader_free(r);
    }
    ck_assert_int_eq(fkvf_reader_set_row_cache(NULL, 0), FKVF_E_STATE);
    fx_close(&x);
}
END_TEST

/* Archives opened from a file, mapped (flags 0) and read into memory
 * (FKVF_OPEN_READ): the first and last archived positions, the sinks and the
 * window one by one, then random selections, against restore. */
START_TEST(read_from_file)
{
    /* three commits, 700 positions, the two f16-table archives of sum16, the
     * first of vec16 and k 512 (the two-byte row cache) */
    static const size_t which[] = {0, 6, 8, 9, 10, N_CFGS - 1};
    const cfg *c = &cfgs[which[_i / 2]];
    const unsigned flags = _i % 2 ? FKVF_OPEN_READ : 0;
    fx x;
    fx_open(&x, c);
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/test_access_%ld_%d.fkvf", dir && *dir ? dir : "/tmp",
             (long)getpid(), _i);
    tu_write_file(path, x.file.data, x.file.size);
    fkvf_reader *r;
    ck_assert_msg(fkvf_reader_open_file(&r, path, flags, NULL) == FKVF_OK, "%s",
                  fkvf_reader_message(r));
    const uint64_t S = c->S, A = x.A;
    ck_assert_uint_gt(A, 1);
    ck_assert_uint_gt(x.N, S + A); /* a window of exact positions */
    const uint64_t probe[] = {S, S + A - 1, S + 1, S + A / 2, S + A - 2, S + A, x.N - 1};
    for (size_t i = 0; i < sizeof probe / sizeof probe[0]; i++) {
        fkvf_read_request q = {probe[i], 1, 0, 0, 0, 0, 0, c->dt, FKVF_LAYOUT_ROWS};
        check_req(r, &x, &q, (int)i);
        q.dtype = FKVF_DTYPE_F32;
        check_req(r, &x, &q, 100 + (int)i);
    }
    for (uint64_t p = 0; p < S; p++) {
        fkvf_read_request q = {p, 1, 0, 0, 0, 0, 0, c->dt, FKVF_LAYOUT_ROWS};
        check_req(r, &x, &q, 200 + (int)p);
    }
    /* the last archived position with its neighbours on both sides */
    fkvf_read_request edge = {S + A - 1, 2, 0, 0, 0, 0, 0, c->dt, FKVF_LAYOUT_ROWS};
    check_req(r, &x, &edge, 300);
    if (S) {
        fkvf_read_request head = {S - 1, 2, 0, 0, 0, 0, 0, c->dt, FKVF_LAYOUT_ROWS};
        check_req(r, &x, &head, 301);
    }
    tu_rng g = {777 + (uint64_t)_i};
    for (int i = 0; i < 300; i++) {
        fkvf_read_request q = random_req(&g, &x);
        check_req(r, &x, &q, 400 + i);
    }
    fkvf_reader_free(r);
    remove(path);
    fx_close(&x);
}
END_TEST

/* ---- damage: only the reads that touch a damaged block fail -------------- */

typedef struct seginfo {
    fkvf_strm_hdr h;
    uint64_t off, count; /* section offset; effective symbols */
} seginfo;

/* The effective index segments (spec 11.6), from the section list. */
static size_t segments(fkvf_reader *r, const tu_buf *f, seginfo *sg, size_t cap)
{
    fkvf_archive_info info;
    ck_assert_int_eq(fkvf_reader_info(r, &info), FKVF_OK);
    size_t n = 0;
    for (size_t i = 0; i < info.n_sections; i++) {
        fkvf_section_info s;
        ck_assert_int_eq(fkvf_reader_section(r, i, &s), FKVF_OK);
        if (s.type != FKVF_SECTION_STRM || s.key != FKVF_STREAM_GROUP_INDEX)
            continue;
        fkvf_strm_hdr h;
        fkvf_diag dg;
        fkvf_diag_clear(&dg);
        ck_assert_int_eq(fkvf_strm_hdr_parse(f->data + s.offset, s.size, s.offset, &h, &dg),
                         FKVF_OK);
        while (n && sg[n - 1].h.first_symbol >= h.first_symbol)
            n--;
        if (n && sg[n - 1].h.first_symbol + sg[n - 1].count > h.first_symbol)
            sg[n - 1].count = h.first_symbol - sg[n - 1].h.first_symbol;
        ck_assert_uint_lt(n, cap);
        sg[n].h = h;
        sg[n].off = s.offset;
        sg[n].count = h.symbol_count;
        n++;
    }
    return n;
}

/* Does req touch the byte at file offset bad (in the data of an index
 * segment)? */
static int touches(const fx *x, const seginfo *sg, size_t nseg, const fkvf_read_request *q,
                   uint64_t bad)
{
    const cfg *c = x->c;
    uint32_t nl = q->layer_count ? q->layer_count : c->L - q->layer_first;
    uint32_t nh = q->head_count ? q->head_count : c->H - q->head_first;
    unsigned parts = q->parts ? q->parts : 3;
    for (uint64_t p = q->first; p < q->first + q->count; p++) {
        if (p < c->S || p >= c->S + x->A)
            continue;
        uint64_t a = p - c->S;
        const seginfo *s = NULL;
        for (size_t i = 0; i < nseg; i++)
            if (a >= sg[i].h.first_symbol && a - sg[i].h.first_symbol < sg[i].count)
                s = &sg[i];
        ck_assert_ptr_nonnull(s);
        uint64_t u = a - s->h.first_symbol, lo, hi;
        if (s->h.profile == FKVF_PROFILE_QUAD) {
            lo = u * s->h.bits / 8;
            hi = ((u + 1) * s->h.bits + 7) / 8;
        } else {
            lo = u / s->h.span_symbols * 16;
            hi = lo + 16;
        }
        uint64_t ds = s->off + s->h.data_off, bs = s->h.block_size;
        if (bad < ds || bad >= ds + s->h.data_bytes)
            continue;
        uint64_t bb = (bad - ds) / bs;
        for (uint32_t l = q->layer_first; l < q->layer_first + nl; l++)
            for (uint32_t h = q->head_first; h < q->head_first + nh; h++)
                for (unsigned kv = 0; kv < 2; kv++) {
                    if (!(parts & (1u << kv)))
                        continue;
                    for (unsigned st = 0; st < (kv ? c->vs : c->ks); st++) {
                        uint64_t ord = ((uint64_t)l * c->H + h) * (c->ks + c->vs) +
                                       (kv ? c->ks + st : st);
                        uint64_t b0 = (ord * s->h.stream_bytes + lo) / bs,
                                 b1 = (ord * s->h.stream_bytes + hi - 1) / bs;
                        if (bb >= b0 && bb <= b1)
                            return 1;
                    }
                }
    }
    return 0;
}

START_TEST(damaged_block_fails_only_its_reads)
{
    const cfg *c = &cfgs[_i];
    fx x;
    fx_open(&x, c);
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, x.file.data, x.file.size, 0, NULL), FKVF_OK);
    seginfo sg[8];
    size_t nseg = segments(r, &x.file, sg, 8);
    fkvf_reader_free(r);
    ck_assert_uint_gt(nseg, 0);
    tu_rng g = {77 + (uint64_t)_i};
    for (int trial = 0; trial < 6; trial++) {
        /* a byte in the data of an effective segment */
        const seginfo *s = &sg[tu_below(&g, (uint32_t)nseg)];
        if (!s->h.data_bytes)
            continue;
        uint64_t bad = s->off + s->h.data_off + tu_below(&g, (uint32_t)s->h.data_bytes);
        uint8_t *copy = malloc(x.file.size);
        memcpy(copy, x.file.data, x.file.size);
        copy[bad] ^= 0x40;
        ck_assert_int_eq(fkvf_reader_open_memory(&r, copy, x.file.size, 0, NULL), FKVF_OK);
        int failed = 0, passed = 0;
        for (int i = 0; i < 400; i++) {
            fkvf_read_request q = random_req(&g, &x);
            if (i % 3 == 1) { /* small selections: most miss the block */
                q.count = q.count > 2 ? 2 : q.count;
                q.layer_count = 1;
                q.head_count = 1 + tu_below(&g, 2);
                if (q.head_first + q.head_count > c->H)
                    q.head_count = 0;
            } else if (i % 3 == 2) { /* a few positions, all of them: the index row
                                      * cache's blocks may hold the damaged byte */
                q.count = q.count > 3 ? 3 : q.count;
                q.layer_first = q.layer_count = q.head_first = q.head_count = 0;
                q.parts = 0;
                q.layout = FKVF_LAYOUT_ROWS;
            }
            int hit = touches(&x, sg, nseg, &q, bad);
            uint8_t *want;
            size_t n = expect(&x, &q, &want);
            uint8_t *got = malloc(n + 1);
            int rc = fkvf_reader_read(r, &q, got, n);
            if (hit) {
                EXPECTF(rc == FKVF_E_CHECKSUM, "%s: trial %d read %d: %s, expected CHECKSUM",
                        c->name, trial, i, fkvf_error_name(rc));
                EXPECT(strstr(fkvf_reader_message(r), "block") != NULL);
                failed++;
            } else {
                EXPECTF(rc == FKVF_OK, "%s: trial %d read %d: %s", c->name, trial, i,
                        fkvf_reader_message(r));
                EXPECT(memcmp(got, want, n) == 0);
                /* no message left behind by a block the row cache gave up on */
                EXPECTF(fkvf_reader_message(r)[0] == 0, "%s: trial %d read %d: message '%s'",
                        c->name, trial, i, fkvf_reader_message(r));
                passed++;
            }
            free(got);
            free(want);
        }
        ck_assert_int_gt(passed, 0);
        fkvf_reader_free(r);
        free(copy);
    }
    fx_close(&x);
}
END_TEST

/* A symbol >= k behind a valid block checksum: the reads that decode it fail
 * with FKVF_E_SYMBOL (as restore does), the others succeed. */
START_TEST(symbol_out_of_codebook)
{
    const cfg *c = &cfgs[_i ? 4 : 1]; /* 8-bit symbols, k = 32; 16-bit, k = 16 */
    fx x;
    fx_open(&x, c);
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, x.file.data, x.file.size, 0, NULL), FKVF_OK);
    seginfo sg[8];
    size_t nseg = segments(r, &x.file, sg, 8);
    fkvf_reader_free(r);
    /* the last segment; stream 0 (layer 0, head 0, key stage 0); its symbol 3 */
    const seginfo *s = &sg[nseg - 1];
    uint64_t ord = 0, u = 3, a = s->h.first_symbol + u, p = c->S + a;
    ck_assert_uint_lt(u, s->count);
    uint8_t *copy = malloc(x.file.size);
    memcpy(copy, x.file.data, x.file.size);
    uint64_t ds = s->off + s->h.data_off, at = ds + ord * s->h.stream_bytes + u * s->h.bits / 8;
    ck_assert(s->h.bits == 8 || s->h.bits == 16);
    for (unsigned i = 0; i < s->h.bits / 8; i++)
        copy[at + i] = 0xFF; /* >= k */
    /* the block's checksum, recomputed: only the symbol check can fail */
    uint64_t b = (at - ds) / s->h.block_size, b0 = ds + b * s->h.block_size;
    uint64_t len = s->h.data_bytes - b * s->h.block_size;
    len = len < s->h.block_size ? len : s->h.block_size;
    uint64_t sum = fkvf_xxh3_64(copy + b0, (size_t)len, b0);
    for (int i = 0; i < 8; i++)
        copy[s->off + 64 + 8 * b + i] = (uint8_t)(sum >> (8 * i));
    ck_assert_int_eq(fkvf_reader_open_memory(&r, copy, x.file.size, 0, NULL), FKVF_OK);
    static uint8_t buf[1 << 16];
    size_t rb;
    ck_assert_int_eq(fkvf_reader_row_bytes(r, FKVF_DTYPE_F32, &rb), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_restore(r, p, 1, FKVF_DTYPE_F32, buf, sizeof buf),
                     FKVF_E_SYMBOL);
    for (int lay = 0; lay < 2; lay++) {
        fkvf_read_request q = {p, 1, 0, 0, 0, 0, 0, FKVF_DTYPE_F32, (fkvf_layout)lay};
        ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_SYMBOL);
        ck_assert_ptr_nonnull(strstr(fkvf_reader_message(r), "codebook has k"));
        q.first = p > 0 ? p - 1 : p + 1; /* a neighbour */
        ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_OK);
        q.first = p;
        q.parts = FKVF_PART_VALUES; /* the damaged stream is a key stream */
        ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_OK);
        q.parts = 0;
        q.head_first = 1; /* another head */
        ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_OK);
        q.head_first = 0;
        q.first = p - 2;
        q.count = 5; /* a range across it */
        ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_SYMBOL);
    }
    fkvf_reader_free(r);
    free(copy);
    fx_close(&x);
}
END_TEST

/* EXAC sections are verified whole when the reader opens (it needs their
 * headers): a damaged one is refused there, so reads never see it. */
START_TEST(damaged_exact_section)
{
    const cfg *c = &cfgs[0];
    fx x;
    fx_open(&x, c);
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, x.file.data, x.file.size, 0, NULL), FKVF_OK);
    fkvf_archive_info info;
    ck_assert_int_eq(fkvf_reader_info(r, &info), FKVF_OK);
    fkvf_section_info s;
    size_t i;
    for (i = 0; i < info.n_sections; i++) {
        ck_assert_int_eq(fkvf_reader_section(r, i, &s), FKVF_OK);
        if (s.type == FKVF_SECTION_EXAC)
            break;
    }
    ck_assert_uint_lt(i, info.n_sections);
    fkvf_reader_free(r);
    uint8_t *copy = malloc(x.file.size);
    memcpy(copy, x.file.data, x.file.size);
    copy[s.offset + 64 + 3] ^= 1;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, copy, x.file.size, 0, NULL), FKVF_E_CHECKSUM);
    ck_assert_ptr_nonnull(strstr(fkvf_reader_message(r), "EXAC"));
    fkvf_read_request q = {0, 1, 0, 0, 0, 0, 0, FKVF_DTYPE_F32, FKVF_LAYOUT_HEADS};
    static uint8_t buf[1 << 12];
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_STATE);
    fkvf_reader_free(r);
    free(copy);
    fx_close(&x);
}
END_TEST

/* ---- arguments ---------------------------------------------------------------- */

START_TEST(read_rejects_bad_arguments)
{
    const cfg *c = &cfgs[0];
    fx x;
    fx_open(&x, c);
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, x.file.data, x.file.size, 0, NULL), FKVF_OK);
    static uint8_t buf[1 << 16];
    size_t sz;
    fkvf_read_request ok = {5, 2, 0, 0, 0, 0, 0, FKVF_DTYPE_F16, FKVF_LAYOUT_ROWS};
    ck_assert_int_eq(fkvf_reader_read_size(r, &ok, &sz), FKVF_OK);
    ck_assert_uint_eq(sz, 2 * row_bytes(c));
    ck_assert_int_eq(fkvf_reader_read(r, &ok, buf, sz), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_read(NULL, &ok, buf, sz), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_reader_read_size(NULL, &ok, &sz), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_reader_read(r, NULL, buf, sz), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_read_size(r, NULL, &sz), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_read_size(r, &ok, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_read(r, &ok, NULL, sz), FKVF_E_INVALID_ARG);
    /* too small: the message names the size needed */
    ck_assert_int_eq(fkvf_reader_read(r, &ok, buf, sz - 1), FKVF_E_INVALID_ARG);
    char need[32];
    snprintf(need, sizeof need, "%zu", sz);
    ck_assert_ptr_nonnull(strstr(fkvf_reader_message(r), need));
    fkvf_read_request q = ok;
    q.parts = 4;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_read_size(r, &q, &sz), FKVF_E_INVALID_ARG);
    q = ok;
    q.dtype = (fkvf_dtype)0;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_INVALID_ARG);
    q.dtype = (fkvf_dtype)4;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_INVALID_ARG);
    q = ok;
    q.layout = (fkvf_layout)2;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_INVALID_ARG);
    /* ranges */
    q = ok;
    q.first = x.N;
    q.count = 1;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_RANGE);
    q.first = 1;
    q.count = x.N;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_RANGE);
    ck_assert_int_eq(fkvf_reader_read_size(r, &q, &sz), FKVF_E_RANGE);
    q.first = UINT64_MAX;
    q.count = 2;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_RANGE);
    q = ok;
    q.layer_first = c->L;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_RANGE);
    q.layer_first = 1;
    q.layer_count = c->L;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_RANGE);
    q.layer_count = UINT32_MAX;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_RANGE);
    q = ok;
    q.head_first = c->H;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_RANGE);
    q.head_first = 2;
    q.head_count = c->H - 1;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_RANGE);
    ck_assert_ptr_nonnull(strstr(fkvf_reader_message(r), "heads"));
    /* empty: count 0 is fine, even at the end and with no buffer */
    q = ok;
    q.first = x.N;
    q.count = 0;
    ck_assert_int_eq(fkvf_reader_read_size(r, &q, &sz), FKVF_OK);
    ck_assert_uint_eq(sz, 0);
    ck_assert_int_eq(fkvf_reader_read(r, &q, NULL, 0), FKVF_OK);
    /* read_size of a layer of keys, LAYOUT_HEADS */
    q = ok;
    q.first = 0;
    q.count = x.N;
    q.layer_first = 1;
    q.layer_count = 1;
    q.parts = FKVF_PART_KEYS;
    q.layout = FKVF_LAYOUT_HEADS;
    q.dtype = FKVF_DTYPE_F32;
    ck_assert_int_eq(fkvf_reader_read_size(r, &q, &sz), FKVF_OK);
    ck_assert_uint_eq(sz, x.N * c->H * c->dk * 4);
    fkvf_reader_free(r);
    fx_close(&x);
}
END_TEST

/* An archive whose codebook is external: exact positions read without it,
 * archived ones fail with CODEBOOK until it is attached. */
START_TEST(read_external_codebook)
{
    const cfg *c = &cfgs[0];
    fx x;
    fx_open(&x, c); /* for the reference rows */
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, x.file.data, x.file.size, 0, NULL), FKVF_OK);
    fkvf_codebook_shape sh;
    const void *cbk;
    size_t cbsz;
    uint8_t hash[16];
    ck_assert_int_eq(fkvf_reader_codebook(r, &sh, &cbk, &cbsz, hash), FKVF_OK);
    /* the codebook file */
    tu_buf cbf = {0};
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_sink cs = tu_buf_sink(&cbf);
    fkvf_writer *w;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &cs, &o, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, (const uint8_t *)cbk + 64, cbsz - 64, 0),
                     FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
    /* the same archive (one commit of it) referring to it */
    fkvf_desc d;
    ck_assert_int_eq(fkvf_reader_desc(r, &d), FKVF_OK);
    d.model_id = d.tokenizer_id = NULL; /* owned by r */
    size_t rb = row_bytes(c);
    uint64_t N = x.N, A = x.A, S = c->S;
    uint8_t *rows = malloc(N * rb);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, N, c->dt, rows, N * rb), FKVF_OK);
    size_t ns = (size_t)c->L * c->H * (c->ks + c->vs);
    uint16_t *codes = malloc(A * ns * sizeof *codes);
    for (size_t j = 0; j < ns; j++) {
        uint32_t *sym = malloc(A * sizeof *sym);
        ck_assert_int_eq(fkvf_reader_stream_read(r, j, 0, sym, A), FKVF_OK);
        for (size_t t = 0; t < A; t++)
            codes[t * ns + j] = (uint16_t)sym[t];
        free(sym);
    }
    fkvf_reader_free(r);
    tu_buf af = {0};
    o.required_features = FKVF_FEAT_EXTERNAL_CODEBOOK;
    fkvf_sink as = tu_buf_sink(&af);
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &as, &o, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_exact(w, 0, S, rows, S * rb, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_exact(w, S + A, N - S - A, rows + (S + A) * rb,
                                           (N - S - A) * rb, 0),
                     FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_codebook_ref(w, &sh, hash, "cb"), FKVF_OK);
    fkvf_stream_spec sp = {FKVF_PROFILE_QUAD, c->bits, 0, 0, 0};
    ck_assert_int_eq(fkvf_writer_add_index_segment(w, &sp, 0, A, codes, ns, 1), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_positions(w, N, A), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
    free(codes);
    free(rows);

    fkvf_reader *cb;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, af.data, af.size, 0, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_open_memory(&cb, cbf.data, cbf.size, 0, NULL), FKVF_OK);
    static uint8_t buf[1 << 16];
    fkvf_read_request q = {0, S, 0, 0, 0, 0, 0, c->dt, FKVF_LAYOUT_ROWS};
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_OK);
    ck_assert_mem_eq(buf, x.ref[c->dt], S * rb);
    q.count = S + 1;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_E_CODEBOOK);
    /* a codebook file holds no cache */
    size_t sz;
    ck_assert_int_eq(fkvf_reader_read_size(cb, &q, &sz), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_reader_read(cb, &q, buf, sizeof buf), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_reader_attach_codebook(r, cb), FKVF_OK);
    q.first = 0;
    q.count = 20;
    ck_assert_int_eq(fkvf_reader_read(r, &q, buf, sizeof buf), FKVF_OK);
    ck_assert_mem_eq(buf, x.ref[c->dt], 20 * rb);
    /* the same codebook attached again from another copy of its file, the
     * first copy then freed and its bytes overwritten: reads use the new
     * copy's tables (the reader's table pointers into the first are dropped) */
    uint8_t *copy = malloc(cbf.size);
    memcpy(copy, cbf.data, cbf.size);
    fkvf_reader *cb2;
    ck_assert_int_eq(fkvf_reader_open_memory(&cb2, copy, cbf.size, 0, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_attach_codebook(r, cb2), FKVF_OK);
    fkvf_reader_free(cb);
    memset(cbf.data, 0x7C, cbf.size);
    for (uint64_t p = S; p < S + A; p += 7) {
        fkvf_read_request one = {p, 1, 0, 0, 0, 0, 0, c->dt, FKVF_LAYOUT_ROWS};
        ck_assert_int_eq(fkvf_reader_read(r, &one, buf, sizeof buf), FKVF_OK);
        ck_assert_mem_eq(buf, x.ref[c->dt] + p * rb, rb);
    }
    fkvf_reader_free(r);
    fkvf_reader_free(cb2);
    free(copy);
    tu_buf_free(&af);
    tu_buf_free(&cbf);
    fx_close(&x);
}
END_TEST

/* ---- allocation failures ------------------------------------------------------ */

START_TEST(read_allocation_failures)
{
    const cfg *c = &cfgs[_i];
    fx x;
    fx_open(&x, c);
    tu_alloc ta;
    fkvf_allocator a = tu_alloc_hook(&ta);
    fkvf_read_request q = {0, x.N, 0, 0, 0, 0, 0, FKVF_DTYPE_F32, FKVF_LAYOUT_HEADS};
    uint8_t *want;
    size_t n = expect(&x, &q, &want);
    uint8_t *got = malloc(n);
    int ok = 0, nomem = 0;
    for (long fail_at = 1; fail_at < 1000 && !ok; fail_at++) {
        memset(&ta, 0, sizeof ta);
        ta.fail_at = fail_at;
        fkvf_reader *r = NULL;
        int rc = fkvf_reader_open_memory(&r, x.file.data, x.file.size, 0, &a);
        if (rc == FKVF_OK) {
            rc = fkvf_reader_read(r, &q, got, n);
            if (rc == FKVF_E_NOMEM) /* the failure is not sticky */
                ck_assert_int_eq(fkvf_reader_read(r, &q, got, n), FKVF_OK);
        }
        ck_assert_msg(rc == FKVF_OK || rc == FKVF_E_NOMEM, "fail_at %ld: %s", fail_at,
                      fkvf_error_name(rc));
        nomem += rc == FKVF_E_NOMEM;
        ok = rc == FKVF_OK;
        if (ok)
            ck_assert_mem_eq(got, want, n);
        fkvf_reader_free(r);
    }
    ck_assert(ok);
    ck_assert_int_gt(nomem, 0);
    free(got);
    free(want);
    fx_close(&x);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("access");
    TCase *tc = tcase_create("access");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, read_matches_restore, 0, (int)N_CFGS);
    tcase_add_loop_test(tc, read_from_file, 0, 12);
    tcase_add_loop_test(tc, row_cache_budgets, 0, (int)N_CFGS);
    tcase_add_loop_test(tc, damaged_block_fails_only_its_reads, 0, (int)N_CFGS);
    tcase_add_loop_test(tc, symbol_out_of_codebook, 0, 2);
    tcase_add_test(tc, damaged_exact_section);
    tcase_add_test(tc, read_rejects_bad_arguments);
    tcase_add_test(tc, read_external_codebook);
    tcase_add_loop_test(tc, read_allocation_failures, 0, 2);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
