/* fkvf pack / unpack / train / compare: raw KV caches (.safetensors, .npy,
 * .npz through cacheio) to FKVF archives and back. Public API only. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cacheio.h"
#include "cli_util.h"
#include "commands.h"
#include "fkvf.h"

/* ---- helpers ------------------------------------------------------------ */

/* A raw cache with at least one position (layout: CLI_LAYOUT_*; lazy: its
 * rows left in the file until asked for). */
static int read_cache(const char *path, int layout, int lazy, kvio_cache *c)
{
    int ex = cli_read_cache_layout(path, layout, lazy, c);
    if (ex != CLI_OK)
        return ex;
    if (c->n_positions == 0) {
        kvio_cache_free(c);
        return cli_fail(CLI_INVALID, FKVF_E_RANGE, path, "the cache holds no positions");
    }
    return CLI_OK;
}

/* 1 consumed (argv[*i] and maybe its value), 0 not a key option, -1 error. */
static int key_opt(cli_key_opts *k, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--no-rope")) {
        k->no_rope = 1;
        return 1;
    }
    if (strcmp(a, "--keys") && strcmp(a, "--rope-theta") && strcmp(a, "--rope-dims") &&
        strcmp(a, "--rope-layout"))
        return 0;
    if (!v) {
        cli_usage("%s needs a value", a);
        return -1;
    }
    ++*i;
    return cli_key_value(k, a, v) < 0 ? -1 : 1;
}

/* ---- pack --------------------------------------------------------------- */

/* At most this many safetensors __metadata__ entries are kept (the writer
 * checks each new key against all earlier ones). */
#define PACK_MAX_ST_META 4096
#define ST_META_PREFIX "safetensors."

/* What unpack needs to write the cache back as it came (docs/cache-files.md):
 * pack.names (the tensor name scheme, when the file has names), pack.layout,
 * and every safetensors __metadata__ entry as safetensors.KEY. An entry the
 * archive cannot hold (key over 255 bytes with the prefix, value over 2^24
 * bytes) is left out with a warning. */
static int pack_source_meta(fkvf_writer *w, const kvio_cache *c, int layout, const char *path)
{
    int rc = fkvf_writer_meta_utf8(w, "pack.layout", layout == CLI_LAYOUT_NHD ? "nhd" : "hnd");
    if (rc == FKVF_OK && c->names != KVIO_NAMES_NONE)
        rc = fkvf_writer_meta_utf8(w, "pack.names", kvio_names_name(c->names));
    /* a llama.cpp state file's entries are llama.* already (llst_meta_set) */
    const char *prefix = c->names == KVIO_NAMES_LLAMA ? "" : ST_META_PREFIX;
    size_t kept = 0, over = 0;
    for (size_t i = 0; rc == FKVF_OK && i < c->n_meta; i++) {
        size_t kl = strlen(c->meta[i].key), vl = strlen(c->meta[i].value);
        if (kept >= PACK_MAX_ST_META) {
            over++;
            continue;
        }
        if (kl > 255 - strlen(ST_META_PREFIX) || vl > (1u << 24)) {
            cli_warn("%s: __metadata__ entry '%.60s%s' not kept: %s", path, c->meta[i].key,
                    kl > 60 ? "..." : "", vl > (1u << 24) ? "value over 16 MiB" : "key over 243 bytes");
            continue;
        }
        char key[256];
        snprintf(key, sizeof key, "%s%s", prefix, c->meta[i].key);
        rc = fkvf_writer_meta_utf8(w, key, c->meta[i].value);
        kept++;
    }
    if (over)
        cli_warn("%s: %zu more __metadata__ entries not kept (at most %d are)", path, over,
                PACK_MAX_ST_META);
    return rc;
}

static const char *pack_help =
    "usage: fkvf pack CACHE -o ARCHIVE [options]\n"
    "\n"
    "Archive a raw KV cache (.safetensors, .npy or .npz; docs/cache-files.md):\n"
    "the first S and last W positions are kept exact, every other position is\n"
    "stored as per-head RVQ indices, one index stream per (layer, head, K|V, stage).\n"
    "\n"
    "Codebooks (one of):\n"
    "  --train               train them on this cache's rows and embed them (default)\n"
    "  --codebooks FILE      use a codebook file from 'fkvf train'; the archive\n"
    "                        refers to it by content hash (shape and stages are the file's)\n"
    "                        and stores only indices: best for many or small caches;\n"
    "                        keys mode and RoPE are those it was trained with (its\n"
    "                        train.* metadata; a --keys/--rope-* option that\n"
    "                        contradicts them is refused: train another codebook);\n"
    "                        positions are encoded under its encoder metric when it\n"
    "                        has one (fkvf train --key-metric; fkvf info shows it)\n"
    "Quantizer (with --train):\n"
    "  --k N                 centroids per stage, power of two 16..4096 (default:\n"
    "                        automatic, the largest power of two from 16 to 256 whose\n"
    "                        embedded codebook takes at most 1/4 of the fp16 bytes of\n"
    "                        the archived rows, with k <= archived rows / 4; when even\n"
    "                        k = 16 breaks that rule, k = 16 with a warning, or, when\n"
    "                        its codebook and indices would take more bytes than the\n"
    "                        rows themselves, every position is stored exact (no\n"
    "                        codebook, so later appends stay exact too; a note says\n"
    "                        so). A given --k is used as given, with a warning when\n"
    "                        its codebook is larger than the rows it encodes or\n"
    "                        k > archived rows / 4; docs/codebooks.md)\n"
    "  --k-stages N          key stages 0..16 (4)\n"
    "  --v-stages N          value stages 0..16 (2)\n"
    "  --layer-stages K:V,...  key and value stages per layer instead, one pair a\n"
    "                        layer (format 1.1: readers of FKVF 1.0 refuse the file)\n"
    "  --seed S              training seed (0); it also chooses the sample\n"
    "  --iters N             Lloyd iterations per stage (25)\n"
    "  --max-train-positions N|all  train on at most N positions (at least 64):\n"
    "                        when the cache holds more, runs of 64 consecutive\n"
    "                        positions chosen by the seed (sinks and window\n"
    "                        included, as in full training), a note says so\n"
    "                        (default: as many as 1 GiB of rows hold; 0 or all:\n"
    "                        every position; docs/codebooks.md)\n"
    "  --f32                 binary32 centroid tables (default f16)\n"
    "Keys:\n"
    "  --keys pre-rope|as-is archive keys before RoPE (default) or as cached\n"
    "  --rope-theta X        RoPE base (10000)\n"
    "  --rope-dims N         rotated dims, even (key_dim)\n"
    "  --rope-layout interleaved|half-split   pair layout (interleaved)\n"
    "  --no-rope             the cache's keys are not rotated (descriptor: no transform)\n"
    "  --check-rope          print how well un-rotating with these settings (and the\n"
    "                        alternatives) concentrates the keys; exit 1 if they look\n"
    "                        wrong (writing nothing). Without -o: measure only\n"
    "                        (docs/cache-files.md). Without it, pack warns when the\n"
    "                        settings look wrong\n"
    "  Hugging Face tensor names (past_key_values.*, key_cache.*): the pair layout\n"
    "  defaults to half-split, said on stderr (a --codebooks file's wins)\n"
    "Input:\n"
    "  --layout hnd|nhd      key/value tensors heads-first [H, T, D] (hnd, default) or\n"
    "                        positions-first [T, H, D] (nhd; .npy [L, 2, T, H, D]);\n"
    "                        without it, more heads than positions is warned about\n"
    "  --model MODEL.gguf    CACHE is a llama.cpp state file saved with this model\n"
    "                        (see fkvf import-llama, docs/llamacpp.md)\n"
    "Archive:\n"
    "  --sinks S             leading exact positions (4)\n"
    "  --recent W            trailing exact positions (32)\n"
    "  --codec quad|ngon     index stream codec (quad)\n"
    "  --beam B              beam width for encoding, 1 = greedy (1)\n"
    "  --deflate             deflate the exact rows\n"
    "  --index               append a commit with a search index of every stream\n"
    "                        (as 'fkvf index' does; spec 20) instead of the token\n"
    "                        stream's alone\n"
    "  --no-index            no search index: one commit (by default a second commit\n"
    "                        holds the token stream's index, 4 bytes per position)\n"
    "  --model-id STR, --tokenizer-id STR   descriptor ids\n"
    "Output:\n"
    "  --force               replace ARCHIVE if it exists (default: refused); an\n"
    "                        input (CACHE, the --codebooks FILE) is never replaced\n"
    "  --threads N           threads (default: every CPU this process may use,\n"
    "                        or FKVF_THREADS); the output is the same for any N\n"
    "  --json                one JSON object: archive, cache, positions, exact,\n"
    "                        archived, bytes, fp16_bytes, codebook_bytes, ratio_fp16\n"
    "                        (on failure {\"error\":{...}}, docs/cli.md)\n"
    "A warning says so when ARCHIVE's name ends in the extension of another\n"
    "format (.safetensors, .npz, .npy, .pt, .bin, .gguf).\n"
    "\n"
    "Prints the archive's size and its ratio vs fp16 with the codebook counted\n"
    "(embedded, or the --codebooks file's size) and without it.\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (a file that is not a cache or not a\n"
    "codebook file, a codebook that does not fit; ARCHIVE exists without --force\n"
    "or is an input), 2 usage or I/O error (bad option, a path that does not\n"
    "exist or cannot be written, out of memory).\n";

typedef struct pack_opts {
    const char *in, *out, *cbfile;
    int train, deflate, f32, layout, check_rope, force, json;
    int index;            /* 0 --no-index, 1 the token stream (default), 2 --index: all */
    uint64_t index_bytes; /* written by the index commit */
    int llama;        /* fkvf import-llama: a state file, lossless unless codebooks */
    const char *help; /* pack_help, or import-llama's */
    cli_code_opts code;
    cli_key_opts keys;
} pack_opts;

static int pack_parse(int argc, char **argv, pack_opts *o, int llama, const char *help)
{
    memset(o, 0, sizeof *o);
    o->index = 1;
    o->llama = llama;
    o->help = help;
    const char *cmd = llama ? "import-llama" : "pack";
    const char *archived_opt = NULL; /* an option of archived positions */
    const char *train_opt = NULL;    /* an option of --train's quantizer */
    cli_code_opts_init(&o->code);
    cli_key_opts_init(&o->keys);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = key_opt(&o->keys, argc, argv, &i);
        if (r < 0)
            return -1;
        if (r > 0)
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(o->help, stdout);
            return 1;
        } else if (!strcmp(a, "--train")) {
            o->train = 1;
        } else if (!strcmp(a, "--index")) {
            o->index = 2;
        } else if (!strcmp(a, "--no-index")) {
            o->index = 0;
        } else if (!strcmp(a, "--deflate")) {
            o->deflate = 1;
        } else if (!strcmp(a, "--f32")) {
            o->f32 = 1;
        } else if (!strcmp(a, "--check-rope")) {
            o->check_rope = 1;
        } else if (!strcmp(a, "--force")) {
            o->force = 1;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (a[0] == '-' && a[1] != 0) {
            if (!v) {
                cli_usage("%s needs a value (or is unknown; see fkvf %s --help)", a, cmd);
                return -1;
            }
            i++;
            if (!strcmp(a, "-o")) {
                o->out = v;
            } else if (!strcmp(a, "--model")) {
                if (cli_llama_set_model(v))
                    return -1;
            } else if (!strcmp(a, "--layout")) {
                if (cli_opt_layout(v, &o->layout))
                    return -1;
            } else if (!strcmp(a, "--codebooks")) {
                o->cbfile = v;
            } else if ((r = cli_code_value(&o->code, a, v)) != 0) {
                if (r < 0)
                    return -1;
                if (strcmp(a, "--model-id") && strcmp(a, "--tokenizer-id"))
                    archived_opt = a; /* shapes archived positions only */
                if (!strcmp(a, "--k") || !strcmp(a, "--k-stages") || !strcmp(a, "--v-stages") ||
                    !strcmp(a, "--layer-stages") || !strcmp(a, "--seed") ||
                    !strcmp(a, "--iters") || !strcmp(a, "--max-train-positions"))
                    train_opt = a; /* shapes trained codebooks only */
            } else {
                cli_usage("unknown option '%s' (see fkvf %s --help)", a, cmd);
                return -1;
            }
        } else if (!o->in) {
            o->in = a;
        } else {
            cli_usage("unexpected argument '%s'", a);
            return -1;
        }
    }
    if (!o->in || (!o->out && !o->check_rope)) {
        cli_usage(llama ? "need STATE, --model MODEL.gguf and -o ARCHIVE (see fkvf import-llama "
                          "--help)"
                        : "need CACHE and -o ARCHIVE (see fkvf pack --help)");
        return -1;
    }
    if (o->train && o->cbfile) {
        cli_usage("--train and --codebooks exclude each other");
        return -1;
    }
    if (o->cbfile && (train_opt || o->f32))
        cli_warn("%s is an option of --train, ignored: the --codebooks file %s has its own k, "
                 "stages and tables",
                 train_opt ? train_opt : "--f32", o->cbfile);
    if (llama && !cli_llama_model_path()) {
        cli_usage("need --model MODEL.gguf, the model %s was saved with (see fkvf import-llama "
                  "--help)", o->in);
        return -1;
    }
    if (llama && !o->train && !o->cbfile) {
        if (archived_opt || o->f32) {
            cli_usage("%s shapes archived positions, and the import is lossless (every position "
                      "exact): add --codebooks FILE or --train to archive",
                      archived_opt ? archived_opt : "--f32");
            return -1;
        }
        /* lossless: every position exact, no codebook (appends stay exact) */
        o->code.sinks = UINT32_MAX;
        return 0;
    }
    if (!o->cbfile)
        o->train = 1;
    return 0;
}

typedef struct pack_state {
    kvio_cache c;
    uint8_t *rows;  /* --train: the rows trained on, while it trains; else NULL */
    uint8_t *chunk; /* PACK_CHUNK rows converted at a time */
    fkvf_rvq *q;
    fkvf_reader *cbr;
    uint16_t *codes;
    uint32_t *sym;
    void *tables;
    fkvf_writer *w;
} pack_state;

