/* The appender (fkvf.h "appender"): grows an archive commit by commit
 * (spec 7.4-7.7) with a sliding exact window (spec 14.3). It reads the file
 * it continues through the public reader API, quantizes with the public
 * quantizer API, and writes through the writer's internal resume interface
 * (write/writer_resume.h). */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "ckd.h"
#include "error.h"
#include "handle.h"
#include "fkvf.h"
#include "append_impl.h"
#include "write/writer_resume.h"

struct fkvf_appender {
    fkvf_handle h; /* kind FKVF_HANDLE_APPENDER; OPEN or FAILED */
    const fkvf_allocator *alloc;
    fkvf_diag diag;
    char *path;
    fkvf_writer *w;
    int sections_only; /* fkvf_archive_append_sections: no codebook, window, tails */
    fkvf_append_options opts;

    fkvf_desc desc;
    char *model_id, *tokenizer_id;
    size_t row_bytes;
    uint64_t S, W;

    fkvf_rvq *q; /* NULL: no codebook, every position stays exact */
    uint8_t *cb_tables; /* the f16 tables q encodes with in place (it borrows them), or NULL */
    size_t cpp;  /* codes per position */
    fkvf_rope rope;
    int pre_rope;
    fkvf_stream_spec ispec;
    uint32_t iu; /* alignment unit of the index streams */
    int has_tokens;
    fkvf_stream_spec tspec;
    uint32_t tu;

    uint64_t n, A;       /* committed positions, archived positions */
    uint64_t seq, recovered;

    /* rows of positions [b0, n + pending): the recent window and the queue */
    uint8_t *rows;
    size_t rows_n, rows_cap;
    uint64_t b0;
    /* codes of archived positions [A - itail_n, A) (the partial unit) */
    uint16_t *itail;
    size_t itail_n, itail_cap; /* positions of codes held, room for */
    /* token ids of positions [n - ttail_n, n + pending) */
    uint32_t *tok;
    size_t tok_n, tok_cap;
    uint64_t pending;

    /* the open commit (fkvf.h fkvf_appender_append): once the buffer holds
     * queue_limit rows, the queued positions whose place is decided are
     * written past the committed end (spill); the commit writes the rest
     * and its trailer */
    size_t queue_bytes; /* fkvf_appender_set_queue_bytes (0: the default) */
    uint64_t Aw;        /* archived positions whose indices are written: [A, Aw) in the
                         * open commit; itail holds the codes of
                         * [Aw / iu * iu, Aw) */
    uint64_t xw;        /* queued positions [n, xw) whose exact rows are written */
    int spilled;        /* the open commit has bytes past the committed end */

    /* automatic compaction (fkvf_appender_commit, docs/appending.md) */
    int fd;                        /* the locked file (owned by w) */
    int ext_cb;                    /* the codebook is an external file's */
    fkvf_codebook_shape cbshape;   /* as read at open; its layer table: cb_layers */
    uint8_t *cb_layers;            /* the appender's copy of the codebook's layer table */
    double ratio;                  /* 0: off */
    uint64_t live_fixed;           /* live bytes that do not grow with positions */
    uint64_t retry_at;             /* after a failed compaction: not below this size */
};

#define FAIL(code, clause, ...) fkvf_fail(&a->diag, code, FKVF_NO_OFFSET, clause, __VA_ARGS__)

static int rows_reserve(fkvf_appender *a, size_t extra);

/* Record an error of the reader r (what: a prefix for the message) as the
 * appender's, keeping its offset and clause as fields (fkvf_appender_error);
 * the message quotes the reader's, which cites them. */
static int fail_reader(fkvf_appender *a, int rc, const fkvf_reader *r, const char *what)
{
    if (a->diag.code != FKVF_OK)
        return rc;
    fkvf_error_info e;
    fkvf_reader_error(r, &e);
    size_t n;
    const char *m = fkvf_quote_body(e.message, NULL, e.code, &n);
    fkvf_fail(&a->diag, rc, FKVF_NO_OFFSET, NULL, "%s%.*s", what, (int)n, m);
    a->diag.offset = e.offset;
    snprintf(a->diag.clause, sizeof a->diag.clause, "%s", e.clause ? e.clause : "");
    return rc;
}

/* Record an error of the appender's writer (prefix: what was being written)
 * as the appender's: the writer's message quoted without the file name the
 * appender's message starts with anyway and without its code tag. */
static int fail_writer(fkvf_appender *a, int rc, const char *prefix)
{
    if (!a->w)
        return FAIL(rc, NULL, "%s%s", prefix, fkvf_strerror(rc));
    size_t n;
    const char *m = fkvf_quote_body(fkvf_writer_message(a->w), a->path, rc, &n);
    return FAIL(rc, NULL, "%s%.*s", prefix, (int)n, m);
}

FKVF_API void fkvf_append_options_init(fkvf_append_options *opts)
{
    if (opts)
        memset(opts, 0, sizeof *opts);
}

static int a_enter(fkvf_appender *a)
{
    return FKVF_HANDLE_ENTER(a, FKVF_HANDLE_APPENDER, "appender");
}

FKVF_API const char *fkvf_appender_message(const fkvf_appender *a)
{
    if (!FKVF_HANDLE_IS(a, FKVF_HANDLE_APPENDER))
        return "not an appender handle";
    return a->diag.msg;
}

FKVF_API int fkvf_appender_error(const fkvf_appender *a, fkvf_error_info *out)
{
    return fkvf_diag_report(FKVF_HANDLE_IS(a, FKVF_HANDLE_APPENDER) ? &a->diag : NULL,
                            "not an appender handle", out);
}

FKVF_API void fkvf_appender_free(fkvf_appender *a)
{
    if (!FKVF_HANDLE_IS(a, FKVF_HANDLE_APPENDER))
        return;
    const fkvf_allocator *al = a->alloc;
    /* the open commit's spilled sections belong to no commit: cut them off
     * (best effort; a torn tail otherwise, which readers ignore) */
    if (a->spilled)
        (void)fkvf_writer_rollback(a->w);
    fkvf_writer_free(a->w); /* closes the file (and its lock) */
    fkvf_rvq_free(a->q);
    fkvf_free(al, a->cb_tables); /* after q, which borrowed them */
    fkvf_free(al, a->rows);
    fkvf_free(al, a->itail);
    fkvf_free(al, a->cb_layers);
    fkvf_free(al, a->tok);
    fkvf_free(al, a->model_id);
    fkvf_free(al, a->tokenizer_id);
    fkvf_free(al, a->path);
    a->h.magic = 0;
    fkvf_free(al, a);
}

FKVF_API int fkvf_appender_info(const fkvf_appender *a, fkvf_append_info *out)
{
    if (!FKVF_HANDLE_IS(a, FKVF_HANDLE_APPENDER))
        return FKVF_E_STATE;
    if (!out)
        return FKVF_E_INVALID_ARG;
    memset(out, 0, sizeof *out);
    out->n_positions = a->n;
    out->n_archived = a->A;
    out->pending = a->pending;
    out->commit_seq = a->seq;
    out->file_size = fkvf_writer_committed_size(a->w);
    out->recovered_bytes = a->recovered;
    out->has_tokens = a->has_tokens;
    out->has_codebook = a->q != NULL;
    return FKVF_OK;
}

/* Smallest even quad width holding symbols below k (spec 11.8). */
/* The codec of stream `id` and its length; 0 when the archive lacks it. */
static int spec_from_index(fkvf_reader *r, size_t idx, fkvf_stream_spec *spec, uint64_t *len)
{
    fkvf_stream_info si;
    if (fkvf_reader_stream_spec(r, idx, spec) != FKVF_OK ||
        fkvf_reader_stream_info(r, idx, &si) != FKVF_OK)
        return 0;
    *len = si.length;
    return 1;
}

size_t fkvf_append_index_streams(const fkvf_reader *r)
{
    size_t n = 0, ti;
    if (fkvf_reader_stream_count(r, &n) != FKVF_OK)
        return 0;
    if (fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &ti) == FKVF_OK)
        n = ti; /* the last stream */
    return n;
}

static int spec_from_stream(fkvf_reader *r, uint64_t id, fkvf_stream_spec *spec, uint64_t *len)
{
    size_t idx;
    return fkvf_reader_stream_find(r, id, &idx) == FKVF_OK && spec_from_index(r, idx, spec, len);
}

