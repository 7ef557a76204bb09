/* fkvf_archive_append_sections: one commit of extra sections (such as ZIDX
 * search indexes, spec 20) appended to an existing archive (spec 7.4, 7.6),
 * through the appender's open and commit paths (append_impl.h). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include "append_impl.h"
#include "fkvf.h"

/* err (when not NULL) as fkvf.h says: the error of a (when a has one) or
 * rc with its description, the strings copied into err. */
static int report(fkvf_error_report *err, int rc, const char *path, const fkvf_appender *a)
{
    if (!err)
        return rc;
    memset(err, 0, sizeof *err);
    err->info.code = rc;
    err->info.offset = FKVF_ERROR_NO_OFFSET;
    err->info.file = path ? path : "";
    err->info.message = err->message;
    if (rc == FKVF_OK)
        return rc;
    fkvf_error_info ai;
    if (a && fkvf_appender_error(a, &ai) == FKVF_OK && ai.code != FKVF_OK) {
        err->info.offset = ai.offset;
        if (ai.clause) {
            snprintf(err->clause, sizeof err->clause, "%s", ai.clause);
            err->info.clause = err->clause;
        }
        snprintf(err->message, sizeof err->message, "%s", ai.message);
    } else {
        snprintf(err->message, sizeof err->message, "%s",
                 rc == FKVF_E_INVALID_ARG ? "invalid arguments" : fkvf_strerror(rc));
    }
    return rc;
}

FKVF_API int fkvf_archive_append_sections(const char *path, const fkvf_section_add *secs,
                                          size_t n, unsigned sync, fkvf_error_report *err)
{
    if (!path || (!secs && n) || sync > FKVF_SYNC_NONE)
        return report(err, FKVF_E_INVALID_ARG, path, NULL);
    fkvf_appender *a = NULL;
    int rc = fkvf_appender_open_sections(&a, path, sync);
    if (rc == FKVF_OK)
        rc = fkvf_appender_commit_sections(a, secs, n);
    report(err, rc, path, a);
    fkvf_appender_free(a);
    return rc;
}
