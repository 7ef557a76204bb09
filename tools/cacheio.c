/*
 * cacheio.c - raw KV-cache import/export (.safetensors, .npy, .npz; see
 * cacheio.h and docs/cache-files.md): messages, small helpers and the
 * in-memory cache (init/free/check/equal/metadata). cacheio_impl.h lists
 * the module's other sources.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>

#include "cacheio_impl.h"

/* Write "FILE: <message>" into the caller's buffer; returns code. */
int KVIO_PRINTF(3, 4) cio_fail(const ctx *x, int code, const char *fmt, ...)
{
    if (x->err && x->errlen) {
        int n = snprintf(x->err, x->errlen, "%s: ", x->file ? x->file : "(input)");
        if (n < 0)
            n = 0;
        if ((size_t)n < x->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(x->err + n, x->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return code;
}

shown cio_show(const char *s)
{
    shown o;
    size_t k = 0;
    if (!s)
        s = "";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (k > sizeof o.s - 8) {
            memcpy(o.s + k, "...", 4);
            return o;
        }
        if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\') {
            snprintf(o.s + k, 5, "\\x%02x", c);
            k += 4;
        } else {
            o.s[k++] = (char)c;
        }
    }
    o.s[k] = 0;
    return o;
}

shape_str cio_fmt_shape(const uint64_t *dims, size_t ndim)
{
    shape_str o;
    size_t k = 0;
    o.s[k++] = '[';
    for (size_t i = 0; i < ndim; i++) {
        if (i == KVIO_MAX_NDIM) {
            k += (size_t)snprintf(o.s + k, sizeof o.s - k, ", ... (%zu dims)", ndim);
            break;
        }
        k += (size_t)snprintf(o.s + k, sizeof o.s - k, "%s%" PRIu64, i ? ", " : "", dims[i]);
    }
    if (k < sizeof o.s - 1) {
        o.s[k++] = ']';
        o.s[k] = 0;
    }
    return o;
}

/* Strict UTF-8: no overlongs, no surrogates, <= U+10FFFF. Returns the length
 * of the sequence at p (1..4), 0 if invalid or cut by `avail`. */
size_t cio_utf8_seq(const uint8_t *p, size_t avail)
{
    uint8_t c = p[0];
    if (c < 0x80)
        return 1;
    size_t n;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2, cp = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3, cp = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4, cp = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (avail < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

static int utf8_valid(const char *s)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = cio_utf8_seq(p + i, n - i);
        if (!k)
            return 0;
        i += k;
    }
    return 1;
}

const char *kvio_strerror(int code)
{
    switch (code) {
    case KVIO_OK: return "ok";
    case KVIO_E_ARG: return "invalid argument";
    case KVIO_E_IO: return "I/O error";
    case KVIO_E_NOMEM: return "out of memory";
    case KVIO_E_FORMAT: return "malformed file";
    case KVIO_E_UNSUPPORTED: return "unsupported content";
    case KVIO_E_CONVENTION: return "tensors do not form a KV cache";
    case KVIO_E_EXISTS: return "the file exists";
    default: return "unknown error";
    }
}

size_t kvio_dtype_size(fkvf_dtype dtype)
{
    switch (dtype) {
    case FKVF_DTYPE_F16:
    case FKVF_DTYPE_BF16: return 2;
    case FKVF_DTYPE_F32: return 4;
    default: return 0;
    }
}

const char *kvio_dtype_name(fkvf_dtype dtype)
{
    switch (dtype) {
    case FKVF_DTYPE_F16: return "f16";
    case FKVF_DTYPE_BF16: return "bf16";
    case FKVF_DTYPE_F32: return "f32";
    default: return "?";
    }
}

const char *kvio_format_name(kvio_format fmt)
{
    switch (fmt) {
    case KVIO_FMT_SAFETENSORS: return "safetensors";
    case KVIO_FMT_NPY: return "npy";
    case KVIO_FMT_NPZ: return "npz";
    default: return "auto";
    }
}

const char *kvio_names_name(kvio_names names)
{
    switch (names) {
    case KVIO_NAMES_NONE: return "none";
    case KVIO_NAMES_FKVF: return "fkvf";
    case KVIO_NAMES_HF: return "hf";
    case KVIO_NAMES_HF_LEGACY: return "hf-legacy";
    case KVIO_NAMES_HF_DYNAMIC: return "hf-dynamic";
    case KVIO_NAMES_LLAMA: return "llama.cpp";
    default: return "?";
    }
}

int kvio_names_is_hf(kvio_names names)
{
    return names == KVIO_NAMES_HF || names == KVIO_NAMES_HF_LEGACY || names == KVIO_NAMES_HF_DYNAMIC;
}

/* What a Hugging Face model call takes or returns next to its cache, and
 * what people save with it. */
static const char *const COMPANIONS[] = {"attention_mask", "position_ids", "cache_position",
                                         "token_type_ids", "logits"};

int kvio_is_companion(const char *name)
{
    for (size_t i = 0; name && i < sizeof COMPANIONS / sizeof COMPANIONS[0]; i++)
        if (!strcmp(name, COMPANIONS[i]))
            return 1;
    return 0;
}

static uint64_t layer_bytes(const kvio_cache *c, uint32_t dim)
{
    uint64_t n;
    if (!mul_ok(c->n_kv_heads, c->n_positions, &n) || !mul_ok(n, dim, &n) ||
        !mul_ok(n, kvio_dtype_size(c->dtype), &n))
        return 0;
    return n;
}

uint64_t kvio_key_bytes(const kvio_cache *c) { return layer_bytes(c, c->key_dim); }

uint64_t kvio_value_bytes(const kvio_cache *c) { return layer_bytes(c, c->value_dim); }

int kvio_in_map(const kvio_cache *c, const void *p)
{
    /* compared as addresses: p is either in the mapping or a heap block */
    uintptr_t a = (uintptr_t)p, m = (uintptr_t)c->map;
    return c->map && p && a >= m && a - m < c->map_size;
}

void kvio_cache_drop_data(kvio_cache *c)
{
    if (!c)
        return;
    for (uint32_t i = 0; i < c->n_layers; i++) {
        if (c->keys && !kvio_in_map(c, c->keys[i]))
            free(c->keys[i]);
        if (c->values && !kvio_in_map(c, c->values[i]))
            free(c->values[i]);
        if (c->keys)
            c->keys[i] = NULL;
        if (c->values)
            c->values[i] = NULL;
    }
    if (c->map)
        munmap(c->map, c->map_size);
    c->map = NULL;
    c->map_size = 0;
    cio_lazy_free(c->lazy);
    c->lazy = NULL;
}

void kvio_cache_free(kvio_cache *c)
{
    if (!c)
        return;
    kvio_cache_drop_data(c);
    free(c->keys);
    free(c->values);
    free(c->tokens);
    for (size_t i = 0; i < c->n_meta; i++) {
        free(c->meta[i].key);
        free(c->meta[i].value);
    }
    free(c->meta);
    for (size_t i = 0; i < KVIO_MAX_IGNORED; i++)
        free(c->ignored[i]);
    memset(c, 0, sizeof *c);
}

/* kvio_cache_init's shape and layer arrays; the layers' data when with_data. */
static int init_shape(const ctx *x, kvio_cache *c, uint32_t n_layers, uint32_t n_kv_heads,
                      uint32_t n_positions, uint32_t key_dim, uint32_t value_dim,
                      fkvf_dtype dtype, int with_data)
{
    memset(c, 0, sizeof *c);
    if (!kvio_dtype_size(dtype))
        return cio_fail(x, KVIO_E_ARG, "unknown dtype %d", (int)dtype);
    if (!n_layers || !n_kv_heads || !key_dim || !value_dim)
        return cio_fail(x, KVIO_E_ARG, "layers, kv_heads and dims must be >= 1");
    c->n_kv_heads = n_kv_heads;
    c->n_positions = n_positions;
    c->key_dim = key_dim;
    c->value_dim = value_dim;
    c->dtype = dtype;
    uint64_t kb = kvio_key_bytes(c), vb = kvio_value_bytes(c);
    if ((n_positions && (!kb || !vb)) || (with_data && (kb > SIZE_MAX || vb > SIZE_MAX)))
        return cio_fail(x, KVIO_E_ARG, "layer size overflows");
    c->keys = calloc(n_layers, sizeof *c->keys);
    c->values = calloc(n_layers, sizeof *c->values);
    if (!c->keys || !c->values) {
        kvio_cache_free(c);
        return cio_fail(x, KVIO_E_NOMEM, "out of memory");
    }
    c->n_layers = n_layers;
    for (uint32_t i = 0; with_data && i < n_layers; i++) {
        c->keys[i] = calloc(kb ? (size_t)kb : 1, 1);
        c->values[i] = calloc(vb ? (size_t)vb : 1, 1);
        if (!c->keys[i] || !c->values[i]) {
            kvio_cache_free(c);
            return cio_fail(x, KVIO_E_NOMEM, "out of memory for %u layers of %" PRIu64 " bytes",
                            n_layers, kb + vb);
        }
    }
    return KVIO_OK;
}

/* The token ids of an initialised cache (zero-filled), when with_tokens. */
static int init_tokens(const ctx *x, kvio_cache *c, int with_tokens)
{
    c->token_width = 8;
    if (!with_tokens)
        return KVIO_OK;
    c->tokens = calloc(c->n_positions ? c->n_positions : 1, sizeof *c->tokens);
    if (!c->tokens) {
        kvio_cache_free(c);
        return cio_fail(x, KVIO_E_NOMEM, "out of memory");
    }
    return KVIO_OK;
}

int kvio_cache_init(kvio_cache *c, uint32_t n_layers, uint32_t n_kv_heads, uint32_t n_positions,
                    uint32_t key_dim, uint32_t value_dim, fkvf_dtype dtype, int with_tokens,
                    char *err, size_t errlen)
{
    ctx x = {"(cache)", err, errlen};
    if (!c)
        return cio_fail(&x, KVIO_E_ARG, "no cache given");
    int rc = init_shape(&x, c, n_layers, n_kv_heads, n_positions, key_dim, value_dim, dtype, 1);
    return rc ? rc : init_tokens(&x, c, with_tokens);
}

int kvio_cache_init_source(kvio_cache *c, uint32_t n_layers, uint32_t n_kv_heads,
                           uint32_t n_positions, uint32_t key_dim, uint32_t value_dim,
                           fkvf_dtype dtype, int with_tokens, const kvio_source *src, char *err,
                           size_t errlen)
{
    ctx x = {src && src->name ? src->name : "(cache)", err, errlen};
    int rc = !c ? cio_fail(&x, KVIO_E_ARG, "no cache given")
                : init_shape(&x, c, n_layers, n_kv_heads, n_positions, key_dim, value_dim,
                             dtype, 0);
    if (rc) {
        if (src && src->free)
            src->free(src->opaque);
        return rc;
    }
    if ((rc = cio_lazy_set(&x, c, src)) != KVIO_OK) {
        kvio_cache_free(c);
        return rc;
    }
    return init_tokens(&x, c, with_tokens);
}


int kvio_cache_set_meta(kvio_cache *c, const char *key, const char *value)
{
    if (!c || !key || !value)
        return KVIO_E_ARG;
    char *v = dupstr(value);
    if (!v)
        return KVIO_E_NOMEM;
    for (size_t i = 0; i < c->n_meta; i++)
        if (!strcmp(c->meta[i].key, key)) {
            free(c->meta[i].value);
            c->meta[i].value = v;
            return KVIO_OK;
        }
    char *k = dupstr(key);
    kvio_meta *m = realloc(c->meta, (c->n_meta + 1) * sizeof *m);
    if (!k || !m) {
        free(k);
        free(v);
        if (m)
            c->meta = m;
        return KVIO_E_NOMEM;
    }
    c->meta = m;
    m[c->n_meta].key = k;
    m[c->n_meta].value = v;
    c->n_meta++;
    return KVIO_OK;
}

const char *kvio_cache_get_meta(const kvio_cache *c, const char *key)
{
    for (size_t i = 0; c && key && i < c->n_meta; i++)
        if (!strcmp(c->meta[i].key, key))
            return c->meta[i].value;
    return NULL;
}

/* kvio_cache_check: dtype and dimensions. */
static int check_dims(const ctx *x, const kvio_cache *c)
{
    if (!kvio_dtype_size(c->dtype))
        return cio_fail(x, KVIO_E_ARG, "unknown dtype %d", (int)c->dtype);
    if (!c->n_layers || !c->n_kv_heads || !c->key_dim || !c->value_dim)
        return cio_fail(x, KVIO_E_ARG, "layers (%u), kv_heads (%u), key_dim (%u) and value_dim (%u) must be >= 1",
                        c->n_layers, c->n_kv_heads, c->key_dim, c->value_dim);
    uint64_t kb = kvio_key_bytes(c), vb = kvio_value_bytes(c);
    if ((c->n_positions && (!kb || !vb)) || kb > SIZE_MAX || vb > SIZE_MAX)
        return cio_fail(x, KVIO_E_ARG, "layer size overflows");
    return KVIO_OK;
}

/* kvio_cache_check: dtype, dimensions, and data for every layer. */
static int check_layers(const ctx *x, const kvio_cache *c)
{
    int rc = check_dims(x, c);
    if (rc)
        return rc;
    uint64_t kb = kvio_key_bytes(c), vb = kvio_value_bytes(c);
    if (!c->keys || !c->values)
        return cio_fail(x, KVIO_E_ARG, "no key/value arrays");
    for (uint32_t i = 0; i < c->n_layers; i++)
        if ((kb && !c->keys[i]) || (vb && !c->values[i]))
            return cio_fail(x, KVIO_E_ARG, "layer %u has no data", i);
    return KVIO_OK;
}

/* kvio_cache_check: token width, and token ids >= 0 that fit it. */
static int check_tokens(const ctx *x, const kvio_cache *c)
{
    if (c->token_width != 0 && c->token_width != 4 && c->token_width != 8)
        return cio_fail(x, KVIO_E_ARG, "token_width %u (must be 4 or 8)", c->token_width);
    for (uint32_t t = 0; c->tokens && t < c->n_positions; t++) {
        if (c->tokens[t] < 0)
            return cio_fail(x, KVIO_E_ARG, "token id %" PRId64 " at position %u is negative", c->tokens[t], t);
        if (c->token_width == 4 && c->tokens[t] > INT32_MAX)
            return cio_fail(x, KVIO_E_ARG, "token id %" PRId64 " at position %u does not fit int32",
                            c->tokens[t], t);
    }
    return KVIO_OK;
}

/* kvio_cache_check: metadata entries are UTF-8, unique, not "__metadata__". */
static int check_meta(const ctx *x, const kvio_cache *c)
{
    for (size_t i = 0; i < c->n_meta; i++) {
        if (!c->meta || !c->meta[i].key || !c->meta[i].value)
            return cio_fail(x, KVIO_E_ARG, "metadata entry %zu is NULL", i);
        if (!utf8_valid(c->meta[i].key) || !utf8_valid(c->meta[i].value))
            return cio_fail(x, KVIO_E_ARG, "metadata entry '%s' is not valid UTF-8", cio_show(c->meta[i].key).s);
        if (!strcmp(c->meta[i].key, "__metadata__"))
            return cio_fail(x, KVIO_E_ARG, "metadata key '__metadata__' is reserved");
        for (size_t j = 0; j < i; j++)
            if (!strcmp(c->meta[i].key, c->meta[j].key))
                return cio_fail(x, KVIO_E_ARG, "duplicate metadata key '%s'", cio_show(c->meta[i].key).s);
    }
    return KVIO_OK;
}

int cio_check_shape(const ctx *x, const kvio_cache *c)
{
    int rc;
    if ((rc = check_dims(x, c)) || (rc = check_meta(x, c)))
        return rc;
    if (c->token_width != 0 && c->token_width != 4 && c->token_width != 8)
        return cio_fail(x, KVIO_E_ARG, "token_width %u (must be 4 or 8)", c->token_width);
    return KVIO_OK;
}

int kvio_cache_check(const kvio_cache *c, char *err, size_t errlen)
{
    ctx x = {"(cache)", err, errlen};
    int rc;
    if (!c)
        return cio_fail(&x, KVIO_E_ARG, "no cache given");
    if ((rc = check_layers(&x, c)) || (rc = check_tokens(&x, c)) || (rc = check_meta(&x, c)))
        return rc;
    return KVIO_OK;
}

int kvio_cache_equal(const kvio_cache *a, const kvio_cache *b)
{
    if (a->n_layers != b->n_layers || a->n_kv_heads != b->n_kv_heads ||
        a->n_positions != b->n_positions || a->key_dim != b->key_dim ||
        a->value_dim != b->value_dim || a->dtype != b->dtype || !a->tokens != !b->tokens ||
        a->lazy || b->lazy)
        return 0;
    size_t kb = (size_t)kvio_key_bytes(a), vb = (size_t)kvio_value_bytes(a);
    for (uint32_t i = 0; i < a->n_layers; i++)
        if ((kb && memcmp(a->keys[i], b->keys[i], kb)) || (vb && memcmp(a->values[i], b->values[i], vb)))
            return 0;
    if (a->tokens && a->n_positions &&
        memcmp(a->tokens, b->tokens, (size_t)a->n_positions * sizeof *a->tokens))
        return 0;
    return 1;
}
