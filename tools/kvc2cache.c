/* kvc2cache: convert one kvgen output file (examples/engine/kvgen.c, format
 * "KVGENRAW" version 1: f32 arrays) into a raw cache file (.safetensors,
 * .npy or .npz by extension; docs/cache-files.md): layers.{i}.key = the keys
 * as cached (after RoPE), layers.{i}.value, tokens = the P tokens run at
 * positions 0..P-1. Used to make testdata/sample-cache.safetensors.
 *
 * usage: kvc2cache IN.kvc OUT [--dtype f16|bf16|f32] [--positions N]
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cacheio.h"
#include "cli_util.h"
#include "fkvf.h"

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int main(int argc, char **argv)
{
    const char *in = NULL, *out = NULL;
    fkvf_dtype dt = FKVF_DTYPE_F16;
    unsigned long keep = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kvc2cache IN.kvc OUT.safetensors|.npz|.npy [--dtype f16|bf16|f32] "
                   "[--positions N]\n");
            return 0;
        } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(v, "f32"))
                dt = FKVF_DTYPE_F32;
            else if (!strcmp(v, "bf16"))
                dt = FKVF_DTYPE_BF16;
            else if (!strcmp(v, "f16"))
                dt = FKVF_DTYPE_F16;
            else {
                fprintf(stderr, "kvc2cache: --dtype: '%s' is not f16, bf16 or f32\n", v);
                return 2;
            }
        } else if (!strcmp(argv[i], "--positions") && i + 1 < argc) {
            const char *v = argv[++i];
            uint64_t x;
            if (cli_parse_u64(v, ULONG_MAX, &x) || x == 0) {
                fprintf(stderr, "kvc2cache: --positions: '%s' is not a count >= 1\n", v);
                return 2;
            }
            keep = (unsigned long)x;
        } else if (!in) {
            in = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            fprintf(stderr, "kvc2cache: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!in || !out) {
        fprintf(stderr, "usage: kvc2cache IN.kvc OUT [--dtype f16|bf16|f32] [--positions N]\n");
        return 2;
    }
    FILE *f = fopen(in, "rb");
    if (!f) {
        perror(in);
        return 2;
    }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = sz > 0 ? malloc((size_t)sz) : NULL;
    if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        fprintf(stderr, "kvc2cache: %s: cannot read\n", in);
        fclose(f);
        free(buf);
        return 2;
    }
    fclose(f);
    if (sz < 64 || memcmp(buf, "KVGENRAW", 8) || rd32(buf + 8) != 1 || rd32(buf + 32) != 1) {
        fprintf(stderr, "kvc2cache: %s: not a kvgen version 1 f32 file\n", in);
        free(buf);
        return 1;
    }
    uint32_t hs = rd32(buf + 12), L = rd32(buf + 16), G = rd32(buf + 20), D = rd32(buf + 24),
             P = rd32(buf + 28);
    /* header + P+1 token ids + P more u32 + L x {K, K_pre, V} x G x P x D f32,
     * overflow-checked: a wrapped product must not match a small file */
    uint64_t need = 0, arrs = 12;
    int ovf = hs < 64 || L == 0 || G == 0 || D == 0 || P == 0 ||
              __builtin_mul_overflow(arrs, (uint64_t)L, &arrs) ||
              __builtin_mul_overflow(arrs, (uint64_t)G, &arrs) ||
              __builtin_mul_overflow(arrs, (uint64_t)P, &arrs) ||
              __builtin_mul_overflow(arrs, (uint64_t)D, &arrs) ||
              __builtin_add_overflow((uint64_t)hs + 8ull * P + 4, arrs, &need);
    if (ovf || need != (uint64_t)sz) {
        fprintf(stderr, "kvc2cache: %s: header sizes do not match the file size\n", in);
        free(buf);
        return 1;
    }
    uint32_t PO = keep && keep < P ? (uint32_t)keep : P;
    kvio_cache c;
    char err[512];
    if (kvio_cache_init(&c, L, G, PO, D, D, dt, 1, err, sizeof err) != KVIO_OK) {
        fprintf(stderr, "kvc2cache: %s\n", err);
        free(buf);
        return 1;
    }
    const uint8_t *tok = buf + hs;
    for (uint32_t p = 0; p < PO; p++)
        c.tokens[p] = rd32(tok + 4ull * p);
    const uint8_t *arr = buf + hs + 8ull * P + 4;
    size_t es = kvio_dtype_size(dt);
    size_t tensor = 4ull * G * P * D;
    for (uint32_t l = 0; l < L; l++) {
        const uint8_t *k = arr + (size_t)l * 3 * tensor; /* K (after RoPE), K_pre, V */
        const uint8_t *v = k + 2 * tensor;
        for (uint32_t g = 0; g < G; g++) {
            size_t so = (size_t)g * P * D * 4, dof = (size_t)g * PO * D * es;
            fkvf_convert(dt, c.keys[l] + dof, FKVF_DTYPE_F32, k + so, (size_t)PO * D);
            fkvf_convert(dt, c.values[l] + dof, FKVF_DTYPE_F32, v + so, (size_t)PO * D);
        }
    }
    char theta[32];
    float th;
    memcpy(&th, buf + 40, 4);
    snprintf(theta, sizeof theta, "%g", (double)th);
    kvio_cache_set_meta(&c, "source", "kvgen (examples/engine), stories260K");
    kvio_cache_set_meta(&c, "keys", "after RoPE (as cached)");
    kvio_cache_set_meta(&c, "rope_theta", theta);
    kvio_cache_set_meta(&c, "rope_layout", "interleaved");
    free(buf);
    int rc = kvio_write(out, KVIO_FMT_AUTO, 0, &c, err, sizeof err);
    kvio_cache_free(&c);
    if (rc != KVIO_OK) {
        fprintf(stderr, "kvc2cache: %s\n", err);
        return 2;
    }
    printf("%s: %u layers x %u heads x %u positions x %u dims, %s\n", out, L, G, PO, D,
           kvio_dtype_name(dt));
    return 0;
}
