/* Suffix search on the archive's streams (fkvf.h "search"; spec 12.1.5,
 * 12.2.7, 19). Uses the reader through the public API only, the codecs of
 * codec/ for points, and format/zidx.h for the index layout. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "codec/codec.h"
#include "error.h"
#include "handle.h"
#include "fkvf.h"
#include "format/zidx.h"
#include "le.h"
#include "search/zidx_legacy.h"

#define PAD 16                            /* zero bytes before and after the packed tail */
#define ZSAMPLE 32 /* ZPOS: one key in memory per 32 entries (0.5 B per position, quad) */

struct fkvf_search {
    fkvf_handle h; /* kind FKVF_HANDLE_SEARCH; always OPEN */
    const fkvf_allocator *alloc;
    fkvf_diag diag;
    fkvf_reader *r;
    size_t stream;
    fkvf_stream_info si;
    int quad;
    unsigned b;     /* quad symbol bits */
    uint32_t cap;   /* symbols a point determines: quad floor(128/b), ngon L */
    uint32_t alpha; /* ngon N (quad: 0 = 2^32) */
    uint64_t n;     /* stream length */

    /* index in use (spec 20): entries zero-copy in the reader's memory */
    const uint8_t *ix;
    uint64_t n_idx;
    size_t ix_sec;
    uint64_t ix_off;
    size_t es;
    int zpos; /* the index is a ZPOS (positions only): keys computed from the points */
    uint64_t *skey; /* ZPOS: the key of every ZSAMPLE-th entry (hi, lo pairs; ngon lo) */
    uint64_t n_skey;

    /* tail: positions [scan0, n) are scanned; symbols from base are held
     * (base = 0 with a ZPOS index: every indexed position's key is needed) */
    uint64_t base, scan0;
    uint8_t *pk; /* quad: PAD zeros, symbols [base, n) packed, PAD + 8 zeros */
    size_t pk_data;
    uint32_t *sym;   /* ngon: symbols [base, n) */
    double *px, *py; /* ngon: points of positions [pt0, n) */
    uint64_t pt0;    /* scan0, or 0 with a ZPOS index */
    fkvf_ngon g;
    int has_g;

    uint64_t last_cand, last_ver;

    /* scratch */
    uint64_t *res;
    size_t res_n, res_cap;
    fkvf_match *mt;
    size_t mt_n, mt_cap;
};

#define FAIL(code, clause, ...) fkvf_fail(&s->diag, code, FKVF_NO_OFFSET, clause, __VA_ARGS__)

/* ---- small helpers ------------------------------------------------------ */

static unsigned clz64(uint64_t v) { return v ? (unsigned)__builtin_clzll(v) : 64u; }
static unsigned clz128(uint64_t hi, uint64_t lo) { return hi ? clz64(hi) : 64u + clz64(lo); }

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_match(const void *a, const void *b)
{
    const fkvf_match *x = a, *y = b;
    if (x->length != y->length)
        return x->length > y->length ? -1 : 1;
    return (x->position > y->position) - (x->position < y->position);
}

static int res_push(fkvf_search *s, uint64_t t)
{
    if (s->res_n == s->res_cap &&
        fkvf_grow(s->alloc, (void **)&s->res, &s->res_cap, s->res_n + 1, sizeof *s->res))
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for results");
    s->res[s->res_n++] = t;
    return FKVF_OK;
}

static int mt_push(fkvf_search *s, uint64_t t, uint64_t len)
{
    if (s->mt_n == s->mt_cap &&
        fkvf_grow(s->alloc, (void **)&s->mt, &s->mt_cap, s->mt_n + 1, sizeof *s->mt))
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for results");
    s->mt[s->mt_n].position = t;
    s->mt[s->mt_n].length = len;
    s->mt_n++;
    return FKVF_OK;
}

static int sym_ok(const fkvf_search *s, uint32_t c)
{
    if (s->quad)
        return s->b >= 32 || c < ((uint32_t)1 << s->b);
    return c < s->alpha;
}

/* The part of q after its last symbol outside the alphabet. */
static size_t valid_tail(const fkvf_search *s, const uint32_t *q, size_t len)
{
    size_t k = len;
    while (k > 0 && sym_ok(s, q[k - 1]))
        k--;
    return len - k;
}

/* Symbols [first, first + cnt) of the stream: from the tail buffer when held,
 * else through the reader (which touches only the blocks holding them). */
static int get_syms(fkvf_search *s, uint64_t first, size_t cnt, uint32_t *out)
{
    if (first >= s->base && (s->quad ? s->pk != NULL : s->sym != NULL)) {
        uint64_t a = first - s->base;
        if (s->quad)
            return fkvf_quad_decode(s->pk + PAD, s->pk_data, s->b, a, cnt, out);
        memcpy(out, s->sym + a, cnt * sizeof *out);
        return FKVF_OK;
    }
    int rc = fkvf_reader_stream_read(s->r, s->stream, first, out, cnt);
    if (rc)
        return FAIL(rc, NULL, "%s", fkvf_reader_message(s->r));
    return FKVF_OK;
}

/* Match length at t, given that the last l0 symbols already agree:
 * continue backwards up to min(qlen, t + 1). */
static int extend(fkvf_search *s, uint64_t t, const uint32_t *q, size_t qlen, uint64_t l0,
                  uint64_t *out)
{
    uint64_t lim = qlen < t + 1 ? qlen : t + 1, l = l0;
    uint32_t buf[64];
    while (l < lim) {
        size_t c = lim - l < 64 ? (size_t)(lim - l) : 64;
        uint64_t first = t + 1 - l - c; /* symbols [first, t - l] */
        int rc = get_syms(s, first, c, buf);
        if (rc)
            return rc;
        for (size_t i = 0; i < c; i++) {
            if (buf[c - 1 - i] != q[qlen - 1 - l])
                goto done;
            l++;
        }
    }
done:
    *out = l;
    return FKVF_OK;
}

/* ---- quad keys (spec 12.1.5) -------------------------------------------- */

/* z_t of position t >= scan0 (or any t >= base when base == 0). */
static inline void qkey_at(const fkvf_search *s, uint64_t t, uint64_t *hi, uint64_t *lo)
{
    uint64_t e = (t + 1 - s->base) * s->b; /* data bit after the window; +128 for PAD */
    const uint8_t *p = s->pk + (e >> 3);
    unsigned sh = (unsigned)(e & 7);
    uint64_t a = fkvf_ld64(p), m = fkvf_ld64(p + 8);
    if (!sh) {
        *lo = a;
        *hi = m;
        return;
    }
    uint64_t c = p[16];
    *lo = (a >> sh) | (m << (64 - sh));
    *hi = (m >> sh) | (c << (64 - sh));
}

