/* The FKVF writer: streams sections to a sink in one pass (never seeks), then
 * the directory and the trailer (spec 4-7). File writers create atomically:
 * temp file, fsync, rename. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "alloc.h"
#include "cbk1_layout.h"
#include "ckd.h"
#include "codec/codec.h"
#include "error.h"
#include "handle.h"
#include "format/format.h"
#include "hash.h"
#include "le.h"
#include "metric_matrix.h"
#include "writer_resume.h"

/* A stream group (spec 11.2) as written so far, over all commits. */
typedef struct wr_group {
    int present;
    fkvf_stream_spec spec; /* normalized: ngon r and L filled in */
    uint64_t length;
} wr_group;

struct fkvf_writer {
    fkvf_handle h; /* kind FKVF_HANDLE_WRITER; OPEN, FINISHED or FAILED */
    const fkvf_allocator *alloc;
    fkvf_diag diag;
    fkvf_writer_options opts;
    fkvf_sink sink;
    int fd;
    char *path, *tmp_path;
    uint64_t pos;

    fkvf_dirent *dir;
    size_t n_dir, cap_dir;

    int has_desc;
    fkvf_desc desc;
    uint64_t row_bytes;

    uint8_t *meta;
    size_t meta_size, meta_cap;
    uint32_t meta_count;

    fkvf_range *exact; /* exact rows added (in any order) */
    size_t n_exact, cap_exact;
    wr_group groups[2]; /* FKVF_GROUP_INDEX, FKVF_GROUP_TOKENS */
    uint32_t *vtxs_written;
    size_t n_vtxs, cap_vtxs;

    uint64_t n_positions, n_archived;

    int cb_kind; /* 0 none, 1 CBK1, 2 CBRF */
    fkvf_codebook_shape cb; /* its layer_stages: cb_layers */
    uint8_t *cb_layers;     /* the writer's copy of the layer table, or NULL */
    uint8_t cb_hash[16];    /* content hash of the CBK1 this writer added (spec 13.3) */
    int cb_added;           /* this writer added the CBK1 (the hash is known) */
    int metric_added;       /* a CMET (spec 13.8) */

    int resumed;           /* continues an existing file (writer_resume.h) */
    uint64_t committed;    /* end of the last complete commit */
    uint64_t commit_seq;   /* of the commit being built */
    fkvf_io io;            /* resumed writers: replaceable write / sync */
    uint64_t prev_trailer; /* offset of the previous trailer; 0 before commit 1 */
    int dirty;             /* something was added since the last commit */
};

#define FAIL(code, ...) fkvf_fail(&w->diag, code, FKVF_NO_OFFSET, __VA_ARGS__)

static int w_enter(fkvf_writer *w) { return FKVF_HANDLE_ENTER(w, FKVF_HANDLE_WRITER, "writer"); }

/* A failed write leaves the output unusable: the writer becomes sticky-failed. */
static int w_broken(fkvf_writer *w, int rc)
{
    if (rc == FKVF_E_IO || rc == FKVF_E_NOMEM)
        fkvf_handle_fail(&w->h, 0);
    return rc;
}

/* ---- output ------------------------------------------------------------------- */

static int out_bytes(fkvf_writer *w, const void *data, size_t size)
{
    const uint8_t *p = data;
    while (size) {
        long long n = w->sink.write(w->sink.opaque, p, size);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            fkvf_handle_fail(&w->h, 0);
            return fkvf_fail(&w->diag, FKVF_E_IO, w->pos, NULL, "write: %s", strerror(e));
        }
        if (n == 0) {
            fkvf_handle_fail(&w->h, 0);
            return fkvf_fail(&w->diag, FKVF_E_IO, w->pos, NULL, "write: no progress");
        }
        p += n;
        size -= (size_t)n;
        w->pos += (uint64_t)n;
    }
    return FKVF_OK;
}

static int out_pad64(fkvf_writer *w)
{
    static const uint8_t zeros[64];
    size_t pad = (size_t)((64 - (w->pos % 64)) % 64);
    return pad ? out_bytes(w, zeros, pad) : FKVF_OK;
}

static long long fd_write(void *opaque, const void *data, size_t size)
{
    fkvf_writer *w = opaque;
    ssize_t n = write(w->fd, data, size);
    return (long long)n;
}

static int fd_sync(void *opaque)
{
    fkvf_writer *w = opaque;
    return fsync(w->fd);
}

/* The stored form of a deflated section of the bytes of a then b: *z
 * (from w->alloc) and its size. */
static int deflate_parts(fkvf_writer *w, const void *a, size_t na, const void *b, size_t nb,
                         uint8_t **z, uLongf *zlen)
{
    size_t size = na + nb; /* both in memory: no overflow */
    const uint8_t *src = a;
    uint8_t *joined = NULL;
    if (nb) {
        if (!(joined = fkvf_malloc(w->alloc, size)))
            return w_broken(w, FAIL(FKVF_E_NOMEM, NULL, "no memory to deflate %zu bytes", size));
        memcpy(joined, a, na);
        memcpy(joined + na, b, nb);
        src = joined;
    }
    uLong bound = compressBound((uLong)size);
    *z = fkvf_malloc(w->alloc, bound);
    int rc = FKVF_OK;
    if (!*z) {
        rc = w_broken(w, FAIL(FKVF_E_NOMEM, NULL, "no memory to deflate %zu bytes", size));
    } else {
        *zlen = bound;
        int lvl = w->opts.deflate_level ? w->opts.deflate_level : 6;
        if (compress2(*z, zlen, src, (uLong)size, lvl) != Z_OK)
            rc = w_broken(w, FAIL(FKVF_E_NOMEM, NULL, "zlib compress2 failed"));
    }
    fkvf_free(w->alloc, joined);
    return rc;
}

/* Append a section whose contents are the bytes of a then those of b (nb
 * may be 0): pad, (deflate), write, record the directory entry. Two parts
 * so that a header and the caller's rows need not be copied together. */
static int put_section_parts(fkvf_writer *w, uint32_t type, uint32_t flags, uint64_t key,
                             const void *a, size_t na, const void *b, size_t nb)
{
    int rc;
    if (w->n_dir >= FKVF_MAX_DIR_ENTRIES)
        return FAIL(FKVF_E_LIMIT, "15", "more than %u sections in one commit",
                    FKVF_MAX_DIR_ENTRIES);
    if ((rc = fkvf_grow(w->alloc, (void **)&w->dir, &w->cap_dir, w->n_dir + 1, sizeof *w->dir)))
        return w_broken(w, FAIL(rc, NULL, "no memory for the directory"));
    if ((rc = out_pad64(w)))
        return rc;
    fkvf_dirent e;
    memset(&e, 0, sizeof e);
    e.type = type;
    e.flags = flags;
    e.offset = w->pos;
    e.key = key;
    e.size = (uint64_t)na + nb;
    if (flags & FKVF_SECTION_DEFLATE) {
        uint8_t *z = NULL;
        uLongf zlen = 0;
        if ((rc = deflate_parts(w, a, na, b, nb, &z, &zlen))) {
            fkvf_free(w->alloc, z);
            return rc;
        }
        e.stored_size = zlen;
        e.checksum = fkvf_xxh3_64(z, (size_t)zlen, e.offset);
        rc = out_bytes(w, z, (size_t)zlen);
        fkvf_free(w->alloc, z);
    } else {
        e.stored_size = e.size;
        e.checksum = fkvf_xxh3_64_pair(a, na, b, nb, e.offset);
        rc = out_bytes(w, a, na);
        if (rc == FKVF_OK && nb)
            rc = out_bytes(w, b, nb);
    }
    if (rc)
        return rc;
    w->dir[w->n_dir++] = e;
    w->dirty = 1;
    return FKVF_OK;
}

/* Append a section of size bytes at data. */
static int put_section(fkvf_writer *w, uint32_t type, uint32_t flags, uint64_t key,
                       const void *data, size_t size)
{
    return put_section_parts(w, type, flags, key, data, size, NULL, 0);
}

/* ---- create / free ----------------------------------------------------------- */

FKVF_API void fkvf_writer_options_init(fkvf_writer_options *opts)
{
    if (opts)
        memset(opts, 0, sizeof *opts);
}

