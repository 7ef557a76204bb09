/* Small helpers shared by the CLI sources (fkvf, kvc2cache): error lines,
 * exit statuses, JSON and terminal escaping, strict number parsing, progress
 * bar, raw cache reading. Public API (fkvf.h) and cacheio only. */
#ifndef FKVF_CLI_UTIL_H
#define FKVF_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cacheio.h"
#include "fkvf.h"

/* Exit statuses of the CLI: 0 valid/done, 1 invalid input, 2 usage or
 * environment (I/O, memory, bad arguments). */
enum { CLI_OK = 0, CLI_INVALID = 1, CLI_USAGE = 2 };

/* Untrusted text for a terminal: control characters (C0, DEL, and C1 as
 * UTF-8) written as escapes, so that a file cannot drive the terminal. */
void cli_text_str(FILE *f, const char *s, size_t n);
void cli_text_cstr(FILE *f, const char *s);

/* A JSON string literal of s (quotes, backslash, control characters and DEL
 * escaped). */
void cli_json_str(FILE *f, const char *s, size_t n);
void cli_json_cstr(FILE *f, const char *s);

/* One line "fkvf: MESSAGE" on stderr, the message escaped as cli_text_str
 * does (messages quote file names and file contents). */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "fkvf: PATH: MSG", without repeating PATH when the library message starts
 * with it already; a missing message is "unknown error". */
void cli_err_lib(const char *path, const char *msg);

/* Exit status of a library / cacheio error: caller or environment problems
 * are CLI_USAGE, bad input CLI_INVALID. */
int cli_fkvf_exit(int rc);
int cli_kvio_exit(int rc);

/* Exit status by error class (info, verify, dump, search, context, index,
 * plot): CLI_INVALID for a format error, CLI_USAGE for any other. */
int cli_class_exit(int rc);

/* The part of path after its last '/'. */
const char *cli_base_name(const char *path);

/* Lower-case hex of a 16-byte hash. */
void cli_hex16(const uint8_t h[16], char out[33]);

/* Decimal digits only (no blank, sign or '+'), at most max: 0, or -1. */
int cli_parse_u64(const char *s, uint64_t max, uint64_t *out);

/* A finite double, the whole string (no blanks around it): 0, or -1. */
int cli_parse_f64(const char *s, double *out);

/* "12,55,9": decimal numbers up to 2^32-1 separated by single commas, at
 * least one -> 1 and a malloc'd array in *out (*n entries); else 0. */
int cli_parse_list(const char *s, uint32_t **out, size_t *n);

/* A stream name: "tokens" or "L<layer>.H<head>.<K|V>.<stage>" (layer and head
 * 0..65535, stage 0..255) -> 1 and its stream id; else 0. */
int cli_parse_stream_name(const char *s, uint64_t *id);
/* The name of a stream id (the inverse of cli_parse_stream_name). */
void cli_stream_name(uint64_t id, char *out, size_t n);

/* Values of the options fkvf pack, train and append --create share. Each
 * returns 0, or -1 after an error line naming the option (a: the option as
 * given, where one function serves several). */
int cli_opt_k(const char *a, const char *v, uint32_t *k);      /* power of two 16..4096 */
int cli_opt_stages(const char *a, const char *v, uint8_t *s);  /* 0..16 */
int cli_opt_count(const char *a, const char *v, uint64_t *n);  /* 0..2^32-1 */
int cli_opt_codec(const char *v, int *ngon);                   /* --codec quad|ngon */
int cli_opt_beam(const char *v, uint32_t *beam);               /* 1..FKVF_RVQ_MAX_BEAM */
int cli_opt_iters(const char *v, uint32_t *iters);             /* 1..100000 */
int cli_opt_seed(const char *v, uint64_t *seed);
int cli_opt_keys(const char *v, int *pre_rope);                /* pre-rope|as-is */
int cli_opt_rope_theta(const char *v, double *theta);          /* > 0 */
int cli_opt_rope_dims(const char *v, uint32_t *dims);          /* even, 2..65536 */
int cli_opt_rope_layout(const char *v, uint8_t *layout);       /* 1 interleaved, 2 half-split */

/* Coding options of fkvf pack and append --create: --k, --k-stages,
 * --v-stages, --sinks, --recent, --codec, --beam, --iters, --seed,
 * --model-id, --tokenizer-id. */
typedef struct cli_code_opts {
    uint32_t k, beam, iters;
    int k_set; /* --k given */
    uint8_t ks, vs;
    uint64_t sinks, recent, seed;
    int ngon;
    const char *model_id, *tok_id;
} cli_code_opts;

/* Defaults: k 256, 4 key and 2 value stages, 4 sinks, 32 recent, quad,
 * beam 1, 25 iterations, seed 0. */
void cli_code_opts_init(cli_code_opts *o);

/* Option a with its value v when it is one of them: 1 taken, 0 not a
 * coding option, -1 bad value (error line written). */
