/* Check suite for tools/cacheio: raw KV-cache import/export.
 *
 * Round trips through .safetensors, .npy and .npz for every dtype, with
 * and without token ids, in the FKVF and the Hugging Face layouts; byte-
 * exact expectations for the files we write; every truncation of small
 * valid files; and one hand-crafted bad input per bug the readers must
 * catch, each checked for the error class and a message that names the
 * file, the tensor and what is wrong. */
#define _POSIX_C_SOURCE 200809L
#include <archive.h>
#include <archive_entry.h>
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cacheio.h"
#include "testutil.h"

#define ERRLEN 512

/* ---- helpers ----------------------------------------------------------- */

static kvio_cache make_cache(uint32_t L, uint32_t H, uint32_t T, uint32_t Dk, uint32_t Dv,
                             fkvf_dtype dt, int tokens, uint64_t seed)
{
    kvio_cache c;
    char err[ERRLEN];
    ck_assert_int_eq(kvio_cache_init(&c, L, H, T, Dk, Dv, dt, tokens, err, sizeof err), KVIO_OK);
    tu_rng r = {seed};
    size_t kb = (size_t)kvio_key_bytes(&c), vb = (size_t)kvio_value_bytes(&c);
    for (uint32_t l = 0; l < L; l++) {
        for (size_t i = 0; i < kb; i++)
            c.keys[l][i] = (uint8_t)tu_next(&r);
        for (size_t i = 0; i < vb; i++)
            c.values[l][i] = (uint8_t)tu_next(&r);
    }
    if (tokens)
        for (uint32_t t = 0; t < T; t++)
            c.tokens[t] = (int64_t)tu_below(&r, 50000);
    return c;
}

/* rc == code and the message contains every given substring */
static void expect_err_(int rc, const char *err, int code, const char *file, int line, ...)
{
    if (rc != code)
        ck_abort_msg("%s:%d: rc %d (%s), want %d; message: %s", file, line, rc, kvio_strerror(rc), code, err);
    va_list ap;
    va_start(ap, line);
    const char *s;
    while ((s = va_arg(ap, const char *)) != NULL)
        if (!strstr(err, s))
            ck_abort_msg("%s:%d: message lacks '%s': %s", file, line, s, err);
    va_end(ap);
}
#define EXPECT_ERR(rc, err, code, ...) expect_err_((rc), (err), (code), __FILE__, __LINE__, __VA_ARGS__, (const char *)NULL)

/* A safetensors file from a header text and data_len bytes of data. */
static uint8_t *st_make(const char *json, size_t data_len, size_t *size)
{
    size_t hl = strlen(json);
    *size = 8 + hl + data_len;
    uint8_t *b = calloc(*size ? *size : 1, 1);
    ck_assert_ptr_nonnull(b);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    for (size_t i = 0; i < data_len; i++)
        b[8 + hl + i] = (uint8_t)(i * 7 + 1);
    return b;
}

static int st_read(const char *json, size_t data_len, unsigned flags, kvio_cache *c, char *err)
{
    size_t n;
    uint8_t *b = st_make(json, data_len, &n);
    uint8_t *odd = tu_dup_odd(b, n); /* no alignment assumptions */
    free(b);
    int rc = kvio_read_safetensors_mem(odd, n, "bad.safetensors", flags, c, err, ERRLEN);
    tu_free_odd(odd);
    if (rc) {
        ck_assert_uint_eq(c->n_layers, 0);
        ck_assert_ptr_null(c->keys);
        ck_assert(err[0] != 0);
    }
    return rc;
}

/* Header of one valid 1-layer f16 cache (H=2, T=3, D=4: 48 bytes per tensor). */
#define KV1 "\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]}," \
            "\"layers.0.value\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[48,96]}"

static int npy_read(const void *d, size_t n, kvio_cache *c, char *err)
{
    int rc = kvio_read_npy_mem(d, n, "bad.npy", 0, c, err, ERRLEN);
    if (rc)
        ck_assert(err[0] != 0);
    return rc;
}

/* A .npy with the given header dict text and data_len bytes. */
static uint8_t *npy_make(const char *dict, size_t data_len, size_t *size)
{
    size_t dl = strlen(dict);
    *size = 10 + dl + data_len;
    uint8_t *b = calloc(*size, 1);
    ck_assert_ptr_nonnull(b);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (uint8_t)dl;
    b[9] = (uint8_t)(dl >> 8);
    memcpy(b + 10, dict, dl);
    return b;
}

typedef struct member {
    const char *name;
    const void *data;
    size_t size;
} member;

/* A zip written with libarchive from the given members. */
static uint8_t *zip_make(const member *m, size_t n, int deflate, size_t *size)
{
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    struct archive *a = archive_write_new();
    archive_write_set_format_zip(a);
    if (deflate)
        archive_write_zip_set_compression_deflate(a);
    else
        archive_write_zip_set_compression_store(a);
    archive_write_set_bytes_per_block(a, 0);
    ck_assert_int_eq(archive_write_open_memory(a, buf, cap, size), ARCHIVE_OK);
    for (size_t i = 0; i < n; i++) {
        struct archive_entry *e = archive_entry_new();
        archive_entry_set_pathname(e, m[i].name);
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, 0644);
        archive_entry_set_size(e, (la_int64_t)m[i].size);
        ck_assert_int_eq(archive_write_header(a, e), ARCHIVE_OK);
        if (m[i].size)
            ck_assert_int_eq(archive_write_data(a, m[i].data, m[i].size), (la_ssize_t)m[i].size);
        archive_entry_free(e);
    }
    ck_assert_int_eq(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
    return buf;
}

static uint8_t *write_mem(const kvio_cache *c, kvio_format f, unsigned flags, size_t *n)
{
    uint8_t *b = NULL;
    char err[ERRLEN];
    int rc = kvio_write_mem(c, f, flags, &b, n, err, sizeof err);
    if (rc)
        ck_abort_msg("write %s: %s", kvio_format_name(f), err);
    return b;
}

static void round_trip(const kvio_cache *c, kvio_format f, unsigned flags)
{
    size_t n;
    uint8_t *b = write_mem(c, f, flags, &n);
    uint8_t *odd = tu_dup_odd(b, n);
    kvio_cache d;
    char err[ERRLEN];
    int rc = kvio_read_mem(odd, n, "rt", KVIO_FMT_AUTO, 0, &d, err, sizeof err);
    if (rc)
        ck_abort_msg("read back %s (flags %#x): %s", kvio_format_name(f), flags, err);
    ck_assert(kvio_cache_equal(c, &d));
    if (c->tokens)
        ck_assert_uint_eq(d.token_width, c->token_width == 4 ? 4 : 8);
    kvio_cache_free(&d);
    tu_free_odd(odd);
    free(b);
}

static const fkvf_dtype DTYPES[] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16, FKVF_DTYPE_F32};

/* ---- round trips ------------------------------------------------------- */

START_TEST(rt_safetensors_all_dtypes_with_and_without_tokens)
{
    for (int d = 0; d < 3; d++)
        for (int tok = 0; tok < 2; tok++)
            for (int hf = 0; hf < 2; hf++) {
                kvio_cache c = make_cache(3, 2, 5, 4, 6, DTYPES[d], tok, 10 + (uint64_t)d);
                round_trip(&c, KVIO_FMT_SAFETENSORS, hf ? KVIO_WRITE_HF : 0);
                c.token_width = 4;
                round_trip(&c, KVIO_FMT_SAFETENSORS, 0);
                kvio_cache_free(&c);
            }
}
END_TEST

START_TEST(rt_npy_all_dtypes)
{
    for (int d = 0; d < 3; d++)
        for (int hf = 0; hf < 2; hf++) {
            kvio_cache c = make_cache(2, 3, 7, 4, 4, DTYPES[d], 0, 20 + (uint64_t)d);
            round_trip(&c, KVIO_FMT_NPY, hf ? KVIO_WRITE_HF : 0);
            kvio_cache_free(&c);
        }
}
END_TEST

/* kvio_read of a heads-first .npy points the tensors into the file's
 * private mapping instead of copying them (KVIO_READ_BORROW): the same
 * cache as a read from memory; a write to a tensor changes the process's
 * copy only, never the file; kvio_cache_free unmaps it. A positions-first
 * read (transposed) and a .safetensors read copy: no mapping kept. */
