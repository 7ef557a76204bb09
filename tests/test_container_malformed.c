/* Container tests, hand-crafted malformed files: each failure mode of the reader guarded, structural field errors.
 * The archive model and the hand-crafting helpers are in container_model.h.
 *
 * Hot loops use EXPECT (an `if` around ck_abort_msg) instead of ck_assert:
 * Check records the location of every passing ck_assert, which is slow in
 * loops of tens of thousands of iterations. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "codec/codec.h"
#include "common/hash.h"
#include "common/le.h"
#include "fkvf.h"
#include "format/format.h"
#include "container_model.h"
#include "testutil.h"

/* ==== 6. hand-crafted malformed files ============================================ */

START_TEST(crafted_baseline_is_valid)
{
    craft c;
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, FKVF_OPEN_STRICT, NULL));
    OK_R(r, fkvf_reader_verify(r));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_uint_eq(ai.n_sections, 2);
    fkvf_desc d;
    OK_R(r, fkvf_reader_desc(r, &d));
    ck_assert_str_eq(d.model_id, "model");
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_non_fkvf_file_accepted)
{
    static const char png[] = "\x89PNG\r\n\x1a\n and then some more bytes of a png file.....";
    char msg[600];
    ck_assert_int_eq(try_open((const uint8_t *)png, sizeof png, 0, msg, sizeof msg),
                     FKVF_E_BAD_MAGIC);
    ck_assert(strstr(msg, "magic") != NULL);
    ck_assert_int_eq(try_open((const uint8_t *)"\x89", 1, 0, NULL, 0), FKVF_E_TRUNCATED);
    ck_assert_int_eq(try_open((const uint8_t *)"X", 1, 0, NULL, 0), FKVF_E_BAD_MAGIC);
    craft c;
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    c.b.data[1] = 'G'; /* "\x89GKVF..." */
    EXPECT_OPEN(&c, FKVF_E_BAD_MAGIC, "3.1");
    c.b.data[1] = 'F';
    c.b.data[8] = 0x0B;
    EXPECT_OPEN(&c, FKVF_E_BAD_MAGIC, "magic");
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_major_version_2_read_as_v1)
{
    craft c;
    cr_header(&c, 2, 0, 0, 0); /* checksum valid for major 2 */
    cr_desc(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_VERSION, "format_major");
    tu_buf_free(&c.b);
    /* minor versions are compatible (spec 3.2) */
    cr_header(&c, 1, 7, 0, UINT64_C(1) << 63); /* and unknown optional bits are ignored */
    cr_desc(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    ck_assert_uint_eq(ai.format_minor, 7);
    ck_assert_uint_eq(ai.optional_features, UINT64_C(1) << 63);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_big_endian_file_misread)
{
    craft c;
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    /* a big-endian writer stores 0x0A0B0C0D as 0A 0B 0C 0D */
    uint8_t *h = c.b.data;
    h[16] = 0x0A, h[17] = 0x0B, h[18] = 0x0C, h[19] = 0x0D;
    fkvf_st64(h + 56, fkvf_xxh3_64(h, 56, 0));
    EXPECT_OPEN(&c, FKVF_E_BYTE_ORDER, "big-endian");
    h[16] = 0x0D, h[17] = 0x0C, h[18] = 0x0B, h[19] = 0x00;
    fkvf_st64(h + 56, fkvf_xxh3_64(h, 56, 0));
    EXPECT_OPEN(&c, FKVF_E_BYTE_ORDER, "byte_order");
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_unknown_required_feature_ignored)
{
    for (int bit = 4; bit < 64; bit += 5) {
        craft c;
        craft_base(&c, UINT64_C(1) << bit);
        cr_commit(&c, 1, 0, 0, 0);
        EXPECT_OPEN(&c, FKVF_E_FEATURE, "required_features");
        tu_buf_free(&c.b);
    }
    /* header field checks in spec 3.1 order: reserved bytes -> CORRUPT */
    craft c;
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    c.b.data[44] = 1;
    fkvf_st64(c.b.data + 56, fkvf_xxh3_64(c.b.data, 56, 0));
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "reserved");
    c.b.data[44] = 0;
    fkvf_st16(c.b.data + 14, 128);
    fkvf_st64(c.b.data + 56, fkvf_xxh3_64(c.b.data, 56, 0));
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "header_size");
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_misaligned_section_offset_accepted)
{
    craft c;
    craft_base(&c, 0);
    c.e[1].offset += 8;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_ALIGN, "4.1");
    tu_buf_free(&c.b);
    /* a misaligned directory offset in the trailer */
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    uint64_t t = c.b.size - 64;
    fkvf_st64(c.b.data + t + 16, fkvf_ld64(c.b.data + t + 16) + 8);
    fkvf_st64(c.b.data + t + 56, fkvf_xxh3_64(c.b.data + t, 56, t));
    EXPECT_OPEN(&c, FKVF_E_ALIGN, "dir_offset");
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_overlapping_sections_accepted)
{
    craft c;
    craft_base(&c, 0);
    c.e[1].offset = c.e[0].offset; /* both at 64 */
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_OVERLAP, "overlaps");
    tu_buf_free(&c.b);
    /* out of order */
    craft_base(&c, 0);
    fkvf_dirent t = c.e[0];
    c.e[0] = c.e[1];
    c.e[1] = t;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_OVERLAP, "4.5");
    tu_buf_free(&c.b);
    /* one byte of overlap */
    craft_base(&c, 0);
    c.e[0].stored_size = c.e[0].size = c.e[1].offset - c.e[0].offset + 1;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_OVERLAP, "4.5");
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_section_reaching_into_directory)
{
    craft c;
    craft_base(&c, 0);
    uint64_t dir = cr_dir_off(&c);
    c.e[1].stored_size = c.e[1].size = dir - c.e[1].offset + 1;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_BOUNDS, "4.5");
    tu_buf_free(&c.b);
    /* exactly up to the directory is fine as far as bounds go (the
     * checksum, over the 40 bytes written, then fails) */
    cr_header(&c, 1, 0, 0, 0);
    cr_desc(&c, 0);
    cr_plain(&c, XTRA, 0, 0, "0123456789012345678901234567890123456789", 40);
    dir = cr_dir_off(&c);
    c.e[1].stored_size = c.e[1].size = dir - c.e[1].offset;
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    RC_R(r, fkvf_reader_verify(r), FKVF_E_CHECKSUM);
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    /* far beyond the file, and wrapping around */
    craft_base(&c, 0);
    c.e[1].offset = UINT64_C(1) << 40;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_BOUNDS, "outside");
    tu_buf_free(&c.b);
    /* the largest size spec 4.2 allows (2^48) still fails on bounds */
    craft_base(&c, 0);
    c.e[1].stored_size = c.e[1].size = UINT64_C(1) << 48;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_BOUNDS, "outside");
    tu_buf_free(&c.b);
    /* an offset near 2^64 whose end wraps around to a small value (bug
     * guard: the end was computed without an overflow check) */
    craft_base(&c, 0);
    c.e[1].offset = UINT64_MAX - 63;
    c.e[1].stored_size = c.e[1].size = 128;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_BOUNDS, "outside");
    tu_buf_free(&c.b);
    craft_base(&c, 0);
    c.e[1].offset = UINT64_MAX - 63;
    c.e[1].stored_size = c.e[1].size = UINT64_C(1) << 48;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_BOUNDS, "outside");
    tu_buf_free(&c.b);
    /* inside the header */
    craft_base(&c, 0);
    c.e[0].offset = 0;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_BOUNDS, "outside");
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_nonzero_padding_unnoticed)
{
    craft c;
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    /* DESC is 133 bytes at 64: padding 197..255 */
    uint64_t pad = 64 + 133 + 10;
    ck_assert_uint_eq(c.b.data[pad], 0);
    c.b.data[pad] = 0x01;
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL)); /* fast path */
    RC_R(r, fkvf_reader_verify(r), FKVF_E_PADDING);
    ck_assert(strstr(fkvf_reader_message(r), "207") != NULL); /* names the offset */
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    /* padding before the trailer is not possible (the directory is a multiple
     * of 64); unused bits after a quad stream's last symbol (spec 11.7) */
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_section_info si;
    ck_assert_uint_ne(find_section(r, FKVF_SECTION_STRM, FKVF_STREAM_GROUP_TOKENS, &si),
                      SIZE_MAX);
    fkvf_reader_free(r);
    /* the token stream, 10 symbols of 32 bits: bytes 40..47 of the third
     * 16-byte unit are padding */
    ck_assert_uint_eq(si.stored_size, 128 + 48);
    uint64_t data = si.offset + 128;
    b.data[data + 44] = 0x80;
    refresh_strm(b.data, si.offset);
    refresh_last_commit(b.data, b.size);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    size_t idx;
    uint32_t out[10];
    OK_R(r, fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &idx));
    OK_R(r, fkvf_reader_stream_read(r, idx, 0, out, 10));
    ck_assert(memcmp(out, model_token_stream(&m)->sym, sizeof out) == 0);
    RC_R(r, fkvf_reader_verify(r), FKVF_E_PADDING);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* Full verification parses every META section, also one a later commit
 * replaced (spec 1.3.3, 9.3); the ordinary path reads only the one in
 * effect. Found by the second reader (conformance/pyreader). */
