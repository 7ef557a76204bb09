/* llama_state.c - llama.cpp sequence-state and session files read and
 * written (llama_state.h has the layout and the support rules). */
#define _POSIX_C_SOURCE 200809L
#include "llama_state.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__GNUC__) || defined(__clang__)
#define LLST_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define LLST_PRINTF(a, b)
#endif

/* ---- messages ------------------------------------------------------------- */

/* One line "NAME: MESSAGE" into err; returns code. */
static int LLST_PRINTF(5, 6) fail(const char *name, char *err, size_t errlen, int code,
                                  const char *fmt, ...)
{
    if (err && errlen) {
        int n = snprintf(err, errlen, "%s: ", name ? name : "(state)");
        if (n < 0)
            n = 0;
        if ((size_t)n < errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return code;
}

const char *llst_kind_name(llst_kind kind)
{
    switch (kind) {
    case LLST_KIND_SEQ:
        return "sequence state";
    case LLST_KIND_SESSION:
        return "session";
    default:
        return "none";
    }
}

const char *llst_strerror(int code)
{
    switch (code) {
    case LLST_OK:
        return "ok";
    case LLST_E_ARG:
        return "bad argument";
    case LLST_E_IO:
        return "I/O error";
    case LLST_E_NOMEM:
        return "out of memory";
    case LLST_E_FORMAT:
        return "malformed llama.cpp state file";
    case LLST_E_UNSUPPORTED:
        return "unsupported llama.cpp state";
    default:
        return "unknown error";
    }
}

const char *llst_type_name(int32_t ggml_type)
{
    static char buf[32];
    switch (ggml_type) {
    case LLST_GGML_F32:
        return "f32";
    case LLST_GGML_F16:
        return "f16";
    case LLST_GGML_BF16:
        return "bf16";
    default:
        snprintf(buf, sizeof buf, "ggml type %" PRId32, ggml_type);
        return buf;
    }
}

/* The names of ggml's other types (ggml.h's enum ggml_type), for messages
 * only; NULL for an id that is none of them. is_quant: a block-quantized type. */
static const char *ggml_other_name(int32_t t, int *is_quant)
{
    static const char *const q[] = {
        NULL,      NULL,      "q4_0",    "q4_1",   NULL,     NULL,     "q5_0",   "q5_1",
        "q8_0",    "q8_1",    "q2_K",    "q3_K",   "q4_K",   "q5_K",   "q6_K",   "q8_K",
        "iq2_xxs", "iq2_xs",  "iq3_xxs", "iq1_s",  "iq4_nl", "iq3_s",  "iq2_s",  "iq4_xs",
        "i8",      "i16",     "i32",     "i64",    "f64",    "iq1_m",  NULL,     NULL,
        NULL,      NULL,      "tq1_0",   "tq2_0",  NULL,     NULL,     NULL,     "mxfp4",
        "nvfp4",   "q1_0",    "q2_0"};
    *is_quant = 0;
    if (t < 0 || (size_t)t >= sizeof q / sizeof q[0] || !q[t])
        return NULL;
    *is_quant = !(t >= 24 && t <= 28); /* i8 .. f64 are plain element types */
    return q[t];
}

/* ggml type id -> fkvf dtype (0 if not f32/f16/bf16) and element bytes */
static fkvf_dtype dtype_of(int32_t t)
{
    switch (t) {
    case LLST_GGML_F32:
        return FKVF_DTYPE_F32;
    case LLST_GGML_F16:
        return FKVF_DTYPE_F16;
    case LLST_GGML_BF16:
        return FKVF_DTYPE_BF16;
    default:
        return (fkvf_dtype)0;
    }
}

llst_kind llst_sniff(const void *data, size_t size)
{
    if (!data || size < 4)
        return LLST_KIND_NONE;
    const uint8_t *p = data;
    uint32_t m = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    return m == LLST_SEQ_MAGIC ? LLST_KIND_SEQ : m == LLST_SESSION_MAGIC ? LLST_KIND_SESSION : LLST_KIND_NONE;
}

/* ---- reading: a bounds-checked little-endian cursor ------------------------- */

/* The cursor reads the file's bytes in memory (p) or, for llst_open, from
 * an open file (fd) through a window of RD_WIN bytes: the fields of the
 * header, the cells and the layers' headers; the rows are skipped. */
#define RD_WIN 16384u

typedef struct rd {
    const uint8_t *p; /* the whole file in memory; NULL: read from fd */
    uint64_t size, off;
    const char *name;
    char *err;
    size_t errlen;
    int file;         /* read from fd: its bytes [w0, w0 + wn) in win */
    int fd;
    uint64_t w0;
    size_t wn;
    uint8_t *win;     /* RD_WIN bytes */
} rd;

static uint64_t rd_left(const rd *r) { return r->size - r->off; }

/* n more bytes must be there for field (else a truncated file) */
static int rd_need(rd *r, uint64_t n, const char *field)
{
    if (rd_left(r) < n)
        return fail(r->name, r->err, r->errlen, LLST_E_FORMAT,
                    "offset %" PRIu64 ": %s: needs %" PRIu64 " bytes, %" PRIu64
                    " remain (truncated file)",
                    r->off, field, n, rd_left(r));
    return LLST_OK;
}

/* n bytes of the file at byte off into dst: 0, or -1 with errno (0 when
 * the file ended early). */
static int pread_full(int fd, uint8_t *dst, size_t n, uint64_t off)
{
    while (n) {
        ssize_t got = off > (uint64_t)INT64_MAX ? -1 : pread(fd, dst, n, (off_t)off);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got <= 0) {
            if (got == 0 || off > (uint64_t)INT64_MAX)
                errno = 0;
            return -1;
        }
        dst += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

/* The I/O error of a read of n bytes at off: the file changed under us. */
static int io_fail(const char *name, char *err, size_t errlen, uint64_t off, uint64_t n,
                   const char *what, int e)
{
    return fail(name, err, errlen, LLST_E_IO,
                "offset %" PRIu64 ": %s: reading %" PRIu64 " bytes failed: %s", off, what, n,
                e ? strerror(e) : "the file ended early (did it change after it was opened?)");
}

/* n (<= RD_WIN) bytes at the cursor, checked to be there for field: *q
 * points to them (into the file's bytes, or the window). */
static int rd_get(rd *r, size_t n, const char *field, const uint8_t **q)
{
    *q = NULL;
    int rc = rd_need(r, n, field);
    if (rc || !r->file) {
        *q = r->file ? NULL : r->p + r->off;
        return rc;
    }
    if (r->off < r->w0 || r->off - r->w0 + n > r->wn) {
        size_t m = rd_left(r) < RD_WIN ? (size_t)rd_left(r) : RD_WIN;
        r->wn = 0;
        if (pread_full(r->fd, r->win, m, r->off) != 0)
            return io_fail(r->name, r->err, r->errlen, r->off, m, field, errno);
        r->w0 = r->off;
        r->wn = m;
    }
    *q = r->win + (r->off - r->w0);
    return LLST_OK;
}

/* n bytes at the cursor into dst (checked to be there), the cursor past them. */
static int rd_copy(rd *r, void *dst, uint64_t n, const char *field)
{
    int rc = rd_need(r, n, field);
    if (rc)
        return rc;
    if (!r->file)
        memcpy(dst, r->p + r->off, (size_t)n);
    else if (pread_full(r->fd, dst, (size_t)n, r->off) != 0)
        return io_fail(r->name, r->err, r->errlen, r->off, n, field, errno);
    r->off += n;
    return LLST_OK;
}

static int rd_u32(rd *r, const char *field, uint32_t *v)
{
    const uint8_t *q;
    int rc = rd_get(r, 4, field, &q);
    if (rc)
        return rc;
    *v = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    r->off += 4;
    return LLST_OK;
}

static int rd_i32(rd *r, const char *field, int32_t *v)
{
    uint32_t u;
    int rc = rd_u32(r, field, &u);
    if (!rc)
        memcpy(v, &u, 4); /* two's complement, as llama.cpp wrote it */
    return rc;
}

static int rd_u64(rd *r, const char *field, uint64_t *v)
{
    uint32_t lo, hi;
    int rc = rd_need(r, 8, field);
    if (rc || (rc = rd_u32(r, field, &lo)) || (rc = rd_u32(r, field, &hi)))
        return rc;
    *v = (uint64_t)hi << 32 | lo;
    return LLST_OK;
}

/* count items of `each` bytes (each > 0) must fit what remains: checked
 * before anything is allocated or read. */
static int rd_fits(rd *r, uint64_t count, uint64_t each, const char *field)
{
    if (count > rd_left(r) / each)
        return fail(r->name, r->err, r->errlen, LLST_E_FORMAT,
                    "offset %" PRIu64 ": %s %" PRIu64 " x %" PRIu64 " bytes do not fit the %" PRIu64
                    " bytes that remain",
                    r->off, field, count, each, rd_left(r));
    return LLST_OK;
}

/* A state file's rows read on demand (llst_open, llst_to_cache_lazy). */
struct llst_src {
    int fd;
    char *name;               /* for messages */
    uint32_t T, H, Dk, Dv, v_trans;
    fkvf_dtype kd, vd, cd;    /* K and V types in the file, the cache's */
    uint64_t *off;            /* [2 * n_layers]: layer l's K rows at 2l, its V at 2l + 1 */
    uint8_t *buf;             /* scratch of cap bytes */
    size_t cap;
};

static void src_free(void *opaque)
{
    struct llst_src *s = opaque;
    if (!s)
        return;
    if (s->fd >= 0)
        close(s->fd);
    free(s->name);
    free(s->off);
    free(s->buf);
    free(s);
}

void llst_free(llst_file *f)
{
    if (!f)
        return;
    src_free(f->src);
    free(f->tokens);
    free(f->arch);
    free(f->pos);
    free(f->seq_id);
    free(f->layers);
    memset(f, 0, sizeof *f);
}

/* The cells of the non-empty stream: pos, n_seq_id = 1, seq_id. */
static int parse_cells(rd *r, llst_file *f, uint32_t s)
{
    int rc;
    if ((rc = rd_fits(r, f->n_cells, 8, "cell_count")))
        return rc;
    f->pos = malloc((size_t)f->n_cells * sizeof *f->pos);
    f->seq_id = malloc((size_t)f->n_cells * sizeof *f->seq_id);
    if (!f->pos || !f->seq_id)
        return fail(r->name, r->err, r->errlen, LLST_E_NOMEM, "out of memory for %" PRIu32 " cells", f->n_cells);
    char field[64];
    for (uint32_t i = 0; i < f->n_cells; i++) {
        uint32_t n_seq;
        snprintf(field, sizeof field, "stream %" PRIu32 " cell %" PRIu32 " pos", s, i);
        if ((rc = rd_i32(r, field, &f->pos[i])))
            return rc;
        uint64_t at = r->off;
        snprintf(field, sizeof field, "stream %" PRIu32 " cell %" PRIu32 " n_seq_id", s, i);
        if ((rc = rd_u32(r, field, &n_seq)))
            return rc;
        if (n_seq != 1)
            return fail(r->name, r->err, r->errlen, LLST_E_UNSUPPORTED,
                        "offset %" PRIu64 ": %s: cell %" PRIu32 " is in %" PRIu32
                        " sequences (one is supported)",
                        at, field, i, n_seq);
        snprintf(field, sizeof field, "stream %" PRIu32 " cell %" PRIu32 " seq_id", s, i);
        if ((rc = rd_i32(r, field, &f->seq_id[i])))
            return rc;
    }
    return LLST_OK;
}

/* A K row block or a V row block (v_trans = 0): type, row bytes, rows. */
static int parse_rows(rd *r, uint32_t n_cells, uint32_t l, const char *kv, int32_t *type,
                      uint64_t *row_bytes, const uint8_t **rows, uint64_t *at)
{
    char field[64];
    int rc;
    snprintf(field, sizeof field, "layer %" PRIu32 " %s type", l, kv);
    if ((rc = rd_i32(r, field, type)))
        return rc;
    snprintf(field, sizeof field, "layer %" PRIu32 " %s row bytes", l, kv);
    if ((rc = rd_u64(r, field, row_bytes)))
        return rc;
    if (*row_bytes > rd_left(r) / n_cells)
        return fail(r->name, r->err, r->errlen, LLST_E_FORMAT,
                    "offset %" PRIu64 ": %s %" PRIu64 " do not fit the %" PRIu64
                    " bytes that remain (%" PRIu32 " cells)",
                    r->off - 8, field, *row_bytes, rd_left(r), n_cells);
    *rows = r->file ? NULL : r->p + r->off;
    *at = r->off;
    r->off += *row_bytes * n_cells;
    return LLST_OK;
}

/* A transposed V block: type, element bytes, n_embd, n_embd channels. */
static int parse_vtrans(rd *r, uint32_t n_cells, uint32_t l, llst_layer *y)
{
    char field[64];
    int rc;
    snprintf(field, sizeof field, "layer %" PRIu32 " V type", l);
    if ((rc = rd_i32(r, field, &y->v_type)))
        return rc;
    snprintf(field, sizeof field, "layer %" PRIu32 " V element bytes", l);
    if ((rc = rd_u32(r, field, &y->v_el_bytes)))
        return rc;
    snprintf(field, sizeof field, "layer %" PRIu32 " V n_embd_v_gqa", l);
    if ((rc = rd_u32(r, field, &y->v_n_embd)))
        return rc;
    y->v_row_bytes = (uint64_t)y->v_el_bytes * y->v_n_embd; /* u32 x u32 fits u64 */
    if (y->v_row_bytes > rd_left(r) / n_cells)
        return fail(r->name, r->err, r->errlen, LLST_E_FORMAT,
                    "offset %" PRIu64 ": layer %" PRIu32 " V: %" PRIu32 " channels of %" PRIu32
                    " cells x %" PRIu32 " bytes do not fit the %" PRIu64 " bytes that remain",
                    r->off - 8, l, y->v_n_embd, n_cells, y->v_el_bytes, rd_left(r));
    y->v = r->file ? NULL : r->p + r->off;
    y->v_off = r->off;
    r->off += y->v_row_bytes * n_cells;
    return LLST_OK;
}

/* The data of the non-empty stream: v_trans, n_layer, K per layer, V per layer. */
static int parse_data(rd *r, llst_file *f)
{
    int rc;
    uint64_t at = r->off;
    if ((rc = rd_u32(r, "v_trans", &f->v_trans)))
        return rc;
    if (f->v_trans > 1)
        return fail(r->name, r->err, r->errlen, LLST_E_FORMAT, "offset %" PRIu64 ": v_trans: %" PRIu32 " (0 or 1)", at,
                    f->v_trans);
    if ((rc = rd_u32(r, "n_layer", &f->n_layer)))
        return rc;
    /* every layer has at least a 12-byte K header and a 12-byte V header */
    if ((rc = rd_fits(r, f->n_layer, 24, "n_layer")))
        return rc;
    f->layers = calloc(f->n_layer ? f->n_layer : 1, sizeof *f->layers);
    if (!f->layers)
        return fail(r->name, r->err, r->errlen, LLST_E_NOMEM, "out of memory for %" PRIu32 " layers", f->n_layer);
    for (uint32_t l = 0; l < f->n_layer; l++) {
        llst_layer *y = &f->layers[l];
        if ((rc = parse_rows(r, f->n_cells, l, "K", &y->k_type, &y->k_row_bytes, &y->k, &y->k_off)))
            return rc;
    }
    for (uint32_t l = 0; l < f->n_layer; l++) {
        llst_layer *y = &f->layers[l];
        rc = f->v_trans ? parse_vtrans(r, f->n_cells, l, y)
                        : parse_rows(r, f->n_cells, l, "V", &y->v_type, &y->v_row_bytes, &y->v, &y->v_off);
        if (rc)
            return rc;
    }
    return LLST_OK;
}

/* The memory block: n_stream, the streams, nothing after them. */
static int parse_memory(rd *r, llst_file *f)
{
    int rc;
    uint64_t at = r->off;
    if ((rc = rd_u32(r, "n_stream", &f->n_stream)))
        return rc;
    if (f->n_stream == 0)
        return fail(r->name, r->err, r->errlen, LLST_E_FORMAT, "offset %" PRIu64 ": n_stream: 0 (at least 1)", at);
    if (f->n_stream > LLST_MAX_STREAMS)
        return fail(r->name, r->err, r->errlen, LLST_E_FORMAT,
                    "offset %" PRIu64 ": n_stream: %" PRIu32 " streams, more than %u", at, f->n_stream,
                    LLST_MAX_STREAMS);
    if (f->n_stream > rd_left(r) / 4)
        return fail(r->name, r->err, r->errlen, LLST_E_FORMAT,
                    "offset %" PRIu64 ": n_stream: %" PRIu32 " streams cannot fit the %" PRIu64
                    " bytes that remain", at,
                    f->n_stream, rd_left(r));
    int found = 0;
    for (uint32_t s = 0; s < f->n_stream; s++) {
        char field[48];
        uint32_t count;
        snprintf(field, sizeof field, "stream %" PRIu32 " cell_count", s);
        at = r->off;
        if ((rc = rd_u32(r, field, &count)))
            return rc;
        if (count == 0)
            continue;
        if (found)
            return fail(r->name, r->err, r->errlen, LLST_E_UNSUPPORTED,
                        "offset %" PRIu64 ": %s: %" PRIu32 " cells in stream %" PRIu32 " as well as stream %" PRIu32
                        ": several sequences; save one with llama_state_seq_save_file",
                        at, field, count, s, f->stream);
        found = 1;
        f->stream = s;
        f->n_cells = count;
        if ((rc = parse_cells(r, f, s)) || (rc = parse_data(r, f)))
            return rc;
    }
    if (rd_left(r))
        return fail(r->name, r->err, r->errlen, LLST_E_FORMAT,
                    "offset %" PRIu64 ": %" PRIu64 " trailing bytes after the memory block", r->off,
                    rd_left(r));
    return LLST_OK;
}

static int parse_all(rd *r, llst_file *f)
{
    int rc;
    uint32_t magic;
    if ((rc = rd_u32(r, "magic", &magic)))
        return rc;
    const uint8_t mb[4] = {(uint8_t)magic, (uint8_t)(magic >> 8), (uint8_t)(magic >> 16),
                           (uint8_t)(magic >> 24)};
    f->kind = llst_sniff(mb, sizeof mb);
    if (f->kind == LLST_KIND_NONE)
        return fail(r->name, r->err, r->errlen, LLST_E_FORMAT,
                    "offset 0: magic: 0x%08" PRIx32 " is not a llama.cpp state file (0x%08x \"ggsq\" or 0x%08x \"ggsn\")",
                    magic, LLST_SEQ_MAGIC, LLST_SESSION_MAGIC);
    uint32_t want = f->kind == LLST_KIND_SEQ ? LLST_SEQ_VERSION : LLST_SESSION_VERSION;
    if ((rc = rd_u32(r, "version", &f->version)))
        return rc;
    if (f->version != want)
        return fail(r->name, r->err, r->errlen, LLST_E_UNSUPPORTED,
                    "offset 4: version: %s file version %" PRIu32 "; this reads version %" PRIu32,
                    llst_kind_name(f->kind), f->version, want);
    if ((rc = rd_u32(r, "n_tokens", &f->n_tokens)) || (rc = rd_fits(r, f->n_tokens, 4, "n_tokens")))
        return rc;
    if (f->n_tokens) {
        f->tokens = malloc((size_t)f->n_tokens * sizeof *f->tokens);
        if (!f->tokens)
            return fail(r->name, r->err, r->errlen, LLST_E_NOMEM, "out of memory for %" PRIu32 " tokens",
                        f->n_tokens);
        for (uint32_t i = 0; i < f->n_tokens; i++)
            if ((rc = rd_i32(r, "tokens", &f->tokens[i])))
                return rc;
    }
    if (f->kind == LLST_KIND_SESSION) {
        uint32_t len;
        if ((rc = rd_u32(r, "arch length", &len)) || (rc = rd_fits(r, len, 1, "arch length")))
            return rc;
        uint64_t at = r->off;
        f->arch = malloc((size_t)len + 1);
        if (!f->arch)
            return fail(r->name, r->err, r->errlen, LLST_E_NOMEM, "out of memory");
        if ((rc = rd_copy(r, f->arch, len, "arch")))
            return rc;
        f->arch[len] = 0;
        if (memchr(f->arch, 0, len))
            return fail(r->name, r->err, r->errlen, LLST_E_FORMAT,
                        "offset %" PRIu64 ": arch: contains a NUL byte", at);
    }
    return parse_memory(r, f);
}

int llst_parse(const void *data, size_t size, const char *name, llst_file *out, char *err,
               size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!out)
        return fail(name, err, errlen, LLST_E_ARG, "no output given");
    memset(out, 0, sizeof *out);
    if (!data && size)
        return fail(name, err, errlen, LLST_E_ARG, "no data given");
    rd r = {data, size, 0, name, err, errlen, 0, -1, 0, 0, NULL};
    int rc = parse_all(&r, out);
    if (rc) {
        llst_free(out);
        return rc;
    }
    out->size = size;
    return LLST_OK;
}

int llst_open(int fd, uint64_t size, const char *name, llst_file *out, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!out || fd < 0) {
        if (fd >= 0)
            close(fd);
        return fail(name, err, errlen, LLST_E_ARG, "no output or no file given");
    }
    memset(out, 0, sizeof *out);
    struct llst_src *src = calloc(1, sizeof *src);
    uint8_t *win = malloc(RD_WIN);
    if (src)
        src->fd = fd;
    if (!src || !win || !(src->name = malloc(strlen(name ? name : "(state)") + 1))) {
        if (!src)
            close(fd);
        src_free(src);
        free(win);
        return fail(name, err, errlen, LLST_E_NOMEM, "out of memory");
    }
    strcpy(src->name, name ? name : "(state)");
    rd r = {NULL, size, 0, name, err, errlen, 1, fd, 0, 0, win};
    int rc = parse_all(&r, out);
    free(win);
    if (rc) {
        src_free(src);
        llst_free(out);
        return rc;
    }
    out->size = size;
    out->src = src;
    return LLST_OK;
}

/* ---- the cache of a parsed file ------------------------------------------------ */

/* Is ggml type t usable as a cache type? Else a message naming it. */
static int check_type(const char *name, char *err, size_t errlen, uint32_t l, const char *kv, int32_t t)
{
    if (dtype_of(t))
        return LLST_OK;
    int quant;
    const char *n = ggml_other_name(t, &quant);
    if (quant)
        return fail(name, err, errlen, LLST_E_UNSUPPORTED,
                    "layer %" PRIu32 ": %s type %s (ggml type %" PRId32 ") is quantized: use an f16, bf16 or "
                    "f32 cache (llama.cpp --cache-type-%c f16; node-llama-cpp "
                    "experimentalKvCache%sType \"F16\")",
                    l, kv, n, t, kv[0] == 'K' ? 'k' : 'v', kv[0] == 'K' ? "Key" : "Value");
    return fail(name, err, errlen, LLST_E_UNSUPPORTED,
                "layer %" PRIu32 ": %s type %s%s(ggml type %" PRId32 ") is not a cache type supported (f16, bf16, f32)",
                l, kv, n ? n : "", n ? " " : "", t);
}

/* row bytes of n elements of dtype, or 0 on overflow */
static uint64_t row_of(uint32_t heads, uint32_t dim, size_t el)
{
    uint64_t n = (uint64_t)heads * dim;
    return n > UINT64_MAX / el ? 0 : n * el;
}

static int check_layers(const llst_file *f, const llst_shape *s, const char *name, char *err, size_t errlen)
{
    if (f->n_layer != s->n_layers)
        return fail(name, err, errlen, LLST_E_FORMAT, "n_layer: the file has %" PRIu32 " layers, the model %" PRIu32,
                    f->n_layer, s->n_layers);
    int rc;
    for (uint32_t l = 0; l < f->n_layer; l++) {
        const llst_layer *y = &f->layers[l];
        if ((rc = check_type(name, err, errlen, l, "K", y->k_type)) ||
            (rc = check_type(name, err, errlen, l, "V", y->v_type)))
            return rc;
        if (y->k_type != f->layers[0].k_type)
            return fail(name, err, errlen, LLST_E_UNSUPPORTED,
                        "layer %" PRIu32 ": K type %s differs from layer 0's (one K type for all layers)", l,
                        llst_type_name(y->k_type));
        if (y->v_type != f->layers[0].v_type)
            return fail(name, err, errlen, LLST_E_UNSUPPORTED,
                        "layer %" PRIu32 ": V type %s differs from layer 0's (one V type for all layers)", l,
                        llst_type_name(y->v_type));
        size_t kel = kvio_dtype_size(dtype_of(y->k_type)), vel = kvio_dtype_size(dtype_of(y->v_type));
        uint64_t kr = row_of(s->n_kv_heads, s->key_dim, kel), vr = row_of(s->n_kv_heads, s->value_dim, vel);
        if (y->k_row_bytes != kr)
            return fail(name, err, errlen, LLST_E_FORMAT,
                        "layer %" PRIu32 " K row bytes %" PRIu64 " do not match the model: %" PRIu32
                        " KV heads x %" PRIu32 " dims x %zu bytes (%s) = %" PRIu64,
                        l, y->k_row_bytes, s->n_kv_heads, s->key_dim, kel, llst_type_name(y->k_type), kr);
        if (f->v_trans && (y->v_el_bytes != vel || (uint64_t)y->v_n_embd != (uint64_t)s->n_kv_heads * s->value_dim))
            return fail(name, err, errlen, LLST_E_FORMAT,
                        "layer %" PRIu32 " V (transposed): element bytes %" PRIu32 " and n_embd_v_gqa %" PRIu32
                        " do not match the model: %zu bytes (%s), %" PRIu32 " KV heads x %" PRIu32 " dims",
                        l, y->v_el_bytes, y->v_n_embd, vel, llst_type_name(y->v_type), s->n_kv_heads,
                        s->value_dim);
        if (y->v_row_bytes != vr)
            return fail(name, err, errlen, LLST_E_FORMAT,
                        "layer %" PRIu32 " V row bytes %" PRIu64 " do not match the model: %" PRIu32
                        " KV heads x %" PRIu32 " dims x %zu bytes (%s) = %" PRIu64,
                        l, y->v_row_bytes, s->n_kv_heads, s->value_dim, vel, llst_type_name(y->v_type), vr);
    }
    return LLST_OK;
}

static int check_cells(const llst_file *f, const char *name, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < f->n_cells; i++) {
        if (f->pos[i] != (int64_t)i)
            return fail(name, err, errlen, LLST_E_UNSUPPORTED,
                        "cell %" PRIu32 " has position %" PRId32 ", not %" PRIu32
                        ": the cells are not positions 0..n-1 in order (after a context shift "
                        "or a removed range: fkvf needs cell i at position i)",
                        i, f->pos[i], i);
        if (f->seq_id[i] < 0)
            return fail(name, err, errlen, LLST_E_FORMAT, "cell %" PRIu32 ": sequence id %" PRId32 " is negative", i,
                        f->seq_id[i]);
        if (f->seq_id[i] != f->seq_id[0])
            return fail(name, err, errlen, LLST_E_UNSUPPORTED,
                        "cell %" PRIu32 " is in sequence %" PRId32 ", cell 0 in %" PRId32
                        ": several sequences; save one with llama_state_seq_save_file",
                        i, f->seq_id[i], f->seq_id[0]);
    }
    if (f->n_tokens && f->n_tokens != f->n_cells)
        return fail(name, err, errlen, LLST_E_UNSUPPORTED,
                    "n_tokens: %" PRIu32 " tokens for %" PRIu32 " cells (must be equal, or no tokens)", f->n_tokens,
                    f->n_cells);
    for (uint32_t i = 0; i < f->n_tokens; i++)
        if (f->tokens[i] < 0)
            return fail(name, err, errlen, LLST_E_FORMAT, "token %" PRIu32 " is negative (%" PRId32 ")", i,
                        f->tokens[i]);
    return LLST_OK;
}

