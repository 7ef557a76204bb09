/* Helpers shared by the CLI sources; see cli_util.h. */
#define _POSIX_C_SOURCE 200809L
#include "cli_util.h"
#include "cli_remote.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
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

/* Bytes of the well-formed UTF-8 sequence at s[0..n) (1..4; no overlong
 * form, no surrogate, at most U+10FFFF), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t k = 2; k < len; k++)
        if (s[k] < 0x80 || s[k] > 0xBF)
            return 0;
    return len;
}

void cli_json_str(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            /* JSON text is UTF-8: a byte that does not start a well-formed
             * sequence (a file name in another encoding) becomes U+FFFD */
            size_t len = utf8_len((const unsigned char *)s + i, n - i);
            if (!len) {
                fputs("\\ufffd", f);
            } else {
                fwrite(s + i, 1, len, f);
                i += len - 1;
            }
        } else if (c == '"' || c == '\\')
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

/* ---- the command, its error lines and the --json error object ---------- */

static const char *g_prog = "fkvf", *g_cmd;
static int g_json, g_json_done;

/* the first error of the run */
static struct {
    int set, ex, code; /* ex 0: by the final exit status; code 0: by ex */
    char msg[2048], file[1024];
    int has_file;
    uint64_t offset; /* FKVF_ERROR_NO_OFFSET: none */
    char clause[32];
    char field[64]; /* "": none */
} g_err;

void cli_set_command(const char *prog, const char *cmd, int json)
{
    g_prog = prog;
    g_cmd = cmd;
    g_json = json;
}

int cli_json_mode(void) { return g_json; }
void cli_json_done(void) { g_json_done = 1; }

static void line_start(FILE *f)
{
    fputs(g_prog, f);
    if (g_cmd) {
        fputc(' ', f);
        fputs(g_cmd, f);
    }
    fputs(": ", f);
}

static void put_line(const char *msg)
{
    line_start(stderr);
    cli_text_cstr(stderr, msg);
    fputc('\n', stderr);
}

/* s into out[n], cut to fit */
static void copy_cut(char *out, size_t n, const char *s)
{
    size_t l = strlen(s);
    if (l >= n)
        l = n - 1;
    memcpy(out, s, l);
    out[l] = 0;
}

static void record(int ex, int code, const char *file, const char *msg, uint64_t offset,
                   const char *clause, const char *field)
{
    if (g_err.set)
        return;
    g_err.set = 1;
    g_err.ex = ex;
    g_err.code = code;
    copy_cut(g_err.msg, sizeof g_err.msg, msg);
    g_err.has_file = file != NULL;
    copy_cut(g_err.file, sizeof g_err.file, file ? file : "");
    g_err.offset = offset;
    copy_cut(g_err.clause, sizeof g_err.clause, clause ? clause : "");
    copy_cut(g_err.field, sizeof g_err.field, field ? field : "");
}

static const char *const kvio_code_names[] = {"KVIO_OK",     "KVIO_E_ARG",         "KVIO_E_IO",
                                         "KVIO_E_NOMEM", "KVIO_E_FORMAT",     "KVIO_E_UNSUPPORTED",
                                         "KVIO_E_CONVENTION", "KVIO_E_EXISTS"};

static void error_object(FILE *f, int rex, int code, const char *msg, const char *file,
                         uint64_t offset, const char *clause, const char *field)
{
    if (!code)
        code = FKVF_E_INVALID_ARG;
    const char *name = code >= 100 && code - 100 < (int)(sizeof kvio_code_names / sizeof kvio_code_names[0])
                           ? kvio_code_names[code - 100]
                           : fkvf_error_name(code);
    const char *cls;
    if (rex == CLI_USAGE)
        cls = code == FKVF_E_IO || code == FKVF_E_NOMEM || code == FKVF_E_UNSUPPORTED
                  ? "environment"
                  : "usage";
    else
        cls = code < 100 && fkvf_error_class(code) == FKVF_ERRCLASS_FORMAT ? "format" : "input";
    fprintf(f, "{\"code\":%d,\"name\":", code);
    cli_json_cstr(f, name);
    fprintf(f, ",\"class\":\"%s\",\"message\":", cls);
    cli_json_cstr(f, msg);
    fputs(",\"file\":", f);
    if (file)
        cli_json_cstr(f, file);
    else
        fputs("null", f);
    if (offset != FKVF_ERROR_NO_OFFSET)
        fprintf(f, ",\"offset\":%llu", (unsigned long long)offset);
    else
        fputs(",\"offset\":null", f);
    fputs(",\"clause\":", f);
    if (clause && *clause)
        cli_json_cstr(f, clause);
    else
        fputs("null", f);
    fputs(",\"field\":", f);
    if (field && *field)
        cli_json_cstr(f, field);
    else
        fputs("null", f);
    fputc('}', f);
}

