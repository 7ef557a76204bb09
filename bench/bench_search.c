/* bench_search: suffix search on an archive's streams (fkvf.h "search",
 * spec 20).
 *
 * Part 0 (index size, paired; always run, first): a quad b = 8 stream of
 * --positions N symbols (default 100000; i.i.d. Zipf over 256 symbols) and
 * an ngon N = 256 stream of N / 4, each archived three times: with a ZPOS
 * index (what the library writes, spec 20.7), with a 1.0 ZIDX index, and
 * without. Index bytes per indexed position from the section and from the
 * file growth; then suffix queries of 4, 8 and 16 symbols (--queries of
 * each) through the three handles, in rotating order, CPU time
 * (CLOCK_PROCESS_CPUTIME_ID) per batch of 16 queries: the median of the
 * per-batch ratios ZPOS / ZIDX and scan / ZIDX; every answer compared.
 * Ends (after the other parts) with the line
 *   RESULT zidx_bytes_per_pos=<ZPOS bytes per position, quad>
 *          search_new_vs_old=<median ZPOS / ZIDX time ratio, all batches>
 * on stdout, on one line. bench/compare.sh runs
 *   bench_search --quick [--positions N]
 * (--quick = --no-real --no-1m --queries 200: under a minute).
 *
 * Part 1 (latency): a stream of 10^5 and 10^6 8-bit symbols (i.i.d. Zipf
 * over 256 symbols, the width of a k = 256 index stream) archived as quad
 * with a ZIDX index. For query lengths 4, 8, 16 and 32 symbols (the last is
 * beyond one 128-bit key: the rest is checked by decoding), 1,000 queries
 * taken from the stream at random positions: median and 90th percentile of
 * fkvf_search_suffix with the index, of the same call scanning the stored
 * points (no index), and of a plain memmem scan of the unpacked symbols, in
 * the same run; all three must report the same number of positions. Also
 * open and index-build times, and the ngon N = 256 profile at 10^5.
 *
 * Part 2 (false positives on real KV streams): the tiny engine
 * (examples/engine, stories260K) samples sequences; a k = 256 codebook
 * (K x2, V x1) is trained on some, the others are encoded and archived as
 * quad b = 8 and as ngon N = 256, one archive each, their index streams
 * concatenated over the sequences. For suffix lengths s = 1..8, queries are
 * the contexts of random positions of every index stream; the radius query
 * with the radius that holds every match (fkvf_search_default_radius)
 * returns candidates and verified positions; the false-positive rate is
 * (candidates - verified) / candidates over all queries.
 *
 * Usage: bench_search [--model PATH] [--queries N] [--no-real] [--no-1m]
 *                     [--train N] [--eval N] [--tokens T] [--positions N]
 *                     [--quick]
 * Archives are built in memory (no temporary files).
 */
#define _GNU_SOURCE /* memmem */
#include <fkvf.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"
#include "search/zidx_legacy.h" /* the 1.0 ZIDX builder, for the paired comparison */

#ifndef BENCH_SEARCH_MODEL
#define BENCH_SEARCH_MODEL "../shared/models/stories260K.bin"
#endif

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench_search: out of memory\n");
        exit(1);
    }
    return p;
}

