/* The encoder's FLOP rate against the core's measured FMA peak (issue 37),
 * at any cache shape (default Llama-3-8B: 32 layers x 8 KV heads x 128
 * dims, f16, k = 256, keys x4 and values x2 stages, greedy search).
 *
 *   bench_peak [--layers L] [--heads H] [--dim D] [--k K] [--ks S] [--vs S]
 *              [--positions N] [--pairs P] [--train T] [--npy FILE]
 *              [--codebooks FILE] [--rope] [--only peak|encode|search]
 *       --positions N  positions encoded per timed run (1024)
 *       --pairs P      rounds, >= 1 (5)
 *       --train T      codebook from fkvf_rvq_train (1 Lloyd iteration per
 *                      stage) on the first T positions (512); ignored with
 *                      --codebooks FILE (a codebook file of fkvf train of
 *                      this shape, f16 tables)
 *       --npy FILE     the cache, [L, 2, H, T, D] f16 (bench/mkcache.py);
 *                      without it a per-head Gaussian mixture made here
 *       --rope         keys un-rotated at their positions before the search
 *                      (theta 10000, all dims; default: as-is, like
 *                      fkvf train --no-rope)
 *       --only PART    run only that part in each round (for a profiler:
 *                      perf record -e cpu-clock; the fractions are then
 *                      meaningless)
 *
 * Each round runs, in an order that alternates between rounds:
 *   peak    a microkernel of independent fused multiply-adds (24 zmm
 *           accumulators with AVX-512, 12 ymm ones with AVX2 + FMA) in the
 *           instruction set the encoder picks (fkvfq_isa); FLOP/s of CPU;
 *   encode  fkvf_rvq_encode of N positions on one thread with the f16
 *           tables in place (fkvf_rvq_from_tables16_encode, as fkvf pack
 *           --codebooks loads them): positions/s of CPU, and the FLOP rate
 *           counted as 2 * dim * k FLOPs per (vector, stage): the k * dim
 *           fused multiply-adds of the binary32 scores <x, c> the kernel
 *           computes for every centroid of every stage table of every head
 *           vector. Not counted: norm - 2 * dot (k per vector and stage,
 *           1/dim of the count), the binary64 re-check of the near-best
 *           candidates, the loads, the un-rotation and the residuals;
 *   kernel  the search alone, on one stage table (layer 0, head 0, key
 *           stage 0) and the N key vectors of layer 0 head 0: fkvfq_scores4
 *           then fkvfq_pick per vector (the encoder's panel path), the same
 *           count per vector.
 * Fractions are of the peak measured in the same round; min, median and
 * max over the rounds. CPU time: CLOCK_PROCESS_CPUTIME_ID.
 * Final line: RESULT peak_gflops=<median> encode_gflops=<median>
 *   encode_fraction=<median> encode_pos_per_s=<median>
 *   kernel_fraction=<median> */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu.h"
#include "bench_cache.h"
#include "fkvf.h"
#include "quant/quant.h"

static unsigned NL = 32, NH = 8, DIM = 128, K = 256, KS = 4, VS = 2;
static bench_shape SHAPE; /* NL x NH x DIM, set once the options are read */


static void die(const char *what)
{
    fprintf(stderr, "bench_peak: %s\n", what);
    exit(2);
}

/* ---- the FMA peak --------------------------------------------------------- */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PEAK_X86 1

/* acc = acc * m + a, n times on each of 24 zmm registers (independent
 * chains: 24 in flight covers a latency of 4 at two per cycle three times
 * over); the values settle near a / (1 - m), no overflow, no subnormals */
__attribute__((target("avx512f"), noinline)) static float peak_avx512(long n)
{
    const __m512 m = _mm512_set1_ps(0.999f), a = _mm512_set1_ps(0.001f);
#define P_DECL(i) __m512 r##i = _mm512_set1_ps((float)(i));
#define P_STEP(i) r##i = _mm512_fmadd_ps(r##i, m, a);
#define P_SUM(i) s = _mm512_add_ps(s, r##i);
#define P_ALL(X)                                                                           \
    X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) \
        X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)
    P_ALL(P_DECL)
    for (long i = 0; i < n; i++) {
        P_ALL(P_STEP)
        __asm__ volatile("" ::: "memory");
    }
    __m512 s = _mm512_setzero_ps();
    P_ALL(P_SUM)
    return _mm512_reduce_add_ps(s);
