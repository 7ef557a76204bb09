/* bench_anchor: the in-process anchors of bench/compare.sh for restore and
 * random access, on an archive of a raw cache and that raw cache itself.
 *
 *     bench_anchor RAW.npy ARCHIVE [--codebooks FILE] [--pairs N] [--reads N]
 *
 * RAW: the .npy the archive was packed from (its data, the last
 * n_positions x row_bytes bytes of the file, are read as if they were the
 * archive's f16 rows: same byte count per position, not the same layout).
 * ARCHIVE: the `fkvf pack` output; --codebooks FILE for one that refers to
 * a codebook file (else it is searched for next to the archive).
 *
 * Paired, N pairs (default 7), the order inside a pair alternating:
 *   restore: pread of all the raw bytes into a buffer, memcpy of the same
 *     bytes, fkvf_reader_restore of every position (f16 out): ratios of
 *     process CPU time (CLOCK_PROCESS_CPUTIME_ID; single-threaded) and of
 *     wall time, and GB/s of restored output per CPU second;
 *   random: --reads (default 1000) random archived positions, the same for
 *     the three methods of a pair: fkvf_reader_read of one position (all
 *     layers, heads, K and V, f16), a pread of one row's bytes (36 KB at the
 *     GPT-2-small shape) of the raw file, a memcpy of that row from memory:
 *     microseconds per position and their ratios, of CPU time (on a loaded
 *     machine wall time counts the other processes' time slices: a 2-core
 *     machine at a load of 10 multiplies it by 3-6), and the wall figures.
 * Everything runs warm: the raw file and the archive are read once first,
 * the first read (codebook build) happens before the pairs, and every
 * position is read alone once (fkvf_reader_read's index row cache filled,
 * as in a program that reads the archive's positions again and again;
 * bench_random prints what the first read of a block costs).
 * Per-pair ratios, then the median and the min over the pairs; the last line
 * of stdout is
 *   RESULT restore_vs_pread=.. restore_vs_memcpy=.. restore_gbps=..
 *          random_us=.. random_vs_pread=.. random_vs_memcpy=.. (CPU time),
 *          the same with _min (the min over the pairs), restore_vs_pread_wall,
 *          random_us_wall, random_vs_pread_wall (medians of wall time)
 * Exit 0, or 1 with a message on stderr. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fkvf.h"

static double clk(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct span {
    double wall, cpu;
} span;

static span start(void)
{
    span s = {clk(CLOCK_MONOTONIC), clk(CLOCK_PROCESS_CPUTIME_ID)};
    return s;
}

static span since(span s)
{
    span e = {clk(CLOCK_MONOTONIC) - s.wall, clk(CLOCK_PROCESS_CPUTIME_ID) - s.cpu};
    return e;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median of v[0..n) (sorts v) */
static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double minimum(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++)
        if (v[i] < m)
            m = v[i];
    return m;
}

/* what main owns, freed on every exit (bail) */
static struct {
    fkvf_reader *r, *cb;
    unsigned char *src, *dst, *one;
    uint64_t *pick;
    double *v[12];
    int fd;
} g = {.fd = -1};

static int bail(void)
{
    for (int k = 0; k < 12; k++)
        free(g.v[k]);
    free(g.src);
    free(g.dst);
    free(g.one);
    free(g.pick);
    if (g.fd >= 0)
        close(g.fd);
    fkvf_reader_free(g.r);
    fkvf_reader_free(g.cb);
    return 1;
}

static int fail(const char *what, int rc, const fkvf_reader *r)
{
    fprintf(stderr, "bench_anchor: %s: %s%s%s\n", what, fkvf_error_name(rc), r ? ": " : "",
            r ? fkvf_reader_message(r) : "");
    return bail();
}

/* pread exactly n bytes at off; 0 or -1 */
static int pread_all(int fd, unsigned char *dst, size_t n, off_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, dst + got, n - got, off + (off_t)got);
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

/* xorshift64*: the same random positions for every method of a pair */
static uint64_t rnd(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

static int count_arg(const char *v, long max, const char *name)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || n < 1 || n > max) {
        fprintf(stderr, "bench_anchor: %s must be 1..%ld, not '%s'\n", name, max, v);
        return -1;
    }
    return (int)n;
}

