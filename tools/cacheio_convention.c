/*
 * cacheio_convention.c - the naming convention (docs/cache-files.md section
 * 2): which tensors of a file are keys, values and token ids, and from the
 * tensors a format reader found to a cache (cio_assemble).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cacheio_impl.h"

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

/* A name readers skip (companion, or extra with KVIO_READ_IGNORE_EXTRA). */
static int skip_name(const ctx *x, ign_list *ign, const char *name)
{
    return cio_ign_add(ign, name) ? cio_fail(x, KVIO_E_NOMEM, "out of memory") : KVIO_OK;
}

/* The keys, values and token ids among n tensors, by name: companions (and
 * with KVIO_READ_IGNORE_EXTRA other names) go to ign, the token ids to
 * *tok, the first key or value tensor to *first (the others must share its
 * scheme); *nk counts the key tensors. */
static int sort_roles(const ctx *x, kv_tensor *t, size_t n, unsigned flags, ign_list *ign,
                      kv_tensor **tok, kv_tensor **first, size_t *nk)
{
    int rc;
    for (size_t i = 0; i < n; i++) {
        cio_classify(&t[i]);
        switch (t[i].role) {
        case R_BADINDEX:
            return cio_fail(x, KVIO_E_CONVENTION,
                            "tensor '%s': malformed layer index (decimal, no leading zeros, below 2^32-1)",
                            cio_show(t[i].name).s);
        case R_COMPANION:
            if ((rc = skip_name(x, ign, t[i].name)))
                return rc;
            break;
        case R_EXTRA:
            if (!(flags & KVIO_READ_IGNORE_EXTRA))
                return cio_fail(x, KVIO_E_CONVENTION,
                                "tensor '%s': not part of the cache naming convention (%s)",
                                cio_show(t[i].name).s, SCHEMES_TEXT);
            if ((rc = skip_name(x, ign, t[i].name)))
                return rc;
            break;
        case R_TOKENS:
            if (*tok)
                return cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': token ids given twice (also '%s')",
                                cio_show(t[i].name).s, cio_show((*tok)->name).s);
            *tok = &t[i];
            break;
        default:
            if (!*first)
                *first = &t[i];
            else if ((*first)->scheme != t[i].scheme)
                return cio_fail(x, KVIO_E_CONVENTION,
                                "tensor '%s': named like %s but tensor '%s' like %s; one naming scheme per file",
                                cio_show(t[i].name).s, scheme_name(t[i].scheme, 0, 0).s,
                                cio_show((*first)->name).s, scheme_name((*first)->scheme, 0, 0).s);
            if (t[i].role == R_KEY)
                (*nk)++;
        }
    }
    return KVIO_OK;
}

/* key_of[l] and val_of[l] for layers 0..L-1 of scheme s (L = the number of
 * key tensors): every layer needs both, and no value may be beyond them. */
static int pair_layers(const ctx *x, kv_tensor *t, size_t n, int s, size_t L, kv_tensor **key_of,
                       kv_tensor **val_of)
{
    for (size_t i = 0; i < n; i++)
        if (t[i].role == R_KEY && t[i].layer < L)
            key_of[t[i].layer] = &t[i];
    for (size_t l = 0; l < L; l++)
        if (!key_of[l])
            return cio_fail(x, KVIO_E_CONVENTION, "missing tensor '%s' (found %zu key tensors)",
                            scheme_name(s, 0, (uint32_t)l).s, L);
    for (size_t i = 0; i < n; i++)
        if (t[i].role == R_VALUE) {
            if (t[i].layer >= L)
                return cio_fail(x, KVIO_E_CONVENTION, "missing tensor '%s' (its value tensor '%s' is present)",
                                scheme_name(s, 0, t[i].layer).s, cio_show(t[i].name).s);
            val_of[t[i].layer] = &t[i];
        }
    for (size_t l = 0; l < L; l++)
        if (!val_of[l])
            return cio_fail(x, KVIO_E_CONVENTION, "missing tensor '%s' (its key tensor '%s' is present)",
                            scheme_name(s, 1, (uint32_t)l).s, cio_show(key_of[l]->name).s);
    return KVIO_OK;
}

