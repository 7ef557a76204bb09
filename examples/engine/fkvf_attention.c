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
#include "retrieval.h"
#include "study.h"

#ifndef LM_DEFAULT_MODEL
#define LM_DEFAULT_MODEL "../shared/models/stories260K.bin"
#endif

#define PROG "fkvf-attention"

/* the printed rows: all archived, the rules of retrieval.h but the oracle of a
 * head, the oracle shared by all heads, the oracle of a head */
enum { ROW_ALL = 0, ROW_SHARED = RT_COUNT, ROW_ORACLE = RT_COUNT + 1, ROW_COUNT = RT_COUNT + 2 };

static int row_of(rt_rule k)
{
    return k == RT_ORACLE ? ROW_ORACLE : 1 + (int)k;
}

static const char *row_name(int row)
{
    if (row == ROW_ALL)
        return "all archived";
    if (row == ROW_SHARED)
        return "oracle, one set for all heads";
    return rt_rule_names[row == ROW_ORACLE ? RT_ORACLE : row - 1];
}

static int row_needs_codebooks(int row)
{
    return row > ROW_ALL && row < ROW_SHARED && rt_rule_needs_codebooks((rt_rule)(row - 1));
}

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [OPTIONS]\n");
    rt_usage(f, LM_DEFAULT_MODEL);
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
    int T, sinks, recent, n_m, m[RT_MAX_M], have_cb;
    rt_ctx *rt;
    double *att;     /* the step's attention: [L][NH][T] */
    double *shared;  /* scratch: T, attention summed over every head */
    int *shared_rk;  /* scratch: T, archived positions by shared attention */
    int *idx;        /* scratch: T */
    /* sums [row][m][layer][head] of mass, positions picked and dot products
     * over steps; (step, head) pairs counted [m][layer] */
    double *mass, *picked, *examined, *steps;
} run;

