/* Reading the user's raw caches right (fkvf pack, train, compare, append):
 * --layout, the notes after reading a cache (skipped tensors, a layout that
 * looks transposed), the RoPE pair layout of Hugging Face caches, and the
 * RoPE check. See cli_util.h and docs/cache-files.md. Public API only. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"

int cli_opt_layout(const char *v, int *layout)
{
    if (v && (!strcmp(v, "hnd") || !strcmp(v, "nhd"))) {
        *layout = v[0] == 'h' ? CLI_LAYOUT_HND : CLI_LAYOUT_NHD;
        return 0;
    }
    cli_usage("--layout: '%s' is not hnd (heads first) or nhd (positions first)", v ? v : "");
    return -1;
}

int cli_opt_dtype(const char *v, int *dtype)
{
    if (!strcmp(v, "f16"))
        *dtype = FKVF_DTYPE_F16;
    else if (!strcmp(v, "bf16"))
        *dtype = FKVF_DTYPE_BF16;
    else if (!strcmp(v, "f32"))
        *dtype = FKVF_DTYPE_F32;
    else
        return cli_usage("--dtype: '%s' is not f16, bf16 or f32", v), -1;
    return 0;
}

void cli_cache_notes(const char *path, const kvio_cache *c, int layout)
{
    for (size_t i = 0; i < c->n_ignored && i < KVIO_MAX_IGNORED; i++)
        cli_note("%s: ignored tensor '%s' (%s)", path, c->ignored[i] ? c->ignored[i] : "",
                kvio_is_companion(c->ignored[i])
                    ? "a companion of a Hugging Face cache, not part of it"
                    : "not a cache tensor name; docs/cache-files.md lists the accepted names");
    if (c->n_ignored > KVIO_MAX_IGNORED)
        cli_note("%s: ignored %zu more tensors", path, c->n_ignored - KVIO_MAX_IGNORED);
    /* A positions-first cache read heads-first has its axes swapped: many
     * "heads" (KV heads are 1-8 in GQA models, rarely more than 64 in any),
     * few "positions". A short heads-first cache can have H > T too: warn,
     * do not refuse. */
    if (layout == CLI_LAYOUT_UNSET && c->n_positions > 0 && c->n_kv_heads > c->n_positions)
        cli_warn("%s: read heads-first as %u KV heads x %u positions%s; if the tensors "
                "are positions-first ([positions, kv_heads, dim]), pass --layout nhd "
                "(--layout hnd keeps this reading without this warning)",
                path, c->n_kv_heads, c->n_positions,
                c->n_kv_heads > 64 ? ", more KV heads than models have" : "");
}

int cli_read_cache_layout(const char *path, int layout, int lazy, kvio_cache *c)
{
    int ex = cli_read_cache(path, (layout == CLI_LAYOUT_NHD ? KVIO_READ_NHD : 0) |
                                      (lazy ? KVIO_READ_LAZY : 0),
                            c);
    if (ex == CLI_OK)
        cli_cache_notes(path, c, layout);
    return ex;
}

void cli_keys_hf_default(cli_key_opts *k, const kvio_cache *c, const char *path)
{
    if (c->names == KVIO_NAMES_LLAMA) {
        cli_llama_key_defaults(k, c, path); /* from --model's GGUF */
        return;
    }
    if (k->layout_set || k->layout_cb || k->no_rope || !kvio_names_is_hf(c->names))
        return;
    k->layout = 2;
    cli_note("%s: Hugging Face tensor names (%s): RoPE pairs taken as half-split (rotate_half, "
            "as Transformers rotates them); pass --rope-layout interleaved for a model that "
            "rotates adjacent pairs",
            path, kvio_names_name(c->names));
}

/* ---- the RoPE check ------------------------------------------------------ */

#define ROPE_SAMPLES 256    /* positions sampled per (layer, head) */
#define ROPE_MIN_SAMPLES 16 /* fewer: cannot tell */
#define ROPE_MARGIN 0.97    /* another candidate must be this much lower */

static const double USUAL_THETAS[] = {10000.0, 500000.0, 1000000.0};

