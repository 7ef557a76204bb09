/* The fkvf subcommands: one entry point each, run by the command table of
 * fkvf_cli.c with the arguments after the command name (argv[0] is the first
 * argument, not the command). Each returns the exit status (CLI_OK,
 * CLI_INVALID, CLI_USAGE of cli_util.h) after printing its result or its
 * error line; cli_set_command has named the command. Public API only. */
#ifndef FKVF_TOOLS_COMMANDS_H
#define FKVF_TOOLS_COMMANDS_H

#include <stddef.h>
#include <stdint.h>

#include "cacheio.h"
#include "fkvf.h"

/* The program's name, in its error lines and usage texts. */
#define CLI_PROG "fkvf"

/* fkvf_inspect.c: reading an archive's structure */
int fkvf_cli_info(int argc, char **argv);
int fkvf_cli_verify(int argc, char **argv);
int fkvf_cli_dump(int argc, char **argv);

/* fkvf_validate.c: every violation of the spec */
int fkvf_cli_validate(int argc, char **argv);

/* fkvf_pack.c: raw caches to archives and back, codebooks, comparison */
int fkvf_cli_pack(int argc, char **argv);
int fkvf_cli_unpack(int argc, char **argv);
int fkvf_cli_train(int argc, char **argv);
int fkvf_cli_compare(int argc, char **argv);

/* fkvf_pack.c, for import-llama: fkvf pack's option parsing and run, with
 * llama = 1 the defaults of import-llama (a llama.cpp state file, --model
 * required, lossless unless --codebooks or --train) and its help text. */
int cli_pack_main(int argc, char **argv, int llama, const char *help);
/* fkvf_pack.c, for export-llama: every position of archive `in` restored
 * as unpack does (its codebook file: cbpath, else found by content hash;
 * out is checked not to be that file), a chunk of positions at a time (at
 * most sink->chunk_bytes of rows, 0: 16 MiB; one position when a row is
 * larger), in dtype (0: the archive's), handed to sink: begin
 * once the archive is open (its reader, for the metadata; the cache's
 * shape, no data; whether token ids follow), then rows for each chunk
 * (spec 14.2 rows of row_bytes each, positions [first, first + n)), then
 * tokens for each chunk of token ids when there are. Each returns the exit
 * status (CLI_OK to go on, else after its error line). *r is the archive's
 * reader (NULL when it could not be opened), left open for the caller,
 * which frees it, success or not. Returns the exit status. */
typedef struct cli_restore_sink {
    int (*begin)(void *opaque, fkvf_reader *r, const kvio_cache *shape, int has_tokens);
    int (*rows)(void *opaque, const uint8_t *rows, size_t row_bytes, uint32_t first, uint32_t n);
    int (*tokens)(void *opaque, const int64_t *ids, uint32_t first, uint32_t n);
    void *opaque;
    size_t chunk_bytes;
} cli_restore_sink;
int cli_restore_stream(const char *in, const char *cbpath, const char *out, int dtype,
                       const cli_restore_sink *sink, fkvf_reader **r);

/* fkvf_llama.c: llama.cpp state files in and out (docs/llamacpp.md) */
int fkvf_cli_import_llama(int argc, char **argv);
int fkvf_cli_export_llama(int argc, char **argv);

/* fkvf_append.c: growing, compacting and recovering archives */
int fkvf_cli_append(int argc, char **argv);
int fkvf_cli_compact(int argc, char **argv);
int fkvf_cli_recover(int argc, char **argv);

/* fkvf_keys.c: key retrieval (fkvf_search_keys) */
int fkvf_cli_keys(int argc, char **argv);
/* fkvf_search.c: retrieval on the streams */
int fkvf_cli_search(int argc, char **argv);
int fkvf_cli_context(int argc, char **argv);
int fkvf_cli_index(int argc, char **argv);

/* fkvf_plot.c */
int fkvf_cli_plot(int argc, char **argv);

/* fkvf_search.c, for pack --index: every stream of the freshly written
 * archive at path indexed in one new commit (nosync: without fsync).
 * Returns the exit status after any error line. */
int fkvf_cli_index_file(const char *path, int tokens_only, int nosync, uint64_t *bytes);

/* fkvf_search.c, for search and plot: the query q[0..qn) against the
 * alphabet of stream idx (named `name`, the token stream when is_tok) of
 * the archive r opened from path. Returns 1 to go on (a token id above the
 * token stream's width gets a note only), 0 after a usage error line for
 * an index symbol the stream cannot hold (>= its alphabet or the embedded
 * codebook's k). */
int fkvf_cli_query_in_alphabet(fkvf_reader *r, const char *path, size_t idx,
                               const char *name, int is_tok, const uint32_t *q, size_t qn);

#endif
