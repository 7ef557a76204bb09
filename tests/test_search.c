/* Suffix search (fkvf.h "search", spec 12.1.5, 12.2.7, 19): every query
 * against a plain string-matching oracle (recall 1.0, nothing extra), with
 * a ZPOS index, with a 1.0 ZIDX index and without an index, on quad and
 * ngon streams of several widths,
 * multi-segment streams, long queries, early positions and symbols outside
 * the alphabet; index building, validation and corruption. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fkvf.h"
#include "search/zidx_legacy.h"
#include "testutil.h"

/* The index type the archives of a test get: ZPOS (what the library
 * writes) or the 1.0 ZIDX (what existing files may hold). */
static uint32_t g_itype = FKVF_SECTION_ZPOS;

static int index_build(fkvf_reader *r, size_t idx, void **d, size_t *n, uint64_t *key)
{
    if (g_itype == FKVF_SECTION_ZIDX)
        return fkvf_search_zidx_build(r, idx, d, n, key, NULL);
    return fkvf_search_index_build(r, idx, d, n, key, NULL);
}

typedef struct cfg {
    fkvf_profile profile;
    unsigned bits;
    uint32_t alphabet;
    uint32_t span; /* ngon L (0 = L_max) */
} cfg;

static const cfg CFGS[] = {
    {FKVF_PROFILE_QUAD, 8, 0, 0},   {FKVF_PROFILE_QUAD, 10, 0, 0},  {FKVF_PROFILE_QUAD, 32, 0, 0},
    {FKVF_PROFILE_QUAD, 2, 0, 0},   {FKVF_PROFILE_QUAD, 6, 0, 0},   {FKVF_PROFILE_NGON, 0, 4, 0},
    {FKVF_PROFILE_NGON, 0, 16, 0},  {FKVF_PROFILE_NGON, 0, 256, 0}, {FKVF_PROFILE_QUAD, 4, 0, 0},
    {FKVF_PROFILE_QUAD, 16, 0, 0},  {FKVF_PROFILE_NGON, 0, 3, 0},   {FKVF_PROFILE_NGON, 0, 64, 0},
    {FKVF_PROFILE_NGON, 0, 256, 3},
};
#define NCFG (sizeof CFGS / sizeof CFGS[0])

static uint64_t alpha_of(const cfg *c)
{
    if (c->profile == FKVF_PROFILE_NGON)
        return c->alphabet;
    return (uint64_t)1 << c->bits;
}

static fkvf_stream_spec spec_of(const cfg *c)
{
    fkvf_stream_spec s;
    memset(&s, 0, sizeof s);
    s.profile = c->profile;
    s.symbol_bits = c->bits;
    s.alphabet = c->alphabet;
    s.span_symbols = c->span;
    return s;
}

/* A stream with structure: symbols mostly from a small subset, with copies
 * of earlier runs (long repeated contexts) and a few large symbols. */
static void make_stream(tu_rng *rng, const cfg *c, uint32_t *sym, size_t n)
{
    uint64_t A = alpha_of(c);
    uint32_t small = A < 3 ? (uint32_t)A : 3;
    for (size_t i = 0; i < n;) {
        unsigned kind = tu_below(rng, 10);
        if (kind < 2 && i > 50) {
            size_t from = tu_below(rng, (uint32_t)(i - 40)), len = 20 + tu_below(rng, 150);
            for (size_t k = 0; k < len && i < n; k++)
                sym[i++] = sym[from + k];
        } else if (kind == 2) {
            uint64_t v = tu_next(rng) % A;
            sym[i++] = (uint32_t)v;
        } else {
            sym[i++] = tu_below(rng, small);
        }
    }
}

/* ---- archives ----------------------------------------------------------- */

typedef struct built {
    tu_buf b;
    uint64_t n;
} built;

static void put_commit(fkvf_writer *w, const fkvf_stream_spec *sp, const uint32_t *sym,
                       uint64_t prev, uint64_t end)
{
    uint32_t u = fkvf_stream_spec_align(sp);
    uint64_t f = prev / u * u;
    ck_assert_int_eq(fkvf_writer_add_token_segment(w, sp, f, sym + f, (size_t)(end - f)), FKVF_OK);
    size_t cnt = (size_t)(end - prev);
    float *rows = calloc(cnt ? cnt * 2 : 1, sizeof *rows);
    ck_assert_int_eq(fkvf_writer_add_exact(w, prev, cnt, rows, cnt * 2 * sizeof *rows, 0), FKVF_OK);
    free(rows);
    ck_assert_int_eq(fkvf_writer_set_positions(w, end, 0), FKVF_OK);
    ck_assert_msg(fkvf_writer_commit(w) == FKVF_OK, "%s", fkvf_writer_message(w));
}

static void add_index_now(fkvf_writer *w, const tu_buf *b)
{
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, b->data, b->size, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    size_t idx;
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &idx), FKVF_OK);
    void *data;
    size_t size;
    uint64_t key;
    ck_assert_int_eq(index_build(r, idx, &data, &size, &key), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_add_section(w, g_itype, 0, key, data, size), FKVF_OK);
    fkvf_search_buffer_free(data, NULL);
    fkvf_reader_free(r);
    ck_assert_int_eq(fkvf_writer_commit(w), FKVF_OK);
}

/* Token-stream archive of sym[0..n) in commits ending at cuts[]; an index
 * after commit `index_after` (-1: none). */
static void build(built *out, const cfg *c, const uint32_t *sym, const uint64_t *cuts, size_t ncuts,
                  int index_after)
{
    memset(out, 0, sizeof *out);
    fkvf_sink sink = tu_buf_sink(&out->b);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    o.block_size = 256; /* many blocks: reads that touch few of them */
    o.optional_features = FKVF_OPTFEAT_TOKEN_STREAM;
    if (c->profile == FKVF_PROFILE_NGON)
        o.required_features |= FKVF_FEAT_NGON;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = d.n_kv_heads = d.key_dim = d.value_dim = 1;
    d.dtype = FKVF_DTYPE_F32;
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    fkvf_stream_spec sp = spec_of(c);
    uint64_t prev = 0;
    for (size_t k = 0; k < ncuts; k++) {
        put_commit(w, &sp, sym, prev, cuts[k]);
        prev = cuts[k];
        if ((int)k == index_after)
            add_index_now(w, &out->b);
    }
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
    out->n = prev;
}

/* ---- oracle ------------------------------------------------------------- */

static uint64_t lcs_at(const uint32_t *sym, uint64_t t, const uint32_t *q, size_t len)
{
    uint64_t l = 0;
    while (l < len && l <= t && sym[t - l] == q[len - 1 - l])
        l++;
    return l;
}

static size_t oracle_suffix(const uint32_t *sym, uint64_t n, const uint32_t *q, size_t len,
                            uint64_t *out)
{
    size_t k = 0;
    for (uint64_t t = 0; t < n; t++)
        if (lcs_at(sym, t, q, len) >= len)
            out[k++] = t;
    return k;
}

static int cmp_m(const void *a, const void *b)
{
    const fkvf_match *x = a, *y = b;
    if (x->length != y->length)
        return x->length > y->length ? -1 : 1;
    return (x->position > y->position) - (x->position < y->position);
}

static size_t oracle_longest(const uint32_t *sym, uint64_t n, const uint32_t *q, size_t len,
                             size_t k, fkvf_match *out, fkvf_match *tmp)
{
    size_t m = 0;
    for (uint64_t t = 0; t < n; t++) {
        uint64_t l = lcs_at(sym, t, q, len);
        if (l) {
            tmp[m].position = t;
            tmp[m].length = l;
            m++;
        }
    }
    qsort(tmp, m, sizeof *tmp, cmp_m);
    size_t r = m < k ? m : k;
    memcpy(out, tmp, r * sizeof *out);
    return r;
}

/* ---- the checks --------------------------------------------------------- */

typedef struct qset {
    uint32_t *q;
    size_t len;
} qset;

/* Queries: substrings ending anywhere (short and long), random ones, early
 * positions with zeros in front, symbols outside the alphabet. */