/* 8-bit quad streams: the stored bytes are the symbols (spec 12.1.4), so
 * the next position >= t whose symbol is c is a memchr away (a vectorized
 * scan of the stored points); n when there is none. */
static inline uint64_t next8(const fkvf_search *s, uint64_t t, uint32_t c)
{
    const uint8_t *d = s->pk + PAD;
    const uint8_t *p = memchr(d + (t - s->base), (int)c, (size_t)(s->n - t));
    return p ? s->base + (uint64_t)(p - d) : s->n;
}

/* Key of the last m symbols of q (m <= cap), zeros below. */
static void qkey_query(const fkvf_search *s, const uint32_t *q, size_t len, size_t m, uint64_t *hi,
                       uint64_t *lo)
{
    *hi = *lo = 0;
    for (size_t i = 0; i < m; i++) {
        uint64_t c = q[len - 1 - i];
        unsigned pos = 128u - (unsigned)(i + 1) * s->b;
        if (pos >= 64)
            *hi |= c << (pos - 64);
        else if (pos + s->b <= 64)
            *lo |= c << pos;
        else {
            *lo |= c << pos;
            *hi |= c >> (64 - pos);
        }
    }
}

/* Mask of the top m*b bits. */
static void top_mask(unsigned bits, uint64_t *mhi, uint64_t *mlo)
{
    if (bits == 0) {
        *mhi = *mlo = 0;
    } else if (bits <= 64) {
        *mhi = bits == 64 ? UINT64_MAX : ~(UINT64_MAX >> bits);
        *mlo = 0;
    } else {
        *mhi = UINT64_MAX;
        *mlo = bits == 128 ? UINT64_MAX : ~(UINT64_MAX >> (bits - 64));
    }
}

/* ---- index entries ------------------------------------------------------ */

static inline const uint8_t *ent(const fkvf_search *s, uint64_t i)
{
    return s->ix + FKVF_ZIDX_HDR_SIZE + (size_t)i * s->es;
}

/* Position of entry i, unchecked (ZPOS: checked when the index was loaded;
 * ZIDX: ent_pos checks it before use). */
static inline uint64_t ent_t(const fkvf_search *s, uint64_t i)
{
    const uint8_t *e = ent(s, i);
    if (s->zpos)
        return s->es == FKVF_ZPOS_ENTRY32 ? fkvf_ld32(e) : fkvf_ld64(e);
    return fkvf_ld64(e + (s->quad ? 16 : 8));
}

/* The key of entry i: stored (ZIDX) or computed from its position's point
 * (ZPOS, spec 20.7); ngon: in *lo, *hi = 0. */
static inline void ent_key(const fkvf_search *s, uint64_t i, uint64_t *hi, uint64_t *lo)
{
    if (s->zpos) {
        uint64_t t = ent_t(s, i);
        if (s->quad) {
            qkey_at(s, t, hi, lo);
        } else {
            *hi = 0;
            *lo = fkvf_zidx_morton32(fkvf_zidx_quant(s->px[t]), fkvf_zidx_quant(s->py[t]));
        }
        return;
    }
    const uint8_t *e = ent(s, i);
    *hi = s->quad ? fkvf_ld64(e + 8) : 0;
    *lo = fkvf_ld64(e);
}

/* ngon: the point of entry i. */
static inline void ent_xy(const fkvf_search *s, uint64_t i, double *x, double *y)
{
    if (s->zpos) {
        uint64_t t = ent_t(s, i);
        *x = s->px[t];
        *y = s->py[t];
        return;
    }
    const uint8_t *e = ent(s, i);
    *x = fkvf_ldf64(e + 16);
    *y = fkvf_ldf64(e + 24);
}

static inline int key_lt(const fkvf_search *s, uint64_t i, uint64_t hi, uint64_t lo)
{
    uint64_t eh, el;
    ent_key(s, i, &eh, &el);
    if (s->quad)
        return eh < hi || (eh == hi && el < lo);
    return el < lo;
}

static inline int skey_lt(const fkvf_search *s, uint64_t j, uint64_t hi, uint64_t lo)
{
    if (s->quad) {
        uint64_t eh = s->skey[2 * j], el = s->skey[2 * j + 1];
        return eh < hi || (eh == hi && el < lo);
    }
    return s->skey[j] < lo;
}

/* First entry with key >= (hi, lo) (ngon: lo only). With a ZPOS index the
 * sampled keys narrow the range to ZSAMPLE - 1 entries first, so that few
 * probes compute a key from the stream; the answer is the same. */
static uint64_t lower_bound(const fkvf_search *s, uint64_t hi, uint64_t lo)
{
    uint64_t a = 0, b = s->n_idx;
    if (s->skey) {
        uint64_t ja = 0, jb = s->n_skey; /* first sample with key >= (hi, lo) */
        while (ja < jb) {
            uint64_t m = ja + (jb - ja) / 2;
            if (skey_lt(s, m, hi, lo))
                ja = m + 1;
            else
                jb = m;
        }
        if (ja == 0)
            return 0; /* key(0) >= (hi, lo) */
        a = (ja - 1) * ZSAMPLE + 1; /* key((ja - 1) * ZSAMPLE) < (hi, lo) */
        b = ja < s->n_skey ? ja * ZSAMPLE : s->n_idx;
    }
    while (a < b) {
        uint64_t m = a + (b - a) / 2;
        if (key_lt(s, m, hi, lo))
            a = m + 1;
        else
            b = m;
    }
    return a;
}

/* First entry with key > (hi, lo). */
static uint64_t upper_bound(const fkvf_search *s, uint64_t hi, uint64_t lo)
{
    if (lo == UINT64_MAX && (!s->quad || hi == UINT64_MAX))
        return s->n_idx;
    if (lo == UINT64_MAX)
        return lower_bound(s, hi + 1, 0);
    return lower_bound(s, hi, lo + 1);
}

static int ent_pos(fkvf_search *s, uint64_t i, uint64_t *t)
{
    *t = ent_t(s, i);
    if (*t >= s->n_idx)
        return fkvf_fail(&s->diag, FKVF_E_CORRUPT, s->ix_off + FKVF_ZIDX_HDR_SIZE + i * s->es,
                         "20.3", "ZIDX entry %llu: position %llu not below n_indexed %llu",
                         (unsigned long long)i, (unsigned long long)*t,
                         (unsigned long long)s->n_idx);
    return FKVF_OK;
}

/* ---- points ------------------------------------------------------------- */

/* Candidate test of position t's point against (qx, qy): quad coordinates
 * as u64 fixed point, ngon binary64. */
static inline int quad_near(uint64_t x, uint64_t y, uint64_t qx, uint64_t qy, double r2)
{
    double dx = ldexp((double)(x > qx ? x - qx : qx - x), -64);
    double dy = ldexp((double)(y > qy ? y - qy : qy - y), -64);
    return dx * dx + dy * dy <= r2;
}

