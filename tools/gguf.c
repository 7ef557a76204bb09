/* gguf.c - GGUF metadata (gguf.h).
 *
 * Two passes over the key/value pairs. The first walks every pair through a
 * bounds-checked cursor (every length and count checked against the bytes
 * that remain before it is used), remembers where each key starts, and
 * finds general.architecture and general.name wherever they are. The keys
 * are then sorted (O(n log n), each comparison bounded by the shorter key)
 * to refuse duplicates, and the second pass reads the values of the
 * ARCH.* keys of interest at the positions the first pass recorded. */
#define _POSIX_C_SOURCE 200809L
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- value types ------------------------------------------------------------ */

enum {
    T_U8 = 0, T_I8 = 1, T_U16 = 2, T_I16 = 3, T_U32 = 4, T_I32 = 5, T_F32 = 6,
    T_BOOL = 7, T_STRING = 8, T_ARRAY = 9, T_U64 = 10, T_I64 = 11, T_F64 = 12,
    T_COUNT = 13
};

/* bytes of a scalar value; 0 for string and array */
static size_t type_size(uint32_t t)
{
    static const unsigned char sz[T_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < T_COUNT ? sz[t] : 0;
}

static const char *type_name(uint32_t t)
{
    static const char *const nm[T_COUNT] = {"u8",  "i8",     "u16",   "i16", "u32", "i32", "f32",
                                            "bool", "string", "array", "u64", "i64", "f64"};
    return t < T_COUNT ? nm[t] : "unknown";
}

static int type_is_int(uint32_t t)
{
    return t <= T_I32 || t == T_U64 || t == T_I64;
}

/* smallest pair: u64 key length (empty key), u32 type, one-byte value */
#define MIN_PAIR 13u

/* ---- errors ----------------------------------------------------------------- */

typedef struct cur {
    const uint8_t *p;
    size_t size, pos;
    const char *name;
    char *err;
    size_t errlen;
} cur;

typedef struct str {
    const uint8_t *p;
    size_t n;
} str;

static const str NO_KEY = {NULL, 0};

/* Write "NAME: offset N: key 'K': what" (key part omitted when key.p is NULL);
 * the key is shown with bytes outside printable ASCII as '?', cut at 96. */
static int fail(const cur *c, size_t off, str key, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail(const cur *c, size_t off, str key, int code, const char *fmt, ...)
{
    if (!c->err || !c->errlen)
        return code;
    char what[256], k[112];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (key.p) {
        size_t n = key.n < 96 ? key.n : 96, j = 0;
        for (size_t i = 0; i < n; i++)
            k[j++] = (key.p[i] >= 0x20 && key.p[i] < 0x7f && key.p[i] != '\'') ? (char)key.p[i] : '?';
        if (key.n > n) {
            memcpy(k + j, "...", 3);
            j += 3;
        }
        k[j] = 0;
        snprintf(c->err, c->errlen, "%s: offset %zu: key '%s': %s", c->name, off, k, what);
    } else {
        snprintf(c->err, c->errlen, "%s: offset %zu: %s", c->name, off, what);
    }
    return code;
}

/* ---- cursor ----------------------------------------------------------------- */

static size_t left(const cur *c)
{
    return c->size - c->pos;
}

static uint64_t le(const uint8_t *b, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

/* n-byte little-endian integer; what names it in the message */
static int rd(cur *c, unsigned n, uint64_t *v, str key, const char *what)
{
    *v = 0;
    if (left(c) < n)
        return fail(c, c->pos, key, GGUF_E_FORMAT, "%s runs past the end of the data (%zu bytes left)",
                    what, left(c));
    *v = le(c->p + c->pos, n);
    c->pos += n;
    return GGUF_OK;
}

/* a string: u64 length, then the bytes (left in place) */
static int rd_str(cur *c, str *s, str key, const char *what)
{
    size_t at = c->pos;
    uint64_t n;
    int rc = rd(c, 8, &n, key, what);
    if (rc)
        return rc;
    if (n > GGUF_MAX_STRING)
        return fail(c, at, key, GGUF_E_FORMAT, "%s length %llu exceeds the limit %u", what,
                    (unsigned long long)n, GGUF_MAX_STRING);
    if (n > left(c))
        return fail(c, at, key, GGUF_E_FORMAT, "%s of %llu bytes runs past the end of the data (%zu bytes left)",
                    what, (unsigned long long)n, left(c));
    s->p = c->p + c->pos;
    s->n = (size_t)n;
    c->pos += (size_t)n;
    return GGUF_OK;
}

/* Skip a value of type t at array depth `depth` (0: the pair's own value). */
static int skip_value(cur *c, uint32_t t, unsigned depth, str key)
{
    size_t at = c->pos;
    if (t >= T_COUNT)
        return fail(c, at, key, GGUF_E_FORMAT, "unknown value type %u", t);
    if (t == T_STRING) {
        str s;
        return rd_str(c, &s, key, "string value");
    }
    if (t != T_ARRAY) {
        uint64_t v;
        char what[32];
        snprintf(what, sizeof what, "%s value", type_name(t));
        return rd(c, (unsigned)type_size(t), &v, key, what);
    }
    if (depth + 1 > GGUF_MAX_DEPTH)
        return fail(c, at, key, GGUF_E_FORMAT, "arrays nested deeper than %d", GGUF_MAX_DEPTH);
    uint64_t et, n;
    int rc = rd(c, 4, &et, key, "array element type");
    if (!rc)
        rc = rd(c, 8, &n, key, "array count");
    if (rc)
        return rc;
    if (et >= T_COUNT)
        return fail(c, at, key, GGUF_E_FORMAT, "array of unknown element type %llu", (unsigned long long)et);
    /* the least bytes one element takes: strings 8 (their length), arrays 12 */
    size_t es = et == T_STRING ? 8 : et == T_ARRAY ? 12 : type_size((uint32_t)et);
    if (n > left(c) / es)
        return fail(c, at, key, GGUF_E_FORMAT,
                    "array of %llu %s elements runs past the end of the data (%zu bytes left)",
                    (unsigned long long)n, type_name((uint32_t)et), left(c));
    if (et != T_STRING && et != T_ARRAY) {
        c->pos += (size_t)n * es; /* n * es <= left(c): no overflow */
        return GGUF_OK;
    }
    for (uint64_t i = 0; i < n; i++)
        if ((rc = skip_value(c, (uint32_t)et, depth + 1, key)) != GGUF_OK)
            return rc;
    return GGUF_OK;
}

/* ---- the rope table --------------------------------------------------------- */

/* Architecture names (llama.cpp's GGUF general.architecture strings) and how
 * each rotates keys, after llama.cpp's llama_model_rope_type. `plain` is set
 * for the architectures whose rope type depends on the model: M-RoPE when
 * ARCH.rope.dimension_sections has its first two sections > 0, else `plain`
 * (glm4, glm4moe, hunyuan_vl); gguf_rope_of_arch gives MULTI for them (it
 * sees no metadata), gguf_parse resolves them. dflash depends on metadata
 * beyond the sections (a drafter for DeepSeek-V4 or an older backbone): it
 * stays MULTI, that is refused. Sorted by name (strcmp) for bsearch. */
typedef struct arch_rope {
    const char *name;
    unsigned char rope, plain;
} arch_rope;

#define N_ GGUF_ROPE_NONE
#define R_ GGUF_ROPE_NORM
#define X_ GGUF_ROPE_NEOX
#define M_ GGUF_ROPE_MULTI
static const arch_rope ARCH_ROPE[] = {
    {"afmoe", X_, 0},          {"apertus", X_, 0},        {"arcee", R_, 0},
    {"arctic", R_, 0},         {"arwkv7", N_, 0},         {"baichuan", R_, 0},
    {"bailingmoe", R_, 0},     {"bailingmoe2", X_, 0},    {"bailingmoe3", R_, 0},
    {"bert", X_, 0},           {"bitnet", X_, 0},         {"bloom", N_, 0},
    {"chameleon", R_, 0},      {"chatglm", R_, 0},        {"clip", N_, 0},
    {"codeshell", X_, 0},      {"cogvlm", X_, 0},         {"cohere2", R_, 0},
    {"cohere2moe", R_, 0},     {"command-r", R_, 0},      {"dbrx", X_, 0},
    {"deci", R_, 0},           {"deepseek", R_, 0},       {"deepseek2", R_, 0},
    {"deepseek2-ocr", R_, 0},  {"deepseek32", R_, 0},     {"deepseek4", R_, 0},
    {"dflash", M_, 0},         {"dots1", X_, 0},          {"dots3note", R_, 0},
    {"dream", X_, 0},          {"eagle3", R_, 0},         {"ernie4_5", R_, 0},
    {"ernie4_5-moe", R_, 0},   {"eurobert", X_, 0},       {"exaone", X_, 0},
    {"exaone-moe", X_, 0},     {"exaone4", X_, 0},        {"falcon", X_, 0},
    {"falcon-h1", X_, 0},      {"gemma", X_, 0},          {"gemma-embedding", X_, 0},
    {"gemma2", X_, 0},         {"gemma3", X_, 0},         {"gemma3n", X_, 0},
    {"gemma4", X_, 0},         {"gemma4-assistant", X_, 0}, {"glm-dsa", R_, 0},
    {"glm4", M_, R_},          {"glm4moe", M_, X_},       {"gpt-oss", X_, 0},
    {"gpt2", N_, 0},           {"gptj", N_, 0},           {"gptneox", X_, 0},
    {"granite", R_, 0},        {"granite_swa", R_, 0},    {"granitehybrid", R_, 0},
    {"granitemoe", R_, 0},     {"graniteswitch", R_, 0},  {"grok", X_, 0},
    {"grovemoe", X_, 0},       {"hunyuan-dense", X_, 0},  {"hunyuan-moe", X_, 0},
    {"hunyuan_vl", M_, X_},    {"hy_v3", X_, 0},          {"internlm2", R_, 0},
    {"jais", N_, 0},           {"jais2", X_, 0},          {"jamba", N_, 0},
    {"jina-bert-v2", N_, 0},   {"jina-bert-v3", X_, 0},   {"kimi-k3", N_, 0},
    {"kimi-linear", N_, 0},    {"laguna", X_, 0},         {"lfm2", X_, 0},
    {"lfm2moe", X_, 0},        {"llada", R_, 0},          {"llada-moe", X_, 0},
    {"llama", R_, 0},          {"llama-embed", R_, 0},    {"llama4", R_, 0},
    {"maincoder", R_, 0},      {"mamba", N_, 0},          {"mamba2", N_, 0},
    {"mellum", X_, 0},         {"mimo2", X_, 0},          {"minicpm", R_, 0},
    {"minicpm3", X_, 0},       {"minimax-01", X_, 0},     {"minimax-m2", X_, 0},
    {"minimax-m3", X_, 0},     {"mistral3", R_, 0},       {"mistral4", R_, 0},
    {"modern-bert", X_, 0},    {"mpt", N_, 0},            {"muse-glimmer", R_, 0},
    {"nanbeige", R_, 0},       {"nemotron", X_, 0},       {"nemotron_h", N_, 0},
    {"nemotron_h_moe", N_, 0}, {"neo-bert", R_, 0},       {"nomic-bert", X_, 0},
    {"nomic-bert-moe", X_, 0}, {"olmo", R_, 0},           {"olmo2", X_, 0},
    {"olmoe", X_, 0},          {"openelm", X_, 0},        {"orion", X_, 0},
    {"paddleocr", M_, 0},      {"pangu-embedded", X_, 0}, {"phi2", X_, 0},
    {"phi3", X_, 0},           {"phimoe", X_, 0},         {"plamo", X_, 0},
    {"plamo2", X_, 0},         {"plamo3", X_, 0},         {"plm", R_, 0},
    {"pockettts", R_, 0},      {"qwen", X_, 0},           {"qwen2", X_, 0},
    {"qwen2moe", X_, 0},       {"qwen2vl", M_, 0},        {"qwen3", X_, 0},
    {"qwen35", M_, 0},         {"qwen35moe", M_, 0},      {"qwen3moe", X_, 0},
    {"qwen3next", X_, 0},      {"qwen3tts", M_, 0},       {"qwen3vl", M_, 0},
    {"qwen3vlmoe", M_, 0},     {"qwen4exp", M_, 0},       {"refact", N_, 0},
    {"rnd1", X_, 0},           {"rwkv6", N_, 0},          {"rwkv6qwen2", N_, 0},
    {"rwkv7", N_, 0},          {"seed_oss", X_, 0},       {"smallthinker", X_, 0},
    {"smollm3", R_, 0},        {"stablelm", X_, 0},       {"starcoder", R_, 0},
    {"starcoder2", X_, 0},     {"step35", X_, 0},         {"t5", N_, 0},
    {"t5encoder", N_, 0},      {"talkie", X_, 0},         {"wavtokenizer-dec", N_, 0},
    {"xverse", R_, 0},
};
#undef N_
#undef R_
#undef X_
#undef M_

static int arch_cmp(const void *key, const void *elem)
{
    return strcmp((const char *)key, ((const arch_rope *)elem)->name);
}

static const arch_rope *arch_find(const char *arch)
{
    if (!arch)
        return NULL;
    return bsearch(arch, ARCH_ROPE, sizeof ARCH_ROPE / sizeof ARCH_ROPE[0], sizeof ARCH_ROPE[0], arch_cmp);
}

gguf_rope gguf_rope_of_arch(const char *arch)
{
    const arch_rope *a = arch_find(arch);
    return a ? (gguf_rope)a->rope : GGUF_ROPE_UNKNOWN;
}

const char *gguf_rope_name(gguf_rope r)
{
    switch (r) {
    case GGUF_ROPE_NONE: return "none";
    case GGUF_ROPE_NORM: return "norm";
    case GGUF_ROPE_NEOX: return "neox";
    case GGUF_ROPE_MULTI: return "multi";
    case GGUF_ROPE_UNKNOWN: break;
    }
    return "unknown";
}

const char *gguf_strerror(int code)
{
    switch (code) {
    case GGUF_OK: return "success";
    case GGUF_E_ARG: return "bad argument";
    case GGUF_E_IO: return "cannot open or read the file";
    case GGUF_E_NOMEM: return "out of memory";
    case GGUF_E_FORMAT: return "not a GGUF file, or malformed";
    case GGUF_E_UNSUPPORTED: return "a model whose KV cache cannot be described";
    }
    return "unknown error";
}

/* ---- the keys of interest ---------------------------------------------------- */

enum {
    F_LAYER, F_EMBD, F_HEAD, F_HEAD_KV, F_KEY_LEN, F_VALUE_LEN, F_CTX, F_ROPE_DIMS,
    F_THETA, F_SCALE_TYPE, F_SCALE_FACTOR, F_SCALE_LINEAR, F_SECTIONS, F_VOCAB, F_COUNT
};

/* the key after "ARCH." */
static const char *const FIELD_SUFFIX[F_COUNT] = {
    "block_count",          "embedding_length",    "attention.head_count",
    "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "context_length",       "rope.dimension_count", "rope.freq_base",
    "rope.scaling.type",    "rope.scaling.factor",  "rope.scale_linear",
    "rope.dimension_sections", "vocab_size",
};

typedef struct field {
    int present;
    size_t off; /* of the key */
    str key;
    uint32_t u;   /* integer fields */
    double f;     /* float fields */
    str s;        /* rope.scaling.type */
    int mrope;    /* rope.dimension_sections: first two sections > 0 */
} field;

static int key_eq(str k, const char *s)
{
    size_t n = strlen(s);
    return k.n == n && memcmp(k.p, s, n) == 0;
}

/* One integer of type t at the cursor, as a u32 (refusing negative and
 * too large values). */
static int rd_u32_of(cur *c, uint32_t t, str key, uint32_t *out)
{
    size_t at = c->pos;
    uint64_t v;
    int rc = rd(c, (unsigned)type_size(t), &v, key, "integer value");
    if (rc)
        return rc;
    int neg = 0;
    switch (t) {
    case T_I8: neg = (v & 0x80u) != 0; break;
    case T_I16: neg = (v & 0x8000u) != 0; break;
    case T_I32: neg = (v & 0x80000000u) != 0; break;
    case T_I64: neg = (v >> 63) != 0; break;
    default: break;
    }
    if (neg)
        return fail(c, at, key, GGUF_E_FORMAT, "negative %s value", type_name(t));
    if (v > UINT32_MAX)
        return fail(c, at, key, GGUF_E_FORMAT, "value %llu exceeds 4294967295",
                    (unsigned long long)v);
    *out = (uint32_t)v;
    return GGUF_OK;
}

/* The head of an array value of integers (the value of `key` starts at
 * `at`): its element type into *et, its count into *n. */
static int rd_int_array_head(cur *c, size_t at, str key, uint64_t *et, uint64_t *n)
{
    int rc = rd(c, 4, et, key, "array element type");
    if (!rc)
        rc = rd(c, 8, n, key, "array count");
    if (rc)
        return rc;
    if (*et >= T_COUNT || !type_is_int((uint32_t)*et))
        return fail(c, at, key, GGUF_E_FORMAT, "array of %s where integers were expected",
                    type_name((uint32_t)*et));
    return GGUF_OK;
}

/* an integer, or (head counts) an array of integers whose values are equal */
static int rd_count(cur *c, uint32_t t, str key, int array_ok, uint32_t *out)
{
    size_t at = c->pos;
    if (type_is_int(t))
        return rd_u32_of(c, t, key, out);
    if (t != T_ARRAY || !array_ok)
        return fail(c, at, key, GGUF_E_FORMAT, "%s value where an integer%s was expected",
                    type_name(t), array_ok ? " or an array of integers" : "");
    uint64_t et, n;
    int rc = rd_int_array_head(c, at, key, &et, &n);
    if (rc)
        return rc;
    if (n == 0)
        return fail(c, at, key, GGUF_E_FORMAT, "empty array");
    for (uint64_t i = 0; i < n; i++) {
        size_t eat = c->pos;
        uint32_t v;
        if ((rc = rd_u32_of(c, (uint32_t)et, key, &v)) != GGUF_OK)
            return rc;
        if (i == 0)
            *out = v;
        else if (v != *out)
            return fail(c, eat, key, GGUF_E_UNSUPPORTED,
                        "per-layer head counts differ (%u at index 0, %u at index %llu)", *out, v,
                        (unsigned long long)i);
    }
    return GGUF_OK;
}

static int rd_float(cur *c, uint32_t t, str key, double *out)
{
    size_t at = c->pos;
    uint64_t v;
    int rc;
    if (t == T_F32) {
        if ((rc = rd(c, 4, &v, key, "f32 value")) != GGUF_OK)
            return rc;
        uint32_t b = (uint32_t)v;
        float f;
        memcpy(&f, &b, sizeof f);
        *out = f;
    } else if (t == T_F64) {
        if ((rc = rd(c, 8, &v, key, "f64 value")) != GGUF_OK)
            return rc;
        memcpy(out, &v, sizeof *out);
    } else {
        return fail(c, at, key, GGUF_E_FORMAT, "%s value where f32 or f64 was expected", type_name(t));
    }
    if (!isfinite(*out))
        return fail(c, at, key, GGUF_E_FORMAT, "not a finite number");
    return GGUF_OK;
}

/* rope.dimension_sections: an array of integers; M-RoPE when the first two
 * are > 0 (as llama.cpp decides) */
static int rd_sections(cur *c, uint32_t t, str key, int *mrope)
{
    size_t at = c->pos;
    if (t != T_ARRAY)
        return fail(c, at, key, GGUF_E_FORMAT, "%s value where an array of integers was expected",
                    type_name(t));
    uint64_t et, n;
    int rc = rd_int_array_head(c, at, key, &et, &n);
    if (rc)
        return rc;
    size_t es = type_size((uint32_t)et);
    if (n > left(c) / es)
        return fail(c, at, key, GGUF_E_FORMAT, "array runs past the end of the data");
    int pos = 0;
    for (uint64_t i = 0; i < n && i < 2; i++) {
        uint64_t v = le(c->p + c->pos + (size_t)i * es, (unsigned)es);
        int neg = (et == T_I8 || et == T_I16 || et == T_I32 || et == T_I64) && (v >> (8 * es - 1)) != 0;
        pos += !neg && v != 0;
    }
    *mrope = pos == 2;
    return GGUF_OK;
}

static int read_field(cur *c, int id, uint32_t t, field *f)
{
    switch (id) {
    case F_HEAD:
    case F_HEAD_KV: return rd_count(c, t, f->key, 1, &f->u);
    case F_THETA:
    case F_SCALE_FACTOR:
    case F_SCALE_LINEAR: return rd_float(c, t, f->key, &f->f);
    case F_SCALE_TYPE:
        if (t != T_STRING)
            return fail(c, c->pos, f->key, GGUF_E_FORMAT, "%s value where a string was expected",
                        type_name(t));
        return rd_str(c, &f->s, f->key, "string value");
    case F_SECTIONS: return rd_sections(c, t, f->key, &f->mrope);
    default: return rd_count(c, t, f->key, 0, &f->u);
    }
}

/* ---- parse ------------------------------------------------------------------- */

static int ptr_key_cmp(const void *a, const void *b)
{
    const uint8_t *x = *(const uint8_t *const *)a, *y = *(const uint8_t *const *)b;
    size_t nx = (size_t)le(x, 8), ny = (size_t)le(y, 8);
    int r = memcmp(x + 8, y + 8, nx < ny ? nx : ny);
    if (r)
        return r;
    if (nx != ny)
        return nx < ny ? -1 : 1;
    return x < y ? -1 : x > y; /* equal keys: file order */
}

static char *dup_str(str s)
{
    char *p = malloc(s.n + 1);
    if (p) {
        memcpy(p, s.p, s.n);
        p[s.n] = 0;
    }
    return p;
}

void gguf_model_free(gguf_model *m)
{
    if (!m)
        return;
    free(m->arch);
    free(m->name);
    memset(m, 0, sizeof *m);
}

/* A string value of one of the general.* keys we copy: a string, no NUL. */
static int general_str(cur *c, uint32_t t, size_t vat, str key, str *out)
{
    if (t != T_STRING)
        return fail(c, vat, key, GGUF_E_FORMAT, "%s value where a string was expected", type_name(t));
    cur v = *c;
    v.pos = vat;
    int rc = rd_str(&v, out, key, "string value");
    if (rc)
        return rc;
    if (memchr(out->p, 0, out->n))
        return fail(c, vat, key, GGUF_E_FORMAT, "string holds a NUL byte");
    return GGUF_OK;
}

/* The tensor infos after the metadata (name, u32 n_dims, u64 dims[n_dims],
 * u32 type, u64 offset each), scanned for a tensor named rope_freqs.weight;
 * 1 when every info was in the data, 0 when they run past it (the caller
 * may read more of the file). Malformed infos end the scan: the metadata
 * is all this module reads. */
static int scan_tensor_infos(const cur *c0, size_t at, gguf_model *m)
{
    cur c = *c0;
    c.err = NULL; /* no message: the scan does not fail the parse */
    c.pos = at;
    for (uint64_t i = 0; i < m->n_tensors; i++) {
        str name;
        uint64_t nd, v;
        if (left(&c) >= 8 && le(c.p + c.pos, 8) > GGUF_MAX_STRING)
            return 1; /* malformed: the scan ends */
        if (rd_str(&c, &name, NO_KEY, "tensor name") || rd(&c, 4, &nd, NO_KEY, "n_dims"))
            return 0; /* ran out of data */
        if (nd > 64)
            return 1;
        for (uint64_t d = 0; d < nd + 2; d++) /* dims, then type (4) and offset (8) */
            if (rd(&c, d == nd ? 4 : 8, &v, NO_KEY, "tensor info"))
                return 0;
        if (key_eq(name, "rope_freqs.weight"))
            m->rope_freqs = 1;
    }
    return 1;
}

static int parse(cur *c, gguf_model *m, const uint8_t **keys, int *complete)
{
    int rc;
    uint64_t v;
    if (c->size < 4 || memcmp(c->p, "GGUF", 4) != 0)
        return fail(c, 0, NO_KEY, GGUF_E_FORMAT, "not a GGUF file (no magic \"GGUF\")");
    c->pos = 4;
    if ((rc = rd(c, 4, &v, NO_KEY, "version")) != GGUF_OK)
        return rc;
    if (v == 1)
        return fail(c, 4, NO_KEY, GGUF_E_UNSUPPORTED,
                    "GGUF version 1 is not supported (an old format llama.cpp no longer reads); versions 2 and 3 are");
    if ((v & 0xffffu) == 0 && (v >> 24 == 2 || v >> 24 == 3))
        return fail(c, 4, NO_KEY, GGUF_E_UNSUPPORTED, "a big-endian GGUF file (version %u byte-swapped): not supported",
                    (unsigned)(v >> 24));
    if (v == 0 || v > 3)
        return fail(c, 4, NO_KEY, v == 0 ? GGUF_E_FORMAT : GGUF_E_UNSUPPORTED,
                    "GGUF version %llu is not supported (versions 2 and 3 are)", (unsigned long long)v);
    m->version = (uint32_t)v;
    if ((rc = rd(c, 8, &m->n_tensors, NO_KEY, "tensor count")) != GGUF_OK)
        return rc;
    size_t kvat = c->pos;
    if ((rc = rd(c, 8, &m->n_kv, NO_KEY, "metadata count")) != GGUF_OK)
        return rc;
    if (m->n_kv > GGUF_MAX_KV)
        return fail(c, kvat, NO_KEY, GGUF_E_FORMAT, "metadata count %llu exceeds the limit %u",
                    (unsigned long long)m->n_kv, GGUF_MAX_KV);
    if (m->n_kv > left(c) / MIN_PAIR)
        return fail(c, kvat, NO_KEY, GGUF_E_FORMAT,
                    "metadata count %llu needs at least %llu bytes, %zu are left",
                    (unsigned long long)m->n_kv, (unsigned long long)m->n_kv * MIN_PAIR, left(c));
    size_t n = (size_t)m->n_kv;

    /* pass 1: walk the pairs */
    str arch = {NULL, 0}, name = {NULL, 0};
    size_t arch_at = 0;
    uint32_t n_tokens = 0;
    for (size_t i = 0; i < n; i++) {
        size_t kat = c->pos;
        str key;
        if ((rc = rd_str(c, &key, NO_KEY, "key")) != GGUF_OK)
            return rc;
        keys[i] = c->p + kat;
        uint64_t t;
        if ((rc = rd(c, 4, &t, key, "value type")) != GGUF_OK)
            return rc;
        if (t >= T_COUNT)
            return fail(c, c->pos - 4, key, GGUF_E_FORMAT, "unknown value type %llu", (unsigned long long)t);
        size_t vat = c->pos;
        if ((rc = skip_value(c, (uint32_t)t, 0, key)) != GGUF_OK)
            return rc;
        if (key_eq(key, "general.architecture")) {
            if ((rc = general_str(c, (uint32_t)t, vat, key, &arch)) != GGUF_OK)
                return rc;
            arch_at = kat;
        } else if (key_eq(key, "general.name")) {
            if ((rc = general_str(c, (uint32_t)t, vat, key, &name)) != GGUF_OK)
                return rc;
        } else if (key_eq(key, "tokenizer.ggml.tokens") && t == T_ARRAY) {
            /* the vocabulary's size: the array's count (skip_value checked it) */
            uint64_t cnt = le(c->p + vat + 4, 8);
            n_tokens = cnt > UINT32_MAX ? UINT32_MAX : (uint32_t)cnt;
        }
    }
    size_t end = c->pos;

    /* duplicates */
    if (n > 1) {
        qsort(keys, n, sizeof *keys, ptr_key_cmp);
        for (size_t i = 1; i < n; i++) {
            const uint8_t *a = keys[i - 1], *b = keys[i];
            size_t na = (size_t)le(a, 8), nb = (size_t)le(b, 8);
            if (na == nb && memcmp(a + 8, b + 8, na) == 0)
                return fail(c, (size_t)(b - c->p), (str){b + 8, nb}, GGUF_E_FORMAT,
                            "duplicate key (first at offset %zu)", (size_t)(a - c->p));
        }
    }

    if (!arch.p)
        return fail(c, end, (str){(const uint8_t *)"general.architecture", 20}, GGUF_E_UNSUPPORTED,
                    "missing from the metadata");
    if (arch.n == 0)
        return fail(c, arch_at, (str){(const uint8_t *)"general.architecture", 20}, GGUF_E_UNSUPPORTED,
                    "empty");
    if (!(m->arch = dup_str(arch)) || (name.p && !(m->name = dup_str(name))))
        return fail(c, 0, NO_KEY, GGUF_E_NOMEM, "out of memory");

    /* pass 2: the ARCH.* values */
    field f[F_COUNT];
    memset(f, 0, sizeof f);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *k = keys[i];
        size_t kn = (size_t)le(k, 8);
        if (kn <= arch.n + 1 || memcmp(k + 8, arch.p, arch.n) != 0 || k[8 + arch.n] != '.')
            continue;
        str suffix = {k + 8 + arch.n + 1, kn - arch.n - 1};
        int id = 0;
        while (id < F_COUNT && !key_eq(suffix, FIELD_SUFFIX[id]))
            id++;
        if (id == F_COUNT)
            continue;
        cur vc = *c;
        vc.pos = (size_t)(k - c->p) + 8 + kn;
        uint64_t t;
        (void)rd(&vc, 4, &t, NO_KEY, "value type"); /* read in pass 1 */
        f[id].present = 1;
        f[id].off = (size_t)(k - c->p);
        f[id].key = (str){k + 8, kn};
        if ((rc = read_field(&vc, id, (uint32_t)t, &f[id])) != GGUF_OK)
            return rc;
    }

    /* what the cache needs */
    char kbuf[F_COUNT][128];
    for (int id = 0; id < F_COUNT; id++)
        if (!f[id].present) {
            snprintf(kbuf[id], sizeof kbuf[id], "%s.%s", m->arch, FIELD_SUFFIX[id]);
            f[id].key = (str){(const uint8_t *)kbuf[id], strlen(kbuf[id])};
            f[id].off = end;
        }
    static const int required[] = {F_LAYER, F_EMBD, F_HEAD};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++) {
        const field *r = &f[required[i]];
        if (!r->present)
            return fail(c, r->off, r->key, GGUF_E_UNSUPPORTED, "missing from the metadata");
        if (r->u == 0)
            return fail(c, r->off, r->key, GGUF_E_UNSUPPORTED, "is 0; must be >= 1");
    }
    m->n_layer = f[F_LAYER].u;
    m->n_embd = f[F_EMBD].u;
    m->n_head = f[F_HEAD].u;
    m->n_head_kv = f[F_HEAD_KV].present ? f[F_HEAD_KV].u : m->n_head;
    if (m->n_head_kv == 0)
        return fail(c, f[F_HEAD_KV].off, f[F_HEAD_KV].key, GGUF_E_UNSUPPORTED, "is 0; must be >= 1");
    if (m->n_head % m->n_head_kv)
        return fail(c, f[F_HEAD_KV].off, f[F_HEAD_KV].key, GGUF_E_UNSUPPORTED,
                    "%u KV heads do not divide the %u query heads", m->n_head_kv, m->n_head);
    for (int id = F_KEY_LEN; id <= F_VALUE_LEN; id++) {
        uint32_t *d = id == F_KEY_LEN ? &m->key_dim : &m->value_dim;
        if (f[id].present) {
            if (f[id].u == 0)
                return fail(c, f[id].off, f[id].key, GGUF_E_UNSUPPORTED, "is 0; must be >= 1");
            *d = f[id].u;
        } else {
            if (m->n_embd % m->n_head)
                return fail(c, f[id].off, f[id].key, GGUF_E_UNSUPPORTED,
                            "absent, and the default embedding_length / head_count (%u / %u) is not whole",
                            m->n_embd, m->n_head);
            if (m->n_embd / m->n_head == 0)
                return fail(c, f[id].off, f[id].key, GGUF_E_UNSUPPORTED,
                            "absent, and the default embedding_length / head_count (%u / %u) is 0",
                            m->n_embd, m->n_head);
            *d = m->n_embd / m->n_head;
        }
    }
    m->context_length = f[F_CTX].present ? f[F_CTX].u : 0;

    const arch_rope *ar = arch_find(m->arch);
    m->rope = ar ? (gguf_rope)ar->rope : GGUF_ROPE_UNKNOWN;
    if (ar && ar->plain && !(f[F_SECTIONS].present && f[F_SECTIONS].mrope))
        m->rope = (gguf_rope)ar->plain;
    m->rope_dims = f[F_ROPE_DIMS].present ? f[F_ROPE_DIMS].u : m->key_dim;
    if (m->rope == GGUF_ROPE_NORM || m->rope == GGUF_ROPE_NEOX) {
        const field *r = &f[F_ROPE_DIMS];
        if (m->rope_dims == 0 || m->rope_dims % 2 || m->rope_dims > m->key_dim)
            return fail(c, r->off, r->key, GGUF_E_UNSUPPORTED,
                        "%u rotated dimensions%s: must be even, >= 2 and <= the key length %u",
                        m->rope_dims, r->present ? "" : " (the default, the key length)", m->key_dim);
    }
    m->rope_theta = f[F_THETA].present ? f[F_THETA].f : 10000.0;
    if (!(m->rope_theta > 0))
        return fail(c, f[F_THETA].off, f[F_THETA].key, GGUF_E_FORMAT, "%g: must be > 0", m->rope_theta);

    /* scaled: a scaling type other than none (linear with a factor of 1, or
     * none given, is not), or a factor / scale_linear other than 1 (0 is
     * llama.cpp's "not set") */
    int scaled = 0;
    for (int id = F_SCALE_FACTOR; id <= F_SCALE_LINEAR; id++)
        if (f[id].present && f[id].f != 0 && f[id].f != 1)
            scaled = 1;
    if (f[F_SCALE_TYPE].present) {
        str s = f[F_SCALE_TYPE].s;
        if (!key_eq(s, "none") && !key_eq(s, "linear"))
            scaled = 1;
    }
    m->n_vocab = f[F_VOCAB].present ? f[F_VOCAB].u : n_tokens;
    *complete = scan_tensor_infos(c, end, m);
    m->rope_scaled = scaled || m->rope_freqs;
    return GGUF_OK;
}

/* gguf_parse, saying whether the tensor infos were all in the data. */
static int parse_data(const void *data, size_t size, const char *name, gguf_model *out,
                      char *err, size_t errlen, int *complete)
{
    *complete = 0;
    if (err && errlen)
        err[0] = 0;
    cur c = {data, size, 0, name ? name : "(gguf)", err, errlen};
    if (!out)
        return fail(&c, 0, NO_KEY, GGUF_E_ARG, "no output model");
    memset(out, 0, sizeof *out);
    if (!data && size)
        return fail(&c, 0, NO_KEY, GGUF_E_ARG, "no data");
    if (!data)
        c.p = (const uint8_t *)"";
    /* the key positions: the count is bounded by the data's size (parse
     * checks n_kv against it before the array is used) */
    const uint8_t **keys = NULL;
    if (size >= 24) {
        uint64_t nkv = le(c.p + 16, 8);
        size_t cap = (size - 24) / MIN_PAIR;
        if (nkv <= GGUF_MAX_KV && nkv <= cap && nkv > 0) {
            keys = malloc((size_t)nkv * sizeof *keys);
            if (!keys)
                return fail(&c, 16, NO_KEY, GGUF_E_NOMEM, "out of memory for %llu keys",
                            (unsigned long long)nkv);
        }
    }
    int rc = parse(&c, out, keys, complete);
    free(keys);
    if (rc)
        gguf_model_free(out);
    return rc;
}

int gguf_parse(const void *data, size_t size, const char *name, gguf_model *out, char *err,
               size_t errlen)
{
    int complete;
    return parse_data(data, size, name, out, err, errlen, &complete);
}

/* ---- files ------------------------------------------------------------------- */

/* Open path for reading (a FIFO without a writer must not block: O_NONBLOCK)
 * and check it is a non-empty regular file; its size into *size. */
static int open_model(const char *path, size_t *size, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    const char *why = NULL;
    int code = GGUF_E_IO, e = 0;
    struct stat st;
    if (fd < 0) {
        e = errno;
        why = "cannot open";
    } else if (fstat(fd, &st) != 0) {
        e = errno;
        why = "cannot stat";
    } else if (S_ISDIR(st.st_mode)) {
        why = "is a directory, not a GGUF file";
    } else if (!S_ISREG(st.st_mode)) {
        why = "not a regular file";
    } else if (st.st_size == 0) {
        why = "empty file, not a GGUF file";
        code = GGUF_E_FORMAT;
    } else if ((uintmax_t)st.st_size > SIZE_MAX) {
        why = "too large";
    }
    if (!why) {
        *size = (size_t)st.st_size;
        return fd;
    }
    if (err && errlen)
        snprintf(err, errlen, e ? "%s: %s: %s" : "%s: %s", path, why, e ? strerror(e) : "");
    if (fd >= 0)
        close(fd);
    return -code;
}

/* Read bytes [have, want) of fd into buf. */
static int read_more(int fd, const char *path, uint8_t *buf, size_t have, size_t want, char *err,
                     size_t errlen)
{
    while (have < want) {
        ssize_t r = pread(fd, buf + have, want - have, (off_t)have);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r <= 0) {
            if (err && errlen)
                snprintf(err, errlen, "%s: offset %zu: %s", path, have,
                         r < 0 ? strerror(errno) : "the file ends early (it shrank while read)");
            return GGUF_E_IO;
        }
        have += (size_t)r;
    }
    return GGUF_OK;
}

