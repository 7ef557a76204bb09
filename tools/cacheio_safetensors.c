/*
 * cacheio_safetensors.c - .safetensors (docs/cache-files.md section 3):
 * the reader with its own strict minimal JSON parser of the header, and the
 * writer.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cacheio_impl.h"

static const struct {
    const char *name;
    size_t size;
    int type;
} ST_DTYPES[] = {
    {"F16", 2, T_F16},     {"BF16", 2, T_BF16},    {"F32", 4, T_F32},     {"I32", 4, T_I32},
    {"I64", 8, T_I64},     {"F64", 8, T_OTHER},    {"I8", 1, T_OTHER},    {"U8", 1, T_OTHER},
    {"BOOL", 1, T_OTHER},  {"I16", 2, T_OTHER},    {"U16", 2, T_OTHER},   {"U32", 4, T_OTHER},
    {"U64", 8, T_OTHER},   {"F8_E4M3", 1, T_OTHER}, {"F8_E5M2", 1, T_OTHER}, {"F8_E8M0", 1, T_OTHER},
};

/* JSON parser state over the header bytes s[0..n) (file offset base + i). */
typedef struct jp {
    const ctx *x;
    const uint8_t *s;
    size_t n, i, base;
    char *arena; /* decoded strings; n + 1 bytes always suffice */
    size_t used;
    const char *tensor; /* current tensor name for messages, or NULL */
} jp;

static int KVIO_PRINTF(3, 4) jfail(jp *j, int code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (j->tensor)
        return cio_fail(j->x, code, "tensor '%s': header byte %zu: %s", cio_show(j->tensor).s, j->base + j->i, msg);
    return cio_fail(j->x, code, "header byte %zu: %s", j->base + j->i, msg);
}

static void jws(jp *j)
{
    while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r'))
        j->i++;
}

static int jpeek(jp *j) { return j->i < j->n ? j->s[j->i] : -1; }

