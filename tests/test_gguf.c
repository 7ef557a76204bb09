/* Check suite for tools/gguf.c: GGUF metadata.
 *
 * Every input is built here by a GGUF writer of the test's own (gb_*), with
 * the offsets the expected messages name recorded as the bytes are laid
 * down. Field-by-field checks of llama-like and qwen2-like headers, GQA,
 * defaults, rope scaling, head-count arrays, the rope table; each error with
 * its class, key and offset; every truncation and every single-bit flip of
 * a small header (in a child process with a low address-space limit);
 * hostile counts; and the real models of ../shared/models against the
 * values their README states. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "gguf.h"
#include "testutil.h"


#define ERRLEN 512

/* ---- the test's GGUF writer -------------------------------------------------- */

enum { TU8 = 0, TI8, TU16, TI16, TU32, TI32, TF32, TBOOL, TSTR, TARR, TU64, TI64, TF64 };

typedef struct gb {
    uint8_t *p;
    size_t n, cap;
    uint64_t n_kv;
    size_t key_at, val_at; /* of the last pair added */
} gb;

static void gb_raw(gb *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        ck_assert_ptr_nonnull(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void gb_le(gb *b, uint64_t v, unsigned n)
{
    uint8_t t[8];
    for (unsigned i = 0; i < n; i++)
        t[i] = (uint8_t)(v >> (8 * i));
    gb_raw(b, t, n);
}
static void gb_str(gb *b, const char *s)
{
    gb_le(b, strlen(s), 8);
    gb_raw(b, s, strlen(s));
}
/* header; n_kv is patched by gb_done */
static gb gb_begin(uint32_t version)
{
    gb b = {0};
    gb_raw(&b, "GGUF", 4);
    gb_le(&b, version, 4);
    gb_le(&b, 0, 8);  /* n_tensors */
    gb_le(&b, 0, 8);  /* n_kv */
    return b;
}
static void gb_key(gb *b, const char *k, uint32_t type)
{
    b->key_at = b->n;
    gb_str(b, k);
    gb_le(b, type, 4);
    b->val_at = b->n;
    b->n_kv++;
}
static void kv_int(gb *b, const char *k, uint32_t type, uint64_t v)
{
    static const unsigned sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    gb_key(b, k, type);
    gb_le(b, v, sz[type]);
}
static void kv_u32(gb *b, const char *k, uint32_t v) { kv_int(b, k, TU32, v); }
static void kv_s(gb *b, const char *k, const char *v)
{
    gb_key(b, k, TSTR);
    gb_str(b, v);
}
static void kv_f32(gb *b, const char *k, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    kv_int(b, k, TF32, u);
}
static void kv_f64(gb *b, const char *k, double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    kv_int(b, k, TF64, u);
}
static void kv_arr(gb *b, const char *k, uint32_t et, size_t n, const int64_t *v)
{
    static const unsigned sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    gb_key(b, k, TARR);
    gb_le(b, et, 4);
    gb_le(b, n, 8);
    for (size_t i = 0; i < n; i++)
        gb_le(b, (uint64_t)v[i], sz[et]);
}
static void gb_done(gb *b)
{
    for (int i = 0; i < 8; i++)
        b->p[16 + i] = (uint8_t)(b->n_kv >> (8 * i));
}

/* the llama-like header of stories260K's shape, without the rope keys */
static void llama_keys(gb *b)
{
    kv_s(b, "general.architecture", "llama");
    kv_s(b, "general.name", "tiny llama");
    kv_u32(b, "llama.block_count", 5);
    kv_u32(b, "llama.embedding_length", 64);
    kv_u32(b, "llama.attention.head_count", 8);
    kv_u32(b, "llama.attention.head_count_kv", 4);
    kv_u32(b, "llama.context_length", 512);
}

static int parse(const gb *b, gguf_model *m, char *err)
{
    return gguf_parse(b->p, b->n, "t.gguf", m, err, ERRLEN);
}

/* rc == code and the message starts with the file name and offset and
 * contains every given substring */
#define EXPECT_ERR(rc, err, code, ...) \
    TU_EXPECT_ERR((rc), (code), gguf_strerror(rc), (err), "t.gguf: offset ", __VA_ARGS__)

static const char *off(size_t o)
{
    static char s[8][32];
    static int i;
    i = (i + 1) % 8;
    snprintf(s[i], sizeof s[i], "offset %zu:", o);
    return s[i];
}

static int model_empty(const gguf_model *m)
{
    static const gguf_model z;
    return memcmp(m, &z, sizeof z) == 0;
}

/* ---- well-formed headers ------------------------------------------------------ */

START_TEST(llama_like_fields)
{
    gb b = gb_begin(3);
    llama_keys(&b);
    kv_u32(&b, "llama.rope.dimension_count", 8);
    kv_f32(&b, "llama.rope.freq_base", 10000.0f);
    kv_s(&b, "tokenizer.ggml.model", "llama");
    gb_done(&b);
    b.p[8] = 3; /* n_tensors 3 */
    gguf_model m;
    char err[ERRLEN];
    int rc = parse(&b, &m, err);
    ck_assert_msg(rc == GGUF_OK, "%s", err);
    ck_assert_uint_eq(m.version, 3);
    ck_assert_uint_eq(m.n_tensors, 3);
    ck_assert_uint_eq(m.n_kv, 10);
    ck_assert_str_eq(m.arch, "llama");
    ck_assert_str_eq(m.name, "tiny llama");
    ck_assert_uint_eq(m.n_layer, 5);
    ck_assert_uint_eq(m.n_embd, 64);
    ck_assert_uint_eq(m.n_head, 8);
    ck_assert_uint_eq(m.n_head_kv, 4);
    ck_assert_uint_eq(m.key_dim, 8);
    ck_assert_uint_eq(m.value_dim, 8);
    ck_assert_uint_eq(m.context_length, 512);
    ck_assert_int_eq(m.rope, GGUF_ROPE_NORM);
    ck_assert_uint_eq(m.rope_dims, 8);
    ck_assert(m.rope_theta == 10000.0);
    ck_assert_int_eq(m.rope_scaled, 0);
    gguf_model_free(&m);
    ck_assert(model_empty(&m));
    gguf_model_free(NULL);
    free(b.p);
}
END_TEST

/* qwen2-like: the architecture last, other integer types, explicit key and
 * value lengths other than n_embd / n_head, f64 theta, no name, version 2 */
START_TEST(qwen2_like_fields)
{
    gb b = gb_begin(2);
    kv_int(&b, "qwen2.block_count", TU64, 24);
    kv_int(&b, "qwen2.embedding_length", TU16, 896);
    kv_int(&b, "qwen2.attention.head_count", TI32, 14);
    kv_int(&b, "qwen2.attention.head_count_kv", TU8, 2);
    kv_int(&b, "qwen2.attention.key_length", TI64, 128);
    kv_int(&b, "qwen2.attention.value_length", TI16, 96);
    kv_int(&b, "qwen2.context_length", TI32, 32768);
    kv_f64(&b, "qwen2.rope.freq_base", 1000000.0);
    kv_u32(&b, "llama.block_count", 99); /* another architecture's key: ignored */
    kv_s(&b, "general.architecture", "qwen2");
    gb_done(&b);
    gguf_model m;
    char err[ERRLEN];
    int rc = parse(&b, &m, err);
    ck_assert_msg(rc == GGUF_OK, "%s", err);
    ck_assert_uint_eq(m.version, 2);
    ck_assert_str_eq(m.arch, "qwen2");
    ck_assert_ptr_null(m.name);
    ck_assert_uint_eq(m.n_layer, 24);
    ck_assert_uint_eq(m.n_embd, 896);
    ck_assert_uint_eq(m.n_head, 14);
    ck_assert_uint_eq(m.n_head_kv, 2);
    ck_assert_uint_eq(m.key_dim, 128);
    ck_assert_uint_eq(m.value_dim, 96);
    ck_assert_uint_eq(m.context_length, 32768);
    ck_assert_int_eq(m.rope, GGUF_ROPE_NEOX);
    ck_assert_uint_eq(m.rope_dims, 128); /* default: the key length */
    ck_assert(m.rope_theta == 1000000.0);
    ck_assert_int_eq(m.rope_scaled, 0);
    gguf_model_free(&m);
    free(b.p);
}
END_TEST

/* defaults: no head_count_kv (MHA), no key/value length, no rope keys */
START_TEST(defaults)
{
    gb b = gb_begin(3);
    kv_s(&b, "general.architecture", "gpt2");
    kv_u32(&b, "gpt2.block_count", 2);
    kv_u32(&b, "gpt2.embedding_length", 48);
    kv_u32(&b, "gpt2.attention.head_count", 4);
    gb_done(&b);
    gguf_model m;
    char err[ERRLEN];
    ck_assert_int_eq(parse(&b, &m, err), GGUF_OK);
    ck_assert_uint_eq(m.n_head_kv, 4);
    ck_assert_uint_eq(m.key_dim, 12);
    ck_assert_uint_eq(m.value_dim, 12);
    ck_assert_uint_eq(m.context_length, 0);
    ck_assert_int_eq(m.rope, GGUF_ROPE_NONE);
    ck_assert_uint_eq(m.rope_dims, 12);
    ck_assert(m.rope_theta == 10000.0);
    gguf_model_free(&m);
    free(b.p);
}
END_TEST

/* key_length present makes n_embd % n_head irrelevant (gemma-like) */
START_TEST(key_length_present_vs_default)
{
    for (int present = 0; present < 2; present++) {
        gb b = gb_begin(3);
        kv_s(&b, "general.architecture", "gemma");
        kv_u32(&b, "gemma.block_count", 1);
        kv_u32(&b, "gemma.embedding_length", 100);
        kv_u32(&b, "gemma.attention.head_count", 8);
        kv_u32(&b, "gemma.attention.head_count_kv", 1);
        size_t end = b.n;
        if (present) {
            kv_u32(&b, "gemma.attention.key_length", 16);
            kv_u32(&b, "gemma.attention.value_length", 16);
            end = b.n;
        }
        gb_done(&b);
        gguf_model m;
        char err[ERRLEN];
        int rc = parse(&b, &m, err);
        if (present) {
            ck_assert_msg(rc == GGUF_OK, "%s", err);
            ck_assert_uint_eq(m.key_dim, 16);
            ck_assert_uint_eq(m.value_dim, 16);
            ck_assert_uint_eq(m.rope_dims, 16);
            ck_assert_int_eq(m.rope, GGUF_ROPE_NEOX);
        } else {
            EXPECT_ERR(rc, err, GGUF_E_UNSUPPORTED, off(end), "'gemma.attention.key_length'", "100 / 8");
            ck_assert(model_empty(&m));
        }
        gguf_model_free(&m);
        free(b.p);
    }
}
END_TEST

START_TEST(rope_scaling_variants)
{
    static const struct {
        const char *type;     /* NULL: absent */
        double factor, linear; /* < 0: absent */
        int scaled;
    } v[] = {
        {NULL, -1, -1, 0},      {"none", -1, -1, 0},    {"linear", -1, -1, 0},
        {"linear", 1, -1, 0},   {"linear", 0, -1, 0},   {"linear", 4, -1, 1},
        {"yarn", -1, -1, 1},    {"yarn", 1, -1, 1},     {"longrope", -1, -1, 1},
        {"ntk", -1, -1, 1},     {NULL, 2, -1, 1},       {NULL, -1, 0.5, 1},
        {NULL, -1, 1, 0},       {"none", 1, 1, 0},      {"none", -1, 8, 1},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        gb b = gb_begin(3);
        llama_keys(&b);
        if (v[i].type)
            kv_s(&b, "llama.rope.scaling.type", v[i].type);
        if (v[i].factor >= 0)
            kv_f32(&b, "llama.rope.scaling.factor", (float)v[i].factor);
        if (v[i].linear >= 0)
            kv_f64(&b, "llama.rope.scale_linear", v[i].linear);
        gb_done(&b);
        gguf_model m;
        char err[ERRLEN];
        int rc = parse(&b, &m, err);
        ck_assert_msg(rc == GGUF_OK, "case %zu: %s", i, err);
        ck_assert_msg(m.rope_scaled == v[i].scaled, "case %zu: scaled %d", i, m.rope_scaled);
        gguf_model_free(&m);
        free(b.p);
    }
}
END_TEST

START_TEST(array_head_counts)
{
    static const int64_t same[5] = {8, 8, 8, 8, 8}, kv[5] = {4, 4, 4, 4, 4}, odd[5] = {4, 4, 4, 2, 4};
    for (int et = 0; et < 2; et++) {
        uint32_t t = et ? TI32 : TU32;
        gb b = gb_begin(3);
        kv_s(&b, "general.architecture", "llama");
        kv_u32(&b, "llama.block_count", 5);
        kv_u32(&b, "llama.embedding_length", 64);
        kv_arr(&b, "llama.attention.head_count", t, 5, same);
        kv_arr(&b, "llama.attention.head_count_kv", t, 5, kv);
        gb_done(&b);
        gguf_model m;
        char err[ERRLEN];
        ck_assert_int_eq(parse(&b, &m, err), GGUF_OK);
        ck_assert_uint_eq(m.n_head, 8);
        ck_assert_uint_eq(m.n_head_kv, 4);
        ck_assert_uint_eq(m.key_dim, 8);
        gguf_model_free(&m);
        free(b.p);

        b = gb_begin(3);
        kv_s(&b, "general.architecture", "llama");
        kv_u32(&b, "llama.block_count", 5);
        kv_u32(&b, "llama.embedding_length", 64);
        kv_arr(&b, "llama.attention.head_count", t, 5, same);
        kv_arr(&b, "llama.attention.head_count_kv", t, 5, odd);
        size_t at = b.val_at + 4 + 8 + 3 * (size_t)4; /* element 3 */
        gb_done(&b);
        EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_UNSUPPORTED, off(at), "'llama.attention.head_count_kv'",
                   "per-layer head counts differ");
        free(b.p);
    }
}
END_TEST

START_TEST(rope_table)
{
    ck_assert_int_eq(gguf_rope_of_arch("llama"), GGUF_ROPE_NORM);
    ck_assert_int_eq(gguf_rope_of_arch("deepseek2"), GGUF_ROPE_NORM);
    ck_assert_int_eq(gguf_rope_of_arch("command-r"), GGUF_ROPE_NORM);
    ck_assert_int_eq(gguf_rope_of_arch("qwen2"), GGUF_ROPE_NEOX);
    ck_assert_int_eq(gguf_rope_of_arch("phi3"), GGUF_ROPE_NEOX);
    ck_assert_int_eq(gguf_rope_of_arch("gemma3"), GGUF_ROPE_NEOX);
    ck_assert_int_eq(gguf_rope_of_arch("gpt-oss"), GGUF_ROPE_NEOX);
    ck_assert_int_eq(gguf_rope_of_arch("gpt2"), GGUF_ROPE_NONE);
    ck_assert_int_eq(gguf_rope_of_arch("mamba"), GGUF_ROPE_NONE);
    ck_assert_int_eq(gguf_rope_of_arch("afmoe"), GGUF_ROPE_NEOX);      /* first */
    ck_assert_int_eq(gguf_rope_of_arch("xverse"), GGUF_ROPE_NORM);     /* last */
    ck_assert_int_eq(gguf_rope_of_arch("qwen2vl"), GGUF_ROPE_MULTI);
    ck_assert_int_eq(gguf_rope_of_arch("qwen3vl"), GGUF_ROPE_MULTI);
    ck_assert_int_eq(gguf_rope_of_arch("glm4"), GGUF_ROPE_MULTI);
    ck_assert_int_eq(gguf_rope_of_arch("llama2"), GGUF_ROPE_UNKNOWN);
    ck_assert_int_eq(gguf_rope_of_arch("LLAMA"), GGUF_ROPE_UNKNOWN);
    ck_assert_int_eq(gguf_rope_of_arch(""), GGUF_ROPE_UNKNOWN);
    ck_assert_int_eq(gguf_rope_of_arch(NULL), GGUF_ROPE_UNKNOWN);
    ck_assert_str_eq(gguf_rope_name(GGUF_ROPE_UNKNOWN), "unknown");
    ck_assert_str_eq(gguf_rope_name(GGUF_ROPE_NONE), "none");
    ck_assert_str_eq(gguf_rope_name(GGUF_ROPE_NORM), "norm");
    ck_assert_str_eq(gguf_rope_name(GGUF_ROPE_NEOX), "neox");
    ck_assert_str_eq(gguf_rope_name(GGUF_ROPE_MULTI), "multi");
    ck_assert_str_eq(gguf_rope_name((gguf_rope)99), "unknown");
    ck_assert_str_eq(gguf_strerror(GGUF_OK), "success");
    ck_assert_str_ne(gguf_strerror(GGUF_E_FORMAT), gguf_strerror(GGUF_E_UNSUPPORTED));
}
END_TEST

/* glm4: M-RoPE with dimension sections, else adjacent pairs */
START_TEST(conditional_mrope)
{
    static const int64_t sec[4] = {8, 12, 12, 0}, nosec[4] = {0, 0, 0, 0};
    for (int i = 0; i < 3; i++) {
        gb b = gb_begin(3);
        kv_s(&b, "general.architecture", "glm4");
        kv_u32(&b, "glm4.block_count", 2);
        kv_u32(&b, "glm4.embedding_length", 128);
        kv_u32(&b, "glm4.attention.head_count", 2);
        if (i < 2)
            kv_arr(&b, "glm4.rope.dimension_sections", TI32, 4, i ? sec : nosec);
        gb_done(&b);
        gguf_model m;
        char err[ERRLEN];
        ck_assert_int_eq(parse(&b, &m, err), GGUF_OK);
        ck_assert_int_eq(m.rope, i == 1 ? GGUF_ROPE_MULTI : GGUF_ROPE_NORM);
        gguf_model_free(&m);
        free(b.p);
    }
}
END_TEST

/* ---- errors --------------------------------------------------------------------- */

START_TEST(header_errors)
{
    gguf_model m;
    char err[ERRLEN];
    static const uint8_t notg[24] = "GGUX";
    EXPECT_ERR(gguf_parse(notg, 24, "t.gguf", &m, err, ERRLEN), err, GGUF_E_FORMAT, "offset 0:", "magic");
    ck_assert(model_empty(&m));
    EXPECT_ERR(gguf_parse(notg, 0, "t.gguf", &m, err, ERRLEN), err, GGUF_E_FORMAT, "offset 0:");
    static const uint32_t bad_versions[] = {0, 1, 4, 0x03000000u};
    static const int codes[] = {GGUF_E_FORMAT, GGUF_E_UNSUPPORTED, GGUF_E_UNSUPPORTED, GGUF_E_UNSUPPORTED};
    static const char *const says[] = {"version 0", "version 1", "version 4", "big-endian"};
    for (int i = 0; i < 4; i++) {
        gb b = gb_begin(bad_versions[i]);
        llama_keys(&b);
        gb_done(&b);
        EXPECT_ERR(parse(&b, &m, err), err, codes[i], "offset 4:", says[i]);
        free(b.p);
    }
    ck_assert_int_eq(gguf_parse(notg, 24, "t.gguf", NULL, err, ERRLEN), GGUF_E_ARG);
    ck_assert_int_eq(gguf_parse(NULL, 24, "t.gguf", &m, err, ERRLEN), GGUF_E_ARG);
    /* no err buffer is fine */
    ck_assert_int_eq(gguf_parse(notg, 24, "t.gguf", &m, NULL, 0), GGUF_E_FORMAT);
    /* a one-byte buffer gets a NUL */
    err[0] = 'x';
    ck_assert_int_eq(gguf_parse(notg, 24, "t.gguf", &m, err, 1), GGUF_E_FORMAT);
    ck_assert_int_eq(err[0], 0);
}
END_TEST

START_TEST(duplicate_key)
{
    gb b = gb_begin(3);
    llama_keys(&b);
    size_t first = b.n;
    kv_u32(&b, "llama.rope.dimension_count", 8);
    kv_u32(&b, "x.unrelated", 1);
    size_t second = b.n;
    kv_u32(&b, "llama.rope.dimension_count", 8);
    gb_done(&b);
    gguf_model m;
    char err[ERRLEN];
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, off(second), "'llama.rope.dimension_count'", "duplicate");
    char f[64];
    snprintf(f, sizeof f, "first at offset %zu", first);
    ck_assert_msg(strstr(err, f), "%s", err);
    free(b.p);
}
END_TEST

