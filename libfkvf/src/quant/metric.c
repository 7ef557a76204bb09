/* The encoder metric of a codebook handle (spec 13.8): the matrices, their
 * factors and the handle of transformed tables that encoding searches. With
 * M = U^T U (U = L^T, the binary64 Cholesky factor), e^T M e = |U e|^2: the
 * encoder's exact Euclidean search over U c, given U x, is the search under
 * M. Training under a metric (train.c) uses the same factors. */
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "metric_matrix.h"
#include "quant.h"

void fkvfq_metric_release(fkvf_rvq *q)
{
    fkvf_free(&q->alloc, q->mk);
    fkvf_free(&q->alloc, q->mv);
    fkvf_free(&q->alloc, q->uk);
    fkvf_free(&q->alloc, q->uv);
    fkvf_rvq_free(q->menc);
    q->mk = q->mv = NULL;
    q->uk = q->uv = NULL;
    q->menc = NULL;
}

void fkvfq_metric_solve(const double *u, uint32_t n, const float *y, double *x)
{
    for (uint32_t i = n; i-- > 0;) {
        const double *ui = u + (size_t)i * n;
        double s = (double)y[i];
        for (uint32_t j = i + 1; j < n; j++)
            s -= ui[j] * x[j];
        x[i] = s / ui[i];
    }
}

/* The factors of one part: n_tabs matrices of dim, each taken as its
 * symmetric part and checked. */
static int factor_part(const fkvf_allocator *a, const float *m, size_t n_tabs, uint32_t dim,
                       double **out)
{
    size_t nn = (size_t)dim * dim, all;
    if (!fkvf_mulsz(n_tabs, nn, &all))
        return FKVF_E_NOMEM;
    double *u = fkvf_calloc(a, all, sizeof(double));
    double *l = fkvf_calloc(a, nn, sizeof(double));
    float *sym = fkvf_calloc(a, nn, sizeof(float));
    int rc = u && l && sym ? FKVF_OK : FKVF_E_NOMEM;
    for (size_t t = 0; t < n_tabs && !rc; t++) {
        fkvf_metric_symmetrize(m + t * nn, dim, sym);
        if (fkvf_metric_check(sym, dim, l, NULL) != FKVF_METRIC_OK)
            rc = FKVF_E_INVALID_ARG;
        else
            fkvf_metric_transpose(l, dim, u + t * nn);
    }
    fkvf_free(a, l);
    fkvf_free(a, sym);
    if (rc) {
        fkvf_free(a, u);
        return rc;
    }
    *out = u;
    return FKVF_OK;
}

int fkvfq_metric_factor(const fkvf_allocator *a, const fkvf_codebook_shape *sh,
                        const fkvf_rvq_metric *m, double **uk, double **uv)
{
    *uk = *uv = NULL;
    if (!m || (!m->keys && !m->values) ||
        (m->keys && sh->key_dim > FKVF_METRIC_MAX_DIM) ||
        (m->values && sh->value_dim > FKVF_METRIC_MAX_DIM))
        return FKVF_E_INVALID_ARG;
    size_t n_tabs = (size_t)sh->n_layers * sh->n_heads;
    int rc = FKVF_OK;
    if (m->keys)
        rc = factor_part(a, m->keys, n_tabs, sh->key_dim, uk);
    if (!rc && m->values)
        rc = factor_part(a, m->values, n_tabs, sh->value_dim, uv);
    if (rc) {
        fkvf_free(a, *uk);
        *uk = NULL;
    }
    return rc;
}

/* A copy of part m's matrices (n_tabs of dim), each its symmetric part. */
static float *copy_part(const fkvf_allocator *a, const float *m, size_t n_tabs, uint32_t dim)
{
    size_t nn = (size_t)dim * dim;
    float *c = fkvf_calloc(a, n_tabs, nn * sizeof(float));
    for (size_t t = 0; c && t < n_tabs; t++)
        fkvf_metric_symmetrize(m + t * nn, dim, c + t * nn);
    return c;
}

/* The handle of q's tables transformed by the factors: every centroid c of
 * table (l, h, part) becomes U c (binary32), walking the tables in spec
 * 13.2 order (a layer table's counts included). */
