/* Encode throughput (pack with given codebooks) on the GPT-2-small shape:
 * 12 layers x 12 KV heads x head dim 64, keys x4 and values x2 RVQ stages of
 * k = 256 (f16 tables), keys archived before RoPE (the encoder rotates them
 * back at their positions), greedy search.
 *
 *   bench_encode [--npy FILE] [--positions N] [--pairs P] [--train T]
 *       --npy FILE     the cache to encode, [L, 2, H, T, D] f16 as written by
 *                      bench/mkcache.py (L = 12, H = 12, D = 64; the first N
 *                      positions are used); without it the same kind of data
 *                      is made in-process (a per-head Gaussian mixture)
 *       --positions N  positions encoded per timed run (8192)
 *       --pairs P      alternated (reference, fkvf_rvq_encode) pairs, >= 1 (5)
 *       --train T      codebook from fkvf_rvq_train on the first T positions
 *                      with 1 Lloyd iteration per stage (512); 0: centroids
 *                      drawn from the data (stage 0) and from differences of
 *                      data vectors scaled down per stage (later stages)
 *
 * Measures, in CPU time of this process (CLOCK_PROCESS_CPUTIME_ID):
 * (a) the encoder before issue 16 (tests/encode_ref.c, compiled in) and
 *     fkvf_rvq_encode on the same positions, alternated P times; the codes of
 *     both must be identical (exit status 1 otherwise); positions/s/core of
 *     each and the median of the per-pair ratio old / new;
 * (b) the codebook load for encoding, P times: fkvf_rvq_from_tables_decode
 *     (conversion and checks), then fkvf_rvq_from_tables and a 256-position
 *     encode with it, then fkvf_rvq_from_tables16_encode (the f16 tables in
 *     place, as fkvf pack --codebooks loads them) and the same encode with
 *     it (the codes must be the same); the whole load for encoding as a
 *     share of load + encode, i.e. of a 256-position pack's CPU time
 *     (median): cbload_share for the f16 load in place, cbload_f32_share for
 *     fkvf_rvq_from_tables (binary32 tables allocated and converted, the
 *     checks, the search layout), and the search layout alone (the
 *     difference of the two binary32 loads: norms, cmax, the duplicate
 *     check) as cbload_layout_share.
 * No files are written. Final line on stdout:
 *   RESULT encode_pos_per_s=<median new> encode_speedup=<median old/new>
 *          cbload_share=<median, f16 in place> cbload_f32_share=<median>
 *          cbload_layout_share=<median> */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "encode_ref.h"
#include "bench_cache.h"
#include "fkvf.h"

enum { NL = 12, NH = 12, DIM = 64, KS = 4, VS = 2, K = 256 };
static const bench_shape SHAPE = {NL, NH, DIM};


static void die(const char *what)
{
    fprintf(stderr, "bench_encode: %s\n", what);
    exit(2);
}





/* f16 CBK1 tables of centroids drawn from the data */
static uint16_t *sampled_tables(const uint16_t *rows, size_t n, size_t *size)
{
    size_t per = (size_t)K * (KS + VS) * DIM, nt = (size_t)NL * NH;
    uint16_t *t = malloc(nt * per * 2);
    if (!t)
        die("out of memory");
    bench_seed(77);
    for (size_t tab = 0; tab < nt; tab++)
        for (unsigned s = 0; s < KS + VS; s++) {
            unsigned kv = s < KS ? 0 : 1, st = kv ? s - KS : s;
            double sc = pow(0.45, st);
            for (unsigned c = 0; c < K; c++) {
                uint16_t *o = t + tab * per + ((size_t)s * K + c) * DIM;
                size_t a = (size_t)((bench_urand() + 1) * 0.5 * n) % n, b = (size_t)((bench_urand() + 1) * 0.5 * n) % n;
                const uint16_t *xa = rows + bench_row_off(&SHAPE, a, tab / NH, kv, tab % NH);
                const uint16_t *xb = rows + bench_row_off(&SHAPE, b, tab / NH, kv, tab % NH);
                for (int d = 0; d < DIM; d++)
                    o[d] = st ? fkvf_f32_to_f16((float)(sc * (fkvf_f16_to_f32(xa[d]) -
                                                               fkvf_f16_to_f32(xb[d]))))
                              : xa[d];
            }
        }
    *size = nt * per * 2;
    return t;
}


