/* Key retrieval (fkvf.h "key retrieval"; docs/retrieval.md): the archived
 * positions whose decoded keys a query weighs most, answered from the
 * codebook and the index streams in place. Uses the reader, the quantizer's
 * decode-only tables and the suffix search through the public API, and the
 * RoPE arithmetic of common/rope.h. */
/* (the library builds with FKVF_STATIC_LINKING_ONLY: fkvf_rvq_from_tables_decode,
 * fkvf_rvq_centroids) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "error.h"
#include "fkvf.h"
#include "handle.h"
#include "rope.h"

#define CBK1_HEADER 64 /* the CBK1 header before the tables (spec 13.2) */
/* A candidate's rotation to its position p (keys archived before rotation)
 * is composed from tables of the angles of p's base-256 digits: cos and sin
 * of (b << 8 d) * freq for every digit value b, digit d < DIGITS and pair,
 * so that a candidate costs DIGITS - 1 complex products a pair instead of a
 * sin and a cos (which dominated a query); positions from 2^40 on use sin
 * and cos. */
#define DIGITS 5
#define DIGIT_VALUES 256

struct fkvf_key_search {
    fkvf_handle h; /* kind FKVF_HANDLE_KEY_SEARCH; OPEN, or FAILED by its open */
    const fkvf_allocator *alloc;
    fkvf_diag diag;
    fkvf_reader *r;
    fkvf_desc desc;
    uint64_t n_archived;
    unsigned ks;     /* key stages (the most of any layer) */
    uint8_t *lks;    /* [layer]: key stages of the layer (spec 13.1 layer table) */
    uint32_t k;      /* centroids a stage */
    int pre_rope;    /* keys archived before rotation (key_storage 1) */
    fkvf_rope rope;
    fkvf_rvq *q;              /* decode-only binary32 tables */
    size_t *stream;           /* [layer][head][stage]: reader stream index of key stage */
    fkvf_search **s0;         /* [layer][head]: suffix search on stage 0, opened lazily */
    /* scratch, grown as needed */
    /* (chunk, symbol) scores of a query; a max-heap while gathering */
    struct entry { double score; uint32_t sym, chunk; } *ent;
    size_t ent_cap;
    /* the stage-0 positions (stream indices, ascending) of each symbol
     * fetched by this query: pool[off[s] .. off[s] + cnt[s]); off SIZE_MAX:
     * not fetched */
    uint64_t *pool;
    size_t pool_cap, *off, *cnt;
    fkvf_key_hit *cand;
    size_t cand_cap;
    double *qt; /* key_dim: the query the centroids are scored with */
    float *vec; /* key_dim: a decoded key */
    double *freq; /* rope_dims / 2: theta^(-2i / rope_dims) */
    double *rot;  /* [DIGITS][DIGIT_VALUES][rope_dims / 2][2]: cos, sin; built on first use */
};

#define FAIL(code, ...) fkvf_fail(&ks->diag, code, FKVF_NO_OFFSET, NULL, __VA_ARGS__)

FKVF_API void fkvf_search_keys_free(fkvf_key_search *ks)
{
    if (!FKVF_HANDLE_IS(ks, FKVF_HANDLE_KEY_SEARCH))
        return;
    const fkvf_allocator *a = ks->alloc;
    if (ks->s0)
        for (size_t i = 0; i < (size_t)ks->desc.n_layers * ks->desc.n_kv_heads; i++)
            fkvf_search_free(ks->s0[i]);
    fkvf_free(a, ks->s0);
    fkvf_free(a, ks->stream);
    fkvf_free(a, ks->lks);
    fkvf_rvq_free(ks->q);
    fkvf_free(a, ks->ent);
    fkvf_free(a, ks->pool);
    fkvf_free(a, ks->off);
    fkvf_free(a, ks->cnt);
    fkvf_free(a, ks->cand);
    fkvf_free(a, ks->qt);
    fkvf_free(a, ks->vec);
    fkvf_free(a, ks->freq);
    fkvf_free(a, ks->rot);
    ks->h.magic = 0;
    fkvf_free(a, ks);
}

