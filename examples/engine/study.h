/* What the engine's studies (fkvf-quality, fkvf-attention) share (prefix
 * st_): where their token sequences come from and how a text and its byte
 * ranges are given. A sequence of T positions is BOS and then either T - 1
 * tokens sampled at temperature 1 with the exact cache (lm_rng seeded with
 * the sequence's seed) or the T - 1 bytes of a text range as byte tokens
 * (id LM_BYTE0 + byte: a byte-level model). Single-threaded. */
#ifndef ST_STUDY_H
#define ST_STUDY_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sampled evaluation sequence i is seeded seed * 1000003 + ST_EVAL_SEED_OFFSET + i
 * (training sequence i: seed * 1000003 + i). */
#define ST_EVAL_SEED_OFFSET 10000u

/* Called after each position's forward pass (the state holds positions
 * 0..pos). */
typedef void (*st_step_fn)(void *u, const lm_state *st, int pos);

/* Run one sequence of T positions (tokens[0] = BOS): the T - 1 bytes at text
 * when text is not NULL, else sampled with lm_rng seeded with seed. The
 * tokens go to tokens[0..T); on_step (if not NULL) after every position.
 * Returns the summed NLL of tokens 1..T-1. Exits (status 1, message naming
 * prog) if the model cannot run. */
double st_run_sequence(const char *prog, const lm_model *m, int T, uint64_t seed,
                       const uint8_t *text, int *tokens, st_step_fn on_step, void *u);

/* The T - 1 bytes of sequence i of the text range [off, end): text + off +
 * i (T - 1). Exits (status 2) naming the range, what it is for ("evaluation",
 * "training") and how many sequences it holds when it is too short. */
const uint8_t *st_text_seq(const char *prog, const uint8_t *text, size_t off, size_t end, int T,
                           int i, const char *what);

/* The whole of a text file (malloc'd), or NULL after a message on stderr
 * (an empty file too). */
uint8_t *st_read_text(const char *prog, const char *path, size_t *n);

/* A decimal option value in [lo, hi] into *out: 0, or -1 if malformed or out
 * of range. */
int st_parse_long(const char *a, long lo, long hi, long *out);

/* "A:B" into [*a, *b) with A < B <= n: 0, or 1 if malformed. */
int st_parse_range(const char *v, size_t n, size_t *a, size_t *b);

#ifdef __cplusplus
}
#endif
#endif
