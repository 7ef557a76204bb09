/* fkvf append / compact / recover: the command lines of the appender
 * (growing an archive one commit at a time, spec 7.4-7.7 and 14.3), of
 * fkvf_archive_compact (a many-commit archive rewritten as one commit
 * without re-encoding) and of fkvf_archive_recover (a torn tail cut off):
 * parse, check the files, call the library, print. Public API (fkvf.h) and
 * cacheio only. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cacheio.h"
#include "cli_util.h"
#include "commands.h"
#include "fkvf.h"

/* ---- helpers ------------------------------------------------------------ */

/* Symbols a stream codec can hold (0: 2^32). */
static uint64_t alphabet_of(const fkvf_stream_info *si)
{
    if (si->profile == FKVF_PROFILE_NGON)
        return si->alphabet;
    return si->symbol_bits >= 32 ? (UINT64_C(1) << 32) : (UINT64_C(1) << si->symbol_bits);
}

/* ---- append --------------------------------------------------------------- */

static const char *append_help =
    "usage: fkvf append ARCHIVE CACHE [options]\n"
    "       fkvf append --create ARCHIVE CACHE [options]\n"
    "\n"
    "Append the positions of a raw KV cache (.safetensors, .npy or .npz;\n"
    "docs/cache-files.md) to an archive, one commit per N positions (default:\n"
    "one commit for the whole file). Only new data is written: exact rows of\n"
    "the new positions that stay in the recent window, the RVQ indices of the\n"
    "positions that leave it (encoded with the archive's codebook) and the\n"
    "token ids. The cache must match the archive's descriptor (layers, heads,\n"
    "dims, dtype). A crash never loses an earlier commit. Memory does not grow\n"
    "with the cache or the commit: the rows are read 16 MiB at a time, and a\n"
    "large commit is written while its positions are queued, its trailer last\n"
    "(docs/appending.md).\n"
    "\n"
    "Positions: a cache's position p is sequence position p, so an append\n"
    "continues the archive at the cache position equal to the archive's count N:\n"
    "--positions A:B needs A = N, and a plain append (the whole cache) N = 0.\n"
    "An overlap (A < N) or a gap (A > N) is refused (exit 1) unless --continues.\n"
    "The cache holds the sequence from its position 0: when it has token ids and\n"
    "the archive a token stream, its ids at positions 0..N-1 (as far as it has\n"
    "them) must be the archive's, or it is another sequence (exit 1, naming the\n"
    "first position that differs); not compared with --continues.\n"
    "  --positions A:B       append the cache's positions A..B-1 only, A < B (B may\n"
    "                        be left out: to the end)\n"
    "  --new                 the cache holds the whole sequence so far: append\n"
    "                        only its positions from the archive's count on\n"
    "  --continues           the cache's positions are new ones that continue the\n"
    "                        archive: its first appended position becomes the\n"
    "                        archive's next one (needed when they do not line up)\n"
    "Commits:\n"
    "  --commit-every N      commit after every N positions (one commit)\n"
    "  --sync commit|none    fdatasync every commit (default), or only once at the end\n"
    "  --recover             cut off a torn tail first (spec 7.7; else refused)\n"
    "  --compact-at RATIO    after a commit that leaves the archive larger than\n"
    "                        RATIO x its live bytes (its size once compacted),\n"
    "                        rewrite it as 'fkvf compact' would and rename the\n"
    "                        result over it (RATIO > 1; default 1.4: at most ~1.4x\n"
    "                        the compacted size after every commit, ~2.5 bytes\n"
    "                        rewritten per byte appended; docs/appending.md)\n"
    "  --no-auto-compact     never compact automatically (the file keeps every\n"
    "                        commit until 'fkvf compact')\n"
    "  --codebooks FILE      the codebook file of an archive that refers to one\n"
    "                        (default: found by content hash in the archive's\n"
    "                        directory, then in FKVF_CODEBOOK_PATH; docs/codebooks.md)\n"
    "  --tokens              token ids are required: fail if the cache has none or\n"
    "                        the archive has no token stream (default: stored when\n"
    "                        both have them)\n"
    "  --beam B              beam width for encoding archived positions (1: greedy)\n"
    "  --layout hnd|nhd      the cache's tensors heads-first [H, T, D] (default) or\n"
    "                        positions-first [T, H, D] (docs/cache-files.md)\n"
    "  --model MODEL.gguf    CACHE is a llama.cpp state file saved with this model\n"
    "                        (docs/llamacpp.md; with --new: fkvf import-llama --append)\n"
    "  --threads N           threads (default: every CPU this process may use,\n"
    "                        or FKVF_THREADS); the output is the same for any N\n"
    "  --json                print one JSON object (on failure {\"error\":{...}},\n"
    "                        docs/cli.md)\n"
    "\n"
    "With --create (ARCHIVE must not exist and is never replaced, there is no\n"
    "--force; the cache's positions are its first: A = 0, or --continues):\n"
    "  --codebooks FILE      a codebook file from 'fkvf train', referred to by content\n"
    "                        hash (keys mode and RoPE from its train.* metadata)\n"
    "  --embed               embed a copy of the --codebooks file instead\n"
    "  --train               train codebooks on this cache's appended positions and\n"
    "                        embed them (default): --k N --k-stages N (4) --v-stages N\n"
    "                        (2) (or --layer-stages K:V,... a pair a layer) --seed S\n"
    "                        --iters N (25) --f32. k by the rule of fkvf\n"
    "                        pack for the rows trained on when --k is not given: the\n"
    "                        largest power of two from 16 to 256 whose codebook takes at\n"
    "                        most 1/4 of their fp16 bytes, k <= rows / 4; k = 16 with a\n"
    "                        warning when even 16 breaks it. A given --k is used, with\n"
    "                        a warning when its codebook is larger than those rows or\n"
    "                        k > rows / 4 (docs/codebooks.md). The codebook serves every\n"
    "                        later append: for small caches a shared one from fkvf train\n"
    "                        (--codebooks) compresses better\n"    "  --max-train-positions N|all  with --train: train on at most N of the\n"
    "                        positions appended (at least 64), runs of 64 chosen by\n"
    "                        --seed as fkvf train does (default: as many as 1 GiB of\n"
    "                        rows hold; 0 or all: every one)\n"
    "  --exact-only          no codebook: every position stays exact\n"
    "  --sinks S             leading exact positions (4)\n"
    "  --recent W            trailing exact positions, the window (32)\n"
    "  --codec quad|ngon     index stream codec (quad)\n"
    "  --keys pre-rope|as-is archive keys before RoPE (default) or as cached\n"
    "  --rope-theta X        RoPE base (10000); --rope-dims N (key_dim);\n"
    "  --rope-layout interleaved|half-split (interleaved; half-split for Hugging\n"
    "                        Face tensor names, said on stderr); --no-rope; a\n"
    "                        warning when the keys do not look rotated that way\n"
    "  --no-tokens           no token stream even if the cache has token ids\n"
    "  --token-bits N        quad width of the token stream, even 2..32\n"
    "                        (default: 16, or wider when the cache needs it)\n"
    "  --model-id STR, --tokenizer-id STR   descriptor ids\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (a cache that does not match, positions\n"
    "that overlap the archive or leave a gap, an archive that another append\n"
    "changed after the positions were checked, a torn or invalid archive, a wrong\n"
    "codebook; --create and ARCHIVE exists or is an input), 2 usage or I/O error\n"
    "(bad option, a path that does not exist, the archive is locked by another\n"
    "appender).\n";

typedef struct append_opts {
    const char *archive, *cache, *cbfile;
    int create, json, recover, req_tokens, no_tokens, embed, train, exact_only, f32, newonly;
    int continues, no_auto_compact;
    int range_set, end_set, layout;
    double compact_at; /* 0: the library's default */
    cli_code_opts code;
    cli_key_opts keys;
    uint64_t range0, range1, every, tok_bits;
    unsigned sync;
} append_opts;

