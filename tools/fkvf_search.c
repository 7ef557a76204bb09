/* fkvf search | context | index | plot: retrieval on an archive's streams
 * (spec 12.1.5, 12.2.7, 20); plot itself is in fkvf_plot.c. Uses the public
 * API only (fkvf.h). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "fkvf.h"

int fkvf_cli_search_main(const char *cmd, int argc, char **argv);
int fkvf_cli_plot_main(int argc, char **argv); /* fkvf_plot.c */
int fkvf_cli_query_in_alphabet(fkvf_reader *r, const char *path, size_t idx,
                               const char *name, int is_tok, const uint32_t *q, size_t qn);

static const char *search_help =
    "usage: fkvf search ARCHIVE (--tokens LIST | --stream NAME --symbols LIST) [options]\n"
    "\n"
    "Finds where the query's symbols occurred in a stream, without decoding the\n"
    "archive: LIST is comma-separated symbols, oldest first (the last one is the\n"
    "most recent). NAME is 'tokens' or Lx.Hy.K|V.stage (e.g. L3.H2.K.0).\n"
    "Prints every occurrence of the whole query (exact), the k occurrences of\n"
    "the longest suffixes of the query (longest), and with --radius the\n"
    "paper's plane query: points within D of the query's point, verified by\n"
    "decoding (candidates, verified, false positives).\n"
    "\n"
    "An occurrence is printed as the stream positions it covers, [first, end):\n"
    "its first symbol is at position first, its last at end - 1 (text and\n"
    "--json). For index streams the cache position is n_sinks + t (shown as\n"
    "'cache'). For --tokens, 'prefix' is how many of the query's first tokens\n"
    "the archive holds at the same positions: the cached rows an engine can\n"
    "reuse for that prompt.\n"
    "\n"
    "A symbol outside an index stream's alphabet (0..k-1, k the codebook size\n"
    "when the archive embeds its codebook, else the stream's alphabet) is\n"
    "refused: exit 2, as for any bad value on the command line. A token id\n"
    "above the token stream's width cannot occur in it: a note says so and the\n"
    "search runs (the prefix answer still holds).\n"
    "\n"
    "  --k N          longest matches to show (5)\n"
    "  --radius D     plane radius; 'auto' = the bound that holds every match\n"
    "  --context N    show the N symbols up to the end of each longest match (0)\n"
    "  --max N        exact occurrences to print (20; the count is always exact)\n"
    "  --no-index     ignore ZIDX sections (scan)\n"
    "  --json         one JSON object (on failure {\"error\":{...}}, docs/cli.md)\n"
    "\n"
    "Exit status: 0 ok (also when nothing matches), 1 invalid input (not an\n"
    "archive, no such stream, e.g. --tokens on an archive without a token\n"
    "stream), 2 usage or I/O error (bad option or list, ARCHIVE does not exist).\n";

static const char *context_help =
    "usage: fkvf context ARCHIVE --at T --len N [--stream NAME] [--json]\n"
    "\n"
    "Decodes the N symbols of a stream up to and including position T (fewer at\n"
    "the start of the stream), touching only the blocks that hold them.\n"
    "NAME is 'tokens' (default) or Lx.Hy.K|V.stage. --json: one JSON object\n"
    "(on failure {\"error\":{...}}, docs/cli.md).\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (not an archive, no such stream, T\n"
    "outside the stream), 2 usage or I/O error (ARCHIVE does not exist).\n";

