/* fkvf_reader_open_file with FKVF_OPEN_READ (spec 18.5): the reader works
 * on its own copy, so a file truncated or overwritten by another process
 * after the open changes nothing it serves and cannot make it fault. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fkvf.h"
#include "testutil.h"

/* A small archive with exact rows only: 1 layer, 1 head, dims 4, f16. */
static void write_archive(const char *path, uint64_t n)
{
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_file(&w, path, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = d.n_kv_heads = 1;
    d.key_dim = d.value_dim = 4;
    d.dtype = FKVF_DTYPE_F16;
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    uint16_t rows[64 * 8];
    for (size_t i = 0; i < n * 8; i++)
        rows[i] = (uint16_t)(i * 2654435761u >> 16);
    ck_assert_int_eq(fkvf_writer_add_exact(w, 0, n, rows, n * 16, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_positions(w, n, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
}

START_TEST(open_read_survives_truncation)
{
    char path[] = "/tmp/fkvf-openread-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    unlink(path);
    write_archive(path, 20);
    fkvf_reader *m = NULL, *c = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&m, path, 0, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_open_file(&c, path, FKVF_OPEN_READ | FKVF_OPEN_STRICT, NULL),
                     FKVF_OK);
    uint8_t a[20 * 16], b[20 * 16];
    ck_assert_int_eq(fkvf_reader_restore(m, 0, 20, FKVF_DTYPE_F16, a, sizeof a), FKVF_OK);
    fkvf_reader_free(m); /* a mapping would fault after the truncation below */
    /* another process cuts the file to its header and scribbles on it */
    ck_assert_int_eq(truncate(path, 64), 0);
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fputs("garbage", f);
    fclose(f);
    ck_assert_int_eq(fkvf_reader_restore(c, 0, 20, FKVF_DTYPE_F16, b, sizeof b), FKVF_OK);
    ck_assert(memcmp(a, b, sizeof a) == 0);
    ck_assert_int_eq(fkvf_reader_verify(c), FKVF_OK);
    fkvf_reader_free(c);
    /* and the damaged file itself is reported (its magic is gone), not served */
    c = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&c, path, FKVF_OPEN_READ, NULL), FKVF_E_BAD_MAGIC);
    fkvf_reader_free(c);
    unlink(path);
}
END_TEST

/* A FIFO given as the archive: refused at once as not a regular file (it
 * waited forever for a writer in open(2)); the alarm fails the test instead
 * of hanging it. The same for the validator. */
START_TEST(open_fifo_does_not_hang)
{
    char dir[] = "/tmp/fkvf-fifo-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    alarm(10);
    for (unsigned flags = 0; flags <= FKVF_OPEN_READ; flags += FKVF_OPEN_READ) {
        fkvf_reader *r = NULL;
        ck_assert_int_eq(fkvf_reader_open_file(&r, path, flags, NULL), FKVF_E_IO);
        ck_assert_ptr_nonnull(strstr(fkvf_reader_message(r), "not a regular file"));
        fkvf_reader_free(r);
    }
    ck_assert_int_eq(fkvf_validate_file(path, NULL, NULL, NULL, NULL), FKVF_E_IO);
    alarm(0);
    unlink(path);
    rmdir(dir);
}
END_TEST

START_TEST(open_read_flags)
{
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, "/nonexistent/x.fkvf", FKVF_OPEN_READ, NULL),
                     FKVF_E_IO);
    fkvf_reader_free(r);
    r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, "/tmp/x.fkvf", 4u, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("open_read");
    TCase *t = tcase_create("open_read");
    tcase_add_test(t, open_read_survives_truncation);
    tcase_add_test(t, open_read_flags);
    tcase_add_test(t, open_fifo_does_not_hang);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
