/* The RVQ codebook handle: shape checks, CBK1 tables in and out, stage
 * subsets, encoding (greedy and beam) and decoding (spec 13.6). */
#include <math.h>
#include <string.h>

#include "alloc.h"
#include "cbk1_layout.h"
#include "ckd.h"
#include "cpu.h"
#include "half.h"
#include "quant.h"
#include "metric_matrix.h"
#include "parallel.h"
#include "rope.h"
#include "stage_sum.h"
#include "vec16.h"

/* positions converted and searched together (Q_CHUNK_SMALL for long
 * vectors, to bound the scratch) */
#define Q_CHUNK 256
#define Q_CHUNK_SMALL 64
/* A chunk of at least Q_PANEL_MIN vectors is scored from a panel copy of
 * the stage table made for it (fkvfq_scores4: faster per vector, and the
 * copy costs a few percent of that many vectors' search) when the table
 * has at most Q_PANEL_FLOATS elements; smaller chunks (the appender's few
 * positions per commit) and larger tables are scored from the rows
 * (fkvfq_scores_rows). Both give the same bits. */
#define Q_PANEL_MIN 128
#define Q_PANEL_FLOATS ((size_t)1 << 18)
/* With several threads (fkvf_rvq_set_threads) a call's rows are cut into one
 * contiguous range per thread, none shorter than this many rows (a shorter
 * call runs on the calling thread): every row is encoded and decoded on its
 * own, so the ranges give the bits one range gives. */
#define Q_PAR_ROWS 16

/* ---- shape and handle ------------------------------------------------------ */

/* a codebook shape the quantizer takes: FKVF_OK or FKVF_E_INVALID_ARG */
static int shape_check(const fkvf_codebook_shape *s)
{
    if (!s || s->n_layers < 1 || s->n_layers > 1024 || s->n_heads < 1 || s->n_heads > 1024 ||
        s->key_dim < 1 || s->key_dim > 16384 || s->value_dim < 1 || s->value_dim > 16384 ||
        s->k < 16 || s->k > 4096 || (s->k & (s->k - 1)) || s->k_stages > 16 ||
        s->v_stages > 16 || (s->dtype != FKVF_DTYPE_F16 && s->dtype != FKVF_DTYPE_F32) ||
        s->pooled > 1 || (s->pooled && s->n_heads != 1))
        return FKVF_E_INVALID_ARG;
    if (s->layer_stages &&
        fkvf_cbk1_table_bad(s->layer_stages, s->n_layers, s->k_stages, s->v_stages))
        return FKVF_E_INVALID_ARG;
    return FKVF_OK;
}

/* A valid shape as the handle keeps it: a table whose layers all have the
 * same counts dropped (the uniform shape, spec 13.1). */
static fkvf_codebook_shape shape_norm(const fkvf_codebook_shape *s)
{
    fkvf_codebook_shape n = *s;
    if (fkvfq_lay_uniform(s))
        n.layer_stages = NULL;
    return n;
}

int fkvfq_rvq_alloc(fkvf_rvq **out, const fkvf_codebook_shape *shape, uint32_t n_kv_heads,
                    int decode_only, const fkvf_allocator *alloc)
{
    *out = NULL;
    if (shape_check(shape) || n_kv_heads < 1 || n_kv_heads > 1024 ||
        (!shape->pooled && n_kv_heads != shape->n_heads))
        return FKVF_E_INVALID_ARG;
    size_t n_tabs = (size_t)shape->n_layers * shape->n_heads; /* <= 2^20 */
    size_t kd, vd, per, total, bytes, nst, nnorm, nb, cb;
    if (!fkvf_mulsz((size_t)shape->k_stages * shape->key_dim, shape->k, &kd) ||
        !fkvf_mulsz((size_t)shape->v_stages * shape->value_dim, shape->k, &vd) ||
        !fkvf_addsz(kd, vd, &per) || !fkvf_mulsz(per, n_tabs, &total) ||
        !fkvf_mulsz(total, sizeof(float), &bytes) ||
        !fkvf_mulsz(n_tabs, (size_t)shape->k_stages + shape->v_stages, &nst) ||
        !fkvf_mulsz(nst, shape->k, &nnorm) || !fkvf_mulsz(nnorm, sizeof(float), &nb) ||
        !fkvf_mulsz(nst, sizeof(double), &cb))
        return FKVF_E_NOMEM;
    /* the CBK1 tables must be addressable too (f32: the same byte count) */
    fkvf_rvq *q = fkvf_malloc(alloc, sizeof *q);
    if (!q)
        return FKVF_E_NOMEM;
    memset(q, 0, sizeof *q);
    fkvf_handle_init(&q->h, FKVF_HANDLE_RVQ);
    q->alloc = *fkvf_alloc_or_default(alloc);
    q->shape = *shape;
    q->n_kv_heads = n_kv_heads;
    q->n_tabs = n_tabs;
    q->per_tab = per;
    q->n_floats = total;
    q->decode_only = decode_only == FKVFQ_LAYOUT_DECODE || decode_only == FKVFQ_LAYOUT_F16;
    if (decode_only == FKVFQ_LAYOUT_F16) {
        /* no tables: fkvf_rvq_from_tables16_borrow points rows16 at the caller's */
    } else if (decode_only == FKVFQ_LAYOUT_F16_ENCODE) {
        /* no tables either (fkvf_rvq_from_tables16_encode), the search layout */
        if (total && (!(q->norms = fkvf_malloc(&q->alloc, nb)) ||
                      !(q->cmax = fkvf_malloc(&q->alloc, cb)))) {
            fkvf_rvq_free(q);
            return FKVF_E_NOMEM;
        }
    } else if (total && q->decode_only) {
        if (!(q->rows = fkvf_malloc(&q->alloc, bytes))) {
            fkvf_rvq_free(q);
            return FKVF_E_NOMEM;
        }
    } else if (total) {
        int pan = decode_only == FKVFQ_LAYOUT_PANELS;
        q->rows = fkvf_malloc(&q->alloc, bytes);
        q->panels = q->rows && pan ? fkvf_malloc(&q->alloc, bytes) : NULL;
        q->norms = q->rows && (q->panels || !pan) ? fkvf_malloc(&q->alloc, nb) : NULL;
        q->cmax = q->norms ? fkvf_malloc(&q->alloc, cb) : NULL;
        if (!q->cmax) {
            fkvf_rvq_free(q);
            return FKVF_E_NOMEM;
        }
    }
    *out = q;
    return FKVF_OK;
}

FKVF_API void fkvf_rvq_free(fkvf_rvq *q)
{
    if (!FKVF_RVQ_OK(q))
        return;
    q->h.magic = 0;
    fkvfq_lay_release(q);
    fkvfq_metric_release(q);
    fkvf_allocator a = q->alloc;
    fkvf_free(&a, q->rows);
    fkvf_free(&a, q->panels);
    fkvf_free(&a, q->norms);
    fkvf_free(&a, q->cmax);
    fkvf_free(&a, q);
}

size_t fkvfq_table_off(const fkvf_rvq *q, size_t tab, unsigned kv, unsigned s)
{
    return fkvf_cbk1_table_off(&q->shape, tab, kv, s);
}

static size_t stage_index(const fkvf_rvq *q, size_t tab, unsigned kv, unsigned s)
{
    return tab * ((size_t)q->shape.k_stages + q->shape.v_stages) +
           (kv == 0 ? s : (size_t)q->shape.k_stages + s);
}

/* view of stage table (tab, kv, s) */
static fkvfq_table rvq_table(const fkvf_rvq *q, size_t tab, unsigned kv, unsigned s)
{
    fkvfq_table t;
    size_t off = fkvfq_table_off(q, tab, kv, s), si = stage_index(q, tab, kv, s);
    t.rows = q->rows ? q->rows + off : NULL; /* NULL: f16 tables in place (rows16) */
    t.panels = q->panels ? q->panels + off : NULL;
    t.norms = q->norms + si * q->shape.k;
    t.cmax = q->cmax[si];
    t.k = q->shape.k;
    t.dim = kv == 0 ? q->shape.key_dim : q->shape.value_dim;
    return t;
}

/* 1 if none of the n f16 values at t is an infinity or a NaN (all exponent
 * bits set): what fkvf_rvq_from_tables refuses after widening */
static int f16_all_finite(const uint16_t *t, size_t n)
{
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++)
        bad |= (t[i] & 0x7C00u) == 0x7C00u;
    return !bad;
}

int fkvfq_rvq_prepare(fkvf_rvq *q)
{
    void *scratch = fkvf_malloc(&q->alloc, fkvfq_prepare_scratch(q->shape.k));
    if (!scratch)
        return FKVF_E_NOMEM;
    /* f16 tables in place (rows16): each stage table widened into a scratch
     * table first, the same binary32 values a binary32 copy would hold */
    const uint32_t dmax = q->shape.key_dim > q->shape.value_dim ? q->shape.key_dim
                                                              : q->shape.value_dim;
    /* norms straight from the f16 rows when there are no panels to fill */
    const int n16 = q->rows16 && !q->panels && fkvfq_table_norms16_usable();
    float *t32 = NULL;
    if (q->rows16 && !n16 &&
        !(t32 = fkvf_malloc(&q->alloc, (size_t)q->shape.k * dmax * sizeof(float)))) {
        fkvf_free(&q->alloc, scratch);
        return FKVF_E_NOMEM;
    }
    for (size_t tab = 0; tab < q->n_tabs; tab++)
        for (unsigned kv = 0; kv < 2; kv++) {
            unsigned ns = kv == 0 ? q->shape.k_stages : q->shape.v_stages;
            uint32_t dim = kv == 0 ? q->shape.key_dim : q->shape.value_dim;
            for (unsigned s = 0; s < ns; s++) {
                size_t off = fkvfq_table_off(q, tab, kv, s), si = stage_index(q, tab, kv, s);
                if (n16) {
                    if (!fkvfq_table_norms16(q->rows16 + off, q->shape.k, dim,
                                             q->norms + si * q->shape.k, &q->cmax[si],
                                             scratch)) {
                        fkvf_free(&q->alloc, scratch);
                        return FKVF_E_INVALID_ARG;
                    }
                    continue;
                }
                const float *rows = t32 ? t32 : q->rows + off;
                if (t32) {
                    if (!f16_all_finite(q->rows16 + off, (size_t)q->shape.k * dim)) {
                        fkvf_free(&q->alloc, t32);
                        fkvf_free(&q->alloc, scratch);
                        return FKVF_E_INVALID_ARG;
                    }
                    fkvfq_load(FKVF_DTYPE_F16, (const uint8_t *)(q->rows16 + off), t32,
                               (size_t)q->shape.k * dim);
                }
                if (q->panels)
                    fkvfq_table_prepare(rows, q->shape.k, dim, q->panels + off,
                                        q->norms + si * q->shape.k, &q->cmax[si], scratch);
                else
                    fkvfq_table_norms(rows, q->shape.k, dim, q->norms + si * q->shape.k,
                                      &q->cmax[si], scratch);
            }
        }
    fkvf_free(&q->alloc, t32);
    fkvf_free(&q->alloc, scratch);
    return FKVF_OK;
}

FKVF_API void fkvf_rvq_shape(const fkvf_rvq *q, fkvf_codebook_shape *shape, uint32_t *n_kv_heads)
{
    int ok = FKVF_RVQ_OK(q);
    if (shape) {
        if (ok)
            *shape = q->shape;
        else
            memset(shape, 0, sizeof *shape);
    }
    if (n_kv_heads)
        *n_kv_heads = ok ? q->n_kv_heads : 0;
}

FKVF_API size_t fkvf_rvq_tables_size(const fkvf_rvq *q)
{
    if (!FKVF_RVQ_OK(q))
        return 0;
    /* n_floats * 4 was checked at allocation; f16 is half of it */
    return q->n_floats * (q->shape.dtype == FKVF_DTYPE_F16 ? 2 : 4);
}

FKVF_API int fkvf_rvq_tables(const fkvf_rvq *q, void *out, size_t size)
{
    if (!FKVF_RVQ_OK(q) || (!out && size) || size != fkvf_rvq_tables_size(q))
        return FKVF_E_INVALID_ARG;
    if (q->lay) { /* spec 13.2: the layers' tables one after another */
        uint8_t *o = out;
        for (uint32_t l = 0; l < q->shape.n_layers; l++) {
            size_t n = fkvf_rvq_tables_size(q->lay[l]);
            int rc = fkvf_rvq_tables(q->lay[l], o, n);
            if (rc)
                return rc;
            o += n;
        }
        return FKVF_OK;
    }
    if (size && q->rows16)
        memcpy(out, q->rows16, size); /* f16 in place: the tables as stored (little-endian) */
    else if (size)
        fkvfq_store(q->shape.dtype, q->rows, out, q->n_floats);
    return FKVF_OK;
}

