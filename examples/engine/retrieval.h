/* Retrieval rules of the engine's studies (prefix rt_; issue 19 C): which
 * archived positions a rule picks for one query head at step t, so that the
 * attention mass a pick holds (fkvf-attention) and the perplexity of
 * attending only to the exact window plus the picked positions
 * (fkvf-rehydrate) are measured with one definition of each rule.
 *
 * At step t the archived positions are lo .. hi with lo = sinks and
 * hi = t - recent (the exact window of fkvf-quality: the sinks and the
 * recent positions stay exact). A rule ranks archived positions; a pick of m
 * is the first m of its ranking (the refined key-symbol rules excepted, whose
 * candidate set grows with m). Rules:
 *   RT_SUFFIX     positions whose token context shares the longest suffix with
 *                 the context ending at t (length >= 1), longest first, then
 *                 earliest (fkvf_search_longest's order); often fewer than m;
 *   RT_SUCC       the position after each of the first m suffix matches, if
 *                 archived (where an induction head looks);
 *   RT_RECENT     the most recent archived positions;
 *   RT_RANDOM     a uniform random order (the context's seeded lm_rng);
 *   RT_NORM       the largest norm of the head's KV-head key;
 *   RT_H2O        the most attention received from this head so far (what
 *                 rt_observe was given: H2O's heavy hitters);
 *   RT_KEYSYM0    key symbols, as-is codebook (keys trained as cached, after
 *                 RoPE): the head's stage-0 key centroids c_j ranked by q . c_j
 *                 (k dot products), then the archived positions whose stage-0
 *                 symbol is the best symbol, the second, ... (within a symbol
 *                 the most recent first): the positions an index stream's
 *                 symbol search (fkvf_search_suffix of length 1) returns;
 *   RT_KEYSYM     the same, refined: the positions of the best symbols until
 *                 there are at least cand_factor * m candidates, ranked by
 *                 q . (the key decoded from all their stages);
 *   RT_KEYSYM0_PRE, RT_KEYSYM_PRE  the same with the pre-RoPE codebook (keys
 *                 un-rotated before training, the archive's default). The
 *                 score of a centroid is q . R(p) c, which depends on the
 *                 position p: the archived range is cut into chunks of
 *                 `chunk` positions (0: one chunk) and in each a symbol is
 *                 ranked by its mean over the chunk's positions: q~ . c, with
 *                 q~ such that q~ . c = mean_p q . R(p) c (pairs that turn
 *                 fast within a chunk average out); (chunk,
 *                 symbol) pairs best first, as fkvf_search_keys does; the
 *                 refinement decodes each candidate rotated to its own p;
 *   RT_ORACLE     the largest exact q . k (the m positions this head weighs
 *                 most: the per-head upper bound).
 * Single-threaded (the rankings use a file-scope sort key). */
#ifndef RT_RETRIEVAL_H
#define RT_RETRIEVAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <fkvf.h>

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum rt_rule {
    RT_SUFFIX,
    RT_SUCC,
    RT_RECENT,
    RT_RANDOM,
    RT_NORM,
    RT_H2O,
    RT_KEYSYM0,
    RT_KEYSYM,
    RT_KEYSYM0_PRE,
    RT_KEYSYM_PRE,
    RT_ORACLE,
    RT_COUNT
} rt_rule;

/* Printable names, in enum order. */
extern const char *const rt_rule_names[RT_COUNT];
/* 1 for the four key-symbol rules (they need codebooks). */
int rt_rule_needs_codebooks(rt_rule rule);

/* The model's RoPE as libfkvf describes it (interleaved pairs over the whole
 * head, LM_ROPE_THETA). */
fkvf_rope rt_model_rope(const lm_config *mc);

/* Key codebooks for the key-symbol rules: k centroids a stage, `stages` key
 * stages (no value stages), trained with fkvf_rvq_train (f32 tables, seed 0)
 * on the caches of n sequences of T positions run with the exact cache
 * (study.h: sampled sequence i seeded seed * 1000003 + i, or with text the T
 * - 1 bytes of training sequence i of [off, end)). *asis: keys as cached;
 * *pre: keys un-rotated (the model's RoPE). Exits (status 1, naming prog)
 * on failure. Progress on stderr. */
