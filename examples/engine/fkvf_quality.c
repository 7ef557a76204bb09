/* fkvf-quality: what archiving the KV cache costs in next-token loss, with
 * the paper's protocol (issue 7 item 3; results and commands in
 * docs/quality.md).
 *
 * Protocol. S evaluation sequences of T positions are sampled from BOS at
 * temperature 1 with the exact cache (sequence i: lm_rng seeded with
 * seed * 1000003 + 10000 + i), or with --text taken from a text's bytes
 * (BOS, then id 3 + byte; evaluation and training ranges apart; any llama2.c
 * model with an even head size and kv_dim a multiple of 32: stories260K's 8,
 * shakespeare-hd64's 64). Each configuration then teacher-forces the
 * same tokens through the model (model.c) while keeping the cache the way an
 * FKVF appender with n_sinks = 4 and window = 32 keeps it (--sinks, --recent):
 * at step t the attention sees positions 0..3 and t-31..t exactly and every
 * other earlier position as its reconstruction. A position is quantized once,
 * from the exact row this run computed for it, at the step it leaves the
 * window (step p + 32 for position p; KIVI's keys wait for their group of 32,
 * kivi_key_step), and its reconstruction then replaces it in the
 * cache for the rest of the sequence. The NLL of every next token (T - 1 per
 * sequence) is summed; mean NLL, perplexity = exp(mean NLL), and the
 * perplexity change against the exact cache in percent are printed, also for
 * the predictions made at steps t >= 36 only (the steps at which at least one
 * position is archived).
 *
 * Quantizers. RVQ through libfkvf's public API: codebooks trained with
 * fkvf_rvq_train on the caches of N other sampled sequences (training
 * sequence i: seed * 1000003 + i, i < N; never an evaluation seed), f16
 * tables, rows encoded with fkvf_rvq_encode (greedy, as the appender) and
 * decoded with fkvf_rvq_decode to f32; "pre-RoPE" passes the model's RoPE
 * (interleaved, every dim of a head, theta 10000) to train / encode / decode, so keys are
 * un-rotated at their position before quantization and the reconstruction
 * rotated back (spec 8.1, 13.6). Configurations with fewer stages are
 * fkvf_rvq_subset of one training with the most stages. Scalar peers as in
 * bench/bench_rd.c (f16 scales and zero points, counted in the bytes).
 * --verify checks once that an archive written by fkvf_appender and restored
 * by fkvf_reader_restore gives the same rows bit for bit.
 *
 * Issue 19 B (docs/quality-study.md): codebooks trained and rows encoded under
 * the query metric (keys) and the output metric (values) of metric.c, decoded
 * as plain RVQ (--set metric); per-layer stage counts chosen for a byte budget
 * on calibration sequences, with or without layer 0 from a token table
 * (--alloc).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <fkvf.h>

#include "metric.h"
#include "model.h"
#include "study.h"

#ifndef LM_DEFAULT_MODEL
#define LM_DEFAULT_MODEL "../shared/models/stories260K.bin"
#endif


static void usage(FILE *f)
{
    fprintf(f,
            "usage: fkvf-quality [--model PATH] [--seqs S] [--tokens T] [--train N]\n"
            "                    [--train4096 N] [--seed X] [--sinks S] [--recent W]\n"
            "                    [--iters N] [--iters4096 N] [--cache-dir DIR] [--metric-out DIR]\n"
            "                    [--metric-native]\n"
            "                    [--set exact|smoke|main|full|metric] [--only NAME]... [--from-exact]\n"
            "                    [--no-verify] [--print-ids] [--alloc BYTES [--alloc-cal N]\n"
            "                    [--alloc-metric] [--alloc-beam W]]\n"
            "                    [--text FILE [--eval-bytes A:B] [--train-bytes A:B]]\n"
            "  --seqs S        evaluation sequences (64)\n"
            "  --tokens T      positions per sequence, BOS included (512)\n"
            "  --train N       training sequences for k = 256 and 1024 (64)\n"
            "  --train4096 N   training sequences for k = 4096 (128)\n"
            "  --iters N       Lloyd iterations per stage (25); --iters4096 (10) for k = 4096\n"
            "  --cache-dir DIR keep trained codebooks there (reused when present)\n"
            "  --metric-native the metric rows (--set metric, --alloc-metric) through the\n"
            "                  library's encoder metric (fkvf_rvq_params.metric, format 1.2)\n"
            "                  on the rows as cached, not on rows the study maps itself\n"
            "  --metric-out DIR write the query metric of the keys (pre-RoPE, for the window\n"
            "                  --recent) and the output metric of the values, computed as\n"
            "                  --set metric computes them, to DIR/key-metric.npy and\n"
            "                  DIR/value-metric.npy (float32 [layers, kv_heads, D, D]: what\n"
            "                  fkvf train --key-metric / --value-metric take), and exit\n"
            "  --set           exact: the exact cache only; smoke: exact and two RVQ rows;\n"
            "                  main (default): everything but k = 4096; full: with k = 4096;\n"
            "                  metric: the query-/output-aware rows and the plain k = 256\n"
            "                  pre-RoPE rows they compete with\n"
            "  --only NAME     run only the rows named NAME exactly (\"exact\": the exact cache;\n"
            "                  repeatable, at most 16)\n"
            "  --from-exact    quantize the exact run's rows of each position instead of the\n"
            "                  rows this configuration's run computed (no compounding)\n"
            "  --alloc BYTES   also choose per-layer stage counts of the k = 256 pre-RoPE\n"
            "                  codebook for BYTES per archived position on calibration\n"
            "                  sequences (--alloc-cal N, 16), with and without layer 0 from a\n"
            "                  token table, and evaluate them; --alloc-metric: the query- and\n"
            "                  output-aware codebook; --alloc-beam W: encode their rows with\n"
            "                  beam width W (the costs are measured greedy)\n"
            "  --print-ids     print the token ids of evaluation sequence 0 and its exact\n"
            "                  mean NLL (to compare with fkvf-engine --force)\n"
            "  --text FILE     evaluate on FILE's bytes instead of sampled sequences (BOS, then\n"
            "                  id 3 + byte: a byte-level model); sequence i of a range is the\n"
            "                  T - 1 bytes at its start + i (T - 1)\n"
            "  --eval-bytes A:B    the evaluation range (default: the last tenth of FILE)\n"
            "  --train-bytes A:B   the codebooks' training range (default: the first 9/10)\n"
            "default model: %s\n",
            LM_DEFAULT_MODEL);
}

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
        fprintf(stderr, "fkvf-quality: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* a * b * c elements of size es, overflow-checked */
static size_t xsize(size_t a, size_t b, size_t c, size_t es)
{
    size_t n = a;
    if ((b && n > SIZE_MAX / b) || ((n *= b), c && n > SIZE_MAX / c) ||
        ((n *= c), es && n > SIZE_MAX / es)) {
        fprintf(stderr, "fkvf-quality: size overflow\n");
        exit(1);
    }
    return n * es;
}

/* ---- shape ------------------------------------------------------------------ */

typedef struct shape {
    int L, H, D; /* layers, KV heads, head dim */
    size_t HD;   /* H * D: one layer's key (or value) row */
    size_t RW;   /* floats per row (spec 14.2): L * 2 * HD */
    int V;       /* vocabulary */
    int NH;      /* query heads */
} shape;


/* Copy position p of every layer from the state into row (spec 14.2 layout:
 * per layer the keys of heads 0..H-1 after RoPE, then the values). */
static void gather_row(const shape *s, const lm_state *st, int p, float *row)
{
    for (int l = 0; l < s->L; l++) {
        float *r = row + (size_t)l * 2 * s->HD;
        lm_cache_get(st, l, p, LM_KEY, r);
        lm_cache_get(st, l, p, LM_VALUE, r + s->HD);
    }
}

/* Overwrite position p's keys (parts & 1) and values (parts & 2) from row. */
static void scatter_row(const shape *s, lm_state *st, int p, const float *row, unsigned parts)
{
    for (int l = 0; l < s->L; l++) {
        const float *r = row + (size_t)l * 2 * s->HD;
        if (parts & 1u)
            lm_cache_set(st, l, p, LM_KEY, r);
        if (parts & 2u)
            lm_cache_set(st, l, p, LM_VALUE, r + s->HD);
    }
}

/* A sequence run with the exact cache (st_run_sequence, study.h), its rows
 * gathered into rows (T * RW floats) if not NULL, on_step called after. */
typedef struct gather {
    const shape *s;
    float *rows;
    st_step_fn inner;
    void *u;
} gather;

static void gather_step(void *u, const lm_state *st, int pos)
{
    gather *g = u;
    if (g->rows)
        gather_row(g->s, st, pos, g->rows + (size_t)pos * g->s->RW);
    if (g->inner)
        g->inner(g->u, st, pos);
}

static double sample_sequence(const lm_model *m, const shape *s, int T, uint64_t seed, int *tokens,
                              float *rows, const uint8_t *text, st_step_fn on_step, void *u)
{
    gather g = {s, rows, on_step, u};
    return st_run_sequence("fkvf-quality", m, T, seed, text, tokens, gather_step, &g);
}

/* ---- scalar peers (definitions of bench/bench_rd.c) ---------------------------- */

static float f16r(float x)
{
    return fkvf_f16_to_f32(fkvf_f32_to_f16(x));
}

/* Symmetric: f16 scale = max|x| / qmax, codes in [-qmax, qmax]. */
static void q_sym(const float *x, float *y, size_t n, size_t stride, int bits)
{
    const int qmax = (1 << (bits - 1)) - 1;
    float mx = 0;
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i * stride]) > mx)
            mx = fabsf(x[i * stride]);
    const float sc = f16r(mx / (float)qmax);
    for (size_t i = 0; i < n; i++) {
        float c = sc == 0.0f ? 0.0f : nearbyintf(x[i * stride] / sc);
        c = c > (float)qmax ? (float)qmax : c < (float)-qmax ? (float)-qmax : c;
        y[i * stride] = c * sc;
    }
}

/* Asymmetric: f16 zero = min, f16 scale = (max - min) / (2^bits - 1), codes in
 * [0, 2^bits - 1], dequantized as zero + code * scale. */
static void q_asym(const float *x, float *y, size_t n, size_t stride, int bits)
{
    const int qmax = (1 << bits) - 1;
    float mn = x[0], mx = x[0];
    for (size_t i = 1; i < n; i++) {
        const float a = x[i * stride];
        mn = a < mn ? a : mn;
        mx = a > mx ? a : mx;
    }
    const float z = f16r(mn);
    const float sc = f16r((mx - mn) / (float)qmax);
    for (size_t i = 0; i < n; i++) {
        float c = sc == 0.0f ? 0.0f : nearbyintf((x[i * stride] - z) / sc);
        c = c > (float)qmax ? (float)qmax : c < 0.0f ? 0.0f : c;
        y[i * stride] = z + c * sc;
    }
}

enum { SC_HEAD_SYM, SC_HEAD_ASYM, SC_TOKEN_G32, SC_KIVI };
#define KIVI_GROUP 32 /* KIVI's key group: 32 positions of one channel */

/* The step at which KIVI quantizes position p's key: when p has left the
 * window (p + recent) and every position of its aligned group of 32 has been
 * computed (the group's last row is computed at step 32g + 31, so from step
 * 32 (g + 1) on). Until then the key stays exact, as in KIVI, whose
 * full-precision residual holds the incomplete group; with recent >= 32 this
 * is always p + recent. */
static int kivi_key_step(int p, int recent)
{
    const int done = (p / KIVI_GROUP + 1) * KIVI_GROUP;
    return p + recent > done ? p + recent : done;
}

