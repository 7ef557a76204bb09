/* Reader side of the ZIDX search index (spec 20): full verification. */
#ifndef FKVF_READ_ZIDX_H
#define FKVF_READ_ZIDX_H

#include "read/reader_impl.h"

/* Check every ZIDX section (spec 20.2-20.4): header, codec parameters equal
 * to the stream's, entries strictly ascending, positions below n_indexed,
 * and, for an index in effect, every key (and ngon point) equal to the one
 * the stream gives. */
int rd_zidx_verify(fkvf_reader *r);

#endif