/* A flag (an option without a value): its field set, 1; 0 when a is none.
 * *create_opt: the flag when it is an option of --create. */
static int append_flag(append_opts *o, const char *a, const char **create_opt)
{
    const struct {
        const char *name;
        int *field;
        int create_only;
    } flags[] = {
        {"--create", &o->create, 0},       {"--json", &o->json, 0},
        {"--recover", &o->recover, 0},     {"--tokens", &o->req_tokens, 0},
        {"--new", &o->newonly, 0},         {"--continues", &o->continues, 0},
        {"--no-tokens", &o->no_tokens, 1}, {"--embed", &o->embed, 1},
        {"--train", &o->train, 1},         {"--exact-only", &o->exact_only, 1},
        {"--f32", &o->f32, 1},             {"--no-rope", &o->keys.no_rope, 1},
        {"--no-auto-compact", &o->no_auto_compact, 0},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (strcmp(a, flags[i].name))
            continue;
        *flags[i].field = 1;
        if (flags[i].create_only)
            *create_opt = a;
        return 1;
    }
    return 0;
}

/* --positions A:B or A: (to the end). */
static int append_opt_positions(append_opts *o, const char *v)
{
    const char *colon = strchr(v, ':');
    char head[32];
    size_t hl = colon ? (size_t)(colon - v) : strlen(v);
    if (!colon || hl >= sizeof head)
        return cli_usage("--positions: '%s' is not A:B or A:", v), -1;
    memcpy(head, v, hl);
    head[hl] = 0;
    if (cli_parse_u64(head, UINT32_MAX, &o->range0) ||
        (colon[1] && cli_parse_u64(colon + 1, UINT32_MAX, &o->range1)) ||
        (colon[1] && o->range1 <= o->range0))
        return cli_usage("--positions: '%s' is not A:B (A < B) or A:", v), -1;
    o->range_set = 1;
    o->end_set = colon[1] != 0;
    return 0;
}

/* An option a with its value v: 0, or -1 after a usage error.
 * *create_opt: a when it is an option of --create. */
static int append_value(append_opts *o, const char *a, const char *v, const char **create_opt)
{
    int kr;
    if (!strcmp(a, "--codebooks")) {
        o->cbfile = v;
    } else if (!strcmp(a, "--commit-every")) {
        if (cli_parse_u64(v, UINT32_MAX, &o->every) || o->every < 1)
            return cli_usage("--commit-every: '%s' is not a count >= 1", v), -1;
    } else if (!strcmp(a, "--sync")) {
        if (!strcmp(v, "commit"))
            o->sync = FKVF_SYNC_COMMIT;
        else if (!strcmp(v, "none"))
            o->sync = FKVF_SYNC_NONE;
        else
            return cli_usage("--sync: '%s' is not commit or none", v), -1;
    } else if (!strcmp(a, "--beam")) {
        return cli_opt_beam(v, &o->code.beam) ? -1 : 0;
    } else if (!strcmp(a, "--compact-at")) {
        if (cli_parse_f64(v, &o->compact_at) || !(o->compact_at > 1 && o->compact_at <= 1e6))
            return cli_usage("--compact-at: '%s' is not a ratio > 1 (and <= 1e6)", v), -1;
    } else if (!strcmp(a, "--layout")) {
        return cli_opt_layout(v, &o->layout) ? -1 : 0;
    } else if (!strcmp(a, "--positions")) {
        return append_opt_positions(o, v);
    } else if (!strcmp(a, "--model")) {
        return cli_llama_set_model(v);
    } else {
        /* options of --create */
        *create_opt = a;
        if ((kr = cli_code_value(&o->code, a, v)) != 0 ||
            (kr = cli_key_value(&o->keys, a, v)) != 0)
            return kr < 0 ? -1 : 0;
        if (strcmp(a, "--token-bits"))
            return cli_usage("unknown option '%s' (see fkvf append --help)", a), -1;
        if (cli_parse_u64(v, 32, &o->tok_bits) || o->tok_bits < 2 || o->tok_bits % 2)
            return cli_usage("--token-bits: '%s' is not an even width 2..32", v), -1;
    }
    return 0;
}

/* The options together: what excludes what, --create's defaults. 0 or -1
 * after a usage error. */
static int append_check_opts(append_opts *o, const char *create_opt)
{
    if (!o->archive || !o->cache)
        return cli_usage("need ARCHIVE and CACHE (see fkvf append --help)"), -1;
    if (create_opt && !o->create)
        return cli_usage("%s is an option of --create (an existing archive keeps its settings)",
                         create_opt), -1;
    if (o->compact_at != 0 && o->no_auto_compact)
        return cli_usage("--compact-at and --no-auto-compact exclude each other"), -1;
    if (o->create) {
        int n = (o->cbfile != NULL) + o->train + o->exact_only;
        if (n > 1)
            return cli_usage("--create: --codebooks, --train and --exact-only exclude each other"),
                   -1;
        if (o->embed && !o->cbfile)
            return cli_usage("--create: --embed needs --codebooks FILE"), -1;
        if (n == 0)
            o->train = 1;
        if (o->req_tokens && o->no_tokens)
            return cli_usage("--create: --tokens and --no-tokens exclude each other"), -1;
    }
    if (o->newonly && o->range_set)
        return cli_usage("--new and --positions exclude each other"), -1;
    if (o->newonly && o->continues)
        return cli_usage("--new and --continues exclude each other (--new appends the cache's "
                         "positions from the archive's count on: they line up)"), -1;
    return 0;
}

/* 0: run, 1: --help printed, -1: a usage error printed. */
static int append_parse(int argc, char **argv, append_opts *o)
{
    memset(o, 0, sizeof *o);
    cli_code_opts_init(&o->code);
    cli_key_opts_init(&o->keys);
    o->sync = FKVF_SYNC_COMMIT;
    const char *create_opt = NULL; /* the last option of --create given */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(append_help, stdout);
            return 1;
        }
        if (append_flag(o, a, &create_opt))
            continue;
        if (a[0] == '-' && a[1]) {
            if (!v)
                return cli_usage("%s needs a value (or is unknown; see fkvf append --help)", a),
                       -1;
            i++;
            if (append_value(o, a, v, &create_opt))
                return -1;
        } else if (!o->archive) {
            o->archive = a;
        } else if (!o->cache) {
            o->cache = a;
        } else {
            return cli_usage("unexpected argument '%s'", a), -1;
        }
    }
    return append_check_opts(o, create_opt);
}

typedef struct append_state {
    kvio_cache c;
    fkvf_reader *r;   /* the archive, before appending (not --create) */
    fkvf_reader *cb;  /* codebook file */
    fkvf_rvq *q;      /* --create: the quantizer to embed */
    fkvf_appender *a;
    uint8_t *rows;  /* --create --train: every row appended (the training set), else NULL */
    uint8_t *chunk; /* else: the rows of one fkvf_appender_append, read from the cache */
    uint32_t *tok;
    uint32_t k_trained; /* --create --train: the k of the codebook trained */
    uint64_t n_trained; /* and the positions it was trained on */
} append_state;

static void append_free(append_state *s)
{
    fkvf_appender_free(s->a);
    kvio_cache_free(&s->c);
    fkvf_reader_free(s->r);
    fkvf_reader_free(s->cb);
    fkvf_rvq_free(s->q);
    free(s->rows);
    free(s->chunk);
    free(s->tok);
}