/* Quantize the parts (1 keys, 2 values) of position p into out (one row;
 * other parts untouched), from the rows of the sequence in ex of which the
 * first avail have been computed. KIVI keys: per channel over the aligned
 * group of 32 positions holding p (positions 32g .. 32g+31, or to the end of
 * the sequence), which must all be computed (see kivi_key_step): reading a row
 * not computed yet would use a future (or stale) row, so the program stops. */
static void scalar_row(const shape *s, const float *ex, int T, int avail, int p, int scheme,
                       int bits, unsigned parts, float *out)
{
    const int g_end = (p / KIVI_GROUP + 1) * KIVI_GROUP < T ? (p / KIVI_GROUP + 1) * KIVI_GROUP : T;
    if (p >= avail || (scheme == SC_KIVI && (parts & 1u) && g_end > avail)) {
        fprintf(stderr, "fkvf-quality: internal error: position %d quantized with %d rows "
                        "computed\n", p, avail);
        abort();
    }
    const float *x = ex + (size_t)p * s->RW;
    for (int l = 0; l < s->L; l++) {
        const size_t o = (size_t)l * 2 * s->HD;
        for (size_t kv = 0; kv < 2; kv++) {
            if (!(parts & (1u << kv)))
                continue;
            const float *xv = x + o + kv * s->HD;
            float *yv = out + o + kv * s->HD;
            if (scheme == SC_HEAD_SYM || scheme == SC_HEAD_ASYM) {
                for (size_t g = 0; g < s->HD; g += (size_t)s->D)
                    (scheme == SC_HEAD_SYM ? q_sym : q_asym)(xv + g, yv + g, (size_t)s->D, 1,
                                                             bits);
            } else if (scheme == SC_TOKEN_G32 || kv == 1) {
                for (size_t j = 0; j < s->HD; j += 32)
                    q_asym(xv + j, yv + j, s->HD - j < 32 ? s->HD - j : 32, 1, bits);
            } else {
                const int p0 = p / KIVI_GROUP * KIVI_GROUP;
                const int m = T - p0 < KIVI_GROUP ? T - p0 : KIVI_GROUP;
                float col[KIVI_GROUP], qc[KIVI_GROUP];
                for (size_t c = 0; c < s->HD; c++) {
                    for (int i = 0; i < m; i++)
                        col[i] = ex[(size_t)(p0 + i) * s->RW + o + c];
                    q_asym(col, qc, (size_t)m, 1, bits);
                    yv[c] = qc[p - p0];
                }
            }
        }
    }
}

/* Bytes per archived position of a scalar scheme for the archived parts. */
static double scalar_bytes(const shape *s, int scheme, int bits, unsigned parts)
{
    const double nparts = (double)((parts & 1u) + ((parts >> 1) & 1u));
    if (scheme == SC_HEAD_SYM) /* D codes + f16 scale per vector */
        return nparts * s->L * s->H * ((double)s->D * bits / 8.0 + 2.0);
    if (scheme == SC_HEAD_ASYM) /* D codes + f16 scale and zero per vector */
        return nparts * s->L * s->H * ((double)s->D * bits / 8.0 + 4.0);
    /* groups of 32 elements (KIVI keys: 32 positions of one channel): 32
     * codes + f16 scale + f16 zero */
    return nparts * s->L * ((double)s->HD / 32.0) * (32.0 * bits / 8.0 + 4.0);
}

/* ---- codebooks ------------------------------------------------------------- */

typedef struct cbspec {
    uint32_t k;
    int pooled, pre_rope, ks, vs; /* stages trained (subsets use fewer) */
    int train;                    /* training sequences */
    unsigned iters;
    fkvf_rvq *q;   /* trained (lazily) */
    double secs;   /* training time */
    int loaded;    /* from the cache dir */
    int metric;    /* METRIC_*: trained and encoded under a metric (metric.h) */
} cbspec;

/* The quantization metric of a codebook (issue 19 B): keys under the query
 * metric (pre-RoPE, averaged over the offsets at which archived keys are
 * read), values under the output metric (W_o). */
enum { METRIC_KEYS = 1, METRIC_VALUES = 2 };
#define METRIC_EPS 0.01   /* qm_transform's floor, relative to the mean eigenvalue */
#define METRIC_SEQS 16    /* training sequences whose queries give the key metric */

typedef struct ctx {
    const lm_model *m;
    shape s;
    int S, T, sinks, recent;
    /* --metric-native: metric codebooks through the library's own encoder
     * metric (fkvf_rvq_params.metric, fkvf_rvq_set_metric: format 1.2) on
     * the rows as cached, instead of the rows mapped by A (metric_row) */
    int native;
    uint64_t seed;
    const char *cache_dir;
    int *ev_tokens;   /* S * T */
    double *ev_exact; /* per sequence: summed NLL with the exact cache (sampling run) */
    float *ev_rows;   /* --from-exact: the sampling run's rows, S * T * RW */
    float *train_rows;
    int n_train_rows; /* sequences generated so far */
    fkvf_rope rope;   /* the model's: interleaved pairs, every dim of a head */
    /* the metric transforms (ensure_metric): [L][H][D][D] each, A and A^-1 */
    float *mk, *mk_inv, *mv, *mv_inv;
    /* and the metrics A^T A themselves, as a codebook file records them
     * (qm_metric_matrix; --metric-out): [L][H][D][D], exactly symmetric */
    float *fk, *fv;
    /* --text: evaluation sequence i is the T - 1 bytes at eval_off + i (T - 1),
     * training sequence i those at train_off + i (T - 1), within their ranges */
    const uint8_t *text;
    size_t eval_off, eval_end, train_off, train_end;
} ctx;

/* the T - 1 text bytes of sequence i of a range, or NULL without --text;
 * exits when the range is too short */
static const uint8_t *text_seq(const ctx *c, size_t off, size_t end, int i, const char *what)
{
    return c->text ? st_text_seq("fkvf-quality", c->text, off, end, c->T, i, what) : NULL;
}

static void ensure_train(ctx *c, int n)
{
    if (n <= c->n_train_rows)
        return;
    const size_t per = xsize((size_t)c->T, c->s.RW, 1, sizeof(float));
    float *r = realloc(c->train_rows, xsize((size_t)n, per, 1, 1));
    if (!r) {
        fprintf(stderr, "fkvf-quality: out of memory\n");
        exit(1);
    }
    c->train_rows = r;
    int *tok = xmalloc((size_t)c->T * sizeof *tok);
    for (int i = c->n_train_rows; i < n; i++)
        sample_sequence(c->m, &c->s, c->T, c->seed * 1000003u + (uint64_t)i, tok,
                        c->train_rows + (size_t)i * (size_t)c->T * c->s.RW,
                        text_seq(c, c->train_off, c->train_end, i, "training"), NULL, NULL);
    free(tok);
    c->n_train_rows = n;
}

/* ---- metrics (issue 19 B; metric.h) ------------------------------------------ */

static const char *metric_name(int metric)
{
    static const char *const names[4] = {"", ", query-aware keys", ", output-aware values",
                                         ", query-aware keys, output-aware values"};
    return names[metric & 3];
}

typedef struct qacc {
    double *M;
    const shape *s;
} qacc;

static void add_queries(void *u, const lm_state *st, int pos)
{
    qacc *a = u;
    qm_add_queries(a->M, lm_queries(st), a->s->L, a->s->NH, a->s->H, a->s->D, pos);
}

/* Frees what ensure_metric allocated (nothing if it did not run). */
static void free_metrics(ctx *c)
{
    free(c->mk);
    free(c->mk_inv);
    free(c->mv);
    free(c->mv_inv);
    free(c->fk);
    free(c->fv);
}

/* f = qm_metric_matrix(S) rounded to float, its upper triangle mirrored so
 * that it is symmetric exactly (spec 13.8) */
static void file_metric(const double *S, int D, float *f)
{
    double *M = xmalloc((size_t)D * (size_t)D * sizeof *M);
    if (qm_metric_matrix(S, D, METRIC_EPS, M)) {
        fprintf(stderr, "fkvf-quality: a metric with no positive trace\n");
        exit(1);
    }
    for (int i = 0; i < D; i++)
        for (int j = i; j < D; j++)
            f[(size_t)i * (size_t)D + (size_t)j] = f[(size_t)j * (size_t)D + (size_t)i] =
                (float)M[(size_t)i * (size_t)D + (size_t)j];
    free(M);
}

/* The metrics (file_metric) as float32 .npy files of [L, H, D, D], what
 * fkvf train --key-metric / --value-metric take: DIR/key-metric.npy and
 * DIR/value-metric.npy. Returns 0 or 1 (a message said why). */
static int write_metrics(const ctx *c, const char *dir)
{
    const shape *s = &c->s;
    const size_t n = (size_t)s->L * (size_t)s->H * (size_t)s->D * (size_t)s->D;
    for (int kv = 0; kv < 2; kv++) {
        char path[4096], hdr[128];
        snprintf(path, sizeof path, "%s/%s-metric.npy", dir, kv ? "value" : "key");
        int hl = snprintf(hdr, sizeof hdr,
                          "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d, %d, %d), }",
                          s->L, s->H, s->D, s->D);
        /* magic, version 1.0, a u16 length, the dict padded with spaces and a
         * newline to a multiple of 64 bytes */
        int total = (10 + hl + 1 + 63) / 64 * 64, pad = total - 10 - hl - 1;
        FILE *f = fopen(path, "wb");
        if (!f) {
            fprintf(stderr, "fkvf-quality: %s: %s\n", path, strerror(errno));
            return 1;
        }
        unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                                 (unsigned char)((total - 10) & 0xFF),
                                 (unsigned char)((total - 10) >> 8)};
        fwrite(pre, 1, sizeof pre, f);
        fwrite(hdr, 1, (size_t)hl, f);
        for (int i = 0; i < pad; i++)
            fputc(' ', f);
        fputc('\n', f);
        const float *src = kv ? c->fv : c->fk;
        for (size_t i = 0; i < n; i++) { /* little-endian whatever the host */
            uint32_t u;
            memcpy(&u, &src[i], 4);
            unsigned char b[4] = {(unsigned char)u, (unsigned char)(u >> 8),
                                  (unsigned char)(u >> 16), (unsigned char)(u >> 24)};
            fwrite(b, 1, 4, f);
        }
        int bad = ferror(f) != 0;
        if (fclose(f) != 0 || bad) {
            fprintf(stderr, "fkvf-quality: %s: write failed\n", path);
            return 1;
        }
        printf("%s metric: %s\n", kv ? "value" : "key", path);
    }
    return 0;
}

/* The metric transforms, once: keys from the queries of the first
 * METRIC_SEQS training sequences (run with the exact cache), each KV head's
 * sum over its query heads, averaged over the offsets d = recent .. T - 1 -
 * sinks at which an archived key is read, weighted by how many (query, key)
 * pairs are d apart; values from W_o. */
