/* ZIDX and ZPOS search indexes (spec 20), reader side: segment access for
 * the search module and full verification of index sections. */
#include "read/zidx.h"

#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "format/zidx.h"
#include "le.h"

/* the verification's errors go to d: the reader's message, or one of
 * rd_check_par's workers' */
#define FAIL(code, off, clause, ...) fkvf_fail(d, code, off, clause, __VA_ARGS__)

FKVF_API int fkvf_reader_stream_segment(const fkvf_reader *r, size_t stream_index, size_t i,
                                        size_t *section, uint64_t *first, uint64_t *count)
{
    int rc = rd_enter(r);
    if (rc)
        return rc;
    if (!section || !first || !count)
        return FKVF_E_INVALID_ARG;
    rd_stream stv;
    if (rd_stream_at(r, stream_index, &stv))
        return FKVF_E_RANGE;
    const rd_group *g = stv.g;
    if (i >= g->n_segs)
        return FKVF_E_RANGE;
    *section = g->segs[i].sec;
    *first = g->segs[i].h.first_symbol;
    *count = g->segs[i].count;
    return FKVF_OK;
}

/* Is the index (section sec, n entries) in effect for stream st (20.4)? */
static int in_effect(const rd_stream *st, size_t sec, uint64_t n)
{
    if (n > st->g->length)
        return 0;
    for (size_t i = 0; i < st->g->n_segs; i++)
        if (st->g->segs[i].h.first_symbol < n && st->g->segs[i].sec > sec)
            return 0;
    return 1;
}

/* The key of position t (spec 20.3): quad z_t from the packed symbols pk
 * (16 zero bytes before the data), ngon morton(Q(x), Q(y)) and the point. */
static void key_of(const rd_group *g, int quad, unsigned bits, const uint8_t *pk,
                   const uint32_t *sym, uint64_t t, uint64_t *hi, uint64_t *lo, double *x,
                   double *y)
{
    if (quad) {
        uint64_t bit = (t + 1) * bits; /* window [bit - 128, bit) of the data */
        const uint8_t *q = pk + (bit >> 3);
        unsigned sh = (unsigned)(bit & 7);
        uint64_t a = fkvf_ld64(q), m = fkvf_ld64(q + 8);
        *lo = a;
        *hi = m;
        if (sh) {
            *lo = (a >> sh) | (m << (64 - sh));
            *hi = (m >> sh) | ((uint64_t)q[16] << (64 - sh));
        }
        return;
    }
    uint64_t f = t + 1 >= g->span ? t + 1 - g->span : 0;
    fkvf_ngon_encode_span(g->ngon, sym + f, (uint32_t)(t + 1 - f), x, y);
    *hi = 0;
    *lo = fkvf_zidx_morton32(fkvf_zidx_quant(*x), fkvf_zidx_quant(*y));
}

/* The stream's symbols [0, n) of index h into *sym and, for a quad stream,
 * packed into *pk (16 zero bytes before the data) for key_of. The caller
 * frees both, also on failure. */
static int index_symbols(fkvf_reader *r, size_t si, const fkvf_zidx_hdr *h, uint64_t off,
                         size_t n, uint32_t **sym, uint8_t **pk, fkvf_diag *d)
{
    uint64_t bytes = 0;
    size_t pb = 0;
    if (!(*sym = fkvf_calloc(r->alloc, n ? n : 1, sizeof **sym)))
        return FAIL(FKVF_E_NOMEM, off, NULL, "no memory to verify the index");
    int rc = rd_stream_read(r, si, 0, *sym, n);
    if (rc || h->profile != FKVF_PROFILE_QUAD)
        return rc;
    if (!fkvf_quad_data_bytes(h->n_indexed, h->bits, &bytes) || !fkvf_tosz(bytes, &pb) ||
        pb > SIZE_MAX - 64 || !(*pk = fkvf_calloc(r->alloc, pb + 40, 1)))
        return FAIL(FKVF_E_NOMEM, off, NULL, "no memory to verify the index");
    return fkvf_quad_encode(*sym, n, h->bits, *pk + 16, pb);
}