void cli_json_error_object(FILE *f, int ex, int code, const char *file, const char *msg)
{
    error_object(f, ex, code, msg, file, FKVF_ERROR_NO_OFFSET, NULL, NULL);
}

static void json_error_object(FILE *f, int ex)
{
    char generic[64];
    snprintf(generic, sizeof generic, "failed with exit status %d", ex);
    if (!g_err.set) {
        error_object(f, ex, 0, generic, NULL, FKVF_ERROR_NO_OFFSET, NULL, NULL);
        return;
    }
    error_object(f, g_err.ex ? g_err.ex : ex, g_err.code, g_err.msg,
                 g_err.has_file ? g_err.file : NULL, g_err.offset, g_err.clause, g_err.field);
}

void cli_json_error_member(FILE *f, int ex)
{
    fputs(",\"error\":", f);
    if (ex == CLI_OK && !g_err.set) {
        fputs("null", f);
        return;
    }
    json_error_object(f, ex);
}

int cli_finish(int ex)
{
    if (g_json && ex != CLI_OK && !g_json_done) {
        fputs("{\"error\":", stdout);
        json_error_object(stdout, ex);
        fputs("}\n", stdout);
    }
    fflush(stdout);
    return ex;
}

int cli_usage(const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    put_line(buf);
    record(CLI_USAGE, FKVF_E_INVALID_ARG, NULL, buf, FKVF_ERROR_NO_OFFSET, NULL, NULL);
    return CLI_USAGE;
}

static void vline_tagged(const char *tag, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
static void vline_tagged(const char *tag, const char *fmt, va_list ap)
{
    char buf[2048];
    vsnprintf(buf, sizeof buf, fmt, ap);
    line_start(stderr);
    fputs(tag, stderr);
    cli_text_cstr(stderr, buf);
    fputc('\n', stderr);
}

void cli_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vline_tagged("warning: ", fmt, ap);
    va_end(ap);
}

void cli_note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vline_tagged("note: ", fmt, ap);
    va_end(ap);
}

/* "FILE: " in front of body unless body starts with it */
static void with_file(char *out, size_t n, const char *file, const char *body)
{
    size_t fl = file ? strlen(file) : 0;
    if (!file || (!strncmp(body, file, fl) && body[fl] == ':'))
        snprintf(out, n, "%s", body);
    else
        snprintf(out, n, "%s: %s", file, body);
}

int cli_fail(int ex, int code, const char *file, const char *fmt, ...)
{
    char body[2048], buf[3072];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    with_file(buf, sizeof buf, file, body);
    put_line(buf);
    record(ex, code, file, buf, FKVF_ERROR_NO_OFFSET, NULL, NULL);
    return ex;
}

int cli_fail_at(int ex, int code, const char *file, uint64_t offset, const char *clause,
                const char *fmt, ...)
{
    char body[2048], buf[3072];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    with_file(buf, sizeof buf, file, body);
    put_line(buf);
    record(ex, code, file, buf, offset, clause, NULL);
    return ex;
}

int cli_fail_lib(int rc, const fkvf_error_info *e, const char *file, const char *prefix)
{
    const char *msg = e && e->message && *e->message ? e->message : fkvf_strerror(rc);
    size_t fl = file ? strlen(file) : 0;
    /* the library's message names the file first: once is enough */
    if (file && !strncmp(msg, file, fl) && msg[fl] == ':')
        msg += fl + (msg[fl + 1] == ' ' ? 2 : 1);
    char body[2048], buf[3072];
    snprintf(body, sizeof body, "%s%s", prefix ? prefix : "", msg);
    with_file(buf, sizeof buf, file, body);
    put_line(buf);
    int ex = cli_fkvf_exit(rc);
    record(ex, rc, file, buf, e ? e->offset : FKVF_ERROR_NO_OFFSET, e ? e->clause : NULL,
           e ? e->field : NULL);
    return ex;
}

int cli_fail_reader(int rc, const fkvf_reader *r, const char *file, const char *prefix)
{
    fkvf_error_info e;
    int have = r && fkvf_reader_error(r, &e) == FKVF_OK && e.code != FKVF_OK;
    int ex = cli_fail_lib(rc, have ? &e : NULL, file, prefix);
    llst_kind k = rc == FKVF_E_BAD_MAGIC && file ? cli_llama_sniff_file(file) : LLST_KIND_NONE;
    if (k != LLST_KIND_NONE) /* a common mix-up: say what it is */
        cli_note("%s is a llama.cpp %s file, not an FKVF archive: fkvf info %s says what it "
                 "holds, fkvf import-llama %s --model MODEL.gguf -o ARCHIVE archives it",
                 file, llst_kind_name(k), file, file);
    return ex;
}

