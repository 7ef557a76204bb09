/* A reader's bytes from a caller's source (fkvf_reader_open_source): the
 * file's size of address space is reserved at open (anonymous, no memory
 * committed), and rd_ensure reads the units a call needs into it before the
 * reader's code touches them, so every parser, checksum and decoder works
 * on r->data as for a mapped file. A unit once read stays (a view handed to
 * the caller stays valid); bytes never read are never used: every use of
 * file bytes is preceded by rd_ensure, and data bytes are checksummed
 * after it (so a source that changed between two reads is caught). */
#define _DEFAULT_SOURCE 1
#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "alloc.h"
#include "ckd.h"
#include "reader_impl.h"

#define FAIL(code, off, clause, ...) fkvf_fail(&r->diag, code, off, clause, __VA_ARGS__)

static int have(const fkvf_reader *r, uint64_t u)
{
    return (r->src_have[u >> 3] >> (u & 7)) & 1;
}

int rd_source_fill(fkvf_reader *r, uint64_t off, uint64_t n)
{
    if (off > r->size || n > r->size - off)
        return FAIL(FKVF_E_CORRUPT, off, NULL,
                    "read of [%llu, +%llu) beyond the source's %llu bytes",
                    (unsigned long long)off, (unsigned long long)n, (unsigned long long)r->size);
    const unsigned sh = r->src_shift;
    uint64_t u = off >> sh;
    const uint64_t last = (off + n - 1) >> sh;
    while (u <= last) {
        if (have(r, u)) {
            u++;
            continue;
        }
        /* a run of missing units: one read call */
        uint64_t v = u;
        while (v < last && !have(r, v + 1))
            v++;
        uint64_t a = u << sh, b = (v + 1) << sh;
        if (b > r->size)
            b = r->size;
        size_t len = (size_t)(b - a); /* <= size, which fits the reservation */
        int rc = r->src.read(r->src.opaque, a, r->src_map + a, len);
        if (rc != FKVF_OK) {
            /* the file is not at fault: FKVF_E_NOMEM as such, else I/O */
            int code = rc == FKVF_E_NOMEM ? FKVF_E_NOMEM : FKVF_E_IO;
            return FAIL(code, a, NULL, "source: reading bytes [%llu, +%zu) failed (%s)",
                        (unsigned long long)a, len, fkvf_strerror(rc));
        }
        r->src_bytes += len;
        r->src_reads++;
        for (uint64_t w = u; w <= v; w++)
            r->src_have[w >> 3] |= (uint8_t)(1u << (w & 7));
        u = v + 1;
    }
    return FKVF_OK;
}

/* The reservation and the unit bitmap for src (size checked by the caller
 * against the address space). */
int rd_source_init(fkvf_reader *r, const fkvf_source *src, uint32_t unit)
{
    if (unit == 0)
        unit = 4096;
    unsigned sh = 0;
    while ((UINT32_C(1) << sh) < unit)
        sh++;
    r->src_shift = sh;
    size_t size;
    if (!fkvf_tosz(src->size, &size) || size > SIZE_MAX - 4096)
        return FAIL(FKVF_E_LIMIT, FKVF_NO_OFFSET, "15",
                    "a source of %llu bytes is larger than this machine's address space",
                    (unsigned long long)src->size);
    uint64_t units = (src->size >> sh) + 1;
    size_t nbits;
    if (!fkvf_tosz(units / 8 + 1, &nbits))
        return FAIL(FKVF_E_LIMIT, FKVF_NO_OFFSET, "15", "source too large");
    r->src_have = fkvf_calloc(r->alloc, nbits, 1);
    if (!r->src_have)
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory for the source's unit map");
    size_t len = size ? size : 1;
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        return FAIL(e == ENOMEM ? FKVF_E_NOMEM : FKVF_E_IO, FKVF_NO_OFFSET, NULL,
                    "cannot reserve %zu bytes of address space for the source: mmap: %s", len,
                    strerror(e));
    }
    r->src_map = m;
    r->src_map_size = len;
    r->src = *src;
    r->data = r->src_map;
    r->size = src->size;
    return FKVF_OK;
}

void rd_source_release(fkvf_reader *r)
{
    if (r->src_map)
        munmap(r->src_map, r->src_map_size);
    fkvf_free(r->alloc, r->src_have);
    r->src_map = NULL;
    r->src_have = NULL;
}

FKVF_API int fkvf_reader_source_stats(const fkvf_reader *r, uint64_t *bytes, uint64_t *reads)
{
    if (!FKVF_HANDLE_IS(r, FKVF_HANDLE_READER))
        return FKVF_E_STATE;
    if (!bytes || !reads)
        return FKVF_E_INVALID_ARG;
    *bytes = r->src_bytes;
    *reads = r->src_reads;
    return FKVF_OK;
}
