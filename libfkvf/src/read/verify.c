/* fkvf_reader_verify: the full structural and checksum pass. */
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "hash.h"
#include "le.h"
#include "parallel.h"
#include "reader_impl.h"
#include "read/zidx.h"

#define FAIL(code, off, clause, ...) fkvf_fail(&r->diag, code, off, clause, __VA_ARGS__)

/* ---- checks on the reader's threads ------------------------------------------ */

typedef struct par_check {
    fkvf_reader *r;
    rd_check_fn fn;
    void *ctx;
    fkvf_diag *diag; /* one per worker */
    size_t *failed;  /* per worker: the item it failed, SIZE_MAX none (a worker
                      * fails at most once: no item above a failure is started,
                      * and a worker's items ascend) */
} par_check;

static int par_check_item(void *ctx, unsigned worker, size_t item)
{
    par_check *p = ctx;
    fkvf_diag *d = &p->diag[worker];
    int rc = p->fn(p->r, p->ctx, item, d);
    if (rc)
        p->failed[worker] = item;
    else if (d->code != FKVF_OK)
        fkvf_diag_clear(d); /* a message an item made and did not return */
    return rc;
}

static int check_serial(fkvf_reader *r, size_t n, rd_check_fn fn, void *ctx)
{
    for (size_t i = 0; i < n; i++) {
        int rc = fn(r, ctx, i, &r->diag);
        if (rc)
            return rc;
    }
    return FKVF_OK;
}

int rd_check_par(fkvf_reader *r, size_t n, uint64_t bytes, rd_check_fn fn, void *ctx)
{
    /* a worker per RD_PAR_BYTES of input at most: starting a thread costs
     * about what checking that much does */
    uint64_t most = bytes / RD_PAR_BYTES + 1;
    unsigned nw = r->src.read ? 1 : fkvf_par_workers(fkvf_par_threads(r->threads), n);
    if (nw > most)
        nw = (unsigned)most;
    if (nw <= 1)
        return check_serial(r, n, fn, ctx);
    par_check p = {r, fn, ctx, fkvf_calloc(r->alloc, nw, sizeof(fkvf_diag)),
                   fkvf_calloc(r->alloc, nw, sizeof(size_t))};
    int rc;
    if (!p.diag || !p.failed) { /* on fewer threads: the same result */
        rc = check_serial(r, n, fn, ctx);
    } else {
        for (unsigned w = 0; w < nw; w++) {
            fkvf_diag_clear(&p.diag[w]);
            p.diag[w].name = r->diag.name;
            p.failed[w] = SIZE_MAX;
        }
        rc = fkvf_par_for(nw, n, par_check_item, &p);
        if (rc) {
            unsigned best = 0;
            for (unsigned w = 1; w < nw; w++)
                if (p.failed[w] < p.failed[best])
                    best = w;
            r->diag = p.diag[best];
        }
    }
    fkvf_free(r->alloc, p.diag);
    fkvf_free(r->alloc, p.failed);
    return rc;
}

static int zero_gap(fkvf_reader *r, uint64_t from, uint64_t to, const char *what)
{
    if (to < from)
        return FAIL(FKVF_E_OVERLAP, to, "4.1", "%s overlaps the structure before it", what);
    if (to - from >= 64)
        return FAIL(FKVF_E_CORRUPT, from, "4.1",
                    "%llu bytes between structures before %s (at most 63 padding bytes)",
                    (unsigned long long)(to - from), what);
    int rc = rd_ensure(r, from, to - from);
    if (rc)
        return rc;
    for (uint64_t i = from; i < to; i++)
        if (r->data[i])
            return FAIL(FKVF_E_PADDING, i, "4.1", "padding byte 0x%02x before %s is not zero",
                        r->data[i], what);
    return FKVF_OK;
}

/* The checks of one segment, cut into items: blocks SEG_BLOCKS at a time,
 * then streams SEG_STREAMS at a time, first their padding bits (quad), then
 * their symbols (an index segment whose codebook is known). */
#define SEG_BLOCKS 64
#define SEG_STREAMS 16
typedef struct seg_job {
    const rd_group *s;
    rd_seg *g;
    uint32_t k;            /* the codebook's k, for the symbol items */
    size_t n_pad, n_sym;   /* stream items of each kind */
} seg_job;

static int check_blocks(fkvf_reader *r, void *ctx, size_t item, fkvf_diag *d)
{
    seg_job *j = ctx;
    uint64_t b0 = (uint64_t)item * SEG_BLOCKS, n = j->g->h.n_blocks;
    for (uint64_t b = b0; b < n && b < b0 + SEG_BLOCKS; b++) {
        if (r->src.read)
            rd_source_trim(r); /* a block check holds nothing of the block after it */
        int rc = rd_block_check_d(r, j->s, j->g, b, d);
        if (rc)
            return rc;
    }
    return FKVF_OK;
}

