/* Check suite for fkvf append (tools/fkvf_append.c, run in-process through
 * its entry point) when another append commits between the moment the
 * command checks its positions against the archive (with a plain reader,
 * no lock) and the moment its appender takes the archive's exclusive flock.
 *
 * The interleaving is forced without any hook in the tool: this test is
 * linked with GNU ld --wrap=flock, and the first exclusive flock of the
 * command under test (the appender's, in fkvf_appender_open) first runs the
 * other append, in a forked child through the same entry point, and waits
 * for it. The command must then see that the archive changed and refuse,
 * with exit 1 and nothing appended, instead of appending positions it
 * checked against a count that is no longer the archive's. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_util.h"
#include "fkvf.h"
#include "testutil.h"

int fkvf_cli_append(int argc, char **argv); /* tools/fkvf_append.c */

int __real_flock(int fd, int op);
int __wrap_flock(int fd, int op);

static char g_dir[64], g_archive[128], g_cache[512];
static const char *g_between; /* --positions of the append run in between; NULL: none */
static int g_between_exit = -1;
static int g_replace; /* 1: the first exclusive lock first renames a copy over the archive */

/* fkvf append ARGS... in this process (the tool's own entry point), stdout
 * and stderr to files of g_dir; the exit status. */
static int run_append(const char *tag, ...)
{
    char *argv[16];
    int argc = 0;
    va_list ap;
    va_start(ap, tag);
    for (const char *a; argc < 15 && (a = va_arg(ap, const char *)) != NULL;)
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    char out[160], err[160];
    snprintf(out, sizeof out, "%s/%s.out", g_dir, tag);
    snprintf(err, sizeof err, "%s/%s.err", g_dir, tag);
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert(so >= 0 && se >= 0 && fo >= 0 && fe >= 0);
    dup2(fo, 1);
    dup2(fe, 2);
    close(fo);
    close(fe);
    cli_set_command("fkvf", "append", 0);
    int ex = fkvf_cli_append(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    return ex;
}

/* The text of g_dir/NAME (malloc'd). */
static char *text_of(const char *name)
{
    char path[160];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    size_t n;
    return (char *)tu_slurp(path, &n);
}

/* The first exclusive lock of the command under test: the other append
 * runs to completion (a child process, which takes and drops its own lock)
 * before this one is taken. */
int __wrap_flock(int fd, int op)
{
    if (g_replace && (op & LOCK_EX)) {
        /* as fkvf compact --in-place does: a new file renamed over the path
         * after this process opened the old one, before it locks it */
        g_replace = 0;
        char copy[160];
        snprintf(copy, sizeof copy, "%s/copy.fkvf", g_dir);
        if (rename(copy, g_archive) != 0)
            return -1;
    }
    if (g_between && (op & LOCK_EX)) {
        const char *range = g_between;
        g_between = NULL;
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            int ex = run_append("between", g_archive, g_cache, "--positions", range, (char *)NULL);
            _exit(ex);
        }
        int st = 0;
        if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st))
            g_between_exit = WEXITSTATUS(st);
    }
    return __real_flock(fd, op);
}

static void setup(void)
{
    const char *src = getenv("FKVF_SRCDIR");
    snprintf(g_cache, sizeof g_cache, "%s/testdata/sample-cache.safetensors", src ? src : ".");
    snprintf(g_dir, sizeof g_dir, "/tmp/fkvf-race-XXXXXX");
    ck_assert(mkdtemp(g_dir) != NULL);
    snprintf(g_archive, sizeof g_archive, "%s/a.fkvf", g_dir);
    g_between = NULL;
    g_between_exit = -1;
    g_replace = 0;
    /* 50 positions, token ids 0..49 of the cache */
    int ex = run_append("create", "--create", g_archive, g_cache, "--positions", "0:50",
                        "--exact-only", (char *)NULL);
    ck_assert_msg(ex == 0, "create: exit %d: %s", ex, text_of("create.err"));
}

static void teardown(void)
{
    const char *names[] = {"a.fkvf",      "create.out", "create.err", "between.out",
                           "between.err", "test.out",   "test.err",   "copy.fkvf"};
    char p[160];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        unlink(p);
    }
    rmdir(g_dir);
}