/* Complain about an unexpected character where `what` was expected. */
static int junexpected(jp *j, const char *what)
{
    int c = jpeek(j);
    if (c < 0)
        return jfail(j, KVIO_E_FORMAT, "header ends where %s was expected", what);
    if (c == '{' || c == '[')
        return jfail(j, KVIO_E_FORMAT,
                     "value nested too deep: expected %s (a safetensors header holds only strings, "
                     "integer arrays and one level of objects)",
                     what);
    if (c >= 0x20 && c < 0x7f)
        return jfail(j, KVIO_E_FORMAT, "expected %s, found '%c'", what, c);
    return jfail(j, KVIO_E_FORMAT, "expected %s, found byte 0x%02x", what, (unsigned)c);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int jhex4(jp *j, size_t at, uint32_t *v)
{
    *v = 0;
    for (size_t k = 0; k < 4; k++) {
        if (at + k >= j->n)
            return jfail(j, KVIO_E_FORMAT, "unterminated string (header ends inside a \\u escape)");
        int h = hexval(j->s[at + k]);
        if (h < 0)
            return jfail(j, KVIO_E_FORMAT, "bad \\u escape: '%c' is not a hex digit",
                         j->s[at + k] >= 0x20 && j->s[at + k] < 0x7f ? j->s[at + k] : '?');
        *v = (*v << 4) | (uint32_t)h;
    }
    return KVIO_OK;
}

/* The \uXXXX escape at j->i (a surrogate pair joined) as a code point in
 * *cp, never NUL; j->i moves past it. */
static int ju_escape(jp *j, uint32_t *cp)
{
    uint32_t lo;
    int rc;
    if ((rc = jhex4(j, j->i + 2, cp)))
        return rc;
    j->i += 6;
    if (*cp >= 0xDC00 && *cp <= 0xDFFF)
        return jfail(j, KVIO_E_FORMAT, "bad \\u escape: unpaired low surrogate U+%04X", (unsigned)*cp);
    if (*cp >= 0xD800 && *cp <= 0xDBFF) {
        if (j->i + 1 >= j->n || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u')
            return jfail(j, KVIO_E_FORMAT, "bad \\u escape: high surrogate U+%04X without its low half",
                         (unsigned)*cp);
        if ((rc = jhex4(j, j->i + 2, &lo)))
            return rc;
        if (lo < 0xDC00 || lo > 0xDFFF)
            return jfail(j, KVIO_E_FORMAT, "bad \\u escape: U+%04X cannot follow high surrogate U+%04X",
                         (unsigned)lo, (unsigned)*cp);
        j->i += 6;
        *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    if (*cp == 0)
        return jfail(j, KVIO_E_FORMAT, "\\u0000 (NUL) is not allowed in a string");
    return KVIO_OK;
}

/* Code point cp (<= U+10FFFF) as UTF-8 at o + *k. */
static void put_utf8(char *o, size_t *k, uint32_t cp)
{
    if (cp < 0x80) {
        o[(*k)++] = (char)cp;
    } else if (cp < 0x800) {
        o[(*k)++] = (char)(0xC0 | (cp >> 6));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xE0 | (cp >> 12));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        o[(*k)++] = (char)(0xF0 | (cp >> 18));
        o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* The escape at j->i (a backslash inside the string that starts at
 * `start`) decoded to o + *k; j->i moves past it. */
static int jescape(jp *j, size_t start, char *o, size_t *k)
{
    if (j->i + 1 >= j->n) {
        j->i = start;
        return jfail(j, KVIO_E_FORMAT, "unterminated string (header ends after a backslash)");
    }
    uint8_t e = j->s[j->i + 1];
    char simple = 0;
    switch (e) {
    case '"': simple = '"'; break;
    case '\\': simple = '\\'; break;
    case '/': simple = '/'; break;
    case 'b': simple = '\b'; break;
    case 'f': simple = '\f'; break;
    case 'n': simple = '\n'; break;
    case 'r': simple = '\r'; break;
    case 't': simple = '\t'; break;
    case 'u': break;
    default:
        if (e >= 0x20 && e < 0x7f)
            return jfail(j, KVIO_E_FORMAT, "bad escape '\\%c' in a string", e);
        return jfail(j, KVIO_E_FORMAT, "bad escape (backslash then byte 0x%02x) in a string", e);
    }
    if (simple) {
        o[(*k)++] = simple;
        j->i += 2;
        return KVIO_OK;
    }
    uint32_t cp;
    int rc = ju_escape(j, &cp);
    if (rc)
        return rc;
    put_utf8(o, k, cp);
    return KVIO_OK;
}

/* Parse a JSON string at j->i (which must be '"') into the arena. */
static int jstring(jp *j, const char **out)
{
    if (jpeek(j) != '"')
        return junexpected(j, "a string");
    size_t start = j->i;
    char *o = j->arena + j->used;
    size_t k = 0;
    int rc;
    j->i++;
    for (;;) {
        if (j->i >= j->n) {
            j->i = start;
            return jfail(j, KVIO_E_FORMAT, "unterminated string");
        }
        uint8_t c = j->s[j->i];
        if (c == '"') {
            j->i++;
            break;
        }
        if (c < 0x20)
            return jfail(j, KVIO_E_FORMAT, "control character 0x%02x inside a string", c);
        if (c == '\\') {
            if ((rc = jescape(j, start, o, &k)))
                return rc;
            continue;
        }
        if (c >= 0x80) {
            size_t m = cio_utf8_seq(j->s + j->i, j->n - j->i);
            if (!m)
                return jfail(j, KVIO_E_FORMAT, "invalid UTF-8 inside a string");
            memcpy(o + k, j->s + j->i, m);
            k += m;
            j->i += m;
            continue;
        }
        o[k++] = (char)c;
        j->i++;
    }
    o[k] = 0;
    j->used += k + 1; /* k + 1 <= bytes consumed, so the arena never overflows */
    *out = o;
    return KVIO_OK;
}

/* A non-negative JSON integer that fits 64 bits. */
static int ju64(jp *j, uint64_t *v, const char *what)
{
    int c = jpeek(j);
    if (c == '-')
        return jfail(j, KVIO_E_FORMAT, "negative number in %s", what);
    if (c < '0' || c > '9')
        return junexpected(j, what);
    if (c == '0' && j->i + 1 < j->n && j->s[j->i + 1] >= '0' && j->s[j->i + 1] <= '9')
        return jfail(j, KVIO_E_FORMAT, "number with a leading zero in %s", what);
    uint64_t r = 0;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
        unsigned d = (unsigned)(j->s[j->i] - '0');
        if (r > (UINT64_MAX - d) / 10)
            return jfail(j, KVIO_E_FORMAT, "number too large (over 2^64-1) in %s", what);
        r = r * 10 + d;
        j->i++;
    }
    c = jpeek(j);
    if (c == '.' || c == 'e' || c == 'E')
        return jfail(j, KVIO_E_FORMAT, "%s must hold integers", what);
    *v = r;
    return KVIO_OK;
}

static int jexpect(jp *j, char c, const char *what)
{
    jws(j);
    if (jpeek(j) != c)
        return junexpected(j, what);
    j->i++;
    return KVIO_OK;
}

/* After an element: ',' (returns 1) or the closing char (returns 0). */
static int jnext(jp *j, char close, int *more)
{
    jws(j);
    int c = jpeek(j);
    if (c == ',') {
        j->i++;
        jws(j);
        if (jpeek(j) == close)
            return jfail(j, KVIO_E_FORMAT, "trailing comma before '%c'", close);
        *more = 1;
        return KVIO_OK;
    }
    if (c == close) {
        j->i++;
        *more = 0;
        return KVIO_OK;
    }
    return junexpected(j, close == '}' ? "',' or '}'" : "',' or ']'");
}

/* The "key": of an object member into the arena (*key_at: where it starts,
 * for messages); j->i moves to the value. */
static int jkey(jp *j, const char **key, size_t *key_at)
{
    int rc;
    jws(j);
    *key_at = j->i;
    if ((rc = jstring(j, key)) || (rc = jexpect(j, ':', "':'")))
        return rc;
    jws(j);
    return KVIO_OK;
}

/* The `open` of an array or object at j->i (`what` names it in the message
 * if it is not there); *more is 0 when `close` follows at once. */
static int jopen(jp *j, char open, char close, const char *what, int *more)
{
    if (jpeek(j) != open)
        return junexpected(j, what);
    j->i++;
    jws(j);
    *more = 1;
    if (jpeek(j) == close) {
        j->i++;
        *more = 0;
    }
    return KVIO_OK;
}

static int parse_meta(jp *j, kvio_meta **meta, size_t *n_meta)
{
    int rc, more;
    size_t cap = 0;
    jws(j);
    if ((rc = jopen(j, '{', '}', "an object for __metadata__", &more)))
        return rc;
    while (more) {
        const char *k, *v;
        size_t key_at;
        if ((rc = jkey(j, &k, &key_at)))
            return rc;
        if (jpeek(j) != '"')
            return junexpected(j, "a string (__metadata__ values are strings)");
        if ((rc = jstring(j, &v)))
            return rc;
        if (*n_meta == cap) {
            cap = cap ? 2 * cap : 8;
            kvio_meta *m = realloc(*meta, cap * sizeof *m);
            if (!m)
                return cio_fail(j->x, KVIO_E_NOMEM, "out of memory");
            *meta = m;
        }
        (*meta)[*n_meta].key = (char *)(uintptr_t)k; /* arena pointers; copied at the end */
        (*meta)[*n_meta].value = (char *)(uintptr_t)v;
        (*n_meta)++;
        if ((rc = jnext(j, '}', &more)))
            return rc;
    }
    return KVIO_OK;
}

/* The fields of a tensor's object, as bits of what was seen. */
enum { F_DTYPE = 1, F_SHAPE = 2, F_OFFS = 4 };

/* The element count of a shape while it is parsed: the product of the
 * dimensions, whether it overflowed, whether a dimension is 0 (then the
 * count is 0, however large the others). */
typedef struct st_count {
    uint64_t count;
    int overflow, zero;
} st_count;

/* "dtype": one of ST_DTYPES. */
static int parse_dtype(jp *j, kv_tensor *t)
{
    const char *d;
    int rc;
    if (jpeek(j) != '"')
        return junexpected(j, "a string for dtype");
    if ((rc = jstring(j, &d)))
        return rc;
    for (size_t k = 0; k < sizeof ST_DTYPES / sizeof ST_DTYPES[0]; k++)
        if (!strcmp(d, ST_DTYPES[k].name)) {
            snprintf(t->dtype_name, sizeof t->dtype_name, "%s", ST_DTYPES[k].name);
            t->type = ST_DTYPES[k].type;
            t->esize = ST_DTYPES[k].size;
            return KVIO_OK;
        }
    return cio_fail(j->x, KVIO_E_UNSUPPORTED, "tensor '%s': unknown dtype '%s'", cio_show(t->name).s,
                    cio_show(d).s);
}

/* "shape": an array of integers (the first KVIO_MAX_NDIM kept, all counted). */
static int parse_shape(jp *j, kv_tensor *t, st_count *c)
{
    int rc, more;
    if ((rc = jopen(j, '[', ']', "an array of integers for shape", &more)))
        return rc;
    while (more) {
        uint64_t v;
        jws(j);
        if ((rc = ju64(j, &v, "shape")))
            return rc;
        if (t->ndim < KVIO_MAX_NDIM)
            t->dims[t->ndim] = v;
        t->ndim++;
        if (v == 0)
            c->zero = 1;
        else if (!mul_ok(c->count, v, &c->count))
            c->overflow = 1;
        if ((rc = jnext(j, ']', &more)))
            return rc;
    }
    return KVIO_OK;
}

/* "data_offsets": [begin, end], exactly two integers. */
static int parse_offsets(jp *j, kv_tensor *t)
{
    int rc;
    if (jpeek(j) != '[')
        return junexpected(j, "[begin, end] for data_offsets");
    j->i++;
    jws(j);
    if ((rc = ju64(j, &t->begin, "data_offsets")) || (rc = jexpect(j, ',', "',' in data_offsets [begin, end]")))
        return rc;
    jws(j);
    if ((rc = ju64(j, &t->end, "data_offsets")) ||
        (rc = jexpect(j, ']', "']' closing data_offsets (exactly two numbers)")))
        return rc;
    return KVIO_OK;
}

/* One "field": value member of a tensor's object; each field at most once. */
static int parse_tensor_field(jp *j, kv_tensor *t, unsigned *seen, st_count *c)
{
    const char *key;
    size_t key_at;
    int rc;
    if ((rc = jkey(j, &key, &key_at)))
        return rc;
    unsigned f = !strcmp(key, "dtype") ? F_DTYPE : !strcmp(key, "shape") ? F_SHAPE
               : !strcmp(key, "data_offsets") ? F_OFFS : 0;
    if (!f) {
        j->i = key_at;
        return jfail(j, KVIO_E_FORMAT, "unknown field '%s' (expected dtype, shape, data_offsets)",
                     cio_show(key).s);
    }
    if (*seen & f) {
        j->i = key_at;
        return jfail(j, KVIO_E_FORMAT, "duplicate field '%s'", key);
    }
    *seen |= f;
    return f == F_DTYPE ? parse_dtype(j, t) : f == F_SHAPE ? parse_shape(j, t, c) : parse_offsets(j, t);
}

/* A parsed tensor: every field present, its offsets inside the data region
 * and as many bytes between them as its shape and dtype need. */
static int check_tensor(const ctx *x, kv_tensor *t, unsigned seen, st_count c, uint64_t data_len)
{
    const char *missing = !(seen & F_DTYPE) ? "dtype" : !(seen & F_SHAPE) ? "shape"
                        : !(seen & F_OFFS) ? "data_offsets" : NULL;
    if (missing)
        return cio_fail(x, KVIO_E_FORMAT, "tensor '%s': missing field '%s'", cio_show(t->name).s, missing);
    if (t->begin > t->end)
        return cio_fail(x, KVIO_E_FORMAT, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "]: begin is after end",
                        cio_show(t->name).s, t->begin, t->end);
    if (t->end > data_len)
        return cio_fail(x, KVIO_E_FORMAT,
                        "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] run past the end of the data region (%" PRIu64 " bytes)",
                        cio_show(t->name).s, t->begin, t->end, data_len);
    uint64_t need;
    if (c.zero)
        c.count = 0, c.overflow = 0;
    if (c.overflow || !mul_ok(c.count, t->esize, &need))
        return cio_fail(x, KVIO_E_FORMAT, "tensor '%s': shape %s of %s overflows 64 bits",
                        cio_show(t->name).s, cio_fmt_shape(t->dims, t->ndim).s, t->dtype_name);
    if (need != t->end - t->begin)
        return cio_fail(x, KVIO_E_FORMAT,
                        "tensor '%s': shape %s of %s needs %" PRIu64 " bytes but data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64,
                        cio_show(t->name).s, cio_fmt_shape(t->dims, t->ndim).s, t->dtype_name, need, t->begin,
                        t->end, t->end - t->begin);
    t->nbytes = need;
    return KVIO_OK;
}

/* A tensor's object: {"dtype": ..., "shape": [...], "data_offsets": [b, e]}. */
static int parse_tensor(jp *j, kv_tensor *t, uint64_t data_len)
{
    unsigned seen = 0;
    int rc, more;
    st_count c = {1, 0, 0};
    j->tensor = t->name;
    jws(j);
    if ((rc = jopen(j, '{', '}', "an object describing the tensor", &more)))
        return rc;
    while (more)
        if ((rc = parse_tensor_field(j, t, &seen, &c)) || (rc = jnext(j, '}', &more)))
            return rc;
    j->tensor = NULL;
    return check_tensor(j->x, t, seen, c, data_len);
}

static int cmp_by_offset(const void *a, const void *b)
{
    const kv_tensor *const *x = a, *const *y = b;
    if ((*x)->begin != (*y)->begin)
        return (*x)->begin < (*y)->begin ? -1 : 1;
    if ((*x)->end != (*y)->end)
        return (*x)->end < (*y)->end ? -1 : 1;
    return 0;
}

/* The tensors must tile [0, data_len) exactly: no overlap, no gap. */
static int check_coverage(const ctx *x, kv_tensor *t, size_t n, uint64_t data_len)
{
    int rc = KVIO_OK;
    kv_tensor **p = malloc((n ? n : 1) * sizeof *p);
    if (!p)
        return cio_fail(x, KVIO_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        p[i] = &t[i];
    qsort(p, n, sizeof *p, cmp_by_offset);
    uint64_t at = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (p[i]->begin < at)
            rc = cio_fail(x, KVIO_E_FORMAT,
                      "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] overlap tensor '%s' [%" PRIu64 ", %" PRIu64 "]",
                      cio_show(p[i]->name).s, p[i]->begin, p[i]->end, cio_show(p[i - 1]->name).s,
                      p[i - 1]->begin, p[i - 1]->end);
        else if (p[i]->begin > at)
            rc = cio_fail(x, KVIO_E_FORMAT,
                      "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] leave bytes [%" PRIu64 ", %" PRIu64 ") of the data region unused",
                      cio_show(p[i]->name).s, p[i]->begin, p[i]->end, at, p[i]->begin);
        at = p[i]->end;
    }
    if (!rc && at != data_len)
        rc = n ? cio_fail(x, KVIO_E_FORMAT,
                      "tensor '%s': ends at %" PRIu64 " but the data region is %" PRIu64 " bytes (unused bytes at the end)",
                      cio_show(p[n - 1]->name).s, at, data_len)
               : cio_fail(x, KVIO_E_FORMAT, "no tensors, but %" PRIu64 " bytes of data", data_len);
    free(p);
    return rc;
}

static int cmp_meta(const void *a, const void *b)
{
    const kvio_meta *x = a, *y = b;
    return strcmp(x->key, y->key);
}

/* The 8-byte header length: the header lies inside the file, within
 * KVIO_MAX_ST_HEADER, and can hold a JSON object. */
static int st_header_length(const ctx *x, const uint8_t *d, size_t size, uint64_t *hlen)
{
    if (size < 8)
        return cio_fail(x, KVIO_E_FORMAT,
                        "file is %zu bytes; a safetensors file starts with an 8-byte header length", size);
    *hlen = rd64(d);
    if (*hlen > size - 8)
        return cio_fail(x, KVIO_E_FORMAT, "header length %" PRIu64 " runs past the end of the file (%zu bytes)",
                        *hlen, size);
    if (*hlen > KVIO_MAX_ST_HEADER)
        return cio_fail(x, KVIO_E_FORMAT, "header length %" PRIu64 " exceeds the limit of %u bytes", *hlen,
                        KVIO_MAX_ST_HEADER);
    if (*hlen < 2)
        return cio_fail(x, KVIO_E_FORMAT, "header length %" PRIu64 " is too small for a JSON object", *hlen);
    return KVIO_OK;
}

/* What the header object holds, as it is parsed. */
typedef struct st_header {
    kv_tensor *t; /* the tensors, in header order */
    size_t n, cap;
    kvio_meta *meta; /* __metadata__: keys and values point into the arena */
    size_t n_meta;
    int seen_meta;
    uint64_t data_len;     /* bytes of the data region after the header */
    const uint8_t *region; /* its first byte */
} st_header;

/* One member of the header object: "__metadata__" (at most once) or a
 * tensor. */
static int st_member(jp *j, st_header *h)
{
    const char *key;
    size_t key_at;
    int rc;
    if ((rc = jkey(j, &key, &key_at)))
        return rc;
    if (!strcmp(key, "__metadata__")) {
        if (h->seen_meta) {
            j->i = key_at;
            return jfail(j, KVIO_E_FORMAT, "duplicate __metadata__");
        }
        h->seen_meta = 1;
        return parse_meta(j, &h->meta, &h->n_meta);
    }
    if (h->n == h->cap) {
        size_t nc = h->cap ? 2 * h->cap : 16;
        kv_tensor *nt = realloc(h->t, nc * sizeof *nt);
        if (!nt)
            return cio_fail(j->x, KVIO_E_NOMEM, "out of memory");
        h->t = nt;
        h->cap = nc;
    }
    kv_tensor *t = &h->t[h->n];
    memset(t, 0, sizeof *t);
    t->name = key;
    if ((rc = parse_tensor(j, t, h->data_len)))
        return rc;
    t->data = h->region + t->begin;
    h->n++;
    return KVIO_OK;
}

/* The header: one JSON object, then nothing but spaces. */
static int st_header_object(jp *j, st_header *h)
{
    int rc, more;
    if ((rc = jopen(j, '{', '}', "'{' (the header must start with a JSON object)", &more)))
        return rc;
    while (more)
        if ((rc = st_member(j, h)) || (rc = jnext(j, '}', &more)))
            return rc;
    jws(j);
    if (j->i != j->n)
        return jfail(j, KVIO_E_FORMAT, "unexpected data after the header object (only spaces may pad it)");
    return KVIO_OK;
}

/* __metadata__ (n_meta entries pointing into the arena; sorted here) with
 * unique keys, as owned copies in *out (NULL when there is none). */
static int st_own_meta(const ctx *x, kvio_meta *meta, size_t n_meta, kvio_meta **out)
{
    *out = NULL;
    if (!n_meta)
        return KVIO_OK;
    qsort(meta, n_meta, sizeof *meta, cmp_meta);
    for (size_t i = 1; i < n_meta; i++)
        if (!strcmp(meta[i - 1].key, meta[i].key))
            return cio_fail(x, KVIO_E_FORMAT, "__metadata__: duplicate key '%s'", cio_show(meta[i].key).s);
    kvio_meta *m = calloc(n_meta, sizeof *m);
    if (!m)
        return cio_fail(x, KVIO_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n_meta; i++) {
        m[i].key = dupstr(meta[i].key);
        m[i].value = dupstr(meta[i].value);
        if (!m[i].key || !m[i].value) {
            for (size_t k = 0; k <= i; k++) {
                free(m[k].key);
                free(m[k].value);
            }
            free(m);
            return cio_fail(x, KVIO_E_NOMEM, "out of memory");
        }
    }
    *out = m;
    return KVIO_OK;
}

int kvio_read_safetensors_mem(const void *data, size_t size, const char *name, unsigned flags,
                              kvio_cache *out, char *err, size_t errlen)
{
    ctx x = {name, err, errlen};
    const uint8_t *d = data;
    st_header h;
    kvio_meta *final_meta = NULL;
    uint64_t hlen = 0;
    int rc;
    jp j = {0};
    if (!out)
        return cio_fail(&x, KVIO_E_ARG, "no output cache");
    memset(out, 0, sizeof *out);
    if (!d && size)
        return cio_fail(&x, KVIO_E_ARG, "no data");
    if ((rc = st_header_length(&x, d, size, &hlen)))
        return rc;
    memset(&h, 0, sizeof h);
    h.data_len = size - 8 - hlen;
    h.region = d + 8 + hlen;
    j.x = &x;
    j.s = d + 8;
    j.n = (size_t)hlen;
    j.base = 8;
    j.arena = malloc(j.n + 1);
    if (!j.arena)
        return cio_fail(&x, KVIO_E_NOMEM, "out of memory for a %zu-byte header", j.n);
    if (!(rc = st_header_object(&j, &h)) && !(rc = cio_check_duplicates(&x, h.t, h.n)) &&
        !(rc = check_coverage(&x, h.t, h.n, h.data_len)) &&
        !(rc = st_own_meta(&x, h.meta, h.n_meta, &final_meta))) {
        ign_list ign;
        memset(&ign, 0, sizeof ign);
        rc = cio_assemble(&x, h.t, h.n, flags, final_meta, h.n_meta, &ign, out);
    }
    free(h.meta);
    free(h.t);
    free(j.arena);
    return rc;
}

static void sk_json_string(sink *s, const char *str)
{
    cio_sk_put(s, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)str; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char e[2] = {'\\', (char)*p};
            cio_sk_put(s, e, 2);
        } else if (*p < 0x20) {
            cio_sk_printf(s, "\\u%04x", *p);
        } else {
            cio_sk_put(s, p, 1);
        }
    }
    cio_sk_put(s, "\"", 1);
}

static void sk_tensor(sink *s, const kvio_cache *c, const out_tensor *o)
{
    if (o->is_tokens)
        cio_sk_tokens(s, c, token_width(c));
    else
        cio_sk_kv(s, c, o);
}

static const char *st_dtype(fkvf_dtype d)
{
    return d == FKVF_DTYPE_F16 ? "F16" : d == FKVF_DTYPE_BF16 ? "BF16" : "F32";
}

int cio_st_header(const ctx *x, sink *s, const kvio_cache *c, int with_tokens, unsigned flags)
{
    sink h = {0};
    uint64_t off = 0;
    size_t nt = 2 * (size_t)c->n_layers + (with_tokens ? 1 : 0);
    cio_sk_put(&h, "{", 1);
    if (c->n_meta) {
        cio_sk_put(&h, "\"__metadata__\":{", 16);
        for (size_t i = 0; i < c->n_meta; i++) {
            if (i)
                cio_sk_put(&h, ",", 1);
            sk_json_string(&h, c->meta[i].key);
            cio_sk_put(&h, ":", 1);
            sk_json_string(&h, c->meta[i].value);
        }
        cio_sk_put(&h, "}", 1);
    }
    for (size_t i = 0; i < nt; i++) {
        out_tensor o;
        if (i < 2 * (size_t)c->n_layers)
            cio_out_kv(c, flags, (uint32_t)(i / 2), (int)(i % 2), &o);
        else
            cio_out_tok(c, flags, &o);
        if (i || c->n_meta)
            cio_sk_put(&h, ",", 1);
        cio_sk_printf(&h, "\"%s\":{\"dtype\":\"%s\",\"shape\":[", o.name,
                  o.is_tokens ? (token_width(c) == 4 ? "I32" : "I64") : st_dtype(c->dtype));
        for (size_t k = 0; k < o.ndim; k++)
            cio_sk_printf(&h, "%s%" PRIu64, k ? "," : "", o.dims[k]);
        cio_sk_printf(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, off + o.nbytes);
        off += o.nbytes;
    }
    cio_sk_put(&h, "}", 1);
    while (!h.rc && (8 + h.len) % 8)
        cio_sk_put(&h, " ", 1);
    if (h.rc) {
        free(h.buf);
        return cio_fail(x, h.rc, "cannot build the header");
    }
    if (h.len > KVIO_MAX_ST_HEADER) {
        free(h.buf);
        return cio_fail(x, KVIO_E_ARG, "header of %zu bytes exceeds the %u-byte limit", h.len, KVIO_MAX_ST_HEADER);
    }
    uint8_t le[8];
    wr64(le, h.len);
    cio_sk_put(s, le, 8);
    cio_sk_put(s, h.buf, h.len);
    free(h.buf);
    return KVIO_OK;
}

int cio_write_safetensors(const ctx *x, sink *s, const kvio_cache *c, unsigned flags)
{
    size_t nt = 2 * (size_t)c->n_layers + (c->tokens ? 1 : 0);
    int rc = cio_st_header(x, s, c, c->tokens != NULL, flags);
    if (rc)
        return rc;
    for (size_t i = 0; i < nt && !s->rc; i++) {
        out_tensor o;
        if (i < 2 * (size_t)c->n_layers)
            cio_out_kv(c, flags, (uint32_t)(i / 2), (int)(i % 2), &o);
        else
            cio_out_tok(c, flags, &o);
        sk_tensor(s, c, &o);
    }
    return s->rc ? cio_fail(x, s->rc, "write failed: %s", s->rc == KVIO_E_IO ? strerror(errno) : "out of memory")
                 : KVIO_OK;
}