int main(int argc, char **argv)
{
    const char *raw = NULL, *arch = NULL, *cbpath = NULL;
    int pairs = 7, reads = 1000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--codebooks") && i + 1 < argc) {
            cbpath = argv[++i];
        } else if (!strcmp(argv[i], "--pairs") && i + 1 < argc) {
            if ((pairs = count_arg(argv[++i], 1000, "--pairs")) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--reads") && i + 1 < argc) {
            if ((reads = count_arg(argv[++i], 1000000, "--reads")) < 0)
                return 2;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: bench_anchor RAW.npy ARCHIVE [--codebooks FILE] [--pairs N] "
                            "[--reads N]\n");
            return 2;
        } else if (!raw) {
            raw = argv[i];
        } else if (!arch) {
            arch = argv[i];
        } else {
            fprintf(stderr, "bench_anchor: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!raw || !arch) {
        fprintf(stderr, "usage: bench_anchor RAW.npy ARCHIVE [--codebooks FILE] [--pairs N] "
                        "[--reads N]\n");
        return 2;
    }

    int rc = fkvf_reader_open_file(&g.r, arch, 0, NULL);
    fkvf_reader *r = g.r;
    if (rc != FKVF_OK)
        return fail(arch, rc, r);
    int ext = 0;
    uint8_t hash[16];
    const char *hint = NULL;
    rc = fkvf_reader_codebook_ref(r, &ext, hash, &hint);
    if (rc != FKVF_OK)
        return fail("codebook_ref", rc, r);
    if (ext && cbpath) {
        if ((rc = fkvf_reader_open_file(&g.cb, cbpath, 0, NULL)) != FKVF_OK)
            return fail(cbpath, rc, g.cb);
        if ((rc = fkvf_reader_attach_codebook(r, g.cb)) != FKVF_OK)
            return fail("attach_codebook", rc, r);
    } else if (ext && (rc = fkvf_reader_find_codebook(r, NULL, &g.cb)) != FKVF_OK) {
        return fail("find_codebook", rc, r);
    }
    fkvf_archive_info info;
    size_t row = 0;
    if ((rc = fkvf_reader_info(r, &info)) != FKVF_OK)
        return fail("info", rc, r);
    if ((rc = fkvf_reader_row_bytes(r, FKVF_DTYPE_F16, &row)) != FKVF_OK)
        return fail("row_bytes", rc, r);
    uint64_t npos = info.n_positions;
    if (npos == 0 || info.n_archived == 0 || npos > SIZE_MAX / row) {
        fprintf(stderr, "bench_anchor: %s: %llu positions, %llu archived: nothing to time\n",
                arch, (unsigned long long)npos, (unsigned long long)info.n_archived);
        return bail();
    }
    size_t total = (size_t)npos * row;

    int fd = g.fd = open(raw, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size < total) {
        fprintf(stderr, "bench_anchor: %s: cannot open, or smaller than the %zu bytes of %llu "
                        "rows of %zu bytes\n",
                raw, total, (unsigned long long)npos, row);
        return bail();
    }
    off_t data_off = (off_t)((uint64_t)st.st_size - total);
    unsigned char *src = g.src = malloc(total), *dst = g.dst = malloc(total),
                  *one = g.one = malloc(row);
    uint64_t *pick = g.pick = malloc((size_t)reads * sizeof *pick);
    double **v = g.v;
    int nomem = !src || !dst || !one || !pick;
    for (int k = 0; k < 12; k++)
        if (!(v[k] = malloc((size_t)pairs * sizeof(double))))
            nomem = 1;
    if (nomem) {
        fprintf(stderr, "bench_anchor: out of memory (2 x %zu bytes)\n", total);
        return bail();
    }
    /* warm: the raw bytes into the page cache and src, the codebook built,
     * the archive's pages touched and its blocks verified */
    if (pread_all(fd, src, total, data_off) != 0) {
        fprintf(stderr, "bench_anchor: %s: short read\n", raw);
        return bail();
    }
    if ((rc = fkvf_reader_restore(r, 0, npos, FKVF_DTYPE_F16, dst, total)) != FKVF_OK)
        return fail("restore", rc, r);

    uint64_t seed = 0x9E3779B97F4A7C15ULL;
    fkvf_read_request q;
    memset(&q, 0, sizeof q);
    q.count = 1;
    q.dtype = FKVF_DTYPE_F16;
    q.layout = FKVF_LAYOUT_ROWS;
    for (q.first = 0; q.first < npos; q.first++) /* the row cache filled */
        if ((rc = fkvf_reader_read(r, &q, dst, row)) != FKVF_OK)
            return fail("read", rc, r);
    double *rp = v[0], *rm = v[1], *rpw = v[2], *gbps = v[3], *us = v[4], *ap = v[5], *am = v[6];
    double *usw = v[7], *apw = v[8];
    for (int p = 0; p < pairs; p++) {
        /* restore pair: anchors first in even pairs, FKVF first in odd ones */
        span tp = {0, 0}, tm = {0, 0}, tr = {0, 0};
        for (int half = 0; half < 2; half++) {
            if ((half == 0) == (p % 2 == 0)) {
                span s = start();
                if (pread_all(fd, dst, total, data_off) != 0) {
                    fprintf(stderr, "bench_anchor: %s: short read\n", raw);
                    return bail();
                }
                tp = since(s);
                s = start();
                memcpy(dst, src, total);
                tm = since(s);
            } else {
                span s = start();
                rc = fkvf_reader_restore(r, 0, npos, FKVF_DTYPE_F16, dst, total);
                tr = since(s);
                if (rc != FKVF_OK)
                    return fail("restore", rc, r);
            }
        }
        rp[p] = tr.cpu / tp.cpu;
        rm[p] = tr.cpu / tm.cpu;
        rpw[p] = tr.wall / tp.wall;
        gbps[p] = (double)total / tr.cpu / 1e9;

        /* random pair: the same positions for the three methods */
        for (int i = 0; i < reads; i++) {
            uint64_t pos;
            int exact = 1;
            do {
                pos = rnd(&seed) % npos;
                if ((rc = fkvf_reader_is_exact(r, pos, &exact)) != FKVF_OK)
                    return fail("is_exact", rc, r);
            } while (exact);
            pick[i] = pos;
        }
        span ar = {0, 0}, apr = {0, 0}, amc = {0, 0};
        for (int half = 0; half < 2; half++) {
            if ((half == 0) == (p % 2 == 0)) {
                span s = start();
                for (int i = 0; i < reads; i++)
                    if (pread_all(fd, one, row, data_off + (off_t)(pick[i] * row)) != 0) {
                        fprintf(stderr, "bench_anchor: %s: short read\n", raw);
                        return bail();
                    }
                apr = since(s);
                s = start();
                for (int i = 0; i < reads; i++) {
                    memcpy(one, src + pick[i] * row, row);
                    __asm__ volatile("" : : "r"(one) : "memory");
                }
                amc = since(s);
            } else {
                span s = start();
                for (int i = 0; i < reads; i++) {
                    q.first = pick[i];
                    if ((rc = fkvf_reader_read(r, &q, one, row)) != FKVF_OK)
                        return fail("read", rc, r);
                }
                ar = since(s);
            }
        }
        us[p] = ar.cpu / reads * 1e6;
        ap[p] = ar.cpu / apr.cpu;
        am[p] = ar.cpu / amc.cpu;
        usw[p] = ar.wall / reads * 1e6;
        apw[p] = ar.wall / apr.wall;
        fprintf(stderr,
                "pair %d: restore %.3f s CPU (pread %.3f, memcpy %.3f); one position %.1f us "
                "CPU (pread %.1f, memcpy %.1f), %.1f us wall (pread %.1f)\n",
                p + 1, tr.cpu, tp.cpu, tm.cpu, us[p], apr.cpu / reads * 1e6,
                amc.cpu / reads * 1e6, usw[p], apr.wall / reads * 1e6);
    }
    printf("bench_anchor: %llu positions x %zu bytes (%.1f MB), %d pairs, %d random reads per "
           "pair\n",
           (unsigned long long)npos, row, (double)total / 1e6, pairs, reads);
    double mn[7];
    for (int k = 0; k < 7; k++)
        mn[k] = minimum(v[k], pairs);
    printf("RESULT restore_vs_pread=%.3f restore_vs_memcpy=%.3f restore_gbps=%.3f "
           "random_us=%.2f random_vs_pread=%.3f random_vs_memcpy=%.3f "
           "restore_vs_pread_min=%.3f restore_vs_memcpy_min=%.3f restore_gbps_min=%.3f "
           "random_us_min=%.2f random_vs_pread_min=%.3f random_vs_memcpy_min=%.3f "
           "restore_vs_pread_wall=%.3f random_us_wall=%.2f random_vs_pread_wall=%.3f\n",
           median(rp, pairs), median(rm, pairs), median(gbps, pairs), median(us, pairs),
           median(ap, pairs), median(am, pairs), mn[0], mn[1], mn[3], mn[4], mn[5], mn[6],
           median(rpw, pairs), median(usw, pairs), median(apw, pairs));
    bail();
    return 0;
}
