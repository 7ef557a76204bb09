/*
 * fkvf.h - the one public header of libfkvf, the reference library for the
 * FKVF archive format for transformer KV caches (spec/fkvf-v1.md).
 *
 * Conventions
 *  - Every symbol has the prefix fkvf_ / FKVF_.
 *  - Functions that can fail return an int error code: FKVF_OK (0) or one of
 *    the FKVF_E_* values below. The numbers are stable across releases.
 *  - Handles are opaque. *_free() accepts NULL.
 *  - A handle carries a detailed message for its last error
 *    (fkvf_reader_message / fkvf_writer_message) naming the file, offset,
 *    field and the spec clause.
 *
 * Two tiers. Everything up to "Second tier" below is the stable API. The
 * second tier (codec, quantizer and reader internals for the library's own
 * modules, tests, benchmarks and fuzzers: the ngon geometry, the decoding-only
 * codebook load, stage centroids, stream layout) is declared only
 * when FKVF_STATIC_LINKING_ONLY is defined before this header is included;
 * it is not ABI-stable.
 */
#ifndef FKVF_H
#define FKVF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(FKVF_SHARED_BUILD)
#define FKVF_API __declspec(dllexport)
#elif defined(__GNUC__) && __GNUC__ >= 4
#define FKVF_API __attribute__((visibility("default")))
#else
#define FKVF_API
#endif

/* ---- versions --------------------------------------------------------- */

#define FKVF_VERSION_MAJOR 0
#define FKVF_VERSION_MINOR 4
#define FKVF_VERSION_PATCH 0
#define FKVF_VERSION_NUMBER \
    (FKVF_VERSION_MAJOR * 10000 + FKVF_VERSION_MINOR * 100 + FKVF_VERSION_PATCH)
#define FKVF_VERSION_STRING "0.4.0"

/* Version of the file format this library reads and writes (spec 1.2). Its
 * writers put in a file the lowest minor version that defines every feature
 * bit the file declares (spec 1.3.1): 2 with FKVF_OPTFEAT_ENCODER_METRIC, else
 * 1 with FKVF_FEAT_LAYER_STAGES, else 0 (such files are 1.0 files, byte for
 * byte what a 1.0 writer makes). */
#define FKVF_FORMAT_MAJOR 1
#define FKVF_FORMAT_MINOR 2
/* The minor version a file with these feature words is written with. */
#define FKVF_FORMAT_MINOR_FOR(required_features, optional_features) \
    (((optional_features) & FKVF_OPTFEAT_ENCODER_METRIC)  ? 2       \
     : ((required_features) & FKVF_FEAT_LAYER_STAGES) ? 1 \
                                                      : 0)

FKVF_API unsigned fkvf_version_number(void);     /* == FKVF_VERSION_NUMBER */
FKVF_API const char *fkvf_version_string(void);  /* == FKVF_VERSION_STRING */

/* ---- errors ----------------------------------------------------------- */
/* Groups: 1..19 caller/environment, 20..49 invalid input file, 50..59 encoding. */
enum {
    FKVF_OK = 0,
    /* caller / environment */
    FKVF_E_INVALID_ARG = 1,  /* bad argument (NULL, out of range, inconsistent) */
    FKVF_E_STATE = 2,        /* handle in the wrong state, or not a handle of this kind */
    FKVF_E_NOMEM = 3,        /* allocation failed */
    FKVF_E_IO = 4,           /* operating-system I/O error */
    FKVF_E_RANGE = 5,        /* position, index or stream out of range */
    FKVF_E_NOT_FOUND = 6,    /* no such section, stream, key, file */
    FKVF_E_UNSUPPORTED = 7,  /* valid request this build cannot do */
    FKVF_E_EXISTS = 8,       /* the output file exists and was not to be replaced
                              * (fkvf_writer_options.no_replace, fkvf_appender_create) */
    /* invalid input file (format) */
    FKVF_E_BAD_MAGIC = 20,   /* not an FKVF file (spec 3.1) */
    FKVF_E_VERSION = 21,     /* format major version not supported (spec 3.1, 17) */
    FKVF_E_FEATURE = 22,     /* unknown required feature bit (spec 3.1) */
    FKVF_E_BYTE_ORDER = 23,  /* byte-order check failed (spec 3.1) */
    FKVF_E_TRUNCATED = 24,   /* file or structure ends early (spec 7.2) */
    FKVF_E_CHECKSUM = 25,    /* an XXH3 checksum does not match */
    FKVF_E_ALIGN = 26,       /* structure not at a multiple of 64 (spec 4.1) */
    FKVF_E_BOUNDS = 27,      /* section outside the file or its commit region (spec 4.5) */
    FKVF_E_OVERLAP = 28,     /* sections overlap or are out of order (spec 4.5) */
    FKVF_E_PADDING = 29,     /* padding or unused bits not zero (spec 4.1, 11.7) */
    FKVF_E_SECTION = 30,     /* unknown required section type (spec 4.3) */
    FKVF_E_CORRUPT = 31,     /* a field holds an invalid value */
    FKVF_E_DUP_KEY = 32,     /* duplicate metadata key (spec 9.2) */
    FKVF_E_SYMBOL = 33,      /* symbol out of its alphabet */
    FKVF_E_SPAN = 34,        /* ngon span does not decode back to its anchor (spec 12.2) */
    FKVF_E_TORN = 35,        /* torn tail after the last valid commit (strict open, spec 7.2) */
    FKVF_E_LIMIT = 36,       /* a limit of spec 15 is exceeded */
    FKVF_E_CODEBOOK = 37,    /* codebook missing or content hash mismatch (spec 13) */
    FKVF_E_DEFLATE = 38,     /* deflate stream invalid or wrong length (spec 4.4) */
    FKVF_E_CHAIN = 39,       /* commit chain broken (spec 7.1) */
    /* encoding */
    FKVF_E_CODEC = 50        /* the writer refused data the codec cannot store exactly */
};

enum {
    FKVF_ERRCLASS_OK = 0,
    FKVF_ERRCLASS_USAGE = 1,   /* caller or environment */
    FKVF_ERRCLASS_FORMAT = 2,  /* the input is not a valid FKVF file */
    FKVF_ERRCLASS_ENCODE = 3   /* the data cannot be encoded as asked */
};

FKVF_API const char *fkvf_strerror(int code);   /* one-line description; never NULL */
FKVF_API const char *fkvf_error_name(int code); /* "FKVF_E_CHECKSUM"; never NULL */
FKVF_API int fkvf_error_class(int code);        /* FKVF_ERRCLASS_* */

/* The last error of a handle as fields, for programs that report errors in
 * their own format (JSON, a log record) instead of parsing the message:
 * fkvf_reader_error, fkvf_writer_error, fkvf_appender_error and
 * fkvf_search_error fill one. The message (the text of the handle's
 * *_message function) names the field that is wrong; offset and clause are
 * the ones it cites, as numbers and text. */
#define FKVF_ERROR_NO_OFFSET UINT64_MAX

typedef struct fkvf_error_info {
    int code;            /* FKVF_E_* of the last error; FKVF_OK: none (the rest
                          * then says nothing: no offset, no clause, "" message) */
    uint64_t offset;     /* file offset of the faulty structure or field, or
                          * FKVF_ERROR_NO_OFFSET when there is none (environment
                          * errors, errors about the arguments) */
    const char *clause;  /* spec clause the error cites, e.g. "11.4" (no "spec"
                          * or section sign), or NULL when it cites none */
    const char *file;    /* the file the handle reads or writes, "<memory>" for a
                          * buffer, "<sink>" for a writer sink, "search" for a
                          * search handle */
    const char *message; /* the handle's message, "" when there is no error;
                          * never NULL */
    const char *field;   /* the field the message names first, e.g.
                          * "header.magic" or "trailer.prev_trailer" (the text
                          * of the message before its colon), or NULL when it
                          * names none (FKVF_E_IO and FKVF_E_NOMEM never do;
                          * an argument error may name the option, such as
                          * "options.sync") */
} fkvf_error_info;

/* ---- allocator hook ---------------------------------------------------- */
/* All memory a handle owns comes from its allocator (NULL = malloc family).
 * alloc may return NULL (reported as FKVF_E_NOMEM). */
typedef struct fkvf_allocator {
    void *(*alloc)(void *opaque, size_t size);
    void *(*realloc)(void *opaque, void *ptr, size_t size);
    void (*free)(void *opaque, void *ptr);
    void *opaque;
} fkvf_allocator;

/* ---- threads ------------------------------------------------------------ */
/* The threading model (docs/library.md, "Threads"). A handle is used by one
 * thread at a time unless its functions say otherwise. The heavy operations
 * can also use threads of their own, which a call starts and joins before it
 * returns (nothing runs in the background between calls):
 *   encoding  fkvf_rvq_encode (fkvf_rvq_set_threads); the appender's commit
 *             (fkvf_append_options.n_threads)
 *   decoding  fkvf_rvq_decode (fkvf_rvq_set_threads); fkvf_reader_restore
 *             and fkvf_reader_read of every head (keys, values or both) of
 *             64 or more archived positions (fkvf_reader_set_threads)
 *   training  fkvf_rvq_train (fkvf_rvq_params.n_threads)
 *   checking  fkvf_reader_verify (fkvf_reader_set_threads)
 *   indexing  fkvf_archive_compact's rebuild of the search indexes
 *             (fkvf_compact_options.n_threads)
 * Everything else (opening, other random access, search, building one
 * search index, the writer) runs on the calling thread.
 * A count of 0 or 1, the default everywhere, does the work on the calling
 * thread and starts no thread; FKVF_THREADS_ALL takes fkvf_cpu_count();
 * any other count that many (at most 256: more are taken as 256). Every
 * result is bit-identical for every thread count: the work is cut into
 * pieces (ranges of positions, stage tables, pieces of a check, streams)
 * whose results do not depend on which thread computes them or when; an
 * error is that of the first piece in order that fails, with its message. With more than one thread
 * a handle's allocator is called from several threads at once (it must be
 * thread-safe; the default malloc family is), and so is training's progress
 * callback (one call at a time, done still counting up by one). A thread
 * that cannot be started leaves its share to the others. */
#define FKVF_THREADS_ALL 0xFFFFFFFFu

/* The number of CPUs this process may run on (sched_getaffinity; 1 when it
 * cannot be known), at most 256: what FKVF_THREADS_ALL uses. No allocation;
 * thread-safe. */
FKVF_API unsigned fkvf_cpu_count(void);

/* ---- shared types ----------------------------------------------------- */

typedef enum fkvf_dtype {
    FKVF_DTYPE_F16 = 1,
    FKVF_DTYPE_BF16 = 2,
    FKVF_DTYPE_F32 = 3
} fkvf_dtype;

typedef enum fkvf_profile {
    FKVF_PROFILE_QUAD = 1,
    FKVF_PROFILE_NGON = 2
} fkvf_profile;

/* Header feature bits (spec 3). */
#define FKVF_FEAT_NGON              (UINT64_C(1) << 0)
#define FKVF_FEAT_DEFLATE           (UINT64_C(1) << 1)
#define FKVF_FEAT_EXTERNAL_CODEBOOK (UINT64_C(1) << 2)
/* format 1.1: a codebook with stage counts per layer (spec 3.4, 13.1) */
#define FKVF_FEAT_LAYER_STAGES      (UINT64_C(1) << 3)
#define FKVF_FEATURES_KNOWN         (UINT64_C(15))
#define FKVF_OPTFEAT_TOKEN_STREAM   (UINT64_C(1) << 0)
/* format 1.2: the file holds a CMET section, the codebook's encoder metric
 * (spec 3.4, 13.8) */
#define FKVF_OPTFEAT_ENCODER_METRIC (UINT64_C(1) << 1)
#define FKVF_OPTFEATURES_KNOWN      (UINT64_C(3))

/* Section types (spec 4.3): FourCC, first character in the lowest byte. */
#define FKVF_FOURCC(a, b, c, d) \
    ((uint32_t)(uint8_t)(a) | ((uint32_t)(uint8_t)(b) << 8) | \
     ((uint32_t)(uint8_t)(c) << 16) | ((uint32_t)(uint8_t)(d) << 24))
#define FKVF_SECTION_DESC FKVF_FOURCC('D', 'E', 'S', 'C')
#define FKVF_SECTION_META FKVF_FOURCC('M', 'E', 'T', 'A')
#define FKVF_SECTION_VTXS FKVF_FOURCC('V', 'T', 'X', 'S')
#define FKVF_SECTION_CBK1 FKVF_FOURCC('C', 'B', 'K', '1')
#define FKVF_SECTION_CBRF FKVF_FOURCC('C', 'B', 'R', 'F')
#define FKVF_SECTION_EXAC FKVF_FOURCC('E', 'X', 'A', 'C')
#define FKVF_SECTION_STRM FKVF_FOURCC('S', 'T', 'R', 'M')
#define FKVF_SECTION_DIRC FKVF_FOURCC('D', 'I', 'R', 'C')
/* format 1.2, optional: the codebook's encoder metric (spec 13.8) */
#define FKVF_SECTION_CMET FKVF_FOURCC('C', 'M', 'E', 'T')

#define FKVF_SECTION_REQUIRED 1u
#define FKVF_SECTION_DEFLATE 2u

/* Stream ids (spec 11.1). */
#define FKVF_STREAM_KIND_INDEX 0u
#define FKVF_STREAM_KIND_TOKENS 1u
#define FKVF_STREAM_ID(kind, layer, head, kv, stage)                              \
    (((uint64_t)(kind) << 56) | ((uint64_t)(stage) << 40) | ((uint64_t)(kv) << 32) | \
     ((uint64_t)(head) << 16) | (uint64_t)(layer))
#define FKVF_STREAM_ID_TOKENS FKVF_STREAM_ID(FKVF_STREAM_KIND_TOKENS, 0, 0, 0, 0)
/* Stream groups: the key of a STRM section (spec 11.2). */
#define FKVF_STREAM_GROUP_INDEX 0u
#define FKVF_STREAM_GROUP_TOKENS 1u

/* Cache descriptor (spec 8). Strings are NUL-terminated UTF-8. */
typedef struct fkvf_desc {
    uint32_t n_layers, n_kv_heads, key_dim, value_dim;
    fkvf_dtype dtype;
    uint8_t key_transform;  /* 0 none, 1 rope */
    uint8_t rope_layout;    /* 0 none, 1 interleaved, 2 half-split */
    uint8_t key_storage;    /* 0 as cached, 1 archived before rotation */
    uint32_t rope_dims;
    double rope_theta;
    uint32_t n_sinks, window;
    const char *model_id;      /* may be NULL (= "") */
    const char *tokenizer_id;  /* may be NULL (= "") */
    uint8_t weights_hash_kind; /* 0 none, 1 SHA-256, 2 XXH3-128 */
    uint8_t weights_hash[32];
} fkvf_desc;

/* Metadata (spec 9). */
typedef enum fkvf_meta_type {
    FKVF_META_U64 = 1,
    FKVF_META_I64 = 2,
    FKVF_META_F64 = 3,
    FKVF_META_BOOL = 4,
    FKVF_META_UTF8 = 5,
    FKVF_META_BYTES = 6
} fkvf_meta_type;

typedef struct fkvf_meta_entry {
    const char *key;          /* not NUL-terminated: key_len bytes */
    size_t key_len;
    fkvf_meta_type type;
    const void *value;        /* raw value bytes (little-endian for numbers) */
    size_t value_len;
    uint64_t u64;             /* decoded value for U64 / BOOL */
    int64_t i64;              /* decoded value for I64 */
    double f64;               /* decoded value for F64 */
} fkvf_meta_entry;

/* Codebook shape (spec 13.1). */
typedef struct fkvf_codebook_shape {
    uint32_t n_layers, n_heads; /* n_heads = 1 when pooled */
    uint32_t key_dim, value_dim;
    uint32_t k;                 /* centroids per stage: power of two, 16..4096 */
    uint8_t k_stages, v_stages; /* 0..16 each; with layer_stages, their maxima */
    fkvf_dtype dtype;           /* F16 or F32 */
    uint8_t pooled;             /* 0 per (layer, head), 1 per layer */
    /* Stage counts per layer (format 1.1, spec 13.1 layer table, feature
     * LAYER_STAGES): NULL when every layer has k_stages key and v_stages
     * value stages; else 2 * n_layers bytes, the pairs (key stages, value
     * stages) of layers 0, 1, ..., each 0..16, whose maxima must be k_stages
     * and v_stages. Borrowed: a shape the library fills (fkvf_rvq_shape,
     * fkvf_reader_codebook) points into memory of the handle it came from,
     * valid while that handle lives; a shape the caller passes is read
     * during the call only. A table whose pairs are all equal is the uniform
     * shape (the library writes and keeps it without a table). A caller that
     * fills a shape field by field must set this member too (NULL): zero the
     * whole struct first. (Added in 0.2.0, which changed the size of this
     * struct and of fkvf_rvq_params: the soname changed with it.) */
    const uint8_t *layer_stages;
} fkvf_codebook_shape;

