/* fkvf import-llama / export-llama: llama.cpp state files
 * (llama_state_seq_save_file, llama_state_save_file) to FKVF archives and
 * back (docs/llamacpp.md). import-llama is fkvf pack (or, with --append,
 * fkvf append --new) on a state file with the defaults of a llama.cpp
 * user; export-llama restores an archive as unpack does and writes the
 * state file llama.cpp loads. Public API only. */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cacheio.h"
#include "cli_util.h"
#include "commands.h"
#include "fkvf.h"
#include "llama_state.h"

/* ---- import-llama --------------------------------------------------------- */

static const char *import_help =
    "usage: fkvf import-llama STATE --model MODEL.gguf -o ARCHIVE [options]\n"
    "       fkvf import-llama STATE --model MODEL.gguf --append ARCHIVE [options]\n"
    "\n"
    "Archive a llama.cpp state file: a sequence state (llama_state_seq_save_file,\n"
    "node-llama-cpp's saveStateToFile, llama-server's slot save) or a session\n"
    "(llama_state_save_file). MODEL.gguf is the model it was saved with: the state\n"
    "file does not record the cache's heads and dims, its metadata does (and the\n"
    "RoPE settings; its name and a hash of the file go into the descriptor).\n"
    "K and V types f32, f16 or bf16, either V layout (flash attention on or off).\n"
    "\n"
    "Default: lossless. Every position is kept exact, no codebook, and\n"
    "'fkvf export-llama' gives back the same bytes. Archived instead (the first S\n"
    "and last W positions exact, the others as RVQ indices) with one of:\n"
    "  --codebooks FILE      a codebook file from 'fkvf train STATE... --model\n"
    "                        MODEL.gguf -o FILE' (trained on caches of other prompts;\n"
    "                        the best choice: the archive stores indices only)\n"
    "  --train               train codebooks on this state's rows and embed them\n"
    "and the options of fkvf pack: --sinks S (4), --recent W (32), --k N,\n"
    "--k-stages N (4), --v-stages N (2), --seed S, --iters N,\n"
    "--max-train-positions N|all, --f32, --codec\n"
    "quad|ngon, --beam B, --deflate, --index | --no-index, --keys\n"
    "pre-rope|as-is, --rope-*, --model-id STR, --tokenizer-id STR (see fkvf\n"
    "pack --help). Keys are\n"
    "un-rotated with the model's RoPE (llama: adjacent pairs; NEOX-style\n"
    "architectures: half-split; theta and dims from its rope.* keys); models\n"
    "whose rotation spec 8.1 cannot undo (scaled frequencies, M-RoPE) are\n"
    "archived with keys as cached, said on stderr.\n"
    "\n"
    "  --append ARCHIVE      STATE is a later save of the sequence ARCHIVE holds:\n"
    "                        append its positions from ARCHIVE's count on, in one\n"
    "                        commit (its first tokens must be ARCHIVE's; the model\n"
    "                        must be the one ARCHIVE was imported with). The same\n"
    "                        as 'fkvf append ARCHIVE STATE --model MODEL.gguf --new';\n"
    "                        with it: --sync commit|none, --recover, --codebooks FILE,\n"
    "                        --beam B, --json\n"
    "  --force               replace ARCHIVE if it exists (not with --append)\n"
    "  --threads N           threads (default: every CPU this process may use,\n"
    "                        or FKVF_THREADS); the output is the same for any N\n"
    "  --json                one JSON object (as fkvf pack's; on failure\n"
    "                        {\"error\":{...}}, docs/cli.md)\n"
    "\n"
    "Not supported (refused, saying why): quantized cache types (q8_0, q4_0...),\n"
    "a cell shared by several sequences, several sequences in one file, positions\n"
    "that are not 0..n-1 (after a context shift), M-RoPE cell extensions.\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (not a state file, a malformed or\n"
    "unsupported one, a model that does not fit it; ARCHIVE exists without\n"
    "--force), 2 usage or I/O error.\n";

