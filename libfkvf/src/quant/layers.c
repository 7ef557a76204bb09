/* Codebooks with stage counts per layer (spec 13.1 layer table, format 1.1):
 * a per-layer handle is one uniform one-layer handle per layer, each
 * working on whole cache rows (row_elems, layer_elem), plus the layer
 * table and where each layer's codes start (spec 11.2: the code order is
 * the index streams' canonical order, P(l)). rvq.c's public calls hand a
 * per-layer handle's work to its layers. */
#include <string.h>

#include "alloc.h"
#include "cbk1_layout.h"
#include "ckd.h"
#include "quant.h"

int fkvfq_lay_uniform(const fkvf_codebook_shape *s) { return fkvf_cbk1_table_uniform(s); }

fkvf_codebook_shape fkvfq_lay_shape(const fkvf_codebook_shape *s, uint32_t l)
{
    fkvf_codebook_shape one = *s;
    one.n_layers = 1;
    one.k_stages = (uint8_t)fkvf_layer_k_stages(s, l);
    one.v_stages = (uint8_t)fkvf_layer_v_stages(s, l);
    one.layer_stages = NULL;
    return one;
}

int fkvfq_lay_new(fkvf_rvq **out, const fkvf_codebook_shape *shape, uint32_t n_kv_heads,
                  const fkvf_allocator *alloc)
{
    *out = NULL;
    const size_t L = shape->n_layers; /* <= 1024 */
    fkvf_rvq *q = fkvf_malloc(alloc, sizeof *q);
    if (!q)
        return FKVF_E_NOMEM;
    memset(q, 0, sizeof *q);
    fkvf_handle_init(&q->h, FKVF_HANDLE_RVQ);
    q->alloc = *fkvf_alloc_or_default(alloc);
    q->lst = fkvf_malloc(&q->alloc, 2 * L);
    q->lay = fkvf_calloc(&q->alloc, L, sizeof *q->lay);
    q->lcode = fkvf_calloc(&q->alloc, L + 1, sizeof *q->lcode);
    if (!q->lst || !q->lay || !q->lcode) {
        fkvfq_lay_release(q);
        fkvf_free(&q->alloc, q);
        return FKVF_E_NOMEM;
    }
    memcpy(q->lst, shape->layer_stages, 2 * L);
    q->shape = *shape;
    q->shape.layer_stages = q->lst;
    q->n_kv_heads = n_kv_heads;
    q->n_tabs = L * shape->n_heads;
    for (size_t l = 0; l < L; l++) /* <= 2^10 * 2^10 * 32: no overflow */
        q->lcode[l + 1] = q->lcode[l] + (size_t)n_kv_heads * ((size_t)q->lst[2 * l] + q->lst[2 * l + 1]);
    *out = q;
    return FKVF_OK;
}

void fkvfq_lay_adopt(fkvf_rvq *q, uint32_t l, fkvf_rvq *sub)
{
    size_t per_layer = (size_t)q->n_kv_heads * ((size_t)q->shape.key_dim + q->shape.value_dim);
    sub->row_elems = per_layer * q->shape.n_layers;
    sub->layer_elem = per_layer * l;
    q->lay[l] = sub;
    q->n_floats += sub->n_floats; /* each was sized with checked products; their
                                   * sum is that of the CBK1 tables, sized too */
    q->decode_only = sub->decode_only;
}

void fkvfq_lay_release(fkvf_rvq *q)
{
    if (q->lay)
        for (uint32_t l = 0; l < q->shape.n_layers; l++)
            fkvf_rvq_free(q->lay[l]);
    fkvf_free(&q->alloc, q->lay);
    fkvf_free(&q->alloc, q->lst);
    fkvf_free(&q->alloc, q->lcode);
    q->lay = NULL;
    q->lst = NULL;
    q->lcode = NULL;
}
