/* Conformance digest (see conformance/README.md, "Digest"):
 *
 * archive (has DESC):  XXH3-64, seed 0, of
 *     u64 n_positions
 *     for t in 0 .. n-1: the restored row of position t (spec 14.2 layout,
 *         spec 14.4 / 13.6 values) as f32, little-endian
 *     u64 T, the number of symbols of the token stream (0 if none)
 *     T token ids, u32 little-endian
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
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return FKVF_E_NOMEM;
    XXH3_64bits_reset_withSeed(st, 0);
    unsigned char w[8];
    put_u64(w, ai.n_positions);
    XXH3_64bits_update(st, w, 8);
    size_t row = 0;
    rc = fkvf_reader_row_bytes(r, FKVF_DTYPE_F32, &row);
    unsigned char *buf = rc ? NULL : malloc(row ? row : 1);
    if (!rc && !buf)
        rc = FKVF_E_NOMEM;
    for (uint64_t t = 0; !rc && t < ai.n_positions; t++) {
        rc = fkvf_reader_restore(r, t, 1, FKVF_DTYPE_F32, buf, row);
        if (!rc) {
            /* f32 little-endian: byte-swap on a big-endian host */
            for (size_t i = 0; i + 4 <= row; i += 4) {
                uint32_t v;
                memcpy(&v, buf + i, 4);
                buf[i] = (unsigned char)v;
                buf[i + 1] = (unsigned char)(v >> 8);
                buf[i + 2] = (unsigned char)(v >> 16);
                buf[i + 3] = (unsigned char)(v >> 24);
            }
            XXH3_64bits_update(st, buf, row);
        }
    }
    free(buf);
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
        unsigned char b[4] = {(unsigned char)s, (unsigned char)(s >> 8), (unsigned char)(s >> 16),
                              (unsigned char)(s >> 24)};
        if (!rc)
            XXH3_64bits_update(st, b, 4);
    }
    if (!rc)
        *digest = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return rc;
}