/* Key and value stage counts of layer l of a shape (the layer table's pair,
 * or k_stages and v_stages without one); l must be < shape->n_layers. Pure. */
static inline unsigned fkvf_layer_k_stages(const fkvf_codebook_shape *shape, uint32_t l)
{
    return shape->layer_stages ? shape->layer_stages[2 * (size_t)l] : shape->k_stages;
}
static inline unsigned fkvf_layer_v_stages(const fkvf_codebook_shape *shape, uint32_t l)
{
    return shape->layer_stages ? shape->layer_stages[2 * (size_t)l + 1] : shape->v_stages;
}

/* Bytes of the CBK1 section of a shape (64-byte header + tables); 0 if the
 * shape is invalid or overflows. */
FKVF_API uint64_t fkvf_codebook_size(const fkvf_codebook_shape *shape);
/* Where the tables start in the CBK1 contents of a shape: 64, or 64 plus the
 * padded layer table (spec 13.1) when the shape has one; the tables that
 * fkvf_writer_add_codebooks and fkvf_rvq_from_tables take are the
 * fkvf_codebook_size - fkvf_codebook_tables_offset bytes from there. 0 if
 * the shape is invalid. Pure. */
FKVF_API uint64_t fkvf_codebook_tables_offset(const fkvf_codebook_shape *shape);
/* The automatic k of a codebook for n_rows cache rows (the rule of
 * docs/codebooks.md, "automatic k", which fkvf pack, fkvf append --create and
 * the Python binding all use): the largest power of two from
 * FKVF_AUTO_K_MIN to FKVF_AUTO_K_MAX whose codebook (shape with that k:
 * fkvf_codebook_size) takes at most 1/FKVF_AUTO_K_FRACTION of the fp16 bytes
 * of the rows (n_rows * n_layers * n_kv_heads * (key_dim + value_dim) * 2;
 * n_kv_heads is the cache's, also for a pooled shape), with
 * k * FKVF_AUTO_K_ROWS_PER_K <= n_rows. 0 when even FKVF_AUTO_K_MIN breaks
 * the rule, or shape is NULL or invalid. shape->k is ignored. Pure: no
 * allocation, thread-safe. */
#define FKVF_AUTO_K_MIN 16u
#define FKVF_AUTO_K_MAX 256u
#define FKVF_AUTO_K_FRACTION 4u
#define FKVF_AUTO_K_ROWS_PER_K 4u
FKVF_API uint32_t fkvf_codebook_auto_k(const fkvf_codebook_shape *shape, uint32_t n_kv_heads,
                                       uint64_t n_rows);
/* Whether an embedded codebook pays for itself on n_rows archived rows of
 * row_bytes bytes each (the rule fkvf pack and the Python binding apply when
 * fkvf_codebook_auto_k gives 0 and the smallest k is all that is left;
 * docs/codebooks.md): 1 when fkvf_codebook_size(shape) plus the bytes of the
 * rows' indices, n_rows * fkvf_index_stream_count(shape, n_kv_heads) *
 * fkvf_quad_bits_for(k - 1) / 8 (in double), are fewer than n_rows *
 * row_bytes; 0 when not (every position is better stored exact), or shape is
 * NULL or invalid. n_kv_heads is the cache's, also for a pooled shape.
 * *index_bytes (when not NULL): those index bytes (0 for an invalid shape).
 * Pure: no allocation, thread-safe. */
FKVF_API int fkvf_codebook_pays(const fkvf_codebook_shape *shape, uint32_t n_kv_heads,
                                uint64_t n_rows, uint64_t row_bytes, double *index_bytes);
/* Content hash (spec 13.3): XXH3-128, canonical bytes, of CBK1 contents. */
FKVF_API void fkvf_codebook_hash(const void *cbk1, size_t size, uint8_t out[16]);

/* For a uniform codebook (no layer table; with one:
 * fkvf_index_stream_id_shape below), the stream id (FKVF_STREAM_ID, kind
 * FKVF_STREAM_KIND_INDEX) of index stream j in the canonical order of spec
 * 11.2, which is also the code order of
 * fkvf_rvq_codes_per_position, the reader's stream indices and the codes of
 * fkvf_writer_add_index_segment: j = (layer * n_kv_heads + head) *
 * (k_stages + v_stages) + (keys ? stage : k_stages + stage). UINT64_MAX when
 * j is not below n_layers * n_kv_heads * (k_stages + v_stages), or the shape
 * cannot be an archive's (a zero count, n_layers or n_kv_heads above 65536,
 * a stage count above 16). Pure: no allocation, no I/O, thread-safe. */
FKVF_API uint64_t fkvf_index_stream_id(uint32_t n_layers, uint32_t n_kv_heads, unsigned k_stages,
                                       unsigned v_stages, uint64_t j);
/* The same for any codebook shape, with or without a layer table (spec
 * 11.2: j = P(l) + head * m(l) + (keys ? stage : ks(l) + stage), P(l) =
 * n_kv_heads * (m(0) + ... + m(l-1)), m(l) = ks(l) + vs(l)); n_kv_heads is
 * the archive's (also for a pooled shape). UINT64_MAX when j is not below
 * fkvf_index_stream_count, or the shape is not one fkvf_codebook_size
 * accepts, or n_kv_heads is 0 or above 1024. O(n_layers). Pure. */
FKVF_API uint64_t fkvf_index_stream_id_shape(const fkvf_codebook_shape *shape,
                                             uint32_t n_kv_heads, uint64_t j);
/* The number of index streams of an archive of n_kv_heads heads with a
 * codebook of this shape, P(n_layers) of spec 11.2 (n_layers * n_kv_heads *
 * (k_stages + v_stages) without a layer table); 0 for an invalid shape or
 * n_kv_heads. Pure. */
FKVF_API uint64_t fkvf_index_stream_count(const fkvf_codebook_shape *shape, uint32_t n_kv_heads);
/* The canonical index j (spec 11.2) of the index stream (layer, head, kv,
 * stage), the inverse of fkvf_index_stream_id_shape; UINT64_MAX when there is
 * no such stream (a stage at or above the layer's count, a layer or head out
 * of range) or the shape or n_kv_heads is invalid. O(n_layers). Pure. */
FKVF_API uint64_t fkvf_index_stream_ord(const fkvf_codebook_shape *shape, uint32_t n_kv_heads,
                                        uint32_t layer, uint32_t head, unsigned kv,
                                        unsigned stage);

/* ---- reader ------------------------------------------------------------ */

typedef struct fkvf_reader fkvf_reader;

/* open flags */
#define FKVF_OPEN_STRICT 1u  /* a torn tail is an error (FKVF_E_TORN) instead of a warning */
/* fkvf_reader_open_file: read the file into memory the reader owns instead
 * of mapping it. Costs memory and a full read at open; in exchange another
 * process that truncates or rewrites the file cannot make accesses fault
 * (SIGBUS) or change bytes after they were verified (spec 18.5). */
#define FKVF_OPEN_READ 2u

/* Open an archive held in memory. The buffer is borrowed and must outlive the
 * reader. Any alignment is accepted. On failure *out is still set when a
 * handle could be made (so fkvf_reader_message can say what is wrong), else
 * NULL; free it with fkvf_reader_free either way. */
FKVF_API int fkvf_reader_open_memory(fkvf_reader **out, const void *data, size_t size,
                                     unsigned flags, const fkvf_allocator *alloc);
/* Open a file by path (read-only mmap, owned by the reader). On failure *out
 * is still set when a handle could be made, so the message can be read; free
 * it with fkvf_reader_free. A file larger than the address space (over 4 GiB
 * on a 32-bit build) is FKVF_E_LIMIT, as it is for fkvf_reader_open_source
 * (which reserves the source's size in address space). */
FKVF_API int fkvf_reader_open_file(fkvf_reader **out, const char *path, unsigned flags,
                                   const fkvf_allocator *alloc);
/* A random-access source of a file's bytes for fkvf_reader_open_source: an
 * object store or HTTP server read with range requests, a file of another
 * process, anything with a size and a pread. The library does no I/O of its
 * own on a source: it calls read. */
typedef struct fkvf_source {
    /* Read exactly n (> 0) bytes at offset off (off + n <= size) into buf.
     * Return FKVF_OK, or FKVF_E_NOMEM, or any other code when the bytes
     * cannot be had; the reader then fails the call that needed them with
     * FKVF_E_NOMEM or FKVF_E_IO (never a format error: the file is not at
     * fault) and keeps nothing of the attempt (a later call asks again).
     * Called from the thread that calls into the reader, never
     * concurrently for one reader. */
    int (*read)(void *opaque, uint64_t off, void *buf, size_t n);
    void *opaque;  /* passed to read; the caller's, must outlive the reader */
    uint64_t size; /* the file's size in bytes */
} fkvf_source;

/* Open an archive (or codebook file) whose bytes come from src: only the
 * bytes the calls need are read, in units of unit bytes (a power of two,
 * 512..2^24; 0 = 4096) aligned to unit, adjacent missing units of one need
 * in one read call. Opening reads the header, the trailer(s), the
 * directories and the sections spec 7.5 loads at open (DESC, the codebook
 * section, segment headers and block tables, EXAC sections); a random read
 * then reads the blocks of the index streams it touches; verify reads
 * everything. Checksums are verified as for a file, so bytes that changed
 * in the source between two reads are detected (FKVF_E_CHECKSUM), never
 * served. What was read is kept in memory the reader owns (address space
 * for size bytes is reserved at open, memory is used as units are read):
 * the file's structures until fkvf_reader_free, the data of index and token
 * blocks in a block cache of FKVF_SOURCE_CACHE_DEFAULT bytes
 * (fkvf_reader_set_source_cache; units of at least the page size, else
 * everything is kept). name (may be NULL) is
 * used in messages and returned by fkvf_reader_file_name. flags:
 * FKVF_OPEN_STRICT only. Errors as fkvf_reader_open_memory, plus
 * FKVF_E_IO or FKVF_E_NOMEM from the source and FKVF_E_LIMIT (size larger
 * than the address space). On failure *out is still set when a handle could
 * be made. */
FKVF_API int fkvf_reader_open_source(fkvf_reader **out, const fkvf_source *src, uint32_t unit,
                                     const char *name, unsigned flags,
                                     const fkvf_allocator *alloc);
/* What a reader opened with fkvf_reader_open_source read so far: bytes
 * and read calls (both 0 for other readers). FKVF_E_INVALID_ARG for NULL
 * pointers, FKVF_E_STATE for a handle that is not a reader. No I/O. */
FKVF_API int fkvf_reader_source_stats(const fkvf_reader *r, uint64_t *bytes, uint64_t *reads);
/* The block cache of a source reader's default budget: 64 MiB. */
#define FKVF_SOURCE_CACHE_DEFAULT ((uint64_t)64 << 20)
/* Set the most bytes of index and token block data a reader opened with
 * fkvf_reader_open_source keeps between calls (0: keep everything read,
 * as a reader of a file). Blocks are queued as they are verified; at the
 * start of a read, restore, stream read or search call, between the
 * stream reads of a restore and between the blocks verify checks, the
 * oldest are dropped while the total exceeds max_bytes (their memory
 * released, their bytes read and verified again when next needed), so one
 * call holds at most what one of its steps needs beyond the budget. The
 * file's structures (header, directories, section headers and block
 * tables, whole sections read by section: codebook, metadata, search
 * index, and every section fkvf_reader_verify checksums whole, which
 * is all of them) are never dropped. FKVF_E_UNSUPPORTED for a nonzero
 * max_bytes when the reader's unit is smaller than the page size,
 * FKVF_E_STATE for a handle that is not an open reader; a no-op (FKVF_OK)
 * for readers of files and memory. No I/O. */
FKVF_API int fkvf_reader_set_source_cache(fkvf_reader *r, uint64_t max_bytes);
/* A source reader's block cache: the bytes of block data it holds now
 * (counted per block) and the bytes it dropped so far (both 0 for other
 * readers). FKVF_E_INVALID_ARG for NULL pointers, FKVF_E_STATE for a
 * handle that is not a reader. No I/O. */
FKVF_API int fkvf_reader_source_cache(const fkvf_reader *r, uint64_t *cached, uint64_t *dropped);
/* Free r and everything it owns (its mapping or copy of the file, views,
 * decoded codebook, messages); r NULL or not a reader is a no-op. A codebook
 * file attached to r (fkvf_reader_attach_codebook / _find_codebook) is the
 * caller's: free it after r. Not concurrently with another call on r. */
FKVF_API void fkvf_reader_free(fkvf_reader *r);
/* The message of r's last error, "" when the last call succeeded; never
 * NULL ("not a reader handle" for NULL or another handle). Owned by r:
 * valid until the next call on r that can fail, or fkvf_reader_free. No
 * allocation; thread-safety as every call on r. */
FKVF_API const char *fkvf_reader_message(const fkvf_reader *r);
/* Let go of the memory r holds for bytes it can read again: the pages of a
 * mapped file (fkvf_reader_open_file without FKVF_OPEN_READ) leave the
 * process's resident set (Linux: madvise MADV_DONTNEED; the bytes stay in
 * the page cache, every view stays valid, and touching one maps its page
 * again). For a long pass over a large archive (restoring it a chunk at a
 * time, copying it), between chunks, so that the resident set stays the
 * size of a chunk; the library's own passes that only check bytes (the
 * EXAC sections at open, fkvf_reader_verify) do it for what they checked.
 * A reader of memory, of a source or of a read copy: nothing happens.
 * FKVF_OK, FKVF_E_STATE (not a usable reader). No allocation, no I/O.
 * Thread-safety: as every call on r. */
FKVF_API int fkvf_reader_trim(fkvf_reader *r);
/* The path r was opened from (fkvf_reader_open_file, or the file that
 * fkvf_reader_find_codebook found), as given, NUL-terminated and owned by
 * r: valid until fkvf_reader_free. NULL for a reader of memory
 * (fkvf_reader_open_memory) and for anything that is not a reader handle.
 * No allocation, no I/O; it does not change r's message. Thread-safety: as
 * every call on r. */
FKVF_API const char *fkvf_reader_file_name(const fkvf_reader *r);
/* The last error of r as fields (fkvf_error_info above); works on the handle
 * a failed open leaves. The strings belong to r: valid until the next call
 * on r that can fail (it clears or replaces the error) or fkvf_reader_free.
 * No allocation, no I/O. Returns FKVF_OK, FKVF_E_INVALID_ARG (out NULL) or
 * FKVF_E_STATE (r is not a reader handle; *out is then zeroed with code
 * FKVF_E_STATE). Thread-safety: as every call on r, not concurrently with
 * another call on the same handle. */
FKVF_API int fkvf_reader_error(const fkvf_reader *r, fkvf_error_info *out);

typedef struct fkvf_archive_info {
    uint16_t format_major, format_minor;
    uint64_t required_features, optional_features;
    uint64_t file_size;       /* bytes in the file or buffer */
    uint64_t committed_size;  /* end of the trusted trailer */
    uint64_t torn_bytes;      /* bytes after it (0 in a clean file) */
    uint64_t n_commits;
    uint64_t n_positions, n_archived;
    size_t n_sections;        /* sections in the effective directory */
    size_t n_streams;
    int has_desc;             /* 0 for a codebook file */
} fkvf_archive_info;

/* What the open found (header, trusted commit, sizes, counts) into *out.
 * No allocation, no I/O (the values were read at open). FKVF_E_STATE (not a
 * reader, or its open failed), FKVF_E_INVALID_ARG (out NULL). Thread-safety:
 * as every call on r. */
FKVF_API int fkvf_reader_info(const fkvf_reader *r, fkvf_archive_info *out);

typedef struct fkvf_section_info {
    uint32_t type, flags;
    uint64_t offset, stored_size, size, key, checksum;
    uint64_t commit_seq;
} fkvf_section_info;

/* Sections of all trusted commits, in file order. */
FKVF_API int fkvf_reader_section(const fkvf_reader *r, size_t index, fkvf_section_info *out);
/* Zero-copy view of a section's bytes (inflated into a buffer the reader owns
 * when the section is deflated). Verifies its checksum on first touch. */
FKVF_API int fkvf_reader_section_data(fkvf_reader *r, size_t index, const void **data,
                                      size_t *size);

FKVF_API int fkvf_reader_desc(fkvf_reader *r, fkvf_desc *out); /* strings owned by r */
/* Metadata (spec 9). fkvf_reader_meta_count: the entries of the META section
 * (0 without one). fkvf_reader_meta: entry index (0 .. count-1, file order;
 * FKVF_E_RANGE beyond). fkvf_reader_meta_find: the entry whose key is the
 * NUL-terminated key (FKVF_E_NOT_FOUND when none). The first call verifies
 * META (its checksum and layout: the format errors with r's message) and
 * may inflate it into a buffer r owns. The entry's key and
 * value point into r's memory: valid until fkvf_reader_free. FKVF_E_STATE
 * (not a usable reader), FKVF_E_INVALID_ARG (NULL). One thread at a time
 * per reader. */
