/* fkvf_archive_recover (fkvf.h, whole-archive operations): cut off a torn
 * tail, the bytes after the last complete commit that an append left when
 * it did not complete (spec 7.7). Under the appender's lock (append_impl.h),
 * the file is truncated to its committed size, synced, and must then open
 * clean (strict) at the same commit. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "fkvf.h"
#include "append_impl.h"
#include "archive_op.h"

FKVF_API void fkvf_recover_options_init(fkvf_recover_options *opts)
{
    if (opts)
        memset(opts, 0, sizeof *opts);
}

/* The file's state as a reader sees it. */
static int state_of(fkvf_archive_op *op, unsigned flags, fkvf_archive_info *ai)
{
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, op->src, flags, op->alloc);
    if (rc == FKVF_OK)
        rc = fkvf_reader_info(r, ai);
    if (rc != FKVF_OK)
        fkvf_archive_op_fail_reader(op, rc, r, flags & FKVF_OPEN_STRICT ? "after the cut: " : "");
    fkvf_reader_free(r); /* unmapped before the file is truncated */
    return rc;
}

static int recover(fkvf_archive_op *op, const fkvf_recover_options *o, fkvf_recover_result *res)
{
    int fd = -1, rc = FKVF_OK;
    /* no appender may write while the tail is cut (a dry run only reads) */
    if (!o->dry_run && (rc = fkvf_append_lock(op->src, O_RDWR, "recovering", &op->diag, &fd)))
        return rc;
    fkvf_archive_info ai;
    if ((rc = state_of(op, 0, &ai)) == FKVF_OK) {
        res->file_size = ai.file_size;
        res->committed_size = ai.committed_size;
        res->torn_bytes = ai.torn_bytes;
        res->commits = ai.n_commits;
        res->positions = ai.n_positions;
    }
    if (rc == FKVF_OK && ai.torn_bytes && !o->dry_run) {
        if (ftruncate(fd, (off_t)ai.committed_size) != 0 || (o->sync != FKVF_SYNC_NONE && fsync(fd) != 0)) {
            int e = errno;
            rc = fkvf_archive_op_fail(op, op->src, FKVF_E_IO,
                                      "cannot truncate to %" PRIu64 " bytes: %s",
                                      ai.committed_size, strerror(e));
        } else {
            res->truncated = 1;
            /* it must now open clean at the same commit */
            fkvf_archive_info after;
            rc = state_of(op, FKVF_OPEN_STRICT, &after);
            if (rc == FKVF_OK && after.n_commits != ai.n_commits)
                rc = fkvf_archive_op_fail(op, op->src, FKVF_E_CORRUPT,
                                          "after the cut: %" PRIu64 " commits, not %" PRIu64,
                                          after.n_commits, ai.n_commits);
        }
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

FKVF_API int fkvf_archive_recover(fkvf_archive_op **out, const char *path,
                                  const fkvf_recover_options *opts, fkvf_recover_result *result)
{
    if (out)
        *out = NULL;
    fkvf_recover_result res;
    memset(&res, 0, sizeof res);
    if (result)
        *result = res;
    fkvf_recover_options o;
    fkvf_recover_options_init(&o);
    if (opts)
        o = *opts;
    if (!path || !*path || o.sync > FKVF_SYNC_NONE)
        return FKVF_E_INVALID_ARG;
    fkvf_archive_op *op = NULL;
    int rc = fkvf_archive_op_new(&op, path, o.alloc);
    if (out)
        *out = op;
    if (rc == FKVF_OK)
        rc = recover(op, &o, &res);
    if (result)
        *result = res;
    if (!out)
        fkvf_archive_op_free(op);
    return rc;
}
