/* Internal to the append module: the handle of the operations on a whole
 * archive file (fkvf_archive_append_sections, fkvf_archive_compact,
 * fkvf_archive_recover; fkvf.h fkvf_archive_op), which carries their error
 * as fields. */
#ifndef FKVF_APPEND_ARCHIVE_OP_H
#define FKVF_APPEND_ARCHIVE_OP_H

#include "error.h"
#include "handle.h"
#include "fkvf.h"

struct fkvf_archive_op {
    fkvf_handle h;  /* FKVF_HANDLE_ARCHIVE_OP; always OPEN (it only reports) */
    const fkvf_allocator *alloc;
    fkvf_diag diag; /* name: src or path, whichever the error is about */
    char *src;      /* the archive operated on */
    char *path;     /* the file written (compaction), or NULL */
};

/* A new handle for the file src (copied), the allocator alloc (NULL: the
 * default). FKVF_OK or FKVF_E_NOMEM (then *out is NULL, or a handle whose
 * error says so). */
int fkvf_archive_op_new(fkvf_archive_op **out, const char *src, const fkvf_allocator *alloc);

/* Record an error of op about `file` (one of op's strings), formatted. */
int fkvf_archive_op_fail(fkvf_archive_op *op, const char *file, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Record the error e of a reader or writer about `file` (e NULL or without
 * an error: fkvf_strerror(rc)), with a prefix: its offset and clause stay
 * fields, its message is quoted without the file name and the code that
 * op's own message adds again. Keeps an earlier error. Returns rc. */
int fkvf_archive_op_fail_from(fkvf_archive_op *op, int rc, const fkvf_error_info *e,
                              const char *file, const char *prefix);

/* The same for the reader r of op->src. */
int fkvf_archive_op_fail_reader(fkvf_archive_op *op, int rc, const fkvf_reader *r,
                                const char *prefix);

#endif