static void add_cand(cli_rope_report *r, int as_cached, uint8_t layout, double theta,
                     uint32_t dims)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->c[i].as_cached == as_cached &&
            (as_cached || (r->c[i].rope.layout == layout && r->c[i].rope.theta == theta)))
            return;
    if (r->n >= sizeof r->c / sizeof r->c[0])
        return;
    cli_rope_cand *x = &r->c[r->n++];
    memset(x, 0, sizeof *x);
    x->as_cached = as_cached;
    x->rope.layout = layout;
    x->rope.theta = theta;
    x->rope.rope_dims = dims;
}

/* The candidates, the chosen settings first: as cached, or un-rotated with
 * rope; then as cached, and each layout with rope's theta and the usual ones. */
static void rope_candidates(cli_rope_report *r, const fkvf_rope *rope, int unrotate,
                            uint32_t dims)
{
    add_cand(r, !unrotate, rope->layout, rope->theta, dims);
    add_cand(r, 1, 0, 0, dims);
    for (int l = 1; l <= 2; l++) {
        add_cand(r, 0, (uint8_t)l, rope->theta, dims);
        for (size_t i = 0; i < sizeof USUAL_THETAS / sizeof USUAL_THETAS[0]; i++)
            add_cand(r, 0, (uint8_t)l, USUAL_THETAS[i], dims);
    }
    r->chosen = 0;
}

/* The check's scratch: n sampled positions of keys of D components, dims
 * of them rotated. */
typedef struct rope_work {
    uint32_t D, dims, n, p0;
    uint64_t pos0;
    size_t es;
    float *f;            /* D: a sampled key */
    double *v;           /* D: it turned by a candidate */
    double *sum, *sq;    /* per candidate, of one head: D sums of components, 1 of squares */
    double *var, *energy; /* per candidate, over every head */
    double *hv;          /* per candidate: one head's relative variance */
    double *cs;          /* per candidate and sample: dims cosines and sines */
    uint8_t *keys;       /* one layer's sampled keys, [head][sample][D] in the cache's dtype */
} rope_work;

static void rope_work_free(rope_work *w)
{
    free(w->f);
    free(w->v);
    free(w->sum);
    free(w->sq);
    free(w->var);
    free(w->energy);
    free(w->hv);
    free(w->cs);
    free(w->keys);
}

/* Sample i's position in the cache */
static uint32_t rope_sample(const cli_rope_report *r, const rope_work *w, uint32_t i)
{
    return w->p0 + (uint32_t)((uint64_t)i * r->positions / w->n);
}

/* Every candidate's angles at every sampled position, once for all heads
 * (fkvf_rope_table: the bits fkvf_rope_apply_f64 computes). -1 on failure. */
static int rope_tables(const cli_rope_report *r, rope_work *w)
{
    for (size_t k = 0; k < r->n; k++)
        for (uint32_t i = 0; i < w->n && !r->c[k].as_cached; i++)
            if (fkvf_rope_table(&r->c[k].rope, w->pos0 + (rope_sample(r, w, i) - w->p0),
                                w->cs + (k * w->n + i) * w->dims, w->dims) != FKVF_OK)
                return -1;
    return 0;
}

/* Layer l's sampled keys of every head into w->keys (from memory or, a
 * lazy cache, its file): 0, or an exit status after an error line. */
static int rope_layer(const kvio_cache *c, const cli_rope_report *r, rope_work *w, uint32_t l)
{
    size_t kb = (size_t)w->D * w->es;
    char err[1024];
    for (uint32_t i = 0; i < w->n; i++) {
        int rc = kvio_read_kv(c, l, 0, rope_sample(r, w, i), 1, w->keys + i * kb, kb,
                              (size_t)w->n * kb, err, sizeof err);
        if (rc != KVIO_OK)
            return cli_fail_kvio(rc, NULL, err);
    }
    return 0;
}

/* Head h of the layer in w->keys: each sampled key converted once, then
 * turned by each candidate; its relative variance per candidate into
 * w->hv, its totals added to w->var and w->energy. -1 on failure. */
