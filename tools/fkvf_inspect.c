/* fkvf info / verify / dump: an archive's structure, its checksums, its
 * directory. Public API only. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "cli_remote.h"
#include "commands.h"
#include "fkvf.h"

static const char *const prog = CLI_PROG;

/* ---- small helpers --------------------------------------------------------- */

static void type_name(uint32_t type, char out[12])
{
    int printable = 1;
    for (int i = 0; i < 4; i++) {
        unsigned c = (type >> (8 * i)) & 0xFF;
        if (c < 0x21 || c > 0x7E)
            printable = 0;
        out[i] = (char)c;
    }
    if (printable)
        out[4] = 0;
    else
        snprintf(out, 12, "0x%08" PRIx32, type);
}

static const char *dtype_name(int d)
{
    return d == FKVF_DTYPE_F16 ? "f16" : d == FKVF_DTYPE_BF16 ? "bf16" : d == FKVF_DTYPE_F32 ? "f32" : "?";
}

/* Stream i's description and its name ("tokens", "L3.H1.V.0"). */
static void stream_at(fkvf_reader *r, size_t i, fkvf_stream_info *si, char name[64])
{
    memset(si, 0, sizeof *si);
    fkvf_reader_stream_info(r, i, si);
    uint64_t id = si->id;
    if ((id >> 56) == FKVF_STREAM_KIND_TOKENS)
        snprintf(name, 64, "tokens");
    else
        snprintf(name, 64, "L%u.H%u.%c.%u", (unsigned)(id & 0xFFFF), (unsigned)(id >> 16 & 0xFFFF),
                 (id >> 32 & 0xFF) ? 'V' : 'K', (unsigned)(id >> 40 & 0xFF));
}

/* Parse "ARCHIVE [--json]" and "--help" for a subcommand. Returns 0 ok,
 * 1 help printed, -1 usage error. */
static int parse_common(int argc, char **argv, const char *cmd, const char *help,
                        const char **path, int *json)
{
    *path = NULL;
    *json = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s %s ARCHIVE [--json]\n\n%s", prog, cmd, help);
            return 1;
        } else if (!strcmp(argv[i], "--json")) {
            *json = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            cli_usage("unknown option '%s' (try --help)", argv[i]);
            return -1;
        } else if (*path) {
            cli_usage("more than one ARCHIVE given");
            return -1;
        } else {
            *path = argv[i];
        }
    }
    if (!*path) {
        cli_usage("missing ARCHIVE (try --help)");
        return -1;
    }
    return 0;
}

/* The start of info and dump: the arguments, then the archive opened with
 * its summary in *ai. Returns -1 to go on, else the exit status (help
 * printed, usage error, or the archive could not be opened: reported). */
static int open_archive(int argc, char **argv, const char *cmd, const char *help,
                        const char **path, int *json, fkvf_reader **r, fkvf_archive_info *ai)
{
    *r = NULL;
    int pc = parse_common(argc, argv, cmd, help, path, json);
    if (pc)
        return pc > 0 ? CLI_OK : CLI_USAGE;
    if (!strcmp(cmd, "info") && cli_llama_sniff_file(*path) != LLST_KIND_NONE)
        return cli_llama_info(*path, *json); /* what it is and how to import it */
    int ex = cli_open_reader(r, *path);
    if (ex != CLI_OK)
        return ex;
    fkvf_reader_info(*r, ai);
    return -1;
}

/* ---- info -------------------------------------------------------------------- */

typedef struct part_sizes {
    uint64_t window, indices, tokens, codebooks, metadata, other, structure;
    uint64_t search; /* ZPOS and ZIDX search indexes (spec 20), also counted in other */
    uint64_t search_positions; /* entries of those in effect (n_indexed, summed) */
} part_sizes;