static const char *index_help =
    "usage: fkvf index ARCHIVE [--stream NAME]... [--no-sync] [--json]\n"
    "\n"
    "Appends one commit holding a ZIDX search index (spec 20) for every stream\n"
    "(or the streams named), each covering the stream's positions rounded down\n"
    "to its alignment unit. The archive is append-only: earlier commits are not\n"
    "touched, and readers that do not know ZIDX ignore it. Later appends are\n"
    "scanned until the next 'fkvf index'.\n"
    "\n"
    "Running it again changes nothing: a stream whose index in effect (spec\n"
    "20.4) already covers what a new one would is skipped, and when every\n"
    "stream is skipped no commit is written (the file stays byte-identical,\n"
    "exit 0). Streams that grew past their next alignment unit, or whose index\n"
    "a compaction made stale, are indexed again; streams shorter than one\n"
    "alignment unit have nothing to index.\n"
    "\n"
    "Size: 24 bytes per indexed position and quad stream (32 for ngon), plus 64\n"
    "per stream and the commit's directory: 24 times an 8-bit quad stream's 1\n"
    "byte per symbol. Indexing all 121 streams of testdata/sample.fkvf (64\n"
    "indexed positions) adds 201472 bytes to its 523840 (3148 bytes per indexed\n"
    "position); '--stream tokens' alone adds 1792 (28 per position). Index the\n"
    "streams you search.\n"
    "\n"
    "  --stream NAME  index this stream (tokens or Lx.Hy.K|V.stage; repeatable;\n"
    "                 default: every stream)\n"
    "  --no-sync      do not fsync the new commit\n"
    "  --json         one JSON object: streams indexed, entries, bytes, streams\n"
    "                 already current, streams too short, changed (on failure\n"
    "                 {\"error\":{...}}, docs/cli.md)\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (not an archive, a codebook file, no\n"
    "such stream, a torn tail), 2 usage or I/O error (ARCHIVE does not exist or\n"
    "cannot be written, an appender has it open).\n";

/* ---- helpers ------------------------------------------------------------ */

static int want_help(int argc, char **argv, const char *help)
{
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return 1;
        }
    return 0;
}


/* The stream id of the archive at path: 1 found, else 0 after an error
 * line (exit 1: the archive has no such stream). */
static int find_stream(fkvf_reader *r, const char *path, uint64_t id, size_t *idx)
{
    if (fkvf_reader_stream_find(r, id, idx) == FKVF_OK)
        return 1;
    char nm[64];
    cli_stream_name(id, nm, sizeof nm);
    cli_fail(CLI_INVALID, FKVF_E_NOT_FOUND, path, "no stream %s in the archive%s", nm,
             id == FKVF_STREAM_ID_TOKENS ? " (it was packed without token ids)" : "");
    return 0;
}


static uint64_t sinks_of(fkvf_reader *r, uint64_t id)
{
    fkvf_desc d;
    if ((id >> 56) != FKVF_STREAM_KIND_INDEX || fkvf_reader_desc(r, &d) != FKVF_OK)
        return 0;
    return d.n_sinks;
}

static void print_syms(const uint32_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        printf("%s%" PRIu32, i ? "," : "", v[i]);
}

static const char *plural(uint64_t n) { return n == 1 ? "" : "s"; }

/* The query against the stream's alphabet: a symbol an index stream cannot
 * hold (>= its alphabet, or >= the embedded codebook's k) is refused with
 * 0 (a bad value given on the command line: exit 2); a token id above the
 * token stream's width gets a note (it cannot occur, but the prompt it is
 * part of still has a reusable prefix). */
int fkvf_cli_query_in_alphabet(fkvf_reader *r, const char *path, size_t idx,
                               const char *name, int is_tok, const uint32_t *q, size_t qn)
{
    fkvf_stream_info si;
    if (fkvf_reader_stream_info(r, idx, &si) != FKVF_OK)
        return 1; /* the search reports it */
    uint64_t bound = si.alphabet ? si.alphabet : (uint64_t)UINT32_MAX + 1;
    fkvf_codebook_shape cs;
    int by_k = 0;
    if (!is_tok && fkvf_reader_codebook(r, &cs, NULL, NULL, NULL) == FKVF_OK && cs.k < bound) {
        bound = cs.k;
        by_k = 1;
    }
    for (size_t i = 0; i < qn; i++) {
        if (q[i] < bound)
            continue;
        if (is_tok) {
            cli_note("%s: token %" PRIu32 " (item %zu of the query) is above the token stream's "
                     "width (0..%" PRIu64 "): it occurs nowhere, so no match includes it",
                     path, q[i], i + 1, bound - 1);
            return 1;
        }
        cli_usage("%s: symbol %" PRIu32 " (item %zu of the query) is outside stream %s's "
                  "alphabet 0..%" PRIu64 "%s",
                  path, q[i], i + 1, name, bound - 1, by_k ? ", the codebook's k" : "");
        return 0;
    }
    return 1;
}

