/* The symbol streams of an open reader (spec 11): their list, lookup,
 * block checks, reads and points. */
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "hash.h"
#include "le.h"
#include "reader_impl.h"

#define FAIL(code, off, clause, ...) fkvf_fail(&r->diag, code, off, clause, __VA_ARGS__)

/* ---- streams ------------------------------------------------------------------- */

FKVF_API int fkvf_reader_stream_count(const fkvf_reader *r, size_t *count)
{
    ENTER(r);
    if (!count)
        return FKVF_E_INVALID_ARG;
    *count = r->n_streams;
    return FKVF_OK;
}

FKVF_API int fkvf_reader_stream_info(const fkvf_reader *r, size_t index, fkvf_stream_info *out)
{
    ENTER(r);
    if (!out)
        return FKVF_E_INVALID_ARG;
    rd_stream st;
    if (rd_stream_at(r, index, &st))
        return FKVF_E_RANGE;
    const rd_stream *s = &st;
    const rd_group *g = s->g;
    memset(out, 0, sizeof *out);
    out->id = s->id;
    out->profile = (fkvf_profile)g->profile;
    out->symbol_bits = g->bits;
    if (g->profile == FKVF_PROFILE_QUAD) {
        out->alphabet = g->bits < 32 ? (uint32_t)1 << g->bits : 0;
        out->span_symbols = fkvf_quad_span_symbols(g->bits);
    } else {
        out->alphabet = g->alphabet;
        out->span_symbols = g->span;
        out->r = g->r;
    }
    out->align = fkvf_strm_align(g->profile, g->bits, g->span);
    out->length = g->length;
    out->n_segments = g->n_segs;
    out->stored_bytes = s->stored_bytes;
    return FKVF_OK;
}

FKVF_API int fkvf_reader_stream_spec(const fkvf_reader *r, size_t index, fkvf_stream_spec *out)
{
    ENTER(r);
    rd_stream st;
    if (!out)
        return FKVF_E_INVALID_ARG;
    if (rd_stream_at(r, index, &st))
        return FKVF_E_RANGE;
    memset(out, 0, sizeof *out);
    out->profile = (fkvf_profile)st.g->profile;
    if (st.g->profile == FKVF_PROFILE_QUAD) {
        out->symbol_bits = st.g->bits;
    } else {
        out->alphabet = st.g->alphabet;
        out->r = st.g->r;
        out->span_symbols = st.g->span;
    }
    return FKVF_OK;
}

int rd_stream_find(const fkvf_reader *r, uint64_t id, size_t *index)
{
    if (!index)
        return FKVF_E_INVALID_ARG;
    const rd_group *ix = &r->groups[FKVF_GROUP_INDEX];
    size_t n_index = ix->present ? ix->n_streams : 0;
    if (id == FKVF_STREAM_ID_TOKENS) {
        if (!r->groups[FKVF_GROUP_TOKENS].present)
            return FKVF_E_NOT_FOUND;
        *index = n_index;
        return FKVF_OK;
    }
    uint32_t layer = (uint32_t)(id & 0xFFFF), head = (uint32_t)(id >> 16 & 0xFFFF);
    unsigned kv = (unsigned)(id >> 32 & 0xFF), stage = (unsigned)(id >> 40 & 0xFF);
    /* an index stream within the group's stage counts (the largest of any
     * layer with a layer table) */
    if (!ix->present || (id >> 48) != 0 || kv > 1 || layer >= r->desc.n_layers ||
        head >= r->desc.n_kv_heads || stage >= (kv ? ix->v_stages : ix->k_stages))
        return FKVF_E_NOT_FOUND;
    if (r->hdr.required_features & FKVF_FEAT_LAYER_STAGES) {
        /* named by the codebook's layer table (spec 11.2), CODEBOOK without it */
        if (!r->cb_known)
            return FKVF_E_CODEBOOK;
        uint64_t j =
            fkvf_index_stream_ord(&r->cb_shape, r->desc.n_kv_heads, layer, head, kv, stage);
        if (j >= n_index)
            return FKVF_E_NOT_FOUND;
        *index = (size_t)j;
        return FKVF_OK;
    }
    uint32_t per_head = (uint32_t)ix->k_stages + ix->v_stages;
    *index = ((size_t)layer * r->desc.n_kv_heads + head) * per_head +
             (kv ? ix->k_stages + stage : stage);
    return FKVF_OK;
}

FKVF_API int fkvf_reader_stream_find(const fkvf_reader *r, uint64_t id, size_t *index)
{
    ENTER(r);
    return rd_stream_find(r, id, index);
}

