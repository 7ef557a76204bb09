#include "hash.h"

#include <xxhash.h>

uint64_t fkvf_xxh3_64(const void *data, size_t size, uint64_t seed)
{
    return (uint64_t)XXH3_64bits_withSeed(data, size, (XXH64_hash_t)seed);
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