static void pack_free(pack_state *s)
{
    kvio_cache_free(&s->c);
    free(s->rows);
    free(s->chunk);
    fkvf_rvq_free(s->q);
    fkvf_reader_free(s->cbr);
    free(s->codes);
    free(s->sym);
    free(s->tables);
    fkvf_writer_free(s->w);
}

/* The geometry of the pack: P positions, S leading and W trailing exact,
 * A archived between them; S_policy is the descriptor's sinks, whatever is
 * stored exact. */
typedef struct pack_plan {
    uint64_t P, S, W, A, S_policy;
    size_t rb;             /* bytes of a row */
    fkvf_rope rope;
    const fkvf_rope *krope; /* &rope when the keys are archived un-rotated */
    uint32_t k;
    uint8_t hash[16];       /* the codebook file's content hash */
    fkvf_codebook_shape shape;
} pack_plan;

/* The RoPE check: always with --check-rope, else when the keys are
 * un-rotated at all. Returns -1 to go on, else the exit status (the check
 * was all the command does, or it failed). */
static int pack_check_rope(const pack_opts *o, pack_state *s, const pack_plan *p)
{
    if (!o->check_rope && !p->krope)
        return -1;
    if (!o->check_rope && o->llama && p->A == 0 && !o->cbfile)
        return -1; /* a lossless import: no key is un-rotated */
    kvio_cache *c = &s->c;
    cli_rope_report rr;
    int ex = cli_rope_measure(c, 0, c->n_positions, 0, &p->rope, p->krope != NULL, &rr);
    if (ex < 0)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->in, "out of memory");
    if (ex > 0)
        return ex; /* the cache's file could not be read */
    rr.no_rope = o->keys.no_rope;
    rr.codebook = o->cbfile;
    /* with --json: the check's object when it is all the command does
     * (no -o, right settings), else its table on stderr */
    if (o->check_rope && o->json && !o->out && rr.verdict != 1)
        cli_rope_json(stdout, o->in, &rr);
    else if (o->check_rope)
        cli_rope_print(o->json ? stderr : stdout, o->in, &rr);
    else
        cli_rope_warn(o->in, &rr);
    if (!o->check_rope || (rr.verdict != 1 && o->out))
        return -1;
    if (rr.verdict == 1)
        return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o->in,
                        "--check-rope: the RoPE settings look wrong%s%s%s", o->out ? "; " : "",
                        o->out ? o->out : "", o->out ? " not written" : "");
    return CLI_OK;
}

/* --train: k by the rule of pack --help when --k is not given; every
 * position exact when even the smallest codebook costs more than the rows
 * it would encode. */
static void pack_choose_k(const pack_opts *o, const kvio_cache *c, pack_plan *p)
{
    p->k = o->code.k;
    const char *advice =
        o->llama ? "for short states a shared codebook compresses better: train it once on states "
                   "of other prompts (fkvf train STATE... --model MODEL.gguf -o CODEBOOKS) and "
                   "import with --codebooks CODEBOOKS"
                 : "for small caches a shared codebook compresses better: train it once "
                   "(fkvf train CACHE... -o CODEBOOKS) and pack with --codebooks CODEBOOKS";
    uint64_t A = p->A;
    /* the --layer-stages table when it fits the cache (else training refuses it) */
    const uint8_t *lst = o->code.n_lst == c->n_layers ? o->code.lst : NULL;
    if (A > 0 && !o->cbfile && !o->code.k_set && o->code.ks + o->code.vs > 0) {
        p->k = cli_auto_k(c, A, o->code.ks, o->code.vs, lst, o->f32);
        if (p->k)
            return;
        uint32_t k = p->k = CLI_CB_K_MIN;
        fkvf_codebook_shape sh = {c->n_layers, c->n_kv_heads, c->key_dim, c->value_dim, k,
                                  o->code.ks, o->code.vs,
                                  o->f32 ? FKVF_DTYPE_F32 : FKVF_DTYPE_F16, 0, lst};
        uint64_t cb = fkvf_codebook_size(&sh);
        double idx, exact = (double)A * (double)p->rb;
        if (!fkvf_codebook_pays(&sh, c->n_kv_heads, A, p->rb, &idx)) {
            cli_note("%s: %" PRIu64 " archived positions are too few for an embedded "
                     "codebook (k = %u: %" PRIu64 " codebook bytes + about %.0f index bytes "
                     ">= the %.0f bytes of the rows): every position stored exact, no "
                     "codebook, and every position a later fkvf append adds to the "
                     "archive is stored exact too (an archive's codebook is chosen when it "
                     "is made); --k N forces a codebook; %s",
                     o->in, A, k, cb, idx, exact, advice);
            p->S = p->P;
            p->W = 0;
            p->A = 0;
        } else {
            cli_warn_k_min(o->in, c, A, "archived positions", o->code.ks, o->code.vs, lst, o->f32,
                           advice);
        }
    } else if (A > 0 && !o->cbfile) {
        cli_warn_codebook(o->in, c, p->k,
                          cli_cb_bytes(c, p->k, o->code.ks, o->code.vs, lst, o->f32, 0),
                          A, A, "archived rows it encodes", "archived rows it encodes", advice);
    }
}

/* The rows --train trains on: the cache's sample (every position when
 * they fit the budget; sinks and window are positions too) into s->rows,
 * a block per run (*blocks, *n). Returns the exit status. */
static int pack_train_rows(const pack_opts *o, pack_state *s, const pack_plan *p,
                           fkvf_rows **blocks, size_t *n)
{
    const kvio_cache *c = &s->c;
    cli_run *runs = NULL;
    size_t nr = 0;
    uint64_t used, P = p->P;
    int ex = cli_train_sample(o->in, &P, 1, p->rb, o->code.max_train, o->code.seed, &runs, &nr,
                              &used);
    if (ex != CLI_OK)
        return ex;
    if (p->rb && used > SIZE_MAX / p->rb) {
        free(runs);
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->in, "out of memory");
    }
    s->rows = malloc((size_t)(used ? used : 1) * p->rb);
    *blocks = calloc(nr ? nr : 1, sizeof **blocks);
    if (!s->rows || !*blocks) {
        free(runs);
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->in, "out of memory");
    }
    uint8_t *at = s->rows;
    for (size_t r = 0; r < nr; r++) {
        (*blocks)[r] = (fkvf_rows){at, (size_t)runs[r].n, c->dtype, runs[r].first};
        at += (size_t)runs[r].n * p->rb;
    }
    *n = nr;
    cli_progress pg;
    cli_progress_init(&pg, "read", used * p->rb < CLI_READ_PROGRESS_MIN);
    pg.bytes = 1;
    uint64_t done = 0;
    at = s->rows;
    ex = cli_sample_read(c, o->in, runs, nr, 0, &at, &pg, &done, used * p->rb);
    free(runs);
    return ex;
}

/* The codebooks trained on the cache's rows (--train), or on its sample
 * when they do not fit the budget; the rows freed after. */
static int pack_train(const pack_opts *o, pack_state *s, pack_plan *p)
{
    const kvio_cache *c = &s->c;
    fkvf_rows *blocks = NULL;
    size_t nb = 0;
    int ex = pack_train_rows(o, s, p, &blocks, &nb);
    if (ex != CLI_OK) {
        free(blocks);
        return ex;
    }
    fkvf_rvq_params prm;
    cli_rvq_params_for(&prm, c);
    prm.k = p->k;
    prm.k_stages = o->code.ks;
    prm.v_stages = o->code.vs;
    int bad;
    prm.layer_stages = cli_layer_table(o->code.lst, o->code.n_lst, c->n_layers, &bad);
    if (bad) {
        free(blocks);
        return CLI_USAGE;
    }
    prm.table_dtype = o->f32 ? FKVF_DTYPE_F32 : FKVF_DTYPE_F16;
    prm.seed = o->code.seed;
    prm.max_iters = o->code.iters;
    prm.key_rope = p->krope;
    prm.n_threads = cli_threads();
    cli_progress pg;
    cli_progress_init(&pg, "train ", 0);
    prm.progress = cli_progress_cb;
    prm.progress_opaque = &pg;
    int rc = fkvf_rvq_train(&s->q, &prm, blocks, nb, NULL);
    free(blocks);
    free(s->rows); /* the archive's rows are read a chunk at a time */
    s->rows = NULL;
    if (rc != FKVF_OK)
        return cli_fail(rc == FKVF_E_NOMEM ? CLI_USAGE : CLI_INVALID, rc, o->in,
                        "training failed: %s", fkvf_strerror(rc));
    uint32_t heads;
    fkvf_rvq_shape(s->q, &p->shape, &heads);
    return CLI_OK;
}

/* positions encoded (and, without --train, read and converted to rows) at
 * a time: PACK_CHUNK a thread, as many as PACK_CHUNK_BYTES of rows hold when
 * that is fewer (at least PACK_CHUNK): each thread encodes a range of them.
 * Exact rows are written in sections of at most that many positions too. */
#define PACK_CHUNK 256
#define PACK_CHUNK_BYTES ((size_t)64 << 20)
/* codes of one index segment (spec 11.2) at most: a longer run of archived
 * positions is written as several segments, so that memory does not grow
 * with the cache (the writer holds one segment's streams at a time) */
#define PACK_SEGMENT_BYTES ((size_t)32 << 20)

static uint64_t pack_chunk_rows(const pack_plan *p)
{
    uint64_t n = (uint64_t)PACK_CHUNK * cli_threads();
    uint64_t fit = p->rb ? PACK_CHUNK_BYTES / p->rb : n;
    if (n > fit)
        n = fit;
    return n < PACK_CHUNK ? PACK_CHUNK : n;
}

/* Archived positions in one index segment: as many as PACK_SEGMENT_BYTES of
 * codes hold, a multiple of the streams' alignment (spec 11.6). Depends on
 * the shape alone, so the archive is the same for any thread count. */
static uint64_t pack_segment_rows(size_t ncodes, uint32_t align)
{
    uint64_t n = PACK_SEGMENT_BYTES / (ncodes ? ncodes * sizeof(uint16_t) : 1);
    /* tests make many segments of a small cache (docs/testing.md) */
    const char *t = getenv("FKVF_TEST_PACK_SEGMENT");
    if (t && strtoull(t, NULL, 10) > 0)
        n = strtoull(t, NULL, 10);
    if (align == 0)
        align = 1;
    n -= n % align;
    return n < align ? align : n;
}

/* Rows [first, first + n) as spec 14.2 rows, read and converted from the
 * cache into s->chunk (n <= pack_chunk_rows); NULL after an error line
 * (*ex). */
static const uint8_t *pack_rows(const pack_opts *o, pack_state *s, const pack_plan *p,
                                uint64_t first, uint64_t n, int *ex)
{
    if (!s->chunk && !(s->chunk = malloc((size_t)pack_chunk_rows(p) * p->rb))) {
        *ex = cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->in, "out of memory");
        return NULL;
    }
    if ((*ex = cli_cache_rows(&s->c, (uint32_t)first, (uint32_t)(first + n), s->chunk)) != CLI_OK)
        return NULL;
    return s->chunk;
}

/* Archived positions [i0, i0 + n) (stream symbols; cache positions S + i)
 * encoded into s->codes (one array of n codes per index stream), a chunk
 * at a time, the progress bar moved on. */
static int pack_encode(const pack_opts *o, pack_state *s, const pack_plan *p, uint64_t i0,
                       uint64_t n, cli_progress *pg)
{
    const uint64_t chunk = pack_chunk_rows(p);
    for (uint64_t i = 0; i < n; i += chunk) {
        uint64_t m = n - i < chunk ? n - i : chunk;
        int ex;
        const uint8_t *rows = pack_rows(o, s, p, p->S + i0 + i, m, &ex);
        if (!rows)
            return ex;
        fkvf_rows part = {rows, (size_t)m, s->c.dtype, p->S + i0 + i};
        int rc = fkvf_rvq_encode(s->q, &part, p->krope, o->code.beam, s->codes + i, 1, (size_t)n);
        if (rc != FKVF_OK)
            return cli_fail(cli_fkvf_exit(rc), rc, o->in, "encoding failed: %s", fkvf_strerror(rc));
        cli_progress_cb(pg, i0 + i + m, p->A);
    }
    return CLI_OK;
}

/* The index streams: the A archived positions encoded and written one
 * segment (pack_segment_rows) at a time. *ex: the exit status when the
 * failure was not the writer's (its message printed). */
static int pack_write_index(const pack_opts *o, pack_state *s, const pack_plan *p,
                            const fkvf_stream_spec *sp, int *ex)
{
    size_t ncodes = fkvf_rvq_codes_per_position(s->q);
    uint64_t seg = pack_segment_rows(ncodes, fkvf_stream_spec_align(sp));
    uint64_t most = p->A < seg ? p->A : seg;
    if (!(s->codes = malloc(ncodes * (size_t)most * sizeof *s->codes + 1))) {
        *ex = cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->in, "out of memory");
        return FKVF_E_NOMEM;
    }
    fkvf_rvq_set_threads(s->q, cli_threads());
    cli_progress pg;
    cli_progress_init(&pg, "encode", 0);
    for (uint64_t i = 0; i < p->A; i += seg) {
        uint64_t n = p->A - i < seg ? p->A - i : seg;
        if ((*ex = pack_encode(o, s, p, i, n, &pg)) != CLI_OK)
            return FKVF_E_INVALID_ARG;
        /* s->codes holds one array of n codes per index stream */
        int rc = fkvf_writer_add_index_segment(s->w, sp, i, n, s->codes, 1, (size_t)n);
        if (rc != FKVF_OK)
            return rc;
    }
    return FKVF_OK;
}

/* Exact rows of positions [first, first + n): sections of at most
 * pack_chunk_rows positions (read a chunk at a time).
 * *ex as for pack_write_index. */
