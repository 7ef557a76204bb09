/* fkvf_validate_*: (a) the conformance suite (every accepted file has no
 * violation even with the writer rules, every rejected file has one of the
 * manifest's class); (b) one fixture per writer-side rule that an ordinary
 * reader accepts and the validator flags, with the exact clause; (c) several
 * faults in one file are all reported, and the cap stops the report.
 *
 * The fixtures are made from a valid archive written by the public writer
 * API; the fault is injected and every checksum that would otherwise also
 * fail is recomputed here (from the spec's definitions), so each file has
 * exactly the fault named. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/le.h"
#include "fkvf.h"
#include "search/zidx_legacy.h"
#include "testutil.h"

/* ---- collecting violations --------------------------------------------------- */

#define MAXV 64
typedef struct vlist {
    size_t n;
    int code[MAXV];
    char clause[MAXV][16];
    char check[MAXV][32];
    int writer[MAXV];
    uint64_t off[MAXV];
    char msg[MAXV][200];
} vlist;

static int collect(void *opaque, const fkvf_violation *v)
{
    vlist *l = opaque;
    if (l->n < MAXV) {
        l->code[l->n] = v->code;
        snprintf(l->clause[l->n], 16, "%s", v->clause);
        snprintf(l->check[l->n], 32, "%s", v->check);
        l->writer[l->n] = v->writer_rule;
        l->off[l->n] = v->offset;
        snprintf(l->msg[l->n], 200, "%s", v->message);
    }
    l->n++;
    return 0;
}

static void dump(const vlist *l, char *out, size_t cap)
{
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < l->n && i < MAXV && k + 1 < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, " [%s %s %s: %.80s]", l->clause[i],
                              fkvf_error_name(l->code[i]), l->check[i], l->msg[i]);
}

static vlist validate(const uint8_t *d, size_t n, unsigned flags)
{
    vlist l;
    memset(&l, 0, sizeof l);
    fkvf_validate_options o;
    memset(&o, 0, sizeof o);
    o.flags = flags;
    fkvf_validate_result res;
    ck_assert_int_eq(fkvf_validate_memory(d, n, &o, collect, &l, &res), FKVF_OK);
    ck_assert_uint_eq(res.violations, l.n);
    return l;
}

/* the only violation is (code, clause, check) */
static void expect_only(const vlist *l, int code, const char *clause, const char *check)
{
    char s[2048];
    dump(l, s, sizeof s);
    ck_assert_msg(l->n == 1, "want one violation [%s %s %s], got %zu:%s", clause,
                  fkvf_error_name(code), check, l->n, s);
    ck_assert_msg(l->code[0] == code && !strcmp(l->clause[0], clause) &&
                      !strcmp(l->check[0], check),
                  "want [%s %s %s], got%s", clause, fkvf_error_name(code), check, s);
}

static int has(const vlist *l, int code, const char *clause, const char *check)
{
    for (size_t i = 0; i < l->n && i < MAXV; i++)
        if (l->code[i] == code && !strcmp(l->clause[i], clause) && !strcmp(l->check[i], check))
            return 1;
    return 0;
}

/* an ordinary (non-strict) reader opens the file and reads every exact row,
 * every token and every index symbol */
static void reader_accepts(const uint8_t *d, size_t n)
{
    fkvf_reader *r = NULL;
    int rc = fkvf_reader_open_memory(&r, d, n, 0, NULL);
    ck_assert_msg(rc == FKVF_OK, "reader rejects: %s", r ? fkvf_reader_message(r) : "");
    fkvf_archive_info info;
    ck_assert_int_eq(fkvf_reader_info(r, &info), FKVF_OK);
    size_t ns;
    ck_assert_int_eq(fkvf_reader_stream_count(r, &ns), FKVF_OK);
    for (size_t i = 0; i < ns; i++) {
        fkvf_stream_info si;
        ck_assert_int_eq(fkvf_reader_stream_info(r, i, &si), FKVF_OK);
        uint32_t buf[64];
        ck_assert_uint_le(si.length, 64);
        rc = fkvf_reader_stream_read(r, i, 0, buf, (size_t)si.length);
        ck_assert_msg(rc == FKVF_OK, "stream %zu: %s", i, fkvf_reader_message(r));
    }
    for (uint64_t p = 0; p < info.n_positions; p++) {
        int ex;
        ck_assert_int_eq(fkvf_reader_is_exact(r, p, &ex), FKVF_OK);
        if (ex) {
            const void *row;
            size_t rb;
            ck_assert_int_eq(fkvf_reader_exact_row(r, p, &row, &rb), FKVF_OK);
        }
    }
    fkvf_reader_free(r);
}

/* ---- the base archive ------------------------------------------------------------ */

