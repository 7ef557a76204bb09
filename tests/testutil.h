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

/* Run a Check suite (CK_NORMAL output); the exit status for main(). Needs
 * <check.h> included before this header for the Suite type. */
#ifdef CHECK_H
int tu_run_suite(Suite *s);
#endif

#endif
