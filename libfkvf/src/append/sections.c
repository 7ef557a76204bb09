/* fkvf_archive_append_sections: one commit of extra sections (such as ZIDX
 * search indexes, spec 20) appended to an existing archive (spec 7.4, 7.6),
 * through the appender's open and commit paths (append_impl.h). */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>

#include "append_impl.h"
#include "fkvf.h"

static int say(char *msg, size_t n, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int say(char *msg, size_t n, int rc, const char *fmt, ...)
{
    if (msg && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, n, fmt, ap);
        va_end(ap);
    }
    return rc;
}

FKVF_API int fkvf_archive_append_sections(const char *path, const fkvf_section_add *secs,
                                          size_t n, unsigned sync, char *msg, size_t msg_size)
{
    if (msg && msg_size)
        msg[0] = 0;
    if (!path || (!secs && n) || sync > FKVF_SYNC_NONE)
        return say(msg, msg_size, FKVF_E_INVALID_ARG, "invalid arguments");
    fkvf_appender *a = NULL;
    int rc = fkvf_appender_open_sections(&a, path, sync);
    if (rc == FKVF_OK)
        rc = fkvf_appender_commit_sections(a, secs, n);
    if (rc)
        say(msg, msg_size, rc, "%s", a ? fkvf_appender_message(a) : fkvf_strerror(rc));
    fkvf_appender_free(a);
    return rc;
}
