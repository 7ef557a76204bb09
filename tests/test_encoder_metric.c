/* The encoder metric (format 1.2, spec 13.8, a CMET section): encoding
 * under a metric against a brute-force search of e^T M e computed here;
 * the identity metric changes nothing (codes and trained tables equal the
 * Euclidean ones bit for bit); training under a metric lowers the metric's
 * error; refusals of matrices that are not symmetric positive definite;
 * files: the writer's CMET read back, the appender encoding under the
 * metric at creation and after reopening (embedded codebook, and a codebook
 * file referred to by hash), compaction keeping it; crafted sections that
 * full verification, fkvf_reader_metric and the appender refuse; the k-th
 * allocation failing on every path. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fkvf.h"
#include "testutil.h"

#define L 2
#define H 2
#define D 8
#define K 16
#define ROW_ELEMS (L * H * 2 * D)
#define ROW_BYTES (ROW_ELEMS * 2)
#define KS 2
#define VS 1
#define CPP (L * H * (KS + VS))
#define SINKS 2
#define WINDOW 3
#define NTAB (L * H)

static char tmpdir[64];

static void make_dir(void) { tu_tmpdir_make(tmpdir, sizeof tmpdir, "metric"); }
static void path_in(char *out, size_t n, const char *name) { tu_tmp_path(out, n, tmpdir, name); }
static void rm_dir(void) { tu_tmpdir_remove(tmpdir); }

/* f16 rows of positions [first, first+n), deterministic per position, as
 * the library takes them: little-endian elements (fkvf_rows) */
static void gen_rows(uint16_t *out, uint64_t first, size_t n)
{
    tu_f16_rows(out, first, n, ROW_ELEMS, 3);
}

/* Strongly anisotropic SPD matrices, one per table: M = B B^T + 0.05 I
 * with B of decaying columns, so that the metric's nearest centroid often
 * differs from the Euclidean one. kind 0 keys, 1 values. */
static float *gen_metric(unsigned kind)
{
    float *m = malloc(sizeof(float) * NTAB * D * D);
    ck_assert_ptr_nonnull(m);
    for (size_t t = 0; t < NTAB; t++) {
        tu_rng rng = {t * 977 + kind * 131 + 1};
        double b[D][D];
        for (int i = 0; i < D; i++)
            for (int j = 0; j < D; j++)
                b[i][j] = ((double)(tu_next(&rng) >> 11) / 9007199254740992.0 - 0.5) * 4.0 /
                          (1.0 + 3.0 * j);
        for (int i = 0; i < D; i++)
            for (int j = 0; j < D; j++) {
                double s = i == j ? 0.05 : 0.0;
                for (int p = 0; p < D; p++)
                    s += b[i][p] * b[j][p];
                m[t * D * D + (size_t)i * D + j] = (float)s;
            }
        /* exactly symmetric as binary32 values */
        for (int i = 0; i < D; i++)
            for (int j = 0; j < i; j++)
                m[t * D * D + (size_t)i * D + j] = m[t * D * D + (size_t)j * D + i];
    }
    return m;
}

static float *identity_metric(void)
{
    float *m = calloc((size_t)NTAB * D * D, sizeof(float));
    ck_assert_ptr_nonnull(m);
    for (size_t t = 0; t < NTAB; t++)
        for (int i = 0; i < D; i++)
            m[t * D * D + (size_t)i * D + i] = 1.0f;
    return m;
}

static void params(fkvf_rvq_params *p)
{
    fkvf_rvq_params_init(p);
    p->n_layers = L;
    p->n_kv_heads = H;
    p->key_dim = p->value_dim = D;
    p->k = K;
    p->k_stages = KS;
    p->v_stages = VS;
    p->max_iters = 6;
    p->seed = 9;
}

static fkvf_rvq *train(const fkvf_rvq_metric *m, uint64_t first, size_t n)
{
    uint16_t *rows = malloc(n * ROW_BYTES);
    ck_assert_ptr_nonnull(rows);
    gen_rows(rows, first, n);
    fkvf_rvq_params p;
    params(&p);
    p.metric = m;
    fkvf_rows blk = {rows, n, FKVF_DTYPE_F16, 0};
    fkvf_rvq *q = NULL;
    ck_assert_int_eq(fkvf_rvq_train(&q, &p, &blk, 1, NULL), FKVF_OK);
    free(rows);
    return q;
}

/* (x - c)^T M (x - c) in binary64 */
static double mdist(const float *m, const double *x, const double *c)
{
    double s = 0;
    for (int i = 0; i < D; i++)
        for (int j = 0; j < D; j++)
            s += (x[i] - c[i]) * m[i * D + j] * (x[j] - c[j]);
    return s;
}

/* vector (l, h, kv) of row i (little-endian rows), binary64 */
static void vec_of(const uint16_t *rows, size_t i, int l, int h, int kv, double *x)
{
    size_t off = (size_t)i * ROW_ELEMS + (size_t)l * H * 2 * D + (size_t)kv * H * D + (size_t)h * D;
    for (int e = 0; e < D; e++)
        x[e] = fkvf_f16_to_f32(tu_ld16le(&rows[off + e]));
}

/* the code of (l, h, kv, s) in a position's codes (uniform numbering) */
static size_t code_at(int l, int h, int kv, int s)
{
    return ((size_t)l * H + h) * (KS + VS) + (kv == 0 ? (size_t)s : KS + (size_t)s);
}

/* the metric error of a position's codes for (l, h, kv), binary64 */
static double code_err(const fkvf_rvq *q, const float *m, const uint16_t *rows, size_t i,
                       const uint16_t *codes, int l, int h, int kv)
{
    double x[D], c[D] = {0};
    vec_of(rows, i, l, h, kv, x);
    int ns = kv == 0 ? KS : VS;
    for (int s = 0; s < ns; s++) {
        const float *cent = fkvf_rvq_centroids(q, (uint32_t)l, (uint32_t)h, (unsigned)kv,
                                               (unsigned)s);
        ck_assert_ptr_nonnull(cent);
        uint16_t cd = codes[i * CPP + code_at(l, h, kv, s)];
        for (int e = 0; e < D; e++)
            c[e] += cent[(size_t)cd * D + e];
    }
    return mdist(m + ((size_t)l * H + h) * D * D, x, c);
}

