/*
 * cacheio_impl.h - what the cacheio sources share and nothing else
 * includes: the message context, little-endian and overflow-checked helpers,
 * the tensors a reader found, the .npy header, the writers' byte sink.
 * The public face of the module is cacheio.h.
 *
 *   cacheio.c             messages, the in-memory cache (init/free/check/equal/metadata)
 *   cacheio_convention.c  the naming convention: from a list of tensors to a cache
 *   cacheio_safetensors.c .safetensors reader (strict minimal JSON) and writer
 *   cacheio_npy.c         .npy header parser, the single-array .npy reader and writer
 *   cacheio_npz.c         .npz reader and writer (libarchive)
 *   cacheio_sink.c        the writers' byte sink and the tensors a cache is written as
 *   cacheio_read.c        format detection, kvio_read_mem and kvio_read (mmap)
 *   cacheio_lazy.c        a lazily read cache: tensors left in the file, kvio_read_kv
 *   cacheio_write.c       kvio_write_mem, kvio_write and the output files (kvio_tmp_*)
 *   cacheio_stream.c      kvio_stream_*: a cache file written chunk by chunk of positions
 *
 * Functions declared here are named cio_* (the static helpers of one source
 * keep short names); only the fkvf_cacheio library links them.
 */
#ifndef FKVF_TOOLS_CACHEIO_IMPL_H
#define FKVF_TOOLS_CACHEIO_IMPL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cacheio.h"

#if defined(__GNUC__)
#define KVIO_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KVIO_PRINTF(a, b)
#endif

/* ---- messages (cacheio.c) ---------------------------------------------- */

typedef struct ctx {
    const char *file; /* name used in messages */
    char *err;
    size_t errlen;
} ctx;

/* A name made safe to print: control bytes, quotes and backslashes as
 * \xNN, long names cut with "...". Used as cio_show(s).s inside one call. */
typedef struct shown {
    char s[112];
} shown;

typedef struct shape_str {
    char s[200];
} shape_str;

/* Write "FILE: <message>" into the caller's buffer; returns code. */
int cio_fail(const ctx *x, int code, const char *fmt, ...) KVIO_PRINTF(3, 4);
/* kvio_cache_check without the data: dtype, dimensions, token width,
 * metadata (what a streaming writer needs of its shape). */
int cio_check_shape(const ctx *x, const kvio_cache *c);
/* cio_show(s).s: s made safe to print (see shown). */
shown cio_show(const char *s);
/* "[2, 3, 4]" (at most KVIO_MAX_NDIM dimensions listed). */
shape_str cio_fmt_shape(const uint64_t *dims, size_t ndim);
/* Strict UTF-8: no overlongs, no surrogates, <= U+10FFFF. Returns the length
 * of the sequence at p (1..4), 0 if invalid or cut by `avail`. */
size_t cio_utf8_seq(const uint8_t *p, size_t avail);

/* ---- little-endian, overflow-checked arithmetic, strings --------------- */

static inline uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* *r = a * b; returns 0 on overflow */
static inline int mul_ok(uint64_t a, uint64_t b, uint64_t *r)
{
    if (a && b > UINT64_MAX / a)
        return 0;
    *r = a * b;
    return 1;
}

static inline int add_ok(uint64_t a, uint64_t b, uint64_t *r)
{
    if (b > UINT64_MAX - a)
        return 0;
    *r = a + b;
    return 1;
}