static int pack_write_exact(const pack_opts *o, pack_state *s, const pack_plan *p,
                            uint64_t first, uint64_t n, int *ex)
{
    const uint64_t chunk = pack_chunk_rows(p);
    unsigned xflags = o->deflate ? FKVF_SECTION_DEFLATE : 0;
    for (uint64_t i = 0; i < n; i += chunk) {
        uint64_t m = n - i < chunk ? n - i : chunk;
        const uint8_t *rows = pack_rows(o, s, p, first + i, m, ex);
        if (!rows)
            return FKVF_E_INVALID_ARG;
        int rc = fkvf_writer_add_exact(s->w, first + i, m, rows, (size_t)m * p->rb, xflags);
        if (rc != FKVF_OK)
            return rc;
    }
    return FKVF_OK;
}

/* The descriptor and the metadata. *stage: what failed. */
static int pack_write_desc(const pack_opts *o, pack_state *s, const pack_plan *p,
                           const char **stage)
{
    const kvio_cache *c = &s->c;
    fkvf_desc d;
    cli_desc_for(&d, c, &p->rope, o->keys.no_rope, p->krope);
    d.n_sinks = (uint32_t)p->S_policy;
    d.window = (uint32_t)(o->code.recent > UINT32_MAX ? UINT32_MAX : o->code.recent);
    d.model_id = o->code.model_id;
    d.tokenizer_id = o->code.tok_id;
    if (c->names == KVIO_NAMES_LLAMA) {
        cli_llama_desc(&d); /* model id and weights hash from --model */
        if (!d.tokenizer_id)
            d.tokenizer_id = d.model_id; /* the GGUF carries its tokenizer */
    }
    *stage = "descriptor";
    int rc = fkvf_writer_set_desc(s->w, &d);
    if (rc == FKVF_OK) {
        *stage = "metadata";
        rc = fkvf_writer_meta_utf8(s->w, "pack.source", cli_base_name(o->in));
    }
    if (rc == FKVF_OK)
        rc = fkvf_writer_meta_utf8(s->w, "pack.tool", "fkvf " FKVF_VERSION_STRING);
    if (rc == FKVF_OK)
        rc = pack_source_meta(s->w, c, o->layout, o->in);
    if (rc == FKVF_OK && p->A > 0) {
        rc = fkvf_writer_meta_u64(s->w, "pack.beam", o->code.beam);
        if (rc == FKVF_OK && o->train)
            rc = fkvf_writer_meta_u64(s->w, "pack.seed", o->code.seed);
        if (rc == FKVF_OK && o->cbfile)
            rc = fkvf_writer_meta_utf8(s->w, "pack.codebooks", cli_base_name(o->cbfile));
    }
    return rc;
}

/* The codebooks (embedded, or the reference to the file) and the index
 * streams (encoded here). *ex as for pack_write_index. */
static int pack_write_codebooks(const pack_opts *o, pack_state *s, const pack_plan *p,
                                const char **stage, int *ex)
{
    int rc;
    *stage = "codebooks";
    if (o->cbfile) {
        rc = fkvf_writer_add_codebook_ref(s->w, &p->shape, p->hash, cli_base_name(o->cbfile));
    } else {
        size_t tsz = fkvf_rvq_tables_size(s->q);
        s->tables = malloc(tsz ? tsz : 1);
        rc = s->tables ? fkvf_rvq_tables(s->q, s->tables, tsz) : FKVF_E_NOMEM;
        if (rc == FKVF_OK)
            rc = fkvf_writer_add_codebooks(s->w, &p->shape, s->tables, tsz, 0);
    }
    *stage = "index streams";
    if (rc != FKVF_OK || p->A == 0)
        return rc;
    fkvf_stream_spec sp;
    memset(&sp, 0, sizeof sp);
    if (o->code.ngon) {
        sp.profile = FKVF_PROFILE_NGON;
        sp.alphabet = p->shape.k;
    } else {
        sp.profile = FKVF_PROFILE_QUAD;
        sp.symbol_bits = fkvf_quad_bits_for(p->shape.k - 1);
    }
    return pack_write_index(o, s, p, &sp, ex);
}

/* The token stream (left out, with a warning, for ids above 2^32-1). */
static int pack_write_tokens(const pack_opts *o, pack_state *s, const pack_plan *p)
{
    const kvio_cache *c = &s->c;
    uint64_t P = p->P;
    uint32_t *tok = s->sym ? s->sym : malloc((size_t)P * sizeof *tok);
    int64_t mx = 0;
    int rc = FKVF_OK;
    for (uint64_t t = 0; t < P; t++)
        mx = c->tokens[t] > mx ? c->tokens[t] : mx;
    if (!tok) {
        rc = FKVF_E_NOMEM;
    } else if (mx > (int64_t)UINT32_MAX) {
        cli_warn("%s: token ids above 2^32-1, token stream left out", o->in);
    } else {
        for (uint64_t t = 0; t < P; t++)
            tok[t] = (uint32_t)c->tokens[t];
        /* a llama.cpp state: wide enough for the model's vocabulary, so that
         * later saves (appended) can hold any of its ids */
        int ex;
        const gguf_model *m = c->names == KVIO_NAMES_LLAMA ? cli_llama_model(&ex) : NULL;
        if (m && m->n_vocab > 0 && m->n_vocab - 1 > mx)
            mx = m->n_vocab - 1;
        fkvf_stream_spec sp;
        memset(&sp, 0, sizeof sp);
        sp.profile = FKVF_PROFILE_QUAD;
        sp.symbol_bits = fkvf_quad_bits_for((uint64_t)mx);
        rc = fkvf_writer_add_token_segment(s->w, &sp, 0, tok, (size_t)P);
    }
    if (tok != s->sym)
        free(tok);
    return rc;
}

/* The archive written: descriptor, metadata, exact rows, codebooks and
 * index streams, token stream, commit. */
static int pack_write(const pack_opts *o, pack_state *s, const pack_plan *p)
{
    const kvio_cache *c = &s->c;
    uint64_t S = p->S, W = p->W, A = p->A;
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    if (o->cbfile)
        wo.required_features |= FKVF_FEAT_EXTERNAL_CODEBOOK;
    if ((A > 0 || o->cbfile) && o->code.ngon)
        wo.required_features |= FKVF_FEAT_NGON;
    if (o->deflate)
        wo.required_features |= FKVF_FEAT_DEFLATE;
    if ((A > 0 || o->cbfile) && p->shape.layer_stages) /* stage counts per layer */
        wo.required_features |= FKVF_FEAT_LAYER_STAGES;
    if (c->tokens)
        wo.optional_features |= FKVF_OPTFEAT_TOKEN_STREAM;
    wo.no_replace = !o->force; /* nor one that appears meanwhile */
    int rc = fkvf_writer_create_file(&s->w, o->out, &wo, NULL);
    if (rc != FKVF_OK)
        return cli_fail_writer(rc, s->w, o->out, "");
    const char *stage = "descriptor";
    rc = pack_write_desc(o, s, p, &stage);
    int ex = CLI_OK; /* a failure other than the writer's, reported already */
    if (rc == FKVF_OK)
        stage = "exact rows";
    if (rc == FKVF_OK && S > 0)
        rc = pack_write_exact(o, s, p, 0, S, &ex);
    if (rc == FKVF_OK && W > 0)
        rc = pack_write_exact(o, s, p, S + A, W, &ex);
    if (rc == FKVF_OK && (A > 0 || o->cbfile))
        rc = pack_write_codebooks(o, s, p, &stage, &ex);
    if (ex != CLI_OK)
        return ex;
    if (rc == FKVF_OK && c->tokens) {
        stage = "token stream";
        rc = pack_write_tokens(o, s, p);
    }
    if (rc == FKVF_OK) {
        stage = "commit";
        rc = fkvf_writer_set_positions(s->w, p->P, A);
    }
    if (rc == FKVF_OK)
        rc = fkvf_writer_finish(s->w);
    if (rc != FKVF_OK) {
        char pre[64];
        snprintf(pre, sizeof pre, "writing the %s failed: ", stage);
        return cli_fail_writer(rc, s->w, o->out, pre);
    }
    return CLI_OK;
}

/* The archive's size and its ratio vs fp16 with the codebook counted
 * (embedded, or the file's size), then without it. */
static void pack_print(const pack_opts *o, const pack_state *s, const pack_plan *p)
{
    uint64_t P = p->P, A = p->A;
    uint64_t bytes = cli_file_size(o->out);
    double fp16 = cli_fp16_rows(&s->c, P);
    uint64_t cbb = A > 0 && !o->cbfile ? fkvf_codebook_size(&p->shape) : 0;
    char ratio[256];
    uint64_t fb = o->cbfile ? cli_file_size(o->cbfile) : 0;
    double r_with, r_without; /* the codebook counted, and not */
    if (o->cbfile) {
        r_with = fp16 / (double)(bytes + fb);
        r_without = bytes ? fp16 / (double)bytes : 0.0;
        snprintf(ratio, sizeof ratio, "%.2fx with the codebook file (%s, %" PRIu64
                 " bytes), %.2fx without it", r_with, cli_base_name(o->cbfile), fb, r_without);
    } else if (cbb && cbb < bytes) {
        r_with = fp16 / (double)bytes;
        r_without = fp16 / (double)(bytes - cbb);
        snprintf(ratio, sizeof ratio, "%.2fx with the embedded codebook (k = %u, %" PRIu64
                 " bytes), %.2fx without it", r_with, p->shape.k, cbb, r_without);
    } else {
        r_with = r_without = bytes ? fp16 / (double)bytes : 0.0;
        snprintf(ratio, sizeof ratio, "%.2fx, no codebook (every position exact)", r_with);
    }
    if (!o->json) {
        char msg[1024];
        snprintf(msg, sizeof msg,
                 "%s: %" PRIu64 " positions (%" PRIu64 " exact, %" PRIu64 " archived), %" PRIu64
                 " bytes, ratio vs fp16 %s; fp16 cache %.0f bytes",
                 o->out, P, P - A, A, bytes, ratio, fp16);
        puts(msg);
        return;
    }
    printf("{\"archive\":");
    cli_json_cstr(stdout, o->out);
    printf(",\"cache\":");
    cli_json_cstr(stdout, o->in);
    printf(",\"positions\":%" PRIu64 ",\"exact\":%" PRIu64 ",\"archived\":%" PRIu64
           ",\"bytes\":%" PRIu64 ",\"fp16_bytes\":%.0f,\"codebook_bytes\":%" PRIu64
           ",\"k\":%u,\"codebooks\":",
           P, P - A, A, bytes, fp16, o->cbfile ? fb : cbb, A > 0 || o->cbfile ? p->shape.k : 0u);
    if (o->cbfile) {
        printf("{\"external\":");
        cli_json_cstr(stdout, o->cbfile);
        printf("}");
    } else {
        printf(A > 0 ? "\"embedded\"" : "null");
    }
    printf(",\"ratio_fp16\":%.6g,\"ratio_fp16_with_codebook\":%.6g,"
           "\"ratio_fp16_without_codebook\":%.6g,\"indexed\":%s}\n",
           bytes ? fp16 / (double)bytes : 0.0, r_with, r_without,
           o->index_bytes ? "true" : "false");
}

/* The cache read and checked, the geometry planned, the RoPE check.
 * Returns -1 to go on, else the exit status. */
static int pack_prepare(pack_opts *o, pack_state *s, pack_plan *p)
{
    struct stat st;
    if (o->llama && cli_llama_sniff_file(o->in) == LLST_KIND_NONE &&
        stat(o->in, &st) == 0 && S_ISREG(st.st_mode) && !access(o->in, R_OK))
        return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o->in,
                        "not a llama.cpp state file (no 'ggsq' or 'ggsn' magic)%s",
                        cli_llama_is_gguf_file(o->in)
                            ? ": it is a GGUF model; STATE comes first, --model MODEL.gguf"
                        : cli_is_fkvf_file(o->in)
                            ? ": it is an FKVF archive; fkvf export-llama ARCHIVE -o STATE writes "
                              "it back as a state file"
                            : "; fkvf pack reads .safetensors, .npz and .npy caches");
    int ex = read_cache(o->in, o->layout, 1, &s->c);
    if (ex)
        return ex;
    kvio_cache *c = &s->c;
    p->P = c->n_positions;
    p->S = o->code.sinks < p->P ? o->code.sinks : p->P;
    p->W = o->code.recent < p->P - p->S ? o->code.recent : p->P - p->S;
    p->A = p->P - p->S - p->W;
    p->S_policy = p->S;
    p->rb = cli_cache_row_elems(c) * kvio_dtype_size(c->dtype);
    /* a codebook file is checked (and referred to) even when no position
     * ends up archived: the archive can then archive later appends */
    if (o->cbfile &&
        (ex = cli_load_codebook_file(o->cbfile, c, &o->keys, &s->cbr, &p->shape, p->hash, &s->q,
                                     1)))
        return ex;
    cli_keys_hf_default(&o->keys, c, o->in);
    if (cli_key_rope(&o->keys, c->key_dim, o->in, &p->rope, &p->krope))
        return CLI_USAGE;
    return pack_check_rope(o, s, p);
}

static int pack_run(pack_opts *o, pack_state *s, pack_plan *p)
{
    int ex = pack_prepare(o, s, p);
    if (ex >= 0)
        return ex;
    pack_choose_k(o, &s->c, p);
    /* the rows trained on (the budget's worth at most) are read for
     * training and freed; the archive's rows are read from the cache's
     * file a chunk at a time while it is written (memory bounded whatever
     * the cache's size) */
    if (p->A > 0 && !s->q && (ex = pack_train(o, s, p)) != CLI_OK)
        return ex;
    if ((ex = pack_write(o, s, p)) != CLI_OK)
        return ex;
    /* the default indexes the token stream: none without token ids */
    if ((o->index == 2 || (o->index == 1 && s->c.tokens)) &&
        (ex = fkvf_cli_index_file(o->out, o->index == 1, 0, &o->index_bytes)))
        return ex; /* search index (fkvf_search.c); the archive itself is complete */
    pack_print(o, s, p);
    return CLI_OK;
}

int cli_pack_main(int argc, char **argv, int llama, const char *help)
{
    pack_opts o;
    int pr = pack_parse(argc, argv, &o, llama, help);
    if (pr)
        return pr > 0 ? CLI_OK : CLI_USAGE;
    const char *inputs[] = {o.in, o.cbfile, cli_llama_model_path()};
    int ex = CLI_OK;
    if (o.out) { /* --check-rope alone writes nothing */
        if ((ex = cli_check_output(o.out, inputs, 3, o.force)) != CLI_OK)
            return ex;
        cli_warn_fkvf_name(o.out, "archive");
    }
    pack_state s;
    memset(&s, 0, sizeof s);
    pack_plan p;
    memset(&p, 0, sizeof p);
    ex = pack_run(&o, &s, &p);
    pack_free(&s);
    return ex;
}