int cli_fail_writer(int rc, const fkvf_writer *w, const char *file, const char *prefix)
{
    fkvf_error_info e;
    int have = w && fkvf_writer_error(w, &e) == FKVF_OK && e.code != FKVF_OK;
    return cli_fail_lib(rc, have ? &e : NULL, file, prefix);
}

int cli_fail_appender(int rc, const fkvf_appender *a, const char *file, const char *prefix)
{
    fkvf_error_info e;
    int have = a && fkvf_appender_error(a, &e) == FKVF_OK && e.code != FKVF_OK;
    return cli_fail_lib(rc, have ? &e : NULL, file, prefix);
}

int cli_fail_search(int rc, const fkvf_search *s, const char *file, const char *prefix)
{
    fkvf_error_info e;
    int have = s && fkvf_search_error(s, &e) == FKVF_OK && e.code != FKVF_OK;
    return cli_fail_lib(rc, have ? &e : NULL, file, prefix);
}

int cli_fail_kvio(int rc, const char *file, const char *err)
{
    int code = rc == KVIO_E_IO ? FKVF_E_IO : rc == KVIO_E_NOMEM ? FKVF_E_NOMEM
             : rc == KVIO_E_ARG ? FKVF_E_INVALID_ARG : rc == KVIO_E_EXISTS ? FKVF_E_EXISTS
                                                                      : 100 + rc;
    char buf[3072];
    with_file(buf, sizeof buf, file, err && *err ? err : kvio_strerror(rc));
    put_line(buf);
    int ex = cli_kvio_exit(rc);
    record(ex, code, file, buf, FKVF_ERROR_NO_OFFSET, NULL, NULL);
    return ex;
}

int cli_fkvf_exit(int rc)
{
    return (rc == FKVF_E_IO || rc == FKVF_E_NOMEM || rc == FKVF_E_INVALID_ARG ||
            rc == FKVF_E_STATE || rc == FKVF_E_UNSUPPORTED)
               ? CLI_USAGE
               : CLI_INVALID;
}

int cli_kvio_exit(int rc)
{
    return rc == KVIO_E_IO || rc == KVIO_E_NOMEM || rc == KVIO_E_ARG ? CLI_USAGE : CLI_INVALID;
}

/* ---- output files ----------------------------------------------------------- */

int cli_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return a && b && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

int cli_check_output(const char *out, const char *const *in, size_t n_in, int force)
{
    struct stat so;
    if (stat(out, &so) == 0) {
        if (S_ISDIR(so.st_mode)) /* --force could not help: say what to give */
            return cli_fail(CLI_USAGE, FKVF_E_INVALID_ARG, out,
                            "is a directory: give the name of the file to write");
        for (size_t i = 0; i < n_in; i++)
            if (cli_same_file(in[i], out))
                return cli_fail(CLI_INVALID, FKVF_E_EXISTS, out,
                                "is the same file as the input %s (an output never replaces "
                                "an input, not even with --force)",
                                in[i]);
        if (!force)
            return cli_fail(CLI_INVALID, FKVF_E_EXISTS, out,
                            "exists; not replaced (give --force to replace it)");
    } else if (!force && lstat(out, &so) == 0) {
        return cli_fail(CLI_INVALID, FKVF_E_EXISTS, out,
                        "exists (a symbolic link to nothing); not replaced (give --force to "
                        "replace it)");
    }
    return CLI_OK;
}

void cli_warn_fkvf_name(const char *out, const char *what)
{
    static const char *const other[] = {".safetensors", ".npz", ".npy", ".pt",
                                        ".pth",         ".bin", ".gguf"};
    const char *dot = strrchr(cli_base_name(out), '.');
    if (!dot)
        return;
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        if (!strcasecmp(dot, other[i])) {
            cli_warn("%s: the name ends in %s, but the file written is an FKVF %s, not a %s "
                     "file (name it .fkvf)",
                     out, dot, what, other[i] + 1);
            return;
        }
}

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
    else if (id == FKVF_STREAM_ID_UNNAMED) /* the layer table of an external codebook
                                            * not attached names it (spec 11.2) */
        snprintf(out, n, "unnamed");
    else
        snprintf(out, n, "L%u.H%u.%c.%u", (unsigned)(id & 0xFFFF), (unsigned)(id >> 16 & 0xFFFF),
                 (id >> 32 & 0xFF) ? 'V' : 'K', (unsigned)(id >> 40 & 0xFF));
}

