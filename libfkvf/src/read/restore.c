/* fkvf_reader_restore: every position of an archive back into cache rows
 * (spec 13.6, 14). Exact rows are copied (converted if asked); archived rows
 * are decoded from their index streams with the codebook. Uses the
 * quantizer through its public API. */
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "restore.h"

#define FAIL(code, off, clause, ...) fkvf_fail(&r->diag, code, off, clause, __VA_ARGS__)

/* Archived positions are decoded in batches whose codes (one uint16 per
 * index stream and position) take at most BATCH_BYTES: large enough that
 * the decoder walks the codebook's tables (56 MB at GPT-2 small) once per
 * ~2400 positions instead of once per 64 (restore of 8192 positions: 5.4x
 * -> see bench/bench_restore_pread), bounded whatever the shape. A batch
 * whose codes fit SMALL_CODES uses a buffer on the stack: a call for a few
 * rows allocates nothing here. */
#define BATCH_BYTES ((size_t)4 << 20)
#define SMALL_CODES 2048
/* symbols read from a stream at a time */
#define SYM_RUN 256

int rd_row_bytes(const fkvf_reader *r, fkvf_dtype dtype, size_t *row_bytes)
{
    if (!row_bytes || fkvf_dtype_size(dtype) == 0)
        return FKVF_E_INVALID_ARG;
    if (!r->n_commits || !r->has_desc)
        return FKVF_E_STATE;
    uint64_t elems = (uint64_t)r->desc.n_layers * r->desc.n_kv_heads *
                     ((uint64_t)r->desc.key_dim + r->desc.value_dim);
    uint64_t b;
    if (!fkvf_mul64(elems, fkvf_dtype_size(dtype), &b) || !fkvf_tosz(b, row_bytes))
        return FKVF_E_LIMIT;
    return FKVF_OK;
}

FKVF_API int fkvf_reader_row_bytes(const fkvf_reader *r, fkvf_dtype dtype, size_t *row_bytes)
{
    int rc = rd_enter(r);
    if (rc)
        return rc;
    return rd_row_bytes(r, dtype, row_bytes);
}

/* the index stream of every RVQ code j of shape sh (built once) */
static int streams_prepare(fkvf_reader *r, const fkvf_codebook_shape *sh)
{
    if (r->cb_streams)
        return FKVF_OK;
    /* <= 1024 layers x 1024 heads x 32 stages (spec 15) */
    size_t n = (size_t)fkvf_index_stream_count(sh, r->desc.n_kv_heads);
    size_t *map = fkvf_calloc(r->alloc, n ? n : 1, sizeof *map);
    if (!map)
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory for the stream map");
    for (size_t idx = 0; idx < n; idx++) {
        uint64_t id = fkvf_index_stream_id_shape(sh, r->desc.n_kv_heads, idx);
        if (rd_stream_find(r, id, &map[idx]) != FKVF_OK) {
            /* n_archived > 0 guarantees every stream (spec 11.8) */
            fkvf_free(r->alloc, map);
            return FAIL(FKVF_E_CORRUPT, FKVF_NO_OFFSET, "11.8", "index stream %016llx missing",
                        (unsigned long long)id);
        }
    }
    r->cb_streams = map;
    return FKVF_OK;
}

/* the message of a codebook whose tables cannot be made into a handle */
static int tables_fail(fkvf_reader *r, int rc)
{
    if (rc == FKVF_E_INVALID_ARG) {
        /* the shape was checked when the codebook was loaded: a non-finite
         * element (spec 13.2), a fault of the file, not of the caller */
        int ext = r->cb_kind == 2;
        return FAIL(ext ? FKVF_E_CODEBOOK : FKVF_E_CORRUPT, r->sections[r->cb_sec].e.offset,
                    "13.2", "%s codebook holds a non-finite centroid element",
                    ext ? "the external" : "the CBK1");
    }
    return FAIL(rc, r->sections[r->cb_sec].e.offset, "13.2",
                "codebook tables cannot be loaded (%s)", fkvf_strerror(rc));
}