int gguf_read_file(const char *path, gguf_model *out, uint8_t hash[16], char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (out)
        memset(out, 0, sizeof *out);
    if (!path || !out) {
        if (err && errlen)
            snprintf(err, errlen, "%s: no path or no output model", path ? path : "(null)");
        return GGUF_E_ARG;
    }
    size_t size = 0;
    int fd = open_model(path, &size, err, errlen);
    if (fd < 0)
        return -fd;
    /* as much of the start as the metadata and tensor infos take: from
     * 1 MiB, four times more while the parse runs out of data */
    size_t cap = size < GGUF_MAX_HEADER ? size : GGUF_MAX_HEADER;
    size_t n = cap < ((size_t)1 << 20) ? cap : ((size_t)1 << 20), have = 0;
    uint8_t *buf = NULL;
    int rc;
    for (;;) {
        uint8_t *nb = realloc(buf, n);
        if (!nb) {
            if (err && errlen)
                snprintf(err, errlen, "%s: out of memory for %zu bytes", path, n);
            rc = GGUF_E_NOMEM;
            break;
        }
        buf = nb;
        if ((rc = read_more(fd, path, buf, have, n, err, errlen)) != GGUF_OK)
            break;
        have = n;
        int complete;
        rc = parse_data(buf, n, path, out, err, errlen, &complete);
        if (n == cap || (rc == GGUF_OK && complete) ||
            (rc != GGUF_OK && rc != GGUF_E_FORMAT))
            break;
        /* ran out of data (or malformed: known once the whole start is read) */
        gguf_model_free(out);
        n = cap / 4 < n ? cap : n * 4;
    }
    if (rc == GGUF_E_FORMAT && n == GGUF_MAX_HEADER && size > n)
        snprintf(err, errlen, "%s: the metadata does not end in the first %u MiB (the limit)",
                 path, GGUF_MAX_HEADER >> 20);
    free(buf);
    close(fd);
    if (rc == GGUF_OK && hash && (rc = gguf_hash_file(path, hash, err, errlen)) != GGUF_OK)
        gguf_model_free(out);
    return rc;
}