/* ZPOS (spec 20.7): positions below n_indexed; a stale index's positions
 * distinct (a permutation); an index in effect strictly ascending by the
 * (key, position) the stream gives. */
static int check_zpos(fkvf_reader *r, size_t sec, const rd_stream *st, size_t si,
                      const uint8_t *p, const fkvf_zidx_hdr *h, size_t n, fkvf_diag *d)
{
    uint64_t off = r->sections[sec].e.offset;
    const uint8_t *e0 = p + FKVF_ZIDX_HDR_SIZE;
    const rd_group *g = st->g;
    int quad = h->profile == FKVF_PROFILE_QUAD, rc = FKVF_OK;
    for (size_t i = 0; i < n; i++) {
        uint64_t t = fkvf_zpos_at(e0, h->entry_size, i);
        if (t >= h->n_indexed)
            return FAIL(FKVF_E_CORRUPT, off + FKVF_ZIDX_HDR_SIZE + i * h->entry_size, "20.7",
                        "ZPOS entry %zu: position %llu not below n_indexed %llu", i,
                        (unsigned long long)t, (unsigned long long)h->n_indexed);
    }
    uint8_t *seen = NULL, *pk = NULL;
    uint32_t *sym = NULL;
    if (!in_effect(st, sec, h->n_indexed)) {
        /* stale: its order describes symbols since replaced; a permutation still */
        if (!(seen = fkvf_calloc(r->alloc, n / 8 + 1, 1)))
            return FAIL(FKVF_E_NOMEM, off, NULL, "no memory to verify the index");
        for (size_t i = 0; i < n && rc == FKVF_OK; i++) {
            uint64_t t = fkvf_zpos_at(e0, h->entry_size, i);
            if (seen[t >> 3] & (1u << (t & 7)))
                rc = FAIL(FKVF_E_CORRUPT, off + FKVF_ZIDX_HDR_SIZE + i * h->entry_size,
                          "20.7", "ZPOS entry %zu: position %llu appears twice", i,
                          (unsigned long long)t);
            seen[t >> 3] |= (uint8_t)(1u << (t & 7));
        }
        fkvf_free(r->alloc, seen);
        return rc;
    }
    if ((rc = index_symbols(r, si, h, off, n, &sym, &pk, d)))
        goto out;
    uint64_t ph = 0, pl = 0, pt = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t t = fkvf_zpos_at(e0, h->entry_size, i), hi, lo;
        double x, y;
        key_of(g, quad, h->bits, pk, sym, t, &hi, &lo, &x, &y);
        if (i && !(ph < hi || (ph == hi && (pl < lo || (pl == lo && pt < t))))) {
            rc = FAIL(FKVF_E_CORRUPT, off + FKVF_ZIDX_HDR_SIZE + i * h->entry_size, "20.7",
                      "ZPOS entry %zu (position %llu) is not above entry %zu (position %llu) "
                      "in the (key, position) order the stream gives",
                      i, (unsigned long long)t, i - 1, (unsigned long long)pt);
            goto out;
        }
        ph = hi;
        pl = lo;
        pt = t;
    }
out:
    fkvf_free(r->alloc, sym);
    fkvf_free(r->alloc, pk);
    return rc;
}

/* The stream that index h (of section rs) names, into *si and *st: it exists,
 * with h's codec, and n_indexed is a multiple of its alignment unit (spec
 * 20.2, 20.7). *unchecked = 1 (and FKVF_OK) for an index stream named by
 * the layer table of an external codebook not attached (spec 13.5). */