static void die(const char *what, int rc, const char *msg)
{
    fprintf(stderr, "bench_search: %s: %s (%s)\n", what, fkvf_strerror(rc), msg ? msg : "");
    exit(1);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* ---- an archive in memory ----------------------------------------------- */

typedef struct mbuf {
    uint8_t *p;
    size_t n, cap;
} mbuf;

static long long mbuf_write(void *o, const void *d, size_t n)
{
    mbuf *b = o;
    if (b->n + n > b->cap) {
        size_t c = b->cap ? b->cap : 1 << 16;
        while (c < b->n + n)
            c *= 2;
        uint8_t *q = realloc(b->p, c);
        if (!q)
            return -1;
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
    return (long long)n;
}

static fkvf_writer *new_writer(mbuf *b, int ngon)
{
    fkvf_sink sink = {mbuf_write, NULL, b};
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.optional_features = FKVF_OPTFEAT_TOKEN_STREAM;
    if (ngon)
        o.required_features = FKVF_FEAT_NGON;
    fkvf_writer *w = NULL;
    int rc = fkvf_writer_create_sink(&w, &sink, &o, NULL);
    if (rc)
        die("writer", rc, w ? fkvf_writer_message(w) : NULL);
    return w;
}

/* Token-stream archive of sym[0..n) with a commit holding an index section
 * of type `index` (FKVF_SECTION_ZPOS, FKVF_SECTION_ZIDX; 0: none). */
static void build_token_archive(mbuf *b, const fkvf_stream_spec *sp, const uint32_t *sym, size_t n,
                                uint32_t index, double *build_s, size_t *index_bytes)
{
    memset(b, 0, sizeof *b);
    fkvf_writer *w = new_writer(b, sp->profile == FKVF_PROFILE_NGON);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = d.n_kv_heads = d.key_dim = d.value_dim = 1;
    d.dtype = FKVF_DTYPE_F16;
    int rc = fkvf_writer_set_desc(w, &d);
    if (!rc)
        rc = fkvf_writer_add_token_segment(w, sp, 0, sym, n);
    uint16_t *rows = calloc(n, 4);
    if (!rc)
        rc = fkvf_writer_add_exact(w, 0, n, rows, n * 4, 0);
    free(rows);
    if (!rc)
        rc = fkvf_writer_set_positions(w, n, 0);
    if (!rc)
        rc = fkvf_writer_commit(w);
    if (rc)
        die("token archive", rc, fkvf_writer_message(w));
    if (index) {
        fkvf_reader *r = NULL;
        if ((rc = fkvf_reader_open_memory(&r, b->p, b->n, 0, NULL)))
            die("open", rc, r ? fkvf_reader_message(r) : NULL);
        void *zd;
        size_t zs;
        uint64_t key;
        double t0 = now();
        rc = index == FKVF_SECTION_ZIDX ? fkvf_search_zidx_build(r, 0, &zd, &zs, &key, NULL)
                                        : fkvf_search_index_build(r, 0, &zd, &zs, &key, NULL);
        if (rc)
            die("index build", rc, fkvf_reader_message(r));
        *build_s = now() - t0;
        *index_bytes = zs;
        fkvf_reader_free(r);
        if ((rc = fkvf_writer_add_section(w, index, 0, key, zd, zs)) ||
            (rc = fkvf_writer_commit(w)))
            die("index commit", rc, fkvf_writer_message(w));
        fkvf_search_buffer_free(zd, NULL);
    }
    if ((rc = fkvf_writer_finish(w)))
        die("finish", rc, fkvf_writer_message(w));
    fkvf_writer_free(w);
}

/* ---- part 1: latency ---------------------------------------------------- */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, cmp_d);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

/* All occurrences of q in s: what a plain scan of the unpacked symbols finds. */
static uint64_t memmem_count(const uint8_t *s, size_t n, const uint8_t *q, size_t len)
{
    uint64_t c = 0;
    const uint8_t *p = s, *end = s + n;
    while (p < end) {
        const uint8_t *h = memmem(p, (size_t)(end - p), q, len);
        if (!h)
            break;
        c++;
        p = h + 1;
    }
    return c;
}

static void zipf_stream(uint32_t *sym, size_t n, uint64_t seed)
{
    double cdf[256], z = 0;
    for (int i = 0; i < 256; i++)
        z += 1.0 / (i + 1);
    double acc = 0;
    for (int i = 0; i < 256; i++) {
        acc += 1.0 / (i + 1) / z;
        cdf[i] = acc;
    }
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        double u = (double)(rng_next(&s) >> 11) * 0x1p-53;
        int lo = 0, hi = 255;
        while (lo < hi) {
            int m = (lo + hi) / 2;
            if (cdf[m] < u)
                lo = m + 1;
            else
                hi = m;
        }
        sym[i] = (uint32_t)lo;
    }
}

