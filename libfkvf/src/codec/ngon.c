/* ngon codec (spec 12.2): chaos-game representation on a regular N-gon in
 * binary64, the stream cut into spans of L symbols whose end points
 * ("anchors") are stored.
 *
 * Arithmetic: every formula that touches an anchor is evaluated exactly as
 * the spec writes it, in binary64 with round-to-nearest and no fused
 * multiply-add (the build uses -ffp-contract=off; do not use fma()).
 *
 * Decoders:
 *  - canonical: the spec's backward decoder, c = argmin over all c of
 *    (px-Vx(c))^2 + (py-Vy(c))^2, ties to the smallest c. For N > SMALL_N it
 *    is answered by a branch-and-bound search over a box hierarchy of the
 *    vertices sorted by angle; the bound is rigorous (see box_lb), so the
 *    result is identical to the exhaustive scan, which the tests compare.
 *  - fast: a pseudo-angle bucket table names a candidate in angular order;
 *    the computed distances to it and its neighbours pick a winner, which is
 *    accepted only with a certificate that it is the canonical argmin (see
 *    fast_step); otherwise that step runs the exact search. So the fast
 *    decoder returns the canonical symbols for every anchor; the
 *    caller-visible decoder still re-encodes every span (validity, spec
 *    12.2) and retries with the canonical decoder before rejecting.
 *
 * Reader paths use no libm: only fkvf_ngon_make_vertices and fkvf_ngon_rmax
 * (writer side) call cos/sin. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "codec.h"
#include "le.h"

/* No contraction into fused multiply-add: clang contracts within an
 * expression by default, hence the pragma; GCC ignores the pragma and
 * contracts only outside ISO mode (-std=gnu*), and the build passes
 * -ffp-contract=off anyway. tests/test_codec.c (ngon_golden) fails on a
 * build whose arithmetic is contracted. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "the ngon codec needs binary64 evaluation (FLT_EVAL_METHOD == 0, e.g. SSE2 on x86)"
#endif

#define NGON_MAX_N 65536u
#define NGON_MAX_SPAN 64u
/* Alphabets up to this size are decoded by the exhaustive scan. */
#define SMALL_N 8u
/* Vertices per leaf of the box hierarchy. */
#define LEAF 8u
/* pi/2 rounded to binary64 */
#define HALF_PI 1.57079632679489661923

/* ---- small helpers ------------------------------------------------------ */

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static double dabs(double d) { return d < 0 ? -d : d; }

static int is_finite(double d)
{
    return (dbits(d) & UINT64_C(0x7FF0000000000000)) != UINT64_C(0x7FF0000000000000);
}

/* The squared distance of spec 12.2, evaluated as written. */
static inline double dist2(double px, double py, double vx, double vy)
{
    double dx = px - vx, dy = py - vy;
    return dx * dx + dy * dy;
}

/* Diamond angle of (x, y) in [0, 4] (4 only by rounding), NaN for (0, 0) or
 * non-finite input. Monotone in the true angle, no libm. */
static inline double diamond(double x, double y)
{
    static const double base[4] = {0.0, 4.0, 2.0, 2.0}; /* [sx*2 + sy] */
    uint64_t ux = dbits(x), uy = dbits(y);
    unsigned sx = (unsigned)(ux >> 63), sy = (unsigned)(uy >> 63);
    double ax = dabs(x), ay = dabs(y);
    double t = ay / (ax + ay);
    /* + t when the signs agree, - t otherwise */
    uint64_t ut = dbits(t) ^ ((uint64_t)(sx ^ sy) << 63);
    double st;
    memcpy(&st, &ut, sizeof st);
    return base[sx * 2 + sy] + st;
}

/* ---- public helpers (fkvf.h) ----------------------------------------------- */

/* Vertex c of the regular N-gon with libm, by exact symmetry reduction to
 * the first octant so that equal-by-symmetry coordinates are equal and
 * V(N/4) etc. are exact. */
static void vertex_libm(uint32_t c, uint32_t n, double *x, double *y)
{
    uint64_t a4 = (uint64_t)c * 4u;
    unsigned quad = (unsigned)(a4 / n);     /* 0..3 */
    uint64_t rem = a4 - (uint64_t)quad * n; /* angle in quadrant = (pi/2) * rem / n */
    double cs, sn;
    if (2 * rem == n) {
        /* pi/4: cos and sin are the same number (libm may differ by 1 ulp) */
        cs = sn = 0.70710678118654752440;
    } else if (2 * rem < n) {
        double th = HALF_PI * (double)rem / (double)n;
        cs = cos(th);
        sn = sin(th);
    } else {
        double th = HALF_PI * (double)(n - rem) / (double)n;
        cs = sin(th);
        sn = cos(th);
    }
    double vx, vy;
    switch (quad) {
    case 0: vx = cs; vy = sn; break;
    case 1: vx = -sn; vy = cs; break;
    case 2: vx = -cs; vy = -sn; break;
    default: vx = sn; vy = -cs; break;
    }
    /* no negative zeros in tables */
    *x = vx == 0 ? 0.0 : vx;
    *y = vy == 0 ? 0.0 : vy;
}