/* 1 layer, 1 head, dims 4/4, f16, 2 sinks; 12 positions of which 6 archived
 * (RVQ k = 16, 1 + 1 stages, quad 4-bit index streams), 8-bit token stream,
 * META with 3 keys; commits == 2 adds a commit with a new META (and
 * commits == 3 a 1.0 ZIDX index of the token stream in it, commits == 4 a
 * ZPOS index). */
#define NPOS 40
#define NAR 32
#define SINKS 2
/* commits == 3: commit 2 as for 2, plus a ZIDX index of the token stream;
 * commits == 4: a ZPOS index instead */
static tu_buf base_file(int commits)
{
    tu_buf b = {0};
    fkvf_sink sink = tu_buf_sink(&b);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.block_size = 64;
    fkvf_writer *w;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = 1;
    d.n_kv_heads = 1;
    d.key_dim = 4;
    d.value_dim = 4;
    d.dtype = FKVF_DTYPE_F16;
    d.n_sinks = SINKS;
    d.window = 4;
    d.model_id = "validate-test";
    d.tokenizer_id = "bytes";
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_meta_u64(w, "org.test.seed", 7), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_meta_utf8(w, "abcde.note", "hello"), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_meta_bool(w, "org.test.flag", 1), FKVF_OK);
    fkvf_codebook_shape cs;
    memset(&cs, 0, sizeof cs);
    cs.n_layers = 1;
    cs.n_heads = 1;
    cs.key_dim = 4;
    cs.value_dim = 4;
    cs.k = 16;
    cs.k_stages = 1;
    cs.v_stages = 1;
    cs.dtype = FKVF_DTYPE_F16;
    uint16_t tables[16 * 4 * 2];
    for (size_t i = 0; i < sizeof tables / 2; i++)
        tables[i] = (uint16_t)(0x3000 + i); /* finite f16 values */
    uint8_t tb[sizeof tables];
    for (size_t i = 0; i < sizeof tables / 2; i++)
        fkvf_st16(tb + 2 * i, tables[i]);
    int rc = fkvf_writer_add_codebooks(w, &cs, tb, sizeof tb, 0);
    ck_assert_msg(rc == FKVF_OK, "%s", fkvf_writer_message(w));
    uint8_t rows[NPOS * 16];
    for (size_t i = 0; i < sizeof rows; i++)
        rows[i] = (uint8_t)(i * 7 % 64); /* small finite f16 bits */
    ck_assert_int_eq(fkvf_writer_add_exact(w, 0, SINKS, rows, SINKS * 16, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_exact(w, SINKS + NAR, NPOS - SINKS - NAR,
                                           rows + (SINKS + NAR) * 16,
                                           (NPOS - SINKS - NAR) * 16, 0),
                     FKVF_OK);
    fkvf_stream_spec is;
    memset(&is, 0, sizeof is);
    is.profile = FKVF_PROFILE_QUAD;
    is.symbol_bits = 4;
    uint16_t codes[NAR * 2];
    for (size_t i = 0; i < NAR * 2; i++)
        codes[i] = (uint16_t)((i * 5 + 3) % 16);
    rc = fkvf_writer_add_index_segment(w, &is, 0, NAR, codes, 2, 1);
    ck_assert_msg(rc == FKVF_OK, "%s", fkvf_writer_message(w));
    fkvf_stream_spec ts = is;
    ts.symbol_bits = 8;
    uint32_t tok[NPOS];
    for (size_t i = 0; i < NPOS; i++)
        tok[i] = (uint32_t)(i * 13 + 1) & 0xFF;
    rc = fkvf_writer_add_token_segment(w, &ts, 0, tok, NPOS);
    ck_assert_msg(rc == FKVF_OK, "%s", fkvf_writer_message(w));
    ck_assert_int_eq(fkvf_writer_set_positions(w, NPOS, NAR), FKVF_OK);
    if (commits >= 2) {
        ck_assert_int_eq(fkvf_writer_commit(w), FKVF_OK);
        ck_assert_int_eq(fkvf_writer_meta_u64(w, "org.test.seed", 8), FKVF_OK);
    }
    if (commits >= 3) {
        /* the index from a reader over commit 1 (the sink holds it) */
        fkvf_reader *r;
        ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL), FKVF_OK);
        size_t tsi;
        ck_assert_int_eq(fkvf_reader_stream_find(r, UINT64_C(1) << 56, &tsi), FKVF_OK);
        void *zd;
        size_t zn;
        uint64_t key;
        if (commits == 3) {
            ck_assert_int_eq(fkvf_search_zidx_build(r, tsi, &zd, &zn, &key, NULL), FKVF_OK);
            ck_assert_uint_eq(zn, 64 + 32 * 24); /* 32 positions indexed */
        } else {
            ck_assert_int_eq(fkvf_search_index_build(r, tsi, &zd, &zn, &key, NULL), FKVF_OK);
            ck_assert_uint_eq(zn, 64 + 32 * 4);
        }
        rc = fkvf_writer_add_section(w, commits == 3 ? FKVF_SECTION_ZIDX : FKVF_SECTION_ZPOS, 0,
                                     key, zd, zn);
        ck_assert_msg(rc == FKVF_OK, "%s", fkvf_writer_message(w));
        fkvf_search_buffer_free(zd, NULL);
        fkvf_reader_free(r);
    }
    rc = fkvf_writer_finish(w);
    ck_assert_msg(rc == FKVF_OK, "%s", fkvf_writer_message(w));
    fkvf_writer_free(w);
    return b;
}