START_TEST(missing_keys)
{
    static const char *const keys[] = {"general.architecture", "llama.block_count", "llama.embedding_length",
                                       "llama.attention.head_count"};
    for (int miss = 0; miss < 4; miss++) {
        gb b = gb_begin(3);
        if (miss != 0)
            kv_s(&b, "general.architecture", "llama");
        if (miss != 1)
            kv_u32(&b, "llama.block_count", 5);
        if (miss != 2)
            kv_u32(&b, "llama.embedding_length", 64);
        if (miss != 3)
            kv_u32(&b, "llama.attention.head_count", 8);
        gb_done(&b);
        gguf_model m;
        char err[ERRLEN], k[80];
        snprintf(k, sizeof k, "'%s'", keys[miss]);
        EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_UNSUPPORTED, off(b.n), k, "missing");
        ck_assert(model_empty(&m));
        free(b.p);
    }
}
END_TEST

/* one bad value per case, added after the llama keys: class, key, offset of the value */
START_TEST(value_errors)
{
    gguf_model m;
    char err[ERRLEN];
    const int64_t bad_arr[2] = {8, -8};
    struct {
        int code;
        const char *key, *what;
    } c[] = {
        {GGUF_E_FORMAT, "llama.rope.dimension_count", "negative"},            /* 0: i32 -8 */
        {GGUF_E_FORMAT, "llama.rope.dimension_count", "exceeds 4294967295"},  /* 1: u64 2^32 */
        {GGUF_E_FORMAT, "llama.rope.dimension_count", "string value where an integer"}, /* 2 */
        {GGUF_E_FORMAT, "llama.rope.freq_base", "not a finite number"},       /* 3: NaN */
        {GGUF_E_FORMAT, "llama.rope.freq_base", "must be > 0"},               /* 4: 0 */
        {GGUF_E_FORMAT, "llama.rope.freq_base", "u32 value where f32 or f64"},/* 5 */
        {GGUF_E_UNSUPPORTED, "llama.rope.dimension_count", "must be even"},   /* 6: 7 */
        {GGUF_E_UNSUPPORTED, "llama.rope.dimension_count", "<= the key length 8"}, /* 7: 10 */
        {GGUF_E_FORMAT, "llama.rope.scaling.type", "f32 value where a string"},    /* 8 */
        {GGUF_E_FORMAT, "llama.attention.key_length", "negative"},            /* 9: i8 -1 */
        {GGUF_E_UNSUPPORTED, "llama.attention.value_length", "is 0"},         /* 10 */
        {GGUF_E_FORMAT, "llama.rope.scaling.factor", "not a finite number"},  /* 11: inf */
    };
    for (int i = 0; i < 12; i++) {
        gb b = gb_begin(3);
        llama_keys(&b);
        switch (i) {
        case 0: kv_int(&b, c[i].key, TI32, (uint32_t)-8); break;
        case 1: kv_int(&b, c[i].key, TU64, 1ull << 32); break;
        case 2: kv_s(&b, c[i].key, "8"); break;
        case 3: kv_f32(&b, c[i].key, NAN); break;
        case 4: kv_f64(&b, c[i].key, 0.0); break;
        case 5: kv_u32(&b, c[i].key, 10000); break;
        case 6: kv_u32(&b, c[i].key, 7); break;
        case 7: kv_u32(&b, c[i].key, 10); break;
        case 8: kv_f32(&b, c[i].key, 1.0f); break;
        case 9: kv_int(&b, c[i].key, TI8, 0xff); break;
        case 10: kv_u32(&b, c[i].key, 0); break;
        case 11: kv_f32(&b, c[i].key, INFINITY); break;
        }
        /* the semantic checks name the key's offset, the value checks the value's */
        size_t at = (c[i].code == GGUF_E_UNSUPPORTED || i == 4) ? b.key_at : b.val_at;
        kv_u32(&b, "zz.after", 1);
        gb_done(&b);
        char k[80];
        snprintf(k, sizeof k, "'%s'", c[i].key);
        EXPECT_ERR(parse(&b, &m, err), err, c[i].code, off(at), k, c[i].what);
        ck_assert(model_empty(&m));
        free(b.p);
    }
    /* a negative element of a head-count array */
    gb b = gb_begin(3);
    kv_s(&b, "general.architecture", "llama");
    kv_u32(&b, "llama.block_count", 2);
    kv_u32(&b, "llama.embedding_length", 64);
    kv_arr(&b, "llama.attention.head_count", TI32, 2, bad_arr);
    gb_done(&b);
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, off(b.val_at + 12 + 4), "'llama.attention.head_count'",
               "negative");
    free(b.p);
}
END_TEST