static void latency(size_t n, int nq, int ngon)
{
    uint32_t *sym = xmalloc(n * sizeof *sym);
    zipf_stream(sym, n, 42 + n);
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    if (ngon) {
        sp.profile = FKVF_PROFILE_NGON;
        sp.alphabet = 256;
    } else {
        sp.profile = FKVF_PROFILE_QUAD;
        sp.symbol_bits = 8;
    }
    mbuf b;
    double build_s = 0;
    size_t ib = 0;
    build_token_archive(&b, &sp, sym, n, FKVF_SECTION_ZPOS, &build_s, &ib);
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_memory(&r, b.p, b.n, 0, NULL);
    if (rc)
        die("open", rc, r ? fkvf_reader_message(r) : NULL);
    fkvf_search *si = NULL, *ss = NULL;
    double t0 = now();
    if ((rc = fkvf_search_open(&si, r, 0, 0, NULL)))
        die("search open", rc, si ? fkvf_search_message(si) : NULL);
    double open_i = now() - t0;
    t0 = now();
    if ((rc = fkvf_search_open(&ss, r, 0, FKVF_SEARCH_NO_INDEX, NULL)))
        die("search open", rc, ss ? fkvf_search_message(ss) : NULL);
    double open_s = now() - t0;
    uint8_t *u8 = xmalloc(n);
    for (size_t i = 0; i < n; i++)
        u8[i] = (uint8_t)sym[i];
    printf("### %s, %zu positions\n\n", ngon ? "ngon N = 256" : "quad b = 8", n);
    printf("archive %zu bytes (ZPOS index %zu bytes, built in %.1f ms); search handle open: %.2f ms "
           "with the index, %.2f ms without (reads and holds the stream's points)\n\n",
           b.n, ib, build_s * 1e3, open_i * 1e3, open_s * 1e3);
    printf("| query symbols | matches (median) | indexed median / p90 (us) | scan median / p90 "
           "(us) | memmem median / p90 (us) | indexed candidates (median) |\n");
    printf("|---|---|---|---|---|---|\n");
    static const size_t lens[] = {4, 8, 16, 32};
    double *ti = xmalloc((size_t)nq * sizeof *ti), *ts = xmalloc((size_t)nq * sizeof *ts),
           *tm = xmalloc((size_t)nq * sizeof *tm), *mc = xmalloc((size_t)nq * sizeof *mc),
           *cc = xmalloc((size_t)nq * sizeof *cc);
    uint64_t *out = xmalloc(4096 * sizeof *out);
    uint64_t seed = 7 + n;
    for (size_t li = 0; li < 4; li++) {
        size_t len = lens[li];
        uint8_t q8[64];
        for (int k = 0; k < nq; k++) {
            size_t t = len - 1 + (size_t)(rng_next(&seed) % (n - len + 1));
            const uint32_t *q = sym + t + 1 - len;
            for (size_t j = 0; j < len; j++)
                q8[j] = (uint8_t)q[j];
            uint64_t a, c;
            double s0 = now();
            if ((rc = fkvf_search_suffix(si, q, len, out, 4096, &a)))
                die("suffix", rc, fkvf_search_message(si));
            double s1 = now();
            fkvf_search_status inf;
            fkvf_search_info(si, &inf);
            uint64_t bb;
            double s2 = now();
            if ((rc = fkvf_search_suffix(ss, q, len, out, 4096, &bb)))
                die("suffix", rc, fkvf_search_message(ss));
            double s3 = now();
            c = memmem_count(u8, n, q8, len);
            double s4 = now();
            if (a != bb || a != c) {
                fprintf(stderr, "bench_search: results differ: index %llu, scan %llu, memmem %llu\n",
                        (unsigned long long)a, (unsigned long long)bb, (unsigned long long)c);
                exit(1);
            }
            ti[k] = (s1 - s0) * 1e6;
            ts[k] = (s3 - s2) * 1e6;
            tm[k] = (s4 - s3) * 1e6;
            mc[k] = (double)a;
            cc[k] = (double)inf.candidates;
        }
        double mi = pct(ti, (size_t)nq, 0.5), pi = pct(ti, (size_t)nq, 0.9);
        double ms = pct(ts, (size_t)nq, 0.5), ps = pct(ts, (size_t)nq, 0.9);
        double mm = pct(tm, (size_t)nq, 0.5), pm = pct(tm, (size_t)nq, 0.9);
        printf("| %zu | %.0f | %.2f / %.2f | %.1f / %.1f | %.1f / %.1f | %.0f |\n", len,
               pct(mc, (size_t)nq, 0.5), mi, pi, ms, ps, mm, pm, pct(cc, (size_t)nq, 0.5));
    }
    printf("\n");
    free(ti);
    free(ts);
    free(tm);
    free(mc);
    free(cc);
    free(out);
    free(u8);
    fkvf_search_free(si);
    fkvf_search_free(ss);
    fkvf_reader_free(r);
    free(b.p);
    free(sym);
}