int fkvf_cli_pack(int argc, char **argv) { return cli_pack_main(argc, argv, 0, pack_help); }

/* ---- unpack ------------------------------------------------------------- */

static const char *unpack_help =
    "usage: fkvf unpack ARCHIVE -o CACHE.safetensors|.npz|.npy [options]\n"
    "\n"
    "Restore every position of an archive into a raw cache file (format by\n"
    "extension): exact positions bit for bit, archived ones reconstructed.\n"
    "\n"
    "  --codebooks FILE      codebook file for an archive that refers to one\n"
    "                        (default: found by content hash in the archive's\n"
    "                        directory, then in each directory of FKVF_CODEBOOK_PATH;\n"
    "                        docs/codebooks.md)\n"
    "  --dtype f16|bf16|f32  element type of the output (the archive's)\n"
    "  --names fkvf|hf       tensor names: layers.{i}.key/.value [H, T, D] and tokens\n"
    "                        [T] (fkvf), or Hugging Face past_key_values.{i}.key/.value\n"
    "                        [1, H, T, D] and input_ids [1, T] (hf; .npy: [L, 2, 1, H,\n"
    "                        T, D]). Default: as packed (the archive's pack.names: hf\n"
    "                        for any Hugging Face scheme), else fkvf\n"
    "  --hf                  the same as --names hf\n"
    "  --layout hnd|nhd      heads-first [H, T, D] or positions-first [T, H, D]\n"
    "                        (default: as packed, the archive's pack.layout, else hnd)\n"
    "  --force               replace CACHE if it exists (default: refused); an input\n"
    "                        (ARCHIVE, its codebook file) is never replaced\n"
    "  --threads N           threads (default: every CPU this process may use,\n"
    "                        or FKVF_THREADS); the output is the same for any N\n"
    "  --json                one JSON object: archive, out, format, dtype, positions,\n"
    "                        exact, archived, tokens, bytes (on failure\n"
    "                        {\"error\":{...}}, docs/cli.md)\n"
    "\n"
    "A .safetensors output gets the __metadata__ of the packed file back (kept in\n"
    "the archive as safetensors.KEY). .npz and .npy carry no metadata, and .npy no\n"
    "token ids: what they cannot hold is named on stderr.\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (not an archive; its codebook not found\n"
    "or wrong; CACHE exists without --force or is an input), 2 usage or I/O\n"
    "error (bad option, unknown output extension, a path that does not exist\n"
    "or cannot be written, also a --codebooks FILE that does not exist).\n";

/* Is the archive's metadata entry key the UTF-8 text word? */
static int meta_is(fkvf_reader *r, const char *key, const char *word)
{
    fkvf_meta_entry e;
    return fkvf_reader_meta_find(r, key, &e) == FKVF_OK && e.type == FKVF_META_UTF8 &&
           e.value_len == strlen(word) && !memcmp(e.value, word, e.value_len);
}

/* The archive's safetensors.KEY entries back into c's metadata (for a
 * .safetensors output; else counted). Returns the number of entries, or -1
 * when out of memory. */
static long unpack_st_meta(fkvf_reader *r, kvio_cache *c, int keep, const char *out)
{
    size_t n = 0, pl = strlen(ST_META_PREFIX);
    long found = 0;
    if (fkvf_reader_meta_count(r, &n) != FKVF_OK)
        return 0;
    for (size_t i = 0; i < n; i++) {
        fkvf_meta_entry e;
        if (fkvf_reader_meta(r, i, &e) != FKVF_OK || e.type != FKVF_META_UTF8 ||
            e.key_len < pl || memcmp(e.key, ST_META_PREFIX, pl))
            continue;
        found++;
        if (!keep)
            continue;
        char *key = malloc(e.key_len - pl + 1), *val = malloc(e.value_len + 1);
        if (!key || !val) {
            free(key);
            free(val);
            return -1;
        }
        memcpy(key, e.key + pl, e.key_len - pl);
        key[e.key_len - pl] = 0;
        memcpy(val, e.value, e.value_len);
        val[e.value_len] = 0;
        int rc = KVIO_OK;
        if (strlen(key) != e.key_len - pl || strlen(val) != e.value_len ||
            !strcmp(key, "__metadata__"))
            cli_warn("%s: metadata entry '%s%s' not written (a NUL byte, or a reserved "
                    "name)",
                    out, ST_META_PREFIX, key);
        else
            rc = kvio_cache_set_meta(c, key, val);
        free(key);
        free(val);
        if (rc != KVIO_OK)
            return -1;
    }
    return found;
}

typedef struct unpack_opts {
    const char *in, *out, *cbpath;
    int dtype, names, layout; /* names: 0 as packed, 1 fkvf, 2 hf */
    int force, json;
    kvio_format fmt;          /* the output's, by its extension */
} unpack_opts;

/* Returns -1 to go on, else the exit status (help printed, usage error). */
static int unpack_parse(int argc, char **argv, unpack_opts *o)
{
    memset(o, 0, sizeof *o);
    o->layout = CLI_LAYOUT_UNSET;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(unpack_help, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--hf")) {
            o->names = 2;
        } else if (!strcmp(a, "--names") || !strcmp(a, "--layout")) {
            if (!v)
                return cli_usage("%s needs a value", a);
            i++;
            if (a[2] == 'l') {
                if (cli_opt_layout(v, &o->layout))
                    return CLI_USAGE;
            } else if (!strcmp(v, "fkvf") || !strcmp(v, "hf")) {
                o->names = v[0] == 'f' ? 1 : 2;
            } else {
                return cli_usage("--names: '%s' is not fkvf or hf", v);
            }
        } else if (!strcmp(a, "--force")) {
            o->force = 1;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--codebooks") || !strcmp(a, "--dtype")) {
            if (!v)
                return cli_usage("%s needs a value", a);
            i++;
            if (a[1] == 'o')
                o->out = v;
            else if (a[2] == 'c')
                o->cbpath = v;
            else if (cli_opt_dtype(v, &o->dtype))
                return CLI_USAGE;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage("unknown option '%s' (see fkvf unpack --help)", a);
        } else if (!o->in) {
            o->in = a;
        } else {
            return cli_usage("unexpected argument '%s'", a);
        }
    }
    if (!o->in || !o->out)
        return cli_usage("need ARCHIVE and -o CACHE (see fkvf unpack --help)");
    o->fmt = kvio_format_from_path(o->out);
    if (o->fmt == KVIO_FMT_AUTO)
        return cli_fail(CLI_USAGE, FKVF_E_INVALID_ARG, o->out,
                        "unknown output format (use .safetensors, .npz or .npy)");
    return -1;
}

typedef struct unpack_state {
    fkvf_reader *r, *cb;
    kvio_cache c;
    uint8_t *buf, *buf2; /* restored rows: a chunk, and unpack's second one */
    uint32_t *tok;
    fkvf_archive_info ai;
    fkvf_desc d;
    fkvf_dtype dt;          /* the output's element type */
    uint32_t P;
    size_t tidx;            /* the token stream's index */
    int has_tok_stream;     /* the archive has token ids for every position */
    int has_tok;            /* and the output holds them */
    int said_layout, said_names; /* layout, names as packed (notes to print) */
    long nmeta;             /* the archive's safetensors metadata entries */
    char hx[33];            /* the external codebook's content hash */
} unpack_state;

static void unpack_free(unpack_state *s)
{
    free(s->buf);
    free(s->buf2);
    free(s->tok);
    kvio_cache_free(&s->c);
    fkvf_reader_free(s->r);
    fkvf_reader_free(s->cb);
}

/* The archive opened, with its codebook file when it refers to one, and
 * checked against the output. Returns the exit status. */
static int unpack_open(const unpack_opts *o, unpack_state *s)
{
    int rc, ex;
    const char *in = o->in;
    if ((ex = cli_open_archive(&s->r, in)) != CLI_OK)
        return ex;
    if ((rc = fkvf_reader_info(s->r, &s->ai)) != FKVF_OK ||
        (rc = fkvf_reader_desc(s->r, &s->d)) != FKVF_OK)
        return cli_fail_reader(rc, s->r, in, "");
    if (s->ai.n_positions > UINT32_MAX)
        return cli_fail(CLI_INVALID, FKVF_E_LIMIT, in,
                        "%" PRIu64 " positions: more than a raw cache file holds", s->ai.n_positions);
    int ext = 0;
    uint8_t want[16] = {0}; /* left alone by the library when not external */
    fkvf_reader_codebook_ref(s->r, &ext, want, NULL);
    cli_hex16(want, s->hx); /* printed only in the messages of an external codebook */
    if (ext && s->ai.n_archived > 0) {
        if ((ex = cli_open_codebook(s->r, in, o->cbpath, &s->cb, NULL)))
            return ex;
    } else if (ext && !o->cbpath) {
        /* not needed to restore, but it is an input all the same: the
         * output must not replace it (not found: nothing to protect) */
        (void)fkvf_reader_find_codebook(s->r, getenv("FKVF_CODEBOOK_PATH"), &s->cb);
    }
    /* the codebook file found by its hash is an input too */
    const char *cb_path = s->cb ? fkvf_reader_file_name(s->cb) : NULL;
    if (!o->cbpath && cb_path && (ex = cli_check_output(o->out, &cb_path, 1, 1)))
        return ex;
    if (o->fmt == KVIO_FMT_NPY && s->d.key_dim != s->d.value_dim) {
        /* found before restoring anything */
        return cli_fail(CLI_USAGE, FKVF_E_INVALID_ARG, o->out,
                        "a .npy file holds one array: key_dim %u and value_dim %u must be equal "
                        "(use .safetensors or .npz)",
                        s->d.key_dim, s->d.value_dim);
    }
    return CLI_OK;
}

/* Positions restored in chunks of at most this many bytes of rows (one
 * position when a row is larger): what bounds unpack's memory (two of
 * them: one read while the other is written). 8 MiB: unpack of a GPT-2
 * size cache in 61 MiB peak RSS (78 MiB with 16 MiB chunks; compare.sh's
 * bound is 64), pieces of 256-512 KiB a head at head dim 64-128. */
#define UNPACK_CHUNK_BYTES (8u << 20)

/* s->buf for chunks of *chunk positions of *rb bytes each, at most bytes
 * of rows (0: UNPACK_CHUNK_BYTES) unless one row is larger. Returns the
 * exit status. */
static int unpack_chunk_buf(const unpack_opts *o, unpack_state *s, size_t bytes, size_t *rb,
                            uint32_t *chunk)
{
    if (!bytes)
        bytes = UNPACK_CHUNK_BYTES;
    int rc = fkvf_reader_row_bytes(s->r, s->dt, rb);
    if (rc != FKVF_OK)
        return cli_fail_reader(rc, s->r, o->in, "");
    fkvf_reader_set_threads(s->r, cli_threads());
    *chunk = (uint32_t)(*rb >= bytes ? 1 : bytes / *rb);
    if (*chunk > s->P)
        *chunk = s->P ? s->P : 1;
    s->buf = malloc((size_t)*chunk * *rb);
    if (!s->buf)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->in, "out of memory");
    return CLI_OK;
}

/* Rows of positions [p, p + n) into s->buf (room for cap bytes). Returns
 * the exit status. */
static int unpack_restore_chunk(const unpack_opts *o, unpack_state *s, uint32_t p, uint32_t n,
                                size_t cap)
{
    int rc = fkvf_reader_restore(s->r, p, n, s->dt, s->buf, cap);
    if (rc == FKVF_E_CODEBOOK) {
        char pre[96];
        snprintf(pre, sizeof pre, "(expected codebook content hash %s) ", s->hx);
        return cli_fail_reader(rc, s->r, o->in, pre);
    }
    return rc == FKVF_OK ? CLI_OK : cli_fail_reader(rc, s->r, o->in, "");
}

/* Names, layout and metadata (into s->c) as packed, unless given (*names,
 * *layout); s->nmeta: the archive's safetensors metadata entries. Returns
 * the exit status. */
static int unpack_as_packed(const unpack_opts *o, unpack_state *s, int *names, int *layout)
{
    fkvf_reader *r = s->r;
    if (*layout == CLI_LAYOUT_UNSET && meta_is(r, "pack.layout", "nhd")) {
        *layout = CLI_LAYOUT_NHD;
        s->said_layout = 1;
    }
    if (!*names && (meta_is(r, "pack.names", "hf") || meta_is(r, "pack.names", "hf-legacy") ||
                    meta_is(r, "pack.names", "hf-dynamic"))) {
        *names = 2;
        s->said_names = 1;
    }
    s->nmeta = unpack_st_meta(r, &s->c, o->fmt == KVIO_FMT_SAFETENSORS, o->out);
    if (s->nmeta < 0)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->in, "out of memory");
    return CLI_OK;
}

/* The notes on what unpack_as_packed decided (the shapes written, the
 * layout first) and the warnings on what the output format cannot hold. */
static void unpack_say(const unpack_opts *o, const unpack_state *s, int layout)
{
    const char *out = o->out;
    if (s->said_layout)
        cli_note("%s: positions-first tensors [T, H, D], as packed (--layout hnd for [H, T, D])", out);
    if (s->said_names) {
        int nhd = layout == CLI_LAYOUT_NHD;
        cli_note("%s: Hugging Face names and shapes (past_key_values.{i}.key %s, input_ids), "
                 "as packed (--names fkvf for layers.{i}.key %s)",
                 out, nhd ? "[1, T, H, D]" : "[1, H, T, D]", nhd ? "[T, H, D]" : "[H, T, D]");
    }
    if (s->nmeta > 0 && o->fmt != KVIO_FMT_SAFETENSORS)
        cli_warn("%s: the archive's %ld safetensors __metadata__ entries are not written "
                "(a .%s file has no metadata; use .safetensors)",
                out, s->nmeta, kvio_format_name(o->fmt));
    if (o->fmt == KVIO_FMT_NPY && s->has_tok_stream)
        cli_warn("%s: the archive's %u token ids are not written (a .npy file holds one "
                "array; use .safetensors or .npz)",
                out, s->P);
}