int gguf_hash_file(const char *path, uint8_t hash[16], char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!path || !hash) {
        if (err && errlen)
            snprintf(err, errlen, "%s: no path or no hash", path ? path : "(null)");
        return GGUF_E_ARG;
    }
    size_t size = 0;
    int fd = open_model(path, &size, err, errlen);
    if (fd < 0)
        return -fd;
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = malloc(CHUNK);
    XXH3_state_t *st = XXH3_createState();
    int rc = GGUF_OK;
    if (!buf || !st || XXH3_128bits_reset(st) != XXH_OK) {
        if (err && errlen)
            snprintf(err, errlen, "%s: out of memory", path);
        rc = GGUF_E_NOMEM;
    }
    for (size_t at = 0; rc == GGUF_OK && at < size;) {
        size_t want = size - at < CHUNK ? size - at : CHUNK;
        ssize_t r = pread(fd, buf, want, (off_t)at);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r <= 0) {
            if (err && errlen)
                snprintf(err, errlen, "%s: offset %zu: %s", path, at,
                         r < 0 ? strerror(errno) : "the file ends early (it shrank while read)");
            rc = GGUF_E_IO;
            break;
        }
        XXH3_128bits_update(st, buf, (size_t)r);
        at += (size_t)r;
    }
    if (rc == GGUF_OK) {
        XXH128_canonical_t cn;
        XXH128_canonicalFromHash(&cn, XXH3_128bits_digest(st));
        memcpy(hash, cn.digest, 16);
    }
    XXH3_freeState(st);
    free(buf);
    close(fd);
    return rc;
}
