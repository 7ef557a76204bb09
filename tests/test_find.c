/* fkvf_reader_find_codebook (issue 12, item 9): the external codebook of an
 * archive looked up by content hash in the archive's directory and a search
 * path. Each test builds its files in a fresh temporary directory: a
 * codebook file, a second codebook of the same shape (other tables: another
 * hash), an archive that refers to the first by hash with a name hint, and
 * checks what is found, what is skipped and what the message names. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fkvf.h"
#include "testutil.h"

enum { L = 1, H = 2, D = 4, K = 16, N = 6, S = 1, W = 1, A = N - S - W, NS = L * H * 2 };
#define ROW_BYTES ((size_t)L * H * 2 * D * 2) /* f16 */

static fkvf_codebook_shape shape(void)
{
    fkvf_codebook_shape s;
    memset(&s, 0, sizeof s);
    s.n_layers = L;
    s.n_heads = H;
    s.key_dim = s.value_dim = D;
    s.k = K;
    s.k_stages = s.v_stages = 1;
    s.dtype = FKVF_DTYPE_F16;
    return s;
}

/* A codebook file whose tables come from `seed`: the bytes in *out, the
 * content hash in hash. */
static void make_codebook_stages(unsigned seed, uint8_t k_stages, tu_buf *out, uint8_t hash[16])
{
    fkvf_codebook_shape s = shape();
    s.k_stages = k_stages;
    size_t n = (size_t)fkvf_codebook_size(&s) - 64;
    uint16_t *t = malloc(n);
    ck_assert_ptr_nonnull(t);
    tu_rng g = {seed};
    for (size_t i = 0; i < n / 2; i++)
        t[i] = fkvf_f32_to_f16((float)tu_below(&g, 200) / 50.0f - 2.0f);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    memset(out, 0, sizeof *out);
    fkvf_sink sk = tu_buf_sink(out);
    fkvf_writer *w;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sk, &o, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &s, t, n, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
    free(t);
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, out->data, out->size, FKVF_OPEN_STRICT, NULL),
                     FKVF_OK);
    ck_assert_int_eq(fkvf_reader_codebook(r, NULL, NULL, NULL, hash), FKVF_OK);
    fkvf_reader_free(r);
}

static void make_codebook(unsigned seed, tu_buf *out, uint8_t hash[16])
{
    make_codebook_stages(seed, 1, out, hash);
}

/* An archive of N positions (S + W exact, A archived) that refers to the
 * codebook with content hash `hash` under the name hint `hint`. */
