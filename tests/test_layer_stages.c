/* Codebooks with stage counts per layer (format 1.1, spec 13.1 layer table,
 * feature LAYER_STAGES): the layout formulas against the spec's, worked by
 * hand; a per-layer quantizer against the uniform one it must equal layer by
 * layer (training, greedy and beam encoding, decoding, tables, subsets);
 * archives written by the appender (embedded codebook, reopened, compacted)
 * and with an external codebook file, read back against the quantizer; the
 * writer's and the reader's refusals, on codebook files crafted byte by
 * byte. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "container_model.h"
#include "fkvf.h"
#include "testutil.h"

#define L 4
#define H 2
#define D 8
#define K 16
#define ROW_ELEMS (L * H * 2 * D)
#define ROW_BYTES (ROW_ELEMS * 2)
#define SINKS 2
#define WINDOW 3

/* key and value stages of layers 0..3: a layer without key stages and a
 * layer without any (the maxima 2 and 2) */
static const uint8_t pairs[2 * L] = {2, 1, 0, 1, 0, 0, 1, 2};
/* codes a position: n_kv_heads * (3 + 1 + 0 + 3) */
#define CPP (H * 7)

static char tmpdir[64];

static void make_dir(void) { tu_tmpdir_make(tmpdir, sizeof tmpdir, "layers"); }
static void path_in(char *out, size_t n, const char *name) { tu_tmp_path(out, n, tmpdir, name); }
static void rm_dir(void) { tu_tmpdir_remove(tmpdir); }

/* f16 rows of positions [first, first+n), deterministic per position, as
 * the library takes them: little-endian elements (fkvf_rows) */
static void gen_rows(uint16_t *out, uint64_t first, size_t n)
{
    tu_f16_rows(out, first, n, ROW_ELEMS, 11);
}

static void params(fkvf_rvq_params *p, const uint8_t *table)
{
    fkvf_rvq_params_init(p);
    p->n_layers = L;
    p->n_kv_heads = H;
    p->key_dim = p->value_dim = D;
    p->k = K;
    p->k_stages = 2;
    p->v_stages = 2;
    p->max_iters = 4;
    p->seed = 5;
    p->layer_stages = table;
}

/* the per-layer quantizer (table = pairs) or the uniform one of the maxima */
static fkvf_rvq *train(const uint8_t *table)
{
    enum { NT = 96 };
    uint16_t *rows = malloc((size_t)NT * ROW_BYTES);
    ck_assert_ptr_nonnull(rows);
    gen_rows(rows, 7000, NT);
    fkvf_rvq_params p;
    params(&p, table);
    fkvf_rows blk = {rows, NT, FKVF_DTYPE_F16, 0};
    fkvf_rvq *q = NULL;
    ck_assert_int_eq(fkvf_rvq_train(&q, &p, &blk, 1, NULL), FKVF_OK);
    free(rows);
    return q;
}

/* ---- layout (spec 11.2, 13.1, 13.2) ----------------------------------------- */

/* The example of the spec's formulas worked by hand: 3 layers with (2, 1),
 * (0, 1), (0, 0) stages, 2 KV heads, k = 16, dims 4, f16 tables.
 *   T = align64(2 * 3) = 64; per_head = 16 * (ks * 4 + vs * 4) * 2 bytes:
 *   384, 128, 0; size = 64 + 64 + 2 * (384 + 128) = 1152; tables at 128.
 *   m = 3, 1, 0; P = 0, 6, 8, 8: 8 index streams. */
START_TEST(layout_worked_example)
{
    static const uint8_t t3[6] = {2, 1, 0, 1, 0, 0};
    fkvf_codebook_shape s = {3, 2, 4, 4, 16, 2, 1, FKVF_DTYPE_F16, 0, t3};
    ck_assert_uint_eq(fkvf_codebook_size(&s), 1152);
    ck_assert_uint_eq(fkvf_codebook_tables_offset(&s), 128);
    ck_assert_uint_eq(fkvf_index_stream_count(&s, 2), 8);
    /* j -> (layer, head, kv, stage) */
    static const unsigned want[8][4] = {{0, 0, 0, 0}, {0, 0, 0, 1}, {0, 0, 1, 0}, {0, 1, 0, 0},
                                        {0, 1, 0, 1}, {0, 1, 1, 0}, {1, 0, 1, 0}, {1, 1, 1, 0}};
    for (unsigned j = 0; j < 8; j++) {
        uint64_t id = FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, want[j][0], want[j][1], want[j][2],
                                     want[j][3]);
        ck_assert_uint_eq(fkvf_index_stream_id_shape(&s, 2, j), id);
        ck_assert_uint_eq(fkvf_index_stream_ord(&s, 2, want[j][0], want[j][1], want[j][2],
                                                want[j][3]),
                          j);
    }
    ck_assert_uint_eq(fkvf_index_stream_id_shape(&s, 2, 8), UINT64_MAX);
    /* streams that do not exist */
    ck_assert_uint_eq(fkvf_index_stream_ord(&s, 2, 1, 0, 0, 0), UINT64_MAX); /* no key stage */
    ck_assert_uint_eq(fkvf_index_stream_ord(&s, 2, 2, 0, 1, 0), UINT64_MAX); /* no stage */
    ck_assert_uint_eq(fkvf_index_stream_ord(&s, 2, 0, 0, 1, 1), UINT64_MAX);
    ck_assert_uint_eq(fkvf_index_stream_ord(&s, 2, 0, 2, 0, 0), UINT64_MAX); /* head */
    ck_assert_uint_eq(fkvf_index_stream_ord(&s, 2, 3, 0, 0, 0), UINT64_MAX); /* layer */
    /* the uniform shape: the formulas of version 1.0 */
    fkvf_codebook_shape u = {3, 2, 4, 4, 16, 2, 1, FKVF_DTYPE_F16, 0, NULL};
    ck_assert_uint_eq(fkvf_codebook_size(&u), 64 + 3 * 2 * 16 * 12 * 2);
    ck_assert_uint_eq(fkvf_codebook_tables_offset(&u), 64);
    ck_assert_uint_eq(fkvf_index_stream_count(&u, 2), 18);
    for (unsigned j = 0; j < 18; j++)
        ck_assert_uint_eq(fkvf_index_stream_id_shape(&u, 2, j),
                          fkvf_index_stream_id(3, 2, 2, 1, j));
    /* tables the spec does not allow: a count above 16, maxima not the
     * header's counts */
    uint8_t bad[6] = {2, 1, 0, 1, 0, 0};
    s.layer_stages = bad;
    bad[5] = 17;
    s.v_stages = 17;
    ck_assert_uint_eq(fkvf_codebook_size(&s), 0);
    bad[5] = 0;
    s.v_stages = 1;
    s.k_stages = 3; /* the largest key count is 2 */
    ck_assert_uint_eq(fkvf_codebook_size(&s), 0);
    ck_assert_uint_eq(fkvf_codebook_tables_offset(&s), 0);
    ck_assert_uint_eq(fkvf_index_stream_count(&s, 2), 0);
    /* a pooled codebook with a table: 1024 layers (a table of 2048 bytes) */
    uint8_t *big = calloc(2048, 1);
    ck_assert_ptr_nonnull(big);
    big[2 * 1023] = 1; /* only the last layer has a key stage */
    fkvf_codebook_shape p = {1024, 1, 2, 2, 16, 1, 0, FKVF_DTYPE_F32, 1, big};
    ck_assert_uint_eq(fkvf_codebook_size(&p), 64 + 2048 + 16 * 2 * 4);
    ck_assert_uint_eq(fkvf_index_stream_count(&p, 3), 3);
    ck_assert_uint_eq(fkvf_index_stream_id_shape(&p, 3, 2),
                      FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, 1023, 2, 0, 0));
    free(big);
}
END_TEST

