/* Opening, last step: the sections of the effective directory interpreted
 * (spec 8-14): descriptor, metadata, vertex tables, stream segments, the
 * codebook, exact rows and the runs that serve them. */
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "hash.h"
#include "le.h"
#include "reader_impl.h"

#define FAIL(code, off, clause, ...) fkvf_fail(&r->diag, code, off, clause, __VA_ARGS__)

/* ---- interpretation: descriptor, metadata, exact rows, streams --------------- */

static int load_desc(fkvf_reader *r, size_t i)
{
    const uint8_t *p;
    uint64_t n;
    int rc = rd_section_bytes(r, i, &p, &n);
    if (rc)
        return rc;
    fkvf_desc_raw raw;
    rc = fkvf_desc_parse(p, n, r->sections[i].e.offset, &raw, &r->diag);
    if (rc)
        return rc;
    r->desc = raw.d;
    r->model_id = fkvf_strndup(r->alloc, raw.model_id, raw.model_id_len);
    r->tokenizer_id = fkvf_strndup(r->alloc, raw.tokenizer_id, raw.tokenizer_id_len);
    if (!r->model_id || !r->tokenizer_id)
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory for descriptor strings");
    r->desc.model_id = r->model_id;
    r->desc.tokenizer_id = r->tokenizer_id;
    r->row_bytes = fkvf_desc_row_bytes(&r->desc);
    r->has_desc = 1;
    return FKVF_OK;
}

int rd_vtxs_table(fkvf_reader *r, size_t i, double **xy, uint32_t *n)
{
    const rd_section *s = &r->sections[i];
    const uint8_t *p;
    uint64_t size;
    int rc;
    if ((rc = rd_section_bytes(r, i, &p, &size)) ||
        (rc = fkvf_vtxs_parse(p, size, s->e.offset, s->e.key, n, &r->diag)))
        return rc;
    double *t = fkvf_calloc(r->alloc, 2 * (size_t)*n, sizeof(double));
    if (!t)
        return FAIL(FKVF_E_NOMEM, s->e.offset, NULL, "no memory for a vertex table");
    for (size_t k = 0; k < 2 * (size_t)*n; k++)
        t[k] = fkvf_ldf64(p + 8 + 8 * k);
    *xy = t;
    return FKVF_OK;
}

/* The codec of a segment of commit `seq`. Contexts are made in section
 * order, so a cached one never rests on a VTXS later than `seq`. */
static const fkvf_ngon *get_ngon(fkvf_reader *r, uint32_t n, double rr, uint32_t span,
                                 uint64_t seq, uint64_t at, int *rc)
{
    for (size_t i = 0; i < r->n_ngons; i++) {
        const fkvf_ngon *g = &r->ngons[i]->g;
        if (g->n == n && g->r == rr && g->span == span)
            return g;
    }
    /* the vertex table: the VTXS with key N in this commit or an earlier one
     * (spec 10.3; at most one exists) */
    size_t vi = SIZE_MAX;
    for (size_t i = 0; i < r->n_sections && r->sections[i].commit_seq <= seq; i++)
        if (r->sections[i].e.type == FKVF_SECTION_VTXS && r->sections[i].e.key == n)
            vi = i;
    if (vi == SIZE_MAX) {
        *rc = FAIL(FKVF_E_CORRUPT, at, "10.3",
                   "ngon stream with N=%u has no VTXS section in its commit or before", n);
        return NULL;
    }
    double *xy;
    uint32_t nn;
    if ((*rc = rd_vtxs_table(r, vi, &xy, &nn)))
        return NULL;
    rd_ngonctx *ctx = fkvf_calloc(r->alloc, 1, sizeof *ctx);
    size_t cap = r->n_ngons;
    if (!ctx || fkvf_grow(r->alloc, (void **)&r->ngons, &cap, r->n_ngons + 1, sizeof *r->ngons)) {
        fkvf_free(r->alloc, xy);
        fkvf_free(r->alloc, ctx);
        *rc = FAIL(FKVF_E_NOMEM, at, NULL, "no memory for an ngon context");
        return NULL;
    }
    *rc = fkvf_ngon_check_params(nn, xy, rr, span);
    if (*rc == FKVF_OK)
        *rc = fkvf_ngon_init(&ctx->g, nn, rr, span, xy, r->alloc);
    fkvf_free(r->alloc, xy);
    if (*rc) {
        fkvf_free(r->alloc, ctx);
        *rc = FAIL(*rc, at, "12.2",
                   "ngon parameters N=%u r=%.17g L=%u rejected (vertex table at %llu, r <= "
                   "r_N, L <= L_max(r))",
                   n, rr, span, (unsigned long long)r->sections[vi].e.offset);
        return NULL;
    }
    r->ngons[r->n_ngons++] = ctx;
    return &ctx->g;
}