static int tok_reserve(fkvf_appender *a, size_t extra)
{
    size_t need;
    if (!fkvf_addsz(a->tok_n, extra, &need))
        return FAIL(FKVF_E_LIMIT, NULL, "too many queued tokens");
    if (need <= a->tok_cap)
        return FKVF_OK;
    size_t cap = a->tok_cap ? a->tok_cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    size_t bytes;
    if (!fkvf_mulsz(cap, sizeof *a->tok, &bytes))
        return FAIL(FKVF_E_LIMIT, NULL, "too many queued tokens");
    uint32_t *p = fkvf_realloc(a->alloc, a->tok, bytes);
    if (!p)
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for %zu token ids", need);
    a->tok = p;
    a->tok_cap = cap;
    return FKVF_OK;
}

/* The rows of the recent window and the partial units of the streams: what
 * the next commit continues. */
static int load_window(fkvf_appender *a, fkvf_reader *r, const fkvf_codebook_shape *cb)
{
    int rc;
    /* the window: rows of exact positions [b0, n) */
    /* without a codebook no row is needed again: every position stays exact */
    a->b0 = !a->q || a->n < a->S ? a->n : a->S + a->A;
    size_t nw = (size_t)(a->n - a->b0);
    if ((rc = rows_reserve(a, nw)))
        return rc;
    for (size_t i = 0; i < nw; i++) {
        const void *row;
        size_t rb;
        if ((rc = fkvf_reader_exact_row(r, a->b0 + i, &row, &rb)))
            return fail_reader(a, rc, r, "");
        memcpy(a->rows + i * a->row_bytes, row, a->row_bytes);
    }
    a->rows_n = nw;

    /* the partial unit of the index streams and of the token stream */
    if (a->q && a->A % a->iu) {
        uint64_t f = a->A / a->iu * a->iu;
        a->itail_n = (size_t)(a->A - f);
        size_t cnt;
        if (!fkvf_mulsz(a->itail_n, a->cpp, &cnt) ||
            !(a->itail = fkvf_malloc(a->alloc, cnt * sizeof *a->itail)))
            return FAIL(FKVF_E_NOMEM, NULL, "no memory");
        a->itail_cap = a->itail_n;
        uint32_t tmp[64];
        for (size_t j = 0; j < a->cpp; j++) {
            uint64_t id = fkvf_index_stream_id_shape(cb, a->desc.n_kv_heads, j);
            size_t idx;
            if ((rc = fkvf_reader_stream_find(r, id, &idx)) ||
                (rc = fkvf_reader_stream_read(r, idx, f, tmp, a->itail_n))) {
                char pre[48];
                snprintf(pre, sizeof pre, "index stream %016llx: ", (unsigned long long)id);
                return fail_reader(a, rc, r, pre);
            }
            for (size_t t = 0; t < a->itail_n; t++)
                a->itail[t * a->cpp + j] = (uint16_t)tmp[t];
        }
    }
    if (a->has_tokens && a->n % a->tu) {
        uint64_t f = a->n / a->tu * a->tu;
        size_t idx;
        if ((rc = tok_reserve(a, (size_t)(a->n - f))))
            return rc;
        if ((rc = fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &idx)) ||
            (rc = fkvf_reader_stream_read(r, idx, f, a->tok, (size_t)(a->n - f))))
            return fail_reader(a, rc, r, "token stream: ");
        a->tok_n = (size_t)(a->n - f);
    }

    return FKVF_OK;
}

/* The writer's view of the served commit of r (ai: its info): the groups'
 * codecs and lengths, the vertex tables, the sizes and counts (spec 7.6),
 * for a writer that continues the file (writer_resume.h). */
static int file_state(fkvf_appender *a, fkvf_reader *r, const fkvf_archive_info *ai,
                      fkvf_resume *st, uint32_t **vtxs, size_t *n_vtxs)
{
    /* codecs of the groups (spec 11.2): the index streams are the streams
     * before the token stream, taken by index (their names may need a layer
     * table, spec 11.2, that an external codebook not attached would give;
     * and with one, layer 0 may have no stage at all) */
    st->token_present = spec_from_stream(r, FKVF_STREAM_ID_TOKENS, &st->token_spec,
                                         &st->token_length);
    st->index_present = fkvf_append_index_streams(r) > 0 &&
                        spec_from_index(r, 0, &st->index_spec, &st->index_length);
    /* vertex tables already in the file (spec 10.3) */
    for (size_t i = 0; i < ai->n_sections; i++) {
        fkvf_section_info s;
        if (fkvf_reader_section(r, i, &s) || s.type != FKVF_SECTION_VTXS)
            continue;
        size_t cap = *n_vtxs;
        if (fkvf_grow(a->alloc, (void **)vtxs, &cap, *n_vtxs + 1, sizeof **vtxs))
            return FAIL(FKVF_E_NOMEM, NULL, "no memory");
        (*vtxs)[(*n_vtxs)++] = (uint32_t)s.key;
    }
    st->committed_size = ai->committed_size;
    st->last_seq = ai->n_commits;
    st->required_features = ai->required_features;
    st->optional_features = ai->optional_features;
    st->n_positions = ai->n_positions;
    st->n_archived = ai->n_archived;
    st->desc = &a->desc;
    return FKVF_OK;
}

/* Bits per symbol of a stream codec, for the live-bytes estimate: quad its
 * width, ngon the quad width of its alphabet (an entropy coder's bound). */
static unsigned est_bits(const fkvf_stream_spec *sp)
{
    if (sp->profile == FKVF_PROFILE_QUAD)
        return sp->symbol_bits;
    return fkvf_quad_bits_for(sp->alphabet > 1 ? sp->alphabet - 1u : 1u);
}

/* The live bytes that grow with the positions (docs/appending.md): the
 * exact rows of the exact positions, the index symbols of the archived ones
 * and the token ids, at the codecs' widths. Saturates. */
static uint64_t live_var(const fkvf_appender *a)
{
    uint64_t exact = a->n - a->A, v = 0, t;
    if (!fkvf_mul64(exact, a->row_bytes, &v))
        return UINT64_MAX;
    if (a->q) {
        uint64_t bits;
        if (!fkvf_mul64(a->A, (uint64_t)a->cpp * est_bits(&a->ispec), &bits) ||
            !fkvf_add64(v, bits / 8, &v))
            return UINT64_MAX;
    }
    if (a->has_tokens) {
        if (!fkvf_mul64(a->n, est_bits(&a->tspec), &t) || !fkvf_add64(v, t / 8, &v))
            return UINT64_MAX;
    }
    return v;
}

/* The live bytes that do not grow with the positions, as of the file open
 * (r, ai): a file of one commit is compact (all of it but live_var); else
 * the sections a compaction keeps whole (descriptor, codebook, vertex
 * tables, the last metadata, one search index per stream), 64 bytes of
 * framing each, the header, one directory and the trailer. After each
 * automatic compaction it is measured exactly instead. */
static uint64_t fixed_at_open(const fkvf_appender *a, fkvf_reader *r, const fkvf_archive_info *ai)
{
    uint64_t var = live_var(a);
    if (ai->n_commits == 1)
        return ai->committed_size > var ? ai->committed_size - var : 0;
    uint64_t f = 64 + 64 + 64, meta = 0;
    size_t kept = 0;
    for (size_t i = 0; i < ai->n_sections; i++) {
        fkvf_section_info s;
        if (fkvf_reader_section(r, i, &s))
            continue;
        int keep = s.type == FKVF_SECTION_DESC || s.type == FKVF_SECTION_CBK1 ||
                   s.type == FKVF_SECTION_CBRF || s.type == FKVF_SECTION_VTXS ||
                   s.type == FKVF_SECTION_CMET; /* compaction carries the metric (13.8) */
        if (s.type == FKVF_SECTION_META)
            meta = s.stored_size + 64; /* the last one counts */
        if (s.type == FKVF_SECTION_ZIDX) {
            keep = 1;
            for (size_t k = i + 1; k < ai->n_sections && keep; k++) {
                fkvf_section_info l;
                keep = fkvf_reader_section(r, k, &l) || l.type != FKVF_SECTION_ZIDX ||
                       l.key != s.key; /* a later one of the same stream replaces it */
            }
        }
        if (keep) {
            f += s.stored_size + 64;
            kept++;
        }
    }
    return f + meta + 64 * (uint64_t)(kept + 8);
}

