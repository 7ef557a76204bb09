/* Archives larger than the address space (issue 20). On a 32-bit build
 * (4-byte size_t) a file over 4 GiB can be neither mapped nor read into
 * memory: every entry point that opens an archive by path must refuse it
 * with FKVF_E_LIMIT and a message naming its size, not wrap the size (a
 * file of 4 GiB + 64 bytes taken for its 64-byte header) and not fail in
 * fstat with EOVERFLOW (a build without large-file support). The file is
 * sparse: a real header, a hole, one written byte at the end. A 64-bit
 * build maps it and looks for a commit through 4 GiB of zeros (33 s on
 * x86-64), so there the test only checks that the file can be made:
 * scripts/test-cross.sh runs it on i686. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fkvf.h"
#include "testutil.h"

#define BIG_SIZE ((UINT64_C(1) << 32) + 64) /* wraps to the header's 64 bytes */
#define BIG_DIGITS "4294967360"

static char dir[64], path[96];

/* The header of the committed sample archive, then a hole to BIG_SIZE.
 * Skips (returns 0) where the file system cannot hold such a file. */
static int make_big(void)
{
    snprintf(dir, sizeof dir, "%s", "/tmp/fkvf-large-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/big.fkvf", dir);
    char sample[512];
    snprintf(sample, sizeof sample, "%s/testdata/sample.fkvf",
             getenv("FKVF_SRCDIR") ? getenv("FKVF_SRCDIR") : ".");
    size_t n = 0;
    uint8_t *s = tu_slurp(sample, &n);
    ck_assert_uint_ge(n, 64);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, s, 64), 64);
    free(s);
    /* off_t is 64 bits in every build (_FILE_OFFSET_BITS=64, CMakeLists.txt) */
    ck_assert_uint_eq(sizeof(off_t), 8);
    int ok = pwrite(fd, "", 1, (off_t)(BIG_SIZE - 1)) == 1;
    if (!ok)
        fprintf(stderr, "test_large_file: cannot write a %s-byte sparse file in /tmp (%s): skipped\n",
                BIG_DIGITS, strerror(errno));
    ck_assert_int_eq(close(fd), 0);
    return ok;
}

static void remove_big(void)
{
    unlink(path);
    rmdir(dir);
}

static int addr32(void) { return SIZE_MAX <= UINT32_MAX; }

START_TEST(big_file_refused_by_32_bit_builds)
{
    if (!make_big()) {
        remove_big();
        return;
    }
    if (!addr32()) {
        fprintf(stderr, "test_large_file: a %zu-bit build maps the file: not opened\n",
                sizeof(size_t) * 8);
        remove_big();
        return;
    }
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_file(&r, path, 0, NULL);
    const char *msg = r ? fkvf_reader_message(r) : "";
    ck_assert_msg(rc == FKVF_E_LIMIT, "32-bit open: rc %d (%s)", rc, msg);
    ck_assert_msg(strstr(msg, BIG_DIGITS) != NULL, "message without the size: %s", msg);
    fkvf_reader_free(r);
    {
        /* the read-into-memory mode and the other entry points by path */
        r = NULL;
        rc = fkvf_reader_open_file(&r, path, FKVF_OPEN_READ, NULL);
        ck_assert_msg(rc == FKVF_E_LIMIT, "FKVF_OPEN_READ: rc %d (%s)", rc,
                      r ? fkvf_reader_message(r) : "");
        fkvf_reader_free(r);
        fkvf_appender *a = NULL;
        fkvf_append_options o;
        fkvf_append_options_init(&o);
        rc = fkvf_appender_open(&a, path, &o, NULL);
        ck_assert_msg(rc == FKVF_E_LIMIT, "appender: rc %d (%s)", rc,
                      a ? fkvf_appender_message(a) : "");
        fkvf_appender_free(a);
        fkvf_validate_result res;
        rc = fkvf_validate_file(path, NULL, NULL, NULL, &res);
        ck_assert_msg(rc == FKVF_E_LIMIT, "validate: rc %d", rc);
    }
    remove_big();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("large_file");
    TCase *tc = tcase_create("large_file");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, big_file_refused_by_32_bit_builds);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
