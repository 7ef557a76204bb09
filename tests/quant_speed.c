/* quant_speed: throughput of the quantizer on a GPT-2-small-shaped cache
 * (12 layers x 12 heads x 64 dims, K x4 V x2, k = 256 by default). Not a
 * test: it prints numbers. Public API only.
 *
 *   quant_speed [positions [train_positions [beam_width]]]
 *
 * Synthetic rows: per (layer, head, K|V) a mixture of 32 Gaussian clusters,
 * keys with two outlier channels, rotated by RoPE for the pre-RoPE run.
 * Reports training time, encode positions/s (greedy and beam), decode GB/s
 * of f16 / bf16 / f32 output, and memcpy of the same bytes, each as wall
 * time and as CPU time of this process (the best of several runs). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fkvf.h"

enum { L = 12, H = 12, D = 64 };

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t rng_s = 1;
static double urand(void)
{
    uint64_t z = (rng_s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1p-52 - 1.0;
}
static double nrand(void) { return (urand() + urand() + urand() + urand()) * 0.8660254037844386; }

/* n rows of f16 in the layout of spec 14.2 */
static uint16_t *make_rows(size_t n, uint64_t seed, const fkvf_rope *rope)
{
    enum { NC = 32 };
    size_t re = (size_t)L * H * 2 * D;
    uint16_t *rows = malloc(n * re * 2);
    static float cent[NC][D];
    float v[D];
    if (!rows)
        return NULL;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++)
            for (int kv = 0; kv < 2; kv++) {
                rng_s = 1000003u * (uint64_t)(l * H + h) + (uint64_t)kv;
                for (int c = 0; c < NC; c++)
                    for (int d = 0; d < D; d++)
                        cent[c][d] = (float)nrand();
                rng_s = seed * 7919u + (uint64_t)(l * H + h) * 2 + (uint64_t)kv;
                for (size_t i = 0; i < n; i++) {
                    int c = (int)((urand() + 1) * NC / 2) % NC;
                    for (int d = 0; d < D; d++)
                        v[d] = cent[c][d] + (float)(nrand() * 0.4);
                    if (!kv) {
                        v[3] *= 8; /* outlier channels */
                        v[40] *= 5;
                        if (rope)
                            fkvf_rope_apply_f32(rope, i, 0, v, D);
                    }
                    size_t off = i * re + (size_t)l * H * 2 * D +
                                 (kv ? (size_t)H * D + (size_t)h * D : (size_t)h * D);
                    for (int d = 0; d < D; d++)
                        rows[off + d] = fkvf_f32_to_f16(v[d]);
                }
            }
    return rows;
}

static void run(size_t n, size_t ntrain, unsigned beam, const fkvf_rope *rope)
{
    size_t re = (size_t)L * H * 2 * D, bytes16 = n * re * 2;
    uint16_t *tr = make_rows(ntrain, 1, rope), *x = make_rows(n, 2, rope);
    if (!tr || !x) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = L;
    p.n_kv_heads = H;
    p.key_dim = D;
    p.value_dim = D;
    p.max_iters = 10;
    p.key_rope = rope;
    fkvf_rows tb = {tr, ntrain, FKVF_DTYPE_F16, 0}, xb = {x, n, FKVF_DTYPE_F16, 0};
    fkvf_rvq *q;
    double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    int rc = fkvf_rvq_train(&q, &p, &tb, 1, NULL);
    if (rc) {
        fprintf(stderr, "train: %s\n", fkvf_error_name(rc));
        exit(1);
    }
    printf("keys %s: train on %zu positions (k=256, K x4 V x2, max_iters 10): %.1f s wall, "
           "%.1f s cpu\n",
           rope ? "pre-rope" : "as-is", ntrain, clock_s(CLOCK_MONOTONIC) - w0,
           clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0);
    size_t nc = fkvf_rvq_codes_per_position(q);
    uint16_t *codes = malloc(n * nc * 2);
    void *out = malloc(n * re * 4), *src = malloc(n * re * 4);
    if (!codes || !out || !src) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    memset(src, 1, n * re * 4);
    unsigned widths[2] = {1, beam};
    for (int b = 0; b < (beam > 1 ? 2 : 1); b++) {
        double bw = 1e30, bc = 1e30;
        for (int r = 0; r < 3; r++) {
            w0 = clock_s(CLOCK_MONOTONIC);
            c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
            rc = fkvf_rvq_encode(q, &xb, rope, widths[b], codes, nc, 1);
            bw = fmin(bw, clock_s(CLOCK_MONOTONIC) - w0);
            bc = fmin(bc, clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0);
        }
        printf("  encode %s (%zu positions, %zu codes each): %.0f positions/s wall, %.0f cpu%s\n",
               widths[b] > 1 ? "beam" : "greedy", n, nc, (double)n / bw, (double)n / bc,
               rc ? " FAILED" : "");
        if (widths[b] > 1)
            printf("    (beam width %u)\n", widths[b]);
    }
    rc = fkvf_rvq_encode(q, &xb, rope, 1, codes, nc, 1);
    const fkvf_dtype dts[3] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16, FKVF_DTYPE_F32};
    const char *names[3] = {"f16", "bf16", "f32"};
    for (int d = 0; d < 3; d++) {
        size_t ob = n * re * (dts[d] == FKVF_DTYPE_F32 ? 4 : 2);
        double bw = 1e30, bc = 1e30, mw = 1e30;
        for (int r = 0; r < 5; r++) {
            w0 = clock_s(CLOCK_MONOTONIC);
            c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
            rc |= fkvf_rvq_decode(q, codes, nc, 1, n, 0, rope, dts[d], out, ob);
            bw = fmin(bw, clock_s(CLOCK_MONOTONIC) - w0);
            bc = fmin(bc, clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0);
            w0 = clock_s(CLOCK_MONOTONIC);
            memcpy(out, src, ob);
            mw = fmin(mw, clock_s(CLOCK_MONOTONIC) - w0);
        }
        printf("  decode -> %-4s: %.2f GB/s wall, %.2f GB/s cpu (memcpy of the same bytes "
               "%.2f GB/s, %.1fx)%s\n",
               names[d], (double)ob / bw * 1e-9, (double)ob / bc * 1e-9, (double)ob / mw * 1e-9,
               bw / mw, rc ? " FAILED" : "");
    }
    printf("  (%zu positions = %.1f MB of f16 rows)\n", n, (double)bytes16 * 1e-6);
    fkvf_rvq_free(q);
    free(codes);
    free(out);
    free(src);
    free(tr);
    free(x);
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 1024;
    size_t ntrain = argc > 2 ? (size_t)strtoul(argv[2], NULL, 10) : 1024;
    unsigned beam = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : 4;
    fkvf_rope rope = {2, D, 10000.0};
    if (!n || !ntrain) {
        fprintf(stderr, "usage: quant_speed [positions [train_positions [beam_width]]]\n");
        return 2;
    }
    run(n, ntrain, beam, NULL);
    run(n, ntrain, beam, &rope);
    return 0;
}