/* n elements from one dtype to another (the same: a copy) */
static void cvt(fkvf_dtype to, void *dst, fkvf_dtype from, const void *src, size_t n, size_t el_from)
{
    if (to == from)
        memcpy(dst, src, n * el_from);
    else
        (void)fkvf_convert(to, dst, from, src, n); /* both dtypes valid, n > 0: cannot fail */
}

/* The cache's layer l from the file's. */
static void fill_layer(const llst_file *f, const llst_layer *y, kvio_cache *c, uint32_t l)
{
    uint32_t H = c->n_kv_heads, T = c->n_positions, Dk = c->key_dim, Dv = c->value_dim;
    fkvf_dtype kd = dtype_of(y->k_type), vd = dtype_of(y->v_type), cd = c->dtype;
    size_t kel = kvio_dtype_size(kd), vel = kvio_dtype_size(vd), cel = kvio_dtype_size(cd);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < H; h++) {
            const uint8_t *src = y->k + (size_t)t * y->k_row_bytes + (size_t)h * Dk * kel;
            cvt(cd, c->keys[l] + ((size_t)h * T + t) * Dk * cel, kd, src, Dk, kel);
        }
    if (!f->v_trans) {
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t h = 0; h < H; h++) {
                const uint8_t *src = y->v + (size_t)t * y->v_row_bytes + (size_t)h * Dv * vel;
                cvt(cd, c->values[l] + ((size_t)h * T + t) * Dv * cel, vd, src, Dv, vel);
            }
        return;
    }
    /* channel j = h * Dv + d holds the T cells' values of (head h, dim d) */
    for (uint32_t h = 0; h < H; h++)
        for (uint32_t d = 0; d < Dv; d++) {
            const uint8_t *ch = y->v + ((size_t)h * Dv + d) * T * vel;
            for (uint32_t t = 0; t < T; t++)
                cvt(cd, c->values[l] + (((size_t)h * T + t) * Dv + d) * cel, vd, ch + (size_t)t * vel, 1, vel);
        }
}

