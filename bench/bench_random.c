/* One random archived position through fkvf_reader_read against one pread
 * and one memcpy of the same 36 KB row of a raw file, paired in one run
 * (issue 16, row 3). Public API only.
 *
 *   bench_random [n_positions [pairs [reads_per_pair]]]
 *       n_positions     positions of the archive (8192): 4 sinks and 32
 *                       recent positions exact, the rest archived
 *       pairs           alternating repetitions (9; at least 7 is sensible)
 *       reads_per_pair  random positions per method and repetition (1000)
 *
 * The archive: GPT-2-small shape (12 layers x 12 KV heads x head dim 64,
 * f16), an embedded codebook of k = 256 random f16 centroids, keys x4 and
 * values x2 stages, quad 8-bit index streams of random codes (one STRM
 * segment), keys archived before RoPE (half-split, theta 1e4). Random codes
 * are the worst case for the centroid rows' cache locality; the reader's work
 * does not otherwise depend on the values. The raw file is the f16 rows of
 * every position as fkvf_reader_restore returns them, [T][L][K|V][H][D]
 * (36,864 bytes a row), written next to the archive; the memcpy source is
 * that file mapped (MAP_POPULATE: page-cache pages, no faults while timed).
 *
 * Warm state before timing: the reader open, its codebook loaded and every
 * index block verified (one fkvf_reader_read of all positions), every
 * archived position read alone once (the reader's index row cache filled),
 * both files in the page cache. Then `pairs` repetitions of three back-to-back runs over
 * the same `reads_per_pair` random archived positions: fkvf_reader_read of
 * one position (all layers, heads, K and V, f16, LAYOUT_ROWS), pread of its
 * raw row, memcpy of its raw row. Each run is timed in process CPU time
 * (CLOCK_PROCESS_CPUTIME_ID, user + system); ratios are taken within a
 * repetition, then the median over the repetitions. Every read is checked
 * against the raw row outside the timed runs.
 *
 * After the pairs, for the breakdown (not in the RESULT line): the same
 * position read again and again (its codes and centroid rows in cache: what
 * is not memory latency); and, on a second reader whose index blocks are
 * all verified, reads of one random position in each 16-position block in
 * random order (each the first of its block: the index row cache's fill,
 * see fkvf_reader_set_row_cache) and the pairs' last positions again with
 * the row cache off.
 *
 * Files go to $TMPDIR (/tmp) and are removed. The last line of stdout:
 *   RESULT random_us=<median us per position> random_vs_pread=<median ratio>
 *          random_vs_memcpy=<median ratio>
 * (one line). */
#define _GNU_SOURCE /* MAP_POPULATE */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FKVF_STATIC_LINKING_ONLY /* fkvf_reader_set_row_cache */
#include "fkvf.h"

enum { NL = 12, NH = 12, DIM = 64, KS = 4, VS = 2, K = 256, SINKS = 4, RECENT = 32 };
#define NSTREAMS (NL * NH * (KS + VS))
#define ROW_ELEMS (NL * NH * 2 * DIM)
#define ROW_BYTES (ROW_ELEMS * 2)

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = UINT64_C(0x2545F4914F6CDD1D);
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "bench_random: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    memset(p, 0, n ? n : 1);
    return p;
}

