/* Helpers shared by the CLI sources; see cli_util.h. */
#define _POSIX_C_SOURCE 200809L
#include "cli_util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void cli_text_str(FILE *f, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        unsigned char c1 = i + 1 < n ? (unsigned char)s[i + 1] : 0;
        if (c < 0x20 || c == 0x7F) {
            fprintf(f, "\\x%02x", c);
        } else if (c == 0xC2 && c1 >= 0x80 && c1 <= 0x9F) {
            fprintf(f, "\\u%04x", c1);
            i++;
        } else {
            fputc(c, f);
        }
    }
}

void cli_text_cstr(FILE *f, const char *s) { cli_text_str(f, s, strlen(s)); }

void cli_json_str(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7F)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

void cli_json_cstr(FILE *f, const char *s) { cli_json_str(f, s, strlen(s)); }

void cli_err(const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fputs("fkvf: ", stderr);
    cli_text_cstr(stderr, buf);
    fputc('\n', stderr);
}

void cli_err_lib(const char *path, const char *msg)
{
    size_t n = strlen(path);
    if (!msg || !*msg)
        msg = "unknown error";
    if (!strncmp(msg, path, n) && msg[n] == ':')
        cli_err("%s", msg);
    else
        cli_err("%s: %s", path, msg);
}

int cli_fkvf_exit(int rc)
{
    return (rc == FKVF_E_IO || rc == FKVF_E_NOMEM || rc == FKVF_E_INVALID_ARG) ? CLI_USAGE
                                                                                 : CLI_INVALID;
}

int cli_class_exit(int rc)
{
    return fkvf_error_class(rc) == FKVF_ERRCLASS_FORMAT ? CLI_INVALID : CLI_USAGE;
}

int cli_kvio_exit(int rc) { return rc == KVIO_E_IO || rc == KVIO_E_NOMEM ? CLI_USAGE : CLI_INVALID; }

const char *cli_base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

void cli_hex16(const uint8_t h[16], char out[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", h[i]);
}

int cli_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    /* digits only: strtoull also takes leading blanks and a sign, and
     * " -1" would wrap to 2^64-1 */
    if (!s || *s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return -1;
    *out = v;
    return 0;
}

int cli_parse_f64(const char *s, double *out)
{
    /* strtod skips leading blanks: " 2" is not a number here, as for
     * cli_parse_u64 */
    if (!s || !*s || isspace((unsigned char)*s))
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

int cli_parse_list(const char *s, uint32_t **out, size_t *n)
{
    size_t cap = 16, k = 0;
    uint32_t *v = malloc(cap * sizeof *v);
    if (!v)
        return 0;
    const char *p = s;
    while (*p) {
        char *end;
        if (*p < '0' || *p > '9') {
            free(v);
            return 0;
        }
        unsigned long long x = strtoull(p, &end, 10);
        if (end == p || x > UINT32_MAX || (*end && *end != ',')) {
            free(v);
            return 0;
        }
        if (k == cap) {
            cap *= 2;
            uint32_t *t = realloc(v, cap * sizeof *v);
            if (!t) {
                free(v);
                return 0;
            }
            v = t;
        }
        v[k++] = (uint32_t)x;
        p = *end ? end + 1 : end;
        if (*end && !*p) {
            free(v);
            return 0;
        }
    }
    if (!k) {
        free(v);
        return 0;
    }
    *out = v;
    *n = k;
    return 1;
}

/* Decimal digits at *p (at least one) with a value <= max: advances *p. */
static int name_number(const char **p, unsigned max, unsigned *v)
{
    const char *s = *p;
    unsigned x = 0;
    if (*s < '0' || *s > '9')
        return 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        x = x * 10 + (unsigned)(*s - '0');
        if (x > max)
            return 0;
    }
    *p = s;
    *v = x;
    return 1;
}

int cli_parse_stream_name(const char *s, uint64_t *id)
{
    if (!strcmp(s, "tokens")) {
        *id = FKVF_STREAM_ID_TOKENS;
        return 1;
    }
    /* "L%u.H%u.%c.%u" by hand: sscanf's %u skips blanks, takes a sign and
     * wraps large numbers ("L4294967296" was layer 0) */
    unsigned l, h, st;
    const char *p = s;
    char kv;
    if (*p++ != 'L' || !name_number(&p, 0xFFFF, &l) || *p++ != '.' || *p++ != 'H' ||
        !name_number(&p, 0xFFFF, &h) || *p++ != '.')
        return 0;
    kv = *p++;
    if ((kv != 'K' && kv != 'V') || *p++ != '.' || !name_number(&p, 0xFF, &st) || *p)
        return 0;
    *id = FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, l, h, kv == 'V', st);
    return 1;
}