FKVF_API const char *fkvf_search_keys_message(const fkvf_key_search *ks)
{
    if (!FKVF_HANDLE_IS(ks, FKVF_HANDLE_KEY_SEARCH))
        return "not a key search handle";
    return ks->diag.msg[0] ? ks->diag.msg : "ok";
}

FKVF_API int fkvf_search_keys_error(const fkvf_key_search *ks, fkvf_error_info *out)
{
    return fkvf_diag_report(FKVF_HANDLE_IS(ks, FKVF_HANDLE_KEY_SEARCH) ? &ks->diag : NULL,
                            "not a key search handle", out);
}

/* the open of a handle made: the archive's shape, codebook and key streams */
static int open_archive(fkvf_key_search *ks, fkvf_reader *r)
{
    const fkvf_allocator *alloc = ks->alloc;
    fkvf_archive_info ai;
    int rc = fkvf_reader_info(r, &ai);
    if (rc)
        return FAIL(rc, "%s", fkvf_reader_message(r));
    if (!ai.has_desc)
        return FAIL(FKVF_E_NOT_FOUND, "%s: a codebook file has no archived positions to search",
                    fkvf_reader_file_name(r));
    if ((rc = fkvf_reader_desc(r, &ks->desc)))
        return FAIL(rc, "%s", fkvf_reader_message(r));
    ks->n_archived = ai.n_archived;
    fkvf_codebook_shape sh;
    const void *cbk;
    size_t size;
    uint8_t hash[16];
    if ((rc = fkvf_reader_codebook(r, &sh, &cbk, &size, hash)))
        return FAIL(rc, "%s: %s", fkvf_reader_file_name(r),
                    rc == FKVF_E_NOT_FOUND ? "the archive has no codebook (every position exact)"
                                           : fkvf_reader_message(r));
    if (sh.k_stages == 0)
        return FAIL(FKVF_E_NOT_FOUND, "%s: the codebook has no key stages",
                    fkvf_reader_file_name(r));
    const size_t to = (size_t)fkvf_codebook_tables_offset(&sh); /* after the layer table */
    if (size < to || to < CBK1_HEADER)
        return FAIL(FKVF_E_CORRUPT, "%s: codebook of %zu bytes", fkvf_reader_file_name(r), size);
    rc = fkvf_rvq_from_tables_decode(&ks->q, &sh, ks->desc.n_kv_heads, (const uint8_t *)cbk + to,
                                     size - to, alloc);
    if (rc)
        return FAIL(rc, "%s: the codebook's tables: %s", fkvf_reader_file_name(r),
                    fkvf_strerror(rc));
    ks->ks = sh.k_stages;
    if (!(ks->lks = fkvf_malloc(alloc, sh.n_layers)))
        return FAIL(FKVF_E_NOMEM, "out of memory");
    for (uint32_t l = 0; l < sh.n_layers; l++)
        ks->lks[l] = (uint8_t)fkvf_layer_k_stages(&sh, l);
    ks->k = sh.k;
    ks->pre_rope = ks->desc.key_storage == 1;
    if (ks->pre_rope) {
        ks->rope.layout = ks->desc.rope_layout;
        ks->rope.rope_dims = ks->desc.rope_dims;
        ks->rope.theta = ks->desc.rope_theta;
        if (!fkvf_rope_valid(&ks->rope, ks->desc.key_dim))
            return FAIL(FKVF_E_CORRUPT, "%s: keys archived before rotation with invalid RoPE "
                        "parameters", fkvf_reader_file_name(r));
        if (!(ks->freq = fkvf_calloc(alloc, ks->rope.rope_dims / 2, sizeof *ks->freq)))
            return FAIL(FKVF_E_NOMEM, "out of memory");
        fkvf_rope_freqs(&ks->rope, ks->freq);
    }
    size_t LH, LHS;
    if (!fkvf_mulsz(ks->desc.n_layers, ks->desc.n_kv_heads, &LH) ||
        !fkvf_mulsz(LH, ks->ks, &LHS))
        return FAIL(FKVF_E_LIMIT, "%u layers x %u heads x %u stages: too many for a size_t",
                    ks->desc.n_layers, ks->desc.n_kv_heads, ks->ks);
    ks->stream = fkvf_calloc(alloc, LHS, sizeof *ks->stream);
    ks->s0 = fkvf_calloc(alloc, LH, sizeof *ks->s0);
    ks->off = fkvf_calloc(alloc, ks->k, sizeof *ks->off);
    ks->cnt = fkvf_calloc(alloc, ks->k, sizeof *ks->cnt);
    ks->qt = fkvf_calloc(alloc, ks->desc.key_dim, sizeof *ks->qt);
    ks->vec = fkvf_calloc(alloc, ks->desc.key_dim, sizeof *ks->vec);
    if (!ks->stream || !ks->s0 || !ks->off || !ks->cnt || !ks->qt || !ks->vec)
        return FAIL(FKVF_E_NOMEM, "out of memory");
    if (ks->n_archived == 0)
        return FKVF_OK; /* no streams to look at: every query finds nothing */
    for (uint32_t l = 0; l < ks->desc.n_layers; l++)
        for (uint32_t hd = 0; hd < ks->desc.n_kv_heads; hd++)
            for (unsigned s = 0; s < ks->lks[l]; s++) {
                const uint64_t id = FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, l, hd, 0, s);
                size_t *at = ks->stream + ((size_t)l * ks->desc.n_kv_heads + hd) * ks->ks + s;
                if ((rc = fkvf_reader_stream_find(r, id, at)))
                    return FAIL(rc, "%s: the key stream of layer %u, head %u, stage %u: %s",
                                fkvf_reader_file_name(r), l, hd, s, fkvf_reader_message(r));
            }
    return FKVF_OK;
}