/* ---- the quantizer ------------------------------------------------------------ */

/* Each layer of the per-layer quantizer is the uniform quantizer of the
 * maxima cut to that layer's counts (fkvf_rvq_subset): the same centroids,
 * the same codes (greedy and beam), the same decoded rows. */
START_TEST(rvq_layers_equal_uniform_subsets)
{
    fkvf_rvq *ql = train(pairs), *qu = train(NULL);
    fkvf_codebook_shape sh;
    uint32_t heads;
    fkvf_rvq_shape(ql, &sh, &heads);
    ck_assert_ptr_nonnull(sh.layer_stages);
    ck_assert(!memcmp(sh.layer_stages, pairs, sizeof pairs));
    ck_assert_uint_eq(sh.k_stages, 2);
    ck_assert_uint_eq(sh.v_stages, 2);
    ck_assert_uint_eq(fkvf_rvq_codes_per_position(ql), CPP);
    ck_assert_uint_eq(fkvf_rvq_tables_size(ql), fkvf_codebook_size(&sh) - 128);
    /* the centroids a layer has are the uniform training's */
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t h = 0; h < H; h++)
            for (unsigned kv = 0; kv < 2; kv++)
                for (unsigned s = 0; s < 3; s++) {
                    const float *a = fkvf_rvq_centroids(ql, l, h, kv, s);
                    if (s >= pairs[2 * l + kv]) {
                        ck_assert_ptr_null(a);
                        continue;
                    }
                    const float *b = fkvf_rvq_centroids(qu, l, h, kv, s);
                    ck_assert_ptr_nonnull(a);
                    ck_assert(!memcmp(a, b, (size_t)K * D * sizeof(float)));
                }
    enum { N = 40 };
    uint16_t *rows = malloc((size_t)N * ROW_BYTES);
    uint16_t *codes = malloc((size_t)N * CPP * 2), *uc = malloc((size_t)N * H * 4 * 2 * L);
    uint16_t *dec = malloc((size_t)N * ROW_BYTES), *udec = malloc((size_t)N * ROW_BYTES);
    ck_assert(rows && codes && uc && dec && udec);
    gen_rows(rows, 123, N);
    fkvf_rows in = {rows, N, FKVF_DTYPE_F16, 0};
    for (unsigned beam = 1; beam <= 4; beam += 3) {
        memset(codes, 0xAB, (size_t)N * CPP * 2);
        ck_assert_int_eq(fkvf_rvq_encode(ql, &in, NULL, beam, codes, CPP, 1), FKVF_OK);
        ck_assert_int_eq(
            fkvf_rvq_decode(ql, codes, CPP, 1, N, 0, NULL, FKVF_DTYPE_F16, dec, (size_t)N * ROW_BYTES),
            FKVF_OK);
        for (uint32_t l = 0; l < L; l++) {
            fkvf_rvq *sub = NULL;
            ck_assert_int_eq(fkvf_rvq_subset(&sub, qu, pairs[2 * l], pairs[2 * l + 1]), FKVF_OK);
            size_t ucpp = fkvf_rvq_codes_per_position(sub);
            ck_assert_int_eq(fkvf_rvq_encode(sub, &in, NULL, beam, uc, ucpp ? ucpp : 1, 1), FKVF_OK);
            ck_assert_int_eq(fkvf_rvq_decode(sub, uc, ucpp ? ucpp : 1, 1, N, 0, NULL, FKVF_DTYPE_F16,
                                             udec, (size_t)N * ROW_BYTES),
                             FKVF_OK);
            unsigned ks = pairs[2 * l], m = ks + pairs[2 * l + 1];
            for (size_t i = 0; i < N; i++) {
                for (uint32_t h = 0; h < H; h++)
                    for (unsigned c = 0; c < m; c++) {
                        /* uniform code order: (l * H + h) * m + c; per-layer: ord */
                        uint16_t u = uc[i * ucpp + ((size_t)l * H + h) * m + c];
                        uint64_t j = fkvf_index_stream_ord(&sh, H, l, h, c >= ks,
                                                           c >= ks ? c - ks : c);
                        ck_assert_uint_lt(j, CPP);
                        ck_assert_uint_eq(codes[i * CPP + j], u);
                    }
                /* layer l of the decoded rows (a layer of no stages: zeros) */
                size_t lo = i * ROW_ELEMS + (size_t)l * H * 2 * D;
                ck_assert(!memcmp(dec + lo, udec + lo, (size_t)H * 2 * D * 2));
            }
            fkvf_rvq_free(sub);
        }
    }
    /* tables out and in again (binary32 copy, f16 in place, f16 encoding) */
    size_t tn = fkvf_rvq_tables_size(ql);
    void *tables = malloc(tn);
    ck_assert_ptr_nonnull(tables);
    ck_assert_int_eq(fkvf_rvq_tables(ql, tables, tn), FKVF_OK);
    ck_assert_int_eq(fkvf_rvq_encode(ql, &in, NULL, 1, codes, CPP, 1), FKVF_OK);
    ck_assert_int_eq(
        fkvf_rvq_decode(ql, codes, CPP, 1, N, 9, NULL, FKVF_DTYPE_F16, dec, (size_t)N * ROW_BYTES),
        FKVF_OK);
    for (int how = 0; how < 3; how++) {
        fkvf_rvq *q2 = NULL;
        int rc = how == 0   ? fkvf_rvq_from_tables(&q2, &sh, H, tables, tn, NULL)
                 : how == 1 ? fkvf_rvq_from_tables16_borrow(&q2, &sh, H, tables, tn, NULL)
                            : fkvf_rvq_from_tables16_encode(&q2, &sh, H, tables, tn, NULL);
        if (how > 0 && rc == FKVF_E_UNSUPPORTED)
            continue; /* a CPU without the f16 kernels */
        ck_assert_int_eq(rc, FKVF_OK);
        ck_assert_uint_eq(fkvf_rvq_codes_per_position(q2), CPP);
        if (how != 1) {
            memset(uc, 0, (size_t)N * CPP * 2);
            ck_assert_int_eq(fkvf_rvq_encode(q2, &in, NULL, 1, uc, CPP, 1), FKVF_OK);
            ck_assert(!memcmp(uc, codes, (size_t)N * CPP * 2));
        }
        /* codes one array per stream (restore's layout) */
        for (size_t i = 0; i < N; i++)
            for (size_t j = 0; j < CPP; j++)
                uc[j * N + i] = codes[i * CPP + j];
        ck_assert_int_eq(fkvf_rvq_decode(q2, uc, 1, N, N, 9, NULL, FKVF_DTYPE_F16, udec,
                                         (size_t)N * ROW_BYTES),
                         FKVF_OK);
        ck_assert(!memcmp(udec, dec, (size_t)N * ROW_BYTES));
        void *t2 = malloc(tn);
        ck_assert_int_eq(fkvf_rvq_tables(q2, t2, tn), FKVF_OK);
        ck_assert(!memcmp(t2, tables, tn));
        free(t2);
        fkvf_rvq_free(q2);
    }
    /* a code out of range anywhere: FKVF_E_RANGE before anything is written */
    memset(udec, 0x5A, (size_t)N * ROW_BYTES);
    codes[(N - 1) * CPP + CPP - 1] = K;
    ck_assert_int_eq(
        fkvf_rvq_decode(ql, codes, CPP, 1, N, 0, NULL, FKVF_DTYPE_F16, udec, (size_t)N * ROW_BYTES),
        FKVF_E_RANGE);
    for (size_t i = 0; i < (size_t)N * ROW_ELEMS; i++)
        ck_assert_uint_eq(udec[i], 0x5A5A);
    /* wrong sizes */
    fkvf_rvq *q3 = NULL;
    ck_assert_int_eq(fkvf_rvq_from_tables(&q3, &sh, H, tables, tn - 2, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_rvq_tables(ql, tables, tn + 2), FKVF_E_INVALID_ARG);
    free(tables);
    free(rows);
    free(codes);
    free(uc);
    free(dec);
    free(udec);
    fkvf_rvq_free(ql);
    fkvf_rvq_free(qu);
}
END_TEST

