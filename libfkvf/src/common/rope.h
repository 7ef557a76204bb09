/* RoPE arithmetic (spec 8.1), the one copy of it: the angle table
 * (theta^(-2i / rope_dims), then cos and sin of t times it, binary64) and the
 * rotation of a key's pairs. */
#ifndef FKVF_COMMON_ROPE_H
#define FKVF_COMMON_ROPE_H

#include <stdint.h>

#include "fkvf.h"

/* 1 if the parameters are usable for keys of key_dim components. */
int fkvf_rope_valid(const fkvf_rope *r, uint32_t key_dim);
/* theta^(-2i / rope_dims) for every pair i (rope_dims/2 values). */
void fkvf_rope_freqs(const fkvf_rope *r, double *freqs);
/* cos and sin of angle(t, i) = t * freqs[i] for every pair i: cs[i] = cos,
 * cs[rope_dims/2 + i] = sin, binary64. The same values as fkvf_rope_apply_*. */
void fkvf_rope_angles(const fkvf_rope *r, const double *freqs, uint64_t t, double *cs);
/* Rotate binary32 values v by +angle (inverse = 0) or -angle (inverse = 1):
 * computed in binary64, rounded once at the end (bit-identical to
 * fkvf_rope_apply_f32). */
void fkvf_rope_rotate_f32(const fkvf_rope *r, const double *cs, int inverse, float *v);

#endif