int rd_restore_prepare(fkvf_reader *r)
{
    if (r->rvq && r->cb_streams)
        return FKVF_OK;
    fkvf_codebook_shape shape;
    const void *contents;
    size_t size;
    int rc = rd_codebook(r, &shape, &contents, &size, NULL);
    if (rc)
        return rc; /* message set: no codebook, or external not attached */
    if (!r->rvq) {
        fkvf_rvq *q = NULL;
        size_t to = (size_t)fkvf_codebook_tables_offset(&shape);
        rc = fkvf_rvq_from_tables_decode(&q, &shape, r->desc.n_kv_heads,
                                         (const uint8_t *)contents + to, size - to,
                                         fkvf_alloc_large_tables(r->alloc));
        if (rc)
            return tables_fail(r, rc);
        r->rvq = q;
    }
    return streams_prepare(r, &shape);
}

/* The handle restore decodes with, in *q: an f16 codebook on a CPU with
 * fkvf_rvq_decode's f16 kernel is read in place from its CBK1 contents (the
 * reader's mapping or loaded copy, or the attached codebook file's: valid
 * while they live; rebuilt if another file was attached since) with no
 * binary32 copy of its tables (28 MB instead of 56 at GPT-2 small); any
 * other codebook, or that CPU without the kernel, through r->rvq
 * (rd_restore_prepare). Both give the same bytes. */
static int restore_rvq(fkvf_reader *r, const fkvf_rvq **q)
{
    fkvf_codebook_shape shape;
    const void *contents;
    size_t size;
    int rc = rd_codebook(r, &shape, &contents, &size, NULL);
    if (rc)
        return rc;
    if (shape.dtype == FKVF_DTYPE_F16) {
        size_t to = (size_t)fkvf_codebook_tables_offset(&shape);
        const uint8_t *t = (const uint8_t *)contents + to;
        if (!r->rvq16 || r->rvq16_cb != t) {
            fkvf_rvq_free(r->rvq16);
            r->rvq16 = NULL;
            r->rvq16_cb = NULL;
            fkvf_rvq *b = NULL;
            rc = fkvf_rvq_from_tables16_borrow(&b, &shape, r->desc.n_kv_heads, t, size - to,
                                               r->alloc);
            if (rc == FKVF_OK) {
                r->rvq16 = b;
                r->rvq16_cb = t;
            } else if (rc != FKVF_E_UNSUPPORTED) {
                return tables_fail(r, rc);
            }
        }
        if (r->rvq16) {
            fkvf_rvq_set_threads(r->rvq16, r->threads);
            *q = r->rvq16;
            return streams_prepare(r, &shape);
        }
    }
    if ((rc = rd_restore_prepare(r)))
        return rc;
    fkvf_rvq_set_threads(r->rvq, r->threads);
    *q = r->rvq;
    return FKVF_OK;
}

FKVF_API int fkvf_reader_set_threads(fkvf_reader *r, unsigned n_threads)
{
    int rc = rd_enter(r);
    if (rc)
        return rc;
    r->threads = n_threads;
    return FKVF_OK;
}

/* Positions archived in a batch starting at an archived position: all the
 * `left` ones if their codes fit BATCH_BYTES, else as many as do (at least
 * one). */
static size_t batch_rows(size_t ncodes, uint64_t left)
{
    size_t per = ncodes ? ncodes * sizeof(uint16_t) : 1; /* ncodes * 2 fits: the map exists */
    size_t cap = BATCH_BYTES / per ? BATCH_BYTES / per : 1;
    return left < cap ? (size_t)left : cap;
}

/* The codes of a position for layers [l0, l0 + nl) (spec 11.2: P(l) of
 * each layer): the first one's index in *j0, their count returned. */