/* The cache against the archive's descriptor. */
static int check_shape(const append_opts *o, const kvio_cache *c, const fkvf_desc *d)
{
    const char *field = NULL;
    uint64_t got = 0, want = 0;
    if (c->n_layers != d->n_layers)
        field = "layers", got = c->n_layers, want = d->n_layers;
    else if (c->n_kv_heads != d->n_kv_heads)
        field = "kv_heads", got = c->n_kv_heads, want = d->n_kv_heads;
    else if (c->key_dim != d->key_dim)
        field = "key_dim", got = c->key_dim, want = d->key_dim;
    else if (c->value_dim != d->value_dim)
        field = "value_dim", got = c->value_dim, want = d->value_dim;
    if (field)
        return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o->cache,
                        "%s is %" PRIu64 ", the archive %s has %" PRIu64
                        " (the cache does not match the archive's descriptor)",
                        field, got, o->archive, want);
    if (c->dtype != d->dtype)
        return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o->cache,
                        "dtype is %s, the archive %s has %s (the cache does not match the "
                        "archive's descriptor; convert it, e.g. fkvf unpack --dtype)",
                        kvio_dtype_name(c->dtype), o->archive, kvio_dtype_name(d->dtype));
    return CLI_OK;
}

/* --create --train: the blocks of the rows trained on, in s->rows (the
 * positions p0..p1 appended, which are positions 0.. of the new archive):
 * their sample when there are more than the budget (fkvf train's rule,
 * cli_sample.h). *blocks malloc'd. Returns the exit status. */
static int append_train_blocks(const append_opts *o, append_state *s, uint32_t p0,
                               uint32_t p1, fkvf_rows **blocks, size_t *n)
{
    const kvio_cache *c = &s->c;
    const size_t rb = cli_cache_row_bytes(c);
    uint64_t np = p1 - p0;
    cli_run *runs;
    int ex = cli_train_sample(o->cache, &np, 1, rb, o->code.max_train, o->code.seed, &runs, n,
                              &s->n_trained);
    if (ex != CLI_OK)
        return ex;
    *blocks = calloc(*n ? *n : 1, sizeof **blocks);
    for (size_t r = 0; *blocks && r < *n; r++)
        (*blocks)[r] = (fkvf_rows){s->rows + (size_t)runs[r].first * rb, (size_t)runs[r].n,
                                   c->dtype, runs[r].first};
    free(runs);
    return *blocks ? CLI_OK : cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->cache, "out of memory");
}

/* --create: the descriptor and the codebook from the options and the cache.
 * Then fkvf_appender_create. */
static int append_create(append_opts *o, append_state *s, uint32_t p0, uint32_t p1)
{
    kvio_cache *c = &s->c;
    int rc;
    fkvf_codebook_shape shape;
    memset(&shape, 0, sizeof shape);
    if (o->cbfile &&
        (rc = cli_load_codebook_file(o->cbfile, c, &o->keys, &s->cb, &shape, NULL,
                                     o->embed ? &s->q : NULL, 0)) != CLI_OK)
        return rc;
    cli_keys_hf_default(&o->keys, c, o->cache);
    fkvf_rope rope;
    const fkvf_rope *krope;
    if (cli_key_rope(&o->keys, c->key_dim, o->cache, &rope, &krope))
        return CLI_USAGE;
    if (krope && (s->q || s->cb || o->train)) {
        /* the rows p0.. are positions 0.. of the new archive */
        cli_rope_report rr;
        int ex = cli_rope_measure(c, p0, p1, 0, &rope, 1, &rr);
        if (ex > 0)
            return ex;
        if (ex == 0) {
            rr.codebook = s->cb ? o->cbfile : NULL;
            cli_rope_warn(o->cache, &rr);
        }
    }
    if (o->train) {
        if (p1 == p0)
            return cli_fail(CLI_INVALID, FKVF_E_RANGE, o->cache,
                            "no positions to train codebooks on");
        /* k: the rule of fkvf pack (docs/codebooks.md, one copy in
         * cli_codebook.c) for the rows it is trained on, when --k is not
         * given; a given --k that wastes bytes is warned about */
        uint64_t n_train = p1 - p0;
        uint32_t k = o->code.k;
        /* the --layer-stages table when it fits the cache (else training refuses it) */
        const uint8_t *lst = o->code.n_lst == c->n_layers ? o->code.lst : NULL;
        const char *advice = "the archive keeps this codebook for every later append; for small "
                             "caches a shared codebook compresses better: train it once (fkvf "
                             "train CACHE... -o CODEBOOKS) and create with --codebooks CODEBOOKS";
        if (o->code.ks + o->code.vs > 0 && !o->code.k_set) {
            k = cli_auto_k(c, n_train, o->code.ks, o->code.vs, lst, o->f32);
            if (!k) {
                k = CLI_CB_K_MIN;
                cli_warn_k_min(o->cache, c, n_train, "positions to train the codebook on",
                               o->code.ks, o->code.vs, lst, o->f32, advice);
            }
        } else if (o->code.ks + o->code.vs > 0) {
            cli_warn_codebook(o->cache, c, k,
                              cli_cb_bytes(c, k, o->code.ks, o->code.vs, lst, o->f32, 0),
                              n_train, n_train, "rows it is trained on", "rows it is trained on",
                              advice);
        }
        s->k_trained = k;
        fkvf_rvq_params prm;
        cli_rvq_params_for(&prm, c);
        prm.k = k;
        prm.k_stages = o->code.ks;
        prm.v_stages = o->code.vs;
        int bad;
        prm.layer_stages = cli_layer_table(o->code.lst, o->code.n_lst, c->n_layers, &bad);
        if (bad)
            return CLI_USAGE;
        prm.table_dtype = o->f32 ? FKVF_DTYPE_F32 : FKVF_DTYPE_F16;
        prm.seed = o->code.seed;
        prm.max_iters = o->code.iters;
        prm.key_rope = krope;
        cli_progress b;
        cli_progress_init(&b, "train ", o->json);
        prm.progress = cli_progress_cb;
        prm.progress_opaque = &b;
        fkvf_rows *blocks;
        size_t nb;
        if ((rc = append_train_blocks(o, s, p0, p1, &blocks, &nb)) != CLI_OK)
            return rc;
        prm.n_threads = cli_threads();
        rc = fkvf_rvq_train(&s->q, &prm, blocks, nb, NULL);
        free(blocks);
        if (rc != FKVF_OK)
            return cli_fail(rc == FKVF_E_NOMEM ? CLI_USAGE : CLI_INVALID, rc, o->cache,
                            "training failed: %s", fkvf_strerror(rc));
    }
    fkvf_desc d;
    cli_desc_for(&d, c, &rope, o->keys.no_rope, krope);
    d.n_sinks = (uint32_t)o->code.sinks;
    d.window = (uint32_t)o->code.recent;
    d.model_id = o->code.model_id;
    d.tokenizer_id = o->code.tok_id;

    fkvf_append_create cr;
    memset(&cr, 0, sizeof cr);
    cr.desc = &d;
    if (s->q) {
        cr.codebook = s->q;
    } else if (s->cb) {
        cr.codebook_ref = s->cb;
        cr.codebook_name = cli_base_name(o->cbfile);
    }
    if (o->code.ngon && (s->q || s->cb)) {
        cr.index_codec.profile = FKVF_PROFILE_NGON;
        cr.index_codec.alphabet = s->q ? 0 : shape.k;
        if (s->q) {
            fkvf_codebook_shape qs;
            uint32_t heads;
            fkvf_rvq_shape(s->q, &qs, &heads);
            cr.index_codec.alphabet = qs.k;
        }
    }
    int want_tok = c->tokens && !o->no_tokens;
    if (want_tok) {
        int64_t mx = 0;
        for (uint32_t t = 0; t < c->n_positions; t++)
            mx = c->tokens[t] > mx ? c->tokens[t] : mx;
        unsigned bits = o->tok_bits ? (unsigned)o->tok_bits : 16;
        if ((uint64_t)mx > UINT32_MAX)
            return cli_fail(CLI_INVALID, FKVF_E_RANGE, o->cache,
                            "token ids above 2^32-1 cannot be stored (use --no-tokens)");
        if (!o->tok_bits && fkvf_quad_bits_for((uint64_t)mx) > bits)
            bits = fkvf_quad_bits_for((uint64_t)mx);
        cr.token_codec.profile = FKVF_PROFILE_QUAD;
        cr.token_codec.symbol_bits = bits;
    }
    fkvf_append_options ao;
    fkvf_append_options_init(&ao);
    ao.sync = o->sync;
    ao.beam_width = o->code.beam;
    ao.n_threads = cli_threads();
    ao.compact_ratio = o->compact_at;
    ao.no_auto_compact = o->no_auto_compact;
    rc = fkvf_appender_create(&s->a, o->archive, &cr, &ao, NULL);
    if (rc == FKVF_E_EXISTS)
        return cli_fail(CLI_INVALID, rc, o->archive,
                        "appeared while it was created; not replaced");
    if (rc != FKVF_OK)
        return cli_fail_appender(rc, s->a, o->archive, "");
    if (o->cbfile && !o->embed) {
        /* the appender borrowed the codebook file during open only */
        fkvf_reader_free(s->cb);
        s->cb = NULL;
    }
    return CLI_OK;
}