/* ---- part 0: ZPOS against ZIDX against scan, paired -------------------- */

static double median_of(double *v, size_t n) { return n ? pct(v, n, 0.5) : 0.0; }

typedef struct paired_out {
    double zpos_bpp, zidx_bpp; /* section bytes per indexed position */
    double *ratio;             /* ZPOS / ZIDX per batch, appended */
    size_t n_ratio;
} paired_out;

static void paired(size_t n, int nq, int ngon, paired_out *po)
{
    uint32_t *sym = xmalloc(n * sizeof *sym);
    zipf_stream(sym, n, 4242 + n);
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    if (ngon) {
        sp.profile = FKVF_PROFILE_NGON;
        sp.alphabet = 256;
    } else {
        sp.profile = FKVF_PROFILE_QUAD;
        sp.symbol_bits = 8;
    }
    static const uint32_t types[3] = {FKVF_SECTION_ZIDX, FKVF_SECTION_ZPOS, 0};
    static const char *names[3] = {"ZIDX (1.0)", "ZPOS", "none (scan)"};
    mbuf b[3];
    double bs[3] = {0, 0, 0}, op[3];
    size_t ib[3] = {0, 0, 0};
    fkvf_reader *r[3];
    fkvf_search *h[3];
    fkvf_search_status inf;
    for (int k = 0; k < 3; k++) {
        build_token_archive(&b[k], &sp, sym, n, types[k], &bs[k], &ib[k]);
        r[k] = NULL;
        h[k] = NULL;
        int rc = fkvf_reader_open_memory(&r[k], b[k].p, b[k].n, 0, NULL);
        if (rc)
            die("open", rc, r[k] ? fkvf_reader_message(r[k]) : NULL);
        double t0 = cpu_now();
        if ((rc = fkvf_search_open(&h[k], r[k], 0, 0, NULL)))
            die("search open", rc, h[k] ? fkvf_search_message(h[k]) : NULL);
        op[k] = cpu_now() - t0;
    }
    fkvf_search_info(h[1], &inf);
    uint64_t ni = inf.n_indexed;
    printf("### %s, %zu positions (%llu indexed)\n\n", ngon ? "ngon N = 256" : "quad b = 8", n,
           (unsigned long long)ni);
    printf("| index | section bytes | bytes per indexed position | file growth per position | "
           "build (ms) | handle open, CPU (ms) |\n|---|---|---|---|---|---|\n");
    for (int k = 0; k < 3; k++)
        printf("| %s | %zu | %.2f | %.2f | %.1f | %.2f |\n", names[k], ib[k],
               ni && k < 2 ? (double)ib[k] / (double)ni : 0.0,
               k < 2 ? (double)(b[k].n - b[2].n) / (double)n : 0.0, bs[k] * 1e3, op[k] * 1e3);
    if (!ngon) {
        po->zidx_bpp = (double)ib[0] / (double)ni;
        po->zpos_bpp = (double)ib[1] / (double)ni;
    }
    printf("\n| query symbols | batches | ZPOS / ZIDX CPU time (median of per-batch ratios) | "
           "scan / ZIDX | ZIDX per query (us, median) |\n|---|---|---|---|---|\n");
    enum { BATCH = 16 };
    static const size_t lens[] = {4, 8, 16};
    size_t nb = (size_t)(nq + BATCH - 1) / BATCH;
    double *rn = xmalloc(nb * sizeof *rn), *rs = xmalloc(nb * sizeof *rs),
           *tz = xmalloc(nb * sizeof *tz);
    uint64_t *out[3];
    for (int k = 0; k < 3; k++)
        out[k] = xmalloc(8192 * sizeof(uint64_t));
    uint64_t seed = 99 + n;
    const uint32_t *qs[BATCH];
    for (size_t li = 0; li < 3; li++) {
        size_t len = lens[li];
        for (size_t bi = 0; bi < nb; bi++) {
            for (int j = 0; j < BATCH; j++)
                qs[j] = sym + (size_t)(rng_next(&seed) % (n - len + 1));
            double t[3];
            for (int rot = 0; rot < 3; rot++) {
                int k = (int)((bi + (size_t)rot) % 3); /* rotating order */
                double t0 = cpu_now();
                for (int j = 0; j < BATCH; j++) {
                    uint64_t nf;
                    int rc = fkvf_search_suffix(h[k], qs[j], len, out[k], 8192, &nf);
                    if (rc)
                        die("suffix", rc, fkvf_search_message(h[k]));
                    out[k][8191] = nf;
                }
                t[k] = cpu_now() - t0;
            }
            /* the last query's answers, compared */
            uint64_t nf = out[0][8191];
            for (int k = 1; k < 3; k++)
                if (out[k][8191] != nf ||
                    memcmp(out[k], out[0], (nf < 8191 ? nf : 8191) * sizeof(uint64_t))) {
                    fprintf(stderr, "bench_search: %s and ZIDX answers differ\n", names[k]);
                    exit(1);
                }
            rn[bi] = t[1] / t[0];
            rs[bi] = t[2] / t[0];
            tz[bi] = t[0] / BATCH * 1e6;
            po->ratio[po->n_ratio++] = rn[bi];
        }
        double mrn = median_of(rn, nb), mrs = median_of(rs, nb), mtz = median_of(tz, nb);
        printf("| %zu | %zu | %.3f | %.2f | %.2f |\n", len, nb, mrn, mrs, mtz);
    }
    printf("\n");
    free(rn);
    free(rs);
    free(tz);
    for (int k = 0; k < 3; k++) {
        free(out[k]);
        fkvf_search_free(h[k]);
        fkvf_reader_free(r[k]);
        free(b[k].p);
    }
    free(sym);
}