static int writer_new(fkvf_writer **out, const fkvf_writer_options *opts,
                      const fkvf_allocator *alloc)
{
    alloc = fkvf_alloc_or_default(alloc);
    fkvf_writer *w = fkvf_calloc(alloc, 1, sizeof *w);
    if (!w)
        return FKVF_E_NOMEM;
    fkvf_handle_init(&w->h, FKVF_HANDLE_WRITER);
    w->alloc = alloc;
    w->fd = -1;
    w->diag.name = "<sink>";
    w->commit_seq = 1;
    if (opts)
        w->opts = *opts;
    *out = w;
    if (w->opts.required_features & ~FKVF_FEATURES_KNOWN)
        return FAIL(FKVF_E_INVALID_ARG, "3.1", "options.required_features: unknown bits");
    if (w->opts.optional_features & ~FKVF_OPTFEATURES_KNOWN)
        return FAIL(FKVF_E_INVALID_ARG, "3.4",
                    "options.optional_features: unknown bits 0x%llx (reserved: writers write 0)",
                    (unsigned long long)(w->opts.optional_features & ~FKVF_OPTFEATURES_KNOWN));
    if (w->opts.block_size == 0)
        w->opts.block_size = 4096;
    if (w->opts.block_size < FKVF_MIN_BLOCK || w->opts.block_size > FKVF_MAX_BLOCK ||
        w->opts.block_size % 64)
        return FAIL(FKVF_E_INVALID_ARG, "11.2",
                    "options.block_size: %u (multiple of 64 in 64..2^20)", w->opts.block_size);
    if (w->opts.deflate_level < 0 || w->opts.deflate_level > 9)
        return FAIL(FKVF_E_INVALID_ARG, NULL, "options.deflate_level: %d (0..9)",
                    w->opts.deflate_level);
    if (w->opts.sync > FKVF_SYNC_NONE)
        return FAIL(FKVF_E_INVALID_ARG, NULL, "options.sync: %u unknown", w->opts.sync);
    return FKVF_OK;
}

static int write_header(fkvf_writer *w)
{
    fkvf_header h;
    memset(&h, 0, sizeof h);
    h.major = FKVF_FORMAT_MAJOR;
    h.minor = FKVF_FORMAT_MINOR_FOR(w->opts.required_features, w->opts.optional_features);
    h.required_features = w->opts.required_features;
    h.optional_features = w->opts.optional_features;
    uint8_t buf[64];
    fkvf_header_write(buf, &h);
    return out_bytes(w, buf, sizeof buf);
}

FKVF_API int fkvf_writer_create_sink(fkvf_writer **out, const fkvf_sink *sink,
                                     const fkvf_writer_options *opts,
                                     const fkvf_allocator *alloc)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!sink || !sink->write)
        return FKVF_E_INVALID_ARG;
    int rc = writer_new(out, opts, alloc);
    if (rc) {
        if (rc != FKVF_E_NOMEM)
            fkvf_handle_fail(&(*out)->h, 0);
        return rc;
    }
    (*out)->sink = *sink;
    return w_broken(*out, write_header(*out));
}