static void make_archive(const uint8_t hash[16], const char *hint, tu_buf *out)
{
    fkvf_codebook_shape s = shape();
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = L;
    d.n_kv_heads = H;
    d.key_dim = d.value_dim = D;
    d.dtype = FKVF_DTYPE_F16;
    d.n_sinks = S;
    d.window = W;
    uint16_t rows[N * ROW_BYTES / 2];
    for (size_t i = 0; i < sizeof rows / 2; i++)
        rows[i] = fkvf_f32_to_f16((float)(i % 17) / 8.0f);
    uint16_t codes[A * NS];
    for (size_t i = 0; i < A * NS; i++)
        codes[i] = (uint16_t)((i * 7 + 3) % K);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.required_features = FKVF_FEAT_EXTERNAL_CODEBOOK;
    memset(out, 0, sizeof *out);
    fkvf_sink sk = tu_buf_sink(out);
    fkvf_writer *w;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sk, &o, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_exact(w, 0, S, rows, S * ROW_BYTES, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_exact(w, N - W, W, (uint8_t *)rows + (N - W) * ROW_BYTES,
                                           W * ROW_BYTES, 0),
                     FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_codebook_ref(w, &s, hash, hint), FKVF_OK);
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.profile = FKVF_PROFILE_QUAD;
    sp.symbol_bits = 4;
    ck_assert_int_eq(fkvf_writer_add_index_segment(w, &sp, 0, A, codes, NS, 1), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_positions(w, N, A), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
}

/* ---- per-test files -------------------------------------------------------- */

static char root[64];
static tu_buf cb, cb_other, arch; /* the codebook, one of another hash, the archive */
static uint8_t cb_hash[16], other_hash[16];
static char hx[33];

static void path(char *out, size_t n, const char *rel) { snprintf(out, n, "%s/%s", root, rel); }

static void put(const char *rel, const tu_buf *b)
{
    char p[96];
    path(p, sizeof p, rel);
    tu_write_file(p, b->data, b->size);
}

static void mkd(const char *rel)
{
    char p[96];
    path(p, sizeof p, rel);
    ck_assert_int_eq(mkdir(p, 0755), 0);
}

static void setup(void)
{
    snprintf(root, sizeof root, "/tmp/fkvf-find-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
    make_codebook(1, &cb, cb_hash);
    make_codebook(2, &cb_other, other_hash);
    ck_assert(memcmp(cb_hash, other_hash, 16) != 0);
    for (int i = 0; i < 16; i++)
        snprintf(hx + 2 * i, 3, "%02x", cb_hash[i]);
    make_archive(cb_hash, "cb.fkvf", &arch);
    mkd("a");
    mkd("b");
    put("a/archive.fkvf", &arch);
}

static void teardown(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "chmod -R u+rwx %s; rm -rf %s", root, root);
    ck_assert_int_eq(system(cmd), 0);
    tu_buf_free(&cb);
    tu_buf_free(&cb_other);
    tu_buf_free(&arch);
}

static fkvf_reader *open_archive(unsigned flags)
{
    char p[96];
    path(p, sizeof p, "a/archive.fkvf");
    fkvf_reader *r;
    ck_assert_int_eq(fkvf_reader_open_file(&r, p, flags, NULL), FKVF_OK);
    return r;
}

/* An archived position restores only with the codebook attached. */
static int restore_archived(fkvf_reader *r)
{
    uint8_t row[ROW_BYTES];
    return fkvf_reader_restore(r, S, 1, FKVF_DTYPE_F16, row, sizeof row);
}

/* The codebook found is cb: its hash, and the reader names the file. */
static void assert_found(fkvf_reader *r, fkvf_reader *c, const char *rel)
{
    ck_assert_ptr_nonnull(c);
    uint8_t h[16];
    ck_assert_int_eq(fkvf_reader_codebook(r, NULL, NULL, NULL, h), FKVF_OK);
    ck_assert_mem_eq(h, cb_hash, 16);
    ck_assert_int_eq(restore_archived(r), FKVF_OK);
    char want[96];
    path(want, sizeof want, rel);
    /* the codebook reader's messages name the file it was opened from */
    ck_assert_int_ne(fkvf_reader_desc(c, &(fkvf_desc){0}), FKVF_OK);
    ck_assert_msg(strstr(fkvf_reader_message(c), want) != NULL, "%s does not name %s",
                  fkvf_reader_message(c), want);
    /* and its path is the file found (fkvf compact/unpack check it against
     * their output) */
    ck_assert_ptr_nonnull(fkvf_reader_file_name(c));
    ck_assert_str_eq(fkvf_reader_file_name(c), want);
}

static void assert_msg_has(fkvf_reader *r, const char *s)
{
    ck_assert_msg(strstr(fkvf_reader_message(r), s) != NULL, "message \"%s\" lacks \"%s\"",
                  fkvf_reader_message(r), s);
}

/* ---- tests ------------------------------------------------------------------ */

START_TEST(found_by_hint_in_archive_dir)
{
    put("a/cb.fkvf", &cb);
    fkvf_reader *r = open_archive(0), *c;
    ck_assert_int_eq(restore_archived(r), FKVF_E_CODEBOOK);
    ck_assert_int_eq(fkvf_reader_find_codebook(r, NULL, &c), FKVF_OK);
    assert_found(r, c, "a/cb.fkvf");
    /* attached already: nothing more to find */
    fkvf_reader *c2 = (fkvf_reader *)1;
    ck_assert_int_eq(fkvf_reader_find_codebook(r, NULL, &c2), FKVF_OK);
    ck_assert_ptr_null(c2);
    fkvf_reader_free(r);
    fkvf_reader_free(c);
}
END_TEST

START_TEST(found_by_hash_in_archive_dir_other_name)
{
    put("a/renamed.bin", &cb);
    put("a/notes.txt", &(tu_buf){(uint8_t *)"not a codebook", 14, 14});
    fkvf_reader *r = open_archive(FKVF_OPEN_READ), *c;
    ck_assert_int_eq(fkvf_reader_find_codebook(r, NULL, &c), FKVF_OK);
    assert_found(r, c, "a/renamed.bin");
    fkvf_reader_free(r);
    fkvf_reader_free(c);
}
END_TEST

START_TEST(found_via_search_path_by_hash)
{
    put("b/shared-codebook", &cb);
    char pb[96], sp[256];
    path(pb, sizeof pb, "b");
    /* empty entries and a missing directory before it are skipped */
    snprintf(sp, sizeof sp, "::%s/missing:%s:", root, pb);
    fkvf_reader *r = open_archive(0), *c;
    ck_assert_int_eq(fkvf_reader_find_codebook(r, sp, &c), FKVF_OK);
    assert_found(r, c, "b/shared-codebook");
    fkvf_reader_free(r);
    fkvf_reader_free(c);
}
END_TEST

START_TEST(memory_reader_uses_the_path_only)
{
    put("b/x", &cb);
    fkvf_reader *r, *c;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, arch.data, arch.size, 0, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_find_codebook(r, NULL, &c), FKVF_E_NOT_FOUND);
    ck_assert_ptr_null(c);
    assert_msg_has(r, "no directory");
    char pb[96];
    path(pb, sizeof pb, "b");
    ck_assert_int_eq(fkvf_reader_find_codebook(r, pb, &c), FKVF_OK);
    assert_found(r, c, "b/x");
    fkvf_reader_free(r);
    fkvf_reader_free(c);
}
END_TEST

