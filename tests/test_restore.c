/* fkvf_reader_restore: exact positions bit for bit, archived positions as the
 * quantizer decodes their codes (keys rotated back when archived before
 * RoPE), external codebooks, errors. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fkvf.h"
#include "quant/quant.h"
#include "testutil.h"

enum { L = 2, H = 2, D = 8, N = 40, S = 4, W = 16, A = N - S - W, K = 16, KS = 2, VS = 1 };
#define ROW_ELEMS (L * H * 2 * D)

typedef struct fixture {
    uint16_t rows[N][ROW_ELEMS]; /* f16 cache rows, spec 14.2 layout, little-endian */
    fkvf_rvq *q;
    uint16_t codes[A][L * H * (KS + VS)];
    fkvf_desc desc;
    fkvf_rope rope;
    tu_buf file;     /* the archive */
    tu_buf cbfile;   /* a codebook file (external variant) */
} fixture;

static void make_rows(fixture *f)
{
    tu_rng g = {42};
    for (int p = 0; p < N; p++)
        for (int e = 0; e < ROW_ELEMS; e++) {
            /* a few clusters plus noise, so that a small codebook fits */
            double c = (double)((e * 7 + (int)tu_below(&g, 3)) % 5) - 2.0;
            double x = c + ((double)tu_below(&g, 1000) / 1000.0 - 0.5) * 0.2;
            f->rows[p][e] = fkvf_f32_to_f16((float)x);
        }
    tu_le_u16(&f->rows[0][0], (size_t)N * ROW_ELEMS); /* the library's element order */
}