/* A per-layer handle of shape (a table that is not uniform) made by `one`
 * (from_tables or borrow16) from each layer's slice of the tables (spec
 * 13.2: layer after layer). */
typedef int (*one_fn)(fkvf_rvq **out, const fkvf_codebook_shape *shape, uint32_t n_kv_heads,
                      const void *tables, size_t size, const fkvf_allocator *alloc, int mode);
static int from_layers(fkvf_rvq **out, const fkvf_codebook_shape *shape, uint32_t n_kv_heads,
                       const void *tables, size_t size, const fkvf_allocator *alloc, int mode,
                       one_fn one)
{
    if (!n_kv_heads)
        n_kv_heads = shape->n_heads;
    if (n_kv_heads < 1 || n_kv_heads > 1024 || (!shape->pooled && n_kv_heads != shape->n_heads))
        return FKVF_E_INVALID_ARG;
    fkvf_rvq *q;
    int rc = fkvfq_lay_new(&q, shape, n_kv_heads, alloc);
    if (rc)
        return rc;
    const uint8_t *t = tables;
    size_t left = size;
    for (uint32_t l = 0; l < shape->n_layers; l++) {
        fkvf_codebook_shape one_sh = fkvfq_lay_shape(shape, l);
        uint64_t n = fkvf_codebook_size(&one_sh) - 64;
        fkvf_rvq *sub;
        if (n > left || (rc = one(&sub, &one_sh, n_kv_heads, t, (size_t)n, alloc, mode))) {
            fkvf_rvq_free(q);
            return rc ? rc : FKVF_E_INVALID_ARG;
        }
        fkvfq_lay_adopt(q, l, sub);
        t += n;
        left -= (size_t)n;
    }
    if (left) {
        fkvf_rvq_free(q);
        return FKVF_E_INVALID_ARG;
    }
    *out = q;
    return FKVF_OK;
}

static int from_tables(fkvf_rvq **out, const fkvf_codebook_shape *shape, uint32_t n_kv_heads,
                       const void *tables, size_t size, const fkvf_allocator *alloc,
                       int decode_only)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (shape_check(shape) || (!tables && size))
        return FKVF_E_INVALID_ARG;
    if (!fkvfq_lay_uniform(shape))
        return from_layers(out, shape, n_kv_heads, tables, size, alloc, decode_only, from_tables);
    fkvf_codebook_shape norm = shape_norm(shape);
    shape = &norm;
    if (!n_kv_heads)
        n_kv_heads = shape->n_heads;
    fkvf_rvq *q;
    int rc = fkvfq_rvq_alloc(&q, shape, n_kv_heads,
                             decode_only ? FKVFQ_LAYOUT_DECODE : FKVFQ_LAYOUT_ENCODE, alloc);
    if (rc)
        return rc;
    if (size != fkvf_rvq_tables_size(q)) {
        fkvf_rvq_free(q);
        return FKVF_E_INVALID_ARG;
    }
    if (size)
        fkvfq_load(shape->dtype, tables, q->rows, q->n_floats);
    for (size_t i = 0; i < q->n_floats; i++)
        if (!isfinite(q->rows[i])) {
            fkvf_rvq_free(q);
            return FKVF_E_INVALID_ARG;
        }
    if (!decode_only && (rc = fkvfq_rvq_prepare(q))) {
        fkvf_rvq_free(q);
        return rc;
    }
    *out = q;
    return FKVF_OK;
}

FKVF_API int fkvf_rvq_from_tables(fkvf_rvq **out, const fkvf_codebook_shape *shape,
                                  uint32_t n_kv_heads, const void *tables, size_t size,
                                  const fkvf_allocator *alloc)
{
    return from_tables(out, shape, n_kv_heads, tables, size, alloc, 0);
}

FKVF_API int fkvf_rvq_from_tables_decode(fkvf_rvq **out, const fkvf_codebook_shape *shape,
                                         uint32_t n_kv_heads, const void *tables, size_t size,
                                         const fkvf_allocator *alloc)
{
    return from_tables(out, shape, n_kv_heads, tables, size, alloc, 1);
}

/* The first ks key and vs value stage tables of table set stab of src into
 * table set dtab of dst (binary32 rows; both have at least those stages). */
static void copy_stages(fkvf_rvq *dst, size_t dtab, const fkvf_rvq *src, size_t stab,
                        unsigned ks, unsigned vs)
{
    size_t kb = (size_t)ks * src->shape.k * src->shape.key_dim * sizeof(float);
    size_t vb = (size_t)vs * src->shape.k * src->shape.value_dim * sizeof(float);
    if (kb)
        memcpy(dst->rows + fkvfq_table_off(dst, dtab, 0, 0),
               src->rows + fkvfq_table_off(src, stab, 0, 0), kb);
    if (vb)
        memcpy(dst->rows + fkvfq_table_off(dst, dtab, 1, 0),
               src->rows + fkvfq_table_off(src, stab, 1, 0), vb);
}

int fkvfq_rvq_take_layers(fkvf_rvq **out, const fkvf_rvq *q, const fkvf_codebook_shape *want)
{
    *out = NULL;
    fkvf_rvq *n;
    int rc = fkvfq_lay_new(&n, want, q->n_kv_heads, &q->alloc);
    if (rc)
        return rc;
    const int layout = q->decode_only ? FKVFQ_LAYOUT_DECODE
                       : q->panels    ? FKVFQ_LAYOUT_PANELS
                                      : FKVFQ_LAYOUT_ENCODE;
    for (uint32_t l = 0; l < want->n_layers; l++) {
        fkvf_codebook_shape one = fkvfq_lay_shape(want, l);
        fkvf_rvq *sub;
        if ((rc = fkvfq_rvq_alloc(&sub, &one, q->n_kv_heads, layout, &q->alloc))) {
            fkvf_rvq_free(n);
            return rc;
        }
        for (uint32_t h = 0; h < one.n_heads; h++)
            copy_stages(sub, h, q, (size_t)l * q->shape.n_heads + h, one.k_stages, one.v_stages);
        if (!sub->decode_only && (rc = fkvfq_rvq_prepare(sub))) {
            fkvf_rvq_free(sub);
            fkvf_rvq_free(n);
            return rc;
        }
        fkvfq_lay_adopt(n, l, sub);
    }
    *out = n;
    return FKVF_OK;
}

/* fkvf_rvq_subset of a per-layer handle: at most k_stages and v_stages in
 * every layer; a uniform handle when every layer is then left with the same
 * counts (the layers' tables copied into one set of tables). */
static int subset_layers(fkvf_rvq **out, const fkvf_rvq *q, unsigned k_stages,
                         unsigned v_stages)
{
    const uint32_t L = q->shape.n_layers;
    if (q->lay[0]->rows16)
        return FKVF_E_STATE;
    uint8_t t[2 * 1024];
    unsigned mk = 0, mv = 0;
    for (uint32_t l = 0; l < L; l++) {
        unsigned a = q->lst[2 * l] < k_stages ? q->lst[2 * l] : k_stages;
        unsigned b = q->lst[2 * l + 1] < v_stages ? q->lst[2 * l + 1] : v_stages;
        t[2 * l] = (uint8_t)a;
        t[2 * l + 1] = (uint8_t)b;
        mk = a > mk ? a : mk;
        mv = b > mv ? b : mv;
    }
    fkvf_codebook_shape sh = q->shape;
    sh.layer_stages = t;
    sh.k_stages = (uint8_t)mk;
    sh.v_stages = (uint8_t)mv;
    const int layout = q->decode_only ? FKVFQ_LAYOUT_DECODE
                       : q->lay[0]->panels ? FKVFQ_LAYOUT_PANELS
                                           : FKVFQ_LAYOUT_ENCODE;
    fkvf_rvq *n;
    int rc;
    if (fkvfq_lay_uniform(&sh)) {
        sh.layer_stages = NULL;
        if ((rc = fkvfq_rvq_alloc(&n, &sh, q->n_kv_heads, layout, &q->alloc)))
            return rc;
        /* layer l's tables: those of its handle's first stages */
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t h = 0; h < sh.n_heads; h++)
                copy_stages(n, (size_t)l * sh.n_heads + h, q->lay[l], h, mk, mv);
        if (!n->decode_only && (rc = fkvfq_rvq_prepare(n))) {
            fkvf_rvq_free(n);
            return rc;
        }
        *out = n;
        return FKVF_OK;
    }
    if ((rc = fkvfq_lay_new(&n, &sh, q->n_kv_heads, &q->alloc)))
        return rc;
    for (uint32_t l = 0; l < L; l++) {
        fkvf_rvq *sub;
        if ((rc = fkvf_rvq_subset(&sub, q->lay[l], t[2 * l], t[2 * l + 1]))) {
            fkvf_rvq_free(n);
            return rc;
        }
        fkvfq_lay_adopt(n, l, sub);
    }
    *out = n;
    return FKVF_OK;
}

static int subset_tables(fkvf_rvq **out, const fkvf_rvq *q, unsigned k_stages,
                         unsigned v_stages);

FKVF_API int fkvf_rvq_subset(fkvf_rvq **out, const fkvf_rvq *q, unsigned k_stages,
                             unsigned v_stages)
{
    int rc = subset_tables(out, q, k_stages, v_stages);
    if (rc != FKVF_OK || (q->mk == NULL && q->mv == NULL))
        return rc;
    fkvf_rvq_metric m = {q->mk, q->mv}; /* the subset encodes under q's metric */
    if ((rc = fkvf_rvq_set_metric(*out, &m)) != FKVF_OK) {
        fkvf_rvq_free(*out);
        *out = NULL;
    }
    return rc;
}

static int subset_tables(fkvf_rvq **out, const fkvf_rvq *q, unsigned k_stages,
                         unsigned v_stages)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!FKVF_RVQ_OK(q) || k_stages > q->shape.k_stages || v_stages > q->shape.v_stages)
        return FKVF_E_INVALID_ARG;
    if (q->lay)
        return subset_layers(out, q, k_stages, v_stages);
    if (q->rows16)
        return FKVF_E_STATE; /* f16 tables read in place: no binary32 tables to copy */
    fkvf_codebook_shape sh = q->shape;
    sh.k_stages = (uint8_t)k_stages;
    sh.v_stages = (uint8_t)v_stages;
    fkvf_rvq *n;
    int rc = fkvfq_rvq_alloc(&n, &sh, q->n_kv_heads,
                             q->decode_only ? FKVFQ_LAYOUT_DECODE
                             : q->panels    ? FKVFQ_LAYOUT_PANELS
                                            : FKVFQ_LAYOUT_ENCODE,
                             &q->alloc);
    if (rc)
        return rc;
    for (size_t tab = 0; tab < q->n_tabs; tab++)
        copy_stages(n, tab, q, tab, k_stages, v_stages);
    if (!n->decode_only && (rc = fkvfq_rvq_prepare(n))) {
        fkvf_rvq_free(n);
        return rc;
    }
    *out = n;
    return FKVF_OK;
}

FKVF_API const float *fkvf_rvq_centroids(const fkvf_rvq *q, uint32_t layer, uint32_t head,
                                         unsigned kv, unsigned stage)
{
    if (FKVF_RVQ_OK(q) && q->lay)
        return layer < q->shape.n_layers ? fkvf_rvq_centroids(q->lay[layer], 0, head, kv, stage)
                                         : NULL;
    if (!FKVF_RVQ_OK(q) || layer >= q->shape.n_layers || head >= q->n_kv_heads || kv > 1 ||
        stage >= (kv == 0 ? q->shape.k_stages : q->shape.v_stages))
        return NULL;
    if (!q->rows)
        return NULL; /* f16 tables read in place: no binary32 centroids */
    size_t tab = (size_t)layer * q->shape.n_heads + (q->shape.pooled ? 0 : head);
    return q->rows + fkvfq_table_off(q, tab, kv, stage);
}

FKVF_API size_t fkvf_rvq_codes_per_position(const fkvf_rvq *q)
{
    if (!FKVF_RVQ_OK(q))
        return 0;
    if (q->lay)
        return q->lcode[q->shape.n_layers];
    return (size_t)q->shape.n_layers * q->n_kv_heads * ((size_t)q->shape.k_stages + q->shape.v_stages);
}

/* ---- shared checks for encode / decode ---------------------------------------- */

/* Bytes of one cache row of q's shape in dtype dt; 0 on overflow. */
static size_t row_bytes(const fkvf_rvq *q, fkvf_dtype dt)
{
    size_t es = fkvfq_dtype_size(dt), n;
    size_t per_layer = (size_t)q->n_kv_heads * ((size_t)q->shape.key_dim + q->shape.value_dim);
    if (q->row_elems) /* a layer of a per-layer handle: whole rows */
        n = q->row_elems;
    else if (!fkvf_mulsz(per_layer, q->shape.n_layers, &n))
        return 0;
    if (!fkvf_mulsz(n, es, &n))
        return 0;
    return n;
}

