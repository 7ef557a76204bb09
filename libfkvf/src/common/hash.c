#include "hash.h"

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no allocation */
#include <xxhash.h>

uint64_t fkvf_xxh3_64(const void *data, size_t size, uint64_t seed)
{
    return (uint64_t)XXH3_64bits_withSeed(data, size, (XXH64_hash_t)seed);
}

uint64_t fkvf_xxh3_64_pair(const void *a, size_t na, const void *b, size_t nb, uint64_t seed)
{
    if (!nb)
        return fkvf_xxh3_64(a, na, seed);
    XXH3_state_t st;
    XXH3_INITSTATE(&st); /* a state on the stack: reset reads a field of it */
    (void)XXH3_64bits_reset_withSeed(&st, (XXH64_hash_t)seed);
    if (na)
        (void)XXH3_64bits_update(&st, a, na);
    if (nb)
        (void)XXH3_64bits_update(&st, b, nb);
    return (uint64_t)XXH3_64bits_digest(&st);
}

void fkvf_xxh3_128(const void *data, size_t size, uint8_t out[16])
{
    XXH128_hash_t h = XXH3_128bits_withSeed(data, size, 0);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    for (int i = 0; i < 16; i++)
        out[i] = c.digest[i];
}

void fkvf_hex16(const uint8_t h[16], char out[33])
{
    static const char x[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = x[h[i] >> 4];
        out[2 * i + 1] = x[h[i] & 15];
    }
    out[32] = 0;
}