/* The archive's summary into *ai: an archive (not a codebook file), without
 * a torn tail unless the recover option is set. */
static int load_info(fkvf_appender *a, fkvf_reader *r, fkvf_archive_info *ai)
{
    int rc;
    if ((rc = fkvf_reader_info(r, ai)))
        return fail_reader(a, rc, r, "");
    if (!ai->has_desc)
        return FAIL(FKVF_E_INVALID_ARG, "13.4", "a codebook file, not an archive");
    if (ai->torn_bytes && !a->opts.recover)
        return FAIL(FKVF_E_TORN, "7.7",
                    "%llu bytes after the last complete commit (a torn append): recover the "
                    "file first (fkvf recover, or the recover option)",
                    (unsigned long long)ai->torn_bytes);
    a->recovered = ai->torn_bytes;
    return FKVF_OK;
}

/* The descriptor into *d and a->desc (with the appender's own copies of its
 * strings), and the size of a row of its dtype. */
static int load_desc(fkvf_appender *a, fkvf_reader *r, fkvf_desc *d)
{
    int rc;
    if ((rc = fkvf_reader_desc(r, d)))
        return fail_reader(a, rc, r, "");
    size_t ml = d->model_id ? strlen(d->model_id) : 0;
    size_t tl = d->tokenizer_id ? strlen(d->tokenizer_id) : 0;
    if (!(a->model_id = fkvf_strndup(a->alloc, d->model_id ? d->model_id : "", ml)) ||
        !(a->tokenizer_id = fkvf_strndup(a->alloc, d->tokenizer_id ? d->tokenizer_id : "", tl)))
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for the descriptor");
    a->desc = *d;
    a->desc.model_id = a->model_id;
    a->desc.tokenizer_id = a->tokenizer_id;
    if ((rc = fkvf_reader_row_bytes(r, d->dtype, &a->row_bytes)))
        return fail_reader(a, rc, r, "");
    return FKVF_OK;
}

/* The quantizer a->q of the codebook cb (contents of csize bytes), under
 * the codebook's encoder metric if it has one (spec 13.2, 13.8): one that
 * fails its checks stops the append. */
static int load_quantizer(fkvf_appender *a, fkvf_reader *r, const fkvf_codebook_shape *cb,
                          uint32_t n_kv_heads, const void *contents, size_t csize)
{
    size_t to = (size_t)fkvf_codebook_tables_offset(cb), tsz = csize - to;
    const uint8_t *tables = (const uint8_t *)contents + to;
    int rc = FKVF_E_UNSUPPORTED;
    if (cb->dtype == FKVF_DTYPE_F16) {
        /* f16 tables encoded in place: the appender's one copy of them (the
         * reader's mapping goes after the open), not binary32 tables of
         * twice their size; the same indices (fkvf.h) */
        if (!(a->cb_tables = fkvf_malloc(a->alloc, tsz ? tsz : 1)))
            return FAIL(FKVF_E_NOMEM, NULL, "no memory for the codebook's tables");
        memcpy(a->cb_tables, tables, tsz);
        rc = fkvf_rvq_from_tables16_encode(&a->q, cb, n_kv_heads, a->cb_tables, tsz, a->alloc);
        if (rc == FKVF_E_UNSUPPORTED) { /* this CPU or build: binary32 tables */
            fkvf_free(a->alloc, a->cb_tables);
            a->cb_tables = NULL;
        }
    }
    if (rc == FKVF_E_UNSUPPORTED)
        rc = fkvf_rvq_from_tables(&a->q, cb, n_kv_heads, tables, tsz, a->alloc);
    if (rc)
        return FAIL(rc, "13.2", "the archive's codebook cannot be loaded (%s)",
                    fkvf_strerror(rc));
    fkvf_rvq_metric mm;
    rc = fkvf_reader_metric(r, &mm);
    if (rc != FKVF_OK && rc != FKVF_E_NOT_FOUND)
        return fail_reader(a, rc, r, "the codebook's encoder metric: ");
    if (rc == FKVF_OK && (rc = fkvf_rvq_set_metric(a->q, &mm)))
        return FAIL(rc, "13.8", "the codebook's encoder metric cannot be used (%s)",
                    fkvf_strerror(rc));
    a->cpp = fkvf_rvq_codes_per_position(a->q);
    return FKVF_OK;
}

/* The codebook (spec 13): embedded, or external and given (attached to r);
 * its shape into *cb, the quantizer (not for sections only) and
 * st->cb_kind / st->cb. *ext: the archive refers to an external codebook.
 * An archive without one leaves a->q NULL: every position stays exact. */
static int load_codebook(fkvf_appender *a, fkvf_reader *r, uint32_t n_kv_heads, fkvf_resume *st,
                         fkvf_codebook_shape *cb, int *ext)
{
    int rc;
    uint8_t hash[16];
    const char *name;
    if ((rc = fkvf_reader_codebook_ref(r, ext, hash, &name)))
        return fail_reader(a, rc, r, "");
    if (*ext && a->sections_only) {
        /* no index segment will be written: the shape is not needed */
        st->cb_kind = 2;
        st->cb = cb;
        return FKVF_OK;
    }
    if (*ext) {
        if (!a->opts.codebook_file)
            return FAIL(FKVF_E_CODEBOOK, "13.5",
                        "the archive refers to an external codebook (\"%s\"): give it as the "
                        "codebook_file option",
                        name);
        if ((rc = fkvf_reader_attach_codebook(r, a->opts.codebook_file)))
            return fail_reader(a, rc, r, "");
    }
    const void *contents;
    size_t csize;
    rc = fkvf_reader_codebook(r, cb, &contents, &csize, NULL);
    if (rc == FKVF_E_NOT_FOUND)
        return FKVF_OK;
    if (rc)
        return fail_reader(a, rc, r, "");
    if (cb->layer_stages) {
        /* the appender's own copy: the reader is freed before the writer resumes */
        size_t tn = 2 * (size_t)cb->n_layers;
        if (!(a->cb_layers = fkvf_malloc(a->alloc, tn)))
            return FAIL(FKVF_E_NOMEM, NULL, "no memory for the codebook's layer table");
        memcpy(a->cb_layers, cb->layer_stages, tn);
        cb->layer_stages = a->cb_layers;
    }
    if (!a->sections_only && (rc = load_quantizer(a, r, cb, n_kv_heads, contents, csize)))
        return rc;
    st->cb_kind = *ext ? 2 : 1;
    st->cb = cb;
    return FKVF_OK;
}

/* The codecs the appender continues the streams with: the file's, or for
 * index streams not in it yet quad at the codebook's width; their
 * alignment units. */
static void set_stream_codecs(fkvf_appender *a, const fkvf_resume *st,
                              const fkvf_codebook_shape *cb)
{
    if (st->index_present) {
        a->ispec = st->index_spec;
    } else if (a->q) {
        memset(&a->ispec, 0, sizeof a->ispec);
        a->ispec.profile = FKVF_PROFILE_QUAD;
        a->ispec.symbol_bits = fkvf_quad_bits_for((uint64_t)cb->k - 1);
    }
    a->iu = a->q ? fkvf_stream_spec_align(&a->ispec) : 1;
    a->has_tokens = st->token_present;
    if (a->has_tokens) {
        a->tspec = st->token_spec;
        a->tu = fkvf_stream_spec_align(&a->tspec);
    }
}

/* Everything the appender needs from the served commit, through a reader. */
static int load_state(fkvf_appender *a, fkvf_reader *r, fkvf_resume *st, uint32_t **vtxs,
                      size_t *n_vtxs, fkvf_codebook_shape *cb)
{
    int rc;
    fkvf_archive_info ai;
    if ((rc = load_info(a, r, &ai)))
        return rc;
    fkvf_desc d;
    if ((rc = load_desc(a, r, &d)))
        return rc;
    a->S = d.n_sinks;
    a->W = d.window;
    a->n = ai.n_positions;
    a->A = ai.n_archived;
    a->seq = ai.n_commits;
    a->Aw = a->A;
    a->xw = a->n;
    int ext = 0;
    if ((rc = load_codebook(a, r, d.n_kv_heads, st, cb, &ext)))
        return rc;
    if (d.key_transform == 1 && d.key_storage == 1) {
        a->pre_rope = 1;
        a->rope.layout = d.rope_layout;
        a->rope.rope_dims = d.rope_dims;
        a->rope.theta = d.rope_theta;
    }

    if ((rc = file_state(a, r, &ai, st, vtxs, n_vtxs)))
        return rc;
    set_stream_codecs(a, st, cb);
    if (!a->sections_only && (rc = load_window(a, r, cb)))
        return rc;
    if (a->q)
        a->cbshape = *cb;
    a->ext_cb = ext;
    a->live_fixed = fixed_at_open(a, r, &ai);
    return FKVF_OK;
}