START_TEST(right_name_wrong_hash_skipped)
{
    /* the hint names a codebook of the same shape with another hash */
    put("a/cb.fkvf", &cb_other);
    fkvf_reader *r = open_archive(0), *c;
    ck_assert_int_eq(fkvf_reader_find_codebook(r, NULL, &c), FKVF_E_NOT_FOUND);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(restore_archived(r), FKVF_E_CODEBOOK);
    /* the right one under another name, in the same directory, is found */
    put("a/zz-real", &cb);
    ck_assert_int_eq(fkvf_reader_find_codebook(r, NULL, &c), FKVF_OK);
    assert_found(r, c, "a/zz-real");
    fkvf_reader_free(r);
    fkvf_reader_free(c);
}
END_TEST

START_TEST(hash_match_that_does_not_fit)
{
    /* an archive whose index streams have 1 key stage, referring by hash to
     * a codebook of 2: the file is found, and refused (FKVF_E_CODEBOOK, not
     * "not found") */
    tu_buf two, x;
    uint8_t h2[16];
    make_codebook_stages(3, 2, &two, h2);
    make_archive(h2, "cb.fkvf", &x);
    put("a/archive.fkvf", &x);
    put("a/two-stages", &two);
    fkvf_reader *r = open_archive(0), *c;
    ck_assert_int_eq(fkvf_reader_find_codebook(r, NULL, &c), FKVF_E_CODEBOOK);
    ck_assert_ptr_null(c);
    assert_msg_has(r, "stages");
    ck_assert_int_eq(restore_archived(r), FKVF_E_CODEBOOK);
    fkvf_reader_free(r);
    tu_buf_free(&two);
    tu_buf_free(&x);
}
END_TEST

