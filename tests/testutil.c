#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

uint64_t tu_next(tu_rng *r)
{
    uint64_t z = (r->s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

uint32_t tu_below(tu_rng *r, uint32_t n) { return (uint32_t)(tu_next(r) % n); }

static long long buf_write(void *opaque, const void *data, size_t size)
{
    tu_buf *b = opaque;
    if (b->size + size > b->cap) {
        size_t ncap = b->cap ? b->cap : 4096;
        while (ncap < b->size + size)
            ncap *= 2;
        uint8_t *p = realloc(b->data, ncap);
        if (!p)
            return -1;
        b->data = p;
        b->cap = ncap;
    }
    memcpy(b->data + b->size, data, size);
    b->size += size;
    return (long long)size;
}

fkvf_sink tu_buf_sink(tu_buf *b)
{
    fkvf_sink s = {buf_write, NULL, b};
    return s;
}

void tu_buf_free(tu_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

uint8_t *tu_dup_odd(const void *data, size_t size)
{
    uint8_t *p = malloc(size + 2);
    if (!p)
        return NULL;
    if (size)
        memcpy(p + 1, data, size);
    return p + 1;
}

void tu_free_odd(uint8_t *p)
{
    if (p)
        free(p - 1);
}

int tu_host_le(void)
{
    const uint16_t one = 1;
    uint8_t b[2];
    memcpy(b, &one, sizeof b);
    return b[0] == 1;
}

void tu_le_swap(void *p, size_t n, size_t width)
{
    if (tu_host_le())
        return;
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++, b += width)
        for (size_t j = 0; j < width / 2; j++) {
            uint8_t t = b[j];
            b[j] = b[width - 1 - j];
            b[width - 1 - j] = t;
        }
}

uint16_t tu_ld16le(const void *p)
{
    const uint8_t *b = p;
    return (uint16_t)(b[0] | (b[1] << 8));
}

uint32_t tu_ld32le(const void *p)
{
    const uint8_t *b = p;
    return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
}

float tu_ldf32le(const void *p)
{
    uint32_t u = tu_ld32le(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float *tu_le_f32_copy(const float *p, size_t n)
{
    float *c = tu_xcalloc(n ? n : 1, sizeof(float));
    if (n)
        memcpy(c, p, n * sizeof(float));
    tu_le_f32(c, n);
    return c;
}

int tu_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ---- allocators ---------------------------------------------------------------- */

enum { TU_HDR = 16 }; /* keeps malloc's 16-byte alignment */

static size_t block_size(void *p)
{
    size_t n;
    memcpy(&n, (uint8_t *)p - TU_HDR, sizeof n);
    return n;
}

static void count_bytes(tu_alloc *ta, size_t less, size_t more)
{
    ta->bytes = ta->bytes - less + more;
    if (ta->bytes > ta->peak)
        ta->peak = ta->bytes;
}

/* a call fails: the fail_at-th, or any after it with fail_after */
static int call_fails(tu_alloc *ta)
{
    ta->calls++;
    if (ta->fail_at > 0 &&
        (ta->calls == ta->fail_at || (ta->fail_after && ta->calls > ta->fail_at))) {
        ta->failed = 1;
        return 1;
    }
    return 0;
}

static void *block_new(tu_alloc *ta, size_t n, int fill)
{
    uint8_t *h = malloc(TU_HDR + (n ? n : 1) + (fill ? 1 : 0));
    if (!h)
        return NULL;
    memcpy(h, &n, sizeof n);
    uint8_t *p = h + TU_HDR;
    if (fill) {
        memset(p, 0xA5, n);
        p[n] = 0;
    }
    ta->live++;
    count_bytes(ta, 0, n);
    return p;
}

static void block_free(tu_alloc *ta, void *p)
{
    if (!p)
        return;
    size_t n = block_size(p);
    ta->live--;
    count_bytes(ta, n, 0);
    uint8_t *h = (uint8_t *)p - TU_HDR;
    if (ta->quarantine) {
        memset(p, 0xDD, n);
        if (ta->n_dead < sizeof ta->dead / sizeof ta->dead[0]) {
            ta->dead[ta->n_dead++] = h;
            return;
        }
    }
    free(h);
}

static void *tu_alloc_alloc(void *opaque, size_t n)
{
    tu_alloc *ta = opaque;
    if (call_fails(ta) || (ta->zero_null && n == 0))
        return NULL;
    return block_new(ta, n, ta->fill);
}

static void *tu_alloc_realloc(void *opaque, void *p, size_t n)
{
    tu_alloc *ta = opaque;
    if (call_fails(ta) || (ta->zero_null && n == 0))
        return NULL;
    if (!p)
        return block_new(ta, n, 0);
    size_t old = block_size(p);
    if (ta->move || ta->quarantine) {
        void *q = block_new(ta, n, 0);
        if (q) {
            memcpy(q, p, old < n ? old : n);
            block_free(ta, p);
        }
        return q;
    }
    uint8_t *h = realloc((uint8_t *)p - TU_HDR, TU_HDR + (n ? n : 1));
    if (!h)
        return NULL;
    memcpy(h, &n, sizeof n);
    count_bytes(ta, old, n);
    return h + TU_HDR;
}

static void tu_alloc_free(void *opaque, void *p) { block_free(opaque, p); }

fkvf_allocator tu_alloc_hook(tu_alloc *ta)
{
    fkvf_allocator a = {tu_alloc_alloc, tu_alloc_realloc, tu_alloc_free, ta};
    return a;
}

void tu_alloc_release(tu_alloc *ta)
{
    for (size_t i = 0; i < ta->n_dead; i++)
        free(ta->dead[i]);
    ta->n_dead = 0;
}

void *tu_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* ---- files ---------------------------------------------------------------------- */

uint8_t *tu_read_file(const char *path, size_t *size, const fkvf_allocator *a)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    ck_assert_int_ge(n, 0);
    rewind(f);
    size_t want = (size_t)n + 1;
    uint8_t *p = a ? a->alloc(a->opaque, want) : malloc(want);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    p[n] = 0;
    *size = (size_t)n;
    return p;
}

uint8_t *tu_slurp(const char *path, size_t *size)
{
    uint8_t *p = tu_read_file(path, size, NULL);
    ck_assert_msg(p != NULL, "cannot open %s: %s", path, strerror(errno));
    return p;
}

void tu_write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    ck_assert_uint_eq(fwrite(data, 1, size, f), size);
    ck_assert_int_eq(fclose(f), 0);
}

void tu_tmpdir_make(char *dir, size_t n, const char *tag)
{
    int k = snprintf(dir, n, "/tmp/fkvf-%s-XXXXXX", tag);
    ck_assert_msg(k > 0 && (size_t)k < n, "scratch directory name for %s too long", tag);
    ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp %s: %s", dir, strerror(errno));
}

void tu_tmp_path(char *out, size_t n, const char *dir, const char *name)
{
    int k = snprintf(out, n, "%s/%s", dir, name);
    ck_assert_msg(k > 0 && (size_t)k < n, "path %s/%s too long", dir, name);
}

void tu_tmpdir_remove(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < (int)sizeof p)
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

void tu_f16_rows(uint16_t *out, uint64_t first, size_t n, size_t row_elems, uint64_t salt)
{
    for (size_t i = 0; i < n; i++) {
        tu_rng rng = {(first + i) * UINT64_C(0x9E3779B97F4A7C15) + salt};
        for (size_t e = 0; e < row_elems; e++) {
            double v = (double)(tu_next(&rng) >> 11) / 9007199254740992.0 * 4.0 - 2.0;
            out[i * row_elems + e] = fkvf_f32_to_f16((float)v);
        }
    }
    tu_le_u16(out, n * row_elems);
}

int tu_run_limited(size_t as_bytes, int (*fn)(void *ctx), void *ctx)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (!TU_UNDER_ASAN) {
            struct rlimit lim = {(rlim_t)as_bytes, (rlim_t)as_bytes};
            if (setrlimit(RLIMIT_AS, &lim) != 0)
                _exit(125);
        }
        _exit(fn(ctx) & 0xff);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -(WIFSIGNALED(status) ? WTERMSIG(status) : 1);
}

void tu_expect_err(int rc, int code, const char *rc_text, const char *err, const char *prefix,
                   const char *file, int line, ...)
{
    if (rc != code)
        ck_abort_msg("%s:%d: rc %d (%s), want %d; message: %s", file, line, rc, rc_text, code,
                     err);
    if (prefix && strncmp(err, prefix, strlen(prefix)) != 0)
        ck_abort_msg("%s:%d: message does not start with '%s': %s", file, line, prefix, err);
    va_list ap;
    va_start(ap, line);
    const char *s;
    while ((s = va_arg(ap, const char *)) != NULL)
        if (!strstr(err, s)) {
            va_end(ap);
            ck_abort_msg("%s:%d: message lacks '%s': %s", file, line, s, err);
        }
    va_end(ap);
}
