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

typedef struct kvc_opts {
    const char *in, *out;
    fkvf_dtype dt;
    unsigned long keep; /* --positions (0: all) */
    int force;
} kvc_opts;

/* Returns -1 to go on, else the exit status (help printed, usage error). */
static int kvc_parse(int argc, char **argv, kvc_opts *o)
{
    memset(o, 0, sizeof *o);
    o->dt = FKVF_DTYPE_F16;
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
            o->force = 1;
        } else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(v, "f32"))
                o->dt = FKVF_DTYPE_F32;
            else if (!strcmp(v, "bf16"))
                o->dt = FKVF_DTYPE_BF16;
            else if (!strcmp(v, "f16"))
                o->dt = FKVF_DTYPE_F16;
            else
                return cli_usage("--dtype: '%s' is not f16, bf16 or f32", v);
        } else if (!strcmp(argv[i], "--positions") && i + 1 < argc) {
            const char *v = argv[++i];
            uint64_t x;
            if (cli_parse_u64(v, ULONG_MAX, &x) || x == 0)
                return cli_usage("--positions: '%s' is not a count >= 1", v);
            o->keep = (unsigned long)x;
        } else if (!o->in) {
            o->in = argv[i];
        } else if (!o->out) {
            o->out = argv[i];
        } else {
            return cli_usage("unexpected argument '%s'", argv[i]);
        }
    }
    if (!o->in || !o->out)
        return cli_usage("usage: kvc2cache IN.kvc OUT [--dtype f16|bf16|f32] [--positions N] "
                         "[--force]");
    return -1;
}

/* A kvgen file's geometry: header size, layers, KV heads, head dim,
 * positions. */
typedef struct kvc_file {
    uint8_t *buf;
    long sz;
    uint32_t hs, L, G, D, P;
} kvc_file;

/* The whole file read into f->buf and its header checked against its
 * size. Returns the exit status (f->buf to free either way). */
static int kvc_load(const char *in, kvc_file *f)
{
    FILE *fp = fopen(in, "rb");
    if (!fp)
        return cli_fail(2, FKVF_E_IO, in, "cannot open: %s", strerror(errno));
    fseek(fp, 0, SEEK_END);
    long sz = f->sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f->buf = sz > 0 ? malloc((size_t)sz) : NULL;
    uint8_t *buf = f->buf;
    if (!buf || fread(buf, 1, (size_t)sz, fp) != (size_t)sz) {
        fclose(fp);
        if (sz <= 0)
            return cli_fail(1, FKVF_E_TRUNCATED, in, "empty: not a kvgen version 1 f32 file");
        return cli_fail(2, FKVF_E_IO, in, "cannot read");
    }
    fclose(fp);
    if (sz < 64 || memcmp(buf, "KVGENRAW", 8) || rd32(buf + 8) != 1 || rd32(buf + 32) != 1)
        return cli_fail(1, FKVF_E_BAD_MAGIC, in, "not a kvgen version 1 f32 file");
    f->hs = rd32(buf + 12), f->L = rd32(buf + 16), f->G = rd32(buf + 20), f->D = rd32(buf + 24),
    f->P = rd32(buf + 28);
    /* header + P+1 token ids + P more u32 + L x {K, K_pre, V} x G x P x D f32,
     * overflow-checked: a wrapped product must not match a small file */
    uint64_t need = 0, arrs = 12;
    int ovf = f->hs < 64 || f->L == 0 || f->G == 0 || f->D == 0 || f->P == 0 ||
              __builtin_mul_overflow(arrs, (uint64_t)f->L, &arrs) ||
              __builtin_mul_overflow(arrs, (uint64_t)f->G, &arrs) ||
              __builtin_mul_overflow(arrs, (uint64_t)f->P, &arrs) ||
              __builtin_mul_overflow(arrs, (uint64_t)f->D, &arrs) ||
              __builtin_add_overflow((uint64_t)f->hs + 8ull * f->P + 4, arrs, &need);
    if (ovf || need != (uint64_t)sz)
        return cli_fail(1, FKVF_E_CORRUPT, in, "header sizes do not match the file size");
    return 0;
}

/* The first PO positions of the file into c (keys as cached, values,
 * tokens) with the metadata of where they came from. */
static void kvc_fill(const kvc_file *f, uint32_t PO, fkvf_dtype dt, kvio_cache *c)
{
    uint32_t L = f->L, G = f->G, D = f->D, P = f->P;
    const uint8_t *buf = f->buf;
    const uint8_t *tok = buf + f->hs;
    for (uint32_t p = 0; p < PO; p++)
        c->tokens[p] = rd32(tok + 4ull * p);
    const uint8_t *arr = buf + f->hs + 8ull * P + 4;
    size_t es = kvio_dtype_size(dt);
    size_t tensor = 4ull * G * P * D;
    for (uint32_t l = 0; l < L; l++) {
        const uint8_t *k = arr + (size_t)l * 3 * tensor; /* K (after RoPE), K_pre, V */
        const uint8_t *v = k + 2 * tensor;
        for (uint32_t g = 0; g < G; g++) {
            size_t so = (size_t)g * P * D * 4, dof = (size_t)g * PO * D * es;
            fkvf_convert(dt, c->keys[l] + dof, FKVF_DTYPE_F32, k + so, (size_t)PO * D);
            fkvf_convert(dt, c->values[l] + dof, FKVF_DTYPE_F32, v + so, (size_t)PO * D);
        }
    }
    char theta[32];
    float th;
    memcpy(&th, buf + 40, 4);
    snprintf(theta, sizeof theta, "%g", (double)th);
    kvio_cache_set_meta(c, "source", "kvgen (examples/engine), stories260K");
    kvio_cache_set_meta(c, "keys", "after RoPE (as cached)");
    kvio_cache_set_meta(c, "rope_theta", theta);
    kvio_cache_set_meta(c, "rope_layout", "interleaved");
}

static int run(int argc, char **argv)
{
    kvc_opts o;
    int ex = kvc_parse(argc, argv, &o);
    if (ex >= 0)
        return ex;
    if ((ex = cli_check_output(o.out, &o.in, 1, o.force)))
        return ex;
    kvc_file f;
    memset(&f, 0, sizeof f);
    if ((ex = kvc_load(o.in, &f))) {
        free(f.buf);
        return ex;
    }
    uint32_t PO = o.keep && o.keep < f.P ? (uint32_t)o.keep : f.P;
    kvio_cache c;
    char err[512];
    int rc = kvio_cache_init(&c, f.L, f.G, PO, f.D, f.D, o.dt, 1, err, sizeof err);
    if (rc != KVIO_OK) {
        free(f.buf);
        return cli_fail_kvio(rc, o.in, err);
    }
    kvc_fill(&f, PO, o.dt, &c);
    free(f.buf);
    rc = kvio_write(o.out, KVIO_FMT_AUTO, o.force ? 0 : KVIO_WRITE_NO_REPLACE, &c, err, sizeof err);
    kvio_cache_free(&c);
    if (rc != KVIO_OK)
        return cli_fail_kvio(rc, o.out, err);
    printf("%s: %u layers x %u heads x %u positions x %u dims, %s\n", o.out, f.L, f.G, PO, f.D,
           kvio_dtype_name(o.dt));
    return 0;
}
