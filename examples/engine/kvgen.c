/* kvgen: produce real KV caches from the tiny model in ../shared/models.
 *
 * usage: kvgen [--model PATH | PATH] [--seqs S] [--tokens T] [--seed N]
 *              [--temperature X] [--out DIR | --no-write] [--verbose]
 *        kvgen [--model PATH | PATH] --check
 *
 * Generation: for each sequence s = 0..S-1 a PRNG (splitmix64, lm_rng) is
 * seeded with seed + s; starting from BOS (id 1) at position 0, the engine runs
 * the token at position p, samples the next token from softmax(logits / X),
 * and feeds it at p + 1, for p = 0..T-1. So the cache holds T positions and
 * there are T sampled tokens, the last one sampled from the logits at position
 * T-1 (it is never run). The printed mean NLL is over all S * T samples
 * (-log p of each sampled token, natural log, log-softmax in double, at
 * temperature 1 whatever X is). Defaults: S = 64, T = 512, seed 1, X = 1.0,
 * DIR = kvgen-out, model = <source dir>/../shared/models/stories260K.bin.
 *
 * --check: greedy decoding from BOS for 65 steps; prints the first 64 ids and
 * the mean NLL of the 65 picks, and exits 0 only if the ids equal the 64 in
 * the model README and the NLL rounds to 0.8781 (exit 1 otherwise).
 *
 * ---- Output file format (one file per sequence: DIR/seq-NNNN.kvc) ------------
 * Everything little-endian. A 64-byte header:
 *   off size
 *    0   8  magic "KVGENRAW"
 *    8   4  u32 version = 1
 *   12   4  u32 header_size = 64 (the arrays start here)
 *   16   4  u32 n_layers
 *   20   4  u32 n_kv_heads
 *   24   4  u32 head_dim
 *   28   4  u32 n_positions (T)
 *   32   4  u32 dtype = 1 (f32, IEEE 754 binary32) for every tensor array
 *   36   4  u32 vocab_size
 *   40   4  f32 rope_theta (10000)
 *   44   4  f32 sampling temperature
 *   48   8  u64 PRNG seed of this sequence (base seed + sequence index)
 *   56   4  u32 sequence index
 *   60   4  u32 reserved, 0
 * Then, with P = n_positions, G = n_kv_heads, D = head_dim:
 *   tokens  u32[P + 1]  tokens[p] is the token run at position p (tokens[0] = 1,
 *                       BOS); tokens[P] is the token sampled after the last
 *                       position. tokens[p + 1] was sampled from the logits at p.
 *   nll     f32[P]      nll[p] = -log softmax(logits at p)[tokens[p + 1]]
 *   for each layer l = 0 .. n_layers-1, three arrays of f32[G][P][D]:
 *     K       keys as cached: after RoPE
 *     K_pre   the same keys before RoPE (the raw wk . x)
 *     V       values
 * File size = 64 + 4 (P + 1) + 4 P + 12 n_layers G P D bytes.
 * RoPE as applied: for each head, each even i < D, the pair (k[i], k[i+1]) is
 * rotated by the angle p / rope_theta^(i / D) at position p.
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

#include "model.h"

#ifndef LM_DEFAULT_MODEL
#define LM_DEFAULT_MODEL "../shared/models/stories260K.bin"
#endif

#define KVG_HEADER_SIZE 64
#define KVG_VERSION 1
#define KVG_DTYPE_F32 1

static const int check_ids[64] = {
    461, 461, 401, 401, 401, 461, 378, 455, 473, 456, 435, 299, 362, 409, 283, 264,
    283, 452, 288, 13,  431, 431, 431, 431, 431, 431, 431, 431, 431, 431, 431, 431,
    431, 293, 430, 417, 363, 416, 315, 342, 418, 424, 400, 442, 402, 303, 266, 299,
    374, 466, 396, 303, 271, 362, 390, 469, 306, 469, 423, 314, 347, 305, 356, 333,
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvgen [--model PATH | PATH] [--seqs S] [--tokens T] [--seed N]\n"
            "             [--temperature X] [--out DIR | --no-write] [--verbose]\n"
            "       kvgen [--model PATH | PATH] --check\n"
            "default model: %s\n",
            LM_DEFAULT_MODEL);
}

/* ---- little-endian output ------------------------------------------------------ */

