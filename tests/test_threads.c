/* Threads (fkvf.h "threads"): every multi-threaded operation gives the bytes
 * of its one-thread run, for 2, 3 and 7 threads and FKVF_THREADS_ALL:
 * encoding (fkvf_rvq_encode: greedy and beam, f16 / bf16 / f32 rows, keys
 * un-rotated, per-layer stage counts, an encoder metric, f16 tables read in
 * place, both code layouts, row counts around the 16-row range minimum),
 * decoding (fkvf_rvq_decode to every dtype, rotated keys, borrowed f16
 * tables; a code out of range refused with nothing written), training
 * (fkvf_rvq_train: the tables of plain, rotated, pooled, per-layer and
 * metric training; the progress callback still counts 1, 2, ... todo), the
 * appender (the file of n_threads 3 is the file of 1),
 * fkvf_reader_restore, fkvf_reader_verify (OK files, and damaged ones
 * with faults in several pieces of one check: the code, offset and message
 * of the one-thread run, the first fault's, for every count: NaNs in a
 * codebook's centroids, out-of-order search index entries, section and
 * stream block checksums, padding bits of a large segment's streams) and
 * compaction's rebuild of the search indexes (fkvf_compact_options.
 * n_threads). And the parallel loops themselves: the error of the lowest
 * failing item whatever the schedule (fkvf_par_for; verify's rd_check_par,
 * with that item's message). */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fkvf.h"
#include "hash.h"
#include "le.h"
#include "parallel.h"
#include "read/reader_impl.h"
#include "testutil.h"

enum { L = 3, H = 2, D = 32, K = 32, ROW_ELEMS = L * H * 2 * D };

static const unsigned thread_counts[] = {2, 3, 7, FKVF_THREADS_ALL};
#define ALL_COUNTS (sizeof thread_counts / sizeof thread_counts[0])
/* FKVF_TEST_SPARSE (the CI's runs under qemu, where training and encoding
 * run 100 times slower): 3 threads only, and of each variant list every
 * other one */
static int sparse;
#define N_COUNTS (sparse ? 1u : ALL_COUNTS)
#define COUNT(c) (sparse ? 3u : thread_counts[c])
#define VAR_STEP (sparse ? 2 : 1)

static const fkvf_rope rope = {1, D, 10000.0};