FKVF_API int fkvf_search_keys_open(fkvf_key_search **out, fkvf_reader *r,
                                   const fkvf_allocator *alloc)
{
    if (!out)
        return FKVF_E_INVALID_ARG;
    *out = NULL;
    if (!r)
        return FKVF_E_INVALID_ARG;
    alloc = fkvf_alloc_or_default(alloc);
    fkvf_key_search *ks = fkvf_calloc(alloc, 1, sizeof *ks);
    if (!ks)
        return FKVF_E_NOMEM;
    fkvf_handle_init(&ks->h, FKVF_HANDLE_KEY_SEARCH);
    ks->alloc = alloc;
    ks->diag.name = "key search";
    ks->r = r;
    *out = ks;
    const int rc = open_archive(ks, r);
    if (rc) /* every later call returns this error and keeps the message */
        fkvf_handle_fail(&ks->h, rc);
    return rc;
}

/* 1 when entry x comes before y: higher score, then smaller symbol, then
 * earlier chunk */
static int ent_before(const struct entry *x, const struct entry *y)
{
    if (x->score != y->score)
        return x->score > y->score;
    if (x->sym != y->sym)
        return x->sym < y->sym;
    return x->chunk < y->chunk;
}

static void sift_down(struct entry *h, size_t n, size_t i)
{
    for (;;) {
        size_t b = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ent_before(&h[l], &h[b]))
            b = l;
        if (r < n && ent_before(&h[r], &h[b]))
            b = r;
        if (b == i)
            return;
        struct entry t = h[i];
        h[i] = h[b];
        h[b] = t;
        i = b;
    }
}

static int cmp_hit(const void *a, const void *b)
{
    const fkvf_key_hit *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return (x->position > y->position) - (x->position < y->position);
}

/* the digit tables (see DIGITS) */
static int build_rot(fkvf_key_search *ks)
{
    const uint32_t half = ks->rope.rope_dims / 2;
    ks->rot = fkvf_calloc(ks->alloc, (size_t)DIGITS * DIGIT_VALUES * half * 2, sizeof *ks->rot);
    if (!ks->rot)
        return FAIL(FKVF_E_NOMEM, "out of memory");
    double *t = ks->rot;
    for (unsigned d = 0; d < DIGITS; d++)
        for (unsigned b = 0; b < DIGIT_VALUES; b++)
            for (uint32_t i = 0; i < half; i++) {
                const double a = (double)((uint64_t)b << (8 * d)) * ks->freq[i];
                *t++ = cos(a);
                *t++ = sin(a);
            }
    return FKVF_OK;
}

