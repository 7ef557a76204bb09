/* Tests of the example inference engine (examples/engine/model.c):
 * the model README check on the real checkpoint (skipped with a message when
 * ../shared/models/stories260K.bin is absent), the checkpoint loader against
 * truncated and malformed synthetic files, sampling determinism, and the KV
 * cache access API (overwrite, restore, pre-RoPE keys). */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "testutil.h"

static const int readme_ids[64] = {
    461, 461, 401, 401, 401, 461, 378, 455, 473, 456, 435, 299, 362, 409, 283, 264,
    283, 452, 288, 13,  431, 431, 431, 431, 431, 431, 431, 431, 431, 431, 431, 431,
    431, 293, 430, 417, 363, 416, 315, 342, 418, 424, 400, 442, 402, 303, 266, 299,
    374, 466, 396, 303, 271, 362, 390, 469, 306, 469, 423, 314, 347, 305, 356, 333,
};

/* ---- helpers -------------------------------------------------------------------- */

/* The shared model, or NULL (after printing why) when it is absent. */
static lm_model *load_real_model(const char *test)
{
    const char *src = getenv("FKVF_SRCDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/../shared/models/stories260K.bin", src ? src : ".");
    if (access(path, R_OK) != 0) {
        printf("%s: SKIP: %s not found (set FKVF_SRCDIR to the project root)\n", test, path);
        return NULL;
    }
    char err[512];
    lm_model *m = lm_load(path, err, sizeof err);
    ck_assert_msg(m != NULL, "%s", err);
    return m;
}

static void store_i32(unsigned char *p, int32_t v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    p[0] = (unsigned char)u;
    p[1] = (unsigned char)(u >> 8);
    p[2] = (unsigned char)(u >> 16);
    p[3] = (unsigned char)(u >> 24);
}

static void store_f32(unsigned char *p, float f)
{
    int32_t v;
    memcpy(&v, &f, 4);
    store_i32(p, v);
}

/* A tiny model: dim 16, hidden 24, 2 layers, 4 heads, 2 KV heads, vocab 32,
 * seq_len 24 (head size 4). */
static const int32_t tiny_header[7] = {16, 24, 2, 4, 2, 32, 24};

/* A checkpoint with this header and random weights in [-0.5, 0.5). */
static unsigned char *make_checkpoint(const int32_t h[7], uint64_t seed, size_t *size)
{
    uint64_t need = lm_checkpoint_size(h);
    ck_assert_uint_gt(need, 28);
    unsigned char *b = malloc((size_t)need);
    ck_assert_ptr_nonnull(b);
    for (int i = 0; i < 7; i++)
        store_i32(b + 4 * i, h[i]);
    lm_rng r;
    lm_rng_seed(&r, seed);
    for (size_t off = 28; off < need; off += 4)
        store_f32(b + off, (float)(lm_rng_uniform(&r) - 0.5));
    *size = (size_t)need;
    return b;
}

/* Write bytes to a fresh temporary file; returns its malloc'd path. */
static char *write_temp(const void *data, size_t n)
{
    const char *dir = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/test_model_XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(tmpl);
    ck_assert_msg(fd >= 0, "mkstemp %s", tmpl);
    const unsigned char *p = data;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, p + done, n - done);
        ck_assert_int_gt(w, 0);
        done += (size_t)w;
    }
    close(fd);
    char *path = malloc(strlen(tmpl) + 1);
    ck_assert_ptr_nonnull(path);
    strcpy(path, tmpl);
    return path;
}

/* Load `n` bytes both from memory and from a file; both must fail, with an
 * error naming the source and containing `want` (if not NULL). */
static void expect_reject(const unsigned char *data, size_t n, const char *want)
{
    char err[512];
    err[0] = '\0';
    lm_model *m = lm_load_memory(data, n, "mem.bin", err, sizeof err);
    ck_assert_msg(m == NULL, "accepted %zu bytes from memory", n);
    ck_assert_msg(strstr(err, "mem.bin") != NULL, "error does not name the source: %s", err);
    if (want)
        ck_assert_msg(strstr(err, want) != NULL, "error for %zu bytes lacks '%s': %s", n,
                      want, err);
    char *path = write_temp(data, n);
    err[0] = '\0';
    m = lm_load(path, err, sizeof err);
    ck_assert_msg(m == NULL, "accepted %zu bytes from a file", n);
    ck_assert_msg(strstr(err, path) != NULL, "error does not name the file: %s", err);
    if (want)
        ck_assert_msg(strstr(err, want) != NULL, "error lacks '%s': %s", want, err);
    unlink(path);
    free(path);
}