/* n rows of random values in [-2, 2), as f32 host values */
static float *gen_f32(uint64_t seed, size_t n)
{
    float *v = tu_xcalloc(n * ROW_ELEMS, sizeof(float));
    tu_rng r = {seed * 0x9E3779B97F4A7C15u + 7};
    for (size_t i = 0; i < n * ROW_ELEMS; i++) {
        /* clustered a little, so that the tables mean something */
        double c = (double)(i % 7) / 4.0 - 0.75;
        v[i] = (float)(c + (double)(tu_next(&r) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    return v;
}

/* rows as the library takes them: little-endian bytes of dtype dt */
static void *rows_as(const float *v, size_t n, fkvf_dtype dt)
{
    size_t es = dt == FKVF_DTYPE_F32 ? 4 : 2;
    float *le = tu_le_f32_copy(v, n * ROW_ELEMS);
    void *out = tu_xcalloc(n * ROW_ELEMS, es);
    ck_assert_int_eq(fkvf_convert(dt, out, FKVF_DTYPE_F32, le, n * ROW_ELEMS), FKVF_OK);
    free(le);
    return out;
}

static void base_params(fkvf_rvq_params *p)
{
    fkvf_rvq_params_init(p);
    p->n_layers = L;
    p->n_kv_heads = H;
    p->key_dim = p->value_dim = D;
    p->k = K;
    p->k_stages = 2;
    p->v_stages = 1;
    p->max_iters = 3;
    p->samples_per_centroid = 8;
}

/* symmetric, diagonally dominant: positive definite */
static float *gen_metric(uint64_t seed)
{
    size_t n = (size_t)L * H;
    float *m = tu_xcalloc(n * D * D, sizeof(float));
    tu_rng r = {seed};
    for (size_t t = 0; t < n; t++) {
        float *a = m + t * D * D;
        for (int i = 0; i < D; i++)
            for (int j = 0; j <= i; j++) {
                float v = i == j ? 4.0f : (float)((double)tu_below(&r, 1000) / 4000.0);
                a[i * D + j] = a[j * D + i] = v;
            }
    }
    return m;
}

static uint8_t *tables_of(const fkvf_rvq *q, size_t *size)
{
    *size = fkvf_rvq_tables_size(q);
    uint8_t *t = tu_xcalloc(*size ? *size : 1, 1);
    ck_assert_int_eq(fkvf_rvq_tables(q, t, *size), FKVF_OK);
    return t;
}

/* The f16 handle of q's tables that encodes them in place (encode16) or
 * decodes them in place: FKVF_OK with *out and the tables in *tables (free
 * both), or FKVF_E_UNSUPPORTED where the CPU lacks its F16C kernel. */
static int f16_twin(const fkvf_rvq *q, int encode16, uint8_t **tables, fkvf_rvq **out)
{
    fkvf_codebook_shape sh;
    uint32_t heads;
    fkvf_rvq_shape(q, &sh, &heads);
    size_t ts;
    *tables = tables_of(q, &ts);
    *out = NULL;
    int rc = encode16 ? fkvf_rvq_from_tables16_encode(out, &sh, heads, *tables, ts, NULL)
                      : fkvf_rvq_from_tables16_borrow(out, &sh, heads, *tables, ts, NULL);
    ck_assert(rc == FKVF_OK || rc == FKVF_E_UNSUPPORTED);
    return rc;
}

/* in this order so that the sparse runs (every other one) keep rotated keys,
 * per-layer stages and the metric */
typedef enum { V_ROPE, V_POOLED, V_LAYERS, V_PLAIN, V_METRIC, V_COUNT } variant;
static const uint8_t layer_table[2 * L] = {2, 1, 1, 0, 0, 1};

static fkvf_rvq *train_variant(variant v, unsigned threads, const void *rows, size_t n,
                               fkvf_dtype dt, float *metric_k)
{
    fkvf_rvq_params p;
    base_params(&p);
    p.n_threads = threads;
    fkvf_rvq_metric m = {metric_k, NULL};
    if (v == V_ROPE)
        p.key_rope = &rope;
    if (v == V_POOLED)
        p.pooled = 1;
    if (v == V_LAYERS)
        p.layer_stages = layer_table;
    if (v == V_METRIC)
        p.metric = &m;
    fkvf_rows blk = {rows, n, dt, 5};
    fkvf_rvq *q = NULL;
    int rc = fkvf_rvq_train(&q, &p, &blk, 1, NULL);
    ck_assert_msg(rc == FKVF_OK, "train variant %d threads %u: %s", (int)v, threads,
                  fkvf_error_name(rc));
    return q;
}

/* ---- the parallel loop ---------------------------------------------------- */

typedef struct loop_ctx {
    atomic_int ran[64];
    atomic_uint max_worker;
    unsigned workers;
} loop_ctx;

static int loop_item(void *ctx, unsigned worker, size_t item)
{
    loop_ctx *c = ctx;
    atomic_fetch_add(&c->ran[item], 1);
    ck_assert_uint_lt(worker, c->workers);
    if (worker > atomic_load(&c->max_worker))
        atomic_store(&c->max_worker, worker);
    if (item == 9)
        nanosleep(&(struct timespec){0, 2000000}, NULL); /* a slow failure: the faster one
                                                          * above it must not win */
    return item == 9 ? -3 : item == 20 ? -4 : 0;
}

START_TEST(par_for_lowest_error)
{
    const unsigned counts[] = {1, 2, 3, 7, 64};
    for (size_t t = 0; t < sizeof counts / sizeof counts[0]; t++) {
        loop_ctx c;
        memset(&c, 0, sizeof c);
        c.workers = fkvf_par_workers(counts[t], 64);
        ck_assert_uint_eq(c.workers, counts[t] < 64 ? counts[t] : 64);
        int rc = fkvf_par_for(counts[t], 64, loop_item, &c);
        ck_assert_int_eq(rc, -3); /* item 9's, though item 20 may fail first */
        for (int i = 0; i <= 9; i++)
            ck_assert_int_eq(atomic_load(&c.ran[i]), 1); /* every item below ran, once */
        for (int i = 10; i < 64; i++)
            ck_assert_int_le(atomic_load(&c.ran[i]), 1);
        if (counts[t] == 1)
            for (int i = 10; i < 64; i++)
                ck_assert_int_eq(atomic_load(&c.ran[i]), 0); /* serial: stops at 9 */
    }
    ck_assert_uint_eq(fkvf_par_workers(0, 5), 1);
    ck_assert_uint_eq(fkvf_par_workers(8, 0), 1);
    ck_assert_uint_eq(fkvf_par_threads(0), 1);
    ck_assert_uint_eq(fkvf_par_threads(1), 1);
    ck_assert_uint_eq(fkvf_par_threads(5), 5);
    ck_assert_uint_eq(fkvf_par_threads(100000), FKVF_PAR_MAX);
    ck_assert_uint_eq(fkvf_par_threads(FKVF_THREADS_ALL), fkvf_cpu_count());
    ck_assert_uint_ge(fkvf_cpu_count(), 1);
    ck_assert_uint_le(fkvf_cpu_count(), 256);
}
END_TEST

START_TEST(api_defaults_and_refusals)
{
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    ck_assert_uint_eq(p.n_threads, 1);
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    ck_assert_uint_eq(o.n_threads, 0);
    ck_assert_int_eq(fkvf_rvq_set_threads(NULL, 2), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_reader_set_threads(NULL, 2), FKVF_E_STATE);
    /* a reader handle is not a quantizer */
    ck_assert_int_eq(fkvf_rvq_set_threads((fkvf_rvq *)(void *)&p, 2), FKVF_E_INVALID_ARG);
}
END_TEST

/* ---- training --------------------------------------------------------------- */

typedef struct prog {
    uint64_t calls, last, total;
    int bad;
} prog;

static void on_progress(void *opaque, uint64_t done, uint64_t total)
{
    prog *g = opaque; /* one call at a time (the library's lock) */
    if (done != g->last + 1 || (g->total && total != g->total))
        g->bad = 1;
    g->last = done;
    g->total = total;
    g->calls++;
}

START_TEST(train_same_any_threads)
{
    const size_t n = 200;
    float *v = gen_f32(1, n);
    void *rows = rows_as(v, n, FKVF_DTYPE_F16);
    float *mk = gen_metric(3);
    for (int var = 0; var < V_COUNT; var += VAR_STEP) {
        fkvf_rvq *q1 = train_variant((variant)var, 1, rows, n, FKVF_DTYPE_F16, mk);
        size_t s1;
        uint8_t *t1 = tables_of(q1, &s1);
        for (size_t c = 0; c < N_COUNTS; c++) {
            fkvf_rvq *qn = train_variant((variant)var, COUNT(c), rows, n,
                                         FKVF_DTYPE_F16, mk);
            size_t sn;
            uint8_t *tn = tables_of(qn, &sn);
            ck_assert_uint_eq(sn, s1);
            ck_assert_msg(memcmp(t1, tn, s1) == 0, "variant %d: tables differ at %u threads",
                          var, COUNT(c));
            free(tn);
            fkvf_rvq_free(qn);
        }
        free(t1);
        fkvf_rvq_free(q1);
    }
    /* the progress callback from worker threads: 1, 2, ..., todo */
    fkvf_rvq_params p;
    base_params(&p);
    p.n_threads = 3;
    prog g = {0, 0, 0, 0};
    p.progress = on_progress;
    p.progress_opaque = &g;
    fkvf_rows blk = {rows, n, FKVF_DTYPE_F16, 0};
    fkvf_rvq *q = NULL;
    ck_assert_int_eq(fkvf_rvq_train(&q, &p, &blk, 1, NULL), FKVF_OK);
    ck_assert_int_eq(g.bad, 0);
    ck_assert_uint_eq(g.calls, (uint64_t)L * H * 3);
    ck_assert_uint_eq(g.last, g.total);
    fkvf_rvq_free(q);
    free(mk);
    free(rows);
    free(v);
}
END_TEST

/* ---- encoding --------------------------------------------------------------- */

static uint16_t *encode_with(fkvf_rvq *q, unsigned threads, const void *rows, size_t n,
                             fkvf_dtype dt, const fkvf_rope *kr, unsigned beam, int per_stream)
{
    size_t cpp = fkvf_rvq_codes_per_position(q);
    uint16_t *codes = tu_xcalloc(n * cpp + 1, sizeof(uint16_t));
    fkvf_rows r = {rows, n, dt, 11};
    ck_assert_int_eq(fkvf_rvq_set_threads(q, threads), FKVF_OK);
    int rc = per_stream ? fkvf_rvq_encode(q, &r, kr, beam, codes, 1, n)
                        : fkvf_rvq_encode(q, &r, kr, beam, codes, cpp, 1);
    ck_assert_msg(rc == FKVF_OK, "encode: %s", fkvf_error_name(rc));
    return codes;
}

static void encode_check(fkvf_rvq *q, const void *rows, size_t n, fkvf_dtype dt,
                         const fkvf_rope *kr, unsigned beam, const char *what)
{
    size_t cpp = fkvf_rvq_codes_per_position(q);
    for (int ps = 0; ps < 2; ps++) {
        uint16_t *c1 = encode_with(q, 1, rows, n, dt, kr, beam, ps);
        for (size_t c = 0; c < N_COUNTS; c++) {
            uint16_t *cn = encode_with(q, COUNT(c), rows, n, dt, kr, beam, ps);
            ck_assert_msg(memcmp(c1, cn, n * cpp * sizeof(uint16_t)) == 0,
                          "%s: %zu rows, layout %d: codes differ at %u threads", what, n, ps,
                          COUNT(c));
            free(cn);
        }
        free(c1);
    }
}

START_TEST(encode_same_any_threads)
{
    /* 1 and 31: one range; 33: two of 16 and 17; 300: ranges of 150
     * (panel scoring, >= 128 rows) at 2 threads, of 100 (row scoring) at 3 */
    const size_t sizes[] = {1, 31, 33, 300};
    const size_t nmax = 300;
    float *tv = gen_f32(2, nmax);
    void *train16 = rows_as(tv, nmax, FKVF_DTYPE_F16);
    float *v = gen_f32(4, nmax);
    float *mk = gen_metric(5);
    for (int var = 0; var < V_COUNT; var += VAR_STEP) {
        fkvf_rvq *q = train_variant((variant)var, 1, train16, 128, FKVF_DTYPE_F16, mk);
        const fkvf_rope *kr = var == V_ROPE ? &rope : NULL;
        for (int dt = FKVF_DTYPE_F16; dt <= FKVF_DTYPE_F32; dt++) {
            void *rows = rows_as(v, nmax, (fkvf_dtype)dt);
            for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
                if (dt == FKVF_DTYPE_F16 || sizes[i] == 33)
                    encode_check(q, rows, sizes[i], (fkvf_dtype)dt, kr, 1, "greedy");
            if (dt == FKVF_DTYPE_F16 && var == V_PLAIN)
                encode_check(q, rows, 40, (fkvf_dtype)dt, kr, 4, "beam 4");
            free(rows);
        }
        fkvf_rvq_free(q);
    }
    /* f16 tables encoded in place (fkvf_rvq_from_tables16_encode) */
    fkvf_rvq *q = train_variant(V_PLAIN, 1, train16, 128, FKVF_DTYPE_F16, NULL);
    uint8_t *t;
    fkvf_rvq *q16;
    int rc = f16_twin(q, 1, &t, &q16);
    void *rows = rows_as(v, nmax, FKVF_DTYPE_F16);
    if (rc == FKVF_OK) {
        encode_check(q16, rows, 300, FKVF_DTYPE_F16, NULL, 1, "f16 tables in place");
        /* and the same codes as the handle they came from */
        uint16_t *a = encode_with(q, 1, rows, 300, FKVF_DTYPE_F16, NULL, 1, 0);
        uint16_t *b = encode_with(q16, 3, rows, 300, FKVF_DTYPE_F16, NULL, 1, 0);
        ck_assert_mem_eq(a, b, 300 * fkvf_rvq_codes_per_position(q) * sizeof(uint16_t));
        free(a);
        free(b);
    }
    free(rows);
    free(t);
    fkvf_rvq_free(q16);
    fkvf_rvq_free(q);
    free(mk);
    free(v);
    free(train16);
    free(tv);
}
END_TEST

/* ---- decoding --------------------------------------------------------------- */

static void decode_check(fkvf_rvq *q, const uint16_t *codes, size_t n, const fkvf_rope *kr,
                         const char *what)
{
    size_t cpp = fkvf_rvq_codes_per_position(q);
    for (int dt = FKVF_DTYPE_F16; dt <= FKVF_DTYPE_F32; dt++) {
        size_t size = n * ROW_ELEMS * (dt == FKVF_DTYPE_F32 ? 4 : 2);
        uint8_t *o1 = tu_xcalloc(size, 1), *on = tu_xcalloc(size, 1);
        ck_assert_int_eq(fkvf_rvq_set_threads(q, 1), FKVF_OK);
        ck_assert_int_eq(
            fkvf_rvq_decode(q, codes, cpp, 1, n, 3, kr, (fkvf_dtype)dt, o1, size), FKVF_OK);
        for (size_t c = 0; c < N_COUNTS; c++) {
            memset(on, 0x5A, size);
            ck_assert_int_eq(fkvf_rvq_set_threads(q, COUNT(c)), FKVF_OK);
            ck_assert_int_eq(
                fkvf_rvq_decode(q, codes, cpp, 1, n, 3, kr, (fkvf_dtype)dt, on, size), FKVF_OK);
            ck_assert_msg(memcmp(o1, on, size) == 0, "%s: dtype %d, %zu rows: differ at %u threads",
                          what, dt, n, COUNT(c));
        }
        free(o1);
        free(on);
    }
}

START_TEST(decode_same_any_threads)
{
    const size_t n = 300;
    float *v = gen_f32(6, n);
    void *rows = rows_as(v, n, FKVF_DTYPE_F16);
    float *mk = gen_metric(7);
    for (int var = 0; var < V_COUNT; var += VAR_STEP) {
        fkvf_rvq *q = train_variant((variant)var, 1, rows, 128, FKVF_DTYPE_F16, mk);
        const fkvf_rope *kr = var == V_ROPE ? &rope : NULL;
        uint16_t *codes = encode_with(q, 1, rows, n, FKVF_DTYPE_F16, kr, 1, 0);
        decode_check(q, codes, n, kr, "decode");
        decode_check(q, codes, 40, kr, "decode 40 rows");
        /* the handle restore decodes f16 codebooks with, where the CPU has it */
        uint8_t *t;
        fkvf_rvq *b;
        if (f16_twin(q, 0, &t, &b) == FKVF_OK)
            decode_check(b, codes, n, kr, "borrowed f16 tables");
        /* a code out of range in the last row: refused, nothing written */
        size_t cpp = fkvf_rvq_codes_per_position(q), size = n * ROW_ELEMS * 4;
        codes[(n - 1) * cpp] = K;
        uint8_t *o = tu_xcalloc(size, 1);
        memset(o, 0xAB, size);
        ck_assert_int_eq(fkvf_rvq_set_threads(q, 3), FKVF_OK);
        ck_assert_int_eq(fkvf_rvq_decode(q, codes, cpp, 1, n, 0, kr, FKVF_DTYPE_F32, o, size),
                         FKVF_E_RANGE);
        size_t touched = 0; /* one assertion: Check writes a message per assertion */
        for (size_t i = 0; i < size; i++)
            touched += o[i] != 0xAB;
        ck_assert_uint_eq(touched, 0);
        free(o);
        fkvf_rvq_free(b);
        free(t);
        free(codes);
        fkvf_rvq_free(q);
    }
    free(mk);
    free(rows);
    free(v);
}
END_TEST

/* ---- the appender and restore ----------------------------------------------- */

static char tmpdir[64];

/* queue: fkvf_appender_set_queue_bytes (0: the default; 1: the smallest,
 * so that the appends write index segments before each commit) */
static void archive_with(const char *path, const fkvf_rvq *q, unsigned threads, const void *rows,
                         size_t n, size_t queue)
{
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = L;
    d.n_kv_heads = H;
    d.key_dim = d.value_dim = D;
    d.dtype = FKVF_DTYPE_F16;
    d.n_sinks = 2;
    d.window = 8;
    d.key_transform = 1;
    d.rope_layout = 1;
    d.key_storage = 1;
    d.rope_dims = D;
    d.rope_theta = rope.theta;
    d.model_id = "test/threads";
    fkvf_append_create c;
    memset(&c, 0, sizeof c);
    c.desc = &d;
    c.codebook = q;
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.n_threads = threads;
    o.no_auto_compact = 1;
    fkvf_appender *a = NULL;
    unlink(path);
    int rc = fkvf_appender_create(&a, path, &c, &o, NULL);
    ck_assert_msg(rc == FKVF_OK, "create: %s", fkvf_appender_message(a));
    ck_assert_int_eq(fkvf_appender_set_queue_bytes(a, queue), FKVF_OK);
    const size_t batches[] = {1, 50, 3, 200, 46};
    size_t at = 0;
    for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++) {
        size_t m = batches[i] < n - at ? batches[i] : n - at;
        rc = fkvf_appender_append(a, (const uint8_t *)rows + at * ROW_ELEMS * 2,
                                  m * ROW_ELEMS * 2, m, NULL);
        ck_assert_int_eq(rc, FKVF_OK);
        ck_assert_msg(fkvf_appender_commit(a) == FKVF_OK, "commit: %s",
                      fkvf_appender_message(a));
        at += m;
    }
    fkvf_appender_free(a);
}

START_TEST(append_and_restore_same_any_threads)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fkvf-threads-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    const size_t n = 300;
    float *v = gen_f32(8, n);
    void *rows = rows_as(v, n, FKVF_DTYPE_F16);
    fkvf_rvq *q = train_variant(V_ROPE, 1, rows, n, FKVF_DTYPE_F16, NULL);
    char p1[128], p3[128];
    snprintf(p1, sizeof p1, "%s/t1.fkvf", tmpdir);
    snprintf(p3, sizeof p3, "%s/t3.fkvf", tmpdir);
    archive_with(p1, q, 1, rows, n, 0);
    archive_with(p3, q, 3, rows, n, 0);
    size_t s1, s3;
    uint8_t *f1 = tu_slurp(p1, &s1), *f3 = tu_slurp(p3, &s3);
    ck_assert_uint_eq(s1, s3);
    ck_assert_msg(memcmp(f1, f3, s1) == 0, "the appender's files differ at 3 threads");
    free(f3);
    /* commits written in pieces: the same bytes at 1 and 3 threads too */
    archive_with(p3, q, 1, rows, n, 1);
    f3 = tu_slurp(p3, &s3);
    ck_assert_uint_ne(s3, s1); /* more sections than the file above */
    archive_with(p3, q, 3, rows, n, 1);
    size_t s3b;
    uint8_t *f3b = tu_slurp(p3, &s3b);
    ck_assert_msg(s3 == s3b && memcmp(f3, f3b, s3) == 0,
                  "the appender's files written in pieces differ at 3 threads");
    free(f3);
    free(f3b);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, f1, s1, 0, NULL), FKVF_OK);
    fkvf_archive_info info;
    ck_assert_int_eq(fkvf_reader_info(r, &info), FKVF_OK);
    ck_assert_uint_gt(info.n_archived, 200);
    for (int dt = FKVF_DTYPE_F16; dt <= FKVF_DTYPE_F32; dt++) {
        size_t rb;
        ck_assert_int_eq(fkvf_reader_row_bytes(r, (fkvf_dtype)dt, &rb), FKVF_OK);
        uint8_t *o1 = tu_xcalloc(n, rb), *on = tu_xcalloc(n, rb);
        ck_assert_int_eq(fkvf_reader_set_threads(r, 1), FKVF_OK);
        ck_assert_int_eq(fkvf_reader_restore(r, 0, n, (fkvf_dtype)dt, o1, n * rb), FKVF_OK);
        for (size_t c = 0; c < N_COUNTS; c++) {
            memset(on, 0x33, n * rb);
            ck_assert_int_eq(fkvf_reader_set_threads(r, COUNT(c)), FKVF_OK);
            ck_assert_int_eq(fkvf_reader_restore(r, 0, n, (fkvf_dtype)dt, on, n * rb), FKVF_OK);
            ck_assert_msg(memcmp(o1, on, n * rb) == 0, "restore dtype %d differs at %u threads",
                          dt, COUNT(c));
            /* a part of the archive, starting inside the archived range */
            memset(on, 0x33, n * rb);
            ck_assert_int_eq(fkvf_reader_restore(r, 37, 201, (fkvf_dtype)dt, on, n * rb),
                             FKVF_OK);
            ck_assert_mem_eq(o1 + 37 * rb, on, 201 * rb);
        }
        free(o1);
        free(on);
    }
    fkvf_reader_free(r);
    free(f1);
    unlink(p1);
    unlink(p3);
    rmdir(tmpdir);
    fkvf_rvq_free(q);
    free(rows);
    free(v);
}
END_TEST

