/* llama.cpp state files as caches for the commands that read caches
 * (pack, train, append, import-llama): --model MODEL.gguf, the state file
 * read through llama_state.c with the shape gguf.c reads from the model,
 * the RoPE settings and the model's identity from the GGUF metadata. See
 * cli_util.h and docs/llamacpp.md. Public API only. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_util.h"
#include "gguf.h"
#include "llama_state.h"

/* The --model of this run (the tools are single-threaded; one model per
 * command). */
static struct {
    const char *path;
    int loaded;  /* 1 read, -1 failed (its error already reported) */
    int hashed;  /* hash computed (only the commands that record or check it) */
    gguf_model m;
    uint8_t hash[16];
} model;

int cli_llama_set_model(const char *path)
{
    if (model.path && strcmp(model.path, path)) {
        cli_usage("--model given twice ('%s' and '%s')", model.path, path);
        return -1;
    }
    model.path = path;
    return 0;
}

const char *cli_llama_model_path(void) { return model.path; }

static int exit_of_gguf(int rc)
{
    return rc == GGUF_E_FORMAT || rc == GGUF_E_UNSUPPORTED ? CLI_INVALID : CLI_USAGE;
}

static int code_of_gguf(int rc)
{
    switch (rc) {
    case GGUF_E_NOMEM: return FKVF_E_NOMEM;
    case GGUF_E_IO: return FKVF_E_IO;
    case GGUF_E_ARG: return FKVF_E_INVALID_ARG;
    case GGUF_E_UNSUPPORTED: return FKVF_E_UNSUPPORTED;
    default: return FKVF_E_CORRUPT;
    }
}

const gguf_model *cli_llama_model(int *ex)
{
    *ex = CLI_OK;
    if (!model.path)
        return NULL;
    if (model.loaded == 0) {
        char err[1024];
        int rc = gguf_read_file(model.path, &model.m, NULL, err, sizeof err);
        if (rc != GGUF_OK) {
            model.loaded = -1;
            /* err names the file already */
            *ex = cli_fail(exit_of_gguf(rc), code_of_gguf(rc), model.path, "%s", err);
            if (cli_llama_sniff_file(model.path) != LLST_KIND_NONE)
                cli_note("%s is a llama.cpp state file: --model takes the GGUF model it was "
                         "saved with (STATE first, then --model MODEL.gguf)",
                         model.path);
            return NULL;
        }
        model.loaded = 1;
    }
    if (model.loaded < 0) {
        *ex = CLI_INVALID;
        return NULL;
    }
    return &model.m;
}

const uint8_t *cli_llama_model_hash(int *ex)
{
    if (!cli_llama_model(ex))
        return NULL;
    if (!model.hashed) {
        char err[1024];
        int rc = gguf_hash_file(model.path, model.hash, err, sizeof err);
        if (rc != GGUF_OK) {
            *ex = cli_fail(exit_of_gguf(rc), code_of_gguf(rc), model.path, "%s", err);
            return NULL;
        }
        model.hashed = 1;
    }
    return model.hash;
}

int cli_llama_model_stat(char *out, size_t n)
{
    struct stat st;
    if (!model.path || stat(model.path, &st) != 0)
        return -1;
    snprintf(out, n, "size %jd mtime %jd.%09ld dev %ju inode %ju", (intmax_t)st.st_size,
             (intmax_t)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec, (uintmax_t)st.st_dev,
             (uintmax_t)st.st_ino);
    return 0;
}

/* The first bytes of path; 0 if it cannot be read (the caller's reader
 * then says why). */
static size_t head_of(const char *path, uint8_t *buf, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO: no wait */
    if (fd < 0)
        return 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return 0;
    }
    ssize_t got = read(fd, buf, n);
    close(fd);
    return got > 0 ? (size_t)got : 0;
}

llst_kind cli_llama_sniff_file(const char *path)
{
    uint8_t b[8];
    size_t n = head_of(path, b, sizeof b);
    return n >= 4 ? llst_sniff(b, n) : LLST_KIND_NONE;
}

int cli_llama_is_gguf_file(const char *path)
{
    uint8_t b[4];
    return head_of(path, b, sizeof b) == 4 && !memcmp(b, "GGUF", 4);
}

int cli_is_fkvf_file(const char *path)
{
    static const uint8_t magic[9] = {0x89, 'F', 'K', 'V', 'F', 0x0d, 0x0a, 0x1a, 0x0a};
    uint8_t b[9];
    return head_of(path, b, sizeof b) == 9 && !memcmp(b, magic, 9);
}