static int rope_head(const kvio_cache *c, const cli_rope_report *r, rope_work *w, uint32_t h)
{
    const uint32_t D = w->D, n = w->n;
    memset(w->sum, 0, r->n * D * sizeof *w->sum);
    memset(w->sq, 0, r->n * sizeof *w->sq);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *src = w->keys + ((size_t)h * n + i) * D * w->es;
        fkvf_convert(FKVF_DTYPE_F32, w->f, c->dtype, src, D);
        for (size_t k = 0; k < r->n; k++) {
            double *sk = w->sum + k * D;
            for (uint32_t d = 0; d < D; d++)
                w->v[d] = w->f[d];
            if (!r->c[k].as_cached &&
                fkvf_rope_apply_table_f64(&r->c[k].rope, w->cs + (k * n + i) * w->dims, 1, w->v,
                                          D) != FKVF_OK)
                return -1;
            for (uint32_t d = 0; d < D; d++) {
                sk[d] += w->v[d];
                w->sq[k] += w->v[d] * w->v[d];
            }
        }
    }
    for (size_t k = 0; k < r->n; k++) {
        const double *sk = w->sum + k * D;
        double m2 = 0;
        for (uint32_t d = 0; d < D; d++)
            m2 += (sk[d] / n) * (sk[d] / n);
        /* n * (mean squared norm - squared norm of the mean) */
        double hvar = w->sq[k] - n * m2;
        w->var[k] += hvar > 0 ? hvar : 0;
        w->energy[k] += w->sq[k];
        w->hv[k] = w->sq[k] > 0 ? hvar / w->sq[k] : 0;
    }
    return 0;
}

/* Every candidate's spread, the lowest and the verdict. */
static void rope_verdict(cli_rope_report *r, const rope_work *w)
{
    r->best = 0;
    int finite = 1;
    for (size_t k = 0; k < r->n; k++) {
        r->c[k].spread = w->energy[k] > 0 ? w->var[k] / w->energy[k] : 0;
        finite &= isfinite(r->c[k].spread) && isfinite(w->energy[k]) && w->energy[k] > 0;
        if (r->c[k].spread < r->c[r->best].spread)
            r->best = k;
    }
    if (!finite || w->n < ROPE_MIN_SAMPLES)
        r->verdict = -1;
    else
        r->verdict = r->best != r->chosen &&
                     r->c[r->best].spread < ROPE_MARGIN * r->c[r->chosen].spread;
}

int cli_rope_measure(const kvio_cache *c, uint32_t p0, uint32_t p1, uint64_t pos0,
                     const fkvf_rope *rope, int unrotate, cli_rope_report *r)
{
    memset(r, 0, sizeof *r);
    r->positions = p1 - p0;
    r->heads = (uint64_t)c->n_layers * c->n_kv_heads;
    r->verdict = -1;
    uint32_t D = c->key_dim;
    uint32_t dims = rope->rope_dims ? rope->rope_dims : D;
    if (dims > D)
        dims = D;
    dims &= ~1u;
    if (dims < 2 || p1 <= p0)
        return 0; /* nothing to rotate, or no keys */
    rope_candidates(r, rope, unrotate, dims);
    uint32_t n = r->positions < ROPE_SAMPLES ? r->positions : ROPE_SAMPLES;
    r->sampled = n;
    rope_work w;
    memset(&w, 0, sizeof w);
    w.D = D;
    w.dims = dims;
    w.n = n;
    w.p0 = p0;
    w.pos0 = pos0;
    w.es = kvio_dtype_size(c->dtype);
    int rc = -1;
    if ((w.f = malloc((size_t)D * sizeof *w.f)) && (w.v = malloc((size_t)D * sizeof *w.v)) &&
        (w.sum = calloc(r->n * D, sizeof *w.sum)) && (w.sq = calloc(r->n, sizeof *w.sq)) &&
        (w.var = calloc(r->n, sizeof *w.var)) && (w.energy = calloc(r->n, sizeof *w.energy)) &&
        (w.hv = malloc(r->n * sizeof *w.hv)) &&
        (w.cs = calloc(r->n * n * dims, sizeof *w.cs)) &&
        (w.keys = malloc((size_t)c->n_kv_heads * n * D * w.es)) && rope_tables(r, &w) == 0) {
        rc = 0;
        for (uint32_t l = 0; l < c->n_layers && !rc; l++)
            for (uint32_t h = 0; h < c->n_kv_heads && !rc; h++) {
                if ((h == 0 && (rc = rope_layer(c, r, &w, l))) || (rc = rope_head(c, r, &w, h)))
                    break;
                size_t best = 0;
                for (size_t k = 1; k < r->n; k++)
                    if (w.hv[k] < w.hv[best])
                        best = k;
                r->c[best].wins++;
            }
        if (!rc)
            rope_verdict(r, &w);
    }
    rope_work_free(&w);
    return rc;
}