START_TEST(division_errors)
{
    gguf_model m;
    char err[ERRLEN];
    gb b = gb_begin(3);
    kv_s(&b, "general.architecture", "llama");
    kv_u32(&b, "llama.block_count", 2);
    kv_u32(&b, "llama.embedding_length", 64);
    kv_u32(&b, "llama.attention.head_count", 8);
    kv_u32(&b, "llama.attention.head_count_kv", 3);
    size_t at = b.key_at;
    gb_done(&b);
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_UNSUPPORTED, off(at), "'llama.attention.head_count_kv'",
               "3 KV heads do not divide the 8");
    free(b.p);
    b = gb_begin(3);
    kv_s(&b, "general.architecture", "llama");
    kv_u32(&b, "llama.block_count", 0);
    at = b.key_at;
    kv_u32(&b, "llama.embedding_length", 64);
    kv_u32(&b, "llama.attention.head_count", 8);
    gb_done(&b);
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_UNSUPPORTED, off(at), "'llama.block_count'", "is 0");
    free(b.p);
    /* n_embd < n_head: the default head size would be 0 */
    b = gb_begin(3);
    kv_s(&b, "general.architecture", "llama");
    kv_u32(&b, "llama.block_count", 1);
    kv_u32(&b, "llama.embedding_length", 0);
    kv_u32(&b, "llama.attention.head_count", 8);
    at = b.n;
    gb_done(&b);
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_UNSUPPORTED, "'llama.embedding_length'", "is 0");
    free(b.p);
}
END_TEST

