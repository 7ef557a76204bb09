/* Tests of the quality study's quantization metrics (examples/engine/metric.c):
 * the eigen-decomposition against known spectra and its defining identities,
 * the metric transform (|A e|^2 is the metric, A^-1 inverts A), the rotation
 * average and the query and output metrics against hand-computed values. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "metric.h"
#include "model.h"
#include "testutil.h"

static double urand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return ((double)((*s >> 8) & 0xffffff) / 16777216.0) * 2.0 - 1.0;
}

START_TEST(eigen_known_2x2)
{
    double a[4] = {2, 1, 1, 2}, w[2], v[4];
    ck_assert_int_ge(qm_eigen_sym(a, 2, w, v), 0);
    const double lo = w[0] < w[1] ? w[0] : w[1], hi = w[0] < w[1] ? w[1] : w[0];
    ck_assert_double_eq_tol(lo, 1.0, 1e-12);
    ck_assert_double_eq_tol(hi, 3.0, 1e-12);
    /* the eigenvector of 3 is (1, 1) / sqrt 2, up to sign */
    const int i = w[0] > w[1] ? 0 : 1;
    ck_assert_double_eq_tol(fabs(v[0 * 2 + i]), sqrt(0.5), 1e-12);
    ck_assert_double_eq_tol(v[0 * 2 + i], v[1 * 2 + i], 1e-12);
}
END_TEST

/* a random symmetric 24 x 24 matrix: S V = V diag(w), V^T V = I */
START_TEST(eigen_identities)
{
    enum { N = 24 };
    double s[N * N], a[N * N], w[N], v[N * N];
    unsigned seed = 7;
    for (int i = 0; i < N; i++)
        for (int j = 0; j <= i; j++)
            s[i * N + j] = s[j * N + i] = urand(&seed);
    memcpy(a, s, sizeof a);
    ck_assert_int_ge(qm_eigen_sym(a, N, w, v), 0);
    for (int i = 0; i < N; i++)
        for (int k = 0; k < N; k++) {
            double sv = 0, vv = 0;
            for (int j = 0; j < N; j++) {
                sv += s[i * N + j] * v[j * N + k];
                vv += v[j * N + i] * v[j * N + k];
            }
            EXPECTF(fabs(sv - v[i * N + k] * w[k]) < 1e-9, "S v_%d row %d: %g vs %g", k, i, sv,
                    v[i * N + k] * w[k]);
            EXPECTF(fabs(vv - (i == k ? 1.0 : 0.0)) < 1e-9, "V^T V [%d][%d] = %g", i, k, vv);
        }
}
END_TEST

/* |A e|^2 = e^T (S D / tr S + eps I) e and A^-1 A = I */
START_TEST(transform_is_the_metric)
{
    enum { D = 16 };
    double s[D * D], b[D * D];
    unsigned seed = 11;
    /* S = B B^T, rank 4 (the floor eps keeps A invertible) */
    for (int i = 0; i < D * D; i++)
        b[i] = (i % D) < 4 ? urand(&seed) : 0.0;
    double tr = 0;
    for (int i = 0; i < D; i++)
        for (int j = 0; j < D; j++) {
            double x = 0;
            for (int k = 0; k < D; k++)
                x += b[i * D + k] * b[j * D + k];
            s[i * D + j] = x;
            tr += i == j ? x : 0.0;
        }
    const double eps = 0.01;
    float A[D * D], Ai[D * D];
    ck_assert_int_eq(qm_transform(s, D, eps, A, Ai), 0);
    for (int t = 0; t < 20; t++) {
        float e[D], y[D], back[D];
        for (int i = 0; i < D; i++)
            e[i] = (float)urand(&seed);
        qm_apply(A, D, e, y);
        double ay = 0, ese = 0;
        for (int i = 0; i < D; i++) {
            ay += (double)y[i] * y[i];
            for (int j = 0; j < D; j++)
                ese += (double)e[i] * (s[i * D + j] * D / tr + (i == j ? eps : 0.0)) * e[j];
        }
        EXPECTF(fabs(ay - ese) < 1e-4 * (1.0 + ese), "|Ae|^2 %g vs e^T S e %g", ay, ese);
        qm_apply(Ai, D, y, back);
        for (int i = 0; i < D; i++)
            EXPECTF(fabs(back[i] - e[i]) < 1e-3, "A^-1 A e [%d]: %g vs %g", i, back[i], e[i]);
    }
    /* a zero metric has no transform */
    double z[D * D] = {0};
    ck_assert_int_eq(qm_transform(z, D, eps, A, Ai), -1);
}
END_TEST