/* A codebook element that is not finite makes the file invalid (spec 13.2):
 * restoring an archived row from it fails with CORRUPT (the reader used to
 * report FKVF_E_INVALID_ARG, a caller error, spec 16.3; found by the second
 * reader, conformance/pyreader), and full verification rejects it with
 * CORRUPT too (it used to accept such a file, issue 17 point 8:
 * conformance/files/cbk1_value_nan*.fkvf). */
/* An EXAC count whose rows exceed 2^48 bytes is LIMIT even though the
 * section is also shorter than they need (spec 14.2, 15, 16.2); libfkvf
 * said TRUNCATED unless count * row_bytes overflowed 64 bits. Found by the
 * second reader (conformance/pyreader). */
START_TEST(exac_count_beyond_limit)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    uint64_t exac = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        OK_R(r, fkvf_reader_section(r, i, &si));
        if (si.type == FKVF_SECTION_EXAC && !(si.flags & FKVF_SECTION_DEFLATE))
            exac = si.offset;
    }
    fkvf_reader_free(r);
    ck_assert_uint_gt(exac, 0);
    fkvf_st64(b.data + exac + 8, UINT64_C(1) << 44); /* x 128-byte rows > 2^48, no overflow */
    refresh_last_commit(b.data, b.size);
    r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL), FKVF_E_LIMIT);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(codebook_value_not_finite)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_archive_info ai;
    OK_R(r, fkvf_reader_info(r, &ai));
    uint64_t cbk = 0, cbk_n = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        OK_R(r, fkvf_reader_section(r, i, &si));
        if (si.type == FKVF_SECTION_CBK1) {
            ck_assert_uint_eq(si.flags & FKVF_SECTION_DEFLATE, 0);
            cbk = si.offset;
            cbk_n = si.stored_size;
        }
    }
    fkvf_reader_free(r);
    ck_assert_uint_gt(cbk_n, 64 + 10);
    fkvf_st16(b.data + cbk + 64 + 2 * 5, 0x7C00); /* +inf in f16 */
    refresh_last_commit(b.data, b.size);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    size_t rb;
    OK_R(r, fkvf_reader_row_bytes(r, FKVF_DTYPE_F32, &rb));
    float *out = malloc(rb);
    ck_assert_ptr_nonnull(out);
    RC_R(r, fkvf_reader_restore(r, m.desc.n_sinks, 1, FKVF_DTYPE_F32, out, rb), FKVF_E_CORRUPT);
    RC_R(r, fkvf_reader_verify(r), FKVF_E_CORRUPT);
    ck_assert_msg(strstr(fkvf_reader_message(r), "not finite"), "%s", fkvf_reader_message(r));
    free(out);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(verify_replaced_meta)
{
    mbuild mb;
    memset(&mb, 0, sizeof mb);
    mb_u64(&mb, "alpha", 1);
    mb_u64(&mb, "alpha", 2);
    craft c;
    craft_base(&c, 0);
    cr_plain(&c, FKVF_SECTION_META, 0, 0, mb.b.data, mb.b.size);
    cr_commit(&c, 1, 0, 0, 0);
    tu_buf_free(&mb.b);
    uint64_t t1 = c.b.size - 64;
    memset(&mb, 0, sizeof mb);
    mb_u64(&mb, "alpha", 3);
    cr_plain(&c, FKVF_SECTION_META, 0, 0, mb.b.data, mb.b.size);
    cr_commit(&c, 2, t1, 0, 0);
    tu_buf_free(&mb.b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, FKVF_OPEN_STRICT, NULL));
    fkvf_meta_entry e;
    OK_R(r, fkvf_reader_meta_find(r, "alpha", &e));
    ck_assert_uint_eq(e.u64, 3);
    RC_R(r, fkvf_reader_verify(r), FKVF_E_DUP_KEY);
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
}
END_TEST

