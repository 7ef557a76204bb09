#if defined(__linux__)
#define _DEFAULT_SOURCE /* madvise */
#include <sys/mman.h>
#endif
#include "alloc.h"

#include <stdlib.h>
#include <string.h>

#include "ckd.h"

static void *default_alloc(void *opaque, size_t size)
{
    (void)opaque;
    return malloc(size ? size : 1);
}
static void *default_realloc(void *opaque, void *p, size_t size)
{
    (void)opaque;
    return realloc(p, size ? size : 1);
}
static void default_free(void *opaque, void *p)
{
    (void)opaque;
    free(p);
}

static const fkvf_allocator default_allocator = {default_alloc, default_realloc, default_free, NULL};

const fkvf_allocator *fkvf_alloc_or_default(const fkvf_allocator *a)
{
    return (a && a->alloc && a->realloc && a->free) ? a : &default_allocator;
}

/* With the default allocator, big tables go to memory that Linux may back
 * with transparent huge pages: decoding reads random centroid rows of
 * tables of tens of megabytes, and with 4 KiB pages nearly every row is a
 * TLB miss (random single positions of GPT-2 small decode about twice as
 * fast with huge pages). Any other allocator is used as given. */
#if defined(__linux__) && defined(MADV_HUGEPAGE)
#define HUGE_MIN ((size_t)4 << 20)
#define HUGE_PAGE ((size_t)2 << 20)
static void *hp_alloc(void *opaque, size_t n)
{
    if (n < HUGE_MIN)
        return default_alloc(opaque, n);
    size_t sz = (n + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1); /* n < SIZE_MAX / 2 here */
    void *p = aligned_alloc(HUGE_PAGE, sz);
    if (p)
        (void)madvise(p, sz, MADV_HUGEPAGE); /* a hint: failure changes nothing */
    return p;
}
/* realloc and free as the default's: aligned_alloc's blocks are free's */
static const fkvf_allocator hp_allocator = {hp_alloc, default_realloc, default_free, NULL};
const fkvf_allocator *fkvf_alloc_large_tables(const fkvf_allocator *a)
{
    return fkvf_alloc_or_default(a) == &default_allocator ? &hp_allocator : a;
}
#else
const fkvf_allocator *fkvf_alloc_large_tables(const fkvf_allocator *a) { return a; }
#endif

void *fkvf_malloc(const fkvf_allocator *a, size_t n)
{
    a = fkvf_alloc_or_default(a);
    return a->alloc(a->opaque, n);
}

void *fkvf_calloc(const fkvf_allocator *a, size_t count, size_t size)
{
    size_t n;
    if (!fkvf_mulsz(count, size, &n))
        return NULL;
    void *p = fkvf_malloc(a, n);
    if (p)
        memset(p, 0, n);
    return p;
}

void *fkvf_realloc(const fkvf_allocator *a, void *p, size_t n)
{
    a = fkvf_alloc_or_default(a);
    return a->realloc(a->opaque, p, n);
}

void fkvf_free(const fkvf_allocator *a, void *p)
{
    if (!p)
        return;
    a = fkvf_alloc_or_default(a);
    a->free(a->opaque, p);
}

int fkvf_grow(const fkvf_allocator *a, void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return FKVF_OK;
    size_t ncap = *cap ? *cap : need; /* an array that stays small stays small */
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            return FKVF_E_NOMEM;
        ncap *= 2;
    }
    size_t bytes;
    if (!fkvf_mulsz(ncap, elem, &bytes))
        return FKVF_E_NOMEM;
    void *p = fkvf_realloc(a, *buf, bytes);
    if (!p)
        return FKVF_E_NOMEM;
    *buf = p;
    *cap = ncap;
    return FKVF_OK;
}

char *fkvf_strndup(const fkvf_allocator *a, const void *p, size_t n)
{
    size_t bytes;
    if (!fkvf_addsz(n, 1, &bytes))
        return NULL;
    char *s = fkvf_malloc(a, bytes);
    if (s) {
        if (n)
            memcpy(s, p, n);
        s[n] = 0;
    }
    return s;
}
