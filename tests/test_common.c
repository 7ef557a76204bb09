/* Tests of the common helpers: error codes, versions, little-endian access
 * and cursors, overflow-checked arithmetic, the UTF-8 validator and the
 * XXH3 wrappers. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/ckd.h"
#include "common/error.h"
#include "common/filemap.h"
#include "common/hash.h"
#include "common/le.h"
#include "fkvf.h"
#include "format/format.h"
#include "testutil.h"

/* ---- error codes ------------------------------------------------------------ */

static const struct {
    int code;
    const char *name;
    int cls;
} all_codes[] = {
    {FKVF_OK, "FKVF_OK", FKVF_ERRCLASS_OK},
    {FKVF_E_INVALID_ARG, "FKVF_E_INVALID_ARG", FKVF_ERRCLASS_USAGE},
    {FKVF_E_STATE, "FKVF_E_STATE", FKVF_ERRCLASS_USAGE},
    {FKVF_E_NOMEM, "FKVF_E_NOMEM", FKVF_ERRCLASS_USAGE},
    {FKVF_E_IO, "FKVF_E_IO", FKVF_ERRCLASS_USAGE},
    {FKVF_E_RANGE, "FKVF_E_RANGE", FKVF_ERRCLASS_USAGE},
    {FKVF_E_NOT_FOUND, "FKVF_E_NOT_FOUND", FKVF_ERRCLASS_USAGE},
    {FKVF_E_UNSUPPORTED, "FKVF_E_UNSUPPORTED", FKVF_ERRCLASS_USAGE},
    {FKVF_E_EXISTS, "FKVF_E_EXISTS", FKVF_ERRCLASS_USAGE},
    {FKVF_E_BAD_MAGIC, "FKVF_E_BAD_MAGIC", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_VERSION, "FKVF_E_VERSION", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_FEATURE, "FKVF_E_FEATURE", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_BYTE_ORDER, "FKVF_E_BYTE_ORDER", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_TRUNCATED, "FKVF_E_TRUNCATED", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_CHECKSUM, "FKVF_E_CHECKSUM", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_ALIGN, "FKVF_E_ALIGN", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_BOUNDS, "FKVF_E_BOUNDS", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_OVERLAP, "FKVF_E_OVERLAP", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_PADDING, "FKVF_E_PADDING", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_SECTION, "FKVF_E_SECTION", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_CORRUPT, "FKVF_E_CORRUPT", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_DUP_KEY, "FKVF_E_DUP_KEY", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_SYMBOL, "FKVF_E_SYMBOL", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_SPAN, "FKVF_E_SPAN", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_TORN, "FKVF_E_TORN", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_LIMIT, "FKVF_E_LIMIT", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_CODEBOOK, "FKVF_E_CODEBOOK", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_DEFLATE, "FKVF_E_DEFLATE", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_CHAIN, "FKVF_E_CHAIN", FKVF_ERRCLASS_FORMAT},
    {FKVF_E_CODEC, "FKVF_E_CODEC", FKVF_ERRCLASS_ENCODE},
};
#define N_CODES (sizeof all_codes / sizeof all_codes[0])

START_TEST(error_every_code_has_name_text_and_class)
{
    for (size_t i = 0; i < N_CODES; i++) {
        int c = all_codes[i].code;
        const char *name = fkvf_error_name(c), *text = fkvf_strerror(c);
        ck_assert_ptr_nonnull(name);
        ck_assert_ptr_nonnull(text);
        ck_assert_str_eq(name, all_codes[i].name);
        ck_assert_msg(strlen(text) > 0, "empty strerror for %s", all_codes[i].name);
        ck_assert_msg(strcmp(text, "unknown error code") != 0, "%s has no description",
                      all_codes[i].name);
        ck_assert_int_eq(fkvf_error_class(c), all_codes[i].cls);
    }
}
END_TEST

START_TEST(error_texts_are_distinct)
{
    for (size_t i = 0; i < N_CODES; i++)
        for (size_t k = i + 1; k < N_CODES; k++) {
            ck_assert_str_ne(fkvf_strerror(all_codes[i].code), fkvf_strerror(all_codes[k].code));
            ck_assert_str_ne(fkvf_error_name(all_codes[i].code),
                             fkvf_error_name(all_codes[k].code));
        }
}
END_TEST

START_TEST(error_unknown_code_never_null)
{
    static const int unknown[] = {-1, 9, 19, 40, 49, 51, 59, 60, 1000, INT32_MAX, INT32_MIN};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        int c = unknown[i];
        const char *name = fkvf_error_name(c), *text = fkvf_strerror(c);
        ck_assert_ptr_nonnull(name);
        ck_assert_ptr_nonnull(text);
        ck_assert(strlen(name) > 0 && strlen(text) > 0);
        /* an unknown code must not masquerade as a known one */
        for (size_t k = 0; k < N_CODES; k++)
            ck_assert_str_ne(name, all_codes[k].name);
        ck_assert(fkvf_error_class(c) != FKVF_ERRCLASS_OK);
    }
}
END_TEST

START_TEST(error_class_ranges)
{
    ck_assert_int_eq(fkvf_error_class(0), FKVF_ERRCLASS_OK);
    for (int c = 1; c < 20; c++)
        ck_assert_int_eq(fkvf_error_class(c), FKVF_ERRCLASS_USAGE);
    for (int c = 20; c < 50; c++)
        ck_assert_int_eq(fkvf_error_class(c), FKVF_ERRCLASS_FORMAT);
    for (int c = 50; c < 60; c++)
        ck_assert_int_eq(fkvf_error_class(c), FKVF_ERRCLASS_ENCODE);
}
END_TEST

