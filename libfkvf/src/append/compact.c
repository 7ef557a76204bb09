/* fkvf_archive_compact (fkvf.h, whole-archive operations): an archive of any number of
 * commits rewritten as one commit without re-encoding anything (spec 7.4):
 * descriptor, codebook (embedded copy or the same external reference),
 * metadata, the rows of the exact positions of the last commit (spec 14.3),
 * the index streams symbol for symbol with their codec, the token stream,
 * and a new search index for every stream that had one (spec 20.4). It
 * reads through the public reader API and writes with the public writer;
 * in place, it holds the appender's lock (append_impl.h) until the new
 * file is renamed over the old one. */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "alloc.h"
#include "ckd.h"
#include "error.h"
#include "fkvf.h"
#include "parallel.h"
#include "append_impl.h"
#include "archive_op.h"

FKVF_API void fkvf_compact_options_init(fkvf_compact_options *opts)
{
    if (opts)
        memset(opts, 0, sizeof *opts);
}

/* ---- errors (on the fkvf_archive_op handle, archive_op.h) ------------------ */

#define FAIL(file, code, ...) fkvf_archive_op_fail(c, file, code, __VA_ARGS__)

static int fail_reader(fkvf_archive_op *c, int rc, const fkvf_reader *r, const char *prefix)
{
    return fkvf_archive_op_fail_reader(c, rc, r, prefix);
}

static int fail_writer(fkvf_archive_op *c, int rc, const fkvf_writer *w, const char *stage)
{
    char pre[64];
    snprintf(pre, sizeof pre, "writing the %s failed: ", stage);
    fkvf_error_info e;
    int have = rc != FKVF_E_NOMEM && w && fkvf_writer_error(w, &e) == FKVF_OK;
    return fkvf_archive_op_fail_from(c, rc, have ? &e : NULL, c->path, pre);
}

/* ---- the copy ------------------------------------------------------------- */

/* What one compaction works with. */
typedef struct job {
    fkvf_archive_op *c;
    const fkvf_compact_options *opt;
    fkvf_reader *r;
    fkvf_writer *w;
    fkvf_archive_info ai;
    fkvf_desc d;
    fkvf_codebook_shape shape;
    int has_cb;
    unsigned exac_flags, cbk_flags;
    fkvf_compact_result *res;
    const fkvf_sink *sink;                /* the appender's compaction: write here */
    const fkvf_codebook_shape *ext_shape; /* and the shape of its external codebook */
} job;

/* The index stream of code j in the code order (spec 11.2). */
static uint64_t index_stream_id(const fkvf_desc *d, const fkvf_codebook_shape *s, size_t j)
{
    return fkvf_index_stream_id_shape(s, d->n_kv_heads, j);
}

/* Metadata, entry by entry, with its type. */
static int copy_meta(job *j)
{
    fkvf_archive_op *c = j->c;
    size_t n = 0;
    int rc = fkvf_reader_meta_count(j->r, &n);
    if (rc != FKVF_OK)
        return fail_reader(c, rc, j->r, "");
    for (size_t i = 0; i < n; i++) {
        fkvf_meta_entry e;
        if ((rc = fkvf_reader_meta(j->r, i, &e)) != FKVF_OK)
            return fail_reader(c, rc, j->r, "");
        char *key = fkvf_strndup(c->alloc, e.key, e.key_len);
        char *val = fkvf_strndup(c->alloc, e.value, e.value_len);
        if (!key || !val) {
            rc = FKVF_E_NOMEM;
        } else {
            switch (e.type) {
            case FKVF_META_U64:
                rc = fkvf_writer_meta_u64(j->w, key, e.u64);
                break;
            case FKVF_META_I64:
                rc = fkvf_writer_meta_i64(j->w, key, e.i64);
                break;
            case FKVF_META_F64:
                rc = fkvf_writer_meta_f64(j->w, key, e.f64);
                break;
            case FKVF_META_BOOL:
                rc = fkvf_writer_meta_bool(j->w, key, e.u64 != 0);
                break;
            case FKVF_META_UTF8:
                if (memchr(e.value, 0, e.value_len))
                    rc = fkvf_writer_meta_bytes(j->w, key, e.value, e.value_len);
                else
                    rc = fkvf_writer_meta_utf8(j->w, key, val);
                break;
            default:
                rc = fkvf_writer_meta_bytes(j->w, key, e.value, e.value_len);
            }
        }
        fkvf_free(c->alloc, key);
        fkvf_free(c->alloc, val);
        if (rc != FKVF_OK)
            return fail_writer(c, rc, j->w, "metadata");
    }
    return FKVF_OK;
}

