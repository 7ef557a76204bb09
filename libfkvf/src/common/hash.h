#ifndef FKVF_COMMON_HASH_H
#define FKVF_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

/* XXH3-64 with seed (spec 2.3). */
uint64_t fkvf_xxh3_64(const void *data, size_t size, uint64_t seed);
/* fkvf_xxh3_64 of the bytes of a followed by those of b (a section written
 * from two buffers, a header and its rows, without joining them). */
uint64_t fkvf_xxh3_64_pair(const void *a, size_t na, const void *b, size_t nb, uint64_t seed);
/* XXH3-128, seed 0, canonical 16-byte form (spec 2.3). */
void fkvf_xxh3_128(const void *data, size_t size, uint8_t out[16]);

/* A 16-byte hash (a codebook's content hash) as 32 lower-case hex digits. */
void fkvf_hex16(const uint8_t h[16], char out[33]);

#endif