static void unpack_print(const unpack_opts *o, const unpack_state *s)
{
    const fkvf_archive_info *ai = &s->ai;
    if (o->json) {
        printf("{\"archive\":");
        cli_json_cstr(stdout, o->in);
        printf(",\"out\":");
        cli_json_cstr(stdout, o->out);
        printf(",\"format\":\"%s\",\"dtype\":\"%s\",\"positions\":%u,\"exact\":%" PRIu64
               ",\"archived\":%" PRIu64 ",\"tokens\":%s,\"bytes\":%" PRIu64 "}\n",
               kvio_format_name(o->fmt), kvio_dtype_name(s->dt), s->P,
               ai->n_positions - ai->n_archived, ai->n_archived, s->has_tok ? "true" : "false",
               cli_file_size(o->out));
    } else {
        printf("%s: %u positions (%" PRIu64 " exact, %" PRIu64 " archived), %s, %s\n", o->out,
               s->P, ai->n_positions - ai->n_archived, ai->n_archived, kvio_dtype_name(s->dt),
               kvio_format_name(o->fmt));
    }
}

/* How unpack reads the archive: positions [p, p + n) of layers
 * [l0, l0 + nl) at a time, heads-first when the output is [H, T, D] (each
 * head's rows one run in the file) and as rows when it is [T, H, D]. When
 * few positions are exact, a pass goes over all positions for a group of
 * layers (layer-major: the output's tensors are finished one layer after
 * the other, so their bytes start going to disk while the next layers are
 * decoded); else over all layers at once (a pass re-reads every exact row it
 * covers: LAYER_MAJOR_EXACT bounds that re-reading at once the output). */
#define LAYER_MAJOR_EXACT 1
#define UNPACK_ROPE_PASSES 8
typedef struct unpack_plan {
    uint32_t n;      /* positions per chunk */
    uint32_t nl;     /* layers per pass */
    int heads;       /* FKVF_LAYOUT_HEADS (else ROWS) */
    size_t lb;       /* bytes of one position of one layer */
} unpack_plan;

static void unpack_plan_make(const unpack_state *s, int nhd, unpack_plan *pl)
{
    const fkvf_desc *d = &s->d;
    uint32_t L = d->n_layers, P = s->P ? s->P : 1;
    pl->lb = (size_t)d->n_kv_heads * ((size_t)d->key_dim + d->value_dim) * kvio_dtype_size(s->dt);
    pl->heads = !nhd;
    uint64_t cb = UNPACK_CHUNK_BYTES;
    /* tests make many small chunks of a small archive (docs/testing.md) */
    const char *t = getenv("FKVF_TEST_UNPACK_CHUNK");
    if (t && strtoull(t, NULL, 10) > 0)
        cb = strtoull(t, NULL, 10);
    /* keys archived before RoPE: each pass computes the rotation angles of
     * every position again (64 sines and cosines a position at head dim
     * 128: 2.7 s for 32 passes over 32,768 positions), so at most
     * UNPACK_ROPE_PASSES passes, of more layers and fewer positions each */
    uint64_t min_nl = 1;
    if (d->key_storage == 1 && d->rope_dims > 0)
        min_nl = (L + UNPACK_ROPE_PASSES - 1) / UNPACK_ROPE_PASSES;
    uint64_t n = cb / (pl->lb * min_nl) ? cb / (pl->lb * min_nl) : 1;
    pl->n = (uint32_t)(n < P ? n : P);
    uint64_t nl = cb / ((uint64_t)pl->n * pl->lb);
    nl = nl < min_nl ? min_nl : nl > L ? L : nl;
    /* layer-major only while the passes re-read few exact rows:
     * exact * (passes - 1) <= LAYER_MAJOR_EXACT * P */
    uint64_t passes = (L + nl - 1) / nl, exact = s->ai.n_positions - s->ai.n_archived;
    if (passes > 1 && exact * (passes - 1) > (uint64_t)LAYER_MAJOR_EXACT * P) {
        nl = L; /* every layer of a chunk in one pass: fewer positions a chunk */
        uint64_t rb = (uint64_t)pl->lb * L;
        n = cb / rb ? cb / rb : 1;
        pl->n = (uint32_t)(n < P ? n : P);
    }
    pl->nl = (uint32_t)nl;
}

/* One chunk read from the archive (layers [l0, l0 + nl), positions
 * [p, p + n)) written into the stream, each layer's keys and values; with
 * kick, the output's bytes of those layers then start going to disk (a job
 * of unpack's writer thread). */
typedef struct unpack_job {
    kvio_stream *w;
    const uint8_t *buf;
    uint32_t p, n, l0, nl, heads;
    size_t kb, vb; /* one key row, one value row */
    int heads_first, kick;
    int rc;        /* the kvio error, 0 */
    char err[512]; /* its message */
} unpack_job;

static int unpack_write_chunk(void *opaque)
{
    unpack_job *j = opaque;
    size_t H = j->heads, n = j->n, lb = H * (j->kb + j->vb);
    for (uint32_t i = 0; i < j->nl && !j->rc; i++) {
        /* heads-first: per layer keys [h][n][Dk] then values [h][n][Dv];
         * rows: per position the layers' keys then values (spec 14.2) */
        const uint8_t *k = j->buf + (j->heads_first ? i * lb * n : i * lb);
        const uint8_t *v = k + (j->heads_first ? H * j->kb * n : H * j->kb);
        size_t kps = j->heads_first ? j->kb : lb * j->nl, khs = j->heads_first ? n * j->kb : j->kb;
        size_t vps = j->heads_first ? j->vb : lb * j->nl, vhs = j->heads_first ? n * j->vb : j->vb;
        if ((j->rc = kvio_stream_kv(j->w, j->l0 + i, 0, j->p, j->n, k, kps, khs, j->err,
                                    sizeof j->err)) == KVIO_OK)
            j->rc = kvio_stream_kv(j->w, j->l0 + i, 1, j->p, j->n, v, vps, vhs, j->err,
                                   sizeof j->err);
    }
    if (!j->rc && j->kick)
        kvio_stream_kick(j->w, j->l0, j->nl);
    return j->rc;
}

/* Positions [p, p + n) of layers [l0, l0 + nl) into s->buf as plan pl
 * says. Returns the exit status. */
static int unpack_read_chunk(const unpack_opts *o, unpack_state *s, const unpack_plan *pl,
                             uint32_t p, uint32_t n, uint32_t l0, uint32_t nl)
{
    fkvf_read_request q = {p, n, l0, nl, 0, 0, 0, s->dt,
                           pl->heads ? FKVF_LAYOUT_HEADS : FKVF_LAYOUT_ROWS};
    int rc = fkvf_reader_read(s->r, &q, s->buf, (size_t)n * nl * pl->lb);
    if (rc == FKVF_E_CODEBOOK) {
        char pre[96];
        snprintf(pre, sizeof pre, "(expected codebook content hash %s) ", s->hx);
        return cli_fail_reader(rc, s->r, o->in, pre);
    }
    return rc == FKVF_OK ? CLI_OK : cli_fail_reader(rc, s->r, o->in, "");
}

/* Every position read chunk by chunk (unpack_plan) and written into w: a
 * chunk is written by a thread of its own while the next one is read (two
 * buffers), so that decoding and writing overlap. Returns the exit
 * status. */
static int unpack_stream_rows(const unpack_opts *o, unpack_state *s, kvio_stream *w, int nhd)
{
    const fkvf_desc *d = &s->d;
    size_t es = kvio_dtype_size(s->dt);
    uint32_t P = s->P, L = d->n_layers;
    unpack_plan pl;
    unpack_plan_make(s, nhd, &pl);
    fkvf_reader_set_threads(s->r, cli_threads());
    size_t cap = (size_t)pl.n * pl.nl * pl.lb;
    if (!(s->buf = malloc(cap)) || !(s->buf2 = malloc(cap)))
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->in, "out of memory");
    unpack_job job[2];
    for (int b = 0; b < 2; b++)
        job[b] = (unpack_job){w, b ? s->buf2 : s->buf, 0, 0, 0, 0, d->n_kv_heads,
                              (size_t)d->key_dim * es, (size_t)d->value_dim * es, pl.heads,
                              0, 0, {0}};
    cli_bg bg;
    cli_bg_start(&bg);
    cli_progress pg;
    cli_progress_init(&pg, "unpack", 0);
    uint64_t done = 0, total = (uint64_t)P * L;
    int b = 0, ex = CLI_OK;
    for (uint32_t l0 = 0; l0 < L && ex == CLI_OK; l0 += pl.nl) {
        uint32_t nl = L - l0 < pl.nl ? L - l0 : pl.nl;
        for (uint32_t p = 0; p < P && ex == CLI_OK; p += pl.n, b ^= 1) {
            uint32_t n = P - p < pl.n ? P - p : pl.n;
            /* job[b]'s buffer is free: the job before the last has ended */
            s->buf = (uint8_t *)job[b].buf;
            if ((ex = unpack_read_chunk(o, s, &pl, p, n, l0, nl)) != CLI_OK)
                break;
            (void)fkvf_reader_trim(s->r); /* the archive's pages read for this chunk */
            job[b].p = p;
            job[b].n = n;
            job[b].l0 = l0;
            job[b].nl = nl;
            job[b].kick = nl < L && p + n == P; /* these layers are complete */
            if (cli_bg_post(&bg, unpack_write_chunk, &job[b]))
                break;
            done += (uint64_t)n * nl;
            cli_progress_cb(&pg, done, total);
        }
    }
    s->buf = (uint8_t *)job[0].buf; /* both freed by unpack_free */
    s->buf2 = (uint8_t *)job[1].buf;
    if (cli_bg_stop(&bg) && ex == CLI_OK) {
        const unpack_job *f = job[0].rc ? &job[0] : &job[1];
        ex = cli_fail_kvio(f->rc, o->out, f->err);
    }
    return ex;
}

/* Every position restored chunk by chunk into w, then the token ids, with
 * a progress bar. Returns the exit status. */
static int unpack_stream(const unpack_opts *o, unpack_state *s, kvio_stream *w, int nhd)
{
    uint32_t P = s->P;
    int ex, rc;
    char err[512];
    if ((ex = unpack_stream_rows(o, s, w, nhd)) != CLI_OK)
        return ex;
    if (!s->has_tok)
        return CLI_OK;
    /* the token ids in chunks too */
    uint32_t tchunk = P < 65536 ? (P ? P : 1) : 65536;
    int64_t *ids = malloc((size_t)tchunk * sizeof *ids);
    s->tok = malloc((size_t)tchunk * sizeof *s->tok);
    if (!ids || !s->tok) {
        free(ids);
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->in, "out of memory");
    }
    for (uint32_t p = 0; p < P; p += tchunk) {
        uint32_t n = P - p < tchunk ? P - p : tchunk;
        if ((rc = fkvf_reader_stream_read(s->r, s->tidx, p, s->tok, n)) != FKVF_OK) {
            free(ids);
            return cli_fail_reader(rc, s->r, o->in, "token stream: ");
        }
        for (uint32_t i = 0; i < n; i++)
            ids[i] = s->tok[i];
        if ((rc = kvio_stream_tokens(w, p, n, ids, err, sizeof err)) != KVIO_OK) {
            free(ids);
            return cli_fail_kvio(rc, o->out, err);
        }
    }
    free(ids);
    return CLI_OK;
}

static int unpack_run(const unpack_opts *o, unpack_state *s)
{
    int ex = unpack_open(o, s);
    if (ex != CLI_OK)
        return ex;
    s->dt = o->dtype ? (fkvf_dtype)o->dtype : s->d.dtype;
    s->P = (uint32_t)s->ai.n_positions;
    fkvf_stream_info tsi;
    s->has_tok_stream = fkvf_reader_stream_find(s->r, FKVF_STREAM_ID_TOKENS, &s->tidx) == FKVF_OK &&
                        fkvf_reader_stream_info(s->r, s->tidx, &tsi) == FKVF_OK &&
                        tsi.length >= s->P;
    s->has_tok = s->has_tok_stream && o->fmt != KVIO_FMT_NPY; /* one array: no room for token ids */
    /* s->c: the output's shape and metadata only; the data are streamed */
    s->c.n_layers = s->d.n_layers;
    s->c.n_kv_heads = s->d.n_kv_heads;
    s->c.n_positions = s->P;
    s->c.key_dim = s->d.key_dim;
    s->c.value_dim = s->d.value_dim;
    s->c.dtype = s->dt;
    s->c.token_width = 8;
    int names = o->names, layout = o->layout;
    if ((ex = unpack_as_packed(o, s, &names, &layout)) != CLI_OK)
        return ex;
    unsigned wflags = (names == 2 ? KVIO_WRITE_HF : 0) |
                      (layout == CLI_LAYOUT_NHD ? KVIO_WRITE_NHD : 0) |
                      (o->force ? 0 : KVIO_WRITE_NO_REPLACE);
    char err[512];
    kvio_stream *w;
    int rc = kvio_stream_open(&w, o->out, o->fmt, wflags, &s->c, s->has_tok, err, sizeof err);
    if (rc != KVIO_OK)
        return cli_fail_kvio(rc, o->out, err);
    if ((ex = unpack_stream(o, s, w, layout == CLI_LAYOUT_NHD)) != CLI_OK) {
        kvio_stream_discard(w);
        return ex;
    }
    unpack_say(o, s, layout);
    if ((rc = kvio_stream_finish(w, err, sizeof err)) != KVIO_OK)
        return cli_fail_kvio(rc, o->out, err);
    unpack_print(o, s);
    return CLI_OK;
}