static size_t make_queries(tu_rng *rng, const cfg *c, const uint32_t *sym, uint64_t n, qset *qs,
                           size_t maxq)
{
    size_t k = 0;
    uint64_t A = alpha_of(c);
    while (k < maxq) {
        unsigned kind = tu_below(rng, 8);
        size_t len;
        uint32_t *q;
        if (kind <= 3) { /* substring */
            len = 1 + (kind == 3 ? tu_below(rng, 300) : tu_below(rng, 20));
            uint64_t t = len - 1 + tu_below(rng, (uint32_t)(n - len + 1));
            if (t >= n)
                continue;
            q = malloc(len * sizeof *q);
            memcpy(q, sym + t + 1 - len, len * sizeof *q);
            if (kind == 1 && len > 1)
                q[0] = (uint32_t)((q[0] + 1) % A); /* mismatch at the far end */
        } else if (kind == 4) { /* random */
            len = 1 + tu_below(rng, 8);
            q = malloc(len * sizeof *q);
            for (size_t i = 0; i < len; i++)
                q[i] = tu_below(rng, A < 3 ? (uint32_t)A : 3);
        } else if (kind == 5) { /* early positions: zeros, then c[0..t] */
            uint64_t t = tu_below(rng, 20);
            size_t z = 1 + tu_below(rng, 30);
            len = z + (size_t)t + 1;
            q = calloc(len, sizeof *q);
            memcpy(q + z, sym, (size_t)(t + 1) * sizeof *q);
        } else if (kind == 6) { /* exactly c[0..t] */
            len = 1 + tu_below(rng, 40);
            q = malloc(len * sizeof *q);
            memcpy(q, sym, len * sizeof *q);
        } else { /* a symbol outside the alphabet, at the front or the back */
            if (A > UINT32_MAX)
                continue;
            len = 2 + tu_below(rng, 10);
            uint64_t t = len - 1 + tu_below(rng, (uint32_t)(n - len));
            q = malloc(len * sizeof *q);
            memcpy(q, sym + t + 1 - len, len * sizeof *q);
            q[tu_below(rng, 2) ? 0 : len - 1] = (uint32_t)A + tu_below(rng, 5);
        }
        qs[k].q = q;
        qs[k].len = len;
        k++;
    }
    return k;
}

static void check_handle(fkvf_search *s, const uint32_t *sym, uint64_t n, qset *qs, size_t nq,
                         const char *what)
{
    uint64_t *got = malloc((n + 1) * sizeof *got), *want = malloc((n + 1) * sizeof *want);
    fkvf_match *mg = malloc(64 * sizeof *mg), *mw = malloc(64 * sizeof *mw);
    fkvf_match *tmp = malloc((n + 1) * sizeof *tmp);
    for (size_t i = 0; i < nq; i++) {
        const uint32_t *q = qs[i].q;
        size_t len = qs[i].len;
        /* (a) */
        uint64_t nf;
        ck_assert_msg(fkvf_search_suffix(s, q, len, got, n + 1, &nf) == FKVF_OK, "%s",
                      fkvf_search_message(s));
        size_t nw = oracle_suffix(sym, n, q, len, want);
        EXPECTF(nf == nw, "%s query %zu (len %zu): %llu found, oracle %zu", what, i, len,
                (unsigned long long)nf, nw);
        EXPECTF(!nw || memcmp(got, want, nw * sizeof *got) == 0, "%s query %zu: positions differ",
                what, i);
        /* cap smaller than the result */
        if (nw > 2) {
            uint64_t two[2];
            ck_assert_int_eq(fkvf_search_suffix(s, q, len, two, 2, &nf), FKVF_OK);
            EXPECT(nf == nw && two[0] == want[0] && two[1] == want[1]);
        }
        /* (b) */
        size_t k = 1 + i % 20, ng;
        ck_assert_msg(fkvf_search_longest(s, q, len, k, mg, &ng) == FKVF_OK, "%s",
                      fkvf_search_message(s));
        size_t lim = len, first_ok = len;
        uint64_t A = 0;
        (void)A;
        /* the oracle takes the part after the last invalid symbol */
        fkvf_search_status inf;
        ck_assert_int_eq(fkvf_search_info(s, &inf), FKVF_OK);
        fkvf_point pp;
        while (first_ok > 0 && fkvf_search_query_point(s, q + first_ok - 1, 1, &pp) == FKVF_OK)
            first_ok--;
        size_t nwm = oracle_longest(sym, n, q + first_ok, lim - first_ok, k, mw, tmp);
        EXPECTF(ng == nwm, "%s query %zu: longest gave %zu, oracle %zu", what, i, ng, nwm);
        for (size_t j = 0; j < ng && j < nwm; j++)
            EXPECTF(mg[j].position == mw[j].position && mg[j].length == mw[j].length,
                    "%s query %zu (len %zu) match %zu: (%llu, %llu), oracle (%llu, %llu)", what,
                    i, len, j, (unsigned long long)mg[j].position,
                    (unsigned long long)mg[j].length, (unsigned long long)mw[j].position,
                    (unsigned long long)mw[j].length);
        /* (c) with the default radius: verified set = suffix set */
        fkvf_radius_result rr;
        ck_assert_int_eq(fkvf_search_radius(s, q, len, 0.0, got, n + 1, &rr), FKVF_OK);
        EXPECTF(rr.verified == nw, "%s query %zu: radius verified %llu, oracle %zu", what, i,
                (unsigned long long)rr.verified, nw);
        EXPECT(rr.candidates >= rr.verified);
        EXPECT(!nw || memcmp(got, want, nw * sizeof *got) == 0);
    }
    free(got);
    free(want);
    free(mg);
    free(mw);
    free(tmp);
}

static void check_archive(const built *a, const uint32_t *sym, qset *qs, size_t nq, int expect_index,
                          const char *what)
{
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, a->b.data, a->b.size, FKVF_OPEN_STRICT, NULL),
                     FKVF_OK);
    ck_assert_msg(fkvf_reader_verify(r) == FKVF_OK, "%s", fkvf_reader_message(r));
    size_t idx;
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &idx), FKVF_OK);
    for (int noidx = 0; noidx < 2; noidx++) {
        fkvf_search *s = NULL;
        ck_assert_msg(fkvf_search_open(&s, r, idx, noidx ? FKVF_SEARCH_NO_INDEX : 0, NULL) ==
                          FKVF_OK,
                      "%s", s ? fkvf_search_message(s) : "no handle");
        fkvf_search_status inf;
        ck_assert_int_eq(fkvf_search_info(s, &inf), FKVF_OK);
        ck_assert_uint_eq(inf.length, a->n);
        if (noidx || !expect_index)
            ck_assert_uint_eq(inf.n_indexed, 0);
        else
            ck_assert_uint_gt(inf.n_indexed, 0);
        char w2[128];
        snprintf(w2, sizeof w2, "%s%s", what, noidx ? " (scan)" : " (index)");
        check_handle(s, sym, a->n, qs, nq, w2);
        fkvf_search_free(s);
    }
    fkvf_reader_free(r);
}

static void run_cfg(const cfg *c, uint64_t seed, int multi, int indexed)
{
    tu_rng rng = {seed};
    const uint64_t n = 2000 + tu_below(&rng, 600);
    uint32_t *sym = malloc(n * sizeof *sym);
    make_stream(&rng, c, sym, n);
    uint64_t cuts[4];
    size_t nc = 1;
    int ia = -1;
    if (multi) {
        cuts[0] = n / 3 + tu_below(&rng, 50);
        cuts[1] = 2 * n / 3 + tu_below(&rng, 50);
        cuts[2] = n;
        nc = 3;
    } else {
        cuts[0] = n;
    }
    if (indexed)
        ia = multi ? 1 : 0; /* multi: the last commit's symbols are scanned */
    built a;
    build(&a, c, sym, cuts, nc, ia);
    qset qs[120];
    size_t nq = make_queries(&rng, c, sym, n, qs, 120);
    char what[96];
    snprintf(what, sizeof what, "profile %d bits %u N %u seed %llu multi %d idx %d", c->profile,
             c->bits, c->alphabet, (unsigned long long)seed, multi, indexed);
    check_archive(&a, sym, qs, nq, indexed, what);
    for (size_t i = 0; i < nq; i++)
        free(qs[i].q);
    tu_buf_free(&a.b);
    free(sym);
}

START_TEST(oracle_scan)
{
    run_cfg(&CFGS[_i], 100 + (uint64_t)_i, 0, 0);
}
END_TEST

START_TEST(oracle_multisegment)
{
    run_cfg(&CFGS[_i], 200 + (uint64_t)_i, 1, 0);
}
END_TEST

START_TEST(oracle_indexed)
{
    run_cfg(&CFGS[_i], 300 + (uint64_t)_i, 0, 1);
}
END_TEST

START_TEST(oracle_indexed_tail)
{
    run_cfg(&CFGS[_i], 400 + (uint64_t)_i, 1, 1);
}
END_TEST

/* The same with a 1.0 ZIDX index: existing files answer as before. */
START_TEST(oracle_zidx)
{
    g_itype = FKVF_SECTION_ZIDX;
    run_cfg(&CFGS[_i], 300 + (uint64_t)_i, 0, 1);
    run_cfg(&CFGS[_i], 400 + (uint64_t)_i, 1, 1);
    g_itype = FKVF_SECTION_ZPOS;
}
END_TEST

/* ---- ZPOS, ZIDX and scan give the same answers ------------------------- */

typedef struct answers {
    uint64_t *suf, nsuf, cand, ver; /* suffix positions, counts of the last query */
    fkvf_match lm[20];
    size_t nl;
    uint64_t *rad;
    fkvf_radius_result rr, rr2;
} answers;

