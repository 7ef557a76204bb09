/* fkvf_reader_read: random access to a selection of positions, layers, heads
 * and K / V of an archive (spec 11.5, 13.6, 14), in one of two layouts.
 *
 * Every element is bit-identical to fkvf_reader_restore's: exact rows are the
 * EXAC bytes through fkvf_convert; archived vectors are the binary32 sum of
 * their centroids in stage order from +0.0 (fkvf_rvq_centroids), keys rotated
 * to their position by common/rope.h, the code fkvf_rvq_decode rotates them
 * with (angles, sines and cosines in binary64, the pair rotation in binary64,
 * one rounding to binary32), then fkvf_convert (or, for f16, the F16C store
 * of common/half.h that fkvf_rvq_decode uses) to the output dtype. With an
 * f16 codebook (and AVX + F16C), LAYOUT_ROWS reads the centroid rows from
 * the CBK1 contents as stored, half the bytes of the binary32 tables, each
 * element widened exactly before the same additions: the same bits.
 *
 * What is touched: all index streams share their segments (spec 11.2), so the
 * segment of a position range is found once; the byte offset of every
 * selected stream's symbols is computed directly, and only the blocks holding
 * those bytes are verified (once: the segment's block flags). Exact rows are
 * read from the covering EXAC section only.
 *
 * Order of work: LAYOUT_ROWS goes position by position (the rows of all
 * selected streams of a position prefetched, then summed in output order);
 * LAYOUT_HEADS goes head by head over blocks of positions, so that a head's
 * stage tables stay in cache for the block. Values are summed into a staging
 * buffer in output order and converted to the output dtype one contiguous
 * run at a time. */
#include <string.h>

#include "alloc.h"
#include "ckd.h"
#include "cbk1_layout.h"
#include "cpu.h"
#include "half.h"
#include "le.h"
#include "restore.h"
#include "rope.h"
#include "stage_sum.h"
#include "vec16.h"

#define FAIL(code, off, clause, ...) fkvf_fail(&r->diag, code, off, clause, __VA_ARGS__)

/* LAYOUT_ROWS: at most this many codes (positions x selected streams) per
 * chunk of positions, and at most MAX_CHUNK positions */
#define CODE_BUDGET 16384u
#define MAX_CHUNK 64u
/* LAYOUT_HEADS: positions per block (each head's stage tables are read once
 * per block), at most CS_BUDGET / rope_dims of them */
#define HEADS_CHUNK 256u
#define CS_BUDGET 16384u
/* binary32 values staged before one conversion to the output dtype */
#define STAGE_FLOATS 8192u

/* A validated request: the selection and the output geometry (elements). */
typedef struct plan {
    uint64_t first, count;
    uint32_t l0, nl, h0, nh;
    int keys, vals;
    uint32_t dk, dv;       /* key_dim, value_dim */
    uint32_t dks, dvs;     /* selected: dk or 0, dv or 0 */
    fkvf_dtype dt;
    fkvf_layout layout;
    size_t es;             /* output element size */
    size_t total;          /* output elements */
    size_t row_e;          /* ROWS: elements per position */
    size_t layer_e;        /* ROWS: per layer within a position; HEADS: per layer block */
    size_t vbase;          /* offset of the values within a layer (row or block) */
} plan;

static int plan_make(fkvf_diag *d, const fkvf_reader *r, const fkvf_read_request *q, plan *p)
{
    if (!q)
        return FKVF_E_INVALID_ARG;
    if (!r->n_commits || !r->has_desc)
        return fkvf_fail(d, FKVF_E_STATE, FKVF_NO_OFFSET, "8",
                         "no DESC section: not a cache archive");
    memset(p, 0, sizeof *p);
    if (q->parts & ~(FKVF_PART_KEYS | FKVF_PART_VALUES))
        return fkvf_fail(d, FKVF_E_INVALID_ARG, FKVF_NO_OFFSET, NULL,
                         "parts 0x%x: FKVF_PART_KEYS | FKVF_PART_VALUES, or 0 for both",
                         q->parts);
    unsigned parts = q->parts ? q->parts : FKVF_PART_KEYS | FKVF_PART_VALUES;
    p->es = fkvf_dtype_size((int)q->dtype);
    if (!p->es)
        return fkvf_fail(d, FKVF_E_INVALID_ARG, FKVF_NO_OFFSET, NULL, "dtype %d is not an FKVF_DTYPE_*",
                         (int)q->dtype);
    if (q->layout != FKVF_LAYOUT_ROWS && q->layout != FKVF_LAYOUT_HEADS)
        return fkvf_fail(d, FKVF_E_INVALID_ARG, FKVF_NO_OFFSET, NULL,
                         "layout %d is not an FKVF_LAYOUT_*", (int)q->layout);
    const fkvf_desc *ds = &r->desc;
    if (q->first > r->n_positions || q->count > r->n_positions - q->first)
        return fkvf_fail(d, FKVF_E_RANGE, FKVF_NO_OFFSET, NULL,
                         "positions [%llu, +%llu) outside the archive's %llu",
                         (unsigned long long)q->first, (unsigned long long)q->count,
                         (unsigned long long)r->n_positions);
    if (q->layer_first >= ds->n_layers || q->layer_count > ds->n_layers - q->layer_first)
        return fkvf_fail(d, FKVF_E_RANGE, FKVF_NO_OFFSET, NULL,
                         "layers [%u, +%u) outside the archive's %u", q->layer_first,
                         q->layer_count, ds->n_layers);
    if (q->head_first >= ds->n_kv_heads || q->head_count > ds->n_kv_heads - q->head_first)
        return fkvf_fail(d, FKVF_E_RANGE, FKVF_NO_OFFSET, NULL,
                         "heads [%u, +%u) outside the archive's %u", q->head_first, q->head_count,
                         ds->n_kv_heads);
    p->first = q->first;
    p->count = q->count;
    p->l0 = q->layer_first;
    p->nl = q->layer_count ? q->layer_count : ds->n_layers - q->layer_first;
    p->h0 = q->head_first;
    p->nh = q->head_count ? q->head_count : ds->n_kv_heads - q->head_first;
    p->keys = (parts & FKVF_PART_KEYS) != 0;
    p->vals = (parts & FKVF_PART_VALUES) != 0;
    p->dk = ds->key_dim;
    p->dv = ds->value_dim;
    p->dks = p->keys ? p->dk : 0;
    p->dvs = p->vals ? p->dv : 0;
    p->dt = q->dtype;
    p->layout = q->layout;
    /* per (layer, head) elements: at most 2 * 16384; per layer: * 1024 heads;
     * per position: * 1024 layers: below 2^36, so only the products with the
     * position count and the element size can overflow */
    uint64_t per_lh = (uint64_t)p->dks + p->dvs;
    uint64_t layer_pos = per_lh * p->nh, all, bytes;
    size_t bytes_sz;
    if (!fkvf_mul64(layer_pos * p->nl, p->count, &all) || !fkvf_mul64(all, p->es, &bytes) ||
        !fkvf_tosz(bytes, &bytes_sz))
        return fkvf_fail(d, FKVF_E_LIMIT, FKVF_NO_OFFSET, NULL,
                         "the selection (%llu positions) does not fit in memory",
                         (unsigned long long)p->count);
    p->total = (size_t)all; /* <= bytes_sz */
    if (p->layout == FKVF_LAYOUT_ROWS) {
        p->layer_e = (size_t)layer_pos;
        p->row_e = (size_t)layer_pos * p->nl;
        p->vbase = (size_t)p->nh * p->dks;
    } else {
        p->layer_e = (size_t)(layer_pos * p->count);
        p->vbase = (size_t)p->count * p->nh * p->dks;
    }
    return FKVF_OK;
}