static void sizes_by_part(fkvf_reader *r, const fkvf_archive_info *ai, part_sizes *ps)
{
    memset(ps, 0, sizeof *ps);
    uint64_t sections = 0;
    for (size_t i = 0; i < ai->n_sections; i++) {
        fkvf_section_info s;
        if (fkvf_reader_section(r, i, &s))
            continue;
        sections += s.stored_size;
        switch (s.type) {
        case FKVF_SECTION_EXAC:
            ps->window += s.stored_size;
            break;
        case FKVF_SECTION_STRM:
            if (s.key == FKVF_STREAM_GROUP_TOKENS)
                ps->tokens += s.stored_size;
            else
                ps->indices += s.stored_size;
            break;
        case FKVF_SECTION_CBK1:
        case FKVF_SECTION_CBRF:
        case FKVF_SECTION_VTXS:
        case FKVF_SECTION_CMET: /* the codebook's encoder metric (spec 13.8) */
            ps->codebooks += s.stored_size;
            break;
        case FKVF_SECTION_META:
        case FKVF_SECTION_DESC:
            ps->metadata += s.stored_size;
            break;
        case FKVF_SECTION_ZIDX:
        case FKVF_SECTION_ZPOS:
            ps->search += s.stored_size;
            ps->other += s.stored_size;
            break;
        default:
            ps->other += s.stored_size;
        }
    }
    ps->structure = ai->committed_size - sections;
    /* the positions the indexes in effect cover, as a search handle finds
     * them: for each stream with an index section (once) */
    for (size_t i = 0; ps->search && i < ai->n_sections; i++) {
        fkvf_section_info s, e;
        size_t si, k = 0;
        if (fkvf_reader_section(r, i, &s) ||
            (s.type != FKVF_SECTION_ZIDX && s.type != FKVF_SECTION_ZPOS) ||
            fkvf_reader_stream_find(r, s.key, &si))
            continue;
        while (k < i && !(fkvf_reader_section(r, k, &e) == FKVF_OK && e.key == s.key &&
                          (e.type == FKVF_SECTION_ZIDX || e.type == FKVF_SECTION_ZPOS)))
            k++;
        if (k < i)
            continue; /* counted with the first */
        fkvf_search *h = NULL;
        fkvf_search_status st;
        if (fkvf_search_open(&h, r, si, 0, NULL) == FKVF_OK && fkvf_search_info(h, &st) == FKVF_OK)
            ps->search_positions += st.n_indexed;
        fkvf_search_free(h);
    }
}

static const char *info_help =
    "Shows the header, the commits, the cache shape, the codec of each stream,\n"
    "bytes per part and the metadata (of an archive or a codebook file). --json\n"
    "prints one JSON object (with \"error\": null, or the error object of\n"
    "docs/cli.md when the metadata or the encoder metric is invalid; \"metric\":\n"
    "the codebook's encoder metric, \"keys\", \"values\", \"keys+values\" or null,\n"
    "spec 13.8).\n"
    "The ratio vs fp16 counts the codebook: an embedded one (also given without\n"
    "it), or for an archive that refers to a codebook file, that file as found\n"
    "by content hash in the archive's directory, then in each directory of\n"
    "FKVF_CODEBOOK_PATH (docs/codebooks.md); the ratio without it too.\n"
    "On a llama.cpp state file (llama_state_seq_save_file, llama_state_save_file):\n"
    "what it holds (kind, tokens, cells, K/V types, V layout) and the fkvf\n"
    "import-llama command that archives it (docs/llamacpp.md).\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (not an FKVF file, invalid metadata or\n"
    "encoder metric),\n"
    "2 usage or I/O error (also: ARCHIVE does not exist).\n";

static void print_meta_value(FILE *f, const fkvf_meta_entry *e, int json)
{
    switch (e->type) {
    case FKVF_META_U64:
        fprintf(f, "%" PRIu64, e->u64);
        break;
    case FKVF_META_I64:
        fprintf(f, "%" PRId64, e->i64);
        break;
    case FKVF_META_F64:
        fprintf(f, "%.17g", e->f64);
        break;
    case FKVF_META_BOOL:
        fprintf(f, e->u64 ? "true" : "false");
        break;
    case FKVF_META_UTF8:
        if (json)
            cli_json_str(f, e->value, e->value_len);
        else
            cli_text_str(f, e->value, e->value_len);
        break;
    default:
        if (json)
            fputc('"', f);
        for (size_t i = 0; i < e->value_len; i++)
            fprintf(f, "%02x", ((const unsigned char *)e->value)[i]);
        if (json)
            fputc('"', f);
    }
}

/* What info prints, gathered by info_run. */
typedef struct info_facts {
    const char *path;
    fkvf_reader *r, *cbf; /* the archive; its external codebook file when found */
    fkvf_archive_info ai;
    fkvf_desc d;
    int has_desc;
    part_sizes ps;
    size_t n_meta;
    int meta_rc;                    /* the metadata's validity */
    char meta_msg[1024];            /* and the message when invalid */
    uint64_t fp16_bytes, no_cb;     /* the cache as fp16; the archive without its codebooks */
    uint64_t cbf_bytes;             /* the external codebook file's size */
    int metric_rc;                  /* fkvf_reader_metric's result (spec 13.8) */
    unsigned metric_parts;          /* and its parts: 1 keys, 2 values */
    int ec;                         /* the exit status (errors reported) */
} info_facts;

/* The encoder metric as info prints it: "keys", "values", "keys+values",
 * "none", or why it is not known. */
static const char *metric_text(const info_facts *x)
{
    if (x->metric_rc == FKVF_OK)
        return x->metric_parts == 3 ? "keys+values" : x->metric_parts == 1 ? "keys" : "values";
    if (x->metric_rc == FKVF_E_NOT_FOUND)
        return "none";
    if (x->metric_rc == FKVF_E_CODEBOOK)
        return "not known (the codebook file was not found)";
    return "invalid (see the error above; fkvf verify)";
}

