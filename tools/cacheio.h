/*
 * cacheio.h - import/export of raw (unquantized) KV caches for the FKVF
 * tools: .safetensors, .npy and .npz (docs/cache-files.md).
 *
 * This module belongs to the tools, not to libfkvf: it uses only the public
 * header fkvf.h (for fkvf_dtype) and links libarchive for .npz.
 *
 * In memory a cache is n_layers pairs of tensors. Layer i's keys are
 * keys[i], n_kv_heads * n_positions * key_dim elements in the order
 * [head][position][dim] (dim fastest), stored as raw little-endian element
 * bytes of `dtype` (f16, bf16 or f32); values[i] likewise with value_dim.
 * Token ids (optional) are n_positions int64 values in host order.
 *
 * Errors: every function that can fail returns KVIO_OK (0) or a KVIO_E_*
 * code and writes one line into the caller's buffer `err` (errlen bytes,
 * always NUL-terminated when errlen > 0) naming the file, the tensor and
 * what is wrong, e.g.
 *   "cache.safetensors: tensor 'layers.3.key': data_offsets [0, 4096] run
 *    past the end of the data region (2048 bytes)".
 * Readers never crash or allocate more than the input justifies on hostile
 * input: every size is checked against the bytes present before anything
 * is allocated. On failure *out is left empty (safe to kvio_cache_free).
 */
#ifndef FKVF_TOOLS_CACHEIO_H
#define FKVF_TOOLS_CACHEIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fkvf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- result codes ------------------------------------------------------ */
enum {
    KVIO_OK = 0,
    KVIO_E_ARG = 1,         /* bad argument or an invalid cache given to a writer */
    KVIO_E_IO = 2,          /* cannot open, read or write a file */
    KVIO_E_NOMEM = 3,       /* allocation failed */
    KVIO_E_FORMAT = 4,      /* the file is malformed (framing, header, offsets, sizes) */
    KVIO_E_UNSUPPORTED = 5, /* well-formed, but a dtype/order/layout we do not accept */
    KVIO_E_CONVENTION = 6,  /* tensors do not form a cache (names, missing layers, shapes) */
    KVIO_E_EXISTS = 7       /* writers with KVIO_WRITE_NO_REPLACE: the file exists */
};

typedef enum kvio_format {
    KVIO_FMT_AUTO = 0, /* readers: by content (magic), writers: by file extension */
    KVIO_FMT_SAFETENSORS = 1,
    KVIO_FMT_NPY = 2,
    KVIO_FMT_NPZ = 3
} kvio_format;

/* ---- flags ------------------------------------------------------------- */
/* Readers: skip tensors (npz: members) whose names are not part of the
 * naming convention instead of rejecting the file. Skipped safetensors
 * tensors are still checked for offsets, dtype and size. The known
 * companions of a Hugging Face cache (kvio_is_companion: attention_mask,
 * position_ids, ...) are skipped with or without this flag. Every skipped
 * name is reported in kvio_cache.ignored. */
#define KVIO_READ_IGNORE_EXTRA 0x1u
/* Readers: key/value tensors are positions-first, [positions, kv_heads, dim]
 * or [1, positions, kv_heads, dim] (.npy: [layers, 2, positions, kv_heads,
 * dim] or [layers, 2, 1, positions, kv_heads, dim]), and are transposed
 * into the in-memory [head][position][dim] order. Default: heads-first. */
#define KVIO_READ_NHD 0x2u
/* Readers of bytes in memory (set by kvio_read, which maps the file, and
 * not for callers of kvio_read_mem): a key or value tensor stored as the
 * cache holds it (heads-first, uncompressed) may be pointed to instead of
 * copied; kvio_read then keeps the mapping in the cache (kvio_cache.map). */
