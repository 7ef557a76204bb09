/* Codebooks in the CLI, one copy for fkvf pack, train and append --create
 * (see cli_util.h and docs/codebooks.md, "automatic k"): loading a codebook
 * file given with --codebooks, the bytes of a codebook for a cache's shape,
 * the automatic k, and the warnings about a codebook that costs more than
 * the rows it is for. Public API only. */
#define _POSIX_C_SOURCE 200809L
/* fkvf_rvq_from_tables16_encode (the CLI links libfkvf statically) */
#define FKVF_STATIC_LINKING_ONLY
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli_util.h"

/* The codebook shape of k centroids per stage for the cache (one table set
 * per head, or per layer when pooled). */
static fkvf_codebook_shape cb_shape(const kvio_cache *c, uint32_t k, uint8_t ks, uint8_t vs,
                                    const uint8_t *lst, int f32, int pooled)
{
    fkvf_codebook_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.n_layers = c->n_layers;
    sh.n_heads = pooled ? 1 : c->n_kv_heads;
    sh.key_dim = c->key_dim;
    sh.value_dim = c->value_dim;
    sh.k = k;
    sh.k_stages = ks;
    sh.v_stages = vs;
    sh.dtype = f32 ? FKVF_DTYPE_F32 : FKVF_DTYPE_F16;
    sh.pooled = (uint8_t)(pooled != 0);
    sh.layer_stages = lst;
    return sh;
}

uint64_t cli_cb_bytes(const kvio_cache *c, uint32_t k, uint8_t ks, uint8_t vs,
                      const uint8_t *lst, int f32, int pooled)
{
    fkvf_codebook_shape sh = cb_shape(c, k, ks, vs, lst, f32, pooled);
    return fkvf_codebook_size(&sh);
}

double cli_fp16_rows(const kvio_cache *c, uint64_t n)
{
    return (double)n * (double)cli_cache_row_elems(c) * 2.0;
}

uint32_t cli_auto_k(const kvio_cache *c, uint64_t n, uint8_t ks, uint8_t vs, const uint8_t *lst,
                    int f32)
{
    fkvf_codebook_shape sh = cb_shape(c, 0, ks, vs, lst, f32, 0);
    return fkvf_codebook_auto_k(&sh, c->n_kv_heads, n);
}

void cli_warn_k_min(const char *who, const kvio_cache *c, uint64_t n, const char *noun,
                    uint8_t ks, uint8_t vs, const uint8_t *lst, int f32, const char *advice)
{
    uint64_t cb = cli_cb_bytes(c, CLI_CB_K_MIN, ks, vs, lst, f32, 0);
    double fp = cli_fp16_rows(c, n);
    cli_warn("%s: %" PRIu64 " %s: even k = %u gives a codebook of %" PRIu64 " bytes, %.0f%% of "
             "the %.0f fp16 bytes of those rows (the automatic k keeps it within 1/%u); %s",
             who, n, noun, CLI_CB_K_MIN, cb, fp > 0 ? 100.0 * (double)cb / fp : 0.0, fp,
             CLI_CB_FRACTION, advice);
}

int cli_warn_codebook(const char *who, const kvio_cache *c, uint32_t k, uint64_t cb, uint64_t n,
                      uint64_t per_table, const char *noun, const char *noun_table,
                      const char *advice)
{
    double fp = cli_fp16_rows(c, n);
    int big = (double)cb > fp, few = (uint64_t)k * CLI_CB_ROWS_PER_K > per_table;
    if (!big && !few)
        return 0;
    char what[320];
    if (big)
        snprintf(what, sizeof what, "the codebook (k = %u, %" PRIu64 " bytes) is %.1fx the %.0f "
                 "fp16 bytes of the %" PRIu64 " %s%s",
                 k, cb, fp > 0 ? (double)cb / fp : 0.0, fp, n, noun,
                 few ? ", and k is more than a quarter of them" : "");
    else
        snprintf(what, sizeof what, "k = %u is more than a quarter of the %" PRIu64
                 " %s (fewer than %u per centroid: the codebook memorises them)",
                 k, per_table, noun_table, CLI_CB_ROWS_PER_K);
    cli_warn("%s: %s; %s", who, what, advice);
    return 1;
}

int cli_load_codebook_file(const char *path, const kvio_cache *c, cli_key_opts *keys,
                           fkvf_reader **r, fkvf_codebook_shape *shape, uint8_t hash[16],
                           fkvf_rvq **q, int in_place)
{
    int rc = cli_open_reader(r, path);
    if (rc != CLI_OK)
        return rc;
    fkvf_archive_info ai;
    const void *contents = NULL;
    size_t size = 0;
    if (fkvf_reader_info(*r, &ai) != FKVF_OK || ai.has_desc)
        return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, path,
                        "not a codebook file (it holds a cache descriptor: an archive? see fkvf "
                        "train)");
    rc = fkvf_reader_codebook(*r, shape, &contents, &size, hash);
    if (rc != FKVF_OK)
        return cli_fail_reader(rc == FKVF_E_NOT_FOUND ? FKVF_E_CODEBOOK : rc, *r, path,
                               "no codebook: ");
    if (shape->n_layers != c->n_layers || shape->key_dim != c->key_dim ||
        shape->value_dim != c->value_dim || (!shape->pooled && shape->n_heads != c->n_kv_heads))
        return cli_fail(CLI_INVALID, FKVF_E_CODEBOOK, path,
                        "codebook shape %u layers x %u heads, dims %u/%u does not fit the cache "
                        "(%u layers x %u heads, dims %u/%u)",
                        shape->n_layers, shape->n_heads, shape->key_dim, shape->value_dim,
                        c->n_layers, c->n_kv_heads, c->key_dim, c->value_dim);
    /* keys as the codebook was trained on them; a given option must agree */
    if ((rc = cli_keys_from_codebook(*r, path, keys, c->key_dim)) != 0)
        return rc;
    rc = FKVF_E_UNSUPPORTED;
    const size_t to = (size_t)fkvf_codebook_tables_offset(shape); /* after a layer table */
    if (q && in_place)
        rc = fkvf_rvq_from_tables16_encode(q, shape, c->n_kv_heads,
                                           (const uint8_t *)contents + to, size - to, NULL);
    if (q && rc == FKVF_E_UNSUPPORTED)
        rc = fkvf_rvq_from_tables(q, shape, c->n_kv_heads, (const uint8_t *)contents + to,
                                  size - to, NULL);
    if (q && rc != FKVF_OK)
        return cli_fail(cli_fkvf_exit(rc), rc, path, "cannot load the codebook tables: %s",
                        fkvf_strerror(rc));
    /* encode under the codebook's metric, if the file has one (spec 13.8) */
    fkvf_rvq_metric m;
    rc = q ? fkvf_reader_metric(*r, &m) : FKVF_E_NOT_FOUND;
    if (rc != FKVF_OK && rc != FKVF_E_NOT_FOUND)
        return cli_fail_reader(rc, *r, path, "its encoder metric: ");
    /* refused (not NOMEM): a property of the file, so invalid input */
    if (rc == FKVF_OK && (rc = fkvf_rvq_set_metric(*q, &m)) != FKVF_OK)
        return cli_fail(rc == FKVF_E_NOMEM ? CLI_USAGE : CLI_INVALID, rc, path,
                        "cannot use its encoder metric: %s", fkvf_strerror(rc));
    return CLI_OK;
}