/* ---- diagnostics ---------------------------------------------------------------- */

/* fkvf_fail keeps code, offset, clause, field and text as fields beside the
 * message it formats from them */
START_TEST(diag_fields_beside_the_message)
{
    fkvf_diag d;
    d.name = "a.fkvf";
    fkvf_diag_clear(&d);
    size_t len;
    ck_assert_str_eq(fkvf_diag_text(&d, &len), "");
    ck_assert_uint_eq(len, 0);
    ck_assert_int_eq(fkvf_fail(&d, FKVF_E_CORRUPT, 4104, "5.3", "directory.entry[%d].offset: %u",
                               3, 7u),
                     FKVF_E_CORRUPT);
    ck_assert_str_eq(d.msg, "a.fkvf: offset 4104: directory.entry[3].offset: 7 (spec 5.3) "
                            "[FKVF_E_CORRUPT]");
    ck_assert_str_eq(d.field, "directory.entry[3].offset");
    ck_assert_str_eq(d.clause, "5.3");
    ck_assert_uint_eq(d.offset, 4104);
    const char *t = fkvf_diag_text(&d, &len);
    ck_assert_uint_eq(len, strlen("directory.entry[3].offset: 7"));
    ck_assert(!strncmp(t, "directory.entry[3].offset: 7", len));
    /* the first error is kept; replace overwrites every field */
    ck_assert_int_eq(fkvf_fail(&d, FKVF_E_IO, FKVF_NO_OFFSET, NULL, "header: x"), FKVF_E_IO);
    ck_assert_str_eq(d.field, "directory.entry[3].offset");
    fkvf_fail_replace(&d, FKVF_E_IO, FKVF_NO_OFFSET, NULL, "cannot read: %s", "EIO");
    ck_assert_str_eq(d.msg, "a.fkvf: cannot read: EIO [FKVF_E_IO]");
    ck_assert_str_eq(d.field, ""); /* "cannot read" is no field name */
    ck_assert_str_eq(d.clause, "");
    /* nor are a system call's name and a structure that ran out of memory */
    fkvf_fail_replace(&d, FKVF_E_IO, FKVF_NO_OFFSET, NULL, "open: %s", "ENOENT");
    ck_assert_str_eq(d.field, "");
    fkvf_fail_replace(&d, FKVF_E_NOMEM, 8, NULL, "META: no memory for %u keys", 3u);
    ck_assert_str_eq(d.field, "");
    fkvf_fail_replace(&d, FKVF_E_IO, FKVF_NO_OFFSET, NULL, "cannot read: %s", "EIO");
    t = fkvf_diag_text(&d, &len);
    ck_assert(len == strlen("cannot read: EIO") && !strncmp(t, "cannot read: EIO", len));
    fkvf_error_info e;
    fkvf_diag_info(&d, &e);
    ck_assert_ptr_null(e.field);
    ck_assert_ptr_null(e.clause);
    d.name = NULL;
    fkvf_fail_replace(&d, FKVF_E_BAD_MAGIC, 0, "3.1", "header.magic: not an FKVF file");
    ck_assert_str_eq(d.msg, "<memory>: offset 0: header.magic: not an FKVF file (spec 3.1) "
                            "[FKVF_E_BAD_MAGIC]");
    fkvf_diag_info(&d, &e);
    ck_assert_str_eq(e.field, "header.magic");
    ck_assert_str_eq(e.clause, "3.1");
    fkvf_diag_clear(&d);
    fkvf_diag_info(&d, &e);
    ck_assert_ptr_null(e.field);
    ck_assert_str_eq(d.field, "");
}
END_TEST

/* A long text is cut to 759 bytes and the message keeps its file name, its
 * code name at the end and fits FKVF_MSG_MAX with its NUL: what
 * docs/library.md promises (it said 511 bytes while messages reach 1023). */
START_TEST(diag_message_length_is_documented)
{
    ck_assert_int_eq(FKVF_MSG_MAX, 1024);
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    fkvf_diag d;
    d.name = "a.fkvf";
    fkvf_diag_clear(&d);
    fkvf_fail(&d, FKVF_E_CORRUPT, 77, "5.3", "%s", big);
    const size_t n = strlen(d.msg);
    ck_assert_uint_lt(n, FKVF_MSG_MAX);
    ck_assert(!strncmp(d.msg, "a.fkvf: offset 77: ", 19));
    ck_assert_str_eq(d.msg + n - strlen(" (spec 5.3) [FKVF_E_CORRUPT]"),
                     " (spec 5.3) [FKVF_E_CORRUPT]");
    size_t len;
    (void)fkvf_diag_text(&d, &len);
    ck_assert_uint_eq(len, 759);
    /* the longest parts all at once still fit */
    char name[300];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = 0;
    d.name = name;
    fkvf_fail_replace(&d, FKVF_E_CORRUPT, UINT64_MAX - 1, "19.12.3", "%s", big);
    ck_assert_uint_lt(strlen(d.msg), FKVF_MSG_MAX);
    ck_assert_str_eq(d.msg + strlen(d.msg) - strlen("[FKVF_E_CORRUPT]"), "[FKVF_E_CORRUPT]");
}
END_TEST

/* the public fields of a reader's error name the field its message names */
START_TEST(reader_error_names_the_field)
{
    static const uint8_t not_fkvf[64] = "not an archive";
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, not_fkvf, sizeof not_fkvf, 0, NULL),
                     FKVF_E_BAD_MAGIC);
    fkvf_error_info e;
    ck_assert_int_eq(fkvf_reader_error(r, &e), FKVF_OK);
    ck_assert_str_eq(e.field, "header.magic");
    ck_assert_str_eq(e.clause, "3.1");
    ck_assert_uint_eq(e.offset, 0);
    fkvf_reader_free(r);
}
END_TEST

