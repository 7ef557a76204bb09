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
/* fkvf_reader_row_bytes without its entry check (reader_impl.h: rd_meta...) */
int rd_row_bytes(const fkvf_reader *r, fkvf_dtype dtype, size_t *row_bytes);

#endif