static lm_model *tiny_model(uint64_t seed)
{
    size_t n;
    unsigned char *b = make_checkpoint(tiny_header, seed, &n);
    char err[512];
    lm_model *m = lm_load_memory(b, n, "tiny", err, sizeof err);
    ck_assert_msg(m != NULL, "%s", err);
    free(b);
    return m;
}

/* Sample `n` tokens from BOS at temperature 1 with `seed`; also the sum of the
 * sampled tokens' NLL. */
static double sample_run(const lm_model *m, uint64_t seed, int n, int *out)
{
    const lm_config *c = lm_model_config(m);
    lm_state *s = lm_state_new(m, n);
    ck_assert_ptr_nonnull(s);
    lm_rng r;
    lm_rng_seed(&r, seed);
    int tok = LM_BOS;
    double nll = 0.0;
    for (int p = 0; p < n; p++) {
        const float *lg = lm_forward(s, tok, p);
        ck_assert_ptr_nonnull(lg);
        tok = lm_sample(lg, c->vocab_size, 1.0, &r);
        nll += lm_nll(lg, c->vocab_size, tok);
        out[p] = tok;
    }
    lm_state_free(s);
    return nll;
}

/* ---- (a) the README check ------------------------------------------------------ */

START_TEST(readme_greedy_ids_and_nll)
{
    lm_model *m = load_real_model("readme_greedy_ids_and_nll");
    if (!m)
        return;
    const lm_config *c = lm_model_config(m);
    ck_assert_int_eq(c->dim, 64);
    ck_assert_int_eq(c->hidden_dim, 172);
    ck_assert_int_eq(c->n_layers, 5);
    ck_assert_int_eq(c->n_heads, 8);
    ck_assert_int_eq(c->n_kv_heads, 4);
    ck_assert_int_eq(c->vocab_size, 512);
    ck_assert_int_eq(c->seq_len, 512);
    ck_assert_int_eq(c->head_size, 8);
    ck_assert_int_eq(c->kv_dim, 32);
    ck_assert_int_eq(c->shared_classifier, 1);
    lm_state *s = lm_state_new(m, 0);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(lm_state_capacity(s), 512);
    int tok = LM_BOS;
    double total = 0.0;
    for (int p = 0; p < 65; p++) {
        const float *lg = lm_forward(s, tok, p);
        ck_assert_ptr_nonnull(lg);
        tok = lm_argmax(lg, c->vocab_size);
        total += lm_nll(lg, c->vocab_size, tok);
        if (p < 64)
            ck_assert_msg(tok == readme_ids[p], "greedy id %d: got %d, README %d", p, tok,
                          readme_ids[p]);
    }
    double mean = total / 65.0;
    printf("readme_greedy_ids_and_nll: 64 ids match, mean NLL %.6f\n", mean);
    ck_assert_msg(fabs(mean - 0.8781) < 5e-5, "mean NLL %.6f, README 0.8781", mean);
    lm_state_free(s);
    lm_free(m);
}
END_TEST

/* ---- (b) the loader ------------------------------------------------------------ */

START_TEST(loader_accepts_synthetic)
{
    size_t n;
    unsigned char *b = make_checkpoint(tiny_header, 7, &n);
    /* 28 + 4 * (emb 32*16 + rms 2*16 + wq 2*256 + wk,wv 2*2*8*16 + wo 2*256 + rms 2*16
     *          + w1,w2,w3 3*2*24*16 + final 16 + rope 2*24*2) */
    ck_assert_uint_eq(n, 28 + 4 * (512 + 32 + 512 + 512 + 512 + 32 + 2304 + 16 + 96));
    char *path = write_temp(b, n);
    char err[512];
    lm_model *m = lm_load(path, err, sizeof err);
    ck_assert_msg(m != NULL, "%s", err);
    const lm_config *c = lm_model_config(m);
    ck_assert_int_eq(c->dim, 16);
    ck_assert_int_eq(c->hidden_dim, 24);
    ck_assert_int_eq(c->n_layers, 2);
    ck_assert_int_eq(c->n_heads, 4);
    ck_assert_int_eq(c->n_kv_heads, 2);
    ck_assert_int_eq(c->vocab_size, 32);
    ck_assert_int_eq(c->seq_len, 24);
    ck_assert_int_eq(c->head_size, 4);
    ck_assert_int_eq(c->kv_dim, 8);
    ck_assert_int_eq(c->shared_classifier, 1);
    /* File and memory loads give the same model. */
    lm_model *m2 = lm_load_memory(b, n, "tiny", err, sizeof err);
    ck_assert_msg(m2 != NULL, "%s", err);
    lm_state *s1 = lm_state_new(m, 0), *s2 = lm_state_new(m2, 0);
    const float *l1 = lm_forward(s1, 3, 0), *l2 = lm_forward(s2, 3, 0);
    ck_assert_ptr_nonnull(l1);
    ck_assert_ptr_nonnull(l2);
    ck_assert(memcmp(l1, l2, 32 * sizeof(float)) == 0);
    lm_state_free(s1);
    lm_state_free(s2);
    lm_free(m);
    lm_free(m2);
    unlink(path);
    free(path);
    free(b);
}
END_TEST