/* Element offset in the output of the vector (position index i, selected
 * layer li, selected head hi, kv). */
static inline size_t out_off(const plan *p, size_t i, uint32_t li, uint32_t hi, unsigned kv)
{
    if (p->layout == FKVF_LAYOUT_ROWS)
        return i * p->row_e + li * p->layer_e +
               (kv ? p->vbase + (size_t)hi * p->dv : (size_t)hi * p->dk);
    size_t hp = (size_t)hi * (size_t)p->count + i;
    return li * p->layer_e + (kv ? p->vbase + hp * p->dv : hp * p->dk);
}

FKVF_API int fkvf_reader_read_size(const fkvf_reader *r, const fkvf_read_request *req,
                                   size_t *size)
{
    int rc = rd_enter(r);
    if (rc)
        return rc;
    if (!size)
        return FKVF_E_INVALID_ARG;
    plan p;
    /* the handle's message is its only mutable part that a query may set
     * (rd_enter clears it the same way) */
    if ((rc = plan_make((fkvf_diag *)&r->diag, r, req, &p)))
        return rc;
    *size = p.total * p.es;
    return FKVF_OK;
}

/* ---- output staging: binary32 vectors gathered into contiguous runs of the
 * output, converted to its dtype one run at a time ------------------------- */

typedef struct stage {
    float *buf;
    size_t cap, start, len;
    uint8_t *out;
    const plan *p;
    int f16c; /* convert to f16 with fkvf_f16c_store */
} stage;

static void stage_flush(stage *s)
{
    if (!s->len)
        return;
    uint8_t *dst = s->out + s->start * s->p->es;
#ifdef FKVF_HAVE_F16C
    if (s->f16c && s->p->dt == FKVF_DTYPE_F16) {
        fkvf_f16c_store(dst, s->buf, s->len);
        s->len = 0;
        return;
    }
#endif
    /* fkvf_convert reads little-endian bytes; the staged values are host
     * binary32 (valid dtypes and buffers: cannot fail) */
    fkvf_f32_to_le_inplace(s->buf, s->len);
    (void)fkvf_convert(s->p->dt, dst, FKVF_DTYPE_F32, s->buf, s->len);
    s->len = 0;
}

/* Room for the dim values of the output vector at element offset off. */
static float *stage_vec(stage *s, size_t off, uint32_t dim)
{
    if (s->len && (off != s->start + s->len || s->len + dim > s->cap))
        stage_flush(s);
    if (!s->len)
        s->start = off;
    float *v = s->buf + s->len;
    s->len += dim;
    return v;
}

/* ---- exact rows ------------------------------------------------------------ */

/* The selection of p from a whole row (spec 14.2) of dtype st, position
 * p->first + i, into out. */
static void extract_row(const fkvf_reader *r, const plan *p, const uint8_t *row, fkvf_dtype st,
                        size_t i, uint8_t *out)
{
    const size_t se = fkvf_dtype_size((int)st), H = r->desc.n_kv_heads;
    for (uint32_t li = 0; li < p->nl; li++) {
        size_t lrow = (size_t)(p->l0 + li) * H * (p->dk + p->dv); /* elements */
        for (unsigned kv = 0; kv < 2; kv++) {
            if (kv ? !p->vals : !p->keys)
                continue;
            size_t dim = kv ? p->dv : p->dk;
            size_t src = lrow + (kv ? H * p->dk : 0) + (size_t)p->h0 * dim;
            if (p->layout == FKVF_LAYOUT_ROWS) {
                (void)fkvf_convert(p->dt, out + out_off(p, i, li, 0, kv) * p->es, st,
                                   row + src * se, p->nh * dim);
                continue;
            }
            for (uint32_t hi = 0; hi < p->nh; hi++)
                (void)fkvf_convert(p->dt, out + out_off(p, i, li, hi, kv) * p->es, st,
                                   row + (src + hi * dim) * se, dim);
        }
    }
}

static int read_exact(fkvf_reader *r, const plan *p, uint64_t pos, uint8_t *out)
{
    const void *rowp = NULL;
    size_t rb;
    int rc = rd_exact_row(r, pos, &rowp, &rb); /* the latest covering EXAC (spec 14.3) */
    if (rc)
        return rc;
    extract_row(r, p, rowp, r->desc.dtype, (size_t)(pos - p->first), out);
    return FKVF_OK;
}

/* Archived positions [pos, stop) of a codebook with per-layer stage counts
 * (spec 13.1 layer table): whole rows restored FULL_ROWS at a time
 * (fkvf_reader_restore's binary32 sums, which round to any dtype as the
 * reconstruction of spec 13.6 does), the selection copied out. Slower than
 * the selective path below for a small selection; the same values. */
#define FULL_ROWS 16
static int read_archived_full(fkvf_reader *r, const plan *p, uint64_t pos, uint64_t stop,
                              uint8_t *out)
{
    size_t rb;
    int rc = rd_row_bytes(r, FKVF_DTYPE_F32, &rb);
    if (rc)
        return rc;
    if (rb > SIZE_MAX / FULL_ROWS)
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "rows of %zu bytes", rb);
    uint8_t *buf = fkvf_malloc(r->alloc, rb * FULL_ROWS);
    if (!buf)
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory for %d rows", FULL_ROWS);
    while (pos < stop && rc == FKVF_OK) {
        size_t n = stop - pos < FULL_ROWS ? (size_t)(stop - pos) : FULL_ROWS;
        rc = fkvf_reader_restore(r, pos, n, FKVF_DTYPE_F32, buf, rb * FULL_ROWS);
        for (size_t i = 0; rc == FKVF_OK && i < n; i++)
            extract_row(r, p, buf + i * rb, FKVF_DTYPE_F32, (size_t)(pos + i - p->first), out);
        pos += n;
    }
    fkvf_free(r->alloc, buf);
    return rc;
}

/* A selection of every head, at least BULK_MIN archived positions in a
 * run: decoded as restore decodes (rd_restore_archived: the decoder's
 * vector kernels, straight into the selection's layout, on the reader's
 * threads) instead of centroid by centroid; the same values. */
#define BULK_MIN 64
static int bulk_ok(const fkvf_reader *r, const plan *p, uint64_t n)
{
    return p->h0 == 0 && p->nh == r->desc.n_kv_heads &&
           (n >= BULK_MIN || r->cb_shape.layer_stages);
}

static int read_archived_bulk(fkvf_reader *r, const plan *p, uint64_t pos, uint64_t stop,
                              void *out, size_t out_size)
{
    unsigned parts = (p->keys ? FKVF_PART_KEYS : 0) | (p->vals ? FKVF_PART_VALUES : 0);
    rd_target t = {{p->l0, p->nl, p->layout, (size_t)p->count, 0, parts}, p->first, p->dt, out,
                   out_size};
    return rd_restore_archived(r, &t, pos, stop);
}

/* ---- archived positions ------------------------------------------------------ */

/* Per call scratch (one allocation). */
typedef struct work {
    const plan *p;
    uint32_t ks, vs, kss, vss, sel_per; /* stages; selected stages per (layer, head) */
    size_t nsel;                        /* selected streams */
    size_t chunk;                       /* positions per chunk (ROWS) or block (HEADS) */
    uint16_t *codes;                    /* ROWS [nsel][chunk]; HEADS [16][chunk] */
    const float **tab;                  /* stage table of each selected stream */
    const float **rowp;                 /* LAYOUT_ROWS: the rows of one position */
    /* LAYOUT_ROWS with an f16 codebook, AVX and F16C: the tables as stored
     * (spec 13.2), each element widened to binary32 exactly when summed: the
     * values of r->rvq's binary32 tables at half the bytes a row */
    const uint8_t **tab16;              /* table of each selected stream, or NULL */
    const void **rowp16;                /* the rows of one position */
    /* f16 output from the f16 tables: keys (vec16_k) and values (vec16_v)
     * decoded straight into the output by fkvf_vec16_store, no staging */
    int vec16_k, vec16_v;
    int all;                            /* every stream selected, in the streams' order */
    int prefetched;                     /* the rows of the chunk's one position prefetched */
    int avx;                            /* sum and rotate with AVX */
    uint32_t rd;                        /* rope dims (0: no rotation) */
    fkvf_rope rope;                     /* the archive's RoPE (rd > 0) */
    const double *freqs;                /* rd / 2: the reader's */
    double *cs;                         /* [chunk][rd]: cosines, then sines */
    stage st;
    void *mem;
} work;

