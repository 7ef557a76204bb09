/* Key retrieval (fkvf_search_keys, fkvf.h "key retrieval"): against a brute
 * force over the keys fkvf_reader_restore decodes (an independent path: whole
 * rows through fkvf_rvq_decode), for keys archived as cached and before
 * rotation, quad and ngon index streams, with and without a ZPOS index; the
 * argument and state errors. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fkvf.h"
#include "testutil.h"

enum { L = 2, H = 2, DK = 8, DV = 4, S = 3, W = 5, N = 700 };
#define ROW_FLOATS (L * H * (DK + DV))

static char tmpdir[64];

/* deterministic rows: keys with a few strong directions so that rankings
 * are not flat, values small */
static float val(uint64_t p, int i)
{
    uint64_t x = p * 0x9E3779B97F4A7C15ull + (uint64_t)i * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return (float)((double)(x >> 11) / 9007199254740992.0 - 0.5);
}

/* rows as the library takes them (fkvf_rows, the appender): little-endian
 * binary32 */
static void gen_rows(float *rows, uint64_t first, size_t n)
{
    for (size_t r = 0; r < n; r++) {
        const uint64_t p = first + r;
        float *row = rows + r * ROW_FLOATS;
        for (int i = 0; i < ROW_FLOATS; i++)
            row[i] = val(p, i) * (1.0f + 3.0f * (float)((p * 7 + (uint64_t)i) % 5 == 0));
    }
    tu_le_f32(rows, n * ROW_FLOATS);
}

static fkvf_desc test_desc(int pre_rope)
{
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = L;
    d.n_kv_heads = H;
    d.key_dim = DK;
    d.value_dim = DV;
    d.dtype = FKVF_DTYPE_F32;
    d.n_sinks = S;
    d.window = W;
    if (pre_rope) {
        d.key_transform = 1;
        d.rope_layout = 1;
        d.key_storage = 1;
        d.rope_dims = DK;
        d.rope_theta = 10000.0;
    }
    d.model_id = "test/search-keys";
    return d;
}

/* codebooks of k centroids, ks key and vs value stages, trained on nt rows
 * of positions first.. (rows: room for nt) */
static fkvf_rvq *train_k(int pre_rope, uint32_t k, unsigned ks, unsigned vs, unsigned iters,
                         size_t nt, uint64_t first, float *rows)
{
    gen_rows(rows, first, nt);
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = L;
    p.n_kv_heads = H;
    p.key_dim = DK;
    p.value_dim = DV;
    p.k = k;
    p.k_stages = (uint8_t)ks;
    p.v_stages = (uint8_t)vs;
    p.max_iters = iters;
    fkvf_rope rope = {1, DK, 10000.0};
    if (pre_rope)
        p.key_rope = &rope;
    fkvf_rows blk = {rows, nt, FKVF_DTYPE_F32, first};
    fkvf_rvq *q = NULL;
    ck_assert_int_eq(fkvf_rvq_train(&q, &p, &blk, 1, NULL), FKVF_OK);
    return q;
}

static fkvf_rvq *train(int pre_rope)
{
    enum { NT = 512 };
    float *rows = malloc((size_t)NT * ROW_FLOATS * sizeof(float));
    ck_assert_ptr_nonnull(rows);
    fkvf_rvq *q = train_k(pre_rope, 16, 3, 1, 6, NT, 500000, rows);
    free(rows);
    return q;
}