START_TEST(guard_duplicate_meta_keys_ambiguous)
{
    mbuild mb;
    memset(&mb, 0, sizeof mb);
    mb_u64(&mb, "alpha", 1);
    mb_u64(&mb, "beta", 2);
    mb_u64(&mb, "alpha", 3);
    craft c;
    craft_base(&c, 0);
    cr_plain(&c, FKVF_SECTION_META, 0, 0, mb.b.data, mb.b.size);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL)); /* META is lazy */
    size_t n;
    RC_R(r, fkvf_reader_meta_count(r, &n), FKVF_E_DUP_KEY);
    ck_assert(strstr(fkvf_reader_message(r), "alpha") != NULL);
    fkvf_meta_entry e;
    RC_R(r, fkvf_reader_meta_find(r, "beta", &e), FKVF_E_DUP_KEY);
    RC_R(r, fkvf_reader_meta(r, 0, &e), FKVF_E_DUP_KEY);
    RC_R(r, fkvf_reader_verify(r), FKVF_E_DUP_KEY);
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    tu_buf_free(&mb.b);

    /* the same keys far apart in a larger table */
    memset(&mb, 0, sizeof mb);
    char key[32];
    for (int i = 0; i < 500; i++) {
        snprintf(key, sizeof key, "key.%d", i);
        mb_u64(&mb, key, (uint64_t)i);
    }
    mb_u64(&mb, "key.0", 9);
    craft_base(&c, 0);
    cr_plain(&c, FKVF_SECTION_META, 0, 0, mb.b.data, mb.b.size);
    cr_commit(&c, 1, 0, 0, 0);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    RC_R(r, fkvf_reader_verify(r), FKVF_E_DUP_KEY);
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    tu_buf_free(&mb.b);
}
END_TEST

