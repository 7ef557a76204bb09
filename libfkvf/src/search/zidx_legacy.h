/* The 1.0 ZIDX index (spec 20.2-20.3: keys stored with the positions, 24
 * or 32 bytes per position), which the library reads but no longer writes
 * (fkvf_search_index_build writes ZPOS, spec 20.7). Built here for the
 * tests and the conformance files that check old files stay readable. */
#ifndef FKVF_SEARCH_ZIDX_LEGACY_H
#define FKVF_SEARCH_ZIDX_LEGACY_H

#include <stddef.h>
#include <stdint.h>

#include "fkvf.h"

/* As fkvf_search_index_build, but a FKVF_SECTION_ZIDX section: the same
 * positions in the same order, each with its stored key (and ngon point). */
int fkvf_search_zidx_build(fkvf_reader *r, size_t stream_index, void **data, size_t *size,
                           uint64_t *key, const fkvf_allocator *alloc);

#endif