int cli_opt_k(const char *a, const char *v, uint32_t *k)
{
    uint64_t x;
    if (cli_parse_u64(v, 4096, &x) || x < 16 || (x & (x - 1))) {
        cli_usage("%s: '%s' is not a power of two from 16 to 4096", a, v ? v : "");
        return -1;
    }
    *k = (uint32_t)x;
    return 0;
}

int cli_opt_stages(const char *a, const char *v, uint8_t *s)
{
    uint64_t x;
    if (cli_parse_u64(v, 16, &x)) {
        cli_usage("%s: '%s' is not a stage count 0..16", a, v ? v : "");
        return -1;
    }
    *s = (uint8_t)x;
    return 0;
}

int cli_opt_layer_stages(const char *a, const char *v, uint8_t *lst, uint32_t *n, uint8_t *ks,
                         uint8_t *vs)
{
    uint32_t m = 0;
    uint8_t mk = 0, mv = 0;
    const char *p = v ? v : "";
    for (;;) {
        char *end;
        unsigned long k, s;
        if (*p < '0' || *p > '9')
            break;
        k = strtoul(p, &end, 10);
        if (*end != ':' || end[1] < '0' || end[1] > '9' || k > 16)
            break;
        s = strtoul(end + 1, &end, 10);
        if (s > 16 || m >= 1024 || (*end != ',' && *end != '\0'))
            break;
        lst[2 * m] = (uint8_t)k;
        lst[2 * m + 1] = (uint8_t)s;
        mk = (uint8_t)k > mk ? (uint8_t)k : mk;
        mv = (uint8_t)s > mv ? (uint8_t)s : mv;
        m++;
        if (*end == '\0') {
            *n = m;
            *ks = mk;
            *vs = mv;
            return 0;
        }
        p = end + 1;
    }
    cli_usage("%s: '%s' is not a list of KEY:VALUE stage counts (0..16 each), one a layer, "
              "separated by commas (e.g. 1:1,4:2,4:2)",
              a, v ? v : "");
    return -1;
}

const uint8_t *cli_layer_table(const uint8_t *lst, uint32_t n, uint32_t n_layers, int *bad)
{
    *bad = 0;
    if (!n)
        return NULL;
    if (n != n_layers) {
        cli_usage("--layer-stages gives %u layers, the cache has %u", n, n_layers);
        *bad = 1;
        return NULL;
    }
    return lst;
}