static void answer(fkvf_search *s, const uint32_t *q, size_t len, uint64_t n, answers *a)
{
    ck_assert_int_eq(fkvf_search_suffix(s, q, len, a->suf, n + 1, &a->nsuf), FKVF_OK);
    fkvf_search_status inf;
    ck_assert_int_eq(fkvf_search_info(s, &inf), FKVF_OK);
    a->cand = inf.candidates;
    a->ver = inf.verified;
    ck_assert_int_eq(fkvf_search_longest(s, q, len, 20, a->lm, &a->nl), FKVF_OK);
    ck_assert_int_eq(fkvf_search_radius(s, q, len, 0.0, a->rad, n + 1, &a->rr), FKVF_OK);
    double wide = fkvf_search_default_radius(s, len > 2 ? len - 2 : 1) * 1.5;
    ck_assert_int_eq(fkvf_search_radius(s, q, len, wide, a->rad + n + 1, n + 1, &a->rr2),
                     FKVF_OK);
}

/* Streams whose first commit ends just below, at and just above a multiple
 * of the alignment unit (n_indexed at its edges), indexed after it, then
 * appended to (those positions scanned): every answer of the ZPOS handle
 * equals the ZIDX handle's (candidate counts included: the same entries in
 * the same order) and the scan's (results; the scan has no candidates
 * from the index). Quad 8 and 16 bits, ngon N = 64. */
START_TEST(three_ways)
{
    static const cfg C3[] = {
        {FKVF_PROFILE_QUAD, 8, 0, 0}, {FKVF_PROFILE_QUAD, 16, 0, 0}, {FKVF_PROFILE_NGON, 0, 64, 0}};
    const cfg *c = &C3[_i];
    fkvf_stream_spec sp = spec_of(c);
    uint64_t u = fkvf_stream_spec_align(&sp);
    for (int edge = -1; edge <= 1; edge++) {
        tu_rng rng = {700 + (uint64_t)_i * 10 + (uint64_t)(edge + 1)};
        uint64_t m = u * (1200 / u) + (uint64_t)(int64_t)edge, n = m + 137;
        uint32_t *sym = malloc(n * sizeof *sym);
        make_stream(&rng, c, sym, n);
        uint64_t cuts[2] = {m, n};
        built a[3];
        g_itype = FKVF_SECTION_ZPOS;
        build(&a[0], c, sym, cuts, 2, 0);
        g_itype = FKVF_SECTION_ZIDX;
        build(&a[1], c, sym, cuts, 2, 0);
        g_itype = FKVF_SECTION_ZPOS;
        build(&a[2], c, sym, cuts, 2, -1);
        fkvf_reader *r[3];
        fkvf_search *s[3];
        for (int k = 0; k < 3; k++) {
            r[k] = NULL;
            s[k] = NULL;
            ck_assert_int_eq(fkvf_reader_open_memory(&r[k], a[k].b.data, a[k].b.size,
                                                     FKVF_OPEN_STRICT, NULL),
                             FKVF_OK);
            ck_assert_msg(fkvf_reader_verify(r[k]) == FKVF_OK, "%s", fkvf_reader_message(r[k]));
            ck_assert_int_eq(fkvf_search_open(&s[k], r[k], 0, 0, NULL), FKVF_OK);
            fkvf_search_status inf;
            ck_assert_int_eq(fkvf_search_info(s[k], &inf), FKVF_OK);
            ck_assert_uint_eq(inf.n_indexed, k == 2 ? 0 : m / u * u);
            ck_assert_uint_eq(inf.length, n);
        }
        ck_assert_uint_gt(m / u * u, 0);
        qset qs[80];
        size_t nq = make_queries(&rng, c, sym, n, qs, 80);
        answers an[3];
        for (int k = 0; k < 3; k++) {
            an[k].suf = malloc((n + 1) * sizeof(uint64_t));
            an[k].rad = malloc(2 * (n + 1) * sizeof(uint64_t));
        }
        for (size_t i = 0; i < nq; i++) {
            for (int k = 0; k < 3; k++)
                answer(s[k], qs[i].q, qs[i].len, n, &an[k]);
            for (int k = 1; k < 3; k++) {
                const answers *x = &an[0], *y = &an[k];
                ck_assert_msg(x->nsuf == y->nsuf && !memcmp(x->suf, y->suf, x->nsuf * 8),
                              "cfg %d edge %d query %zu: suffix differs (way %d)", _i, edge, i, k);
                ck_assert_msg(x->nl == y->nl && !memcmp(x->lm, y->lm, x->nl * sizeof x->lm[0]),
                              "cfg %d edge %d query %zu: longest differs (way %d)", _i, edge, i, k);
                ck_assert_uint_eq(x->rr.verified, y->rr.verified);
                ck_assert_uint_eq(x->rr2.verified, y->rr2.verified);
                ck_assert(!memcmp(x->rad, y->rad, x->rr.verified * 8));
                ck_assert(!memcmp(x->rad + n + 1, y->rad + n + 1, x->rr2.verified * 8));
                ck_assert(x->ver == y->ver);
                if (k == 1) { /* ZIDX: the very same candidates */
                    ck_assert_uint_eq(x->cand, y->cand);
                    ck_assert_uint_eq(x->rr.candidates, y->rr.candidates);
                    ck_assert_uint_eq(x->rr2.candidates, y->rr2.candidates);
                }
            }
        }
        for (int k = 0; k < 3; k++) {
            free(an[k].suf);
            free(an[k].rad);
            fkvf_search_free(s[k]);
            fkvf_reader_free(r[k]);
            tu_buf_free(&a[k].b);
        }
        for (size_t i = 0; i < nq; i++)
            free(qs[i].q);
        free(sym);
    }
}
END_TEST

/* The index costs at most 8 bytes per indexed position, measured as the
 * growth of the file (the index commit's directory and trailer included):
 * ZPOS 4 bytes an entry, against 24 (quad) and 32 (ngon) for ZIDX. */
START_TEST(zpos_size)
{
    static const cfg C2[] = {{FKVF_PROFILE_QUAD, 8, 0, 0}, {FKVF_PROFILE_NGON, 0, 16, 0}};
    for (int k = 0; k < 2; k++) {
        tu_rng rng = {31 + (uint64_t)k};
        const uint64_t n = 4096;
        uint32_t *sym = malloc(n * sizeof *sym);
        make_stream(&rng, &C2[k], sym, n);
        built none, zpos, zidx;
        build(&none, &C2[k], sym, &n, 1, -1);
        build(&zpos, &C2[k], sym, &n, 1, 0);
        g_itype = FKVF_SECTION_ZIDX;
        build(&zidx, &C2[k], sym, &n, 1, 0);
        g_itype = FKVF_SECTION_ZPOS;
        double per = (double)(zpos.b.size - none.b.size) / (double)n;
        double old = (double)(zidx.b.size - none.b.size) / (double)n;
        ck_assert_msg(per <= 8.0, "%d: %.2f bytes per position", k, per);
        ck_assert_msg(per >= 4.0, "%d: %.2f bytes per position", k, per);
        ck_assert_msg(old >= (k ? 32.0 : 24.0), "%d: ZIDX %.2f bytes per position", k, old);
        tu_buf_free(&none.b);
        tu_buf_free(&zpos.b);
        tu_buf_free(&zidx.b);
        free(sym);
    }
}
END_TEST

/* ---- smaller things ----------------------------------------------------- */

static void small_archive(built *a, const cfg *c, const uint32_t *sym, uint64_t n, int indexed)
{
    uint64_t cut = n;
    build(a, c, sym, &cut, 1, indexed ? 0 : -1);
}