/* an archive of N positions at path (codebook: with_cb) */
static void make_archive(const char *path, int pre_rope, int ngon, int with_cb)
{
    fkvf_rvq *q = with_cb ? train(pre_rope) : NULL;
    fkvf_desc d = test_desc(pre_rope);
    fkvf_append_create c;
    memset(&c, 0, sizeof c);
    c.desc = &d;
    c.codebook = q;
    if (ngon) {
        c.index_codec.profile = FKVF_PROFILE_NGON;
        c.index_codec.alphabet = 16;
    }
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.block_size = 64;
    fkvf_appender *a = NULL;
    int rc = fkvf_appender_create(&a, path, &c, &o, NULL);
    ck_assert_msg(rc == FKVF_OK, "create: %s", fkvf_appender_message(a));
    float *rows = malloc((size_t)N * ROW_FLOATS * sizeof(float));
    ck_assert_ptr_nonnull(rows);
    gen_rows(rows, 0, N);
    /* two commits, so that the streams have two segments */
    ck_assert_int_eq(fkvf_appender_append(a, rows, 300 * ROW_FLOATS * sizeof(float), 300, NULL),
                     FKVF_OK);
    ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
    ck_assert_int_eq(fkvf_appender_append(a, rows + 300 * ROW_FLOATS,
                                          (N - 300) * ROW_FLOATS * sizeof(float), N - 300, NULL),
                     FKVF_OK);
    ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
    fkvf_appender_free(a);
    fkvf_rvq_free(q);
    free(rows);
}

static void new_path(char *out, size_t n, const char *name)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fkvf-keys-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(out, n, "%s/%s", tmpdir, name);
}

static void drop_path(const char *path)
{
    unlink(path);
    rmdir(tmpdir);
}

/* the query of (layer, head, j): a key of the data, scaled */
static void make_query(int j, float *q)
{
    for (int i = 0; i < DK; i++)
        q[i] = 2.0f * val(900000 + (uint64_t)j, i) + (i == j % DK ? 1.5f : 0.0f);
}

/* q . k_p for every archived p of (layer, head) from restored rows */
static void brute(const float *restored, int layer, int head, const float *q, double *score)
{
    for (int p = S; p < N - W; p++) {
        const float *k = restored + (size_t)p * ROW_FLOATS + (size_t)layer * H * (DK + DV) +
                         (size_t)head * DK;
        double s = 0;
        for (int i = 0; i < DK; i++)
            s += (double)q[i] * (double)k[i];
        score[p] = s;
    }
}

/* every position restored as binary32, in host order */
static float *restore_all(fkvf_reader *r)
{
    size_t rb;
    ck_assert_int_eq(fkvf_reader_row_bytes(r, FKVF_DTYPE_F32, &rb), FKVF_OK);
    ck_assert_uint_eq(rb, ROW_FLOATS * sizeof(float));
    float *all = malloc((size_t)N * rb);
    ck_assert_ptr_nonnull(all);
    ck_assert_int_eq(fkvf_reader_restore(r, 0, N, FKVF_DTYPE_F32, all, (size_t)N * rb), FKVF_OK);
    tu_le_f32(all, (size_t)N * ROW_FLOATS); /* restore writes little-endian elements */
    return all;
}

/* Steps 1-2 on their own: with m = 1 and one candidate, the hit's (chunk,
 * stage-0 symbol) pair is the best of those present in the range, a pair
 * scored by the mean of q . R(p) c over the chunk (computed here by rotating
 * c to every p; q . c for keys archived as cached). chunk as in
 * fkvf_key_query (here below the default, so 0 means one chunk). */
