/* Reference encoder: a copy of fkvf_rvq_encode (greedy and beam) as it was
 * before issue 16's kernel on rows (encode_ref.h), with the search layout
 * (panels) the handle held then, built per call (not thread-safe), and the
 * kernels of then: the AVX2 scores (not AVX-512), the scalar pick, the
 * portable f16 load. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "encode_ref.h"
#include "quant/quant.h"
#include "rope.h"

#define Q_CHUNK 64

static size_t row_bytes(const fkvf_rvq *q, fkvf_dtype dt)
{
    size_t es = fkvfq_dtype_size(dt), n;
    size_t per_layer = (size_t)q->n_kv_heads * ((size_t)q->shape.key_dim + q->shape.value_dim);
    if (!fkvf_mulsz(per_layer, q->shape.n_layers, &n) || !fkvf_mulsz(n, es, &n))
        return 0;
    return n;
}

static size_t vec_off(const fkvf_rvq *q, uint32_t l, uint32_t h, unsigned kv)
{
    size_t H = q->n_kv_heads, Dk = q->shape.key_dim, Dv = q->shape.value_dim;
    size_t base = (size_t)l * H * (Dk + Dv);
    return kv == 0 ? base + h * Dk : base + H * Dk + h * Dv;
}

static int codes_check(const fkvf_rvq *q, size_t n_rows, size_t pos_stride, size_t code_stride)
{
    size_t nc = fkvf_rvq_codes_per_position(q), a, b, c;
    if (!n_rows || !nc)
        return FKVF_OK;
    if ((n_rows > 1 && !pos_stride) || (nc > 1 && !code_stride))
        return FKVF_E_INVALID_ARG;
    if (!fkvf_mulsz(n_rows - 1, pos_stride, &a) || !fkvf_mulsz(nc - 1, code_stride, &b) ||
        !fkvf_addsz(a, b, &c))
        return FKVF_E_INVALID_ARG;
    return FKVF_OK;
}

static size_t code_index(const fkvf_rvq *q, uint32_t l, uint32_t h, unsigned kv, unsigned s)
{
    size_t m = (size_t)q->shape.k_stages + q->shape.v_stages;
    return ((size_t)l * q->n_kv_heads + h) * m + (kv == 0 ? s : (size_t)q->shape.k_stages + s);
}

/* The search layout as the encoder before issue 16 kept it in the handle:
 * panels, norms and cmax of every stage table (fkvfq_table_prepare). */
typedef struct ref_layout {
    float *panels, *norms;
    double *cmax;
} ref_layout;
static ref_layout L_;

static size_t stage_index(const fkvf_rvq *q, size_t tab, unsigned kv, unsigned s)
{
    return tab * ((size_t)q->shape.k_stages + q->shape.v_stages) +
           (kv == 0 ? s : (size_t)q->shape.k_stages + s);
}

static int layout_build(const fkvf_rvq *q)
{
    size_t nst = q->n_tabs * ((size_t)q->shape.k_stages + q->shape.v_stages);
    L_.panels = malloc((q->n_floats ? q->n_floats : 1) * sizeof(float));
    L_.norms = malloc((nst ? nst : 1) * q->shape.k * sizeof(float));
    L_.cmax = malloc((nst ? nst : 1) * sizeof(double));
    void *scratch = malloc(fkvfq_prepare_scratch(q->shape.k));
    if (!L_.panels || !L_.norms || !L_.cmax || !scratch) {
        free(scratch);
        return FKVF_E_NOMEM;
    }
    for (size_t tab = 0; tab < q->n_tabs; tab++)
        for (unsigned kv = 0; kv < 2; kv++) {
            unsigned ns = kv == 0 ? q->shape.k_stages : q->shape.v_stages;
            uint32_t dim = kv == 0 ? q->shape.key_dim : q->shape.value_dim;
            for (unsigned s = 0; s < ns; s++) {
                size_t off = fkvfq_table_off(q, tab, kv, s), si = stage_index(q, tab, kv, s);
                fkvfq_table_prepare(q->rows + off, q->shape.k, dim, L_.panels + off,
                                    L_.norms + si * q->shape.k, &L_.cmax[si], scratch);
            }
        }
    free(scratch);
    return FKVF_OK;
}