START_TEST(not_found_names_hash_hint_and_dirs)
{
    put("b/other", &cb_other);
    put("b/archive-copy.fkvf", &arch); /* an archive, not a codebook file */
    put("b/file", &(tu_buf){(uint8_t *)"x", 1, 1});
    char pb[96], pm[96], pf[96], sp[1024];
    path(pb, sizeof pb, "b");
    path(pm, sizeof pm, "missing");
    path(pf, sizeof pf, "b/file");
    char pa[96];
    path(pa, sizeof pa, "a");
    /* b twice (and a again via the path): each directory listed once */
    snprintf(sp, sizeof sp, "%s:%s:%s:%s:%s", pb, pm, pf, pb, pa);
    fkvf_reader *r = open_archive(0), *c;
    ck_assert_int_eq(fkvf_reader_find_codebook(r, sp, &c), FKVF_E_NOT_FOUND);
    ck_assert_ptr_null(c);
    assert_msg_has(r, hx);
    assert_msg_has(r, "\"cb.fkvf\"");
    char want[1024];
    snprintf(want, sizeof want, "%s (the archive's directory), %s, %s (missing), %s (not a directory)",
             pa, pb, pm, pf);
    assert_msg_has(r, want);
    assert_msg_has(r, "FKVF_E_NOT_FOUND");
    ck_assert_ptr_null(strstr(strstr(fkvf_reader_message(r), pf) + strlen(pf), pb));
    /* r is unchanged: a file attached by hand still works */
    fkvf_reader *m;
    ck_assert_int_eq(fkvf_reader_open_memory(&m, cb.data, cb.size, 0, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_attach_codebook(r, m), FKVF_OK);
    ck_assert_int_eq(restore_archived(r), FKVF_OK);
    fkvf_reader_free(r);
    fkvf_reader_free(m);
}
END_TEST

/* The checks of unreadable_dir_skipped, as plain C (they also run in a
 * child that gave up root): 0, or the line of the first that failed. */
static int unreadable_checks(const char *pl, const char *pb, int expect_unreadable)
{
    char sp[256];
    snprintf(sp, sizeof sp, "%s:%s", pl, pb);
    char p[96];
    path(p, sizeof p, "a/archive.fkvf");
    fkvf_reader *r = NULL, *c = NULL;
    if (fkvf_reader_open_file(&r, p, 0, NULL) != FKVF_OK)
        return __LINE__;
    if (fkvf_reader_find_codebook(r, sp, &c) != FKVF_OK || !c || restore_archived(r) != FKVF_OK)
        return __LINE__;
    char want[96];
    path(want, sizeof want, "b/copy");
    if (!fkvf_reader_file_name(c) || strcmp(fkvf_reader_file_name(c), want))
        return __LINE__;
    fkvf_reader_free(r);
    fkvf_reader_free(c);
    /* not found: the locked directory is named, as unreadable */
    if (fkvf_reader_open_file(&r, p, 0, NULL) != FKVF_OK)
        return __LINE__;
    if (fkvf_reader_find_codebook(r, pl, &c) != FKVF_E_NOT_FOUND)
        return __LINE__;
    snprintf(want, sizeof want, "%s%s", pl, expect_unreadable ? " (unreadable)" : "");
    int named = strstr(fkvf_reader_message(r), want) != NULL;
    fkvf_reader_free(r);
    return named ? 0 : __LINE__;
}

START_TEST(unreadable_dir_skipped)
{
    mkd("locked");
    put("locked/cb.fkvf", &cb_other);
    put("b/copy", &cb);
    char pl[96], pb[96];
    path(pl, sizeof pl, "locked");
    path(pb, sizeof pb, "b");
    ck_assert_int_eq(chmod(pl, 0), 0);
    if (geteuid() != 0) {
        int line = unreadable_checks(pl, pb, 1);
        ck_assert_msg(line == 0, "check at line %d failed", line);
        return;
    }
    /* root reads a directory of mode 0 anyway: run the checks as nobody
     * (the tree readable to others; the locked directory not) */
    ck_assert_int_eq(chmod(root, 0755), 0);
    char a[96];
    path(a, sizeof a, "a/archive.fkvf");
    char bc[96];
    path(bc, sizeof bc, "b/copy");
    ck_assert_int_eq(chmod(a, 0644), 0);
    ck_assert_int_eq(chmod(bc, 0644), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0)
            _exit(255); /* cannot give up root here */
        int line = unreadable_checks(pl, pb, 1);
        _exit(line ? (line & 0x7F) | 0x80 : 0);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    if (WEXITSTATUS(status) == 255) {
        /* no other user to become: the weaker check (listed, read anyway) */
        int line = unreadable_checks(pl, pb, 0);
        ck_assert_msg(line == 0, "check at line %d failed", line);
        return;
    }
    ck_assert_msg(WEXITSTATUS(status) == 0, "a check as nobody failed (line & 127 = %d)",
                  WEXITSTATUS(status) & 0x7F);
}
END_TEST

START_TEST(hint_never_leaves_the_directory)
{
    /* hints that are paths: the file they name exists but is not looked at */
    const char *hints[] = {"../cb.fkvf", "sub/cb.fkvf", "..", "."};
    mkd("a/sub");
    put("cb.fkvf", &cb);
    put("a/sub/cb.fkvf", &cb);
    for (size_t i = 0; i < sizeof hints / sizeof *hints; i++) {
        tu_buf x;
        make_archive(cb_hash, hints[i], &x);
        put("a/archive.fkvf", &x);
        tu_buf_free(&x);
        fkvf_reader *r = open_archive(0), *c;
        ck_assert_int_eq(fkvf_reader_find_codebook(r, NULL, &c), FKVF_E_NOT_FOUND);
        ck_assert_ptr_null(c);
        /* the directory where the hint would lead, when on the path: found
         * there by its hash */
        ck_assert_int_eq(fkvf_reader_find_codebook(r, root, &c), FKVF_OK);
        assert_found(r, c, "cb.fkvf");
        fkvf_reader_free(r);
        fkvf_reader_free(c);
    }
}
END_TEST

START_TEST(symlinks_and_fifos_not_followed)
{
    char pb[96], pl[96], pf[96];
    put("b/real", &cb);
    path(pb, sizeof pb, "b/real");
    path(pl, sizeof pl, "a/cb.fkvf");
    ck_assert_int_eq(symlink(pb, pl), 0);
    path(pf, sizeof pf, "a/fifo");
    ck_assert_int_eq(mkfifo(pf, 0644), 0); /* opening it for reading would block */
    fkvf_reader *r = open_archive(0), *c;
    ck_assert_int_eq(fkvf_reader_find_codebook(r, NULL, &c), FKVF_E_NOT_FOUND);
    /* the directory of the link's target, on the path */
    char pd[96];
    path(pd, sizeof pd, "b");
    ck_assert_int_eq(fkvf_reader_find_codebook(r, pd, &c), FKVF_OK);
    assert_found(r, c, "b/real");
    fkvf_reader_free(r);
    fkvf_reader_free(c);
}
END_TEST

START_TEST(nothing_to_find)
{
    /* a codebook file (no CBRF) and an archive with an embedded codebook */
    fkvf_reader *r, *c = (fkvf_reader *)1;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, cb.data, cb.size, 0, NULL), FKVF_OK);
    ck_assert_int_eq(fkvf_reader_find_codebook(r, "/nonexistent", &c), FKVF_OK);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(fkvf_reader_find_codebook(r, NULL, NULL), FKVF_E_INVALID_ARG);
    fkvf_reader_free(r);
    ck_assert_int_eq(fkvf_reader_find_codebook(NULL, NULL, &c), FKVF_E_STATE);
    ck_assert_ptr_null(c);
}
END_TEST

