/* Quantization metrics for the quality study (issue 19 B, prefix qm_).
 *
 * Attention reads an archived key k through q . k and an archived value v
 * through W_o v, so the error that matters is not |k - k_hat|^2 but
 * e^T S e with S the second moment of what multiplies it: the queries that
 * read the KV head (query-aware keys) or W_o,h^T W_o,h summed over the query
 * heads that read it (output-aware values). With S = U L U^T, the map
 * A = L^(1/2) U^T turns that metric into the Euclidean one (|A e|^2 =
 * e^T S e), so training and encoding in the space y = A x is training and
 * encoding under S, and a reconstruction y_hat maps back as A^-1 y_hat:
 * a sum of centroids A^-1 c, i.e. a codebook every FKVF reader decodes.
 *
 * Matrices are dense row-major, n x n, double unless said. Single-threaded;
 * no global state.
 */
#ifndef QM_METRIC_H
#define QM_METRIC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* M[g] += qt qt^T for every query head h of every layer, g = the KV head h
 * reads (h / (n_heads / n_kv)), with qt the query un-rotated at pos (the
 * frame pre-RoPE keys are stored in). q: one lm_queries() output, n_layers *
 * n_heads * D floats (post-RoPE). M: [n_layers][n_kv][D][D]. */
void qm_add_queries(double *M, const float *q, int n_layers, int n_heads, int n_kv, int D,
                    int pos);

/* S = sum over d in [d0, d1] of w(d) R(d) M R(d)^T / sum of w(d), with R(d)
 * the RoPE rotation of a D-dim head at position d (lm_rope) and w(d) =
 * n_pairs - d (the number of (query, key) pairs d apart in a sequence whose
 * archived keys are at most n_pairs - d before a query: pass the sequence's
 * steps minus the sinks). A pre-RoPE key error e at position p seen by a
 * query at t = p + d costs (R(d) qt . e)^2, so S is the query metric of
 * pre-RoPE keys averaged over the offsets that occur. 0 <= d0 <= d1 < n_pairs. */
void qm_rotation_average(const double *M, int D, int d0, int d1, int n_pairs, double *S);

/* W_o,h^T W_o,h summed over the query heads h of KV head g: the metric of a
 * value error of that KV head as it reaches the residual stream. wo: [dim][dim]
 * (out x in), head h's columns h * D .. h * D + D - 1. S: [n_kv][D][D]. */
void qm_output_metric(const float *wo, int n_heads, int n_kv, int D, double *S);

/* Eigen-decomposition of the symmetric n x n matrix a (destroyed) by cyclic
 * Jacobi rotations: eigenvalues into w[n], eigenvectors into the columns of
 * v (n x n). Returns the number of sweeps, or -1 if it did not converge. */
int qm_eigen_sym(double *a, int n, double *w, double *v);

/* The metric S (D x D, positive semi-definite) as a codebook file records
 * it (spec 13.8, fkvf train --key-metric): S normalised to trace D, plus
 * eps * I, positive definite; qm_transform factors the same matrix.
 * Returns 0, or -1 if S's trace is not positive. */
int qm_metric_matrix(const double *S, int D, double eps, double *M);

/* From a metric S (D x D, positive semi-definite): S normalised to trace D,
 * plus eps * I (so no direction is free and A^-1 stays bounded), then
 * A = L^(1/2) U^T and its inverse U L^(-1/2), as float. Returns 0, or -1 if
 * the eigen-decomposition failed or S's trace is not positive. */
int qm_transform(const double *S, int D, double eps, float *A, float *Ainv);

/* y = A x for a D x D float matrix (y and x distinct). */
void qm_apply(const float *A, int D, const float *x, float *y);

#ifdef __cplusplus
}
#endif
#endif
