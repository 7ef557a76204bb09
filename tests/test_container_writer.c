/* Container tests, the writer: determinism, atomic create, no-replace, file modes, and every inconsistent archive it refuses.
 * The archive model and the hand-crafting helpers are in container_model.h.
 *
 * Hot loops use EXPECT (an `if` around ck_abort_msg) instead of ck_assert:
 * Check records the location of every passing ck_assert, which is slow in
 * loops of tens of thousands of iterations. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include "codec/codec.h"
#include "fkvf.h"
#include "format/format.h"
#include "container_model.h"
#include "testutil.h"

/* ==== 2. writer determinism and atomic create ===================================== */

START_TEST(writer_is_deterministic_through_sink)
{
    model m;
    model_many(&m, FKVF_DTYPE_F32);
    tu_buf a, b;
    build(&m, &a);
    build(&m, &b);
    ck_assert_uint_eq(a.size, b.size);
    ck_assert(memcmp(a.data, b.data, a.size) == 0);
    tu_buf_free(&a);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(writer_is_deterministic_through_file)
{
    model m;
    model_small(&m);
    char *dir = make_tmpdir();
    char p1[600], p2[600];
    snprintf(p1, sizeof p1, "%s/one.fkvf", dir);
    snprintf(p2, sizeof p2, "%s/two.fkvf", dir);
    const char *paths[2] = {p1, p2};
    for (int i = 0; i < 2; i++) {
        fkvf_writer *w = NULL;
        m.opts.sync = i ? FKVF_SYNC_NONE : FKVF_SYNC_COMMIT; /* the sync path must not change the bytes */
        OK_W(w, fkvf_writer_create_file(&w, paths[i], &m.opts, NULL));
        OK_W(w, write_model(&m, w));
        fkvf_writer_free(w);
    }
    size_t n1, n2;
    uint8_t *f1 = tu_slurp(p1, &n1), *f2 = tu_slurp(p2, &n2);
    ck_assert_uint_eq(n1, n2);
    ck_assert(memcmp(f1, f2, n1) == 0);
    tu_buf b;
    build(&m, &b);
    ck_assert_uint_eq(b.size, n1);
    ck_assert(memcmp(b.data, f1, n1) == 0);
    ck_assert_uint_eq(dir_entries(dir), 2); /* no temp files left */
    tu_buf_free(&b);
    free(f1);
    free(f2);
    rm_tmpdir(dir);
    model_free(&m);
}
END_TEST

START_TEST(writer_create_file_is_atomic)
{
    model m;
    model_small(&m);
    char *dir = make_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/atomic.fkvf", dir);

    /* abandoned before finish: neither the file nor a temp file remains */
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_file(&w, path, &m.opts, NULL));
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    ck_assert(!path_exists(path));
    ck_assert_uint_eq(dir_entries(dir), 1); /* the temp file */
    fkvf_writer_free(w);
    ck_assert(!path_exists(path));
    ck_assert_uint_eq(dir_entries(dir), 0);

    /* a failed finish (inconsistent archive) leaves nothing behind either */
    w = NULL;
    OK_W(w, fkvf_writer_create_file(&w, path, &m.opts, NULL));
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_set_positions(w, 10, 5));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    ck_assert(!path_exists(path));
    fkvf_writer_free(w);
    ck_assert_uint_eq(dir_entries(dir), 0);

    /* finished: the file exists under its name only, and opens */
    w = NULL;
    OK_W(w, fkvf_writer_create_file(&w, path, &m.opts, NULL));
    OK_W(w, write_model(&m, w));
    ck_assert(path_exists(path));
    ck_assert_uint_eq(dir_entries(dir), 1);
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE); /* finished once */
    RC_W(w, fkvf_writer_meta_u64(w, "late", 1), FKVF_E_STATE);
    fkvf_writer_free(w);
    ck_assert(path_exists(path));
    ck_assert_uint_eq(dir_entries(dir), 1);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL));
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    check_model(r, &m, NULL, (size_t)st.st_size);
    fkvf_reader_free(r);

    /* replacing an existing file is atomic too: the old one stays until finish */
    w = NULL;
    model m2;
    model_all_exact(&m2);
    OK_W(w, fkvf_writer_create_file(&w, path, &m2.opts, NULL));
    OK_W(w, fkvf_writer_set_desc(w, &m2.desc));
    r = NULL;
    OK_R(r, fkvf_reader_open_file(&r, path, 0, NULL));
    fkvf_reader_free(r);
    fkvf_writer_free(w);
    r = NULL;
    OK_R(r, fkvf_reader_open_file(&r, path, 0, NULL));
    check_model(r, &m, NULL, (size_t)st.st_size);
    fkvf_reader_free(r);
    ck_assert_uint_eq(dir_entries(dir), 1);

    /* a directory that does not exist: IO, message, nothing created */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/missing/x.fkvf", dir);
    w = NULL;
    ck_assert_int_eq(fkvf_writer_create_file(&w, bad, &m.opts, NULL), FKVF_E_IO);
    ck_assert_ptr_nonnull(w);
    ck_assert(strlen(fkvf_writer_message(w)) > 0);
    fkvf_writer_free(w);
    ck_assert_uint_eq(dir_entries(dir), 1);

    model_free(&m2);
    rm_tmpdir(dir);
    model_free(&m);
}
END_TEST