/* The padding bits after the last symbol of stream o (spec 11.7). */
static int check_stream_padding(fkvf_reader *r, const rd_group *s, rd_seg *g, uint32_t o,
                                fkvf_diag *d)
{
    uint64_t at = (uint64_t)o * g->h.stream_bytes;
    /* the bytes from the first padding bit to the stream's end present
     * again if the block cache dropped them */
    uint64_t pbits, from = 0;
    if (fkvf_mul64(g->h.symbol_count, s->bits, &pbits))
        from = pbits / 8 < g->h.stream_bytes ? pbits / 8 : g->h.stream_bytes;
    if (r->src.read)
        rd_source_trim(r);
    for (uint64_t b = (at + from) / g->h.block_size;
         g->h.stream_bytes && b <= (at + g->h.stream_bytes - 1) / g->h.block_size; b++) {
        int rc = rd_block_check_d(r, s, g, b, d);
        if (rc)
            return rc;
    }
    if (!fkvf_quad_padding_zero(g->data + at, (size_t)g->h.stream_bytes, s->bits,
                                g->h.symbol_count))
        return fkvf_fail(d, FKVF_E_PADDING, g->data_fileoff + at + g->h.stream_bytes - 16, "11.7",
                         "STRM section at %llu, stream %u of the group: bits after the last "
                         "symbol are not zero",
                         (unsigned long long)r->sections[g->sec].e.offset, o);
    return FKVF_OK;
}

static int check_streams(fkvf_reader *r, void *ctx, size_t item, fkvf_diag *d)
{
    seg_job *j = ctx;
    size_t part = item < j->n_pad ? item : item - j->n_pad;
    uint32_t n = j->g->h.n_streams, o0 = (uint32_t)(part * SEG_STREAMS);
    uint32_t o1 = n - o0 < SEG_STREAMS ? n : o0 + SEG_STREAMS;
    if (item >= j->n_pad)
        return rd_seg_symbols_below(r, j->s, j->g, j->k, o0, o1, d);
    for (uint32_t o = o0; o < o1; o++) {
        int rc = check_stream_padding(r, j->s, j->g, o, d);
        if (rc)
            return rc;
    }
    return FKVF_OK;
}

/* Padding, every block (checksum, ngon spans), the unused bits of every
 * stream of one segment and, sym set, its symbols below the codebook's k;
 * in that order (the first error found is the one reported for any thread
 * count). */
static int verify_stream_segment(fkvf_reader *r, const rd_group *s, rd_seg *g, int sym)
{
    const rd_section *sec = &r->sections[g->sec];
    /* padding between the checksum table and the data */
    uint64_t tbl_end = sec->e.offset + FKVF_STRM_HDR_SIZE + 8 * g->h.n_blocks;
    for (uint64_t i = tbl_end; i < g->data_fileoff; i++)
        if (r->data[i])
            return FAIL(FKVF_E_PADDING, i, "11.3", "STRM padding before the span data not zero");
    for (uint64_t b = 0; b < g->h.n_blocks; b++)
        g->block_ok[b] &= (uint8_t)~RD_BLOCK_OK; /* checked again, below */
    seg_job j = {s, g, sym ? r->cb_shape.k : 0, 0, 0};
    size_t per = (g->h.n_streams + SEG_STREAMS - 1) / SEG_STREAMS;
    j.n_pad = s->profile == FKVF_PROFILE_QUAD ? per : 0;
    j.n_sym = sym ? per : 0;
    /* n_blocks fits a size_t: its flags were allocated */
    size_t nb = (size_t)(g->h.n_blocks / SEG_BLOCKS + (g->h.n_blocks % SEG_BLOCKS != 0));
    int rc = rd_check_par(r, nb, g->h.data_bytes, check_blocks, &j);
    /* the stream items read the blocks just verified: they write nothing */
    return rc ? rc : rd_check_par(r, j.n_pad + j.n_sym, g->h.data_bytes, check_streams, &j);
}

/* The effective segment of group s held by section i, or NULL when later
 * segments cut it away (segs are in section order). */
static rd_seg *effective_seg(const rd_group *s, size_t i)
{
    size_t lo = 0, hi = s->n_segs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->segs[mid].sec < i)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->n_segs && s->segs[lo].sec == i ? &s->segs[lo] : NULL;
}