static void check_best_symbol(fkvf_reader *r, fkvf_key_search *ks, const fkvf_rvq *cb,
                              int pre_rope, int layer, int head, const float *q, uint64_t lo,
                              uint64_t hi, uint64_t first, uint64_t end, uint64_t chunk)
{
    size_t idx;
    ck_assert_int_eq(fkvf_reader_stream_find(
                         r, FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, layer, head, 0, 0), &idx),
                     FKVF_OK);
    const float *c0 = fkvf_rvq_centroids(cb, (uint32_t)layer, (uint32_t)head, 0, 0);
    ck_assert_ptr_nonnull(c0);
    const fkvf_rope rope = {1, DK, 10000.0};
    const uint64_t clen = pre_rope && chunk && chunk < hi - lo ? chunk : hi - lo;
    static double sc[N][16]; /* [chunk][symbol] */
    int ok = 1; /* (one assertion at the end: Check logs every assertion it runs) */
    for (uint64_t c0p = lo, ci = 0; c0p < hi; c0p += clen, ci++) {
        const uint64_t c1p = c0p + clen < hi ? c0p + clen : hi;
        for (int j = 0; j < 16; j++) {
            double tot = 0;
            for (uint64_t p = pre_rope ? c0p : 0; p < (pre_rope ? c1p : 1); p++) {
                double c[DK];
                for (int i = 0; i < DK; i++)
                    c[i] = c0[j * DK + i];
                if (pre_rope)
                    ok &= fkvf_rope_apply_f64(&rope, p, 0, c, DK) == FKVF_OK;
                for (int i = 0; i < DK; i++)
                    tot += (double)q[i] * c[i];
            }
            sc[ci][j] = pre_rope ? tot / (double)(c1p - c0p) : tot;
        }
    }
    double best = -INFINITY;
    for (uint64_t p = lo; p < hi; p++) {
        uint32_t sym = 0;
        ok &= fkvf_reader_stream_get(r, idx, p - S, &sym) == FKVF_OK;
        best = sc[(p - lo) / clen][sym] > best ? sc[(p - lo) / clen][sym] : best;
    }
    ck_assert(ok);
    fkvf_key_query kq = {(uint32_t)layer, (uint32_t)head, q, DK, first, end, 1, 1,
                         chunk ? chunk : UINT64_MAX};
    fkvf_key_hit hit;
    size_t n;
    fkvf_key_stats st;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, &hit, &n, &st), FKVF_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(st.centroids_scored, 16 * ((hi - lo) / clen + ((hi - lo) % clen != 0)));
    uint32_t sym;
    ck_assert_int_eq(fkvf_reader_stream_get(r, idx, hit.position - S, &sym), FKVF_OK);
    const double got = sc[(hit.position - lo) / clen][sym];
    ck_assert_msg(got >= best - 1e-9 * (1 + fabs(best)),
                  "chunk %llu: the hit's pair scores %g, the best pair in range %g",
                  (unsigned long long)chunk, got, best);
}

/* With candidates covering the range the hits are the brute-force top m (by
 * score, then position); with the default every hit is in the range, scored
 * exactly, in order, and there are min(m, range) of them. Returns a digest
 * of the default-candidate hits (for the comparison with an index). */