static inline int ngon_near(double x, double y, double qx, double qy, double r2)
{
    double dx = x - qx, dy = y - qy;
    return dx * dx + dy * dy <= r2;
}

FKVF_API int fkvf_search_query_point(const fkvf_search *s, const uint32_t *q, size_t len,
                                     fkvf_point *out)
{
    if (!FKVF_HANDLE_IS(s, FKVF_HANDLE_SEARCH))
        return FKVF_E_STATE;
    if (!out || (!q && len))
        return FKVF_E_INVALID_ARG;
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < len; i++)
        if (!sym_ok(s, q[i]))
            return FKVF_E_SYMBOL;
    size_t m = len < s->cap ? len : s->cap;
    if (s->quad) {
        uint64_t hi, lo;
        qkey_query(s, q, len, m, &hi, &lo);
        fkvf_zidx_unmorton64(hi, lo, &out->x, &out->y);
    } else if (m) {
        fkvf_ngon_encode_span(&s->g, q + len - m, (uint32_t)m, &out->fx, &out->fy);
    }
    return FKVF_OK;
}

FKVF_API double fkvf_search_default_radius(const fkvf_search *s, size_t len)
{
    if (!FKVF_HANDLE_IS(s, FKVF_HANDLE_SEARCH))
        return 0.0;
    size_t m = len < s->cap ? len : s->cap;
    if (s->quad)
        return sqrt(2.0) * ldexp(1.0, -(int)(m * s->b / 2));
    return pow(s->si.r, (double)m) * (1.0 + 1e-6) + 1e-13;
}

/* Index entries whose point lies within radius of (qx, qy): the cells of
 * the largest level whose size is at least 2 * radius around the query
 * point, each a contiguous range of the Morton order (spec 20.5). Calls
 * fn for every entry found within the radius. */
typedef int (*hit_fn)(fkvf_search *s, uint64_t t, void *ctx);

static int index_disc(fkvf_search *s, const fkvf_point *qp, double radius, hit_fn fn, void *ctx)
{
    double r2 = radius * radius;
    if (s->quad) {
        unsigned m = 0;
        while (m < 64 && ldexp(1.0, -(int)(m + 1)) >= 2.0 * radius)
            m++;
        double rf = ldexp(radius, 64);
        uint64_t rr = rf >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)ceil(rf);
        uint64_t xl = qp->x > rr ? qp->x - rr : 0, xh = UINT64_MAX - qp->x > rr ? qp->x + rr : UINT64_MAX;
        uint64_t yl = qp->y > rr ? qp->y - rr : 0, yh = UINT64_MAX - qp->y > rr ? qp->y + rr : UINT64_MAX;
        uint64_t cx0 = m ? xl >> (64 - m) : 0, cx1 = m ? xh >> (64 - m) : 0;
        uint64_t cy0 = m ? yl >> (64 - m) : 0, cy1 = m ? yh >> (64 - m) : 0;
        for (uint64_t cx = cx0;; cx++) {
            for (uint64_t cy = cy0;; cy++) {
                uint64_t khi, klo, mhi, mlo;
                fkvf_zidx_morton64(m ? cx << (64 - m) : 0, m ? cy << (64 - m) : 0, &khi, &klo);
                top_mask(2 * m, &mhi, &mlo);
                uint64_t a = lower_bound(s, khi, klo), b = upper_bound(s, khi | ~mhi, klo | ~mlo);
                for (uint64_t i = a; i < b; i++) {
                    uint64_t x, y, t, eh, el;
                    ent_key(s, i, &eh, &el);
                    fkvf_zidx_unmorton64(eh, el, &x, &y);
                    if (!quad_near(x, y, qp->x, qp->y, r2))
                        continue;
                    int rc = ent_pos(s, i, &t);
                    if (rc || (rc = fn(s, t, ctx)))
                        return rc;
                }
                if (cy == cy1)
                    break;
            }
            if (cx == cx1)
                break;
        }
        return FKVF_OK;
    }
    unsigned m = 0;
    while (m < 32 && ldexp(1.0, -(int)m) >= 2.0 * radius) /* cell width 2^(1-(m+1)) */
        m++;
    uint32_t xl = fkvf_zidx_quant(qp->fx - radius), xh = fkvf_zidx_quant(qp->fx + radius);
    uint32_t yl = fkvf_zidx_quant(qp->fy - radius), yh = fkvf_zidx_quant(qp->fy + radius);
    uint32_t cx0 = m ? xl >> (32 - m) : 0, cx1 = m ? xh >> (32 - m) : 0;
    uint32_t cy0 = m ? yl >> (32 - m) : 0, cy1 = m ? yh >> (32 - m) : 0;
    uint64_t span = 2 * m == 64 ? 0 : UINT64_MAX >> (2 * m);
    for (uint32_t cx = cx0;; cx++) {
        for (uint32_t cy = cy0;; cy++) {
            uint64_t k = fkvf_zidx_morton32(m ? cx << (32 - m) : 0, m ? cy << (32 - m) : 0);
            uint64_t a = lower_bound(s, 0, k), b = upper_bound(s, 0, k | span);
            for (uint64_t i = a; i < b; i++) {
                uint64_t t;
                double ex, ey;
                ent_xy(s, i, &ex, &ey);
                if (!ngon_near(ex, ey, qp->fx, qp->fy, r2))
                    continue;
                int rc = ent_pos(s, i, &t);
                if (rc || (rc = fn(s, t, ctx)))
                    return rc;
            }
            if (cy == cy1)
                break;
        }
        if (cx == cx1)
            break;
    }
    return FKVF_OK;
}

/* Tail positions whose point lies within radius. */
static int scan_disc(fkvf_search *s, const fkvf_point *qp, double radius, hit_fn fn, void *ctx)
{
    double r2 = radius * radius;
    for (uint64_t t = s->scan0; t < s->n; t++) {
        int near;
        if (s->quad) {
            uint64_t hi, lo, x, y;
            qkey_at(s, t, &hi, &lo);
            fkvf_zidx_unmorton64(hi, lo, &x, &y);
            near = quad_near(x, y, qp->x, qp->y, r2);
        } else {
            near = ngon_near(s->px[t - s->pt0], s->py[t - s->pt0], qp->fx, qp->fy, r2);
        }
        if (near) {
            int rc = fn(s, t, ctx);
            if (rc)
                return rc;
        }
    }
    return FKVF_OK;
}

/* ---- queries ------------------------------------------------------------ */

typedef struct verify_ctx {
    const uint32_t *q;
    size_t len;
} verify_ctx;