START_TEST(structure_errors)
{
    gguf_model m;
    char err[ERRLEN];
    /* unknown value type */
    gb b = gb_begin(3);
    llama_keys(&b);
    gb_key(&b, "bad.type", 13);
    size_t at = b.val_at - 4;
    gb_le(&b, 0, 4);
    gb_done(&b);
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, off(at), "'bad.type'", "unknown value type 13");
    free(b.p);
    /* arrays nested five deep */
    b = gb_begin(3);
    llama_keys(&b);
    gb_key(&b, "deep", TARR);
    size_t lvl[5];
    for (int i = 0; i < 5; i++) {
        lvl[i] = b.n;
        gb_le(&b, i < 4 ? TARR : TU8, 4);
        gb_le(&b, 1, 8);
    }
    gb_le(&b, 0, 1);
    gb_done(&b);
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, off(lvl[4]), "'deep'", "nested deeper than 4");
    free(b.p);
    /* four deep is fine */
    b = gb_begin(3);
    llama_keys(&b);
    gb_key(&b, "deep", TARR);
    for (int i = 0; i < 4; i++) {
        gb_le(&b, i < 3 ? TARR : TSTR, 4);
        gb_le(&b, 1, 8);
    }
    gb_str(&b, "leaf");
    gb_done(&b);
    ck_assert_int_eq(parse(&b, &m, err), GGUF_OK);
    gguf_model_free(&m);
    free(b.p);
    /* architecture not a string; architecture empty; name with a NUL */
    b = gb_begin(3);
    kv_u32(&b, "general.architecture", 1);
    at = b.val_at;
    gb_done(&b);
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, off(at), "'general.architecture'", "u32 value where a string");
    free(b.p);
    b = gb_begin(3);
    kv_s(&b, "general.architecture", "");
    at = b.key_at;
    gb_done(&b);
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_UNSUPPORTED, off(at), "'general.architecture'", "empty");
    free(b.p);
    b = gb_begin(3);
    llama_keys(&b);
    gb_key(&b, "general.name", TSTR);
    at = b.val_at;
    gb_le(&b, 3, 8);
    gb_raw(&b, "a\0b", 3);
    gb_done(&b);
    /* general.name also came in llama_keys: the NUL is found first, in pass 1 */
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, off(at), "'general.name'", "NUL");
    free(b.p);
    /* a string value running past the end */
    b = gb_begin(3);
    llama_keys(&b);
    gb_key(&b, "s", TSTR);
    at = b.val_at;
    gb_le(&b, 100, 8);
    gb_raw(&b, "short", 5);
    gb_done(&b);
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, off(at), "'s'", "runs past the end");
    free(b.p);
}
END_TEST

