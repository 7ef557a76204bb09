/* A tiny Llama-architecture inference engine core (prefix lm_).
 *
 * Written from ../shared/models/README.md: it loads a llama2.c "legacy"
 * checkpoint (seven int32 header fields, then float32 weight arrays) and runs
 * the forward pass one token at a time, keeping the KV cache in float arrays.
 *
 * Objects:
 *   lm_model  the weights, immutable once loaded; any number of states may
 *             share one model.
 *   lm_state  one sequence: the KV cache, scratch buffers and the logits.
 *
 * KV cache layout, per layer and per kind (lm_cache_data):
 *   float [n_kv_heads][capacity][head_size]
 * i.e. row (kv head g, position p) starts at (g * capacity + p) * head_size.
 * Three kinds are kept:
 *   LM_KEY          keys after RoPE, exactly what attention reads;
 *   LM_KEY_PREROPE  the same keys before RoPE (the raw wk . xb);
 *   LM_VALUE        values.
 * Positions 0 .. lm_cache_length()-1 are valid.
 *
 * Single-threaded; no global state. Functions returning int give 0 on success
 * and -1 on a bad argument (out-of-range layer, position, kind or length).
 */
#ifndef LM_MODEL_H
#define LM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LM_BOS 1               /* beginning-of-sequence token id */
#define LM_BYTE0 3             /* the id of byte 0: byte b is id LM_BYTE0 + b */
#define LM_ROPE_THETA 10000.0  /* RoPE base: f = 1 / theta^(i / head_size) */
#define LM_RMS_EPS 1e-5f       /* RMSNorm epsilon */

/* Loader limits (a header beyond these is rejected as absurd). */
#define LM_MAX_DIM 65536
#define LM_MAX_HIDDEN 262144
#define LM_MAX_LAYERS 1024
#define LM_MAX_VOCAB (1 << 22)
#define LM_MAX_SEQ_LEN (1 << 20)

typedef struct lm_config {
    int dim;        /* model width */
    int hidden_dim; /* FFN width */
    int n_layers;
    int n_heads;    /* query heads */
    int n_kv_heads; /* key/value heads (grouped-query attention) */
    int vocab_size; /* always positive here; see shared_classifier */
    int seq_len;    /* trained context length; also the maximum cache capacity */
    int head_size;  /* dim / n_heads (even: RoPE rotates pairs) */
    int kv_dim;     /* n_kv_heads * head_size */
    int shared_classifier; /* 1: logits use the embedding matrix (header vocab > 0);
                              0: a separate classifier follows the RoPE tables */
} lm_config;

typedef struct lm_model lm_model;
typedef struct lm_state lm_state;

enum lm_kind { LM_KEY = 0, LM_KEY_PREROPE = 1, LM_VALUE = 2 };

/* ---- loading -------------------------------------------------------------- */

/* Load a checkpoint file. Every header field is validated (positive, within
 * the LM_MAX_* limits, n_heads divides dim, n_kv_heads divides n_heads, even
 * head size), the layout size is computed with overflow checks and must equal
 * the file length exactly, and every weight must be finite. On failure returns
 * NULL and writes a message naming the file and the field into err (if
 * errlen > 0). */
lm_model *lm_load(const char *path, char *err, size_t errlen);

/* The same from bytes in memory; `name` is used in error messages. */
lm_model *lm_load_memory(const void *data, size_t size, const char *name, char *err,
                         size_t errlen);

void lm_free(lm_model *m);

/* The whole of the file at path in a malloc'd buffer of *n bytes (an empty
 * file: a buffer all the same, *n = 0), or NULL with errno set (ENOMEM, or
 * fopen's / fread's). The caller frees it. */
unsigned char *lm_read_file(const char *path, size_t *n);
const lm_config *lm_model_config(const lm_model *m);

/* Size in bytes of a checkpoint with this header (the seven int32 fields as
 * stored, vocab_size negative meaning an unshared classifier), or 0 if the
 * header is invalid. */
uint64_t lm_checkpoint_size(const int32_t header[7]);

/* Layer l's attention output projection wo: dim x dim floats, row-major
 * (out x in; query head h's input columns are h * head_size ..). NULL on a
 * bad layer. Owned by the model. */
const float *lm_wo(const lm_model *m, int layer);

/* ---- state and forward pass ----------------------------------------------- */

/* A new state with room for `capacity` positions (0 means seq_len; at most
 * seq_len). The cache starts empty and zero-filled. NULL on bad capacity or
 * out of memory. */
lm_state *lm_state_new(const lm_model *m, int capacity);
void lm_state_free(lm_state *s);
const lm_model *lm_state_model(const lm_state *s);
int lm_state_capacity(const lm_state *s);

