/* Fuzz target: any bytes as a llama.cpp state file (tools/llama_state.c).
 * llst_parse must never crash, hang or leak; a failure leaves a message and
 * an empty file. A file that parses is turned into a cache with the shape
 * its row bytes imply (1 KV head, dims = row bytes / element bytes); a
 * cache that comes out writes back (llst_params_from_file, llst_write_mem)
 * to exactly the input's bytes, which parse again; its params survive
 * llst_meta_set / llst_meta_get. The same bytes in a file read lazily
 * (llst_open, llst_to_cache_lazy) give the same results and messages, and
 * the lazy cache reads every layer as the cache in memory holds it. */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "llama_state.h"

static uint32_t dim_of(uint64_t row_bytes, int32_t type)
{
    uint64_t el = type == LLST_GGML_F32 ? 4 : type == LLST_GGML_F16 || type == LLST_GGML_BF16 ? 2 : 1;
    uint64_t d = row_bytes / el;
    return d > UINT32_MAX ? 0 : (uint32_t)d;
}

static const char *get_meta(void *ctx, const char *key) { return kvio_cache_get_meta(ctx, key); }

/* The input in a scratch file (one for the process), opened anew for
 * llst_open, which owns the descriptor it is given. */
static int scratch_fd(const uint8_t *data, size_t size)
{
    static FILE *f;
    if (!f)
        f = tmpfile();
    FZ_CHECK(f != NULL);
    int fd = fileno(f);
    FZ_CHECK(ftruncate(fd, 0) == 0);
    for (size_t at = 0; at < size;) {
        ssize_t w = pwrite(fd, data + at, size - at, (off_t)at);
        FZ_CHECK(w > 0);
        at += (size_t)w;
    }
    int d = dup(fd);
    FZ_CHECK(d >= 0);
    return d;
}

/* llst_open's results against llst_parse's (rc, err) and llst_to_cache's
 * (crc, err2; c when it made one). */
static void check_lazy(const uint8_t *data, size_t size, int rc, const char *err, const llst_shape *sh,
                       int crc, const char *err2, const kvio_cache *c)
{
    llst_file g;
    char e[256];
    e[0] = 0;
    FZ_CHECK(llst_open(scratch_fd(data, size), size, "fuzz", &g, e, sizeof e) == rc && !strcmp(e, err));
    if (rc != LLST_OK)
        return;
    kvio_cache b;
    e[0] = 0;
    FZ_CHECK(llst_to_cache_lazy(&g, sh, "fuzz", &b, e, sizeof e) == crc && !strcmp(e, err2));
    for (uint32_t l = 0; crc == LLST_OK && l < c->n_layers && c->n_positions; l++)
        for (int kv = 0; kv < 2; kv++) {
            uint64_t bytes = kv ? kvio_value_bytes(c) : kvio_key_bytes(c);
            size_t rb = (size_t)(kv ? c->value_dim : c->key_dim) * kvio_dtype_size(c->dtype);
            uint8_t *x = malloc((size_t)bytes), *y = malloc((size_t)bytes);
            FZ_CHECK(x && y);
            /* heads-first, as the cache holds a layer */
            FZ_CHECK(kvio_read_kv(&b, l, kv, 0, c->n_positions, x, rb, (size_t)c->n_positions * rb, e,
                                  sizeof e) == KVIO_OK);
            FZ_CHECK(kvio_read_kv(c, l, kv, 0, c->n_positions, y, rb, (size_t)c->n_positions * rb, e,
                                  sizeof e) == KVIO_OK);
            FZ_CHECK(!memcmp(x, y, (size_t)bytes));
            free(x);
            free(y);
        }
    if (crc == LLST_OK)
        kvio_cache_free(&b);
    llst_free(&g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    llst_file f;
    char err[256];
    err[0] = 0;
    (void)llst_sniff(data, size);
    int rc = llst_parse(data, size, "fuzz", &f, err, sizeof err);
    if (rc != LLST_OK) {
        FZ_CHECK(err[0] && !f.tokens && !f.layers && !f.pos && !f.seq_id && !f.arch && !f.n_cells);
        check_lazy(data, size, rc, err, NULL, 0, "", NULL);
        return 0;
    }
    FZ_CHECK(f.size == size && f.n_stream >= 1 && f.stream < f.n_stream && f.v_trans <= 1);
    llst_shape sh = {f.n_cells ? f.n_layer : 1, 1, 1, 1};
    if (f.n_cells && f.n_layer) {
        sh.key_dim = dim_of(f.layers[0].k_row_bytes, f.layers[0].k_type);
        sh.value_dim = dim_of(f.layers[0].v_row_bytes, f.layers[0].v_type);
    }
    kvio_cache c;
    char err2[256];
    err2[0] = 0;
    int crc = llst_to_cache(&f, &sh, "fuzz", &c, err2, sizeof err2);
    check_lazy(data, size, rc, err, &sh, crc, err2, &c);
    if (crc != LLST_OK) {
        FZ_CHECK(err2[0] && !c.keys && !c.values && !c.tokens && !c.n_layers);
        llst_free(&f);
        return 0;
    }
    FZ_CHECK(kvio_cache_check(&c, err, sizeof err) == KVIO_OK && c.n_positions == f.n_cells);
    llst_params p;
    llst_params_from_file(&f, &p);
    uint8_t *out = NULL;
    size_t n = 0;
    FZ_CHECK(llst_write_mem(&c, &p, &out, &n, err, sizeof err) == LLST_OK);
    FZ_CHECK(n == size && !memcmp(out, data, size));
    llst_file g;
    FZ_CHECK(llst_parse(out, n, "fuzz-rt", &g, err, sizeof err) == LLST_OK);
    FZ_CHECK(g.kind == f.kind && g.n_cells == f.n_cells && g.n_layer == f.n_layer && g.stream == f.stream);
    llst_free(&g);
    free(out);
    /* the params through META entries */
    if (llst_meta_set(&c, &p) == LLST_OK) {
        llst_params q;
        FZ_CHECK(llst_meta_get(get_meta, &c, &q, "fuzz", err, sizeof err) == LLST_OK);
        FZ_CHECK(q.kind == p.kind && q.n_stream == p.n_stream && q.stream == p.stream && q.seq_id == p.seq_id &&
                 q.v_trans == p.v_trans && q.k_type == p.k_type && q.v_type == p.v_type);
        FZ_CHECK(!p.arch || (q.arch && !strcmp(q.arch, p.arch)));
    } else {
        FZ_CHECK(p.seq_id < 0 || (p.kind == LLST_KIND_SESSION && !p.arch));
    }
    kvio_cache_free(&c);
    llst_free(&f);
    return 0;
}
