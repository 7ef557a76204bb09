/*
 * cacheio_npz.c - .npz, a zip of .npy members (docs/cache-files.md section
 * 5), read and written through libarchive.
 */
#if defined(__linux__)
#define _DEFAULT_SOURCE /* madvise */
#endif
#define _POSIX_C_SOURCE 200809L
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cacheio_impl.h"

/* ---- reading ----------------------------------------------------------- */

/* One member's bytes as they are read. */
typedef struct npz_buf {
    uint8_t *buf; /* malloc'd: cap bytes, len of them read */
    size_t len, cap;
    size_t pre, hdr_end; /* .npy prefix, and prefix + header bytes (0: not known yet) */
    uint64_t limit;      /* the most bytes the member may hold: a header's, then expect */
    uint64_t expect;     /* bytes of header and data, once the header is parsed */
    int parsed;          /* the .npy header is parsed (h) */
    npy_hdr h;
} npz_buf;

/* Room for more of the member in b (full: len == cap), never past limit. */
static int npz_grow(const ctx *x, const char *label, npz_buf *b)
{
    uint64_t nc = b->cap ? 2 * (uint64_t)b->cap : 65536;
    if (nc > b->limit)
        nc = b->limit;
    if (nc > SIZE_MAX)
        return cio_fail(x, KVIO_E_NOMEM, "%s: member too large for memory", label);
    uint8_t *nb = realloc(b->buf, nc ? (size_t)nc : 1);
    if (!nb)
        return cio_fail(x, KVIO_E_NOMEM, "%s: out of memory", label);
    b->buf = nb;
    b->cap = (size_t)nc;
    if (b->cap == b->len) /* limit reached before the header was parsed */
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header too long", label);
    return KVIO_OK;
}

/* All the bytes the .npy header describes are read: the member must end. */
static int npz_at_end(const ctx *x, struct archive *a, const char *label, uint64_t expect)
{
    uint8_t extra;
    la_ssize_t r = archive_read_data(a, &extra, 1);
    if (r < 0)
        return cio_fail(x, KVIO_E_FORMAT, "%s: corrupt member: %s", label, archive_error_string(a));
    if (r > 0)
        return cio_fail(x, KVIO_E_FORMAT, "%s: member holds more bytes than its .npy header describes (%" PRIu64 ")",
                        label, expect);
    return KVIO_OK;
}

/* The member's .npy header from the bytes read so far (NPY_NEED_MORE until
 * they hold it), checked against the zip entry's size (declared; -1 if the
 * entry does not tell); then the member's size is known (b->expect). */
static int npz_header(const ctx *x, const char *label, npz_buf *b, int64_t declared)
{
    int rc;
    if (!b->hdr_end && (rc = cio_npy_prefix(x, label, b->buf, b->len, &b->pre, &b->hdr_end)))
        return rc;
    if (b->len < b->hdr_end)
        return NPY_NEED_MORE;
    if ((rc = cio_npy_dict(x, label, b->buf + b->pre, b->hdr_end - b->pre, &b->h)))
        return rc;
    if (!add_ok(b->hdr_end, b->h.nbytes, &b->expect))
        return cio_fail(x, KVIO_E_FORMAT, "%s: size overflows", label);
    if (declared >= 0 && (uint64_t)declared != b->expect)
        return cio_fail(x, KVIO_E_FORMAT,
                        "%s: zip entry size %" PRId64 " does not match the %" PRIu64 " bytes its .npy header describes",
                        label, declared, b->expect);
    b->parsed = 1;
    b->limit = b->expect;
    if (b->len > b->limit)
        return cio_fail(x, KVIO_E_FORMAT, "%s: member holds more bytes than its .npy header describes (%" PRIu64 ")",
                        label, b->expect);
    return KVIO_OK;
}