/* Memory the copy holds at once, whatever the archive's size: exact rows
 * are copied in sections of at most COMPACT_CHUNK_BYTES (one row when a row
 * is larger), index streams in segments of at most COMPACT_SEGMENT_BYTES of
 * codes (a multiple of the codec's alignment, spec 11.6); between chunks
 * the source's mapped pages are let go (fkvf_reader_trim). An archive
 * smaller than that is copied as one section and one segment, as before. */
#define COMPACT_CHUNK_BYTES ((size_t)8 << 20)
#define COMPACT_SEGMENT_BYTES ((size_t)32 << 20)

/* Exact rows [a0, a1) copied in sections of at most `per` rows (rows: room
 * for them). */
static int copy_exact_range(job *j, uint64_t a0, uint64_t a1, size_t rb, size_t per,
                            uint8_t *rows)
{
    fkvf_archive_op *c = j->c;
    int rc;
    for (uint64_t b0 = a0; b0 < a1; b0 += per) {
        uint64_t n = a1 - b0 < per ? a1 - b0 : per;
        for (uint64_t p = b0; p < b0 + n; p++) {
            const void *row;
            size_t got;
            if ((rc = fkvf_reader_exact_row(j->r, p, &row, &got)) != FKVF_OK || got != rb) {
                char pre[64];
                snprintf(pre, sizeof pre, "exact row of position %" PRIu64 ": ", p);
                if (rc)
                    return fail_reader(c, rc, j->r, pre);
                return FAIL(c->src, FKVF_E_CORRUPT, "%sunexpected size", pre);
            }
            memcpy(rows + (size_t)(p - b0) * rb, row, rb);
        }
        rc = fkvf_writer_add_exact(j->w, b0, n, rows, (size_t)n * rb, j->exac_flags);
        if (rc != FKVF_OK)
            return fail_writer(c, rc, j->w, "exact rows");
        (void)fkvf_reader_trim(j->r);
        j->res->exact += n;
    }
    return FKVF_OK;
}

/* The exact rows: sinks [0, min(S, P)) and the window [S + A, P); all of
 * them when nothing is archived. */
static int copy_exact(job *j)
{
    fkvf_archive_op *c = j->c;
    uint64_t P = j->ai.n_positions, A = j->ai.n_archived, S = j->d.n_sinks;
    uint64_t s_end = A ? (S < P ? S : P) : P;
    uint64_t ranges[2][2] = {{0, s_end}, {A ? S + A : P, P}};
    size_t rb = 0;
    int rc = fkvf_reader_row_bytes(j->r, j->d.dtype, &rb);
    if (rc != FKVF_OK)
        return fail_reader(c, rc, j->r, "");
    uint64_t most = 0; /* rows of the longer range */
    for (int k = 0; k < 2; k++)
        if (ranges[k][1] > ranges[k][0] && ranges[k][1] - ranges[k][0] > most)
            most = ranges[k][1] - ranges[k][0];
    size_t per = rb && COMPACT_CHUNK_BYTES / rb ? COMPACT_CHUNK_BYTES / rb : 1;
    if (most < per)
        per = (size_t)most; /* most fits: below per */
    if (per == 0)
        return FKVF_OK;
    size_t bytes;
    if (!fkvf_mulsz(per, rb, &bytes))
        return FAIL(c->src, FKVF_E_LIMIT, "exact rows of %zu bytes do not fit in memory", rb);
    uint8_t *rows = fkvf_malloc(c->alloc, bytes ? bytes : 1);
    if (!rows)
        return fail_writer(c, FKVF_E_NOMEM, NULL, "exact rows");
    for (int k = 0; k < 2 && rc == FKVF_OK; k++)
        if (ranges[k][1] > ranges[k][0])
            rc = copy_exact_range(j, ranges[k][0], ranges[k][1], rb, per, rows);
    fkvf_free(c->alloc, rows);
    return rc;
}