FKVF_API int fkvf_writer_create_file(fkvf_writer **out, const char *path,
                                     const fkvf_writer_options *opts,
                                     const fkvf_allocator *alloc)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!path || !*path)
        return FKVF_E_INVALID_ARG;
    int rc = writer_new(out, opts, alloc);
    fkvf_writer *w = *out;
    if (rc) {
        if (w)
            fkvf_handle_fail(&w->h, 0);
        return rc;
    }
    size_t n = strlen(path);
    w->path = fkvf_strndup(w->alloc, path, n);
    w->tmp_path = fkvf_malloc(w->alloc, n + 16);
    if (w->tmp_path)
        w->tmp_path[0] = 0; /* free() unlinks a non-empty tmp_path */
    if (!w->path || !w->tmp_path) {
        fkvf_handle_fail(&w->h, 0);
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for the path");
    }
    w->diag.name = w->path;
    struct stat sb;
    if (w->opts.no_replace) {
        if (lstat(path, &sb) == 0) {
            fkvf_handle_fail(&w->h, 0);
            return FAIL(FKVF_E_EXISTS, NULL, "exists, and the writer was asked not to replace it");
        }
        if (errno != ENOENT) { /* cannot tell whether it exists */
            int e = errno;
            fkvf_handle_fail(&w->h, 0);
            return FAIL(FKVF_E_IO, NULL, "cannot check whether it exists: %s", strerror(e));
        }
    }
    /* a new temporary file next to PATH (not mkstemp: its 0600 would have
     * to be widened by hand, and the library does not read the umask) */
    w->fd = -1;
    int e = EEXIST;
    uint64_t x = (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)w;
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) == 0)
        x ^= (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec;
    for (int attempt = 0; attempt < 100 && w->fd < 0 && e == EEXIST; attempt++) {
        static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        char sfx[7];
        for (int i = 0; i < 6; i++) {
            x = x * 6364136223846793005u + 1442695040888963407u; /* LCG step */
            sfx[i] = abc[(x >> 33) % 62];
        }
        sfx[6] = 0;
        snprintf(w->tmp_path, n + 16, "%s.tmp-%s", path, sfx);
        w->fd = open(w->tmp_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        e = w->fd < 0 ? errno : 0;
    }
    if (w->fd < 0) {
        fkvf_handle_fail(&w->h, 0);
        w->tmp_path[0] = 0;
        return FAIL(FKVF_E_IO, NULL, "cannot create a temporary file next to it: %s",
                    strerror(e));
    }
    if (w->opts.mode && fchmod(w->fd, (mode_t)(w->opts.mode & 07777)) != 0) {
        e = errno;
        fkvf_handle_fail(&w->h, 0); /* free() removes the temporary file */
        return FAIL(FKVF_E_IO, NULL, "cannot set the mode %04o of its temporary file: %s",
                    w->opts.mode & 07777, strerror(e));
    }
    w->sink.write = fd_write;
    w->sink.sync = fd_sync;
    w->sink.opaque = w;
    return w_broken(w, write_header(w));
}

FKVF_API void fkvf_writer_free(fkvf_writer *w)
{
    if (!FKVF_HANDLE_IS(w, FKVF_HANDLE_WRITER))
        return;
    const fkvf_allocator *a = w->alloc;
    if (w->fd >= 0)
        close(w->fd);
    if (w->tmp_path && w->tmp_path[0] && w->h.state != FKVF_HANDLE_FINISHED)
        unlink(w->tmp_path);
    fkvf_free(a, w->path);
    fkvf_free(a, w->tmp_path);
    fkvf_free(a, w->dir);
    fkvf_free(a, w->meta);
    fkvf_free(a, w->exact);
    fkvf_free(a, w->vtxs_written);
    fkvf_free(a, w->cb_layers);
    fkvf_free(a, (void *)w->desc.model_id);
    fkvf_free(a, (void *)w->desc.tokenizer_id);
    w->h.magic = 0;
    fkvf_free(a, w);
}

FKVF_API const char *fkvf_writer_message(const fkvf_writer *w)
{
    if (!FKVF_HANDLE_IS(w, FKVF_HANDLE_WRITER))
        return "not a writer handle";
    return w->diag.msg;
}

FKVF_API int fkvf_writer_error(const fkvf_writer *w, fkvf_error_info *out)
{
    return fkvf_diag_report(FKVF_HANDLE_IS(w, FKVF_HANDLE_WRITER) ? &w->diag : NULL,
                            "not a writer handle", out);
}

/* ---- content ------------------------------------------------------------------ */

static char *dup_str(fkvf_writer *w, const char *s)
{
    return fkvf_strndup(w->alloc, s, s ? strlen(s) : 0);
}

FKVF_API int fkvf_writer_set_desc(fkvf_writer *w, const fkvf_desc *desc)
{
    int rc = w_enter(w);
    if (rc)
        return rc;
    if (!desc)
        return FKVF_E_INVALID_ARG;
    if (w->has_desc)
        return FAIL(FKVF_E_STATE, "8", "the descriptor is already set");
    if (w->commit_seq != 1)
        return FAIL(FKVF_E_STATE, "8.3", "the descriptor belongs in commit 1");
    if ((rc = fkvf_desc_check(desc, &w->diag)))
        return rc;
    if (w->cb_kind && !fkvf_cbk1_matches(&w->cb, desc))
        return FAIL(FKVF_E_INVALID_ARG, "13.7", "descriptor does not match the codebook's shape");
    size_t n = fkvf_desc_size(desc);
    uint8_t *buf = fkvf_malloc(w->alloc, n);
    char *mid = dup_str(w, desc->model_id), *tid = dup_str(w, desc->tokenizer_id);
    if (!buf || !mid || !tid) {
        fkvf_free(w->alloc, buf);
        fkvf_free(w->alloc, mid);
        fkvf_free(w->alloc, tid);
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for the descriptor");
    }
    fkvf_desc_write(buf, desc);
    rc = put_section(w, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED, 0, buf, n);
    fkvf_free(w->alloc, buf);
    if (rc) {
        fkvf_free(w->alloc, mid);
        fkvf_free(w->alloc, tid);
        return rc;
    }
    w->desc = *desc;
    w->desc.model_id = mid;
    w->desc.tokenizer_id = tid;
    w->row_bytes = fkvf_desc_row_bytes(desc);
    w->has_desc = 1;
    return FKVF_OK;
}

static int meta_add(fkvf_writer *w, const char *key, uint8_t type, const void *v, size_t n)
{
    int rc = w_enter(w);
    if (rc)
        return rc;
    if (!key || (!v && n))
        return FKVF_E_INVALID_ARG;
    size_t kl = strlen(key);
    if (kl == 0 || kl > 255 || !fkvf_utf8_valid((const uint8_t *)key, kl))
        return FAIL(FKVF_E_INVALID_ARG, "9.1", "metadata key \"%.40s\": 1..255 bytes of UTF-8",
                    key);
    if (kl >= 5 && memcmp(key, "fkvf.", 5) == 0)
        return FAIL(FKVF_E_INVALID_ARG, "9.2", "metadata key \"%s\": the fkvf. namespace is "
                    "reserved", key);
    if (n > FKVF_MAX_META_VALUE)
        return FAIL(FKVF_E_LIMIT, "15", "metadata value of %zu bytes", n);
    if (type == FKVF_META_UTF8 && !fkvf_utf8_valid(v, n))
        return FAIL(FKVF_E_INVALID_ARG, "9.1", "metadata \"%s\": value is not UTF-8", key);
    if (w->meta_count >= FKVF_MAX_META)
        return FAIL(FKVF_E_LIMIT, "15", "more than %u metadata entries", FKVF_MAX_META);
    /* duplicate keys are invalid (spec 9.2) */
    size_t pos = 8;
    for (uint32_t i = 0; i < w->meta_count; i++) {
        uint16_t l = fkvf_ld16(w->meta + pos);
        if (l == kl && memcmp(w->meta + pos + 8, key, kl) == 0)
            return FAIL(FKVF_E_DUP_KEY, "9.2", "metadata key \"%s\" already set", key);
        pos += 8 + (size_t)l + fkvf_ld32(w->meta + pos + 4);
    }
    size_t need = (w->meta_size ? w->meta_size : 8) + 8 + kl + n;
    if ((rc = fkvf_grow(w->alloc, (void **)&w->meta, &w->meta_cap, need, 1)))
        return FAIL(rc, NULL, "no memory for metadata");
    if (!w->meta_size) {
        memset(w->meta, 0, 8);
        w->meta_size = 8;
    }
    uint8_t *p = w->meta + w->meta_size;
    fkvf_st16(p, (uint16_t)kl);
    p[2] = type;
    p[3] = 0;
    fkvf_st32(p + 4, (uint32_t)n);
    memcpy(p + 8, key, kl);
    if (n)
        memcpy(p + 8 + kl, v, n);
    w->meta_size = need;
    w->meta_count++;
    fkvf_st32(w->meta, w->meta_count);
    return FKVF_OK;
}

FKVF_API int fkvf_writer_meta_u64(fkvf_writer *w, const char *key, uint64_t v)
{
    uint8_t b[8];
    fkvf_st64(b, v);
    return meta_add(w, key, FKVF_META_U64, b, 8);
}
FKVF_API int fkvf_writer_meta_i64(fkvf_writer *w, const char *key, int64_t v)
{
    uint8_t b[8];
    fkvf_st64(b, (uint64_t)v);
    return meta_add(w, key, FKVF_META_I64, b, 8);
}
FKVF_API int fkvf_writer_meta_f64(fkvf_writer *w, const char *key, double v)
{
    uint8_t b[8];
    fkvf_stf64(b, v);
    return meta_add(w, key, FKVF_META_F64, b, 8);
}
FKVF_API int fkvf_writer_meta_bool(fkvf_writer *w, const char *key, int v)
{
    uint8_t b = v ? 1 : 0;
    return meta_add(w, key, FKVF_META_BOOL, &b, 1);
}
FKVF_API int fkvf_writer_meta_utf8(fkvf_writer *w, const char *key, const char *v)
{
    return meta_add(w, key, FKVF_META_UTF8, v, v ? strlen(v) : 0);
}
FKVF_API int fkvf_writer_meta_bytes(fkvf_writer *w, const char *key, const void *v, size_t n)
{
    return meta_add(w, key, FKVF_META_BYTES, v, n);
}

static int check_section_flags(fkvf_writer *w, unsigned flags)
{
    if (flags & ~(unsigned)(FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE))
        return FAIL(FKVF_E_INVALID_ARG, "4.2", "section flags 0x%x: unknown bits", flags);
    if ((flags & FKVF_SECTION_DEFLATE) && !(w->opts.required_features & FKVF_FEAT_DEFLATE))
        return FAIL(FKVF_E_INVALID_ARG, "3.3",
                    "deflated section needs FKVF_FEAT_DEFLATE in the create options");
    return FKVF_OK;
}

FKVF_API int fkvf_writer_add_exact(fkvf_writer *w, uint64_t first, uint64_t count,
                                   const void *rows, size_t size, unsigned section_flags)
{
    int rc = w_enter(w);
    if (rc)
        return rc;
    if ((!rows && size) || (rc = check_section_flags(w, section_flags)))
        return rc ? rc : FKVF_E_INVALID_ARG;
    if (!w->has_desc)
        return FAIL(FKVF_E_STATE, "14", "exact rows need the descriptor first");
    uint64_t want, end, total;
    if (!fkvf_mul64(count, w->row_bytes, &want) || !fkvf_add64(first, count, &end) ||
        !fkvf_add64(want, 64, &total) || total > SIZE_MAX)
        return FAIL(FKVF_E_LIMIT, "15", "%llu exact rows overflow", (unsigned long long)count);
    if (want != size)
        return FAIL(FKVF_E_INVALID_ARG, "14", "%llu rows of %llu bytes are %llu bytes, got %zu",
                    (unsigned long long)count, (unsigned long long)w->row_bytes,
                    (unsigned long long)want, size);
    if (fkvf_grow(w->alloc, (void **)&w->exact, &w->cap_exact, w->n_exact + 1,
                  sizeof *w->exact))
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for %zu bytes of exact rows", size);
    /* the 64-byte header, then the caller's rows: written as they are */
    uint8_t hdr[64];
    fkvf_exac_hdr h = {first, count, (uint8_t)w->desc.dtype};
    fkvf_exac_hdr_write(hdr, &h);
    rc = put_section_parts(w, FKVF_SECTION_EXAC, FKVF_SECTION_REQUIRED | section_flags, first,
                           hdr, sizeof hdr, rows, size);
    if (rc)
        return rc;
    w->exact[w->n_exact].first = first;
    w->exact[w->n_exact].count = count;
    w->n_exact++;
    return FKVF_OK;
}

static int ensure_vtxs(fkvf_writer *w, const fkvf_ngon *g)
{
    for (size_t i = 0; i < w->n_vtxs; i++)
        if (w->vtxs_written[i] == g->n)
            return FKVF_OK;
    size_t n = 8 + 16 * (size_t)g->n;
    uint8_t *buf = fkvf_malloc(w->alloc, n);
    if (!buf || fkvf_grow(w->alloc, (void **)&w->vtxs_written, &w->cap_vtxs, w->n_vtxs + 1,
                          sizeof *w->vtxs_written)) {
        fkvf_free(w->alloc, buf);
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for a vertex table");
    }
    fkvf_st32(buf, g->n);
    fkvf_st32(buf + 4, 0);
    for (uint32_t c = 0; c < g->n; c++) {
        fkvf_stf64(buf + 8 + 16 * (size_t)c, g->vx[c]);
        fkvf_stf64(buf + 16 + 16 * (size_t)c, g->vy[c]);
    }
    int rc = put_section(w, FKVF_SECTION_VTXS, FKVF_SECTION_REQUIRED, g->n, buf, n);
    fkvf_free(w->alloc, buf);
    if (rc)
        return rc;
    w->vtxs_written[w->n_vtxs++] = g->n;
    return FKVF_OK;
}

FKVF_API unsigned fkvf_quad_bits_for(uint64_t max_symbol)
{
    if (max_symbol > UINT32_MAX)
        return 0;
    unsigned b = 2;
    while (b < 32 && (max_symbol >> b) != 0)
        b += 2;
    return b;
}

FKVF_API uint32_t fkvf_stream_spec_align(const fkvf_stream_spec *spec)
{
    if (!spec)
        return 0;
    if (spec->profile == FKVF_PROFILE_QUAD) {
        if (spec->symbol_bits < 2 || spec->symbol_bits > 32 || (spec->symbol_bits & 1))
            return 0;
        return fkvf_strm_align(FKVF_PROFILE_QUAD, spec->symbol_bits, 0);
    }
    if (spec->profile != FKVF_PROFILE_NGON)
        return 0;
    if (spec->span_symbols)
        return spec->span_symbols;
    double r = spec->r != 0.0 ? spec->r : fkvf_ngon_rmax(spec->alphabet);
    return fkvf_ngon_max_span(r);
}

/* The symbols of a segment: `n_streams` streams of `count` symbols, symbol
 * i of stream j = sym16[i * ps + j * cs] (index) or sym32[i] (tokens). */
typedef struct seg_symbols {
    uint64_t count;
    const uint16_t *sym16;
    size_t ps, cs;
    const uint32_t *sym32;
} seg_symbols;

/* The STRM header of a segment of group grp before its codec: first, count,
 * block size and, for the index group, the stages and the stream count
 * (spec 11.2). */
static void segment_header(const fkvf_writer *w, unsigned grp, const fkvf_stream_spec *spec,
                           uint64_t first, uint64_t count, fkvf_strm_hdr *h)
{
    memset(h, 0, sizeof *h);
    h->group = grp;
    h->profile = (uint8_t)spec->profile;
    h->first_symbol = first;
    h->symbol_count = count;
    h->block_size = w->opts.block_size;
    h->n_streams = 1;
    if (grp == FKVF_GROUP_INDEX) {
        h->k_stages = w->cb.k_stages;
        h->v_stages = w->cb.v_stages;
        /* P(n_layers) of spec 11.2: < 2^25 for a valid shape */
        h->n_streams = (uint32_t)fkvf_index_stream_count(&w->cb, w->desc.n_kv_heads);
    }
}

/* The codec of spec into h (spec 12.1, 12.2) and its normal form into
 * *norm: the other profile's fields 0, an ngon's r and span resolved. An
 * ngon is initialized into *g with *have_ngon = 1 (the caller finishes it). */
static int segment_codec(fkvf_writer *w, const fkvf_stream_spec *spec, fkvf_strm_hdr *h,
                         fkvf_stream_spec *norm, fkvf_ngon *g, int *have_ngon)
{
    *norm = *spec;
    if (spec->profile == FKVF_PROFILE_QUAD) {
        if (spec->symbol_bits < 2 || spec->symbol_bits > 32 || (spec->symbol_bits & 1))
            return FAIL(FKVF_E_INVALID_ARG, "12.1", "quad symbol_bits %u (even, 2..32)",
                        spec->symbol_bits);
        h->bits = (uint8_t)spec->symbol_bits;
        norm->alphabet = 0;
        norm->r = 0.0;
        norm->span_symbols = 0;
        return FKVF_OK;
    }
    if (spec->profile != FKVF_PROFILE_NGON)
        return FAIL(FKVF_E_INVALID_ARG, "11.2", "unknown profile %d", (int)spec->profile);
    if (!(w->opts.required_features & FKVF_FEAT_NGON))
        return FAIL(FKVF_E_INVALID_ARG, "3.3",
                    "ngon streams need FKVF_FEAT_NGON in the create options");
    int rc = fkvf_ngon_init(g, spec->alphabet, spec->r, spec->span_symbols, NULL, w->alloc);
    if (rc)
        return FAIL(rc == FKVF_E_NOMEM ? rc : FKVF_E_INVALID_ARG, "12.2",
                    "ngon N=%u r=%g L=%u: invalid parameters", spec->alphabet, spec->r,
                    spec->span_symbols);
    *have_ngon = 1;
    h->alphabet = g->n;
    h->r = g->r;
    h->span_symbols = g->span;
    norm->symbol_bits = 0;
    norm->r = g->r;
    norm->span_symbols = g->span;
    return FKVF_OK;
}

/* The segment continues group gr: the codec of its earlier segments, first
 * a multiple of the alignment unit and at most the group's length (spec
 * 11.6); then h's layout derived, within the limits (spec 15). */
static int check_segment_fits(fkvf_writer *w, const wr_group *gr, const char *what,
                              const fkvf_stream_spec *norm, fkvf_strm_hdr *h)
{
    const uint64_t first = h->first_symbol, count = h->symbol_count;
    uint32_t u = fkvf_strm_align(h->profile, h->bits, h->span_symbols);
    if (gr->present &&
        (gr->spec.profile != norm->profile || gr->spec.symbol_bits != norm->symbol_bits ||
         gr->spec.alphabet != norm->alphabet || gr->spec.span_symbols != norm->span_symbols ||
         memcmp(&gr->spec.r, &norm->r, sizeof norm->r) != 0))
        return FAIL(FKVF_E_INVALID_ARG, "11.6", "%s: codec differs from their earlier segments",
                    what);
    if (first % u || first > gr->length)
        return FAIL(FKVF_E_INVALID_ARG, "11.6",
                    "%s: first symbol %llu must be a multiple of %u and at most their length %llu",
                    what, (unsigned long long)first, u, (unsigned long long)gr->length);
    if (fkvf_strm_hdr_derive(h) || h->section_size > SIZE_MAX || count > SIZE_MAX ||
        first + count < first)
        return FAIL(FKVF_E_LIMIT, "15", "%s: segment of %llu symbols too large", what,
                    (unsigned long long)count);
    return FKVF_OK;
}

/* Index stream j's symbols gathered into tmp, each below the codebook's k
 * (spec 11.8). */
static int gather_index_stream(fkvf_writer *w, const seg_symbols *s, uint32_t j, uint32_t *tmp)
{
    for (size_t i = 0; i < (size_t)s->count; i++) {
        tmp[i] = s->sym16[i * s->ps + j * s->cs];
        if (tmp[i] >= w->cb.k)
            return FAIL(FKVF_E_INVALID_ARG, "11.8",
                        "index stream %u, symbol %zu is %u, the codebook has k = %u", j, i,
                        tmp[i], w->cb.k);
    }
    return FKVF_OK;
}

/* Every stream of the segment encoded into data, stream j at
 * j * stream_bytes (spec 12); tmp: scratch of count symbols for index
 * streams. */
static int encode_streams(fkvf_writer *w, const fkvf_strm_hdr *h, const fkvf_ngon *g,
                          const char *what, const seg_symbols *s, uint32_t *tmp, uint8_t *data)
{
    int rc;
    for (uint32_t j = 0; j < h->n_streams; j++) {
        const uint32_t *src = s->sym32;
        if (s->sym16) {
            if ((rc = gather_index_stream(w, s, j, tmp)))
                return rc;
            src = tmp;
        }
        uint8_t *dst = data + (size_t)(j * h->stream_bytes);
        if (h->profile == FKVF_PROFILE_QUAD)
            rc = fkvf_quad_encode(src, (size_t)s->count, h->bits, dst, (size_t)h->stream_bytes);
        else
            rc = fkvf_ngon_encode(g, src, (size_t)s->count, dst, (size_t)h->stream_bytes);
        if (rc) {
            /* a symbol outside the alphabet is the caller's error */
            return FAIL(rc == FKVF_E_SYMBOL ? FKVF_E_INVALID_ARG : rc, "12", "%s, stream %u: %s",
                        what, j,
                        rc == FKVF_E_SYMBOL ? "a symbol is outside the alphabet"
                                            : "a span does not decode back exactly");
        }
    }
    return FKVF_OK;
}

/* The segment buf written as a STRM section of group grp: its header and
 * block checksums are seeded by the section offset, known only once the
 * output is padded (spec 11.2, 11.4). */
static int seal_segment(fkvf_writer *w, unsigned grp, uint8_t *buf, const fkvf_strm_hdr *h)
{
    int rc;
    if ((rc = out_pad64(w)))
        return rc;
    uint64_t off = w->pos;
    const uint8_t *data = buf + h->data_off;
    fkvf_strm_hdr_write(buf, h, off);
    for (uint64_t b = 0; b < h->n_blocks; b++) {
        uint64_t start = b * h->block_size;
        uint64_t len = h->data_bytes - start < h->block_size ? h->data_bytes - start
                                                               : h->block_size;
        fkvf_st64(buf + 64 + 8 * b,
                  fkvf_xxh3_64(data + start, (size_t)len, off + h->data_off + start));
    }
    return put_section(w, FKVF_SECTION_STRM, FKVF_SECTION_REQUIRED, grp, buf,
                       (size_t)h->section_size);
}

/* One STRM section of group `grp`: `n_streams` streams of `count` symbols,
 * symbol i of stream j = sym16[i * ps + j * cs] (index) or sym32[i] (tokens). */
static int put_segment(fkvf_writer *w, unsigned grp, const fkvf_stream_spec *spec, uint64_t first,
                       uint64_t count, const uint16_t *sym16, size_t ps, size_t cs,
                       const uint32_t *sym32)
{
    wr_group *gr = &w->groups[grp];
    const char *what = grp == FKVF_GROUP_INDEX ? "index streams" : "token stream";
    const seg_symbols s = {count, sym16, ps, cs, sym32};
    fkvf_strm_hdr h;
    segment_header(w, grp, spec, first, count, &h);
    fkvf_ngon g;
    fkvf_stream_spec norm;
    int have_ngon = 0;
    int rc = segment_codec(w, spec, &h, &norm, &g, &have_ngon);
    if (rc)
        return rc;
    uint8_t *buf = NULL;
    uint32_t *tmp = NULL;
    if ((rc = check_segment_fits(w, gr, what, &norm, &h)))
        goto out;
    if (!(buf = fkvf_calloc(w->alloc, (size_t)h.section_size, 1)) ||
        (sym16 && !(tmp = fkvf_malloc(w->alloc, count ? (size_t)count * sizeof *tmp : 1)))) {
        rc = FAIL(FKVF_E_NOMEM, NULL, "no memory for a segment of %llu bytes",
                  (unsigned long long)h.section_size);
        goto out;
    }
    if ((rc = encode_streams(w, &h, &g, what, &s, tmp, buf + h.data_off)))
        goto out;
    if (have_ngon && (rc = ensure_vtxs(w, &g)))
        goto out;
    rc = seal_segment(w, grp, buf, &h);
    if (rc == FKVF_OK) {
        gr->present = 1;
        gr->spec = norm;
        gr->length = first + count;
    }
out:
    fkvf_free(w->alloc, buf);
    fkvf_free(w->alloc, tmp);
    if (have_ngon)
        fkvf_ngon_fini(&g);
    return rc;
}

FKVF_API int fkvf_writer_add_index_segment(fkvf_writer *w, const fkvf_stream_spec *spec,
                                           uint64_t first, uint64_t count, const uint16_t *codes,
                                           size_t pos_stride, size_t code_stride)
{
    int rc = w_enter(w);
    if (rc)
        return rc;
    if (!spec || (!codes && count))
        return FKVF_E_INVALID_ARG;
    if (!w->has_desc || !w->cb_kind)
        return FAIL(FKVF_E_STATE, "11.8", "index streams need the descriptor and the codebook first");
    if (fkvf_index_stream_count(&w->cb, w->desc.n_kv_heads) == 0) /* a group of 0 streams
                                                                   * is invalid (spec 11.2) */
        return FAIL(FKVF_E_INVALID_ARG, "11.2",
                    "the codebook has no stages, so there are no index streams");
    static const uint16_t none = 0;
    return put_segment(w, FKVF_GROUP_INDEX, spec, first, count, codes ? codes : &none, pos_stride,
                       code_stride, NULL);
}

FKVF_API int fkvf_writer_add_token_segment(fkvf_writer *w, const fkvf_stream_spec *spec,
                                           uint64_t first, const uint32_t *tokens, size_t count)
{
    int rc = w_enter(w);
    if (rc)
        return rc;
    if (!spec || (!tokens && count))
        return FKVF_E_INVALID_ARG;
    static const uint32_t none = 0;
    return put_segment(w, FKVF_GROUP_TOKENS, spec, first, count, NULL, 0, 0,
                       tokens ? tokens : &none);
}

FKVF_API int fkvf_writer_add_section(fkvf_writer *w, uint32_t type, uint32_t flags, uint64_t key,
                                     const void *data, size_t size)
{
    int rc = w_enter(w);
    if (rc)
        return rc;
    if ((!data && size) || (rc = check_section_flags(w, flags)))
        return rc ? rc : FKVF_E_INVALID_ARG;
    if (type == FKVF_SECTION_DIRC || type == FKVF_SECTION_DESC || type == FKVF_SECTION_STRM ||
        type == FKVF_SECTION_EXAC || type == FKVF_SECTION_META || type == FKVF_SECTION_VTXS ||
        type == FKVF_SECTION_CBK1 || type == FKVF_SECTION_CBRF)
        return FAIL(FKVF_E_INVALID_ARG, "4.3",
                    "use the dedicated function for this section type");
    /* a search index is keyed by a stream id (spec 20.1, 11.1): kind 0 or 1,
     * reserved bits zero (not FKVF_STREAM_ID_UNNAMED) */
    if ((type == FKVF_SECTION_ZIDX || type == FKVF_SECTION_ZPOS) &&
        ((key >> 56) > 1 || ((key >> 48) & 0xFF) != 0))
        return FAIL(FKVF_E_INVALID_ARG, "20.1",
                    "a search index keyed %016llx, which is not a stream id",
                    (unsigned long long)key);
    return put_section(w, type, flags, key, data, size);
}

/* The writer's copy of shape in w->cb, its layer table in w->cb_layers
 * (none when every layer has the same counts: the uniform shape, spec
 * 13.1, unless keep_table). */
static int keep_shape(fkvf_writer *w, const fkvf_codebook_shape *shape, int keep_table)
{
    fkvf_codebook_shape sh = *shape;
    uint8_t *t = NULL;
    if (sh.layer_stages) {
        size_t n = 2 * (size_t)sh.n_layers;
        if (fkvf_cbk1_table_uniform(&sh) && !keep_table) {
            sh.layer_stages = NULL;
        } else {
            if (!(t = fkvf_malloc(w->alloc, n)))
                return FAIL(FKVF_E_NOMEM, NULL, "no memory for the layer table");
            memcpy(t, sh.layer_stages, n);
            sh.layer_stages = t;
        }
    }
    fkvf_free(w->alloc, w->cb_layers);
    w->cb_layers = t;
    w->cb = sh;
    return FKVF_OK;
}

static int codebook_common(fkvf_writer *w, const fkvf_codebook_shape *shape, int ref)
{
    if (w->cb_kind)
        return FAIL(FKVF_E_STATE, "13.7", "the codebook is already set");
    /* a table the writer drops (layers all alike, an embedded CBK1) needs no
     * bit; one it keeps, or a CBRF's codebook's (spec 3.4), does */
    if (shape->layer_stages && (!fkvf_cbk1_table_uniform(shape) || ref) &&
        !(w->opts.required_features & FKVF_FEAT_LAYER_STAGES))
        return FAIL(FKVF_E_INVALID_ARG, "3.3",
                    "a codebook with stage counts per layer needs FKVF_FEAT_LAYER_STAGES in the "
                    "create options");
    if (fkvf_cbk1_size(shape) == 0)
        return FAIL(FKVF_E_INVALID_ARG, "13.1",
                    "codebook shape out of range (layers %u, heads %u, dims %u/%u, k %u, stages "
                    "%u/%u, dtype %d, pooled %u)",
                    shape->n_layers, shape->n_heads, shape->key_dim, shape->value_dim, shape->k,
                    shape->k_stages, shape->v_stages, (int)shape->dtype, shape->pooled);
    if (w->has_desc && !fkvf_cbk1_matches(shape, &w->desc))
        return FAIL(FKVF_E_INVALID_ARG, "13.7", "codebook shape does not match the descriptor");
    return FKVF_OK;
}

FKVF_API int fkvf_writer_add_codebooks(fkvf_writer *w, const fkvf_codebook_shape *shape,
                                       const void *tables, size_t size, unsigned section_flags)
{
    int rc = w_enter(w);
    if (rc)
        return rc;
    if (!shape || (!tables && size))
        return FKVF_E_INVALID_ARG;
    if ((rc = check_section_flags(w, section_flags)) || (rc = codebook_common(w, shape, 0)))
        return rc;
    uint64_t total = fkvf_cbk1_size(shape), head = fkvf_cbk1_head_size(shape);
    if (size != total - head)
        return FAIL(FKVF_E_INVALID_ARG, "13.2", "codebook tables are %zu bytes, the shape needs %llu",
                    size, (unsigned long long)(total - head));
    if (total > SIZE_MAX)
        return FAIL(FKVF_E_LIMIT, "15", "codebook too large");
    /* spec 13.2: writers store finite values (exponent not all ones) */
    const uint8_t *tb = tables;
    size_t es = shape->dtype == FKVF_DTYPE_F16 ? 2 : 4;
    for (size_t i = 0; i < size; i += es)
        if (es == 2 ? (fkvf_ld16(tb + i) & 0x7C00u) == 0x7C00u
                    : (fkvf_ld32(tb + i) & UINT32_C(0x7F800000)) == UINT32_C(0x7F800000))
            return FAIL(FKVF_E_INVALID_ARG, "13.2",
                        "codebook table element %zu is not finite", i / es);
    if ((rc = keep_shape(w, shape, 0)))
        return rc;
    shape = &w->cb; /* the table, unless every layer has the same counts */
    head = fkvf_cbk1_head_size(shape);
    total = head + size;
    uint8_t *buf = fkvf_malloc(w->alloc, (size_t)total);
    if (!buf)
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for %llu codebook bytes",
                    (unsigned long long)total);
    fkvf_cbk1_hdr_write(buf, shape);
    fkvf_cbk1_layer_table_write(buf + 64, shape);
    if (size)
        memcpy(buf + head, tables, size);
    rc = put_section(w, FKVF_SECTION_CBK1, FKVF_SECTION_REQUIRED | section_flags, 0, buf,
                     (size_t)total);
    if (rc == FKVF_OK)
        fkvf_xxh3_128(buf, (size_t)total, w->cb_hash); /* for a CMET (spec 13.8) */
    fkvf_free(w->alloc, buf);
    if (rc)
        return rc;
    w->cb_kind = 1;
    w->cb_added = 1;
    return FKVF_OK;
}