/* --append: fkvf append ARCHIVE STATE --new with the options given. */
static int import_append(int argc, char **argv)
{
    const char *state = NULL, *archive = NULL;
    char **av = calloc((size_t)argc + 4, sizeof *av);
    if (!av)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
    int n = 2, ex = -1;
    for (int i = 0; i < argc && ex < 0; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--append") || !strcmp(a, "--model") || !strcmp(a, "--sync") ||
            !strcmp(a, "--codebooks") || !strcmp(a, "--beam")) {
            if (!v) {
                ex = cli_usage("%s needs a value", a);
                break;
            }
            i++;
            if (!strcmp(a, "--append")) {
                archive = v;
                continue;
            }
            if (!strcmp(a, "--model") && cli_llama_set_model(v)) {
                ex = CLI_USAGE;
                break;
            }
            av[n++] = (char *)a;
            av[n++] = (char *)v;
        } else if (!strcmp(a, "--json") || !strcmp(a, "--recover")) {
            av[n++] = (char *)a;
        } else if (a[0] == '-' && a[1]) {
            ex = cli_usage("%s: not an option of import-llama --append (see fkvf import-llama "
                           "--help)",
                           a);
        } else if (!state) {
            state = a;
        } else {
            ex = cli_usage("unexpected argument '%s'", a);
        }
    }
    if (ex < 0 && (!state || !archive))
        ex = cli_usage("need STATE, --model MODEL.gguf and --append ARCHIVE");
    if (ex < 0 && !cli_llama_model_path())
        ex = cli_usage("need --model MODEL.gguf, the model %s was saved with", state);
    if (ex < 0 && cli_llama_sniff_file(state) == LLST_KIND_NONE && !access(state, R_OK))
        ex = cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, state,
                      "not a llama.cpp state file (no 'ggsq' or 'ggsn' magic)");
    if (ex < 0) {
        av[0] = (char *)archive;
        av[1] = (char *)state;
        av[n++] = (char *)"--new";
        ex = fkvf_cli_append(n, av);
    }
    free(av);
    return ex;
}

int fkvf_cli_import_llama(int argc, char **argv)
{
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            break;
        if (!strcmp(argv[i], "--append"))
            return import_append(argc, argv);
    }
    return cli_pack_main(argc, argv, 1, import_help);
}

/* ---- export-llama --------------------------------------------------------- */

static const char *export_help =
    "usage: fkvf export-llama ARCHIVE -o STATE [options]\n"
    "\n"
    "Write an archive made by 'fkvf import-llama' back as a llama.cpp state file:\n"
    "llama_state_seq_load_file (node-llama-cpp's loadStateFromFile, llama-server's\n"
    "slot restore) or, with --session, llama_state_load_file reads it. Exact\n"
    "positions bit for bit, archived ones reconstructed. A lossless archive\n"
    "exports the very bytes that were imported.\n"
    "\n"
    "llama.cpp loads a state only into a context like the one that saved it:\n"
    "the same model, cache types and V layout. Defaults: the imported file's.\n"
    "  --v-trans 0|1         V layout: 0 rows (flash attention on), 1 transposed\n"
    "                        (flash attention off)\n"
    "  --dtype f16|bf16|f32  K and V element type (the context's --cache-type-k/-v;\n"
    "                        f32 to f16 rounds to nearest even)\n"
    "  --session             a session file (llama_state_save_file) instead of a\n"
    "                        sequence state; --seq: a sequence state\n"
    "  --seq-id N            the sequence id written into every cell (default: the\n"
    "                        imported one; llama.cpp loads into the sequence it is\n"
    "                        asked to, whatever this says)\n"
    "  --codebooks FILE      codebook file of an archive that refers to one\n"
    "                        (default: found by content hash, as fkvf unpack)\n"
    "  --force               replace STATE if it exists (default: refused); an input\n"
    "                        is never replaced\n"
    "  --threads N           threads (default: every CPU this process may use,\n"
    "                        or FKVF_THREADS); the output is the same for any N\n"
    "  --json                one JSON object: archive, out, kind, cells, tokens,\n"
    "                        exact, archived, k_type, v_type, v_trans, bytes (on\n"
    "                        failure {\"error\":{...}}, docs/cli.md)\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (not an archive, not imported from\n"
    "llama.cpp, its codebook missing; STATE exists without --force or is an\n"
    "input), 2 usage or I/O error.\n";

typedef struct export_opts {
    const char *in, *out, *cbpath;
    int v_trans;   /* -1: as imported */
    int dtype;     /* 0: as imported; FKVF_DTYPE_* */
    int kind;      /* 0 as imported, LLST_KIND_SEQ / _SESSION */
    int seq_id_set;
    int32_t seq_id;
    int force, json;
} export_opts;