static void build(fixture *f, int external)
{
    memset(f, 0, sizeof *f);
    make_rows(f);
    f->rope.layout = 2;
    f->rope.rope_dims = D;
    f->rope.theta = 10000.0;
    fkvf_rvq_params prm;
    fkvf_rvq_params_init(&prm);
    prm.n_layers = L;
    prm.n_kv_heads = H;
    prm.key_dim = D;
    prm.value_dim = D;
    prm.k = K;
    prm.k_stages = KS;
    prm.v_stages = VS;
    prm.table_dtype = FKVF_DTYPE_F16;
    prm.key_rope = &f->rope;
    fkvf_rows all = {f->rows, N, FKVF_DTYPE_F16, 0};
    ck_assert_int_eq(fkvf_rvq_train(&f->q, &prm, &all, 1, NULL), FKVF_OK);
    fkvf_rows arch = {f->rows[S], A, FKVF_DTYPE_F16, S};
    ck_assert_int_eq(fkvf_rvq_encode(f->q, &arch, &f->rope, 1, &f->codes[0][0],
                                     L * H * (KS + VS), 1),
                     FKVF_OK);
    fkvf_codebook_shape shape;
    uint32_t heads;
    fkvf_rvq_shape(f->q, &shape, &heads);
    size_t tsz = fkvf_rvq_tables_size(f->q);
    void *tables = malloc(tsz);
    ck_assert_int_eq(fkvf_rvq_tables(f->q, tables, tsz), FKVF_OK);

    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    uint8_t hash[16];
    if (external) {
        /* codebook file first, then its hash */
        fkvf_sink cs = tu_buf_sink(&f->cbfile);
        fkvf_writer *cw;
        ck_assert_int_eq(fkvf_writer_create_sink(&cw, &cs, &o, NULL), FKVF_OK);
        ck_assert_int_eq(fkvf_writer_add_codebooks(cw, &shape, tables, tsz, 0), FKVF_OK);
        ck_assert_int_eq(fkvf_writer_finish(cw), FKVF_OK);
        fkvf_writer_free(cw);
        uint8_t *cb1 = malloc(64 + tsz);
        fkvf_reader *cr;
        ck_assert_int_eq(fkvf_reader_open_memory(&cr, f->cbfile.data, f->cbfile.size, 0, NULL),
                         FKVF_OK);
        ck_assert_int_eq(fkvf_reader_codebook(cr, NULL, NULL, NULL, hash), FKVF_OK);
        fkvf_reader_free(cr);
        free(cb1);
        o.required_features = FKVF_FEAT_EXTERNAL_CODEBOOK;
    }
    fkvf_sink sk = tu_buf_sink(&f->file);
    fkvf_writer *w;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sk, &o, NULL), FKVF_OK);
    fkvf_desc *d = &f->desc;
    d->n_layers = L;
    d->n_kv_heads = H;
    d->key_dim = D;
    d->value_dim = D;
    d->dtype = FKVF_DTYPE_F16;
    d->key_transform = 1;
    d->rope_layout = 2;
    d->key_storage = 1;
    d->rope_dims = D;
    d->rope_theta = 10000.0;
    d->n_sinks = S;
    d->window = W;
    ck_assert_int_eq(fkvf_writer_set_desc(w, d), FKVF_OK);
    size_t rb = sizeof f->rows[0];
    ck_assert_int_eq(fkvf_writer_add_exact(w, 0, S, f->rows[0], S * rb, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_exact(w, S + A, W, f->rows[S + A], W * rb, 0), FKVF_OK);
    if (external)
        ck_assert_int_eq(fkvf_writer_add_codebook_ref(w, &shape, hash, "cb.fkvf"), FKVF_OK);
    else
        ck_assert_int_eq(fkvf_writer_add_codebooks(w, &shape, tables, tsz, 0), FKVF_OK);
    free(tables);
    /* one segment of every index stream: the codes are in the canonical
     * stream order (spec 11.2), one row per position */
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.profile = FKVF_PROFILE_QUAD;
    sp.symbol_bits = 4;
    ck_assert_int_eq(fkvf_writer_add_index_segment(w, &sp, 0, A, &f->codes[0][0],
                                                   L * H * (KS + VS), 1),
                     FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_positions(w, N, A), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
}

static void done(fixture *f)
{
    fkvf_rvq_free(f->q);
    tu_buf_free(&f->file);
    tu_buf_free(&f->cbfile);
}

static fixture fx;

START_TEST(restore_embedded_f16)
{
    build(&fx, 0);
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, fx.file.data, fx.file.size, 0, NULL), FKVF_OK);
    size_t rb;
    ck_assert_int_eq(fkvf_reader_row_bytes(r, FKVF_DTYPE_F16, &rb), FKVF_OK);
    ck_assert_uint_eq(rb, sizeof fx.rows[0]);
    static uint16_t out[N][ROW_ELEMS];
    ck_assert_int_eq(fkvf_reader_restore(r, 0, N, FKVF_DTYPE_F16, out, sizeof out), FKVF_OK);
    /* exact positions: the original bits */
    for (int p = 0; p < N; p++)
        if (p < S || p >= S + A)
            ck_assert_mem_eq(out[p], fx.rows[p], rb);
    /* archived positions: exactly what the quantizer decodes from the codes */
    static uint16_t want[A][ROW_ELEMS];
    ck_assert_int_eq(fkvf_rvq_decode(fx.q, &fx.codes[0][0], L * H * (KS + VS), 1, A, S, &fx.rope,
                                     FKVF_DTYPE_F16, want, sizeof want),
                     FKVF_OK);
    ck_assert_mem_eq(out[S], want, sizeof want);
    /* and they approximate the originals: relative error well below 1 */
    double err = 0, ref = 0;
    for (int p = S; p < S + A; p++)
        for (int e = 0; e < ROW_ELEMS; e++) {
            double a = fkvf_f16_to_f32(tu_ld16le(&fx.rows[p][e]));
            double b = fkvf_f16_to_f32(tu_ld16le(&out[p][e]));
            err += (a - b) * (a - b);
            ref += a * a;
        }
    /* (an all-zero reconstruction would score 1.0; k = 16 with 2 + 1 stages
     * on this data gives about 0.08) */
    ck_assert_msg(err / ref < 0.25, "relative MSE %g", err / ref);
    /* a sub-range crossing the exact/archived border gives the same rows */
    static uint16_t part[10][ROW_ELEMS];
    ck_assert_int_eq(fkvf_reader_restore(r, S + A - 5, 10, FKVF_DTYPE_F16, part, sizeof part),
                     FKVF_OK);
    ck_assert_mem_eq(part, out[S + A - 5], sizeof part);
    fkvf_reader_free(r);
    done(&fx);
}
END_TEST

