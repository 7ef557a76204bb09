/* Per-handle diagnostics: one formatted message naming file, offset, field
 * and spec clause, plus the code. */
#ifndef FKVF_COMMON_ERROR_H
#define FKVF_COMMON_ERROR_H

#include <stdint.h>

#define FKVF_MSG_MAX 1024
#define FKVF_NO_OFFSET UINT64_MAX

typedef struct fkvf_diag {
    char msg[FKVF_MSG_MAX];
    const char *name; /* file name or "<memory>", borrowed */
    int code;
} fkvf_diag;

void fkvf_diag_clear(fkvf_diag *d);
/* Record an error and return `code`. `clause` like "3.1" (or NULL); fmt
 * describes the field and what is wrong. Keeps the first error recorded
 * until cleared. */
int fkvf_fail(fkvf_diag *d, int code, uint64_t offset, const char *clause, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Same, overwriting any earlier message. */
int fkvf_fail_replace(fkvf_diag *d, int code, uint64_t offset, const char *clause,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#endif