static int index_stream(const fkvf_reader *r, const rd_section *rs, const fkvf_zidx_hdr *h,
                        size_t *si, rd_stream *st, int *unchecked, fkvf_diag *d)
{
    uint64_t off = rs->e.offset;
    int zpos = rs->e.type == FKVF_SECTION_ZPOS;
    const char *tn = zpos ? "ZPOS" : "ZIDX", *clause = zpos ? "20.7" : "20.2";
    int frc = rd_stream_find(r, h->stream_id, si);
    if (frc == FKVF_E_CODEBOOK) {
        *unchecked = 1;
        return FKVF_OK;
    }
    if (frc != FKVF_OK || rd_stream_at(r, *si, st))
        return fkvf_fail_replace(d, FKVF_E_CORRUPT, off, clause,
                                 "%s for stream %016llx, which does not exist", tn,
                                 (unsigned long long)h->stream_id);
    const rd_group *g = st->g;
    int same = h->profile == g->profile &&
               (g->profile == FKVF_PROFILE_QUAD
                    ? h->bits == g->bits
                    : (h->alphabet == g->alphabet && h->span == g->span &&
                       memcmp(&h->r, &g->r, sizeof h->r) == 0));
    if (!same)
        return FAIL(FKVF_E_CORRUPT, off + 8, clause,
                    "%s codec parameters differ from those of stream %016llx", tn,
                    (unsigned long long)h->stream_id);
    uint32_t u = fkvf_strm_align(g->profile, g->bits, g->span);
    if (u && h->n_indexed % u)
        return FAIL(FKVF_E_CORRUPT, off + 16, clause,
                    "%s.n_indexed %llu is not a multiple of the alignment unit %u", tn,
                    (unsigned long long)h->n_indexed, u);
    return FKVF_OK;
}

/* ZIDX (spec 20.3): the n entries' positions below n_indexed, the entries
 * strictly ascending in (key, position) order */
static int check_zidx_order(uint64_t off, const uint8_t *p, const fkvf_zidx_hdr *h, size_t n,
                            fkvf_diag *d)
{
    int quad = h->profile == FKVF_PROFILE_QUAD;
    size_t es = h->entry_size;
    const uint8_t *e0 = p + FKVF_ZIDX_HDR_SIZE;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *e = e0 + i * es;
        uint64_t t = fkvf_ld64(e + (quad ? 16 : 8));
        if (t >= h->n_indexed)
            return FAIL(FKVF_E_CORRUPT, off + FKVF_ZIDX_HDR_SIZE + i * es, "20.3",
                        "ZIDX entry %zu: position %llu not below n_indexed %llu", i,
                        (unsigned long long)t, (unsigned long long)h->n_indexed);
        if (i) {
            const uint8_t *f = e - es;
            uint64_t ph = quad ? fkvf_ld64(f + 8) : 0, pl = fkvf_ld64(f), pt = fkvf_ld64(f + (quad ? 16 : 8));
            uint64_t ch = quad ? fkvf_ld64(e + 8) : 0, cl = fkvf_ld64(e);
            int lt = ph < ch || (ph == ch && (pl < cl || (pl == cl && pt < t)));
            if (!lt)
                return FAIL(FKVF_E_CORRUPT, off + FKVF_ZIDX_HDR_SIZE + i * es, "20.3",
                            "ZIDX entry %zu is not above entry %zu in (key, position) order", i,
                            i - 1);
        }
    }
    return FKVF_OK;
}

/* 1 when ZIDX entry e (position t) holds the key the stream gives t: quad
 * z_t; ngon morton(Q(x), Q(y)) and the point (x, y) (spec 20.3) */