/* ---- the quantizer ------------------------------------------------------------- */

/* Greedy stage 0 picks the centroid of least e^T M e (brute force here),
 * within the rounding of the binary32 transform; beam 8 is never worse than
 * greedy under M; the codes differ from the Euclidean ones somewhere. */
START_TEST(encode_under_metric)
{
    float *mk = gen_metric(0), *mv = gen_metric(1);
    fkvf_rvq_metric met = {mk, mv};
    fkvf_rvq *q = train(NULL, 100, 96);
    enum { N = 64 };
    uint16_t rows[N * ROW_ELEMS];
    gen_rows(rows, 5000, N);
    fkvf_rows in = {rows, N, FKVF_DTYPE_F16, 0};
    static uint16_t eu[N * CPP], gm[N * CPP], bm[N * CPP];
    ck_assert_int_eq(fkvf_rvq_encode(q, &in, NULL, 1, eu, CPP, 1), FKVF_OK);
    ck_assert_int_eq(fkvf_rvq_get_metric(q, NULL), 0);
    ck_assert_int_eq(fkvf_rvq_set_metric(q, &met), FKVF_OK);
    fkvf_rvq_metric got;
    ck_assert_int_eq(fkvf_rvq_get_metric(q, &got), 1);
    ck_assert(got.keys != mk && !memcmp(got.keys, mk, sizeof(float) * NTAB * D * D));
    ck_assert(!memcmp(got.values, mv, sizeof(float) * NTAB * D * D));
    ck_assert_int_eq(fkvf_rvq_encode(q, &in, NULL, 1, gm, CPP, 1), FKVF_OK);
    ck_assert_int_eq(fkvf_rvq_encode(q, &in, NULL, 8, bm, CPP, 1), FKVF_OK);
    size_t differ = 0;
    for (size_t i = 0; i < N; i++)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++)
                for (int kv = 0; kv < 2; kv++) {
                    const float *m = (kv ? mv : mk) + ((size_t)l * H + h) * D * D;
                    double x[D], best = INFINITY;
                    vec_of(rows, i, l, h, kv, x);
                    const float *c0 = fkvf_rvq_centroids(q, (uint32_t)l, (uint32_t)h,
                                                         (unsigned)kv, 0);
                    for (int c = 0; c < K; c++) {
                        double cd[D];
                        for (int e = 0; e < D; e++)
                            cd[e] = c0[c * D + e];
                        double e2 = mdist(m, x, cd);
                        best = e2 < best ? e2 : best;
                    }
                    uint16_t pick = gm[i * CPP + code_at(l, h, kv, 0)];
                    double cp[D];
                    for (int e = 0; e < D; e++)
                        cp[e] = c0[pick * D + e];
                    double ep = mdist(m, x, cp);
                    ck_assert_msg(ep <= best * (1 + 1e-5) + 1e-9,
                                  "row %zu (%d,%d,%d): picked %u at %g, best %g", i, l, h, kv,
                                  pick, ep, best);
                    if (pick != eu[i * CPP + code_at(l, h, kv, 0)])
                        differ++;
                    const float *mm = kv ? mv : mk;
                    double eg = code_err(q, mm, rows, i, gm, l, h, kv);
                    double eb = code_err(q, mm, rows, i, bm, l, h, kv);
                    ck_assert_msg(eb <= eg * (1 + 1e-5) + 1e-9, "beam %g > greedy %g", eb, eg);
                }
    ck_assert_msg(differ > N / 4, "the metric changed only %zu stage-0 choices", differ);
    /* a subset keeps the metric; removing it restores the Euclidean codes */
    fkvf_rvq *qs = NULL;
    ck_assert_int_eq(fkvf_rvq_subset(&qs, q, KS, VS), FKVF_OK);
    ck_assert_int_eq(fkvf_rvq_get_metric(qs, NULL), 1);
    static uint16_t sm[N * CPP];
    ck_assert_int_eq(fkvf_rvq_encode(qs, &in, NULL, 1, sm, CPP, 1), FKVF_OK);
    ck_assert(!memcmp(sm, gm, sizeof gm));
    ck_assert_int_eq(fkvf_rvq_set_metric(q, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_rvq_get_metric(q, &got), 0);
    ck_assert_ptr_null(got.keys);
    ck_assert_int_eq(fkvf_rvq_encode(q, &in, NULL, 1, sm, CPP, 1), FKVF_OK);
    ck_assert(!memcmp(sm, eu, sizeof eu));
    /* keys only: values encode as before */
    fkvf_rvq_metric konly = {mk, NULL};
    ck_assert_int_eq(fkvf_rvq_set_metric(q, &konly), FKVF_OK);
    ck_assert_int_eq(fkvf_rvq_encode(q, &in, NULL, 1, sm, CPP, 1), FKVF_OK);
    for (size_t i = 0; i < N; i++)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++) {
                size_t j = i * CPP + code_at(l, h, 1, 0);
                ck_assert_uint_eq(sm[j], eu[j]);
                j = i * CPP + code_at(l, h, 0, 0);
                ck_assert_uint_eq(sm[j], gm[j]);
            }
    fkvf_rvq_free(qs);
    fkvf_rvq_free(q);
    free(mk);
    free(mv);
}
END_TEST

/* The identity metric: the same codes (greedy and beam, keys pre-RoPE) and
 * the same trained tables as no metric, bit for bit. */
