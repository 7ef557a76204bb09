/* Tiny Llama-architecture inference engine core; see model.h.
 * Written from ../shared/models/README.md (checkpoint layout and forward pass). */
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEADER_FIELDS 7
#define HEADER_BYTES (HEADER_FIELDS * 4)

static const char *const header_names[HEADER_FIELDS] = {
    "dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len",
};

/* The weight arrays in file order. */
enum {
    A_EMB, A_RMS_ATT, A_WQ, A_WK, A_WV, A_WO, A_RMS_FFN, A_W1, A_W2, A_W3,
    A_RMS_FINAL, A_ROPE_REAL, A_ROPE_IMAG, A_WCLS, A_COUNT
};
static const char *const array_names[A_COUNT] = {
    "token embedding", "attention rmsnorm", "wq", "wk", "wv", "wo", "ffn rmsnorm",
    "w1", "w2", "w3", "final rmsnorm", "rope table (real)", "rope table (imag)",
    "classifier",
};

struct lm_model {
    lm_config cfg;
    float *data;                /* every float after the header, owned */
    size_t n_floats;
    const float *w[A_COUNT];    /* array bases into data (w[A_WCLS] may alias emb) */
};

struct lm_state {
    const lm_model *m;
    int cap, len;
    size_t layer_stride;        /* n_kv_heads * cap * head_size */
    float *kc, *kr, *vc;        /* caches: [layer][kv_head][cap][head_size] */
    float *x, *xb, *xb2, *q, *k, *v, *hb, *hb2, *att, *logits, *tmp;
    float *rc, *rs;             /* RoPE cos/sin for the current position */
    float *qs;                  /* post-RoPE queries of the last call: [layer][dim] */
    unsigned char *vis;         /* lm_forward_hooked: positions attention sees, [cap] */
};

/* ---- errors ----------------------------------------------------------------- */

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- header validation and layout ------------------------------------------ */

static int mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > UINT64_MAX / a)
        return -1;
    *out = a * b;
    return 0;
}

static int add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (b > UINT64_MAX - a)
        return -1;
    *out = a + b;
    return 0;
}

