/*
 * cacheio_npy.c - .npy (docs/cache-files.md section 4): the header parser
 * (also used for .npz members), the single-array reader and writer.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cacheio_impl.h"

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

/* The keys of a .npy header dict met so far. */
typedef struct npy_seen {
    int descr, order, shape;
    int fortran; /* fortran_order: True */
} npy_seen;

/* 'descr': a string literal (a structured dtype, a list, is refused). */
static int npy_descr_value(const ctx *x, const char *label, pyp *p, npy_hdr *o, npy_seen *seen)
{
    if (seen->descr)
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: duplicate key 'descr'", label);
    seen->descr = 1;
    if (p->i < p->n && p->s[p->i] == '[')
        return cio_fail(x, KVIO_E_UNSUPPORTED, "%s: structured dtypes are not supported", label);
    int r = pstr(p, o->descr, sizeof o->descr);
    if (r == 2)
        return cio_fail(x, KVIO_E_UNSUPPORTED, "%s: unsupported dtype (descr too long)", label);
    if (r)
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: descr is not a string literal", label);
    return KVIO_OK;
}

/* 'fortran_order': True or False. */
static int npy_order_value(const ctx *x, const char *label, pyp *p, npy_seen *seen)
{
    if (seen->order)
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: duplicate key 'fortran_order'", label);
    seen->order = 1;
    if (pword(p, "True"))
        seen->fortran = 1;
    else if (!pword(p, "False"))
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: fortran_order must be True or False", label);
    return KVIO_OK;
}

/* One dimension of the shape tuple: a decimal integer below 2^64. */
static int npy_dim(const ctx *x, const char *label, pyp *p, uint64_t *v)
{
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: shape must hold non-negative integers", label);
    *v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        unsigned dg = (unsigned)(p->s[p->i++] - '0');
        if (*v > (UINT64_MAX - dg) / 10)
            return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: shape dimension too large", label);
        *v = *v * 10 + dg;
    }
    return KVIO_OK;
}

/* 'shape': a tuple of at most KVIO_MAX_NDIM integers, "(n,)" for one. */
static int npy_shape_value(const ctx *x, const char *label, pyp *p, npy_hdr *o, npy_seen *seen)
{
    int rc, commas = 0;
    if (seen->shape)
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: duplicate key 'shape'", label);
    seen->shape = 1;
    if (p->i >= p->n || p->s[p->i] != '(')
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: shape must be a tuple", label);
    p->i++;
    for (;;) {
        uint64_t v = 0;
        pws(p);
        if (p->i < p->n && p->s[p->i] == ')') {
            p->i++;
            return KVIO_OK;
        }
        if ((rc = npy_dim(x, label, p, &v)))
            return rc;
        if (o->ndim >= KVIO_MAX_NDIM)
            return cio_fail(x, KVIO_E_UNSUPPORTED, "%s: more than %d dimensions", label, KVIO_MAX_NDIM);
        o->dims[o->ndim++] = v;
        pws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            commas++;
        } else if (p->i < p->n && p->s[p->i] == ')') {
            p->i++;
            if (o->ndim == 1 && !commas)
                return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: shape (n) is not a tuple; write (n,)", label);
            return KVIO_OK;
        } else {
            return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: expected ',' or ')' in shape", label);
        }
    }
}

/* One "'key': value" entry of the header dict. */
static int npy_entry(const ctx *x, const char *label, pyp *p, npy_hdr *o, npy_seen *seen)
{
    char key[32];
    if (pstr(p, key, sizeof key))
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: expected a quoted key at byte %zu", label, p->i);
    pws(p);
    if (p->i >= p->n || p->s[p->i] != ':')
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: expected ':' after '%s'", label, cio_show(key).s);
    p->i++;
    pws(p);
    if (!strcmp(key, "descr"))
        return npy_descr_value(x, label, p, o, seen);
    if (!strcmp(key, "fortran_order"))
        return npy_order_value(x, label, p, seen);
    if (!strcmp(key, "shape"))
        return npy_shape_value(x, label, p, o, seen);
    return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: unexpected key '%s'", label, cio_show(key).s);
}

