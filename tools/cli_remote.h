/* http:// and https:// URLs as archives and codebook files for the tools
 * (issue 18, docs/remote.md): an fkvf_source that reads byte ranges with
 * libcurl (linked into the tools, never into libfkvf). */
#ifndef FKVF_CLI_REMOTE_H
#define FKVF_CLI_REMOTE_H

#include <stdint.h>

#include "fkvf.h"

/* 1 when path is an http:// or https:// URL (then no local file is read). */
int cli_is_url(const char *path);

/* Open a reader on the URL (fkvf_reader_open_source): the object's size is
 * asked with a one-byte range request; a server that ignores Range (200
 * with the whole body) or answers with a wrong Content-Range is refused with
 * a message saying so. Every read is one range request on a connection
 * kept for the process; 5xx answers, resets and cut bodies are retried with
 * backoff (4 attempts); a 4xx is not. The connection is closed at exit.
 * Returns the library's code (*r set as fkvf_reader_open_source sets it;
 * FKVF_E_IO with a note on stderr when the URL cannot be read at all). */
int cli_remote_open(fkvf_reader **r, const char *url, unsigned flags);

/* A reader of path: cli_remote_open for a URL, else fkvf_reader_open_file
 * (flags 0). Every tool that opens an archive or codebook file by a name the
 * user gave calls this, so that a URL works wherever a file does. */
int cli_open_path_or_url(fkvf_reader **r, const char *path);

/* Cap on the bytes one command transfers over all URLs (0: none): a read
 * that would pass it fails (the reader's call with FKVF_E_IO, after a note
 * naming the cap). Set from --max-bytes by the CLI's main. */
void cli_remote_set_max_bytes(uint64_t n);

/* Bytes and requests transferred so far by the process (for --json and the
 * tests). */
void cli_remote_totals(uint64_t *bytes, uint64_t *requests);

#endif