int rd_seg_init(fkvf_reader *r, size_t i, rd_seg *g)
{
    const rd_section *sec = &r->sections[i];
    uint64_t off = sec->e.offset;
    memset(g, 0, sizeof *g);
    /* the header, then (its sizes checked against the section) the block
     * table and the padding before the data */
    uint64_t hn = sec->e.stored_size < FKVF_STRM_HDR_SIZE ? sec->e.stored_size : FKVF_STRM_HDR_SIZE;
    int rc = rd_ensure(r, off, hn);
    if (rc || (rc = fkvf_strm_hdr_parse(r->data + off, sec->e.stored_size, off, &g->h, &r->diag)))
        return rc;
    if ((rc = rd_ensure(r, off, g->h.data_off)))
        return rc;
    if (g->h.group != sec->e.key)
        return FAIL(FKVF_E_CORRUPT, off, "11.2",
                    "STRM.group %llu differs from the directory key %llu",
                    (unsigned long long)g->h.group, (unsigned long long)sec->e.key);
    g->sec = i;
    g->tracked = 0;
    g->cache_idx = 0;
    g->count = g->h.symbol_count;
    g->data_fileoff = off + g->h.data_off;
    g->data = r->data + g->data_fileoff;
    size_t nb;
    if (!fkvf_tosz(g->h.n_blocks, &nb) || !(g->block_ok = fkvf_calloc(r->alloc, nb ? nb : 1, 1)))
        return FAIL(FKVF_E_NOMEM, off, NULL, "no memory for %llu block flags",
                    (unsigned long long)g->h.n_blocks);
    return FKVF_OK;
}

/* May segment g (of section `sec`) join its group (spec 11.2, 11.6)? The
 * group takes its parameters from its first segment. */
static int seg_admit(fkvf_reader *r, const rd_section *sec, const rd_seg *g)
{
    uint64_t off = sec->e.offset;
    const fkvf_strm_hdr *h = &g->h;
    int rc = FKVF_OK;
    if (h->group == FKVF_GROUP_INDEX) {
        uint64_t want = r->has_desc ? (uint64_t)r->desc.n_layers * r->desc.n_kv_heads *
                                          (h->k_stages + h->v_stages)
                                    : 0;
        /* per-layer stage counts (spec 11.2 step 6): at most the uniform
         * count here, the exact one against the codebook (rd_check_index_streams) */
        if (r->hdr.required_features & FKVF_FEAT_LAYER_STAGES) {
            if (!r->has_desc || h->n_streams > want)
                return FAIL(FKVF_E_CORRUPT, off + 48, "11.2",
                            "STRM.n_streams %u: more than %u layers x %u heads x (%u + %u) "
                            "stages, %llu",
                            h->n_streams, r->desc.n_layers, r->desc.n_kv_heads, h->k_stages,
                            h->v_stages, (unsigned long long)want);
        } else if (!r->has_desc || h->n_streams != want)
            return FAIL(FKVF_E_CORRUPT, off + 48, "11.2",
                        "STRM.n_streams %u: %u layers x %u heads x (%u + %u) stages need %llu",
                        h->n_streams, r->desc.n_layers, r->desc.n_kv_heads, h->k_stages,
                        h->v_stages, (unsigned long long)want);
    }
    if (h->profile == FKVF_PROFILE_NGON && !(r->hdr.required_features & FKVF_FEAT_NGON))
        return FAIL(FKVF_E_CORRUPT, off + 8, "3.3",
                    "ngon stream, but the header does not declare the NGON feature");
    rd_group *s = &r->groups[h->group];
    if (!s->present) {
        if (h->profile == FKVF_PROFILE_NGON &&
            !(s->ngon = get_ngon(r, h->alphabet, h->r, h->span_symbols, sec->commit_seq, off, &rc)))
            return rc;
        s->present = 1;
        s->group = (unsigned)h->group;
        s->profile = h->profile;
        s->bits = h->bits;
        s->k_stages = h->k_stages;
        s->v_stages = h->v_stages;
        s->alphabet = h->alphabet;
        s->span = h->span_symbols;
        s->r = h->r;
        s->n_streams = h->n_streams;
    } else if (s->profile != h->profile || s->bits != h->bits || s->alphabet != h->alphabet ||
               s->span != h->span_symbols || memcmp(&s->r, &h->r, sizeof h->r) != 0 ||
               s->k_stages != h->k_stages || s->v_stages != h->v_stages ||
               s->n_streams != h->n_streams) {
        return FAIL(FKVF_E_CORRUPT, off + 8, "11.6",
                    "STRM segment parameters (codec or stages) differ from the group's earlier "
                    "segments");
    }
    if (h->first_symbol > s->length)
        return FAIL(FKVF_E_CORRUPT, off + 16, "11.6",
                    "STRM.first_symbol %llu beyond the streams' length %llu",
                    (unsigned long long)h->first_symbol, (unsigned long long)s->length);
    return FKVF_OK;
}

