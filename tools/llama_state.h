/*
 * llama_state.h - llama.cpp state files read and written, for the FKVF
 * tools (fkvf import-llama / export-llama, and any command that reads a
 * cache given --model MODEL.gguf). docs/llamacpp.md describes the workflow;
 * the layout is the one llama.cpp build 1 (commit 5b4ebc5) writes:
 *
 *   sequence state (llama_state_seq_save_file): u32 magic 0x67677371
 *     ("ggsq"), u32 version 3, u32 n_tokens, i32 tokens[n_tokens], then the
 *     memory block;
 *   session (llama_state_save_file): u32 magic 0x6767736e ("ggsn"), u32
 *     version 10, u32 n_tokens, i32 tokens[n_tokens], u32 arch_len,
 *     arch_len bytes of the architecture name, then the memory block.
 *
 *   memory block: u32 n_stream, then per stream: u32 cell_count; when it
 *     is not 0: per cell (i32 pos, u32 n_seq_id, i32 seq_id[n_seq_id]),
 *     u32 v_trans, u32 n_layer, per layer (i32 K ggml type, u64 K row
 *     bytes, cell_count K rows), then per layer V: v_trans = 0 as rows
 *     (i32 type, u64 row bytes, cell_count rows), v_trans = 1 transposed
 *     (i32 type, u32 element bytes, u32 n_embd_v_gqa, then for each of the
 *     n_embd_v_gqa channels the cell_count elements of that channel).
 *
 *   A K or V row is one cell: n_kv_heads x head_dim elements, head-major
 *   ([head][dim], dim fastest). Keys are as llama.cpp caches them: rotated
 *   (RoPE applied). All integers little-endian.
 *
 * Supported (everything else is refused with LLST_E_UNSUPPORTED and a
 * message saying what the file has): K and V types f32 (ggml type 0), f16
 * (1) and bf16 (30); both V layouts; any n_stream with the cells of one
 * sequence in one stream (the other streams empty); every cell in exactly
 * one sequence, the same one; positions 0, 1, ..., cell_count-1 in cell
 * order; n_tokens equal to cell_count or 0. Not supported: quantized cache
 * types, a cell in several sequences, several sequences or non-empty
 * streams, positions that are not 0..n-1 in order (context shift, a
 * removed range), the per-cell extension of M-RoPE models.
 *
 * Hostile input: every count and length is checked against the bytes that
 * remain before anything is read or allocated; what is allocated is bounded
 * by the file's size. No crash, no hang, no unbounded allocation.
 *
 * Errors: functions return LLST_OK (0) or an LLST_E_* code and write one
 * line into err (errlen bytes, NUL-terminated when errlen > 0) naming the
 * file (the `name` given), the byte offset and the field, e.g.
 *   "s.bin: offset 20: layer 0 K row bytes 640 do not fit the 12 bytes
 *    that remain (2 cells)".
 * Not thread-safe on a shared llst_file; distinct objects are independent.
 */
#ifndef FKVF_TOOLS_LLAMA_STATE_H
#define FKVF_TOOLS_LLAMA_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "cacheio.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    LLST_OK = 0,
    LLST_E_ARG = 1,        /* bad argument */
    LLST_E_IO = 2,         /* cannot open, read or write a file */
    LLST_E_NOMEM = 3,      /* allocation failed */
    LLST_E_FORMAT = 4,     /* not a state file, or malformed (truncated, lengths) */
    LLST_E_UNSUPPORTED = 5 /* well-formed, but something listed above as not supported */
};

#define LLST_SEQ_MAGIC 0x67677371u     /* "ggsq" */
#define LLST_SEQ_VERSION 3u
#define LLST_SESSION_MAGIC 0x6767736eu /* "ggsn" */
#define LLST_SESSION_VERSION 10u

/* Streams in a memory block at most: llama.cpp has one per sequence at most
 * (LLAMA_MAX_SEQ, 256 in build 1); more is refused as malformed. */
#define LLST_MAX_STREAMS 4096u

/* ggml type ids of the cache types supported */
#define LLST_GGML_F32 0
#define LLST_GGML_F16 1
#define LLST_GGML_BF16 30

typedef enum llst_kind {
    LLST_KIND_NONE = 0,
    LLST_KIND_SEQ = 1,    /* llama_state_seq_save_file */
    LLST_KIND_SESSION = 2 /* llama_state_save_file */
} llst_kind;

/* One layer of the one non-empty stream. Pointers point into the bytes
 * given to llst_parse (not owned; valid while those are). */
typedef struct llst_layer {
    int32_t k_type;        /* ggml type id */
    uint64_t k_row_bytes;  /* bytes of one cell's key row */
    const uint8_t *k;      /* cell_count rows of k_row_bytes */
    int32_t v_type;
    uint64_t v_row_bytes;  /* v_trans = 0: bytes of one cell's value row;
                            * v_trans = 1: v_el_bytes * v_n_embd */
    uint32_t v_el_bytes;   /* v_trans = 1: element bytes as the file says; 0 else */
    uint32_t v_n_embd;     /* v_trans = 1: values per cell (n_embd_v_gqa); 0 else */
    const uint8_t *v;      /* v_trans = 0: cell_count rows; 1: v_n_embd channels of
                            * cell_count elements each */
    uint64_t k_off, v_off; /* the byte offsets of k and v in the file (llst_open: k
                            * and v are NULL, the rows are there) */
} llst_layer;