START_TEST(many_dirs_message_bounded)
{
    /* a search path of 300 missing directories: the message stays one
     * bounded line and says how many it left out */
    size_t cap = 300 * 80;
    char *sp = malloc(cap);
    ck_assert_ptr_nonnull(sp);
    size_t n = 0;
    for (int i = 0; i < 300; i++)
        n += (size_t)snprintf(sp + n, cap - n, "%s/missing-%03d:", root, i);
    fkvf_reader *r = open_archive(0), *c;
    ck_assert_int_eq(fkvf_reader_find_codebook(r, sp, &c), FKVF_E_NOT_FOUND);
    assert_msg_has(r, " more");
    ck_assert_uint_lt(strlen(fkvf_reader_message(r)), 1024);
    free(sp);
    fkvf_reader_free(r);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("find_codebook");
    TCase *t = tcase_create("find");
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, found_by_hint_in_archive_dir);
    tcase_add_test(t, found_by_hash_in_archive_dir_other_name);
    tcase_add_test(t, found_via_search_path_by_hash);
    tcase_add_test(t, memory_reader_uses_the_path_only);
    tcase_add_test(t, right_name_wrong_hash_skipped);
    tcase_add_test(t, hash_match_that_does_not_fit);
    tcase_add_test(t, not_found_names_hash_hint_and_dirs);
    tcase_add_test(t, unreadable_dir_skipped);
    tcase_add_test(t, hint_never_leaves_the_directory);
    tcase_add_test(t, symlinks_and_fifos_not_followed);
    tcase_add_test(t, nothing_to_find);
    tcase_add_test(t, many_dirs_message_bounded);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
