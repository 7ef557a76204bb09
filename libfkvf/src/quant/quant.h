/* Internal interface of the quantizer module (spec 13): residual vector
 * quantization (RVQ) codebooks, their training, encoding and decoding, and
 * element conversions. quant/ uses common/ only (RoPE: common/rope.h). */
#ifndef FKVF_QUANT_H
#define FKVF_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "fkvf.h"
#include "handle.h"

/* A codebook handle: what every public fkvf_rvq_* function checks first
 * (NULL, freed or another kind of handle is refused). */
#define FKVF_RVQ_OK(q) FKVF_HANDLE_IS(q, FKVF_HANDLE_RVQ)

/* ---- element access (little-endian, any alignment) ------------------------ */

/* Element size of a cache dtype (2 or 4), 0 if invalid. */
size_t fkvfq_dtype_size(fkvf_dtype dt);
/* n elements of dtype dt at src -> f32. */
void fkvfq_load(fkvf_dtype dt, const uint8_t *src, float *dst, size_t n);
/* The same without the F16C path (for tests: results are identical). */
void fkvfq_load_portable(fkvf_dtype dt, const uint8_t *src, float *dst, size_t n);
/* n f32 -> dtype dt at dst, rounding to nearest even. */
void fkvfq_store(fkvf_dtype dt, const float *src, uint8_t *dst, size_t n);
/* The same without the AVX2 path (for tests: results are identical). */
void fkvfq_store_portable(fkvf_dtype dt, const float *src, uint8_t *dst, size_t n);

/* ---- nearest-centroid search ---------------------------------------------- */

/* Width of a centroid panel: the encoder's copy of a stage table stores
 * centroids in panels of FKVFQ_PANEL, element (d, i) of the panel starting at
 * centroid p at panels[p * dim + d * FKVFQ_PANEL + i]. k is a multiple. */
#define FKVFQ_PANEL 16
/* Vectors searched together. */
#define FKVFQ_BLOCK 4

/* One stage table as the search sees it. */
typedef struct fkvfq_table {
    const float *rows;   /* k rows of dim (spec 13.2 order) */
    const float *panels; /* the same centroids in panel layout */
    const float *norms;  /* ||c||^2 rounded to f32 */
    double cmax;         /* upper bound of max ||c|| */
    uint32_t k, dim;
} fkvfq_table;

/* Build panels, norms and cmax of a table from its rows. A row equal to an
 * earlier one gets an infinite norm (it can never be picked). scratch holds
 * fkvfq_prepare_scratch(k) bytes, suitably aligned (from the allocator). */
void fkvfq_table_prepare(const float *rows, uint32_t k, uint32_t dim, float *panels,
                         float *norms, double *cmax, void *scratch);
/* The panels alone (k * dim floats). */
void fkvfq_table_panels(const float *rows, uint32_t k, uint32_t dim, float *panels);
/* The same without the panels (what fkvfq_scores_rows needs). */
void fkvfq_table_norms(const float *rows, uint32_t k, uint32_t dim, float *norms, double *cmax,
                       void *scratch);
/* fkvfq_table_norms over f16 rows (k rows of dim values, 2-byte aligned),
 * each element widened exactly: the same norms, cmax and duplicates, and no
 * binary32 copy. Only when fkvfq_table_norms16_usable() (AVX-512 and F16C).
 * Returns 0 (norms and cmax unspecified) if an element is an infinity or a
 * NaN, else 1. */
int fkvfq_table_norms16_usable(void);
int fkvfq_table_norms16(const uint16_t *rows, uint32_t k, uint32_t dim, float *norms,
                        double *cmax, void *scratch);
size_t fkvfq_prepare_scratch(uint32_t k);

/* scores[j * k + c] = norms[c] - 2 * <x[j], c> in binary32 for j < 4 (all
 * four x pointers must be valid; repeat one for fewer vectors), and
 * pmin[j * (k / FKVFQ_PANEL) + p] = the smallest score of panel p. */
void fkvfq_scores4(const fkvfq_table *t, const float *const x[FKVFQ_BLOCK], float *scores,
                   float *pmin);
