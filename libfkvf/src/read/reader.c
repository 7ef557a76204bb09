/* The FKVF reader handle: opening from memory, a file or a descriptor
 * (spec 7; the steps in chain.c and load.c), freeing, its messages, and the
 * bytes of a section, checksum-verified and inflated on first touch. The
 * queries are in query.c, stream.c and codebook.c. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "alloc.h"
#include "ckd.h"
#include "hash.h"
#include "le.h"
#include "reader_impl.h"

#define FAIL(code, off, clause, ...) fkvf_fail(&r->diag, code, off, clause, __VA_ARGS__)

/* A handle whose open failed is still set (for its message, which stays)
 * but may hold a partly loaded state: nothing of it is served. */
int rd_enter(const fkvf_reader *r) { return FKVF_HANDLE_ENTER(r, FKVF_HANDLE_READER, "reader"); }

/* ---- section bytes --------------------------------------------------------- */

static int inflate_exact(const rd_section *s, const uint8_t *src, uint8_t *dst, fkvf_diag *d)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit(&z) != Z_OK)
        return fkvf_fail(d, FKVF_E_NOMEM, s->e.offset, NULL, "zlib: inflateInit failed");
    /* zlib counts in uInt: feed in chunks so sizes above 4 GiB work. */
    uint64_t in_left = s->e.stored_size, out_left = s->e.size;
    const uint8_t *in = src;
    uint8_t *out = dst;
    int zr = Z_OK;
    /* inflate() refuses a NULL next_out even with avail_out == 0: an empty
     * section (size 0) never sets it in the loop below. */
    z.next_out = dst;
    while (zr == Z_OK) {
        if (z.avail_in == 0 && in_left) {
            uInt c = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
            z.next_in = (Bytef *)(uintptr_t)in;
            z.avail_in = c;
            in += c;
            in_left -= c;
        }
        if (z.avail_out == 0 && out_left) {
            uInt c = out_left > (1u << 30) ? (1u << 30) : (uInt)out_left;
            z.next_out = out;
            z.avail_out = c;
            out += c;
            out_left -= c;
        }
        uInt before_in = z.avail_in, before_out = z.avail_out;
        zr = inflate(&z, Z_NO_FLUSH);
        if (zr == Z_BUF_ERROR && z.avail_in == before_in && z.avail_out == before_out)
            break; /* no progress possible */
        if (zr == Z_BUF_ERROR)
            zr = Z_OK;
    }
    uint64_t produced = z.total_out;
    int ended = zr == Z_STREAM_END;
    int trailing = z.avail_in != 0 || in_left != 0;
    inflateEnd(&z);
    if (!ended)
        return fkvf_fail(d, FKVF_E_DEFLATE, s->e.offset, "4.4",
                    "section: deflate stream invalid or longer than size %llu",
                    (unsigned long long)s->e.size);
    if (produced != s->e.size || trailing)
        return fkvf_fail(d, FKVF_E_DEFLATE, s->e.offset, "4.4",
                    "section: inflates to %llu bytes (size says %llu)%s",
                    (unsigned long long)produced, (unsigned long long)s->e.size,
                    trailing ? ", with bytes after the stream" : "");
    return FKVF_OK;
}

/* The checksum of section s (and its inflation, once), errors into d:
 * the reader's message, or one of verify's workers' (rd_check_par). */
static int section_check(fkvf_reader *r, rd_section *s, fkvf_diag *d)
{
    const uint8_t *src = r->data + s->e.offset;
    size_t stored;
    if (!fkvf_tosz(s->e.stored_size, &stored))
        return fkvf_fail(d, FKVF_E_LIMIT, s->e.offset, "15", "section too large for this machine");
    int rc = rd_ensure(r, s->e.offset, s->e.stored_size); /* in bounds: spec 4.5, at load */
    if (rc)
        return rc;
    uint64_t sum = fkvf_xxh3_64(src, stored, s->e.offset);
    if (sum != s->e.checksum) {
        char tn[12];
        fkvf_type_name(s->e.type, tn);
        return fkvf_fail(d, FKVF_E_CHECKSUM, s->e.offset, "4.6",
                    "section %s (key %llu): checksum stored %016llx, computed %016llx", tn,
                    (unsigned long long)s->e.key, (unsigned long long)s->e.checksum,
                    (unsigned long long)sum);
    }
    /* Inflate once: views of the buffer handed out earlier stay valid when
     * verify re-checks the section (the checksum above covers the input). */
    if ((s->e.flags & FKVF_SECTION_DEFLATE) && !s->inflated) {
        size_t n;
        if (!fkvf_tosz(s->e.size, &n))
            return fkvf_fail(d, FKVF_E_LIMIT, s->e.offset, "15", "section too large for this machine");
        uint8_t *buf = fkvf_malloc(r->alloc, n ? n : 1);
        if (!buf)
            return fkvf_fail(d, FKVF_E_NOMEM, s->e.offset, NULL, "no memory to inflate %zu bytes", n);
        rc = inflate_exact(s, src, buf, d);
        if (rc) {
            fkvf_free(r->alloc, buf);
            return rc;
        }
        s->inflated = buf;
    }
    s->checked = 1;
    return FKVF_OK;
}

