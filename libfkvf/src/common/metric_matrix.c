/* Encoder metric matrices (spec 13.8): the check and the factor. */
#include "metric_matrix.h"

#include <math.h>

int fkvf_metric_check(const float *m, uint32_t n, double *l, size_t *bad)
{
    size_t nn = (size_t)n * n;
    for (size_t i = 0; i < nn; i++)
        if (!isfinite(m[i])) {
            if (bad)
                *bad = i;
            return FKVF_METRIC_NONFINITE;
        }
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = i + 1; j < n; j++)
            if (m[(size_t)i * n + j] != m[(size_t)j * n + i]) {
                if (bad)
                    *bad = (size_t)i * n + j;
                return FKVF_METRIC_ASYMMETRIC;
            }
    for (size_t i = 0; i < nn; i++)
        l[i] = 0.0;
    /* column by column: L(j,j)^2 = M(j,j) - sum_{p<j} L(j,p)^2, then
     * L(i,j) = (M(i,j) - sum_{p<j} L(i,p) L(j,p)) / L(j,j) for i > j */
    for (uint32_t j = 0; j < n; j++) {
        double *lj = l + (size_t)j * n;
        double d = (double)m[(size_t)j * n + j];
        for (uint32_t p = 0; p < j; p++)
            d -= lj[p] * lj[p];
        if (!(d > 0.0)) {
            if (bad)
                *bad = (size_t)j * n + j;
            return FKVF_METRIC_NOT_PD;
        }
        double ljj = sqrt(d);
        lj[j] = ljj;
        for (uint32_t i = j + 1; i < n; i++) {
            double *li = l + (size_t)i * n;
            double s = (double)m[(size_t)i * n + j];
            for (uint32_t p = 0; p < j; p++)
                s -= li[p] * lj[p];
            li[j] = s / ljj;
        }
    }
    return FKVF_METRIC_OK;
}

void fkvf_metric_symmetrize(const float *m, uint32_t n, float *out)
{
    for (uint32_t i = 0; i < n; i++) {
        out[(size_t)i * n + i] = m[(size_t)i * n + i];
        for (uint32_t j = i + 1; j < n; j++)
            out[(size_t)i * n + j] = out[(size_t)j * n + i] =
                (float)(((double)m[(size_t)i * n + j] + (double)m[(size_t)j * n + i]) * 0.5);
    }
}

void fkvf_metric_transpose(const double *l, uint32_t n, double *u)
{
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n; j++)
            u[(size_t)i * n + j] = l[(size_t)j * n + i];
}

void fkvf_metric_apply(const double *u, uint32_t n, const float *x, float *y)
{
    for (uint32_t i = 0; i < n; i++) {
        const double *ui = u + (size_t)i * n;
        double s = 0.0;
        for (uint32_t j = i; j < n; j++)
            s += ui[j] * (double)x[j];
        y[i] = (float)s;
    }
}
