/* kvc2cache: convert one kvgen output file (examples/engine/kvgen.c, format
 * "KVGENRAW" version 1: f32 arrays) into a raw cache file (.safetensors,
 * .npy or .npz by extension; docs/cache-files.md): layers.{i}.key = the keys
 * as cached (after RoPE), layers.{i}.value, tokens = the P tokens run at
 * positions 0..P-1. Used to make testdata/sample-cache.safetensors.
 *
 * usage: kvc2cache IN.kvc OUT [--dtype f16|bf16|f32] [--positions N] [--force]
 * OUT is never IN and, without --force, never an existing file. Exit status
 * 0 ok, 1 invalid input (not a kvgen file; OUT exists or is IN), 2 usage or
 * I/O error.
 */
#include <errno.h>
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

static int run(int argc, char **argv);

int main(int argc, char **argv)
{
    cli_set_command("kvc2cache", NULL, 0);
    return cli_finish(run(argc, argv));
}

static int run(int argc, char **argv)
{
    const char *in = NULL, *out = NULL;
    fkvf_dtype dt = FKVF_DTYPE_F16;
    unsigned long keep = 0;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kvc2cache IN.kvc OUT.safetensors|.npz|.npy [--dtype f16|bf16|f32] "
                   "[--positions N] [--force]\n"
                   "\n"
                   "--force replaces OUT if it exists (default: refused); OUT is never IN.\n"
                   "Exit status: 0 ok, 1 invalid input (not a kvgen file; OUT exists or is\n"
                   "IN), 2 usage or I/O error.\n");
            return 0;
        } else if (!strcmp(argv[i], "--force")) {
            force = 1;
        } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(v, "f32"))
                dt = FKVF_DTYPE_F32;
            else if (!strcmp(v, "bf16"))
                dt = FKVF_DTYPE_BF16;
            else if (!strcmp(v, "f16"))
                dt = FKVF_DTYPE_F16;
            else
                return cli_usage("--dtype: '%s' is not f16, bf16 or f32", v);
        } else if (!strcmp(argv[i], "--positions") && i + 1 < argc) {
            const char *v = argv[++i];
            uint64_t x;
            if (cli_parse_u64(v, ULONG_MAX, &x) || x == 0)
                return cli_usage("--positions: '%s' is not a count >= 1", v);
            keep = (unsigned long)x;
        } else if (!in) {
            in = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            return cli_usage("unexpected argument '%s'", argv[i]);
        }
    }
    if (!in || !out)
        return cli_usage("usage: kvc2cache IN.kvc OUT [--dtype f16|bf16|f32] [--positions N] "
                         "[--force]");
    int ex = cli_check_output(out, &in, 1, force);
    if (ex)
        return ex;
    FILE *f = fopen(in, "rb");
    if (!f)
        return cli_fail(2, FKVF_E_IO, in, "cannot open: %s", strerror(errno));
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = sz > 0 ? malloc((size_t)sz) : NULL;
    if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        fclose(f);
        free(buf);
        if (sz <= 0)
            return cli_fail(1, FKVF_E_TRUNCATED, in, "empty: not a kvgen version 1 f32 file");
        return cli_fail(2, FKVF_E_IO, in, "cannot read");
    }
    fclose(f);
    if (sz < 64 || memcmp(buf, "KVGENRAW", 8) || rd32(buf + 8) != 1 || rd32(buf + 32) != 1) {
        free(buf);
        return cli_fail(1, FKVF_E_BAD_MAGIC, in, "not a kvgen version 1 f32 file");
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
        free(buf);
        return cli_fail(1, FKVF_E_CORRUPT, in, "header sizes do not match the file size");
    }
    uint32_t PO = keep && keep < P ? (uint32_t)keep : P;
    kvio_cache c;
    char err[512];
    int rc = kvio_cache_init(&c, L, G, PO, D, D, dt, 1, err, sizeof err);
    if (rc != KVIO_OK) {
        free(buf);
        return cli_fail_kvio(rc, in, err);
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
    rc = kvio_write(out, KVIO_FMT_AUTO, force ? 0 : KVIO_WRITE_NO_REPLACE, &c, err, sizeof err);
    kvio_cache_free(&c);
    if (rc != KVIO_OK)
        return cli_fail_kvio(rc, out, err);
    printf("%s: %u layers x %u heads x %u positions x %u dims, %s\n", out, L, G, PO, D,
           kvio_dtype_name(dt));
    return 0;
}
