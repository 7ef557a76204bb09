/* fkvf-rehydrate: selective rehydration (issue 19 C.10; results in
 * docs/retrieval-study.md). What does attention lose when it sees the exact
 * window plus only the m archived positions a retrieval rule picks?
 *
 * Each evaluation sequence (sampled with the exact cache, or a text's bytes:
 * study.h) is teacher-forced again for every rule and m with the example
 * engine's attention hooks (lm_forward_hooked): at step t, for every layer
 * and query head, the archived positions (sinks .. t - recent, as in
 * fkvf-quality) are hidden from the softmax except the at most m the rule
 * picks (retrieval.h) from that head's own query; the sinks, the recent
 * positions and the picked ones are attended with their exact rows. The rules
 * run on the hooked run's own state: its keys, its symbol indices, the
 * attention it paid (H2O). Also run: the full cache (every position seen,
 * the baseline) and the window alone (m = 0). Printed: the perplexity change
 * against the full cache over all predictions, and the mean NLL change a
 * prediction with its standard error over sequences.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"
#include "retrieval.h"
#include "study.h"

#ifndef LM_DEFAULT_MODEL
#define LM_DEFAULT_MODEL "../shared/models/stories260K.bin"
#endif

#define PROG "fkvf-rehydrate"
#define MAX_M 8

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--model PATH] [--seqs S] [--tokens T] [--sinks S] [--recent W]\n"
            "                      [--m M]... [--rule NAME]... [--seed X] [--train N] [--k K]\n"
            "                      [--stages S] [--cand C] [--chunk P]\n"
            "                      [--text FILE [--eval-bytes A:B] [--train-bytes A:B]]\n"
            "  --seqs S      evaluation sequences (16)\n"
            "  --tokens T    positions per sequence, BOS included (512; at most the model's)\n"
            "  --sinks S     exact sink positions (4); --recent W exact recent positions (32)\n"
            "  --m M         archived positions attention may see (repeatable, at most %d;\n"
            "                default 16, 32, 64, 128)\n"
            "  --rule NAME   run only this rule (repeatable): suffix, successors, recent,\n"
            "                random, norm, h2o, keysym0, keysym, keysym0-pre, keysym-pre,\n"
            "                oracle (default: all)\n"
            "  --seed X      sampled sequence i is seeded X * 1000003 + 10000 + i, as\n"
            "                fkvf-quality's evaluation sequences (1)\n"
            "  --train N     the key-symbol rules' codebooks are trained on N sequences (16;\n"
            "                0: no key-symbol rules)\n"
            "  --k K         centroids a stage (256); --stages S key stages (4)\n"
            "  --cand C      the refined key-symbol rules rank C * m candidates (4)\n"
            "  --chunk P     the pre-RoPE key-symbol rules score centroids per chunk of P\n"
            "                archived positions (0: the whole range, one chunk) (0)\n"
            "  --text FILE   the sequences are FILE's bytes (BOS, then id 3 + byte) from\n"
            "                --eval-bytes A:B (default: the last tenth); training\n"
            "                sequences from --train-bytes A:B (default: the first 9/10)\n"
            "default model: %s\n",
            MAX_M, LM_DEFAULT_MODEL);
}

static const char *const rule_keys[RT_COUNT] = {
    "suffix", "successors", "recent", "random", "norm", "h2o",
    "keysym0", "keysym", "keysym0-pre", "keysym-pre", "oracle",
};

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    return p;
}

typedef struct hook_ctx {
    rt_ctx *rt;
    int rule, m; /* m = 0: the window alone */
    int sinks, recent;
    int *pick;   /* scratch: m */
    double *att; /* scratch: T */
} hook_ctx;