/* cli_restore_stream's token ids, a chunk at a time. Returns the exit status. */
static int restore_tokens(const unpack_opts *o, unpack_state *s, const cli_restore_sink *k)
{
    uint32_t P = s->P, tchunk = P < 65536 ? (P ? P : 1) : 65536;
    int64_t *ids = malloc((size_t)tchunk * sizeof *ids);
    s->tok = malloc((size_t)tchunk * sizeof *s->tok);
    int ex = ids && s->tok ? CLI_OK : cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->in, "out of memory");
    for (uint32_t p = 0; ex == CLI_OK && p < P; p += tchunk) {
        uint32_t n = P - p < tchunk ? P - p : tchunk;
        int rc = fkvf_reader_stream_read(s->r, s->tidx, p, s->tok, n);
        if (rc != FKVF_OK) {
            ex = cli_fail_reader(rc, s->r, o->in, "token stream: ");
            break;
        }
        for (uint32_t i = 0; i < n; i++)
            ids[i] = s->tok[i];
        ex = k->tokens(k->opaque, ids, p, n);
    }
    free(ids);
    return ex;
}

/* cli_restore_stream once the archive is open: the shape to the sink, the
 * rows a chunk at a time, the token ids. Returns the exit status. */
static int restore_run(const unpack_opts *o, unpack_state *s, const cli_restore_sink *k)
{
    const fkvf_desc *d = &s->d;
    s->c.n_layers = d->n_layers;
    s->c.n_kv_heads = d->n_kv_heads;
    s->c.n_positions = s->P;
    s->c.key_dim = d->key_dim;
    s->c.value_dim = d->value_dim;
    s->c.dtype = s->dt;
    int ex = k->begin(k->opaque, s->r, &s->c, s->has_tok);
    size_t rb = 0;
    uint32_t chunk = 1;
    if (ex != CLI_OK || (ex = unpack_chunk_buf(o, s, k->chunk_bytes, &rb, &chunk)) != CLI_OK)
        return ex;
    cli_progress pg;
    cli_progress_init(&pg, "export", 0);
    for (uint32_t p = 0; p < s->P; p += chunk) {
        uint32_t n = s->P - p < chunk ? s->P - p : chunk;
        if ((ex = unpack_restore_chunk(o, s, p, n, (size_t)chunk * rb)) != CLI_OK ||
            (ex = k->rows(k->opaque, s->buf, rb, p, n)) != CLI_OK)
            return ex;
        (void)fkvf_reader_trim(s->r); /* the archive's pages read for this chunk */
        cli_progress_cb(&pg, (uint64_t)p + n, s->P);
    }
    return s->has_tok ? restore_tokens(o, s, k) : CLI_OK;
}

int cli_restore_stream(const char *in, const char *cbpath, const char *out, int dtype,
                       const cli_restore_sink *sink, fkvf_reader **r)
{
    unpack_opts o;
    memset(&o, 0, sizeof o);
    o.in = in;
    o.out = out;
    o.cbpath = cbpath;
    o.dtype = dtype;
    o.fmt = KVIO_FMT_SAFETENSORS; /* any format that holds token ids */
    unpack_state s;
    memset(&s, 0, sizeof s);
    int ex = unpack_open(&o, &s);
    if (ex == CLI_OK) {
        s.dt = dtype ? (fkvf_dtype)dtype : s.d.dtype;
        s.P = (uint32_t)s.ai.n_positions;
        fkvf_stream_info tsi;
        s.has_tok_stream = fkvf_reader_stream_find(s.r, FKVF_STREAM_ID_TOKENS, &s.tidx) ==
                               FKVF_OK &&
                           fkvf_reader_stream_info(s.r, s.tidx, &tsi) == FKVF_OK &&
                           tsi.length >= s.P;
        s.has_tok = s.has_tok_stream;
        ex = restore_run(&o, &s, sink);
    }
    *r = s.r; /* the caller's, also after a failure (NULL if not opened) */
    s.r = NULL;
    memset(&s.c, 0, sizeof s.c); /* a shape only: nothing of its own */
    unpack_free(&s);
    return ex;
}

int fkvf_cli_unpack(int argc, char **argv)
{
    unpack_opts o;
    int ex = unpack_parse(argc, argv, &o);
    if (ex >= 0)
        return ex;
    const char *inputs[] = {o.in, o.cbpath};
    if ((ex = cli_check_output(o.out, inputs, 2, o.force)))
        return ex;
    unpack_state s;
    memset(&s, 0, sizeof s);
    ex = unpack_run(&o, &s);
    unpack_free(&s);
    return ex;
}

/* ---- train -------------------------------------------------------------- */

static const char *train_help =
    "usage: fkvf train CACHE... -o FILE [options]\n"
    "\n"
    "Train per-head RVQ codebooks on one or more raw caches of the same shape\n"
    "and write a codebook file (archives refer to it by content hash: fkvf\n"
    "pack --codebooks FILE). Prints the content hash. Warns when the codebook is\n"
    "larger than the fp16 bytes of its training rows or k is more than a quarter\n"
    "of them (per table: pooled tables see every head's rows): it memorises them.\n"
    "\n"
    "  --k N                 centroids per stage, power of two 16..4096 (256)\n"
    "  --k-stages N          key stages 0..16 (4)\n"
    "  --v-stages N          value stages 0..16 (2)\n"
    "  --layer-stages K:V,...  key and value stages per layer instead, one pair a\n"
    "                        layer (format 1.1: readers of FKVF 1.0 refuse such a\n"
    "                        codebook; docs/quality-study.md: when it pays)\n"
    "  --pooled              one codebook per layer shared by all heads\n"
    "  --key-metric M.npy    train and encode keys under an encoder metric: a\n"
    "                        float32 .npy of [layers, heads, key_dim, key_dim]\n"
    "                        ([layers, key_dim, key_dim] with --pooled), one\n"
    "                        symmetric positive definite matrix a head, e.g.\n"
    "                        the second moment of the queries that read it;\n"
    "                        kept in FILE (format 1.2, spec 13.8), so fkvf pack\n"
    "                        and fkvf append encode under it (docs/codebooks.md)\n"
    "  --value-metric M.npy  the same for values, e.g. W_o,h^T W_o,h\n"
    "  --seed S              training seed (0); it also chooses the sample\n"
    "  --iters N             Lloyd iterations per stage (25)\n"
    "  --max-train-positions N|all  train on at most N positions (at least 64):\n"
    "                        when the caches hold more, runs of 64 consecutive\n"
    "                        positions chosen by the seed, a note says so\n"
    "                        (default: as many as 1 GiB of rows hold; 0 or all:\n"
    "                        every position; docs/codebooks.md)\n"
    "  --f32                 binary32 tables (default f16)\n"
    "  --keys pre-rope|as-is train on keys before RoPE (default) or as cached\n"
    "  --rope-theta X, --rope-dims N, --rope-layout interleaved|half-split\n"
    "                        (10000, key_dim, interleaved; half-split when every\n"
    "                        cache has Hugging Face tensor names, said on stderr);\n"
    "                        a warning when the first cache's keys do not look\n"
    "                        rotated that way (see fkvf pack --check-rope)\n"
    "  --no-rope             the caches' keys are not rotated\n"
    "  --layout hnd|nhd      tensors heads-first [H, T, D] (default) or\n"
    "                        positions-first [T, H, D] (every cache)\n"
    "  --model MODEL.gguf    the caches are llama.cpp state files saved with this\n"
    "                        model: shape and RoPE settings from its metadata\n"
    "                        (docs/llamacpp.md)\n"
    "  --force               replace FILE if it exists (default: refused); an input\n"
    "                        CACHE is never replaced\n"
    "  --threads N           threads (default: every CPU this process may use,\n"
    "                        or FKVF_THREADS); the output is the same for any N\n"
    "  --json                one JSON object: out, caches, layers, heads, pooled, k,\n"
    "                        k_stages, v_stages, layer_stages ([[k, v], ...] or\n"
    "                        null), metric (null, \"keys\", \"values\" or\n"
    "                        \"keys+values\"), dtype, bytes, content_hash,\n"
    "                        positions, trained_positions (fewer when sampled; on\n"
    "                        failure {\"error\":{...}}, docs/cli.md)\n"
    "A warning says so when FILE's name ends in the extension of another format.\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (a file that is not a cache, caches of\n"
    "different shapes; FILE exists without --force or is an input), 2 usage or\n"
    "I/O error (bad option, a path that does not exist or cannot be written).\n";

typedef struct train_opts {
    const char **ins; /* the caches (malloc'd) */
    size_t nin;
    const char *out;
    int force, json, layout;
    cli_key_opts keys;
    fkvf_rvq_params prm;
    uint8_t lst[2 * 1024]; /* --layer-stages: the pairs of n_lst layers */
    uint32_t n_lst;
    int ks_set; /* --k-stages or --v-stages given */
    const char *metric_path[2]; /* --key-metric, --value-metric */
    uint64_t max_train;         /* --max-train-positions (0: the default budget) */
} train_opts;

/* An option with a value (argv[*i], its value v). Returns 0, or after a
 * usage error -1. */
static int train_value(train_opts *o, const char *a, const char *v)
{
    fkvf_rvq_params *prm = &o->prm;
    if (!strcmp(a, "-o")) {
        o->out = v;
        return 0;
    }
    if (!strcmp(a, "--k"))
        return cli_opt_k(a, v, &prm->k) ? -1 : 0;
    if ((!strcmp(a, "--k-stages") || !strcmp(a, "--v-stages")) && o->n_lst) {
        cli_usage("%s and --layer-stages exclude each other", a);
        return -1;
    }
    if (!strcmp(a, "--k-stages"))
        return (o->ks_set = 1, cli_opt_stages(a, v, &prm->k_stages)) ? -1 : 0;
    if (!strcmp(a, "--v-stages"))
        return (o->ks_set = 1, cli_opt_stages(a, v, &prm->v_stages)) ? -1 : 0;
    if (!strcmp(a, "--layer-stages") && o->ks_set) {
        cli_usage("--layer-stages and --k-stages / --v-stages exclude each other");
        return -1;
    }
    if (!strcmp(a, "--layer-stages"))
        return cli_opt_layer_stages(a, v, o->lst, &o->n_lst, &prm->k_stages, &prm->v_stages)
                   ? -1
                   : 0;
    if (!strcmp(a, "--seed"))
        return cli_opt_seed(v, &prm->seed) ? -1 : 0;
    if (!strcmp(a, "--iters"))
        return cli_opt_iters(v, &prm->max_iters) ? -1 : 0;
    if (!strcmp(a, "--max-train-positions"))
        return cli_opt_max_train(a, v, &o->max_train) ? -1 : 0;
    if (!strcmp(a, "--layout"))
        return cli_opt_layout(v, &o->layout) ? -1 : 0;
    if (!strcmp(a, "--model"))
        return cli_llama_set_model(v);
    if (!strcmp(a, "--key-metric") || !strcmp(a, "--value-metric")) {
        o->metric_path[a[2] == 'v'] = v;
        return 0;
    }
    cli_usage("unknown option '%s' (see fkvf train --help)", a);
    return -1;
}

/* Returns -1 to go on, else the exit status (help printed, usage error);
 * o->ins is to free either way. */
static int train_parse(int argc, char **argv, train_opts *o)
{
    memset(o, 0, sizeof *o);
    o->layout = CLI_LAYOUT_UNSET;
    cli_key_opts_init(&o->keys);
    fkvf_rvq_params_init(&o->prm);
    o->prm.table_dtype = FKVF_DTYPE_F16;
    o->ins = calloc((size_t)argc + 1, sizeof *o->ins);
    if (!o->ins)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int kr = key_opt(&o->keys, argc, argv, &i);
        if (kr < 0)
            return CLI_USAGE;
        if (kr > 0)
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(train_help, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--pooled")) {
            o->prm.pooled = 1;
        } else if (!strcmp(a, "--f32")) {
            o->prm.table_dtype = FKVF_DTYPE_F32;
        } else if (!strcmp(a, "--force")) {
            o->force = 1;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (a[0] == '-' && a[1]) {
            if (!v)
                return cli_usage("%s needs a value (or is unknown; see fkvf train --help)", a);
            i++;
            if (train_value(o, a, v))
                return CLI_USAGE;
        } else {
            o->ins[o->nin++] = a;
        }
    }
    if (!o->nin || !o->out)
        return cli_usage("need CACHE... and -o FILE (see fkvf train --help)");
    return -1;
}

typedef struct train_state {
    kvio_cache *cs;   /* the caches, nin of them (their rows not held) */
    uint64_t *n_pos;  /* and their positions */
    size_t row_max;   /* the largest row's bytes */
    cli_run *runs;    /* the training sample: n_runs runs, used positions */
    size_t n_runs;
    uint64_t used;
    uint8_t *rows;    /* the sample's rows, a block per run */
    fkvf_rows *blocks;
    fkvf_rvq *q;
    void *tables;
    size_t tables_size;
    fkvf_writer *w;
    fkvf_reader *r;   /* the file written, read back */
    fkvf_rope rope;
    fkvf_codebook_shape shape;
    char hx[33];      /* its content hash */
    kvio_array metric[2];     /* --key-metric, --value-metric */
    fkvf_rvq_metric rvq_metric;
} train_state;

static void train_free(const train_opts *o, train_state *s)
{
    if (s->cs)
        for (size_t i = 0; i < o->nin; i++)
            kvio_cache_free(&s->cs[i]);
    free(s->cs);
    free(s->n_pos);
    free(s->runs);
    free(s->rows);
    free(s->blocks);
    free(s->tables);
    fkvf_rvq_free(s->q);
    fkvf_writer_free(s->w);
    fkvf_reader_free(s->r);
    kvio_array_free(&s->metric[0]);
    kvio_array_free(&s->metric[1]);
}

/* The --key-metric / --value-metric arrays read and checked against the
 * codebook's shape (a matrix a layer and codebook head) and the rule of
 * spec 13.8. Returns the exit status. */
