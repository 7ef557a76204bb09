#ifndef FKVF_COMMON_ALLOC_H
#define FKVF_COMMON_ALLOC_H

#include "fkvf.h"

/* Never NULL: the default allocator when `a` is NULL. */
const fkvf_allocator *fkvf_alloc_or_default(const fkvf_allocator *a);
/* The allocator for big tables read at random (the codebook's, for
 * decoding): for the default allocator (whatever fkvf_alloc_or_default
 * makes the default, NULL included) one whose
 * blocks of 4 MiB and more are 2 MiB-aligned and advised for transparent
 * huge pages on Linux (freed with free, as the default's); any other
 * allocator as given. */
const fkvf_allocator *fkvf_alloc_large_tables(const fkvf_allocator *a);
void *fkvf_malloc(const fkvf_allocator *a, size_t n);
void *fkvf_calloc(const fkvf_allocator *a, size_t count, size_t size); /* checked product */
void *fkvf_realloc(const fkvf_allocator *a, void *p, size_t n);
void fkvf_free(const fkvf_allocator *a, void *p);
/* Grow *buf (capacity *cap elements of `elem` bytes) to hold at least `need`
 * elements: exactly `need` at first, then doubling. Returns FKVF_OK or
 * FKVF_E_NOMEM (buffer unchanged). */
int fkvf_grow(const fkvf_allocator *a, void **buf, size_t *cap, size_t need, size_t elem);
/* A NUL-terminated copy of the n bytes at p (p may be NULL when n is 0), or
 * NULL when out of memory. */
char *fkvf_strndup(const fkvf_allocator *a, const void *p, size_t n);

#endif