/* cos and sin of p * freq[i] into cs[2 i], cs[2 i + 1] for every pair */
static void rot_of(const fkvf_key_search *ks, uint64_t p, double *cs)
{
    const uint32_t half = ks->rope.rope_dims / 2;
    if (p >> (8 * DIGITS)) {
        for (uint32_t i = 0; i < half; i++) {
            cs[2 * i] = cos((double)p * ks->freq[i]);
            cs[2 * i + 1] = sin((double)p * ks->freq[i]);
        }
        return;
    }
    const double *t0 = ks->rot + (size_t)(p & 0xFF) * half * 2;
    memcpy(cs, t0, (size_t)half * 2 * sizeof *cs);
    for (unsigned d = 1; d < DIGITS && (p >> (8 * d)); d++) {
        const double *t = ks->rot + ((size_t)d * DIGIT_VALUES + ((p >> (8 * d)) & 0xFF)) * half * 2;
        for (uint32_t i = 0; i < half; i++) {
            const double c = cs[2 * i], s = cs[2 * i + 1];
            cs[2 * i] = c * t[2 * i] - s * t[2 * i + 1];
            cs[2 * i + 1] = c * t[2 * i + 1] + s * t[2 * i];
        }
    }
}

/* The key of archived position p of (layer, head) decoded from all its key
 * stages (spec 13.6: the centroids summed in stage order in binary32,
 * rotated to p in binary64 and rounded once when archived before rotation,
 * as restore does; cos and sin from the digit tables may differ from
 * restore's in the last bit) into ks->vec. cs: scratch of rope_dims
 * doubles. */
static int decode_key(fkvf_key_search *ks, uint32_t layer, uint32_t head, uint64_t p, double *cs)
{
    const uint32_t D = ks->desc.key_dim;
    const size_t *st = ks->stream + ((size_t)layer * ks->desc.n_kv_heads + head) * ks->ks;
    const uint64_t a = p - ks->desc.n_sinks; /* its symbol in the index streams (spec 11) */
    for (uint32_t d = 0; d < D; d++)
        ks->vec[d] = 0.0f;
    for (unsigned s = 0; s < ks->lks[layer]; s++) {
        uint32_t sym;
        int rc = fkvf_reader_stream_get(ks->r, st[s], a, &sym);
        if (rc)
            return FAIL(rc, "%s", fkvf_reader_message(ks->r));
        if (sym >= ks->k)
            return FAIL(FKVF_E_SYMBOL, "%s: position %llu, key stage %u: symbol %u >= k = %u",
                        fkvf_reader_file_name(ks->r), (unsigned long long)p, s, sym, ks->k);
        const float *c = fkvf_rvq_centroids(ks->q, layer, head, 0, s) + (size_t)sym * D;
        for (uint32_t d = 0; d < D; d++)
            ks->vec[d] += c[d];
    }
    if (ks->pre_rope) {
        const uint32_t half = ks->rope.rope_dims / 2;
        rot_of(ks, p, cs);
        for (uint32_t i = 0; i < half; i++) {
            float *x0 = ks->vec + (ks->rope.layout == 1 ? 2 * (size_t)i : i);
            float *x1 = ks->vec + (ks->rope.layout == 1 ? 2 * (size_t)i + 1 : i + half);
            double v0 = *x0, v1 = *x1;
            fkvf_rope_turn(cs[2 * i], cs[2 * i + 1], &v0, &v1);
            *x0 = (float)v0;
            *x1 = (float)v1;
        }
    }
    return FKVF_OK;
}

/* the arguments of a query: present, of the key dimension, a layer and head
 * of the archive with key stages, finite, candidates within the limit */