/* The codebook: the same external reference, or the embedded tables. */
static int copy_codebook(job *j)
{
    fkvf_archive_op *c = j->c;
    const void *contents;
    size_t size;
    int ext = 0;
    uint8_t hash[16];
    const char *name = NULL;
    int rc = fkvf_reader_codebook(j->r, &j->shape, &contents, &size, NULL);
    if (rc == FKVF_E_NOT_FOUND)
        return FKVF_OK;
    if (rc == FKVF_E_CODEBOOK && j->ext_shape) {
        /* an appender's external codebook, not attached to this reader: the
         * reference is copied with the shape the appender read at open */
        j->shape = *j->ext_shape;
        rc = FKVF_OK;
        contents = NULL;
        size = 0;
    }
    if (rc != FKVF_OK)
        return fail_reader(c, rc, j->r, "");
    if ((rc = fkvf_reader_codebook_ref(j->r, &ext, hash, &name)) != FKVF_OK)
        return fail_reader(c, rc, j->r, "");
    j->has_cb = 1;
    if (ext)
        rc = fkvf_writer_add_codebook_ref(j->w, &j->shape, hash, name);
    else
        rc = fkvf_writer_add_codebooks(
            j->w, &j->shape, (const uint8_t *)contents + fkvf_codebook_tables_offset(&j->shape),
            size - (size_t)fkvf_codebook_tables_offset(&j->shape), j->cbk_flags);
    if (rc != FKVF_OK)
        return fail_writer(c, rc, j->w, "codebook");
    if (ext)
        return FKVF_OK; /* the codebook file keeps its own metric */
    /* the encoder metric goes with its CBK1 (spec 13.8), whose contents and
     * so content hash do not change */
    fkvf_rvq_metric mm;
    rc = fkvf_reader_metric(j->r, &mm);
    if (rc == FKVF_E_NOT_FOUND)
        return FKVF_OK;
    if (rc != FKVF_OK)
        return fail_reader(c, rc, j->r, "");
    /* deflated as it was (an invalid CMET stops the copy above: the input
     * fails full verification, fkvf verify says why) */
    unsigned mflags = 0;
    for (size_t i = 0; i < j->ai.n_sections; i++) {
        fkvf_section_info si;
        if (fkvf_reader_section(j->r, i, &si) == FKVF_OK && si.type == FKVF_SECTION_CMET)
            mflags = si.flags & FKVF_SECTION_DEFLATE;
    }
    rc = fkvf_writer_add_metric(j->w, &mm, mflags);
    return rc != FKVF_OK ? fail_writer(c, rc, j->w, "encoder metric") : FKVF_OK;
}

/* Archived positions in one index segment of the copy: as many as
 * COMPACT_SEGMENT_BYTES of codes hold, a multiple of the codec's alignment,
 * at most A (at least one alignment unit). */
static size_t compact_segment_rows(const fkvf_stream_spec *isp, size_t cpp, size_t na)
{
    size_t align = fkvf_stream_spec_align(isp);
    size_t n = COMPACT_SEGMENT_BYTES / (cpp ? cpp * sizeof(uint16_t) : 1);
    if (align == 0)
        align = 1;
    n -= n % align;
    if (n < align)
        n = align;
    return n < na ? n : na;
}

/* Each index stream k of cpp: it exists, has its name, holds >= A symbols. */
static int check_index_streams(job *j, size_t cpp, uint64_t A)
{
    fkvf_archive_op *c = j->c;
    for (size_t k = 0; k < cpp; k++) {
        uint64_t id = index_stream_id(&j->d, &j->shape, k);
        fkvf_stream_info si;
        if (fkvf_reader_stream_info(j->r, k, &si) != FKVF_OK ||
            (si.id != id && si.id != FKVF_STREAM_ID_UNNAMED) || si.length < A)
            return FAIL(c->src, FKVF_E_CORRUPT,
                        "index stream %016" PRIx64 " missing or shorter than the %" PRIu64
                        " archived positions", id, A);
    }
    return FKVF_OK;
}

/* Symbols [t0, t0 + m) of the cpp index streams into codes (stream k's at
 * k * m), then written as one segment. */
static int copy_index_segment(job *j, const fkvf_stream_spec *isp, size_t cpp, size_t t0,
                              size_t m, uint16_t *codes, uint32_t *sym)
{
    fkvf_archive_op *c = j->c;
    int rc;
    for (size_t k = 0; k < cpp; k++) {
        if ((rc = fkvf_reader_stream_read(j->r, k, t0, sym, m)) != FKVF_OK)
            return fail_reader(c, rc, j->r, "");
        for (size_t t = 0; t < m; t++)
            codes[k * m + t] = (uint16_t)sym[t];
    }
    rc = fkvf_writer_add_index_segment(j->w, isp, t0, m, codes, 1, m);
    (void)fkvf_reader_trim(j->r);
    return rc != FKVF_OK ? fail_writer(c, rc, j->w, "index streams") : FKVF_OK;
}

/* The index streams, symbol for symbol, with their codec, in segments of
 * compact_segment_rows positions (one when they fit). */