FKVF_API int fkvf_reader_meta_count(fkvf_reader *r, size_t *count);
FKVF_API int fkvf_reader_meta(fkvf_reader *r, size_t index, fkvf_meta_entry *out);
FKVF_API int fkvf_reader_meta_find(fkvf_reader *r, const char *key, fkvf_meta_entry *out);

/* fkvf_stream_info.id of an index stream whose name is not known (above) */
#define FKVF_STREAM_ID_UNNAMED UINT64_MAX
typedef struct fkvf_stream_info {
    uint64_t id;
    fkvf_profile profile;
    unsigned symbol_bits;     /* quad */
    uint32_t alphabet;        /* ngon N; quad 2^bits (0 when bits == 32) */
    uint32_t span_symbols;    /* ngon L; quad: symbols per 128-bit span, rounded down */
    double r;                 /* ngon */
    uint32_t align;           /* segments start at multiples of this (spec 11.6) */
    uint64_t length;          /* symbols in the effective stream */
    size_t n_segments;        /* segments of its group (spec 11.2) */
    uint64_t stored_bytes;    /* data bytes of this stream in those segments */
} fkvf_stream_info;

/* Streams (spec 11): indices 0 .. count-1, the index streams in code order
 * (fkvf_rvq_codes_per_position) then the token stream. fkvf_reader_stream_count:
 * their number. fkvf_reader_stream_info: stream index's codec and sizes
 * (FKVF_E_RANGE beyond count). fkvf_reader_stream_find: the index of the
 * stream with id (FKVF_STREAM_ID; FKVF_E_NOT_FOUND when the archive has
 * none). An archive with per-layer stage counts (FKVF_FEAT_LAYER_STAGES)
 * names its index streams by its codebook's layer table (spec 11.2): with an
 * external codebook not attached, fkvf_reader_stream_info gives an index
 * stream the id FKVF_STREAM_ID_UNNAMED and fkvf_reader_stream_find of an
 * index stream id is FKVF_E_CODEBOOK (reading a stream's symbols by its
 * index needs no name). No
 * allocation, no I/O. FKVF_E_STATE (not a usable reader), FKVF_E_INVALID_ARG
 * (NULL). Thread-safety: as every call on r. */
FKVF_API int fkvf_reader_stream_count(const fkvf_reader *r, size_t *count);
FKVF_API int fkvf_reader_stream_info(const fkvf_reader *r, size_t index, fkvf_stream_info *out);
FKVF_API int fkvf_reader_stream_find(const fkvf_reader *r, uint64_t id, size_t *index);
typedef struct fkvf_stream_spec fkvf_stream_spec; /* below, with the writer */
/* The codec of a stream as a writer takes it (fkvf_writer_add_index_segment,
 * ..._token_segment): what continuing or copying the stream needs. */
FKVF_API int fkvf_reader_stream_spec(const fkvf_reader *r, size_t index, fkvf_stream_spec *out);
/* One symbol, O(1): touches (and on first touch verifies) one block. */
FKVF_API int fkvf_reader_stream_get(fkvf_reader *r, size_t index, uint64_t t, uint32_t *symbol);
/* Symbols [first, first+count). */
FKVF_API int fkvf_reader_stream_read(fkvf_reader *r, size_t index, uint64_t first,
                                     uint32_t *out, size_t count);
/* CGR point of position t (spec 12): quad fills x, y (64-bit fixed point);
 * ngon fills fx, fy. */
typedef struct fkvf_point {
    uint64_t x, y;
    double fx, fy;
} fkvf_point;
/* The point of position t (0 .. length-1) of stream index into *out:
 * decodes the symbols of t's block (quad) or span (ngon), verifying the
 * blocks it touches on first touch (their format errors with r's message).
 * FKVF_E_RANGE (index or t out of range), FKVF_E_STATE, FKVF_E_INVALID_ARG
 * (out NULL). One thread at a time per reader. */
FKVF_API int fkvf_reader_stream_point(fkvf_reader *r, size_t index, uint64_t t,
                                      fkvf_point *out);

/* Exact rows (spec 14): a zero-copy view of the row of an exact position. */
FKVF_API int fkvf_reader_exact_row(fkvf_reader *r, uint64_t position, const void **row,
                                   size_t *row_bytes);
/* *is_exact = 1 when position (0 .. n_positions-1) is stored exactly (a sink
 * or in the recent window, spec 14), 0 when archived. No allocation, no I/O.
 * FKVF_E_RANGE (position out of range, or a codebook file), FKVF_E_STATE,
 * FKVF_E_INVALID_ARG (is_exact NULL). Thread-safety: as every call on r. */
FKVF_API int fkvf_reader_is_exact(const fkvf_reader *r, uint64_t position, int *is_exact);

/* The archive's codebook (spec 13): shape, the CBK1 contents (header
 * included, zero-copy) and its content hash. For an archive that refers to
 * an external codebook, available after fkvf_reader_attach_codebook; before
 * that FKVF_E_CODEBOOK. FKVF_E_NOT_FOUND when the archive has no codebook. */
FKVF_API int fkvf_reader_codebook(fkvf_reader *r, fkvf_codebook_shape *shape,
                                  const void **contents, size_t *size, uint8_t hash[16]);
/* The external reference (spec 13.5): 1 in *is_external and the expected
 * hash and name hint (NUL-terminated, owned by r); 0 when embedded or none. */
FKVF_API int fkvf_reader_codebook_ref(const fkvf_reader *r, int *is_external, uint8_t hash[16],
                                      const char **name);
/* Resolve an external codebook with an opened codebook file (borrowed: it
 * must outlive r). FKVF_E_CODEBOOK, naming the expected hash, when it is not
 * a codebook file, its hash differs, or its shape does not match. */
FKVF_API int fkvf_reader_attach_codebook(fkvf_reader *r, fkvf_reader *codebook_file);
typedef struct fkvf_rvq_metric fkvf_rvq_metric; /* the quantizer's, below */
/* The codebook's encoder metric (spec 13.8): the CMET of the file that holds
 * the CBK1 (r, or the codebook file attached to r), checked as the clause
 * says (its header, its match with the codebook, every matrix: the format
 * class of the first failure), converted to binary32 arrays owned by that
 * reader (valid while it is open), in the layout fkvf_rvq_set_metric takes;
 * a part the section does not hold is NULL. For an attached codebook file
 * this is a call on its reader too (the metric is loaded there on first
 * use): not while that reader is used by another thread.
 * FKVF_E_NOT_FOUND when the codebook has none (or the archive has no
 * codebook); FKVF_E_CODEBOOK for an external codebook not attached. One
 * thread at a time per reader. */
FKVF_API int fkvf_reader_metric(fkvf_reader *r, fkvf_rvq_metric *out);
/* How a cache's keys are handled (spec 8.1), as given by a caller and as a
 * codebook file's training fixes them (fkvf_codebook_key_settings). */
typedef struct fkvf_key_settings {
    uint8_t pre_rope; /* 1 keys archived before rotation, 0 as cached */
    uint8_t no_rope;  /* 1 the cache's keys carry no rotation */
    uint8_t layout;   /* RoPE pairs: 1 interleaved, 2 half-split */
    uint32_t dims;    /* rotated dims, 0 = key_dim */
    double theta;     /* RoPE base */
    /* 1: given by the caller (kept, and checked against the codebook) */
    uint8_t keys_set, theta_set, dims_set, layout_set;
    uint8_t layout_taken; /* out: 1 when layout was taken from the codebook */
} fkvf_key_settings;
/* A given setting that contradicts a codebook's training. */
typedef struct fkvf_key_clash {
    const char *setting;       /* "keys", "rope_theta", "rope_dims", "rope_layout";
                                * NULL: none */
    char trained[32], given[32]; /* the values as text ("as-is", "500000", "4",
                                  * "half-split", ...) */
} fkvf_key_clash;
/* The key settings *k against the training of codebook_file (a reader of a
 * codebook file or an archive): the rule of fkvf pack --codebooks, fkvf
 * append --create --codebooks and the Python binding's fkvf.pack(codebooks=),
 * docs/codebooks.md. A codebook file records how its keys were handled in
 * train.* metadata (fkvf train, fkvf.train): train.keys (UTF-8 "pre-rope" or
 * "as-is"), train.rope_theta (f64, finite, > 0), train.rope_dims (u64, even,
 * 2..key_dim) and train.rope_layout (UTF-8 "interleaved" or "half-split"); an
 * entry that is missing or of another type or value is ignored. A setting
 * the caller did not give (its *_set 0) is taken from the entry; a given one
 * that differs is a clash (the codebook's centroids are keys handled the
 * other way): keys unless no_rope; theta, dims (0 counts as key_dim) and
 * layout only when, keys settled, they are archived un-rotated (pre_rope and
 * not no_rope). The first clash in that order fills *clash; the settings not
 * given are taken all the same. Returns FKVF_OK (clash->setting NULL),
 * FKVF_E_CODEBOOK (a clash), FKVF_E_INVALID_ARG (an argument NULL). No
 * allocation; touches only the metadata. */
FKVF_API int fkvf_codebook_key_settings(fkvf_reader *codebook_file, uint32_t key_dim,
                                        fkvf_key_settings *k, fkvf_key_clash *clash);

/* Entries of one directory that fkvf_reader_find_codebook looks at, at most. */
#define FKVF_CODEBOOK_SCAN_MAX 10000

/* Find the external codebook of r by its content hash (spec 13.5) and attach
 * it (as fkvf_reader_attach_codebook does). Not a format rule: one way of
 * obtaining the file that 13.5 leaves to readers.
 *
 * Where, in this order, each directory once (one met again, same device and
 * inode, is skipped):
 *   1. the directory of the path r was opened with (fkvf_reader_open_file;
 *      "." for a path without '/'; none for fkvf_reader_open_memory and
 *      fkvf_reader_open_source);
 *   2. each directory of search_path: a colon-separated list, searched left
 *      to right; empty entries are skipped; NULL or "" = none. Relative
 *      directories are relative to the working directory.
 * The library reads no environment variable; the fkvf CLI passes
 * FKVF_CODEBOOK_PATH as search_path.
 * In each directory: first the file named by the CBRF name hint, if the
 * hint is a plain file name (not empty, no '/', not "." or "..", no NUL
 * byte: it is untrusted, spec 18.7; it never names anything outside the
 * directory), then the other entries in directory order, at most
 * FKVF_CODEBOOK_SCAN_MAX entries. A candidate must be a regular file (a
 * symbolic link is not followed, a device or FIFO not opened), between 64
 * bytes and the largest codebook file the descriptor allows (k 4096, 16 key
 * and 16 value stages, f32 tables, per head, plus 16 MiB), and start with the
 * FKVF magic; it is then opened (mapped: only its directory is parsed) and,
 * if it is a codebook file (spec 13.4) whose shape fits the descriptor, its
 * CBK1 is hashed and compared. Anything else is skipped, as are missing or
 * unreadable directories. The first match is attached.
 *
 * codebook_file: on FKVF_OK, the reader of the codebook file found, opened
 * with r's allocator and open flags; the caller owns it and r borrows it,
 * so free it after r (as for fkvf_reader_attach_codebook). NULL when r
 * refers to no external codebook or has one attached already (FKVF_OK: there
 * is nothing to find).
 * Errors: FKVF_E_NOT_FOUND when no file matches (the message names the
 * expected hash, the name hint and every directory searched, with what was
 * wrong with one: missing, unreadable, only its first entries looked at);
 * FKVF_E_CODEBOOK when the file whose hash matches does not fit the archive
 * (the errors of fkvf_reader_attach_codebook: the archive is inconsistent
 * with its codebook); FKVF_E_IO when nothing matches and a candidate or
 * directory could not be read for a reason other than its absence or
 * permissions (EIO, EMFILE, ...: the message names it);
 * FKVF_E_NOMEM; FKVF_E_INVALID_ARG (codebook_file NULL); FKVF_E_STATE (not
 * a reader, or one whose open failed). On an error r is unchanged.
 * Thread-safety: like every call on r, one thread at a time per handle; the
 * directories are read while it runs (another process may change them: every
 * candidate is checked through the file descriptor it was opened with). */
FKVF_API int fkvf_reader_find_codebook(fkvf_reader *r, const char *search_path,
                                       fkvf_reader **codebook_file);

/* Bytes of one restored row (spec 14.2 layout) in `dtype`. */
FKVF_API int fkvf_reader_row_bytes(const fkvf_reader *r, fkvf_dtype dtype, size_t *row_bytes);
/* fkvf_reader_restore is fkvf_reader_read with every layer, head and part in
 * FKVF_LAYOUT_ROWS (bit-identical results), kept as its own call for the
 * whole-cache path: it decodes archived positions in batches through the
 * quantizer's vector kernels (fkvf_rvq_decode_to), as fkvf_reader_read does
 * for a selection of every head (keys, values or both) of at least 64
 * archived positions; a smaller selection is summed centroid by centroid.
 *
 * Restore positions [first, first+count): per position, per layer the keys of
 * heads 0..H-1 then the values (spec 14.2), converted to `dtype`. Exact
 * positions keep their bits (dtype = the descriptor's); archived positions
 * are reconstructed from the codebook (spec 13.6), keys rotated back to
 * their position when they were archived before rotation. Archived
 * positions need the codebook: attach an external one first (else
 * FKVF_E_CODEBOOK). An index symbol >= k is FKVF_E_SYMBOL.
 * out_size >= count * fkvf_reader_row_bytes(dtype). */
FKVF_API int fkvf_reader_restore(fkvf_reader *r, uint64_t first, uint64_t count, fkvf_dtype dtype,
                                 void *out, size_t out_size);
/* Threads of fkvf_reader_restore and fkvf_reader_verify (the threading
 * model near the top of this header; a new reader has 1). Restore decodes
 * archived positions with them: each batch of positions is cut into one
 * range per thread; the restored bytes are bit-identical for every count,
 * and reading the streams, the exact rows and everything else stays on the
 * calling thread. Verify checks pieces of its steps on them, each step's
 * pieces in parallel, the steps in order: section checksums (a section a
 * piece), a stream segment's blocks (64 a piece), then its streams' padding
 * bits and symbols (16 streams a piece), the codebook's centroids (1 MiB a
 * piece), the search indexes (a section a piece); its result (code, message,
 * offset) is the first error in that order, the one the one-thread pass
 * finds, for every count. A reader opened with fkvf_reader_open_source
 * verifies on the calling thread (its reads fill the reader's state). With
 * more than one thread the reader's allocator is called from several
 * threads. FKVF_E_STATE when r is not a usable reader. No allocation. One
 * thread at a time per reader. */
FKVF_API int fkvf_reader_set_threads(fkvf_reader *r, unsigned n_threads);

/* ---- random access (spec 11.5, 13.6, 14) ---- */
/* Parts of a read request. */
#define FKVF_PART_KEYS 1u
#define FKVF_PART_VALUES 2u

typedef enum fkvf_layout {
    /* per position, per selected layer: the keys of the selected heads, then
     * their values (the row order of spec 14.2 restricted to the selection) */
    FKVF_LAYOUT_ROWS = 0,
    /* per selected layer: keys [head][position][key_dim], then values
     * [head][position][value_dim] (what an engine loads into a layer's cache) */
    FKVF_LAYOUT_HEADS = 1
} fkvf_layout;

/* Positions [first, first+count), layers [layer_first, +layer_count), heads
 * [head_first, +head_count) of every selected layer; a count of 0 for layers
 * or heads selects all from the first one. parts: FKVF_PART_* (0 = both). */
typedef struct fkvf_read_request {
    uint64_t first, count;
    uint32_t layer_first, layer_count;
    uint32_t head_first, head_count;
    unsigned parts;
    fkvf_dtype dtype;
    fkvf_layout layout;
} fkvf_read_request;

/* Bytes fkvf_reader_read writes for req (the same argument checks;
 * FKVF_E_LIMIT when they do not fit in a size_t). */
FKVF_API int fkvf_reader_read_size(const fkvf_reader *r, const fkvf_read_request *req,
                                   size_t *size);