/* Candidate t: keep it when its last len symbols equal q. */
static int hit_verify(fkvf_search *s, uint64_t t, void *vctx)
{
    const verify_ctx *c = vctx;
    s->last_cand++;
    if (t + 1 < c->len)
        return FKVF_OK;
    uint64_t l;
    int rc = extend(s, t, c->q, c->len, 0, &l);
    if (rc)
        return rc;
    if (l >= c->len) {
        s->last_ver++;
        return res_push(s, t);
    }
    return FKVF_OK;
}

static int enter(fkvf_search *s)
{
    int rc = FKVF_HANDLE_ENTER(s, FKVF_HANDLE_SEARCH, "search");
    if (rc)
        return rc;
    s->last_cand = s->last_ver = 0;
    s->res_n = 0;
    s->mt_n = 0;
    return FKVF_OK;
}

static void give(const fkvf_search *s, uint64_t *out, size_t cap)
{
    size_t k = s->res_n < cap ? s->res_n : cap;
    if (k)
        memcpy(out, s->res, k * sizeof *out);
}

/* Exact suffix: quad by key range (index) and masked key compare (scan);
 * ngon by the disc that holds every match (index and scan), all verified. */
FKVF_API int fkvf_search_suffix(fkvf_search *s, const uint32_t *q, size_t len, uint64_t *out,
                                size_t cap, uint64_t *n_found)
{
    int rc = enter(s);
    if (rc)
        return rc;
    if (!q || !len || !n_found || (!out && cap))
        return FKVF_E_INVALID_ARG;
    *n_found = 0;
    if (valid_tail(s, q, len) < len || len > s->n)
        return FKVF_OK;
    size_t m = len < s->cap ? len : s->cap;
    verify_ctx vc = {q, len};
    if (!s->quad) {
        fkvf_point qp;
        if ((rc = fkvf_search_query_point(s, q, len, &qp)))
            return rc;
        double rad = fkvf_search_default_radius(s, len);
        if ((s->n_idx && (rc = index_disc(s, &qp, rad, hit_verify, &vc))) ||
            (rc = scan_disc(s, &qp, rad, hit_verify, &vc)))
            return rc;
    } else {
        uint64_t qh, ql, mh, ml;
        qkey_query(s, q, len, m, &qh, &ql);
        top_mask((unsigned)(m * s->b), &mh, &ml);
        if (s->n_idx) {
            uint64_t a = lower_bound(s, qh, ql), b = upper_bound(s, qh | ~mh, ql | ~ml);
            for (uint64_t i = a; i < b; i++) {
                uint64_t t;
                if ((rc = ent_pos(s, i, &t)))
                    return rc;
                if (len <= m) {
                    s->last_cand++;
                    if (t + 1 >= len) {
                        s->last_ver++;
                        if ((rc = res_push(s, t)))
                            return rc;
                    }
                } else if ((rc = hit_verify(s, t, &vc))) {
                    return rc;
                }
            }
        }
        uint64_t t0 = s->scan0 > len - 1 ? s->scan0 : len - 1;
        const uint32_t last = q[len - 1];
        if (ml == 0 && len <= m) {
            for (uint64_t t = t0; t < s->n; t++) { /* <= 64 key bits: one word */
                if (s->b == 8 && (t = next8(s, t, last)) >= s->n)
                    break;
                uint64_t hi, lo;
                qkey_at(s, t, &hi, &lo);
                if ((hi ^ qh) & mh)
                    continue;
                s->last_cand++;
                s->last_ver++;
                if ((rc = res_push(s, t)))
                    return rc;
            }
        } else {
            for (uint64_t t = t0; t < s->n; t++) {
                if (s->b == 8 && (t = next8(s, t, last)) >= s->n)
                    break;
                uint64_t hi, lo;
                qkey_at(s, t, &hi, &lo);
                if (((hi ^ qh) & mh) | ((lo ^ ql) & ml))
                    continue;
                if (len <= m) {
                    s->last_cand++;
                    s->last_ver++;
                    if ((rc = res_push(s, t)))
                        return rc;
                } else if ((rc = hit_verify(s, t, &vc))) {
                    return rc;
                }
            }
        }
    }
    if (s->n_idx && s->res_n > 1)
        qsort(s->res, s->res_n, sizeof *s->res, cmp_u64);
    *n_found = s->res_n;
    give(s, out, cap);
    return FKVF_OK;
}

FKVF_API int fkvf_search_radius(fkvf_search *s, const uint32_t *q, size_t len, double radius,
                                uint64_t *out, size_t cap, fkvf_radius_result *res)
{
    int rc = enter(s);
    if (rc)
        return rc;
    if (!q || !len || !res || (!out && cap) || isnan(radius))
        return FKVF_E_INVALID_ARG;
    memset(res, 0, sizeof *res);
    if (!(radius > 0.0))
        radius = fkvf_search_default_radius(s, len);
    res->radius = radius;
    if (valid_tail(s, q, len) < len)
        return FKVF_OK; /* no point: nothing is near it */
    fkvf_point qp;
    if ((rc = fkvf_search_query_point(s, q, len, &qp)))
        return rc;
    verify_ctx vc = {q, len};
    if ((s->n_idx && (rc = index_disc(s, &qp, radius, hit_verify, &vc))) ||
        (rc = scan_disc(s, &qp, radius, hit_verify, &vc)))
        return rc;
    if (s->res_n > 1)
        qsort(s->res, s->res_n, sizeof *s->res, cmp_u64);
    res->candidates = s->last_cand;
    res->verified = s->last_ver;
    give(s, out, cap);
    return FKVF_OK;
}

/* ---- longest match ------------------------------------------------------ */

typedef struct level_ctx {
    const uint32_t *q;
    size_t len;
    uint64_t level, top;
    uint64_t got; /* collected with length >= level */
} level_ctx;

/* ngon level: keep t when its match length is exactly the level (or at
 * least the top level). */
static int hit_level(fkvf_search *s, uint64_t t, void *vctx)
{
    level_ctx *c = vctx;
    s->last_cand++;
    uint64_t l;
    int rc = extend(s, t, c->q, c->len, 0, &l);
    if (rc)
        return rc;
    if (l == c->level || (c->level == c->top && l >= c->top)) {
        s->last_ver++;
        c->got++;
        return mt_push(s, t, l);
    }
    return FKVF_OK;
}

/* Quad match length at t from its key (and decoding beyond the key). */
static int quad_len(fkvf_search *s, uint64_t t, uint64_t hi, uint64_t lo, uint64_t qh, uint64_t ql,
                    size_t m, const uint32_t *q, size_t len, uint64_t *out)
{
    uint64_t l = clz128(hi ^ qh, lo ^ ql) / s->b;
    if (l > m)
        l = m;
    if (l > t + 1)
        l = t + 1;
    if (l == s->cap && len > s->cap && t + 1 > l)
        return extend(s, t, q, len, l, out);
    *out = l;
    return FKVF_OK;
}