static size_t sel_index(const work *w, uint32_t li, uint32_t hi, unsigned kv, unsigned s)
{
    return ((size_t)li * w->p->nh + hi) * w->sel_per + (kv ? w->kss + s : s);
}

/* Byte offset in the CBK1 contents of table (layer, head, kv, stage) of
 * f16 elements (spec 13.2; a pooled codebook has one head). */
static size_t table16_off(const fkvf_codebook_shape *sh, uint32_t l, uint32_t h, unsigned kv,
                          unsigned s)
{
    size_t tab = (size_t)l * sh->n_heads + (sh->pooled ? 0 : h);
    return 64 + 2 * fkvf_cbk1_table_off(sh, tab, kv, s);
}

#ifdef FKVF_HAVE_F16C
/* Do the f16 tables of shape sh for the archive's layers and heads lie
 * within the `size` bytes of the contents? (Checked when the codebook was
 * loaded, spec 13.2; checked again here because the offsets above rely on
 * it.) Only the F16C kernel reads the f16 tables in place. */
static int tables16_fit(const fkvf_codebook_shape *sh, const fkvf_desc *d, size_t size)
{
    uint64_t per_head = (uint64_t)sh->k *
                        ((uint64_t)sh->k_stages * sh->key_dim + (uint64_t)sh->v_stages * sh->value_dim) *
                        2;
    uint64_t all;
    if (sh->n_layers != d->n_layers || sh->n_heads != (sh->pooled ? 1 : d->n_kv_heads) ||
        sh->key_dim != d->key_dim || sh->value_dim != d->value_dim)
        return 0;
    return fkvf_mul64(per_head, (uint64_t)sh->n_layers * sh->n_heads, &all) && all <= size &&
           size - all >= 64;
}
#endif

/* The binary32 stage tables (tab, unless NULL) or the f16 tables in the
 * CBK1 contents cb (tab16, unless NULL) of the selected streams, in
 * selection order (sel_index). */
static void tables_fill(const fkvf_reader *r, const plan *p, const work *w, const uint8_t *cb,
                        const float **tab, const uint8_t **tab16)
{
    size_t j = 0;
    for (uint32_t li = 0; li < p->nl; li++)
        for (uint32_t hi = 0; hi < p->nh; hi++)
            for (unsigned kv = 0; kv < 2; kv++)
                for (unsigned s = 0; s < (kv ? w->vss : w->kss); s++, j++) {
                    if (tab)
                        tab[j] = fkvf_rvq_centroids(r->rvq, p->l0 + li, p->h0 + hi, kv, s);
                    if (tab16)
                        tab16[j] = cb + table16_off(&r->cb_shape, p->l0 + li, p->h0 + hi, kv, s);
                }
}

/* work_init's failure to allocate what the reader keeps: w's scratch freed */
static int work_nomem(fkvf_reader *r, work *w, const char *what)
{
    fkvf_free(r->alloc, w->mem);
    w->mem = NULL;
    return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory for %s", what);
}

/* The stages of the selected streams (per (layer, head) and in all) and the
 * rope dims of the selected keys (0: no rotation). */
static void work_select(const fkvf_reader *r, const plan *p, work *w)
{
    w->p = p;
    w->ks = r->cb_shape.k_stages;
    w->vs = r->cb_shape.v_stages;
    w->kss = p->keys ? w->ks : 0;
    w->vss = p->vals ? w->vs : 0;
    w->sel_per = w->kss + w->vss;
    w->nsel = (size_t)p->nl * p->nh * w->sel_per; /* <= 2^20 * 32 */
    w->rd = r->desc.key_storage == 1 && p->keys ? r->desc.rope_dims : 0;
}

/* Positions per chunk (LAYOUT_ROWS: CODE_BUDGET codes, 1 to MAX_CHUNK
 * positions) or per block (LAYOUT_HEADS: HEADS_CHUNK, at most CS_BUDGET /
 * rope dims), and never more than the request's count. */
static size_t work_chunk(const plan *p, const work *w)
{
    size_t c;
    if (p->layout == FKVF_LAYOUT_ROWS) {
        c = w->nsel ? CODE_BUDGET / w->nsel : MAX_CHUNK;
        c = c < 1 ? 1 : c > MAX_CHUNK ? MAX_CHUNK : c;
    } else {
        c = HEADS_CHUNK;
        if (w->rd && c > CS_BUDGET / w->rd)
            c = CS_BUDGET / w->rd ? CS_BUDGET / w->rd : 1;
    }
    if (c > p->count)
        c = (size_t)p->count;
    return c;
}

/* The CBK1 contents whose f16 tables LAYOUT_ROWS reads in place (an f16
 * codebook, AVX and F16C, tables that fit), or NULL. */
static const uint8_t *work_tables16_source(fkvf_reader *r, const plan *p, const work *w)
{
    const uint8_t *cb = NULL;
#ifdef FKVF_HAVE_F16C
    if (p->layout == FKVF_LAYOUT_ROWS && w->nsel && r->cb_shape.dtype == FKVF_DTYPE_F16 &&
        fkvf_cpu_avx() && fkvf_cpu_f16c()) {
        const void *c0;
        size_t cb_size;
        fkvf_codebook_shape sh;
        if (rd_codebook(r, &sh, &c0, &cb_size, NULL) == FKVF_OK &&
            tables16_fit(&sh, &r->desc, cb_size))
            cb = c0;
    }
#else
    (void)r;
    (void)p;
    (void)w;
#endif
    return cb;
}

/* The scratch, one allocation carved into the staging floats, the cosines
 * and sines (rope dims > 0), the pointer lists (tab, rowp; tab16 and rowp16
 * when with16) and the codes. */
static int work_alloc(fkvf_reader *r, const plan *p, work *w, int with16)
{
    size_t c = w->chunk;
    size_t n_codes = (p->layout == FKVF_LAYOUT_ROWS ? w->nsel : 16) * c;
    size_t dmax = p->dk > p->dv ? p->dk : p->dv;
    size_t cap = p->total < STAGE_FLOATS ? p->total : STAGE_FLOATS;
    if (cap < dmax)
        cap = dmax;
    /* layout: floats, doubles, pointers, codes (each part's size a multiple
     * of 8, so every part stays aligned) */
    size_t n_f = (cap + 1) & ~(size_t)1, n_d = w->rd ? c * w->rd : 0;
    size_t n_c = (n_codes + 3) & ~(size_t)3;
    size_t bytes = n_f * sizeof(float) + n_d * sizeof(double) +
                   (with16 ? 4 : 2) * w->nsel * sizeof(float *) + n_c * sizeof(uint16_t);
    uint8_t *m = fkvf_malloc(r->alloc, bytes);
    if (!m)
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL, "no memory for %zu bytes of scratch",
                    bytes);
    w->mem = m;
    w->st.buf = (float *)(void *)m;
    w->st.cap = cap;
    m += n_f * sizeof(float);
    if (w->rd) {
        w->cs = (double *)(void *)m;
        m += n_d * sizeof(double);
    }
    w->tab = (const float **)(void *)m;
    m += w->nsel * sizeof(float *);
    w->rowp = (const float **)(void *)m;
    m += w->nsel * sizeof(float *);
    if (with16) {
        w->tab16 = (const uint8_t **)(void *)m;
        m += w->nsel * sizeof(uint8_t *);
        w->rowp16 = (const void **)(void *)m;
        m += w->nsel * sizeof(uint8_t *);
    }
    w->codes = (uint16_t *)(void *)m;
    return FKVF_OK;
}