/* Read a selection of the cache. Every element is bit-identical to the same
 * element of fkvf_reader_restore's output: exact positions are the EXAC bytes
 * (converted to dtype), archived ones are reconstructed as spec 13.6 (keys
 * rotated to their position when archived before RoPE). Touches only what
 * the selection needs: one symbol per selected index stream and position
 * (verifying, on first touch, only the stream blocks those bytes are in) and
 * the rows of the selected exact positions. A selection of every head
 * (any layers, keys, values or both, either layout) with 64 or more archived
 * positions is decoded as fkvf_reader_restore decodes: in batches, straight into the
 * layout, on the threads of fkvf_reader_set_threads (what `fkvf unpack`
 * reads, a group of layers at a time); a read of a few positions of
 * every layer, head and part reads the codes of the 16-position blocks
 * around them once and keeps them (at most 16 MiB a reader: see
 * fkvf_reader_set_row_cache). Archived positions need the
 * codebook, built on first use as for restore. Uses a small scratch from
 * the reader's allocator per call; like every reader call that verifies
 * blocks, not for concurrent use of one handle. Errors: FKVF_E_INVALID_ARG
 * (NULL, bad parts / dtype / layout, out_size below fkvf_reader_read_size:
 * the message names the size), FKVF_E_RANGE (positions, layers or heads
 * outside the archive), FKVF_E_CODEBOOK, FKVF_E_NOMEM (the scratch, or
 * what the reader keeps for random access: the message says which), and the
 * format errors of the bytes touched (FKVF_E_CHECKSUM, FKVF_E_SYMBOL, ...)
 * with the reader's message; after an error the contents of out are
 * unspecified. */
FKVF_API int fkvf_reader_read(fkvf_reader *r, const fkvf_read_request *req, void *out,
                              size_t out_size);

/* Full verification (spec 1.3.3): every checksum, padding byte and gap,
 * every stream block and span, every stored index symbol below k (also in
 * parts later segments cut away), the finiteness of every codebook element,
 * the search indexes, every rule the reader can check on the served
 * commit; then FKVF_E_TORN for a torn tail. The codebook checks need the
 * codebook: embedded, or an external one attached before the call
 * (fkvf_reader_attach_codebook; a fault of an attached one is
 * FKVF_E_CODEBOOK); without it they are skipped. Earlier commits' states
 * are not re-derived (spec 7.3). Returns the first error; the message names
 * it. Runs on the threads of fkvf_reader_set_threads (1 by default: the
 * calling thread), with the same result for every count. Not for
 * concurrent use of one handle. */
FKVF_API int fkvf_reader_verify(fkvf_reader *r);

/* ---- validation: a file against every rule of the spec ------------------ */

/* fkvf_validate_memory / fkvf_validate_file check a file against the spec
 * and report EVERY violation they find (not only the first) through a
 * callback, each with its spec clause and error class. Without flags they
 * check what full verification checks (spec 1.3.3); FKVF_VALIDATE_STRICT
 * adds the writer-side rules a reader may be lenient about (reserved
 * optional feature bits, "fkvf." metadata keys, finite codebook values,
 * zero bytes of an unused rope_theta, every earlier commit a valid state on
 * its own, spec 7.3). spec/requirements.md lists every requirement and the
 * check that covers it. Work and memory are bounded by the file size. */
#define FKVF_VALIDATE_STRICT 1u
#define FKVF_VALIDATE_NO_OFFSET UINT64_MAX

typedef struct fkvf_violation {
    int code;              /* error class of spec 16 (FKVF_E_CORRUPT, ...) */
    const char *clause;    /* spec clause, e.g. "4.1" */
    const char *check;     /* check id (spec/requirements.md), e.g. "LAYOUT-PAD" */
    int writer_rule;       /* 1: a writer-side rule, checked with FKVF_VALIDATE_STRICT */
    uint64_t offset;       /* file offset, or FKVF_VALIDATE_NO_OFFSET */
    long section;          /* directory entry (fkvf_reader_section order), or -1 */
    uint32_t section_type; /* its FKVF_SECTION_* type, or 0 */
    const char *message;   /* what is wrong (field, values) */
} fkvf_violation;

/* Called once per violation; the pointers are valid during the call only.
 * Return non-zero to stop validating. */
typedef int (*fkvf_violation_fn)(void *opaque, const fkvf_violation *v);

typedef struct fkvf_validate_options {
    unsigned flags;                /* FKVF_VALIDATE_* */
    size_t max_violations;         /* stop after this many; 0 = 1000 */
    fkvf_reader *codebook;         /* the codebook file of an archive with a CBRF, or NULL */
    const fkvf_allocator *alloc;   /* NULL = malloc */
} fkvf_validate_options;

typedef struct fkvf_validate_result {
    size_t violations;  /* reported */
    int capped;         /* stopped at max_violations (or by the callback) */
} fkvf_validate_result;

/* FKVF_OK when the validation ran (whatever it found: see res); an
 * environment code (FKVF_E_NOMEM, FKVF_E_IO, FKVF_E_INVALID_ARG) otherwise.
 * opt, fn and res may be NULL. */
FKVF_API int fkvf_validate_memory(const void *data, size_t size,
                                  const fkvf_validate_options *opt, fkvf_violation_fn fn,
                                  void *opaque, fkvf_validate_result *res);
/* The same for the file at path, mapped read-only for the call. FKVF_E_IO
 * when it cannot be opened or mapped or is not a regular file; FKVF_E_LIMIT
 * when it is larger than the address space (over 4 GiB on a 32-bit build:
 * validate it on a 64-bit one). Both are
 * reentrant: no state outside their arguments. */
FKVF_API int fkvf_validate_file(const char *path, const fkvf_validate_options *opt,
                                fkvf_violation_fn fn, void *opaque, fkvf_validate_result *res);

/* ---- writer ------------------------------------------------------------ */

typedef struct fkvf_writer fkvf_writer;

/* Where a writer's bytes go. write() returns the number of bytes written
 * (short counts are retried), or -1 with errno set.
 *
 * Why two I/O types, fkvf_sink here and fkvf_io (appender): a sink IS the
 * destination of a streaming writer: there is no file, the library never
 * seeks, truncates, locks or renames, and sync (optional) flushes whatever
 * the sink is. fkvf_io wraps the writes and syncs the appender makes on a
 * file the library itself opened, locked and cuts back after a failed
 * commit: its hooks get that file descriptor, meaningless for a sink. One
 * type would give a sink an fd it does not have, or take the fd from the
 * appender's hooks that need it. */
typedef struct fkvf_sink {
    long long (*write)(void *opaque, const void *data, size_t size);
    int (*sync)(void *opaque);  /* may be NULL */
    void *opaque;
} fkvf_sink;

/* Durability, one option for the writer (fkvf_writer_options.sync), the
 * appender (fkvf_append_options.sync) and fkvf_archive_append_sections:
 * FKVF_SYNC_COMMIT (0, the default) syncs the data before each commit's
 * trailer and the trailer after it (spec 7.6), so a commit is durable when
 * the call that makes it returns; FKVF_SYNC_NONE syncs nothing (a system
 * crash may lose commits; a process crash loses nothing written; the file
 * never opens at a partial commit). Other values are FKVF_E_INVALID_ARG. */
#define FKVF_SYNC_COMMIT 0u
#define FKVF_SYNC_NONE 1u

typedef struct fkvf_writer_options {
    uint64_t required_features;  /* FKVF_FEAT_*: features the file may use */
    uint64_t optional_features;
    uint32_t block_size;         /* stream block size, 0 = 4096 */
    int deflate_level;           /* for sections added with FKVF_SECTION_DEFLATE, 0 = 6 */
    unsigned sync;               /* FKVF_SYNC_COMMIT (default) or FKVF_SYNC_NONE
                                  * (tests, scratch files): durability, as the
                                  * appender's option of the same name */
    int no_replace;              /* 1 (file writers): never replace an existing
                                  * PATH: fkvf_writer_create_file fails with
                                  * FKVF_E_EXISTS if it exists, and so does
                                  * fkvf_writer_finish if it appeared meanwhile
                                  * (the temporary file is then removed, PATH is
                                  * untouched). 0 (default): PATH is replaced. */
    unsigned mode;               /* file writers: the permission bits of the new
                                  * file. 0 (default): 0666 less the process's
                                  * umask, as open(2) and fopen give; else these
                                  * bits exactly (& 07777; e.g. the mode of the
                                  * file a compaction replaces). */
} fkvf_writer_options;

/* The defaults: every field 0 (no features, block size 4096, deflate level
 * 6, FKVF_SYNC_COMMIT, replace PATH, mode from the umask). opts NULL is a
 * no-op. */
FKVF_API void fkvf_writer_options_init(fkvf_writer_options *opts);

/* Create a file atomically: bytes go to "PATH.tmp-XXXXXX" (a new file,
 * O_EXCL, with the permissions of opts.mode), finish() fsyncs
 * and renames it over PATH (with no_replace: links it to PATH, which fails
 * if PATH exists, then removes the temporary name; on a file system without
 * hard links it checks that PATH does not exist, then renames); free()
 * before finish() removes it. As with the
 * reader, on failure *out is set when a handle exists (read its message,
 * then free it). After an I/O or allocation failure during writing the
 * writer refuses further calls with the same error. */
FKVF_API int fkvf_writer_create_file(fkvf_writer **out, const char *path,
                                     const fkvf_writer_options *opts,
                                     const fkvf_allocator *alloc);
/* Stream to a sink (never seeks). */
FKVF_API int fkvf_writer_create_sink(fkvf_writer **out, const fkvf_sink *sink,
                                     const fkvf_writer_options *opts,
                                     const fkvf_allocator *alloc);
/* Free w. A file writer that did not finish removes its temporary file (PATH
 * is untouched); a sink writer just stops. NULL or not a writer: no-op. */
FKVF_API void fkvf_writer_free(fkvf_writer *w);
/* The message of w's last error, "" after a success; never NULL ("not a
 * writer handle"). Owned by w: valid until the next call on w or
 * fkvf_writer_free. One thread at a time per handle. */
FKVF_API const char *fkvf_writer_message(const fkvf_writer *w);
/* The last error of w as fields (fkvf_error_info); works on the handle a
 * failed create leaves. Strings owned by w, valid until the next call on w
 * or fkvf_writer_free. No allocation, no I/O. FKVF_OK, FKVF_E_INVALID_ARG
 * (out NULL) or FKVF_E_STATE (not a writer handle). One handle, one thread
 * at a time. */
FKVF_API int fkvf_writer_error(const fkvf_writer *w, fkvf_error_info *out);

/* The cache descriptor (spec 8), once, in commit 1, before the streams and
 * exact rows; desc and its strings are copied. FKVF_E_INVALID_ARG for a
 * descriptor that breaks spec 8 or does not match codebooks added already
 * (the message names the field), FKVF_E_STATE when set already or after
 * the first commit. Without it the writer writes a codebook file. */
FKVF_API int fkvf_writer_set_desc(fkvf_writer *w, const fkvf_desc *desc);
/* Metadata entries (spec 9): fkvf_writer_meta_u64, fkvf_writer_meta_i64,
 * fkvf_writer_meta_f64, fkvf_writer_meta_bool (v != 0), fkvf_writer_meta_utf8
 * (NUL-terminated UTF-8) and fkvf_writer_meta_bytes (n bytes) add key (1..255
 * bytes of UTF-8, NUL-terminated, not in the reserved "fkvf." namespace) with
 * a value of that type; key and value are copied. Written in commit 1's META
 * section. FKVF_E_DUP_KEY (key set already), FKVF_E_INVALID_ARG (bad key or
 * UTF-8), FKVF_E_LIMIT (spec 15: value size, entry count), FKVF_E_NOMEM,
 * FKVF_E_STATE. One thread at a time per writer. */
FKVF_API int fkvf_writer_meta_u64(fkvf_writer *w, const char *key, uint64_t v);
FKVF_API int fkvf_writer_meta_i64(fkvf_writer *w, const char *key, int64_t v);
FKVF_API int fkvf_writer_meta_f64(fkvf_writer *w, const char *key, double v);
FKVF_API int fkvf_writer_meta_bool(fkvf_writer *w, const char *key, int v);
FKVF_API int fkvf_writer_meta_utf8(fkvf_writer *w, const char *key, const char *v);
FKVF_API int fkvf_writer_meta_bytes(fkvf_writer *w, const char *key, const void *v, size_t n);

/* Exact rows for positions [first, first+count), layout of spec 14. */
FKVF_API int fkvf_writer_add_exact(fkvf_writer *w, uint64_t first, uint64_t count,
                                   const void *rows, size_t size, unsigned section_flags);

/* Codec of a stream group (spec 11.2, 12). */
typedef struct fkvf_stream_spec {
    fkvf_profile profile;
    unsigned symbol_bits;   /* quad: even 2..32 */
    uint32_t alphabet;      /* ngon: 2..65536 */
    double r;               /* ngon: 0 = r_N */
    uint32_t span_symbols;  /* ngon: 0 = L_max(r) */
} fkvf_stream_spec;

/* Segment alignment unit of a codec (spec 11.6): quad 128 / gcd(bits, 128)
 * (16 for 8-bit symbols), ngon the span length L; 0 for an invalid spec. */
FKVF_API uint32_t fkvf_stream_spec_align(const fkvf_stream_spec *spec);

/* The smallest quad symbol width (even, 2..32, spec 12.1) whose alphabet
 * holds the symbols 0..max_symbol: what a stream of codebook indices
 * (max_symbol = k - 1) or of token ids (the largest id) needs. 0 when
 * max_symbol is above 2^32 - 1 (no quad width holds it). Pure: no
 * allocation, no I/O, thread-safe. */
FKVF_API unsigned fkvf_quad_bits_for(uint64_t max_symbol);

/* A segment of every index stream (spec 11.2): symbols [first, first+count)
 * of each (layer, head, K|V, stage) stream, in one STRM section. Needs the
 * descriptor and the codebook (its stage counts and k) first. The symbol of
 * position i (0 <= i < count, stream symbol first + i) and index stream j
 * (the code order of fkvf_rvq_codes_per_position) is
 * codes[i * pos_stride + j * code_stride]. first must be a multiple of
 * fkvf_stream_spec_align and at most the streams' current length; the
 * streams are cut at first, then extended (spec 11.6). */
FKVF_API int fkvf_writer_add_index_segment(fkvf_writer *w, const fkvf_stream_spec *spec,
                                           uint64_t first, uint64_t count, const uint16_t *codes,
                                           size_t pos_stride, size_t code_stride);
/* A segment of the token stream: token ids of positions [first, first+count). */
FKVF_API int fkvf_writer_add_token_segment(fkvf_writer *w, const fkvf_stream_spec *spec,
                                           uint64_t first, const uint32_t *tokens,
                                           size_t count);

/* Embedded codebooks (spec 13): `tables` holds the centroid tables in the
 * order of spec 13.2 (size = fkvf_codebook_size - fkvf_codebook_tables_offset;
 * a layer table is written from shape->layer_stages, dropped when every layer
 * has the same counts, and needs FKVF_FEAT_LAYER_STAGES). Must come before the
 * index streams, which are checked against k. A writer without a descriptor
 * writes a codebook file (spec 13.4). */
FKVF_API int fkvf_writer_add_codebooks(fkvf_writer *w, const fkvf_codebook_shape *shape,
                                       const void *tables, size_t size, unsigned section_flags);
/* Refer to an external codebook file by content hash (needs
 * FKVF_FEAT_EXTERNAL_CODEBOOK); the shape is that codebook's. */
FKVF_API int fkvf_writer_add_codebook_ref(fkvf_writer *w, const fkvf_codebook_shape *shape,
                                          const uint8_t hash[16], const char *name);

/* The codebook's encoder metric (spec 13.8): a CMET section bound to the
 * CBK1 this writer added (fkvf_writer_add_codebooks, in this or an earlier
 * commit of this writer), with the matrices of m (fkvf_rvq_metric, for that
 * codebook's shape; fkvf_rvq_get_metric gives a handle's). Set
 * FKVF_OPTFEAT_ENCODER_METRIC in the options to declare it (spec 3.4). The
 * section holds each matrix's symmetric part. section_flags: 0 or
 * FKVF_SECTION_DEFLATE. Errors: FKVF_E_STATE (no embedded codebook in this
 * writer, or a metric added already), FKVF_E_INVALID_ARG (a matrix
 * fkvf_metric_matrix_check refuses, both parts NULL, a dimension above
 * 1024), FKVF_E_NOMEM. */
FKVF_API int fkvf_writer_add_metric(fkvf_writer *w, const fkvf_rvq_metric *m,
                                    unsigned section_flags);

/* Any section (for extensions and tests); flags FKVF_SECTION_*. Its bytes are
 * written as given, unchecked: a CMET this way is not an encoder metric the
 * writer knows of (use fkvf_writer_add_metric, which checks it). */
FKVF_API int fkvf_writer_add_section(fkvf_writer *w, uint32_t type, uint32_t flags, uint64_t key,
                                     const void *data, size_t size);

/* Positions recorded in the commit record (spec 5.1). */
FKVF_API int fkvf_writer_set_positions(fkvf_writer *w, uint64_t n_positions,
                                       uint64_t n_archived);