START_TEST(restore_converts_dtype)
{
    build(&fx, 0);
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, fx.file.data, fx.file.size, 0, NULL), FKVF_OK);
    static uint16_t h[N][ROW_ELEMS];
    static float f32[N][ROW_ELEMS];
    ck_assert_int_eq(fkvf_reader_restore(r, 0, N, FKVF_DTYPE_F16, h, sizeof h), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, N, FKVF_DTYPE_F32, f32, sizeof f32), FKVF_OK);
    for (int p = 0; p < N; p++)
        for (int e = 0; e < ROW_ELEMS; e++) {
            /* both outputs are little-endian element arrays */
            const float x = tu_ldf32le(&f32[p][e]);
            const uint16_t y = tu_ld16le(&h[p][e]);
            if (p < S || p >= S + A) /* exact: f16 -> f32 is exact */
                ck_assert(x == fkvf_f16_to_f32(y));
            else /* archived: f16 output is the f32 result rounded once */
                ck_assert_uint_eq(fkvf_f32_to_f16(x), y);
        }
    fkvf_reader_free(r);
    done(&fx);
}
END_TEST

START_TEST(restore_external_codebook)
{
    build(&fx, 1);
    fkvf_reader *r, *cb;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, fx.file.data, fx.file.size, 0, NULL), FKVF_OK);
    static uint16_t out[N][ROW_ELEMS];
    /* exact positions need no codebook */
    ck_assert_int_eq(fkvf_reader_restore(r, 0, S, FKVF_DTYPE_F16, out, sizeof out), FKVF_OK);
    ck_assert_mem_eq(out[0], fx.rows[0], S * sizeof fx.rows[0]);
    /* archived ones do */
    ck_assert_int_eq(fkvf_reader_restore(r, 0, N, FKVF_DTYPE_F16, out, sizeof out),
                     FKVF_E_CODEBOOK);
    ck_assert_ptr_nonnull(strstr(fkvf_reader_message(r), "not attached"));
    ck_assert_int_eq(fkvf_reader_open_memory(&cb, fx.cbfile.data, fx.cbfile.size, 0, NULL),
                     FKVF_OK);
    ck_assert_int_eq(fkvf_reader_attach_codebook(r, cb), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, N, FKVF_DTYPE_F16, out, sizeof out), FKVF_OK);
    static uint16_t want[A][ROW_ELEMS];
    ck_assert_int_eq(fkvf_rvq_decode(fx.q, &fx.codes[0][0], L * H * (KS + VS), 1, A, S, &fx.rope,
                                     FKVF_DTYPE_F16, want, sizeof want),
                     FKVF_OK);
    ck_assert_mem_eq(out[S], want, sizeof want);
    ck_assert_mem_eq(out[S + A], fx.rows[S + A], W * sizeof fx.rows[0]);
    fkvf_reader_free(r);
    fkvf_reader_free(cb);
    done(&fx);
}
END_TEST

START_TEST(restore_rejects_bad_arguments)
{
    build(&fx, 0);
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, fx.file.data, fx.file.size, 0, NULL), FKVF_OK);
    static uint16_t out[N][ROW_ELEMS];
    ck_assert_int_eq(fkvf_reader_restore(r, N, 1, FKVF_DTYPE_F16, out, sizeof out), FKVF_E_RANGE);
    ck_assert_int_eq(fkvf_reader_restore(r, 1, N, FKVF_DTYPE_F16, out, sizeof out), FKVF_E_RANGE);
    ck_assert_int_eq(fkvf_reader_restore(r, UINT64_MAX, 2, FKVF_DTYPE_F16, out, sizeof out),
                     FKVF_E_RANGE);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, 2, FKVF_DTYPE_F16, out, sizeof out[0]),
                     FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, 1, (fkvf_dtype)9, out, sizeof out),
                     FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, 0, FKVF_DTYPE_F16, NULL, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_restore(NULL, 0, 1, FKVF_DTYPE_F16, out, sizeof out),
                     FKVF_E_STATE);
    fkvf_reader_free(r);
    done(&fx);
}
END_TEST