/* The facts of the archive x->r (opened from x->path): errors (invalid
 * metadata, an external codebook of its hash that does not fit) are
 * reported and set x->ec; the rest is printed still. */
static void info_run(info_facts *x)
{
    fkvf_reader *r = x->r;
    x->ec = CLI_OK;
    x->has_desc = fkvf_reader_desc(r, &x->d) == FKVF_OK;
    sizes_by_part(r, &x->ai, &x->ps);
    x->n_meta = 0;
    x->meta_rc = fkvf_reader_meta_count(r, &x->n_meta);
    snprintf(x->meta_msg, sizeof x->meta_msg, "%s", x->meta_rc ? fkvf_reader_message(r) : "");
    if (x->meta_rc != FKVF_OK)
        x->ec = cli_fail_reader(x->meta_rc, r, x->path, "metadata: ");
    const fkvf_desc *d = &x->d;
    x->fp16_bytes = 0;
    if (x->has_desc)
        x->fp16_bytes = x->ai.n_positions * (uint64_t)d->n_layers * d->n_kv_heads *
                        (d->key_dim + d->value_dim) * 2;
    x->no_cb = x->ai.committed_size - x->ps.codebooks;
    /* an external codebook, found by content hash, counted in the ratio */
    x->cbf = NULL;
    x->cbf_bytes = 0;
    cli_codebook_status st;
    st.allow_missing = 1;
    int ext_rc = cli_open_codebook(r, x->path, NULL, &x->cbf, &st);
    fkvf_archive_info cbi;
    if (x->cbf && fkvf_reader_info(x->cbf, &cbi) == FKVF_OK)
        x->cbf_bytes = cbi.file_size;
    if (ext_rc != CLI_OK)
        x->ec = ext_rc; /* a file of its hash that does not fit: reported */
    /* the codebook's encoder metric: with the codebook (embedded, or the
     * codebook file attached above) */
    fkvf_rvq_metric m;
    x->metric_rc = fkvf_reader_metric(r, &m);
    x->metric_parts = (m.keys ? 1u : 0u) | (m.values ? 2u : 0u);
    if (x->metric_rc != FKVF_OK && x->metric_rc != FKVF_E_NOT_FOUND &&
        x->metric_rc != FKVF_E_CODEBOOK)
        x->ec = cli_fail_reader(x->metric_rc, r, x->path, "encoder metric: ");
}

/* --json: the "cache" member (the descriptor). */
static void info_json_cache(FILE *f, const info_facts *x)
{
    const fkvf_desc d = x->d;
    const int has_desc = x->has_desc;
    if (has_desc) {
        fprintf(f, ",\"cache\":{\"layers\":%u,\"kv_heads\":%u,\"key_dim\":%u,\"value_dim\":%u,"
                   "\"dtype\":\"%s\",\"sinks\":%u,\"window\":%u,\"model_id\":",
                d.n_layers, d.n_kv_heads, d.key_dim, d.value_dim, dtype_name(d.dtype),
                d.n_sinks, d.window);
        cli_json_cstr(f, d.model_id);
        fprintf(f, ",\"tokenizer_id\":");
        cli_json_cstr(f, d.tokenizer_id);
        if (d.weights_hash_kind) {
            size_t hl = d.weights_hash_kind == 1 ? 32 : 16;
            fprintf(f, ",\"weights_hash\":{\"kind\":\"%s\",\"hex\":\"",
                    d.weights_hash_kind == 1 ? "sha256" : "xxh3-128");
            for (size_t i = 0; i < hl; i++)
                fprintf(f, "%02x", d.weights_hash[i]);
            fprintf(f, "\"}");
        } else {
            fprintf(f, ",\"weights_hash\":null");
        }
        if (d.key_transform == 1)
            fprintf(f, ",\"rope\":{\"theta\":%.17g,\"dims\":%u,\"layout\":\"%s\",\"keys\":\"%s\"}",
                    d.rope_theta, d.rope_dims, d.rope_layout == 1 ? "interleaved" : "half-split",
                    d.key_storage ? "pre-rope" : "as-is");
        else
            fprintf(f, ",\"rope\":null");
        fprintf(f, "}");
    } else {
        fprintf(f, ",\"cache\":null");
    }
}