void fkvf_ngon_make_vertices(uint32_t n, double *xy)
{
    for (uint32_t c = 0; c < n; c++)
        vertex_libm(c, n, &xy[2 * (size_t)c], &xy[2 * (size_t)c + 1]);
}

/* 1/r_N = 2 * (1 + sum_{k=1}^{floor(N/4)} V(k).x), left to right. */
static double inv_rmax_table(uint32_t n, const double *xy)
{
    double s = 1.0;
    for (uint32_t k = 1; k <= n / 4; k++)
        s = s + xy[2 * (size_t)k];
    return 2.0 * s;
}

double fkvf_ngon_rmax_table(uint32_t n, const double *xy) { return 1.0 / inv_rmax_table(n, xy); }

FKVF_API double fkvf_ngon_rmax(uint32_t n)
{
    if (n < 2 || n > NGON_MAX_N)
        return 0.0;
    double s = 1.0;
    for (uint32_t k = 1; k <= n / 4; k++) {
        double x, y;
        vertex_libm(k, n, &x, &y);
        s = s + x;
    }
    return 1.0 / (2.0 * s);
}

/* L_max(r): largest L with q^L <= 2^44, q = 1.0 / r, q^L by successive
 * multiplications from 1.0. Capped at NGON_MAX_SPAN (never binding for a
 * valid r <= 1/2, where L_max <= 44). 0 for r not finite or <= 0. */
FKVF_API uint32_t fkvf_ngon_max_span(double r)
{
    if (!is_finite(r) || !(r > 0))
        return 0;
    const double q = 1.0 / r;
    const double lim = 17592186044416.0; /* 2^44 */
    double p = 1.0;
    uint32_t l = 0;
    while (l < NGON_MAX_SPAN && p * q <= lim) {
        p = p * q;
        l++;
    }
    return l;
}

int fkvf_ngon_check_table(uint32_t n, const double *xy)
{
    if (n < 2 || n > NGON_MAX_N || !xy)
        return FKVF_E_CORRUPT;
    if (dbits(xy[0]) != dbits(1.0) || dbits(xy[1]) != dbits(0.0))
        return FKVF_E_CORRUPT;
    const double lo = 1.0 - 0x1p-40, hi = 1.0 + 0x1p-40;
    for (uint32_t c = 0; c < n; c++) {
        double x = xy[2 * (size_t)c], y = xy[2 * (size_t)c + 1];
        if (!is_finite(x) || !is_finite(y))
            return FKVF_E_CORRUPT;
        double m = x * x + y * y;
        if (!(m >= lo && m <= hi))
            return FKVF_E_CORRUPT;
    }
    return FKVF_OK;
}

int fkvf_ngon_check_params(uint32_t n, const double *xy, double r, uint32_t span)
{
    int rc = fkvf_ngon_check_table(n, xy); /* spec 10.2 */
    if (rc != FKVF_OK)
        return rc;
    /* spec 12.2 */
    double inv = inv_rmax_table(n, xy);
    if (!is_finite(r) || !(r > 0) || !(r * inv <= 1.0))
        return FKVF_E_CORRUPT;
    if (span > NGON_MAX_SPAN)
        return FKVF_E_LIMIT;
    if (span < 1 || span > fkvf_ngon_max_span(r))
        return FKVF_E_CORRUPT;
    return FKVF_OK;
}

/* ---- acceleration tables ------------------------------------------------- */

typedef struct ngon_fast {
    /* The vertices sorted by (diamond angle, index), i.e. in angular order
     * around the circle, with two wrap-around entries on each side: sorted
     * position i (-2 <= i < N+2) holds vertex sidx[i+2] = perm[i mod N] at
     * (sxy[2(i+2)], sxy[2(i+2)+1]). */
    double *sxy;
    uint32_t *sidx;
    /* pseudo-angle buckets: K = 1 << kbits entries, candidate's sorted
     * position */
    uint16_t *bucket;
    uint32_t kmask;
    double kscale; /* K / 4 */
    double margin; /* M of the certificate in fast_step */
    double rin2;   /* inner radius^2 of the annulus of valid points, or -1 */
    /* box hierarchy over the vertices sorted by diamond angle: complete binary
     * tree, node 1 the root, leaves nleaves..2*nleaves-1, leaf j holding
     * perm[LEAF*j .. LEAF*j+LEAF) (clipped to N). box[4*node] = xmin, xmax,
     * ymin, ymax (empty: +inf, -inf). */
    uint32_t nleaves;
    double *box;
    uint32_t *perm;
} ngon_fast;

static void fast_free(const fkvf_allocator *a, ngon_fast *f)
{
    if (!f)
        return;
    fkvf_free(a, f->sxy);
    fkvf_free(a, f->sidx);
    fkvf_free(a, f->bucket);
    fkvf_free(a, f->box);
    fkvf_free(a, f->perm);
    fkvf_free(a, f);
}