/* ---- locating and re-sealing structures (spec 2.3, 4.2, 6) ------------------------ */

typedef struct loc {
    uint64_t entry;   /* offset of the directory entry */
    uint64_t off, size;
    uint64_t trailer; /* the trailer of its commit */
} loc;

/* The nth (0-based) section of `type` in section order. */
static int find_section(const uint8_t *d, size_t n, uint32_t type, int nth, loc *out)
{
    uint64_t tr[16];
    int nt = 0;
    uint64_t t = n - 64;
    for (;;) {
        ck_assert_int_lt(nt, 16);
        tr[nt++] = t;
        if (fkvf_ld64(d + t + 8) == 1)
            break;
        t = fkvf_ld64(d + t + 40);
    }
    for (int c = nt - 1; c >= 0; c--) {
        uint64_t dir = fkvf_ld64(d + tr[c] + 16);
        uint32_t cnt = fkvf_ld32(d + dir + 4);
        for (uint32_t k = 0; k < cnt; k++) {
            uint64_t e = dir + 64 + 64 * (uint64_t)k;
            if (fkvf_ld32(d + e) == type && nth-- == 0) {
                out->entry = e;
                out->off = fkvf_ld64(d + e + 8);
                out->size = fkvf_ld64(d + e + 16);
                out->trailer = tr[c];
                return 1;
            }
        }
    }
    return 0;
}

static void reseal_trailer(uint8_t *d, uint64_t tr)
{
    uint64_t dir = fkvf_ld64(d + tr + 16), dsz = fkvf_ld64(d + tr + 24);
    fkvf_st64(d + tr + 32, fkvf_xxh3_64(d + dir, (size_t)dsz, dir));
    fkvf_st64(d + tr + 56, fkvf_xxh3_64(d + tr, 56, tr));
}

/* section checksum into its entry, then its directory and trailer */
static void reseal(uint8_t *d, const loc *l)
{
    fkvf_st64(d + l->entry + 40, fkvf_xxh3_64(d + l->off, (size_t)l->size, l->off));
    reseal_trailer(d, l->trailer);
}

static void reseal_header(uint8_t *d) { fkvf_st64(d + 56, fkvf_xxh3_64(d, 56, 0)); }

/* STRM geometry from its header (spec 11.3; quad) */
typedef struct geo {
    uint64_t count, stream_bytes, data_bytes, n_blocks, data_off;
    uint32_t bits, n_streams, block_size;
} geo;

static geo strm_geo(const uint8_t *d, const loc *l)
{
    const uint8_t *h = d + l->off;
    geo g;
    g.bits = h[9];
    g.count = fkvf_ld64(h + 24);
    g.block_size = fkvf_ld32(h + 36);
    g.n_streams = fkvf_ld32(h + 48);
    g.stream_bytes = (g.count * g.bits + 127) / 128 * 16;
    g.data_bytes = g.n_streams * g.stream_bytes;
    g.n_blocks = (g.data_bytes + g.block_size - 1) / g.block_size;
    g.data_off = (64 + 8 * g.n_blocks + 63) / 64 * 64;
    ck_assert_uint_eq(g.data_off + g.data_bytes, l->size);
    return g;
}

/* STRM: recompute block b's checksum (spec 11.4) */
static void reseal_block(uint8_t *d, const loc *l, uint64_t b)
{
    geo g = strm_geo(d, l);
    ck_assert_uint_gt(g.n_blocks, b);
    uint64_t from = b * g.block_size;
    uint64_t len = g.data_bytes - from < g.block_size ? g.data_bytes - from : g.block_size;
    uint64_t start = l->off + g.data_off + from;
    fkvf_st64(d + l->off + 64 + 8 * b, fkvf_xxh3_64(d + start, (size_t)len, start));
}

/* ---- (b) writer-side fixtures ------------------------------------------------------ */

START_TEST(base_is_valid)
{
    for (int commits = 1; commits <= 4; commits++) {
        tu_buf b = base_file(commits);
        reader_accepts(b.data, b.size);
        vlist l = validate(b.data, b.size, FKVF_VALIDATE_STRICT);
        char s[1024];
        dump(&l, s, sizeof s);
        ck_assert_msg(l.n == 0, "base file (%d commits):%s", commits, s);
        tu_buf_free(&b);
    }
}
END_TEST