START_TEST(read_npy_in_place)
{
    char dir[] = "/tmp/test_cacheio.XXXXXX", path[64], err[ERRLEN];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/c.npy", dir);
    kvio_cache c = make_cache(3, 2, 9, 4, 4, FKVF_DTYPE_F16, 0, 31), d, e;
    ck_assert_int_eq(kvio_write(path, KVIO_FMT_AUTO, 0, &c, err, sizeof err), KVIO_OK);
    size_t n0;
    uint8_t *before = tu_slurp(path, &n0);
    ck_assert_int_eq(kvio_read(path, KVIO_FMT_AUTO, 0, &d, err, sizeof err), KVIO_OK);
    ck_assert(kvio_cache_equal(&c, &d));
    ck_assert_ptr_nonnull(d.map);
    for (uint32_t l = 0; l < d.n_layers; l++)
        ck_assert(kvio_in_map(&d, d.keys[l]) && kvio_in_map(&d, d.values[l]));
    d.keys[1][0] ^= 0xFF; /* the process's copy */
    d.values[2][5] ^= 0xFF;
    ck_assert(!kvio_cache_equal(&c, &d));
    size_t n1;
    uint8_t *after = tu_slurp(path, &n1);
    ck_assert(n0 == n1 && !memcmp(before, after, n0));
    kvio_cache_free(&d);
    ck_assert_ptr_null(d.map);
    /* positions-first: transposed into owned memory */
    ck_assert_int_eq(kvio_read(path, KVIO_FMT_AUTO, KVIO_READ_NHD, &e, err, sizeof err), KVIO_OK);
    ck_assert_ptr_null(e.map);
    kvio_cache_free(&e);
    remove(path);
    snprintf(path, sizeof path, "%s/c.safetensors", dir);
    ck_assert_int_eq(kvio_write(path, KVIO_FMT_AUTO, 0, &c, err, sizeof err), KVIO_OK);
    ck_assert_int_eq(kvio_read(path, KVIO_FMT_AUTO, 0, &e, err, sizeof err), KVIO_OK);
    ck_assert(kvio_cache_equal(&c, &e));
    ck_assert_ptr_null(e.map);
    kvio_cache_free(&e);
    remove(path);
    free(before);
    free(after);
    kvio_cache_free(&c);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* ---- lazy reads (KVIO_READ_LAZY, kvio_read_kv) ------------------------- */

/* Every position range of a few sizes, both strides, every layer and K|V,
 * read from lazy as from eager (heads-first in memory): one comparison a
 * call, the assertion once at the end. */
static int lazy_matches(const kvio_cache *eager, const kvio_cache *lazy)
{
    const uint32_t T = eager->n_positions, H = eager->n_kv_heads;
    size_t es = kvio_dtype_size(eager->dtype);
    size_t rb = (size_t)(eager->key_dim > eager->value_dim ? eager->key_dim : eager->value_dim) * es;
    size_t cap = (size_t)T * H * rb + 64;
    uint8_t *a = malloc(cap), *b = malloc(cap);
    char err[ERRLEN];
    int bad = 0;
    const uint32_t lens[] = {1, 2, 3, T / 2 + 1, T};
    for (uint32_t l = 0; l < eager->n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
                for (uint32_t first = 0; first + lens[k] <= T; first += lens[k] > 2 ? 1 : 3) {
                    size_t r = (size_t)(kv ? eager->value_dim : eager->key_dim) * es;
                    /* positions-major and heads-major destinations, with a gap */
                    size_t ps = k % 2 ? H * r + 5 : r, hs = k % 2 ? r : lens[k] * r + 3;
                    memset(a, 0xA5, cap);
                    memset(b, 0xA5, cap);
                    bad |= kvio_read_kv(eager, l, kv, first, lens[k], a, ps, hs, err, sizeof err);
                    bad |= kvio_read_kv(lazy, l, kv, first, lens[k], b, ps, hs, err, sizeof err);
                    bad |= memcmp(a, b, cap) != 0;
                }
    free(a);
    free(b);
    return bad;
}

START_TEST(lazy_reads_match_eager_reads)
{
    char dir[] = "/tmp/test_cacheio.XXXXXX", path[64], err[ERRLEN];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    const struct {
        const char *ext;
        unsigned wflags;
    } f[] = {{"safetensors", 0}, {"safetensors", KVIO_WRITE_NHD}, {"safetensors", KVIO_WRITE_HF},
             {"npy", 0},         {"npy", KVIO_WRITE_NHD},         {"npz", 0},
             {"npz", KVIO_WRITE_NHD | KVIO_WRITE_DEFLATE}};
    const fkvf_dtype dts[] = {FKVF_DTYPE_F16, FKVF_DTYPE_BF16, FKVF_DTYPE_F32};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        for (size_t d = 0; d < 3; d++) {
            /* npy holds one dim for keys and values */
            int npy = !strcmp(f[i].ext, "npy"); /* one dim, no token ids */
            kvio_cache c = make_cache(3, 2, 11, 4, npy ? 4 : 6, dts[d], !npy, 7 + i * 3 + d), e, z;
            snprintf(path, sizeof path, "%s/c.%s", dir, f[i].ext);
            int wrc = kvio_write(path, KVIO_FMT_AUTO, f[i].wflags, &c, err, sizeof err);
            ck_assert_msg(wrc == KVIO_OK, "%s", err);
            unsigned rf = f[i].wflags & KVIO_WRITE_NHD ? KVIO_READ_NHD : 0;
            ck_assert_int_eq(kvio_read(path, KVIO_FMT_AUTO, rf, &e, err, sizeof err), KVIO_OK);
            ck_assert_int_eq(kvio_read(path, KVIO_FMT_AUTO, rf | KVIO_READ_LAZY, &z, err, sizeof err),
                             KVIO_OK);
            ck_assert(kvio_cache_equal(&c, &e));
            /* every format's tensors stay in a file (a .npz's: the spill
             * file its members were inflated into) */
            ck_assert_ptr_nonnull(z.lazy);
            ck_assert_ptr_null(z.map);
            ck_assert_ptr_null(z.keys[1]);
            ck_assert_int_eq(z.n_positions, 11);
            ck_assert_int_eq(z.dtype, dts[d]);
            ck_assert(npy || (z.tokens && !memcmp(z.tokens, c.tokens, 11 * sizeof *c.tokens)));
            ck_assert_msg(!lazy_matches(&e, &z), "%s flags %x dtype %d", f[i].ext, f[i].wflags,
                          (int)dts[d]);
            /* the file stays open: removing its name changes nothing */
            remove(path);
            ck_assert(!lazy_matches(&e, &z));
            ck_assert(!kvio_cache_equal(&e, &z));
            ck_assert_int_ne(kvio_cache_check(&z, err, sizeof err), KVIO_OK);
            ck_assert_int_ne(kvio_write(path, KVIO_FMT_AUTO, 0, &z, err, sizeof err), KVIO_OK);
            ck_assert_int_ne(access(path, F_OK), 0);
            kvio_cache_free(&z);
            kvio_cache_free(&e);
            kvio_cache_free(&c);
        }
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

START_TEST(lazy_reads_cross_pieces)
{
    /* tensors of several read pieces (4 MiB) per head and per range: the
     * piece loop's offsets checked against the eager read */
    char dir[] = "/tmp/test_cacheio.XXXXXX", path[64], err[ERRLEN];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/c.safetensors", dir);
    const uint32_t T = 9000, H = 3, D = 128; /* 4.6 MB a head, 13.8 MB a layer's keys */
    kvio_cache c = make_cache(1, H, T, D, 2, FKVF_DTYPE_F32, 0, 5), e, z;
    size_t rb = (size_t)D * 4, cap = (size_t)T * H * rb;
    uint8_t *a = malloc(cap), *b = malloc(cap);
    for (unsigned nhd = 0; nhd < 2; nhd++) {
        ck_assert_int_eq(kvio_write(path, KVIO_FMT_AUTO, nhd ? KVIO_WRITE_NHD : 0, &c, err,
                                    sizeof err), KVIO_OK);
        unsigned rf = nhd ? KVIO_READ_NHD : 0;
        ck_assert_int_eq(kvio_read(path, KVIO_FMT_AUTO, rf, &e, err, sizeof err), KVIO_OK);
        ck_assert_int_eq(kvio_read(path, KVIO_FMT_AUTO, rf | KVIO_READ_LAZY, &z, err, sizeof err),
                         KVIO_OK);
        const uint32_t ranges[][2] = {{0, T}, {1, T - 1}, {8191, 2}, {4000, 5000}};
        int bad = 0;
        for (size_t r = 0; r < 4; r++) {
            memset(a, 1, cap);
            memset(b, 2, cap);
            uint32_t f = ranges[r][0], n = ranges[r][1];
            bad |= kvio_read_kv(&e, 0, 0, f, n, a, H * rb, rb, err, sizeof err);
            bad |= kvio_read_kv(&z, 0, 0, f, n, b, H * rb, rb, err, sizeof err);
            bad |= memcmp(a, b, (size_t)n * H * rb) != 0;
        }
        ck_assert_msg(!bad, "nhd %u", nhd);
        kvio_cache_free(&z);
        kvio_cache_free(&e);
        remove(path);
    }
    free(a);
    free(b);
    kvio_cache_free(&c);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

START_TEST(lazy_read_errors)
{
    char dir[] = "/tmp/test_cacheio.XXXXXX", path[64], err[ERRLEN];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/c.safetensors", dir);
    kvio_cache c = make_cache(2, 3, 40, 8, 8, FKVF_DTYPE_F16, 0, 99), z;
    ck_assert_int_eq(kvio_write(path, KVIO_FMT_AUTO, 0, &c, err, sizeof err), KVIO_OK);
    ck_assert_int_eq(kvio_read(path, KVIO_FMT_AUTO, KVIO_READ_LAZY, &z, err, sizeof err), KVIO_OK);
    uint8_t buf[40 * 3 * 16];
    /* ranges, layers and kv outside the cache */
    EXPECT_ERR(kvio_read_kv(&z, 2, 0, 0, 1, buf, 48, 16, err, sizeof err), err, KVIO_E_ARG,
               "c.safetensors", "layer 2");
    EXPECT_ERR(kvio_read_kv(&z, 0, 1, 39, 2, buf, 48, 16, err, sizeof err), err, KVIO_E_ARG,
               "[39, 41)", "40 positions");
    EXPECT_ERR(kvio_read_kv(&z, 0, 1, 41, 0, buf, 48, 16, err, sizeof err), err, KVIO_E_ARG,
               "outside");
    EXPECT_ERR(kvio_read_kv(&z, 0, 2, 0, 1, buf, 48, 16, err, sizeof err), err, KVIO_E_ARG, "kv");
    EXPECT_ERR(kvio_read_kv(&z, 0, 0, 0, 1, NULL, 48, 16, err, sizeof err), err, KVIO_E_ARG,
               "destination");
    ck_assert_int_eq(kvio_read_kv(&z, 1, 1, 40, 0, NULL, 0, 0, err, sizeof err), KVIO_OK);
    /* the file cut after it was opened: an I/O error naming the file, the
     * tensor and the offset, never a crash */
    ck_assert_int_eq(truncate(path, 200), 0);
    EXPECT_ERR(kvio_read_kv(&z, 1, 1, 0, 40, buf, 48, 16, err, sizeof err), err, KVIO_E_IO,
               "c.safetensors", "layer 1's values", "at byte offset", "end of file");
    kvio_cache_free(&z);
    /* kvio_read_mem never reads lazily nor points into the caller's bytes */
    ck_assert_int_eq(kvio_write(path, KVIO_FMT_AUTO, 0, &c, err, sizeof err), KVIO_OK);
    size_t n;
    uint8_t *bytes = tu_slurp(path, &n);
    ck_assert_int_eq(kvio_read_mem(bytes, n, "m.safetensors", KVIO_FMT_AUTO,
                                   KVIO_READ_LAZY | KVIO_READ_BORROW, &z, err, sizeof err),
                     KVIO_OK);
    ck_assert_ptr_null(z.lazy);
    ck_assert(kvio_cache_equal(&c, &z));
    memset(bytes, 0, n);
    ck_assert(kvio_cache_equal(&c, &z));
    free(bytes);
    /* kvio_cache_drop_data: shape kept, data gone, reads refused */
    kvio_cache_drop_data(&z);
    ck_assert_int_eq(z.n_positions, 40);
    EXPECT_ERR(kvio_read_kv(&z, 0, 0, 0, 1, buf, 48, 16, err, sizeof err), err, KVIO_E_ARG,
               "no data");
    kvio_cache_free(&z);
    ck_assert_int_eq(kvio_read(path, KVIO_FMT_AUTO, KVIO_READ_LAZY, &z, err, sizeof err), KVIO_OK);
    kvio_cache_drop_data(&z);
    ck_assert_ptr_null(z.lazy);
    kvio_cache_free(&z);
    kvio_cache_drop_data(NULL);
    remove(path);
    kvio_cache_free(&c);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

START_TEST(rt_npz_all_dtypes_stored_and_deflate)
{
    for (int d = 0; d < 3; d++)
        for (int tok = 0; tok < 2; tok++)
            for (unsigned fl = 0; fl < 4; fl++) {
                kvio_cache c = make_cache(3, 2, 9, 8, 4, DTYPES[d], tok, 30 + (uint64_t)d);
                unsigned flags = ((fl & 1) ? KVIO_WRITE_DEFLATE : 0) | ((fl & 2) ? KVIO_WRITE_HF : 0);
                round_trip(&c, KVIO_FMT_NPZ, flags);
                c.token_width = 4;
                round_trip(&c, KVIO_FMT_NPZ, flags);
                kvio_cache_free(&c);
            }
}
END_TEST

START_TEST(rt_zero_positions)
{
    kvio_cache c = make_cache(2, 2, 0, 4, 4, FKVF_DTYPE_F16, 1, 1);
    round_trip(&c, KVIO_FMT_SAFETENSORS, 0);
    round_trip(&c, KVIO_FMT_NPZ, 0);
    c.tokens = (free(c.tokens), NULL);
    round_trip(&c, KVIO_FMT_NPY, 0);
    kvio_cache_free(&c);
}
END_TEST

START_TEST(rt_safetensors_metadata)
{
    kvio_cache c = make_cache(1, 1, 2, 2, 2, FKVF_DTYPE_F32, 0, 3);
    ck_assert_int_eq(kvio_cache_set_meta(&c, "model", "stories260K \"q\" \\ \n\x01 \xc3\xa9"), KVIO_OK);
    ck_assert_int_eq(kvio_cache_set_meta(&c, "format", "pt"), KVIO_OK);
    ck_assert_int_eq(kvio_cache_set_meta(&c, "format", "fkvf"), KVIO_OK);
    size_t n;
    uint8_t *b = write_mem(&c, KVIO_FMT_SAFETENSORS, 0, &n);
    kvio_cache d;
    char err[ERRLEN];
    ck_assert_int_eq(kvio_read_safetensors_mem(b, n, "m", 0, &d, err, sizeof err), KVIO_OK);
    ck_assert_uint_eq(d.n_meta, 2);
    ck_assert_str_eq(kvio_cache_get_meta(&d, "model"), "stories260K \"q\" \\ \n\x01 \xc3\xa9");
    ck_assert_str_eq(kvio_cache_get_meta(&d, "format"), "fkvf");
    ck_assert_ptr_null(kvio_cache_get_meta(&d, "nope"));
    kvio_cache_free(&d);
    kvio_cache_free(&c);
    free(b);
}
END_TEST

/* KVIO_WRITE_NO_REPLACE: an existing file is left alone (KVIO_E_EXISTS);
 * without the flag it is replaced; no temporary file stays behind. */
START_TEST(write_no_replace)
{
    char dir[] = "/tmp/test_cacheio.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    kvio_cache c = make_cache(1, 1, 2, 2, 2, FKVF_DTYPE_F16, 1, 7), d;
    char path[256], err[ERRLEN];
    snprintf(path, sizeof path, "%s/c.safetensors", dir);
    tu_write_file(path, "precious", 8);
    EXPECT_ERR(kvio_write(path, KVIO_FMT_AUTO, KVIO_WRITE_NO_REPLACE, &c, err, sizeof err), err,
               KVIO_E_EXISTS, "c.safetensors", "exists");
    size_t kept;
    char *got = (char *)tu_slurp(path, &kept);
    ck_assert_uint_eq(kept, 8);
    ck_assert_str_eq(got, "precious");
    free(got);
    /* no file: written, under its name only */
    remove(path);
    ck_assert_int_eq(kvio_write(path, KVIO_FMT_AUTO, KVIO_WRITE_NO_REPLACE, &c, err, sizeof err),
                     KVIO_OK);
    ck_assert_int_eq(kvio_read(path, KVIO_FMT_AUTO, 0, &d, err, sizeof err), KVIO_OK);
    ck_assert(kvio_cache_equal(&c, &d));
    kvio_cache_free(&d);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_nlink, 1);
    /* the default replaces it */
    ck_assert_int_eq(kvio_write(path, KVIO_FMT_AUTO, 0, &c, err, sizeof err), KVIO_OK);
    ck_assert_str_eq(kvio_strerror(KVIO_E_EXISTS), "the file exists");
    remove(path);
    kvio_cache_free(&c);
    ck_assert_int_eq(rmdir(dir), 0); /* no temporary files left behind */
}
END_TEST

static void expect_file(const char *path, const char *text)
{
    size_t n;
    char *got = (char *)tu_slurp(path, &n);
    ck_assert_uint_eq(n, strlen(text));
    ck_assert_str_eq(got, text);
    free(got);
}

/* kvio_tmp_*: the output protocol of the tools. A file that appears while
 * the temporary file is written is not replaced without replace; with it the
 * name is replaced, not the contents (a hard link keeps its bytes); the mode
 * is 0666 less the umask; nothing is left under a temporary name. */
START_TEST(tmp_output_files)
{
    char dir[] = "/tmp/test_cacheio.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256], other[256], dang[256], err[ERRLEN];
    snprintf(path, sizeof path, "%s/o.bin", dir);
    snprintf(other, sizeof other, "%s/other.bin", dir);
    snprintf(dang, sizeof dang, "%s/dangling.bin", dir);
    mode_t um = umask(0);
    umask(um);
    ck_assert_uint_eq(kvio_output_mode(), 0666u & ~(unsigned)um);

    /* no replace: the file appears after the temporary file was made */
    kvio_tmp t;
    ck_assert_int_eq(kvio_tmp_open(&t, path, err, sizeof err), KVIO_OK);
    ck_assert_ptr_nonnull(t.f);
    ck_assert_ptr_nonnull(t.path);
    ck_assert(strncmp(t.path, path, strlen(path)) == 0);
    fputs("new", t.f);
    tu_write_file(path, "precious", strlen("precious"));
    EXPECT_ERR(kvio_tmp_place(&t, path, KVIO_WRITE_NO_REPLACE, err, sizeof err), err, KVIO_E_EXISTS,
               "o.bin", "appeared while it was written");
    ck_assert_ptr_null(t.path);
    ck_assert_ptr_null(t.f);
    expect_file(path, "precious");
    /* a dangling symbolic link is a file too */
    ck_assert_int_eq(symlink("nothing-here", dang), 0);
    ck_assert_int_eq(kvio_tmp_open(&t, dang, err, sizeof err), KVIO_OK);
    fputs("new", t.f);
    EXPECT_ERR(kvio_tmp_place(&t, dang, KVIO_WRITE_NO_REPLACE, err, sizeof err), err, KVIO_E_EXISTS,
               "dangling.bin");
    struct stat st;
    ck_assert_int_eq(lstat(dang, &st), 0);
    ck_assert(S_ISLNK(st.st_mode));
    ck_assert_int_eq(remove(dang), 0);

    /* replace: the name gets the new file, a hard link to the old one keeps
     * the old bytes; the mode is the umask's */
    ck_assert_int_eq(link(path, other), 0);
    ck_assert_int_eq(kvio_tmp_open(&t, path, err, sizeof err), KVIO_OK);
    fputs("new", t.f);
    ck_assert_int_eq(kvio_tmp_place(&t, path, 0, err, sizeof err), KVIO_OK);
    ck_assert_ptr_null(t.path);
    expect_file(path, "new");
    expect_file(other, "precious");
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 07777u, 0666u & ~(unsigned)um);
    ck_assert_uint_eq(st.st_nlink, 1);

    /* no replace, no file: placed under its name only */
    ck_assert_int_eq(remove(path), 0);
    ck_assert_int_eq(kvio_tmp_open(&t, path, err, sizeof err), KVIO_OK);
    fputs("newer", t.f);
    ck_assert_int_eq(kvio_tmp_place(&t, path, KVIO_WRITE_NO_REPLACE, err, sizeof err), KVIO_OK);
    expect_file(path, "newer");
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_nlink, 1);

    /* discard: the temporary file goes, the output stays as it was */
    ck_assert_int_eq(kvio_tmp_open(&t, path, err, sizeof err), KVIO_OK);
    fputs("discarded", t.f);
    kvio_tmp_discard(&t);
    ck_assert_ptr_null(t.path);
    ck_assert_ptr_null(t.f);
    kvio_tmp_discard(&t); /* a no-op, as is NULL */
    kvio_tmp_discard(NULL);
    expect_file(path, "newer");
    /* a write that fails (past the file size limit, SIGXFSZ ignored: EFBIG,
     * seen when the buffer is flushed): refused, the output kept */
    struct rlimit old_lim, lim;
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old_lim), 0);
    lim = old_lim;
    lim.rlim_cur = 4096;
    void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc[2];
    char err2[ERRLEN];
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(kvio_tmp_open(&t, path, k ? err2 : err, ERRLEN), KVIO_OK);
        /* k = 0: the error is met when the buffer is flushed by place;
         * k = 1: already in fputs (the stream's error flag) */
        static char big[65536], small[1024]; /* glibc ignores the size of a NULL buffer */
        ck_assert_int_eq(k ? setvbuf(t.f, small, _IOFBF, sizeof small)
                           : setvbuf(t.f, big, _IOFBF, sizeof big),
                         0);
        for (int i = 0; i < 1024; i++)
            fputs("0123456789abcdef", t.f);
        rc[k] = kvio_tmp_place(&t, path, 0, k ? err2 : err, ERRLEN);
    }
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old_lim), 0);
    signal(SIGXFSZ, old_sig);
    EXPECT_ERR(rc[0], err, KVIO_E_IO, "o.bin", "write failed: File too large");
    EXPECT_ERR(rc[1], err2, KVIO_E_IO, "o.bin", "write failed (a write to the temporary file failed)");
    ck_assert_ptr_null(t.path);
    expect_file(path, "newer");

    /* a directory that does not exist; no path */
    char nodir[300];
    snprintf(nodir, sizeof nodir, "%s/no/such/o.bin", dir);
    EXPECT_ERR(kvio_tmp_open(&t, nodir, err, sizeof err), err, KVIO_E_IO, "o.bin",
               "cannot create a temporary file");
    ck_assert_ptr_null(t.path);
    ck_assert_ptr_null(t.f);
    ck_assert_int_eq(kvio_tmp_open(&t, "", err, sizeof err), KVIO_E_ARG);
    ck_assert_int_eq(kvio_tmp_place(&t, path, 0, err, sizeof err), KVIO_E_ARG);

    remove(path);
    remove(other);
    ck_assert_int_eq(rmdir(dir), 0); /* no temporary files left behind */
}
END_TEST

/* kvio_write: the file's mode follows the umask (0666 less it), as fopen's
 * would; it was 0644 whatever the umask. Each umask in a child process of its
 * own (kvio_output_mode reads the umask once per process). */