/* The same with the portable kernel only (fkvfq_scores4 uses AVX-512, or
 * AVX2 + FMA, when the CPU has them); for tests. */
void fkvfq_scores4_portable(const fkvfq_table *t, const float *const x[FKVFQ_BLOCK],
                            float *scores, float *pmin);

/* The kernel sets of the search, in order: the portable code, AVX2 + FMA,
 * AVX-512 (scores4 and pick). The scores of the AVX2 and AVX-512 kernels are
 * bit-identical (the same operations per lane); the portable kernel's may
 * differ from theirs in the last bits (no fused multiply-add), within the
 * rounding bound fkvfq_pick allows for, so every set picks the same
 * centroids. */
#define FKVFQ_ISA_PORTABLE 0
#define FKVFQ_ISA_AVX2 1
#define FKVFQ_ISA_AVX512 2
/* The best set this CPU runs (what fkvfq_scores4 and fkvfq_pick use). */
int fkvfq_isa(void);
/* fkvfq_scores4 with the kernel of set isa, or of the best set this CPU
 * runs if that is lower (tests; the reference encoder of the benchmarks). */
void fkvfq_scores4_isa(int isa, const fkvfq_table *t, const float *const x[FKVFQ_BLOCK],
                       float *scores, float *pmin);

/* Vectors scored together from a table's rows by fkvfq_scores_rows (the
 * encoder's groups): the lanes of two AVX registers. */
#define FKVFQ_LANES 16
/* xt[d * FKVFQ_LANES + j] = element d of vector min(j, n - 1), vector j at
 * x + j * xstride (1 <= n <= FKVFQ_LANES): the transposed group
 * fkvfq_scores_rows reads. */
void fkvfq_transpose_lanes(const float *x, size_t xstride, unsigned n, uint32_t dim, float *xt);
/* Scores and panel minimums of the n vectors of xt (fkvfq_transpose_lanes)
 * laid out as fkvfq_scores4's (scores[j * k + c], pmin[j * (k /
 * FKVFQ_PANEL) + p], j < n) from t->rows and t->norms (t->panels is not
 * read): bit-identical to what fkvfq_scores4 gives for each vector on the
 * same CPU (AVX2 + FMA or the portable path). */
void fkvfq_scores_rows(const fkvfq_table *t, const float *xt, unsigned n, float *scores,
                       float *pmin);
/* The same with the portable path only (equal to fkvfq_scores4_portable's
 * scores); for tests. */
void fkvfq_scores_rows_portable(const fkvfq_table *t, const float *xt, unsigned n,
                                float *scores, float *pmin);

/* Exact nearest centroid of x given its binary32 scores and panel minimums
 * (one vector's share of fkvfq_scores4's output): the centroid with the
 * smallest sum over d of (x[d] - c[d])^2 evaluated in binary64 in order
 * d = 0..dim-1, ties to the smallest index. Only centroids whose binary32
 * score lies within a proven rounding bound of the best are re-evaluated.
 * If dist is not NULL it receives that binary64 distance. */
uint32_t fkvfq_pick(const fkvfq_table *t, const float *x, const float *scores,
                    const float *pmin, double *dist);

/* fkvfq_pick with the code of set isa (FKVFQ_ISA_*), or of the best set
 * this CPU runs if that is lower: the same result from every set. */
uint32_t fkvfq_pick_isa(int isa, const fkvfq_table *t, const float *x, const float *scores,
                        const float *pmin, double *dist);

/* ||x||^2 in binary64 as fkvfq_pick computes it (four partial sums, element
 * d to sum d mod 4 while four remain, the rest to sum 0, added as
 * (s0 + s1) + (s2 + s3)). */
double fkvfq_norm2(const float *x, uint32_t dim);
/* fkvfq_pick given xx = fkvfq_norm2(x, dim) (a caller that picks for the
 * same vector many times computes it once): the same result. */
uint32_t fkvfq_pick_xx(const fkvfq_table *t, const float *x, double xx, const float *scores,
                       const float *pmin, double *dist);