/* fault injectors: each makes one fault, re-sealed; returns nothing */
static void inj_padding(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_DESC, 0, &l));
    uint64_t end = l.off + l.size;
    ck_assert_uint_ne(end % 64, 0); /* a gap follows DESC */
    b->data[end] = 0x5A;             /* covered by no checksum */
}

static void inj_unused_bits(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_STRM, 1, &l)); /* tokens */
    ck_assert_uint_eq(fkvf_ld64(b->data + l.off), 1);
    geo g = strm_geo(b->data, &l);
    ck_assert_uint_gt(g.stream_bytes * 8, g.count * g.bits); /* unused bits exist */
    b->data[l.off + g.data_off + g.data_bytes - 1] |= 0x80;  /* the last bit */
    reseal_block(b->data, &l, g.n_blocks - 1);
    reseal(b->data, &l);
}

static void inj_strm_padding(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_STRM, 0, &l));
    geo g = strm_geo(b->data, &l);
    ck_assert_uint_lt(64 + 8 * g.n_blocks, g.data_off);
    b->data[l.off + g.data_off - 1] = 1;
    reseal(b->data, &l);
}

static void inj_meta_fkvf_key(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_META, 0, &l));
    uint8_t *p = NULL;
    for (uint64_t i = 0; i + 10 <= l.size && !p; i++)
        if (!memcmp(b->data + l.off + i, "abcde.note", 10))
            p = b->data + l.off + i;
    ck_assert_ptr_nonnull(p);
    memcpy(p, "fkvf.", 5); /* "fkvf..note": a reserved key */
    reseal(b->data, &l);
}

static void inj_optional_bit(tu_buf *b)
{
    fkvf_st64(b->data + 32, fkvf_ld64(b->data + 32) | (UINT64_C(1) << 5));
    reseal_header(b->data);
}

static void inj_cbk1_inf(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_CBK1, 0, &l));
    fkvf_st16(b->data + l.off + 64 + 2 * 40, 0x7C00); /* +inf in a value centroid */
    reseal(b->data, &l);
}

static void inj_theta_negzero(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_DESC, 0, &l));
    ck_assert_uint_eq(b->data[l.off + 17], 0); /* key_transform 0 */
    fkvf_st64(b->data + l.off + 24, UINT64_C(0x8000000000000000)); /* -0.0 */
    reseal(b->data, &l);
}

/* 64 bytes that belong to no structure between the last section and the
 * directory of a one-commit file: directory and trailer move back 64 */
static void inj_dead_bytes(tu_buf *b)
{
    uint64_t tr = b->size - 64;
    ck_assert_uint_eq(fkvf_ld64(b->data + tr + 8), 1);
    uint64_t dir = fkvf_ld64(b->data + tr + 16);
    uint8_t *n = calloc(1, b->size + 64);
    ck_assert_ptr_nonnull(n);
    memcpy(n, b->data, (size_t)dir);
    memcpy(n + dir + 64, b->data + dir, (size_t)(b->size - dir));
    free(b->data);
    b->data = n;
    b->size += 64;
    b->cap = b->size;
    tr += 64;
    fkvf_st64(n + tr + 16, dir + 64);
    fkvf_st64(n + tr + 48, tr + 64);
    reseal_trailer(n, tr);
}

/* the whole-section checksum of a STRM section, which the access path may
 * skip when the header and the blocks are intact (spec 4.6) */
static void inj_strm_section_sum(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_STRM, 0, &l));
    b->data[l.entry + 40] ^= 1;
    reseal_trailer(b->data, l.trailer);
}

/* two ZIDX entries swapped: the order of spec 20.3 broken; readers may skip
 * that check on the access path */
static void inj_zidx_order(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_ZIDX, 0, &l));
    uint8_t t[24], *e0 = b->data + l.off + 64, *e1 = e0 + 24;
    ck_assert(memcmp(e0, e1, 24) != 0);
    memcpy(t, e0, 24);
    memcpy(e0, e1, 24);
    memcpy(e1, t, 24);
    reseal(b->data, &l);
}

/* the last entry's key raised to the largest value: the order holds, the key
 * is not the stream's (spec 20.3, checked by full verification only) */
static void inj_zidx_key(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_ZIDX, 0, &l));
    uint64_t n = fkvf_ld64(b->data + l.off + 16);
    memset(b->data + l.off + 64 + (n - 1) * 24, 0xFF, 16);
    reseal(b->data, &l);
}

/* an index of a stream the archive does not have (stream_id and key both
 * changed: the header itself is consistent, spec 20.2 step 5) */