static int copy_index(job *j)
{
    fkvf_archive_op *c = j->c;
    fkvf_stream_spec isp; /* the codec the copy keeps */
    /* the index streams are streams 0 .. cpp-1 in code order (spec 11.2),
     * before the token stream: by index, as their names may need an
     * external codebook's layer table that this reader has not */
    size_t n_all = j->has_cb ? fkvf_append_index_streams(j->r) : 0;
    if (!n_all || fkvf_reader_stream_spec(j->r, 0, &isp) != FKVF_OK)
        return FKVF_OK;
    uint64_t A = j->ai.n_archived;
    size_t cpp = (size_t)fkvf_index_stream_count(&j->shape, j->d.n_kv_heads), na, seg;
    size_t n_codes, cbytes, sbytes;
    if (cpp != n_all)
        return FAIL(c->src, FKVF_E_CORRUPT, "%zu index streams, the codebook makes %zu", n_all,
                    cpp);
    int rc = check_index_streams(j, cpp, A);
    if (rc)
        return rc;
    if (!fkvf_tosz(A, &na) || !(seg = compact_segment_rows(&isp, cpp, na), 1) ||
        !fkvf_mulsz(cpp, seg, &n_codes) || !fkvf_mulsz(n_codes, sizeof(uint16_t), &cbytes) ||
        !fkvf_mulsz(seg, sizeof(uint32_t), &sbytes))
        return FAIL(c->src, FKVF_E_LIMIT, "the index streams of %" PRIu64 " archived positions "
                    "do not fit in memory", A);
    if (na == 0) /* streams of no symbols: one empty segment, as before */
        rc = fkvf_writer_add_index_segment(j->w, &isp, 0, 0, NULL, 1, 1);
    if (na == 0)
        return rc != FKVF_OK ? fail_writer(c, rc, j->w, "index streams") : FKVF_OK;
    uint16_t *codes = fkvf_malloc(c->alloc, cbytes + 1);
    uint32_t *sym = fkvf_malloc(c->alloc, sbytes + 1);
    if (!codes || !sym)
        rc = fail_writer(c, FKVF_E_NOMEM, NULL, "index streams");
    for (size_t t0 = 0; rc == FKVF_OK && t0 < na; t0 += seg) {
        size_t m = na - t0 < seg ? na - t0 : seg;
        rc = copy_index_segment(j, &isp, cpp, t0, m, codes, sym);
        if (rc == FKVF_OK && j->opt->progress)
            j->opt->progress(j->opt->progress_opaque, t0 + m, na);
    }
    fkvf_free(c->alloc, codes);
    fkvf_free(c->alloc, sym);
    return rc;
}

/* The token stream, with its codec. */
static int copy_tokens(job *j)
{
    fkvf_archive_op *c = j->c;
    size_t ti, n, bytes;
    fkvf_stream_info si;
    fkvf_stream_spec sp;
    if (fkvf_reader_stream_find(j->r, FKVF_STREAM_ID_TOKENS, &ti) != FKVF_OK ||
        fkvf_reader_stream_info(j->r, ti, &si) != FKVF_OK)
        return FKVF_OK;
    if (!fkvf_tosz(si.length, &n) || !fkvf_mulsz(n, sizeof(uint32_t), &bytes))
        return FAIL(c->src, FKVF_E_LIMIT, "a token stream of %" PRIu64 " symbols does not fit "
                    "in memory", si.length);
    uint32_t *sym = fkvf_malloc(c->alloc, bytes + 1);
    if (!sym)
        return fail_writer(c, FKVF_E_NOMEM, NULL, "token stream");
    int rc = n ? fkvf_reader_stream_read(j->r, ti, 0, sym, n) : FKVF_OK;
    if (rc == FKVF_OK)
        rc = fkvf_reader_stream_spec(j->r, ti, &sp);
    if (rc != FKVF_OK) {
        fail_reader(c, rc, j->r, "");
    } else {
        rc = fkvf_writer_add_token_segment(j->w, &sp, 0, n ? sym : NULL, n);
        if (rc != FKVF_OK)
            fail_writer(c, rc, j->w, "token stream");
    }
    fkvf_free(c->alloc, sym);
    return rc;
}

/* An index stream's id and its stream index (the ids of streams the
 * reader cannot name, sorted for lookup). */
typedef struct id_stream {
    uint64_t id;
    size_t k;
} id_stream;

static int cmp_id_stream(const void *a, const void *b)
{
    uint64_t x = ((const id_stream *)a)->id, y = ((const id_stream *)b)->id;
    return x < y ? -1 : x > y;
}

/* The names of the index streams the reader cannot name (an appender's
 * external codebook with a layer table, not attached: spec 11.2), from the
 * codebook's shape, which names streams 0 .. cpp-1 in code order: *out
 * sorted by id (NULL, *n 0 when there are none). */