int cli_code_value(cli_code_opts *o, const char *a, const char *v);

/* Key handling and RoPE options (--keys, --rope-theta, --rope-dims,
 * --rope-layout, --no-rope) of fkvf pack, train and append --create. */
typedef struct cli_key_opts {
    int keys_set;                        /* --keys given */
    int theta_set, dims_set, layout_set; /* --rope-* given */
    int pre_rope;                        /* 1: archive keys before rotation */
    int no_rope;                         /* --no-rope: the cache's keys carry no rotation */
    double theta;
    uint32_t dims;  /* 0 = key_dim */
    uint8_t layout; /* 1 interleaved, 2 half-split */
} cli_key_opts;

/* Defaults: pre-RoPE keys, theta 10000, all dims, interleaved. */
void cli_key_opts_init(cli_key_opts *k);

/* Option a with its value v when a is --keys or --rope-*: 1 taken, 0 not a
 * key option, -1 bad value (error line written). */
int cli_key_value(cli_key_opts *k, const char *a, const char *v);

/* Keys mode and RoPE of a codebook file's training (its train.* metadata),
 * where not given on the command line. */
void cli_keys_from_codebook(fkvf_reader *cb, cli_key_opts *k, uint32_t key_dim);

/* The rope of a cache's keys from the options (rope), and the rope to
 * un-rotate them with before coding (*out; NULL: keys as cached). 0, or -1
 * after an error line naming path (odd key_dim without --rope-dims,
 * --rope-dims that does not fit). */
int cli_key_rope(const cli_key_opts *k, uint32_t key_dim, const char *path, fkvf_rope *rope,
                 const fkvf_rope **out);

/* The external codebook of the archive r (opened from path `archive`),
 * attached to r: the file `given` (--codebooks FILE) when not NULL, else the
 * file found by content hash with fkvf_reader_find_codebook in the
 * archive's directory and the directories of FKVF_CODEBOOK_PATH (the
 * environment variable, colon-separated). *cb: the codebook file's reader,
 * to free after r; NULL when the archive refers to no external codebook.
 * Returns CLI_OK, or after an error line CLI_INVALID (the codebook is not
 * found, not a codebook file, has another hash or does not fit the
 * archive: the one exit status of every command for a missing or wrong
 * codebook) or CLI_USAGE (out of memory, an I/O error while searching).
 * With `missing` (not NULL), a codebook that is not found is no error:
 * CLI_OK, *cb NULL and the reason (naming the hash, the hint and the
 * directories searched) in missing; "" when found or not needed. */
int cli_attach_codebook(fkvf_reader *r, const char *archive, const char *given,
                        fkvf_reader **cb, char *missing, size_t missing_size);

/* Smallest even quad symbol width (2..32) whose alphabet holds 0..maxv. */
unsigned cli_quad_bits_for(uint64_t maxv);

/* Size of a file in bytes, 0 when it cannot be stat'ed. */
uint64_t cli_file_size(const char *path);

/* Progress bar on stderr, drawn only when stderr is a terminal (and not
 * quiet), redrawn when the percentage changes. cli_progress_cb is a
 * fkvf progress callback with the cli_progress as its opaque pointer. */
typedef struct cli_progress {
    int on, last;
    const char *label;
} cli_progress;

void cli_progress_init(cli_progress *p, const char *label, int quiet);
void cli_progress_cb(void *opaque, uint64_t done, uint64_t total);

/* Read a raw cache (any format cacheio knows, extra tensors ignored).
 * Returns CLI_OK, or an exit status after an error line. */
int cli_read_cache(const char *path, kvio_cache *c);

/* Rows of spec 14.2 (per position, per layer the keys of heads 0..H-1, then
 * the values, in the cache's dtype): elements and bytes of one row, and the
 * rows of positions [p0, p1) written to out. */
size_t cli_cache_row_elems(const kvio_cache *c);
size_t cli_cache_row_bytes(const kvio_cache *c);
void cli_cache_rows(const kvio_cache *c, uint32_t p0, uint32_t p1, uint8_t *out);

/* Open an archive or codebook file for reading. Returns CLI_OK, or after
 * "fkvf: PATH: MESSAGE" CLI_USAGE for an I/O error and CLI_INVALID for any
 * other (*r is then NULL). */
int cli_open_reader(fkvf_reader **r, const char *path);

/* fkvf_rvq_params_init, then the cache's shape (layers, heads, dims). */
void cli_rvq_params_for(fkvf_rvq_params *prm, const kvio_cache *c);

/* A descriptor for a cache: zeroed, then its shape and dtype and, unless
 * no_rope, the key transform of rope (keys stored before rotation when krope
 * is given). Sinks, window and ids are the caller's. */
void cli_desc_for(fkvf_desc *d, const kvio_cache *c, const fkvf_rope *rope, int no_rope,
                  const fkvf_rope *krope);

#endif