FKVF_API int fkvf_search_longest(fkvf_search *s, const uint32_t *q, size_t len, size_t k,
                                 fkvf_match *out, size_t *n_out)
{
    int rc = enter(s);
    if (rc)
        return rc;
    if (!q || !n_out || (!out && k))
        return FKVF_E_INVALID_ARG;
    *n_out = 0;
    size_t vl = valid_tail(s, q, len);
    q += len - vl;
    len = vl;
    if (!len || !k || !s->n)
        return FKVF_OK;
    size_t m = len < s->cap ? len : s->cap;
    uint64_t qh = 0, ql = 0;
    if (s->quad)
        qkey_query(s, q, len, m, &qh, &ql);
    /* indexed part: levels from the longest down, until k positions of at
     * least the current level are known */
    if (s->n_idx && s->quad) {
        uint64_t pa = 0, pb = 0, got = 0; /* range of the level above */
        for (uint64_t lev = m; lev >= 1; lev--) {
            uint64_t kh, kl, mh, ml;
            qkey_query(s, q, len, (size_t)lev, &kh, &kl);
            top_mask((unsigned)(lev * s->b), &mh, &ml);
            uint64_t a = lower_bound(s, kh, kl), b = upper_bound(s, kh | ~mh, kl | ~ml);
            for (uint64_t i = a; i < b; i++) {
                if (lev < m && i == pa && pb > pa) { /* skip the level above */
                    i = pb - 1;
                    continue;
                }
                uint64_t t, hi, lo, l;
                if ((rc = ent_pos(s, i, &t)))
                    return rc;
                ent_key(s, i, &hi, &lo);
                s->last_cand++;
                if ((rc = quad_len(s, t, hi, lo, qh, ql, m, q, len, &l)))
                    return rc;
                if (l) {
                    s->last_ver++;
                    if ((rc = mt_push(s, t, l)))
                        return rc;
                }
                if (l >= lev)
                    got++;
            }
            pa = a;
            pb = b;
            if (got >= k)
                break;
        }
    } else if (s->n_idx) {
        level_ctx c = {q, len, m, m, 0};
        for (uint64_t lev = m; lev >= 1; lev--) {
            fkvf_point qp;
            c.level = lev;
            fkvf_ngon_encode_span(&s->g, q + len - lev, (uint32_t)lev, &qp.fx, &qp.fy);
            double rad = fkvf_search_default_radius(s, (size_t)lev);
            if ((rc = index_disc(s, &qp, rad, hit_level, &c)))
                return rc;
            if (c.got >= k)
                break;
        }
    }
    /* scanned part: every position's length */
    for (uint64_t t = s->scan0; t < s->n; t++) {
        uint64_t l;
        if (s->quad) {
            if (s->b == 8 && (t = next8(s, t, q[len - 1])) >= s->n)
                break;
            uint64_t hi, lo;
            qkey_at(s, t, &hi, &lo);
            if ((hi ^ qh) >> (64 - s->b))
                continue;
            if ((rc = quad_len(s, t, hi, lo, qh, ql, m, q, len, &l)))
                return rc;
        } else {
            if (s->sym[t - s->base] != q[len - 1])
                continue;
            if ((rc = extend(s, t, q, len, 1, &l)))
                return rc;
        }
        s->last_cand++;
        s->last_ver++;
        if ((rc = mt_push(s, t, l)))
            return rc;
    }
    if (s->mt_n > 1)
        qsort(s->mt, s->mt_n, sizeof *s->mt, cmp_match);
    size_t nk = s->mt_n < k ? s->mt_n : k;
    if (nk)
        memcpy(out, s->mt, nk * sizeof *out);
    *n_out = nk;
    return FKVF_OK;
}

/* ---- open --------------------------------------------------------------- */

static int load_ngon(fkvf_search *s)
{
    fkvf_archive_info ai;
    int rc = fkvf_reader_info(s->r, &ai);
    if (rc)
        return FAIL(rc, NULL, "%s", fkvf_reader_message(s->r));
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        if (fkvf_reader_section(s->r, i, &si) || si.type != FKVF_SECTION_VTXS ||
            si.key != s->alpha)
            continue;
        const void *d;
        size_t n;
        if ((rc = fkvf_reader_section_data(s->r, i, &d, &n)))
            return FAIL(rc, NULL, "%s", fkvf_reader_message(s->r));
        size_t need;
        if (!fkvf_mulsz(s->alpha, 16, &need) || n != need + 8)
            return FAIL(FKVF_E_CORRUPT, "10.1", "VTXS section for N=%u has %zu bytes", s->alpha, n);
        size_t cnt = (size_t)s->alpha * 2;
        double *xy = fkvf_malloc(s->alloc, cnt * sizeof *xy);
        if (!xy)
            return FAIL(FKVF_E_NOMEM, NULL, "no memory for the vertex table");
        fkvf_rd c = fkvf_rd_make(d, n);
        fkvf_rd_take(&c, 8);
        for (size_t k = 0; k < cnt; k++)
            xy[k] = fkvf_rd_f64(&c);
        rc = fkvf_rd_ok(&c) ? fkvf_ngon_init(&s->g, s->alpha, s->si.r, s->si.span_symbols, xy,
                                             s->alloc)
                            : FKVF_E_TRUNCATED;
        fkvf_free(s->alloc, xy);
        if (rc)
            return FAIL(rc, "12.2", "ngon parameters of the stream rejected");
        s->has_g = 1;
        return FKVF_OK;
    }
    return FAIL(FKVF_E_CORRUPT, "10.3", "no VTXS section for N=%u", s->alpha);
}

/* Is index section `sec` with n_indexed n in effect for the stream (spec
 * 20.4): n <= length, and no segment that supplies a symbol below n comes
 * after it in section order. */
static int index_current(fkvf_search *s, size_t sec, uint64_t n, int *ok)
{
    *ok = 0;
    if (n > s->n)
        return FKVF_OK;
    for (size_t i = 0; i < s->si.n_segments; i++) {
        size_t ss;
        uint64_t first, count;
        int rc = fkvf_reader_stream_segment(s->r, s->stream, i, &ss, &first, &count);
        if (rc)
            return FAIL(rc, NULL, "%s", fkvf_reader_message(s->r));
        if (first < n && ss > sec)
            return FKVF_OK;
    }
    *ok = 1;
    return FKVF_OK;
}

