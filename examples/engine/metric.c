/* Quantization metrics for the quality study: metric.h says what and why. */
#include "metric.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

void qm_add_queries(double *M, const float *q, int n_layers, int n_heads, int n_kv, int D,
                    int pos)
{
    float *t = malloc((size_t)D * sizeof *t);
    if (!t)
        abort();
    const int per = n_heads / n_kv;
    for (int l = 0; l < n_layers; l++)
        for (int h = 0; h < n_heads; h++) {
            memcpy(t, q + ((size_t)l * (size_t)n_heads + (size_t)h) * (size_t)D,
                   (size_t)D * sizeof *t);
            lm_rope(t, 1, D, pos, 1);
            double *m = M + ((size_t)l * (size_t)n_kv + (size_t)(h / per)) * (size_t)D * (size_t)D;
            for (int i = 0; i < D; i++)
                for (int j = 0; j < D; j++)
                    m[(size_t)i * (size_t)D + (size_t)j] += (double)t[i] * (double)t[j];
        }
    free(t);
}

void qm_rotation_average(const double *M, int D, int d0, int d1, int n_pairs, double *S)
{
    const size_t n = (size_t)D * (size_t)D;
    double *x = malloc(n * sizeof *x);
    float *col = malloc((size_t)D * sizeof *col);
    if (!x || !col)
        abort();
    memset(S, 0, n * sizeof *S);
    double wsum = 0;
    for (int d = d0; d <= d1; d++) {
        const double w = (double)(n_pairs - d);
        if (w <= 0)
            continue;
        /* x = R(d) M: rotate every column of M */
        for (int j = 0; j < D; j++) {
            for (int i = 0; i < D; i++)
                col[i] = (float)M[(size_t)i * (size_t)D + (size_t)j];
            lm_rope(col, 1, D, d, 0);
            for (int i = 0; i < D; i++)
                x[(size_t)i * (size_t)D + (size_t)j] = col[i];
        }
        /* S += w x R(d)^T: rotate every row of x */
        for (int i = 0; i < D; i++) {
            for (int j = 0; j < D; j++)
                col[j] = (float)x[(size_t)i * (size_t)D + (size_t)j];
            lm_rope(col, 1, D, d, 0);
            for (int j = 0; j < D; j++)
                S[(size_t)i * (size_t)D + (size_t)j] += w * col[j];
        }
        wsum += w;
    }
    for (size_t k = 0; k < n && wsum > 0; k++)
        S[k] /= wsum;
    /* symmetric up to float rounding: make it exactly so */
    for (int i = 0; i < D; i++)
        for (int j = i + 1; j < D; j++) {
            const double a = 0.5 * (S[(size_t)i * (size_t)D + (size_t)j] +
                                    S[(size_t)j * (size_t)D + (size_t)i]);
            S[(size_t)i * (size_t)D + (size_t)j] = S[(size_t)j * (size_t)D + (size_t)i] = a;
        }
    free(x);
    free(col);
}

void qm_output_metric(const float *wo, int n_heads, int n_kv, int D, double *S)
{
    const int dim = n_heads * D, per = n_heads / n_kv;
    memset(S, 0, (size_t)n_kv * (size_t)D * (size_t)D * sizeof *S);
    for (int h = 0; h < n_heads; h++) {
        double *s = S + (size_t)(h / per) * (size_t)D * (size_t)D;
        for (int r = 0; r < dim; r++) {
            const float *row = wo + (size_t)r * (size_t)dim + (size_t)h * (size_t)D;
            for (int a = 0; a < D; a++)
                for (int b = 0; b < D; b++)
                    s[(size_t)a * (size_t)D + (size_t)b] += (double)row[a] * (double)row[b];
        }
    }
}

int qm_eigen_sym(double *a, int n, double *w, double *v)
{
    const size_t N = (size_t)n;
    for (size_t i = 0; i < N; i++)
        for (size_t j = 0; j < N; j++)
            v[i * N + j] = i == j ? 1.0 : 0.0;
    double total = 0;
    for (size_t k = 0; k < N * N; k++)
        total += a[k] * a[k];
    for (int sweep = 1; sweep <= 100; sweep++) {
        double off = 0;
        for (size_t p = 0; p < N; p++)
            for (size_t q = p + 1; q < N; q++)
                off += a[p * N + q] * a[p * N + q];
        if (off <= 1e-30 * total || off == 0) {
            for (size_t i = 0; i < N; i++)
                w[i] = a[i * N + i];
            return sweep - 1;
        }
        for (size_t p = 0; p < N; p++)
            for (size_t q = p + 1; q < N; q++) {
                const double apq = a[p * N + q];
                if (apq == 0)
                    continue;
                /* the rotation in the (p, q) plane that zeroes a[p][q] */
                const double th = (a[q * N + q] - a[p * N + p]) / (2.0 * apq);
                const double t = (th >= 0 ? 1.0 : -1.0) / (fabs(th) + sqrt(th * th + 1.0));
                const double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
                for (size_t k = 0; k < N; k++) { /* columns p and q */
                    const double akp = a[k * N + p], akq = a[k * N + q];
                    a[k * N + p] = c * akp - s * akq;
                    a[k * N + q] = s * akp + c * akq;
                }
                for (size_t k = 0; k < N; k++) { /* rows p and q */
                    const double apk = a[p * N + k], aqk = a[q * N + k];
                    a[p * N + k] = c * apk - s * aqk;
                    a[q * N + k] = s * apk + c * aqk;
                }
                for (size_t k = 0; k < N; k++) {
                    const double vkp = v[k * N + p], vkq = v[k * N + q];
                    v[k * N + p] = c * vkp - s * vkq;
                    v[k * N + q] = s * vkp + c * vkq;
                }
            }
    }
    return -1;
}

int qm_metric_matrix(const double *S, int D, double eps, double *M)
{
    const size_t N = (size_t)D;
    double tr = 0;
    for (size_t i = 0; i < N; i++)
        tr += S[i * N + i];
    if (!(tr > 0))
        return -1;
    for (size_t i = 0; i < N; i++)
        for (size_t j = 0; j < N; j++)
            M[i * N + j] = S[i * N + j] * (double)D / tr + (i == j ? eps : 0.0);
    return 0;
}

int qm_transform(const double *S, int D, double eps, float *A, float *Ainv)
{
    const size_t N = (size_t)D;
    double *a = malloc(N * N * sizeof *a), *v = malloc(N * N * sizeof *v),
           *w = malloc(N * sizeof *w);
    if (!a || !v || !w)
        abort();
    int rc = qm_metric_matrix(S, D, eps, a) ? -1 : qm_eigen_sym(a, D, w, v) < 0 ? -1 : 0;
    for (size_t i = 0; rc == 0 && i < N; i++) {
        const double l = w[i] > eps ? w[i] : eps; /* rounding may dip below */
        const double r = sqrt(l);
        for (size_t j = 0; j < N; j++) {
            A[i * N + j] = (float)(r * v[j * N + i]);    /* row i: sqrt(l_i) u_i^T */
            Ainv[j * N + i] = (float)(v[j * N + i] / r); /* column i: u_i / sqrt(l_i) */
        }
    }
    free(a);
    free(v);
    free(w);
    return rc;
}

void qm_apply(const float *A, int D, const float *x, float *y)
{
    for (int i = 0; i < D; i++) {
        double s = 0;
        for (int j = 0; j < D; j++)
            s += (double)A[(size_t)i * (size_t)D + (size_t)j] * (double)x[j];
        y[i] = (float)s;
    }
}