#define KVIO_READ_BORROW 0x4u
/* kvio_read only (kvio_read_mem refuses it): the key/value tensors stored
 * uncompressed in the file (.safetensors, .npy) are not read at all; those
 * of a .npz are inflated (or copied) into an unlinked temporary file in
 * $TMPDIR (default /tmp) as they are read; either way their keys[l] /
 * values[l] stay NULL and the cache keeps the file open (kvio_cache.lazy)
 * so that kvio_read_kv reads positions on demand, in memory bounded by
 * what the caller asks for. Shape, dtype, token ids and metadata are read
 * and checked as without the flag. A lazy cache is for reading rows only:
 * writers and kvio_cache_check refuse it (a layer without data),
 * kvio_cache_equal says 0. */
#define KVIO_READ_LAZY 0x8u
/* Writers: use the Hugging Face names past_key_values.{i}.key/.value and a
 * leading batch dimension of 1 ([1, kv_heads, positions, dim]), token ids
 * as input_ids [1, positions]; .npy: shape [layers, 2, 1, kv_heads,
 * positions, dim]. */
#define KVIO_WRITE_HF 0x100u
/* .npz writer: deflate members (default: stored, like numpy.savez). */
#define KVIO_WRITE_DEFLATE 0x200u
/* Writers: key/value tensors positions-first (the shapes of KVIO_READ_NHD;
 * with KVIO_WRITE_HF [1, positions, kv_heads, dim]). */
#define KVIO_WRITE_NHD 0x400u
/* kvio_write: never replace an existing file, not even one that appears
 * while the temporary file is written (link(2) into place; KVIO_E_EXISTS). */
#define KVIO_WRITE_NO_REPLACE 0x800u

/* ---- limits ------------------------------------------------------------ */
#define KVIO_MAX_ST_HEADER (100u * 1024u * 1024u) /* safetensors JSON header bytes */
#define KVIO_MAX_NPY_HEADER (1u << 20)            /* .npy header dict bytes */
#define KVIO_MAX_NDIM 8                           /* dimensions kept per tensor */
#define KVIO_MAX_LAYERS 65536u                    /* layers per cache */
#define KVIO_NPZ_MAX_EXPANSION 4096u /* .npz: decompressed bytes <= 4096 x archive bytes + 1 MiB */
#define KVIO_MAX_IGNORED 8           /* skipped tensor names kept in kvio_cache.ignored */

/* The tensor name scheme a reader met (docs/cache-files.md section 2). */
typedef enum kvio_names {
    KVIO_NAMES_NONE = 0,      /* no names: .npy, or a cache built in memory */
    KVIO_NAMES_FKVF = 1,      /* layers.{i}.key / layers.{i}.value */
    KVIO_NAMES_HF = 2,        /* past_key_values.{i}.key / .value */
    KVIO_NAMES_HF_LEGACY = 3, /* past_key_values.{i}.0 / .1 */
    KVIO_NAMES_HF_DYNAMIC = 4, /* key_cache.{i} / value_cache.{i} */
    KVIO_NAMES_LLAMA = 5       /* no names: a llama.cpp state file, read by the tools'
                                * llama bridge (llama_state.h), not by kvio_read */
} kvio_names;

typedef struct kvio_meta {
    char *key;   /* NUL-terminated UTF-8 */
    char *value; /* NUL-terminated UTF-8 */
} kvio_meta;

typedef struct kvio_cache {
    uint32_t n_layers, n_kv_heads, n_positions, key_dim, value_dim;
    fkvf_dtype dtype;     /* F16, BF16 or F32 */
    uint8_t **keys;       /* [n_layers] -> kvio_key_bytes(c) bytes each */
    uint8_t **values;     /* [n_layers] -> kvio_value_bytes(c) bytes each */
    int64_t *tokens;      /* NULL, or [n_positions] token ids (>= 0) */
    unsigned token_width; /* 4 or 8: int32/int64 in the file read; what writers use (0 = 8) */
    kvio_meta *meta;      /* safetensors "__metadata__" (other formats: none) */
    size_t n_meta;
    /* Filled by the readers, ignored by the writers: */
    kvio_names names; /* the name scheme of the key/value tensors */
    size_t n_ignored; /* tensors (npz: members) skipped: companions, extras */
    char *ignored[KVIO_MAX_IGNORED]; /* the first min(n_ignored, 8) of their names
                                      * in file order (npz: tensor name, or the
                                      * member name if not .npy), escaped like
                                      * names in messages; freed by kvio_cache_free */
    /* kvio_read: the file's private writable mapping when tensors point into
     * it (KVIO_READ_BORROW; a write to them changes this process's copy,
     * never the file), unmapped by kvio_cache_free; else NULL. */
    void *map;
    size_t map_size;
    /* kvio_read with KVIO_READ_LAZY, or kvio_cache_init_source: the source
     * the NULL layers are read from (kvio_read_kv: an open file); freed (and
     * closed) by kvio_cache_free. */
    struct kvio_lazy *lazy;
} kvio_cache;

