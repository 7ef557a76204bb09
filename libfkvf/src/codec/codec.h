/* The chaos-game symbol codecs of spec 12: quad (r = 1/2, 64-bit fixed point)
 * and ngon (regular N-gon, binary64). Pure functions on buffers; no I/O.
 * The container (read/, write/) does checksums, segments and bounds against
 * the file; these functions trust the lengths they are given but never read
 * or write outside them. */
#ifndef FKVF_CODEC_H
#define FKVF_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "fkvf.h"

/* ---- quad (spec 12.1) ---------------------------------------------------- */

/* Serialized bytes for n symbols of `bits` bits: ceil(n*bits/128)*16.
 * Returns 0 on overflow (and leaves *out alone). */
int fkvf_quad_data_bytes(uint64_t n, unsigned bits, uint64_t *out);
/* Symbols per 128-bit span, rounded down (64 / (bits/2)). */
unsigned fkvf_quad_span_symbols(unsigned bits);
/* Pack n symbols into out (size fkvf_quad_data_bytes), zero padding.
 * Returns FKVF_E_SYMBOL if a symbol does not fit in `bits` bits. */
int fkvf_quad_encode(const uint32_t *sym, size_t n, unsigned bits, uint8_t *out, size_t out_size);
/* Symbols [first, first+n) out of `data` (data_size bytes). Returns
 * FKVF_E_RANGE if they are not all inside data. */
int fkvf_quad_decode(const uint8_t *data, size_t data_size, unsigned bits, uint64_t first,
                     size_t n, uint32_t *out);
/* Same into bytes, for widths <= 8 (FKVF_E_INVALID_ARG otherwise). For 8-bit
 * symbols this is a copy: the stored span is the symbol bytes (spec 12.1.4). */
int fkvf_quad_decode_u8(const uint8_t *data, size_t data_size, unsigned bits, uint64_t first,
                        size_t n, uint8_t *out);
/* Symbol t, O(1). Caller guarantees (t+1)*bits <= 8*data_size. */
uint32_t fkvf_quad_get(const uint8_t *data, size_t data_size, unsigned bits, uint64_t t);
/* CGR point after symbol t (spec 12.1): the 128-bit window of the bitstream
 * ending at bit (t+1)*bits, de-interleaved into x (even bits) and y (odd).
 * Bits before the start of data are zero. */
void fkvf_quad_point(const uint8_t *data, size_t data_size, unsigned bits, uint64_t t,
                     uint64_t *x, uint64_t *y);
/* Reference: run the digit recurrence of spec 12.1 from (0,0) over symbols
 * 0..t. O(t). For tests. */
void fkvf_quad_point_ref(const uint32_t *sym, uint64_t t, unsigned bits, uint64_t *x,
                         uint64_t *y);
/* Pad bits after symbol n-1 in the last 16-byte unit are zero? 1 yes, 0 no. */
int fkvf_quad_padding_zero(const uint8_t *data, size_t data_size, unsigned bits, uint64_t n);

/* ---- ngon (spec 12.2) ---------------------------------------------------- */

typedef struct fkvf_ngon {
    uint32_t n;      /* alphabet N */
    double r;        /* contraction ratio */
    uint32_t span;   /* L: symbols per span */
    double *vx, *vy; /* vertex table (owned) */
    void *fast;      /* decoder acceleration tables (owned, opaque) */
    const fkvf_allocator *alloc;
} fkvf_ngon;

/* Regular N-gon vertices with libm (writer side): xy[2c] = cos, xy[2c+1] = sin
 * of 2*pi*c/N; V(0) = (1, 0) exactly. */
void fkvf_ngon_make_vertices(uint32_t n, double *xy);
/* r_N from a vertex table (spec 12.2), no libm. */
double fkvf_ngon_rmax_table(uint32_t n, const double *xy);
/* Reader-side validation of a vertex table (spec 10.2): FKVF_OK or
 * FKVF_E_CORRUPT. */
int fkvf_ngon_check_table(uint32_t n, const double *xy);
/* Reader-side validation of (N, table, r, L) without libm (spec 10.2, 12.2).
 * Returns FKVF_OK or FKVF_E_CORRUPT / FKVF_E_LIMIT. */
int fkvf_ngon_check_params(uint32_t n, const double *xy, double r, uint32_t span);

/* Set up a codec context. xy = 2N doubles (copied), or NULL to compute with
 * libm. r = 0 means r_N; span = 0 means L_max(r). Validates like
 * fkvf_ngon_check_params. */
int fkvf_ngon_init(fkvf_ngon *g, uint32_t n, double r, uint32_t span, const double *xy,
                   const fkvf_allocator *alloc);
void fkvf_ngon_fini(fkvf_ngon *g);

/* Bytes for n symbols: ceil(n / L) * 16. 0 on overflow. */
int fkvf_ngon_data_bytes(const fkvf_ngon *g, uint64_t n, uint64_t *out);
/* Forward map over sym[0..len) from the origin (spec 12.2). */
void fkvf_ngon_encode_span(const fkvf_ngon *g, const uint32_t *sym, uint32_t len, double *ax,
                           double *ay);
/* Canonical backward decoder of spec 12.2 (exhaustive argmin). No re-encode check. */
void fkvf_ngon_decode_span_canonical(const fkvf_ngon *g, double ax, double ay, uint32_t len,
                                     uint32_t *out);
/* Fast decoder + re-encode check (+ canonical fallback). FKVF_OK or FKVF_E_SPAN. */
int fkvf_ngon_decode_span(const fkvf_ngon *g, double ax, double ay, uint32_t len, uint32_t *out);
/* Fast decoder without the re-encode check (for spans already verified). */
void fkvf_ngon_decode_span_fast(const fkvf_ngon *g, double ax, double ay, uint32_t len,
                                uint32_t *out);
/* Encode n symbols into anchors (16 bytes LE per span). Every span is checked
 * to decode back with the canonical decoder: FKVF_E_CODEC otherwise;
 * FKVF_E_SYMBOL if a symbol >= N. */
int fkvf_ngon_encode(const fkvf_ngon *g, const uint32_t *sym, size_t n, uint8_t *out,
                     size_t out_size);
/* Decode symbols [first, first+n) from the anchors of a stream of `total`
 * symbols. verify = 1 checks every span touched (FKVF_E_SPAN). */
int fkvf_ngon_decode(const fkvf_ngon *g, const uint8_t *data, size_t data_size, uint64_t total,
                     uint64_t first, size_t n, uint32_t *out, int verify);
/* Symbol t, O(L). */
int fkvf_ngon_get(const fkvf_ngon *g, const uint8_t *data, size_t data_size, uint64_t total,
                  uint64_t t, uint32_t *out);
/* CGR point of position t: forward from the origin over the last min(t+1, L)
 * symbols ending at t (spec 12.2). */
int fkvf_ngon_point(const fkvf_ngon *g, const uint8_t *data, size_t data_size, uint64_t total,
                    uint64_t t, double *px, double *py);

#endif