/* The kernels: AVX sums, F16C conversions, and (f16 output from the f16
 * tables) keys and values stored straight into the output. */
static void work_kernels(const fkvf_reader *r, const plan *p, work *w, int with16)
{
    w->avx = fkvf_cpu_avx();
    w->st.f16c = fkvf_cpu_f16c();
    if (with16 && p->dt == FKVF_DTYPE_F16) {
        w->vec16_k = !p->keys || fkvf_vec16_usable(p->dk, w->rd, r->desc.rope_layout);
        w->vec16_v = !p->vals || fkvf_vec16_usable(p->dv, 0, 0);
    }
    w->st.p = p;
}

/* Does the request select every stream? (Selection order is then the
 * streams' order, spec 11.2.) */
static int selects_all(const fkvf_reader *r, const plan *p, const work *w)
{
    return p->l0 == 0 && p->nl == r->desc.n_layers && p->h0 == 0 &&
           p->nh == r->desc.n_kv_heads && p->keys && p->vals && w->nsel;
}

/* The reader's stage tables of every stream, built on first use; the f16
 * ones of the CBK1 contents cb (unless NULL) again for another attached
 * codebook file. */
static int reader_tables(fkvf_reader *r, const plan *p, work *w, const uint8_t *cb)
{
    if (!r->acc_tab) {
        if (!(r->acc_tab = fkvf_malloc(r->alloc, w->nsel * sizeof *r->acc_tab)))
            return work_nomem(r, w, "the stage tables");
        tables_fill(r, p, w, NULL, r->acc_tab, NULL);
    }
    if (cb && r->acc_cb != cb) { /* first use, or another attached codebook file */
        fkvf_free(r->alloc, r->acc_tab16);
        r->acc_cb = NULL;
        if (!(r->acc_tab16 = fkvf_malloc(r->alloc, w->nsel * sizeof *r->acc_tab16)))
            return work_nomem(r, w, "the f16 stage tables");
        tables_fill(r, p, w, cb, NULL, r->acc_tab16);
        r->acc_cb = cb;
    }
    return FKVF_OK;
}

/* The stage tables of the selected streams (the f16 ones too from the CBK1
 * contents cb, unless NULL): for a selection of every stream the reader's,
 * built once; else this call's. */
static int work_tables(fkvf_reader *r, const plan *p, work *w, const uint8_t *cb)
{
    w->all = selects_all(r, p, w);
    if (!w->all) {
        tables_fill(r, p, w, NULL, w->tab, NULL);
        if (cb)
            tables_fill(r, p, w, cb, NULL, w->tab16);
        return FKVF_OK;
    }
    int rc = reader_tables(r, p, w, cb);
    if (rc)
        return rc;
    /* the reader's lists exist now (their allocation failing is an error
     * above) */
    w->tab = r->acc_tab;
    if (cb)
        w->tab16 = r->acc_tab16;
    return FKVF_OK;
}

/* The archive's RoPE, and its frequencies: the reader's, computed once per
 * reader (rope_dims / 2 calls of pow). */
static int work_rope(fkvf_reader *r, work *w)
{
    w->rope = (fkvf_rope){r->desc.rope_layout, w->rd, r->desc.rope_theta};
    if (!r->acc_freqs) {
        if (!(r->acc_freqs = fkvf_malloc(r->alloc, w->rd / 2 * sizeof(double))))
            return work_nomem(r, w, "the RoPE frequencies");
        fkvf_rope_freqs(&w->rope, r->acc_freqs);
    }
    w->freqs = r->acc_freqs;
    return FKVF_OK;
}

static int work_init(fkvf_reader *r, const plan *p, work *w)
{
    memset(w, 0, sizeof *w);
    work_select(r, p, w);
    w->chunk = work_chunk(p, w);
    const uint8_t *cb = work_tables16_source(r, p, w);
    int rc = work_alloc(r, p, w, cb != NULL);
    if (rc)
        return rc;
    work_kernels(r, p, w, cb != NULL);
    if ((rc = work_tables(r, p, w, cb)))
        return rc;
    return w->rd ? work_rope(r, w) : FKVF_OK;
}

/* Symbols [u0, u0+n) (segment-local, n <= HEADS_CHUNK) of index stream ord
 * of segment g as codes: the blocks holding their bytes verified first (on
 * first touch), every code checked against k. */
static int read_stream(fkvf_reader *r, rd_group *gr, rd_seg *g, uint64_t ord, uint64_t u0,
                       size_t n, uint16_t *c)
{
    const uint32_t k = r->cb_shape.k;
    const uint64_t sb = g->h.stream_bytes, bs = g->h.block_size;
    const unsigned bits = gr->profile == FKVF_PROFILE_QUAD ? gr->bits : 0;
    uint64_t lo, hi;
    if (bits) {
        lo = u0 * bits / 8;
        hi = ((u0 + n) * bits + 7) / 8;
    } else {
        lo = u0 / gr->span * 16;
        hi = ((u0 + n - 1) / gr->span + 1) * 16;
    }
    if (!fkvf_range_ok(lo, hi - lo, sb)) /* u0 + n <= the segment's symbol count */
        return FAIL(FKVF_E_CORRUPT, r->sections[g->sec].e.offset, "11.5",
                    "symbols [%llu, +%zu) outside the segment", (unsigned long long)u0, n);
    uint64_t base = ord * sb; /* the segment holds n_streams * sb bytes: checked at open */
    uint64_t b0 = base + lo, b1 = base + hi - 1;
    if ((bs & (bs - 1)) == 0) { /* the usual power-of-two block size: no division */
        unsigned sh = (unsigned)__builtin_ctzll(bs);
        b0 >>= sh;
        b1 >>= sh;
    } else {
        b0 /= bs;
        b1 /= bs;
    }
    for (uint64_t b = b0; b <= b1; b++)
        if (!(g->block_ok[b] & RD_BLOCK_OK)) {
            int rc = rd_block_check(r, gr, g, b);
            if (rc)
                return rc;
        }
    const uint8_t *data = g->data + base;
    int bad = 0;
    size_t bad_i = 0;
    uint32_t tmp[HEADS_CHUNK];
    if (bits == 8) {
        const uint8_t *src = data + u0;
        for (size_t i = 0; i < n; i++)
            c[i] = src[i];
        for (size_t i = 0; i < n; i++)
            if (c[i] >= k && !bad) {
                bad = 1;
                bad_i = i;
                tmp[i] = c[i];
            }
    } else {
        int rc;
        if (bits == 16) {
            const uint8_t *src = data + 2 * u0;
            for (size_t i = 0; i < n; i++)
                tmp[i] = fkvf_ld16(src + 2 * i);
            rc = FKVF_OK;
        } else if (bits) {
            rc = fkvf_quad_decode(data, (size_t)sb, bits, u0, n, tmp);
        } else {
            rc = fkvf_ngon_decode(gr->ngon, data, (size_t)sb, g->h.symbol_count, u0, n, tmp, 0);
        }
        if (rc)
            return FAIL(rc, g->data_fileoff + base, "11.5",
                        "index stream %llu: symbols [%llu, +%zu) of the segment cannot be "
                        "decoded",
                        (unsigned long long)ord, (unsigned long long)u0, n);
        for (size_t i = 0; i < n; i++) {
            if (tmp[i] >= k && !bad) {
                bad = 1;
                bad_i = i;
            }
            c[i] = (uint16_t)tmp[i];
        }
    }
    if (bad)
        return FAIL(FKVF_E_SYMBOL, FKVF_NO_OFFSET, "11.8",
                    "index stream %llu symbol %llu is %u, the codebook has k = %u",
                    (unsigned long long)ord, (unsigned long long)(g->h.first_symbol + u0 + bad_i),
                    tmp[bad_i], k);
    return FKVF_OK;
}

