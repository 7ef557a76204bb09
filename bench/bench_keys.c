/* bench_keys: the cost of key retrieval (fkvf_search_keys) per query,
 * against scoring every archived key of the head (issue 19 C.10).
 *
 * An archive of --positions N positions (default 131072) of one layer and 2
 * KV heads of dim 64, f16 rows, keys archived before rotation (RoPE theta
 * 10000), 4 sinks + 32 recent exact, a k = 256 K x4 V x2 codebook trained on
 * 8192 other rows; the keys cluster around 64 directions (pre-RoPE centre
 * plus noise), the centres' energy in the slowly turning RoPE pairs (as in
 * trained models; with energy spread evenly over the pairs the best keys of
 * a query are decided by the fast pairs' chance alignment, which no
 * position-free symbol score can predict). It is written to a temporary
 * directory twice: as packed, and with a ZPOS index on the stage-0 key
 * streams (fkvf_search_index_build, what `fkvf index` adds).
 *
 * Queries (--queries Q, default 200): q = R(N) (2 c_j + noise), c_j a random
 * centre, so that q . k_p depends on p - N as with RoPE. For each query, in
 * rotating order, timed with CLOCK_MONOTONIC:
 *   keys, index   fkvf_search_keys on the indexed archive (m = --m, default
 *                 16; candidates --candidates C x m, default 4; chunks of
 *                 --chunk P positions, default FKVF_KEY_CHUNK; --as-is: an
 *                 archive of keys as cached, no chunks);
 *   keys, scan    the same on the archive without an index;
 *   read + score  fkvf_reader_read of every archived key of the head (f32,
 *                 FKVF_LAYOUT_HEADS: what an engine would decode to find the
 *                 best keys without retrieval), then q . k and the top m;
 *   score only    q . k and the top m over those keys already decoded in
 *                 memory (the floor: no decoding at all).
 * Printed: the median time per query of each, the median of the per-query
 * ratios (read + score) / (keys, index) and (score only) / (keys, index),
 * the recall of key retrieval (the share of the exact top m, by the decoded
 * keys, it returns), and that the indexed and scanned answers are
 * identical (exit 1 if not). Ends with the line
 *   RESULT keys_query_us=<median, indexed> read_score_vs_keys=<ratio>
 *          keys_recall=<recall>
 * --quick: 16384 positions, 64 queries.
 */
#define _POSIX_C_SOURCE 200809L
#include <fkvf.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { H = 2, D = 64, S = 4, W = 32, CENTRES = 64 };
#define ROW (2 * H * D) /* one layer: keys of both heads, then values */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench_keys: out of memory\n");
        exit(1);
    }
    return p;
}

static _Noreturn void die(const char *what, int rc, const char *msg)
{
    fprintf(stderr, "bench_keys: %s: %s (%s)\n", what, fkvf_strerror(rc), msg ? msg : "");
    exit(1);
}

