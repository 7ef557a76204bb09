/* Retrieval rules of the engine's studies: retrieval.h says what. */
#define _POSIX_C_SOURCE 200809L
#define FKVF_STATIC_LINKING_ONLY /* fkvf_rvq_centroids */
#include "retrieval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "study.h"

const char *const rt_rule_names[RT_COUNT] = {
    "suffix matches",
    "their successors",
    "most recent",
    "random",
    "largest key norm",
    "heavy hitters (H2O)",
    "key symbols, stage 0 (as-is)",
    "key symbols, refined (as-is)",
    "key symbols, stage 0 (pre-RoPE)",
    "key symbols, refined (pre-RoPE)",
    "oracle top-m a head",
};

int rt_rule_needs_codebooks(rt_rule rule)
{
    return rule == RT_KEYSYM0 || rule == RT_KEYSYM || rule == RT_KEYSYM0_PRE ||
           rule == RT_KEYSYM_PRE;
}

fkvf_rope rt_model_rope(const lm_config *mc)
{
    fkvf_rope r;
    r.layout = 1;
    r.rope_dims = (uint32_t)mc->head_size;
    r.theta = LM_ROPE_THETA;
    return r;
}

static void *xcalloc(const char *prog, size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "%s: out of memory\n", prog);
        exit(1);
    }
    return p;
}

/* ---- training -------------------------------------------------------------- */

typedef struct collect {
    const lm_config *mc;
    int T;
    float *rows; /* this sequence's rows, spec 14.2 layout */
} collect;

/* at the last step, every position's row: per layer the keys (as cached)
 * of every KV head, then the values */
static void collect_rows(void *u, const lm_state *st, int pos)
{
    collect *c = u;
    if (pos != c->T - 1)
        return;
    const int L = c->mc->n_layers, KD = c->mc->kv_dim;
    const size_t RW = (size_t)L * 2u * (size_t)KD;
    for (int p = 0; p < c->T; p++)
        for (int l = 0; l < L; l++) {
            float *row = c->rows + (size_t)p * RW + (size_t)l * 2u * (size_t)KD;
            lm_cache_get(st, l, p, LM_KEY, row);
            lm_cache_get(st, l, p, LM_VALUE, row + KD);
        }
}

void rt_train(const char *prog, const lm_model *m, int T, int n, uint64_t seed,
              const uint8_t *text, size_t off, size_t end, uint32_t k, int stages,
              fkvf_rvq **asis, fkvf_rvq **pre)
{
    const lm_config *mc = lm_model_config(m);
    const size_t RW = (size_t)mc->n_layers * 2u * (size_t)mc->kv_dim;
    float *rows = xcalloc(prog, (size_t)n * (size_t)T, RW * sizeof(float));
    fkvf_rows *blocks = xcalloc(prog, (size_t)n, sizeof *blocks);
    int *tok = xcalloc(prog, (size_t)T, sizeof *tok);
    const time_t t0 = time(NULL);
    fprintf(stderr, "%s: training key codebooks (k = %u, %d stages) on %d sequences of %d...\n",
            prog, k, stages, n, T);
    for (int i = 0; i < n; i++) {
        collect c = {mc, T, rows + (size_t)i * (size_t)T * RW};
        st_run_sequence(prog, m, T, seed * 1000003u + (uint64_t)i,
                        text ? st_text_seq(prog, text, off, end, T, i, "training") : NULL, tok,
                        collect_rows, &c);
        blocks[i].data = c.rows;
        blocks[i].n_rows = (size_t)T;
        blocks[i].dtype = FKVF_DTYPE_F32;
        blocks[i].first_position = 0;
    }
    const fkvf_rope rope = rt_model_rope(mc);
    for (int v = 0; v < 2; v++) {
        fkvf_rvq_params p;
        fkvf_rvq_params_init(&p);
        p.n_layers = (uint32_t)mc->n_layers;
        p.n_kv_heads = (uint32_t)mc->n_kv_heads;
        p.key_dim = p.value_dim = (uint32_t)mc->head_size;
        p.k = k;
        p.k_stages = (uint8_t)stages;
        p.v_stages = 0;
        p.table_dtype = FKVF_DTYPE_F32;
        p.key_rope = v ? &rope : NULL;
        const int rc = fkvf_rvq_train(v ? pre : asis, &p, blocks, (size_t)n, NULL);
        if (rc != FKVF_OK) {
            fprintf(stderr, "%s: fkvf_rvq_train: %s\n", prog, fkvf_strerror(rc));
            exit(1);
        }
    }
    fprintf(stderr, "%s: trained in %.0f s\n", prog, difftime(time(NULL), t0));
    free(tok);
    free(blocks);
    free(rows);
}