int cli_opt_count(const char *a, const char *v, uint64_t *n)
{
    if (cli_parse_u64(v, UINT32_MAX, n)) {
        cli_usage("%s: '%s' is not a count", a, v ? v : "");
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
    cli_usage("--codec: '%s' is not quad or ngon", v);
    return -1;
}

int cli_opt_beam(const char *v, uint32_t *beam)
{
    uint64_t x;
    if (cli_parse_u64(v, FKVF_RVQ_MAX_BEAM, &x) || x < 1) {
        cli_usage("--beam: '%s' is not 1..%d", v, FKVF_RVQ_MAX_BEAM);
        return -1;
    }
    *beam = (uint32_t)x;
    return 0;
}

int cli_opt_iters(const char *v, uint32_t *iters)
{
    uint64_t x;
    if (cli_parse_u64(v, 100000, &x) || x < 1) {
        cli_usage("--iters: '%s' is not 1..100000", v);
        return -1;
    }
    *iters = (uint32_t)x;
    return 0;
}

int cli_opt_seed(const char *v, uint64_t *seed)
{
    if (cli_parse_u64(v, UINT64_MAX, seed)) {
        cli_usage("--seed: '%s' is not a number", v);
        return -1;
    }
    return 0;
}

int cli_opt_max_train(const char *a, const char *v, uint64_t *n)
{
    if (!strcmp(v, "all")) {
        *n = CLI_SAMPLE_ALL;
        return 0;
    }
    if (cli_parse_u64(v, UINT64_MAX - 1, n) || (*n != 0 && *n < CLI_SAMPLE_RUN)) {
        cli_usage("%s: '%s' is not a number of positions >= %u (a run), 0 or all", a, v,
                  CLI_SAMPLE_RUN);
        return -1;
    }
    if (*n == 0)
        *n = CLI_SAMPLE_ALL;
    return 0;
}

int cli_opt_keys(const char *v, int *pre_rope)
{
    if (!strcmp(v, "pre-rope") || !strcmp(v, "as-is")) {
        *pre_rope = v[0] == 'p';
        return 0;
    }
    cli_usage("--keys: '%s' is not pre-rope or as-is", v);
    return -1;
}

int cli_opt_rope_theta(const char *v, double *theta)
{
    if (cli_parse_f64(v, theta) || !(*theta > 0)) {
        cli_usage("--rope-theta: '%s' is not a positive number", v);
        return -1;
    }
    return 0;
}

int cli_opt_rope_dims(const char *v, uint32_t *dims)
{
    uint64_t x;
    if (cli_parse_u64(v, 65536, &x) || x < 2 || x % 2) {
        cli_usage("--rope-dims: '%s' is not an even number >= 2", v);
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
    cli_usage("--rope-layout: '%s' is not interleaved or half-split", v);
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
    } else if ((!strcmp(a, "--k-stages") || !strcmp(a, "--v-stages")) && o->n_lst)
        bad = (cli_usage("%s and --layer-stages exclude each other", a), 1);
    else if (!strcmp(a, "--k-stages"))
        bad = (o->ks_set = 1, cli_opt_stages(a, v, &o->ks));
    else if (!strcmp(a, "--v-stages"))
        bad = (o->ks_set = 1, cli_opt_stages(a, v, &o->vs));
    else if (!strcmp(a, "--layer-stages") && o->ks_set)
        bad = (cli_usage("--layer-stages and --k-stages / --v-stages exclude each other"), 1);
    else if (!strcmp(a, "--layer-stages"))
        bad = cli_opt_layer_stages(a, v, o->lst, &o->n_lst, &o->ks, &o->vs);
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
    else if (!strcmp(a, "--max-train-positions"))
        bad = cli_opt_max_train(a, v, &o->max_train);
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

/* The CLI option of each setting of fkvf_key_clash. */
static const char *key_clash_option(const char *setting)
{
    static const char *const names[][2] = {{"keys", "--keys"},
                                           {"rope_theta", "--rope-theta"},
                                           {"rope_dims", "--rope-dims"},
                                           {"rope_layout", "--rope-layout"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(setting, names[i][0]))
            return names[i][1];
    return setting;
}

int cli_keys_from_codebook(fkvf_reader *cb, const char *cbpath, cli_key_opts *k,
                           uint32_t key_dim)
{
    /* the rule is the library's (fkvf_codebook_key_settings): a given option
     * that contradicts the training is refused, since the codebook's
     * centroids are keys un-rotated the other way and every key would be
     * coded against them (keys came back at 3.8 dB instead of 9.6) */
    fkvf_key_settings s;
    memset(&s, 0, sizeof s);
    s.pre_rope = (uint8_t)(k->pre_rope != 0);
    s.no_rope = (uint8_t)(k->no_rope != 0);
    s.layout = k->layout;
    s.dims = k->dims;
    s.theta = k->theta;
    s.keys_set = (uint8_t)(k->keys_set != 0);
    s.theta_set = (uint8_t)(k->theta_set != 0);
    s.dims_set = (uint8_t)(k->dims_set != 0);
    s.layout_set = (uint8_t)(k->layout_set != 0);
    fkvf_key_clash c;
    int rc = fkvf_codebook_key_settings(cb, key_dim, &s, &c);
    k->pre_rope = s.pre_rope;
    k->layout = s.layout;
    k->dims = s.dims;
    k->theta = s.theta;
    if (s.layout_taken)
        k->layout_cb = 1;
    if (rc == FKVF_OK)
        return 0;
    if (!c.setting)
        return cli_fail(CLI_USAGE, rc, cbpath, "%s", fkvf_strerror(rc));
    const char *opt = key_clash_option(c.setting);
    return cli_fail(CLI_INVALID, FKVF_E_CODEBOOK, cbpath,
                    "trained with %s %s, and %s %s was given: its centroids are keys handled "
                    "the other way. Drop %s (the codebook's setting is used), or train a "
                    "codebook with it (fkvf train CACHE... %s %s -o FILE)",
                    opt, c.trained, opt, c.given, opt, opt, c.given);
}

int cli_key_rope(const cli_key_opts *k, uint32_t key_dim, const char *path, fkvf_rope *rope,
                 const fkvf_rope **out)
{
    *out = NULL;
    rope->layout = k->layout;
    rope->theta = k->theta;
    rope->rope_dims = k->dims ? k->dims : key_dim;
    if (!k->no_rope && !k->dims && key_dim % 2) {
        cli_usage("%s: key_dim %u is odd, and RoPE rotates pairs of dims: give --rope-dims N "
                "(even, at most %u) or --no-rope",
                path, key_dim, key_dim - 1);
        return -1;
    }
    if (!k->no_rope && (rope->rope_dims > key_dim || rope->rope_dims % 2)) {
        cli_usage("%s: --rope-dims %u does not fit key_dim %u (even, at most key_dim)", path,
                rope->rope_dims, key_dim);
        return -1;
    }
    if (k->pre_rope && !k->no_rope)
        *out = rope;
    return 0;
}

/* The code and message of a failure about to be reported, into st (when
 * not NULL): the message of the handle `from`, or without one the text of
 * the library's code `lib_rc`. */
static void codebook_failure(cli_codebook_status *st, int rc, const fkvf_reader *from, int lib_rc)
{
    if (!st)
        return;
    st->rc = rc;
    snprintf(st->message, sizeof st->message, "%s",
             from ? fkvf_reader_message(from) : fkvf_strerror(lib_rc));
}

/* The codebook file `given` opened and attached to r. */
static int attach_given(fkvf_reader *r, const char *archive, const char *given, const char *hx,
                        fkvf_reader **cb, cli_codebook_status *st)
{
    fkvf_reader *c = NULL;
    int rc = cli_open_path_or_url(&c, given);
    if (rc != FKVF_OK) {
        /* a FILE that is not there or cannot be read: exit 2, as any
         * path; one that is not a codebook file: invalid input */
        char pre[320];
        int env = rc == FKVF_E_IO || rc == FKVF_E_NOMEM;
        /* not usable: CODEBOOK whatever the file's own class (spec 13.5),
         * which the library's message that follows names */
        snprintf(pre, sizeof pre,
                 "(the archive %.80s expects the codebook with content hash %s)%s ", archive, hx,
                 env ? "" : " not a usable codebook file (CODEBOOK, spec 13.5):");
        int code = env ? rc : FKVF_E_CODEBOOK;
        codebook_failure(st, code, c, rc);
        int ex = cli_fail_reader(code, c, given, pre);
        fkvf_reader_free(c);
        return ex;
    }
    if ((rc = fkvf_reader_attach_codebook(r, c)) != FKVF_OK) {
        /* the library's message names the archive and the file */
        codebook_failure(st, rc, r, rc);
        int ex = cli_fail_reader(rc, r, archive, "");
        fkvf_reader_free(c);
        return ex;
    }
    *cb = c;
    return CLI_OK;
}

int cli_open_codebook(fkvf_reader *r, const char *archive, const char *given, fkvf_reader **cb,
                      cli_codebook_status *st)
{
    *cb = NULL;
    if (st) {
        st->rc = FKVF_OK;
        st->message[0] = 0;
        st->missing[0] = 0;
    }
    int ext = 0;
    uint8_t want[16];
    const char *name = NULL;
    if (fkvf_reader_codebook_ref(r, &ext, want, &name) != FKVF_OK || !ext)
        return CLI_OK;
    char hx[33];
    cli_hex16(want, hx);
    if (given)
        return attach_given(r, archive, given, hx, cb, st);
    int rc = fkvf_reader_find_codebook(r, getenv("FKVF_CODEBOOK_PATH"), cb);
    if (rc == FKVF_OK)
        return CLI_OK;
    if ((rc == FKVF_E_NOT_FOUND || rc == FKVF_E_IO) && st && st->allow_missing) {
        snprintf(st->missing, sizeof st->missing, "%s", fkvf_reader_message(r));
        return CLI_OK;
    }
    /* not found or not fitting: invalid input, as a wrong --codebooks FILE;
     * an I/O error while searching: environment */
    if (rc == FKVF_E_NOT_FOUND) {
        /* reported as FKVF_E_CODEBOOK (the archive cannot be decoded without
         * it), so the library's "[FKVF_E_NOT_FOUND]" tag is left out */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", fkvf_reader_message(r));
        size_t ml = strlen(msg), tl = strlen(" [FKVF_E_NOT_FOUND]");
        if (ml >= tl && !strcmp(msg + ml - tl, " [FKVF_E_NOT_FOUND]"))
            msg[ml - tl] = 0;
        fkvf_error_info e;
        int have = fkvf_reader_error(r, &e) == FKVF_OK;
        codebook_failure(st, FKVF_E_CODEBOOK, r, rc);
        return cli_fail_at(CLI_INVALID, FKVF_E_CODEBOOK, archive,
                           have ? e.offset : FKVF_ERROR_NO_OFFSET, have ? e.clause : NULL,
                           "%s; pass --codebooks FILE, or put its directory in FKVF_CODEBOOK_PATH",
                           msg);
    }
    codebook_failure(st, rc, r, rc);
    return cli_fail_reader(rc, r, archive, "");
}

int cli_attach_codebook(fkvf_reader *r, const char *archive, const char *given,
                        fkvf_reader **cb, char *missing, size_t missing_size)
{
    cli_codebook_status st;
    st.allow_missing = missing != NULL;
    int ex = cli_open_codebook(r, archive, given, cb, &st);
    if (missing && missing_size)
        snprintf(missing, missing_size, "%s", st.missing);
    return ex;
}

uint64_t cli_file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static double now_seconds(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
        return 0.0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cli_progress_init(cli_progress *p, const char *label, int quiet)
{
    memset(p, 0, sizeof *p);
    p->on = !quiet && isatty(STDERR_FILENO);
    p->last = -1;
    p->label = label;
    p->t0 = now_seconds();
}

void cli_fmt_duration(double secs, char *out, size_t n)
{
    if (!(secs >= 0.0))
        secs = 0.0;
    if (secs > 359999.0 * 3600.0)
        secs = 359999.0 * 3600.0; /* "359999h00m": no overflow below */
    if (secs < 9.95) {
        snprintf(out, n, "%.1fs", secs);
        return;
    }
    long s = (long)(secs + 0.5);
    if (s < 60)
        snprintf(out, n, "%lds", s);
    else if (s < 3600)
        snprintf(out, n, "%ldm%02lds", s / 60, s % 60);
    else
        snprintf(out, n, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
}


void cli_progress_format(char *out, size_t n, const char *label, uint64_t done, uint64_t total,
                         double elapsed, int bytes)
{
    /* at most 79 columns: a wrapped line would not be redrawn in place */
    const unsigned BAR = bytes ? 20 : 30;
    if (done > total)
        done = total;
    int fin = done >= total;
    /* integer percentage and fill, rounded down: 100% only when done */
    unsigned pct = total ? (unsigned)((long double)done * 100 / total) : 100;
    unsigned fill = total ? (unsigned)((long double)done * BAR / total) : BAR;
    char bar[32];
    for (unsigned i = 0; i < BAR; i++)
        bar[i] = i < fill ? '#' : ' ';
    bar[BAR] = 0;
    char el[32], sz[64] = "";
    cli_fmt_duration(elapsed, el, sizeof el);
    if (bytes) {
        int gib = total >= ((uint64_t)1 << 30);
        double u = gib ? 1024.0 * 1024.0 * 1024.0 : 1024.0 * 1024.0;
        snprintf(sz, sizeof sz, "  %.*f/%.*f %s", gib ? 2 : 1, (double)done / u, gib ? 2 : 1,
                 (double)total / u, gib ? "GiB" : "MiB");
    }
    if (fin) {
        snprintf(out, n, "%-6s [%s] %3u%%%s  done in %s", label, bar, pct, sz, el);
        return;
    }
    char eta[48] = "";
    if (done > 0 && elapsed >= CLI_PROGRESS_ETA_AFTER) {
        char t[32];
        cli_fmt_duration(elapsed * (double)(total - done) / (double)done, t, sizeof t);
        snprintf(eta, sizeof eta, ", ETA %s", t);
    }
    snprintf(out, n, "%-6s [%s] %3u%%%s  %s elapsed%s", label, bar, pct, sz, el, eta);
}

void cli_progress_cb(void *opaque, uint64_t done, uint64_t total)
{
    cli_progress *p = opaque;
    if (!p->on || total == 0 || p->ended)
        return;
    double t = now_seconds();
    int fin = done >= total;
    if (!fin && p->drawn && t - p->t_draw < CLI_PROGRESS_REDRAW)
        return;
    char line[256];
    cli_progress_format(line, sizeof line, p->label, done, total, t - p->t0, p->bytes);
    size_t w = strlen(line);
    /* pad over the rest of a longer earlier line */
    fprintf(stderr, "\r%s%*s", line, p->width > w ? (int)(p->width - w) : 0, "");
    if (fin) {
        fputc('\n', stderr);
        p->ended = 1;
    }
    fflush(stderr);
    p->drawn = 1;
    p->width = w;
    p->t_draw = t;
    p->last = total ? (int)((long double)(done > total ? total : done) * 100 / total) : 100;
}

/* A large cache file with a progress bar: map it, read the mapping page by
 * page (which reads the file) with the bar, then parse it in place. Memory
 * is what kvio_read uses (the mapping and the parsed cache); 1 when the
 * file could not be mapped here (the caller reads it the ordinary way and
 * reports any error), else 0 and a kvio result in *rc. */
static int read_cache_progress(const char *path, uint64_t size64, unsigned flags, kvio_cache *c,
                               char *err, size_t errlen, int *rc)
{
    if (size64 > SIZE_MAX)
        return 1;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return 1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != size64) {
        close(fd);
        return 1;
    }
    size_t size = (size_t)size64;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return 1;
    posix_madvise(map, size, POSIX_MADV_SEQUENTIAL);
    cli_progress pg;
    cli_progress_init(&pg, "read", 0);
    pg.bytes = 1;
    long pgsz = sysconf(_SC_PAGESIZE);
    size_t step = pgsz > 0 ? (size_t)pgsz : 4096, chunk = (size_t)8 << 20;
    const volatile unsigned char *b = map;
    unsigned sum = 0;
    for (size_t off = 0; off < size;) {
        size_t end = size - off > chunk ? off + chunk : size;
        for (size_t i = off; i < end; i += step)
            sum += b[i];
        off = end;
        cli_progress_cb(&pg, off, size);
    }
    (void)sum;
    *rc = kvio_read_mem(map, size, path, KVIO_FMT_AUTO, KVIO_READ_IGNORE_EXTRA | flags, c, err,
                        errlen);
    munmap(map, size);
    return 0;
}

int cli_read_cache(const char *path, unsigned flags, kvio_cache *c)
{
    char err[1024];
    int rc;
    if (cli_llama_sniff_file(path) != LLST_KIND_NONE)
        return cli_llama_read_cache(path, (flags & KVIO_READ_LAZY) != 0, c); /* cli_llama.c */
    uint64_t size = cli_file_size(path);
    if (size < CLI_READ_PROGRESS_MIN || !isatty(STDERR_FILENO) || (flags & KVIO_READ_LAZY) ||
        read_cache_progress(path, size, flags, c, err, sizeof err, &rc))
        rc = kvio_read(path, KVIO_FMT_AUTO, KVIO_READ_IGNORE_EXTRA | flags, c, err, sizeof err);
    if (rc != KVIO_OK)
        return cli_fail_kvio(rc, path, err);
    return CLI_OK;
}

size_t cli_cache_row_elems(const kvio_cache *c)
{
    return (size_t)c->n_layers * c->n_kv_heads * ((size_t)c->key_dim + c->value_dim);
}

size_t cli_cache_row_bytes(const kvio_cache *c) { return cli_cache_row_elems(c) * kvio_dtype_size(c->dtype); }

int cli_cache_rows(const kvio_cache *c, uint32_t p0, uint32_t p1, uint8_t *out)
{
    size_t es = kvio_dtype_size(c->dtype);
    size_t kb = (size_t)c->key_dim * es, vb = (size_t)c->value_dim * es;
    size_t rb = cli_cache_row_bytes(c);
    char err[1024];
    for (uint32_t l = 0; l < c->n_layers; l++) {
        /* layer l's keys, then its values, at this offset of every row */
        size_t at = (size_t)l * c->n_kv_heads * (kb + vb);
        int rc = kvio_read_kv(c, l, 0, p0, p1 - p0, out + at, rb, kb, err, sizeof err);
        if (rc == KVIO_OK)
            rc = kvio_read_kv(c, l, 1, p0, p1 - p0, out + at + c->n_kv_heads * kb, rb, vb, err,
                              sizeof err);
        if (rc != KVIO_OK)
            return cli_fail_kvio(rc, NULL, err);
    }
    return CLI_OK;
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
    /* a file, or an http(s) URL read with range requests (docs/remote.md) */
    int rc = cli_open_path_or_url(r, path);
    if (rc == FKVF_OK)
        return CLI_OK;
    int ex = cli_fail_reader(rc, *r, path, "");
    fkvf_reader_free(*r);
    *r = NULL;
    return ex;
}

int cli_open_archive(fkvf_reader **r, const char *path)
{
    int ex = cli_open_reader(r, path);
    if (ex != CLI_OK)
        return ex;
    fkvf_archive_info ai;
    if (fkvf_reader_info(*r, &ai) == FKVF_OK && ai.has_desc)
        return CLI_OK;
    fkvf_reader_free(*r);
    *r = NULL;
    return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, path,
                    "a codebook file (no cache descriptor), not an archive");
}

/* ---- threads ----------------------------------------------------------------- */

static unsigned cli_nthreads; /* 0: not given */

int cli_set_threads(const char *v)
{
    uint64_t n;
    if (!v || cli_parse_u64(v, CLI_THREADS_MAX, &n) || n == 0)
        return -1;
    cli_nthreads = (unsigned)n;
    return 0;
}

int cli_threads_setup(void)
{
    if (cli_nthreads)
        return CLI_OK;
    const char *env = getenv("FKVF_THREADS");
    if (env && *env) {
        if (cli_set_threads(env))
            return cli_usage("FKVF_THREADS='%s' is not a number of threads, 1 to %u", env,
                             CLI_THREADS_MAX);
        return CLI_OK;
    }
    cli_nthreads = fkvf_cpu_count();
    return CLI_OK;
}

unsigned cli_threads(void)
{
    return cli_nthreads ? cli_nthreads : 1;
}
