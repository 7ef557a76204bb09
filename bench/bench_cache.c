/* bench_cache.h: the encoder benchmarks' clock, median, synthetic caches
 * and .npy reader. */
#define _POSIX_C_SOURCE 200809L
#include "bench_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fkvf.h"

double bench_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, dbl_cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *prog, const char *what)
{
    fprintf(stderr, "%s: %s\n", prog, what);
    exit(2);
}

size_t bench_row_elems(const bench_shape *s)
{
    return (size_t)s->layers * s->heads * 2 * s->dim;
}

size_t bench_row_off(const bench_shape *s, size_t t, unsigned l, unsigned kv, unsigned h)
{
    return t * bench_row_elems(s) + (size_t)l * s->heads * 2 * s->dim +
           (size_t)kv * s->heads * s->dim + (size_t)h * s->dim;
}

static uint64_t rng_s = 1;

void bench_seed(uint64_t s)
{
    rng_s = s;
}

double bench_urand(void)
{
    uint64_t z = (rng_s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1p-52 - 1.0;
}

double bench_nrand(void)
{
    return (bench_urand() + bench_urand() + bench_urand() + bench_urand()) * 0.8660254037844386;
}

uint16_t *bench_load_npy(const bench_shape *s, const char *path, size_t n, const char *prog)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die(prog, "cannot open the --npy file");
    unsigned char pre[10];
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6))
        die(prog, "--npy: not a .npy file");
    size_t hl = pre[8] | (size_t)pre[9] << 8, off = 10;
    if (pre[6] >= 2) {
        unsigned char b[2];
        if (fread(b, 1, 2, f) != 2)
            die(prog, "--npy: short header");
        hl |= (size_t)b[0] << 16 | (size_t)b[1] << 24;
        off = 12;
    }
    char *h = calloc(hl + 1, 1);
    if (!h || fread(h, 1, hl, f) != hl)
        die(prog, "--npy: short header");
    unsigned long dims[5];
    const char *sh = strstr(h, "'shape': (");
    if (!strstr(h, "'<f2'") || strstr(h, "'fortran_order': True") || !sh ||
        sscanf(sh, "'shape': (%lu, %lu, %lu, %lu, %lu)", &dims[0], &dims[1], &dims[2], &dims[3],
               &dims[4]) != 5)
        die(prog, "--npy: expected a C-order [L, 2, H, T, D] float16 array");
    if (dims[0] != s->layers || dims[1] != 2 || dims[2] != s->heads || dims[4] != s->dim ||
        dims[3] < n)
        die(prog, "--npy: its shape is not [layers, 2, heads, T >= positions, dim]");
    free(h);
    size_t T = dims[3], D = s->dim;
    uint16_t *rows = malloc(n * bench_row_elems(s) * 2), *buf = malloc(n * D * 2);
    if (!rows || !buf)
        die(prog, "out of memory");
    for (unsigned l = 0; l < s->layers; l++)
        for (unsigned kv = 0; kv < 2; kv++)
            for (unsigned hh = 0; hh < s->heads; hh++) {
                long pos = (long)(off + hl + ((((size_t)l * 2 + kv) * s->heads + hh) * T) * D * 2);
                if (fseek(f, pos, SEEK_SET) || fread(buf, 2, n * D, f) != n * D)
                    die(prog, "--npy: short file");
                for (size_t t = 0; t < n; t++)
                    memcpy(rows + bench_row_off(s, t, l, kv, hh), buf + t * D, D * 2);
            }
    free(buf);
    fclose(f);
    return rows;
}

uint16_t *bench_make_rows(const bench_shape *s, size_t n, const char *prog)
{
    enum { NC = 32 };
    const unsigned D = s->dim;
    uint16_t *rows = malloc(n * bench_row_elems(s) * 2);
    float *cent = malloc((size_t)NC * D * sizeof(float)), *scale = malloc(D * sizeof(float));
    if (!rows || !cent || !scale)
        die(prog, "out of memory");
    for (unsigned l = 0; l < s->layers; l++)
        for (unsigned kv = 0; kv < 2; kv++)
            for (unsigned h = 0; h < s->heads; h++) {
                bench_seed(1000003u * (l * s->heads + h) + kv);
                for (unsigned d = 0; d < D; d++)
                    scale[d] = (float)(0.5 + bench_urand() * 0.4) *
                               (kv == 0 && (d == 3 || d == D / 2 + 8) ? 6 : 1);
                for (unsigned c = 0; c < NC; c++)
                    for (unsigned d = 0; d < D; d++)
                        cent[c * D + d] = (float)bench_nrand() * scale[d];
                for (size_t t = 0; t < n; t++) {
                    unsigned c = (unsigned)((bench_urand() + 1) * NC / 2) % NC;
                    uint16_t *r = rows + bench_row_off(s, t, l, kv, h);
                    for (unsigned d = 0; d < D; d++)
                        r[d] = fkvf_f32_to_f16(cent[c * D + d] +
                                               (float)(bench_nrand() * 0.4) * scale[d]);
                }
            }
    free(cent);
    free(scale);
    return rows;
}