FKVF_API int fkvf_writer_add_metric(fkvf_writer *w, const fkvf_rvq_metric *m,
                                    unsigned section_flags)
{
    int rc = w_enter(w);
    if (rc)
        return rc;
    if (!m || (!m->keys && !m->values) || (section_flags & ~FKVF_SECTION_DEFLATE))
        return FKVF_E_INVALID_ARG;
    if ((rc = check_section_flags(w, section_flags)))
        return rc;
    if (w->cb_kind != 1 || !w->cb_added)
        return FAIL(FKVF_E_STATE, "13.8",
                    "an encoder metric belongs with a codebook this writer added "
                    "(fkvf_writer_add_codebooks first)");
    if (w->metric_added)
        return FAIL(FKVF_E_STATE, "13.8", "an encoder metric was added already (at most one)");
    fkvf_cmet_hdr h;
    memcpy(h.hash, w->cb_hash, 16);
    h.n_layers = w->cb.n_layers;
    h.n_heads = w->cb.n_heads;
    h.key_dim = w->cb.key_dim;
    h.value_dim = w->cb.value_dim;
    h.parts = (m->keys ? 1u : 0u) | (m->values ? 2u : 0u);
    if (((h.parts & 1) && h.key_dim > FKVF_METRIC_MAX_DIM) ||
        ((h.parts & 2) && h.value_dim > FKVF_METRIC_MAX_DIM))
        return FAIL(FKVF_E_INVALID_ARG, "13.8", "an encoder metric of dimension above %u",
                    FKVF_METRIC_MAX_DIM);
    uint64_t total = fkvf_cmet_size(&h);
    uint32_t dk = (h.parts & 1) ? h.key_dim : 0, dv = (h.parts & 2) ? h.value_dim : 0;
    uint32_t dmax = dk > dv ? dk : dv;
    size_t nn = (size_t)dmax * dmax;
    uint8_t *buf = total <= SIZE_MAX ? fkvf_malloc(w->alloc, (size_t)total) : NULL;
    double *l = fkvf_malloc(w->alloc, nn * sizeof(double));
    float *sym = fkvf_malloc(w->alloc, nn * sizeof(float));
    if (!buf || !l || !sym) {
        fkvf_free(w->alloc, buf);
        fkvf_free(w->alloc, l);
        fkvf_free(w->alloc, sym);
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for a %llu-byte encoder metric",
                    (unsigned long long)total);
    }
    fkvf_cmet_hdr_write(buf, &h);
    size_t n_tabs = (size_t)h.n_layers * h.n_heads;
    for (size_t tab = 0; tab < n_tabs && !rc; tab++)
        for (unsigned kv = 0; kv < 2 && !rc; kv++) {
            const float *src = kv ? m->values : m->keys;
            if (!src)
                continue;
            uint32_t dim = kv ? h.value_dim : h.key_dim;
            size_t dd = (size_t)dim * dim, bad = 0;
            /* the symmetric part (what e^T M e depends on): writers write
             * symmetric positive definite matrices (13.8) */
            fkvf_metric_symmetrize(src + tab * dd, dim, sym);
            if (fkvf_metric_check(sym, dim, l, &bad) != FKVF_METRIC_OK)
                rc = FAIL(FKVF_E_INVALID_ARG, "13.8",
                          "the %s matrix of layer %zu, head %zu is not finite and positive "
                          "definite (element %zu, %zu)",
                          kv ? "value" : "key", tab / h.n_heads, tab % h.n_heads, bad / dim,
                          bad % dim);
            uint8_t *dst = buf + fkvf_cmet_matrix_off(&h, tab, kv);
            for (size_t i = 0; i < dd && !rc; i++)
                fkvf_stf32(dst + 4 * i, sym[i]);
        }
    fkvf_free(w->alloc, l);
    fkvf_free(w->alloc, sym);
    if (rc == FKVF_OK)
        rc = put_section(w, FKVF_SECTION_CMET, section_flags, 0, buf, (size_t)total);
    fkvf_free(w->alloc, buf);
    if (rc == FKVF_OK)
        w->metric_added = 1;
    return rc;
}