/* The lock protocol of append_impl.h: the flock, then the check that the
 * file locked is the one the path names. */
int fkvf_append_lock(const char *path, int oflags, const char *purpose, fkvf_diag *d, int *fd_out)
{
    /* The file locked must still be the one the path names: a compaction
     * that renamed a new file over the path between the open and the lock
     * leaves this process holding the old one, whose commits would be lost
     * with it; then lock the new one (a few times at most). */
    *fd_out = -1;
    for (int attempt = 0;; attempt++) {
        int fd = open(path, oflags | O_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            return fkvf_fail(d, FKVF_E_IO, FKVF_NO_OFFSET, NULL, "cannot open for %s: %s",
                             purpose, strerror(e));
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            return fkvf_fail(d, FKVF_E_IO, FKVF_NO_OFFSET, "7.4",
                             "cannot lock the file (%s): another appender has it open",
                             strerror(e));
        }
        struct stat held, named;
        if (fstat(fd, &held) != 0 || stat(path, &named) != 0) {
            int e = errno;
            close(fd);
            return fkvf_fail(d, FKVF_E_IO, FKVF_NO_OFFSET, NULL,
                             "cannot stat the file locked: %s", strerror(e));
        }
        if (held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
            *fd_out = fd;
            return FKVF_OK;
        }
        close(fd);
        if (attempt == 7)
            return fkvf_fail(d, FKVF_E_IO, FKVF_NO_OFFSET, "7.4",
                             "the file is being replaced while it is locked (8 "
                             "attempts): another process keeps renaming files over it");
    }
}

/* ---- automatic compaction (fkvf_appender_commit) ------------------------ */

#define LEFTOVER_TAG ".autocompact"

/* Remove the temporary file an automatic compaction of the file at path
 * left behind (a crash): NAME.autocompact next to the file its links
 * resolve to. Called under the lock: no compaction of this file runs, since
 * one holds the lock until its rename. Best effort (one unlink). */
static void sweep_leftovers(const char *path)
{
    /* no allocation: a failure here is no one's to report */
    char real[PATH_MAX], tmp[PATH_MAX + sizeof LEFTOVER_TAG];
    if (!realpath(path, real))
        return;
    snprintf(tmp, sizeof tmp, "%s%s", real, LEFTOVER_TAG);
    (void)unlink(tmp);
}

/* The sink of the compaction: the temporary file through the appender's io. */
typedef struct tmp_sink {
    const fkvf_io *io;
    int fd;
} tmp_sink;

static long long tmp_write(void *opaque, const void *data, size_t size)
{
    tmp_sink *t = opaque;
    if (t->io && t->io->write)
        return t->io->write(t->io->opaque, t->fd, data, size);
    return (long long)write(t->fd, data, size);
}

static int tmp_sync(void *opaque)
{
    tmp_sink *t = opaque;
    if (t->io && t->io->sync)
        return t->io->sync(t->io->opaque, t->fd);
    return fdatasync(t->fd);
}