/* The refusal of an append whose cache positions [p0, p1) do not start at
 * the archive's count N (an overlap or a gap): what the archive holds and
 * what to pass. */
static int misaligned(const append_opts *o, uint32_t p0, uint32_t p1, uint64_t N,
                      uint32_t cache_n)
{
    char holds[96], what[160], next[160];
    if (N)
        snprintf(holds, sizeof holds, "holds positions 0..%" PRIu64, N - 1);
    else
        snprintf(holds, sizeof holds, "holds no positions yet");
    if (!o->range_set)
        snprintf(what, sizeof what, "the whole cache (positions 0..%u) would follow them",
                 cache_n - 1);
    else if (p0 < N)
        snprintf(what, sizeof what, "cache positions %u..%" PRIu64 " are in it already (an overlap)",
                 p0, (uint64_t)p1 - 1 < N - 1 ? (uint64_t)p1 - 1 : N - 1);
    else
        snprintf(what, sizeof what, "positions %" PRIu64 "..%u would be missing (a gap)", N,
                 p0 - 1);
    if (N < cache_n)
        snprintf(next, sizeof next, "append what is new with --positions %" PRIu64 ":%s%s",
                 N, o->end_set && o->range1 > N ? "B" : "", o->create ? "" : " (or --new)");
    else
        snprintf(next, sizeof next, "the cache holds nothing after position %" PRIu64, N - 1);
    return cli_fail(CLI_INVALID, FKVF_E_RANGE, o->cache,
                    "%s starts at cache position %u, but the archive %s %s: %s. A cache's "
                    "position p is sequence position p, so the append must start at cache "
                    "position %" PRIu64 ": %s; if the cache's positions are new ones that "
                    "continue the archive (cache position %u becomes position %" PRIu64
                    "), add --continues",
                    o->range_set ? "--positions" : "the append", p0, o->archive, holds, what, N,
                    next, p0, N);
}

/* The cache holds the sequence from position 0 on: where it overlaps what
 * the archive holds, positions [0, m), its token ids must be the ids of the
 * archive's token stream (stream ti of r). CLI_OK, or exit 1 naming the
 * first position that differs and both ids. */
static int check_token_overlap(const append_opts *o, fkvf_reader *r, size_t ti,
                               const kvio_cache *c, uint64_t m)
{
    enum { CHUNK = 4096 };
    uint32_t buf[CHUNK];
    for (uint64_t t0 = 0; t0 < m; t0 += CHUNK) {
        size_t n = m - t0 < CHUNK ? (size_t)(m - t0) : CHUNK;
        int rc = fkvf_reader_stream_read(r, ti, t0, buf, n);
        if (rc != FKVF_OK)
            return cli_fail_reader(rc, r, o->archive, "reading the token stream: ");
        for (size_t i = 0; i < n; i++) {
            int64_t want = (int64_t)buf[i], got = c->tokens[t0 + i];
            if (got == want)
                continue;
            return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o->cache,
                            "token id %" PRId64 " at cache position %" PRIu64 ", the archive %s "
                            "has token id %" PRId64 " at position %" PRIu64 ": the cache is not "
                            "the sequence the archive holds (its positions 0..%" PRIu64 " must "
                            "be the archive's, a cache's position p is sequence position p); "
                            "nothing appended. If the cache's positions are new ones that "
                            "continue the archive, add --continues",
                            got, t0 + i, o->archive, want, t0 + i, m - 1);
        }
    }
    return CLI_OK;
}

/* What an append works with, from the checks to the printout. */
typedef struct append_run {
    append_opts *o; /* append_create completes its key options */
    append_state *s;
    /* the archive before the append (not --create) */
    uint64_t before_size, before_n, before_commits;
    uint64_t sinks, window; /* the descriptor's */
    fkvf_stream_info tsi;   /* its token stream, when arch_tok */
    size_t ti;
    int arch_tok, pre_rope;
    /* what is appended: cache positions [p0, p1), with token ids or not */
    uint32_t p0, p1, n;
    int use_tok;
    size_t rb;
    uint64_t recovered, commits;
    fkvf_append_info as;
} append_run;

/* --create: the new archive is an output: never an input, never a file that
 * exists (--create has no --force). */
static int append_check_create(const append_opts *o)
{
    const char *inputs[] = {o->cache, o->cbfile};
    int ex = cli_check_output(o->archive, inputs, 2, 1);
    if (ex != CLI_OK)
        return ex;
    struct stat st;
    if (lstat(o->archive, &st) == 0)
        return cli_fail(CLI_INVALID, FKVF_E_EXISTS, o->archive,
                        "exists; --create never replaces a file (append to it without "
                        "--create)");
    cli_warn_fkvf_name(o->archive, "archive");
    return CLI_OK;
}

/* The archive as it is: descriptor, token stream, torn tail; the cache
 * must match its descriptor. */
static int append_read_archive(append_run *u)
{
    const append_opts *o = u->o;
    append_state *s = u->s;
    int ex, rc;
    if ((ex = cli_open_archive(&s->r, o->archive)) != CLI_OK)
        return ex;
    fkvf_archive_info ai;
    fkvf_desc d;
    if ((rc = fkvf_reader_info(s->r, &ai)) != FKVF_OK ||
        (rc = fkvf_reader_desc(s->r, &d)) != FKVF_OK)
        return cli_fail_reader(rc, s->r, o->archive, "");
    if (ai.torn_bytes && !o->recover)
        return cli_fail(CLI_INVALID, FKVF_E_TORN, o->archive,
                        "torn tail: %" PRIu64 " bytes after commit %" PRIu64
                        " (an append that did not complete); nothing appended. Run 'fkvf "
                        "recover %s' (or append with --recover) to cut it off first (spec 7.7)",
                        ai.torn_bytes, ai.n_commits, o->archive);
    if ((ex = check_shape(o, &s->c, &d)))
        return ex;
    u->before_size = ai.committed_size;
    u->before_n = ai.n_positions;
    u->before_commits = ai.n_commits;
    u->sinks = d.n_sinks;
    u->window = d.window;
    u->pre_rope = d.key_transform == 1 && d.key_storage == 1;
    u->arch_tok = fkvf_reader_stream_find(s->r, FKVF_STREAM_ID_TOKENS, &u->ti) == FKVF_OK &&
                  fkvf_reader_stream_info(s->r, u->ti, &u->tsi) == FKVF_OK;
    return cli_attach_codebook(s->r, o->archive, o->cbfile, &s->cb, NULL, 0);
}