/* The member ended before its .npy header did. */
static int npz_short_header(const ctx *x, const char *label, npz_buf *b)
{
    if (b->hdr_end)
        return cio_fail(x, KVIO_E_FORMAT, "%s: truncated .npy header (%zu of %zu bytes)", label, b->len,
                        b->hdr_end);
    int rc = cio_npy_prefix(x, label, b->buf ? b->buf : (const uint8_t *)"", b->len, &b->pre, &b->hdr_end);
    if (rc == NPY_NEED_MORE || rc == KVIO_OK)
        rc = cio_fail(x, KVIO_E_FORMAT, "%s: truncated .npy header (%zu bytes)", label, b->len);
    return rc;
}

/* Where a lazy read (KVIO_READ_LAZY) puts the key and value members' data:
 * an unlinked temporary file (fd -1: none, members are read into memory),
 * len bytes of it written. */
typedef struct npz_spill {
    int fd;
    uint64_t len;
} npz_spill;

/* bytes inflated at a time into the spill file */
#define NPZ_SPILL_PIECE ((size_t)1 << 20)

/* The rest of the current member after its .npy header (b holds the header
 * and the first data bytes) into the spill file at sp->len, bounded as
 * npz_member bounds it; t then refers to it (t->spilled). */
static int npz_spill_rest(const ctx *x, struct archive *a, const char *label, npz_buf *b,
                          npz_spill *sp, uint64_t *used, uint64_t budget, kv_tensor *t)
{
    uint64_t want = b->h.nbytes, got = b->len - b->hdr_end, at = sp->len;
    int rc = got ? cio_pwrite_all(x, sp->fd, b->buf + b->hdr_end, (size_t)got, at) : KVIO_OK;
    uint8_t *piece = rc ? NULL : malloc(NPZ_SPILL_PIECE);
    if (!rc && !piece)
        rc = cio_fail(x, KVIO_E_NOMEM, "%s: out of memory", label);
    while (!rc) {
        la_ssize_t r = archive_read_data(a, piece, NPZ_SPILL_PIECE);
        if (r < 0)
            rc = cio_fail(x, KVIO_E_FORMAT, "%s: corrupt member: %s", label, archive_error_string(a));
        else if (r == 0)
            break;
        else if ((uint64_t)r > want - got)
            rc = cio_fail(x, KVIO_E_FORMAT,
                          "%s: member holds more bytes than its .npy header describes (%" PRIu64 ")",
                          label, b->expect);
        else if ((*used += (uint64_t)r) > budget)
            rc = cio_fail(x, KVIO_E_FORMAT,
                          "%s: the archive decompresses to more than %u times its size; refusing",
                          label, KVIO_NPZ_MAX_EXPANSION);
        else if (!(rc = cio_pwrite_all(x, sp->fd, piece, (size_t)r, at + got)))
            got += (uint64_t)r;
    }
    free(piece);
    if (!rc && got < want)
        rc = cio_fail(x, KVIO_E_FORMAT, "%s: truncated: member ends after %" PRIu64 " of %" PRIu64
                      " bytes", label, b->hdr_end + got, b->expect);
    if (rc)
        return rc;
    t->spilled = 1;
    t->spill_off = at;
    sp->len = (at + want + 63) / 64 * 64; /* the next member 64-byte aligned */
    return KVIO_OK;
}

/* Read the current member fully (bounded by its .npy header and the
 * expansion budget) into a malloc'd buffer, or with sp its data into the
 * spill file; fill t. */
