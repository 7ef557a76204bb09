/* unpack_check: is CACHE (what fkvf unpack wrote) the archive's restore?
 * Reads CACHE with the cache reader (kvio_read; NHD: positions-first
 * tensors) and compares every layer's keys and values, head by head and
 * position by position, with the rows of fkvf_reader_restore in the
 * cache's dtype (the reference: the library, not the CLI), and the token
 * ids, when CACHE has them, with the archive's token stream. Also checks
 * the shape against the archive's descriptor.
 *
 * usage: unpack_check ARCHIVE CACHE hnd|nhd
 * Exit 0 equal (one line "ok ..."), 1 different (the first difference
 * named), 2 usage or a file that cannot be read. Public API and cacheio. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cacheio.h"
#include "fkvf.h"

int main(int argc, char **argv)
{
    if (argc != 4 || (strcmp(argv[3], "hnd") && strcmp(argv[3], "nhd"))) {
        fprintf(stderr, "usage: unpack_check ARCHIVE CACHE hnd|nhd\n");
        return 2;
    }
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, argv[1], 0, NULL);
    if (rc != FKVF_OK) {
        fprintf(stderr, "%s: %s\n", argv[1], fkvf_reader_message(r));
        fkvf_reader_free(r);
        return 2;
    }
    kvio_cache c;
    char err[512];
    if ((rc = kvio_read(argv[2], KVIO_FMT_AUTO, strcmp(argv[3], "nhd") ? 0 : KVIO_READ_NHD, &c, err,
                        sizeof err)) != KVIO_OK) {
        fprintf(stderr, "%s\n", err);
        fkvf_reader_free(r);
        return 2;
    }
    fkvf_archive_info ai;
    fkvf_desc d;
    int bad = 0;
    if (fkvf_reader_info(r, &ai) != FKVF_OK || fkvf_reader_desc(r, &d) != FKVF_OK) {
        fprintf(stderr, "%s: %s\n", argv[1], fkvf_reader_message(r));
        bad = 2;
    } else if (c.n_layers != d.n_layers || c.n_kv_heads != d.n_kv_heads || c.key_dim != d.key_dim ||
               c.value_dim != d.value_dim || c.n_positions != ai.n_positions) {
        fprintf(stderr, "%s: shape %u x %u x %u (%u/%u) is not the archive's %u x %u x %" PRIu64 " (%u/%u)\n",
                argv[2], c.n_layers, c.n_kv_heads, c.n_positions, c.key_dim, c.value_dim, d.n_layers,
                d.n_kv_heads, ai.n_positions, d.key_dim, d.value_dim);
        bad = 1;
    }
    size_t es = kvio_dtype_size(c.dtype), kb = (size_t)c.key_dim * es, vb = (size_t)c.value_dim * es;
    size_t rb = 0;
    const uint32_t chunk = 256;
    uint8_t *rows = NULL;
    if (!bad && (fkvf_reader_row_bytes(r, c.dtype, &rb) != FKVF_OK || !(rows = malloc(chunk * rb)))) {
        fprintf(stderr, "%s: cannot restore\n", argv[1]);
        bad = 2;
    }
    uint32_t T = c.n_positions;
    for (uint32_t p = 0; !bad && p < T; p += chunk) {
        uint32_t n = T - p < chunk ? T - p : chunk;
        if (fkvf_reader_restore(r, p, n, c.dtype, rows, chunk * rb) != FKVF_OK) {
            fprintf(stderr, "%s: restore: %s\n", argv[1], fkvf_reader_message(r));
            bad = 2;
            break;
        }
        for (uint32_t i = 0; i < n && !bad; i++) {
            const uint8_t *s = rows + (size_t)i * rb;
            for (uint32_t l = 0; l < c.n_layers && !bad; l++)
                for (int kv = 0; kv < 2 && !bad; kv++) {
                    size_t eb = kv ? vb : kb;
                    for (uint32_t h = 0; h < c.n_kv_heads; h++, s += eb) {
                        const uint8_t *t = (kv ? c.values[l] : c.keys[l]) + ((size_t)h * T + p + i) * eb;
                        if (memcmp(s, t, eb)) {
                            fprintf(stderr, "%s: layer %u %s head %u position %u differs from the restore\n",
                                    argv[2], l, kv ? "values" : "keys", h, p + i);
                            bad = 1;
                            break;
                        }
                    }
                }
        }
    }
    size_t tidx;
    int has_tok = fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &tidx) == FKVF_OK;
    if (!bad && c.tokens) {
        uint32_t *tok = malloc((size_t)(T ? T : 1) * sizeof *tok);
        if (!has_tok || !tok || fkvf_reader_stream_read(r, tidx, 0, tok, T) != FKVF_OK) {
            fprintf(stderr, "%s: token ids in the cache, none readable in the archive\n", argv[2]);
            bad = 1;
        }
        for (uint32_t t = 0; !bad && t < T; t++)
            if (c.tokens[t] != (int64_t)tok[t]) {
                fprintf(stderr, "%s: token id at position %u: %" PRId64 ", the archive's %u\n", argv[2], t,
                        c.tokens[t], tok[t]);
                bad = 1;
            }
        free(tok);
    }
    if (!bad)
        printf("ok %u positions, %s, %s\n", T, kvio_dtype_name(c.dtype), c.tokens ? "token ids" : "no token ids");
    free(rows);
    kvio_cache_free(&c);
    fkvf_reader_free(r);
    return bad;
}