/* A negative vocab_size means a separate classifier after the RoPE tables;
 * one equal to the embedding gives the same logits as the shared model. */
START_TEST(loader_unshared_classifier)
{
    size_t n;
    unsigned char *b = make_checkpoint(tiny_header, 9, &n);
    size_t emb = 32 * 16 * 4;
    unsigned char *u = malloc(n + emb);
    ck_assert_ptr_nonnull(u);
    memcpy(u, b, n);
    memcpy(u + n, b + 28, emb);
    store_i32(u + 20, -32);
    int32_t hu[7];
    memcpy(hu, tiny_header, sizeof hu);
    hu[5] = -32;
    ck_assert_uint_eq(lm_checkpoint_size(hu), n + emb);
    char err[512];
    lm_model *ms = lm_load_memory(b, n, "shared", err, sizeof err);
    ck_assert_msg(ms != NULL, "%s", err);
    lm_model *mu = lm_load_memory(u, n + emb, "unshared", err, sizeof err);
    ck_assert_msg(mu != NULL, "%s", err);
    ck_assert_int_eq(lm_model_config(mu)->shared_classifier, 0);
    ck_assert_int_eq(lm_model_config(mu)->vocab_size, 32);
    lm_state *a = lm_state_new(ms, 0), *bs = lm_state_new(mu, 0);
    for (int p = 0; p < 5; p++) {
        const float *la = lm_forward(a, 2 + p, p), *lb = lm_forward(bs, 2 + p, p);
        ck_assert(memcmp(la, lb, 32 * sizeof(float)) == 0);
    }
    /* A different classifier changes the logits. */
    store_f32(u + n, 3.0f);
    lm_model *mv = lm_load_memory(u, n + emb, "unshared2", err, sizeof err);
    ck_assert_msg(mv != NULL, "%s", err);
    lm_state *v = lm_state_new(mv, 0);
    const float *l0 = lm_forward(v, 2, 0);
    const float *la = lm_forward(a, 2, 0);
    ck_assert(memcmp(l0, la, 32 * sizeof(float)) != 0);
    lm_state_free(a);
    lm_state_free(bs);
    lm_state_free(v);
    lm_free(ms);
    lm_free(mu);
    lm_free(mv);
    free(u);
    free(b);
}
END_TEST

START_TEST(loader_rejects_every_header_truncation)
{
    size_t n;
    unsigned char *b = make_checkpoint(tiny_header, 1, &n);
    static const char *const fields[7] = {"dim", "hidden_dim", "n_layers", "n_heads",
                                          "n_kv_heads", "vocab_size", "seq_len"};
    for (size_t len = 0; len < 28; len++)
        expect_reject(b, len, fields[len / 4]);
    /* a NULL pointer with size 0 is also just "truncated" */
    char err[256];
    ck_assert_ptr_null(lm_load_memory(NULL, 0, "empty", err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "truncated"));
    free(b);
}
END_TEST

START_TEST(loader_rejects_weight_truncations_and_trailing_bytes)
{
    size_t n;
    unsigned char *b = make_checkpoint(tiny_header, 2, &n);
    /* the first float, part of it, inside later arrays, the last bytes */
    size_t lens[] = {28, 29, 31, 32, 28 + 4 * 512, 28 + 4 * 600, 28 + 4 * 1500,
                     28 + 4 * 2500, n - 4 * 96, n - 5, n - 4, n - 1};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
        expect_reject(b, lens[i], "truncated");
    expect_reject(b, 28 + 4 * 600, "wq");
    expect_reject(b, 30, "token embedding");
    expect_reject(b, n - 1, "rope table (imag)");
    unsigned char *big = calloc(1, n + 4);
    ck_assert_ptr_nonnull(big);
    memcpy(big, b, n);
    expect_reject(big, n + 1, "trailing");
    expect_reject(big, n + 4, "trailing");
    free(big);
    free(b);
}
END_TEST