START_TEST(worked_example_quad8)
{
    /* the stream of spec 20.6 */
    static const uint32_t sym[] = {7, 1, 2, 7, 1, 2, 3, 7, 1, 2, 7, 1, 2, 7, 1, 5};
    const cfg c = {FKVF_PROFILE_QUAD, 8, 0, 0};
    built a;
    small_archive(&a, &c, sym, 16, 1);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, a.b.data, a.b.size, 0, NULL), FKVF_OK);
    size_t idx;
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &idx), FKVF_OK);
    fkvf_search *s = NULL;
    ck_assert_int_eq(fkvf_search_open(&s, r, idx, 0, NULL), FKVF_OK);
    fkvf_search_status inf;
    ck_assert_int_eq(fkvf_search_info(s, &inf), FKVF_OK);
    ck_assert_uint_eq(inf.n_indexed, 16);
    static const uint32_t q[] = {7, 1, 2};
    uint64_t out[8], nf;
    ck_assert_int_eq(fkvf_search_suffix(s, q, 3, out, 8, &nf), FKVF_OK);
    ck_assert_uint_eq(nf, 4);
    ck_assert_uint_eq(out[0], 2);
    ck_assert_uint_eq(out[1], 5);
    ck_assert_uint_eq(out[2], 9);
    ck_assert_uint_eq(out[3], 12);
    ck_assert_uint_eq(inf.key_symbols, 16);
    static const uint32_t q3[] = {3, 7, 1, 2}, q4[] = {0, 7};
    ck_assert_int_eq(fkvf_search_suffix(s, q3, 4, out, 8, &nf), FKVF_OK);
    ck_assert_uint_eq(nf, 1);
    ck_assert_uint_eq(out[0], 9);
    ck_assert_int_eq(fkvf_search_suffix(s, q4, 2, out, 8, &nf), FKVF_OK);
    ck_assert_uint_eq(nf, 0); /* entry 11 (t = 0) is in the key range, and dropped */
    ck_assert_int_eq(fkvf_search_info(s, &inf), FKVF_OK);
    ck_assert_uint_eq(inf.candidates, 1);
    fkvf_match m[3];
    size_t ng;
    static const uint32_t q2[] = {3, 7, 1, 2};
    ck_assert_int_eq(fkvf_search_longest(s, q2, 4, 3, m, &ng), FKVF_OK);
    ck_assert_uint_eq(ng, 3);
    ck_assert_uint_eq(m[0].position, 9);
    ck_assert_uint_eq(m[0].length, 4);
    ck_assert_uint_eq(m[1].position, 2);
    ck_assert_uint_eq(m[1].length, 3);
    ck_assert_uint_eq(m[2].position, 5);
    /* the index section bytes: entry 0 is the smallest z_t */
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    const uint8_t *zb = NULL;
    size_t zs = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        ck_assert_int_eq(fkvf_reader_section(r, i, &si), FKVF_OK);
        if (si.type == FKVF_SECTION_ZPOS) {
            const void *d;
            ck_assert_int_eq(fkvf_reader_section_data(r, i, &d, &zs), FKVF_OK);
            zb = d;
            ck_assert_uint_eq(si.flags, 0);
            ck_assert_uint_eq(si.key, FKVF_STREAM_ID_TOKENS);
        }
    }
    ck_assert_ptr_nonnull(zb);
    /* the order of spec 20.6, computed by hand from the definition of z_t */
    static const uint32_t order[16] = {1, 4, 14, 11, 8, 2, 5, 12, 9, 6, 15, 0, 3, 13, 10, 7};
    ck_assert_uint_eq(zs, 64 + 16 * 4); /* ZPOS: u32 positions (spec 20.7) */
    static const uint8_t hdr[16] = {0, 0, 0, 0, 0, 0, 0, 1, 1, 8, 4, 0, 0, 0, 0, 0};
    ck_assert(memcmp(zb, hdr, 16) == 0);
    ck_assert_uint_eq(zb[16], 16);
    for (int e = 0; e < 16; e++) {
        uint32_t t = (uint32_t)zb[64 + 4 * e] | (uint32_t)zb[65 + 4 * e] << 8 |
                     (uint32_t)zb[66 + 4 * e] << 16 | (uint32_t)zb[67 + 4 * e] << 24;
        ck_assert_uint_eq(t, order[e]);
    }
    /* the 1.0 ZIDX of the same stream: the same positions, with their keys */
    void *zd;
    size_t zn;
    uint64_t key;
    ck_assert_int_eq(fkvf_search_zidx_build(r, idx, &zd, &zn, &key, NULL), FKVF_OK);
    ck_assert_uint_eq(zn, 64 + 16 * 24);
    const uint8_t *zx = zd;
    ck_assert_uint_eq(zx[10], 24);
    for (int e = 0; e < 16; e++)
        ck_assert_uint_eq(zx[64 + 24 * e + 16], order[e]);
    ck_assert_uint_eq(zx[64 + 15], 1); /* entry 0: position 1, context 7, 1 */
    ck_assert_uint_eq(zx[64 + 14], 7);
    fkvf_search_buffer_free(zd, NULL);
    fkvf_search_free(s);
    fkvf_reader_free(r);
    tu_buf_free(&a.b);
}
END_TEST

START_TEST(context_and_prefix_reuse)
{
    tu_rng rng = {77};
    const cfg c = {FKVF_PROFILE_QUAD, 16, 0, 0};
    uint64_t n = 1000;
    uint32_t *sym = malloc(n * sizeof *sym);
    for (uint64_t i = 0; i < n; i++)
        sym[i] = tu_below(&rng, 50);
    built a;
    small_archive(&a, &c, sym, n, 0);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, a.b.data, a.b.size, 0, NULL), FKVF_OK);
    size_t idx, got;
    ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &idx), FKVF_OK);
    uint32_t ctx[64];
    ck_assert_int_eq(fkvf_search_context(r, idx, 500, 40, ctx, &got), FKVF_OK);
    ck_assert_uint_eq(got, 40);
    ck_assert_int_eq(memcmp(ctx, sym + 461, 40 * sizeof *ctx), 0);
    ck_assert_int_eq(fkvf_search_context(r, idx, 3, 40, ctx, &got), FKVF_OK);
    ck_assert_uint_eq(got, 4);
    ck_assert_int_eq(memcmp(ctx, sym, 4 * sizeof *ctx), 0);
    ck_assert_int_eq(fkvf_search_context(r, idx, n, 4, ctx, &got), FKVF_E_RANGE);
    /* prompt = archive prefix of 300, then 700..719 of the archive */
    uint32_t prompt[320];
    memcpy(prompt, sym, 300 * sizeof *prompt);
    memcpy(prompt + 300, sym + 700, 20 * sizeof *prompt);
    if (prompt[300] == sym[300])
        prompt[300] = (prompt[300] + 1) % 50;
    fkvf_prefix_reuse pr;
    ck_assert_int_eq(fkvf_search_prefix_reuse(r, prompt, 320, &pr), FKVF_OK);
    ck_assert_uint_eq(pr.prefix_len, 300);
    ck_assert_uint_eq(pr.archive_positions, n);
    ck_assert_uint_ge(pr.match_len, 19);
    ck_assert_uint_eq(lcs_at(sym, pr.match_end, prompt, 320), pr.match_len);
    for (uint64_t t = 0; t < n; t++)
        EXPECT(lcs_at(sym, t, prompt, 320) <= pr.match_len);
    /* a prompt longer than the archive that holds all of it */
    uint32_t *lp = malloc((n + 5) * sizeof *lp);
    memcpy(lp, sym, n * sizeof *lp);
    for (int k = 0; k < 5; k++)
        lp[n + k] = 60;
    ck_assert_int_eq(fkvf_search_prefix_reuse(r, lp, n + 5, &pr), FKVF_OK);
    ck_assert_uint_eq(pr.prefix_len, n);
    ck_assert_uint_eq(pr.match_len, 0); /* 60 never occurs */
    free(lp);
    fkvf_reader_free(r);
    tu_buf_free(&a.b);
    free(sym);
}
END_TEST

START_TEST(no_token_stream)
{
    built a;
    memset(&a, 0, sizeof a);
    fkvf_sink sink = tu_buf_sink(&a.b);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = d.n_kv_heads = d.key_dim = d.value_dim = 1;
    d.dtype = FKVF_DTYPE_F32;
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, a.b.data, a.b.size, 0, NULL), FKVF_OK);
    fkvf_prefix_reuse pr;
    uint32_t p[2] = {1, 2};
    ck_assert_int_eq(fkvf_search_prefix_reuse(r, p, 2, &pr), FKVF_E_NOT_FOUND);
    fkvf_search *s = NULL;
    ck_assert_int_eq(fkvf_search_open(&s, r, 0, 0, NULL), FKVF_E_RANGE);
    fkvf_search_free(s);
    fkvf_reader_free(r);
    tu_buf_free(&a.b);
}
END_TEST