static void layout_free(void)
{
    free(L_.panels);
    free(L_.norms);
    free(L_.cmax);
    memset(&L_, 0, sizeof L_);
}

/* fkvfq_pick as it was before issue 16's AVX-512 pick (the same results, a
 * scalar scan and re-check) */
static uint32_t ref_pick(const fkvfq_table *t, const float *x, const float *scores,
                         const float *pmin, double *dist)
{
    const uint32_t k = t->k, dim = t->dim, np = k / FKVFQ_PANEL;
    float bs = pmin[0];
    for (uint32_t p = 1; p < np; p++)
        bs = pmin[p] < bs ? pmin[p] : bs;
    /* Rounding bound (u = 2^-24): the binary32 score of c differs from the
     * exact ||c||^2 - 2<x, c> by at most u*||c||^2 (norm), 2*gamma_dim*
     * ||x||*||c|| (dot product, Cauchy-Schwarz) and u*|score| (subtraction),
     * all below u*(dim+2)*(cmax^2 + 2*||x||*cmax). E doubles that and adds a
     * term for underflow. The true nearest centroid scores at most 2E above
     * the best binary32 score, so only scores up to there are re-checked. */
    double xl[4] = {0, 0, 0, 0};
    uint32_t d = 0;
    for (; d + 4 <= dim; d += 4)
        for (int l = 0; l < 4; l++)
            xl[l] += (double)x[d + l] * x[d + l];
    for (; d < dim; d++)
        xl[0] += (double)x[d] * x[d];
    double xn = sqrt((xl[0] + xl[1]) + (xl[2] + xl[3])) * (1 + 0x1p-40), cm = t->cmax;
    double e = (double)(dim + 4) * 0x1p-23 * (cm * cm + 2 * xn * cm) + (double)dim * 0x1p-120;
    double thr = (double)bs + 2 * e;
    float thrf = (float)thr;
    if ((double)thrf < thr)
        thrf = nextafterf(thrf, INFINITY);
    /* candidates: scores <= thrf, found through the panel minimums */
    uint32_t pick = 0, first = UINT32_MAX, nc = 0;
    double pd = -1;
    for (uint32_t p = 0; p < np && nc < 2; p++) {
        if (!(pmin[p] <= thrf))
            continue;
        for (uint32_t c = p * FKVFQ_PANEL; c < (p + 1) * FKVFQ_PANEL; c++)
            if (scores[c] <= thrf) {
                if (first == UINT32_MAX)
                    first = c;
                if (++nc == 2)
                    break;
            }
    }
    if (nc == 1) {
        pick = first;
    } else if (nc > 1) {
        for (uint32_t p = first / FKVFQ_PANEL; p < np; p++) {
            if (!(pmin[p] <= thrf))
                continue;
            for (uint32_t c = p * FKVFQ_PANEL; c < (p + 1) * FKVFQ_PANEL; c++) {
                if (!(scores[c] <= thrf))
                    continue;
                double dc = fkvfq_dist(x, t->rows + (size_t)c * dim, dim);
                if (pd < 0 || dc < pd) {
                    pd = dc;
                    pick = c;
                }
            }
        }
    } /* nc == 0: not-a-number inputs; centroid 0 */
    if (dist)
        *dist = pd >= 0 ? pd : fkvfq_dist(x, t->rows + (size_t)pick * dim, dim);
    return pick;
}

static fkvfq_table rvq_table(const fkvf_rvq *q, size_t tab, unsigned kv, unsigned s)
{
    fkvfq_table t;
    size_t off = fkvfq_table_off(q, tab, kv, s), si = stage_index(q, tab, kv, s);
    t.rows = q->rows + off;
    t.panels = L_.panels + off;
    t.norms = L_.norms + si * q->shape.k;
    t.cmax = L_.cmax[si];
    t.k = q->shape.k;
    t.dim = kv == 0 ? q->shape.key_dim : q->shape.value_dim;
    return t;
}