/* Layer l's keys and values have layer 0's shapes (k0, v0: [H, T, D]) and
 * the dtype of layer 0's keys. */
static int check_layer_shape(const ctx *x, kv_tensor **key_of, kv_tensor **val_of, size_t l, int nhd,
                             const uint32_t k0[3], const uint32_t v0[3])
{
    uint32_t k[3], v[3];
    int rc;
    if ((rc = kv_shape(x, key_of[l], nhd, k)) || (rc = kv_shape(x, val_of[l], nhd, v)))
        return rc;
    if (k[0] != k0[0] || k[1] != k0[1] || k[2] != k0[2])
        return cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': shape %s differs from tensor '%s' %s",
                        cio_show(key_of[l]->name).s, cio_fmt_shape(key_of[l]->dims, key_of[l]->ndim).s,
                        cio_show(key_of[0]->name).s, cio_fmt_shape(key_of[0]->dims, key_of[0]->ndim).s);
    if (v[0] != k0[0] || v[1] != k0[1] || v[2] != v0[2])
        return cio_fail(x, KVIO_E_CONVENTION,
                        "tensor '%s': shape %s does not match %u kv_heads, %u positions, value dim %u "
                        "(from tensors '%s' and '%s')",
                        cio_show(val_of[l]->name).s, cio_fmt_shape(val_of[l]->dims, val_of[l]->ndim).s,
                        k0[0], k0[1], v0[2], cio_show(key_of[0]->name).s, cio_show(val_of[0]->name).s);
    for (int kv = 0; kv < 2; kv++) {
        kv_tensor *q = kv ? val_of[l] : key_of[l];
        if (q->type != key_of[0]->type)
            return cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': dtype %s differs from tensor '%s' (%s)",
                            cio_show(q->name).s, cio_show(q->dtype_name).s, cio_show(key_of[0]->name).s,
                            cio_show(key_of[0]->dtype_name).s);
    }
    return KVIO_OK;
}

/* The cache's geometry and dtype from the L layers, which must all agree
 * with layer 0 (k0, v0 get its [H, T, D] of keys and values), and every
 * tensor's byte length must match it. */
static int set_geometry(const ctx *x, kv_tensor **key_of, kv_tensor **val_of, size_t L, int nhd,
                        uint32_t k0[3], uint32_t v0[3], kvio_cache *out)
{
    int rc;
    if ((rc = kv_shape(x, key_of[0], nhd, k0)) || (rc = kv_shape(x, val_of[0], nhd, v0)))
        return rc;
    for (size_t l = 0; l < L; l++)
        if ((rc = check_layer_shape(x, key_of, val_of, l, nhd, k0, v0)))
            return rc;
    out->dtype = to_fkvf(key_of[0]->type);
    out->n_kv_heads = k0[0];
    out->n_positions = k0[1];
    out->key_dim = k0[2];
    out->value_dim = v0[2];
    out->token_width = 8;
    uint64_t kb = kvio_key_bytes(out), vb = kvio_value_bytes(out);
    for (size_t l = 0; l < L; l++)
        if (key_of[l]->nbytes != kb || val_of[l]->nbytes != vb)
            return cio_fail(x, KVIO_E_FORMAT, "tensor '%s': byte length does not match its shape",
                            cio_show(key_of[l]->nbytes != kb ? key_of[l]->name : val_of[l]->name).s);
    return KVIO_OK;
}

/* The token ids tensor: int32 or int64, [positions] or [1, positions],
 * as many ids as the cache has positions, bytes to match. */