/* fsync the directory dir through the appender's io. */
static int sync_dir(const fkvf_appender *a, const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = a->opts.io && a->opts.io->sync ? a->opts.io->sync(a->opts.io->opaque, fd)
                                            : fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* A writer *w that continues the file fd (state st from file_state or
 * load_state, the file's vertices vtxs, freed here) with the appender's
 * block size, sync policy and I/O; the writer owns fd from the call on. */
static int resume_writer(fkvf_appender *a, fkvf_resume *st, int fd, uint32_t *vtxs, size_t n_vtxs,
                         fkvf_writer **w)
{
    st->fd = fd;
    st->path = a->path;
    st->vtxs = vtxs;
    st->n_vtxs = n_vtxs;
    st->io = a->opts.io;
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    wo.block_size = a->opts.block_size;
    wo.sync = a->opts.sync;
    int rc = fkvf_writer_resume(w, st, &wo, a->alloc);
    fkvf_free(a->alloc, vtxs);
    return rc;
}

/* The new file at tmp, compacted and locked on fd: a writer that continues
 * it (*w2 owns fd from the call on), after checking that it serves the
 * appender's positions. */
static int resume_new(fkvf_appender *a, const char *tmp, int fd, fkvf_writer **w2)
{
    *w2 = NULL;
    fkvf_reader *r = NULL;
    fkvf_resume st;
    memset(&st, 0, sizeof st);
    uint32_t *vtxs = NULL;
    size_t n_vtxs = 0;
    fkvf_archive_info ai;
    int rc = fkvf_reader_open_file(&r, tmp, 0, a->alloc);
    if (rc == FKVF_OK)
        rc = fkvf_reader_info(r, &ai);
    if (rc != FKVF_OK) {
        rc = r ? fail_reader(a, rc, r, "auto-compaction: reading the new file: ")
               : FAIL(rc, NULL, "auto-compaction: reading the new file: %s", fkvf_strerror(rc));
    } else if (ai.n_positions != a->n || ai.n_archived != a->A || ai.torn_bytes) {
        rc = FAIL(FKVF_E_CORRUPT, NULL,
                  "auto-compaction: the new file %s holds %llu positions (%llu archived), not "
                  "%llu (%llu)", tmp, (unsigned long long)ai.n_positions,
                  (unsigned long long)ai.n_archived, (unsigned long long)a->n,
                  (unsigned long long)a->A);
    } else if ((rc = file_state(a, r, &ai, &st, &vtxs, &n_vtxs)) == FKVF_OK) {
        st.cb_kind = a->q ? (a->ext_cb ? 2 : 1) : 0;
        st.cb = &a->cbshape;
    }
    fkvf_reader_free(r);
    if (rc != FKVF_OK) {
        fkvf_free(a->alloc, vtxs);
        close(fd);
        return rc;
    }
    rc = resume_writer(a, &st, fd, vtxs, n_vtxs, w2);
    if (rc != FKVF_OK) {
        size_t n;
        const char *m = *w2 ? fkvf_quote_body(fkvf_writer_message(*w2), a->path, rc, &n)
                            : fkvf_strerror(rc);
        if (!*w2)
            n = strlen(m);
        FAIL(rc, NULL, "auto-compaction: continuing the new file: %.*s", (int)n, m);
        fkvf_writer_free(*w2);
        *w2 = NULL;
    }
    return rc;
}

/* The automatic compaction after a commit (fkvf.h fkvf_appender_commit):
 * FKVF_OK when the handle continues (the new file, or the old one after a
 * failure before the rename, recorded in a->diag); else the error of a
 * failure after the rename, and the handle has failed. */
static int auto_compact(fkvf_appender *a)
{
    char *real = realpath(a->path, NULL), *tmp = NULL, *dcopy = NULL;
    int fd = -1, rc = FKVF_OK;
    fkvf_writer *w2 = NULL;
    struct stat held, named;
    if (!real) {
        rc = FAIL(FKVF_E_IO, NULL, "auto-compaction: cannot resolve the path: %s",
                  strerror(errno));
        goto fail;
    }
    size_t rl = strlen(real);
    if (!(tmp = fkvf_malloc(a->alloc, rl + sizeof LEFTOVER_TAG)) ||
        !(dcopy = fkvf_malloc(a->alloc, rl + 1))) {
        rc = FAIL(FKVF_E_NOMEM, NULL, "auto-compaction: no memory");
        goto fail;
    }
    memcpy(dcopy, real, rl + 1);
    snprintf(tmp, rl + sizeof LEFTOVER_TAG, "%s%s", real, LEFTOVER_TAG);
    if (fstat(a->fd, &held) != 0 || stat(real, &named) != 0 || held.st_dev != named.st_dev ||
        held.st_ino != named.st_ino) {
        rc = FAIL(FKVF_E_IO, "7.4", "auto-compaction: %s is no longer the file locked", real);
        goto fail;
    }
    /* one name per file: only the holder of the lock uses it, and a file
     * of that name is a crash's leftover */
    (void)unlink(tmp);
    if ((fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600)) < 0) {
        int e = errno;
        rc = FAIL(FKVF_E_IO, NULL, "auto-compaction: cannot create %s: %s", tmp, strerror(e));
        tmp[0] = 0; /* not ours: not removed */
        goto fail;
    }
    if (fchmod(fd, held.st_mode & 07777) != 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
        rc = FAIL(FKVF_E_IO, NULL, "auto-compaction: preparing %s: %s", tmp, strerror(errno));
        goto fail;
    }
    tmp_sink ts = {a->opts.io, fd};
    fkvf_sink sink = {tmp_write, tmp_sync, &ts};
    if ((rc = fkvf_compact_to_sink(real, tmp, &sink, a->q && a->ext_cb ? &a->cbshape : NULL,
                                   a->alloc, &a->diag)) != FKVF_OK)
        goto fail;
    int newfd = fd;
    rc = resume_new(a, tmp, fd, &w2); /* owns fd */
    fd = -1;
    if (rc != FKVF_OK)
        goto fail;
    /* the lock is still held: no one replaced the file meanwhile */
    if (rename(tmp, real) != 0) {
        rc = FAIL(FKVF_E_IO, NULL, "auto-compaction: rename over %s: %s", real,
                  strerror(errno));
        goto fail;
    }
    tmp[0] = 0;
    /* continue the new file: the old one (and its lock) is released; an
     * appender that opened it meanwhile finds it replaced (append_impl.h) */
    fkvf_writer_free(a->w);
    a->w = w2;
    a->fd = newfd;
    uint64_t size = fkvf_writer_committed_size(w2), var = live_var(a);
    a->live_fixed = size > var ? size - var : 0;
    a->seq = 1;
    a->retry_at = 0;
    if (sync_dir(a, dirname(dcopy)) != 0) {
        int e = errno;
        fkvf_handle_fail(&a->h, 0);
        rc = FAIL(FKVF_E_IO, "7.6", "auto-compaction: syncing the directory after the rename "
                  "failed (%s): the commit is in %s, whose rename may not be durable; reopen "
                  "to continue", strerror(e), real);
    }
    free(real);
    fkvf_free(a->alloc, tmp);
    fkvf_free(a->alloc, dcopy);
    return rc;
fail:
    /* before the rename: the path and the handle are as after the commit */
    fkvf_writer_free(w2);
    if (fd >= 0)
        close(fd);
    if (tmp && tmp[0])
        (void)unlink(tmp);
    free(real);
    fkvf_free(a->alloc, tmp);
    fkvf_free(a->alloc, dcopy);
    uint64_t now = fkvf_writer_committed_size(a->w), grow;
    double g = (a->ratio - 1) * ((double)a->live_fixed + (double)live_var(a));
    grow = g >= 1.8e19 ? UINT64_MAX : (uint64_t)g;
    a->retry_at = fkvf_add64(now, grow, &a->retry_at) ? a->retry_at : UINT64_MAX;
    (void)rc;
    return FKVF_OK;
}

/* After a commit: compact when the file exceeds ratio x its live bytes. */
static int maybe_compact(fkvf_appender *a)
{
    if (a->ratio == 0)
        return FKVF_OK;
    uint64_t size = fkvf_writer_committed_size(a->w), live = a->live_fixed, var = live_var(a);
    live = fkvf_add64(live, var, &live) ? live : UINT64_MAX;
    if (size < a->retry_at || (double)size <= a->ratio * (double)live)
        return FKVF_OK;
    /* the queue's buffer back to the window's rows while the compaction
     * holds its own pieces (best effort: a failed shrink keeps it) */
    size_t keep = a->rows_n ? a->rows_n : 1, bytes;
    if (a->rows_cap > keep && fkvf_mulsz(keep, a->row_bytes, &bytes)) {
        uint8_t *p = fkvf_realloc(a->alloc, a->rows, bytes ? bytes : 1);
        if (p) {
            a->rows = p;
            a->rows_cap = keep;
        }
    }
    return auto_compact(a);
}

static int open_impl(fkvf_appender **out, const char *path, const fkvf_append_options *opts,
                     const fkvf_allocator *alloc, int sections_only);

FKVF_API int fkvf_appender_open(fkvf_appender **out, const char *path,
                                const fkvf_append_options *opts, const fkvf_allocator *alloc)
{
    return open_impl(out, path, opts, alloc, 0);
}

static int open_impl(fkvf_appender **out, const char *path, const fkvf_append_options *opts,
                     const fkvf_allocator *alloc, int sections_only)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!path || !*path)
        return FKVF_E_INVALID_ARG;
    alloc = fkvf_alloc_or_default(alloc);
    fkvf_appender *a = fkvf_calloc(alloc, 1, sizeof *a);
    if (!a)
        return FKVF_E_NOMEM;
    fkvf_handle_init(&a->h, FKVF_HANDLE_APPENDER);
    a->alloc = alloc;
    a->sections_only = sections_only;
    *out = a;
    if (opts)
        a->opts = *opts;
    if (!(a->path = fkvf_strndup(alloc, path, strlen(path)))) {
        fkvf_handle_fail(&a->h, 0);
        return FAIL(FKVF_E_NOMEM, NULL, "no memory");
    }
    a->diag.name = a->path;
    if (a->opts.sync > FKVF_SYNC_NONE) {
        fkvf_handle_fail(&a->h, 0);
        return FAIL(FKVF_E_INVALID_ARG, NULL, "options.sync: %u unknown", a->opts.sync);
    }
    double ratio = a->opts.compact_ratio;
    if (ratio != 0 && !(ratio > 1 && ratio <= 1e6)) {
        fkvf_handle_fail(&a->h, 0);
        return FAIL(FKVF_E_INVALID_ARG, NULL,
                    "options.compact_ratio: %g is not 0 (the default) or in (1, 1e6]", ratio);
    }
    a->ratio = a->opts.no_auto_compact || sections_only ? 0
               : ratio != 0                             ? ratio
                                                        : FKVF_APPEND_COMPACT_RATIO;
    /* one appender per file: an exclusive lock, held while the file is open */
    int fd = -1;
    if (fkvf_append_lock(path, O_RDWR, "appending", &a->diag, &fd) != FKVF_OK) {
        fkvf_handle_fail(&a->h, 0);
        return a->diag.code;
    }
    sweep_leftovers(path);
    fkvf_reader *r = NULL;
    fkvf_resume st;
    memset(&st, 0, sizeof st);
    uint32_t *vtxs = NULL;
    size_t n_vtxs = 0;
    fkvf_codebook_shape cb;
    memset(&cb, 0, sizeof cb);
    int rc = fkvf_reader_open_file(&r, path, 0, alloc);
    if (rc)
        rc = r ? fail_reader(a, rc, r, "") : FAIL(rc, NULL, "%s", fkvf_strerror(rc));
    else
        rc = load_state(a, r, &st, &vtxs, &n_vtxs, &cb);
    fkvf_reader_free(r); /* before the writer may truncate a torn tail */
    if (rc) {
        fkvf_free(alloc, vtxs);
        close(fd);
        fkvf_handle_fail(&a->h, 0);
        return rc;
    }
    a->fd = fd;
    rc = resume_writer(a, &st, fd, vtxs, n_vtxs, &a->w);
    if (rc) {
        fkvf_handle_fail(&a->h, 0);
        return fail_writer(a, rc, "");
    }
    return FKVF_OK;
}

/* What fkvf_appender_create writes as commit 1 of a new archive. */
typedef struct create_plan {
    fkvf_writer_options wo;
    fkvf_codebook_shape shape; /* of the codebook, embedded or referred to */
    uint8_t hash[16];          /* of the codebook referred to */
    fkvf_rvq_metric metric;    /* of the embedded codebook, if it has one */
    int has_cb;
    fkvf_stream_spec is; /* the index streams' codec */
} create_plan;

/* Neither a file nor anything else at path (never replaced). */
static int check_path_free(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) == 0)
        return FKVF_E_EXISTS; /* never replace a file */
    if (errno != ENOENT)
        return FKVF_E_IO; /* cannot tell whether it exists */
    return FKVF_OK;
}

