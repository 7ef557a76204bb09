/* fkvf append / compact / recover: growing an archive one commit at a time
 * (the appender, spec 7.4-7.7 and 14.3), rewriting a many-commit archive into
 * one commit without re-encoding, and cutting off a torn tail. Public API
 * (fkvf.h) and cacheio only. */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cacheio.h"
#include "cli_util.h"
#include "fkvf.h"

/* entry points, called from fkvf.c */
int fkvf_cli_append(int argc, char **argv);
int fkvf_cli_compact(int argc, char **argv);
int fkvf_cli_recover(int argc, char **argv);

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
    "dims, dtype). A crash never loses an earlier commit.\n"
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
    "  --codebooks FILE      the codebook file of an archive that refers to one\n"
    "                        (default: found by content hash in the archive's\n"
    "                        directory, then in FKVF_CODEBOOK_PATH; docs/codebooks.md)\n"
    "  --tokens              token ids are required: fail if the cache has none or\n"
    "                        the archive has no token stream (default: stored when\n"
    "                        both have them)\n"
    "  --beam B              beam width for encoding archived positions (1: greedy)\n"
    "  --layout hnd|nhd      the cache's tensors heads-first [H, T, D] (default) or\n"
    "                        positions-first [T, H, D] (docs/cache-files.md)\n"
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
    "                        (2) --seed S --iters N (25) --f32. k by the rule of fkvf\n"
    "                        pack for the rows trained on when --k is not given: the\n"
    "                        largest power of two from 16 to 256 whose codebook takes at\n"
    "                        most 1/4 of their fp16 bytes, k <= rows / 4; k = 16 with a\n"
    "                        warning when even 16 breaks it. A given --k is used, with\n"
    "                        a warning when its codebook is larger than those rows or\n"
    "                        k > rows / 4 (docs/codebooks.md). The codebook serves every\n"
    "                        later append: for small caches a shared one from fkvf train\n"
    "                        (--codebooks) compresses better\n"
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
    int continues;
    int range_set, end_set, layout;
    cli_code_opts code;
    cli_key_opts keys;
    uint64_t range0, range1, every, tok_bits;
    unsigned sync;
} append_opts;

static int append_parse(int argc, char **argv, append_opts *o)
{
    memset(o, 0, sizeof *o);
    cli_code_opts_init(&o->code);
    cli_key_opts_init(&o->keys);
    o->sync = FKVF_SYNC_COMMIT;
    int create_only = 0;
    const char *create_opt = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int kr;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(append_help, stdout);
            return 1;
        }
        /* flags */
        if (!strcmp(a, "--create")) {
            o->create = 1;
            continue;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        } else if (!strcmp(a, "--recover")) {
            o->recover = 1;
            continue;
        } else if (!strcmp(a, "--tokens")) {
            o->req_tokens = 1;
            continue;
        } else if (!strcmp(a, "--new")) {
            o->newonly = 1;
            continue;
        } else if (!strcmp(a, "--continues")) {
            o->continues = 1;
            continue;
        } else if (!strcmp(a, "--no-tokens") || !strcmp(a, "--embed") || !strcmp(a, "--train") ||
                   !strcmp(a, "--exact-only") || !strcmp(a, "--f32") || !strcmp(a, "--no-rope")) {
            create_only = 1;
            create_opt = a;
            if (a[2] == 'n' && a[5] == 't')
                o->no_tokens = 1;
            else if (a[2] == 'e' && a[3] == 'm')
                o->embed = 1;
            else if (a[2] == 't')
                o->train = 1;
            else if (a[2] == 'e')
                o->exact_only = 1;
            else if (a[2] == 'f')
                o->f32 = 1;
            else
                o->keys.no_rope = 1;
            continue;
        }
        if (a[0] == '-' && a[1]) {
            if (!v) {
                cli_usage("%s needs a value (or is unknown; see fkvf append --help)", a);
                return -1;
            }
            i++;
            if (!strcmp(a, "--codebooks")) {
                o->cbfile = v;
            } else if (!strcmp(a, "--commit-every")) {
                if (cli_parse_u64(v, UINT32_MAX, &o->every) || o->every < 1) {
                    cli_usage("--commit-every: '%s' is not a count >= 1", v);
                    return -1;
                }
            } else if (!strcmp(a, "--sync")) {
                if (!strcmp(v, "commit"))
                    o->sync = FKVF_SYNC_COMMIT;
                else if (!strcmp(v, "none"))
                    o->sync = FKVF_SYNC_NONE;
                else {
                    cli_usage("--sync: '%s' is not commit or none", v);
                    return -1;
                }
            } else if (!strcmp(a, "--beam")) {
                if (cli_opt_beam(v, &o->code.beam))
                    return -1;
            } else if (!strcmp(a, "--layout")) {
                if (cli_opt_layout(v, &o->layout))
                    return -1;
            } else if (!strcmp(a, "--positions")) {
                const char *colon = strchr(v, ':');
                char head[32];
                size_t hl = colon ? (size_t)(colon - v) : strlen(v);
                if (!colon || hl >= sizeof head) {
                    cli_usage("--positions: '%s' is not A:B or A:", v);
                    return -1;
                }
                memcpy(head, v, hl);
                head[hl] = 0;
                if (cli_parse_u64(head, UINT32_MAX, &o->range0) ||
                    (colon[1] && cli_parse_u64(colon + 1, UINT32_MAX, &o->range1)) ||
                    (colon[1] && o->range1 <= o->range0)) {
                    cli_usage("--positions: '%s' is not A:B (A < B) or A:", v);
                    return -1;
                }
                o->range_set = 1;
                o->end_set = colon[1] != 0;
            } else {
                /* options of --create */
                create_only = 1;
                create_opt = a;
                if ((kr = cli_code_value(&o->code, a, v)) != 0 ||
                    (kr = cli_key_value(&o->keys, a, v)) != 0) {
                    if (kr < 0)
                        return -1;
                } else if (!strcmp(a, "--token-bits")) {
                    if (cli_parse_u64(v, 32, &o->tok_bits) || o->tok_bits < 2 || o->tok_bits % 2) {
                        cli_usage("--token-bits: '%s' is not an even width 2..32", v);
                        return -1;
                    }
                } else {
                    cli_usage("unknown option '%s' (see fkvf append --help)", a);
                    return -1;
                }
            }
        } else if (!o->archive) {
            o->archive = a;
        } else if (!o->cache) {
            o->cache = a;
        } else {
            cli_usage("unexpected argument '%s'", a);
            return -1;
        }
    }
    if (!o->archive || !o->cache) {
        cli_usage("need ARCHIVE and CACHE (see fkvf append --help)");
        return -1;
    }
    if (create_only && !o->create) {
        cli_usage("%s is an option of --create (an existing archive keeps its settings)",
                create_opt);
        return -1;
    }
    if (o->create) {
        int n = (o->cbfile != NULL) + o->train + o->exact_only;
        if (n > 1) {
            cli_usage("--create: --codebooks, --train and --exact-only exclude each other");
            return -1;
        }
        if (o->embed && !o->cbfile) {
            cli_usage("--create: --embed needs --codebooks FILE");
            return -1;
        }
        if (n == 0)
            o->train = 1;
        if (o->req_tokens && o->no_tokens) {
            cli_usage("--create: --tokens and --no-tokens exclude each other");
            return -1;
        }
    }
    if (o->newonly && o->range_set) {
        cli_usage("--new and --positions exclude each other");
        return -1;
    }
    if (o->newonly && o->continues) {
        cli_usage("--new and --continues exclude each other (--new appends the cache's "
                  "positions from the archive's count on: they line up)");
        return -1;
    }
    return 0;
}