static int32_t load_i32le(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static float load_f32le(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Validate the header and compute the config and the element count of each
 * array. Returns 0, or -1 with a message (prefixed by name). */
static int check_header(const int32_t h[HEADER_FIELDS], const char *name, lm_config *cfg,
                        uint64_t counts[A_COUNT], uint64_t *total_bytes, char *err,
                        size_t errlen)
{
    static const int32_t limits[HEADER_FIELDS] = {
        LM_MAX_DIM, LM_MAX_HIDDEN, LM_MAX_LAYERS, LM_MAX_DIM, LM_MAX_DIM, LM_MAX_VOCAB,
        LM_MAX_SEQ_LEN,
    };
    for (int i = 0; i < HEADER_FIELDS; i++) {
        int32_t v = h[i];
        if (i == 5) { /* vocab_size: negative means an unshared classifier */
            if (v == 0 || v == INT32_MIN) {
                seterr(err, errlen, "%s: header field vocab_size = %ld is invalid", name,
                       (long)v);
                return -1;
            }
            if (v < 0)
                v = -v;
        } else if (v <= 0) {
            seterr(err, errlen, "%s: header field %s = %ld must be positive", name,
                   header_names[i], (long)v);
            return -1;
        }
        if (v > limits[i]) {
            seterr(err, errlen, "%s: header field %s = %ld exceeds the limit %ld", name,
                   header_names[i], (long)v, (long)limits[i]);
            return -1;
        }
    }
    lm_config c;
    memset(&c, 0, sizeof c);
    c.dim = h[0];
    c.hidden_dim = h[1];
    c.n_layers = h[2];
    c.n_heads = h[3];
    c.n_kv_heads = h[4];
    c.shared_classifier = h[5] > 0;
    c.vocab_size = h[5] > 0 ? h[5] : -h[5];
    c.seq_len = h[6];
    if (c.dim % c.n_heads != 0) {
        seterr(err, errlen, "%s: header field n_heads = %d does not divide dim = %d", name,
               c.n_heads, c.dim);
        return -1;
    }
    if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0) {
        seterr(err, errlen,
               "%s: header field n_kv_heads = %d does not divide n_heads = %d", name,
               c.n_kv_heads, c.n_heads);
        return -1;
    }
    c.head_size = c.dim / c.n_heads;
    if (c.head_size % 2 != 0) {
        seterr(err, errlen,
               "%s: header fields dim = %d, n_heads = %d give an odd head size %d "
               "(RoPE needs pairs)",
               name, c.dim, c.n_heads, c.head_size);
        return -1;
    }
    c.kv_dim = c.n_kv_heads * c.head_size;

    uint64_t L = (uint64_t)c.n_layers, D = (uint64_t)c.dim, H = (uint64_t)c.hidden_dim;
    uint64_t KV = (uint64_t)c.kv_dim, V = (uint64_t)c.vocab_size;
    uint64_t rope = 0, t = 0;
    int bad = 0;
    bad |= mul_u64(V, D, &counts[A_EMB]);
    bad |= mul_u64(L, D, &counts[A_RMS_ATT]);
    bad |= mul_u64(D, D, &t) | mul_u64(L, t, &counts[A_WQ]);
    bad |= mul_u64(KV, D, &t) | mul_u64(L, t, &counts[A_WK]);
    counts[A_WV] = counts[A_WK];
    counts[A_WO] = counts[A_WQ];
    counts[A_RMS_FFN] = counts[A_RMS_ATT];
    bad |= mul_u64(H, D, &t) | mul_u64(L, t, &counts[A_W1]);
    counts[A_W2] = counts[A_W1];
    counts[A_W3] = counts[A_W1];
    counts[A_RMS_FINAL] = D;
    bad |= mul_u64((uint64_t)c.seq_len, (uint64_t)(c.head_size / 2), &rope);
    counts[A_ROPE_REAL] = rope;
    counts[A_ROPE_IMAG] = rope;
    counts[A_WCLS] = c.shared_classifier ? 0 : counts[A_EMB];
    uint64_t n = 0;
    for (int a = 0; a < A_COUNT; a++)
        bad |= add_u64(n, counts[a], &n);
    uint64_t bytes = 0;
    bad |= mul_u64(n, 4, &bytes) | add_u64(bytes, HEADER_BYTES, &bytes);
    if (bad || bytes > (uint64_t)SIZE_MAX) {
        seterr(err, errlen, "%s: header sizes overflow (dim %d, hidden_dim %d, n_layers %d, "
               "vocab_size %d, seq_len %d)", name, c.dim, c.hidden_dim, c.n_layers,
               c.vocab_size, c.seq_len);
        return -1;
    }
    *cfg = c;
    *total_bytes = bytes;
    return 0;
}

uint64_t lm_checkpoint_size(const int32_t header[7])
{
    lm_config c;
    uint64_t counts[A_COUNT], bytes;
    if (check_header(header, "", &c, counts, &bytes, NULL, 0) != 0)
        return 0;
    return bytes;
}

/* Message for a file whose length does not match the layout. */
static void size_error(const char *name, uint64_t have, const uint64_t counts[A_COUNT],
                       uint64_t need, char *err, size_t errlen)
{
    if (have > need) {
        seterr(err, errlen,
               "%s: file is %llu bytes but the header describes %llu bytes "
               "(%llu trailing bytes; not a legacy llama2.c checkpoint?)",
               name, (unsigned long long)have, (unsigned long long)need,
               (unsigned long long)(have - need));
        return;
    }
    uint64_t off = HEADER_BYTES;
    for (int a = 0; a < A_COUNT; a++) {
        uint64_t end = off + counts[a] * 4;
        if (counts[a] && have < end) {
            seterr(err, errlen,
                   "%s: truncated: file is %llu bytes, array %s needs bytes %llu..%llu "
                   "(whole checkpoint %llu bytes)",
                   name, (unsigned long long)have, array_names[a],
                   (unsigned long long)off, (unsigned long long)end,
                   (unsigned long long)need);
            return;
        }
        off = end;
    }
    seterr(err, errlen, "%s: truncated: %llu of %llu bytes", name,
           (unsigned long long)have, (unsigned long long)need);
}

/* Header bytes -> validated config; also checks the file length. */
static int parse_header(const unsigned char *bytes, uint64_t file_size, const char *name,
                        lm_config *cfg, uint64_t counts[A_COUNT], char *err, size_t errlen)
{
    if (file_size < HEADER_BYTES) {
        seterr(err, errlen,
               "%s: truncated header: file is %llu bytes, header field %s needs bytes "
               "%d..%d",
               name, (unsigned long long)file_size, header_names[file_size / 4],
               (int)(file_size / 4) * 4, (int)(file_size / 4) * 4 + 4);
        return -1;
    }
    int32_t h[HEADER_FIELDS];
    for (int i = 0; i < HEADER_FIELDS; i++)
        h[i] = load_i32le(bytes + 4 * i);
    uint64_t need;
    if (check_header(h, name, cfg, counts, &need, err, errlen) != 0)
        return -1;
    if (file_size != need) {
        size_error(name, file_size, counts, need, err, errlen);
        return -1;
    }
    return 0;
}

/* Set the array pointers and check every weight is finite. */
static lm_model *finish_model(lm_model *m, const uint64_t counts[A_COUNT], const char *name,
                              char *err, size_t errlen)
{
    size_t off = 0;
    for (int a = 0; a < A_COUNT; a++) {
        m->w[a] = m->data + off;
        for (size_t i = 0; i < (size_t)counts[a]; i++) {
            if (!isfinite(m->data[off + i])) {
                seterr(err, errlen, "%s: array %s element %zu is not finite", name,
                       array_names[a], i);
                lm_free(m);
                return NULL;
            }
        }
        off += (size_t)counts[a];
    }
    if (m->cfg.shared_classifier)
        m->w[A_WCLS] = m->w[A_EMB];
    return m;
}

static lm_model *alloc_model(const lm_config *cfg, uint64_t file_size, const char *name,
                             char *err, size_t errlen)
{
    lm_model *m = calloc(1, sizeof *m);
    size_t n = (size_t)((file_size - HEADER_BYTES) / 4);
    if (m)
        m->data = malloc(n ? n * sizeof(float) : 1);
    if (!m || !m->data) {
        free(m);
        seterr(err, errlen, "%s: out of memory for %llu bytes of weights", name,
               (unsigned long long)(file_size - HEADER_BYTES));
        return NULL;
    }
    m->cfg = *cfg;
    m->n_floats = n;
    return m;
}

lm_model *lm_load_memory(const void *data, size_t size, const char *name, char *err,
                         size_t errlen)
{
    if (!name)
        name = "(memory)";
    if (!data && size) {
        seterr(err, errlen, "%s: no data", name);
        return NULL;
    }
    const unsigned char *b = data;
    lm_config cfg;
    uint64_t counts[A_COUNT];
    if (parse_header(b, size, name, &cfg, counts, err, errlen) != 0)
        return NULL;
    lm_model *m = alloc_model(&cfg, size, name, err, errlen);
    if (!m)
        return NULL;
    for (size_t i = 0; i < m->n_floats; i++)
        m->data[i] = load_f32le(b + HEADER_BYTES + 4 * i);
    return finish_model(m, counts, name, err, errlen);
}

lm_model *lm_load(const char *path, char *err, size_t errlen)
{
    if (!path) {
        seterr(err, errlen, "(null): no checkpoint path");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        seterr(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    long end = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        end = ftell(f);
    if (end < 0 || fseek(f, 0, SEEK_SET) != 0) {
        seterr(err, errlen, "%s: cannot determine the file size", path);
        fclose(f);
        return NULL;
    }
    uint64_t file_size = (uint64_t)end;
    unsigned char hdr[HEADER_BYTES];
    size_t got = fread(hdr, 1, file_size < HEADER_BYTES ? (size_t)file_size : HEADER_BYTES, f);
    if (got < HEADER_BYTES && got < file_size) {
        seterr(err, errlen, "%s: read error in the header", path);
        fclose(f);
        return NULL;
    }
    lm_config cfg;
    uint64_t counts[A_COUNT];
    if (parse_header(hdr, file_size, path, &cfg, counts, err, errlen) != 0) {
        fclose(f);
        return NULL;
    }
    lm_model *m = alloc_model(&cfg, file_size, path, err, errlen);
    if (!m) {
        fclose(f);
        return NULL;
    }
    /* Read in chunks, converting from little-endian. */
    unsigned char buf[4096];
    size_t done = 0;
    while (done < m->n_floats) {
        size_t want = m->n_floats - done;
        if (want > sizeof buf / 4)
            want = sizeof buf / 4;
        if (fread(buf, 4, want, f) != want) {
            seterr(err, errlen, "%s: read error or file shrank at byte %llu", path,
                   (unsigned long long)(HEADER_BYTES + 4 * (uint64_t)done));
            fclose(f);
            lm_free(m);
            return NULL;
        }
        for (size_t i = 0; i < want; i++)
            m->data[done + i] = load_f32le(buf + 4 * i);
        done += want;
    }
    fclose(f);
    return finish_model(m, counts, path, err, errlen);
}

unsigned char *lm_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 20, len = 0;
    unsigned char *b = malloc(cap);
    while (b) {
        size_t k = fread(b + len, 1, cap - len, f);
        len += k;
        if (len < cap)
            break;
        unsigned char *nb = cap <= SIZE_MAX / 2 ? realloc(b, cap * 2) : NULL;
        if (!nb) {
            free(b);
            b = NULL;
            break;
        }
        b = nb;
        cap *= 2;
    }
    int e = !b ? ENOMEM : ferror(f) ? (errno ? errno : EIO) : 0;
    fclose(f);
    if (e) {
        free(b);
        errno = e;
        return NULL;
    }
    *n = len;
    return b;
}

void lm_free(lm_model *m)
{
    if (!m)
        return;
    free(m->data);
    free(m);
}

const lm_config *lm_model_config(const lm_model *m)
{
    return m ? &m->cfg : NULL;
}

/* ---- state ---------------------------------------------------------------------- */

lm_state *lm_state_new(const lm_model *m, int capacity)
{
    if (!m)
        return NULL;
    const lm_config *c = &m->cfg;
    if (capacity == 0)
        capacity = c->seq_len;
    if (capacity < 0 || capacity > c->seq_len)
        return NULL;
    lm_state *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->m = m;
    s->cap = capacity;
    s->layer_stride = (size_t)c->n_kv_heads * (size_t)capacity * (size_t)c->head_size;
    size_t cache = s->layer_stride * (size_t)c->n_layers;
    size_t hs2 = (size_t)c->head_size / 2;
    s->kc = calloc(cache, sizeof(float));
    s->kr = calloc(cache, sizeof(float));
    s->vc = calloc(cache, sizeof(float));
    s->x = calloc((size_t)c->dim, sizeof(float));
    s->xb = calloc((size_t)c->dim, sizeof(float));
    s->xb2 = calloc((size_t)c->dim, sizeof(float));
    s->q = calloc((size_t)c->dim, sizeof(float));
    s->k = calloc((size_t)c->kv_dim, sizeof(float));
    s->v = calloc((size_t)c->kv_dim, sizeof(float));
    s->tmp = calloc((size_t)c->kv_dim, sizeof(float));
    s->hb = calloc((size_t)c->hidden_dim, sizeof(float));
    s->hb2 = calloc((size_t)c->hidden_dim, sizeof(float));
    s->att = calloc((size_t)capacity, sizeof(float));
    s->logits = calloc((size_t)c->vocab_size, sizeof(float));
    s->rc = calloc(hs2, sizeof(float));
    s->rs = calloc(hs2, sizeof(float));
    s->qs = calloc((size_t)c->n_layers * (size_t)c->dim, sizeof(float));
    s->vis = calloc((size_t)capacity, 1);
    if (!s->qs || !s->vis || !s->kc || !s->kr || !s->vc || !s->x || !s->xb || !s->xb2 || !s->q || !s->k ||
        !s->v || !s->tmp || !s->hb || !s->hb2 || !s->att || !s->logits || !s->rc || !s->rs) {
        lm_state_free(s);
        return NULL;
    }
    return s;
}

void lm_state_free(lm_state *s)
{
    if (!s)
        return;
    float *bufs[] = {s->kc, s->kr, s->vc, s->x, s->xb, s->xb2, s->q, s->k, s->v,
                     s->tmp, s->hb, s->hb2, s->att, s->logits, s->rc, s->rs, s->qs};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(s->vis);
    free(s);
}

const lm_model *lm_state_model(const lm_state *s)
{
    return s ? s->m : NULL;
}

int lm_state_capacity(const lm_state *s)
{
    return s ? s->cap : 0;
}

/* ---- kernels ---------------------------------------------------------------------- */

/* y = W x, W row-major [rows][cols]. Eight partial sums in a fixed order, so
 * the result does not depend on how the compiler vectorizes. */
static void matvec(float *restrict y, const float *restrict w, const float *restrict x,
                   int rows, int cols)
{
    for (int i = 0; i < rows; i++) {
        const float *wr = w + (size_t)i * (size_t)cols;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int j = 0;
        for (; j + 8 <= cols; j += 8)
            for (int u = 0; u < 8; u++)
                acc[u] += wr[j + u] * x[j + u];
        float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for (; j < cols; j++)
            sum += wr[j] * x[j];
        y[i] = sum;
    }
}

/* out = x / sqrt(mean(x^2) + eps) * w. out may alias x. */
static void rmsnorm(float *out, const float *x, const float *w, int n)
{
    float ss = 0.0f;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + LM_RMS_EPS);
    for (int i = 0; i < n; i++)
        out[i] = x[i] * scale * w[i];
}

/* cos and sin of the angle of pair i (even) at position pos. */
static void rope_cs(int pos, int i, int head_size, float *c, float *s)
{
    double f = 1.0 / pow(LM_ROPE_THETA, (double)i / (double)head_size);
    double a = (double)pos * f;
    *c = (float)cos(a);
    *s = (float)sin(a);
}

static void rotate_pair(float *v, float c, float s, int inverse)
{
    float a = v[0], b = v[1];
    if (!inverse) {
        v[0] = a * c - b * s;
        v[1] = a * s + b * c;
    } else {
        v[0] = a * c + b * s;
        v[1] = b * c - a * s;
    }
}

void lm_rope(float *vec, int n_heads, int head_size, int pos, int inverse)
{
    if (!vec || n_heads <= 0 || head_size <= 0 || head_size % 2)
        return;
    for (int i = 0; i < head_size; i += 2) {
        float c, s;
        rope_cs(pos, i, head_size, &c, &s);
        for (int h = 0; h < n_heads; h++)
            rotate_pair(vec + (size_t)h * (size_t)head_size + (size_t)i, c, s, inverse);
    }
}

/* Scatter a [n_kv_heads][head_size] row into a layer's cache at pos. */
static void put_row(float *base, const float *row, int n_kv, int cap, int hs, int pos)
{
    for (int g = 0; g < n_kv; g++)
        memcpy(base + ((size_t)g * (size_t)cap + (size_t)pos) * (size_t)hs,
               row + (size_t)g * (size_t)hs, (size_t)hs * sizeof(float));
}

static void get_row(float *row, const float *base, int n_kv, int cap, int hs, int pos)
{
    for (int g = 0; g < n_kv; g++)
        memcpy(row + (size_t)g * (size_t)hs,
               base + ((size_t)g * (size_t)cap + (size_t)pos) * (size_t)hs,
               (size_t)hs * sizeof(float));
}

/* ---- forward pass ---------------------------------------------------------------- */

const float *lm_forward(lm_state *s, int token, int pos)
{
    return lm_forward_hooked(s, token, pos, NULL);
}

const float *lm_forward_hooked(lm_state *s, int token, int pos, const lm_hooks *hk)
{
    if (!s)
        return NULL;
    const lm_model *m = s->m;
    const lm_config *c = &m->cfg;
    if (token < 0 || token >= c->vocab_size || pos < 0 || pos >= s->cap || pos > s->len)
        return NULL;
    const int dim = c->dim, hs = c->head_size, kvd = c->kv_dim, hid = c->hidden_dim;
    const int nkv = c->n_kv_heads, group = c->n_heads / c->n_kv_heads;
    const float sqrt_hs = sqrtf((float)hs);
    float *x = s->x;

    memcpy(x, m->w[A_EMB] + (size_t)token * (size_t)dim, (size_t)dim * sizeof(float));
    for (int i = 0; i < hs; i += 2)
        rope_cs(pos, i, hs, &s->rc[i / 2], &s->rs[i / 2]);

    for (int l = 0; l < c->n_layers; l++) {
        const size_t L = (size_t)l;
        float *kc = s->kc + L * s->layer_stride;
        float *kr = s->kr + L * s->layer_stride;
        float *vc = s->vc + L * s->layer_stride;

        rmsnorm(s->xb, x, m->w[A_RMS_ATT] + L * (size_t)dim, dim);
        matvec(s->q, m->w[A_WQ] + L * (size_t)dim * (size_t)dim, s->xb, dim, dim);
        matvec(s->k, m->w[A_WK] + L * (size_t)kvd * (size_t)dim, s->xb, kvd, dim);
        matvec(s->v, m->w[A_WV] + L * (size_t)kvd * (size_t)dim, s->xb, kvd, dim);
        put_row(kr, s->k, nkv, s->cap, hs, pos);
        for (int i = 0; i < hs; i += 2) {
            for (int h = 0; h < c->n_heads; h++)
                rotate_pair(s->q + (size_t)h * (size_t)hs + (size_t)i, s->rc[i / 2],
                            s->rs[i / 2], 0);
            for (int g = 0; g < nkv; g++)
                rotate_pair(s->k + (size_t)g * (size_t)hs + (size_t)i, s->rc[i / 2],
                            s->rs[i / 2], 0);
        }
        put_row(kc, s->k, nkv, s->cap, hs, pos);
        put_row(vc, s->v, nkv, s->cap, hs, pos);
        memcpy(s->qs + L * (size_t)dim, s->q, (size_t)dim * sizeof(float));

        /* Attention, query head h reading KV head h / group. */
        for (int h = 0; h < c->n_heads; h++) {
            const float *qh = s->q + (size_t)h * (size_t)hs;
            const size_t g = (size_t)(h / group);
            const float *K = kc + g * (size_t)s->cap * (size_t)hs;
            const float *V = vc + g * (size_t)s->cap * (size_t)hs;
            float *att = s->att;
            float mx = -INFINITY;
            const unsigned char *vis = NULL;
            if (hk && hk->select) {
                memset(s->vis, 1, (size_t)pos + 1);
                hk->select(hk->u, s, l, h, qh, pos, s->vis);
                s->vis[pos] = 1;
                vis = s->vis;
            }
            for (int t = 0; t <= pos; t++) {
                if (vis && !vis[t]) { /* hidden: exp(-inf) = 0 below */
                    att[t] = -INFINITY;
                    continue;
                }
                const float *kt = K + (size_t)t * (size_t)hs;
                float d = 0.0f;
                for (int i = 0; i < hs; i++)
                    d += qh[i] * kt[i];
                d /= sqrt_hs;
                att[t] = d;
                if (d > mx)
                    mx = d;
            }
            float sum = 0.0f;
            for (int t = 0; t <= pos; t++) {
                att[t] = expf(att[t] - mx);
                sum += att[t];
            }
            if (hk && hk->attended)
                hk->attended(hk->u, l, h, pos, att, sum);
            float *out = s->xb2 + (size_t)h * (size_t)hs;
            for (int i = 0; i < hs; i++)
                out[i] = 0.0f;
            for (int t = 0; t <= pos; t++) {
                const float a = att[t] / sum;
                const float *vt = V + (size_t)t * (size_t)hs;
                for (int i = 0; i < hs; i++)
                    out[i] += a * vt[i];
            }
        }
        matvec(s->xb, m->w[A_WO] + L * (size_t)dim * (size_t)dim, s->xb2, dim, dim);
        for (int i = 0; i < dim; i++)
            x[i] += s->xb[i];

        /* Feed-forward (SwiGLU). */
        rmsnorm(s->xb, x, m->w[A_RMS_FFN] + L * (size_t)dim, dim);
        matvec(s->hb, m->w[A_W1] + L * (size_t)hid * (size_t)dim, s->xb, hid, dim);
        matvec(s->hb2, m->w[A_W3] + L * (size_t)hid * (size_t)dim, s->xb, hid, dim);
        for (int i = 0; i < hid; i++) {
            float a = s->hb[i];
            s->hb[i] = a / (1.0f + expf(-a)) * s->hb2[i];
        }
        matvec(s->xb, m->w[A_W2] + L * (size_t)dim * (size_t)hid, s->hb, dim, hid);
        for (int i = 0; i < dim; i++)
            x[i] += s->xb[i];
    }
    rmsnorm(x, x, m->w[A_RMS_FINAL], dim);
    matvec(s->logits, m->w[A_WCLS], x, c->vocab_size, dim);
    s->len = pos + 1;
    return s->logits;
}

const float *lm_wo(const lm_model *m, int layer)
{
    if (!m || layer < 0 || layer >= m->cfg.n_layers)
        return NULL;
    return m->w[A_WO] + (size_t)layer * (size_t)m->cfg.dim * (size_t)m->cfg.dim;
}

const float *lm_logits(const lm_state *s)
{
    return s ? s->logits : NULL;
}

const float *lm_queries(const lm_state *s)
{
    return s ? s->qs : NULL;
}

/* ---- cache access ------------------------------------------------------------------- */

int lm_cache_length(const lm_state *s)
{
    return s ? s->len : 0;
}

int lm_cache_set_length(lm_state *s, int n)
{
    if (!s || n < 0 || n > s->cap)
        return -1;
    s->len = n;
    return 0;
}

static float *cache_base(const lm_state *s, int layer, int kind)
{
    if (!s || layer < 0 || layer >= s->m->cfg.n_layers)
        return NULL;
    float *all;
    switch (kind) {
    case LM_KEY: all = s->kc; break;
    case LM_KEY_PREROPE: all = s->kr; break;
    case LM_VALUE: all = s->vc; break;
    default: return NULL;
    }
    return all + (size_t)layer * s->layer_stride;
}

const float *lm_cache_data(const lm_state *s, int layer, int kind)
{
    return cache_base(s, layer, kind);
}

int lm_cache_get(const lm_state *s, int layer, int pos, int kind, float *out)
{
    const float *base = cache_base(s, layer, kind);
    if (!base || !out || pos < 0 || pos >= s->cap)
        return -1;
    const lm_config *c = &s->m->cfg;
    get_row(out, base, c->n_kv_heads, s->cap, c->head_size, pos);
    return 0;
}

int lm_cache_set(lm_state *s, int layer, int pos, int kind, const float *in)
{
    float *base = cache_base(s, layer, kind);
    if (!base || !in || pos < 0 || pos >= s->cap)
        return -1;
    const lm_config *c = &s->m->cfg;
    const int nkv = c->n_kv_heads, hs = c->head_size;
    put_row(base, in, nkv, s->cap, hs, pos);
    if (kind == LM_VALUE)
        return 0;
    /* Keep the other key form consistent. */
    memcpy(s->tmp, in, (size_t)c->kv_dim * sizeof(float));
    lm_rope(s->tmp, nkv, hs, pos, kind == LM_KEY);
    float *other = cache_base(s, layer, kind == LM_KEY ? LM_KEY_PREROPE : LM_KEY);
    put_row(other, s->tmp, nkv, s->cap, hs, pos);
    return 0;
}

/* ---- decoding helpers ------------------------------------------------------------- */

void lm_rng_seed(lm_rng *r, uint64_t seed)
{
    r->state = seed;
}

uint64_t lm_rng_next(lm_rng *r)
{
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

double lm_rng_uniform(lm_rng *r)
{
    return (double)(lm_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

int lm_argmax(const float *logits, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

int lm_sample(const float *logits, int n, double temperature, lm_rng *r)
{
    if (!(temperature > 0.0))
        return lm_argmax(logits, n);
    const int top = lm_argmax(logits, n);
    const double mx = logits[top];
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += exp(((double)logits[i] - mx) / temperature);
    const double u = lm_rng_uniform(r) * sum;
    double acc = 0.0;
    int last = top;
    for (int i = 0; i < n; i++) {
        double p = exp(((double)logits[i] - mx) / temperature);
        if (p > 0.0)
            last = i;
        acc += p;
        if (u < acc)
            return i;
    }
    return last; /* rounding left u at the very top */
}

static double log_sum_exp(const float *logits, int n)
{
    double mx = logits[lm_argmax(logits, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += exp((double)logits[i] - mx);
    return mx + log(sum);
}

double lm_logprob(const float *logits, int n, int token)
{
    return (double)logits[token] - log_sum_exp(logits, n);
}

double lm_nll(const float *logits, int n, int token)
{
    return -lm_logprob(logits, n, token);
}

void lm_log_softmax(const float *logits, int n, double *out)
{
    double lse = log_sum_exp(logits, n);
    for (int i = 0; i < n; i++)
        out[i] = (double)logits[i] - lse;
}