/* ---- part 2: false positives on real KV index streams ------------------- */

typedef struct realset {
    int L, H, D;
    size_t RW, A; /* floats per row, positions */
    float *rows;  /* A rows: per layer keys (pre-RoPE) of every head, then values */
} realset;

static int gen(const lm_model *m, const realset *s, int T, uint64_t seed, float *rows)
{
    const lm_config *c = lm_model_config(m);
    lm_state *st = lm_state_new(m, T);
    if (!st)
        return -1;
    lm_rng rng;
    lm_rng_seed(&rng, seed);
    int tok = LM_BOS;
    for (int pos = 0; pos < T; pos++) {
        const float *lg = lm_forward(st, tok, pos);
        if (!lg) {
            lm_state_free(st);
            return -1;
        }
        tok = lm_sample(lg, c->vocab_size, 1.0, &rng);
    }
    for (int l = 0; l < s->L; l++) {
        const float *kc = lm_cache_data(st, l, LM_KEY_PREROPE);
        const float *vc = lm_cache_data(st, l, LM_VALUE);
        for (int g = 0; g < s->H; g++)
            for (int p = 0; p < T; p++) {
                size_t src = ((size_t)g * (size_t)T + (size_t)p) * (size_t)s->D;
                float *row = rows + (size_t)p * s->RW + (size_t)l * 2 * s->H * s->D;
                memcpy(row + (size_t)g * s->D, kc + src, (size_t)s->D * sizeof(float));
                memcpy(row + (size_t)(s->H + g) * s->D, vc + src, (size_t)s->D * sizeof(float));
            }
    }
    lm_state_free(st);
    return 0;
}