/* ---- verification, compaction's index rebuild ------------------------------ */

/* The result of a verification: code, offset and message. */
typedef struct vresult {
    int rc;
    uint64_t offset;
    char msg[1024];
} vresult;

static vresult verify_at(fkvf_reader *r, unsigned threads)
{
    vresult v;
    memset(&v, 0, sizeof v);
    ck_assert_int_eq(fkvf_reader_set_threads(r, threads), FKVF_OK);
    v.rc = fkvf_reader_verify(r);
    fkvf_error_info e;
    ck_assert_int_eq(fkvf_reader_error(r, &e), FKVF_OK);
    v.offset = e.offset;
    snprintf(v.msg, sizeof v.msg, "%s", e.message ? e.message : "");
    return v;
}

/* The verification of file (size bytes) at every thread count gives the
 * one-thread result, whose code is want; *one gets it. */
static void verify_same(const uint8_t *file, size_t size, int want, vresult *one, const char *what)
{
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, file, size, 0, NULL), FKVF_OK);
    *one = verify_at(r, 1);
    ck_assert_msg(one->rc == want, "%s: verify at 1 thread: %d (%s), expected %d", what, one->rc,
                  one->msg, want);
    /* every count twice: the schedule differs from run to run */
    for (size_t c = 0; c < 2 * N_COUNTS; c++) {
        vresult v = verify_at(r, COUNT(c % N_COUNTS));
        int same = v.rc == one->rc && v.offset == one->offset && !strcmp(v.msg, one->msg);
        ck_assert_msg(same, "%s at %u threads: %d at %llu '%s'; 1 thread: %d at %llu '%s'", what,
                      COUNT(c % N_COUNTS), v.rc, (unsigned long long)v.offset, v.msg, one->rc,
                      (unsigned long long)one->offset, one->msg);
    }
    fkvf_reader_free(r);
}

