/* Append cost of the appender (fkvf.h "appender") at GPT-2 shape.
 *
 *   bench_append [--sizes N,N,..] [--every C[,C]] [--dir DIR] [--sync-max N] [--window-max N] [--stub-from N]
 *                [--stub-from N] [--train N] [--iters I]
 *
 * Shape: 12 layers, 12 KV heads, 64 dims, f16 rows (36,864 bytes), RVQ with
 * k = 256, keys x4 and values x2 stages (864 index symbols of 8 bits per
 * archived position), codebook trained with fkvf_rvq_train on --train
 * synthetic positions (default 384) with --iters Lloyd iterations (default
 * 3). Rows are synthetic: a pool of 1,024 distinct rows (per head a fixed
 * mean plus Gaussian-like noise of a per-dimension scale), position p
 * appending pool row p mod 1024.
 *
 * For each size n (default 1000,10000,100000,1000000), commit interval c
 * (--every, default 16 and 1024), window W and sync mode, a fresh archive in DIR (default /tmp)
 * gets n positions appended in batches of c, each batch followed by a commit.
 * The wall time and the CPU time of this thread (user + system;
 * CLOCK_THREAD_CPUTIME_ID) of the append and commit calls only (not row
 * generation) are the totals; divided by n they are the cost per position.
 * CPU time is the robust figure on a shared machine; wall time also holds
 * waiting for the disk (syncs) and for a CPU. Windows: W = 32
 * (sinks 4) and W = 0 (sinks 4) for n <= --window-max (default 10000), only
 * W = 0 above, because with W = 32 every position is first written as an
 * exact row (36,864 bytes) and a 10^6-position archive would be 37 GB; with
 * W = 0 positions go straight to the index streams (864 bytes each). Sync:
 * FKVF_SYNC_NONE always, FKVF_SYNC_COMMIT for n <= --sync-max (default
 * 10000).
 *
 * Encode time is measured separately in the same run: the executable is
 * linked with --wrap=fkvf_rvq_encode, so every call the appender makes is
 * timed (wall and CPU) as it happens; "encode" is that time per appended
 * position, "rest" the total minus it (row copies, segments, checksums,
 * directory, trailer, I/O).
 * Two untimed warm-up archives of 1,024 positions come first (stubbed when
 * --stub-from is given). With --stub-from N, sizes >= N run with the encoder replaced by a trivial
 * code generator (rows marked "(stub)"): that measures the rest (row
 * copies, segments, checksums, directory, trailer, I/O) at sizes where real
 * encoding (~0.5-1 ms per position, independent of the archive's size)
 * would take too long; ratios compare stubbed rows with stubbed rows only.
 * "bytes/pos appended" is (final file size - size after commit 1, which
 * holds the descriptor and the 28 MB f16 codebook) / n. Output is a
 * markdown table, then the ratios cost(largest n)/cost(smallest n) per
 * (W, c, sync) series.
 *
 *   bench_append --live [--positions N] [--every C] [--window W] [--pairs P]
 *                [--dir DIR] [--train N] [--iters I]
 *
 * Live archives and the automatic compaction (docs/appending.md): the same
 * shape and codebook, N positions (default 8192) appended C per commit
 * (default 8), window W (default 32), sync none, into a fresh archive in
 * DIR (default $TMPDIR, else /tmp; removed after); codebook trained on
 * --train positions (256) for --iters iterations (1). P pairs (default 3)
 * of runs, alternating which goes first, with the default automatic
 * compaction and without it (no_auto_compact): the CPU time of the process
 * (CLOCK_PROCESS_CPUTIME_ID) of the append and commit calls, and the bytes
 * written (every write through fkvf_io: commits and compactions). In the
 * runs with it after the first (one more run when P = 1), the file is
 * compacted with fkvf_archive_compact to a scratch file (untimed) at the
 * commit before each automatic compaction (the commits where the first run
 * compacted; the file is then at its largest) and after the last commit:
 * footprint = st_size (and st_blocks * 512) of the live file over those of
 * the scratch compaction; the last such run is reported. Prints the
 * table, then
 *   RESULT live_peak_ratio=<max footprint/compacted> live_final_ratio=<..>
 *          append_slowdown=<median CPU ratio with/without>
 * (also on the line: the ratio without it, the bytes rewritten per byte
 * appended, the compactions, and the transient peak while a compaction's
 * new file and the old one both exist). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fkvf.h"

static int live_main(int argc, char **argv);

#define NL 12
#define NH 12
#define HD 64
#define ROW_ELEMS ((size_t)NL * NH * 2 * HD)
#define ROW_BYTES (ROW_ELEMS * 2)
#define POOL 1024
#define SINKS 4

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time of this thread (user + system): the machine may be shared, and
 * wall time then includes time spent waiting for a CPU. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = UINT64_C(0x5DEECE66D);
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}
static double unif(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }
/* sum of 4 uniforms, centred and scaled to unit variance (Gaussian-like) */
static double gauss(void) { return (unif() + unif() + unif() + unif() - 2.0) * sqrt(3.0); }

