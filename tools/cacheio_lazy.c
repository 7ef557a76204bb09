/*
 * cacheio_lazy.c - a cache whose key/value tensors stay in a file, and
 * kvio_read_kv, which reads positions of a layer from memory or through the
 * cache's source: what lets the tools archive a cache larger than memory.
 * A source is a read_kv function (kvio_source); kvio_read with
 * KVIO_READ_LAZY gives a cache the one here (pread of the tensors left in
 * a .safetensors or .npy file), the llama.cpp bridge its own
 * (llama_state.c: a state file's rows converted on demand).
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cacheio_impl.h"

/* bytes read from the file in one pread(2) (more when one position of
 * every head is larger) */
#define LAZY_PIECE ((size_t)4 << 20)

struct kvio_lazy {
    kvio_source src;
};

/* The source of kvio_read's lazy caches: the tensors' offsets in the file. */
typedef struct lazy_file {
    int fd;
    int nhd;        /* the tensors are positions-first in the file */
    char *path;     /* for messages */
    uint64_t *off;  /* [2 * n_layers]: layer l's keys at 2l, values at 2l + 1 */
    uint8_t *buf;   /* scratch of cap bytes */
    size_t cap;
} lazy_file;

static void lazy_file_free(void *opaque)
{
    lazy_file *lz = opaque;
    if (!lz)
        return;
    if (lz->fd >= 0)
        close(lz->fd);
    free(lz->path);
    free(lz->off);
    free(lz->buf);
    free(lz);
}

void cio_lazy_free(struct kvio_lazy *lz)
{
    if (!lz)
        return;
    if (lz->src.free)
        lz->src.free(lz->src.opaque);
    free(lz);
}

int cio_lazy_set(const ctx *x, kvio_cache *c, const kvio_source *src)
{
    struct kvio_lazy *lz = NULL;
    if (!c || !src || !src->read_kv || c->lazy || !(lz = malloc(sizeof *lz))) {
        if (src && src->free)
            src->free(src->opaque);
        return cio_fail(x, c && src && src->read_kv && !c->lazy ? KVIO_E_NOMEM : KVIO_E_ARG,
                        c && src && src->read_kv && !c->lazy ? "out of memory"
                                                             : "no cache, no source, or a lazy cache");
    }
    lz->src = *src;
    c->lazy = lz;
    return KVIO_OK;
}

static int lazy_file_read_kv(void *opaque, const kvio_cache *c, uint32_t layer, int kv,
                             uint32_t first, uint32_t n, void *dst, size_t pos_stride,
                             size_t head_stride, char *err, size_t errlen);

/* The pointer p into map (size bytes) as a file offset; 0 when p is not in
 * it. */
static int map_offset(const uint8_t *map, size_t size, const uint8_t *p, uint64_t *off)
{
    uintptr_t a = (uintptr_t)p, m = (uintptr_t)map;
    if (!p || a < m || a - m >= size)
        return 0;
    *off = (uint64_t)(a - m);
    return 1;
}

int cio_lazy_adopt(const ctx *x, kvio_cache *c, int fd, const uint8_t *map, size_t size, int nhd)
{
    size_t n = 0;
    uint64_t o;
    for (uint32_t l = 0; l < c->n_layers; l++)
        n += (size_t)map_offset(map, size, c->keys[l], &o) +
             (size_t)map_offset(map, size, c->values[l], &o);
    if (n == 0) {
        close(fd);
        return KVIO_OK;
    }
    lazy_file *lz = calloc(1, sizeof *lz);
    if (lz)
        lz->fd = -1; /* fd is closed here on failure, not by lazy_file_free */
    if (!lz || !(lz->off = calloc(2 * (size_t)c->n_layers, sizeof *lz->off)) ||
        !(lz->path = dupstr(x->file ? x->file : "(cache)"))) {
        lazy_file_free(lz);
        close(fd);
        return cio_fail(x, KVIO_E_NOMEM, "out of memory");
    }
    lz->fd = fd;
    lz->nhd = nhd;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        if (map_offset(map, size, c->keys[l], &lz->off[2 * (size_t)l]))
            c->keys[l] = NULL;
        if (map_offset(map, size, c->values[l], &lz->off[2 * (size_t)l + 1]))
            c->values[l] = NULL;
    }
    kvio_source src = {lazy_file_read_kv, lazy_file_free, lz, lz->path};
    return cio_lazy_set(x, c, &src);
}

/* The scratch buffer of at least n bytes; NULL when out of memory. */
static uint8_t *lazy_buf(lazy_file *lz, size_t n)
{
    if (n > lz->cap) {
        uint8_t *p = realloc(lz->buf, n);
        if (!p)
            return NULL;
        lz->buf = p;
        lz->cap = n;
    }
    return lz->buf;
}

/* One read of the layer's tensor (at file offset base): size bytes at
 * byte at of the tensor into the scratch buffer. */
static const uint8_t *lazy_read(const ctx *x, lazy_file *lz, uint32_t layer, int kv,
                                uint64_t base, uint64_t at, size_t size, int *rc)
{
    uint8_t *b = lazy_buf(lz, size ? size : 1);
    if (!b) {
        *rc = cio_fail(x, KVIO_E_NOMEM, "out of memory for %zu bytes", size);
        return NULL;
    }
    /* the message names the tensor: "FILE: layer 3's values: read of ..." */
    char who[512];
    snprintf(who, sizeof who, "%s: layer %u's %s", x->file, layer, kv ? "values" : "keys");
    ctx y = {who, x->err, x->errlen};
    if ((*rc = cio_pread_all(&y, lz->fd, b, size, base + at)) != KVIO_OK)
        return NULL; /* "end of file": the file changed after it was opened */
    return b;
}