/* Subsets of a per-layer quantizer cut every layer; one whose layers end up
 * with the same counts is a uniform quantizer (no table), as is a training
 * whose table is uniform. */
START_TEST(rvq_subsets_and_uniform_tables)
{
    fkvf_rvq *ql = train(pairs);
    fkvf_rvq *a = NULL, *b = NULL, *c = NULL;
    fkvf_codebook_shape sh;
    ck_assert_int_eq(fkvf_rvq_subset(&a, ql, 1, 1), FKVF_OK);
    fkvf_rvq_shape(a, &sh, NULL);
    static const uint8_t t11[2 * L] = {1, 1, 0, 1, 0, 0, 1, 1};
    ck_assert_ptr_nonnull(sh.layer_stages);
    ck_assert(!memcmp(sh.layer_stages, t11, sizeof t11));
    ck_assert_uint_eq(fkvf_rvq_codes_per_position(a), (size_t)H * 5);
    for (uint32_t l = 0; l < L; l++)
        for (unsigned kv = 0; kv < 2; kv++)
            if (t11[2 * l + kv])
                ck_assert(!memcmp(fkvf_rvq_centroids(a, l, 1, kv, 0),
                                  fkvf_rvq_centroids(ql, l, 1, kv, 0), (size_t)K * D * 4));
    /* no key stages anywhere, one value stage where a layer has one */
    ck_assert_int_eq(fkvf_rvq_subset(&b, ql, 0, 2), FKVF_OK);
    fkvf_rvq_shape(b, &sh, NULL);
    ck_assert_ptr_nonnull(sh.layer_stages);
    ck_assert_uint_eq(sh.k_stages, 0);
    /* nothing left: the uniform (0, 0) codebook */
    ck_assert_int_eq(fkvf_rvq_subset(&c, ql, 0, 0), FKVF_OK);
    fkvf_rvq_shape(c, &sh, NULL);
    ck_assert_ptr_null(sh.layer_stages);
    ck_assert_uint_eq(fkvf_rvq_codes_per_position(c), 0);
    fkvf_rvq_free(c);
    ck_assert_int_eq(fkvf_rvq_subset(&c, ql, 3, 0), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(c);
    fkvf_rvq_free(a);
    fkvf_rvq_free(b);
    /* an all-equal table trains the uniform codebook */
    static const uint8_t same[2 * L] = {2, 2, 2, 2, 2, 2, 2, 2};
    fkvf_rvq *qs = train(same), *qu = train(NULL);
    fkvf_rvq_shape(qs, &sh, NULL);
    ck_assert_ptr_null(sh.layer_stages);
    size_t n = fkvf_rvq_tables_size(qs);
    ck_assert_uint_eq(n, fkvf_rvq_tables_size(qu));
    void *t1 = malloc(n), *t2 = malloc(n);
    ck_assert_int_eq(fkvf_rvq_tables(qs, t1, n), FKVF_OK);
    ck_assert_int_eq(fkvf_rvq_tables(qu, t2, n), FKVF_OK);
    ck_assert(!memcmp(t1, t2, n));
    free(t1);
    free(t2);
    /* a table whose maxima are not the counts is refused */
    static const uint8_t low[2 * L] = {1, 1, 1, 1, 1, 1, 1, 1};
    fkvf_rvq_params p;
    params(&p, low);
    uint16_t rows[8 * ROW_ELEMS];
    gen_rows(rows, 0, 8);
    fkvf_rows blk = {rows, 8, FKVF_DTYPE_F16, 0};
    fkvf_rvq *bad = NULL;
    ck_assert_int_eq(fkvf_rvq_train(&bad, &p, &blk, 1, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(bad);
    fkvf_rvq_free(qs);
    fkvf_rvq_free(qu);
    fkvf_rvq_free(ql);
}
END_TEST

/* ---- archives ----------------------------------------------------------------- */

static void desc_init(fkvf_desc *d)
{
    memset(d, 0, sizeof *d);
    d->n_layers = L;
    d->n_kv_heads = H;
    d->key_dim = d->value_dim = D;
    d->dtype = FKVF_DTYPE_F16;
    d->n_sinks = SINKS;
    d->window = WINDOW;
    d->model_id = "test/layers";
}

static const size_t batches[] = {6, 11, 4, 9};
enum { N_BATCHES = sizeof batches / sizeof batches[0] };

/* commits of batches [b0, b1) to the appender at path (created when ql) */
static void append_batches(const char *path, fkvf_rvq *ql, fkvf_reader *cbref, size_t b0,
                           size_t b1, uint64_t *n)
{
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.block_size = 64;
    o.no_auto_compact = 1;
    if (cbref && !ql && b0 > 0)
        o.codebook_file = cbref;
    fkvf_appender *a = NULL;
    int rc;
    if (b0 == 0) {
        fkvf_desc d;
        desc_init(&d);
        fkvf_append_create c;
        memset(&c, 0, sizeof c);
        c.desc = &d;
        c.codebook = ql;
        c.codebook_ref = cbref;
        c.codebook_name = "cb.fkvf";
        c.token_codec.profile = FKVF_PROFILE_QUAD;
        c.token_codec.symbol_bits = 10;
        rc = fkvf_appender_create(&a, path, &c, &o, NULL);
    } else {
        rc = fkvf_appender_open(&a, path, &o, NULL);
    }
    ck_assert_msg(rc == FKVF_OK, "appender: %s", fkvf_appender_message(a));
    uint16_t rows[16 * ROW_ELEMS];
    uint32_t tok[16];
    for (size_t i = b0; i < b1; i++) {
        gen_rows(rows, *n, batches[i]);
        for (size_t t = 0; t < batches[i]; t++)
            tok[t] = (uint32_t)((*n + t) * 31 % 1000);
        ck_assert_int_eq(fkvf_appender_append(a, rows, batches[i] * ROW_BYTES, batches[i], tok),
                         FKVF_OK);
        rc = fkvf_appender_commit(a);
        ck_assert_msg(rc == FKVF_OK, "commit: %s", fkvf_appender_message(a));
        *n += batches[i];
    }
    fkvf_appender_free(a);
}

/* What an archive of the first n positions must serve: the sinks and the
 * last WINDOW positions exact, the others the quantizer's reconstruction. */
static uint16_t *expected_rows(const fkvf_rvq *q, uint64_t n)
{
    uint16_t *rows = malloc((size_t)n * ROW_BYTES), *dec = malloc((size_t)n * ROW_BYTES);
    uint16_t *codes = malloc((size_t)n * CPP * 2);
    ck_assert(rows && dec && codes);
    gen_rows(rows, 0, (size_t)n);
    fkvf_rows in = {rows, (size_t)n, FKVF_DTYPE_F16, 0};
    ck_assert_int_eq(fkvf_rvq_encode(q, &in, NULL, 1, codes, CPP, 1), FKVF_OK);
    ck_assert_int_eq(fkvf_rvq_decode(q, codes, CPP, 1, (size_t)n, 0, NULL, FKVF_DTYPE_F16, dec,
                                     (size_t)n * ROW_BYTES),
                     FKVF_OK);
    for (uint64_t p = SINKS; p + WINDOW < n; p++)
        memcpy(rows + p * ROW_ELEMS, dec + p * ROW_ELEMS, ROW_BYTES);
    free(dec);
    free(codes);
    return rows;
}

/* r serves the n positions of expected_rows: restore, random access
 * selections, stream names, verification. */
static void check_reader(fkvf_reader *r, const fkvf_rvq *q, uint64_t n)
{
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    ck_assert_uint_eq(ai.n_positions, n);
    ck_assert_uint_eq(ai.format_minor, 1);
    ck_assert(ai.required_features & FKVF_FEAT_LAYER_STAGES);
    uint16_t *want = expected_rows(q, n), *got = malloc((size_t)n * ROW_BYTES);
    ck_assert_ptr_nonnull(got);
    int rc = fkvf_reader_restore(r, 0, n, FKVF_DTYPE_F16, got, (size_t)n * ROW_BYTES);
    ck_assert_msg(rc == FKVF_OK, "restore: %s", fkvf_reader_message(r));
    ck_assert(!memcmp(got, want, (size_t)n * ROW_BYTES));
    /* a selection: layers 1..3, head 1, values only, by head */
    fkvf_read_request rq = {1, n - 2, 1, 3, 1, 1, FKVF_PART_VALUES, FKVF_DTYPE_F16,
                            FKVF_LAYOUT_HEADS};
    size_t sz;
    ck_assert_int_eq(fkvf_reader_read_size(r, &rq, &sz), FKVF_OK);
    ck_assert_uint_eq(sz, (size_t)(n - 2) * 3 * D * 2);
    uint16_t *sel = malloc(sz);
    ck_assert_ptr_nonnull(sel);
    rc = fkvf_reader_read(r, &rq, sel, sz);
    ck_assert_msg(rc == FKVF_OK, "read: %s", fkvf_reader_message(r));
    /* HEADS: per layer, per head, per position, dim values */
    for (uint32_t li = 0; li < 3; li++)
        for (uint64_t i = 0; i < n - 2; i++)
            for (uint32_t e = 0; e < D; e++) {
                size_t src = (size_t)(1 + i) * ROW_ELEMS + (size_t)(1 + li) * H * 2 * D + H * D +
                             1 * D + e;
                ck_assert_uint_eq(sel[((size_t)li * (n - 2) + i) * D + e], want[src]);
            }
    free(sel);
    /* the index streams named by the layer table, then the token stream */
    fkvf_codebook_shape sh;
    fkvf_rvq_shape(q, &sh, NULL);
    size_t ns;
    ck_assert_int_eq(fkvf_reader_stream_count(r, &ns), FKVF_OK);
    ck_assert_uint_eq(ns, CPP + 1);
    for (size_t j = 0; j < CPP; j++) {
        fkvf_stream_info si;
        size_t idx;
        ck_assert_int_eq(fkvf_reader_stream_info(r, j, &si), FKVF_OK);
        ck_assert_uint_eq(si.id, fkvf_index_stream_id_shape(&sh, H, j));
        ck_assert_int_eq(fkvf_reader_stream_find(r, si.id, &idx), FKVF_OK);
        ck_assert_uint_eq(idx, j);
    }
    size_t idx;
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, 1, 0, 0, 0),
                                             &idx),
                     FKVF_E_NOT_FOUND); /* layer 1 has no key stage */
    fkvf_codebook_shape rs;
    ck_assert_int_eq(fkvf_reader_codebook(r, &rs, NULL, NULL, NULL), FKVF_OK);
    ck_assert_ptr_nonnull(rs.layer_stages);
    ck_assert(!memcmp(rs.layer_stages, pairs, sizeof pairs));
    rc = fkvf_reader_verify(r);
    ck_assert_msg(rc == FKVF_OK, "verify: %s", fkvf_reader_message(r));
    free(want);
    free(got);
}

