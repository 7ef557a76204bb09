/* bench_rd: rate-distortion of per-head RVQ against scalar peers.
 *
 * Part 1 (real caches): the tiny engine (examples/engine) samples seeded
 * sequences from BOS at temperature 1.0 with stories260K; codebooks are
 * trained on the rows of the training sequences and evaluated on the others.
 * k = 4096 is trained on more sequences (--train4096). Per configuration:
 * index/code bytes per archived position, ratio vs fp16,
 * relative MSE and SNR of keys (post-RoPE, what attention sees) and values,
 * and the mean cosine between attention outputs computed with the exact cache
 * and with the archived cache (exact window of sinks + recent positions,
 * everything else reconstructed), using the engine's own post-RoPE queries.
 *
 * Part 2 (GPT-2-small shape, synthetic with key-channel outliers): bytes per
 * archived position, ratio, training time, encode positions/s and decode GB/s
 * of f16 output on one core for K x4 V x2, k = 256 (keys as-is and, with the
 * same codes, keys rotated back as from a pre-RoPE archive, both layouts),
 * next to memcpy of the same bytes; then whole archives of
 * 1,024 and 8,192 positions written through the public writer with that
 * codebook shared (CBRF) and embedded (CBK1), each checked by restoring one
 * archived position.
 *
 * Usage: bench_rd [--model PATH] [--train N] [--eval N] [--tokens T]
 *                 [--seed S] [--iters N] [--beam W] [--sinks S] [--recent W]
 *                 [--no-k1024] [--no-k4096] [--train4096 N] [--iters4096 N]
 *                 [--no-real] [--no-gpt2]
 *                 [--gpt2-positions N] [--gpt2-train N] [--gpt2-iters N]
 */
#define _POSIX_C_SOURCE 200809L
#include <fkvf.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"

#ifndef BENCH_RD_MODEL
#define BENCH_RD_MODEL "../shared/models/stories260K.bin"
#endif

#define MAX_ROWS 64

typedef struct opts {
    const char *model;
    int n_train, n_eval, tokens;
    uint64_t seed;
    unsigned iters, beam;
    int sinks, recent;
    int k1024, real, gpt2;
    size_t gpt2_positions, gpt2_train;
    unsigned gpt2_iters;
    int k4096;            /* train and evaluate k = 4096 */
    int n_train4096;      /* training sequences for k = 4096 (the first n_train are shared) */
    unsigned iters4096;   /* Lloyd iterations per stage for k = 4096 */
} opts;

/* Shape of the real model's rows. */
typedef struct shape {
    int L, H, NQ, D;
    size_t RW; /* floats per row: L * 2 * H * D */
} shape;

typedef struct result {
    char name[96];
    int kind;      /* 0 RVQ per-head, 1 RVQ pooled, 2 scalar */
    double bytes;  /* per archived position */
    double k_rel, v_rel, cos;
    double seconds; /* encode+decode (RVQ) or quantize (scalar) */
} result;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench_rd: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static double snr_db(double rel)
{
    return rel > 0 ? -10.0 * log10(rel) : INFINITY;
}

/* ---- real caches -------------------------------------------------------- */

/* Offsets inside a row (spec 14.2): per layer keys of heads 0..H-1, then values. */
static size_t key_off(const shape *s, int l, int g)
{
    return (size_t)l * 2u * (size_t)s->H * (size_t)s->D + (size_t)g * (size_t)s->D;
}
static size_t val_off(const shape *s, int l, int g)
{
    return key_off(s, l, g) + (size_t)s->H * (size_t)s->D;
}

/* Sample one sequence of T positions from BOS; rows (T * RW floats, keys
 * post-RoPE) and, if q is not NULL, the post-RoPE queries (T * L * NQ * D). */
static int gen_sequence(const lm_model *m, const shape *s, int T, uint64_t seed, float *rows,
                        float *q)
{
    const lm_config *c = lm_model_config(m);
    lm_state *st = lm_state_new(m, T);
    if (!st)
        return -1;
    lm_rng rng;
    lm_rng_seed(&rng, seed);
    int tok = LM_BOS;
    const size_t qn = (size_t)s->L * (size_t)s->NQ * (size_t)s->D;
    for (int pos = 0; pos < T; pos++) {
        const float *logits = lm_forward(st, tok, pos);
        if (!logits) {
            lm_state_free(st);
            return -1;
        }
        if (q)
            memcpy(q + (size_t)pos * qn, lm_queries(st), qn * sizeof(float));
        tok = lm_sample(logits, c->vocab_size, 1.0, &rng);
    }
    for (int l = 0; l < s->L; l++) {
        const float *kc = lm_cache_data(st, l, LM_KEY);
        const float *vc = lm_cache_data(st, l, LM_VALUE);
        for (int g = 0; g < s->H; g++)
            for (int p = 0; p < T; p++) {
                const size_t src = ((size_t)g * (size_t)T + (size_t)p) * (size_t)s->D;
                float *row = rows + (size_t)p * s->RW;
                memcpy(row + key_off(s, l, g), kc + src, (size_t)s->D * sizeof(float));
                memcpy(row + val_off(s, l, g), vc + src, (size_t)s->D * sizeof(float));
            }
    }
    lm_state_free(st);
    return 0;
}

/* Attention output of one query over positions 0..t; key/value of position p
 * from `ex` when p is in the exact window, else from `rc`. out: D doubles. */
static void attend(const shape *s, const float *ex, const float *rc, int l, int g, const float *qh,
                   int t, int sinks, int recent, double *att, double *out)
{
    const double scale = 1.0 / sqrt((double)s->D);
    double mx = -INFINITY;
    for (int p = 0; p <= t; p++) {
        const int exact = p < sinks || p > t - recent;
        const float *k = (exact ? ex : rc) + (size_t)p * s->RW + key_off(s, l, g);
        double d = 0;
        for (int i = 0; i < s->D; i++)
            d += (double)qh[i] * (double)k[i];
        d *= scale;
        att[p] = d;
        if (d > mx)
            mx = d;
    }
    double sum = 0;
    for (int i = 0; i < s->D; i++)
        out[i] = 0;
    for (int p = 0; p <= t; p++) {
        const double a = exp(att[p] - mx);
        sum += a;
        const int exact = p < sinks || p > t - recent;
        const float *v = (exact ? ex : rc) + (size_t)p * s->RW + val_off(s, l, g);
        for (int i = 0; i < s->D; i++)
            out[i] += a * (double)v[i];
    }
    for (int i = 0; i < s->D; i++)
        out[i] /= sum;
}

typedef struct evalset {
    const shape *s;
    int n_seq, T, sinks, recent;
    const float *rows;    /* n_seq * T * RW, exact */
    const float *q;       /* n_seq * T * L * NQ * D */
    double *ref;          /* exact attention outputs, n_seq * T * L * NQ * D */
} evalset;

static void eval_reference(evalset *e)
{
    const shape *s = e->s;
    const size_t qn = (size_t)s->L * (size_t)s->NQ * (size_t)s->D;
    double *att = xmalloc((size_t)e->T * sizeof(double));
    const int group = s->NQ / s->H;
    for (int q = 0; q < e->n_seq; q++) {
        const float *rows = e->rows + (size_t)q * (size_t)e->T * s->RW;
        for (int t = 0; t < e->T; t++)
            for (int l = 0; l < s->L; l++)
                for (int h = 0; h < s->NQ; h++) {
                    const size_t o = ((size_t)q * (size_t)e->T + (size_t)t) * qn +
                                     ((size_t)l * (size_t)s->NQ + (size_t)h) * (size_t)s->D;
                    attend(s, rows, rows, l, h / group, e->q + o, t, 0, 0, att, e->ref + o);
                }
    }
    free(att);
}