static int check_query(fkvf_key_search *ks, const fkvf_key_query *kq, const fkvf_key_hit *out,
                       const size_t *n_out)
{
    if (!kq || !n_out || (!out && kq->m > 0) || !kq->query)
        return FAIL(FKVF_E_INVALID_ARG, "NULL argument");
    const uint32_t D = ks->desc.key_dim;
    if (kq->dim != D)
        return FAIL(FKVF_E_INVALID_ARG, "the query has %zu components; the keys have %u",
                    kq->dim, D);
    if (kq->layer >= ks->desc.n_layers || kq->head >= ks->desc.n_kv_heads)
        return FAIL(FKVF_E_RANGE, "layer %u, head %u: the archive has %u layers of %u KV heads",
                    kq->layer, kq->head, ks->desc.n_layers, ks->desc.n_kv_heads);
    if (!ks->lks[kq->layer])
        return FAIL(FKVF_E_NOT_FOUND, "layer %u: the codebook has no key stages for it",
                    kq->layer);
    for (uint32_t d = 0; d < D; d++)
        if (!isfinite(kq->query[d]))
            return FAIL(FKVF_E_INVALID_ARG, "query component %u is not finite", d);
    if (kq->candidates > FKVF_KEY_CANDIDATES_MAX)
        return FAIL(FKVF_E_INVALID_ARG, "candidates %u: at most %u", kq->candidates,
                    (unsigned)FKVF_KEY_CANDIDATES_MAX);
    return FKVF_OK;
}

/* what a query searches: the archived positions [lo, hi) in nch chunks of
 * clen positions (the last one shorter) */
typedef struct key_plan {
    uint64_t lo, hi, clen, nch;
    uint64_t need;  /* candidates wanted: m x the candidate factor, at most the range */
    uint64_t n_ent; /* (chunk, symbol) scores: nch x k */
} key_plan;

/* the range [lo, hi) and the candidates wanted; 0 when there is nothing to
 * search (m == 0 or an empty range) */
static int plan_range(const fkvf_key_search *ks, const fkvf_key_query *kq, key_plan *pl)
{
    const uint64_t S = ks->desc.n_sinks, A = ks->n_archived;
    pl->lo = kq->first > S ? kq->first : S;
    pl->hi = S + A;
    if (kq->end && kq->end < pl->hi)
        pl->hi = kq->end;
    if (kq->m == 0 || pl->lo >= pl->hi)
        return 0;
    const uint64_t range = pl->hi - pl->lo;
    const unsigned cf = kq->candidates ? kq->candidates : FKVF_KEY_CANDIDATES;
    if (!fkvf_mul64((uint64_t)kq->m, cf, &pl->need) || pl->need > range)
        pl->need = range;
    return 1;
}

/* the chunks: keys archived before rotation, kq->chunk positions each;
 * otherwise the whole range. FKVF_E_LIMIT when they make too many scores. */
static int plan_chunks(fkvf_key_search *ks, const fkvf_key_query *kq, key_plan *pl)
{
    const uint64_t range = pl->hi - pl->lo;
    uint64_t clen = range;
    if (ks->pre_rope && kq->chunk < range) {
        clen = kq->chunk;
        if (!clen) { /* the default, longer where the range would need too many scores */
            const uint64_t most = FKVF_KEY_SCORES_MAX / ks->k;
            clen = range / most + (range % most != 0);
            clen = clen > FKVF_KEY_CHUNK ? clen : FKVF_KEY_CHUNK;
        }
    }
    const uint64_t nch = range / clen + (range % clen != 0);
    pl->clen = clen;
    pl->nch = nch;
    if (!fkvf_mul64(nch, ks->k, &pl->n_ent) || pl->n_ent > FKVF_KEY_SCORES_MAX)
        return FAIL(FKVF_E_LIMIT, "chunks of %llu positions over %llu make %llu x %u centroid "
                    "scores; at most %u",
                    (unsigned long long)clen, (unsigned long long)range,
                    (unsigned long long)nch, ks->k, (unsigned)FKVF_KEY_SCORES_MAX);
    return FKVF_OK;
}

/* 1. the stage-0 centroids scored with q (keys as cached) or, per chunk,
 *    with the mean over the chunk of R(p)^T q (keys archived before
 *    rotation), into ks->ent; then made a max-heap */