void rd_section_drop(fkvf_reader *r, size_t i)
{
    const rd_section *s = &r->sections[i];
    fkvf_filemap_drop(&r->file, s->e.offset, s->e.stored_size);
}

int rd_section_bytes(fkvf_reader *r, size_t i, const uint8_t **p, uint64_t *size)
{
    rd_section *s = &r->sections[i];
    if (!s->checked) {
        int rc = section_check(r, s, &r->diag);
        if (rc)
            return rc;
    }
    *p = s->inflated ? s->inflated : r->data + s->e.offset;
    *size = s->e.size;
    return FKVF_OK;
}

int rd_section_check(fkvf_reader *r, size_t i, fkvf_diag *d)
{
    r->sections[i].checked = 0;
    return section_check(r, &r->sections[i], d);
}

/* ---- open / free ------------------------------------------------------------- */

static int reader_new(fkvf_reader **out, const fkvf_allocator *alloc, const char *name,
                      unsigned flags)
{
    alloc = fkvf_alloc_or_default(alloc);
    fkvf_reader *r = fkvf_calloc(alloc, 1, sizeof *r);
    if (!r)
        return FKVF_E_NOMEM;
    fkvf_handle_init(&r->h, FKVF_HANDLE_READER);
    fkvf_handle_fail(&r->h, FKVF_E_STATE); /* until it is loaded */
    r->alloc = alloc;
    r->flags = flags;
    if (name) {
        r->name = fkvf_strndup(alloc, name, strlen(name));
        if (!r->name) {
            fkvf_free(alloc, r);
            return FKVF_E_NOMEM;
        }
    }
    r->diag.name = r->name ? r->name : "<memory>";
    *out = r;
    return FKVF_OK;
}

/* The header (spec 3.1), the size limit (spec 15) and the served commit's
 * chain (spec 7.2): the first steps of every open, the validator's too. */
static int load_head(fkvf_reader *r)
{
    size_t avail = r->size < FKVF_HEADER_SIZE ? (size_t)r->size : FKVF_HEADER_SIZE;
    int rc = rd_ensure(r, 0, avail);
    if (rc || (rc = fkvf_header_parse(r->data, avail, &r->hdr, &r->diag)))
        return rc;
    if (r->size > FKVF_MAX_FILE)
        return FAIL(FKVF_E_LIMIT, FKVF_NO_OFFSET, "15", "file larger than 2^62 bytes");
    return rd_find_head(r);
}

static int reader_load(fkvf_reader *r)
{
    int rc;
    if ((rc = load_head(r)) || (rc = rd_load_directories(r)) || (rc = rd_load_contents(r)))
        return rc;
    r->h.state = FKVF_HANDLE_OPEN;
    return FKVF_OK;
}

/* For the validator (validate.c): a handle over `data` with the header
 * parsed and the served commit's chain established (spec 3.1, 7.2), in
 * non-strict mode; no directory is loaded. *out is set whenever a handle was
 * made (its message says what failed); free it with fkvf_reader_free. */
int rd_open_chain(fkvf_reader **out, const void *data, size_t size, const char *name,
                  const fkvf_allocator *alloc)
{
    *out = NULL;
    fkvf_reader *r;
    int rc = reader_new(&r, alloc, name, 0);
    if (rc)
        return rc;
    static const uint8_t empty[1] = {0};
    r->data = size ? data : empty;
    r->size = size;
    *out = r;
    return load_head(r);
}

FKVF_API int fkvf_reader_open_memory(fkvf_reader **out, const void *data, size_t size,
                                     unsigned flags, const fkvf_allocator *alloc)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!data && size)
        return FKVF_E_INVALID_ARG;
    if (flags & ~FKVF_OPEN_STRICT)
        return FKVF_E_INVALID_ARG;
    fkvf_reader *r;
    int rc = reader_new(&r, alloc, NULL, flags);
    if (rc)
        return rc;
    static const uint8_t empty[1] = {0};
    r->data = size ? data : empty;
    r->size = size;
    *out = r;
    return reader_load(r);
}

/* The file open as fd into r (r->flags): mapped, or read into memory with
 * FKVF_OPEN_READ (from offset 0), then loaded. Does not close fd. */
static int load_fd(fkvf_reader *r, int fd)
{
    int rc = fkvf_filemap_fd(&r->file, fd, (r->flags & FKVF_OPEN_READ) != 0, r->alloc, &r->diag);
    if (rc)
        return rc;
    r->data = r->file.data;
    r->size = r->file.size;
    return reader_load(r);
}

