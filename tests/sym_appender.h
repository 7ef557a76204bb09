/* sym_appender.h - the symbol appender of test_codec and fuzz_codec
 * (tests/sym_appender.c). Test code: not part of libfkvf. */
#ifndef FKVF_TESTS_SYM_APPENDER_H
#define FKVF_TESTS_SYM_APPENDER_H

#include "codec/codec.h"

/* ---- symbol appender: O(1) amortized append for either profile ------------ */
/* Not used by the library itself (the public fkvf_appender of append/ writes
 * whole segments through the writer); test_codec and fuzz_codec use it to
 * check that appending symbol by symbol serializes exactly as the one-shot
 * encoders do. Named apart from the public handle's struct tag. */

typedef struct fkvf_sym_appender {
    fkvf_profile profile;
    unsigned bits;           /* quad */
    const fkvf_ngon *ngon;   /* ngon (borrowed) */
    uint8_t *data;           /* serialized spans so far (owned) */
    size_t cap;
    uint64_t n;              /* symbols appended */
    uint32_t open[64];       /* ngon: symbols of the open span (L <= 64 enforced) */
    const fkvf_allocator *alloc;
} fkvf_sym_appender;

int fkvf_sym_appender_init_quad(fkvf_sym_appender *a, unsigned bits, const fkvf_allocator *alloc);
int fkvf_sym_appender_init_ngon(fkvf_sym_appender *a, const fkvf_ngon *g, const fkvf_allocator *alloc);
int fkvf_sym_appender_push(fkvf_sym_appender *a, uint32_t sym);
/* Serialized bytes of everything appended so far (the open span's anchor is
 * computed on demand). *data stays valid until the next push or fini. */
int fkvf_sym_appender_bytes(fkvf_sym_appender *a, const uint8_t **data, size_t *size);
void fkvf_sym_appender_fini(fkvf_sym_appender *a);

#endif