/* Which cache positions: --positions, --new, or all. */
static int append_positions(append_run *u)
{
    const append_opts *o = u->o;
    const kvio_cache *c = &u->s->c;
    u->p0 = 0;
    u->p1 = c->n_positions;
    if (o->range_set) {
        u->p0 = (uint32_t)o->range0;
        u->p1 = o->end_set ? (uint32_t)o->range1 : c->n_positions;
        if (u->p1 > c->n_positions || u->p0 > u->p1) {
            char b[24] = "";
            if (o->end_set)
                snprintf(b, sizeof b, "%" PRIu64, o->range1);
            return cli_fail(CLI_INVALID, FKVF_E_RANGE, o->cache,
                            "--positions %" PRIu64 ":%s: the cache has %u positions", o->range0, b,
                            c->n_positions);
        }
    } else if (o->newonly && !o->create) {
        if (u->before_n > c->n_positions)
            return cli_fail(CLI_INVALID, FKVF_E_RANGE, o->cache,
                            "--new: the cache has %u positions, the archive %s already %" PRIu64
                            " (an earlier save of the sequence, or another one)",
                            c->n_positions, o->archive, u->before_n);
        u->p0 = (uint32_t)u->before_n;
    }
    u->n = u->p1 - u->p0;
    return CLI_OK;
}

/* The --model of a llama.cpp state appended is the model the archive was
 * imported with: the descriptor's weights hash (kind 2, XXH3-128 of the
 * GGUF file). Not hashed again when the file is the one hashed then (its
 * size, mtime, device and inode are the archive's llama.model_stat): an
 * engine saving every N tokens does not read a many-GB model per save.
 * Returns the exit status. */
static int append_same_model(append_run *u)
{
    const append_opts *o = u->o;
    fkvf_reader *r = u->s->r;
    fkvf_desc d;
    if (fkvf_reader_desc(r, &d) != FKVF_OK || d.weights_hash_kind != 2)
        return CLI_OK;
    char now[160];
    fkvf_meta_entry e;
    if (cli_llama_model_stat(now, sizeof now) == 0 &&
        fkvf_reader_meta_find(r, "llama.model_stat", &e) == FKVF_OK &&
        e.type == FKVF_META_UTF8 && e.value_len == strlen(now) &&
        !memcmp(e.value, now, e.value_len))
        return CLI_OK; /* the same file as hashed at import */
    int ex;
    const uint8_t *hash = cli_llama_model_hash(&ex);
    if (!hash)
        return ex;
    if (!memcmp(d.weights_hash, hash, 16))
        return CLI_OK;
    char a[33], b[33];
    cli_hex16(d.weights_hash, a);
    cli_hex16(hash, b);
    return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o->archive,
                    "imported with another model (weights hash %s; --model %s has %s): a state "
                    "of this model does not continue it",
                    a, cli_llama_model_path(), b);
}

/* A llama.cpp state appended to an archive imported from one (fkvf
 * import-llama --append): the same context settings (the llama.* entries of
 * the state, but the model's file name, are the archive's: else its export
 * would not be this save), and the state's rows at the archive's exact
 * positions before p0 are the archive's, bit for bit (a save of another
 * sequence, with or without token ids, differs there). Returns the exit
 * status. */
static int append_check_llama(append_run *u)
{
    const append_opts *o = u->o;
    const kvio_cache *c = &u->s->c;
    fkvf_reader *r = u->s->r;
    if (o->create || c->names != KVIO_NAMES_LLAMA)
        return CLI_OK;
    int ex = append_same_model(u);
    if (ex != CLI_OK)
        return ex;
    fkvf_meta_entry kind;
    if (fkvf_reader_meta_find(r, "llama.kind", &kind) != FKVF_OK)
        return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o->archive,
                        "not imported from a llama.cpp state file (no llama.kind metadata): "
                        "append llama.cpp states to an archive fkvf import-llama made");
    for (size_t i = 0; i < c->n_meta; i++) {
        const char *k = c->meta[i].key, *v = c->meta[i].value;
        if (strncmp(k, "llama.", 6) || !strcmp(k, "llama.model") ||
            !strcmp(k, "llama.model_arch") || !strcmp(k, "llama.model_stat"))
            continue;
        fkvf_meta_entry e;
        int have = fkvf_reader_meta_find(r, k, &e) == FKVF_OK && e.type == FKVF_META_UTF8;
        if (have && e.value_len == strlen(v) && !memcmp(e.value, v, e.value_len))
            continue;
        return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o->cache,
                        "%s is %s, and %s holds states with %s %.*s: a save of another context "
                        "(its export would not be this save); import it into an archive of "
                        "its own",
                        k, v, o->archive, k, have ? (int)(e.value_len > 64 ? 64 : e.value_len) : 4,
                        have ? (const char *)e.value : "none");
    }
    uint32_t n = u->p0 < u->before_n ? u->p0 : (uint32_t)u->before_n;
    size_t rb = cli_cache_row_bytes(c);
    uint8_t *row = malloc(rb ? rb : 1);
    if (!row)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->cache, "out of memory");
    for (uint32_t p = 0; p < n && ex == CLI_OK; p++) {
        int exact = 0;
        const void *ar;
        size_t arb;
        if (fkvf_reader_is_exact(r, p, &exact) != FKVF_OK || !exact)
            continue;
        int rc = fkvf_reader_exact_row(r, p, &ar, &arb);
        if (rc != FKVF_OK) {
            ex = cli_fail_reader(rc, r, o->archive, "");
            break;
        }
        if ((ex = cli_cache_rows(c, p, p + 1, row)) != CLI_OK)
            break;
        if (arb != rb || memcmp(ar, row, rb))
            ex = cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o->cache,
                          "position %u differs from %s's (an exact position): a save of another "
                          "sequence, not a later save of the one it holds",
                          p, o->archive);
    }
    free(row);
    return ex;
}

/* Token ids: stored when both the cache and the archive (or --create) have
 * them; --tokens requires them; they must fit the archive's stream. */
static int append_tokens(append_run *u)
{
    const append_opts *o = u->o;
    const kvio_cache *c = &u->s->c;
    u->use_tok = 0;
    if (o->create) {
        u->use_tok = c->tokens && !o->no_tokens;
        if (o->req_tokens && !c->tokens)
            return cli_fail(CLI_INVALID, FKVF_E_NOT_FOUND, o->cache,
                            "--tokens: the cache holds no token ids");
    } else if (u->arch_tok) {
        if (!c->tokens)
            return cli_fail(CLI_INVALID, FKVF_E_NOT_FOUND, o->cache,
                            "the archive %s has a token stream, the cache holds no token ids",
                            o->archive);
        u->use_tok = 1;
        uint64_t alpha = alphabet_of(&u->tsi);
        for (uint32_t t = u->p0; t < u->p1; t++)
            if (c->tokens[t] < 0 || (uint64_t)c->tokens[t] >= alpha)
                return cli_fail(CLI_INVALID, FKVF_E_RANGE, o->cache,
                                "token id %" PRId64 " at position %u does not fit the archive's "
                                "token stream (symbols below %" PRIu64 ")",
                                c->tokens[t], t, alpha);
    } else if (c->tokens) {
        if (o->req_tokens)
            return cli_fail(CLI_INVALID, FKVF_E_NOT_FOUND, o->archive,
                            "--tokens: the archive has no token stream");
        if (!o->json)
            cli_note("%s has no token stream; the token ids of %s are not stored", o->archive,
                     o->cache);
    } else if (o->req_tokens) {
        return cli_fail(CLI_INVALID, FKVF_E_NOT_FOUND, o->cache,
                        "--tokens: the cache holds no token ids");
    }
    return CLI_OK;
}

/* A cache's position p is sequence position p: what is appended starts at
 * the archive's count, unless the user says that the cache's positions are
 * new ones that continue the archive. */