typedef struct beam_cand {
    double key;
    uint32_t b, c;
} beam_cand;

typedef struct enc_scratch {
    float *x;        /* Q_CHUNK vectors of dmax */
    float *scores;   /* nsc * k */
    float *pmin;     /* nsc * k / FKVFQ_PANEL */
    double *freqs;   /* rope_dims / 2 */
    double *cs;      /* Q_CHUNK * rope_dims */
    /* beam */
    float *res[2];   /* B * dmax each */
    double *err[2];  /* B each */
    uint16_t *path[2]; /* B * 16 each */
    beam_cand *cand; /* B - 1 */
    float *recon;    /* dmax */
} enc_scratch;

/* Beam search for one vector x of table set (tab, kv) with ns stages; the
 * chosen codes go to out[s * ostride]. */
static void beam_one(const fkvf_rvq *q, enc_scratch *w, size_t tab, unsigned kv, unsigned ns,
                     unsigned B, const float *x, uint16_t *out, size_t ostride)
{
    const uint32_t k = q->shape.k, dim = kv == 0 ? q->shape.key_dim : q->shape.value_dim;
    unsigned nb = 1, cur = 0;
    memcpy(w->res[0], x, dim * sizeof(float));
    double e0 = 0;
    for (uint32_t d = 0; d < dim; d++)
        e0 += (double)x[d] * x[d];
    w->err[0][0] = e0;
    for (unsigned s = 0; s < ns; s++) {
        fkvfq_table t = rvq_table(q, tab, kv, s);
        const float *res = w->res[cur];
        for (unsigned b0 = 0; b0 < nb; b0 += FKVFQ_BLOCK) {
            const float *xp[FKVFQ_BLOCK];
            for (unsigned u = 0; u < FKVFQ_BLOCK; u++)
                xp[u] = res + (size_t)(b0 + u < nb ? b0 + u : nb - 1) * dim;
            fkvfq_scores4_isa(FKVFQ_ISA_AVX2, &t, xp, w->scores + (size_t)b0 * k,
                          w->pmin + (size_t)b0 * (k / FKVFQ_PANEL));
        }
        /* slot 0 carries the greedy path: its exact nearest centroid */
        uint32_t cg = ref_pick(&t, res, w->scores, w->pmin, NULL);
        /* the B-1 best other candidates by estimated error, ties to (b, c) order */
        unsigned nc = 0, cap = B - 1;
        for (unsigned b = 0; b < nb && cap; b++) {
            const float *sc = w->scores + (size_t)b * k;
            double eb = w->err[cur][b];
            for (uint32_t c = 0; c < k; c++) {
                if (b == 0 && c == cg)
                    continue;
                double key = eb + (double)sc[c];
                if (nc == cap && !(key < w->cand[nc - 1].key))
                    continue;
                unsigned pos = nc < cap ? nc++ : nc - 1;
                while (pos > 0 && key < w->cand[pos - 1].key) {
                    w->cand[pos] = w->cand[pos - 1];
                    pos--;
                }
                w->cand[pos].key = key;
                w->cand[pos].b = b;
                w->cand[pos].c = c;
            }
        }
        /* build the next set of paths */
        unsigned nxt = cur ^ 1;
        for (unsigned i = 0; i <= nc; i++) {
            uint32_t b = i == 0 ? 0 : w->cand[i - 1].b, c = i == 0 ? cg : w->cand[i - 1].c;
            const float *pr = res + (size_t)b * dim, *row = t.rows + (size_t)c * dim;
            float *nr = w->res[nxt] + (size_t)i * dim;
            double e = 0;
            for (uint32_t d = 0; d < dim; d++) {
                nr[d] = pr[d] - row[d];
                e += (double)nr[d] * nr[d];
            }
            w->err[nxt][i] = e;
            memcpy(w->path[nxt] + (size_t)i * 16, w->path[cur] + (size_t)b * 16,
                   s * sizeof(uint16_t));
            w->path[nxt][(size_t)i * 16 + s] = (uint16_t)c;
        }
        nb = nc + 1;
        cur = nxt;
    }
    /* final choice by the decoder's reconstruction; ties keep the earlier
     * slot, so greedy (slot 0) wins ties */
    unsigned best = 0;
    double be = 0;
    for (unsigned i = 0; i < nb; i++) {
        const uint16_t *pa = w->path[cur] + (size_t)i * 16;
        for (uint32_t d = 0; d < dim; d++)
            w->recon[d] = 0.0f;
        for (unsigned s = 0; s < ns; s++) {
            const float *row = q->rows + fkvfq_table_off(q, tab, kv, s) + (size_t)pa[s] * dim;
            for (uint32_t d = 0; d < dim; d++)
                w->recon[d] += row[d];
        }
        double e = fkvfq_dist(x, w->recon, dim);
        if (i == 0 || e < be) {
            be = e;
            best = i;
        }
    }
    for (unsigned s = 0; s < ns; s++)
        out[s * ostride] = w->path[cur][(size_t)best * 16 + s];
}

