/* What the encoder benchmarks share (bench_encode, bench_peak): their CPU
 * clock and median, and their synthetic KV caches: rows in the layout of spec 14.2 (per position, per layer the
 * keys of every head, then the values) of f16 elements, for a shape of
 * `layers` x `heads` x `dim` (keys and values of the same dim), made here
 * or read from a [L, 2, H, T, D] f16 .npy (bench/mkcache.py). */
#ifndef FKVF_BENCH_CACHE_H
#define FKVF_BENCH_CACHE_H

#include <stddef.h>
#include <stdint.h>

/* CPU seconds of this process (CLOCK_PROCESS_CPUTIME_ID). */
double bench_cpu_s(void);
/* The median of v[0 .. n-1] (n >= 1; sorts v). */
double bench_median(double *v, int n);

typedef struct bench_shape {
    unsigned layers, heads, dim;
} bench_shape;

/* Elements of one row. */
size_t bench_row_elems(const bench_shape *s);
/* Element offset of (position t, layer l, keys 0 / values 1, head h, dim 0)
 * in rows of shape s. */
size_t bench_row_off(const bench_shape *s, size_t t, unsigned l, unsigned kv, unsigned h);

/* The benchmarks' generator (splitmix64): bench_seed sets its state,
 * bench_urand draws from [-1, 1), bench_nrand a sum of four of them scaled
 * to unit variance. One state per process. */
void bench_seed(uint64_t s);
double bench_urand(void);
double bench_nrand(void);

/* n rows from the first n positions of a .npy of shape s; on any error a
 * line "PROG: ..." on stderr and exit status 2. malloc'd. */
uint16_t *bench_load_npy(const bench_shape *s, const char *path, size_t n, const char *prog);
/* n rows made here: per (layer, K|V, head) a mixture of 32 clusters with
 * per-dimension scales, keys with two outlier channels (3 and dim/2 + 8);
 * the generator seeded per (layer, head, K|V). Exit status 2 without
 * memory. malloc'd. */
uint16_t *bench_make_rows(const bench_shape *s, size_t n, const char *prog);

#endif