/* Allocation failure at every step of open + restore: NOMEM or success,
 * never a leak (the sanitizer build checks leaks). */
START_TEST(restore_allocation_failures)
{
    build(&fx, 0);
    tu_alloc ta;
    fkvf_allocator a = tu_alloc_hook(&ta);
    static uint16_t out[N][ROW_ELEMS];
    int ok = 0;
    for (long fail_at = 1; fail_at < 500 && !ok; fail_at++) {
        memset(&ta, 0, sizeof ta);
        ta.fail_at = fail_at;
        fkvf_reader *r = NULL;
        int rc = fkvf_reader_open_memory(&r, fx.file.data, fx.file.size, 0, &a);
        if (rc == FKVF_OK)
            rc = fkvf_reader_restore(r, 0, N, FKVF_DTYPE_F16, out, sizeof out);
        ck_assert_msg(rc == FKVF_OK || rc == FKVF_E_NOMEM, "fail_at %ld: %s", fail_at,
                      fkvf_error_name(rc));
        ok = rc == FKVF_OK;
        fkvf_reader_free(r);
    }
    ck_assert(ok);
    done(&fx);
}
END_TEST

/* A codebook with zero stages: its index group would have no streams, and
 * a group needs at least one stage (spec 11.2), so archived positions need
 * index streams it cannot have (spec 11.8): the writer refuses them. With
 * every position exact such an archive restores with an allocator that
 * returns NULL for zero bytes (restore used to ask for zero bytes of codes). */
START_TEST(restore_zero_stage_codebook)
{
    enum { NP = 6, NS = 1, NA = 4 };
    static uint16_t rows[NP][ROW_ELEMS];
    for (int p = 0; p < NP; p++)
        for (int e = 0; e < ROW_ELEMS; e++)
            rows[p][e] = fkvf_f32_to_f16((float)(p + 1));
    tu_le_u16(&rows[0][0], (size_t)NP * ROW_ELEMS); /* rows are little-endian bytes */
    fkvf_codebook_shape shape = {L, H, D, D, 16, 0, 0, FKVF_DTYPE_F16, 0, NULL};
    tu_buf buf = {0};
    fkvf_sink sk = tu_buf_sink(&buf);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_writer *w;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sk, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = L;
    d.n_kv_heads = H;
    d.key_dim = D;
    d.value_dim = D;
    d.dtype = FKVF_DTYPE_F16;
    d.n_sinks = NS;
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    size_t rb = sizeof rows[0];
    ck_assert_int_eq(fkvf_writer_add_exact(w, 0, NS, rows[0], NS * rb, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_exact(w, NS + NA, NP - NS - NA, rows[NS + NA],
                                           (NP - NS - NA) * rb, 0),
                     FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &shape, NULL, 0, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_positions(w, NP, NA), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_E_STATE);
    ck_assert_msg(strstr(fkvf_writer_message(w), "index streams") != NULL, "%s",
                  fkvf_writer_message(w));
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.profile = FKVF_PROFILE_QUAD;
    sp.symbol_bits = 4;
    static const uint16_t none[1];
    ck_assert_int_eq(fkvf_writer_add_index_segment(w, &sp, 0, 0, none, 1, 1),
                     FKVF_E_INVALID_ARG);
    /* the positions exact instead */
    ck_assert_int_eq(fkvf_writer_add_exact(w, NS, NA, rows[NS], NA * rb, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_positions(w, NP, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);

    tu_alloc ta = {.zero_null = 1};
    fkvf_allocator a = tu_alloc_hook(&ta);
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, buf.data, buf.size, 0, &a), FKVF_OK);
    static uint16_t out[NP][ROW_ELEMS];
    memset(out, 0xFF, sizeof out);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, NP, FKVF_DTYPE_F16, out, sizeof out), FKVF_OK);
    for (int p = 0; p < NP; p++)
        for (int e = 0; e < ROW_ELEMS; e++)
            ck_assert_uint_eq(out[p][e], rows[p][e]);
    fkvf_codebook_shape got;
    ck_assert_int_eq(fkvf_reader_codebook(r, &got, NULL, NULL, NULL), FKVF_OK);
    ck_assert_uint_eq(got.k_stages + got.v_stages, 0);
    fkvf_reader_free(r);
    tu_buf_free(&buf);
}
END_TEST