typedef struct out_file {
    FILE *f;
    const char *path;
    int failed;
    unsigned char buf[8192];
    size_t n;
} out_file;

static void out_flush(out_file *o)
{
    if (o->n && !o->failed && fwrite(o->buf, 1, o->n, o->f) != o->n)
        o->failed = 1;
    o->n = 0;
}

static void out_bytes(out_file *o, const void *p, size_t n)
{
    const unsigned char *b = p;
    while (n) {
        if (o->n == sizeof o->buf)
            out_flush(o);
        size_t k = sizeof o->buf - o->n;
        if (k > n)
            k = n;
        memcpy(o->buf + o->n, b, k);
        o->n += k;
        b += k;
        n -= k;
    }
}

static void out_u32(out_file *o, uint32_t v)
{
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8),
                          (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
    out_bytes(o, b, 4);
}

static void out_u64(out_file *o, uint64_t v)
{
    out_u32(o, (uint32_t)v);
    out_u32(o, (uint32_t)(v >> 32));
}

static void out_f32(out_file *o, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    out_u32(o, u);
}

/* ---- generation ---------------------------------------------------------------- */

typedef struct gen_opts {
    int seqs, tokens, write, verbose;
    uint64_t seed;
    double temperature;
    const char *out_dir;
} gen_opts;

static int write_sequence(const lm_state *st, const gen_opts *o, int index, uint64_t seed,
                          const int *tokens, const float *nll)
{
    const lm_config *c = lm_model_config(lm_state_model(st));
    const int P = o->tokens, cap = lm_state_capacity(st);
    size_t plen = strlen(o->out_dir) + 32;
    char *path = malloc(plen);
    if (!path) {
        fprintf(stderr, "kvgen: out of memory\n");
        return -1;
    }
    snprintf(path, plen, "%s/seq-%04d.kvc", o->out_dir, index);
    out_file *of = calloc(1, sizeof *of);
    if (!of) {
        free(path);
        fprintf(stderr, "kvgen: out of memory\n");
        return -1;
    }
    of->path = path;
    of->f = fopen(path, "wb");
    if (!of->f) {
        fprintf(stderr, "kvgen: %s: cannot create: %s\n", path, strerror(errno));
        free(of);
        free(path);
        return -1;
    }
    out_bytes(of, "KVGENRAW", 8);
    out_u32(of, KVG_VERSION);
    out_u32(of, KVG_HEADER_SIZE);
    out_u32(of, (uint32_t)c->n_layers);
    out_u32(of, (uint32_t)c->n_kv_heads);
    out_u32(of, (uint32_t)c->head_size);
    out_u32(of, (uint32_t)P);
    out_u32(of, KVG_DTYPE_F32);
    out_u32(of, (uint32_t)c->vocab_size);
    out_f32(of, (float)LM_ROPE_THETA);
    out_f32(of, (float)o->temperature);
    out_u64(of, seed);
    out_u32(of, (uint32_t)index);
    out_u32(of, 0);
    for (int p = 0; p <= P; p++)
        out_u32(of, (uint32_t)tokens[p]);
    for (int p = 0; p < P; p++)
        out_f32(of, nll[p]);
    static const int kinds[3] = {LM_KEY, LM_KEY_PREROPE, LM_VALUE};
    for (int l = 0; l < c->n_layers; l++)
        for (int k = 0; k < 3; k++) {
            const float *base = lm_cache_data(st, l, kinds[k]);
            for (int g = 0; g < c->n_kv_heads; g++) {
                const float *row = base + (size_t)g * (size_t)cap * (size_t)c->head_size;
                for (size_t i = 0; i < (size_t)P * (size_t)c->head_size; i++)
                    out_f32(of, row[i]);
            }
        }
    out_flush(of);
    int rc = 0;
    if (fclose(of->f) != 0 || of->failed) {
        fprintf(stderr, "kvgen: %s: write error\n", path);
        rc = -1;
    }
    free(of);
    free(path);
    return rc;
}