static void select_rows(void *u, const lm_state *s, int layer, int head, const float *q,
                        int pos, unsigned char *visible)
{
    hook_ctx *c = u;
    const int lo = c->sinks, hi = pos - c->recent;
    if (hi < lo)
        return;
    for (int p = lo; p <= hi; p++)
        visible[p] = 0;
    if (c->m == 0)
        return;
    const int n = rt_pick(c->rt, (rt_rule)c->rule, s, layer, head, q, pos, c->m, c->pick, NULL);
    if (n < 0) {
        fprintf(stderr, PROG ": rt_pick failed (%s)\n", rt_rule_names[c->rule]);
        exit(1);
    }
    for (int i = 0; i < n; i++)
        visible[c->pick[i]] = 1;
}

static void attended(void *u, int layer, int head, int pos, const float *att, float sum)
{
    hook_ctx *c = u;
    for (int p = 0; p <= pos; p++)
        c->att[p] = (double)att[p] / (double)sum;
    rt_observe(c->rt, layer, head, pos, c->att);
}

/* the summed NLL of tokens[1..T) teacher-forced with hooks (NULL: the full
 * cache) */
static double run_hooked(const lm_model *mdl, const int *tok, int T, const lm_hooks *hk,
                         rt_ctx *rt)
{
    const int V = lm_model_config(mdl)->vocab_size;
    lm_state *st = lm_state_new(mdl, T);
    if (!st) {
        fprintf(stderr, PROG ": lm_state_new failed\n");
        exit(1);
    }
    if (rt)
        rt_begin(rt, tok);
    double sum = 0;
    for (int p = 0; p < T; p++) {
        const float *logits = lm_forward_hooked(st, tok[p], p, hk);
        if (!logits) {
            fprintf(stderr, PROG ": lm_forward failed\n");
            exit(1);
        }
        if (p + 1 < T)
            sum += lm_nll(logits, V, tok[p + 1]);
        if (rt)
            rt_add(rt, st, p);
    }
    lm_state_free(st);
    return sum;
}

/* the mean over sequences of the NLL change a prediction (v against full,
 * sums of npred predictions each), its standard error into *se */
static double change(const double *v, const double *full, int S, double npred, double *se)
{
    double d = 0, dd = 0;
    for (int i = 0; i < S; i++) {
        const double x = (v[i] - full[i]) / npred;
        d += x;
        dd += x * x;
    }
    d /= (double)S;
    const double var = S > 1 ? (dd - (double)S * d * d) / (double)(S - 1) : 0;
    *se = sqrt(var > 0 ? var : 0) / sqrt((double)S);
    return d;
}