/* --json: the stream list and the metadata. */
static void info_json_lists(FILE *f, const info_facts *x)
{
    fkvf_reader *r = x->r;
    const fkvf_archive_info ai = x->ai;
    const int meta_rc = x->meta_rc;
    const size_t n_meta = x->n_meta;
    fprintf(f, ",\"stream_list\":[");
    for (size_t i = 0; i < ai.n_streams; i++) {
        fkvf_stream_info si;
        char nm[64];
        stream_at(r, i, &si, nm);
        fprintf(f, "%s{\"name\":\"%s\",\"id\":%" PRIu64 ",\"profile\":\"%s\",\"symbols\":%" PRIu64
                   ",\"bits\":%u,\"alphabet\":%u,\"span\":%u,\"r\":%.17g,\"bytes\":%" PRIu64 "}",
                i ? "," : "", nm, si.id, si.profile == FKVF_PROFILE_QUAD ? "quad" : "ngon",
                si.length, si.symbol_bits, si.alphabet, si.span_symbols, si.r, si.stored_bytes);
    }
    fprintf(f, "],\"metadata\":{");
    for (size_t i = 0; meta_rc == FKVF_OK && i < n_meta; i++) {
        fkvf_meta_entry e;
        if (fkvf_reader_meta(r, i, &e))
            break;
        if (i)
            fputc(',', f);
        cli_json_str(f, e.key, e.key_len);
        fputc(':', f);
        print_meta_value(f, &e, 1);
    }
    fprintf(f, "}");
}

static void info_json(FILE *f, const info_facts *x)
{
    const char *path = x->path;
    const fkvf_archive_info ai = x->ai;
    const part_sizes ps = x->ps;
    const uint64_t fp16_bytes = x->fp16_bytes, cbf_bytes = x->cbf_bytes;
    const fkvf_reader *cbf = x->cbf;
    fprintf(f, "{\"file\":");
    cli_json_cstr(f, path);
    fprintf(f, ",\"format\":\"%u.%u\",\"required_features\":%" PRIu64
               ",\"optional_features\":%" PRIu64 ",\"file_size\":%" PRIu64
               ",\"committed_size\":%" PRIu64 ",\"torn_bytes\":%" PRIu64
               ",\"commits\":%" PRIu64 ",\"positions\":%" PRIu64 ",\"archived\":%" PRIu64
               ",\"sections\":%zu,\"streams\":%zu",
            ai.format_major, ai.format_minor, ai.required_features, ai.optional_features,
            ai.file_size, ai.committed_size, ai.torn_bytes, ai.n_commits, ai.n_positions,
            ai.n_archived, ai.n_sections, ai.n_streams);
    info_json_cache(f, x);
    /* "keys", "values", "keys+values"; null: none (or not known) */
    if (x->metric_rc == FKVF_OK)
        fprintf(f, ",\"metric\":\"%s\"", metric_text(x));
    else
        fprintf(f, ",\"metric\":null");
    fprintf(f, ",\"bytes\":{\"window\":%" PRIu64 ",\"indices\":%" PRIu64 ",\"tokens\":%" PRIu64
               ",\"codebooks\":%" PRIu64 ",\"metadata\":%" PRIu64 ",\"other\":%" PRIu64
               ",\"structure\":%" PRIu64 ",\"fp16_equivalent\":%" PRIu64
               ",\"search_index\":%" PRIu64 ",\"search_index_positions\":%" PRIu64,
            ps.window, ps.indices, ps.tokens, ps.codebooks, ps.metadata, ps.other, ps.structure,
            fp16_bytes, ps.search, ps.search_positions);
    /* the external codebook file found by content hash (null: none, or not found) */
    if (cbf)
        fprintf(f, ",\"codebook_file\":%" PRIu64 "}", cbf_bytes);
    else
        fprintf(f, ",\"codebook_file\":null}");
    info_json_lists(f, x);
    cli_json_error_member(f, x->ec);
    cli_json_done();
    fprintf(f, "}\n");
}

