/* bench_remote: what reading an archive over HTTP range requests costs
 * (issue 18), against the same operations on the local file, paired.
 *
 *     bench_remote URL FILE [--codebooks LOCAL_FILE] [--reps N]
 *
 * URL serves the same bytes as FILE (bench/remote.sh starts nginx on
 * 127.0.0.1 and runs this). For each operation a fresh reader is opened,
 * on the URL (tools/cli_remote.c: libcurl, one kept connection) and on the
 * file (fkvf_reader_open_file), alternating which goes first, N times
 * (default 5):
 *   open      open + fkvf_reader_info
 *   position  open + one archived position, every layer, head, K and V
 *             (fkvf_reader_read; a different position each repetition)
 *   layer     open + layer 0 of every position, every head, K and V
 *   restore   open + fkvf_reader_restore of every position
 * An archive that refers to a codebook file gets LOCAL_FILE attached (a
 * node keeps its codebook; only the archive is remote). Per operation it
 * prints the bytes and requests the URL reader transferred (the same each
 * repetition but for the position's blocks), their share of the archive's
 * size, and the median wall milliseconds on the URL and on the file, one
 * line each:
 *   REMOTE op=position bytes=.. requests=.. share=.. url_ms=.. file_ms=..
 * Exit 0, or 1 with a message on stderr. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_remote.h"
#include "fkvf.h"

/* the remote source's notes (tools/cli_util.c has the CLI's; this program
 * links cli_remote.c alone) */
void cli_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("bench_remote: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int fail(const char *what, int rc, fkvf_reader *r)
{
    fprintf(stderr, "bench_remote: %s: %s%s%s\n", what, fkvf_strerror(rc), r ? ": " : "",
            r ? fkvf_reader_message(r) : "");
    return 1;
}

enum { OP_OPEN, OP_POSITION, OP_LAYER, OP_RESTORE, N_OPS };
static const char *const op_names[N_OPS] = {"open", "position", "layer", "restore"};

typedef struct ctx {
    const char *url, *file;
    fkvf_reader *cb; /* the local codebook file, or NULL */
    void *buf;
    size_t buf_size;
} ctx;

/* open (URL or file), attach the codebook when the archive refers to one,
 * run op; 0 or 1 */
static int run(ctx *c, int remote, int op, uint64_t pos)
{
    fkvf_reader *r = NULL;
    int rc = remote ? cli_remote_open(&r, c->url, 0) : fkvf_reader_open_file(&r, c->file, 0, NULL);
    if (rc) {
        fkvf_reader_free(r);
        return fail(remote ? c->url : c->file, rc, r);
    }
    fkvf_archive_info ai;
    if ((rc = fkvf_reader_info(r, &ai)))
        goto out;
    if (op != OP_OPEN && c->cb) {
        const char *name = NULL;
        uint8_t hash[16];
        int ext = 0;
        if (fkvf_reader_codebook_ref(r, &ext, hash, &name) == FKVF_OK && ext &&
            (rc = fkvf_reader_attach_codebook(r, c->cb)))
            goto out;
    }
    if (op == OP_POSITION || op == OP_LAYER) {
        fkvf_read_request q;
        memset(&q, 0, sizeof q);
        q.first = op == OP_POSITION ? pos : 0;
        q.count = op == OP_POSITION ? 1 : ai.n_positions;
        q.layer_count = op == OP_LAYER ? 1 : 0;
        q.dtype = FKVF_DTYPE_F16;
        size_t need;
        if ((rc = fkvf_reader_read_size(r, &q, &need)))
            goto out;
        if (need > c->buf_size) {
            fprintf(stderr, "bench_remote: buffer too small\n");
            fkvf_reader_free(r);
            return 1;
        }
        rc = fkvf_reader_read(r, &q, c->buf, need);
    } else if (op == OP_RESTORE) {
        rc = fkvf_reader_restore(r, 0, ai.n_positions, FKVF_DTYPE_F16, c->buf, c->buf_size);
    }
out:
    if (rc) {
        int st = fail(op_names[op], rc, r);
        fkvf_reader_free(r);
        return st;
    }
    fkvf_reader_free(r);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_remote URL FILE [--codebooks LOCAL_FILE] [--reps N]\n");
        return 2;
    }
    ctx c;
    memset(&c, 0, sizeof c);
    c.url = argv[1];
    c.file = argv[2];
    int reps = 5;
    const char *cbpath = NULL;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--codebooks"))
            cbpath = argv[i + 1];
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "bench_remote: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1 || reps > 1000) {
        fprintf(stderr, "bench_remote: --reps 1..1000\n");
        return 2;
    }
    int rc;
    if (cbpath && (rc = fkvf_reader_open_file(&c.cb, cbpath, 0, NULL)))
        return fail(cbpath, rc, c.cb);
    fkvf_reader *r = NULL;
    fkvf_archive_info ai;
    size_t row;
    fkvf_desc d;
    if ((rc = fkvf_reader_open_file(&r, c.file, 0, NULL)) || (rc = fkvf_reader_info(r, &ai)) ||
        (rc = fkvf_reader_desc(r, &d)) || (rc = fkvf_reader_row_bytes(r, FKVF_DTYPE_F16, &row)))
        return fail(c.file, rc, r);
    fkvf_reader_free(r);
    if (ai.n_archived == 0 || ai.n_positions > SIZE_MAX / row) {
        fprintf(stderr, "bench_remote: the archive has no archived position\n");
        return 1;
    }
    c.buf_size = (size_t)ai.n_positions * row;
    if (!(c.buf = malloc(c.buf_size))) {
        fprintf(stderr, "bench_remote: no memory for %zu bytes\n", c.buf_size);
        return 1;
    }
    double *tu = malloc((size_t)reps * sizeof *tu), *tf = malloc((size_t)reps * sizeof *tf);
    if (!tu || !tf)
        return 1;
    uint64_t seed = 12345;
    printf("bench_remote: %s (%llu bytes, %llu positions, %llu archived), %d repetitions\n",
           c.file, (unsigned long long)ai.file_size, (unsigned long long)ai.n_positions,
           (unsigned long long)ai.n_archived, reps);
    for (int op = 0; op < N_OPS; op++) {
        uint64_t bytes = 0, reqs = 0;
        for (int k = 0; k < reps; k++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            uint64_t pos = d.n_sinks + (seed >> 33) % ai.n_archived;
            for (int j = 0; j < 2; j++) {
                int remote = (j + k) % 2 == 0; /* the URL first in even repetitions */
                uint64_t b0, q0, b1, q1;
                cli_remote_totals(&b0, &q0);
                double t = now();
                if (run(&c, remote, op, pos))
                    return 1;
                t = now() - t;
                cli_remote_totals(&b1, &q1);
                if (remote) {
                    tu[k] = t;
                    bytes += b1 - b0;
                    reqs += q1 - q0;
                } else {
                    tf[k] = t;
                }
            }
        }
        qsort(tu, (size_t)reps, sizeof *tu, cmp_double);
        qsort(tf, (size_t)reps, sizeof *tf, cmp_double);
        double mb = (double)bytes / reps, mq = (double)reqs / reps;
        printf("REMOTE op=%s bytes=%.0f requests=%.1f share=%.4f url_ms=%.2f file_ms=%.2f\n",
               op_names[op], mb, mq, mb / (double)ai.file_size, tu[reps / 2] * 1e3,
               tf[reps / 2] * 1e3);
        fflush(stdout);
    }
    free(tu);
    free(tf);
    free(c.buf);
    fkvf_reader_free(c.cb);
    return 0;
}