static void inj_zidx_stream(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_ZIDX, 0, &l));
    uint64_t id = (UINT64_C(1) << 56) | 1; /* kind 1 with layer 1 */
    fkvf_st64(b->data + l.off, id);
    fkvf_st64(b->data + l.entry + 32, id);
    reseal(b->data, &l);
}

/* ZPOS (spec 20.7): entries 0 and 1 swapped: every position once, the
 * order the stream gives broken (found by the net: the keys are the
 * stream's) */
static void inj_zpos_order(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_ZPOS, 0, &l));
    uint8_t t[4], *e0 = b->data + l.off + 64, *e1 = e0 + 4;
    memcpy(t, e0, 4);
    memcpy(e0, e1, 4);
    memcpy(e1, t, 4);
    reseal(b->data, &l);
}

/* ZPOS: entry 1 repeats entry 0's position */
static void inj_zpos_dup(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_ZPOS, 0, &l));
    memcpy(b->data + l.off + 68, b->data + l.off + 64, 4);
    reseal(b->data, &l);
}

/* ZPOS: the last position = n_indexed */
static void inj_zpos_range(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_ZPOS, 0, &l));
    uint64_t n = fkvf_ld64(b->data + l.off + 16);
    fkvf_st32(b->data + l.off + 64 + (n - 1) * 4, (uint32_t)n);
    reseal(b->data, &l);
}

/* ZPOS: an index of a stream the archive does not have */
static void inj_zpos_stream(tu_buf *b)
{
    loc l;
    ck_assert(find_section(b->data, b->size, FKVF_SECTION_ZPOS, 0, &l));
    uint64_t id = (UINT64_C(1) << 56) | 1;
    fkvf_st64(b->data + l.off, id);
    fkvf_st64(b->data + l.entry + 32, id);
    reseal(b->data, &l);
}

/* commit 1 of a two-commit file claims one more position than it covers:
 * the served commit 2 is valid, commit 1 alone is not (spec 7.3) */
static void inj_commit1_state(tu_buf *b)
{
    uint64_t tr2 = b->size - 64;
    ck_assert_uint_eq(fkvf_ld64(b->data + tr2 + 8), 2);
    uint64_t tr1 = fkvf_ld64(b->data + tr2 + 40);
    uint64_t dir1 = fkvf_ld64(b->data + tr1 + 16);
    fkvf_st64(b->data + dir1 + 16, NPOS + 1);
    reseal_trailer(b->data, tr1);
}

typedef struct fixture {
    const char *name;
    void (*inject)(tu_buf *b);
    int commits;
    int code;
    const char *clause, *check;
    int strict_only; /* a writer rule: silent without FKVF_VALIDATE_STRICT */
} fixture;

static const fixture fixtures[] = {
    {"padding", inj_padding, 1, FKVF_E_PADDING, "4.1", "LAYOUT-PAD", 0},
    {"dead bytes", inj_dead_bytes, 1, FKVF_E_CORRUPT, "4.1", "LAYOUT-DEAD", 0},
    {"unused bits", inj_unused_bits, 1, FKVF_E_PADDING, "11.7", "STRM-UNUSED-BITS", 0},
    {"STRM padding", inj_strm_padding, 1, FKVF_E_PADDING, "11.3", "STRM-PAD", 0},
    {"fkvf. key", inj_meta_fkvf_key, 1, FKVF_E_CORRUPT, "9.2", "W-META-RESERVED-KEY", 1},
    {"optional bit", inj_optional_bit, 1, FKVF_E_CORRUPT, "3.4", "W-OPTBITS", 1},
    {"CBK1 inf", inj_cbk1_inf, 1, FKVF_E_CORRUPT, "13.2", "CBK1-VALUES", 0},
    {"theta -0", inj_theta_negzero, 1, FKVF_E_CORRUPT, "8", "W-THETA-BYTES", 1},
    {"commit 1 state", inj_commit1_state, 2, FKVF_E_CORRUPT, "7.3", "W-COMMIT-STATE", 1},
    {"STRM section checksum", inj_strm_section_sum, 1, FKVF_E_CHECKSUM, "4.6", "SEC-CHECKSUM", 0},
    {"ZIDX order", inj_zidx_order, 3, FKVF_E_CORRUPT, "20.3", "ZIDX-ORDER", 0},
    {"ZIDX stream", inj_zidx_stream, 3, FKVF_E_CORRUPT, "20.2", "ZIDX-STREAM", 0},
    {"ZIDX key", inj_zidx_key, 3, FKVF_E_CORRUPT, "20.3", "NET-VERIFY", 0},
    {"ZPOS order", inj_zpos_order, 4, FKVF_E_CORRUPT, "20.7", "NET-VERIFY", 0},
    {"ZPOS duplicate", inj_zpos_dup, 4, FKVF_E_CORRUPT, "20.7", "ZIDX-POSITION", 0},
    {"ZPOS position", inj_zpos_range, 4, FKVF_E_CORRUPT, "20.7", "ZIDX-POSITION", 0},
    {"ZPOS stream", inj_zpos_stream, 4, FKVF_E_CORRUPT, "20.2", "ZIDX-STREAM", 0},
};
#define N_FIXTURES (sizeof fixtures / sizeof fixtures[0])

