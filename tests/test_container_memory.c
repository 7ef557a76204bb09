/* Container tests, memory: buffers at odd addresses, and every allocation failing in open, read, write and create.
 * The archive model and the hand-crafting helpers are in container_model.h.
 *
 * Hot loops use EXPECT (an `if` around ck_abort_msg) instead of ck_assert:
 * Check records the location of every passing ck_assert, which is slow in
 * loops of tens of thousands of iterations. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "codec/codec.h"
#include "fkvf.h"
#include "format/format.h"
#include "container_model.h"
#include "testutil.h"

/* ==== 7. odd addresses ========================================================== */

START_TEST(odd_address_buffers)
{
    model m;
    model_many(&m, FKVF_DTYPE_BF16);
    tu_buf b;
    build(&m, &b);
    uint8_t *odd = tu_dup_odd(b.data, b.size);
    ck_assert_ptr_nonnull(odd);
    ck_assert_uint_eq((uintptr_t)odd % 2, 1);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, odd, b.size, 0, NULL));
    check_model(r, &m, odd, b.size);
    fkvf_reader_free(r);
    tu_free_odd(odd);
    /* and the small archive */
    model m2;
    model_small(&m2);
    tu_buf b2;
    build(&m2, &b2);
    odd = tu_dup_odd(b2.data, b2.size);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, odd, b2.size, 0, NULL));
    check_model(r, &m2, odd, b2.size);
    fkvf_reader_free(r);
    tu_free_odd(odd);
    tu_buf_free(&b2);
    model_free(&m2);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* ==== 8. allocation failure ======================================================= */

/* Read everything; the first error. */
static int read_everything(fkvf_reader *r)
{
    int rc;
    fkvf_archive_info ai;
    if ((rc = fkvf_reader_info(r, &ai)))
        return rc;
    fkvf_desc d;
    if (ai.has_desc && (rc = fkvf_reader_desc(r, &d)))
        return rc;
    size_t n;
    if ((rc = fkvf_reader_meta_count(r, &n)))
        return rc;
    for (size_t i = 0; i < n; i++) {
        fkvf_meta_entry e;
        if ((rc = fkvf_reader_meta(r, i, &e)))
            return rc;
    }
    fkvf_meta_entry e;
    if ((rc = fkvf_reader_meta_find(r, "blob", &e)) && rc != FKVF_E_NOT_FOUND)
        return rc;
    for (uint64_t p = 0; p < ai.n_positions; p++) {
        int is;
        const void *row;
        size_t rb;
        if ((rc = fkvf_reader_is_exact(r, p, &is)))
            return rc;
        if (is && (rc = fkvf_reader_exact_row(r, p, &row, &rb)))
            return rc;
    }
    for (size_t s = 0; s < ai.n_streams; s++) {
        fkvf_stream_info si;
        if ((rc = fkvf_reader_stream_info(r, s, &si)))
            return rc;
        uint32_t *out = malloc((size_t)si.length * sizeof *out + 4);
        rc = fkvf_reader_stream_read(r, s, 0, out, (size_t)si.length);
        free(out);
        if (rc)
            return rc;
        for (uint64_t t = 0; t < si.length; t++) {
            fkvf_point pt;
            if ((rc = fkvf_reader_stream_point(r, s, t, &pt)))
                return rc;
        }
    }
    for (size_t i = 0; i < ai.n_sections; i++) {
        const void *p;
        if ((rc = fkvf_reader_section_data(r, i, &p, &n)))
            return rc;
    }
    fkvf_codebook_shape cs;
    const void *cp;
    uint8_t h[16];
    if ((rc = fkvf_reader_codebook(r, &cs, &cp, &n, h)) && rc != FKVF_E_NOT_FOUND)
        return rc;
    return fkvf_reader_verify(r);
}

static void alloc_failure_reader(const uint8_t *data, size_t size, const char *path, int sticky)
{
    long k;
    for (k = 1;; k++) {
        /* the k-th allocation fails (and every later one if sticky); fresh
         * blocks are garbage (0xA5) with a NUL byte after them */
        tu_alloc f = {.fail_at = k, .fail_after = sticky, .fill = 1};
        fkvf_allocator a = tu_alloc_hook(&f);
        fkvf_reader *r = NULL;
        int rc = path ? fkvf_reader_open_file(&r, path, 0, &a)
                      : fkvf_reader_open_memory(&r, data, size, 0, &a);
        if (rc == FKVF_OK)
            rc = read_everything(r);
        EXPECTF(rc == FKVF_OK || rc == FKVF_E_NOMEM, "k=%ld sticky=%d: %s (%s)", k, sticky,
                fkvf_error_name(rc), fkvf_reader_message(r));
        EXPECTF(rc == FKVF_OK || f.failed, "k=%ld: error without an allocation failure", k);
        if (rc == FKVF_E_NOMEM && r)
            EXPECTF(strlen(fkvf_reader_message(r)) > 0, "k=%ld: NOMEM without a message", k);
        fkvf_reader_free(r);
        EXPECTF(f.live == 0, "k=%ld sticky=%d: %ld blocks leaked", k, sticky, f.live);
        if (!f.failed) {
            EXPECT(rc == FKVF_OK);
            break;
        }
    }
    ck_assert_int_gt(k, 5); /* the reader does allocate */
}

