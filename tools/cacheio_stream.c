/*
 * cacheio_stream.c - kvio_stream_*: a cache file written chunk by chunk of
 * positions, in memory bounded by the chunk, with the same bytes kvio_write
 * gives for the whole cache.
 *
 * Every format lays a cache out as a prefix and then the tensors one after
 * the other (layer 0's keys, its values, ..., the token ids), each in the
 * order of its file shape: the data region. .safetensors and .npy: the
 * prefix (header) is known from the shape and written first, the pieces of
 * the data region go to their offsets with pwrite. .npz: the data region is
 * built in an unnamed scratch file next to the output, and at the end the
 * zip writer (cio_write_npz_from) copies it into the members in order.
 */
#if defined(__linux__)
#define _GNU_SOURCE /* sync_file_range */
#include <fcntl.h>
#else
#define _POSIX_C_SOURCE 200809L
#endif
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "cacheio_impl.h"

struct kvio_stream {
    kvio_cache shape; /* dimensions, dtype, token width; no data, no metadata */
    kvio_format fmt;
    unsigned flags;
    int with_tokens;
    char *path;       /* the output (malloc'd copy) */
    kvio_tmp out;     /* the output's temporary file */
    kvio_tmp scratch; /* .npz: the data region (already unlinked) */
    int fd;           /* where the data region is: out's or scratch's */
    uint64_t base;    /* the data region's byte offset in fd */
    uint64_t kb, vb;  /* bytes of one layer's keys, values */
    uint64_t kv_done, kv_total; /* key/value bytes put, and expected */
    uint64_t tok_done;          /* token ids put */
    uint8_t *stage;             /* a piece in file order before its pwrite */
    size_t stage_cap;
};