/* counts no file of this size can hold are refused before anything is
 * allocated or walked */
START_TEST(hostile_counts)
{
    gguf_model m;
    char err[ERRLEN];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* n_kv = 2^63 */
    gb b = gb_begin(3);
    llama_keys(&b);
    gb_done(&b);
    memset(b.p + 16, 0, 8);
    b.p[23] = 0x80;
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, "offset 16:", "metadata count 9223372036854775808");
    /* n_kv just above what the bytes can hold, and just above the limit */
    b.p[23] = 0;
    for (int i = 0; i < 8; i++)
        b.p[16 + i] = (uint8_t)((uint64_t)((b.n - 24) / 13 + 1) >> (8 * i));
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, "offset 16:", "metadata count");
    free(b.p);
    /* array counts: u8 2^62, strings 2^62, arrays 2^62 */
    static const uint32_t et[3] = {TU8, TSTR, TARR};
    for (int i = 0; i < 3; i++) {
        b = gb_begin(3);
        llama_keys(&b);
        gb_key(&b, "big", TARR);
        size_t at = b.val_at;
        gb_le(&b, et[i], 4);
        gb_le(&b, 1ull << 62, 8);
        gb_le(&b, 0, 8);
        gb_done(&b);
        EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, off(at), "'big'", "array of 4611686018427387904");
        free(b.p);
    }
    /* string length 2^40 (value and key) */
    b = gb_begin(3);
    llama_keys(&b);
    gb_key(&b, "big", TSTR);
    size_t at = b.val_at;
    gb_le(&b, 1ull << 40, 8);
    gb_done(&b);
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, off(at), "'big'", "1099511627776 exceeds the limit");
    free(b.p);
    b = gb_begin(3);
    llama_keys(&b);
    at = b.n;
    gb_le(&b, 1ull << 40, 8);
    b.n_kv++;
    gb_done(&b);
    gb_le(&b, 0, 8); /* room for the minimum pair */
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, off(at), "key length 1099511627776");
    free(b.p);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ck_assert_msg(s < 2.0, "hostile counts took %.3f s", s);
}
END_TEST