int rd_block_check_d(fkvf_reader *r, const rd_group *gr, rd_seg *g, uint64_t b, fkvf_diag *d)
{
    if (g->block_ok[b] & RD_BLOCK_OK)
        return FKVF_OK;
    const fkvf_strm_hdr *h = &g->h;
    uint64_t start, len;
    rd_block_range(g, b, &start, &len);
    uint64_t table = r->sections[g->sec].e.offset + FKVF_STRM_HDR_SIZE + 8 * b;
    int rc = rd_ensure_block(r, g->data_fileoff + start, len); /* the table: at rd_seg_init */
    if (rc)
        return rc;
    uint64_t want = fkvf_ld64(r->data + table);
    uint64_t got = fkvf_xxh3_64(g->data + start, (size_t)len, g->data_fileoff + start);
    if (want != got) {
        rd_source_unread(r, g, b); /* a source: asked again by a later call */
        return fkvf_fail(d, FKVF_E_CHECKSUM, g->data_fileoff + start, "11.4",
                    "STRM section at %llu, block %llu: checksum stored %016llx, computed %016llx",
                    (unsigned long long)r->sections[g->sec].e.offset, (unsigned long long)b,
                    (unsigned long long)want, (unsigned long long)got);
    }
    if (gr->profile == FKVF_PROFILE_NGON) {
        /* every span in the block must re-encode to its anchor (spec 12.2); a
         * block can hold spans of several streams */
        uint32_t tmp[64];
        for (uint64_t o = start; o < start + len; o += 16) {
            uint64_t ord = o / h->stream_bytes, j = o % h->stream_bytes / 16;
            uint64_t s0 = j * h->span_symbols;
            uint64_t cnt = h->symbol_count - s0 < h->span_symbols ? h->symbol_count - s0
                                                                  : h->span_symbols;
            const uint8_t *a = g->data + o;
            if (fkvf_ngon_decode_span(gr->ngon, fkvf_ldf64(a), fkvf_ldf64(a + 8), (uint32_t)cnt,
                                      tmp) != FKVF_OK) {
                rd_source_unread(r, g, b);
                return fkvf_fail(d, FKVF_E_SPAN, g->data_fileoff + o, "12.2.5",
                            "STRM section at %llu, stream %llu of the group, span %llu: anchor "
                            "does not decode to %llu symbols that re-encode to it",
                            (unsigned long long)r->sections[g->sec].e.offset,
                            (unsigned long long)ord, (unsigned long long)j,
                            (unsigned long long)cnt);
            }
        }
    }
    g->block_ok[b] |= RD_BLOCK_OK;
    return rd_source_cached(r, g, b, len);
}

int rd_block_check(fkvf_reader *r, const rd_group *gr, rd_seg *g, uint64_t b)
{
    return rd_block_check_d(r, gr, g, b, &r->diag);
}

/* Segment holding symbol t (binary search on first_symbol). */
static rd_seg *seg_for(const rd_group *s, uint64_t t)
{
    size_t lo = 0, hi = s->n_segs;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (s->segs[mid].h.first_symbol <= t)
            lo = mid;
        else
            hi = mid;
    }
    return &s->segs[lo];
}

/* Make sure the blocks holding local symbols [a, b) of stream `ord` in
 * segment g are verified. */
void rd_seg_span(const rd_group *s, const rd_seg *g, uint32_t ord, uint64_t a, uint64_t b,
                 uint64_t *lo, uint64_t *hi)
{
    uint64_t base = (uint64_t)ord * g->h.stream_bytes;
    if (s->profile == FKVF_PROFILE_QUAD) {
        *lo = base + a * s->bits / 8;
        *hi = base + (b * s->bits + 7) / 8;
    } else {
        *lo = base + a / s->span * 16;
        *hi = base + ((b - 1) / s->span + 1) * 16;
    }
}

int rd_seg_prefetch(fkvf_reader *r, rd_prefetch *pf, const rd_group *s, const rd_seg *g,
                    uint32_t ord, uint64_t a, uint64_t b)
{
    if (!r->src.read || a >= b)
        return FKVF_OK;
    uint64_t lo, hi;
    rd_seg_span(s, g, ord, a, b, &lo, &hi);
    const uint64_t bs = g->h.block_size;
    for (uint64_t k = lo / bs; k <= (hi - 1) / bs; k++) {
        if (g->block_ok[k] & RD_BLOCK_OK)
            continue;
        uint64_t start, len;
        rd_block_range(g, k, &start, &len);
        int rc = rd_prefetch_add(r, pf, g->data_fileoff + start, len);
        if (rc)
            return rc;
    }
    return FKVF_OK;
}