/* The codebook's shape and metric (embedded) or shape and hash (referred
 * to), and the features they need. */
static int plan_codebook(const fkvf_append_create *c, create_plan *pl)
{
    memset(&pl->shape, 0, sizeof pl->shape);
    pl->metric = (fkvf_rvq_metric){NULL, NULL};
    if (c->codebook) {
        uint32_t heads;
        fkvf_rvq_shape(c->codebook, &pl->shape, &heads);
        if (fkvf_rvq_get_metric(c->codebook, &pl->metric)) /* kept with it (spec 13.8) */
            pl->wo.optional_features |= FKVF_OPTFEAT_ENCODER_METRIC;
    } else if (c->codebook_ref) {
        const void *ref_contents = NULL;
        size_t ref_size = 0;
        int rc = fkvf_reader_codebook(c->codebook_ref, &pl->shape, &ref_contents, &ref_size,
                                      pl->hash);
        if (rc)
            return rc;
        pl->wo.required_features |= FKVF_FEAT_EXTERNAL_CODEBOOK;
    }
    if (pl->shape.layer_stages) /* stage counts per layer (spec 3.4) */
        pl->wo.required_features |= FKVF_FEAT_LAYER_STAGES;
    return FKVF_OK;
}

/* The writer's options, the codebook and the codecs: the index codec quad
 * at the codebook's width unless given; the features the codecs need. */
static int plan_create(const fkvf_append_create *c, const fkvf_append_options *opts,
                       create_plan *pl)
{
    fkvf_writer_options_init(&pl->wo);
    pl->wo.no_replace = 1; /* nor one that appears while commit 1 is written */
    pl->wo.sync = opts ? opts->sync : FKVF_SYNC_COMMIT;
    if (opts)
        pl->wo.block_size = opts->block_size;
    int rc = plan_codebook(c, pl);
    if (rc)
        return rc;
    pl->has_cb = c->codebook || c->codebook_ref;
    pl->is = c->index_codec;
    if (pl->has_cb && pl->is.profile == 0) {
        memset(&pl->is, 0, sizeof pl->is);
        pl->is.profile = FKVF_PROFILE_QUAD;
        pl->is.symbol_bits = fkvf_quad_bits_for((uint64_t)pl->shape.k - 1);
    }
    if ((pl->has_cb && pl->is.profile == FKVF_PROFILE_NGON) ||
        c->token_codec.profile == FKVF_PROFILE_NGON)
        pl->wo.required_features |= FKVF_FEAT_NGON;
    if (c->token_codec.profile)
        pl->wo.optional_features |= FKVF_OPTFEAT_TOKEN_STREAM;
    return FKVF_OK;
}

/* The embedded codebook's tables and its metric, or the reference to the
 * codebook file, written to w. */
static int write_codebook(fkvf_writer *w, const fkvf_append_create *c, const create_plan *pl,
                          const fkvf_allocator *alloc)
{
    if (!c->codebook)
        return c->codebook_ref
                   ? fkvf_writer_add_codebook_ref(w, &pl->shape, pl->hash, c->codebook_name)
                   : FKVF_OK;
    size_t tsz = fkvf_rvq_tables_size(c->codebook);
    void *tables = fkvf_malloc(fkvf_alloc_or_default(alloc), tsz ? tsz : 1);
    if (!tables)
        return FKVF_E_NOMEM;
    int rc = fkvf_rvq_tables(c->codebook, tables, tsz);
    if (rc == FKVF_OK)
        rc = fkvf_writer_add_codebooks(w, &pl->shape, tables, tsz, 0);
    if (rc == FKVF_OK && (pl->metric.keys || pl->metric.values))
        rc = fkvf_writer_add_metric(w, &pl->metric, 0);
    fkvf_free(fkvf_alloc_or_default(alloc), tables);
    return rc;
}

/* Commit 1 of the new archive at path: the descriptor, the codebook, empty
 * stream groups, no positions. */
static int write_first_commit(const char *path, const fkvf_append_create *c,
                              const create_plan *pl, const fkvf_allocator *alloc)
{
    fkvf_writer *w = NULL;
    int rc;
    if ((rc = fkvf_writer_create_file(&w, path, &pl->wo, alloc)))
        goto out;
    if ((rc = fkvf_writer_set_desc(w, c->desc)))
        goto out;
    if ((rc = write_codebook(w, c, pl, alloc)))
        goto out;
    /* empty groups record the codecs for every later commit (spec 11.8) */
    if (pl->has_cb && (rc = fkvf_writer_add_index_segment(w, &pl->is, 0, 0, NULL, 0, 0)))
        goto out;
    if (c->token_codec.profile &&
        (rc = fkvf_writer_add_token_segment(w, &c->token_codec, 0, NULL, 0)))
        goto out;
    rc = fkvf_writer_set_positions(w, 0, 0);
    if (rc == FKVF_OK)
        rc = fkvf_writer_finish(w);
out:
    fkvf_writer_free(w);
    return rc;
}

FKVF_API int fkvf_appender_create(fkvf_appender **out, const char *path,
                                  const fkvf_append_create *c, const fkvf_append_options *opts,
                                  const fkvf_allocator *alloc)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!path || !*path || !c || !c->desc || (c->codebook && c->codebook_ref))
        return FKVF_E_INVALID_ARG;
    int rc = check_path_free(path);
    if (rc)
        return rc;
    create_plan pl;
    if ((rc = plan_create(c, opts, &pl)))
        return rc;
    if ((rc = write_first_commit(path, c, &pl, alloc)))
        return rc;
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    if (opts)
        o = *opts;
    if (c->codebook_ref)
        o.codebook_file = c->codebook_ref;
    rc = fkvf_appender_open(out, path, &o, alloc);
    if (rc)
        (void)unlink(path); /* the empty archive just made: a retry may create it again */
    return rc;
}

/* ---- the queue and the open commit (fkvf.h fkvf_appender_append) ---------- */

/* codes of one index segment a spill writes at most (as fkvf pack) */
#define APPEND_SEGMENT_BYTES ((size_t)32 << 20)
/* rows of one EXAC section a spill writes at most */
#define APPEND_EXACT_BYTES ((size_t)16 << 20)

/* Rows the queue takes beyond those the appender keeps anyway (the recent
 * window): queue_bytes of rows, at least one alignment unit of the index
 * streams, so that a spill always makes room: the buffer is full at W + Q
 * rows from b0 = S + Aw, so the positions that leave the window reach Aw +
 * Q >= Aw + iu, and a spill leaves fewer than W + iu rows. */
static uint64_t queue_rows(const fkvf_appender *a)
{
    size_t qb = a->queue_bytes ? a->queue_bytes : FKVF_APPEND_QUEUE_DEFAULT;
    uint64_t n = a->row_bytes ? qb / a->row_bytes : qb;
    return n < a->iu ? a->iu : n;
}

/* Rows the buffer holds at most before a spill: the window's (with a
 * codebook: they may leave it later and are encoded then) and the queue's. */
static uint64_t queue_limit(const fkvf_appender *a)
{
    uint64_t lim;
    return fkvf_add64(a->q ? a->W : 0, queue_rows(a), &lim) ? lim : UINT64_MAX;
}

/* Room for `extra` more rows in the window buffer. */
static int rows_reserve(fkvf_appender *a, size_t extra)
{
    size_t need;
    if (!fkvf_addsz(a->rows_n, extra, &need))
        return FAIL(FKVF_E_LIMIT, NULL, "too many queued positions");
    if (need <= a->rows_cap)
        return FKVF_OK;
    size_t cap = a->rows_cap ? a->rows_cap : 16;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint64_t lim = queue_limit(a); /* the buffer never grows past it */
    if (cap > lim && need <= lim)
        cap = (size_t)lim;
    size_t bytes;
    if (!fkvf_mulsz(cap, a->row_bytes, &bytes))
        return FAIL(FKVF_E_LIMIT, NULL, "too many queued positions");
    uint8_t *p = fkvf_realloc(a->alloc, a->rows, bytes ? bytes : 1);
    if (!p)
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for %zu queued rows", need);
    a->rows = p;
    a->rows_cap = cap;
    return FKVF_OK;
}