static void ensure_metric(ctx *c)
{
    if (c->mk)
        return;
    const shape *s = &c->s;
    if (s->D > 256) { /* metric_row's scratch */
        fprintf(stderr, "fkvf-quality: the metric rows need a head size of at most 256\n");
        exit(2);
    }
    const size_t dd = (size_t)s->D * (size_t)s->D, n = (size_t)s->L * (size_t)s->H * dd;
    c->mk = xmalloc(n * sizeof(float));
    c->mk_inv = xmalloc(n * sizeof(float));
    c->mv = xmalloc(n * sizeof(float));
    c->mv_inv = xmalloc(n * sizeof(float));
    c->fk = xmalloc(n * sizeof(float));
    c->fv = xmalloc(n * sizeof(float));
    double *M = calloc(n, sizeof *M), *S = xmalloc(dd * (size_t)s->H * sizeof *S);
    if (!M) {
        fprintf(stderr, "fkvf-quality: out of memory\n");
        exit(1);
    }
    qacc a = {M, s};
    int *tok = xmalloc((size_t)c->T * sizeof *tok);
    for (int i = 0; i < METRIC_SEQS; i++)
        sample_sequence(c->m, s, c->T, c->seed * 1000003u + (uint64_t)i, tok, NULL,
                        text_seq(c, c->train_off, c->train_end, i, "training"), add_queries, &a);
    free(tok);
    const int d0 = c->recent, n_pairs = c->T - c->sinks, d1 = n_pairs - 1;
    for (int l = 0; l < s->L; l++) {
        qm_output_metric(lm_wo(c->m, l), s->NH, s->H, s->D, S);
        for (int h = 0; h < s->H; h++) {
            const size_t o = ((size_t)l * (size_t)s->H + (size_t)h) * dd;
            if (qm_transform(S + (size_t)h * dd, s->D, METRIC_EPS, c->mv + o, c->mv_inv + o)) {
                fprintf(stderr, "fkvf-quality: the output metric of layer %d head %d failed\n",
                        l, h);
                exit(1);
            }
            file_metric(S + (size_t)h * dd, s->D, c->fv + o);
        }
        for (int h = 0; h < s->H; h++) {
            const size_t o = ((size_t)l * (size_t)s->H + (size_t)h) * dd;
            if (d0 <= d1)
                qm_rotation_average(M + o, s->D, d0, d1, n_pairs, S);
            else
                memcpy(S, M + o, dd * sizeof *S);
            if (qm_transform(S, s->D, METRIC_EPS, c->mk + o, c->mk_inv + o)) {
                fprintf(stderr, "fkvf-quality: the query metric of layer %d head %d failed\n",
                        l, h);
                exit(1);
            }
            file_metric(S, s->D, c->fk + o);
        }
    }
    free(M);
    free(S);
}

/* One row (spec 14.2 layout, keys after RoPE) into the space a metric
 * codebook quantizes (inverse = 0): keys un-rotated at pos then times A_k,
 * values times A_v, for the parts the metric covers; or back (inverse = 1):
 * keys times A_k^-1 then rotated at pos, values times A_v^-1. */
static void metric_row(const ctx *c, int metric, const float *in, int pos, float *out,
                       int inverse)
{
    const shape *s = &c->s;
    const size_t dd = (size_t)s->D * (size_t)s->D;
    float t[256];
    memcpy(out, in, s->RW * sizeof(float));
    for (int l = 0; l < s->L; l++)
        for (int h = 0; h < s->H; h++) {
            const size_t m = ((size_t)l * (size_t)s->H + (size_t)h) * dd;
            float *k = out + (size_t)l * 2 * s->HD + (size_t)h * (size_t)s->D;
            float *v = k + s->HD;
            if (metric & METRIC_KEYS) {
                if (!inverse) {
                    lm_rope(k, 1, s->D, pos, 1);
                    qm_apply(c->mk + m, s->D, k, t);
                    memcpy(k, t, (size_t)s->D * sizeof(float));
                } else {
                    qm_apply(c->mk_inv + m, s->D, k, t);
                    memcpy(k, t, (size_t)s->D * sizeof(float));
                    lm_rope(k, 1, s->D, pos, 0);
                }
            }
            if (metric & METRIC_VALUES) {
                qm_apply((inverse ? c->mv_inv : c->mv) + m, s->D, v, t);
                memcpy(v, t, (size_t)s->D * sizeof(float));
            }
        }
}

/* Bits of an index of codebook b: log2(k) (k a power of two). */
static int cb_bits(const cbspec *b)
{
    int bits = 0;
    for (uint32_t k = b->k; k > 1; k >>= 1)
        bits++;
    return bits;
}

/* Bytes per archived position of one stage of one part across a layer's KV
 * heads: H indices of log2(k) bits. */
static double stage_bytes(const ctx *c, const cbspec *b)
{
    return (double)c->s.H * cb_bits(b) / 8.0;
}

static void cb_shape(const ctx *c, const cbspec *b, fkvf_codebook_shape *sh)
{
    memset(sh, 0, sizeof *sh);
    sh->n_layers = (uint32_t)c->s.L;
    sh->n_heads = b->pooled ? 1u : (uint32_t)c->s.H;
    sh->key_dim = sh->value_dim = (uint32_t)c->s.D;
    sh->k = b->k;
    sh->k_stages = (uint8_t)b->ks;
    sh->v_stages = (uint8_t)b->vs;
    sh->dtype = FKVF_DTYPE_F16;
    sh->pooled = (uint8_t)b->pooled;
}

static void cb_path(const ctx *c, const cbspec *b, char *buf, size_t n)
{
    char src[64] = "", met[64] = "";
    if (c->text)
        snprintf(src, sizeof src, "-text%zu", c->train_off);
    if (b->metric) /* the key metric depends on the window */
        snprintf(met, sizeof met, "-metric%d-w%d+%d-e%g%s", b->metric, c->sinks, c->recent,
                 METRIC_EPS, c->native ? "-native" : "");
    snprintf(buf, n, "%s/cb-L%dH%dD%d-k%u-%s-%s-K%dV%d-n%d-T%d-i%u-s%llu%s%s.tables",
             c->cache_dir, c->s.L, c->s.H, c->s.D, b->k, b->pooled ? "pooled" : "head",
             b->pre_rope ? "prerope" : "asis", b->ks, b->vs, b->train, c->T, b->iters,
             (unsigned long long)c->seed, src, met);
}

/* The RoPE the library applies for codebook b: the model's for pre-RoPE keys,
 * unless the metric already un-rotates them (metric_row; not with
 * --metric-native, where the library does). */
static const fkvf_rope *cb_rope(const ctx *c, const cbspec *b)
{
    return b->pre_rope && (!(b->metric & METRIC_KEYS) || c->native) ? &c->rope : NULL;
}

/* The metric as the library takes it (--metric-native): the parts of b's. */
static fkvf_rvq_metric cb_native_metric(const ctx *c, const cbspec *b)
{
    fkvf_rvq_metric m = {(b->metric & METRIC_KEYS) ? c->fk : NULL,
                         (b->metric & METRIC_VALUES) ? c->fv : NULL};
    return m;
}

static fkvf_rvq *cb_get(ctx *c, cbspec *b)
{
    if (b->metric)
        ensure_metric(c); /* needed to encode, also with loaded tables */
    if (b->q)
        return b->q;
    char path[1024];
    if (c->cache_dir) {
        cb_path(c, b, path, sizeof path);
        FILE *f = fopen(path, "rb");
        if (f) {
            fkvf_codebook_shape sh;
            cb_shape(c, b, &sh);
            const uint64_t want = fkvf_codebook_size(&sh) - 64;
            void *buf = xmalloc((size_t)want);
            const size_t got = fread(buf, 1, (size_t)want, f);
            fclose(f);
            fkvf_rvq_metric nm = cb_native_metric(c, b);
            if (got == want &&
                fkvf_rvq_from_tables(&b->q, &sh, (uint32_t)c->s.H, buf, (size_t)want, NULL) ==
                    FKVF_OK &&
                (!c->native || !b->metric || fkvf_rvq_set_metric(b->q, &nm) == FKVF_OK)) {
                free(buf);
                b->loaded = 1;
                fprintf(stderr, "fkvf-quality: loaded %s\n", path);
                return b->q;
            }
            free(buf);
            b->q = NULL;
        }
    }
    ensure_train(c, b->train);
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = (uint32_t)c->s.L;
    p.n_kv_heads = (uint32_t)c->s.H;
    p.key_dim = p.value_dim = (uint32_t)c->s.D;
    p.k = b->k;
    p.k_stages = (uint8_t)b->ks;
    p.v_stages = (uint8_t)b->vs;
    p.pooled = (uint8_t)b->pooled;
    p.table_dtype = FKVF_DTYPE_F16;
    p.seed = c->seed;
    p.max_iters = b->iters;
    p.key_rope = cb_rope(c, b);
    /* a metric codebook trains on the rows mapped into its space, or
     * (--metric-native) under the library's metric on the rows as they are */
    float *mrows = NULL;
    fkvf_rvq_metric nm = cb_native_metric(c, b);
    if (b->metric && c->native)
        p.metric = &nm;
    if (b->metric && !c->native) {
        const size_t per = (size_t)c->T * c->s.RW;
        mrows = xmalloc(xsize((size_t)b->train, per, 1, sizeof(float)));
        for (int i = 0; i < b->train; i++)
            for (int pos = 0; pos < c->T; pos++)
                metric_row(c, b->metric, c->train_rows + (size_t)i * per + (size_t)pos * c->s.RW,
                           pos, mrows + (size_t)i * per + (size_t)pos * c->s.RW, 0);
    }
    fkvf_rows *blocks = xmalloc((size_t)b->train * sizeof *blocks);
    for (int i = 0; i < b->train; i++) {
        blocks[i].data = (mrows ? mrows : c->train_rows) + (size_t)i * (size_t)c->T * c->s.RW;
        blocks[i].n_rows = (size_t)c->T;
        blocks[i].dtype = FKVF_DTYPE_F32;
        blocks[i].first_position = 0;
    }
    fprintf(stderr, "fkvf-quality: training k=%u %s %s K x%d V x%d on %d x %d positions...\n",
            b->k, b->pooled ? "pooled" : "per-head", b->pre_rope ? "pre-RoPE" : "as-is", b->ks,
            b->vs, b->train, c->T);
    const double t0 = now();
    int rc = fkvf_rvq_train(&b->q, &p, blocks, (size_t)b->train, NULL);
    b->secs = now() - t0;
    free(blocks);
    free(mrows);
    if (rc != FKVF_OK) {
        fprintf(stderr, "fkvf-quality: fkvf_rvq_train: %s\n", fkvf_strerror(rc));
        exit(1);
    }
    fprintf(stderr, "fkvf-quality: trained in %.1f s\n", b->secs);
    if (c->cache_dir) {
        const size_t n = fkvf_rvq_tables_size(b->q);
        void *buf = xmalloc(n);
        FILE *f = NULL;
        if (fkvf_rvq_tables(b->q, buf, n) == FKVF_OK && (f = fopen(path, "wb")) != NULL) {
            if (fwrite(buf, 1, n, f) != n)
                fprintf(stderr, "fkvf-quality: %s: short write\n", path);
            fclose(f);
        }
        free(buf);
    }
    return b->q;
}

/* ---- configurations -------------------------------------------------------- */

enum { C_EXACT, C_RVQ, C_SCALAR };

typedef struct config {
    const char *name;
    int kind;
    int cb;          /* C_RVQ: index into the codebook specs */
    int ks, vs;      /* C_RVQ: stages used (0 = that part stays exact) */
    int scheme, bits; /* C_SCALAR */
    unsigned parts;  /* archived parts: 1 keys, 2 values, 3 both */
    unsigned beam;   /* C_RVQ: fkvf_rvq_encode beam width (0: greedy, the appender's default) */
} config;

/* Per-layer stage counts (issue 19 B.5): layer l's keys use k[l] stages and
 * its values v[l] (0: that part of the layer stays exact). */
#define MAX_ALLOC_LAYERS 16
typedef struct alloc {
    unsigned char k[MAX_ALLOC_LAYERS], v[MAX_ALLOC_LAYERS];
} alloc;

typedef struct result {
    double bytes;
    double sum_all, sum_late; /* summed NLL: all predictions; steps >= sinks + recent */
    double n_all, n_late;
    double sq_diff, sum_diff; /* per-sequence mean NLL difference vs exact */
    double secs;
} result;

