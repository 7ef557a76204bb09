/* Internal to the append module: the appender's open and commit paths for
 * commits that add only extra sections (fkvf_archive_append_sections). */
#ifndef FKVF_APPEND_IMPL_H
#define FKVF_APPEND_IMPL_H

#include <stddef.h>

#include "fkvf.h"

/* Open PATH for appending sections only: the file's state is read (lock,
 * torn-tail refusal, groups, codecs) but not the codebook, the window or the
 * streams' partial units, which such a commit does not touch. */
int fkvf_appender_open_sections(fkvf_appender **out, const char *path, unsigned sync);
/* One commit of the given sections; positions and streams unchanged. */
int fkvf_appender_commit_sections(fkvf_appender *a, const fkvf_section_add *secs, size_t n);

#endif