static int generate(const lm_model *m, const gen_opts *o)
{
    const lm_config *c = lm_model_config(m);
    lm_state *st = lm_state_new(m, o->tokens);
    int *tokens = malloc(((size_t)o->tokens + 1) * sizeof(int));
    float *nll = malloc((size_t)o->tokens * sizeof(float));
    if (!st || !tokens || !nll) {
        fprintf(stderr, "kvgen: out of memory\n");
        lm_state_free(st);
        free(tokens);
        free(nll);
        return 1;
    }
    if (o->write && mkdir(o->out_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "kvgen: %s: cannot create directory: %s\n", o->out_dir,
                strerror(errno));
        lm_state_free(st);
        free(tokens);
        free(nll);
        return 1;
    }
    double t0 = now_seconds(), total = 0.0, write_time = 0.0;
    int rc = 0;
    for (int s = 0; s < o->seqs && rc == 0; s++) {
        uint64_t seed = o->seed + (uint64_t)s;
        lm_rng rng;
        lm_rng_seed(&rng, seed);
        tokens[0] = LM_BOS;
        double seq_total = 0.0;
        for (int p = 0; p < o->tokens; p++) {
            const float *logits = lm_forward(st, tokens[p], p);
            if (!logits) {
                fprintf(stderr, "kvgen: forward pass refused position %d\n", p);
                rc = 1;
                break;
            }
            int next = lm_sample(logits, c->vocab_size, o->temperature, &rng);
            double e = lm_nll(logits, c->vocab_size, next);
            tokens[p + 1] = next;
            nll[p] = (float)e;
            seq_total += e;
        }
        if (rc)
            break;
        total += seq_total;
        if (o->verbose)
            printf("seq %d seed %llu: mean NLL %.4f\n", s, (unsigned long long)seed,
                   seq_total / o->tokens);
        if (o->write) {
            double w0 = now_seconds();
            if (write_sequence(st, o, s, seed, tokens, nll) != 0)
                rc = 1;
            write_time += now_seconds() - w0;
        }
    }
    double dt = now_seconds() - t0;
    if (rc == 0) {
        double mean = total / ((double)o->seqs * (double)o->tokens);
        printf("kvgen: %d sequences x %d positions, seed %llu, temperature %g: "
               "mean NLL %.4f (perplexity %.3f)\n",
               o->seqs, o->tokens, (unsigned long long)o->seed, o->temperature, mean,
               exp(mean));
        printf("kvgen: %.2f s (%.0f tokens/s forward+sample%s)\n", dt,
               (double)o->seqs * o->tokens / (dt - write_time),
               o->write ? "; files written" : "");
        if (o->write)
            printf("kvgen: wrote %s/seq-0000.kvc .. seq-%04d.kvc\n", o->out_dir,
                   o->seqs - 1);
    }
    lm_state_free(st);
    free(tokens);
    free(nll);
    return rc;
}