/* the allocator for big tables: the default's blocks of 4 MiB and more
 * 2 MiB-aligned on Linux, small ones as malloc's; another allocator as given */
START_TEST(alloc_large_tables)
{
    const fkvf_allocator *a = fkvf_alloc_large_tables(NULL);
    ck_assert_ptr_nonnull(a);
    size_t big = ((size_t)5 << 20) + 3;
    uint8_t *p = fkvf_malloc(a, big);
    ck_assert_ptr_nonnull(p);
#if defined(__linux__)
    ck_assert_uint_eq((uintptr_t)p % ((uintptr_t)2 << 20), 0);
#endif
    memset(p, 1, big);
    p = fkvf_realloc(a, p, 16); /* realloc and free as the default's */
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq(p[15], 1);
    fkvf_free(a, p);
    p = fkvf_malloc(a, 100);
    ck_assert_ptr_nonnull(p);
    fkvf_free(a, p);
    ck_assert_ptr_eq(fkvf_alloc_large_tables(fkvf_alloc_or_default(NULL)), a);
    fkvf_allocator other = *fkvf_alloc_or_default(NULL);
    other.opaque = &other; /* a complete allocator of the caller's */
    ck_assert_ptr_eq(fkvf_alloc_large_tables(&other), &other);
}
END_TEST

/* ---- file maps ------------------------------------------------------------------- */

/* the bytes of a file mapped and read, an empty file, and what is no
 * regular file */
START_TEST(filemap_maps_and_reads)
{
    char dir[] = "/tmp/fkvf_filemap_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/f", dir);
    static const char text[] = "0123456789abcdef";
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, 16), 16);
    close(fd);
    fkvf_diag d;
    d.name = path;
    fkvf_diag_clear(&d);
    for (int read_copy = 0; read_copy < 2; read_copy++) {
        fd = open(path, O_RDONLY);
        ck_assert_int_ge(fd, 0);
        if (read_copy)
            ck_assert_int_eq(lseek(fd, 5, SEEK_SET), 5); /* read from offset 0 all the same */
        fkvf_filemap m;
        ck_assert_int_eq(fkvf_filemap_fd(&m, fd, read_copy, NULL, &d), FKVF_OK);
        close(fd); /* the bytes outlive the descriptor */
        ck_assert_uint_eq(m.size, 16);
        ck_assert(memcmp(m.data, text, 16) == 0);
        ck_assert(read_copy ? m.owned != NULL && m.map == NULL : m.map != NULL && !m.owned);
        fkvf_filemap_release(&m, NULL);
        ck_assert_uint_eq(m.size, 0);
        ck_assert_ptr_nonnull(m.data);
    }
    /* empty */
    fd = open(path, O_WRONLY | O_TRUNC);
    close(fd);
    fd = open(path, O_RDONLY);
    fkvf_filemap m;
    ck_assert_int_eq(fkvf_filemap_fd(&m, fd, 0, NULL, &d), FKVF_OK);
    ck_assert_uint_eq(m.size, 0);
    ck_assert_ptr_nonnull(m.data);
    fkvf_filemap_release(&m, NULL);
    close(fd);
    /* a directory */
    fd = open(dir, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fkvf_filemap_fd(&m, fd, 1, NULL, &d), FKVF_E_IO);
    close(fd);
    ck_assert_ptr_nonnull(strstr(d.msg, "not a regular file"));
    ck_assert_int_eq(fkvf_validate_file(dir, NULL, NULL, NULL, NULL), FKVF_E_IO);
    ck_assert_int_eq(fkvf_validate_file(path, NULL, NULL, NULL, NULL), FKVF_OK);
    unlink(path);
    rmdir(dir);
}
END_TEST

/* fkvf_xxh3_64_pair is XXH3-64 of the two buffers joined (xxhash's
 * one-shot call on a joined copy), for every split of a few lengths;
 * fkvf_filemap_drop keeps a mapping's bytes (pages re-read) and ignores a
 * read copy and ranges past the end. */
START_TEST(hash_pair_and_filemap_drop)
{
    uint8_t buf[600];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)(i * 131 + 7);
    int bad = 0;
    const size_t lens[] = {0, 1, 63, 64, 65, 240, 241, 600};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
        for (size_t na = 0; na <= lens[k]; na++) {
            uint64_t want = (uint64_t)XXH3_64bits_withSeed(buf, lens[k], 0x1234 + k);
            bad |= fkvf_xxh3_64_pair(buf, na, buf + na, lens[k] - na, 0x1234 + k) != want;
        }
    ck_assert_msg(!bad, "fkvf_xxh3_64_pair differs from XXH3 of the joined bytes");
    char dir[] = "/tmp/fkvf_filemap_XXXXXX", path[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/f", dir);
    size_t n = (size_t)1 << 20;
    uint8_t *big = malloc(n);
    ck_assert_ptr_nonnull(big);
    for (size_t i = 0; i < n; i++)
        big[i] = (uint8_t)(i ^ (i >> 9));
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, big, n), (ssize_t)n);
    close(fd);
    fkvf_diag d;
    d.name = path;
    fkvf_diag_clear(&d);
    for (int read_copy = 0; read_copy < 2; read_copy++) {
        fd = open(path, O_RDONLY);
        fkvf_filemap m;
        ck_assert_int_eq(fkvf_filemap_fd(&m, fd, read_copy, NULL, &d), FKVF_OK);
        close(fd);
        int same = memcmp(m.data, big, n) == 0;
        fkvf_filemap_drop(&m, 100, n - 5000);
        fkvf_filemap_drop(&m, 0, n);
        fkvf_filemap_drop(&m, n - 1, 10);
        fkvf_filemap_drop(&m, n + 10, 10);
        same &= memcmp(m.data, big, n) == 0;
        ck_assert_msg(same, "read_copy %d: bytes changed", read_copy);
        fkvf_filemap_release(&m, NULL);
    }
    free(big);
    unlink(path);
    rmdir(dir);
}
END_TEST