/* Lower bound, valid for the value dist2() computes for any vertex inside
 * box `b`, minus a safety margin: if box_lb(b) > d then every vertex in the
 * box has dist2 > d.
 * Proof sketch: let G^2 be the exact squared distance from p to the box and
 * lb the computed gx*gx + gy*gy; lb <= G^2 (1+u)^4 (u = 2^-53: one rounding
 * in each of the gaps, squares and the sum). For a vertex in the box,
 * dist2 >= d_exact (1-u)^4 - 2^-1070 (underflow) with d_exact >= G^2. So
 * dist2 >= lb (1 - 8u) - 2^-1070 > lb (1 - 2^-40)(1+u) - 2^-1000. Inputs are
 * bounded (|p| <= 2^500, |V| < 2), so nothing overflows. */
static inline double box_lb(const double *b, double px, double py)
{
    double gx = 0.0, gy = 0.0;
    if (px < b[0])
        gx = b[0] - px;
    else if (px > b[1])
        gx = px - b[1];
    if (py < b[2])
        gy = b[2] - py;
    else if (py > b[3])
        gy = py - b[3];
    double lb = gx * gx + gy * gy;
    return lb * (1.0 - 0x1p-40) - 0x1p-1000;
}

/* Exhaustive argmin, the spec's wording: first c with the least distance.
 * Defined for any input (NaN distances never win; then c = 0). */
static uint32_t argmin_scan(const fkvf_ngon *g, double px, double py)
{
    uint32_t best = 0;
    double bd = dist2(px, py, g->vx[0], g->vy[0]);
    for (uint32_t c = 1; c < g->n; c++) {
        double d = dist2(px, py, g->vx[c], g->vy[c]);
        if (d < bd) {
            bd = d;
            best = c;
        }
    }
    return best;
}

/* Exact argmin by branch and bound, any start candidate `seed`. Requires
 * finite |px|, |py| <= 2^500 (then no distance is NaN and the order of
 * (dist2, c) pairs is total, so the lexicographic minimum is the answer of
 * the exhaustive scan). */
static uint32_t argmin_tree(const fkvf_ngon *g, const ngon_fast *f, double px, double py,
                            uint32_t seed)
{
    uint32_t best = seed;
    double bd = dist2(px, py, g->vx[seed], g->vy[seed]);
    uint32_t stack[96];
    unsigned sp = 0;
    stack[sp++] = 1;
    while (sp) {
        uint32_t node = stack[--sp];
        if (box_lb(f->box + 4 * (size_t)node, px, py) > bd)
            continue;
        if (node >= f->nleaves) {
            size_t lo = (size_t)(node - f->nleaves) * LEAF;
            size_t hi = lo + LEAF < g->n ? lo + LEAF : g->n;
            for (size_t i = lo; i < hi; i++) {
                uint32_t c = f->perm[i];
                double d = dist2(px, py, g->vx[c], g->vy[c]);
                if (d < bd || (d == bd && c < best)) {
                    bd = d;
                    best = c;
                }
            }
            continue;
        }
        uint32_t l = 2 * node, r = 2 * node + 1;
        double bl = box_lb(f->box + 4 * (size_t)l, px, py);
        double br = box_lb(f->box + 4 * (size_t)r, px, py);
        /* push the farther child first; skip children already pruned */
        if (bl <= br) {
            if (br <= bd)
                stack[sp++] = r;
            if (bl <= bd)
                stack[sp++] = l;
        } else {
            if (bl <= bd)
                stack[sp++] = l;
            if (br <= bd)
                stack[sp++] = r;
        }
    }
    return best;
}

/* Candidate sorted position from the bucket table. */
static inline uint32_t bucket_of(const ngon_fast *f, double px, double py)
{
    double a = diamond(px, py) * f->kscale;
    if (!(a < 4.0 * f->kscale + 1.0)) /* NaN, or an impossible value */
        a = 0.0;
    return f->bucket[(uint32_t)a & f->kmask];
}

/* The annulus that every backward point of a valid span lies in. With
 * q = 1/r >= 2 and q^L <= 2^44 (check_params), the canonical backward point
 * b_k of a span that re-encodes exactly stays within
 * e <= 2^-53 * q^L * (15q + 2)/(q - 1) <= 2^-9 * 32 = 1/16 of the forward
 * point f_k, and for k >= 1, 1 - 2^-40 - 2.0001 r <= |f_k| <= 1 + 2^-40.
 * So |b_k| > 2, or |b_k| < 1 - 2.001 r - 0.1 (when positive), rules the
 * span out. The verifying decoders use this to bound their work on hostile
 * anchors: a point far inside the polygon, or beyond 2^500, costs O(N) in
 * the exact search. */
static inline int outside_annulus(double rin2, double x, double y)
{
    double m = x * x + y * y;
    return !(m <= 4.0) || m < rin2;
}

static uint32_t argmin_canonical(const fkvf_ngon *g, double px, double py)
{
    const ngon_fast *f = g->fast;
    if (g->n <= SMALL_N || !f || !(dabs(px) <= 0x1p500) || !(dabs(py) <= 0x1p500))
        return argmin_scan(g, px, py);
    return argmin_tree(g, f, px, py, f->perm[bucket_of(f, px, py)]);
}

typedef struct perm_item {
    double key;
    uint32_t c;
} perm_item;