/* What llst_to_cache checks of f against the shape; *dt the cache's dtype. */
static int to_cache_check(const llst_file *f, const llst_shape *shape, const char *name,
                          fkvf_dtype *dt, char *err, size_t errlen)
{
    if (!f || !shape)
        return fail(name, err, errlen, LLST_E_ARG, "no file or no shape given");
    if (!shape->n_layers || !shape->n_kv_heads || !shape->key_dim || !shape->value_dim)
        return fail(name, err, errlen, LLST_E_ARG,
                    "model shape: layers (%" PRIu32 "), KV heads (%" PRIu32 "), key and value dims (%" PRIu32
                    ", %" PRIu32 ") must be >= 1",
                    shape->n_layers, shape->n_kv_heads, shape->key_dim, shape->value_dim);
    int rc;
    *dt = FKVF_DTYPE_F16; /* an empty state has no types: llama.cpp's default cache type */
    if (f->n_cells) {
        if (!f->layers || !f->pos || !f->seq_id || (f->n_tokens && !f->tokens))
            return fail(name, err, errlen, LLST_E_ARG, "not a parsed file");
        if ((rc = check_layers(f, shape, name, err, errlen)) || (rc = check_cells(f, name, err, errlen)))
            return rc;
        *dt = f->layers[0].k_type == f->layers[0].v_type ? dtype_of(f->layers[0].k_type) : FKVF_DTYPE_F32;
    } else if (f->n_tokens) {
        return fail(name, err, errlen, LLST_E_UNSUPPORTED,
                    "n_tokens: %" PRIu32 " tokens for 0 cells (must be equal, or no tokens)", f->n_tokens);
    }
    return LLST_OK;
}