/* Index streams (group 0) of a tiny archive with a zero codebook. */
START_TEST(index_streams)
{
    const unsigned ks = 2, vs = 1;
    for (int prof = 0; prof < 4; prof++) {
        g_itype = prof < 2 ? FKVF_SECTION_ZPOS : FKVF_SECTION_ZIDX;
        tu_rng rng = {900 + (uint64_t)prof};
        tu_buf b;
        memset(&b, 0, sizeof b);
        fkvf_sink sink = tu_buf_sink(&b);
        fkvf_writer_options o;
        fkvf_writer_options_init(&o);
        o.sync = FKVF_SYNC_NONE;
        o.block_size = 128;
        o.required_features = FKVF_FEAT_NGON;
        fkvf_writer *w = NULL;
        ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_OK);
        fkvf_desc d;
        memset(&d, 0, sizeof d);
        d.n_layers = 2;
        d.n_kv_heads = 1;
        d.key_dim = d.value_dim = 1;
        d.dtype = FKVF_DTYPE_F32;
        d.n_sinks = 4;
        ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
        fkvf_codebook_shape sh;
        memset(&sh, 0, sizeof sh);
        sh.n_layers = 2;
        sh.n_heads = 1;
        sh.key_dim = sh.value_dim = 1;
        sh.k = 16;
        sh.k_stages = (uint8_t)ks;
        sh.v_stages = (uint8_t)vs;
        sh.dtype = FKVF_DTYPE_F32;
        size_t tb = (size_t)fkvf_codebook_size(&sh) - 64;
        void *tables = calloc(1, tb);
        ck_assert_int_eq(fkvf_writer_add_codebooks(w, &sh, tables, tb, 0), FKVF_OK);
        free(tables);
        const size_t A = 1500, per = 2 * (ks + vs);
        uint16_t *codes = malloc(A * per * sizeof *codes);
        uint32_t *streams = malloc(A * per * sizeof *streams);
        for (size_t j = 0; j < per; j++) {
            cfg c = {FKVF_PROFILE_NGON, 0, 16, 0};
            make_stream(&rng, &c, streams + j * A, A);
            for (size_t t = 0; t < A; t++)
                codes[t * per + j] = (uint16_t)streams[j * A + t];
        }
        fkvf_stream_spec sp;
        memset(&sp, 0, sizeof sp);
        if (prof % 2 == 0) {
            sp.profile = FKVF_PROFILE_QUAD;
            sp.symbol_bits = 4;
        } else {
            sp.profile = FKVF_PROFILE_NGON;
            sp.alphabet = 16;
        }
        ck_assert_int_eq(fkvf_writer_add_index_segment(w, &sp, 0, A, codes, per, 1), FKVF_OK);
        float *rows = calloc(4 * 4, sizeof *rows);
        ck_assert_int_eq(fkvf_writer_add_exact(w, 0, 4, rows, 16 * sizeof *rows, 0), FKVF_OK);
        free(rows);
        ck_assert_int_eq(fkvf_writer_set_positions(w, 4 + A, A), FKVF_OK);
        ck_assert_msg(fkvf_writer_commit(w) == FKVF_OK, "%s", fkvf_writer_message(w));
        /* index stream L1 K stage 1 (j = 1 * 3 + 1 = 4) */
        fkvf_reader *r = NULL;
        ck_assert_msg(fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL) == FKVF_OK, "%s",
                      r ? fkvf_reader_message(r) : "");
        size_t idx;
        ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID(0, 1, 0, 0, 1), &idx), FKVF_OK);
        void *zd;
        size_t zs;
        uint64_t key;
        ck_assert_int_eq(index_build(r, idx, &zd, &zs, &key), FKVF_OK);
        ck_assert_uint_eq(key, FKVF_STREAM_ID(0, 1, 0, 0, 1));
        fkvf_reader_free(r);
        ck_assert_int_eq(fkvf_writer_add_section(w, g_itype, 0, key, zd, zs), FKVF_OK);
        fkvf_search_buffer_free(zd, NULL);
        ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
        fkvf_writer_free(w);
        built a = {b, A};
        qset qs[60];
        const uint32_t *sym = streams + 4 * A;
        cfg c = {FKVF_PROFILE_NGON, 0, 16, 0};
        size_t nq = make_queries(&rng, &c, sym, A, qs, 60);
        /* check_archive uses the token stream; here the index stream */
        ck_assert_int_eq(fkvf_reader_open_memory(&r, a.b.data, a.b.size, FKVF_OPEN_STRICT, NULL),
                         FKVF_OK);
        ck_assert_msg(fkvf_reader_verify(r) == FKVF_OK, "%s", fkvf_reader_message(r));
        ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID(0, 1, 0, 0, 1), &idx), FKVF_OK);
        for (int noidx = 0; noidx < 2; noidx++) {
            fkvf_search *s = NULL;
            ck_assert_int_eq(fkvf_search_open(&s, r, idx, noidx ? FKVF_SEARCH_NO_INDEX : 0, NULL),
                             FKVF_OK);
            fkvf_search_status inf;
            fkvf_search_info(s, &inf);
            ck_assert_uint_eq(inf.n_indexed, noidx ? 0 : A / fkvf_stream_spec_align(&sp) *
                                                            fkvf_stream_spec_align(&sp));
            check_handle(s, sym, A, qs, nq, prof % 2 ? "index stream ngon" : "index stream quad");
            fkvf_search_free(s);
        }
        /* another stream has no index */
        ck_assert_int_eq(fkvf_reader_stream_find(r, FKVF_STREAM_ID(0, 0, 0, 1, 0), &idx), FKVF_OK);
        fkvf_search *s = NULL;
        ck_assert_int_eq(fkvf_search_open(&s, r, idx, 0, NULL), FKVF_OK);
        fkvf_search_status inf;
        fkvf_search_info(s, &inf);
        ck_assert_uint_eq(inf.n_indexed, 0);
        check_handle(s, streams + 2 * A, A, qs, 10, "index stream without index");
        fkvf_search_free(s);
        fkvf_reader_free(r);
        for (size_t i = 0; i < nq; i++)
            free(qs[i].q);
        free(codes);
        free(streams);
        tu_buf_free(&b);
    }
    g_itype = FKVF_SECTION_ZPOS;
}
END_TEST

/* A ZIDX built before later segments rewrote indexed symbols is stale and
 * ignored; results stay exact. */
START_TEST(stale_index_ignored)
{
    tu_rng rng = {5};
    const cfg c = {FKVF_PROFILE_QUAD, 8, 0, 0};
    uint64_t n = 800;
    uint32_t *sym = malloc(n * sizeof *sym);
    make_stream(&rng, &c, sym, n);
    built a;
    memset(&a, 0, sizeof a);
    fkvf_sink sink = tu_buf_sink(&a.b);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = d.n_kv_heads = d.key_dim = d.value_dim = 1;
    d.dtype = FKVF_DTYPE_F32;
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    fkvf_stream_spec sp = spec_of(&c);
    put_commit(w, &sp, sym, 0, 512);
    add_index_now(w, &a.b);
    /* rewrite from 256 with different symbols */
    for (uint64_t i = 256; i < n; i++)
        sym[i] = (sym[i] + 1) % 256;
    ck_assert_int_eq(fkvf_writer_add_token_segment(w, &sp, 256, sym + 256, (size_t)(n - 256)),
                     FKVF_OK);
    float *rows = calloc((size_t)(n - 512) * 2, sizeof *rows);
    ck_assert_int_eq(fkvf_writer_add_exact(w, 512, n - 512, rows, (size_t)(n - 512) * 8, 0), FKVF_OK);
    free(rows);
    ck_assert_int_eq(fkvf_writer_set_positions(w, n, 0), FKVF_OK);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
    a.n = n;
    qset qs[60];
    size_t nq = make_queries(&rng, &c, sym, n, qs, 60);
    check_archive(&a, sym, qs, nq, 0, "stale");
    for (size_t i = 0; i < nq; i++)
        free(qs[i].q);
    tu_buf_free(&a.b);
    free(sym);
}
END_TEST

/* Corrupt index sections (valid checksums, hostile contents). */
static int open_with_zidx(const cfg *c, const uint32_t *sym, uint64_t n,
                          void (*damage)(uint8_t *, size_t), tu_buf *b, fkvf_reader **r)
{
    fkvf_reader *r0 = NULL;
    built a;
    small_archive(&a, c, sym, n, 0);
    ck_assert_int_eq(fkvf_reader_open_memory(&r0, a.b.data, a.b.size, 0, NULL), FKVF_OK);
    void *zd;
    size_t zs;
    uint64_t key;
    ck_assert_int_eq(index_build(r0, 0, &zd, &zs, &key), FKVF_OK);
    fkvf_reader_free(r0);
    tu_buf_free(&a.b);
    damage(zd, zs);
    /* rebuild with the damaged section in the same commit */
    memset(b, 0, sizeof *b);
    fkvf_sink sink = tu_buf_sink(b);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    if (c->profile == FKVF_PROFILE_NGON)
        o.required_features |= FKVF_FEAT_NGON;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = d.n_kv_heads = d.key_dim = d.value_dim = 1;
    d.dtype = FKVF_DTYPE_F32;
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    fkvf_stream_spec sp = spec_of(c);
    put_commit(w, &sp, sym, 0, n);
    ck_assert_int_eq(fkvf_writer_add_section(w, g_itype, 0, key, zd, zs), FKVF_OK);
    fkvf_search_buffer_free(zd, NULL);
    ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
    fkvf_writer_free(w);
    *r = NULL;
    return fkvf_reader_open_memory(r, b->data, b->size, 0, NULL);
}

static void dmg_swap(uint8_t *p, size_t n)
{
    (void)n;
    uint8_t t[24];
    memcpy(t, p + 64, 24);
    memcpy(p + 64, p + 88, 24);
    memcpy(p + 88, t, 24);
}
static void dmg_key(uint8_t *p, size_t n) { p[n - 24 + 15] ^= 0x01; }  /* last key, low symbol bit */
static void dmg_pos(uint8_t *p, size_t n) { p[n - 8 + 7] = 0x7f; }     /* last position huge */
static void dmg_hdr(uint8_t *p, size_t n) { (void)n; p[40] = 1; }       /* reserved byte */
static void dmg_count(uint8_t *p, size_t n) { (void)n; p[16] ^= 0x10; }  /* n_indexed */
static void dmg_id(uint8_t *p, size_t n) { (void)n; p[0] ^= 1; }        /* stream_id != key */

/* ZPOS damage (entries of 4 bytes) */
static void zdmg_swap(uint8_t *p, size_t n)
{
    (void)n;
    uint8_t t[4];
    memcpy(t, p + 64, 4);
    memcpy(p + 64, p + 68, 4);
    memcpy(p + 68, t, 4);
}
static void zdmg_dup(uint8_t *p, size_t n) { (void)n; memcpy(p + 68, p + 64, 4); } /* entry 1 = 0 */
static void zdmg_pos(uint8_t *p, size_t n) { p[n - 1] = 0x7f; }                    /* last huge */
static void zdmg_esize(uint8_t *p, size_t n) { (void)n; p[10] = 8; } /* u64 entries, n < 2^32 */