static int entry_key_ok(const rd_group *g, const fkvf_zidx_hdr *h, const uint8_t *pk,
                        const uint32_t *sym, const uint8_t *e, uint64_t t)
{
    uint64_t hi, lo;
    double x, y;
    if (h->profile == FKVF_PROFILE_QUAD) {
        key_of(g, 1, h->bits, pk, sym, t, &hi, &lo, &x, &y);
        return lo == fkvf_ld64(e) && hi == fkvf_ld64(e + 8);
    }
    key_of(g, 0, h->bits, pk, sym, t, &hi, &lo, &x, &y);
    uint64_t xb, yb;
    memcpy(&xb, &x, 8);
    memcpy(&yb, &y, 8);
    return fkvf_ld64(e + 16) == xb && fkvf_ld64(e + 24) == yb && fkvf_ld64(e) == lo;
}

/* ZIDX in effect (spec 20.3): every entry's key recomputed from the stream */
static int check_zidx_keys(fkvf_reader *r, size_t si, const rd_stream *st, uint64_t off,
                           const uint8_t *p, const fkvf_zidx_hdr *h, size_t n, fkvf_diag *d)
{
    int quad = h->profile == FKVF_PROFILE_QUAD;
    size_t es = h->entry_size;
    const uint8_t *e0 = p + FKVF_ZIDX_HDR_SIZE;
    uint32_t *sym = NULL;
    uint8_t *pk = NULL;
    int rc = index_symbols(r, si, h, off, n, &sym, &pk, d);
    for (size_t i = 0; i < n && !rc; i++) {
        const uint8_t *e = e0 + i * es;
        uint64_t t = fkvf_ld64(e + (quad ? 16 : 8));
        if (!entry_key_ok(st->g, h, pk, sym, e, t))
            rc = FAIL(FKVF_E_CORRUPT, off + FKVF_ZIDX_HDR_SIZE + i * es, "20.3",
                      "ZIDX entry %zu: the key of position %llu differs from the stream's "
                      "point",
                      i, (unsigned long long)t);
    }
    fkvf_free(r->alloc, sym);
    fkvf_free(r->alloc, pk);
    return rc;
}

/* index section sec: its header, its stream, then ZPOS or ZIDX entries.
 * An item of rd_check_par: every section's checksum and every stream block
 * were verified before (fkvf_reader_verify), so on a reader that is not a
 * source the section bytes and stream reads below only read. */
static int check_one(fkvf_reader *r, void *ctx, size_t sec, fkvf_diag *d)
{
    (void)ctx;
    const rd_section *rs = &r->sections[sec];
    if (!fkvf_zidx_is_index(rs->e.type))
        return FKVF_OK;
    uint64_t off = rs->e.offset;
    if (rs->e.flags & FKVF_SECTION_DEFLATE)
        return FAIL(FKVF_E_CORRUPT, off, "20.1", "%s section with the DEFLATE flag",
                    rs->e.type == FKVF_SECTION_ZPOS ? "ZPOS" : "ZIDX");
    const uint8_t *p;
    uint64_t size;
    int rc = rd_section_bytes(r, sec, &p, &size);
    if (rc)
        return rc;
    fkvf_zidx_hdr h;
    if ((rc = fkvf_zidx_hdr_parse(rs->e.type, p, size, rs->e.key, off, &h, d)))
        return rc;
    size_t si;
    rd_stream st;
    int unchecked = 0;
    if ((rc = index_stream(r, rs, &h, &si, &st, &unchecked, d)) || unchecked)
        return rc;
    size_t n;
    if (!fkvf_tosz(h.n_indexed, &n))
        return FAIL(FKVF_E_NOMEM, off, NULL, "index too large for this address space");
    if (rs->e.type == FKVF_SECTION_ZPOS)
        return check_zpos(r, sec, &st, si, p, &h, n, d);
    if ((rc = check_zidx_order(off, p, &h, n, d)))
        return rc;
    if (!in_effect(&st, sec, h.n_indexed))
        return FKVF_OK; /* stale (20.4): its keys describe symbols since replaced */
    return check_zidx_keys(r, si, &st, off, p, &h, n, d);
}

int rd_zidx_verify(fkvf_reader *r)
{
    return rd_check_par(r, r->n_sections, r->committed_size, check_one, NULL);
}