/* Every STRM section, also those later segments cut away: they are part of
 * the committed file (spec 1.3.3: every stream block, span and padding). */
static int verify_strm_section(fkvf_reader *r, size_t i)
{
    const rd_section *sec = &r->sections[i];
    if (sec->e.key > FKVF_GROUP_TOKENS)
        return FAIL(FKVF_E_CORRUPT, sec->e.offset, "11.2", "STRM key %llu unknown",
                    (unsigned long long)sec->e.key);
    const rd_group *s = &r->groups[sec->e.key];
    /* index symbols below the codebook size (spec 11.8), every stored one:
     * once the codebook is known (an external one may not be attached) */
    int sym = sec->e.key == FKVF_GROUP_INDEX && r->cb_known;
    rd_seg cut, *g = effective_seg(s, i);
    int rc;
    if (!g) { /* cut away whole: its own segment state, for this pass */
        if ((rc = rd_seg_init(r, i, &cut)))
            return rc;
        cut.count = 0; /* no symbol of it is effective */
        g = &cut;
    }
    rc = verify_stream_segment(r, s, g, sym);
    if (g == &cut)
        fkvf_free(r->alloc, cut.block_ok);
    return rc;
}

/* A vertex table's values (spec 10.2), also of a table no stream uses. */
static int verify_vtxs(fkvf_reader *r, size_t i)
{
    double *xy;
    uint32_t n;
    int rc = rd_vtxs_table(r, i, &xy, &n);
    if (rc)
        return rc;
    rc = fkvf_ngon_check_table(n, xy);
    fkvf_free(r->alloc, xy);
    if (rc)
        return FAIL(FKVF_E_CORRUPT, r->sections[i].e.offset, "10.2",
                    "VTXS N=%u: a coordinate is not finite, V(0) is not (+1, +0), or some "
                    "|V(c)|^2 is off 1 by more than 2^-40",
                    n);
    return FKVF_OK;
}

/* 1. layout: every byte from the header to the last trusted trailer is a
 * structure or zero padding */
static int verify_layout(fkvf_reader *r)
{
    int rc;
    uint64_t pos = FKVF_HEADER_SIZE;
    for (size_t ci = 0; ci < r->n_commits; ci++) {
        const rd_commit *c = &r->commits[ci];
        for (size_t k = 0; k < c->n_sections; k++) {
            const rd_section *s = &r->sections[c->first_section + k];
            if ((rc = zero_gap(r, pos, s->e.offset, "a section")))
                return rc;
            pos = s->e.offset + s->e.stored_size;
        }
        if ((rc = zero_gap(r, pos, c->dir_off, "a directory")) ||
            (rc = zero_gap(r, c->dir_off + c->dir_size, c->trailer_off, "a trailer")))
            return rc;
        pos = c->trailer_off + 64;
    }
    return FKVF_OK;
}

static int check_section_sum(fkvf_reader *r, void *ctx, size_t i, fkvf_diag *d)
{
    (void)ctx;
    int rc = rd_section_check(r, i, d);
    if (rc == FKVF_OK)
        rd_section_drop(r, i); /* its whole pages: no other section's */
    return rc;
}

/* 2. every section's checksum (and inflation). Buffers already inflated
 * are kept: callers may hold views into them. */
static int verify_checksums(fkvf_reader *r)
{
    return rd_check_par(r, r->n_sections, r->committed_size, check_section_sum, NULL);
}

/* The effective META section, and those a later one replaced: they are
 * part of the committed file too (spec 1.3.3, 9.3). */
static int verify_meta(fkvf_reader *r)
{
    int rc;
    if (r->has_meta) {
        r->meta_checked = 0;
        size_t n;
        if ((rc = rd_meta_count(r, &n)))
            return rc;
    }
    for (size_t i = 0; i < r->n_sections; i++) {
        if (r->sections[i].e.type != FKVF_SECTION_META || (r->has_meta && i == r->meta_sec))
            continue;
        const uint8_t *p;
        uint64_t n;
        uint32_t count;
        size_t *offs = NULL;
        if ((rc = rd_section_bytes(r, i, &p, &n)))
            return rc;
        rc = fkvf_meta_parse(p, n, r->sections[i].e.offset, &count, &offs, r->alloc, &r->diag);
        fkvf_free(r->alloc, offs);
        if (rc)
            return rc;
    }
    return FKVF_OK;
}