static int npz_member(const ctx *x, struct archive *a, struct archive_entry *e, const char *label,
                      uint64_t *used, uint64_t budget, npz_spill *sp, kv_tensor *t)
{
    npz_buf b;
    int rc = KVIO_OK;
    int64_t declared = archive_entry_size_is_set(e) ? archive_entry_size(e) : -1;
    memset(&b, 0, sizeof b);
    b.limit = 12 + (uint64_t)KVIO_MAX_NPY_HEADER;

    for (;;) {
        if (b.len == b.cap) {
            if (b.parsed && b.cap >= b.limit) {
                rc = npz_at_end(x, a, label, b.expect);
                break;
            }
            if ((rc = npz_grow(x, label, &b)))
                break;
        }
        la_ssize_t r = archive_read_data(a, b.buf + b.len, b.cap - b.len);
        if (r < 0) {
            rc = cio_fail(x, KVIO_E_FORMAT, "%s: corrupt member: %s", label, archive_error_string(a));
            break;
        }
        if (r == 0)
            break;
        b.len += (size_t)r;
        *used += (uint64_t)r;
        if (b.parsed && b.len > b.limit) {
            rc = cio_fail(x, KVIO_E_FORMAT, "%s: member holds more bytes than its .npy header describes (%" PRIu64 ")",
                          label, b.expect);
            break;
        }
        if (*used > budget) {
            rc = cio_fail(x, KVIO_E_FORMAT,
                          "%s: the archive decompresses to more than %u times its size; refusing",
                          label, KVIO_NPZ_MAX_EXPANSION);
            break;
        }
        if (!b.parsed && (rc = npz_header(x, label, &b, declared)) != KVIO_OK) {
            if (rc != NPY_NEED_MORE)
                break;
            rc = KVIO_OK;
        }
        if (b.parsed && sp) {
            rc = npz_spill_rest(x, a, label, &b, sp, used, budget, t);
            break;
        }
    }
    if (!rc && !b.parsed)
        rc = npz_short_header(x, label, &b);
    else if (!rc && !t->spilled && b.len < b.expect)
        rc = cio_fail(x, KVIO_E_FORMAT, "%s: truncated: member ends after %zu of %" PRIu64 " bytes",
                      label, b.len, b.expect);
    if (!rc) {
        snprintf(t->dtype_name, sizeof t->dtype_name, "%s", b.h.descr);
        t->type = b.h.type;
        t->esize = b.h.esize;
        t->ndim = b.h.ndim;
        memcpy(t->dims, b.h.dims, sizeof t->dims);
        t->nbytes = b.h.nbytes;
        if (!t->spilled) {
            t->data = b.buf + b.hdr_end;
            t->owned = b.buf;
            b.buf = NULL;
        }
    }
    free(b.buf);
    return rc;
}

/* What the reader has collected so far. */
typedef struct npz_read {
    kv_tensor *t; /* the members that are tensors; each owns its name and bytes */
    size_t n, cap;
    ign_list ign;          /* members skipped */
    uint64_t used, budget; /* bytes decompressed, and the most allowed */
    unsigned flags;
    npz_spill spill;       /* KVIO_READ_LAZY: where the key and value data go */
} npz_read;

/* The tensor name of a member "NAME.npy" (malloc'd) in *tname; NULL for a
 * member whose name does not end in .npy. */
static int npz_tensor_name(const ctx *x, const char *mname, char **tname)
{
    size_t ml = strlen(mname);
    *tname = NULL;
    if (!(ml > 4 && !strcmp(mname + ml - 4, ".npy")))
        return KVIO_OK;
    if (!(*tname = malloc(ml - 3)))
        return cio_fail(x, KVIO_E_NOMEM, "out of memory");
    memcpy(*tname, mname, ml - 4);
    (*tname)[ml - 4] = 0;
    return KVIO_OK;
}

/* A member that is no key, value or token tensor (tname: its tensor name,
 * NULL if it is not a .npy; taken over): skipped if it is a companion or
 * with KVIO_READ_IGNORE_EXTRA, refused otherwise. */
static int npz_other(const ctx *x, struct archive *a, npz_read *r, const char *mname, char *tname,
                     int role)
{
    if ((r->flags & KVIO_READ_IGNORE_EXTRA) || role == R_COMPANION) {
        int rc = cio_ign_add(&r->ign, tname ? tname : mname);
        free(tname);
        if (rc)
            return cio_fail(x, KVIO_E_NOMEM, "out of memory");
        if (archive_read_data_skip(a) != ARCHIVE_OK)
            return cio_fail(x, KVIO_E_FORMAT, "member '%s': corrupt: %s", cio_show(mname).s,
                            archive_error_string(a));
        return KVIO_OK;
    }
    if (!tname)
        return cio_fail(x, KVIO_E_CONVENTION, "member '%s': not a .npy file", cio_show(mname).s);
    free(tname);
    return cio_fail(x, KVIO_E_CONVENTION,
                    "member '%s': tensor not part of the cache naming convention (members are "
                    "TENSOR.npy; %s)",
                    cio_show(mname).s, SCHEMES_TEXT);
}