static uint64_t check_archive(const char *path, int pre_rope)
{
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, 0, NULL), FKVF_OK);
    float *all = restore_all(r);
    fkvf_codebook_shape sh;
    const void *cbk;
    size_t cbk_size;
    uint8_t hash[16];
    ck_assert_int_eq(fkvf_reader_codebook(r, &sh, &cbk, &cbk_size, hash), FKVF_OK);
    fkvf_rvq *cb = NULL;
    ck_assert_int_eq(fkvf_rvq_from_tables(&cb, &sh, H, (const uint8_t *)cbk + 64, cbk_size - 64,
                                          NULL),
                     FKVF_OK);
    fkvf_key_search *ks = NULL;
    int rc = fkvf_search_keys_open(&ks, r, NULL);
    ck_assert_msg(rc == FKVF_OK, "open: %s", fkvf_search_keys_message(ks));
    static double score[N];
    fkvf_key_hit hits[64];
    uint64_t digest = 0;
    const uint64_t ranges[][2] = {{0, 0}, {100, 400}, {S + 10, S + 30}, {650, 0}};
    for (int layer = 0; layer < L; layer++)
        for (int head = 0; head < H; head++)
            for (int j = 0; j < 6; j++)
                for (size_t ri = 0; ri < sizeof ranges / sizeof ranges[0]; ri++) {
                    float q[DK];
                    make_query(j + 10 * layer + 100 * head, q);
                    brute(all, layer, head, q, score);
                    const uint64_t lo = ranges[ri][0] > S ? ranges[ri][0] : S;
                    const uint64_t hi = ranges[ri][1] ? ranges[ri][1] : N - W;
                    const size_t m = j % 2 ? 16 : 5;
                    /* the brute-force top m of [lo, hi) */
                    int want[64];
                    size_t nw = 0;
                    for (size_t t = 0; t < m && t < hi - lo; t++) {
                        int best = -1;
                        for (uint64_t p = lo; p < hi; p++) {
                            int taken = 0;
                            for (size_t u = 0; u < nw; u++)
                                taken |= want[u] == (int)p;
                            if (!taken && (best < 0 || score[p] > score[best]))
                                best = (int)p;
                        }
                        want[nw++] = best;
                    }
                    fkvf_key_query kq = {(uint32_t)layer, (uint32_t)head, q, DK,
                                         ranges[ri][0], ranges[ri][1], m, FKVF_KEY_CANDIDATES_MAX,
                                         (uint64_t)(j % 3) * 37};
                    size_t n;
                    fkvf_key_stats st;
                    rc = fkvf_search_keys(ks, &kq, hits, &n, &st);
                    ck_assert_msg(rc == FKVF_OK, "%s", fkvf_search_keys_message(ks));
                    ck_assert_uint_eq(n, nw);
                    for (size_t u = 0; u < n; u++) {
                        ck_assert_msg(hits[u].position == (uint64_t)want[u],
                                      "layer %d head %d query %d range %zu: hit %zu is %llu, "
                                      "brute force %d",
                                      layer, head, j, ri, u,
                                      (unsigned long long)hits[u].position, want[u]);
                        ck_assert(fabs(hits[u].score - score[want[u]]) <=
                                  1e-9 * (1 + fabs(score[want[u]])));
                    }
                    check_best_symbol(r, ks, cb, pre_rope, layer, head, q, lo, hi,
                                      ranges[ri][0], ranges[ri][1], 0);
                    check_best_symbol(r, ks, cb, pre_rope, layer, head, q, lo, hi,
                                      ranges[ri][0], ranges[ri][1], 7 + 50 * (uint64_t)(j % 2));
                    /* the default candidates */
                    kq.candidates = 0;
                    rc = fkvf_search_keys(ks, &kq, hits, &n, &st);
                    ck_assert_int_eq(rc, FKVF_OK);
                    ck_assert_uint_eq(n, nw);
                    ck_assert_uint_ge(st.candidates, n);
                    ck_assert_uint_ge(st.candidates, (4 * m < hi - lo ? 4 * m : hi - lo));
                    ck_assert_uint_ge(st.symbols_searched, 1);
                    for (size_t u = 0; u < n; u++) {
                        const uint64_t p = hits[u].position;
                        ck_assert(p >= lo && p < hi);
                        ck_assert(fabs(hits[u].score - score[p]) <= 1e-9 * (1 + fabs(score[p])));
                        if (u)
                            ck_assert(hits[u - 1].score > hits[u].score ||
                                      (hits[u - 1].score == hits[u].score &&
                                       hits[u - 1].position < p));
                        digest = digest * 1000003u + p;
                    }
                }
    fkvf_search_keys_free(ks);
    fkvf_rvq_free(cb);
    fkvf_reader_free(r);
    free(all);
    return digest;
}

/* the same hits with a ZPOS index on every stage-0 key stream */
static void add_indexes(const char *path)
{
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, 0, NULL), FKVF_OK);
    fkvf_section_add secs[L * H];
    void *bufs[L * H];
    size_t n = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            size_t idx, size;
            uint64_t key;
            ck_assert_int_eq(fkvf_reader_stream_find(
                                 r, FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, l, h, 0, 0), &idx),
                             FKVF_OK);
            ck_assert_int_eq(fkvf_search_index_build(r, idx, &bufs[n], &size, &key, NULL), FKVF_OK);
            secs[n].type = FKVF_SECTION_ZPOS;
            secs[n].flags = 0;
            secs[n].key = key;
            secs[n].data = bufs[n];
            secs[n].size = size;
            n++;
        }
    fkvf_reader_free(r);
    fkvf_archive_op *op = NULL;
    int rc = fkvf_archive_append_sections(&op, path, secs, n, FKVF_SYNC_NONE);
    ck_assert_msg(rc == FKVF_OK, "append sections: %s", fkvf_strerror(rc));
    fkvf_archive_op_free(op);
    for (size_t i = 0; i < n; i++)
        fkvf_search_buffer_free(bufs[i], NULL);
}