static int exit_of_llst(int rc)
{
    return rc == LLST_E_FORMAT || rc == LLST_E_UNSUPPORTED ? CLI_INVALID : CLI_USAGE;
}

static int code_of_llst(int rc)
{
    switch (rc) {
    case LLST_E_NOMEM: return FKVF_E_NOMEM;
    case LLST_E_IO: return FKVF_E_IO;
    case LLST_E_ARG: return FKVF_E_INVALID_ARG;
    case LLST_E_UNSUPPORTED: return FKVF_E_UNSUPPORTED;
    default: return FKVF_E_CORRUPT;
    }
}

int cli_fail_llst(int rc, const char *file, const char *err)
{
    return cli_fail(exit_of_llst(rc), code_of_llst(rc), file, "%s", err);
}

/* The state file at path opened for reading: *fd, *size. Returns the exit
 * status after any error line. */
static int open_state(const char *path, int *fd, uint64_t *size)
{
    *size = 0;
    /* read, not mapped: an engine rewrites its save in place, and a file cut
     * while mapped would be a SIGBUS; O_NONBLOCK: a FIFO is refused, not
     * waited on */
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (*fd < 0)
        return cli_fail(CLI_USAGE, FKVF_E_IO, path, "cannot open: %s", strerror(errno));
    struct stat st;
    const char *why = NULL;
    if (fstat(*fd, &st) != 0)
        why = strerror(errno);
    else if (S_ISDIR(st.st_mode))
        why = "is a directory";
    else if (!S_ISREG(st.st_mode))
        why = "not a regular file";
    if (why) {
        close(*fd);
        *fd = -1;
        return cli_fail(CLI_USAGE, FKVF_E_IO, path, "%s", why);
    }
    *size = (uint64_t)st.st_size;
    return CLI_OK;
}

int cli_llama_load(const char *path, cli_llama_file *f)
{
    memset(f, 0, sizeof *f);
    int fd = -1;
    uint64_t size64 = 0;
    int ex = open_state(path, &fd, &size64);
    if (ex != CLI_OK)
        return ex;
    if (size64 > SIZE_MAX) {
        close(fd);
        return cli_fail(CLI_USAGE, FKVF_E_IO, path, "%s", "too large");
    }
    f->size = (size_t)size64;
    f->data = malloc(f->size ? f->size : 1);
    if (!f->data) {
        close(fd);
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, path, "out of memory for %zu bytes", f->size);
    }
    for (size_t got = 0; got < f->size;) {
        ssize_t r = pread(fd, (uint8_t *)f->data + got, f->size - got, (off_t)got);
        if (r < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (r <= 0) {
            int e = errno;
            close(fd);
            cli_llama_file_free(f);
            return cli_fail(CLI_USAGE, FKVF_E_IO, path, "offset %zu: %s", got,
                            r < 0 ? strerror(e) : "the file ends early (it shrank while read)");
        }
        got += (size_t)r;
    }
    close(fd);
    char err[1024];
    int rc = llst_parse(f->data, f->size, path, &f->st, err, sizeof err);
    if (rc != LLST_OK) {
        cli_llama_file_free(f);
        return cli_fail_llst(rc, path, err);
    }
    return CLI_OK;
}

int cli_llama_open(const char *path, cli_llama_file *f)
{
    memset(f, 0, sizeof *f);
    int fd = -1;
    uint64_t size = 0;
    int ex = open_state(path, &fd, &size);
    if (ex != CLI_OK)
        return ex;
    char err[1024];
    int rc = llst_open(fd, size, path, &f->st, err, sizeof err); /* fd is its */
    if (rc != LLST_OK)
        return cli_fail_llst(rc, path, err);
    return CLI_OK;
}

void cli_llama_file_free(cli_llama_file *f)
{
    if (!f)
        return;
    llst_free(&f->st);
    free(f->data);
    memset(f, 0, sizeof *f);
}

int cli_llama_shape(const char *path, llst_shape *sh, const gguf_model **mp)
{
    int ex;
    const gguf_model *m = cli_llama_model(&ex);
    if (!m && ex == CLI_OK) {
        llst_kind kind = cli_llama_sniff_file(path);
        return cli_fail(CLI_USAGE, FKVF_E_INVALID_ARG, path,
                        "a llama.cpp %s file: give --model MODEL.gguf, the model it was saved "
                        "with (the file does not record the cache's heads and dims)",
                        llst_kind_name(kind));
    }
    if (!m)
        return ex;
    sh->n_layers = m->n_layer;
    sh->n_kv_heads = m->n_head_kv;
    sh->key_dim = m->key_dim;
    sh->value_dim = m->value_dim;
    if (mp)
        *mp = m;
    return CLI_OK;
}