static void die(const char *what, int rc, const char *msg)
{
    fprintf(stderr, "%s: %s%s%s\n", what, fkvf_error_name(rc), msg ? ": " : "", msg ? msg : "");
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    memset(p, 0, n);
    return p;
}

/* n synthetic f16 rows: per (layer, head, K|V) a mean vector and a scale per
 * dimension, fixed for the run, plus noise. */
static uint16_t *make_rows(size_t n)
{
    static float mean[ROW_ELEMS], scale[ROW_ELEMS];
    static int init;
    if (!init) {
        for (size_t e = 0; e < ROW_ELEMS; e++) {
            mean[e] = (float)(gauss() * 0.5);
            scale[e] = (float)(0.25 + 1.5 * unif());
        }
        init = 1;
    }
    uint16_t *rows = xmalloc(n * ROW_BYTES);
    for (size_t i = 0; i < n; i++)
        for (size_t e = 0; e < ROW_ELEMS; e++)
            rows[i * ROW_ELEMS + e] = fkvf_f32_to_f16(mean[e] + scale[e] * (float)gauss());
    return rows;
}

static fkvf_desc gpt2_desc(uint32_t window)
{
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = NL;
    d.n_kv_heads = NH;
    d.key_dim = d.value_dim = HD;
    d.dtype = FKVF_DTYPE_F16;
    d.n_sinks = SINKS;
    d.window = window;
    d.model_id = "bench/gpt2-shape";
    return d;
}

typedef struct result {
    uint64_t n;
    uint32_t window, every;
    unsigned sync;
    double total, cpu, enc_wall, enc_cpu, bytes_pp;
    uint64_t archived;
    int stub;
} result;

/* The appender's own calls of fkvf_rvq_encode, timed: the executable is
 * linked with -Wl,--wrap=fkvf_rvq_encode (bench/CMakeLists.txt), so the
 * call in append.c lands here. */
int __real_fkvf_rvq_encode(const fkvf_rvq *q, const fkvf_rows *rows, const fkvf_rope *key_rope,
                           unsigned beam_width, uint16_t *codes, size_t pos_stride,
                           size_t code_stride);
int __wrap_fkvf_rvq_encode(const fkvf_rvq *q, const fkvf_rows *rows, const fkvf_rope *key_rope,
                           unsigned beam_width, uint16_t *codes, size_t pos_stride,
                           size_t code_stride);
static double enc_wall, enc_cpu;
static uint64_t enc_rows;
/* --stub-from: replace the encoder by a trivial code generator (to measure
 * the rest, I/O and container, at sizes where real encoding would take too
 * long on the machine at hand) */
static int stub_encode;

