/* The training sample of fkvf train, pack --train and append --create
 * --train (docs/codebooks.md, "Training on a sample of positions"): when
 * the inputs hold more positions than the budget, runs of
 * CLI_SAMPLE_RUN consecutive positions chosen by the training seed. A
 * pure function of its arguments (no I/O, no global state), so that the
 * rule can be tested and reimplemented on its own. */
#ifndef FKVF_CLI_SAMPLE_H
#define FKVF_CLI_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

/* positions of a run; the budget of the default sample, in bytes of rows */
#define CLI_SAMPLE_RUN 64u
#define CLI_SAMPLE_BUDGET ((uint64_t)1 << 30)
/* --max-train-positions all (or 0): every position */
#define CLI_SAMPLE_ALL UINT64_MAX

/* Positions [first, first + n) of input `input`: one training block. */
typedef struct cli_run {
    size_t input;
    uint64_t first, n;
} cli_run;

/* The positions of the default sample: as many as CLI_SAMPLE_BUDGET bytes
 * of rows of row_bytes hold, at least one run. */
uint64_t cli_sample_default(size_t row_bytes);

/* The sample of at most max_pos (>= CLI_SAMPLE_RUN, or CLI_SAMPLE_ALL) of
 * the positions of n_in inputs (n_pos[i] positions each), by seed:
 *
 *   every input whole when they hold at most max_pos positions in all;
 *   else input i is cut into runs [64 j, min(64 (j + 1), n_pos[i])), the
 *   U runs of all inputs taken in order (input, j); m = floor(max_pos / 64)
 *   of them are chosen by selection sampling: with s = seed, for run
 *   t = 0..U-1 draw x = splitmix64(s) and choose the run when
 *   x mod (U - t) < m - (runs chosen so far).
 *
 * *out (malloc'd, free it): the chosen positions as runs in (input,
 * first) order, adjacent chosen runs of an input merged into one;
 * *n_out of them, *used positions in all. Returns 0, or -1 when out of
 * memory or max_pos is below one run. */
int cli_sample_runs(const uint64_t *n_pos, size_t n_in, uint64_t max_pos, uint64_t seed,
                    cli_run **out, size_t *n_out, uint64_t *used);

/* splitmix64 (Steele, Lea, Flood 2014): the state advanced by
 * 0x9E3779B97F4A7C15, then mixed. Exposed for the tests. */
uint64_t cli_splitmix64(uint64_t *state);

#endif