/* Index (ordinal, spec 11.2) of the stream of selected (layer, head, kv,
 * stage). */
static uint64_t stream_ord(const fkvf_reader *r, const work *w, uint32_t li, uint32_t hi,
                           unsigned kv, unsigned s)
{
    const plan *p = w->p;
    return ((uint64_t)(p->l0 + li) * r->desc.n_kv_heads + p->h0 + hi) * (w->ks + w->vs) +
           (kv ? w->ks + s : s);
}

static inline void prefetch_bytes(const void *p, size_t bytes)
{
#if defined(__GNUC__) || defined(__clang__)
    for (size_t b = 0; b < bytes; b += 64)
        __builtin_prefetch((const char *)p + b);
#else
    (void)p;
    (void)bytes;
#endif
}

static inline void prefetch_row(const float *row, uint32_t dim)
{
    prefetch_bytes(row, (size_t)dim * sizeof(float));
}

/* The shift of segment g's block size when symbols [u0, u0 + n) of its
 * streams can be read as their stored bytes: 8-bit quad symbols (spec
 * 12.1.4) and a power-of-two block size of at least n bytes, so that each
 * stream's bytes lie in at most two blocks. -1 otherwise (read_stream). */
static int direct8_shift(const rd_group *gr, const rd_seg *g, uint64_t u0, size_t n)
{
    const uint64_t bs = g->h.block_size;
    if (gr->profile != FKVF_PROFILE_QUAD || gr->bits != 8 || (bs & (bs - 1)) || n > bs ||
        !fkvf_range_ok(u0, n, g->h.stream_bytes))
        return -1;
    return __builtin_ctzll(bs);
}

/* Stream ord's stored bytes of those symbols (sh from direct8_shift), or
 * NULL when a block they lie in is not verified yet. */
static const uint8_t *direct8_bytes(const rd_seg *g, int sh, uint64_t ord, uint64_t u0, size_t n)
{
    /* the segment holds n_streams * stream_bytes bytes: checked at open */
    uint64_t off = ord * g->h.stream_bytes + u0;
    return (g->block_ok[off >> sh] & RD_BLOCK_OK) && (g->block_ok[(off + n - 1) >> sh] & RD_BLOCK_OK)
               ? g->data + off
               : NULL;
}

/* A source reader's blocks of symbols [u0, u0+n) of every selected stream
 * of segment g, adjacent ones in one read. */
static int prefetch_codes(fkvf_reader *r, const work *w, rd_group *gr, rd_seg *g, uint64_t u0,
                          size_t n)
{
    const plan *p = w->p;
    rd_prefetch pf = {0, 0};
    for (uint32_t li = 0; li < p->nl; li++)
        for (uint32_t hi = 0; hi < p->nh; hi++)
            for (unsigned kv = 0; kv < 2; kv++)
                for (unsigned s = 0; s < (kv ? w->vss : w->kss); s++) {
                    int rc = rd_seg_prefetch(r, &pf, gr, g,
                                             (uint32_t)stream_ord(r, w, li, hi, kv, s), u0,
                                             u0 + n);
                    if (rc)
                        return rc;
                }
    return rd_prefetch_flush(r, &pf);
}

/* read_codes' common case inline (sh from direct8_shift): the stored bytes;
 * anything unusual (a block not verified yet, a code >= k) goes through
 * read_stream. */
static int read_codes_direct8(fkvf_reader *r, work *w, rd_group *gr, rd_seg *g, int sh,
                              uint64_t u0, size_t n)
{
    const plan *p = w->p;
    const uint32_t k = r->cb_shape.k;
    /* one position: each code's centroid row prefetched as soon as the
     * code is loaded, so that the row misses overlap the code misses of
     * the following streams instead of waiting for all 864 codes */
    const int early = n == 1;
    w->prefetched = early;
    for (uint32_t li = 0; li < p->nl; li++)
        for (uint32_t hi = 0; hi < p->nh; hi++)
            for (unsigned kv = 0; kv < 2; kv++) {
                unsigned ns = kv ? w->vss : w->kss;
                if (!ns)
                    continue;
                size_t j = sel_index(w, li, hi, kv, 0);
                uint64_t ord = stream_ord(r, w, li, hi, kv, 0);
                const uint32_t dim = kv ? p->dv : p->dk;
                for (unsigned s = 0; s < ns; s++, j++, ord++) {
                    uint16_t *c = w->codes + j * w->chunk;
                    const uint8_t *src = direct8_bytes(g, sh, ord, u0, n);
                    if (!src) {
                        int rc = read_stream(r, gr, g, ord, u0, n, c);
                        if (rc)
                            return rc;
                        continue;
                    }
                    unsigned mx = 0;
                    for (size_t i = 0; i < n; i++) {
                        c[i] = src[i];
                        mx = src[i] > mx ? src[i] : mx;
                    }
                    if (early && mx < k) {
                        if (w->tab16)
                            prefetch_bytes(w->tab16[j] + (size_t)src[0] * dim * 2,
                                           (size_t)dim * 2);
                        else
                            prefetch_row(w->tab[j] + (size_t)src[0] * dim, dim);
                    }
                    if (mx >= k) /* read_stream names the symbol */
                        return read_stream(r, gr, g, ord, u0, n, c);
                }
            }
    return FKVF_OK;
}

/* LAYOUT_ROWS: codes of symbols [u0, u0+n) of every selected stream of
 * segment g into w->codes[j * chunk + i]. */
static int read_codes(fkvf_reader *r, work *w, rd_group *gr, rd_seg *g, uint64_t u0, size_t n)
{
    const plan *p = w->p;
    if (r->src.read) {
        int rc = prefetch_codes(r, w, gr, g, u0, n);
        if (rc)
            return rc;
    }
    const int sh = direct8_shift(gr, g, u0, n);
    if (sh >= 0)
        return read_codes_direct8(r, w, gr, g, sh, u0, n);
    w->prefetched = 0;
    for (uint32_t li = 0; li < p->nl; li++)
        for (uint32_t hi = 0; hi < p->nh; hi++)
            for (unsigned kv = 0; kv < 2; kv++)
                for (unsigned s = 0; s < (kv ? w->vss : w->kss); s++) {
                    size_t j = sel_index(w, li, hi, kv, s);
                    int rc = read_stream(r, gr, g, stream_ord(r, w, li, hi, kv, s), u0, n,
                                         w->codes + j * w->chunk);
                    if (rc)
                        return rc;
                }
    return FKVF_OK;
}

/* ---- the index row cache -------------------------------------------------
 * A position's codes lie one in each index stream (spec 11.2), n_streams
 * cache lines and pages apart: a read of one position of every stream
 * touches 864 of each at GPT-2 small, most of its time. A LAYOUT_ROWS read
 * of fewer than RC_BLOCK positions of every stream copies, on first use,
 * the codes of a block of RC_BLOCK symbols of the segment, all streams, into
 * a slot of position-major rows; later reads of those positions read one
 * contiguous row. At most RC_BYTES per reader (fkvf_reader_set_row_cache
 * changes that), direct-mapped by block, allocated on the first such read
 * (FKVF_E_NOMEM if it cannot be), freed with the reader. A block some of
 * whose bytes fail their checksum or hold a code >= k is not kept: the read
 * goes the uncached way, which reports only what concerns its own
 * positions.
 *
 * A fill costs about a fifth more than an uncached read, a hit about half
 * as much: when every slot has been used and fewer than one lookup in
 * RC_MIN_HIT of a window of RC_WINDOW hit (reads spread over many more
 * blocks than the cache holds), the next RC_NOFILL misses fill nothing
 * (they read uncached; hits still use what the cache holds), then it tries
 * again. */