static int cmp_item(const void *a, const void *b)
{
    const perm_item *x = a, *y = b;
    if (x->key < y->key)
        return -1;
    if (x->key > y->key)
        return 1;
    return (x->c > y->c) - (x->c < y->c);
}

static int fast_build(fkvf_ngon *g)
{
    const fkvf_allocator *a = g->alloc;
    const uint32_t n = g->n;
    ngon_fast *f = fkvf_calloc(a, 1, sizeof *f);
    if (!f)
        return FKVF_E_NOMEM;
    if (n <= SMALL_N) {
        g->fast = f;
        return FKVF_OK;
    }

    /* Vertices sorted by (diamond angle, index). */
    uint32_t nl = 1;
    while ((uint64_t)nl * LEAF < n)
        nl *= 2;
    f->nleaves = nl;
    f->perm = fkvf_calloc(a, n, sizeof(uint32_t));
    f->box = fkvf_calloc(a, 2 * (size_t)nl * 4, sizeof(double));
    f->sxy = fkvf_calloc(a, 2 * ((size_t)n + 4), sizeof(double));
    f->sidx = fkvf_calloc(a, (size_t)n + 4, sizeof(uint32_t));
    perm_item *items = fkvf_calloc(a, n, sizeof *items);
    if (!f->perm || !f->box || !f->sxy || !f->sidx || !items) {
        fkvf_free(a, items);
        goto nomem;
    }
    for (uint32_t c = 0; c < n; c++) {
        items[c].key = diamond(g->vx[c], g->vy[c]);
        items[c].c = c;
    }
    qsort(items, n, sizeof *items, cmp_item);
    for (uint32_t i = 0; i < n; i++)
        f->perm[i] = items[i].c;
    fkvf_free(a, items);
    for (size_t i = 0; i < (size_t)n + 4; i++) {
        uint32_t c = f->perm[(i + n - 2) % n];
        f->sidx[i] = c;
        f->sxy[2 * i] = g->vx[c];
        f->sxy[2 * i + 1] = g->vy[c];
    }

    /* The certificate margin of fast_step: M = 12.5 D + 2^-48, where D
     * bounds | |V|^2 - 1 | over the table (computed value plus 2^-51 for the
     * rounding of x*x + y*y). */
    double dmax = 0.0;
    for (uint32_t c = 0; c < n; c++) {
        double m = g->vx[c] * g->vx[c] + g->vy[c] * g->vy[c] - 1.0;
        m = dabs(m);
        if (m > dmax)
            dmax = m;
    }
    f->margin = 12.5 * (dmax + 0x1p-51) + 0x1p-48;
    double rin = 1.0 - 2.001 * g->r - 0.1; /* see canonical_bounded */
    f->rin2 = rin > 0 ? rin * rin : -1.0;

    /* Box hierarchy over the sorted vertices. */
    for (size_t node = 1; node < 2 * (size_t)nl; node++) {
        double *b = f->box + 4 * node;
        b[0] = b[2] = HUGE_VAL;
        b[1] = b[3] = -HUGE_VAL;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t c = f->perm[i];
        double *b = f->box + 4 * ((size_t)nl + i / LEAF);
        double x = g->vx[c], y = g->vy[c];
        if (x < b[0]) b[0] = x;
        if (x > b[1]) b[1] = x;
        if (y < b[2]) b[2] = y;
        if (y > b[3]) b[3] = y;
    }
    for (size_t node = nl - 1; node >= 1; node--) {
        double *b = f->box + 4 * node, *l = f->box + 8 * node, *r = l + 4;
        b[0] = l[0] < r[0] ? l[0] : r[0];
        b[1] = l[1] > r[1] ? l[1] : r[1];
        b[2] = l[2] < r[2] ? l[2] : r[2];
        b[3] = l[3] > r[3] ? l[3] : r[3];
    }

    /* Buckets: K >= 2N, a power of two, each naming the vertex nearest to
     * the bucket's centre direction. The diamond angle moves 1/2 to 1 units
     * (of 4 per turn) per radian, so each half of a bucket spans at most
     * 4/K <= 2/N radians of true angle, less than one Voronoi wedge (2 pi/N)
     * of a regular N-gon: the nearest vertex of any point in the bucket is
     * within one angular step of the named one, and the certificate of
     * fast_step then holds except near ties. (Only speed depends on this.) */
    uint32_t kbits = 6;
    while ((UINT64_C(1) << kbits) < 2 * (uint64_t)n)
        kbits++;
    uint32_t k = (uint32_t)1 << kbits;
    f->kmask = k - 1;
    f->kscale = (double)k / 4.0;
    f->bucket = fkvf_calloc(a, k, sizeof(uint16_t));
    uint32_t *inv = fkvf_calloc(a, n, sizeof(uint32_t)); /* vertex -> sorted position */
    if (!f->bucket || !inv) {
        fkvf_free(a, inv);
        goto nomem;
    }
    for (uint32_t i = 0; i < n; i++)
        inv[f->perm[i]] = i;
    for (uint32_t b = 0; b < k; b++) {
        double da = ((double)b + 0.5) * 4.0 / (double)k;
        unsigned q = (unsigned)da;
        double fr = da - (double)q, x, y;
        switch (q) {
        case 0: x = 1.0 - fr; y = fr; break;
        case 1: x = -fr; y = 1.0 - fr; break;
        case 2: x = -(1.0 - fr); y = -fr; break;
        default: x = fr; y = -(1.0 - fr); break;
        }
        f->bucket[b] = (uint16_t)inv[argmin_tree(g, f, x, y, 0)];
    }
    fkvf_free(a, inv);
    g->fast = f;
    return FKVF_OK;
nomem:
    fast_free(a, f);
    return FKVF_E_NOMEM;
}