START_TEST(archive_embedded_append_reopen_compact)
{
    make_dir();
    char a[128], b[128];
    path_in(a, sizeof a, "a.fkvf");
    path_in(b, sizeof b, "b.fkvf");
    fkvf_rvq *ql = train(pairs);
    uint64_t n = 0;
    append_batches(a, ql, NULL, 0, 2, &n);
    append_batches(a, NULL, NULL, 2, N_BATCHES, &n); /* reopened: the table from the file */
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, a, FKVF_OPEN_STRICT, NULL);
    ck_assert_msg(rc == FKVF_OK, "%s", fkvf_reader_message(r));
    check_reader(r, ql, n);
    fkvf_reader_free(r);
    /* compaction keeps everything (the index streams copied by index) */
    fkvf_compact_options co;
    fkvf_compact_options_init(&co);
    fkvf_archive_op *op = NULL;
    rc = fkvf_archive_compact(&op, a, b, &co, NULL);
    ck_assert_msg(rc == FKVF_OK, "compact: %s", op ? "see op" : fkvf_strerror(rc));
    fkvf_archive_op_free(op);
    ck_assert_int_eq(fkvf_reader_open_file(&r, b, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    check_reader(r, ql, n);
    fkvf_reader_free(r);
    /* key retrieval: a layer without key stages has nothing to search */
    ck_assert_int_eq(fkvf_reader_open_file(&r, b, 0, NULL), FKVF_OK);
    fkvf_key_search *ks = NULL;
    ck_assert_int_eq(fkvf_search_keys_open(&ks, r, NULL), FKVF_OK);
    float qv[D] = {1, -1, 0.5f, 0, 0, 2, 0, 1};
    fkvf_key_query kq;
    memset(&kq, 0, sizeof kq);
    kq.query = qv;
    kq.dim = D;
    kq.m = 3;
    kq.layer = 1;
    fkvf_key_hit hits[3];
    size_t nh = 9;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &nh, NULL), FKVF_E_NOT_FOUND);
    kq.layer = 3; /* one key stage: the best 3 of q . k over every archived position */
    kq.candidates = FKVF_KEY_CANDIDATES_MAX;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &nh, NULL), FKVF_OK);
    ck_assert_uint_eq(nh, 3);
    const float *c = NULL;
    uint16_t *want = expected_rows(ql, n);
    double best = -1e300;
    for (uint64_t p = SINKS; p + WINDOW < n; p++) {
        double s = 0;
        for (uint32_t e = 0; e < D; e++)
            s += (double)qv[e] *
                 fkvf_f16_to_f32(tu_ld16le(&want[p * ROW_ELEMS + 3 * H * 2 * D + e]));
        best = s > best ? s : best;
    }
    (void)c;
    /* the f16 rows are the f32 sums rounded: the best score within rounding */
    ck_assert(hits[0].score > best - 0.05 && hits[0].score < best + 0.05);
    free(want);
    fkvf_search_keys_free(ks);
    fkvf_reader_free(r);
    fkvf_rvq_free(ql);
    rm_dir();
}
END_TEST