#define RC_BLOCK 16u
#define RC_BYTES FKVF_ROW_CACHE_DEFAULT
#define RC_WINDOW 1024u
#define RC_MIN_HIT 3u
#define RC_NOFILL 8192u

static void rc_release(fkvf_reader *r)
{
    fkvf_free(r->alloc, r->rc_codes);
    fkvf_free(r->alloc, r->rc_seg);
    fkvf_free(r->alloc, r->rc_blk);
    r->rc_codes = NULL;
    r->rc_seg = NULL;
    r->rc_blk = NULL;
    r->rc_slots = 0;
    r->rc_state = 0;
    r->rc_used = 0;
    r->rc_looks = r->rc_hits = r->rc_nofill = 0;
}

FKVF_API int fkvf_reader_set_row_cache(fkvf_reader *r, size_t bytes)
{
    int rc = rd_enter(r);
    if (rc)
        return rc;
    rc_release(r);
    r->rc_limit = bytes;
    r->rc_limit_set = 1;
    return FKVF_OK;
}

/* *use = 1 if the cache is in use for the index streams of gr (allocated
 * on the first call: within the budget, no more slots than the segments
 * have blocks), 0 if not (a budget below one slot). FKVF_E_NOMEM with the
 * message when it cannot be allocated (the next call tries again). */
static int rc_ready(fkvf_reader *r, const rd_group *gr, int *use)
{
    *use = r->rc_state > 0;
    if (r->rc_state)
        return FKVF_OK;
    r->rc_state = -1;
    const size_t budget = r->rc_limit_set ? r->rc_limit : RC_BYTES;
    /* a byte a code when k <= 256 (spec 13.1: k <= 4096) */
    const unsigned cw = r->cb_shape.k <= 256 ? 1 : 2;
    size_t per = (size_t)RC_BLOCK * gr->n_streams * cw; /* n_streams < 2^26 */
    if (!gr->n_streams || per > budget)
        return FKVF_OK;
    size_t slots = 0;
    for (size_t i = 0; i < gr->n_segs && slots < budget / per; i++)
        slots += (size_t)(gr->segs[i].count / RC_BLOCK) + 1;
    if (slots > budget / per)
        slots = budget / per;
    r->rc_codes = fkvf_malloc(r->alloc, slots * per);
    r->rc_seg = fkvf_malloc(r->alloc, slots * sizeof *r->rc_seg);
    r->rc_blk = fkvf_malloc(r->alloc, slots * sizeof *r->rc_blk);
    if (!r->rc_codes || !r->rc_seg || !r->rc_blk) {
        rc_release(r);
        return FAIL(FKVF_E_NOMEM, FKVF_NO_OFFSET, NULL,
                    "no memory for the index row cache (%zu bytes; "
                    "fkvf_reader_set_row_cache sets a smaller budget, 0 none)",
                    slots * per);
    }
    for (size_t i = 0; i < slots; i++)
        r->rc_seg[i] = SIZE_MAX;
    r->rc_slots = slots;
    r->rc_cw = cw;
    r->rc_state = 1;
    *use = 1;
    return FKVF_OK;
}

/* Code c at index i of cached rows of width cw */
static inline void rc_put(uint8_t *rows, unsigned cw, size_t i, unsigned c)
{
    if (cw == 1) {
        rows[i] = (uint8_t)c;
    } else {
        uint16_t v = (uint16_t)c;
        memcpy(rows + 2 * i, &v, sizeof v);
    }
}

/* Codes of symbols [u0, u0 + m) (m <= RC_BLOCK) of every stream of segment
 * g into rows (position-major, ns codes of r->rc_cw bytes a row): 1, or 0 if
 * a block does not verify or a code is >= k (nothing reported: the
 * diagnostic is cleared). */
static int rc_fill(fkvf_reader *r, rd_group *gr, rd_seg *g, uint64_t u0, size_t m,
                   uint8_t *rows, size_t ns)
{
    const unsigned cw = r->rc_cw;
    if (r->src.read) {
        /* a source reader: the blocks of every stream first, adjacent ones
         * in one read (a failure shows in read_stream below) */
        rd_prefetch pf = {0, 0};
        int rc = FKVF_OK;
        for (size_t j = 0; j < ns && rc == FKVF_OK; j++)
            rc = rd_seg_prefetch(r, &pf, gr, g, (uint32_t)j, u0, u0 + m);
        if (rc == FKVF_OK)
            rc = rd_prefetch_flush(r, &pf);
        if (rc != FKVF_OK)
            fkvf_diag_clear(&r->diag);
    }
    const int sh = direct8_shift(gr, g, u0, m);
    unsigned mx = 0;
    uint16_t c[RC_BLOCK];
    for (size_t j = 0; j < ns; j++) {
        const uint8_t *src = sh >= 0 ? direct8_bytes(g, sh, j, u0, m) : NULL;
        if (src) {
            for (size_t i = 0; i < m; i++) {
                rc_put(rows, cw, i * ns + j, src[i]);
                mx = src[i] > mx ? src[i] : mx;
            }
            continue;
        }
        if (read_stream(r, gr, g, j, u0, m, c) != FKVF_OK) {
            fkvf_diag_clear(&r->diag);
            return 0;
        }
        for (size_t i = 0; i < m; i++)
            rc_put(rows, cw, i * ns + j, c[i]); /* < k: read_stream checked */
    }
    return mx < r->cb_shape.k;
}

/* The cached row of symbol u of segment si (g), filled if need be; NULL if
 * its block cannot be cached */
static const uint8_t *rc_row(fkvf_reader *r, rd_group *gr, size_t si, rd_seg *g, uint64_t u)
{
    const size_t ns = gr->n_streams, rowb = ns * r->rc_cw;
    const uint64_t blk = u / RC_BLOCK;
    const size_t slot = (size_t)((g->h.first_symbol / RC_BLOCK + blk + si) % r->rc_slots);
    uint8_t *rows = r->rc_codes + slot * RC_BLOCK * rowb;
    const int hit = r->rc_seg[slot] == si && r->rc_blk[slot] == blk;
    /* the hit rate of the window, once every slot has been used */
    r->rc_hits += (uint32_t)hit;
    if (++r->rc_looks == RC_WINDOW) {
        if (r->rc_used == r->rc_slots && r->rc_hits * RC_MIN_HIT < RC_WINDOW)
            r->rc_nofill = RC_NOFILL;
        r->rc_looks = r->rc_hits = 0;
    }
    if (!hit) {
        if (r->rc_nofill) {
            r->rc_nofill--;
            return NULL;
        }
        uint64_t u0 = blk * RC_BLOCK;
        size_t m = g->count - u0 < RC_BLOCK ? (size_t)(g->count - u0) : RC_BLOCK;
        int fresh = r->rc_seg[slot] == SIZE_MAX;
        r->rc_seg[slot] = SIZE_MAX;
        if (!rc_fill(r, gr, g, u0, m, rows, ns))
            return NULL;
        r->rc_seg[slot] = si;
        r->rc_blk[slot] = blk;
        if (fresh && r->rc_used < r->rc_slots) /* a slot emptied by a failed fill:
                                                 * counted once all the same */
            r->rc_used++;
    }
    return rows + (size_t)(u % RC_BLOCK) * rowb;
}

/* read_codes through the cache (every stream selected, n < RC_BLOCK): 1 if
 * done, 0 if a block cannot be cached (read_codes then) */