/* The shape (L x H x D, k, keys x2 values x1, f16) in *sh and its tables,
 * finite f16 values in [0.125, 2) drawn from g (ts: their bytes),
 * little-endian; malloc'd. */
static uint16_t *f16_tables(fkvf_codebook_shape *sh, uint32_t k, tu_rng *g, size_t *ts)
{
    memset(sh, 0, sizeof *sh);
    sh->n_layers = L;
    sh->n_heads = H;
    sh->key_dim = sh->value_dim = D;
    sh->k = k;
    sh->k_stages = 2;
    sh->v_stages = 1;
    sh->dtype = FKVF_DTYPE_F16;
    *ts = (size_t)(fkvf_codebook_size(sh) - fkvf_codebook_tables_offset(sh));
    uint16_t *t = tu_xcalloc(*ts / 2, 2);
    for (size_t i = 0; i < *ts / 2; i++)
        t[i] = (uint16_t)(0x3000 + tu_below(g, 0x1000)); /* finite */
    tu_le_u16(t, *ts / 2);
    return t;
}

/* A codebook file of 4.5 MiB of f16 tables (several pieces of the
 * centroid check), with NaNs at the table elements bad[0 .. nbad) (the
 * writer refuses them: put in afterwards, the checksums re-sealed).
 * Returns the file's bytes (written to path, then removed); *nan_at the
 * content offset of the first NaN. */