/* Overwrite layer l of position p: keys (parts & 1) and values (parts & 2)
 * from row (a whole row, spec 14.2 layout). */
static void scatter_layer(const shape *s, lm_state *st, int p, const float *row, int l,
                          unsigned parts)
{
    const float *r = row + (size_t)l * 2 * s->HD;
    if (parts & 1u)
        lm_cache_set(st, l, p, LM_KEY, r);
    if (parts & 2u)
        lm_cache_set(st, l, p, LM_VALUE, r + s->HD);
}

/* Encode row x (in the codebook's space) with q and decode it into out, back
 * in the cache's space (mtmp: a row of scratch for a metric codebook). */
static void rvq_roundtrip(ctx *c, fkvf_rvq *q, const fkvf_rope *rope, int metric, unsigned beam,
                          const float *x, int a, uint16_t *codes, float *out, float *mtmp)
{
    const shape *s = &c->s;
    const size_t cpp = fkvf_rvq_codes_per_position(q);
    fkvf_rows r = {x, 1, FKVF_DTYPE_F32, (uint64_t)a};
    int e = fkvf_rvq_encode(q, &r, rope, beam, codes, cpp, 1);
    if (e == FKVF_OK)
        e = fkvf_rvq_decode(q, codes, cpp, 1, 1, (uint64_t)a, rope, FKVF_DTYPE_F32, out,
                            s->RW * sizeof(float));
    if (e != FKVF_OK) {
        fprintf(stderr, "fkvf-quality: RVQ encode/decode: %s\n", fkvf_strerror(e));
        exit(1);
    }
    if (metric && !c->native) {
        metric_row(c, metric, out, a, mtmp, 1);
        memcpy(out, mtmp, s->RW * sizeof(float));
    }
}

/* One configuration over all evaluation sequences. rec/ex_out (both or
 * neither): rows of evaluation sequence 0 as reconstructed / as computed.
 * With al (per-layer stage counts), lq[l] is layer l's quantizer (NULL: the
 * layer stays exact) and q is unused. */
static void run_config(ctx *c, const config *cf, fkvf_rvq *q, const fkvf_rope *rope, int metric,
                       const alloc *al, fkvf_rvq *const *lq, result *res, float *rec_out,
                       float *ex_out)
{
    const shape *s = &c->s;
    const int T = c->T;
    float *ex = xmalloc(xsize((size_t)T, s->RW, 1, sizeof(float)));
    float *rc = xmalloc(xsize(1, s->RW, 1, sizeof(float)));
    float *mrow = xmalloc(xsize(1, s->RW, 1, sizeof(float)));
    float *mtmp = xmalloc(xsize(1, s->RW, 1, sizeof(float)));
    size_t cpp = q ? fkvf_rvq_codes_per_position(q) : 0;
    for (int l = 0; al && l < s->L; l++)
        if (lq[l] && fkvf_rvq_codes_per_position(lq[l]) > cpp)
            cpp = fkvf_rvq_codes_per_position(lq[l]);
    uint16_t *codes = xmalloc((cpp ? cpp : 1) * sizeof *codes);
    lm_state *st = lm_state_new(c->m, T);
    if (!st) {
        fprintf(stderr, "fkvf-quality: lm_state_new failed\n");
        exit(1);
    }
    memset(res, 0, sizeof *res);
    const double t0 = now();
    const int first_late = c->sinks + c->recent;
    const int kivi_keys = cf->kind == C_SCALAR && cf->scheme == SC_KIVI && (cf->parts & 1u);
    for (int i = 0; i < c->S; i++) {
        const int *tok = c->ev_tokens + (size_t)i * (size_t)T;
        /* what is quantized: this run's own rows, or (--from-exact) the exact run's */
        const float *src = c->ev_rows ? c->ev_rows + (size_t)i * (size_t)T * s->RW : ex;
        double sum = 0, late = 0;
        for (int p = 0; p < T; p++) {
            const int a = p - c->recent; /* leaves the window now */
            if (cf->kind != C_EXACT && a >= c->sinks) {
                if (cf->kind == C_RVQ) {
                    const float *x = src + (size_t)a * s->RW;
                    if (metric && !c->native) { /* into the metric's space (rvq_roundtrip
                                                 * maps back) */
                        metric_row(c, metric, x, a, mrow, 0);
                        x = mrow;
                    }
                    if (!al) {
                        rvq_roundtrip(c, q, rope, metric, cf->beam, x, a, codes, rc, mtmp);
                        scatter_row(s, st, a, rc, cf->parts);
                    }
                    /* per layer: one round trip a distinct quantizer, its layers' parts */
                    for (int l = 0; al && l < s->L; l++) {
                        int seen = !lq[l];
                        for (int j = 0; j < l && !seen; j++)
                            seen = lq[j] == lq[l];
                        if (seen)
                            continue;
                        rvq_roundtrip(c, lq[l], rope, metric, cf->beam, x, a, codes, rc, mtmp);
                        for (int m = l; m < s->L; m++)
                            if (lq[m] == lq[l])
                                scatter_layer(s, st, a, rc, m,
                                              (al->k[m] ? 1u : 0u) | (al->v[m] ? 2u : 0u));
                    }
                } else if (!kivi_keys) {
                    scalar_row(s, src, T, p, a, cf->scheme, cf->bits, cf->parts, rc);
                    scatter_row(s, st, a, rc, cf->parts);
                } else if (cf->parts & 2u) {
                    scalar_row(s, src, T, p, a, cf->scheme, cf->bits, 2u, rc);
                    scatter_row(s, st, a, rc, 2u);
                }
                if (rec_out && i == 0) {
                    /* what the cache holds for a now */
                    gather_row(s, st, a, rec_out + (size_t)a * s->RW);
                }
            }
            /* KIVI keys: those whose group is complete and that have left the
             * window (kivi_key_step; at most a group plus one position a step) */
            for (int b = p - KIVI_GROUP - c->recent; kivi_keys && b < p; b++) {
                if (b < c->sinks || kivi_key_step(b, c->recent) != p)
                    continue;
                scalar_row(s, src, T, p, b, cf->scheme, cf->bits, 1u, rc);
                scatter_row(s, st, b, rc, 1u);
                if (rec_out && i == 0)
                    gather_row(s, st, b, rec_out + (size_t)b * s->RW);
            }
            const float *logits = lm_forward(st, tok[p], p);
            if (!logits) {
                fprintf(stderr, "fkvf-quality: lm_forward failed\n");
                exit(1);
            }
            gather_row(s, st, p, ex + (size_t)p * s->RW);
            if (p + 1 < T) {
                const double e = lm_nll(logits, s->V, tok[p + 1]);
                sum += e;
                if (p >= first_late) {
                    late += e;
                    res->n_late += 1;
                }
                res->n_all += 1;
            }
        }
        if (ex_out && i == 0) {
            memcpy(ex_out, ex, (size_t)T * s->RW * sizeof(float));
            for (int p = 0; p < T; p++)
                if (p < c->sinks || p > T - 1 - c->recent)
                    memcpy(rec_out + (size_t)p * s->RW, ex + (size_t)p * s->RW,
                           s->RW * sizeof(float));
        }
        res->sum_all += sum;
        res->sum_late += late;
        const double d = (sum - c->ev_exact[i]) / (double)(T - 1);
        res->sum_diff += d;
        res->sq_diff += d * d;
    }
    res->secs = now() - t0;
    lm_state_free(st);
    free(ex);
    free(rc);
    free(mrow);
    free(mtmp);
    free(codes);
}

/* ---- the appender check ------------------------------------------------------ */

/* Write evaluation sequence 0's computed rows (ex) through fkvf_appender with
 * codebook q, restore every position with fkvf_reader_restore and compare
 * with what the study's cache held (rec) bit for bit. Returns 0 if equal. */
static int verify_archive(const ctx *c, const fkvf_rvq *q, int pre_rope, const float *ex,
                          const float *rec, const char *what)
{
    const shape *s = &c->s;
    char dir[] = "/tmp/fkvf-quality-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "fkvf-quality: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    char path[64];
    snprintf(path, sizeof path, "%s/seq0.fkvf", dir);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = (uint32_t)s->L;
    d.n_kv_heads = (uint32_t)s->H;
    d.key_dim = d.value_dim = (uint32_t)s->D;
    d.dtype = FKVF_DTYPE_F32;
    d.key_transform = 1;
    d.rope_layout = 1;
    d.key_storage = (uint8_t)pre_rope;
    d.rope_dims = (uint32_t)s->D;
    d.rope_theta = LM_ROPE_THETA;
    d.n_sinks = (uint32_t)c->sinks;
    d.window = (uint32_t)c->recent;
    fkvf_append_create cr;
    memset(&cr, 0, sizeof cr);
    cr.desc = &d;
    cr.codebook = q;
    fkvf_append_options ao;
    fkvf_append_options_init(&ao);
    ao.sync = FKVF_SYNC_NONE;
    fkvf_appender *a = NULL;
    fkvf_reader *r = NULL;
    const size_t rowb = s->RW * sizeof(float);
    float *got = xmalloc(xsize((size_t)c->T, rowb, 1, 1));
    int ok = -1;
    int e = fkvf_appender_create(&a, path, &cr, &ao, NULL);
    /* one position per append, a commit every 16, as an engine would */
    for (int p = 0; e == FKVF_OK && p < c->T; p++) {
        e = fkvf_appender_append(a, ex + (size_t)p * s->RW, rowb, 1, NULL);
        if (e == FKVF_OK && ((p + 1) % 16 == 0 || p + 1 == c->T))
            e = fkvf_appender_commit(a);
    }
    if (e != FKVF_OK) {
        fprintf(stderr, "fkvf-quality: appender: %s\n",
                a ? fkvf_appender_message(a) : fkvf_strerror(e));
        goto out;
    }
    fkvf_appender_free(a);
    a = NULL;
    if ((e = fkvf_reader_open_file(&r, path, 0, NULL)) != FKVF_OK ||
        (e = fkvf_reader_restore(r, 0, (uint64_t)c->T, FKVF_DTYPE_F32, got,
                                 (size_t)c->T * rowb)) != FKVF_OK) {
        fprintf(stderr, "fkvf-quality: reader: %s\n",
                r ? fkvf_reader_message(r) : fkvf_strerror(e));
        goto out;
    }
    int bad = 0, first_bad = -1;
    for (int p = 0; p < c->T; p++)
        if (memcmp(got + (size_t)p * s->RW, rec + (size_t)p * s->RW, rowb)) {
            bad++;
            if (first_bad < 0)
                first_bad = p;
        }
    printf("verify (%s): archive written by fkvf_appender (f32 rows, %d sinks, window %d, "
           "codebook embedded) and restored by fkvf_reader_restore vs the study's cache, "
           "evaluation sequence 0, %d positions (%d archived): %s",
           what, c->sinks, c->recent, c->T, c->T - c->sinks - c->recent,
           bad ? "DIFFERENT" : "identical bit for bit");
    if (bad)
        printf(" (%d positions differ, first %d)", bad, first_bad);
    printf("\n");
    ok = bad ? -1 : 0;
out:
    fkvf_appender_free(a);
    fkvf_reader_free(r);
    free(got);
    unlink(path);
    rmdir(dir);
    return ok;
}

/* ---- main ------------------------------------------------------------------ */


enum { SET_EXACT, SET_SMOKE, SET_MAIN, SET_FULL, SET_METRIC };