void cli_stream_name(uint64_t id, char *out, size_t n)
{
    if ((id >> 56) == FKVF_STREAM_KIND_TOKENS)
        snprintf(out, n, "tokens");
    else
        snprintf(out, n, "L%u.H%u.%c.%u", (unsigned)(id & 0xFFFF), (unsigned)(id >> 16 & 0xFFFF),
                 (id >> 32 & 0xFF) ? 'V' : 'K', (unsigned)(id >> 40 & 0xFF));
}

int cli_opt_k(const char *a, const char *v, uint32_t *k)
{
    uint64_t x;
    if (cli_parse_u64(v, 4096, &x) || x < 16 || (x & (x - 1))) {
        cli_err("%s: '%s' is not a power of two from 16 to 4096", a, v ? v : "");
        return -1;
    }
    *k = (uint32_t)x;
    return 0;
}

int cli_opt_stages(const char *a, const char *v, uint8_t *s)
{
    uint64_t x;
    if (cli_parse_u64(v, 16, &x)) {
        cli_err("%s: '%s' is not a stage count 0..16", a, v ? v : "");
        return -1;
    }
    *s = (uint8_t)x;
    return 0;
}

int cli_opt_count(const char *a, const char *v, uint64_t *n)
{
    if (cli_parse_u64(v, UINT32_MAX, n)) {
        cli_err("%s: '%s' is not a count", a, v ? v : "");
        return -1;
    }
    return 0;
}

int cli_opt_codec(const char *v, int *ngon)
{
    if (!strcmp(v, "quad") || !strcmp(v, "ngon")) {
        *ngon = v[0] == 'n';
        return 0;
    }
    cli_err("--codec: '%s' is not quad or ngon", v);
    return -1;
}

int cli_opt_beam(const char *v, uint32_t *beam)
{
    uint64_t x;
    if (cli_parse_u64(v, FKVF_RVQ_MAX_BEAM, &x) || x < 1) {
        cli_err("--beam: '%s' is not 1..%d", v, FKVF_RVQ_MAX_BEAM);
        return -1;
    }
    *beam = (uint32_t)x;
    return 0;
}

int cli_opt_iters(const char *v, uint32_t *iters)
{
    uint64_t x;
    if (cli_parse_u64(v, 100000, &x) || x < 1) {
        cli_err("--iters: '%s' is not 1..100000", v);
        return -1;
    }
    *iters = (uint32_t)x;
    return 0;
}

int cli_opt_seed(const char *v, uint64_t *seed)
{
    if (cli_parse_u64(v, UINT64_MAX, seed)) {
        cli_err("--seed: '%s' is not a number", v);
        return -1;
    }
    return 0;
}

int cli_opt_keys(const char *v, int *pre_rope)
{
    if (!strcmp(v, "pre-rope") || !strcmp(v, "as-is")) {
        *pre_rope = v[0] == 'p';
        return 0;
    }
    cli_err("--keys: '%s' is not pre-rope or as-is", v);
    return -1;
}

int cli_opt_rope_theta(const char *v, double *theta)
{
    if (cli_parse_f64(v, theta) || !(*theta > 0)) {
        cli_err("--rope-theta: '%s' is not a positive number", v);
        return -1;
    }
    return 0;
}