START_TEST(corrupt_zpos)
{
    const cfg c = {FKVF_PROFILE_QUAD, 8, 0, 0};
    uint64_t n = 320;
    uint32_t sym[320];
    tu_rng rng = {9};
    for (uint64_t i = 0; i < n; i++)
        sym[i] = tu_below(&rng, 4);
    struct {
        void (*f)(uint8_t *, size_t);
        int open_rc, verify_rc;
    } cases[] = {
        {zdmg_swap, FKVF_OK, FKVF_E_CORRUPT},          {zdmg_dup, FKVF_OK, FKVF_E_CORRUPT},
        {zdmg_pos, FKVF_E_CORRUPT, FKVF_E_CORRUPT},     {dmg_hdr, FKVF_E_CORRUPT, FKVF_E_CORRUPT},
        {dmg_count, FKVF_E_TRUNCATED, FKVF_E_TRUNCATED}, {dmg_id, FKVF_E_CORRUPT, FKVF_E_CORRUPT},
        {zdmg_esize, FKVF_E_CORRUPT, FKVF_E_CORRUPT},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tu_buf b;
        fkvf_reader *r;
        ck_assert_int_eq(open_with_zidx(&c, sym, n, cases[k].f, &b, &r), FKVF_OK);
        fkvf_search *s = NULL;
        int rc = fkvf_search_open(&s, r, 0, 0, NULL);
        ck_assert_msg(rc == cases[k].open_rc, "case %zu: open %d", k, rc);
        if (rc) {
            ck_assert_ptr_nonnull(strstr(fkvf_search_message(s), "20.7"));
            ck_assert_ptr_nonnull(strstr(fkvf_search_message(s), "ZPOS"));
        }
        fkvf_search_free(s);
        rc = fkvf_reader_verify(r);
        ck_assert_msg(rc == cases[k].verify_rc, "case %zu: verify %d (%s)", k, rc,
                      fkvf_reader_message(r));
        ck_assert_ptr_nonnull(strstr(fkvf_reader_message(r), "20.7"));
        fkvf_reader_free(r);
        tu_buf_free(&b);
    }
}
END_TEST

START_TEST(corrupt_index)
{
    g_itype = FKVF_SECTION_ZIDX; /* the 1.0 layout's damage */
    const cfg c = {FKVF_PROFILE_QUAD, 8, 0, 0};
    uint64_t n = 320;
    uint32_t sym[320];
    tu_rng rng = {9};
    for (uint64_t i = 0; i < n; i++)
        sym[i] = tu_below(&rng, 4);
    struct {
        void (*f)(uint8_t *, size_t);
        int open_rc, verify_rc;
        const char *clause;
    } cases[] = {
        {dmg_swap, FKVF_OK, FKVF_E_CORRUPT, "20.3"},
        {dmg_key, FKVF_OK, FKVF_E_CORRUPT, "20.3"},
        {dmg_pos, FKVF_OK, FKVF_E_CORRUPT, "20.3"},
        {dmg_hdr, FKVF_E_CORRUPT, FKVF_E_CORRUPT, "20.2"},
        {dmg_count, FKVF_E_TRUNCATED, FKVF_E_TRUNCATED, "20.2"},
        {dmg_id, FKVF_E_CORRUPT, FKVF_E_CORRUPT, "20.2"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tu_buf b;
        fkvf_reader *r;
        ck_assert_int_eq(open_with_zidx(&c, sym, n, cases[k].f, &b, &r), FKVF_OK);
        fkvf_search *s = NULL;
        int rc = fkvf_search_open(&s, r, 0, 0, NULL);
        ck_assert_msg(rc == cases[k].open_rc, "case %zu: open %d", k, rc);
        if (rc)
            ck_assert_ptr_nonnull(strstr(fkvf_search_message(s), cases[k].clause));
        if (rc == FKVF_OK && k == 2) {
            /* a query that reaches the damaged entry reports it */
            uint64_t out[400], nf;
            int found_corrupt = 0;
            for (uint32_t a0 = 0; a0 < 4 && !found_corrupt; a0++)
                for (uint32_t a1 = 0; a1 < 4; a1++) {
                    uint32_t q[2] = {a0, a1};
                    int qrc = fkvf_search_suffix(s, q, 2, out, 400, &nf);
                    if (qrc == FKVF_E_CORRUPT) {
                        found_corrupt = 1;
                        ck_assert_ptr_nonnull(strstr(fkvf_search_message(s), "20.3"));
                        break;
                    }
                    ck_assert_int_eq(qrc, FKVF_OK);
                }
            ck_assert(found_corrupt);
        }
        fkvf_search_free(s);
        rc = fkvf_reader_verify(r);
        ck_assert_msg(rc == cases[k].verify_rc, "case %zu: verify %d (%s)", k, rc,
                      fkvf_reader_message(r));
        ck_assert_ptr_nonnull(strstr(fkvf_reader_message(r), cases[k].clause));
        fkvf_reader_free(r);
        tu_buf_free(&b);
    }
    g_itype = FKVF_SECTION_ZPOS;
}
END_TEST

/* ZIDX flags: DEFLATE is CORRUPT (spec 20.1); REQUIRED makes the section an
 * unknown required one for the reader (SECTION, spec 4.3). */
START_TEST(index_flags)
{
    const cfg c = {FKVF_PROFILE_QUAD, 8, 0, 0};
    uint32_t sym[64];
    for (int i = 0; i < 64; i++)
        sym[i] = (uint32_t)(i % 5);
    built a;
    small_archive(&a, &c, sym, 64, 0);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, a.b.data, a.b.size, 0, NULL), FKVF_OK);
    void *zd;
    size_t zs;
    uint64_t key;
    ck_assert_int_eq(fkvf_search_index_build(r, 0, &zd, &zs, &key, NULL), FKVF_OK);
    fkvf_reader_free(r);
    tu_buf_free(&a.b);
    for (int k = 0; k < 2; k++) {
        tu_buf b;
        memset(&b, 0, sizeof b);
        fkvf_sink sink = tu_buf_sink(&b);
        fkvf_writer_options o;
        fkvf_writer_options_init(&o);
        o.sync = FKVF_SYNC_NONE;
        o.required_features = FKVF_FEAT_DEFLATE;
        fkvf_writer *w = NULL;
        ck_assert_int_eq(fkvf_writer_create_sink(&w, &sink, &o, NULL), FKVF_OK);
        fkvf_desc d;
        memset(&d, 0, sizeof d);
        d.n_layers = d.n_kv_heads = d.key_dim = d.value_dim = 1;
        d.dtype = FKVF_DTYPE_F32;
        ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
        fkvf_stream_spec sp = spec_of(&c);
        put_commit(w, &sp, sym, 0, 64);
        ck_assert_int_eq(fkvf_writer_add_section(w, FKVF_SECTION_ZPOS,
                                                 k ? FKVF_SECTION_REQUIRED : FKVF_SECTION_DEFLATE,
                                                 key, zd, zs),
                         FKVF_OK);
        ck_assert_int_eq(fkvf_writer_finish(w), FKVF_OK);
        fkvf_writer_free(w);
        r = NULL;
        int rc = fkvf_reader_open_memory(&r, b.data, b.size, 0, NULL);
        if (k) {
            ck_assert_int_eq(rc, FKVF_E_SECTION);
        } else {
            ck_assert_int_eq(rc, FKVF_OK);
            fkvf_search *s = NULL;
            ck_assert_int_eq(fkvf_search_open(&s, r, 0, 0, NULL), FKVF_E_CORRUPT);
            ck_assert_ptr_nonnull(strstr(fkvf_search_message(s), "20.1"));
            fkvf_search_free(s);
            ck_assert_int_eq(fkvf_search_open(&s, r, 0, FKVF_SEARCH_NO_INDEX, NULL), FKVF_OK);
            fkvf_search_free(s);
            ck_assert_int_eq(fkvf_reader_verify(r), FKVF_E_CORRUPT);
            ck_assert_ptr_nonnull(strstr(fkvf_reader_message(r), "20.1"));
        }
        fkvf_reader_free(r);
        tu_buf_free(&b);
    }
    fkvf_search_buffer_free(zd, NULL);
}
END_TEST