/* many keys: GGUF_MAX_KV pairs (the llama keys last) parse, and the
 * duplicate check is not quadratic; one more pair is refused by count, one
 * duplicate among them by name */
START_TEST(many_keys)
{
    gb b = gb_begin(3);
    char k[32];
    const uint32_t n = GGUF_MAX_KV - 7;
    for (uint32_t i = 0; i < n; i++) {
        snprintf(k, sizeof k, "k%07u", (uint32_t)(((uint64_t)i * 7919u) % n));
        kv_int(&b, k, TU8, 1);
    }
    llama_keys(&b);
    gb_done(&b);
    gguf_model m;
    char err[ERRLEN];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_msg(parse(&b, &m, err) == GGUF_OK, "%s", err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ck_assert_msg(s < 60.0, "%u keys took %.3f s", GGUF_MAX_KV, s);
    ck_assert_uint_eq(m.n_kv, GGUF_MAX_KV);
    ck_assert_uint_eq(m.n_head_kv, 4);
    gguf_model_free(&m);
    kv_int(&b, "k0123456", TU8, 1);
    gb_done(&b);
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, "offset 16:", "metadata count 1048577 exceeds the limit 1048576");
    /* the same count of pairs with one duplicate */
    b.n = b.key_at;
    b.n_kv--;
    gb_done(&b);
    /* generated pairs are 21 bytes from offset 24; pair 2's key := pair 1's */
    memcpy(b.p + 24 + 21 * 2 + 8, b.p + 24 + 21 * 1 + 8, 8);
    EXPECT_ERR(parse(&b, &m, err), err, GGUF_E_FORMAT, off(24 + 21 * 2), "'k0007919'", "duplicate",
               "first at offset 45");
    free(b.p);
}
END_TEST

/* ---- damage ----------------------------------------------------------------------- */

static gb small_header(void)
{
    static const int64_t hc[2] = {4, 4};
    gb b = gb_begin(3);
    kv_s(&b, "general.architecture", "llama");
    kv_s(&b, "general.name", "s");
    kv_u32(&b, "llama.block_count", 2);
    kv_int(&b, "llama.embedding_length", TU16, 32);
    kv_arr(&b, "llama.attention.head_count", TI32, 2, hc);
    kv_int(&b, "llama.attention.head_count_kv", TU8, 2);
    kv_u32(&b, "llama.rope.dimension_count", 8);
    kv_f32(&b, "llama.rope.freq_base", 10000.0f);
    kv_s(&b, "llama.rope.scaling.type", "none");
    gb_key(&b, "tok", TARR);
    gb_le(&b, TSTR, 4);
    gb_le(&b, 2, 8);
    gb_str(&b, "a");
    gb_str(&b, "bc");
    gb_done(&b);
    return b;
}

START_TEST(every_truncation_refused)
{
    gb b = small_header();
    gguf_model m;
    char err[ERRLEN];
    ck_assert_int_eq(parse(&b, &m, err), GGUF_OK);
    gguf_model_free(&m);
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *p = tu_dup_odd(b.p, n);
        err[0] = 0;
        int rc = gguf_parse(p, n, "t.gguf", &m, err, ERRLEN);
        EXPECTF(rc == GGUF_E_FORMAT, "cut at %zu: rc %d: %s", n, rc, err);
        EXPECTF(strncmp(err, "t.gguf: offset ", 15) == 0, "cut at %zu: %s", n, err);
        EXPECTF(model_empty(&m), "cut at %zu: model not empty", n);
        tu_free_odd(p);
    }
    free(b.p);
}
END_TEST

/* every single-bit flip, in a child under a 256 MiB address-space limit
 * (not under ASan, whose shadow memory needs far more): success with the
 * model's invariants, or an error with a message */
/* every single-bit flip of flips_of->p: a model that parses keeps its
 * invariants, an error has a message naming the input and an offset; run
 * by tu_run_limited: 0 ok, 1 broken, 2 no flip parsed */
typedef struct flips_of {
    const uint8_t *p;
    size_t n;
} flips_of;

static int flip_all(void *ctx)
{
    const flips_of *fo = ctx;
    int bad = 0;
    size_t ok = 0;
    for (size_t i = 0; i < fo->n * 8 && !bad; i++) {
        uint8_t *p = tu_dup_odd(fo->p, fo->n);
        p[i / 8] ^= (uint8_t)(1u << (i % 8));
        gguf_model m;
        char err[ERRLEN];
        err[0] = 0;
        int rc = gguf_parse(p, fo->n, "t.gguf", &m, err, ERRLEN);
        if (rc == GGUF_OK) {
            ok++;
            if (!m.arch || m.n_head_kv == 0 || m.n_head % m.n_head_kv || m.key_dim == 0 ||
                m.value_dim == 0 || m.n_layer == 0 || m.n_embd == 0 || !(m.rope_theta > 0) ||
                ((m.rope == GGUF_ROPE_NORM || m.rope == GGUF_ROPE_NEOX) &&
                 (m.rope_dims > m.key_dim || m.rope_dims % 2))) {
                fprintf(stderr, "flip %zu: bad model\n", i);
                bad = 1;
            }
        } else if (rc != GGUF_E_FORMAT && rc != GGUF_E_UNSUPPORTED) {
            fprintf(stderr, "flip %zu: rc %d\n", i, rc);
            bad = 1;
        } else if (strncmp(err, "t.gguf: offset ", 15) != 0) {
            fprintf(stderr, "flip %zu: message '%s'\n", i, err);
            bad = 1;
        }
        gguf_model_free(&m);
        tu_free_odd(p);
    }
    /* some flips (in values we do not read) must still parse */
    return bad ? 1 : ok ? 0 : 2;
}