int __wrap_fkvf_rvq_encode(const fkvf_rvq *q, const fkvf_rows *rows, const fkvf_rope *key_rope,
                           unsigned beam_width, uint16_t *codes, size_t pos_stride,
                           size_t code_stride)
{
    double w0 = now(), c0 = cpu_now();
    int rc = FKVF_OK;
    if (stub_encode && rows && codes) {
        size_t cpp = fkvf_rvq_codes_per_position(q);
        for (size_t i = 0; i < rows->n_rows; i++)
            for (size_t j = 0; j < cpp; j++)
                codes[i * pos_stride + j * code_stride] =
                    (uint16_t)((rows->first_position + i) * 131 + j * 7) & 255;
    } else {
        rc = __real_fkvf_rvq_encode(q, rows, key_rope, beam_width, codes, pos_stride,
                                    code_stride);
    }
    enc_cpu += cpu_now() - c0;
    enc_wall += now() - w0;
    enc_rows += rows ? rows->n_rows : 0;
    return rc;
}

static result run(const char *dir, const fkvf_rvq *q, const uint16_t *pool, uint64_t n,
                  uint32_t window, uint32_t every, unsigned sync)
{
    char path[512];
    snprintf(path, sizeof path, "%s/bench-append-%ld.fkvf", dir, (long)getpid());
    unlink(path);
    fkvf_desc d = gpt2_desc(window);
    fkvf_append_create c;
    memset(&c, 0, sizeof c);
    c.desc = &d;
    c.codebook = q;
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = sync;
    fkvf_appender *a = NULL;
    int rc = fkvf_appender_create(&a, path, &c, &o, NULL);
    if (rc)
        die("fkvf_appender_create", rc, a ? fkvf_appender_message(a) : NULL);
    fkvf_append_info st;
    fkvf_appender_info(a, &st);
    uint64_t size0 = st.file_size; /* commit 1: descriptor and the 28 MB codebook */
    double total = 0, cpu = 0;
    enc_wall = enc_cpu = 0;
    enc_rows = 0;
    for (uint64_t p = 0; p < n;) {
        size_t m = (size_t)(n - p < every ? n - p : every);
        size_t off = (size_t)(p % POOL);
        double t0 = now(), c0 = cpu_now();
        if (off + m <= POOL) {
            rc = fkvf_appender_append(a, pool + off * ROW_ELEMS, m * ROW_BYTES, m, NULL);
        } else { /* wraps around the pool: two calls */
            size_t m1 = POOL - off;
            rc = fkvf_appender_append(a, pool + off * ROW_ELEMS, m1 * ROW_BYTES, m1, NULL);
            if (!rc)
                rc = fkvf_appender_append(a, pool, (m - m1) * ROW_BYTES, m - m1, NULL);
        }
        if (rc)
            die("fkvf_appender_append", rc, fkvf_appender_message(a));
        rc = fkvf_appender_commit(a);
        total += now() - t0;
        cpu += cpu_now() - c0;
        if (rc)
            die("fkvf_appender_commit", rc, fkvf_appender_message(a));
        p += m;
    }
    fkvf_appender_info(a, &st);
    fkvf_appender_free(a);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        perror(path);
        exit(1);
    }
    unlink(path);
    result r;
    memset(&r, 0, sizeof r);
    r.n = n;
    r.window = window;
    r.every = every;
    r.sync = sync;
    r.total = total;
    r.cpu = cpu;
    r.archived = st.n_archived;
    r.bytes_pp = (double)((uint64_t)sb.st_size - size0) / (double)n;
    r.stub = stub_encode;
    r.enc_wall = enc_wall;
    r.enc_cpu = enc_cpu;
    if (enc_rows != st.n_archived) {
        fprintf(stderr, "bench_append: the appender encoded %llu rows, archived %llu\n",
                (unsigned long long)enc_rows, (unsigned long long)st.n_archived);
        exit(1);
    }
    return r;
}