START_TEST(loader_rejects_bad_header_values)
{
    static const struct {
        int field;
        int32_t value;
        const char *want;
    } cases[] = {
        {0, 0, "dim"},               {0, -16, "dim"},
        {1, 0, "hidden_dim"},        {1, -1, "hidden_dim"},
        {2, 0, "n_layers"},          {2, -2, "n_layers"},
        {3, 0, "n_heads"},           {3, -4, "n_heads"},
        {4, 0, "n_kv_heads"},        {4, -2, "n_kv_heads"},
        {5, 0, "vocab_size"},        {5, INT32_MIN, "vocab_size"},
        {6, 0, "seq_len"},           {6, -24, "seq_len"},
        {3, 3, "does not divide"},   /* n_heads 3 does not divide dim 16 */
        {3, 5, "n_heads"},
        {4, 3, "does not divide"},   /* n_kv_heads 3 does not divide n_heads 4 */
        {4, 8, "n_kv_heads"},        /* more KV heads than heads */
        {3, 16, "odd"},              /* head size 1 */
        {0, 1 << 30, "limit"},       {1, INT32_MAX, "limit"},
        {2, 1 << 20, "limit"},       {5, 1 << 30, "limit"},
        {5, -(1 << 30), "limit"},    {6, INT32_MAX, "limit"},
    };
    size_t n;
    unsigned char *b = make_checkpoint(tiny_header, 3, &n);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char *c = malloc(n);
        ck_assert_ptr_nonnull(c);
        memcpy(c, b, n);
        store_i32(c + 4 * cases[i].field, cases[i].value);
        expect_reject(c, n, cases[i].want);
        /* also with only the header present */
        expect_reject(c, 28, NULL);
        int32_t h[7];
        memcpy(h, tiny_header, sizeof h);
        h[cases[i].field] = cases[i].value;
        ck_assert_uint_eq(lm_checkpoint_size(h), 0);
        free(c);
    }
    /* Within every limit but enormous: rejected by the size check, before any
     * allocation of that size. */
    int32_t huge[7] = {LM_MAX_DIM, LM_MAX_HIDDEN, LM_MAX_LAYERS, 2, 1, LM_MAX_VOCAB,
                       LM_MAX_SEQ_LEN};
    uint64_t need = lm_checkpoint_size(huge);
    ck_assert_uint_gt(need, (uint64_t)1 << 40);
    unsigned char hb[64];
    memset(hb, 0, sizeof hb);
    for (int i = 0; i < 7; i++)
        store_i32(hb + 4 * i, huge[i]);
    expect_reject(hb, sizeof hb, "truncated");
    free(b);
}
END_TEST