/* A per-layer codebook file referred to by an archive: names and archived
 * rows need it; a candidate with a table for an archive that does not
 * declare the feature is refused. */
START_TEST(archive_external_codebook)
{
    make_dir();
    char cbp[128], a[128];
    path_in(cbp, sizeof cbp, "cb.fkvf");
    path_in(a, sizeof a, "ext.fkvf");
    fkvf_rvq *ql = train(pairs);
    fkvf_codebook_shape sh;
    fkvf_rvq_shape(ql, &sh, NULL);
    size_t tn = fkvf_rvq_tables_size(ql);
    void *t = malloc(tn);
    ck_assert_int_eq(fkvf_rvq_tables(ql, t, tn), FKVF_OK);
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    wo.sync = FKVF_SYNC_NONE;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_file(&w, cbp, &wo, NULL), FKVF_OK);
    /* the feature must be declared */
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, t, tn, 0), FKVF_E_INVALID_ARG);
    fkvf_writer_free(w);
    unlink(cbp);
    wo.required_features = FKVF_FEAT_LAYER_STAGES;
    ck_assert_int_eq(fkvf_writer_create_file(&w, cbp, &wo, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, t, tn, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
    free(t);
    fkvf_reader *cb = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&cb, cbp, 0, NULL), FKVF_OK);
    uint64_t n = 0;
    append_batches(a, NULL, cb, 0, 2, &n);
    append_batches(a, NULL, cb, 2, N_BATCHES, &n);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, a, 0, NULL), FKVF_OK);
    /* without the codebook: no names, no archived rows */
    fkvf_stream_info si;
    size_t idx;
    ck_assert_int_eq(fkvf_reader_stream_info(r, 0, &si), FKVF_OK);
    ck_assert_uint_eq(si.id, FKVF_STREAM_ID_UNNAMED);
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, 0, 0, 0, 0),
                                             &idx),
                     FKVF_E_CODEBOOK);
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &idx), FKVF_OK);
    ck_assert_uint_eq(idx, CPP);
    uint16_t row[ROW_ELEMS];
    ck_assert_int_eq(fkvf_reader_restore(r, SINKS, 1, FKVF_DTYPE_F16, row, ROW_BYTES),
                     FKVF_E_CODEBOOK);
    /* no search index for a stream without a name (it would be keyed by no
     * stream id), a scan instead; the writer refuses a key that is no id */
    void *zd = NULL;
    size_t zn = 0;
    uint64_t zk = 0;
    ck_assert_int_eq(fkvf_search_index_build(r, 0, &zd, &zn, &zk, NULL), FKVF_E_CODEBOOK);
    ck_assert_ptr_null(zd);
    /* ... unless the caller names it (second tier): the same bytes as the
     * index built with the codebook attached (below); no id is refused */
    void *zas = NULL;
    size_t zasn = 0;
    uint64_t id0 = fkvf_index_stream_id_shape(&sh, H, 0);
    ck_assert_int_eq(fkvf_search_index_build_as(r, 0, FKVF_STREAM_ID_UNNAMED, &zas, &zasn, NULL),
                     FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(zas);
    ck_assert_int_eq(fkvf_search_index_build_as(r, 0, id0, &zas, &zasn, NULL), FKVF_OK);
    /* with each of its allocations failing in turn: FKVF_E_NOMEM, no
     * buffer, nothing leaked; then the same bytes */
    for (long k = 0;; k++) {
        ck_assert_int_lt(k, 2000);
        tu_alloc fa = {0};
        fkvf_allocator al = tu_alloc_hook(&fa);
        fa.fail_at = k + 1;
        fa.fail_after = 1;
        void *zf = NULL;
        size_t zfn = 0;
        int frc = fkvf_search_index_build_as(r, 0, id0, &zf, &zfn, &al);
        ck_assert_msg(frc == FKVF_OK || frc == FKVF_E_NOMEM, "k %ld: %s", k, fkvf_error_name(frc));
        if (frc != FKVF_OK) {
            ck_assert_ptr_null(zf);
            ck_assert(fa.failed);
        } else {
            ck_assert_uint_eq(zfn, zasn);
            ck_assert_int_eq(memcmp(zf, zas, zfn), 0);
        }
        fkvf_search_buffer_free(zf, &al);
        ck_assert_msg(fa.live == 0, "k %ld: %ld allocations leaked", k, fa.live);
        if (frc == FKVF_OK)
            break;
    }
    /* the token stream has its own name: no other is taken */
    void *zt = NULL;
    size_t ztn = 0;
    ck_assert_int_eq(fkvf_search_index_build_as(r, CPP, id0, &zt, &ztn, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(zt);
    ck_assert_int_eq(fkvf_search_index_build_as(r, CPP, FKVF_STREAM_ID_TOKENS, &zt, &ztn, NULL),
                     FKVF_OK);
    fkvf_search_buffer_free(zt, NULL);
    fkvf_search *sh0 = NULL;
    ck_assert_int_eq(fkvf_search_open(&sh0, r, 0, 0, NULL), FKVF_OK);
    uint32_t sym0;
    ck_assert_int_eq(fkvf_reader_stream_get(r, 0, 3, &sym0), FKVF_OK);
    uint64_t hits0[64], nf0 = 0;
    ck_assert_int_eq(fkvf_search_suffix(sh0, &sym0, 1, hits0, 64, &nf0), FKVF_OK);
    ck_assert_uint_ge(nf0, 1);
    fkvf_search_free(sh0);
    fkvf_section_add bad = {FKVF_SECTION_ZPOS, 0, FKVF_STREAM_ID_UNNAMED, "x", 1};
    fkvf_archive_op *op = NULL;
    ck_assert_int_eq(fkvf_archive_append_sections(&op, a, &bad, 1, FKVF_SYNC_NONE),
                     FKVF_E_INVALID_ARG);
    fkvf_archive_op_free(op);
    ck_assert_int_eq(fkvf_reader_attach_codebook(r, cb), FKVF_OK);
    check_reader(r, ql, n);
    /* with the codebook: an index of stream 0, keyed by its name */
    ck_assert_int_eq(fkvf_search_index_build(r, 0, &zd, &zn, &zk, NULL), FKVF_OK);
    ck_assert_uint_eq(zk, id0);
    ck_assert_uint_eq(zn, zasn);
    ck_assert_int_eq(memcmp(zd, zas, zn), 0);
    fkvf_search_buffer_free(zas, NULL);
    fkvf_reader_free(r);
    fkvf_section_add zs = {FKVF_SECTION_ZPOS, 0, zk, zd, zn};
    op = NULL;
    ck_assert_int_eq(fkvf_archive_append_sections(&op, a, &zs, 1, FKVF_SYNC_NONE), FKVF_OK);
    fkvf_archive_op_free(op);
    fkvf_search_buffer_free(zd, NULL);
    /* verified with the codebook, and without it: which stream the index
     * names is then not checked (spec 13.5), not CORRUPT */
    for (int with = 0; with < 2; with++) {
        ck_assert_int_eq(fkvf_reader_open_file(&r, a, FKVF_OPEN_STRICT, NULL), FKVF_OK);
        if (with)
            ck_assert_int_eq(fkvf_reader_attach_codebook(r, cb), FKVF_OK);
        int vrc = fkvf_reader_verify(r);
        ck_assert_msg(vrc == FKVF_OK, "verify %s the codebook: %s", with ? "with" : "without",
                      fkvf_reader_message(r));
        fkvf_reader_free(r);
    }
    /* An appender's automatic compaction reads the archive without the
     * codebook file (the appender had it at open only) and used to drop
     * that index, its stream having no name there; it rebuilds it now,
     * keyed by the name the codebook's shape gives. */
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.block_size = 64;
    o.codebook_file = cb;
    o.compact_ratio = 1.0001;
    fkvf_appender *ap = NULL;
    ck_assert_int_eq(fkvf_appender_open(&ap, a, &o, NULL), FKVF_OK);
    uint16_t rows[16 * ROW_ELEMS];
    uint32_t tok[7];
    gen_rows(rows, n, 7);
    for (size_t k = 0; k < 7; k++)
        tok[k] = (uint32_t)((n + k) * 31 % 1000);
    ck_assert_int_eq(fkvf_appender_append(ap, rows, 7 * ROW_BYTES, 7, tok), FKVF_OK);
    int crc = fkvf_appender_commit(ap);
    ck_assert_msg(crc == FKVF_OK, "commit: %s", fkvf_appender_message(ap));
    n += 7;
    fkvf_appender_free(ap);
    ck_assert_int_eq(fkvf_reader_open_file(&r, a, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    ck_assert_uint_eq(ai.n_commits, 1); /* compacted */
    size_t nz = 0, zsec = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info sec;
        ck_assert_int_eq(fkvf_reader_section(r, i, &sec), FKVF_OK);
        if (sec.type == FKVF_SECTION_ZPOS && sec.key == zk) {
            nz++;
            zsec = i;
        }
    }
    ck_assert_uint_eq(nz, 1);
    ck_assert_int_eq(fkvf_reader_attach_codebook(r, cb), FKVF_OK);
    int vrc = fkvf_reader_verify(r);
    ck_assert_msg(vrc == FKVF_OK, "verify: %s", fkvf_reader_message(r));
    check_reader(r, ql, n);
    /* in effect over every archived position, and it answers as a scan */
    fkvf_search *six = NULL, *sscan = NULL;
    ck_assert_int_eq(fkvf_search_open(&six, r, 0, 0, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_search_open(&sscan, r, 0, FKVF_SEARCH_NO_INDEX, NULL), FKVF_OK);
    fkvf_search_status st;
    ck_assert_int_eq(fkvf_search_info(six, &st), FKVF_OK);
    ck_assert_uint_eq(st.index_section, zsec);
    fkvf_stream_info s0;
    ck_assert_int_eq(fkvf_reader_stream_info(r, 0, &s0), FKVF_OK);
    ck_assert_uint_eq(st.n_indexed, s0.align ? s0.length / s0.align * s0.align : s0.length);
    ck_assert_uint_gt(st.n_indexed, 0);
    for (uint64_t p = 0; p < s0.length; p += 5) {
        uint32_t q;
        ck_assert_int_eq(fkvf_reader_stream_get(r, 0, p, &q), FKVF_OK);
        uint64_t h1[64], h2[64], n1 = 0, n2 = 0;
        ck_assert_int_eq(fkvf_search_suffix(six, &q, 1, h1, 64, &n1), FKVF_OK);
        ck_assert_int_eq(fkvf_search_suffix(sscan, &q, 1, h2, 64, &n2), FKVF_OK);
        ck_assert_uint_eq(n1, n2);
        ck_assert_uint_ge(n1, 1);
        for (uint64_t k = 0; k < n1 && k < 64; k++)
            ck_assert_uint_eq(h1[k], h2[k]);
    }
    fkvf_search_free(six);
    fkvf_search_free(sscan);
    fkvf_reader_free(r);
    fkvf_reader_free(cb);
    fkvf_rvq_free(ql);
    rm_dir();
}
END_TEST

/* The appender found an archive's index streams by the name of layer 0's
 * first key (or value) stage: with a layer table whose layer 0 has no stage
 * there is no such stream, and a reopened appender (or one adding sections
 * only, as fkvf pack's search index commit does) lost the index group and
 * refused to commit "archived positions need the index streams". */
static const uint8_t pairs0[2 * L] = {0, 0, 2, 1, 1, 2, 0, 1};

START_TEST(regress_appender_layer0_without_stages)
{
    make_dir();
    char a[128];
    path_in(a, sizeof a, "c.fkvf");
    fkvf_rvq *ql = train(pairs0);
    ck_assert_uint_eq(fkvf_rvq_codes_per_position(ql), (size_t)H * 7);
    uint64_t n = 0;
    append_batches(a, ql, NULL, 0, 1, &n);
    append_batches(a, NULL, NULL, 1, N_BATCHES, &n); /* reopened twice... */
    fkvf_section_add sec = {FKVF_FOURCC('x', 't', 's', 't'), 0, 0, "note", 4};
    fkvf_archive_op *op = NULL;
    int rc = fkvf_archive_append_sections(&op, a, &sec, 1, FKVF_SYNC_NONE);
    ck_assert_msg(rc == FKVF_OK, "append_sections: %d", rc);
    fkvf_archive_op_free(op);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, a, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    ck_assert_uint_eq(ai.n_commits, N_BATCHES + 2); /* the empty first commit, the note */
    /* the restore against the quantizer, as check_reader does for pairs */
    uint16_t *want = malloc((size_t)n * ROW_BYTES), *got = malloc((size_t)n * ROW_BYTES);
    uint16_t *codes = malloc((size_t)n * H * 7 * 2), *dec = malloc((size_t)n * ROW_BYTES);
    ck_assert(want && got && codes && dec);
    gen_rows(want, 0, (size_t)n);
    fkvf_rows in = {want, (size_t)n, FKVF_DTYPE_F16, 0};
    ck_assert_int_eq(fkvf_rvq_encode(ql, &in, NULL, 1, codes, H * 7, 1), FKVF_OK);
    ck_assert_int_eq(fkvf_rvq_decode(ql, codes, H * 7, 1, (size_t)n, 0, NULL, FKVF_DTYPE_F16, dec,
                                     (size_t)n * ROW_BYTES),
                     FKVF_OK);
    for (uint64_t p = SINKS; p + WINDOW < n; p++)
        memcpy(want + p * ROW_ELEMS, dec + p * ROW_ELEMS, ROW_BYTES);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, n, FKVF_DTYPE_F16, got, (size_t)n * ROW_BYTES),
                     FKVF_OK);
    ck_assert(!memcmp(got, want, (size_t)n * ROW_BYTES));
    /* layer 0 restores as zeros at archived positions */
    for (size_t e = 0; e < (size_t)H * 2 * D; e++)
        ck_assert_uint_eq(got[(size_t)SINKS * ROW_ELEMS + e], 0);
    ck_assert_int_eq(fkvf_reader_verify(r), FKVF_OK);
    fkvf_reader_free(r);
    free(want);
    free(got);
    free(codes);
    free(dec);
    fkvf_rvq_free(ql);
    rm_dir();
}
END_TEST

/* The k-th allocation failing, for every k, on every per-layer path that
 * allocates: FKVF_E_NOMEM (no handle, nothing leaked) until a k at which
 * the call succeeds. The handle under test is made with the same allocator
 * (its layers keep it), which starts failing only after the handle exists. */
START_TEST(allocation_failures)
{
    fkvf_rvq *ql = train(pairs);
    fkvf_codebook_shape sh;
    fkvf_rvq_shape(ql, &sh, NULL);
    size_t tn = fkvf_rvq_tables_size(ql);
    void *tables = malloc(tn);
    ck_assert_int_eq(fkvf_rvq_tables(ql, tables, tn), FKVF_OK);
    enum { N = 24 };
    uint16_t *rows = malloc((size_t)N * ROW_BYTES), *codes = malloc((size_t)N * CPP * 2);
    uint16_t *out = malloc((size_t)N * ROW_BYTES);
    ck_assert(rows && codes && out);
    gen_rows(rows, 77, N);
    fkvf_rows blk = {rows, N, FKVF_DTYPE_F16, 0};
    ck_assert_int_eq(fkvf_rvq_encode(ql, &blk, NULL, 1, codes, CPP, 1), FKVF_OK);
    fkvf_rvq_params p;
    params(&p, pairs);
    p.max_iters = 2;
    /* an archive of the codebook, for the reader's paths */
    tu_buf file = {0};
    {
        fkvf_writer_options wo;
        fkvf_writer_options_init(&wo);
        wo.required_features = FKVF_FEAT_LAYER_STAGES;
        fkvf_sink sink = tu_buf_sink(&file);
        fkvf_writer *w = NULL;
        ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &wo, NULL), FKVF_OK);
        fkvf_desc d;
        desc_init(&d);
        d.n_sinks = 0;
        d.window = 0;
        ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
        ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, tables, tn, 0), FKVF_OK);
        fkvf_stream_spec sp = {FKVF_PROFILE_QUAD, 4, 0, 0, 0};
        ck_assert_int_eq(fkvf_writer_add_index_segment(w, &sp, 0, N, codes, CPP, 1), FKVF_OK);
        ck_assert_int_eq(fkvf_writer_set_positions(w, N, N), FKVF_OK);
        ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
        fkvf_writer_free(w);
    }
    for (int op = 0; op < 9; op++) {
        int done = 0;
        for (long k = 0; !done; k++) {
            ck_assert_int_lt(k, 2000);
            tu_alloc fa = {0};
            fkvf_allocator al = tu_alloc_hook(&fa);
            fkvf_rvq *q = NULL, *base = NULL;
            if (op >= 3 && op <= 6)
                ck_assert_int_eq(fkvf_rvq_from_tables(&base, &sh, H, tables, tn, &al), FKVF_OK);
            fa.fail_at = fa.calls + k + 1; /* the k-th allocation from here on fails */
            fa.fail_after = 1;
            int rc = FKVF_OK;
            switch (op) {
            case 0:
                rc = fkvf_rvq_train(&q, &p, &blk, 1, &al);
                break;
            case 1:
                rc = fkvf_rvq_from_tables(&q, &sh, H, tables, tn, &al);
                break;
            case 2:
                rc = fkvf_rvq_from_tables16_borrow(&q, &sh, H, tables, tn, &al);
                if (rc == FKVF_E_UNSUPPORTED)
                    rc = FKVF_OK; /* no f16 kernels on this CPU */
                break;
            case 3:
                rc = fkvf_rvq_subset(&q, base, 1, 1);
                break;
            case 4:
                rc = fkvf_rvq_encode(base, &blk, NULL, 3, codes, CPP, 1);
                break;
            case 5:
                rc = fkvf_rvq_decode(base, codes, CPP, 1, N, 0, NULL, FKVF_DTYPE_F16, out,
                                     (size_t)N * ROW_BYTES);
                break;
            case 6:
                rc = fkvf_rvq_subset(&q, base, 0, 0); /* to a uniform handle */
                break;
            default: {
                /* the reader: open, restore, a selection (whole rows decoded) */
                fkvf_reader *r = NULL;
                rc = fkvf_reader_open_memory(&r, file.data, file.size, 0, &al);
                if (rc == FKVF_OK)
                    rc = op == 7 ? fkvf_reader_restore(r, 0, N, FKVF_DTYPE_F16, out,
                                                       (size_t)N * ROW_BYTES)
                                 : fkvf_reader_read(r,
                                                    &(fkvf_read_request){2, 9, 1, 2, 0, 1,
                                                                         FKVF_PART_KEYS,
                                                                         FKVF_DTYPE_F32,
                                                                         FKVF_LAYOUT_ROWS},
                                                    out, (size_t)N * ROW_BYTES);
                fkvf_reader_free(r);
                break;
            }
            }
            ck_assert_msg(rc == FKVF_OK || rc == FKVF_E_NOMEM, "op %d k %ld: %s", op, k,
                          fkvf_error_name(rc));
            if (rc != FKVF_OK)
                ck_assert_msg(q == NULL && fa.failed, "op %d k %ld", op, k);
            fkvf_rvq_free(q);
            fkvf_rvq_free(base);
            ck_assert_msg(fa.live == 0, "op %d k %ld: %ld allocations leaked", op, k, fa.live);
            done = rc == FKVF_OK;
        }
    }
    tu_buf_free(&file);
    free(tables);
    free(rows);
    free(codes);
    free(out);
    fkvf_rvq_free(ql);
}
END_TEST