FKVF_API int fkvf_writer_add_codebook_ref(fkvf_writer *w, const fkvf_codebook_shape *shape,
                                          const uint8_t hash[16], const char *name)
{
    int rc = w_enter(w);
    if (rc)
        return rc;
    if (!shape || !hash)
        return FKVF_E_INVALID_ARG;
    if (!(w->opts.required_features & FKVF_FEAT_EXTERNAL_CODEBOOK))
        return FAIL(FKVF_E_INVALID_ARG, "3.3",
                    "a codebook reference needs FKVF_FEAT_EXTERNAL_CODEBOOK in the create options");
    if (!w->has_desc)
        return FAIL(FKVF_E_STATE, "13.4", "a codebook file cannot refer to another codebook");
    if ((rc = codebook_common(w, shape, 1)))
        return rc;
    size_t nl = name ? strlen(name) : 0;
    if (nl > FKVF_MAX_ID_LEN || !fkvf_utf8_valid((const uint8_t *)name, nl))
        return FAIL(FKVF_E_INVALID_ARG, "13.5", "codebook name: at most %u bytes of UTF-8",
                    FKVF_MAX_ID_LEN);
    if ((rc = keep_shape(w, shape, 1)))
        return rc;
    uint8_t *buf = fkvf_calloc(w->alloc, FKVF_CBRF_FIXED + nl, 1);
    if (!buf)
        return FAIL(FKVF_E_NOMEM, NULL, "no memory");
    memcpy(buf, hash, 16);
    fkvf_st32(buf + 16, (uint32_t)nl);
    if (nl)
        memcpy(buf + FKVF_CBRF_FIXED, name, nl);
    rc = put_section(w, FKVF_SECTION_CBRF, FKVF_SECTION_REQUIRED, 0, buf, FKVF_CBRF_FIXED + nl);
    fkvf_free(w->alloc, buf);
    if (rc)
        return rc;
    w->cb_kind = 2;
    return FKVF_OK;
}