/* The element type of o->descr: little-endian f16, f32, bf16 bits, int32,
 * int64. */
static int npy_known_dtype(const ctx *x, const char *label, npy_hdr *o)
{
    static const struct {
        const char *descr;
        int type;
        size_t size;
    } known[] = {
        {"<f2", T_F16, 2}, {"<f4", T_F32, 4}, {"<u2", T_BF16, 2}, {"<V2", T_BF16, 2},
        {"|V2", T_BF16, 2}, {"<i4", T_I32, 4}, {"<i8", T_I64, 8},
    };
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
        if (!strcmp(o->descr, known[k].descr)) {
            o->type = known[k].type;
            o->esize = known[k].size;
            return KVIO_OK;
        }
    if (o->descr[0] == '>')
        return cio_fail(x, KVIO_E_UNSUPPORTED, "%s: big-endian dtype '%s'; only little-endian data is accepted",
                        label, cio_show(o->descr).s);
    return cio_fail(x, KVIO_E_UNSUPPORTED,
                    "%s: unsupported dtype '%s' (accepted: '<f2', '<f4', '<u2' = bf16 bits, '<i4', '<i8')",
                    label, cio_show(o->descr).s);
}

/* o->nbytes: the bytes of array data its shape and dtype need. */
static int npy_data_bytes(const ctx *x, const char *label, npy_hdr *o)
{
    uint64_t count = 1;
    for (size_t i = 0; i < o->ndim; i++)
        if (!mul_ok(count, o->dims[i], &count))
            return cio_fail(x, KVIO_E_FORMAT, "%s: shape %s overflows 64 bits", label,
                            cio_fmt_shape(o->dims, o->ndim).s);
    if (!mul_ok(count, o->esize, &o->nbytes))
        return cio_fail(x, KVIO_E_FORMAT, "%s: shape %s overflows 64 bits", label,
                        cio_fmt_shape(o->dims, o->ndim).s);
    return KVIO_OK;
}

/* Parse the header dict and check descr/order/size. */
int cio_npy_dict(const ctx *x, const char *label, const uint8_t *h, size_t hl, npy_hdr *o)
{
    pyp p = {h, hl, 0};
    npy_seen seen = {0, 0, 0, 0};
    int rc;
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
        if ((rc = npy_entry(x, label, &p, o, &seen)))
            return rc;
        pws(&p);
        if (p.i < p.n && p.s[p.i] == ',')
            p.i++;
        else if (!(p.i < p.n && p.s[p.i] == '}'))
            return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: expected ',' or '}'", label);
    }
    pws(&p);
    if (p.i != p.n)
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: unexpected bytes after the dict", label);
    if (!seen.descr || !seen.order || !seen.shape)
        return cio_fail(x, KVIO_E_FORMAT, "%s: .npy header: missing key '%s'", label,
                        !seen.descr ? "descr" : !seen.order ? "fortran_order" : "shape");
    if ((rc = npy_known_dtype(x, label, o)))
        return rc;
    if (seen.fortran && o->ndim > 1)
        return cio_fail(x, KVIO_E_UNSUPPORTED,
                        "%s: fortran_order True (column-major) is not supported; save a C-ordered array", label);
    return npy_data_bytes(x, label, o);
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

/* The cache a single-array .npy holds, from its shape and dtype: c gets
 * the dimensions and dtype (no data yet). */