int cli_opt_rope_dims(const char *v, uint32_t *dims)
{
    uint64_t x;
    if (cli_parse_u64(v, 65536, &x) || x < 2 || x % 2) {
        cli_err("--rope-dims: '%s' is not an even number >= 2", v);
        return -1;
    }
    *dims = (uint32_t)x;
    return 0;
}

int cli_opt_rope_layout(const char *v, uint8_t *layout)
{
    if (!strcmp(v, "interleaved") || !strcmp(v, "half-split")) {
        *layout = v[0] == 'i' ? 1 : 2;
        return 0;
    }
    cli_err("--rope-layout: '%s' is not interleaved or half-split", v);
    return -1;
}

void cli_code_opts_init(cli_code_opts *o)
{
    memset(o, 0, sizeof *o);
    o->k = 256;
    o->ks = 4;
    o->vs = 2;
    o->sinks = 4;
    o->recent = 32;
    o->beam = 1;
    o->iters = 25;
}

int cli_code_value(cli_code_opts *o, const char *a, const char *v)
{
    int bad;
    if (!strcmp(a, "--k")) {
        bad = cli_opt_k(a, v, &o->k);
        o->k_set = 1;
    } else if (!strcmp(a, "--k-stages"))
        bad = cli_opt_stages(a, v, &o->ks);
    else if (!strcmp(a, "--v-stages"))
        bad = cli_opt_stages(a, v, &o->vs);
    else if (!strcmp(a, "--sinks"))
        bad = cli_opt_count(a, v, &o->sinks);
    else if (!strcmp(a, "--recent"))
        bad = cli_opt_count(a, v, &o->recent);
    else if (!strcmp(a, "--codec"))
        bad = cli_opt_codec(v, &o->ngon);
    else if (!strcmp(a, "--beam"))
        bad = cli_opt_beam(v, &o->beam);
    else if (!strcmp(a, "--iters"))
        bad = cli_opt_iters(v, &o->iters);
    else if (!strcmp(a, "--seed"))
        bad = cli_opt_seed(v, &o->seed);
    else if (!strcmp(a, "--model-id"))
        bad = (o->model_id = v, 0);
    else if (!strcmp(a, "--tokenizer-id"))
        bad = (o->tok_id = v, 0);
    else
        return 0;
    return bad ? -1 : 1;
}

void cli_key_opts_init(cli_key_opts *k)
{
    memset(k, 0, sizeof *k);
    k->pre_rope = 1;
    k->theta = 10000.0;
    k->layout = 1;
}

int cli_key_value(cli_key_opts *k, const char *a, const char *v)
{
    if (!strcmp(a, "--keys")) {
        if (cli_opt_keys(v, &k->pre_rope))
            return -1;
        k->keys_set = 1;
    } else if (!strcmp(a, "--rope-theta")) {
        if (cli_opt_rope_theta(v, &k->theta))
            return -1;
        k->theta_set = 1;
    } else if (!strcmp(a, "--rope-dims")) {
        if (cli_opt_rope_dims(v, &k->dims))
            return -1;
        k->dims_set = 1;
    } else if (!strcmp(a, "--rope-layout")) {
        if (cli_opt_rope_layout(v, &k->layout))
            return -1;
        k->layout_set = 1;
    } else {
        return 0;
    }
    return 1;
}