#undef P_DECL
#undef P_STEP
#undef P_SUM
#undef P_ALL
}
#define PEAK512_ACC 24

/* the same with AVX2 + FMA: 12 ymm accumulators (of 16 registers) */
__attribute__((target("avx2,fma"), noinline)) static float peak_avx2(long n)
{
    const __m256 m = _mm256_set1_ps(0.999f), a = _mm256_set1_ps(0.001f);
#define P_DECL(i) __m256 r##i = _mm256_set1_ps((float)(i));
#define P_STEP(i) r##i = _mm256_fmadd_ps(r##i, m, a);
#define P_SUM(i) s = _mm256_add_ps(s, r##i);
#define P_ALL(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
    P_ALL(P_DECL)
    for (long i = 0; i < n; i++) {
        P_ALL(P_STEP)
        __asm__ volatile("" ::: "memory");
    }
    __m256 s = _mm256_setzero_ps();
    P_ALL(P_SUM)
    float v[8];
    _mm256_storeu_ps(v, s);
    return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
#undef P_DECL
#undef P_STEP
#undef P_SUM
#undef P_ALL
}
#define PEAK256_ACC 12
#endif

static volatile float peak_sink;

/* FLOPs of n iterations of the microkernel of set isa (0: none) */
static double peak_flops(int isa, long n)
{
#ifdef PEAK_X86
    if (isa == FKVFQ_ISA_AVX512)
        return (double)n * PEAK512_ACC * 16 * 2;
    if (isa == FKVFQ_ISA_AVX2)
        return (double)n * PEAK256_ACC * 8 * 2;
#endif
    (void)n;
    (void)isa;
    return 0;
}

/* one run: FLOP/s of CPU time */
static double peak_run(int isa, long n)
{
    double t0 = bench_cpu_s();
#ifdef PEAK_X86
    if (isa == FKVFQ_ISA_AVX512)
        peak_sink = peak_avx512(n);
    else if (isa == FKVFQ_ISA_AVX2)
        peak_sink = peak_avx2(n);
#endif
    double t = bench_cpu_s() - t0;
    return t > 0 ? peak_flops(isa, n) / t : 0;
}

/* ---- data and codebook ----------------------------------------------------- */





/* the CBK1 tables of a codebook file (copied) */
static void *file_tables(const char *path, const fkvf_codebook_shape *want, size_t *size)
{
    fkvf_reader *r;
    if (fkvf_reader_open_file(&r, path, 0, NULL))
        die("cannot open the --codebooks file");
    fkvf_codebook_shape sh;
    const void *c;
    size_t cs;
    uint8_t hash[16];
    if (fkvf_reader_codebook(r, &sh, &c, &cs, hash))
        die("--codebooks: no codebook in it");
    if (sh.n_layers != want->n_layers || sh.n_heads != want->n_heads ||
        sh.key_dim != want->key_dim || sh.value_dim != want->value_dim || sh.k != want->k ||
        sh.k_stages != want->k_stages || sh.v_stages != want->v_stages ||
        sh.dtype != FKVF_DTYPE_F16 || sh.pooled || sh.layer_stages)
        die("--codebooks: not a codebook of this shape with f16 tables");
    uint64_t off = fkvf_codebook_tables_offset(&sh);
    if (off > cs)
        die("--codebooks: short codebook");
    *size = cs - (size_t)off;
    void *t = malloc(*size);
    if (!t)
        die("out of memory");
    memcpy(t, (const uint8_t *)c + off, *size);
    fkvf_reader_free(r);
    return t;
}

/* ---- statistics ------------------------------------------------------------ */


static void summary(const char *what, double *v, int n, double scale, const char *unit)
{
    double md = bench_median(v, n);
    printf("  %-44s min %10.3f  median %10.3f  max %10.3f %s\n", what, v[0] * scale, md * scale,
           v[n - 1] * scale, unit);
}

/* ---- the search alone ------------------------------------------------------- */

typedef struct kern {
    fkvfq_table t;
    float *rows, *panels, *norms, *x, *scores, *pmin;
    void *prep;
    double cmax;
    size_t n;
    uint32_t *pick;
} kern;

