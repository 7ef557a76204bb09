/* What the engine's studies share: study.h says what. */
#define _POSIX_C_SOURCE 200809L
#include "study.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double st_run_sequence(const char *prog, const lm_model *m, int T, uint64_t seed,
                       const uint8_t *text, int *tokens, st_step_fn on_step, void *u)
{
    const int V = lm_model_config(m)->vocab_size;
    lm_state *st = lm_state_new(m, T);
    if (!st) {
        fprintf(stderr, "%s: lm_state_new failed\n", prog);
        exit(1);
    }
    lm_rng rng;
    lm_rng_seed(&rng, seed);
    double sum = 0;
    tokens[0] = LM_BOS;
    for (int p = 0; p < T; p++) {
        const float *logits = lm_forward(st, tokens[p], p);
        if (!logits) {
            fprintf(stderr, "%s: lm_forward failed\n", prog);
            exit(1);
        }
        if (p + 1 < T) {
            tokens[p + 1] = text ? LM_BYTE0 + text[p] : lm_sample(logits, V, 1.0, &rng);
            sum += lm_nll(logits, V, tokens[p + 1]);
        }
        if (on_step)
            on_step(u, st, p);
    }
    lm_state_free(st);
    return sum;
}

const uint8_t *st_text_seq(const char *prog, const uint8_t *text, size_t off, size_t end, int T,
                           int i, const char *what)
{
    const size_t per = (size_t)T - 1;
    if ((size_t)i >= (end - off) / per) {
        fprintf(stderr,
                "%s: the %s byte range [%zu, %zu) holds %zu sequences of %zu bytes; %d needed\n",
                prog, what, off, end, (end - off) / per, per, i + 1);
        exit(2);
    }
    return text + off + (size_t)i * per;
}

uint8_t *st_read_text(const char *prog, const char *path, size_t *n)
{
    uint8_t *b = lm_read_file(path, n);
    if (!b || *n == 0) {
        fprintf(stderr, "%s: %s: %s\n", prog, path, b ? "empty" : strerror(errno));
        free(b);
        return NULL;
    }
    return b;
}

int st_parse_long(const char *a, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(a, &end, 10);
    if (errno || end == a || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int st_parse_range(const char *v, size_t n, size_t *a, size_t *b)
{
    char *e1, *e2;
    errno = 0;
    unsigned long long x = strtoull(v, &e1, 10);
    if (e1 == v || *e1 != ':' || errno)
        return 1;
    unsigned long long y = strtoull(e1 + 1, &e2, 10);
    if (e2 == e1 + 1 || *e2 || errno || x >= y || y > n)
        return 1;
    *a = (size_t)x;
    *b = (size_t)y;
    return 0;
}