/* Element offset of (layer, head, kv) within a row (spec 14.2). */
static size_t vec_off(const fkvf_rvq *q, uint32_t l, uint32_t h, unsigned kv)
{
    size_t H = q->n_kv_heads, Dk = q->shape.key_dim, Dv = q->shape.value_dim;
    size_t base = q->layer_elem + (size_t)l * H * (Dk + Dv);
    return kv == 0 ? base + h * Dk : base + H * Dk + h * Dv;
}

/* Do n_rows positions of nc codes at these strides fit in a size_t? */
static int codes_check_n(size_t nc, size_t n_rows, size_t pos_stride, size_t code_stride)
{
    size_t a, b, c;
    if (!n_rows || !nc)
        return FKVF_OK;
    if ((n_rows > 1 && !pos_stride) || (nc > 1 && !code_stride))
        return FKVF_E_INVALID_ARG;
    if (!fkvf_mulsz(n_rows - 1, pos_stride, &a) || !fkvf_mulsz(nc - 1, code_stride, &b) ||
        !fkvf_addsz(a, b, &c))
        return FKVF_E_INVALID_ARG;
    return FKVF_OK;
}

static int codes_check(const fkvf_rvq *q, size_t n_rows, size_t pos_stride, size_t code_stride)
{
    return codes_check_n(fkvf_rvq_codes_per_position(q), n_rows, pos_stride, code_stride);
}

static size_t code_index(const fkvf_rvq *q, uint32_t l, uint32_t h, unsigned kv, unsigned s)
{
    size_t m = (size_t)q->shape.k_stages + q->shape.v_stages;
    return ((size_t)l * q->n_kv_heads + h) * m + (kv == 0 ? s : (size_t)q->shape.k_stages + s);
}

/* ---- encoding ------------------------------------------------------------------ */

typedef struct beam_cand {
    double key;
    uint32_t b, c;
} beam_cand;

typedef struct enc_scratch {
    float *x;        /* one chunk (Q_CHUNK or Q_CHUNK_SMALL) of vectors of dmax */
    float *xt;       /* FKVFQ_LANES vectors of dmax, transposed (fkvfq_transpose_lanes) */
    float *pan;      /* one stage table in panels, or NULL (Q_PANEL_MIN) */
    float *scores;   /* nsc * k */
    float *pmin;     /* nsc * k / FKVFQ_PANEL */
    double *freqs;   /* rope_dims / 2 */
    double *cs;      /* one chunk * rope_dims */
    /* beam */
    float *res[2];   /* B * dmax each */
    double *err[2];  /* B each */
    uint16_t *path[2]; /* B * 16 each */
    beam_cand *cand; /* B - 1 */
    float *recon;    /* dmax */
    /* a handle of f16 tables in place (rows16): the stage tables of one
     * (layer, head, K|V) widened to binary32, max(ks, vs) * k * dmax */
    float *set;
    float *mt;       /* dmax: a vector transformed by a metric's U */
    /* the vectors of the table set after the current one (enc_next_set):
     * the current set's first stage prefetches them, pf_bytes a vector
     * (NULL: none) */
    const uint8_t *pf, *pft;
    size_t pf_bytes, pft_bytes;
} enc_scratch;

/* Stage table (tab, kv, s) as the encoder searches it: the handle's
 * binary32 rows, or those of w->set (filled by enc_widen_set) */
static fkvfq_table enc_table(const fkvf_rvq *q, const enc_scratch *w, size_t tab, unsigned kv,
                             unsigned s)
{
    fkvfq_table t = rvq_table(q, tab, kv, s);
    if (q->rows16)
        t.rows = w->set + (size_t)s * q->shape.k * t.dim;
    return t;
}

/* q->rows16: the ns stage tables of (tab, kv), contiguous in spec 13.2
 * order, widened exactly into w->set */
static void enc_widen_set(const fkvf_rvq *q, enc_scratch *w, size_t tab, unsigned kv,
                          unsigned ns)
{
    uint32_t dim = kv == 0 ? q->shape.key_dim : q->shape.value_dim;
    fkvfq_load(FKVF_DTYPE_F16, (const uint8_t *)(q->rows16 + fkvfq_table_off(q, tab, kv, 0)),
               w->set, (size_t)ns * q->shape.k * dim);
}

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
        fkvfq_table t = enc_table(q, w, tab, kv, s);
        const float *res = w->res[cur];
        for (unsigned b0 = 0; b0 < nb; b0 += FKVFQ_LANES) {
            unsigned ng = nb - b0 < FKVFQ_LANES ? nb - b0 : FKVFQ_LANES;
            fkvfq_transpose_lanes(res + (size_t)b0 * dim, dim, ng, dim, w->xt);
            fkvfq_scores_rows(&t, w->xt, ng, w->scores + (size_t)b0 * k,
                              w->pmin + (size_t)b0 * (k / FKVFQ_PANEL));
        }
        /* slot 0 carries the greedy path: its exact nearest centroid */
        uint32_t cg = fkvfq_pick(&t, res, w->scores, w->pmin, NULL);
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
            const float *row = enc_table(q, w, tab, kv, s).rows + (size_t)pa[s] * dim;
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
    fkvf_free(a, w->xt);
    fkvf_free(a, w->pan);
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
    fkvf_free(a, w->set);
    fkvf_free(a, w->mt);
}

/* One thread's work: encode rows through q's metric handle when it has one. */
static int encode_one(const fkvf_rvq *q, const fkvf_rows *rows, const fkvf_rope *key_rope,
                      unsigned beam_width, uint16_t *codes, size_t pos_stride, size_t code_stride)
{
    if (q->menc) { /* under a metric: the transformed tables, U x */
        fkvfq_xform xf = {q->uk, q->uv};
        return fkvfq_rvq_encode_xf(q->menc, &xf, rows, key_rope, beam_width, codes, pos_stride,
                                   code_stride);
    }
    return fkvfq_rvq_encode_xf(q, NULL, rows, key_rope, beam_width, codes, pos_stride,
                               code_stride);
}

/* A call cut into ranges of `per` rows, one per item (fkvf_par_for). */
typedef struct enc_job {
    const fkvf_rvq *q;
    const fkvf_rows *rows;
    const fkvf_rope *rope;
    unsigned beam;
    uint16_t *codes;
    size_t ps, cs, per, rb;
} enc_job;

static int enc_item(void *ctx, unsigned worker, size_t item)
{
    const enc_job *j = ctx;
    (void)worker;
    size_t i0 = item * j->per, n = j->rows->n_rows - i0 < j->per ? j->rows->n_rows - i0 : j->per;
    fkvf_rows part = *j->rows;
    part.data = (const uint8_t *)j->rows->data + i0 * j->rb;
    part.n_rows = n;
    part.first_position += i0;
    return encode_one(j->q, &part, j->rope, j->beam, j->codes + i0 * j->ps, j->ps, j->cs);
}

/* Rows per range for n rows on q's threads; n when one range does. */
static size_t par_rows(const fkvf_rvq *q, size_t n)
{
    unsigned t = fkvf_par_threads(q->threads);
    if (t <= 1 || n < 2 * (size_t)Q_PAR_ROWS)
        return n;
    size_t per = (n + t - 1) / t;
    return per < Q_PAR_ROWS ? Q_PAR_ROWS : per;
}

FKVF_API int fkvf_rvq_encode(const fkvf_rvq *q, const fkvf_rows *rows, const fkvf_rope *key_rope,
                             unsigned beam_width, uint16_t *codes, size_t pos_stride,
                             size_t code_stride)
{
    if (!FKVF_RVQ_OK(q) || !rows)
        return FKVF_E_INVALID_ARG;
    size_t per = par_rows(q, rows->n_rows), rb = row_bytes(q, rows->dtype), all;
    /* one range, or arguments the ranges would not all see: as they are */
    if (per >= rows->n_rows || !rb || !rows->data || !codes ||
        !fkvf_mulsz(rows->n_rows, rb, &all) ||
        codes_check(q, rows->n_rows, pos_stride, code_stride) ||
        !fkvf_rvq_codes_per_position(q))
        return encode_one(q, rows, key_rope, beam_width, codes, pos_stride, code_stride);
    enc_job j = {q, rows, key_rope, beam_width, codes, pos_stride, code_stride, per, rb};
    return fkvf_par_for(fkvf_par_threads(q->threads), (rows->n_rows + per - 1) / per, enc_item,
                        &j);
}

FKVF_API int fkvf_rvq_set_threads(fkvf_rvq *q, unsigned n_threads)
{
    if (!FKVF_RVQ_OK(q))
        return FKVF_E_INVALID_ARG;
    q->threads = n_threads;
    return FKVF_OK;
}

/* What one encode call does, chosen once: the rows, where their codes go,
 * the beam width and the chunk of vectors loaded at a time. */
typedef struct enc_plan {
    const fkvf_rvq *q;
    const fkvfq_xform *xf;
    const fkvf_rows *rows;
    const fkvf_rope *rope;
    uint16_t *codes;
    size_t ps, cs;   /* the codes' position and code strides */
    unsigned B;      /* beam width; 1: greedy */
    size_t chunk;    /* vectors loaded and searched together */
    size_t es, rb;   /* bytes of an element and of a row of the rows */
    uint32_t rd;     /* rope_dims of the keys' un-rotation, or 0 */
    int panels;      /* greedy chunks of >= Q_PANEL_MIN vectors use a panel copy */
} enc_plan;

/* Each layer of a per-layer handle by its own handle (its codes from
 * lcode[l] on, its share of the metric's factors). */
static int encode_layers(const fkvf_rvq *q, const fkvfq_xform *xf, const fkvf_rows *rows,
                         const fkvf_rope *key_rope, unsigned beam_width, uint16_t *codes,
                         size_t pos_stride, size_t code_stride)
{
    size_t es = fkvfq_dtype_size(rows->dtype), rb = es ? row_bytes(q, rows->dtype) : 0, all;
    if (!rb || !fkvf_mulsz(rows->n_rows, rb, &all) || (rows->n_rows && !rows->data) ||
        (rows->n_rows && !codes))
        return FKVF_E_INVALID_ARG;
    int rc = codes_check(q, rows->n_rows, pos_stride, code_stride);
    size_t hk = (size_t)q->shape.n_heads * q->shape.key_dim * q->shape.key_dim;
    size_t hv = (size_t)q->shape.n_heads * q->shape.value_dim * q->shape.value_dim;
    for (uint32_t l = 0; l < q->shape.n_layers && !rc; l++) {
        fkvfq_xform lx = {xf && xf->uk ? xf->uk + l * hk : NULL,
                          xf && xf->uv ? xf->uv + l * hv : NULL};
        rc = fkvfq_rvq_encode_xf(q->lay[l], xf ? &lx : NULL, rows, key_rope, beam_width,
                                 codes ? codes + q->lcode[l] * code_stride : NULL, pos_stride,
                                 code_stride);
    }
    return rc;
}

/* The scratch of plan p; FKVF_E_NOMEM (w then holds what was allocated). */
static int enc_alloc(const enc_plan *p, enc_scratch *w)
{
    const fkvf_allocator *a = &p->q->alloc;
    const fkvf_codebook_shape *sh = &p->q->shape;
    const uint32_t k = sh->k, dmax = sh->key_dim > sh->value_dim ? sh->key_dim : sh->value_dim;
    const size_t kdmax = (size_t)k * dmax; /* k <= 4096, dmax <= 16384 */
    const unsigned B = p->B, nsc = B > FKVFQ_LANES ? B : FKVFQ_LANES;
    memset(w, 0, sizeof *w);
    int ok = (w->x = fkvf_calloc(a, p->chunk * dmax, sizeof(float))) &&
             (!p->panels || (w->pan = fkvf_calloc(a, kdmax, sizeof(float)))) &&
             (w->xt = fkvf_calloc(a, (size_t)FKVFQ_LANES * dmax, sizeof(float))) &&
             (w->scores = fkvf_calloc(a, (size_t)nsc * k, sizeof(float))) &&
             (w->pmin = fkvf_calloc(a, (size_t)nsc * (k / FKVFQ_PANEL), sizeof(float)));
    if (ok && p->rd)
        ok = (w->freqs = fkvf_calloc(a, p->rd / 2, sizeof(double))) &&
             (w->cs = fkvf_calloc(a, p->chunk * p->rd, sizeof(double)));
    if (ok && p->q->rows16) {
        unsigned nsm = sh->k_stages > sh->v_stages ? sh->k_stages : sh->v_stages;
        ok = (w->set = fkvf_calloc(a, (size_t)nsm * kdmax, sizeof(float))) != NULL;
    }
    if (ok && p->xf)
        ok = (w->mt = fkvf_calloc(a, dmax, sizeof(float))) != NULL;
    if (ok && B > 1) {
        for (int i = 0; i < 2 && ok; i++)
            ok = (w->res[i] = fkvf_calloc(a, (size_t)B * dmax, sizeof(float))) &&
                 (w->err[i] = fkvf_calloc(a, B, sizeof(double))) &&
                 (w->path[i] = fkvf_calloc(a, (size_t)B * 16, sizeof(uint16_t)));
        ok = ok && (w->cand = fkvf_calloc(a, B, sizeof(beam_cand))) &&
             (w->recon = fkvf_calloc(a, dmax, sizeof(float)));
    }
    return ok ? FKVF_OK : FKVF_E_NOMEM;
}

