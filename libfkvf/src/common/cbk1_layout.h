/* Where a stage table lies among a codebook's tables (spec 13.2): the one
 * formula for quant/'s binary32 rows, its borrowed f16 tables and read/'s
 * f16 elements of CBK1 contents (after the 64-byte header). */
#ifndef FKVF_COMMON_CBK1_LAYOUT_H
#define FKVF_COMMON_CBK1_LAYOUT_H

#include <stddef.h>

#include "fkvf.h"

/* Element offset of stage table (tab, kv, s) of shape sh: tab = layer *
 * n_heads + head (head 0 when pooled), kv 0 keys, 1 values. The shape's
 * tables must be addressable (no overflow check: the callers' shapes were
 * sized with checked products). */
static inline size_t fkvf_cbk1_table_off(const fkvf_codebook_shape *sh, size_t tab, unsigned kv,
                                         unsigned s)
{
    size_t per_tab = (size_t)sh->k * ((size_t)sh->k_stages * sh->key_dim +
                                      (size_t)sh->v_stages * sh->value_dim);
    size_t base = tab * per_tab;
    if (kv == 0)
        return base + (size_t)s * sh->k * sh->key_dim;
    return base + (size_t)sh->k_stages * sh->k * sh->key_dim + (size_t)s * sh->k * sh->value_dim;
}

/* A layer table (spec 13.1: n_layers pairs (ks(l), vs(l))) against the
 * header's counts ks and vs: 0 when every count is at most 16 and the
 * largest are ks and vs; else the first layer with a count above 16, plus 1,
 * or n_layers + 1 when the largest are not ks and vs. The one test of it. */
static inline uint32_t fkvf_cbk1_table_bad(const uint8_t *lst, uint32_t n_layers, unsigned ks,
                                           unsigned vs)
{
    unsigned mk = 0, mv = 0;
    for (uint32_t l = 0; l < n_layers; l++) {
        unsigned a = lst[2 * (size_t)l], b = lst[2 * (size_t)l + 1];
        if (a > 16 || b > 16)
            return l + 1;
        mk = a > mk ? a : mk;
        mv = b > mv ? b : mv;
    }
    return mk == ks && mv == vs ? 0 : n_layers + 1;
}

/* 1 when shape sh has no layer table or every layer of its table has the
 * same counts (the uniform codebook, spec 13.1); the one test of it. */
static inline int fkvf_cbk1_table_uniform(const fkvf_codebook_shape *sh)
{
    if (!sh->layer_stages)
        return 1;
    for (size_t i = 2; i < 2 * (size_t)sh->n_layers; i++)
        if (sh->layer_stages[i] != sh->layer_stages[i % 2])
            return 0;
    return 1;
}

#endif