/* fkvf_writer_options.no_replace: an existing PATH is never replaced, not
 * even one that appears while the file is written (another process). */
START_TEST(writer_no_replace_keeps_existing_file)
{
    model m;
    model_small(&m);
    char *dir = make_tmpdir();
    char path[600], link_path[620];
    snprintf(path, sizeof path, "%s/keep.fkvf", dir);
    fkvf_writer_options o = m.opts;
    o.no_replace = 1;
    static const char other[] = "someone else's file\n";
    fkvf_error_info e;

    /* PATH exists at create: FKVF_E_EXISTS, nothing written */
    tu_write_file(path, other, sizeof other);
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_file(&w, path, &o, NULL), FKVF_E_EXISTS);
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(fkvf_writer_error(w, &e), FKVF_OK);
    ck_assert_int_eq(e.code, FKVF_E_EXISTS);
    ck_assert_str_eq(e.file, path);
    ck_assert(e.offset == FKVF_ERROR_NO_OFFSET && e.clause == NULL);
    ck_assert_str_eq(e.message, fkvf_writer_message(w));
    fkvf_writer_free(w);
    ck_assert_uint_eq(dir_entries(dir), 1);

    /* a dangling symbolic link is a file at PATH too (rename would replace it) */
    snprintf(link_path, sizeof link_path, "%s/dangling.fkvf", dir);
    ck_assert_int_eq(symlink("no-such-target", link_path), 0);
    w = NULL;
    ck_assert_int_eq(fkvf_writer_create_file(&w, link_path, &o, NULL), FKVF_E_EXISTS);
    fkvf_writer_free(w);
    ck_assert_int_eq(unlink(link_path), 0);

    /* PATH appears between create and finish: finish refuses, the other
     * file keeps its bytes, the temporary file goes away with free() */
    ck_assert_int_eq(unlink(path), 0);
    w = NULL;
    OK_W(w, fkvf_writer_create_file(&w, path, &o, NULL));
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    tu_write_file(path, other, sizeof other);
    OK_W(w, fkvf_writer_set_positions(w, 0, 0));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_EXISTS);
    ck_assert_int_eq(fkvf_writer_error(w, &e), FKVF_OK);
    ck_assert_int_eq(e.code, FKVF_E_EXISTS);
    fkvf_writer_free(w);
    size_t n;
    uint8_t *got = tu_slurp(path, &n);
    ck_assert_uint_eq(n, sizeof other);
    ck_assert(!memcmp(got, other, n));
    free(got);
    ck_assert_uint_eq(dir_entries(dir), 1);

    /* no file at PATH: the archive is put in place under its name only */
    ck_assert_int_eq(unlink(path), 0);
    w = NULL;
    OK_W(w, fkvf_writer_create_file(&w, path, &o, NULL));
    OK_W(w, write_model(&m, w));
    fkvf_writer_free(w);
    ck_assert_uint_eq(dir_entries(dir), 1);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL));
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_nlink, 1);
    check_model(r, &m, NULL, (size_t)st.st_size);
    fkvf_reader_free(r);

    /* the default replaces it */
    fkvf_writer_options_init(&o);
    ck_assert_int_eq(o.no_replace, 0);
    rm_tmpdir(dir);
    model_free(&m);
}
END_TEST

/* The mode of a written file: 0666 less the umask by default (as open(2)
 * and fopen give; it was always 0644), or exactly opts.mode. Each umask in a
 * child process (the umask is per process). */
static unsigned written_mode(const char *path, unsigned umask_bits, unsigned opt_mode)
{
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        umask((mode_t)umask_bits);
        model m;
        model_small(&m);
        fkvf_writer_options o = m.opts;
        o.mode = opt_mode;
        fkvf_writer *w = NULL;
        unlink(path);
        if (fkvf_writer_create_file(&w, path, &o, NULL) != FKVF_OK || write_model(&m, w) != FKVF_OK)
            _exit(1);
        fkvf_writer_free(w);
        model_free(&m);
        _exit(0);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return (unsigned)st.st_mode & 07777;
}

START_TEST(writer_file_mode)
{
    char *dir = make_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/mode.fkvf", dir);
    ck_assert_uint_eq(written_mode(path, 077, 0), 0600);
    ck_assert_uint_eq(written_mode(path, 022, 0), 0644);
    ck_assert_uint_eq(written_mode(path, 002, 0), 0664);
    /* opts.mode: exactly these bits, whatever the umask */
    ck_assert_uint_eq(written_mode(path, 022, 0600), 0600);
    ck_assert_uint_eq(written_mode(path, 077, 0640), 0640);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    ck_assert_uint_eq(o.mode, 0);
    unlink(path);
    rm_tmpdir(dir);
}
END_TEST