static int score_centroids(fkvf_key_search *ks, const fkvf_key_query *kq, const key_plan *pl)
{
    const uint32_t D = ks->desc.key_dim;
    const float *c0 = fkvf_rvq_centroids(ks->q, kq->layer, kq->head, 0, 0);
    if (!c0)
        return FAIL(FKVF_E_STATE, "the codebook's tables are not available");
    for (uint64_t c = 0; c < pl->nch; c++) {
        const uint64_t a = pl->lo + c * pl->clen;
        const uint64_t len = pl->hi - a < pl->clen ? pl->hi - a : pl->clen;
        for (uint32_t d = 0; d < D; d++)
            ks->qt[d] = kq->query[d];
        if (ks->pre_rope)
            fkvf_rope_mean_transpose(&ks->rope, ks->freq, ks->qt, a, len);
        struct entry *e = ks->ent + (size_t)c * ks->k;
        for (uint32_t j = 0; j < ks->k; j++) {
            double sc = 0;
            for (uint32_t d = 0; d < D; d++)
                sc += ks->qt[d] * (double)c0[(size_t)j * D + d];
            e[j].score = sc == sc ? sc : -INFINITY; /* NaN (inf - inf) ranks last */
            e[j].sym = j;
            e[j].chunk = (uint32_t)c;
        }
    }
    const size_t heap = (size_t)pl->n_ent;
    for (size_t i = heap / 2; i-- > 0;)
        sift_down(ks->ent, heap, i);
    return FKVF_OK;
}

/* the suffix search on the stage-0 stream of (layer, head) lh, opened on
 * first use */
static int open_stage0(fkvf_key_search *ks, size_t lh, fkvf_search **s0)
{
    int rc;
    if (!*s0 && (rc = fkvf_search_open(s0, ks->r, ks->stream[lh * ks->ks], 0, ks->alloc))) {
        FAIL(rc, "%s", fkvf_search_message(*s0));
        fkvf_search_free(*s0);
        *s0 = NULL;
        return rc;
    }
    return FKVF_OK;
}

/* the stage-0 positions of sym appended to the pool at *pool_n (grown as
 * needed), recorded in ks->off and ks->cnt */
static int fetch_symbol(fkvf_key_search *ks, fkvf_search *s0, uint32_t sym, size_t *pool_n)
{
    uint64_t found;
    for (;;) {
        int rc = fkvf_search_suffix(s0, &sym, 1, ks->pool + *pool_n, ks->pool_cap - *pool_n,
                                    &found);
        if (rc)
            return FAIL(rc, "%s", fkvf_search_message(s0));
        if (found <= ks->pool_cap - *pool_n)
            break;
        if (found > SIZE_MAX / sizeof *ks->pool - *pool_n ||
            fkvf_grow(ks->alloc, (void **)&ks->pool, &ks->pool_cap, *pool_n + (size_t)found,
                      sizeof *ks->pool))
            return FAIL(FKVF_E_NOMEM, "out of memory");
    }
    ks->off[sym] = *pool_n;
    ks->cnt[sym] = (size_t)found;
    *pool_n += (size_t)found;
    return FKVF_OK;
}

/* the fetched positions of entry e's symbol inside its chunk appended to the
 * candidates at *n */
static int add_chunk_candidates(fkvf_key_search *ks, const key_plan *pl, const struct entry *e,
                                size_t *n)
{
    const uint64_t S = ks->desc.n_sinks;
    const uint32_t sym = e->sym;
    /* the chunk's positions [a, b) as stream indices [a - S, b - S) */
    const uint64_t c_first = pl->lo + (uint64_t)e->chunk * pl->clen;
    const uint64_t c_end = pl->hi - c_first < pl->clen ? pl->hi : c_first + pl->clen;
    const uint64_t a = c_first - S, b = c_end - S;
    const uint64_t *v = ks->pool + ks->off[sym];
    size_t l = 0, r = ks->cnt[sym];
    while (l < r) { /* the first index >= a */
        const size_t mid = l + (r - l) / 2;
        if (v[mid] < a)
            l = mid + 1;
        else
            r = mid;
    }
    for (size_t i = l; i < ks->cnt[sym] && v[i] < b; i++) {
        if (*n == ks->cand_cap &&
            fkvf_grow(ks->alloc, (void **)&ks->cand, &ks->cand_cap, *n + 1, sizeof *ks->cand))
            return FAIL(FKVF_E_NOMEM, "out of memory");
        ks->cand[*n].position = S + v[i];
        ks->cand[(*n)++].score = 0;
    }
    return FKVF_OK;
}