/* ---- context ------------------------------------------------------------- */

int fkvf_ngon_init(fkvf_ngon *g, uint32_t n, double r, uint32_t span, const double *xy,
                   const fkvf_allocator *alloc)
{
    if (!g)
        return FKVF_E_INVALID_ARG;
    memset(g, 0, sizeof *g);
    if (n < 2 || n > NGON_MAX_N)
        return FKVF_E_CORRUPT;
    g->alloc = alloc;
    double *tab = fkvf_calloc(alloc, 2 * (size_t)n, sizeof(double));
    if (!tab)
        return FKVF_E_NOMEM;
    if (xy)
        memcpy(tab, xy, 2 * (size_t)n * sizeof(double));
    else
        fkvf_ngon_make_vertices(n, tab);
    if (r == 0) {
        /* r_N. r * inv <= 1.0 holds for r = 1.0/inv: r = (1/inv)(1+d) with
         * |d| <= 2^-53, so r * inv = 1 + d rounds to at most 1.0. */
        double inv = inv_rmax_table(n, tab);
        r = 1.0 / inv;
    }
    if (span == 0)
        span = fkvf_ngon_max_span(r);
    int rc = fkvf_ngon_check_params(n, tab, r, span);
    if (rc != FKVF_OK) {
        fkvf_free(alloc, tab);
        return rc;
    }
    g->n = n;
    g->r = r;
    g->span = span;
    g->vx = fkvf_calloc(alloc, n, sizeof(double));
    g->vy = fkvf_calloc(alloc, n, sizeof(double));
    if (!g->vx || !g->vy) {
        fkvf_free(alloc, tab);
        fkvf_ngon_fini(g);
        return FKVF_E_NOMEM;
    }
    for (uint32_t c = 0; c < n; c++) {
        g->vx[c] = tab[2 * (size_t)c];
        g->vy[c] = tab[2 * (size_t)c + 1];
    }
    fkvf_free(alloc, tab);
    rc = fast_build(g);
    if (rc != FKVF_OK) {
        fkvf_ngon_fini(g);
        return rc;
    }
    return FKVF_OK;
}

void fkvf_ngon_fini(fkvf_ngon *g)
{
    if (!g)
        return;
    fast_free(g->alloc, g->fast);
    fkvf_free(g->alloc, g->vx);
    fkvf_free(g->alloc, g->vy);
    g->fast = NULL;
    g->vx = g->vy = NULL;
}

int fkvf_ngon_data_bytes(const fkvf_ngon *g, uint64_t n, uint64_t *out)
{
    if (!g || g->span == 0)
        return 0;
    uint64_t spans = fkvf_ceildiv(n, g->span);
    return fkvf_mul64(spans, 16, out);
}

/* ---- spans --------------------------------------------------------------- */

void fkvf_ngon_encode_span(const fkvf_ngon *g, const uint32_t *sym, uint32_t len, double *ax,
                           double *ay)
{
    const double r = g->r;
    double px = 0.0, py = 0.0;
    for (uint32_t k = 0; k < len; k++) {
        double vx = g->vx[sym[k]], vy = g->vy[sym[k]];
        px = vx + r * (px - vx);
        py = vy + r * (py - vy);
    }
    *ax = px;
    *ay = py;
}

void fkvf_ngon_decode_span_canonical(const fkvf_ngon *g, double ax, double ay, uint32_t len,
                                     uint32_t *out)
{
    const double r = g->r;
    double px = ax, py = ay;
    for (uint32_t k = len; k > 0; k--) {
        uint32_t c = argmin_canonical(g, px, py);
        out[k - 1] = c;
        double vx = g->vx[c], vy = g->vy[c];
        px = vx + (px - vx) / r;
        py = vy + (py - vy) / r;
    }
}

