/* Container tests, damage: every truncation and every bit flip of a file fails with the right error.
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
#include "codec/codec.h"
#include "common/hash.h"
#include "common/le.h"
#include "fkvf.h"
#include "format/format.h"
#include "container_model.h"
#include "testutil.h"

/* ==== 4. every truncation ======================================================= */

START_TEST(every_truncation_fails_truncated)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    ck_assert_uint_gt(b.size, 1024);
    ck_assert_uint_lt(b.size, 8192);
    /* A single-commit file has one trailer, at its very end: any prefix lacks
     * it (or lacks the header), so every prefix is TRUNCATED (spec 3.1, 7.2). */
    char msg[600];
    for (size_t len = 0; len < b.size; len++) {
        msg[0] = 0;
        int rc = try_open(b.data, len, 0, msg, sizeof msg);
        EXPECTF(rc == FKVF_E_TRUNCATED, "length %zu: %s (%s)", len, fkvf_error_name(rc), msg);
        EXPECTF(fkvf_error_class(rc) == FKVF_ERRCLASS_FORMAT, "length %zu", len);
        EXPECTF(strlen(msg) > 0 && strstr(msg, "TRUNCATED") != NULL, "length %zu: message %s",
                len, msg);
        int rc2 = try_open(b.data, len, FKVF_OPEN_STRICT, NULL, 0);
        EXPECTF(rc2 == FKVF_E_TRUNCATED, "strict length %zu: %s", len, fkvf_error_name(rc2));
    }
    /* the full file opens */
    ck_assert_int_eq(try_open(b.data, b.size, 0, NULL, 0), FKVF_OK);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(truncated_files_on_disk)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    char *dir = make_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/t.fkvf", dir);
    for (size_t len = 0; len < b.size; len += len < 200 ? 1 : 37) {
        tu_write_file(path, b.data, len);
        fkvf_reader *r = NULL;
        int rc = fkvf_reader_open_file(&r, path, 0, NULL);
        EXPECTF(rc == FKVF_E_TRUNCATED, "length %zu: %s", len, fkvf_error_name(rc));
        EXPECT(r != NULL && strstr(fkvf_reader_message(r), path) != NULL);
        fkvf_reader_free(r);
    }
    rm_tmpdir(dir);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* ==== 5. bit flips ============================================================= */

/* expected open result of flipping a bit in header byte i (spec 3.1 order) */
static int header_flip_code(size_t i)
{
    if (i < 9)
        return FKVF_E_BAD_MAGIC;
    if (i == 10 || i == 11)
        return FKVF_E_VERSION;
    if (i >= 16 && i < 20)
        return FKVF_E_BYTE_ORDER;
    return FKVF_E_CHECKSUM;
}

static void flip_range(uint8_t *c, size_t size, uint64_t from, uint64_t to, const char *what,
                       int (*code_of)(size_t rel))
{
    char msg[600];
    for (uint64_t i = from; i < to; i++)
        for (int bit = 0; bit < 8; bit++) {
            c[i] ^= (uint8_t)(1u << bit);
            int rc = try_open(c, size, 0, msg, sizeof msg);
            int want = code_of((size_t)(i - from));
            EXPECTF(rc == want, "%s byte %llu bit %d: %s, want %s (%s)", what,
                    (unsigned long long)i, bit, fkvf_error_name(rc), fkvf_error_name(want), msg);
            EXPECTF(strlen(msg) > 0, "%s byte %llu: empty message", what, (unsigned long long)i);
            c[i] ^= (uint8_t)(1u << bit);
        }
}

static int dir_flip_code(size_t i)
{
    (void)i;
    return FKVF_E_CHECKSUM;
}

static int trailer_flip_code(size_t i) { return i < 8 ? FKVF_E_TRUNCATED : FKVF_E_CHECKSUM; }