START_TEST(writer_rule_fixture)
{
    const fixture *f = &fixtures[_i];
    tu_buf b = base_file(f->commits);
    f->inject(&b);
    /* an ordinary reader accepts the file and serves everything */
    reader_accepts(b.data, b.size);
    vlist l = validate(b.data, b.size, FKVF_VALIDATE_STRICT);
    expect_only(&l, f->code, f->clause, f->check);
    ck_assert_int_eq(l.writer[0], f->strict_only);
    vlist n = validate(b.data, b.size, 0);
    if (f->strict_only) {
        ck_assert_msg(n.n == 0, "%s: reported without STRICT", f->name);
    } else {
        expect_only(&n, f->code, f->clause, f->check);
        /* full verification agrees that the file is invalid */
        fkvf_reader *r;
        ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL), FKVF_OK);
        ck_assert_int_eq(fkvf_reader_verify(r), f->code);
        fkvf_reader_free(r);
    }
    tu_buf_free(&b);
}
END_TEST

/* A ZIDX or ZPOS entry with REQUIRED set (spec 20.1, 20.7): one outcome,
 * SECTION when the directory is loaded, reported once by the validator
 * (it used to be reported twice: by its own entry check and again through
 * the reader's open; and the reader's CORRUPT branch for it in full
 * verification was unreachable). Issue 17 point 9. */
START_TEST(index_required_flag)
{
    static const struct {
        uint32_t type;
        int commits;
        const char *clause;
    } cases[] = {{FKVF_SECTION_ZIDX, 3, "20.1"}, {FKVF_SECTION_ZPOS, 4, "20.7"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tu_buf b = base_file(cases[k].commits);
        loc l;
        ck_assert(find_section(b.data, b.size, cases[k].type, 0, &l));
        fkvf_st32(b.data + l.entry + 4, fkvf_ld32(b.data + l.entry + 4) | FKVF_SECTION_REQUIRED);
        reseal_trailer(b.data, l.trailer);
        fkvf_reader *r = NULL;
        ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL), FKVF_E_SECTION);
        fkvf_reader_free(r);
        vlist v = validate(b.data, b.size, 0);
        expect_only(&v, FKVF_E_SECTION, cases[k].clause, "ZIDX-REQUIRED");
        tu_buf_free(&b);
    }
}
END_TEST

/* ---- (c) several faults in one file; the cap ------------------------------------------ */

START_TEST(all_faults_reported)
{
    tu_buf b = base_file(1);
    inj_padding(&b);
    inj_unused_bits(&b);
    inj_strm_padding(&b);
    inj_meta_fkvf_key(&b);
    inj_optional_bit(&b);
    inj_cbk1_inf(&b);
    inj_theta_negzero(&b);
    /* and a damaged block of the index streams (a reader-side fault) */
    loc l;
    ck_assert(find_section(b.data, b.size, FKVF_SECTION_STRM, 0, &l));
    geo g = strm_geo(b.data, &l);
    b.data[l.off + g.data_off] ^= 0x10;
    vlist v = validate(b.data, b.size, FKVF_VALIDATE_STRICT);
    char s[4096];
    dump(&v, s, sizeof s);
    ck_assert_msg(has(&v, FKVF_E_PADDING, "4.1", "LAYOUT-PAD"), "%s", s);
    ck_assert_msg(has(&v, FKVF_E_PADDING, "11.7", "STRM-UNUSED-BITS"), "%s", s);
    ck_assert_msg(has(&v, FKVF_E_PADDING, "11.3", "STRM-PAD"), "%s", s);
    ck_assert_msg(has(&v, FKVF_E_CORRUPT, "9.2", "W-META-RESERVED-KEY"), "%s", s);
    ck_assert_msg(has(&v, FKVF_E_CORRUPT, "3.4", "W-OPTBITS"), "%s", s);
    ck_assert_msg(has(&v, FKVF_E_CORRUPT, "13.2", "CBK1-VALUES"), "%s", s);
    ck_assert_msg(has(&v, FKVF_E_CORRUPT, "8", "W-THETA-BYTES"), "%s", s);
    ck_assert_msg(has(&v, FKVF_E_CHECKSUM, "11.4", "STRM-BLOCK"), "%s", s);
    ck_assert_msg(has(&v, FKVF_E_CHECKSUM, "4.6", "SEC-CHECKSUM"), "%s", s);
    ck_assert_uint_eq(v.n, 9);

    /* the cap: exactly max_violations reported, then stop */
    vlist c;
    memset(&c, 0, sizeof c);
    fkvf_validate_options o;
    memset(&o, 0, sizeof o);
    o.flags = FKVF_VALIDATE_STRICT;
    o.max_violations = 3;
    fkvf_validate_result res;
    ck_assert_int_eq(fkvf_validate_memory(b.data, b.size, &o, collect, &c, &res), FKVF_OK);
    ck_assert_uint_eq(c.n, 3);
    ck_assert_uint_eq(res.violations, 3);
    ck_assert_int_eq(res.capped, 1);
    tu_buf_free(&b);
}
END_TEST

