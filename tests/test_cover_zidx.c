/* fkvf_reader_verify of malformed ZIDX and ZPOS sections (spec 20.2, 20.3,
 * 20.7): the header and entry checks of format/zidx.c and read/zidx.c that
 * the search suite does not reach (coverage, issue 6). A valid index of a
 * 10-bit token stream is built (ZIDX with the 1.0 builder, ZPOS with
 * fkvf_search_index_build); each case changes some of its bytes (and the
 * directory key where the case needs it), writes an archive with it and
 * expects verify's error code and message. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "fkvf.h"
#include "search/zidx_legacy.h"
#include "testutil.h"

enum { NT = 128 }; /* tokens: two alignment units of 64 (10-bit quad) */

static uint32_t tokens[NT];

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* the archive: tokens only, plus an optional ZIDX section */
static uint32_t g_type = FKVF_SECTION_ZIDX; /* of the index section written */

static void write_archive(tu_buf *b, const void *zidx, size_t zsize, uint64_t key)
{
    memset(b, 0, sizeof *b);
    fkvf_sink s = tu_buf_sink(b);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.optional_features = FKVF_OPTFEAT_TOKEN_STREAM;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &s, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = d.n_kv_heads = 1;
    d.key_dim = d.value_dim = 2;
    d.dtype = FKVF_DTYPE_F16;
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    sp.profile = FKVF_PROFILE_QUAD;
    sp.symbol_bits = 10;
    ck_assert_int_eq(fkvf_writer_add_token_segment(w, &sp, 0, tokens, NT), FKVF_OK);
    static const uint16_t rows[NT * 4]; /* 1 layer, 1 head, K and V of 2 dims: zeros */
    ck_assert_int_eq(fkvf_writer_add_exact(w, 0, NT, rows, sizeof rows, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_set_positions(w, NT, 0), FKVF_OK);
    if (zidx)
        ck_assert_int_eq(fkvf_writer_add_section(w, g_type, 0, key, zidx, zsize), FKVF_OK);
    ck_assert_msg(fkvf_writer_finish(w) == FKVF_OK, "%s", fkvf_writer_message(w));
    fkvf_writer_free(w);
}

typedef struct zcase {
    const char *what;
    int code;        /* of fkvf_reader_verify */
    const char *msg; /* in its message */
} zcase;

/* case i applied to a copy of the valid index (z, n bytes): may change n and key */
static void mutate(int i, uint8_t *z, size_t *n, uint64_t *key)
{
    const size_t es = 24, e0 = 64;
    switch (i) {
    case 0: z[40] = 1; break;                                 /* reserved byte */
    case 1: *key ^= 1; break;                                 /* key != stream_id */
    case 2: z[9] = 9; break;                                  /* odd bits */
    case 3: z[8] = 2; break;                                  /* ngon with quad fields */
    case 4: z[8] = 3; break;                                  /* unknown profile */
    case 5: put64(z + 16, UINT64_C(1) << 60); break;          /* n_indexed too large */
    case 6: *n -= es; break;                                  /* one entry missing */
    case 7: *n = 40; break;                                   /* shorter than the header */
    case 8: /* a stream that does not exist (and the key that matches it) */
        *key = FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, 3, 0, 0, 0);
        put64(z, *key);
        break;
    case 9: z[9] = 8; break; /* bits differ from the stream's 10 */
    case 10:                 /* n_indexed 100: not a multiple of 64 */
        put64(z + 16, 100);
        *n = e0 + 100 * es;
        break;
    case 11: put64(z + e0 + 5 * es + 16, NT); break; /* a position >= n_indexed */
    case 12: {                                      /* entries 0 and 1 swapped */
        uint8_t t[24];
        memcpy(t, z + e0, es);
        memcpy(z + e0, z + e0 + es, es);
        memcpy(z + e0 + es, t, es);
        break;
    }
    default: { /* the last (largest) key made larger still: order kept, key wrong */
        uint8_t *e = z + e0 + (NT - 1) * es;
        put64(e + 8, get64(e + 8) + 1);
        break;
    }
    }
}