static void print_row(const result *r)
{
    double n = (double)r->n;
    double wp = r->total / n * 1e6, cp = r->cpu / n * 1e6;
    double ew = r->enc_wall / n * 1e6, ec = r->enc_cpu / n * 1e6;
    printf("| %llu%s | %u | %u | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f |\n",
           (unsigned long long)r->n, r->stub ? " (stub)" : "", r->window, r->every,
           r->sync == FKVF_SYNC_NONE ? "none" : "commit", r->total, wp, ew, wp - ew, cp, ec,
           cp - ec, r->bytes_pp);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    uint64_t sizes[16] = {1000, 10000, 100000, 1000000};
    size_t n_sizes = 4;
    const char *dir = "/tmp";
    uint64_t sync_max = 10000, window_max = 10000, stub_from = 0;
    size_t n_train = 384;
    uint32_t everys[2] = {16, 1024};
    int n_everys = 2;
    uint32_t iters = 3;
    if (argc > 1 && !strcmp(argv[1], "--live"))
        return live_main(argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--sizes") && v) {
            n_sizes = 0;
            char *s = argv[++i], *end;
            while (*s && n_sizes < 16) {
                sizes[n_sizes++] = strtoull(s, &end, 10);
                s = *end == ',' ? end + 1 : end;
                if (end == s && *s)
                    break;
            }
        } else if (!strcmp(argv[i], "--every") && v) {
            char *end;
            n_everys = 0;
            everys[n_everys++] = (uint32_t)strtoul(argv[++i], &end, 10);
            if (*end == ',')
                everys[n_everys++] = (uint32_t)strtoul(end + 1, &end, 10);
            if (*end || !everys[0] || !everys[n_everys - 1]) {
                fprintf(stderr, "bench_append: --every C[,C] with C > 0\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--stub-from") && v) {
            stub_from = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--dir") && v) {
            dir = argv[++i];
        } else if (!strcmp(argv[i], "--sync-max") && v) {
            sync_max = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--window-max") && v) {
            window_max = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--train") && v) {
            n_train = (size_t)strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--iters") && v) {
            iters = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else {
            fprintf(stderr,
                    "usage: bench_append [--sizes N,N,..] [--every C[,C]] [--dir DIR] "
                    "[--sync-max N] [--window-max N] [--stub-from N] [--train N] [--iters I]\n");
            return 2;
        }
    }
    for (size_t i = 0; i < n_sizes; i++)
        if (sizes[i] == 0) {
            fprintf(stderr, "bench_append: sizes must be > 0\n");
            return 2;
        }
    if (n_train < 16 || iters < 1) {
        fprintf(stderr, "bench_append: --train >= 16 and --iters >= 1\n");
        return 2;
    }

    double t0 = now();
    uint16_t *train = make_rows(n_train);
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = NL;
    p.n_kv_heads = NH;
    p.key_dim = p.value_dim = HD;
    p.k = 256;
    p.k_stages = 4;
    p.v_stages = 2;
    p.max_iters = iters;
    fkvf_rows blk = {train, n_train, FKVF_DTYPE_F16, 0};
    fkvf_rvq *q = NULL;
    int rc = fkvf_rvq_train(&q, &p, &blk, 1, NULL);
    if (rc)
        die("fkvf_rvq_train", rc, NULL);
    free(train);
    double t_train = now() - t0;
    uint16_t *pool = make_rows(POOL);

    printf("GPT-2 shape: %d layers x %d KV heads x %d dims, f16 rows of %zu bytes; RVQ k = 256, "
           "K x4 V x2 (%zu codes per position), trained on %zu synthetic positions, %u "
           "iterations (%.1f s); sinks %d; files in %s\n\n",
           NL, NH, HD, ROW_BYTES, fkvf_rvq_codes_per_position(q), n_train, iters, t_train,
           SINKS, dir);
    printf("| positions | window | commit every | sync | wall s | wall us/pos | encode | rest | "
           "CPU us/pos | encode | rest | bytes/pos appended |\n");
    printf("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");

    /* warm-up, not reported: the first archive of a process pays for first
     * touches (heap growth, page cache, the codebook's pages) */
    stub_encode = stub_from != 0;
    (void)run(dir, q, pool, 1024, 32, 16, FKVF_SYNC_NONE);
    (void)run(dir, q, pool, 1024, 0, 1024, FKVF_SYNC_NONE);

    static const uint32_t windows[2] = {32, 0};
    result *res = xmalloc(n_sizes * 8 * sizeof *res);
    size_t nres = 0;
    for (size_t si = 0; si < n_sizes; si++)
        for (int wi = 0; wi < 2; wi++) {
            if (windows[wi] && sizes[si] > window_max)
                continue;
            for (int ei = 0; ei < n_everys; ei++)
                for (unsigned sync = FKVF_SYNC_NONE + 1; sync-- > 0;) {
                    if (sync == FKVF_SYNC_COMMIT && sizes[si] > sync_max)
                        continue;
                    stub_encode = stub_from && sizes[si] >= stub_from;
                    res[nres] = run(dir, q, pool, sizes[si], windows[wi], everys[ei], sync);
                    print_row(&res[nres]);
                    nres++;
                }
        }

    /* ratios: cost per position at the largest size over the smallest, per series */
    printf("\ncost(n1) / cost(n0) per position:\n\n");
    printf("| window | commit every | sync | n0 -> n1 | wall | wall encode | wall rest | CPU | "
           "CPU encode | CPU rest |\n");
    printf("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < nres; i++) {
        const result *lo = NULL, *hi = NULL;
        int first = 1;
        for (size_t j = 0; j < nres; j++) {
            if (res[j].window != res[i].window || res[j].every != res[i].every ||
                res[j].sync != res[i].sync || res[j].stub != res[i].stub)
                continue;
            if (j < i)
                first = 0;
            if (!lo || res[j].n < lo->n)
                lo = &res[j];
            if (!hi || res[j].n > hi->n)
                hi = &res[j];
        }
        if (!first || lo == hi)
            continue;
        double w0 = lo->total / (double)lo->n, w1 = hi->total / (double)hi->n;
        double c0 = lo->cpu / (double)lo->n, c1 = hi->cpu / (double)hi->n;
        double ew0 = lo->enc_wall / (double)lo->n, ew1 = hi->enc_wall / (double)hi->n;
        double ec0 = lo->enc_cpu / (double)lo->n, ec1 = hi->enc_cpu / (double)hi->n;
        printf("| %u | %u | %s | %llu -> %llu | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n",
               res[i].window, res[i].every, res[i].sync == FKVF_SYNC_NONE ? "none" : "commit",
               (unsigned long long)lo->n, (unsigned long long)hi->n, w1 / w0, ew1 / ew0,
               (w1 - ew1) / (w0 - ew0), c1 / c0, ec1 / ec0, (c1 - ec1) / (c0 - ec0));
    }
    free(res);
    free(pool);
    fkvf_rvq_free(q);
    return 0;
}

/* ---- --live: the footprint of a live archive, automatic compaction ------- */

/* Bytes written through the appender's io, and the bytes written to the
 * descriptor of the first write since the last reset (the archive's, not a
 * compaction's temporary file). */
typedef struct live_io {
    uint64_t total, main_bytes;
    int main_fd;
} live_io;

static long long lio_write(void *opaque, int fd, const void *data, size_t size)
{
    live_io *l = opaque;
    ssize_t n = write(fd, data, size);
    if (n > 0) {
        l->total += (uint64_t)n;
        if (l->main_fd < 0)
            l->main_fd = fd;
        if (fd == l->main_fd)
            l->main_bytes += (uint64_t)n;
    }
    return (long long)n;
}

static int lio_sync(void *opaque, int fd)
{
    (void)opaque;
    return fdatasync(fd);
}

static double proc_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct live_run {
    double cpu, wall;
    uint64_t written, final_size;
    uint64_t *compacted_at; /* commit numbers (1-based) that compacted */
    size_t n_compacted;
    /* the footprint run */
    double peak_size, peak_blocks, final_ratio, transient;
} live_run;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* fkvf_archive_compact of path into scratch; *size, *blocks of the result. */
static void scratch_compact(const char *path, const char *scratch, double *size, double *blocks)
{
    fkvf_compact_options co;
    fkvf_compact_options_init(&co);
    co.sync = FKVF_SYNC_NONE;
    fkvf_archive_op *op = NULL;
    int rc = fkvf_archive_compact(&op, path, scratch, &co, NULL);
    if (rc) {
        fkvf_error_info e;
        fkvf_archive_op_error(op, &e);
        die("fkvf_archive_compact", rc, e.message);
    }
    fkvf_archive_op_free(op);
    struct stat sb;
    if (stat(scratch, &sb) != 0) {
        perror(scratch);
        exit(1);
    }
    *size = (double)sb.st_size;
    *blocks = (double)sb.st_blocks * 512.0;
    unlink(scratch);
}

/* One run: n positions, every per commit; auto: the default automatic
 * compaction, else none. probe (the footprint run): the commits of an
 * earlier run's compactions, before which the file is measured. */
static live_run live_once(const char *dir, const fkvf_rvq *q, const uint16_t *pool, uint64_t n,
                          uint32_t every, uint32_t window, int auto_on, const live_run *probe)
{
    char path[512], scratch[520];
    snprintf(path, sizeof path, "%s/bench-live-%ld.fkvf", dir, (long)getpid());
    snprintf(scratch, sizeof scratch, "%s.cmp", path);
    unlink(path);
    fkvf_desc d = gpt2_desc(window);
    fkvf_append_create c;
    memset(&c, 0, sizeof c);
    c.desc = &d;
    c.codebook = q;
    live_io lio = {0, 0, -1};
    fkvf_io io = {lio_write, lio_sync, &lio};
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.io = &io;
    o.no_auto_compact = !auto_on;
    fkvf_appender *a = NULL;
    int rc = fkvf_appender_create(&a, path, &c, &o, NULL);
    if (rc)
        die("fkvf_appender_create", rc, a ? fkvf_appender_message(a) : NULL);
    live_run r;
    memset(&r, 0, sizeof r);
    size_t cap = 64, next_probe = 0;
    r.compacted_at = xmalloc(cap * sizeof *r.compacted_at);
    lio.total = 0; /* commit 1 (create) is not appended data */
    uint64_t commit = 0, last_size = 0;
    for (uint64_t p = 0; p < n;) {
        size_t m = (size_t)(n - p < every ? n - p : every);
        size_t off = (size_t)(p % POOL);
        lio.main_fd = -1;
        lio.main_bytes = 0;
        double t0 = now(), c0 = proc_cpu();
        if (off + m <= POOL) {
            rc = fkvf_appender_append(a, pool + off * ROW_ELEMS, m * ROW_BYTES, m, NULL);
        } else {
            size_t m1 = POOL - off;
            rc = fkvf_appender_append(a, pool + off * ROW_ELEMS, m1 * ROW_BYTES, m1, NULL);
            if (!rc)
                rc = fkvf_appender_append(a, pool, (m - m1) * ROW_BYTES, m - m1, NULL);
        }
        if (rc)
            die("fkvf_appender_append", rc, fkvf_appender_message(a));
        rc = fkvf_appender_commit(a);
        r.wall += now() - t0;
        r.cpu += proc_cpu() - c0;
        if (rc || fkvf_appender_message(a)[0])
            die("fkvf_appender_commit", rc, fkvf_appender_message(a));
        commit++;
        p += m;
        fkvf_append_info ai;
        fkvf_appender_info(a, &ai);
        if (auto_on && ai.commit_seq == 1) {
            if (r.n_compacted == cap) {
                cap *= 2;
                uint64_t *t = realloc(r.compacted_at, cap * sizeof *t);
                if (!t)
                    die("realloc", FKVF_E_NOMEM, NULL);
                r.compacted_at = t;
            }
            r.compacted_at[r.n_compacted++] = commit;
            /* the old file (its size before this commit plus the commit's
             * bytes) and the new one existed together */
            double old_sz = (double)(last_size + lio.main_bytes), cs = (double)ai.file_size;
            if (probe && (old_sz + cs) / cs > r.transient)
                r.transient = (old_sz + cs) / cs;
        }
        last_size = ai.file_size;
        int at_probe = probe && next_probe < probe->n_compacted &&
                       probe->compacted_at[next_probe] == commit + 1;
        if (probe && next_probe < probe->n_compacted && probe->compacted_at[next_probe] <= commit)
            next_probe++;
        if (at_probe || (probe && p >= n)) {
            struct stat sb;
            if (stat(path, &sb) != 0) {
                perror(path);
                exit(1);
            }
            double cs, cb;
            scratch_compact(path, scratch, &cs, &cb);
            double rs = (double)sb.st_size / cs, rb = (double)sb.st_blocks * 512.0 / cb;
            if (rs > r.peak_size)
                r.peak_size = rs;
            if (rb > r.peak_blocks)
                r.peak_blocks = rb;
            if (p >= n)
                r.final_ratio = rs > rb ? rs : rb;
        }
    }
    fkvf_appender_free(a);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        perror(path);
        exit(1);
    }
    r.final_size = (uint64_t)sb.st_size;
    r.written = lio.total;
    if (!auto_on && !probe) {
        /* without it: how far the file is from its compaction at the end */
        double cs, cb;
        scratch_compact(path, scratch, &cs, &cb);
        r.final_ratio = (double)sb.st_size / cs;
    }
    unlink(path);
    return r;
}