/* One backward step of the fast decoder. The bucket table names a sorted
 * position; the computed distances D to the vertices at sorted positions
 * pos-2 .. pos+2 are compared, the winner w is taken among the middle three
 * (least distance, ties to the smallest index), and it is accepted only
 * with a certificate that it is the canonical argmin:
 *
 *   D(nb) > D(w) (1 + 2^-48) + M for both angular neighbours nb of w, and
 *   D(w) <= 1 (so |p| <= 2 + 2^-41),
 *
 * with M = 12.5 Delta + 2^-48, Delta >= | |V|^2 - 1 | for every vertex
 * (<= 2^-40 + 2^-51 by check_params; about 2^-50 for a libm table).
 * Why this suffices, for any table that passes check_params: write
 * V = (1+e) u with u on the unit circle, |e| <= 0.51 Delta, and
 * d0(V) = |p|^2 + 1 - 2 p.u, the exact squared distance to u; the exact
 * squared distance d(V) differs from d0(V) by at most
 * P = 2|e|(1+|p|) + e^2 <= 3.1 Delta, and the computed D(V) = d(V)(1 + t),
 * |t| <= 5u (u = 2^-53). The certificate gives d(nb) - d(w) >= G with
 * G ~ M, hence d0(nb) > d0(w) for both neighbours; d0 increases with the
 * angle between p and u, so the direction of p lies inside the arc
 * nb..w..nb and every other vertex v lies beyond a neighbour:
 * d0(v) >= min d0(nb), so d(v) >= d(w) + G - 4P and
 * D(v) - D(w) >= (G - 4P)(1 - 5u) - 10u d(w) >= 2^-48.1 - 2^-49.7 > 0.
 * So w is the unique argmin. (Vertices whose diamond angles round into the
 * wrong order differ in direction by ~1e-16, far below the margin.) Without
 * the certificate the step runs the exact search, so this decoder always
 * returns the canonical decoder's symbols; except that with `bounded` set
 * (verifying decoders) a point outside the annulus of valid points sets
 * *bad and skips the search (the span is invalid). */
static inline __attribute__((always_inline)) uint32_t
fast_step(const fkvf_ngon *g, const ngon_fast *f, double r, double *px, double *py, int bounded,
          unsigned *bad)
{
    double x = *px, y = *py;
    uint32_t pos = bucket_of(f, x, y);
    const double *e = f->sxy + 2 * (size_t)pos;   /* sorted pos-2 .. pos+2 */
    const uint32_t *id = f->sidx + pos;
    double d0 = dist2(x, y, e[0], e[1]);
    double d1 = dist2(x, y, e[2], e[3]);
    double d2 = dist2(x, y, e[4], e[5]);
    double d3 = dist2(x, y, e[6], e[7]);
    double d4 = dist2(x, y, e[8], e[9]);
    double bd = d2, dl = d1, dr = d3;
    uint32_t bi = id[2], bj = 2;
    int t1 = d1 < bd || (d1 == bd && id[1] < bi);
    bd = t1 ? d1 : bd;
    bi = t1 ? id[1] : bi;
    bj = t1 ? 1 : bj;
    dl = t1 ? d0 : dl;
    dr = t1 ? d2 : dr;
    int t3 = d3 < bd || (d3 == bd && id[3] < bi);
    bd = t3 ? d3 : bd;
    bi = t3 ? id[3] : bi;
    bj = t3 ? 3 : bj;
    dl = t3 ? d2 : dl;
    dr = t3 ? d4 : dr;
    double lim = bd * (1.0 + 0x1p-48) + f->margin;
    double vx, vy;
    if (dl > lim && dr > lim && bd <= 1.0) {
        vx = e[2 * bj];
        vy = e[2 * bj + 1];
    } else {
        if (bounded && outside_annulus(f->rin2, x, y)) {
            *bad = 1;
            bi = 0;
        } else {
            bi = argmin_canonical(g, x, y);
        }
        vx = g->vx[bi];
        vy = g->vy[bi];
    }
    *px = vx + (x - vx) / r;
    *py = vy + (y - vy) / r;
    return bi;
}

void fkvf_ngon_decode_span_fast(const fkvf_ngon *g, double ax, double ay, uint32_t len,
                                uint32_t *out)
{
    const ngon_fast *f = g->fast;
    if (g->n <= SMALL_N || !f) {
        fkvf_ngon_decode_span_canonical(g, ax, ay, len, out);
        return;
    }
    const double r = g->r;
    double px = ax, py = ay;
    unsigned bad = 0;
    for (uint32_t k = len; k > 0; k--)
        out[k - 1] = fast_step(g, f, r, &px, &py, 0, &bad);
}

static int canonical_bounded(const fkvf_ngon *g, double ax, double ay, uint32_t len,
                             uint32_t *out);

/* The fast decoder for the verifying paths: 0 if the span leaves the
 * annulus of valid points (then it is invalid). */
static int fast_span_bounded(const fkvf_ngon *g, double ax, double ay, uint32_t len, uint32_t *out)
{
    const ngon_fast *f = g->fast;
    if (g->n <= SMALL_N || !f)
        return canonical_bounded(g, ax, ay, len, out);
    const double r = g->r;
    double px = ax, py = ay;
    unsigned bad = 0;
    for (uint32_t k = len; k > 0; k--)
        out[k - 1] = fast_step(g, f, r, &px, &py, 1, &bad);
    return !bad;
}

/* NLANES full spans at once (anchors at a[0 .. 16 NLANES), symbols to
 * out[0 .. NLANES L)): the dependency chains of different spans are
 * independent, so the core overlaps them. */