static int add_segment(fkvf_reader *r, size_t i)
{
    rd_seg seg;
    int rc = rd_seg_init(r, i, &seg);
    if (rc)
        return rc;
    if ((rc = seg_admit(r, &r->sections[i], &seg))) {
        fkvf_free(r->alloc, seg.block_ok);
        return rc;
    }
    rd_group *s = &r->groups[seg.h.group];
    /* cut earlier segments at first_symbol (spec 11.6) */
    while (s->n_segs) {
        rd_seg *last = &s->segs[s->n_segs - 1];
        if (last->h.first_symbol >= seg.h.first_symbol) {
            fkvf_free(r->alloc, last->block_ok);
            s->n_segs--;
            continue;
        }
        if (last->h.first_symbol + last->count > seg.h.first_symbol)
            last->count = seg.h.first_symbol - last->h.first_symbol;
        break;
    }
    if (fkvf_grow(r->alloc, (void **)&s->segs, &s->cap_segs, s->n_segs + 1, sizeof(rd_seg))) {
        fkvf_free(r->alloc, seg.block_ok);
        return FAIL(FKVF_E_NOMEM, r->sections[i].e.offset, NULL, "no memory for stream segments");
    }
    seg.tracked = 1; /* its blocks may be cached (source.c): it stays at this index */
    seg.cache_idx = s->n_segs;
    s->segs[s->n_segs++] = seg;
    s->length = seg.h.first_symbol + seg.h.symbol_count;
    return FKVF_OK;
}

/* The streams of the groups: index streams in canonical order (spec 11.2),
 * then the token stream. Streams are not materialized (a tiny file can
 * declare 2^25 of them): rd_stream_at computes one from its index. */
static int build_streams(fkvf_reader *r)
{
    r->n_streams = 0;
    for (int k = 0; k < 2; k++) {
        rd_group *g = &r->groups[k];
        if (!g->present)
            continue;
        g->stored_per_stream = 0;
        for (size_t i = 0; i < g->n_segs; i++)
            g->stored_per_stream += g->segs[i].h.stream_bytes;
        r->n_streams += g->n_streams;
    }
    return FKVF_OK;
}

int rd_stream_at(const fkvf_reader *r, size_t index, rd_stream *s)
{
    if (index >= r->n_streams)
        return FKVF_E_RANGE;
    const rd_group *ix = &r->groups[FKVF_GROUP_INDEX];
    size_t n_index = ix->present ? ix->n_streams : 0;
    memset(s, 0, sizeof *s);
    if (index >= n_index) {
        s->g = (rd_group *)&r->groups[FKVF_GROUP_TOKENS];
        s->ord = 0;
        s->id = FKVF_STREAM_ID_TOKENS;
    } else {
        s->g = (rd_group *)ix;
        s->ord = (uint32_t)index;
        if (!(r->hdr.required_features & FKVF_FEAT_LAYER_STAGES))
            s->id = fkvf_index_stream_id(r->desc.n_layers, r->desc.n_kv_heads, ix->k_stages,
                                         ix->v_stages, s->ord);
        else /* named by the codebook's layer table (spec 11.2): unknown without it */
            s->id = r->cb_known ? fkvf_index_stream_id_shape(&r->cb_shape, r->desc.n_kv_heads,
                                                             s->ord)
                                : UINT64_MAX;
    }
    s->stored_bytes = s->g->stored_per_stream;
    return FKVF_OK;
}