/* Text: the file, format, size, cache, model, keys and positions lines. */
static void info_text_head(FILE *f, const info_facts *x)
{
    const char *path = x->path;
    const fkvf_archive_info ai = x->ai;
    const fkvf_desc d = x->d;
    const int has_desc = x->has_desc;
    fprintf(f, "file            %s\n", path);
    fprintf(f, "format          FKVF %u.%u, required features 0x%" PRIx64 "%s%s%s%s, optional 0x%" PRIx64 "\n",
            ai.format_major, ai.format_minor, ai.required_features,
            ai.required_features & FKVF_FEAT_NGON ? " ngon" : "",
            ai.required_features & FKVF_FEAT_DEFLATE ? " deflate" : "",
            ai.required_features & FKVF_FEAT_EXTERNAL_CODEBOOK ? " external-codebook" : "",
            ai.required_features & FKVF_FEAT_LAYER_STAGES ? " layer-stages" : "",
            ai.optional_features);
    if (ai.optional_features & (FKVF_OPTFEAT_TOKEN_STREAM | FKVF_OPTFEAT_ENCODER_METRIC))
        fprintf(f, "                (optional: %s%s)\n",
                ai.optional_features & FKVF_OPTFEAT_TOKEN_STREAM ? "token-stream" : "",
                ai.optional_features & FKVF_OPTFEAT_ENCODER_METRIC
                    ? (ai.optional_features & FKVF_OPTFEAT_TOKEN_STREAM ? " encoder-metric"
                                                                          : "encoder-metric")
                    : "");
    fprintf(f, "size            %" PRIu64 " bytes in %" PRIu64 " commit(s)", ai.file_size, ai.n_commits);
    if (ai.torn_bytes)
        fprintf(f, "; TORN TAIL: %" PRIu64 " bytes after commit %" PRIu64
                   " (committed size %" PRIu64 "), recoverable: run fkvf recover",
                ai.torn_bytes, ai.n_commits, ai.committed_size);
    fputc('\n', f);
    if (has_desc) {
        fprintf(f, "cache           %u layers x %u KV heads, key dim %u, value dim %u, %s\n",
                d.n_layers, d.n_kv_heads, d.key_dim, d.value_dim, dtype_name(d.dtype));
        fputs("model           ", f);
        cli_text_cstr(f, *d.model_id ? d.model_id : "(not given)");
        if (*d.tokenizer_id) {
            fputs(", tokenizer ", f);
            cli_text_cstr(f, d.tokenizer_id);
        }
        if (d.weights_hash_kind) { /* which weights: a model's name can mislead */
            size_t hl = d.weights_hash_kind == 1 ? 32 : 16;
            fprintf(f, "; weights %s ", d.weights_hash_kind == 1 ? "sha256" : "xxh3-128");
            for (size_t i = 0; i < hl; i++)
                fprintf(f, "%02x", d.weights_hash[i]);
        }
        fputc('\n', f);
        if (d.key_transform == 1)
            fprintf(f, "keys            RoPE theta %g, %u dims, %s pairs, archived %s\n", d.rope_theta,
                    d.rope_dims, d.rope_layout == 1 ? "interleaved" : "half-split",
                    d.key_storage ? "before rotation" : "as cached");
        fprintf(f, "positions       %" PRIu64 " (%" PRIu64 " archived, %" PRIu64
                   " exact; policy %u sinks + %u recent)\n",
                ai.n_positions, ai.n_archived, ai.n_positions - ai.n_archived, d.n_sinks, d.window);
    } else {
        fprintf(f, "kind            codebook file (no cache descriptor)\n");
    }
    if (x->metric_rc != FKVF_E_NOT_FOUND)
        fprintf(f, "encoder metric  %s\n", metric_text(x));
}

/* Text: the bytes by part and the ratio vs fp16. */
static void info_text_ratio(FILE *f, const info_facts *x)
{
    fkvf_reader *r = x->r;
    const fkvf_archive_info ai = x->ai;
    const part_sizes ps = x->ps;
    const uint64_t fp16_bytes = x->fp16_bytes, cbf_bytes = x->cbf_bytes, no_cb = x->no_cb;
    const fkvf_reader *cbf = x->cbf;
    fprintf(f, "bytes           window %" PRIu64 ", indices %" PRIu64 ", tokens %" PRIu64
               ", codebooks %" PRIu64 ", metadata %" PRIu64 ", other %" PRIu64
               ", structure %" PRIu64 "\n",
            ps.window, ps.indices, ps.tokens, ps.codebooks, ps.metadata, ps.other, ps.structure);
    if (ps.search)
        fprintf(f, "search index    %" PRIu64 " bytes (in other), %" PRIu64
                   " positions indexed in effect (%.2f B/position)\n",
                ps.search, ps.search_positions,
                ps.search_positions ? (double)ps.search / (double)ps.search_positions : 0.0);
    else
        fprintf(f, "search index    none (queries scan: fkvf index adds one)\n");
    int cb_external = 0;
    uint8_t cb_hash[16] = {0}; /* set only for an external codebook */
    if (fkvf_reader_codebook_ref(r, &cb_external, cb_hash, NULL) != FKVF_OK)
        cb_external = 0;
    char hx[33];
    cli_hex16(cb_hash, hx);
    if (fp16_bytes && ai.committed_size && cb_external && cbf) {
        fprintf(f, "ratio vs fp16   %.2fx with the codebook file (%" PRIu64 " bytes, content "
                   "hash %s), %.2fx without it (fp16 cache: %" PRIu64 " bytes)\n",
                (double)fp16_bytes / (double)(ai.committed_size + cbf_bytes), cbf_bytes, hx,
                (double)fp16_bytes / (double)ai.committed_size, fp16_bytes);
    } else if (fp16_bytes && ai.committed_size && cb_external) {
        fprintf(f, "ratio vs fp16   %.2fx without the codebook file (content hash %s, not "
                   "found: see FKVF_CODEBOOK_PATH; fp16 cache: %" PRIu64 " bytes)\n",
                (double)fp16_bytes / (double)ai.committed_size, hx, fp16_bytes);
    } else if (fp16_bytes && ai.committed_size) {
        fprintf(f, "ratio vs fp16   %.2fx with codebooks, %.2fx without (fp16 cache: %" PRIu64 " bytes)\n",
                (double)fp16_bytes / (double)ai.committed_size,
                no_cb ? (double)fp16_bytes / (double)no_cb : 0.0, fp16_bytes);
    }
}