/* spec 4.4: size <= 2^40 and size <= 1032 * stored_size + 64, else LIMIT,
 * checked from the directory before anything is allocated. */
START_TEST(guard_deflate_bomb_declaration)
{
    static const uint8_t junk[100] = {1, 2, 3};
    /* (sizes above 2^48 are the LIMIT of spec 4.2 instead: see
     * directory_entry_limits) */
    static const uint64_t sizes[] = {1032 * 100 + 65, 1032 * 100 + 1031, 1032 * 101,
                                     UINT64_C(1) << 39, (UINT64_C(1) << 40) + 1,
                                     UINT64_C(1) << 48};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        craft c;
        craft_base(&c, FKVF_FEAT_DEFLATE);
        cr_section(&c, FKVF_FOURCC('B', 'O', 'M', 'B'), FKVF_SECTION_DEFLATE, 0, junk,
                   sizeof junk, sizes[i]);
        cr_commit(&c, 1, 0, 0, 0);
        char msg[600];
        int rc = open_craft(&c, 0, msg, sizeof msg);
        ck_assert_msg(rc == FKVF_E_LIMIT, "size %llu: %s (%s)", (unsigned long long)sizes[i],
                      fkvf_error_name(rc), msg);
        ck_assert(strstr(msg, "4.4") != NULL);
        tu_buf_free(&c.b);
    }
    /* at the limit: accepted by the directory check; the stream is junk -> DEFLATE */
    craft c;
    craft_base(&c, FKVF_FEAT_DEFLATE);
    cr_section(&c, FKVF_FOURCC('B', 'O', 'M', 'B'), FKVF_SECTION_DEFLATE, 0, junk, sizeof junk,
               1032 * 100 + 64);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    const void *p;
    size_t n;
    RC_R(r, fkvf_reader_section_data(r, 2, &p, &n), FKVF_E_DEFLATE);
    RC_R(r, fkvf_reader_verify(r), FKVF_E_DEFLATE);
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    /* deflate without the header's feature bit */
    craft_base(&c, 0);
    cr_section(&c, FKVF_FOURCC('B', 'O', 'M', 'B'), FKVF_SECTION_DEFLATE, 0, junk, sizeof junk,
               200);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "DEFLATE feature");
    tu_buf_free(&c.b);
}
END_TEST

