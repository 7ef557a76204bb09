/*
 * cacheio_sink.c - what the writers share: the byte sink (a file or a
 * growable buffer) and the tensors a cache is written as (names, shapes,
 * bytes in file order).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cacheio_impl.h"

void cio_sk_put(sink *s, const void *p, size_t n)
{
    if (s->rc || !n)
        return;
    if (s->f) {
        if (fwrite(p, 1, n, s->f) != n)
            s->rc = KVIO_E_IO;
        s->len += n;
        return;
    }
    if (n > SIZE_MAX - s->len) {
        s->rc = KVIO_E_NOMEM;
        return;
    }
    if (s->len + n > s->cap) {
        size_t nc = s->cap ? s->cap : 4096;
        while (nc < s->len + n)
            nc = nc > SIZE_MAX / 2 ? s->len + n : 2 * nc;
        uint8_t *nb = realloc(s->buf, nc);
        if (!nb) {
            s->rc = KVIO_E_NOMEM;
            return;
        }
        s->buf = nb;
        s->cap = nc;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
}

void KVIO_PRINTF(2, 3) cio_sk_printf(sink *s, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) {
        s->rc = s->rc ? s->rc : KVIO_E_ARG;
        return;
    }
    cio_sk_put(s, tmp, (size_t)n);
}

/* Token ids as little-endian int32/int64. */
void cio_sk_tokens(sink *s, const kvio_cache *c, unsigned w)
{
    uint8_t tmp[4096];
    size_t k = 0;
    for (uint32_t p = 0; p < c->n_positions; p++) {
        if (w == 4)
            wr32(tmp + k, (uint32_t)c->tokens[p]);
        else
            wr64(tmp + k, (uint64_t)c->tokens[p]);
        k += w;
        if (k + 8 > sizeof tmp) {
            cio_sk_put(s, tmp, k);
            k = 0;
        }
    }
    cio_sk_put(s, tmp, k);
}

void cio_out_kv(const kvio_cache *c, unsigned flags, uint32_t l, int kv, out_tensor *o)
{
    int hf = (flags & KVIO_WRITE_HF) != 0;
    o->nhd = (flags & KVIO_WRITE_NHD) != 0;
    snprintf(o->name, sizeof o->name, "%s%" PRIu32 "%s", hf ? "past_key_values." : "layers.", l,
             kv ? ".value" : ".key");
    size_t k = 0;
    if (hf)
        o->dims[k++] = 1;
    o->dims[k++] = o->nhd ? c->n_positions : c->n_kv_heads;
    o->dims[k++] = o->nhd ? c->n_kv_heads : c->n_positions;
    o->dims[k++] = kv ? c->value_dim : c->key_dim;
    o->ndim = k;
    o->nbytes = kv ? kvio_value_bytes(c) : kvio_key_bytes(c);
    o->data = (kv ? c->values : c->keys) ? (kv ? c->values[l] : c->keys[l]) : NULL;
    o->rb = (size_t)(kv ? c->value_dim : c->key_dim) * kvio_dtype_size(c->dtype);
    o->is_tokens = 0;
}

/* Token ids: "tokens" [T], or with KVIO_WRITE_HF "input_ids" [1, T]. */
void cio_out_tok(const kvio_cache *c, unsigned flags, out_tensor *o)
{
    size_t k = 0;
    int hf = (flags & KVIO_WRITE_HF) != 0;
    snprintf(o->name, sizeof o->name, "%s", hf ? "input_ids" : "tokens");
    if (hf)
        o->dims[k++] = 1;
    o->dims[k++] = c->n_positions;
    o->ndim = k;
    o->nbytes = (uint64_t)c->n_positions * token_width(c);
    o->data = NULL;
    o->is_tokens = 1;
    o->nhd = 0;
    o->rb = 0;
}

/* A key/value tensor's bytes in the order of its file shape. */
void cio_sk_kv(sink *s, const kvio_cache *c, const out_tensor *o)
{
    if (!o->nhd) {
        cio_sk_put(s, o->data, (size_t)o->nbytes);
        return;
    }
    for (uint32_t t = 0; t < c->n_positions; t++)
        for (uint32_t h = 0; h < c->n_kv_heads; h++)
            cio_sk_put(s, o->data + ((size_t)h * c->n_positions + t) * o->rb, o->rb);
}