/* A parsed state file: what the file says, checked for framing only (every
 * length fits the file, the bytes are used up exactly). */
typedef struct llst_file {
    llst_kind kind;
    uint32_t version;
    uint32_t n_tokens;
    int32_t *tokens;    /* [n_tokens] (malloc'd; NULL when n_tokens = 0) */
    char *arch;         /* session: the architecture name, NUL-terminated
                         * (malloc'd); seq: NULL */
    uint32_t n_stream;  /* streams in the memory block */
    uint32_t stream;    /* index of the stream that holds the cells (0 when none do) */
    uint32_t n_cells;   /* cell_count of that stream (0: an empty state) */
    int32_t *pos;       /* [n_cells] (malloc'd) */
    int32_t *seq_id;    /* [n_cells]: each cell's one sequence id (malloc'd) */
    uint32_t v_trans;   /* 0 or 1 (0 when n_cells = 0) */
    uint32_t n_layer;
    llst_layer *layers; /* [n_layer] (malloc'd) */
    uint64_t size;      /* bytes of the file */
    struct llst_src *src; /* llst_open: the open file (llst_free closes it, or
                           * llst_to_cache_lazy moves it into the cache); else NULL */
} llst_file;

/* The cache shape the state file lacks, from the model (gguf.h). */
typedef struct llst_shape {
    uint32_t n_layers, n_kv_heads, key_dim, value_dim;
} llst_shape;

/* How to write a state file back (llst_write_*): the fields llama.cpp
 * checks on load and the ones that make the file the same bytes as the one
 * imported. llst_params_from_file fills them from a parsed file. */
typedef struct llst_params {
    llst_kind kind;
    uint32_t n_stream;  /* >= 1 */
    uint32_t stream;    /* < n_stream: the stream that holds the cells */
    int32_t seq_id;     /* every cell's sequence id */
    uint32_t v_trans;   /* 0 or 1 */
    int32_t k_type;     /* LLST_GGML_F32 / F16 / BF16, every layer */
    int32_t v_type;
    const char *arch;   /* session only: the architecture name (not owned) */
} llst_params;

/* Is this the start of a state file? The kind by magic (a version not
 * this module's still gives the kind: llst_parse then says which version it
 * has and which it reads); LLST_KIND_NONE if neither magic. size >= 4. */
llst_kind llst_sniff(const void *data, size_t size);
const char *llst_kind_name(llst_kind kind); /* "sequence state", "session", "none" */
const char *llst_strerror(int code);
/* "f32", "f16", "bf16", or "ggml type N" (static buffer for unknown types:
 * not thread-safe for those). */
const char *llst_type_name(int32_t ggml_type);

/* Parse a whole state file in memory. `out` need not be initialized; on
 * failure it is left empty (safe to llst_free). Framing only: types are not
 * checked here (llst_to_cache does). */
int llst_parse(const void *data, size_t size, const char *name, llst_file *out, char *err,
               size_t errlen);
void llst_free(llst_file *f); /* frees what llst_parse allocated, zeroes *f; NULL ok */

/* llst_parse of an open state file without reading its rows: the header,
 * the cells and each layer's header are read (pread, through a small
 * window) and checked as llst_parse checks them, with its messages; the
 * rows are skipped (every layer's k and v NULL, k_off and v_off where they
 * are). fd (a regular file of size bytes, opened for reading) is out's
 * from the call on, success or not: kept in out->src (closed by llst_free)
 * for llst_to_cache_lazy, closed here on failure. A read that fails or
 * finds the file shorter than size is LLST_E_IO naming the offset. */
int llst_open(int fd, uint64_t size, const char *name, llst_file *out, char *err,
              size_t errlen);

/* llst_to_cache for a file from llst_open, with its checks, dtype and
 * tokens; the cache's layers stay in the file: a lazy cache
 * (kvio_cache_init_source) whose kvio_read_kv reads and converts the rows
 * of the positions asked for (K rows, V rows, or a transposed V's channels
 * for those cells), in pieces of at most a few MiB, so memory is bounded
 * by what the caller asks for whatever the file's size. The open file
 * moves from f into the cache (f->src NULL on success; f's other fields
 * stay). A read that fails later (the file changed) is KVIO_E_IO from
 * kvio_read_kv, naming the file (name), the layer and the byte offset. */
int llst_to_cache_lazy(llst_file *f, const llst_shape *shape, const char *name, kvio_cache *out,
                       char *err, size_t errlen);

/* The cache of a parsed file, checked against the model's shape (row bytes
 * = n_kv_heads x dim x element bytes, n_layer = n_layers) and the support
 * rules above. The cache's dtype is the file's when K and V have the same
 * type, else f32 (f16 and bf16 convert to f32 exactly); tokens are the
 * file's when n_tokens = n_cells (token_width 4), none when 0. `out` need
 * not be initialized; on failure it is left empty. */