static int seg_touch(fkvf_reader *r, const rd_group *s, rd_seg *g, uint32_t ord, uint64_t a,
                     uint64_t b)
{
    uint64_t lo, hi;
    rd_seg_span(s, g, ord, a, b, &lo, &hi);
    for (uint64_t k = lo / g->h.block_size; k <= (hi - 1) / g->h.block_size; k++) {
        int rc = rd_block_check(r, s, g, k);
        if (rc)
            return rc;
    }
    return FKVF_OK;
}

static const uint8_t *seg_stream(const rd_seg *g, uint32_t ord)
{
    return g->data + (size_t)((uint64_t)ord * g->h.stream_bytes);
}

static int seg_read(fkvf_reader *r, const rd_group *s, rd_seg *g, uint32_t ord, uint64_t a,
                    size_t n, uint32_t *out)
{
    int rc = seg_touch(r, s, g, ord, a, a + n);
    if (rc)
        return rc;
    size_t db = (size_t)g->h.stream_bytes;
    if (s->profile == FKVF_PROFILE_QUAD)
        return fkvf_quad_decode(seg_stream(g, ord), db, s->bits, a, n, out);
    return fkvf_ngon_decode(s->ngon, seg_stream(g, ord), db, g->h.symbol_count, a, n, out, 0);
}

/* Symbols [a, a+n) of segment g as bytes (the stream's symbols fit). */
static int seg_read_u8(fkvf_reader *r, const rd_group *s, rd_seg *g, uint32_t ord, uint64_t a,
                       size_t n, uint8_t *out)
{
    if (s->profile == FKVF_PROFILE_QUAD) {
        int rc = seg_touch(r, s, g, ord, a, a + n);
        if (rc)
            return rc;
        return fkvf_quad_decode_u8(seg_stream(g, ord), (size_t)g->h.stream_bytes, s->bits, a, n,
                                   out);
    }
    uint32_t tmp[256];
    for (size_t done = 0; done < n;) {
        size_t c = n - done < 256 ? n - done : 256;
        int rc = seg_read(r, s, g, ord, a + done, c, tmp);
        if (rc)
            return rc;
        for (size_t k = 0; k < c; k++)
            out[done + k] = (uint8_t)tmp[k];
        done += c;
    }
    return FKVF_OK;
}

int rd_seg_symbols_below(fkvf_reader *r, const rd_group *s, rd_seg *g, uint32_t k, uint32_t o0,
                         uint32_t o1, fkvf_diag *d)
{
    uint32_t buf[1024];
    for (uint32_t o = o0; o < o1; o++)
        for (uint64_t a = 0; a < g->h.symbol_count; a += 1024) {
            size_t n = g->h.symbol_count - a < 1024 ? (size_t)(g->h.symbol_count - a) : 1024;
            if (r->src.read)
                rd_source_trim(r); /* seg_read holds nothing of a block after it */
            int rc = seg_read(r, s, g, o, a, n, buf);
            if (rc)
                return rc;
            for (size_t i = 0; i < n; i++)
                if (buf[i] >= k)
                    return fkvf_fail(
                        d, FKVF_E_SYMBOL, r->sections[g->sec].e.offset, "11.8",
                        "STRM section at %llu, index stream %u of the group: symbol %llu is %u, "
                        "the codebook has k = %u%s",
                        (unsigned long long)r->sections[g->sec].e.offset, o,
                        (unsigned long long)(g->h.first_symbol + a + i), buf[i], k,
                        a + i < g->count ? "" : " (in a part later segments cut away)");
        }
    return FKVF_OK;
}

/* Symbols [first, first+count) of stream s, segment by segment, into out32
 * or (when out8 is not NULL) out8. */
static int stream_read_at(fkvf_reader *r, rd_stream *st, uint64_t first, size_t count,
                          uint32_t *out32, uint8_t *out8)
{
    rd_group *s = st->g;
    if (first > s->length || count > s->length - first)
        return fkvf_fail(&r->diag, FKVF_E_RANGE, FKVF_NO_OFFSET, NULL,
                         "symbols [%llu, +%zu) outside stream of %llu",
                         (unsigned long long)first, count, (unsigned long long)s->length);
    for (size_t done = 0; done < count;) {
        rd_seg *g = seg_for(s, first + done);
        uint64_t a = first + done - g->h.first_symbol;
        uint64_t avail = g->count - a;
        size_t n = avail < count - done ? (size_t)avail : count - done;
        int rc = out8 ? seg_read_u8(r, s, g, st->ord, a, n, out8 + done)
                      : seg_read(r, s, g, st->ord, a, n, out32 + done);
        if (rc)
            return rc;
        done += n;
    }
    return FKVF_OK;
}