static void cand_label(const cli_rope_cand *x, char *out, size_t n)
{
    if (x->as_cached)
        snprintf(out, n, "as cached (not un-rotated)");
    else
        snprintf(out, n, "un-rotated with %s pairs, theta %.10g",
                 x->rope.layout == 1 ? "interleaved" : "half-split", x->rope.theta);
}

/* The options that select candidate b instead of the chosen a. */
static void cand_options(const cli_rope_cand *a, const cli_rope_cand *b, int no_rope, char *out,
                         size_t n)
{
    size_t k = 0;
    out[0] = 0;
    if (b->as_cached) {
        snprintf(out, n, "--no-rope if the model has no RoPE (GPT-2), or --keys as-is");
        return;
    }
    /* --no-rope wins over --keys pre-rope: the advice must drop it */
    if (a->as_cached)
        k += (size_t)snprintf(out + k, n - k, "%s", no_rope ? "dropping --no-rope, with "
                                                              : "--keys pre-rope ");
    if (a->as_cached || a->rope.layout != b->rope.layout)
        k += (size_t)snprintf(out + k, n - k, "--rope-layout %s ",
                              b->rope.layout == 1 ? "interleaved" : "half-split");
    if (k < n && (a->as_cached || a->rope.theta != b->rope.theta))
        k += (size_t)snprintf(out + k, n - k, "--rope-theta %.10g ", b->rope.theta);
    if (k > 0 && k < n)
        out[k - 1] = 0;
}

void cli_rope_print(FILE *f, const char *path, const cli_rope_report *r)
{
    cli_text_cstr(f, path);
    fprintf(f, ": RoPE check on %u of %u positions, %" PRIu64 " (layer, head) pairs\n", r->sampled,
            r->positions, r->heads);
    if (!r->n) {
        fprintf(f, "verdict: cannot tell (no rotated dims or no positions)\n");
        return;
    }
    fprintf(f, "spread: mean squared distance of a head's keys to their mean over their mean "
               "squared norm;\nkeys before RoPE cluster, so the right un-rotation gives the "
               "lowest spread\n");
    fprintf(f, "  spread   best in  keys\n");
    for (size_t k = 0; k < r->n; k++) {
        char lab[96];
        cand_label(&r->c[k], lab, sizeof lab);
        fprintf(f, "  %.4f  %4" PRIu64 "/%-4" PRIu64 " %s%s\n", r->c[k].spread, r->c[k].wins, r->heads, lab,
                k == r->chosen && k == r->best ? "  <- chosen, lowest"
                : k == r->chosen               ? "  <- chosen"
                : k == r->best                 ? "  <- lowest"
                                               : "");
    }
    if (r->verdict < 0) {
        fprintf(f, "verdict: cannot tell (%s)\n",
                r->sampled < ROPE_MIN_SAMPLES ? "fewer than 16 positions" : "no finite keys");
    } else if (r->verdict == 0) {
        fprintf(f, "verdict: the chosen settings look right\n");
    } else {
        char opts[160];
        cand_options(&r->c[r->chosen], &r->c[r->best], r->no_rope, opts, sizeof opts);
        if (r->codebook)
            fprintf(f, "verdict: the chosen settings (those %s was trained with) look wrong; "
                       "train a codebook with %s (fkvf train CACHE... %s -o FILE)\n",
                    r->codebook, opts, opts);
        else
            fprintf(f, "verdict: the chosen settings look wrong; try %s\n", opts);
    }
}

void cli_rope_json(FILE *f, const char *path, const cli_rope_report *r)
{
    fputs("{\"cache\":", f);
    cli_json_cstr(f, path);
    fprintf(f, ",\"positions\":%u,\"sampled\":%u,\"heads\":%" PRIu64 ",\"candidates\":[",
            r->positions, r->sampled, r->heads);
    for (size_t k = 0; k < r->n; k++) {
        const cli_rope_cand *x = &r->c[k];
        fprintf(f, "%s{\"keys\":\"%s\"", k ? "," : "", x->as_cached ? "as-is" : "pre-rope");
        if (!x->as_cached)
            fprintf(f, ",\"rope_layout\":\"%s\",\"rope_theta\":%.17g",
                    x->rope.layout == 1 ? "interleaved" : "half-split", x->rope.theta);
        if (isfinite(x->spread))
            fprintf(f, ",\"spread\":%.6g", x->spread);
        else
            fputs(",\"spread\":null", f);
        fprintf(f, ",\"wins\":%" PRIu64 ",\"chosen\":%s,\"lowest\":%s}", x->wins,
                k == r->chosen ? "true" : "false", k == r->best ? "true" : "false");
    }
    fprintf(f, "],\"verdict\":\"%s\"}\n",
            !r->n || r->verdict < 0 ? "unknown" : r->verdict == 0 ? "right" : "wrong");
}