/* Text: the streams (the first 16) and the metadata. */
static void info_text_lists(FILE *f, const info_facts *x)
{
    fkvf_reader *r = x->r;
    const fkvf_archive_info ai = x->ai;
    const int meta_rc = x->meta_rc;
    const size_t n_meta = x->n_meta;
    const char *meta_msg = x->meta_msg;
    fprintf(f, "streams         %zu\n", ai.n_streams);
    for (size_t i = 0; i < ai.n_streams && i < 16; i++) {
        fkvf_stream_info si;
        char nm[64];
        stream_at(r, i, &si, nm);
        double per = si.length ? (double)si.stored_bytes / (double)si.length : 0.0;
        if (si.profile == FKVF_PROFILE_QUAD)
            fprintf(f, "  %-14s quad %2u-bit, %" PRIu64 " symbols, %" PRIu64 " bytes (%.3f B/symbol)\n",
                    nm, si.symbol_bits, si.length, si.stored_bytes, per);
        else
            fprintf(f, "  %-14s ngon N=%u r=%.6g L=%u, %" PRIu64 " symbols, %" PRIu64 " bytes (%.3f B/symbol)\n",
                    nm, si.alphabet, si.r, si.span_symbols, si.length, si.stored_bytes, per);
    }
    if (ai.n_streams > 16)
        fprintf(f, "  ... %zu more (use --json for all)\n", ai.n_streams - 16);
    if (meta_rc != FKVF_OK) {
        fputs("metadata        invalid: ", f);
        cli_text_cstr(f, meta_msg);
        fputc('\n', f);
    } else {
        fprintf(f, "metadata        %zu entr%s\n", n_meta, n_meta == 1 ? "y" : "ies");
        for (size_t i = 0; i < n_meta; i++) {
            fkvf_meta_entry e;
            if (fkvf_reader_meta(r, i, &e))
                break;
            fputs("  ", f);
            cli_text_str(f, e.key, e.key_len);
            fputs(" = ", f);
            print_meta_value(f, &e, 0);
            fputc('\n', f);
        }
    }
}

int fkvf_cli_info(int argc, char **argv)
{
    info_facts x;
    int json;
    int ec = open_archive(argc, argv, "info", info_help, &x.path, &json, &x.r, &x.ai);
    if (ec >= 0)
        return ec;
    info_run(&x);
    if (json) {
        info_json(stdout, &x);
    } else {
        info_text_head(stdout, &x);
        info_text_ratio(stdout, &x);
        info_text_lists(stdout, &x);
    }
    fkvf_reader_free(x.r);
    fkvf_reader_free(x.cbf);
    return x.ec;
}

/* ---- verify -------------------------------------------------------------------- */

static const char *verify_help =
    "Checks every structure, checksum, padding byte and span of the archive.\n"
    "Exit status: 0 valid, 1 invalid (the message names the offset, the field\n"
    "and the spec clause), 2 usage or I/O error. A torn tail after the last\n"
    "valid commit (an append that did not complete) is reported as invalid\n"
    "(FKVF_E_TORN, exit 1) but recoverable: the message gives the torn bytes and\n"
    "the commit served, and 'fkvf recover ARCHIVE' cuts the tail off.\n"
    "\n"
    "  --codebooks FILE   the codebook file of an archive that refers to one (spec\n"
    "                     13.5): its content hash and shape are checked, and every\n"
    "                     index symbol against its k (a wrong file is exit 1, a\n"
    "                     FILE that does not exist or cannot be read exit 2; an\n"
    "                     empty FILE means none, not looked up). Default: the\n"
    "                     file found by content hash in the archive's directory,\n"
    "                     then in each directory of FKVF_CODEBOOK_PATH\n"
    "                     (docs/codebooks.md); when none is found, a note on stderr\n"
    "                     and those checks are not made (a file of that hash that\n"
    "                     does not fit: exit 1)\n"
    "  --threads N        threads the checks run on (default: every CPU this\n"
    "                     process may use, or FKVF_THREADS); the result (the\n"
    "                     first error, its message and offset) is the same for\n"
    "                     any N\n"
    "  --json             one JSON object: file, valid, code, recoverable_torn_tail,\n"
    "                     message, commits, torn_bytes, committed_size and error\n"
    "                     (null, or the error object of docs/cli.md)\n";

typedef struct verify_opts {
    const char *path, *cbpath; /* cbpath: --codebooks FILE (NULL: none given, or "") */
    int json, cb_none;         /* cb_none: --codebooks "" (none, not looked up) */
} verify_opts;