static int load_index(fkvf_search *s)
{
    fkvf_archive_info ai;
    int rc = fkvf_reader_info(s->r, &ai);
    if (rc)
        return FAIL(rc, NULL, "%s", fkvf_reader_message(s->r));
    for (size_t i = ai.n_sections; i-- > 0;) {
        fkvf_section_info si;
        if (fkvf_reader_section(s->r, i, &si) || !fkvf_zidx_is_index(si.type) ||
            si.key != s->si.id)
            continue;
        int zpos = si.type == FKVF_SECTION_ZPOS;
        const char *tn = zpos ? "ZPOS" : "ZIDX", *cl = zpos ? "20.7" : "20.2";
        if (si.flags & FKVF_SECTION_DEFLATE)
            return fkvf_fail(&s->diag, FKVF_E_CORRUPT, si.offset, "20.1",
                             "%s section with the DEFLATE flag", tn);
        const void *d;
        size_t n;
        if ((rc = fkvf_reader_section_data(s->r, i, &d, &n)))
            return FAIL(rc, NULL, "%s", fkvf_reader_message(s->r));
        fkvf_zidx_hdr h;
        if ((rc = fkvf_zidx_hdr_parse(si.type, d, n, si.key, si.offset, &h, &s->diag)))
            return rc;
        int same = h.profile == (uint8_t)s->si.profile &&
                   (s->quad ? h.bits == s->b
                            : (h.alphabet == s->alpha && h.span == s->si.span_symbols &&
                               memcmp(&h.r, &s->si.r, sizeof h.r) == 0));
        if (!same)
            return fkvf_fail(&s->diag, FKVF_E_CORRUPT, si.offset + 8, cl,
                             "%s codec parameters differ from the stream's", tn);
        if (s->si.align && h.n_indexed % s->si.align)
            return fkvf_fail(&s->diag, FKVF_E_CORRUPT, si.offset + 16, cl,
                             "%s.n_indexed %llu is not a multiple of the stream's alignment "
                             "unit %u",
                             tn, (unsigned long long)h.n_indexed, s->si.align);
        int ok;
        if ((rc = index_current(s, i, h.n_indexed, &ok)))
            return rc;
        if (!ok)
            continue; /* stale: an older index may still be current */
        s->ix = d;
        s->n_idx = h.n_indexed;
        s->ix_sec = i;
        s->ix_off = si.offset;
        s->es = h.entry_size;
        s->zpos = zpos;
        if (zpos) /* every position is checked once here, before any is used (20.3) */
            for (uint64_t k = 0; k < s->n_idx; k++)
                if (ent_t(s, k) >= s->n_idx)
                    return fkvf_fail(&s->diag, FKVF_E_CORRUPT,
                                     si.offset + FKVF_ZIDX_HDR_SIZE + k * s->es, "20.7",
                                     "ZPOS entry %llu: position %llu not below n_indexed %llu",
                                     (unsigned long long)k, (unsigned long long)ent_t(s, k),
                                     (unsigned long long)s->n_idx);
        return FKVF_OK;
    }
    return FKVF_OK;
}

/* Hold the symbols [base, n) (and, ngon, the points of [scan0, n)). */
static int load_tail(fkvf_search *s)
{
    uint64_t w = s->quad ? (128 + s->b - 1) / s->b : s->cap;
    uint64_t u = s->si.align ? s->si.align : 1;
    s->base = s->scan0 >= w ? (s->scan0 - w + 1) / u * u : 0;
    if (s->quad && s->base && s->scan0 + 1 - s->base < w)
        s->base = s->base >= u ? s->base - u : 0;
    if (s->zpos)
        s->base = 0; /* the keys of the indexed positions are computed */
    s->pt0 = s->zpos ? 0 : s->scan0;
    uint64_t cnt64 = s->n - s->base, bytes;
    size_t cnt;
    if (!fkvf_tosz(cnt64, &cnt))
        return FAIL(FKVF_E_NOMEM, NULL, "stream too long for this address space");
    int rc;
    if (s->quad) {
        if (!fkvf_quad_data_bytes(cnt64, s->b, &bytes) || !fkvf_tosz(bytes, &s->pk_data) ||
            bytes > SIZE_MAX - 2 * PAD - 8)
            return FAIL(FKVF_E_NOMEM, NULL, "stream too long for this address space");
        if (!(s->pk = fkvf_calloc(s->alloc, s->pk_data + 2 * PAD + 8, 1)))
            return FAIL(FKVF_E_NOMEM, NULL, "no memory for %zu bytes of points", s->pk_data);
        if (s->b == 8) { /* the stored bytes are the points (spec 12.1.4) */
            if ((rc = fkvf_reader_stream_read_u8(s->r, s->stream, s->base, s->pk + PAD, cnt)))
                return FAIL(rc, NULL, "%s", fkvf_reader_message(s->r));
            return FKVF_OK;
        }
        uint32_t *tmp = fkvf_calloc(s->alloc, cnt ? cnt : 1, sizeof *tmp);
        if (!tmp)
            return FAIL(FKVF_E_NOMEM, NULL, "no memory for %zu symbols", cnt);
        rc = fkvf_reader_stream_read(s->r, s->stream, s->base, tmp, cnt);
        if (rc)
            rc = FAIL(rc, NULL, "%s", fkvf_reader_message(s->r));
        else if ((rc = fkvf_quad_encode(tmp, cnt, s->b, s->pk + PAD, s->pk_data)))
            rc = FAIL(rc, NULL, "packing symbols failed");
        fkvf_free(s->alloc, tmp);
        return rc;
    }
    size_t np = (size_t)(s->n - s->pt0);
    if (!(s->sym = fkvf_calloc(s->alloc, cnt ? cnt : 1, sizeof *s->sym)) ||
        !(s->px = fkvf_calloc(s->alloc, np ? np : 1, sizeof *s->px)) ||
        !(s->py = fkvf_calloc(s->alloc, np ? np : 1, sizeof *s->py)))
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for %zu points", cnt);
    if ((rc = fkvf_reader_stream_read(s->r, s->stream, s->base, s->sym, cnt)))
        return FAIL(rc, NULL, "%s", fkvf_reader_message(s->r));
    for (uint64_t t = s->pt0; t < s->n; t++) {
        uint64_t f = t + 1 >= s->cap ? t + 1 - s->cap : 0;
        fkvf_ngon_encode_span(&s->g, s->sym + (f - s->base), (uint32_t)(t + 1 - f),
                              &s->px[t - s->pt0], &s->py[t - s->pt0]);
    }
    return FKVF_OK;
}