static void enc_free(const fkvf_allocator *a, enc_scratch *w)
{
    fkvf_free(a, w->x);
    fkvf_free(a, w->scores);
    fkvf_free(a, w->pmin);
    fkvf_free(a, w->freqs);
    fkvf_free(a, w->cs);
    for (int i = 0; i < 2; i++) {
        fkvf_free(a, w->res[i]);
        fkvf_free(a, w->err[i]);
        fkvf_free(a, w->path[i]);
    }
    fkvf_free(a, w->cand);
    fkvf_free(a, w->recon);
}

int encode_ref(const fkvf_rvq *q, const fkvf_rows *rows, const fkvf_rope *key_rope,
                             unsigned beam_width, uint16_t *codes, size_t pos_stride,
                             size_t code_stride)
{
    if (!FKVF_RVQ_OK(q) || !rows || beam_width > FKVF_RVQ_MAX_BEAM)
        return FKVF_E_INVALID_ARG;
    if (q->decode_only)
        return FKVF_E_STATE; /* no search layout: loaded for decoding only */
    const fkvf_codebook_shape *sh = &q->shape;
    size_t es = fkvfq_dtype_size(rows->dtype), rb = es ? row_bytes(q, rows->dtype) : 0, all;
    if (!rb || (key_rope && !fkvf_rope_valid(key_rope, sh->key_dim)) ||
        !fkvf_mulsz(rows->n_rows, rb, &all) || (rows->n_rows && !rows->data) ||
        (rows->n_rows && rows->first_position > UINT64_MAX - (rows->n_rows - 1)))
        return FKVF_E_INVALID_ARG;
    int rc = codes_check(q, rows->n_rows, pos_stride, code_stride);
    if (rc)
        return rc;
    if (!rows->n_rows || !fkvf_rvq_codes_per_position(q))
        return FKVF_OK;
    if (!codes)
        return FKVF_E_INVALID_ARG;

    const fkvf_allocator *a = &q->alloc;
    const uint32_t k = sh->k;
    const unsigned B = beam_width <= 1 ? 1 : beam_width;
    const uint32_t dmax = sh->key_dim > sh->value_dim ? sh->key_dim : sh->value_dim;
    const uint32_t rd = key_rope ? key_rope->rope_dims : 0;
    unsigned nsc = B < FKVFQ_BLOCK ? FKVFQ_BLOCK : (B + FKVFQ_BLOCK - 1) / FKVFQ_BLOCK * FKVFQ_BLOCK;
    enc_scratch w;
    memset(&w, 0, sizeof w);
    int ok = (w.x = fkvf_calloc(a, (size_t)Q_CHUNK * dmax, sizeof(float))) &&
             (w.scores = fkvf_calloc(a, (size_t)nsc * k, sizeof(float))) &&
             (w.pmin = fkvf_calloc(a, (size_t)nsc * (k / FKVFQ_PANEL), sizeof(float)));
    if (ok && rd)
        ok = (w.freqs = fkvf_calloc(a, rd / 2, sizeof(double))) &&
             (w.cs = fkvf_calloc(a, (size_t)Q_CHUNK * rd, sizeof(double)));
    if (ok && B > 1) {
        for (int i = 0; i < 2 && ok; i++)
            ok = (w.res[i] = fkvf_calloc(a, (size_t)B * dmax, sizeof(float))) &&
                 (w.err[i] = fkvf_calloc(a, B, sizeof(double))) &&
                 (w.path[i] = fkvf_calloc(a, (size_t)B * 16, sizeof(uint16_t)));
        ok = ok && (w.cand = fkvf_calloc(a, B, sizeof(beam_cand))) &&
             (w.recon = fkvf_calloc(a, dmax, sizeof(float)));
    }
    if (ok && layout_build(q))
        ok = 0;
    if (!ok) {
        layout_free();
        enc_free(a, &w);
        return FKVF_E_NOMEM;
    }
    if (rd)
        fkvf_rope_freqs(key_rope, w.freqs);

    const uint8_t *data = rows->data;
    for (size_t i0 = 0; i0 < rows->n_rows; i0 += Q_CHUNK) {
        size_t nb = rows->n_rows - i0 < Q_CHUNK ? rows->n_rows - i0 : Q_CHUNK;
        if (rd)
            for (size_t j = 0; j < nb; j++)
                fkvf_rope_angles(key_rope, w.freqs, rows->first_position + i0 + j,
                                  w.cs + j * rd);
        for (uint32_t l = 0; l < sh->n_layers; l++)
            for (uint32_t h = 0; h < q->n_kv_heads; h++)
                for (unsigned kv = 0; kv < 2; kv++) {
                    unsigned ns = kv == 0 ? sh->k_stages : sh->v_stages;
                    uint32_t dim = kv == 0 ? sh->key_dim : sh->value_dim;
                    if (!ns)
                        continue;
                    size_t tab = (size_t)l * sh->n_heads + (sh->pooled ? 0 : h);
                    size_t eoff = vec_off(q, l, h, kv) * es;
                    for (size_t j = 0; j < nb; j++) {
                        float *xj = w.x + j * dim;
                        fkvfq_load_portable(rows->dtype, data + (i0 + j) * rb + eoff, xj, dim);
                        if (kv == 0 && rd)
                            fkvf_rope_rotate_f32(key_rope, w.cs + j * rd, 1, xj, 0);
                    }
                    size_t c0 = code_index(q, l, h, kv, 0);
                    if (B > 1) {
                        for (size_t j = 0; j < nb; j++)
                            beam_one(q, &w, tab, kv, ns, B, w.x + j * dim,
                                     codes + (i0 + j) * pos_stride + c0 * code_stride,
                                     code_stride);
                        continue;
                    }
                    for (unsigned s = 0; s < ns; s++) {
                        fkvfq_table t = rvq_table(q, tab, kv, s);
                        for (size_t j0 = 0; j0 < nb; j0 += FKVFQ_BLOCK) {
                            const float *xp[FKVFQ_BLOCK];
                            for (size_t u = 0; u < FKVFQ_BLOCK; u++)
                                xp[u] = w.x + (j0 + u < nb ? j0 + u : nb - 1) * dim;
                            fkvfq_scores4_isa(FKVFQ_ISA_AVX2, &t, xp, w.scores, w.pmin);
                            for (size_t u = 0; u < FKVFQ_BLOCK && j0 + u < nb; u++) {
                                uint32_t c = ref_pick(&t, xp[u], w.scores + u * k,
                                                        w.pmin + u * (k / FKVFQ_PANEL), NULL);
                                codes[(i0 + j0 + u) * pos_stride + (c0 + s) * code_stride] =
                                    (uint16_t)c;
                                float *xr = w.x + (j0 + u) * dim;
                                const float *row = t.rows + (size_t)c * dim;
                                for (uint32_t d = 0; d < dim; d++)
                                    xr[d] -= row[d];
                            }
                        }
                    }
                }
    }
    layout_free();
    enc_free(a, &w);
    return FKVF_OK;
}