/* Relative MSE of keys and of values of reconstructed rows rc against e->rows. */
static void rel_mse(const evalset *e, const float *rc, double *k_rel, double *v_rel)
{
    const shape *s = e->s;
    double kn = 0, ke = 0, vn = 0, ve = 0;
    const size_t n = (size_t)e->n_seq * (size_t)e->T;
    const size_t HD = (size_t)s->H * (size_t)s->D;
    for (size_t i = 0; i < n; i++)
        for (int l = 0; l < s->L; l++) {
            const float *x = e->rows + i * s->RW + key_off(s, l, 0);
            const float *y = rc + i * s->RW + key_off(s, l, 0);
            for (size_t j = 0; j < HD; j++) {
                double d = (double)x[j] - (double)y[j];
                kn += (double)x[j] * (double)x[j];
                ke += d * d;
                d = (double)x[HD + j] - (double)y[HD + j];
                vn += (double)x[HD + j] * (double)x[HD + j];
                ve += d * d;
            }
        }
    *k_rel = ke / kn;
    *v_rel = ve / vn;
}

/* Fill r->k_rel, v_rel, cos from reconstructed rows (same layout as e->rows). */
static void eval_recon(const evalset *e, const float *rc, result *r)
{
    const shape *s = e->s;
    rel_mse(e, rc, &r->k_rel, &r->v_rel);

    const size_t qn = (size_t)s->L * (size_t)s->NQ * (size_t)s->D;
    const int group = s->NQ / s->H;
    double *att = xmalloc((size_t)e->T * sizeof(double));
    double out[64];
    double csum = 0;
    size_t cnt = 0;
    for (int q = 0; q < e->n_seq; q++) {
        const float *ex = e->rows + (size_t)q * (size_t)e->T * s->RW;
        const float *rr = rc + (size_t)q * (size_t)e->T * s->RW;
        for (int t = e->sinks + e->recent; t < e->T; t++)
            for (int l = 0; l < s->L; l++)
                for (int h = 0; h < s->NQ; h++) {
                    const size_t o = ((size_t)q * (size_t)e->T + (size_t)t) * qn +
                                     ((size_t)l * (size_t)s->NQ + (size_t)h) * (size_t)s->D;
                    attend(s, ex, rr, l, h / group, e->q + o, t, e->sinks, e->recent, att, out);
                    const double *a = e->ref + o;
                    double ab = 0, aa = 0, bb = 0;
                    for (int i = 0; i < s->D; i++) {
                        ab += a[i] * out[i];
                        aa += a[i] * a[i];
                        bb += out[i] * out[i];
                    }
                    csum += (aa > 0 && bb > 0) ? ab / sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
                    cnt++;
                }
    }
    free(att);
    r->cos = cnt ? csum / (double)cnt : NAN;
}

/* ---- scalar peers ---------------------------------------------------------- */

static float f16r(float x)
{
    return fkvf_f16_to_f32(fkvf_f32_to_f16(x));
}

/* Symmetric: one f16 scale = max|x| / qmax, codes in [-qmax, qmax]. */
static void quant_sym(const float *x, float *y, size_t n, size_t stride, int bits)
{
    const int qmax = (1 << (bits - 1)) - 1;
    float mx = 0;
    for (size_t i = 0; i < n; i++) {
        const float a = fabsf(x[i * stride]);
        if (a > mx)
            mx = a;
    }
    const float sc = f16r(mx / (float)qmax);
    for (size_t i = 0; i < n; i++) {
        if (sc == 0.0f) {
            y[i * stride] = 0.0f;
            continue;
        }
        float c = nearbyintf(x[i * stride] / sc);
        if (c > (float)qmax)
            c = (float)qmax;
        if (c < (float)-qmax)
            c = (float)-qmax;
        y[i * stride] = c * sc;
    }
}

/* Asymmetric: f16 zero = min, f16 scale = (max - min) / (2^bits - 1), codes
 * in [0, 2^bits - 1]; dequantized as zero + code * scale. */
static void quant_asym(const float *x, float *y, size_t n, size_t stride, int bits)
{
    const int qmax = (1 << bits) - 1;
    float mn = x[0], mx = x[0];
    for (size_t i = 1; i < n; i++) {
        const float a = x[i * stride];
        if (a < mn)
            mn = a;
        if (a > mx)
            mx = a;
    }
    const float z = f16r(mn);
    const float sc = f16r((mx - mn) / (float)qmax);
    for (size_t i = 0; i < n; i++) {
        if (sc == 0.0f) {
            y[i * stride] = z;
            continue;
        }
        float c = nearbyintf((x[i * stride] - z) / sc);
        if (c > (float)qmax)
            c = (float)qmax;
        if (c < 0.0f)
            c = 0.0f;
        y[i * stride] = z + c * sc;
    }
}

enum { SC_HEAD_SYM, SC_HEAD_ASYM, SC_LAYER_ASYM, SC_KIVI };

/* Quantize every vector of the evaluation rows with a scalar scheme; returns
 * bytes per position (codes + f16 scales/zeros). */
static double scalar_recon(const shape *s, const float *rows, int n_seq, int T, int scheme,
                           int bits, float *out)
{
    const size_t D = (size_t)s->D, H = (size_t)s->H, HD = H * D;
    const size_t n = (size_t)n_seq * (size_t)T;
    for (size_t i = 0; i < n; i++)
        for (int l = 0; l < s->L; l++) {
            const float *x = rows + i * s->RW + key_off(s, l, 0);
            float *y = out + i * s->RW + key_off(s, l, 0);
            switch (scheme) {
            case SC_HEAD_SYM:
            case SC_HEAD_ASYM:
                for (size_t v = 0; v < 2 * H; v++) {
                    if (scheme == SC_HEAD_SYM)
                        quant_sym(x + v * D, y + v * D, D, 1, bits);
                    else
                        quant_asym(x + v * D, y + v * D, D, 1, bits);
                }
                break;
            case SC_LAYER_ASYM:
            case SC_KIVI:
                /* values (and keys unless KIVI) per token in groups of 32 */
                for (size_t kv = (scheme == SC_KIVI); kv < 2; kv++)
                    for (size_t j = 0; j < HD; j += 32) {
                        const size_t m = HD - j < 32 ? HD - j : 32;
                        quant_asym(x + kv * HD + j, y + kv * HD + j, m, 1, bits);
                    }
                break;
            }
        }
    if (scheme == SC_KIVI) {
        /* keys per channel over groups of 32 positions of a sequence */
        for (int q = 0; q < n_seq; q++)
            for (int p0 = 0; p0 < T; p0 += 32) {
                const size_t m = (size_t)(T - p0 < 32 ? T - p0 : 32);
                const size_t base = ((size_t)q * (size_t)T + (size_t)p0) * s->RW;
                for (int l = 0; l < s->L; l++)
                    for (size_t c = 0; c < HD; c++) {
                        const size_t o = base + key_off(s, l, 0) + c;
                        quant_asym(rows + o, out + o, m, s->RW, bits);
                    }
            }
    }
    const double per_vec_codes = (double)D * bits / 8.0;
    const double vecs = (double)s->L * (double)H * 2.0; /* K and V vectors per position */
    const double per_grp = 32.0 * bits / 8.0 + 4.0;      /* 32 codes + f16 scale + zero */
    switch (scheme) {
    case SC_HEAD_SYM:
        return vecs * (per_vec_codes + 2.0);
    case SC_HEAD_ASYM:
        return vecs * (per_vec_codes + 4.0);
    default: /* 32-element groups, keys (KIVI: over positions) and values alike */
        return (double)s->L * 2.0 * (double)HD / 32.0 * per_grp;
    }
}

