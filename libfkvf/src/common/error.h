/* Per-handle diagnostics: one formatted message naming file, offset, field
 * and spec clause, plus the code, the offset, the field and the clause as
 * fields (what fkvf_reader_error and the other *_error functions report, and
 * what the validator reports a diagnostic of the reader with). */
#ifndef FKVF_COMMON_ERROR_H
#define FKVF_COMMON_ERROR_H

#include <stdint.h>

#include "fkvf.h"

#define FKVF_MSG_MAX 1024
#define FKVF_NO_OFFSET UINT64_MAX

#define FKVF_CLAUSE_MAX 16
#define FKVF_FIELD_MAX 64

typedef struct fkvf_diag {
    char msg[FKVF_MSG_MAX];
    const char *name; /* file name or "<memory>", borrowed */
    int code;
    uint64_t offset;              /* FKVF_NO_OFFSET when none */
    char clause[FKVF_CLAUSE_MAX]; /* "" when none */
    char field[FKVF_FIELD_MAX];   /* "" when none, e.g. "header.magic" */
    /* the text fmt made: msg[body_at, body_at + body_len) */
    unsigned short body_at, body_len;
} fkvf_diag;

void fkvf_diag_clear(fkvf_diag *d);
/* The part of another handle's message worth quoting in a message of one's
 * own: msg without a leading "FILE:" (file NULL: none) and one blank, and
 * without the trailing " [FKVF_E_...]" of `code`, which the quoting message
 * adds itself. Returns its start in msg; *len its length. */
const char *fkvf_quote_body(const char *msg, const char *file, int code, size_t *len);
/* The fields of a diagnostic as the public fkvf_error_info (the strings
 * point into d, or are NULL / a static string). */
void fkvf_diag_info(const fkvf_diag *d, fkvf_error_info *out);
/* The body of every public *_error function: FKVF_E_INVALID_ARG for out
 * NULL; for d NULL (the argument is not a handle of the function's kind)
 * *out zeroed with code FKVF_E_STATE, no offset and the message
 * not_a_handle, and FKVF_E_STATE; else fkvf_diag_info(d, out) and FKVF_OK. */
int fkvf_diag_report(const fkvf_diag *d, const char *not_a_handle, fkvf_error_info *out);
/* Record an error and return `code`. `clause` like "3.1" (or NULL); fmt
 * describes the field and what is wrong. The field is named by the
 * convention every message follows: the text starts with it, up to its colon
 * ("header.magic: not an FKVF file", "directory.entry[3].offset: ..."), a
 * name of letters, digits, '_', '.', '[' and ']'; text that starts otherwise
 * names no field, and neither does an error of the environment (FKVF_E_IO,
 * FKVF_E_NOMEM: "open: ..." names a system call). The message is "NAME: offset N: TEXT (spec CLAUSE)
 * [FKVF_E_...]", offset and clause left out when absent. Keeps the first
 * error recorded until cleared. */
int fkvf_fail(fkvf_diag *d, int code, uint64_t offset, const char *clause, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Same, overwriting any earlier message. */
int fkvf_fail_replace(fkvf_diag *d, int code, uint64_t offset, const char *clause,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* The text fmt made (no file name, offset, clause or code); *len its length
 * (not NUL-terminated inside msg). "" with *len 0 when there is no error. */
const char *fkvf_diag_text(const fkvf_diag *d, size_t *len);

#endif
