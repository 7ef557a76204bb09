/* fkvf_archive_op (fkvf.h): the handle of fkvf_archive_append_sections,
 * fkvf_archive_compact and fkvf_archive_recover, the operations on a whole
 * archive file; it only carries their error (archive_op.h). */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "fkvf.h"
#include "archive_op.h"

int fkvf_archive_op_new(fkvf_archive_op **out, const char *src, const fkvf_allocator *alloc)
{
    const fkvf_allocator *al = fkvf_alloc_or_default(alloc);
    fkvf_archive_op *op = fkvf_calloc(al, 1, sizeof *op);
    *out = op;
    if (!op)
        return FKVF_E_NOMEM;
    fkvf_handle_init(&op->h, FKVF_HANDLE_ARCHIVE_OP);
    op->alloc = al;
    fkvf_diag_clear(&op->diag);
    if (!(op->src = fkvf_strndup(al, src, strlen(src))))
        return fkvf_fail(&op->diag, FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory");
    op->diag.name = op->src;
    return FKVF_OK;
}

int fkvf_archive_op_fail(fkvf_archive_op *op, const char *file, int code, const char *fmt, ...)
{
    if (op->diag.code != FKVF_OK)
        return code;
    char body[760];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    op->diag.name = file;
    return fkvf_fail(&op->diag, code, FKVF_NO_OFFSET, NULL, "%s", body);
}

int fkvf_archive_op_fail_from(fkvf_archive_op *op, int rc, const fkvf_error_info *e,
                              const char *file, const char *prefix)
{
    if (op->diag.code != FKVF_OK)
        return rc;
    size_t ml;
    const char *m = fkvf_quote_body(
        e && e->code != FKVF_OK && e->message[0] ? e->message : fkvf_strerror(rc), file, rc, &ml);
    op->diag.name = file;
    fkvf_fail(&op->diag, rc, FKVF_NO_OFFSET, NULL, "%s%.*s", prefix, (int)ml, m);
    if (e && e->code != FKVF_OK) {
        op->diag.offset = e->offset;
        snprintf(op->diag.clause, sizeof op->diag.clause, "%s", e->clause ? e->clause : "");
        snprintf(op->diag.field, sizeof op->diag.field, "%s", e->field ? e->field : "");
    }
    return rc;
}

int fkvf_archive_op_fail_reader(fkvf_archive_op *op, int rc, const fkvf_reader *r,
                                const char *prefix)
{
    fkvf_error_info e;
    int have = r && fkvf_reader_error(r, &e) == FKVF_OK;
    return fkvf_archive_op_fail_from(op, rc, have ? &e : NULL, op->src, prefix);
}

FKVF_API int fkvf_archive_op_error(const fkvf_archive_op *op, fkvf_error_info *out)
{
    return fkvf_diag_report(FKVF_HANDLE_IS(op, FKVF_HANDLE_ARCHIVE_OP) ? &op->diag : NULL,
                            "not an archive operation handle", out);
}

FKVF_API void fkvf_archive_op_free(fkvf_archive_op *op)
{
    if (!FKVF_HANDLE_IS(op, FKVF_HANDLE_ARCHIVE_OP))
        return;
    const fkvf_allocator *al = op->alloc;
    fkvf_free(al, op->src);
    fkvf_free(al, op->path);
    op->h.magic = 0;
    fkvf_free(al, op);
}