/* End the current commit (spec 7.6): the directory and the trailer, with a
 * sync of the sections and directory before the trailer and of the trailer
 * after it (unless sync is FKVF_SYNC_NONE). The writer stays open: what is added next goes
 * into the next commit, which starts from the positions, streams and exact
 * rows of this one. A file writer's commits become visible under the final
 * path at finish. */
FKVF_API int fkvf_writer_commit(fkvf_writer *w);

/* Commit what was added since the last commit (if anything was, or if no
 * commit was made yet), sync, and (file writers) rename into place. */
FKVF_API int fkvf_writer_finish(fkvf_writer *w);

/* ---- appender (spec 7.4-7.7, 14.3) ------------------------------------ */
/* Grows an archive one commit at a time, as an inference engine grows its
 * cache: append the rows (and token ids) of new positions, then commit. A
 * commit writes only new data: exact rows of the new positions that stay in
 * the recent window, the indices of positions that left it (quantized with
 * the archive's codebook, spec 13.6), a token-stream segment, a directory
 * and a trailer chained to the previous one. Its cost does not depend on the
 * archive's size, and its memory not on its number of positions: the rows
 * of a large commit are written as they are appended (fkvf_appender_append),
 * the commit's directory and trailer last. After a crash the file opens at
 * the last complete commit.
 *
 * Durability: with FKVF_SYNC_COMMIT (the default) a commit is durable when
 * fkvf_appender_commit returns (fdatasync before and after its trailer, spec
 * 7.6). With FKVF_SYNC_NONE nothing is synced: commits are complete in the
 * file but may be lost by a system crash until fkvf_appender_sync returns;
 * a process crash loses nothing committed. Either way a crash never leaves a
 * file that opens at a partial commit. */
typedef struct fkvf_appender fkvf_appender;
typedef struct fkvf_rvq fkvf_rvq; /* the quantizer, below */
/* The options' sync is FKVF_SYNC_COMMIT or FKVF_SYNC_NONE, as the writer's. */

/* File I/O of an appender, replaceable for fault injection (tests, or a
 * caller's own accounting). NULL members use write(2) and fdatasync(2).
 * write returns the bytes written (a short count is retried), or -1 with
 * errno set; sync returns 0 or -1 with errno set. */
typedef struct fkvf_io {
    long long (*write)(void *opaque, int fd, const void *data, size_t size);
    int (*sync)(void *opaque, int fd);
    void *opaque;
} fkvf_io;

typedef struct fkvf_append_options {
    unsigned sync;              /* FKVF_SYNC_COMMIT or FKVF_SYNC_NONE */
    unsigned beam_width;        /* RVQ encoding of archived positions (0, 1: greedy) */
    uint32_t block_size;        /* of new stream segments, 0 = 4096 */
    fkvf_reader *codebook_file; /* for an archive that refers to an external
                                 * codebook (borrowed during open only) */
    int recover;                /* 1: truncate a torn tail (spec 7.7) instead of
                                 * failing with FKVF_E_TORN */
    const fkvf_io *io;          /* NULL: plain system calls */
    double compact_ratio;       /* automatic compaction (docs/appending.md): after a
                                 * commit that leaves the file larger than
                                 * compact_ratio x its live bytes (the appender's
                                 * estimate of its compacted size), the file is
                                 * rewritten as its compaction and renamed over
                                 * the path. 0: FKVF_APPEND_COMPACT_RATIO; else
                                 * > 1 and <= 1e6 (else FKVF_E_INVALID_ARG) */
    int no_auto_compact;        /* 1: never compact automatically */
    unsigned n_threads;         /* threads a commit encodes the positions leaving
                                 * the window with (the threading model near the
                                 * top of this header): 0 or 1 the calling
                                 * thread; the file's bytes are the same for
                                 * every count. (Added in 0.4.0.) */
} fkvf_append_options;

/* The default compact_ratio: the file stays within about 1.4x its compacted
 * size after every commit, and each compaction's rewrite is paid for by
 * 0.4x the live bytes of growth (about 2.5 bytes rewritten per appended). */
#define FKVF_APPEND_COMPACT_RATIO 1.4

/* The defaults: every field 0 (FKVF_SYNC_COMMIT, greedy encoding, block size
 * 4096, no codebook file, no recovery, plain system calls, automatic
 * compaction at FKVF_APPEND_COMPACT_RATIO). NULL: no-op. */
FKVF_API void fkvf_append_options_init(fkvf_append_options *opts);

/* A new archive for appending. */
typedef struct fkvf_append_create {
    const fkvf_desc *desc;        /* window = W recent exact positions, n_sinks = S */
    const fkvf_rvq *codebook;     /* embedded; NULL with no codebook_ref: every
                                   * position stays exact */
    fkvf_reader *codebook_ref;    /* or: refer to this codebook file by hash */
    const char *codebook_name;    /* name hint stored with the reference */
    fkvf_stream_spec index_codec; /* profile 0: quad, smallest width for k */
    fkvf_stream_spec token_codec; /* profile 0: no token stream */
} fkvf_append_create;

/* Create PATH (atomically: commit 1 holds the descriptor, the codebook and
 * empty stream groups) and open it for appending. Never replaces a file:
 * FKVF_E_EXISTS if PATH exists, or if it appears before commit 1 is in
 * place (the writer's no_replace). */
FKVF_API int fkvf_appender_create(fkvf_appender **out, const char *path,
                                  const fkvf_append_create *create,
                                  const fkvf_append_options *opts, const fkvf_allocator *alloc);
/* Open an existing archive for appending. A torn tail is FKVF_E_TORN unless
 * opts->recover. The file is locked exclusively (flock) while the handle
 * lives: FKVF_E_IO when another appender holds it. The file locked is the
 * one PATH names once locked: a file renamed over PATH between the open and
 * the lock (a compaction in place, or another appender's automatic one) is
 * opened and locked instead of the one it replaced. Once locked, the
 * temporary file an automatic compaction of this file left behind (a crash:
 * PATH.autocompact next to the file its links resolve to, a name reserved
 * for it) is removed, best effort. FKVF_E_INVALID_ARG: opts->compact_ratio out of
 * range. */
FKVF_API int fkvf_appender_open(fkvf_appender **out, const char *path,
                                const fkvf_append_options *opts, const fkvf_allocator *alloc);
/* Queue n_rows new positions: rows in the descriptor's dtype and the layout
 * of spec 14.2 (size = n_rows * row bytes, copied: the caller's buffer is
 * free again on return); tokens: n_rows token ids when the archive has a
 * token stream, else NULL. They become part of the file at the next
 * fkvf_appender_commit.
 *
 * Memory stays bounded whatever is queued: the appender holds the rows of
 * the recent window and at most FKVF_APPEND_QUEUE_DEFAULT (64 MiB) of rows
 * more (fkvf_appender_set_queue_bytes, second tier), plus 4 bytes per
 * queued position for token ids. When the queue is full, the queued
 * positions whose place is decided are written past the committed end as
 * sections of the commit to come: the exact rows of new sinks (in an
 * archive without a codebook, of every position), and the indices of the
 * positions that leave the window whatever is appended next (index
 * segments, spec 11.6); their rows are dropped. Those bytes belong to no
 * commit until fkvf_appender_commit writes the directory and trailer after
 * them: a reader meanwhile serves the last commit and reports them as a
 * torn tail (spec 7.2), and a crash leaves them as one (fkvf_archive_recover
 * cuts it off). The sections and index segments of a commit, and so its
 * bytes, depend on the positions queued since the last commit and on the
 * queue's bound only (not on how the rows were split between calls, nor
 * on n_threads); a commit whose positions never filled the queue is
 * written as before this bound existed (0.4.0: one index segment, one EXAC
 * section per run of exact positions).
 *
 * Errors: FKVF_E_INVALID_ARG, FKVF_E_LIMIT (nothing queued; the handle stays
 * usable); FKVF_E_NOMEM when the queue cannot grow for the call's first
 * rows (nothing queued, usable); any other failure (a write, memory,
 * encoding), like a failed commit: the file is cut back to the previous
 * commit, so that it opens clean, and the handle fails (every later call
 * returns the error; reopen to continue). */
FKVF_API int fkvf_appender_append(fkvf_appender *a, const void *rows, size_t size, size_t n_rows,
                                  const uint32_t *tokens);
/* Write the queued positions as one commit: what fkvf_appender_append has
 * not written yet, then the directory and the trailer. On any failure (I/O,
 * memory, a limit, ...) the file is cut back to the previous commit, so
 * that it opens clean, and the handle fails: every later call returns the
 * error (reopen to continue). (A failed encoding of positions of a commit
 * that has written nothing yet, the file untouched, leaves the handle
 * usable.)
 *
 * Automatic compaction (unless opts.no_auto_compact; docs/appending.md):
 * after the commit, when the file's committed bytes exceed compact_ratio x
 * its live bytes, the archive is rewritten as fkvf_archive_compact would
 * (nothing re-encoded) into PATH.autocompact in the file's directory
 * (symbolic links resolved), through opts.io, synced whatever opts.sync,
 * locked, and renamed over the path; the directory is synced and the handle
 * continues the new file (its own descriptor and lock, commit_seq restarts
 * at 1 as for a reopened compacted file). Readers holding the old file keep
 * reading it. A failure before the rename (no space, I/O, memory) removes
 * the temporary file and leaves the path and the handle as after the
 * commit: the call returns FKVF_OK, fkvf_appender_message and
 * fkvf_appender_error describe the failed compaction ("auto-compaction:
 * ..."), the handle stays usable and the next attempt waits until the file
 * has grown by another (compact_ratio - 1) x live bytes. A failure after the
 * rename (syncing the directory) returns FKVF_E_IO and fails the handle: the
 * commit is in the file at PATH, whose rename may not be durable (reopen to
 * continue). A crash at any point leaves PATH at the last commit, as the old
 * file or the complete new one; a leftover temporary file is removed by the
 * next fkvf_appender_open of the path. */
FKVF_API int fkvf_appender_commit(fkvf_appender *a);
/* Make every commit durable (FKVF_SYNC_NONE). A failed sync fails the
 * handle: the kernel may have dropped the pages it could not write, so the
 * commits since the last successful sync are not known to be durable. */
FKVF_API int fkvf_appender_sync(fkvf_appender *a);

typedef struct fkvf_append_info {
    uint64_t n_positions;   /* committed */
    uint64_t n_archived;    /* committed */
    uint64_t pending;       /* queued, not committed (written past the committed
                             * end or not: fkvf_appender_append) */
    uint64_t commit_seq;    /* of the last commit */
    uint64_t file_size;     /* committed bytes */
    uint64_t recovered_bytes; /* torn bytes truncated at open (opts.recover) */
    int has_tokens, has_codebook;
} fkvf_append_info;
/* The appender's positions, queue and file into *out. No allocation, no
 * I/O. FKVF_E_STATE (not an appender), FKVF_E_INVALID_ARG (out NULL). One
 * thread at a time per handle. */
FKVF_API int fkvf_appender_info(const fkvf_appender *a, fkvf_append_info *out);
/* The message of a's last error, "" after a success; never NULL ("not an
 * appender handle"). Owned by a: valid until the next call on a or
 * fkvf_appender_free. A failed handle keeps its first error's message. */
FKVF_API const char *fkvf_appender_message(const fkvf_appender *a);
/* The last error of a as fields (fkvf_error_info); an error of the archive
 * or codebook file read at open keeps that file's offset and clause. Strings
 * owned by a, valid until the next call on a or fkvf_appender_free. No
 * allocation, no I/O. FKVF_OK, FKVF_E_INVALID_ARG (out NULL) or
 * FKVF_E_STATE (not an appender handle). One handle, one thread at a time. */
FKVF_API int fkvf_appender_error(const fkvf_appender *a, fkvf_error_info *out);
/* Close; queued positions that were not committed are dropped, and the
 * bytes the queue wrote past the last commit cut off (best effort: else a
 * torn tail, which readers ignore). NULL is fine. */
FKVF_API void fkvf_appender_free(fkvf_appender *a);

/* ---- operations on a whole archive file: sections, compaction, recovery ---- */
/* fkvf_archive_append_sections, fkvf_archive_compact and fkvf_archive_recover
 * each run to completion in one call. Their handle, fkvf_archive_op, only
 * carries the outcome: set through the call's out parameter whenever one
 * could be allocated (on failure too), read with fkvf_archive_op_error,
 * released with
 * fkvf_archive_op_free. out may be NULL (the error is then only the code). */
typedef struct fkvf_archive_op fkvf_archive_op;

/* The error of the call as fields (fkvf_error_info): file is the archive or
 * the file written, whichever it is about; an error of the reader or the
 * writer the call used keeps its offset and clause. code FKVF_OK and ""
 * after a call that succeeded. Strings owned by op, valid until
 * fkvf_archive_op_free. No allocation, no I/O. FKVF_OK, FKVF_E_INVALID_ARG
 * (out NULL) or FKVF_E_STATE (not such a handle; out then says so). */
FKVF_API int fkvf_archive_op_error(const fkvf_archive_op *op, fkvf_error_info *out);
/* Release the handle (NULL is fine). */
FKVF_API void fkvf_archive_op_free(fkvf_archive_op *op);

/* One commit holding the given sections, appended to an existing archive at
 * path (the archive is append-only, spec 7.4): for optional sections such as
 * ZIDX (fkvf_search_index_build). The positions, streams and exact rows
 * stay those of the last commit. The file is locked like an appender's
 * (FKVF_E_IO when an appender holds it, clause 7.4); a torn tail is
 * FKVF_E_TORN. secs: n sections, borrowed during the call; the known
 * section types are refused (FKVF_E_INVALID_ARG), as are path NULL or "",
 * secs NULL with n > 0 and a sync other than FKVF_SYNC_COMMIT /
 * FKVF_SYNC_NONE (then no handle is made). out (may be NULL): the handle of
 * the call (fkvf_archive_op), whose error names the file, offset and clause
 * (the appender's, or of the archive read at open); code FKVF_OK after a
 * success. Allocates with malloc, does file I/O; safe to call from several
 * threads on different files (the lock serializes writers of one file). */
typedef struct fkvf_section_add {
    uint32_t type, flags; /* flags FKVF_SECTION_*; the known types are refused */
    uint64_t key;
    const void *data;
    size_t size;
} fkvf_section_add;
/* (documented above, with fkvf_section_add) */
FKVF_API int fkvf_archive_append_sections(fkvf_archive_op **out, const char *path,
                                          const fkvf_section_add *secs, size_t n,
                                          unsigned sync);

/* fkvf_archive_compact rewrites an archive of any number of commits as one
 * commit without re-encoding anything: the descriptor, the codebook (an
 * embedded copy, or the same external reference), the metadata, the rows of
 * the exact positions (sinks and recent window, spec 14.3) only, the index
 * streams symbol for symbol with their codec, the token stream, and a new
 * search index (spec 20) for every stream that had one. It holds a piece at
 * a time: EXAC sections of at most 8 MiB of rows, index segments of at most
 * 32 MiB of codes (one section per run and one segment below that). Every position of
 * the result restores bit for bit as in the input; superseded exact rows,
 * stream cuts and the per-commit directories and trailers are dropped. A
 * torn tail of the input is ignored (only committed data is read). The
 * result is written like fkvf_writer_create_file's: a temporary file, synced
 * and renamed into place. */
typedef struct fkvf_compact_options {
    int in_place;        /* 1: replace src itself (dst NULL or a path of the same
                          * file). src is locked as an appender locks it
                          * (fkvf_appender_open: FKVF_E_IO while an appender
                          * has it open) until the result is renamed over it;
                          * a symbolic link is followed: the file it points to
                          * is replaced, the link stays a link to it */
    int no_replace;      /* 1 (not in place): never replace an existing dst:
                          * FKVF_E_EXISTS when it exists or appears meanwhile
                          * (fkvf_writer_options.no_replace); 0: replaced */
    unsigned mode;       /* permission bits of the new file (<= 07777). 0
                          * (default): in place the bits of the file replaced,
                          * else 0666 less the umask */
    unsigned sync;       /* FKVF_SYNC_COMMIT (default): the result is synced
                          * before its rename; FKVF_SYNC_NONE: not synced */
    fkvf_reader *codebook_file; /* the codebook file of an archive that refers to
                          * an external one (borrowed during the call only) */
    const fkvf_allocator *alloc; /* every allocation of the call, the rebuilt
                          * search indexes too; NULL: malloc */
    void (*progress)(void *opaque, uint64_t done, uint64_t total); /* NULL: none;
                          * called after each index segment copied: done of
                          * total archived positions */
    void *progress_opaque;
    unsigned n_threads;  /* threads the search indexes are rebuilt on (the
                          * threading model near the top of this header; 0 and
                          * 1: the calling thread): the streams' indexes are
                          * built a batch at a time, each on one thread with a
                          * reader of src of its own (codebook_file attached
                          * to each: see docs/library.md on sharing one), and
                          * added in order. The file is byte-identical for
                          * every count. (Added in 0.4.0.) */
} fkvf_compact_options;

