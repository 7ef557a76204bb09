/* The conformance digest of an opened archive (spec/fkvf-v1.md,
 * Annex A). Shared by the generator and the reference runner helper. */
#ifndef CONF_DIGEST_H
#define CONF_DIGEST_H
#include <stdint.h>
#include "fkvf.h"

/* Computes the digest of an open reader: only bit-exact content (stored
 * rows, index symbols, token ids, the codebook's content hash), so that any
 * compliant reader computes the same value. Returns FKVF_OK or the first
 * error. */
int conf_digest(fkvf_reader *r, uint64_t *digest);
/* Decodes everything: restores every position in f32 (spec 14.4, archived
 * ones by spec 13.6, which needs the codebook) and reads every token id.
 * Returns FKVF_OK or the first error. */
int conf_decode_all(fkvf_reader *r);
#endif