/* ---- helpers ----------------------------------------------------------- */
size_t kvio_dtype_size(fkvf_dtype dtype);     /* 2, 2, 4; 0 if unknown */
const char *kvio_dtype_name(fkvf_dtype dtype); /* "f16", "bf16", "f32", "?" */
const char *kvio_format_name(kvio_format fmt); /* "safetensors", "npy", "npz", "auto" */
const char *kvio_strerror(int code);
/* "none", "fkvf", "hf", "hf-legacy", "hf-dynamic", "llama.cpp" ("?" if
 * unknown). */
const char *kvio_names_name(kvio_names names);
/* 1 for the Hugging Face schemes (HF, HF_LEGACY, HF_DYNAMIC). */
int kvio_names_is_hf(kvio_names names);
/* 1 if name is a known companion of a Hugging Face cache that readers skip:
 * attention_mask, position_ids, cache_position, token_type_ids, logits. */
int kvio_is_companion(const char *name);
/* By extension: .safetensors, .npy, .npz (case-insensitive); AUTO if none. */
kvio_format kvio_format_from_path(const char *path);
/* By content: npy magic, zip magic, else safetensors if the first 8 bytes
 * can be a header length; AUTO if nothing fits. */
kvio_format kvio_format_sniff(const void *data, size_t size);

/* Bytes of one layer's keys / values (0 if the shape overflows 64 bits). */
uint64_t kvio_key_bytes(const kvio_cache *c);
uint64_t kvio_value_bytes(const kvio_cache *c);

/* Allocate a zero-filled cache (tokens zero-filled when with_tokens).
 * Dimensions other than n_positions must be >= 1. */
int kvio_cache_init(kvio_cache *c, uint32_t n_layers, uint32_t n_kv_heads, uint32_t n_positions,
                    uint32_t key_dim, uint32_t value_dim, fkvf_dtype dtype, int with_tokens,
                    char *err, size_t errlen);
void kvio_cache_free(kvio_cache *c); /* frees everything, leaves *c zeroed; NULL ok */
/* Free the cache's key/value data (memory, mapping, a lazy cache's open
 * file), keeping its shape, dtype, token ids, metadata and names: for a
 * caller that has the rows elsewhere. kvio_read_kv fails on it afterwards
 * (a layer without data). NULL ok. */
void kvio_cache_drop_data(kvio_cache *c);
/* 1 if p points into the cache's file mapping (kvio_cache.map). */
int kvio_in_map(const kvio_cache *c, const void *p);
/* Append (or replace) a metadata entry; strings are copied. */
int kvio_cache_set_meta(kvio_cache *c, const char *key, const char *value);
const char *kvio_cache_get_meta(const kvio_cache *c, const char *key); /* NULL if absent */
/* Is the cache well-formed (what writers require)? */
int kvio_cache_check(const kvio_cache *c, char *err, size_t errlen);
/* Same shape, dtype, bytes, tokens (token_width and metadata not compared). */
int kvio_cache_equal(const kvio_cache *a, const kvio_cache *b);

/* ---- reading ----------------------------------------------------------- */
/* Read a file (fmt AUTO: by content). `out` need not be initialized. */
int kvio_read(const char *path, kvio_format fmt, unsigned flags, kvio_cache *out, char *err,
              size_t errlen);