/* The open commit fails after its first byte may have been written: the
 * file is cut back to the previous commit, so that it opens clean, and the
 * handle fails (reopen to continue). rc and the message are a's already. */
static int abandon(fkvf_appender *a, int rc)
{
    (void)fkvf_writer_rollback(a->w);
    a->spilled = 0;
    fkvf_handle_fail(&a->h, 0);
    return rc;
}

static int commit_fail(fkvf_appender *a, int rc, const char *what)
{
    char pre[64];
    snprintf(pre, sizeof pre, "%s: ", what);
    fail_writer(a, rc, pre);
    /* the commit is incomplete, whatever the error: sections already
     * written (and recorded in the writer's directory and stream lengths)
     * cannot be taken back in the writer, so cut them off the file so that
     * it opens clean, and fail the handle (reopen to continue) */
    return abandon(a, rc);
}

/* Exact rows of positions [p0, p1) (all in the buffer) as one EXAC section. */
static int put_exact(fkvf_appender *a, uint64_t p0, uint64_t p1)
{
    if (p1 <= p0)
        return FKVF_OK;
    const uint8_t *src = a->rows + (size_t)(p0 - a->b0) * a->row_bytes;
    return fkvf_writer_add_exact(a->w, p0, p1 - p0, src, (size_t)(p1 - p0) * a->row_bytes, 0);
}

/* The archived positions [Aw, upto) (stream symbols; their rows are in the
 * buffer) encoded and written as one index segment from the unit boundary
 * f = Aw / iu * iu: the codes of [f, Aw) (itail) again, then theirs (spec
 * 11.6). *codes_out: the segment's codes, for the caller to free. On a
 * failure the open commit is abandoned once it has bytes in the file; a
 * failed encoding of a commit that wrote nothing leaves the handle usable. */
static int put_index(fkvf_appender *a, uint64_t upto, uint16_t **codes_out)
{
    *codes_out = NULL;
    const uint64_t S = a->S, f = a->Aw / a->iu * a->iu;
    size_t cnt = (size_t)(upto - f), ncodes, bytes;
    uint16_t *codes = NULL;
    if (!fkvf_mulsz(cnt, a->cpp, &ncodes) || !fkvf_mulsz(ncodes, sizeof *codes, &bytes) ||
        !(codes = fkvf_malloc(a->alloc, bytes ? bytes : 1))) {
        int rc = FAIL(FKVF_E_NOMEM, NULL, "no memory for %zu codes", ncodes);
        return a->spilled ? abandon(a, rc) : rc;
    }
    if (a->itail_n)
        memcpy(codes, a->itail, a->itail_n * a->cpp * sizeof *codes);
    fkvf_rows rr;
    rr.data = a->rows + (size_t)(S + a->Aw - a->b0) * a->row_bytes;
    rr.n_rows = (size_t)(upto - a->Aw);
    rr.dtype = a->desc.dtype;
    rr.first_position = S + a->Aw;
    fkvf_rvq_set_threads(a->q, a->opts.n_threads);
    int rc = fkvf_rvq_encode(a->q, &rr, a->pre_rope ? &a->rope : NULL, a->opts.beam_width,
                             codes + a->itail_n * a->cpp, a->cpp, 1);
    if (rc) {
        fkvf_free(a->alloc, codes);
        FAIL(rc, "13.6", "encoding positions %llu..%llu failed",
             (unsigned long long)(S + a->Aw), (unsigned long long)(S + upto - 1));
        return a->spilled ? abandon(a, rc) : rc;
    }
    a->spilled = 1; /* from the first byte the writer may write */
    rc = fkvf_writer_add_index_segment(a->w, &a->ispec, f, cnt, codes, a->cpp, 1);
    if (rc) {
        fkvf_free(a->alloc, codes);
        return commit_fail(a, rc, "index streams");
    }
    *codes_out = codes;
    return FKVF_OK;
}

/* Archived positions in one index segment a spill writes: as many as
 * APPEND_SEGMENT_BYTES of codes hold, a multiple of the alignment unit. */
static uint64_t segment_rows(const fkvf_appender *a)
{
    uint64_t per = (uint64_t)(a->cpp ? a->cpp : 1) * sizeof(uint16_t);
    uint64_t n = APPEND_SEGMENT_BYTES / per / a->iu * a->iu;
    return n < a->iu ? a->iu : n;
}

/* Exact rows [p0, p1) in EXAC sections of at most APPEND_EXACT_BYTES. */
static int spill_exact(fkvf_appender *a, uint64_t p0, uint64_t p1)
{
    uint64_t most = a->row_bytes ? APPEND_EXACT_BYTES / a->row_bytes : 1;
    if (most == 0)
        most = 1;
    a->spilled = 1;
    for (uint64_t p = p0; p < p1; p += most) {
        int rc = put_exact(a, p, p1 - p < most ? p1 : p + most);
        if (rc)
            return commit_fail(a, rc, "exact rows");
    }
    a->xw = p1;
    return FKVF_OK;
}

/* Write what is decided of the open commit past the committed end, then
 * drop the rows no longer needed: the exact rows of new sinks (without a
 * codebook, of every queued position), and the indices of the positions
 * that leave the window whatever is appended next (at least W before the
 * queue's end), up to a unit boundary, in segments of segment_rows. The
 * commit writes the rest. Where it cuts depends only on the positions
 * queued, the queue's size and the archive's shape. */
static int spill(fkvf_appender *a)
{
    const uint64_t N = a->n + a->pending, S = a->S;
    int rc;
    uint64_t x1 = a->q && N > S ? S : N;
    if (x1 > a->xw && (rc = spill_exact(a, a->xw, x1)))
        return rc;
    if (a->q && N > S + a->W) {
        const uint64_t top = (N - S - a->W) / a->iu * a->iu, seg = segment_rows(a);
        while (a->Aw < top) {
            uint64_t f = a->Aw / a->iu * a->iu, e = top - f > seg ? f + seg : top;
            uint16_t *codes;
            if ((rc = put_index(a, e, &codes)))
                return rc;
            fkvf_free(a->alloc, codes);
            a->Aw = e;
            a->itail_n = 0; /* e is a unit boundary */
        }
    }
    uint64_t b1 = !a->q || N <= S ? N : S + a->Aw;
    size_t drop = (size_t)(b1 - a->b0);
    a->rows_n -= drop;
    if (a->rows_n && drop)
        memmove(a->rows, a->rows + drop * a->row_bytes, a->rows_n * a->row_bytes);
    a->b0 = b1;
    return FKVF_OK;
}

FKVF_API int fkvf_appender_set_queue_bytes(fkvf_appender *a, size_t bytes)
{
    int rc = a_enter(a);
    if (rc)
        return rc;
    a->queue_bytes = bytes;
    return FKVF_OK;
}

/* The rows and token ids [done, done + m) of an append call into the queue
 * (room reserved). */
static void enqueue(fkvf_appender *a, const uint8_t *rows, const uint32_t *tokens, size_t m)
{
    if (m)
        memcpy(a->rows + a->rows_n * a->row_bytes, rows, m * a->row_bytes);
    a->rows_n += m;
    if (tokens && m) {
        memcpy(a->tok + a->tok_n, tokens, m * sizeof *tokens);
        a->tok_n += m;
    }
    a->pending += m;
}

/* The arguments of fkvf_appender_append: FKVF_OK, or the error recorded. */
static int check_append(fkvf_appender *a, const void *rows, size_t size, size_t n_rows,
                        const uint32_t *tokens)
{
    if ((!rows && n_rows) || (tokens && !a->has_tokens))
        return FAIL(FKVF_E_INVALID_ARG, NULL, "%s",
                    tokens ? "the archive has no token stream; create it with a token codec"
                           : "rows is NULL");
    if (a->has_tokens && !tokens && n_rows)
        return FAIL(FKVF_E_INVALID_ARG, "11.8",
                    "the archive has a token stream: give the token ids of the new positions");
    size_t want;
    if (!fkvf_mulsz(n_rows, a->row_bytes, &want) || want != size)
        return FAIL(FKVF_E_INVALID_ARG, "14.2", "%zu rows of %zu bytes, got %zu bytes", n_rows,
                    a->row_bytes, size);
    /* token ids the token codec cannot store (spec 11.8) would fail the
     * commit after other sections were written */
    for (size_t i = 0; tokens && i < n_rows; i++) {
        int ok = a->tspec.profile == FKVF_PROFILE_QUAD
                     ? a->tspec.symbol_bits >= 32 || tokens[i] >> a->tspec.symbol_bits == 0
                     : tokens[i] < a->tspec.alphabet;
        if (!ok)
            return FAIL(FKVF_E_INVALID_ARG, "11.8",
                        "token id %u (row %zu) does not fit the token stream's codec", tokens[i],
                        i);
    }
    uint64_t total;
    if (!fkvf_add64(a->n + a->pending, n_rows, &total) || total > (UINT64_C(1) << 48))
        return FAIL(FKVF_E_LIMIT, "15", "too many positions");
    return FKVF_OK;
}