/* Defaults: a new dst that may replace a file, synced, 0666 less the umask. */
FKVF_API void fkvf_compact_options_init(fkvf_compact_options *opts);

typedef struct fkvf_compact_result {
    const char *path;        /* the file written: dst, or in place src with its
                              * symbolic links resolved; owned by the handle
                              * (NULL when the call was given no handle) */
    uint64_t commits_before; /* commits of src */
    uint64_t size_before;    /* bytes of src (its torn tail included) */
    uint64_t torn_bytes;     /* torn tail of src, left out */
    uint64_t positions;      /* of the result (as of src's last commit) */
    uint64_t archived;       /* of them, stored as indices */
    uint64_t exact;          /* of them, stored as exact rows */
    uint64_t size;           /* bytes of the result */
    size_t search_indexes;   /* ZIDX sections rebuilt */
} fkvf_compact_result;

/* Compact src into dst (or src itself, opts->in_place); opts NULL: the
 * defaults. Returns FKVF_OK and fills *result (may be NULL), or an error:
 * FKVF_E_INVALID_ARG (src NULL or empty; dst NULL or empty when not in
 * place, or naming src or the codebook file; in place with a dst that is
 * another file; an option out of range), FKVF_E_IO (src cannot be opened,
 * locked or resolved; writing failed), FKVF_E_NOMEM, FKVF_E_EXISTS
 * (no_replace), FKVF_E_LIMIT (the streams do not fit in memory), an error
 * of the reader (src is not a valid archive, FKVF_E_CODEBOOK: its external
 * codebook not given or not its own) or of the writer. On failure dst (or
 * src in place) is untouched and no temporary file is left.
 * out (may be NULL): the handle of the call (fkvf_archive_op). Opens its
 * own reader and writer: any number of calls may run at once in threads on
 * different files. */
FKVF_API int fkvf_archive_compact(fkvf_archive_op **out, const char *src, const char *dst,
                                  const fkvf_compact_options *opts, fkvf_compact_result *result);

/* fkvf_archive_recover cuts off a torn tail: the bytes after the last
 * complete commit that an append left when it did not complete (a crash, a
 * full disk). The file is truncated to its committed size (spec 7.7) under
 * the appender's lock and synced; every complete commit stays, and the file
 * must then open in strict mode at the same commit. A clean file (also a
 * codebook file) is left untouched. */
typedef struct fkvf_recover_options {
    int dry_run;                 /* 1: only report (no lock, nothing written) */
    unsigned sync;               /* FKVF_SYNC_COMMIT (default): fsync after the cut;
                                  * FKVF_SYNC_NONE: none (tests, scratch files) */
    const fkvf_allocator *alloc; /* the readers' allocations; NULL: malloc */
} fkvf_recover_options;

/* Defaults: cut and sync. */
FKVF_API void fkvf_recover_options_init(fkvf_recover_options *opts);

typedef struct fkvf_recover_result {
    uint64_t file_size;      /* bytes before */
    uint64_t committed_size; /* bytes of the complete commits */
    uint64_t torn_bytes;     /* file_size - committed_size */
    uint64_t commits;        /* complete commits (the last one is served) */
    uint64_t positions;      /* of the last commit */
    int truncated;           /* 1: the tail was cut (0: clean, or dry_run) */
} fkvf_recover_result;

/* Recover path; opts NULL: the defaults. FKVF_OK and *result (may be NULL;
 * filled as far as known on failure too), or an error: FKVF_E_INVALID_ARG
 * (path NULL or empty, opts->sync not one of the FKVF_SYNC_* values),
 * FKVF_E_IO (the file cannot be opened, locked: an
 * appender has it open, clause 7.4, or truncated and synced), FKVF_E_NOMEM,
 * or the reader's error for a file that is not a valid FKVF file, before
 * the cut or after it (then the message starts "after the cut: "). out (may
 * be NULL): the handle of the call (fkvf_archive_op). Truncating a file
 * that a reader has mapped can fault that reader if it touches the bytes
 * cut (spec 18.5). */
FKVF_API int fkvf_archive_recover(fkvf_archive_op **out, const char *path,
                                  const fkvf_recover_options *opts, fkvf_recover_result *result);

/* ---- search (spec 12.1.5, 12.2.7, 20) ---------------------------------- */
/* Suffix search on any stream (the token stream or an index stream): the
 * archive is its own search index. Positions are stream indices t (symbol t
 * of the stream; for an index stream that is archived position S + t). The
 * context of t is the stream's symbols ..., c[t-1], c[t]; a query q[0..len)
 * is matched against it most recent last: q[len-1] against c[t].
 *
 * A search handle reads the stream through the public reader API (every
 * block it touches is verified on first touch, spec 11.4). Without an index
 * it keeps the stream's points (quad: the packed symbols, b/8 bytes per
 * position; ngon: the symbols and the binary64 points, 20 bytes per
 * position) and scans them. With a search index for the stream (spec 20) in
 * effect, positions [0, n_indexed) are answered from the sorted index by
 * binary search and only the positions after it are scanned. A ZPOS index
 * (4 bytes per position) holds only the sorted positions: the handle then
 * keeps the whole stream's points as without an index, the key of every
 * 32nd entry (0.5 bytes per position for quad), and computes the key of
 * each other entry it compares. A ZIDX index (1.0; 24 or 32 bytes per
 * position) is used in place, zero-copy, with the points of the scanned
 * tail only; symbols before an indexed position are decoded through the
 * reader, touching only the blocks they live in. Results are identical
 * with either index and without one. */
typedef struct fkvf_search fkvf_search;

/* Search index section types (spec 20): ZIDX (keys and positions, read for
 * files that have it, no longer written) and ZPOS (positions only, what
 * fkvf_search_index_build writes). */
#define FKVF_SECTION_ZIDX FKVF_FOURCC('Z', 'I', 'D', 'X')
#define FKVF_SECTION_ZPOS FKVF_FOURCC('Z', 'P', 'O', 'S')

/* open flags */
#define FKVF_SEARCH_NO_INDEX 1u /* ignore ZIDX and ZPOS sections: scan every position */

/* The reader is borrowed and must outlive the handle. On failure *out is set
 * when a handle exists (read its message, free it). A ZIDX section that is
 * malformed is FKVF_E_CORRUPT / FKVF_E_TRUNCATED / FKVF_E_LIMIT (spec 20.2,
 * 20.7; a ZPOS position not below n_indexed is CORRUPT at open); one that is
 * stale (spec 20.4) is ignored. */
FKVF_API int fkvf_search_open(fkvf_search **out, fkvf_reader *r, size_t stream_index,
                              unsigned flags, const fkvf_allocator *alloc);
/* Free s (not its reader). NULL or not a search handle: no-op. */
FKVF_API void fkvf_search_free(fkvf_search *s);
/* The message of s's last error, "ok" when there is none; never NULL ("not
 * a search handle"). Owned by s: valid until the next call on s or
 * fkvf_search_free. Errors of the reader while s reads keep their text
 * here too. */
FKVF_API const char *fkvf_search_message(const fkvf_search *s);
/* The last error of s as fields (fkvf_error_info; file is "search"). Strings
 * owned by s, valid until the next call on s or fkvf_search_free. No
 * allocation, no I/O. FKVF_OK, FKVF_E_INVALID_ARG (out NULL) or
 * FKVF_E_STATE (not a search handle). One handle, one thread at a time. */
FKVF_API int fkvf_search_error(const fkvf_search *s, fkvf_error_info *out);

typedef struct fkvf_search_status {
    uint64_t length;       /* positions of the stream */
    uint64_t n_indexed;    /* positions answered from the index in use; 0: no index */
    uint64_t index_section;/* its fkvf_reader_section index (when n_indexed > 0) */
    uint32_t key_symbols;  /* symbols a point determines: quad floor(128/b), ngon L */
    uint64_t candidates;   /* last query: positions whose key or point passed the filter */
    uint64_t verified;     /* last query: of those, positions whose symbols matched */
} fkvf_search_status;
/* The stream, the index in use and the last query's counts into *out. No
 * allocation, no I/O. FKVF_E_STATE (not a search handle), FKVF_E_INVALID_ARG
 * (out NULL). One thread at a time per handle. */
FKVF_API int fkvf_search_info(const fkvf_search *s, fkvf_search_status *out);

/* (a) Exact suffix query: the positions t with t >= len-1 and
 * c[t-len+1 .. t] == q[0 .. len), ascending. The first min(cap, found) go
 * to out; *n_found is the number of all of them. len >= 1 (any length: the
 * part beyond one key is checked by decoding); a query symbol outside the
 * stream's alphabet matches nothing. */
FKVF_API int fkvf_search_suffix(fkvf_search *s, const uint32_t *q, size_t len, uint64_t *out,
                                size_t cap, uint64_t *n_found);

typedef struct fkvf_match {
    uint64_t position; /* t */
    uint64_t length;   /* matched symbols: c[t-length+1 .. t] == q[len-length .. len) */
} fkvf_match;
/* (b) Longest match: the k positions whose context shares the longest
 * suffix with q (length >= 1), by length descending then position
 * ascending; *n_out <= k. */
FKVF_API int fkvf_search_longest(fkvf_search *s, const uint32_t *q, size_t len, size_t k,
                                 fkvf_match *out, size_t *n_out);

/* The query's point: quad the state after feeding q (the last floor(128/b)
 * symbols, earlier digits 0), ngon ENCODE of the last min(len, L) symbols
 * (spec 12.2.3). FKVF_E_SYMBOL for a symbol outside the alphabet. */
FKVF_API int fkvf_search_query_point(const fkvf_search *s, const uint32_t *q, size_t len,
                                     fkvf_point *out);
/* The radius that is certain to hold every position whose last len symbols
 * equal a query's, around the query point: quad sqrt(2) * 2^(-m) with m =
 * min(len, floor(128/b)) * b / 2 bits per coordinate; ngon r^m with m =
 * min(len, L), widened by 1e-6 relative and 1e-13 absolute for rounding. */
FKVF_API double fkvf_search_default_radius(const fkvf_search *s, size_t len);

typedef struct fkvf_radius_result {
    double radius;       /* radius used */
    uint64_t candidates; /* positions whose point lies within radius of the query point */
    uint64_t verified;   /* of those, positions whose last len symbols equal q */
} fkvf_radius_result;
/* (c) Radius query in the plane (the paper's form): every position whose
 * point lies within `radius` (Euclidean; quad coordinates in [0, 1), ngon
 * in the unit disc; radius <= 0: fkvf_search_default_radius) of the query
 * point is a candidate; candidates are verified by decoding their last len
 * symbols. The verified positions (ascending) go to out (first cap). With
 * the default radius the verified set equals fkvf_search_suffix's. */
FKVF_API int fkvf_search_radius(fkvf_search *s, const uint32_t *q, size_t len, double radius,
                                uint64_t *out, size_t cap, fkvf_radius_result *res);

/* Backward decode: the n symbols before and at t, c[t+1-m .. t] with
 * m = min(n, t+1), into out[0 .. m); *n_out = m. Touches only the blocks
 * (quad) or spans (ngon) holding them. */
FKVF_API int fkvf_search_context(fkvf_reader *r, size_t stream_index, uint64_t t, size_t n,
                                 uint32_t *out, size_t *n_out);

/* Prefix reuse for engines. Given a new prompt (token ids), compare it with
 * the archive's token stream:
 *   prefix_len: the longest prefix of the prompt that the archive holds at
 *     the same positions (prompt[i] == token(i) for i < prefix_len). An
 *     engine reuses the saved cache of positions [0, prefix_len) as is
 *     (restore them, spec 14.4) and computes only the rest of the prompt;
 *     the keys and values of a position depend only on the tokens at and
 *     before it, so they are exactly what the engine would compute.
 *   match_end / match_len: the longest earlier occurrence of the prompt's
 *     last tokens: token(match_end - match_len + 1 .. match_end) ==
 *     prompt[n - match_len .. n) (match_len 0: none). Its cached rows are
 *     those of a different position and context, so they are not a drop-in
 *     cache; they tell the engine where the archive saw this text before
 *     (retrieval, speculative continuation: the tokens after match_end).
 * FKVF_E_NOT_FOUND when the archive has no token stream. */
typedef struct fkvf_prefix_reuse {
    uint64_t prefix_len;
    uint64_t match_end, match_len;
    uint64_t archive_positions; /* length of the token stream */
} fkvf_prefix_reuse;
/* prompt: n token ids, borrowed during the call; *out as above. Reads the
 * token stream through r (blocks verified on first touch, errors with r's
 * message) and a search handle of its own, from the malloc family (not r's
 * allocator). FKVF_E_NOT_FOUND (no token stream), FKVF_E_INVALID_ARG
 * (NULL), FKVF_E_NOMEM, FKVF_E_STATE. One thread at a time per reader. */
FKVF_API int fkvf_search_prefix_reuse(fkvf_reader *r, const uint32_t *prompt, size_t n,
                                      fkvf_prefix_reuse *out);

/* The ZPOS index of a stream (spec 20.7; 64 + 4 bytes per position)
 * covering positions [0, n) with n = the stream's length rounded down to
 * its alignment unit: *data holds the section contents (*size bytes), *key
 * its directory key. Add it as a section of type FKVF_SECTION_ZPOS:
 * fkvf_writer_add_section(w, FKVF_SECTION_ZPOS, 0, key, data, size) or
 * fkvf_archive_append_sections. All memory, *data included, comes from
 * alloc (NULL = malloc family); the caller owns *data: free it with
 * fkvf_search_buffer_free(data, alloc). Reads the stream through r (every
 * block verified on first touch; the format errors of those bytes with r's
 * message). Errors: FKVF_E_INVALID_ARG (NULL), FKVF_E_STATE (r is not a
 * usable reader), FKVF_E_RANGE (no such stream), FKVF_E_CODEBOOK (an index
 * stream without a name, FKVF_STREAM_ID_UNNAMED: attach the external
 * codebook first), FKVF_E_LIMIT (too large for a size_t), FKVF_E_NOMEM;
 * *data is then NULL. One thread at a time per reader. */
FKVF_API int fkvf_search_index_build(fkvf_reader *r, size_t stream_index, void **data,
                                     size_t *size, uint64_t *key, const fkvf_allocator *alloc);
/* Free a buffer of fkvf_search_index_build with the allocator it was built
 * with (NULL = malloc family). p NULL is fine. */
FKVF_API void fkvf_search_buffer_free(void *p, const fkvf_allocator *alloc);

/* ---- key retrieval ---------------------------------------------------- */
/* Which archived positions would attention weigh most? For one KV head and a
 * query vector q (as attention applies it: after RoPE at the query's own
 * position), the archived positions p whose keys k_p (decoded, spec 13.6,
 * rotated to p when archived before rotation) give the largest q . k_p,
 * answered in place from the codebook and the index streams, never decoding
 * the whole range (docs/retrieval.md; measured in docs/retrieval-study.md):
 *   1. the head's stage-0 key centroids c_j are scored s_j = q~ . c_j (k
 *      dot products): q~ = q for keys archived as cached (key_storage 0).
 *      For keys archived before rotation q . R(p) c_j depends on p (R(p):
 *      the RoPE rotation to p): the range is cut into chunks
 *      (fkvf_key_query.chunk) and in each chunk q~ = the mean over its
 *      positions of R(p)^T q, so that s_j is the mean of q . R(p) c_j there
 *      (k dot products a chunk; the pairs that turn fast within a chunk
 *      average out);
 *   2. (chunk, symbol) pairs best first (ties: smaller symbol, then earlier
 *      chunk), the positions of the chunk whose stage-0 key symbol is that
 *      symbol are gathered (a symbol's positions come from a length-1
 *      fkvf_search_suffix query on the stage-0 key stream, answered from its
 *      ZPOS / ZIDX index when the archive has one, once a query), until
 *      there are at least candidates * m or no pair is left;
 *   3. each candidate's key is decoded from all its key stages and scored
 *      q . k_p (binary64); the best m are returned by score descending, then
 *      position ascending.
 * When candidates * m covers the range, the result is exactly the top m of
 * q . k_p over the range. Positions in the exact window (sinks, recent
 * positions: fkvf_reader_is_exact) are not searched; their keys are in the
 * exact rows. Measured (bench/README.md "Key retrieval", synthetic keys
 * archived before rotation, 131,072 positions): chunks of 1024 find 0.85 of
 * the exact top 16 at 1/37 of the cost of reading and scoring every key;
 * one chunk finds 0.005. */
typedef struct fkvf_key_search fkvf_key_search;

/* candidates per result position when fkvf_key_query.candidates is 0, and
 * the most it may be */