static void copy_tokens(const llst_file *f, kvio_cache *out)
{
    out->token_width = 4;
    for (uint32_t i = 0; out->tokens && i < f->n_cells; i++)
        out->tokens[i] = f->tokens[i];
}

int llst_to_cache(const llst_file *f, const llst_shape *shape, const char *name, kvio_cache *out,
                  char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!out)
        return fail(name, err, errlen, LLST_E_ARG, "no output given");
    memset(out, 0, sizeof *out);
    fkvf_dtype dt;
    int rc = to_cache_check(f, shape, name, &dt, err, errlen);
    if (rc)
        return rc;
    if (f->n_cells && !f->layers[0].k)
        return fail(name, err, errlen, LLST_E_ARG,
                    "the rows are not in memory (llst_open: use llst_to_cache_lazy)");
    char e2[256];
    if (kvio_cache_init(out, shape->n_layers, shape->n_kv_heads, f->n_cells, shape->key_dim, shape->value_dim, dt,
                        f->n_cells && f->n_tokens, e2, sizeof e2) != KVIO_OK) {
        kvio_cache_free(out);
        return fail(name, err, errlen, LLST_E_NOMEM, "%s", e2);
    }
    copy_tokens(f, out);
    for (uint32_t l = 0; f->n_cells && l < f->n_layer; l++)
        fill_layer(f, &f->layers[l], out, l);
    return LLST_OK;
}

/* ---- rows on demand (llst_to_cache_lazy) ------------------------------------------- */

/* bytes read from the file in one pread, or staged for one pwrite (more
 * when one row is larger): 4 MiB, or what llst_set_piece set (tests) */
#define PIECE_DEFAULT ((size_t)4 << 20)
static size_t piece = PIECE_DEFAULT;

void llst_set_piece(size_t bytes) { piece = bytes ? bytes : PIECE_DEFAULT; }

static uint8_t *src_buf(struct llst_src *s, size_t n)
{
    if (n > s->cap) {
        uint8_t *p = realloc(s->buf, n);
        if (!p)
            return NULL;
        s->buf = p;
        s->cap = n;
    }
    return s->buf;
}

/* n bytes at byte off into the scratch buffer; NULL after an error line. */
static const uint8_t *src_read(struct llst_src *s, uint64_t off, size_t n, uint32_t layer,
                               const char *kv, char *err, size_t errlen, int *rc)
{
    uint8_t *b = src_buf(s, n ? n : 1);
    char what[48];
    snprintf(what, sizeof what, "layer %" PRIu32 " %s", layer, kv);
    if (!b)
        *rc = fail(s->name, err, errlen, KVIO_E_NOMEM, "out of memory for %zu bytes", n);
    else if (pread_full(s->fd, b, n, off) != 0)
        *rc = (io_fail(s->name, err, errlen, off, n, what, errno), KVIO_E_IO);
    else
        return b;
    return NULL;
}

/* A request of kvio_read_kv. */
typedef struct src_req {
    uint32_t layer, first, n;
    uint8_t *dst;
    size_t ps, hs;
} src_req;

/* Rows (K, or V with v_trans 0) of cells [first, first + n): runs of whole
 * rows, in pieces, each head's D elements converted to the cache's type. */
static int src_rows(struct llst_src *s, const src_req *q, int kv, char *err, size_t errlen)
{
    uint32_t D = kv ? s->Dv : s->Dk;
    fkvf_dtype ft = kv ? s->vd : s->kd;
    size_t fel = kvio_dtype_size(ft);
    size_t row = (size_t)s->H * D * fel, per = piece / row ? piece / row : 1;
    uint64_t base = s->off[2 * (size_t)q->layer + (size_t)kv];
    int rc = KVIO_OK;
    for (uint32_t i = 0; i < q->n; i += (uint32_t)per) {
        uint32_t m = q->n - i < per ? q->n - i : (uint32_t)per;
        const uint8_t *b = src_read(s, base + (uint64_t)(q->first + i) * row, (size_t)m * row, q->layer,
                                    kv ? "V" : "K", err, errlen, &rc);
        if (!b)
            return rc;
        for (uint32_t j = 0; j < m; j++)
            for (uint32_t h = 0; h < s->H; h++)
                cvt(s->cd, q->dst + (size_t)(i + j) * q->ps + h * q->hs, ft,
                    b + (size_t)j * row + (size_t)h * D * fel, D, fel);
    }
    return KVIO_OK;
}

/* A transposed V's cells [first, first + n): channel h * Dv + d holds the
 * T cells' elements of (head h, dim d); each channel's run of the cells
 * asked for is read in pieces and scattered to dim d of head h. */
