/* fkvf_reader_restore of every position against pread and memcpy of the raw
 * f16 cache, paired in one run (issue 16, row 1's decode half).
 *
 *   bench_restore_pread [--cache FILE.npy] [--positions N] [--pairs P]
 *                       [--random-codes] [--keep]
 *       --cache FILE.npy  the cache to archive: a [L, 2, H, T, D] f16 .npy
 *                         (bench/mkcache.py writes one); pread reads this
 *                         file's data bytes. Without it a synthetic
 *                         GPT-2-small cache (12 x 2 x 12 x N x 64, a
 *                         Gaussian mixture per head) is written to $TMPDIR.
 *       --positions N     positions of the synthetic cache (8192)
 *       --pairs P         timed rounds, at least 7 (9)
 *       --random-codes    random index codes instead of encoding the cache
 *                         (faster to set up; decode reads tables at random)
 *       --keep            leave the archive (and the synthetic raw cache) in
 *                         $TMPDIR, their paths on stderr
 *
 * Set-up (public API only): a codebook K x4 V x2, k = 256, f16 tables,
 * trained with fkvf_rvq_train on 512 positions (2 Lloyd iterations, 4
 * samples per centroid: fast, not good); every position encoded with
 * fkvf_rvq_encode, keys un-rotated first (key_storage 1, half-split RoPE over
 * all dims, theta 1e4, as `fkvf pack` stores them); an archive with 4 sink
 * and 64 recent exact rows and quad 8-bit index streams, in $TMPDIR.
 *
 * Timing: a warm-up of each method, then P rounds, each running the three
 * methods back to back (order alternating between rounds): pread of the
 * whole raw file into a buffer (page cache warm), memcpy of the same bytes,
 * fkvf_reader_restore of all positions as f16 into a buffer of the same
 * size (touched before). Per round the ratios restore/pread and
 * restore/memcpy, of process CPU time (CLOCK_PROCESS_CPUTIME_ID: user +
 * system) and of wall time; printed: their medians over the rounds, and the
 * median restore output rate in GB/s of CPU time (per core) and of wall
 * time. Last line on stdout, for bench/compare.sh (CPU-time figures):
 *   RESULT restore_vs_pread=<median> restore_vs_memcpy=<median> restore_gbps=<median>
 * Temporary files are removed. Errors on stderr, exit 1. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fkvf.h"

enum { KS = 4, VS = 2, K = 256, SINKS = 4, RECENT = 64, TRAIN_POS = 512, CHUNK = 256 };

static uint32_t NL = 12, NH = 12, DIM = 64;
static uint64_t NT = 8192;

/* the temporary files, removed at exit (also after an error) unless --keep */
static char tmp_raw[512], tmp_arch[512];
static void remove_temporaries(void)
{
    if (tmp_raw[0])
        unlink(tmp_raw);
    if (tmp_arch[0])
        unlink(tmp_arch);
}

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench_restore_pread: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void die(const char *what, int rc, fkvf_reader *r, fkvf_writer *w)
{
    if (rc == FKVF_OK)
        return;
    fprintf(stderr, "bench_restore_pread: %s: %s %s\n", what, fkvf_strerror(rc),
            r ? fkvf_reader_message(r) : w ? fkvf_writer_message(w) : "");
    exit(1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n)
{
    double *t = xmalloc((size_t)n * sizeof *t);
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    double m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
    return m;
}

static uint64_t rng = UINT64_C(0x9E3779B97F4A7C15);
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
/* uniform in [-1, 1) */
static double unif(void) { return (double)(rnd() >> 11) / 4503599627370496.0 - 1.0; }
/* roughly normal (a sum of four uniforms, variance 4/3) */
static double gauss(void) { return (unif() + unif() + unif() + unif()) * 0.8660254; }

/* The synthetic cache, [L, 2, H, T, D] f16, written to fd: per (layer, K|V,
 * head) 32 clusters with per-dimension scales, vectors a centre plus noise. */
static void write_synthetic(int fd)
{
    size_t vec = (size_t)NT * DIM;
    uint16_t *blk = xmalloc(vec * 2);
    float cen[32][256], scale[256];
    for (uint32_t l = 0; l < NL; l++)
        for (int kv = 0; kv < 2; kv++)
            for (uint32_t h = 0; h < NH; h++) {
                for (uint32_t d = 0; d < DIM; d++)
                    scale[d] = (float)(0.2 + 1.8 * (unif() + 1.0) * 0.5);
                for (int c = 0; c < 32; c++)
                    for (uint32_t d = 0; d < DIM; d++)
                        cen[c][d] = (float)(gauss() * scale[d]);
                for (uint64_t t = 0; t < NT; t++) {
                    int c = (int)(rnd() % 32);
                    for (uint32_t d = 0; d < DIM; d++)
                        blk[t * DIM + d] =
                            fkvf_f32_to_f16(cen[c][d] + (float)(0.3 * gauss() * scale[d]));
                }
                if (write(fd, blk, vec * 2) != (ssize_t)(vec * 2)) {
                    fprintf(stderr, "bench_restore_pread: writing the raw cache failed\n");
                    exit(1);
                }
            }
    free(blk);
}

/* Parse a .npy header: f16, C order, 5-D [L, 2, H, T, D]; sets the shape and
 * returns the data offset (0 on failure). */
static size_t parse_npy(const uint8_t *p, size_t size)
{
    if (size < 10 || memcmp(p, "\x93NUMPY", 6) != 0)
        return 0;
    size_t hl, off;
    if (p[6] == 1) {
        hl = (size_t)p[8] | (size_t)p[9] << 8;
        off = 10;
    } else {
        if (size < 12)
            return 0;
        hl = (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24;
        off = 12;
    }
    if (hl > 65536 || off + hl > size)
        return 0;
    char h[65537];
    memcpy(h, p + off, hl);
    h[hl] = 0;
    if (!strstr(h, "'<f2'") || !strstr(h, "'fortran_order': False"))
        return 0;
    const char *s = strstr(h, "'shape': (");
    unsigned long long v[5];
    if (!s || sscanf(s, "'shape': (%llu, %llu, %llu, %llu, %llu)", &v[0], &v[1], &v[2], &v[3],
                     &v[4]) != 5)
        return 0;
    if (v[1] != 2 || !v[0] || v[0] > 1024 || !v[2] || v[2] > 1024 || !v[4] || v[4] > 256 ||
        v[3] < SINKS + RECENT + 64 || v[3] > (1ull << 24))
        return 0;
    NL = (uint32_t)v[0];
    NH = (uint32_t)v[2];
    NT = v[3];
    DIM = (uint32_t)v[4];
    if (off + hl + (size_t)NL * 2 * NH * NT * DIM * 2 > size)
        return 0;
    return off + hl;
}

/* Rows [t0, t0+n) of the [L, 2, H, T, D] cache in the row layout of spec
 * 14.2 (per layer the keys of heads 0..H-1, then the values). */
static void gather_rows(const uint16_t *cache, uint64_t t0, size_t n, uint16_t *rows)
{
    size_t re = (size_t)NL * 2 * NH * DIM;
    for (size_t i = 0; i < n; i++)
        for (uint32_t l = 0; l < NL; l++)
            for (int kv = 0; kv < 2; kv++)
                for (uint32_t h = 0; h < NH; h++)
                    memcpy(rows + i * re + (((size_t)l * 2 + kv) * NH + h) * DIM,
                           cache + ((((size_t)l * 2 + kv) * NH + h) * NT + t0 + i) * DIM,
                           DIM * 2);
}

static void write_archive(const char *path, const uint16_t *cache, int random_codes)
{
    const fkvf_rope rope = {2, DIM, 10000.0};
    size_t re = (size_t)NL * 2 * NH * DIM, rb = re * 2;
    uint16_t *rows = xmalloc((size_t)(TRAIN_POS > CHUNK ? TRAIN_POS : CHUNK) * rb);
    fkvf_rvq_params pr;
    fkvf_rvq_params_init(&pr);
    pr.n_layers = NL;
    pr.n_kv_heads = NH;
    pr.key_dim = pr.value_dim = DIM;
    pr.k = K;
    pr.k_stages = KS;
    pr.v_stages = VS;
    pr.table_dtype = FKVF_DTYPE_F16;
    pr.seed = 1;
    pr.max_iters = 2;
    pr.samples_per_centroid = 4;
    pr.key_rope = &rope;
    uint64_t tf = SINKS + (NT - SINKS - RECENT) / 2 - TRAIN_POS / 2;
    gather_rows(cache, tf, TRAIN_POS, rows);
    fkvf_rows blk = {rows, TRAIN_POS, FKVF_DTYPE_F16, tf};
    fkvf_rvq *q;
    double t0 = clock_s(CLOCK_MONOTONIC);
    die("train", fkvf_rvq_train(&q, &pr, &blk, 1, NULL), NULL, NULL);
    fprintf(stderr, "codebook trained in %.1f s\n", clock_s(CLOCK_MONOTONIC) - t0);

    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_writer *w;
    die("create", fkvf_writer_create_file(&w, path, &o, NULL), NULL, NULL);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = NL;
    d.n_kv_heads = NH;
    d.key_dim = d.value_dim = DIM;
    d.dtype = FKVF_DTYPE_F16;
    d.key_transform = 1;
    d.rope_layout = 2;
    d.key_storage = 1;
    d.rope_dims = DIM;
    d.rope_theta = 10000.0;
    d.n_sinks = SINKS;
    d.window = RECENT;
    d.model_id = "gpt2 (synthetic)";
    die("set_desc", fkvf_writer_set_desc(w, &d), NULL, w);
    uint64_t na = NT - SINKS - RECENT;
    gather_rows(cache, 0, SINKS, rows);
    die("exact", fkvf_writer_add_exact(w, 0, SINKS, rows, SINKS * rb, 0), NULL, w);
    for (uint64_t t = SINKS + na; t < NT; t += CHUNK) {
        size_t n = NT - t < CHUNK ? (size_t)(NT - t) : CHUNK;
        gather_rows(cache, t, n, rows);
        die("exact", fkvf_writer_add_exact(w, t, n, rows, n * rb, 0), NULL, w);
    }
    fkvf_codebook_shape sh;
    fkvf_rvq_shape(q, &sh, NULL);
    size_t tsz = fkvf_rvq_tables_size(q);
    void *tab = xmalloc(tsz);
    die("tables", fkvf_rvq_tables(q, tab, tsz), NULL, NULL);
    die("codebooks", fkvf_writer_add_codebooks(w, &sh, tab, tsz, 0), NULL, w);
    free(tab);
    size_t nc = fkvf_rvq_codes_per_position(q);
    uint16_t *codes = xmalloc((size_t)na * nc * sizeof *codes);
    t0 = clock_s(CLOCK_MONOTONIC);
    if (random_codes) {
        for (size_t i = 0; i < (size_t)na * nc; i++)
            codes[i] = (uint16_t)(rnd() % K);
    } else {
        for (uint64_t a = 0; a < na; a += CHUNK) {
            size_t n = na - a < CHUNK ? (size_t)(na - a) : CHUNK;
            gather_rows(cache, SINKS + a, n, rows);
            fkvf_rows rr = {rows, n, FKVF_DTYPE_F16, SINKS + a};
            die("encode", fkvf_rvq_encode(q, &rr, &rope, 1, codes + a * nc, nc, 1), NULL, NULL);
        }
        fprintf(stderr, "%llu positions encoded in %.1f s\n", (unsigned long long)na,
                clock_s(CLOCK_MONOTONIC) - t0);
    }
    fkvf_stream_spec sp = {FKVF_PROFILE_QUAD, 8, 0, 0, 0};
    die("index", fkvf_writer_add_index_segment(w, &sp, 0, na, codes, nc, 1), NULL, w);
    die("positions", fkvf_writer_set_positions(w, NT, na), NULL, w);
    die("finish", fkvf_writer_finish(w), NULL, w);
    fkvf_writer_free(w);
    free(codes);
    free(rows);
    fkvf_rvq_free(q);
}

static void pread_all(int fd, uint8_t *buf, size_t n, size_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, buf + got, n - got, (off_t)(off + got));
        if (k <= 0) {
            fprintf(stderr, "bench_restore_pread: pread failed\n");
            exit(1);
        }
        got += (size_t)k;
    }
}