static void kern_make(kern *kk, const fkvf_rvq *q32, const uint16_t *rows, size_t n)
{
    memset(kk, 0, sizeof *kk);
    const float *c = fkvf_rvq_centroids(q32, 0, 0, 0, 0);
    if (!c)
        die("fkvf_rvq_centroids failed");
    kk->n = n;
    kk->rows = malloc((size_t)K * DIM * sizeof(float));
    kk->panels = malloc((size_t)K * DIM * sizeof(float));
    kk->norms = malloc(K * sizeof(float));
    kk->prep = malloc(fkvfq_prepare_scratch(K));
    kk->x = malloc(n * DIM * sizeof(float));
    kk->scores = malloc((size_t)FKVFQ_BLOCK * K * sizeof(float));
    kk->pmin = malloc((size_t)FKVFQ_BLOCK * K / FKVFQ_PANEL * sizeof(float));
    kk->pick = malloc(n * sizeof(uint32_t));
    if (!kk->rows || !kk->panels || !kk->norms || !kk->prep || !kk->x || !kk->scores ||
        !kk->pmin || !kk->pick)
        die("out of memory");
    memcpy(kk->rows, c, (size_t)K * DIM * sizeof(float));
    fkvfq_table_prepare(kk->rows, K, DIM, kk->panels, kk->norms, &kk->cmax, kk->prep);
    for (size_t t = 0; t < n; t++)
        for (unsigned d = 0; d < DIM; d++)
            kk->x[t * DIM + d] = fkvf_f16_to_f32(rows[bench_row_off(&SHAPE, t, 0, 0, 0) + d]);
    kk->t.rows = kk->rows;
    kk->t.panels = kk->panels;
    kk->t.norms = kk->norms;
    kk->t.cmax = kk->cmax;
    kk->t.k = K;
    kk->t.dim = DIM;
}

/* reps passes over the n vectors: scores4 + pick, as the encoder's panel path */
static void kern_run(kern *kk, int reps)
{
    for (int r = 0; r < reps; r++)
        for (size_t j0 = 0; j0 < kk->n; j0 += FKVFQ_BLOCK) {
            const float *xp[FKVFQ_BLOCK];
            for (size_t u = 0; u < FKVFQ_BLOCK; u++)
                xp[u] = kk->x + (j0 + u < kk->n ? j0 + u : kk->n - 1) * DIM;
            fkvfq_scores4(&kk->t, xp, kk->scores, kk->pmin);
            for (size_t u = 0; u < FKVFQ_BLOCK && j0 + u < kk->n; u++)
                kk->pick[j0 + u] = fkvfq_pick(&kk->t, xp[u], kk->scores + u * K,
                                              kk->pmin + u * (K / FKVFQ_PANEL), NULL);
        }
}

static void kern_free(kern *kk)
{
    free(kk->rows);
    free(kk->panels);
    free(kk->norms);
    free(kk->prep);
    free(kk->x);
    free(kk->scores);
    free(kk->pmin);
    free(kk->pick);
}

static unsigned arg_u(const char *s, unsigned lo, unsigned hi, const char *name)
{
    char *e;
    unsigned long v = strtoul(s, &e, 10);
    if (*e || v < lo || v > hi) {
        fprintf(stderr, "bench_peak: %s out of range (%u..%u)\n", name, lo, hi);
        exit(2);
    }
    return (unsigned)v;
}