START_TEST(write_mode_follows_umask)
{
    char dir[] = "/tmp/test_cacheio.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    kvio_cache c = make_cache(1, 1, 2, 2, 2, FKVF_DTYPE_F16, 0, 3);
    static const unsigned um[3] = {077, 022, 002}, want[3] = {0600, 0644, 0664};
    for (int i = 0; i < 3; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/c%d.npy", dir, i);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            char err[ERRLEN];
            umask((mode_t)um[i]);
            _exit(kvio_write(path, KVIO_FMT_AUTO, KVIO_WRITE_NO_REPLACE, &c, err, sizeof err) ==
                          KVIO_OK
                      ? 0
                      : 1);
        }
        int status;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        struct stat st;
        ck_assert_int_eq(stat(path, &st), 0);
        ck_assert_msg((st.st_mode & 07777u) == want[i], "umask %03o: mode %03o, want %03o", um[i],
                      (unsigned)(st.st_mode & 07777u), want[i]);
        remove(path);
    }
    kvio_cache_free(&c);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

START_TEST(rt_files_auto_detect)
{
    char dir[] = "/tmp/test_cacheio.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    static const char *const names[] = {"c.safetensors", "c.npy", "c.NPZ"};
    for (int i = 0; i < 3; i++) {
        kvio_cache c = make_cache(2, 2, 3, 4, 4, FKVF_DTYPE_BF16, i != 1, 40);
        char path[256], err[ERRLEN];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        ck_assert_int_eq(kvio_write(path, KVIO_FMT_AUTO, KVIO_WRITE_DEFLATE, &c, err, sizeof err), KVIO_OK);
        kvio_cache d;
        int rc = kvio_read(path, KVIO_FMT_AUTO, 0, &d, err, sizeof err);
        if (rc)
            ck_abort_msg("%s", err);
        ck_assert(kvio_cache_equal(&c, &d));
        kvio_cache_free(&d);
        /* the format is found by content, whatever the name says */
        char other[300];
        snprintf(other, sizeof other, "%s/renamed.bin", dir);
        ck_assert_int_eq(rename(path, other), 0);
        ck_assert_int_eq(kvio_read(other, KVIO_FMT_AUTO, 0, &d, err, sizeof err), KVIO_OK);
        ck_assert(kvio_cache_equal(&c, &d));
        kvio_cache_free(&d);
        remove(other);
        kvio_cache_free(&c);
    }
    /* errors: unknown extension, missing file, unwritable place, empty file */
    kvio_cache c = make_cache(1, 1, 1, 1, 1, FKVF_DTYPE_F16, 0, 1), d;
    char path[256], err[ERRLEN];
    snprintf(path, sizeof path, "%s/c.txt", dir);
    EXPECT_ERR(kvio_write(path, KVIO_FMT_AUTO, 0, &c, err, sizeof err), err, KVIO_E_ARG, "c.txt", "format");
    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    EXPECT_ERR(kvio_read(path, KVIO_FMT_AUTO, 0, &d, err, sizeof err), err, KVIO_E_IO, "missing.safetensors");
    snprintf(path, sizeof path, "%s/no/such/dir/c.npz", dir);
    EXPECT_ERR(kvio_write(path, KVIO_FMT_AUTO, 0, &c, err, sizeof err), err, KVIO_E_IO, "c.npz");
    snprintf(path, sizeof path, "%s/empty.npy", dir);
    tu_write_file(path, "", 0);
    EXPECT_ERR(kvio_read(path, KVIO_FMT_AUTO, 0, &d, err, sizeof err), err, KVIO_E_FORMAT, "empty.npy", "empty");
    remove(path);
    kvio_cache_free(&c);
    ck_assert_int_eq(rmdir(dir), 0); /* no temporary files left behind */
}
END_TEST

/* ---- exact bytes of what we write --------------------------------------- */

START_TEST(safetensors_bytes_are_exact)
{
    kvio_cache c = make_cache(1, 1, 2, 1, 1, FKVF_DTYPE_F32, 1, 5);
    c.token_width = 4;
    c.tokens[0] = 7;
    c.tokens[1] = 65536;
    size_t n;
    uint8_t *b = write_mem(&c, KVIO_FMT_SAFETENSORS, 0, &n);
    const char *want = "{\"layers.0.key\":{\"dtype\":\"F32\",\"shape\":[1,2,1],\"data_offsets\":[0,8]},"
                       "\"layers.0.value\":{\"dtype\":\"F32\",\"shape\":[1,2,1],\"data_offsets\":[8,16]},"
                       "\"tokens\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[16,24]}}";
    size_t wl = strlen(want), hl = (wl + 7) / 8 * 8;
    ck_assert_uint_eq(n, 8 + hl + 24);
    ck_assert_uint_eq(b[0], hl);
    ck_assert(memcmp(b + 8, want, wl) == 0);
    for (size_t i = wl; i < hl; i++)
        ck_assert_uint_eq(b[8 + i], ' ');
    ck_assert(memcmp(b + 8 + hl, c.keys[0], 8) == 0);
    ck_assert(memcmp(b + 8 + hl + 8, c.values[0], 8) == 0);
    static const uint8_t tok[8] = {7, 0, 0, 0, 0, 0, 1, 0};
    ck_assert(memcmp(b + 8 + hl + 16, tok, 8) == 0);
    free(b);
    b = write_mem(&c, KVIO_FMT_SAFETENSORS, KVIO_WRITE_HF, &n);
    ck_assert_ptr_nonnull(strstr((const char *)b + 8, "\"past_key_values.0.value\":{\"dtype\":\"F32\",\"shape\":[1,1,2,1]"));
    free(b);
    kvio_cache_free(&c);
}
END_TEST

START_TEST(npy_bytes_are_exact)
{
    kvio_cache c = make_cache(3, 2, 5, 4, 4, FKVF_DTYPE_BF16, 0, 6);
    size_t n;
    uint8_t *b = write_mem(&c, KVIO_FMT_NPY, 0, &n);
    const char *dict = "{'descr': '<u2', 'fortran_order': False, 'shape': (3, 2, 2, 5, 4), }";
    ck_assert(memcmp(b, "\x93NUMPY\x01\x00", 8) == 0);
    size_t hl = (size_t)b[8] | ((size_t)b[9] << 8);
    ck_assert_uint_eq((10 + hl) % 64, 0);
    ck_assert(memcmp(b + 10, dict, strlen(dict)) == 0);
    ck_assert_uint_eq(b[10 + hl - 1], '\n');
    size_t lb = (size_t)kvio_key_bytes(&c);
    ck_assert_uint_eq(n, 10 + hl + 6 * lb);
    /* [layer][k|v][head][position][dim] */
    ck_assert(memcmp(b + 10 + hl + 3 * lb, c.values[1], lb) == 0);
    ck_assert(memcmp(b + 10 + hl + 4 * lb, c.keys[2], lb) == 0);
    free(b);
    kvio_cache_free(&c);
}
END_TEST

START_TEST(npz_members_are_named_by_the_convention)
{
    kvio_cache c = make_cache(2, 1, 3, 2, 2, FKVF_DTYPE_F16, 1, 7);
    size_t n;
    uint8_t *b = write_mem(&c, KVIO_FMT_NPZ, KVIO_WRITE_DEFLATE, &n);
    struct archive *a = archive_read_new();
    archive_read_support_format_zip(a);
    ck_assert_int_eq(archive_read_open_memory(a, b, n), ARCHIVE_OK);
    static const char *const want[] = {"layers.0.key.npy", "layers.0.value.npy", "layers.1.key.npy",
                                       "layers.1.value.npy", "tokens.npy"};
    struct archive_entry *e;
    int k = 0;
    while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
        ck_assert_int_lt(k, 5);
        ck_assert_str_eq(archive_entry_pathname(e), want[k]);
        k++;
    }
    ck_assert_int_eq(k, 5);
    archive_read_free(a);
    free(b);
    kvio_cache_free(&c);
}
END_TEST

/* ---- Hugging Face layouts ---------------------------------------------- */

START_TEST(hf_layouts_accepted)
{
    static const char *const heads[] = {
        "{\"past_key_values.0.key\":{\"dtype\":\"BF16\",\"shape\":[1,2,3,4],\"data_offsets\":[0,48]},"
        "\"past_key_values.0.value\":{\"dtype\":\"BF16\",\"shape\":[1,2,3,4],\"data_offsets\":[48,96]}}",
        "{\"past_key_values.0.1\":{\"dtype\":\"BF16\",\"shape\":[1,2,3,4],\"data_offsets\":[48,96]},"
        "\"past_key_values.0.0\":{\"dtype\":\"BF16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]}}",
        "{\"key_cache.0\":{\"dtype\":\"BF16\",\"shape\":[1,2,3,4],\"data_offsets\":[0,48]},"
        "\"value_cache.0\":{\"dtype\":\"BF16\",\"shape\":[1,2,3,4],\"data_offsets\":[48,96]},"
        "\"input_ids\":{\"dtype\":\"I64\",\"shape\":[1,3],\"data_offsets\":[96,120]}}",
    };
    for (int i = 0; i < 3; i++) {
        kvio_cache c;
        char err[ERRLEN];
        size_t n;
        uint8_t *b = st_make(heads[i], i == 2 ? 120 : 96, &n);
        if (i == 2)
            memset(b + n - 24, 0, 24); /* token ids 0 */
        int rc = kvio_read_safetensors_mem(b, n, "hf.safetensors", 0, &c, err, sizeof err);
        if (rc)
            ck_abort_msg("%s", err);
        ck_assert_uint_eq(c.n_layers, 1);
        ck_assert_uint_eq(c.n_kv_heads, 2);
        ck_assert_uint_eq(c.n_positions, 3);
        ck_assert_uint_eq(c.key_dim, 4);
        ck_assert_int_eq(c.dtype, FKVF_DTYPE_BF16);
        ck_assert(memcmp(c.keys[0], b + n - (i == 2 ? 120 : 96), 48) == 0);
        ck_assert(memcmp(c.values[0], b + n - (i == 2 ? 72 : 48), 48) == 0);
        ck_assert((c.tokens != NULL) == (i == 2));
        kvio_cache_free(&c);
        free(b);
    }
}
END_TEST

/* ---- truncation ---------------------------------------------------------- */

START_TEST(truncated_safetensors_always_rejected)
{
    kvio_cache c = make_cache(2, 2, 3, 2, 2, FKVF_DTYPE_F16, 1, 8);
    size_t n;
    uint8_t *b = write_mem(&c, KVIO_FMT_SAFETENSORS, 0, &n);
    for (size_t k = 0; k < n; k++) {
        uint8_t *p = tu_dup_odd(b, k); /* exactly k bytes: ASan sees any overread */
        kvio_cache d;
        char err[ERRLEN] = "";
        int rc = kvio_read_safetensors_mem(p, k, "t.safetensors", 0, &d, err, sizeof err);
        ck_assert_msg(rc != KVIO_OK, "prefix %zu of %zu accepted", k, n);
        ck_assert(strncmp(err, "t.safetensors: ", 15) == 0);
        tu_free_odd(p);
    }
    free(b);
    kvio_cache_free(&c);
}
END_TEST

START_TEST(truncated_npy_always_rejected)
{
    kvio_cache c = make_cache(2, 2, 3, 2, 2, FKVF_DTYPE_F32, 0, 9);
    size_t n;
    uint8_t *b = write_mem(&c, KVIO_FMT_NPY, 0, &n);
    for (size_t k = 0; k < n; k++) {
        uint8_t *p = tu_dup_odd(b, k);
        kvio_cache d;
        char err[ERRLEN] = "";
        ck_assert_msg(kvio_read_npy_mem(p, k, "t.npy", 0, &d, err, sizeof err) != KVIO_OK,
                      "prefix %zu of %zu accepted", k, n);
        ck_assert(strncmp(err, "t.npy: ", 7) == 0);
        tu_free_odd(p);
    }
    free(b);
    kvio_cache_free(&c);
}
END_TEST

START_TEST(truncated_npz_always_rejected)
{
    kvio_cache c = make_cache(2, 1, 3, 2, 2, FKVF_DTYPE_F16, 1, 10);
    for (int deflate = 0; deflate < 2; deflate++) {
        size_t n;
        uint8_t *b = write_mem(&c, KVIO_FMT_NPZ, deflate ? KVIO_WRITE_DEFLATE : 0, &n);
        for (size_t k = 0; k < n; k++) {
            uint8_t *p = tu_dup_odd(b, k);
            kvio_cache d;
            char err[ERRLEN] = "";
            ck_assert_msg(kvio_read_npz_mem(p, k, "t.npz", 0, &d, err, sizeof err) != KVIO_OK,
                          "prefix %zu of %zu accepted", k, n);
            ck_assert(strncmp(err, "t.npz: ", 7) == 0);
            tu_free_odd(p);
        }
        free(b);
    }
    kvio_cache_free(&c);
}
END_TEST

/* ---- safetensors framing and offsets ------------------------------------ */

START_TEST(st_header_length_beyond_file)
{
    kvio_cache c;
    char err[ERRLEN];
    size_t n;
    uint8_t *b = st_make("{" KV1 "}", 96, &n);
    b[0] = (uint8_t)(n - 8 + 1); /* one more than the file holds */
    b[1] = (uint8_t)((n - 8 + 1) >> 8);
    EXPECT_ERR(kvio_read_safetensors_mem(b, n, "f.safetensors", 0, &c, err, sizeof err), err,
               KVIO_E_FORMAT, "f.safetensors: ", "header length", "past the end of the file");
    memset(b, 0xff, 8);
    EXPECT_ERR(kvio_read_safetensors_mem(b, n, "f.safetensors", 0, &c, err, sizeof err), err,
               KVIO_E_FORMAT, "header length 18446744073709551615", "past the end");
    free(b);
}
END_TEST

START_TEST(st_header_length_over_limit)
{
    size_t n = (size_t)KVIO_MAX_ST_HEADER + 64;
    uint8_t *b = calloc(n, 1);
    ck_assert_ptr_nonnull(b);
    uint64_t hl = (uint64_t)KVIO_MAX_ST_HEADER + 1;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(hl >> (8 * i));
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(kvio_read_safetensors_mem(b, n, "big.safetensors", 0, &c, err, sizeof err), err,
               KVIO_E_FORMAT, "big.safetensors", "exceeds the limit");
    free(b);
}
END_TEST

START_TEST(st_too_short_for_length)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(kvio_read_safetensors_mem("\x02\0\0\0", 4, "s.safetensors", 0, &c, err, sizeof err), err,
               KVIO_E_FORMAT, "s.safetensors", "8-byte header length");
}
END_TEST

START_TEST(st_offsets_out_of_range)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{" KV1 "}", 95, 0, &c, err), err, KVIO_E_FORMAT, "bad.safetensors",
               "tensor 'layers.0.value'", "data_offsets [48, 96] run past the end of the data region (95 bytes)");
}
END_TEST

START_TEST(st_overlapping_tensors)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]},"
                       "\"layers.0.value\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[40,88]}}",
                       88, 0, &c, err),
               err, KVIO_E_FORMAT, "tensor 'layers.0.value'", "overlap tensor 'layers.0.key' [0, 48]");
    /* the same bytes named twice */
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]},"
                       "\"layers.0.value\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]}}",
                       48, 0, &c, err),
               err, KVIO_E_FORMAT, "overlap");
}
END_TEST

START_TEST(st_gap_and_unused_tail)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]},"
                       "\"layers.0.value\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[50,98]}}",
                       98, 0, &c, err),
               err, KVIO_E_FORMAT, "tensor 'layers.0.value'", "leave bytes [48, 50)", "unused");
    EXPECT_ERR(st_read("{" KV1 "}", 100, 0, &c, err), err, KVIO_E_FORMAT, "tensor 'layers.0.value'",
               "ends at 96", "100 bytes");
    EXPECT_ERR(st_read("{}", 4, 0, &c, err), err, KVIO_E_FORMAT, "no tensors, but 4 bytes");
}
END_TEST

START_TEST(st_begin_after_end)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[48,0]}}", 96, 0, &c,
                       err),
               err, KVIO_E_FORMAT, "tensor 'layers.0.key'", "[48, 0]", "begin is after end");
}
END_TEST