void cli_rope_warn(const char *path, const cli_rope_report *r)
{
    if (r->verdict != 1)
        return;
    char a[96], b[96], opts[160], advice[512];
    cand_label(&r->c[r->chosen], a, sizeof a);
    cand_label(&r->c[r->best], b, sizeof b);
    cand_options(&r->c[r->chosen], &r->c[r->best], r->no_rope, opts, sizeof opts);
    /* with a codebook file the settings are its training: an option alone
     * would not fit it (and is refused) */
    if (r->codebook)
        snprintf(advice, sizeof advice, "they are those %s was trained with: train a codebook "
                 "with %s (fkvf train CACHE... %s -o FILE)", r->codebook, opts, opts);
    else
        snprintf(advice, sizeof advice, "try %s", opts);
    cli_warn("%s: the RoPE settings look wrong: the keys spread %.3f about their mean %s, "
             "but %.3f %s (lower compresses better); %s (fkvf pack --check-rope prints the "
             "measurement)",
             path, r->c[r->chosen].spread, a, r->c[r->best].spread, b, advice);
}

/* ---- the training sample ------------------------------------------------ */

int cli_train_sample(const char *path, const uint64_t *n_pos, size_t n_in, size_t row_bytes,
                     uint64_t max_opt, uint64_t seed, cli_run **runs, size_t *n_runs,
                     uint64_t *used)
{
    uint64_t max = max_opt ? max_opt : cli_sample_default(row_bytes);
    if (cli_sample_runs(n_pos, n_in, max, seed, runs, n_runs, used))
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, path, "out of memory");
    uint64_t total = 0;
    for (size_t i = 0; i < n_in; i++)
        total += n_pos[i]; /* no overflow: cli_sample_runs summed them */
    if (*used == total)
        return CLI_OK;
    char why[96];
    if (max_opt)
        snprintf(why, sizeof why, "--max-train-positions %" PRIu64, max_opt);
    else
        snprintf(why, sizeof why, "the default: as many as %" PRIu64 " MiB of rows hold",
                 CLI_SAMPLE_BUDGET >> 20);
    cli_note("%s%straining on a sample of %" PRIu64 " of the %" PRIu64 " positions%s (%s): "
             "runs of %u consecutive positions chosen by the training seed %" PRIu64 "; "
             "--max-train-positions N changes it, 'all' trains on every position "
             "(docs/codebooks.md)",
             path ? path : "", path ? ": " : "", *used, total, n_in > 1 ? " of the caches" : "",
             why, CLI_SAMPLE_RUN, seed);
    return CLI_OK;
}

int cli_sample_read(const kvio_cache *c, const char *path, const cli_run *runs, size_t n,
                    size_t input, uint8_t **dst, cli_progress *pg, uint64_t *done, uint64_t total)
{
    const size_t rb = cli_cache_row_bytes(c);
    /* a piece of about 8 MiB at a time, for the progress bar */
    const uint64_t step = ((uint64_t)8 << 20) / (rb ? rb : 1) + 1;
    for (size_t r = 0; r < n; r++) {
        if (runs[r].input != input)
            continue;
        if (runs[r].first + runs[r].n > c->n_positions)
            return cli_fail(CLI_INVALID, FKVF_E_RANGE, path,
                            "the cache changed while it was read (%" PRIu32 " positions)",
                            c->n_positions);
        for (uint64_t p = runs[r].first, end = p + runs[r].n; p < end; p += step) {
            uint64_t m = end - p < step ? end - p : step;
            int ex = cli_cache_rows(c, (uint32_t)p, (uint32_t)(p + m), *dst);
            if (ex != CLI_OK)
                return ex;
            *dst += (size_t)m * rb;
            *done += (uint64_t)m * rb;
            cli_progress_cb(pg, *done, total);
        }
    }
    return CLI_OK;
}