/* E of fkvfq_pick's threshold for a vector with xx = fkvfq_norm2(x): the
 * binary32 score of every centroid of t lies within E of its exact value
 * ||c||^2 - 2<x, c> (with room to spare: E is twice a proven bound). */
double fkvfq_score_bound(const fkvfq_table *t, double xx);

/* sum over d of (x[d] - c[d])^2 in binary64, in order. */
double fkvfq_dist(const float *x, const float *c, uint32_t dim);
/* out[i] = fkvfq_dist(x[i], c[i], dim) for i < 4 (the same values; the four
 * sums run side by side). */
void fkvfq_dist4(const float *const x[4], const float *const c[4], uint32_t dim, double out[4]);

/* ---- the codebook handle --------------------------------------------------- */

struct fkvf_rvq {
    fkvf_handle h;       /* FKVF_HANDLE_RVQ; always OPEN (immutable once made) */
    fkvf_allocator alloc;
    fkvf_codebook_shape shape;
    uint32_t n_kv_heads; /* heads of the cache rows (= shape.n_heads unless pooled) */
    size_t n_tabs;       /* n_layers * shape.n_heads */
    size_t per_tab;      /* floats per (layer, head): k * (ks * Dk + vs * Dv) */
    size_t n_floats;     /* n_tabs * per_tab */
    float *rows;         /* all tables, spec 13.2 order, binary32 (NULL in a
                          * handle of borrowed f16 tables) */
    const uint16_t *rows16; /* fkvf_rvq_from_tables16_borrow: the f16 tables as stored,
                          * spec 13.2 order, borrowed (else NULL) */
    float *panels;       /* the same, panel layout per stage table (training's
                          * handles only, FKVFQ_LAYOUT_PANELS; else NULL) */
    float *norms;        /* n_tabs * (ks + vs) * k */
    double *cmax;        /* n_tabs * (ks + vs) */
    int decode_only;     /* rows only: no search layout (fkvf_rvq_from_tables_decode) */
    /* Stage counts per layer (spec 13.1 layer table; layers.c): the table
     * (shape.layer_stages points at it), one uniform handle of one layer per
     * layer that holds its tables and does its work, and the first code of
     * each layer (n_layers + 1 entries). All NULL in a uniform handle, whose
     * shape never has a table. */
    uint8_t *lst;
    struct fkvf_rvq **lay;
    size_t *lcode;
    /* A one-layer handle of a per-layer one works on whole cache rows:
     * row_elems elements a row (0: the handle's own rows), its layer at
     * element layer_elem. */
    size_t row_elems, layer_elem;
    /* Encoder metric (spec 13.8, metric.c; NULL without): the matrices as
     * given (mk, mv: n_layers * shape.n_heads matrices of Dk^2 / Dv^2
     * floats, NULL for a part without), their factors U = L^T (uk, uv,
     * binary64, fkvf_metric_check / fkvf_metric_transpose), and menc, a
     * handle of the same shape whose binary32 tables are U c: encoding
     * searches it with U x (so Euclidean distances there are e^T M e). */
    float *mk, *mv;
    double *uk, *uv;
    struct fkvf_rvq *menc;
    /* threads of an encode or decode call (fkvf_rvq_set_threads; 0 or 1:
     * the calling thread only). Only the handle a caller holds has it: the
     * layer and metric handles inside run on the threads it starts. */
    unsigned threads;
};

/* The metric factors an encode applies to the vectors it loads: uk / uv
 * hold the U of tables 0.. of the handle being encoded (a layer's share for
 * a layer handle); NULL for a Euclidean part. */
typedef struct fkvfq_xform {
    const double *uk, *uv;
} fkvfq_xform;

/* ---- metric.c: the encoder metric ------------------------------------------ */

/* Frees q's metric (matrices, factors, menc). */
void fkvfq_metric_release(fkvf_rvq *q);
/* Factors of a metric given to training or fkvf_rvq_set_metric, for a
 * shape: *uk / *uv allocated (NULL for a part without), each matrix checked.
 * FKVF_E_INVALID_ARG (not finite, symmetric, positive definite; a dimension
 * above FKVF_METRIC_MAX_DIM; no part), FKVF_E_NOMEM. */