#define FKVF_KEY_CANDIDATES 4u
#define FKVF_KEY_CANDIDATES_MAX 1024u
/* the default chunk (keys archived before rotation), and the most centroid
 * scores (chunks x k) one query may compute (FKVF_E_LIMIT beyond) */
#define FKVF_KEY_CHUNK 1024u
#define FKVF_KEY_SCORES_MAX (1u << 22)

typedef struct fkvf_key_query {
    uint32_t layer, head;   /* the KV head (a GQA group's query heads share it) */
    const float *query;     /* dim floats, finite; borrowed during the call */
    size_t dim;             /* must equal the archive's key_dim */
    uint64_t first, end;    /* search the archived positions in [first, end);
                             * end 0: up to the last archived position */
    size_t m;               /* positions wanted (0: none) */
    uint32_t candidates;    /* candidates per wanted position (0: FKVF_KEY_CANDIDATES;
                             * at most FKVF_KEY_CANDIDATES_MAX) */
    uint64_t chunk;         /* keys archived before rotation: the range is cut into
                             * chunks of this many positions, each scored with its
                             * own mean query (0: FKVF_KEY_CHUNK, or longer where the
                             * range would need more than FKVF_KEY_SCORES_MAX scores;
                             * >= the range: one chunk); ignored for keys archived
                             * as cached */
} fkvf_key_query;

typedef struct fkvf_key_hit {
    uint64_t position;
    double score; /* q . k_p */
} fkvf_key_hit;

typedef struct fkvf_key_stats {
    uint64_t centroids_scored; /* chunks x k */
    uint64_t symbols_searched; /* stage-0 symbols whose positions were gathered */
    uint64_t candidates;       /* positions whose keys were decoded and scored */
} fkvf_key_stats;

/* A key search over the archive r reads (borrowed: it must outlive the
 * handle; an external codebook must be attached first). Loads the
 * codebook's tables in binary32 (4 bytes a centroid element, as
 * fkvf_rvq_from_tables_decode) and finds the key streams; the stage-0 suffix
 * search of a head is opened on its first query and kept, and for keys
 * archived before rotation a table of rotations (5 x 256 x rope_dims
 * doubles) is built on the first query that decodes a candidate. On failure
 * *out is set when a handle exists (read its message, free it; queries on
 * it return the open's error): FKVF_E_NOT_FOUND (a codebook file, no
 * codebook, no key stages), FKVF_E_CODEBOOK (an external codebook not
 * attached), the reader's errors, FKVF_E_LIMIT (layers x heads x stages
 * beyond a size_t), FKVF_E_NOMEM; FKVF_E_INVALID_ARG (out or r NULL; *out
 * then NULL). Memory from alloc (NULL = malloc family). */
FKVF_API int fkvf_search_keys_open(fkvf_key_search **out, fkvf_reader *r,
                                   const fkvf_allocator *alloc);
/* Free ks (not its reader). NULL or not a key search handle: no-op. */
FKVF_API void fkvf_search_keys_free(fkvf_key_search *ks);
/* The message of ks's last error, "ok" when there is none; never NULL ("not
 * a key search handle"). Owned by ks: valid until the next call on ks. */
FKVF_API const char *fkvf_search_keys_message(const fkvf_key_search *ks);
/* The last error of ks as fields (fkvf_error_info). FKVF_OK,
 * FKVF_E_INVALID_ARG (out NULL) or FKVF_E_STATE (not a key search handle). */
FKVF_API int fkvf_search_keys_error(const fkvf_key_search *ks, fkvf_error_info *out);
/* Run query q: at most q->m hits into out (room for q->m), their number in
 * *n_out; stats (may be NULL) says what the query cost. Errors:
 * FKVF_E_INVALID_ARG (NULL, dim not key_dim, a non-finite query component,
 * candidates above FKVF_KEY_CANDIDATES_MAX), FKVF_E_RANGE (layer or head
 * out of range), FKVF_E_LIMIT (a chunk so short that chunks x k exceeds
 * FKVF_KEY_SCORES_MAX), FKVF_E_NOMEM, and the reader's format errors of the
 * blocks it reads (FKVF_E_CHECKSUM, FKVF_E_SYMBOL, ...), with ks's message.
 * An empty range (or m 0) is FKVF_OK with *n_out 0. Allocates scratch that
 * grows with the chunks x k scores, the positions of the symbols gathered
 * and the candidates (kept for the next query); reads the blocks holding the
 * symbols it gathers and decodes. One thread at a time per handle
 * and per reader. */
FKVF_API int fkvf_search_keys(fkvf_key_search *ks, const fkvf_key_query *q, fkvf_key_hit *out,
                              size_t *n_out, fkvf_key_stats *stats);

/* ---- end of search ---------------------------------------------------- */

/* ---- quantizer (spec 13) ---------------------------------------------- */
/* Per-head residual vector quantization (RVQ) of KV-cache rows: training,
 * encoding to index codes, decoding (spec 13.6), plus the RoPE rotation of
 * spec 8.1 and f16 / bf16 conversions. Handles are immutable after creation
 * (fkvf_rvq_set_metric, part of a handle's set-up, aside): encode and decode
 * may run concurrently on one handle. Every fkvf_rvq_*
 * function refuses a pointer to another kind of handle as it refuses NULL. */

/* n elements of `from` (little-endian bytes, any alignment) to n elements of
 * `to`; any pair of FKVF_DTYPE_*. Buffers must not overlap. */
FKVF_API int fkvf_convert(fkvf_dtype to, void *dst, fkvf_dtype from, const void *src, size_t n);

/* RoPE parameters (spec 8.1), as in the descriptor. */
typedef struct fkvf_rope {
    uint8_t layout;     /* 1 interleaved pairs (2i, 2i+1), 2 half-split (i, i + rope_dims/2) */
    uint32_t rope_dims; /* even, 2..key_dim */
    double theta;       /* finite, > 0 */
} fkvf_rope;

/* f16 / bf16 <-> f32, one value. Round to nearest, ties to even; f16
 * overflow gives infinity; subnormals exact; NaN stays NaN (top payload bits
 * kept, so every f16 / bf16 bit pattern round-trips through f32 unchanged).
 * fkvf_convert converts arrays the same way. Pure: thread-safe. */
FKVF_API uint16_t fkvf_f32_to_f16(float f);
/* f16 bits to f32, exact (see fkvf_f32_to_f16). */
FKVF_API float fkvf_f16_to_f32(uint16_t h);
/* f32 to bf16 bits, rounded as fkvf_f32_to_f16. */
FKVF_API uint16_t fkvf_f32_to_bf16(float f);
/* bf16 bits to f32, exact (see fkvf_f32_to_f16). */
FKVF_API float fkvf_bf16_to_f32(uint16_t b);

/* Rotate the first rope_dims components of vec (dim components, in place,
 * owned by the caller) to position t: pair i by angle t * theta^(-2i/
 * rope_dims); inverse = 1 rotates by the negative angle (un-rotates a
 * cached key). Angles, sines and cosines in binary64; the f32 variant
 * rounds once at the end. FKVF_E_INVALID_ARG for a NULL argument, invalid
 * parameters or rope_dims > dim. No allocation; thread-safe. */
FKVF_API int fkvf_rope_apply_f64(const fkvf_rope *rope, uint64_t t, int inverse, double *vec,
                                 size_t dim);
/* The same on binary32 components (computed in binary64, rounded once). */
FKVF_API int fkvf_rope_apply_f32(const fkvf_rope *rope, uint64_t t, int inverse, float *vec,
                                 size_t dim);
/* For many vectors rotated at the same positions, the angles once: the
 * cosines and sines of position t's rotation into cs (n >= rope_dims
 * doubles: cs[i] the cosine of pair i's angle t * theta^(-2i/rope_dims),
 * cs[rope_dims/2 + i] its sine, i < rope_dims/2, binary64), then
 * fkvf_rope_apply_table_f64 rotates vec with them: bit for bit what
 * fkvf_rope_apply_f64 at t does, without its pow, cos and sin per pair.
 * FKVF_E_INVALID_ARG for a NULL argument, invalid parameters, n too small
 * or rope_dims > dim. No allocation; thread-safe. */
FKVF_API int fkvf_rope_table(const fkvf_rope *rope, uint64_t t, double *cs, size_t n);
FKVF_API int fkvf_rope_apply_table_f64(const fkvf_rope *rope, const double *cs, int inverse,
                                       double *vec, size_t dim);

/* Cache rows in the layout of spec 14.2 (what EXAC stores): row i holds
 * position first_position + i; per layer the keys of heads 0..H-1, then the
 * values. Elements little-endian, any alignment. */
typedef struct fkvf_rows {
    const void *data;
    size_t n_rows;
    fkvf_dtype dtype;
    uint64_t first_position; /* the rotary position of row 0 (spec 8.1) */
} fkvf_rows;

/* Trained or loaded codebooks, binary32: 4 bytes per centroid element plus a
 * norm per centroid, 57 MB for GPT-2 small at K x4 V x2, k = 256 (a trained
 * handle also keeps the training's panel copy of every table: 8 bytes per
 * element). */
typedef struct fkvf_rvq fkvf_rvq;

typedef struct fkvf_rvq_params {
    /* shape of the cache rows (required) */
    uint32_t n_layers, n_kv_heads, key_dim, value_dim;
    /* codebook */
    uint32_t k;                 /* centroids per stage: power of two 16..4096 (256) */
    uint8_t k_stages, v_stages; /* 0..16 each (4, 2); with layer_stages, their maxima */
    uint8_t pooled;             /* 1: one table set per layer shared by all heads (0) */
    fkvf_dtype table_dtype;     /* F16 or F32: centroids are rounded to it, F16 clamped
                                 * to +-65504 (F16) */
    /* training */
    uint64_t seed;                 /* (0) */
    uint32_t max_iters;            /* Lloyd iterations per stage, >= 1 (25) */
    uint32_t samples_per_centroid; /* at most this * k training vectors per table (256) */
    /* keys: NULL = archive keys as cached (key_storage 0); else un-rotate each
     * key at its position before training (key_storage 1, spec 8.1) */
    const fkvf_rope *key_rope;
    /* called after every trained stage table; may be NULL */
    void (*progress)(void *opaque, uint64_t done, uint64_t total);
    void *progress_opaque;
    /* stage counts per layer, as fkvf_codebook_shape.layer_stages (NULL:
     * k_stages and v_stages in every layer; their maxima must be k_stages and
     * v_stages), read during the call; a table whose layers all have the
     * same counts trains the uniform codebook (NULL) */
    const uint8_t *layer_stages;
    /* train under an encoder metric (spec 13.8, fkvf_rvq_metric below; NULL:
     * Euclidean), read during the call; the result carries it (as
     * fkvf_rvq_set_metric). (Added in 0.3.0, which changed the size of this
     * struct: the soname changed with it.) */
    const struct fkvf_rvq_metric *metric;
    /* threads (the threading model above; 1): the stage tables of different
     * (layer, head, K|V) train at once, each on one thread. The codebook is
     * bit-identical for every count. (Added in 0.4.0, with a new soname.) */
    uint32_t n_threads;
} fkvf_rvq_params;

/* Defaults (values in parentheses above); shape fields 0. */
FKVF_API void fkvf_rvq_params_init(fkvf_rvq_params *p);

/* Train codebooks on `n_blocks` blocks of rows (several caches may be given).
 * Per (layer, head, K|V) - per (layer, K|V) when pooled - the stages are
 * trained one after another with k-means (k-means++ seeding, Lloyd
 * iterations until the assignment is stable or max_iters, empty clusters
 * re-seeded from the worst-fitted point) on the residuals the encoder leaves
 * after the previous, already rounded, stages. Training vectors are a
 * deterministic sample of at most samples_per_centroid * k of all vectors
 * (all of them when fewer). The result depends only on the inputs and the
 * seed, not on which search kernel the CPU runs (assignments are exact), nor
 * on params->n_threads; cost about n * k * dim * (max_iters + 1)
 * multiply-adds per stage table. Memory: per worker thread the sample of
 * one table's vectors (n * dim binary32 values) and k-means' scratch, about
 * 8 * dim + 53 bytes a vector; a call starts no more workers than fit 1 GiB
 * of it (at least one), whatever n_threads asks for. Non-finite
 * inputs are FKVF_E_INVALID_ARG. */
FKVF_API int fkvf_rvq_train(fkvf_rvq **out, const fkvf_rvq_params *params,
                            const fkvf_rows *blocks, size_t n_blocks,
                            const fkvf_allocator *alloc);
/* Load codebooks from CBK1 tables (spec 13.2 order, the bytes after the
 * 64-byte header). n_kv_heads: heads of the cache rows (0 = shape->n_heads;
 * required when pooled). Non-finite values are FKVF_E_INVALID_ARG. */
FKVF_API int fkvf_rvq_from_tables(fkvf_rvq **out, const fkvf_codebook_shape *shape,
                                  uint32_t n_kv_heads, const void *tables, size_t size,
                                  const fkvf_allocator *alloc);
/* A copy with only the first k_stages / v_stages stages (at most q's).
 * FKVF_E_STATE for a handle of f16 tables read in place
 * (fkvf_rvq_from_tables16_borrow, fkvf_rvq_from_tables16_encode). */
FKVF_API int fkvf_rvq_subset(fkvf_rvq **out, const fkvf_rvq *q, unsigned k_stages,
                             unsigned v_stages);
/* Free q (NULL is fine). Not while another thread encodes or decodes with it. */
FKVF_API void fkvf_rvq_free(fkvf_rvq *q);

/* Threads each fkvf_rvq_encode and fkvf_rvq_decode call with q uses (the
 * threading model above; a new handle has 1): a call's positions are cut
 * into one range per thread, of at least 16 positions. Codes and decoded
 * rows are bit-identical for every count. Part of q's set-up: not while
 * another thread uses q. FKVF_E_INVALID_ARG for a NULL handle or one of
 * another kind. No allocation. */
FKVF_API int fkvf_rvq_set_threads(fkvf_rvq *q, unsigned n_threads);

/* Shape of the codebook (for fkvf_writer_add_codebooks) and heads of the rows. */
FKVF_API void fkvf_rvq_shape(const fkvf_rvq *q, fkvf_codebook_shape *shape,
                             uint32_t *n_kv_heads);
/* CBK1 tables in spec 13.2 order and the shape's dtype: exactly what
 * fkvf_writer_add_codebooks(w, &shape, tables, size, flags) takes. */
/* fkvf_rvq_tables_size: their size in bytes (0 for NULL); fkvf_rvq_tables:
 * writes them to out, whose size must be exactly that (else
 * FKVF_E_INVALID_ARG). No allocation; thread-safe (q is immutable). */
FKVF_API size_t fkvf_rvq_tables_size(const fkvf_rvq *q);
FKVF_API int fkvf_rvq_tables(const fkvf_rvq *q, void *out, size_t size);

/* Codes: one uint16 index per (layer, head, K|V, stage) and position. Within
 * a position code j = (layer * n_kv_heads + head) * (k_stages + v_stages)
 * + (kv == 0 ? stage : k_stages + stage) (with a layer table, spec 11.2's
 * P(l) numbering: fkvf_index_stream_ord); the code of position i (row i)
 * and index j is codes[i * pos_stride + j * code_stride]. So pos_stride =
 * codes_per_position, code_stride = 1 gives one row of codes per position;
 * pos_stride = 1, code_stride = n_rows gives one array per index stream
 * (FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, layer, head, kv, stage)). */
FKVF_API size_t fkvf_rvq_codes_per_position(const fkvf_rvq *q);

/* Encode rows. key_rope as in training (NULL: keys as cached). beam_width
 * <= 1: greedy, each stage the exact nearest centroid of the residual (ties
 * to the smallest index); 2..64: beam search over the best partial paths,
 * whose final error (binary64 squared distance to the binary32 decoding) is
 * never larger than greedy's. Non-finite inputs give valid but unspecified
 * codes. */
#define FKVF_RVQ_MAX_BEAM 64
/* codes: rows->n_rows * codes_per_position entries at the strides above,
 * owned by the caller. Scratch from q's allocator per call (per range of
 * rows on several threads: fkvf_rvq_set_threads). Errors:
 * FKVF_E_INVALID_ARG (NULL, bad strides or beam width, rows that do not fit
 * q's shape), FKVF_E_STATE (q loaded with fkvf_rvq_from_tables_decode),
 * FKVF_E_NOMEM. Several threads may encode with one q at once. */
FKVF_API int fkvf_rvq_encode(const fkvf_rvq *q, const fkvf_rows *rows, const fkvf_rope *key_rope,
                             unsigned beam_width, uint16_t *codes, size_t pos_stride,
                             size_t code_stride);
