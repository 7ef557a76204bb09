/*
 * cacheio.c - raw KV-cache import/export: .safetensors (own parser),
 * .npy, and .npz through libarchive. See cacheio.h and docs/cache-files.md.
 *
 * Layout of this file:
 *   1. messages, small helpers (little-endian, overflow-checked arithmetic)
 *   2. the in-memory cache (init/free/check/equal/metadata)
 *   3. the naming convention: from a list of tensors to a cache
 *   4. safetensors reader (strict minimal JSON)
 *   5. .npy header parser and the single-array .npy reader
 *   6. .npz reader (libarchive)
 *   7. writers (safetensors, npy, npz)
 *   8. files: mmap, format detection, atomic writes
 */
#define _POSIX_C_SOURCE 200809L
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cacheio_impl.h"

/* ======================================================================== */
/* 1. messages and helpers                                                   */
/* ======================================================================== */

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

/* ======================================================================== */
/* 2. the in-memory cache                                                    */
/* ======================================================================== */

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

void kvio_cache_free(kvio_cache *c)
{
    if (!c)
        return;
    for (uint32_t i = 0; i < c->n_layers; i++) {
        if (c->keys)
            free(c->keys[i]);
        if (c->values)
            free(c->values[i]);
    }
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

int kvio_cache_init(kvio_cache *c, uint32_t n_layers, uint32_t n_kv_heads, uint32_t n_positions,
                    uint32_t key_dim, uint32_t value_dim, fkvf_dtype dtype, int with_tokens,
                    char *err, size_t errlen)
{
    ctx x = {"(cache)", err, errlen};
    if (!c)
        return cio_fail(&x, KVIO_E_ARG, "no cache given");
    memset(c, 0, sizeof *c);
    if (!kvio_dtype_size(dtype))
        return cio_fail(&x, KVIO_E_ARG, "unknown dtype %d", (int)dtype);
    if (!n_layers || !n_kv_heads || !key_dim || !value_dim)
        return cio_fail(&x, KVIO_E_ARG, "layers, kv_heads and dims must be >= 1");
    c->n_kv_heads = n_kv_heads;
    c->n_positions = n_positions;
    c->key_dim = key_dim;
    c->value_dim = value_dim;
    c->dtype = dtype;
    uint64_t kb = kvio_key_bytes(c), vb = kvio_value_bytes(c);
    if ((n_positions && (!kb || !vb)) || kb > SIZE_MAX || vb > SIZE_MAX)
        return cio_fail(&x, KVIO_E_ARG, "layer size overflows");
    c->keys = calloc(n_layers, sizeof *c->keys);
    c->values = calloc(n_layers, sizeof *c->values);
    if (!c->keys || !c->values) {
        kvio_cache_free(c);
        return cio_fail(&x, KVIO_E_NOMEM, "out of memory");
    }
    c->n_layers = n_layers;
    for (uint32_t i = 0; i < n_layers; i++) {
        c->keys[i] = calloc(kb ? (size_t)kb : 1, 1);
        c->values[i] = calloc(vb ? (size_t)vb : 1, 1);
        if (!c->keys[i] || !c->values[i]) {
            kvio_cache_free(c);
            return cio_fail(&x, KVIO_E_NOMEM, "out of memory for %u layers of %" PRIu64 " bytes",
                        n_layers, kb + vb);
        }
    }
    c->token_width = 8;
    if (with_tokens) {
        c->tokens = calloc(n_positions ? n_positions : 1, sizeof *c->tokens);
        if (!c->tokens) {
            kvio_cache_free(c);
            return cio_fail(&x, KVIO_E_NOMEM, "out of memory");
        }
    }
    return KVIO_OK;
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

int kvio_cache_check(const kvio_cache *c, char *err, size_t errlen)
{
    ctx x = {"(cache)", err, errlen};
    if (!c)
        return cio_fail(&x, KVIO_E_ARG, "no cache given");
    if (!kvio_dtype_size(c->dtype))
        return cio_fail(&x, KVIO_E_ARG, "unknown dtype %d", (int)c->dtype);
    if (!c->n_layers || !c->n_kv_heads || !c->key_dim || !c->value_dim)
        return cio_fail(&x, KVIO_E_ARG, "layers (%u), kv_heads (%u), key_dim (%u) and value_dim (%u) must be >= 1",
                    c->n_layers, c->n_kv_heads, c->key_dim, c->value_dim);
    uint64_t kb = kvio_key_bytes(c), vb = kvio_value_bytes(c);
    if ((c->n_positions && (!kb || !vb)) || kb > SIZE_MAX || vb > SIZE_MAX)
        return cio_fail(&x, KVIO_E_ARG, "layer size overflows");
    if (!c->keys || !c->values)
        return cio_fail(&x, KVIO_E_ARG, "no key/value arrays");
    for (uint32_t i = 0; i < c->n_layers; i++)
        if ((kb && !c->keys[i]) || (vb && !c->values[i]))
            return cio_fail(&x, KVIO_E_ARG, "layer %u has no data", i);
    if (c->token_width != 0 && c->token_width != 4 && c->token_width != 8)
        return cio_fail(&x, KVIO_E_ARG, "token_width %u (must be 4 or 8)", c->token_width);
    if (c->tokens)
        for (uint32_t t = 0; t < c->n_positions; t++) {
            if (c->tokens[t] < 0)
                return cio_fail(&x, KVIO_E_ARG, "token id %" PRId64 " at position %u is negative",
                            c->tokens[t], t);
            if (c->token_width == 4 && c->tokens[t] > INT32_MAX)
                return cio_fail(&x, KVIO_E_ARG, "token id %" PRId64 " at position %u does not fit int32",
                            c->tokens[t], t);
        }
    for (size_t i = 0; i < c->n_meta; i++) {
        if (!c->meta || !c->meta[i].key || !c->meta[i].value)
            return cio_fail(&x, KVIO_E_ARG, "metadata entry %zu is NULL", i);
        if (!utf8_valid(c->meta[i].key) || !utf8_valid(c->meta[i].value))
            return cio_fail(&x, KVIO_E_ARG, "metadata entry '%s' is not valid UTF-8", cio_show(c->meta[i].key).s);
        if (!strcmp(c->meta[i].key, "__metadata__"))
            return cio_fail(&x, KVIO_E_ARG, "metadata key '__metadata__' is reserved");
        for (size_t j = 0; j < i; j++)
            if (!strcmp(c->meta[i].key, c->meta[j].key))
                return cio_fail(&x, KVIO_E_ARG, "duplicate metadata key '%s'", cio_show(c->meta[i].key).s);
    }
    return KVIO_OK;
}

int kvio_cache_equal(const kvio_cache *a, const kvio_cache *b)
{
    if (a->n_layers != b->n_layers || a->n_kv_heads != b->n_kv_heads ||
        a->n_positions != b->n_positions || a->key_dim != b->key_dim ||
        a->value_dim != b->value_dim || a->dtype != b->dtype || !a->tokens != !b->tokens)
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

/* ======================================================================== */
/* 3. naming convention: tensors -> cache                                    */
/* ======================================================================== */

/* Accepted names: key is kpre{i}ksuf, value is vpre{i}vsuf. */
static const struct {
    const char *kpre, *ksuf, *vpre, *vsuf;
} SCHEMES[] = {
    {"layers.", ".key", "layers.", ".value"},                   /* FKVF convention */
    {"past_key_values.", ".key", "past_key_values.", ".value"}, /* Hugging Face */
    {"past_key_values.", ".0", "past_key_values.", ".1"},       /* HF legacy tuple */
    {"key_cache.", "", "value_cache.", ""},                     /* HF DynamicCache */
};
#define N_SCHEMES (sizeof SCHEMES / sizeof SCHEMES[0])

static const char *const TOKEN_NAMES[] = {"tokens", "input_ids"};

/* 1 = name is pre{i}suf with a valid i, 0 = no match, -1 = matches but
 * the index is malformed (leading zero, too large) */
static int match_indexed(const char *name, const char *pre, const char *suf, uint32_t *idx)
{
    size_t n = strlen(name), lp = strlen(pre), ls = strlen(suf);
    if (n <= lp + ls || strncmp(name, pre, lp) || strcmp(name + n - ls, suf))
        return 0;
    const char *d = name + lp;
    size_t nd = n - lp - ls;
    for (size_t i = 0; i < nd; i++)
        if (d[i] < '0' || d[i] > '9')
            return 0;
    if (nd > 1 && d[0] == '0')
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < nd; i++) {
        v = v * 10 + (uint64_t)(d[i] - '0');
        if (v >= UINT32_MAX)
            return -1;
    }
    *idx = (uint32_t)v;
    return 1;
}

void cio_classify(kv_tensor *t)
{
    t->role = R_EXTRA;
    t->scheme = -1;
    for (size_t i = 0; i < sizeof TOKEN_NAMES / sizeof TOKEN_NAMES[0]; i++)
        if (!strcmp(t->name, TOKEN_NAMES[i])) {
            t->role = R_TOKENS;
            return;
        }
    if (kvio_is_companion(t->name)) {
        t->role = R_COMPANION;
        return;
    }
    for (size_t s = 0; s < N_SCHEMES; s++) {
        for (int kv = 0; kv < 2; kv++) {
            uint32_t idx = 0;
            int m = kv ? match_indexed(t->name, SCHEMES[s].vpre, SCHEMES[s].vsuf, &idx)
                       : match_indexed(t->name, SCHEMES[s].kpre, SCHEMES[s].ksuf, &idx);
            if (m < 0) {
                t->role = R_BADINDEX;
                return;
            }
            if (m > 0) {
                t->role = kv ? R_VALUE : R_KEY;
                t->scheme = (int)s;
                t->layer = idx;
                return;
            }
        }
    }
}

typedef struct name_str {
    char s[64];
} name_str;

static name_str scheme_name(int s, int kv, uint32_t layer)
{
    name_str o;
    snprintf(o.s, sizeof o.s, "%s%" PRIu32 "%s", kv ? SCHEMES[s].vpre : SCHEMES[s].kpre, layer,
             kv ? SCHEMES[s].vsuf : SCHEMES[s].ksuf);
    return o;
}

int cio_ign_add(ign_list *g, const char *name)
{
    if (g->n < KVIO_MAX_IGNORED && !(g->names[g->n] = dupstr(cio_show(name).s)))
        return KVIO_E_NOMEM;
    g->n++;
    return KVIO_OK;
}

void cio_ign_free(ign_list *g)
{
    for (size_t i = 0; i < KVIO_MAX_IGNORED; i++)
        free(g->names[i]);
    memset(g, 0, sizeof *g);
}

/* "'a', 'b', 'c', 'd' and 3 more": the first names of a file, for the
 * message of a file without key/value tensors (n tensors t, then the npz
 * members in pre that never became tensors). */
typedef struct found_str {
    char s[260];
} found_str;

static found_str found_names(const kv_tensor *t, size_t n, const ign_list *pre)
{
    found_str o;
    size_t k = 0, listed = 0, total = n + (pre ? pre->n : 0);
    o.s[0] = 0;
    for (size_t i = 0; i < total && listed < 4; i++) {
        const char *name = i < n ? t[i].name : i - n < KVIO_MAX_IGNORED ? pre->names[i - n] : NULL;
        if (!name)
            break;
        shown sh = cio_show(name); /* names in pre are shown already */
        if (i >= n)
            snprintf(sh.s, sizeof sh.s, "%s", name);
        if (strlen(sh.s) > 40)
            memcpy(sh.s + 40, "...", 4);
        k += (size_t)snprintf(o.s + k, sizeof o.s - k, "%s'%s'", listed ? ", " : "", sh.s);
        listed++;
    }
    if (!total)
        snprintf(o.s, sizeof o.s, "no tensors");
    else if (listed < total)
        snprintf(o.s + k, sizeof o.s - k, " and %zu more", total - listed);
    return o;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    const kv_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Reject duplicate names among n tensors (sorted copy of pointers). */
int cio_check_duplicates(const ctx *x, kv_tensor *t, size_t n)
{
    if (n < 2)
        return KVIO_OK;
    kv_tensor **p = malloc(n * sizeof *p);
    if (!p)
        return cio_fail(x, KVIO_E_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        p[i] = &t[i];
    qsort(p, n, sizeof *p, cmp_tensor_name);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(p[i - 1]->name, p[i]->name)) {
            int rc = cio_fail(x, KVIO_E_FORMAT, "tensor '%s': duplicate name", cio_show(p[i]->name).s);
            free(p);
            return rc;
        }
    free(p);
    return KVIO_OK;
}

/* Shape of a key/value tensor: [H, T, D] or [1, H, T, D]; positions-first
 * (nhd): [T, H, D] or [1, T, H, D]. htd gets H, T, D. */
static int kv_shape(const ctx *x, const kv_tensor *t, int nhd, uint32_t htd[3])
{
    const uint64_t *d = t->dims;
    const char *ax = nhd ? "positions, kv_heads" : "kv_heads, positions";
    if (t->ndim == 4 && d[0] == 1)
        d++;
    else if (t->ndim == 4)
        return cio_fail(x, KVIO_E_UNSUPPORTED,
                    "tensor '%s': batch dimension is %" PRIu64 "; only batch size 1 is supported",
                    cio_show(t->name).s, d[0]);
    else if (t->ndim != 3)
        return cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': shape %s; expected [%s, dim] or [1, %s, dim]",
                    cio_show(t->name).s, cio_fmt_shape(t->dims, t->ndim).s, ax, ax);
    for (int i = 0; i < 3; i++) {
        if (d[i] >= UINT32_MAX)
            return cio_fail(x, KVIO_E_UNSUPPORTED, "tensor '%s': shape %s: dimension too large",
                        cio_show(t->name).s, cio_fmt_shape(t->dims, t->ndim).s);
        htd[i] = (uint32_t)d[i];
    }
    if (nhd) {
        uint32_t tmp = htd[0];
        htd[0] = htd[1];
        htd[1] = tmp;
    }
    if (!htd[0] || !htd[2])
        return cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': shape %s: zero kv_heads or dim",
                    cio_show(t->name).s, cio_fmt_shape(t->dims, t->ndim).s);
    if (t->type != T_F16 && t->type != T_BF16 && t->type != T_F32)
        return cio_fail(x, KVIO_E_UNSUPPORTED,
                    "tensor '%s': dtype %s; keys and values must be f16, bf16 or f32",
                    cio_show(t->name).s, cio_show(t->dtype_name).s);
    return KVIO_OK;
}

/* [A][B][row] -> [B][A][row], rows of rb bytes. */
void cio_transpose_rows(uint8_t *dst, const uint8_t *src, size_t A, size_t B, size_t rb)
{
    for (size_t a = 0; a < A; a++)
        for (size_t b = 0; b < B; b++)
            memcpy(dst + (b * A + a) * rb, src + (a * B + b) * rb, rb);
}

/* Copy (or adopt, for owned npz buffers) a tensor's bytes; a positions-first
 * tensor (nhd, H heads, T positions, rows of rb bytes) is transposed to
 * [H][T][D] (and an owned buffer freed at once). */
static uint8_t *take_bytes(kv_tensor *t, int nhd, uint32_t H, uint32_t T, size_t rb)
{
    if (nhd && t->nbytes) {
        uint8_t *p = malloc((size_t)t->nbytes);
        if (p)
            cio_transpose_rows(p, t->data, T, H, rb);
        free(t->owned);
        t->owned = NULL;
        t->data = NULL;
        return p;
    }
    if (t->owned) {
        uint8_t *p = t->owned;
        if (t->nbytes)
            memmove(p, t->data, (size_t)t->nbytes);
        t->owned = NULL;
        uint8_t *q = realloc(p, t->nbytes ? (size_t)t->nbytes : 1);
        return q ? q : p;
    }
    uint8_t *p = malloc(t->nbytes ? (size_t)t->nbytes : 1);
    if (p && t->nbytes)
        memcpy(p, t->data, (size_t)t->nbytes);
    return p;
}

/* From n tensors (names, dtypes, shapes and bytes already checked by the
 * format parser) to a cache. Takes over `meta` (n_meta entries) and the
 * names in `ign` (npz members skipped before; more are added here) on
 * success and on failure. */
int cio_assemble(const ctx *x, kv_tensor *t, size_t n, unsigned flags, kvio_meta *meta,
                    size_t n_meta, ign_list *ign, kvio_cache *out)
{
    int rc = KVIO_OK;
    kv_tensor **key_of = NULL, **val_of = NULL, *tok = NULL, *first = NULL;
    size_t nk = 0, nv = 0;
    int nhd = (flags & KVIO_READ_NHD) != 0;
    ign_list pre = *ign; /* for the message of a file without key/value tensors */
    memset(out, 0, sizeof *out);
    out->meta = meta;
    out->n_meta = n_meta;

    if ((rc = cio_check_duplicates(x, t, n)))
        goto done;
    for (size_t i = 0; i < n; i++) {
        cio_classify(&t[i]);
        switch (t[i].role) {
        case R_BADINDEX:
            rc = cio_fail(x, KVIO_E_CONVENTION,
                      "tensor '%s': malformed layer index (decimal, no leading zeros, below 2^32-1)",
                      cio_show(t[i].name).s);
            goto done;
        case R_COMPANION:
            if ((rc = cio_ign_add(ign, t[i].name)))
                goto nomem;
            break;
        case R_EXTRA:
            if (flags & KVIO_READ_IGNORE_EXTRA) {
                if ((rc = cio_ign_add(ign, t[i].name)))
                    goto nomem;
                break;
            }
            rc = cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': not part of the cache naming convention (%s)",
                      cio_show(t[i].name).s, SCHEMES_TEXT);
            goto done;
        case R_TOKENS:
            if (tok) {
                rc = cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': token ids given twice (also '%s')",
                          cio_show(t[i].name).s, cio_show(tok->name).s);
                goto done;
            }
            tok = &t[i];
            break;
        default:
            if (!first) {
                first = &t[i];
            } else if (first->scheme != t[i].scheme) {
                rc = cio_fail(x, KVIO_E_CONVENTION,
                          "tensor '%s': named like %s but tensor '%s' like %s; one naming scheme per file",
                          cio_show(t[i].name).s, scheme_name(t[i].scheme, 0, 0).s, cio_show(first->name).s,
                          scheme_name(first->scheme, 0, 0).s);
                goto done;
            }
            if (t[i].role == R_KEY)
                nk++;
            else
                nv++;
        }
    }
    if (!first) {
        rc = cio_fail(x, KVIO_E_CONVENTION, "no key/value tensors (%s); the file holds %s", SCHEMES_TEXT,
                  found_names(t, n, &pre).s);
        goto done;
    }
    int s = first->scheme;
    size_t L = nk;
    if (L == 0) {
        rc = cio_fail(x, KVIO_E_CONVENTION, "missing tensor '%s'", scheme_name(s, 0, 0).s);
        goto done;
    }
    key_of = calloc(L, sizeof *key_of);
    val_of = calloc(L, sizeof *val_of);
    if (!key_of || !val_of) {
        rc = cio_fail(x, KVIO_E_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        if (t[i].role == R_KEY && t[i].layer < L)
            key_of[t[i].layer] = &t[i];
    for (size_t l = 0; l < L; l++)
        if (!key_of[l]) {
            rc = cio_fail(x, KVIO_E_CONVENTION, "missing tensor '%s' (found %zu key tensors)",
                      scheme_name(s, 0, (uint32_t)l).s, L);
            goto done;
        }
    for (size_t i = 0; i < n; i++)
        if (t[i].role == R_VALUE) {
            if (t[i].layer >= L) {
                rc = cio_fail(x, KVIO_E_CONVENTION, "missing tensor '%s' (its value tensor '%s' is present)",
                          scheme_name(s, 0, t[i].layer).s, cio_show(t[i].name).s);
                goto done;
            }
            val_of[t[i].layer] = &t[i];
        }
    for (size_t l = 0; l < L; l++)
        if (!val_of[l]) {
            rc = cio_fail(x, KVIO_E_CONVENTION, "missing tensor '%s' (its key tensor '%s' is present)",
                      scheme_name(s, 1, (uint32_t)l).s, cio_show(key_of[l]->name).s);
            goto done;
        }
    if (L > KVIO_MAX_LAYERS) {
        rc = cio_fail(x, KVIO_E_UNSUPPORTED, "%zu layers (at most %u are accepted)", L, KVIO_MAX_LAYERS);
        goto done;
    }

    /* shapes and dtypes: everything agrees with layer 0 */
    uint32_t k0[3], v0[3];
    if ((rc = kv_shape(x, key_of[0], nhd, k0)) || (rc = kv_shape(x, val_of[0], nhd, v0)))
        goto done;
    for (size_t l = 0; l < L; l++) {
        uint32_t k[3], v[3];
        if ((rc = kv_shape(x, key_of[l], nhd, k)) || (rc = kv_shape(x, val_of[l], nhd, v)))
            goto done;
        if (k[0] != k0[0] || k[1] != k0[1] || k[2] != k0[2]) {
            rc = cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': shape %s differs from tensor '%s' %s",
                      cio_show(key_of[l]->name).s, cio_fmt_shape(key_of[l]->dims, key_of[l]->ndim).s,
                      cio_show(key_of[0]->name).s, cio_fmt_shape(key_of[0]->dims, key_of[0]->ndim).s);
            goto done;
        }
        if (v[0] != k0[0] || v[1] != k0[1] || v[2] != v0[2]) {
            rc = cio_fail(x, KVIO_E_CONVENTION,
                      "tensor '%s': shape %s does not match %u kv_heads, %u positions, value dim %u "
                      "(from tensors '%s' and '%s')",
                      cio_show(val_of[l]->name).s, cio_fmt_shape(val_of[l]->dims, val_of[l]->ndim).s, k0[0],
                      k0[1], v0[2], cio_show(key_of[0]->name).s, cio_show(val_of[0]->name).s);
            goto done;
        }
        for (int kv = 0; kv < 2; kv++) {
            kv_tensor *q = kv ? val_of[l] : key_of[l];
            if (q->type != key_of[0]->type) {
                rc = cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': dtype %s differs from tensor '%s' (%s)",
                          cio_show(q->name).s, cio_show(q->dtype_name).s, cio_show(key_of[0]->name).s,
                          cio_show(key_of[0]->dtype_name).s);
                goto done;
            }
        }
    }
    out->dtype = to_fkvf(key_of[0]->type);
    out->n_kv_heads = k0[0];
    out->n_positions = k0[1];
    out->key_dim = k0[2];
    out->value_dim = v0[2];
    out->token_width = 8;
    uint64_t kb = kvio_key_bytes(out), vb = kvio_value_bytes(out);
    for (size_t l = 0; l < L; l++)
        if (key_of[l]->nbytes != kb || val_of[l]->nbytes != vb) {
            rc = cio_fail(x, KVIO_E_FORMAT, "tensor '%s': byte length does not match its shape",
                      cio_show(key_of[l]->nbytes != kb ? key_of[l]->name : val_of[l]->name).s);
            goto done;
        }

    /* token ids */
    if (tok) {
        const uint64_t *d = tok->dims;
        if (tok->type != T_I32 && tok->type != T_I64) {
            rc = cio_fail(x, KVIO_E_UNSUPPORTED, "tensor '%s': dtype %s; token ids must be int32 or int64",
                      cio_show(tok->name).s, cio_show(tok->dtype_name).s);
            goto done;
        }
        if (tok->ndim == 2 && d[0] == 1)
            d++;
        else if (tok->ndim != 1) {
            rc = cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': shape %s; expected [positions] or [1, positions]",
                      cio_show(tok->name).s, cio_fmt_shape(tok->dims, tok->ndim).s);
            goto done;
        }
        if (d[0] != out->n_positions) {
            /* a positions-first cache read heads-first: as many ids as "heads" */
            int swapped = d[0] == out->n_kv_heads;
            rc = cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': %" PRIu64 " token ids for %u positions%s",
                      cio_show(tok->name).s, d[0], out->n_positions,
                      !swapped ? ""
                      : nhd    ? " (are the key/value tensors heads-first, [kv_heads, positions, dim]?)"
                               : " (are the key/value tensors positions-first, [positions, kv_heads, "
                                 "dim]? fkvf: --layout nhd)");
            goto done;
        }
        if (tok->nbytes != d[0] * tok->esize) {
            rc = cio_fail(x, KVIO_E_FORMAT, "tensor '%s': byte length does not match its shape",
                      cio_show(tok->name).s);
            goto done;
        }
        out->token_width = (unsigned)tok->esize;
        out->tokens = malloc(out->n_positions ? out->n_positions * sizeof *out->tokens : 1);
        if (!out->tokens) {
            rc = cio_fail(x, KVIO_E_NOMEM, "out of memory");
            goto done;
        }
        for (uint32_t p = 0; p < out->n_positions; p++) {
            int64_t v = tok->esize == 4 ? (int64_t)(int32_t)rd32(tok->data + 4 * (size_t)p)
                                        : (int64_t)rd64(tok->data + 8 * (size_t)p);
            if (v < 0) {
                rc = cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': token id %" PRId64 " at position %u is negative",
                          cio_show(tok->name).s, v, p);
                goto done;
            }
            out->tokens[p] = v;
        }
    }

    out->keys = calloc(L, sizeof *out->keys);
    out->values = calloc(L, sizeof *out->values);
    if (!out->keys || !out->values) {
        rc = cio_fail(x, KVIO_E_NOMEM, "out of memory");
        goto done;
    }
    out->n_layers = (uint32_t)L;
    size_t es = kvio_dtype_size(out->dtype);
    for (size_t l = 0; l < L; l++) {
        out->keys[l] = take_bytes(key_of[l], nhd, k0[0], k0[1], (size_t)k0[2] * es);
        out->values[l] = take_bytes(val_of[l], nhd, k0[0], k0[1], (size_t)v0[2] * es);
        if (!out->keys[l] || !out->values[l]) {
            rc = cio_fail(x, KVIO_E_NOMEM, "out of memory for layer %zu", l);
            goto done;
        }
    }
    out->names = (kvio_names)(KVIO_NAMES_FKVF + s);
    out->n_ignored = ign->n;
    memcpy(out->ignored, ign->names, sizeof out->ignored);
    memset(ign, 0, sizeof *ign);
    goto done;
