/* The training sample's rule (cli_sample.h, docs/codebooks.md). */
#include "cli_sample.h"

#include <stdlib.h>

uint64_t cli_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

uint64_t cli_sample_default(size_t row_bytes)
{
    uint64_t n = row_bytes ? CLI_SAMPLE_BUDGET / row_bytes : CLI_SAMPLE_ALL;
    return n < CLI_SAMPLE_RUN ? CLI_SAMPLE_RUN : n;
}

/* Runs of n positions (the last one shorter) */
static uint64_t runs_of(uint64_t n) { return n / CLI_SAMPLE_RUN + (n % CLI_SAMPLE_RUN != 0); }

/* Positions and runs of all inputs: 0, or -1 when a sum overflows. */
static int sample_totals(const uint64_t *n_pos, size_t n_in, uint64_t *total, uint64_t *runs)
{
    *total = *runs = 0;
    for (size_t i = 0; i < n_in; i++) {
        if (n_pos[i] > UINT64_MAX - *total)
            return -1;
        *total += n_pos[i];
        *runs += runs_of(n_pos[i]); /* <= total: no overflow */
    }
    return 0;
}

/* Every input whole: one run each (inputs without positions left out). */
static int sample_all(const uint64_t *n_pos, size_t n_in, cli_run *r, size_t *n_out)
{
    size_t n = 0;
    for (size_t i = 0; i < n_in; i++)
        if (n_pos[i]) {
            r[n].input = i;
            r[n].first = 0;
            r[n].n = n_pos[i];
            n++;
        }
    *n_out = n;
    return 0;
}

/* Selection sampling (Knuth's algorithm S) of m of the U runs. */
static void sample_choose(const uint64_t *n_pos, size_t n_in, uint64_t U, uint64_t m,
                          uint64_t seed, cli_run *r, size_t *n_out, uint64_t *used)
{
    uint64_t s = seed, t = 0, got = 0;
    size_t n = 0;
    *used = 0;
    for (size_t i = 0; i < n_in && got < m; i++) {
        for (uint64_t p = 0; p < n_pos[i] && got < m; p += CLI_SAMPLE_RUN, t++) {
            uint64_t x = cli_splitmix64(&s);
            if (x % (U - t) >= m - got)
                continue;
            uint64_t len = n_pos[i] - p < CLI_SAMPLE_RUN ? n_pos[i] - p : CLI_SAMPLE_RUN;
            if (n && r[n - 1].input == i && r[n - 1].first + r[n - 1].n == p) {
                r[n - 1].n += len; /* follows the previous chosen run */
            } else {
                r[n].input = i;
                r[n].first = p;
                r[n].n = len;
                n++;
            }
            got++;
            *used += len;
        }
    }
    *n_out = n;
}

int cli_sample_runs(const uint64_t *n_pos, size_t n_in, uint64_t max_pos, uint64_t seed,
                    cli_run **out, size_t *n_out, uint64_t *used)
{
    *out = NULL;
    *n_out = 0;
    *used = 0;
    uint64_t total, U;
    if (max_pos < CLI_SAMPLE_RUN || sample_totals(n_pos, n_in, &total, &U))
        return -1;
    const int all = total <= max_pos;
    uint64_t m = all ? n_in : max_pos / CLI_SAMPLE_RUN; /* runs at most; < U when sampling */
    if (m > SIZE_MAX / sizeof(cli_run))
        return -1;
    cli_run *r = malloc((size_t)(m ? m : 1) * sizeof *r);
    if (!r)
        return -1;
    if (all) {
        sample_all(n_pos, n_in, r, n_out);
        *used = total;
    } else {
        sample_choose(n_pos, n_in, U, m, seed, r, n_out, used);
    }
    *out = r;
    return 0;
}