START_TEST(identity_is_euclidean)
{
    float *id = identity_metric();
    fkvf_rvq_metric met = {id, id};
    fkvf_rvq *qe = train(NULL, 100, 96), *qi = train(&met, 100, 96);
    size_t n = fkvf_rvq_tables_size(qe);
    ck_assert_uint_eq(n, fkvf_rvq_tables_size(qi));
    uint8_t *t1 = malloc(n), *t2 = malloc(n);
    ck_assert(t1 && t2);
    ck_assert_int_eq(fkvf_rvq_tables(qe, t1, n), FKVF_OK);
    ck_assert_int_eq(fkvf_rvq_tables(qi, t2, n), FKVF_OK);
    ck_assert(!memcmp(t1, t2, n));
    ck_assert_int_eq(fkvf_rvq_get_metric(qi, NULL), 1);
    enum { N = 40 };
    uint16_t rows[N * ROW_ELEMS];
    gen_rows(rows, 900, N);
    fkvf_rows in = {rows, N, FKVF_DTYPE_F16, 1234};
    fkvf_rope rope = {1, D, 10000.0};
    static uint16_t a[N * CPP], b[N * CPP];
    for (unsigned beam = 1; beam <= 8; beam += 7) {
        ck_assert_int_eq(fkvf_rvq_encode(qe, &in, &rope, beam, a, CPP, 1), FKVF_OK);
        ck_assert_int_eq(fkvf_rvq_encode(qi, &in, &rope, beam, b, CPP, 1), FKVF_OK);
        ck_assert(!memcmp(a, b, sizeof a));
    }
    free(t1);
    free(t2);
    fkvf_rvq_free(qe);
    fkvf_rvq_free(qi);
    free(id);
}
END_TEST

/* Training under M lowers the error under M on held-out rows against the
 * Euclidean training (both encoded under M), and per-layer counts train
 * under a metric too. */
START_TEST(training_under_metric)
{
    float *mk = gen_metric(0), *mv = gen_metric(1);
    fkvf_rvq_metric met = {mk, mv};
    fkvf_rvq *qe = train(NULL, 100, 160), *qm = train(&met, 100, 160);
    ck_assert_int_eq(fkvf_rvq_set_metric(qe, &met), FKVF_OK); /* encode both under M */
    enum { N = 96 };
    uint16_t *rows = malloc((size_t)N * ROW_BYTES);
    ck_assert_ptr_nonnull(rows);
    gen_rows(rows, 70000, N);
    fkvf_rows in = {rows, N, FKVF_DTYPE_F16, 0};
    static uint16_t ce[N * CPP], cm[N * CPP];
    ck_assert_int_eq(fkvf_rvq_encode(qe, &in, NULL, 1, ce, CPP, 1), FKVF_OK);
    ck_assert_int_eq(fkvf_rvq_encode(qm, &in, NULL, 1, cm, CPP, 1), FKVF_OK);
    double se = 0, sm = 0;
    for (size_t i = 0; i < N; i++)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++)
                for (int kv = 0; kv < 2; kv++) {
                    se += code_err(qe, kv ? mv : mk, rows, i, ce, l, h, kv);
                    sm += code_err(qm, kv ? mv : mk, rows, i, cm, l, h, kv);
                }
    ck_assert_msg(sm < 0.9 * se, "metric training %g, Euclidean %g", sm, se);
    /* per-layer counts under a metric: layer 1 without value stages */
    static const uint8_t table[2 * L] = {2, 1, 1, 0};
    fkvf_rvq_params p;
    params(&p);
    p.metric = &met;
    p.layer_stages = table;
    fkvf_rows blk = {rows, N, FKVF_DTYPE_F16, 0};
    fkvf_rvq *ql = NULL;
    ck_assert_int_eq(fkvf_rvq_train(&ql, &p, &blk, 1, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_rvq_get_metric(ql, NULL), 1);
    size_t cpp = fkvf_rvq_codes_per_position(ql);
    ck_assert_uint_eq(cpp, H * (3 + 1));
    uint16_t *cl = malloc((size_t)N * cpp * 2);
    ck_assert_ptr_nonnull(cl);
    ck_assert_int_eq(fkvf_rvq_encode(ql, &in, NULL, 8, cl, cpp, 1), FKVF_OK);
    free(cl);
    fkvf_rvq_free(ql);
    free(rows);
    fkvf_rvq_free(qe);
    fkvf_rvq_free(qm);
    free(mk);
    free(mv);
}
END_TEST

/* A metric of one part leaves the other part's tables as Euclidean training
 * makes them, bit for bit (each table is trained on its own; regression: the
 * Euclidean part's tables of a keys-only metric training came back zero). */
START_TEST(regress_partial_metric_keeps_other_tables)
{
    float *mk = gen_metric(0), *mv = gen_metric(1);
    fkvf_rvq *qe = train(NULL, 100, 96);
    for (int part = 0; part < 2; part++) {
        fkvf_rvq_metric met = {part ? NULL : mk, part ? mv : NULL};
        fkvf_rvq *qm = train(&met, 100, 96);
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t h = 0; h < H; h++)
                for (unsigned kv = 0; kv < 2; kv++)
                    for (unsigned st = 0; st < (kv ? VS : KS); st++) {
                        const float *a = fkvf_rvq_centroids(qe, l, h, kv, st);
                        const float *b = fkvf_rvq_centroids(qm, l, h, kv, st);
                        int same = !memcmp(a, b, sizeof(float) * K * D);
                        /* the part under the metric differs, the other is equal */
                        ck_assert_msg(same == ((int)kv != part),
                                      "metric on %s: table (%u, %u, %u, %u) %s",
                                      part ? "values" : "keys", l, h, kv, st,
                                      same ? "equal" : "differs");
                    }
        fkvf_rvq_free(qm);
    }
    fkvf_rvq_free(qe);
    free(mk);
    free(mv);
}
END_TEST

/* A matrix is taken as its symmetric part; one whose symmetric part is not
 * finite and positive definite, and shapes the metric does not allow, are
 * refused; the handle keeps its metric. */