int rd_stream_prefetch(fkvf_reader *r, rd_prefetch *pf, size_t index, uint64_t first,
                       uint64_t count)
{
    rd_stream st;
    if (!r->src.read || rd_stream_at(r, index, &st))
        return FKVF_OK; /* the read itself reports a bad index */
    rd_group *s = st.g;
    if (first > s->length || count > s->length - first)
        return FKVF_OK; /* and a bad range */
    for (uint64_t done = 0; done < count;) {
        rd_seg *g = seg_for(s, first + done);
        uint64_t a = first + done - g->h.first_symbol;
        uint64_t n = g->count - a < count - done ? g->count - a : count - done;
        if (!n)
            break;
        int rc = rd_seg_prefetch(r, pf, s, g, st.ord, a, a + n);
        if (rc)
            return rc;
        done += n;
    }
    return FKVF_OK;
}

int rd_stream_read(fkvf_reader *r, size_t index, uint64_t first, uint32_t *out, size_t count)
{
    if (!out && count)
        return FKVF_E_INVALID_ARG;
    rd_stream st;
    if (rd_stream_at(r, index, &st))
        return FKVF_E_RANGE;
    return stream_read_at(r, &st, first, count, out, NULL);
}

FKVF_API int fkvf_reader_stream_read(fkvf_reader *r, size_t index, uint64_t first, uint32_t *out,
                                     size_t count)
{
    ENTER(r);
    rd_source_trim(r);
    return rd_stream_read(r, index, first, out, count);
}

FKVF_API int fkvf_reader_stream_read_u8(fkvf_reader *r, size_t index, uint64_t first,
                                        uint8_t *out, size_t count)
{
    ENTER(r);
    rd_source_trim(r);
    if (!out && count)
        return FKVF_E_INVALID_ARG;
    rd_stream st;
    if (rd_stream_at(r, index, &st))
        return FKVF_E_RANGE;
    rd_stream *s = &st;
    if (s->g->profile == FKVF_PROFILE_QUAD ? s->g->bits > 8 : s->g->alphabet > 256)
        return fkvf_fail(&r->diag, FKVF_E_INVALID_ARG, FKVF_NO_OFFSET, NULL,
                         "stream %016llx: symbols do not fit in a byte",
                         (unsigned long long)s->id);
    return stream_read_at(r, s, first, count, NULL, out);
}

FKVF_API int fkvf_reader_stream_get(fkvf_reader *r, size_t index, uint64_t t, uint32_t *symbol)
{
    ENTER(r);
    rd_source_trim(r);
    return rd_stream_read(r, index, t, symbol, 1);
}

FKVF_API int fkvf_reader_stream_point(fkvf_reader *r, size_t index, uint64_t t, fkvf_point *out)
{
    ENTER(r);
    rd_source_trim(r);
    if (!out)
        return FKVF_E_INVALID_ARG;
    rd_stream st_;
    if (rd_stream_at(r, index, &st_))
        return FKVF_E_RANGE;
    rd_stream *st = &st_;
    rd_group *s = st->g;
    if (t >= s->length)
        return FKVF_E_RANGE;
    memset(out, 0, sizeof *out);
    /* the point depends on a bounded window of symbols before t */
    uint32_t win = s->profile == FKVF_PROFILE_QUAD ? (128u + s->bits - 1u) / s->bits : s->span;
    uint64_t first = t + 1 >= win ? t + 1 - win : 0;
    rd_seg *g = seg_for(s, first);
    if (g == seg_for(s, t)) {
        uint64_t a = first - g->h.first_symbol, lt = t - g->h.first_symbol;
        int rc = seg_touch(r, s, g, st->ord, a, lt + 1);
        if (rc)
            return rc;
        if (s->profile == FKVF_PROFILE_QUAD) {
            fkvf_quad_point(seg_stream(g, st->ord), (size_t)g->h.stream_bytes, s->bits, lt,
                            &out->x, &out->y);
            return FKVF_OK;
        }
    }
    uint32_t sym[128];
    size_t n = (size_t)(t + 1 - first);
    int rc = stream_read_at(r, st, first, n, sym, NULL);
    if (rc)
        return rc;
    if (s->profile == FKVF_PROFILE_QUAD) {
        /* first == 0 or the window covers >= 128 bits: the recurrence from the
         * origin over these symbols gives the point */
        fkvf_quad_point_ref(sym, n - 1, s->bits, &out->x, &out->y);
    } else {
        fkvf_ngon_encode_span(s->ngon, sym, (uint32_t)n, &out->fx, &out->fy);
    }
    return FKVF_OK;
}
