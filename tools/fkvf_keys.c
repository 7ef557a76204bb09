/* fkvf keys: key retrieval (fkvf_search_keys): the archived positions whose
 * keys a query vector weighs most. Uses the public API only (fkvf.h). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "fkvf.h"

static const char *keys_help =
    "usage: fkvf keys ARCHIVE --layer L --head H (--query LIST | --query-file FILE)\n"
    "                 [-m M] [--first P] [--end P] [--candidates C] [--chunk P]\n"
    "                 [--codebooks FILE] [--json]\n"
    "\n"
    "Which archived positions would attention weigh most? For KV head H of\n"
    "layer L and a query vector q (as attention applies it: after RoPE at the\n"
    "query's position), prints the M archived positions p with the largest\n"
    "q . k_p, k_p the key the archive decodes for p, best first, with their\n"
    "scores. Answered from the codebook and the index streams without decoding\n"
    "the range: the stage-0 key centroids are scored against q, the positions\n"
    "of the best symbols gathered (through the stream's search index when it\n"
    "has one: fkvf index) until there are C x M candidates, and those decoded\n"
    "and ranked. With C x M at least the positions searched the answer is\n"
    "exact. The exact window (sinks and recent positions) is not searched.\n"
    "Keys archived before rotation are scored per chunk of positions (--chunk).\n"
    "\n"
    "  --layer L, --head H  the KV head (a GQA group's query heads share it)\n"
    "  --query LIST     key_dim comma-separated numbers\n"
    "  --query-file F   key_dim little-endian float32 values (numpy: q.astype(\n"
    "                   '<f4').tofile(F))\n"
    "  -m M             positions to print (16)\n"
    "  --first P        search archived positions >= P (0)\n"
    "  --end P          and < P (default: to the last archived position)\n"
    "  --candidates C   candidates per position printed (4; at most 1024)\n"
    "  --chunk P        keys archived before rotation: score the centroids per\n"
    "                   chunk of P positions (default 1024, longer for ranges\n"
    "                   beyond 4 million x 1024 / k positions; a P of at least the\n"
    "                   range: one chunk, cheapest, weakest at long range)\n"
    "  --codebooks FILE the archive's external codebook file (default: found by\n"
    "                   its hash next to the archive and in FKVF_CODEBOOK_PATH)\n"
    "  --json           one JSON object: the hits and the query's cost (on\n"
    "                   failure {\"error\":{...}}, docs/cli.md)\n"
    "\n"
    "Exit status: 0 ok (also when the range holds no archived position), 1\n"
    "invalid input (not an archive, no codebook, a codebook not found, layer or\n"
    "head outside the archive, a query of the wrong length), 2 usage or I/O\n"
    "error (bad option, ARCHIVE or FILE does not exist).\n";

typedef struct keys_opts {
    const char *path, *query, *qfile, *codebooks;
    uint64_t layer, head, m, first, end, cand, chunk;
    int has_layer, has_head, json;
} keys_opts;

static int keys_parse(int argc, char **argv, keys_opts *o)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(keys_help, stdout);
            return CLI_OK;
        }
    memset(o, 0, sizeof *o);
    o->m = 16;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json"))
            o->json = 1;
        else if (!strcmp(a, "--query") && v)
            o->query = argv[++i];
        else if (!strcmp(a, "--query-file") && v)
            o->qfile = argv[++i];
        else if (!strcmp(a, "--codebooks") && v)
            o->codebooks = argv[++i];
        else if (!strcmp(a, "--layer") && v && !cli_parse_u64(v, 65535, &o->layer))
            o->has_layer = 1, i++;
        else if (!strcmp(a, "--head") && v && !cli_parse_u64(v, 65535, &o->head))
            o->has_head = 1, i++;
        else if (!strcmp(a, "-m") && v && !cli_parse_u64(v, 1000000, &o->m) && o->m >= 1)
            i++;
        else if (!strcmp(a, "--first") && v && !cli_parse_u64(v, UINT64_MAX, &o->first))
            i++;
        else if (!strcmp(a, "--end") && v && !cli_parse_u64(v, UINT64_MAX, &o->end) && o->end)
            i++;
        else if (!strcmp(a, "--chunk") && v && !cli_parse_u64(v, UINT64_MAX, &o->chunk))
            i++;
        else if (!strcmp(a, "--candidates") && v &&
                 !cli_parse_u64(v, FKVF_KEY_CANDIDATES_MAX, &o->cand) && o->cand >= 1)
            i++;
        else if (a[0] != '-' && !o->path)
            o->path = a;
        else
            return cli_usage("bad argument '%s' (see fkvf keys --help)", a);
    }
    if (!o->path || !o->has_layer || !o->has_head || !o->query == !o->qfile)
        return cli_usage("give ARCHIVE, --layer, --head and either --query LIST or --query-file "
                         "FILE (see fkvf keys --help)");
    return -1;
}

/* The query into a malloc'd array of *n floats: CLI_OK, or an exit status
 * after an error line. */
