#if defined(__linux__)
#define _DEFAULT_SOURCE /* madvise, MADV_DONTNEED */
#else
#define _POSIX_C_SOURCE 200809L
#endif
#include "filemap.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"

static const uint8_t empty[1] = {0};

static int read_all(fkvf_filemap *m, int fd, size_t n, const fkvf_allocator *alloc,
                    fkvf_diag *d)
{
    size_t got = 0;
    uint8_t *buf = fkvf_malloc(alloc, n);
    if (!buf)
        return fkvf_fail(d, FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory to read %zu bytes",
                         n);
    if (lseek(fd, 0, SEEK_SET) != 0) {
        int e = errno;
        fkvf_free(alloc, buf);
        return fkvf_fail(d, FKVF_E_IO, FKVF_NO_OFFSET, NULL, "lseek: %s", strerror(e));
    }
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            int e = errno;
            fkvf_free(alloc, buf);
            return fkvf_fail(d, FKVF_E_IO, got, NULL, "read: %s", strerror(e));
        }
        if (k == 0)
            break; /* the file shrank meanwhile: what was read is the file */
        got += (size_t)k;
    }
    m->owned = buf;
    m->data = buf;
    m->size = got;
    return FKVF_OK;
}

int fkvf_filemap_fd(fkvf_filemap *m, int fd, int read_copy, const fkvf_allocator *alloc,
                    fkvf_diag *d)
{
    memset(m, 0, sizeof *m);
    m->data = empty;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return fkvf_fail(d, FKVF_E_IO, FKVF_NO_OFFSET, NULL, "fstat: %s", strerror(errno));
    if (!S_ISREG(st.st_mode))
        return fkvf_fail(d, FKVF_E_IO, FKVF_NO_OFFSET, NULL, "not a regular file");
    if (st.st_size <= 0)
        return FKVF_OK;
    /* a 32-bit build: the whole file must fit the address space (the size
     * must not wrap: a file of 4 GiB + 64 bytes is not a 64-byte file) */
    if ((uint64_t)st.st_size > SIZE_MAX)
        return fkvf_fail(d, FKVF_E_LIMIT, FKVF_NO_OFFSET, "15",
                         "file of %llu bytes is larger than this build's address space "
                         "(%zu-bit): open it on a 64-bit build",
                         (unsigned long long)st.st_size, sizeof(size_t) * 8);
    if (read_copy)
        return read_all(m, fd, (size_t)st.st_size, alloc, d);
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED)
        return fkvf_fail(d, FKVF_E_IO, FKVF_NO_OFFSET, NULL, "mmap: %s", strerror(errno));
    m->map = p;
    m->map_size = (size_t)st.st_size;
    m->data = p;
    m->size = (size_t)st.st_size;
    return FKVF_OK;
}

void fkvf_filemap_drop(const fkvf_filemap *m, uint64_t off, uint64_t len)
{
#if defined(__linux__) && defined(MADV_DONTNEED)
    long pg = sysconf(_SC_PAGESIZE);
    if (!m->map || pg <= 0 || off >= m->map_size)
        return;
    if (len > m->map_size - off)
        len = m->map_size - off;
    uint64_t a = (off + (uint64_t)pg - 1) / (uint64_t)pg * (uint64_t)pg; /* whole pages */
    uint64_t b = (off + len) / (uint64_t)pg * (uint64_t)pg;
    if (b > a) /* read-only and private: nothing of ours is lost */
        (void)madvise((uint8_t *)m->map + a, (size_t)(b - a), MADV_DONTNEED);
#else
    (void)m;
    (void)off;
    (void)len;
#endif
}

void fkvf_filemap_release(fkvf_filemap *m, const fkvf_allocator *alloc)
{
    if (m->map)
        munmap(m->map, m->map_size);
    fkvf_free(alloc, m->owned);
    memset(m, 0, sizeof *m);
    m->data = empty;
}