nomem:
    rc = cio_fail(x, KVIO_E_NOMEM, "out of memory");
done:
    free(key_of);
    free(val_of);
    cio_ign_free(ign);
    if (rc)
        kvio_cache_free(out);
    return rc;
}

/* ======================================================================== */
/* 4. safetensors                                                            */
/* ======================================================================== */

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

/* Parse a JSON string at j->i (which must be '"') into the arena. */
static int jstring(jp *j, const char **out)
{
    if (jpeek(j) != '"')
        return junexpected(j, "a string");
    size_t start = j->i;
    char *o = j->arena + j->used;
    size_t k = 0;
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
                o[k++] = simple;
                j->i += 2;
                continue;
            }
            uint32_t cp, lo;
            int rc;
            if ((rc = jhex4(j, j->i + 2, &cp)))
                return rc;
            j->i += 6;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return jfail(j, KVIO_E_FORMAT, "bad \\u escape: unpaired low surrogate U+%04X", (unsigned)cp);
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (j->i + 1 >= j->n || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u')
                    return jfail(j, KVIO_E_FORMAT, "bad \\u escape: high surrogate U+%04X without its low half",
                                 (unsigned)cp);
                if ((rc = jhex4(j, j->i + 2, &lo)))
                    return rc;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return jfail(j, KVIO_E_FORMAT, "bad \\u escape: U+%04X cannot follow high surrogate U+%04X",
                                 (unsigned)lo, (unsigned)cp);
                j->i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp == 0)
                return jfail(j, KVIO_E_FORMAT, "\\u0000 (NUL) is not allowed in a string");
            if (cp < 0x80) {
                o[k++] = (char)cp;
            } else if (cp < 0x800) {
                o[k++] = (char)(0xC0 | (cp >> 6));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                o[k++] = (char)(0xE0 | (cp >> 12));
                o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            } else {
                o[k++] = (char)(0xF0 | (cp >> 18));
                o[k++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[k++] = (char)(0x80 | (cp & 0x3F));
            }
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

static int parse_meta(jp *j, kvio_meta **meta, size_t *n_meta)
{
    int rc, more = 1;
    size_t cap = 0;
    if ((rc = jexpect(j, '{', "an object for __metadata__")))
        return rc;
    jws(j);
    if (jpeek(j) == '}') {
        j->i++;
        return KVIO_OK;
    }
    while (more) {
        const char *k, *v;
        jws(j);
        if ((rc = jstring(j, &k)) || (rc = jexpect(j, ':', "':'")))
            return rc;
        jws(j);
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

static int parse_tensor(jp *j, kv_tensor *t, uint64_t data_len)
{
    enum { F_DTYPE = 1, F_SHAPE = 2, F_OFFS = 4 };
    unsigned seen = 0;
    int rc, more = 1;
    uint64_t count = 1;
    int overflow = 0, zero = 0;
    j->tensor = t->name;
    if ((rc = jexpect(j, '{', "an object describing the tensor")))
        return rc;
    jws(j);
    if (jpeek(j) == '}') {
        j->i++;
        more = 0;
    }
    while (more) {
        const char *key;
        jws(j);
        size_t key_at = j->i;
        if ((rc = jstring(j, &key)) || (rc = jexpect(j, ':', "':'")))
            return rc;
        jws(j);
        unsigned f = !strcmp(key, "dtype") ? F_DTYPE : !strcmp(key, "shape") ? F_SHAPE
                   : !strcmp(key, "data_offsets") ? F_OFFS : 0;
        if (!f) {
            j->i = key_at;
            return jfail(j, KVIO_E_FORMAT, "unknown field '%s' (expected dtype, shape, data_offsets)",
                         cio_show(key).s);
        }
        if (seen & f) {
            j->i = key_at;
            return jfail(j, KVIO_E_FORMAT, "duplicate field '%s'", key);
        }
        seen |= f;
        if (f == F_DTYPE) {
            const char *d;
            if (jpeek(j) != '"')
                return junexpected(j, "a string for dtype");
            if ((rc = jstring(j, &d)))
                return rc;
            size_t k;
            for (k = 0; k < sizeof ST_DTYPES / sizeof ST_DTYPES[0]; k++)
                if (!strcmp(d, ST_DTYPES[k].name))
                    break;
            if (k == sizeof ST_DTYPES / sizeof ST_DTYPES[0])
                return cio_fail(j->x, KVIO_E_UNSUPPORTED, "tensor '%s': unknown dtype '%s'",
                            cio_show(t->name).s, cio_show(d).s);
            snprintf(t->dtype_name, sizeof t->dtype_name, "%s", ST_DTYPES[k].name);
            t->type = ST_DTYPES[k].type;
            t->esize = ST_DTYPES[k].size;
        } else if (f == F_SHAPE) {
            if (jpeek(j) != '[')
                return junexpected(j, "an array of integers for shape");
            j->i++;
            jws(j);
            int m2 = 1;
            if (jpeek(j) == ']') {
                j->i++;
                m2 = 0;
            }
            while (m2) {
                uint64_t v;
                jws(j);
                if ((rc = ju64(j, &v, "shape")))
                    return rc;
                if (t->ndim < KVIO_MAX_NDIM)
                    t->dims[t->ndim] = v;
                t->ndim++;
                if (v == 0)
                    zero = 1;
                else if (!mul_ok(count, v, &count))
                    overflow = 1;
                if ((rc = jnext(j, ']', &m2)))
                    return rc;
            }
        } else {
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
        }
        if ((rc = jnext(j, '}', &more)))
            return rc;
    }
    j->tensor = NULL;
    const char *missing = !(seen & F_DTYPE) ? "dtype" : !(seen & F_SHAPE) ? "shape"
                        : !(seen & F_OFFS) ? "data_offsets" : NULL;
    if (missing)
        return cio_fail(j->x, KVIO_E_FORMAT, "tensor '%s': missing field '%s'", cio_show(t->name).s, missing);
    if (t->begin > t->end)
        return cio_fail(j->x, KVIO_E_FORMAT, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "]: begin is after end",
                    cio_show(t->name).s, t->begin, t->end);
    if (t->end > data_len)
        return cio_fail(j->x, KVIO_E_FORMAT,
                    "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] run past the end of the data region (%" PRIu64 " bytes)",
                    cio_show(t->name).s, t->begin, t->end, data_len);
    uint64_t need;
    if (zero)
        count = 0, overflow = 0;
    if (overflow || !mul_ok(count, t->esize, &need))
        return cio_fail(j->x, KVIO_E_FORMAT, "tensor '%s': shape %s of %s overflows 64 bits",
                    cio_show(t->name).s, cio_fmt_shape(t->dims, t->ndim).s, t->dtype_name);
    if (need != t->end - t->begin)
        return cio_fail(j->x, KVIO_E_FORMAT,
                    "tensor '%s': shape %s of %s needs %" PRIu64 " bytes but data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64,
                    cio_show(t->name).s, cio_fmt_shape(t->dims, t->ndim).s, t->dtype_name, need, t->begin,
                    t->end, t->end - t->begin);
    t->nbytes = need;
    return KVIO_OK;
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

int kvio_read_safetensors_mem(const void *data, size_t size, const char *name, unsigned flags,
                              kvio_cache *out, char *err, size_t errlen)
{
    ctx x = {name, err, errlen};
    const uint8_t *d = data;
    kv_tensor *t = NULL;
    size_t n = 0, cap = 0, n_meta = 0;
    kvio_meta *meta = NULL, *final_meta = NULL;
    int rc = KVIO_OK, seen_meta = 0;
    jp j = {0};
    if (!out)
        return cio_fail(&x, KVIO_E_ARG, "no output cache");
    memset(out, 0, sizeof *out);
    if (!d && size)
        return cio_fail(&x, KVIO_E_ARG, "no data");
    if (size < 8)
        return cio_fail(&x, KVIO_E_FORMAT,
                    "file is %zu bytes; a safetensors file starts with an 8-byte header length", size);
    uint64_t hlen = rd64(d);
    if (hlen > size - 8)
        return cio_fail(&x, KVIO_E_FORMAT, "header length %" PRIu64 " runs past the end of the file (%zu bytes)",
                    hlen, size);
    if (hlen > KVIO_MAX_ST_HEADER)
        return cio_fail(&x, KVIO_E_FORMAT, "header length %" PRIu64 " exceeds the limit of %u bytes", hlen,
                    KVIO_MAX_ST_HEADER);
    if (hlen < 2)
        return cio_fail(&x, KVIO_E_FORMAT, "header length %" PRIu64 " is too small for a JSON object", hlen);
    uint64_t data_len = size - 8 - hlen;
    const uint8_t *region = d + 8 + hlen;

    j.x = &x;
    j.s = d + 8;
    j.n = (size_t)hlen;
    j.base = 8;
    j.arena = malloc(j.n + 1);
    if (!j.arena)
        return cio_fail(&x, KVIO_E_NOMEM, "out of memory for a %zu-byte header", j.n);
    if (jpeek(&j) != '{') {
        rc = junexpected(&j, "'{' (the header must start with a JSON object)");
        goto done;
    }
    j.i++;
    jws(&j);
    int more = 1;
    if (jpeek(&j) == '}') {
        j.i++;
        more = 0;
    }
    while (more) {
        const char *key;
        jws(&j);
        size_t key_at = j.i;
        if ((rc = jstring(&j, &key)) || (rc = jexpect(&j, ':', "':'")))
            goto done;
        jws(&j);
        if (!strcmp(key, "__metadata__")) {
            if (seen_meta) {
                j.i = key_at;
                rc = jfail(&j, KVIO_E_FORMAT, "duplicate __metadata__");
                goto done;
            }
            seen_meta = 1;
            if ((rc = parse_meta(&j, &meta, &n_meta)))
                goto done;
        } else {
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                kv_tensor *nt = realloc(t, cap * sizeof *nt);
                if (!nt) {
                    rc = cio_fail(&x, KVIO_E_NOMEM, "out of memory");
                    goto done;
                }
                t = nt;
            }
            memset(&t[n], 0, sizeof t[n]);
            t[n].name = key;
            if ((rc = parse_tensor(&j, &t[n], data_len)))
                goto done;
            t[n].data = region + t[n].begin;
            n++;
        }
        if ((rc = jnext(&j, '}', &more)))
            goto done;
    }
    jws(&j);
    if (j.i != j.n) {
        rc = jfail(&j, KVIO_E_FORMAT, "unexpected data after the header object (only spaces may pad it)");
        goto done;
    }
    if ((rc = cio_check_duplicates(&x, t, n)) || (rc = check_coverage(&x, t, n, data_len)))
        goto done;
    /* metadata: unique keys, then owned copies */
    if (n_meta) {
        qsort(meta, n_meta, sizeof *meta, cmp_meta);
        for (size_t i = 1; i < n_meta; i++)
            if (!strcmp(meta[i - 1].key, meta[i].key)) {
                rc = cio_fail(&x, KVIO_E_FORMAT, "__metadata__: duplicate key '%s'", cio_show(meta[i].key).s);
                goto done;
            }
        final_meta = calloc(n_meta, sizeof *final_meta);
        if (!final_meta) {
            rc = cio_fail(&x, KVIO_E_NOMEM, "out of memory");
            goto done;
        }
        for (size_t i = 0; i < n_meta; i++) {
            final_meta[i].key = dupstr(meta[i].key);
            final_meta[i].value = dupstr(meta[i].value);
            if (!final_meta[i].key || !final_meta[i].value) {
                for (size_t k = 0; k <= i; k++) {
                    free(final_meta[k].key);
                    free(final_meta[k].value);
                }
                free(final_meta);
                final_meta = NULL;
                rc = cio_fail(&x, KVIO_E_NOMEM, "out of memory");
                goto done;
            }
        }
    }
    ign_list ign;
    memset(&ign, 0, sizeof ign);
    rc = cio_assemble(&x, t, n, flags, final_meta, n_meta, &ign, out);
done:
    free(meta);
    free(t);
    free(j.arena);
    return rc;
}

/* ======================================================================== */
/* 5. .npy                                                                   */
/* ======================================================================== */

const uint8_t cio_npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* The fixed prefix: magic, version, header length. Sets *hdr_end (bytes of
 * prefix + header). NPY_NEED_MORE when avail is too short to tell. */
int cio_npy_prefix(const ctx *x, const char *label, const uint8_t *d, size_t avail,
                      size_t *prefix, size_t *hdr_end)
{
    size_t m = avail < 6 ? avail : 6;
    if (memcmp(d, cio_npy_magic, m))
        return cio_fail(x, KVIO_E_FORMAT, "%s: bad magic (not a .npy array: expected \\x93NUMPY)", label);
    if (avail < 8)
        return NPY_NEED_MORE;
    unsigned major = d[6], minor = d[7];
    if (major < 1 || major > 3 || minor != 0)
        return cio_fail(x, KVIO_E_UNSUPPORTED, "%s: .npy format version %u.%u (known: 1.0, 2.0, 3.0)", label,
                    major, minor);
    size_t pre = major == 1 ? 10 : 12;
    if (avail < pre)
        return NPY_NEED_MORE;
    uint64_t hl = major == 1 ? rd16(d + 8) : rd32(d + 8);
    if (hl > KVIO_MAX_NPY_HEADER)
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header length %" PRIu64 " exceeds the limit of %u bytes",
                    label, hl, KVIO_MAX_NPY_HEADER);
    *prefix = pre;
    *hdr_end = pre + (size_t)hl;
    return KVIO_OK;
}

typedef struct pyp {
    const uint8_t *s;
    size_t n, i;
} pyp;

static void pws(pyp *p)
{
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

/* Python string literal without escapes; copied to buf (cap bytes) or
 * reported too long. Returns 0 ok, 1 malformed, 2 too long. */
static int pstr(pyp *p, char *buf, size_t cap)
{
    if (p->i >= p->n || (p->s[p->i] != '\'' && p->s[p->i] != '"'))
        return 1;
    uint8_t q = p->s[p->i++];
    size_t k = 0;
    while (p->i < p->n && p->s[p->i] != q) {
        uint8_t c = p->s[p->i++];
        if (c == '\\' || c < 0x20)
            return 1;
        if (k + 1 >= cap)
            return 2;
        buf[k++] = (char)c;
    }
    if (p->i >= p->n)
        return 1;
    p->i++;
    buf[k] = 0;
    return 0;
}

static int pword(pyp *p, const char *w)
{
    size_t n = strlen(w);
    if (p->n - p->i >= n && !memcmp(p->s + p->i, w, n)) {
        p->i += n;
        return 1;
    }
    return 0;
}

/* Parse the header dict and check descr/order/size. */
int cio_npy_dict(const ctx *x, const char *label, const uint8_t *h, size_t hl, npy_hdr *o)
{
    pyp p = {h, hl, 0};
    int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0;
    char key[32];
    memset(o, 0, sizeof *o);
    pws(&p);
    if (p.i >= p.n || p.s[p.i] != '{')
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header is not a dict literal", label);
    p.i++;
    for (;;) {
        pws(&p);
        if (p.i < p.n && p.s[p.i] == '}') {
            p.i++;
            break;
        }
        int r = pstr(&p, key, sizeof key);
        if (r)
            return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: expected a quoted key at byte %zu", label, p.i);
        pws(&p);
        if (p.i >= p.n || p.s[p.i] != ':')
            return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: expected ':' after '%s'", label, cio_show(key).s);
        p.i++;
        pws(&p);
        if (!strcmp(key, "descr")) {
            if (have_descr)
                return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: duplicate key 'descr'", label);
            have_descr = 1;
            if (p.i < p.n && p.s[p.i] == '[')
                return cio_fail(x, KVIO_E_UNSUPPORTED, "%s: structured dtypes are not supported", label);
            r = pstr(&p, o->descr, sizeof o->descr);
            if (r == 2)
                return cio_fail(x, KVIO_E_UNSUPPORTED, "%s: unsupported dtype (descr too long)", label);
            if (r)
                return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: descr is not a string literal", label);
        } else if (!strcmp(key, "fortran_order")) {
            if (have_order)
                return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: duplicate key 'fortran_order'", label);
            have_order = 1;
            if (pword(&p, "True"))
                fortran = 1;
            else if (!pword(&p, "False"))
                return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: fortran_order must be True or False", label);
        } else if (!strcmp(key, "shape")) {
            if (have_shape)
                return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: duplicate key 'shape'", label);
            have_shape = 1;
            if (p.i >= p.n || p.s[p.i] != '(')
                return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: shape must be a tuple", label);
            p.i++;
            int commas = 0;
            for (;;) {
                pws(&p);
                if (p.i < p.n && p.s[p.i] == ')') {
                    p.i++;
                    break;
                }
                if (p.i >= p.n || p.s[p.i] < '0' || p.s[p.i] > '9')
                    return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: shape must hold non-negative integers", label);
                uint64_t v = 0;
                while (p.i < p.n && p.s[p.i] >= '0' && p.s[p.i] <= '9') {
                    unsigned dg = (unsigned)(p.s[p.i++] - '0');
                    if (v > (UINT64_MAX - dg) / 10)
                        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: shape dimension too large", label);
                    v = v * 10 + dg;
                }
                if (o->ndim < KVIO_MAX_NDIM)
                    o->dims[o->ndim] = v;
                else
                    return cio_fail(x, KVIO_E_UNSUPPORTED, "%s: more than %d dimensions", label, KVIO_MAX_NDIM);
                o->ndim++;
                pws(&p);
                if (p.i < p.n && p.s[p.i] == ',') {
                    p.i++;
                    commas++;
                } else if (p.i < p.n && p.s[p.i] == ')') {
                    p.i++;
                    if (o->ndim == 1 && !commas)
                        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: shape (n) is not a tuple; write (n,)", label);
                    break;
                } else {
                    return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: expected ',' or ')' in shape", label);
                }
            }
        } else {
            return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: unexpected key '%s'", label, cio_show(key).s);
        }
        pws(&p);
        if (p.i < p.n && p.s[p.i] == ',') {
            p.i++;
        } else if (!(p.i < p.n && p.s[p.i] == '}')) {
            return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: expected ',' or '}'", label);
        }
    }
    pws(&p);
    if (p.i != p.n)
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: unexpected bytes after the dict", label);
    if (!have_descr || !have_order || !have_shape)
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: missing key '%s'", label,
                    !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");

    static const struct {
        const char *descr;
        int type;
        size_t size;
    } known[] = {
        {"<f2", T_F16, 2}, {"<f4", T_F32, 4}, {"<u2", T_BF16, 2}, {"<V2", T_BF16, 2},
        {"|V2", T_BF16, 2}, {"<i4", T_I32, 4}, {"<i8", T_I64, 8},
    };
    size_t k;
    for (k = 0; k < sizeof known / sizeof known[0]; k++)
        if (!strcmp(o->descr, known[k].descr))
            break;
    if (k == sizeof known / sizeof known[0]) {
        if (o->descr[0] == '>')
            return cio_fail(x, KVIO_E_UNSUPPORTED, "%s: big-endian dtype '%s'; only little-endian data is accepted",
                        label, cio_show(o->descr).s);
        return cio_fail(x, KVIO_E_UNSUPPORTED,
                    "%s: unsupported dtype '%s' (accepted: '<f2', '<f4', '<u2' = bf16 bits, '<i4', '<i8')",
                    label, cio_show(o->descr).s);
    }
    o->type = known[k].type;
    o->esize = known[k].size;
    if (fortran && o->ndim > 1)
        return cio_fail(x, KVIO_E_UNSUPPORTED, "%s: fortran_order True (column-major) is not supported; save a C-ordered array",
                    label);
    uint64_t count = 1;
    for (size_t i = 0; i < o->ndim; i++)
        if (!mul_ok(count, o->dims[i], &count))
            return cio_fail(x, KVIO_E_FORMAT, "%s: shape %s overflows 64 bits", label, cio_fmt_shape(o->dims, o->ndim).s);
    if (!mul_ok(count, o->esize, &o->nbytes))
        return cio_fail(x, KVIO_E_FORMAT, "%s: shape %s overflows 64 bits", label, cio_fmt_shape(o->dims, o->ndim).s);
    return KVIO_OK;
}

/* A complete .npy held in memory: header and exactly nbytes of data. */
static int npy_parse(const ctx *x, const char *label, const uint8_t *d, size_t size, npy_hdr *o)
{
    size_t pre = 0, hdr_end = 0;
    int rc = cio_npy_prefix(x, label, d, size, &pre, &hdr_end);
    if (rc == NPY_NEED_MORE)
        return cio_fail(x, KVIO_E_FORMAT, "%s: truncated .npy header (%zu bytes)", label, size);
    if (rc)
        return rc;
    if (hdr_end > size)
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header length %zu runs past the end (%zu bytes)", label,
                    hdr_end - pre, size);
    if ((rc = cio_npy_dict(x, label, d + pre, hdr_end - pre, o)))
        return rc;
    o->data_off = hdr_end;
    uint64_t have = size - hdr_end;
    if (have < o->nbytes)
        return cio_fail(x, KVIO_E_FORMAT, "%s: truncated: shape %s needs %" PRIu64 " bytes of data, %" PRIu64 " present",
                    label, cio_fmt_shape(o->dims, o->ndim).s, o->nbytes, have);
    if (have > o->nbytes)
        return cio_fail(x, KVIO_E_FORMAT, "%s: %" PRIu64 " bytes after the array data", label, have - o->nbytes);
    return KVIO_OK;
}

/* Single-array .npy: [layers, 2, kv_heads, positions, dim] or with a
 * batch of 1: [layers, 2, 1, kv_heads, positions, dim]; index 0 = keys.
 * KVIO_READ_NHD: [layers, 2, (1,) positions, kv_heads, dim]. */
int kvio_read_npy_mem(const void *data, size_t size, const char *name, unsigned flags,
                      kvio_cache *out, char *err, size_t errlen)
{
    ctx x = {name, err, errlen};
    npy_hdr h;
    int rc;
    int nhd = (flags & KVIO_READ_NHD) != 0;
    const char *ax = nhd ? "positions, kv_heads" : "kv_heads, positions";
    if (!out)
        return cio_fail(&x, KVIO_E_ARG, "no output cache");
    memset(out, 0, sizeof *out);
    if (!data && size)
        return cio_fail(&x, KVIO_E_ARG, "no data");
    if ((rc = npy_parse(&x, "array", data, size, &h)))
        return rc;
    const uint64_t *d = h.dims;
    shape_str sh = cio_fmt_shape(h.dims, h.ndim);
    if (h.ndim == 6 && d[2] == 1) {
        /* drop the batch dimension */
    } else if (h.ndim == 6) {
        return cio_fail(&x, KVIO_E_UNSUPPORTED, "array: shape %s: batch dimension is %" PRIu64 "; only 1 is supported",
                    sh.s, d[2]);
    } else if (h.ndim != 5) {
        return cio_fail(&x, KVIO_E_CONVENTION,
                    "array: shape %s; expected [layers, 2, %s, dim] or [layers, 2, 1, %s, dim]", sh.s,
                    ax, ax);
    }
    const uint64_t *td = h.ndim == 6 ? d + 3 : d + 2;
    uint64_t htd[3] = {td[nhd ? 1 : 0], td[nhd ? 0 : 1], td[2]};
    if (d[1] != 2)
        return cio_fail(&x, KVIO_E_CONVENTION, "array: shape %s: second dimension must be 2 (keys, values)", sh.s);
    if (h.type != T_F16 && h.type != T_BF16 && h.type != T_F32)
        return cio_fail(&x, KVIO_E_UNSUPPORTED, "array: dtype '%s'; keys and values must be f16, bf16 or f32",
                    cio_show(h.descr).s);
    if (!d[0] || !htd[0] || !htd[2])
        return cio_fail(&x, KVIO_E_CONVENTION, "array: shape %s: zero layers, kv_heads or dim", sh.s);
    if (d[0] > KVIO_MAX_LAYERS)
        return cio_fail(&x, KVIO_E_UNSUPPORTED, "array: shape %s: %" PRIu64 " layers (at most %u are accepted)", sh.s,
                    d[0], KVIO_MAX_LAYERS);
    if (htd[0] >= UINT32_MAX || htd[1] >= UINT32_MAX || htd[2] >= UINT32_MAX)
        return cio_fail(&x, KVIO_E_UNSUPPORTED, "array: shape %s: dimension too large", sh.s);
    kvio_cache c = {0};
    c.n_kv_heads = (uint32_t)htd[0];
    c.n_positions = (uint32_t)htd[1];
    c.key_dim = c.value_dim = (uint32_t)htd[2];
    c.dtype = to_fkvf(h.type);
    c.token_width = 8;
    uint64_t lb = kvio_key_bytes(&c); /* fits: the whole array is in memory */
    c.keys = calloc((size_t)d[0], sizeof *c.keys);
    c.values = calloc((size_t)d[0], sizeof *c.values);
    if (!c.keys || !c.values) {
        kvio_cache_free(&c);
        return cio_fail(&x, KVIO_E_NOMEM, "out of memory");
    }
    c.n_layers = (uint32_t)d[0];
    const uint8_t *src = (const uint8_t *)data + h.data_off;
    for (uint32_t l = 0; l < c.n_layers; l++) {
        c.keys[l] = malloc(lb ? (size_t)lb : 1);
        c.values[l] = malloc(lb ? (size_t)lb : 1);
        if (!c.keys[l] || !c.values[l]) {
            kvio_cache_free(&c);
            return cio_fail(&x, KVIO_E_NOMEM, "out of memory");
        }
        if (lb && nhd) {
            size_t rb = (size_t)c.key_dim * kvio_dtype_size(c.dtype);
            cio_transpose_rows(c.keys[l], src + (size_t)lb * (2 * (size_t)l), c.n_positions, c.n_kv_heads, rb);
            cio_transpose_rows(c.values[l], src + (size_t)lb * (2 * (size_t)l + 1), c.n_positions,
                           c.n_kv_heads, rb);
        } else if (lb) {
            memcpy(c.keys[l], src + (size_t)lb * (2 * (size_t)l), (size_t)lb);
            memcpy(c.values[l], src + (size_t)lb * (2 * (size_t)l + 1), (size_t)lb);
        }
    }
    *out = c;
    return KVIO_OK;
}

/* ======================================================================== */
/* 6. .npz                                                                   */
/* ======================================================================== */

/* Read the current member fully (bounded by its .npy header and the
 * expansion budget) into a malloc'd buffer; fill t. */
static int npz_member(const ctx *x, struct archive *a, struct archive_entry *e, const char *label,
                      uint64_t *used, uint64_t budget, kv_tensor *t)
{
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, pre = 0, hdr_end = 0;
    uint64_t limit = 12 + (uint64_t)KVIO_MAX_NPY_HEADER, expect = 0;
    int parsed = 0, rc = KVIO_OK;
    npy_hdr h;
    int64_t declared = archive_entry_size_is_set(e) ? archive_entry_size(e) : -1;

    for (;;) {
        if (len == cap) {
            if (parsed && cap >= limit) { /* all expected bytes read: must be at EOF */
                uint8_t extra;
                la_ssize_t r = archive_read_data(a, &extra, 1);
                if (r < 0) {
                    rc = cio_fail(x, KVIO_E_FORMAT, "%s: corrupt member: %s", label, archive_error_string(a));
                    goto out;
                }
                if (r > 0) {
                    rc = cio_fail(x, KVIO_E_FORMAT, "%s: member holds more bytes than its .npy header describes (%" PRIu64 ")",
                              label, expect);
                    goto out;
                }
                break;
            }
            uint64_t nc = cap ? 2 * (uint64_t)cap : 65536;
            if (nc > limit)
                nc = limit;
            if (nc > SIZE_MAX) {
                rc = cio_fail(x, KVIO_E_NOMEM, "%s: member too large for memory", label);
                goto out;
            }
            uint8_t *nb = realloc(buf, nc ? (size_t)nc : 1);
            if (!nb) {
                rc = cio_fail(x, KVIO_E_NOMEM, "%s: out of memory", label);
                goto out;
            }
            buf = nb;
            cap = (size_t)nc;
            if (cap == len) { /* limit reached before the header was parsed */
                rc = cio_fail(x, KVIO_E_FORMAT, "%s: .npy header too long", label);
                goto out;
            }
        }
        la_ssize_t r = archive_read_data(a, buf + len, cap - len);
        if (r < 0) {
            rc = cio_fail(x, KVIO_E_FORMAT, "%s: corrupt member: %s", label, archive_error_string(a));
            goto out;
        }
        if (r == 0)
            break;
        len += (size_t)r;
        *used += (uint64_t)r;
        if (parsed && len > limit) {
            rc = cio_fail(x, KVIO_E_FORMAT, "%s: member holds more bytes than its .npy header describes (%" PRIu64 ")",
                      label, expect);
            goto out;
        }
        if (*used > budget) {
            rc = cio_fail(x, KVIO_E_FORMAT,
                      "%s: the archive decompresses to more than %u times its size; refusing",
                      label, KVIO_NPZ_MAX_EXPANSION);
            goto out;
        }
        if (!parsed) {
            if (!hdr_end) {
                rc = cio_npy_prefix(x, label, buf, len, &pre, &hdr_end);
                if (rc == NPY_NEED_MORE) {
                    rc = KVIO_OK;
                    continue;
                }
                if (rc)
                    goto out;
            }
            if (len < hdr_end)
                continue;
            if ((rc = cio_npy_dict(x, label, buf + pre, hdr_end - pre, &h)))
                goto out;
            if (!add_ok(hdr_end, h.nbytes, &expect)) {
                rc = cio_fail(x, KVIO_E_FORMAT, "%s: size overflows", label);
                goto out;
            }
            if (declared >= 0 && (uint64_t)declared != expect) {
                rc = cio_fail(x, KVIO_E_FORMAT,
                          "%s: zip entry size %" PRId64 " does not match the %" PRIu64 " bytes its .npy header describes",
                          label, declared, expect);
                goto out;
            }
            parsed = 1;
            limit = expect;
            if (len > limit) {
                rc = cio_fail(x, KVIO_E_FORMAT, "%s: member holds more bytes than its .npy header describes (%" PRIu64 ")",
                          label, expect);
                goto out;
            }
        }
    }
    if (!parsed) {
        if (!hdr_end) {
            rc = cio_npy_prefix(x, label, buf ? buf : (const uint8_t *)"", len, &pre, &hdr_end);
            if (rc == NPY_NEED_MORE || rc == KVIO_OK)
                rc = cio_fail(x, KVIO_E_FORMAT, "%s: truncated .npy header (%zu bytes)", label, len);
        } else {
            rc = cio_fail(x, KVIO_E_FORMAT, "%s: truncated .npy header (%zu of %zu bytes)", label, len, hdr_end);
        }
        goto out;
    }
    if (len < expect) {
        rc = cio_fail(x, KVIO_E_FORMAT, "%s: truncated: member ends after %zu of %" PRIu64 " bytes", label, len, expect);
        goto out;
    }
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", h.descr);
    t->type = h.type;
    t->esize = h.esize;
    t->ndim = h.ndim;
    memcpy(t->dims, h.dims, sizeof t->dims);
    t->nbytes = h.nbytes;
    t->data = buf + hdr_end;
    t->owned = buf;
    buf = NULL;
out:
    free(buf);
    return rc;
}

int kvio_read_npz_mem(const void *data, size_t size, const char *name, unsigned flags,
                      kvio_cache *out, char *err, size_t errlen)
{
    ctx x = {name, err, errlen};
    kv_tensor *t = NULL;
    size_t n = 0, cap = 0;
    int rc = KVIO_OK;
    uint64_t used = 0, budget;
    ign_list ign;
    memset(&ign, 0, sizeof ign);
    if (!out)
        return cio_fail(&x, KVIO_E_ARG, "no output cache");
    memset(out, 0, sizeof *out);
    if (!data || !size)
        return cio_fail(&x, KVIO_E_FORMAT, "empty file (not a zip archive)");
    if (!mul_ok(size, KVIO_NPZ_MAX_EXPANSION, &budget) || !add_ok(budget, 1u << 20, &budget))
        budget = UINT64_MAX;
    struct archive *a = archive_read_new();
    if (!a)
        return cio_fail(&x, KVIO_E_NOMEM, "out of memory");
    archive_read_support_format_zip_seekable(a); /* needs the central directory */
    if (archive_read_open_memory(a, data, size) != ARCHIVE_OK) {
        rc = cio_fail(&x, KVIO_E_FORMAT, "not a readable zip archive: %s", archive_error_string(a));
        goto done;
    }
    for (;;) {
        struct archive_entry *e;
        int r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF)
            break;
        if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
            rc = cio_fail(&x, KVIO_E_FORMAT, "corrupt zip archive: %s", archive_error_string(a));
            goto done;
        }
        const char *mname = archive_entry_pathname(e);
        if (!mname || !*mname) {
            rc = cio_fail(&x, KVIO_E_FORMAT, "zip member %zu has no usable name", n);
            goto done;
        }
        if (archive_entry_filetype(e) == AE_IFDIR)
            continue;
        size_t ml = strlen(mname);
        int is_npy = ml > 4 && !strcmp(mname + ml - 4, ".npy");
        kv_tensor tmp;
        memset(&tmp, 0, sizeof tmp);
        char *tname = is_npy ? malloc(ml - 3) : NULL;
        if (is_npy && !tname) {
            rc = cio_fail(&x, KVIO_E_NOMEM, "out of memory");
            goto done;
        }
        if (tname) {
            memcpy(tname, mname, ml - 4);
            tname[ml - 4] = 0;
            tmp.name = tname;
            cio_classify(&tmp);
        }
        if (!is_npy || tmp.role == R_EXTRA || tmp.role == R_COMPANION) {
            if ((flags & KVIO_READ_IGNORE_EXTRA) || tmp.role == R_COMPANION) {
                rc = cio_ign_add(&ign, tname ? tname : mname);
                free(tname);
                if (rc) {
                    rc = cio_fail(&x, KVIO_E_NOMEM, "out of memory");
                    goto done;
                }
                if (archive_read_data_skip(a) != ARCHIVE_OK) {
                    rc = cio_fail(&x, KVIO_E_FORMAT, "member '%s': corrupt: %s", cio_show(mname).s, archive_error_string(a));
                    goto done;
                }
                continue;
            }
            free(tname);
            rc = is_npy ? cio_fail(&x, KVIO_E_CONVENTION,
                               "member '%s': tensor not part of the cache naming convention (members are "
                               "TENSOR.npy; %s)",
                               cio_show(mname).s, SCHEMES_TEXT)
                        : cio_fail(&x, KVIO_E_CONVENTION, "member '%s': not a .npy file", cio_show(mname).s);
            goto done;
        }
        if (archive_entry_filetype(e) != AE_IFREG) {
            free(tname);
            rc = cio_fail(&x, KVIO_E_FORMAT, "member '%s': not a regular file", cio_show(mname).s);
            goto done;
        }
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 16;
            kv_tensor *nt = realloc(t, nc * sizeof *nt);
            if (!nt) {
                free(tname);
                rc = cio_fail(&x, KVIO_E_NOMEM, "out of memory");
                goto done;
            }
            t = nt;
            cap = nc;
        }
        t[n] = tmp;
        n++; /* owns tname from here on */
        char label[300];
        snprintf(label, sizeof label, "tensor '%s' (member '%s')", cio_show(tname).s, cio_show(mname).s);
        if ((rc = npz_member(&x, a, e, label, &used, budget, &t[n - 1])))
            goto done;
    }
    rc = cio_assemble(&x, t, n, flags, NULL, 0, &ign, out);