#define NLANES 8u
static void decode_lanes_fast(const fkvf_ngon *g, const uint8_t *a, uint32_t *out, int bounded,
                              unsigned bad[NLANES])
{
    const uint32_t L = g->span;
    const ngon_fast *f = g->fast;
    for (unsigned l = 0; l < NLANES; l++)
        bad[l] = 0;
    if (g->n <= SMALL_N || !f) {
        for (unsigned l = 0; l < NLANES; l++) {
            double ax = fkvf_ldf64(a + 16 * l), ay = fkvf_ldf64(a + 16 * l + 8);
            if (bounded)
                bad[l] = !canonical_bounded(g, ax, ay, L, out + (size_t)l * L);
            else
                fkvf_ngon_decode_span_canonical(g, ax, ay, L, out + (size_t)l * L);
        }
        return;
    }
    const double r = g->r;
    double x[NLANES], y[NLANES];
    for (unsigned l = 0; l < NLANES; l++) {
        x[l] = fkvf_ldf64(a + 16 * l);
        y[l] = fkvf_ldf64(a + 16 * l + 8);
    }
    if (bounded) {
        for (uint32_t k = L; k > 0; k--)
            for (unsigned l = 0; l < NLANES; l++)
                out[(size_t)l * L + k - 1] = fast_step(g, f, r, &x[l], &y[l], 1, &bad[l]);
    } else {
        for (uint32_t k = L; k > 0; k--)
            for (unsigned l = 0; l < NLANES; l++)
                out[(size_t)l * L + k - 1] = fast_step(g, f, r, &x[l], &y[l], 0, &bad[l]);
    }
}

static int same_bits(double a, double b) { return dbits(a) == dbits(b); }

/* Canonical decoding for the verifying decoders, which only need to know
 * whether the canonical result re-encodes: returns 0 as soon as a backward
 * point leaves the annulus of valid points (see outside_annulus). */
static int canonical_bounded(const fkvf_ngon *g, double ax, double ay, uint32_t len, uint32_t *out)
{
    const double r = g->r;
    double rin = 1.0 - 2.001 * r - 0.1;
    double rin2 = rin > 0 ? rin * rin : -1.0;
    double px = ax, py = ay;
    for (uint32_t k = len; k > 0; k--) {
        if (outside_annulus(rin2, px, py))
            return 0;
        uint32_t c = argmin_canonical(g, px, py);
        out[k - 1] = c;
        double vx = g->vx[c], vy = g->vy[c];
        px = vx + (px - vx) / r;
        py = vy + (py - vy) / r;
    }
    return 1;
}

static int reencodes(const fkvf_ngon *g, double ax, double ay, uint32_t len, const uint32_t *sym)
{
    double x, y;
    fkvf_ngon_encode_span(g, sym, len, &x, &y);
    return same_bits(x, ax) && same_bits(y, ay);
}

int fkvf_ngon_decode_span(const fkvf_ngon *g, double ax, double ay, uint32_t len, uint32_t *out)
{
    if (!is_finite(ax) || !is_finite(ay))
        return FKVF_E_SPAN;
    if (len > NGON_MAX_SPAN)
        return FKVF_E_INVALID_ARG;
    if (!fast_span_bounded(g, ax, ay, len, out))
        return FKVF_E_SPAN;
    if (reencodes(g, ax, ay, len, out))
        return FKVF_OK;
    /* the fast decoder returns the canonical symbols; retrying with the
     * canonical decoder itself is insurance only */
    if (canonical_bounded(g, ax, ay, len, out) && reencodes(g, ax, ay, len, out))
        return FKVF_OK;
    return FKVF_E_SPAN;
}

/* ---- streams ------------------------------------------------------------- */

int fkvf_ngon_encode(const fkvf_ngon *g, const uint32_t *sym, size_t n, uint8_t *out,
                     size_t out_size)
{
    uint64_t need;
    if (!g || !fkvf_ngon_data_bytes(g, (uint64_t)n, &need) || need > (uint64_t)out_size ||
        (n && (!sym || !out)))
        return FKVF_E_INVALID_ARG;
    const uint32_t L = g->span;
    uint32_t back[NGON_MAX_SPAN];
    for (size_t s = 0, j = 0; s < n; s += L, j++) {
        uint32_t len = (uint32_t)(n - s < L ? n - s : L);
        for (uint32_t k = 0; k < len; k++)
            if (sym[s + k] >= g->n)
                return FKVF_E_SYMBOL;
        double ax, ay;
        fkvf_ngon_encode_span(g, sym + s, len, &ax, &ay);
        /* the writer's obligation (spec 12.2): the canonical decoder must
         * give the span back */
        fkvf_ngon_decode_span_canonical(g, ax, ay, len, back);
        if (memcmp(back, sym + s, len * sizeof(uint32_t)) != 0)
            return FKVF_E_CODEC;
        fkvf_stf64(out + 16 * j, ax);
        fkvf_stf64(out + 16 * j + 8, ay);
    }
    return FKVF_OK;
}

/* Checks shared by the stream readers: data holds the anchors of `total`
 * symbols and [first, first+n) is inside. */
static int stream_ok(const fkvf_ngon *g, size_t data_size, uint64_t total, uint64_t first,
                     uint64_t n)
{
    uint64_t need, end;
    if (!fkvf_ngon_data_bytes(g, total, &need) || need > (uint64_t)data_size)
        return FKVF_E_RANGE;
    if (!fkvf_add64(first, n, &end) || end > total)
        return FKVF_E_RANGE;
    return FKVF_OK;
}