static void die(const char *what, int rc, fkvf_reader *r, fkvf_writer *w)
{
    if (rc == FKVF_OK)
        return;
    fprintf(stderr, "bench_random: %s: %s: %s\n", what, fkvf_error_name(rc),
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
    double m = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
    free(t);
    return m;
}

static uint16_t rand_f16(double scale)
{
    double u = (double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    return fkvf_f32_to_f16((float)(u * scale));
}

static void write_archive(const char *path, uint64_t n)
{
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_writer *w;
    die("create", fkvf_writer_create_file(&w, path, &o, NULL), NULL, NULL);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = NL;
    d.n_kv_heads = NH;
    d.key_dim = DIM;
    d.value_dim = DIM;
    d.dtype = FKVF_DTYPE_F16;
    d.key_transform = 1;
    d.rope_layout = 2;
    d.key_storage = 1;
    d.rope_dims = DIM;
    d.rope_theta = 10000.0;
    d.n_sinks = SINKS;
    d.window = RECENT;
    d.model_id = "gpt2 (synthetic, bench_random)";
    die("set_desc", fkvf_writer_set_desc(w, &d), NULL, w);
    const uint64_t n_arch = n - SINKS - RECENT;
    uint16_t *rows = xmalloc((SINKS + RECENT) * (size_t)ROW_BYTES);
    for (size_t i = 0; i < (SINKS + RECENT) * (size_t)ROW_ELEMS; i++)
        rows[i] = rand_f16(2.0);
    die("exact", fkvf_writer_add_exact(w, 0, SINKS, rows, SINKS * (size_t)ROW_BYTES, 0), NULL, w);
    die("exact",
        fkvf_writer_add_exact(w, SINKS + n_arch, RECENT, rows + SINKS * (size_t)ROW_ELEMS,
                              RECENT * (size_t)ROW_BYTES, 0),
        NULL, w);
    free(rows);
    fkvf_codebook_shape sh = {NL, NH, DIM, DIM, K, KS, VS, FKVF_DTYPE_F16, 0, NULL};
    size_t tsz = (size_t)fkvf_codebook_size(&sh) - 64;
    uint16_t *tab = xmalloc(tsz);
    for (size_t i = 0; i < tsz / 2; i++)
        tab[i] = rand_f16(0.5);
    die("codebooks", fkvf_writer_add_codebooks(w, &sh, tab, tsz, 0), NULL, w);
    free(tab);
    fkvf_stream_spec sp = {FKVF_PROFILE_QUAD, 8, 0, 0, 0};
    uint16_t *codes = xmalloc((size_t)n_arch * NSTREAMS * sizeof *codes);
    for (size_t i = 0; i < (size_t)n_arch * NSTREAMS; i++)
        codes[i] = (uint16_t)(rnd() % K);
    die("index", fkvf_writer_add_index_segment(w, &sp, 0, n_arch, codes, NSTREAMS, 1), NULL, w);
    free(codes);
    die("positions", fkvf_writer_set_positions(w, n, n_arch), NULL, w);
    die("finish", fkvf_writer_finish(w), NULL, w);
    fkvf_writer_free(w);
}

/* The raw file: every position's f16 row as restore returns it. */
static void write_raw(fkvf_reader *r, const char *raw, uint64_t n)
{
    enum { CH = 256 };
    uint8_t *buf = xmalloc((size_t)CH * ROW_BYTES);
    int fd = open(raw, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror(raw);
        exit(1);
    }
    for (uint64_t p = 0; p < n; p += CH) {
        uint64_t c = n - p < CH ? n - p : CH;
        size_t sz = (size_t)c * ROW_BYTES;
        die("restore", fkvf_reader_restore(r, p, c, FKVF_DTYPE_F16, buf, sz), r, NULL);
        if (write(fd, buf, sz) != (ssize_t)sz) {
            perror(raw);
            exit(1);
        }
    }
    close(fd);
    free(buf);
}

int main(int argc, char **argv)
{
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 8192;
    int pairs = argc > 2 ? atoi(argv[2]) : 9;
    int reads = argc > 3 ? atoi(argv[3]) : 1000;
    if (n < SINKS + RECENT + 1 || pairs < 1 || reads < 1) {
        fprintf(stderr, "usage: bench_random [n_positions (>= %d) [pairs [reads_per_pair]]]\n",
                SINKS + RECENT + 1);
        return 2;
    }
    const char *td = getenv("TMPDIR");
    td = td && *td ? td : "/tmp";
    char path[512], raw[512];
    snprintf(path, sizeof path, "%s/bench_random_%ld.fkvf", td, (long)getpid());
    snprintf(raw, sizeof raw, "%s/bench_random_%ld.raw", td, (long)getpid());
    const uint64_t n_arch = n - SINKS - RECENT;
    double t0 = wall_now();
    write_archive(path, n);
    fkvf_reader *r;
    die("open", fkvf_reader_open_file(&r, path, 0, NULL), r, NULL);
    write_raw(r, raw, n);
    /* warm: every index block verified (restore above did it through
     * restore's own path; one read of everything through this one) */
    {
        size_t sz = (size_t)n_arch * ROW_BYTES;
        uint8_t *all = xmalloc(sz);
        fkvf_read_request q = {SINKS, n_arch, 0, 0, 0, 0, 0, FKVF_DTYPE_F16, FKVF_LAYOUT_ROWS};
        die("read", fkvf_reader_read(r, &q, all, sz), r, NULL);
        for (q.first = SINKS, q.count = 1; q.first < SINKS + n_arch; q.first++)
            die("read", fkvf_reader_read(r, &q, all, ROW_BYTES), r, NULL);
        free(all);
    }
    int fd = open(raw, O_RDONLY);
    if (fd < 0) {
        perror(raw);
        return 1;
    }
    size_t raw_size = (size_t)n * ROW_BYTES;
    const uint8_t *map = mmap(NULL, raw_size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (map == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    struct stat st;
    stat(path, &st);
    printf("bench_random: GPT-2 shape %dx%dx%d f16, K x%d V x%d, k = %d, %llu positions "
           "(%llu archived), archive %.1f MB, raw %.1f MB, built in %.1f s; %d pairs of %d "
           "random positions\n",
           NL, NH, DIM, KS, VS, K, (unsigned long long)n, (unsigned long long)n_arch,
           (double)st.st_size / 1e6, (double)raw_size / 1e6, wall_now() - t0, pairs, reads);

    uint64_t *pos = xmalloc((size_t)reads * sizeof *pos);
    uint8_t *out = xmalloc(ROW_BYTES), *dst = xmalloc(ROW_BYTES);
    double *us = xmalloc((size_t)pairs * sizeof *us), *wus = xmalloc((size_t)pairs * sizeof *wus);
    double *vp = xmalloc((size_t)pairs * sizeof *vp), *vm = xmalloc((size_t)pairs * sizeof *vm);
    double *pus = xmalloc((size_t)pairs * sizeof *pus), *mus = xmalloc((size_t)pairs * sizeof *mus);
    unsigned sink = 0;
    for (int k = 0; k < pairs; k++) {
        for (int i = 0; i < reads; i++)
            pos[i] = SINKS + rnd() % n_arch;
        double a = cpu_now(), aw = wall_now();
        for (int i = 0; i < reads; i++) {
            fkvf_read_request q = {pos[i], 1, 0, 0, 0, 0, 0, FKVF_DTYPE_F16, FKVF_LAYOUT_ROWS};
            die("read", fkvf_reader_read(r, &q, out, ROW_BYTES), r, NULL);
            sink += out[i % ROW_BYTES];
        }
        double tr = cpu_now() - a, trw = wall_now() - aw;
        a = cpu_now();
        for (int i = 0; i < reads; i++) {
            if (pread(fd, dst, ROW_BYTES, (off_t)(pos[i] * ROW_BYTES)) != ROW_BYTES) {
                perror("pread");
                return 1;
            }
            sink += dst[i % ROW_BYTES];
        }
        double tp = cpu_now() - a;
        a = cpu_now();
        for (int i = 0; i < reads; i++) {
            memcpy(dst, map + pos[i] * ROW_BYTES, ROW_BYTES);
            __asm__ __volatile__("" : : "r"(dst) : "memory");
            sink += dst[i % ROW_BYTES];
        }
        double tm = cpu_now() - a;
        /* outside the timing: every read equals its raw row */
        for (int i = 0; i < reads; i++) {
            fkvf_read_request q = {pos[i], 1, 0, 0, 0, 0, 0, FKVF_DTYPE_F16, FKVF_LAYOUT_ROWS};
            die("read", fkvf_reader_read(r, &q, out, ROW_BYTES), r, NULL);
            if (memcmp(out, map + pos[i] * ROW_BYTES, ROW_BYTES) != 0) {
                fprintf(stderr, "bench_random: position %llu: read differs from restore\n",
                        (unsigned long long)pos[i]);
                return 1;
            }
        }
        us[k] = tr / reads * 1e6;
        wus[k] = trw / reads * 1e6;
        pus[k] = tp / reads * 1e6;
        mus[k] = tm / reads * 1e6;
        vp[k] = tr / tp;
        vm[k] = tr / tm;
        printf("pair %d: read %.2f us (wall %.2f), pread %.2f us, memcpy %.2f us: x%.2f pread, "
               "x%.2f memcpy\n",
               k + 1, us[k], wus[k], pus[k], mus[k], vp[k], vm[k]);
    }
    {
        double same[9];
        for (int k = 0; k < 9; k++) {
            fkvf_read_request q = {pos[k], 1, 0, 0, 0, 0, 0, FKVF_DTYPE_F16, FKVF_LAYOUT_ROWS};
            double a = cpu_now();
            for (int i = 0; i < reads; i++)
                die("read", fkvf_reader_read(r, &q, out, ROW_BYTES), r, NULL);
            same[k] = (cpu_now() - a) / reads * 1e6;
        }
        printf("the same position again: %.2f us CPU (median of 9 x %d)\n", median(same, 9),
               reads);
    }
    {
        fkvf_reader *r2;
        die("open", fkvf_reader_open_file(&r2, path, 0, NULL), r2, NULL);
        size_t sz = (size_t)n_arch * ROW_BYTES;
        uint8_t *all = xmalloc(sz);
        fkvf_read_request q = {SINKS, n_arch, 0, 0, 0, 0, 0, FKVF_DTYPE_F16, FKVF_LAYOUT_ROWS};
        die("read", fkvf_reader_read(r2, &q, all, sz), r2, NULL); /* every block verified */
        free(all);
        size_t nb = (size_t)(n_arch / 16);
        uint64_t *blk = xmalloc((nb ? nb : 1) * sizeof *blk);
        for (size_t i = 0; i < nb; i++)
            blk[i] = i;
        for (size_t i = nb; i > 1; i--) { /* shuffled */
            size_t j = (size_t)(rnd() % i);
            uint64_t t = blk[i - 1];
            blk[i - 1] = blk[j];
            blk[j] = t;
        }
        double a = cpu_now();
        for (size_t i = 0; i < nb; i++) {
            fkvf_read_request q1 = {SINKS + blk[i] * 16 + rnd() % 16, 1, 0, 0, 0, 0, 0,
                                    FKVF_DTYPE_F16, FKVF_LAYOUT_ROWS};
            die("read", fkvf_reader_read(r2, &q1, out, ROW_BYTES), r2, NULL);
        }
        double cold = nb ? (cpu_now() - a) / (double)nb * 1e6 : 0;
        die("set_row_cache", fkvf_reader_set_row_cache(r2, 0), r2, NULL);
        a = cpu_now();
        for (int i = 0; i < reads; i++) {
            fkvf_read_request q1 = {pos[i], 1, 0, 0, 0, 0, 0, FKVF_DTYPE_F16, FKVF_LAYOUT_ROWS};
            die("read", fkvf_reader_read(r2, &q1, out, ROW_BYTES), r2, NULL);
        }
        double off = (cpu_now() - a) / reads * 1e6;
        printf("first read of a 16-position block (row cache fill): %.2f us CPU (%zu blocks); "
               "row cache off: %.2f us CPU\n",
               cold, nb, off);
        free(blk);
        fkvf_reader_free(r2);
    }
    printf("median: read %.2f us CPU (%.2f wall), pread %.2f us, memcpy %.2f us per position "
           "(checksum %u)\n",
           median(us, pairs), median(wus, pairs), median(pus, pairs), median(mus, pairs), sink);
    printf("RESULT random_us=%.2f random_vs_pread=%.2f random_vs_memcpy=%.2f\n", median(us, pairs),
           median(vp, pairs), median(vm, pairs));
    munmap((void *)(uintptr_t)map, raw_size);
    close(fd);
    fkvf_reader_free(r);
    unlink(raw);
    unlink(path);
    free(pos);
    free(out);
    free(dst);
    free(us);
    free(wus);
    free(vp);
    free(vm);
    free(pus);
    free(mus);
    return 0;
}