static uint8_t *codebook_file(const char *path, const size_t *bad, size_t nbad, size_t *size,
                              uint64_t *nan_at)
{
    fkvf_codebook_shape sh;
    size_t ts;
    tu_rng g = {99};
    uint16_t *t = f16_tables(&sh, 4096, &g, &ts);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_file(&w, path, &o, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, t, ts, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
    free(t);
    uint8_t *f = tu_slurp(path, size);
    unlink(path);
    if (!nbad)
        return f;
    /* the CBK1's directory entry (one commit: the trailer is the file's
     * last 64 bytes, spec 6), its contents patched, its checksum, the
     * directory's and the trailer's computed again */
    uint64_t tr = *size - 64, dir = fkvf_ld64(f + tr + 16), e = 0;
    for (uint32_t k = 0; k < fkvf_ld32(f + dir + 4) && !e; k++)
        if (fkvf_ld32(f + dir + 64 + 64 * (uint64_t)k) == FKVF_SECTION_CBK1)
            e = dir + 64 + 64 * (uint64_t)k;
    ck_assert_uint_ne(e, 0);
    uint64_t off = fkvf_ld64(f + e + 8), sz = fkvf_ld64(f + e + 16);
    uint64_t first = fkvf_codebook_tables_offset(&sh);
    *nan_at = UINT64_MAX;
    for (size_t i = 0; i < nbad; i++) {
        uint64_t at = first + 2 * bad[i];
        ck_assert_uint_lt(at + 1, sz);
        f[off + at] = 0x00;
        f[off + at + 1] = 0x7E; /* an f16 NaN */
        *nan_at = at < *nan_at ? at : *nan_at;
    }
    fkvf_st64(f + e + 40, fkvf_xxh3_64(f + off, (size_t)sz, off));
    uint64_t dsz = fkvf_ld64(f + tr + 24);
    fkvf_st64(f + tr + 32, fkvf_xxh3_64(f + dir, (size_t)dsz, dir));
    fkvf_st64(f + tr + 56, fkvf_xxh3_64(f + tr, 56, tr));
    return f;
}

/* verify's loop (rd_check_par): the message of the lowest failing item,
 * though a higher one fails first, on the worker's own message */
static int check_item(fkvf_reader *r, void *ctx, size_t item, fkvf_diag *d)
{
    (void)r;
    atomic_int *ran = ctx;
    atomic_fetch_add(&ran[item], 1);
    if (item == 9) {
        nanosleep(&(struct timespec){0, 2000000}, NULL);
        return fkvf_fail(d, FKVF_E_CORRUPT, 9, "1.2", "item %zu failed", item);
    }
    if (item == 20 || item >= 40)
        return fkvf_fail(d, FKVF_E_CHECKSUM, item, NULL, "item %zu failed", item);
    return FKVF_OK;
}

START_TEST(check_par_lowest_error)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fkvf-threads-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    char p[128];
    snprintf(p, sizeof p, "%s/cb.fkvf", tmpdir);
    size_t n;
    uint64_t unused;
    uint8_t *f = codebook_file(p, NULL, 0, &n, &unused);
    rmdir(tmpdir);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, f, n, 0, NULL), FKVF_OK);
    const unsigned counts[] = {1, 2, 3, 7, 64};
    for (size_t t = 0; t < sizeof counts / sizeof counts[0]; t++) {
        atomic_int ran[64];
        for (int i = 0; i < 64; i++)
            atomic_init(&ran[i], 0);
        ck_assert_int_eq(fkvf_reader_set_threads(r, counts[t]), FKVF_OK);
        fkvf_diag_clear(&r->diag);
        int rc = rd_check_par(r, 64, 64 * RD_PAR_BYTES, check_item, ran);
        fkvf_error_info e;
        ck_assert_int_eq(fkvf_reader_error(r, &e), FKVF_OK);
        int ok = rc == FKVF_E_CORRUPT && e.code == rc && e.offset == 9 &&
                 strstr(e.message, "item 9 failed (spec 1.2)") != NULL;
        ck_assert_msg(ok, "%u threads: %d at %llu: %s", counts[t], rc,
                      (unsigned long long)e.offset, e.message);
        int below = 1, above = 0;
        for (int i = 0; i < 64; i++) {
            below &= i > 9 || atomic_load(&ran[i]) == 1;
            above += i > 9 ? atomic_load(&ran[i]) : 0;
        }
        ck_assert_msg(below, "%u threads: an item below the failure did not run once", counts[t]);
        if (counts[t] == 1)
            ck_assert_int_eq(above, 0); /* in order: stops at the failure */
    }
    fkvf_reader_free(r);
    free(f);
}
END_TEST