/* What the model says about a state file before it is read: M-RoPE models
 * add a per-cell extension this reader does not take; a session names the
 * architecture it was saved with. Returns the exit status. */
static int check_model_fits(const char *path, const gguf_model *m, const llst_file *st)
{
    if (m->rope == GGUF_ROPE_MULTI)
        return cli_fail(CLI_INVALID, FKVF_E_UNSUPPORTED, path,
                        "architecture '%s' uses M-RoPE (several positions per cell): its state "
                        "files carry a per-cell extension that fkvf does not read",
                        m->arch);
    if (st && st->arch && strcmp(st->arch, m->arch))
        return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, path,
                        "a session of architecture '%s', and --model %s is '%s': not the model "
                        "it was saved with",
                        st->arch, model.path, m->arch);
    return CLI_OK;
}

/* The llama.* metadata entries of a cache read from st. LLST_OK or
 * LLST_E_NOMEM. */
static int read_cache_meta(const llst_file *st, kvio_cache *c)
{
    llst_params p;
    llst_params_from_file(st, &p);
    int rc = llst_meta_set(c, &p);
    if (rc == LLST_OK &&
        kvio_cache_set_meta(c, LLST_META_PREFIX "model", cli_base_name(model.path)) != KVIO_OK)
        rc = LLST_E_NOMEM;
    if (rc == LLST_OK && model.m.arch &&
        kvio_cache_set_meta(c, LLST_META_PREFIX "model_arch", model.m.arch) != KVIO_OK)
        rc = LLST_E_NOMEM;
    char ms[160];
    if (rc == LLST_OK && cli_llama_model_stat(ms, sizeof ms) == 0 &&
        kvio_cache_set_meta(c, LLST_META_PREFIX "model_stat", ms) != KVIO_OK)
        rc = LLST_E_NOMEM;
    return rc == LLST_OK ? LLST_OK : LLST_E_NOMEM;
}

int cli_llama_read_cache(const char *path, int lazy, kvio_cache *c)
{
    memset(c, 0, sizeof *c);
    llst_shape sh;
    const gguf_model *m = NULL;
    int ex = cli_llama_shape(path, &sh, &m);
    if (ex != CLI_OK)
        return ex;
    if ((ex = check_model_fits(path, m, NULL)) != CLI_OK)
        return ex;
    cli_llama_file f;
    if ((ex = lazy ? cli_llama_open(path, &f) : cli_llama_load(path, &f)) != CLI_OK)
        return ex;
    if ((ex = check_model_fits(path, m, &f.st)) != CLI_OK) {
        cli_llama_file_free(&f);
        return ex;
    }
    char err[1024];
    int rc = lazy ? llst_to_cache_lazy(&f.st, &sh, path, c, err, sizeof err)
                  : llst_to_cache(&f.st, &sh, path, c, err, sizeof err);
    if (rc == LLST_OK && (rc = read_cache_meta(&f.st, c)) != LLST_OK)
        snprintf(err, sizeof err, "%s: out of memory", path);
    cli_llama_file_free(&f);
    if (rc != LLST_OK) {
        kvio_cache_free(c);
        return cli_fail_llst(rc, path, err);
    }
    c->names = KVIO_NAMES_LLAMA;
    return CLI_OK;
}

void cli_llama_key_defaults(cli_key_opts *k, const kvio_cache *c, const char *path)
{
    int ex;
    const gguf_model *m = cli_llama_model(&ex);
    if (!m || k->no_rope || k->layout_cb)
        return;
    const char *arch = m->arch ? m->arch : "?";
    switch (m->rope) {
    case GGUF_ROPE_NONE:
        k->no_rope = 1;
        cli_note("%s: architecture '%s' has no RoPE: keys archived as cached", path, arch);
        return;
    case GGUF_ROPE_NORM:
    case GGUF_ROPE_NEOX:
        if (!k->layout_set)
            k->layout = m->rope == GGUF_ROPE_NORM ? 1 : 2;
        if (!k->theta_set)
            k->theta = m->rope_theta;
        if (!k->dims_set)
            k->dims = m->rope_dims && m->rope_dims <= c->key_dim ? m->rope_dims : 0;
        if (m->rope_scaled && !k->keys_set) {
            k->pre_rope = 0;
            cli_note("%s: the model's RoPE frequencies are scaled (%s.rope.scaling.*): keys "
                     "archived as cached (--keys as-is), since un-rotating them needs the "
                     "plain rotation of spec 8.1",
                     path, arch);
        }
        return;
    default:
        /* an architecture this table does not know: its rotation (if any) is
         * not known either, so the descriptor claims none (key_transform 0)
         * rather than a pair layout that may be wrong; --rope-* given say
         * what it is */
        if (!k->keys_set && !k->layout_set && !k->theta_set && !k->dims_set) {
            k->pre_rope = 0;
            k->no_rope = 1;
            cli_note("%s: architecture '%s' is not one fkvf knows the rotary scheme of: keys "
                     "archived as cached, no RoPE recorded; give --rope-layout and --rope-* "
                     "(with --keys pre-rope to un-rotate them) if it uses RoPE",
                     path, arch);
        }
        return;
    }
}