static int npy_cache_shape(const ctx *x, const npy_hdr *h, int nhd, kvio_cache *c)
{
    const char *ax = nhd ? "positions, kv_heads" : "kv_heads, positions";
    const uint64_t *d = h->dims;
    shape_str sh = cio_fmt_shape(h->dims, h->ndim);
    if (h->ndim == 6 && d[2] == 1) {
        /* drop the batch dimension */
    } else if (h->ndim == 6) {
        return cio_fail(x, KVIO_E_UNSUPPORTED, "array: shape %s: batch dimension is %" PRIu64 "; only 1 is supported",
                        sh.s, d[2]);
    } else if (h->ndim != 5) {
        return cio_fail(x, KVIO_E_CONVENTION,
                        "array: shape %s; expected [layers, 2, %s, dim] or [layers, 2, 1, %s, dim]", sh.s,
                        ax, ax);
    }
    const uint64_t *td = h->ndim == 6 ? d + 3 : d + 2;
    uint64_t htd[3] = {td[nhd ? 1 : 0], td[nhd ? 0 : 1], td[2]};
    if (d[1] != 2)
        return cio_fail(x, KVIO_E_CONVENTION, "array: shape %s: second dimension must be 2 (keys, values)", sh.s);
    if (h->type != T_F16 && h->type != T_BF16 && h->type != T_F32)
        return cio_fail(x, KVIO_E_UNSUPPORTED, "array: dtype '%s'; keys and values must be f16, bf16 or f32",
                        cio_show(h->descr).s);
    if (!d[0] || !htd[0] || !htd[2])
        return cio_fail(x, KVIO_E_CONVENTION, "array: shape %s: zero layers, kv_heads or dim", sh.s);
    if (d[0] > KVIO_MAX_LAYERS)
        return cio_fail(x, KVIO_E_UNSUPPORTED, "array: shape %s: %" PRIu64 " layers (at most %u are accepted)", sh.s,
                        d[0], KVIO_MAX_LAYERS);
    if (htd[0] >= UINT32_MAX || htd[1] >= UINT32_MAX || htd[2] >= UINT32_MAX)
        return cio_fail(x, KVIO_E_UNSUPPORTED, "array: shape %s: dimension too large", sh.s);
    memset(c, 0, sizeof *c);
    c->n_kv_heads = (uint32_t)htd[0];
    c->n_positions = (uint32_t)htd[1];
    c->key_dim = c->value_dim = (uint32_t)htd[2];
    c->dtype = to_fkvf(h->type);
    c->token_width = 8;
    return KVIO_OK;
}

/* c's n_layers layers from the array data at src: layer l's keys, then its
 * values, each transposed to [H][T][D] when positions-first (nhd); pointed
 * to instead when borrow is 1 and heads-first, or borrow is 2 (a lazy read:
 * kvio_read makes them file offsets). On failure c is freed. */
static int npy_take_layers(const ctx *x, kvio_cache *c, uint64_t n_layers, const uint8_t *src, int nhd,
                           int borrow)
{
    uint64_t lb = kvio_key_bytes(c); /* fits: the whole array is in memory */
    c->keys = calloc((size_t)n_layers, sizeof *c->keys);
    c->values = calloc((size_t)n_layers, sizeof *c->values);
    if (!c->keys || !c->values) {
        kvio_cache_free(c);
        return cio_fail(x, KVIO_E_NOMEM, "out of memory");
    }
    c->n_layers = (uint32_t)n_layers;
    if (borrow && (!nhd || borrow > 1) && lb) {
        /* heads-first as the cache holds them, or any layout for a lazy
         * read (borrow 2): pointed to in the mapping */
        for (uint32_t l = 0; l < c->n_layers; l++) {
            c->keys[l] = (uint8_t *)(uintptr_t)(src + (size_t)lb * (2 * (size_t)l));
            c->values[l] = (uint8_t *)(uintptr_t)(src + (size_t)lb * (2 * (size_t)l + 1));
        }
        return KVIO_OK;
    }
    for (uint32_t l = 0; l < c->n_layers; l++) {
        c->keys[l] = malloc(lb ? (size_t)lb : 1);
        c->values[l] = malloc(lb ? (size_t)lb : 1);
        if (!c->keys[l] || !c->values[l]) {
            kvio_cache_free(c);
            return cio_fail(x, KVIO_E_NOMEM, "out of memory");
        }
        if (lb && nhd) {
            size_t rb = (size_t)c->key_dim * kvio_dtype_size(c->dtype);
            cio_transpose_rows(c->keys[l], src + (size_t)lb * (2 * (size_t)l), c->n_positions, c->n_kv_heads, rb);
            cio_transpose_rows(c->values[l], src + (size_t)lb * (2 * (size_t)l + 1), c->n_positions,
                               c->n_kv_heads, rb);
        } else if (lb) {
            memcpy(c->keys[l], src + (size_t)lb * (2 * (size_t)l), (size_t)lb);
            memcpy(c->values[l], src + (size_t)lb * (2 * (size_t)l + 1), (size_t)lb);
        }
    }
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
    kvio_cache c;
    int rc;
    int nhd = (flags & KVIO_READ_NHD) != 0;
    if (!out)
        return cio_fail(&x, KVIO_E_ARG, "no output cache");
    memset(out, 0, sizeof *out);
    if (!data && size)
        return cio_fail(&x, KVIO_E_ARG, "no data");
    if ((rc = npy_parse(&x, "array", data, size, &h)) || (rc = npy_cache_shape(&x, &h, nhd, &c)) ||
        (rc = npy_take_layers(&x, &c, h.dims[0], (const uint8_t *)data + h.data_off, nhd,
                              !(flags & KVIO_READ_BORROW) ? 0
                              : (flags & KVIO_READ_LAZY)  ? 2
                                                          : 1)))
        return rc;
    *out = c;
    return KVIO_OK;
}