static int unnamed_ids(job *j, id_stream **out, size_t *n)
{
    fkvf_archive_op *c = j->c;
    *out = NULL;
    *n = 0;
    uint64_t cpp = j->has_cb ? fkvf_index_stream_count(&j->shape, j->d.n_kv_heads) : 0;
    if (cpp > j->ai.n_streams)
        cpp = j->ai.n_streams;
    id_stream *t = cpp ? fkvf_calloc(c->alloc, (size_t)cpp, sizeof *t) : NULL;
    if (cpp && !t)
        return fail_writer(c, FKVF_E_NOMEM, NULL, "search index");
    size_t m = 0;
    for (size_t k = 0; k < (size_t)cpp; k++) {
        fkvf_stream_info si;
        if (fkvf_reader_stream_info(j->r, k, &si) == FKVF_OK && si.id == FKVF_STREAM_ID_UNNAMED)
            t[m++] = (id_stream){index_stream_id(&j->d, &j->shape, k), k};
    }
    if (m)
        qsort(t, m, sizeof *t, cmp_id_stream);
    *out = t;
    *n = m;
    return FKVF_OK;
}

/* The most bytes of rebuilt search index sections one batch holds. */
#define ZIDX_BATCH_BYTES ((uint64_t)64 << 20)

/* One stream's search index to rebuild: its stream, the key its old index
 * had, whether the reader can name the stream; then the new section. */
typedef struct zitem {
    size_t zi;
    uint64_t key;
    int unnamed;
    int rc;
    void *data;
    size_t size;
} zitem;

/* The indexes to rebuild, in the order of their first section: *out (NULL,
 * *n 0 when there are none). */
static int zidx_plan(job *j, zitem **out, size_t *n)
{
    fkvf_archive_op *c = j->c;
    id_stream *ids = NULL;
    size_t n_ids = 0, m = 0;
    unsigned char *done = j->ai.n_streams ? fkvf_calloc(c->alloc, j->ai.n_streams, 1) : NULL;
    zitem *t = j->ai.n_streams ? fkvf_calloc(c->alloc, j->ai.n_streams, sizeof *t) : NULL;
    int rc = j->ai.n_streams && (!done || !t) ? fail_writer(c, FKVF_E_NOMEM, NULL, "search index")
                                              : unnamed_ids(j, &ids, &n_ids);
    for (size_t i = 0; rc == FKVF_OK && i < j->ai.n_sections; i++) {
        fkvf_section_info zs;
        size_t zi;
        int unnamed = 0;
        if (fkvf_reader_section(j->r, i, &zs) != FKVF_OK ||
            (zs.type != FKVF_SECTION_ZIDX && zs.type != FKVF_SECTION_ZPOS))
            continue;
        if (fkvf_reader_stream_find(j->r, zs.key, &zi) != FKVF_OK) {
            id_stream want = {zs.key, 0};
            const id_stream *hit =
                n_ids ? bsearch(&want, ids, n_ids, sizeof *ids, cmp_id_stream) : NULL;
            if (!hit)
                continue;
            zi = hit->k;
            unnamed = 1;
        }
        if (zi >= j->ai.n_streams || done[zi])
            continue;
        done[zi] = 1;
        t[m++] = (zitem){zi, zs.key, unnamed, FKVF_OK, NULL, 0};
    }
    fkvf_free(c->alloc, ids);
    fkvf_free(c->alloc, done);
    if (rc != FKVF_OK) {
        fkvf_free(c->alloc, t);
        t = NULL;
        m = 0;
    }
    *out = t;
    *n = m;
    return rc;
}

/* The builds of one batch, on the workers' readers (a reader is used by
 * one thread at a time). */
typedef struct zbatch {
    fkvf_reader **rs;
    zitem *it;
    const fkvf_allocator *alloc;
} zbatch;

static int zbuild(void *ctx, unsigned worker, size_t i)
{
    zbatch *z = ctx;
    zitem *t = &z->it[i];
    uint64_t zk = t->key;
    if (t->unnamed)
        t->rc = fkvf_search_index_build_as(z->rs[worker], t->zi, t->key, &t->data, &t->size,
                                           z->alloc);
    else
        t->rc = fkvf_search_index_build(z->rs[worker], t->zi, &t->data, &t->size, &zk, z->alloc);
    t->key = zk;
    return t->rc;
}

/* Readers of src for workers 1 .. nw - 1 (rs[0] is the job's), with the
 * job's codebook file attached as to it: how many workers have one (a
 * reader that cannot be opened leaves fewer, the same result). */
static unsigned zidx_readers(job *j, fkvf_reader **rs, unsigned nw)
{
    for (unsigned w = 1; w < nw; w++) {
        int rc = fkvf_reader_open_file(&rs[w], j->c->src, 0, j->c->alloc);
        if (rc == FKVF_OK && j->opt->codebook_file)
            rc = fkvf_reader_attach_codebook(rs[w], j->opt->codebook_file);
        if (rc != FKVF_OK) {
            fkvf_reader_free(rs[w]);
            rs[w] = NULL;
            return w;
        }
    }
    return nw;
}