static uint64_t rng_state = 0x1234567;
static double uni(void) /* [0, 1) */
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}
static double gauss(void)
{
    double u = uni() + 1e-300, v = uni();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static float centre[CENTRES][D];
static int as_is; /* --as-is: keys archived as cached (key_storage 0) */
static const fkvf_rope ROPE = {1, D, 10000.0};

/* rows for positions first..first+n-1 (f16): keys R(p)(centre + noise) */
static void gen_rows(uint16_t *out, uint64_t first, size_t n)
{
    float row[ROW];
    for (size_t i = 0; i < n; i++) {
        for (int h = 0; h < H; h++) {
            const int c = (int)(uni() * CENTRES);
            float *k = row + h * D;
            for (int d = 0; d < D; d++)
                k[d] = centre[c][d] + 0.3f * (float)gauss();
            fkvf_rope_apply_f32(&ROPE, first + i, 0, k, D);
        }
        for (int j = H * D; j < ROW; j++)
            row[j] = 0.5f * (float)gauss();
        fkvf_convert(FKVF_DTYPE_F16, out + i * ROW, FKVF_DTYPE_F32, row, ROW);
    }
}

static void write_archive(const char *path, uint64_t n)
{
    enum { NT = 8192, BATCH = 4096 };
    uint16_t *rows = xmalloc((size_t)BATCH * ROW * 2 > (size_t)NT * ROW * 2
                                 ? (size_t)BATCH * ROW * 2
                                 : (size_t)NT * ROW * 2);
    gen_rows(rows, 50000000, NT);
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = 1;
    p.n_kv_heads = H;
    p.key_dim = p.value_dim = D;
    p.k = 256;
    p.k_stages = 4;
    p.v_stages = 2;
    p.max_iters = 10;
    p.key_rope = as_is ? NULL : &ROPE;
    fkvf_rows blk = {rows, NT, FKVF_DTYPE_F16, 50000000};
    fkvf_rvq *q = NULL;
    int rc = fkvf_rvq_train(&q, &p, &blk, 1, NULL);
    if (rc)
        die("train", rc, NULL);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = 1;
    d.n_kv_heads = H;
    d.key_dim = d.value_dim = D;
    d.dtype = FKVF_DTYPE_F16;
    d.key_transform = 1;
    d.rope_layout = 1;
    d.key_storage = as_is ? 0 : 1;
    d.rope_dims = D;
    d.rope_theta = 10000.0;
    d.n_sinks = S;
    d.window = W;
    fkvf_append_create c;
    memset(&c, 0, sizeof c);
    c.desc = &d;
    c.codebook = q;
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_appender *a = NULL;
    if ((rc = fkvf_appender_create(&a, path, &c, &o, NULL)))
        die("create", rc, fkvf_appender_message(a));
    for (uint64_t f = 0; f < n; f += BATCH) {
        const size_t b = n - f < BATCH ? (size_t)(n - f) : BATCH;
        gen_rows(rows, f, b);
        if ((rc = fkvf_appender_append(a, rows, b * ROW * 2, b, NULL)))
            die("append", rc, fkvf_appender_message(a));
    }
    if ((rc = fkvf_appender_commit(a)))
        die("commit", rc, fkvf_appender_message(a));
    fkvf_appender_free(a);
    fkvf_rvq_free(q);
    free(rows);
}

static void add_index(const char *path)
{
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, path, 0, NULL);
    if (rc)
        die("open", rc, fkvf_reader_message(r));
    fkvf_section_add secs[H];
    void *bufs[H];
    for (int h = 0; h < H; h++) {
        size_t idx, size;
        uint64_t key;
        if ((rc = fkvf_reader_stream_find(r, FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, 0, h, 0, 0),
                                          &idx)) ||
            (rc = fkvf_search_index_build(r, idx, &bufs[h], &size, &key, NULL)))
            die("index", rc, fkvf_reader_message(r));
        secs[h] = (fkvf_section_add){FKVF_SECTION_ZPOS, 0, key, bufs[h], size};
    }
    fkvf_reader_free(r);
    fkvf_archive_op *op = NULL;
    if ((rc = fkvf_archive_append_sections(&op, path, secs, H, FKVF_SYNC_NONE)))
        die("append index", rc, "");
    fkvf_archive_op_free(op);
    for (int h = 0; h < H; h++)
        fkvf_search_buffer_free(bufs[h], NULL);
}

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_d);
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : NAN;
}

/* the top m of q . k over A keys: positions (S + i) into top, scores into ts */
static void top_m(const float *keys, uint64_t A, const float *q, size_t m, uint64_t *top,
                  double *ts)
{
    size_t n = 0;
    for (uint64_t i = 0; i < A; i++) {
        double s = 0;
        const float *k = keys + i * D;
        for (int d = 0; d < D; d++)
            s += (double)q[d] * (double)k[d];
        if (n == m && s <= ts[m - 1])
            continue;
        size_t j = n < m ? n++ : m - 1;
        while (j > 0 && ts[j - 1] < s) {
            ts[j] = ts[j - 1];
            top[j] = top[j - 1];
            j--;
        }
        ts[j] = s;
        top[j] = S + i;
    }
}