static int src_vtrans(struct llst_src *s, const src_req *q, char *err, size_t errlen)
{
    size_t vel = kvio_dtype_size(s->vd), cel = kvio_dtype_size(s->cd);
    size_t per = piece / vel ? piece / vel : 1;
    uint64_t base = s->off[2 * (size_t)q->layer + 1];
    int rc = KVIO_OK;
    for (uint32_t h = 0; h < s->H; h++)
        for (uint32_t d = 0; d < s->Dv; d++) {
            uint64_t ch = base + ((uint64_t)h * s->Dv + d) * s->T * vel;
            uint8_t *out = q->dst + h * q->hs + d * cel;
            for (uint32_t i = 0; i < q->n; i += (uint32_t)per) {
                uint32_t m = q->n - i < per ? q->n - i : (uint32_t)per;
                const uint8_t *b = src_read(s, ch + (uint64_t)(q->first + i) * vel, (size_t)m * vel,
                                            q->layer, "V", err, errlen, &rc);
                if (!b)
                    return rc;
                for (uint32_t t = 0; t < m; t++)
                    cvt(s->cd, out + (size_t)(i + t) * q->ps, s->vd, b + (size_t)t * vel, 1, vel);
            }
        }
    return KVIO_OK;
}

static int src_read_kv(void *opaque, const kvio_cache *c, uint32_t layer, int kv, uint32_t first,
                       uint32_t n, void *dst, size_t pos_stride, size_t head_stride, char *err,
                       size_t errlen)
{
    (void)c;
    struct llst_src *s = opaque;
    src_req q = {layer, first, n, dst, pos_stride, head_stride};
    return kv && s->v_trans ? src_vtrans(s, &q, err, errlen) : src_rows(s, &q, kv, err, errlen);
}

int llst_to_cache_lazy(llst_file *f, const llst_shape *shape, const char *name, kvio_cache *out,
                       char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!out)
        return fail(name, err, errlen, LLST_E_ARG, "no output given");
    memset(out, 0, sizeof *out);
    fkvf_dtype dt;
    int rc = to_cache_check(f, shape, name, &dt, err, errlen);
    if (rc)
        return rc;
    struct llst_src *s = f->src;
    if (!s)
        return fail(name, err, errlen, LLST_E_ARG, "not a file from llst_open");
    free(s->off);
    if (!(s->off = calloc(2 * (size_t)shape->n_layers, sizeof *s->off)))
        return fail(name, err, errlen, LLST_E_NOMEM, "out of memory");
    s->T = f->n_cells;
    s->H = shape->n_kv_heads;
    s->Dk = shape->key_dim;
    s->Dv = shape->value_dim;
    s->v_trans = f->v_trans;
    s->cd = dt;
    s->kd = s->vd = dt;
    for (uint32_t l = 0; f->n_cells && l < f->n_layer; l++) {
        s->off[2 * (size_t)l] = f->layers[l].k_off;
        s->off[2 * (size_t)l + 1] = f->layers[l].v_off;
        s->kd = dtype_of(f->layers[l].k_type);
        s->vd = dtype_of(f->layers[l].v_type);
    }
    kvio_source ks = {src_read_kv, src_free, s, s->name};
    f->src = NULL; /* the cache's from here on, success or not */
    char e2[256];
    rc = kvio_cache_init_source(out, shape->n_layers, shape->n_kv_heads, f->n_cells, shape->key_dim,
                                shape->value_dim, dt, f->n_cells && f->n_tokens, &ks, e2, sizeof e2);
    if (rc != KVIO_OK) {
        kvio_cache_free(out);
        return fail(name, err, errlen, rc == KVIO_E_NOMEM ? LLST_E_NOMEM : LLST_E_ARG, "%s", e2);
    }
    copy_tokens(f, out);
    return LLST_OK;
}

void llst_params_from_file(const llst_file *f, llst_params *p)
{
    memset(p, 0, sizeof *p);
    p->kind = f->kind;
    p->n_stream = f->n_stream ? f->n_stream : 1;
    p->stream = f->stream;
    p->seq_id = f->n_cells && f->seq_id ? f->seq_id[0] : 0;
    p->v_trans = f->v_trans;
    p->k_type = f->n_cells && f->layers && f->n_layer ? f->layers[0].k_type : LLST_GGML_F16;
    p->v_type = f->n_cells && f->layers && f->n_layer ? f->layers[0].v_type : LLST_GGML_F16;
    p->arch = f->arch;
}

/* ---- writing -------------------------------------------------------------------- */

typedef struct wr {
    uint8_t *p;
    size_t off;
} wr;

static void put_u32(wr *w, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        w->p[w->off++] = (uint8_t)(v >> (8 * i));
}

static void put_i32(wr *w, int32_t v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    put_u32(w, u);
}

static void put_u64(wr *w, uint64_t v)
{
    put_u32(w, (uint32_t)v);
    put_u32(w, (uint32_t)(v >> 32));
}

/* a += b * c with overflow detection (returns 0 on overflow) */
static int acc(uint64_t *a, uint64_t b, uint64_t c)
{
    if (c && b > UINT64_MAX / c)
        return 0;
    if (*a > UINT64_MAX - b * c)
        return 0;
    *a += b * c;
    return 1;
}

/* The params alone. */
static int check_p(const llst_params *p, char *err, size_t errlen)
{
    const char *nm = "(params)";
    if (!p)
        return fail(nm, err, errlen, LLST_E_ARG, "no params given");
    if (p->kind != LLST_KIND_SEQ && p->kind != LLST_KIND_SESSION)
        return fail(nm, err, errlen, LLST_E_ARG, "kind %d is neither seq nor session", (int)p->kind);
    if (p->n_stream == 0 || p->n_stream > LLST_MAX_STREAMS || p->stream >= p->n_stream)
        return fail(nm, err, errlen, LLST_E_ARG, "stream %" PRIu32 " of %" PRIu32 " streams (n_stream >= 1, stream < n_stream)",
                    p->stream, p->n_stream);
    if (p->seq_id < 0)
        return fail(nm, err, errlen, LLST_E_ARG, "seq_id %" PRId32 " is negative", p->seq_id);
    if (p->v_trans > 1)
        return fail(nm, err, errlen, LLST_E_ARG, "v_trans %" PRIu32 " (0 or 1)", p->v_trans);
    if (!dtype_of(p->k_type) || !dtype_of(p->v_type))
        return fail(nm, err, errlen, LLST_E_ARG, "%s type %s: f32, f16 or bf16 (ggml types 0, 1, 30)",
                    dtype_of(p->k_type) ? "V" : "K", llst_type_name(dtype_of(p->k_type) ? p->v_type : p->k_type));
    if (p->kind == LLST_KIND_SESSION && !p->arch)
        return fail(nm, err, errlen, LLST_E_ARG, "a session needs the architecture name");
    if (p->kind == LLST_KIND_SESSION && strlen(p->arch) > UINT32_MAX)
        return fail(nm, err, errlen, LLST_E_ARG, "architecture name too long");
    return LLST_OK;
}

static int check_params(const kvio_cache *c, const llst_params *p, char *err, size_t errlen)
{
    const char *nm = "(params)";
    int rc = check_p(p, err, errlen);
    if (rc)
        return rc;
    char e2[256];
    if (kvio_cache_check(c, e2, sizeof e2) != KVIO_OK)
        return fail(nm, err, errlen, LLST_E_ARG, "%s", e2);
    if (c->n_positions > (uint32_t)INT32_MAX + 1u)
        return fail(nm, err, errlen, LLST_E_ARG, "%" PRIu32 " positions do not fit int32", c->n_positions);
    for (uint32_t t = 0; c->tokens && t < c->n_positions; t++)
        if (c->tokens[t] > INT32_MAX)
            return fail(nm, err, errlen, LLST_E_ARG, "token id %" PRId64 " at position %" PRIu32 " does not fit int32",
                        c->tokens[t], t);
    return LLST_OK;
}

static void write_layers(wr *w, const kvio_cache *c, const llst_params *p)
{
    uint32_t H = c->n_kv_heads, T = c->n_positions, Dk = c->key_dim, Dv = c->value_dim;
    fkvf_dtype kd = dtype_of(p->k_type), vd = dtype_of(p->v_type), cd = c->dtype;
    size_t kel = kvio_dtype_size(kd), vel = kvio_dtype_size(vd), cel = kvio_dtype_size(cd);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        put_i32(w, p->k_type);
        put_u64(w, (uint64_t)H * Dk * kel);
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t h = 0; h < H; h++) {
                cvt(kd, w->p + w->off, cd, c->keys[l] + ((size_t)h * T + t) * Dk * cel, Dk, cel);
                w->off += (size_t)Dk * kel;
            }
    }
    for (uint32_t l = 0; l < c->n_layers; l++) {
        put_i32(w, p->v_type);
        if (!p->v_trans) {
            put_u64(w, (uint64_t)H * Dv * vel);
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t h = 0; h < H; h++) {
                    cvt(vd, w->p + w->off, cd, c->values[l] + ((size_t)h * T + t) * Dv * cel, Dv, cel);
                    w->off += (size_t)Dv * vel;
                }
            continue;
        }
        put_u32(w, (uint32_t)vel);
        put_u32(w, H * Dv); /* fits: checked in llst_write_mem */
        for (uint32_t h = 0; h < H; h++)
            for (uint32_t d = 0; d < Dv; d++)
                for (uint32_t t = 0; t < T; t++) {
                    cvt(vd, w->p + w->off, cd, c->values[l] + (((size_t)h * T + t) * Dv + d) * cel, 1, cel);
                    w->off += vel;
                }
    }
}

/* Where things go in a state file written with params p (llst_write_mem,
 * llst_stream): every offset overflow-checked. */