/* ---- the context ------------------------------------------------------------ */

struct rt_ctx {
    const lm_config *mc;
    int T, sinks, recent, L, NH, G, D, group, cand_factor, chunk;
    lm_rng rng;
    const int *tok;
    const fkvf_rvq *cb[2]; /* as-is, pre-RoPE */
    fkvf_rope rope;
    uint32_t k;
    int stages;
    size_t cpp;       /* codes per position */
    uint16_t *codes[2];     /* [T][cpp] */
    int *sym_head[2];       /* [L * G][k]: the latest position of symbol j, -1 */
    int *sym_next[2];       /* [L * G][T]: the previous position of p's symbol, -1 */
    double *h2o;            /* [L][NH][T] */
    float *row;             /* L * 2 * kv_dim */
    /* step caches */
    int lcs_t;              /* the step lcs and the suffix ranking are of, -1 */
    int *lcs;               /* [T] */
    int *suffix;            /* ranked suffix matches of step lcs_t */
    int n_suffix;
    int rot_t, rot_lo, rot_hi; /* the step / range rot_a, rot_b are of */
    double *rot_a, *rot_b;  /* [chunk][D / 2]: mean cos, sin of the relative angle */
    /* (chunk, symbol) scores of a key-symbol pick: of (v, layer, head, t) */
    /* per codebook v: of (layer, head, t); es: the scores, a max-heap of
     * es_hn entries; order: the es_no popped from it so far, best first
     * (every pick of that key reuses them) */
    int es_l[2], es_h[2], es_t[2], es_n[2], es_hn[2], es_no[2];
    struct ent { double score; int sym, chunk; } *es[2], *order[2]; /* [T * k] each */
    /* one ranking a rule: the (layer, head, t) it is of and the positions */
    int rk_l[RT_COUNT], rk_h[RT_COUNT], rk_t[RT_COUNT], rk_n[RT_COUNT];
    double rk_examined[RT_COUNT];
    int *rk[RT_COUNT];      /* [T] each */
    double *key;            /* [T] a sort key */
    int *cand;              /* [T] */
    float *qq, *vec;        /* [D] */
};

static void *try_calloc(size_t n, size_t size, int *fail)
{
    void *p = calloc(n ? n : 1, size);
    if (!p)
        *fail = 1;
    return p;
}