int fkvfq_metric_factor(const fkvf_allocator *a, const fkvf_codebook_shape *sh,
                        const fkvf_rvq_metric *m, double **uk, double **uv);
/* x = U^-1 y (back substitution, binary64), U upper triangular n x n. */
void fkvfq_metric_solve(const double *u, uint32_t n, const float *y, double *x);
/* The encode of fkvf_rvq_encode, vectors transformed by xf when not NULL. */
int fkvfq_rvq_encode_xf(const fkvf_rvq *q, const fkvfq_xform *xf, const fkvf_rows *rows,
                        const fkvf_rope *key_rope, unsigned beam_width, uint16_t *codes,
                        size_t pos_stride, size_t code_stride);

/* What fkvfq_rvq_alloc's decode_only argument asks for: the search layout
 * with panels (training fills and scores them, fkvfq_scores4), rows only
 * (decoding), or the search layout of the encoder (norms and cmax; it scores
 * from the rows, fkvfq_scores_rows). */
#define FKVFQ_LAYOUT_PANELS 0
#define FKVFQ_LAYOUT_DECODE 1
#define FKVFQ_LAYOUT_ENCODE 2
/* no tables at all: fkvf_rvq_from_tables16_borrow sets rows16 */
#define FKVFQ_LAYOUT_F16 3
/* no binary32 tables, the encoder's norms and cmax:
 * fkvf_rvq_from_tables16_encode sets rows16 (the encoder widens one table
 * set at a time into its scratch) */
#define FKVFQ_LAYOUT_F16_ENCODE 4

/* Allocate an empty handle for a validated shape (tables uninitialized);
 * decode_only is one of FKVFQ_LAYOUT_*. */
int fkvfq_rvq_alloc(fkvf_rvq **out, const fkvf_codebook_shape *shape, uint32_t n_kv_heads, int decode_only,
                    const fkvf_allocator *alloc);
/* ---- layers.c: handles with stage counts per layer ------------------------ */

/* 1 when shape s has no layer table or every layer has the same counts. */
int fkvfq_lay_uniform(const fkvf_codebook_shape *s);
/* The shape of layer l of s alone: one layer, that layer's counts. */
fkvf_codebook_shape fkvfq_lay_shape(const fkvf_codebook_shape *s, uint32_t l);
/* An empty per-layer handle for a valid shape with a table that is not
 * uniform (its layer handles NULL until fkvfq_lay_adopt). */
int fkvfq_lay_new(fkvf_rvq **out, const fkvf_codebook_shape *shape, uint32_t n_kv_heads,
                  const fkvf_allocator *alloc);
/* q takes sub (a handle of fkvfq_lay_shape(&q->shape, l)) as layer l. */
void fkvfq_lay_adopt(fkvf_rvq *q, uint32_t l, fkvf_rvq *sub);
/* Frees the layer handles and tables of a per-layer handle (not q). */
void fkvfq_lay_release(fkvf_rvq *q);
/* A per-layer handle of shape `want` (q's shape with a table that is not
 * uniform) whose layer l has the first ks(l) and vs(l) stage tables of q's
 * layer l, in q's layout (training's panels, or the encoder's), prepared. */
int fkvfq_rvq_take_layers(fkvf_rvq **out, const fkvf_rvq *q, const fkvf_codebook_shape *want);

/* Offset (in floats) of stage table (tab, kv, s) in rows / panels. */
size_t fkvfq_table_off(const fkvf_rvq *q, size_t tab, unsigned kv, unsigned s);
/* Fill norms and cmax (and the panels, when the handle has them) of every
 * table from rows (or rows16: f16 tables in place, each checked for
 * infinities and NaNs as it is widened): FKVF_OK, FKVF_E_NOMEM, or
 * FKVF_E_INVALID_ARG for a non-finite f16 element. */