int llst_to_cache(const llst_file *f, const llst_shape *shape, const char *name,
                  kvio_cache *out, char *err, size_t errlen);
/* The params that write f's cache back as the same bytes. */
void llst_params_from_file(const llst_file *f, llst_params *p);

/* Write cache c as a state file. Cells are positions 0..n-1 in order, with
 * p->seq_id; tokens are c->tokens (all must fit int32), or none when NULL.
 * Elements are converted from c->dtype to p->k_type / p->v_type (rounded to
 * nearest even; exact when c's dtype is the target type, or the file was
 * imported with llst_to_cache from a file of that type). */
int llst_write_mem(const kvio_cache *c, const llst_params *p, uint8_t **out, size_t *out_size,
                   char *err, size_t errlen);
/* The same into a file, through kvio_tmp_open / kvio_tmp_place (atomic;
 * flags as kvio_tmp_place: KVIO_WRITE_NO_REPLACE refuses an existing path). */
int llst_write_file(const char *path, unsigned flags, const kvio_cache *c, const llst_params *p,
                    char *err, size_t errlen);

/* A state file written chunk by chunk of positions (fkvf export-llama):
 * the bytes llst_write_file gives for the whole cache, in memory bounded by
 * the pieces given (plus a stage of a few MiB), whatever the file's size.
 *
 *   llst_stream *w;
 *   llst_stream_open(&w, path, flags, &shape, with_tokens, &params, err, errlen);
 *   for each chunk of positions [first, first + n):
 *       llst_stream_kv(w, l, kv, first, n, src, pos_stride, head_stride, ...)
 *           for every layer l and kv 0 (keys), 1 (values);
 *       llst_stream_tokens(w, first, n, ids, ...) when with_tokens;
 *   rc = llst_stream_finish(w, err, errlen);  (or llst_stream_discard(w))
 *
 * shape gives n_layers, n_kv_heads, n_positions, key_dim, value_dim and
 * dtype (the rows' element type; its data and tokens are not read); p as
 * for llst_write_file. The file is built in a temporary file next to path
 * (kvio_tmp_open): the prefix, cells and layer headers at open, each piece
 * at its offset (pwrite): a K or V range as runs of rows, a transposed V
 * range as each channel's run of those cells. Nothing is at path until
 * llst_stream_finish puts it there (kvio_tmp_place, flags as
 * llst_write_file's); a failure, or llst_stream_discard, leaves no file.
 * Every position of every (layer, kv) and, with tokens, every token id must
 * be given exactly once, in any order: finish refuses (LLST_E_ARG) fewer.
 * Errors: LLST_E_ARG (a range or layer outside the shape, a token id that
 * does not fit int32), LLST_E_IO (a write failed: the offset is named),
 * LLST_E_NOMEM. After an error other than a range error, discard w. */
typedef struct llst_stream llst_stream;
int llst_stream_open(llst_stream **w, const char *path, unsigned flags, const kvio_cache *shape,
                     int with_tokens, const llst_params *p, char *err, size_t errlen);
/* Positions [first, first + n) of layer's keys (kv 0) or values (kv 1): the
 * row of position first + i, head h at src + i * pos_stride + h * head_stride
 * (kvio_stream_kv's placement), in shape->dtype. */
int llst_stream_kv(llst_stream *w, uint32_t layer, int kv, uint32_t first, uint32_t n,
                   const void *src, size_t pos_stride, size_t head_stride, char *err,
                   size_t errlen);
int llst_stream_tokens(llst_stream *w, uint32_t first, uint32_t n, const int64_t *ids, char *err,
                       size_t errlen);
/* Complete: w is freed, success or not. */
int llst_stream_finish(llst_stream *w, char *err, size_t errlen);
void llst_stream_discard(llst_stream *w); /* NULL ok */

/* The most bytes one pread of a lazy cache (llst_to_cache_lazy) or one
 * pwrite of a stream moves, unless one row (or element) is larger: 4 MiB by
 * default (bytes 0). For tests, which make it small to cut every range
 * into pieces. Not thread-safe: set it before anything runs. */
void llst_set_piece(size_t bytes);

/* META entries of an FKVF archive that carry the params (docs/llamacpp.md):
 * llama.kind ("seq" | "session"), llama.n_stream, llama.stream,
 * llama.seq_id, llama.v_trans, llama.k_type, llama.v_type (ggml type ids,
 * decimal), llama.arch (session). llst_meta_set adds them to a cache's
 * metadata (kvio_cache_set_meta); llst_meta_get reads them back through
 * `get` (returns the value of a key, or NULL). Returns LLST_OK, or
 * LLST_E_FORMAT naming the entry that is missing or not a valid value. The
 * strings p->arch points to stay owned by whatever `get` returned them from. */
#define LLST_META_PREFIX "llama."
int llst_meta_set(kvio_cache *c, const llst_params *p);
int llst_meta_get(const char *(*get)(void *ctx, const char *key), void *ctx, llst_params *p,
                  const char *name, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
