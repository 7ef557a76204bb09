#include <check.h>
#include <stdlib.h>
#include <string.h>

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

int tu_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