static int check_tokens_shape(const ctx *x, const kv_tensor *tok, int nhd, const kvio_cache *out)
{
    const uint64_t *d = tok->dims;
    if (tok->type != T_I32 && tok->type != T_I64)
        return cio_fail(x, KVIO_E_UNSUPPORTED, "tensor '%s': dtype %s; token ids must be int32 or int64",
                        cio_show(tok->name).s, cio_show(tok->dtype_name).s);
    if (tok->ndim == 2 && d[0] == 1)
        d++;
    else if (tok->ndim != 1)
        return cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': shape %s; expected [positions] or [1, positions]",
                        cio_show(tok->name).s, cio_fmt_shape(tok->dims, tok->ndim).s);
    if (d[0] != out->n_positions) {
        /* a positions-first cache read heads-first: as many ids as "heads" */
        int swapped = d[0] == out->n_kv_heads;
        return cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': %" PRIu64 " token ids for %u positions%s",
                        cio_show(tok->name).s, d[0], out->n_positions,
                        !swapped ? ""
                        : nhd    ? " (are the key/value tensors heads-first, [kv_heads, positions, dim]?)"
                                 : " (are the key/value tensors positions-first, [positions, kv_heads, "
                                   "dim]? fkvf: --layout nhd)");
    }
    if (tok->nbytes != d[0] * tok->esize)
        return cio_fail(x, KVIO_E_FORMAT, "tensor '%s': byte length does not match its shape",
                        cio_show(tok->name).s);
    return KVIO_OK;
}

/* out->tokens from the token ids tensor (checked first); ids are >= 0. */
static int take_tokens(const ctx *x, const kv_tensor *tok, int nhd, kvio_cache *out)
{
    int rc = check_tokens_shape(x, tok, nhd, out);
    if (rc)
        return rc;
    out->token_width = (unsigned)tok->esize;
    out->tokens = malloc(out->n_positions ? out->n_positions * sizeof *out->tokens : 1);
    if (!out->tokens)
        return cio_fail(x, KVIO_E_NOMEM, "out of memory");
    for (uint32_t p = 0; p < out->n_positions; p++) {
        int64_t v = tok->esize == 4 ? (int64_t)(int32_t)rd32(tok->data + 4 * (size_t)p)
                                    : (int64_t)rd64(tok->data + 8 * (size_t)p);
        if (v < 0)
            return cio_fail(x, KVIO_E_CONVENTION, "tensor '%s': token id %" PRId64 " at position %u is negative",
                            cio_show(tok->name).s, v, p);
        out->tokens[p] = v;
    }
    return KVIO_OK;
}

/* A lazy read (kvio_read with KVIO_READ_LAZY): every key and value tensor
 * pointed to where it lies in the mapped file, whatever its layout, for
 * kvio_read to turn into file offsets (a .npz's: where they lie in the
 * mapped spill file of its members' data); 0 (nothing done) when a
 * tensor's bytes are the reader's own or empty. */
static int take_lazily(kv_tensor **key_of, kv_tensor **val_of, size_t L, kvio_cache *out)
{
    for (size_t l = 0; l < L; l++)
        if (key_of[l]->owned || val_of[l]->owned || !key_of[l]->nbytes || !val_of[l]->nbytes)
            return 0;
    out->keys = calloc(L, sizeof *out->keys);
    out->values = calloc(L, sizeof *out->values);
    if (!out->keys || !out->values) {
        free(out->keys);
        free(out->values);
        out->keys = out->values = NULL;
        return 0; /* the copying path reports it */
    }
    out->n_layers = (uint32_t)L;
    for (size_t l = 0; l < L; l++) {
        out->keys[l] = (uint8_t *)(uintptr_t)key_of[l]->data;
        out->values[l] = (uint8_t *)(uintptr_t)val_of[l]->data;
    }
    return 1;
}

