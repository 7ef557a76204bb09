/* Conformance digest (spec/fkvf-v1.md, Annex A). Archived rows
 * are approximations that readers need not reproduce bit for bit (spec 13.6,
 * 8.1), so the digest covers what every reader must decode exactly:
 *
 * archive (has DESC): XXH3-64, seed 0, of
 *     u64 n_positions                    (served commit, spec 7.3)
 *     16 bytes: the codebook's content hash (spec 13.3; for a CBRF the
 *               content_hash it names), or 16 zero bytes without a codebook
 *     for t in 0 .. n-1:
 *         exact (spec 14.3):    u8 0, then the row as stored (spec 14.2)
 *         archived:             u8 1, then u32 symbol a = t - n_sinks of every
 *                               index stream in canonical order (spec 11.2)
 *     u64 T, the number of symbols of the token stream (0 if none)
 *     T token ids, u32
 *   (integers little-endian)
 * codebook file (no DESC): XXH3-64, seed 0, of the (inflated) CBK1 contents.
 */
#include "conf_digest.h"
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* index streams in canonical order: per layer, head: key stages, value stages */
static int index_streams(fkvf_reader *r, const fkvf_desc *d, size_t **out, size_t *n)
{
    size_t cap = 0, cnt = 0, *v = NULL;
    fkvf_reader_stream_count(r, &cap);
    v = malloc((cap + 1) * sizeof *v);
    if (!v)
        return FKVF_E_NOMEM;
    for (uint32_t l = 0; l < d->n_layers; l++)
        for (uint32_t h = 0; h < d->n_kv_heads; h++)
            for (unsigned kv = 0; kv < 2; kv++)
                for (unsigned s = 0; s < 256; s++) {
                    size_t i;
                    if (fkvf_reader_stream_find(r, FKVF_STREAM_ID(0, l, h, kv, s), &i) != FKVF_OK)
                        break;
                    if (cnt == cap) {
                        free(v);
                        return FKVF_E_CORRUPT;
                    }
                    v[cnt++] = i;
                }
    *out = v;
    *n = cnt;
    return FKVF_OK;
}

int conf_digest(fkvf_reader *r, uint64_t *digest)
{
    fkvf_archive_info ai;
    int rc = fkvf_reader_info(r, &ai);
    if (rc)
        return rc;
    if (!ai.has_desc) {
        fkvf_codebook_shape cs;
        const void *c;
        size_t n;
        uint8_t h[16];
        rc = fkvf_reader_codebook(r, &cs, &c, &n, h);
        if (rc)
            return rc;
        *digest = XXH3_64bits_withSeed(c, n, 0);
        return FKVF_OK;
    }
    fkvf_desc d;
    if ((rc = fkvf_reader_desc(r, &d)))
        return rc;
    uint8_t hash[16];
    memset(hash, 0, sizeof hash);
    int ext = 0;
    const char *name;
    rc = fkvf_reader_codebook_ref(r, &ext, hash, &name);
    if (rc)
        return rc;
    if (!ext) {
        fkvf_codebook_shape cs;
        const void *c;
        size_t n;
        rc = fkvf_reader_codebook(r, &cs, &c, &n, hash);
        if (rc == FKVF_E_NOT_FOUND)
            memset(hash, 0, sizeof hash), rc = FKVF_OK;
        if (rc)
            return rc;
    }
    size_t *streams = NULL, ns = 0;
    if ((rc = index_streams(r, &d, &streams, &ns)))
        return rc;
    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        free(streams);
        return FKVF_E_NOMEM;
    }
    XXH3_64bits_reset_withSeed(st, 0);
    unsigned char w[8];
    put_u64(w, ai.n_positions);
    XXH3_64bits_update(st, w, 8);
    XXH3_64bits_update(st, hash, 16);
    for (uint64_t t = 0; !rc && t < ai.n_positions; t++) {
        int is_exact = 0;
        rc = fkvf_reader_is_exact(r, t, &is_exact);
        if (rc)
            break;
        unsigned char kind = is_exact ? 0 : 1;
        XXH3_64bits_update(st, &kind, 1);
        if (is_exact) {
            const void *row;
            size_t n;
            rc = fkvf_reader_exact_row(r, t, &row, &n);
            if (!rc)
                XXH3_64bits_update(st, row, n);
        } else {
            for (size_t j = 0; !rc && j < ns; j++) {
                uint32_t s;
                rc = fkvf_reader_stream_get(r, streams[j], t - d.n_sinks, &s);
                put_u32(w, s);
                if (!rc)
                    XXH3_64bits_update(st, w, 4);
            }
        }
    }
    free(streams);
    size_t si;
    uint64_t ntok = 0;
    int has_tok = !rc && fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &si) == FKVF_OK;
    if (has_tok) {
        fkvf_stream_info info;
        rc = fkvf_reader_stream_info(r, si, &info);
        if (!rc)
            ntok = info.length;
    }
    if (!rc) {
        put_u64(w, ntok);
        XXH3_64bits_update(st, w, 8);
    }
    for (uint64_t t = 0; !rc && t < ntok; t++) {
        uint32_t s;
        rc = fkvf_reader_stream_get(r, si, t, &s);
        put_u32(w, s);
        if (!rc)
            XXH3_64bits_update(st, w, 4);
    }
    if (!rc)
        *digest = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return rc;
}

int conf_decode_all(fkvf_reader *r)
{
    fkvf_archive_info ai;
    int rc = fkvf_reader_info(r, &ai);
    if (rc || !ai.has_desc)
        return rc;
    size_t row = 0;
    if ((rc = fkvf_reader_row_bytes(r, FKVF_DTYPE_F32, &row)))
        return rc;
    void *buf = malloc(row ? row : 1);
    if (!buf)
        return FKVF_E_NOMEM;
    for (uint64_t t = 0; !rc && t < ai.n_positions; t++)
        rc = fkvf_reader_restore(r, t, 1, FKVF_DTYPE_F32, buf, row);
    free(buf);
    uint64_t d;
    return rc ? rc : conf_digest(r, &d); /* and every symbol and token */
}
