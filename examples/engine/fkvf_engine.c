/* fkvf-engine: the tiny engine (model.c) with its KV cache kept through
 * libfkvf: save as it generates, resume after a restart, reuse the longest
 * matching prefix of a saved archive for a new prompt. Public API only.
 *
 * usage: see usage() below and docs/engine.md.
 *
 * Positions and tokens. The sequence is prompt + generated tokens; every
 * token of it is run through the forward pass at its position (so the cache
 * holds every token, the last generated one included), and the token
 * generated after position p is picked from the logits of p. Sampling draws
 * one number from a PRNG seeded from (seed, p) alone, so a resumed run draws
 * exactly what an uninterrupted one would.
 *
 * Output: one line per generated token
 *   step pos=P id=T nll=X digest=H
 * where P is the position whose logits picked T, X = -log softmax(logits)[T]
 * and H is a 64-bit FNV-1a digest of the logits' bytes (bit-for-bit logits
 * comparison), then "ids: ..." and "mean-nll: ...".
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fkvf.h>

#include "model.h"

#ifndef LM_DEFAULT_MODEL
#define LM_DEFAULT_MODEL "../shared/models/stories260K.bin"
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fkvf-engine [--model PATH] [--prompt IDS] [--generate N]\n"
            "                   [--temperature X] [--seed S] [--force IDS] [--delay-ms D]\n"
            "                   [--save ARCHIVE] [--resume ARCHIVE]\n"
            "                   [--codebooks FILE | --exact-only] [--sinks S] [--recent W]\n"
            "                   [--commit-every K] [--sync commit|none] [--quiet]\n"
            "       fkvf-engine [--model PATH] --bench-resume DIR [--codebooks FILE]\n"
            "                   [--reps R]\n"
            "  IDS: comma-separated token ids (default prompt: 1, BOS)\n"
            "  --save ARCHIVE     create ARCHIVE and append + commit as the engine runs\n"
            "  --resume ARCHIVE   restore the cache from ARCHIVE (longest matching prefix of\n"
            "                     the prompt; no --prompt: the archive's own tokens), continue,\n"
            "                     and append to it (or to --save NEW when the prompt diverges)\n"
            "  --force IDS        teacher forcing: feed these ids instead of sampling and report\n"
            "                     their NLL (N = their count)\n"
            "default model: %s\n",
            LM_DEFAULT_MODEL);
}

/* ---- small helpers -------------------------------------------------------- */

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t digest_logits(const float *x, int n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < (size_t)n * sizeof(float); i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static uint64_t step_seed(uint64_t seed, int pos)
{
    return seed ^ ((uint64_t)(pos + 1) * 0xD1B54A32D192ED03ULL);
}

/* Parse "1,2,3" into a new array; -1 on a bad list. */
static int parse_ids(const char *s, int vocab, int **out, int *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    int *v = malloc(cap * sizeof *v);
    if (!v)
        return -1;
    int k = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x >= vocab || (*end && *end != ',')) {
            free(v);
            return -1;
        }
        v[k++] = (int)x;
        p = *end ? end + 1 : end;
    }
    if (k == 0) {
        free(v);
        return -1;
    }
    *out = v;
    *n = k;
    return 0;
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* XXH3-128 (canonical bytes) of the checkpoint file, for the descriptor's
 * weights_hash (kind 2, spec 8): fkvf_codebook_hash is XXH3-128 of the bytes
 * it is given. -1 if the file cannot be read. */
static int hash_file(const char *path, uint8_t out[16])
{
    size_t n = 0;
    unsigned char *b = lm_read_file(path, &n);
    if (!b)
        return -1;
    fkvf_codebook_hash(b, n, out);
    free(b);
    return 0;
}

/* ---- the engine's cache <-> FKVF rows ------------------------------------- */

/* Row of one position in the layout of spec 14.2, binary32: per layer the
 * keys (as cached, after RoPE) of heads 0..H-1, then the values. */
static void gather_row(const lm_state *st, int pos, float *row)
{
    const lm_config *c = lm_model_config(lm_state_model(st));
    for (int l = 0; l < c->n_layers; l++) {
        lm_cache_get(st, l, pos, LM_KEY, row);
        lm_cache_get(st, l, pos, LM_VALUE, row + c->kv_dim);
        row += 2 * (size_t)c->kv_dim;
    }
}