/* Returns -1 to go on, else the exit status (help printed, usage error). */
static int verify_parse(int argc, char **argv, verify_opts *o)
{
    memset(o, 0, sizeof *o);
    /* --codebooks FILE is verify's own; the rest is parsed as for info */
    char **rest = malloc((size_t)(argc > 0 ? argc : 1) * sizeof *rest);
    int nrest = 0;
    if (!rest)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--codebooks")) {
            if (i + 1 >= argc) {
                free(rest);
                return cli_usage("--codebooks needs a FILE");
            }
            o->cbpath = argv[++i];
            o->cb_none = !*o->cbpath;
            if (o->cb_none)
                o->cbpath = NULL; /* "" = none, not looked up: lets scripts pass an optional file */
        } else {
            rest[nrest++] = argv[i];
        }
    }
    int pc = parse_common(nrest, rest, "verify", verify_help, &o->path, &o->json);
    free(rest);
    if (pc)
        return pc > 0 ? CLI_OK : CLI_USAGE;
    return -1;
}

/* The outcome of a verification. */
typedef struct verify_result {
    fkvf_reader *r, *cb; /* the archive (NULL when it could not be opened), its codebook file */
    int rc, ec;          /* the library's code; the exit status (errors reported) */
    char msg[1024];      /* the message of rc (copied: later calls clear the handle's) */
    char cb_note[1024];  /* why no codebook file was found, when verified without it */
    fkvf_archive_info ai;
} verify_result;

/* The codebook file to verify with: --codebooks FILE, else the one found by
 * content hash (archive's directory, FKVF_CODEBOOK_PATH); none found:
 * verified without it, the reason in v->cb_note. */
static void verify_codebook(const verify_opts *o, verify_result *v)
{
    cli_codebook_status st;
    st.allow_missing = !o->cbpath;
    if (o->cbpath) {
        int ext = 0;
        fkvf_reader_codebook_ref(v->r, &ext, NULL, NULL);
        if (!ext) {
            v->rc = FKVF_E_INVALID_ARG;
            v->ec = cli_fail(CLI_USAGE, v->rc, o->path, "--codebooks given, but the archive does "
                             "not refer to an external codebook");
            return;
        }
    } else if (o->cb_none) {
        return;
    }
    if ((v->ec = cli_open_codebook(v->r, o->path, o->cbpath, &v->cb, &st)) != CLI_OK) {
        v->rc = st.rc; /* a FILE that cannot be opened or does not fit */
        snprintf(v->msg, sizeof v->msg, "%s", st.message);
    }
    snprintf(v->cb_note, sizeof v->cb_note, "%s", st.missing);
}

static void verify_run(const verify_opts *o, verify_result *v)
{
    memset(v, 0, sizeof *v);
    v->ec = CLI_OK;
    v->rc = cli_open_path_or_url(&v->r, o->path);
    if (v->rc != FKVF_OK)
        v->ec = cli_fail_reader(v->rc, v->r, o->path, "");
    else
        verify_codebook(o, v);
    if (v->rc == FKVF_OK)
        fkvf_reader_set_threads(v->r, cli_threads()); /* the result is the same for any */
    if (v->rc == FKVF_OK && (v->rc = fkvf_reader_verify(v->r)) != FKVF_OK)
        v->ec = cli_fail_reader(v->rc, v->r, o->path, "");
    if (*v->cb_note && v->rc == FKVF_OK)
        cli_note("%s; verified without it: the checks that need the codebook (spec 11.8: "
                 "stage counts, symbol range) were not made (pass --codebooks FILE)",
                 v->cb_note);
    /* copy: later calls on the handle clear its message */
    if (!*v->msg)
        snprintf(v->msg, sizeof v->msg, "%s", v->r ? fkvf_reader_message(v->r) : "");
    if (v->rc == FKVF_OK)
        v->ec = CLI_OK;
    if (v->r)
        fkvf_reader_info(v->r, &v->ai);
}

static void verify_print(const verify_opts *o, const verify_result *v)
{
    const char *path = o->path;
    const int rc = v->rc;
    const fkvf_archive_info ai = v->ai;
    if (o->json) {
        printf("{\"file\":");
        cli_json_cstr(stdout, path);
        printf(",\"valid\":%s,\"code\":%d,\"recoverable_torn_tail\":%s,\"message\":",
               rc == FKVF_OK ? "true" : "false", rc, rc == FKVF_E_TORN ? "true" : "false");
        cli_json_cstr(stdout, rc ? (*v->msg ? v->msg : fkvf_strerror(rc)) : "");
        printf(",\"commits\":%" PRIu64 ",\"torn_bytes\":%" PRIu64 ",\"committed_size\":%" PRIu64,
               ai.n_commits, ai.torn_bytes, ai.committed_size);
        if (rc == FKVF_E_TORN)
            printf(",\"commit_served\":%" PRIu64 ",\"recover\":\"recoverable: run fkvf recover\"",
                   ai.n_commits);
        cli_json_error_member(stdout, v->ec);
        cli_json_done();
        printf("}\n");
    } else if (rc == FKVF_OK) {
        printf("%s: OK (%" PRIu64 " commit(s), %zu sections, %" PRIu64 " positions)\n", path,
               ai.n_commits, ai.n_sections, ai.n_positions);
    } else if (rc == FKVF_E_TORN) {
        fprintf(stderr, "%s verify: %s: the committed data up to byte %" PRIu64
                        " (commit %" PRIu64 ", %" PRIu64 " positions) is intact; %" PRIu64
                        " torn bytes after it\n",
                prog, path, ai.committed_size, ai.n_commits, ai.n_positions, ai.torn_bytes);
        fprintf(stderr, "%s verify: %s: recoverable: run fkvf recover ", prog, path);
        cli_text_cstr(stderr, path);
        fputc('\n', stderr);
    }
}