typedef struct append_state {
    kvio_cache c;
    fkvf_reader *r;   /* the archive, before appending (not --create) */
    fkvf_reader *cb;  /* codebook file */
    fkvf_rvq *q;      /* --create: the quantizer to embed */
    fkvf_appender *a;
    uint8_t *rows;
    uint32_t *tok;
    uint32_t k_trained; /* --create --train: the k of the codebook trained */
} append_state;

static void append_free(append_state *s)
{
    fkvf_appender_free(s->a);
    kvio_cache_free(&s->c);
    fkvf_reader_free(s->r);
    fkvf_reader_free(s->cb);
    fkvf_rvq_free(s->q);
    free(s->rows);
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
                                     o->embed ? &s->q : NULL)) != CLI_OK)
        return rc;
    cli_keys_hf_default(&o->keys, c, o->cache);
    fkvf_rope rope;
    const fkvf_rope *krope;
    if (cli_key_rope(&o->keys, c->key_dim, o->cache, &rope, &krope))
        return CLI_USAGE;
    if (krope && (s->q || s->cb || o->train)) {
        /* the rows p0.. are positions 0.. of the new archive */
        cli_rope_report rr;
        if (cli_rope_measure(c, p0, p1, 0, &rope, 1, &rr) == 0) {
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
        const char *advice = "the archive keeps this codebook for every later append; for small "
                             "caches a shared codebook compresses better: train it once (fkvf "
                             "train CACHE... -o CODEBOOKS) and create with --codebooks CODEBOOKS";
        if (o->code.ks + o->code.vs > 0 && !o->code.k_set) {
            k = cli_auto_k(c, n_train, o->code.ks, o->code.vs, o->f32);
            if (!k) {
                k = CLI_CB_K_MIN;
                cli_warn_k_min(o->cache, c, n_train, "positions to train the codebook on",
                               o->code.ks, o->code.vs, o->f32, advice);
            }
        } else if (o->code.ks + o->code.vs > 0) {
            cli_warn_codebook(o->cache, c, k, cli_cb_bytes(c, k, o->code.ks, o->code.vs, o->f32, 0),
                              n_train, n_train, "rows it is trained on", "rows it is trained on",
                              advice);
        }
        s->k_trained = k;
        fkvf_rvq_params prm;
        cli_rvq_params_for(&prm, c);
        prm.k = k;
        prm.k_stages = o->code.ks;
        prm.v_stages = o->code.vs;
        prm.table_dtype = o->f32 ? FKVF_DTYPE_F32 : FKVF_DTYPE_F16;
        prm.seed = o->code.seed;
        prm.max_iters = o->code.iters;
        prm.key_rope = krope;
        cli_progress b;
        cli_progress_init(&b, "train ", o->json);
        prm.progress = cli_progress_cb;
        prm.progress_opaque = &b;
        /* the rows being appended are positions 0.. of the new archive */
        fkvf_rows all = {s->rows, (size_t)(p1 - p0), c->dtype, 0};
        rc = fkvf_rvq_train(&s->q, &prm, &all, 1, NULL);
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
        if (!o->tok_bits && cli_quad_bits_for((uint64_t)mx) > bits)
            bits = cli_quad_bits_for((uint64_t)mx);
        cr.token_codec.profile = FKVF_PROFILE_QUAD;
        cr.token_codec.symbol_bits = bits;
    }
    fkvf_append_options ao;
    fkvf_append_options_init(&ao);
    ao.sync = o->sync;
    ao.beam_width = o->code.beam;
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

int fkvf_cli_append(int argc, char **argv)
{
    append_opts o;
    int pr = append_parse(argc, argv, &o);
    if (pr)
        return pr > 0 ? CLI_OK : CLI_USAGE;
    append_state s;
    memset(&s, 0, sizeof s);
    int ex;
    int rc;
    if (o.create) {
        /* the new archive is an output: never an input, never a file that
         * exists (--create has no --force) */
        const char *inputs[] = {o.cache, o.cbfile};
        if ((ex = cli_check_output(o.archive, inputs, 2, 1)) != CLI_OK)
            return ex;
        struct stat st;
        if (lstat(o.archive, &st) == 0)
            return cli_fail(CLI_INVALID, FKVF_E_EXISTS, o.archive,
                            "exists; --create never replaces a file (append to it without "
                            "--create)");
        cli_warn_fkvf_name(o.archive, "archive");
    }
    if ((ex = cli_read_cache_layout(o.cache, o.layout, &s.c)) != CLI_OK)
        return ex;
    kvio_cache *c = &s.c;
    uint64_t before_size = 0, before_n = 0, before_commits = 0, recovered = 0;
    uint64_t sinks = 0, window = 0; /* the descriptor's */
    fkvf_stream_info tsi;
    size_t ti = 0;
    int arch_tok = 0, pre_rope = 0;

    /* the archive as it is: descriptor, token stream, torn tail */
    if (!o.create) {
        if ((ex = cli_open_archive(&s.r, o.archive)) != CLI_OK)
            goto out;
        fkvf_archive_info ai;
        fkvf_desc d;
        if ((rc = fkvf_reader_info(s.r, &ai)) != FKVF_OK ||
            (rc = fkvf_reader_desc(s.r, &d)) != FKVF_OK) {
            ex = cli_fail_reader(rc, s.r, o.archive, "");
            goto out;
        }
        if (ai.torn_bytes && !o.recover) {
            ex = cli_fail(CLI_INVALID, FKVF_E_TORN, o.archive,
                          "torn tail: %" PRIu64 " bytes after commit %" PRIu64
                          " (an append that did not complete); nothing appended. Run 'fkvf "
                          "recover %s' (or append with --recover) to cut it off first (spec 7.7)",
                          ai.torn_bytes, ai.n_commits, o.archive);
            goto out;
        }
        if ((ex = check_shape(&o, c, &d)))
            goto out;
        before_size = ai.committed_size;
        before_n = ai.n_positions;
        before_commits = ai.n_commits;
        sinks = d.n_sinks;
        window = d.window;
        pre_rope = d.key_transform == 1 && d.key_storage == 1;
        arch_tok = fkvf_reader_stream_find(s.r, FKVF_STREAM_ID_TOKENS, &ti) == FKVF_OK &&
                   fkvf_reader_stream_info(s.r, ti, &tsi) == FKVF_OK;
        if ((ex = cli_attach_codebook(s.r, o.archive, o.cbfile, &s.cb, NULL, 0)))
            goto out;
    }

    /* which positions */
    uint32_t p0 = 0, p1 = c->n_positions;
    if (o.range_set) {
        p0 = (uint32_t)o.range0;
        p1 = o.end_set ? (uint32_t)o.range1 : c->n_positions;
        if (p1 > c->n_positions || p0 > p1) {
            char b[24] = "";
            if (o.end_set)
                snprintf(b, sizeof b, "%" PRIu64, o.range1);
            ex = cli_fail(CLI_INVALID, FKVF_E_RANGE, o.cache,
                          "--positions %" PRIu64 ":%s: the cache has %u positions", o.range0, b,
                          c->n_positions);
            goto out;
        }
    } else if (o.newonly && !o.create) {
        if (before_n > c->n_positions) {
            ex = cli_fail(CLI_INVALID, FKVF_E_RANGE, o.cache,
                          "--new: the cache has %u positions, the archive %s already %" PRIu64,
                          c->n_positions, o.archive, before_n);
            goto out;
        }
        p0 = (uint32_t)before_n;
    }
    uint32_t n = p1 - p0;

    /* tokens */
    int use_tok = 0;
    if (o.create) {
        use_tok = c->tokens && !o.no_tokens;
        if (o.req_tokens && !c->tokens) {
            ex = cli_fail(CLI_INVALID, FKVF_E_NOT_FOUND, o.cache,
                          "--tokens: the cache holds no token ids");
            goto out;
        }
    } else if (arch_tok) {
        if (!c->tokens) {
            ex = cli_fail(CLI_INVALID, FKVF_E_NOT_FOUND, o.cache,
                          "the archive %s has a token stream, the cache holds no token ids",
                          o.archive);
            goto out;
        }
        use_tok = 1;
        uint64_t alpha = alphabet_of(&tsi);
        for (uint32_t t = p0; t < p1; t++)
            if (c->tokens[t] < 0 || (uint64_t)c->tokens[t] >= alpha) {
                ex = cli_fail(CLI_INVALID, FKVF_E_RANGE, o.cache,
                              "token id %" PRId64 " at position %u does not fit the archive's "
                              "token stream (symbols below %" PRIu64 ")",
                              c->tokens[t], t, alpha);
                goto out;
            }
    } else if (c->tokens) {
        if (o.req_tokens) {
            ex = cli_fail(CLI_INVALID, FKVF_E_NOT_FOUND, o.archive,
                          "--tokens: the archive has no token stream");
            goto out;
        }
        if (!o.json)
            cli_note("%s has no token stream; the token ids of %s are not stored", o.archive,
                     o.cache);
    } else if (o.req_tokens) {
        ex = cli_fail(CLI_INVALID, FKVF_E_NOT_FOUND, o.cache,
                      "--tokens: the cache holds no token ids");
        goto out;
    }

    /* a cache's position p is sequence position p: what is appended starts
     * at the archive's count, unless the user says that the cache's
     * positions are new ones that continue the archive */
    if (n && p0 != before_n && !o.continues) {
        ex = misaligned(&o, p0, p1, before_n, c->n_positions);
        goto out;
    }
    /* the positions line up: then the cache's token ids where it overlaps
     * the archive (cache positions [0, min(N, T))) must be the archive's,
     * or a different sequence would be continued without a word; with
     * --continues the cache's positions are new ones and overlap nothing */
    if (arch_tok && c->tokens && !o.continues) {
        uint64_t m = before_n < c->n_positions ? before_n : c->n_positions;
        m = tsi.length < m ? tsi.length : m;
        if ((ex = check_token_overlap(&o, s.r, ti, c, m)) != CLI_OK)
            goto out;
    }
    if (o.create)
        pre_rope = o.keys.pre_rope && !o.keys.no_rope;
    if (n && p0 != before_n)
        cli_warn("%s: --continues: cache positions %u..%u become positions %" PRIu64 "..%" PRIu64
                 " of %s%s",
                 o.cache, p0, p1 - 1, before_n, before_n + n - 1, o.archive,
                 pre_rope ? "; keys are un-rotated at the archive's positions (spec 8.1)" : "");

    size_t rb = cli_cache_row_bytes(c);
    s.rows = malloc(rb * (n ? n : 1));
    s.tok = malloc(sizeof *s.tok * (n ? n : 1));
    if (!s.rows || !s.tok) {
        ex = cli_fail(CLI_USAGE, FKVF_E_NOMEM, o.cache, "out of memory");
        goto out;
    }
    cli_cache_rows(c, p0, p1, s.rows);
    for (uint32_t t = 0; use_tok && t < n; t++)
        s.tok[t] = (uint32_t)c->tokens[p0 + t];

    if (o.create) {
        if ((ex = append_create(&o, &s, p0, p1)))
            goto out;
    } else {
        fkvf_reader_free(s.r); /* before a recovery may truncate the file */
        s.r = NULL;
        fkvf_append_options ao;
        fkvf_append_options_init(&ao);
        ao.sync = o.sync;
        ao.beam_width = o.code.beam;
        ao.recover = o.recover;
        ao.codebook_file = s.cb;
        rc = fkvf_appender_open(&s.a, o.archive, &ao, NULL);
        if (rc != FKVF_OK) {
            ex = cli_fail_appender(rc, s.a, o.archive, "");
            goto out;
        }
    }
    fkvf_append_info as;
    fkvf_appender_info(s.a, &as);
    recovered = as.recovered_bytes;
    /* The positions were checked against the archive as a plain reader saw
     * it, without the lock; the appender holds it from here on. Another
     * append that committed in between would make them overlap (or leave a
     * gap): refuse, with nothing appended. */
    if (!o.create && (as.n_positions != before_n || as.commit_seq != before_commits)) {
        ex = cli_fail(CLI_INVALID, FKVF_E_RANGE, o.archive,
                      "changed meanwhile (another append or a compact ran in between): it "
                      "held %" PRIu64 " positions (commit %" PRIu64 ") when this append "
                      "checked its positions, %" PRIu64 " positions (commit %" PRIu64
                      ") once locked for appending; nothing appended: run the append again",
                      before_n, before_commits, as.n_positions, as.commit_seq);
        goto out;
    }
    if (o.create) {
        before_size = as.file_size;
    }
    /* the commits */
    uint64_t every = o.every ? o.every : (n ? n : 1);
    uint64_t commits = 0;
    cli_progress b;
    cli_progress_init(&b, "append", o.json);
    for (uint64_t i = 0; i < n; i += every) {
        uint64_t m = n - i < every ? n - i : every;
        rc = fkvf_appender_append(s.a, s.rows + (size_t)i * rb, (size_t)m * rb, (size_t)m,
                                  use_tok ? s.tok + i : NULL);
        if (rc == FKVF_OK)
            rc = fkvf_appender_commit(s.a);
        if (rc != FKVF_OK) {
            char pre[600];
            snprintf(pre, sizeof pre,
                     "commit of positions %" PRIu64 "..%" PRIu64 " of %s failed "
                     "(%" PRIu64 " commit(s) of this run are in the file): ",
                     p0 + i, p0 + i + m - 1, o.cache, commits);
            ex = cli_fail_appender(rc, s.a, o.archive, pre);
            goto out;
        }
        commits++;
        cli_progress_cb(&b, i + m, n);
    }
    if (o.sync == FKVF_SYNC_NONE && (rc = fkvf_appender_sync(s.a)) != FKVF_OK) {
        ex = cli_fail_appender(rc, s.a, o.archive, "");
        goto out;
    }
    fkvf_appender_info(s.a, &as);
    /* an archive without a codebook (fkvf pack makes one for too few
     * positions, or --exact-only) keeps the positions that leave its
     * window exact: said once per run (--create says so in its first line) */
    if (!o.create && n && !as.has_codebook && as.n_positions > sinks + window)
        cli_note("%s has no codebook: the positions that leave its recent window stay exact "
                 "(%" PRIu64 " of its %" PRIu64 " positions are outside its %" PRIu64
                 " sinks and %" PRIu64 " recent positions, all stored exact); an archive's "
                 "codebook is chosen when it is made: to store such positions as indices, make "
                 "it with one (fkvf pack --k N, or a shared codebook from fkvf train and "
                 "--codebooks FILE)",
                 o.archive, as.n_positions - sinks - window, as.n_positions, sinks, window);
    if (o.json) {
        printf("{\"archive\":");
        cli_json_cstr(stdout, o.archive);
        printf(",\"cache\":");
        cli_json_cstr(stdout, o.cache);
        printf(",\"created\":%s,\"first\":%u,\"archive_first\":%" PRIu64
               ",\"continues\":%s,\"appended\":%u,\"commits\":%" PRIu64
               ",\"commit_seq\":%" PRIu64 ",\"positions\":%" PRIu64 ",\"archived\":%" PRIu64
               ",\"exact\":%" PRIu64 ",\"tokens\":%s,\"recovered_bytes\":%" PRIu64
               ",\"size_before\":%" PRIu64 ",\"size\":%" PRIu64 ",\"bytes_added\":%" PRIu64 "}\n",
               o.create ? "true" : "false", p0, before_n, p0 != before_n ? "true" : "false", n,
               commits, as.commit_seq, as.n_positions,
               as.n_archived, as.n_positions - as.n_archived, use_tok ? "true" : "false",
               recovered, before_size, as.file_size, as.file_size - before_size);
    } else {
        if (recovered)
            printf("%s: recovered: cut off a torn tail of %" PRIu64 " bytes\n", o.archive,
                   recovered);
        if (o.create && s.k_trained)
            printf("%s: created (commit 1: descriptor, codebook trained on %u positions, k = "
                   "%u)\n", o.archive, n, s.k_trained);
        else if (o.create)
            printf("%s: created (commit 1: descriptor%s)\n", o.archive,
                   as.has_codebook ? ", codebook" : ", no codebook: every position exact");
        if (!n)
            printf("%s: nothing to append from %s (positions %u.. of %u)\n", o.archive, o.cache,
                   p0, c->n_positions);
        printf("%s: appended %u positions (%u..%u of %s) in %" PRIu64 " commit(s)%s; now %" PRIu64
               " positions (%" PRIu64 " archived, %" PRIu64 " exact), %" PRIu64
               " commits, %" PRIu64 " bytes (+%" PRIu64 ")\n",
               o.archive, n, p0, n ? p1 - 1 : p0, o.cache, commits,
               use_tok ? " with token ids" : "", as.n_positions, as.n_archived,
               as.n_positions - as.n_archived, as.commit_seq, as.file_size,
               as.file_size - before_size);
    }
    ex = CLI_OK;
out:
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
    "  --json                print one JSON object (on failure {\"error\":{...}},\n"
    "                        docs/cli.md)\n"
    "A warning says so when OUT's name ends in the extension of another format.\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (not an archive, its codebook not found\n"
    "or wrong; OUT exists without --force or is an input), 2 usage or I/O error\n"
    "(bad option, a path that does not exist, the archive locked by an appender).\n";

static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (stat(a, &sa) != 0 || stat(b, &sb) != 0)
        return 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int fkvf_cli_compact(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *cbpath = NULL;
    int json = 0, in_place = 0, force = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(compact_help, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--in-place")) {
            in_place = 1;
        } else if (!strcmp(a, "--force")) {
            force = 1;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--codebooks")) {
            if (!v)
                return cli_usage("%s needs a value", a);
            i++;
            *(a[1] == 'o' ? &out : &cbpath) = v;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage("unknown option '%s' (see fkvf compact --help)", a);
        } else if (!in) {
            in = a;
        } else {
            return cli_usage("unexpected argument '%s'", a);
        }
    }
    if (!in || (!out && !in_place))
        return cli_usage("need ARCHIVE and -o OUT or --in-place (see fkvf compact --help)");
    if (in_place && out && strcmp(in, out) && !same_file(in, out))
        return cli_usage("--in-place with -o %s, a different file", out);
    if (!in_place && (!strcmp(in, out) || same_file(in, out)))
        return cli_fail(CLI_INVALID, FKVF_E_EXISTS, out,
                        "is the same file as ARCHIVE %s (an output never replaces an input, "
                        "not even with --force); use --in-place to replace it",
                        in);
    if (!in_place) {
        const char *inputs[] = {in, cbpath};
        int ex = cli_check_output(out, inputs, 2, force);
        if (ex)
            return ex;
        cli_warn_fkvf_name(out, "archive");
    }
    /* --in-place through a symbolic link: the file it points to is the one
     * compacted (the writer renames a temporary file over its path; over
     * the link's path it would replace the link with a regular file and
     * leave the target as it was) */
    char *real = NULL;
    if (in_place) {
        if (!(real = realpath(in, NULL)))
            return cli_fail(CLI_USAGE, FKVF_E_IO, in, "cannot resolve the path: %s",
                            strerror(errno));
        out = real;
    }

    int ex = CLI_INVALID, rc, lockfd = -1;
    fkvf_reader *r = NULL, *cb = NULL;
    fkvf_writer *w = NULL;
    uint8_t *rows = NULL;
    uint16_t *codes = NULL;
    uint32_t *sym = NULL;
    char *kbuf = NULL, *vbuf = NULL;
    const char *stage = "open";

    if (in_place) {
        /* no appender may add a commit to the file being replaced */
        lockfd = open(in, O_RDONLY | O_CLOEXEC);
        if (lockfd < 0 || flock(lockfd, LOCK_EX | LOCK_NB) != 0) {
            ex = cli_fail(CLI_USAGE, FKVF_E_IO, in, "cannot %s (%s)",
                          lockfd < 0 ? "open" : "lock: an appender has it open", strerror(errno));
            goto out;
        }
    }
    if ((ex = cli_open_archive(&r, in)) != CLI_OK)
        goto out;
    fkvf_archive_info ai;
    fkvf_desc d;
    if ((rc = fkvf_reader_info(r, &ai)) != FKVF_OK || (rc = fkvf_reader_desc(r, &d)) != FKVF_OK) {
        ex = cli_fail_reader(rc, r, in, "");
        goto out;
    }
    if ((ex = cli_attach_codebook(r, in, cbpath, &cb, NULL, 0)))
        goto out;
    /* the codebook file (given or found) is an input too */
    const char *cb_path = cb ? fkvf_reader_file_name(cb) : NULL;
    if (cb_path && !in_place && (ex = cli_check_output(out, &cb_path, 1, 1)) != CLI_OK)
        goto out;
    ex = CLI_INVALID;
    /* deflate flags as in the input */
    unsigned exac_flags = 0, cbk_flags = 0;
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info si;
        if (fkvf_reader_section(r, i, &si) != FKVF_OK)
            continue;
        if (si.type == FKVF_SECTION_EXAC && (si.flags & FKVF_SECTION_DEFLATE))
            exac_flags = FKVF_SECTION_DEFLATE;
        if (si.type == FKVF_SECTION_CBK1 && (si.flags & FKVF_SECTION_DEFLATE))
            cbk_flags = FKVF_SECTION_DEFLATE;
    }
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    wo.required_features = ai.required_features;
    wo.optional_features = ai.optional_features;
    wo.no_replace = !in_place && !force; /* nor one that appears meanwhile */
    struct stat ist;
    if (in_place && fstat(lockfd, &ist) == 0)
        wo.mode = (unsigned)ist.st_mode & 07777; /* the file keeps its permissions */
    rc = fkvf_writer_create_file(&w, out, &wo, NULL);
    if (rc != FKVF_OK) {
        ex = cli_fail_writer(rc, w, out, "");
        goto out;
    }
    stage = "descriptor";
    rc = fkvf_writer_set_desc(w, &d);

    /* metadata, entry by entry */
    size_t n_meta = 0;
    if (rc == FKVF_OK) {
        stage = "metadata";
        rc = fkvf_reader_meta_count(r, &n_meta);
        if (rc != FKVF_OK) {
            ex = cli_fail_reader(rc, r, in, "");
            goto out;
        }
    }
    for (size_t i = 0; rc == FKVF_OK && i < n_meta; i++) {
        fkvf_meta_entry e;
        if ((rc = fkvf_reader_meta(r, i, &e)) != FKVF_OK) {
            ex = cli_fail_reader(rc, r, in, "");
            goto out;
        }
        free(kbuf);
        free(vbuf);
        kbuf = malloc(e.key_len + 1);
        vbuf = malloc(e.value_len + 1);
        if (!kbuf || !vbuf) {
            rc = FKVF_E_NOMEM;
            break;
        }
        memcpy(kbuf, e.key, e.key_len);
        kbuf[e.key_len] = 0;
        if (e.value_len)
            memcpy(vbuf, e.value, e.value_len);
        vbuf[e.value_len] = 0;
        switch (e.type) {
        case FKVF_META_U64:
            rc = fkvf_writer_meta_u64(w, kbuf, e.u64);
            break;
        case FKVF_META_I64:
            rc = fkvf_writer_meta_i64(w, kbuf, e.i64);
            break;
        case FKVF_META_F64:
            rc = fkvf_writer_meta_f64(w, kbuf, e.f64);
            break;
        case FKVF_META_BOOL:
            rc = fkvf_writer_meta_bool(w, kbuf, e.u64 != 0);
            break;
        case FKVF_META_UTF8:
            if (memchr(e.value, 0, e.value_len))
                rc = fkvf_writer_meta_bytes(w, kbuf, e.value, e.value_len);
            else
                rc = fkvf_writer_meta_utf8(w, kbuf, vbuf);
            break;
        default:
            rc = fkvf_writer_meta_bytes(w, kbuf, e.value, e.value_len);
        }
    }

    /* exact rows: sinks [0, min(S, n)) and the window [S + A, n); all of
     * them when nothing is archived */
    uint64_t P = ai.n_positions, A = ai.n_archived;
    uint64_t S = A ? (d.n_sinks < P ? d.n_sinks : P) : P;
    uint64_t ranges[2][2] = {{0, S}, {A ? d.n_sinks + A : P, P}};
    size_t rb = 0;
    if (rc == FKVF_OK && (rc = fkvf_reader_row_bytes(r, d.dtype, &rb)) != FKVF_OK) {
        ex = cli_fail_reader(rc, r, in, "");
        goto out;
    }
    uint64_t n_exact = 0;
    for (int k = 0; rc == FKVF_OK && k < 2; k++) {
        uint64_t a0 = ranges[k][0], a1 = ranges[k][1];
        if (a1 <= a0)
            continue;
        stage = "exact rows";
        free(rows);
        rows = malloc((size_t)(a1 - a0) * rb);
        if (!rows) {
            rc = FKVF_E_NOMEM;
            break;
        }
        for (uint64_t p = a0; p < a1; p++) {
            const void *row;
            size_t n;
            if ((rc = fkvf_reader_exact_row(r, p, &row, &n)) != FKVF_OK || n != rb) {
                char pre[64];
                snprintf(pre, sizeof pre, "exact row of position %" PRIu64 ": ", p);
                if (rc)
                    ex = cli_fail_reader(rc, r, in, pre);
                else
                    ex = cli_fail(CLI_INVALID, FKVF_E_CORRUPT, in, "%sunexpected size", pre);
                goto out;
            }
            memcpy(rows + (size_t)(p - a0) * rb, row, rb);
        }
        rc = fkvf_writer_add_exact(w, a0, a1 - a0, rows, (size_t)(a1 - a0) * rb, exac_flags);
        n_exact += a1 - a0;
    }

    /* the codebook */
    fkvf_codebook_shape shape;
    memset(&shape, 0, sizeof shape);
    int has_cb = 0, ext = 0;
    uint8_t ref_hash[16];
    const char *ref_name = NULL;
    if (rc == FKVF_OK) {
        stage = "codebook";
        const void *contents;
        size_t csize;
        int crc = fkvf_reader_codebook(r, &shape, &contents, &csize, NULL);
        fkvf_reader_codebook_ref(r, &ext, ref_hash, &ref_name);
        if (crc == FKVF_OK) {
            has_cb = 1;
            if (ext)
                rc = fkvf_writer_add_codebook_ref(w, &shape, ref_hash, ref_name);
            else
                rc = fkvf_writer_add_codebooks(w, &shape, (const uint8_t *)contents + 64,
                                               csize - 64, cbk_flags);
        } else if (crc != FKVF_E_NOT_FOUND) {
            ex = cli_fail_reader(rc, r, in, "");
            goto out;
        }
    }

    /* index streams, symbol for symbol */
    size_t i0;
    fkvf_stream_spec isp; /* the codec the copy keeps */
    int has_index = fkvf_reader_stream_find(r, FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, 0, 0, 0, 0),
                                            &i0) == FKVF_OK &&
                    fkvf_reader_stream_spec(r, i0, &isp) == FKVF_OK;
    if (rc == FKVF_OK && has_cb && has_index) {
        stage = "index streams";
        unsigned per = (unsigned)shape.k_stages + shape.v_stages;
        size_t cpp = (size_t)d.n_layers * d.n_kv_heads * per;
        codes = malloc(cpp * (size_t)A * sizeof *codes + 1);
        sym = malloc((size_t)A * sizeof *sym + 1);
        if (!codes || !sym) {
            rc = FKVF_E_NOMEM;
        } else {
            cli_progress b;
            cli_progress_init(&b, "copy  ", json);
            for (size_t j = 0; rc == FKVF_OK && j < cpp; j++) {
                uint32_t lh = (uint32_t)(j / per), st = (uint32_t)(j % per);
                unsigned kv = st >= shape.k_stages;
                uint64_t id = FKVF_STREAM_ID(FKVF_STREAM_KIND_INDEX, lh / d.n_kv_heads,
                                             lh % d.n_kv_heads, kv, kv ? st - shape.k_stages : st);
                size_t idx;
                fkvf_stream_info si;
                if (fkvf_reader_stream_find(r, id, &idx) != FKVF_OK ||
                    fkvf_reader_stream_info(r, idx, &si) != FKVF_OK || si.length < A) {
                    ex = cli_fail(CLI_INVALID, FKVF_E_CORRUPT, in,
                                  "index stream %016" PRIx64 " missing or shorter than the %" PRIu64
                                  " archived positions", id, A);
                    goto out;
                }
                if (A && (rc = fkvf_reader_stream_read(r, idx, 0, sym, (size_t)A)) != FKVF_OK) {
                    ex = cli_fail_reader(rc, r, in, "");
                    goto out;
                }
                for (uint64_t t = 0; t < A; t++)
                    codes[j * A + t] = (uint16_t)sym[t];
                cli_progress_cb(&b, j + 1, cpp);
            }
            if (rc == FKVF_OK)
                rc = fkvf_writer_add_index_segment(w, &isp, 0, A, A ? codes : NULL, 1,
                                                   (size_t)(A ? A : 1));
        }
    }

    /* the token stream */
    size_t ti;
    fkvf_stream_info tsi;
    if (rc == FKVF_OK && fkvf_reader_stream_find(r, FKVF_STREAM_ID_TOKENS, &ti) == FKVF_OK &&
        fkvf_reader_stream_info(r, ti, &tsi) == FKVF_OK) {
        stage = "token stream";
        free(sym);
        sym = malloc((size_t)tsi.length * sizeof *sym + 1);
        if (!sym) {
            rc = FKVF_E_NOMEM;
        } else {
            if (tsi.length &&
                (rc = fkvf_reader_stream_read(r, ti, 0, sym, (size_t)tsi.length)) != FKVF_OK) {
                ex = cli_fail_reader(rc, r, in, "");
                goto out;
            }
            fkvf_stream_spec sp;
            if ((rc = fkvf_reader_stream_spec(r, ti, &sp)) == FKVF_OK)
                rc = fkvf_writer_add_token_segment(w, &sp, 0, tsi.length ? sym : NULL,
                                                   (size_t)tsi.length);
        }
    }
    /* search indexes (spec 20): rebuilt for every stream that had one, after
     * the stream segments so that no later segment makes them stale (20.4);
     * the streams are copied symbol for symbol, so the input's symbols give
     * the same keys */
    size_t n_idx = 0;
    for (size_t i = 0; rc == FKVF_OK && i < ai.n_sections; i++) {
        fkvf_section_info zs;
        size_t zi;
        if (fkvf_reader_section(r, i, &zs) != FKVF_OK || zs.type != FKVF_SECTION_ZIDX ||
            fkvf_reader_stream_find(r, zs.key, &zi) != FKVF_OK)
            continue;
        int dup = 0; /* one index per stream, however many the input had */
        for (size_t j = 0; j < i && !dup; j++) {
            fkvf_section_info ps;
            dup = fkvf_reader_section(r, j, &ps) == FKVF_OK && ps.type == FKVF_SECTION_ZIDX &&
                  ps.key == zs.key;
        }
        if (dup)
            continue;
        stage = "search index";
        void *zd = NULL;
        size_t zn = 0;
        uint64_t zk = 0;
        rc = fkvf_search_index_build(r, zi, &zd, &zn, &zk, NULL);
        if (rc == FKVF_OK)
            rc = fkvf_writer_add_section(w, FKVF_SECTION_ZIDX, 0, zk, zd, zn);
        fkvf_search_buffer_free(zd, NULL);
        n_idx++;
    }
    if (rc == FKVF_OK) {
        stage = "commit";
        rc = fkvf_writer_set_positions(w, P, A);
    }
    if (rc == FKVF_OK)
        rc = fkvf_writer_finish(w);
    if (rc != FKVF_OK) {
        char pre[64];
        snprintf(pre, sizeof pre, "writing the %s failed: ", stage);
        if (rc == FKVF_E_NOMEM)
            ex = cli_fail(CLI_USAGE, rc, out, "%sout of memory", pre);
        else
            ex = cli_fail_writer(rc, w, out, pre);
        goto out;
    }
    uint64_t after = cli_file_size(out);
    if (json) {
        printf("{\"archive\":");
        cli_json_cstr(stdout, in);
        printf(",\"out\":");
        cli_json_cstr(stdout, out);
        printf(",\"in_place\":%s,\"commits_before\":%" PRIu64 ",\"commits\":1,\"positions\":%" PRIu64
               ",\"archived\":%" PRIu64 ",\"exact\":%" PRIu64 ",\"size_before\":%" PRIu64
               ",\"size\":%" PRIu64 ",\"torn_bytes_ignored\":%" PRIu64 "}\n",
               in_place ? "true" : "false", ai.n_commits, P, A, n_exact, ai.file_size, after,
               ai.torn_bytes);
    } else {
        printf("%s: %" PRIu64 " commit(s), %" PRIu64 " bytes -> %s: 1 commit, %" PRIu64
               " bytes (%.1f%%); %" PRIu64 " positions (%" PRIu64 " archived, %" PRIu64
               " exact)\n",
               in, ai.n_commits, ai.file_size, out, after,
               ai.file_size ? 100.0 * (double)after / (double)ai.file_size : 0.0, P, A, n_exact);
        if (ai.torn_bytes)
            printf("%s: a torn tail of %" PRIu64 " bytes was left out\n", in, ai.torn_bytes);
        if (n_idx)
            printf("%s: %zu search index(es) rebuilt\n", out, n_idx);
    }
    ex = CLI_OK;