/* The archive's current entry: skipped (a directory, a member npz_other
 * skips) or read into r->t. */
static int npz_entry(const ctx *x, struct archive *a, struct archive_entry *e, npz_read *r)
{
    const char *mname = archive_entry_pathname(e);
    char *tname;
    kv_tensor tmp;
    int rc;
    if (!mname || !*mname)
        return cio_fail(x, KVIO_E_FORMAT, "zip member %zu has no usable name", r->n);
    if (archive_entry_filetype(e) == AE_IFDIR)
        return KVIO_OK;
    memset(&tmp, 0, sizeof tmp);
    if ((rc = npz_tensor_name(x, mname, &tname)))
        return rc;
    if (tname) {
        tmp.name = tname;
        cio_classify(&tmp);
    }
    if (!tname || tmp.role == R_EXTRA || tmp.role == R_COMPANION)
        return npz_other(x, a, r, mname, tname, tmp.role);
    if (archive_entry_filetype(e) != AE_IFREG) {
        free(tname);
        return cio_fail(x, KVIO_E_FORMAT, "member '%s': not a regular file", cio_show(mname).s);
    }
    if (r->n == r->cap) {
        size_t nc = r->cap ? 2 * r->cap : 16;
        kv_tensor *nt = realloc(r->t, nc * sizeof *nt);
        if (!nt) {
            free(tname);
            return cio_fail(x, KVIO_E_NOMEM, "out of memory");
        }
        r->t = nt;
        r->cap = nc;
    }
    r->t[r->n++] = tmp; /* owns tname from here on */
    char label[300];
    snprintf(label, sizeof label, "tensor '%s' (member '%s')", cio_show(tname).s, cio_show(mname).s);
    int kv = tmp.role == R_KEY || tmp.role == R_VALUE;
    return npz_member(x, a, e, label, &r->used, r->budget, kv && r->spill.fd >= 0 ? &r->spill : NULL,
                      &r->t[r->n - 1]);
}

/* The pages of the file's mapping (data, size: kvio_read's private map, of
 * which the reader writes nothing) before byte `pos` let go: a lazy read
 * of a large .npz keeps only the member it reads resident (the pages come
 * back from the file if read again). */
static void npz_drop_before(const void *data, size_t size, la_int64_t pos)
{
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || pos <= 0)
        return;
    uintptr_t base = (uintptr_t)data, first = (base + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t end = base + ((uint64_t)pos < size ? (size_t)pos : size);
    end &= ~((uintptr_t)page - 1);
#if defined(__linux__)
    /* MADV_DONTNEED: glibc's posix_madvise makes POSIX_MADV_DONTNEED a no-op */
    if (end > first)
        (void)madvise((void *)first, end - first, MADV_DONTNEED);
#else
    if (end > first)
        (void)posix_madvise((void *)first, end - first, POSIX_MADV_DONTNEED);
#endif
}

/* The spill file of a lazy read: an unlinked temporary file in $TMPDIR
 * (default /tmp). */
static int npz_spill_open(const ctx *x, npz_spill *sp)
{
    const char *dir = getenv("TMPDIR");
    char path[4096];
    if (!dir || !*dir)
        dir = "/tmp";
    if (snprintf(path, sizeof path, "%s/fkvf-npz-XXXXXX", dir) >= (int)sizeof path)
        return cio_fail(x, KVIO_E_IO, "TMPDIR too long for a temporary file");
    int fd = mkstemp(path);
    if (fd < 0)
        return cio_fail(x, KVIO_E_IO, "cannot create a temporary file in %s for the members' data: %s",
                        dir, strerror(errno));
    unlink(path); /* gone when closed, whatever happens */
    sp->fd = fd;
    sp->len = 0;
    return KVIO_OK;
}