static int rc_codes(fkvf_reader *r, work *w, rd_group *gr, size_t si, rd_seg *g, uint64_t u,
                    size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const uint8_t *row = rc_row(r, gr, si, g, u + i);
        if (!row)
            return 0;
        uint16_t *c = w->codes + i;
        const size_t st = w->chunk;
        if (r->rc_cw == 1)
            for (size_t j = 0; j < w->nsel; j++)
                c[j * st] = row[j];
        else
            for (size_t j = 0; j < w->nsel; j++)
                memcpy(c + j * st, row + 2 * j, sizeof *c); /* rc_put's native order */
    }
    w->prefetched = 0;
    return 1;
}

/* One output vector from its stage rows. */
static void emit(work *w, const float *const *rows, size_t ci, size_t i,
                 uint32_t li, uint32_t hi, unsigned kv)
{
    const plan *p = w->p;
    uint32_t dim = kv ? p->dv : p->dk;
    float *v = stage_vec(&w->st, out_off(p, i, li, hi, kv), dim);
    fkvf_stage_sum(v, rows, kv ? w->vss : w->kss, dim, w->avx);
    if (kv == 0 && w->rd)
        fkvf_rope_rotate_f32(&w->rope, w->cs + ci * w->rd, 0, v, w->avx);
}

/* Stage rows of the selected stream j's stages for chunk position ci. */
static void stage_rows(const work *w, size_t j0, unsigned ns, uint32_t dim, size_t ci,
                       const float **rows, int prefetch)
{
    for (unsigned s = 0; s < ns; s++) {
        rows[s] = w->tab[j0 + s] + (size_t)w->codes[(j0 + s) * w->chunk + ci] * dim;
        if (prefetch)
            prefetch_row(rows[s], dim);
    }
}

#ifdef FKVF_HAVE_F16C
/* stage_rows for the f16 tables (prefetch: not done by read_codes) */
static void stage_rows16(const work *w, size_t j0, unsigned ns, uint32_t dim, size_t ci,
                         const void **rows, int prefetch)
{
    for (unsigned s = 0; s < ns; s++) {
        rows[s] = w->tab16[j0 + s] + (size_t)w->codes[(j0 + s) * w->chunk + ci] * dim * 2;
        if (prefetch)
            prefetch_bytes(rows[s], (size_t)dim * 2);
    }
}

/* fkvf_stage_sum over f16 rows (little-endian, spec 13.2): every element
 * widened to binary32 exactly (vcvtph2ps, or fkvf_cvt_f16_to_f32 for the
 * tail), then the same binary32 additions in the same order, +0.0 + row 0 +
 * row 1 + ...: the bits of fkvf_stage_sum over r->rvq's tables. */
static __attribute__((target("avx,f16c"))) void sum16(float *acc, const void *const *rows,
                                                      unsigned ns, uint32_t dim)
{
    uint32_t d = 0;
    for (; d + 8 <= dim; d += 8) {
        __m256 a = _mm256_setzero_ps();
        for (unsigned s = 0; s < ns; s++)
            a = _mm256_add_ps(a, _mm256_cvtph_ps(_mm_loadu_si128(
                                     (const __m128i *)(const void *)((const uint8_t *)rows[s] + 2 * d))));
        _mm256_storeu_ps(acc + d, a);
    }
    for (; d < dim; d++) {
        float a = 0.0f;
        for (unsigned s = 0; s < ns; s++)
            a += fkvf_cvt_f16_to_f32(fkvf_ld16((const uint8_t *)rows[s] + 2 * d));
        acc[d] = a;
    }
}
#endif

/* cos and sin of the angles of positions [pos, pos+n) into w->cs */
static void compute_cs(work *w, uint64_t pos, size_t n)
{
    for (size_t ci = 0; ci < n; ci++)
        fkvf_rope_angles(&w->rope, w->freqs, pos + ci, w->cs + ci * w->rd);
}

#ifdef FKVF_HAVE_F16C
/* emit_rows' work for chunk position ci from the f16 tables */
static void emit_rows16(work *w, size_t i0, size_t ci, int prefetch)
{
    const plan *p = w->p;
    for (size_t j = 0; j < w->nsel; j += w->sel_per) {
        stage_rows16(w, j, w->kss, p->dk, ci, w->rowp16 + j, prefetch);
        stage_rows16(w, j + w->kss, w->vss, p->dv, ci, w->rowp16 + j + w->kss, prefetch);
    }
    for (uint32_t li = 0; li < p->nl; li++)
        for (unsigned kv = 0; kv < 2; kv++) {
            if (kv ? !p->vals : !p->keys)
                continue;
            uint32_t dim = kv ? p->dv : p->dk;
            unsigned ns = kv ? w->vss : w->kss;
            if (kv ? w->vec16_v : w->vec16_k) {
                uint32_t rd = kv ? 0 : w->rd;
                const double *cs = rd ? w->cs + ci * rd : NULL;
                for (uint32_t hi = 0; hi < p->nh; hi++)
                    fkvf_vec16_store(w->st.out + out_off(p, i0 + ci, li, hi, kv) * 2,
                                     w->rowp16 + sel_index(w, li, hi, kv, 0), ns, dim,
                                     w->rope.layout, rd, cs, 0);
                continue;
            }
            size_t run = (size_t)p->nh * dim;
            int whole = run <= w->st.cap;
            float *v = whole ? stage_vec(&w->st, out_off(p, i0 + ci, li, 0, kv), (uint32_t)run)
                             : NULL;
            for (uint32_t hi = 0; hi < p->nh; hi++) {
                float *x = whole ? v + (size_t)hi * dim
                                 : stage_vec(&w->st, out_off(p, i0 + ci, li, hi, kv), dim);
                sum16(x, w->rowp16 + sel_index(w, li, hi, kv, 0), ns, dim);
                if (kv == 0 && w->rd)
                    fkvf_rope_rotate_f32(&w->rope, w->cs + ci * w->rd, 0, x, w->avx);
            }
        }
}
#endif

/* LAYOUT_ROWS: positions [pos, pos+n) (archived; n <= chunk), codes read. */
static void emit_rows(work *w, uint64_t pos, size_t n)
{
    const plan *p = w->p;
    if (w->rd)
        compute_cs(w, pos, n);
    size_t i0 = (size_t)(pos - p->first);
    /* per position: the rows of every selected stream first (prefetched:
     * random rows of tables that may be anywhere in memory), then the
     * vectors in output order, one (layer, K|V) run of heads at a time */
    for (size_t ci = 0; ci < n; ci++) {
#ifdef FKVF_HAVE_F16C
        if (w->tab16) {
            /* one position: read_codes may have prefetched its rows */
            emit_rows16(w, i0, ci, !w->prefetched);
            continue;
        }
#endif
        for (size_t j = 0; j < w->nsel; j += w->sel_per) {
            stage_rows(w, j, w->kss, p->dk, ci, w->rowp + j, 1);
            stage_rows(w, j + w->kss, w->vss, p->dv, ci, w->rowp + j + w->kss, 1);
        }
        for (uint32_t li = 0; li < p->nl; li++)
            for (unsigned kv = 0; kv < 2; kv++) {
                if (kv ? !p->vals : !p->keys)
                    continue;
                uint32_t dim = kv ? p->dv : p->dk;
                unsigned ns = kv ? w->vss : w->kss;
                size_t run = (size_t)p->nh * dim;
                if (run > w->st.cap) {
                    for (uint32_t hi = 0; hi < p->nh; hi++)
                        emit(w, w->rowp + sel_index(w, li, hi, kv, 0), ci, i0 + ci, li, hi,
                             kv);
                    continue;
                }
                float *v = stage_vec(&w->st, out_off(p, i0 + ci, li, 0, kv), (uint32_t)run);
                const float *const *rows = w->rowp + sel_index(w, li, 0, kv, 0);
                for (uint32_t hi = 0; hi < p->nh; hi++, v += dim, rows += w->sel_per) {
                    fkvf_stage_sum(v, rows, ns, dim, w->avx);
                    if (kv == 0 && w->rd)
                        fkvf_rope_rotate_f32(&w->rope, w->cs + ci * w->rd, 0, v, w->avx);
                }
            }
    }
}