static size_t acc(const run *r, int row, int mi, int l, int h)
{
    return (((size_t)row * (size_t)r->n_m + (size_t)mi) * (size_t)r->mc->n_layers + (size_t)l) *
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

static void add(run *r, int row, int mi, int l, int h, double mass, int n, double ex)
{
    const size_t a = acc(r, row, mi, l, h);
    r->mass[a] += mass;
    r->picked[a] += n;
    r->examined[a] += ex;
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
    int n_shared = 0;
    if (n_arch > 0) {
        for (int p = lo; p <= hi; p++)
            r->shared_rk[n_shared++] = p;
        g_key = r->shared;
        qsort(r->shared_rk, (size_t)n_shared, sizeof *r->shared_rk, cmp_desc);
    }
    for (int l = 0; l < L; l++) {
        for (int h = 0; h < NH; h++) {
            const float *qh = q + ((size_t)l * (size_t)NH + (size_t)h) * (size_t)D;
            const double *att = r->att + ((size_t)l * (size_t)NH + (size_t)h) * (size_t)r->T;
            for (int mi = 0; mi < r->n_m; mi++) {
                const int m = r->m[mi];
                if (n_arch <= m)
                    continue;
                double s = 0;
                for (int p = lo; p <= hi; p++)
                    s += att[p];
                add(r, ROW_ALL, mi, l, h, s, n_arch, 0);
                s = 0;
                for (int i = 0; i < m; i++)
                    s += att[r->shared_rk[i]];
                add(r, ROW_SHARED, mi, l, h, s, m, 0);
                for (int k = 0; k < RT_COUNT; k++) {
                    if (rt_rule_needs_codebooks((rt_rule)k) && !r->have_cb)
                        continue;
                    double ex;
                    const int n = rt_pick(r->rt, (rt_rule)k, st, l, h, qh, t, m, r->idx, &ex);
                    if (n < 0) {
                        fprintf(stderr, PROG ": rt_pick failed (%s)\n", rt_rule_names[k]);
                        exit(1);
                    }
                    s = 0;
                    for (int i = 0; i < n; i++)
                        s += att[r->idx[i]];
                    add(r, row_of((rt_rule)k), mi, l, h, s, n, ex);
                }
                r->steps[(size_t)mi * (size_t)L + (size_t)l] += 1;
            }
            rt_observe(r->rt, l, h, t, att);
        }
    }
    rt_add(r->rt, st, t);
}

/* the mean of the sums at a (row, m) over layers and heads, per (step, head) */
static double mean_of(const run *r, const double *sums, int row, int mi)
{
    double v = 0, st = 0;
    for (int l = 0; l < r->mc->n_layers; l++) {
        for (int h = 0; h < r->mc->n_heads; h++)
            v += sums[acc(r, row, mi, l, h)];
        st += r->steps[(size_t)mi * (size_t)r->mc->n_layers + (size_t)l];
    }
    return st > 0 ? v / st : NAN;
}

int main(int argc, char **argv)
{
    rt_opts o;
    rt_opts_init(&o, LM_DEFAULT_MODEL);
    for (int i = 1; i < argc; i += 2) { /* every option takes a value, but --help */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        const int t = v ? rt_opts_take(&o, PROG, a, v) : 0;
        if (t <= 0) {
            if (t == 0)
                usage(stderr);
            return 2;
        }
    }
    rt_setup su;
    int ret = rt_setup_run(PROG, &o, &su);
    if (ret)
        return ret;
    const lm_config *mc = lm_model_config(su.mdl);
    const long S = o.S, T = o.T;
    const int n_m = o.n_m;
    const int L = mc->n_layers, NH = mc->n_heads;
    run r;
    memset(&r, 0, sizeof r);
    r.mc = mc;
    r.T = (int)T;
    r.sinks = (int)o.sinks;
    r.recent = (int)o.recent;
    r.n_m = n_m;
    r.have_cb = su.asis != NULL;
    for (int i = 0; i < n_m; i++)
        r.m[i] = (int)o.ms[i];
    r.rt = rt_new(mc, (int)T, (int)o.sinks, (int)o.recent, (uint64_t)o.seed, su.asis, su.pre,
                  (int)o.cand, (int)o.chunk);
    if (!r.rt) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    r.att = xmalloc((size_t)L * (size_t)NH * (size_t)T * sizeof *r.att);
    r.idx = xmalloc((size_t)T * sizeof *r.idx);
    r.shared = xmalloc((size_t)T * sizeof *r.shared);
    r.shared_rk = xmalloc((size_t)T * sizeof *r.shared_rk);
    const size_t na = (size_t)ROW_COUNT * (size_t)n_m * (size_t)L * (size_t)NH;
    r.mass = calloc(na, sizeof *r.mass);
    r.picked = calloc(na, sizeof *r.picked);
    r.examined = calloc(na, sizeof *r.examined);
    r.steps = calloc((size_t)n_m * (size_t)L, sizeof *r.steps);
    int *tok = xmalloc((size_t)T * sizeof *tok);
    if (!r.mass || !r.picked || !r.examined || !r.steps) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    for (int i = 0; i < (int)S; i++) {
        /* the tokens are known only as the run makes them: on_step reads
         * tok[0..t], which st_run_sequence has written by then */
        rt_begin(r.rt, tok);
        st_run_sequence(
            PROG, su.mdl, (int)T, (uint64_t)o.seed * 1000003u + ST_EVAL_SEED_OFFSET + (uint64_t)i,
            su.text ? st_text_seq(PROG, su.text, su.off, su.end, (int)T, i, "evaluation") : NULL,
            tok, on_step, &r);
    }
    printf(PROG ": model %s (%d layers, %d query heads, %d KV heads, head dim %d); %ld sequences "
           "x %ld positions (%s); exact window %ld sinks + %ld recent; mass = the share of a "
           "step's attention (a layer's query head) on the positions a rule picks, mean over "
           "steps with more than m archived positions, sequences, layers and heads\n",
           o.model, L, NH, mc->n_kv_heads, mc->head_size, S, T, su.text ? "text" : "sampled",
           o.sinks, o.recent);
    rt_print_settings(&o, &su);
    printf("\n| rule |");
    for (int mi = 0; mi < n_m; mi++)
        printf(" m = %d |", r.m[mi]);
    printf("\n|---|");
    for (int mi = 0; mi < n_m; mi++)
        printf("---|");
    printf("\n");
    for (int row = 0; row < ROW_COUNT; row++) {
        printf("| %s |", row_name(row));
        for (int mi = 0; mi < n_m; mi++) {
            const double ms_ = mean_of(&r, r.mass, row, mi), np = mean_of(&r, r.picked, row, mi);
            if (isnan(ms_) || (row_needs_codebooks(row) && !r.have_cb))
                printf(" - |");
            else
                printf(" %.3f (%.1f) |", ms_, np);
        }
        printf("\n");
    }
    printf("\n(in brackets: positions picked, mean)\n\nCost: key dot products a pick "
           "(centroids scored + candidates decoded; the oracle scores every archived key):\n\n"
           "| rule |");
    for (int mi = 0; mi < n_m; mi++)
        printf(" m = %d |", r.m[mi]);
    printf("\n|---|");
    for (int mi = 0; mi < n_m; mi++)
        printf("---|");
    printf("\n");
    for (int row = 0; row < ROW_COUNT; row++) {
        if (!(row_needs_codebooks(row) && r.have_cb) && row != ROW_ORACLE)
            continue;
        printf("| %s |", row_name(row));
        for (int mi = 0; mi < n_m; mi++) {
            const double ex = mean_of(&r, r.examined, row, mi);
            if (isnan(ex))
                printf(" - |");
            else
                printf(" %.0f |", ex);
        }
        printf("\n");
    }
    printf("\nBy layer, m = %d:\n\n| rule |", r.m[0]);
    for (int l = 0; l < L; l++)
        printf(" layer %d |", l);
    printf("\n|---|");
    for (int l = 0; l < L; l++)
        printf("---|");
    printf("\n");
    for (int row = 0; row < ROW_COUNT; row++) {
        if (row_needs_codebooks(row) && !r.have_cb)
            continue;
        printf("| %s |", row_name(row));
        for (int l = 0; l < L; l++) {
            const double st = r.steps[l];
            double ms_ = 0;
            for (int h = 0; h < NH; h++)
                ms_ += r.mass[acc(&r, row, 0, l, h)];
            if (st > 0)
                printf(" %.3f |", ms_ / st);
            else
                printf(" - |");
        }
        printf("\n");
    }
    /* by head: where induction-style heads would show */
    const int by_head[] = {ROW_ALL, row_of(RT_SUFFIX), row_of(RT_SUCC), row_of(RT_RECENT),
                           row_of(RT_KEYSYM_PRE), ROW_ORACLE};
    for (size_t bi = 0; bi < sizeof by_head / sizeof by_head[0]; bi++) {
        const int row = by_head[bi];
        if (row_needs_codebooks(row) && !r.have_cb)
            continue;
        printf("\n%s by layer (rows) and head (columns), m = %d:\n\n| layer |", row_name(row),
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
                    printf(" %.3f |", r.mass[acc(&r, row, 0, l, h)] / st);
                else
                    printf(" - |");
            printf("\n");
        }
    }
    rt_free(r.rt);
    free(r.att);
    free(r.idx);
    free(r.shared);
    free(r.shared_rk);
    free(r.mass);
    free(r.picked);
    free(r.examined);
    free(r.steps);
    free(tok);
    rt_setup_free(&su);
    return 0;
}