/* (reader_impl.h) */
int rd_cbk1_load(fkvf_reader *r)
{
    if (r->cb_kind != 1 || r->cb_known)
        return FKVF_OK;
    const uint8_t *p;
    uint64_t n;
    uint64_t off = r->sections[r->cb_sec].e.offset;
    int rc = rd_section_bytes(r, r->cb_sec, &p, &n);
    if (rc || (rc = fkvf_cbk1_parse(p, n, off,
                                    (r->hdr.required_features & FKVF_FEAT_LAYER_STAGES) != 0,
                                    &r->cb_shape, &r->diag)))
        return rc;
    if (r->cb_shape.layer_stages) {
        /* the reader's own copy: the section bytes may be a source's buffer */
        size_t tn = 2 * (size_t)r->cb_shape.n_layers;
        fkvf_free(r->alloc, r->cb_layers);
        if (!(r->cb_layers = fkvf_malloc(r->alloc, tn)))
            return FAIL(FKVF_E_NOMEM, off, NULL, "no memory for the codebook's layer table");
        memcpy(r->cb_layers, r->cb_shape.layer_stages, tn);
        r->cb_shape.layer_stages = r->cb_layers;
    }
    if (r->has_desc && !fkvf_cbk1_matches(&r->cb_shape, &r->desc))
        return FAIL(FKVF_E_CORRUPT, off, "13.7",
                    "CBK1 shape (layers %u, heads %u, dims %u/%u) does not match the "
                    "descriptor",
                    r->cb_shape.n_layers, r->cb_shape.n_heads, r->cb_shape.key_dim,
                    r->cb_shape.value_dim);
    /* the index streams' stage counts (spec 11.8), whatever n_archived */
    if ((rc = rd_check_index_streams(r, FKVF_E_CORRUPT, NULL)))
        return rc;
    r->cb_known = 1;
    return FKVF_OK;
}

/* CBK1 (spec 13.1-13.2, 13.7) or CBRF reference (spec 13.5). A CBK1 is
 * loaded here for a file or memory (its faults found at open, as cheap as
 * a mapping makes it) and deferred to the codebook's first use for a
 * source (spec 7.5 step 4: a request that needs no codebook, info over a
 * network, reads none of it). */
static int load_codebook(fkvf_reader *r)
{
    if (!r->cb_kind)
        return FKVF_OK;
    if (r->cb_kind == 1) /* with LAYER_STAGES, the layer table names the index streams */
        return r->src.read && !(r->hdr.required_features & FKVF_FEAT_LAYER_STAGES)
                   ? FKVF_OK
                   : rd_cbk1_load(r);
    const uint8_t *p;
    uint64_t n;
    uint64_t off = r->sections[r->cb_sec].e.offset;
    int rc = rd_section_bytes(r, r->cb_sec, &p, &n);
    if (rc)
        return rc;
    const uint8_t *hash, *name;
    uint32_t nl;
    if ((rc = fkvf_cbrf_parse(p, n, off, &hash, &name, &nl, &r->diag)))
        return rc;
    memcpy(r->cb_ref_hash, hash, 16);
    if (!(r->cb_ref_name = fkvf_strndup(r->alloc, name, nl)))
        return FAIL(FKVF_E_NOMEM, off, NULL, "no memory for the codebook name");
    r->cb_ref_name_len = nl;
    return FKVF_OK;
}