int main(int argc, char **argv)
{
    const char *npy = NULL, *cbf = NULL;
    size_t n = 1024, ntrain = 512;
    int pairs = 5, rope_on = 0, only = -1;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--rope")) {
            rope_on = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "usage: bench_peak [--layers L] [--heads H] [--dim D] [--k K] "
                            "[--ks S] [--vs S] [--positions N] [--pairs P] [--train T] "
                            "[--npy FILE] [--codebooks FILE] [--rope]\n");
            return 2;
        }
        i++;
        if (!strcmp(o, "--layers"))
            NL = arg_u(v, 1, 1024, o);
        else if (!strcmp(o, "--heads"))
            NH = arg_u(v, 1, 1024, o);
        else if (!strcmp(o, "--dim"))
            DIM = arg_u(v, 2, 1024, o);
        else if (!strcmp(o, "--k"))
            K = arg_u(v, 16, 4096, o);
        else if (!strcmp(o, "--ks"))
            KS = arg_u(v, 1, 16, o);
        else if (!strcmp(o, "--vs"))
            VS = arg_u(v, 1, 16, o);
        else if (!strcmp(o, "--positions"))
            n = arg_u(v, 16, 1u << 24, o);
        else if (!strcmp(o, "--pairs"))
            pairs = (int)arg_u(v, 1, 100, o);
        else if (!strcmp(o, "--train"))
            ntrain = arg_u(v, 0, 1u << 24, o);
        else if (!strcmp(o, "--npy"))
            npy = v;
        else if (!strcmp(o, "--codebooks"))
            cbf = v;
        else if (!strcmp(o, "--only")) /* for a profiler: one part per round */
            only = !strcmp(v, "peak") ? 0 : !strcmp(v, "encode") ? 1 : !strcmp(v, "search") ? 2 : -2;
        else {
            fprintf(stderr, "bench_peak: unknown option %s\n", o);
            return 2;
        }
    }
    if (only == -2)
        die("--only peak|encode|search");
    if (K % FKVFQ_PANEL || DIM % 2 || (!cbf && (ntrain < 16 || ntrain > n)))
        die("k must be a multiple of 16, dim even, 16 <= --train <= --positions");
    const int isa = fkvfq_isa();
    if (isa == FKVFQ_ISA_PORTABLE)
        die("the encoder runs its portable kernels on this CPU: no FMA peak to compare with");
    printf("bench_peak: %u layers x %u KV heads x %u dims, k %u, keys x%u values x%u, %zu "
           "positions, %s, keys %s; encoder kernels %s\n",
           NL, NH, DIM, K, KS, VS, n, npy ? npy : "in-process data",
           rope_on ? "un-rotated (RoPE)" : "as-is", isa == FKVFQ_ISA_AVX512 ? "AVX-512" : "AVX2+FMA");
    SHAPE = (bench_shape){NL, NH, DIM};
    uint16_t *rows = npy ? bench_load_npy(&SHAPE, npy, n, "bench_peak")
                         : bench_make_rows(&SHAPE, n, "bench_peak");
    const fkvf_rope rope = {2, DIM, 10000.0};
    const fkvf_rope *rp = rope_on ? &rope : NULL;
    fkvf_rows all = {rows, n, FKVF_DTYPE_F16, 0};

    fkvf_codebook_shape sh = {NL, NH, DIM, DIM, K, KS, VS, FKVF_DTYPE_F16, 0, NULL};
    size_t tsize = 0;
    void *tables;
    double t0 = bench_cpu_s();
    if (cbf) {
        tables = file_tables(cbf, &sh, &tsize);
    } else {
        fkvf_rvq_params p;
        fkvf_rvq_params_init(&p);
        p.n_layers = NL;
        p.n_kv_heads = NH;
        p.key_dim = DIM;
        p.value_dim = DIM;
        p.k = K;
        p.k_stages = KS;
        p.v_stages = VS;
        p.max_iters = 1;
        p.key_rope = rp;
        fkvf_rows tr = {rows, ntrain, FKVF_DTYPE_F16, 0};
        fkvf_rvq *q0;
        if (fkvf_rvq_train(&q0, &p, &tr, 1, NULL))
            die("fkvf_rvq_train failed");
        tsize = fkvf_rvq_tables_size(q0);
        tables = malloc(tsize);
        if (!tables || fkvf_rvq_tables(q0, tables, tsize))
            die("fkvf_rvq_tables failed");
        fkvf_rvq_free(q0);
    }
    printf("codebook: %s (%.1f s cpu)\n", cbf ? cbf : "trained here, 1 iteration", bench_cpu_s() - t0);

    fkvf_rvq *q, *q32;
    int rc = fkvf_rvq_from_tables16_encode(&q, &sh, 0, tables, tsize, NULL);
    if (rc == FKVF_E_UNSUPPORTED)
        rc = fkvf_rvq_from_tables(&q, &sh, 0, tables, tsize, NULL);
    if (rc || fkvf_rvq_from_tables(&q32, &sh, 0, tables, tsize, NULL))
        die("cannot load the codebook");
    const size_t nc = fkvf_rvq_codes_per_position(q);
    uint16_t *codes = malloc(n * nc * sizeof(uint16_t)), *first = malloc(n * nc * sizeof(uint16_t));
    kern kk;
    kern_make(&kk, q32, rows, n);
    double *pk = malloc((size_t)pairs * sizeof(double)), *en = malloc((size_t)pairs * sizeof(double));
    double *pp = malloc((size_t)pairs * sizeof(double)), *fr = malloc((size_t)pairs * sizeof(double));
    double *kn = malloc((size_t)pairs * sizeof(double)), *kf = malloc((size_t)pairs * sizeof(double));
    if (!codes || !first || !pk || !en || !pp || !fr || !kn || !kf)
        die("out of memory");

    /* FLOPs: 2 * dim * k per (vector, stage) */
    const double per_vs = 2.0 * DIM * K;
    const double enc_flops = (double)n * NL * NH * (KS + VS) * per_vs;
    const double kern_flops_pass = (double)n * per_vs;
    /* sizes of a run: the peak loop about as long as an encode; the kernel
     * about a third of one */
    long piters = 2000000;
    int kreps = 1;
    {
        double a = bench_cpu_s();
        peak_run(isa, piters / 10);
        double tp = bench_cpu_s() - a;
        a = bench_cpu_s();
        kern_run(&kk, 1);
        double tk = bench_cpu_s() - a;
        double te = enc_flops / (peak_flops(isa, piters / 10) / (tp > 0 ? tp : 1e-3)) / 0.6;
        piters = (long)((double)piters / 10 * (te > 0.2 ? te : 0.2) / (tp > 0 ? tp : 1e-3));
        if (piters < 1000)
            piters = 1000;
        kreps = (int)(te / 3 / (tk > 0 ? tk : 1e-4));
        kreps = kreps < 1 ? 1 : kreps > 100000 ? 100000 : kreps;
    }
    int same = 1;
    for (int r = 0; r < pairs; r++) {
        double tpk = 1, te = 1, tk = 1;
        pk[r] = 1;
        for (int step = 0; step < 3; step++) {
            /* order: peak, encode, kernel; then rotated by one each round */
            int what = (step + r) % 3;
            if (only >= 0 && what != only)
                continue;
            double a = bench_cpu_s();
            if (what == 0) {
                pk[r] = peak_run(isa, piters);
                tpk = bench_cpu_s() - a;
            } else if (what == 1) {
                if (fkvf_rvq_encode(q, &all, rp, 1, codes, nc, 1))
                    die("fkvf_rvq_encode failed");
                te = bench_cpu_s() - a;
            } else {
                kern_run(&kk, kreps);
                tk = bench_cpu_s() - a;
            }
        }
        if (r == 0)
            memcpy(first, codes, n * nc * sizeof(uint16_t));
        else
            same &= !memcmp(first, codes, n * nc * sizeof(uint16_t));
        pp[r] = (double)n / te;
        en[r] = enc_flops / te;
        fr[r] = en[r] / pk[r];
        kn[r] = kern_flops_pass * kreps / tk;
        kf[r] = kn[r] / pk[r];
        printf("  round %d: peak %.1f GFLOP/s (%.2f s); encode %.0f pos/s, %.1f GFLOP/s = "
               "%.1f%% of peak (%.2f s); search alone %.1f GFLOP/s = %.1f%% (%.2f s)\n",
               r + 1, pk[r] * 1e-9, tpk, pp[r], en[r] * 1e-9, fr[r] * 100, te, kn[r] * 1e-9,
               kf[r] * 100, tk);
    }
    printf("over %d rounds (CPU time, one thread; FLOPs = 2 x dim x k per vector and stage):\n",
           pairs);
    summary("FMA peak (GFLOP/s)", pk, pairs, 1e-9, "");
    summary("encode (GFLOP/s)", en, pairs, 1e-9, "");
    summary("encode / peak (%)", fr, pairs, 100, "");
    summary("encode positions/s/core", pp, pairs, 1, "");
    summary("search alone, one table (GFLOP/s)", kn, pairs, 1e-9, "");
    summary("search alone / peak (%)", kf, pairs, 100, "");
    printf("codes of every round %s\n", same ? "identical" : "DIFFER");
    /* the arrays are sorted now: medians */
    printf("RESULT peak_gflops=%.2f encode_gflops=%.2f encode_fraction=%.3f "
           "encode_pos_per_s=%.0f kernel_fraction=%.3f\n",
           bench_median(pk, pairs) * 1e-9, bench_median(en, pairs) * 1e-9, bench_median(fr, pairs),
           bench_median(pp, pairs), bench_median(kf, pairs));
    kern_free(&kk);
    fkvf_rvq_free(q);
    fkvf_rvq_free(q32);
    free(tables);
    free(rows);
    free(codes);
    free(first);
    free(pk);
    free(en);
    free(pp);
    free(fr);
    free(kn);
    free(kf);
    return same ? 0 : 1;
}