static int append_check_alignment(append_run *u)
{
    const append_opts *o = u->o;
    const kvio_cache *c = &u->s->c;
    int ex;
    if (u->n && u->p0 != u->before_n && !o->continues)
        return misaligned(o, u->p0, u->p1, u->before_n, c->n_positions);
    /* the positions line up: then the cache's token ids where it overlaps
     * the archive (cache positions [0, min(N, T))) must be the archive's,
     * or a different sequence would be continued without a word; with
     * --continues the cache's positions are new ones and overlap nothing */
    if (u->arch_tok && c->tokens && !o->continues) {
        uint64_t m = u->before_n < c->n_positions ? u->before_n : c->n_positions;
        m = u->tsi.length < m ? u->tsi.length : m;
        if ((ex = check_token_overlap(o, u->s->r, u->ti, c, m)) != CLI_OK)
            return ex;
    }
    if (o->create)
        u->pre_rope = o->keys.pre_rope && !o->keys.no_rope;
    if (u->n && u->p0 != u->before_n)
        cli_warn("%s: --continues: cache positions %u..%u become positions %" PRIu64 "..%" PRIu64
                 " of %s%s",
                 o->cache, u->p0, u->p1 - 1, u->before_n, u->before_n + u->n - 1, o->archive,
                 u->pre_rope ? "; keys are un-rotated at the archive's positions (spec 8.1)" : "");
    return CLI_OK;
}

/* rows read from the cache and handed to the appender at a time: the
 * appender queues them (its own bound, fkvf.h) and writes what is decided
 * as it goes, so memory does not grow with the cache */
#define APPEND_CHUNK_BYTES ((size_t)16 << 20)

/* The token ids of the positions appended; with --create --train every row
 * (the codebook is trained on them), in the archive's row layout. Without
 * it the rows are read a chunk at a time while appending (append_rows). */
static int append_gather(append_run *u)
{
    const append_opts *o = u->o;
    append_state *s = u->s;
    const kvio_cache *c = &s->c;
    u->rb = cli_cache_row_bytes(c);
    s->tok = malloc(sizeof *s->tok * (u->n ? u->n : 1));
    if (!s->tok)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->cache, "out of memory");
    for (uint32_t t = 0; u->use_tok && t < u->n; t++)
        s->tok[t] = (uint32_t)c->tokens[u->p0 + t];
    if (!(o->create && o->train))
        return CLI_OK;
    if (u->n && (u->rb > SIZE_MAX / u->n || !(s->rows = malloc(u->rb * u->n))))
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->cache, "out of memory");
    return u->n ? cli_cache_rows(c, u->p0, u->p1, s->rows) : CLI_OK;
}

/* The appender: a new archive (--create), or the archive opened and locked,
 * which must still be the one the positions were checked against. */
static int append_open(append_run *u)
{
    const append_opts *o = u->o;
    append_state *s = u->s;
    int ex, rc;
    if (o->create) {
        if ((ex = append_create(u->o, s, u->p0, u->p1)))
            return ex;
    } else {
        fkvf_reader_free(s->r); /* before a recovery may truncate the file */
        s->r = NULL;
        fkvf_append_options ao;
        fkvf_append_options_init(&ao);
        ao.sync = o->sync;
        ao.beam_width = o->code.beam;
        ao.n_threads = cli_threads();
        ao.recover = o->recover;
        ao.codebook_file = s->cb;
        ao.compact_ratio = o->compact_at;
        ao.no_auto_compact = o->no_auto_compact;
        rc = fkvf_appender_open(&s->a, o->archive, &ao, NULL);
        if (rc != FKVF_OK)
            return cli_fail_appender(rc, s->a, o->archive, "");
        /* borrowed during open only: its mapping goes now */
        fkvf_reader_free(s->cb);
        s->cb = NULL;
    }
    fkvf_appender_info(s->a, &u->as);
    u->recovered = u->as.recovered_bytes;
    /* The positions were checked against the archive as a plain reader saw
     * it, without the lock; the appender holds it from here on. Another
     * append that committed in between would make them overlap (or leave a
     * gap): refuse, with nothing appended. */
    if (!o->create && (u->as.n_positions != u->before_n || u->as.commit_seq != u->before_commits))
        return cli_fail(CLI_INVALID, FKVF_E_RANGE, o->archive,
                        "changed meanwhile (another append or a compact ran in between): it "
                        "held %" PRIu64 " positions (commit %" PRIu64 ") when this append "
                        "checked its positions, %" PRIu64 " positions (commit %" PRIu64
                        ") once locked for appending; nothing appended: run the append again",
                        u->before_n, u->before_commits, u->as.n_positions, u->as.commit_seq);
    if (o->create)
        u->before_size = u->as.file_size;
    return CLI_OK;
}

/* The positions [i, i + m) of the run (cache positions p0 + i ..) queued
 * in the appender a chunk (APPEND_CHUNK_BYTES) at a time, the progress bar
 * moved on; *ex set when the failure was the cache's (its line printed),
 * else the appender's rc. */
static int append_rows(append_run *u, uint64_t i, uint64_t m, cli_progress *b, int *ex)
{
    append_state *s = u->s;
    uint64_t chunk = u->rb ? APPEND_CHUNK_BYTES / u->rb : m;
    if (chunk == 0)
        chunk = 1;
    if (!s->rows && !s->chunk && m &&
        !(s->chunk = malloc((size_t)(u->n < chunk ? u->n : chunk) * u->rb + 1))) {
        *ex = cli_fail(CLI_USAGE, FKVF_E_NOMEM, u->o->cache, "out of memory");
        return FKVF_E_NOMEM;
    }
    for (uint64_t j = 0; j < m; j += chunk) {
        uint64_t k = m - j < chunk ? m - j : chunk, at = i + j;
        const uint8_t *rows = s->rows ? s->rows + (size_t)at * u->rb : s->chunk;
        if (!s->rows && (*ex = cli_cache_rows(&s->c, (uint32_t)(u->p0 + at),
                                              (uint32_t)(u->p0 + at + k), s->chunk)) != CLI_OK)
            return FKVF_E_IO;
        int rc = fkvf_appender_append(s->a, rows, (size_t)k * u->rb, (size_t)k,
                                      u->use_tok ? s->tok + at : NULL);
        if (rc != FKVF_OK)
            return rc;
        if (j + k < m) /* the commit's last piece: once committed */
            cli_progress_cb(b, at + k, u->n);
    }
    return FKVF_OK;
}

/* The commits: every --commit-every positions (one commit by default). */
static int append_commit_all(append_run *u)
{
    const append_opts *o = u->o;
    append_state *s = u->s;
    int rc;
    uint64_t every = o->every ? o->every : (u->n ? u->n : 1);
    u->commits = 0;
    cli_progress b;
    cli_progress_init(&b, "append", o->json);
    for (uint64_t i = 0; i < u->n; i += every) {
        uint64_t m = u->n - i < every ? u->n - i : every;
        int ex = CLI_OK;
        rc = append_rows(u, i, m, &b, &ex);
        if (ex != CLI_OK)
            return ex;
        if (rc == FKVF_OK)
            rc = fkvf_appender_commit(s->a);
        if (rc != FKVF_OK) {
            char pre[600];
            snprintf(pre, sizeof pre,
                     "commit of positions %" PRIu64 "..%" PRIu64 " of %s failed "
                     "(%" PRIu64 " commit(s) of this run are in the file): ",
                     u->p0 + i, u->p0 + i + m - 1, o->cache, u->commits);
            return cli_fail_appender(rc, s->a, o->archive, pre);
        }
        u->commits++;
        if (fkvf_appender_message(s->a)[0]) /* committed; the auto-compaction failed */
            cli_warn("%s: %s (the commit is in the file)", o->archive,
                     fkvf_appender_message(s->a));
        cli_progress_cb(&b, i + m, u->n);
    }
    if (o->sync == FKVF_SYNC_NONE && (rc = fkvf_appender_sync(s->a)) != FKVF_OK)
        return cli_fail_appender(rc, s->a, o->archive, "");
    fkvf_appender_info(s->a, &u->as);
    return CLI_OK;
}