static size_t layer_codes(const fkvf_reader *r, uint32_t l0, uint32_t nl, size_t *j0)
{
    const fkvf_codebook_shape *sh = &r->cb_shape;
    size_t H = r->desc.n_kv_heads, at = 0, n = 0;
    for (uint32_t l = 0; l < l0 + nl; l++) {
        size_t m = H * (fkvf_layer_k_stages(sh, l) + fkvf_layer_v_stages(sh, l));
        if (l < l0)
            at += m;
        else
            n += m;
    }
    *j0 = at;
    return n;
}

/* Is code j (from the first code of layer l0 on) one of the parts asked
 * for (a key stage's with FKVF_PART_KEYS, a value stage's with
 * FKVF_PART_VALUES)? */
static int code_wanted(const fkvf_reader *r, uint32_t l0, size_t j, unsigned parts)
{
    if (parts == (FKVF_PART_KEYS | FKVF_PART_VALUES))
        return 1;
    const fkvf_codebook_shape *sh = &r->cb_shape;
    for (uint32_t l = l0; l < sh->n_layers; l++) {
        size_t ks = fkvf_layer_k_stages(sh, l), m = ks + fkvf_layer_v_stages(sh, l);
        size_t lay = (size_t)r->desc.n_kv_heads * m;
        if (j < lay)
            return (j % m < ks ? FKVF_PART_KEYS : FKVF_PART_VALUES) & parts ? 1 : 0;
        j -= lay;
    }
    return 0;
}

/* Archived positions [first, first+count) (count from batch_rows) into
 * target t's rows (first - t_first).. of out. The codes are stream-major
 * (codes[j * count + i]: code j of the target's layers of position
 * first + i), so that the decoder reads each table set's codes in order. */
static int restore_archived(fkvf_reader *r, const fkvf_rvq *q, const rd_target *t,
                            uint64_t first, size_t count)
{
    size_t j0, ncodes = layer_codes(r, t->dec.layer_first, t->dec.layer_count, &j0);
    size_t n = ncodes * count; /* <= BATCH_BYTES / 2, or ncodes (count 1) */
    uint16_t small[SMALL_CODES];
    uint16_t *codes = small;
    if (n > SMALL_CODES && !(codes = fkvf_malloc(r->alloc, n * sizeof(uint16_t))))
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory for codes");
    uint32_t sym[SYM_RUN];
    uint32_t k = r->cb_shape.k;
    uint64_t a = first - r->desc.n_sinks; /* symbol index in the streams */
    const size_t *streams = r->cb_streams + j0;
    int rc = FKVF_OK;
    unsigned parts = t->dec.parts ? t->dec.parts : FKVF_PART_KEYS | FKVF_PART_VALUES;
    /* a source reader: the batch's blocks of every stream first, adjacent
     * ones in one read (the streams follow each other in the file) */
    rd_prefetch pf = {0, 0};
    for (size_t j = 0; j < ncodes && rc == FKVF_OK; j++)
        if (code_wanted(r, t->dec.layer_first, j, parts))
            rc = rd_stream_prefetch(r, &pf, streams[j], a, count);
    if (rc == FKVF_OK)
        rc = rd_prefetch_flush(r, &pf);
    for (size_t j = 0; j < ncodes && rc == FKVF_OK; j++) {
        uint16_t *cj = codes + j * count;
        if (!code_wanted(r, t->dec.layer_first, j, parts)) { /* a part not decoded */
            memset(cj, 0, count * sizeof *cj);
            continue;
        }
        for (size_t i0 = 0; i0 < count && rc == FKVF_OK; i0 += SYM_RUN) {
            size_t m = count - i0 < SYM_RUN ? count - i0 : SYM_RUN;
            rd_source_trim(r); /* the reads before copied what they read */
            rc = rd_stream_read(r, streams[j], a + i0, sym, m);
            for (size_t i = 0; rc == FKVF_OK && i < m; i++) {
                if (sym[i] >= k)
                    rc = FAIL(FKVF_E_SYMBOL, FKVF_NO_OFFSET, "11.8",
                              "index stream %zu symbol %llu is %u, the codebook has k = %u",
                              streams[j], (unsigned long long)(a + i0 + i), sym[i], k);
                else
                    cj[i0 + i] = (uint16_t)sym[i];
            }
        }
    }
    if (rc == FKVF_OK) {
        fkvf_rope rope = {r->desc.rope_layout, r->desc.rope_dims, r->desc.rope_theta};
        fkvf_rvq_decode_target d = t->dec;
        d.row_first = (size_t)(first - t->first);
        rc = fkvf_rvq_decode_to(q, &d, codes, 1, count, count, first,
                                r->desc.key_storage == 1 ? &rope : NULL, t->dtype, t->out,
                                t->out_size);
        if (rc)
            FAIL(rc, FKVF_NO_OFFSET, "13.6", "decoding positions %llu..%llu failed",
                 (unsigned long long)first, (unsigned long long)(first + count - 1));
    }
    if (codes != small)
        fkvf_free(r->alloc, codes);
    return rc;
}