int fkvfq_rvq_prepare(fkvf_rvq *q);
/* One k-means stage as training runs it (for tests): n vectors of dim,
 * initial centroids `init` (k * dim) or k-means++ seeding from `seed` when
 * NULL, at most max_iters Lloyd iterations. Outputs the k * dim centroids,
 * the final exact assignment (asg, n entries, may be NULL), the number of
 * empty clusters re-seeded and the Lloyd iterations run (may be NULL).
 * k a multiple of FKVFQ_PANEL. */
int fkvfq_kmeans(const fkvf_allocator *alloc, const float *x, size_t n, uint32_t dim,
                 uint32_t k, const float *init, uint64_t seed, uint32_t max_iters,
                 float *centroids, uint32_t *asg, size_t *repairs, uint32_t *iters);

/* k-means++ seeding's distance update with the kernel of set isa
 * (FKVFQ_ISA_*; the best this CPU runs if lower), for tests: d2[i] = the
 * squared distance of vector i of x (n of dim) to c, eight binary32 lanes
 * (element d to lane d mod 8) summed in binary64 in lane order, or the
 * smaller of it and d2[i] unless first; returns the sum of the new d2 in
 * order i, and cum[i] = that sum after term i. Every set gives the same
 * bits. xt: fkvfq_seed_scratch(n, dim) floats (the AVX-512 kernel's
 * transposed copy). */
double fkvfq_seed_update_isa(int isa, const float *x, size_t n, uint32_t dim, const float *c,
                             double *d2, double *cum, int first, float *xt);
size_t fkvfq_seed_scratch(size_t n, uint32_t dim);

/* Training's workers each hold one table's sample and k-means' arrays
 * (about 8 * dim + 53 bytes a sample vector): a training starts no more of
 * them than fit FKVFQ_TRAIN_SCRATCH_BYTES, and at least one, whatever
 * n_threads asks for (the codebook is the same for any count).
 * fkvfq_train_threads: that count for n_threads asked and scratch_bytes a
 * worker. Pure. */
#define FKVFQ_TRAIN_SCRATCH_BYTES ((size_t)1 << 30)
unsigned fkvfq_train_threads(unsigned n_threads, size_t scratch_bytes);

/* Does fkvf_rvq_decode have its AVX2 + F16C kernels on this CPU (the f16
 * group kernel that decodes from f16 tables)? The test fkvf_rvq_decode
 * itself makes; 0 in a build without them. */
int fkvfq_decode16_available(void);

/* fkvf_rvq_decode with the portable code only (no AVX2 / F16C kernels);
 * bit-identical output, for tests. */
int fkvfq_rvq_decode_portable(const fkvf_rvq *q, const uint16_t *codes, size_t pos_stride,
                              size_t code_stride, size_t n_rows, uint64_t first_position,
                              const fkvf_rope *key_rope, fkvf_dtype out_dtype, void *out,
                              size_t out_size);

/* Where fkvfq_rvq_decode_map puts the vectors it decodes: layers
 * [l0, l0 + nl) only (their codes alone: a position's first code is that of
 * layer l0, then the codes of a whole position in their order up to the
 * end of layer l0 + nl - 1), stored as the rows of those layers (spec 14.2
 * restricted to them: FKVF_LAYOUT_ROWS) or, heads = 1, heads-first
 * (FKVF_LAYOUT_HEADS: per layer, keys [head][row][Dk] then values
 * [head][row][Dv]), as rows [row0, row0 + n_rows) of an output of n_out
 * rows (fkvf_rvq_decode_target). */
typedef struct fkvfq_dec_map {
    uint32_t l0, nl;
    int heads;
    size_t n_out, row0; /* the output's rows; the first decoded row's place in it */
    unsigned parts;     /* FKVF_PART_KEYS | FKVF_PART_VALUES (0: both) */
} fkvfq_dec_map;

/* fkvf_rvq_decode_to with map (fast = 0: the portable code only, for
 * tests). */
int fkvfq_rvq_decode_map(const fkvf_rvq *q, const fkvfq_dec_map *map, const uint16_t *codes,
                         size_t pos_stride, size_t code_stride, size_t n_rows,
                         uint64_t first_position, const fkvf_rope *key_rope, fkvf_dtype out_dtype,
                         void *out, size_t out_size, int fast);

#endif
