/* Check suite for tools/cli_util: the progress line (elapsed time, ETA,
 * final line), the duration format and JSON strings, checked against
 * strings written out by hand; the background job runner (cli_bg). */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <time.h>

#include "cli_util.h"
#include "testutil.h"

static void dur_is(double secs, const char *want)
{
    char b[32];
    cli_fmt_duration(secs, b, sizeof b);
    ck_assert_msg(!strcmp(b, want), "duration %g: got '%s', want '%s'", secs, b, want);
}

static void json_is(const char *in, size_t n, const char *want)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    cli_json_str(f, in, n);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_msg(!strcmp(buf, want), "json of %zu bytes: got '%s', want '%s'", n, buf, want);
    free(buf);
}

/* JSON text is UTF-8: well-formed sequences pass, anything else is U+FFFD */
START_TEST(json_string_utf8)
{
    json_is("a\"b\\c\n\t\x01\x7f", 9, "\"a\\\"b\\\\c\\n\\t\\u0001\\u007f\"");
    json_is("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14, "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
    json_is("x\xffy", 3, "\"x\\ufffdy\"");                    /* never valid */
    json_is("\xc3", 1, "\"\\ufffd\"");                          /* cut short */
    json_is("\xc0\xaf", 2, "\"\\ufffd\\ufffd\"");               /* overlong '/' */
    json_is("\xed\xa0\x80", 3, "\"\\ufffd\\ufffd\\ufffd\"");     /* surrogate U+D800 */
    json_is("\xf4\x90\x80\x80", 4, "\"\\ufffd\\ufffd\\ufffd\\ufffd\""); /* above U+10FFFF */
    json_is("\xe2\x82", 2, "\"\\ufffd\\ufffd\"");               /* truncated 3-byte form */
}
END_TEST

START_TEST(duration_format)
{
    dur_is(0.0, "0.0s");
    dur_is(0.44, "0.4s");
    dur_is(9.94, "9.9s");
    dur_is(9.96, "10s");
    dur_is(12.0, "12s");
    dur_is(59.4, "59s");
    dur_is(59.6, "1m00s");
    dur_is(83.0, "1m23s");
    dur_is(3599.4, "59m59s");
    dur_is(3600.0, "1h00m");
    dur_is(7530.0, "2h05m");
    /* nonsense in, something short and sane out */
    dur_is(-1.0, "0.0s");
    dur_is(NAN, "0.0s");
    dur_is(1e30, "359999h00m");
}
END_TEST

static void line_is(const char *label, uint64_t done, uint64_t total, double el, int bytes,
                    const char *want)
{
    char b[256];
    cli_progress_format(b, sizeof b, label, done, total, el, bytes);
    ck_assert_msg(!strcmp(b, want), "%llu/%llu at %g s:\n got '%s'\nwant '%s'",
                  (unsigned long long)done, (unsigned long long)total, el, b, want);
    ck_assert_msg(strlen(b) <= 79, "line of %zu columns: '%s'", strlen(b), b);
}

START_TEST(progress_line_eta)
{
    /* half done after 5 s: 5 s to go */
    line_is("train", 50, 100, 5.0, 0,
            "train  [###############               ]  50%  5.0s elapsed, ETA 5.0s");
    /* a third after 41.5 s: 83 s to go */
    line_is("train ", 1, 3, 41.5, 0,
            "train  [##########                    ]  33%  42s elapsed, ETA 1m23s");
    /* 1% after 10 minutes: 990 minutes to go */
    line_is("encode", 1, 100, 600.0, 0,
            "encode [                              ]   1%  10m00s elapsed, ETA 16h30m");
}
END_TEST

START_TEST(progress_line_no_eta_yet)
{
    /* too early for an estimate, or nothing done yet */
    line_is("encode", 20, 100, 0.2, 0,
            "encode [######                        ]  20%  0.2s elapsed");
    line_is("train", 0, 100, 5.0, 0, "train  [                              ]   0%  5.0s elapsed");
}
END_TEST

START_TEST(progress_line_final)
{
    line_is("train", 100, 100, 65.0, 0,
            "train  [##############################] 100%  done in 1m05s");
    /* more than the total is the total; a zero total is done */
    line_is("copy", 7, 5, 1.25, 0, "copy   [##############################] 100%  done in 1.2s");
    line_is("copy", 0, 0, 0.0, 0, "copy   [##############################] 100%  done in 0.0s");
    /* 99.9% is not 100% */
    line_is("train", 999, 1000, 1.0, 0,
            "train  [############################# ]  99%  1.0s elapsed, ETA 0.0s");
}
END_TEST

START_TEST(progress_line_bytes)
{
    const uint64_t MiB = 1u << 20;
    line_is("read", 32 * MiB, 64 * MiB, 2.0, 1,
            "read   [##########          ]  50%  32.0/64.0 MiB  2.0s elapsed, ETA 2.0s");
    line_is("read", 64 * MiB, 64 * MiB, 3.0, 1,
            "read   [####################] 100%  64.0/64.0 MiB  done in 3.0s");
    /* from 1 GiB on: GiB, two decimals; a long run still fits 79 columns */
    line_is("read", 3 * 512 * MiB, 56 * 1024 * MiB, 3900.0, 1,
            "read   [                    ]   2%  1.50/56.00 GiB  1h05m elapsed, ETA 39h21m");
}
END_TEST

START_TEST(progress_line_small_buffer)
{
    char b[12];
    memset(b, 'x', sizeof b);
    cli_progress_format(b, 10, "train", 1, 2, 1.0, 0);
    ck_assert_str_eq(b, "train  [#");
    ck_assert_int_eq(b[10], 'x');
}
END_TEST

/* ---- cli_bg: one background job at a time ------------------------------ */

typedef struct bg_log {
    int order[8], n; /* ids of the jobs, as they ran */
    atomic_int go;   /* set by the poster after the post returned */
    int saw_go;      /* the waiting job saw it */
} bg_log;

typedef struct bg_job {
    bg_log *log;
    int id, result, wait_for_go;
} bg_job;

static int bg_run(void *opaque)
{
    bg_job *j = opaque;
    if (j->wait_for_go) { /* up to 2 s: the poster goes on while this runs */
        struct timespec ms = {0, 1000000};
        for (int i = 0; i < 2000 && !atomic_load(&j->log->go); i++)
            nanosleep(&ms, NULL);
        j->log->saw_go = atomic_load(&j->log->go);
    }
    j->log->order[j->log->n++] = j->id;
    return j->result;
}

/* posts jobs 1, 2 (fails with 7), 3 and checks what ran; threaded: job 1
 * runs while the poster goes on */
static void bg_sequence(cli_bg *bg, int threaded)
{
    bg_log log;
    memset(&log, 0, sizeof log);
    bg_job j1 = {&log, 1, 0, threaded}, j2 = {&log, 2, 7, 0}, j3 = {&log, 3, 0, 0};
    ck_assert_int_eq(cli_bg_post(bg, bg_run, &j1), 0);
    atomic_store(&log.go, 1);
    int r2 = cli_bg_post(bg, bg_run, &j2); /* waits for job 1 */
    int w = cli_bg_wait(bg);
    int r3 = cli_bg_post(bg, bg_run, &j3); /* refused: job 2 failed */
    int st = cli_bg_stop(bg);
    ck_assert_msg(r2 == (threaded ? 0 : 7) && w == 7 && r3 == 7 && st == 7,
                  "post %d wait %d post %d stop %d", r2, w, r3, st);
    ck_assert_msg(log.n == 2 && log.order[0] == 1 && log.order[1] == 2, "ran %d jobs", log.n);
    ck_assert_int_eq(log.saw_go, threaded);
}

START_TEST(bg_jobs_in_order_first_failure_kept)
{
    cli_bg bg;
    cli_bg_start(&bg);
    ck_assert_ptr_nonnull(bg.t);
    bg_sequence(&bg, 1);
    ck_assert_ptr_null(bg.t);
    /* without a thread (one that could not start): the same results */
    memset(&bg, 0, sizeof bg);
    bg_sequence(&bg, 0);
    /* a runner with no job stops at once */
    cli_bg_start(&bg);
    ck_assert_int_eq(cli_bg_wait(&bg), 0);
    ck_assert_int_eq(cli_bg_stop(&bg), 0);
}
END_TEST

static Suite *cli_util_suite(void)
{
    Suite *s = suite_create("cli_util");
    TCase *t = tcase_create("progress");
    tcase_add_test(t, duration_format);
    tcase_add_test(t, json_string_utf8);
    tcase_add_test(t, progress_line_eta);
    tcase_add_test(t, progress_line_no_eta_yet);
    tcase_add_test(t, progress_line_final);
    tcase_add_test(t, progress_line_bytes);
    tcase_add_test(t, progress_line_small_buffer);
    suite_add_tcase(s, t);
    t = tcase_create("bg");
    tcase_add_test(t, bg_jobs_in_order_first_failure_kept);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return tu_run_suite(cli_util_suite()); }