typedef struct layout {
    uint64_t size;        /* bytes of the file */
    uint64_t mem;         /* the memory block (n_stream) */
    uint64_t cells;       /* the stream's first cell (T > 0) */
    uint64_t data;        /* layer 0's K header (T > 0) */
    uint64_t krow, vrow;  /* bytes of a K row, a V row in the file */
    uint64_t kblock, vblock; /* a layer's K: 12-byte header and T rows; V likewise */
} layout;

/* 0, or -1 when a size overflows. */
static int layout_of(const kvio_cache *c, uint32_t ntok, const llst_params *p, layout *lo)
{
    uint32_t T = c->n_positions, L = c->n_layers;
    size_t alen = p->kind == LLST_KIND_SESSION ? strlen(p->arch) : 0;
    memset(lo, 0, sizeof *lo);
    lo->krow = row_of(c->n_kv_heads, c->key_dim, kvio_dtype_size(dtype_of(p->k_type)));
    lo->vrow = row_of(c->n_kv_heads, c->value_dim, kvio_dtype_size(dtype_of(p->v_type)));
    uint64_t n = 12;
    lo->kblock = lo->vblock = 12;
    int ok = lo->krow && lo->vrow && acc(&n, ntok, 4) &&
             acc(&n, p->kind == LLST_KIND_SESSION ? 4 + (uint64_t)alen : 0, 1);
    lo->mem = n;
    ok = ok && acc(&n, 1 + (uint64_t)p->stream + 1, 4); /* n_stream, the counts up to the stream's */
    lo->cells = n;
    if (ok && T)
        ok = (!p->v_trans || (uint64_t)c->n_kv_heads * c->value_dim <= UINT32_MAX) && acc(&n, T, 12) &&
             acc(&n, 8, 1) && acc(&lo->kblock, T, lo->krow) && acc(&lo->vblock, T, lo->vrow);
    lo->data = n;
    ok = ok && (!T || (acc(&n, L, lo->kblock) && acc(&n, L, lo->vblock))) &&
         acc(&n, (uint64_t)p->n_stream - p->stream - 1, 4); /* the counts after it */
    lo->size = n;
    return ok ? 0 : -1;
}

int llst_write_mem(const kvio_cache *c, const llst_params *p, uint8_t **out, size_t *out_size,
                   char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!out || !out_size)
        return fail("(params)", err, errlen, LLST_E_ARG, "no output given");
    *out = NULL;
    *out_size = 0;
    int rc = check_params(c, p, err, errlen);
    if (rc)
        return rc;
    uint32_t T = c->n_positions, L = c->n_layers, ntok = c->tokens ? T : 0;
    size_t alen = p->kind == LLST_KIND_SESSION ? strlen(p->arch) : 0;
    layout lo;
    if (layout_of(c, ntok, p, &lo) || lo.size > SIZE_MAX)
        return fail("(params)", err, errlen, LLST_E_ARG, "the state file's size overflows");
    uint64_t n = lo.size;
    wr w = {malloc((size_t)n), 0};
    if (!w.p)
        return fail("(params)", err, errlen, LLST_E_NOMEM, "out of memory for %" PRIu64 " bytes", n);
    put_u32(&w, p->kind == LLST_KIND_SEQ ? LLST_SEQ_MAGIC : LLST_SESSION_MAGIC);
    put_u32(&w, p->kind == LLST_KIND_SEQ ? LLST_SEQ_VERSION : LLST_SESSION_VERSION);
    put_u32(&w, ntok);
    for (uint32_t t = 0; t < ntok; t++)
        put_i32(&w, (int32_t)c->tokens[t]);
    if (p->kind == LLST_KIND_SESSION) {
        put_u32(&w, (uint32_t)alen);
        memcpy(w.p + w.off, p->arch, alen);
        w.off += alen;
    }
    put_u32(&w, p->n_stream);
    for (uint32_t s = 0; s < p->n_stream; s++) {
        put_u32(&w, s == p->stream ? T : 0);
        if (s != p->stream || !T)
            continue;
        for (uint32_t t = 0; t < T; t++) {
            put_i32(&w, (int32_t)t);
            put_u32(&w, 1);
            put_i32(&w, p->seq_id);
        }
        put_u32(&w, p->v_trans);
        put_u32(&w, L);
        write_layers(&w, c, p);
    }
    *out = w.p;
    if (w.off != n) { /* the size computed above is the layout written: a bug if not */
        free(w.p);
        *out = NULL;
        return fail("(params)", err, errlen, LLST_E_ARG,
                    "internal error: %zu bytes written, %" PRIu64 " computed", w.off, n);
    }
    *out_size = w.off;
    return LLST_OK;
}

int llst_write_file(const char *path, unsigned flags, const kvio_cache *c, const llst_params *p,
                    char *err, size_t errlen)
{
    if (!path || !*path)
        return fail("(state)", err, errlen, LLST_E_ARG, "no path given");
    uint8_t *buf;
    size_t n;
    int rc = llst_write_mem(c, p, &buf, &n, err, errlen);
    if (rc)
        return rc;
    kvio_tmp t;
    rc = kvio_tmp_open(&t, path, err, errlen);
    if (rc == KVIO_OK && n && fwrite(buf, 1, n, t.f) != n) {
        kvio_tmp_discard(&t);
        free(buf);
        return fail(path, err, errlen, LLST_E_IO, "write failed (the temporary file)");
    }
    free(buf);
    if (rc == KVIO_OK)
        rc = kvio_tmp_place(&t, path, flags, err, errlen);
    switch (rc) {
    case KVIO_OK:
        return LLST_OK;
    case KVIO_E_NOMEM:
        return LLST_E_NOMEM;
    case KVIO_E_ARG:
        return LLST_E_ARG;
    default: /* KVIO_E_IO, KVIO_E_EXISTS */
        return LLST_E_IO;
    }
}

/* ---- META entries ------------------------------------------------------------------ */

#define K_KIND LLST_META_PREFIX "kind"
#define K_NSTREAM LLST_META_PREFIX "n_stream"
#define K_STREAM LLST_META_PREFIX "stream"
#define K_SEQ LLST_META_PREFIX "seq_id"
#define K_VTRANS LLST_META_PREFIX "v_trans"
#define K_KTYPE LLST_META_PREFIX "k_type"
#define K_VTYPE LLST_META_PREFIX "v_type"
#define K_ARCH LLST_META_PREFIX "arch"

int llst_meta_set(kvio_cache *c, const llst_params *p)
{
    if (!c || !p || (p->kind != LLST_KIND_SEQ && p->kind != LLST_KIND_SESSION) ||
        (p->kind == LLST_KIND_SESSION && !p->arch) || p->seq_id < 0 || p->k_type < 0 || p->v_type < 0)
        return LLST_E_ARG;
    char v[7][16];
    snprintf(v[0], sizeof v[0], "%" PRIu32, p->n_stream);
    snprintf(v[1], sizeof v[1], "%" PRIu32, p->stream);
    snprintf(v[2], sizeof v[2], "%" PRId32, p->seq_id);
    snprintf(v[3], sizeof v[3], "%" PRIu32, p->v_trans);
    snprintf(v[4], sizeof v[4], "%" PRId32, p->k_type);
    snprintf(v[5], sizeof v[5], "%" PRId32, p->v_type);
    const char *keys[] = {K_NSTREAM, K_STREAM, K_SEQ, K_VTRANS, K_KTYPE, K_VTYPE};
    int rc = kvio_cache_set_meta(c, K_KIND, p->kind == LLST_KIND_SEQ ? "seq" : "session");
    for (int i = 0; !rc && i < 6; i++)
        rc = kvio_cache_set_meta(c, keys[i], v[i]);
    if (!rc && p->kind == LLST_KIND_SESSION)
        rc = kvio_cache_set_meta(c, K_ARCH, p->arch);
    return rc == KVIO_OK ? LLST_OK : rc == KVIO_E_NOMEM ? LLST_E_NOMEM : LLST_E_ARG;
}

/* A decimal number: digits only (no sign, no blank), at least one, <= max. */
static int parse_dec(const char *s, uint64_t max, uint64_t *v)
{
    uint64_t x = 0;
    if (!*s)
        return 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return 0;
        unsigned d = (unsigned)(*s - '0');
        if (d > max || x > (max - d) / 10)
            return 0;
        x = x * 10 + d;
    }
    *v = x;
    return 1;
}

static int meta_num(const char *(*get)(void *, const char *), void *ctx, const char *key, uint64_t max,
                    uint64_t *v, const char *name, char *err, size_t errlen)
{
    const char *s = get(ctx, key);
    if (!s)
        return fail(name, err, errlen, LLST_E_FORMAT, "META %s is missing", key);
    if (!parse_dec(s, max, v))
        return fail(name, err, errlen, LLST_E_FORMAT, "META %s: '%.40s' is not a decimal number 0..%" PRIu64, key, s,
                    max);
    return LLST_OK;
}