static int load_query(const keys_opts *o, float **q, size_t *n)
{
    *q = NULL;
    *n = 0;
    if (o->query) {
        size_t cap = 1;
        for (const char *c = o->query; *c; c++)
            cap += *c == ',';
        float *v = malloc(cap * sizeof *v);
        if (!v)
            return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
        const char *s = o->query;
        for (size_t i = 0; i < cap; i++) {
            const char *e = strchr(s, ',');
            char item[64];
            size_t len = e ? (size_t)(e - s) : strlen(s);
            double d;
            if (len == 0 || len >= sizeof item) {
                free(v);
                return cli_usage("bad query '%s' (comma-separated numbers)", o->query);
            }
            memcpy(item, s, len);
            item[len] = 0;
            if (cli_parse_f64(item, &d) || !isfinite(d) || fabs(d) > 3.4e38) {
                free(v);
                return cli_usage("bad query item %zu '%s' (a finite number)", i + 1, item);
            }
            v[i] = (float)d;
            s = e ? e + 1 : s + len;
        }
        *q = v;
        *n = cap;
        return CLI_OK;
    }
    FILE *f = fopen(o->qfile, "rb");
    if (!f)
        return cli_fail(CLI_USAGE, FKVF_E_IO, o->qfile, "%s", strerror(errno));
    unsigned char buf[4 * 4096 + 1];
    size_t got = fread(buf, 1, sizeof buf, f);
    int err = ferror(f);
    fclose(f);
    if (err)
        return cli_fail(CLI_USAGE, FKVF_E_IO, o->qfile, "read error");
    if (got % 4 || got == 0 || got > 4 * 4096)
        return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o->qfile,
                        "%zu bytes: not a vector of float32 values (at most 4096)", got);
    float *v = malloc(got);
    if (!v)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
    fkvf_convert(FKVF_DTYPE_F32, v, FKVF_DTYPE_F32, buf, got / 4); /* little-endian bytes */
    for (size_t i = 0; i < got / 4; i++) {
        if (!isfinite(v[i])) {
            free(v);
            return cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o->qfile,
                            "value %zu is not a finite number", i + 1);
        }
    }
    *q = v;
    *n = got / 4;
    return CLI_OK;
}

int fkvf_cli_keys(int argc, char **argv)
{
    keys_opts o;
    int ret = keys_parse(argc, argv, &o);
    if (ret >= 0)
        return ret;
    float *q = NULL;
    size_t qn;
    if ((ret = load_query(&o, &q, &qn)) != CLI_OK)
        return ret;
    fkvf_reader *r = NULL, *cb = NULL;
    fkvf_key_search *ks = NULL;
    fkvf_key_hit *hits = NULL;
    if ((ret = cli_open_archive(&r, o.path)) != CLI_OK)
        goto done;
    fkvf_desc d;
    if (fkvf_reader_desc(r, &d) != FKVF_OK) {
        ret = cli_fail_reader(FKVF_E_STATE, r, o.path, "");
        goto done;
    }
    if (o.layer >= d.n_layers || o.head >= d.n_kv_heads) {
        ret = cli_fail(CLI_INVALID, FKVF_E_RANGE, o.path,
                       "layer %" PRIu64 ", head %" PRIu64 ": the archive has %u layers of %u KV "
                       "heads",
                       o.layer, o.head, d.n_layers, d.n_kv_heads);
        goto done;
    }
    if (qn != d.key_dim) {
        ret = cli_fail(CLI_INVALID, FKVF_E_INVALID_ARG, o.qfile ? o.qfile : o.path,
                       "the query has %zu values; the archive's keys have %u", qn, d.key_dim);
        goto done;
    }
    if ((ret = cli_attach_codebook(r, o.path, o.codebooks, &cb, NULL, 0)) != CLI_OK)
        goto done;
    int rc = fkvf_search_keys_open(&ks, r, NULL);
    if (rc) {
        fkvf_error_info e;
        int have = ks && fkvf_search_keys_error(ks, &e) == FKVF_OK && e.code != FKVF_OK;
        ret = cli_fail_lib(rc, have ? &e : NULL, o.path, "");
        goto done;
    }
    hits = malloc((size_t)o.m * sizeof *hits);
    if (!hits) {
        ret = cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
        goto done;
    }
    fkvf_key_query kq = {(uint32_t)o.layer, (uint32_t)o.head, q, qn, o.first, o.end,
                         (size_t)o.m, (uint32_t)o.cand, o.chunk};
    size_t n = 0;
    fkvf_key_stats st;
    if ((rc = fkvf_search_keys(ks, &kq, hits, &n, &st))) {
        fkvf_error_info e;
        int have = fkvf_search_keys_error(ks, &e) == FKVF_OK && e.code != FKVF_OK;
        ret = cli_fail_lib(rc, have ? &e : NULL, o.path, "");
        goto done;
    }
    if (o.json) {
        printf("{\"layer\":%" PRIu64 ",\"head\":%" PRIu64 ",\"m\":%" PRIu64
               ",\"centroids_scored\":%" PRIu64 ",\"symbols_searched\":%" PRIu64
               ",\"candidates\":%" PRIu64 ",\"hits\":[",
               o.layer, o.head, o.m, st.centroids_scored, st.symbols_searched, st.candidates);
        for (size_t i = 0; i < n; i++)
            printf("%s{\"position\":%" PRIu64 ",\"score\":%.9g}", i ? "," : "", hits[i].position,
                   hits[i].score);
        printf("]}\n");
    } else {
        printf("layer %" PRIu64 ", KV head %" PRIu64 ": %zu position%s (%" PRIu64
               " centroids scored, %" PRIu64 " symbols searched, %" PRIu64 " keys decoded)\n",
               o.layer, o.head, n, n == 1 ? "" : "s", st.centroids_scored, st.symbols_searched,
               st.candidates);
        for (size_t i = 0; i < n; i++)
            printf("%8" PRIu64 "  %.6g\n", hits[i].position, hits[i].score);
    }
    ret = CLI_OK;
done:
    fkvf_search_keys_free(ks);
    fkvf_reader_free(r);
    fkvf_reader_free(cb);
    free(hits);
    free(q);
    return ret;
}
