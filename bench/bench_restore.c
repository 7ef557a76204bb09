/* The C side of bench/bench_python.py: times one read of an archive through
 * the public API, so the Python binding's Archive.read can be compared with
 * it, timed the same way (one warm-up call, then the median of REPS calls).
 *
 *   bench_restore ARCHIVE MODE FIRST COUNT REPS [fresh]
 *       MODE restore  fkvf_reader_restore of positions [FIRST, FIRST+COUNT)
 *                     in the archive's dtype (rows, spec 14.2);
 *            read     fkvf_reader_read of the same positions, every layer and
 *                     head, keys then values as two requests in
 *                     FKVF_LAYOUT_HEADS into two buffers: the calls that
 *                     fkvf.Archive.read(positions=slice(FIRST, FIRST+COUNT))
 *                     makes.
 *
 * Output buffers are allocated once, outside the timing; with "fresh" each
 * timed call mallocs (and frees) its own, as Archive.read must (it returns
 * new arrays). FKVF_THREADS=N: restore decodes on N threads
 * (fkvf_reader_set_threads; default 1). Prints the median seconds per call on stdout (one number);
 * errors on stderr, exit 1. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fkvf.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int fail(fkvf_reader *r, int rc, const char *what)
{
    fkvf_error_info e;
    if (r && fkvf_reader_error(r, &e) == FKVF_OK && e.code != FKVF_OK)
        fprintf(stderr, "bench_restore: %s: %s\n", what, e.message);
    else
        fprintf(stderr, "bench_restore: %s: %s\n", what, fkvf_strerror(rc));
    return 1;
}

static int parse_u64(const char *s, unsigned long long *out)
{
    char *end;
    if (!*s || *s == '-')
        return -1;
    *out = strtoull(s, &end, 10);
    return *end ? -1 : 0;
}

typedef struct job {
    fkvf_reader *r;
    int restore, fresh;
    uint64_t first, count;
    fkvf_dtype dtype;
    fkvf_read_request kreq, vreq;
    void *out, *vout;
    size_t out_size, vout_size;
} job;

static int run_into(job *j, void *out, void *vout)
{
    if (j->restore)
        return fkvf_reader_restore(j->r, j->first, j->count, j->dtype, out, j->out_size);
    int rc = fkvf_reader_read(j->r, &j->kreq, out, j->out_size);
    return rc ? rc : fkvf_reader_read(j->r, &j->vreq, vout, j->vout_size);
}

static int run(job *j)
{
    if (!j->fresh)
        return run_into(j, j->out, j->vout);
    void *out = malloc(j->out_size ? j->out_size : 1);
    void *vout = malloc(j->vout_size ? j->vout_size : 1);
    int rc = out && vout ? run_into(j, out, vout) : FKVF_E_NOMEM;
    free(out);
    free(vout);
    return rc;
}

int main(int argc, char **argv)
{
    unsigned long long first, count, reps;
    if (argc < 6 || argc > 7 || (argc == 7 && strcmp(argv[6], "fresh")) ||
        (strcmp(argv[2], "restore") && strcmp(argv[2], "read")) ||
        parse_u64(argv[3], &first) || parse_u64(argv[4], &count) ||
        parse_u64(argv[5], &reps) || reps == 0 || reps > 100000) {
        fprintf(stderr, "usage: bench_restore ARCHIVE restore|read FIRST COUNT REPS [fresh]\n");
        return 2;
    }
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, argv[1], 0, NULL);
    if (rc) {
        int st = fail(r, rc, argv[1]);
        fkvf_reader_free(r);
        return st;
    }
    fkvf_reader *cb = NULL;
    fkvf_desc d;
    job j;
    memset(&j, 0, sizeof j);
    j.r = r;
    j.restore = strcmp(argv[2], "restore") == 0;
    j.fresh = argc == 7;
    j.first = first;
    j.count = count;
    double *t = NULL;
    int status = 1;
    if ((rc = fkvf_reader_desc(r, &d))) {
        status = fail(r, rc, "descriptor");
        goto out;
    }
    /* an external codebook next to the archive, as fkvf.open finds it */
    if ((rc = fkvf_reader_find_codebook(r, NULL, &cb)) && rc != FKVF_E_NOT_FOUND) {
        status = fail(r, rc, "codebook");
        goto out;
    }
    /* FKVF_THREADS: restore's decoding threads (fkvf_reader_set_threads) */
    const char *th = getenv("FKVF_THREADS");
    unsigned long long nth = 1;
    if (th && (parse_u64(th, &nth) || nth == 0 || nth > 256)) {
        fprintf(stderr, "bench_restore: FKVF_THREADS='%s' is not 1..256\n", th);
        goto out;
    }
    fkvf_reader_set_threads(r, (unsigned)nth);
    j.dtype = d.dtype;
    if (j.restore) {
        size_t row;
        if ((rc = fkvf_reader_row_bytes(r, d.dtype, &row))) {
            status = fail(r, rc, "row bytes");
            goto out;
        }
        if (count > SIZE_MAX / (row ? row : 1)) {
            fprintf(stderr, "bench_restore: %llu positions do not fit in memory\n", count);
            goto out;
        }
        j.out_size = (size_t)count * row;
    } else {
        fkvf_read_request q = {first, count, 0, d.n_layers, 0, d.n_kv_heads,
                               FKVF_PART_KEYS, d.dtype, FKVF_LAYOUT_HEADS};
        j.kreq = q;
        q.parts = FKVF_PART_VALUES;
        j.vreq = q;
        if ((rc = fkvf_reader_read_size(r, &j.kreq, &j.out_size)) ||
            (rc = fkvf_reader_read_size(r, &j.vreq, &j.vout_size))) {
            status = fail(r, rc, "read size");
            goto out;
        }
    }
    j.out = malloc(j.out_size ? j.out_size : 1);
    j.vout = malloc(j.vout_size ? j.vout_size : 1);
    t = malloc((size_t)reps * sizeof *t);
    if (!j.out || !j.vout || !t) {
        fprintf(stderr, "bench_restore: out of memory\n");
        goto out;
    }
    if ((rc = run(&j))) { /* warm-up: codebook tables, first touch of the blocks */
        status = fail(r, rc, "read");
        goto out;
    }
    for (unsigned long long i = 0; i < reps; i++) {
        double t0 = now();
        if ((rc = run(&j))) {
            status = fail(r, rc, "read");
            goto out;
        }
        t[i] = now() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    printf("%.9f\n", reps % 2 ? t[reps / 2] : (t[reps / 2 - 1] + t[reps / 2]) / 2);
    status = 0;
out:
    free(t);
    free(j.out);
    free(j.vout);
    fkvf_reader_free(r);
    fkvf_reader_free(cb);
    return status;
}