/* Restore in batches: 1024 index streams (4 layers x 8 heads x 16 + 16
 * stages), so that a batch's codes (4 MiB) hold 2048 positions and 2100
 * archived positions take two; random f16 tables and codes, keys before
 * RoPE. Every position of every call, whatever its range (the whole
 * archive, across the sink / archived / window borders and the batch edge,
 * single rows, runs on either side of 64 rows), in f16, bf16 and f32, is
 * exactly the exact row converted or the portable decoder's row of that
 * position. */
enum { BL = 4, BH = 8, BD = 8, BK = 16, BKS = 16, BVS = 16, BS = 4, BW = 8, BA = 2100,
       BN = BS + BA + BW };
#define BNC (BL * BH * (BKS + BVS))
#define BRE (BL * BH * 2 * BD)

START_TEST(restore_batches_match_portable_decode)
{
    tu_rng g = {2026};
    fkvf_codebook_shape sh = {BL, BH, BD, BD, BK, BKS, BVS, FKVF_DTYPE_F16, 0, NULL};
    size_t nt = (size_t)BL * BH * BK * (BKS + BVS) * BD;
    uint16_t *tab = tu_xcalloc(nt, sizeof(uint16_t));
    for (size_t i = 0; i < nt; i++)
        tab[i] = fkvf_f32_to_f16((float)((double)tu_below(&g, 20001) / 5000.0 - 2.0));
    tu_le_u16(tab, nt); /* codebook tables are little-endian bytes */
    uint16_t *codes = tu_xcalloc((size_t)BA * BNC, sizeof(uint16_t));
    for (size_t i = 0; i < (size_t)BA * BNC; i++)
        codes[i] = (uint16_t)tu_below(&g, BK);
    uint16_t *rows = tu_xcalloc((size_t)BN * BRE, sizeof(uint16_t));
    for (size_t i = 0; i < (size_t)BN * BRE; i++)
        rows[i] = fkvf_f32_to_f16((float)((double)tu_below(&g, 2001) / 500.0 - 2.0));
    tu_le_u16(rows, (size_t)BN * BRE); /* and so are rows */
    const size_t rb = (size_t)BRE * 2;

    tu_buf file = {0};
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_sink sk = tu_buf_sink(&file);
    fkvf_writer *w;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sk, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = BL;
    d.n_kv_heads = BH;
    d.key_dim = d.value_dim = BD;
    d.dtype = FKVF_DTYPE_F16;
    d.key_transform = 1;
    d.rope_layout = 2;
    d.key_storage = 1;
    d.rope_dims = BD;
    d.rope_theta = 10000.0;
    d.n_sinks = BS;
    d.window = BW;
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_exact(w, 0, BS, rows, BS * rb, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_exact(w, BS + BA, BW, rows + (size_t)(BS + BA) * BRE,
                                           BW * rb, 0),
                     FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, tab, nt * sizeof(uint16_t), 0), FKVF_OK);
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.profile = FKVF_PROFILE_QUAD;
    sp.symbol_bits = 4;
    ck_assert_int_eq(fkvf_writer_add_index_segment(w, &sp, 0, BA, codes, BNC, 1), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_positions(w, BN, BA), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);

    fkvf_rvq *q;
    ck_assert_int_eq(fkvf_rvq_from_tables_decode(&q, &sh, BH, tab, nt * sizeof(uint16_t), NULL),
                     FKVF_OK);
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, file.data, file.size, 0, NULL), FKVF_OK);
    const fkvf_rope rope = {2, BD, 10000.0};
    const fkvf_dtype dts[3] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16, FKVF_DTYPE_F32};
    static const uint64_t ranges[][2] = {
        {0, BN},         {BS - 1, 2050}, {BS + 2047, 3},  {BS, 1},         {BS + 2048, 1},
        {BS + BA - 1, 1}, {BS + 10, 63},  {BS + 100, 64}, {BS + 1000, 65}, {BS + BA - 60, 65},
        {0, BS + 7},
    };
    uint8_t *want = tu_xcalloc((size_t)BN * BRE, 4), *got = tu_xcalloc((size_t)BN * BRE, 4);
    for (int di = 0; di < 3; di++) {
        const fkvf_dtype dt = dts[di];
        const size_t es = dt == FKVF_DTYPE_F32 ? 4 : 2, orb = (size_t)BRE * es;
        /* the reference: exact rows converted, archived rows decoded */
        ck_assert_int_eq(fkvf_convert(dt, want, FKVF_DTYPE_F16, rows, (size_t)BS * BRE), FKVF_OK);
        ck_assert_int_eq(fkvfq_rvq_decode_portable(q, codes, BNC, 1, BA, BS, &rope, dt,
                                                   want + BS * orb, (size_t)BA * orb),
                         FKVF_OK);
        ck_assert_int_eq(fkvf_convert(dt, want + (size_t)(BS + BA) * orb, FKVF_DTYPE_F16,
                                      rows + (size_t)(BS + BA) * BRE, (size_t)BW * BRE),
                         FKVF_OK);
        for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
            uint64_t first = ranges[ri][0], count = ranges[ri][1];
            memset(got, 0xA5, (size_t)BN * orb);
            ck_assert_int_eq(fkvf_reader_restore(r, first, count, dt, got, count * orb),
                             FKVF_OK);
            EXPECTF(memcmp(got, want + first * orb, count * orb) == 0,
                    "dtype %d positions [%llu, +%llu) differ", (int)dt,
                    (unsigned long long)first, (unsigned long long)count);
        }
    }
    free(want);
    free(got);
    fkvf_reader_free(r);
    fkvf_rvq_free(q);
    tu_buf_free(&file);
    free(tab);
    free(codes);
    free(rows);
}
END_TEST