FKVF_API int fkvf_writer_set_positions(fkvf_writer *w, uint64_t n_positions, uint64_t n_archived)
{
    int rc = w_enter(w);
    if (rc)
        return rc;
    if (n_archived > n_positions)
        return FAIL(FKVF_E_INVALID_ARG, "5.1", "n_archived %llu > n_positions %llu",
                    (unsigned long long)n_archived, (unsigned long long)n_positions);
    w->n_positions = n_positions;
    w->n_archived = n_archived;
    w->dirty = 1;
    return FKVF_OK;
}

/* The archive must be one a reader accepts (spec 11.6, 11.8, 14). */
static int check_consistency(fkvf_writer *w)
{
    const wr_group *ix = &w->groups[FKVF_GROUP_INDEX], *tk = &w->groups[FKVF_GROUP_TOKENS];
    if (tk->present && tk->length != w->n_positions)
        return FAIL(FKVF_E_STATE, "11.6", "the token stream has %llu symbols, needs %llu",
                    (unsigned long long)tk->length, (unsigned long long)w->n_positions);
    if (ix->present && ix->length != w->n_archived)
        return FAIL(FKVF_E_STATE, "11.6", "the index streams have %llu symbols, need %llu",
                    (unsigned long long)ix->length, (unsigned long long)w->n_archived);
    if (!w->has_desc) {
        if (w->n_positions || ix->present || tk->present || w->n_exact || w->cb_kind != 1)
            return FAIL(FKVF_E_STATE, "13.4",
                        "without a descriptor the file is a codebook file: codebooks only");
        return FKVF_OK;
    }
    if (w->n_archived) {
        if (!w->cb_kind)
            return FAIL(FKVF_E_STATE, "13.7", "archived positions need a codebook");
        if (!ix->present)
            return FAIL(FKVF_E_STATE, "11.8", "archived positions need the index streams");
    }
    uint64_t S = w->desc.n_sinks < w->n_positions ? w->desc.n_sinks : w->n_positions;
    if (w->n_archived && w->n_archived > w->n_positions - S)
        return FAIL(FKVF_E_STATE, "14", "n_archived %llu does not fit after %llu sinks",
                    (unsigned long long)w->n_archived, (unsigned long long)S);
    uint64_t ranges[2][2] = {{0, S}, {S + w->n_archived, w->n_positions}};
    for (int k = 0; k < 2; k++) {
        uint64_t p = fkvf_ranges_first_gap(w->exact, w->n_exact, ranges[k][0], ranges[k][1]);
        if (p < ranges[k][1])
            return FAIL(FKVF_E_STATE, "14", "exact position %llu has no exact row",
                        (unsigned long long)p);
    }
    return FKVF_OK;
}

