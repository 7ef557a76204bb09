/* Reader side of the search indexes ZIDX and ZPOS (spec 20): full
 * verification. */
#ifndef FKVF_READ_ZIDX_H
#define FKVF_READ_ZIDX_H

#include "read/reader_impl.h"

/* Check every ZIDX and ZPOS section (spec 20.2-20.4, 20.7): header, codec
 * parameters equal to the stream's, positions below n_indexed; ZIDX:
 * entries strictly ascending and, for an index in effect, every key (and
 * ngon point) equal to the one the stream gives; ZPOS: in effect, strictly
 * ascending by the (key, position) the stream gives, stale, a permutation. */
int rd_zidx_verify(fkvf_reader *r);

#endif