int fkvf_cli_verify(int argc, char **argv)
{
    verify_opts o;
    int ex = verify_parse(argc, argv, &o);
    if (ex >= 0)
        return ex;
    verify_result v;
    verify_run(&o, &v);
    verify_print(&o, &v);
    fkvf_reader_free(v.r);
    fkvf_reader_free(v.cb);
    return v.ec;
}

/* ---- dump ----------------------------------------------------------------------- */

static const char *dump_help =
    "Lists every section of every trusted commit: type, flags, offset, sizes,\n"
    "key and checksum, then the streams. --json prints one JSON object.\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (not an FKVF file), 2 usage or I/O error\n"
    "(also: ARCHIVE does not exist).\n";

int fkvf_cli_dump(int argc, char **argv)
{
    const char *path;
    int json;
    fkvf_reader *r;
    fkvf_archive_info ai;
    int ec = open_archive(argc, argv, "dump", dump_help, &path, &json, &r, &ai);
    if (ec >= 0)
        return ec;
    if (json) {
        printf("{\"file\":");
        cli_json_cstr(stdout, path);
        printf(",\"sections\":[");
    } else {
        printf("%s: %" PRIu64 " bytes, %" PRIu64 " commit(s), %zu sections\n", path, ai.file_size,
               ai.n_commits, ai.n_sections);
        printf("%-6s %-10s %-5s %12s %12s %12s %18s %16s\n", "commit", "type", "flags", "offset",
               "stored", "size", "key", "checksum");
    }
    for (size_t i = 0; i < ai.n_sections; i++) {
        fkvf_section_info s;
        fkvf_reader_section(r, i, &s);
        char tn[12];
        type_name(s.type, tn);
        char fl[4] = "--";
        if (s.flags & FKVF_SECTION_REQUIRED)
            fl[0] = 'R';
        if (s.flags & FKVF_SECTION_DEFLATE)
            fl[1] = 'Z';
        if (json) {
            /* a type of printable bytes may hold a quote or a backslash */
            printf("%s{\"commit\":%" PRIu64 ",\"type\":", i ? "," : "", s.commit_seq);
            cli_json_cstr(stdout, tn);
            printf(",\"required\":%s,\"deflate\":%s,"
                   "\"offset\":%" PRIu64 ",\"stored_size\":%" PRIu64 ",\"size\":%" PRIu64
                   ",\"key\":%" PRIu64 ",\"checksum\":\"%016" PRIx64 "\"}",
                   (s.flags & 1) ? "true" : "false", (s.flags & 2) ? "true" : "false", s.offset,
                   s.stored_size, s.size, s.key, s.checksum);
        } else {
            printf("%-6" PRIu64 " %-10s %-5s %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %#18" PRIx64
                   " %016" PRIx64 "\n",
                   s.commit_seq, tn, fl, s.offset, s.stored_size, s.size, s.key, s.checksum);
        }
    }
    if (json)
        printf("],\"streams\":[");
    else if (ai.n_streams)
        printf("\n%-14s %-7s %12s %6s %8s %10s %8s %12s\n", "stream", "profile", "symbols", "bits",
               "alphabet", "r", "span", "bytes");
    for (size_t i = 0; i < ai.n_streams; i++) {
        fkvf_stream_info si;
        char nm[64];
        stream_at(r, i, &si, nm);
        if (json)
            printf("%s{\"name\":\"%s\",\"profile\":\"%s\",\"symbols\":%" PRIu64 ",\"segments\":%zu,"
                   "\"bytes\":%" PRIu64 "}",
                   i ? "," : "", nm, si.profile == FKVF_PROFILE_QUAD ? "quad" : "ngon", si.length,
                   si.n_segments, si.stored_bytes);
        else
            printf("%-14s %-7s %12" PRIu64 " %6u %8u %10.6g %8u %12" PRIu64 "\n", nm,
                   si.profile == FKVF_PROFILE_QUAD ? "quad" : "ngon", si.length, si.symbol_bits,
                   si.alphabet, si.r, si.span_symbols, si.stored_bytes);
    }
    if (json)
        printf("]}\n");
    fkvf_reader_free(r);
    return CLI_OK;
}