/* every truncation and many byte flips of the base file: no crash, and the
 * validator never calls a damaged file valid when full verification
 * rejects it */
START_TEST(damage_never_valid)
{
    tu_buf b = base_file(2);
    uint8_t *d = malloc(b.size);
    ck_assert_ptr_nonnull(d);
    for (size_t n = 0; n < b.size; n += 7) {
        vlist l = validate(b.data, n, FKVF_VALIDATE_STRICT);
        EXPECTF(l.n > 0, "prefix of %zu bytes reported valid", n);
    }
    tu_rng rng = {42};
    for (int k = 0; k < 400; k++) {
        memcpy(d, b.data, b.size);
        size_t at = tu_below(&rng, (uint32_t)b.size);
        d[at] ^= (uint8_t)(1u << tu_below(&rng, 8));
        vlist l = validate(d, b.size, FKVF_VALIDATE_STRICT);
        fkvf_reader *r = NULL;
        int rc = fkvf_reader_open_memory(&r, d, b.size, 0, NULL);
        if (rc == FKVF_OK)
            rc = fkvf_reader_verify(r);
        fkvf_reader_free(r);
        EXPECTF(rc == FKVF_OK || l.n > 0, "flip at %zu: verify %s, validate found nothing", at,
                fkvf_error_name(rc));
    }
    free(d);
    tu_buf_free(&b);
}
END_TEST

/* ---- (a) the conformance suite ------------------------------------------------------- */

/* snprintf into an array that must hold the whole result: a name too long
 * for the buffer fails the test instead of being cut (which gcc -O3
 * reports as -Wformat-truncation when the result is not checked) */
#define FORMAT_FIT(buf, ...)                                                   \
    do {                                                                       \
        int n_ = snprintf(buf, sizeof buf, __VA_ARGS__);                       \
        ck_assert_msg(n_ >= 0 && (size_t)n_ < sizeof buf, "too long: %s", buf); \
    } while (0)