START_TEST(loader_rejects_nonfinite_weights_and_missing_file)
{
    size_t n;
    unsigned char *b = make_checkpoint(tiny_header, 4, &n);
    store_f32(b + 28 + 4 * (512 + 32 + 512 + 10), NAN); /* inside wk */
    expect_reject(b, n, "wk");
    store_f32(b + 28 + 4 * (512 + 32 + 512 + 10), 0.5f);
    store_f32(b + n - 8, INFINITY); /* inside the second RoPE table */
    expect_reject(b, n, "not finite");
    free(b);
    char err[512];
    ck_assert_ptr_null(lm_load("/nonexistent/dir/model.bin", err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/dir/model.bin"));
    ck_assert_ptr_null(lm_load(NULL, err, sizeof err));
    ck_assert_ptr_null(lm_load("/nonexistent", NULL, 0)); /* no error buffer: fine */
}
END_TEST

/* ---- (c) determinism ------------------------------------------------------------ */

START_TEST(sampling_is_deterministic)
{
    lm_model *m = tiny_model(11);
    int a[24], b[24], c[24];
    double na = sample_run(m, 42, 24, a);
    double nb = sample_run(m, 42, 24, b);
    double nc = sample_run(m, 43, 24, c);
    ck_assert(memcmp(a, b, sizeof a) == 0);
    ck_assert(na == nb);
    ck_assert_msg(memcmp(a, c, sizeof a) != 0, "seeds 42 and 43 sampled the same tokens");
    (void)nc;
    lm_free(m);

    m = load_real_model("sampling_is_deterministic");
    if (!m)
        return;
    int ra[64], rb[64], rc[64];
    double ta = sample_run(m, 7, 64, ra), tb = sample_run(m, 7, 64, rb);
    sample_run(m, 8, 64, rc);
    ck_assert(memcmp(ra, rb, sizeof ra) == 0);
    ck_assert(ta == tb);
    ck_assert(memcmp(ra, rc, sizeof ra) != 0);
    ck_assert_msg(ta / 64 > 0.5 && ta / 64 < 6.0, "mean sampled NLL %.3f", ta / 64);
    lm_free(m);
}
END_TEST

START_TEST(rng_and_decoding_helpers)
{
    lm_rng r1, r2;
    lm_rng_seed(&r1, 123);
    lm_rng_seed(&r2, 123);
    for (int i = 0; i < 100; i++) {
        uint64_t x = lm_rng_next(&r1);
        ck_assert_uint_eq(x, lm_rng_next(&r2));
        double u = lm_rng_uniform(&r1);
        lm_rng_next(&r2);
        ck_assert(u >= 0.0 && u < 1.0);
    }
    float lg[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, -30.0f};
    ck_assert_int_eq(lm_argmax(lg, 6), 1); /* first of the tie */
    ck_assert_int_eq(lm_sample(lg, 6, 0.0, &r1), 1);
    double ls[6], sum = 0.0;
    lm_log_softmax(lg, 6, ls);
    for (int i = 0; i < 6; i++) {
        sum += exp(ls[i]);
        ck_assert(fabs(ls[i] - lm_logprob(lg, 6, i)) < 1e-15);
        ck_assert(lm_nll(lg, 6, i) == -lm_logprob(lg, 6, i));
    }
    ck_assert(fabs(sum - 1.0) < 1e-12);
    /* Frequencies follow softmax(logits / T). */
    const double temps[2] = {1.0, 0.5};
    for (int t = 0; t < 2; t++) {
        long cnt[6] = {0};
        lm_rng r;
        lm_rng_seed(&r, 99);
        const int N = 200000;
        for (int i = 0; i < N; i++)
            cnt[lm_sample(lg, 6, temps[t], &r)]++;
        double z = 0.0;
        for (int i = 0; i < 6; i++)
            z += exp(lg[i] / temps[t]);
        for (int i = 0; i < 6; i++) {
            double p = exp(lg[i] / temps[t]) / z;
            double sd = sqrt(p * (1 - p) / N);
            ck_assert_msg(fabs((double)cnt[i] / N - p) <= 5 * sd + 1e-9,
                          "T %g token %d: %.5f vs %.5f", temps[t], i, (double)cnt[i] / N, p);
        }
    }
}
END_TEST

/* ---- (d) cache access -------------------------------------------------------------- */

START_TEST(forward_and_cache_reject_bad_arguments)
{
    lm_model *m = tiny_model(12);
    ck_assert_ptr_null(lm_state_new(m, 25)); /* beyond seq_len 24 */
    ck_assert_ptr_null(lm_state_new(m, -1));
    ck_assert_ptr_null(lm_state_new(NULL, 0));
    lm_state *s = lm_state_new(m, 8);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(lm_cache_length(s), 0);
    ck_assert_ptr_null(lm_forward(s, 1, 1));  /* position 0 not there yet */
    ck_assert_ptr_null(lm_forward(s, -1, 0));
    ck_assert_ptr_null(lm_forward(s, 32, 0)); /* vocab 32 */
    ck_assert_ptr_nonnull(lm_forward(s, 1, 0));
    ck_assert_int_eq(lm_cache_length(s), 1);
    ck_assert_ptr_null(lm_forward(s, 1, 8)); /* capacity 8 */
    float row[8];
    ck_assert_int_eq(lm_cache_get(s, 2, 0, LM_KEY, row), -1); /* 2 layers */
    ck_assert_int_eq(lm_cache_get(s, -1, 0, LM_KEY, row), -1);
    ck_assert_int_eq(lm_cache_get(s, 0, 8, LM_KEY, row), -1);
    ck_assert_int_eq(lm_cache_get(s, 0, 0, 3, row), -1);
    ck_assert_int_eq(lm_cache_set(s, 0, -1, LM_VALUE, row), -1);
    ck_assert_int_eq(lm_cache_set_length(s, 9), -1);
    ck_assert_int_eq(lm_cache_set_length(s, -1), -1);
    ck_assert_ptr_null(lm_cache_data(s, 0, 7));
    ck_assert_int_eq(lm_cache_set_length(s, 8), 0);
    ck_assert_ptr_nonnull(lm_forward(s, 1, 7));
    ck_assert_int_eq(lm_cache_set_length(s, 0), 0);
    ck_assert_ptr_null(lm_forward(s, 1, 1));
    lm_state_free(s);
    lm_free(m);
}
END_TEST

/* Run tokens[0..n-1] on a fresh state with the given capacity. */
static lm_state *run_prefix(const lm_model *m, const int *tokens, int n, int cap)
{
    lm_state *s = lm_state_new(m, cap);
    ck_assert_ptr_nonnull(s);
    for (int p = 0; p < n; p++)
        ck_assert_ptr_nonnull(lm_forward(s, tokens[p], p));
    return s;
}

static void check_overwrite_and_restore(const lm_model *m, int n)
{
    const lm_config *c = lm_model_config(m);
    const int V = c->vocab_size, kvd = c->kv_dim;
    int *tokens = malloc((size_t)(n + 1) * sizeof(int));
    ck_assert_ptr_nonnull(tokens);
    sample_run(m, 5, n + 1, tokens);
    tokens[0] = LM_BOS;
    float *row = malloc((size_t)kvd * sizeof(float));
    float *ref = malloc((size_t)V * sizeof(float));
    ck_assert(row && ref);

    /* Reference: positions 0..n-1, then the logits at n. */
    lm_state *a = run_prefix(m, tokens, n, n + 1);
    memcpy(ref, lm_forward(a, tokens[n], n), (size_t)V * sizeof(float));

    /* Overwriting every row of a few positions with what they hold (through
     * each write path) leaves the next logits bit-identical. */
    const int kinds_sets[3][2] = {{LM_KEY, LM_VALUE}, {LM_KEY_PREROPE, LM_VALUE},
                                  {LM_VALUE, LM_VALUE}};
    const int positions[3] = {0, n / 2, n - 1};
    for (int ks = 0; ks < 3; ks++) {
        lm_state *b = run_prefix(m, tokens, n, n + 1);
        for (int pi = 0; pi < 3; pi++)
            for (int l = 0; l < c->n_layers; l++)
                for (int k = 0; k < 2; k++) {
                    int kind = kinds_sets[ks][k];
                    ck_assert_int_eq(lm_cache_get(b, l, positions[pi], kind, row), 0);
                    ck_assert_int_eq(lm_cache_set(b, l, positions[pi], kind, row), 0);
                }
        ck_assert_int_eq(lm_cache_length(b), n);
        const float *lg = lm_forward(b, tokens[n], n);
        ck_assert_msg(memcmp(lg, ref, (size_t)V * sizeof(float)) == 0,
                      "overwrite path %d changed the logits", ks);
        lm_state_free(b);
    }

    /* Restore into a fresh state from pre-RoPE keys and values: bit-identical
     * cache and logits. */
    lm_state *r = lm_state_new(m, n + 1);
    ck_assert_ptr_nonnull(r);
    lm_state *src = run_prefix(m, tokens, n, n + 1);
    for (int p = 0; p < n; p++)
        for (int l = 0; l < c->n_layers; l++) {
            ck_assert_int_eq(lm_cache_get(src, l, p, LM_KEY_PREROPE, row), 0);
            ck_assert_int_eq(lm_cache_set(r, l, p, LM_KEY_PREROPE, row), 0);
            ck_assert_int_eq(lm_cache_get(src, l, p, LM_VALUE, row), 0);
            ck_assert_int_eq(lm_cache_set(r, l, p, LM_VALUE, row), 0);
        }
    size_t per_layer = (size_t)c->n_kv_heads * (size_t)(n + 1) * (size_t)c->head_size;
    for (int l = 0; l < c->n_layers; l++)
        for (int kind = 0; kind < 3; kind++)
            ck_assert_msg(memcmp(lm_cache_data(r, l, kind), lm_cache_data(src, l, kind),
                                 per_layer * sizeof(float)) == 0,
                          "restored layer %d kind %d differs", l, kind);
    ck_assert_int_eq(lm_cache_set_length(r, n), 0);
    const float *lg = lm_forward(r, tokens[n], n);
    ck_assert(memcmp(lg, ref, (size_t)V * sizeof(float)) == 0);

    /* Writing a different value row does change the next logits. */
    lm_state *d = run_prefix(m, tokens, n, n + 1);
    ck_assert_int_eq(lm_cache_get(d, 0, n - 1, LM_VALUE, row), 0);
    row[0] += 1.0f;
    ck_assert_int_eq(lm_cache_set(d, 0, n - 1, LM_VALUE, row), 0);
    ck_assert(memcmp(lm_forward(d, tokens[n], n), ref, (size_t)V * sizeof(float)) != 0);

    lm_state_free(a);
    lm_state_free(r);
    lm_state_free(src);
    lm_state_free(d);
    free(row);
    free(ref);
    free(tokens);
}

START_TEST(cache_overwrite_and_restore_are_bit_identical)
{
    lm_model *m = tiny_model(13);
    check_overwrite_and_restore(m, 20);
    lm_free(m);
    m = load_real_model("cache_overwrite_and_restore_are_bit_identical");
    if (!m)
        return;
    check_overwrite_and_restore(m, 40);
    lm_free(m);
}
END_TEST

/* The pre-RoPE key rotated by the README's RoPE (computed here in double)
 * equals the cached key; lm_rope and its inverse agree with that. */
static void check_prerope(const lm_model *m, int n)
{
    const lm_config *c = lm_model_config(m);
    const int hs = c->head_size, kvd = c->kv_dim;
    int *tokens = malloc((size_t)n * sizeof(int));
    ck_assert_ptr_nonnull(tokens);
    sample_run(m, 17, n, tokens);
    tokens[0] = LM_BOS;
    lm_state *s = run_prefix(m, tokens, n, n);
    float *raw = malloc((size_t)kvd * sizeof(float)), *key = malloc((size_t)kvd * sizeof(float));
    float *tmp = malloc((size_t)kvd * sizeof(float));
    ck_assert(raw && key && tmp);
    double worst = 0.0;
    for (int l = 0; l < c->n_layers; l++)
        for (int p = 0; p < n; p++) {
            ck_assert_int_eq(lm_cache_get(s, l, p, LM_KEY_PREROPE, raw), 0);
            ck_assert_int_eq(lm_cache_get(s, l, p, LM_KEY, key), 0);
            for (int g = 0; g < c->n_kv_heads; g++)
                for (int i = 0; i < hs; i += 2) {
                    double f = 1.0 / pow(10000.0, (double)i / hs);
                    double ang = p * f;
                    double a = raw[g * hs + i], b = raw[g * hs + i + 1];
                    double ra = a * cos(ang) - b * sin(ang), rb = a * sin(ang) + b * cos(ang);
                    double e0 = fabs(ra - key[g * hs + i]) / fmax(1.0, fabs(ra));
                    double e1 = fabs(rb - key[g * hs + i + 1]) / fmax(1.0, fabs(rb));
                    worst = fmax(worst, fmax(e0, e1));
                }
            /* lm_rope forward reproduces the cache bit for bit ... */
            memcpy(tmp, raw, (size_t)kvd * sizeof(float));
            lm_rope(tmp, c->n_kv_heads, hs, p, 0);
            ck_assert(memcmp(tmp, key, (size_t)kvd * sizeof(float)) == 0);
            /* ... and the inverse gets back close to the raw key. */
            lm_rope(tmp, c->n_kv_heads, hs, p, 1);
            for (int i = 0; i < kvd; i++)
                ck_assert(fabs(tmp[i] - raw[i]) <= 1e-5 * fmax(1.0, fabs(raw[i])));
        }
    ck_assert_msg(worst < 1e-5, "pre-RoPE key rotated differs from cached key by %g", worst);
    /* At position 0 the rotation is the identity. */
    for (int l = 0; l < c->n_layers; l++) {
        ck_assert_int_eq(lm_cache_get(s, l, 0, LM_KEY_PREROPE, raw), 0);
        ck_assert_int_eq(lm_cache_get(s, l, 0, LM_KEY, key), 0);
        ck_assert(memcmp(raw, key, (size_t)kvd * sizeof(float)) == 0);
    }
    lm_state_free(s);
    free(raw);
    free(key);
    free(tmp);
    free(tokens);
}

START_TEST(prerope_keys_rotate_to_cached_keys)
{
    lm_model *m = tiny_model(14);
    check_prerope(m, 24);
    lm_free(m);
    m = load_real_model("prerope_keys_rotate_to_cached_keys");
    if (!m)
        return;
    check_prerope(m, 128);
    lm_free(m);
}
END_TEST

/* lm_forward_hooked (the studies' attention hooks). */
typedef struct hook_log {
    int hide;          /* the position select hides (-1: none) */
    int calls, bad;    /* select calls; attended calls whose weights are wrong */
    int n_heads;
} hook_log;

static void hide_one(void *u, const lm_state *s, int layer, int head, const float *q, int pos,
                     unsigned char *visible)
{
    hook_log *h = u;
    (void)s;
    (void)layer;
    (void)head;
    (void)q;
    h->calls++;
    for (int t = 0; t <= pos; t++)
        if (visible[t] != 1) /* every position starts visible */
            h->bad++;
    if (h->hide >= 0 && h->hide <= pos)
        visible[h->hide] = 0;
}

static void check_weights(void *u, int layer, int head, int pos, const float *att, float sum)
{
    hook_log *h = u;
    (void)layer;
    (void)head;
    double tot = 0;
    for (int t = 0; t <= pos; t++) {
        if (t == h->hide && t != pos && att[t] != 0.0f)
            h->bad++; /* a hidden position got weight */
        tot += att[t] / sum;
    }
    if (fabs(tot - 1.0) > 1e-5)
        h->bad++;
}

/* Leaving every position visible gives lm_forward's logits bit for bit;
 * hiding position p makes the logits independent of p's cached row (a
 * state whose row p is overwritten with other values gives the same
 * logits bit for bit) while without hiding that row changes them; every
 * (layer, head) is hooked once a step; hidden positions get weight 0 and the
 * weights sum to 1; pos itself cannot be hidden. */
START_TEST(forward_hooks_select_and_attend)
{
    lm_model *m = tiny_model(21);
    const lm_config *c = lm_model_config(m);
    const int n = 12, hide = 3;
    int tokens[12];
    sample_run(m, 5, n, tokens);
    tokens[0] = LM_BOS;
    lm_state *a = lm_state_new(m, 0), *b = lm_state_new(m, 0), *d = lm_state_new(m, 0);
    lm_state *e = lm_state_new(m, 0);
    ck_assert(a && b && d && e);
    hook_log all = {-1, 0, 0, c->n_heads}, hid = {hide, 0, 0, c->n_heads};
    const lm_hooks h_all = {hide_one, check_weights, &all}, h_hid = {hide_one, check_weights, &hid};
    float *junk = malloc((size_t)c->kv_dim * sizeof(float));
    ck_assert_ptr_nonnull(junk);
    for (int i = 0; i < c->kv_dim; i++)
        junk[i] = 0.37f * (float)(i % 5) - 0.6f;
    int differs = 0;
    for (int p = 0; p < n; p++) {
        const float *l0 = lm_forward(a, tokens[p], p);
        const float *l1 = lm_forward_hooked(b, tokens[p], p, &h_all);
        ck_assert(memcmp(l0, l1, (size_t)c->vocab_size * sizeof(float)) == 0);
        const float *l2 = lm_forward_hooked(d, tokens[p], p, &h_hid);
        const float *l3 = lm_forward_hooked(e, tokens[p], p, &h_hid);
        ck_assert(memcmp(l2, l3, (size_t)c->vocab_size * sizeof(float)) == 0);
        if (p > hide && memcmp(l0, l2, (size_t)c->vocab_size * sizeof(float)) != 0)
            differs = 1;
        if (p == hide) /* state e's row p becomes junk in every layer */
            for (int l = 0; l < c->n_layers; l++) {
                ck_assert_int_eq(lm_cache_set(e, l, p, LM_KEY, junk), 0);
                ck_assert_int_eq(lm_cache_set(e, l, p, LM_VALUE, junk), 0);
            }
    }
    ck_assert_msg(differs, "hiding a position changed no logits");
    /* the junk row, seen, changes the logits (of the last step) */
    lm_state *f = lm_state_new(m, 0);
    ck_assert_ptr_nonnull(f);
    for (int p = 0; p < n; p++) {
        ck_assert_ptr_nonnull(lm_forward(f, tokens[p], p));
        if (p == hide)
            for (int l = 0; l < c->n_layers; l++) {
                ck_assert_int_eq(lm_cache_set(f, l, p, LM_KEY, junk), 0);
                ck_assert_int_eq(lm_cache_set(f, l, p, LM_VALUE, junk), 0);
            }
    }
    ck_assert_msg(memcmp(lm_logits(a), lm_logits(f), (size_t)c->vocab_size * sizeof(float)) != 0,
                  "the replaced row changed nothing: the test shows nothing");
    ck_assert_int_eq(all.calls, n * c->n_layers * c->n_heads);
    ck_assert_int_eq(hid.calls, 2 * n * c->n_layers * c->n_heads);
    ck_assert_int_eq(all.bad, 0);
    ck_assert_int_eq(hid.bad, 0);
    /* the current position cannot be hidden: hiding pos 0 at step 0 still runs */
    hook_log self = {0, 0, 0, c->n_heads};
    const lm_hooks h_self = {hide_one, check_weights, &self};
    lm_state *g = lm_state_new(m, 0);
    ck_assert_ptr_nonnull(g);
    const float *lg = lm_forward_hooked(g, tokens[0], 0, &h_self);
    ck_assert_ptr_nonnull(lg);
    ck_assert(memcmp(lg, lm_forward(f, tokens[0], 0), (size_t)c->vocab_size * sizeof(float)) == 0);
    ck_assert_int_eq(self.bad, 0);
    lm_state_free(g);
    lm_state_free(f);
    free(junk);
    lm_state_free(a);
    lm_state_free(b);
    lm_state_free(d);
    lm_state_free(e);
    lm_free(m);
}
END_TEST

static Suite *model_suite(void)
{
    Suite *s = suite_create("model");
    TCase *t = tcase_create("readme");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, readme_greedy_ids_and_nll);
    suite_add_tcase(s, t);
    t = tcase_create("loader");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, loader_accepts_synthetic);
    tcase_add_test(t, loader_unshared_classifier);
    tcase_add_test(t, loader_rejects_every_header_truncation);
    tcase_add_test(t, loader_rejects_weight_truncations_and_trailing_bytes);
    tcase_add_test(t, loader_rejects_bad_header_values);
    tcase_add_test(t, loader_rejects_nonfinite_weights_and_missing_file);
    suite_add_tcase(s, t);
    t = tcase_create("decode");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, sampling_is_deterministic);
    tcase_add_test(t, rng_and_decoding_helpers);
    suite_add_tcase(s, t);
    t = tcase_create("cache");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, forward_and_cache_reject_bad_arguments);
    tcase_add_test(t, cache_overwrite_and_restore_are_bit_identical);
    tcase_add_test(t, prerope_keys_rotate_to_cached_keys);
    tcase_add_test(t, forward_hooks_select_and_attend);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return tu_run_suite(model_suite());
}
