/* Helpers shared by the Check suites. */
#ifndef FKVF_TESTUTIL_H
#define FKVF_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "fkvf.h"

/* Assertions for hot loops: an `if` around ck_abort_msg (Check records the
 * location of every passing ck_assert, which is slow in long loops). Need
 * <check.h> included first. */
#define EXPECT(cond)                                                               \
    do {                                                                           \
        if (!(cond))                                                               \
            ck_abort_msg("%s:%d: expected %s", __FILE__, __LINE__, #cond);         \
    } while (0)
#define EXPECTF(cond, ...)             \
    do {                               \
        if (!(cond))                   \
            ck_abort_msg(__VA_ARGS__); \
    } while (0)

/* An error and its message: rc must be `code` (else the failure names
 * rc_text, the text of rc), the message `err` must start with `prefix`
 * (NULL: no check) and contain every string of the NULL-terminated list
 * that follows `line`. Use through TU_EXPECT_ERR. */
void tu_expect_err(int rc, int code, const char *rc_text, const char *err, const char *prefix,
                   const char *file, int line, ...);
#define TU_EXPECT_ERR(rc, code, rc_text, err, prefix, ...)                                  \
    tu_expect_err((rc), (code), (rc_text), (err), (prefix), __FILE__, __LINE__, __VA_ARGS__, \
                  (const char *)NULL)

/* Deterministic PRNG (splitmix64), so every test run sees the same data. */
typedef struct tu_rng {
    uint64_t s;
} tu_rng;
uint64_t tu_next(tu_rng *r);
uint32_t tu_below(tu_rng *r, uint32_t n); /* uniform in [0, n), n > 0 */

/* Growable in-memory byte buffer usable as an fkvf_sink. */
typedef struct tu_buf {
    uint8_t *data;
    size_t size, cap;
} tu_buf;
fkvf_sink tu_buf_sink(tu_buf *b);
void tu_buf_free(tu_buf *b);

/* Copy `size` bytes to a freshly allocated buffer at an odd address
 * (offset 1 from a malloc'd pointer). Free with tu_free_odd. */
uint8_t *tu_dup_odd(const void *data, size_t size);
void tu_free_odd(uint8_t *p);

/* ---- allocators ----------------------------------------------------------------
 * One test allocator for every suite: an fkvf_allocator over malloc that
 * counts calls, blocks and bytes, and fails where told. Zero-initialise a
 * tu_alloc, set the settings a test needs, and pass tu_alloc_hook(&ta) (the
 * hook points at ta, which must outlive every handle using it). Every block
 * carries a 16-byte header with its size, so byte counts are exact. */
typedef struct tu_alloc {
    /* settings */
    long fail_at;     /* this call to alloc or realloc fails (the first is 1; 0: none) */
    int fail_after;   /* and every call after it (failing from fail_at on) */
    int zero_null;    /* a zero-byte request returns NULL, as malloc(0) may */
    int fill;         /* alloc fills a block with 0xA5 and puts a NUL byte after it */
    int quarantine;   /* free poisons a block with 0xDD and keeps it until
                       * tu_alloc_release (a stale view reads 0xDD; at most 256
                       * blocks kept, later ones freed); implies move */
    int move;         /* realloc always moves: a new block, copy, free the old
                       * (peak counts both) instead of realloc in place */
    /* counters */
    long calls;       /* calls to alloc and realloc so far, failed ones included */
    int failed;       /* some call failed */
    long live;        /* blocks outstanding */
    size_t bytes;     /* bytes outstanding */
    size_t peak;      /* the most bytes outstanding at once */
    void *dead[256];  /* quarantined blocks */
    size_t n_dead;
} tu_alloc;
fkvf_allocator tu_alloc_hook(tu_alloc *ta);
/* Free the blocks quarantine kept; the counters stay. */
void tu_alloc_release(tu_alloc *ta);

/* calloc(n, size) (at least one byte) or the test fails. */
void *tu_xcalloc(size_t n, size_t size);

/* ---- byte order -----------------------------------------------------------------
 * The library's element arrays (fkvf_rows, codebook tables, fkvf_convert's
 * buffers, what restore and random access write) are little-endian bytes
 * (fkvf.h); tests compute host values. tu_le_swap turns n elements of
 * `width` bytes (2, 4 or 8) between host order and little-endian in place:
 * nothing on a little-endian host, each element's bytes reversed on a
 * big-endian one (s390x, scripts/test-cross.sh), so one call goes either
 * way. The loads read one little-endian element at any address. */
int tu_host_le(void);
void tu_le_swap(void *p, size_t n, size_t width);
static inline void tu_le_f32(float *p, size_t n) { tu_le_swap(p, n, 4); }
static inline void tu_le_u16(uint16_t *p, size_t n) { tu_le_swap(p, n, 2); }
uint16_t tu_ld16le(const void *p);
uint32_t tu_ld32le(const void *p); /* the bits: a NaN's payload kept */
float tu_ldf32le(const void *p);
/* A little-endian copy of n host floats, from tu_xcalloc (free it). */
float *tu_le_f32_copy(const float *p, size_t n);

/* ---- files ---------------------------------------------------------------------- */

/* The bytes of the file at `path` and their count in *size, in a block from
 * `a` (NULL: malloc) with a NUL byte after them (a text file is a string);
 * NULL if the file cannot be opened; a failed read fails the test. */
uint8_t *tu_read_file(const char *path, size_t *size, const fkvf_allocator *a);
/* tu_read_file with malloc, and a file that cannot be opened fails the test. */
uint8_t *tu_slurp(const char *path, size_t *size);
/* Create or replace the file at `path` with `size` bytes, or the test fails. */
void tu_write_file(const char *path, const void *data, size_t size);
/* A scratch directory /tmp/fkvf-TAG-XXXXXX (mkdtemp) into dir (n bytes;
 * 64 are enough for a short tag), or the test fails. */
void tu_tmpdir_make(char *dir, size_t n, const char *tag);
/* dir/name into out (n bytes), or the test fails when it does not fit. */
void tu_tmp_path(char *out, size_t n, const char *dir, const char *name);
/* Remove every file in dir (one level: the tests make no subdirectories),
 * then dir. */
void tu_tmpdir_remove(const char *dir);

/* n rows of row_elems f16 elements, positions [first, first + n): uniform
 * in [-2, 2), each position's its own (from first + i and salt), as the
 * library takes rows (little-endian elements). */
void tu_f16_rows(uint16_t *out, uint64_t first, size_t n, size_t row_elems, uint64_t salt);

/* TU_UNDER_ASAN is 1 in an AddressSanitizer build (gcc or clang), else 0. */
#if defined(__SANITIZE_ADDRESS__)
#define TU_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TU_UNDER_ASAN 1
#endif
#endif
#ifndef TU_UNDER_ASAN
#define TU_UNDER_ASAN 0
#endif

/* fn(ctx) in a forked child whose address space is limited to as_bytes
 * (not under ASan, which reserves terabytes of shadow memory): what a
 * hostile input may make a parser allocate is bounded by the test. Returns
 * the child's exit status (fn's return value, 0..255), or -SIGNAL when the
 * child was killed; a fork that fails fails the test. */
int tu_run_limited(size_t as_bytes, int (*fn)(void *ctx), void *ctx);

/* Run a Check suite (CK_NORMAL output); the exit status for main(). Needs
 * <check.h> included before this header for the Suite type. */
#ifdef CHECK_H
int tu_run_suite(Suite *s);
#endif

#endif