rt_ctx *rt_new(const lm_config *mc, int T, int sinks, int recent, uint64_t seed,
               const fkvf_rvq *asis, const fkvf_rvq *pre, int cand_factor, int chunk)
{
    if (!mc || T < 1 || sinks < 0 || recent < 1 || cand_factor < 1 || chunk < 0 ||
        !asis != !pre)
        return NULL;
    rt_ctx *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    int fail = 0;
    r->mc = mc;
    r->T = T;
    r->sinks = sinks;
    r->recent = recent;
    r->L = mc->n_layers;
    r->NH = mc->n_heads;
    r->G = mc->n_kv_heads;
    r->D = mc->head_size;
    r->group = mc->n_heads / mc->n_kv_heads;
    r->cand_factor = cand_factor;
    r->chunk = chunk;
    lm_rng_seed(&r->rng, seed);
    r->rope = rt_model_rope(mc);
    r->cb[0] = asis;
    r->cb[1] = pre;
    const size_t LG = (size_t)r->L * (size_t)r->G;
    if (asis) {
        fkvf_codebook_shape sh;
        uint32_t nkv;
        fkvf_rvq_shape(asis, &sh, &nkv);
        r->k = sh.k;
        r->stages = sh.k_stages;
        r->cpp = fkvf_rvq_codes_per_position(asis);
        for (int v = 0; v < 2; v++) {
            r->codes[v] = try_calloc((size_t)T * r->cpp, sizeof(uint16_t), &fail);
            r->sym_head[v] = try_calloc(LG * r->k, sizeof(int), &fail);
            r->sym_next[v] = try_calloc(LG * (size_t)T, sizeof(int), &fail);
        }
        for (int v = 0; v < 2; v++) {
            r->es[v] = try_calloc((size_t)T * r->k, sizeof *r->es[v], &fail);
            r->order[v] = try_calloc((size_t)T * r->k, sizeof *r->order[v], &fail);
        }
    }
    r->h2o = try_calloc((size_t)r->L * (size_t)r->NH * (size_t)T, sizeof(double), &fail);
    r->row = try_calloc((size_t)r->L * 2u * (size_t)mc->kv_dim, sizeof(float), &fail);
    r->lcs = try_calloc((size_t)T, sizeof(int), &fail);
    r->suffix = try_calloc((size_t)T, sizeof(int), &fail);
    r->rot_a = try_calloc((size_t)T * (size_t)r->D / 2u, sizeof(double), &fail);
    r->rot_b = try_calloc((size_t)T * (size_t)r->D / 2u, sizeof(double), &fail);
    for (int i = 0; i < RT_COUNT; i++)
        r->rk[i] = try_calloc((size_t)T, sizeof(int), &fail);
    r->key = try_calloc((size_t)T, sizeof(double), &fail);
    r->cand = try_calloc((size_t)T, sizeof(int), &fail);
    r->qq = try_calloc((size_t)r->D, sizeof(float), &fail);
    r->vec = try_calloc((size_t)r->D, sizeof(float), &fail);
    if (fail) {
        rt_free(r);
        return NULL;
    }
    rt_begin(r, NULL);
    return r;
}

void rt_free(rt_ctx *r)
{
    if (!r)
        return;
    for (int v = 0; v < 2; v++) {
        free(r->codes[v]);
        free(r->sym_head[v]);
        free(r->sym_next[v]);
    }
    for (int v = 0; v < 2; v++) {
        free(r->es[v]);
        free(r->order[v]);
    }
    free(r->h2o);
    free(r->row);
    free(r->lcs);
    free(r->suffix);
    free(r->rot_a);
    free(r->rot_b);
    for (int i = 0; i < RT_COUNT; i++)
        free(r->rk[i]);
    free(r->key);
    free(r->cand);
    free(r->qq);
    free(r->vec);
    free(r);
}

void rt_begin(rt_ctx *r, const int *tokens)
{
    r->tok = tokens;
    memset(r->h2o, 0, (size_t)r->L * (size_t)r->NH * (size_t)r->T * sizeof *r->h2o);
    if (r->cb[0])
        for (int v = 0; v < 2; v++)
            for (size_t i = 0; i < (size_t)r->L * (size_t)r->G * r->k; i++)
                r->sym_head[v][i] = -1;
    r->lcs_t = r->rot_t = r->es_t[0] = r->es_t[1] = -1;
    for (int i = 0; i < RT_COUNT; i++)
        r->rk_t[i] = -1;
}