int main(int argc, char **argv)
{
    uint64_t N = 131072;
    long Q = 200, m = 16, cf = 0, chunk = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            N = 16384;
            Q = 64;
        } else if (!strcmp(argv[i], "--positions") && i + 1 < argc) {
            N = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--queries") && i + 1 < argc) {
            Q = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--m") && i + 1 < argc) {
            m = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--candidates") && i + 1 < argc) {
            cf = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) {
            chunk = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--as-is")) {
            as_is = 1;
        } else {
            fprintf(stderr, "usage: bench_keys [--positions N] [--queries Q] [--m M] [--candidates C] "
                            "[--chunk P] [--as-is] [--quick]\n");
            return 2;
        }
    }
    if (N < 1024 || Q < 1 || m < 1 || m > 1024 || cf < 0 || cf > (long)FKVF_KEY_CANDIDATES_MAX ||
        chunk < 0) {
        fprintf(stderr, "bench_keys: --positions >= 1024, --queries >= 1, --m 1..1024, "
                        "--candidates 0..1024\n");
        return 2;
    }
    /* the centres' energy grows toward the slowly turning pairs (pair d / 2;
     * the last ones turn least), as in trained models, whose keys and queries
     * meet there for content and leave the fast pairs to position */
    for (int c = 0; c < CENTRES; c++)
        for (int d = 0; d < D; d++) {
            const double w = (double)(d / 2 + 1) / (D / 2);
            centre[c][d] = (float)(gauss() * 1.2 * w * w);
        }
    char dir[] = "/tmp/bench_keys-XXXXXX", p0[64], p1[64];
    if (!mkdtemp(dir)) {
        perror("bench_keys: mkdtemp");
        return 1;
    }
    snprintf(p0, sizeof p0, "%s/scan.fkvf", dir);
    snprintf(p1, sizeof p1, "%s/index.fkvf", dir);
    double t0 = now();
    write_archive(p0, N);
    const double t_write = now() - t0;
    {   /* the same bytes, then the index commit */
        FILE *a = fopen(p0, "rb"), *b = fopen(p1, "wb");
        char buf[1 << 16];
        size_t k;
        while (a && b && (k = fread(buf, 1, sizeof buf, a)) > 0)
            fwrite(buf, 1, k, b);
        if (!a || !b || fclose(b) != 0) {
            fprintf(stderr, "bench_keys: copy failed\n");
            return 1;
        }
        fclose(a);
    }
    add_index(p1);
    fkvf_reader *r0 = NULL, *r1 = NULL;
    int rc;
    if ((rc = fkvf_reader_open_file(&r0, p0, 0, NULL)) ||
        (rc = fkvf_reader_open_file(&r1, p1, 0, NULL)))
        die("open", rc, "");
    fkvf_archive_info ai;
    fkvf_reader_info(r0, &ai);
    const uint64_t A = ai.n_archived;
    fkvf_key_search *k0 = NULL, *k1 = NULL;
    if ((rc = fkvf_search_keys_open(&k0, r0, NULL)) || (rc = fkvf_search_keys_open(&k1, r1, NULL)))
        die("key search", rc, "");
    float *keys = xmalloc((size_t)A * D * sizeof(float));
    double *tk1 = xmalloc((size_t)Q * sizeof(double)), *tk0 = xmalloc((size_t)Q * sizeof(double));
    double *trd = xmalloc((size_t)Q * sizeof(double)), *tsc = xmalloc((size_t)Q * sizeof(double));
    double *ratio = xmalloc((size_t)Q * sizeof(double)), *ratio2 = xmalloc((size_t)Q * sizeof(double));
    fkvf_key_hit *h0 = xmalloc((size_t)m * sizeof *h0), *h1 = xmalloc((size_t)m * sizeof *h1);
    uint64_t *top = xmalloc((size_t)m * sizeof *top);
    double *ts = xmalloc((size_t)m * sizeof *ts), cand = 0, syms = 0, cent = 0;
    size_t found = 0, mismatch = 0;
    for (long qi = 0; qi < Q; qi++) {
        float q[D];
        const int c = (int)(uni() * CENTRES);
        const int h = (int)(qi % H);
        for (int d = 0; d < D; d++)
            q[d] = 2.0f * centre[c][d] + 0.3f * (float)gauss();
        fkvf_rope_apply_f32(&ROPE, N, 0, q, D);
        fkvf_key_query kq = {0, (uint32_t)h, q, D, 0, 0, (size_t)m, (uint32_t)cf,
                             (uint64_t)chunk};
        fkvf_read_request rq = {S, A, 0, 1, (uint32_t)h, 1, FKVF_PART_KEYS, FKVF_DTYPE_F32,
                                FKVF_LAYOUT_HEADS};
        size_t n0 = 0, n1 = 0;
        fkvf_key_stats st;
        double t_k1 = 0, t_k0 = 0, t_rd = 0, t_sc = 0;
        for (int step = 0; step < 4; step++) { /* rotating order */
            switch ((qi + step) % 4) {
            case 0:
                t0 = now();
                rc = fkvf_search_keys(k1, &kq, h1, &n1, &st);
                t_k1 = now() - t0;
                if (rc)
                    die("search keys", rc, fkvf_search_keys_message(k1));
                cand += (double)st.candidates;
                cent += (double)st.centroids_scored;
                syms += (double)st.symbols_searched;
                break;
            case 1:
                t0 = now();
                rc = fkvf_search_keys(k0, &kq, h0, &n0, NULL);
                t_k0 = now() - t0;
                if (rc)
                    die("search keys", rc, fkvf_search_keys_message(k0));
                break;
            case 2:
                t0 = now();
                rc = fkvf_reader_read(r0, &rq, keys, (size_t)A * D * sizeof(float));
                top_m(keys, A, q, (size_t)m, top, ts);
                t_rd = now() - t0;
                if (rc)
                    die("read", rc, fkvf_reader_message(r0));
                break;
            default:
                /* the keys of this head, decoded once before */
                if (fkvf_reader_read(r0, &rq, keys, (size_t)A * D * sizeof(float)))
                    die("read", 1, fkvf_reader_message(r0));
                t0 = now();
                top_m(keys, A, q, (size_t)m, top, ts);
                t_sc = now() - t0;
                break;
            }
        }
        if (n0 != n1 || memcmp(h0, h1, n0 * sizeof *h0) != 0)
            mismatch++;
        for (size_t i = 0; i < n1; i++)
            for (long j = 0; j < m; j++)
                found += h1[i].position == top[j];
        tk1[qi] = t_k1;
        tk0[qi] = t_k0;
        trd[qi] = t_rd;
        tsc[qi] = t_sc;
        ratio[qi] = t_rd / t_k1;
        ratio2[qi] = t_sc / t_k1;
    }
    const double recall = (double)found / ((double)Q * (double)m);
    char chunk_s[32];
    if (as_is)
        snprintf(chunk_s, sizeof chunk_s, "all (keys as cached)");
    else if (chunk)
        snprintf(chunk_s, sizeof chunk_s, "%ld", chunk);
    else
        snprintf(chunk_s, sizeof chunk_s, "%u (the default)", FKVF_KEY_CHUNK);
    const double mk1 = median(tk1, (size_t)Q), mk0 = median(tk0, (size_t)Q);
    const double mrd = median(trd, (size_t)Q), msc = median(tsc, (size_t)Q);
    const double rr = median(ratio, (size_t)Q), rs = median(ratio2, (size_t)Q);
    printf("bench_keys: %llu positions (%llu archived), 1 layer x %d KV heads of dim %d, f16, "
           "keys %s, k = 256 K x4 V x2; archive written in %.1f s; %ld queries, m = %ld, "
           "candidates %ld m, chunks of %s positions (%.0f centroids scored, %.0f keys decoded, "
           "%.1f symbols searched a query)\n\n",
           (unsigned long long)N, (unsigned long long)A, H, D,
           as_is ? "as cached (after RoPE)" : "before RoPE", t_write, Q, m,
           cf ? cf : (long)FKVF_KEY_CANDIDATES, chunk_s, cent / (double)Q, cand / (double)Q,
           syms / (double)Q);
    printf("| per query (median) | time | vs keys, index |\n|---|---|---|\n");
    printf("| fkvf_search_keys, ZPOS index | %.1f us | 1 |\n", 1e6 * mk1);
    printf("| fkvf_search_keys, scan | %.1f us | %.2fx |\n", 1e6 * mk0, mk0 / mk1);
    printf("| read every key of the head + score | %.1f us | %.1fx (median of ratios %.1fx) |\n",
           1e6 * mrd, mrd / mk1, rr);
    printf("| score keys already decoded in memory | %.1f us | %.2fx (median of ratios %.2fx) |\n",
           1e6 * msc, msc / mk1, rs);
    printf("\nrecall of the exact top %ld (by the decoded keys): %.3f; indexed and scanned "
           "answers %s\n",
           m, recall, mismatch ? "DIFFER" : "identical");
    printf("RESULT keys_query_us=%.1f read_score_vs_keys=%.1f keys_recall=%.3f\n", 1e6 * mk1, rr,
           recall);
    fkvf_search_keys_free(k0);
    fkvf_search_keys_free(k1);
    fkvf_reader_free(r0);
    fkvf_reader_free(r1);
    unlink(p0);
    unlink(p1);
    rmdir(dir);
    free(keys);
    free(tk1);
    free(tk0);
    free(trd);
    free(tsc);
    free(ratio);
    free(ratio2);
    free(h0);
    free(h1);
    free(top);
    free(ts);
    return mismatch ? 1 : 0;
}