static int train_metric(const train_opts *o, train_state *s)
{
    const fkvf_rvq_params *prm = &o->prm;
    uint32_t heads = prm->pooled ? 1 : prm->n_kv_heads;
    for (int kv = 0; kv < 2; kv++) {
        const char *path = o->metric_path[kv];
        if (!path)
            continue;
        const char *opt = kv ? "--value-metric" : "--key-metric";
        uint32_t dim = kv ? prm->value_dim : prm->key_dim;
        kvio_array *a = &s->metric[kv];
        char err[512];
        int rc = kvio_read_array(path, a, err, sizeof err);
        if (rc != KVIO_OK) {
            char what[600];
            snprintf(what, sizeof what, "%s: %s", opt, err);
            return cli_fail_kvio(rc, NULL, what);
        }
        const uint64_t *d = a->dims;
        int fits = (a->ndim == 4 && d[0] == prm->n_layers && d[1] == heads && d[2] == dim &&
                    d[3] == dim) ||
                   (a->ndim == 3 && heads == 1 && d[0] == prm->n_layers && d[1] == dim &&
                    d[2] == dim);
        if (!fits)
            return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, path,
                            "%s: an array of %zu dimensions [%llu, %llu, ...] does not fit: it "
                            "needs [layers, %s, dim, dim] = [%u, %u, %u, %u]",
                            opt, a->ndim, (unsigned long long)d[0],
                            (unsigned long long)(a->ndim > 1 ? d[1] : 0),
                            prm->pooled ? "1 (pooled)" : "heads", prm->n_layers, heads, dim, dim);
        if (dim > 1024)
            return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, path,
                            "%s: an encoder metric of dimension %u (at most 1024, spec 13.8)",
                            opt, dim);
        size_t nn = (size_t)dim * dim;
        for (size_t t = 0; t < (size_t)prm->n_layers * heads; t++) {
            size_t bad = 0;
            int v = fkvf_metric_matrix_check(a->data + t * nn, dim, &bad);
            if (v < 0)
                return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
            if (v > 0)
                return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, path,
                                "%s: the matrix of layer %zu, head %zu is %s (elements [%zu, %zu] "
                                "= %g and [%zu, %zu] = %g); an encoder metric is positive "
                                "definite (its symmetric part is taken)",
                                opt, t / heads, t % heads,
                                v == FKVF_METRIC_NONFINITE ? "not finite" : "not positive definite",
                                bad / dim, bad % dim, (double)a->data[t * nn + bad],
                                bad % dim, bad / dim,
                                (double)a->data[t * nn + (bad % dim) * dim + bad / dim]);
        }
        if (kv)
            s->rvq_metric.values = a->data;
        else
            s->rvq_metric.keys = a->data;
    }
    return CLI_OK;
}

/* Every cache opened, of one shape, its rows left in the file; every one
 * but the first dropped (closed) until its sample is read. Returns the
 * exit status. */
static int train_open(train_opts *o, train_state *s, int *all_hf)
{
    size_t nin = o->nin;
    const char **ins = o->ins;
    s->cs = calloc(nin, sizeof *s->cs);
    s->n_pos = calloc(nin, sizeof *s->n_pos);
    if (!s->cs || !s->n_pos)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
    kvio_cache *cs = s->cs;
    *all_hf = 1;
    for (size_t i = 0; i < nin; i++) {
        int ex = read_cache(ins[i], o->layout, 1, &cs[i]);
        if (ex)
            return ex;
        if (i > 0 && (cs[i].n_layers != cs[0].n_layers || cs[i].n_kv_heads != cs[0].n_kv_heads ||
                      cs[i].key_dim != cs[0].key_dim || cs[i].value_dim != cs[0].value_dim))
            return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, ins[i],
                            "shape %u layers x %u heads, dims %u/%u differs from %s (%u x %u, %u/%u)",
                            cs[i].n_layers, cs[i].n_kv_heads, cs[i].key_dim, cs[i].value_dim,
                            ins[0], cs[0].n_layers, cs[0].n_kv_heads, cs[0].key_dim,
                            cs[0].value_dim);
        if (i > 0) /* read again for its sample: no open file per cache */
            kvio_cache_drop_data(&cs[i]);
        s->n_pos[i] = cs[i].n_positions;
        size_t rb = cli_cache_row_bytes(&cs[i]);
        s->row_max = rb > s->row_max ? rb : s->row_max;
        *all_hf &= kvio_names_is_hf(cs[i].names);
    }
    return CLI_OK;
}

/* The key options settled (the Hugging Face default, RoPE) and the RoPE
 * check on the first cache. Returns the exit status. */
static int train_keys(train_opts *o, train_state *s, int all_hf)
{
    kvio_cache *c0 = &s->cs[0];
    if (all_hf || c0->names == KVIO_NAMES_LLAMA) /* llama.cpp: from --model */
        cli_keys_hf_default(&o->keys, c0, o->ins[0]);
    if (cli_key_rope(&o->keys, c0->key_dim, o->ins[0], &s->rope, &o->prm.key_rope))
        return CLI_USAGE;
    if (o->prm.key_rope) {
        cli_rope_report rr;
        int ex = cli_rope_measure(c0, 0, c0->n_positions, 0, &s->rope, 1, &rr);
        if (ex > 0)
            return ex;
        if (ex == 0)
            cli_rope_warn(o->ins[0], &rr);
    }
    return CLI_OK;
}

/* The buffer of the sample's rows and a block per run into it. */
static int train_blocks(train_opts *o, train_state *s, size_t *bytes)
{
    size_t total = 0;
    for (size_t r = 0; r < s->n_runs; r++) {
        size_t rb = cli_cache_row_bytes(&s->cs[s->runs[r].input]);
        if (rb && s->runs[r].n > (SIZE_MAX - total) / rb)
            return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
        total += (size_t)s->runs[r].n * rb;
    }
    s->rows = malloc(total ? total : 1);
    s->blocks = calloc(s->n_runs ? s->n_runs : 1, sizeof *s->blocks);
    if (!s->rows || !s->blocks)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, o->nin == 1 ? o->ins[0] : NULL,
                        "out of memory");
    uint8_t *at = s->rows;
    for (size_t r = 0; r < s->n_runs; r++) {
        const kvio_cache *c = &s->cs[s->runs[r].input];
        s->blocks[r].data = at;
        s->blocks[r].n_rows = (size_t)s->runs[r].n;
        s->blocks[r].dtype = c->dtype;
        s->blocks[r].first_position = s->runs[r].first;
        at += (size_t)s->runs[r].n * cli_cache_row_bytes(c);
    }
    *bytes = total;
    return CLI_OK;
}

/* The rows of the sample: each cache with a run read (again, but the
 * first, which is open) and closed after it. Returns the exit status. */
static int train_rows(train_opts *o, train_state *s)
{
    size_t total = 0;
    int ex = train_blocks(o, s, &total);
    if (ex != CLI_OK)
        return ex;
    cli_progress pg;
    cli_progress_init(&pg, "read", total < CLI_READ_PROGRESS_MIN);
    pg.bytes = 1;
    uint8_t *at = s->rows;
    uint64_t done = 0;
    for (size_t i = 0, r = 0; i < o->nin && ex == CLI_OK; i++) {
        while (r < s->n_runs && s->runs[r].input < i)
            r++;
        if (i > 0 && (r == s->n_runs || s->runs[r].input != i))
            continue; /* none of its positions sampled */
        kvio_cache again, *c = &s->cs[0];
        memset(&again, 0, sizeof again);
        if (i > 0) {
            c = &again;
            ex = cli_read_cache(o->ins[i],
                                (o->layout == CLI_LAYOUT_NHD ? KVIO_READ_NHD : 0) | KVIO_READ_LAZY,
                                c);
            if (ex == CLI_OK && c->n_positions != s->n_pos[i])
                ex = cli_fail(CLI_INVALID, FKVF_E_RANGE, o->ins[i],
                              "the cache changed while it was read (%u positions, were %" PRIu64
                              ")", c->n_positions, s->n_pos[i]);
        }
        if (ex == CLI_OK)
            ex = cli_sample_read(c, o->ins[i], s->runs + r, s->n_runs - r, i, &at, &pg, &done,
                                 total);
        if (i > 0)
            kvio_cache_free(&again);
        else /* shape, names, metadata kept */
            kvio_cache_drop_data(&s->cs[0]);
    }
    return ex;
}

/* Every cache opened, of one shape; the key options settled (the Hugging
 * Face default, RoPE and its check on the first cache); the training
 * sample chosen (every position when they fit the budget) and its rows
 * read. Returns the exit status. */
static int train_read(train_opts *o, train_state *s)
{
    int all_hf = 0, ex;
    if ((ex = train_open(o, s, &all_hf)) != CLI_OK || (ex = train_keys(o, s, all_hf)) != CLI_OK)
        return ex;
    ex = cli_train_sample(o->nin == 1 ? o->ins[0] : NULL, s->n_pos, o->nin, s->row_max,
                          o->max_train, o->prm.seed, &s->runs, &s->n_runs, &s->used);
    if (ex != CLI_OK)
        return ex;
    return train_rows(o, s);
}

/* The codebooks trained on every cache's rows, with the warning when they
 * would memorise them, and their tables. Returns the exit status. */
static int train_fit(train_opts *o, train_state *s)
{
    fkvf_rvq_params *prm = &o->prm;
    const kvio_cache *c0 = &s->cs[0];
    prm->n_layers = c0->n_layers;
    prm->n_kv_heads = c0->n_kv_heads;
    prm->key_dim = c0->key_dim;
    prm->value_dim = c0->value_dim;
    int bad;
    prm->layer_stages = cli_layer_table(o->lst, o->n_lst, c0->n_layers, &bad);
    if (bad)
        return CLI_USAGE;
    int ex = train_metric(o, s);
    if (ex != CLI_OK)
        return ex;
    prm->metric = s->rvq_metric.keys || s->rvq_metric.values ? &s->rvq_metric : NULL;
    cli_progress pg;
    cli_progress_init(&pg, "train", 0);
    prm->progress = cli_progress_cb;
    prm->progress_opaque = &pg;
    prm->n_threads = cli_threads();
    int rc = fkvf_rvq_train(&s->q, prm, s->blocks, s->n_runs, NULL);
    if (rc != FKVF_OK)
        return cli_fail(rc == FKVF_E_NOMEM ? CLI_USAGE : CLI_INVALID, rc, o->ins[0],
                        "training failed: %s", fkvf_strerror(rc));
    uint32_t heads;
    fkvf_rvq_shape(s->q, &s->shape, &heads);
    /* a codebook larger than its training rows, or k near their count,
     * memorises them: it will not serve other caches */
    uint64_t n_rows = s->used;
    cli_warn_codebook(o->out, c0, s->shape.k, fkvf_codebook_size(&s->shape), n_rows,
                      n_rows * (prm->pooled ? c0->n_kv_heads : 1), "training rows",
                      prm->pooled ? "training vectors (rows x heads: pooled)" : "training rows",
                      "train on more positions (several caches: fkvf train CACHE... -o FILE) or "
                      "give a smaller --k");
    s->tables_size = fkvf_rvq_tables_size(s->q);
    s->tables = malloc(s->tables_size ? s->tables_size : 1);
    if (!s->tables || fkvf_rvq_tables(s->q, s->tables, s->tables_size) != FKVF_OK)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
    return CLI_OK;
}

/* The codebook file written with its train.* metadata, then read back for
 * its content hash. Returns the exit status. */
static int train_write(const train_opts *o, train_state *s)
{
    const fkvf_rvq_params *prm = &o->prm;
    fkvf_writer_options wo;
    fkvf_writer_options_init(&wo);
    wo.no_replace = !o->force;
    if (s->shape.layer_stages) /* stage counts per layer (spec 13.1) */
        wo.required_features |= FKVF_FEAT_LAYER_STAGES;
    if (prm->metric) /* kept with the codebook (spec 13.8) */
        wo.optional_features |= FKVF_OPTFEAT_ENCODER_METRIC;
    int rc = fkvf_writer_create_file(&s->w, o->out, &wo, NULL);
    if (rc == FKVF_OK)
        rc = fkvf_writer_meta_utf8(s->w, "train.keys", prm->key_rope ? "pre-rope" : "as-is");
    if (rc == FKVF_OK && prm->key_rope) {
        rc = fkvf_writer_meta_f64(s->w, "train.rope_theta", s->rope.theta);
        if (rc == FKVF_OK)
            rc = fkvf_writer_meta_u64(s->w, "train.rope_dims", s->rope.rope_dims);
        if (rc == FKVF_OK)
            rc = fkvf_writer_meta_utf8(s->w, "train.rope_layout",
                                       s->rope.layout == 1 ? "interleaved" : "half-split");
    }
    if (rc == FKVF_OK)
        rc = fkvf_writer_meta_u64(s->w, "train.seed", prm->seed);
    if (rc == FKVF_OK)
        rc = fkvf_writer_meta_u64(s->w, "train.caches", o->nin);
    if (rc == FKVF_OK)
        rc = fkvf_writer_add_codebooks(s->w, &s->shape, s->tables, s->tables_size, 0);
    if (rc == FKVF_OK && prm->metric)
        rc = fkvf_writer_add_metric(s->w, prm->metric, 0);
    if (rc == FKVF_OK)
        rc = fkvf_writer_finish(s->w);
    if (rc != FKVF_OK)
        return cli_fail_writer(rc, s->w, o->out, "");
    uint8_t hash[16];
    rc = fkvf_reader_open_file(&s->r, o->out, 0, NULL);
    if (rc == FKVF_OK)
        rc = fkvf_reader_codebook(s->r, NULL, NULL, NULL, hash);
    if (rc != FKVF_OK)
        return cli_fail_reader(rc, s->r, o->out, "cannot read back: ");
    cli_hex16(hash, s->hx);
    return CLI_OK;
}

/* "keys", "values" or "keys+values": the parts the encoder metric has */
static const char *train_metric_name(const train_opts *o)
{
    return !o->metric_path[1] ? "keys" : !o->metric_path[0] ? "values" : "keys+values";
}