const char *cio_npy_descr(fkvf_dtype d)
{
    return d == FKVF_DTYPE_F16 ? "<f2" : d == FKVF_DTYPE_BF16 ? "<u2" : "<f4";
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

int cio_npy_cache_header(const ctx *x, sink *s, const kvio_cache *c, int with_tokens, unsigned flags)
{
    if (c->key_dim != c->value_dim)
        return cio_fail(x, KVIO_E_ARG, "a .npy file holds one array: key_dim %u and value_dim %u must be equal "
                                   "(use .safetensors or .npz)", c->key_dim, c->value_dim);
    if (with_tokens)
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
    return KVIO_OK;
}

int cio_write_npy(const ctx *x, sink *s, const kvio_cache *c, unsigned flags)
{
    int rc = cio_npy_cache_header(x, s, c, c->tokens != NULL, flags);
    if (rc)
        return rc;
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

/* ---- a plain float32 array ---------------------------------------------- */

void kvio_array_free(kvio_array *a)
{
    if (!a)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

int kvio_read_array(const char *path, kvio_array *out, char *err, size_t errlen)
{
    ctx x = {path, err, errlen};
    if (!path || !out)
        return cio_fail(&x, KVIO_E_ARG, "no path or output array");
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return cio_fail(&x, KVIO_E_IO, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return cio_fail(&x, KVIO_E_IO, "not a regular file");
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return cio_fail(&x, KVIO_E_NOMEM, "file too large for this platform");
    }
    size_t size = (size_t)st.st_size;
    uint8_t *d = malloc(size ? size : 1);
    if (!d) {
        close(fd);
        return cio_fail(&x, KVIO_E_NOMEM, "out of memory");
    }
    int rc = cio_pread_all(&x, fd, d, size, 0);
    close(fd);
    npy_hdr h;
    if (rc == KVIO_OK)
        rc = npy_parse(&x, "array", d, size, &h);
    if (rc == KVIO_OK && h.type != T_F32)
        rc = cio_fail(&x, KVIO_E_UNSUPPORTED, "array: dtype %s, not float32 ('<f4'): save it "
                                              "as float32",
                      cio_show(h.descr).s);
    if (rc == KVIO_OK && (h.ndim < 1 || h.ndim > KVIO_MAX_NDIM))
        rc = cio_fail(&x, KVIO_E_UNSUPPORTED, "array: %zu dimensions", h.ndim);
    if (rc == KVIO_OK) {
        size_t n = (size_t)(h.nbytes / 4); /* nbytes <= size: it fits */
        out->data = malloc(n ? n * sizeof(float) : 1);
        if (!out->data) {
            rc = cio_fail(&x, KVIO_E_NOMEM, "out of memory");
        } else {
            for (size_t i = 0; i < n; i++) {
                uint32_t u = rd32(d + h.data_off + 4 * i);
                memcpy(&out->data[i], &u, 4);
            }
            out->n = n;
            out->ndim = h.ndim;
            memcpy(out->dims, h.dims, h.ndim * sizeof h.dims[0]);
        }
    }
    free(d);
    return rc;
}