/* A lazy read's end: the spilled tensors pointed into a read-only mapping
 * of the spill file, the cache assembled, its key and value tensors then
 * read from the spill file (cio_lazy_adopt takes the fd). */
static int npz_assemble_spilled(const ctx *x, npz_read *r, unsigned flags, kvio_cache *out)
{
    uint8_t *map = NULL;
    if (r->spill.len) {
        if (r->spill.len > SIZE_MAX)
            return cio_fail(x, KVIO_E_NOMEM, "the members' data are too large for this platform");
        void *m = mmap(NULL, (size_t)r->spill.len, PROT_READ, MAP_PRIVATE, r->spill.fd, 0);
        if (m == MAP_FAILED)
            return cio_fail(x, KVIO_E_IO, "cannot map the temporary file of the members' data: %s",
                            strerror(errno));
        map = m;
    }
    for (size_t i = 0; i < r->n; i++)
        if (r->t[i].spilled)
            r->t[i].data = map ? map + r->t[i].spill_off : (const uint8_t *)"";
    int rc = cio_assemble(x, r->t, r->n, flags, NULL, 0, &r->ign, out);
    if (rc == KVIO_OK) {
        rc = cio_lazy_adopt(x, out, r->spill.fd, map, (size_t)r->spill.len,
                            (flags & KVIO_READ_NHD) != 0);
        r->spill.fd = -1; /* the cache's now, or closed */
        if (rc)
            kvio_cache_free(out);
    }
    if (map)
        munmap(map, (size_t)r->spill.len);
    return rc;
}

int kvio_read_npz_mem(const void *data, size_t size, const char *name, unsigned flags,
                      kvio_cache *out, char *err, size_t errlen)
{
    ctx x = {name, err, errlen};
    npz_read r;
    int rc = KVIO_OK;
    memset(&r, 0, sizeof r);
    r.flags = flags;
    r.spill.fd = -1;
    if (!out)
        return cio_fail(&x, KVIO_E_ARG, "no output cache");
    memset(out, 0, sizeof *out);
    if (!data || !size)
        return cio_fail(&x, KVIO_E_FORMAT, "empty file (not a zip archive)");
    if (!mul_ok(size, KVIO_NPZ_MAX_EXPANSION, &r.budget) || !add_ok(r.budget, 1u << 20, &r.budget))
        r.budget = UINT64_MAX;
    if ((flags & KVIO_READ_LAZY) && (flags & KVIO_READ_BORROW) &&
        (rc = npz_spill_open(&x, &r.spill)))
        return rc;
    struct archive *a = archive_read_new();
    if (!a) {
        if (r.spill.fd >= 0)
            close(r.spill.fd);
        return cio_fail(&x, KVIO_E_NOMEM, "out of memory");
    }
    archive_read_support_format_zip_seekable(a); /* needs the central directory */
    if (archive_read_open_memory(a, data, size) != ARCHIVE_OK) {
        rc = cio_fail(&x, KVIO_E_FORMAT, "not a readable zip archive: %s", archive_error_string(a));
        goto done;
    }
    for (;;) {
        struct archive_entry *e;
        int ar = archive_read_next_header(a, &e);
        if (ar == ARCHIVE_EOF)
            break;
        if (ar != ARCHIVE_OK && ar != ARCHIVE_WARN) {
            rc = cio_fail(&x, KVIO_E_FORMAT, "corrupt zip archive: %s", archive_error_string(a));
            goto done;
        }
        if (r.spill.fd >= 0) /* a lazy read: the members before this one are read */
            npz_drop_before(data, size, archive_read_header_position(a));
        if ((rc = npz_entry(&x, a, e, &r)))
            goto done;
    }
    rc = r.spill.fd >= 0 ? npz_assemble_spilled(&x, &r, flags, out)
                         : cio_assemble(&x, r.t, r.n, flags, NULL, 0, &r.ign, out);
done:
    if (r.spill.fd >= 0)
        close(r.spill.fd);
    cio_ign_free(&r.ign);
    for (size_t i = 0; i < r.n; i++) {
        free(r.t[i].owned);
        free((char *)(uintptr_t)r.t[i].name);
    }
    free(r.t);
    archive_read_free(a);
    return rc;
}