/* An empty stream: every query finds nothing; an index of zero entries. */
START_TEST(empty_stream)
{
    const cfg c = {FKVF_PROFILE_QUAD, 10, 0, 0};
    uint32_t sym[1] = {0};
    for (int n = 0; n < 2; n++) {
        built a;
        uint64_t cut = (uint64_t)n;
        build(&a, &c, sym, &cut, 1, 0);
        fkvf_reader *r = NULL;
        ck_assert_int_eq(fkvf_reader_open_memory(&r, a.b.data, a.b.size, 0, NULL), FKVF_OK);
        ck_assert_int_eq(fkvf_reader_verify(r), FKVF_OK);
        fkvf_search *s = NULL;
        ck_assert_int_eq(fkvf_search_open(&s, r, 0, 0, NULL), FKVF_OK);
        uint32_t q[2] = {0, 0};
        uint64_t out[2], nf;
        ck_assert_int_eq(fkvf_search_suffix(s, q, 1, out, 2, &nf), FKVF_OK);
        ck_assert_uint_eq(nf, (uint64_t)n);
        ck_assert_int_eq(fkvf_search_suffix(s, q, 2, out, 2, &nf), FKVF_OK);
        ck_assert_uint_eq(nf, 0);
        fkvf_match m[2];
        size_t ng;
        ck_assert_int_eq(fkvf_search_longest(s, q, 2, 2, m, &ng), FKVF_OK);
        ck_assert_uint_eq(ng, (size_t)n);
        ck_assert_int_eq(fkvf_search_suffix(s, q, 0, out, 2, &nf), FKVF_E_INVALID_ARG);
        fkvf_search_free(s);
        fkvf_reader_free(r);
        tu_buf_free(&a.b);
    }
}
END_TEST

/* Backward decode and indexed search touch only the blocks they need: a
 * damaged block far from them goes unnoticed, and reading it fails. */
START_TEST(touches_only_needed_blocks)
{
    tu_rng rng = {31};
    const cfg c = {FKVF_PROFILE_QUAD, 8, 0, 0};
    uint64_t n = 2000;
    uint32_t *sym = malloc(n * sizeof *sym);
    for (uint64_t i = 0; i < n; i++)
        sym[i] = tu_below(&rng, 256);
    built a;
    uint64_t cut = n;
    g_itype = FKVF_SECTION_ZIDX; /* in place: ZPOS reads the whole stream at open */
    build(&a, &c, sym, &cut, 1, 0); /* block_size 256: 8 blocks of symbols */
    g_itype = FKVF_SECTION_ZPOS;
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, a.b.data, a.b.size, 0, NULL), FKVF_OK);
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    uint64_t strm = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        ck_assert_int_eq(fkvf_reader_section(r, i, &si), FKVF_OK);
        if (si.type == FKVF_SECTION_STRM)
            strm = si.offset;
    }
    fkvf_reader_free(r);
    ck_assert_uint_gt(strm, 0);
    /* data_off = align64(64 + 8 * 8) = 128: damage symbol 100 (block 0) */
    a.b.data[strm + 128 + 100] ^= 0xFF;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, a.b.data, a.b.size, 0, NULL), FKVF_OK);
    uint32_t ctx[16];
    size_t got;
    ck_assert_int_eq(fkvf_search_context(r, 0, 1999, 16, ctx, &got), FKVF_OK);
    ck_assert_int_eq(memcmp(ctx, sym + 1984, sizeof ctx), 0);
    /* the index answers a query at the end without reading block 0 */
    fkvf_search *s = NULL;
    ck_assert_int_eq(fkvf_search_open(&s, r, 0, 0, NULL), FKVF_OK);
    uint64_t out[4], nf;
    ck_assert_int_eq(fkvf_search_suffix(s, sym + 1990, 10, out, 4, &nf), FKVF_OK);
    ck_assert_uint_ge(nf, 1);
    ck_assert_uint_eq(out[nf - 1], 1999);
    /* a query longer than a key whose candidate needs block 0 reports it */
    ck_assert_int_eq(fkvf_search_suffix(s, sym + 80, 40, out, 4, &nf), FKVF_E_CHECKSUM);
    fkvf_search_free(s);
    ck_assert_int_eq(fkvf_search_context(r, 0, 110, 16, ctx, &got), FKVF_E_CHECKSUM);
    /* scanning everything reads every block */
    ck_assert_int_eq(fkvf_search_open(&s, r, 0, FKVF_SEARCH_NO_INDEX, NULL), FKVF_E_CHECKSUM);
    fkvf_search_free(s);
    fkvf_reader_free(r);
    tu_buf_free(&a.b);
    free(sym);
}
END_TEST

/* fkvf_archive_append_sections: an index commit appended to a file. */
START_TEST(append_index_to_file)
{
    char path[] = "/tmp/fkvf-search-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    tu_rng rng = {11};
    const cfg c = {FKVF_PROFILE_NGON, 0, 16, 0};
    uint64_t n = 700;
    uint32_t *sym = malloc(n * sizeof *sym);
    make_stream(&rng, &c, sym, n);
    built a;
    small_archive(&a, &c, sym, n, 0);
    FILE *f = fopen(path, "wb");
    ck_assert_uint_eq(fwrite(a.b.data, 1, a.b.size, f), a.b.size);
    fclose(f);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, 0, NULL), FKVF_OK);
    void *zd;
    size_t zs;
    uint64_t key;
    ck_assert_int_eq(fkvf_search_index_build(r, 0, &zd, &zs, &key, NULL), FKVF_OK);
    fkvf_reader_free(r);
    fkvf_section_add sa = {FKVF_SECTION_ZPOS, 0, key, zd, zs};
    fkvf_archive_op *op = NULL;
    fkvf_error_info er;
    int arc = fkvf_archive_append_sections(&op, path, &sa, 1, FKVF_SYNC_NONE);
    ck_assert_int_eq(fkvf_archive_op_error(op, &er), FKVF_OK);
    ck_assert_msg(arc == FKVF_OK, "%s", er.message);
    /* code FKVF_OK and "" after a success */
    ck_assert_int_eq(er.code, FKVF_OK);
    ck_assert_str_eq(er.message, "");
    ck_assert_ptr_null(er.clause);
    ck_assert_uint_eq(er.offset, FKVF_ERROR_NO_OFFSET);
    fkvf_archive_op_free(op);
    /* a known type is refused, the error as fields on the call's handle */
    fkvf_section_add bad = {FKVF_SECTION_EXAC, 1, 0, zd, zs};
    ck_assert_int_eq(fkvf_archive_append_sections(&op, path, &bad, 1, FKVF_SYNC_NONE),
                     FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_archive_op_error(op, &er), FKVF_OK);
    ck_assert_int_eq(er.code, FKVF_E_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(er.message, "section type"));
    ck_assert_str_eq(er.file, path);
    fkvf_archive_op_free(op);
    /* arguments wrong: no handle */
    op = (fkvf_archive_op *)&er; /* not NULL, so that the reset shows */
    ck_assert_int_eq(fkvf_archive_append_sections(&op, path, NULL, 1, FKVF_SYNC_NONE),
                     FKVF_E_INVALID_ARG);
    ck_assert_ptr_null(op);
    ck_assert_int_eq(fkvf_archive_append_sections(&op, path, &sa, 1, 2), FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_archive_append_sections(&op, NULL, &sa, 1, FKVF_SYNC_NONE),
                     FKVF_E_INVALID_ARG);
    ck_assert_int_eq(fkvf_archive_append_sections(NULL, path, &bad, 1, FKVF_SYNC_NONE),
                     FKVF_E_INVALID_ARG);
    {
        /* a file that is not an archive: the reader's error, code and clause */
        char junk[160];
        snprintf(junk, sizeof junk, "%s.junk", path);
        FILE *jf = fopen(junk, "wb");
        ck_assert_ptr_nonnull(jf);
        for (int i = 0; i < 256; i++)
            fputc('x', jf);
        fclose(jf);
        int rc = fkvf_archive_append_sections(&op, junk, &sa, 1, FKVF_SYNC_NONE);
        ck_assert_int_eq(rc, FKVF_E_BAD_MAGIC);
        ck_assert_int_eq(fkvf_archive_op_error(op, &er), FKVF_OK);
        ck_assert_int_eq(er.code, rc);
        ck_assert_ptr_nonnull(er.clause);
        ck_assert_str_eq(er.clause, "3.1");
        ck_assert_uint_eq(er.offset, 0);
        ck_assert_str_eq(er.file, junk);
        fkvf_archive_op_free(op);
        unlink(junk);
    }
    fkvf_search_buffer_free(zd, NULL);
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    ck_assert_msg(fkvf_reader_verify(r) == FKVF_OK, "%s", fkvf_reader_message(r));
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    ck_assert_uint_eq(ai.n_commits, 2);
    ck_assert_uint_eq(ai.n_positions, n);
    fkvf_search *s = NULL;
    ck_assert_int_eq(fkvf_search_open(&s, r, 0, 0, NULL), FKVF_OK);
    fkvf_search_status inf;
    fkvf_search_info(s, &inf);
    ck_assert_uint_gt(inf.n_indexed, n - 20);
    qset qs[40];
    size_t nq = make_queries(&rng, &c, sym, n, qs, 40);
    check_handle(s, sym, n, qs, nq, "appended index");
    for (size_t i = 0; i < nq; i++)
        free(qs[i].q);
    fkvf_search_free(s);
    fkvf_reader_free(r);
    tu_buf_free(&a.b);
    free(sym);
    unlink(path);
}
END_TEST