static int export_parse(int argc, char **argv, export_opts *o)
{
    memset(o, 0, sizeof *o);
    o->v_trans = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(export_help, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--session")) {
            o->kind = LLST_KIND_SESSION;
        } else if (!strcmp(a, "--seq")) {
            o->kind = LLST_KIND_SEQ;
        } else if (!strcmp(a, "--force")) {
            o->force = 1;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (a[0] == '-' && a[1]) {
            if (!v)
                return cli_usage("%s needs a value (or is unknown; see fkvf export-llama --help)",
                                 a);
            i++;
            uint64_t u;
            if (!strcmp(a, "-o")) {
                o->out = v;
            } else if (!strcmp(a, "--codebooks")) {
                o->cbpath = v;
            } else if (!strcmp(a, "--v-trans")) {
                if (strcmp(v, "0") && strcmp(v, "1"))
                    return cli_usage("--v-trans: '%s' is not 0 or 1", v);
                o->v_trans = v[0] - '0';
            } else if (!strcmp(a, "--dtype")) {
                if (cli_opt_dtype(v, &o->dtype))
                    return CLI_USAGE;
            } else if (!strcmp(a, "--seq-id")) {
                if (cli_parse_u64(v, INT32_MAX, &u))
                    return cli_usage("--seq-id: '%s' is not a sequence id 0..%d", v, INT32_MAX);
                o->seq_id = (int32_t)u;
                o->seq_id_set = 1;
            } else {
                return cli_usage("unknown option '%s' (see fkvf export-llama --help)", a);
            }
        } else if (!o->in) {
            o->in = a;
        } else {
            return cli_usage("unexpected argument '%s'", a);
        }
    }
    if (!o->in || !o->out)
        return cli_usage("need ARCHIVE and -o STATE (see fkvf export-llama --help)");
    return -1;
}

/* The archive's llama.* metadata, as NUL-terminated strings for
 * llst_meta_get. */
#define EXPORT_MAX_META 16
typedef struct export_meta {
    fkvf_reader *r;
    size_t n;
    char *key[EXPORT_MAX_META], *val[EXPORT_MAX_META];
} export_meta;

static const char *export_get(void *ctx, const char *key)
{
    export_meta *m = ctx;
    for (size_t i = 0; i < m->n; i++)
        if (!strcmp(m->key[i], key))
            return m->val[i];
    if (m->n >= EXPORT_MAX_META)
        return NULL;
    fkvf_meta_entry e;
    if (fkvf_reader_meta_find(m->r, key, &e) != FKVF_OK || e.type != FKVF_META_UTF8)
        return NULL;
    char *k = strdup(key), *v = malloc(e.value_len + 1);
    if (!k || !v) {
        free(k);
        free(v);
        return NULL;
    }
    memcpy(v, e.value, e.value_len);
    v[e.value_len] = 0;
    if (strlen(v) != e.value_len) { /* an embedded NUL: not a value of ours */
        free(k);
        free(v);
        return NULL;
    }
    m->key[m->n] = k;
    m->val[m->n] = v;
    return m->val[m->n++];
}

static void export_meta_free(export_meta *m)
{
    for (size_t i = 0; i < m->n; i++) {
        free(m->key[i]);
        free(m->val[i]);
    }
    m->n = 0;
}

static int ggml_of(fkvf_dtype dt)
{
    return dt == FKVF_DTYPE_F32 ? LLST_GGML_F32 : dt == FKVF_DTYPE_BF16 ? LLST_GGML_BF16
                                                                         : LLST_GGML_F16;
}

/* The params of the imported file, with the options' changes. Returns the
 * exit status. */
static int export_params(const export_opts *o, export_meta *m, llst_params *p)
{
    char err[512];
    if (!export_get(m, LLST_META_PREFIX "kind"))
        return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o->in,
                        "not imported from a llama.cpp state file (no llama.kind metadata; "
                        "fkvf import-llama makes such archives)");
    int rc = llst_meta_get(export_get, m, p, o->in, err, sizeof err);
    if (rc != LLST_OK)
        return cli_fail_llst(rc, o->in, err);
    if (o->v_trans >= 0)
        p->v_trans = (uint32_t)o->v_trans;
    if (o->dtype)
        p->k_type = p->v_type = ggml_of((fkvf_dtype)o->dtype);
    if (o->seq_id_set)
        p->seq_id = o->seq_id;
    if (o->kind)
        p->kind = (llst_kind)o->kind;
    if (p->kind == LLST_KIND_SESSION && !p->arch) {
        /* a sequence state exported as a session: the model's architecture */
        p->arch = export_get(m, LLST_META_PREFIX "model_arch");
        if (!p->arch)
            return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o->in,
                            "--session needs the model's architecture name, and the archive "
                            "has no llama.model_arch metadata");
    }
    return CLI_OK;
}

static void export_print(const export_opts *o, fkvf_reader *r, uint32_t cells, int has_tokens,
                         const llst_params *p)
{
    fkvf_archive_info ai;
    if (fkvf_reader_info(r, &ai) != FKVF_OK)
        memset(&ai, 0, sizeof ai);
    uint64_t bytes = cli_file_size(o->out);
    const char *kind = p->kind == LLST_KIND_SESSION ? "session" : "seq";
    uint32_t ntok = has_tokens ? cells : 0u;
    if (o->json) {
        printf("{\"archive\":");
        cli_json_cstr(stdout, o->in);
        printf(",\"out\":");
        cli_json_cstr(stdout, o->out);
        printf(",\"kind\":\"%s\",\"cells\":%u,\"tokens\":%u,\"exact\":%" PRIu64
               ",\"archived\":%" PRIu64 ",\"k_type\":\"%s\",\"v_type\":\"%s\",\"v_trans\":%u,"
               "\"bytes\":%" PRIu64 "}\n",
               kind, cells, ntok, ai.n_positions - ai.n_archived, ai.n_archived,
               llst_type_name(p->k_type), llst_type_name(p->v_type), p->v_trans, bytes);
        return;
    }
    printf("%s: llama.cpp %s file, %u cells (%" PRIu64 " exact, %" PRIu64
           " archived), %u tokens, K %s, V %s, v_trans %u, %" PRIu64 " bytes\n",
           o->out, llst_kind_name(p->kind), cells, ai.n_positions - ai.n_archived,
           ai.n_archived, ntok, llst_type_name(p->k_type), llst_type_name(p->v_type), p->v_trans,
           bytes);
}

