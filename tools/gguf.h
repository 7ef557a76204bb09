/*
 * gguf.h - the metadata of a GGUF model file (llama.cpp's model format),
 * for the FKVF tools: the cache shape a llama.cpp state file lacks, the
 * RoPE parameters, and the model's identity (fkvf import-llama --model).
 *
 * The header and the key/value metadata are read, and the tensor infos
 * after them are scanned for one name (rope_freqs.weight); tensor data are
 * not read (gguf_hash_file reads the whole file to hash it).
 * Layout (GGUF versions 2 and 3; all integers little-endian):
 *   u32 magic "GGUF" (bytes 47 47 55 46), u32 version, u64 n_tensors,
 *   u64 n_kv, then n_kv pairs: string key, u32 value type, value.
 *   string = u64 length + that many bytes (UTF-8, not NUL-terminated).
 *   value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool
 *   (1 byte), 8 string, 9 array (u32 element type, u64 count, elements;
 *   arrays of arrays allowed), 10 u64, 11 i64, 12 f64.
 *
 * Hostile input: every length and count is checked against the bytes that
 * remain before it is used; string lengths are bounded (GGUF_MAX_STRING),
 * array nesting too (GGUF_MAX_DEPTH); a key or value that is skipped costs
 * no allocation; allocations are bounded by the file's size. No crash, no
 * hang, no unbounded allocation.
 *
 * Errors: functions return GGUF_OK (0) or a GGUF_E_* code and write one
 * line into err (errlen bytes, NUL-terminated when errlen > 0) naming the
 * file, the byte offset and the key, e.g.
 *   "m.gguf: offset 1234: key 'llama.block_count': u32 value runs past the
 *    end of the file".
 */
#ifndef FKVF_TOOLS_GGUF_H
#define FKVF_TOOLS_GGUF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    GGUF_OK = 0,
    GGUF_E_ARG = 1,         /* bad argument */
    GGUF_E_IO = 2,          /* cannot open or read the file */
    GGUF_E_NOMEM = 3,       /* allocation failed */
    GGUF_E_FORMAT = 4,      /* not a GGUF file, or malformed */
    GGUF_E_UNSUPPORTED = 5  /* well-formed, but not a model whose KV cache we can
                             * describe (see gguf_model) */
};

#define GGUF_MAX_STRING (1u << 24) /* bytes of one string (key or value) */
#define GGUF_MAX_DEPTH 4           /* nesting of arrays */
#define GGUF_MAX_KV (1u << 20)     /* metadata pairs */

/* How the architecture rotates keys (llama.cpp's rope type), as FKVF's
 * spec 8.1 names it. */
typedef enum gguf_rope {
    GGUF_ROPE_UNKNOWN = 0, /* an architecture this module does not know */
    GGUF_ROPE_NONE = 1,    /* no RoPE (gpt2, bloom, mpt, ...) */
    GGUF_ROPE_NORM = 2,    /* adjacent pairs (2i, 2i+1): llama and its kin;
                            * FKVF rope_layout 1, interleaved */
    GGUF_ROPE_NEOX = 3,    /* half-split pairs (i, i + n/2): qwen2, gemma, phi3,
                            * ...; FKVF rope_layout 2 */
    GGUF_ROPE_MULTI = 4    /* M-RoPE and other multi-section schemes: refused */
} gguf_rope;

/* What a KV cache of this model looks like. Fields not in the file are 0
 * (strings NULL) unless a default is named. */
typedef struct gguf_model {
    uint32_t version;       /* GGUF version: 2 or 3 */
    uint64_t n_tensors, n_kv;
    char *arch;             /* general.architecture (malloc'd) */
    char *name;             /* general.name (malloc'd), NULL if absent */
    uint32_t n_layer;       /* ARCH.block_count */
    uint32_t n_embd;        /* ARCH.embedding_length */
    uint32_t n_head;        /* ARCH.attention.head_count (an array: its first value,
                             * all values must be equal) */
    uint32_t n_head_kv;     /* ARCH.attention.head_count_kv; default n_head */
    uint32_t key_dim;       /* ARCH.attention.key_length; default n_embd / n_head */
    uint32_t value_dim;     /* ARCH.attention.value_length; default n_embd / n_head */
    uint32_t context_length;/* ARCH.context_length */
    gguf_rope rope;         /* from the architecture name (the table in gguf.c,
                             * after llama.cpp's llama_model_rope_type); for
                             * glm4, glm4moe and hunyuan_vl also from
                             * ARCH.rope.dimension_sections (MULTI when its
                             * first two sections are > 0, as llama.cpp) */
    uint32_t rope_dims;     /* ARCH.rope.dimension_count; default key_dim */
    double rope_theta;      /* ARCH.rope.freq_base; default 10000 */
    int rope_scaled;        /* 1 when the frequencies are scaled or interpolated
                             * (ARCH.rope.scaling.type not "none", a scaling
                             * factor / scale_linear other than 1, or a
                             * rope_freqs tensor): keys then cannot be
                             * un-rotated by spec 8.1's formula */
    int rope_freqs;         /* a tensor named rope_freqs.weight: per-pair
                             * frequency factors (Llama 3.x scaling); found by
                             * the scan of the tensor infos after the metadata,
                             * when data holds them */
    uint32_t n_vocab;       /* ARCH.vocab_size, else the length of the
                             * tokenizer.ggml.tokens array; 0 if neither */
} gguf_model;

const char *gguf_strerror(int code);
/* The rope type of an architecture name (GGUF_ROPE_UNKNOWN if not in the
 * table). */
gguf_rope gguf_rope_of_arch(const char *arch);
const char *gguf_rope_name(gguf_rope r); /* "unknown", "none", "norm", "neox", "multi" */

/* Parse the header and metadata of a GGUF file in memory (data may be the
 * whole file or any prefix that holds the metadata) into *out, and check
 * that it describes a KV cache: arch, block_count, embedding_length and
 * head_count present (GGUF_E_UNSUPPORTED naming what is missing), every
 * dimension >= 1 and head counts dividing as the model needs. `out` need
 * not be initialized; on failure it is left empty (safe to gguf_model_free). */
int gguf_parse(const void *data, size_t size, const char *name, gguf_model *out, char *err,
               size_t errlen);
void gguf_model_free(gguf_model *m); /* frees the strings, zeroes *m; NULL ok */

/* Read the start of a GGUF file, as much as its metadata and tensor infos
 * take (read(2) into a buffer that grows from 1 MiB, at most
 * GGUF_MAX_HEADER bytes: never the tensor data, never a mapping, so a file
 * truncated meanwhile is an error, not a signal), gguf_parse it, and when
 * hash is not NULL hash the whole file (gguf_hash_file). */
#define GGUF_MAX_HEADER (256u << 20)
int gguf_read_file(const char *path, gguf_model *out, uint8_t hash[16], char *err,
                   size_t errlen);
/* XXH3-128 of the whole file at path into hash[16] (canonical, big-endian
 * byte order: FKVF descriptor weights_hash_kind 2), read in chunks. */
int gguf_hash_file(const char *path, uint8_t hash[16], char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