START_TEST(st_shape_bytes_mismatch)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F32\",\"shape\":[2,3,4],\"data_offsets\":[0,48]},"
                       "\"layers.0.value\":{\"dtype\":\"F32\",\"shape\":[2,3,4],\"data_offsets\":[48,96]}}",
                       96, 0, &c, err),
               err, KVIO_E_FORMAT, "tensor 'layers.0.key'", "shape [2, 3, 4] of F32 needs 96 bytes",
               "hold 48");
    /* product overflows 64 bits */
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[4294967296,4294967296,2],"
                       "\"data_offsets\":[0,0]}}", 0, 0, &c, err),
               err, KVIO_E_FORMAT, "tensor 'layers.0.key'", "overflows");
    /* a zero dimension makes the product zero, even after a huge one */
    EXPECT_ERR(st_read("{\"x\":{\"dtype\":\"F16\",\"shape\":[18446744073709551615,18446744073709551615,0],"
                       "\"data_offsets\":[0,0]}}", 0, 0, &c, err),
               err, KVIO_E_CONVENTION, "tensor 'x'", "not part of the cache naming convention");
}
END_TEST

START_TEST(st_unknown_dtype)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F17\",\"shape\":[2,3,4],\"data_offsets\":[0,48]}}", 48,
                       0, &c, err),
               err, KVIO_E_UNSUPPORTED, "tensor 'layers.0.key'", "unknown dtype 'F17'");
    /* known to safetensors, not a KV-cache dtype */
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F64\",\"shape\":[2,3,4],\"data_offsets\":[0,192]},"
                       "\"layers.0.value\":{\"dtype\":\"F64\",\"shape\":[2,3,4],\"data_offsets\":[192,384]}}",
                       384, 0, &c, err),
               err, KVIO_E_UNSUPPORTED, "tensor 'layers.0.key'", "dtype F64", "f16, bf16 or f32");
    EXPECT_ERR(st_read("{" KV1 ",\"tokens\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[96,108]}}", 108,
                       0, &c, err),
               err, KVIO_E_UNSUPPORTED, "tensor 'tokens'", "int32 or int64");
}
END_TEST

/* ---- naming convention and shapes -------------------------------------- */

START_TEST(st_missing_layer)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{" KV1 ",\"layers.2.key\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[96,144]},"
                       "\"layers.2.value\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[144,192]}}",
                       192, 0, &c, err),
               err, KVIO_E_CONVENTION, "bad.safetensors", "missing tensor 'layers.1.key'");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]}}", 48, 0,
                       &c, err),
               err, KVIO_E_CONVENTION, "missing tensor 'layers.0.value'", "'layers.0.key' is present");
    EXPECT_ERR(st_read("{\"past_key_values.0.value\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]}}",
                       48, 0, &c, err),
               err, KVIO_E_CONVENTION, "missing tensor 'past_key_values.0.key'");
    EXPECT_ERR(st_read("{" KV1 ",\"layers.1.value\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[96,144]}}",
                       144, 0, &c, err),
               err, KVIO_E_CONVENTION, "missing tensor 'layers.1.key'", "'layers.1.value' is present");
    EXPECT_ERR(st_read("{}", 0, 0, &c, err), err, KVIO_E_CONVENTION, "no key/value tensors");
}
END_TEST

START_TEST(st_inconsistent_shapes_across_layers)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{" KV1 ",\"layers.1.key\":{\"dtype\":\"F16\",\"shape\":[2,2,6],\"data_offsets\":[96,144]},"
                       "\"layers.1.value\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[144,192]}}",
                       192, 0, &c, err),
               err, KVIO_E_CONVENTION, "tensor 'layers.1.key'", "shape [2, 2, 6] differs from tensor 'layers.0.key' [2, 3, 4]");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]},"
                       "\"layers.0.value\":{\"dtype\":\"F16\",\"shape\":[3,2,4],\"data_offsets\":[48,96]}}",
                       96, 0, &c, err),
               err, KVIO_E_CONVENTION, "tensor 'layers.0.value'", "does not match 2 kv_heads, 3 positions");
    EXPECT_ERR(st_read("{" KV1 ",\"layers.1.key\":{\"dtype\":\"BF16\",\"shape\":[2,3,4],\"data_offsets\":[96,144]},"
                       "\"layers.1.value\":{\"dtype\":\"BF16\",\"shape\":[2,3,4],\"data_offsets\":[144,192]}}",
                       192, 0, &c, err),
               err, KVIO_E_CONVENTION, "tensor 'layers.1.key'", "dtype BF16 differs from tensor 'layers.0.key' (F16)");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[2,3,4,1],\"data_offsets\":[0,48]},"
                       "\"layers.0.value\":{\"dtype\":\"F16\",\"shape\":[24],\"data_offsets\":[48,96]}}",
                       96, 0, &c, err),
               err, KVIO_E_UNSUPPORTED, "tensor 'layers.0.key'", "batch dimension is 2");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]},"
                       "\"layers.0.value\":{\"dtype\":\"F16\",\"shape\":[24],\"data_offsets\":[48,96]}}",
                       96, 0, &c, err),
               err, KVIO_E_CONVENTION, "tensor 'layers.0.value'", "shape [24]", "expected [kv_heads, positions, dim]");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[0,3,4],\"data_offsets\":[0,0]},"
                       "\"layers.0.value\":{\"dtype\":\"F16\",\"shape\":[0,3,4],\"data_offsets\":[0,0]}}",
                       0, 0, &c, err),
               err, KVIO_E_CONVENTION, "tensor 'layers.0.key'", "zero kv_heads or dim");
}
END_TEST

START_TEST(st_tokens_checked)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{" KV1 ",\"tokens\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[96,112]}}", 112,
                       0, &c, err),
               err, KVIO_E_CONVENTION, "tensor 'tokens'", "4 token ids for 3 positions");
    EXPECT_ERR(st_read("{" KV1 ",\"tokens\":{\"dtype\":\"I32\",\"shape\":[3,1],\"data_offsets\":[96,108]}}", 108,
                       0, &c, err),
               err, KVIO_E_CONVENTION, "tensor 'tokens'", "expected [positions] or [1, positions]");
    size_t n;
    uint8_t *b = st_make("{" KV1 ",\"tokens\":{\"dtype\":\"I32\",\"shape\":[1,3],\"data_offsets\":[96,108]}}", 108, &n);
    memset(b + n - 12, 0, 12);
    memset(b + n - 4, 0xff, 4); /* -1 */
    EXPECT_ERR(kvio_read_safetensors_mem(b, n, "neg.safetensors", 0, &c, err, sizeof err), err,
               KVIO_E_CONVENTION, "neg.safetensors", "tensor 'tokens'", "token id -1 at position 2");
    memset(b + n - 4, 0, 4);
    ck_assert_int_eq(kvio_read_safetensors_mem(b, n, "ok.safetensors", 0, &c, err, sizeof err), KVIO_OK);
    ck_assert_uint_eq(c.token_width, 4);
    kvio_cache_free(&c);
    free(b);
    EXPECT_ERR(st_read("{" KV1 ",\"tokens\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[96,108]},"
                       "\"input_ids\":{\"dtype\":\"I32\",\"shape\":[3],\"data_offsets\":[108,120]}}", 120, 0, &c, err),
               err, KVIO_E_CONVENTION, "token ids given twice");
}
END_TEST

START_TEST(st_duplicate_names)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{" KV1 ",\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[96,96]}}", 96,
                       0, &c, err),
               err, KVIO_E_FORMAT, "tensor 'layers.0.key'", "duplicate name");
    /* equal after unescaping */
    EXPECT_ERR(st_read("{" KV1 ",\"\\u006cayers.0.key\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[96,96]}}",
                       96, 0, &c, err),
               err, KVIO_E_FORMAT, "tensor 'layers.0.key'", "duplicate name");
    EXPECT_ERR(st_read("{\"__metadata__\":{},\"__metadata__\":{}," KV1 "}", 96, 0, &c, err), err, KVIO_E_FORMAT,
               "duplicate __metadata__");
    EXPECT_ERR(st_read("{\"__metadata__\":{\"a\":\"1\",\"b\":\"2\",\"a\":\"3\"}," KV1 "}", 96, 0, &c, err), err,
               KVIO_E_FORMAT, "__metadata__: duplicate key 'a'");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]}}",
                       48, 0, &c, err),
               err, KVIO_E_FORMAT, "tensor 'layers.0.key'", "duplicate field 'dtype'");
}
END_TEST

START_TEST(st_extra_tensors_and_names)
{
    kvio_cache c;
    char err[ERRLEN];
    const char *h = "{" KV1 ",\"model.embed\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[96,112]}}";
    EXPECT_ERR(st_read(h, 112, 0, &c, err), err, KVIO_E_CONVENTION, "tensor 'model.embed'",
               "not part of the cache naming convention");
    ck_assert_int_eq(st_read(h, 112, KVIO_READ_IGNORE_EXTRA, &c, err), KVIO_OK);
    ck_assert_uint_eq(c.n_layers, 1);
    kvio_cache_free(&c);
    /* ignored tensors still count for offsets */
    EXPECT_ERR(st_read(h, 113, KVIO_READ_IGNORE_EXTRA, &c, err), err, KVIO_E_FORMAT, "tensor 'model.embed'",
               "ends at 112");
    EXPECT_ERR(st_read("{\"layers.01.key\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]}}", 48,
                       KVIO_READ_IGNORE_EXTRA, &c, err),
               err, KVIO_E_CONVENTION, "tensor 'layers.01.key'", "malformed layer index");
    EXPECT_ERR(st_read("{\"layers.4294967295.key\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]}}",
                       48, 0, &c, err),
               err, KVIO_E_CONVENTION, "malformed layer index");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[0,48]},"
                       "\"past_key_values.0.value\":{\"dtype\":\"F16\",\"shape\":[2,3,4],\"data_offsets\":[48,96]}}",
                       96, 0, &c, err),
               err, KVIO_E_CONVENTION, "one naming scheme per file");
    /* control characters in names are shown escaped */
    EXPECT_ERR(st_read("{\"a\\u0001'\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, 0, &c, err),
               err, KVIO_E_CONVENTION, "tensor 'a\\x01\\x27'");
}
END_TEST

/* ---- malformed JSON ------------------------------------------------------ */

START_TEST(st_json_unterminated_string)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{\"layers.0.key", 0, 0, &c, err), err, KVIO_E_FORMAT, "header byte 9", "unterminated string");
    EXPECT_ERR(st_read("{\"a\\", 0, 0, &c, err), err, KVIO_E_FORMAT, "unterminated string");
    EXPECT_ERR(st_read("{\"a\\u00", 0, 0, &c, err), err, KVIO_E_FORMAT, "unterminated string");
}
END_TEST

START_TEST(st_json_bad_escape)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{\"a\\x\":{}}", 0, 0, &c, err), err, KVIO_E_FORMAT, "bad escape '\\x'");
    EXPECT_ERR(st_read("{\"a\\u12G4\":{}}", 0, 0, &c, err), err, KVIO_E_FORMAT, "not a hex digit");
    EXPECT_ERR(st_read("{\"a\\udc00\":{}}", 0, 0, &c, err), err, KVIO_E_FORMAT, "unpaired low surrogate");
    EXPECT_ERR(st_read("{\"a\\ud800x\":{}}", 0, 0, &c, err), err, KVIO_E_FORMAT, "without its low half");
    EXPECT_ERR(st_read("{\"a\\ud800\\u0041\":{}}", 0, 0, &c, err), err, KVIO_E_FORMAT, "cannot follow high surrogate");
    EXPECT_ERR(st_read("{\"a\\u0000\":{}}", 0, 0, &c, err), err, KVIO_E_FORMAT, "NUL");
    EXPECT_ERR(st_read("{\"a\tb\":{}}", 0, 0, &c, err), err, KVIO_E_FORMAT, "control character 0x09");
    EXPECT_ERR(st_read("{\"a\xc0\x80\":{}}", 0, 0, &c, err), err, KVIO_E_FORMAT, "invalid UTF-8");
    EXPECT_ERR(st_read("{\"a\xed\xa0\x80\":{}}", 0, 0, &c, err), err, KVIO_E_FORMAT, "invalid UTF-8");
    /* a valid surrogate pair decodes to one code point (and is then an unknown tensor) */
    EXPECT_ERR(st_read("{\"\\ud83d\\ude00\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, 0, &c,
                       err),
               err, KVIO_E_CONVENTION, "tensor '\xf0\x9f\x98\x80'");
}
END_TEST

START_TEST(st_json_nesting_too_deep)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":{\"x\":{\"y\":{}}}}}", 0, 0, &c, err), err, KVIO_E_FORMAT,
               "tensor 'layers.0.key'", "nested too deep");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"shape\":[[2],[3]]}}", 0, 0, &c, err), err, KVIO_E_FORMAT,
               "nested too deep");
    EXPECT_ERR(st_read("{\"__metadata__\":{\"k\":{\"k\":{}}}}", 0, 0, &c, err), err, KVIO_E_FORMAT,
               "nested too deep");
    /* 100000 levels: rejected at the first byte it cannot use, no recursion */
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 16);
    ck_assert_ptr_nonnull(deep);
    strcpy(deep, "{\"a\":");
    size_t k = strlen(deep);
    for (size_t i = 0; i < depth; i++)
        deep[k++] = '[';
    for (size_t i = 0; i < depth; i++)
        deep[k++] = ']';
    deep[k++] = '}';
    deep[k] = 0;
    EXPECT_ERR(st_read(deep, 0, 0, &c, err), err, KVIO_E_FORMAT, "tensor 'a'", "header byte 13");
    deep[0] = '[';
    EXPECT_ERR(st_read(deep, 0, 0, &c, err), err, KVIO_E_FORMAT, "header byte 8", "must start with a JSON object");
    free(deep);
}
END_TEST

START_TEST(st_json_huge_and_bad_numbers)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[18446744073709551616],\"data_offsets\":[0,0]}}",
                       0, 0, &c, err),
               err, KVIO_E_FORMAT, "tensor 'layers.0.key'", "number too large");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,"
                       "99999999999999999999999999999999999999999]}}", 0, 0, &c, err),
               err, KVIO_E_FORMAT, "number too large");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[-2],\"data_offsets\":[0,0]}}", 0, 0, &c, err),
               err, KVIO_E_FORMAT, "negative number in shape");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[2.0],\"data_offsets\":[0,0]}}", 0, 0, &c, err),
               err, KVIO_E_FORMAT, "shape must hold integers");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[1e3],\"data_offsets\":[0,0]}}", 0, 0, &c, err),
               err, KVIO_E_FORMAT, "shape must hold integers");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[02],\"data_offsets\":[0,4]}}", 4, 0, &c, err),
               err, KVIO_E_FORMAT, "leading zero");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4,8]}}", 8, 0, &c, err),
               err, KVIO_E_FORMAT, "exactly two numbers");
}
END_TEST

START_TEST(st_json_structure_errors)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{" KV1 ",}", 96, 0, &c, err), err, KVIO_E_FORMAT, "trailing comma");
    EXPECT_ERR(st_read("{" KV1 "} x", 96, 0, &c, err), err, KVIO_E_FORMAT, "unexpected data after the header");
    EXPECT_ERR(st_read("{" KV1, 96, 0, &c, err), err, KVIO_E_FORMAT, "header ends where");
    EXPECT_ERR(st_read("{\"layers.0.key\" {}}", 0, 0, &c, err), err, KVIO_E_FORMAT, "expected ':'");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[2,3,4]}}", 0, 0, &c, err), err, KVIO_E_FORMAT,
               "tensor 'layers.0.key'", "missing field 'data_offsets'");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"offsets\":[0,0]}}", 0, 0, &c, err), err, KVIO_E_FORMAT,
               "tensor 'layers.0.key'", "unknown field 'offsets'");
    EXPECT_ERR(st_read("{\"layers.0.key\":\"F16\"}", 0, 0, &c, err), err, KVIO_E_FORMAT, "tensor 'layers.0.key'",
               "expected an object");
    EXPECT_ERR(st_read("{\"__metadata__\":{\"k\":5}}", 0, 0, &c, err), err, KVIO_E_FORMAT, "values are strings");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":F16}}", 0, 0, &c, err), err, KVIO_E_FORMAT, "found 'F'");
    /* JSON whitespace anywhere, space padding at the end */
    ck_assert_int_eq(st_read("{ \"layers.0.key\" :\n{\"dtype\" : \"F16\" ,\t\"shape\":[ 2 , 3 , 4 ] ,"
                             "\"data_offsets\":[ 0 , 48 ] } , \"layers.0.value\":{\"data_offsets\":[48,96],"
                             "\"shape\":[2,3,4],\"dtype\":\"F16\"}}      ", 96, 0, &c, err),
                     KVIO_OK);
    kvio_cache_free(&c);
}
END_TEST