static uint8_t *zcompress(const void *p, size_t n, size_t *zn)
{
    uLongf bound = compressBound((uLong)n);
    uint8_t *z = malloc(bound);
    ck_assert_ptr_nonnull(z);
    ck_assert_int_eq(compress2(z, &bound, p, (uLong)n, 9), Z_OK);
    *zn = bound;
    return z;
}

START_TEST(guard_corrupt_deflate_served_as_data)
{
    fkvf_desc d;
    simple_desc(&d);
    d.model_id = "a model id long enough that the descriptor compresses well well well well";
    size_t dn, zn;
    uint8_t *dp = desc_bytes(&d, &dn);
    uint8_t *z = zcompress(dp, dn, &zn);
    craft c;
    /* sanity: the intact deflated DESC opens */
    cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
    cr_section(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, z, zn, dn);
    cr_commit(&c, 1, 0, 0, 0);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, c.b.data, c.b.size, 0, NULL));
    fkvf_desc got;
    OK_R(r, fkvf_reader_desc(r, &got));
    ck_assert_str_eq(got.model_id, d.model_id);
    OK_R(r, fkvf_reader_verify(r));
    fkvf_reader_free(r);
    tu_buf_free(&c.b);
    /* every single-byte change of the stream (checksums recomputed): DEFLATE */
    for (size_t i = 0; i < zn; i++) {
        z[i] ^= 0x20;
        cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
        cr_section(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, z, zn,
                   dn);
        cr_commit(&c, 1, 0, 0, 0);
        char msg[600];
        int rc = open_craft(&c, 0, msg, sizeof msg);
        EXPECTF(rc == FKVF_E_DEFLATE, "byte %zu: %s (%s)", i, fkvf_error_name(rc), msg);
        tu_buf_free(&c.b);
        z[i] ^= 0x20;
    }
    /* declared size one more / one less than the stream gives */
    for (int delta = -1; delta <= 1; delta += 2) {
        cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
        cr_section(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, z, zn,
                   (uint64_t)((long long)dn + delta));
        cr_commit(&c, 1, 0, 0, 0);
        EXPECT_OPEN(&c, FKVF_E_DEFLATE, "4.4");
        tu_buf_free(&c.b);
    }
    /* a truncated stream, and bytes after the stream */
    cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
    cr_section(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, z, zn - 3,
               dn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_DEFLATE, "4.4");
    tu_buf_free(&c.b);
    uint8_t *z2 = malloc(zn + 4);
    memcpy(z2, z, zn);
    memcpy(z2 + zn, "tail", 4);
    cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
    cr_section(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, z2, zn + 4,
               dn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_DEFLATE, "after the stream");
    tu_buf_free(&c.b);
    /* a raw (not zlib-wrapped) payload */
    cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
    cr_section(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, dp, dn,
               dn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_DEFLATE, "4.4");
    tu_buf_free(&c.b);
    /* STRM is never deflated (spec 4.4) */
    cr_header(&c, 1, 0, FKVF_FEAT_DEFLATE, 0);
    cr_desc(&c, 0);
    cr_section(&c, FKVF_SECTION_STRM, FKVF_SECTION_REQUIRED | FKVF_SECTION_DEFLATE, 0, z, zn, dn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "never deflated");
    tu_buf_free(&c.b);
    free(z2);
    free(z);
    free(dp);
}
END_TEST