/* ---- writing ----------------------------------------------------------- */

static la_ssize_t npz_write_cb(struct archive *a, void *ud, const void *buf, size_t n)
{
    sink *s = ud;
    cio_sk_put(s, buf, n);
    if (s->rc) {
        archive_set_error(a, EIO, "%s", s->rc == KVIO_E_IO ? "write failed" : "out of memory");
        return -1;
    }
    return (la_ssize_t)n;
}

/* The token ids as the data of member mname. */
static int npz_put_tokens(const ctx *x, struct archive *a, const kvio_cache *c, const char *mname)
{
    sink tk = {0};
    cio_sk_tokens(&tk, c, token_width(c));
    if (tk.rc || (tk.len && archive_write_data(a, tk.buf, tk.len) != (la_ssize_t)tk.len)) {
        free(tk.buf);
        return cio_fail(x, KVIO_E_IO, "member '%s': %s", mname, tk.rc ? "out of memory" : archive_error_string(a));
    }
    free(tk.buf);
    return KVIO_OK;
}

/* A key/value tensor as the data of member mname, in chunks of at most
 * 1 MiB (positions-first: from a transposed copy). */
static int npz_put_kv(const ctx *x, struct archive *a, const kvio_cache *c, const out_tensor *o,
                      const char *mname)
{
    sink tr = {0};
    const uint8_t *data = o->data;
    int rc = KVIO_OK;
    if (o->nhd) {
        tr.buf = malloc(o->nbytes ? (size_t)o->nbytes : 1);
        tr.cap = tr.buf ? (size_t)o->nbytes : 0;
        cio_sk_kv(&tr, c, o);
        if (tr.rc) {
            free(tr.buf);
            return cio_fail(x, KVIO_E_NOMEM, "member '%s': out of memory", mname);
        }
        data = tr.buf;
    }
    for (uint64_t at = 0; at < o->nbytes;) {
        size_t chunk = o->nbytes - at > (1u << 20) ? (1u << 20) : (size_t)(o->nbytes - at);
        la_ssize_t w = archive_write_data(a, data + at, chunk);
        if (w <= 0) {
            rc = cio_fail(x, KVIO_E_IO, "member '%s': %s", mname, archive_error_string(a));
            break;
        }
        at += (uint64_t)w;
    }
    free(tr.buf);
    return rc;
}

/* n bytes of fd from byte offset off as the data of member mname, in the
 * chunks of npz_put_kv (at most 1 MiB). */
static int npz_put_file(const ctx *x, struct archive *a, int fd, uint64_t off, uint64_t n,
                        const char *mname)
{
    size_t cap = n > (1u << 20) ? (1u << 20) : (size_t)n;
    uint8_t *buf = malloc(cap ? cap : 1);
    if (!buf)
        return cio_fail(x, KVIO_E_NOMEM, "member '%s': out of memory", mname);
    int rc = KVIO_OK;
    for (uint64_t at = 0; at < n && !rc;) {
        size_t chunk = n - at > cap ? cap : (size_t)(n - at);
        if ((rc = cio_pread_all(x, fd, buf, chunk, off + at)) != KVIO_OK)
            break;
        for (size_t put = 0; put < chunk;) {
            la_ssize_t w = archive_write_data(a, buf + put, chunk - put);
            if (w <= 0) {
                rc = cio_fail(x, KVIO_E_IO, "member '%s': %s", mname, archive_error_string(a));
                break;
            }
            put += (size_t)w;
        }
        at += chunk;
    }
    free(buf);
    return rc;
}