/* ---- crafted codebook files ------------------------------------------------------ */

/* A codebook file holding one CBK1 of 3 layers (2, 1), (0, 1), (0, 0), 1
 * head, k 16, dims 4, f16 zero tables, with the header's required bits req;
 * fix() may change the contents (n bytes) before they are sealed. */
static uint8_t *cbfile(uint64_t req, void (*fix)(uint8_t *p, size_t *n), size_t *size)
{
    uint8_t p[64 + 64 + 16 * 12 * 2 + 16 * 4 * 2 + 64];
    size_t n = 64 + 64 + 16 * 12 * 2 + 16 * 4 * 2;
    memset(p, 0, sizeof p);
    p[0] = 3;  /* n_layers */
    p[4] = 1;  /* n_heads */
    p[8] = 4;  /* key_dim */
    p[12] = 4; /* value_dim */
    p[16] = 16;
    p[20] = 2; /* the maxima */
    p[21] = 1;
    p[22] = 1; /* f16 */
    p[24] = 1; /* layer_stages */
    static const uint8_t t[6] = {2, 1, 0, 1, 0, 0};
    memcpy(p + 64, t, sizeof t);
    if (fix)
        fix(p, &n);
    craft c;
    cr_header(&c, 1, 1, req, 0);
    cr_plain(&c, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED, 0, p, n);
    cr_commit(&c, 1, 0, 0, 0);
    *size = c.b.size;
    uint8_t *f = (uint8_t *)c.b.data;
    return f;
}