static void run_case(int pre_rope, int ngon)
{
    char path[128];
    new_path(path, sizeof path, "k.fkvf");
    make_archive(path, pre_rope, ngon, 1);
    const uint64_t d0 = check_archive(path, pre_rope);
    add_indexes(path);
    /* the search really uses the index now */
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, 0, NULL), FKVF_OK);
    size_t idx;
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, 1, 1, 0, 0),
                                             &idx),
                     FKVF_OK);
    fkvf_search *s = NULL;
    ck_assert_int_eq(fkvf_search_open(&s, r, idx, 0, NULL), FKVF_OK);
    fkvf_search_status ss;
    ck_assert_int_eq(fkvf_search_info(s, &ss), FKVF_OK);
    ck_assert_uint_gt(ss.n_indexed, 0);
    fkvf_search_free(s);
    fkvf_reader_free(r);
    ck_assert_uint_eq(check_archive(path, pre_rope), d0);
    drop_path(path);
}

START_TEST(keys_as_cached_quad)
{
    run_case(0, 0);
}
END_TEST

START_TEST(keys_pre_rope_quad)
{
    run_case(1, 0);
}
END_TEST

START_TEST(keys_pre_rope_ngon)
{
    run_case(1, 1);
}
END_TEST

START_TEST(keys_errors)
{
    char path[128];
    new_path(path, sizeof path, "e.fkvf");
    make_archive(path, 1, 0, 1);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, 0, NULL), FKVF_OK);
    fkvf_key_search *ks = NULL;
    ck_assert_int_eq(fkvf_search_keys_open(NULL, r, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_search_keys_open(&ks, NULL, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(ks);
    ck_assert_int_eq(fkvf_search_keys_open(&ks, r, NULL), FKVF_OK);
    float q[DK] = {1, 0, 0, 0, 0, 0, 0, 0};
    fkvf_key_hit hits[8];
    size_t n = 99;
    fkvf_key_query kq = {0, 0, q, DK, 0, 0, 8, 0, 0};
    ck_assert_int_eq(fkvf_search_keys(ks, NULL, hits, &n, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, NULL, &n, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, NULL, NULL), FKVF_E_INVALID_ARG);
    kq.dim = DK - 1;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fkvf_search_keys_message(ks), "components"));
    kq.dim = DK;
    kq.layer = L;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_E_RANGE);
    kq.layer = 0;
    kq.head = H;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_E_RANGE);
    kq.head = 0;
    kq.candidates = FKVF_KEY_CANDIDATES_MAX + 1;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_E_INVALID_ARG);
    kq.candidates = 0;
    q[3] = NAN;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fkvf_search_keys_message(ks), "not finite"));
    q[3] = INFINITY;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_E_INVALID_ARG);
    q[3] = 0;
    /* a good call after the errors; the message is cleared */
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_OK);
    ck_assert_uint_eq(n, 8);
    ck_assert_str_eq(fkvf_search_keys_message(ks), "ok");
    /* empty ranges and m = 0: no hits */
    kq.first = N - W; /* the recent window is not searched */
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_OK);
    ck_assert_uint_eq(n, 0);
    kq.first = 200;
    kq.end = 200;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_OK);
    ck_assert_uint_eq(n, 0);
    kq.end = 0;
    kq.first = 0;
    kq.m = 0;
    n = 5;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, NULL, &n, NULL), FKVF_OK);
    ck_assert_uint_eq(n, 0);
    /* a range of one position gives that position */
    kq.m = 3;
    kq.first = 123;
    kq.end = 124;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_OK);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(hits[0].position, 123);
    /* handle kinds */
    fkvf_search_keys_free(NULL);
    fkvf_search_keys_free((fkvf_key_search *)(void *)r); /* not a key search: no-op */
    ck_assert_str_eq(fkvf_search_keys_message(NULL), "not a key search handle");
    ck_assert_int_eq(fkvf_search_keys((fkvf_key_search *)(void *)r, &kq, hits, &n, NULL),
                     FKVF_E_STATE);
    fkvf_error_info ei;
    ck_assert_int_eq(fkvf_search_keys_error(NULL, &ei), FKVF_E_STATE);
    ck_assert_int_eq(fkvf_search_keys_error(ks, NULL), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_search_keys_error(ks, &ei), FKVF_OK);
    fkvf_search_keys_free(ks);
    fkvf_reader_free(r);
    drop_path(path);

    /* an archive without a codebook (every position exact) */
    new_path(path, sizeof path, "x.fkvf");
    make_archive(path, 0, 0, 0);
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, 0, NULL), FKVF_OK);
    ks = NULL;
    ck_assert_int_eq(fkvf_search_keys_open(&ks, r, NULL), FKVF_E_NOT_FOUND);
    ck_assert_ptr_nonnull(ks);
    ck_assert_ptr_nonnull(strstr(fkvf_search_keys_message(ks), "no codebook"));
    ck_assert_ptr_nonnull(strstr(fkvf_search_keys_message(ks), "x.fkvf"));
    /* the handle of a failed open refuses queries with that error, message kept */
    kq.first = kq.end = 0;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_E_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(fkvf_search_keys_message(ks), "no codebook"));
    ck_assert_int_eq(fkvf_search_keys_error(ks, &ei), FKVF_OK);
    ck_assert_int_eq(ei.code, FKVF_E_NOT_FOUND);
    fkvf_search_keys_free(ks);
    fkvf_reader_free(r);
    drop_path(path);
}
END_TEST

