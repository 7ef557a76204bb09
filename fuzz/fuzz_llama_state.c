/* Fuzz target: any bytes as a llama.cpp state file (tools/llama_state.c).
 * llst_parse must never crash, hang or leak; a failure leaves a message and
 * an empty file. A file that parses is turned into a cache with the shape
 * its row bytes imply (1 KV head, dims = row bytes / element bytes); a
 * cache that comes out writes back (llst_params_from_file, llst_write_mem)
 * to exactly the input's bytes, which parse again; its params survive
 * llst_meta_set / llst_meta_get. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "llama_state.h"

static uint32_t dim_of(uint64_t row_bytes, int32_t type)
{
    uint64_t el = type == LLST_GGML_F32 ? 4 : type == LLST_GGML_F16 || type == LLST_GGML_BF16 ? 2 : 1;
    uint64_t d = row_bytes / el;
    return d > UINT32_MAX ? 0 : (uint32_t)d;
}

static const char *get_meta(void *ctx, const char *key) { return kvio_cache_get_meta(ctx, key); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    llst_file f;
    char err[256];
    err[0] = 0;
    (void)llst_sniff(data, size);
    if (llst_parse(data, size, "fuzz", &f, err, sizeof err) != LLST_OK) {
        FZ_CHECK(err[0] && !f.tokens && !f.layers && !f.pos && !f.seq_id && !f.arch && !f.n_cells);
        return 0;
    }
    FZ_CHECK(f.size == size && f.n_stream >= 1 && f.stream < f.n_stream && f.v_trans <= 1);
    llst_shape sh = {f.n_cells ? f.n_layer : 1, 1, 1, 1};
    if (f.n_cells && f.n_layer) {
        sh.key_dim = dim_of(f.layers[0].k_row_bytes, f.layers[0].k_type);
        sh.value_dim = dim_of(f.layers[0].v_row_bytes, f.layers[0].v_type);
    }
    kvio_cache c;
    err[0] = 0;
    if (llst_to_cache(&f, &sh, "fuzz", &c, err, sizeof err) != LLST_OK) {
        FZ_CHECK(err[0] && !c.keys && !c.values && !c.tokens && !c.n_layers);
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
