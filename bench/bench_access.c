/* Random-access benchmark (fkvf_reader_read) on the GPT-2-small shape:
 * 12 layers x 12 KV heads x 64 dims, f16, keys x4 and values x2 RVQ stages
 * of k = 256 (f16 tables), quad 8-bit index streams, keys archived before
 * RoPE, 4 sink + 32 recent exact positions.
 *
 *   bench_access [n_positions [open_sizes_mb]]
 *       n_positions     positions of the main archive (32768)
 *       open_sizes_mb   comma-separated archive sizes for the open-time table
 *                       (1,100,1000); 0 skips it
 *
 * (a) latency of one position (all heads, K + V; and one layer / one head):
 *     warm (blocks verified; for whole positions with the reader's index
 *     row cache off, and after every archived position was read once: the
 *     cache filled as far as its 16 MiB go), the same position again, cold
 *     (first touch of its blocks), and the first read after open (codebook
 *     load included);
 * (b) one layer for all positions, LAYOUT_HEADS: first pass and warm;
 * (c) 4096 positions: fkvf_reader_restore and fkvf_reader_read against
 *     pread of the same f16 bytes from a raw file and memcpy, same run;
 * (d) fkvf_reader_open_file of single-commit archives of about 1 MB, 100 MB,
 *     1 GB (external codebook reference, so that the index streams make up
 *     the size), page cache warm and after posix_fadvise(DONTNEED).
 * Files go to $TMPDIR (/tmp) and are removed. Output: markdown tables. */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FKVF_STATIC_LINKING_ONLY /* fkvf_reader_set_row_cache */
#include "fkvf.h"

enum { NL = 12, NH = 12, DIM = 64, KS = 4, VS = 2, K = 256, SINKS = 4, RECENT = 32 };
#define NSTREAMS (NL * NH * (KS + VS))
#define ROW_ELEMS (NL * NH * 2 * DIM)
#define ROW_BYTES (ROW_ELEMS * 2)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = UINT64_C(0x853C49E6748FEA9B);
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}
static uint64_t below(uint64_t n) { return rnd() % n; }

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    memset(p, 0, n); /* touch every page before timing */
    return p;
}