void rt_train(const char *prog, const lm_model *m, int T, int n, uint64_t seed,
              const uint8_t *text, size_t off, size_t end, uint32_t k, int stages,
              fkvf_rvq **asis, fkvf_rvq **pre);

typedef struct rt_ctx rt_ctx;

/* A context for sequences of at most T positions of a model of config mc,
 * window sinks + recent (recent >= 1), random rule seeded with seed. asis and
 * pre (borrowed; both NULL: no key-symbol rules) are rt_train's codebooks;
 * cand_factor >= 1 (the refined rules' candidates per pick); chunk >= 0 (the
 * pre-RoPE key-symbol rules' chunk, 0: the whole range). NULL on bad
 * arguments or out of memory. */
rt_ctx *rt_new(const lm_config *mc, int T, int sinks, int recent, uint64_t seed,
               const fkvf_rvq *asis, const fkvf_rvq *pre, int cand_factor, int chunk);
void rt_free(rt_ctx *r);

/* A new sequence: tokens (borrowed; tokens[0..t] must be valid when step t is
 * picked) and empty heavy-hitter sums and symbol indices. */
void rt_begin(rt_ctx *r, const int *tokens);

/* Position pos's keys (every layer, as st caches them after the step of pos)
 * encoded with both codebooks (greedy) into the symbol indices. Call after
 * each step, for pos = 0, 1, ... in order. */
void rt_add(rt_ctx *r, const lm_state *st, int pos);

/* H2O: the attention head (layer, head) gave at step t to positions 0..t
 * (att[p]; 0 where it did not attend) is added to its sums. */
void rt_observe(rt_ctx *r, int layer, int head, int t, const double *att);

/* The archived positions (at most m; all of them when there are no more
 * than m) rule picks for query head (layer, head) at step t, whose query
 * after RoPE is q (head_size floats), from the keys st caches; into out
 * (room for m). Returns how many; *examined (may be NULL) is set to the key
 * dot products the pick computed (centroid scores, chunks x k, plus decoded
 * candidates for the key-symbol rules, every archived key for the oracle, 0 for the others).
 * -1 for a key-symbol rule without codebooks or a bad argument. Picks for one
 * (rule, layer, head, t) and any m reuse one ranking. */
int rt_pick(rt_ctx *r, rt_rule rule, const lm_state *st, int layer, int head, const float *q,
            int t, int m, int *out, double *examined);

/* ---- the options and set-up the retrieval studies share ------------------- */

#define RT_MAX_M 8 /* values of --m */

/* fkvf-attention's and fkvf-rehydrate's common options (rt_usage says what
 * each means; defaults by rt_opts_init). */
typedef struct rt_opts {
    const char *model, *text_path, *eval_range, *train_range;
    long S, T, sinks, recent, seed, n_train, k, stages, cand, chunk;
    long ms[RT_MAX_M];
    int n_m;
} rt_opts;

void rt_opts_init(rt_opts *o, const char *default_model);
/* Option a with value v: 1 taken, 0 not one of the common options, -1 a bad
 * value (a message naming prog printed). */
int rt_opts_take(rt_opts *o, const char *prog, const char *a, const char *v);
/* The common options' usage lines, default model named. */
void rt_usage(FILE *f, const char *default_model);

/* What the options give: the model, the text (NULL: sampled sequences) and
 * its evaluation and training ranges, the key codebooks (NULL with --train
 * 0). */
typedef struct rt_setup {
    lm_model *mdl;
    uint8_t *text;
    size_t off, end, toff, tend;
    fkvf_rvq *asis, *pre;
} rt_setup;

/* Checks the options together (--k a power of two, ranges with --text,
 * --tokens within the model; default m values), loads the model and the
 * text, trains the codebooks. 0, or the exit status after a message (2
 * usage, 1 a file that does not load); *s is then freed. */
int rt_setup_run(const char *prog, rt_opts *o, rt_setup *s);
void rt_setup_free(rt_setup *s);
/* The printed line of the key-symbol rules' settings. */
void rt_print_settings(const rt_opts *o, const rt_setup *s);

#ifdef __cplusplus
}
#endif
#endif