FKVF_API int fkvf_appender_append(fkvf_appender *a, const void *rows, size_t size, size_t n_rows,
                                  const uint32_t *tokens)
{
    int rc = a_enter(a);
    if (rc)
        return rc;
    if ((rc = check_append(a, rows, size, n_rows, tokens)))
        return rc;
    if (tokens && (rc = tok_reserve(a, n_rows)))
        return rc;
    /* a piece at a time: the buffer fills up to its limit, then what is
     * decided is written (spill) */
    const uint8_t *src = rows;
    const uint64_t lim = queue_limit(a);
    size_t done = 0;
    while (done < n_rows) {
        /* a failed spill fails the handle even when it wrote nothing: rows
         * of this call (or of earlier ones) are queued, half an append */
        if (a->rows_n >= lim && (rc = spill(a)))
            return abandon(a, rc);
        uint64_t room = lim > a->rows_n ? lim - a->rows_n : 0;
        if (room == 0) /* a spill always makes room (queue_rows): never */
            return abandon(a, FAIL(FKVF_E_STATE, NULL, "the queue cannot be written"));
        size_t m = n_rows - done < room ? n_rows - done : (size_t)room;
        if ((rc = rows_reserve(a, m))) /* queued rows of this call stay: the handle fails */
            return done ? abandon(a, rc) : rc;
        enqueue(a, src + done * a->row_bytes, tokens ? tokens + done : NULL, m);
        done += m;
    }
    if (a->rows_n >= lim && (rc = spill(a)))
        return abandon(a, rc);
    return FKVF_OK;
}

FKVF_API int fkvf_appender_commit(fkvf_appender *a)
{
    int rc = a_enter(a);
    if (rc)
        return rc;
    if (!a->pending)
        return FKVF_OK;
    const uint64_t N = a->n + a->pending, S = a->S;
    uint64_t A2 = a->A;
    if (a->q && N > S + a->W && N - S - a->W > A2)
        A2 = N - S - a->W;
    uint16_t *codes = NULL;
    /* 1. quantize positions that leave the window and were not spilled:
     *    [S + Aw, S + A2) */
    if (A2 > a->Aw && (rc = put_index(a, A2, &codes)))
        return rc;
    /* 2. exact rows of the new positions that stay exact and were not
     *    spilled: sinks, then the recent window */
    uint64_t s_end = N < S ? N : S, r_start = S + A2 > a->xw ? S + A2 : a->xw;
    if ((a->xw < s_end && (rc = put_exact(a, a->xw, s_end))) ||
        (r_start < N && (rc = put_exact(a, r_start, N)))) {
        fkvf_free(a->alloc, codes);
        return commit_fail(a, rc, "exact rows");
    }
    /* 3. token ids */
    if (a->has_tokens) {
        uint64_t f = a->n / a->tu * a->tu;
        rc = fkvf_writer_add_token_segment(a->w, &a->tspec, f, a->tok, a->tok_n);
        if (rc) {
            fkvf_free(a->alloc, codes);
            return commit_fail(a, rc, "token stream");
        }
    }
    /* room for the partial unit the next commit starts from, made before
     * the trailer: once it is written nothing may fail (a failed commit
     * leaves the previous one; it was a durable commit reported as
     * FKVF_E_NOMEM) */
    const uint64_t f2 = A2 / a->iu * a->iu;
    const size_t keep = codes ? (size_t)(A2 - f2) : 0; /* codes: the index segment's */
    if (keep > a->itail_cap) {
        uint16_t *t = fkvf_realloc(a->alloc, a->itail, keep * a->cpp * sizeof *t);
        if (!t) {
            fkvf_free(a->alloc, codes);
            return abandon(a, FAIL(FKVF_E_NOMEM, NULL, "no memory for the codes of %zu "
                                   "positions", keep));
        }
        a->itail = t;
        a->itail_cap = keep;
    }
    /* 4. directory and trailer */
    if ((rc = fkvf_writer_set_positions(a->w, N, A2)) || (rc = fkvf_writer_commit(a->w))) {
        fkvf_free(a->alloc, codes);
        return commit_fail(a, rc, "commit");
    }
    a->spilled = 0;
    /* committed: slide the state */
    if (codes) {
        uint64_t f = a->Aw / a->iu * a->iu;
        if (keep)
            memcpy(a->itail, codes + (size_t)(f2 - f) * a->cpp, keep * a->cpp * sizeof *codes);
        a->itail_n = keep;
    }
    fkvf_free(a->alloc, codes);
    uint64_t b1 = !a->q || N < S ? N : S + A2;
    size_t drop = (size_t)(b1 - a->b0);
    a->rows_n -= drop;
    if (a->rows_n)
        memmove(a->rows, a->rows + drop * a->row_bytes, a->rows_n * a->row_bytes);
    a->b0 = b1;
    if (a->has_tokens) {
        uint64_t t0 = a->n / a->tu * a->tu, t1 = N / a->tu * a->tu;
        size_t d = (size_t)(t1 - t0);
        a->tok_n -= d;
        if (a->tok_n)
            memmove(a->tok, a->tok + d, a->tok_n * sizeof *a->tok);
    }
    a->n = N;
    a->A = a->Aw = A2;
    a->xw = N;
    a->pending = 0;
    a->seq++;
    return maybe_compact(a);
}

FKVF_API int fkvf_appender_sync(fkvf_appender *a)
{
    int rc = a_enter(a);
    if (rc)
        return rc;
    if ((rc = fkvf_writer_sync_now(a->w))) {
        /* a failed fdatasync may have dropped the pages it could not write
         * (Linux reports the error once, then marks them clean): a later
         * sync must not report the commits durable */
        fkvf_handle_fail(&a->h, 0);
        size_t n;
        const char *m = fkvf_quote_body(fkvf_writer_message(a->w), a->path, rc, &n);
        return FAIL(rc, "7.6", "%.*s (the commits since the last successful sync may not be "
                               "durable; reopen to continue)",
                    (int)n, m);
    }
    return FKVF_OK;
}

/* ---- extra sections (append_impl.h) --------------------------------------- */

int fkvf_appender_open_sections(fkvf_appender **out, const char *path, unsigned sync)
{
    fkvf_append_options o;
    fkvf_append_options_init(&o);
    o.sync = sync;
    return open_impl(out, path, &o, NULL, 1);
}

int fkvf_appender_commit_sections(fkvf_appender *a, const fkvf_section_add *secs, size_t n)
{
    int rc = a_enter(a);
    if (rc)
        return rc;
    if (a->pending)
        return FAIL(FKVF_E_STATE, NULL, "positions are queued: commit them first");
    /* an encoder metric is checked against its codebook as it is written
     * (fkvf_writer_add_metric); raw bytes here would not be (spec 13.8) */
    for (size_t i = 0; i < n; i++)
        if (secs[i].type == FKVF_SECTION_CMET)
            return FAIL(FKVF_E_INVALID_ARG, "13.8",
                        "a CMET section (the encoder metric) is written with its codebook "
                        "(fkvf train --key-metric / --value-metric, fkvf_writer_add_metric), "
                        "not appended as raw bytes");
    for (size_t i = 0; i < n; i++)
        if ((rc = fkvf_writer_add_section(a->w, secs[i].type, secs[i].flags, secs[i].key,
                                          secs[i].data, secs[i].size)))
            return commit_fail(a, rc, "section");
    if ((rc = fkvf_writer_set_positions(a->w, a->n, a->A)) || (rc = fkvf_writer_commit(a->w)))
        return commit_fail(a, rc, "commit");
    a->seq++;
    return FKVF_OK;
}
