#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fkvf.h"

struct errdef {
    int code;
    const char *name;
    const char *text;
};

static const struct errdef errors[] = {
    {FKVF_OK, "FKVF_OK", "success"},
    {FKVF_E_INVALID_ARG, "FKVF_E_INVALID_ARG", "invalid argument"},
    {FKVF_E_STATE, "FKVF_E_STATE", "handle in the wrong state or of the wrong kind"},
    {FKVF_E_NOMEM, "FKVF_E_NOMEM", "out of memory"},
    {FKVF_E_IO, "FKVF_E_IO", "I/O error"},
    {FKVF_E_RANGE, "FKVF_E_RANGE", "position, index or stream out of range"},
    {FKVF_E_NOT_FOUND, "FKVF_E_NOT_FOUND", "not found"},
    {FKVF_E_UNSUPPORTED, "FKVF_E_UNSUPPORTED", "not supported by this build"},
    {FKVF_E_EXISTS, "FKVF_E_EXISTS", "the output file exists (not replaced)"},
    {FKVF_E_BAD_MAGIC, "FKVF_E_BAD_MAGIC", "not an FKVF file (bad magic)"},
    {FKVF_E_VERSION, "FKVF_E_VERSION", "unsupported format major version"},
    {FKVF_E_FEATURE, "FKVF_E_FEATURE", "unknown required feature"},
    {FKVF_E_BYTE_ORDER, "FKVF_E_BYTE_ORDER", "byte-order check failed"},
    {FKVF_E_TRUNCATED, "FKVF_E_TRUNCATED", "file or structure truncated"},
    {FKVF_E_CHECKSUM, "FKVF_E_CHECKSUM", "checksum mismatch"},
    {FKVF_E_ALIGN, "FKVF_E_ALIGN", "structure not 64-byte aligned"},
    {FKVF_E_BOUNDS, "FKVF_E_BOUNDS", "section out of bounds"},
    {FKVF_E_OVERLAP, "FKVF_E_OVERLAP", "sections overlap or are out of order"},
    {FKVF_E_PADDING, "FKVF_E_PADDING", "non-zero padding"},
    {FKVF_E_SECTION, "FKVF_E_SECTION", "unknown required section"},
    {FKVF_E_CORRUPT, "FKVF_E_CORRUPT", "invalid field value"},
    {FKVF_E_DUP_KEY, "FKVF_E_DUP_KEY", "duplicate metadata key"},
    {FKVF_E_SYMBOL, "FKVF_E_SYMBOL", "symbol out of range"},
    {FKVF_E_SPAN, "FKVF_E_SPAN", "ngon span does not decode to its anchor"},
    {FKVF_E_TORN, "FKVF_E_TORN", "torn tail after the last valid commit"},
    {FKVF_E_LIMIT, "FKVF_E_LIMIT", "limit exceeded"},
    {FKVF_E_CODEBOOK, "FKVF_E_CODEBOOK", "codebook missing or hash mismatch"},
    {FKVF_E_DEFLATE, "FKVF_E_DEFLATE", "invalid deflate stream"},
    {FKVF_E_CHAIN, "FKVF_E_CHAIN", "commit chain broken"},
    {FKVF_E_CODEC, "FKVF_E_CODEC", "data cannot be encoded exactly"},
};

static const struct errdef *find(int code)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == code)
            return &errors[i];
    return NULL;
}

FKVF_API const char *fkvf_strerror(int code)
{
    const struct errdef *e = find(code);
    return e ? e->text : "unknown error code";
}

FKVF_API const char *fkvf_error_name(int code)
{
    const struct errdef *e = find(code);
    return e ? e->name : "FKVF_E_UNKNOWN";
}

FKVF_API int fkvf_error_class(int code)
{
    if (code == FKVF_OK)
        return FKVF_ERRCLASS_OK;
    if (code >= 20 && code < 50)
        return FKVF_ERRCLASS_FORMAT;
    if (code >= 50 && code < 60)
        return FKVF_ERRCLASS_ENCODE;
    return FKVF_ERRCLASS_USAGE;
}

void fkvf_diag_clear(fkvf_diag *d)
{
    d->msg[0] = 0;
    d->code = FKVF_OK;
    d->offset = FKVF_NO_OFFSET;
    d->clause[0] = 0;
    d->field[0] = 0;
    d->body_at = d->body_len = 0;
}