/* ---- search ------------------------------------------------------------- */

static int cmd_search(int argc, char **argv)
{
    if (want_help(argc, argv, search_help))
        return CLI_OK;
    const char *path = NULL, *tokens = NULL, *stream = NULL, *symbols = NULL, *radius = NULL;
    uint64_t k = 5, ctx = 0, maxp = 20;
    int json = 0, noidx = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json"))
            json = 1;
        else if (!strcmp(a, "--no-index"))
            noidx = 1;
        else if (!strcmp(a, "--tokens") && v)
            tokens = argv[++i];
        else if (!strcmp(a, "--stream") && v)
            stream = argv[++i];
        else if (!strcmp(a, "--symbols") && v)
            symbols = argv[++i];
        else if (!strcmp(a, "--radius") && v)
            radius = argv[++i];
        else if (!strcmp(a, "--k") && v && !cli_parse_u64(v, 100000, &k) && k >= 1)
            i++;
        else if (!strcmp(a, "--context") && v && !cli_parse_u64(v, 100000, &ctx))
            i++;
        else if (!strcmp(a, "--max") && v && !cli_parse_u64(v, 100000000, &maxp))
            i++;
        else if (a[0] != '-' && !path)
            path = a;
        else
            return cli_usage("bad argument '%s' (see fkvf search --help)", a);
    }
    if (!path || (!tokens == !symbols) || (tokens && stream) || (symbols && !stream))
        return cli_usage("give ARCHIVE and either --tokens LIST or --stream NAME --symbols LIST "
                         "(see fkvf search --help)");
    uint64_t id = FKVF_STREAM_ID_TOKENS;
    if (stream && !cli_parse_stream_name(stream, &id))
        return cli_usage("bad stream name '%s' (tokens or Lx.Hy.K|V.stage)", stream);
    uint32_t *q;
    size_t qn;
    if (!cli_parse_list(tokens ? tokens : symbols, &q, &qn))
        return cli_usage("bad symbol list '%s' (comma-separated integers)",
                         tokens ? tokens : symbols);
    double rad = 0.0;
    int do_rad = radius != NULL;
    if (radius && strcmp(radius, "auto")) {
        if (cli_parse_f64(radius, &rad) || !(rad > 0.0)) {
            free(q);
            return cli_usage("bad radius '%s' (a positive number or 'auto')", radius);
        }
    }
    fkvf_reader *r = NULL;
    int ret = cli_open_archive(&r, path);
    if (ret != CLI_OK) {
        free(q);
        return ret;
    }
    ret = CLI_INVALID;
    size_t idx;
    fkvf_search *s = NULL;
    uint64_t *pos = NULL;
    fkvf_match *m = NULL;
    uint32_t *cbuf = NULL;
    if (!find_stream(r, path, id, &idx))
        goto out;
    char nm_s[64];
    cli_stream_name(id, nm_s, sizeof nm_s);
    int is_tok = id == FKVF_STREAM_ID_TOKENS;
    const char *unit = is_tok ? "token" : "symbol";
    if (!fkvf_cli_query_in_alphabet(r, path, idx, nm_s, is_tok, q, qn)) {
        ret = CLI_USAGE;
        goto out;
    }
    int rc = fkvf_search_open(&s, r, idx, noidx ? FKVF_SEARCH_NO_INDEX : 0, NULL);
    if (rc) {
        ret = cli_fail_search(rc, s, path, "");
        goto out;
    }
    fkvf_search_status inf;
    fkvf_search_info(s, &inf);
    pos = malloc((size_t)(maxp ? maxp : 1) * sizeof *pos);
    m = malloc((size_t)k * sizeof *m);
    cbuf = malloc((size_t)(ctx ? ctx : 1) * sizeof *cbuf);
    if (!pos || !m || !cbuf) {
        ret = cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
        goto out;
    }
    uint64_t nf;
    size_t nm;
    fkvf_search_status ia;
    fkvf_radius_result rr;
    memset(&rr, 0, sizeof rr);
    if ((rc = fkvf_search_suffix(s, q, qn, pos, (size_t)maxp, &nf)) ||
        (fkvf_search_info(s, &ia), rc = fkvf_search_longest(s, q, qn, (size_t)k, m, &nm))) {
        ret = cli_fail_search(rc, s, path, "");
        goto out;
    }
    if (do_rad) {
        if ((rc = fkvf_search_radius(s, q, qn, rad, NULL, 0, &rr))) {
            ret = cli_fail_search(rc, s, path, "");
            goto out;
        }
    }
    /* token queries: how much of the query the archive holds at the same
     * positions (prefix reuse for engines) */
    fkvf_prefix_reuse pr;
    int has_pr = id == FKVF_STREAM_ID_TOKENS && fkvf_search_prefix_reuse(r, q, qn, &pr) == FKVF_OK;
    uint64_t S = sinks_of(r, id);
    size_t shown = nf < maxp ? (size_t)nf : (size_t)maxp;
    if (json) {
        printf("{\"stream\":\"%s\",\"length\":%" PRIu64 ",\"n_indexed\":%" PRIu64
               ",\"cache_offset\":%" PRIu64 ",\"query\":[",
               nm_s, inf.length, inf.n_indexed, S);
        print_syms(q, qn);
        printf("],\"exact\":{\"count\":%" PRIu64 ",\"candidates\":%" PRIu64 ",\"matches\":[", nf,
               ia.candidates);
        for (size_t i = 0; i < shown; i++)
            printf("%s{\"first\":%" PRIu64 ",\"end\":%" PRIu64 "}", i ? "," : "",
                   pos[i] + 1 - qn, pos[i] + 1);
        printf("]},\"longest\":[");
        for (size_t i = 0; i < nm; i++) {
            printf("%s{\"first\":%" PRIu64 ",\"end\":%" PRIu64 ",\"length\":%" PRIu64,
                   i ? "," : "", m[i].position + 1 - m[i].length, m[i].position + 1, m[i].length);
            if (ctx) {
                size_t got = 0;
                fkvf_search_context(r, idx, m[i].position, (size_t)ctx, cbuf, &got);
                printf(",\"context\":[");
                print_syms(cbuf, got);
                printf("]");
            }
            printf("}");
        }
        printf("]");
        if (has_pr)
            printf(",\"prefix_len\":%" PRIu64, pr.prefix_len);
        if (do_rad)
            printf(",\"radius\":{\"radius\":%.17g,\"candidates\":%" PRIu64 ",\"verified\":%" PRIu64
                   ",\"false_positives\":%" PRIu64 "}",
                   rr.radius, rr.candidates, rr.verified, rr.candidates - rr.verified);
        printf("}\n");
    } else {
        printf("stream      %s: %" PRIu64 " position%s", nm_s, inf.length, plural(inf.length));
        if (S && inf.length)
            printf(" (cache positions %" PRIu64 "..%" PRIu64 ")", S, S + inf.length - 1);
        if (inf.n_indexed)
            printf(", %" PRIu64 " indexed\n", inf.n_indexed);
        else
            printf(", no index (scan)\n");
        printf("query       %zu %s%s: ", qn, unit, plural(qn));
        print_syms(q, qn < 32 ? qn : 32);
        printf("%s\n", qn > 32 ? ",..." : "");
        printf("exact       %" PRIu64 " occurrence%s", nf, plural(nf));
        if (shown) {
            printf(", positions [first, end):");
            for (size_t i = 0; i < shown; i++)
                printf(" [%" PRIu64 ", %" PRIu64 ")", pos[i] + 1 - qn, pos[i] + 1);
            if (nf > shown)
                printf(" ... (--max)");
        }
        printf("\n");
        printf("longest     %zu match%s (k = %" PRIu64 ")%s\n", nm, nm == 1 ? "" : "es", k,
               nm > 1 ? ", longest first" : "");
        for (size_t i = 0; i < nm; i++) {
            uint64_t first = m[i].position + 1 - m[i].length, end = m[i].position + 1;
            char rng[64];
            snprintf(rng, sizeof rng, "[%" PRIu64 ", %" PRIu64 ")", first, end);
            printf("  %-22s %" PRIu64 " %s%s", rng, m[i].length, unit, plural(m[i].length));
            if (m[i].length == qn)
                printf(" (the whole query)");
            else
                printf(" (the query's last %" PRIu64 ")", m[i].length);
            if (S)
                printf(", cache [%" PRIu64 ", %" PRIu64 ")", S + first, S + end);
            if (ctx) {
                size_t got = 0;
                fkvf_search_context(r, idx, m[i].position, (size_t)ctx, cbuf, &got);
                printf(", the %zu %s%s up to it: ", got, unit, plural(got));
                print_syms(cbuf, got);
            }
            printf("\n");
        }
        if (has_pr) {
            uint64_t p = pr.prefix_len;
            printf("prefix      ");
            if (pr.archive_positions == 0)
                printf("the archive holds no tokens: no cache rows to reuse\n");
            else if (p == 0)
                printf("none: the query's first token is not the archive's first token (no "
                       "cache rows to reuse)\n");
            else if (p == qn)
                printf("the whole query (%" PRIu64 " token%s) matches the archive's positions "
                       "[0, %" PRIu64 "): %" PRIu64 " reusable cache row%s\n",
                       p, plural(p), p, p, plural(p));
            else
                printf("the query's first %" PRIu64 " token%s %s the archive's positions [0, %" PRIu64
                       "): %" PRIu64 " reusable cache row%s\n",
                       p, plural(p), p == 1 ? "matches" : "match", p, p, plural(p));
        }
        if (do_rad)
            printf("radius      %.6g: %" PRIu64 " candidate%s, %" PRIu64 " verified, %" PRIu64
                   " false positive%s\n",
                   rr.radius, rr.candidates, plural(rr.candidates), rr.verified,
                   rr.candidates - rr.verified, plural(rr.candidates - rr.verified));
    }
    ret = CLI_OK;