static int check(const lm_model *m)
{
    const lm_config *c = lm_model_config(m);
    enum { STEPS = 65 };
    if (c->seq_len < STEPS) {
        fprintf(stderr, "kvgen: --check needs seq_len >= %d\n", STEPS);
        return 1;
    }
    lm_state *st = lm_state_new(m, STEPS);
    if (!st) {
        fprintf(stderr, "kvgen: out of memory\n");
        return 1;
    }
    int ids[STEPS];
    double total = 0.0;
    int tok = LM_BOS;
    for (int p = 0; p < STEPS; p++) {
        const float *logits = lm_forward(st, tok, p);
        if (!logits) { /* cannot happen with a validated model */
            lm_state_free(st);
            return 1;
        }
        tok = lm_argmax(logits, c->vocab_size);
        total += lm_nll(logits, c->vocab_size, tok);
        ids[p] = tok;
    }
    lm_state_free(st);
    double mean = total / STEPS;
    int mismatch = -1;
    for (int i = 0; i < 64; i++) {
        printf("%d%s", ids[i], i % 20 == 19 || i == 63 ? "\n" : " ");
        if (mismatch < 0 && ids[i] != check_ids[i])
            mismatch = i;
    }
    printf("65th id: %d\n", ids[64]);
    printf("mean NLL over %d greedy picks: %.6f (README: 0.8781)\n", STEPS, mean);
    char buf[32];
    snprintf(buf, sizeof buf, "%.4f", mean);
    int ok = mismatch < 0 && strcmp(buf, "0.8781") == 0;
    if (mismatch >= 0)
        printf("check: FAILED: id %d is %d, README has %d\n", mismatch, ids[mismatch],
               check_ids[mismatch]);
    else if (!ok)
        printf("check: FAILED: mean NLL %s, README has 0.8781\n", buf);
    else
        printf("check: OK (64 ids match, mean NLL %s)\n", buf);
    return ok ? 0 : 1;
}

/* ---- arguments ------------------------------------------------------------------ */

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int is_value_option(const char *a)
{
    static const char *const opts[] = {"--model", "--out", "-o", "--seqs", "--tokens",
                                       "--seed", "--temperature"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if (!strcmp(a, opts[i]))
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL;
    int do_check = 0;
    gen_opts o = {64, 512, 1, 0, 1, 1.0, "kvgen-out"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        long v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--check")) {
            do_check = 1;
        } else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            o.verbose = 1;
        } else if (!strcmp(a, "--no-write")) {
            o.write = 0;
        } else if (is_value_option(a) && !val) {
            fprintf(stderr, "kvgen: %s needs a value\n", a);
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--model")) {
            model_path = val;
            i++;
        } else if (!strcmp(a, "--out") || !strcmp(a, "-o")) {
            o.out_dir = val;
            i++;
        } else if (!strcmp(a, "--seqs")) {
            if (parse_int(val, 1, 1000000, &v)) {
                fprintf(stderr, "kvgen: --seqs %s: expected 1..1000000\n", val);
                return 2;
            }
            o.seqs = (int)v;
            i++;
        } else if (!strcmp(a, "--tokens")) {
            if (parse_int(val, 1, LM_MAX_SEQ_LEN, &v)) {
                fprintf(stderr, "kvgen: --tokens %s: expected a positive count\n", val);
                return 2;
            }
            o.tokens = (int)v;
            i++;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(val, &end, 0);
            if (errno || end == val || *end || val[0] == '-') {
                fprintf(stderr, "kvgen: --seed %s: expected an unsigned integer\n", val);
                return 2;
            }
            o.seed = (uint64_t)s;
            i++;
        } else if (!strcmp(a, "--temperature")) {
            char *end;
            errno = 0;
            double t = strtod(val, &end);
            if (errno || end == val || *end || !(t >= 0.0) || !isfinite(t)) {
                fprintf(stderr, "kvgen: --temperature %s: expected a number >= 0\n", val);
                return 2;
            }
            o.temperature = t;
            i++;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "kvgen: unknown option %s\n", a);
            usage(stderr);
            return 2;
        } else if (!model_path) {
            model_path = a;
        } else {
            fprintf(stderr, "kvgen: unexpected argument %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!model_path)
        model_path = LM_DEFAULT_MODEL;

    char err[512];
    lm_model *m = lm_load(model_path, err, sizeof err);
    if (!m) {
        fprintf(stderr, "kvgen: %s\n", err);
        return 1;
    }
    const lm_config *c = lm_model_config(m);
    int rc;
    if (do_check) {
        rc = check(m);
    } else if (o.tokens > c->seq_len) {
        fprintf(stderr, "kvgen: --tokens %d exceeds the model's seq_len %d\n", o.tokens,
                c->seq_len);
        rc = 2;
    } else {
        rc = generate(m, &o);
    }
    lm_free(m);
    return rc;
}