START_TEST(metric_refusals)
{
    fkvf_rvq *q = train(NULL, 100, 64);
    float *mk = gen_metric(0), *bad = gen_metric(0);
    fkvf_rvq_metric ok = {mk, NULL}, m = {bad, NULL};
    ck_assert_int_eq(fkvf_rvq_set_metric(q, &ok), FKVF_OK);
    /* (0, 1) of the last table doubled and (1, 0) zeroed: not symmetric, but
     * the same symmetric part (2a + 0) / 2 = a, exactly */
    {
        float *sk = bad + 3 * D * D, a = sk[1];
        sk[1] = 2.0f * a;
        sk[D] = 0.0f;
        ck_assert_int_eq(fkvf_metric_matrix_check(sk, D, NULL), 0);
        ck_assert_int_eq(fkvf_rvq_set_metric(q, &m), FKVF_OK);
        fkvf_rvq_metric got;
        ck_assert_int_eq(fkvf_rvq_get_metric(q, &got), 1);
        ck_assert(!memcmp(got.keys, mk, sizeof(float) * NTAB * D * D));
        ck_assert_int_eq(fkvf_rvq_set_metric(q, &ok), FKVF_OK);
    }
    memcpy(bad, mk, sizeof(float) * NTAB * D * D);
    bad[2 * D * D + 9] = NAN;
    ck_assert_int_eq(fkvf_rvq_set_metric(q, &m), FKVF_E_INVALID_ARG);
    memcpy(bad, mk, sizeof(float) * NTAB * D * D);
    /* [[1, 2], [2, 1]] in the corner of table 1: indefinite */
    bad[D * D + 0] = 1;
    bad[D * D + 1] = 2;
    bad[D * D + D] = 2;
    bad[D * D + D + 1] = 1;
    ck_assert_int_eq(fkvf_rvq_set_metric(q, &m), FKVF_E_INVALID_ARG);
    memcpy(bad, mk, sizeof(float) * NTAB * D * D);
    bad[5 * D + 5] = 0; /* a zero row and column */
    for (int j = 0; j < D; j++)
        bad[5 * D + j] = bad[j * D + 5] = 0;
    ck_assert_int_eq(fkvf_rvq_set_metric(q, &m), FKVF_E_INVALID_ARG);
    fkvf_rvq_metric got;
    ck_assert_int_eq(fkvf_rvq_get_metric(q, &got), 1);
    ck_assert(!memcmp(got.keys, mk, sizeof(float) * NTAB * D * D));
    ck_assert_int_eq(fkvf_rvq_set_metric(NULL, &ok), FKVF_E_INVALID_ARG);
    /* training refuses them too */
    fkvf_rvq_params p;
    params(&p);
    p.metric = &m;
    uint16_t rows[8 * ROW_ELEMS];
    gen_rows(rows, 0, 8);
    fkvf_rows blk = {rows, 8, FKVF_DTYPE_F16, 0};
    fkvf_rvq *t = NULL;
    ck_assert_int_eq(fkvf_rvq_train(&t, &p, &blk, 1, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(t);
    /* a decode-only handle cannot encode, so it takes no metric */
    size_t n = fkvf_rvq_tables_size(q);
    void *tables = malloc(n);
    ck_assert_int_eq(fkvf_rvq_tables(q, tables, n), FKVF_OK);
    fkvf_codebook_shape sh;
    fkvf_rvq_shape(q, &sh, NULL);
    fkvf_rvq *dq = NULL;
    ck_assert_int_eq(fkvf_rvq_from_tables_decode(&dq, &sh, H, tables, n, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_rvq_set_metric(dq, &ok), FKVF_E_INVALID_ARG);
    fkvf_rvq_free(dq);
    free(tables);
    fkvf_rvq_free(q);
    free(mk);
    free(bad);
}
END_TEST

/* ---- files ------------------------------------------------------------------------ */

static void desc_init(fkvf_desc *d)
{
    memset(d, 0, sizeof *d);
    d->n_layers = L;
    d->n_kv_heads = H;
    d->key_dim = d->value_dim = D;
    d->dtype = FKVF_DTYPE_F16;
    d->n_sinks = SINKS;
    d->window = WINDOW;
    d->model_id = "test/metric";
}

static const size_t batches[] = {7, 10, 5, 9};
enum { N_BATCHES = sizeof batches / sizeof batches[0] };

static void append_batches(const char *path, const fkvf_rvq *q, fkvf_reader *cbref, size_t b0,
                           size_t b1, uint64_t *n)
{
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.block_size = 64;
    o.no_auto_compact = 1;
    if (cbref && b0 > 0)
        o.codebook_file = cbref;
    fkvf_appender *a = NULL;
    int rc;
    if (b0 == 0) {
        fkvf_desc d;
        desc_init(&d);
        fkvf_append_create c;
        memset(&c, 0, sizeof c);
        c.desc = &d;
        c.codebook = cbref ? NULL : q;
        c.codebook_ref = cbref;
        c.codebook_name = "cb.fkvf";
        rc = fkvf_appender_create(&a, path, &c, &o, NULL);
    } else {
        rc = fkvf_appender_open(&a, path, &o, NULL);
    }
    ck_assert_msg(rc == FKVF_OK, "appender: %s", fkvf_appender_message(a));
    uint16_t rows[16 * ROW_ELEMS];
    for (size_t i = b0; i < b1; i++) {
        gen_rows(rows, *n, batches[i]);
        ck_assert_int_eq(fkvf_appender_append(a, rows, batches[i] * ROW_BYTES, batches[i], NULL),
                         FKVF_OK);
        rc = fkvf_appender_commit(a);
        ck_assert_msg(rc == FKVF_OK, "commit: %s", fkvf_appender_message(a));
        *n += batches[i];
    }
    fkvf_appender_free(a);
}

/* What the first n positions restore to when encoded by q: sinks and the
 * last WINDOW exact, the rest q's reconstruction. */
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

/* r restores what qm (with the metric) gives, not what qe (without) gives */
static void check_restore(fkvf_reader *r, const fkvf_rvq *qm, const fkvf_rvq *qe, uint64_t n)
{
    uint16_t *want = expected_rows(qm, n), *plain = expected_rows(qe, n);
    uint16_t *got = malloc((size_t)n * ROW_BYTES);
    ck_assert_ptr_nonnull(got);
    int rc = fkvf_reader_restore(r, 0, n, FKVF_DTYPE_F16, got, (size_t)n * ROW_BYTES);
    ck_assert_msg(rc == FKVF_OK, "restore: %s", fkvf_reader_message(r));
    ck_assert(!memcmp(got, want, (size_t)n * ROW_BYTES));
    ck_assert(memcmp(got, plain, (size_t)n * ROW_BYTES) != 0);
    rc = fkvf_reader_verify(r);
    ck_assert_msg(rc == FKVF_OK, "verify: %s", fkvf_reader_message(r));
    free(want);
    free(plain);
    free(got);
}

static void check_metric(fkvf_reader *r, const float *mk, const float *mv)
{
    fkvf_rvq_metric m;
    int rc = fkvf_reader_metric(r, &m);
    ck_assert_msg(rc == FKVF_OK, "metric: %s", fkvf_reader_message(r));
    ck_assert(m.keys && !memcmp(m.keys, mk, sizeof(float) * NTAB * D * D));
    ck_assert(m.values && !memcmp(m.values, mv, sizeof(float) * NTAB * D * D));
}

/* An appender creates an archive with a codebook that has a metric: the
 * CMET is written, new positions are encoded under it, also after reopening
 * (the metric read from the file), and compaction keeps it. */
/* The files' fixture: the metric (mk, mv), a codebook without it (qe) and
 * the same tables with it (qm). */
static void files_fixture(float **mk, float **mv, fkvf_rvq **qe, fkvf_rvq **qm)
{
    *mk = gen_metric(0);
    *mv = gen_metric(1);
    fkvf_rvq_metric met = {*mk, *mv};
    *qe = train(NULL, 100, 96);
    *qm = train(NULL, 100, 96);
    ck_assert_int_eq(fkvf_rvq_set_metric(*qm, &met), FKVF_OK);
}

START_TEST(archive_embedded)
{
    make_dir();
    char a[128], b[128];
    path_in(a, sizeof a, "a.fkvf");
    path_in(b, sizeof b, "b.fkvf");
    float *mk, *mv;
    fkvf_rvq *qe, *qm;
    files_fixture(&mk, &mv, &qe, &qm);
    uint64_t n = 0;
    append_batches(a, qm, NULL, 0, 2, &n);
    append_batches(a, NULL, NULL, 2, N_BATCHES, &n);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, a, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    ck_assert(ai.optional_features & FKVF_OPTFEAT_ENCODER_METRIC);
    ck_assert_uint_eq(ai.format_minor, 2); /* the bit came with 1.2 (spec 1.3.1) */
    check_metric(r, mk, mv);
    check_restore(r, qm, qe, n);
    fkvf_reader_free(r);
    fkvf_compact_options co;
    fkvf_compact_options_init(&co);
    fkvf_archive_op *op = NULL;
    ck_assert_int_eq(fkvf_archive_compact(&op, a, b, &co, NULL), FKVF_OK);
    fkvf_archive_op_free(op);
    ck_assert_int_eq(fkvf_reader_open_file(&r, b, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    check_metric(r, mk, mv);
    check_restore(r, qm, qe, n);
    fkvf_reader_free(r);
    /* appending to the compacted file keeps encoding under the metric */
    append_batches(b, NULL, NULL, 3, N_BATCHES, &n);
    ck_assert_int_eq(fkvf_reader_open_file(&r, b, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    check_restore(r, qm, qe, n);
    fkvf_reader_free(r);
    fkvf_rvq_free(qe);
    fkvf_rvq_free(qm);
    free(mk);
    free(mv);
    rm_dir();
}
END_TEST

/* Regression: the appender's estimate of its compacted size left the CMET
 * out after a reopen, so small commits of later sessions set off automatic
 * compactions early (with a large metric, every other session). Sessions
 * of two positions each, reopened every time: the metric's bytes are live
 * bytes, so the archive with it compacts for the first time no earlier
 * than the same archive without it. */
static void sessions(const char *path, const fkvf_rvq *q, uint64_t *commits, int n_sessions)
{
    uint64_t n = 0;
    append_batches(path, q, NULL, 0, 1, &n);
    uint16_t rows[2 * ROW_ELEMS];
    for (int session = 0; session < n_sessions; session++) {
        fkvf_append_options o;
        fkvf_append_options_init(&o);
        o.sync = FKVF_SYNC_NONE;
        fkvf_appender *ap = NULL;
        ck_assert_int_eq(fkvf_appender_open(&ap, path, &o, NULL), FKVF_OK);
        gen_rows(rows, n, 2);
        ck_assert_int_eq(fkvf_appender_append(ap, rows, sizeof rows, 2, NULL), FKVF_OK);
        ck_assert_int_eq(fkvf_appender_commit(ap), FKVF_OK);
        n += 2;
        fkvf_appender_free(ap);
        fkvf_reader *r = NULL;
        ck_assert_int_eq(fkvf_reader_open_file(&r, path, 0, NULL), FKVF_OK);
        fkvf_archive_info ai;
        ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
        fkvf_reader_free(r);
        commits[session] = ai.n_commits;
    }
}

START_TEST(regress_autocompact_counts_metric)
{
    make_dir();
    char a[128], b[128];
    path_in(a, sizeof a, "a.fkvf");
    path_in(b, sizeof b, "b.fkvf");
    float *mk, *mv;
    fkvf_rvq *qe, *qm;
    files_fixture(&mk, &mv, &qe, &qm);
    enum { NS = 8 };
    uint64_t ce[NS], cm[NS];
    sessions(a, qe, ce, NS);
    sessions(b, qm, cm, NS);
    /* the first session whose commit did not add to the count (a compaction
     * restarted it); created with 2 commits */
    int fe = NS, fm = NS;
    for (int i = 0; i < NS; i++) {
        uint64_t before_e = i ? ce[i - 1] : 2, before_m = i ? cm[i - 1] : 2;
        if (fe == NS && ce[i] != before_e + 1)
            fe = i;
        if (fm == NS && cm[i] != before_m + 1)
            fm = i;
    }
    ck_assert_msg(fe < NS, "no compaction without the metric in %d sessions", NS);
    ck_assert_msg(fm >= fe, "first compaction at session %d with the metric, %d without", fm, fe);
    fkvf_rvq_free(qe);
    fkvf_rvq_free(qm);
    free(mk);
    free(mv);
    rm_dir();
}
END_TEST

/* A codebook file holding the metric (written by the writer, deflated); an
 * archive refers to it by hash: the appender encodes under the file's
 * metric, and the archive's reader hands it over once attached. */
START_TEST(archive_external)
{
    make_dir();
    char cb[128], a[128];
    path_in(cb, sizeof cb, "cb.fkvf");
    path_in(a, sizeof a, "ext.fkvf");
    float *mk, *mv;
    fkvf_rvq *qe, *qm;
    files_fixture(&mk, &mv, &qe, &qm);
    fkvf_rvq_metric met = {mk, mv};
    {
        fkvf_writer_options wo;
        fkvf_writer_options_init(&wo);
        wo.required_features = FKVF_FEAT_DEFLATE;
        wo.optional_features = FKVF_OPTFEAT_ENCODER_METRIC;
        wo.sync = FKVF_SYNC_NONE;
        fkvf_writer *w = NULL;
        ck_assert_int_eq(fkvf_writer_create_file(&w, cb, &wo, NULL), FKVF_OK);
        /* the metric needs the codebook first */
        ck_assert_int_eq(fkvf_writer_add_metric(w, &met, 0), FKVF_E_STATE);
        fkvf_codebook_shape sh;
        fkvf_rvq_shape(qm, &sh, NULL);
        size_t tn = fkvf_rvq_tables_size(qm);
        void *t = malloc(tn);
        ck_assert_int_eq(fkvf_rvq_tables(qm, t, tn), FKVF_OK);
        ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, t, tn, 0), FKVF_OK);
        free(t);
        float *bad = gen_metric(0);
        bad[1] = bad[D] = INFINITY;
        fkvf_rvq_metric bm = {bad, NULL};
        ck_assert_int_eq(fkvf_writer_add_metric(w, &bm, 0), FKVF_E_INVALID_ARG);
        free(bad);
        ck_assert_int_eq(fkvf_writer_add_metric(w, &met, FKVF_SECTION_DEFLATE), FKVF_OK);
        ck_assert_int_eq(fkvf_writer_add_metric(w, &met, 0), FKVF_E_STATE); /* one only */
        ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
        fkvf_writer_free(w);
    }
    fkvf_reader *cr = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&cr, cb, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    check_metric(cr, mk, mv);
    int rc = fkvf_reader_verify(cr);
    ck_assert_msg(rc == FKVF_OK, "verify: %s", fkvf_reader_message(cr));
    uint64_t n = 0;
    append_batches(a, NULL, cr, 0, 2, &n);
    append_batches(a, NULL, cr, 2, N_BATCHES, &n);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, a, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    fkvf_rvq_metric m;
    ck_assert_int_eq(fkvf_reader_metric(r, &m), FKVF_E_CODEBOOK); /* not attached */
    ck_assert_int_eq(fkvf_reader_attach_codebook(r, cr), FKVF_OK);
    check_metric(r, mk, mv);
    check_restore(r, qm, qe, n);
    fkvf_reader_free(r);
    fkvf_reader_free(cr);
    fkvf_rvq_free(qe);
    fkvf_rvq_free(qm);
    free(mk);
    free(mv);
    rm_dir();
}
END_TEST

/* ---- crafted sections --------------------------------------------------------------- */

/* An archive with an embedded codebook and, as a raw section, the CMET
 * bytes cm (the writer's own function would refuse a bad one). */
static void write_raw(tu_buf *file, const fkvf_rvq *q, const uint8_t *cm, size_t cn,
                      uint32_t flags)
{
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    wo.optional_features = FKVF_OPTFEAT_ENCODER_METRIC;
    fkvf_sink sink = tu_buf_sink(file);
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &wo, NULL), FKVF_OK);
    fkvf_desc d;
    desc_init(&d);
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    fkvf_codebook_shape sh;
    fkvf_rvq_shape(q, &sh, NULL);
    size_t tn = fkvf_rvq_tables_size(q);
    void *t = malloc(tn);
    ck_assert_int_eq(fkvf_rvq_tables(q, t, tn), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, t, tn, 0), FKVF_OK);
    free(t);
    ck_assert_int_eq(fkvf_writer_add_section(w, FKVF_SECTION_CMET, flags, 0, cm, cn), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_positions(w, 0, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
}

/* The CMET bytes of metric mk (keys only) for q's codebook, by the spec's
 * layout (13.8), built here byte by byte. */
static uint8_t *cmet_bytes(const fkvf_rvq *q, const float *mk, size_t *size)
{
    fkvf_codebook_shape sh;
    fkvf_rvq_shape(q, &sh, NULL);
    size_t tn = fkvf_rvq_tables_size(q);
    /* the CBK1 contents: the 64-byte header (13.1) then the tables */
    uint8_t *cbk = calloc(1, 64 + tn);
    ck_assert_ptr_nonnull(cbk);
    const uint32_t hdr[5] = {sh.n_layers, sh.n_heads, sh.key_dim, sh.value_dim, sh.k};
    for (int i = 0; i < 5; i++)
        for (int b = 0; b < 4; b++)
            cbk[4 * i + b] = (uint8_t)(hdr[i] >> (8 * b));
    cbk[20] = sh.k_stages;
    cbk[21] = sh.v_stages;
    cbk[22] = (uint8_t)sh.dtype;
    cbk[23] = sh.pooled;
    ck_assert_int_eq(fkvf_rvq_tables(q, cbk + 64, tn), FKVF_OK);
    *size = 64 + (size_t)NTAB * D * D * 4;
    uint8_t *p = calloc(1, *size);
    ck_assert_ptr_nonnull(p);
    fkvf_codebook_hash(cbk, 64 + tn, p);
    free(cbk);
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 4; b++)
            p[16 + 4 * i + b] = (uint8_t)(hdr[i] >> (8 * b));
    p[32] = 1; /* keys */
    p[33] = 3; /* f32 */
    for (size_t i = 0; i < (size_t)NTAB * D * D; i++) {
        uint32_t u;
        memcpy(&u, &mk[i], 4);
        for (int b = 0; b < 4; b++)
            p[64 + 4 * i + b] = (uint8_t)(u >> (8 * b));
    }
    return p;
}

static void put_f32(uint8_t *p, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    for (int b = 0; b < 4; b++)
        p[b] = (uint8_t)(u >> (8 * b));
}

/* Each fault is found by full verification and fkvf_reader_metric with its
 * class, the ordinary open and restore ignore it, and the appender refuses
 * to encode under it; the intact bytes pass. */
START_TEST(crafted_refusals)
{
    make_dir();
    char path[128];
    path_in(path, sizeof path, "bad.fkvf");
    fkvf_rvq *q = train(NULL, 100, 64);
    float *mk = gen_metric(0);
    size_t cn;
    uint8_t *good = cmet_bytes(q, mk, &cn);
    struct {
        const char *what;
        int klass;
    } cases[] = {
        {"intact", FKVF_OK},        {"short header", FKVF_E_TRUNCATED},
        {"parts 0", FKVF_E_CORRUPT}, {"dtype 1", FKVF_E_CORRUPT},
        {"reserved", FKVF_E_CORRUPT}, {"dim 1025", FKVF_E_LIMIT},
        {"size short", FKVF_E_TRUNCATED}, {"size long", FKVF_E_CORRUPT},
        {"hash", FKVF_E_CORRUPT},    {"heads", FKVF_E_CORRUPT},
        {"asymmetric", FKVF_E_CORRUPT}, {"infinite", FKVF_E_CORRUPT},
        {"indefinite", FKVF_E_CORRUPT},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint8_t *cm = calloc(1, cn + 64);
        ck_assert_ptr_nonnull(cm);
        memcpy(cm, good, cn);
        size_t len = cn;
        switch (c) {
        case 1: len = 40; break;
        case 2: cm[32] = 0; break;
        case 3: cm[33] = 1; break;
        case 4: cm[50] = 1; break;
        case 5: cm[24] = 1; cm[25] = 4; break; /* key_dim 1025 */
        case 6: len = cn - 4; break;
        case 7: len = cn + 4; break;
        case 8: cm[3] ^= 1; break;
        case 9: cm[20] = 1; break;          /* n_heads 1 */
        case 10: put_f32(cm + 64 + 4 * 1, 7.0f); break;
        case 11: put_f32(cm + 64 + 4 * (D * D + 9), INFINITY); break;
        case 12:
            put_f32(cm + 64 + 0, 1.0f);
            put_f32(cm + 64 + 4 * 1, 2.0f);
            put_f32(cm + 64 + 4 * D, 2.0f);
            put_f32(cm + 64 + 4 * (D + 1), 1.0f);
            break;
        }
        tu_buf file = {0};
        write_raw(&file, q, cm, len, 0);
        fkvf_reader *r = NULL;
        ck_assert_int_eq(fkvf_reader_open_memory(&r, file.data, file.size, 0, NULL), FKVF_OK);
        fkvf_rvq_metric m;
        int rc = fkvf_reader_metric(r, &m);
        ck_assert_msg(rc == cases[c].klass, "%s: metric %d (%s)", cases[c].what, rc,
                      fkvf_reader_message(r));
        if (rc)
            ck_assert_msg(strstr(fkvf_reader_message(r), "13.8") ||
                              strstr(fkvf_reader_message(r), "15"),
                          "%s: %s", cases[c].what, fkvf_reader_message(r));
        fkvf_reader_free(r);
        ck_assert_int_eq(fkvf_reader_open_memory(&r, file.data, file.size, 0, NULL), FKVF_OK);
        rc = fkvf_reader_verify(r);
        ck_assert_msg(rc == cases[c].klass, "%s: verify %d (%s)", cases[c].what, rc,
                      fkvf_reader_message(r));
        fkvf_reader_free(r);
        /* the appender: a bad metric stops it */
        tu_write_file(path, file.data, file.size);
        fkvf_append_options o;
        fkvf_append_options_init(&o);
        o.sync = FKVF_SYNC_NONE;
        fkvf_appender *a = NULL;
        rc = fkvf_appender_open(&a, path, &o, NULL);
        ck_assert_msg(rc == cases[c].klass, "%s: appender %d (%s)", cases[c].what, rc,
                      fkvf_appender_message(a));
        fkvf_appender_free(a);
        unlink(path);
        tu_buf_free(&file);
        free(cm);
    }
    /* raw CMET bytes are not appended to a file: a metric is written with its
     * codebook (fkvf_writer_add_metric checks it) */
    {
        tu_buf f2 = {0};
        write_raw(&f2, q, good, cn, 0);
        tu_write_file(path, f2.data, f2.size);
        fkvf_section_add sec = {FKVF_SECTION_CMET, 0, 0, good, cn};
        fkvf_archive_op *op = NULL;
        ck_assert_int_eq(fkvf_archive_append_sections(&op, path, &sec, 1, FKVF_SYNC_NONE),
                         FKVF_E_INVALID_ARG);
        fkvf_archive_op_free(op);
        size_t n2 = 0;
        uint8_t *back = tu_slurp(path, &n2);
        ck_assert(n2 == f2.size && !memcmp(back, f2.data, n2)); /* untouched */
        free(back);
        unlink(path);
        tu_buf_free(&f2);
    }
    /* with REQUIRED the entry is refused at open (as an unknown required one) */
    tu_buf file = {0};
    write_raw(&file, q, good, cn, FKVF_SECTION_REQUIRED);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, file.data, file.size, 0, NULL), FKVF_E_SECTION);
    fkvf_reader_free(r);
    tu_buf_free(&file);
    free(good);
    free(mk);
    fkvf_rvq_free(q);
    rm_dir();
}
END_TEST

/* Regression: a CMET in an archive that refers to an external codebook is a
 * fault (spec 13.8 step 5) that fkvf_reader_metric, and so the appender,
 * ignored (they went to the codebook file). The conformance file
 * metric_in_cbrf_archive with its codebook file. */
START_TEST(regress_metric_in_cbrf_archive)
{
    const char *src = getenv("FKVF_SRCDIR");
    ck_assert_ptr_nonnull(src);
    char in[512], cbp[512], path[128];
    snprintf(in, sizeof in, "%s/conformance/files/metric_in_cbrf_archive.fkvf", src);
    snprintf(cbp, sizeof cbp, "%s/conformance/files/valid_codebook_file.fkvf", src);
    make_dir();
    path_in(path, sizeof path, "ext.fkvf");
    size_t n = 0;
    uint8_t *data = tu_slurp(in, &n);
    tu_write_file(path, data, n);
    fkvf_reader *cb = NULL, *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&cb, cbp, 0, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, 0, NULL), FKVF_OK);
    fkvf_rvq_metric m;
    ck_assert_int_eq(fkvf_reader_metric(r, &m), FKVF_E_CORRUPT); /* also before attaching */
    ck_assert_int_eq(fkvf_reader_attach_codebook(r, cb), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_metric(r, &m), FKVF_E_CORRUPT);
    ck_assert(strstr(fkvf_reader_message(r), "13.8") != NULL);
    fkvf_reader_free(r);
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.codebook_file = cb;
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_open(&a, path, &o, NULL), FKVF_E_CORRUPT);
    fkvf_appender_free(a);
    size_t n2 = 0;
    uint8_t *back = tu_slurp(path, &n2);
    ck_assert(n2 == n && !memcmp(back, data, n)); /* untouched */
    free(back);
    free(data);
    fkvf_reader_free(cb);
    rm_dir();
}
END_TEST