/* The segment supplying index symbol a, from *si on (symbols only grow). */
static rd_seg *seg_walk(fkvf_reader *r, rd_group *gr, size_t *si, uint64_t a)
{
    while (*si < gr->n_segs) {
        rd_seg *g = &gr->segs[*si];
        if (a >= g->h.first_symbol && a - g->h.first_symbol < g->count)
            return g;
        ++*si;
    }
    (void)FAIL(FKVF_E_CORRUPT, FKVF_NO_OFFSET, "11.6",
               "index symbol %llu beyond the streams' segments", (unsigned long long)a);
    return NULL;
}

/* LAYOUT_HEADS: positions [pos, pos+n) (archived; n <= chunk), head by
 * head: the head's codes for the block, then its vectors, so that its stage
 * tables are read once per block. *si: the segment cursor. */
static int emit_heads(fkvf_reader *r, work *w, rd_group *gr, size_t *si, uint64_t pos, size_t n)
{
    const plan *p = w->p;
    const uint64_t S = r->desc.n_sinks;
    if (w->rd)
        compute_cs(w, pos, n);
    size_t i0 = (size_t)(pos - p->first), si0 = *si;
    enum { AHEAD = 4 };
    for (uint32_t li = 0; li < p->nl; li++)
        for (unsigned kv = 0; kv < 2; kv++) {
            if (kv ? !p->vals : !p->keys)
                continue;
            unsigned ns = kv ? w->vss : w->kss;
            uint32_t dim = kv ? p->dv : p->dk;
            for (uint32_t hi = 0; hi < p->nh; hi++) {
                /* codes: the block may span segments */
                *si = si0;
                for (size_t done = 0; ns && done < n;) {
                    rd_seg *g = seg_walk(r, gr, si, pos + done - S);
                    if (!g)
                        return r->diag.code ? r->diag.code : FKVF_E_CORRUPT;
                    uint64_t u = pos + done - S - g->h.first_symbol;
                    size_t m = g->count - u < n - done ? (size_t)(g->count - u) : n - done;
                    for (unsigned s = 0; s < ns; s++) {
                        int rc = read_stream(r, gr, g, stream_ord(r, w, li, hi, kv, s), u, m,
                                             w->codes + s * w->chunk + done);
                        if (rc)
                            return rc;
                    }
                    done += m;
                }
                size_t j0 = sel_index(w, li, hi, kv, 0);
                const float *rows[16], *ahead[16];
                for (size_t ci = 0; ci < n; ci++) {
                    for (unsigned s = 0; s < ns; s++) {
                        rows[s] = w->tab[j0 + s] + (size_t)w->codes[s * w->chunk + ci] * dim;
                        if (ci + AHEAD < n) {
                            ahead[s] = w->tab[j0 + s] +
                                       (size_t)w->codes[s * w->chunk + ci + AHEAD] * dim;
                            prefetch_row(ahead[s], dim);
                        }
                    }
                    emit(w, rows, ci, i0 + ci, li, hi, kv);
                }
            }
        }
    return FKVF_OK;
}

/* Archived positions [pos, end). */
static int read_archived(fkvf_reader *r, work *w, uint64_t pos, uint64_t end)
{
    const uint64_t S = r->desc.n_sinks;
    rd_group *gr = &r->groups[FKVF_GROUP_INDEX];
    size_t si = 0;
    if (w->nsel) {
        if (!gr->present || !gr->n_segs)
            return FAIL(FKVF_E_CORRUPT, FKVF_NO_OFFSET, "11.8", "no index streams");
        /* the segment of the first symbol, once (binary search); the later
         * ones follow it */
        size_t lo = 0, hi = gr->n_segs;
        while (hi - lo > 1) {
            size_t mid = lo + (hi - lo) / 2;
            if (gr->segs[mid].h.first_symbol <= pos - S)
                lo = mid;
            else
                hi = mid;
        }
        si = lo;
    }
    while (pos < end) {
        size_t n = end - pos < w->chunk ? (size_t)(end - pos) : w->chunk;
        if (w->p->layout == FKVF_LAYOUT_HEADS) {
            int rc = emit_heads(r, w, gr, &si, pos, n);
            if (rc)
                return rc;
        } else if (!w->nsel) { /* no stage selected: zero vectors (spec 13.6) */
            emit_rows(w, pos, n);
        } else {
            rd_seg *g = seg_walk(r, gr, &si, pos - S);
            if (!g)
                return r->diag.code ? r->diag.code : FKVF_E_CORRUPT;
            uint64_t u = pos - S - g->h.first_symbol;
            if (g->count - u < n)
                n = (size_t)(g->count - u);
            int use = 0, rc;
            if (w->all && n < RC_BLOCK && w->nsel == gr->n_streams &&
                (rc = rc_ready(r, gr, &use)))
                return rc;
            if (!(use && rc_codes(r, w, gr, si, g, u, n)) &&
                (rc = read_codes(r, w, gr, g, u, n)))
                return rc;
            emit_rows(w, pos, n);
        }
        pos += n;
    }
    return FKVF_OK;
}

FKVF_API int fkvf_reader_read(fkvf_reader *r, const fkvf_read_request *req, void *out,
                              size_t out_size)
{
    int rc = rd_enter(r);
    if (rc)
        return rc;
    rd_source_trim(r);
    plan p;
    if ((rc = plan_make(&r->diag, r, req, &p)))
        return rc;
    size_t need = p.total * p.es; /* checked by plan_make */
    if (out_size < need || (!out && need))
        return FAIL(FKVF_E_INVALID_ARG, FKVF_NO_OFFSET, NULL,
                    "output buffer of %zu bytes%s, the selection needs %zu", out ? out_size : 0,
                    out ? "" : " (NULL)", need);
    if (!need)
        return FKVF_OK;
    uint8_t *o = out;
    const uint64_t S = r->desc.n_sinks, A = r->n_archived;
    const uint64_t end = p.first + p.count;
    /* archived positions [S, S + A) when A > 0 (spec 14.3) */
    uint64_t a0 = A ? S : end, a1 = A ? S + A : end;
    uint64_t pos = p.first;
    work w;
    int have_work = 0;
    while (pos < end && rc == FKVF_OK) {
        if (pos >= a0 && pos < a1) {
            uint64_t stop = a1 < end ? a1 : end;
            /* the bulk path decodes from the f16 tables in place where it
             * can (restore.c): no binary32 copy of them made for it */
            if (bulk_ok(r, &p, stop - pos)) {
                rc = read_archived_bulk(r, &p, pos, stop, o, need);
                pos = stop;
                continue;
            }
            if (!have_work && (rc = rd_restore_prepare(r)))
                return rc;
            if (r->cb_shape.layer_stages) {
                rc = read_archived_full(r, &p, pos, stop, o);
                pos = stop;
                continue;
            }
            if (!have_work) {
                if ((rc = work_init(r, &p, &w)))
                    return rc;
                w.st.out = o;
                have_work = 1;
            }
            rc = read_archived(r, &w, pos, stop);
            pos = stop;
        } else {
            rc = read_exact(r, &p, pos, o);
            pos++;
        }
    }
    if (have_work) {
        if (rc == FKVF_OK)
            stage_flush(&w.st);
        fkvf_free(r->alloc, w.mem);
    }
    return rc;
}