/* The nb vectors (l, h, kv) of rows i0.. into w->x, in the frame the
 * tables are searched in: keys un-rotated (angles in w->cs), then U x under
 * a metric. */
static void enc_load(const enc_plan *p, enc_scratch *w, size_t i0, size_t nb, uint32_t l,
                     uint32_t h, unsigned kv)
{
    const fkvf_rvq *q = p->q;
    const fkvf_codebook_shape *sh = &q->shape;
    const uint32_t dim = kv == 0 ? sh->key_dim : sh->value_dim;
    const uint8_t *data = (const uint8_t *)p->rows->data + vec_off(q, l, h, kv) * p->es;
    const double *ut = !p->xf ? NULL : kv == 0 ? p->xf->uk : p->xf->uv;
    if (ut)
        ut += ((size_t)l * sh->n_heads + (sh->pooled ? 0 : h)) * dim * dim;
    for (size_t j = 0; j < nb; j++) {
        float *xj = w->x + j * dim;
        fkvfq_load(p->rows->dtype, data + (i0 + j) * p->rb, xj, dim);
        if (kv == 0 && p->rd)
            fkvf_rope_rotate_f32(p->rope, w->cs + j * p->rd, 1, xj, 0);
        if (ut) { /* into the metric's frame */
            fkvf_metric_apply(ut, dim, xj, w->mt);
            memcpy(xj, w->mt, dim * sizeof(float));
        }
    }
}

/* The table set after (l, h, kv) in the encoder's order (one with
 * stages) into *l, *h, *kv; 0 after the last one. */
static int enc_next_set(const enc_plan *p, uint32_t *l, uint32_t *h, unsigned *kv)
{
    const fkvf_codebook_shape *sh = &p->q->shape;
    const unsigned k0 = sh->k_stages ? 0 : 1;
    if (*kv == 0 && sh->v_stages)
        *kv = 1;
    else if (++*h < p->q->n_kv_heads)
        *kv = k0;
    else if (++*l < sh->n_layers)
        *h = 0, *kv = k0;
    else
        return 0;
    return 1;
}

/* What set (l, h, kv)'s first stage prefetches: the next set's vectors
 * (the rows of a chunk lie a whole cache row apart, so no hardware
 * prefetcher finds them, and each one a set loads would wait for memory)
 * and, in a handle of f16 tables, its tables (enc_widen_set reads them). */
static void enc_prefetch_plan(const enc_plan *p, enc_scratch *w, uint32_t l, uint32_t h,
                              unsigned kv)
{
    const fkvf_rvq *q = p->q;
    const fkvf_codebook_shape *sh = &q->shape;
    w->pf = NULL;
    w->pft = NULL;
    if (!enc_next_set(p, &l, &h, &kv))
        return;
    const uint32_t dim = kv == 0 ? sh->key_dim : sh->value_dim;
    w->pf = (const uint8_t *)p->rows->data + vec_off(q, l, h, kv) * p->es;
    w->pf_bytes = dim * p->es;
    if (q->rows16) {
        size_t tab = (size_t)l * sh->n_heads + (sh->pooled ? 0 : h);
        w->pft = (const uint8_t *)(q->rows16 + fkvfq_table_off(q, tab, kv, 0));
        w->pft_bytes = (size_t)(kv == 0 ? sh->k_stages : sh->v_stages) * sh->k * dim * 2;
    }
}

/* Prefetch the next set's vectors of rows i0 + j, j in [j0, j1) of a
 * chunk of nb, and the same share of its tables. */
static void enc_prefetch(const enc_plan *p, const enc_scratch *w, size_t i0, size_t j0,
                         size_t j1, size_t nb)
{
#if defined(__GNUC__) || defined(__clang__)
    for (size_t j = j0; w->pf && j < j1; j++) {
        const uint8_t *v = w->pf + (i0 + j) * p->rb;
        for (size_t b = 0; b < w->pf_bytes; b += 64)
            __builtin_prefetch(v + b);
        __builtin_prefetch(v + w->pf_bytes - 1);
    }
    if (w->pft) { /* this block's share of the tables (64-bit: no overflow) */
        const uint64_t tb = w->pft_bytes;
        for (uint64_t b = tb * j0 / nb / 64 * 64; b < tb * j1 / nb; b += 64)
            __builtin_prefetch(w->pft + (size_t)b);
    }
#else
    (void)p;
    (void)w;
    (void)i0;
    (void)j0;
    (void)j1;
    (void)nb;
#endif
}

/* Vector xr (row `row` of the call) takes its nearest centroid of t given
 * its scores: the code stored at code index ci, the centroid subtracted. */
static void enc_take(const enc_plan *p, const fkvfq_table *t, float *xr, const float *scores,
                     const float *pmin, size_t row, size_t ci)
{
    uint32_t c = fkvfq_pick(t, xr, scores, pmin, NULL);
    p->codes[row * p->ps + ci * p->cs] = (uint16_t)c;
    const float *cr = t->rows + (size_t)c * t->dim;
    for (uint32_t d = 0; d < t->dim; d++)
        xr[d] -= cr[d];
}

/* One greedy stage of table t for the nb vectors of w->x (rows i0..), the
 * table copied to panels first: FKVFQ_BLOCK vectors scored at a time. */
static void enc_stage_panels(const enc_plan *p, enc_scratch *w, fkvfq_table t, size_t i0,
                             size_t nb, size_t ci, int pf)
{
    const uint32_t k = t.k, dim = t.dim;
    fkvfq_table_panels(t.rows, k, dim, w->pan);
    t.panels = w->pan;
    for (size_t j0 = 0; j0 < nb; j0 += FKVFQ_BLOCK) {
        if (pf)
            enc_prefetch(p, w, i0, j0, j0 + FKVFQ_BLOCK < nb ? j0 + FKVFQ_BLOCK : nb, nb);
        const float *xp[FKVFQ_BLOCK];
        for (size_t u = 0; u < FKVFQ_BLOCK; u++)
            xp[u] = w->x + (j0 + u < nb ? j0 + u : nb - 1) * dim;
        fkvfq_scores4(&t, xp, w->scores, w->pmin);
        for (size_t u = 0; u < FKVFQ_BLOCK && j0 + u < nb; u++)
            enc_take(p, &t, w->x + (j0 + u) * dim, w->scores + u * k,
                     w->pmin + u * (k / FKVFQ_PANEL), i0 + j0 + u, ci);
    }
}

/* The same scored from the table's rows, FKVFQ_LANES vectors at a time
 * (short chunks, large tables). */
static void enc_stage_rows(const enc_plan *p, enc_scratch *w, const fkvfq_table *t, size_t i0,
                           size_t nb, size_t ci, int pf)
{
    const uint32_t k = t->k, dim = t->dim;
    for (size_t j0 = 0; j0 < nb; j0 += FKVFQ_LANES) {
        unsigned ng = nb - j0 < FKVFQ_LANES ? (unsigned)(nb - j0) : FKVFQ_LANES;
        if (pf)
            enc_prefetch(p, w, i0, j0, j0 + ng, nb);
        fkvfq_transpose_lanes(w->x + j0 * dim, dim, ng, dim, w->xt);
        fkvfq_scores_rows(t, w->xt, ng, w->scores, w->pmin);
        for (unsigned u = 0; u < ng; u++)
            enc_take(p, t, w->x + (j0 + u) * dim, w->scores + (size_t)u * k,
                     w->pmin + (size_t)u * (k / FKVFQ_PANEL), i0 + j0 + u, ci);
    }
}

/* Table set (l, h, kv) for the nb rows i0..: load, then the beam or each
 * greedy stage. */
static void enc_set(const enc_plan *p, enc_scratch *w, size_t i0, size_t nb, uint32_t l,
                    uint32_t h, unsigned kv)
{
    const fkvf_rvq *q = p->q;
    const fkvf_codebook_shape *sh = &q->shape;
    const unsigned ns = kv == 0 ? sh->k_stages : sh->v_stages;
    const uint32_t dim = kv == 0 ? sh->key_dim : sh->value_dim;
    const size_t tab = (size_t)l * sh->n_heads + (sh->pooled ? 0 : h);
    const size_t c0 = code_index(q, l, h, kv, 0);
    enc_load(p, w, i0, nb, l, h, kv);
    if (q->rows16)
        enc_widen_set(q, w, tab, kv, ns);
    if (p->B > 1) {
        for (size_t j = 0; j < nb; j++)
            beam_one(q, w, tab, kv, ns, p->B, w->x + j * dim,
                     p->codes + (i0 + j) * p->ps + c0 * p->cs, p->cs);
        return;
    }
    enc_prefetch_plan(p, w, l, h, kv);
    for (unsigned s = 0; s < ns; s++) {
        fkvfq_table t = enc_table(q, w, tab, kv, s);
        if (w->pan && nb >= Q_PANEL_MIN)
            enc_stage_panels(p, w, t, i0, nb, c0 + s, s == 0);
        else
            enc_stage_rows(p, w, &t, i0, nb, c0 + s, s == 0);
    }
}

int fkvfq_rvq_encode_xf(const fkvf_rvq *q, const fkvfq_xform *xf, const fkvf_rows *rows,
                        const fkvf_rope *key_rope, unsigned beam_width, uint16_t *codes,
                        size_t pos_stride, size_t code_stride)
{
    if (!FKVF_RVQ_OK(q) || !rows || beam_width > FKVF_RVQ_MAX_BEAM)
        return FKVF_E_INVALID_ARG;
    if (q->decode_only)
        return FKVF_E_STATE; /* no search layout: loaded for decoding only */
    if (q->lay)
        return encode_layers(q, xf, rows, key_rope, beam_width, codes, pos_stride, code_stride);
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

    const uint32_t dmax = sh->key_dim > sh->value_dim ? sh->key_dim : sh->value_dim;
    enc_plan p;
    p.q = q;
    p.xf = xf;
    p.rows = rows;
    p.rope = key_rope;
    p.codes = codes;
    p.ps = pos_stride;
    p.cs = code_stride;
    p.B = beam_width <= 1 ? 1 : beam_width;
    p.chunk = dmax <= 1024 ? Q_CHUNK : Q_CHUNK_SMALL;
    p.es = es;
    p.rb = rb;
    p.rd = key_rope ? key_rope->rope_dims : 0;
    p.panels = p.B == 1 && rows->n_rows >= Q_PANEL_MIN && (size_t)sh->k * dmax <= Q_PANEL_FLOATS;
    enc_scratch w;
    if ((rc = enc_alloc(&p, &w))) {
        enc_free(&q->alloc, &w);
        return rc;
    }
    if (p.rd)
        fkvf_rope_freqs(key_rope, w.freqs);
    for (size_t i0 = 0; i0 < rows->n_rows; i0 += p.chunk) {
        size_t nb = rows->n_rows - i0 < p.chunk ? rows->n_rows - i0 : p.chunk;
        for (size_t j = 0; p.rd && j < nb; j++)
            fkvf_rope_angles(key_rope, w.freqs, rows->first_position + i0 + j, w.cs + j * p.rd);
        for (uint32_t l = 0; l < sh->n_layers; l++)
            for (uint32_t h = 0; h < q->n_kv_heads; h++)
                for (unsigned kv = 0; kv < 2; kv++)
                    if (kv == 0 ? sh->k_stages : sh->v_stages)
                        enc_set(&p, &w, i0, nb, l, h, kv);
    }
    enc_free(&q->alloc, &w);
    return FKVF_OK;
}

/* ---- decoding ------------------------------------------------------------------ */

/* positions decoded per pass over the tables: a (layer, head, K|V) table set
 * stays in cache while the chunk's vectors are summed from it; the tables
 * (56 MB at GPT-2 small) are read once per chunk */
#define Q_DCHUNK 4096
/* at most this many bytes of RoPE cosines and sines per chunk (fewer
 * positions per chunk when rope_dims is large) */
#define Q_CS_BYTES ((size_t)2 << 20)
/* positions ahead whose centroid rows are prefetched: the binary32 path
 * (one table set at a time), the f16 path (a group of heads at a time, so
 * one position ahead is already the work of a whole group; 1..14 measured
 * within noise of each other, 4 about 7% better than 1) */