START_TEST(guard_structural_field_errors)
{
    craft c;
    fkvf_desc d;
    size_t dn;
    uint8_t *dp;
    /* a second DESC */
    craft_base(&c, 0);
    cr_desc(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "second DESC");
    tu_buf_free(&c.b);
    /* a DESC field out of range (checksums valid) */
    simple_desc(&d);
    dp = desc_bytes(&d, &dn);
    dp[16] = 9; /* dtype */
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED, 0, dp, dn);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "dtype");
    tu_buf_free(&c.b);
    /* DESC lengths that do not match the section */
    dp[16] = FKVF_DTYPE_F16;
    cr_header(&c, 1, 0, 0, 0);
    cr_plain(&c, FKVF_SECTION_DESC, FKVF_SECTION_REQUIRED, 0, dp, dn - 1);
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_TRUNCATED, "DESC");
    tu_buf_free(&c.b);
    free(dp);
    /* unknown directory flag bits, non-zero reserved entry bytes */
    craft_base(&c, 0);
    c.e[1].flags = 4;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "flag");
    tu_buf_free(&c.b);
    /* size != stored_size without deflate */
    craft_base(&c, 0);
    c.e[1].size = 65;
    cr_commit(&c, 1, 0, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "stored_size");
    tu_buf_free(&c.b);
    /* directory commit_seq differs from the trailer's */
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 0, 0);
    {
        layout l = layout_of(c.b.data, c.b.size);
        fkvf_st64(c.b.data + l.dir_off + 8, 2);
        refresh_last_commit(c.b.data, c.b.size);
    }
    EXPECT_OPEN(&c, FKVF_E_CHAIN, "commit_seq");
    tu_buf_free(&c.b);
    /* positions without exact rows */
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 3, 0);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "not covered");
    tu_buf_free(&c.b);
    /* n_archived > n_positions */
    craft_base(&c, 0);
    cr_commit(&c, 1, 0, 3, 4);
    EXPECT_OPEN(&c, FKVF_E_CORRUPT, "n_archived");
    tu_buf_free(&c.b);
    /* commit 1 with a prev_trailer */
    craft_base(&c, 0);
    cr_commit(&c, 1, 128, 0, 0);
    EXPECT_OPEN(&c, FKVF_E_CHAIN, "prev_trailer");
    tu_buf_free(&c.b);
}
END_TEST

/* ==== suite ====================================================================== */

int main(void)
{
    Suite *s = suite_create("container_malformed");
    TCase *t = tcase_create("crafted");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, crafted_baseline_is_valid);
    tcase_add_test(t, guard_non_fkvf_file_accepted);
    tcase_add_test(t, guard_major_version_2_read_as_v1);
    tcase_add_test(t, guard_big_endian_file_misread);
    tcase_add_test(t, guard_unknown_required_feature_ignored);
    tcase_add_test(t, guard_misaligned_section_offset_accepted);
    tcase_add_test(t, guard_overlapping_sections_accepted);
    tcase_add_test(t, guard_section_reaching_into_directory);
    tcase_add_test(t, guard_nonzero_padding_unnoticed);
    tcase_add_test(t, guard_duplicate_meta_keys_ambiguous);
    tcase_add_test(t, guard_deflate_bomb_declaration);
    tcase_add_test(t, verify_replaced_meta);
    tcase_add_test(t, codebook_value_not_finite);
    tcase_add_test(t, exac_count_beyond_limit);
    tcase_add_test(t, guard_corrupt_deflate_served_as_data);
    tcase_add_test(t, guard_structural_field_errors);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