/* codebook specs (index constants used by the configuration table) */
enum {
    CB256_ASIS,   /* per-head k=256 keys as-is, K x4 V x2 */
    CB256_PRE,    /* per-head k=256 pre-RoPE, K x8 V x4 */
    CB256P_ASIS,  /* pooled k=256 as-is, K x4 V x2 */
    CB256P_PRE,   /* pooled k=256 pre-RoPE, K x4 V x2 */
    CB1024_ASIS,  /* per-head k=1024 as-is, K x4 V x2 */
    CB1024_PRE,   /* per-head k=1024 pre-RoPE, K x8 V x4 */
    CB4096_PRE,   /* per-head k=4096 pre-RoPE, K x8 V x4 */
    CB256_PRE16,  /* per-head k=256 pre-RoPE, K x4 V x2, 16 training sequences */
    CB256_QK,     /* per-head k=256 pre-RoPE, K x8 V x4, query-aware keys */
    CB256_OV,     /* the same, output-aware values */
    CB256_QKOV,   /* the same, both */
    CB_COUNT
};

#define RVQB(n, cb, k, v, b) {n, C_RVQ, cb, k, v, 0, 0, ((k) ? 1u : 0u) | ((v) ? 2u : 0u), b}
#define RVQ(n, cb, k, v) RVQB(n, cb, k, v, 0)
#define SCAL(n, sc, b, parts) {n, C_SCALAR, 0, 0, 0, sc, b, parts, 0}

static const config CONFIGS[] = {
    {"exact cache", C_EXACT, 0, 0, 0, 0, 0, 0, 0},
    RVQ("RVQ per-head k=256 K x1 V x1, keys as-is", CB256_ASIS, 1, 1),
    RVQ("RVQ per-head k=256 K x1 V x2, keys as-is", CB256_ASIS, 1, 2),
    RVQ("RVQ per-head k=256 K x2 V x1, keys as-is", CB256_ASIS, 2, 1),
    RVQ("RVQ per-head k=256 K x2 V x2, keys as-is", CB256_ASIS, 2, 2),
    RVQ("RVQ per-head k=256 K x4 V x1, keys as-is", CB256_ASIS, 4, 1),
    RVQ("RVQ per-head k=256 K x4 V x2, keys as-is", CB256_ASIS, 4, 2),
    RVQ("RVQ per-head k=256 K x1 V x1, keys pre-RoPE", CB256_PRE, 1, 1),
    RVQ("RVQ per-head k=256 K x1 V x2, keys pre-RoPE", CB256_PRE, 1, 2),
    RVQ("RVQ per-head k=256 K x2 V x1, keys pre-RoPE", CB256_PRE, 2, 1),
    RVQ("RVQ per-head k=256 K x2 V x2, keys pre-RoPE", CB256_PRE, 2, 2),
    RVQ("RVQ per-head k=256 K x4 V x1, keys pre-RoPE", CB256_PRE, 4, 1),
    RVQ("RVQ per-head k=256 K x4 V x2, keys pre-RoPE", CB256_PRE, 4, 2),
    RVQ("RVQ per-head k=256 K x4 V x4, keys pre-RoPE", CB256_PRE, 4, 4),
    RVQ("RVQ per-head k=256 K x1 V x4, keys pre-RoPE", CB256_PRE, 1, 4),
    RVQ("RVQ per-head k=256 K x2 V x4, keys pre-RoPE", CB256_PRE, 2, 4),
    RVQ("RVQ per-head k=256 K x8 V x1, keys pre-RoPE", CB256_PRE, 8, 1),
    RVQ("RVQ per-head k=256 K x6 V x4, keys pre-RoPE", CB256_PRE, 6, 4),
    RVQ("RVQ per-head k=256 K x8 V x4, keys pre-RoPE", CB256_PRE, 8, 4),
    RVQ("RVQ per-head k=256 K x6 V x2, keys pre-RoPE", CB256_PRE, 6, 2),
    RVQ("RVQ per-head k=256 K x5 V x3, keys pre-RoPE", CB256_PRE, 5, 3),
    RVQ("RVQ per-head k=256 K x8 V x2, keys pre-RoPE", CB256_PRE, 8, 2),
    RVQ("RVQ per-head k=256 K x7 V x3, keys pre-RoPE", CB256_PRE, 7, 3),
    RVQB("RVQ per-head k=256 K x4 V x2, keys pre-RoPE, beam 8", CB256_PRE, 4, 2, 8),
    RVQB("RVQ per-head k=256 K x6 V x4, keys pre-RoPE, beam 8", CB256_PRE, 6, 4, 8),
    /* the key/value asymmetry: one part archived, the other exact */
    RVQ("keys only: RVQ per-head k=256 K x1, keys as-is", CB256_ASIS, 1, 0),
    RVQ("keys only: RVQ per-head k=256 K x2, keys as-is", CB256_ASIS, 2, 0),
    RVQ("keys only: RVQ per-head k=256 K x4, keys as-is", CB256_ASIS, 4, 0),
    RVQ("keys only: RVQ per-head k=256 K x1, keys pre-RoPE", CB256_PRE, 1, 0),
    RVQ("keys only: RVQ per-head k=256 K x2, keys pre-RoPE", CB256_PRE, 2, 0),
    RVQ("keys only: RVQ per-head k=256 K x4, keys pre-RoPE", CB256_PRE, 4, 0),
    RVQ("keys only: RVQ per-head k=256 K x8, keys pre-RoPE", CB256_PRE, 8, 0),
    RVQ("values only: RVQ per-head k=256 V x1", CB256_PRE, 0, 1),
    RVQ("values only: RVQ per-head k=256 V x2", CB256_PRE, 0, 2),
    RVQ("values only: RVQ per-head k=256 V x4", CB256_PRE, 0, 4),
    /* pooled: one table set per layer shared by its 4 KV heads */
    RVQ("RVQ pooled k=256 K x2 V x2, keys as-is", CB256P_ASIS, 2, 2),
    RVQ("RVQ pooled k=256 K x4 V x2, keys as-is", CB256P_ASIS, 4, 2),
    RVQ("RVQ pooled k=256 K x2 V x2, keys pre-RoPE", CB256P_PRE, 2, 2),
    RVQ("RVQ pooled k=256 K x4 V x2, keys pre-RoPE", CB256P_PRE, 4, 2),
    /* larger k */
    RVQ("RVQ per-head k=1024 K x2 V x2, keys as-is", CB1024_ASIS, 2, 2),
    RVQ("RVQ per-head k=1024 K x4 V x2, keys as-is", CB1024_ASIS, 4, 2),
    RVQ("RVQ per-head k=1024 K x1 V x1, keys pre-RoPE", CB1024_PRE, 1, 1),
    RVQ("RVQ per-head k=1024 K x1 V x2, keys pre-RoPE", CB1024_PRE, 1, 2),
    RVQ("RVQ per-head k=1024 K x1 V x4, keys pre-RoPE", CB1024_PRE, 1, 4),
    RVQ("RVQ per-head k=1024 K x2 V x1, keys pre-RoPE", CB1024_PRE, 2, 1),
    RVQ("RVQ per-head k=1024 K x2 V x2, keys pre-RoPE", CB1024_PRE, 2, 2),
    RVQ("RVQ per-head k=1024 K x2 V x4, keys pre-RoPE", CB1024_PRE, 2, 4),
    RVQ("RVQ per-head k=1024 K x4 V x1, keys pre-RoPE", CB1024_PRE, 4, 1),
    RVQ("RVQ per-head k=1024 K x4 V x2, keys pre-RoPE", CB1024_PRE, 4, 2),
    RVQ("RVQ per-head k=1024 K x4 V x4, keys pre-RoPE", CB1024_PRE, 4, 4),
    RVQ("RVQ per-head k=1024 K x8 V x1, keys pre-RoPE", CB1024_PRE, 8, 1),
    RVQ("RVQ per-head k=1024 K x8 V x2, keys pre-RoPE", CB1024_PRE, 8, 2),
    RVQ("RVQ per-head k=1024 K x8 V x4, keys pre-RoPE", CB1024_PRE, 8, 4),
    RVQ("keys only: RVQ per-head k=1024 K x4, keys pre-RoPE", CB1024_PRE, 4, 0),
    RVQ("values only: RVQ per-head k=1024 V x2", CB1024_PRE, 0, 2),
    RVQ("RVQ per-head k=256 K x4 V x2, keys pre-RoPE, codebooks from 16 sequences",
        CB256_PRE16, 4, 2),
    RVQ("RVQ per-head k=4096 K x1 V x1, keys pre-RoPE", CB4096_PRE, 1, 1),
    RVQ("RVQ per-head k=4096 K x1 V x2, keys pre-RoPE", CB4096_PRE, 1, 2),
    RVQ("RVQ per-head k=4096 K x1 V x4, keys pre-RoPE", CB4096_PRE, 1, 4),
    RVQ("RVQ per-head k=4096 K x2 V x1, keys pre-RoPE", CB4096_PRE, 2, 1),
    RVQ("RVQ per-head k=4096 K x2 V x2, keys pre-RoPE", CB4096_PRE, 2, 2),
    RVQ("RVQ per-head k=4096 K x2 V x4, keys pre-RoPE", CB4096_PRE, 2, 4),
    RVQ("RVQ per-head k=4096 K x4 V x1, keys pre-RoPE", CB4096_PRE, 4, 1),
    RVQ("RVQ per-head k=4096 K x4 V x2, keys pre-RoPE", CB4096_PRE, 4, 2),
    RVQ("RVQ per-head k=4096 K x4 V x4, keys pre-RoPE", CB4096_PRE, 4, 4),
    RVQ("RVQ per-head k=4096 K x8 V x1, keys pre-RoPE", CB4096_PRE, 8, 1),
    RVQ("RVQ per-head k=4096 K x8 V x2, keys pre-RoPE", CB4096_PRE, 8, 2),
    RVQ("RVQ per-head k=4096 K x8 V x4, keys pre-RoPE", CB4096_PRE, 8, 4),
    /* issue 19 B: codebooks trained and indices chosen under the query metric
     * (keys) and the output metric (values); decoded as plain RVQ */
    RVQ("query-aware keys: RVQ per-head k=256 K x2 V x2, keys pre-RoPE", CB256_QK, 2, 2),
    RVQ("query-aware keys: RVQ per-head k=256 K x4 V x2, keys pre-RoPE", CB256_QK, 4, 2),
    RVQ("keys only, query-aware: RVQ per-head k=256 K x1, keys pre-RoPE", CB256_QK, 1, 0),
    RVQ("keys only, query-aware: RVQ per-head k=256 K x2, keys pre-RoPE", CB256_QK, 2, 0),
    RVQ("keys only, query-aware: RVQ per-head k=256 K x4, keys pre-RoPE", CB256_QK, 4, 0),
    RVQ("output-aware values: RVQ per-head k=256 K x4 V x2, keys pre-RoPE", CB256_OV, 4, 2),
    RVQ("values only, output-aware: RVQ per-head k=256 V x1", CB256_OV, 0, 1),
    RVQ("values only, output-aware: RVQ per-head k=256 V x2", CB256_OV, 0, 2),
    RVQ("values only, output-aware: RVQ per-head k=256 V x4", CB256_OV, 0, 4),
    RVQ("query- and output-aware: RVQ per-head k=256 K x1 V x1, keys pre-RoPE", CB256_QKOV, 1, 1),
    RVQ("query- and output-aware: RVQ per-head k=256 K x2 V x2, keys pre-RoPE", CB256_QKOV, 2, 2),
    RVQ("query- and output-aware: RVQ per-head k=256 K x4 V x2, keys pre-RoPE", CB256_QKOV, 4, 2),
    RVQ("query- and output-aware: RVQ per-head k=256 K x4 V x4, keys pre-RoPE", CB256_QKOV, 4, 4),
    RVQ("query- and output-aware: RVQ per-head k=256 K x8 V x4, keys pre-RoPE", CB256_QKOV, 8, 4),
    /* scalar peers */
    SCAL("int8 per token, asymmetric, group 32 (f16 scale+zero)", SC_TOKEN_G32, 8, 3u),
    SCAL("int4 per token-head, symmetric (f16 scale per head vector)", SC_HEAD_SYM, 4, 3u),
    SCAL("int8 per token-head, asymmetric (f16 scale+zero per head vector)", SC_HEAD_ASYM, 8, 3u),
    SCAL("int4 per token-head, asymmetric (f16 scale+zero per head vector)", SC_HEAD_ASYM, 4, 3u),
    SCAL("int2 per token-head, asymmetric (f16 scale+zero per head vector)", SC_HEAD_ASYM, 2, 3u),
    SCAL("int4 per token, asymmetric, group 32 (f16 scale+zero)", SC_TOKEN_G32, 4, 3u),
    SCAL("int2 per token, asymmetric, group 32 (f16 scale+zero)", SC_TOKEN_G32, 2, 3u),
    SCAL("KIVI-2: K per channel over 32 positions, V per token group 32 (f16 scale+zero)",
         SC_KIVI, 2, 3u),
    SCAL("keys only: int4 per token, group 32", SC_TOKEN_G32, 4, 1u),
    SCAL("values only: int4 per token, group 32", SC_TOKEN_G32, 4, 2u),
    SCAL("keys only: int2 per token, group 32", SC_TOKEN_G32, 2, 1u),
    SCAL("values only: int2 per token, group 32", SC_TOKEN_G32, 2, 2u),
    SCAL("keys only: KIVI-2 keys (per channel over 32 positions)", SC_KIVI, 2, 1u),
};
#define N_CONFIGS (sizeof CONFIGS / sizeof CONFIGS[0])