/* Archive of the index streams of `codes` (A positions, cpp codes each). */
static int build_index_archive(mbuf *b, const realset *s, const fkvf_rvq *q, const uint16_t *codes,
                               size_t cpp, int ngon, uint32_t span)
{
    memset(b, 0, sizeof *b);
    fkvf_writer *w = new_writer(b, ngon);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = (uint32_t)s->L;
    d.n_kv_heads = (uint32_t)s->H;
    d.key_dim = d.value_dim = (uint32_t)s->D;
    d.dtype = FKVF_DTYPE_F16;
    fkvf_codebook_shape sh;
    fkvf_rvq_shape(q, &sh, NULL);
    size_t tb = fkvf_rvq_tables_size(q);
    void *tables = xmalloc(tb);
    int rc = fkvf_rvq_tables(q, tables, tb);
    if (!rc)
        rc = fkvf_writer_set_desc(w, &d);
    if (!rc)
        rc = fkvf_writer_add_codebooks(w, &sh, tables, tb, 0);
    free(tables);
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    if (ngon) {
        sp.profile = FKVF_PROFILE_NGON;
        sp.alphabet = 256;
        sp.span_symbols = span;
    } else {
        sp.profile = FKVF_PROFILE_QUAD;
        sp.symbol_bits = 8;
    }
    if (!rc)
        rc = fkvf_writer_add_index_segment(w, &sp, 0, s->A, codes, cpp, 1);
    if (rc == FKVF_E_CODEC) {
        fkvf_writer_free(w);
        free(b->p);
        return rc;
    }
    if (!rc)
        rc = fkvf_writer_set_positions(w, s->A, s->A);
    if (!rc)
        rc = fkvf_writer_finish(w);
    if (rc)
        die("index archive", rc, fkvf_writer_message(w));
    fkvf_writer_free(w);
    return FKVF_OK;
}

