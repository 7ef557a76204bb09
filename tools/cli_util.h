/* Small helpers shared by the CLI sources (fkvf, kvc2cache): error lines,
 * exit statuses, the --json error object, output-file safety, JSON and
 * terminal escaping, strict number parsing, progress bar, raw cache reading;
 * the codebook size rules (cli_codebook.c) and reading caches right
 * (cli_cache.c).
 * Public API (fkvf.h) and cacheio only. */
#ifndef FKVF_CLI_UTIL_H
#define FKVF_CLI_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cacheio.h"
#include "cli_sample.h"
#include "fkvf.h"
#include "gguf.h"
#include "llama_state.h"

/* Exit statuses of the CLI (docs/cli.md), the same for every command:
 * 0 done (valid), 1 invalid input data (a file that is not what it should
 * be, a stream or position that does not exist, files that do not fit each
 * other; also an output that exists without --force or is an input),
 * 2 usage or environment (a bad option or argument, a path that does not
 * exist or cannot be read or written, out of memory). */
enum { CLI_OK = 0, CLI_INVALID = 1, CLI_USAGE = 2 };

/* ---- error lines and the --json error object ------------------------------
 * Every error line is "PROG CMD: FILE: what is wrong" on stderr (PROG CMD
 * as set by cli_set_command). The first error of a run is also recorded:
 * with --json, cli_finish prints it on stdout as the one JSON object
 *   {"error":{"code":N,"name":"FKVF_E_...","class":"usage|environment|
 *    format|input","message":"...","file":"..."|null,"offset":N|null,
 *    "clause":"..."|null}}
 * (code and name: the library's FKVF_E_* code; 100 + n and "KVIO_E_*" for a
 * raw cache file that cacheio cannot read; FKVF_E_INVALID_ARG for a usage
 * error; class: exit 2 is "environment" for FKVF_E_IO, FKVF_E_NOMEM and
 * FKVF_E_UNSUPPORTED, else "usage"; exit 1 is "format" for the library's
 * format class, else "input"). */

/* Program and command named by every error line ("fkvf", "pack"; cmd NULL:
 * "PROG: "), and whether --json was given. */
void cli_set_command(const char *prog, const char *cmd, int json);
int cli_json_mode(void);

/* The exit status of a command: with --json and a failure, the error object
 * on stdout, unless the command printed its own object (cli_json_done). */
int cli_finish(int ex);
/* The command printed its own JSON object, with the error in it
 * (cli_json_error_member). */
void cli_json_done(void);
/* ',"error":{...}' of the recorded error (as cli_finish prints it), or
 * ',"error":null' when there is none and ex is CLI_OK. */
void cli_json_error_member(FILE *f, int ex);

/* An error object (no offset, no clause) for an error that is not the
 * recorded one (fkvf validate: the error of one of several files). */
void cli_json_error_object(FILE *f, int ex, int code, const char *file, const char *msg);

/* An error line, recorded: exit status ex (CLI_INVALID / CLI_USAGE), code
 * (FKVF_E_*; 0: by ex, FKVF_E_INVALID_ARG), the file it is about (NULL:
 * none; the line starts "FILE: " unless the message already does). Returns
 * ex. */
