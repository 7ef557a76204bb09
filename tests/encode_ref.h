/* The encoder as it was before issue 16: four vectors at a time through
 * fkvfq_scores4 (on a panel copy of the tables, built per call as the
 * handle held it then) and fkvfq_pick, one stage table after the other for
 * each chunk of 64 positions. Kept outside the library as the reference
 * that tests/test_encode_exact.c and bench/bench_encode.c compare
 * fkvf_rvq_encode against: same arguments, same contract, same codes. Not
 * thread-safe (the panel copy is a static). */
#ifndef FKVF_TESTS_ENCODE_REF_H
#define FKVF_TESTS_ENCODE_REF_H

#include <stddef.h>
#include <stdint.h>

#include "fkvf.h"

int encode_ref(const fkvf_rvq *q, const fkvf_rows *rows, const fkvf_rope *key_rope,
               unsigned beam_width, uint16_t *codes, size_t pos_stride, size_t code_stride);

#endif