int llst_meta_get(const char *(*get)(void *ctx, const char *key), void *ctx, llst_params *p,
                  const char *name, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!get || !p)
        return fail(name, err, errlen, LLST_E_ARG, "no getter or no params given");
    memset(p, 0, sizeof *p);
    const char *kind = get(ctx, K_KIND);
    if (!kind)
        return fail(name, err, errlen, LLST_E_FORMAT, "META %s is missing", K_KIND);
    if (!strcmp(kind, "seq"))
        p->kind = LLST_KIND_SEQ;
    else if (!strcmp(kind, "session"))
        p->kind = LLST_KIND_SESSION;
    else
        return fail(name, err, errlen, LLST_E_FORMAT, "META %s: '%.40s' is neither 'seq' nor 'session'", K_KIND, kind);
    uint64_t ns, st, seq, vt, kt, vty;
    int rc;
    if ((rc = meta_num(get, ctx, K_NSTREAM, LLST_MAX_STREAMS, &ns, name, err, errlen)) ||
        (rc = meta_num(get, ctx, K_STREAM, UINT32_MAX, &st, name, err, errlen)) ||
        (rc = meta_num(get, ctx, K_SEQ, INT32_MAX, &seq, name, err, errlen)) ||
        (rc = meta_num(get, ctx, K_VTRANS, 1, &vt, name, err, errlen)) ||
        (rc = meta_num(get, ctx, K_KTYPE, INT32_MAX, &kt, name, err, errlen)) ||
        (rc = meta_num(get, ctx, K_VTYPE, INT32_MAX, &vty, name, err, errlen)))
        goto bad;
    if (ns == 0 || st >= ns) {
        rc = fail(name, err, errlen, LLST_E_FORMAT, "META %s %" PRIu64 " and %s %" PRIu64 ": need stream < n_stream",
                  K_STREAM, st, K_NSTREAM, ns);
        goto bad;
    }
    if (!dtype_of((int32_t)kt) || !dtype_of((int32_t)vty)) {
        rc = fail(name, err, errlen, LLST_E_FORMAT, "META %s: ggml type %" PRIu64 " is not f32, f16 or bf16 (0, 1, 30)",
                  dtype_of((int32_t)kt) ? K_VTYPE : K_KTYPE, dtype_of((int32_t)kt) ? vty : kt);
        goto bad;
    }
    p->n_stream = (uint32_t)ns;
    p->stream = (uint32_t)st;
    p->seq_id = (int32_t)seq;
    p->v_trans = (uint32_t)vt;
    p->k_type = (int32_t)kt;
    p->v_type = (int32_t)vty;
    if (p->kind == LLST_KIND_SESSION) {
        p->arch = get(ctx, K_ARCH);
        if (!p->arch) {
            rc = fail(name, err, errlen, LLST_E_FORMAT, "META %s is missing (a session)", K_ARCH);
            goto bad;
        }
    }
    return LLST_OK;
bad:
    memset(p, 0, sizeof *p);
    return rc;
}

/* ---- writing chunk by chunk (llst_stream) ------------------------------------------ */


struct llst_stream {
    kvio_tmp t;
    int fd;
    char *path;
    unsigned flags;
    kvio_cache shape;      /* dimensions and dtype only */
    llst_params p;
    char *arch;            /* p.arch's copy */
    layout lo;
    uint32_t ntok;
    uint64_t rows_done, tok_done; /* (layer, kv, position) rows put, token ids put */
    uint8_t *stage;
    size_t cap;
};

void llst_stream_discard(llst_stream *w)
{
    if (!w)
        return;
    kvio_tmp_discard(&w->t);
    free(w->path);
    free(w->arch);
    free(w->stage);
    free(w);
}

static uint8_t *stage_of(llst_stream *w, size_t n)
{
    if (n > w->cap) {
        uint8_t *b = realloc(w->stage, n);
        if (!b)
            return NULL;
        w->stage = b;
        w->cap = n;
    }
    return w->stage;
}