static void append_print(const append_run *u)
{
    const append_opts *o = u->o;
    const fkvf_append_info *as = &u->as;
    uint32_t p0 = u->p0, p1 = u->p1, n = u->n;
    /* an archive without a codebook (fkvf pack makes one for too few
     * positions, or --exact-only) keeps the positions that leave its
     * window exact: said once per run (--create says so in its first line) */
    if (!o->create && n && !as->has_codebook && as->n_positions > u->sinks + u->window &&
        u->s->c.names != KVIO_NAMES_LLAMA) /* a lossless import: exact by design */
        cli_note("%s has no codebook: the positions that leave its recent window stay exact "
                 "(%" PRIu64 " of its %" PRIu64 " positions are outside its %" PRIu64
                 " sinks and %" PRIu64 " recent positions, all stored exact); an archive's "
                 "codebook is chosen when it is made: to store such positions as indices, make "
                 "it with one (fkvf pack --k N, or a shared codebook from fkvf train and "
                 "--codebooks FILE)",
                 o->archive, as->n_positions - u->sinks - u->window, as->n_positions, u->sinks,
                 u->window);
    if (o->json) {
        printf("{\"archive\":");
        cli_json_cstr(stdout, o->archive);
        printf(",\"cache\":");
        cli_json_cstr(stdout, o->cache);
        printf(",\"created\":%s,\"first\":%u,\"archive_first\":%" PRIu64
               ",\"continues\":%s,\"appended\":%u,\"commits\":%" PRIu64
               ",\"commit_seq\":%" PRIu64 ",\"positions\":%" PRIu64 ",\"archived\":%" PRIu64
               ",\"exact\":%" PRIu64 ",\"tokens\":%s,\"recovered_bytes\":%" PRIu64
               ",\"size_before\":%" PRIu64 ",\"size\":%" PRIu64 ",\"bytes_added\":%" PRIu64 "}\n",
               o->create ? "true" : "false", p0, u->before_n, p0 != u->before_n ? "true" : "false",
               n, u->commits, as->commit_seq, as->n_positions, as->n_archived,
               as->n_positions - as->n_archived, u->use_tok ? "true" : "false", u->recovered,
               u->before_size, as->file_size, as->file_size - u->before_size);
        return;
    }
    if (u->recovered)
        printf("%s: recovered: cut off a torn tail of %" PRIu64 " bytes\n", o->archive,
               u->recovered);
    if (o->create && u->s->k_trained)
        printf("%s: created (commit 1: descriptor, codebook trained on %" PRIu64 " positions, "
               "k = %u)\n", o->archive, u->s->n_trained, u->s->k_trained);
    else if (o->create)
        printf("%s: created (commit 1: descriptor%s)\n", o->archive,
               as->has_codebook ? ", codebook" : ", no codebook: every position exact");
    if (!n)
        printf("%s: nothing to append from %s (positions %u.. of %u)\n", o->archive, o->cache,
               p0, u->s->c.n_positions);
    printf("%s: appended %u positions (%u..%u of %s) in %" PRIu64 " commit(s)%s; now %" PRIu64
           " positions (%" PRIu64 " archived, %" PRIu64 " exact), %" PRIu64
           " commits, %" PRIu64 " bytes (+%" PRIu64 ")\n",
           o->archive, n, p0, n ? p1 - 1 : p0, o->cache, u->commits,
           u->use_tok ? " with token ids" : "", as->n_positions, as->n_archived,
           as->n_positions - as->n_archived, as->commit_seq, as->file_size,
           as->file_size - u->before_size);
}

int fkvf_cli_append(int argc, char **argv)
{
    append_opts o;
    int pr = append_parse(argc, argv, &o);
    if (pr)
        return pr > 0 ? CLI_OK : CLI_USAGE;
    append_state s;
    memset(&s, 0, sizeof s);
    append_run u;
    memset(&u, 0, sizeof u);
    u.o = &o;
    u.s = &s;
    int ex;
    if (o.create && (ex = append_check_create(&o)) != CLI_OK)
        return ex;
    if ((ex = cli_read_cache_layout(o.cache, o.layout, 1, &s.c)) != CLI_OK)
        return ex;
    if ((o.create || (ex = append_read_archive(&u)) == CLI_OK) &&
        (ex = append_positions(&u)) == CLI_OK && (ex = append_check_llama(&u)) == CLI_OK &&
        (ex = append_tokens(&u)) == CLI_OK &&
        (ex = append_check_alignment(&u)) == CLI_OK && (ex = append_gather(&u)) == CLI_OK &&
        (ex = append_open(&u)) == CLI_OK && (ex = append_commit_all(&u)) == CLI_OK)
        append_print(&u);
    append_free(&s);
    return ex;
}

/* ---- compact --------------------------------------------------------------- */

static const char *compact_help =
    "usage: fkvf compact ARCHIVE -o OUT [--codebooks FILE] [--json]\n"
    "       fkvf compact ARCHIVE --in-place [--codebooks FILE] [--json]\n"
    "\n"
    "Rewrite an archive of any number of commits as one commit, without\n"
    "re-encoding anything: the descriptor, the codebook (an embedded copy, or\n"
    "the same external reference), the metadata, the rows of the exact positions\n"
    "(sinks and recent window) only, the index streams symbol for symbol with\n"
    "their codec, and the token stream. Every position of OUT restores bit for\n"
    "bit as in ARCHIVE. Superseded exact rows, stream cuts and per-commit\n"
    "directories and trailers are dropped. A torn tail of ARCHIVE is ignored\n"
    "(only committed data is read).\n"
    "\n"
    "  -o OUT                the new file, created atomically (a temporary file\n"
    "                        renamed into place); OUT must not be ARCHIVE or its\n"
    "                        codebook file (even with --force), nor exist\n"
    "  --force               replace OUT if it exists (default: refused)\n"
    "  --in-place            replace ARCHIVE itself (same atomic rename); refused\n"
    "                        while an appender has it open. A symbolic link is\n"
    "                        followed: the file it points to is replaced, the link\n"
    "                        stays a link to it\n"
    "  --codebooks FILE      the codebook file of an archive that refers to one\n"
    "                        (needed for its shape; default: found by content hash\n"
    "                        in the archive's directory, then in FKVF_CODEBOOK_PATH)\n"
    "  --threads N           threads the search indexes are rebuilt on (default:\n"
    "                        every CPU this process may use, or FKVF_THREADS);\n"
    "                        the output is the same for any N\n"
    "  --json                print one JSON object (on failure {\"error\":{...}},\n"
    "                        docs/cli.md)\n"
    "A warning says so when OUT's name ends in the extension of another format.\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (not an archive, its codebook not found\n"
    "or wrong; OUT exists without --force or is an input), 2 usage or I/O error\n"
    "(bad option, a path that does not exist, the archive locked by an appender).\n";

typedef struct compact_opts {
    const char *in, *out, *cbpath;
    int json, in_place, force;
} compact_opts;

/* 0: run, 1: --help printed, -1: a usage error printed. */
static int compact_parse(int argc, char **argv, compact_opts *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(compact_help, stdout);
            return 1;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--in-place")) {
            o->in_place = 1;
        } else if (!strcmp(a, "--force")) {
            o->force = 1;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--codebooks")) {
            if (!v)
                return cli_usage("%s needs a value", a), -1;
            i++;
            *(a[1] == 'o' ? &o->out : &o->cbpath) = v;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage("unknown option '%s' (see fkvf compact --help)", a), -1;
        } else if (!o->in) {
            o->in = a;
        } else {
            return cli_usage("unexpected argument '%s'", a), -1;
        }
    }
    if (!o->in || (!o->out && !o->in_place))
        return cli_usage("need ARCHIVE and -o OUT or --in-place (see fkvf compact --help)"), -1;
    if (o->in_place && o->out && strcmp(o->in, o->out) && !cli_same_file(o->in, o->out))
        return cli_usage("--in-place with -o %s, a different file", o->out), -1;
    return 0;
}

/* -o OUT never replaces an input: ARCHIVE or the --codebooks FILE (the
 * codebook file found is checked once found); without --force it must not
 * exist. CLI_OK or the exit status after an error line. */