/* ---- RVQ ----------------------------------------------------------------- */

static const fkvf_rope ROPE8 = {1, 8, LM_ROPE_THETA};

static fkvf_rvq *train(const shape *s, const float *rows, int n_seq, int T, uint32_t k,
                       int pooled, int k_stages, int v_stages, const fkvf_rope *rope,
                       const opts *o, unsigned iters, double *secs)
{
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = (uint32_t)s->L;
    p.n_kv_heads = (uint32_t)s->H;
    p.key_dim = p.value_dim = (uint32_t)s->D;
    p.k = k;
    p.k_stages = (uint8_t)k_stages;
    p.v_stages = (uint8_t)v_stages;
    p.pooled = (uint8_t)pooled;
    p.seed = o->seed;
    p.max_iters = iters;
    p.key_rope = rope;
    fkvf_rows *blocks = xmalloc((size_t)n_seq * sizeof *blocks);
    for (int i = 0; i < n_seq; i++) {
        blocks[i].data = rows + (size_t)i * (size_t)T * s->RW;
        blocks[i].n_rows = (size_t)T;
        blocks[i].dtype = FKVF_DTYPE_F32;
        blocks[i].first_position = 0;
    }
    fkvf_rvq *q = NULL;
    const double t0 = cpu_now();
    int rc = fkvf_rvq_train(&q, &p, blocks, (size_t)n_seq, NULL);
    *secs = cpu_now() - t0;
    free(blocks);
    if (rc != FKVF_OK) {
        fprintf(stderr, "bench_rd: fkvf_rvq_train failed (%d)\n", rc);
        exit(1);
    }
    return q;
}

static double rvq_recon(const fkvf_rvq *q, const fkvf_rope *rope, unsigned beam, const shape *s,
                        const float *rows, int n_seq, int T, float *out, double *secs)
{
    const size_t cpp = fkvf_rvq_codes_per_position(q);
    uint16_t *codes = xmalloc((size_t)T * cpp * sizeof *codes);
    const double t0 = now();
    for (int i = 0; i < n_seq; i++) {
        fkvf_rows r = {rows + (size_t)i * (size_t)T * s->RW, (size_t)T, FKVF_DTYPE_F32, 0};
        float *dst = out + (size_t)i * (size_t)T * s->RW;
        int rc = fkvf_rvq_encode(q, &r, rope, beam, codes, cpp, 1);
        if (rc == FKVF_OK)
            rc = fkvf_rvq_decode(q, codes, cpp, 1, (size_t)T, 0, rope, FKVF_DTYPE_F32, dst,
                                 (size_t)T * s->RW * sizeof(float));
        if (rc != FKVF_OK) {
            fprintf(stderr, "bench_rd: RVQ encode/decode failed (%d)\n", rc);
            exit(1);
        }
    }
    *secs = now() - t0;
    free(codes);
    fkvf_codebook_shape sh;
    fkvf_rvq_shape(q, &sh, NULL);
    double bits = 0;
    for (uint32_t k = sh.k; k > 1; k >>= 1)
        bits += 1;
    /* indices per (layer, KV head) whether or not the tables are pooled */
    return (double)(sh.k_stages + sh.v_stages) * bits / 8.0 * (double)s->L * (double)s->H;
}

static void print_row(const result *r, double fp16)
{
    printf("| %s | %.1f | %.2fx | %.4f | %.2f | %.4f | %.2f | %.5f |\n", r->name, r->bytes,
           fp16 / r->bytes, r->k_rel, snr_db(r->k_rel), r->v_rel, snr_db(r->v_rel), r->cos);
    fflush(stdout);
}