#define Q_PREFETCH 6
#define Q_GPREFETCH 4
/* a chunk of fewer positions prefetches the rows of the table set
 * Q_SET_AHEAD sets ahead */
#define Q_SHORT 16
#define Q_SET_AHEAD 2
/* chunks of at least this many positions stream the next table set, and
 * write their output with non-temporal stores (fast kernels) */
#define Q_STREAM_MIN 64
/* a chunk of at least Q_STREAM_MIN positions copies the tables of a group
 * of heads of an f16 codebook to f16 scratch of at most this many bytes
 * before using them: half the cache footprint of the binary32 rows, widened
 * exactly when summed. A group's tables fit in a 1 MB L2 (GPT-2 small: 5
 * heads of 196 KB); a whole layer's (2.4 MB, from L3) decoded 0-10%
 * slower (bench/README.md, session 12) */
#define Q_SET16_BYTES ((size_t)1 << 20)
/* groups of at most this many heads go to fkvf_vec16_group in one pass */
#define Q_GROUP16_MAX 64

/* One decode (a thread's range of rows of it): the codes, where the
 * vectors go (the map: layers [l0, l0 + nl) of the handle, stored as rows
 * of the selected layers or heads-first, fkvfq_dec_map), the rows. */
typedef struct dec_call {
    const uint16_t *codes; /* code j of the handle's layers [l0, l0 + nl) of row 0 at
                            * codes[j * cst] (row i: + i * ps) */
    size_t ps, cst, n_rows;
    uint64_t first;        /* the rotary position of row 0 */
    const fkvf_rope *rope;
    fkvf_dtype dt;         /* of the output */
    uint8_t *out;          /* the whole output's first byte */
    size_t row0;           /* row 0's row in the whole output */
    size_t n_out;          /* rows of the whole output */
    uint32_t l0, nl;       /* the handle's layers decoded */
    uint32_t lsel0;        /* layer l0's place among the output's layers */
    uint32_t nsel;         /* layers of the output */
    int heads;             /* 1: FKVF_LAYOUT_HEADS, 0: rows */
    unsigned parts;        /* 1 keys, 2 values, 3 both */
    int fast;              /* 0: the portable code only (the reference) */
} dec_call;

/* What one decode call does, chosen once: which kernel, which group of
 * heads, which stores, where each vector goes. */
typedef struct dec_plan {
    const fkvf_rvq *q;
    const uint16_t *codes;
    size_t ps, cst;        /* the codes' position and code strides */
    uint64_t first;        /* the rotary position of row 0 */
    const fkvf_rope *rope;
    fkvf_dtype dt;         /* of the output */
    uint8_t *out;          /* the whole output */
    size_t row0, n_out;    /* the call's row 0 in it; its rows */
    uint32_t l0, nl, lsel0;
    int heads;
    unsigned parts;        /* 1 keys, 2 values, 3 both: the vectors decoded and stored */
    size_t E;              /* elements of a layer of an output row (heads * the parts' dims) */
    size_t ostr[2];        /* bytes from a row's key (value) vector to the next row's */
    size_t es, nc, m;      /* output element bytes; codes per position and per (layer, head) */
    uint32_t rd;           /* rope_dims of the keys' rotation, or 0 */
    size_t chunk;          /* positions per pass over the tables */
    int fast;              /* 0: the portable code only (the reference) */
    int avx;               /* fkvf_stage_sum's AVX sums */
    int b16;               /* borrowed f16 tables (fkvf_rvq_from_tables16_borrow) */
    int kern;              /* the AVX2 + F16C vector kernel (fast_vector32) */
    int rope_kind;         /* 1: the rotated components fill whole 8-lane blocks, 2: not */
    int use16;             /* chunks go to the f16 group kernel (fast_group) */
    size_t G;              /* heads per group of that kernel */
    size_t set16;          /* f16 elements of a group's table copy (0: none) */
    int nt;                /* non-temporal stores */
    int v16[2];            /* keys, values through fkvf_vec16_store (f16 out, AVX-512) */
    size_t pm_n;           /* codes of a chunk made position-major for group16 (0: none) */
} dec_plan;

/* The code index (within the call's codes) of (layer l, head h, stage 0
 * of the keys). */
static inline size_t dec_cj(const dec_plan *p, uint32_t l, uint32_t h)
{
    return ((size_t)(l - p->l0) * p->q->n_kv_heads + h) * p->m;
}

/* Where vector (l, h, kv) of the call's row i goes: rows of the output's
 * layers (spec 14.2 restricted to them and to the decoded parts), or
 * heads-first (per layer: keys [head][row][Dk], then values
 * [head][row][Dv], each when decoded). */
static inline uint8_t *dec_dst(const dec_plan *p, uint32_t l, uint32_t h, unsigned kv, size_t i)
{
    const size_t H = p->q->n_kv_heads, Dk = p->q->shape.key_dim, Dv = p->q->shape.value_dim;
    const size_t ls = (size_t)(l - p->l0) + p->lsel0;
    /* within a layer: the keys (if decoded), then the values */
    const size_t in = kv == 0 ? h * Dk : (p->parts & 1u ? H * Dk : 0) + h * Dv;
    const size_t unit = p->heads ? (ls * p->E + in) * p->n_out : ls * p->E + in;
    return p->out + unit * p->es + (p->row0 + i) * p->ostr[kv];
}

#if defined(FKVF_HAVE_F16C)
#define Q_DEC_FAST 1
#define Q_FAST_TARGET __attribute__((target("avx2,f16c")))
#define Q_FAST_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

/* The decoder's kernels for CPUs with AVX2 and F16C: the same binary32 sums
 * in the same order, the same binary64 rotation, the same roundings as the
 * portable path (fkvf_stage_sum, fkvf_rope_rotate_f32, fkvfq_store); f32 -> f16
 * is fkvf_f16c_put8 (common/half.h: why it equals fkvf_cvt_f32_to_f16 here).
 *
 * Rows come from the binary32 tables (h16 = 0: fkvf_stage_sum8) or from f16
 * tables, an f16 copy of a table set or the codebook's f16 bytes as stored
 * (fkvf_rvq_from_tables16_borrow), whose values are all f16 (h16 = 1: the codebook's
 * dtype is F16, so f32 -> f16 -> f32 is exact and the lanes summed are the
 * same binary32 values, added in the same order from +0.0). nt = 1 writes
 * whole 8-lane blocks with non-temporal stores (dst 16-byte aligned): the
 * same bytes, without reading the output's cache lines first. */

/* components d..d+7 of the sum of the rows */
static Q_FAST_INLINE __m256 fast_sum8(const void *const *rowp, unsigned ns, uint32_t d, int h16)
{
    if (!h16)
        return fkvf_stage_sum8((const float *const *)rowp, ns, d);
    __m256 a = _mm256_setzero_ps();
    for (unsigned s = 0; s < ns; s++)
        a = _mm256_add_ps(a, _mm256_cvtph_ps(_mm_loadu_si128(
                                 (const __m128i *)(const void *)((const uint16_t *)rowp[s] + d))));
    return a;
}

/* component d of the sum */
static Q_FAST_INLINE float fast_sum1(const void *const *rowp, unsigned ns, uint32_t d, int h16)
{
    if (!h16)
        return fkvf_stage_sum1((const float *const *)rowp, ns, d);
    float a = 0.0f;
    for (unsigned s = 0; s < ns; s++)
        a += fkvf_cvt_f16_to_f32(((const uint16_t *)rowp[s])[d]);
    return a;
}

/* 8 lanes of a to dt at dst (16 or 32 bytes) */
static Q_FAST_INLINE void fast_put8(fkvf_dtype dt, __m256 a, uint8_t *dst, int nt)
{
    if (dt == FKVF_DTYPE_F16) {
        if (nt)
            _mm_stream_si128((__m128i *)(void *)dst,
                             _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
        else
            fkvf_f16c_put8(a, dst);
    } else if (dt == FKVF_DTYPE_BF16) {
        fkvf_cvt_vi_8 bits;
        fkvf_cvt_vh_8 h;
        memcpy(&bits, &a, sizeof bits);
        fkvf_cvt_v_bf16_8(&bits, &h);
        __m128i v;
        memcpy(&v, &h, sizeof v);
        if (nt)
            _mm_stream_si128((__m128i *)(void *)dst, v);
        else
            _mm_storeu_si128((__m128i *)(void *)dst, v);
    } else if (nt) {
        _mm_stream_ps((float *)(void *)dst, _mm256_castps256_ps128(a));
        _mm_stream_ps((float *)(void *)(dst + 16), _mm256_extractf128_ps(a, 1));
    } else {
        _mm256_storeu_ps((float *)(void *)dst, a);
    }
}

/* dim values at acc to dt at dst */
static Q_FAST_INLINE void fast_store(fkvf_dtype dt, const float *acc, uint32_t dim, uint8_t *dst,
                                     int nt)
{
    const size_t es = fkvfq_dtype_size(dt);
    uint32_t d = 0;
    for (; d + 8 <= dim; d += 8)
        fast_put8(dt, _mm256_loadu_ps(acc + d), dst + d * es, nt);
    if (d < dim)
        fkvfq_store_portable(dt, acc + d, dst + d * es, dim - d);
}

/* the stage sum and the conversion to dt in one pass, 8 lanes, for
 * components [d, dim) */
static Q_FAST_INLINE void fast_sum_store(fkvf_dtype dt, const void *const *rowp, unsigned ns,
                                         uint32_t d, uint32_t dim, uint8_t *dst, int h16, int nt)
{
    const size_t es = fkvfq_dtype_size(dt);
    for (; d + 8 <= dim; d += 8)
        fast_put8(dt, fast_sum8(rowp, ns, d, h16), dst + d * es, nt);
    if (d < dim) {
        float acc[8];
        for (uint32_t j = 0; j < dim - d; j++)
            acc[j] = fast_sum1(rowp, ns, d + j, h16);
        fkvfq_store_portable(dt, acc, dst + d * es, dim - d);
    }
}

/* The same as fast_sum_rope_store below when the rotated components fill
 * whole 8-lane blocks (interleaved: rd % 8 == 0; half-split: rd % 16 == 0):
 * sums, rotation (fkvf_rope_turn4) and conversion in registers, block by
 * block. */
static Q_FAST_INLINE void fast_sum_rope_store_blocks(fkvf_dtype dt, const void *const *rowp,
                                                     unsigned ns, uint32_t dim, int layout,
                                                     uint32_t rd, const double *cs,
                                                     uint8_t *dst, int h16, int nt)
{
    const size_t es = fkvfq_dtype_size(dt);
    const uint32_t half = rd / 2;
    const double *co = cs, *si = cs + half;
    uint32_t d = 0;
    __m128 y0, y1, z0, z1;
    if (layout == 1) { /* pairs (2i, 2i + 1): block d holds pairs d/2 .. d/2 + 3 */
        const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        const __m256i back = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (; d < rd; d += 8) {
            __m256 x = _mm256_permutevar8x32_ps(fast_sum8(rowp, ns, d, h16), even);
            fkvf_rope_turn4(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1),
                            co + d / 2, si + d / 2, &y0, &y1);
            __m256 y = _mm256_insertf128_ps(_mm256_castps128_ps256(y0), y1, 1);
            fast_put8(dt, _mm256_permutevar8x32_ps(y, back), dst + d * es, nt);
        }
    } else { /* pairs (i, i + half): blocks d and d + half together */
        for (; d < half; d += 8) {
            __m256 a = fast_sum8(rowp, ns, d, h16), b = fast_sum8(rowp, ns, d + half, h16);
            fkvf_rope_turn4(_mm256_castps256_ps128(a), _mm256_castps256_ps128(b), co + d,
                            si + d, &y0, &y1);
            fkvf_rope_turn4(_mm256_extractf128_ps(a, 1), _mm256_extractf128_ps(b, 1),
                            co + d + 4, si + d + 4, &z0, &z1);
            fast_put8(dt, _mm256_insertf128_ps(_mm256_castps128_ps256(y0), z0, 1), dst + d * es,
                      nt);
            fast_put8(dt, _mm256_insertf128_ps(_mm256_castps128_ps256(y1), z1, 1),
                      dst + (d + half) * es, nt);
        }
        d = rd;
    }
    fast_sum_store(dt, rowp, ns, d, dim, dst, h16, nt); /* the components after them */
}

/* A key before RoPE: the sums into acc, fkvf_rope_rotate_f32(r, cs, 0, acc,
 * 1), then the conversion to dt. */
static Q_FAST_INLINE void fast_sum_rope_store(fkvf_dtype dt, const void *const *rowp,
                                              unsigned ns, uint32_t dim, const fkvf_rope *r,
                                              const double *cs, float *acc, uint8_t *dst,
                                              int h16, int nt)
{
    uint32_t d = 0;
    for (; d + 8 <= dim; d += 8)
        _mm256_storeu_ps(acc + d, fast_sum8(rowp, ns, d, h16));
    for (; d < dim; d++)
        acc[d] = fast_sum1(rowp, ns, d, h16);
    fkvf_rope_rotate_f32(r, cs, 0, acc, 1);
    fast_store(dt, acc, dim, dst, nt);
}