/* The archive's committed positions and commits. */
static void archive_is(uint64_t positions, uint64_t commits)
{
    fkvf_reader *r = NULL;
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_open_file(&r, g_archive, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    ck_assert_msg(ai.n_positions == positions && ai.n_commits == commits,
                  "archive: %llu positions in %llu commits, want %llu in %llu",
                  (unsigned long long)ai.n_positions, (unsigned long long)ai.n_commits,
                  (unsigned long long)positions, (unsigned long long)commits);
    /* token id t at position t: no position stored twice */
    size_t ti;
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &ti), FKVF_OK);
    uint32_t *tok = calloc((size_t)positions + 1, sizeof *tok);
    ck_assert(tok != NULL);
    ck_assert_int_eq(fkvf_reader_stream_read(r, ti, 0, tok, (size_t)positions), FKVF_OK);
    fkvf_reader_free(r);
    kvio_cache c;
    ck_assert_int_eq(cli_read_cache(g_cache, 0, &c), CLI_OK);
    ck_assert(c.tokens != NULL && c.n_positions >= positions);
    for (uint64_t t = 0; t < positions; t++)
        ck_assert_msg((int64_t)tok[t] == c.tokens[t], "position %llu: token %u, cache %lld",
                      (unsigned long long)t, tok[t], (long long)c.tokens[t]);
    kvio_cache_free(&c);
    free(tok);
}

/* --new checked at 50 positions; another append adds 50..99 before the
 * lock: refused (it would append cache positions 50..255 as 100..305) */
START_TEST(new_refused_when_archive_grew)
{
    g_between = "50:100";
    int ex = run_append("test", g_archive, g_cache, "--new", (char *)NULL);
    ck_assert_int_eq(g_between_exit, 0);
    char *err = text_of("test.err");
    ck_assert_msg(ex == CLI_INVALID, "exit %d, want 1: %s", ex, err);
    ck_assert_msg(strstr(err, "changed meanwhile") != NULL, "message: %s", err);
    ck_assert_msg(strstr(err, "held 50 positions (commit 2)") != NULL &&
                      strstr(err, "100 positions (commit 3) once locked") != NULL,
                  "message: %s", err);
    ck_assert_msg(strstr(err, "nothing appended") != NULL, "message: %s", err);
    free(err);
    archive_is(100, 3);
}
END_TEST

/* --positions 50:100 checked at 50; another append adds 50..59: refused
 * (cache positions 50..59 would be stored twice) */
START_TEST(positions_refused_when_archive_grew)
{
    g_between = "50:60";
    int ex = run_append("test", g_archive, g_cache, "--positions", "50:100", (char *)NULL);
    ck_assert_int_eq(g_between_exit, 0);
    char *err = text_of("test.err");
    ck_assert_msg(ex == CLI_INVALID, "exit %d, want 1: %s", ex, err);
    ck_assert_msg(strstr(err, "changed meanwhile") != NULL, "message: %s", err);
    free(err);
    archive_is(60, 3);
    /* and the append asked for again is checked anew: an overlap now */
    ex = run_append("test", g_archive, g_cache, "--positions", "50:100", (char *)NULL);
    ck_assert_int_eq(ex, CLI_INVALID);
    ex = run_append("test", g_archive, g_cache, "--new", (char *)NULL);
    ck_assert_int_eq(ex, CLI_OK);
    archive_is(256, 4);
}
END_TEST

/* The file at the path is replaced (a compaction renamed its result over
 * it) between the appender's open and its lock: the appender must lock and
 * append to the file the path names now, not to the replaced one, whose
 * commits would be lost with it (fkvf_appender_open checks the locked file
 * is still the path's). */
START_TEST(file_replaced_before_the_lock)
{
    char copy[160];
    snprintf(copy, sizeof copy, "%s/copy.fkvf", g_dir);
    /* a byte-identical copy: another file (inode) with the same contents */
    size_t n;
    uint8_t *bytes = tu_slurp(g_archive, &n);
    tu_write_file(copy, bytes, n);
    free(bytes);
    g_replace = 1;
    int ex = run_append("test", g_archive, g_cache, "--new", (char *)NULL);
    ck_assert_int_eq(g_replace, 0); /* the rename happened */
    char *err = text_of("test.err");
    ck_assert_msg(ex == CLI_OK, "exit %d: %s", ex, err);
    free(err);
    archive_is(256, 3);
}
END_TEST

/* nothing in between: the lock is taken and the append goes through */
START_TEST(no_change_appends)
{
    int ex = run_append("test", g_archive, g_cache, "--new", (char *)NULL);
    ck_assert_int_eq(ex, CLI_OK);
    archive_is(256, 3);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("append_race");
    TCase *tc = tcase_create("race");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, new_refused_when_archive_grew);
    tcase_add_test(tc, positions_refused_when_archive_grew);
    tcase_add_test(tc, no_change_appends);
    tcase_add_test(tc, file_replaced_before_the_lock);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