/* ZPOS: the keys of entries 0, ZSAMPLE, 2 ZSAMPLE, ... (the points are held). */
static int load_samples(fkvf_search *s)
{
    uint64_t ns = (s->n_idx + ZSAMPLE - 1) / ZSAMPLE;
    size_t per = s->quad ? 2 : 1;
    if (!ns)
        return FKVF_OK;
    if (!(s->skey = fkvf_calloc(s->alloc, (size_t)ns, per * sizeof *s->skey)))
        return FAIL(FKVF_E_NOMEM, NULL, "no memory for %llu sampled index keys",
                    (unsigned long long)ns);
    for (uint64_t j = 0; j < ns; j++) {
        uint64_t hi, lo;
        ent_key(s, j * ZSAMPLE, &hi, &lo);
        if (s->quad) {
            s->skey[2 * j] = hi;
            s->skey[2 * j + 1] = lo;
        } else {
            s->skey[j] = lo;
        }
    }
    s->n_skey = ns;
    return FKVF_OK;
}

FKVF_API int fkvf_search_open(fkvf_search **out, fkvf_reader *r, size_t stream_index,
                              unsigned flags, const fkvf_allocator *alloc)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!r || (flags & ~FKVF_SEARCH_NO_INDEX))
        return FKVF_E_INVALID_ARG;
    alloc = fkvf_alloc_or_default(alloc);
    fkvf_search *s = fkvf_calloc(alloc, 1, sizeof *s);
    if (!s)
        return FKVF_E_NOMEM;
    fkvf_handle_init(&s->h, FKVF_HANDLE_SEARCH);
    s->alloc = alloc;
    s->diag.name = "search";
    s->r = r;
    s->stream = stream_index;
    *out = s;
    int rc = fkvf_reader_stream_info(r, stream_index, &s->si);
    if (rc)
        return FAIL(rc, NULL, "stream %zu: %s", stream_index, fkvf_reader_message(r));
    s->n = s->si.length;
    s->quad = s->si.profile == FKVF_PROFILE_QUAD;
    if (s->quad) {
        s->b = s->si.symbol_bits;
        s->cap = 128 / s->b;
    } else {
        s->alpha = s->si.alphabet;
        s->cap = s->si.span_symbols;
        if ((rc = load_ngon(s)))
            return rc;
    }
    /* a stream without a name (spec 11.2: an external codebook's layer table
     * not known) has no index that can be told to be its own: a scan */
    if (!(flags & FKVF_SEARCH_NO_INDEX) && s->si.id != FKVF_STREAM_ID_UNNAMED &&
        (rc = load_index(s)))
        return rc;
    s->scan0 = s->n_idx;
    if ((rc = load_tail(s)))
        return rc;
    return s->zpos ? load_samples(s) : FKVF_OK;
}

FKVF_API void fkvf_search_free(fkvf_search *s)
{
    if (!FKVF_HANDLE_IS(s, FKVF_HANDLE_SEARCH))
        return;
    const fkvf_allocator *a = s->alloc;
    if (s->has_g)
        fkvf_ngon_fini(&s->g);
    fkvf_free(a, s->pk);
    fkvf_free(a, s->sym);
    fkvf_free(a, s->px);
    fkvf_free(a, s->py);
    fkvf_free(a, s->skey);
    fkvf_free(a, s->res);
    fkvf_free(a, s->mt);
    s->h.magic = 0;
    fkvf_free(a, s);
}

FKVF_API const char *fkvf_search_message(const fkvf_search *s)
{
    if (!FKVF_HANDLE_IS(s, FKVF_HANDLE_SEARCH))
        return "not a search handle";
    return s->diag.msg[0] ? s->diag.msg : "ok";
}

FKVF_API int fkvf_search_error(const fkvf_search *s, fkvf_error_info *out)
{
    return fkvf_diag_report(FKVF_HANDLE_IS(s, FKVF_HANDLE_SEARCH) ? &s->diag : NULL,
                            "not a search handle", out);
}

FKVF_API int fkvf_search_info(const fkvf_search *s, fkvf_search_status *out)
{
    if (!FKVF_HANDLE_IS(s, FKVF_HANDLE_SEARCH))
        return FKVF_E_STATE;
    if (!out)
        return FKVF_E_INVALID_ARG;
    memset(out, 0, sizeof *out);
    out->length = s->n;
    out->n_indexed = s->n_idx;
    out->index_section = s->n_idx ? s->ix_sec : 0;
    out->key_symbols = s->cap;
    out->candidates = s->last_cand;
    out->verified = s->last_ver;
    return FKVF_OK;
}

/* ---- context, prefix reuse ---------------------------------------------- */

FKVF_API int fkvf_search_context(fkvf_reader *r, size_t stream_index, uint64_t t, size_t n,
                                 uint32_t *out, size_t *n_out)
{
    if (!r || !n_out || (!out && n))
        return FKVF_E_INVALID_ARG;
    *n_out = 0;
    if (t == UINT64_MAX)
        return FKVF_E_RANGE;
    size_t m = t + 1 < n ? (size_t)(t + 1) : n;
    int rc = fkvf_reader_stream_read(r, stream_index, t + 1 - m, out, m);
    if (rc == FKVF_OK)
        *n_out = m;
    return rc;
}

FKVF_API int fkvf_search_prefix_reuse(fkvf_reader *r, const uint32_t *prompt, size_t n,
                                      fkvf_prefix_reuse *out)
{
    if (!r || !out || (!prompt && n))
        return FKVF_E_INVALID_ARG;
    memset(out, 0, sizeof *out);
    size_t idx;
    int rc = fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &idx);
    if (rc)
        return rc;
    fkvf_stream_info si;
    if ((rc = fkvf_reader_stream_info(r, idx, &si)))
        return rc;
    out->archive_positions = si.length;
    /* 1. common prefix at the same positions, a chunk at a time */
    uint32_t buf[256];
    uint64_t lim = n < si.length ? n : si.length, p = 0;
    while (p < lim) {
        size_t c = lim - p < 256 ? (size_t)(lim - p) : 256;
        if ((rc = fkvf_reader_stream_read(r, idx, p, buf, c)))
            return rc;
        size_t i = 0;
        while (i < c && buf[i] == prompt[p + i])
            i++;
        p += i;
        if (i < c)
            break;
    }
    out->prefix_len = p;
    /* 2. the longest earlier occurrence of the prompt's last tokens */
    if (!n)
        return FKVF_OK;
    fkvf_search *s;
    if ((rc = fkvf_search_open(&s, r, idx, 0, NULL))) {
        fkvf_search_free(s);
        return rc;
    }
    fkvf_match mt;
    size_t got;
    rc = fkvf_search_longest(s, prompt, n, 1, &mt, &got);
    if (rc == FKVF_OK && got) {
        out->match_end = mt.position;
        out->match_len = mt.length;
    }
    fkvf_search_free(s);
    return rc;
}

/* ---- building an index -------------------------------------------------- */

typedef struct qent {
    uint64_t hi, lo, t;
} qent;
typedef struct nent {
    uint64_t key, t;
    double x, y;
} nent;

