/* ZIDX and ZPOS: the optional search indexes of one stream (spec 20): byte
 * layout, header checks, and the sort keys of their entries. ZIDX (1.0)
 * stores each entry's key with its position; ZPOS stores the positions
 * alone (the key of a position is computed from the stream). Both share the
 * 64-byte header. Pure functions; no I/O. */
#ifndef FKVF_FORMAT_ZIDX_H
#define FKVF_FORMAT_ZIDX_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "fkvf.h"

#define FKVF_ZIDX_HDR_SIZE 64
#define FKVF_ZIDX_QUAD_ENTRY 24 /* z_t (16 bytes) + position (u64) */
#define FKVF_ZIDX_NGON_ENTRY 32 /* key (u64) + position (u64) + x, y (f64) */
#define FKVF_ZPOS_ENTRY32 4     /* position (u32): n_indexed <= 2^32 */
#define FKVF_ZPOS_ENTRY64 8     /* position (u64): n_indexed > 2^32 */

typedef struct fkvf_zidx_hdr {
    uint64_t stream_id;
    uint8_t profile;     /* 1 quad, 2 ngon */
    uint8_t bits;        /* quad b, ngon 0 */
    uint16_t entry_size; /* ZIDX: 24 quad, 32 ngon; ZPOS: 4 or 8 */
    uint32_t alphabet;   /* ngon N, quad 0 */
    uint64_t n_indexed;  /* entries = positions [0, n_indexed) */
    double r;            /* ngon r (bit pattern of the stream's), quad +0.0 */
    uint32_t span;       /* ngon L, quad 0 */
} fkvf_zidx_hdr;

/* Is t a search index section type (FKVF_SECTION_ZIDX or FKVF_SECTION_ZPOS)? */
int fkvf_zidx_is_index(uint32_t type);
/* Parse and check the header and the size of a ZIDX or ZPOS section (type;
 * spec 20.2, 20.7): TRUNCATED, CORRUPT or LIMIT with the clause, off =
 * section offset for the message. `key` is the directory key. */
int fkvf_zidx_hdr_parse(uint32_t type, const uint8_t *p, uint64_t size, uint64_t key,
                        uint64_t off, fkvf_zidx_hdr *h, fkvf_diag *d);
/* Serialize a header (64 bytes, reserved bytes zero). */
void fkvf_zidx_hdr_write(uint8_t *p, const fkvf_zidx_hdr *h);
/* The entry size of a section of the type: ZIDX by profile, ZPOS by n. */
uint16_t fkvf_zidx_entry_size(uint32_t type, uint8_t profile, uint64_t n);
/* Section size for n entries; 0 on overflow or beyond 2^48. */
uint64_t fkvf_zidx_size(uint32_t type, uint8_t profile, uint64_t n);
/* ZPOS: position of entry i (entry size es, 4 or 8), unchecked. */
uint64_t fkvf_zpos_at(const uint8_t *entries, uint16_t es, uint64_t i);

/* ngon: quantize a coordinate of [-1, 1] to 32 bits (spec 20.3):
 * floor((v + 1) * 2^31) in binary64, clamped to [0, 2^32 - 1]; NaN -> 0. */
uint32_t fkvf_zidx_quant(double v);
/* Morton interleave: bit 2i = bit i of x, bit 2i+1 = bit i of y. */
uint64_t fkvf_zidx_morton32(uint32_t x, uint32_t y);
/* The 128-bit Morton value of a quad point (x, y): hi and lo halves. */
void fkvf_zidx_morton64(uint64_t x, uint64_t y, uint64_t *hi, uint64_t *lo);
/* Inverse of fkvf_zidx_morton64. */
void fkvf_zidx_unmorton64(uint64_t hi, uint64_t lo, uint64_t *x, uint64_t *y);

#endif