/* Search indexes (spec 20): rebuilt for every stream that had one, after
 * the stream segments so that no later segment makes them stale (20.4);
 * the streams are copied symbol for symbol, so the input's symbols give the
 * same keys. One index per stream, however many the input had, in the
 * order of their first. A stream the reader cannot name gets its index
 * keyed by the name the codebook's shape gives (fkvf_search_index_build_as:
 * an automatic compaction has the appender's shape, not the codebook).
 * The builds (sorting every stream's positions: most of a compaction's
 * work when the streams were indexed) run on opt->n_threads workers in
 * batches (4 to 64 streams a worker, at most ZIDX_BATCH_BYTES of
 * sections), each section added in order after its batch: the same file
 * for every count. */
static int rebuild_zidx(job *j)
{
    fkvf_archive_op *c = j->c;
    zitem *it;
    size_t n;
    int rc = zidx_plan(j, &it, &n);
    fkvf_reader *rs[FKVF_PAR_MAX] = {j->r};
    unsigned nw = fkvf_par_workers(fkvf_par_threads(j->opt->n_threads), n);
    nw = zidx_readers(j, rs, nw);
    /* a batch holds at most ZIDX_BATCH_BYTES of sections (at least 4 a
     * worker): each starts the workers again, so as few as that allows */
    uint64_t per = UINT64_MAX, e; /* a ZPOS section: 64 + 4 per position (spec 20.7) */
    if (fkvf_mul64(j->ai.n_positions, 4, &e) && e <= UINT64_MAX - 64)
        per = e + 64;
    uint64_t fit = ZIDX_BATCH_BYTES / per;
    size_t batch = nw <= 1 ? 1 : fit > (uint64_t)64 * nw ? (size_t)64 * nw
                                 : fit < (uint64_t)4 * nw ? (size_t)4 * nw : (size_t)fit;
    for (size_t b0 = 0; rc == FKVF_OK && b0 < n; b0 += batch) {
        size_t m = n - b0 < batch ? n - b0 : batch;
        zbatch z = {rs, it + b0, c->alloc};
        fkvf_par_for(nw, m, zbuild, &z);
        for (size_t k = 0; k < m; k++) {
            zitem *t = &it[b0 + k];
            if (rc == FKVF_OK && (rc = t->rc) == FKVF_OK)
                rc = fkvf_writer_add_section(j->w, FKVF_SECTION_ZPOS, 0, t->key, t->data, t->size);
            if (rc == FKVF_OK)
                j->res->search_indexes++;
            fkvf_search_buffer_free(t->data, c->alloc);
        }
        if (rc != FKVF_OK)
            rc = fail_writer(c, rc, j->w, "search index");
    }
    for (unsigned w = 1; w < nw; w++)
        fkvf_reader_free(rs[w]);
    fkvf_free(c->alloc, it);
    return rc;
}

/* The writer of the new file: the input's feature bits and deflate flags. */
static int create_writer(job *j, int lockfd)
{
    fkvf_archive_op *c = j->c;
    for (size_t i = 0; i < j->ai.n_sections; i++) {
        fkvf_section_info si;
        if (fkvf_reader_section(j->r, i, &si) != FKVF_OK || !(si.flags & FKVF_SECTION_DEFLATE))
            continue;
        if (si.type == FKVF_SECTION_EXAC)
            j->exac_flags = FKVF_SECTION_DEFLATE;
        if (si.type == FKVF_SECTION_CBK1)
            j->cbk_flags = FKVF_SECTION_DEFLATE;
    }
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    wo.required_features = j->ai.required_features;
    wo.optional_features = j->ai.optional_features;
    wo.no_replace = !j->opt->in_place && j->opt->no_replace; /* nor one that appears meanwhile */
    wo.sync = j->opt->sync;
    wo.mode = j->opt->mode;
    struct stat st;
    if (!wo.mode && lockfd >= 0) { /* in place: the file keeps its permissions */
        if (fstat(lockfd, &st) != 0)
            return FAIL(c->src, FKVF_E_IO, "cannot stat the file locked: %s", strerror(errno));
        wo.mode = (unsigned)st.st_mode & 07777;
    }
    int rc = j->sink ? fkvf_writer_create_sink(&j->w, j->sink, &wo, c->alloc)
                     : fkvf_writer_create_file(&j->w, c->path, &wo, c->alloc);
    if (rc != FKVF_OK) {
        fkvf_error_info e;
        int have = j->w && fkvf_writer_error(j->w, &e) == FKVF_OK;
        return fkvf_archive_op_fail_from(c, rc, have ? &e : NULL, c->path, "");
    }
    return FKVF_OK;
}