static int run_real(const opts *o)
{
    FILE *f = fopen(o->model, "rb");
    if (!f) {
        printf("bench_rd: model %s not found, skipping the real-cache part\n\n", o->model);
        return 0;
    }
    fclose(f);
    char err[256];
    lm_model *m = lm_load(o->model, err, sizeof err);
    if (!m) {
        fprintf(stderr, "bench_rd: %s\n", err);
        return 1;
    }
    const lm_config *c = lm_model_config(m);
    shape s = {c->n_layers, c->n_kv_heads, c->n_heads, c->head_size, 0};
    s.RW = (size_t)s.L * 2u * (size_t)s.H * (size_t)s.D;
    const int T = o->tokens > c->seq_len ? c->seq_len : o->tokens;
    if (s.D > 64 || s.D != 8 || T < 1) {
        fprintf(stderr, "bench_rd: unexpected model shape (head size %d)\n", s.D);
        lm_free(m);
        return 1;
    }
    const double fp16 = (double)s.RW * 2.0;
    const size_t qn = (size_t)s.L * (size_t)s.NQ * (size_t)s.D;
    /* training sequences: n_train for k <= 1024; for k = 4096 those and more */
    const int ntr_all = o->k4096 && o->n_train4096 > o->n_train ? o->n_train4096 : o->n_train;
    float *tr = xmalloc((size_t)ntr_all * (size_t)T * s.RW * sizeof(float));
    float *ev = xmalloc((size_t)o->n_eval * (size_t)T * s.RW * sizeof(float));
    float *qs = xmalloc((size_t)o->n_eval * (size_t)T * qn * sizeof(float));
    float *rc = xmalloc((size_t)o->n_eval * (size_t)T * s.RW * sizeof(float));
    double *ref = xmalloc((size_t)o->n_eval * (size_t)T * qn * sizeof(double));

    double t0 = now();
    /* sequence i is seeded seed * 1000003 + i: training 0..n_train-1, evaluation
     * n_train..n_train+n_eval-1, the extra k = 4096 training sequences after */
    for (int i = 0; i < ntr_all + o->n_eval; i++) {
        const int is_ev = i >= o->n_train && i < o->n_train + o->n_eval;
        const int j = is_ev ? i - o->n_train : (i < o->n_train ? i : i - o->n_eval);
        float *rows = (is_ev ? ev : tr) + (size_t)j * (size_t)T * s.RW;
        if (gen_sequence(m, &s, T, o->seed * 1000003u + (uint64_t)i, rows,
                         is_ev ? qs + (size_t)j * (size_t)T * qn : NULL) != 0) {
            fprintf(stderr, "bench_rd: forward pass failed\n");
            return 1;
        }
    }
    evalset e = {&s, o->n_eval, T, o->sinks, o->recent, ev, qs, ref};
    eval_reference(&e);
    printf("## Real caches: %s\n\n", o->model);
    printf("%d training + %d evaluation sequences of %d tokens sampled at temperature 1.0 "
           "from BOS (seed %llu; generation + reference attention %.1f s); "
           "L=%d, %d KV heads, %d query heads, head dim %d; fp16 = %.0f bytes/position.\n",
           o->n_train, o->n_eval, T, (unsigned long long)o->seed, now() - t0, s.L, s.H, s.NQ,
           s.D, fp16);
    if (o->k4096)
        printf("k = 4096: trained on %d sequences (the %d above and %d more; %d vectors per "
               "head, %.1f per centroid), max_iters %u.\n",
               ntr_all, o->n_train, ntr_all - o->n_train, ntr_all * T,
               (double)ntr_all * T / 4096.0, o->iters4096);
    fkvf_rvq_params dp;
    fkvf_rvq_params_init(&dp);
    printf("RVQ: k-means max_iters %u, %s tables and samples_per_centroid %u (library "
           "defaults); beam width %u where stated.\n",
           o->iters, dp.table_dtype == FKVF_DTYPE_F16 ? "f16" : "f32",
           (unsigned)dp.samples_per_centroid, o->beam);
    printf("Attention cosine: mean over evaluation positions t = %d..%d, %d layers, %d query "
           "heads; window %d sinks + %d recent exact.\n\n",
           o->sinks + o->recent, T - 1, s.L, s.NQ, o->sinks, o->recent);
    printf("| configuration | bytes/pos | vs fp16 | K rel MSE | K SNR dB | V rel MSE | V SNR dB "
           "| attn cos |\n|---|---|---|---|---|---|---|---|\n");
    fflush(stdout);

    result res[MAX_ROWS];
    int nres = 0;
    double train_s[8];
    const char *train_name[8];
    int ntrain = 0;

    /* scalar peers */
    static const struct {
        const char *name;
        int scheme, bits;
    } sc[] = {
        {"int8 per token-head, symmetric (f16 scale per 8-dim vector)", SC_HEAD_SYM, 8},
        {"int4 per token-head, symmetric (f16 scale per 8-dim vector)", SC_HEAD_SYM, 4},
        {"int4 per token-head, asymmetric (f16 scale+zero per 8-dim vector)", SC_HEAD_ASYM, 4},
        {"int2 per token-head, symmetric {-1,0,1} (f16 scale per 8-dim vector)", SC_HEAD_SYM,
         2},
        {"int2 per token-head, asymmetric (f16 scale+zero per 8-dim vector)", SC_HEAD_ASYM, 2},
        {"int4 per token, asymmetric, group 32 (f16 scale+zero per layer K or V row)",
         SC_LAYER_ASYM, 4},
        {"int2 per token, asymmetric, group 32 (f16 scale+zero per layer K or V row)",
         SC_LAYER_ASYM, 2},
        {"KIVI-2: K per channel over 32 positions, V per token group 32 (f16 scale+zero)",
         SC_KIVI, 2},
    };
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) {
        result *r = &res[nres++];
        snprintf(r->name, sizeof r->name, "%s", sc[i].name);
        r->kind = 2;
        const double ts = now();
        r->bytes = scalar_recon(&s, ev, o->n_eval, T, sc[i].scheme, sc[i].bits, rc);
        r->seconds = now() - ts;
        eval_recon(&e, rc, r);
        print_row(r, fp16);
    }

    /* RVQ configurations: one training per (k, pooled, keys) with the most
     * stages needed, subsets (fkvf_rvq_subset) for fewer stages */
    static const int ks_all[][2] = {{1, 1}, {1, 2}, {2, 1}, {2, 2}, {4, 1}, {4, 2},
                                    {4, 4}, {6, 4}, {8, 4}, {10, 10}};
    static const int ks_few[][2] = {{2, 2}, {4, 2}};
    static const int ks_1024[][2] = {{1, 1}, {1, 2}, {2, 1}, {2, 2}, {4, 2}, {2, 4}, {4, 4}};
    static const int ks_4096[][2] = {{1, 1}, {1, 2}, {2, 1}, {2, 2}, {2, 3}, {2, 4}};
    static const int ks_k4v2[][2] = {{4, 2}};
    static const struct {
        uint32_t k;
        int pooled, prerope, kmax, vmax;
        const int (*st)[2];
        size_t nst;
    } tc[] = {
        {256, 0, 0, 4, 2, ks_all, 6},   {256, 0, 1, 10, 10, ks_all, 10},
        {1024, 0, 0, 4, 2, ks_few, 2},  {1024, 0, 1, 4, 4, ks_1024, 7},
        {4096, 0, 1, 2, 4, ks_4096, 6}, {256, 1, 0, 4, 2, ks_k4v2, 1},
        {256, 1, 1, 4, 2, ks_k4v2, 1},
    };
    /* value SNR against value bits per dimension: V x1..4 of the per-head
     * pre-RoPE trainings (values do not depend on the key mode) */
    double vrel[3][5];
    int vk_done[3] = {0, 0, 0};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 5; b++)
            vrel[a][b] = NAN;
    for (size_t i = 0; i < sizeof tc / sizeof tc[0]; i++) {
        if ((tc[i].k == 1024 && !o->k1024) || (tc[i].k == 4096 && !o->k4096))
            continue;
        const fkvf_rope *rope = tc[i].prerope ? &ROPE8 : NULL;
        const char *keys = tc[i].prerope ? "pre-RoPE" : "as-is";
        const char *kind = tc[i].pooled ? "pooled" : "per-head";
        double secs;
        const int big = tc[i].k == 4096;
        fkvf_rvq *full = train(&s, tr, big ? ntr_all : o->n_train, T, tc[i].k, tc[i].pooled,
                               tc[i].kmax, tc[i].vmax, rope, o, big ? o->iters4096 : o->iters,
                               &secs);
        static char names[8][64];
        snprintf(names[ntrain], sizeof names[ntrain], "%s k=%u keys %s (K x%d V x%d)", kind,
                 (unsigned)tc[i].k, keys, tc[i].kmax, tc[i].vmax);
        train_name[ntrain] = names[ntrain];
        train_s[ntrain++] = secs;
        const int(*st)[2] = tc[i].st;
        for (size_t j = 0; j < tc[i].nst; j++) {
            fkvf_rvq *q = NULL;
            if (fkvf_rvq_subset(&q, full, (unsigned)st[j][0], (unsigned)st[j][1]) != FKVF_OK) {
                fprintf(stderr, "bench_rd: fkvf_rvq_subset failed\n");
                return 1;
            }
            const int nb = (!tc[i].pooled && st[j][0] == 4 && st[j][1] == 2 && tc[i].k == 256)
                               ? 2 : 1;
            for (int b = 0; b < nb; b++) {
                result *r = &res[nres++];
                const unsigned bw = b ? o->beam : 1;
                if (b)
                    snprintf(r->name, sizeof r->name, "RVQ %s k=%u K x%d V x%d, keys %s, beam %u",
                             kind, (unsigned)tc[i].k, st[j][0], st[j][1], keys, bw);
                else
                    snprintf(r->name, sizeof r->name, "RVQ %s k=%u K x%d V x%d, keys %s", kind,
                             (unsigned)tc[i].k, st[j][0], st[j][1], keys);
                r->kind = tc[i].pooled ? 1 : 0;
                r->bytes = rvq_recon(q, rope, bw, &s, ev, o->n_eval, T, rc, &r->seconds);
                eval_recon(&e, rc, r);
                print_row(r, fp16);
            }
            fkvf_rvq_free(q);
        }
        const int vi = tc[i].k == 256 ? 0 : tc[i].k == 1024 ? 1 : 2;
        if (!tc[i].pooled && tc[i].prerope) {
            for (int v = 1; v <= 4 && v <= tc[i].vmax; v++) {
                fkvf_rvq *q = NULL;
                if (fkvf_rvq_subset(&q, full, 0, (unsigned)v) != FKVF_OK) {
                    fprintf(stderr, "bench_rd: fkvf_rvq_subset failed\n");
                    return 1;
                }
                double secs2, krel;
                rvq_recon(q, NULL, 1, &s, ev, o->n_eval, T, rc, &secs2);
                rel_mse(&e, rc, &krel, &vrel[vi][v]);
                fkvf_rvq_free(q);
            }
            vk_done[vi] = 1;
        }
        fkvf_rvq_free(full);
    }
    printf("\nTraining time (CPU seconds, one thread, %d x %d training positions; k = 4096: %d x "
           "%d):",
           o->n_train, T, ntr_all, T);
    for (int i = 0; i < ntrain; i++)
        printf("%s %s %.1f s", i ? ";" : "", train_name[i], train_s[i]);
    printf(".\n\n");

    /* Verdicts, computed from the rows above. */
    printf("Checks against the targets (computed from the measured rows):\n");
    int all = 1;
    for (int i = 0; i < nres; i++) {
        if (res[i].kind != 2)
            continue;
        int best = -1;
        for (int j = 0; j < nres; j++)
            if (res[j].kind == 0 && res[j].bytes <= res[i].bytes + 1e-9 &&
                (best < 0 || res[j].cos > res[best].cos))
                best = j;
        if (best < 0) {
            printf("- %s (%.0f B): no per-head RVQ row at <= its bytes\n", res[i].name,
                   res[i].bytes);
            all = 0;
            continue;
        }
        const int win = res[best].cos > res[i].cos;
        all &= win;
        printf("- %s (%.0f B, cos %.5f) vs best per-head RVQ at <= its bytes, %s (%.0f B, cos "
               "%.5f): RVQ %s\n",
               res[i].name, res[i].bytes, res[i].cos, res[best].name, res[best].bytes,
               res[best].cos, win ? "better" : "NOT better");
    }
    printf("- per-head RVQ beats every scalar peer at equal or fewer bytes: %s\n",
           all ? "yes" : "NO");
    for (int i = 0; i < nres; i++) {
        if (res[i].kind != 2 || strncmp(res[i].name, "int4", 4) != 0)
            continue;
        printf("- RVQ rows at <= %.0f bytes with a higher attention cosine than %s (%.5f):",
               res[i].bytes, res[i].name, res[i].cos);
        int any = 0;
        for (int j = 0; j < nres; j++)
            if (res[j].kind != 2 && res[j].bytes <= res[i].bytes + 1e-9 &&
                res[j].cos > res[i].cos) {
                printf("%s %s (%.0f B, %.5f)", any ? ";" : "", res[j].name, res[j].bytes,
                       res[j].cos);
                any = 1;
            }
        printf("%s\n", any ? "" : " none");
    }
    int pr = -1;
    for (int j = 0; j < nres; j++)
        if (strstr(res[j].name, "RVQ per-head k=256 K x4 V x2, keys pre-RoPE") &&
            !strstr(res[j].name, "beam"))
            pr = j;
    if (pr >= 0)
        for (int i = 0; i < nres; i++)
            if (res[i].kind == 2 && strncmp(res[i].name, "int4", 4) == 0)
                printf("- pre-RoPE K x4 V x2 (%.2fx, cos %.5f) vs %s (%.2fx, cos %.5f): %s\n",
                       fp16 / res[pr].bytes, res[pr].cos, res[i].name, fp16 / res[i].bytes,
                       res[i].cos, res[pr].cos > res[i].cos ? "RVQ better" : "RVQ NOT better");
    printf("\n");

    /* value SNR against bits per value dimension */
    const double vdims = (double)s.L * (double)s.H * (double)s.D;
    printf("Value SNR against value bits per dimension (Gaussian rate-distortion reference: "
           "6.02 dB per bit per dimension for an i.i.d. Gaussian source):\n\n");
    printf("| values | bits/dim | V rel MSE | V SNR dB | Gaussian reference dB | SNR - "
           "reference dB |\n|---|---|---|---|---|---|\n");
    static const uint32_t vk[3] = {256, 1024, 4096};
    for (int vi = 0; vi < 3; vi++) {
        if (!vk_done[vi])
            continue;
        double lg = 0;
        for (uint32_t kk = vk[vi]; kk > 1; kk >>= 1)
            lg += 1;
        for (int v = 1; v <= 4; v++) {
            const double b = (double)v * lg / (double)s.D;
            printf("| RVQ per-head k=%u V x%d | %.2f | %.4f | %.2f | %.2f | %+.2f |\n",
                   (unsigned)vk[vi], v, b, vrel[vi][v], snr_db(vrel[vi][v]), 6.02 * b,
                   snr_db(vrel[vi][v]) - 6.02 * b);
        }
    }
    for (int i = 0; i < nres; i++) {
        if (res[i].kind != 2)
            continue;
        /* every scalar peer spends the same bytes on keys and on values */
        const double b = res[i].bytes / 2.0 * 8.0 / vdims;
        printf("| %s | %.2f | %.4f | %.2f | %.2f | %+.2f |\n", res[i].name, b, res[i].v_rel,
               snr_db(res[i].v_rel), 6.02 * b, snr_db(res[i].v_rel) - 6.02 * b);
    }
    printf("\n");

    free(tr);
    free(ev);
    free(qs);
    free(rc);
    free(ref);
    lm_free(m);
    return 0;
}