/* Decode span j (length len) into out, verified or not. */
static int span_at(const fkvf_ngon *g, const uint8_t *data, uint64_t j, uint32_t len,
                   uint32_t *out, int verify)
{
    const uint8_t *p = data + 16 * (size_t)j;
    double ax = fkvf_ldf64(p), ay = fkvf_ldf64(p + 8);
    if (verify)
        return fkvf_ngon_decode_span(g, ax, ay, len, out);
    fkvf_ngon_decode_span_fast(g, ax, ay, len, out);
    return FKVF_OK;
}

int fkvf_ngon_decode(const fkvf_ngon *g, const uint8_t *data, size_t data_size, uint64_t total,
                     uint64_t first, size_t n, uint32_t *out, int verify)
{
    if (!g)
        return FKVF_E_INVALID_ARG;
    int rc = stream_ok(g, data_size, total, first, (uint64_t)n);
    if (rc != FKVF_OK || n == 0)
        return rc;
    if (!data || !out)
        return FKVF_E_INVALID_ARG;
    const uint32_t L = g->span;
    uint32_t tmp[NGON_MAX_SPAN];
    uint64_t end = first + n;
    uint64_t t = first;
    while (t < end) {
        uint64_t j = t / L;
        uint64_t s0 = j * L;
        uint32_t len = (uint32_t)(total - s0 < L ? total - s0 : L);
        uint64_t s1 = s0 + len; /* span covers [s0, s1) */
        if (t == s0 && len == L && end - t >= NLANES * (uint64_t)L &&
            total - t >= NLANES * (uint64_t)L) {
            /* NLANES full spans inside the request */
            uint32_t *o = out + (t - first);
            const uint8_t *a = data + 16 * (size_t)j;
            unsigned bad[NLANES];
            decode_lanes_fast(g, a, o, verify, bad);
            if (verify) {
                for (unsigned l = 0; l < NLANES; l++) {
                    double ax = fkvf_ldf64(a + 16 * l), ay = fkvf_ldf64(a + 16 * l + 8);
                    uint32_t *ol = o + (size_t)l * L;
                    if (!is_finite(ax) || !is_finite(ay) || bad[l])
                        return FKVF_E_SPAN;
                    if (!reencodes(g, ax, ay, L, ol) &&
                        (!canonical_bounded(g, ax, ay, L, ol) || !reencodes(g, ax, ay, L, ol)))
                        return FKVF_E_SPAN;
                }
            }
            t += NLANES * (uint64_t)L;
            continue;
        }
        if (t == s0 && s1 <= end) {
            rc = span_at(g, data, j, len, out + (t - first), verify);
            if (rc != FKVF_OK)
                return rc;
            t = s1;
            continue;
        }
        rc = span_at(g, data, j, len, tmp, verify);
        if (rc != FKVF_OK)
            return rc;
        uint64_t stop = s1 < end ? s1 : end;
        memcpy(out + (t - first), tmp + (t - s0), (size_t)(stop - t) * sizeof(uint32_t));
        t = stop;
    }
    return FKVF_OK;
}

int fkvf_ngon_get(const fkvf_ngon *g, const uint8_t *data, size_t data_size, uint64_t total,
                  uint64_t t, uint32_t *out)
{
    if (!g || !out)
        return FKVF_E_INVALID_ARG;
    int rc = stream_ok(g, data_size, total, t, 1);
    if (rc != FKVF_OK)
        return rc;
    const uint32_t L = g->span;
    uint64_t j = t / L, s0 = j * L;
    uint32_t len = (uint32_t)(total - s0 < L ? total - s0 : L);
    uint32_t tmp[NGON_MAX_SPAN];
    rc = span_at(g, data, j, len, tmp, 1);
    if (rc != FKVF_OK)
        return rc;
    *out = tmp[t - s0];
    return FKVF_OK;
}

int fkvf_ngon_point(const fkvf_ngon *g, const uint8_t *data, size_t data_size, uint64_t total,
                    uint64_t t, double *px, double *py)
{
    if (!g || !px || !py)
        return FKVF_E_INVALID_ARG;
    int rc = stream_ok(g, data_size, total, t, 1);
    if (rc != FKVF_OK)
        return rc;
    const uint32_t L = g->span;
    uint64_t cnt = t + 1 < L ? t + 1 : L; /* last cnt symbols ending at t */
    uint64_t j = t / L, s0 = j * L;
    uint32_t len = (uint32_t)(total - s0 < L ? total - s0 : L);
    uint32_t sym[2 * NGON_MAX_SPAN];
    uint32_t *cur = sym + NGON_MAX_SPAN; /* span j at cur[0..len) */
    rc = span_at(g, data, j, len, cur, 1);
    if (rc != FKVF_OK)
        return rc;
    uint64_t in_span = t - s0 + 1; /* symbols of span j up to t */
    if (cnt > in_span) {
        /* the window starts in span j-1 (a full span) */
        rc = span_at(g, data, j - 1, L, sym + NGON_MAX_SPAN - L, 1);
        if (rc != FKVF_OK)
            return rc;
    }
    fkvf_ngon_encode_span(g, cur + in_span - cnt, (uint32_t)cnt, px, py);
    return FKVF_OK;
}
