/* fkvf_archive_append_sections: one commit of extra sections (such as ZIDX
 * search indexes, spec 20) appended to an existing archive (spec 7.4, 7.6),
 * through the appender's open and commit paths (append_impl.h); the error
 * on an fkvf_archive_op (archive_op.h), as compaction and recovery. */
#define _POSIX_C_SOURCE 200809L

#include "append_impl.h"
#include "archive_op.h"
#include "fkvf.h"

FKVF_API int fkvf_archive_append_sections(fkvf_archive_op **out, const char *path,
                                          const fkvf_section_add *secs, size_t n,
                                          unsigned sync)
{
    if (out)
        *out = NULL;
    if (!path || !*path || (!secs && n) || sync > FKVF_SYNC_NONE)
        return FKVF_E_INVALID_ARG;
    fkvf_archive_op *op = NULL;
    int rc = fkvf_archive_op_new(&op, path, NULL);
    if (out)
        *out = op;
    if (rc != FKVF_OK) {
        if (!out)
            fkvf_archive_op_free(op);
        return rc;
    }
    fkvf_appender *a = NULL;
    rc = fkvf_appender_open_sections(&a, path, sync);
    if (rc == FKVF_OK)
        rc = fkvf_appender_commit_sections(a, secs, n);
    if (rc != FKVF_OK) {
        fkvf_error_info e;
        int have = a && fkvf_appender_error(a, &e) == FKVF_OK && e.code != FKVF_OK;
        fkvf_archive_op_fail_from(op, rc, have ? &e : NULL, op->src, "");
    }
    fkvf_appender_free(a);
    if (!out)
        fkvf_archive_op_free(op);
    return rc;
}