/* The header of a results table. */
static void print_header(const ctx *c)
{
    if (c->native)
        printf("(metric rows: the library's encoder metric, --metric-native)\n\n");
    printf("| configuration | bytes/archived pos | vs fp16 | mean NLL | perplexity | delta | "
           "delta, steps >= %d | dNLL +- s.e. |\n|---|---|---|---|---|---|---|---|\n",
           c->sinks + c->recent);
    fflush(stdout);
}

/* One table row: name, bytes per archived position (0: the exact cache), the
 * result against the exact cache's mean NLL over all and late predictions;
 * returns the dNLL mean (s.e. into *se_out if not NULL). */
static double print_row(const ctx *c, const char *name, double bytes, double fp16,
                        const result *r, double exact_all, double exact_late, double *se_out)
{
    const double mean = r->sum_all / r->n_all, late = r->sum_late / r->n_late;
    const double dmean = r->sum_diff / c->S;
    const double var = c->S > 1 ? (r->sq_diff - c->S * dmean * dmean) / (c->S - 1) : 0;
    const double se = sqrt(var > 0 ? var : 0) / sqrt((double)c->S);
    char bb[32], ratio[32];
    if (bytes == 0) {
        snprintf(bb, sizeof bb, "%.0f (fp16)", fp16);
        snprintf(ratio, sizeof ratio, "1x");
    } else {
        snprintf(bb, sizeof bb, "%.1f", bytes);
        snprintf(ratio, sizeof ratio, "%.2fx", fp16 / bytes);
    }
    printf("| %s | %s | %s | %.4f | %.3f | %+.1f%% | %+.1f%% | %+.4f +- %.4f |\n", name, bb,
           ratio, mean, exp(mean), 100.0 * (exp(mean - exact_all) - 1.0),
           100.0 * (exp(late - exact_late) - 1.0), dmean, se);
    fflush(stdout);
    if (se_out)
        *se_out = se;
    return dmean;
}

/* The composition check (the paper's referee): does archiving keys and values
 * together cost what keys alone and values alone cost, i.e. is the
 * perplexity ratio of K xa V xb the product of those of keys only K xa and
 * values only V xb (dNLL additive)? One line per RVQ row archiving both
 * parts whose keys-only and values-only rows (same codebook) ran. The s.e. of
 * the sum treats the two rows as independent (they share the evaluation
 * sequences, so it is an approximation). */
static void print_composition(const int *ran, const double *d_mean, const double *d_se)
{
    int header = 0;
    for (size_t i = 0; i < N_CONFIGS; i++) {
        const config *b = &CONFIGS[i];
        if (!ran[i] || b->kind != C_RVQ || !b->ks || !b->vs || b->beam)
            continue;
        size_t ko = N_CONFIGS, vo = N_CONFIGS;
        for (size_t j = 0; j < N_CONFIGS; j++) {
            const config *o = &CONFIGS[j];
            if (!ran[j] || o->kind != C_RVQ || o->cb != b->cb || o->beam)
                continue;
            if (o->ks == b->ks && o->vs == 0)
                ko = j;
            if (o->ks == 0 && o->vs == b->vs)
                vo = j;
        }
        if (ko == N_CONFIGS || vo == N_CONFIGS)
            continue;
        if (!header) {
            printf("Composition (dNLL = log perplexity ratio; independent parts add):\n\n"
                   "| configuration | measured delta | keys only + values only: predicted delta "
                   "| dNLL measured | dNLL keys + values | measured / predicted dNLL |\n"
                   "|---|---|---|---|---|---|\n");
            header = 1;
        }
        const double sum = d_mean[ko] + d_mean[vo];
        const double se = sqrt(d_se[ko] * d_se[ko] + d_se[vo] * d_se[vo]);
        printf("| %s | %+.1f%% | %+.1f%% | %+.4f +- %.4f | %+.4f +- %.4f | %.2f |\n", b->name,
               100.0 * (exp(d_mean[i]) - 1.0), 100.0 * (exp(sum) - 1.0), d_mean[i], d_se[i], sum,
               se, sum != 0 ? d_mean[i] / sum : NAN);
    }
    if (header)
        printf("\n");
}

static int in_set(const config *cf, int set)
{
    switch (set) {
    case SET_EXACT:
        return cf->kind == C_EXACT;
    case SET_SMOKE:
        return cf->kind == C_EXACT ||
               (cf->kind == C_RVQ && cf->cb == CB256_PRE && cf->ks == 4 && cf->vs == 2) ||
               (cf->kind == C_SCALAR && cf->scheme == SC_KIVI && cf->parts == 3u);
    case SET_MAIN:
        return !(cf->kind == C_RVQ && cf->cb == CB4096_PRE);
    case SET_METRIC: /* the metric rows and the plain rows they compete with */
        return cf->kind == C_EXACT ||
               (cf->kind == C_RVQ && !cf->beam &&
                (cf->cb == CB256_PRE || cf->cb == CB256_QK || cf->cb == CB256_OV ||
                 cf->cb == CB256_QKOV) &&
                cf->ks <= 8 && cf->vs <= 4 && (cf->ks & (cf->ks - 1)) == 0 &&
                (cf->vs & (cf->vs - 1)) == 0);
    default:
        return 1;
    }
}

/* ---- per-layer stage counts (issue 19 B.5, B.6) ---------------------------------- */

#define CAL_SEED_OFFSET 20000u /* calibration sequences: seed * 1000003 + this + i */

/* The per-layer quantizers of allocation al from codebook full (NULL for a
 * layer with no stage); one subset a layer (freed by free_lq). */
static void make_lq(const ctx *c, fkvf_rvq *full, const alloc *al, fkvf_rvq **lq)
{
    for (int l = 0; l < c->s.L; l++) {
        lq[l] = NULL;
        if ((al->k[l] || al->v[l]) &&
            fkvf_rvq_subset(&lq[l], full, al->k[l], al->v[l]) != FKVF_OK) {
            fprintf(stderr, "fkvf-quality: fkvf_rvq_subset failed\n");
            exit(1);
        }
    }
}

static void free_lq(const ctx *c, fkvf_rvq **lq)
{
    for (int l = 0; l < c->s.L; l++)
        fkvf_rvq_free(lq[l]);
}

/* "K x4,4,2 V x2,2,1": an allocation's stage counts by layer */
static void alloc_name(const ctx *c, const alloc *al, char *buf, size_t n)
{
    size_t o = (size_t)snprintf(buf, n, "K x");
    for (int l = 0; l < c->s.L && o < n; l++)
        o += (size_t)snprintf(buf + o, n - o, "%s%u", l ? "," : "", al->k[l]);
    if (o < n)
        o += (size_t)snprintf(buf + o, n - o, " V x");
    for (int l = 0; l < c->s.L && o < n; l++)
        o += (size_t)snprintf(buf + o, n - o, "%s%u", l ? "," : "", al->v[l]);
}

#define ALLOC_MAXS 17 /* stage counts 0..16 (spec 13.1) */

/* The cost of each part of each layer (slot 2 l: keys, 2 l + 1: values) at
 * each stage count of codebook b (b->q already trained): the dNLL on cal
 * (calibration sequences, not the evaluation ones) of archiving that part of
 * that layer alone. Prints them. */
static void measure_costs(ctx *cal, cbspec *b, double f[][ALLOC_MAXS])
{
    const shape *s = &cal->s;
    fkvf_rvq *full = b->q;
    const fkvf_rope *rope = cb_rope(cal, b);
    const config cf = {"calibration", C_RVQ, 0, 0, 0, 0, 0, 3u, 0};
    printf("Per-layer costs (codebook k=%u%s, %d calibration sequences): dNLL of archiving one "
           "part of one layer alone, by stage count\n\n| layer | part |",
           b->k, metric_name(b->metric), cal->S);
    const int maxs = b->ks > b->vs ? b->ks : b->vs;
    for (int st = 1; st <= maxs; st++)
        printf(" x%d |", st);
    printf("\n|---|---|");
    for (int st = 1; st <= maxs; st++)
        printf("---|");
    printf("\n");
    for (int slot = 0; slot < 2 * s->L; slot++) {
        const int l = slot / 2, part = slot % 2, ms = part ? b->vs : b->ks;
        f[slot][0] = 0;
        printf("| %d | %s |", l, part ? "V" : "K");
        for (int st = 1; st <= maxs; st++) {
            if (st > ms) {
                f[slot][st] = INFINITY;
                printf(" |");
                continue;
            }
            alloc al;
            memset(&al, 0, sizeof al);
            (part ? al.v : al.k)[l] = (unsigned char)st;
            fkvf_rvq *lq[MAX_ALLOC_LAYERS];
            make_lq(cal, full, &al, lq);
            result r;
            run_config(cal, &cf, NULL, rope, b->metric, &al, lq, &r, NULL, NULL);
            free_lq(cal, lq);
            f[slot][st] = r.sum_diff / cal->S;
            printf(" %+.4f |", f[slot][st]);
            fflush(stdout);
        }
        printf("\n");
    }
    printf("\n");
}

/* The per-layer stage counts of least summed cost f (measure_costs) within
 * budget bytes per archived position, the costs taken as additive (the
 * composition lines check that for K | V): a knapsack over stage units of
 * H * log2(k) / 8 bytes. layer0_free: layer 0 is restored exactly from a
 * token-indexed table (issue 19 B.6), so it takes no stage. Returns the
 * predicted dNLL. */
