/* fkvf-attention: does a retrieval rule find the archived positions attention
 * reads? (issue 19 C.8; results in docs/retrieval-study.md).
 *
 * Each evaluation sequence (sampled, or a text's bytes: study.h) is run with
 * the exact cache. At every step t, for every layer and query head, the
 * attention distribution a_t over positions 0..t is recomputed from the
 * step's queries and the cached keys (softmax of q . k / sqrt(head size), in
 * double). The archived positions at step t are those outside the exact window
 * of fkvf-quality: sinks .. t - recent. For each m, at the steps where more
 * than m positions are archived, each rule picks at most m archived positions
 * and the attention mass a_t puts on them is summed:
 *   all archived   every archived position (the mass there is to find);
 *   suffix         the archived positions whose token context shares the
 *                  longest suffix with the context ending at t (length >= 1),
 *                  longest first, then the earliest (fkvf_search_longest's
 *                  order);
 *   successors     the position after each suffix match (where an induction
 *                  head looks), if archived;
 *   recent         the m most recent archived positions;
 *   random         m archived positions drawn uniformly (seeded);
 *   key norm       the m archived positions with the largest key norm of the
 *                  head's KV head;
 *   heavy hitters  the m archived positions with the most attention received
 *                  from this head at the earlier steps (H2O);
 *   oracle, one set the m archived positions with the most attention summed
 *                  over every layer and head at step t (what fetching whole
 *                  rows for all heads at once can reach at best);
 *   oracle a head  the m archived positions a_t of this head weighs most.
 * Printed: the mean mass (over steps, sequences, layers and heads) a rule and
 * m, the mean number of positions picked, and the means by layer.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "study.h"

#ifndef LM_DEFAULT_MODEL
#define LM_DEFAULT_MODEL "../shared/models/stories260K.bin"
#endif

#define PROG "fkvf-attention"
#define MAX_M 8

enum {
    R_ALL, R_SUFFIX, R_SUCC, R_RECENT, R_RANDOM, R_NORM, R_H2O, R_ORACLE_SHARED, R_ORACLE,
    R_COUNT
};
static const char *const rule_names[R_COUNT] = {
    "all archived",        "suffix matches",   "their successors",
    "most recent",         "random",           "largest key norm",
    "heavy hitters (H2O)", "oracle, one set for all heads", "oracle top-m a head",
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--model PATH] [--seqs S] [--tokens T] [--sinks S] [--recent W]\n"
            "                      [--m M]... [--seed X] [--text FILE [--eval-bytes A:B]]\n"
            "  --seqs S      evaluation sequences (16)\n"
            "  --tokens T    positions per sequence, BOS included (512; at most the model's)\n"
            "  --sinks S     exact sink positions (4); --recent W exact recent positions (32)\n"
            "  --m M         positions a rule may pick (repeatable, at most %d; default 16,\n"
            "                32, 64, 128)\n"
            "  --seed X      sampled sequence i is seeded X * 1000003 + 10000 + i, as\n"
            "                fkvf-quality's evaluation sequences (1)\n"
            "  --text FILE   the sequences are FILE's bytes (BOS, then id 3 + byte) from\n"
            "                --eval-bytes A:B (default: the last tenth)\n"
            "default model: %s\n",
            MAX_M, LM_DEFAULT_MODEL);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, PROG ": out of memory\n");
        exit(1);
    }
    return p;
}

typedef struct run {
    const lm_config *mc;
    int T, sinks, recent, n_m, m[MAX_M], m_min;
    const int *tok;          /* the sequence's tokens */
    double *att;             /* the step's attention: [L][NH][T] */
    double *shared;          /* scratch: T, attention summed over every head */
    double *h2o;             /* [L][NH][T]: attention received so far */
    int *idx;                /* scratch: T */
    double *key;             /* scratch: T, a sort key */
    int *ranked[5];          /* scratch: T each, the ranked rules (suffix, norm, H2O, oracle,
                                shared oracle) */
    double *cum[5];          /* scratch: T each, their cumulative mass */
    int *lcs;                /* scratch: T */
    lm_rng rng;
    /* sums [rule][m][layer] of mass and of positions picked over steps and
     * heads; (step, head) pairs counted [m][layer] */
    double *mass, *picked, *steps;
} run;

static size_t acc(const run *r, int rule, int mi, int l, int h)
{
    return (((size_t)rule * (size_t)r->n_m + (size_t)mi) * (size_t)r->mc->n_layers + (size_t)l) *
               (size_t)r->mc->n_heads +
           (size_t)h;
}

static const double *g_key; /* the sort key of cmp_desc (single-threaded) */