out:
    fkvf_search_free(s);
    fkvf_reader_free(r);
    free(q);
    free(pos);
    free(m);
    free(cbuf);
    return ret;
}

/* ---- context ------------------------------------------------------------ */

static int cmd_context(int argc, char **argv)
{
    if (want_help(argc, argv, context_help))
        return CLI_OK;
    const char *path = NULL, *stream = "tokens";
    uint64_t at = 0, len = 0;
    int has_at = 0, has_len = 0, json = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json"))
            json = 1;
        else if (!strcmp(a, "--at") && v && !cli_parse_u64(v, UINT64_MAX, &at))
            has_at = 1, i++;
        else if (!strcmp(a, "--len") && v && !cli_parse_u64(v, 100000000, &len) && len >= 1)
            has_len = 1, i++;
        else if (!strcmp(a, "--stream") && v)
            stream = argv[++i];
        else if (a[0] != '-' && !path)
            path = a;
        else
            return cli_usage("bad argument '%s' (see fkvf context --help)", a);
    }
    uint64_t id;
    if (!path || !has_at || !has_len || !cli_parse_stream_name(stream, &id))
        return cli_usage("give ARCHIVE, --at T, --len N (and a valid --stream; see fkvf context "
                         "--help)");
    fkvf_reader *r = NULL;
    int ret = cli_open_archive(&r, path);
    if (ret != CLI_OK)
        return ret;
    size_t idx, got = 0;
    ret = CLI_INVALID;
    uint32_t *buf = malloc((size_t)len * sizeof *buf);
    if (!buf) {
        ret = cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
        goto out;
    }
    if (!find_stream(r, path, id, &idx))
        goto out;
    int rc = fkvf_search_context(r, idx, at, (size_t)len, buf, &got);
    if (rc == FKVF_E_RANGE) {
        fkvf_stream_info si;
        memset(&si, 0, sizeof si);
        fkvf_reader_stream_info(r, idx, &si);
        ret = cli_fail(CLI_INVALID, rc, path,
                       "--at %" PRIu64 ": outside the stream %s (positions 0..%" PRIu64 ")", at,
                       stream, si.length ? si.length - 1 : 0);
        goto out;
    }
    if (rc) {
        char pre[64];
        snprintf(pre, sizeof pre, "position %" PRIu64 ": ", at);
        ret = cli_fail_reader(rc, r, path, pre);
        goto out;
    }
    if (json) {
        printf("{\"stream\":\"%s\",\"at\":%" PRIu64 ",\"first\":%" PRIu64 ",\"symbols\":[",
               stream, at, at + 1 - got);
        print_syms(buf, got);
        printf("]}\n");
    } else {
        print_syms(buf, got);
        printf("\n");
    }
    ret = CLI_OK;