/* 2. best entries first, the positions of the entry's symbol in its chunk
 *    (a length-1 suffix query on the stage-0 stream, once a symbol and
 *    query), until there are pl->need candidates: *n of them, *searched
 *    symbols fetched */
static int gather_candidates(fkvf_key_search *ks, const fkvf_key_query *kq, const key_plan *pl,
                             size_t *n, uint64_t *searched)
{
    const size_t lh = (size_t)kq->layer * ks->desc.n_kv_heads + kq->head;
    fkvf_search **s0 = ks->s0 + lh;
    int rc = open_stage0(ks, lh, s0);
    if (rc)
        return rc;
    for (uint32_t j = 0; j < ks->k; j++)
        ks->off[j] = SIZE_MAX;
    size_t heap = (size_t)pl->n_ent, pool_n = 0;
    while (heap > 0 && *n < pl->need) {
        const struct entry e = ks->ent[0];
        ks->ent[0] = ks->ent[--heap];
        sift_down(ks->ent, heap, 0);
        if (ks->off[e.sym] == SIZE_MAX) { /* fetch the symbol's positions */
            if ((rc = fetch_symbol(ks, *s0, e.sym, &pool_n)))
                return rc;
            (*searched)++;
        }
        if ((rc = add_chunk_candidates(ks, pl, &e, n)))
            return rc;
    }
    return FKVF_OK;
}

/* 3. each of the n candidates scored with its key decoded from every key
 *    stage */
static int score_candidates(fkvf_key_search *ks, const fkvf_key_query *kq, size_t n)
{
    int rc;
    if (ks->pre_rope && n && !ks->rot && (rc = build_rot(ks)))
        return rc;
    double *cs = ks->qt; /* step 1 is done with it: rope_dims doubles of scratch */
    for (size_t i = 0; i < n; i++) {
        if ((rc = decode_key(ks, kq->layer, kq->head, ks->cand[i].position, cs)))
            return rc;
        double s = 0;
        for (uint32_t d = 0; d < ks->desc.key_dim; d++)
            s += (double)kq->query[d] * (double)ks->vec[d];
        ks->cand[i].score = s == s ? s : -INFINITY; /* NaN (inf - inf) ranks last */
    }
    return FKVF_OK;
}

FKVF_API int fkvf_search_keys(fkvf_key_search *ks, const fkvf_key_query *kq, fkvf_key_hit *out,
                              size_t *n_out, fkvf_key_stats *stats)
{
    int rc = FKVF_HANDLE_ENTER(ks, FKVF_HANDLE_KEY_SEARCH, "key search");
    if (rc)
        return rc;
    if (n_out)
        *n_out = 0;
    if (stats)
        memset(stats, 0, sizeof *stats);
    if ((rc = check_query(ks, kq, out, n_out)))
        return rc;
    key_plan pl;
    if (!plan_range(ks, kq, &pl))
        return FKVF_OK;
    if ((rc = plan_chunks(ks, kq, &pl)))
        return rc;
    if (fkvf_grow(ks->alloc, (void **)&ks->ent, &ks->ent_cap, (size_t)pl.n_ent, sizeof *ks->ent))
        return FAIL(FKVF_E_NOMEM, "out of memory");
    if ((rc = score_centroids(ks, kq, &pl)))
        return rc;
    size_t n = 0;
    uint64_t searched = 0;
    if ((rc = gather_candidates(ks, kq, &pl, &n, &searched)))
        return rc;
    if ((rc = score_candidates(ks, kq, n)))
        return rc;
    qsort(ks->cand, n, sizeof *ks->cand, cmp_hit);
    const size_t k = n < kq->m ? n : kq->m;
    if (k)
        memcpy(out, ks->cand, k * sizeof *out);
    *n_out = k;
    if (stats) {
        stats->centroids_scored = pl.n_ent;
        stats->symbols_searched = searched;
        stats->candidates = n;
    }
    return FKVF_OK;
}
