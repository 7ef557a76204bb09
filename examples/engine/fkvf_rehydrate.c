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
static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [OPTIONS] [--rule NAME]...\n"
               "  --rule NAME   run only this rule (repeatable): suffix, successors, recent,\n"
               "                random, norm, h2o, keysym0, keysym, keysym0-pre, keysym-pre,\n"
               "                oracle (default: all)\n");
    rt_usage(f, LM_DEFAULT_MODEL);
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
    rt_opts o;
    rt_opts_init(&o, LM_DEFAULT_MODEL);
    int want[RT_COUNT] = {0}, n_want = 0;
    for (int i = 1; i < argc; i += 2) { /* every option takes a value, but --help */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!v) {
            usage(stderr);
            return 2;
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
        } else {
            const int t = rt_opts_take(&o, PROG, a, v);
            if (t <= 0) {
                if (t == 0)
                    usage(stderr);
                return 2;
            }
        }
    }
    for (int r = 0; r < RT_COUNT; r++) {
        if (n_want == 0)
            want[r] = !(rt_rule_needs_codebooks((rt_rule)r) && o.n_train == 0);
        else if (want[r] && rt_rule_needs_codebooks((rt_rule)r) && o.n_train == 0) {
            fprintf(stderr, PROG ": --rule %s needs codebooks (--train N, N > 0)\n", rule_keys[r]);
            return 2;
        }
    }
    rt_setup su;
    int ret = rt_setup_run(PROG, &o, &su);
    if (ret)
        return ret;
    lm_model *mdl = su.mdl;
    const lm_config *mc = lm_model_config(mdl);
    const long S = o.S, T = o.T;
    const int n_m = o.n_m;
    const long *ms = o.ms;
    rt_ctx *rt = rt_new(mc, (int)T, (int)o.sinks, (int)o.recent, (uint64_t)o.seed, su.asis, su.pre,
                        (int)o.cand, (int)o.chunk);
    if (!rt) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    int max_m = 1;
    for (int i = 0; i < n_m; i++)
        max_m = ms[i] > max_m ? (int)ms[i] : max_m;
    hook_ctx hc = {rt, 0, 0, (int)o.sinks, (int)o.recent, xmalloc((size_t)max_m * sizeof(int)),
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
        full[i] = st_run_sequence(
            PROG, mdl, (int)T, (uint64_t)o.seed * 1000003u + ST_EVAL_SEED_OFFSET + (uint64_t)i,
            su.text ? st_text_seq(PROG, su.text, su.off, su.end, (int)T, i, "evaluation") : NULL,
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
           o.model, mc->n_layers, mc->n_heads, mc->n_kv_heads, mc->head_size, S, T,
           su.text ? "text" : "sampled", o.sinks, o.recent, T - 1);
    rt_print_settings(&o, &su);
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
    free(hc.pick);
    free(hc.att);
    free(full);
    free(win);
    free(nll);
    free(tok);
    rt_setup_free(&su);
    return 0;
}