/* Encoder metric (spec 13.8): per codebook table (layer, head; head 0 when
 * pooled) and part, a symmetric positive definite matrix M under which the
 * encoder minimises e^T M e instead of e^T e (e the vector's error in the
 * frame of the tables: keys un-rotated when the handle encodes pre-RoPE
 * keys). Query-aware keys take M = the second moment of the queries that
 * read the KV head; output-aware values M = W_o,h^T W_o,h summed over the
 * query heads that read it (docs/codebooks.md). Decoding is unchanged.
 * keys: n_layers * n_heads * key_dim * key_dim floats, matrix (l, h) at
 * (l * n_heads + h) * key_dim^2, row-major; values likewise with value_dim;
 * either may be NULL (that part Euclidean), not both. Each matrix is taken
 * as its symmetric part (fkvf_metric_matrix_check says what is accepted).
 * Dimensions of a part given: at most 1024. */
typedef struct fkvf_rvq_metric {
    const float *keys;
    const float *values;
} fkvf_rvq_metric;

/* One matrix of an encoder metric as fkvf_rvq_set_metric, training and
 * fkvf_writer_add_metric take it: its symmetric part (m + m^T) / 2 (each
 * pair summed in binary64, rounded once; the error e^T M e depends on
 * nothing else, and a Gram matrix computed in floating point is often not
 * symmetric to the last bit) must be finite and positive definite (every
 * pivot of its binary64 Cholesky factorization > 0, spec 13.8). Returns 0,
 * else the first fault, FKVF_METRIC_NONFINITE then FKVF_METRIC_NOT_PD, with
 * *bad (may be NULL) its element index i * dim + j (for NOT_PD the pivot's
 * j * dim + j); -1 for m NULL, dim outside 1..1024 or no memory. (A file's
 * matrices must be symmetric themselves: fkvf_reader_metric.) Allocates
 * 12 dim^2 bytes (malloc); thread-safe. */
#define FKVF_METRIC_NONFINITE 1
#define FKVF_METRIC_NOT_PD 3
FKVF_API int fkvf_metric_matrix_check(const float *m, uint32_t dim, size_t *bad);

/* Give q a metric (copied; NULL or both parts NULL: remove it). Encoding
 * then picks, stage by stage (greedy) or over the beam, the centroids of
 * least e^T M e: the Euclidean search on U x against U c with M = U^T U
 * (Cholesky, binary64; U x rounded to binary32). Training under a metric
 * (fkvf_rvq_params.metric) does the same. Not while another thread uses q
 * (it replaces the encoder's tables). Errors: FKVF_E_INVALID_ARG (a NULL
 * or decode-only handle (fkvf_rvq_from_tables_decode,
 * fkvf_rvq_from_tables16_borrow), a matrix fkvf_metric_matrix_check
 * refuses, a dimension above 1024, a metric so large that a transformed
 * centroid U c overflows binary32), FKVF_E_NOMEM (q keeps its previous
 * metric). fkvf_rvq_get_metric then gives the symmetric parts. Memory: the binary32 tables once more plus 8 bytes
 * a matrix element. */
FKVF_API int fkvf_rvq_set_metric(fkvf_rvq *q, const fkvf_rvq_metric *metric);
/* q's metric: the matrices (owned by q, valid until fkvf_rvq_set_metric or
 * fkvf_rvq_free); both NULL without one. Returns 1 when q has one, else 0
 * (also for NULL). */
FKVF_API int fkvf_rvq_get_metric(const fkvf_rvq *q, fkvf_rvq_metric *out);

/* Decode n_rows positions (spec 13.6): per vector the sum of the chosen
 * centroids in stage order in binary32, keys rotated to their position
 * (first_position + i) when key_rope is given, rounded to out_dtype, in the
 * row layout of spec 14.2. out_size >= n_rows * row bytes. A code >= k is
 * FKVF_E_RANGE (every code is checked before anything is written). On
 * fkvf_rvq_set_threads' threads, one range of rows each. */
FKVF_API int fkvf_rvq_decode(const fkvf_rvq *q, const uint16_t *codes, size_t pos_stride,
                             size_t code_stride, size_t n_rows, uint64_t first_position,
                             const fkvf_rope *key_rope, fkvf_dtype out_dtype, void *out,
                             size_t out_size);

/* ---- end of quantizer ------------------------------------------------- */

#ifdef __cplusplus
}
#endif
#endif /* FKVF_H */

/* ======================================================================== *
 * Second tier: codec, quantizer and reader internals, for the library's  *
 * own modules, tests, benchmarks and fuzzers.                              *
 *                                                                          *
 * NOT ABI-STABLE: these declarations may change or disappear in any       *
 * release, minor or patch. They are visible only to a translation unit    *
 * that defines FKVF_STATIC_LINKING_ONLY before including fkvf.h (as       *
 * zstd.h's ZSTD_STATIC_LINKING_ONLY); link such a program with the static *
 * library of the same version. The conventions of the first tier hold     *
 * (error codes, allocators, NULL handling).                                *
 * ======================================================================== */
#if defined(FKVF_STATIC_LINKING_ONLY) && !defined(FKVF_H_STATIC_LINKING_ONLY)
#define FKVF_H_STATIC_LINKING_ONLY

#ifdef __cplusplus
extern "C" {
#endif

/* ---- reader: stream layout ---------------------------------------------- */

/* Symbols [first, first+count) of stream `index` into bytes, as
 * fkvf_reader_stream_read does into uint32_t, for streams whose symbols fit
 * (quad widths <= 8, ngon N <= 256; else FKVF_E_INVALID_ARG); for 8-bit quad
 * streams a copy of the stored bytes. out holds count bytes, owned by the
 * caller. Verifies the blocks it touches on first touch (the format errors
 * of those bytes, with r's message); FKVF_E_RANGE past the stream's length.
 * One thread at a time per reader. The search module's scan uses it. */
FKVF_API int fkvf_reader_stream_read_u8(fkvf_reader *r, size_t index, uint64_t first,
                                        uint8_t *out, size_t count);

/* ---- reader: random access ---------------------------------------------- */

/* fkvf_reader_read keeps the index codes of the positions it reads a few at
 * a time: a read of fewer than 16 positions of every layer, head and part in
 * FKVF_LAYOUT_ROWS copies, on first touch, the codes of every index stream
 * for the aligned block of 16 symbols of the segment around each position
 * into a cache, one contiguous row per position (a position's codes are
 * otherwise one per stream, a cache line and often a page apart). Reading
 * those positions again then touches one row. A block whose bytes fail
 * their checksum or hold a symbol >= k is not cached (the read goes on
 * without it and reports only what concerns its own positions). When reads
 * spread over far more blocks than the cache holds (fewer than one in three
 * finds its block once the cache is full), it stops filling for a while and
 * such reads go uncached.
 *
 * Set the most memory that cache may take: FKVF_ROW_CACHE_DEFAULT (16 MiB,
 * the default) or any other size; 0 turns it off. Frees the cache r holds;
 * the next such read allocates the new one, no larger than r's index
 * segments need (FKVF_E_NOMEM from that read if it cannot). FKVF_E_STATE
 * when r is not a usable reader. No allocation. One thread at a time per
 * reader. */
#define FKVF_ROW_CACHE_DEFAULT ((size_t)16 << 20)
FKVF_API int fkvf_reader_set_row_cache(fkvf_reader *r, size_t bytes);

/* Effective segment i (0 .. fkvf_stream_info.n_segments - 1, ascending
 * first_symbol) of stream stream_index's group: in *section the
 * fkvf_reader_section index of its STRM section, in *first its
 * first_symbol, in *count the symbols it supplies (spec 11.6). No
 * allocation, no I/O. FKVF_E_RANGE for an index out of range,
 * FKVF_E_INVALID_ARG for a NULL output. One thread at a time per reader. */
FKVF_API int fkvf_reader_stream_segment(const fkvf_reader *r, size_t stream_index, size_t i,
                                        size_t *section, uint64_t *first, uint64_t *count);

/* ---- appender: the queue ------------------------------------------------ */

/* fkvf_appender_append keeps at most this many bytes of queued rows beyond
 * the rows of the recent window before it writes the queued positions
 * whose place is decided past the committed end (fkvf.h
 * fkvf_appender_append): the default, 64 MiB. */
#define FKVF_APPEND_QUEUE_DEFAULT ((size_t)64 << 20)
/* Set that bound for the appender a: bytes of rows (0: the default); it is
 * at least one alignment unit of the index streams (spec 11.6) in rows,
 * whatever the value. Takes effect from the next fkvf_appender_append. A
 * smaller bound means less memory and more, smaller sections per commit;
 * the positions and what they restore to are the same for every bound.
 * Tests set a small one to make a commit of a few positions write in
 * pieces. FKVF_OK, or FKVF_E_STATE (not an appender, or a failed one: its
 * error). No allocation, no I/O. One thread at a time per handle. */
FKVF_API int fkvf_appender_set_queue_bytes(fkvf_appender *a, size_t bytes);

/* ---- search: an index for a stream the reader cannot name ---------------- */

/* As fkvf_search_index_build, a ZPOS section in *data of *size bytes, freed
 * with fkvf_search_buffer_free, for index stream stream_index of an archive
 * whose external codebook has a layer table and is not attached to r: r
 * cannot name that stream (FKVF_STREAM_ID_UNNAMED, spec 11.2), the caller
 * can (fkvf_index_stream_id_shape with the codebook's shape) and gives its
 * id, which keys the section (spec 20.1). The entries depend on the symbols
 * only. A stream r can name must be given its own id; id
 * FKVF_STREAM_ID_UNNAMED: FKVF_E_INVALID_ARG (both). The caller answers for
 * the id: given the wrong one, the section names another stream. The
 * appender's automatic compaction uses it: it holds the codebook's shape,
 * not the codebook. Errors and threading as fkvf_search_index_build. */
FKVF_API int fkvf_search_index_build_as(fkvf_reader *r, size_t stream_index, uint64_t id,
                                        void **data, size_t *size,
                                        const fkvf_allocator *alloc);

/* ---- codec (spec 12) ----------------------------------------------------- */

/* r_N of a regular N-gon (spec 12.2), N = n in 2..65536 (0.0 otherwise); uses libm
 * (the writer side; readers take r from the file). Pure: thread-safe. */
FKVF_API double fkvf_ngon_rmax(uint32_t n);
/* Largest span length L_max for ratio r (spec 12.2): the largest L with
 * (1/r)^L <= 2^44; 0 when r is not finite or <= 0. Pure: thread-safe. */
FKVF_API uint32_t fkvf_ngon_max_span(double r);

/* ---- quantizer internals (spec 8.1, 13) ---------------------------------- */

/* fkvf_rvq_from_tables for decoding only (fkvf_rvq_decode,
 * fkvf_rvq_centroids): skips the encoder's norms and duplicate marks (one
 * pass over every table); fkvf_rvq_encode on such a handle is FKVF_E_STATE. Readers load
 * archive codebooks this way. Same arguments, ownership and errors as
 * fkvf_rvq_from_tables; free with fkvf_rvq_free. */
FKVF_API int fkvf_rvq_from_tables_decode(fkvf_rvq **out, const fkvf_codebook_shape *shape,
                                         uint32_t n_kv_heads, const void *tables, size_t size,
                                         const fkvf_allocator *alloc);
/* A decode-only handle over f16 tables read in place (spec 13.2 order: a
 * CBK1's contents after its 64-byte header, `size` bytes), without the
 * binary32 copy fkvf_rvq_from_tables_decode makes; fkvf_reader_restore
 * decodes f16 codebooks this way. Parameters as fkvf_rvq_from_tables_decode
 * (n_kv_heads 0: shape->n_heads). Ownership: the tables are borrowed and
 * must stay valid and unchanged until fkvf_rvq_free of *out; the handle
 * (freed with fkvf_rvq_free) has no binary32 rows: only fkvf_rvq_decode
 * (bit-identical output to a fkvf_rvq_from_tables_decode handle of the same
 * tables), fkvf_rvq_tables, giving the f16 bytes, fkvf_rvq_shape,
 * fkvf_rvq_codes_per_position and fkvf_rvq_free take it (fkvf_rvq_encode:
 * FKVF_E_STATE, fkvf_rvq_subset: FKVF_E_STATE, fkvf_rvq_centroids: NULL).
 * Errors: FKVF_E_UNSUPPORTED when it cannot read the tables in place
 * (shape not f16, a build or CPU without fkvf_rvq_decode's AVX2 + F16C
 * kernel, tables not 2-byte aligned: use fkvf_rvq_from_tables_decode),
 * FKVF_E_INVALID_ARG (out NULL, bad shape or n_kv_heads, size not the
 * tables' size, an infinite or NaN element), FKVF_E_NOMEM. Thread-safe
 * (the handle is immutable). */
FKVF_API int fkvf_rvq_from_tables16_borrow(fkvf_rvq **out, const fkvf_codebook_shape *shape,
                                           uint32_t n_kv_heads, const void *tables, size_t size,
                                           const fkvf_allocator *alloc);
/* An encoding handle over f16 tables read in place: what
 * fkvf_rvq_from_tables16_borrow makes, plus the encoder's norms and
 * duplicate marks (one pass that widens each stage table into a scratch
 * table), so that fkvf_rvq_encode takes it too; the encoder widens the
 * stage tables of one (layer, head, K|V) at a time. The same indices as a
 * fkvf_rvq_from_tables handle of the same tables, without allocating and
 * converting binary32 tables (2x the f16 bytes): `fkvf pack --codebooks`
 * loads the codebook file's tables this way. Parameters, ownership (the
 * tables borrowed until fkvf_rvq_free) and errors as
 * fkvf_rvq_from_tables16_borrow; on FKVF_E_UNSUPPORTED, use
 * fkvf_rvq_from_tables. Takes fkvf_rvq_encode, fkvf_rvq_decode,
 * fkvf_rvq_tables, giving the f16 bytes as given, fkvf_rvq_shape,
 * fkvf_rvq_codes_per_position and fkvf_rvq_free; fkvf_rvq_centroids gives
 * NULL and fkvf_rvq_subset FKVF_E_STATE on it (and on a
 * fkvf_rvq_from_tables16_borrow handle): there are no binary32 tables.
 * Thread-safe (the handle is immutable). */
FKVF_API int fkvf_rvq_from_tables16_encode(fkvf_rvq **out, const fkvf_codebook_shape *shape,
                                           uint32_t n_kv_heads, const void *tables, size_t size,
                                           const fkvf_allocator *alloc);
/* The k x dim binary32 centroids of one stage table (kv: 0 keys, 1 values;
 * head ignored when pooled), owned by q and valid until fkvf_rvq_free; NULL
 * if out of range, or for a handle of f16 tables read in place (it has no
 * binary32 tables). No allocation; thread-safe (q is immutable). */
FKVF_API const float *fkvf_rvq_centroids(const fkvf_rvq *q, uint32_t layer, uint32_t head,
                                         unsigned kv, unsigned stage);
/* Where fkvf_rvq_decode_to puts what it decodes: layers [layer_first,
 * +layer_count) only, as rows [row_first, +n_rows) of an output of n_out
 * rows laid out as fkvf_reader_read's `layout` (FKVF_LAYOUT_ROWS: per row
 * the selected layers of spec 14.2's row; FKVF_LAYOUT_HEADS: per selected
 * layer, keys [head][row][key_dim] then values [head][row][value_dim],
 * row counting all n_out rows). */
typedef struct fkvf_rvq_decode_target {
    uint32_t layer_first, layer_count;
    fkvf_layout layout;
    size_t n_out, row_first;
    unsigned parts; /* FKVF_PART_KEYS | FKVF_PART_VALUES, 0 for both: the
                     * vectors decoded, the output holding those parts only */
} fkvf_rvq_decode_target;
/* fkvf_rvq_decode of the target's layers into its layout: every vector the
 * same bits as fkvf_rvq_decode gives it. codes: the codes of the selected
 * layers only (a position's codes from the first code of layer_first to the
 * last of layer_first + layer_count - 1, in their order in a whole
 * position), code j of row i at codes[i * pos_stride + j * code_stride].
 * out_size >= n_out * layer_count * n_kv_heads * (the parts' dims)
 * elements of out_dtype; rows outside [row_first, +n_rows) are not
 * touched. Errors and threads as fkvf_rvq_decode (FKVF_E_INVALID_ARG also
 * for a target outside q's layers or row_first + n_rows > n_out).
 * fkvf_reader_read decodes large selections of every head and part this
 * way. */
FKVF_API int fkvf_rvq_decode_to(const fkvf_rvq *q, const fkvf_rvq_decode_target *target,
                                const uint16_t *codes, size_t pos_stride, size_t code_stride,
                                size_t n_rows, uint64_t first_position,
                                const fkvf_rope *key_rope, fkvf_dtype out_dtype, void *out,
                                size_t out_size);

#ifdef __cplusplus
}
#endif
#endif /* FKVF_STATIC_LINKING_ONLY */
