/* How the size of each write(2) call changes the cost of writing a large
 * file through the page cache and making it durable: the question behind
 * the 1 MiB cap of the tools' writes (tools/cacheio_stream.c PWRITE_MAX)
 * and `fkvf unpack`'s writeback kicks (bench/README.md, "unpack against
 * cp + sync").
 *
 *   bench_pwrite [--dir DIR] [--mib N] [--rounds R] [SIZE...]
 *       --dir DIR    where the file is written (default $TMPDIR or /tmp)
 *       --mib N      the file's size in MiB (2048)
 *       --rounds R   rounds (3)
 *       SIZE...      bytes per pwrite call to compare (default 262144
 *                    1048576 2097152 8388608)
 *
 * Per round and size: a fresh file, written from offset 4096 (a page-aligned
 * data region after a header, as unpack's outputs) in calls of SIZE bytes
 * from a buffer of random bytes, then fsync; "write" is the time of the
 * calls, "fsync" of the fsync. The sizes alternate in order within a round
 * (reversed every other round) so that a slow moment of the machine falls
 * on all of them. Also per round: "kicked", 1 MiB calls in per-layer
 * order with sync_file_range(SYNC_FILE_RANGE_WRITE) after each 64 MiB
 * (a layer of the Llama-3-8B shape at 16,384 positions), as unpack does.
 * Prints one line per (round, size) and, last, per size the median of the
 * write+fsync times and its ratio to the 1 MiB calls':
 *   RESULT size=<bytes> median_s=<s> vs_1mib=<ratio>
 * The file is removed at the end (and on each round). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_SIZES 16
#define MAX_ROUNDS 64
#define HEADER 4096u

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One file of total bytes in calls of `size` bytes; kick: sync_file_range
 * every `kick` bytes (0: never). Returns 0, the times in *w and *f. */
static int one_file(const char *path, const uint8_t *buf, size_t bufsz, uint64_t total,
                    size_t size, uint64_t kick, double *w, double *f)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        fprintf(stderr, "bench_pwrite: %s: %s\n", path, strerror(errno));
        return -1;
    }
    double t0 = now_s();
    uint64_t done = 0, last_kick = 0;
    while (done < total) {
        size_t n = total - done < size ? (size_t)(total - done) : size;
        size_t from = (size_t)(done % (bufsz - n + 1)); /* different bytes each call */
        ssize_t r = pwrite(fd, buf + from, n, (off_t)(HEADER + done));
        if (r <= 0) {
            fprintf(stderr, "bench_pwrite: write at %llu: %s\n", (unsigned long long)done,
                    r < 0 ? strerror(errno) : "nothing written");
            close(fd);
            return -1;
        }
        done += (uint64_t)r;
        if (kick && done - last_kick >= kick) {
            (void)sync_file_range(fd, (off_t)(HEADER + last_kick), (off_t)(done - last_kick),
                                  SYNC_FILE_RANGE_WRITE);
            last_kick = done;
        }
    }
    double t1 = now_s();
    int rc = fsync(fd);
    double t2 = now_s();
    close(fd);
    unlink(path);
    *w = t1 - t0;
    *f = t2 - t1;
    return rc;
}

int main(int argc, char **argv)
{
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    uint64_t mib = 2048;
    int rounds = 3, ns = 0;
    size_t sizes[MAX_SIZES];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (argv[i][0] != '-' && ns < MAX_SIZES - 1 && strtoull(argv[i], NULL, 10) > 0)
            sizes[ns++] = (size_t)strtoull(argv[i], NULL, 10);
        else {
            fprintf(stderr, "usage: bench_pwrite [--dir DIR] [--mib N] [--rounds R] [SIZE...]\n");
            return 2;
        }
    }
    if (!ns) {
        static const size_t def[] = {262144, 1048576, 2097152, 8388608};
        for (; ns < 4; ns++)
            sizes[ns] = def[ns];
    }
    if (rounds < 1 || rounds > MAX_ROUNDS || mib < 1 || mib > ((uint64_t)1 << 20)) {
        fprintf(stderr, "bench_pwrite: rounds 1..%d, mib 1..1048576\n", MAX_ROUNDS);
        return 2;
    }
    size_t bufsz = 0;
    for (int s = 0; s < ns; s++)
        bufsz = sizes[s] > bufsz ? sizes[s] : bufsz;
    bufsz += (size_t)1 << 20;
    uint8_t *buf = malloc(bufsz);
    if (!buf)
        return 2;
    uint64_t x = 0x9E3779B97F4A7C15u;
    for (size_t i = 0; i < bufsz; i++) { /* xorshift: bytes a disk cannot compress */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (uint8_t)(x >> 24);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/bench_pwrite.%ld.tmp", dir, (long)getpid());
    const uint64_t total = mib << 20;
    static double tot[MAX_SIZES + 1][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        for (int j = 0; j <= ns; j++) {
            int s = r % 2 ? ns - j : j; /* the kicked run is index ns */
            size_t size = s < ns ? sizes[s] : (size_t)1 << 20;
            uint64_t kick = s < ns ? 0 : (uint64_t)64 << 20;
            double w, f;
            if (one_file(path, buf, bufsz, total, size, kick, &w, &f)) {
                free(buf);
                return 1;
            }
            tot[s][r] = w + f;
            printf("round %d %s %zu: write %.3f s, fsync %.3f s, total %.3f s\n", r,
                   s < ns ? "size" : "kicked", size, w, f, w + f);
            fflush(stdout);
        }
    /* the 1 MiB calls: the reference (the first size of 1 MiB, else the kicked run's) */
    double ref = 0;
    for (int s = 0; s <= ns; s++) {
        qsort(tot[s], (size_t)rounds, sizeof(double), cmp_double);
        double med = tot[s][rounds / 2];
        if (!ref && (s == ns || sizes[s] == ((size_t)1 << 20)))
            ref = med;
    }
    for (int s = 0; s <= ns; s++) {
        double med = tot[s][rounds / 2];
        if (s < ns)
            printf("RESULT size=%zu median_s=%.3f vs_1mib=%.2f\n", sizes[s], med, med / ref);
        else
            printf("RESULT kicked_1mib median_s=%.3f vs_1mib=%.2f\n", med, med / ref);
    }
    free(buf);
    return 0;
}