/* Every STRM and VTXS section's contents, in section order. */
static int verify_streams_and_vertices(fkvf_reader *r)
{
    int rc = FKVF_OK;
    for (size_t i = 0; i < r->n_sections; i++) {
        uint32_t t = r->sections[i].e.type;
        if ((t == FKVF_SECTION_STRM && (rc = verify_strm_section(r, i))) ||
            (t == FKVF_SECTION_VTXS && (rc = verify_vtxs(r, i))))
            return rc;
    }
    return FKVF_OK;
}

/* The sections of the types this version defines carry the REQUIRED flag
 * (spec 4.3). */
static int verify_required_flags(fkvf_reader *r)
{
    for (size_t i = 0; i < r->n_sections; i++) {
        const rd_section *s = &r->sections[i];
        uint32_t t = s->e.type;
        if ((t == FKVF_SECTION_DESC || t == FKVF_SECTION_VTXS || t == FKVF_SECTION_CBK1 ||
             t == FKVF_SECTION_CBRF || t == FKVF_SECTION_EXAC || t == FKVF_SECTION_STRM) &&
            !(s->e.flags & FKVF_SECTION_REQUIRED)) {
            char tn[12];
            fkvf_type_name(t, tn);
            return FAIL(FKVF_E_CORRUPT, s->e.offset, "4.3",
                        "%s section without the REQUIRED flag", tn);
        }
    }
    return FKVF_OK;
}

/* The centroid elements, CB_CHUNK bytes (whole elements) an item. */
#define CB_CHUNK ((uint64_t)1 << 20)
typedef struct cb_job {
    const uint8_t *p;
    uint64_t first, size;
    fkvf_dtype dtype;
} cb_job;

static int check_centroids(fkvf_reader *r, void *ctx, size_t item, fkvf_diag *d)
{
    const cb_job *j = ctx;
    uint64_t from = j->first + (uint64_t)item * CB_CHUNK, bad;
    uint64_t to = j->size - from < CB_CHUNK ? j->size : from + CB_CHUNK;
    if (fkvf_cbk1_finite_range(j->p, from, to, j->dtype, &bad))
        return FKVF_OK;
    if (r->cb_kind == 1)
        return fkvf_fail(d, FKVF_E_CORRUPT, r->sections[r->cb_sec].e.offset, "13.2",
                         "CBK1 centroid element at content offset %llu is not finite",
                         (unsigned long long)bad);
    return fkvf_fail(d, FKVF_E_CODEBOOK, FKVF_NO_OFFSET, "13.2",
                     "external codebook %s: centroid element at content offset %llu is not "
                     "finite",
                     r->cb_file->diag.name, (unsigned long long)bad);
}

/* finite centroids (spec 13.2): of the embedded CBK1 (or of this codebook
 * file), or of the attached external codebook */
static int verify_centroids(fkvf_reader *r)
{
    if (!(r->cb_kind == 1 || (r->cb_kind == 2 && r->cb_known)))
        return FKVF_OK;
    const void *cp;
    size_t cn;
    int rc = rd_codebook(r, NULL, &cp, &cn, NULL);
    if (rc)
        return rc;
    cb_job j = {cp, fkvf_cbk1_elements_at(cp, cn), cn, r->cb_shape.dtype};
    uint64_t n = j.first < cn ? (cn - j.first + CB_CHUNK - 1) / CB_CHUNK : 0;
    return rd_check_par(r, (size_t)n, cn, check_centroids, &j);
}

/* the encoder metric (spec 13.8), if there is one */
static int verify_metric(fkvf_reader *r)
{
    size_t msec;
    fkvf_cmet_hdr mh;
    int rc = rd_metric_check(r, &msec, &mh);
    if (rc == FKVF_E_NOT_FOUND) {
        fkvf_diag_clear(&r->diag);
        return FKVF_OK;
    }
    return rc;
}

FKVF_API int fkvf_reader_verify(fkvf_reader *r)
{
    int rc = rd_enter(r);
    if (rc)
        return rc;
    /* 1. the layout, 2. every section's checksum, 3. the contents (the CBK1
     * first if a source reader deferred it), the search indexes (spec 20)
     * last; the first error stops the pass */
    if ((rc = verify_layout(r)) || (rc = verify_checksums(r)) || (rc = rd_cbk1_load(r)) ||
        (rc = verify_meta(r)) || (rc = verify_streams_and_vertices(r)) ||
        (rc = verify_required_flags(r)) || (rc = verify_centroids(r)) ||
        (rc = verify_metric(r)) || (rc = rd_zidx_verify(r)))
        return rc;
    if (r->torn_bytes)
        return FAIL(FKVF_E_TORN, r->committed_size, "7.2",
                    "%llu bytes after the last valid commit: recoverable torn tail",
                    (unsigned long long)r->torn_bytes);
    return FKVF_OK;
}