/* fkvf_search_index_build takes the caller's allocator: every byte, the
 * returned buffer included, comes from it, the result is the one the
 * default allocator gives, and a failing allocator leaks nothing. */
START_TEST(index_build_caller_allocator)
{
    tu_rng rng = {12};
    static const cfg cs[2] = {{FKVF_PROFILE_NGON, 0, 16, 0}, {FKVF_PROFILE_QUAD, 4, 0, 0}};
    for (int ci = 0; ci < 2; ci++) {
        uint64_t n = 500;
        uint32_t *sym = malloc(n * sizeof *sym);
        make_stream(&rng, &cs[ci], sym, n);
        built a;
        small_archive(&a, &cs[ci], sym, n, 0);
        fkvf_reader *r = NULL;
        ck_assert_int_eq(fkvf_reader_open_memory(&r, a.b.data, a.b.size, 0, NULL), FKVF_OK);
        void *d0, *d1;
        size_t z0, z1;
        uint64_t k0, k1;
        ck_assert_int_eq(fkvf_search_index_build(r, 0, &d0, &z0, &k0, NULL), FKVF_OK);
        tu_alloc ca = {0};
        fkvf_allocator al = tu_alloc_hook(&ca);
        ck_assert_int_eq(fkvf_search_index_build(r, 0, &d1, &z1, &k1, &al), FKVF_OK);
        ck_assert_int_gt(ca.calls, 0);
        ck_assert_int_eq(ca.live, 1); /* the buffer returned */
        ck_assert_uint_eq(z1, z0);
        ck_assert_uint_eq(k1, k0);
        ck_assert_mem_eq(d1, d0, z0);
        fkvf_search_buffer_free(d1, &al);
        ck_assert_int_eq(ca.live, 0);
        fkvf_search_buffer_free(d0, NULL);
        fkvf_search_buffer_free(NULL, &al);
        long calls = ca.calls;
        for (long k = 1; k <= calls; k++) {
            tu_alloc cf = {.fail_at = k};
            fkvf_allocator af = tu_alloc_hook(&cf);
            void *d = (void *)1;
            ck_assert_int_eq(fkvf_search_index_build(r, 0, &d, &z1, &k1, &af), FKVF_E_NOMEM);
            ck_assert_ptr_null(d);
            ck_assert_int_eq(cf.live, 0);
        }
        fkvf_reader_free(r);
        tu_buf_free(&a.b);
        free(sym);
    }
}
END_TEST

/* fkvf_archive_append_sections on an archive whose codebook has no key
 * stages (k_stages 0): its first index stream is value stage 0. The resume
 * path looked only for key stage 0, found no index group and refused the
 * commit ("archived positions need the index streams"); found by the
 * random archives of conformance_random. */
START_TEST(append_sections_value_stages_only)
{
    char path[] = "/tmp/fkvf-search-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    fkvf_writer_options o;
    fkvf_writer_options_init(&o);
    o.sync = FKVF_SYNC_NONE;
    fkvf_writer *w = NULL;
    ck_assert_int_eq(fkvf_writer_create_file(&w, path, &o, NULL), FKVF_OK);
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = 1;
    d.n_kv_heads = 1;
    d.key_dim = 2;
    d.value_dim = 2;
    d.dtype = FKVF_DTYPE_F32;
    ck_assert_int_eq(fkvf_writer_set_desc(w, &d), FKVF_OK);
    fkvf_codebook_shape cs = {1, 1, 2, 2, 16, 0, 1, FKVF_DTYPE_F32, 0, NULL};
    float tables[16 * 2];
    for (int i = 0; i < 32; i++)
        tables[i] = (float)i;
    ck_assert_int_eq(fkvf_writer_add_codebooks(w, &cs, tables, sizeof tables, 0), FKVF_OK);
    uint16_t codes[32];
    for (int i = 0; i < 32; i++)
        codes[i] = (uint16_t)(i * 7 % 16);
    fkvf_stream_spec sp = {FKVF_PROFILE_QUAD, 4, 0, 0, 0};
    ck_assert_msg(fkvf_writer_add_index_segment(w, &sp, 0, 32, codes, 1, 1) == FKVF_OK, "%s",
                  fkvf_writer_message(w));
    ck_assert_int_eq(fkvf_writer_set_positions(w, 32, 32), FKVF_OK);
    ck_assert_msg(fkvf_writer_finish(w) == FKVF_OK, "%s", fkvf_writer_message(w));
    fkvf_writer_free(w);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, 0, NULL), FKVF_OK);
    void *zd;
    size_t zs;
    uint64_t key;
    ck_assert_int_eq(fkvf_search_index_build(r, 0, &zd, &zs, &key, NULL), FKVF_OK);
    ck_assert_uint_eq(key, FKVF_STREAM_ID(0, 0, 0, 1, 0));
    fkvf_reader_free(r);
    fkvf_section_add sa = {FKVF_SECTION_ZPOS, 0, key, zd, zs};
    ck_assert_int_eq(fkvf_archive_append_sections(NULL, path, &sa, 1, FKVF_SYNC_NONE), FKVF_OK);
    fkvf_search_buffer_free(zd, NULL);
    ck_assert_int_eq(fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL), FKVF_OK);
    ck_assert_msg(fkvf_reader_verify(r) == FKVF_OK, "%s", fkvf_reader_message(r));
    fkvf_archive_info ai;
    ck_assert_int_eq(fkvf_reader_info(r, &ai), FKVF_OK);
    ck_assert_uint_eq(ai.n_commits, 2);
    ck_assert_uint_eq(ai.n_archived, 32);
    uint32_t got[32];
    ck_assert_int_eq(fkvf_reader_stream_read(r, 0, 0, got, 32), FKVF_OK);
    for (int i = 0; i < 32; i++)
        ck_assert_uint_eq(got[i], codes[i]);
    fkvf_reader_free(r);
    unlink(path);
}
END_TEST

START_TEST(radius_counts)
{
    /* a larger radius finds more candidates, never fewer verified */
    tu_rng rng = {21};
    const cfg c = {FKVF_PROFILE_NGON, 0, 256, 0};
    uint64_t n = 3000;
    uint32_t *sym = malloc(n * sizeof *sym);
    make_stream(&rng, &c, sym, n);
    built a;
    small_archive(&a, &c, sym, n, 1);
    fkvf_reader *r = NULL;
    ck_assert_int_eq(fkvf_reader_open_memory(&r, a.b.data, a.b.size, 0, NULL), FKVF_OK);
    for (int noidx = 0; noidx < 2; noidx++) {
        fkvf_search *s = NULL;
        ck_assert_int_eq(fkvf_search_open(&s, r, 0, noidx ? FKVF_SEARCH_NO_INDEX : 0, NULL),
                         FKVF_OK);
        uint32_t q[3];
        memcpy(q, sym + 1000, sizeof q);
        fkvf_radius_result r1, r2, r3;
        ck_assert_int_eq(fkvf_search_radius(s, q, 3, 0.0, NULL, 0, &r1), FKVF_OK);
        ck_assert_int_eq(fkvf_search_radius(s, q, 3, r1.radius * 100, NULL, 0, &r2), FKVF_OK);
        ck_assert_int_eq(fkvf_search_radius(s, q, 3, 5.0, NULL, 0, &r3), FKVF_OK);
        ck_assert_uint_ge(r1.verified, 1);
        ck_assert_uint_eq(r1.verified, r2.verified);
        ck_assert_uint_eq(r1.verified, r3.verified);
        ck_assert_uint_ge(r2.candidates, r1.candidates);
        ck_assert_uint_eq(r3.candidates, n);
        fkvf_search_free(s);
    }
    fkvf_reader_free(r);
    tu_buf_free(&a.b);
    free(sym);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("search");
    TCase *tc = tcase_create("search");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, oracle_scan, 0, (int)NCFG);
    tcase_add_loop_test(tc, oracle_multisegment, 0, (int)NCFG);
    tcase_add_loop_test(tc, oracle_indexed, 0, (int)NCFG);
    tcase_add_loop_test(tc, oracle_indexed_tail, 0, (int)NCFG);
    tcase_add_loop_test(tc, oracle_zidx, 0, (int)NCFG);
    tcase_add_loop_test(tc, three_ways, 0, 3);
    tcase_add_test(tc, zpos_size);
    tcase_add_test(tc, corrupt_zpos);
    tcase_add_test(tc, worked_example_quad8);
    tcase_add_test(tc, context_and_prefix_reuse);
    tcase_add_test(tc, no_token_stream);
    tcase_add_test(tc, index_streams);
    tcase_add_test(tc, stale_index_ignored);
    tcase_add_test(tc, corrupt_index);
    tcase_add_test(tc, append_index_to_file);
    tcase_add_test(tc, index_build_caller_allocator);
    tcase_add_test(tc, append_sections_value_stages_only);
    tcase_add_test(tc, index_flags);
    tcase_add_test(tc, empty_stream);
    tcase_add_test(tc, touches_only_needed_blocks);
    tcase_add_test(tc, radius_counts);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