static const zcase cases[] = {
    {"reserved byte", FKVF_E_CORRUPT, "reserved byte"},
    {"key", FKVF_E_CORRUPT, "differs from the directory key"},
    {"odd bits", FKVF_E_CORRUPT, "ZIDX quad header"},
    {"ngon profile", FKVF_E_CORRUPT, "ZIDX ngon header"},
    {"profile 3", FKVF_E_CORRUPT, "profile 3 unknown"},
    {"n_indexed 2^60", FKVF_E_LIMIT, "exceed 2^48"},
    {"entry missing", FKVF_E_TRUNCATED, "entries need"},
    {"short header", FKVF_E_TRUNCATED, "shorter than its 64-byte header"},
    {"no such stream", FKVF_E_CORRUPT, "which does not exist"},
    {"bits 8", FKVF_E_CORRUPT, "codec parameters differ"},
    {"n_indexed 100", FKVF_E_CORRUPT, "not a multiple of the alignment unit 64"},
    {"position", FKVF_E_CORRUPT, "not below n_indexed"},
    {"order", FKVF_E_CORRUPT, "in (key, position) order"},
    {"key value", FKVF_E_CORRUPT, "differs from the stream's point"},
};

START_TEST(zidx_malformed)
{
    tu_rng rng = {11};
    for (size_t t = 0; t < NT; t++)
        tokens[t] = tu_below(&rng, 40); /* repeats: equal keys exist */
    tu_buf b;
    write_archive(&b, NULL, 0, 0);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    size_t tok;
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &tok), FKVF_OK);
    void *zd = NULL;
    size_t zs = 0;
    uint64_t key = 0;
    ck_assert_int_eq(fkvf_search_zidx_build(r, tok, &zd, &zs, &key, NULL), FKVF_OK);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    ck_assert_uint_eq(zs, 64 + (size_t)NT * 24);
    ck_assert_uint_eq(get64((const uint8_t *)zd + 16), NT);

    /* the valid index verifies */
    write_archive(&b, zd, zs, key);
    ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    ck_assert_msg(fkvf_reader_verify(r) == FKVF_OK, "%s", fkvf_reader_message(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);

    uint8_t *z = malloc(zs);
    ck_assert_ptr_nonnull(z);
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        memcpy(z, zd, zs);
        size_t n = zs;
        uint64_t k = key;
        mutate(i, z, &n, &k);
        write_archive(&b, z, n, k);
        r = NULL;
        ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL),
                         FKVF_OK);
        int rc = fkvf_reader_verify(r);
        ck_assert_msg(rc == cases[i].code, "%s: verify gave %s (%s), want %s", cases[i].what,
                      fkvf_error_name(rc), fkvf_reader_message(r), fkvf_error_name(cases[i].code));
        ck_assert_msg(strstr(fkvf_reader_message(r), cases[i].msg) != NULL,
                      "%s: message '%s' does not say '%s'", cases[i].what,
                      fkvf_reader_message(r), cases[i].msg);
        fkvf_reader_free(r);
        tu_buf_free(&b);
    }
    free(z);
    fkvf_search_buffer_free(zd, NULL);
}
END_TEST

/* ZPOS (spec 20.7): case i applied to a copy of the valid index */
static void zmutate(int i, uint8_t *z, size_t *n, uint64_t *key)
{
    const size_t es = 4, e0 = 64;
    switch (i) {
    case 0: z[40] = 1; break;                             /* reserved byte */
    case 1: *key ^= 1; break;                             /* key != stream_id */
    case 2: z[9] = 9; break;                              /* odd bits */
    case 3: z[8] = 2; break;                              /* ngon with quad fields */
    case 4: z[10] = 8; break;                             /* u64 entries below 2^32 */
    case 5: put64(z + 16, UINT64_C(1) << 46); z[10] = 8; break; /* 64 + 8 x 2^46 > 2^48 */
    case 6: *n -= es; break;                              /* one entry missing */
    case 7: *n += es; break;                              /* one entry too many */
    case 8: z[9] = 8; break;                              /* bits differ from the stream's */
    case 9:                                               /* n_indexed 100 */
        put64(z + 16, 100);
        *n = e0 + 100 * es;
        break;
    case 10: z[e0 + 5 * es + 1] = 1; break;               /* position 256 + p >= 128 */
    case 11: memcpy(z + e0 + es, z + e0, es); break;      /* entry 1 repeats entry 0 */
    case 12: { /* entries 0 and 1 swapped: each position once, the order broken */
        uint8_t t[4];
        memcpy(t, z + e0, es);
        memcpy(z + e0, z + e0 + es, es);
        memcpy(z + e0 + es, t, es);
        break;
    }
    default: /* a stream that does not exist (and the key that matches it) */
        *key = FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, 3, 0, 0, 0);
        put64(z, *key);
        break;
    }
}