void cli_llama_desc(fkvf_desc *d)
{
    int ex;
    const gguf_model *m = cli_llama_model(&ex);
    if (!m)
        return;
    if (!d->model_id || !d->model_id[0])
        d->model_id = m->name && m->name[0] ? m->name : m->arch;
    const uint8_t *h = cli_llama_model_hash(&ex);
    if (h) { /* else the error line is written; the descriptor has no hash */
        d->weights_hash_kind = 2;
        memcpy(d->weights_hash, h, 16);
    }
}

int cli_llama_info(const char *path, int json)
{
    cli_llama_file f;
    int ex = cli_llama_open(path, &f); /* the rows are not needed */
    if (ex != CLI_OK)
        return ex;
    const llst_file *s = &f.st;
    const llst_layer *l0 = s->n_layer ? &s->layers[0] : NULL;
    if (json) {
        printf("{\"file\":");
        cli_json_cstr(stdout, path);
        printf(",\"format\":\"llama.cpp\",\"kind\":\"%s\",\"version\":%u,\"bytes\":%" PRIu64
               ",\"tokens\":%u,\"cells\":%u,\"streams\":%u,\"stream\":%u,\"layers\":%u,"
               "\"v_trans\":%u,\"k_type\":",
               s->kind == LLST_KIND_SEQ ? "seq" : "session", s->version, s->size, s->n_tokens,
               s->n_cells, s->n_stream, s->stream, s->n_layer, s->v_trans);
        cli_json_cstr(stdout, l0 ? llst_type_name(l0->k_type) : "");
        printf(",\"v_type\":");
        cli_json_cstr(stdout, l0 ? llst_type_name(l0->v_type) : "");
        printf(",\"arch\":");
        if (s->arch)
            cli_json_cstr(stdout, s->arch);
        else
            printf("null");
        printf("}\n");
    } else {
        printf("%s: llama.cpp %s file (version %u), %" PRIu64 " bytes\n", path,
               llst_kind_name(s->kind), s->version, s->size);
        if (s->arch) {
            fputs("  architecture  ", stdout);
            cli_text_cstr(stdout, s->arch); /* the file's bytes: escaped */
            putchar('\n');
        }
        printf("  tokens        %u\n", s->n_tokens);
        printf("  cells         %u (stream %u of %u)\n", s->n_cells, s->stream, s->n_stream);
        if (l0) {
            printf("  layers        %u\n", s->n_layer);
            printf("  K type        %s, %" PRIu64 " bytes per cell\n", llst_type_name(l0->k_type),
                   l0->k_row_bytes);
            printf("  V type        %s, %s\n", llst_type_name(l0->v_type),
                   s->v_trans ? "transposed (v_trans 1: flash attention off)"
                              : "rows (v_trans 0: flash attention on)");
        }
        int supported = !l0 || (llst_type_name(l0->k_type) && (l0->k_type == LLST_GGML_F32 ||
                                l0->k_type == LLST_GGML_F16 || l0->k_type == LLST_GGML_BF16) &&
                                (l0->v_type == LLST_GGML_F32 || l0->v_type == LLST_GGML_F16 ||
                                 l0->v_type == LLST_GGML_BF16));
        if (s->n_cells == 0)
            printf("Not an FKVF archive. It holds no cells: nothing to archive.\n");
        else if (!supported)
            printf("Not an FKVF archive. fkvf imports f32, f16 and bf16 caches only: save it "
                   "from a context with an f16 cache (llama.cpp --cache-type-k/-v f16; "
                   "node-llama-cpp experimentalKvCacheKeyType/ValueType \"F16\").\n");
        else
            printf("Not an FKVF archive. To archive it: fkvf import-llama %s --model MODEL.gguf "
                   "-o ARCHIVE.fkvf (docs/llamacpp.md)\n",
                   path);
    }
    cli_llama_file_free(&f);
    return CLI_OK;
}