/* ---- .npy ---------------------------------------------------------------- */

START_TEST(npy_fortran_order_true)
{
    kvio_cache c;
    char err[ERRLEN];
    size_t n;
    uint8_t *b = npy_make("{'descr': '<f2', 'fortran_order': True, 'shape': (1, 2, 1, 1, 1), }\n", 4, &n);
    EXPECT_ERR(npy_read(b, n, &c, err), err, KVIO_E_UNSUPPORTED, "bad.npy", "fortran_order True");
    free(b);
}
END_TEST

START_TEST(npy_big_endian_descr)
{
    kvio_cache c;
    char err[ERRLEN];
    size_t n;
    uint8_t *b = npy_make("{'descr': '>f2', 'fortran_order': False, 'shape': (1, 2, 1, 1, 1), }\n", 4, &n);
    EXPECT_ERR(npy_read(b, n, &c, err), err, KVIO_E_UNSUPPORTED, "bad.npy", "big-endian dtype '>f2'");
    free(b);
    b = npy_make("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2, 1, 1, 1), }\n", 16, &n);
    EXPECT_ERR(npy_read(b, n, &c, err), err, KVIO_E_UNSUPPORTED, "unsupported dtype '<f8'");
    free(b);
    b = npy_make("{'descr': [('a', '<f2')], 'fortran_order': False, 'shape': (1,), }\n", 2, &n);
    EXPECT_ERR(npy_read(b, n, &c, err), err, KVIO_E_UNSUPPORTED, "structured dtypes");
    free(b);
}
END_TEST

START_TEST(npy_bad_magic_and_version)
{
    kvio_cache c;
    char err[ERRLEN];
    size_t n;
    uint8_t *b = npy_make("{'descr': '<f2', 'fortran_order': False, 'shape': (1, 2, 1, 1, 1), }\n", 4, &n);
    b[1] = 'n';
    EXPECT_ERR(npy_read(b, n, &c, err), err, KVIO_E_FORMAT, "bad.npy", "bad magic");
    b[1] = 'N';
    b[6] = 4;
    EXPECT_ERR(npy_read(b, n, &c, err), err, KVIO_E_UNSUPPORTED, "version 4.0");
    b[6] = 1;
    b[8] = 0xff; /* header length beyond the file */
    EXPECT_ERR(npy_read(b, n, &c, err), err, KVIO_E_FORMAT, "runs past the end");
    free(b);
    /* v2.0 and v3.0 headers (4-byte length) are read */
    static const char dict[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 1, 1, 1), }\n";
    for (int v = 2; v <= 3; v++) {
        size_t dl = strlen(dict);
        uint8_t buf[256] = {0x93, 'N', 'U', 'M', 'P', 'Y', (uint8_t)v, 0, (uint8_t)dl, 0, 0, 0};
        memcpy(buf + 12, dict, dl);
        ck_assert_int_eq(npy_read(buf, 12 + dl + 8, &c, err), KVIO_OK);
        ck_assert_int_eq(c.dtype, FKVF_DTYPE_F32);
        kvio_cache_free(&c);
    }
}
END_TEST

START_TEST(npy_data_size_checked)
{
    kvio_cache c;
    char err[ERRLEN];
    size_t n;
    uint8_t *b = npy_make("{'descr': '<f2', 'fortran_order': False, 'shape': (1, 2, 1, 1, 3), }\n", 14, &n);
    EXPECT_ERR(npy_read(b, n - 4, &c, err), err, KVIO_E_FORMAT, "truncated", "needs 12 bytes of data, 10 present");
    EXPECT_ERR(npy_read(b, n, &c, err), err, KVIO_E_FORMAT, "2 bytes after the array data");
    free(b);
    b = npy_make("{'descr': '<f2', 'fortran_order': False, 'shape': (4294967296, 2, 4294967296, 4294967296, 1), }\n",
                 0, &n);
    EXPECT_ERR(npy_read(b, n, &c, err), err, KVIO_E_FORMAT, "overflows");
    free(b);
}
END_TEST

START_TEST(npy_header_dict_checked)
{
    static const struct {
        const char *dict;
        int code;
        const char *msg;
        size_t data;
    } cases[] = {
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (1, 2, 1, 1, 1), 'x': 1}\n", KVIO_E_FORMAT, "unexpected key 'x'", 4},
        {"{'descr': '<f2', 'shape': (1, 2, 1, 1, 1), }\n", KVIO_E_FORMAT, "missing key 'fortran_order'", 4},
        {"{'descr': '<f2', 'descr': '<f2', 'fortran_order': False, 'shape': (1,)}\n", KVIO_E_FORMAT, "duplicate key", 4},
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (2)}\n", KVIO_E_FORMAT, "not a tuple", 4},
        {"{'descr': '<f2', 'fortran_order': false, 'shape': (2,)}\n", KVIO_E_FORMAT, "True or False", 4},
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (-2,)}\n", KVIO_E_FORMAT, "non-negative integers", 4},
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (2,)} x\n", KVIO_E_FORMAT, "after the dict", 4},
        {"['descr']\n", KVIO_E_FORMAT, "not a dict literal", 4},
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (1, 2, 1, 1, 1, 1, 1, 1, 1)}\n", KVIO_E_UNSUPPORTED, "more than 8", 4},
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (1, 3, 1, 1, 1)}\n", KVIO_E_CONVENTION, "must be 2", 6},
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (1, 2, 1, 1)}\n", KVIO_E_CONVENTION, "expected [layers, 2, kv_heads", 4},
        {"{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2, 1, 1, 1)}\n", KVIO_E_UNSUPPORTED, "f16, bf16 or f32", 8},
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (1, 2, 3, 1, 1, 1)}\n", KVIO_E_UNSUPPORTED, "batch dimension is 3", 12},
        /* no data, but a huge layer count: refused before allocating */
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (4294967295, 2, 1, 0, 1)}\n", KVIO_E_UNSUPPORTED, "at most 65536", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvio_cache c;
        char err[ERRLEN];
        size_t n;
        uint8_t *b = npy_make(cases[i].dict, cases[i].data, &n);
        int rc = npy_read(b, n, &c, err);
        if (rc != cases[i].code || !strstr(err, cases[i].msg) || !strstr(err, "bad.npy"))
            ck_abort_msg("case %zu: rc %d, message: %s", i, rc, err);
        free(b);
    }
}
END_TEST

/* ---- .npz ---------------------------------------------------------------- */

/* the members of a written cache, as separate .npy byte strings */
typedef struct npz_parts {
    uint8_t *npy[5];
    size_t size[5];
    member m[5];
} npz_parts;

static void npy_of(const void *data, size_t nbytes, const char *descr, const uint64_t *dims, size_t nd,
                   uint8_t **out, size_t *size)
{
    char dict[256];
    size_t k = (size_t)snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (size_t i = 0; i < nd; i++)
        k += (size_t)snprintf(dict + k, sizeof dict - k, "%llu,", (unsigned long long)dims[i]);
    snprintf(dict + k, sizeof dict - k, "), }\n");
    uint8_t *b = npy_make(dict, nbytes, size);
    if (nbytes)
        memcpy(b + *size - nbytes, data, nbytes);
    *out = b;
}

static void make_parts(const kvio_cache *c, npz_parts *p)
{
    static const char *const names[] = {"layers.0.key.npy", "layers.0.value.npy", "layers.1.key.npy",
                                        "layers.1.value.npy", "tokens.npy"};
    uint64_t dims[3] = {c->n_kv_heads, c->n_positions, c->key_dim};
    size_t lb = (size_t)kvio_key_bytes(c);
    for (int i = 0; i < 4; i++)
        npy_of(i % 2 ? c->values[i / 2] : c->keys[i / 2], lb, "<f2", dims, 3, &p->npy[i], &p->size[i]);
    uint8_t tok[64] = {0};
    npy_of(tok, 8 * (size_t)c->n_positions, "<i8", dims + 1, 1, &p->npy[4], &p->size[4]);
    for (int i = 0; i < 5; i++) {
        p->m[i].name = names[i];
        p->m[i].data = p->npy[i];
        p->m[i].size = p->size[i];
    }
}

static void free_parts(npz_parts *p)
{
    for (int i = 0; i < 5; i++)
        free(p->npy[i]);
}

static int npz_read(const uint8_t *z, size_t n, unsigned flags, kvio_cache *c, char *err)
{
    int rc = kvio_read_npz_mem(z, n, "bad.npz", flags, c, err, ERRLEN);
    if (rc)
        ck_assert(err[0] != 0);
    return rc;
}

START_TEST(npz_handmade_members_accepted)
{
    kvio_cache c = make_cache(2, 2, 3, 4, 4, FKVF_DTYPE_F16, 0, 11), d;
    npz_parts p;
    make_parts(&c, &p);
    char err[ERRLEN];
    for (int deflate = 0; deflate < 2; deflate++) {
        size_t n;
        uint8_t *z = zip_make(p.m, 5, deflate, &n);
        ck_assert_int_eq(npz_read(z, n, 0, &d, err), KVIO_OK);
        ck_assert_ptr_nonnull(d.tokens);
        d.tokens = (free(d.tokens), NULL);
        ck_assert(kvio_cache_equal(&c, &d));
        kvio_cache_free(&d);
        free(z);
    }
    free_parts(&p);
    kvio_cache_free(&c);
}
END_TEST

START_TEST(npz_member_missing)
{
    kvio_cache c = make_cache(2, 2, 3, 4, 4, FKVF_DTYPE_F16, 0, 12), d;
    npz_parts p;
    make_parts(&c, &p);
    char err[ERRLEN];
    size_t n;
    member m[4] = {p.m[0], p.m[1], p.m[2], p.m[4]}; /* no layers.1.value */
    uint8_t *z = zip_make(m, 4, 0, &n);
    EXPECT_ERR(npz_read(z, n, 0, &d, err), err, KVIO_E_CONVENTION, "bad.npz", "missing tensor 'layers.1.value'");
    free(z);
    z = zip_make(NULL, 0, 0, &n); /* an empty zip: libarchive finds no archive in it */
    EXPECT_ERR(npz_read(z, n, 0, &d, err), err, KVIO_E_FORMAT, "bad.npz");
    free(z);
    free_parts(&p);
    kvio_cache_free(&c);
}
END_TEST

START_TEST(npz_member_corrupt)
{
    kvio_cache c = make_cache(2, 2, 3, 4, 4, FKVF_DTYPE_F16, 0, 13), d;
    npz_parts p;
    make_parts(&c, &p);
    char err[ERRLEN];
    for (int deflate = 0; deflate < 2; deflate++) {
        size_t n;
        uint8_t *z = zip_make(p.m, 5, deflate, &n);
        /* flip one byte in the middle of the first member's data */
        size_t at = 30 + strlen(p.m[0].name) + p.size[0] / 2;
        z[at] ^= 0x55;
        int rc = npz_read(z, n, 0, &d, err);
        ck_assert_msg(rc == KVIO_E_FORMAT, "deflate %d: rc %d: %s", deflate, rc, err);
        ck_assert_msg(strstr(err, "bad.npz") && strstr(err, "layers.0.key"), "%s", err);
        free(z);
    }
    /* a member whose .npy header is bad, and one with extra bytes */
    member m[5];
    memcpy(m, p.m, sizeof m);
    uint8_t *bad = malloc(p.size[2] + 1);
    memcpy(bad, p.npy[2], p.size[2]);
    bad[0] = 'X';
    m[2].data = bad;
    size_t n;
    uint8_t *z = zip_make(m, 5, 1, &n);
    EXPECT_ERR(npz_read(z, n, 0, &d, err), err, KVIO_E_FORMAT, "tensor 'layers.1.key' (member 'layers.1.key.npy')",
               "bad magic");
    free(z);
    bad[0] = 0x93;
    bad[p.size[2]] = 0;
    m[2].size = p.size[2] + 1;
    z = zip_make(m, 5, 0, &n);
    EXPECT_ERR(npz_read(z, n, 0, &d, err), err, KVIO_E_FORMAT, "layers.1.key.npy", "does not match");
    free(z);
    m[2].size = p.size[2] - 1;
    z = zip_make(m, 5, 0, &n);
    EXPECT_ERR(npz_read(z, n, 0, &d, err), err, KVIO_E_FORMAT, "layers.1.key.npy", "does not match");
    free(z);
    m[2].size = 7;
    z = zip_make(m, 5, 0, &n);
    EXPECT_ERR(npz_read(z, n, 0, &d, err), err, KVIO_E_FORMAT, "layers.1.key.npy", "truncated .npy header");
    free(z);
    free(bad);
    /* not a zip at all */
    EXPECT_ERR(npz_read((const uint8_t *)"PK\x03\x04garbage", 11, 0, &d, err), err, KVIO_E_FORMAT, "bad.npz");
    free_parts(&p);
    kvio_cache_free(&c);
}
END_TEST

START_TEST(npz_extra_and_duplicate_members)
{
    kvio_cache c = make_cache(2, 2, 3, 4, 4, FKVF_DTYPE_F16, 0, 14), d;
    npz_parts p;
    make_parts(&c, &p);
    char err[ERRLEN];
    size_t n;
    member m[6];
    memcpy(m, p.m, 5 * sizeof *m);
    m[5].name = "README.txt";
    m[5].data = "hello";
    m[5].size = 5;
    uint8_t *z = zip_make(m, 6, 0, &n);
    EXPECT_ERR(npz_read(z, n, 0, &d, err), err, KVIO_E_CONVENTION, "member 'README.txt'", "not a .npy file");
    ck_assert_int_eq(npz_read(z, n, KVIO_READ_IGNORE_EXTRA, &d, err), KVIO_OK);
    kvio_cache_free(&d);
    free(z);
    m[5].name = "arr_0.npy";
    z = zip_make(m, 6, 0, &n);
    EXPECT_ERR(npz_read(z, n, 0, &d, err), err, KVIO_E_CONVENTION, "member 'arr_0.npy'", "naming convention");
    ck_assert_int_eq(npz_read(z, n, KVIO_READ_IGNORE_EXTRA, &d, err), KVIO_OK);
    kvio_cache_free(&d);
    free(z);
    m[5] = p.m[1];
    z = zip_make(m, 6, 0, &n);
    EXPECT_ERR(npz_read(z, n, 0, &d, err), err, KVIO_E_FORMAT, "tensor 'layers.0.value'", "duplicate name");
    free(z);
    /* a member of the wrong dtype / big-endian / fortran order */
    uint64_t dims[3] = {2, 3, 4};
    uint8_t zeros[96] = {0};
    uint8_t *q;
    size_t qs;
    npy_of(zeros, 96, "<f4", dims, 3, &q, &qs);
    memcpy(m, p.m, 5 * sizeof *m);
    m[3].data = q;
    m[3].size = qs;
    z = zip_make(m, 5, 1, &n);
    EXPECT_ERR(npz_read(z, n, 0, &d, err), err, KVIO_E_CONVENTION, "tensor 'layers.1.value'",
               "dtype <f4 differs from tensor 'layers.0.key' (<f2)");
    free(z);
    free(q);
    npy_of(zeros, 48, ">f2", dims, 3, &q, &qs);
    m[3].data = q;
    m[3].size = qs;
    z = zip_make(m, 5, 1, &n);
    EXPECT_ERR(npz_read(z, n, 0, &d, err), err, KVIO_E_UNSUPPORTED, "layers.1.value.npy", "big-endian");
    free(z);
    free(q);
    free_parts(&p);
    kvio_cache_free(&c);
}
END_TEST