/* The fields of fkvf_reader_error / fkvf_appender_error on known-corrupt
 * files of the conformance suite: the class and clause its manifest lists,
 * and the offset of the field the spec's header table places the fault in
 * (hdr_byte_order: byte_order at offset 16; hdr_major_2: format_major at
 * offset 10, spec 3). */
START_TEST(error_info_of_conformance_files)
{
    const char *src = getenv("FKVF_SRCDIR");
    ck_assert_msg(src != NULL, "FKVF_SRCDIR not set");
    static const struct {
        const char *name;
        uint64_t offset;
    } cases[] = {{"hdr_byte_order.fkvf", 16}, {"hdr_major_2.fkvf", 10}};
    char path[1024];
    snprintf(path, sizeof path, "%s/conformance/manifest.tsv", src);
    size_t msize;
    uint8_t *mtext = tu_slurp(path, &msize);
    char *manifest = realloc(mtext, msize + 1);
    ck_assert_ptr_nonnull(manifest);
    manifest[msize] = 0;
    char *dir = make_tmpdir();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* the manifest row: name, verify, open, class, clause, ... */
        char key[128];
        snprintf(key, sizeof key, "\n%s\t", cases[i].name);
        char *row = strstr(manifest, key);
        ck_assert_msg(row != NULL, "%s not in the manifest", cases[i].name);
        char cls[32], clause[64];
        ck_assert_int_eq(sscanf(row + 1, "%*[^\t]\t%*[^\t]\t%*[^\t]\t%31[^\t]\t%63[^\t]", cls,
                                clause),
                         2);
        char want_name[48];
        snprintf(want_name, sizeof want_name, "FKVF_E_%s", cls);

        snprintf(path, sizeof path, "%s/conformance/files/%s", src, cases[i].name);
        fkvf_reader *r = NULL;
        int rc = fkvf_reader_open_file(&r, path, 0, NULL);
        ck_assert_str_eq(fkvf_error_name(rc), want_name);
        fkvf_error_info e;
        ck_assert_int_eq(fkvf_reader_error(r, &e), FKVF_OK);
        ck_assert_int_eq(e.code, rc);
        ck_assert_uint_eq(e.offset, cases[i].offset);
        ck_assert_ptr_nonnull(e.clause);
        /* "3.1" is the clause of "§3.1 step 4" */
        char cited[32];
        snprintf(cited, sizeof cited, "\xc2\xa7%s", e.clause);
        ck_assert_msg(!strncmp(clause, cited, strlen(cited)) &&
                          (clause[strlen(cited)] == ' ' || clause[strlen(cited)] == ',' ||
                           !clause[strlen(cited)]),
                      "%s: clause %s, the manifest has %s", cases[i].name, e.clause, clause);
        ck_assert_str_eq(e.file, path);
        ck_assert_str_eq(e.message, fkvf_reader_message(r));
        fkvf_reader_free(r);

        /* the appender keeps the fields of the reader's error */
        size_t n;
        uint8_t *bytes = tu_slurp(path, &n);
        char copy[700];
        snprintf(copy, sizeof copy, "%s/%s", dir, cases[i].name);
        tu_write_file(copy, bytes, n);
        free(bytes);
        fkvf_appender *a = NULL;
        ck_assert_int_eq(fkvf_appender_open(&a, copy, NULL, NULL), rc);
        ck_assert_ptr_nonnull(a);
        ck_assert_int_eq(fkvf_appender_error(a, &e), FKVF_OK);
        ck_assert_int_eq(e.code, rc);
        ck_assert_uint_eq(e.offset, cases[i].offset);
        ck_assert_ptr_nonnull(e.clause);
        ck_assert_msg(!strncmp(clause, cited, strlen(cited)), "appender: clause %s", e.clause);
        fkvf_appender_free(a);
    }
    free(manifest);
    rm_tmpdir(dir);
}
END_TEST

/* ==== 3. the writer refuses inconsistent archives ================================= */