/* Merge the exact ranges (sorted by fkvf_ranges_first_gap) so that a
 * long-lived writer keeps few of them. */
static void coalesce_exact(fkvf_writer *w)
{
    (void)fkvf_ranges_first_gap(w->exact, w->n_exact, 0, 0); /* sorts */
    size_t n = 0;
    for (size_t i = 0; i < w->n_exact; i++) {
        fkvf_range c = w->exact[i];
        if (c.count == 0)
            continue;
        if (n && c.first <= w->exact[n - 1].first + w->exact[n - 1].count) {
            uint64_t end = c.first + c.count, pend = w->exact[n - 1].first + w->exact[n - 1].count;
            if (end > pend)
                w->exact[n - 1].count = end - w->exact[n - 1].first;
        } else {
            w->exact[n++] = c;
        }
    }
    w->n_exact = n;
}

static int do_sync(fkvf_writer *w, const char *when)
{
    if (w->opts.sync == FKVF_SYNC_NONE || !w->sink.sync || w->sink.sync(w->sink.opaque) == 0)
        return FKVF_OK;
    int e = errno;
    fkvf_handle_fail(&w->h, 0);
    return FAIL(FKVF_E_IO, "7.6", "sync %s: %s", when, strerror(e));
}

/* META, directory, trailer of the current commit (spec 7.6). */
static int write_commit(fkvf_writer *w)
{
    int rc;
    if ((rc = check_consistency(w)))
        return rc;
    if (w->meta_count &&
        (rc = put_section(w, FKVF_SECTION_META, 0, 0, w->meta, w->meta_size)))
        return rc;
    if ((rc = out_pad64(w)))
        return rc;
    uint64_t dir_off = w->pos;
    size_t dir_size = FKVF_DIRHDR_SIZE + w->n_dir * FKVF_DIRENT_SIZE;
    uint8_t *dir = fkvf_malloc(w->alloc, dir_size);
    if (!dir)
        return w_broken(w, FAIL(FKVF_E_NOMEM, NULL, "no memory for the directory"));
    fkvf_dirhdr dh = {(uint32_t)w->n_dir, w->commit_seq, w->n_positions, w->n_archived};
    fkvf_dirhdr_write(dir, &dh);
    for (size_t i = 0; i < w->n_dir; i++)
        fkvf_dirent_write(dir + FKVF_DIRHDR_SIZE + i * FKVF_DIRENT_SIZE, &w->dir[i]);
    uint64_t dir_sum = fkvf_xxh3_64(dir, dir_size, dir_off);
    rc = out_bytes(w, dir, dir_size);
    fkvf_free(w->alloc, dir);
    if (rc || (rc = out_pad64(w)))
        return rc;
    /* sections and directory durable before the trailer that makes them valid */
    if ((rc = do_sync(w, "before the trailer")))
        return rc;
    uint64_t toff = w->pos;
    fkvf_trailer t = {w->commit_seq, dir_off, dir_size, dir_sum, w->prev_trailer, toff + 64};
    uint8_t tb[64];
    fkvf_trailer_write(tb, &t, toff);
    if ((rc = out_bytes(w, tb, sizeof tb)) || (rc = do_sync(w, "after the trailer")))
        return rc;
    w->prev_trailer = toff;
    w->committed = toff + 64;
    w->commit_seq++;
    w->n_dir = 0;
    w->meta_count = 0;
    w->meta_size = 0;
    w->dirty = 0;
    coalesce_exact(w);
    return FKVF_OK;
}

/* fkvf_writer_commit without its entry check (fkvf_writer_finish) */
static int commit(fkvf_writer *w)
{
    if (w->commit_seq > FKVF_MAX_COMMITS)
        return FAIL(FKVF_E_LIMIT, "15", "more than %llu commits",
                    (unsigned long long)FKVF_MAX_COMMITS);
    return write_commit(w);
}

FKVF_API int fkvf_writer_commit(fkvf_writer *w)
{
    int rc = w_enter(w);
    if (rc)
        return rc;
    return commit(w);
}

/* fsync the directory holding path (the rename). scratch: at least
 * strlen(path) + 1 bytes, overwritten (the writer's tmp_path, no longer needed
 * after the rename): no allocation here, which could fail unreported. */
