/* Internal to the append module: the appender's lock protocol (for the
 * appender and a compaction in place), and its open and commit paths for
 * commits that add only extra sections (fkvf_archive_append_sections). */
#ifndef FKVF_APPEND_IMPL_H
#define FKVF_APPEND_IMPL_H

#include <stddef.h>

#include "error.h"
#include "fkvf.h"

/* The one copy of the lock that makes an appender the only writer of a file
 * (spec 7.4): open PATH with oflags (O_RDWR for an appender, O_RDONLY for a
 * compaction in place; O_CLOEXEC is added), take an exclusive flock without
 * waiting, and check that the file locked is still the one PATH names: a
 * file renamed over PATH between the open and the lock (a compaction in
 * place) is opened and locked instead, 8 attempts at most. *fd: the locked
 * descriptor (closing it releases the lock), -1 on failure. purpose names
 * the use in the message of a failed open ("appending"). FKVF_OK, or
 * FKVF_E_IO recorded in d (clause 7.4 when another process holds the lock
 * or keeps replacing the file). */
int fkvf_append_lock(const char *path, int oflags, const char *purpose, fkvf_diag *d, int *fd);

/* Open PATH for appending sections only: the file's state is read (lock,
 * torn-tail refusal, groups, codecs) but not the codebook, the window or the
 * streams' partial units, which such a commit does not touch. */
int fkvf_appender_open_sections(fkvf_appender **out, const char *path, unsigned sync);
/* One commit of the given sections; positions and streams unchanged. */
int fkvf_appender_commit_sections(fkvf_appender *a, const fkvf_section_add *secs, size_t n);

/* The copy of fkvf_archive_compact (compact.c) for the appender's automatic
 * compaction: the archive at src, whose lock the caller holds, rewritten
 * into the sink (the writer syncs it before and after the trailer through
 * sink->sync), with nothing renamed; dst_name names the sink's file in
 * messages. ext_shape: the shape of src's external
 * codebook, which the copy's reader has no file for (NULL: src has none).
 * FKVF_OK, or the error recorded in d ("auto-compaction: ..."). */
/* The number of index streams of r: every stream before the token stream
 * (spec 11.2: the index group, in code order, then the token stream), by
 * index, without their names (which a layer table of an external codebook
 * not attached would give). 0 when there are none or the count fails. */
size_t fkvf_append_index_streams(const fkvf_reader *r);

int fkvf_compact_to_sink(const char *src, const char *dst_name, const fkvf_sink *sink,
                         const fkvf_codebook_shape *ext_shape, const fkvf_allocator *alloc,
                         fkvf_diag *d);

#endif