/* Parse bytes already in memory; `name` is used in messages. */
int kvio_read_mem(const void *data, size_t size, const char *name, kvio_format fmt,
                  unsigned flags, kvio_cache *out, char *err, size_t errlen);
int kvio_read_safetensors_mem(const void *data, size_t size, const char *name, unsigned flags,
                              kvio_cache *out, char *err, size_t errlen);
int kvio_read_npy_mem(const void *data, size_t size, const char *name, unsigned flags,
                      kvio_cache *out, char *err, size_t errlen);
int kvio_read_npz_mem(const void *data, size_t size, const char *name, unsigned flags,
                      kvio_cache *out, char *err, size_t errlen);

/* A plain array from a .npy file: little-endian float32 ('<f4'), C order,
 * 1..KVIO_MAX_NDIM dimensions (another dtype is KVIO_E_UNSUPPORTED: save
 * it as float32); for matrices such as an encoder metric (fkvf train
 * --key-metric). data: n floats in host order, malloc'd (kvio_array_free). */
typedef struct kvio_array {
    float *data;
    uint64_t n;
    uint64_t dims[KVIO_MAX_NDIM];
    size_t ndim;
} kvio_array;
int kvio_read_array(const char *path, kvio_array *out, char *err, size_t errlen);
void kvio_array_free(kvio_array *a); /* leaves *a zeroed; NULL ok */

/* Positions [first, first + n) of layer's keys (kv 0) or values (kv 1),
 * every head, in memory or (a lazy cache) read from the file: the row
 * (key_dim or value_dim elements of dtype) of position first + i, head h
 * goes to dst + i * pos_stride + h * head_stride, the placement of
 * kvio_stream_kv. A lazy layer is read with pread(2) in pieces of at most
 * a few MiB (a scratch buffer kept in the cache, so one thread at a time
 * per cache). KVIO_E_ARG (a range or layer outside the cache, no dst),
 * KVIO_E_IO (a read failed or the file ended early: it changed after it
 * was opened; the message names the file, the tensor and the byte offset),
 * KVIO_E_NOMEM. */
int kvio_read_kv(const kvio_cache *c, uint32_t layer, int kv, uint32_t first, uint32_t n,
                 void *dst, size_t pos_stride, size_t head_stride, char *err, size_t errlen);

/* ---- lazy sources ------------------------------------------------------ */
/* Where a lazy cache's layers without data are read from: kvio_read's
 * (KVIO_READ_LAZY: pread of the tensors in a .safetensors or .npy file) or
 * another reader's (the llama.cpp bridge: a state file's rows converted on
 * demand, llama_state.h). read_kv is called by kvio_read_kv for a layer
 * whose keys[l] / values[l] is NULL, its arguments checked (layer <
 * n_layers, kv 0 or 1, [first, first + n) inside the cache, n >= 1, dst
 * given), with kvio_read_kv's contract for the rest (placement, errors:
 * KVIO_E_IO naming the file and the byte offset). free (may be NULL)
 * releases opaque; name (may be NULL) is the file named in kvio_read_kv's
 * argument errors, owned by opaque. */
typedef struct kvio_source {
    int (*read_kv)(void *opaque, const kvio_cache *c, uint32_t layer, int kv, uint32_t first,
                   uint32_t n, void *dst, size_t pos_stride, size_t head_stride, char *err,
                   size_t errlen);
    void (*free)(void *opaque);
    void *opaque;
    const char *name;
} kvio_source;

/* A cache of this shape whose layers all come from src (keys[l] and
 * values[l] NULL; token ids zero-filled when with_tokens, token_width 8):
 * kvio_cache_init without the data, for a reader of a format cacheio does
 * not know. The cache owns src->opaque from the call on, success or not
 * (on failure it is freed here; kvio_cache_free frees it). The layer sizes
 * need not fit memory. KVIO_E_ARG (a bad shape, no read_kv), KVIO_E_NOMEM. */
int kvio_cache_init_source(kvio_cache *c, uint32_t n_layers, uint32_t n_kv_heads,
                           uint32_t n_positions, uint32_t key_dim, uint32_t value_dim,
                           fkvf_dtype dtype, int with_tokens, const kvio_source *src, char *err,
                           size_t errlen);