/* FKVF_E_LIMIT: chunks x k above FKVF_KEY_SCORES_MAX (k = 1024, chunks of
 * one position over 4,193 archived positions: 4.3 million scores), said in
 * the message; chunks of two positions (2.1 million) run. */
START_TEST(keys_too_many_scores)
{
    enum { NT = 1100, NP = 4200 };
    float *rows = malloc((size_t)NP * ROW_FLOATS * sizeof(float)); /* NP > NT */
    ck_assert_ptr_nonnull(rows);
    fkvf_rvq *q = train_k(1, 1024, 1, 0, 1, NT, 700000, rows);
    char path[128];
    new_path(path, sizeof path, "l.fkvf");
    fkvf_desc d = test_desc(1);
    fkvf_append_create c;
    memset(&c, 0, sizeof c);
    c.desc = &d;
    c.codebook = q;
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_appender *a = NULL;
    ck_assert_int_eq(fkvf_appender_create(&a, path, &c, &o, NULL), FKVF_OK);
    gen_rows(rows, 0, NP);
    ck_assert_int_eq(fkvf_appender_append(a, rows, NP * ROW_FLOATS * sizeof(float), NP, NULL),
                     FKVF_OK);
    ck_assert_int_eq(fkvf_appender_commit(a), FKVF_OK);
    fkvf_appender_free(a);
    fkvf_rvq_free(q);
    free(rows);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, 0, NULL), FKVF_OK);
    fkvf_key_search *ks = NULL;
    ck_assert_int_eq(fkvf_search_keys_open(&ks, r, NULL), FKVF_OK);
    float qv[DK];
    make_query(1, qv);
    fkvf_key_hit hits[4];
    size_t n;
    fkvf_key_query kq = {0, 0, qv, DK, 0, 0, 4, 0, 1};
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_E_LIMIT);
    ck_assert_ptr_nonnull(strstr(fkvf_search_keys_message(ks), "centroid scores"));
    kq.chunk = 2;
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_OK);
    ck_assert_uint_eq(n, 4);
    kq.chunk = 0; /* the default: 1024 */
    ck_assert_int_eq(fkvf_search_keys(ks, &kq, hits, &n, NULL), FKVF_OK);
    fkvf_search_keys_free(ks);
    fkvf_reader_free(r);
    drop_path(path);
}
END_TEST