/* (reader_impl.h) */
int rd_check_index_streams(fkvf_reader *r, int code, const char *ext)
{
    const char *pre = ext ? "codebook " : "", *hx = ext ? ext : "", *sep = ext ? ": " : "";
    const fkvf_codebook_shape *cb = &r->cb_shape;
    const rd_group *g = &r->groups[FKVF_GROUP_INDEX];
    if (!g->present)
        return FKVF_OK; /* n_archived = 0 (checked with the stream lengths) */
    if (g->k_stages != cb->k_stages || g->v_stages != cb->v_stages)
        return FAIL(code, r->sections[g->segs[0].sec].e.offset + 10, "11.8",
                    "%s%s%sthe index streams have %u key and %u value stages, the codebook %u "
                    "and %u",
                    pre, hx, sep, g->k_stages, g->v_stages, cb->k_stages, cb->v_stages);
    uint64_t want = fkvf_index_stream_count(cb, r->desc.n_kv_heads);
    if (g->n_streams != want)
        return FAIL(code, r->sections[g->segs[0].sec].e.offset + 48, "11.8",
                    "%s%s%sthe index streams number %u, the codebook's layer table makes %llu",
                    pre, hx, sep, g->n_streams, (unsigned long long)want);
    return FKVF_OK;
}

/* Codebook, VTXS, META, EXAC and STRM sections in section order (spec 7.3). */
static int apply_sections(fkvf_reader *r)
{
    size_t ecap = 0;
    int rc;
    for (size_t i = 0; i < r->n_sections; i++) {
        rd_section *s = &r->sections[i];
        switch (s->e.type) {
        case FKVF_SECTION_CBK1:
        case FKVF_SECTION_CBRF:
            if (r->cb_kind)
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "13.7",
                            "second codebook section (the first is at %llu)",
                            (unsigned long long)r->sections[r->cb_sec].e.offset);
            if (s->e.key != 0)
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "4.3", "codebook section key %llu, must be 0",
                            (unsigned long long)s->e.key);
            if (s->e.type == FKVF_SECTION_CBRF &&
                !(r->hdr.required_features & FKVF_FEAT_EXTERNAL_CODEBOOK))
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "3.3",
                            "CBRF section, but the header does not declare EXTERNAL_CODEBOOK");
            r->cb_kind = s->e.type == FKVF_SECTION_CBK1 ? 1 : 2;
            r->cb_sec = i;
            break;
        case FKVF_SECTION_VTXS:
            /* at most one per N (spec 10.3): one bit per possible N */
            if (s->e.key < 2 || s->e.key > FKVF_MAX_NGON_N)
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "10.1", "VTXS key %llu is not an N in 2..65536",
                            (unsigned long long)s->e.key);
            if (!r->vtxs_seen &&
                !(r->vtxs_seen = fkvf_calloc(r->alloc, FKVF_MAX_NGON_N / 8 + 1, 1)))
                return FAIL(FKVF_E_NOMEM, s->e.offset, NULL, "no memory");
            if (r->vtxs_seen[s->e.key / 8] & (1u << (s->e.key % 8)))
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "10.3", "second VTXS section for N=%llu",
                            (unsigned long long)s->e.key);
            r->vtxs_seen[s->e.key / 8] |= (uint8_t)(1u << (s->e.key % 8));
            break;
        case FKVF_SECTION_META:
            if (s->e.key != 0)
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "4.3", "META key %llu, must be 0",
                            (unsigned long long)s->e.key);
            r->has_meta = 1;
            r->meta_sec = i;
            r->meta_checked = 0;
            break;
        case FKVF_SECTION_EXAC: {
            if (!r->has_desc)
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "14.2", "EXAC without a DESC section");
            const uint8_t *p;
            uint64_t n;
            /* the header is needed now; the rows are checked with the section */
            if ((rc = rd_section_bytes(r, i, &p, &n)))
                return rc;
            if (fkvf_grow(r->alloc, (void **)&r->exact, &ecap, r->n_exact + 1, sizeof(rd_exact)))
                return FAIL(FKVF_E_NOMEM, s->e.offset, NULL, "no memory");
            rd_exact *x = &r->exact[r->n_exact];
            x->sec = i;
            if ((rc = fkvf_exac_hdr_parse(p, n, s->e.offset, r->row_bytes, &x->h, &r->diag)))
                return rc;
            if (x->h.dtype != r->desc.dtype)
                return FAIL(FKVF_E_CORRUPT, s->e.offset + 16, "14.2",
                            "EXAC.dtype %u differs from DESC.dtype %u", x->h.dtype,
                            (unsigned)r->desc.dtype);
            if (s->e.key != x->h.first)
                return FAIL(FKVF_E_CORRUPT, s->e.offset, "14.2",
                            "EXAC.first_position %llu differs from the directory key %llu",
                            (unsigned long long)x->h.first, (unsigned long long)s->e.key);
            r->n_exact++;
            rd_section_drop(r, i); /* checked; its rows are read when asked for */
            break;
        }
        case FKVF_SECTION_STRM:
            if ((rc = add_segment(r, i)))
                return rc;
            break;
        default:
            break;
        }
    }
    return FKVF_OK;
}