static void train_print(const train_opts *o, const train_state *s)
{
    const fkvf_codebook_shape *sh = &s->shape;
    struct stat st;
    long long fsz = stat(o->out, &st) == 0 ? (long long)st.st_size : -1LL;
    if (!o->json) {
        printf("%s: %u layers x %u %s, k = %u, ", o->out, sh->n_layers,
               sh->pooled ? 1u : sh->n_heads, sh->pooled ? "pooled" : "heads", sh->k);
        if (sh->layer_stages) { /* per layer: K xk0,k1,... V xv0,v1,... */
            for (unsigned kv = 0; kv < 2; kv++) {
                printf("%s x", kv ? " V" : "K");
                for (uint32_t l = 0; l < sh->n_layers; l++)
                    printf("%s%u", l ? "," : "", sh->layer_stages[2 * (size_t)l + kv]);
            }
        } else {
            printf("K x%u V x%u", sh->k_stages, sh->v_stages);
        }
        printf(", %s tables, %lld bytes\n", sh->dtype == FKVF_DTYPE_F32 ? "f32" : "f16", fsz);
        if (o->prm.metric)
            printf("encoder metric: %s\n", train_metric_name(o));
        printf("content hash %s\n", s->hx);
        return;
    }
    printf("{\"out\":");
    cli_json_cstr(stdout, o->out);
    printf(",\"caches\":[");
    for (size_t i = 0; i < o->nin; i++) {
        if (i)
            putchar(',');
        cli_json_cstr(stdout, o->ins[i]);
    }
    printf("],\"layers\":%u,\"heads\":%u,\"pooled\":%s,\"k\":%u,\"k_stages\":%u,"
           "\"v_stages\":%u,\"layer_stages\":",
           sh->n_layers, sh->pooled ? 1u : sh->n_heads, sh->pooled ? "true" : "false", sh->k,
           sh->k_stages, sh->v_stages);
    if (sh->layer_stages) { /* [[k, v], ...] a layer; null: k_stages, v_stages in each */
        for (uint32_t l = 0; l < sh->n_layers; l++)
            printf("%s[%u,%u]", l ? "," : "[", sh->layer_stages[2 * (size_t)l],
                   sh->layer_stages[2 * (size_t)l + 1]);
        putchar(']');
    } else {
        printf("null");
    }
    printf(",\"metric\":");
    if (o->prm.metric)
        printf("\"%s\"", train_metric_name(o));
    else
        printf("null");
    uint64_t total = 0;
    for (size_t i = 0; i < o->nin; i++)
        total += s->n_pos[i];
    printf(",\"dtype\":\"%s\",\"bytes\":%lld,\"content_hash\":\"%s\",\"positions\":%" PRIu64
           ",\"trained_positions\":%" PRIu64 "}\n",
           sh->dtype == FKVF_DTYPE_F32 ? "f32" : "f16", fsz, s->hx, total, s->used);
}

static int train_run(train_opts *o, train_state *s)
{
    int ex = cli_check_output(o->out, o->ins, o->nin, o->force);
    const char *model = cli_llama_model_path();
    if (ex == CLI_OK && model)
        ex = cli_check_output(o->out, &model, 1, o->force); /* --model is an input too */
    if (ex != CLI_OK)
        return ex;
    cli_warn_fkvf_name(o->out, "codebook file");
    if ((ex = train_read(o, s)) != CLI_OK || (ex = train_fit(o, s)) != CLI_OK ||
        (ex = train_write(o, s)) != CLI_OK)
        return ex;
    train_print(o, s);
    return CLI_OK;
}

int fkvf_cli_train(int argc, char **argv)
{
    train_opts o;
    int ex = train_parse(argc, argv, &o);
    if (ex < 0) {
        train_state s;
        memset(&s, 0, sizeof s);
        ex = train_run(&o, &s);
        train_free(&o, &s);
    }
    free(o.ins);
    return ex;
}

/* ---- compare ------------------------------------------------------------ */

static const char *compare_help =
    "usage: fkvf compare ORIGINAL RESTORED [--sinks S] [--recent W] [--layout L[,L2]]\n"
    "                    [--model MODEL.gguf] [--json]\n"
    "\n"
    "Compare two raw caches of the same shape. Per keys and values: relative\n"
    "MSE (sum of squared errors / sum of squares of ORIGINAL), SNR in dB and\n"
    "the largest absolute error, over the archived positions (those outside\n"
    "the first S and last W; all positions when both are 0, the default); and\n"
    "whether the exact positions (first S, last W) are bit-identical.\n"
    "\n"
    "  --layout hnd|nhd      tensors heads-first [H, T, D] (default) or positions-\n"
    "                        first [T, H, D], for both files; hnd,nhd or nhd,hnd:\n"
    "                        ORIGINAL's, then RESTORED's (e.g. an nhd cache against\n"
    "                        what fkvf unpack --layout hnd wrote)\n"
    "  --model MODEL.gguf    a file is a llama.cpp state file saved with this model\n"
    "                        (e.g. a state against its fkvf export-llama; docs/llamacpp.md)\n"
    "  --json                one JSON object (on failure {\"error\":{...}},\n"
    "                        docs/cli.md)\n"
    "\n"
    "Exit status: 0 shapes match, 1 they differ or a file is invalid, 2 usage\n"
    "or I/O error (also: a path that does not exist).\n";

typedef struct err_acc {
    double se, ref, maxabs;
    uint64_t n;
} err_acc;

static int to_f32(const kvio_cache *c, const uint8_t *src, size_t n, float *dst)
{
    return fkvf_convert(FKVF_DTYPE_F32, dst, c->dtype, src, n);
}

typedef struct compare_opts {
    const char *pa, *pb; /* ORIGINAL, RESTORED */
    uint64_t sinks, recent;
    int json, lay[2];    /* the layout of each */
} compare_opts;

/* --layout L or L,L2 into o->lay. Returns 0, or after a usage error -1. */
static int compare_layout(const char *v, compare_opts *o)
{
    char one[4] = "";
    if (v && strlen(v) == 7 && v[3] == ',') {
        memcpy(one, v, 3);
        if (cli_opt_layout(one, &o->lay[0]) || cli_opt_layout(v + 4, &o->lay[1]))
            return -1;
    } else if (cli_opt_layout(v, &o->lay[0])) {
        return -1;
    } else {
        o->lay[1] = o->lay[0];
    }
    return 0;
}

/* Returns -1 to go on, else the exit status (help printed, usage error). */
static int compare_parse(int argc, char **argv, compare_opts *o)
{
    memset(o, 0, sizeof *o);
    o->lay[0] = o->lay[1] = CLI_LAYOUT_UNSET;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(compare_help, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--layout")) {
            if (compare_layout(i + 1 < argc ? argv[++i] : NULL, o))
                return CLI_USAGE;
        } else if (!strcmp(a, "--sinks") || !strcmp(a, "--recent")) {
            if (i + 1 >= argc ||
                cli_parse_u64(argv[i + 1], UINT32_MAX, a[2] == 's' ? &o->sinks : &o->recent))
                return cli_usage("%s needs a count", a);
            i++;
        } else if (!strcmp(a, "--model")) {
            if (i + 1 >= argc)
                return cli_usage("--model needs a value");
            if (cli_llama_set_model(argv[++i]))
                return CLI_USAGE;
        } else if (a[0] == '-' && a[1]) {
            return cli_usage("unknown option '%s' (see fkvf compare --help)", a);
        } else if (!o->pa) {
            o->pa = a;
        } else if (!o->pb) {
            o->pb = a;
        } else {
            return cli_usage("unexpected argument '%s'", a);
        }
    }
    if (!o->pa || !o->pb)
        return cli_usage("need ORIGINAL and RESTORED (see fkvf compare --help)");
    return -1;
}

/* The comparison: per keys [0] and values [1] over the archived
 * positions, and the exact positions' identity. */
typedef struct compare_result {
    uint32_t P;
    err_acc acc[2];
    uint64_t exact_n, exact_same;
    int tokens_same; /* -1: not both have tokens */
} compare_result;

/* The rows of one (layer, K|V) tensor at position p of both caches, as
 * f32 in fa and fb: into acc, or for an exact position *same cleared when
 * they differ. */
static void compare_tensor(const kvio_cache *a, const kvio_cache *b, int kv, uint32_t l,
                           uint32_t p, int exact, int *same, err_acc *e, float *fa, float *fb)
{
    size_t ea = kvio_dtype_size(a->dtype), eb = kvio_dtype_size(b->dtype);
    size_t dim = kv ? a->value_dim : a->key_dim;
    const uint8_t *ta = kv ? a->values[l] : a->keys[l];
    const uint8_t *tb = kv ? b->values[l] : b->keys[l];
    for (uint32_t h = 0; h < a->n_kv_heads; h++) {
        size_t off = ((size_t)h * a->n_positions + p) * dim;
        to_f32(a, ta + off * ea, dim, fa);
        to_f32(b, tb + off * eb, dim, fb);
        if (exact) {
            if (a->dtype == b->dtype)
                *same &= !memcmp(ta + off * ea, tb + off * eb, dim * ea);
            else
                *same &= !memcmp(fa, fb, dim * sizeof *fa);
            continue;
        }
        for (size_t i = 0; i < dim; i++) {
            double x = fa[i], y = fb[i], dd = x - y;
            e->se += dd * dd;
            e->ref += x * x;
            if (fabs(dd) > e->maxabs || dd != dd)
                e->maxabs = fabs(dd);
        }
        e->n += dim;
    }
}

/* Caches a and b of one shape compared. Returns the exit status. */
static int compare_run(const compare_opts *o, const kvio_cache *a, const kvio_cache *b,
                       compare_result *res)
{
    memset(res, 0, sizeof *res);
    uint32_t P = res->P = a->n_positions;
    uint64_t S = o->sinks < P ? o->sinks : P;
    uint64_t W = o->recent < P - S ? o->recent : P - S;
    size_t dmax = a->key_dim > a->value_dim ? a->key_dim : a->value_dim;
    float *fa = malloc(dmax * sizeof *fa);
    float *fb = malloc(dmax * sizeof *fb);
    if (!fa || !fb) {
        free(fa);
        free(fb);
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
    }
    for (uint32_t p = 0; p < P; p++) {
        int exact = p < S || p >= P - W;
        int same = 1;
        for (uint32_t l = 0; l < a->n_layers; l++)
            for (int kv = 0; kv < 2; kv++)
                compare_tensor(a, b, kv, l, p, exact, &same, &res->acc[kv], fa, fb);
        if (exact) {
            res->exact_n++;
            res->exact_same += (uint64_t)(same != 0);
        }
    }
    free(fa);
    free(fb);
    res->tokens_same = -1;
    if (a->tokens && b->tokens)
        res->tokens_same = !memcmp(a->tokens, b->tokens, (size_t)P * sizeof *a->tokens);
    return CLI_OK;
}

static const char *const compare_names[2] = {"keys", "values"};

static void compare_json(const compare_result *res)
{
    printf("{\"positions\":%u,\"exact_positions\":%" PRIu64 ",\"exact_identical\":%" PRIu64
           ",\"archived_positions\":%" PRIu64,
           res->P, res->exact_n, res->exact_same, (uint64_t)res->P - res->exact_n);
    for (int kv = 0; kv < 2; kv++) {
        const err_acc *e = &res->acc[kv];
        /* JSON has no nan/inf: a non-finite value (NaN or Inf in a cache) is null */
        printf(",\"%s\":{", compare_names[kv]);
        if (e->n && e->ref > 0 && isfinite(e->se / e->ref))
            printf("\"rel_mse\":%.9g,", e->se / e->ref);
        else
            printf("\"rel_mse\":null,");
        if (e->n && e->se > 0 && e->ref > 0 && isfinite(log10(e->ref / e->se)))
            printf("\"snr_db\":%.4f,", 10.0 * log10(e->ref / e->se));
        else
            printf("\"snr_db\":null,");
        if (isfinite(e->maxabs))
            printf("\"max_abs_err\":%.9g}", e->maxabs);
        else
            printf("\"max_abs_err\":null}");
    }
    printf(",\"tokens_identical\":%s}\n",
           res->tokens_same < 0 ? "null" : res->tokens_same ? "true" : "false");
}

static void compare_text(const compare_result *res)
{
    printf("%u positions: %" PRIu64 " exact, %" PRIu64 " compared as archived\n", res->P,
           res->exact_n, (uint64_t)res->P - res->exact_n);
    for (int kv = 0; kv < 2; kv++) {
        const err_acc *e = &res->acc[kv];
        if (!e->n) {
            printf("%-6s  no archived positions\n", compare_names[kv]);
            continue;
        }
        /* NaN in either cache: say so, not "relative MSE 0, SNR inf dB" */
        int nan = isnan(e->se) || isnan(e->ref);
        printf("%-6s  relative MSE %.6g  SNR %s", compare_names[kv],
               nan ? (double)NAN : e->ref > 0 ? e->se / e->ref : 0.0,
               nan ? "nan dB" : e->se > 0 ? "" : "inf dB");
        if (!nan && e->se > 0)
            printf("%.2f dB", e->ref > 0 ? 10.0 * log10(e->ref / e->se) : -INFINITY);
        printf("  max abs error %.6g\n", e->maxabs);
    }
    if (res->exact_n)
        printf("exact positions: %" PRIu64 " of %" PRIu64 " %s\n", res->exact_same, res->exact_n,
               res->exact_same == res->exact_n ? "bit-identical" : "identical - MISMATCH");
    if (res->tokens_same >= 0)
        printf("tokens: %s\n", res->tokens_same ? "identical" : "differ");
}

int fkvf_cli_compare(int argc, char **argv)
{
    compare_opts o;
    int ex = compare_parse(argc, argv, &o);
    if (ex >= 0)
        return ex;
    kvio_cache a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    ex = read_cache(o.pa, o.lay[0], 0, &a);
    if (ex)
        return ex;
    ex = read_cache(o.pb, o.lay[1], 0, &b);
    if (ex) {
        kvio_cache_free(&a);
        return ex;
    }
    compare_result res;
    if (a.n_layers != b.n_layers || a.n_kv_heads != b.n_kv_heads ||
        a.n_positions != b.n_positions || a.key_dim != b.key_dim || a.value_dim != b.value_dim)
        ex = cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o.pb,
                      "differs in shape from %s: %u layers x %u heads x %u positions, dims %u/%u "
                      "vs %u x %u x %u, %u/%u",
                      o.pa, b.n_layers, b.n_kv_heads, b.n_positions, b.key_dim, b.value_dim,
                      a.n_layers, a.n_kv_heads, a.n_positions, a.key_dim, a.value_dim);
    else if ((ex = compare_run(&o, &a, &b, &res)) == CLI_OK && o.json)
        compare_json(&res);
    else if (ex == CLI_OK)
        compare_text(&res);
    kvio_cache_free(&a);
    kvio_cache_free(&b);
    return ex;
}