/* Run `token` at position `pos`: computes q, k, v for every layer, stores k
 * (post-RoPE and pre-RoPE) and v at pos, attends over positions 0..pos, and
 * returns the logits (vocab_size floats, owned by the state, valid until the
 * next call). Requires 0 <= token < vocab_size and 0 <= pos <= cache length,
 * pos < capacity; afterwards the cache length is pos + 1 (a later suffix, if
 * any, is discarded). NULL on a bad argument. */
const float *lm_forward(lm_state *s, int token, int pos);

/* Hooks into lm_forward_hooked's attention, for studies of what attention
 * reads. For every layer and query head, after the step's keys and values
 * are cached:
 *   select    (may be NULL) is given the head's query after RoPE (head_size
 *             floats) and visible[0..pos], all 1; it clears the positions
 *             attention must not see (the softmax then runs over the others;
 *             pos itself always stays visible). The state's cache holds this
 *             layer's rows 0..pos and the earlier layers' of this step.
 *   attended  (may be NULL) is given the head's attention: att[t] / sum is
 *             the weight of position t (0 where hidden), t = 0..pos.
 * u is passed to both. */
typedef struct lm_hooks {
    void (*select)(void *u, const lm_state *s, int layer, int head, const float *q, int pos,
                   unsigned char *visible);
    void (*attended)(void *u, int layer, int head, int pos, const float *att, float sum);
    void *u;
} lm_hooks;

/* lm_forward with hooks (NULL: exactly lm_forward; with every position left
 * visible the logits are bit-identical to lm_forward's). */
const float *lm_forward_hooked(lm_state *s, int token, int pos, const lm_hooks *hooks);

/* The logits of the last lm_forward call (zeros before the first). */
const float *lm_logits(const lm_state *s);

/* The queries of the last lm_forward call after RoPE, exactly what attention
 * used: n_layers * dim floats, layer l at l * dim, laid out
 * [n_heads][head_size] (zeros before the first call). */
const float *lm_queries(const lm_state *s);

/* ---- KV cache access ------------------------------------------------------- */

int lm_cache_length(const lm_state *s);
/* Declare positions 0..n-1 valid (0 <= n <= capacity), e.g. after restoring
 * rows with lm_cache_set. Rows never written read as zeros. */
int lm_cache_set_length(lm_state *s, int n);

/* Base of the whole array for (layer, kind): [n_kv_heads][capacity][head_size].
 * NULL on a bad layer or kind. */
const float *lm_cache_data(const lm_state *s, int layer, int kind);

/* Copy the row of (layer, pos, kind) for every KV head into out:
 * kv_dim floats laid out [n_kv_heads][head_size]. Any pos < capacity. */
int lm_cache_get(const lm_state *s, int layer, int pos, int kind, float *out);

/* Overwrite the row of (layer, pos, kind) from in ([n_kv_heads][head_size]).
 *   LM_VALUE:        the value row.
 *   LM_KEY_PREROPE:  the pre-RoPE row; the post-RoPE row is recomputed with
 *                    the same rotation the forward pass uses, so writing back
 *                    a row read from this state reproduces the cached key
 *                    bit for bit.
 *   LM_KEY:          the post-RoPE row; the pre-RoPE row is derived by the
 *                    inverse rotation (exact up to float rounding).
 * Does not change the cache length. */
int lm_cache_set(lm_state *s, int layer, int pos, int kind, const float *in);

/* ---- RoPE ------------------------------------------------------------------ */

/* Rotate in place a vector of n_heads consecutive heads of head_size floats
 * (head_size even) as for position pos: each pair (v[i], v[i+1]), i even, by
 * angle pos / theta^(i / head_size). inverse != 0 rotates back. Bit-identical
 * to the rotation inside lm_forward. */
void lm_rope(float *vec, int n_heads, int head_size, int pos, int inverse);

/* ---- decoding helpers ------------------------------------------------------ */

/* Deterministic PRNG (splitmix64). */
typedef struct lm_rng {
    uint64_t state;
} lm_rng;
void lm_rng_seed(lm_rng *r, uint64_t seed);
uint64_t lm_rng_next(lm_rng *r);
double lm_rng_uniform(lm_rng *r); /* in [0, 1), 53 random bits */

/* Index of the largest logit (the lowest index on ties). n > 0. */
int lm_argmax(const float *logits, int n);

/* Sample from softmax(logits / temperature) with one draw from r, in double.
 * temperature <= 0 means greedy (lm_argmax, no draw). */
int lm_sample(const float *logits, int n, double temperature, lm_rng *r);

/* log softmax(logits)[token], computed in double. */
double lm_logprob(const float *logits, int n, int token);
/* Negative log-likelihood of token: -lm_logprob. */
double lm_nll(const float *logits, int n, int token);
/* out[i] = log softmax(logits)[i] in double, for all n. */
void lm_log_softmax(const float *logits, int n, double *out);

#ifdef __cplusplus
}
#endif
#endif