/* ---- versions ------------------------------------------------------------------ */

/* fkvf_index_stream_id against the canonical order of spec 11.2 written out
 * as nested loops (layer, head, the key stages, then the value stages), the
 * spec's example id of 11.1, and the shapes no archive has. */
START_TEST(index_stream_id_canonical_order)
{
    static const unsigned shapes[][4] = {
        {1, 1, 1, 0}, {1, 1, 0, 1}, {2, 3, 2, 1}, {5, 4, 2, 2}, {3, 2, 16, 16}, {2, 1, 0, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        unsigned L = shapes[s][0], H = shapes[s][1], ks = shapes[s][2], vs = shapes[s][3];
        uint64_t j = 0;
        for (unsigned l = 0; l < L; l++)
            for (unsigned h = 0; h < H; h++)
                for (unsigned kv = 0; kv < 2; kv++)
                    for (unsigned st = 0; st < (kv ? vs : ks); st++, j++)
                        ck_assert_uint_eq(fkvf_index_stream_id(L, H, ks, vs, j),
                                          ((uint64_t)st << 40) | ((uint64_t)kv << 32) |
                                              ((uint64_t)h << 16) | l);
        ck_assert_uint_eq(j, (uint64_t)L * H * (ks + vs));
        ck_assert_uint_eq(fkvf_index_stream_id(L, H, ks, vs, j), UINT64_MAX);
    }
    /* spec 11.1: the values of layer 3, head 1, stage 1 */
    ck_assert_uint_eq(fkvf_index_stream_id(4, 2, 2, 2, (3 * 2 + 1) * 4 + 2 + 1),
                      UINT64_C(0x0000010100010003));
    ck_assert_uint_eq(fkvf_index_stream_id(65536, 65536, 16, 16, UINT64_C(65536) * 65536 * 32 - 1),
                      FKVF_STREAM_ID(0, 65535, 65535, 1, 15));
    ck_assert_uint_eq(fkvf_index_stream_id(0, 1, 1, 1, 0), UINT64_MAX);
    ck_assert_uint_eq(fkvf_index_stream_id(1, 0, 1, 1, 0), UINT64_MAX);
    ck_assert_uint_eq(fkvf_index_stream_id(1, 1, 0, 0, 0), UINT64_MAX);
    ck_assert_uint_eq(fkvf_index_stream_id(1, 1, 17, 1, 0), UINT64_MAX);
    ck_assert_uint_eq(fkvf_index_stream_id(1, 1, 1, 17, 0), UINT64_MAX);
    ck_assert_uint_eq(fkvf_index_stream_id(65537, 1, 1, 1, 0), UINT64_MAX);
    ck_assert_uint_eq(fkvf_index_stream_id(1, 65537, 1, 1, 0), UINT64_MAX);
}
END_TEST

/* fkvf_quad_bits_for: the even widths of spec 12.1 at their edges */
START_TEST(quad_bits_for_widths)
{
    static const struct {
        uint64_t max;
        unsigned bits;
    } w[] = {{0, 2},           {3, 2},
             {4, 4},           {15, 4},
             {16, 6},          {255, 8},
             {256, 10},        {4095, 12},
             {65535, 16},      {65536, 18},
             {(1u << 30) - 1, 30}, {1u << 30, 32},
             {UINT32_MAX, 32}, {(uint64_t)UINT32_MAX + 1, 0},
             {UINT64_MAX, 0}};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        ck_assert_msg(fkvf_quad_bits_for(w[i].max) == w[i].bits, "max %llu: %u bits, not %u",
                      (unsigned long long)w[i].max, fkvf_quad_bits_for(w[i].max), w[i].bits);
}
END_TEST

START_TEST(version_macros_match_runtime)
{
    ck_assert_uint_eq(fkvf_version_number(), FKVF_VERSION_NUMBER);
    ck_assert_str_eq(fkvf_version_string(), FKVF_VERSION_STRING);
    char buf[32];
    snprintf(buf, sizeof buf, "%d.%d.%d", FKVF_VERSION_MAJOR, FKVF_VERSION_MINOR,
             FKVF_VERSION_PATCH);
    ck_assert_str_eq(buf, FKVF_VERSION_STRING);
    ck_assert_uint_eq(FKVF_VERSION_NUMBER,
                      FKVF_VERSION_MAJOR * 10000 + FKVF_VERSION_MINOR * 100 + FKVF_VERSION_PATCH);
    ck_assert_int_eq(FKVF_FORMAT_MAJOR, 1);
}
END_TEST

/* ---- le.h ------------------------------------------------------------------------- */

START_TEST(le_store_load_round_trip)
{
    tu_rng rng = {42};
    uint8_t buf[16];
    for (int i = 0; i < 1000; i++) {
        uint64_t v = tu_next(&rng);
        unsigned at = (unsigned)i % 8; /* every alignment */
        fkvf_st16(buf + at, (uint16_t)v);
        ck_assert_uint_eq(fkvf_ld16(buf + at), (uint16_t)v);
        fkvf_st32(buf + at, (uint32_t)v);
        ck_assert_uint_eq(fkvf_ld32(buf + at), (uint32_t)v);
        fkvf_st64(buf + at, v);
        ck_assert_uint_eq(fkvf_ld64(buf + at), v);
        double d;
        memcpy(&d, &v, sizeof d);
        fkvf_stf64(buf + at, d);
        double e = fkvf_ldf64(buf + at);
        ck_assert(memcmp(&d, &e, sizeof d) == 0); /* bitwise, NaNs included */
    }
}
END_TEST

START_TEST(le_byte_order_is_little_endian)
{
    uint8_t b[8];
    fkvf_st32(b, UINT32_C(0x0A0B0C0D));
    ck_assert(b[0] == 0x0D && b[1] == 0x0C && b[2] == 0x0B && b[3] == 0x0A);
    fkvf_st64(b, UINT64_C(0x0102030405060708));
    for (int i = 0; i < 8; i++)
        ck_assert_uint_eq(b[i], 8 - i);
    fkvf_st16(b, 0xBEEF);
    ck_assert(b[0] == 0xEF && b[1] == 0xBE);
    static const uint8_t one[8] = {0, 0, 0, 0, 0, 0, 0xF0, 0x3F}; /* 1.0 */
    ck_assert(fkvf_ldf64(one) == 1.0);
    static const uint8_t hi[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    ck_assert_uint_eq(fkvf_ld64(hi), UINT64_MAX);
    ck_assert_uint_eq(fkvf_ld32(hi), UINT32_MAX);
    ck_assert_uint_eq(fkvf_ld16(hi), 0xFFFF);
}
END_TEST

START_TEST(le_cursor_reads_in_order)
{
    uint8_t b[1 + 2 + 4 + 8 + 8];
    b[0] = 0x11;
    fkvf_st16(b + 1, 0x2233);
    fkvf_st32(b + 3, 0x44556677u);
    fkvf_st64(b + 7, UINT64_C(0x8899AABBCCDDEEFF));
    fkvf_stf64(b + 15, -2.5);
    fkvf_rd rd = fkvf_rd_make(b, sizeof b);
    ck_assert_uint_eq(fkvf_rd_u8(&rd), 0x11);
    ck_assert_uint_eq(fkvf_rd_u16(&rd), 0x2233);
    ck_assert_uint_eq(fkvf_rd_u32(&rd), 0x44556677u);
    ck_assert_uint_eq(fkvf_rd_u64(&rd), UINT64_C(0x8899AABBCCDDEEFF));
    ck_assert(fkvf_rd_f64(&rd) == -2.5);
    ck_assert(fkvf_rd_ok(&rd));
    ck_assert_uint_eq(rd.pos, sizeof b);
    /* zero-length take at the end is fine */
    ck_assert_ptr_nonnull(fkvf_rd_take(&rd, 0));
    ck_assert(fkvf_rd_ok(&rd));
}
END_TEST

START_TEST(le_cursor_past_end_sets_bad_and_returns_zero)
{
    uint8_t b[7];
    memset(b, 0xAB, sizeof b);
    /* for each read width and each starting length, reading past the end
     * yields 0 and sets bad; the flag is sticky */
    for (size_t len = 0; len < sizeof b; len++) {
        fkvf_rd rd = fkvf_rd_make(b, len);
        ck_assert(fkvf_rd_has(&rd, len));
        ck_assert(!fkvf_rd_has(&rd, len + 1));
        if (len < 8) {
            fkvf_rd r8 = rd;
            ck_assert_uint_eq(fkvf_rd_u64(&r8), 0);
            ck_assert(!fkvf_rd_ok(&r8));
            fkvf_rd rf = rd;
            ck_assert(fkvf_rd_f64(&rf) == 0.0);
            ck_assert(!fkvf_rd_ok(&rf));
        }
        if (len < 4) {
            fkvf_rd r4 = rd;
            ck_assert_uint_eq(fkvf_rd_u32(&r4), 0);
            ck_assert(!fkvf_rd_ok(&r4));
        }
        if (len < 2) {
            fkvf_rd r2 = rd;
            ck_assert_uint_eq(fkvf_rd_u16(&r2), 0);
            ck_assert(!fkvf_rd_ok(&r2));
        }
        if (len < 1) {
            fkvf_rd r1 = rd;
            ck_assert_uint_eq(fkvf_rd_u8(&r1), 0);
            ck_assert(!fkvf_rd_ok(&r1));
        }
        fkvf_rd rt = rd;
        ck_assert_ptr_null(fkvf_rd_take(&rt, len + 1));
        ck_assert(!fkvf_rd_ok(&rt));
        /* sticky: even a read that would fit now fails */
        ck_assert_uint_eq(fkvf_rd_u8(&rt), 0);
        ck_assert_ptr_null(fkvf_rd_take(&rt, 0));
        ck_assert(!fkvf_rd_ok(&rt));
    }
    /* a partial read does not advance */
    fkvf_rd rd = fkvf_rd_make(b, 3);
    ck_assert_uint_eq(fkvf_rd_u16(&rd), 0xABAB);
    ck_assert_uint_eq(fkvf_rd_u16(&rd), 0);
    ck_assert_uint_eq(rd.pos, 2);
    /* huge takes do not wrap */
    fkvf_rd big = fkvf_rd_make(b, sizeof b);
    fkvf_rd_u8(&big);
    ck_assert_ptr_null(fkvf_rd_take(&big, SIZE_MAX));
    ck_assert(!fkvf_rd_ok(&big));
}
END_TEST

START_TEST(le_range_ok_edges)
{
    ck_assert(fkvf_range_ok(0, 0, 0));
    ck_assert(fkvf_range_ok(10, 0, 10));
    ck_assert(!fkvf_range_ok(11, 0, 10));
    ck_assert(fkvf_range_ok(0, 10, 10));
    ck_assert(!fkvf_range_ok(1, 10, 10));
    ck_assert(!fkvf_range_ok(5, UINT64_MAX, 10));
    ck_assert(!fkvf_range_ok(UINT64_MAX, 1, UINT64_MAX));
    ck_assert(fkvf_range_ok(UINT64_MAX - 1, 1, UINT64_MAX));
    ck_assert(!fkvf_range_ok(UINT64_MAX, UINT64_MAX, UINT64_MAX - 1));
}
END_TEST

/* ---- ckd.h ------------------------------------------------------------------------ */

START_TEST(ckd_add_mul_edges)
{
    uint64_t o;
    ck_assert(fkvf_add64(UINT64_MAX - 1, 1, &o) && o == UINT64_MAX);
    ck_assert(!fkvf_add64(UINT64_MAX, 1, &o));
    ck_assert(!fkvf_add64(UINT64_MAX, UINT64_MAX, &o));
    ck_assert(fkvf_add64(0, 0, &o) && o == 0);
    ck_assert(fkvf_mul64(UINT64_C(1) << 32, (UINT64_C(1) << 32) - 1, &o) &&
              o == (UINT64_C(1) << 32) * ((UINT64_C(1) << 32) - 1));
    ck_assert(!fkvf_mul64(UINT64_C(1) << 32, UINT64_C(1) << 32, &o));
    ck_assert(fkvf_mul64(UINT64_MAX, 1, &o) && o == UINT64_MAX);
    ck_assert(fkvf_mul64(UINT64_MAX, 0, &o) && o == 0);
    ck_assert(!fkvf_mul64(UINT64_MAX, 2, &o));
    /* (2^32+1)(2^32-1) = 2^64-1: the largest product that fits */
    ck_assert(fkvf_mul64(UINT64_C(0x100000001), UINT64_C(0xFFFFFFFF), &o) && o == UINT64_MAX);
    ck_assert(!fkvf_mul64(UINT64_C(0x100000001), UINT64_C(0x100000000), &o));
    size_t s;
    ck_assert(fkvf_addsz(SIZE_MAX - 5, 5, &s) && s == SIZE_MAX);
    ck_assert(!fkvf_addsz(SIZE_MAX - 5, 6, &s));
    ck_assert(fkvf_mulsz(SIZE_MAX / 3, 3, &s) && s == SIZE_MAX / 3 * 3);
    ck_assert(!fkvf_mulsz(SIZE_MAX / 2 + 1, 2, &s));
}
END_TEST

START_TEST(ckd_tosz_align_ceildiv_edges)
{
    size_t s;
    ck_assert(fkvf_tosz(0, &s) && s == 0);
    ck_assert(fkvf_tosz((uint64_t)SIZE_MAX, &s) && s == SIZE_MAX);
#if SIZE_MAX < UINT64_MAX
    ck_assert(!fkvf_tosz((uint64_t)SIZE_MAX + 1, &s));
#endif
    uint64_t o;
    ck_assert(fkvf_align64(0, &o) && o == 0);
    ck_assert(fkvf_align64(1, &o) && o == 64);
    ck_assert(fkvf_align64(63, &o) && o == 64);
    ck_assert(fkvf_align64(64, &o) && o == 64);
    ck_assert(fkvf_align64(65, &o) && o == 128);
    ck_assert(fkvf_align64(UINT64_MAX - 63, &o) && o == UINT64_MAX - 63);
    ck_assert((UINT64_MAX - 63) % 64 == 0);
    ck_assert(!fkvf_align64(UINT64_MAX - 62, &o));
    ck_assert(!fkvf_align64(UINT64_MAX, &o));
    ck_assert_uint_eq(fkvf_ceildiv(0, 7), 0);
    ck_assert_uint_eq(fkvf_ceildiv(1, 7), 1);
    ck_assert_uint_eq(fkvf_ceildiv(7, 7), 1);
    ck_assert_uint_eq(fkvf_ceildiv(8, 7), 2);
    ck_assert_uint_eq(fkvf_ceildiv(UINT64_MAX, 1), UINT64_MAX);
    ck_assert_uint_eq(fkvf_ceildiv(UINT64_MAX, 2), UINT64_C(1) << 63);
    ck_assert_uint_eq(fkvf_ceildiv(UINT64_MAX, UINT64_MAX), 1);
}
END_TEST

/* ---- allocation helpers ------------------------------------------------------------ */

START_TEST(strndup_copies_and_terminates)
{
    tu_alloc count = {0};
    fkvf_allocator a = tu_alloc_hook(&count);
    char *s = fkvf_strndup(&a, "abc\0def", 7); /* embedded NUL kept, then a terminator */
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(memcmp(s, "abc\0def", 8), 0);
    ck_assert_int_eq(count.calls, 1);
    fkvf_free(&a, s);
    s = fkvf_strndup(&a, "xyz", 2); /* a prefix */
    ck_assert_str_eq(s, "xy");
    fkvf_free(&a, s);
    s = fkvf_strndup(NULL, NULL, 0); /* empty, default allocator */
    ck_assert_ptr_nonnull(s);
    ck_assert_str_eq(s, "");
    fkvf_free(NULL, s);
    tu_alloc fails = {.fail_at = 1, .fail_after = 1};
    fkvf_allocator none = tu_alloc_hook(&fails);
    ck_assert_ptr_null(fkvf_strndup(&none, "abc", 3));
    ck_assert_ptr_null(fkvf_strndup(NULL, "", SIZE_MAX)); /* n + 1 overflows */
}
END_TEST

/* ---- UTF-8 ------------------------------------------------------------------------ */

static int utf8(const char *s, size_t n) { return fkvf_utf8_valid((const uint8_t *)s, n); }
#define U8OK(lit) ck_assert_msg(utf8(lit, sizeof(lit) - 1), "rejected valid %s", #lit)
#define U8BAD(lit) ck_assert_msg(!utf8(lit, sizeof(lit) - 1), "accepted invalid %s", #lit)

START_TEST(utf8_accepts_valid_sequences)
{
    ck_assert(fkvf_utf8_valid(NULL, 0)); /* n == 0 must not touch s */
    U8OK("");
    U8OK("plain ascii");
    U8OK("\x7F");
    U8OK("\xC2\x80");             /* U+0080, smallest 2-byte */
    U8OK("\xDF\xBF");             /* U+07FF */
    U8OK("\xE0\xA0\x80");         /* U+0800, smallest 3-byte */
    U8OK("\xED\x9F\xBF");         /* U+D7FF, just below surrogates */
    U8OK("\xEE\x80\x80");         /* U+E000, just above */
    U8OK("\xEF\xBF\xBF");         /* U+FFFF */
    U8OK("\xF0\x90\x80\x80");     /* U+10000, smallest 4-byte */
    U8OK("\xF4\x8F\xBF\xBF");     /* U+10FFFF, the largest */
    U8OK("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"); /* mixed */
    /* NUL is a valid code point (keys reject it separately) */
    ck_assert(utf8("a\0b", 3));
}
END_TEST

START_TEST(utf8_rejects_overlongs)
{
    U8BAD("\xC0\x80"); /* overlong NUL */
    U8BAD("\xC0\xAF");
    U8BAD("\xC1\xBF");
    U8BAD("\xE0\x80\x80");
    U8BAD("\xE0\x9F\xBF"); /* overlong U+07FF */
    U8BAD("\xF0\x80\x80\x80");
    U8BAD("\xF0\x8F\xBF\xBF"); /* overlong U+FFFF */
}
END_TEST

START_TEST(utf8_rejects_surrogates_and_out_of_range)
{
    U8BAD("\xED\xA0\x80"); /* U+D800 */
    U8BAD("\xED\xAD\xBF");
    U8BAD("\xED\xB0\x80"); /* U+DC00 */
    U8BAD("\xED\xBF\xBF"); /* U+DFFF */
    U8BAD("\xED\xA0\x80\xED\xB0\x80"); /* CESU-8 pair */
    U8BAD("\xF4\x90\x80\x80"); /* U+110000 */
    U8BAD("\xF7\xBF\xBF\xBF");
    U8BAD("\xF8\x88\x80\x80\x80"); /* 5-byte form */
    U8BAD("\xFC\x84\x80\x80\x80\x80");
    U8BAD("\xFE");
    U8BAD("\xFF");
}
END_TEST

START_TEST(utf8_rejects_truncated_and_stray_bytes)
{
    U8BAD("\x80");          /* lone continuation */
    U8BAD("a\xBF");
    U8BAD("\xC3");          /* truncated 2-byte */
    U8BAD("\xE2\x82");      /* truncated 3-byte */
    U8BAD("\xF0\x9F\x98");  /* truncated 4-byte */
    U8BAD("\xC3x");         /* bad continuation */
    U8BAD("\xE2\x28\xA1");
    U8BAD("\xF0\x9F\x28\x80");
    /* the length argument is respected: a valid sequence cut by n */
    const char *e = "\xE2\x82\xAC";
    ck_assert(utf8(e, 3));
    ck_assert(!utf8(e, 2));
    ck_assert(!utf8(e, 1));
    ck_assert(utf8(e, 0));
}
END_TEST

START_TEST(utf8_exhaustive_two_byte_space)
{
    /* every 2-byte pattern: valid iff it is a canonical encoding of
     * U+0080..U+07FF, or two ASCII bytes */
    for (unsigned a = 0; a < 256; a++)
        for (unsigned b = 0; b < 256; b++) {
            uint8_t s[2] = {(uint8_t)a, (uint8_t)b};
            int want = (a < 0x80 && b < 0x80) || (a >= 0xC2 && a <= 0xDF && (b & 0xC0) == 0x80);
            ck_assert_msg(fkvf_utf8_valid(s, 2) == want, "%02x %02x", a, b);
        }
}
END_TEST

START_TEST(utf8_matches_reference_on_random_code_points)
{
    /* encode code points ourselves; surrogates encoded naively must be rejected */
    tu_rng rng = {7};
    for (int i = 0; i < 20000; i++) {
        uint32_t cp = tu_below(&rng, 0x110000);
        uint8_t s[4];
        size_t n;
        if (cp < 0x80) {
            s[0] = (uint8_t)cp;
            n = 1;
        } else if (cp < 0x800) {
            s[0] = (uint8_t)(0xC0 | cp >> 6);
            s[1] = (uint8_t)(0x80 | (cp & 0x3F));
            n = 2;
        } else if (cp < 0x10000) {
            s[0] = (uint8_t)(0xE0 | cp >> 12);
            s[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
            s[2] = (uint8_t)(0x80 | (cp & 0x3F));
            n = 3;
        } else {
            s[0] = (uint8_t)(0xF0 | cp >> 18);
            s[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
            s[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
            s[3] = (uint8_t)(0x80 | (cp & 0x3F));
            n = 4;
        }
        int want = !(cp >= 0xD800 && cp <= 0xDFFF);
        ck_assert_msg(fkvf_utf8_valid(s, n) == want, "U+%04X", cp);
        if (n > 1)
            ck_assert_msg(!fkvf_utf8_valid(s, n - 1), "U+%04X truncated", cp);
    }
}
END_TEST

/* ---- XXH3 ------------------------------------------------------------------------- */

START_TEST(xxh3_64_known_vectors)
{
    /* Published XXH3-64 of the empty input with seed 0. */
    ck_assert_uint_eq(fkvf_xxh3_64("", 0, 0), UINT64_C(0x2D06800538D394C2));
    ck_assert_uint_eq(XXH3_64bits_withSeed("", 0, 0), UINT64_C(0x2D06800538D394C2));
}
END_TEST

START_TEST(xxh3_64_matches_xxhash_with_seed)
{
    tu_rng rng = {99};
    uint8_t buf[1200];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)tu_next(&rng);
    /* lengths cross every internal XXH3 path: 0, 1-3, 4-8, 9-16, 17-128,
     * 129-240, > 240; seeds include 0 and values like file offsets */
    static const size_t lens[] = {0, 1, 3, 4, 8, 9, 16, 17, 64, 128, 129, 200, 240, 241, 1024, 1200};
    static const uint64_t seeds[] = {0, 1, 64, 4096, UINT64_C(0xFFFFFFFFFFFFFFC0), UINT64_MAX};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; k++) {
            uint64_t want = XXH3_64bits_withSeed(buf, lens[i], seeds[k]);
            ck_assert_uint_eq(fkvf_xxh3_64(buf, lens[i], seeds[k]), want);
            /* and from an odd address */
            uint8_t *odd = tu_dup_odd(buf, lens[i]);
            ck_assert_uint_eq(fkvf_xxh3_64(odd, lens[i], seeds[k]), want);
            tu_free_odd(odd);
        }
    /* the seed matters (spec 2.3: seeds are file offsets) */
    ck_assert_uint_ne(fkvf_xxh3_64(buf, 64, 0), fkvf_xxh3_64(buf, 64, 64));
}
END_TEST

START_TEST(xxh3_128_canonical_byte_order)
{
    tu_rng rng = {5};
    uint8_t buf[500];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)tu_next(&rng);
    static const size_t lens[] = {0, 1, 5, 16, 17, 128, 129, 240, 241, 500};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        XXH128_hash_t h = XXH3_128bits_withSeed(buf, lens[i], 0);
        uint8_t out[16];
        fkvf_xxh3_128(buf, lens[i], out);
        /* spec 2.3: high64 big-endian, then low64 big-endian */
        for (int b = 0; b < 8; b++) {
            ck_assert_uint_eq(out[b], (uint8_t)(h.high64 >> (56 - 8 * b)));
            ck_assert_uint_eq(out[8 + b], (uint8_t)(h.low64 >> (56 - 8 * b)));
        }
    }
    /* published XXH3-128 of the empty input, seed 0 */
    uint8_t e[16];
    fkvf_xxh3_128("", 0, e);
    static const uint8_t want[16] = {0x99, 0xAA, 0x06, 0xD3, 0x01, 0x47, 0x98, 0xD8,
                                     0x60, 0x01, 0xC3, 0x24, 0x46, 0x8D, 0x49, 0x7F};
    ck_assert(memcmp(e, want, 16) == 0);
}
END_TEST

static Suite *common_suite(void)
{
    Suite *s = suite_create("common");
    TCase *t = tcase_create("errors");
    tcase_add_test(t, error_every_code_has_name_text_and_class);
    tcase_add_test(t, error_texts_are_distinct);
    tcase_add_test(t, error_unknown_code_never_null);
    tcase_add_test(t, error_class_ranges);
    tcase_add_test(t, version_macros_match_runtime);
    tcase_add_test(t, index_stream_id_canonical_order);
    tcase_add_test(t, quad_bits_for_widths);
    tcase_add_test(t, diag_fields_beside_the_message);
    tcase_add_test(t, diag_message_length_is_documented);
    tcase_add_test(t, reader_error_names_the_field);
    tcase_add_test(t, filemap_maps_and_reads);
    tcase_add_test(t, hash_pair_and_filemap_drop);
    tcase_add_test(t, alloc_large_tables);
    suite_add_tcase(s, t);
    t = tcase_create("le_ckd");
    tcase_add_test(t, le_store_load_round_trip);
    tcase_add_test(t, le_byte_order_is_little_endian);
    tcase_add_test(t, le_cursor_reads_in_order);
    tcase_add_test(t, le_cursor_past_end_sets_bad_and_returns_zero);
    tcase_add_test(t, le_range_ok_edges);
    tcase_add_test(t, ckd_add_mul_edges);
    tcase_add_test(t, ckd_tosz_align_ceildiv_edges);
    tcase_add_test(t, strndup_copies_and_terminates);
    suite_add_tcase(s, t);
    t = tcase_create("utf8");
    tcase_add_test(t, utf8_accepts_valid_sequences);
    tcase_add_test(t, utf8_rejects_overlongs);
    tcase_add_test(t, utf8_rejects_surrogates_and_out_of_range);
    tcase_add_test(t, utf8_rejects_truncated_and_stray_bytes);
    tcase_add_test(t, utf8_exhaustive_two_byte_space);
    tcase_add_test(t, utf8_matches_reference_on_random_code_points);
    suite_add_tcase(s, t);
    t = tcase_create("xxh3");
    tcase_add_test(t, xxh3_64_known_vectors);
    tcase_add_test(t, xxh3_64_matches_xxhash_with_seed);
    tcase_add_test(t, xxh3_128_canonical_byte_order);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return tu_run_suite(common_suite());
}