static double knapsack(const ctx *c, const cbspec *b, double f[][ALLOC_MAXS], double budget,
                       int layer0_free, alloc *out)
{
    const shape *s = &c->s;
    const double unit = stage_bytes(c, b);
    const int U = (int)floor(budget / unit + 1e-9);
    /* best[j][u] = least cost of slots 0..j-1 within u units */
    const int n = 2 * s->L;
    double *best = xmalloc(xsize((size_t)n + 1, (size_t)U + 1, 1, sizeof(double)));
    int *pick = xmalloc(xsize((size_t)n, (size_t)U + 1, 1, sizeof(int)));
    for (int u = 0; u <= U; u++)
        best[u] = 0;
    for (int j = 0; j < n; j++) {
        const int l = j / 2, ms = j % 2 ? b->vs : b->ks;
        /* every part takes a stage at least (an exact part would cost its fp16
         * bytes), but layer 0's with the token table, which takes none */
        const int lo = layer0_free && l == 0 ? 0 : 1, hi = layer0_free && l == 0 ? 0 : ms;
        /* a stage more never costs more (RVQ refines): a measured rise is
         * noise, so the cost of st stages is the least at st or fewer, and
         * ties go to more stages */
        double fm[ALLOC_MAXS];
        for (int st = lo; st <= hi; st++)
            fm[st] = st > lo && fm[st - 1] < f[j][st] ? fm[st - 1] : f[j][st];
        for (int u = 0; u <= U; u++) {
            double bv = INFINITY;
            int bs = 0;
            for (int st = lo; st <= hi && st <= u; st++) {
                const double v = best[(size_t)j * (size_t)(U + 1) + (size_t)(u - st)] + fm[st];
                if (v <= bv) {
                    bv = v;
                    bs = st;
                }
            }
            best[(size_t)(j + 1) * (size_t)(U + 1) + (size_t)u] = bv;
            pick[(size_t)j * (size_t)(U + 1) + (size_t)u] = bs;
        }
    }
    memset(out, 0, sizeof *out);
    int u = U;
    for (int j = n - 1; j >= 0; j--) {
        const int st = pick[(size_t)j * (size_t)(U + 1) + (size_t)u];
        (j % 2 ? out->v : out->k)[j / 2] = (unsigned char)st;
        u -= st;
    }
    const double predicted = best[(size_t)n * (size_t)(U + 1) + (size_t)U];
    if (!isfinite(predicted)) {
        fprintf(stderr, "fkvf-quality: --alloc %.0f: below one stage a part (%.0f bytes)\n",
                budget, unit * (n - (layer0_free ? 2 : 0)));
        exit(2);
    }
    free(best);
    free(pick);
    return predicted;
}

/* --alloc: choose the allocations for the budget (all layers; layer 0 from a
 * token table) on calibration sequences (sampled: seeds seed * 1000003 +
 * 20000 + i; text: the training range's sequences after the codebook's) and
 * evaluate them on the evaluation sequences, as rows of a second table (the
 * uniform rows they compete with are in the first). */
static void run_alloc(ctx *c, cbspec *b, double budget, int n_cal, unsigned beam, double fp16,
                      double exact_all, double exact_late)
{
    const double unit = stage_bytes(c, b);
    if (budget < unit * 2 * c->s.L) { /* before any work: every part takes a stage */
        fprintf(stderr, "fkvf-quality: --alloc %g: below one stage a part (%.0f bytes)\n", budget,
                unit * 2 * c->s.L);
        exit(2);
    }
    cb_get(c, b); /* trained (or loaded) and the metric ready before cal shares c's buffers */
    /* the calibration set: sequences the codebook was not trained on and that
     * are not evaluated */
    ctx cal = *c;
    cal.S = n_cal;
    cal.ev_rows = NULL;
    cal.ev_tokens = xmalloc(xsize((size_t)n_cal, (size_t)c->T, 1, sizeof(int)));
    cal.ev_exact = xmalloc((size_t)n_cal * sizeof(double));
    for (int i = 0; i < n_cal; i++)
        cal.ev_exact[i] = sample_sequence(
            c->m, &c->s, c->T, c->seed * 1000003u + CAL_SEED_OFFSET + (uint64_t)i,
            cal.ev_tokens + (size_t)i * (size_t)c->T, NULL,
            text_seq(c, c->train_off, c->train_end, b->train + i, "calibration"), NULL, NULL);
    double f[2 * MAX_ALLOC_LAYERS][ALLOC_MAXS];
    measure_costs(&cal, b, f);
    alloc al[2];
    double pred[2];
    for (int v = 0; v < 2; v++)
        pred[v] = knapsack(c, b, f, budget, v, &al[v]);
    free(cal.ev_tokens);
    free(cal.ev_exact);
    print_header(c);
    const fkvf_rope *rope = cb_rope(c, b);
    const config cf = {"allocation", C_RVQ, 0, 0, 0, 0, 0, 3u, beam};
    for (int v = 0; v < 2; v++) {
        int units = 0;
        for (int l = 0; l < c->s.L; l++)
            units += al[v].k[l] + al[v].v[l];
        char an[128], name[320];
        alloc_name(c, &al[v], an, sizeof an);
        char bw[32] = "";
        if (beam)
            snprintf(bw, sizeof bw, ", beam %u", beam);
        snprintf(name, sizeof name,
                 "RVQ per-head k=%u%s per-layer %s, keys pre-RoPE%s (chosen for %.0f B%s; "
                 "predicted dNLL %+.4f)",
                 b->k, metric_name(b->metric), an, bw, budget,
                 v ? ", layer 0 from the token table" : "", pred[v]);
        fkvf_rvq *lq[MAX_ALLOC_LAYERS];
        make_lq(c, cb_get(c, b), &al[v], lq);
        result r;
        run_config(c, &cf, NULL, rope, b->metric, &al[v], lq, &r, NULL, NULL);
        free_lq(c, lq);
        print_row(c, name, units * unit, fp16, &r, exact_all, exact_late, NULL);
        fprintf(stderr, "fkvf-quality: %s: %.1f s\n", name, r.secs);
    }
    printf("\n");
}

