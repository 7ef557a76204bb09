/* A reader's bytes from a caller's source (fkvf_reader_open_source): the
 * file's size of address space is reserved at open (anonymous, no memory
 * committed), and rd_ensure reads the units a call needs into it before the
 * reader's code touches them, so every parser, checksum and decoder works
 * on r->data as for a mapped file. Every use of file bytes is preceded by
 * rd_ensure, and data bytes are checksummed after it (so a source that
 * changed between two reads is caught).
 *
 * Units read for the file's structures (header, directories, section
 * headers, block tables, whole sections) are pinned: kept until
 * fkvf_reader_free (views handed to the caller point into them). Units read
 * only for the data of index and token blocks form the block cache: each
 * block verified is queued, oldest first, and at a safe point
 * (rd_source_trim: between calls, restore batches, verify's blocks) the
 * oldest are dropped while the cached bytes exceed the budget: their units
 * released (madvise) and marked unread, the block marked unverified, so
 * that the next use reads and checks it again. A unit shared with a pinned
 * structure or with a neighbouring cached block stays. */
#define _DEFAULT_SOURCE 1
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "alloc.h"
#include "ckd.h"
#include "reader_impl.h"

#define FAIL(code, off, clause, ...) fkvf_fail(&r->diag, code, off, clause, __VA_ARGS__)

static int bit(const uint8_t *map, uint64_t u)
{
    return (map[u >> 3] >> (u & 7)) & 1;
}

static int have(const fkvf_reader *r, uint64_t u)
{
    return bit(r->src_have, u);
}

int rd_source_fill(fkvf_reader *r, uint64_t off, uint64_t n, int pin)
{
    if (off > r->size || n > r->size - off)
        return FAIL(FKVF_E_CORRUPT, off, NULL,
                    "read of [%llu, +%llu) beyond the source's %llu bytes",
                    (unsigned long long)off, (unsigned long long)n, (unsigned long long)r->size);
    const unsigned sh = r->src_shift;
    uint64_t u = off >> sh;
    const uint64_t last = (off + n - 1) >> sh;
    if (pin)
        for (uint64_t w = u; w <= last; w++)
            r->src_pin[w >> 3] |= (uint8_t)(1u << (w & 7));
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
    r->src_pin = fkvf_calloc(r->alloc, nbits, 1);
    if (!r->src_have || !r->src_pin)
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory for the source's unit map");
    /* units are released a page at a time: no cache below the page size */
    long page = sysconf(_SC_PAGESIZE);
    r->src_budget = page > 0 && (UINT64_C(1) << sh) >= (uint64_t)page ? FKVF_SOURCE_CACHE_DEFAULT : 0;
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

int rd_prefetch_add(fkvf_reader *r, rd_prefetch *pf, uint64_t off, uint64_t len)
{
    if (!r->src.read || !len)
        return FKVF_OK;
    const unsigned sh = r->src_shift;
    if (pf->end > pf->off && off >= pf->off && (off >> sh) <= ((pf->end - 1) >> sh) + 1) {
        if (off + len > pf->end)
            pf->end = off + len;
        return FKVF_OK;
    }
    int rc = rd_prefetch_flush(r, pf);
    pf->off = off;
    pf->end = off + len;
    return rc;
}

int rd_prefetch_flush(fkvf_reader *r, rd_prefetch *pf)
{
    uint64_t off = pf->off, n = pf->end - pf->off;
    pf->off = pf->end = 0;
    return r->src.read && n ? rd_source_fill(r, off, n, 0) : FKVF_OK;
}

void rd_source_release(fkvf_reader *r)
{
    if (r->src_map)
        munmap(r->src_map, r->src_map_size);
    fkvf_free(r->alloc, r->src_have);
    fkvf_free(r->alloc, r->src_pin);
    fkvf_free(r->alloc, r->src_q);
    r->src_map = NULL;
    r->src_have = NULL;
    r->src_pin = NULL;
    r->src_q = NULL;
    r->src_q_n = r->src_q_cap = 0;
}

/* [*off, *off + *len): the data of block b of segment g in the file */
static void block_range(const rd_seg *g, uint64_t b, uint64_t *off, uint64_t *len)
{
    uint64_t start;
    rd_block_range(g, b, &start, len);
    *off = g->data_fileoff + start;
}

int rd_source_cached(fkvf_reader *r, rd_seg *g, uint64_t b, uint64_t len)
{
    if (!r->src.read || !r->src_budget || !g->tracked || r->h.state != FKVF_HANDLE_OPEN ||
        (g->block_ok[b] & RD_BLOCK_CACHED))
        return FKVF_OK;
    if (r->src_q_n == r->src_q_cap) {
        /* grow the ring, its entries moved to the front of the new array */
        size_t cap = r->src_q_cap ? r->src_q_cap * 2 : 64;
        rd_cached *q;
        if (cap < r->src_q_cap || cap > SIZE_MAX / sizeof *q ||
            !(q = fkvf_malloc(r->alloc, cap * sizeof *q)))
            return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL,
                        "no memory for the block cache's queue of %zu blocks", cap);
        for (size_t k = 0; k < r->src_q_n; k++)
            q[k] = r->src_q[(r->src_q_head + k) % r->src_q_cap];
        fkvf_free(r->alloc, r->src_q);
        r->src_q = q;
        r->src_q_cap = cap;
        r->src_q_head = 0;
    }
    rd_cached *e = &r->src_q[(r->src_q_head + r->src_q_n) % r->src_q_cap];
    e->grp = g->h.group ? 1u : 0u;
    e->idx = g->cache_idx;
    e->b = b;
    r->src_q_n++;
    r->src_cached += len;
    g->block_ok[b] |= RD_BLOCK_CACHED;
    return FKVF_OK;
}