/* ---- writers refuse what they cannot store ------------------------------- */

/* Arguments every reader refuses before it looks at any byte. */
START_TEST(readers_refuse_bad_arguments)
{
    kvio_cache c;
    char err[ERRLEN];
    static const uint8_t five[5] = {1, 2, 3, 4, 5};
    EXPECT_ERR(kvio_read_safetensors_mem(five, 5, "a.safetensors", 0, NULL, err, sizeof err), err, KVIO_E_ARG,
               "a.safetensors", "no output cache");
    EXPECT_ERR(kvio_read_npy_mem(five, 5, "a.npy", 0, NULL, err, sizeof err), err, KVIO_E_ARG, "a.npy",
               "no output cache");
    EXPECT_ERR(kvio_read_npz_mem(five, 5, "a.npz", 0, NULL, err, sizeof err), err, KVIO_E_ARG, "a.npz",
               "no output cache");
    EXPECT_ERR(kvio_read_safetensors_mem(NULL, 5, "a.safetensors", 0, &c, err, sizeof err), err, KVIO_E_ARG,
               "no data");
    ck_assert_uint_eq(c.n_layers, 0);
    EXPECT_ERR(kvio_read_npy_mem(NULL, 5, "a.npy", 0, &c, err, sizeof err), err, KVIO_E_ARG, "no data");
    ck_assert_uint_eq(c.n_layers, 0);
    EXPECT_ERR(kvio_read_npz_mem(NULL, 5, "a.npz", 0, &c, err, sizeof err), err, KVIO_E_FORMAT, "empty file");
    ck_assert_uint_eq(c.n_layers, 0);
    ck_assert_int_eq(kvio_format_sniff(NULL, 16), KVIO_FMT_AUTO);
    EXPECT_ERR(kvio_read(NULL, KVIO_FMT_AUTO, 0, &c, err, sizeof err), err, KVIO_E_ARG, "no path");
    EXPECT_ERR(kvio_read("a.npy", KVIO_FMT_AUTO, 0, NULL, err, sizeof err), err, KVIO_E_ARG, "no path");
    char dir[] = "/tmp/cacheio-dir-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    EXPECT_ERR(kvio_read(dir, KVIO_FMT_AUTO, 0, &c, err, sizeof err), err, KVIO_E_IO, dir, "not a regular file");
    ck_assert_uint_eq(c.n_layers, 0);
    rmdir(dir);
}
END_TEST

/* A key/value dimension of 2^32-1 or more is refused, even in a tensor of
 * no bytes (another dimension 0). */
START_TEST(st_dimension_too_large)
{
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[4294967296,1,0],\"data_offsets\":[0,0]},"
                       "\"layers.0.value\":{\"dtype\":\"F16\",\"shape\":[1,1,1],\"data_offsets\":[0,2]}}",
                       2, 0, &c, err),
               err, KVIO_E_UNSUPPORTED, "tensor 'layers.0.key'", "[4294967296, 1, 0]", "dimension too large");
    EXPECT_ERR(st_read("{\"layers.0.key\":{\"dtype\":\"F16\",\"shape\":[1,1,1],\"data_offsets\":[0,2]},"
                       "\"layers.0.value\":{\"dtype\":\"F16\",\"shape\":[1,4294967295,0],\"data_offsets\":[2,2]}}",
                       2, 0, &c, err),
               err, KVIO_E_UNSUPPORTED, "tensor 'layers.0.value'", "dimension too large");
}
END_TEST

/* More than KVIO_MAX_LAYERS layers (here of no positions, so no data). */
START_TEST(st_too_many_layers)
{
    size_t L = (size_t)KVIO_MAX_LAYERS + 1, cap = L * 2 * 96 + 16, k = 0;
    char *json = malloc(cap);
    ck_assert_ptr_nonnull(json);
    json[k++] = '{';
    for (size_t l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++)
            k += (size_t)snprintf(json + k, cap - k,
                                  "%s\"layers.%zu.%s\":{\"dtype\":\"F16\",\"shape\":[1,0,1],\"data_offsets\":[0,0]}",
                                  k > 1 ? "," : "", l, kv ? "value" : "key");
    ck_assert_uint_lt(k + 2, cap);
    json[k++] = '}';
    json[k] = 0;
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(st_read(json, 0, 0, &c, err), err, KVIO_E_UNSUPPORTED, "65537 layers (at most 65536 are accepted)");
    /* one layer fewer is accepted */
    char *cut = strstr(json, ",\"layers.65536.key\"");
    ck_assert_ptr_nonnull(cut);
    memcpy(cut, "}", 2);
    ck_assert_int_eq(st_read(json, 0, 0, &c, err), KVIO_OK);
    ck_assert_uint_eq(c.n_layers, KVIO_MAX_LAYERS);
    ck_assert_uint_eq(c.n_positions, 0);
    kvio_cache_free(&c);
    free(json);
}
END_TEST

/* An .npz member whose .npy header describes more bytes than 64 bits count
 * (header + data), and one that ends inside its .npy header. */
START_TEST(npz_member_size_and_header_cut)
{
    kvio_cache c;
    char err[ERRLEN];
    size_t ns, n;
    uint8_t *npy = npy_make("{'descr': '<i8', 'fortran_order': False, 'shape': (2305843009213693951,), }", 0, &ns);
    member m[1] = {{"layers.0.key.npy", npy, ns}};
    uint8_t *z = zip_make(m, 1, 0, &n);
    EXPECT_ERR(npz_read(z, n, 0, &c, err), err, KVIO_E_FORMAT, "tensor 'layers.0.key' (member 'layers.0.key.npy')",
               "size overflows");
    free(z);
    m[0].size = 15; /* the 10-byte prefix and 5 bytes of its header */
    z = zip_make(m, 1, 1, &n);
    char want[64];
    snprintf(want, sizeof want, "truncated .npy header (15 of %zu bytes)", ns);
    EXPECT_ERR(npz_read(z, n, 0, &c, err), err, KVIO_E_FORMAT, "layers.0.key.npy", want);
    free(z);
    free(npy);
}
END_TEST

START_TEST(writers_refuse_invalid_caches)
{
    char err[ERRLEN];
    uint8_t *b;
    size_t n;
    kvio_cache c = make_cache(1, 1, 2, 2, 3, FKVF_DTYPE_F16, 0, 15);
    EXPECT_ERR(kvio_write_mem(&c, KVIO_FMT_NPY, 0, &b, &n, err, sizeof err), err, KVIO_E_ARG, "value_dim");
    kvio_cache_free(&c);
    c = make_cache(1, 1, 2, 2, 2, FKVF_DTYPE_F16, 1, 15);
    EXPECT_ERR(kvio_write_mem(&c, KVIO_FMT_NPY, 0, &b, &n, err, sizeof err), err, KVIO_E_ARG, "token ids");
    c.tokens[1] = -3;
    EXPECT_ERR(kvio_write_mem(&c, KVIO_FMT_SAFETENSORS, 0, &b, &n, err, sizeof err), err, KVIO_E_ARG,
               "token id -3 at position 1");
    c.tokens[1] = (int64_t)1 << 40;
    c.token_width = 4;
    EXPECT_ERR(kvio_write_mem(&c, KVIO_FMT_NPZ, 0, &b, &n, err, sizeof err), err, KVIO_E_ARG, "does not fit int32");
    c.token_width = 8;
    ck_assert_int_eq(kvio_write_mem(&c, KVIO_FMT_NPZ, 0, &b, &n, err, sizeof err), KVIO_OK);
    free(b);
    c.dtype = (fkvf_dtype)9;
    EXPECT_ERR(kvio_write_mem(&c, KVIO_FMT_SAFETENSORS, 0, &b, &n, err, sizeof err), err, KVIO_E_ARG, "dtype");
    c.dtype = FKVF_DTYPE_F16;
    EXPECT_ERR(kvio_write_mem(&c, KVIO_FMT_AUTO, 0, &b, &n, err, sizeof err), err, KVIO_E_ARG, "format");
    kvio_cache_free(&c);
    kvio_cache z;
    memset(&z, 0, sizeof z);
    z.dtype = FKVF_DTYPE_F16;
    EXPECT_ERR(kvio_write_mem(&z, KVIO_FMT_SAFETENSORS, 0, &b, &n, err, sizeof err), err, KVIO_E_ARG, "must be >= 1");
    /* small error buffers are always terminated */
    char tiny[8];
    memset(tiny, 'x', sizeof tiny);
    ck_assert_int_eq(kvio_write_mem(&z, KVIO_FMT_SAFETENSORS, 0, &b, &n, tiny, sizeof tiny), KVIO_E_ARG);
    ck_assert_uint_eq(strlen(tiny), 7);
}
END_TEST

START_TEST(format_detection)
{
    ck_assert_int_eq(kvio_format_from_path("a/b.safetensors"), KVIO_FMT_SAFETENSORS);
    ck_assert_int_eq(kvio_format_from_path("x.NPY"), KVIO_FMT_NPY);
    ck_assert_int_eq(kvio_format_from_path("x.npz"), KVIO_FMT_NPZ);
    ck_assert_int_eq(kvio_format_from_path("npz"), KVIO_FMT_AUTO);
    ck_assert_int_eq(kvio_format_from_path(NULL), KVIO_FMT_AUTO);
    ck_assert_int_eq(kvio_format_sniff("\x93NUMPY\x01\x00", 8), KVIO_FMT_NPY);
    ck_assert_int_eq(kvio_format_sniff("PK\x05\x06", 4), KVIO_FMT_NPZ);
    ck_assert_int_eq(kvio_format_sniff("\x02\0\0\0\0\0\0\0{}", 10), KVIO_FMT_SAFETENSORS);
    ck_assert_int_eq(kvio_format_sniff("\x03\0\0\0\0\0\0\0{}", 10), KVIO_FMT_AUTO);
    kvio_cache c;
    char err[ERRLEN];
    EXPECT_ERR(kvio_read_mem("hello", 5, "x.bin", KVIO_FMT_AUTO, 0, &c, err, sizeof err), err, KVIO_E_FORMAT,
               "x.bin", "not a .safetensors, .npy or .npz file");
    ck_assert_str_eq(kvio_dtype_name(FKVF_DTYPE_BF16), "bf16");
    ck_assert_uint_eq(kvio_dtype_size(FKVF_DTYPE_F32), 4);
    ck_assert_uint_eq(kvio_dtype_size((fkvf_dtype)0), 0);
    for (int i = 0; i <= 7; i++)
        ck_assert_ptr_nonnull(kvio_strerror(i));
}
END_TEST

/* ---- layouts, name schemes, companions (issue 12) ------------------------ */

/* A safetensors file from n tensors: name, dtype, shape text ("2,3,4") and
 * bytes each, laid out in order (independent of the writer under test). */
typedef struct st_part {
    const char *name, *dtype, *shape;
    const uint8_t *data;
    size_t len;
} st_part;

static uint8_t *st_from(const st_part *p, size_t n, const char *meta, size_t *size)
{
    char json[8192];
    size_t k = (size_t)snprintf(json, sizeof json, "{%s%s", meta ? meta : "", meta && n ? "," : "");
    size_t off = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        k += (size_t)snprintf(json + k, sizeof json - k, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                              i ? "," : "", p[i].name, p[i].dtype, p[i].shape, off, off + p[i].len);
        off += p[i].len;
    }
    ck_assert_uint_lt(k + 2, sizeof json);
    json[k++] = '}';
    json[k] = 0;
    total = off;
    uint8_t *b = st_make(json, total, size);
    size_t at = *size - total;
    for (size_t i = 0; i < n; i++) {
        if (p[i].len)
            memcpy(b + at, p[i].data, p[i].len);
        at += p[i].len;
    }
    return b;
}

/* One layer tensor [H][T][row] (row bytes rb) written positions-first
 * [T][H][row], by hand. */
static uint8_t *to_nhd(const uint8_t *hnd, uint32_t H, uint32_t T, size_t rb)
{
    uint8_t *o = malloc((size_t)H * T * rb + 1);
    ck_assert_ptr_nonnull(o);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < H; h++)
            memcpy(o + ((size_t)t * H + h) * rb, hnd + ((size_t)h * T + t) * rb, rb);
    return o;
}

START_TEST(nhd_safetensors_read_transposed)
{
    /* 2 layers, H=3 heads, T=5 positions, Dk 4, Dv 2: [T, H, D] and [1, T, H, D] */
    kvio_cache c = make_cache(2, 3, 5, 4, 2, FKVF_DTYPE_F16, 1, 50), d;
    uint8_t *nk[2], *nv[2], tok[40];
    for (int l = 0; l < 2; l++) {
        nk[l] = to_nhd(c.keys[l], 3, 5, 8);
        nv[l] = to_nhd(c.values[l], 3, 5, 4);
    }
    for (int t = 0; t < 5; t++)
        for (int i = 0; i < 8; i++)
            tok[8 * t + i] = (uint8_t)((uint64_t)c.tokens[t] >> (8 * i));
    st_part p[5] = {{"layers.0.key", "F16", "5,3,4", nk[0], 120},
                    {"layers.0.value", "F16", "1,5,3,2", nv[0], 60},
                    {"layers.1.key", "F16", "1,5,3,4", nk[1], 120},
                    {"layers.1.value", "F16", "5,3,2", nv[1], 60},
                    {"tokens", "I64", "5", tok, 40}};
    size_t n;
    uint8_t *b = st_from(p, 5, NULL, &n);
    char err[ERRLEN];
    int rc = kvio_read_safetensors_mem(b, n, "nhd.safetensors", KVIO_READ_NHD, &d, err, sizeof err);
    if (rc)
        ck_abort_msg("%s", err);
    ck_assert(kvio_cache_equal(&c, &d));
    kvio_cache_free(&d);
    /* read heads-first, the token count gives the transposition away */
    EXPECT_ERR(kvio_read_safetensors_mem(b, n, "nhd.safetensors", 0, &d, err, sizeof err), err,
               KVIO_E_CONVENTION, "tensor 'tokens'", "5 token ids for 3 positions", "positions-first",
               "--layout nhd");
    free(b);
    /* without tokens it reads (wrongly) as 5 heads x 3 positions: what the CLI warns about */
    b = st_from(p, 4, NULL, &n);
    ck_assert_int_eq(kvio_read_safetensors_mem(b, n, "nhd.safetensors", 0, &d, err, sizeof err), KVIO_OK);
    ck_assert_uint_eq(d.n_kv_heads, 5);
    ck_assert_uint_eq(d.n_positions, 3);
    kvio_cache_free(&d);
    /* the expected-shape message names the positions-first axes */
    p[0].shape = "5,3,4,1,1";
    free(b);
    b = st_from(p, 4, NULL, &n);
    EXPECT_ERR(kvio_read_safetensors_mem(b, n, "nhd.safetensors", KVIO_READ_NHD, &d, err, sizeof err), err,
               KVIO_E_CONVENTION, "tensor 'layers.0.key'", "[positions, kv_heads, dim]");
    free(b);
    for (int l = 0; l < 2; l++) {
        free(nk[l]);
        free(nv[l]);
    }
    kvio_cache_free(&c);
}
END_TEST