/* One vector: whichever of the three kernels applies (rope: 0 none, 1 whole
 * blocks, 2 otherwise). */
static Q_FAST_INLINE void fast_vector(fkvf_dtype dt, const void *const *rowp, unsigned ns,
                                      uint32_t dim, const fkvf_rope *r, int rope,
                                      const double *cs, float *acc, uint8_t *dst, int h16,
                                      int nt)
{
    if (rope == 1)
        fast_sum_rope_store_blocks(dt, rowp, ns, dim, r->layout, r->rope_dims, cs, dst, h16,
                                   nt);
    else if (rope == 2)
        fast_sum_rope_store(dt, rowp, ns, dim, r, cs, acc, dst, h16, nt);
    else
        fast_sum_store(dt, rowp, ns, 0, dim, dst, h16, nt);
}

/* What the f16 path decodes in one pass: heads [h0, h0 + G) of layer l for
 * the positions of a chunk, from t16, their f16 tables (the f16 copy, or
 * q->rows16 in place; tab by tab as in q->rows; one tab when pooled). */
typedef struct q_group {
    const fkvf_rvq *q;
    const uint16_t *t16;
    size_t tab_stride;     /* f16 values from one head's tables to the next (0: pooled) */
    uint32_t l, h0, G;
    const uint16_t *codes; /* the chunk's: position i, code j at codes[i * ps + j * cst] */
    size_t ps, cst, nb;
    const struct dec_plan *p; /* the output map (dec_dst) */
    size_t i0;             /* the chunk's first row in the call */
    const fkvf_rope *rope; /* key_rope (rope_kind != 0) */
    int rope_kind;         /* 0 none, 1 whole blocks, 2 otherwise */
    const double *cs;      /* the chunk's angles, rope_dims per position */
    float *acc;
    int v16[2];            /* f16 output of keys / values by fkvf_vec16_store */
    uint16_t *pm;          /* NULL, or room for the group's codes position-major */
} q_group;

/* f16 out with every vector by fkvf_vec16_store: the whole group in one
 * fkvf_vec16_group pass (the same vectors in the same order) */
static void group16(const q_group *g, int nt)
{
    const fkvf_codebook_shape *sh = &g->q->shape;
    const size_t m = (size_t)sh->k_stages + sh->v_stages;
    const size_t srd = g->rope_kind ? g->rope->rope_dims : 0;
    const size_t voff = (size_t)sh->k_stages * sh->k * sh->key_dim;
    fkvf_vec16_vec v[2 * Q_GROUP16_MAX];
    fkvf_vec16_pass p;
    unsigned nv = 0;
    /* the group's codes are those of the W = G m streams from j0 on; with
     * g->pm, position i's W codes are first made adjacent there (pm[i W + jj]
     * = stream j0 + jj's), so that the pass reads one run a position */
    const size_t W = (size_t)g->G * m, j0 = dec_cj(g->p, g->l, g->h0);
    const uint16_t *codes = g->codes + j0 * g->cst;
    size_t ps = g->ps, cst = g->cst;
    if (g->pm) {
        for (size_t jj = 0; jj < W; jj++) {
            const uint16_t *src = codes + jj * cst;
            uint16_t *dst = g->pm + jj;
            for (size_t i = 0; i < g->nb; i++)
                dst[i * W] = src[i * ps];
        }
        codes = g->pm;
        ps = W;
        cst = 1;
    }
    for (uint32_t u = 0; u < g->G; u++) {
        const uint32_t h = g->h0 + u;
        const size_t cj = (size_t)u * m; /* from stream j0 */
        for (unsigned kv = 0; kv < 2; kv++) {
            if (!(g->p->parts >> kv & 1u))
                continue;
            fkvf_vec16_vec *x = &v[nv++];
            x->dim = kv == 0 ? sh->key_dim : sh->value_dim;
            x->tab = g->t16 + u * g->tab_stride + (kv ? voff : 0);
            x->code = codes + (cj + (kv ? sh->k_stages : 0)) * cst;
            x->stage_stride = (size_t)sh->k * x->dim;
            x->dst = dec_dst(g->p, g->l, h, kv, g->i0);
            x->dst_stride = g->p->ostr[kv];
            x->rd = kv == 0 ? (uint32_t)srd : 0;
            x->layout = kv == 0 && srd ? g->rope->layout : 0;
            x->ns = (uint8_t)(kv == 0 ? sh->k_stages : sh->v_stages);
        }
    }
    p.v = v;
    p.nv = nv;
    p.n_pos = g->nb;
    p.pos_stride = ps;
    p.code_stride = cst;
    p.cs = srd ? g->cs : NULL;
    p.cs_stride = srd;
    p.prefetch = Q_GPREFETCH;
    p.nt = nt;
    fkvf_vec16_group(&p);
}

/* Position by position, head by head, keys then values: the output of a
 * position is written in runs of G vectors, its angles are read once. */
static Q_FAST_INLINE void fast_group_body(const q_group *g, fkvf_dtype dt, int nt)
{
    const fkvf_codebook_shape *sh = &g->q->shape;
    const size_t srd = g->rope_kind ? g->rope->rope_dims : 0;
    const size_t voff = (size_t)sh->k_stages * sh->k * sh->key_dim;
    for (size_t i = 0; i < g->nb; i++) {
        const uint16_t *cp = g->codes + i * g->ps;
        for (uint32_t u = 0; u < g->G; u++) {
            uint32_t h = g->h0 + u;
            const uint16_t *tk = g->t16 + u * g->tab_stride;
            size_t cj = dec_cj(g->p, g->l, h);
            for (unsigned kv = 0; kv < 2; kv++) {
                if (!(g->p->parts >> kv & 1u))
                    continue;
                const void *rowp[16];
                unsigned ns = kv == 0 ? sh->k_stages : sh->v_stages;
                uint32_t dim = kv == 0 ? sh->key_dim : sh->value_dim;
                const uint16_t *tb = kv == 0 ? tk : tk + voff;
                size_t c0 = cj + (kv ? sh->k_stages : 0);
                for (unsigned s = 0; s < ns; s++)
                    rowp[s] = tb + ((size_t)s * sh->k + cp[(c0 + s) * g->cst]) * dim;
                /* the same vector's rows Q_GPREFETCH positions ahead: a whole
                 * position's work hides their latency */
                if (i + Q_GPREFETCH < g->nb)
                    for (unsigned s = 0; s < ns; s++) {
                        const char *r =
                            (const char *)(tb + ((size_t)s * sh->k +
                                                 cp[Q_GPREFETCH * g->ps + (c0 + s) * g->cst]) *
                                                    dim);
                        for (size_t b = 0; b < dim * sizeof(uint16_t); b += 64)
                            _mm_prefetch(r + b, _MM_HINT_T0);
                    }
                uint8_t *dst = dec_dst(g->p, g->l, h, kv, g->i0 + i);
                const double *csi = g->cs ? g->cs + i * srd : NULL; /* NULL: no RoPE */
                if (dt == FKVF_DTYPE_F16 && g->v16[kv])
                    fkvf_vec16_store(dst, rowp, ns, dim, kv == 0 && srd ? g->rope->layout : 0,
                                     kv == 0 ? (uint32_t)srd : 0, csi, nt);
                else
                    fast_vector(dt, rowp, ns, dim, g->rope, kv == 0 ? g->rope_kind : 0, csi,
                                g->acc, dst, 1, nt);
            }
        }
    }
}

/* fast_group_body with the output dtype and store kind fixed for the
 * compiler (one copy of the loop per combination) */
static Q_FAST_TARGET void fast_group(const q_group *g, fkvf_dtype dt, int nt)
{
    if (dt == FKVF_DTYPE_F16 && g->v16[0] && g->v16[1] && g->G <= Q_GROUP16_MAX)
        group16(g, nt);
    else if (dt == FKVF_DTYPE_F16)
        nt ? fast_group_body(g, FKVF_DTYPE_F16, 1) : fast_group_body(g, FKVF_DTYPE_F16, 0);
    else if (dt == FKVF_DTYPE_BF16)
        nt ? fast_group_body(g, FKVF_DTYPE_BF16, 1) : fast_group_body(g, FKVF_DTYPE_BF16, 0);
    else
        nt ? fast_group_body(g, FKVF_DTYPE_F32, 1) : fast_group_body(g, FKVF_DTYPE_F32, 0);
    if (nt)
        _mm_sfence(); /* the streamed stores ordered before what follows */
}

/* n binary32 values, each an f16 value, to f16 at dst (exact) */
static Q_FAST_TARGET void fast_narrow(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = fkvf_cvt_f32_to_f16(src[i]);
}

/* one vector from binary32 rows (the path for short chunks) */
static Q_FAST_TARGET void fast_vector32(fkvf_dtype dt, const float *const *rowp, unsigned ns,
                                        uint32_t dim, const fkvf_rope *r, int rope,
                                        const double *cs, float *acc, uint8_t *dst)
{
    fast_vector(dt, (const void *const *)rowp, ns, dim, r, rope, cs, acc, dst, 0, 0);
}
#endif

int fkvfq_decode16_available(void)
{
#ifdef Q_DEC_FAST
    return fkvf_cpu_avx2() && fkvf_cpu_f16c();
#else
    return 0;
#endif
}

/* the checks fkvf_rvq_from_tables16_borrow and _encode share: a handle of
 * `layout` with rows16 pointing at the caller's tables */
static int borrow16(fkvf_rvq **out, const fkvf_codebook_shape *shape, uint32_t n_kv_heads,
                    const void *tables, size_t size, const fkvf_allocator *alloc, int layout)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!shape || (!tables && size))
        return FKVF_E_INVALID_ARG;
    /* f16 elements read as uint16_t in place: 2-byte aligned, and the
     * kernels' little-endian loads (F16C implies x86) */
    if (shape->dtype != FKVF_DTYPE_F16 || !fkvfq_decode16_available() ||
        (uintptr_t)tables % sizeof(uint16_t))
        return FKVF_E_UNSUPPORTED;
    if (shape_check(shape))
        return FKVF_E_INVALID_ARG;
    if (!fkvfq_lay_uniform(shape)) /* each layer's slice stays 2-byte aligned */
        return from_layers(out, shape, n_kv_heads, tables, size, alloc, layout, borrow16);
    fkvf_codebook_shape norm = shape_norm(shape);
    shape = &norm;
    fkvf_rvq *q;
    int rc = fkvfq_rvq_alloc(&q, shape, n_kv_heads ? n_kv_heads : shape->n_heads, layout, alloc);
    if (rc)
        return rc;
    if (size / sizeof(uint16_t) != q->n_floats || size % sizeof(uint16_t)) {
        fkvf_rvq_free(q);
        return FKVF_E_INVALID_ARG;
    }
    /* non-finite elements refused: here, or table by table while the
     * search layout is built (fkvfq_rvq_prepare: one pass over the tables,
     * not two) */
    const uint16_t *t = tables;
    if (layout != FKVFQ_LAYOUT_F16_ENCODE && !f16_all_finite(t, q->n_floats)) {
        fkvf_rvq_free(q);
        return FKVF_E_INVALID_ARG;
    }
    q->rows16 = t;
    if (layout == FKVFQ_LAYOUT_F16_ENCODE && (rc = fkvfq_rvq_prepare(q))) {
        fkvf_rvq_free(q);
        return rc;
    }
    *out = q;
    return FKVF_OK;
}

FKVF_API int fkvf_rvq_from_tables16_borrow(fkvf_rvq **out, const fkvf_codebook_shape *shape,
                                           uint32_t n_kv_heads, const void *tables, size_t size,
                                           const fkvf_allocator *alloc)
{
    return borrow16(out, shape, n_kv_heads, tables, size, alloc, FKVFQ_LAYOUT_F16);
}

FKVF_API int fkvf_rvq_from_tables16_encode(fkvf_rvq **out, const fkvf_codebook_shape *shape,
                                           uint32_t n_kv_heads, const void *tables, size_t size,
                                           const fkvf_allocator *alloc)
{
    return borrow16(out, shape, n_kv_heads, tables, size, alloc, FKVFQ_LAYOUT_F16_ENCODE);
}

/* The OR of the nc codes of n_rows positions (a code >= k has a bit at or
 * above log2 k set in it), read in the order they lie in memory. */