/* 1 if unit u holds bytes of cached block c of segment g */
static int unit_in_cached(const fkvf_reader *r, const rd_seg *g, uint64_t c, uint64_t u)
{
    if (c >= g->h.n_blocks || !(g->block_ok[c] & (RD_BLOCK_OK | RD_BLOCK_CACHED)))
        return 0;
    uint64_t off, len;
    block_range(g, c, &off, &len);
    return len && off >> r->src_shift <= u && u <= (off + len - 1) >> r->src_shift;
}

void rd_source_unread(fkvf_reader *r, const rd_seg *g, uint64_t b)
{
    uint64_t off, len;
    block_range(g, b, &off, &len);
    if (!r->src.read || !len)
        return;
    const unsigned sh = r->src_shift;
    const uint64_t u0 = off >> sh, u1 = (off + len - 1) >> sh;
    uint64_t run = 0, run_n = 0;
    long page = sysconf(_SC_PAGESIZE);
    const int release = page > 0 && (UINT64_C(1) << sh) >= (uint64_t)page;
    for (uint64_t u = u0; u <= u1 + 1; u++) {
        int go = u <= u1 && have(r, u) && !bit(r->src_pin, u) &&
                 !(u == u0 && b > 0 && unit_in_cached(r, g, b - 1, u)) &&
                 !(u == u1 && unit_in_cached(r, g, b + 1, u));
        if (go) {
            if (!run_n)
                run = u;
            run_n++;
            r->src_have[u >> 3] &= (uint8_t)~(1u << (u & 7));
            continue;
        }
        if (run_n && release)
            /* the pages come back zero-filled: they are read again first */
            (void)madvise(r->src_map + (run << sh), (size_t)(run_n << sh), MADV_DONTNEED);
        run_n = 0;
    }
}

/* Drop cached block e: unverified, its units unread (rd_source_unread). */
static void drop(fkvf_reader *r, const rd_cached *e)
{
    rd_seg *g = &r->groups[e->grp].segs[e->idx];
    uint64_t off, len;
    block_range(g, e->b, &off, &len);
    g->block_ok[e->b] = 0;
    r->src_cached -= len;
    r->src_dropped += len;
    rd_source_unread(r, g, e->b);
}

void rd_source_trim(fkvf_reader *r)
{
    if (!r->src.read || !r->src_budget)
        return;
    while (r->src_cached > r->src_budget && r->src_q_n) {
        rd_cached e = r->src_q[r->src_q_head];
        r->src_q_head = (r->src_q_head + 1) % r->src_q_cap;
        r->src_q_n--;
        drop(r, &e);
    }
}

FKVF_API int fkvf_reader_set_source_cache(fkvf_reader *r, uint64_t max_bytes)
{
    if (!FKVF_HANDLE_IS_OPEN(r, FKVF_HANDLE_READER))
        return FKVF_E_STATE;
    if (!r->src.read)
        return FKVF_OK;
    long page = sysconf(_SC_PAGESIZE);
    if (max_bytes && (page <= 0 || (UINT64_C(1) << r->src_shift) < (uint64_t)page))
        return FKVF_E_UNSUPPORTED;
    r->src_budget = max_bytes;
    if (!max_bytes) { /* everything kept from now on: nothing counted */
        while (r->src_q_n) {
            rd_cached *e = &r->src_q[r->src_q_head];
            r->groups[e->grp].segs[e->idx].block_ok[e->b] &= (uint8_t)~RD_BLOCK_CACHED;
            r->src_q_head = (r->src_q_head + 1) % r->src_q_cap;
            r->src_q_n--;
        }
        r->src_cached = 0;
    }
    rd_source_trim(r);
    return FKVF_OK;
}

FKVF_API int fkvf_reader_source_cache(const fkvf_reader *r, uint64_t *cached, uint64_t *dropped)
{
    if (!FKVF_HANDLE_IS(r, FKVF_HANDLE_READER))
        return FKVF_E_STATE;
    if (!cached || !dropped)
        return FKVF_E_INVALID_ARG;
    *cached = r->src_cached;
    *dropped = r->src_dropped;
    return FKVF_OK;
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