START_TEST(nhd_npy_npz_read_transposed)
{
    kvio_cache c = make_cache(2, 3, 5, 4, 4, FKVF_DTYPE_BF16, 0, 51), d;
    char err[ERRLEN];
    /* .npy [L, 2, T, H, D] and [L, 2, 1, T, H, D] */
    size_t lb = (size_t)kvio_key_bytes(&c);
    uint8_t *arr = malloc(4 * lb);
    ck_assert_ptr_nonnull(arr);
    for (int l = 0; l < 2; l++)
        for (int kv = 0; kv < 2; kv++) {
            uint8_t *t = to_nhd(kv ? c.values[l] : c.keys[l], 3, 5, 8);
            memcpy(arr + (2 * (size_t)l + (size_t)kv) * lb, t, lb);
            free(t);
        }
    static const uint64_t d5[5] = {2, 2, 5, 3, 4}, d6[6] = {2, 2, 1, 5, 3, 4};
    for (int six = 0; six < 2; six++) {
        uint8_t *q;
        size_t qs;
        npy_of(arr, 4 * lb, "<u2", six ? d6 : d5, six ? 6 : 5, &q, &qs);
        ck_assert_int_eq(kvio_read_npy_mem(q, qs, "nhd.npy", KVIO_READ_NHD, &d, err, sizeof err), KVIO_OK);
        ck_assert(kvio_cache_equal(&c, &d));
        ck_assert_int_eq(d.names, KVIO_NAMES_NONE);
        kvio_cache_free(&d);
        ck_assert_int_eq(kvio_read_npy_mem(q, qs, "nhd.npy", 0, &d, err, sizeof err), KVIO_OK);
        ck_assert_uint_eq(d.n_kv_heads, 5);
        kvio_cache_free(&d);
        free(q);
    }
    /* .npz members [T, H, D] */
    npz_parts p;
    kvio_cache c16 = make_cache(2, 2, 3, 4, 4, FKVF_DTYPE_F16, 0, 52);
    make_parts(&c16, &p);
    uint64_t dims[3] = {3, 2, 4};
    for (int i = 0; i < 4; i++) {
        uint8_t *t = to_nhd(i % 2 ? c16.values[i / 2] : c16.keys[i / 2], 2, 3, 8);
        free(p.npy[i]);
        npy_of(t, 48, "<f2", dims, 3, &p.npy[i], &p.size[i]);
        p.m[i].data = p.npy[i];
        p.m[i].size = p.size[i];
        free(t);
    }
    size_t n;
    uint8_t *z = zip_make(p.m, 5, 1, &n);
    ck_assert_int_eq(npz_read(z, n, KVIO_READ_NHD, &d, err), KVIO_OK);
    d.tokens = (free(d.tokens), NULL);
    ck_assert(kvio_cache_equal(&c16, &d));
    kvio_cache_free(&d);
    free(z);
    free_parts(&p);
    free(arr);
    kvio_cache_free(&c16);
    kvio_cache_free(&c);
}
END_TEST

START_TEST(nhd_writers_round_trip)
{
    kvio_cache c = make_cache(2, 3, 5, 4, 4, FKVF_DTYPE_F32, 0, 53), d;
    char err[ERRLEN];
    static const kvio_format F[] = {KVIO_FMT_SAFETENSORS, KVIO_FMT_NPY, KVIO_FMT_NPZ};
    for (int f = 0; f < 3; f++)
        for (int hf = 0; hf < 2; hf++) {
            unsigned wf = KVIO_WRITE_NHD | (hf ? KVIO_WRITE_HF : 0);
            size_t n;
            uint8_t *b = write_mem(&c, F[f], wf, &n);
            ck_assert_int_eq(kvio_read_mem(b, n, "w", F[f], KVIO_READ_NHD, &d, err, sizeof err), KVIO_OK);
            ck_assert(kvio_cache_equal(&c, &d));
            kvio_cache_free(&d);
            /* heads-first, the axes are swapped */
            ck_assert_int_eq(kvio_read_mem(b, n, "w", F[f], 0, &d, err, sizeof err), KVIO_OK);
            ck_assert_uint_eq(d.n_kv_heads, 5);
            ck_assert_uint_eq(d.n_positions, 3);
            kvio_cache_free(&d);
            free(b);
        }
    /* the bytes: shape [T, H, D], data position-major */
    size_t n;
    uint8_t *b = write_mem(&c, KVIO_FMT_SAFETENSORS, KVIO_WRITE_NHD, &n);
    ck_assert_ptr_nonnull(strstr((const char *)b + 8, "\"layers.1.value\":{\"dtype\":\"F32\",\"shape\":[5,3,4]"));
    size_t hl = (size_t)b[0] | ((size_t)b[1] << 8);
    uint8_t *want = to_nhd(c.keys[0], 3, 5, 16);
    ck_assert(memcmp(b + 8 + hl, want, 240) == 0);
    free(want);
    free(b);
    kvio_cache_free(&c);
}
END_TEST

START_TEST(names_scheme_reported)
{
    static const char *const k[] = {"layers.0.key", "past_key_values.0.key", "past_key_values.0.0", "key_cache.0"};
    static const char *const v[] = {"layers.0.value", "past_key_values.0.value", "past_key_values.0.1",
                                    "value_cache.0"};
    static const char *const name[] = {"fkvf", "hf", "hf-legacy", "hf-dynamic"};
    uint8_t z[48] = {0};
    for (int i = 0; i < 4; i++) {
        st_part p[2] = {{k[i], "F16", "2,3,4", z, 48}, {v[i], "F16", "2,3,4", z, 48}};
        size_t n;
        uint8_t *b = st_from(p, 2, NULL, &n);
        kvio_cache c;
        char err[ERRLEN];
        ck_assert_int_eq(kvio_read_safetensors_mem(b, n, "s", 0, &c, err, sizeof err), KVIO_OK);
        ck_assert_int_eq(c.names, KVIO_NAMES_FKVF + i);
        ck_assert_str_eq(kvio_names_name(c.names), name[i]);
        ck_assert_int_eq(kvio_names_is_hf(c.names), i > 0);
        kvio_cache_free(&c);
        free(b);
    }
    ck_assert_str_eq(kvio_names_name(KVIO_NAMES_NONE), "none");
    ck_assert_int_eq(kvio_names_is_hf(KVIO_NAMES_NONE), 0);
}
END_TEST

START_TEST(companions_ignored_and_reported)
{
    uint8_t z[96] = {0};
    kvio_cache c;
    char err[ERRLEN];
    size_t n;
    /* attention_mask and position_ids next to a HF cache: skipped without any flag */
    st_part p[5] = {{"past_key_values.0.key", "BF16", "1,2,3,4", z, 48},
                    {"past_key_values.0.value", "BF16", "1,2,3,4", z, 48},
                    {"attention_mask", "I64", "1,3", z, 24},
                    {"position_ids", "I64", "1,3", z, 24},
                    {"model.embed", "F32", "2", z, 8}};
    uint8_t *b = st_from(p, 4, NULL, &n);
    ck_assert_int_eq(kvio_read_safetensors_mem(b, n, "hf.safetensors", 0, &c, err, sizeof err), KVIO_OK);
    ck_assert_uint_eq(c.n_ignored, 2);
    ck_assert_str_eq(c.ignored[0], "attention_mask");
    ck_assert_str_eq(c.ignored[1], "position_ids");
    ck_assert_ptr_null(c.ignored[2]);
    ck_assert_int_eq(kvio_is_companion("cache_position"), 1);
    ck_assert_int_eq(kvio_is_companion("model.embed"), 0);
    kvio_cache_free(&c);
    free(b);
    /* any other name: an error that lists the accepted schemes, or skipped
     * with KVIO_READ_IGNORE_EXTRA and reported */
    b = st_from(p, 5, NULL, &n);
    EXPECT_ERR(kvio_read_safetensors_mem(b, n, "hf.safetensors", 0, &c, err, sizeof err), err, KVIO_E_CONVENTION,
               "tensor 'model.embed'", "not part of the cache naming convention", "layers.{i}.key/.value",
               "past_key_values.{i}.key/.value", "past_key_values.{i}.0/.1", "key_cache.{i}/value_cache.{i}",
               "input_ids");
    ck_assert_int_eq(kvio_read_safetensors_mem(b, n, "hf.safetensors", KVIO_READ_IGNORE_EXTRA, &c, err, sizeof err),
                     KVIO_OK);
    ck_assert_uint_eq(c.n_ignored, 3);
    ck_assert_str_eq(c.ignored[2], "model.embed");
    kvio_cache_free(&c);
    free(b);
    /* more than KVIO_MAX_IGNORED: all counted, the first 8 kept */
    st_part q[12];
    char names[10][24]; /* room for any int: -O1 -Wformat-truncation */
    q[0] = p[0];
    q[1] = p[1];
    for (int i = 0; i < 10; i++) {
        snprintf(names[i], sizeof names[i], "extra_%d", i);
        q[2 + i] = (st_part){names[i], "I64", "1", z, 8};
    }
    b = st_from(q, 12, NULL, &n);
    ck_assert_int_eq(kvio_read_safetensors_mem(b, n, "x.safetensors", KVIO_READ_IGNORE_EXTRA, &c, err, sizeof err),
                     KVIO_OK);
    ck_assert_uint_eq(c.n_ignored, 10);
    ck_assert_str_eq(c.ignored[7], "extra_7");
    kvio_cache_free(&c);
    free(b);
    /* .npz: a companion member is skipped without the flag, and reported */
    kvio_cache c16 = make_cache(2, 2, 3, 4, 4, FKVF_DTYPE_F16, 0, 54), d;
    npz_parts pp;
    make_parts(&c16, &pp);
    member m[6];
    memcpy(m, pp.m, 5 * sizeof *m);
    m[5] = pp.m[4];
    m[5].name = "attention_mask.npy";
    uint8_t *zz = zip_make(m, 6, 0, &n);
    ck_assert_int_eq(npz_read(zz, n, 0, &d, err), KVIO_OK);
    ck_assert_uint_eq(d.n_ignored, 1);
    ck_assert_str_eq(d.ignored[0], "attention_mask");
    ck_assert_int_eq(d.names, KVIO_NAMES_FKVF);
    kvio_cache_free(&d);
    free(zz);
    free_parts(&pp);
    kvio_cache_free(&c16);
}
END_TEST

START_TEST(no_kv_tensors_lists_schemes_and_names)
{
    uint8_t z[48] = {0};
    kvio_cache c;
    char err[ERRLEN];
    size_t n;
    st_part p[5] = {{"k0", "F16", "2,3,4", z, 48}, {"v0", "F16", "2,3,4", z, 48}, {"mask", "I64", "3", z, 24},
                    {"x1", "I64", "1", z, 8}, {"x2", "I64", "1", z, 8}};
    uint8_t *b = st_from(p, 5, NULL, &n);
    EXPECT_ERR(kvio_read_safetensors_mem(b, n, "odd.safetensors", KVIO_READ_IGNORE_EXTRA, &c, err, sizeof err), err,
               KVIO_E_CONVENTION, "odd.safetensors", "no key/value tensors", "past_key_values.{i}.key/.value",
               "key_cache.{i}/value_cache.{i}", "the file holds 'k0', 'v0', 'mask', 'x1' and 1 more");
    free(b);
    /* .npz: the members skipped before say what the file holds */
    kvio_cache c16 = make_cache(2, 2, 3, 4, 4, FKVF_DTYPE_F16, 0, 55);
    npz_parts pp;
    make_parts(&c16, &pp);
    member m[2] = {pp.m[0], pp.m[1]};
    m[0].name = "k0.npy";
    m[1].name = "v0.npy";
    uint8_t *zz = zip_make(m, 2, 0, &n);
    EXPECT_ERR(npz_read(zz, n, KVIO_READ_IGNORE_EXTRA, &c, err), err, KVIO_E_CONVENTION, "no key/value tensors",
               "layers.{i}.key/.value", "the file holds 'k0', 'v0'");
    free(zz);
    free_parts(&pp);
    kvio_cache_free(&c16);
}
END_TEST

START_TEST(hf_writer_writes_input_ids)
{
    kvio_cache c = make_cache(1, 2, 2, 1, 1, FKVF_DTYPE_F16, 1, 56);
    size_t n;
    uint8_t *b = write_mem(&c, KVIO_FMT_SAFETENSORS, KVIO_WRITE_HF, &n);
    ck_assert_ptr_nonnull(strstr((const char *)b + 8, "\"input_ids\":{\"dtype\":\"I64\",\"shape\":[1,2]"));
    ck_assert_ptr_null(strstr((const char *)b + 8, "\"tokens\""));
    free(b);
    b = write_mem(&c, KVIO_FMT_NPZ, KVIO_WRITE_HF, &n);
    struct archive *a = archive_read_new();
    archive_read_support_format_zip(a);
    ck_assert_int_eq(archive_read_open_memory(a, b, n), ARCHIVE_OK);
    static const char *const want[] = {"past_key_values.0.key.npy", "past_key_values.0.value.npy", "input_ids.npy"};
    struct archive_entry *e;
    int k = 0;
    while (archive_read_next_header(a, &e) == ARCHIVE_OK && k < 3)
        ck_assert_str_eq(archive_entry_pathname(e), want[k++]);
    ck_assert_int_eq(k, 3);
    archive_read_free(a);
    free(b);
    kvio_cache_free(&c);
}
END_TEST

/* ---- streaming writes (kvio_stream) ------------------------------------ */

/* The rows of positions [first, first + n) of c in the order of spec 14.2
 * (per position, per layer the keys of heads 0..H-1, then their values),
 * each position's row followed by pad bytes of 0xEE that must never reach
 * the file. Returns the buffer; *pos_stride its bytes per position. */
static uint8_t *rows_of(const kvio_cache *c, uint32_t first, uint32_t n, size_t pad, size_t *pos_stride)
{
    size_t es = kvio_dtype_size(c->dtype);
    size_t kb = (size_t)c->key_dim * es, vb = (size_t)c->value_dim * es;
    size_t rb = (size_t)c->n_layers * c->n_kv_heads * (kb + vb) + pad;
    uint8_t *rows = malloc(rb * (n ? n : 1));
    ck_assert_ptr_nonnull(rows);
    memset(rows, 0xEE, rb * (n ? n : 1));
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *d = rows + (size_t)i * rb;
        for (uint32_t l = 0; l < c->n_layers; l++) {
            for (uint32_t h = 0; h < c->n_kv_heads; h++, d += kb)
                memcpy(d, c->keys[l] + ((size_t)h * c->n_positions + first + i) * kb, kb);
            for (uint32_t h = 0; h < c->n_kv_heads; h++, d += vb)
                memcpy(d, c->values[l] + ((size_t)h * c->n_positions + first + i) * vb, vb);
        }
    }
    *pos_stride = rb;
    return rows;
}

/* c written to path through a kvio_stream, in chunks of `chunk` positions
 * (backwards when reverse; the token ids of a chunk before its keys and
 * values when reverse). Returns kvio_stream_finish's code. */
static int stream_write(const char *path, kvio_format f, unsigned flags, const kvio_cache *c,
                        uint32_t chunk, int reverse, char *err)
{
    kvio_stream *w;
    int rc = kvio_stream_open(&w, path, f, flags, c, c->tokens != NULL, err, ERRLEN);
    if (rc)
        return rc;
    size_t es = kvio_dtype_size(c->dtype);
    size_t kb = (size_t)c->key_dim * es, vb = (size_t)c->value_dim * es;
    size_t lb = (size_t)c->n_kv_heads * (kb + vb);
    uint32_t T = c->n_positions, nchunks = T ? (T + chunk - 1) / chunk : 0;
    for (uint32_t k = 0; k < nchunks; k++) {
        uint32_t first = (reverse ? nchunks - 1 - k : k) * chunk;
        uint32_t n = T - first < chunk ? T - first : chunk;
        size_t ps;
        uint8_t *rows = rows_of(c, first, n, 3 * (k % 2), &ps);
        if (c->tokens && reverse)
            ck_assert_int_eq(kvio_stream_tokens(w, first, n, c->tokens + first, err, ERRLEN), KVIO_OK);
        for (uint32_t l = 0; l < c->n_layers; l++) {
            const uint8_t *keys = rows + l * lb, *values = keys + (size_t)c->n_kv_heads * kb;
            ck_assert_int_eq(kvio_stream_kv(w, l, 1, first, n, values, ps, vb, err, ERRLEN), KVIO_OK);
            ck_assert_int_eq(kvio_stream_kv(w, l, 0, first, n, keys, ps, kb, err, ERRLEN), KVIO_OK);
        }
        if (c->tokens && !reverse)
            ck_assert_int_eq(kvio_stream_tokens(w, first, n, c->tokens + first, err, ERRLEN), KVIO_OK);
        free(rows);
    }
    return kvio_stream_finish(w, err, ERRLEN);
}