/* ---- allocation failures ------------------------------------------------------------ */

START_TEST(allocation_failures)
{
    float *mk = gen_metric(0), *mv = gen_metric(1);
    fkvf_rvq_metric met = {mk, mv};
    fkvf_rvq *q = train(&met, 100, 48);
    enum { N = 12 };
    uint16_t rows[N * ROW_ELEMS];
    gen_rows(rows, 50, N);
    fkvf_rows blk = {rows, N, FKVF_DTYPE_F16, 0};
    static uint16_t want[N * CPP], got[N * CPP];
    ck_assert_int_eq(fkvf_rvq_encode(q, &blk, NULL, 4, want, CPP, 1), FKVF_OK);
    fkvf_codebook_shape sh;
    fkvf_rvq_shape(q, &sh, NULL);
    size_t tn = fkvf_rvq_tables_size(q);
    void *tables = malloc(tn);
    ck_assert_int_eq(fkvf_rvq_tables(q, tables, tn), FKVF_OK);
    /* a file with the metric, for the reader's path */
    tu_buf file = {0};
    {
        fkvf_writer_options wo;
        fkvf_writer_options_init(&wo);
        fkvf_sink sink = tu_buf_sink(&file);
        fkvf_writer *w = NULL;
        ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &wo, NULL), FKVF_OK);
        ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, tables, tn, 0), FKVF_OK);
        ck_assert_int_eq(fkvf_writer_add_metric(w, &met, 0), FKVF_OK);
        ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
        fkvf_writer_free(w);
    }
    fkvf_rvq_params p;
    params(&p);
    p.metric = &met;
    p.max_iters = 2;
    for (int op = 0; op < 5; op++) {
        int done = 0;
        for (long k = 0; !done; k++) {
            ck_assert_int_lt(k, 3000);
            tu_alloc fa = {0};
            fkvf_allocator al = tu_alloc_hook(&fa);
            fkvf_rvq *qq = NULL;
            fkvf_reader *r = NULL;
            if (op == 1 || op == 2)
                ck_assert_int_eq(fkvf_rvq_from_tables(&qq, &sh, H, tables, tn, &al), FKVF_OK);
            if (op == 2)
                ck_assert_int_eq(fkvf_rvq_set_metric(qq, &met), FKVF_OK);
            fa.fail_at = fa.calls + k + 1; /* the k-th allocation from here on fails */
            fa.fail_after = 1;
            int rc = FKVF_OK;
            switch (op) {
            case 0:
                rc = fkvf_rvq_train(&qq, &p, &blk, 1, &al);
                break;
            case 1:
                rc = fkvf_rvq_set_metric(qq, &met);
                break;
            case 2:
                rc = fkvf_rvq_encode(qq, &blk, NULL, 4, got, CPP, 1);
                break;
            case 4: { /* the writer: a codebook file with the metric */
                fkvf_writer_options wo;
                fkvf_writer_options_init(&wo);
                tu_buf out = {0};
                fkvf_sink sink = tu_buf_sink(&out);
                fkvf_writer *w = NULL;
                rc = fkvf_writer_create_sink(&w, &sink, &wo, &al);
                if (rc == FKVF_OK)
                    rc = fkvf_writer_add_codebooks(w, &sh, tables, tn, 0);
                if (rc == FKVF_OK)
                    rc = fkvf_writer_add_metric(w, &met, 0);
                if (rc == FKVF_OK)
                    rc = fkvf_writer_finish(w);
                fkvf_writer_free(w);
                if (rc == FKVF_OK)
                    ck_assert(out.size == file.size && !memcmp(out.data, file.data, file.size));
                tu_buf_free(&out);
                break;
            }
            case 3: {
                fkvf_rvq_metric m;
                rc = fkvf_reader_open_memory(&r, file.data, file.size, 0, &al);
                if (rc == FKVF_OK)
                    rc = fkvf_reader_metric(r, &m);
                if (rc == FKVF_OK)
                    ck_assert(!memcmp(m.keys, mk, sizeof(float) * NTAB * D * D));
                break;
            }
            }
            ck_assert_msg(rc == FKVF_OK || rc == FKVF_E_NOMEM, "op %d, k %ld: %d", op, k, rc);
            if (rc == FKVF_OK) {
                done = fa.failed == 0;
                fa.fail_at = 0; /* nothing fails from here on */
                if (op == 1) /* the metric in place: encodes as q */
                    rc = fkvf_rvq_encode(qq, &blk, NULL, 4, got, CPP, 1);
                if (op == 1 || op == 2) {
                    ck_assert_int_eq(rc, FKVF_OK);
                    ck_assert(!memcmp(got, want, sizeof want));
                }
            } else if (op == 1) {
                ck_assert_int_eq(fkvf_rvq_get_metric(qq, NULL), 0); /* unchanged */
            }
            fkvf_rvq_free(qq);
            fkvf_reader_free(r);
            tu_alloc_release(&fa);
            ck_assert_msg(fa.live == 0, "op %d k %ld: %ld allocations leaked", op, k, fa.live);
        }
    }
    tu_buf_free(&file);
    free(tables);
    fkvf_rvq_free(q);
    free(mk);
    free(mv);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("encoder_metric");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, encode_under_metric);
    tcase_add_test(tc, identity_is_euclidean);
    tcase_add_test(tc, training_under_metric);
    tcase_add_test(tc, regress_partial_metric_keeps_other_tables);
    tcase_add_test(tc, metric_refusals);
    tcase_add_test(tc, archive_embedded);
    tcase_add_test(tc, regress_autocompact_counts_metric);
    tcase_add_test(tc, archive_external);
    tcase_add_test(tc, crafted_refusals);
    tcase_add_test(tc, regress_metric_in_cbrf_archive);
    tcase_add_test(tc, allocation_failures);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