int main(int argc, char **argv)
{
    const char *model = LM_DEFAULT_MODEL, *text_path = NULL, *eval_range = NULL;
    const char *train_range = NULL;
    long S = 16, T = 512, sinks = 4, recent = 32, seed = 1, n_train = 16, k = 256, stages = 4;
    long cand = 4, chunk = 0;
    long ms[MAX_M];
    int n_m = 0, want[RT_COUNT] = {0}, n_want = 0;
    for (int i = 1; i < argc; i += 2) { /* every option takes a value, but --help */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long *target = NULL, lo = 1, hi = 1000000;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!v) {
            usage(stderr);
            return 2;
        } else if (!strcmp(a, "--model")) {
            model = v;
        } else if (!strcmp(a, "--text")) {
            text_path = v;
        } else if (!strcmp(a, "--eval-bytes")) {
            eval_range = v;
        } else if (!strcmp(a, "--train-bytes")) {
            train_range = v;
        } else if (!strcmp(a, "--rule")) {
            int found = 0;
            for (int r = 0; r < RT_COUNT; r++)
                if (!strcmp(v, rule_keys[r])) {
                    n_want += !want[r];
                    want[r] = found = 1;
                }
            if (!found) {
                fprintf(stderr, PROG ": unknown rule %s (see --help)\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--seqs")) {
            target = &S;
        } else if (!strcmp(a, "--tokens")) {
            target = &T;
            lo = 2;
        } else if (!strcmp(a, "--sinks")) {
            target = &sinks;
            lo = 0;
        } else if (!strcmp(a, "--recent")) {
            target = &recent;
        } else if (!strcmp(a, "--seed")) {
            target = &seed;
            lo = 0;
        } else if (!strcmp(a, "--train")) {
            target = &n_train;
            lo = 0;
        } else if (!strcmp(a, "--k")) {
            target = &k;
            lo = 16;
            hi = 4096;
        } else if (!strcmp(a, "--stages")) {
            target = &stages;
            hi = 16;
        } else if (!strcmp(a, "--cand")) {
            target = &cand;
            hi = 64;
        } else if (!strcmp(a, "--chunk")) {
            target = &chunk;
            lo = 0;
        } else if (!strcmp(a, "--m") && n_m < MAX_M) {
            target = &ms[n_m++];
        } else {
            usage(stderr);
            return 2;
        }
        if (target && st_parse_long(v, lo, hi, target)) {
            fprintf(stderr, PROG ": bad value for %s: %s\n", a, v);
            return 2;
        }
    }
    if (k & (k - 1)) {
        fprintf(stderr, PROG ": --k must be a power of two (16..4096)\n");
        return 2;
    }
    if (n_m == 0) {
        const long def[] = {16, 32, 64, 128};
        for (n_m = 0; n_m < 4; n_m++)
            ms[n_m] = def[n_m];
    }
    if ((eval_range || train_range) && !text_path) {
        fprintf(stderr, PROG ": --eval-bytes and --train-bytes go with --text\n");
        return 2;
    }
    for (int r = 0; r < RT_COUNT; r++) {
        if (n_want == 0)
            want[r] = !(rt_rule_needs_codebooks((rt_rule)r) && n_train == 0);
        else if (want[r] && rt_rule_needs_codebooks((rt_rule)r) && n_train == 0) {
            fprintf(stderr, PROG ": --rule %s needs codebooks (--train N, N > 0)\n", rule_keys[r]);
            return 2;
        }
    }
    char err[512];
    lm_model *mdl = lm_load(model, err, sizeof err);
    if (!mdl) {
        fprintf(stderr, PROG ": %s\n", err);
        return 1;
    }
    const lm_config *mc = lm_model_config(mdl);
    if (T > mc->seq_len) {
        fprintf(stderr, PROG ": --tokens %ld exceeds the model's %d\n", T, mc->seq_len);
        lm_free(mdl);
        return 2;
    }
    uint8_t *text = NULL;
    size_t tn = 0, off = 0, end = 0, toff = 0, tend = 0;
    if (text_path) {
        if (!(text = st_read_text(PROG, text_path, &tn))) {
            lm_free(mdl);
            return 1;
        }
        off = tn - tn / 10;
        end = tn;
        toff = 0;
        tend = off;
        if ((eval_range && st_parse_range(eval_range, tn, &off, &end)) ||
            (train_range && st_parse_range(train_range, tn, &toff, &tend))) {
            fprintf(stderr, PROG ": a byte range is A:B with A < B <= %zu (the file's size)\n", tn);
            free(text);
            lm_free(mdl);
            return 2;
        }
    }
    fkvf_rvq *asis = NULL, *pre = NULL;
    if (n_train > 0)
        rt_train(PROG, mdl, (int)T, (int)n_train, (uint64_t)seed, text, toff, tend, (uint32_t)k,
                 (int)stages, &asis, &pre);
    rt_ctx *rt = rt_new(mc, (int)T, (int)sinks, (int)recent, (uint64_t)seed, asis, pre, (int)cand,
                   (int)chunk);
    if (!rt) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    int max_m = 1;
    for (int i = 0; i < n_m; i++)
        max_m = ms[i] > max_m ? (int)ms[i] : max_m;
    hook_ctx hc = {rt, 0, 0, (int)sinks, (int)recent, xmalloc((size_t)max_m * sizeof(int)),
                   xmalloc((size_t)T * sizeof(double))};
    const lm_hooks hooks = {select_rows, attended, &hc};
    /* per sequence: the NLL of the full cache, the window alone, each (rule, m) */
    const size_t n_cfg = (size_t)RT_COUNT * (size_t)n_m;
    double *full = calloc((size_t)S, sizeof *full), *win = calloc((size_t)S, sizeof *win);
    double *nll = calloc(n_cfg * (size_t)S, sizeof *nll);
    int *tok = xmalloc((size_t)T * sizeof *tok);
    if (!full || !win || !nll) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    const time_t t0 = time(NULL);
    for (int i = 0; i < (int)S; i++) {
        full[i] = st_run_sequence(PROG, mdl, (int)T,
                                  (uint64_t)seed * 1000003u + ST_EVAL_SEED_OFFSET + (uint64_t)i,
                                  text ? st_text_seq(PROG, text, off, end, (int)T, i, "evaluation")
                                       : NULL,
                                  tok, NULL, NULL);
        hc.m = 0;
        hc.rule = RT_RECENT;
        win[i] = run_hooked(mdl, tok, (int)T, &hooks, rt);
        for (int r = 0; r < RT_COUNT; r++) {
            if (!want[r])
                continue;
            for (int mi = 0; mi < n_m; mi++) {
                hc.rule = r;
                hc.m = (int)ms[mi];
                nll[((size_t)r * (size_t)n_m + (size_t)mi) * (size_t)S + (size_t)i] =
                    run_hooked(mdl, tok, (int)T, &hooks, rt);
            }
        }
        fprintf(stderr, PROG ": sequence %d of %ld done (%.0f s)\n", i + 1, S,
                difftime(time(NULL), t0));
    }
    const double npred = (double)(T - 1);
    double full_mean = 0;
    for (int i = 0; i < (int)S; i++)
        full_mean += full[i] / npred / (double)S;
    printf(PROG ": model %s (%d layers, %d query heads, %d KV heads, head dim %d); %ld sequences "
           "x %ld positions (%s); exact window %ld sinks + %ld recent; attention sees the window "
           "and the m archived positions a rule picks (for each layer and query head, exact "
           "rows); perplexity change against the full cache over all %ld predictions a "
           "sequence (in brackets: the NLL change a prediction +- its standard error over "
           "sequences)\n",
           model, mc->n_layers, mc->n_heads, mc->n_kv_heads, mc->head_size, S, T,
           text ? "text" : "sampled", sinks, recent, T - 1);
    char chunk_s[32];
    if (chunk)
        snprintf(chunk_s, sizeof chunk_s, "%ld", chunk);
    else
        snprintf(chunk_s, sizeof chunk_s, "all");
    if (asis)
        printf("key-symbol rules: codebooks k = %ld, %ld key stages, trained on %ld %s sequences; "
               "refined: %ld x m candidates; pre-RoPE chunks of %s positions\n",
               k, stages, n_train, text ? "text" : "sampled", cand, chunk_s);
    printf("\nfull cache: mean NLL %.4f, perplexity %.3f\n", full_mean, exp(full_mean));
    double se;
    double d = change(win, full, (int)S, npred, &se);
    printf("window only (m = 0): %+.1f%% (dNLL %+.3f +- %.3f)\n\n| rule |", 100.0 * (exp(d) - 1.0),
           d, se);
    for (int mi = 0; mi < n_m; mi++)
        printf(" m = %ld |", ms[mi]);
    printf("\n|---|");
    for (int mi = 0; mi < n_m; mi++)
        printf("---|");
    printf("\n");
    for (int r = 0; r < RT_COUNT; r++) {
        if (!want[r])
            continue;
        printf("| %s |", rt_rule_names[r]);
        for (int mi = 0; mi < n_m; mi++) {
            d = change(nll + ((size_t)r * (size_t)n_m + (size_t)mi) * (size_t)S, full, (int)S,
                       npred, &se);
            printf(" %+.1f%% (%+.3f +- %.3f) |", 100.0 * (exp(d) - 1.0), d, se);
        }
        printf("\n");
    }
    rt_free(rt);
    fkvf_rvq_free(asis);
    fkvf_rvq_free(pre);
    free(hc.pick);
    free(hc.att);
    free(full);
    free(win);
    free(nll);
    free(tok);
    free(text);
    lm_free(mdl);
    return 0;
}
