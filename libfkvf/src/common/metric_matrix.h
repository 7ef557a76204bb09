/* An encoder metric's matrix (spec 13.8): the one test of what a valid
 * matrix is (finite, symmetric, positive definite by the binary64 Cholesky
 * factorization the clause describes) and the factor the quantizer encodes
 * with. Used by format/ (the CMET checks), read/ (full verification) and
 * quant/ (fkvf_rvq_set_metric). */
#ifndef FKVF_COMMON_METRIC_MATRIX_H
#define FKVF_COMMON_METRIC_MATRIX_H

#include <stddef.h>
#include <stdint.h>

#include "fkvf.h"

/* The largest dimension of a metric matrix (spec 13.8, 15). */
#define FKVF_METRIC_MAX_DIM 1024u

/* What fkvf_metric_check finds wrong with a matrix: FKVF_METRIC_OK, or
 * fkvf.h's FKVF_METRIC_NONFINITE (an infinity or a NaN) and
 * FKVF_METRIC_NOT_PD (a Cholesky pivot <= 0), or FKVF_METRIC_ASYMMETRIC
 * ((i, j) and (j, i) differ in value: only a file's matrix can be, the
 * API takes the symmetric part, fkvf_metric_symmetrize). */
#define FKVF_METRIC_OK 0
#define FKVF_METRIC_ASYMMETRIC 2

/* Check the n x n row-major matrix m (1 <= n <= FKVF_METRIC_MAX_DIM) in the
 * order of spec 13.8 step 7: every element finite, then symmetry, then the
 * Cholesky factorization M = L L^T in binary64, column by column, every
 * pivot > 0. l: n * n doubles of scratch, which receives L (row-major,
 * lower triangle; the upper triangle zero) when the result is
 * FKVF_METRIC_OK. *bad (may be NULL): the element index (i * n + j) of the
 * first fault, or the pivot's column j as j * n + j. */
int fkvf_metric_check(const float *m, uint32_t n, double *l, size_t *bad);

/* out = (m + m^T) / 2, each pair summed in binary64 and rounded once, so
 * out is symmetric exactly (and equal to m when m is): the part of m that
 * e^T M e depends on. What the API takes from a caller's matrix (a Gram
 * matrix computed in floating point is often not symmetric to the last
 * bit); a file's matrix must be symmetric itself (spec 13.8). */
void fkvf_metric_symmetrize(const float *m, uint32_t n, float *out);

/* u = L^T (row-major, upper triangle) from fkvf_metric_check's L. */
void fkvf_metric_transpose(const double *l, uint32_t n, double *u);

/* y = U x with U = L^T (fkvf_metric_transpose), in binary64, rounded to
 * binary32: |U e|^2 = e^T M e, so Euclidean distances between transformed
 * vectors are the metric's. */
void fkvf_metric_apply(const double *u, uint32_t n, const float *x, float *y);

#endif