/* Geometry of one kvio_read_kv call. */
typedef struct kv_req {
    uint32_t H, T, first, n;
    size_t rb;            /* bytes of one row */
    uint8_t *dst;
    size_t ps, hs;        /* dst strides: position, head */
} kv_req;

/* Heads-first tensor in memory. */
static void kv_from_memory(const uint8_t *t, const kv_req *q)
{
    for (uint32_t h = 0; h < q->H; h++) {
        const uint8_t *s = t + ((size_t)h * q->T + q->first) * q->rb;
        for (uint32_t i = 0; i < q->n; i++)
            memcpy(q->dst + i * q->ps + h * q->hs, s + (size_t)i * q->rb, q->rb);
    }
}

/* Heads-first tensor in the file: each head's run of positions, in pieces. */
static int kv_from_file_hnd(const ctx *x, lazy_file *lz, uint64_t base, uint32_t layer,
                            int kv, const kv_req *q)
{
    size_t per = LAZY_PIECE / q->rb ? LAZY_PIECE / q->rb : 1; /* positions a read */
    int rc = KVIO_OK;
    for (uint32_t h = 0; h < q->H; h++)
        for (uint32_t i = 0; i < q->n; i += (uint32_t)per) {
            uint32_t m = q->n - i < per ? q->n - i : (uint32_t)per;
            uint64_t at = ((uint64_t)h * q->T + q->first + i) * q->rb;
            const uint8_t *b = lazy_read(x, lz, layer, kv, base, at, (size_t)m * q->rb, &rc);
            if (!b)
                return rc;
            for (uint32_t j = 0; j < m; j++)
                memcpy(q->dst + (size_t)(i + j) * q->ps + h * q->hs, b + (size_t)j * q->rb, q->rb);
        }
    return KVIO_OK;
}

/* Positions-first tensor in the file: runs of whole positions, in pieces. */
static int kv_from_file_nhd(const ctx *x, lazy_file *lz, uint64_t base, uint32_t layer,
                            int kv, const kv_req *q)
{
    size_t pb = (size_t)q->H * q->rb; /* one position, every head */
    size_t per = LAZY_PIECE / pb ? LAZY_PIECE / pb : 1;
    int rc = KVIO_OK;
    for (uint32_t i = 0; i < q->n; i += (uint32_t)per) {
        uint32_t m = q->n - i < per ? q->n - i : (uint32_t)per;
        const uint8_t *b =
            lazy_read(x, lz, layer, kv, base, (uint64_t)(q->first + i) * pb, (size_t)m * pb, &rc);
        if (!b)
            return rc;
        for (uint32_t j = 0; j < m; j++)
            for (uint32_t h = 0; h < q->H; h++)
                memcpy(q->dst + (size_t)(i + j) * q->ps + h * q->hs,
                       b + (size_t)j * pb + (size_t)h * q->rb, q->rb);
    }
    return KVIO_OK;
}

static int lazy_file_read_kv(void *opaque, const kvio_cache *c, uint32_t layer, int kv,
                             uint32_t first, uint32_t n, void *dst, size_t pos_stride,
                             size_t head_stride, char *err, size_t errlen)
{
    lazy_file *lz = opaque;
    ctx x = {lz->path, err, errlen};
    kv_req q = {c->n_kv_heads, c->n_positions, first, n,
                (size_t)(kv ? c->value_dim : c->key_dim) * kvio_dtype_size(c->dtype),
                dst, pos_stride, head_stride};
    uint64_t base = lz->off[2 * (size_t)layer + (size_t)kv];
    return lz->nhd ? kv_from_file_nhd(&x, lz, base, layer, kv, &q)
                   : kv_from_file_hnd(&x, lz, base, layer, kv, &q);
}

int kvio_read_kv(const kvio_cache *c, uint32_t layer, int kv, uint32_t first, uint32_t n,
                 void *dst, size_t pos_stride, size_t head_stride, char *err, size_t errlen)
{
    ctx x = {c && c->lazy && c->lazy->src.name ? c->lazy->src.name : "(cache)", err, errlen};
    if (!c || (!dst && n) || (kv != 0 && kv != 1))
        return cio_fail(&x, KVIO_E_ARG, "no cache, no destination or kv not 0 or 1");
    if (layer >= c->n_layers || first > c->n_positions || n > c->n_positions - first)
        return cio_fail(&x, KVIO_E_ARG,
                        "layer %u, positions [%u, %" PRIu64 ") outside the cache (%u layers, %u "
                        "positions)",
                        layer, first, (uint64_t)first + n, c->n_layers, c->n_positions);
    if (n == 0)
        return KVIO_OK;
    const uint8_t *t = kv ? c->values[layer] : c->keys[layer];
    if (t) {
        kv_req q = {c->n_kv_heads, c->n_positions, first, n,
                    (size_t)(kv ? c->value_dim : c->key_dim) * kvio_dtype_size(c->dtype),
                    dst, pos_stride, head_stride};
        kv_from_memory(t, &q);
        return KVIO_OK;
    }
    if (!c->lazy)
        return cio_fail(&x, KVIO_E_ARG, "layer %u has no data", layer);
    const kvio_source *s = &c->lazy->src;
    return s->read_kv(s->opaque, c, layer, kv, first, n, dst, pos_stride, head_stride, err, errlen);
}