int cli_fail(int ex, int code, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same with the offset (FKVF_ERROR_NO_OFFSET: none) and the spec clause
 * (NULL: none) of the fault as fields of the error object. */
int cli_fail_at(int ex, int code, const char *file, uint64_t offset, const char *clause,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* A library error: rc, its fields (e: from fkvf_reader_error and the like;
 * NULL: none), the file, and a prefix for the message ("" or "writing the
 * index streams: "). The exit status is cli_fkvf_exit(rc). */
int cli_fail_lib(int rc, const fkvf_error_info *e, const char *file, const char *prefix);
/* Helpers for the handles: their fields, then cli_fail_lib. */
int cli_fail_reader(int rc, const fkvf_reader *r, const char *file, const char *prefix);
int cli_fail_writer(int rc, const fkvf_writer *w, const char *file, const char *prefix);
int cli_fail_appender(int rc, const fkvf_appender *a, const char *file, const char *prefix);
int cli_fail_search(int rc, const fkvf_search *s, const char *file, const char *prefix);
/* A cacheio error (rc, its one-line message err, which names the file). */
int cli_fail_kvio(int rc, const char *file, const char *err);

/* Untrusted text for a terminal: control characters (C0, DEL, and C1 as
 * UTF-8) written as escapes, so that a file cannot drive the terminal. */
void cli_text_str(FILE *f, const char *s, size_t n);
void cli_text_cstr(FILE *f, const char *s);

/* A JSON string literal of s (quotes, backslash, control characters and DEL
 * escaped; a byte that does not begin well-formed UTF-8 is written as
 * \ufffd, so that the output is valid JSON whatever the bytes). */
void cli_json_str(FILE *f, const char *s, size_t n);
void cli_json_cstr(FILE *f, const char *s);

/* A usage error: one line "PROG CMD: MESSAGE" on stderr, the message
 * escaped as cli_text_str does (messages quote file names and file
 * contents), recorded as FKVF_E_INVALID_ARG; CLI_USAGE. */
int cli_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A warning line "PROG CMD: warning: ..." and a note line "PROG CMD:
 * note: ..." on stderr (escaped the same way; not recorded as errors). */
void cli_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Exit status of a library / cacheio error, one rule for every command:
 * the caller or the environment (FKVF_E_INVALID_ARG, FKVF_E_STATE,
 * FKVF_E_NOMEM, FKVF_E_IO, FKVF_E_UNSUPPORTED; KVIO_E_ARG, KVIO_E_IO,
 * KVIO_E_NOMEM) CLI_USAGE, anything about the data CLI_INVALID (format
 * errors, FKVF_E_RANGE, FKVF_E_NOT_FOUND, FKVF_E_EXISTS, FKVF_E_CODEC). */
int cli_fkvf_exit(int rc);
int cli_kvio_exit(int rc);

/* ---- output files ----------------------------------------------------------
 * Every command that writes a file calls this first: out must not be the
 * same file as any input (st_dev and st_ino, so a symbolic link, a hard
 * link or another spelling of the path is caught), with or without force;
 * without force it must not exist (the writer then also refuses one that
 * appears meanwhile: no_replace / KVIO_WRITE_NO_REPLACE). NULL entries of in
 * are skipped. Returns CLI_OK, or CLI_INVALID after an error line naming
 * both paths (code FKVF_E_EXISTS). */
int cli_check_output(const char *out, const char *const *in, size_t n_in, int force);
/* 1 when a and b (either may be NULL) name one existing file (the same
 * st_dev and st_ino: links and other spellings too), else 0. */
int cli_same_file(const char *a, const char *b);

/* Commands that write an FKVF file (pack, train, compact, append --create):
 * a warning when the name of out ends in the extension of another format
 * (.safetensors, .npz, .npy, .pt, .pth, .bin, .gguf). what: "archive" or
 * "codebook file". */
void cli_warn_fkvf_name(const char *out, const char *what);

/* The part of path after its last '/'. */
const char *cli_base_name(const char *path);

/* Lower-case hex of a 16-byte hash. */
void cli_hex16(const uint8_t h[16], char out[33]);

/* Decimal digits only (no blank, sign or '+'), at most max: 0, or -1. */
int cli_parse_u64(const char *s, uint64_t max, uint64_t *out);

/* ---- threads ----------------------------------------------------------------
 * The threads of the commands that encode, train or restore: --threads N
 * (fkvf_cli.c takes it out for them), else the environment's FKVF_THREADS,
 * else every CPU the process may use (fkvf_cpu_count). Output never depends
 * on it. */
#define CLI_THREADS_MAX 1024u
/* Take the count from text v (--threads' value or FKVF_THREADS): 0, or -1
 * when v is not a number of threads 1..CLI_THREADS_MAX (nothing printed). */
int cli_set_threads(const char *v);
/* Before a command that uses threads runs: --threads' value if given, else
 * FKVF_THREADS if set (a usage error when it is not such a number: returns
 * CLI_USAGE after the error line), else fkvf_cpu_count(). CLI_OK. */
int cli_threads_setup(void);
/* The thread count to hand the library (after cli_threads_setup; 1 when it
 * did not run). */
unsigned cli_threads(void);

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
/* --layer-stages K:V,K:V,...: a key and a value stage count (0..16) per
 * layer, into lst (2 * 1024 bytes), *n the layers given, *ks and *vs their
 * maxima. 0, or after a usage error -1. */
int cli_opt_layer_stages(const char *a, const char *v, uint8_t *lst, uint32_t *n, uint8_t *ks,
                         uint8_t *vs);
/* The layer table of --layer-stages for a cache of n_layers layers: NULL
 * when none was given (n 0), else lst; a usage error line and *bad = 1 when
 * it gives another number of layers. */
const uint8_t *cli_layer_table(const uint8_t *lst, uint32_t n, uint32_t n_layers, int *bad);
int cli_opt_count(const char *a, const char *v, uint64_t *n);  /* 0..2^32-1 */
int cli_opt_codec(const char *v, int *ngon);                   /* --codec quad|ngon */
int cli_opt_beam(const char *v, uint32_t *beam);               /* 1..FKVF_RVQ_MAX_BEAM */
int cli_opt_iters(const char *v, uint32_t *iters);             /* 1..100000 */
int cli_opt_seed(const char *v, uint64_t *seed);
int cli_opt_keys(const char *v, int *pre_rope);                /* pre-rope|as-is */
int cli_opt_rope_theta(const char *v, double *theta);          /* > 0 */
int cli_opt_rope_dims(const char *v, uint32_t *dims);          /* even, 2..65536 */
int cli_opt_rope_layout(const char *v, uint8_t *layout);       /* 1 interleaved, 2 half-split */
/* --max-train-positions N: a count >= CLI_SAMPLE_RUN, or 0 / all
 * (CLI_SAMPLE_ALL) */
int cli_opt_max_train(const char *a, const char *v, uint64_t *n);

/* Coding options of fkvf pack and append --create: --k, --k-stages,
 * --v-stages, --sinks, --recent, --codec, --beam, --iters, --seed,
 * --model-id, --tokenizer-id. */
typedef struct cli_code_opts {
    uint32_t k, beam, iters;
    int k_set; /* --k given */
    uint8_t ks, vs;
    uint8_t lst[2 * 1024]; /* --layer-stages: the pairs of n_lst layers */
    uint32_t n_lst;
    int ks_set; /* --k-stages or --v-stages given */
    uint64_t sinks, recent, seed;
    uint64_t max_train; /* --max-train-positions: 0 the default budget, CLI_SAMPLE_ALL all */
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
    int layout_cb;                       /* layout taken from a codebook file's train.* */
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
/* Returns 0, or CLI_INVALID after an error line naming cbpath when an option
 * given contradicts the training (--keys, or with keys un-rotated
 * --rope-theta/--rope-dims/--rope-layout): the codebook does not fit keys
 * handled that way. */
int cli_keys_from_codebook(fkvf_reader *cb, const char *cbpath, cli_key_opts *k,
                           uint32_t key_dim);

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
 * codebook) or CLI_USAGE (a given FILE that does not exist or cannot be
 * read, as any path; out of memory; an I/O error while searching).
 * With st->allow_missing, a codebook that is not found (or an I/O error
 * while searching) is no error: CLI_OK, *cb NULL and the reason (naming
 * the hash, the hint and the directories searched) in st->missing, "" when
 * found or not needed. st->rc and st->message: the library code and
 * message of the failure reported (FKVF_E_CODEBOOK for a given FILE that
 * is not a codebook file), for a caller that prints them (verify --json);
 * FKVF_OK and "" on success. st may be NULL (no missing allowed). */
typedef struct cli_codebook_status {
    int allow_missing;  /* in */
    int rc;             /* out */
    char message[1024]; /* out */
    char missing[1024]; /* out */
} cli_codebook_status;
int cli_open_codebook(fkvf_reader *r, const char *archive, const char *given, fkvf_reader **cb,
                      cli_codebook_status *st);

/* cli_open_codebook, with `missing` (not NULL) allowing a codebook not
 * found and receiving st->missing. */
int cli_attach_codebook(fkvf_reader *r, const char *archive, const char *given,
                        fkvf_reader **cb, char *missing, size_t missing_size);


/* Size of a file in bytes, 0 when it cannot be stat'ed. */
uint64_t cli_file_size(const char *path);

/* Progress bar on stderr, drawn only when stderr is a terminal (and not
 * quiet): the bar, the percentage, the elapsed time and an estimate of the
 * time left ("ETA 1m23s", once the work has run for CLI_PROGRESS_ETA_AFTER
 * seconds). Redrawn at most every CLI_PROGRESS_REDRAW seconds; when done
 * reaches total a final line ("done in 4.2s") ends with a newline.
 * cli_progress_cb is a fkvf progress callback with the cli_progress as its
 * opaque pointer. */
#define CLI_PROGRESS_REDRAW 0.1
#define CLI_PROGRESS_ETA_AFTER 0.25
typedef struct cli_progress {
    int on, last;
    const char *label;
    int bytes;          /* show done/total as sizes (set after init) */
    int drawn, ended;   /* a line is on the terminal; the final one was drawn */
    size_t width;       /* characters of the last line drawn */
    double t0, t_draw;  /* start and last redraw, seconds of a monotonic clock */
} cli_progress;

void cli_progress_init(cli_progress *p, const char *label, int quiet);
void cli_progress_cb(void *opaque, uint64_t done, uint64_t total);

/* A duration for people: "0.4s" (below 10 s), "12s", "1m23s", "2h05m". */
void cli_fmt_duration(double secs, char *out, size_t n);

/* One progress line, without carriage return or newline, for done of total
 * after `elapsed` seconds:
 *   "train  [###############               ]  50%  5.0s elapsed, ETA 5.0s"
 * (bytes: a 20-character bar, then "50%  32.0/64.0 MiB  5.0s elapsed, ...",
 * GiB with two decimals from 1 GiB on). The ETA is
 * elapsed * (total - done) / done, shown once done > 0 and elapsed >=
 * CLI_PROGRESS_ETA_AFTER; when done >= total the line ends "done in 5.0s".
 * done is clamped to total; total 0 counts as done. */
void cli_progress_format(char *out, size_t n, const char *label, uint64_t done, uint64_t total,
                         double elapsed, int bytes);

/* Read a raw cache (any format cacheio knows, extra tensors ignored; flags:
 * more KVIO_READ_* flags). Files of CLI_READ_PROGRESS_MIN bytes or more are read with a progress bar
 * when stderr is a terminal (the mapping is read page by page, then
 * parsed), except with KVIO_READ_LAZY (nothing but the header is read:
 * the rows come later through cli_cache_rows and kvio_read_kv). Returns
 * CLI_OK, or an exit status after an error line. */
#define CLI_READ_PROGRESS_MIN (64u << 20)
int cli_read_cache(const char *path, unsigned flags, kvio_cache *c);

/* A background job (cli_bg.c): one function at a time on one more thread,
 * for a command that writes one chunk while it computes the next.
 *
 *   cli_bg bg;
 *   cli_bg_start(&bg);              (no thread if one cannot start: jobs
 *                                    then run inside cli_bg_post)
 *   rc = cli_bg_post(&bg, fn, arg); waits for the job before, then starts
 *                                    fn(arg); returns the first nonzero
 *                                    result of a job so far (fn is then not
 *                                    run), else 0
 *   rc = cli_bg_wait(&bg);          waits for the job; the first failure
 *   rc = cli_bg_stop(&bg);          waits, ends the thread; the first failure
 *
 * A job must not touch what the poster changes until the next post or wait
 * returns (double buffers). cli_bg_stop is needed on every path. */
typedef struct cli_bg {
    struct cli_bg_thread *t; /* NULL: no thread */
    int rc;                  /* the first nonzero result of a job */
} cli_bg;
void cli_bg_start(cli_bg *bg);
int cli_bg_post(cli_bg *bg, int (*fn)(void *), void *arg);
int cli_bg_wait(cli_bg *bg);
int cli_bg_stop(cli_bg *bg);

/* Rows of spec 14.2 (per position, per layer the keys of heads 0..H-1, then
 * the values, in the cache's dtype): elements and bytes of one row, and the
 * rows of positions [p0, p1) written to out, from memory or (a lazy cache)
 * read from its file: CLI_OK, or an exit status after an error line. */
size_t cli_cache_row_elems(const kvio_cache *c);
size_t cli_cache_row_bytes(const kvio_cache *c);
int cli_cache_rows(const kvio_cache *c, uint32_t p0, uint32_t p1, uint8_t *out);

/* The training sample (cli_sample.h) of n_in inputs of n_pos[i] positions,
 * rows of at most row_bytes: max_opt (--max-train-positions; 0: the
 * default budget) and the training seed; a note on stderr naming what
 * when it is not every position (path: the input, or NULL for several).
 * *runs malloc'd. Returns the exit status. */
int cli_train_sample(const char *path, const uint64_t *n_pos, size_t n_in, size_t row_bytes,
                     uint64_t max_opt, uint64_t seed, cli_run **runs, size_t *n_runs,
                     uint64_t *used);
/* The rows of the runs of input `input` (of runs[0..n), in order) read from
 * c into *dst as spec 14.2 rows, *dst moved past them; pg moved on.
 * Returns the exit status. */
int cli_sample_read(const kvio_cache *c, const char *path, const cli_run *runs, size_t n,
                    size_t input, uint8_t **dst, cli_progress *pg, uint64_t *done, uint64_t total);

/* Open an archive or codebook file for reading. Returns CLI_OK, or after
 * "PROG CMD: PATH: MESSAGE" cli_fkvf_exit (CLI_USAGE for an I/O error, a
 * path that does not exist, CLI_INVALID for a file that is not a valid FKVF
 * file; *r is then NULL). */
int cli_open_reader(fkvf_reader **r, const char *path);
/* The same for a command that needs an archive: a codebook file (no cache
 * descriptor) is CLI_INVALID (FKVF_E_INVALID_ARG, "a codebook file, not an
 * archive"). */
int cli_open_archive(fkvf_reader **r, const char *path);

/* fkvf_rvq_params_init, then the cache's shape (layers, heads, dims). */
void cli_rvq_params_for(fkvf_rvq_params *prm, const kvio_cache *c);

/* A descriptor for a cache: zeroed, then its shape and dtype and, unless
 * no_rope, the key transform of rope (keys stored before rotation when krope
 * is given). Sinks, window and ids are the caller's. */
void cli_desc_for(fkvf_desc *d, const kvio_cache *c, const fkvf_rope *rope, int no_rope,
                  const fkvf_rope *krope);

/* ---- codebook files and size rules (cli_codebook.c) ----------------------
 * A codebook file from fkvf train, given with --codebooks to fkvf pack or
 * append --create: it must be a codebook file (no cache descriptor) whose
 * shape fits the cache c; the keys mode and RoPE options come from its
 * training (cli_keys_from_codebook: a contradicting option is refused).
 * *r: its reader, set as soon as it is open (the caller frees it, also after
 * a failure); shape and hash (hash may be NULL) filled; q (NULL: not wanted)
 * the quantizer of its tables: with in_place, f16 tables read where the
 * reader holds them (fkvf_rvq_from_tables16_encode; *q must then be freed
 * before *r), else (or where that is unsupported) a binary32 copy. CLI_OK,
 * or an exit status after an error line naming path. */
int cli_load_codebook_file(const char *path, const kvio_cache *c, cli_key_opts *keys,
                           fkvf_reader **r, fkvf_codebook_shape *shape, uint8_t hash[16],
                           fkvf_rvq **q, int in_place);

/* The size rules (cli_codebook.c). The automatic k is the library's
 * (fkvf_codebook_auto_k, docs/codebooks.md); these names are its bounds. */
#define CLI_CB_K_MIN FKVF_AUTO_K_MIN
#define CLI_CB_K_MAX FKVF_AUTO_K_MAX
#define CLI_CB_FRACTION FKVF_AUTO_K_FRACTION
#define CLI_CB_ROWS_PER_K FKVF_AUTO_K_ROWS_PER_K

/* Bytes of the CBK1 section of k centroids per stage for the cache's shape
 * (one table set per head, or per layer when pooled); 0 when invalid. lst:
 * the --layer-stages table (ks, vs its maxima), or NULL; in every function
 * below too. */
uint64_t cli_cb_bytes(const kvio_cache *c, uint32_t k, uint8_t ks, uint8_t vs,
                      const uint8_t *lst, int f32, int pooled);
/* fp16 bytes of n rows of the cache. */
double cli_fp16_rows(const kvio_cache *c, uint64_t n);
/* fkvf_codebook_auto_k for n rows of the cache: k, or 0 when even k = 16 breaks the rule. */
uint32_t cli_auto_k(const kvio_cache *c, uint64_t n, uint8_t ks, uint8_t vs, const uint8_t *lst,
                    int f32);
/* The warning when the rule gave 0 and CLI_CB_K_MIN is used anyway:
 * "WHO: N NOUN: even k = 16 gives a codebook of B bytes, P% of the F fp16
 * bytes of those rows (...); ADVICE". */
void cli_warn_k_min(const char *who, const kvio_cache *c, uint64_t n, const char *noun,
                    uint8_t ks, uint8_t vs, const uint8_t *lst, int f32, const char *advice);
/* A warning when a codebook of k (cb bytes) wastes bytes: larger than the
 * fp16 bytes of the n rows it is for, or fewer than CLI_CB_ROWS_PER_K rows
 * per centroid (per_table rows train each table set: it memorises them).
 * who: the file named; noun, noun_table: what the n and per_table rows are;
 * advice: what to do instead. 1 if warned. */
int cli_warn_codebook(const char *who, const kvio_cache *c, uint32_t k, uint64_t cb, uint64_t n,
                      uint64_t per_table, const char *noun, const char *noun_table,
                      const char *advice);

/* ---- reading the user's caches right (cli_cache.c) ---------------------- */

/* --layout of the commands that read caches: not given (heads-first, with
 * the warning of cli_cache_notes), hnd (heads-first) or nhd (positions-first). */
enum { CLI_LAYOUT_UNSET = 0, CLI_LAYOUT_HND = 1, CLI_LAYOUT_NHD = 2 };
int cli_opt_layout(const char *v, int *layout); /* 0, or -1 after an error line */
/* --dtype f16|bf16|f32 into *dtype (FKVF_DTYPE_*): 0, or -1 after an error line. */
int cli_opt_dtype(const char *v, int *dtype);

/* Notes on stderr about a cache just read from path: every tensor the reader
 * skipped (kvio_cache.ignored), and, when layout is CLI_LAYOUT_UNSET, a
 * warning naming --layout if there are more "heads" than "positions". */
void cli_cache_notes(const char *path, const kvio_cache *c, int layout);

/* cli_read_cache in the given layout, then cli_cache_notes; lazy: with
 * KVIO_READ_LAZY (the commands that read rows a chunk at a time: memory
 * bounded by the chunk, whatever the cache's size). */
int cli_read_cache_layout(const char *path, int layout, int lazy, kvio_cache *c);

/* Hugging Face caches rotate half-split pairs: when the cache's tensor names
 * are a Hugging Face scheme and the pair layout was neither given nor taken
 * from a codebook file (and not --no-rope), choose half-split and say so.
 * A llama.cpp state file's settings come from its model instead
 * (cli_llama_key_defaults). */
void cli_keys_hf_default(cli_key_opts *k, const kvio_cache *c, const char *path);

/* The RoPE check: on up to 256 positions of [p0, p1) (evenly spaced), per
 * (layer, head), the spread of the keys (mean squared distance to their mean
 * over their mean squared norm) as cached and un-rotated with each candidate
 * (the chosen settings, both pair layouts at the chosen theta and at 10000,
 * 500000 and 1000000, rope_dims of rope), pooled over all heads. Keys before
 * RoPE are concentrated; a wrong un-rotation spreads them. */
typedef struct cli_rope_cand {
    int as_cached;   /* 1: keys as cached, else un-rotated with rope */
    fkvf_rope rope;
    double spread;   /* pooled over all (layer, head) pairs */
    uint64_t wins;   /* (layer, head) pairs where this candidate is lowest */
} cli_rope_cand;
typedef struct cli_rope_report {
    uint32_t positions, sampled; /* in [p0, p1); sampled of them */
    uint64_t heads;              /* layers x kv_heads */
    size_t n;                    /* candidates (0: cannot measure) */
    cli_rope_cand c[10];
    size_t chosen, best;         /* chosen: c[0]; best: the lowest spread */
    int verdict; /* 0 the chosen settings look right, 1 another candidate is lower by
                  * more than 3%: they look wrong, -1 cannot tell (< 16 positions) */
    int no_rope; /* set by the caller after measuring: --no-rope was given (the advice
                  * then says to drop it) */
    const char *codebook; /* set by the caller: the keys' settings come from this
                           * codebook file's training (the advice: train another) */
} cli_rope_report;

/* Measure (pos0 + t - p0 is the rotary position of cache position t; rope:
 * the chosen settings, unrotate 0 when the keys are archived as cached).
 * 0, -1 when out of memory, or an exit status (> 0) after an error line
 * (a lazy cache's file could not be read). */
int cli_rope_measure(const kvio_cache *c, uint32_t p0, uint32_t p1, uint64_t pos0,
                     const fkvf_rope *rope, int unrotate, cli_rope_report *r);
/* The table and the verdict (fkvf pack --check-rope). */
void cli_rope_print(FILE *f, const char *path, const cli_rope_report *r);
/* The same as one JSON object: cache, positions, sampled, heads,
 * candidates [{keys, rope_layout, rope_theta, spread, wins, chosen,
 * lowest}], verdict "right" | "wrong" | "unknown". */
void cli_rope_json(FILE *f, const char *path, const cli_rope_report *r);
/* A warning line on stderr when the verdict is 1. */
void cli_rope_warn(const char *path, const cli_rope_report *r);


/* ---- llama.cpp state files as caches (cli_llama.c) ---------------------- */
/* --model MODEL.gguf, the model the state files of this run were saved with
 * (one per run). Returns 0, or -1 after a usage error (two different). */
int cli_llama_set_model(const char *gguf_path);
/* The --model path (NULL: not given). */
const char *cli_llama_model_path(void);
/* Its metadata, read once (gguf_read_file, with the file's XXH3-128). NULL
 * with *ex = CLI_OK when no --model was given, NULL with *ex the exit
 * status after an error line when it cannot be read. */
const gguf_model *cli_llama_model(int *ex);
/* The --model file's size, mtime, device and inode as one string (the
 * llama.model_stat entry: an append whose model still has these skips
 * hashing it again); -1 when it cannot be stat'ed or there is none. */
int cli_llama_model_stat(char *out, size_t n);
/* Its XXH3-128 (16 bytes, canonical), as cli_llama_model. */
const uint8_t *cli_llama_model_hash(int *ex);
/* The kind of llama.cpp state file at path by its magic (LLST_KIND_NONE:
 * not one, or unreadable); is the file at path a GGUF file? */
llst_kind cli_llama_sniff_file(const char *path);
int cli_llama_is_gguf_file(const char *path);
/* Does the file at path start with FKVF's magic (spec 3.1)? */
int cli_is_fkvf_file(const char *path);
/* A state file read whole into memory and parsed (llst_parse);
 * cli_llama_file_free frees it (NULL ok). Returns the exit status after any
 * error line. */
typedef struct cli_llama_file {
    void *data; /* the file's bytes (malloc'd); st points into them */
    size_t size;
    llst_file st;
} cli_llama_file;
int cli_llama_load(const char *path, cli_llama_file *f);
/* The same without reading the rows (llst_open): data NULL, the file kept
 * open in st.src (what a lazy cache reads from: cli_llama_read_cache). */
int cli_llama_open(const char *path, cli_llama_file *f);
void cli_llama_file_free(cli_llama_file *f);
/* The cache shape of --model (*m: the model, may be NULL); without --model
 * a usage error saying it is needed for path. */
int cli_llama_shape(const char *path, llst_shape *sh, const gguf_model **m);
/* An error of llama_state.c (rc, its line err, which names the file). */
int cli_fail_llst(int rc, const char *file, const char *err);
/* A llama.cpp state file read as a cache (cli_read_cache does this for
 * every command): shape from --model, names KVIO_NAMES_LLAMA, metadata the
 * llst_meta_set entries plus llama.model (the GGUF's file name) and
 * llama.model_arch. lazy: the rows stay in the file, converted when
 * kvio_read_kv asks for them (llst_to_cache_lazy: the commands that read
 * rows a chunk at a time, KVIO_READ_LAZY); else read whole. */
int cli_llama_read_cache(const char *path, int lazy, kvio_cache *c);
/* RoPE settings of --model's architecture for keys not set by options:
 * pair layout (llama: interleaved, NEOX-style: half-split), theta, dims;
 * no RoPE, or keys as cached for schemes spec 8.1 cannot un-rotate
 * (scaled frequencies, M-RoPE, unknown architectures), each with a note. */
void cli_llama_key_defaults(cli_key_opts *k, const kvio_cache *c, const char *path);
/* The descriptor's identity from --model: model_id (general.name, else
 * the architecture) when d has none, weights hash XXH3-128 of the GGUF
 * file (kind 2). Nothing without --model. */
void cli_llama_desc(fkvf_desc *d);
/* fkvf info on a llama.cpp state file: what it is and how to import it. */
int cli_llama_info(const char *path, int json);

#endif