START_TEST(every_header_bit_flip)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    flip_range(b.data, b.size, 0, 64, "header", header_flip_code);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(every_directory_bit_flip)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    layout l = layout_of(b.data, b.size);
    ck_assert_uint_eq(l.dir_off + l.dir_size, l.trailer_off);
    flip_range(b.data, b.size, l.dir_off, l.dir_off + l.dir_size, "directory", dir_flip_code);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

START_TEST(every_trailer_bit_flip)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    layout l = layout_of(b.data, b.size);
    flip_range(b.data, b.size, l.trailer_off, b.size, "trailer", trailer_flip_code);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* Flips in section bytes: open or verify fails with CHECKSUM; flips in the
 * padding between sections: open succeeds, verify reports PADDING. */
START_TEST(every_payload_bit_flip)
{
    model m;
    model_small(&m);
    tu_buf b;
    build(&m, &b);
    layout l = layout_of(b.data, b.size);
    /* which bytes belong to a section */
    uint8_t *in_sec = calloc(b.size, 1);
    ck_assert_ptr_nonnull(in_sec);
    {
        fkvf_reader *r = NULL;
        OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
        fkvf_archive_info ai;
        OK_R(r, fkvf_reader_info(r, &ai));
        /* DESC CBK1 META EXACx3 VTXS STRMx2 */
        ck_assert_uint_eq(ai.n_sections, 9);
        ck_assert_uint_eq(ai.n_sections, model_n_sections(&m));
        for (size_t i = 0; i < ai.n_sections; i++) {
            fkvf_section_info si;
            OK_R(r, fkvf_reader_section(r, i, &si));
            memset(in_sec + si.offset, 1, (size_t)si.stored_size);
        }
        fkvf_reader_free(r);
    }
    uint8_t *c = malloc(b.size);
    ck_assert_ptr_nonnull(c);
    memcpy(c, b.data, b.size);
    size_t n_sec = 0, n_pad = 0, at_open = 0;
    for (uint64_t i = 64; i < l.dir_off; i++)
        for (int bit = 0; bit < 8; bit++) {
            c[i] ^= (uint8_t)(1u << bit);
            fkvf_reader *r = NULL;
            int rc = fkvf_reader_open_memory(&r, c, b.size, 0, NULL);
            if (in_sec[i]) {
                n_sec++;
                if (rc == FKVF_OK)
                    rc = fkvf_reader_verify(r);
                else
                    at_open++;
                EXPECTF(rc == FKVF_E_CHECKSUM, "section byte %llu bit %d: %s (%s)",
                        (unsigned long long)i, bit, fkvf_error_name(rc),
                        fkvf_reader_message(r));
            } else {
                n_pad++;
                EXPECTF(rc == FKVF_OK, "padding byte %llu: open %s (%s)", (unsigned long long)i,
                        fkvf_error_name(rc), fkvf_reader_message(r));
                rc = fkvf_reader_verify(r);
                EXPECTF(rc == FKVF_E_PADDING, "padding byte %llu bit %d: verify %s",
                        (unsigned long long)i, bit, fkvf_error_name(rc));
                EXPECT(strstr(fkvf_reader_message(r), "padding") != NULL);
            }
            fkvf_reader_free(r);
            c[i] ^= (uint8_t)(1u << bit);
        }
    ck_assert_uint_gt(n_sec, 8 * 1000);
    ck_assert_uint_gt(n_pad, 8 * 50);
    ck_assert_uint_gt(at_open, 0);
    ck_assert_uint_lt(at_open, n_sec); /* some are caught only by the lazy checks */
    free(c);
    free(in_sec);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* Lazy path: a flipped data byte is caught by the block checksum on first
 * touch, without verify; blocks not touched stay readable. */
/* Lazy path: a flipped data byte is caught by the block checksum on first
 * touch, without verify; blocks not touched stay readable. Every stream of
 * a group lives in one section: the flip is in the last symbol of stream s
 * (its own block), and stream s's first symbol and the other streams'
 * symbols in other blocks still read back. */
START_TEST(stream_block_flip_caught_on_first_touch)
{
    model m;
    model_many(&m, FKVF_DTYPE_F16);
    tu_buf b;
    build(&m, &b);
    for (size_t s = 0; s < m.n_st; s++) {
        const tstream *ts = &m.st[s];
        int tok = (ts->id >> 56) == FKVF_STREAM_KIND_TOKENS;
        fkvf_reader *r = NULL;
        OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
        fkvf_section_info si;
        ck_assert_uint_ne(find_section(r, FKVF_SECTION_STRM, tok, &si), SIZE_MAX);
        fkvf_reader_free(r);
        /* derive the layout from the header */
        fkvf_strm_hdr h;
        char msg[600];
        fkvf_diag d;
        memset(&d, 0, sizeof d);
        ck_assert_int_eq(fkvf_strm_hdr_parse(b.data + si.offset, si.stored_size, si.offset, &h, &d),
                         FKVF_OK);
        ck_assert_uint_eq(h.n_streams, tok ? 1 : 32);
        ck_assert_uint_gt(h.n_blocks, 1);
        ck_assert_int_eq(ts->spec.profile, FKVF_PROFILE_QUAD);
        /* the byte holding the first bit of the last symbol of stream s */
        uint64_t j = tok ? 0 : s;
        uint64_t rel = j * h.stream_bytes + (uint64_t)(ts->n - 1) * h.bits / 8;
        uint64_t at = si.offset + h.data_off + rel;
        uint64_t blk = rel / h.block_size;
        ck_assert_uint_ne(blk, j * h.stream_bytes / h.block_size);
        b.data[at] ^= 0x10;
        r = NULL;
        OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
        size_t idx;
        OK_R(r, fkvf_reader_stream_find(r, ts->id, &idx));
        ck_assert_uint_eq(idx, s);
        uint32_t sym;
        OK_R(r, fkvf_reader_stream_get(r, idx, 0, &sym)); /* its first block is fine */
        ck_assert_uint_eq(sym, ts->sym[0]);
        int rc = fkvf_reader_stream_get(r, idx, ts->n - 1, &sym);
        snprintf(msg, sizeof msg, "%s", fkvf_reader_message(r));
        ck_assert_msg(rc == FKVF_E_CHECKSUM, "stream %zu: %s (%s)", s, fkvf_error_name(rc), msg);
        ck_assert_msg(strstr(msg, "block") != NULL, "%s", msg);
        uint32_t *all = calloc(ts->n, sizeof *all);
        RC_R(r, fkvf_reader_stream_read(r, idx, 0, all, ts->n), FKVF_E_CHECKSUM);
        /* another stream of the group whose symbols lie in other blocks */
        if (!tok) {
            size_t o = s < 16 ? 31 : 0;
            uint64_t o0 = o * h.stream_bytes / h.block_size,
                     o1 = (o * h.stream_bytes + h.stream_bytes - 1) / h.block_size;
            ck_assert(blk < o0 || blk > o1);
            OK_R(r, fkvf_reader_stream_read(r, o, 0, all, m.st[o].n));
            ck_assert(memcmp(all, m.st[o].sym, m.st[o].n * sizeof *all) == 0);
        }
        free(all);
        RC_R(r, fkvf_reader_verify(r), FKVF_E_CHECKSUM);
        fkvf_reader_free(r);
        b.data[at] ^= 0x10;
    }
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* An ngon anchor changed by one ulp, with every checksum recomputed so
 * only the span check (spec 12.2) can see it: SPAN from reads and verify. */
/* An ngon anchor changed by one ulp, with every checksum recomputed so
 * only the span check (spec 12.2) can see it: SPAN from reads and verify.
 * With 64-byte blocks, the index streams of model_small (one 16-byte span
 * each) share a block four at a time: streams 4..7 fail, 0..3 do not. */
START_TEST(ngon_anchor_with_matching_checksums_fails_span)
{
    model m;
    model_small(&m);
    m.opts.block_size = 64;
    tu_buf b;
    build(&m, &b);
    fkvf_reader *r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    fkvf_section_info si;
    uint64_t id = FKVF_STREAM_ID(0, 1, 1, 1, 0); /* canonical index 7 */
    size_t j = model_stream_of(&m, id);
    ck_assert_uint_eq(j, 7);
    ck_assert_int_eq(m.ispec.profile, FKVF_PROFILE_NGON);
    ck_assert_uint_ne(find_section(r, FKVF_SECTION_STRM, FKVF_STREAM_GROUP_INDEX, &si), SIZE_MAX);
    fkvf_reader_free(r);
    /* spec 11.3: 8 streams x one span = 128 bytes in two 64-byte blocks;
     * the table of 2 checksums, data at align64(64 + 16) = 128 */
    ck_assert_uint_eq(si.stored_size, 128 + 8 * 16);
    uint64_t data_start = si.offset + 128, anchor = data_start + 16 * j;
    double ax = fkvf_ldf64(b.data + anchor);
    uint64_t bits;
    memcpy(&bits, &ax, 8);
    bits ^= 1; /* one ulp */
    fkvf_st64(b.data + anchor, bits);
    /* block 1's checksum (spec 11.4): seed = absolute offset of the block */
    fkvf_st64(b.data + si.offset + 64 + 8,
              fkvf_xxh3_64(b.data + data_start + 64, 64, data_start + 64));
    refresh_last_commit(b.data, b.size);

    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    size_t idx;
    OK_R(r, fkvf_reader_stream_find(r, id, &idx));
    uint32_t out[10];
    RC_R(r, fkvf_reader_stream_read(r, idx, 0, out, 5), FKVF_E_SPAN);
    ck_assert(strstr(fkvf_reader_message(r), "span") != NULL);
    RC_R(r, fkvf_reader_stream_get(r, idx, 2, out), FKVF_E_SPAN);
    /* a stream of the same block: the block's spans are checked together */
    RC_R(r, fkvf_reader_stream_read(r, 4, 0, out, 5), FKVF_E_SPAN);
    /* the streams of block 0 and the token stream are unaffected */
    for (size_t k = 0; k < 4; k++) {
        OK_R(r, fkvf_reader_stream_read(r, k, 0, out, 5));
        ck_assert(memcmp(out, m.st[k].sym, 5 * sizeof *out) == 0);
    }
    OK_R(r, fkvf_reader_stream_read(r, 8, 0, out, 10));
    ck_assert(memcmp(out, model_token_stream(&m)->sym, sizeof out) == 0);
    fkvf_reader_free(r);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    RC_R(r, fkvf_reader_verify(r), FKVF_E_SPAN);
    fkvf_reader_free(r);

    /* a non-finite anchor is SPAN too */
    fkvf_stf64(b.data + anchor, NAN);
    fkvf_st64(b.data + si.offset + 64 + 8,
              fkvf_xxh3_64(b.data + data_start + 64, 64, data_start + 64));
    refresh_last_commit(b.data, b.size);
    r = NULL;
    OK_R(r, fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL));
    RC_R(r, fkvf_reader_verify(r), FKVF_E_SPAN);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    model_free(&m);
}
END_TEST

/* ==== suite ====================================================================== */

int main(void)
{
    Suite *s = suite_create("container_damage");
    TCase *t = tcase_create("damage");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, every_truncation_fails_truncated);
    tcase_add_test(t, truncated_files_on_disk);
    tcase_add_test(t, every_header_bit_flip);
    tcase_add_test(t, every_directory_bit_flip);
    tcase_add_test(t, every_trailer_bit_flip);
    tcase_add_test(t, every_payload_bit_flip);
    tcase_add_test(t, stream_block_flip_caught_on_first_touch);
    tcase_add_test(t, ngon_anchor_with_matching_checksums_fails_span);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