typedef struct xevent {
    uint64_t pos;
    size_t x;
    int start;
} xevent;

static int xevent_cmp(const void *a, const void *b)
{
    const xevent *p = a, *q = b;
    return p->pos < q->pos ? -1 : p->pos > q->pos;
}

/* Which EXAC section supplies each position (spec 7.3: the last covering one
 * in section order): a sweep over range starts and ends with a max-heap of
 * the sections covering the current position. O(m log m) for m sections. */
static int build_xruns(fkvf_reader *r)
{
    size_t m = r->n_exact;
    if (!m)
        return FKVF_OK;
    xevent *ev = fkvf_calloc(r->alloc, 2 * m, sizeof *ev);
    size_t *heap = fkvf_calloc(r->alloc, m, sizeof *heap);
    uint8_t *active = fkvf_calloc(r->alloc, m, 1);
    r->xruns = fkvf_calloc(r->alloc, 2 * m, sizeof *r->xruns);
    if (!ev || !heap || !active || !r->xruns) {
        fkvf_free(r->alloc, ev);
        fkvf_free(r->alloc, heap);
        fkvf_free(r->alloc, active);
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory for %zu EXAC ranges", m);
    }
    size_t ne = 0;
    for (size_t x = 0; x < m; x++) {
        if (!r->exact[x].h.count)
            continue;
        ev[ne++] = (xevent){r->exact[x].h.first, x, 1};
        ev[ne++] = (xevent){r->exact[x].h.first + r->exact[x].h.count, x, 0};
    }
    qsort(ev, ne, sizeof *ev, xevent_cmp);
    size_t hn = 0;
    for (size_t i = 0; i < ne;) {
        uint64_t p = ev[i].pos;
        for (; i < ne && ev[i].pos == p; i++) {
            size_t x = ev[i].x;
            if (!ev[i].start) {
                active[x] = 0;
                continue;
            }
            active[x] = 1;
            size_t k = hn++; /* sift up */
            while (k && heap[(k - 1) / 2] < x) {
                heap[k] = heap[(k - 1) / 2];
                k = (k - 1) / 2;
            }
            heap[k] = x;
        }
        while (hn && !active[heap[0]]) { /* pop ended sections */
            size_t last = heap[--hn], k = 0;
            for (;;) {
                size_t c = 2 * k + 1;
                if (c >= hn)
                    break;
                if (c + 1 < hn && heap[c + 1] > heap[c])
                    c++;
                if (heap[c] <= last)
                    break;
                heap[k] = heap[c];
                k = c;
            }
            if (hn)
                heap[k] = last;
        }
        if (!hn || i >= ne)
            continue;
        uint64_t q = ev[i].pos;
        size_t owner = heap[0];
        rd_xrun *prev = r->n_xruns ? &r->xruns[r->n_xruns - 1] : NULL;
        if (prev && prev->x == owner && prev->end == p)
            prev->end = q;
        else
            r->xruns[r->n_xruns++] = (rd_xrun){p, q, owner};
    }
    fkvf_free(r->alloc, ev);
    fkvf_free(r->alloc, heap);
    fkvf_free(r->alloc, active);
    return FKVF_OK;
}