const char *fkvf_diag_text(const fkvf_diag *d, size_t *len)
{
    *len = d->code != FKVF_OK ? d->body_len : 0;
    return d->code != FKVF_OK ? d->msg + d->body_at : "";
}

/* The field a message names: its text up to the first colon, when that is a
 * field name (letters, digits, '_', '.', '[', ']'); "" otherwise. */
static void field_of(const char *text, char out[FKVF_FIELD_MAX])
{
    size_t n = strspn(text, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.[]");
    if (n == 0 || n >= FKVF_FIELD_MAX || text[n] != ':')
        n = 0;
    memcpy(out, text, n);
    out[n] = 0;
}

const char *fkvf_quote_body(const char *msg, const char *file, int code, size_t *len)
{
    size_t fl = file ? strlen(file) : 0;
    if (fl && !strncmp(msg, file, fl) && msg[fl] == ':')
        msg += fl + 1 + (msg[fl + 1] == ' ');
    char tag[48];
    snprintf(tag, sizeof tag, " [%s]", fkvf_error_name(code));
    size_t tl = strlen(tag), ml = strlen(msg);
    if (ml >= tl && !strcmp(msg + ml - tl, tag))
        ml -= tl;
    *len = ml;
    return msg;
}

void fkvf_diag_info(const fkvf_diag *d, fkvf_error_info *out)
{
    memset(out, 0, sizeof *out);
    out->code = d->code;
    out->offset = d->code != FKVF_OK ? d->offset : FKVF_ERROR_NO_OFFSET;
    out->clause = d->code != FKVF_OK && d->clause[0] ? d->clause : NULL;
    out->file = d->name ? d->name : "<memory>";
    out->message = d->msg;
    out->field = d->code != FKVF_OK && d->field[0] ? d->field : NULL;
}

int fkvf_diag_report(const fkvf_diag *d, const char *not_a_handle, fkvf_error_info *out)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    if (!d) {
        memset(out, 0, sizeof *out);
        out->code = FKVF_E_STATE;
        out->offset = FKVF_ERROR_NO_OFFSET;
        out->message = not_a_handle;
        return FKVF_E_STATE;
    }
    fkvf_diag_info(d, out);
    return FKVF_OK;
}

__attribute__((format(printf, 5, 0))) static int vfail(fkvf_diag *d, int code, uint64_t offset,
                                                       const char *clause, const char *fmt,
                                                       va_list ap)
{
    /* sized so that the whole message always fits in FKVF_MSG_MAX */
    char body[760];
    vsnprintf(body, sizeof body, fmt, ap);
    const char *name = d->name ? d->name : "<memory>";
    char where[64] = "";
    if (offset != FKVF_NO_OFFSET)
        snprintf(where, sizeof where, " offset %llu:", (unsigned long long)offset);
    char cl[32] = "";
    if (clause)
        snprintf(cl, sizeof cl, " (spec %s)", clause);
    int at = snprintf(d->msg, sizeof d->msg, "%.120s:%.63s ", name, where);
    snprintf(d->msg + at, sizeof d->msg - (size_t)at, "%s%.31s [%.40s]", body, cl,
             fkvf_error_name(code));
    d->body_at = (unsigned short)at;
    d->body_len = (unsigned short)strlen(body);
    /* an error of the environment is no fault of a field: "open: ENOENT"
     * names a system call, "META: no memory" the structure being loaded */
    if (code == FKVF_E_IO || code == FKVF_E_NOMEM)
        d->field[0] = 0;
    else
        field_of(body, d->field);
    d->code = code;
    d->offset = offset;
    snprintf(d->clause, sizeof d->clause, "%s", clause ? clause : "");
    return code;
}

int fkvf_fail(fkvf_diag *d, int code, uint64_t offset, const char *clause, const char *fmt, ...)
{
    if (d->code != FKVF_OK)
        return code;
    va_list ap;
    va_start(ap, fmt);
    vfail(d, code, offset, clause, fmt, ap);
    va_end(ap);
    return code;
}

int fkvf_fail_replace(fkvf_diag *d, int code, uint64_t offset, const char *clause,
                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(d, code, offset, clause, fmt, ap);
    va_end(ap);
    return code;
}