/* out->keys and out->values: the L layers' bytes, in [H][T][D] order. */
static int take_layers(const ctx *x, kv_tensor **key_of, kv_tensor **val_of, size_t L, int nhd,
                       int lazy, const uint32_t k0[3], const uint32_t v0[3], kvio_cache *out)
{
    if (lazy && take_lazily(key_of, val_of, L, out))
        return KVIO_OK;
    out->keys = calloc(L, sizeof *out->keys);
    out->values = calloc(L, sizeof *out->values);
    if (!out->keys || !out->values)
        return cio_fail(x, KVIO_E_NOMEM, "out of memory");
    out->n_layers = (uint32_t)L;
    size_t es = kvio_dtype_size(out->dtype);
    for (size_t l = 0; l < L; l++) {
        out->keys[l] = take_bytes(key_of[l], nhd, k0[0], k0[1], (size_t)k0[2] * es);
        out->values[l] = take_bytes(val_of[l], nhd, k0[0], k0[1], (size_t)v0[2] * es);
        if (!out->keys[l] || !out->values[l])
            return cio_fail(x, KVIO_E_NOMEM, "out of memory for layer %zu", l);
    }
    return KVIO_OK;
}

/* From n tensors (names, dtypes, shapes and bytes already checked by the
 * format parser) to a cache. Takes over `meta` (n_meta entries) and the
 * names in `ign` (npz members skipped before; more are added here) on
 * success and on failure. */
int cio_assemble(const ctx *x, kv_tensor *t, size_t n, unsigned flags, kvio_meta *meta,
                 size_t n_meta, ign_list *ign, kvio_cache *out)
{
    int rc;
    kv_tensor **key_of = NULL, **val_of = NULL, *tok = NULL, *first = NULL;
    size_t L = 0; /* layers: the number of key tensors */
    int nhd = (flags & KVIO_READ_NHD) != 0;
    uint32_t k0[3], v0[3];
    ign_list pre = *ign; /* for the message of a file without key/value tensors */
    memset(out, 0, sizeof *out);
    out->meta = meta;
    out->n_meta = n_meta;

    if ((rc = cio_check_duplicates(x, t, n)) || (rc = sort_roles(x, t, n, flags, ign, &tok, &first, &L)))
        goto done;
    if (!first) {
        rc = cio_fail(x, KVIO_E_CONVENTION, "no key/value tensors (%s); the file holds %s", SCHEMES_TEXT,
                      found_names(t, n, &pre).s);
        goto done;
    }
    if (L == 0) {
        rc = cio_fail(x, KVIO_E_CONVENTION, "missing tensor '%s'", scheme_name(first->scheme, 0, 0).s);
        goto done;
    }
    key_of = calloc(L, sizeof *key_of);
    val_of = calloc(L, sizeof *val_of);
    if (!key_of || !val_of) {
        rc = cio_fail(x, KVIO_E_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = pair_layers(x, t, n, first->scheme, L, key_of, val_of)))
        goto done;
    if (L > KVIO_MAX_LAYERS) {
        rc = cio_fail(x, KVIO_E_UNSUPPORTED, "%zu layers (at most %u are accepted)", L, KVIO_MAX_LAYERS);
        goto done;
    }
    if ((rc = set_geometry(x, key_of, val_of, L, nhd, k0, v0, out)) ||
        (tok && (rc = take_tokens(x, tok, nhd, out))) ||
        (rc = take_layers(x, key_of, val_of, L, nhd,
                          (flags & (KVIO_READ_LAZY | KVIO_READ_BORROW)) ==
                              (KVIO_READ_LAZY | KVIO_READ_BORROW),
                          k0, v0, out)))
        goto done;
    out->names = (kvio_names)(KVIO_NAMES_FKVF + first->scheme);
    out->n_ignored = ign->n;
    memcpy(out->ignored, ign->names, sizeof out->ignored);
    memset(ign, 0, sizeof *ign);
done:
    free(key_of);
    free(val_of);
    cio_ign_free(ign);
    if (rc)
        kvio_cache_free(out);
    return rc;
}