/* The export as the archive is restored: the state file streamed
 * (llst_stream) a chunk of positions at a time. */
typedef struct export_run {
    const export_opts *o;
    export_meta m;
    llst_params p;
    llst_stream *w;
    uint32_t L, H, cells;
    size_t kb, vb; /* bytes of one head's key, value in the restored rows */
    int has_tokens;
} export_run;

static int export_begin(void *opaque, fkvf_reader *r, const kvio_cache *shape, int has_tokens)
{
    export_run *x = opaque;
    x->m.r = r;
    int ex = export_params(x->o, &x->m, &x->p);
    if (ex != CLI_OK)
        return ex;
    size_t es = kvio_dtype_size(shape->dtype);
    x->L = shape->n_layers;
    x->H = shape->n_kv_heads;
    x->cells = shape->n_positions;
    x->kb = (size_t)shape->key_dim * es;
    x->vb = (size_t)shape->value_dim * es;
    x->has_tokens = has_tokens;
    char err[512];
    int rc = llst_stream_open(&x->w, x->o->out, x->o->force ? 0 : KVIO_WRITE_NO_REPLACE, shape,
                              has_tokens, &x->p, err, sizeof err);
    return rc == LLST_OK ? CLI_OK : cli_fail_llst(rc, x->o->out, err);
}

/* spec 14.2 rows: per layer the keys of heads 0..H-1, then its values */
static int export_rows(void *opaque, const uint8_t *rows, size_t rb, uint32_t first, uint32_t n)
{
    export_run *x = opaque;
    size_t lb = (size_t)x->H * (x->kb + x->vb);
    char err[512];
    for (uint32_t l = 0; l < x->L; l++) {
        const uint8_t *k = rows + (size_t)l * lb, *v = k + (size_t)x->H * x->kb;
        int rc = llst_stream_kv(x->w, l, 0, first, n, k, rb, x->kb, err, sizeof err);
        if (rc == LLST_OK)
            rc = llst_stream_kv(x->w, l, 1, first, n, v, rb, x->vb, err, sizeof err);
        if (rc != LLST_OK)
            return cli_fail_llst(rc, x->o->out, err);
    }
    return CLI_OK;
}

static int export_tokens(void *opaque, const int64_t *ids, uint32_t first, uint32_t n)
{
    export_run *x = opaque;
    char err[512];
    int rc = llst_stream_tokens(x->w, first, n, ids, err, sizeof err);
    return rc == LLST_OK ? CLI_OK : cli_fail_llst(rc, x->o->out, err);
}

int fkvf_cli_export_llama(int argc, char **argv)
{
    export_opts o;
    int ex = export_parse(argc, argv, &o);
    if (ex >= 0)
        return ex;
    const char *inputs[] = {o.in, o.cbpath};
    if ((ex = cli_check_output(o.out, inputs, 2, o.force)) != CLI_OK)
        return ex;
    export_run x;
    memset(&x, 0, sizeof x);
    x.o = &o;
    /* chunks of 32 MiB of rows: a transposed V is written as one run per
     * channel and chunk (256 positions of a Llama-3-8B state: 512-byte
     * writes); half that made 1.6x the system time for 25 MB less */
    cli_restore_sink sink = {export_begin, export_rows, export_tokens, &x, (size_t)32 << 20};
    fkvf_reader *r = NULL;
    /* restored in --dtype when given (archived rows rounded once), else in
     * the archive's type; the stream converts to the file's types */
    ex = cli_restore_stream(o.in, o.cbpath, o.out, o.dtype, &sink, &r);
    if (ex == CLI_OK) {
        char err[512];
        int rc = llst_stream_finish(x.w, err, sizeof err);
        x.w = NULL;
        if (rc != LLST_OK)
            ex = cli_fail_llst(rc, o.out, err);
        else
            export_print(&o, r, x.cells, x.has_tokens, &x.p);
    }
    llst_stream_discard(x.w);
    export_meta_free(&x.m);
    fkvf_reader_free(r);
    return ex;
}