/* n bytes at byte off of the temporary file. */
static int put_at(const llst_stream *w, const void *buf, size_t n, uint64_t off, char *err, size_t errlen)
{
    const uint8_t *b = buf;
    while (n) {
        ssize_t r = off > (uint64_t)INT64_MAX ? -1 : pwrite(w->fd, b, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return fail(w->path, err, errlen, LLST_E_IO, "write of %zu bytes at offset %" PRIu64 " failed: %s", n,
                        off, r < 0 ? strerror(errno) : "nothing written");
        b += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return LLST_OK;
}

/* The stream's count, its cells, v_trans and n_layer (from lo.cells - 4
 * on), in pieces of the stage. */
static int stream_cells(llst_stream *w, char *err, size_t errlen)
{
    uint32_t T = w->shape.n_positions;
    size_t per = 65536 / 12;
    wr b = {stage_of(w, 65536 + 16), 0};
    if (!b.p)
        return fail(w->path, err, errlen, LLST_E_NOMEM, "out of memory");
    uint64_t at = w->lo.cells - 4;
    put_u32(&b, T);
    for (uint32_t t = 0; t < T; t++) {
        put_i32(&b, (int32_t)t);
        put_u32(&b, 1);
        put_i32(&b, w->p.seq_id);
        if ((t + 1) % per == 0 || t + 1 == T) {
            if (t + 1 == T) {
                put_u32(&b, w->p.v_trans);
                put_u32(&b, w->shape.n_layers);
            }
            int rc = put_at(w, b.p, b.off, at, err, errlen);
            if (rc)
                return rc;
            at += b.off;
            b.off = 0;
        }
    }
    return T ? LLST_OK : put_at(w, b.p, b.off, at, err, errlen);
}

/* magic, version, n_tokens (the ids come later), a session's architecture. */
static int stream_prefix(llst_stream *w, char *err, size_t errlen)
{
    const llst_params *p = &w->p;
    uint8_t h[12];
    wr b = {h, 0};
    put_u32(&b, p->kind == LLST_KIND_SEQ ? LLST_SEQ_MAGIC : LLST_SESSION_MAGIC);
    put_u32(&b, p->kind == LLST_KIND_SEQ ? LLST_SEQ_VERSION : LLST_SESSION_VERSION);
    put_u32(&b, w->ntok);
    int rc = put_at(w, h, 12, 0, err, errlen);
    if (rc || p->kind != LLST_KIND_SESSION)
        return rc;
    uint64_t at = 12 + (uint64_t)w->ntok * 4;
    size_t alen = strlen(p->arch);
    b.off = 0;
    put_u32(&b, (uint32_t)alen);
    if (!(rc = put_at(w, h, 4, at, err, errlen)))
        rc = put_at(w, p->arch, alen, at + 4, err, errlen);
    return rc;
}

/* n_stream and the other streams' counts (0): before the stream's, and
 * after its data at the end of the file. */
static int stream_counts(llst_stream *w, char *err, size_t errlen)
{
    const llst_params *p = &w->p;
    uint8_t h[4];
    wr b = {h, 0};
    put_u32(&b, p->n_stream);
    int rc = put_at(w, h, 4, w->lo.mem, err, errlen);
    b.off = 0;
    put_u32(&b, 0);
    for (uint32_t s = 0; !rc && s < p->n_stream; s++)
        if (s != p->stream)
            rc = put_at(w, h, 4, s < p->stream ? w->lo.mem + 4 + 4 * (uint64_t)s
                                               : w->lo.size - 4 * (uint64_t)(p->n_stream - s),
                        err, errlen);
    return rc;
}

/* Every layer's K header, then every layer's V header. */
static int stream_layer_headers(llst_stream *w, char *err, size_t errlen)
{
    const llst_params *p = &w->p;
    uint32_t L = w->shape.n_layers;
    int rc = LLST_OK;
    for (uint32_t l = 0; !rc && l < 2 * L; l++) {
        int kv = l >= L;
        uint32_t y = kv ? l - L : l;
        uint8_t h[12];
        wr b = {h, 0};
        put_i32(&b, kv ? p->v_type : p->k_type);
        if (kv && p->v_trans) {
            put_u32(&b, (uint32_t)kvio_dtype_size(dtype_of(p->v_type)));
            put_u32(&b, w->shape.n_kv_heads * w->shape.value_dim);
        } else {
            put_u64(&b, kv ? w->lo.vrow : w->lo.krow);
        }
        uint64_t off = w->lo.data + (kv ? (uint64_t)L * w->lo.kblock + y * w->lo.vblock : y * w->lo.kblock);
        rc = put_at(w, h, 12, off, err, errlen);
    }
    return rc;
}

/* Everything but the rows and the token ids: the prefix, the memory
 * block's counts and cells, every layer's K and V header. */
static int stream_frame(llst_stream *w, char *err, size_t errlen)
{
    int rc = stream_prefix(w, err, errlen);
    if (!rc)
        rc = stream_counts(w, err, errlen);
    if (!rc)
        rc = stream_cells(w, err, errlen);
    if (!rc && w->shape.n_positions)
        rc = stream_layer_headers(w, err, errlen);
    return rc;
}

/* The shape a stream writes: kvio_cache_init's rules without the data. */
static int check_stream_shape(const kvio_cache *c, char *err, size_t errlen)
{
    const char *nm = "(params)";
    if (!c)
        return fail(nm, err, errlen, LLST_E_ARG, "no shape given");
    if (c->dtype != FKVF_DTYPE_F32 && c->dtype != FKVF_DTYPE_F16 && c->dtype != FKVF_DTYPE_BF16)
        return fail(nm, err, errlen, LLST_E_ARG, "dtype %d is not f16, bf16 or f32", (int)c->dtype);
    if (!c->n_layers || !c->n_kv_heads || !c->key_dim || !c->value_dim)
        return fail(nm, err, errlen, LLST_E_ARG, "layers, kv_heads and dims must be >= 1");
    if (c->n_positions > (uint32_t)INT32_MAX + 1u)
        return fail(nm, err, errlen, LLST_E_ARG, "%" PRIu32 " positions do not fit int32", c->n_positions);
    return LLST_OK;
}

int llst_stream_open(llst_stream **out, const char *path, unsigned flags, const kvio_cache *shape,
                     int with_tokens, const llst_params *p, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!out || !path || !*path)
        return fail("(state)", err, errlen, LLST_E_ARG, "no stream handle or no path given");
    *out = NULL;
    int rc = check_p(p, err, errlen);
    if (rc || (rc = check_stream_shape(shape, err, errlen)))
        return rc;
    llst_stream *w = calloc(1, sizeof *w);
    if (!w || !(w->path = malloc(strlen(path) + 1)) ||
        (p->kind == LLST_KIND_SESSION && !(w->arch = malloc(strlen(p->arch) + 1)))) {
        llst_stream_discard(w);
        return fail(path, err, errlen, LLST_E_NOMEM, "out of memory");
    }
    strcpy(w->path, path);
    w->flags = flags;
    w->p = *p;
    if (w->arch)
        w->p.arch = strcpy(w->arch, p->arch);
    w->shape.n_layers = shape->n_layers;
    w->shape.n_kv_heads = shape->n_kv_heads;
    w->shape.n_positions = shape->n_positions;
    w->shape.key_dim = shape->key_dim;
    w->shape.value_dim = shape->value_dim;
    w->shape.dtype = shape->dtype;
    w->ntok = with_tokens ? shape->n_positions : 0;
    if (layout_of(&w->shape, w->ntok, &w->p, &w->lo)) {
        llst_stream_discard(w);
        return fail("(params)", err, errlen, LLST_E_ARG, "the state file's size overflows");
    }
    if ((rc = kvio_tmp_open(&w->t, path, err, errlen)) != KVIO_OK) {
        llst_stream_discard(w);
        return rc == KVIO_E_NOMEM ? LLST_E_NOMEM : rc == KVIO_E_ARG ? LLST_E_ARG : LLST_E_IO;
    }
    w->fd = fileno(w->t.f);
    if ((rc = stream_frame(w, err, errlen))) {
        llst_stream_discard(w);
        return rc;
    }
    *out = w;
    return LLST_OK;
}

/* A request of llst_stream_kv. */
typedef struct put_req {
    uint32_t first, n;
    const uint8_t *src;
    size_t ps, hs;
    uint64_t base;       /* the block's first row (or channel) in the file */
} put_req;

/* K rows, or V rows (v_trans 0): runs of whole rows, converted in the stage. */
static int put_rows(llst_stream *w, const put_req *q, int kv, char *err, size_t errlen)
{
    uint32_t H = w->shape.n_kv_heads, D = kv ? w->shape.value_dim : w->shape.key_dim;
    fkvf_dtype td = dtype_of(kv ? w->p.v_type : w->p.k_type), cd = w->shape.dtype;
    size_t tel = kvio_dtype_size(td), cel = kvio_dtype_size(cd);
    size_t row = (size_t)H * D * tel, per = piece / row ? piece / row : 1;
    uint8_t *b = stage_of(w, (q->n < per ? q->n : per) * row);
    if (!b)
        return fail(w->path, err, errlen, LLST_E_NOMEM, "out of memory");
    for (uint32_t i = 0; i < q->n; i += (uint32_t)per) {
        uint32_t m = q->n - i < per ? q->n - i : (uint32_t)per;
        for (uint32_t j = 0; j < m; j++)
            for (uint32_t h = 0; h < H; h++)
                cvt(td, b + (size_t)j * row + (size_t)h * D * tel, cd,
                    q->src + (size_t)(i + j) * q->ps + h * q->hs, D, cel);
        int rc = put_at(w, b, (size_t)m * row, q->base + (uint64_t)(q->first + i) * row, err, errlen);
        if (rc)
            return rc;
    }
    return LLST_OK;
}

/* A transposed V: each channel's run of the cells given, gathered in the
 * stage; consecutive channels in one write when the run is every cell
 * (then they are contiguous in the file). */
static int put_vtrans(llst_stream *w, const put_req *q, char *err, size_t errlen)
{
    uint32_t H = w->shape.n_kv_heads, Dv = w->shape.value_dim, T = w->shape.n_positions;
    fkvf_dtype vd = dtype_of(w->p.v_type), cd = w->shape.dtype;
    size_t vel = kvio_dtype_size(vd), cel = kvio_dtype_size(cd);
    size_t run = (size_t)q->n * vel, nch = (size_t)H * Dv;
    size_t per = q->n == T && piece / run > 1 ? piece / run : 1; /* channels a write */
    if (per > nch)
        per = nch;
    uint8_t *b = stage_of(w, per * run);
    if (!b)
        return fail(w->path, err, errlen, LLST_E_NOMEM, "out of memory");
    for (size_t j0 = 0; j0 < nch; j0 += per) {
        size_t k = nch - j0 < per ? nch - j0 : per;
        for (size_t c = 0; c < k; c++) {
            size_t j = j0 + c, h = j / Dv, d = j % Dv;
            const uint8_t *s = q->src + h * q->hs + d * cel;
            for (uint32_t t = 0; t < q->n; t++)
                cvt(vd, b + c * run + (size_t)t * vel, cd, s + (size_t)t * q->ps, 1, cel);
        }
        int rc = put_at(w, b, k * run, q->base + ((uint64_t)j0 * T + q->first) * vel, err, errlen);
        if (rc)
            return rc;
    }
    return LLST_OK;
}

int llst_stream_kv(llst_stream *w, uint32_t layer, int kv, uint32_t first, uint32_t n, const void *src,
                   size_t pos_stride, size_t head_stride, char *err, size_t errlen)
{
    if (!w || (kv != 0 && kv != 1) || (!src && n))
        return fail("(state)", err, errlen, LLST_E_ARG, "no stream, no rows or kv not 0 or 1");
    const kvio_cache *c = &w->shape;
    if (layer >= c->n_layers || first > c->n_positions || n > c->n_positions - first)
        return fail(w->path, err, errlen, LLST_E_ARG,
                    "layer %" PRIu32 ", positions [%" PRIu32 ", %" PRIu64 ") outside the cache (%" PRIu32
                    " layers, %" PRIu32 " positions)",
                    layer, first, (uint64_t)first + n, c->n_layers, c->n_positions);
    if (n == 0)
        return LLST_OK;
    put_req q = {first, n, src, pos_stride, head_stride, 0};
    q.base = w->lo.data + 12 +
             (kv ? (uint64_t)c->n_layers * w->lo.kblock + layer * w->lo.vblock : layer * w->lo.kblock);
    int rc = kv && w->p.v_trans ? put_vtrans(w, &q, err, errlen) : put_rows(w, &q, kv, err, errlen);
    if (!rc)
        w->rows_done += n;
    return rc;
}

int llst_stream_tokens(llst_stream *w, uint32_t first, uint32_t n, const int64_t *ids, char *err,
                       size_t errlen)
{
    if (!w || (!ids && n))
        return fail("(state)", err, errlen, LLST_E_ARG, "no stream or no token ids");
    if (!w->ntok || first > w->ntok || n > w->ntok - first)
        return fail(w->path, err, errlen, LLST_E_ARG,
                    "token ids [%" PRIu32 ", %" PRIu64 ") outside the file's %" PRIu32, first,
                    (uint64_t)first + n, w->ntok);
    uint8_t *b = stage_of(w, (size_t)(n ? n : 1) * 4);
    if (!b)
        return fail(w->path, err, errlen, LLST_E_NOMEM, "out of memory");
    wr o = {b, 0};
    for (uint32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] > INT32_MAX)
            return fail(w->path, err, errlen, LLST_E_ARG,
                        "token id %" PRId64 " at position %" PRIu32 " does not fit int32", ids[i], first + i);
        put_i32(&o, (int32_t)ids[i]);
    }
    int rc = put_at(w, b, o.off, 12 + 4 * (uint64_t)first, err, errlen);
    if (!rc)
        w->tok_done += n;
    return rc;
}

int llst_stream_finish(llst_stream *w, char *err, size_t errlen)
{
    if (!w)
        return fail("(state)", err, errlen, LLST_E_ARG, "no stream");
    uint64_t want = 2 * (uint64_t)w->shape.n_layers * w->shape.n_positions;
    if (w->rows_done != want || w->tok_done != w->ntok) {
        int rc = fail(w->path, err, errlen, LLST_E_ARG,
                      "incomplete: %" PRIu64 " of %" PRIu64 " rows and %" PRIu64 " of %" PRIu32 " token ids given",
                      w->rows_done, want, w->tok_done, w->ntok);
        llst_stream_discard(w);
        return rc;
    }
    int rc = kvio_tmp_place(&w->t, w->path, w->flags, err, errlen);
    llst_stream_discard(w);
    return rc == KVIO_OK ? LLST_OK : rc == KVIO_E_NOMEM ? LLST_E_NOMEM : rc == KVIO_E_ARG ? LLST_E_ARG : LLST_E_IO;
}