/* ---- writing ----------------------------------------------------------- */
/* Write a file (fmt AUTO: by extension) through kvio_tmp_open/_place (see
 * "output files" below): a temporary file next to it, renamed over path when
 * complete (KVIO_WRITE_NO_REPLACE: refused with KVIO_E_EXISTS if path exists
 * before or after the write). The file's mode is kvio_output_mode(). A failed
 * write removes the temporary file and leaves path as it was. */
int kvio_write(const char *path, kvio_format fmt, unsigned flags, const kvio_cache *c, char *err,
               size_t errlen);
/* Write into a malloc'd buffer (*out, *out_size); free() it. */
int kvio_write_mem(const kvio_cache *c, kvio_format fmt, unsigned flags, uint8_t **out,
                   size_t *out_size, char *err, size_t errlen);

/* ---- streaming writes -------------------------------------------------- */
/* A cache file written piece by piece, for caches larger than memory: the
 * same bytes kvio_write gives for the whole cache (same format, flags,
 * shape, metadata, data), in memory bounded by the largest piece given.
 *
 *   kvio_stream *w;
 *   if (kvio_stream_open(&w, path, fmt, flags, &shape, with_tokens, err, errlen)) -> error
 *   for each chunk of positions [first, first + n):
 *       kvio_stream_kv(w, l, kv, first, n, src, pos_stride, head_stride, ...)
 *           for every layer l and kv 0 (keys), 1 (values);
 *       kvio_stream_tokens(w, first, n, ids, ...) when with_tokens;
 *   rc = kvio_stream_finish(w, err, errlen);  (or kvio_stream_discard(w))
 *
 * shape gives n_layers, n_kv_heads, n_positions, key_dim, value_dim, dtype,
 * token_width and meta (.safetensors __metadata__), as kvio_cache_check
 * requires them; its keys, values and tokens are not read (may be NULL),
 * with_tokens says whether token ids are written. shape is read during
 * kvio_stream_open only. flags: the KVIO_WRITE_* of kvio_write.
 *
 * The output goes through kvio_tmp_open/_place like kvio_write's: nothing
 * appears at path before kvio_stream_finish succeeds, and a failure at any
 * step (or kvio_stream_discard) leaves no file behind. A .npz output builds
 * its data in a second temporary file next to path, unlinked as soon as it
 * is created, and writes the zip at kvio_stream_finish.
 *
 * Every position of every (layer, kv) and, with tokens, every token id must
 * be given exactly once, in any order; kvio_stream_finish refuses
 * (KVIO_E_ARG) an incomplete cache. Errors are KVIO_E_ARG (a position range
 * or layer outside the shape, a negative token id or one that does not fit
 * token_width 4), KVIO_E_IO (a write failed: the message names the byte
 * offset), KVIO_E_NOMEM, KVIO_E_EXISTS (kvio_write's KVIO_WRITE_NO_REPLACE).
 * A stream is used by one thread at a time; after an error other than a
 * range error the caller discards it. */
typedef struct kvio_stream kvio_stream;

int kvio_stream_open(kvio_stream **w, const char *path, kvio_format fmt, unsigned flags,
                     const kvio_cache *shape, int with_tokens, char *err, size_t errlen);
/* Positions [first, first + n) of layer's keys (kv 0) or values (kv 1):
 * the row (key_dim or value_dim elements of dtype) of position first + i,
 * head h is at src + i * pos_stride + h * head_stride. */
int kvio_stream_kv(kvio_stream *w, uint32_t layer, int kv, uint32_t first, uint32_t n,
                   const void *src, size_t pos_stride, size_t head_stride, char *err, size_t errlen);
/* Start writing the bytes of layers [layer_first, + layer_count) (keys
 * and values) to disk without waiting (Linux: sync_file_range), once they
 * are complete, so that the fsync of kvio_stream_finish has little left and
 * the disk works while the caller computes the next layers: a hint, errors
 * come at kvio_stream_finish. Nothing for a .npz (its data are copied into
 * the zip at the end) or elsewhere than on Linux. */
