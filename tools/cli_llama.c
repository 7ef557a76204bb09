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
#include <sys/mman.h>
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
        int rc = gguf_read_file(model.path, &model.m, model.hash, err, sizeof err);
        if (rc != GGUF_OK) {
            model.loaded = -1;
            /* err names the file already */
            *ex = cli_fail(exit_of_gguf(rc), code_of_gguf(rc), model.path, "%s", err);
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
    return cli_llama_model(ex) ? model.hash : NULL;
}

/* The first bytes of path; 0 if it cannot be read (the caller's reader
 * then says why). */
static size_t head_of(const char *path, uint8_t *buf, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
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

int cli_llama_map(const char *path, cli_llama_file *f)
{
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cli_fail(CLI_USAGE, FKVF_E_IO, path, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        close(fd);
        return cli_fail(CLI_USAGE, FKVF_E_IO, path, "%s",
                        S_ISDIR(st.st_mode) ? "is a directory" : strerror(e));
    }
    f->size = (size_t)st.st_size;
    if (f->size > 0) {
        f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            int e = errno;
            close(fd);
            f->map = NULL;
            return cli_fail(CLI_USAGE, FKVF_E_IO, path, "cannot map: %s", strerror(e));
        }
    }
    close(fd);
    char err[1024];
    int rc = llst_parse(f->map ? f->map : (const void *)"", f->size, path, &f->st, err, sizeof err);
    if (rc != LLST_OK) {
        cli_llama_unmap(f);
        return cli_fail_llst(rc, path, err);
    }
    return CLI_OK;
}

void cli_llama_unmap(cli_llama_file *f)
{
    if (!f)
        return;
    llst_free(&f->st);
    if (f->map)
        munmap(f->map, f->size);
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

int cli_llama_read_cache(const char *path, kvio_cache *c)
{
    memset(c, 0, sizeof *c);
    llst_shape sh;
    int ex = cli_llama_shape(path, &sh, NULL);
    if (ex != CLI_OK)
        return ex;
    cli_llama_file f;
    if ((ex = cli_llama_map(path, &f)) != CLI_OK)
        return ex;
    char err[1024];
    int rc = llst_to_cache(&f.st, &sh, path, c, err, sizeof err);
    if (rc == LLST_OK) {
        llst_params p;
        llst_params_from_file(&f.st, &p);
        rc = llst_meta_set(c, &p);
        if (rc == LLST_OK && kvio_cache_set_meta(c, LLST_META_PREFIX "model",
                                                 cli_base_name(model.path)) != KVIO_OK)
            rc = LLST_E_NOMEM;
        if (rc == LLST_OK && model.m.arch &&
            kvio_cache_set_meta(c, LLST_META_PREFIX "model_arch", model.m.arch) != KVIO_OK)
            rc = LLST_E_NOMEM;
        if (rc != LLST_OK)
            snprintf(err, sizeof err, "%s: out of memory", path);
    }
    cli_llama_unmap(&f);
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
        if (!k->keys_set && !k->layout_set) {
            k->pre_rope = 0;
            cli_note("%s: architecture '%s': rotary scheme %s, keys archived as cached "
                     "(--keys as-is); give --keys pre-rope with --rope-* to un-rotate them",
                     path, arch, gguf_rope_name(m->rope));
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
    d->weights_hash_kind = 2;
    memcpy(d->weights_hash, model.hash, 16);
}

int cli_llama_info(const char *path, int json)
{
    cli_llama_file f;
    int ex = cli_llama_map(path, &f);
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
        if (s->arch)
            printf("  architecture  %s\n", s->arch);
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
        printf("Not an FKVF archive. To archive it: fkvf import-llama %s --model MODEL.gguf "
               "-o ARCHIVE.fkvf (docs/llamacpp.md)\n",
               path);
    }
    cli_llama_unmap(&f);
    return CLI_OK;
}