int rd_open_fd(fkvf_reader **out, int fd, const char *name, unsigned flags,
               const fkvf_allocator *alloc)
{
    *out = NULL;
    fkvf_reader *r;
    int rc = reader_new(&r, alloc, name, flags);
    if (rc)
        return rc;
    *out = r;
    return load_fd(r, fd);
}

FKVF_API int fkvf_reader_open_source(fkvf_reader **out, const fkvf_source *src, uint32_t unit,
                                     const char *name, unsigned flags,
                                     const fkvf_allocator *alloc)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!src || !src->read || (flags & ~FKVF_OPEN_STRICT) ||
        (unit && (unit < 512 || unit > (UINT32_C(1) << 24) || (unit & (unit - 1)))))
        return FKVF_E_INVALID_ARG;
    fkvf_reader *r;
    int rc = reader_new(&r, alloc, name, flags);
    if (rc)
        return rc;
    *out = r;
    if (!name)
        r->diag.name = "<source>";
    if ((rc = rd_source_init(r, src, unit)))
        return rc;
    return reader_load(r);
}

FKVF_API int fkvf_reader_open_file(fkvf_reader **out, const char *path, unsigned flags,
                                   const fkvf_allocator *alloc)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!path || (flags & ~(FKVF_OPEN_STRICT | FKVF_OPEN_READ)))
        return FKVF_E_INVALID_ARG;
    fkvf_reader *r;
    int rc = reader_new(&r, alloc, path, flags);
    if (rc)
        return rc;
    *out = r;
    /* O_NONBLOCK: a FIFO opens at once (and is refused as not a regular
     * file) instead of waiting for a writer; no effect on a regular file */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return FAIL(FKVF_E_IO, FKVF_NO_OFFSET, NULL, "open: %s", strerror(errno));
    rc = load_fd(r, fd);
    close(fd);
    return rc;
}

FKVF_API int fkvf_reader_trim(fkvf_reader *r)
{
    int rc = rd_enter(r);
    if (rc)
        return rc;
    fkvf_filemap_drop(&r->file, 0, r->file.map_size);
    return FKVF_OK;
}

FKVF_API void fkvf_reader_free(fkvf_reader *r)
{
    if (!FKVF_HANDLE_IS(r, FKVF_HANDLE_READER))
        return;
    const fkvf_allocator *a = r->alloc;
    fkvf_rvq_free(r->rvq);
    fkvf_rvq_free(r->rvq16);
    fkvf_free(a, r->cb_streams);
    fkvf_free(a, r->acc_freqs);
    fkvf_free(a, (void *)r->acc_tab);
    fkvf_free(a, (void *)r->acc_tab16);
    fkvf_free(a, r->rc_codes);
    fkvf_free(a, r->rc_seg);
    fkvf_free(a, r->rc_blk);
    for (size_t i = 0; i < r->n_sections; i++)
        fkvf_free(a, r->sections[i].inflated);
    for (int g = 0; g < 2; g++) {
        for (size_t k = 0; k < r->groups[g].n_segs; k++)
            fkvf_free(a, r->groups[g].segs[k].block_ok);
        fkvf_free(a, r->groups[g].segs);
    }
    for (size_t i = 0; i < r->n_ngons; i++) {
        fkvf_ngon_fini(&r->ngons[i]->g);
        fkvf_free(a, r->ngons[i]);
    }
    fkvf_free(a, r->ngons);
    fkvf_free(a, r->exact);
    fkvf_free(a, r->xruns);
    fkvf_free(a, r->sections);
    fkvf_free(a, r->commits);
    fkvf_free(a, r->cb_ref_name);
    fkvf_free(a, r->cb_layers);
    fkvf_free(a, r->metric_k);
    fkvf_free(a, r->metric_v);
    fkvf_free(a, r->meta_off);
    fkvf_free(a, r->vtxs_seen);
    fkvf_free(a, r->model_id);
    fkvf_free(a, r->tokenizer_id);
    fkvf_filemap_release(&r->file, a);
    rd_source_release(r);
    fkvf_free(a, r->name);
    r->h.magic = 0;
    fkvf_free(a, r);
}

FKVF_API const char *fkvf_reader_message(const fkvf_reader *r)
{
    if (!FKVF_HANDLE_IS(r, FKVF_HANDLE_READER))
        return "not a reader handle";
    return r->diag.msg;
}

FKVF_API const char *fkvf_reader_file_name(const fkvf_reader *r)
{
    if (!FKVF_HANDLE_IS(r, FKVF_HANDLE_READER))
        return NULL;
    return r->name;
}

FKVF_API int fkvf_reader_error(const fkvf_reader *r, fkvf_error_info *out)
{
    return fkvf_diag_report(FKVF_HANDLE_IS(r, FKVF_HANDLE_READER) ? &r->diag : NULL,
                            "not a reader handle", out);
}