static int cmp_qent(const void *a, const void *b)
{
    const qent *x = a, *y = b;
    if (x->hi != y->hi)
        return x->hi < y->hi ? -1 : 1;
    if (x->lo != y->lo)
        return x->lo < y->lo ? -1 : 1;
    return (x->t > y->t) - (x->t < y->t);
}

static int cmp_nent(const void *a, const void *b)
{
    const nent *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->t > y->t) - (x->t < y->t);
}

FKVF_API void fkvf_search_buffer_free(void *p, const fkvf_allocator *alloc)
{
    fkvf_free(fkvf_alloc_or_default(alloc), p);
}

/* Sort the positions [0, n) by (key, position) (spec 20.3) and write a
 * ZPOS (positions) or ZIDX (keys, positions, ngon points) section, keyed by
 * the stream's id, or by `id` for a stream the reader cannot name (id
 * FKVF_STREAM_ID_UNNAMED: the stream's own). */
static int build_index(fkvf_reader *r, size_t stream_index, uint32_t type, uint64_t id,
                       void **data, size_t *size, uint64_t *key, const fkvf_allocator *alloc)
{
    if (!r || !data || !size || !key)
        return FKVF_E_INVALID_ARG;
    *data = NULL;
    *size = 0;
    fkvf_search *s;
    int rc = fkvf_search_open(&s, r, stream_index, FKVF_SEARCH_NO_INDEX, alloc);
    if (rc) {
        fkvf_search_free(s);
        return rc;
    }
    if (s->si.id != FKVF_STREAM_ID_UNNAMED && id != FKVF_STREAM_ID_UNNAMED && id != s->si.id) {
        fkvf_search_free(s);
        return FKVF_E_INVALID_ARG; /* a named stream keeps its name */
    }
    if (s->si.id == FKVF_STREAM_ID_UNNAMED)
        s->si.id = id;
    if (s->si.id == FKVF_STREAM_ID_UNNAMED) {
        /* an index named by the layer table of an external codebook not
         * attached (spec 11.2): no id to key the section with (spec 20.1) */
        fkvf_search_free(s);
        return FKVF_E_CODEBOOK;
    }
    const fkvf_allocator *a = fkvf_alloc_or_default(alloc);
    uint64_t u = s->si.align ? s->si.align : 1, n = s->n / u * u;
    uint64_t total = fkvf_zidx_size(type, (uint8_t)s->si.profile, n);
    size_t tsz, nn;
    uint8_t *buf = NULL;
    void *arr = NULL;
    if (!total || !fkvf_tosz(total, &tsz) || !fkvf_tosz(n, &nn)) {
        rc = FKVF_E_LIMIT;
        goto out;
    }
    if (!(buf = fkvf_malloc(a, tsz)) ||
        !(arr = fkvf_calloc(a, nn ? nn : 1, s->quad ? sizeof(qent) : sizeof(nent)))) {
        rc = FKVF_E_NOMEM;
        goto out;
    }
    fkvf_zidx_hdr h;
    memset(&h, 0, sizeof h);
    h.stream_id = s->si.id;
    h.profile = (uint8_t)s->si.profile;
    h.n_indexed = n;
    h.entry_size = fkvf_zidx_entry_size(type, h.profile, n);
    uint8_t *e0 = buf + FKVF_ZIDX_HDR_SIZE;
    if (s->quad) {
        h.bits = (uint8_t)s->b;
        qent *e = arr;
        for (uint64_t t = 0; t < n; t++) {
            qkey_at(s, t, &e[t].hi, &e[t].lo);
            e[t].t = t;
        }
        qsort(e, nn, sizeof *e, cmp_qent);
        for (size_t i = 0; i < nn; i++) {
            uint8_t *p = e0 + i * h.entry_size;
            if (h.entry_size == FKVF_ZPOS_ENTRY32) {
                fkvf_st32(p, (uint32_t)e[i].t);
            } else if (h.entry_size == FKVF_ZPOS_ENTRY64) {
                fkvf_st64(p, e[i].t);
            } else {
                fkvf_st64(p, e[i].lo);
                fkvf_st64(p + 8, e[i].hi);
                fkvf_st64(p + 16, e[i].t);
            }
        }
    } else {
        h.alphabet = s->alpha;
        h.r = s->si.r;
        h.span = s->si.span_symbols;
        nent *e = arr;
        for (uint64_t t = 0; t < n; t++) {
            e[t].x = s->px[t];
            e[t].y = s->py[t];
            e[t].key = fkvf_zidx_morton32(fkvf_zidx_quant(e[t].x), fkvf_zidx_quant(e[t].y));
            e[t].t = t;
        }
        qsort(e, nn, sizeof *e, cmp_nent);
        for (size_t i = 0; i < nn; i++) {
            uint8_t *p = e0 + i * h.entry_size;
            if (h.entry_size == FKVF_ZPOS_ENTRY32) {
                fkvf_st32(p, (uint32_t)e[i].t);
            } else if (h.entry_size == FKVF_ZPOS_ENTRY64) {
                fkvf_st64(p, e[i].t);
            } else {
                fkvf_st64(p, e[i].key);
                fkvf_st64(p + 8, e[i].t);
                fkvf_stf64(p + 16, e[i].x);
                fkvf_stf64(p + 24, e[i].y);
            }
        }
    }
    fkvf_zidx_hdr_write(buf, &h);
    *data = buf;
    *size = tsz;
    *key = s->si.id;
    buf = NULL;
out:
    fkvf_free(a, buf);
    fkvf_free(a, arr);
    fkvf_search_free(s);
    return rc;
}

FKVF_API int fkvf_search_index_build(fkvf_reader *r, size_t stream_index, void **data,
                                     size_t *size, uint64_t *key, const fkvf_allocator *alloc)
{
    return build_index(r, stream_index, FKVF_SECTION_ZPOS, FKVF_STREAM_ID_UNNAMED, data, size,
                       key, alloc);
}

FKVF_API int fkvf_search_index_build_as(fkvf_reader *r, size_t stream_index, uint64_t id,
                                        void **data, size_t *size,
                                        const fkvf_allocator *alloc)
{
    uint64_t key;
    if (id == FKVF_STREAM_ID_UNNAMED) {
        if (data)
            *data = NULL;
        if (size)
            *size = 0;
        return FKVF_E_INVALID_ARG;
    }
    return build_index(r, stream_index, FKVF_SECTION_ZPOS, id, data, size, &key, alloc);
}

int fkvf_search_zidx_build(fkvf_reader *r, size_t stream_index, void **data, size_t *size,
                           uint64_t *key, const fkvf_allocator *alloc)
{
    return build_index(r, stream_index, FKVF_SECTION_ZIDX, FKVF_STREAM_ID_UNNAMED, data, size,
                       key, alloc);
}