static int live_main(int argc, char **argv)
{
    uint64_t n = 8192;
    uint32_t every = 8, window = 32, iters = 1;
    int pairs = 3;
    size_t n_train = 256; /* the codebook's quality does not matter here, its size does */
    const char *dir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    for (int i = 2; i < argc; i += 2) { /* --option value */
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!v)
            goto usage;
        unsigned long long x = strtoull(v, &end, 10);
        if (!strcmp(argv[i], "--dir")) {
            dir = v;
        } else if (*end || x == 0) {
            goto usage;
        } else if (!strcmp(argv[i], "--positions")) {
            n = x;
        } else if (!strcmp(argv[i], "--every") && x <= UINT32_MAX) {
            every = (uint32_t)x;
        } else if (!strcmp(argv[i], "--window") && x <= UINT32_MAX) {
            window = (uint32_t)x;
        } else if (!strcmp(argv[i], "--pairs") && x <= 100) {
            pairs = (int)x;
        } else if (!strcmp(argv[i], "--train") && x >= 16) {
            n_train = (size_t)x;
        } else if (!strcmp(argv[i], "--iters") && x <= 1000) {
            iters = (uint32_t)x;
        } else {
            goto usage;
        }
    }
    double t0 = now();
    uint16_t *train = make_rows(n_train);
    fkvf_rvq_params p;
    fkvf_rvq_params_init(&p);
    p.n_layers = NL;
    p.n_kv_heads = NH;
    p.key_dim = p.value_dim = HD;
    p.k = 256;
    p.k_stages = 4;
    p.v_stages = 2;
    p.max_iters = iters;
    fkvf_rows blk = {train, n_train, FKVF_DTYPE_F16, 0};
    fkvf_rvq *q = NULL;
    int rc = fkvf_rvq_train(&q, &p, &blk, 1, NULL);
    if (rc)
        die("fkvf_rvq_train", rc, NULL);
    free(train);
    uint16_t *pool = make_rows(POOL);
    printf("live archive: GPT-2 shape %dx%dx%d, k = 256, K x4 V x2 (codebook trained on %zu "
           "positions, %.1f s); %llu positions, commit every %u, window %u, sync none, "
           "files in %s\n\n", NL, NH, HD, n_train, now() - t0, (unsigned long long)n, every,
           window, dir);
    printf("| pair | CPU s with | CPU s without | ratio | wall s with | wall s without | "
           "compactions | bytes written with | without |\n|---:|---:|---:|---:|---:|---:|---:|"
           "---:|---:|\n");
    double *ratios = xmalloc((size_t)pairs * sizeof *ratios);
    live_run first, off_last, fp;
    memset(&first, 0, sizeof first);
    memset(&fp, 0, sizeof fp);
    memset(&off_last, 0, sizeof off_last);
    for (int k = 0; k < pairs; k++) {
        live_run on, off;
        /* from the second pair on, the runs with it measure the footprint
         * too (outside the timed calls) */
        const live_run *probe = k ? &first : NULL;
        if (k % 2 == 0) { /* alternate which goes first */
            on = live_once(dir, q, pool, n, every, window, 1, probe);
            off = live_once(dir, q, pool, n, every, window, 0, NULL);
        } else {
            off = live_once(dir, q, pool, n, every, window, 0, NULL);
            on = live_once(dir, q, pool, n, every, window, 1, probe);
        }
        ratios[k] = on.cpu / off.cpu;
        printf("| %d | %.2f | %.2f | %.3f | %.2f | %.2f | %zu | %llu | %llu |\n", k + 1, on.cpu,
               off.cpu, ratios[k], on.wall, off.wall, on.n_compacted,
               (unsigned long long)on.written, (unsigned long long)off.written);
        fflush(stdout);
        if (k == 0) {
            first = on;
        } else {
            free(fp.compacted_at);
            fp = on;
        }
        free(off_last.compacted_at);
        off_last = off;
    }
    qsort(ratios, (size_t)pairs, sizeof *ratios, cmp_double);
    double med = pairs % 2 ? ratios[pairs / 2] : (ratios[pairs / 2 - 1] + ratios[pairs / 2]) / 2;
    if (pairs < 2) /* the footprint needs a run after the first */
        fp = live_once(dir, q, pool, n, every, window, 1, &first);
    if (fp.n_compacted != first.n_compacted)
        fprintf(stderr, "bench_append: the footprint run compacted %zu times, the first %zu\n",
                fp.n_compacted, first.n_compacted);
    double rewritten = ((double)first.written - (double)off_last.written) /
                       (double)off_last.written;
    double peak = fp.peak_size > fp.peak_blocks ? fp.peak_size : fp.peak_blocks;
    printf("\nwith automatic compaction (default ratio %.2f): footprint / compacted at the "
           "commits before each compaction and at the end: peak %.3f (st_size) %.3f "
           "(st_blocks), final %.3f; while a compaction runs (old + new file) at most %.3f; "
           "%zu compactions, %.2f bytes rewritten per byte appended\n",
           FKVF_APPEND_COMPACT_RATIO, fp.peak_size, fp.peak_blocks, fp.final_ratio,
           fp.transient, first.n_compacted, rewritten);
    printf("without it: final file / compacted %.3f\n", off_last.final_ratio);
    printf("append CPU time with / without (median of %d pairs): %.3f\n\n", pairs, med);
    printf("RESULT live_peak_ratio=%.3f live_final_ratio=%.3f append_slowdown=%.3f "
           "off_final_ratio=%.3f rewritten_per_appended=%.2f compactions=%zu "
           "transient_peak_ratio=%.3f\n",
           peak, fp.final_ratio, med, off_last.final_ratio, rewritten, first.n_compacted,
           fp.transient);
    free(first.compacted_at);
    free(off_last.compacted_at);
    free(fp.compacted_at);
    free(ratios);
    free(pool);
    fkvf_rvq_free(q);
    return 0;
usage:
    fprintf(stderr, "usage: bench_append --live [--positions N] [--every C] [--window W] "
                    "[--pairs P] [--dir DIR] [--train N] [--iters I]\n");
    return 2;
}