static void fix_none(uint8_t *p, size_t *n)
{
    (void)p;
    (void)n;
}
static void fix_flag2(uint8_t *p, size_t *n)
{
    (void)n;
    p[24] = 2;
}
static void fix_count17(uint8_t *p, size_t *n)
{
    (void)n;
    p[64 + 3] = 17;
}
static void fix_maxima(uint8_t *p, size_t *n)
{
    (void)n;
    p[20] = 3;
}
static void fix_padding(uint8_t *p, size_t *n)
{
    (void)n;
    p[64 + 40] = 1;
}
static void fix_short(uint8_t *p, size_t *n)
{
    (void)p;
    *n = 64 + 5; /* the layer table cut short */
}
static void fix_long(uint8_t *p, size_t *n)
{
    (void)p;
    *n += 2; /* two bytes beyond the tables */
}

START_TEST(reader_refusals)
{
    static const struct {
        uint64_t req;
        void (*fix)(uint8_t *, size_t *);
        int rc;
    } cases[] = {
        {FKVF_FEAT_LAYER_STAGES, fix_none, FKVF_OK},
        {0, fix_none, FKVF_E_CORRUPT}, /* the feature not declared (spec 3.3) */
        {FKVF_FEAT_LAYER_STAGES, fix_flag2, FKVF_E_CORRUPT},
        {FKVF_FEAT_LAYER_STAGES, fix_count17, FKVF_E_CORRUPT},
        {FKVF_FEAT_LAYER_STAGES, fix_maxima, FKVF_E_CORRUPT},
        {FKVF_FEAT_LAYER_STAGES, fix_padding, FKVF_E_CORRUPT},
        {FKVF_FEAT_LAYER_STAGES, fix_short, FKVF_E_TRUNCATED},
        {FKVF_FEAT_LAYER_STAGES, fix_long, FKVF_E_CORRUPT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n;
        uint8_t *f = cbfile(cases[i].req, cases[i].fix, &n);
        fkvf_reader *r = NULL;
        int rc = fkvf_reader_open_memory(&r, f, n, 0, NULL);
        if (rc == FKVF_OK)
            rc = fkvf_reader_codebook(r, NULL, NULL, NULL, NULL);
        if (rc == FKVF_OK)
            rc = fkvf_reader_verify(r);
        ck_assert_msg(rc == cases[i].rc, "case %zu: %d (%s), want %d", i, rc,
                      r ? fkvf_reader_message(r) : "", cases[i].rc);
        if (rc == FKVF_OK) {
            fkvf_codebook_shape sh;
            const void *c;
            size_t cn;
            ck_assert_int_eq(fkvf_reader_codebook(r, &sh, &c, &cn, NULL), FKVF_OK);
            static const uint8_t t[6] = {2, 1, 0, 1, 0, 0};
            ck_assert_ptr_nonnull(sh.layer_stages);
            ck_assert(!memcmp(sh.layer_stages, t, 6));
            ck_assert_uint_eq(cn, 64 + 64 + 16 * 12 * 2 + 16 * 4 * 2);
            ck_assert_uint_eq(fkvf_codebook_tables_offset(&sh), 128);
        }
        fkvf_reader_free(r);
        free(f);
    }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("layer_stages");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, layout_worked_example);
    tcase_add_test(tc, rvq_layers_equal_uniform_subsets);
    tcase_add_test(tc, rvq_subsets_and_uniform_tables);
    tcase_add_test(tc, archive_embedded_append_reopen_compact);
    tcase_add_test(tc, archive_external_codebook);
    tcase_add_test(tc, regress_appender_layer0_without_stages);
    tcase_add_test(tc, allocation_failures);
    tcase_add_test(tc, reader_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