done:
    cio_ign_free(&ign);
    for (size_t i = 0; i < n; i++) {
        free(t[i].owned);
        free((char *)(uintptr_t)t[i].name);
    }
    free(t);
    archive_read_free(a);
    return rc;
}

/* ======================================================================== */
/* 7. writers                                                                */
/* ======================================================================== */

void cio_sk_put(sink *s, const void *p, size_t n)
{
    if (s->rc || !n)
        return;
    if (s->f) {
        if (fwrite(p, 1, n, s->f) != n)
            s->rc = KVIO_E_IO;
        s->len += n;
        return;
    }
    if (n > SIZE_MAX - s->len) {
        s->rc = KVIO_E_NOMEM;
        return;
    }
    if (s->len + n > s->cap) {
        size_t nc = s->cap ? s->cap : 4096;
        while (nc < s->len + n)
            nc = nc > SIZE_MAX / 2 ? s->len + n : 2 * nc;
        uint8_t *nb = realloc(s->buf, nc);
        if (!nb) {
            s->rc = KVIO_E_NOMEM;
            return;
        }
        s->buf = nb;
        s->cap = nc;
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
}

void KVIO_PRINTF(2, 3) cio_sk_printf(sink *s, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) {
        s->rc = s->rc ? s->rc : KVIO_E_ARG;
        return;
    }
    cio_sk_put(s, tmp, (size_t)n);
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

/* Token ids as little-endian int32/int64. */
void cio_sk_tokens(sink *s, const kvio_cache *c, unsigned w)
{
    uint8_t tmp[4096];
    size_t k = 0;
    for (uint32_t p = 0; p < c->n_positions; p++) {
        if (w == 4)
            wr32(tmp + k, (uint32_t)c->tokens[p]);
        else
            wr64(tmp + k, (uint64_t)c->tokens[p]);
        k += w;
        if (k + 8 > sizeof tmp) {
            cio_sk_put(s, tmp, k);
            k = 0;
        }
    }
    cio_sk_put(s, tmp, k);
}

void cio_out_kv(const kvio_cache *c, unsigned flags, uint32_t l, int kv, out_tensor *o)
{
    int hf = (flags & KVIO_WRITE_HF) != 0;
    o->nhd = (flags & KVIO_WRITE_NHD) != 0;
    snprintf(o->name, sizeof o->name, "%s%" PRIu32 "%s", hf ? "past_key_values." : "layers.", l,
             kv ? ".value" : ".key");
    size_t k = 0;
    if (hf)
        o->dims[k++] = 1;
    o->dims[k++] = o->nhd ? c->n_positions : c->n_kv_heads;
    o->dims[k++] = o->nhd ? c->n_kv_heads : c->n_positions;
    o->dims[k++] = kv ? c->value_dim : c->key_dim;
    o->ndim = k;
    o->nbytes = kv ? kvio_value_bytes(c) : kvio_key_bytes(c);
    o->data = kv ? c->values[l] : c->keys[l];
    o->rb = (size_t)(kv ? c->value_dim : c->key_dim) * kvio_dtype_size(c->dtype);
    o->is_tokens = 0;
}

/* Token ids: "tokens" [T], or with KVIO_WRITE_HF "input_ids" [1, T]. */
void cio_out_tok(const kvio_cache *c, unsigned flags, out_tensor *o)
{
    size_t k = 0;
    int hf = (flags & KVIO_WRITE_HF) != 0;
    snprintf(o->name, sizeof o->name, "%s", hf ? "input_ids" : "tokens");
    if (hf)
        o->dims[k++] = 1;
    o->dims[k++] = c->n_positions;
    o->ndim = k;
    o->nbytes = (uint64_t)c->n_positions * token_width(c);
    o->data = NULL;
    o->is_tokens = 1;
    o->nhd = 0;
    o->rb = 0;
}

/* A key/value tensor's bytes in the order of its file shape. */
void cio_sk_kv(sink *s, const kvio_cache *c, const out_tensor *o)
{
    if (!o->nhd) {
        cio_sk_put(s, o->data, (size_t)o->nbytes);
        return;
    }
    for (uint32_t t = 0; t < c->n_positions; t++)
        for (uint32_t h = 0; h < c->n_kv_heads; h++)
            cio_sk_put(s, o->data + ((size_t)h * c->n_positions + t) * o->rb, o->rb);
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

const char *cio_npy_descr(fkvf_dtype d)
{
    return d == FKVF_DTYPE_F16 ? "<f2" : d == FKVF_DTYPE_BF16 ? "<u2" : "<f4";
}

int cio_write_safetensors(const ctx *x, sink *s, const kvio_cache *c, unsigned flags)
{
    sink h = {0};
    uint64_t off = 0;
    size_t nt = 2 * (size_t)c->n_layers + (c->tokens ? 1 : 0);
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

/* .npy header (magic .. '\n') for descr and shape, padded to 64 bytes. */
int cio_npy_header(sink *s, const char *descr, const uint64_t *dims, size_t ndim)
{
    char dict[512];
    size_t k = (size_t)snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (size_t i = 0; i < ndim; i++)
        k += (size_t)snprintf(dict + k, sizeof dict - k, "%s%" PRIu64, i ? ", " : "", dims[i]);
    k += (size_t)snprintf(dict + k, sizeof dict - k, "%s), }", ndim == 1 ? "," : "");
    if (k >= sizeof dict - 80)
        return KVIO_E_ARG;
    size_t total = 10 + k + 1;
    size_t pad = (64 - total % 64) % 64;
    memset(dict + k, ' ', pad);
    k += pad;
    dict[k++] = '\n';
    uint8_t pre[10];
    memcpy(pre, cio_npy_magic, 6);
    pre[6] = 1;
    pre[7] = 0;
    pre[8] = (uint8_t)k;
    pre[9] = (uint8_t)(k >> 8);
    cio_sk_put(s, pre, 10);
    cio_sk_put(s, dict, k);
    return KVIO_OK;
}

int cio_write_npy(const ctx *x, sink *s, const kvio_cache *c, unsigned flags)
{
    if (c->key_dim != c->value_dim)
        return cio_fail(x, KVIO_E_ARG, "a .npy file holds one array: key_dim %u and value_dim %u must be equal "
                                   "(use .safetensors or .npz)", c->key_dim, c->value_dim);
    if (c->tokens)
        return cio_fail(x, KVIO_E_ARG, "a .npy file holds one array and cannot carry token ids "
                                   "(use .safetensors or .npz, or drop the tokens)");
    uint64_t dims[6];
    size_t nd = 0;
    dims[nd++] = c->n_layers;
    dims[nd++] = 2;
    if (flags & KVIO_WRITE_HF)
        dims[nd++] = 1;
    int nhd = (flags & KVIO_WRITE_NHD) != 0;
    dims[nd++] = nhd ? c->n_positions : c->n_kv_heads;
    dims[nd++] = nhd ? c->n_kv_heads : c->n_positions;
    dims[nd++] = c->key_dim;
    if (cio_npy_header(s, cio_npy_descr(c->dtype), dims, nd))
        return cio_fail(x, KVIO_E_ARG, "cannot build the .npy header");
    for (uint32_t l = 0; l < c->n_layers; l++) {
        out_tensor o;
        cio_out_kv(c, flags, l, 0, &o);
        cio_sk_kv(s, c, &o);
        cio_out_kv(c, flags, l, 1, &o);
        cio_sk_kv(s, c, &o);
    }
    return s->rc ? cio_fail(x, s->rc, "write failed: %s", s->rc == KVIO_E_IO ? strerror(errno) : "out of memory")
                 : KVIO_OK;
}

static la_ssize_t npz_write_cb(struct archive *a, void *ud, const void *buf, size_t n)
{
    sink *s = ud;
    cio_sk_put(s, buf, n);
    if (s->rc) {
        archive_set_error(a, EIO, "%s", s->rc == KVIO_E_IO ? "write failed" : "out of memory");
        return -1;
    }
    return (la_ssize_t)n;
}

int cio_write_npz(const ctx *x, sink *s, const kvio_cache *c, unsigned flags)
{
    int rc = KVIO_OK;
    struct archive *a = archive_write_new();
    struct archive_entry *e = archive_entry_new();
    if (!a || !e) {
        rc = cio_fail(x, KVIO_E_NOMEM, "out of memory");
        goto done;
    }
    if (archive_write_set_format_zip(a) != ARCHIVE_OK ||
        ((flags & KVIO_WRITE_DEFLATE) ? archive_write_zip_set_compression_deflate(a)
                                      : archive_write_zip_set_compression_store(a)) != ARCHIVE_OK ||
        archive_write_set_bytes_per_block(a, 0) != ARCHIVE_OK ||
        archive_write_open2(a, s, NULL, npz_write_cb, NULL, NULL) != ARCHIVE_OK) {
        rc = cio_fail(x, KVIO_E_IO, "cannot start the zip archive: %s", archive_error_string(a));
        goto done;
    }
    size_t nt = 2 * (size_t)c->n_layers + (c->tokens ? 1 : 0);
    for (size_t i = 0; i < nt; i++) {
        out_tensor o;
        const char *descr;
        if (i < 2 * (size_t)c->n_layers) {
            cio_out_kv(c, flags, (uint32_t)(i / 2), (int)(i % 2), &o);
            descr = cio_npy_descr(c->dtype);
        } else {
            cio_out_tok(c, flags, &o);
            descr = token_width(c) == 4 ? "<i4" : "<i8";
        }
        sink h = {0};
        if (cio_npy_header(&h, descr, o.dims, o.ndim) || h.rc) {
            free(h.buf);
            rc = cio_fail(x, KVIO_E_NOMEM, "cannot build the .npy header");
            goto done;
        }
        char mname[64];
        snprintf(mname, sizeof mname, "%s.npy", o.name);
        archive_entry_clear(e);
        archive_entry_set_pathname(e, mname);
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_perm(e, 0644);
        archive_entry_set_mtime(e, 315532800, 0); /* 1980-01-01: reproducible output */
        archive_entry_set_size(e, (la_int64_t)(h.len + o.nbytes));
        if (archive_write_header(a, e) != ARCHIVE_OK ||
            archive_write_data(a, h.buf, h.len) != (la_ssize_t)h.len) {
            free(h.buf);
            rc = cio_fail(x, KVIO_E_IO, "member '%s': %s", mname, archive_error_string(a));
            goto done;
        }
        free(h.buf);
        if (o.is_tokens) {
            sink tk = {0};
            cio_sk_tokens(&tk, c, token_width(c));
            if (tk.rc || (tk.len && archive_write_data(a, tk.buf, tk.len) != (la_ssize_t)tk.len)) {
                free(tk.buf);
                rc = cio_fail(x, KVIO_E_IO, "member '%s': %s", mname, tk.rc ? "out of memory" : archive_error_string(a));
                goto done;
            }
            free(tk.buf);
        } else {
            /* positions-first: a transposed copy of the tensor */
            sink tr = {0};
            const uint8_t *data = o.data;
            if (o.nhd) {
                tr.buf = malloc(o.nbytes ? (size_t)o.nbytes : 1);
                tr.cap = tr.buf ? (size_t)o.nbytes : 0;
                cio_sk_kv(&tr, c, &o);
                if (tr.rc) {
                    free(tr.buf);
                    rc = cio_fail(x, KVIO_E_NOMEM, "member '%s': out of memory", mname);
                    goto done;
                }
                data = tr.buf;
            }
            for (uint64_t at = 0; at < o.nbytes;) {
                size_t chunk = o.nbytes - at > (1u << 20) ? (1u << 20) : (size_t)(o.nbytes - at);
                la_ssize_t w = archive_write_data(a, data + at, chunk);
                if (w <= 0) {
                    free(tr.buf);
                    rc = cio_fail(x, KVIO_E_IO, "member '%s': %s", mname, archive_error_string(a));
                    goto done;
                }
                at += (uint64_t)w;
            }
            free(tr.buf);
        }
    }
    if (archive_write_close(a) != ARCHIVE_OK) {
        rc = cio_fail(x, KVIO_E_IO, "cannot finish the zip archive: %s", archive_error_string(a));
        goto done;
    }
done:
    if (e)
        archive_entry_free(e);
    if (a)
        archive_write_free(a);
    if (!rc && s->rc)
        rc = cio_fail(x, s->rc, "write failed");
    return rc;
}

static int write_any(const ctx *x, sink *s, const kvio_cache *c, kvio_format fmt, unsigned flags)
{
    int rc = kvio_cache_check(c, x->err, x->errlen);
    if (rc)
        return rc;
    switch (fmt) {
    case KVIO_FMT_SAFETENSORS: return cio_write_safetensors(x, s, c, flags);
    case KVIO_FMT_NPY: return cio_write_npy(x, s, c, flags);
    case KVIO_FMT_NPZ: return cio_write_npz(x, s, c, flags);
    default: return cio_fail(x, KVIO_E_ARG, "no output format (use a .safetensors, .npy or .npz name)");
    }
}

int kvio_write_mem(const kvio_cache *c, kvio_format fmt, unsigned flags, uint8_t **out,
                   size_t *out_size, char *err, size_t errlen)
{
    ctx x = {"(memory)", err, errlen};
    sink s = {0};
    if (!out || !out_size)
        return cio_fail(&x, KVIO_E_ARG, "no output buffer");
    *out = NULL;
    *out_size = 0;
    int rc = write_any(&x, &s, c, fmt, flags);
    if (rc) {
        free(s.buf);
        return rc;
    }
    *out = s.buf ? s.buf : malloc(1);
    *out_size = s.len;
    return *out ? KVIO_OK : cio_fail(&x, KVIO_E_NOMEM, "out of memory");
}

/* ======================================================================== */
/* 8. files                                                                  */
/* ======================================================================== */

kvio_format kvio_format_from_path(const char *path)
{
    static const struct {
        const char *ext;
        kvio_format fmt;
    } E[] = {{".safetensors", KVIO_FMT_SAFETENSORS}, {".npy", KVIO_FMT_NPY}, {".npz", KVIO_FMT_NPZ}};
    size_t n = path ? strlen(path) : 0;
    for (size_t i = 0; i < sizeof E / sizeof E[0]; i++) {
        size_t m = strlen(E[i].ext);
        if (n < m)
            continue;
        size_t k;
        for (k = 0; k < m; k++) {
            char ch = path[n - m + k];
            if (ch >= 'A' && ch <= 'Z')
                ch = (char)(ch - 'A' + 'a');
            if (ch != E[i].ext[k])
                break;
        }
        if (k == m)
            return E[i].fmt;
    }
    return KVIO_FMT_AUTO;
}

kvio_format kvio_format_sniff(const void *data, size_t size)
{
    const uint8_t *d = data;
    if (!d)
        return KVIO_FMT_AUTO;
    if (size >= 6 && !memcmp(d, cio_npy_magic, 6))
        return KVIO_FMT_NPY;
    if (size >= 4 && d[0] == 'P' && d[1] == 'K' &&
        ((d[2] == 3 && d[3] == 4) || (d[2] == 5 && d[3] == 6)))
        return KVIO_FMT_NPZ;
    if (size >= 9 && rd64(d) <= size - 8 && d[8] == '{')
        return KVIO_FMT_SAFETENSORS;
    return KVIO_FMT_AUTO;
}

int kvio_read_mem(const void *data, size_t size, const char *name, kvio_format fmt,
                  unsigned flags, kvio_cache *out, char *err, size_t errlen)
{
    ctx x = {name, err, errlen};
    if (fmt == KVIO_FMT_AUTO)
        fmt = kvio_format_sniff(data, size);
    if (fmt == KVIO_FMT_AUTO)
        fmt = kvio_format_from_path(name);
    switch (fmt) {
    case KVIO_FMT_SAFETENSORS: return kvio_read_safetensors_mem(data, size, name, flags, out, err, errlen);
    case KVIO_FMT_NPY: return kvio_read_npy_mem(data, size, name, flags, out, err, errlen);
    case KVIO_FMT_NPZ: return kvio_read_npz_mem(data, size, name, flags, out, err, errlen);
    default:
        if (out)
            memset(out, 0, sizeof *out);
        return cio_fail(&x, KVIO_E_FORMAT, "not a .safetensors, .npy or .npz file");
    }
}

int kvio_read(const char *path, kvio_format fmt, unsigned flags, kvio_cache *out, char *err, size_t errlen)
{
    ctx x = {path, err, errlen};
    if (out)
        memset(out, 0, sizeof *out);
    if (!path || !out)
        return cio_fail(&x, KVIO_E_ARG, "no path or output cache");
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return cio_fail(&x, KVIO_E_IO, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return cio_fail(&x, KVIO_E_IO, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return cio_fail(&x, KVIO_E_IO, "not a regular file");
    }
    if (st.st_size == 0) {
        close(fd);
        return cio_fail(&x, KVIO_E_FORMAT, "empty file");
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return cio_fail(&x, KVIO_E_NOMEM, "file too large for this platform");
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return cio_fail(&x, KVIO_E_IO, "cannot map: %s", strerror(e));
    int rc = kvio_read_mem(map, size, path, fmt, flags, out, err, errlen);
    munmap(map, size);
    return rc;
}

/* ---- output files: a temporary file next to the output, put in place ---- */

unsigned kvio_output_mode(void)
{
    static int known;
    static mode_t mode;
    if (!known) {
        mode_t m = umask(0); /* the only way to read it; restored at once */
        umask(m);
        mode = (mode_t)(0666 & ~m);
        known = 1;
    }
    return (unsigned)mode;
}

void kvio_tmp_discard(kvio_tmp *t)
{
    if (!t)
        return;
    if (t->f)
        fclose(t->f);
    if (t->path) {
        unlink(t->path);
        free(t->path);
    }
    t->f = NULL;
    t->path = NULL;
}

int kvio_tmp_open(kvio_tmp *t, const char *path, char *err, size_t errlen)
{
    ctx x = {path, err, errlen};
    static const char suffix[] = ".tmp-XXXXXX";
    if (!t)
        return cio_fail(&x, KVIO_E_ARG, "no temporary file handle");
    t->path = NULL;
    t->f = NULL;
    if (!path || !*path)
        return cio_fail(&x, KVIO_E_ARG, "no path");
    size_t n = strlen(path);
    if (n > SIZE_MAX - sizeof suffix)
        return cio_fail(&x, KVIO_E_ARG, "path too long");
    char *tmp = malloc(n + sizeof suffix);
    if (!tmp)
        return cio_fail(&x, KVIO_E_NOMEM, "out of memory");
    memcpy(tmp, path, n);
    memcpy(tmp + n, suffix, sizeof suffix);
    int fd = mkstemp(tmp); /* O_EXCL, mode 0600 */
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return cio_fail(&x, KVIO_E_IO, "cannot create a temporary file next to it: %s", strerror(e));
    }
    /* mkstemp ignores the umask; the mode fopen would give. If the file
     * system refuses, the file stays 0600: narrower, never wider. */
    (void)fchmod(fd, (mode_t)kvio_output_mode());
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        int e = errno;
        close(fd);
        unlink(tmp);
        free(tmp);
        return cio_fail(&x, e == ENOMEM ? KVIO_E_NOMEM : KVIO_E_IO, "cannot open the temporary file: %s",
                    strerror(e));
    }
    t->path = tmp;
    t->f = f;
    return KVIO_OK;
}

/* KVIO_WRITE_NO_REPLACE: link(2) fails with EEXIST if path exists, atomically,
 * so a file that appeared while t was written is never replaced. Only where
 * the file system has no hard links, a check just before rename(2). */
static int tmp_link(const ctx *x, const char *tmp, const char *path)
{
    if (link(tmp, path) == 0)
        return KVIO_OK; /* the caller removes the temporary name */
    int e = errno;
    if (e == EPERM || e == ENOTSUP || e == EOPNOTSUPP || e == ENOSYS || e == EMLINK) {
        struct stat sb;
        if (lstat(path, &sb) == 0)
            e = EEXIST;
        else if (errno != ENOENT)
            e = errno; /* cannot tell whether it exists: nothing replaced */
        else if (rename(tmp, path) == 0)
            return KVIO_OK;
        else
            e = errno;
    }
    if (e == EEXIST)
        return cio_fail(x, KVIO_E_EXISTS, "appeared while it was written; not replaced");
    return cio_fail(x, KVIO_E_IO, "cannot link %s into place: %s", tmp, strerror(e));
}

int kvio_tmp_place(kvio_tmp *t, const char *path, unsigned flags, char *err, size_t errlen)
{
    ctx x = {path, err, errlen};
    if (!t || !t->path) {
        kvio_tmp_discard(t);
        return cio_fail(&x, KVIO_E_ARG, "no temporary file");
    }
    if (!path || !*path) {
        kvio_tmp_discard(t);
        return cio_fail(&x, KVIO_E_ARG, "no path");
    }
    int rc = KVIO_OK;
    if (t->f) {
        FILE *f = t->f;
        t->f = NULL;
        /* complete and on disk before it gets the name: a crash after the
         * rename never leaves a partial file in place of the old one */
        int e = 0, earlier = ferror(f) != 0; /* its errno is long gone */
        if (!earlier && (fflush(f) != 0 || fsync(fileno(f)) != 0))
            e = errno;
        if (fclose(f) != 0 && !e && !earlier)
            e = errno;
        if (earlier)
            rc = cio_fail(&x, KVIO_E_IO, "write failed (a write to the temporary file failed)");
        else if (e)
            rc = cio_fail(&x, KVIO_E_IO, "write failed: %s", strerror(e));
    }
    if (!rc && (flags & KVIO_WRITE_NO_REPLACE)) {
        rc = tmp_link(&x, t->path, path); /* then the temporary name goes */
    } else if (!rc) {
        if (rename(t->path, path) == 0)
            t->path[0] = 0; /* nothing left under the temporary name */
        else
            rc = cio_fail(&x, KVIO_E_IO, "cannot rename %s into place: %s", t->path, strerror(errno));
    }
    if (t->path[0])
        unlink(t->path);
    if (!rc) {
        /* the new name on disk too (best effort); the buffer is large enough */
        memcpy(t->path, path, strlen(path) + 1);
        char *slash = strrchr(t->path, '/');
        const char *dir = ".";
        if (slash == t->path)
            dir = "/";
        else if (slash) {
            *slash = 0;
            dir = t->path;
        }
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
    }
    free(t->path);
    t->path = NULL;
    return rc;
}

int kvio_write(const char *path, kvio_format fmt, unsigned flags, const kvio_cache *c, char *err, size_t errlen)
{
    ctx x = {path, err, errlen};
    if (!path)
        return cio_fail(&x, KVIO_E_ARG, "no path");
    if (fmt == KVIO_FMT_AUTO)
        fmt = kvio_format_from_path(path);
    if (fmt == KVIO_FMT_AUTO)
        return cio_fail(&x, KVIO_E_ARG, "cannot tell the format from the name (use .safetensors, .npy or .npz)");
    int rc = kvio_cache_check(c, NULL, 0);
    if (rc) {
        kvio_cache_check(c, err, errlen);
        return rc;
    }
    struct stat sb;
    if ((flags & KVIO_WRITE_NO_REPLACE) && lstat(path, &sb) == 0)
        return cio_fail(&x, KVIO_E_EXISTS, "exists; not replaced");
    kvio_tmp t;
    if ((rc = kvio_tmp_open(&t, path, err, errlen)) != KVIO_OK)
        return rc;
    sink s = {0};
    s.f = t.f;
    if ((rc = write_any(&x, &s, c, fmt, flags)) != KVIO_OK) {
        kvio_tmp_discard(&t);
        return rc;
    }
    return kvio_tmp_place(&t, path, flags & KVIO_WRITE_NO_REPLACE, err, errlen);
}
