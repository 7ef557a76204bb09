/* A regular file's bytes for a reader: mapped read-only, or read into
 * memory (a private copy that others truncating the file cannot fault,
 * spec 18.5). Used by fkvf_reader_open_file and fkvf_validate_file. */
#ifndef FKVF_COMMON_FILEMAP_H
#define FKVF_COMMON_FILEMAP_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "fkvf.h"

typedef struct fkvf_filemap {
    const uint8_t *data; /* size bytes; a static empty buffer when size is 0 */
    size_t size;
    void *map; /* mapped: map_size bytes to munmap */
    size_t map_size;
    uint8_t *owned; /* read: the copy, from alloc */
} fkvf_filemap;

/* The regular file open as fd into *m (fd is not closed, and may be once
 * this returns): mapped (MAP_PRIVATE, PROT_READ), or with `read_copy` read
 * from offset 0 with alloc, as many bytes as it has (a file that shrinks
 * while it is read ends where the reading ended). Errors are recorded in d:
 * FKVF_E_IO (fstat, not a regular file, lseek, read, mmap), FKVF_E_LIMIT
 * (larger than the address space), FKVF_E_NOMEM. On error *m holds nothing
 * to release. */
int fkvf_filemap_fd(fkvf_filemap *m, int fd, int read_copy, const fkvf_allocator *alloc,
                    fkvf_diag *d);
/* The pages wholly inside bytes [off, off + len) of a mapped file leave the
 * process's resident set (Linux: madvise MADV_DONTNEED; the bytes stay in
 * the page cache and a later access maps them again); elsewhere, and for a
 * read copy, nothing happens. For bytes read once (checked) and not needed
 * again soon, so that a pass over a large file does not hold it all. */
void fkvf_filemap_drop(const fkvf_filemap *m, uint64_t off, uint64_t len);
/* Unmap or free what *m holds (alloc: the one it was read with); *m is then
 * empty. */
void fkvf_filemap_release(fkvf_filemap *m, const fkvf_allocator *alloc);

#endif