/* open and three queries (default, chunks of 5, a range with every
 * candidate) through the handle's allocator; returns the hits' digest, or 0
 * with *failed = the call that failed (1 open, 2.. a query) */
static uint64_t keys_run(fkvf_reader *r, const fkvf_allocator *al, int *failed, int retry)
{
    fkvf_key_search *ks = NULL;
    *failed = 0;
    int rc = fkvf_search_keys_open(&ks, r, al);
    if (rc) {
        ck_assert_int_eq(rc, FKVF_E_NOMEM);
        ck_assert_msg(!ks || strstr(fkvf_search_keys_message(ks), "FKVF_E_NOMEM"), "%s",
                      fkvf_search_keys_message(ks));
        fkvf_search_keys_free(ks);
        *failed = 1;
        return 0;
    }
    uint64_t d = 0;
    float q[DK];
    make_query(3, q);
    const fkvf_key_query qs[3] = {{1, 0, q, DK, 0, 0, 16, 0, 0},
                                  {1, 0, q, DK, 0, 0, 16, 0, 5},
                                  {0, 1, q, DK, 100, 300, 8, FKVF_KEY_CANDIDATES_MAX, 0}};
    for (int i = 0; i < 3; i++) {
        fkvf_key_hit hits[16];
        size_t n;
        rc = fkvf_search_keys(ks, &qs[i], hits, &n, NULL);
        if (rc && retry) { /* the handle stays usable: the same query again */
            ck_assert_int_eq(rc, FKVF_E_NOMEM);
            *failed = 2 + i;
            rc = fkvf_search_keys(ks, &qs[i], hits, &n, NULL);
        }
        if (rc) {
            ck_assert_int_eq(rc, FKVF_E_NOMEM);
            *failed = 2 + i;
            fkvf_search_keys_free(ks);
            return 0;
        }
        for (size_t j = 0; j < n; j++)
            d = d * 1000003u + hits[j].position;
    }
    fkvf_search_keys_free(ks);
    return d;
}

/* Every allocation of the key search (through its allocator) failing in
 * turn: the call says FKVF_E_NOMEM, the failed query succeeds when retried
 * with the same answers as a run without failures, and nothing leaks. */
START_TEST(keys_allocation_failures)
{
    char path[128];
    new_path(path, sizeof path, "a.fkvf");
    make_archive(path, 1, 0, 1);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, 0, NULL), FKVF_OK);
    tu_alloc f;
    memset(&f, 0, sizeof f);
    const fkvf_allocator al = tu_alloc_hook(&f);
    int failed;
    const uint64_t want = keys_run(r, &al, &failed, 0);
    ck_assert_int_eq(failed, 0);
    ck_assert_int_eq(f.live, 0);
    const long total = f.calls;
    ck_assert_int_gt(total, 10);
    int seen[5] = {0};
    for (long k = 1; k <= total; k++) {
        f.calls = f.live = 0;
        f.fail_at = k;
        const uint64_t got = keys_run(r, &al, &failed, 1);
        ck_assert_msg(failed != 0, "allocation %ld of %ld failed unnoticed", k, total);
        seen[failed]++;
        if (failed >= 2) /* retried: the same answers */
            ck_assert_msg(got == want, "allocation %ld: other answers after the retry", k);
        ck_assert_msg(f.live == 0, "allocation %ld: %ld blocks leaked", k, f.live);
    }
    /* the open and every query allocate something */
    ck_assert(seen[1] > 0 && seen[2] > 0 && seen[3] > 0);
    fkvf_reader_free(r);
    drop_path(path);
}
END_TEST

static Suite *keys_suite(void)
{
    Suite *s = suite_create("search_keys");
    TCase *t = tcase_create("keys");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, keys_as_cached_quad);
    tcase_add_test(t, keys_pre_rope_quad);
    tcase_add_test(t, keys_pre_rope_ngon);
    tcase_add_test(t, keys_errors);
    tcase_add_test(t, keys_allocation_failures);
    tcase_add_test(t, keys_too_many_scores);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return tu_run_suite(keys_suite());
}