void cli_keys_from_codebook(fkvf_reader *cb, cli_key_opts *k, uint32_t key_dim)
{
    fkvf_meta_entry e;
    if (!k->keys_set && fkvf_reader_meta_find(cb, "train.keys", &e) == FKVF_OK &&
        e.type == FKVF_META_UTF8) {
        if (e.value_len == 5 && !memcmp(e.value, "as-is", 5))
            k->pre_rope = 0;
        else if (e.value_len == 8 && !memcmp(e.value, "pre-rope", 8))
            k->pre_rope = 1;
    }
    if (!k->theta_set && fkvf_reader_meta_find(cb, "train.rope_theta", &e) == FKVF_OK &&
        e.type == FKVF_META_F64 && isfinite(e.f64) && e.f64 > 0)
        k->theta = e.f64;
    if (!k->dims_set && fkvf_reader_meta_find(cb, "train.rope_dims", &e) == FKVF_OK &&
        e.type == FKVF_META_U64 && e.u64 >= 2 && e.u64 <= key_dim && e.u64 % 2 == 0)
        k->dims = (uint32_t)e.u64;
    if (!k->layout_set && fkvf_reader_meta_find(cb, "train.rope_layout", &e) == FKVF_OK &&
        e.type == FKVF_META_UTF8) {
        if (e.value_len == 10 && !memcmp(e.value, "half-split", 10))
            k->layout = 2;
        else if (e.value_len == 11 && !memcmp(e.value, "interleaved", 11))
            k->layout = 1;
    }
}

int cli_key_rope(const cli_key_opts *k, uint32_t key_dim, const char *path, fkvf_rope *rope,
                 const fkvf_rope **out)
{
    *out = NULL;
    rope->layout = k->layout;
    rope->theta = k->theta;
    rope->rope_dims = k->dims ? k->dims : key_dim;
    if (!k->no_rope && !k->dims && key_dim % 2) {
        cli_err("%s: key_dim %u is odd, and RoPE rotates pairs of dims: give --rope-dims N "
                "(even, at most %u) or --no-rope",
                path, key_dim, key_dim - 1);
        return -1;
    }
    if (!k->no_rope && (rope->rope_dims > key_dim || rope->rope_dims % 2)) {
        cli_err("%s: --rope-dims %u does not fit key_dim %u (even, at most key_dim)", path,
                rope->rope_dims, key_dim);
        return -1;
    }
    if (k->pre_rope && !k->no_rope)
        *out = rope;
    return 0;
}

int cli_attach_codebook(fkvf_reader *r, const char *archive, const char *given,
                        fkvf_reader **cb, char *missing, size_t missing_size)
{
    *cb = NULL;
    if (missing && missing_size)
        missing[0] = 0;
    int ext = 0;
    uint8_t want[16];
    const char *name = NULL;
    if (fkvf_reader_codebook_ref(r, &ext, want, &name) != FKVF_OK || !ext)
        return CLI_OK;
    char hx[33];
    cli_hex16(want, hx);
    if (given) {
        fkvf_reader *c = NULL;
        int rc = fkvf_reader_open_file(&c, given, 0, NULL);
        if (rc != FKVF_OK) {
            cli_err("%s: %s (the archive %s expects the codebook with content hash %s)", given,
                    c ? fkvf_reader_message(c) : fkvf_strerror(rc), archive, hx);
            fkvf_reader_free(c);
            return CLI_INVALID;
        }
        if ((rc = fkvf_reader_attach_codebook(r, c)) != FKVF_OK) {
            cli_err("%s: wrong codebook for %s: %s", given, archive, fkvf_reader_message(r));
            fkvf_reader_free(c);
            return CLI_INVALID;
        }
        *cb = c;
        return CLI_OK;
    }
    int rc = fkvf_reader_find_codebook(r, getenv("FKVF_CODEBOOK_PATH"), cb);
    if (rc == FKVF_OK)
        return CLI_OK;
    const char *msg = fkvf_reader_message(r);
    if ((rc == FKVF_E_NOT_FOUND || rc == FKVF_E_IO) && missing) {
        snprintf(missing, missing_size, "%s", msg);
        return CLI_OK;
    }
    if (rc == FKVF_E_NOT_FOUND)
        cli_err("%s; pass --codebooks FILE, or put its directory in FKVF_CODEBOOK_PATH", msg);
    else
        cli_err_lib(archive, msg);
    return rc == FKVF_E_NOT_FOUND || rc == FKVF_E_CODEBOOK ? CLI_INVALID : CLI_USAGE;
}