START_TEST(conformance_suite)
{
    const char *src = getenv("FKVF_SRCDIR");
    ck_assert_ptr_nonnull(src);
    char path[4096];
    FORMAT_FIT(path, "%s/conformance/manifest.tsv", src);
    FILE *m = fopen(path, "r");
    ck_assert_ptr_nonnull(m);
    char line[4096];
    int rows = 0, accepted = 0, rejected = 0;
    ck_assert_ptr_nonnull(fgets(line, sizeof line, m)); /* header */
    while (fgets(line, sizeof line, m)) {
        char *col[8];
        int nc = 0;
        line[strcspn(line, "\n")] = 0;
        for (char *p = line; nc < 8 && p;) {
            col[nc++] = p;
            p = strchr(p, '\t');
            if (p)
                *p++ = 0;
        }
        ck_assert_int_ge(nc, 7);
        rows++;
        const char *name = col[0], *ver = col[1], *cls = col[3], *cbname = col[6];
        fkvf_reader *cb = NULL;
        if (strcmp(cbname, "-")) {
            FORMAT_FIT(path, "%s/conformance/files/%s", src, cbname);
            int crc = fkvf_reader_open_file(&cb, path, 0, NULL);
            if (crc != FKVF_OK) {
                /* a candidate that fails its own open is unusable: the
                 * archive's outcome is CODEBOOK (spec 13.5), and the
                 * candidate's class is a format class, not an I/O error */
                ck_assert_msg(!strcmp(ver, "reject") && !strcmp(cls, "CODEBOOK"),
                              "%s: candidate %s does not open, the manifest says %s %s", name,
                              cbname, ver, cls);
                ck_assert_int_eq(fkvf_error_class(crc), FKVF_ERRCLASS_FORMAT);
                fkvf_reader_free(cb);
                rejected++;
                continue;
            }
        }
        FORMAT_FIT(path, "%s/conformance/files/%s", src, name);
        vlist l;
        memset(&l, 0, sizeof l);
        fkvf_validate_options o;
        memset(&o, 0, sizeof o);
        o.flags = FKVF_VALIDATE_STRICT;
        o.codebook = cb;
        fkvf_validate_result res;
        ck_assert_int_eq(fkvf_validate_file(path, &o, collect, &l, &res), FKVF_OK);
        char s[2048];
        dump(&l, s, sizeof s);
        if (!strcmp(ver, "accept") && !strcmp(name, "commit_state_earlier_invalid.fkvf")) {
            /* readers accept it (spec 7.3: they check the served commit);
             * its earlier commit alone is invalid, a writer rule */
            accepted++;
            ck_assert_msg(l.n == 1 && l.writer[0] && !strcmp(l.check[0], "W-COMMIT-STATE"),
                          "%s: want only W-COMMIT-STATE:%s", name, s);
        } else if (!strcmp(ver, "accept")) {
            accepted++;
            ck_assert_msg(l.n == 0, "%s: accepted by the manifest, violations:%s", name, s);
        } else if (!strcmp(ver, "reject")) {
            rejected++;
            ck_assert_msg(l.n > 0, "%s: rejected by the manifest, no violation", name);
            char want[48];
            FORMAT_FIT(want, "FKVF_E_%s", cls);
            int found = 0;
            for (size_t i = 0; i < l.n && i < MAXV; i++)
                found |= !strcmp(fkvf_error_name(l.code[i]), want);
            ck_assert_msg(found, "%s: no violation of class %s:%s", name, cls, s);
            /* the encoder metric's faults (spec 13.8) by the validator's own
             * CMET-* checks, not only by the full verification net */
            if (!strncmp(name, "metric_", 7) && strcmp(cls, "SECTION") && strcmp(cls, "CHECKSUM")) {
                int own = 0;
                for (size_t i = 0; i < l.n && i < MAXV; i++)
                    own |= !strncmp(l.check[i], "CMET-", 5) &&
                           !strcmp(fkvf_error_name(l.code[i]), want);
                ck_assert_msg(own, "%s: no CMET-* check of class %s:%s", name, cls, s);
            }
        }
        fkvf_reader_free(cb);
    }
    fclose(m);
    ck_assert_int_ge(rows, 120);
    ck_assert_int_gt(accepted, 20);
    ck_assert_int_gt(rejected, 80);
}
END_TEST

/* the open fuzzer's corpus (hostile inputs, past crashers): validation runs
 * to the end on each, and a file full verification rejects has a violation */
START_TEST(fuzz_corpus)
{
    const char *src = getenv("FKVF_SRCDIR");
    ck_assert_ptr_nonnull(src);
    char path[4096];
    FORMAT_FIT(path, "%s/fuzz/corpus/open", src);
    DIR *dir = opendir(path);
    ck_assert_ptr_nonnull(dir);
    struct dirent *de;
    int files = 0;
    while ((de = readdir(dir)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        FORMAT_FIT(path, "%s/fuzz/corpus/open/%s", src, de->d_name);
        size_t n;
        uint8_t *d = tu_slurp(path, &n);
        vlist l = validate(d, n, FKVF_VALIDATE_STRICT);
        fkvf_reader *r = NULL;
        int rc = fkvf_reader_open_memory(&r, d, n, 0, NULL);
        if (rc == FKVF_OK)
            rc = fkvf_reader_verify(r);
        fkvf_reader_free(r);
        EXPECTF(rc == FKVF_OK || l.n > 0, "%s: verify %s, validate found nothing", de->d_name,
                fkvf_error_name(rc));
        free(d);
        files++;
    }
    closedir(dir);
    ck_assert_int_gt(files, 50);
}
END_TEST

START_TEST(api_arguments)
{
    fkvf_validate_result res;
    ck_assert_int_eq(fkvf_validate_memory(NULL, 5, NULL, NULL, NULL, &res), FKVF_E_INVALID_ARG);
    fkvf_validate_options o;
    memset(&o, 0, sizeof o);
    o.flags = 0x80;
    ck_assert_int_eq(fkvf_validate_memory("", 0, &o, NULL, NULL, &res), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_validate_file("/nonexistent/x.fkvf", NULL, NULL, NULL, &res), FKVF_E_IO);
    /* no callback: counted only */
    ck_assert_int_eq(fkvf_validate_memory("abc", 3, NULL, NULL, NULL, &res), FKVF_OK);
    ck_assert_uint_eq(res.violations, 1);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("validate");
    TCase *t = tcase_create("validate");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, base_is_valid);
    tcase_add_loop_test(t, writer_rule_fixture, 0, (int)N_FIXTURES);
    tcase_add_test(t, index_required_flag);
    tcase_add_test(t, all_faults_reported);
    tcase_add_test(t, damage_never_valid);
    tcase_add_test(t, conformance_suite);
    tcase_add_test(t, fuzz_corpus);
    tcase_add_test(t, api_arguments);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