/* Restore positions [0, n) of every layer with fkvf_reader_read
 * (FKVF_LAYOUT_HEADS: keys [head][pos][dim], then values) into the state. */
static int restore_cache(fkvf_reader *r, lm_state *st, int n)
{
    const lm_config *c = lm_model_config(lm_state_model(st));
    const int H = c->n_kv_heads, D = c->head_size;
    fkvf_read_request req;
    memset(&req, 0, sizeof req);
    req.first = 0;
    req.count = (uint64_t)n;
    req.layer_count = 1;
    req.dtype = FKVF_DTYPE_F32;
    req.layout = FKVF_LAYOUT_HEADS;
    size_t size;
    int rc = fkvf_reader_read_size(r, &req, &size);
    if (rc)
        return rc;
    float *buf = malloc(size ? size : 1);
    float *row = malloc((size_t)c->kv_dim * sizeof *row);
    if (!buf || !row) {
        free(buf);
        free(row);
        return FKVF_E_NOMEM;
    }
    for (int l = 0; l < c->n_layers && rc == 0; l++) {
        req.layer_first = (uint32_t)l;
        if ((rc = fkvf_reader_read(r, &req, buf, size)))
            break;
        const float *keys = buf, *vals = buf + (size_t)H * n * D;
        for (int p = 0; p < n; p++) {
            for (int h = 0; h < H; h++)
                memcpy(row + (size_t)h * D, keys + ((size_t)h * n + p) * D, D * sizeof(float));
            lm_cache_set(st, l, p, LM_KEY, row);
            for (int h = 0; h < H; h++)
                memcpy(row + (size_t)h * D, vals + ((size_t)h * n + p) * D, D * sizeof(float));
            lm_cache_set(st, l, p, LM_VALUE, row);
        }
    }
    free(buf);
    free(row);
    if (rc == 0)
        lm_cache_set_length(st, n);
    return rc;
}

/* ---- archive creation ------------------------------------------------------ */

typedef struct save_opts {
    const char *codebooks; /* NULL: exact-only */
    uint32_t sinks, recent;
    int commit_every;
    unsigned sync;
} save_opts;

/* Open a codebook file; its train.keys metadata says whether keys are
 * archived before RoPE. */
/* 1 when a codebook file was trained on keys before RoPE (train.keys). */
static int codebook_pre_rope(fkvf_reader *cb)
{
    fkvf_meta_entry e;
    return fkvf_reader_meta_find(cb, "train.keys", &e) == FKVF_OK && e.type == FKVF_META_UTF8 &&
           e.value_len == 8 && !memcmp(e.value, "pre-rope", 8);
}

static int open_codebook(const char *path, fkvf_reader **out, int *pre_rope)
{
    int rc = fkvf_reader_open_file(out, path, 0, NULL);
    if (rc) {
        fprintf(stderr, "fkvf-engine: %s: %s\n", path,
                *out ? fkvf_reader_message(*out) : fkvf_strerror(rc));
        fkvf_reader_free(*out);
        *out = NULL;
        return -1;
    }
    *pre_rope = codebook_pre_rope(*out);
    return 0;
}