START_TEST(every_bit_flip_handled)
{
    gb b = small_header();
    flips_of fo = {b.p, b.n};
    int st = tu_run_limited((size_t)256 << 20, flip_all, &fo);
    ck_assert_msg(st >= 0, "child killed by signal %d", -st);
    ck_assert_int_eq(st, 0);
    free(b.p);
}
END_TEST

/* ---- files ------------------------------------------------------------------------ */

static void xxh128(const uint8_t *d, size_t n, uint8_t out[16])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(d, n));
    memcpy(out, c.digest, 16);
}

START_TEST(read_file_errors_and_hash)
{
    char dir[] = "/tmp/test_gguf.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[300], err[ERRLEN];
    gguf_model m;
    uint8_t h[16], want[16];
    snprintf(path, sizeof path, "%s/none.gguf", dir);
    ck_assert_int_eq(gguf_read_file(path, &m, h, err, ERRLEN), GGUF_E_IO);
    ck_assert_msg(strstr(err, path) && strstr(err, "cannot open"), "%s", err);
    ck_assert_int_eq(gguf_read_file(dir, &m, h, err, ERRLEN), GGUF_E_IO);
    ck_assert_msg(strstr(err, dir) && strstr(err, "directory"), "%s", err);
    /* a FIFO with no writer: refused, not waited on */
    snprintf(path, sizeof path, "%s/fifo.gguf", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(gguf_read_file(path, &m, h, err, ERRLEN), GGUF_E_IO);
    ck_assert_msg(strstr(err, path) && strstr(err, "not a regular file"), "%s", err);
    remove(path);
    snprintf(path, sizeof path, "%s/empty.gguf", dir);
    tu_write_file(path, "", 0);
    ck_assert_int_eq(gguf_read_file(path, &m, h, err, ERRLEN), GGUF_E_FORMAT);
    ck_assert_msg(strstr(err, path) && strstr(err, "empty"), "%s", err);
    remove(path);
    /* a header and some tensor bytes after it: all of them hashed */
    gb b = small_header();
    gb_raw(&b, "tensor data here", 16);
    snprintf(path, sizeof path, "%s/ok.gguf", dir);
    tu_write_file(path, b.p, b.n);
    ck_assert_int_eq(gguf_read_file(path, &m, h, err, ERRLEN), GGUF_OK);
    ck_assert_str_eq(m.arch, "llama");
    ck_assert_uint_eq(m.key_dim, 8);
    gguf_model_free(&m);
    xxh128(b.p, b.n, want);
    ck_assert_mem_eq(h, want, 16);
    ck_assert_int_eq(gguf_read_file(path, &m, NULL, err, ERRLEN), GGUF_OK);
    gguf_model_free(&m);
    /* an error names the path */
    b.p[4] = 9;
    tu_write_file(path, b.p, b.n);
    ck_assert_int_eq(gguf_read_file(path, &m, h, err, ERRLEN), GGUF_E_UNSUPPORTED);
    ck_assert_msg(strncmp(err, path, strlen(path)) == 0 && strstr(err, "offset 4:"), "%s", err);
    ck_assert(model_empty(&m));
    remove(path);
    ck_assert_int_eq(gguf_read_file(NULL, &m, h, err, ERRLEN), GGUF_E_ARG);
    free(b.p);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* A tensor info after the metadata (name, n_dims, dims, type, offset). */
static void gb_tensor(gb *b, const char *name, unsigned nd)
{
    gb_str(b, name);
    gb_le(b, nd, 4);
    for (unsigned d = 0; d < nd; d++)
        gb_le(b, 64, 8);
    gb_le(b, 0, 4);  /* f32 */
    gb_le(b, 0, 8);  /* offset */
}

START_TEST(vocab_and_tensor_infos)
{
    char err[ERRLEN];
    gguf_model m;
    /* the vocabulary: tokenizer.ggml.tokens' count, unless ARCH.vocab_size */
    gb b = gb_begin(3);
    llama_keys(&b);
    gb_key(&b, "tokenizer.ggml.tokens", TARR);
    gb_le(&b, TSTR, 4);
    gb_le(&b, 3, 8);
    gb_str(&b, "<unk>");
    gb_str(&b, "<s>");
    gb_str(&b, "a");
    gb_done(&b);
    ck_assert_int_eq(parse(&b, &m, err), GGUF_OK);
    ck_assert_uint_eq(m.n_vocab, 3);
    ck_assert_int_eq(m.rope_freqs, 0);
    ck_assert_int_eq(m.rope_scaled, 0);
    gguf_model_free(&m);
    kv_u32(&b, "llama.vocab_size", 512);
    gb_done(&b);
    ck_assert_int_eq(parse(&b, &m, err), GGUF_OK);
    ck_assert_uint_eq(m.n_vocab, 512);
    gguf_model_free(&m);
    free(b.p);
    b = gb_begin(3);
    llama_keys(&b);
    gb_done(&b);
    ck_assert_int_eq(parse(&b, &m, err), GGUF_OK);
    ck_assert_uint_eq(m.n_vocab, 0);
    gguf_model_free(&m);
    /* two tensor infos: a rope_freqs tensor (Llama 3.x scaling) is seen */
    size_t meta_end = b.n;
    b.p[8] = 2; /* n_tensors */
    gb_tensor(&b, "token_embd.weight", 2);
    gb_tensor(&b, "rope_freqs.weight", 1);
    ck_assert_int_eq(parse(&b, &m, err), GGUF_OK);
    ck_assert_int_eq(m.rope_freqs, 1);
    ck_assert_int_eq(m.rope_scaled, 1);
    ck_assert_int_eq(m.rope, GGUF_ROPE_NORM);
    gguf_model_free(&m);
    /* the same infos without it: not scaled; cut inside the infos: the
     * metadata still parses (a prefix), rope_freqs unknown (0) */
    b.n = meta_end;
    gb_tensor(&b, "token_embd.weight", 2);
    gb_tensor(&b, "output.weight", 2);
    ck_assert_int_eq(parse(&b, &m, err), GGUF_OK);
    ck_assert_int_eq(m.rope_freqs, 0);
    gguf_model_free(&m);
    b.n = meta_end;
    gb_tensor(&b, "token_embd.weight", 2);
    gb_tensor(&b, "rope_freqs.weight", 1);
    size_t full = b.n;
    b.n = full - 5;
    ck_assert_int_eq(parse(&b, &m, err), GGUF_OK);
    ck_assert_int_eq(m.rope_freqs, 0);
    gguf_model_free(&m);
    b.n = full;
    free(b.p);
}
END_TEST

/* gguf_read_file reads more than its first 1 MiB when the metadata is
 * longer, finds a rope_freqs tensor after it, and hashes the whole file
 * (gguf_hash_file: the same as a hash of the bytes); a file that ends in
 * the middle of its metadata is an error naming it. */
START_TEST(read_file_grows_past_1mib)
{
    char dir[] = "/tmp/test_gguf.XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[300], err[ERRLEN];
    gb b = gb_begin(3);
    llama_keys(&b);
    size_t big = (size_t)3 << 20;
    char *s = malloc(big + 1);
    ck_assert_ptr_nonnull(s);
    memset(s, 'x', big);
    s[big] = 0;
    kv_s(&b, "general.description", s);
    free(s);
    gb_done(&b);
    b.p[8] = 1;
    gb_tensor(&b, "rope_freqs.weight", 1);
    gb_raw(&b, "tensor data", 11);
    snprintf(path, sizeof path, "%s/big.gguf", dir);
    tu_write_file(path, b.p, b.n);
    gguf_model m;
    uint8_t h[16], h2[16], want[16];
    ck_assert_int_eq(gguf_read_file(path, &m, h, err, ERRLEN), GGUF_OK);
    ck_assert_uint_eq(m.n_layer, 5);
    ck_assert_int_eq(m.rope_freqs, 1);
    gguf_model_free(&m);
    xxh128(b.p, b.n, want);
    ck_assert_mem_eq(h, want, 16);
    ck_assert_int_eq(gguf_hash_file(path, h2, err, ERRLEN), GGUF_OK);
    ck_assert_mem_eq(h2, want, 16);
    /* cut in the long string: malformed, named */
    tu_write_file(path, b.p, (size_t)2 << 20);
    ck_assert_int_eq(gguf_read_file(path, &m, h, err, ERRLEN), GGUF_E_FORMAT);
    ck_assert_msg(strncmp(err, path, strlen(path)) == 0 && strstr(err, "general.description"),
                  "%s", err);
    ck_assert(model_empty(&m));
    ck_assert_int_eq(gguf_hash_file(dir, h2, err, ERRLEN), GGUF_E_IO);
    remove(path);
    free(b.p);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* the values ../shared/models/README.md states for each model */
typedef struct real_model {
    const char *file;
    uint32_t n_layer, n_embd, n_head, n_head_kv, head_dim;
} real_model;

static int check_real(const real_model *r, uint8_t hash[16])
{
    const char *src = getenv("FKVF_SRCDIR");
    char path[4096], err[ERRLEN];
    snprintf(path, sizeof path, "%s/../shared/models/%s", src ? src : ".", r->file);
    struct stat st;
    if (stat(path, &st) != 0) {
        printf("SKIP: %s absent (the model tests need ../shared/models)\n", path);
        return 0;
    }
    gguf_model m;
    int rc = gguf_read_file(path, &m, hash, err, ERRLEN);
    ck_assert_msg(rc == GGUF_OK, "%s", err);
    ck_assert_str_eq(m.arch, "llama");
    ck_assert_uint_eq(m.version, 3);
    ck_assert_uint_eq(m.n_layer, r->n_layer);
    ck_assert_uint_eq(m.n_embd, r->n_embd);
    ck_assert_uint_eq(m.n_head, r->n_head);
    ck_assert_uint_eq(m.n_head_kv, r->n_head_kv);
    ck_assert_uint_eq(m.key_dim, r->head_dim);
    ck_assert_uint_eq(m.value_dim, r->head_dim);
    ck_assert_int_eq(m.rope, GGUF_ROPE_NORM);
    ck_assert_uint_eq(m.rope_dims, r->head_dim);
    ck_assert(m.rope_theta == 10000.0);
    ck_assert_int_eq(m.rope_scaled, 0);
    ck_assert_uint_eq(m.n_vocab, 512); /* both README models: vocab 512 */
    gguf_model_free(&m);
    size_t n;
    uint8_t *d = tu_slurp(path, &n);
    uint8_t want[16];
    xxh128(d, n, want);
    free(d);
    ck_assert_mem_eq(hash, want, 16);
    return 1;
}

START_TEST(real_models)
{
    static const real_model st = {"stories260K.gguf", 5, 64, 8, 4, 8};
    static const real_model sh = {"shakespeare-hd64.gguf", 4, 128, 2, 2, 64};
    uint8_t h1[16], h2[16];
    int a = check_real(&st, h1), b = check_real(&sh, h2);
    if (a && b)
        ck_assert(memcmp(h1, h2, 16) != 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gguf");
    TCase *t = tcase_create("parse");
    tcase_add_test(t, llama_like_fields);
    tcase_add_test(t, vocab_and_tensor_infos);
    tcase_add_test(t, read_file_grows_past_1mib);
    tcase_add_test(t, qwen2_like_fields);
    tcase_add_test(t, defaults);
    tcase_add_test(t, key_length_present_vs_default);
    tcase_add_test(t, rope_scaling_variants);
    tcase_add_test(t, array_head_counts);
    tcase_add_test(t, rope_table);
    tcase_add_test(t, conditional_mrope);
    suite_add_tcase(s, t);
    t = tcase_create("errors");
    tcase_add_test(t, header_errors);
    tcase_add_test(t, duplicate_key);
    tcase_add_test(t, missing_keys);
    tcase_add_test(t, value_errors);
    tcase_add_test(t, division_errors);
    tcase_add_test(t, structure_errors);
    tcase_add_test(t, hostile_counts);
    suite_add_tcase(s, t);
    t = tcase_create("damage");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, many_keys);
    tcase_add_test(t, every_truncation_refused);
    tcase_add_test(t, every_bit_flip_handled);
    suite_add_tcase(s, t);
    t = tcase_create("files");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, read_file_errors_and_hash);
    tcase_add_test(t, real_models);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
