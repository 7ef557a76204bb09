/* Shared by restore.c and access.c (the reconstruction of archived rows). */
#ifndef FKVF_READ_RESTORE_H
#define FKVF_READ_RESTORE_H

#include "reader_impl.h"

/* The codebook as an fkvf_rvq of binary32 tables in r->rvq and the stream
 * of every code in r->cb_streams (each built once, on first use): the
 * embedded CBK1, or the attached external codebook (else FKVF_E_CODEBOOK,
 * message set). fkvf_reader_restore uses it only when it cannot decode
 * from the f16 tables in place (restore.c: restore_rvq). */
int rd_restore_prepare(fkvf_reader *r);
/* Where rd_restore_archived puts rows: the decode target (layers, layout,
 * the output's rows) of an output whose row 0 is position `first`. */
typedef struct rd_target {
    fkvf_rvq_decode_target dec;
    uint64_t first;
    fkvf_dtype dtype;
    void *out;
    size_t out_size;
} rd_target;
/* Archived positions [first, stop) (all archived) decoded into t's rows,
 * in batches, through the decoder's vector kernels (fkvf_rvq_decode_to) on
 * the reader's threads. Errors: the codebook's, the streams', FKVF_E_SYMBOL,
 * FKVF_E_NOMEM, with the reader's message. */
int rd_restore_archived(fkvf_reader *r, const rd_target *t, uint64_t first, uint64_t stop);
/* fkvf_reader_row_bytes without its entry check (reader_impl.h: rd_meta...) */
int rd_row_bytes(const fkvf_reader *r, fkvf_dtype dtype, size_t *row_bytes);

#endif