/* by key descending, then position ascending */
static int cmp_desc(const void *a, const void *b)
{
    const int i = *(const int *)a, j = *(const int *)b;
    if (g_key[i] != g_key[j])
        return g_key[i] > g_key[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

/* The archived positions lo..hi ranked by key (descending; with filter only
 * those whose key exceeds min_key) into idx, and cum[i] = the attention mass
 * of the first i + 1. Returns how many were ranked. */
static int rank(const double *att, int lo, int hi, const double *key, int filter,
                double min_key, int *idx, double *cum)
{
    int n = 0;
    for (int p = lo; p <= hi; p++)
        if (!filter || key[p] > min_key)
            idx[n++] = p;
    g_key = key;
    qsort(idx, (size_t)n, sizeof *idx, cmp_desc);
    double s = 0;
    for (int i = 0; i < n; i++)
        cum[i] = s += att[idx[i]];
    return n;
}

static void on_step(void *u, const lm_state *st, int t)
{
    run *r = u;
    const lm_config *mc = r->mc;
    const int D = mc->head_size, NH = mc->n_heads, L = mc->n_layers;
    const int group = NH / mc->n_kv_heads;
    const int lo = r->sinks, hi = t - r->recent; /* archived: lo .. hi */
    const int n_arch = hi - lo + 1;
    const float *q = lm_queries(st);
    /* the longest common suffix of the contexts ending at p and at t */
    for (int p = 0; p <= t; p++) {
        int n = 0;
        while (n <= p && r->tok[p - n] == r->tok[t - n] && p != t)
            n++;
        r->lcs[p] = n;
    }
    /* every head's attention, and their sum */
    for (int p = 0; p <= t; p++)
        r->shared[p] = 0;
    for (int l = 0; l < L; l++) {
        const float *K = lm_cache_data(st, l, LM_KEY);
        for (int h = 0; h < NH; h++) {
            const float *qh = q + ((size_t)l * (size_t)NH + (size_t)h) * (size_t)D;
            const float *Kg = K + (size_t)(h / group) * (size_t)lm_state_capacity(st) * (size_t)D;
            double *at = r->att + ((size_t)l * (size_t)NH + (size_t)h) * (size_t)r->T;
            double mx = -INFINITY, sum = 0;
            for (int p = 0; p <= t; p++) {
                double d = 0;
                for (int i = 0; i < D; i++)
                    d += (double)qh[i] * Kg[(size_t)p * (size_t)D + (size_t)i];
                at[p] = d / sqrt((double)D);
                mx = at[p] > mx ? at[p] : mx;
            }
            for (int p = 0; p <= t; p++) {
                at[p] = exp(at[p] - mx);
                sum += at[p];
            }
            for (int p = 0; p <= t; p++) {
                at[p] /= sum;
                r->shared[p] += at[p];
            }
        }
    }
    for (int l = 0; l < L; l++) {
        const float *K = lm_cache_data(st, l, LM_KEY);
        for (int h = 0; h < NH; h++) {
            const float *Kg = K + (size_t)(h / group) * (size_t)lm_state_capacity(st) * (size_t)D;
            const double *att = r->att + ((size_t)l * (size_t)NH + (size_t)h) * (size_t)r->T;
            double *h2o = r->h2o + ((size_t)l * (size_t)NH + (size_t)h) * (size_t)r->T;
            /* the ranked rules, once for every m */
            int nr[5] = {0, 0, 0, 0, 0};
            if (n_arch > r->m_min) {
                for (int p = 0; p <= t; p++)
                    r->key[p] = (double)r->lcs[p]; /* suffix matches: length >= 1 */
                nr[0] = rank(att, lo, hi, r->key, 1, 0.5, r->ranked[0], r->cum[0]);
                for (int p = lo; p <= hi; p++) {
                    double nn = 0;
                    for (int i = 0; i < D; i++) {
                        const double k = Kg[(size_t)p * (size_t)D + (size_t)i];
                        nn += k * k;
                    }
                    r->key[p] = nn;
                }
                nr[1] = rank(att, lo, hi, r->key, 0, 0, r->ranked[1], r->cum[1]);
                nr[2] = rank(att, lo, hi, h2o, 0, 0, r->ranked[2], r->cum[2]);
                nr[3] = rank(att, lo, hi, att, 0, 0, r->ranked[3], r->cum[3]);
                nr[4] = rank(att, lo, hi, r->shared, 0, 0, r->ranked[4], r->cum[4]);
            }
            for (int mi = 0; mi < r->n_m; mi++) {
                const int m = r->m[mi];
                if (n_arch <= m)
                    continue;
                double got[R_COUNT];
                int n_got[R_COUNT];
                double all = 0;
                for (int p = lo; p <= hi; p++)
                    all += att[p];
                got[R_ALL] = all;
                n_got[R_ALL] = n_arch;
                const int ks = nr[0] < m ? nr[0] : m;
                got[R_SUFFIX] = ks ? r->cum[0][ks - 1] : 0;
                n_got[R_SUFFIX] = ks;
                /* their successors, where archived */
                double s = 0;
                int ns = 0;
                for (int i = 0; i < ks; i++) {
                    const int p = r->ranked[0][i] + 1;
                    if (p <= hi) {
                        s += att[p];
                        ns++;
                    }
                }
                got[R_SUCC] = s;
                n_got[R_SUCC] = ns;
                s = 0;
                for (int p = hi - m + 1; p <= hi; p++)
                    s += att[p];
                got[R_RECENT] = s;
                n_got[R_RECENT] = m;
                /* random: a partial Fisher-Yates over the archived positions */
                for (int i = 0; i < n_arch; i++)
                    r->idx[i] = lo + i;
                s = 0;
                for (int i = 0; i < m; i++) {
                    const int j = i + (int)(lm_rng_next(&r->rng) % (uint64_t)(n_arch - i));
                    const int x = r->idx[i];
                    r->idx[i] = r->idx[j];
                    r->idx[j] = x;
                    s += att[r->idx[i]];
                }
                got[R_RANDOM] = s;
                n_got[R_RANDOM] = m;
                got[R_NORM] = r->cum[1][m - 1];
                got[R_H2O] = r->cum[2][m - 1];
                got[R_ORACLE] = r->cum[3][m - 1];
                got[R_ORACLE_SHARED] = r->cum[4][m - 1];
                n_got[R_NORM] = n_got[R_H2O] = n_got[R_ORACLE] = n_got[R_ORACLE_SHARED] = m;
                for (int k = 0; k < R_COUNT; k++) {
                    r->mass[acc(r, k, mi, l, h)] += got[k];
                    r->picked[acc(r, k, mi, l, h)] += n_got[k];
                }
                r->steps[(size_t)mi * (size_t)L + (size_t)l] += 1;
            }
            for (int p = 0; p <= t; p++)
                h2o[p] += att[p];
        }
    }
}

int main(int argc, char **argv)
{
    const char *model = LM_DEFAULT_MODEL, *text_path = NULL, *eval_range = NULL;
    long S = 16, T = 512, sinks = 4, recent = 32, seed = 1;
    long ms[MAX_M];
    int n_m = 0;
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
    if (n_m == 0) {
        const long def[] = {16, 32, 64, 128};
        for (n_m = 0; n_m < 4; n_m++)
            ms[n_m] = def[n_m];
    }
    if (eval_range && !text_path) {
        fprintf(stderr, PROG ": --eval-bytes goes with --text\n");
        return 2;
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
    size_t tn = 0, off = 0, end = 0;
    if (text_path) {
        if (!(text = st_read_text(PROG, text_path, &tn))) {
            lm_free(mdl);
            return 1;
        }
        off = tn - tn / 10;
        end = tn;
        if (eval_range && st_parse_range(eval_range, tn, &off, &end)) {
            fprintf(stderr, PROG ": a byte range is A:B with A < B <= %zu (the file's size)\n", tn);
            free(text);
            lm_free(mdl);
            return 2;
        }
    }
    const int L = mc->n_layers, NH = mc->n_heads;
    run r;
    memset(&r, 0, sizeof r);
    r.mc = mc;
    r.T = (int)T;
    r.sinks = (int)sinks;
    r.recent = (int)recent;
    r.n_m = n_m;
    r.m_min = (int)ms[0];
    for (int i = 0; i < n_m; i++) {
        r.m[i] = (int)ms[i];
        r.m_min = r.m[i] < r.m_min ? r.m[i] : r.m_min;
    }
    r.att = xmalloc((size_t)L * (size_t)NH * (size_t)T * sizeof *r.att);
    r.key = xmalloc((size_t)T * sizeof *r.key);
    r.idx = xmalloc((size_t)T * sizeof *r.idx);
    r.lcs = xmalloc((size_t)T * sizeof *r.lcs);
    r.shared = xmalloc((size_t)T * sizeof *r.shared);
    for (int k = 0; k < 5; k++) {
        r.ranked[k] = xmalloc((size_t)T * sizeof *r.ranked[k]);
        r.cum[k] = xmalloc((size_t)T * sizeof *r.cum[k]);
    }
    r.h2o = xmalloc((size_t)L * (size_t)NH * (size_t)T * sizeof *r.h2o);
    const size_t na = (size_t)R_COUNT * (size_t)n_m * (size_t)L * (size_t)NH;
    r.mass = calloc(na, sizeof *r.mass);
    r.picked = calloc(na, sizeof *r.picked);
    r.steps = calloc((size_t)n_m * (size_t)L, sizeof *r.steps);
    int *tok = xmalloc((size_t)T * sizeof *tok);
    if (!r.mass || !r.picked || !r.steps) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    r.tok = tok;
    lm_rng_seed(&r.rng, (uint64_t)seed);
    for (int i = 0; i < (int)S; i++) {
        memset(r.h2o, 0, (size_t)L * (size_t)NH * (size_t)T * sizeof *r.h2o);
        /* the tokens are known only as the run makes them: on_step reads
         * r.tok[0..t], which st_run_sequence has written by then */
        st_run_sequence(PROG, mdl, (int)T, (uint64_t)seed * 1000003u + ST_EVAL_SEED_OFFSET + (uint64_t)i,
                        text ? st_text_seq(PROG, text, off, end, (int)T, i, "evaluation") : NULL,
                        tok, on_step, &r);
    }
    printf(PROG ": model %s (%d layers, %d query heads, %d KV heads, head dim %d); %ld sequences "
           "x %ld positions (%s); exact window %ld sinks + %ld recent; mass = the share of a "
           "step's attention (a layer's query head) on the positions a rule picks, mean over "
           "steps with more than m archived positions, sequences, layers and heads\n\n",
           model, L, NH, mc->n_kv_heads, mc->head_size, S, T, text ? "text" : "sampled", sinks,
           recent);
    printf("| rule |");
    for (int mi = 0; mi < n_m; mi++)
        printf(" m = %d |", r.m[mi]);
    printf("\n|---|");
    for (int mi = 0; mi < n_m; mi++)
        printf("---|");
    printf("\n");
    for (int k = 0; k < R_COUNT; k++) {
        printf("| %s |", rule_names[k]);
        for (int mi = 0; mi < n_m; mi++) {
            double ms_ = 0, np = 0, st = 0;
            for (int l = 0; l < L; l++) {
                for (int h = 0; h < NH; h++) {
                    ms_ += r.mass[acc(&r, k, mi, l, h)];
                    np += r.picked[acc(&r, k, mi, l, h)];
                }
                st += r.steps[(size_t)mi * (size_t)L + (size_t)l];
            }
            if (st > 0)
                printf(" %.3f (%.1f) |", ms_ / st, np / st);
            else
                printf(" - |");
        }
        printf("\n");
    }
    printf("\n(in brackets: positions picked, mean)\n\nBy layer, m = %d:\n\n| rule |", r.m[0]);
    for (int l = 0; l < L; l++)
        printf(" layer %d |", l);
    printf("\n|---|");
    for (int l = 0; l < L; l++)
        printf("---|");
    printf("\n");
    for (int k = 0; k < R_COUNT; k++) {
        printf("| %s |", rule_names[k]);
        for (int l = 0; l < L; l++) {
            const double st = r.steps[l];
            double ms_ = 0;
            for (int h = 0; h < NH; h++)
                ms_ += r.mass[acc(&r, k, 0, l, h)];
            if (st > 0)
                printf(" %.3f |", ms_ / st);
            else
                printf(" - |");
        }
        printf("\n");
    }
    /* by head: where induction-style heads would show */
    const int by_head[] = {R_ALL, R_SUFFIX, R_SUCC, R_RECENT, R_ORACLE};
    for (size_t bi = 0; bi < sizeof by_head / sizeof by_head[0]; bi++) {
        const int k = by_head[bi];
        printf("\n%s by layer (rows) and head (columns), m = %d:\n\n| layer |", rule_names[k],
               r.m[0]);
        for (int h = 0; h < NH; h++)
            printf(" head %d |", h);
        printf("\n|---|");
        for (int h = 0; h < NH; h++)
            printf("---|");
        printf("\n");
        for (int l = 0; l < L; l++) {
            printf("| %d |", l);
            const double st = r.steps[l] / NH; /* steps of one head */
            for (int h = 0; h < NH; h++)
                if (st > 0)
                    printf(" %.3f |", r.mass[acc(&r, k, 0, l, h)] / st);
                else
                    printf(" - |");
            printf("\n");
        }
    }
    free(r.att);
    free(r.key);
    free(r.idx);
    free(r.lcs);
    free(r.shared);
    for (int k = 0; k < 5; k++) {
        free(r.ranked[k]);
        free(r.cum[k]);
    }
    free(r.h2o);
    free(r.mass);
    free(r.picked);
    free(r.steps);
    free(tok);
    free(text);
    lm_free(mdl);
    return 0;
}