static const zcase zcases[] = {
    {"reserved byte", FKVF_E_CORRUPT, "ZPOS reserved byte"},
    {"key", FKVF_E_CORRUPT, "differs from the directory key"},
    {"odd bits", FKVF_E_CORRUPT, "ZPOS quad header"},
    {"ngon profile", FKVF_E_CORRUPT, "ZPOS ngon header"},
    {"entry_size 8", FKVF_E_CORRUPT, "entry_size 8"},
    {"n_indexed 2^46", FKVF_E_LIMIT, "exceed 2^48"},
    {"entry missing", FKVF_E_TRUNCATED, "entries need"},
    {"entry extra", FKVF_E_CORRUPT, "entries need"},
    {"bits 8", FKVF_E_CORRUPT, "codec parameters differ"},
    {"n_indexed 100", FKVF_E_CORRUPT, "not a multiple of the alignment unit 64"},
    {"position", FKVF_E_CORRUPT, "not below n_indexed"},
    {"duplicate", FKVF_E_CORRUPT, "(key, position) order"},
    {"order", FKVF_E_CORRUPT, "(key, position) order"},
    {"no such stream", FKVF_E_CORRUPT, "which does not exist"},
};

START_TEST(zpos_malformed)
{
    tu_rng rng = {12};
    for (size_t t = 0; t < NT; t++)
        tokens[t] = tu_below(&rng, 40);
    g_type = FKVF_SECTION_ZPOS;
    tu_buf b;
    write_archive(&b, NULL, 0, 0);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    void *zd = NULL;
    size_t zs = 0;
    uint64_t key = 0;
    ck_assert_int_eq(fkvf_search_index_build(r, 0, &zd, &zs, &key, NULL), FKVF_OK);
    fkvf_reader_free(r);
    tu_buf_free(&b);
    ck_assert_uint_eq(zs, 64 + (size_t)NT * 4);
    write_archive(&b, zd, zs, key);
    ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    ck_assert_msg(fkvf_reader_verify(r) == FKVF_OK, "%s", fkvf_reader_message(r));
    fkvf_reader_free(r);
    tu_buf_free(&b);
    uint8_t *z = malloc(zs + 4);
    ck_assert_ptr_nonnull(z);
    for (int i = 0; i < (int)(sizeof zcases / sizeof zcases[0]); i++) {
        memset(z, 0, zs + 4);
        memcpy(z, zd, zs);
        size_t n = zs;
        uint64_t k = key;
        zmutate(i, z, &n, &k);
        write_archive(&b, z, n, k);
        r = NULL;
        ck_assert_int_eq(fkvf_reader_open_memory(&r, b.data, b.size, FKVF_OPEN_STRICT, NULL),
                         FKVF_OK);
        int rc = fkvf_reader_verify(r);
        ck_assert_msg(rc == zcases[i].code, "%s: verify gave %s (%s), want %s", zcases[i].what,
                      fkvf_error_name(rc), fkvf_reader_message(r), fkvf_error_name(zcases[i].code));
        ck_assert_msg(strstr(fkvf_reader_message(r), zcases[i].msg) != NULL,
                      "%s: message '%s' does not say '%s'", zcases[i].what,
                      fkvf_reader_message(r), zcases[i].msg);
        ck_assert_msg(strstr(fkvf_reader_message(r), "20.7") != NULL, "%s: '%s'",
                      zcases[i].what, fkvf_reader_message(r));
        fkvf_reader_free(r);
        tu_buf_free(&b);
    }
    free(z);
    fkvf_search_buffer_free(zd, NULL);
    g_type = FKVF_SECTION_ZIDX;
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cover_zidx");
    TCase *t = tcase_create("zidx");
    tcase_add_test(t, zidx_malformed);
    tcase_add_test(t, zpos_malformed);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