int rd_restore_archived(fkvf_reader *r, const rd_target *t, uint64_t first, uint64_t stop)
{
    const fkvf_rvq *q = NULL;
    int rc = restore_rvq(r, &q);
    size_t j0, nc = layer_codes(r, t->dec.layer_first, t->dec.layer_count, &j0);
    while (rc == FKVF_OK && first < stop) {
        size_t c = batch_rows(nc, stop - first);
        rc = restore_archived(r, q, t, first, c);
        first += c;
    }
    return rc;
}

FKVF_API int fkvf_reader_restore(fkvf_reader *r, uint64_t first, uint64_t count, fkvf_dtype dtype,
                                 void *out, size_t out_size)
{
    int rc = rd_enter(r);
    if (rc)
        return rc;
    size_t row_bytes;
    if ((rc = rd_row_bytes(r, dtype, &row_bytes)))
        return rc;
    if (!out && count)
        return FKVF_E_INVALID_ARG;
    uint64_t need;
    if (first > r->n_positions || count > r->n_positions - first)
        return FAIL(FKVF_E_RANGE, FKVF_NO_OFFSET, NULL, "positions [%llu, +%llu) outside %llu",
                    (unsigned long long)first, (unsigned long long)count,
                    (unsigned long long)r->n_positions);
    if (!fkvf_mul64(count, row_bytes, &need) || need > out_size)
        return FAIL(FKVF_E_INVALID_ARG, FKVF_NO_OFFSET, NULL,
                    "output buffer of %zu bytes, %llu rows need %llu", out_size,
                    (unsigned long long)count, (unsigned long long)need);
    uint8_t *o = out;
    uint64_t S = r->desc.n_sinks, A = r->n_archived;
    uint64_t p = first, end = first + count;
    rd_target t = {{0, r->desc.n_layers, FKVF_LAYOUT_ROWS, (size_t)count, 0, 0}, first, dtype, out,
                   (size_t)need};
    while (p < end) {
        int archived = p >= S && p - S < A;
        if (archived) {
            uint64_t stop = S + A < end ? S + A : end;
            if ((rc = rd_restore_archived(r, &t, p, stop)))
                return rc;
            o += (size_t)(stop - p) * row_bytes;
            p = stop;
        } else {
            const void *row;
            size_t rb;
            if ((rc = rd_exact_row(r, p, &row, &rb)))
                return rc;
            size_t elems = rb / fkvf_dtype_size(r->desc.dtype);
            if ((rc = fkvf_convert(dtype, o, r->desc.dtype, row, elems)))
                return FAIL(rc, FKVF_NO_OFFSET, NULL, "converting exact row %llu",
                            (unsigned long long)p);
            o += row_bytes;
            p++;
        }
    }
    return FKVF_OK;
}