out:
    free(buf);
    fkvf_reader_free(r);
    return ret;
}

/* ---- index -------------------------------------------------------------- */

/* What fkvf index did to an archive. */
typedef struct index_report {
    size_t built;     /* streams given a new index */
    size_t current;   /* streams whose index in effect already covers what a new one would */
    size_t short_;    /* streams shorter than their alignment unit: nothing to index */
    uint64_t entries; /* positions in the new indexes, summed over the streams */
    uint64_t bytes;   /* bytes of the new ZIDX sections */
} index_report;

/* Is the index in effect for stream i (spec 20.4, as the search handle
 * finds it) already what fkvf_search_index_build would write: positions
 * [0, want)? Any failure to open the handle (a malformed index, no memory)
 * counts as "no": the stream is then indexed again, and a failure that
 * matters is reported by the build. */
static int index_is_current(fkvf_reader *r, size_t i, uint64_t want)
{
    fkvf_search *s = NULL;
    fkvf_search_status inf;
    int cur = fkvf_search_open(&s, r, i, 0, NULL) == FKVF_OK &&
              fkvf_search_info(s, &inf) == FKVF_OK && inf.n_indexed == want;
    fkvf_search_free(s);
    return cur;
}

/* Index the streams named (all when nid = 0) of the archive at path in one
 * new commit, skipping those whose index in effect is current (so that a
 * second run changes nothing) and those too short to index. Returns an exit
 * status; *rep reports. */