/* The file a stream writes is byte for byte kvio_write's (the reference:
 * the whole-cache writers), and reads back as the cache, for every format,
 * dtype, flag set, token width, chunking and order, odd dimensions, GQA-like
 * head counts, one and zero positions, with metadata. */
START_TEST(stream_bytes_equal_kvio_write)
{
    /* thousands of files, each fsynced: in memory where there is a tmpfs */
    char dir[] = "/dev/shm/test_cacheio.XXXXXX";
    if (!mkdtemp(dir)) {
        memcpy(dir, "/tmp/test_cacheio.XXXXXX", sizeof "/tmp/test_cacheio.XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(dir));
    }
    static const uint32_t shapes[][5] = {{3, 2, 9, 4, 6}, {2, 3, 7, 5, 5}, {1, 1, 1, 1, 1},
                                         {2, 2, 0, 4, 4}, {4, 1, 33, 3, 3}, {1, 8, 16, 16, 16}};
    static const unsigned flagsets[] = {0, KVIO_WRITE_HF, KVIO_WRITE_NHD, KVIO_WRITE_HF | KVIO_WRITE_NHD,
                                        KVIO_WRITE_DEFLATE, KVIO_WRITE_DEFLATE | KVIO_WRITE_NHD};
    static const uint32_t chunks[] = {1, 2, 5, 1000}; /* odd ones backwards */
    char ref[300], got[300], err[ERRLEN];
    int cases = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++)
        for (int d = 0; d < 3; d++)
            for (int tok = 0; tok < 3; tok++) { /* none, int64, int32 */
                const uint32_t *z = shapes[sh];
                kvio_cache c = make_cache(z[0], z[1], z[2], z[3], z[4], DTYPES[d], tok > 0,
                                          100 * sh + 10 * (uint64_t)d + (uint64_t)tok);
                if (tok == 2)
                    c.token_width = 4;
                if (sh % 2)
                    ck_assert_int_eq(kvio_cache_set_meta(&c, "model", "m \"q\" \xc3\xa9"), KVIO_OK);
                for (int f = KVIO_FMT_SAFETENSORS; f <= KVIO_FMT_NPZ; f++) {
                    if (f == KVIO_FMT_NPY && (tok || z[3] != z[4]))
                        continue;
                    for (size_t fl = 0; fl < sizeof flagsets / sizeof *flagsets; fl++) {
                        unsigned flags = flagsets[fl];
                        if ((flags & KVIO_WRITE_DEFLATE) && f != KVIO_FMT_NPZ)
                            continue;
                        const char *ext = f == KVIO_FMT_SAFETENSORS ? "safetensors" : f == KVIO_FMT_NPY ? "npy" : "npz";
                        snprintf(ref, sizeof ref, "%s/ref.%s", dir, ext);
                        snprintf(got, sizeof got, "%s/got.%s", dir, ext);
                        ck_assert_int_eq(kvio_write(ref, KVIO_FMT_AUTO, flags, &c, err, sizeof err), KVIO_OK);
                        size_t nr, ng;
                        uint8_t *rb = tu_slurp(ref, &nr);
                        for (size_t ch = 0; ch < sizeof chunks / sizeof *chunks; ch++) {
                                int rev = (int)(ch % 2);
                                int rc = stream_write(got, KVIO_FMT_AUTO, flags, &c, chunks[ch], rev, err);
                                if (rc)
                                    ck_abort_msg("stream %s: %s", got, err);
                                uint8_t *gb = tu_slurp(got, &ng);
                                if (ng != nr || memcmp(gb, rb, nr))
                                    ck_abort_msg("shape %zu dtype %d tok %d %s flags %#x chunk %u rev %d: "
                                                 "%zu bytes differ from kvio_write's %zu",
                                                 sh, d, tok, ext, flags, chunks[ch], rev, ng, nr);
                                kvio_cache back;
                                unsigned rf = (flags & KVIO_WRITE_NHD) ? KVIO_READ_NHD : 0;
                                ck_assert_int_eq(kvio_read(got, KVIO_FMT_AUTO, rf, &back, err, sizeof err), KVIO_OK);
                                ck_assert(kvio_cache_equal(&c, &back));
                                kvio_cache_free(&back);
                                free(gb);
                                remove(got);
                                cases++;
                            }
                        free(rb);
                        remove(ref);
                    }
                }
                kvio_cache_free(&c);
            }
    ck_assert_int_gt(cases, 600);
    ck_assert_int_eq(rmdir(dir), 0); /* nothing else left behind */
}
END_TEST

/* Wrong use and failures: refused with the file and what is wrong named,
 * and no file (neither the output nor a temporary one) left behind. */
START_TEST(stream_errors_leave_no_file)
{
    char dir[] = "/tmp/test_cacheio.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    kvio_cache c = make_cache(2, 2, 6, 4, 4, FKVF_DTYPE_F16, 1, 5);
    char path[300], err[ERRLEN];
    snprintf(path, sizeof path, "%s/s.safetensors", dir);
    kvio_stream *w;
    size_t ps;
    uint8_t *rows = rows_of(&c, 0, 6, 0, &ps);
    for (int fmt = KVIO_FMT_SAFETENSORS; fmt <= KVIO_FMT_NPZ; fmt += 2) {
        /* incomplete: one layer's values missing, then the token ids */
        for (int miss = 0; miss < 2; miss++) {
            ck_assert_int_eq(kvio_stream_open(&w, path, (kvio_format)fmt, 0, &c, 1, err, sizeof err), KVIO_OK);
            for (uint32_t l = 0; l < 2; l++) {
                ck_assert_int_eq(kvio_stream_kv(w, l, 0, 0, 6, rows + l * 32, ps, 8, err, sizeof err), KVIO_OK);
                if (miss || l == 0)
                    ck_assert_int_eq(kvio_stream_kv(w, l, 1, 0, 6, rows + l * 32 + 16, ps, 8, err, sizeof err),
                                     KVIO_OK);
            }
            if (!miss)
                ck_assert_int_eq(kvio_stream_tokens(w, 0, 6, c.tokens, err, sizeof err), KVIO_OK);
            EXPECT_ERR(kvio_stream_finish(w, err, sizeof err), err, KVIO_E_ARG, "s.safetensors", "incomplete",
                       miss ? "0 of 6 token ids" : "288 of 384 key/value bytes");
        }
    }
    /* outside the shape; bad token ids (the stream stays usable) */
    ck_assert_int_eq(kvio_stream_open(&w, path, KVIO_FMT_AUTO, 0, &c, 1, err, sizeof err), KVIO_OK);
    EXPECT_ERR(kvio_stream_kv(w, 2, 0, 0, 1, rows, ps, 8, err, sizeof err), err, KVIO_E_ARG, "s.safetensors",
               "layer 2", "outside");
    EXPECT_ERR(kvio_stream_kv(w, 0, 2, 0, 1, rows, ps, 8, err, sizeof err), err, KVIO_E_ARG, "outside");
    EXPECT_ERR(kvio_stream_kv(w, 0, 1, 5, 2, rows, ps, 8, err, sizeof err), err, KVIO_E_ARG, "[5, 5 + 2)");
    EXPECT_ERR(kvio_stream_kv(w, 0, 1, UINT32_MAX, 2, rows, ps, 8, err, sizeof err), err, KVIO_E_ARG, "outside");
    EXPECT_ERR(kvio_stream_tokens(w, 4, 3, c.tokens, err, sizeof err), err, KVIO_E_ARG, "token ids [4, 4 + 3)");
    int64_t bad[2] = {1, -3};
    EXPECT_ERR(kvio_stream_tokens(w, 0, 2, bad, err, sizeof err), err, KVIO_E_ARG, "-3", "position 1",
               "negative");
    kvio_stream_discard(w);
    kvio_stream_discard(NULL);
    /* token ids that do not fit int32 */
    c.token_width = 4;
    ck_assert_int_eq(kvio_stream_open(&w, path, KVIO_FMT_AUTO, 0, &c, 1, err, sizeof err), KVIO_OK);
    int64_t big[1] = {(int64_t)INT32_MAX + 1};
    EXPECT_ERR(kvio_stream_tokens(w, 3, 1, big, err, sizeof err), err, KVIO_E_ARG, "position 3", "int32");
    kvio_stream_discard(w);
    c.token_width = 8;
    /* .npy: no token ids, equal dims */
    snprintf(path, sizeof path, "%s/s.npy", dir);
    EXPECT_ERR(kvio_stream_open(&w, path, KVIO_FMT_AUTO, 0, &c, 1, err, sizeof err), err, KVIO_E_ARG, "s.npy",
               "token ids");
    ck_assert_ptr_null(w);
    /* an existing file with KVIO_WRITE_NO_REPLACE; one that appears meanwhile */
    snprintf(path, sizeof path, "%s/s.npz", dir);
    tu_write_file(path, "precious", 8);
    EXPECT_ERR(kvio_stream_open(&w, path, KVIO_FMT_AUTO, KVIO_WRITE_NO_REPLACE, &c, 0, err, sizeof err), err,
               KVIO_E_EXISTS, "s.npz", "exists");
    remove(path);
    ck_assert_int_eq(kvio_stream_open(&w, path, KVIO_FMT_AUTO, KVIO_WRITE_NO_REPLACE, &c, 0, err, sizeof err),
                     KVIO_OK);
    for (uint32_t l = 0; l < 2; l++)
        for (int kv = 0; kv < 2; kv++)
            ck_assert_int_eq(kvio_stream_kv(w, l, kv, 0, 6, rows + l * 32 + kv * 16, ps, 8, err, sizeof err),
                             KVIO_OK);
    tu_write_file(path, "precious", 8);
    EXPECT_ERR(kvio_stream_finish(w, err, sizeof err), err, KVIO_E_EXISTS, "s.npz", "not replaced");
    expect_file(path, "precious");
    remove(path);
    /* no directory; unknown format; a bad shape */
    snprintf(path, sizeof path, "%s/no/such/s.safetensors", dir);
    EXPECT_ERR(kvio_stream_open(&w, path, KVIO_FMT_AUTO, 0, &c, 0, err, sizeof err), err, KVIO_E_IO,
               "s.safetensors", "temporary file");
    snprintf(path, sizeof path, "%s/s.bin", dir);
    EXPECT_ERR(kvio_stream_open(&w, path, KVIO_FMT_AUTO, 0, &c, 0, err, sizeof err), err, KVIO_E_ARG, "s.bin",
               "format");
    kvio_cache z = c;
    z.key_dim = 0;
    EXPECT_ERR(kvio_stream_open(&w, path, KVIO_FMT_NPZ, 0, &z, 0, err, sizeof err), err, KVIO_E_ARG, ">= 1");
    z = c;
    z.n_positions = UINT32_MAX, z.n_layers = 65536, z.key_dim = z.value_dim = 1u << 20;
    EXPECT_ERR(kvio_stream_open(&w, path, KVIO_FMT_NPZ, 0, &z, 0, err, sizeof err), err, KVIO_E_ARG, "overflows");
    /* a write that fails (past the file size limit, SIGXFSZ ignored):
     * the byte offset in the message, no file */
    snprintf(path, sizeof path, "%s/s.safetensors", dir);
    struct rlimit old_lim, lim;
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old_lim), 0);
    lim = old_lim;
    lim.rlim_cur = 200;
    void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(kvio_stream_open(&w, path, KVIO_FMT_AUTO, 0, &c, 0, err, sizeof err), KVIO_OK);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = kvio_stream_kv(w, 1, 1, 0, 6, rows + 48, ps, 8, err, sizeof err);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old_lim), 0);
    signal(SIGXFSZ, old_sig);
    EXPECT_ERR(rc, err, KVIO_E_IO, "s.safetensors", "at byte offset", "File too large");
    kvio_stream_discard(w);
    free(rows);
    kvio_cache_free(&c);
    ck_assert_int_eq(rmdir(dir), 0); /* no temporary file anywhere */
}
END_TEST

static Suite *cacheio_suite(void)
{
    Suite *s = suite_create("cacheio");
    TCase *t = tcase_create("round_trip");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, rt_safetensors_all_dtypes_with_and_without_tokens);
    tcase_add_test(t, rt_npy_all_dtypes);
    tcase_add_test(t, read_npy_in_place);
    tcase_add_test(t, rt_npz_all_dtypes_stored_and_deflate);
    tcase_add_test(t, rt_zero_positions);
    tcase_add_test(t, rt_safetensors_metadata);
    tcase_add_test(t, rt_files_auto_detect);
    tcase_add_test(t, write_no_replace);
    tcase_add_test(t, tmp_output_files);
    tcase_add_test(t, write_mode_follows_umask);
    tcase_add_test(t, safetensors_bytes_are_exact);
    tcase_add_test(t, npy_bytes_are_exact);
    tcase_add_test(t, npz_members_are_named_by_the_convention);
    tcase_add_test(t, hf_layouts_accepted);
    tcase_add_test(t, format_detection);
    tcase_add_test(t, writers_refuse_invalid_caches);
    tcase_add_test(t, readers_refuse_bad_arguments);
    suite_add_tcase(s, t);
    t = tcase_create("truncation");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, truncated_safetensors_always_rejected);
    tcase_add_test(t, truncated_npy_always_rejected);
    tcase_add_test(t, truncated_npz_always_rejected);
    suite_add_tcase(s, t);
    t = tcase_create("safetensors_bad");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, st_header_length_beyond_file);
    tcase_add_test(t, st_header_length_over_limit);
    tcase_add_test(t, st_too_short_for_length);
    tcase_add_test(t, st_offsets_out_of_range);
    tcase_add_test(t, st_overlapping_tensors);
    tcase_add_test(t, st_gap_and_unused_tail);
    tcase_add_test(t, st_begin_after_end);
    tcase_add_test(t, st_shape_bytes_mismatch);
    tcase_add_test(t, st_unknown_dtype);
    tcase_add_test(t, st_missing_layer);
    tcase_add_test(t, st_inconsistent_shapes_across_layers);
    tcase_add_test(t, st_tokens_checked);
    tcase_add_test(t, st_duplicate_names);
    tcase_add_test(t, st_extra_tensors_and_names);
    tcase_add_test(t, st_json_unterminated_string);
    tcase_add_test(t, st_json_bad_escape);
    tcase_add_test(t, st_json_nesting_too_deep);
    tcase_add_test(t, st_json_huge_and_bad_numbers);
    tcase_add_test(t, st_json_structure_errors);
    tcase_add_test(t, st_dimension_too_large);
    tcase_add_test(t, st_too_many_layers);
    suite_add_tcase(s, t);
    t = tcase_create("npy_npz_bad");
    tcase_add_test(t, npy_fortran_order_true);
    tcase_add_test(t, npy_big_endian_descr);
    tcase_add_test(t, npy_bad_magic_and_version);
    tcase_add_test(t, npy_data_size_checked);
    tcase_add_test(t, npy_header_dict_checked);
    tcase_add_test(t, npz_handmade_members_accepted);
    tcase_add_test(t, npz_member_missing);
    tcase_add_test(t, npz_member_corrupt);
    tcase_add_test(t, npz_extra_and_duplicate_members);
    tcase_add_test(t, npz_member_size_and_header_cut);
    suite_add_tcase(s, t);
    t = tcase_create("layouts_and_names");
    tcase_add_test(t, nhd_safetensors_read_transposed);
    tcase_add_test(t, nhd_npy_npz_read_transposed);
    tcase_add_test(t, nhd_writers_round_trip);
    tcase_add_test(t, names_scheme_reported);
    tcase_add_test(t, companions_ignored_and_reported);
    tcase_add_test(t, no_kv_tensors_lists_schemes_and_names);
    tcase_add_test(t, hf_writer_writes_input_ids);
    suite_add_tcase(s, t);
    t = tcase_create("lazy");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, lazy_reads_match_eager_reads);
    tcase_add_test(t, lazy_reads_cross_pieces);
    tcase_add_test(t, lazy_read_errors);
    suite_add_tcase(s, t);
    t = tcase_create("stream");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, stream_bytes_equal_kvio_write);
    tcase_add_test(t, stream_errors_leave_no_file);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return tu_run_suite(cacheio_suite());
}