static unsigned codes_high(const uint16_t *codes, size_t pos_stride, size_t code_stride,
                           size_t n_rows, size_t nc)
{
    unsigned any = 0;
    if (pos_stride == 1) /* one array per stream (restore): each read in order */
        for (size_t j = 0; j < nc; j++) {
            const uint16_t *cj = codes + j * code_stride;
            for (size_t i = 0; i < n_rows; i++)
                any |= cj[i];
        }
    else
        for (size_t i = 0; i < n_rows; i++) {
            const uint16_t *cp = codes + i * pos_stride;
            if (code_stride == 1)
                for (size_t j = 0; j < nc; j++)
                    any |= cp[j];
            else
                for (size_t j = 0; j < nc; j++)
                    any |= cp[j * code_stride];
        }
    return any;
}

static int decode_rows(const fkvf_rvq *q, const dec_call *c);

/* A decode cut into ranges of `per` rows, one per item (fkvf_par_for). */
typedef struct dec_job {
    const fkvf_rvq *q;
    const dec_call *c;
    size_t per;
} dec_job;

static int dec_item(void *ctx, unsigned worker, size_t item)
{
    const dec_job *j = ctx;
    (void)worker;
    dec_call c = *j->c;
    size_t i0 = item * j->per;
    c.n_rows = j->c->n_rows - i0 < j->per ? j->c->n_rows - i0 : j->per;
    c.codes = c.codes ? c.codes + i0 * c.ps : NULL;
    c.first += i0;
    c.row0 += i0;
    return decode_rows(j->q, &c);
}

/* The codes of a position that map decodes: the first's index in a whole
 * position (*j0) and their count. */
static size_t map_codes(const fkvf_rvq *q, const fkvfq_dec_map *map, size_t *j0)
{
    if (q->lay) {
        *j0 = q->lcode[map->l0];
        return q->lcode[map->l0 + map->nl] - q->lcode[map->l0];
    }
    size_t per = (size_t)q->n_kv_heads * ((size_t)q->shape.k_stages + q->shape.v_stages);
    *j0 = (size_t)map->l0 * per;
    return (size_t)map->nl * per;
}

/* Bytes of map's output of n_rows rows in dtype dt (0: too large). */
static size_t map_bytes(const fkvf_rvq *q, const fkvfq_dec_map *map, size_t n_rows, fkvf_dtype dt)
{
    unsigned parts = map->parts ? map->parts : 3u;
    size_t e = (size_t)q->n_kv_heads * ((parts & 1u ? (size_t)q->shape.key_dim : 0) +
                                        (parts & 2u ? (size_t)q->shape.value_dim : 0)), n;
    if (!fkvf_mulsz(e, map->nl, &n) || !fkvf_mulsz(n, fkvfq_dtype_size(dt), &n) ||
        !fkvf_mulsz(n, n_rows, &n))
        return 0;
    return n;
}

/* fkvfq_rvq_decode_map (fkvf_rvq_decode: every layer, rows); fast = 0
 * keeps to the portable code (for tests) */
static int rvq_decode(const fkvf_rvq *q, const fkvfq_dec_map *map, const uint16_t *codes,
                      size_t pos_stride, size_t code_stride, size_t n_rows,
                      uint64_t first_position, const fkvf_rope *key_rope, fkvf_dtype out_dtype,
                      void *out, size_t out_size, int fast)
{
    if (!FKVF_RVQ_OK(q) || !map)
        return FKVF_E_INVALID_ARG;
    const fkvf_codebook_shape *sh = &q->shape;
    if (map->nl < 1 || map->l0 > sh->n_layers || map->nl > sh->n_layers - map->l0 ||
        map->row0 > map->n_out || n_rows > map->n_out - map->row0 || map->parts > 3u)
        return FKVF_E_INVALID_ARG;
    size_t es = fkvfq_dtype_size(out_dtype);
    size_t all = es ? map_bytes(q, map, map->n_out, out_dtype) : 0;
    if (!es || (map->n_out && !all) || (key_rope && !fkvf_rope_valid(key_rope, sh->key_dim)) ||
        out_size < all || (n_rows && !out) ||
        (n_rows && first_position > UINT64_MAX - (n_rows - 1)))
        return FKVF_E_INVALID_ARG;
    size_t j0, nc = map_codes(q, map, &j0);
    int rc = codes_check_n(nc, n_rows, pos_stride, code_stride);
    if (rc)
        return rc;
    if (!n_rows)
        return FKVF_OK;
    if (nc && !codes)
        return FKVF_E_INVALID_ARG;
    /* every code in range before anything is written (k is a power of two:
     * a code is in range iff it has no bit at or above log2 k) */
    const unsigned high = (unsigned)(0xFFFFu & ~(sh->k - 1u));
    if (codes_high(codes, pos_stride, code_stride, n_rows, nc) & high)
        return FKVF_E_RANGE;
    dec_call c = {codes,   pos_stride, code_stride, n_rows, first_position, key_rope, out_dtype,
                  out,     map->row0,  map->n_out,  map->l0, map->nl,        0,        map->nl,
                  map->heads != 0, map->parts ? map->parts : 3u, fast};
    size_t per = par_rows(q, n_rows);
    if (per >= n_rows)
        return decode_rows(q, &c);
    dec_job j = {q, &c, per};
    return fkvf_par_for(fkvf_par_threads(q->threads), (n_rows + per - 1) / per, dec_item, &j);
}

typedef struct dec_scratch {
    float *acc;     /* dmax */
    double *freqs;  /* rd / 2 */
    double *cs;     /* chunk * rd */
    uint16_t *t16;  /* set16 */
    uint16_t *pm;   /* pm_n */
} dec_scratch;

/* The kernel choices of the x86-64 decoder (none elsewhere). */
static void dec_plan_fast(dec_plan *p)
{
#ifdef Q_DEC_FAST
    const fkvf_rvq *q = p->q;
    const fkvf_codebook_shape *sh = &q->shape;
    p->kern = p->fast && fkvfq_decode16_available();
    p->rope_kind = !p->rd ? 0 : (p->rope->layout == 1 ? p->rd % 8 == 0 : p->rd % 16 == 0) ? 1 : 2;
    /* the f16 path: G heads' tables at a time (all of a layer's heads when
     * pooled), their f16 copy at most Q_SET16_BYTES */
    size_t G = 0;
    if (q->per_tab && q->per_tab <= Q_SET16_BYTES / sizeof(uint16_t))
        G = sh->pooled ? q->n_kv_heads : Q_SET16_BYTES / sizeof(uint16_t) / q->per_tab;
    if (G > q->n_kv_heads)
        G = q->n_kv_heads;
    if (p->b16 && !G)
        G = 1; /* nothing copied: a head at a time */
    p->G = G;
    p->use16 = p->kern && sh->dtype == FKVF_DTYPE_F16 && G &&
               (p->b16 || p->chunk >= Q_STREAM_MIN);
    p->set16 = p->use16 && !p->b16 ? (sh->pooled ? 1 : G) * q->per_tab : 0;
    /* non-temporal stores: every 8-lane block of every vector 16-byte aligned */
    p->nt = p->use16 && (uintptr_t)p->out % 16 == 0 && (sh->key_dim * p->es) % 16 == 0 &&
            (sh->value_dim * p->es) % 16 == 0;
    /* f16 out, whole 16-lane blocks: common/vec16.c (AVX-512) */
    p->v16[0] = p->dt == FKVF_DTYPE_F16 &&
                fkvf_vec16_usable(sh->key_dim, p->rd, p->rd ? p->rope->layout : 0);
    p->v16[1] = p->dt == FKVF_DTYPE_F16 && fkvf_vec16_usable(sh->value_dim, 0, 0);
    /* codes one array per stream (restore's) go to the vec16 pass
     * position-major (group16): 4-7% faster than read in place, measured
     * (a position's codes in one or two cache lines instead of one a stream) */
    size_t pm_n = 0;
    if (p->use16 && p->v16[0] && p->v16[1] && G <= Q_GROUP16_MAX && p->ps == 1 &&
        p->cst != 1 && p->nc > 1 && fkvf_mulsz(G * p->m, p->chunk, &pm_n) &&
        pm_n <= SIZE_MAX / sizeof(uint16_t))
        p->pm_n = pm_n;
#else
    (void)p;
#endif
}

/* The plan of call c (arguments checked) on handle q. FKVF_E_UNSUPPORTED
 * for borrowed f16 tables without the kernel that reads them. */
static int dec_plan_make(dec_plan *p, const fkvf_rvq *q, const dec_call *c)
{
    const fkvf_codebook_shape *sh = &q->shape;
    memset(p, 0, sizeof *p);
    p->q = q;
    p->codes = c->codes;
    p->ps = c->ps;
    p->cst = c->cst;
    p->first = c->first;
    p->rope = c->rope;
    p->dt = c->dt;
    p->out = c->out;
    p->row0 = c->row0;
    p->n_out = c->n_out;
    p->l0 = c->l0;
    p->nl = c->nl;
    p->lsel0 = c->lsel0;
    p->heads = c->heads;
    p->es = fkvfq_dtype_size(c->dt);
    p->parts = c->parts;
    p->E = (size_t)q->n_kv_heads * ((c->parts & 1u ? (size_t)sh->key_dim : 0) +
                                    (c->parts & 2u ? (size_t)sh->value_dim : 0));
    /* rows: a whole row of the output's layers; heads: one vector */
    p->ostr[0] = (c->heads ? sh->key_dim : p->E * c->nsel) * p->es;
    p->ostr[1] = (c->heads ? sh->value_dim : p->E * c->nsel) * p->es;
    p->m = (size_t)sh->k_stages + sh->v_stages;
    p->nc = (size_t)c->nl * q->n_kv_heads * p->m;
    p->rd = c->rope ? c->rope->rope_dims : 0;
    /* positions per chunk: Q_DCHUNK, fewer when their angles would take
     * more than Q_CS_BYTES, and no more than the call has */
    size_t chunk = p->rd ? Q_CS_BYTES / ((size_t)p->rd * sizeof(double)) : Q_DCHUNK;
    chunk = chunk < 1 ? 1 : chunk > Q_DCHUNK ? Q_DCHUNK : chunk;
    p->chunk = chunk > c->n_rows ? c->n_rows : chunk;
    p->fast = c->fast;
    p->avx = c->fast && fkvf_cpu_avx();
    /* a handle of borrowed f16 tables has no binary32 rows: the f16 group
     * kernel decodes every chunk, whatever its size */
    p->b16 = q->rows16 != NULL;
    if (p->b16 && !(c->fast && fkvfq_decode16_available()))
        return FKVF_E_UNSUPPORTED;
    dec_plan_fast(p);
    return FKVF_OK;
}

static void dec_free(const fkvf_allocator *a, dec_scratch *w)
{
    fkvf_free(a, w->pm);
    fkvf_free(a, w->acc);
    fkvf_free(a, w->freqs);
    fkvf_free(a, w->cs);
    fkvf_free(a, w->t16);
}

/* The scratch of plan p; FKVF_E_NOMEM (w then holds what was allocated). */
static int dec_alloc(const dec_plan *p, dec_scratch *w)
{
    const fkvf_allocator *a = &p->q->alloc;
    const fkvf_codebook_shape *sh = &p->q->shape;
    const uint32_t dmax = sh->key_dim > sh->value_dim ? sh->key_dim : sh->value_dim;
    memset(w, 0, sizeof *w);
    int ok = (w->acc = fkvf_calloc(a, dmax, sizeof(float))) != NULL;
    if (ok && p->rd)
        ok = (w->freqs = fkvf_calloc(a, p->rd / 2, sizeof(double))) &&
             (w->cs = fkvf_calloc(a, p->chunk * p->rd, sizeof(double)));
    if (ok && p->set16)
        ok = (w->t16 = fkvf_malloc(a, p->set16 * sizeof(uint16_t))) != NULL;
    if (ok && p->pm_n)
        ok = (w->pm = fkvf_malloc(a, p->pm_n * sizeof(uint16_t))) != NULL;
    return ok ? FKVF_OK : FKVF_E_NOMEM;
}

#ifdef Q_DEC_FAST
/* The nb positions i0.. by the f16 group kernel: per layer, G heads at a
 * time (their tables narrowed to f16 scratch, or read in place). */