static int index_file(const char *path, const uint64_t *ids, size_t nid, int nosync,
                      index_report *rep)
{
    memset(rep, 0, sizeof *rep);
    fkvf_reader *r = NULL;
    int ret = cli_open_archive(&r, path);
    if (ret != CLI_OK)
        return ret;
    size_t ns = 0;
    fkvf_reader_stream_count(r, &ns);
    fkvf_section_add *secs = calloc(ns ? ns : 1, sizeof *secs);
    size_t n = 0;
    ret = CLI_USAGE;
    if (!secs) {
        ret = cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
        goto out;
    }
    for (size_t k = 0; k < nid; k++) { /* every stream named exists */
        size_t idx;
        if (!find_stream(r, path, ids[k], &idx)) {
            ret = CLI_INVALID;
            goto out;
        }
    }
    for (size_t i = 0; i < ns; i++) {
        fkvf_stream_info si;
        fkvf_reader_stream_info(r, i, &si);
        if (nid) {
            int want = 0;
            for (size_t k = 0; k < nid; k++)
                want |= ids[k] == si.id;
            if (!want)
                continue;
        }
        uint64_t u = si.align ? si.align : 1, cover = si.length / u * u;
        if (cover == 0) {
            rep->short_++;
            continue;
        }
        if (index_is_current(r, i, cover)) {
            rep->current++;
            continue;
        }
        void *d;
        size_t sz;
        uint64_t key;
        int rc = fkvf_search_index_build(r, i, &d, &sz, &key, NULL);
        if (rc) {
            char nm[64], pre[80];
            cli_stream_name(si.id, nm, sizeof nm);
            snprintf(pre, sizeof pre, "stream %s: ", nm);
            if (rc == FKVF_E_NOMEM)
                ret = cli_fail(CLI_USAGE, rc, path, "%sout of memory", pre);
            else
                ret = cli_fail_reader(rc, r, path, pre);
            goto out;
        }
        secs[n].type = FKVF_SECTION_ZIDX;
        secs[n].flags = 0;
        secs[n].key = key;
        secs[n].data = d;
        secs[n].size = sz;
        rep->bytes += sz;
        rep->entries += cover;
        n++;
    }
    fkvf_reader_free(r); /* before appending */
    r = NULL;
    if (n) {
        fkvf_error_report er;
        int rc = fkvf_archive_append_sections(path, secs, n, nosync ? FKVF_SYNC_NONE : FKVF_SYNC_COMMIT,
                                              &er);
        if (rc) {
            ret = cli_fail(cli_fkvf_exit(rc), rc, path, "%s", er.message);
            goto out;
        }
    }
    rep->built = n;
    ret = CLI_OK;
out:
    for (size_t i = 0; i < n; i++)
        fkvf_search_buffer_free((void *)secs[i].data, NULL);
    free(secs);
    fkvf_reader_free(r);
    return ret;
}