START_TEST(alloc_failure_open_and_read)
{
    model m;
    model_small(&m);
    m.opts.required_features |= FKVF_FEAT_DEFLATE;
    m.exac_flags = FKVF_SECTION_DEFLATE;
    m.extra = 1;
    tu_buf b;
    build(&m, &b);
    alloc_failure_reader(b.data, b.size, NULL, 0);
    alloc_failure_reader(b.data, b.size, NULL, 1);
    char *dir = make_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/f.fkvf", dir);
    tu_write_file(path, b.data, b.size);
    alloc_failure_reader(NULL, 0, path, 0);
    rm_tmpdir(dir);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(alloc_failure_write)
{
    model m;
    model_small(&m);
    m.opts.required_features |= FKVF_FEAT_DEFLATE;
    m.exac_flags = FKVF_SECTION_DEFLATE;
    m.extra = 1;
    tu_buf ref;
    build(&m, &ref);
    for (int sticky = 0; sticky < 2; sticky++) {
        long k;
        for (k = 1;; k++) {
            tu_alloc f = {.fail_at = k, .fail_after = sticky, .fill = 1};
            fkvf_allocator a = tu_alloc_hook(&f);
            tu_buf b;
            memset(&b, 0, sizeof b);
            fkvf_sink sink = tu_buf_sink(&b);
            fkvf_writer *w = NULL;
            int rc = fkvf_writer_create_sink(&w, &sink, &m.opts, &a);
            if (rc == FKVF_OK)
                rc = write_model(&m, w);
            EXPECTF(rc == FKVF_OK || rc == FKVF_E_NOMEM, "k=%ld: %s (%s)", k,
                    fkvf_error_name(rc), fkvf_writer_message(w));
            if (rc == FKVF_OK) /* no silently dropped content */
                EXPECTF(b.size == ref.size && memcmp(b.data, ref.data, b.size) == 0,
                        "k=%ld: output differs", k);
            else if (w)
                EXPECT(strlen(fkvf_writer_message(w)) > 0);
            fkvf_writer_free(w);
            EXPECTF(f.live == 0, "k=%ld: %ld blocks leaked", k, f.live);
            tu_buf_free(&b);
            if (!f.failed) {
                EXPECT(rc == FKVF_OK);
                break;
            }
        }
        ck_assert_int_gt(k, 5);
    }
    tu_buf_free(&ref);
    model_free(&m);
}
END_TEST

/* Bug guard: when the path copy failed but the temp-path buffer was
 * allocated, fkvf_writer_free read the uninitialized temp path and passed
 * it to unlink(). The trap file is named like the garbage our allocator
 * leaves in fresh blocks. */
START_TEST(alloc_failure_create_file_leaves_nothing)
{
    model m;
    model_small(&m);
    tu_buf ref;
    build(&m, &ref);
    char *dir = make_tmpdir();
    int cwd = open(".", O_RDONLY);
    ck_assert_int_ge(cwd, 0);
    ck_assert_int_eq(chdir(dir), 0);
    const char *path = "w.fkvf"; /* relative: the temp path has 6 + 16 bytes */
    char trap[6 + 16 + 1];
    memset(trap, 0xA5, 6 + 16);
    trap[6 + 16] = 0;
    tu_write_file(trap, "trap", 4);
    for (int sticky = 0; sticky < 2; sticky++) {
        long k;
        for (k = 1;; k++) {
            tu_alloc f = {.fail_at = k, .fail_after = sticky, .fill = 1};
            fkvf_allocator a = tu_alloc_hook(&f);
            fkvf_writer *w = NULL;
            int rc = fkvf_writer_create_file(&w, path, &m.opts, &a);
            if (rc == FKVF_OK)
                rc = write_model(&m, w);
            EXPECTF(rc == FKVF_OK || rc == FKVF_E_NOMEM, "k=%ld: %s", k, fkvf_error_name(rc));
            fkvf_writer_free(w);
            EXPECTF(f.live == 0, "k=%ld: %ld blocks leaked", k, f.live);
            EXPECTF(path_exists(trap), "k=%ld: writer_free unlinked an unrelated file", k);
            if (rc == FKVF_OK) {
                size_t n;
                uint8_t *got = tu_slurp(path, &n);
                EXPECT(n == ref.size && memcmp(got, ref.data, n) == 0);
                free(got);
                unlink(path);
            }
            EXPECTF(dir_entries(".") == 1, "k=%ld: %zu files in the directory", k,
                    dir_entries("."));
            if (!f.failed)
                break;
        }
    }
    ck_assert_int_eq(fchdir(cwd), 0);
    close(cwd);
    rm_tmpdir(dir);
    tu_buf_free(&ref);
    model_free(&m);
}
END_TEST

/* ==== suite ====================================================================== */

int main(void)
{
    Suite *s = suite_create("container_memory");
    TCase *t = tcase_create("memory");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, odd_address_buffers);
    tcase_add_test(t, alloc_failure_open_and_read);
    tcase_add_test(t, alloc_failure_write);
    tcase_add_test(t, alloc_failure_create_file_leaves_nothing);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
