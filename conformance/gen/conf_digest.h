/* The conformance digest of an opened archive (conformance/README.md,
 * "Digest"). Shared by the generator and the reference runner helper. */
#ifndef CONF_DIGEST_H
#define CONF_DIGEST_H
#include <stdint.h>
#include "fkvf.h"

/* Computes the digest of an open reader. Returns FKVF_OK and sets *digest,
 * or the first error (a format class when the content does not decode). */
int conf_digest(fkvf_reader *r, uint64_t *digest);
#endif