/* fkvf pack --index: index every stream of a freshly written archive. */
int fkvf_cli_index_file(const char *path, int nosync);
int fkvf_cli_index_file(const char *path, int nosync)
{
    index_report rep;
    return index_file(path, NULL, 0, nosync, &rep);
}

static int cmd_index(int argc, char **argv)
{
    if (want_help(argc, argv, index_help))
        return CLI_OK;
    const char *path = NULL;
    uint64_t ids[256];
    size_t nid = 0;
    int nosync = 0, json = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--no-sync"))
            nosync = 1;
        else if (!strcmp(a, "--json"))
            json = 1;
        else if (!strcmp(a, "--stream") && i + 1 < argc && nid < 256 &&
                 cli_parse_stream_name(argv[i + 1], &ids[nid])) {
            size_t k = 0;
            while (k < nid && ids[k] != ids[nid])
                k++;
            nid += k == nid; /* a stream named twice is indexed once */
            i++;
        }
        else if (a[0] != '-' && !path)
            path = a;
        else
            return cli_usage("bad argument '%s' (see fkvf index --help)", a);
    }
    if (!path)
        return cli_usage("give ARCHIVE (see fkvf index --help)");
    index_report rep;
    int ret = index_file(path, ids, nid, nosync, &rep);
    if (ret != CLI_OK)
        return ret;
    if (json) {
        printf("{\"archive\":");
        cli_json_cstr(stdout, path);
        printf(",\"streams\":%zu,\"entries\":%" PRIu64 ",\"bytes\":%" PRIu64
               ",\"current\":%zu,\"too_short\":%zu,\"changed\":%s}\n",
               rep.built, rep.entries, rep.bytes, rep.current, rep.short_,
               rep.built ? "true" : "false");
        return CLI_OK;
    }
    cli_text_cstr(stdout, path); /* a name for the terminal: escaped */
    if (rep.built)
        printf(": indexed %zu stream%s (%" PRIu64 " positions in all), %" PRIu64
               " index bytes in one new commit",
               rep.built, rep.built == 1 ? "" : "s", rep.entries, rep.bytes);
    else
        printf(": nothing to do, the file is unchanged");
    if (rep.current)
        printf("; %zu stream%s already %s a current index", rep.current,
               rep.current == 1 ? "" : "s", rep.current == 1 ? "has" : "have");
    if (rep.short_)
        printf("; %zu stream%s shorter than %s alignment unit (nothing to index)", rep.short_,
               rep.short_ == 1 ? " is" : "s are", rep.short_ == 1 ? "its" : "their");
    printf("\n");
    return CLI_OK;
}

/* Returns the exit status, or -1 when cmd is not one of these commands. */
int fkvf_cli_search_main(const char *cmd, int argc, char **argv)
{
    if (!strcmp(cmd, "search"))
        return cmd_search(argc, argv);
    if (!strcmp(cmd, "context"))
        return cmd_context(argc, argv);
    if (!strcmp(cmd, "index"))
        return cmd_index(argc, argv);
    if (!strcmp(cmd, "plot"))
        return fkvf_cli_plot_main(argc, argv); /* fkvf_plot.c */
    return -1;
}