static int create_archive(fkvf_appender **out, const char *path, const lm_config *c,
                          const save_opts *so, fkvf_reader *cb, int pre_rope,
                          const char *model_path)
{
    fkvf_desc d;
    memset(&d, 0, sizeof d);
    d.n_layers = (uint32_t)c->n_layers;
    d.n_kv_heads = (uint32_t)c->n_kv_heads;
    d.key_dim = d.value_dim = (uint32_t)c->head_size;
    d.dtype = FKVF_DTYPE_F32;
    d.key_transform = 1;
    d.rope_layout = 1;
    d.key_storage = (uint8_t)(cb && pre_rope);
    d.rope_dims = (uint32_t)c->head_size;
    d.rope_theta = LM_ROPE_THETA;
    d.n_sinks = so->sinks;
    d.window = so->recent;
    d.model_id = base_name(model_path);
    d.tokenizer_id = "llama2c-ids";
    if (hash_file(model_path, d.weights_hash) == 0)
        d.weights_hash_kind = 2; /* XXH3-128 of the checkpoint file */
    fkvf_append_create cr;
    memset(&cr, 0, sizeof cr);
    cr.desc = &d;
    cr.codebook_ref = cb;
    cr.codebook_name = so->codebooks ? base_name(so->codebooks) : NULL;
    cr.token_codec.profile = FKVF_PROFILE_QUAD;
    cr.token_codec.symbol_bits = 16;
    fkvf_append_options ao;
    fkvf_append_options_init(&ao);
    ao.sync = so->sync;
    int rc = fkvf_appender_create(out, path, &cr, &ao, NULL);
    if (rc) {
        fprintf(stderr, "fkvf-engine: %s: cannot create: %s\n", path,
                *out ? fkvf_appender_message(*out) : fkvf_strerror(rc));
        fkvf_appender_free(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

/* ---- the run ---------------------------------------------------------------- */

typedef struct run_opts {
    const char *model_path;
    int *prompt;
    int n_prompt;
    int generate;
    double temperature;
    uint64_t seed;
    int *force;
    int n_force;
    long delay_ms;
    const char *save, *resume;
    save_opts so;
    int quiet;
} run_opts;

typedef struct sink_state {
    fkvf_appender *a;
    const char *path;
    int appended_upto; /* positions below are in the archive or queued */
    int since_commit;
    int commit_every;
    float *row;
    size_t row_bytes;
} sink_state;

static int sink_flush(sink_state *s)
{
    if (!s->a || s->since_commit == 0)
        return 0;
    int rc = fkvf_appender_commit(s->a);
    if (rc) {
        fprintf(stderr, "fkvf-engine: %s: commit failed: %s\n", s->path,
                fkvf_appender_message(s->a));
        return -1;
    }
    s->since_commit = 0;
    return 0;
}

/* Append position pos (just computed) if the archive does not hold it yet. */
static int sink_position(sink_state *s, const lm_state *st, int pos, int token)
{
    if (!s->a || pos < s->appended_upto)
        return 0;
    gather_row(st, pos, s->row);
    uint32_t t = (uint32_t)token;
    int rc = fkvf_appender_append(s->a, s->row, s->row_bytes, 1, &t);
    if (rc) {
        fprintf(stderr, "fkvf-engine: %s: append failed: %s\n", s->path,
                fkvf_appender_message(s->a));
        return -1;
    }
    s->appended_upto = pos + 1;
    if (++s->since_commit >= s->commit_every)
        return sink_flush(s);
    return 0;
}

/* Read the whole token stream of an archive. */
static int read_tokens(fkvf_reader *r, uint32_t **out, uint64_t *n)
{
    size_t si;
    fkvf_stream_info info;
    int rc = fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &si);
    if (rc == 0)
        rc = fkvf_reader_stream_info(r, si, &info);
    if (rc)
        return rc;
    uint32_t *t = malloc((info.length ? info.length : 1) * sizeof *t);
    if (!t)
        return FKVF_E_NOMEM;
    if (info.length && (rc = fkvf_reader_stream_read(r, si, 0, t, info.length))) {
        free(t);
        return rc;
    }
    *out = t;
    *n = info.length;
    return 0;
}

static int run(const lm_model *m, run_opts *o)
{
    const lm_config *c = lm_model_config(m);
    int rc = 1;
    lm_state *st = lm_state_new(m, 0);
    fkvf_reader *cb = NULL, *r = NULL;
    uint32_t *atok = NULL;
    int *seq = NULL;
    int pre_rope = 0;
    sink_state sk;
    memset(&sk, 0, sizeof sk);
    sk.commit_every = o->so.commit_every;
    sk.row_bytes = (size_t)c->n_layers * 2 * (size_t)c->kv_dim * sizeof(float);
    sk.row = malloc(sk.row_bytes);
    if (!st || !sk.row) {
        fprintf(stderr, "fkvf-engine: out of memory\n");
        goto out;
    }
    if (o->so.codebooks && open_codebook(o->so.codebooks, &cb, &pre_rope))
        goto out;

    int reuse = 0;       /* positions restored from the archive */
    uint64_t n_arch = 0; /* positions in the archive */
    double t_restore = 0;
    if (o->resume) {
        uint8_t mh[16];
        int have_mh = hash_file(o->model_path, mh) == 0;
        double t0 = now_seconds();
        int e = fkvf_reader_open_file(&r, o->resume, 0, NULL);
        if (e) {
            fprintf(stderr, "fkvf-engine: %s: %s\n", o->resume,
                    r ? fkvf_reader_message(r) : fkvf_strerror(e));
            goto out;
        }
        /* the archive must come from this model (weights hash, spec 8) */
        fkvf_desc ad;
        if ((e = fkvf_reader_desc(r, &ad))) {
            fprintf(stderr, "fkvf-engine: %s: %s\n", o->resume, fkvf_reader_message(r));
            goto out;
        }
        if (ad.n_layers != (uint32_t)c->n_layers || ad.n_kv_heads != (uint32_t)c->n_kv_heads ||
            ad.key_dim != (uint32_t)c->head_size || ad.value_dim != (uint32_t)c->head_size) {
            fprintf(stderr, "fkvf-engine: %s: cache shape %u layers x %u heads x %u/%u, the "
                    "model has %d x %d x %d\n", o->resume, ad.n_layers, ad.n_kv_heads,
                    ad.key_dim, ad.value_dim, c->n_layers, c->n_kv_heads, c->head_size);
            goto out;
        }
        if (ad.weights_hash_kind == 2 && have_mh &&
            memcmp(mh, ad.weights_hash, 16) != 0) {
            fprintf(stderr, "fkvf-engine: %s was saved with other model weights "
                    "(model_id \"%s\"; weights hash differs from %s)\n", o->resume,
                    ad.model_id, o->model_path);
            goto out;
        }
        if (ad.weights_hash_kind != 2)
            fprintf(stderr, "fkvf-engine: note: %s has no XXH3-128 weights hash; cannot check "
                    "that it comes from this model\n", o->resume);
        int ext = 0;
        if (fkvf_reader_codebook_ref(r, &ext, NULL, NULL) == 0 && ext) {
            if (!cb) {
                /* found by content hash: in the archive's directory (the
                 * name stored in the archive first), then in the
                 * directories of FKVF_CODEBOOK_PATH */
                if ((e = fkvf_reader_find_codebook(r, getenv("FKVF_CODEBOOK_PATH"), &cb))) {
                    fprintf(stderr, "fkvf-engine: %s (give --codebooks FILE)\n",
                            fkvf_reader_message(r));
                    goto out;
                }
                pre_rope = codebook_pre_rope(cb);
            } else if ((e = fkvf_reader_attach_codebook(r, cb))) {
                fprintf(stderr, "fkvf-engine: %s: %s\n", o->resume, fkvf_reader_message(r));
                goto out;
            }
        }
        if ((e = read_tokens(r, &atok, &n_arch))) {
            fprintf(stderr, "fkvf-engine: %s: no token stream (%s)\n", o->resume,
                    fkvf_strerror(e));
            goto out;
        }
        if (!o->prompt && n_arch > (uint64_t)lm_state_capacity(st)) {
            fprintf(stderr, "fkvf-engine: %s: %llu positions, more than the model's %d\n",
                    o->resume, (unsigned long long)n_arch, lm_state_capacity(st));
            goto out;
        }
        if (o->prompt && o->n_prompt > lm_state_capacity(st)) {
            fprintf(stderr, "fkvf-engine: a prompt of %d tokens exceeds seq_len %d\n",
                    o->n_prompt, lm_state_capacity(st));
            goto out;
        }
        if (!o->prompt) { /* continue the archived sequence */
            if (n_arch == 0) {
                fprintf(stderr, "fkvf-engine: %s: empty archive and no --prompt\n", o->resume);
                goto out;
            }
            o->prompt = malloc(n_arch * sizeof(int));
            if (!o->prompt)
                goto out;
            for (uint64_t i = 0; i < n_arch; i++)
                o->prompt[i] = (int)atok[i];
            o->n_prompt = (int)n_arch;
        }
        uint32_t *q = malloc((size_t)o->n_prompt * sizeof *q);
        if (!q)
            goto out;
        for (int i = 0; i < o->n_prompt; i++)
            q[i] = (uint32_t)o->prompt[i];
        fkvf_prefix_reuse pr;
        e = fkvf_search_prefix_reuse(r, q, (size_t)o->n_prompt, &pr);
        free(q);
        if (e) {
            fprintf(stderr, "fkvf-engine: %s: prefix search: %s\n", o->resume,
                    fkvf_reader_message(r));
            goto out;
        }
        /* the last prompt token is always run: its logits pick the next id */
        reuse = (int)pr.prefix_len;
        if (reuse > o->n_prompt - 1)
            reuse = o->n_prompt - 1;
        if (reuse > 0 && (e = restore_cache(r, st, reuse))) {
            fprintf(stderr, "fkvf-engine: %s: restore failed: %s\n", o->resume,
                    fkvf_reader_message(r));
            goto out;
        }
        t_restore = now_seconds() - t0;
        printf("archive-tokens:");
        for (uint64_t i = 0; i < n_arch; i++)
            printf(" %u", atok[i]);
        printf("\n");
        printf("resume: archive %llu positions, prompt %d, prefix_len %llu, reused %d, "
               "recomputed %d, open+restore %.3f ms\n",
               (unsigned long long)n_arch, o->n_prompt, (unsigned long long)pr.prefix_len,
               reuse, o->n_prompt - reuse, t_restore * 1e3);
        fkvf_reader_free(r);
        r = NULL;
        if (pr.prefix_len == n_arch) {
            /* the archive is a prefix of the prompt: append to it */
            if (o->save && strcmp(o->save, o->resume) != 0)
                fprintf(stderr, "fkvf-engine: note: appending to %s, --save %s ignored\n",
                        o->resume, o->save);
            fkvf_append_options ao;
            fkvf_append_options_init(&ao);
            ao.sync = o->so.sync;
            ao.recover = 1; /* a torn tail after a crash: cut it */
            ao.codebook_file = cb;
            if ((e = fkvf_appender_open(&sk.a, o->resume, &ao, NULL))) {
                fprintf(stderr, "fkvf-engine: %s: cannot append: %s\n", o->resume,
                        sk.a ? fkvf_appender_message(sk.a) : fkvf_strerror(e));
                fkvf_appender_free(sk.a);
                sk.a = NULL;
                goto out;
            }
            fkvf_append_info as;
            fkvf_appender_info(sk.a, &as);
            if (as.recovered_bytes)
                printf("resume: cut a torn tail of %llu bytes\n",
                       (unsigned long long)as.recovered_bytes);
            sk.path = o->resume;
            sk.appended_upto = (int)n_arch;
        } else if (o->save) {
            /* the prompt diverges: a new archive from the reused rows */
            if (create_archive(&sk.a, o->save, c, &o->so, cb, pre_rope, o->model_path))
                goto out;
            sk.path = o->save;
            for (int p = 0; p < reuse; p++)
                if (sink_position(&sk, st, p, o->prompt[p]))
                    goto out;
        } else {
            printf("resume: the prompt diverges from the archive at %llu; not saving "
                   "(give --save NEW)\n",
                   (unsigned long long)pr.prefix_len);
        }
    } else if (o->save) {
        if (create_archive(&sk.a, o->save, c, &o->so, cb, pre_rope, o->model_path))
            goto out;
        sk.path = o->save;
    }
    if (!o->prompt) {
        o->prompt = malloc(sizeof(int));
        if (!o->prompt)
            goto out;
        o->prompt[0] = LM_BOS;
        o->n_prompt = 1;
    }
    int total = o->n_prompt + o->generate;
    if (total > lm_state_capacity(st)) {
        fprintf(stderr, "fkvf-engine: prompt %d + generate %d exceeds seq_len %d\n",
                o->n_prompt, o->generate, lm_state_capacity(st));
        goto out;
    }
    seq = malloc((size_t)total * sizeof *seq);
    if (!seq)
        goto out;
    memcpy(seq, o->prompt, (size_t)o->n_prompt * sizeof *seq);

    double t0 = now_seconds();
    const float *logits = NULL;
    for (int p = reuse; p < o->n_prompt; p++) {
        logits = lm_forward(st, seq[p], p);
        if (!logits || sink_position(&sk, st, p, seq[p]))
            goto out;
    }
    double t_prompt = now_seconds() - t0;
    double sum_nll = 0;
    for (int g = 0; g < o->generate; g++) {
        int pos = o->n_prompt + g - 1; /* the logits of pos pick the next token */
        int next;
        if (o->force) {
            next = o->force[g];
        } else {
            lm_rng rng;
            lm_rng_seed(&rng, step_seed(o->seed, pos));
            next = lm_sample(logits, c->vocab_size, o->temperature, &rng);
        }
        double nll = lm_nll(logits, c->vocab_size, next);
        sum_nll += nll;
        seq[pos + 1] = next;
        if (!o->quiet)
            printf("step pos=%d id=%d nll=%.6f digest=%016llx\n", pos, next, nll,
                   (unsigned long long)digest_logits(logits, c->vocab_size));
        fflush(stdout);
        logits = lm_forward(st, next, pos + 1);
        if (!logits || sink_position(&sk, st, pos + 1, next))
            goto out;
        if (o->delay_ms > 0) {
            struct timespec ts = {o->delay_ms / 1000, (o->delay_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    if (sink_flush(&sk))
        goto out;
    if (sk.a && o->so.sync == FKVF_SYNC_NONE && fkvf_appender_sync(sk.a)) {
        fprintf(stderr, "fkvf-engine: %s: sync failed: %s\n", sk.path,
                fkvf_appender_message(sk.a));
        goto out;
    }
    if (sk.a) {
        fkvf_append_info as;
        fkvf_appender_info(sk.a, &as);
        printf("archive: %s: %llu positions (%llu archived), commit %llu, %llu bytes\n", sk.path,
               (unsigned long long)as.n_positions, (unsigned long long)as.n_archived,
               (unsigned long long)as.commit_seq, (unsigned long long)as.file_size);
    }
    printf("ids:");
    for (int i = o->n_prompt; i < total; i++)
        printf(" %d", seq[i]);
    printf("\n");
    if (o->generate > 0)
        printf("mean-nll: %.6f over %d tokens\n", sum_nll / o->generate, o->generate);
    printf("prompt: %d positions computed in %.3f ms\n", o->n_prompt - reuse, t_prompt * 1e3);
    rc = 0;
out:
    fkvf_appender_free(sk.a);
    fkvf_reader_free(r);
    fkvf_reader_free(cb);
    lm_state_free(st);
    free(sk.row);
    free(atok);
    free(seq);
    return rc;
}

/* ---- --bench-resume ------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* For prompts of 64..512 tokens (seeded samples): save an archive, then time
 * (a) recomputing the prompt with the forward pass and (b) opening the
 * archive and restoring the full cache; medians of R repetitions. */
static int bench_resume(const lm_model *m, const char *dir, const char *codebooks, int reps)
{
    const lm_config *c = lm_model_config(m);
    static const int lens[] = {64, 128, 256, 512};
    int rc = 1;
    fkvf_reader *cb = NULL;
    int pre_rope = 0;
    if (codebooks && open_codebook(codebooks, &cb, &pre_rope))
        return 1;
    lm_state *st = lm_state_new(m, 0), *st2 = lm_state_new(m, 0);
    int *toks = malloc(512 * sizeof *toks);
    double *t_re = malloc((size_t)reps * sizeof(double)),
           *t_rs = malloc((size_t)reps * sizeof(double)),
           *t_op = malloc((size_t)reps * sizeof(double)),
           *t_ro = malloc((size_t)reps * sizeof(double)),
           *t_r2 = malloc((size_t)reps * sizeof(double));
    sink_state sk;
    memset(&sk, 0, sizeof sk);
    sk.row_bytes = (size_t)c->n_layers * 2 * (size_t)c->kv_dim * sizeof(float);
    sk.row = malloc(sk.row_bytes);
    if (!st || !st2 || !toks || !t_re || !t_rs || !t_op || !t_ro || !t_r2 || !sk.row)
        goto out;
    printf("bench-resume: %d reps, medians, f32 archive %s (4 sinks + 32 recent exact)\n",
           reps, codebooks ? codebooks : "exact-only");
    printf("%6s %13s %16s %8s %10s %11s %8s %9s %s\n", "prompt", "recompute_ms",
           "open+restore_ms", "open_ms", "restore_ms", "restore2_ms", "speedup", "bytes",
           "cache-identical");
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int n = lens[li];
        if (n > lm_state_capacity(st))
            break;
        char path[4096];
        snprintf(path, sizeof path, "%s/bench-%d.fkvf", dir, n);
        remove(path);
        save_opts so = {codebooks, 4, 32, 64, FKVF_SYNC_NONE};
        if (create_archive(&sk.a, path, c, &so, cb, pre_rope, "stories260K.bin"))
            goto out;
        sk.path = path;
        sk.appended_upto = 0;
        sk.since_commit = 0;
        sk.commit_every = 64;
        toks[0] = LM_BOS;
        for (int p = 0; p < n; p++) {
            const float *lg = lm_forward(st, toks[p], p);
            if (!lg || sink_position(&sk, st, p, toks[p]))
                goto out;
            lm_rng rng;
            lm_rng_seed(&rng, step_seed(1000 + (uint64_t)n, p));
            if (p + 1 < n)
                toks[p + 1] = lm_sample(lg, c->vocab_size, 1.0, &rng);
        }
        if (sink_flush(&sk) || fkvf_appender_sync(sk.a))
            goto out;
        fkvf_append_info as;
        fkvf_appender_info(sk.a, &as);
        fkvf_appender_free(sk.a);
        sk.a = NULL;
        volatile float sinkv = 0;
        for (int k = 0; k < reps; k++) {
            double t0 = now_seconds();
            const float *lg = NULL;
            for (int p = 0; p < n; p++)
                lg = lm_forward(st2, toks[p], p);
            t_re[k] = now_seconds() - t0;
            sinkv += lg[0];
        }
        int identical = 1;
        for (int k = 0; k < reps; k++) {
            double t0 = now_seconds();
            fkvf_reader *r = NULL;
            int e = fkvf_reader_open_file(&r, path, 0, NULL);
            if (e == 0 && cb)
                e = fkvf_reader_attach_codebook(r, cb);
            double t1 = now_seconds();
            if (e == 0)
                e = restore_cache(r, st2, n);
            t_rs[k] = now_seconds() - t0;
            t_op[k] = t1 - t0;
            t_ro[k] = t_rs[k] - t_op[k];
            /* again on the same reader: what is left once the reader has
             * built its codebook (archived positions) */
            double t2 = now_seconds();
            if (e == 0)
                e = restore_cache(r, st2, n);
            t_r2[k] = now_seconds() - t2;
            if (e) {
                fprintf(stderr, "fkvf-engine: %s: %s\n", path,
                        r ? fkvf_reader_message(r) : fkvf_strerror(e));
                fkvf_reader_free(r);
                goto out;
            }
            fkvf_reader_free(r);
        }
        /* the restored cache against the computed one: bit-identical?
         * relative MSE of keys (as cached) and values over all n positions */
        double e2[2] = {0, 0}, s2[2] = {0, 0};
        for (int l = 0; l < c->n_layers; l++)
            for (int kind = LM_KEY; kind <= LM_VALUE; kind += 2)
                for (int h = 0; h < c->n_kv_heads; h++) {
                    const float *a = lm_cache_data(st, l, kind) +
                                     (size_t)h * lm_state_capacity(st) * c->head_size;
                    const float *b = lm_cache_data(st2, l, kind) +
                                     (size_t)h * lm_state_capacity(st2) * c->head_size;
                    if (memcmp(a, b, (size_t)n * c->head_size * sizeof(float)))
                        identical = 0;
                    for (size_t i = 0; i < (size_t)n * c->head_size; i++) {
                        double d = (double)a[i] - b[i];
                        e2[kind != LM_KEY] += d * d;
                        s2[kind != LM_KEY] += (double)a[i] * a[i];
                    }
                }
        double re = median(t_re, reps), rs = median(t_rs, reps), op = median(t_op, reps);
        double rsonly = median(t_ro, reps), r2 = median(t_r2, reps);
        printf("%6d %13.3f %16.3f %8.3f %10.3f %11.3f %7.1fx %9llu %s\n", n, re * 1e3,
               rs * 1e3, op * 1e3, rsonly * 1e3, r2 * 1e3, re / rs,
               (unsigned long long)as.file_size, identical ? "yes" : "no");
        printf("%6s relative MSE of the restored cache: keys %.3g, values %.3g\n", "",
               s2[0] > 0 ? e2[0] / s2[0] : 0.0, s2[1] > 0 ? e2[1] / s2[1] : 0.0);
        (void)sinkv;
    }
    rc = 0;
out:
    fkvf_appender_free(sk.a);
    fkvf_reader_free(cb);
    lm_state_free(st);
    lm_state_free(st2);
    free(toks);
    free(t_re);
    free(t_rs);
    free(t_op);
    free(t_ro);
    free(t_r2);
    free(sk.row);
    return rc;
}

/* ---- main ------------------------------------------------------------------- */

static int is_value_option(const char *a)
{
    static const char *const opts[] = {
        "--model",  "--prompt",    "--generate",  "--temperature", "--seed",
        "--force",  "--delay-ms",  "--save",      "--resume",      "--codebooks",
        "--sinks",  "--recent",    "--commit-every", "--sync",     "--bench-resume",
        "--reps"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if (!strcmp(a, opts[i]))
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    run_opts o;
    memset(&o, 0, sizeof o);
    o.generate = 16;
    o.seed = 1;
    o.so.sinks = 4;
    o.so.recent = 32;
    o.so.commit_every = 1;
    o.so.sync = FKVF_SYNC_COMMIT;
    const char *prompt_s = NULL, *force_s = NULL, *bench_dir = NULL;
    int gen_set = 0;
    long reps = 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        long v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--exact-only")) {
            o.so.codebooks = NULL;
            continue;
        }
        if (!strcmp(a, "--quiet")) {
            o.quiet = 1;
            continue;
        }
        if (!is_value_option(a)) {
            fprintf(stderr, "fkvf-engine: unknown argument %s\n", a);
            usage(stderr);
            return 2;
        }
        if (!val) {
            fprintf(stderr, "fkvf-engine: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--model")) {
            o.model_path = val;
        } else if (!strcmp(a, "--prompt")) {
            prompt_s = val;
        } else if (!strcmp(a, "--force")) {
            force_s = val;
        } else if (!strcmp(a, "--save")) {
            o.save = val;
        } else if (!strcmp(a, "--resume")) {
            o.resume = val;
        } else if (!strcmp(a, "--codebooks")) {
            o.so.codebooks = val;
        } else if (!strcmp(a, "--bench-resume")) {
            bench_dir = val;
        } else if (!strcmp(a, "--sync")) {
            if (!strcmp(val, "commit"))
                o.so.sync = FKVF_SYNC_COMMIT;
            else if (!strcmp(val, "none"))
                o.so.sync = FKVF_SYNC_NONE;
            else {
                fprintf(stderr, "fkvf-engine: --sync %s: expected commit or none\n", val);
                return 2;
            }
        } else if (!strcmp(a, "--temperature")) {
            char *end;
            errno = 0;
            double t = strtod(val, &end);
            if (errno || end == val || *end || !(t >= 0.0) || !isfinite(t)) {
                fprintf(stderr, "fkvf-engine: --temperature %s: expected a number >= 0\n", val);
                return 2;
            }
            o.temperature = t;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(val, &end, 0);
            if (errno || end == val || *end || val[0] == '-') {
                fprintf(stderr, "fkvf-engine: --seed %s: expected an unsigned integer\n", val);
                return 2;
            }
            o.seed = (uint64_t)s;
        } else {
            long lo = 0, hi = 1L << 20;
            if (!strcmp(a, "--commit-every") || !strcmp(a, "--reps"))
                lo = 1;
            if (parse_long(val, lo, hi, &v)) {
                fprintf(stderr, "fkvf-engine: %s %s: expected an integer %ld..%ld\n", a, val,
                        lo, hi);
                return 2;
            }
            if (!strcmp(a, "--generate")) {
                o.generate = (int)v;
                gen_set = 1;
            } else if (!strcmp(a, "--delay-ms"))
                o.delay_ms = v;
            else if (!strcmp(a, "--sinks"))
                o.so.sinks = (uint32_t)v;
            else if (!strcmp(a, "--recent"))
                o.so.recent = (uint32_t)v;
            else if (!strcmp(a, "--commit-every"))
                o.so.commit_every = (int)v;
            else
                reps = v;
        }
    }
    if (!o.model_path)
        o.model_path = LM_DEFAULT_MODEL;
    char err[512];
    lm_model *m = lm_load(o.model_path, err, sizeof err);
    if (!m) {
        fprintf(stderr, "fkvf-engine: %s\n", err);
        return 1;
    }
    const lm_config *c = lm_model_config(m);
    int rc = 2;
    if (prompt_s && parse_ids(prompt_s, c->vocab_size, &o.prompt, &o.n_prompt)) {
        fprintf(stderr, "fkvf-engine: --prompt %s: expected ids 0..%d, comma-separated\n",
                prompt_s, c->vocab_size - 1);
        goto done;
    }
    if (force_s) {
        if (parse_ids(force_s, c->vocab_size, &o.force, &o.n_force)) {
            fprintf(stderr, "fkvf-engine: --force %s: expected ids\n", force_s);
            goto done;
        }
        if (gen_set && o.generate != o.n_force) {
            fprintf(stderr, "fkvf-engine: --generate %d and %d --force ids\n", o.generate,
                    o.n_force);
            goto done;
        }
        o.generate = o.n_force;
    }
    if (bench_dir)
        rc = bench_resume(m, bench_dir, o.so.codebooks, (int)reps);
    else
        rc = run(m, &o);
done:
    free(o.prompt);
    free(o.force);
    lm_free(m);
    return rc;
}