static int sync_dir_of(const char *path, char *scratch)
{
    memcpy(scratch, path, strlen(path) + 1);
    int fd = open(dirname(scratch), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    scratch[0] = 0;
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* no_replace: the complete temporary file becomes PATH only if PATH does not
 * exist. link() fails with EEXIST if it does, atomically: an output that
 * appeared since create (another process) is never replaced. On a file
 * system without hard links, a check just before rename() (a small window).
 * A failure leaves PATH untouched; free() removes the temporary file. */
static int place_no_replace(fkvf_writer *w)
{
    if (link(w->tmp_path, w->path) == 0) {
        /* in place under both names: drop the temporary one (if that fails,
         * the archive is in place all the same) */
        (void)unlink(w->tmp_path);
        w->tmp_path[0] = 0;
        return FKVF_OK;
    }
    int e = errno;
    if (e == EPERM || e == ENOTSUP || e == EOPNOTSUPP || e == ENOSYS || e == EMLINK) {
        struct stat sb;
        if (lstat(w->path, &sb) == 0) {
            e = EEXIST;
        } else if (errno != ENOENT) {
            e = errno; /* cannot tell whether it exists: nothing replaced */
        } else {
            if (rename(w->tmp_path, w->path) == 0)
                return FKVF_OK;
            e = errno;
        }
    }
    fkvf_handle_fail(&w->h, 0);
    if (e == EEXIST)
        return FAIL(FKVF_E_EXISTS, NULL,
                    "appeared while the file was written; not replaced (no_replace)");
    return FAIL(FKVF_E_IO, NULL, "link into place: %s", strerror(e));
}

FKVF_API int fkvf_writer_finish(fkvf_writer *w)
{
    int rc = w_enter(w);
    if (rc)
        return rc;
    if ((w->dirty || w->commit_seq == 1 || w->meta_count) && (rc = commit(w)))
        return rc;
    if (w->fd >= 0) {
        if (close(w->fd) != 0) {
            int e = errno;
            w->fd = -1;
            fkvf_handle_fail(&w->h, 0);
            return FAIL(FKVF_E_IO, NULL, "close: %s", strerror(e));
        }
        w->fd = -1;
        if (w->resumed) {
            w->h.state = FKVF_HANDLE_FINISHED;
            return FKVF_OK;
        }
        if ((rc = w->opts.no_replace ? place_no_replace(w) : FKVF_OK))
            return rc;
        if (!w->opts.no_replace && rename(w->tmp_path, w->path) != 0) {
            int e = errno;
            fkvf_handle_fail(&w->h, 0);
            return FAIL(FKVF_E_IO, NULL, "rename into place: %s", strerror(e));
        }
        if (w->opts.sync != FKVF_SYNC_NONE)
            (void)sync_dir_of(w->path, w->tmp_path); /* tmp_path: n + 16 bytes */
    }
    w->h.state = FKVF_HANDLE_FINISHED;
    return FKVF_OK;
}

/* ---- resuming an existing file (writer_resume.h) ------------------------------ */

static long long io_write(void *opaque, const void *data, size_t size)
{
    fkvf_writer *w = opaque;
    if (w->io.write)
        return w->io.write(w->io.opaque, w->fd, data, size);
    return (long long)write(w->fd, data, size);
}

static int io_sync(void *opaque)
{
    fkvf_writer *w = opaque;
    if (w->io.sync)
        return w->io.sync(w->io.opaque, w->fd);
    return fdatasync(w->fd);
}

int fkvf_writer_resume(fkvf_writer **out, const fkvf_resume *st, const fkvf_writer_options *opts,
                       const fkvf_allocator *alloc)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!st || st->fd < 0 || !st->desc || st->committed_size < 192 || st->committed_size % 64 ||
        st->last_seq < 1) {
        if (st && st->fd >= 0)
            close(st->fd);
        return FKVF_E_INVALID_ARG;
    }
    fkvf_writer_options o;
    if (opts)
        o = *opts;
    else
        fkvf_writer_options_init(&o);
    o.required_features = st->required_features;
    o.optional_features = st->optional_features;
    int rc = writer_new(out, &o, alloc);
    fkvf_writer *w = *out;
    if (rc) {
        if (w)
            fkvf_handle_fail(&w->h, 0);
        close(st->fd);
        return rc;
    }
    w->fd = st->fd;
    w->resumed = 1;
    if (st->io)
        w->io = *st->io;
    w->sink.write = io_write;
    w->sink.sync = io_sync;
    w->sink.opaque = w;
    const char *name = st->path ? st->path : "<file>";
    if (!(w->path = fkvf_strndup(w->alloc, name, strlen(name)))) {
        fkvf_handle_fail(&w->h, 0);
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for the path");
    }
    w->diag.name = w->path;
    /* the state the file's served commit leaves */
    char *mid = dup_str(w, st->desc->model_id), *tid = dup_str(w, st->desc->tokenizer_id);
    if (!mid || !tid) {
        fkvf_free(w->alloc, mid);
        fkvf_free(w->alloc, tid);
        fkvf_handle_fail(&w->h, 0);
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for the descriptor");
    }
    w->desc = *st->desc;
    w->desc.model_id = mid;
    w->desc.tokenizer_id = tid;
    w->row_bytes = fkvf_desc_row_bytes(st->desc);
    w->has_desc = 1;
    if (st->cb_kind) {
        if ((rc = keep_shape(w, st->cb, 1))) {
            fkvf_handle_fail(&w->h, 0);
            return rc;
        }
        w->cb_kind = st->cb_kind;
    }
    w->groups[FKVF_GROUP_INDEX].present = st->index_present;
    w->groups[FKVF_GROUP_INDEX].spec = st->index_spec;
    w->groups[FKVF_GROUP_INDEX].length = st->index_length;
    w->groups[FKVF_GROUP_TOKENS].present = st->token_present;
    w->groups[FKVF_GROUP_TOKENS].spec = st->token_spec;
    w->groups[FKVF_GROUP_TOKENS].length = st->token_length;
    w->n_positions = st->n_positions;
    w->n_archived = st->n_archived;
    /* every position of the served commit that must be exact is covered
     * (the reader checked it, spec 14.3) */
    if (st->n_positions) {
        if (fkvf_grow(w->alloc, (void **)&w->exact, &w->cap_exact, 1, sizeof *w->exact)) {
            fkvf_handle_fail(&w->h, 0);
            return FAIL(FKVF_E_NOMEM, NULL, "no memory");
        }
        w->exact[0].first = 0;
        w->exact[0].count = st->n_positions;
        w->n_exact = 1;
    }
    if (st->n_vtxs) {
        if (fkvf_grow(w->alloc, (void **)&w->vtxs_written, &w->cap_vtxs, st->n_vtxs,
                      sizeof *w->vtxs_written)) {
            fkvf_handle_fail(&w->h, 0);
            return FAIL(FKVF_E_NOMEM, NULL, "no memory");
        }
        memcpy(w->vtxs_written, st->vtxs, st->n_vtxs * sizeof *st->vtxs);
        w->n_vtxs = st->n_vtxs;
    }
    w->commit_seq = st->last_seq + 1;
    w->prev_trailer = st->committed_size - 64;
    w->committed = st->committed_size;
    w->pos = st->committed_size;
    if (ftruncate(w->fd, (off_t)st->committed_size) != 0 ||
        lseek(w->fd, (off_t)st->committed_size, SEEK_SET) < 0) {
        int e = errno;
        fkvf_handle_fail(&w->h, 0);
        return FAIL(FKVF_E_IO, NULL, "cannot position at the end of the last commit (%llu): %s",
                    (unsigned long long)st->committed_size, strerror(e));
    }
    return FKVF_OK;
}

int fkvf_writer_rollback(fkvf_writer *w)
{
    if (!FKVF_HANDLE_IS(w, FKVF_HANDLE_WRITER) || w->fd < 0 || !w->resumed)
        return FKVF_E_STATE;
    if (ftruncate(w->fd, (off_t)w->committed) != 0)
        return FKVF_E_IO;
    (void)fdatasync(w->fd);
    return FKVF_OK;
}

uint64_t fkvf_writer_committed_size(const fkvf_writer *w)
{
    return FKVF_HANDLE_IS(w, FKVF_HANDLE_WRITER) ? w->committed : 0;
}

int fkvf_writer_sync_now(fkvf_writer *w)
{
    if (!FKVF_HANDLE_IS(w, FKVF_HANDLE_WRITER) || w->fd < 0)
        return FKVF_E_STATE;
    if (io_sync(w) != 0) {
        int e = errno;
        return fkvf_fail(&w->diag, FKVF_E_IO, FKVF_NO_OFFSET, "7.6", "fdatasync: %s",
                         strerror(e));
    }
    return FKVF_OK;
}