START_TEST(verify_codebook_same_any_threads)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fkvf-threads-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    char p[128];
    snprintf(p, sizeof p, "%s/cb.fkvf", tmpdir);
    size_t n;
    uint64_t nan_at = 0;
    uint8_t *f = codebook_file(p, NULL, 0, &n, &nan_at);
    ck_assert_uint_gt(n, (size_t)4 << 20);
    vresult one;
    verify_same(f, n, FKVF_OK, &one, "the codebook file");
    free(f);
    /* NaNs in pieces 1 (twice), 2 and 4 of the check (1 MiB = 524288
     * elements each), ..., in each of the first four: the first is reported */
    const size_t bad[][4] = {{524288 + 17, 2 * 524288 + 5, 600000, 4 * 524288 + 1},
                             {2 * 524288 + 3, 2 * 524288 + 2, 3 * 524288, 1},
                             {4 * 524288 + 3, 4 * 524288 + 9, 3 * 524288 + 7, 2 * 524288 + 8},
                             {3 * 524288 + 1, 2 * 524288 + 1, 524288 + 1, 9}};
    for (size_t v = 0; v < sizeof bad / sizeof bad[0]; v++) {
        f = codebook_file(p, bad[v], 4, &n, &nan_at);
        verify_same(f, n, FKVF_E_CORRUPT, &one, "a codebook file with NaNs");
        char want[96];
        snprintf(want, sizeof want, "content offset %llu is not finite",
                 (unsigned long long)nan_at);
        ck_assert_msg(strstr(one.msg, want) != NULL, "'%s' does not say '%s'", one.msg, want);
        free(f);
    }
    rmdir(tmpdir);
}
END_TEST

/* A ZPOS section of every stream of the archive at path (stream order),
 * appended as one commit; every: in every such stream (0: none; 1: all; 3:
 * every third, from stream 1), two entries swapped (at entry 3 + the
 * stream's index) so that its order is wrong. *first_bad: the stream of
 * the first swapped one. */
static void index_all(const char *path, size_t every, size_t *first_bad)
{
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, 0, NULL), FKVF_OK);
    size_t ns;
    ck_assert_int_eq(fkvf_reader_stream_count(r, &ns), FKVF_OK);
    fkvf_section_add *secs = tu_xcalloc(ns, sizeof *secs);
    *first_bad = SIZE_MAX;
    for (size_t i = 0; i < ns; i++) {
        void *d;
        size_t sz;
        uint64_t key;
        ck_assert_int_eq(fkvf_search_index_build(r, i, &d, &sz, &key, NULL), FKVF_OK);
        if (every && i % every == every / 2) {
            uint8_t *e = (uint8_t *)d + 64 + 4 * (3 + i), tmp[4];
            ck_assert_uint_ge(sz, 64 + 4 * (5 + i));
            memcpy(tmp, e, 4);
            memcpy(e, e + 4, 4);
            memcpy(e + 4, tmp, 4);
            *first_bad = *first_bad < i ? *first_bad : i;
        }
        secs[i] = (fkvf_section_add){FKVF_SECTION_ZPOS, 0, key, d, sz};
    }
    fkvf_reader_free(r);
    fkvf_archive_op *op = NULL;
    ck_assert_int_eq(fkvf_archive_append_sections(&op, path, secs, ns, FKVF_SYNC_NONE), FKVF_OK);
    fkvf_archive_op_free(op);
    for (size_t i = 0; i < ns; i++)
        fkvf_search_buffer_free((void *)secs[i].data, NULL);
    free(secs);
}

/* The first section of type `type` in commit seq of file f, from the
 * k-th one of that commit on: its index and info. */