static void die(const char *what, int rc, fkvf_reader *r, fkvf_writer *w)
{
    if (rc == FKVF_OK)
        return;
    fprintf(stderr, "%s: %s: %s\n", what, fkvf_error_name(rc),
            r ? fkvf_reader_message(r) : w ? fkvf_writer_message(w) : "");
    exit(1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
/* quantile q of n samples (sorts them) */
static double quant(double *t, int n, double q)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    int i = (int)(q * (n - 1) + 0.5);
    return t[i];
}

static const char *tmpdir(void)
{
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

static void fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* drop the file's pages from the page cache (clean pages only) */
static int drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return rc;
}

static void desc_init(fkvf_desc *d)
{
    memset(d, 0, sizeof *d);
    d->n_layers = NL;
    d->n_kv_heads = NH;
    d->key_dim = DIM;
    d->value_dim = DIM;
    d->dtype = FKVF_DTYPE_F16;
    d->key_transform = 1;
    d->rope_layout = 2;
    d->key_storage = 1;
    d->rope_dims = DIM;
    d->rope_theta = 10000.0;
    d->n_sinks = SINKS;
    d->window = RECENT;
    d->model_id = "gpt2 (synthetic)";
}

static uint16_t rand_f16(double scale)
{
    double u = (double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    return fkvf_f32_to_f16((float)(u * scale));
}

/* Exact rows of positions [first, first+n) (random f16). */
static uint8_t *random_rows(size_t n)
{
    uint16_t *r = xmalloc(n * ROW_BYTES);
    for (size_t i = 0; i < n * ROW_ELEMS; i++)
        r[i] = rand_f16(2.0);
    return (uint8_t *)r;
}

/* Index segments of [0, n_arch) written in pieces of at most `piece`
 * positions (one commit; each piece a STRM section extending the last). */
static void add_codes(fkvf_writer *w, uint64_t n_arch, uint64_t piece)
{
    fkvf_stream_spec sp = {FKVF_PROFILE_QUAD, 8, 0, 0, 0};
    uint64_t cap = piece < n_arch ? piece : n_arch;
    uint16_t *codes = xmalloc((size_t)(cap ? cap : 1) * NSTREAMS * sizeof *codes);
    for (uint64_t f = 0; f < n_arch; f += piece) {
        uint64_t n = n_arch - f < piece ? n_arch - f : piece;
        for (size_t i = 0; i < (size_t)n * NSTREAMS; i++)
            codes[i] = (uint16_t)below(K);
        die("add_index_segment", fkvf_writer_add_index_segment(w, &sp, f, n, codes, NSTREAMS, 1),
            NULL, w);
    }
    free(codes);
}

static fkvf_codebook_shape gpt2_shape(void)
{
    fkvf_codebook_shape sh = {NL, NH, DIM, DIM, K, KS, VS, FKVF_DTYPE_F16, 0, NULL};
    return sh;
}

/* The main archive: embedded codebook (random f16 tables), n positions. */
static void write_main(const char *path, uint64_t n)
{
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_writer *w;
    die("create", fkvf_writer_create_file(&w, path, &o, NULL), NULL, NULL);
    fkvf_desc d;
    desc_init(&d);
    die("set_desc", fkvf_writer_set_desc(w, &d), NULL, w);
    uint64_t n_arch = n - SINKS - RECENT;
    uint8_t *rows = random_rows(SINKS + RECENT);
    die("exact", fkvf_writer_add_exact(w, 0, SINKS, rows, SINKS * (size_t)ROW_BYTES, 0), NULL, w);
    die("exact",
        fkvf_writer_add_exact(w, SINKS + n_arch, RECENT, rows + SINKS * (size_t)ROW_BYTES,
                              RECENT * (size_t)ROW_BYTES, 0),
        NULL, w);
    free(rows);
    fkvf_codebook_shape sh = gpt2_shape();
    size_t tsz = (size_t)fkvf_codebook_size(&sh) - 64;
    uint16_t *tab = xmalloc(tsz);
    for (size_t i = 0; i < tsz / 2; i++)
        tab[i] = rand_f16(0.5);
    die("codebooks", fkvf_writer_add_codebooks(w, &sh, tab, tsz, 0), NULL, w);
    free(tab);
    add_codes(w, n_arch, n_arch);
    die("positions", fkvf_writer_set_positions(w, n, n_arch), NULL, w);
    die("finish", fkvf_writer_finish(w), NULL, w);
    fkvf_writer_free(w);
    fsync_path(path);
}

/* An archive of about `bytes` bytes for the open-time table, laid out as
 * fkvf compact writes one: 4 sinks and 4 recent exact rows, a reference to
 * an external codebook, every index stream in one STRM segment. */
static uint64_t write_sized(const char *path, uint64_t bytes, size_t *n_sections)
{
    uint64_t fixed = 8 * (uint64_t)ROW_BYTES + 4096;
    uint64_t n_arch = bytes > fixed ? (bytes - fixed) / NSTREAMS : 16;
    n_arch = (n_arch + 15) / 16 * 16;
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.required_features = FKVF_FEAT_EXTERNAL_CODEBOOK;
    fkvf_writer *w;
    die("create", fkvf_writer_create_file(&w, path, &o, NULL), NULL, NULL);
    fkvf_desc d;
    desc_init(&d);
    die("set_desc", fkvf_writer_set_desc(w, &d), NULL, w);
    uint8_t *rows = random_rows(8);
    die("exact", fkvf_writer_add_exact(w, 0, SINKS, rows, SINKS * (size_t)ROW_BYTES, 0), NULL, w);
    die("exact", fkvf_writer_add_exact(w, SINKS + n_arch, 4, rows + SINKS * (size_t)ROW_BYTES,
                                       4 * (size_t)ROW_BYTES, 0),
        NULL, w);
    free(rows);
    fkvf_codebook_shape sh = gpt2_shape();
    uint8_t hash[16];
    for (int i = 0; i < 16; i++)
        hash[i] = (uint8_t)rnd();
    die("codebook_ref", fkvf_writer_add_codebook_ref(w, &sh, hash, "gpt2.cbk"), NULL, w);
    add_codes(w, n_arch, n_arch);
    die("positions", fkvf_writer_set_positions(w, SINKS + n_arch + 4, n_arch), NULL, w);
    die("finish", fkvf_writer_finish(w), NULL, w);
    fkvf_writer_free(w);
    fsync_path(path);
    fkvf_reader *r;
    die("open", fkvf_reader_open_file(&r, path, 0, NULL), r, NULL);
    fkvf_archive_info info;
    die("info", fkvf_reader_info(r, &info), r, NULL);
    *n_sections = info.n_sections;
    fkvf_reader_free(r);
    return info.file_size;
}

static fkvf_read_request req_all(uint64_t first, uint64_t count)
{
    fkvf_read_request q = {first, count, 0, 0, 0, 0, 0, FKVF_DTYPE_F16, FKVF_LAYOUT_ROWS};
    return q;
}

/* latency of reads of single positions: samples in us */
static void time_reads(fkvf_reader *r, const fkvf_read_request *base, uint64_t lo, uint64_t n,
                       int same, int reps, uint8_t *buf, size_t size, double *t)
{
    uint64_t fixed = lo + below(n);
    for (int i = 0; i < reps; i++) {
        fkvf_read_request q = *base;
        q.first = same ? fixed : lo + below(n);
        double t0 = now();
        die("read", fkvf_reader_read(r, &q, buf, size), r, NULL);
        t[i] = (now() - t0) * 1e6;
    }
}

static void row_latency(const char *what, double *t, int n)
{
    double med = quant(t, n, 0.5), p10 = quant(t, n, 0.1), p90 = quant(t, n, 0.9);
    printf("| %s | %.1f | %.1f | %.1f | %d |\n", what, med, p10, p90, n);
}

int main(int argc, char **argv)
{
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 32768;
    const char *sizes = argc > 2 ? argv[2] : "1,100,1000";
    if (n < SINKS + RECENT + 4096 + 64) {
        fprintf(stderr, "n_positions must be at least %d\n", SINKS + RECENT + 4096 + 64);
        return 2;
    }
    char path[512], raw[512];
    snprintf(path, sizeof path, "%s/bench_access_%ld.fkvf", tmpdir(), (long)getpid());
    snprintf(raw, sizeof raw, "%s/bench_access_%ld.raw", tmpdir(), (long)getpid());
    double t0 = now();
    write_main(path, n);
    struct stat st;
    stat(path, &st);
    uint64_t n_arch = n - SINKS - RECENT;
    printf("GPT-2 shape: %d layers x %d KV heads x %d dims, f16; K x%d V x%d stages, k = %d "
           "(f16 tables, random), quad 8-bit index streams, keys before RoPE (half-split, "
           "theta 1e4); %llu positions (%d sink + %d recent exact, %llu archived, random "
           "codes); archive %.1f MB written in %.1f s\n\n",
           NL, NH, DIM, KS, VS, K, (unsigned long long)n, SINKS, RECENT,
           (unsigned long long)n_arch, (double)st.st_size / 1e6, now() - t0);

    size_t one = ROW_BYTES;
    uint8_t *buf = xmalloc(one);
    enum { REPS = 2000, COLD = 15 };
    static double t[REPS];

    /* ---- (a) latency ---- */
    printf("(a) latency of one read, microseconds (median, p10, p90 over the samples)\n\n");
    printf("| read | median us | p10 us | p90 us | samples |\n|---|---|---|---|---|\n");
    fkvf_read_request all1 = req_all(SINKS, 1);
    fkvf_read_request lh1 = all1;
    lh1.layer_first = 5;
    lh1.layer_count = 1;
    lh1.head_first = 7;
    lh1.head_count = 1;
    /* first read after open: builds the codebook (113 MB of binary32 tables
     * for the quantizer) and verifies the blocks it touches */
    for (int i = 0; i < 5; i++) {
        fkvf_reader *r;
        die("open", fkvf_reader_open_file(&r, path, 0, NULL), r, NULL);
        fkvf_read_request q = all1;
        q.first = SINKS + below(n_arch);
        double a = now();
        die("read", fkvf_reader_read(r, &q, buf, one), r, NULL);
        t[i] = (now() - a) * 1e6;
        fkvf_reader_free(r);
    }
    row_latency("first read after open (codebook load + first touch), 1 position, all heads, K+V",
                t, 5);
    /* cold blocks: a reader whose codebook is loaded, then a position whose
     * blocks nothing has touched yet (a different 4096-byte block of every
     * stream: positions 4096 apart) */
    {
        fkvf_reader *r;
        die("open", fkvf_reader_open_file(&r, path, 0, NULL), r, NULL);
        fkvf_read_request q = all1;
        q.first = SINKS;
        die("read", fkvf_reader_read(r, &q, buf, one), r, NULL);
        int nc = 0;
        for (uint64_t a = 4096; a + 1 < n_arch && nc < COLD; a += 4096) {
            q.first = SINKS + a;
            double b = now();
            die("read", fkvf_reader_read(r, &q, buf, one), r, NULL);
            t[nc++] = (now() - b) * 1e6;
        }
        fkvf_reader_free(r);
        if (nc)
            row_latency("cold: first touch of its blocks (864 blocks verified), 1 position, all "
                        "heads, K+V",
                        t, nc);
    }
    fkvf_reader *r;
    die("open", fkvf_reader_open_file(&r, path, 0, NULL), r, NULL);
    /* (b) first: one layer, all positions, blocks cold; every layer once
     * verifies every block (the warm state of (a)) */
    size_t lsz;
    fkvf_read_request lay = req_all(0, n);
    lay.layer_count = 1;
    lay.layout = FKVF_LAYOUT_HEADS;
    die("read_size", fkvf_reader_read_size(r, &lay, &lsz), r, NULL);
    uint8_t *lbuf = xmalloc(lsz);
    double lay_first[NL], lay_warm[NL];
    for (uint32_t l = 0; l < NL; l++) {
        lay.layer_first = l;
        double a = now();
        die("read layer", fkvf_reader_read(r, &lay, lbuf, lsz), r, NULL);
        lay_first[l] = now() - a;
    }
    die("set_row_cache", fkvf_reader_set_row_cache(r, 0), r, NULL);
    time_reads(r, &all1, SINKS, n_arch, 0, REPS, buf, one, t);
    row_latency("warm: 1 position, all 12x12 heads, K+V (random archived positions), row "
                "cache off",
                t, REPS);
    die("set_row_cache", fkvf_reader_set_row_cache(r, FKVF_ROW_CACHE_DEFAULT), r, NULL);
    for (uint64_t p = SINKS; p < SINKS + n_arch; p++) { /* the row cache filled */
        fkvf_read_request q = all1;
        q.first = p;
        die("read", fkvf_reader_read(r, &q, buf, one), r, NULL);
    }
    time_reads(r, &all1, SINKS, n_arch, 0, REPS, buf, one, t);
    row_latency("warm: 1 position, all 12x12 heads, K+V (random archived positions), row "
                "cache filled",
                t, REPS);
    time_reads(r, &all1, SINKS, n_arch, 1, REPS, buf, one, t);
    row_latency("warm: 1 position, all heads, K+V, the same position again", t, REPS);
    fkvf_read_request kv1 = all1;
    kv1.parts = FKVF_PART_KEYS;
    time_reads(r, &kv1, SINKS, n_arch, 0, REPS, buf, one, t);
    row_latency("warm: 1 position, all heads, keys only", t, REPS);
    time_reads(r, &lh1, SINKS, n_arch, 0, REPS, buf, one, t);
    row_latency("warm: 1 position, 1 layer, 1 head, K+V", t, REPS);
    fkvf_read_request l1 = all1;
    l1.layer_first = 3;
    l1.layer_count = 1;
    l1.layout = FKVF_LAYOUT_HEADS;
    time_reads(r, &l1, SINKS, n_arch, 0, REPS, buf, one, t);
    row_latency("warm: 1 position, 1 layer (12 heads), K+V, LAYOUT_HEADS", t, REPS);
    time_reads(r, &all1, SINKS + n_arch, RECENT, 0, REPS, buf, one, t);
    row_latency("exact (recent) position, all heads, K+V", t, REPS);
    for (int i = 0; i < REPS; i++) {
        uint64_t p = SINKS + below(n_arch);
        double a = now();
        die("restore", fkvf_reader_restore(r, p, 1, FKVF_DTYPE_F16, buf, one), r, NULL);
        t[i] = (now() - a) * 1e6;
    }
    row_latency("for comparison: fkvf_reader_restore of 1 archived position", t, REPS);

    /* ---- (b) one layer, all positions ---- */
    for (uint32_t l = 0; l < NL; l++) {
        lay.layer_first = l;
        double a = now();
        die("read layer", fkvf_reader_read(r, &lay, lbuf, lsz), r, NULL);
        lay_warm[l] = now() - a;
    }
    double bf = quant(lay_first, NL, 0.5), bw = quant(lay_warm, NL, 0.5);
    printf("\n(b) one layer (12 heads, K+V, f16, LAYOUT_HEADS) for all %llu positions: %.1f MB "
           "out; median over the 12 layers\n\n",
           (unsigned long long)n, (double)lsz / 1e6);
    printf("| pass | ms | positions/s | output MB/s |\n|---|---|---|---|\n");
    printf("| first (blocks verified on first touch) | %.1f | %.0f | %.0f |\n", bf * 1e3,
           (double)n / bf, (double)lsz / bf / 1e6);
    printf("| warm | %.1f | %.0f | %.0f |\n", bw * 1e3, (double)n / bw, (double)lsz / bw / 1e6);

    /* ---- (c) restore vs raw bytes ---- */
    enum { NC = 4096, CREP = 9 };
    size_t csz = (size_t)NC * ROW_BYTES;
    uint8_t *cbuf = xmalloc(csz), *cbuf2 = xmalloc(csz), *src = xmalloc(csz);
    uint64_t c0 = SINKS + n_arch / 2 - NC / 2;
    die("restore", fkvf_reader_restore(r, c0, NC, FKVF_DTYPE_F16, src, csz), r, NULL);
    {
        int fd = open(raw, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || write(fd, src, csz) != (ssize_t)csz) {
            fprintf(stderr, "cannot write %s\n", raw);
            return 1;
        }
        close(fd);
    }
    double tr[CREP], trd[CREP], tp[CREP], tm[CREP], th[CREP];
    int rfd = open(raw, O_RDONLY);
    for (int i = 0; i < CREP; i++) {
        double a = now();
        die("restore", fkvf_reader_restore(r, c0, NC, FKVF_DTYPE_F16, cbuf, csz), r, NULL);
        tr[i] = now() - a;
        fkvf_read_request q = req_all(c0, NC);
        a = now();
        die("read", fkvf_reader_read(r, &q, cbuf2, csz), r, NULL);
        trd[i] = now() - a;
        if (memcmp(cbuf, cbuf2, csz) != 0) {
            fprintf(stderr, "read differs from restore\n");
            return 1;
        }
        q.layout = FKVF_LAYOUT_HEADS;
        a = now();
        die("read", fkvf_reader_read(r, &q, cbuf2, csz), r, NULL);
        th[i] = now() - a;
        a = now();
        size_t got = 0;
        while (got < csz) {
            ssize_t k = pread(rfd, cbuf2 + got, csz - got, (off_t)got);
            if (k <= 0) {
                fprintf(stderr, "pread failed\n");
                return 1;
            }
            got += (size_t)k;
        }
        tp[i] = now() - a;
        a = now();
        memcpy(cbuf2, src, csz);
        tm[i] = now() - a;
        if (memcmp(cbuf, cbuf2, csz) != 0) {
            fprintf(stderr, "raw bytes differ\n");
            return 1;
        }
    }
    close(rfd);
    unlink(raw);
    /* each repetition times the five methods back to back: ratios are taken
     * within a repetition (the machine's load changes between them), then
     * the median over the repetitions */
    double *all[5] = {tr, trd, th, tp, tm};
    printf("\n(c) %d archived positions (%.1f MB of f16 rows), %d repetitions, each timing the "
           "five methods back to back; raw file in the page cache\n\n",
           NC, (double)csz / 1e6, CREP);
    printf("| method | median ms | best ms | MB/s (best) | x pread (median of ratios) | x memcpy "
           "(median of ratios) |\n|---|---|---|---|---|---|\n");
    const char *names[5] = {"fkvf_reader_restore", "fkvf_reader_read, all, LAYOUT_ROWS",
                            "fkvf_reader_read, all, LAYOUT_HEADS",
                            "pread of the same f16 bytes (raw file)", "memcpy of the same bytes"};
    for (int i = 0; i < 5; i++) {
        double rp[CREP], rm[CREP], tcopy[CREP];
        for (int k = 0; k < CREP; k++) {
            rp[k] = all[i][k] / tp[k];
            rm[k] = all[i][k] / tm[k];
            tcopy[k] = all[i][k];
        }
        double med = quant(tcopy, CREP, 0.5), best = quant(tcopy, CREP, 0.0);
        printf("| %s | %.1f | %.1f | %.0f | %.2f | %.2f |\n", names[i], med * 1e3, best * 1e3,
               (double)csz / best / 1e6, quant(rp, CREP, 0.5), quant(rm, CREP, 0.5));
    }
    free(cbuf);
    free(cbuf2);
    free(src);
    free(lbuf);
    free(buf);
    fkvf_reader_free(r);
    unlink(path);

    /* ---- (d) open time ---- */
    if (strcmp(sizes, "0") != 0) {
        printf("\n(d) fkvf_reader_open_file + fkvf_reader_free, single-commit archives "
               "as fkvf compact writes them (external codebook reference; the index streams in "
               "one STRM segment), median of 9 opens\n\n");
        printf("| archive | file MB | positions | sections | open ms, page cache warm | open ms, "
               "after POSIX_FADV_DONTNEED |\n|---|---|---|---|---|---|\n");
        char *list = strdup(sizes);
        for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
            uint64_t mb = strtoull(tok, NULL, 10);
            char p2[512];
            snprintf(p2, sizeof p2, "%s/bench_access_open_%ld_%llu.fkvf", tmpdir(),
                     (long)getpid(), (unsigned long long)mb);
            size_t nsec;
            uint64_t fsz = write_sized(p2, mb * 1000000, &nsec);
            fkvf_reader *o;
            die("open", fkvf_reader_open_file(&o, p2, 0, NULL), o, NULL);
            fkvf_archive_info info;
            fkvf_reader_info(o, &info);
            fkvf_reader_free(o);
            double tw[9], tc[9];
            int cold_ok = 1;
            for (int i = 0; i < 9; i++) {
                double a = now();
                die("open", fkvf_reader_open_file(&o, p2, 0, NULL), o, NULL);
                fkvf_reader_free(o);
                tw[i] = now() - a;
            }
            for (int i = 0; i < 9; i++) {
                if (drop_cache(p2) != 0)
                    cold_ok = 0;
                double a = now();
                die("open", fkvf_reader_open_file(&o, p2, 0, NULL), o, NULL);
                fkvf_reader_free(o);
                tc[i] = now() - a;
            }
            printf("| ~%llu MB | %.1f | %llu | %zu | %.3f | %.3f%s |\n", (unsigned long long)mb,
                   (double)fsz / 1e6, (unsigned long long)info.n_positions, nsec,
                   quant(tw, 9, 0.5) * 1e3, quant(tc, 9, 0.5) * 1e3,
                   cold_ok ? "" : " (fadvise failed)");
            unlink(p2);
        }
        free(list);
    }
    return 0;
}
