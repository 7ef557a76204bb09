/* One archived vector decoded from f16 centroid rows to f16 in registers,
 * 16 lanes at a time (AVX-512): the stage sum of stage_sum.h (binary32, +0.0
 * + row 0 + row 1 + ..., every f16 element widened exactly), the key
 * rotation of rope.h (binary64 pair turns, one rounding to binary32) and the
 * f16 store of half.h (vcvtps2ph, round to nearest even), with no binary32
 * buffer between them. The same operations in the same order as the
 * fkvf_stage_sum + fkvf_rope_rotate_f32 + fkvf_f16c_store path, so the same
 * bits (tests/test_access.c compares them on every RoPE layout). Used by
 * fkvf_reader_read (random access) when fkvf_vec16_usable says so, and by
 * fkvf_rvq_decode's f16 path (restore) a pass of positions at a time
 * through fkvf_vec16_group (tests/test_quant.c compares it with the
 * portable decoder). */
#ifndef FKVF_COMMON_VEC16_H
#define FKVF_COMMON_VEC16_H

#include <stddef.h>
#include <stdint.h>

/* 1 if fkvf_vec16_store runs here for vectors of dim components whose first
 * rd are rotated with RoPE layout `layout` (rd = 0: none): the CPU has
 * AVX-512 F (fkvf_cpu_avx512), dim is a multiple of 16, and rd is 0, or at
 * most dim and a multiple of 32 (half-split, layout 2) or of 16
 * (interleaved, layout 1). 0 otherwise, and on other architectures. */
int fkvf_vec16_usable(uint32_t dim, uint32_t rd, uint8_t layout);

/* dst (2 * dim bytes, little-endian f16) = the sum of the ns (<= 16) f16
 * rows (dim elements each, 2-byte aligned), its first rd components rotated
 * by the angles cs (rd / 2 cosines, then rd / 2 sines, binary64:
 * fkvf_rope_angles). nt = 0: dst of any alignment; nt = 1: dst 16-byte
 * aligned, written with non-temporal stores (the caller fences them). Only
 * after fkvf_vec16_usable(dim, rd, layout) returned 1. */
void fkvf_vec16_store(uint8_t *dst, const void *const *rows, unsigned ns, uint32_t dim,
                      uint8_t layout, uint32_t rd, const double *cs, int nt);

/* One vector of a pass of fkvf_vec16_group: its stage-s row for a position
 * whose code of stage s is c is tab + s * stage_stride + c * dim (f16
 * elements); that code is code[i * pos_stride + s * code_stride] for the
 * pass's position i; the vector goes to dst + i * dst_stride (rows of a
 * cache or heads-first runs: the caller's layout). */
typedef struct fkvf_vec16_vec {
    const uint16_t *tab;
    const uint16_t *code;
    size_t stage_stride;
    uint8_t *dst;
    size_t dst_stride;
    uint32_t dim;
    uint32_t rd;     /* rotated components (0: none) */
    uint8_t layout;  /* their RoPE layout when rd > 0 */
    uint8_t ns;      /* stages, 0..16 (0: the vector is +0.0) */
} fkvf_vec16_vec;

/* A pass: positions 0 .. n_pos - 1, each its vectors v[0 .. nv - 1] in
 * that order, each where its dst says; position i's angles at
 * cs + i * cs_stride (the layout of fkvf_vec16_store's cs). The rows of
 * position i + prefetch are prefetched while position i is decoded
 * (prefetch 0: none). nt as in fkvf_vec16_store. */
typedef struct fkvf_vec16_pass {
    const fkvf_vec16_vec *v;
    unsigned nv;
    size_t n_pos;
    size_t pos_stride, code_stride;
    const double *cs;
    size_t cs_stride;
    unsigned prefetch;
    int nt;
} fkvf_vec16_pass;

/* fkvf_vec16_store of every vector of every position of the pass, the
 * codes read and the rows found here (the same bits as one
 * fkvf_vec16_store call a vector). Every vector's (dim, rd, layout) must
 * have passed fkvf_vec16_usable and every code must be below the table's
 * row count: not checked here. */
void fkvf_vec16_group(const fkvf_vec16_pass *p);

#endif