static size_t nth_section(const uint8_t *f, size_t n, uint32_t type, size_t k,
                          fkvf_section_info *out)
{
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, f, n, 0, NULL), FKVF_OK);
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    size_t seen = 0, at = SIZE_MAX;
    for (size_t i = 0; i < ai.n_sections && at == SIZE_MAX; i++) {
        ck_assert_int_eq(fkvf_reader_section(r, i, out), FKVF_OK);
        if (out->type == type && seen++ == k)
            at = i;
    }
    ck_assert_uint_ne(at, SIZE_MAX);
    fkvf_reader_free(r);
    return at;
}

START_TEST(verify_archive_same_any_threads)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fkvf-threads-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    const size_t n = 300;
    float *v = gen_f32(8, n);
    void *rows = rows_as(v, n, FKVF_DTYPE_F16);
    fkvf_rvq *q = train_variant(V_ROPE, 1, rows, n, FKVF_DTYPE_F16, NULL);
    char pa[128], pb[128];
    snprintf(pa, sizeof pa, "%s/ok.fkvf", tmpdir);
    snprintf(pb, sizeof pb, "%s/bad.fkvf", tmpdir);
    archive_with(pa, q, 1, rows, n, 0); /* 5 commits: several stream segments */
    size_t bad_stream, sa;
    index_all(pa, 0, &bad_stream);
    uint8_t *fa = tu_slurp(pa, &sa);
    vresult one;
    verify_same(fa, sa, FKVF_OK, &one, "the indexed archive");
    /* out-of-order entries in every third index, then in all (several
     * items fail at once): the first one's */
    fkvf_section_info si;
    for (size_t every = 3; every; every = every == 3 ? 1 : 0) {
        size_t sb;
        archive_with(pb, q, 1, rows, n, 0);
        index_all(pb, every, &bad_stream);
        uint8_t *fb = tu_slurp(pb, &sb);
        unlink(pb);
        verify_same(fb, sb, FKVF_E_CORRUPT, &one, "swapped index entries");
        nth_section(fb, sb, FKVF_SECTION_ZPOS, bad_stream, &si);
        ck_assert_uint_eq(one.offset, si.offset + 64 + 4 * (4 + bad_stream));
        ck_assert_ptr_nonnull(strstr(one.msg, "in the (key, position) order the stream gives"));
        free(fb);
    }
    /* a byte of every fourth index from the 6th on flipped, then of every
     * one from the 2nd on: the first one's checksum */
    for (size_t step = 4; step; step = step == 4 ? 1 : 0) {
        uint8_t *fc = tu_xcalloc(sa, 1);
        memcpy(fc, fa, sa);
        uint64_t first = UINT64_MAX;
        for (size_t k = step == 4 ? 5 : 1; k < L * H * 3; k += step) {
            nth_section(fc, sa, FKVF_SECTION_ZPOS, k, &si);
            fc[si.offset + 64 + k] ^= 0x40;
            first = first < si.offset ? first : si.offset;
        }
        verify_same(fc, sa, FKVF_E_CHECKSUM, &one, "flipped index bytes");
        ck_assert_uint_eq(one.offset, first);
        free(fc);
    }
    free(fa);
    unlink(pa);
    rmdir(tmpdir);
    fkvf_rvq_free(q);
    free(rows);
    free(v);
}
END_TEST

/* An archive of one large index segment (A positions, 18 streams of
 * 12-bit symbols, k = 2048: 432 KiB, so that its blocks, padding and
 * symbols are checked in several pieces) and its embedded codebook,
 * written by the writer; one commit. */
enum { BIG_A = 16001 };
static uint8_t *big_archive(const char *path, size_t *size)
{
    fkvf_codebook_shape sh;
    size_t ts;
    tu_rng g = {7};
    uint16_t *t = f16_tables(&sh, 2048, &g, &ts);
    const size_t ns = (size_t)L * H * 3;
    uint16_t *codes = tu_xcalloc((size_t)BIG_A * ns, sizeof *codes);
    for (size_t i = 0; i < (size_t)BIG_A * ns; i++)
        codes[i] = (uint16_t)tu_below(&g, 2048);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = L;
    d.n_kv_heads = H;
    d.key_dim = d.value_dim = D;
    d.dtype = FKVF_DTYPE_F16;
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_file(&w, path, &o, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, t, ts, 0), FKVF_OK);
    fkvf_stream_spec sp = {FKVF_PROFILE_QUAD, 12, 0, 0, 0};
    ck_assert_int_eq(fkvf_writer_add_index_segment(w, &sp, 0, BIG_A, codes, ns, 1), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_positions(w, BIG_A, BIG_A), FKVF_OK);
    ck_assert_msg(fkvf_writer_finish(w) == FKVF_OK, "%s", fkvf_writer_message(w));
    fkvf_writer_free(w);
    free(t);
    free(codes);
    uint8_t *f = tu_slurp(path, size);
    unlink(path);
    return f;
}

/* The STRM section of one-commit file f: its directory entry, offset, and
 * geometry (spec 11.3; quad). */
typedef struct strm_loc {
    uint64_t entry, off, size, data_off, stream_bytes, data_bytes, n_blocks;
    uint32_t block_size, n_streams;
} strm_loc;

static strm_loc find_strm(const uint8_t *f, size_t n)
{
    strm_loc l;
    memset(&l, 0, sizeof l);
    uint64_t tr = n - 64, dir = fkvf_ld64(f + tr + 16);
    for (uint32_t k = 0; k < fkvf_ld32(f + dir + 4) && !l.entry; k++)
        if (fkvf_ld32(f + dir + 64 + 64 * (uint64_t)k) == FKVF_SECTION_STRM)
            l.entry = dir + 64 + 64 * (uint64_t)k;
    ck_assert_uint_ne(l.entry, 0);
    l.off = fkvf_ld64(f + l.entry + 8);
    l.size = fkvf_ld64(f + l.entry + 16);
    const uint8_t *h = f + l.off;
    uint64_t count = fkvf_ld64(h + 24);
    l.block_size = fkvf_ld32(h + 36);
    l.n_streams = fkvf_ld32(h + 48);
    l.stream_bytes = (count * h[9] + 127) / 128 * 16;
    l.data_bytes = l.n_streams * l.stream_bytes;
    l.n_blocks = (l.data_bytes + l.block_size - 1) / l.block_size;
    l.data_off = (64 + 8 * l.n_blocks + 63) / 64 * 64;
    ck_assert_uint_eq(l.data_off + l.data_bytes, l.size);
    return l;
}

