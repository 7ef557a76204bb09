/* Check suite for tools/cli_sample.c, the training sample's rule of fkvf
 * train, pack --train and append --create --train (docs/codebooks.md,
 * "Training on a sample of positions"). The expected runs were computed
 * by a separate Python implementation of the rule as the documentation
 * states it (not from this code); splitmix64's outputs are the published
 * ones for seed 0 (0xe220a8397b1dcdaf, ...). */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_sample.h"
#include "testutil.h"

/* The runs as "input:first+n ..." */
static void runs_str(const cli_run *r, size_t n, char *out, size_t cap)
{
    size_t at = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(out + at, cap - at, "%s%zu:%" PRIu64 "+%" PRIu64, i ? " " : "",
                               r[i].input, r[i].first, r[i].n);
}

static void sample_is(const uint64_t *npos, size_t nin, uint64_t max, uint64_t seed,
                      const char *want, uint64_t want_used)
{
    cli_run *r;
    size_t n;
    uint64_t used;
    ck_assert_int_eq(cli_sample_runs(npos, nin, max, seed, &r, &n, &used), 0);
    char got[1024];
    runs_str(r, n, got, sizeof got);
    ck_assert_msg(!strcmp(got, want) && used == want_used,
                  "max %" PRIu64 " seed %" PRIu64 ": got '%s' (%" PRIu64 " positions), want "
                  "'%s' (%" PRIu64 ")",
                  max, seed, got, used, want, want_used);
    free(r);
}

START_TEST(splitmix64_published)
{
    uint64_t s = 0, x[3];
    for (int i = 0; i < 3; i++)
        x[i] = cli_splitmix64(&s);
    ck_assert_msg(x[0] == UINT64_C(0xe220a8397b1dcdaf) && x[1] == UINT64_C(0x6e789e6aa1b965f4) &&
                      x[2] == UINT64_C(0x06c45d188009454f),
                  "splitmix64 from 0: %016" PRIx64 " %016" PRIx64 " %016" PRIx64, x[0], x[1],
                  x[2]);
    s = 12345;
    ck_assert_uint_eq(cli_splitmix64(&s), UINT64_C(0x22118258a9d111a0));
}
END_TEST

START_TEST(sample_expected_runs)
{
    const uint64_t one[] = {1000}, three[] = {300, 70, 1000}, two[] = {130, 130},
                   nine[] = {640}, big[] = {5000};
    sample_is(one, 1, 256, 0, "0:64+64 0:640+128 0:832+64", 256);
    sample_is(one, 1, 256, 7, "0:128+64 0:512+128 0:896+64", 256);
    /* runs of several inputs in (input, position) order; the short last
     * run of input 0 (256..299) and input 1 (one run of 70) can be chosen */
    sample_is(three, 3, 320, 42, "0:0+64 0:128+64 2:512+64 2:768+128", 320);
    /* the short last run of input 1 merged with the one before */
    sample_is(two, 2, 128, 1, "1:64+66", 66);
    /* 9 of 10 runs: the first nine */
    sample_is(nine, 1, 576, 3, "0:0+576", 576);
    sample_is(big, 1, 1000, UINT64_MAX,
              "0:0+64 0:256+128 0:1408+64 0:2432+128 0:3072+128 0:3264+64 0:3584+64 "
              "0:3840+64 0:3968+128 0:4416+64 0:4672+64",
              960);
}
END_TEST

START_TEST(sample_all_when_within)
{
    const uint64_t npos[] = {300, 0, 70};
    sample_is(npos, 3, 370, 5, "0:0+300 2:0+70", 370);
    sample_is(npos, 3, CLI_SAMPLE_ALL, 5, "0:0+300 2:0+70", 370);
    /* one position more than the budget: a sample of floor(369 / 64) runs */
    sample_is(npos, 3, 369, 5, "0:0+64 0:128+172 2:0+64", 300);
}
END_TEST

/* Over many seeds: exactly m runs of 64 (or an input's short last one),
 * in order, inside the inputs; every run chosen about m / U of the time. */
START_TEST(sample_properties)
{
    const uint64_t npos[] = {1000, 37, 2000};
    enum { U = 16 + 1 + 32, M = 10, SEEDS = 2000 };
    unsigned hits[U];
    memset(hits, 0, sizeof hits);
    size_t bad = 0;
    for (uint64_t seed = 0; seed < SEEDS; seed++) {
        cli_run *r;
        size_t n;
        uint64_t used, sum = 0, runs = 0;
        if (cli_sample_runs(npos, 3, M * 64 + 63, seed, &r, &n, &used)) {
            bad++;
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            const cli_run *x = &r[i];
            if (x->input > 2 || x->first % 64 || x->first + x->n > npos[x->input] || x->n == 0 ||
                (i && (x->input < r[i - 1].input ||
                       (x->input == r[i - 1].input && x->first <= r[i - 1].first + r[i - 1].n))))
                bad++; /* out of range, unaligned, out of order or not merged */
            sum += x->n;
            size_t base = x->input == 0 ? 0 : x->input == 1 ? 16 : 17;
            for (uint64_t p = x->first; p < x->first + x->n; p += 64, runs++)
                hits[base + p / 64]++;
        }
        bad += sum != used || runs != M;
        free(r);
    }
    ck_assert_uint_eq(bad, 0);
    unsigned lo = UINT32_MAX, hi = 0;
    for (int i = 0; i < U; i++) {
        lo = hits[i] < lo ? hits[i] : lo;
        hi = hits[i] > hi ? hits[i] : hi;
    }
    /* expected SEEDS * M / U = 408 each; binomial sd about 18 */
    ck_assert_msg(lo > 330 && hi < 490, "run frequencies %u..%u, expected about 408", lo, hi);
}
END_TEST

START_TEST(sample_limits)
{
    const uint64_t npos[] = {1000}, huge[] = {UINT64_MAX, 1};
    cli_run *r = (cli_run *)1;
    size_t n;
    uint64_t used;
    ck_assert_int_eq(cli_sample_runs(npos, 1, 63, 0, &r, &n, &used), -1);
    ck_assert_ptr_null(r);
    ck_assert_int_eq(cli_sample_runs(huge, 2, 64, 0, &r, &n, &used), -1);
    /* the default: 1 GiB of rows (Llama-3-8B f16 rows are 128 KiB), at least a run */
    ck_assert_uint_eq(cli_sample_default(131072), 8192);
    ck_assert_uint_eq(cli_sample_default(40960), 26214);
    ck_assert_uint_eq(cli_sample_default((size_t)32 << 20), 64);
}
END_TEST

static Suite *cli_sample_suite(void)
{
    Suite *s = suite_create("cli_sample");
    TCase *t = tcase_create("rule");
    tcase_add_test(t, splitmix64_published);
    tcase_add_test(t, sample_expected_runs);
    tcase_add_test(t, sample_all_when_within);
    tcase_add_test(t, sample_properties);
    tcase_add_test(t, sample_limits);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return tu_run_suite(cli_sample_suite()); }