static inline char *dupstr(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

/* ---- a lazily read cache (cacheio_lazy.c) ------------------------------ */

/* kvio_read with KVIO_READ_LAZY: the tensors the parser left in the
 * mapping (keys[l] / values[l] pointing into map .. map + size) become file
 * offsets (those pointers NULL), the mapping goes and fd is kept (owned by
 * the cache from then on). nhd: those tensors are positions-first in the
 * file. A cache without such tensors is left as it is and fd closed. */
int cio_lazy_adopt(const ctx *x, kvio_cache *c, int fd, const uint8_t *map, size_t size, int nhd);
/* kvio_cache_free's part: the source's free (close the file, free the
 * offsets). */
void cio_lazy_free(struct kvio_lazy *lz);
/* c reads its layers without data through src from now on (c->lazy);
 * src->opaque is c's from the call on, freed here on failure. */
int cio_lazy_set(const ctx *x, kvio_cache *c, const kvio_source *src);

/* ---- the naming convention (cacheio_convention.c) ---------------------- */

enum { T_F16, T_BF16, T_F32, T_I32, T_I64, T_OTHER };
enum { R_EXTRA, R_KEY, R_VALUE, R_TOKENS, R_BADINDEX, R_COMPANION };

/* One tensor found in a file, before it is known to be part of a cache. */
typedef struct kv_tensor {
    const char *name;
    char dtype_name[16]; /* as written in the file ("F16", "<f2") */
    int type;            /* T_* */
    size_t esize;
    size_t ndim;                   /* may exceed KVIO_MAX_NDIM ... */
    uint64_t dims[KVIO_MAX_NDIM];  /* ... then only the first ones are kept */
    uint64_t begin, end;           /* safetensors data_offsets */
    const uint8_t *data;
    uint64_t nbytes;
    uint8_t *owned; /* npz: malloc'd member bytes that `data` points into */
    int spilled;        /* npz, lazy: the data are in the spill file ... */
    uint64_t spill_off; /* ... at this offset (data set once it is mapped) */
    int role, scheme;
    uint32_t layer;
} kv_tensor;

/* Names skipped by a reader, for kvio_cache.ignored. */
typedef struct ign_list {
    char *names[KVIO_MAX_IGNORED];
    size_t n; /* all skipped names, also those not kept */
} ign_list;

/* For messages: every accepted name scheme. */
#define SCHEMES_TEXT                                                                               \
    "accepted: layers.{i}.key/.value (FKVF), past_key_values.{i}.key/.value, "                     \
    "past_key_values.{i}.0/.1 or key_cache.{i}/value_cache.{i} (Hugging Face), token ids as "      \
    "tokens or input_ids; see docs/cache-files.md"

/* Sets t->role (R_*), and for keys and values t->scheme and t->layer. */
void cio_classify(kv_tensor *t);
/* Note a skipped name (copied, escaped); KVIO_E_NOMEM if the copy fails. */
int cio_ign_add(ign_list *g, const char *name);
void cio_ign_free(ign_list *g);
/* Reject duplicate names among n tensors. */
int cio_check_duplicates(const ctx *x, kv_tensor *t, size_t n);
/* [A][B][row] -> [B][A][row], rows of rb bytes. */
void cio_transpose_rows(uint8_t *dst, const uint8_t *src, size_t A, size_t B, size_t rb);
/* From n tensors (names, dtypes, shapes and bytes already checked by the
 * format parser) to a cache. Takes over `meta` (n_meta entries) and the
 * names in `ign` on success and on failure. */
int cio_assemble(const ctx *x, kv_tensor *t, size_t n, unsigned flags, kvio_meta *meta,
                 size_t n_meta, ign_list *ign, kvio_cache *out);

static inline fkvf_dtype to_fkvf(int type)
{
    return type == T_F16 ? FKVF_DTYPE_F16 : type == T_BF16 ? FKVF_DTYPE_BF16 : FKVF_DTYPE_F32;
}

/* ---- writers (cacheio_sink.c, one cio_write_* per format) -------------- */

typedef struct sink {
    FILE *f;      /* file, or ... */
    uint8_t *buf; /* ... a growable buffer */
    size_t len, cap;
    int rc; /* first error: KVIO_E_IO or KVIO_E_NOMEM */
} sink;

/* Tensor names, shapes and sizes in the order they are written. */
typedef struct out_tensor {
    char name[48];
    uint64_t dims[4];
    size_t ndim;
    uint64_t nbytes;
    const uint8_t *data; /* NULL: token ids */
    int is_tokens;
    int nhd;   /* write data [H][T][row] as [T][H][row] */
    size_t rb; /* row bytes (dim x element size) */
} out_tensor;

static inline unsigned token_width(const kvio_cache *c) { return c->token_width == 4 ? 4 : 8; }

void cio_sk_put(sink *s, const void *p, size_t n);
void cio_sk_printf(sink *s, const char *fmt, ...) KVIO_PRINTF(2, 3);
/* Token ids as little-endian int32/int64 (w = 4 or 8). */
void cio_sk_tokens(sink *s, const kvio_cache *c, unsigned w);
/* A key/value tensor's bytes in the order of its file shape. */
void cio_sk_kv(sink *s, const kvio_cache *c, const out_tensor *o);
/* Layer l's keys (kv 0) or values (kv 1) as written with these flags. */
void cio_out_kv(const kvio_cache *c, unsigned flags, uint32_t l, int kv, out_tensor *o);
/* Token ids: "tokens" [T], or with KVIO_WRITE_HF "input_ids" [1, T]. */
void cio_out_tok(const kvio_cache *c, unsigned flags, out_tensor *o);

/* ---- .npy headers (cacheio_npy.c) -------------------------------------- */

typedef struct npy_hdr {
    char descr[16];
    int type;
    size_t esize;
    size_t ndim;
    uint64_t dims[KVIO_MAX_NDIM];
    size_t data_off; /* bytes before the array data */
    uint64_t nbytes; /* bytes of array data */
} npy_hdr;

#define NPY_NEED_MORE (-1)

extern const uint8_t cio_npy_magic[6]; /* \x93NUMPY */
/* The fixed prefix: magic, version, header length. Sets *prefix and
 * *hdr_end (bytes of prefix + header). NPY_NEED_MORE when avail is too short
 * to tell. */
int cio_npy_prefix(const ctx *x, const char *label, const uint8_t *d, size_t avail,
                   size_t *prefix, size_t *hdr_end);
/* Parse the header dict h[0..hl) and check descr/order/size into *o. */
int cio_npy_dict(const ctx *x, const char *label, const uint8_t *h, size_t hl, npy_hdr *o);
/* .npy header (magic .. '\n') for descr and shape, padded to 64 bytes. */
int cio_npy_header(sink *s, const char *descr, const uint64_t *dims, size_t ndim);
/* The .npy descr of a key/value dtype: "<f2", "<u2" (bf16 bits), "<f4". */
const char *cio_npy_descr(fkvf_dtype d);

/* Write a checked cache (kvio_cache_check) in one format to s. */
int cio_write_safetensors(const ctx *x, sink *s, const kvio_cache *c, unsigned flags);
int cio_write_npy(const ctx *x, sink *s, const kvio_cache *c, unsigned flags);
int cio_write_npz(const ctx *x, sink *s, const kvio_cache *c, unsigned flags);

/* The pieces the streaming writer (cacheio_stream.c) shares with them. c's
 * shape, dtype, token width and metadata are read, not its data; with_tokens
 * stands for c->tokens. */
/* The whole .safetensors prefix: 8-byte header length, JSON header. */
int cio_st_header(const ctx *x, sink *s, const kvio_cache *c, int with_tokens, unsigned flags);
/* The .npy header of the [L, 2, (1,) H, T, D] array (with_tokens: refused). */
int cio_npy_cache_header(const ctx *x, sink *s, const kvio_cache *c, int with_tokens, unsigned flags);
/* cio_write_npz with every member's data (keys and values in file order,
 * token ids as little-endian integers) read from fd instead of c: the
 * members' bytes one after the other from offset 0, as in a .safetensors
 * data region. fd < 0: from c (cio_write_npz). */
int cio_write_npz_from(const ctx *x, sink *s, const kvio_cache *c, int with_tokens, unsigned flags,
                       int fd);
/* Read / write exactly n bytes at byte offset off of fd (EINTR and short
 * transfers retried); a failure or end of file names the offset. */
int cio_pread_all(const ctx *x, int fd, void *buf, size_t n, uint64_t off);
int cio_pwrite_all(const ctx *x, int fd, const void *buf, size_t n, uint64_t off);

#endif