/* Tensor i of the cache (layer i / 2's keys or values, then the token ids)
 * as member "NAME.npy": its .npy header, then its data: from the cache, or
 * (fd >= 0) the nbytes at *data_off of fd, which then moves past them. */
static int npz_put_member(const ctx *x, struct archive *a, struct archive_entry *e, const kvio_cache *c,
                          unsigned flags, size_t i, int fd, uint64_t *data_off)
{
    out_tensor o;
    const char *descr;
    if (i < 2 * (size_t)c->n_layers) {
        cio_out_kv(c, flags, (uint32_t)(i / 2), (int)(i % 2), &o);
        descr = cio_npy_descr(c->dtype);
    } else {
        cio_out_tok(c, flags, &o);
        descr = token_width(c) == 4 ? "<i4" : "<i8";
    }
    sink h = {0};
    if (cio_npy_header(&h, descr, o.dims, o.ndim) || h.rc) {
        free(h.buf);
        return cio_fail(x, KVIO_E_NOMEM, "cannot build the .npy header");
    }
    char mname[64];
    snprintf(mname, sizeof mname, "%s.npy", o.name);
    archive_entry_clear(e);
    archive_entry_set_pathname(e, mname);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_mtime(e, 315532800, 0); /* 1980-01-01: reproducible output */
    archive_entry_set_size(e, (la_int64_t)(h.len + o.nbytes));
    if (archive_write_header(a, e) != ARCHIVE_OK ||
        archive_write_data(a, h.buf, h.len) != (la_ssize_t)h.len) {
        free(h.buf);
        return cio_fail(x, KVIO_E_IO, "member '%s': %s", mname, archive_error_string(a));
    }
    free(h.buf);
    if (fd >= 0) {
        uint64_t at = *data_off;
        *data_off += o.nbytes;
        return npz_put_file(x, a, fd, at, o.nbytes, mname);
    }
    return o.is_tokens ? npz_put_tokens(x, a, c, mname) : npz_put_kv(x, a, c, &o, mname);
}

int cio_write_npz_from(const ctx *x, sink *s, const kvio_cache *c, int with_tokens, unsigned flags,
                       int fd)
{
    int rc = KVIO_OK;
    uint64_t data_off = 0;
    struct archive *a = archive_write_new();
    struct archive_entry *e = archive_entry_new();
    if (!a || !e) {
        rc = cio_fail(x, KVIO_E_NOMEM, "out of memory");
        goto done;
    }
    if (archive_write_set_format_zip(a) != ARCHIVE_OK ||
        ((flags & KVIO_WRITE_DEFLATE) ? archive_write_zip_set_compression_deflate(a)
                                      : archive_write_zip_set_compression_store(a)) != ARCHIVE_OK ||
        archive_write_set_bytes_per_block(a, 0) != ARCHIVE_OK ||
        archive_write_open2(a, s, NULL, npz_write_cb, NULL, NULL) != ARCHIVE_OK) {
        rc = cio_fail(x, KVIO_E_IO, "cannot start the zip archive: %s", archive_error_string(a));
        goto done;
    }
    size_t nt = 2 * (size_t)c->n_layers + (with_tokens ? 1 : 0);
    for (size_t i = 0; i < nt && !rc; i++)
        rc = npz_put_member(x, a, e, c, flags, i, fd, &data_off);
    if (!rc && archive_write_close(a) != ARCHIVE_OK)
        rc = cio_fail(x, KVIO_E_IO, "cannot finish the zip archive: %s", archive_error_string(a));
done:
    if (e)
        archive_entry_free(e);
    if (a)
        archive_write_free(a);
    if (!rc && s->rc)
        rc = cio_fail(x, s->rc, "write failed");
    return rc;
}

int cio_write_npz(const ctx *x, sink *s, const kvio_cache *c, unsigned flags)
{
    return cio_write_npz_from(x, s, c, c->tokens != NULL, flags, -1);
}