/* ---- GPT-2-small shape, synthetic ----------------------------------------- */

static uint64_t sm64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double gauss(uint64_t *x)
{
    double u1 = ((double)(sm64(x) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(sm64(x) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Rows (f16) of n positions: per (layer, head), x = mean + diag(scale) A z +
 * 0.1 noise with z ~ N(0, I_16); keys get 4 outlier channels per head with a
 * mean of +-8 and scale x6, values none. */
static void gpt2_rows(uint16_t *out, size_t n, int L, int H, int D, uint64_t seed)
{
    enum { R = 16 };
    const size_t nv = (size_t)L * (size_t)H * 2u;
    float *A = xmalloc(nv * (size_t)D * R * sizeof(float));
    float *mu = xmalloc(nv * (size_t)D * sizeof(float));
    float *sc = xmalloc(nv * (size_t)D * sizeof(float));
    uint64_t x = seed;
    for (size_t v = 0; v < nv; v++) {
        const int is_key = (v / (size_t)H) % 2 == 0; /* row order: K heads, then V heads */
        for (int c = 0; c < D; c++) {
            mu[v * (size_t)D + (size_t)c] = (float)(0.2 * gauss(&x));
            sc[v * (size_t)D + (size_t)c] = (float)(0.5 + (double)(sm64(&x) >> 11) / 9007199254740992.0);
            for (int r = 0; r < R; r++)
                A[(v * (size_t)D + (size_t)c) * R + (size_t)r] = (float)(gauss(&x) / sqrt((double)R));
        }
        if (is_key)
            for (int j = 0; j < 4; j++) {
                const size_t c = (size_t)(sm64(&x) % (uint64_t)D);
                mu[v * (size_t)D + c] = (sm64(&x) & 1) ? 8.0f : -8.0f;
                sc[v * (size_t)D + c] *= 6.0f;
            }
    }
    for (size_t p = 0; p < n; p++)
        for (size_t v = 0; v < nv; v++) {
            double z[R];
            for (int r = 0; r < R; r++)
                z[r] = gauss(&x);
            for (int c = 0; c < D; c++) {
                const size_t vc = v * (size_t)D + (size_t)c;
                double a = 0;
                for (int r = 0; r < R; r++)
                    a += (double)A[vc * R + (size_t)r] * z[r];
                const double val = mu[vc] + sc[vc] * a + 0.1 * gauss(&x);
                out[(p * nv + v) * (size_t)D + (size_t)c] = fkvf_f32_to_f16((float)val);
            }
        }
    free(A);
    free(mu);
    free(sc);
}

/* ---- GPT-2-small shape: whole archives through the public writer --------- */

typedef struct membuf {
    uint8_t *data;
    size_t size, cap;
} membuf;

static long long membuf_write(void *opaque, const void *data, size_t size)
{
    membuf *b = opaque;
    if (size > b->cap - b->size) {
        size_t ncap = b->cap ? b->cap : 1u << 16;
        while (ncap - b->size < size)
            ncap *= 2;
        uint8_t *p = realloc(b->data, ncap);
        if (!p)
            return -1;
        b->data = p;
        b->cap = ncap;
    }
    memcpy(b->data + b->size, data, size);
    b->size += size;
    return (long long)size;
}

static void wa_fail(const char *what, const char *msg)
{
    fprintf(stderr, "bench_rd: whole archive: %s failed%s%s\n", what, msg ? ": " : "",
            msg ? msg : "");
    exit(1);
}

#define WA_W(call)                                                                        \
    do {                                                                                  \
        if ((call) != FKVF_OK)                                                            \
            wa_fail(#call, fkvf_writer_message(w));                                       \
    } while (0)

/* Write the codebook file of q to *cb; its content hash to hash. */
static void wa_codebook_file(const fkvf_rvq *q, membuf *cb, uint8_t hash[16])
{
    fkvf_codebook_shape cshape;
    uint32_t heads;
    fkvf_rvq_shape(q, &cshape, &heads);
    const size_t tsz = fkvf_rvq_tables_size(q);
    void *tables = xmalloc(tsz);
    if (fkvf_rvq_tables(q, tables, tsz) != FKVF_OK)
        wa_fail("fkvf_rvq_tables", NULL);
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    wo.sync = FKVF_SYNC_NONE;
    fkvf_sink sk = {membuf_write, NULL, cb};
    fkvf_writer *w = NULL;
    WA_W(fkvf_writer_create_sink(&w, &sk, &wo, NULL));
    WA_W(fkvf_writer_add_codebooks(w, &cshape, tables, tsz, 0));
    WA_W(fkvf_writer_finish(w));
    fkvf_writer_free(w);
    free(tables);
    fkvf_reader *r = NULL;
    if (fkvf_reader_open_memory(&r, cb->data, cb->size, 0, NULL) != FKVF_OK ||
        fkvf_reader_codebook(r, NULL, NULL, NULL, hash) != FKVF_OK)
        wa_fail("reading the codebook file back", r ? fkvf_reader_message(r) : NULL);
    fkvf_reader_free(r);
}

/* Archive of positions 0..n-1: exact rows for the sinks and the recent
 * window, index streams (quad, 8-bit) for the others, codebooks referenced
 * (hash != NULL) or embedded. codes: codes of every position 0.., cpp each. */
static void wa_archive(const fkvf_rvq *q, const uint16_t *rows, size_t rw, const uint16_t *codes,
                       size_t cpp, int L, int H, int D, int ks, int vs, size_t n, int sinks,
                       int recent, const uint8_t *hash, membuf *out)
{
    const size_t na = n - (size_t)sinks - (size_t)recent;
    fkvf_codebook_shape cshape;
    uint32_t heads;
    fkvf_rvq_shape(q, &cshape, &heads);
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    wo.sync = FKVF_SYNC_NONE;
    if (hash)
        wo.required_features = FKVF_FEAT_EXTERNAL_CODEBOOK;
    fkvf_sink sk = {membuf_write, NULL, out};
    fkvf_writer *w = NULL;
    WA_W(fkvf_writer_create_sink(&w, &sk, &wo, NULL));
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = (uint32_t)L;
    d.n_kv_heads = (uint32_t)H;
    d.key_dim = d.value_dim = (uint32_t)D;
    d.dtype = FKVF_DTYPE_F16;
    d.n_sinks = (uint32_t)sinks;
    d.window = (uint32_t)recent;
    WA_W(fkvf_writer_set_desc(w, &d));
    const size_t rb = rw * 2;
    WA_W(fkvf_writer_add_exact(w, 0, (uint64_t)sinks, rows, (size_t)sinks * rb, 0));
    WA_W(fkvf_writer_add_exact(w, n - (size_t)recent, (uint64_t)recent,
                               rows + (n - (size_t)recent) * rw, (size_t)recent * rb, 0));
    if (hash) {
        WA_W(fkvf_writer_add_codebook_ref(w, &cshape, hash, "gpt2-k256-k4v2.fkvf"));
    } else {
        const size_t tsz = fkvf_rvq_tables_size(q);
        void *tables = xmalloc(tsz);
        if (fkvf_rvq_tables(q, tables, tsz) != FKVF_OK)
            wa_fail("fkvf_rvq_tables", NULL);
        WA_W(fkvf_writer_add_codebooks(w, &cshape, tables, tsz, 0));
        free(tables);
    }
    /* all index streams in one segment: codes are one row per position */
    (void)ks;
    (void)vs;
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.profile = FKVF_PROFILE_QUAD;
    sp.symbol_bits = 8;
    WA_W(fkvf_writer_add_index_segment(w, &sp, 0, na, codes + (size_t)sinks * cpp, cpp, 1));
    WA_W(fkvf_writer_set_positions(w, n, na));
    WA_W(fkvf_writer_finish(w));
    fkvf_writer_free(w);
}

/* Open an archive, sum its STRM sections, restore one archived position and
 * compare it with what the quantizer decodes from its codes. */
static uint64_t wa_check(const fkvf_rvq *q, const membuf *a, const membuf *cbfile,
                         const uint16_t *codes, size_t cpp, size_t rw, uint64_t pos,
                         const char *label)
{
    fkvf_reader *r = NULL, *cb = NULL;
    if (fkvf_reader_open_memory(&r, a->data, a->size, 0, NULL) != FKVF_OK)
        wa_fail(label, r ? fkvf_reader_message(r) : "open");
    if (cbfile) {
        if (fkvf_reader_open_memory(&cb, cbfile->data, cbfile->size, 0, NULL) != FKVF_OK ||
            fkvf_reader_attach_codebook(r, cb) != FKVF_OK)
            wa_fail(label, fkvf_reader_message(r));
    }
    fkvf_archive_info info;
    if (fkvf_reader_info(r, &info) != FKVF_OK)
        wa_fail(label, fkvf_reader_message(r));
    uint64_t strm = 0;
    for (size_t i = 0; i < info.n_sections; i++) {
        fkvf_section_info si;
        if (fkvf_reader_section(r, i, &si) != FKVF_OK)
            wa_fail(label, fkvf_reader_message(r));
        if (si.type == FKVF_SECTION_STRM)
            strm += si.stored_size;
    }
    uint16_t *got = xmalloc(rw * 2), *want = xmalloc(rw * 2);
    if (fkvf_reader_restore(r, pos, 1, FKVF_DTYPE_F16, got, rw * 2) != FKVF_OK)
        wa_fail(label, fkvf_reader_message(r));
    if (fkvf_rvq_decode(q, codes + pos * cpp, cpp, 1, 1, pos, NULL, FKVF_DTYPE_F16, want,
                        rw * 2) != FKVF_OK)
        wa_fail(label, "fkvf_rvq_decode");
    if (memcmp(got, want, rw * 2) != 0) {
        fprintf(stderr,
                "bench_rd: whole archive: %s: restored position %llu differs from the decoded "
                "codes\n",
                label, (unsigned long long)pos);
        exit(1);
    }
    free(got);
    free(want);
    fkvf_reader_free(r);
    fkvf_reader_free(cb);
    return strm;
}

/* Whole archives of 1,024 and 8,192 positions of fresh synthetic rows, with
 * the codebook q (K x ks, V x vs, k = 256) trained by run_gpt2. */
static void wa_run(const fkvf_rvq *q, int L, int H, int D, int ks, int vs, const opts *o)
{
    static const size_t sizes[] = {1024, 8192};
    const size_t nmax = 8192;
    const size_t rw = (size_t)L * (size_t)H * 2u * (size_t)D;
    const int sinks = 4, recent = 32;
    const size_t cpp = fkvf_rvq_codes_per_position(q);
    const double t0 = now();
    uint16_t *rows = xmalloc(nmax * rw * 2);
    gpt2_rows(rows, nmax, L, H, D, o->seed * 7919u + 3u);
    uint16_t *codes = xmalloc(nmax * cpp * sizeof *codes);
    fkvf_rows rr = {rows, nmax, FKVF_DTYPE_F16, 0};
    if (fkvf_rvq_encode(q, &rr, NULL, 1, codes, cpp, 1) != FKVF_OK)
        wa_fail("fkvf_rvq_encode", NULL);
    membuf cb = {0};
    uint8_t hash[16];
    wa_codebook_file(q, &cb, hash);
    printf("Whole archive (public writer, in memory): exact rows for %d sinks + %d recent "
           "positions, every other position archived with the K x%d V x%d k = 256 codebook "
           "above (greedy, quad 8-bit index streams, all of them in one STRM segment, spec 11.2); "
           "(a) codebook referenced by content hash (CBRF), the codebook file shared, not "
           "counted; (b) codebooks embedded (CBK1, f16). Rows: a fresh synthetic sequence "
           "(positions 0..N-1 of %zu). Each archive was opened and one archived position "
           "restored and compared with the decoded codes.\n\n",
           sinks, recent, ks, vs, nmax);
    printf("| positions | fp16 bytes | (a) archive bytes, shared codebook | (a) vs fp16 | "
           "(b) archive bytes, embedded | (b) vs fp16 | codebook file bytes | index bytes "
           "per archived position (STRM) |\n|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const size_t n = sizes[i], na = n - (size_t)sinks - (size_t)recent;
        const double fp = (double)n * (double)rw * 2.0;
        membuf a = {0}, b = {0};
        wa_archive(q, rows, rw, codes, cpp, L, H, D, ks, vs, n, sinks, recent, hash, &a);
        wa_archive(q, rows, rw, codes, cpp, L, H, D, ks, vs, n, sinks, recent, NULL, &b);
        const uint64_t pos = (uint64_t)sinks + na / 2;
        const uint64_t sa = wa_check(q, &a, &cb, codes, cpp, rw, pos, "(a) shared codebook");
        const uint64_t sb = wa_check(q, &b, NULL, codes, cpp, rw, pos, "(b) embedded codebook");
        if (sa != sb)
            wa_fail("STRM sizes of (a) and (b) agree", NULL);
        printf("| %zu | %.0f | %zu | %.1fx | %zu | %.2fx | %zu | %.1f |\n", n, fp, a.size,
               fp / (double)a.size, b.size, fp / (double)b.size, cb.size,
               (double)sa / (double)na);
        free(a.data);
        free(b.data);
    }
    printf("\n(rows, encoding and archives: %.1f s wall)\n\n", now() - t0);
    free(cb.data);
    free(codes);
    free(rows);
}

static int run_gpt2(const opts *o)
{
    const int L = 12, H = 12, D = 64;
    const size_t n = o->gpt2_positions, ntr = o->gpt2_train;
    const size_t rw = (size_t)L * (size_t)H * 2u * (size_t)D; /* elements per row */
    const double fp16 = (double)rw * 2.0;
    uint16_t *tr = xmalloc(ntr * rw * 2);
    uint16_t *ev = xmalloc(n * rw * 2);
    gpt2_rows(tr, ntr, L, H, D, o->seed * 7919u + 1u);
    gpt2_rows(ev, n, L, H, D, o->seed * 7919u + 2u);

    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = (uint32_t)L;
    p.n_kv_heads = (uint32_t)H;
    p.key_dim = p.value_dim = (uint32_t)D;
    p.k = 256;
    p.k_stages = 4;
    p.v_stages = 2;
    p.seed = o->seed;
    p.max_iters = o->gpt2_iters;
    fkvf_rows blk = {tr, ntr, FKVF_DTYPE_F16, 0};
    fkvf_rvq *q = NULL;
    double t0 = now(), c0 = cpu_now();
    if (fkvf_rvq_train(&q, &p, &blk, 1, NULL) != FKVF_OK) {
        fprintf(stderr, "bench_rd: GPT-2 training failed\n");
        return 1;
    }
    const double t_train = now() - t0, c_train = cpu_now() - c0;
    const size_t cpp = fkvf_rvq_codes_per_position(q);
    uint16_t *codes = xmalloc(n * cpp * sizeof *codes);
    uint16_t *dec = xmalloc(n * rw * 2);
    fkvf_rows rows = {ev, n, FKVF_DTYPE_F16, 0};
    double enc_best = INFINITY, dec_best = INFINITY, enc_cpu = INFINITY, dec_cpu = INFINITY;
    /* decode of the same codes with keys rotated back (what a pre-RoPE
     * archive costs; the tables here were trained on keys as-is, so only
     * the time means something), and memcpy of the same f16 bytes */
    static const fkvf_rope rope64[2] = {{2, 64, 10000.0}, {1, 64, 10000.0}};
    double rdec_best[2] = {INFINITY, INFINITY}, rdec_cpu[2] = {INFINITY, INFINITY};
    double mc_best = INFINITY, mc_cpu = INFINITY;
    uint16_t *mc_src = xmalloc(n * rw * 2);
    memcpy(mc_src, ev, n * rw * 2);
    for (int rep = 0; rep < 3; rep++) {
        t0 = now();
        c0 = cpu_now();
        if (fkvf_rvq_encode(q, &rows, NULL, 1, codes, cpp, 1) != FKVF_OK)
            return 1;
        double dt = now() - t0, dc = cpu_now() - c0;
        if (dt < enc_best)
            enc_best = dt;
        if (dc < enc_cpu)
            enc_cpu = dc;
    }
    /* decode: the three variants and memcpy interleaved, best of 5 each */
    for (int rep = 0; rep < 5; rep++) {
        double dt, dc;
        t0 = now();
        c0 = cpu_now();
        if (fkvf_rvq_decode(q, codes, cpp, 1, n, 0, NULL, FKVF_DTYPE_F16, dec, n * rw * 2) !=
            FKVF_OK)
            return 1;
        dt = now() - t0;
        dc = cpu_now() - c0;
        if (dt < dec_best)
            dec_best = dt;
        if (dc < dec_cpu)
            dec_cpu = dc;
        for (int ri = 0; ri < 2; ri++) {
            t0 = now();
            c0 = cpu_now();
            if (fkvf_rvq_decode(q, codes, cpp, 1, n, 0, &rope64[ri], FKVF_DTYPE_F16, dec,
                                n * rw * 2) != FKVF_OK)
                return 1;
            dt = now() - t0;
            dc = cpu_now() - c0;
            if (dt < rdec_best[ri])
                rdec_best[ri] = dt;
            if (dc < rdec_cpu[ri])
                rdec_cpu[ri] = dc;
        }
        for (int mr = 0; mr < 2; mr++) {
            t0 = now();
            c0 = cpu_now();
            memcpy(dec, mc_src, n * rw * 2);
            dt = now() - t0;
            dc = cpu_now() - c0;
            if (dt < mc_best)
                mc_best = dt;
            if (dc < mc_cpu)
                mc_cpu = dc;
        }
    }
    free(mc_src);
    /* the quality figures below are of the as-is decode */
    if (fkvf_rvq_decode(q, codes, cpp, 1, n, 0, NULL, FKVF_DTYPE_F16, dec, n * rw * 2) !=
        FKVF_OK)
        return 1;
    double kn = 0, ke = 0, vn = 0, ve = 0;
    const size_t HD = (size_t)H * (size_t)D;
    for (size_t i = 0; i < n; i++)
        for (int l = 0; l < L; l++)
            for (size_t j = 0; j < 2 * HD; j++) {
                const size_t o2 = i * rw + (size_t)l * 2 * HD + j;
                const double a = fkvf_f16_to_f32(ev[o2]), b = fkvf_f16_to_f32(dec[o2]);
                if (j < HD) {
                    kn += a * a;
                    ke += (a - b) * (a - b);
                } else {
                    vn += a * a;
                    ve += (a - b) * (a - b);
                }
            }
    const double bytes = (double)cpp * 8.0 / 8.0;
    printf("## GPT-2-small shape (synthetic, 12 layers x 12 heads x 64 dims)\n\n");
    printf("Generator: per (layer, head) x = mean + diag(scale) A z + 0.1 noise, z ~ N(0, I16); "
           "keys have 4 outlier channels per head (mean +-8, scale x6). f16 rows.\n");
    printf("K x4 V x2, k = 256, per-head, keys as-is, greedy; trained on %zu positions "
           "(max_iters %u); evaluated on %zu other positions. Timings: one thread, best of 3 "
           "(encode) or 5 (decode) runs, wall clock and CPU time of the thread (the machine may "
           "be shared).\n\n",
           ntr, o->gpt2_iters, n);
    printf("| figure | value |\n|---|---|\n");
    printf("| index bytes per archived position | %.0f |\n", bytes);
    printf("| ratio vs fp16 (%.0f bytes) | %.1fx |\n", fp16, fp16 / bytes);
    printf("| training (%zu positions, one thread) | %.1f s wall, %.1f s CPU |\n", ntr, t_train,
           c_train);
    printf("| encode, greedy (%zu positions, best of 3) | %.0f positions/s wall, %.0f per "
           "CPU-second |\n",
           n, (double)n / enc_best, (double)n / enc_cpu);
    const double ob = (double)n * fp16;
    printf("| memcpy of the same f16 bytes (%.1f MB, best of 10) | %.2f GB/s wall, %.2f per "
           "CPU-second |\n",
           ob * 1e-6, ob / mc_best * 1e-9, ob / mc_cpu * 1e-9);
    printf("| decode to f16, keys as-is (best of 5) | %.2f GB/s of f16 output wall, %.2f per "
           "CPU-second; %.1fx the memcpy time (wall), %.1fx (CPU) |\n",
           ob / dec_best * 1e-9, ob / dec_cpu * 1e-9, dec_best / mc_best, dec_cpu / mc_cpu);
    static const char *const rname[2] = {"half-split", "interleaved"};
    for (int ri = 0; ri < 2; ri++)
        printf("| decode to f16, keys pre-RoPE (%s, 64 dims, theta 10000; best of 5) | %.2f GB/s "
               "of f16 output wall, %.2f per CPU-second; %.1fx the memcpy time (wall), %.1fx "
               "(CPU) |\n",
               rname[ri], ob / rdec_best[ri] * 1e-9, ob / rdec_cpu[ri] * 1e-9,
               rdec_best[ri] / mc_best, rdec_cpu[ri] / mc_cpu);
    printf("| key rel MSE / SNR (held out) | %.4f / %.2f dB |\n", ke / kn, snr_db(ke / kn));
    printf("| value rel MSE / SNR (held out) | %.4f / %.2f dB |\n\n", ve / vn, snr_db(ve / vn));
    wa_run(q, L, H, D, 4, 2, o);
    free(codes);
    free(dec);
    free(tr);
    free(ev);
    fkvf_rvq_free(q);
    return 0;
}

static int parse_uint(const char *s, unsigned long long min, unsigned long long max,
                      unsigned long long *out)
{
    char *end;
    if (!s || !*s)
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    opts o = {BENCH_RD_MODEL, 16, 8, 512, 1, 25, 8, 4, 32, 1, 1, 1, 1024, 1024, 4, 1, 128, 10};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        unsigned long long v = 0;
        int bad = 0;
#define NUM(flag, field, lo, hi)                                                          \
    else if (strcmp(a, flag) == 0)                                                        \
    {                                                                                     \
        bad = i + 1 >= argc || parse_uint(argv[i + 1], lo, hi, &v) != 0;                 \
        if (!bad)                                                                         \
            o.field = v;                                                                  \
        i++;                                                                              \
    }
        if (strcmp(a, "--model") == 0 && i + 1 < argc)
            o.model = argv[++i];
        NUM("--train", n_train, 1, 4096)
        NUM("--eval", n_eval, 1, 4096)
        NUM("--tokens", tokens, 1, 1u << 20)
        NUM("--seed", seed, 0, UINT64_MAX)
        NUM("--iters", iters, 1, 1000)
        NUM("--beam", beam, 2, FKVF_RVQ_MAX_BEAM)
        NUM("--sinks", sinks, 0, 1u << 20)
        NUM("--recent", recent, 0, 1u << 20)
        NUM("--gpt2-positions", gpt2_positions, 1, 1u << 20)
        NUM("--gpt2-train", gpt2_train, 1, 1u << 20)
        NUM("--gpt2-iters", gpt2_iters, 1, 1000)
        NUM("--train4096", n_train4096, 1, 4096)
        NUM("--iters4096", iters4096, 1, 1000)
        else if (strcmp(a, "--no-k1024") == 0) o.k1024 = 0;
        else if (strcmp(a, "--no-k4096") == 0) o.k4096 = 0;
        else if (strcmp(a, "--no-real") == 0) o.real = 0;
        else if (strcmp(a, "--no-gpt2") == 0) o.gpt2 = 0;
        else bad = 1;
#undef NUM
        if (bad) {
            fprintf(stderr,
                    "usage: bench_rd [--model PATH] [--train N] [--eval N] [--tokens T] "
                    "[--seed S] [--iters N] [--beam W] [--sinks S] [--recent W] [--no-k1024] "
                    "[--no-k4096] [--train4096 N] [--iters4096 N] "
                    "[--no-real] [--no-gpt2] [--gpt2-positions N] [--gpt2-train N] "
                    "[--gpt2-iters N]\n");
            return 2;
        }
    }
    int rc = 0;
    if (o.real)
        rc |= run_real(&o);
    if (o.gpt2)
        rc |= run_gpt2(&o);
    return rc;
}