out:
    fkvf_writer_free(w); /* before finish: removes the temporary file */
    fkvf_reader_free(r);
    fkvf_reader_free(cb);
    free(rows);
    free(codes);
    free(sym);
    free(kbuf);
    free(vbuf);
    free(real);
    if (lockfd >= 0)
        close(lockfd);
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

int fkvf_cli_recover(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0, dry = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(recover_help, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--dry-run")) {
            dry = 1;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage("unknown option '%s' (see fkvf recover --help)", a);
        } else if (!path) {
            path = a;
        } else {
            return cli_usage("unexpected argument '%s'", a);
        }
    }
    if (!path)
        return cli_usage("need ARCHIVE (see fkvf recover --help)");
    int fd = open(path, (dry ? O_RDONLY : O_RDWR) | O_CLOEXEC);
    if (fd < 0)
        return cli_fail(CLI_USAGE, FKVF_E_IO, path, "cannot open: %s", strerror(errno));
    if (!dry && flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        return cli_fail(CLI_USAGE, FKVF_E_IO, path, "cannot lock (%s): an appender has it open",
                        strerror(e));
    }
    fkvf_reader *r;
    int rc = cli_open_reader(&r, path);
    if (rc != CLI_OK) {
        close(fd);
        return rc;
    }
    fkvf_archive_info ai;
    fkvf_reader_info(r, &ai);
    fkvf_reader_free(r); /* unmap before truncating */
    const char *action = "none";
    if (ai.torn_bytes) {
        action = dry ? "would-truncate" : "truncated";
        if (!dry) {
            if (ftruncate(fd, (off_t)ai.committed_size) != 0 || fsync(fd) != 0) {
                int e = errno;
                close(fd);
                return cli_fail(CLI_USAGE, FKVF_E_IO, path,
                                "cannot truncate to %" PRIu64 " bytes: %s", ai.committed_size,
                                strerror(e));
            }
            /* it must now open clean at the same commit */
            r = NULL;
            fkvf_archive_info ai2;
            rc = fkvf_reader_open_file(&r, path, FKVF_OPEN_STRICT, NULL);
            if (rc != FKVF_OK || fkvf_reader_info(r, &ai2) != FKVF_OK ||
                ai2.n_commits != ai.n_commits) {
                int ex = cli_fail_reader(rc ? rc : FKVF_E_CORRUPT, r, path, "after the cut: ");
                fkvf_reader_free(r);
                close(fd);
                return ex ? ex : CLI_INVALID;
            }
            fkvf_reader_free(r);
        }
    }
    close(fd);
    if (json) {
        printf("{\"file\":");
        cli_json_cstr(stdout, path);
        printf(",\"action\":\"%s\",\"torn_bytes\":%" PRIu64 ",\"removed_bytes\":%" PRIu64
               ",\"file_size_before\":%" PRIu64 ",\"committed_size\":%" PRIu64
               ",\"commit\":%" PRIu64 ",\"positions\":%" PRIu64 "}\n",
               action, ai.torn_bytes, dry ? 0 : ai.torn_bytes, ai.file_size, ai.committed_size,
               ai.n_commits, ai.n_positions);
    } else if (!ai.torn_bytes) {
        printf("%s: clean (%" PRIu64 " bytes, %" PRIu64 " commit(s), %" PRIu64
               " positions); nothing to do\n",
               path, ai.file_size, ai.n_commits, ai.n_positions);
    } else {
        printf("%s: %s %" PRIu64 " torn bytes after commit %" PRIu64 " (%" PRIu64 " -> %" PRIu64
               " bytes); commit %" PRIu64 " is served (%" PRIu64 " positions)\n",
               path, dry ? "would remove" : "removed", ai.torn_bytes, ai.n_commits, ai.file_size,
               ai.committed_size, ai.n_commits, ai.n_positions);
    }
    return CLI_OK;
}
