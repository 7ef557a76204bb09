/* Internal: continue an existing file with further commits (spec 7.4, 7.6).
 * Used by the appender (src/append), which establishes the file's state
 * with a reader first. Not part of the public API. */
#ifndef FKVF_WRITER_RESUME_H
#define FKVF_WRITER_RESUME_H

#include <stddef.h>
#include <stdint.h>

#include "fkvf.h"

typedef struct fkvf_resume {
    int fd;               /* open read-write; the writer owns it from the call on */
    const char *path;     /* for messages */
    uint64_t committed_size; /* end of the served trailer: the new commit starts here */
    uint64_t last_seq;       /* commit_seq of that trailer */
    uint64_t required_features, optional_features; /* of the file's header */
    const fkvf_desc *desc;
    int cb_kind;                     /* 0 none, 1 embedded, 2 external */
    const fkvf_codebook_shape *cb;   /* when cb_kind != 0 */
    int index_present, token_present;
    fkvf_stream_spec index_spec, token_spec;
    uint64_t index_length, token_length;
    uint64_t n_positions, n_archived;
    const uint32_t *vtxs; /* N of every VTXS section in the file */
    size_t n_vtxs;
    const fkvf_io *io;    /* NULL: write(2), fdatasync(2) */
} fkvf_resume;

/* A writer positioned at st->committed_size (the file is truncated there:
 * bytes after it belong to no commit, spec 7.7). Its next commit is
 * last_seq + 1. finish() closes the file without renaming. */
int fkvf_writer_resume(fkvf_writer **out, const fkvf_resume *st, const fkvf_writer_options *opts,
                       const fkvf_allocator *alloc);

/* After a failed commit: truncate the file back to the end of the last
 * complete commit (best effort; spec 7.7) so that it opens clean. */
int fkvf_writer_rollback(fkvf_writer *w);

/* fdatasync the file now (FKVF_SYNC_NONE appenders). */
int fkvf_writer_sync_now(fkvf_writer *w);

/* Bytes of the file up to the end of the last complete commit. */
uint64_t fkvf_writer_committed_size(const fkvf_writer *w);

#endif