int main(int argc, char **argv)
{
    const char *cache_path = NULL;
    int pairs = 9, random_codes = 0, keep = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cache") && i + 1 < argc)
            cache_path = argv[++i];
        else if (!strcmp(argv[i], "--positions") && i + 1 < argc)
            NT = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--random-codes"))
            random_codes = 1;
        else if (!strcmp(argv[i], "--keep"))
            keep = 1;
        else {
            fprintf(stderr, "usage: bench_restore_pread [--cache FILE.npy] [--positions N] "
                            "[--pairs P] [--random-codes] [--keep]\n");
            return 2;
        }
    }
    if (pairs < 7 || pairs > 1000 || NT < SINKS + RECENT + 64 || NT > (1u << 24)) {
        fprintf(stderr, "bench_restore_pread: pairs 7..1000, positions %d..2^24\n",
                SINKS + RECENT + 64);
        return 2;
    }
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char raw[512], arch[512];
    snprintf(raw, sizeof raw, "%s/bench_restore_pread_%ld.raw", tmp, (long)getpid());
    snprintf(arch, sizeof arch, "%s/bench_restore_pread_%ld.fkvf", tmp, (long)getpid());

    if (!keep) {
        if (!cache_path)
            memcpy(tmp_raw, raw, sizeof raw);
        memcpy(tmp_arch, arch, sizeof arch);
        atexit(remove_temporaries);
    }
    double t0 = clock_s(CLOCK_MONOTONIC);
    const char *raw_path = cache_path ? cache_path : raw;
    if (!cache_path) {
        int fd = open(raw, O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0) {
            fprintf(stderr, "bench_restore_pread: cannot create %s\n", raw);
            return 1;
        }
        write_synthetic(fd);
        close(fd);
    }
    int rfd = open(raw_path, O_RDONLY);
    struct stat st;
    if (rfd < 0 || fstat(rfd, &st) != 0) {
        fprintf(stderr, "bench_restore_pread: cannot open %s\n", raw_path);
        return 1;
    }
    size_t fsize = (size_t)st.st_size;
    uint8_t *map = mmap(NULL, fsize, PROT_READ, MAP_PRIVATE, rfd, 0);
    if (map == MAP_FAILED) {
        fprintf(stderr, "bench_restore_pread: cannot map %s\n", raw_path);
        return 1;
    }
    size_t data_off = 0;
    if (cache_path && !(data_off = parse_npy(map, fsize))) {
        fprintf(stderr, "bench_restore_pread: %s: not a [L, 2, H, T, D] f16 C-order .npy\n",
                cache_path);
        return 1;
    }
    size_t bytes = (size_t)NL * 2 * NH * NT * DIM * 2;
    if (data_off + bytes > fsize) {
        fprintf(stderr, "bench_restore_pread: %s is short\n", raw_path);
        return 1;
    }
    write_archive(arch, (const uint16_t *)(const void *)(map + data_off), random_codes);
    munmap(map, fsize);
    struct stat ast;
    stat(arch, &ast);
    fprintf(stderr, "set-up %.1f s\n", clock_s(CLOCK_MONOTONIC) - t0);

    fkvf_reader *r;
    die("open", fkvf_reader_open_file(&r, arch, 0, NULL), r, NULL);
    size_t rb;
    die("row_bytes", fkvf_reader_row_bytes(r, FKVF_DTYPE_F16, &rb), r, NULL);
    if (rb * NT != bytes) {
        fprintf(stderr, "bench_restore_pread: row bytes disagree\n");
        return 1;
    }
    uint8_t *a = xmalloc(bytes), *b = xmalloc(bytes);
    memset(a, 1, bytes);
    memset(b, 1, bytes);
    /* warm-up: the page cache, the reader's codebook and verified blocks */
    double c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    die("restore", fkvf_reader_restore(r, 0, NT, FKVF_DTYPE_F16, b, bytes), r, NULL);
    double first = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    pread_all(rfd, a, bytes, data_off);
    memcpy(b, a, bytes);

    double *rp = xmalloc((size_t)pairs * 7 * sizeof(double));
    double *rpc = rp, *rmc = rp + pairs, *rpw = rp + 2 * pairs, *rmw = rp + 3 * pairs,
           *gbc = rp + 4 * pairs, *gbw = rp + 5 * pairs, *tpc = rp + 6 * pairs;
    for (int i = 0; i < pairs; i++) {
        double cpu[3], wall[3]; /* pread, memcpy, restore */
        for (int s = 0; s < 3; s++) {
            int m = i % 2 ? 2 - s : s;
            double w0 = clock_s(CLOCK_MONOTONIC), u0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
            if (m == 0)
                pread_all(rfd, a, bytes, data_off);
            else if (m == 1)
                memcpy(b, a, bytes);
            else
                die("restore", fkvf_reader_restore(r, 0, NT, FKVF_DTYPE_F16, b, bytes), r, NULL);
            cpu[m] = clock_s(CLOCK_PROCESS_CPUTIME_ID) - u0;
            wall[m] = clock_s(CLOCK_MONOTONIC) - w0;
        }
        rpc[i] = cpu[2] / cpu[0];
        rmc[i] = cpu[2] / cpu[1];
        rpw[i] = wall[2] / wall[0];
        rmw[i] = wall[2] / wall[1];
        gbc[i] = (double)bytes / cpu[2] / 1e9;
        gbw[i] = (double)bytes / wall[2] / 1e9;
        tpc[i] = cpu[2];
    }
    printf("GPT-2 shape %u layers x %u KV heads x %u dims, f16, %llu positions (%d sink + %d "
           "recent exact), K x%d V x%d, k = %d, keys before RoPE, %s codes; raw %.1f MB, "
           "archive %.1f MB; %d rounds\n",
           NL, NH, DIM, (unsigned long long)NT, SINKS, RECENT, KS, VS, K,
           random_codes ? "random" : "encoded", (double)bytes / 1e6, (double)ast.st_size / 1e6,
           pairs);
    printf("first restore (codebook load included): %.0f ms CPU\n", first * 1e3);
    printf("restore: %.0f ms CPU (median); restore/pread CPU %.2f wall %.2f; restore/memcpy "
           "CPU %.2f wall %.2f; %.2f GB/s per core (CPU), %.2f GB/s wall\n",
           median(tpc, pairs) * 1e3, median(rpc, pairs), median(rpw, pairs), median(rmc, pairs),
           median(rmw, pairs), median(gbc, pairs), median(gbw, pairs));
    printf("RESULT restore_vs_pread=%.3f restore_vs_memcpy=%.3f restore_gbps=%.3f\n",
           median(rpc, pairs), median(rmc, pairs), median(gbc, pairs));
    free(rp);
    free(a);
    free(b);
    fkvf_reader_free(r);
    close(rfd);
    if (keep)
        fprintf(stderr, "kept %s%s%s\n", arch, cache_path ? "" : " and ", cache_path ? "" : raw);
    return 0;
}