static int compact_check_output(const compact_opts *o)
{
    if (!strcmp(o->in, o->out) || cli_same_file(o->in, o->out))
        return cli_fail(CLI_INVALID, FKVF_E_EXISTS, o->out,
                        "is the same file as ARCHIVE %s (an output never replaces an input, "
                        "not even with --force); use --in-place to replace it",
                        o->in);
    const char *inputs[] = {o->in, o->cbpath};
    int ex = cli_check_output(o->out, inputs, 2, o->force);
    if (ex == CLI_OK)
        cli_warn_fkvf_name(o->out, "archive");
    return ex;
}

static void compact_print(const compact_opts *o, const fkvf_compact_result *res)
{
    if (o->json) {
        printf("{\"archive\":");
        cli_json_cstr(stdout, o->in);
        printf(",\"out\":");
        cli_json_cstr(stdout, res->path);
        printf(",\"in_place\":%s,\"commits_before\":%" PRIu64 ",\"commits\":1,\"positions\":%" PRIu64
               ",\"archived\":%" PRIu64 ",\"exact\":%" PRIu64 ",\"size_before\":%" PRIu64
               ",\"size\":%" PRIu64 ",\"torn_bytes_ignored\":%" PRIu64 "}\n",
               o->in_place ? "true" : "false", res->commits_before, res->positions, res->archived,
               res->exact, res->size_before, res->size, res->torn_bytes);
        return;
    }
    printf("%s: %" PRIu64 " commit(s), %" PRIu64 " bytes -> %s: 1 commit, %" PRIu64
           " bytes (%.1f%%); %" PRIu64 " positions (%" PRIu64 " archived, %" PRIu64 " exact)\n",
           o->in, res->commits_before, res->size_before, res->path, res->size,
           res->size_before ? 100.0 * (double)res->size / (double)res->size_before : 0.0,
           res->positions, res->archived, res->exact);
    if (res->torn_bytes)
        printf("%s: a torn tail of %" PRIu64 " bytes was left out\n", o->in, res->torn_bytes);
    if (res->search_indexes)
        printf("%s: %zu search index(es) rebuilt\n", res->path, res->search_indexes);
}

int fkvf_cli_compact(int argc, char **argv)
{
    compact_opts o;
    int pr = compact_parse(argc, argv, &o);
    if (pr)
        return pr > 0 ? CLI_OK : CLI_USAGE;
    int ex;
    if (!o.in_place && (ex = compact_check_output(&o)) != CLI_OK)
        return ex;
    /* the archive and its codebook file (given or found by content hash),
     * whose file must not be OUT either */
    fkvf_reader *r = NULL, *cb = NULL;
    ex = cli_open_archive(&r, o.in);
    if (ex == CLI_OK)
        ex = cli_attach_codebook(r, o.in, o.cbpath, &cb, NULL, 0);
    fkvf_reader_free(r);
    if (ex == CLI_OK && cb && !o.in_place) {
        const char *cb_path = fkvf_reader_file_name(cb);
        ex = cli_check_output(o.out, &cb_path, 1, 1);
    }
    if (ex != CLI_OK) {
        fkvf_reader_free(cb);
        return ex;
    }
    fkvf_compact_options co;
    fkvf_compact_options_init(&co);
    co.in_place = o.in_place;
    co.no_replace = !o.in_place && !o.force;
    co.codebook_file = cb;
    co.n_threads = cli_threads(); /* the search indexes' rebuild */
    cli_progress b;
    cli_progress_init(&b, "copy  ", o.json);
    co.progress = cli_progress_cb;
    co.progress_opaque = &b;
    fkvf_archive_op *h = NULL;
    fkvf_compact_result res;
    int rc = fkvf_archive_compact(&h, o.in, o.in_place ? NULL : o.out, &co, &res);
    if (rc == FKVF_OK) {
        compact_print(&o, &res);
    } else {
        fkvf_error_info e;
        int have = fkvf_archive_op_error(h, &e) == FKVF_OK && e.code != FKVF_OK;
        ex = cli_fail_lib(rc, have ? &e : NULL, have ? e.file : o.in, "");
    }
    fkvf_archive_op_free(h);
    fkvf_reader_free(cb);
    return ex;
}

/* ---- recover ---------------------------------------------------------------- */

static const char *recover_help =
    "usage: fkvf recover ARCHIVE [--dry-run] [--json]\n"
    "\n"
    "Cut off a torn tail: the bytes after the last complete commit that an\n"
    "append left when it did not complete (a crash, a full disk). The file is\n"
    "truncated to its committed size (spec 7.7); every complete commit stays.\n"
    "A clean file is left untouched. Refused while an appender has the file open.\n"
    "\n"
    "  --dry-run             only say what would be removed\n"
    "  --json                print one JSON object\n"
    "\n"
    "Exit status: 0 ok (recovered, or clean; also a codebook file, which is an\n"
    "FKVF file), 1 the file does not open as an FKVF file (the reader's message\n"
    "says why), 2 usage or I/O error (also: ARCHIVE does not exist, or an\n"
    "appender has it open).\n";

typedef struct recover_opts {
    const char *path;
    int json, dry;
} recover_opts;

/* 0: run, 1: --help printed, -1: a usage error printed. */
static int recover_parse(int argc, char **argv, recover_opts *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(recover_help, stdout);
            return 1;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--dry-run")) {
            o->dry = 1;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage("unknown option '%s' (see fkvf recover --help)", a), -1;
        } else if (!o->path) {
            o->path = a;
        } else {
            return cli_usage("unexpected argument '%s'", a), -1;
        }
    }
    if (!o->path)
        return cli_usage("need ARCHIVE (see fkvf recover --help)"), -1;
    return 0;
}

static void recover_print(const recover_opts *o, const fkvf_recover_result *r)
{
    if (o->json) {
        const char *action = !r->torn_bytes ? "none" : o->dry ? "would-truncate" : "truncated";
        printf("{\"file\":");
        cli_json_cstr(stdout, o->path);
        printf(",\"action\":\"%s\",\"torn_bytes\":%" PRIu64 ",\"removed_bytes\":%" PRIu64
               ",\"file_size_before\":%" PRIu64 ",\"committed_size\":%" PRIu64
               ",\"commit\":%" PRIu64 ",\"positions\":%" PRIu64 "}\n",
               action, r->torn_bytes, r->truncated ? r->torn_bytes : 0, r->file_size,
               r->committed_size, r->commits, r->positions);
    } else if (!r->torn_bytes) {
        printf("%s: clean (%" PRIu64 " bytes, %" PRIu64 " commit(s), %" PRIu64
               " positions); nothing to do\n",
               o->path, r->file_size, r->commits, r->positions);
    } else {
        printf("%s: %s %" PRIu64 " torn bytes after commit %" PRIu64 " (%" PRIu64 " -> %" PRIu64
               " bytes); commit %" PRIu64 " is served (%" PRIu64 " positions)\n",
               o->path, o->dry ? "would remove" : "removed", r->torn_bytes, r->commits,
               r->file_size, r->committed_size, r->commits, r->positions);
    }
}

int fkvf_cli_recover(int argc, char **argv)
{
    recover_opts o;
    int pr = recover_parse(argc, argv, &o);
    if (pr)
        return pr > 0 ? CLI_OK : CLI_USAGE;
    fkvf_recover_options ro;
    fkvf_recover_options_init(&ro);
    ro.dry_run = o.dry;
    fkvf_archive_op *op = NULL;
    fkvf_recover_result res;
    int rc = fkvf_archive_recover(&op, o.path, &ro, &res), ex = CLI_OK;
    if (rc == FKVF_OK) {
        recover_print(&o, &res);
    } else {
        fkvf_error_info e;
        int have = fkvf_archive_op_error(op, &e) == FKVF_OK && e.code != FKVF_OK;
        ex = cli_fail_lib(rc, have ? &e : NULL, o.path, "");
    }
    fkvf_archive_op_free(op);
    return ex;
}