static int build_menc(fkvf_rvq *q, const double *uk, const double *uv, fkvf_rvq **out)
{
    const fkvf_codebook_shape *sh = &q->shape;
    const fkvf_allocator *a = &q->alloc;
    size_t bytes = fkvf_rvq_tables_size(q), es = sh->dtype == FKVF_DTYPE_F16 ? 2 : 4;
    size_t n = bytes / es;
    uint8_t *raw = fkvf_malloc(a, bytes ? bytes : 1);
    float *t = fkvf_calloc(a, n ? n : 1, sizeof(float));
    float *tmp = fkvf_calloc(a, sh->key_dim > sh->value_dim ? sh->key_dim : sh->value_dim,
                             sizeof(float));
    int rc = raw && t && tmp ? fkvf_rvq_tables(q, raw, bytes) : FKVF_E_NOMEM;
    if (rc == FKVF_OK) {
        fkvfq_load(sh->dtype, raw, t, n);
        float *p = t;
        for (uint32_t l = 0; l < sh->n_layers; l++)
            for (uint32_t h = 0; h < sh->n_heads; h++)
                for (unsigned kv = 0; kv < 2; kv++) {
                    unsigned ns = kv == 0 ? fkvf_layer_k_stages(sh, l) : fkvf_layer_v_stages(sh, l);
                    uint32_t dim = kv == 0 ? sh->key_dim : sh->value_dim;
                    const double *u = kv == 0 ? uk : uv;
                    size_t rows = (size_t)ns * sh->k;
                    if (u) {
                        const double *ut = u + ((size_t)l * sh->n_heads + h) * dim * dim;
                        for (size_t c = 0; c < rows; c++) {
                            fkvf_metric_apply(ut, dim, p + c * dim, tmp);
                            memcpy(p + c * dim, tmp, dim * sizeof(float));
                        }
                    }
                    p += rows * dim;
                }
        /* the transformed tables as binary32 bytes (the raw buffer holds
         * them when the codebook is f32; an f16 one needs twice its size) */
        if (es != 4) {
            fkvf_free(a, raw);
            raw = fkvf_malloc(a, n ? n * 4 : 1);
        }
        if (!raw) {
            rc = FKVF_E_NOMEM;
        } else {
            fkvfq_store(FKVF_DTYPE_F32, t, raw, n);
            fkvf_codebook_shape s32 = *sh;
            s32.dtype = FKVF_DTYPE_F32;
            /* FKVF_E_INVALID_ARG: a transformed centroid beyond binary32 */
            rc = fkvf_rvq_from_tables(out, &s32, q->n_kv_heads, raw, n * 4, a);
        }
    }
    fkvf_free(a, raw);
    fkvf_free(a, t);
    fkvf_free(a, tmp);
    return rc;
}

FKVF_API int fkvf_rvq_set_metric(fkvf_rvq *q, const fkvf_rvq_metric *m)
{
    if (!FKVF_RVQ_OK(q) || q->decode_only)
        return FKVF_E_INVALID_ARG;
    if (!m || (!m->keys && !m->values)) {
        fkvfq_metric_release(q);
        return FKVF_OK;
    }
    const fkvf_codebook_shape *sh = &q->shape;
    size_t n_tabs = (size_t)sh->n_layers * sh->n_heads;
    double *uk, *uv;
    int rc = fkvfq_metric_factor(&q->alloc, sh, m, &uk, &uv);
    if (rc)
        return rc;
    float *mk = m->keys ? copy_part(&q->alloc, m->keys, n_tabs, sh->key_dim) : NULL;
    float *mv = m->values ? copy_part(&q->alloc, m->values, n_tabs, sh->value_dim) : NULL;
    fkvf_rvq *menc = NULL;
    if ((m->keys && !mk) || (m->values && !mv))
        rc = FKVF_E_NOMEM;
    else
        rc = build_menc(q, uk, uv, &menc);
    if (rc) {
        fkvf_free(&q->alloc, uk);
        fkvf_free(&q->alloc, uv);
        fkvf_free(&q->alloc, mk);
        fkvf_free(&q->alloc, mv);
        return rc;
    }
    fkvfq_metric_release(q);
    q->mk = mk;
    q->mv = mv;
    q->uk = uk;
    q->uv = uv;
    q->menc = menc;
    return FKVF_OK;
}

FKVF_API int fkvf_rvq_get_metric(const fkvf_rvq *q, fkvf_rvq_metric *out)
{
    if (out)
        out->keys = out->values = NULL;
    if (!FKVF_RVQ_OK(q) || (!q->mk && !q->mv))
        return 0;
    if (out) {
        out->keys = q->mk;
        out->values = q->mv;
    }
    return 1;
}

FKVF_API int fkvf_metric_matrix_check(const float *m, uint32_t dim, size_t *bad)
{
    if (!m || dim < 1 || dim > FKVF_METRIC_MAX_DIM)
        return -1;
    double *l = fkvf_calloc(NULL, (size_t)dim * dim, sizeof(double));
    float *sym = fkvf_calloc(NULL, (size_t)dim * dim, sizeof(float));
    int v = -1;
    if (l && sym) {
        fkvf_metric_symmetrize(m, dim, sym);
        v = fkvf_metric_check(sym, dim, l, bad);
    }
    fkvf_free(NULL, l);
    fkvf_free(NULL, sym);
    return v;
}