/* The byte at data offset at of the STRM section xored with x; its block's
 * checksum computed again when reblock; the section's, the directory's
 * and the trailer's always (one commit). */
static void strm_poke(uint8_t *f, size_t n, const strm_loc *l, uint64_t at, uint8_t x, int reblock)
{
    uint64_t start = l->off + l->data_off;
    f[start + at] ^= x;
    if (reblock) {
        uint64_t b = at / l->block_size, from = b * l->block_size;
        uint64_t len = l->data_bytes - from < l->block_size ? l->data_bytes - from : l->block_size;
        fkvf_st64(f + l->off + 64 + 8 * b, fkvf_xxh3_64(f + start + from, (size_t)len, start + from));
    }
    fkvf_st64(f + l->entry + 40, fkvf_xxh3_64(f + l->off, (size_t)l->size, l->off));
    uint64_t tr = n - 64, dir = fkvf_ld64(f + tr + 16), dsz = fkvf_ld64(f + tr + 24);
    fkvf_st64(f + tr + 32, fkvf_xxh3_64(f + dir, (size_t)dsz, dir));
    fkvf_st64(f + tr + 56, fkvf_xxh3_64(f + tr, 56, tr));
}

START_TEST(verify_segment_same_any_threads)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fkvf-threads-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    char p[128];
    snprintf(p, sizeof p, "%s/big.fkvf", tmpdir);
    size_t n;
    uint8_t *f = big_archive(p, &n), *c = tu_xcalloc(n, 1);
    rmdir(tmpdir);
    strm_loc l = find_strm(f, n);
    ck_assert_uint_ge(l.data_bytes, 6 * RD_PAR_BYTES); /* several workers */
    ck_assert_uint_gt(l.n_blocks, 64 + 40); /* two pieces of 64 blocks */
    vresult one;
    verify_same(f, n, FKVF_OK, &one, "one large segment");
    /* bytes of blocks 100, 20 and 70 changed (the section re-sealed, not
     * the blocks; 20 in the first piece, the others in the second): block
     * 20's checksum */
    memcpy(c, f, n);
    const uint64_t blocks[] = {100, 20, 70};
    for (size_t i = 0; i < 3; i++)
        strm_poke(c, n, &l, blocks[i] * l.block_size + 5, 0x21, 0);
    verify_same(c, n, FKVF_E_CHECKSUM, &one, "damaged blocks");
    ck_assert_uint_eq(one.offset, l.off + l.data_off + 20 * l.block_size);
    ck_assert_ptr_nonnull(strstr(one.msg, "block 20: checksum"));
    /* padding bits set after the last symbol of streams 17, 4 and 16 (their
     * blocks re-sealed; pieces of 16 streams): stream 4's */
    memcpy(c, f, n);
    const uint32_t streams[] = {17, 4, 16};
    for (size_t i = 0; i < 3; i++)
        strm_poke(c, n, &l, (streams[i] + 1) * l.stream_bytes - 1, 0x80, 1);
    verify_same(c, n, FKVF_E_PADDING, &one, "padding bits");
    ck_assert_uint_eq(one.offset, l.off + l.data_off + 5 * l.stream_bytes - 16);
    ck_assert_ptr_nonnull(strstr(one.msg, "stream 4 of the group: bits after the last symbol"));
    free(c);
    free(f);
}
END_TEST

/* compaction rebuilds the search indexes: the file of n_threads 1 for any */
START_TEST(compact_same_any_threads)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fkvf-threads-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    const size_t n = 300;
    float *v = gen_f32(9, n);
    void *rows = rows_as(v, n, FKVF_DTYPE_F16);
    fkvf_rvq *q = train_variant(V_PLAIN, 1, rows, n, FKVF_DTYPE_F16, NULL);
    char pa[128], po[128];
    snprintf(pa, sizeof pa, "%s/src.fkvf", tmpdir);
    archive_with(pa, q, 1, rows, n, 0);
    size_t unused;
    index_all(pa, 0, &unused);
    uint8_t *f1 = NULL;
    size_t s1 = 0;
    for (size_t c = 0; c <= N_COUNTS; c++) {
        unsigned t = c ? COUNT(c - 1) : 1;
        snprintf(po, sizeof po, "%s/c%zu.fkvf", tmpdir, c);
        fkvf_compact_options o;
        fkvf_compact_options_init(&o);
        o.sync = FKVF_SYNC_NONE;
        o.n_threads = t;
        fkvf_archive_op *op = NULL;
        fkvf_compact_result res;
        ck_assert_int_eq(fkvf_archive_compact(&op, pa, po, &o, &res), FKVF_OK);
        fkvf_archive_op_free(op);
        ck_assert_uint_eq(res.search_indexes, L * H * 3);
        size_t sn;
        uint8_t *fn = tu_slurp(po, &sn);
        unlink(po);
        if (!c) {
            f1 = fn;
            s1 = sn;
            continue;
        }
        ck_assert_msg(sn == s1 && memcmp(f1, fn, s1) == 0, "the compacted file differs at %u threads", t);
        free(fn);
    }
    free(f1);
    unlink(pa);
    rmdir(tmpdir);
    fkvf_rvq_free(q);
    free(rows);
    free(v);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("threads");
    /* one case a test, so that CK_RUN_CASE can time or run one */
    struct {
        const char *name;
        const TTest *test;
    } tests[] = {{"loop", par_for_lowest_error},     {"api", api_defaults_and_refusals},
                 {"train", train_same_any_threads},  {"encode", encode_same_any_threads},
                 {"decode", decode_same_any_threads}, {"append", append_and_restore_same_any_threads},
                 {"check_par", check_par_lowest_error},
                 {"verify_codebook", verify_codebook_same_any_threads},
                 {"verify_archive", verify_archive_same_any_threads},
                 {"verify_segment", verify_segment_same_any_threads},
                 {"compact", compact_same_any_threads}};
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        TCase *tc = tcase_create(tests[i].name);
        tcase_set_timeout(tc, 600);
        tcase_add_test(tc, tests[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    const char *sp = getenv("FKVF_TEST_SPARSE");
    sparse = sp && *sp && strcmp(sp, "0") != 0;
    return tu_run_suite(suite());
}