/* Two paths that name one file. */
static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* The reader of src, its descriptor and commit, the codebook attached. */
static int open_src(job *j)
{
    fkvf_archive_op *c = j->c;
    int rc = fkvf_reader_open_file(&j->r, c->src, 0, c->alloc);
    if (rc == FKVF_OK && j->opt->codebook_file)
        rc = fkvf_reader_attach_codebook(j->r, j->opt->codebook_file);
    if (rc == FKVF_OK)
        rc = fkvf_reader_info(j->r, &j->ai);
    if (rc == FKVF_OK)
        rc = fkvf_reader_desc(j->r, &j->d);
    return rc != FKVF_OK ? fail_reader(c, rc, j->r, "") : FKVF_OK;
}

/* The whole copy, into c->path, then the rename. */
static int compact(job *j, int lockfd)
{
    int rc = open_src(j);
    if (rc == FKVF_OK)
        rc = create_writer(j, lockfd);
    if (rc == FKVF_OK && (rc = fkvf_writer_set_desc(j->w, &j->d)) != FKVF_OK)
        fail_writer(j->c, rc, j->w, "descriptor");
    if (rc == FKVF_OK)
        rc = copy_meta(j);
    if (rc == FKVF_OK)
        rc = copy_exact(j);
    if (rc == FKVF_OK)
        rc = copy_codebook(j);
    if (rc == FKVF_OK)
        rc = copy_index(j);
    if (rc == FKVF_OK)
        rc = copy_tokens(j);
    if (rc == FKVF_OK)
        rc = rebuild_zidx(j);
    if (rc == FKVF_OK && ((rc = fkvf_writer_set_positions(j->w, j->ai.n_positions,
                                                          j->ai.n_archived)) != FKVF_OK ||
                          (rc = fkvf_writer_finish(j->w)) != FKVF_OK))
        fail_writer(j->c, rc, j->w, "commit");
    return rc;
}

/* c->path, the file to write: in place src with its links resolved, under
 * the appender's lock (*lockfd), else dst, which must not be src or the
 * codebook file. */
static int set_paths(fkvf_archive_op *c, const char *dst, const fkvf_compact_options *o,
                     int *lockfd)
{
    const char *src = c->src;
    if (o->in_place) {
        /* dst, if given, must name src; the file replaced is the one a
         * symbolic link points to (the writer renames its temporary file
         * over the path: over the link's, it would replace the link and
         * leave the archive as it was) */
        if (dst && strcmp(src, dst) && !same_file(src, dst))
            return FAIL(c->src, FKVF_E_INVALID_ARG, "in place, but dst %s is another file", dst);
        /* no appender may add a commit to the file being replaced */
        c->diag.name = c->src;
        int rc = fkvf_append_lock(src, O_RDONLY, "compacting in place", &c->diag, lockfd);
        if (rc != FKVF_OK)
            return rc;
        char *real = realpath(src, NULL);
        if (!real)
            return FAIL(c->src, FKVF_E_IO, "cannot resolve the path: %s", strerror(errno));
        c->path = fkvf_strndup(c->alloc, real, strlen(real));
        free(real);
    } else {
        if (same_file(src, dst))
            return FAIL(c->src, FKVF_E_INVALID_ARG, "dst %s is the same file (an output never "
                        "replaces its input; compact in place instead)", dst);
        const char *cbf = o->codebook_file ? fkvf_reader_file_name(o->codebook_file) : NULL;
        if (cbf && same_file(cbf, dst))
            return FAIL(c->src, FKVF_E_INVALID_ARG, "dst %s is the codebook file the archive "
                        "refers to", dst);
        c->path = fkvf_strndup(c->alloc, dst, strlen(dst));
    }
    return c->path ? FKVF_OK : FAIL(c->src, FKVF_E_NOMEM, "no memory");
}