/* Restore of an f16 codebook decodes from the f16 tables in place when the
 * CPU has fkvf_rvq_decode's f16 kernel (fkvfq_decode16_available): every
 * position of every range (all, single rows, runs below and above 64 rows)
 * in f16, bf16 and f32 equals the portable decoder's row over a binary32
 * handle of the same tables (exact rows: converted), for shapes with
 * pooled tables, several and one kv heads (GQA caches share one kv head
 * among query heads: the decoder only sees n_kv_heads), odd and unequal
 * dims, k = 16, 16 stages or none, RoPE off, interleaved and half-split,
 * whole 8-lane blocks or not (the test of the allocations below proves
 * which path ran). */
typedef struct f16case {
    uint32_t l, h, dk, dv, k;
    uint8_t ks, vs, pooled;
    uint8_t rope_layout; /* 0: keys as cached */
    uint32_t rope_dims;
    uint32_t n_arch;
} f16case;

static void f16_direct_case(const f16case *c, uint64_t seed, size_t *peak)
{
    tu_rng g = {seed};
    const uint32_t tabs = c->l * (c->pooled ? 1 : c->h);
    fkvf_codebook_shape sh = {c->l, c->pooled ? 1 : c->h, c->dk, c->dv, c->k,
                              c->ks, c->vs, FKVF_DTYPE_F16, c->pooled, NULL};
    const size_t nt = (size_t)tabs * c->k * ((size_t)c->ks * c->dk + (size_t)c->vs * c->dv);
    uint16_t *tab = tu_xcalloc(nt ? nt : 1, sizeof(uint16_t));
    for (size_t i = 0; i < nt; i++) /* f16 values over a wide range, subnormals and -0 too */
        tab[i] = (uint16_t)(tu_below(&g, 4) == 0 ? tu_below(&g, 0x400) | 0x8000u * tu_below(&g, 2)
                                                 : fkvf_f32_to_f16((float)((double)tu_below(&g, 40001) / 1000.0 - 20.0)));
    tu_le_u16(tab, nt); /* codebook tables are little-endian bytes */
    const size_t nc = (size_t)c->l * c->h * (c->ks + c->vs);
    const size_t re = (size_t)c->l * c->h * (c->dk + c->dv);
    const uint64_t fS = 2, fW = 3, fA = c->n_arch, fN = fS + fA + fW;
    uint16_t *codes = tu_xcalloc(fA * nc + 1, sizeof(uint16_t));
    for (size_t i = 0; i < fA * nc; i++)
        codes[i] = (uint16_t)tu_below(&g, c->k);
    uint16_t *rows = tu_xcalloc(fN * re, sizeof(uint16_t));
    for (size_t i = 0; i < fN * re; i++)
        rows[i] = fkvf_f32_to_f16((float)((double)tu_below(&g, 2001) / 500.0 - 2.0));
    tu_le_u16(rows, fN * re); /* and so are rows */
    const size_t rb = re * 2;

    tu_buf file = {0};
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_sink sk = tu_buf_sink(&file);
    fkvf_writer *w;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sk, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = c->l;
    d.n_kv_heads = c->h;
    d.key_dim = c->dk;
    d.value_dim = c->dv;
    d.dtype = FKVF_DTYPE_F16;
    if (c->rope_layout) {
        d.key_transform = 1;
        d.rope_layout = c->rope_layout;
        d.key_storage = 1;
        d.rope_dims = c->rope_dims;
        d.rope_theta = 10000.0;
    }
    d.n_sinks = fS;
    d.window = fW;
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_exact(w, 0, fS, rows, fS * rb, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_exact(w, fS + fA, fW, rows + (fS + fA) * re, fW * rb, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, tab, nt * sizeof(uint16_t), 0), FKVF_OK);
    if (nc) {
        fkvf_stream_spec sp;
        memset(&sp, 0, sizeof sp);
        sp.profile = FKVF_PROFILE_QUAD;
        while ((1u << sp.symbol_bits) < c->k) /* quad: an even width */
            sp.symbol_bits += 2;
        ck_assert_int_eq(fkvf_writer_add_index_segment(w, &sp, 0, fA, codes, nc, 1), FKVF_OK);
    }
    ck_assert_int_eq(fkvf_writer_set_positions(w, fN, nc ? fA : 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);

    fkvf_rvq *q;
    ck_assert_int_eq(fkvf_rvq_from_tables_decode(&q, &sh, c->h, tab, nt * sizeof(uint16_t), NULL),
                     FKVF_OK);
    tu_alloc ta = {0};
    fkvf_allocator al = tu_alloc_hook(&ta);
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, file.data, file.size, 0, &al), FKVF_OK);
    const fkvf_rope rope = {c->rope_layout, c->rope_dims, 10000.0};
    const fkvf_dtype dts[3] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16, FKVF_DTYPE_F32};
    const uint64_t ranges[][2] = {{0, fN},     {fS, 1},      {fS + 5, 63}, {fS + 1, 64},
                                  {fS + 7, 65}, {fS + fA - 1, 1}, {1, fA + 2}};
    uint8_t *want = tu_xcalloc(fN * re, 4), *got = tu_xcalloc(fN * re, 4);
    for (int di = 0; di < 3; di++) {
        const fkvf_dtype dt = dts[di];
        const size_t es = dt == FKVF_DTYPE_F32 ? 4 : 2, orb = re * es;
        ck_assert_int_eq(fkvf_convert(dt, want, FKVF_DTYPE_F16, rows, fS * re), FKVF_OK);
        if (nc)
            ck_assert_int_eq(fkvfq_rvq_decode_portable(q, codes, nc, 1, fA, fS,
                                                       c->rope_layout ? &rope : NULL, dt,
                                                       want + fS * orb, fA * orb),
                             FKVF_OK);
        else
            ck_assert_int_eq(fkvf_convert(dt, want + fS * orb, FKVF_DTYPE_F16, rows + fS * re,
                                          fA * re),
                             FKVF_OK);
        ck_assert_int_eq(fkvf_convert(dt, want + (fS + fA) * orb, FKVF_DTYPE_F16,
                                      rows + (fS + fA) * re, fW * re),
                         FKVF_OK);
        for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
            uint64_t first = ranges[ri][0], count = ranges[ri][1];
            if (first + count > fN)
                continue;
            memset(got, 0xA5, fN * orb);
            ck_assert_int_eq(fkvf_reader_restore(r, first, count, dt, got, count * orb),
                             FKVF_OK);
            EXPECTF(memcmp(got, want + first * orb, count * orb) == 0,
                    "shape %ux%ux%u/%u k %u stages %u+%u pooled %u rope %u/%u: dtype %d "
                    "positions [%llu, +%llu) differ",
                    c->l, c->h, c->dk, c->dv, c->k, c->ks, c->vs, c->pooled, c->rope_layout,
                    c->rope_dims, (int)dt, (unsigned long long)first,
                    (unsigned long long)count);
        }
    }
    if (peak)
        *peak = ta.peak;
    free(want);
    free(got);
    fkvf_reader_free(r);
    ck_assert_uint_eq(ta.bytes, 0);
    fkvf_rvq_free(q);
    tu_buf_free(&file);
    free(tab);
    free(codes);
    free(rows);
}