static void dec_chunk_group16(const dec_plan *p, const dec_scratch *w, size_t i0, size_t nb)
{
    const fkvf_rvq *q = p->q;
    const fkvf_codebook_shape *sh = &q->shape;
    for (uint32_t l = p->l0; l < p->l0 + p->nl; l++)
        for (uint32_t h0 = 0; h0 < q->n_kv_heads; h0 += (uint32_t)p->G) {
            q_group g;
            /* the heads' tables follow each other in q->rows (q->rows16) */
            size_t tab0 = (size_t)l * sh->n_heads + (sh->pooled ? 0 : h0);
            g.q = q;
            g.t16 = p->b16 ? q->rows16 + fkvf_cbk1_table_off(sh, tab0, 0, 0) : w->t16;
            g.tab_stride = sh->pooled ? 0 : q->per_tab;
            g.l = l;
            g.h0 = h0;
            g.G = q->n_kv_heads - h0 < p->G ? q->n_kv_heads - h0 : (uint32_t)p->G;
            g.codes = p->codes + i0 * p->ps;
            g.ps = p->ps;
            g.cst = p->cst;
            g.nb = nb;
            g.p = p;
            g.i0 = i0;
            g.rope = p->rope;
            g.rope_kind = p->rope_kind;
            g.cs = w->cs;
            g.acc = w->acc;
            g.pm = w->pm;
            g.v16[0] = p->v16[0];
            g.v16[1] = p->v16[1];
            if (!p->b16)
                fast_narrow(q->rows + tab0 * q->per_tab, w->t16,
                            (sh->pooled ? 1 : g.G) * q->per_tab);
            fast_group(&g, p->dt, p->nt);
        }
}
#endif

#if defined(__GNUC__) || defined(__clang__)
#define Q_PREFETCH_OK 1
#endif

/* A short chunk (a few rows): the in-set prefetch never runs; the rows of
 * the table set Q_SET_AHEAD sets after (l, h, kv) instead, all its
 * positions, so that their misses overlap this set's work. */
static void dec_prefetch_set_ahead(const dec_plan *p, size_t i0, size_t nb, uint32_t l,
                                   uint32_t h, unsigned kv)
{
#ifdef Q_PREFETCH_OK
    const fkvf_rvq *q = p->q;
    const fkvf_codebook_shape *sh = &q->shape;
    size_t t = ((size_t)l * q->n_kv_heads + h) * 2 + kv + Q_SET_AHEAD;
    size_t nl = t / (2 * (size_t)q->n_kv_heads);
    if (nl >= (size_t)p->l0 + p->nl)
        return;
    uint32_t nh = (uint32_t)(t / 2 % q->n_kv_heads);
    unsigned nkv = (unsigned)(t % 2);
    size_t ntab = nl * sh->n_heads + (sh->pooled ? 0 : nh);
    unsigned nns = nkv == 0 ? sh->k_stages : sh->v_stages;
    uint32_t ndim = nkv == 0 ? sh->key_dim : sh->value_dim;
    size_t ncj = dec_cj(p, (uint32_t)nl, nh) + (nkv ? sh->k_stages : 0);
    for (unsigned s = 0; s < nns; s++) {
        const float *nt0 = q->rows + fkvfq_table_off(q, ntab, nkv, s);
        for (size_t i = 0; i < nb; i++) {
            const char *r =
                (const char *)(nt0 + (size_t)p->codes[(i0 + i) * p->ps + (ncj + s) * p->cst] *
                                         ndim);
            for (size_t b = 0; b < ndim * sizeof(float); b += 64)
                __builtin_prefetch(r + b);
        }
    }
#else
    (void)p, (void)i0, (void)nb, (void)l, (void)h, (void)kv;
#endif
}

/* The rows of the position Q_PREFETCH ahead of i (a table set's random rows
 * that may not be in cache yet), and its output bytes: rows lie a whole
 * cache row apart, beyond the hardware prefetchers. */
static inline void dec_prefetch_position(const dec_plan *p, const float *const *tb, unsigned ns,
                                         uint32_t dim, size_t cj, size_t at, const uint8_t *od)
{
#ifdef Q_PREFETCH_OK
    size_t cn = at * p->ps + cj * p->cst;
    for (unsigned s = 0; s < ns; s++) {
        const char *r = (const char *)(tb[s] + (size_t)p->codes[cn + s * p->cst] * dim);
        for (size_t b = 0; b < dim * sizeof(float); b += 64)
            __builtin_prefetch(r + b);
    }
    for (size_t b = 0; b < dim * p->es; b += 64)
        __builtin_prefetch((const char *)od + b, 1);
#else
    (void)p, (void)tb, (void)ns, (void)dim, (void)cj, (void)od, (void)at;
#endif
}

/* The next step of streaming bytes [*done, n) of the next table set into
 * cache: at most step bytes. */
static inline void dec_prefetch_stream(const char *nx, size_t n, size_t step, size_t *done)
{
#ifdef Q_PREFETCH_OK
    for (size_t b = 0; b < step && *done < n; b += 64, *done += 64)
        __builtin_prefetch(nx + *done);
#else
    (void)nx, (void)n, (void)step, (void)done;
#endif
}

/* One vector: the sum of its rows, keys rotated, stored in the output dtype
 * (the AVX2 + F16C kernel, or the portable steps). */
static inline void dec_vector(const dec_plan *p, const dec_scratch *w, const float *const *rowp,
                              unsigned ns, uint32_t dim, unsigned kv, size_t i, uint8_t *dst)
{
#ifdef Q_DEC_FAST
    if (p->kern) {
        fast_vector32(p->dt, rowp, ns, dim, p->rope, kv == 0 ? p->rope_kind : 0,
                      w->cs ? w->cs + i * p->rd : NULL, w->acc, dst);
        return;
    }
#endif
    fkvf_stage_sum(w->acc, rowp, ns, dim, p->avx);
    if (kv == 0 && p->rd)
        fkvf_rope_rotate_f32(p->rope, w->cs + i * p->rd, 0, w->acc, p->avx);
    if (p->fast)
        fkvfq_store(p->dt, w->acc, dst, dim);
    else
        fkvfq_store_portable(p->dt, w->acc, dst, dim);
}

/* Table set (l, h, kv) for the nb positions i0.. from the binary32 rows,
 * streaming the next table set into cache meanwhile. */
static void dec_set(const dec_plan *p, const dec_scratch *w, size_t i0, size_t nb, uint32_t l,
                    uint32_t h, unsigned kv)
{
    const fkvf_rvq *q = p->q;
    const fkvf_codebook_shape *sh = &q->shape;
    const size_t tab = (size_t)l * sh->n_heads + (sh->pooled ? 0 : h);
    const unsigned ns = kv == 0 ? sh->k_stages : sh->v_stages;
    const uint32_t dim = kv == 0 ? sh->key_dim : sh->value_dim;
    const size_t cj = dec_cj(p, l, h) + (kv ? sh->k_stages : 0);
    const float *tb[16], *rowp[16];
    for (unsigned s = 0; s < ns; s++)
        tb[s] = q->rows + fkvfq_table_off(q, tab, kv, s);
    /* Stream the next table set (they follow each other in memory in this
     * loop order) into cache while this one is used: sequential reads
     * instead of random misses. */
    const char *nx = NULL;
    size_t nx_bytes = 0;
    if (nb >= Q_STREAM_MIN && ns) {
        size_t here = fkvfq_table_off(q, tab, kv, 0) + (size_t)ns * sh->k * dim;
        unsigned nns = kv == 0 ? sh->v_stages : sh->k_stages;
        uint32_t ndim = kv == 0 ? sh->value_dim : sh->key_dim;
        if (here < q->n_floats) {
            nx = (const char *)(q->rows + here);
            nx_bytes = (size_t)nns * sh->k * ndim * sizeof(float);
            if (nx_bytes > (q->n_floats - here) * sizeof(float))
                nx_bytes = (q->n_floats - here) * sizeof(float);
        }
    }
    if (nb < Q_SHORT)
        dec_prefetch_set_ahead(p, i0, nb, l, h, kv);
    size_t nx_step = nx ? (nx_bytes / nb + 63) & ~(size_t)63 : 0, nx_done = 0;
    for (size_t i = 0; i < nb; i++) {
        dec_prefetch_stream(nx, nx_bytes, nx_step, &nx_done);
        const uint16_t *ci = p->codes + (i0 + i) * p->ps + cj * p->cst;
        for (unsigned s = 0; s < ns; s++)
            rowp[s] = tb[s] + (size_t)ci[s * p->cst] * dim;
        if (i + Q_PREFETCH < nb)
            dec_prefetch_position(p, tb, ns, dim, cj, i0 + i + Q_PREFETCH,
                                  dec_dst(p, l, h, kv, i0 + i + Q_PREFETCH));
        dec_vector(p, w, rowp, ns, dim, kv, i, dec_dst(p, l, h, kv, i0 + i));
    }
}

/* Decode n_rows positions whose arguments and codes rvq_decode checked:
 * each layer by its own handle, or chunk by chunk with the plan's kernels. */
static int decode_rows(const fkvf_rvq *q, const dec_call *c)
{
    if (q->lay) { /* each layer by its handle (of one layer) */
        int rc = FKVF_OK;
        for (uint32_t l = c->l0; l < c->l0 + c->nl && !rc; l++) {
            dec_call one = *c;
            one.codes = c->codes + (q->lcode[l] - q->lcode[c->l0]) * c->cst;
            one.l0 = 0;
            one.nl = 1;
            one.lsel0 = c->lsel0 + (l - c->l0);
            rc = decode_rows(q->lay[l], &one);
        }
        return rc;
    }
    dec_plan p;
    dec_scratch w;
    int rc = dec_plan_make(&p, q, c);
    if (rc)
        return rc;
    if ((rc = dec_alloc(&p, &w))) {
        dec_free(&q->alloc, &w);
        return rc;
    }
    if (p.rd)
        fkvf_rope_freqs(c->rope, w.freqs);
    for (size_t i0 = 0; i0 < c->n_rows; i0 += p.chunk) {
        size_t nb = c->n_rows - i0 < p.chunk ? c->n_rows - i0 : p.chunk;
        for (size_t i = 0; p.rd && i < nb; i++)
            fkvf_rope_angles(c->rope, w.freqs, c->first + i0 + i, w.cs + i * p.rd);
#ifdef Q_DEC_FAST
        if (p.use16 && (p.b16 || nb >= Q_STREAM_MIN)) {
            dec_chunk_group16(&p, &w, i0, nb);
            continue;
        }
#endif
        for (uint32_t l = c->l0; l < c->l0 + c->nl; l++)
            for (uint32_t h = 0; h < q->n_kv_heads; h++)
                for (unsigned kv = 0; kv < 2; kv++)
                    if (c->parts >> kv & 1u)
                        dec_set(&p, &w, i0, nb, l, h, kv);
    }
    dec_free(&q->alloc, &w);
    return FKVF_OK;
}

/* every layer, as rows */
static fkvfq_dec_map map_all(const fkvf_rvq *q, size_t n_rows)
{
    fkvfq_dec_map m = {0, FKVF_RVQ_OK(q) ? q->shape.n_layers : 0, 0, n_rows, 0, 3u};
    return m;
}

FKVF_API int fkvf_rvq_decode(const fkvf_rvq *q, const uint16_t *codes, size_t pos_stride,
                             size_t code_stride, size_t n_rows, uint64_t first_position,
                             const fkvf_rope *key_rope, fkvf_dtype out_dtype, void *out,
                             size_t out_size)
{
    fkvfq_dec_map m = map_all(q, n_rows);
    return rvq_decode(q, &m, codes, pos_stride, code_stride, n_rows, first_position, key_rope,
                      out_dtype, out, out_size, 1);
}

int fkvfq_rvq_decode_portable(const fkvf_rvq *q, const uint16_t *codes, size_t pos_stride,
                              size_t code_stride, size_t n_rows, uint64_t first_position,
                              const fkvf_rope *key_rope, fkvf_dtype out_dtype, void *out,
                              size_t out_size)
{
    fkvfq_dec_map m = map_all(q, n_rows);
    return rvq_decode(q, &m, codes, pos_stride, code_stride, n_rows, first_position, key_rope,
                      out_dtype, out, out_size, 0);
}

int fkvfq_rvq_decode_map(const fkvf_rvq *q, const fkvfq_dec_map *map, const uint16_t *codes,
                         size_t pos_stride, size_t code_stride, size_t n_rows,
                         uint64_t first_position, const fkvf_rope *key_rope, fkvf_dtype out_dtype,
                         void *out, size_t out_size, int fast)
{
    return rvq_decode(q, map, codes, pos_stride, code_stride, n_rows, first_position, key_rope,
                      out_dtype, out, out_size, fast != 0);
}

FKVF_API int fkvf_rvq_decode_to(const fkvf_rvq *q, const fkvf_rvq_decode_target *target,
                                const uint16_t *codes, size_t pos_stride, size_t code_stride,
                                size_t n_rows, uint64_t first_position,
                                const fkvf_rope *key_rope, fkvf_dtype out_dtype, void *out,
                                size_t out_size)
{
    if (!target || (target->layout != FKVF_LAYOUT_ROWS && target->layout != FKVF_LAYOUT_HEADS))
        return FKVF_E_INVALID_ARG;
    fkvfq_dec_map m = {target->layer_first, target->layer_count,
                       target->layout == FKVF_LAYOUT_HEADS, target->n_out, target->row_first,
                       target->parts};
    return rvq_decode(q, &m, codes, pos_stride, code_stride, n_rows, first_position, key_rope,
                      out_dtype, out, out_size, 1);
}