START_TEST(writer_refuses_stream_length_mismatch)
{
    model m;
    model_small(&m);
    m.st[0].n = 4; /* the index segment: n_archived is 5 */
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    RC_W(w, write_model(&m, w), FKVF_E_STATE);
    assert_msg_names(w, "index streams have 4 symbols");
    assert_msg_names(w, "11.6");
    fkvf_writer_free(w);
    tu_buf_free(&b);
    /* the token stream must have n_positions symbols */
    m.st[0].n = 5;
    model_token_stream(&m)->n = 5;
    w = new_writer(&b, &m.opts);
    RC_W(w, write_model(&m, w), FKVF_E_STATE);
    assert_msg_names(w, "token stream has 5 symbols");
    fkvf_writer_free(w);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(writer_refuses_uncovered_exact_position)
{
    model m;
    model_small(&m);
    m.split_tail = 0;
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_add_exact(w, 0, 2, m.rows, 2 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_add_exact(w, 7, 2, m.rows, 2 * m.row_bytes, 0)); /* 9 missing */
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    OK_W(w, write_streams(&m, w));
    OK_W(w, fkvf_writer_set_positions(w, 10, 5));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    assert_msg_names(w, "exact position 9");
    /* still open: add the row and finish */
    OK_W(w, fkvf_writer_add_exact(w, 9, 1, m.rows + 9 * m.row_bytes, m.row_bytes, 0));
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);

    /* a sink position uncovered */
    w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_add_exact(w, 1, 1, m.rows, m.row_bytes, 0));
    OK_W(w, fkvf_writer_set_positions(w, 2, 0));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    assert_msg_names(w, "exact position 0");
    fkvf_writer_free(w);
    tu_buf_free(&b);

    /* n_archived that does not fit after the sinks (index streams of 2
     * symbols, 2 sinks, 3 positions) */
    w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    OK_W(w, write_index_segment(&m, w, 0, 2));
    OK_W(w, fkvf_writer_add_exact(w, 0, 3, m.rows, 3 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_set_positions(w, 3, 2));
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    assert_msg_names(w, "n_archived");
    fkvf_writer_free(w);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(writer_refuses_duplicate_and_reserved_meta_keys)
{
    tu_buf b;
    fkvf_writer *w = new_writer(&b, NULL);
    OK_W(w, fkvf_writer_meta_u64(w, "k", 1));
    RC_W(w, fkvf_writer_meta_u64(w, "k", 1), FKVF_E_DUP_KEY);
    assert_msg_names(w, "\"k\"");
    RC_W(w, fkvf_writer_meta_utf8(w, "k", "x"), FKVF_E_DUP_KEY); /* any type */
    OK_W(w, fkvf_writer_meta_u64(w, "kk", 1));                   /* prefix is fine */
    RC_W(w, fkvf_writer_meta_bool(w, "fkvf.version", 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "fkvf.");
    RC_W(w, fkvf_writer_meta_u64(w, "fkvf.", 1), FKVF_E_INVALID_ARG);
    OK_W(w, fkvf_writer_meta_u64(w, "fkvf", 1)); /* not the reserved prefix */
    OK_W(w, fkvf_writer_meta_u64(w, "FKVF.x", 1));
    RC_W(w, fkvf_writer_meta_u64(w, "", 1), FKVF_E_INVALID_ARG);
    char long_key[300];
    memset(long_key, 'a', sizeof long_key);
    long_key[256] = 0;
    RC_W(w, fkvf_writer_meta_u64(w, long_key, 1), FKVF_E_INVALID_ARG);
    long_key[255] = 0;
    OK_W(w, fkvf_writer_meta_u64(w, long_key, 1)); /* 255 bytes is the maximum */
    RC_W(w, fkvf_writer_meta_u64(w, "bad\xC0\x80", 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_meta_utf8(w, "v", "\xED\xA0\x80"), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_meta_u64(w, NULL, 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_meta_bytes(w, "nb", NULL, 3), FKVF_E_INVALID_ARG);
    /* without a descriptor the file must be a codebook file (spec 13.4):
     * metadata alone is refused, a codebook makes it valid */
    RC_W(w, fkvf_writer_finish(w), FKVF_E_STATE);
    assert_msg_names(w, "13.4");
    fkvf_desc sd;
    simple_desc(&sd);
    fkvf_codebook_shape cs;
    shape_for(&cs, &sd, 16, 1, 0, FKVF_DTYPE_F16, 0);
    size_t tn;
    uint8_t *tables = make_tables(&cs, 1, &tn);
    OK_W(w, fkvf_writer_add_codebooks(w, &cs, tables, tn, 0));
    free(tables);
    /* the refused calls left nothing behind: the file holds 5 entries */
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    size_t n;
    OK_R(r, fkvf_reader_meta_count(r, &n));
    ck_assert_uint_eq(n, 5);
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_int_eq(ai.has_desc, 0);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);
}
END_TEST

START_TEST(writer_refuses_ngon_without_feature)
{
    model m;
    model_small(&m); /* ngon index streams */
    m.opts.required_features = 0;
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    RC_W(w, write_index_segment(&m, w, 0, 5), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "FKVF_FEAT_NGON");
    /* the token stream too */
    fkvf_stream_spec tg = mkspec(FKVF_PROFILE_NGON, 0, 16);
    RC_W(w, fkvf_writer_add_token_segment(w, &tg, 0, model_token_stream(&m)->sym, 0),
         FKVF_E_INVALID_ARG);
    assert_msg_names(w, "FKVF_FEAT_NGON");
    fkvf_writer_free(w);
    tu_buf_free(&b);
    /* deflate without its feature bit */
    w = new_writer(&b, &m.opts);
    RC_W(w, fkvf_writer_add_section(w, XTRA, FKVF_SECTION_DEFLATE, 0, "x", 1),
         FKVF_E_INVALID_ARG);
    assert_msg_names(w, "FKVF_FEAT_DEFLATE");
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    RC_W(w, fkvf_writer_add_exact(w, 0, 1, m.rows, m.row_bytes, FKVF_SECTION_DEFLATE),
         FKVF_E_INVALID_ARG);
    fkvf_writer_free(w);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* Index codes of 8 streams x 5 positions, one row per position, all `v`
 * except code[at] = bad. */
static void fill_codes(uint16_t codes[40], uint16_t v, size_t at, uint16_t bad)
{
    for (size_t i = 0; i < 40; i++)
        codes[i] = v;
    if (at < 40)
        codes[at] = bad;
}

START_TEST(writer_refuses_bad_streams)
{
    model m;
    model_small(&m); /* codebook k = 16, one key and one value stage: 8 index streams */
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    OK_W(w, fkvf_writer_add_codebooks(w, &m.cbs, m.cb_tables, m.cb_tables_size, 0));
    /* a symbol outside the codec's alphabet is the caller's error (was SYMBOL) */
    fkvf_stream_spec q = mkspec(FKVF_PROFILE_QUAD, 8, 0);
    uint32_t sym[5] = {1, 2, 256, 3, 4}; /* 256 needs 9 bits */
    RC_W(w, fkvf_writer_add_token_segment(w, &q, 0, sym, 5), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "outside the alphabet");
    uint16_t codes[40];
    q.symbol_bits = 2;
    fill_codes(codes, 1, 8 * 2 + 7, 4); /* position 2 of stream 7: below k, not 2 bits */
    RC_W(w, fkvf_writer_add_index_segment(w, &q, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "outside the alphabet");
    assert_msg_names(w, "stream 7");
    /* an index symbol >= k, whatever the codec could hold (spec 11.8), in
     * either code layout */
    q.symbol_bits = 8;
    fill_codes(codes, 15, 8 * 4 + 3, 16);
    RC_W(w, fkvf_writer_add_index_segment(w, &q, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "k = 16");
    assert_msg_names(w, "index stream 3, symbol 4 is 16");
    fill_codes(codes, 0, 5 * 6 + 1, 255); /* stream 6, position 1: pos_stride 1, code_stride 5 */
    RC_W(w, fkvf_writer_add_index_segment(w, &q, 0, 5, codes, 1, 5), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "index stream 6, symbol 1 is 255");
    fill_codes(codes, 15, 40, 0);
    static const unsigned bad_bits[] = {0, 1, 3, 7, 33, 34, 64};
    for (size_t i = 0; i < sizeof bad_bits / sizeof bad_bits[0]; i++) {
        q.symbol_bits = bad_bits[i];
        RC_W(w, fkvf_writer_add_index_segment(w, &q, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
        assert_msg_names(w, "symbol_bits");
        RC_W(w, fkvf_writer_add_token_segment(w, &q, 0, sym, 0), FKVF_E_INVALID_ARG);
        ck_assert_uint_eq(fkvf_stream_spec_align(&q), 0);
    }
    /* ngon symbol >= N (N < k) */
    fkvf_stream_spec g = mkspec(FKVF_PROFILE_NGON, 0, 8);
    fill_codes(codes, 7, 20, 8);
    RC_W(w, fkvf_writer_add_index_segment(w, &g, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "outside the alphabet");
    /* ngon symbol >= k (N > k) */
    g.alphabet = 32;
    fill_codes(codes, 7, 20, 20);
    RC_W(w, fkvf_writer_add_index_segment(w, &g, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "k = 16");
    g.alphabet = 1;
    RC_W(w, fkvf_writer_add_index_segment(w, &g, 0, 0, NULL, 8, 1), FKVF_E_INVALID_ARG);
    g.alphabet = 16;
    g.r = 0.9; /* > r_N */
    RC_W(w, fkvf_writer_add_index_segment(w, &g, 0, 0, NULL, 8, 1), FKVF_E_INVALID_ARG);
    g.r = 0;
    g.span_symbols = fkvf_ngon_max_span(fkvf_ngon_rmax(16)) + 1; /* > L_max(r) */
    RC_W(w, fkvf_writer_add_index_segment(w, &g, 0, 0, NULL, 8, 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_token_segment(w, &g, 0, NULL, 0), FKVF_E_INVALID_ARG);
    g.span_symbols = 0;
    fkvf_stream_spec ok = mkspec(FKVF_PROFILE_QUAD, 8, 0);
    ok.profile = (fkvf_profile)3;
    RC_W(w, fkvf_writer_add_index_segment(w, &ok, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "profile");
    ck_assert_uint_eq(fkvf_stream_spec_align(&ok), 0);
    ck_assert_uint_eq(fkvf_stream_spec_align(NULL), 0);
    ok.profile = FKVF_PROFILE_QUAD;
    /* missing arguments */
    RC_W(w, fkvf_writer_add_index_segment(w, NULL, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_index_segment(w, &ok, 0, 5, NULL, 8, 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_token_segment(w, NULL, 0, sym, 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_token_segment(w, &ok, 0, NULL, 1), FKVF_E_INVALID_ARG);
    /* a first segment must start at 0 (aligned and not beyond the length) */
    RC_W(w, fkvf_writer_add_index_segment(w, &ok, 16, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "at most their length 0");
    RC_W(w, fkvf_writer_add_index_segment(w, &ok, 8, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "multiple of 16");
    fill_codes(codes, 15, 40, 0);
    /* refused calls wrote nothing: the group takes its first segment now;
     * a second one with another codec is refused (spec 11.6) */
    OK_W(w, fkvf_writer_add_index_segment(w, &ok, 0, 5, codes, 8, 1));
    fkvf_stream_spec ok2 = mkspec(FKVF_PROFILE_QUAD, 6, 0);
    RC_W(w, fkvf_writer_add_index_segment(w, &ok2, 0, 5, codes, 8, 1), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "codec differs");
    /* the same codec again replaces the streams from `first` on */
    OK_W(w, fkvf_writer_add_index_segment(w, &ok, 0, 5, codes, 8, 1));
    OK_W(w, fkvf_writer_add_token_segment(w, &m.tspec, 0, model_token_stream(&m)->sym, 10));
    OK_W(w, fkvf_writer_add_exact(w, 0, 2, m.rows, 2 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_add_exact(w, 7, 3, m.rows + 7 * m.row_bytes, 3 * m.row_bytes, 0));
    OK_W(w, fkvf_writer_set_positions(w, 10, 5));
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_uint_eq(ai.n_sections, 2 + 2 + 3); /* DESC CBK1, STRM x2 + STRM, EXAC x2 */
    for (size_t j = 0; j < 8; j++) {
        fkvf_stream_info si;
        OK_R(r, fkvf_reader_stream_info(r, j, &si));
        ck_assert_uint_eq(si.n_segments, 1); /* the second replaced the first */
        uint32_t out[5];
        OK_R(r, fkvf_reader_stream_read(r, j, 0, out, 5));
        for (size_t i = 0; i < 5; i++)
            ck_assert_uint_eq(out[i], 15);
    }
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

typedef struct desc_case {
    const char *field; /* the message must name it */
    void (*mutate)(fkvf_desc *d);
} desc_case;

static void dm_layers0(fkvf_desc *d) { d->n_layers = 0; }
static void dm_layers_big(fkvf_desc *d) { d->n_layers = 1025; }
static void dm_heads0(fkvf_desc *d) { d->n_kv_heads = 0; }
static void dm_heads_big(fkvf_desc *d) { d->n_kv_heads = 1025; }
static void dm_kdim0(fkvf_desc *d) { d->key_dim = 0; }
static void dm_kdim_big(fkvf_desc *d) { d->key_dim = 16385; }
static void dm_vdim0(fkvf_desc *d) { d->value_dim = 0; }
static void dm_dtype0(fkvf_desc *d) { d->dtype = (fkvf_dtype)0; }
static void dm_dtype4(fkvf_desc *d) { d->dtype = (fkvf_dtype)4; }
static void dm_transform2(fkvf_desc *d) { d->key_transform = 2; }
static void dm_layout0(fkvf_desc *d) { d->rope_layout = 0; }
static void dm_layout3(fkvf_desc *d) { d->rope_layout = 3; }
static void dm_storage2(fkvf_desc *d) { d->key_storage = 2; }
static void dm_rdims_odd(fkvf_desc *d) { d->rope_dims = 7; }
static void dm_rdims0(fkvf_desc *d) { d->rope_dims = 0; }
static void dm_rdims_big(fkvf_desc *d) { d->rope_dims = 10; }
static void dm_theta0(fkvf_desc *d) { d->rope_theta = 0.0; }
static void dm_theta_neg(fkvf_desc *d) { d->rope_theta = -1.0; }
static void dm_theta_nan(fkvf_desc *d) { d->rope_theta = NAN; }
static void dm_theta_inf(fkvf_desc *d) { d->rope_theta = INFINITY; }
static void dm_norope_fields(fkvf_desc *d)
{
    d->key_transform = 0; /* rope_dims etc. still set */
}
static void dm_norope_theta(fkvf_desc *d)
{
    d->key_transform = d->rope_layout = d->key_storage = 0;
    d->rope_dims = 0;
    d->rope_theta = 1.0;
}
static void dm_hash_kind3(fkvf_desc *d) { d->weights_hash_kind = 3; }
static void dm_hash_tail(fkvf_desc *d) { d->weights_hash[16] = 1; } /* kind 2: 16 bytes */
static void dm_hash_none(fkvf_desc *d) { d->weights_hash_kind = 0; }
static void dm_model_utf8(fkvf_desc *d) { d->model_id = "bad\xFF"; }
static void dm_tok_utf8(fkvf_desc *d) { d->tokenizer_id = "\xC0\x80"; }
static char long_id[5000];
static void dm_model_long(fkvf_desc *d)
{
    memset(long_id, 'm', 4097);
    long_id[4097] = 0;
    d->model_id = long_id;
}

START_TEST(writer_refuses_invalid_descriptor_fields)
{
    static const desc_case cases[] = {
        {"n_layers", dm_layers0},        {"n_layers", dm_layers_big},
        {"n_kv_heads", dm_heads0},       {"n_kv_heads", dm_heads_big},
        {"key_dim", dm_kdim0},           {"key_dim", dm_kdim_big},
        {"value_dim", dm_vdim0},         {"dtype", dm_dtype0},
        {"dtype", dm_dtype4},            {"key_transform", dm_transform2},
        {"rope_layout", dm_layout0},     {"rope_layout", dm_layout3},
        {"key_storage", dm_storage2},    {"rope_dims", dm_rdims_odd},
        {"rope_dims", dm_rdims0},        {"rope_dims", dm_rdims_big},
        {"rope_theta", dm_theta0},       {"rope_theta", dm_theta_neg},
        {"rope_theta", dm_theta_nan},    {"rope_theta", dm_theta_inf},
        {"RoPE", dm_norope_fields},      {"RoPE", dm_norope_theta},
        {"weights_hash_kind", dm_hash_kind3}, {"weights_hash", dm_hash_tail},
        {"weights_hash", dm_hash_none},  {"model_id", dm_model_utf8},
        {"tokenizer_id", dm_tok_utf8},   {"model_id", dm_model_long},
    };
    model m;
    model_small(&m);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fkvf_desc d = m.desc;
        cases[i].mutate(&d);
        tu_buf b;
        fkvf_writer *w = new_writer(&b, &m.opts);
        int rc = fkvf_writer_set_desc(w, &d);
        ck_assert_msg(rc == FKVF_E_INVALID_ARG, "case %zu (%s): %s", i, cases[i].field,
                      fkvf_error_name(rc));
        assert_msg_names(w, cases[i].field);
        assert_msg_names(w, "[FKVF_E_INVALID_ARG]"); /* said FKVF_E_CORRUPT */
        /* the writer is still usable: the valid descriptor is accepted */
        OK_W(w, fkvf_writer_set_desc(w, &m.desc));
        RC_W(w, fkvf_writer_set_desc(w, &m.desc), FKVF_E_STATE); /* only once */
        fkvf_writer_free(w);
        tu_buf_free(&b);
    }
    /* limits that are valid */
    fkvf_desc d = m.desc;
    d.rope_dims = d.key_dim; /* rope_dims == key_dim */
    memset(long_id, 'm', 4096);
    long_id[4096] = 0;
    d.model_id = long_id;
    d.tokenizer_id = NULL;
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    OK_W(w, fkvf_writer_set_desc(w, &d));
    OK_W(w, fkvf_writer_finish(w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_desc got;
    OK_R(r, fkvf_reader_desc(r, &got));
    ck_assert_uint_eq(strlen(got.model_id), 4096);
    ck_assert_str_eq(got.tokenizer_id, "");
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* Spec 3.4: optional feature bits 1-63 are reserved and writers write 0;
 * the writer passed any bits through into the header. */
START_TEST(writer_refuses_unknown_optional_features)
{
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    const uint64_t bad[] = {UINT64_C(1) << 2, UINT64_C(1) << 63,
                            FKVF_OPTFEAT_TOKEN_STREAM | (UINT64_C(1) << 5)};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o.optional_features = bad[i];
        tu_buf b;
        memset(&b, 0, sizeof b);
        fkvf_sink sink = tu_buf_sink(&b);
        fkvf_writer *w = NULL;
        ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_E_INVALID_ARG);
        ck_assert_ptr_nonnull(w);
        assert_msg_names(w, "optional_features");
        ck_assert_uint_eq(b.size, 0); /* not even the header */
        fkvf_writer_free(w);
        tu_buf_free(&b);
    }
    o.optional_features = FKVF_OPTFEAT_TOKEN_STREAM;
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &o);
    fkvf_writer_free(w);
    tu_buf_free(&b);
}
END_TEST

START_TEST(writer_refuses_misuse)
{
    model m;
    model_small(&m);
    tu_buf b;
    fkvf_writer *w = new_writer(&b, &m.opts);
    RC_W(w, fkvf_writer_add_exact(w, 0, 1, m.rows, m.row_bytes, 0), FKVF_E_STATE);
    assert_msg_names(w, "descriptor");
    OK_W(w, fkvf_writer_set_desc(w, &m.desc));
    RC_W(w, fkvf_writer_add_exact(w, 0, 1, m.rows, m.row_bytes - 1, 0), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "rows");
    RC_W(w, fkvf_writer_add_exact(w, 0, 1, m.rows, m.row_bytes, 0x80), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_exact(w, UINT64_MAX, 2, m.rows, 2 * m.row_bytes, 0), FKVF_E_LIMIT);
    RC_W(w, fkvf_writer_set_positions(w, 3, 4), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "n_archived");
    static const uint32_t dedicated[] = {
        FKVF_SECTION_DESC, FKVF_SECTION_META, FKVF_SECTION_EXAC, FKVF_SECTION_STRM,
        FKVF_SECTION_DIRC, FKVF_SECTION_VTXS, FKVF_SECTION_CBK1, FKVF_SECTION_CBRF};
    for (size_t i = 0; i < sizeof dedicated / sizeof dedicated[0]; i++) {
        RC_W(w, fkvf_writer_add_section(w, dedicated[i], FKVF_SECTION_REQUIRED, 0, "x", 1),
             FKVF_E_INVALID_ARG);
        assert_msg_names(w, "dedicated");
    }
    RC_W(w, fkvf_writer_add_section(w, XTRA, 4, 0, "x", 1), FKVF_E_INVALID_ARG);
    RC_W(w, fkvf_writer_add_section(w, XTRA, 0, 0, NULL, 1), FKVF_E_INVALID_ARG);
    /* positions recorded without a descriptor */
    tu_buf b2;
    fkvf_writer *w2 = new_writer(&b2, &m.opts);
    OK_W(w2, fkvf_writer_set_positions(w2, 1, 0));
    RC_W(w2, fkvf_writer_finish(w2), FKVF_E_STATE);
    fkvf_writer_free(w2);
    tu_buf_free(&b2);
    /* nothing at all: without a descriptor the file must be a codebook file */
    w2 = new_writer(&b2, &m.opts);
    RC_W(w2, fkvf_writer_finish(w2), FKVF_E_STATE);
    assert_msg_names(w2, "codebook");
    fkvf_writer_free(w2);
    tu_buf_free(&b2);
    fkvf_writer_free(w);
    tu_buf_free(&b);
    /* bad options */
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.block_size = 100;
    memset(&b, 0, sizeof b);
    fkvf_sink sink = tu_buf_sink(&b);
    w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "block_size");
    ck_assert_int_eq(fkvf_writer_set_desc(w, &m.desc), FKVF_E_INVALID_ARG); /* sticky */
    fkvf_writer_free(w);
    o.block_size = 0;
    o.required_features = 1u << 7;
    w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_E_INVALID_ARG);
    assert_msg_names(w, "required_features");
    fkvf_writer_free(w);
    o.required_features = 0;
    o.deflate_level = 10;
    w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_E_INVALID_ARG);
    fkvf_writer_free(w);
    fkvf_sink nosink = {NULL, NULL, NULL};
    w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &nosink, NULL, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(w);
    ck_assert_int_eq(fkvf_writer_create_file(&w, "", NULL, NULL), FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(w);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

static long long failing_write(void *opaque, const void *data, size_t size)
{
    int *budget = opaque;
    (void)data;
    if (*budget <= 0) {
        errno = ENOSPC;
        return -1;
    }
    /* short writes: at most 7 bytes at a time */
    size_t n = size < 7 ? size : 7;
    if ((int)n > *budget)
        n = (size_t)*budget;
    *budget -= (int)n;
    return (long long)n;
}

START_TEST(writer_sink_error_is_sticky_io)
{
    model m;
    model_small(&m);
    tu_buf ref;
    build(&m, &ref);
    for (int budget0 = 0; budget0 < (int)ref.size; budget0 += 97) {
        int budget = budget0;
        fkvf_sink sink = {failing_write, NULL, &budget};
        fkvf_writer *w = NULL;
        int rc = fkvf_writer_create_sink(&w, &sink, &m.opts, NULL);
        if (rc == FKVF_OK)
            rc = write_model(&m, w);
        ck_assert_msg(rc == FKVF_E_IO, "budget %d: %s", budget0, fkvf_error_name(rc));
        ck_assert_ptr_nonnull(w);
        ck_assert_msg(strstr(fkvf_writer_message(w), "write") != NULL, "%s",
                      fkvf_writer_message(w));
        /* every later call reports the failure */
        ck_assert_int_eq(fkvf_writer_meta_u64(w, "z", 1), FKVF_E_IO);
        ck_assert_int_eq(fkvf_writer_finish(w), FKVF_E_IO);
        fkvf_writer_free(w);
    }
    /* short writes alone are retried to completion */
    int budget = INT32_MAX;
    fkvf_sink sink = {failing_write, NULL, &budget};
    fkvf_writer *w = NULL;
    OK_W(w, fkvf_writer_create_sink(&w, &sink, &m.opts, NULL));
    OK_W(w, write_model(&m, w));
    fkvf_writer_free(w);
    ck_assert_int_eq(INT32_MAX - budget, (int)ref.size);
    tu_buf_free(&ref);
    model_free(&m);
}
END_TEST

/* ==== suite ====================================================================== */

int main(void)
{
    Suite *s = suite_create("container_writer");
    TCase *t = tcase_create("writer");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, writer_is_deterministic_through_sink);
    tcase_add_test(t, writer_is_deterministic_through_file);
    tcase_add_test(t, writer_create_file_is_atomic);
    tcase_add_test(t, writer_no_replace_keeps_existing_file);
    tcase_add_test(t, writer_file_mode);
    tcase_add_test(t, error_info_of_conformance_files);
    tcase_add_test(t, writer_refuses_stream_length_mismatch);
    tcase_add_test(t, writer_refuses_uncovered_exact_position);
    tcase_add_test(t, writer_refuses_duplicate_and_reserved_meta_keys);
    tcase_add_test(t, writer_refuses_ngon_without_feature);
    tcase_add_test(t, writer_refuses_bad_streams);
    tcase_add_test(t, writer_refuses_invalid_descriptor_fields);
    tcase_add_test(t, writer_refuses_misuse);
    tcase_add_test(t, writer_refuses_unknown_optional_features);
    tcase_add_test(t, writer_sink_error_is_sticky_io);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