/* D = 2: RoPE turns the pair by angle d (frequency 1 / theta^0 = 1), so
 * R(d) e0 e0^T R(d)^T = u u^T with u = (cos d, sin d) */
START_TEST(rotation_average_by_hand)
{
    const double M[4] = {1, 0, 0, 0};
    double S[4];
    qm_rotation_average(M, 2, 3, 3, 10, S);
    const double c3 = cos(3.0), s3 = sin(3.0);
    ck_assert_double_eq_tol(S[0], c3 * c3, 1e-6);
    ck_assert_double_eq_tol(S[1], c3 * s3, 1e-6);
    ck_assert_double_eq_tol(S[2], c3 * s3, 1e-6);
    ck_assert_double_eq_tol(S[3], s3 * s3, 1e-6);
    /* d = 1, 2 with n_pairs 4: weights 3 and 2 */
    qm_rotation_average(M, 2, 1, 2, 4, S);
    const double c1 = cos(1.0), s1 = sin(1.0), c2 = cos(2.0), s2 = sin(2.0);
    ck_assert_double_eq_tol(S[0], (3 * c1 * c1 + 2 * c2 * c2) / 5, 1e-6);
    ck_assert_double_eq_tol(S[1], (3 * c1 * s1 + 2 * c2 * s2) / 5, 1e-6);
    ck_assert_double_eq_tol(S[3], (3 * s1 * s1 + 2 * s2 * s2) / 5, 1e-6);
    /* the identity is invariant (D = 8, several frequencies) */
    double I8[64] = {0}, S8[64];
    for (int i = 0; i < 8; i++)
        I8[i * 8 + i] = 1;
    qm_rotation_average(I8, 8, 0, 40, 50, S8);
    for (int i = 0; i < 64; i++)
        ck_assert_double_eq_tol(S8[i], I8[i], 1e-6);
}
END_TEST

/* queries un-rotated at their position: R(p) e0 adds e0 e0^T; GQA sums a
 * KV head's query heads */
START_TEST(queries_by_hand)
{
    /* 1 layer, 2 query heads, 1 KV head, D = 2 */
    double M[4] = {0};
    float q[4] = {1, 0, 0, 2};
    lm_rope(q, 2, 2, 5, 0); /* as lm_forward leaves them at position 5 */
    qm_add_queries(M, q, 1, 2, 1, 2, 5);
    ck_assert_double_eq_tol(M[0], 1.0, 1e-6);
    ck_assert_double_eq_tol(M[1], 0.0, 1e-6);
    ck_assert_double_eq_tol(M[2], 0.0, 1e-6);
    ck_assert_double_eq_tol(M[3], 4.0, 1e-6);
    /* 2 KV heads: each its own */
    double M2[8] = {0};
    float q2[4] = {1, 0, 0, 2};
    qm_add_queries(M2, q2, 1, 2, 2, 2, 0);
    ck_assert_double_eq_tol(M2[0], 1.0, 1e-12);
    ck_assert_double_eq_tol(M2[3], 0.0, 1e-12);
    ck_assert_double_eq_tol(M2[4 + 3], 4.0, 1e-12);
    ck_assert_double_eq_tol(M2[4 + 0], 0.0, 1e-12);
}
END_TEST

/* wo's row 0 = (1, 2, 3, 4), other rows 0: head 0 reads columns 0-1, head
 * 1 columns 2-3 */
START_TEST(output_metric_by_hand)
{
    float wo[16] = {1, 2, 3, 4};
    double S[8];
    qm_output_metric(wo, 2, 1, 2, S); /* one KV head: both query heads */
    ck_assert_double_eq_tol(S[0], 1 + 9, 1e-12);
    ck_assert_double_eq_tol(S[1], 2 + 12, 1e-12);
    ck_assert_double_eq_tol(S[2], 2 + 12, 1e-12);
    ck_assert_double_eq_tol(S[3], 4 + 16, 1e-12);
    qm_output_metric(wo, 2, 2, 2, S); /* two KV heads: one each */
    const double want[8] = {1, 2, 2, 4, 9, 12, 12, 16};
    for (int i = 0; i < 8; i++)
        ck_assert_double_eq_tol(S[i], want[i], 1e-12);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("metric");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, eigen_known_2x2);
    tcase_add_test(tc, eigen_identities);
    tcase_add_test(tc, transform_is_the_metric);
    tcase_add_test(tc, rotation_average_by_hand);
    tcase_add_test(tc, queries_by_hand);
    tcase_add_test(tc, output_metric_by_hand);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