int main(int argc, char **argv)
{
    const char *model = LM_DEFAULT_MODEL;
    long S = 64, T = 512, NT = 64, NT4096 = 128, seed = 1, sinks = 4, recent = 32, iters = 25,
         iters4096 = 10;
    int set = SET_MAIN, verify = 1, print_ids = 0, from_exact = 0, alloc_metric = 0;
    const char *metric_out = NULL; /* --metric-out DIR */
    int native = 0;                /* --metric-native */
    long n_cal = 16, alloc_beam = 0;
    double alloc_budget = 0;
    const char *only[16];
    int n_only = 0;
    const char *cache_dir = NULL, *text_path = NULL, *eval_range = NULL, *train_range = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long *target = NULL;
        long lo = 1, hi = 1000000;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--no-verify")) {
            verify = 0;
            continue;
        } else if (!strcmp(a, "--from-exact")) {
            from_exact = 1;
            continue;
        } else if (!strcmp(a, "--alloc-metric")) {
            alloc_metric = 1;
            continue;
        } else if (!strcmp(a, "--only") && v && n_only < 16) {
            only[n_only++] = v;
            i++;
            continue;
        } else if (!strcmp(a, "--print-ids")) {
            print_ids = 1;
            continue;
        } else if (!strcmp(a, "--metric-native")) {
            native = 1;
            continue;
        } else if (!v) {
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--alloc")) {
            char *end;
            errno = 0;
            alloc_budget = strtod(v, &end);
            if (errno || end == v || *end || !(alloc_budget > 0 && alloc_budget <= 1e6)) {
                fprintf(stderr, "fkvf-quality: bad value for --alloc: %s\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--alloc-cal")) {
            target = &n_cal;
            hi = 100000;
        } else if (!strcmp(a, "--alloc-beam")) {
            target = &alloc_beam;
            lo = 0;
            hi = 64;
        } else if (!strcmp(a, "--model")) {
            model = v;
        } else if (!strcmp(a, "--metric-out") && v) {
            metric_out = v;
            i++;
            continue;
        } else if (!strcmp(a, "--cache-dir")) {
            cache_dir = v;
        } else if (!strcmp(a, "--text")) {
            text_path = v;
        } else if (!strcmp(a, "--eval-bytes")) {
            eval_range = v;
        } else if (!strcmp(a, "--train-bytes")) {
            train_range = v;
        } else if (!strcmp(a, "--set")) {
            if (!strcmp(v, "exact"))
                set = SET_EXACT;
            else if (!strcmp(v, "smoke"))
                set = SET_SMOKE;
            else if (!strcmp(v, "main"))
                set = SET_MAIN;
            else if (!strcmp(v, "full"))
                set = SET_FULL;
            else if (!strcmp(v, "metric"))
                set = SET_METRIC;
            else {
                usage(stderr);
                return 2;
            }
        } else if (!strcmp(a, "--seqs")) {
            target = &S;
        } else if (!strcmp(a, "--tokens")) {
            target = &T;
            lo = 2;
        } else if (!strcmp(a, "--train")) {
            target = &NT;
        } else if (!strcmp(a, "--train4096")) {
            target = &NT4096;
        } else if (!strcmp(a, "--seed")) {
            target = &seed;
            lo = 0;
        } else if (!strcmp(a, "--sinks")) {
            target = &sinks;
            lo = 0;
            hi = 1 << 20;
        } else if (!strcmp(a, "--recent")) {
            target = &recent;
        } else if (!strcmp(a, "--iters")) {
            target = &iters;
            hi = 1000;
        } else if (!strcmp(a, "--iters4096")) {
            target = &iters4096;
            hi = 1000;
        } else {
            usage(stderr);
            return 2;
        }
        if (target && st_parse_long(v, lo, hi, target)) {
            fprintf(stderr, "fkvf-quality: bad value for %s: %s\n", a, v);
            return 2;
        }
        i++;
    }
    if ((eval_range || train_range) && !text_path) {
        fprintf(stderr, "fkvf-quality: --eval-bytes and --train-bytes go with --text\n");
        return 2;
    }
    char err[512];
    lm_model *m = lm_load(model, err, sizeof err);
    if (!m) {
        fprintf(stderr, "fkvf-quality: %s\n", err);
        return 1;
    }
    const lm_config *mc = lm_model_config(m);
    if (T > mc->seq_len) {
        fprintf(stderr, "fkvf-quality: --tokens %ld exceeds the model's %d\n", T, mc->seq_len);
        lm_free(m);
        return 2;
    }
    /* the scalar peers quantize groups of 32 of a layer's row; RoPE turns
     * pairs */
    if (mc->head_size % 2 != 0 || mc->kv_dim % 32 != 0) {
        fprintf(stderr, "fkvf-quality: needs an even head size and kv_dim a multiple of 32 "
                        "(this model: %d, %d)\n",
                mc->head_size, mc->kv_dim);
        lm_free(m);
        return 1;
    }

    if (cache_dir && mkdir(cache_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "fkvf-quality: %s: %s\n", cache_dir, strerror(errno));
        lm_free(m);
        return 1;
    }
    ctx c;
    memset(&c, 0, sizeof c);
    c.m = m;
    c.s.L = mc->n_layers;
    c.s.H = mc->n_kv_heads;
    c.s.D = mc->head_size;
    c.s.HD = (size_t)mc->kv_dim;
    c.s.RW = (size_t)c.s.L * 2 * c.s.HD;
    c.s.V = mc->vocab_size;
    c.s.NH = mc->n_heads;
    c.S = (int)S;
    c.T = (int)T;
    c.sinks = (int)sinks;
    c.recent = (int)recent;
    c.native = native;
    c.seed = (uint64_t)seed;
    c.cache_dir = cache_dir;
    c.rope.layout = 1; /* llama2.c turns adjacent pairs, every dim of a head */
    c.rope.rope_dims = (uint32_t)mc->head_size;
    c.rope.theta = LM_ROPE_THETA;
    uint8_t *text = NULL;
    if (text_path) {
        size_t tn = 0;
        if (!(text = st_read_text("fkvf-quality", text_path, &tn))) {
            lm_free(m);
            return 1;
        }
        /* defaults: the last tenth evaluates, the first nine tenths train
         * (shakespeare-hd64 was trained on that first 90%) */
        size_t cut = tn - tn / 10;
        c.eval_off = cut;
        c.eval_end = tn;
        c.train_off = 0;
        c.train_end = cut;
        if ((eval_range && st_parse_range(eval_range, tn, &c.eval_off, &c.eval_end)) ||
            (train_range && st_parse_range(train_range, tn, &c.train_off, &c.train_end))) {
            fprintf(stderr, "fkvf-quality: a byte range is A:B with A < B <= %zu (the file's size)\n",
                    tn);
            free(text);
            lm_free(m);
            return 2;
        }
        c.text = text;
    }

    if (metric_out) { /* the metrics for fkvf train, then done */
        ensure_metric(&c);
        int rc = write_metrics(&c, metric_out);
        free_metrics(&c);
        free(c.train_rows);
        free(text);
        lm_free(m);
        return rc;
    }
    const double t_start = now();
    if (from_exact) {
        c.ev_rows = xmalloc(xsize((size_t)S, (size_t)T, c.s.RW, sizeof(float)));
        verify = 0; /* the appender quantizes the rows it is given, i.e. this run's */
    }
    c.ev_tokens = xmalloc(xsize((size_t)S, (size_t)T, 1, sizeof(int)));
    c.ev_exact = xmalloc((size_t)S * sizeof(double));
    for (int i = 0; i < c.S; i++)
        c.ev_exact[i] = sample_sequence(
            m, &c.s, c.T, c.seed * 1000003u + ST_EVAL_SEED_OFFSET + (uint64_t)i,
            c.ev_tokens + (size_t)i * (size_t)T,
            c.ev_rows ? c.ev_rows + (size_t)i * (size_t)T * c.s.RW : NULL,
            text_seq(&c, c.eval_off, c.eval_end, i, "evaluation"), NULL, NULL);
    if (print_ids) {
        printf("ids:");
        for (int p = 1; p < c.T; p++)
            printf("%s%d", p == 1 ? " " : ",", c.ev_tokens[p]);
        printf("\nexact mean-nll sequence 0: %.6f over %d tokens\n",
               c.ev_exact[0] / (double)(c.T - 1), c.T - 1);
    }

    cbspec cbs[CB_COUNT] = {
        [CB256_ASIS] = {256, 0, 0, 4, 2, (int)NT, (unsigned)iters, NULL, 0, 0, 0},
        [CB256_PRE] = {256, 0, 1, 8, 4, (int)NT, (unsigned)iters, NULL, 0, 0, 0},
        [CB256P_ASIS] = {256, 1, 0, 4, 2, (int)NT, (unsigned)iters, NULL, 0, 0, 0},
        [CB256P_PRE] = {256, 1, 1, 4, 2, (int)NT, (unsigned)iters, NULL, 0, 0, 0},
        [CB1024_ASIS] = {1024, 0, 0, 4, 2, (int)NT, (unsigned)iters, NULL, 0, 0, 0},
        [CB1024_PRE] = {1024, 0, 1, 8, 4, (int)NT, (unsigned)iters, NULL, 0, 0, 0},
        [CB4096_PRE] = {4096, 0, 1, 8, 4, (int)NT4096, (unsigned)iters4096, NULL, 0, 0, 0},
        [CB256_PRE16] = {256, 0, 1, 4, 2, 16, (unsigned)iters, NULL, 0, 0, 0},
        [CB256_QK] = {256, 0, 1, 8, 4, (int)NT, (unsigned)iters, NULL, 0, 0, METRIC_KEYS},
        [CB256_OV] = {256, 0, 1, 8, 4, (int)NT, (unsigned)iters, NULL, 0, 0, METRIC_VALUES},
        [CB256_QKOV] = {256, 0, 1, 8, 4, (int)NT, (unsigned)iters, NULL, 0, 0,
                        METRIC_KEYS | METRIC_VALUES},
    };

    const double fp16 = (double)c.s.RW * 2.0;
    char ev_src[96], tr_src[96];
    if (c.text) {
        snprintf(ev_src, sizeof ev_src, "text bytes from %zu", c.eval_off);
        snprintf(tr_src, sizeof tr_src, "text bytes from %zu", c.train_off);
    } else {
        snprintf(ev_src, sizeof ev_src, "seeds %llu * 1000003 + %u + i",
                 (unsigned long long)c.seed, ST_EVAL_SEED_OFFSET);
        snprintf(tr_src, sizeof tr_src, "seeds %llu * 1000003 + i", (unsigned long long)c.seed);
    }
    printf("fkvf-quality: model %s (%d layers, %d KV heads, head dim %d); %d evaluation "
           "sequences x %d positions (%s), %d next-token predictions each; exact window: %d "
           "sinks + %d recent; training sequences: %s, i < N (N = %ld; k = 4096: %ld); Lloyd "
           "iterations %ld (k = 4096: %ld); fp16 = %.0f bytes per position\n\n",
           model, c.s.L, c.s.H, c.s.D, c.S, c.T, ev_src, c.T - 1, c.sinks, c.recent, tr_src, NT,
           NT4096, iters, iters4096, fp16);
    if (c.text)
        printf("--text %s: the sequences are its bytes (BOS, then id %d + byte), not samples: "
               "evaluation sequence i the %d bytes at %zu + i * %d (range [%zu, %zu)), training "
               "sequence i those at %zu + i * %d (range [%zu, %zu))\n\n",
               text_path, LM_BYTE0, c.T - 1, c.eval_off, c.T - 1, c.eval_off, c.eval_end,
               c.train_off, c.T - 1, c.train_off, c.train_end);
    if (from_exact)
        printf("--from-exact: archived positions are quantized from the exact cache's rows "
               "(the sampling run), not from the rows each configuration's run computed\n\n");
    print_header(&c);

    double exact_all = NAN, exact_late = NAN;
    int verified = 0, rc_main = 0;
    /* per configuration: run, dNLL mean and s.e. (for the composition lines) */
    int ran[N_CONFIGS] = {0};
    double d_mean[N_CONFIGS], d_se[N_CONFIGS];
    for (size_t ci = 0; ci < N_CONFIGS; ci++) {
        const config *cf = &CONFIGS[ci];
        if (!in_set(cf, set))
            continue;
        int want = n_only == 0;
        for (int j = 0; j < n_only; j++)
            want |= !strcmp(cf->name, only[j]) ||
                    (!strcmp(only[j], "exact") && cf->kind == C_EXACT);
        if (!want)
            continue;
        fkvf_rvq *q = NULL;
        const fkvf_rope *rope = NULL;
        int metric = 0;
        double bytes = 0;
        if (cf->kind == C_RVQ) {
            cbspec *b = &cbs[cf->cb];
            fkvf_rvq *full = cb_get(&c, b);
            if (fkvf_rvq_subset(&q, full, (unsigned)cf->ks, (unsigned)cf->vs) != FKVF_OK) {
                fprintf(stderr, "fkvf-quality: fkvf_rvq_subset failed\n");
                return 1;
            }
            rope = cb_rope(&c, b);
            metric = b->metric;
            bytes = (double)(cf->ks + cf->vs) * c.s.L * stage_bytes(&c, b);
        } else if (cf->kind == C_SCALAR) {
            bytes = scalar_bytes(&c.s, cf->scheme, cf->bits, cf->parts);
        }
        /* the appender check: K x4 V x2 k = 256, both key storages */
        const int check = verify && cf->kind == C_RVQ && cf->ks == 4 && cf->vs == 2 && !cf->beam &&
                          (cf->cb == CB256_PRE || cf->cb == CB256_ASIS);
        float *rec = NULL, *ex = NULL;
        if (check) {
            rec = xmalloc(xsize((size_t)c.T, c.s.RW, 1, sizeof(float)));
            ex = xmalloc(xsize((size_t)c.T, c.s.RW, 1, sizeof(float)));
        }
        result r;
        run_config(&c, cf, q, rope, metric, NULL, NULL, &r, rec, ex);
        if (cf->kind == C_EXACT) {
            exact_all = r.sum_all / r.n_all;
            exact_late = r.sum_late / r.n_late;
            double gen = 0;
            for (int i = 0; i < c.S; i++)
                gen += c.ev_exact[i];
            if (gen != r.sum_all) {
                fprintf(stderr, "fkvf-quality: the exact teacher-forced NLL (%.17g) differs "
                                "from the sampling run's (%.17g)\n",
                        r.sum_all, gen);
                rc_main = 1;
            }
        }
        ran[ci] = 1;
        d_mean[ci] = print_row(&c, cf->name, cf->kind == C_EXACT ? 0 : bytes, fp16, &r, exact_all,
                               exact_late, &d_se[ci]);
        fprintf(stderr, "fkvf-quality: %s: %.1f s\n", cf->name, r.secs);
        if (check) {
            if (verify_archive(&c, q, cbs[cf->cb].pre_rope, ex, rec,
                               cbs[cf->cb].pre_rope ? "k=256 K x4 V x2, keys pre-RoPE"
                                                    : "k=256 K x4 V x2, keys as-is"))
                rc_main = 1;
            verified++;
        }
        free(rec);
        free(ex);
        fkvf_rvq_free(q);
    }
    printf("\n");
    print_composition(ran, d_mean, d_se);
    if (alloc_budget > 0) {
        if (c.s.L > MAX_ALLOC_LAYERS) {
            fprintf(stderr, "fkvf-quality: --alloc handles at most %d layers\n",
                    MAX_ALLOC_LAYERS);
            return 2;
        }
        if (isnan(exact_all)) { /* the reference of the rows: the exact cache */
            result r;
            run_config(&c, &CONFIGS[0], NULL, NULL, 0, NULL, NULL, &r, NULL, NULL);
            exact_all = r.sum_all / r.n_all;
            exact_late = r.sum_late / r.n_late;
        }
        run_alloc(&c, &cbs[alloc_metric ? CB256_QKOV : CB256_PRE], alloc_budget, (int)n_cal,
                  (unsigned)alloc_beam, fp16, exact_all, exact_late);
    }
    for (int b = 0; b < CB_COUNT; b++)
        if (cbs[b].q && !cbs[b].loaded) {
            const double vecs = (double)cbs[b].train * c.T * (cbs[b].pooled ? c.s.H : 1);
            const double used = vecs < 256.0 * cbs[b].k ? vecs : 256.0 * cbs[b].k;
            printf("codebook k=%u %s %s%s K x%d V x%d: trained on %d x %d positions (%.0f "
                   "vectors per table, %.1f per centroid), %u Lloyd iterations max, %.1f s\n",
                   cbs[b].k, cbs[b].pooled ? "pooled" : "per-head",
                   cbs[b].pre_rope ? "pre-RoPE" : "as-is", metric_name(cbs[b].metric), cbs[b].ks,
                   cbs[b].vs, cbs[b].train,
                   c.T, used, used / cbs[b].k, cbs[b].iters, cbs[b].secs);
        } else if (cbs[b].q) {
            printf("codebook k=%u %s %s%s: loaded from %s\n", cbs[b].k,
                   cbs[b].pooled ? "pooled" : "per-head", cbs[b].pre_rope ? "pre-RoPE" : "as-is",
                   metric_name(cbs[b].metric), c.cache_dir);
        }
    printf("total wall time %.1f s\n", now() - t_start);
    for (int b = 0; b < CB_COUNT; b++)
        fkvf_rvq_free(cbs[b].q);
    free(c.ev_tokens);
    free(c.ev_exact);
    free(c.ev_rows);
    free(c.train_rows);
    free_metrics(&c);
    free(text);
    lm_free(m);
    return rc_main;
}