int rd_load_contents(fkvf_reader *r)
{
    size_t desc_i = SIZE_MAX;
    int rc;
    rd_commit *last = &r->commits[r->n_commits - 1];
    r->n_positions = last->dh.n_positions;
    r->n_archived = last->dh.n_archived;
    for (size_t i = 0; i < r->n_sections; i++) {
        rd_section *s = &r->sections[i];
        if (s->e.type != FKVF_SECTION_DESC)
            continue;
        if (desc_i != SIZE_MAX)
            return FAIL(FKVF_E_CORRUPT, s->e.offset, "8.2",
                        "second DESC section (the first is at %llu)",
                        (unsigned long long)r->sections[desc_i].e.offset);
        desc_i = i;
    }
    if (desc_i != SIZE_MAX) {
        const rd_section *ds = &r->sections[desc_i];
        if (ds->commit_seq != 1 || ds->e.key != 0)
            return FAIL(FKVF_E_CORRUPT, ds->e.offset, "8.3",
                        "DESC must be in commit 1 with key 0 (commit %llu, key %llu)",
                        (unsigned long long)ds->commit_seq, (unsigned long long)ds->e.key);
        if ((rc = load_desc(r, desc_i)))
            return rc;
    }
    if ((rc = apply_sections(r)))
        return rc;
    /* stream lengths (spec 11.6, 11.8) */
    for (int k = 0; k < 2; k++) {
        const rd_group *g = &r->groups[k];
        uint64_t want = k == FKVF_GROUP_TOKENS ? r->n_positions : r->n_archived;
        if (k == FKVF_GROUP_INDEX && !g->present && want)
            return FAIL(FKVF_E_CORRUPT, last->dir_off + 24, "11.8",
                        "%llu archived positions but no index streams",
                        (unsigned long long)want);
        if (g->present && g->length != want)
            return FAIL(FKVF_E_CORRUPT, r->sections[g->segs[g->n_segs - 1].sec].e.offset, "11.6",
                        "the %s %llu symbols, the last commit needs %llu",
                        k == FKVF_GROUP_TOKENS ? "token stream has" : "index streams have",
                        (unsigned long long)g->length, (unsigned long long)want);
    }
    if ((rc = build_streams(r)))
        return rc;
    if ((rc = load_codebook(r)))
        return rc;
    if (!r->has_desc) {
        if (r->n_exact || r->n_positions || r->n_streams || r->cb_kind != 1)
            return FAIL(FKVF_E_CORRUPT, FKVF_NO_OFFSET, "13.4",
                        "no DESC section, and not a codebook file (exactly one CBK1; no "
                        "streams, exact rows, CBRF or positions)");
        return FKVF_OK;
    }
    if (r->n_archived && !r->cb_kind)
        return FAIL(FKVF_E_CORRUPT, FKVF_NO_OFFSET, "13.7",
                    "%llu archived positions but no codebook section (CBK1 or CBRF)",
                    (unsigned long long)r->n_archived);
    if (r->groups[FKVF_GROUP_INDEX].present && !r->cb_kind)
        return FAIL(FKVF_E_CORRUPT, r->sections[r->groups[FKVF_GROUP_INDEX].segs[0].sec].e.offset,
                    "11.8", "index streams but no codebook section (CBK1 or CBRF)");
    /* positions (spec 14) */
    uint64_t S = r->desc.n_sinks < r->n_positions ? r->desc.n_sinks : r->n_positions;
    if (r->n_archived && (r->desc.n_sinks > r->n_positions ||
                          r->n_archived > r->n_positions - r->desc.n_sinks))
        return FAIL(FKVF_E_CORRUPT, last->dir_off + 24, "14.3",
                    "n_archived %llu does not fit after %u sinks in %llu positions",
                    (unsigned long long)r->n_archived, r->desc.n_sinks,
                    (unsigned long long)r->n_positions);
    /* every exact position must be covered (r->exact keeps section order,
     * which exact_row needs: sort a copy) */
    fkvf_range *cover = fkvf_calloc(r->alloc, r->n_exact ? r->n_exact : 1, sizeof *cover);
    if (!cover)
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory to check %zu EXAC sections",
                    r->n_exact);
    for (size_t x = 0; x < r->n_exact; x++) {
        cover[x].first = r->exact[x].h.first;
        cover[x].count = r->exact[x].h.count;
    }
    uint64_t ranges[2][2] = {{0, S}, {S + r->n_archived, r->n_positions}};
    rc = FKVF_OK;
    for (int k = 0; k < 2 && rc == FKVF_OK; k++) {
        uint64_t p = fkvf_ranges_first_gap(cover, r->n_exact, ranges[k][0], ranges[k][1]);
        if (p < ranges[k][1])
            rc = FAIL(FKVF_E_CORRUPT, FKVF_NO_OFFSET, "14.3",
                      "exact position %llu is not covered by any EXAC section",
                      (unsigned long long)p);
    }
    fkvf_free(r->alloc, cover);
    if (rc)
        return rc;
    return build_xruns(r);
}