void rt_add(rt_ctx *r, const lm_state *st, int pos)
{
    if (!r->cb[0] || pos < 0 || pos >= r->T)
        return;
    const int KD = r->mc->kv_dim;
    for (int l = 0; l < r->L; l++) {
        lm_cache_get(st, l, pos, LM_KEY, r->row + (size_t)l * 2u * (size_t)KD);
        lm_cache_get(st, l, pos, LM_VALUE, r->row + (size_t)l * 2u * (size_t)KD + KD);
    }
    const fkvf_rows rows = {r->row, 1, FKVF_DTYPE_F32, (uint64_t)pos};
    for (int v = 0; v < 2; v++) {
        uint16_t *c = r->codes[v] + (size_t)pos * r->cpp;
        if (fkvf_rvq_encode(r->cb[v], &rows, v ? &r->rope : NULL, 0, c, r->cpp, 1) != FKVF_OK) {
            fprintf(stderr, "rt_add: fkvf_rvq_encode failed\n");
            exit(1);
        }
        /* code j = (layer * G + head) * stages + stage (keys only) */
        for (size_t lg = 0; lg < (size_t)r->L * (size_t)r->G; lg++) {
            const uint16_t s = c[lg * (size_t)r->stages];
            int *head = r->sym_head[v] + lg * r->k + s;
            r->sym_next[v][lg * (size_t)r->T + (size_t)pos] = *head;
            *head = pos;
        }
    }
}

void rt_observe(rt_ctx *r, int layer, int head, int t, const double *att)
{
    double *h = r->h2o + ((size_t)layer * (size_t)r->NH + (size_t)head) * (size_t)r->T;
    for (int p = 0; p <= t; p++)
        h[p] += att[p];
}

/* ---- rankings ----------------------------------------------------------------- */

static const double *g_key; /* the sort key of cmp_desc (single-threaded) */