void kvio_stream_kick(kvio_stream *w, uint32_t layer_first, uint32_t layer_count);
/* Token ids of positions [first, first + n). */
int kvio_stream_tokens(kvio_stream *w, uint32_t first, uint32_t n, const int64_t *tokens, char *err,
                       size_t errlen);
/* Complete the file and put it at path (kvio_tmp_place); w is freed,
 * success or not. */
int kvio_stream_finish(kvio_stream *w, char *err, size_t errlen);
/* Give up: the temporary files go, w is freed. NULL is fine. */
void kvio_stream_discard(kvio_stream *w);

/* ---- output files ------------------------------------------------------ */
/* How every output file of the tools is written (kvio_write, fkvf plot):
 *
 *   kvio_tmp t;
 *   if (kvio_tmp_open(&t, path, err, errlen) != KVIO_OK) -> error
 *   ... write through t.f ...; on a failure of your own: kvio_tmp_discard(&t)
 *   rc = kvio_tmp_place(&t, path, flags, err, errlen);
 *
 * The data go to a new temporary file next to path (same directory, so the
 * final rename(2) is atomic); path is not touched until the file is complete
 * and on disk. Replacing path replaces the directory entry: a hard link to
 * the old file keeps the old bytes, a symbolic link at path is replaced by
 * the regular file (its target is left alone). Any failure removes the
 * temporary file and leaves path as it was. Not thread-safe on a shared
 * kvio_tmp; see kvio_output_mode for the mode. */
typedef struct kvio_tmp {
    char *path; /* the temporary file, "<path>.tmp-XXXXXX" (malloc'd); NULL: none */
    FILE *f;    /* open for writing ("wb") until placed or discarded */
} kvio_tmp;

/* The permission bits of the tools' output files: 0666 & ~umask, as fopen(3)
 * would create them. The umask is read on the first call (umask(0), then
 * restored at once), which is not thread-safe: the tools are single-threaded;
 * a threaded program makes the first call before it starts threads. */
unsigned kvio_output_mode(void);

/* Create the temporary file for path (mkstemp(3) next to it, then fchmod to
 * kvio_output_mode(); if the file system refuses the fchmod the file stays
 * 0600, never wider). On success t->f is open for writing; on failure
 * (KVIO_E_IO: e.g. the directory does not exist or is not writable;
 * KVIO_E_NOMEM; KVIO_E_ARG: no path) *t is empty. */
int kvio_tmp_open(kvio_tmp *t, const char *path, char *err, size_t errlen);

/* Finish t and put it at path: flush, fsync and close t->f (a write error
 * recorded on t->f, or one reported now, is KVIO_E_IO), then rename(2) it
 * over path; with KVIO_WRITE_NO_REPLACE in flags (other flags are ignored)
 * link(2) it to path instead and remove the temporary name, which fails with
 * KVIO_E_EXISTS if path exists, even as a dangling symbolic link or as a file
 * that appeared while t was written (on a file system without hard links: a
 * check just before the rename, a small window). The directory is then
 * fsynced (best effort). Success or not, t is released: the temporary file is
 * gone and *t is empty. */
int kvio_tmp_place(kvio_tmp *t, const char *path, unsigned flags, char *err, size_t errlen);

/* Give up t: close t->f, remove the temporary file, empty *t. NULL and an
 * empty t are fine (a no-op). */
void kvio_tmp_discard(kvio_tmp *t);

/* Remove t's name now and keep t->f open (a scratch file nobody else may
 * see); t->path becomes NULL. NULL and an empty t are fine.
 *
 * Until its name goes (kvio_tmp_place, _discard, _unlink), a temporary file
 * is removed if the process is ended by SIGINT, SIGTERM or SIGHUP: the first
 * kvio_tmp_open installs a handler for those of the three whose disposition
 * is the default (it unlinks the live temporary names and re-raises the
 * signal). */
void kvio_tmp_unlink(kvio_tmp *t);

#ifdef __cplusplus
}
#endif
#endif