int cio_pread_all(const ctx *x, int fd, void *buf, size_t n, uint64_t off)
{
    uint8_t *p = buf;
    while (n) {
        if (off > (uint64_t)INT64_MAX)
            return cio_fail(x, KVIO_E_IO, "read at byte offset %" PRIu64 ": offset too large", off);
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return cio_fail(x, KVIO_E_IO, "read of %zu bytes at byte offset %" PRIu64 " failed: %s", n,
                            off, r < 0 ? strerror(errno) : "end of file");
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return KVIO_OK;
}

/* Writes of at most this many bytes at a time: on Linux 6.x ext4 a 2 GiB
 * file written in calls of 2 MiB or more took 2.4-10x the time of calls of
 * 1 MiB or less (measured, bench/README.md "unpack against cp + sync"). */
#define PWRITE_MAX ((size_t)1 << 20)

int cio_pwrite_all(const ctx *x, int fd, const void *buf, size_t n, uint64_t off)
{
    const uint8_t *p = buf;
    while (n) {
        if (off > (uint64_t)INT64_MAX)
            return cio_fail(x, KVIO_E_IO, "write at byte offset %" PRIu64 ": offset too large", off);
        ssize_t r = pwrite(fd, p, n < PWRITE_MAX ? n : PWRITE_MAX, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return cio_fail(x, KVIO_E_IO, "write of %zu bytes at byte offset %" PRIu64 " failed: %s", n,
                            off, r < 0 ? strerror(errno) : "nothing written");
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return KVIO_OK;
}

#if defined(__linux__)
/* n runs of `run` bytes each, `stride` bytes apart from src on, written one
 * after the other at offset off (pwritev, in calls of at most PWRITE_MAX
 * bytes): a gather with no copy of ours. */
static int pwrite_runs(const ctx *x, int fd, const uint8_t *src, size_t run, size_t stride,
                       size_t n, uint64_t off)
{
    struct iovec iov[512];
    size_t per = PWRITE_MAX / run;
    per = per < 1 ? 1 : per > 512 ? 512 : per;
    for (size_t i = 0; i < n;) {
        size_t m = n - i < per ? n - i : per, k = 0, left = m * run;
        for (size_t j = 0; j < m; j++) {
            iov[j].iov_base = (void *)(uintptr_t)(src + (i + j) * stride);
            iov[j].iov_len = run;
        }
        while (left) { /* a short write goes on from where it stopped */
            if (off > (uint64_t)INT64_MAX)
                return cio_fail(x, KVIO_E_IO, "write at byte offset %" PRIu64 ": offset too large",
                                off);
            ssize_t r = pwritev(fd, iov + k, (int)(m - k), (off_t)off);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return cio_fail(x, KVIO_E_IO,
                                "write of %zu bytes at byte offset %" PRIu64 " failed: %s", left,
                                off, r < 0 ? strerror(errno) : "nothing written");
            size_t got = (size_t)r;
            off += got;
            left -= got;
            while (got && got >= iov[k].iov_len)
                got -= iov[k++].iov_len;
            if (got) {
                iov[k].iov_base = (uint8_t *)iov[k].iov_base + got;
                iov[k].iov_len -= got;
            }
        }
        i += m;
    }
    return KVIO_OK;
}
#endif

void kvio_stream_discard(kvio_stream *w)
{
    if (!w)
        return;
    kvio_tmp_discard(&w->out);
    kvio_tmp_discard(&w->scratch);
    free(w->path);
    free(w->stage);
    free(w);
}

/* The header of a .safetensors or .npy output into w->out; sets w->base. */
static int stream_header(const ctx *x, kvio_stream *w, const kvio_cache *shape)
{
    sink h = {0};
    int rc = w->fmt == KVIO_FMT_SAFETENSORS ? cio_st_header(x, &h, shape, w->with_tokens, w->flags)
                                            : cio_npy_cache_header(x, &h, shape, w->with_tokens, w->flags);
    if (!rc && h.rc)
        rc = cio_fail(x, h.rc, "cannot build the header");
    if (!rc && h.len && fwrite(h.buf, 1, h.len, w->out.f) != h.len)
        rc = cio_fail(x, KVIO_E_IO, "write of the %zu-byte header failed: %s", h.len, strerror(errno));
    if (!rc && fflush(w->out.f) != 0) /* the data go past the FILE buffer (pwrite) */
        rc = cio_fail(x, KVIO_E_IO, "write of the %zu-byte header failed: %s", h.len, strerror(errno));
    w->base = h.len;
    free(h.buf);
    return rc;
}

int kvio_stream_open(kvio_stream **out, const char *path, kvio_format fmt, unsigned flags,
                     const kvio_cache *shape, int with_tokens, char *err, size_t errlen)
{
    ctx x = {path ? path : "(no path)", err, errlen};
    if (!out)
        return cio_fail(&x, KVIO_E_ARG, "no stream handle");
    *out = NULL;
    if (!path || !*path)
        return cio_fail(&x, KVIO_E_ARG, "no path");
    if (!shape)
        return cio_fail(&x, KVIO_E_ARG, "no cache shape given");
    if (fmt == KVIO_FMT_AUTO)
        fmt = kvio_format_from_path(path);
    if (fmt != KVIO_FMT_SAFETENSORS && fmt != KVIO_FMT_NPY && fmt != KVIO_FMT_NPZ)
        return cio_fail(&x, KVIO_E_ARG, "cannot tell the format from the name (use .safetensors, .npy or .npz)");
    int rc = cio_check_shape(&x, shape);
    if (rc)
        return rc;
    if (fmt == KVIO_FMT_NPY && (shape->key_dim != shape->value_dim || with_tokens)) {
        sink none = {0};
        rc = cio_npy_cache_header(&x, &none, shape, with_tokens, flags); /* its message */
        free(none.buf);
        return rc ? rc : cio_fail(&x, KVIO_E_ARG, "not a .npy shape");
    }
    kvio_stream *w = calloc(1, sizeof *w);
    if (!w)
        return cio_fail(&x, KVIO_E_NOMEM, "out of memory");
    w->fd = -1;
    w->fmt = fmt;
    w->flags = flags;
    w->with_tokens = with_tokens != 0;
    w->shape.n_layers = shape->n_layers;
    w->shape.n_kv_heads = shape->n_kv_heads;
    w->shape.n_positions = shape->n_positions;
    w->shape.key_dim = shape->key_dim;
    w->shape.value_dim = shape->value_dim;
    w->shape.dtype = shape->dtype;
    w->shape.token_width = token_width(shape);
    w->kb = kvio_key_bytes(shape);
    w->vb = kvio_value_bytes(shape);
    uint64_t layer, tok, total;
    if (!add_ok(w->kb, w->vb, &layer) || !mul_ok(layer, shape->n_layers, &w->kv_total) ||
        !mul_ok(shape->n_positions, token_width(shape), &tok) ||
        !add_ok(w->kv_total, with_tokens ? tok : 0, &total) || total > (uint64_t)INT64_MAX / 2) {
        kvio_stream_discard(w);
        return cio_fail(&x, KVIO_E_ARG, "cache size overflows");
    }
    struct stat sb;
    if ((flags & KVIO_WRITE_NO_REPLACE) && lstat(path, &sb) == 0) {
        kvio_stream_discard(w);
        return cio_fail(&x, KVIO_E_EXISTS, "exists; not replaced");
    }
    if (!(w->path = dupstr(path))) {
        kvio_stream_discard(w);
        return cio_fail(&x, KVIO_E_NOMEM, "out of memory");
    }
    if ((rc = kvio_tmp_open(&w->out, path, err, errlen)) != KVIO_OK) {
        kvio_stream_discard(w);
        return rc;
    }
    if (fmt == KVIO_FMT_NPZ) {
        /* the data region in a file nobody else sees: unlinked at once, so
         * that nothing is left of it whatever happens */
        if ((rc = kvio_tmp_open(&w->scratch, path, err, errlen)) != KVIO_OK) {
            kvio_stream_discard(w);
            return rc;
        }
        kvio_tmp_unlink(&w->scratch);
        w->fd = fileno(w->scratch.f);
        w->base = 0;
    } else {
        if ((rc = stream_header(&x, w, shape)) != KVIO_OK) {
            kvio_stream_discard(w);
            return rc;
        }
        w->fd = fileno(w->out.f);
    }
    *out = w;
    return KVIO_OK;
}

/* n bytes at byte offset off of the data region; a .npz's is the scratch
 * file, whose offsets are not the output's: the message says so. */
static int stream_put(const ctx *x, const kvio_stream *w, const void *buf, size_t n, uint64_t off)
{
    int rc = cio_pwrite_all(x, w->fd, buf, n, off);
    if (rc && w->fmt == KVIO_FMT_NPZ && x->err && x->errlen) {
        static const char note[] = " (the temporary file of the members' data)";
        size_t k = strlen(x->err);
        if (k + sizeof note <= x->errlen)
            memcpy(x->err + k, note, sizeof note);
    }
    return rc;
}

/* n more key/value bytes put. */
static int stream_done(kvio_stream *w, uint64_t n)
{
    w->kv_done += n;
    return KVIO_OK;
}

/* Room for n bytes in w->stage. */
static int stage_room(const ctx *x, kvio_stream *w, uint64_t n)
{
    if (n <= w->stage_cap)
        return KVIO_OK;
    if (n > SIZE_MAX)
        return cio_fail(x, KVIO_E_NOMEM, "a piece of %" PRIu64 " bytes is too large for memory", n);
    uint8_t *p = realloc(w->stage, (size_t)n);
    if (!p)
        return cio_fail(x, KVIO_E_NOMEM, "out of memory for a piece of %" PRIu64 " bytes", n);
    w->stage = p;
    w->stage_cap = (size_t)n;
    return KVIO_OK;
}

int kvio_stream_kv(kvio_stream *w, uint32_t layer, int kv, uint32_t first, uint32_t n,
                   const void *src, size_t pos_stride, size_t head_stride, char *err, size_t errlen)
{
    ctx x = {w && w->path ? w->path : "(stream)", err, errlen};
    if (!w || w->fd < 0)
        return cio_fail(&x, KVIO_E_ARG, "no open stream");
    const kvio_cache *c = &w->shape;
    if (layer >= c->n_layers || (kv != 0 && kv != 1) || first > c->n_positions ||
        n > c->n_positions - first || (n && !src))
        return cio_fail(&x, KVIO_E_ARG, "layer %u %s positions [%u, %u + %u) outside the cache "
                                        "(%u layers, %u positions)",
                        layer, kv ? "values" : "keys", first, first, n, c->n_layers, c->n_positions);
    if (!n)
        return KVIO_OK;
    size_t rb = (size_t)(kv ? c->value_dim : c->key_dim) * kvio_dtype_size(c->dtype);
    uint32_t H = c->n_kv_heads, T = c->n_positions;
    /* the tensor's first byte in fd (sizes were checked at open) */
    uint64_t at = w->base + (uint64_t)layer * (w->kb + w->vb) + (kv ? w->kb : 0);
    const uint8_t *s = src;
    int rc;
    if (w->flags & KVIO_WRITE_NHD) { /* [T][H][row]: one piece for all heads */
        uint64_t piece = (uint64_t)n * H * rb, off = at + (uint64_t)first * H * rb;
        if (head_stride == rb && pos_stride == H * rb) { /* already in file order */
            if ((rc = stream_put(&x, w, s, (size_t)piece, off)))
                return rc;
            return stream_done(w, piece);
        }
#if defined(__linux__)
        if (head_stride == rb && w->fmt != KVIO_FMT_NPZ) { /* a position's heads together */
            if ((rc = pwrite_runs(&x, w->fd, s, H * rb, pos_stride, n, off)))
                return rc;
            return stream_done(w, piece);
        }
#endif
        if ((rc = stage_room(&x, w, piece)) != KVIO_OK)
            return rc;
        uint8_t *d = w->stage;
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t h = 0; h < H; h++, d += rb)
                memcpy(d, s + (size_t)i * pos_stride + (size_t)h * head_stride, rb);
        if ((rc = stream_put(&x, w, w->stage, (size_t)piece, off)))
            return rc;
    } else { /* [H][T][row]: one piece per head */
        uint64_t piece = (uint64_t)n * rb;
        int direct = pos_stride == rb; /* a head's rows together: no copy */
        if (!direct && (rc = stage_room(&x, w, piece)) != KVIO_OK)
            return rc;
        for (uint32_t h = 0; h < H; h++) {
            const uint8_t *hs = s + (size_t)h * head_stride, *from = hs;
            if (!direct) {
                uint8_t *d = w->stage;
                for (uint32_t i = 0; i < n; i++, d += rb)
                    memcpy(d, hs + (size_t)i * pos_stride, rb);
                from = w->stage;
            }
            uint64_t off = at + ((uint64_t)h * T + first) * rb;
            if ((rc = stream_put(&x, w, from, (size_t)piece, off)))
                return rc;
        }
    }
    return stream_done(w, (uint64_t)n * H * rb);
}

void kvio_stream_kick(kvio_stream *w, uint32_t layer_first, uint32_t layer_count)
{
#if defined(__linux__)
    if (!w || w->fd < 0 || w->fmt == KVIO_FMT_NPZ || layer_first >= w->shape.n_layers ||
        layer_count > w->shape.n_layers - layer_first)
        return; /* a .npz's scratch file is read back: nothing to start */
    uint64_t lb = w->kb + w->vb; /* one layer's tensors, keys then values */
    (void)sync_file_range(w->fd, (off_t)(w->base + layer_first * lb), (off_t)(layer_count * lb),
                          SYNC_FILE_RANGE_WRITE); /* a hint: errors come at the fsync */
#else
    (void)w, (void)layer_first, (void)layer_count;
#endif
}

int kvio_stream_tokens(kvio_stream *w, uint32_t first, uint32_t n, const int64_t *tokens, char *err,
                       size_t errlen)
{
    ctx x = {w && w->path ? w->path : "(stream)", err, errlen};
    if (!w || w->fd < 0 || !w->with_tokens)
        return cio_fail(&x, KVIO_E_ARG, "no open stream with token ids");
    const kvio_cache *c = &w->shape;
    if (first > c->n_positions || n > c->n_positions - first || (n && !tokens))
        return cio_fail(&x, KVIO_E_ARG, "token ids [%u, %u + %u) outside the cache (%u positions)", first,
                        first, n, c->n_positions);
    unsigned tw = token_width(c);
    uint8_t tmp[4096];
    uint64_t at = w->base + w->kv_total + (uint64_t)first * tw;
    for (uint32_t i = 0; i < n;) {
        size_t k = 0;
        for (; i < n && k + tw <= sizeof tmp; i++, k += tw) {
            int64_t t = tokens[i];
            if (t < 0 || (tw == 4 && t > INT32_MAX))
                return cio_fail(&x, KVIO_E_ARG, "token id %" PRId64 " at position %u %s", t, first + i,
                                t < 0 ? "is negative" : "does not fit int32");
            if (tw == 4)
                wr32(tmp + k, (uint32_t)t);
            else
                wr64(tmp + k, (uint64_t)t);
        }
        int rc = stream_put(&x, w, tmp, k, at);
        if (rc)
            return rc;
        at += k;
    }
    w->tok_done += n;
    return KVIO_OK;
}

int kvio_stream_finish(kvio_stream *w, char *err, size_t errlen)
{
    ctx x = {w && w->path ? w->path : "(stream)", err, errlen};
    if (!w || w->fd < 0) {
        kvio_stream_discard(w);
        return cio_fail(&x, KVIO_E_ARG, "no open stream");
    }
    int rc = KVIO_OK;
    if (w->kv_done != w->kv_total || (w->with_tokens && w->tok_done != w->shape.n_positions))
        rc = cio_fail(&x, KVIO_E_ARG,
                      "incomplete: %" PRIu64 " of %" PRIu64 " key/value bytes and %" PRIu64
                      " of %u token ids were given",
                      w->kv_done, w->kv_total, w->with_tokens ? w->tok_done : 0,
                      w->with_tokens ? w->shape.n_positions : 0);
    if (!rc && w->fmt == KVIO_FMT_NPZ) {
        sink s = {0};
        s.f = w->out.f;
        rc = cio_write_npz_from(&x, &s, &w->shape, w->with_tokens, w->flags, w->fd);
    }
    if (rc) {
        kvio_stream_discard(w);
        return rc;
    }
    rc = kvio_tmp_place(&w->out, w->path, w->flags & KVIO_WRITE_NO_REPLACE, err, errlen);
    kvio_stream_discard(w);
    return rc;
}