/* by key descending, then position ascending */
static int cmp_desc(const void *a, const void *b)
{
    const int i = *(const int *)a, j = *(const int *)b;
    if (g_key[i] != g_key[j])
        return g_key[i] > g_key[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

/* positions lo..hi (those whose key exceeds min_key when filter) by key */
static int rank_by(const double *key, int lo, int hi, int filter, double min_key, int *out)
{
    int n = 0;
    for (int p = lo; p <= hi; p++)
        if (!filter || key[p] > min_key)
            out[n++] = p;
    g_key = key;
    qsort(out, (size_t)n, sizeof *out, cmp_desc);
    return n;
}

static double dot(const float *a, const float *b, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)a[i] * (double)b[i];
    return s;
}

static void mean_rotation(int D, int t, int lo, int hi, double *a, double *b)
{
    for (int i = 0; i < D; i += 2) {
        const double f = 1.0 / pow(LM_ROPE_THETA, (double)i / (double)D);
        double sc = 0, ss = 0;
        for (int p = lo; p <= hi; p++) {
            sc += cos(f * (double)(p - t));
            ss += sin(f * (double)(p - t));
        }
        a[i / 2] = hi >= lo ? sc / (hi - lo + 1) : 0;
        b[i / 2] = hi >= lo ? ss / (hi - lo + 1) : 0;
    }
}

/* q~ from q and the mean rotation (a, b) of mean_rotation: q~ . c is the mean
 * of q . R(p) c over the positions (a, b) were taken over, for any pre-RoPE
 * key c (q_pre = q rotated back by t; q~ = mean_p R(p - t)^T q_pre pairwise) */
static void apply_mean(const float *q, int D, int t, const double *a, const double *b, float *out)
{
    memcpy(out, q, (size_t)D * sizeof *out);
    lm_rope(out, 1, D, t, 1); /* q_pre */
    for (int i = 0; i < D; i += 2) {
        const double x = out[i], y = out[i + 1];
        out[i] = (float)(a[i / 2] * x + b[i / 2] * y);
        out[i + 1] = (float)(a[i / 2] * y - b[i / 2] * x);
    }
}

/* the suffix matches of step t, ranked (cached a step) */
static void suffix_rank(rt_ctx *r, int t, int lo, int hi)
{
    if (r->lcs_t == t)
        return;
    for (int p = 0; p <= t; p++) {
        int n = 0;
        while (p != t && n <= p && r->tok[p - n] == r->tok[t - n])
            n++;
        r->key[p] = (double)n;
    }
    r->n_suffix = rank_by(r->key, lo, hi, 1, 0.5, r->suffix);
    r->lcs_t = t;
}

static int ent_before(const struct ent *x, const struct ent *y)
{
    if (x->score != y->score)
        return x->score > y->score;
    if (x->sym != y->sym)
        return x->sym < y->sym;
    return x->chunk < y->chunk;
}

static void sift(struct ent *h, int n, int i)
{
    for (;;) {
        int b = i;
        const int a = 2 * i + 1, c = a + 1;
        if (a < n && ent_before(&h[a], &h[b]))
            b = a;
        if (c < n && ent_before(&h[c], &h[b]))
            b = c;
        if (b == i)
            return;
        const struct ent x = h[i];
        h[i] = h[b];
        h[b] = x;
        i = b;
    }
}

/* key-symbol rule: v 0 as-is, 1 pre-RoPE (scored per chunk of r->chunk
 * positions, 0: the whole range, as fkvf_search_keys); refine: rank
 * cand_factor * m candidates by their decoded keys */
static int keysym(rt_ctx *r, int v, int refine, int l, int h, const float *q, int t, int lo,
                  int hi, int m, int *out, double *examined)
{
    const int D = r->D, g = h / r->group, n_arch = hi - lo + 1;
    const size_t lg = (size_t)l * (size_t)r->G + (size_t)g;
    const float *c0 = fkvf_rvq_centroids(r->cb[v], (uint32_t)l, (uint32_t)g, 0, 0);
    if (!c0)
        return -1;
    const int clen = v && r->chunk && r->chunk < n_arch ? r->chunk : n_arch;
    const int nch = (n_arch + clen - 1) / clen;
    const int K = (int)r->k;
    if (v && (r->rot_t != t || r->rot_lo != lo || r->rot_hi != hi)) {
        for (int c = 0; c < nch; c++) {
            const int a = lo + c * clen, b = a + clen - 1 < hi ? a + clen - 1 : hi;
            mean_rotation(D, t, a, b, r->rot_a + (size_t)c * (size_t)D / 2,
                          r->rot_b + (size_t)c * (size_t)D / 2);
        }
        r->rot_t = t;
        r->rot_lo = lo;
        r->rot_hi = hi;
    }
    struct ent *es = r->es[v], *order = r->order[v];
    if (r->es_l[v] != l || r->es_h[v] != h || r->es_t[v] != t) {
        for (int c = 0; c < nch; c++) {
            const float *qq = q;
            if (v) {
                apply_mean(q, D, t, r->rot_a + (size_t)c * (size_t)D / 2,
                           r->rot_b + (size_t)c * (size_t)D / 2, r->qq);
                qq = r->qq;
            }
            for (int j = 0; j < K; j++) {
                struct ent *e = es + (size_t)c * (size_t)K + (size_t)j;
                e->score = dot(qq, c0 + (size_t)j * (size_t)D, D);
                e->sym = j;
                e->chunk = c;
            }
        }
        r->es_l[v] = l;
        r->es_h[v] = h;
        r->es_t[v] = t;
        r->es_n[v] = r->es_hn[v] = nch * K;
        r->es_no[v] = 0;
        for (int i = r->es_hn[v] / 2 - 1; i >= 0; i--)
            sift(es, r->es_hn[v], i);
    }
    const int need = refine ? r->cand_factor * m : m;
    int n = 0;
    for (int oi = 0; n < need; oi++) {
        if (oi == r->es_no[v]) { /* pop the next best entry */
            if (r->es_hn[v] == 0)
                break;
            order[r->es_no[v]++] = es[0];
            es[0] = es[--r->es_hn[v]];
            sift(es, r->es_hn[v], 0);
        }
        const struct ent e = order[oi];
        const int a = lo + e.chunk * clen, b = a + clen - 1 < hi ? a + clen - 1 : hi;
        /* the chunk's positions of the symbol, the most recent first */
        for (int p = r->sym_head[v][lg * r->k + (size_t)e.sym]; p >= a;
             p = r->sym_next[v][lg * (size_t)r->T + (size_t)p]) {
            if (p > b)
                continue;
            r->cand[n++] = p;
            if (!refine && n == m)
                break;
        }
    }
    *examined = (double)r->es_n[v];
    if (!refine) {
        memcpy(out, r->cand, (size_t)n * sizeof *out);
        return n;
    }
    /* score each candidate by its key decoded from every stage */
    for (int i = 0; i < n; i++) {
        const int p = r->cand[i];
        const uint16_t *c = r->codes[v] + (size_t)p * r->cpp + lg * (size_t)r->stages;
        for (int d = 0; d < D; d++)
            r->vec[d] = 0;
        for (int s = 0; s < r->stages; s++) {
            const float *cs = fkvf_rvq_centroids(r->cb[v], (uint32_t)l, (uint32_t)g, 0,
                                                 (unsigned)s) +
                              (size_t)c[s] * (size_t)D;
            for (int d = 0; d < D; d++)
                r->vec[d] += cs[d];
        }
        if (v)
            lm_rope(r->vec, 1, D, p, 0);
        r->key[p] = dot(q, r->vec, D);
    }
    g_key = r->key;
    qsort(r->cand, (size_t)n, sizeof *r->cand, cmp_desc);
    *examined += (double)n;
    const int k = n < m ? n : m;
    memcpy(out, r->cand, (size_t)k * sizeof *out);
    return k;
}

int rt_pick(rt_ctx *r, rt_rule rule, const lm_state *st, int layer, int head, const float *q,
            int t, int m, int *out, double *examined)
{
    double ex = 0;
    if (examined)
        *examined = 0;
    if (!r || !st || !q || !out || (unsigned)rule >= RT_COUNT || layer < 0 || layer >= r->L ||
        head < 0 || head >= r->NH || t < 0 || t >= r->T || m < 1)
        return -1;
    if (rt_rule_needs_codebooks(rule) && !r->cb[0])
        return -1;
    const int lo = r->sinks, hi = t - r->recent, D = r->D, g = head / r->group;
    const int n_arch = hi - lo + 1;
    if (n_arch <= 0)
        return 0;
    if (n_arch <= m) { /* everything archived */
        for (int p = lo; p <= hi; p++)
            out[p - lo] = p;
        return n_arch;
    }
    if (rt_rule_needs_codebooks(rule)) { /* (their own per-step cache: keysym) */
        const int n = keysym(r, rule == RT_KEYSYM_PRE || rule == RT_KEYSYM0_PRE,
                             rule == RT_KEYSYM || rule == RT_KEYSYM_PRE, layer, head, q, t, lo, hi,
                             m, out, &ex);
        if (examined)
            *examined = ex;
        return n;
    }
    int *rk = r->rk[rule];
    if (r->rk_t[rule] != t || r->rk_l[rule] != layer || r->rk_h[rule] != head) {
        /* rank every archived position once for this (layer, head, t) */
        const float *K = lm_cache_data(st, layer, LM_KEY) +
                         (size_t)g * (size_t)lm_state_capacity(st) * (size_t)D;
        int n = 0;
        switch (rule) {
        case RT_SUFFIX:
        case RT_SUCC:
            suffix_rank(r, t, lo, hi);
            memcpy(rk, r->suffix, (size_t)r->n_suffix * sizeof *rk);
            n = r->n_suffix;
            break;
        case RT_RECENT:
            for (int p = hi; p >= lo; p--)
                rk[n++] = p;
            break;
        case RT_RANDOM:
            for (int i = 0; i < n_arch; i++)
                rk[i] = lo + i;
            for (int i = 0; i < n_arch - 1; i++) {
                const int j = i + (int)(lm_rng_next(&r->rng) % (uint64_t)(n_arch - i));
                const int x = rk[i];
                rk[i] = rk[j];
                rk[j] = x;
            }
            n = n_arch;
            break;
        case RT_NORM:
            for (int p = lo; p <= hi; p++) {
                const float *k = K + (size_t)p * (size_t)D;
                r->key[p] = dot(k, k, D);
            }
            n = rank_by(r->key, lo, hi, 0, 0, rk);
            break;
        case RT_H2O:
            n = rank_by(r->h2o + ((size_t)layer * (size_t)r->NH + (size_t)head) * (size_t)r->T, lo,
                        hi, 0, 0, rk);
            break;
        case RT_ORACLE:
            for (int p = lo; p <= hi; p++)
                r->key[p] = dot(q, K + (size_t)p * (size_t)D, D);
            n = rank_by(r->key, lo, hi, 0, 0, rk);
            ex = (double)n_arch;
            break;
        default:
            return -1;
        }
        if (n < 0)
            return -1;
        r->rk_n[rule] = n;
        r->rk_examined[rule] = ex;
        r->rk_t[rule] = t;
        r->rk_l[rule] = layer;
        r->rk_h[rule] = head;
    }
    int n = r->rk_n[rule] < m ? r->rk_n[rule] : m;
    if (rule == RT_SUCC) { /* the archived successors of the first m matches */
        int k = 0;
        for (int i = 0; i < n; i++)
            if (rk[i] + 1 <= hi)
                out[k++] = rk[i] + 1;
        n = k;
    } else {
        memcpy(out, rk, (size_t)n * sizeof *out);
    }
    if (examined)
        *examined = r->rk_examined[rule];
    return n;
}

/* ---- options and set-up --------------------------------------------------------- */

void rt_opts_init(rt_opts *o, const char *default_model)
{
    memset(o, 0, sizeof *o);
    o->model = default_model;
    o->S = 16;
    o->T = 512;
    o->sinks = 4;
    o->recent = 32;
    o->seed = 1;
    o->n_train = 16;
    o->k = 256;
    o->stages = 4;
    o->cand = 4;
}

int rt_opts_take(rt_opts *o, const char *prog, const char *a, const char *v)
{
    long *target = NULL, lo = 1, hi = 1000000;
    if (!strcmp(a, "--model"))
        o->model = v;
    else if (!strcmp(a, "--text"))
        o->text_path = v;
    else if (!strcmp(a, "--eval-bytes"))
        o->eval_range = v;
    else if (!strcmp(a, "--train-bytes"))
        o->train_range = v;
    else if (!strcmp(a, "--seqs"))
        target = &o->S;
    else if (!strcmp(a, "--tokens"))
        target = &o->T, lo = 2;
    else if (!strcmp(a, "--sinks"))
        target = &o->sinks, lo = 0;
    else if (!strcmp(a, "--recent"))
        target = &o->recent;
    else if (!strcmp(a, "--seed"))
        target = &o->seed, lo = 0;
    else if (!strcmp(a, "--train"))
        target = &o->n_train, lo = 0;
    else if (!strcmp(a, "--k"))
        target = &o->k, lo = 16, hi = 4096;
    else if (!strcmp(a, "--stages"))
        target = &o->stages, hi = 16;
    else if (!strcmp(a, "--cand"))
        target = &o->cand, hi = 64;
    else if (!strcmp(a, "--chunk"))
        target = &o->chunk, lo = 0;
    else if (!strcmp(a, "--m") && o->n_m < RT_MAX_M)
        target = &o->ms[o->n_m++];
    else
        return 0;
    if (target && st_parse_long(v, lo, hi, target)) {
        fprintf(stderr, "%s: bad value for %s: %s\n", prog, a, v);
        return -1;
    }
    return 1;
}

void rt_usage(FILE *f, const char *default_model)
{
    fprintf(f,
            "  --model PATH  a llama2.c checkpoint\n"
            "  --seqs S      evaluation sequences (16)\n"
            "  --tokens T    positions per sequence, BOS included (512; at most the model's)\n"
            "  --sinks S     exact sink positions (4); --recent W exact recent positions (32)\n"
            "  --m M         archived positions a rule picks (repeatable, at most %d;\n"
            "                default 16, 32, 64, 128)\n"
            "  --seed X      sampled sequence i is seeded X * 1000003 + 10000 + i, as\n"
            "                fkvf-quality's evaluation sequences (1)\n"
            "  --train N     the key-symbol rules' codebooks are trained on N sequences\n"
            "                (sampled: seeds X * 1000003 + i; text: --train-bytes) (16;\n"
            "                0: no key-symbol rules)\n"
            "  --k K         centroids a stage (256); --stages S key stages (4)\n"
            "  --cand C      the refined key-symbol rules rank C * m candidates (4)\n"
            "  --chunk P     the pre-RoPE key-symbol rules score centroids per chunk of P\n"
            "                archived positions (0: the whole range, one chunk) (0)\n"
            "  --text FILE   the sequences are FILE's bytes (BOS, then id 3 + byte) from\n"
            "                --eval-bytes A:B (default: the last tenth); training\n"
            "                sequences from --train-bytes A:B (default: the first 9/10)\n"
            "default model: %s\n",
            RT_MAX_M, default_model);
}

void rt_setup_free(rt_setup *s)
{
    fkvf_rvq_free(s->asis);
    fkvf_rvq_free(s->pre);
    free(s->text);
    lm_free(s->mdl);
    memset(s, 0, sizeof *s);
}

int rt_setup_run(const char *prog, rt_opts *o, rt_setup *s)
{
    memset(s, 0, sizeof *s);
    if (o->k & (o->k - 1)) {
        fprintf(stderr, "%s: --k must be a power of two (16..4096)\n", prog);
        return 2;
    }
    if (o->n_m == 0) {
        const long def[] = {16, 32, 64, 128};
        for (o->n_m = 0; o->n_m < 4; o->n_m++)
            o->ms[o->n_m] = def[o->n_m];
    }
    if ((o->eval_range || o->train_range) && !o->text_path) {
        fprintf(stderr, "%s: --eval-bytes and --train-bytes go with --text\n", prog);
        return 2;
    }
    char err[512];
    if (!(s->mdl = lm_load(o->model, err, sizeof err))) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 1;
    }
    const lm_config *mc = lm_model_config(s->mdl);
    if (o->T > mc->seq_len) {
        fprintf(stderr, "%s: --tokens %ld exceeds the model's %d\n", prog, o->T, mc->seq_len);
        rt_setup_free(s);
        return 2;
    }
    if (o->text_path) {
        size_t tn;
        if (!(s->text = st_read_text(prog, o->text_path, &tn))) {
            rt_setup_free(s);
            return 1;
        }
        s->off = tn - tn / 10;
        s->end = tn;
        s->toff = 0;
        s->tend = s->off;
        if ((o->eval_range && st_parse_range(o->eval_range, tn, &s->off, &s->end)) ||
            (o->train_range && st_parse_range(o->train_range, tn, &s->toff, &s->tend))) {
            fprintf(stderr, "%s: a byte range is A:B with A < B <= %zu (the file's size)\n", prog,
                    tn);
            rt_setup_free(s);
            return 2;
        }
    }
    if (o->n_train > 0)
        rt_train(prog, s->mdl, (int)o->T, (int)o->n_train, (uint64_t)o->seed, s->text, s->toff,
                 s->tend, (uint32_t)o->k, (int)o->stages, &s->asis, &s->pre);
    return 0;
}

void rt_print_settings(const rt_opts *o, const rt_setup *s)
{
    if (!s->asis) {
        printf("key-symbol rules: not run (--train 0)\n");
        return;
    }
    char chunk_s[32];
    if (o->chunk)
        snprintf(chunk_s, sizeof chunk_s, "%ld", o->chunk);
    else
        snprintf(chunk_s, sizeof chunk_s, "all");
    printf("key-symbol rules: codebooks k = %ld, %ld key stages, trained on %ld %s sequences; "
           "refined: %ld x m candidates; pre-RoPE chunks of %s positions\n",
           o->k, o->stages, o->n_train, s->text ? "text" : "sampled", o->cand, chunk_s);
}