FKVF_API int fkvf_archive_compact(fkvf_archive_op **out, const char *src, const char *dst,
                                  const fkvf_compact_options *opts, fkvf_compact_result *result)
{
    if (out)
        *out = NULL;
    if (result)
        memset(result, 0, sizeof *result);
    fkvf_compact_options o;
    fkvf_compact_options_init(&o);
    if (opts)
        o = *opts;
    if (!src || !*src || (!o.in_place && (!dst || !*dst)) || o.sync > FKVF_SYNC_NONE ||
        o.mode > 07777)
        return FKVF_E_INVALID_ARG;
    fkvf_archive_op *c = NULL;
    int rc = fkvf_archive_op_new(&c, src, o.alloc), lockfd = -1;
    if (out)
        *out = c;
    if (!c)
        return rc;
    fkvf_compact_result res;
    memset(&res, 0, sizeof res);
    job j;
    memset(&j, 0, sizeof j);
    j.c = c;
    j.opt = &o;
    j.res = &res;
    if (rc != FKVF_OK)
        goto done;
    if ((rc = set_paths(c, dst, &o, &lockfd)) != FKVF_OK)
        goto done;
    rc = compact(&j, lockfd);
    if (rc == FKVF_OK) {
        struct stat st;
        res.path = out ? c->path : NULL; /* freed below without a handle */
        res.commits_before = j.ai.n_commits;
        res.size_before = j.ai.file_size;
        res.torn_bytes = j.ai.torn_bytes;
        res.positions = j.ai.n_positions;
        res.archived = j.ai.n_archived;
        res.size = stat(c->path, &st) == 0 ? (uint64_t)st.st_size : 0;
    }
done:
    fkvf_writer_free(j.w); /* unfinished: removes the temporary file */
    fkvf_reader_free(j.r);
    if (lockfd >= 0)
        close(lockfd);
    if (rc == FKVF_OK && result)
        *result = res;
    if (!out)
        fkvf_archive_op_free(c);
    return rc;
}

/* ---- the appender's automatic compaction (append_impl.h) ------------------ */

/* The text of a copy's error for the appender's message: body with the
 * "<sink>: offset N: " that a writer of a sink puts before its own text
 * left out (the offset is given once, as the byte of the new file). */
static void strip_sink(char *out, size_t cap, const char *body, size_t len)
{
    static const char tag[] = "<sink>: ";
    size_t o = 0;
    for (size_t i = 0; i < len && o + 1 < cap;) {
        if (len - i >= sizeof tag - 1 && !memcmp(body + i, tag, sizeof tag - 1)) {
            i += sizeof tag - 1;
            if (len - i > 7 && !memcmp(body + i, "offset ", 7)) {
                size_t k = i + 7;
                while (k < len && body[k] >= '0' && body[k] <= '9')
                    k++;
                if (k + 1 < len && body[k] == ':' && body[k + 1] == ' ')
                    i = k + 2;
            }
            continue;
        }
        out[o++] = body[i++];
    }
    out[o] = 0;
}

int fkvf_compact_to_sink(const char *src, const char *dst_name, const fkvf_sink *sink,
                         const fkvf_codebook_shape *ext_shape, const fkvf_allocator *alloc,
                         fkvf_diag *d)
{
    fkvf_compact_options o;
    fkvf_compact_options_init(&o);
    o.sync = FKVF_SYNC_COMMIT; /* the new file replaces one that may be durable */
    fkvf_archive_op *c = NULL;
    int rc = fkvf_archive_op_new(&c, src, alloc);
    if (!c)
        return fkvf_fail(d, rc, FKVF_NO_OFFSET, NULL, "auto-compaction: no memory");
    fkvf_compact_result res;
    memset(&res, 0, sizeof res);
    job j;
    memset(&j, 0, sizeof j);
    j.c = c;
    j.opt = &o;
    j.res = &res;
    j.sink = sink;
    j.ext_shape = ext_shape;
    if (rc == FKVF_OK && !(c->path = fkvf_strndup(c->alloc, dst_name, strlen(dst_name))))
        rc = FAIL(c->src, FKVF_E_NOMEM, "no memory");
    if (rc == FKVF_OK)
        rc = compact(&j, -1);
    fkvf_writer_free(j.w);
    fkvf_reader_free(j.r);
    if (rc != FKVF_OK) {
        char body[FKVF_MSG_MAX];
        const fkvf_diag *e = &c->diag;
        if (e->code != FKVF_OK)
            strip_sink(body, sizeof body, e->msg + e->body_at, e->body_len);
        else
            snprintf(body, sizeof body, "%s", fkvf_strerror(rc));
        const char *clause = e->code != FKVF_OK && e->clause[0] ? e->clause : NULL;
        if (e->code != FKVF_OK && e->name == c->path) {
            /* about the new file: its offset in the text, the archive's stays none */
            char at[160] = "";
            if (e->offset != FKVF_NO_OFFSET)
                snprintf(at, sizeof at, " at its byte %" PRIu64 "%s%s", e->offset,
                         e->field[0] ? ", field " : "", e->field);
            fkvf_fail(d, rc, FKVF_NO_OFFSET, clause, "auto-compaction: writing %s failed%s: %s",
                      dst_name, at, body);
        } else {
            fkvf_fail(d, rc, e->code != FKVF_OK ? e->offset : FKVF_NO_OFFSET, clause,
                      "auto-compaction: reading the archive: %s", body);
            if (e->code != FKVF_OK && e->field[0])
                snprintf(d->field, sizeof d->field, "%s", e->field);
        }
    }
    fkvf_archive_op_free(c);
    return rc;
}
