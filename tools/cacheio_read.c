/*
 * cacheio_read.c - reading a cache file: format detection (by name, by
 * content), kvio_read_mem and kvio_read (the file mapped into memory).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cacheio_impl.h"

kvio_format kvio_format_from_path(const char *path)
{
    static const struct {
        const char *ext;
        kvio_format fmt;
    } E[] = {{".safetensors", KVIO_FMT_SAFETENSORS}, {".npy", KVIO_FMT_NPY}, {".npz", KVIO_FMT_NPZ}};
    size_t n = path ? strlen(path) : 0;
    for (size_t i = 0; i < sizeof E / sizeof E[0]; i++) {
        size_t m = strlen(E[i].ext);
        if (n < m)
            continue;
        size_t k;
        for (k = 0; k < m; k++) {
            char ch = path[n - m + k];
            if (ch >= 'A' && ch <= 'Z')
                ch = (char)(ch - 'A' + 'a');
            if (ch != E[i].ext[k])
                break;
        }
        if (k == m)
            return E[i].fmt;
    }
    return KVIO_FMT_AUTO;
}

kvio_format kvio_format_sniff(const void *data, size_t size)
{
    const uint8_t *d = data;
    if (!d)
        return KVIO_FMT_AUTO;
    if (size >= 6 && !memcmp(d, cio_npy_magic, 6))
        return KVIO_FMT_NPY;
    if (size >= 4 && d[0] == 'P' && d[1] == 'K' &&
        ((d[2] == 3 && d[3] == 4) || (d[2] == 5 && d[3] == 6)))
        return KVIO_FMT_NPZ;
    if (size >= 9 && rd64(d) <= size - 8 && d[8] == '{')
        return KVIO_FMT_SAFETENSORS;
    return KVIO_FMT_AUTO;
}

/* kvio_read_mem with every flag (kvio_read's borrowing and lazy reading). */
static int read_mem(const void *data, size_t size, const char *name, kvio_format fmt,
                    unsigned flags, kvio_cache *out, char *err, size_t errlen)
{
    ctx x = {name, err, errlen};
    if (fmt == KVIO_FMT_AUTO)
        fmt = kvio_format_sniff(data, size);
    if (fmt == KVIO_FMT_AUTO)
        fmt = kvio_format_from_path(name);
    switch (fmt) {
    case KVIO_FMT_SAFETENSORS: return kvio_read_safetensors_mem(data, size, name, flags, out, err, errlen);
    case KVIO_FMT_NPY: return kvio_read_npy_mem(data, size, name, flags, out, err, errlen);
    case KVIO_FMT_NPZ: return kvio_read_npz_mem(data, size, name, flags, out, err, errlen);
    default:
        if (out)
            memset(out, 0, sizeof *out);
        return cio_fail(&x, KVIO_E_FORMAT, "not a .safetensors, .npy or .npz file");
    }
}

int kvio_read_mem(const void *data, size_t size, const char *name, kvio_format fmt,
                  unsigned flags, kvio_cache *out, char *err, size_t errlen)
{
    /* the bytes are the caller's: never pointed to, never left in a file */
    return read_mem(data, size, name, fmt, flags & ~(KVIO_READ_BORROW | KVIO_READ_LAZY), out, err,
                    errlen);
}

int kvio_read(const char *path, kvio_format fmt, unsigned flags, kvio_cache *out, char *err, size_t errlen)
{
    ctx x = {path, err, errlen};
    if (out)
        memset(out, 0, sizeof *out);
    if (!path || !out)
        return cio_fail(&x, KVIO_E_ARG, "no path or output cache");
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return cio_fail(&x, KVIO_E_IO, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return cio_fail(&x, KVIO_E_IO, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return cio_fail(&x, KVIO_E_IO, "not a regular file");
    }
    if (st.st_size == 0) {
        close(fd);
        return cio_fail(&x, KVIO_E_FORMAT, "empty file");
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return cio_fail(&x, KVIO_E_NOMEM, "file too large for this platform");
    }
    size_t size = (size_t)st.st_size;
    /* private and writable: tensors read in place (KVIO_READ_BORROW) may be
     * changed by the caller; the file never is */
    void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    int e = errno;
    if (map == MAP_FAILED) {
        close(fd);
        return cio_fail(&x, KVIO_E_IO, "cannot map: %s", strerror(e));
    }
    int rc = read_mem(map, size, path, fmt, flags | KVIO_READ_BORROW, out, err, errlen);
    int keep = 0;
    if (rc == KVIO_OK) {
        out->map = map; /* for kvio_in_map */
        out->map_size = size;
    }
    if (rc == KVIO_OK && (flags & KVIO_READ_LAZY)) {
        /* the tensors left in the mapping are read from fd from now on
         * (fd is the cache's now, or closed) */
        rc = cio_lazy_adopt(&x, out, fd, map, size, (flags & KVIO_READ_NHD) != 0);
        if (rc != KVIO_OK) {
            kvio_cache_free(out); /* unmaps */
            return rc;
        }
        out->map = NULL;
        out->map_size = 0;
        munmap(map, size);
        return KVIO_OK;
    }
    close(fd);
    if (rc == KVIO_OK) {
        for (uint32_t l = 0; l < out->n_layers && !keep; l++)
            keep = kvio_in_map(out, out->keys[l]) || kvio_in_map(out, out->values[l]);
    }
    if (!keep) {
        munmap(map, size);
        if (rc == KVIO_OK) {
            out->map = NULL;
            out->map_size = 0;
        }
    }
    return rc;
}

/* ---- output files: a temporary file next to the output, put in place ---- */