START_TEST(restore_f16_direct_matches_portable_decode)
{
    static const f16case cases[] = {
        /* l  h  dk  dv   k  ks vs pooled rope rd  n_arch */
        {2, 3, 16, 16, 16, 16, 2, 0, 2, 16, 150},  /* k = 16, 16 stages, half-split blocks */
        {3, 2, 7, 12, 32, 2, 3, 0, 1, 6, 130},     /* odd key dim, interleaved not whole blocks */
        {2, 4, 24, 8, 64, 3, 1, 1, 1, 24, 140},    /* pooled, interleaved whole blocks */
        {1, 1, 40, 33, 16, 1, 1, 0, 2, 20, 100},   /* one kv head, half-split not whole */
        {2, 2, 9, 9, 256, 2, 2, 0, 0, 0, 200},     /* keys as cached, k = 256, odd dims */
        {2, 3, 8, 16, 16, 4, 0, 1, 2, 8, 90},      /* pooled, no value stages */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        f16_direct_case(&cases[i], 7000 + i, NULL);
}
END_TEST

/* A reader restoring with an f16 codebook (2 layers x 4 heads, k = 256,
 * dims 64, 2 + 2 stages: 1 MiB of f16 tables, 2 MiB as binary32) on a CPU
 * with the f16 kernel allocates, at its peak, less than the f16 tables' size
 * (counting allocator, the archive in the caller's memory): neither a
 * binary32 copy nor an f16 copy of the tables is made, and the restore is
 * still the portable decoder's. Without the kernel the binary32 tables are
 * built (the peak is above their size): the fallback path. */
START_TEST(restore_f16_codebook_allocates_no_binary32_tables)
{
    const f16case c = {2, 4, 64, 64, 256, 2, 2, 0, 2, 64, 100};
    const size_t n16 = (size_t)2 * 4 * 256 * (2 * 64 + 2 * 64) * sizeof(uint16_t);
    size_t peak = 0;
    f16_direct_case(&c, 99, &peak);
    if (fkvfq_decode16_available())
        EXPECTF(peak < n16, "peak %zu bytes, the f16 tables %zu", peak, n16);
    else
        EXPECTF(peak >= 2 * n16, "peak %zu bytes, the binary32 tables %zu", peak, 2 * n16);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("restore");
    TCase *tc = tcase_create("restore");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, restore_embedded_f16);
    tcase_add_test(tc, restore_converts_dtype);
    tcase_add_test(tc, restore_external_codebook);
    tcase_add_test(tc, restore_rejects_bad_arguments);
    tcase_add_test(tc, restore_allocation_failures);
    tcase_add_test(tc, restore_zero_stage_codebook);
    tcase_add_test(tc, restore_batches_match_portable_decode);
    tcase_add_test(tc, restore_f16_direct_matches_portable_decode);
    tcase_add_test(tc, restore_f16_codebook_allocates_no_binary32_tables);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