static void false_positives(const char *model, int n_train, int n_eval, int T, int nq)
{
    FILE *f = fopen(model, "rb");
    if (!f) {
        printf("## False positives on real KV index streams\n\nskipped: %s not found\n\n", model);
        return;
    }
    fclose(f);
    char err[256];
    lm_model *m = lm_load(model, err, sizeof err);
    if (!m) {
        fprintf(stderr, "bench_search: %s\n", err);
        exit(1);
    }
    const lm_config *c = lm_model_config(m);
    if (T > c->seq_len)
        T = c->seq_len;
    realset s = {c->n_layers, c->n_kv_heads, c->head_size, 0, 0, NULL};
    s.RW = (size_t)s.L * 2 * (size_t)s.H * (size_t)s.D;
    float *tr = xmalloc((size_t)n_train * (size_t)T * s.RW * sizeof(float));
    s.A = (size_t)n_eval * (size_t)T;
    s.rows = xmalloc(s.A * s.RW * sizeof(float));
    double t0 = now();
    for (int i = 0; i < n_train + n_eval; i++) {
        float *dst = i < n_train ? tr + (size_t)i * (size_t)T * s.RW
                                 : s.rows + (size_t)(i - n_train) * (size_t)T * s.RW;
        if (gen(m, &s, T, 1000 + (uint64_t)i, dst)) {
            fprintf(stderr, "bench_search: forward pass failed\n");
            exit(1);
        }
    }
    double gen_s = now() - t0;
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = (uint32_t)s.L;
    p.n_kv_heads = (uint32_t)s.H;
    p.key_dim = p.value_dim = (uint32_t)s.D;
    p.k = 256;
    p.k_stages = 2;
    p.v_stages = 1;
    p.max_iters = 15;
    fkvf_rows *blk = xmalloc((size_t)n_train * sizeof *blk);
    for (int i = 0; i < n_train; i++) {
        blk[i].data = tr + (size_t)i * (size_t)T * s.RW;
        blk[i].n_rows = (size_t)T;
        blk[i].dtype = FKVF_DTYPE_F32;
        blk[i].first_position = 0;
    }
    fkvf_rvq *q = NULL;
    int rc = fkvf_rvq_train(&q, &p, blk, (size_t)n_train, NULL);
    if (rc)
        die("train", rc, NULL);
    free(blk);
    size_t cpp = fkvf_rvq_codes_per_position(q);
    uint16_t *codes = xmalloc(s.A * cpp * sizeof *codes);
    fkvf_rows rr = {s.rows, s.A, FKVF_DTYPE_F32, 0};
    if ((rc = fkvf_rvq_encode(q, &rr, NULL, 1, codes, cpp, 1)))
        die("encode", rc, NULL);
    printf("## False positives of radius queries on real KV index streams\n\n");
    printf("%s: %d training and %d evaluation sequences of %d tokens sampled from BOS at "
           "temperature 1.0 (%.1f s); codebook k = 256, keys (before RoPE) x2 and values x1 "
           "stages; the %d evaluation sequences encoded and concatenated: %zu index streams of "
           "%zu positions, archived once as quad b = 8 and once as ngon N = 256. Per suffix "
           "length s, %d queries per profile: the last s symbols of a random position of a "
           "random index stream; radius = fkvf_search_default_radius(s) (quad: sqrt(2) * "
           "2^(-4s), the cell of the s symbols seen from its corner; ngon: r^min(s, L)). "
           "Candidates are points within the radius, verified are those whose last s symbols "
           "equal the query (always exactly the exact-suffix answer). FP rate = (candidates - "
           "verified) / candidates summed over the queries.\n\n",
           model, n_train, n_eval, T, gen_s, n_eval, cpp, s.A, nq);
    mbuf bq, bn;
    build_index_archive(&bq, &s, q, codes, cpp, 0, 0);
    uint32_t span = 0;
    while ((rc = build_index_archive(&bn, &s, q, codes, cpp, 1, span)) == FKVF_E_CODEC)
        span = span ? span - 1 : 5;
    fkvf_reader *rq = NULL, *rn = NULL;
    if ((rc = fkvf_reader_open_memory(&rq, bq.p, bq.n, 0, NULL)) ||
        (rc = fkvf_reader_open_memory(&rn, bn.p, bn.n, 0, NULL)))
        die("open", rc, NULL);
    fkvf_stream_info ni;
    fkvf_reader_stream_info(rn, 0, &ni);
    printf("ngon N = 256: r = %.6g, L = %u symbols per span (%s). Archive sizes: quad %zu "
           "bytes, ngon %zu bytes.\n\n",
           ni.r, ni.span_symbols, span ? "the writer refused a longer span" : "L_max(r)", bq.n,
           bn.n);
    printf("| s | quad radius | quad candidates / query | quad verified / query | quad FP rate | "
           "ngon radius | ngon candidates / query | ngon verified / query | ngon FP rate |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    fkvf_search **hq = xmalloc(cpp * sizeof *hq), **hn = xmalloc(cpp * sizeof *hn);
    for (size_t j = 0; j < cpp; j++) {
        hq[j] = hn[j] = NULL;
        if ((rc = fkvf_search_open(&hq[j], rq, j, 0, NULL)) ||
            (rc = fkvf_search_open(&hn[j], rn, j, 0, NULL)))
            die("search open", rc, NULL);
    }
    uint64_t seed = 99;
    for (size_t sl = 1; sl <= 8; sl++) {
        double cand[2] = {0, 0}, ver[2] = {0, 0}, rad[2] = {0, 0};
        for (int k = 0; k < nq; k++) {
            size_t j = (size_t)(rng_next(&seed) % cpp);
            size_t t = sl - 1 + (size_t)(rng_next(&seed) % (s.A - sl + 1));
            uint32_t qq[16];
            for (size_t i = 0; i < sl; i++)
                qq[i] = codes[(t + 1 - sl + i) * cpp + j];
            for (int pr = 0; pr < 2; pr++) {
                fkvf_search *h = pr ? hn[j] : hq[j];
                fkvf_radius_result res;
                if ((rc = fkvf_search_radius(h, qq, sl, 0.0, NULL, 0, &res)))
                    die("radius", rc, fkvf_search_message(h));
                uint64_t nf;
                if ((rc = fkvf_search_suffix(h, qq, sl, NULL, 0, &nf)))
                    die("suffix", rc, fkvf_search_message(h));
                if (nf != res.verified) {
                    fprintf(stderr, "bench_search: radius verified %llu, suffix %llu\n",
                            (unsigned long long)res.verified, (unsigned long long)nf);
                    exit(1);
                }
                cand[pr] += (double)res.candidates;
                ver[pr] += (double)res.verified;
                rad[pr] = res.radius;
            }
        }
        printf("| %zu | %.3g | %.1f | %.1f | %.3f | %.3g | %.1f | %.1f | %.3f |\n", sl, rad[0],
               cand[0] / nq, ver[0] / nq, (cand[0] - ver[0]) / cand[0], rad[1], cand[1] / nq,
               ver[1] / nq, (cand[1] - ver[1]) / cand[1]);
    }
    printf("\n");
    for (size_t j = 0; j < cpp; j++) {
        fkvf_search_free(hq[j]);
        fkvf_search_free(hn[j]);
    }
    free(hq);
    free(hn);
    fkvf_reader_free(rq);
    fkvf_reader_free(rn);
    free(bq.p);
    free(bn.p);
    free(codes);
    fkvf_rvq_free(q);
    free(tr);
    free(s.rows);
    lm_free(m);
}

int main(int argc, char **argv)
{
    const char *model = BENCH_SEARCH_MODEL;
    int nq = 1000, real = 1, big = 1, n_train = 8, n_eval = 24, T = 512;
    long positions = 100000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(a, "--queries") && i + 1 < argc && (nq = atoi(argv[i + 1])) > 0)
            i++;
        else if (!strcmp(a, "--train") && i + 1 < argc && (n_train = atoi(argv[i + 1])) > 0)
            i++;
        else if (!strcmp(a, "--eval") && i + 1 < argc && (n_eval = atoi(argv[i + 1])) > 0)
            i++;
        else if (!strcmp(a, "--tokens") && i + 1 < argc && (T = atoi(argv[i + 1])) > 16)
            i++;
        else if (!strcmp(a, "--no-real"))
            real = 0;
        else if (!strcmp(a, "--no-1m"))
            big = 0;
        else if (!strcmp(a, "--quick"))
            real = big = 0, nq = 200;
        else if (!strcmp(a, "--positions") && i + 1 < argc &&
                 (positions = atol(argv[i + 1])) >= 64 && positions <= 100000000)
            i++;
        else {
            fprintf(stderr, "usage: bench_search [--model PATH] [--queries N] [--no-real] "
                            "[--no-1m] [--train N] [--eval N] [--tokens T] [--positions N] "
                            "[--quick]\n");
            return 2;
        }
    }
    printf("## Search index size and ZPOS / ZIDX / scan latency (paired)\n\n");
    paired_out po;
    memset(&po, 0, sizeof po);
    po.ratio = xmalloc(2 * 3 * ((size_t)nq / 16 + 1) * sizeof *po.ratio);
    paired((size_t)positions, nq, 0, &po);
    paired((size_t)positions / 4, nq, 1, &po);
    printf("## Suffix query latency\n\n");
    printf("One core; %d queries per row, each the last s symbols of a random position (so at "
           "least one match); times per query.\n\n",
           nq);
    latency(100000, nq, 0);
    if (big)
        latency(1000000, nq, 0);
    latency(100000, nq, 1);
    if (real)
        false_positives(model, n_train, n_eval, T, nq);
    printf("RESULT zidx_bytes_per_pos=%.3f search_new_vs_old=%.3f\n", po.zpos_bpp,
           median_of(po.ratio, po.n_ratio));
    free(po.ratio);
    return 0;
}