int main(int argc, char **argv)
{
    const char *npy = NULL;
    size_t n = 8192, ntrain = 512;
    int pairs = 5;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--npy"))
            npy = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--positions"))
            n = strtoul(argv[++i], NULL, 10);
        else if (i + 1 < argc && !strcmp(argv[i], "--pairs"))
            pairs = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--train"))
            ntrain = strtoul(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "usage: bench_encode [--npy FILE] [--positions N] [--pairs P] "
                            "[--train T]\n");
            return 2;
        }
    }
    if (n < 256 || pairs < 1 || pairs > 100 || ntrain > n)
        die("need --positions >= 256, 1 <= --pairs <= 100, --train <= positions");
    uint16_t *rows = npy ? bench_load_npy(&SHAPE, npy, n, "bench_encode")
                         : bench_make_rows(&SHAPE, n, "bench_encode");
    const fkvf_rope rope = {2, DIM, 10000.0};
    fkvf_rows all = {rows, n, FKVF_DTYPE_F16, 0};

    /* the codebook, as f16 CBK1 tables */
    fkvf_codebook_shape sh = {NL, NH, DIM, DIM, K, KS, VS, FKVF_DTYPE_F16, 0, NULL};
    size_t tsize = 0;
    void *tables;
    double t0 = bench_cpu_s();
    if (ntrain) {
        fkvf_rvq_params p;
        fkvf_rvq_params_init(&p);
        p.n_layers = NL;
        p.n_kv_heads = NH;
        p.key_dim = DIM;
        p.value_dim = DIM;
        p.max_iters = 1;
        p.key_rope = &rope;
        fkvf_rows tr = {rows, ntrain, FKVF_DTYPE_F16, 0};
        fkvf_rvq *q0;
        if (fkvf_rvq_train(&q0, &p, &tr, 1, NULL))
            die("fkvf_rvq_train failed");
        tsize = fkvf_rvq_tables_size(q0);
        tables = malloc(tsize);
        if (!tables || fkvf_rvq_tables(q0, tables, tsize))
            die("fkvf_rvq_tables failed");
        fkvf_rvq_free(q0);
    } else {
        tables = sampled_tables(rows, n, &tsize);
    }
    printf("bench_encode: %zu positions of %s, codebook %s (%.1f s cpu)\n", n,
           npy ? npy : "in-process data", ntrain ? "trained (1 iteration)" : "sampled",
           bench_cpu_s() - t0);

    fkvf_rvq *q;
    if (fkvf_rvq_from_tables(&q, &sh, 0, tables, tsize, NULL))
        die("fkvf_rvq_from_tables failed");
    size_t nc = fkvf_rvq_codes_per_position(q);
    uint16_t *ca = malloc(n * nc * 2), *cb = malloc(n * nc * 2);
    double *ratio = malloc((size_t)pairs * sizeof(double)), *pnew = malloc((size_t)pairs * sizeof(double));
    double *pold = malloc((size_t)pairs * sizeof(double)), *share = malloc((size_t)pairs * sizeof(double));
    double *lshare = malloc((size_t)pairs * sizeof(double));
    double *fshare = malloc((size_t)pairs * sizeof(double));
    if (!ca || !cb || !ratio || !pnew || !pold || !share || !lshare || !fshare)
        die("out of memory");

    /* (a) old and new encoder, alternated */
    int same = 1;
    for (int r = 0; r < pairs; r++) {
        memset(ca, 0xff, n * nc * 2);
        memset(cb, 0xff, n * nc * 2);
        double a0 = bench_cpu_s();
        if (encode_ref(q, &all, &rope, 1, ca, nc, 1))
            die("reference encode failed");
        double a1 = bench_cpu_s();
        if (fkvf_rvq_encode(q, &all, &rope, 1, cb, nc, 1))
            die("fkvf_rvq_encode failed");
        double a2 = bench_cpu_s();
        same &= !memcmp(ca, cb, n * nc * 2);
        pold[r] = (double)n / (a1 - a0);
        pnew[r] = (double)n / (a2 - a1);
        ratio[r] = (a1 - a0) / (a2 - a1);
        printf("  pair %d: reference %.0f pos/s, fkvf_rvq_encode %.0f pos/s, ratio %.2f\n", r + 1,
               pold[r], pnew[r], ratio[r]);
    }

    /* (b) the codebook load for encoding against a 256-position encode */
    fkvf_rows r256 = {rows, 256, FKVF_DTYPE_F16, 0};
    for (int r = 0; r < pairs; r++) {
        fkvf_rvq *q2, *q3;
        double b0 = bench_cpu_s();
        if (fkvf_rvq_from_tables_decode(&q3, &sh, 0, tables, tsize, NULL))
            die("fkvf_rvq_from_tables_decode failed");
        double b1 = bench_cpu_s();
        fkvf_rvq_free(q3);
        double b2 = bench_cpu_s();
        if (fkvf_rvq_from_tables(&q2, &sh, 0, tables, tsize, NULL))
            die("fkvf_rvq_from_tables failed");
        double b3 = bench_cpu_s();
        if (fkvf_rvq_encode(q2, &r256, &rope, 1, cb, nc, 1))
            die("fkvf_rvq_encode failed");
        double b4 = bench_cpu_s();
        fkvf_rvq_free(q2);
        /* the f16 tables in place (an f16 codebook on a CPU with F16C; else
         * the binary32 load again) */
        fkvf_rvq *q4;
        double b5 = bench_cpu_s();
        int rc16 = fkvf_rvq_from_tables16_encode(&q4, &sh, 0, tables, tsize, NULL);
        if (rc16 == FKVF_E_UNSUPPORTED)
            rc16 = fkvf_rvq_from_tables(&q4, &sh, 0, tables, tsize, NULL);
        if (rc16)
            die("fkvf_rvq_from_tables16_encode failed");
        double b6 = bench_cpu_s();
        if (fkvf_rvq_encode(q4, &r256, &rope, 1, ca, nc, 1))
            die("fkvf_rvq_encode failed");
        double b7 = bench_cpu_s();
        fkvf_rvq_free(q4);
        if (memcmp(ca, cb, 256 * nc * sizeof *ca))
            die("the codes of the f16 tables in place differ");
        /* the search layout: what loading for encoding adds to loading for decoding */
        double lay = (b3 - b2) - (b1 - b0);
        lshare[r] = lay / (b4 - b2);
        fshare[r] = (b3 - b2) / (b4 - b2);
        share[r] = (b6 - b5) / (b7 - b5);
        printf("  f16 in place: load %.1f ms, 256-position encode %.1f ms: load %.1f%%; binary32: "
               "load %.1f ms (for decoding %.1f ms, search layout %.1f ms), encode %.1f ms: load "
               "%.1f%%, search layout %.1f%%\n",
               (b6 - b5) * 1e3, (b7 - b6) * 1e3, share[r] * 100, (b3 - b2) * 1e3,
               (b1 - b0) * 1e3, lay * 1e3, (b4 - b3) * 1e3, fshare[r] * 100, lshare[r] * 100);
    }
    double mo = bench_median(pold, pairs), mn = bench_median(pnew, pairs), mr = bench_median(ratio, pairs),
           ms = bench_median(share, pairs), ml = bench_median(lshare, pairs), mf = bench_median(fshare, pairs);
    printf("reference encoder %.0f positions/s/core, fkvf_rvq_encode %.0f (median of %d; "
           "speedup %.2fx, median of per-pair ratios); codes %s\n",
           mo, mn, pairs, mr, same ? "identical" : "DIFFER");
    printf("codebook load for encoding: %.1f%% of load + 256-position encode with the f16 "
           "tables in place, %.1f%% with binary32 tables (of which the search layout %.1f%%) "
           "(medians)\n",
           ms * 100, mf * 100, ml * 100);
    printf("RESULT encode_pos_per_s=%.0f encode_speedup=%.2f cbload_share=%.3f "
           "cbload_f32_share=%.3f cbload_layout_share=%.3f\n",
           mn, mr, ms, mf, ml);
    fkvf_rvq_free(q);
    free(tables);
    free(rows);
    free(ca);
    free(cb);
    free(ratio);
    free(pnew);
    free(pold);
    free(share);
    free(lshare);
    free(fshare);
    return same ? 0 : 1;
}