unsigned cli_quad_bits_for(uint64_t maxv)
{
    unsigned b = 2;
    while (b < 32 && (maxv >> b) != 0)
        b += 2;
    return b;
}

uint64_t cli_file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

void cli_progress_init(cli_progress *p, const char *label, int quiet)
{
    p->on = !quiet && isatty(STDERR_FILENO);
    p->last = -1;
    p->label = label;
}

void cli_progress_cb(void *opaque, uint64_t done, uint64_t total)
{
    cli_progress *p = opaque;
    if (!p->on || total == 0)
        return;
    int pct = (int)(done * 100 / total);
    if (pct == p->last)
        return;
    p->last = pct;
    int fill = pct * 30 / 100;
    fprintf(stderr, "\r%s [", p->label);
    for (int i = 0; i < 30; i++)
        fputc(i < fill ? '#' : ' ', stderr);
    fprintf(stderr, "] %3d%%", pct);
    if (done >= total)
        fputc('\n', stderr);
    fflush(stderr);
}

int cli_read_cache(const char *path, kvio_cache *c)
{
    char err[512];
    int rc = kvio_read(path, KVIO_FMT_AUTO, KVIO_READ_IGNORE_EXTRA, c, err, sizeof err);
    if (rc != KVIO_OK) {
        cli_err("%s", err);
        return cli_kvio_exit(rc);
    }
    return CLI_OK;
}

size_t cli_cache_row_elems(const kvio_cache *c)
{
    return (size_t)c->n_layers * c->n_kv_heads * ((size_t)c->key_dim + c->value_dim);
}

size_t cli_cache_row_bytes(const kvio_cache *c) { return cli_cache_row_elems(c) * kvio_dtype_size(c->dtype); }

void cli_cache_rows(const kvio_cache *c, uint32_t p0, uint32_t p1, uint8_t *out)
{
    size_t es = kvio_dtype_size(c->dtype);
    size_t kb = (size_t)c->key_dim * es, vb = (size_t)c->value_dim * es;
    for (uint32_t p = p0; p < p1; p++) {
        for (uint32_t l = 0; l < c->n_layers; l++) {
            for (uint32_t h = 0; h < c->n_kv_heads; h++, out += kb)
                memcpy(out, c->keys[l] + ((size_t)h * c->n_positions + p) * kb, kb);
            for (uint32_t h = 0; h < c->n_kv_heads; h++, out += vb)
                memcpy(out, c->values[l] + ((size_t)h * c->n_positions + p) * vb, vb);
        }
    }
}

void cli_rvq_params_for(fkvf_rvq_params *prm, const kvio_cache *c)
{
    fkvf_rvq_params_init(prm);
    prm->n_layers = c->n_layers;
    prm->n_kv_heads = c->n_kv_heads;
    prm->key_dim = c->key_dim;
    prm->value_dim = c->value_dim;
}

void cli_desc_for(fkvf_desc *d, const kvio_cache *c, const fkvf_rope *rope, int no_rope,
                  const fkvf_rope *krope)
{
    memset(d, 0, sizeof *d);
    d->n_layers = c->n_layers;
    d->n_kv_heads = c->n_kv_heads;
    d->key_dim = c->key_dim;
    d->value_dim = c->value_dim;
    d->dtype = c->dtype;
    if (!no_rope) {
        d->key_transform = 1;
        d->rope_layout = rope->layout;
        d->rope_dims = rope->rope_dims;
        d->rope_theta = rope->theta;
        d->key_storage = krope ? 1 : 0;
    }
}

int cli_open_reader(fkvf_reader **r, const char *path)
{
    *r = NULL;
    int rc = fkvf_reader_open_file(r, path, 0, NULL);
    if (rc == FKVF_OK)
        return CLI_OK;
    cli_err_lib(path, *r ? fkvf_reader_message(*r) : fkvf_strerror(rc));
    fkvf_reader_free(*r);
    *r = NULL;
    return rc == FKVF_E_IO ? CLI_USAGE : CLI_INVALID;
}
