/* fkvf search | context | index | plot: retrieval on an archive's streams
 * (spec 12.1.5, 12.2.7, 20); plot itself is in fkvf_plot.c. Uses the public
 * API only (fkvf.h). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_remote.h"
#include "cli_util.h"
#include "commands.h"
#include "fkvf.h"

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
    "  --no-index     ignore search index sections (ZPOS, ZIDX): scan\n"
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
    "Appends one commit holding a ZPOS search index (spec 20.7) for every stream\n"
    "(or the streams named), each covering the stream's positions rounded down\n"
    "to its alignment unit. The archive is append-only: earlier commits are not\n"
    "touched, and readers that do not know ZPOS ignore it. Later appends are\n"
    "scanned until the next 'fkvf index'. 'fkvf pack' already indexes the token\n"
    "stream (unless --no-index).\n"
    "\n"
    "Running it again changes nothing: a stream whose index in effect (spec\n"
    "20.4; a ZPOS, or the ZIDX of an older file) already covers what a new one\n"
    "would is skipped, and when every stream is skipped no commit is written\n"
    "(the file stays byte-identical, exit 0). Streams that grew past their next\n"
    "alignment unit, or whose index a compaction made stale, are indexed again;\n"
    "streams shorter than one alignment unit have nothing to index.\n"
    "\n"
    "Size: 4 bytes per indexed position and stream (the sorted positions; the\n"
    "keys are computed from the stream), plus 64 per stream and the commit's\n"
    "directory (64 per stream). Indexing all 121 streams of testdata/sample.fkvf\n"
    "(64 indexed positions) adds 46592 bytes to its 523840 (6.0 bytes per\n"
    "indexed stream position); '--stream tokens' alone adds 512 (8 per\n"
    "position). A search handle on a ZPOS-indexed stream holds the stream's\n"
    "points, as a scan does.\n"
    "\n"
    "  --stream NAME  index this stream (tokens or Lx.Hy.K|V.stage; repeatable;\n"
    "                 default: every stream)\n"
    "  --no-sync      do not fsync the new commit\n"
    "  --threads N    streams indexed at once (default: every CPU this process\n"
    "                 may use, or FKVF_THREADS); the file is the same for any N\n"
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

typedef struct search_opts {
    const char *path, *tokens, *stream, *symbols, *radius;
    uint64_t k, ctx, maxp;
    int json, noidx;
    uint64_t id;   /* the stream searched */
    uint32_t *q;   /* the query (malloc'd) */
    size_t qn;
    double rad;    /* --radius (0: auto) */
    int do_rad;
} search_opts;

/* The arguments into o (defaults first). Returns -1 to go on, else the
 * exit status of a usage error. */
static int search_args(int argc, char **argv, search_opts *o)
{
    memset(o, 0, sizeof *o);
    o->k = 5;
    o->maxp = 20;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json"))
            o->json = 1;
        else if (!strcmp(a, "--no-index"))
            o->noidx = 1;
        else if (!strcmp(a, "--tokens") && v)
            o->tokens = argv[++i];
        else if (!strcmp(a, "--stream") && v)
            o->stream = argv[++i];
        else if (!strcmp(a, "--symbols") && v)
            o->symbols = argv[++i];
        else if (!strcmp(a, "--radius") && v)
            o->radius = argv[++i];
        else if (!strcmp(a, "--k") && v && !cli_parse_u64(v, 100000, &o->k) && o->k >= 1)
            i++;
        else if (!strcmp(a, "--context") && v && !cli_parse_u64(v, 100000, &o->ctx))
            i++;
        else if (!strcmp(a, "--max") && v && !cli_parse_u64(v, 100000000, &o->maxp))
            i++;
        else if (a[0] != '-' && !o->path)
            o->path = a;
        else
            return cli_usage("bad argument '%s' (see fkvf search --help)", a);
    }
    return -1;
}

/* Returns -1 to go on (o->q to free), else the exit status (help printed,
 * usage error). */
static int search_parse(int argc, char **argv, search_opts *o)
{
    if (want_help(argc, argv, search_help))
        return CLI_OK;
    int ex = search_args(argc, argv, o);
    if (ex >= 0)
        return ex;
    if (!o->path || (!o->tokens == !o->symbols) || (o->tokens && o->stream) ||
        (o->symbols && !o->stream))
        return cli_usage("give ARCHIVE and either --tokens LIST or --stream NAME --symbols LIST "
                         "(see fkvf search --help)");
    o->id = FKVF_STREAM_ID_TOKENS;
    if (o->stream && !cli_parse_stream_name(o->stream, &o->id))
        return cli_usage("bad stream name '%s' (tokens or Lx.Hy.K|V.stage)", o->stream);
    const char *list = o->tokens ? o->tokens : o->symbols;
    if (!cli_parse_list(list, &o->q, &o->qn))
        return cli_usage("bad symbol list '%s' (comma-separated integers)", list);
    o->do_rad = o->radius != NULL;
    if (o->radius && strcmp(o->radius, "auto")) {
        if (cli_parse_f64(o->radius, &o->rad) || !(o->rad > 0.0)) {
            free(o->q);
            o->q = NULL;
            return cli_usage("bad radius '%s' (a positive number or 'auto')", o->radius);
        }
    }
    return -1;
}

/* The search and its results. */
typedef struct search_state {
    fkvf_reader *r;
    fkvf_search *s;
    uint64_t *pos;   /* the exact occurrences' last positions */
    fkvf_match *m;   /* the longest matches */
    uint32_t *cbuf;  /* a match's context */
    size_t idx;      /* the stream's index */
    char nm_s[64];   /* its name */
    int is_tok;
    const char *unit; /* "token" or "symbol" */
    fkvf_search_status inf, ia; /* before and after the exact search */
    uint64_t nf;     /* exact occurrences */
    size_t nm, shown; /* longest matches; exact occurrences printed */
    fkvf_radius_result rr;
    fkvf_prefix_reuse pr;
    int has_pr;
    uint64_t S;      /* the stream's first cache position */
} search_state;

static void search_free(search_state *st)
{
    fkvf_search_free(st->s);
    fkvf_reader_free(st->r);
    free(st->pos);
    free(st->m);
    free(st->cbuf);
}

/* The exact, longest and radius searches. Returns the exit status. */
static int search_queries(const search_opts *o, search_state *st)
{
    const char *path = o->path;
    st->pos = malloc((size_t)(o->maxp ? o->maxp : 1) * sizeof *st->pos);
    st->m = malloc((size_t)o->k * sizeof *st->m);
    st->cbuf = malloc((size_t)(o->ctx ? o->ctx : 1) * sizeof *st->cbuf);
    if (!st->pos || !st->m || !st->cbuf)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
    int rc;
    if ((rc = fkvf_search_suffix(st->s, o->q, o->qn, st->pos, (size_t)o->maxp, &st->nf)) ||
        (fkvf_search_info(st->s, &st->ia),
         rc = fkvf_search_longest(st->s, o->q, o->qn, (size_t)o->k, st->m, &st->nm)))
        return cli_fail_search(rc, st->s, path, "");
    if (o->do_rad && (rc = fkvf_search_radius(st->s, o->q, o->qn, o->rad, NULL, 0, &st->rr)))
        return cli_fail_search(rc, st->s, path, "");
    /* token queries: how much of the query the archive holds at the same
     * positions (prefix reuse for engines) */
    st->has_pr = o->id == FKVF_STREAM_ID_TOKENS &&
                 fkvf_search_prefix_reuse(st->r, o->q, o->qn, &st->pr) == FKVF_OK;
    st->S = sinks_of(st->r, o->id);
    st->shown = st->nf < o->maxp ? (size_t)st->nf : (size_t)o->maxp;
    return CLI_OK;
}

static int search_run(const search_opts *o, search_state *st)
{
    const char *path = o->path;
    int ret = cli_open_archive(&st->r, path);
    if (ret != CLI_OK)
        return ret;
    if (!find_stream(st->r, path, o->id, &st->idx))
        return CLI_INVALID;
    cli_stream_name(o->id, st->nm_s, sizeof st->nm_s);
    st->is_tok = o->id == FKVF_STREAM_ID_TOKENS;
    st->unit = st->is_tok ? "token" : "symbol";
    if (!fkvf_cli_query_in_alphabet(st->r, path, st->idx, st->nm_s, st->is_tok, o->q, o->qn))
        return CLI_USAGE;
    int rc = fkvf_search_open(&st->s, st->r, st->idx, o->noidx ? FKVF_SEARCH_NO_INDEX : 0, NULL);
    if (rc)
        return cli_fail_search(rc, st->s, path, "");
    fkvf_search_info(st->s, &st->inf);
    return search_queries(o, st);
}

static void search_json(const search_opts *o, const search_state *st)
{
    size_t qn = o->qn;
    printf("{\"stream\":\"%s\",\"length\":%" PRIu64 ",\"n_indexed\":%" PRIu64
           ",\"cache_offset\":%" PRIu64 ",\"query\":[",
           st->nm_s, st->inf.length, st->inf.n_indexed, st->S);
    print_syms(o->q, qn);
    printf("],\"exact\":{\"count\":%" PRIu64 ",\"candidates\":%" PRIu64 ",\"matches\":[", st->nf,
           st->ia.candidates);
    for (size_t i = 0; i < st->shown; i++)
        printf("%s{\"first\":%" PRIu64 ",\"end\":%" PRIu64 "}", i ? "," : "",
               st->pos[i] + 1 - qn, st->pos[i] + 1);
    printf("]},\"longest\":[");
    for (size_t i = 0; i < st->nm; i++) {
        const fkvf_match *m = &st->m[i];
        printf("%s{\"first\":%" PRIu64 ",\"end\":%" PRIu64 ",\"length\":%" PRIu64,
               i ? "," : "", m->position + 1 - m->length, m->position + 1, m->length);
        if (o->ctx) {
            size_t got = 0;
            fkvf_search_context(st->r, st->idx, m->position, (size_t)o->ctx, st->cbuf, &got);
            printf(",\"context\":[");
            print_syms(st->cbuf, got);
            printf("]");
        }
        printf("}");
    }
    printf("]");
    if (st->has_pr)
        printf(",\"prefix_len\":%" PRIu64, st->pr.prefix_len);
    if (o->do_rad)
        printf(",\"radius\":{\"radius\":%.17g,\"candidates\":%" PRIu64 ",\"verified\":%" PRIu64
               ",\"false_positives\":%" PRIu64 "}",
               st->rr.radius, st->rr.candidates, st->rr.verified,
               st->rr.candidates - st->rr.verified);
    printf("}\n");
}

/* Text: the stream, the query and the exact occurrences. */
static void search_text_exact(const search_opts *o, const search_state *st)
{
    size_t qn = o->qn;
    const fkvf_search_status *inf = &st->inf;
    printf("stream      %s: %" PRIu64 " position%s", st->nm_s, inf->length, plural(inf->length));
    if (st->S && inf->length)
        printf(" (cache positions %" PRIu64 "..%" PRIu64 ")", st->S, st->S + inf->length - 1);
    if (inf->n_indexed)
        printf(", %" PRIu64 " indexed\n", inf->n_indexed);
    else
        printf(", no index (scan)\n");
    printf("query       %zu %s%s: ", qn, st->unit, plural(qn));
    print_syms(o->q, qn < 32 ? qn : 32);
    printf("%s\n", qn > 32 ? ",..." : "");
    printf("exact       %" PRIu64 " occurrence%s", st->nf, plural(st->nf));
    if (st->shown) {
        printf(", positions [first, end):");
        for (size_t i = 0; i < st->shown; i++)
            printf(" [%" PRIu64 ", %" PRIu64 ")", st->pos[i] + 1 - qn, st->pos[i] + 1);
        if (st->nf > st->shown)
            printf(" ... (--max)");
    }
    printf("\n");
}

/* Text: the longest matches, with their context. */
static void search_text_longest(const search_opts *o, const search_state *st)
{
    const char *unit = st->unit;
    size_t nm = st->nm;
    printf("longest     %zu match%s (k = %" PRIu64 ")%s\n", nm, nm == 1 ? "" : "es", o->k,
           nm > 1 ? ", longest first" : "");
    for (size_t i = 0; i < nm; i++) {
        const fkvf_match *m = &st->m[i];
        uint64_t first = m->position + 1 - m->length, end = m->position + 1;
        char rng[64];
        snprintf(rng, sizeof rng, "[%" PRIu64 ", %" PRIu64 ")", first, end);
        printf("  %-22s %" PRIu64 " %s%s", rng, m->length, unit, plural(m->length));
        if (m->length == o->qn)
            printf(" (the whole query)");
        else
            printf(" (the query's last %" PRIu64 ")", m->length);
        if (st->S)
            printf(", cache [%" PRIu64 ", %" PRIu64 ")", st->S + first, st->S + end);
        if (o->ctx) {
            size_t got = 0;
            fkvf_search_context(st->r, st->idx, m->position, (size_t)o->ctx, st->cbuf, &got);
            printf(", the %zu %s%s up to it: ", got, unit, plural(got));
            print_syms(st->cbuf, got);
        }
        printf("\n");
    }
}

/* Text: the reusable prefix (token queries) and the radius query. */
static void search_text_prefix(const search_opts *o, const search_state *st)
{
    if (st->has_pr) {
        uint64_t p = st->pr.prefix_len;
        printf("prefix      ");
        if (st->pr.archive_positions == 0)
            printf("the archive holds no tokens: no cache rows to reuse\n");
        else if (p == 0)
            printf("none: the query's first token is not the archive's first token (no "
                   "cache rows to reuse)\n");
        else if (p == o->qn)
            printf("the whole query (%" PRIu64 " token%s) matches the archive's positions "
                   "[0, %" PRIu64 "): %" PRIu64 " reusable cache row%s\n",
                   p, plural(p), p, p, plural(p));
        else
            printf("the query's first %" PRIu64 " token%s %s the archive's positions [0, %" PRIu64
                   "): %" PRIu64 " reusable cache row%s\n",
                   p, plural(p), p == 1 ? "matches" : "match", p, p, plural(p));
    }
    const fkvf_radius_result *rr = &st->rr;
    if (o->do_rad)
        printf("radius      %.6g: %" PRIu64 " candidate%s, %" PRIu64 " verified, %" PRIu64
               " false positive%s\n",
               rr->radius, rr->candidates, plural(rr->candidates), rr->verified,
               rr->candidates - rr->verified, plural(rr->candidates - rr->verified));
}

int fkvf_cli_search(int argc, char **argv)
{
    search_opts o;
    memset(&o, 0, sizeof o);
    int ret = search_parse(argc, argv, &o);
    if (ret >= 0) {
        free(o.q);
        return ret;
    }
    search_state st;
    memset(&st, 0, sizeof st);
    ret = search_run(&o, &st);
    if (ret == CLI_OK && o.json) {
        search_json(&o, &st);
    } else if (ret == CLI_OK) {
        search_text_exact(&o, &st);
        search_text_longest(&o, &st);
        search_text_prefix(&o, &st);
    }
    search_free(&st);
    free(o.q);
    return ret;
}

/* ---- context ------------------------------------------------------------ */

typedef struct context_opts {
    const char *path, *stream;
    uint64_t at, len, id;
    int json;
} context_opts;

/* Returns -1 to go on, else the exit status (help printed, usage error). */
static int context_parse(int argc, char **argv, context_opts *o)
{
    if (want_help(argc, argv, context_help))
        return CLI_OK;
    memset(o, 0, sizeof *o);
    o->stream = "tokens";
    int has_at = 0, has_len = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json"))
            o->json = 1;
        else if (!strcmp(a, "--at") && v && !cli_parse_u64(v, UINT64_MAX, &o->at))
            has_at = 1, i++;
        else if (!strcmp(a, "--len") && v && !cli_parse_u64(v, 100000000, &o->len) && o->len >= 1)
            has_len = 1, i++;
        else if (!strcmp(a, "--stream") && v)
            o->stream = argv[++i];
        else if (a[0] != '-' && !o->path)
            o->path = a;
        else
            return cli_usage("bad argument '%s' (see fkvf context --help)", a);
    }
    if (!o->path || !has_at || !has_len || !cli_parse_stream_name(o->stream, &o->id))
        return cli_usage("give ARCHIVE, --at T, --len N (and a valid --stream; see fkvf context "
                         "--help)");
    return -1;
}

/* The symbols up to o->at into buf (*got of them). Returns the exit
 * status. */
static int context_run(const context_opts *o, fkvf_reader *r, uint32_t *buf, size_t *got)
{
    size_t idx;
    if (!find_stream(r, o->path, o->id, &idx))
        return CLI_INVALID;
    int rc = fkvf_search_context(r, idx, o->at, (size_t)o->len, buf, got);
    if (rc == FKVF_E_RANGE) {
        fkvf_stream_info si;
        memset(&si, 0, sizeof si);
        fkvf_reader_stream_info(r, idx, &si);
        return cli_fail(CLI_INVALID, rc, o->path,
                        "--at %" PRIu64 ": outside the stream %s (positions 0..%" PRIu64 ")", o->at,
                        o->stream, si.length ? si.length - 1 : 0);
    }
    if (rc) {
        char pre[64];
        snprintf(pre, sizeof pre, "position %" PRIu64 ": ", o->at);
        return cli_fail_reader(rc, r, o->path, pre);
    }
    return CLI_OK;
}

int fkvf_cli_context(int argc, char **argv)
{
    context_opts o;
    int ret = context_parse(argc, argv, &o);
    if (ret >= 0)
        return ret;
    fkvf_reader *r = NULL;
    if ((ret = cli_open_archive(&r, o.path)) != CLI_OK)
        return ret;
    size_t got = 0;
    uint32_t *buf = malloc((size_t)o.len * sizeof *buf);
    if (!buf)
        ret = cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
    else
        ret = context_run(&o, r, buf, &got);
    if (ret == CLI_OK && o.json) {
        printf("{\"stream\":\"%s\",\"at\":%" PRIu64 ",\"first\":%" PRIu64 ",\"symbols\":[",
               o.stream, o.at, o.at + 1 - got);
        print_syms(buf, got);
        printf("]}\n");
    } else if (ret == CLI_OK) {
        print_syms(buf, got);
        printf("\n");
    }
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
    size_t unnamed;   /* index streams without a name (an external codebook's layer
                       * table, spec 11.2): no key for an index */
    uint64_t entries; /* positions in the new indexes, summed over the streams */
    uint64_t bytes;   /* bytes of the new index (ZPOS) sections */
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

/* ---- index builds on threads ---------------------------------------------
 * A stream's index depends on that stream alone: the streams to index are
 * built on --threads workers, each with a reader of its own (a reader is
 * used by one thread at a time; a second open of the file is an mmap), and
 * the sections go into the commit in stream order: the same bytes for
 * every thread count. */

/* One stream to index, and what became of it. */
typedef struct index_item {
    size_t stream;
    uint64_t cover; /* positions [0, cover) to index */
    int built;      /* 0: its index in effect is current */
    int rc;         /* the build's error (FKVF_OK: none) */
    unsigned worker;
    void *data;
    size_t size;
    uint64_t key;
} index_item;

typedef struct index_job {
    fkvf_reader **rs; /* one per worker */
    index_item *it;
    size_t n;
    pthread_mutex_t mu; /* PTHREAD_MUTEX_INITIALIZER */
    size_t next, fail;  /* the next item to start; the lowest failed (n: none) */
} index_job;

static int index_one(index_job *j, unsigned w, size_t i)
{
    index_item *it = &j->it[i];
    fkvf_reader *r = j->rs[w];
    it->worker = w;
    if (index_is_current(r, it->stream, it->cover))
        return FKVF_OK;
    it->rc = fkvf_search_index_build(r, it->stream, &it->data, &it->size, &it->key, NULL);
    it->built = it->rc == FKVF_OK;
    return it->rc;
}

/* The next item for a worker: in ascending order, none above a failure. */
static size_t index_take(index_job *j)
{
    pthread_mutex_lock(&j->mu);
    size_t i = j->next < j->fail ? j->next++ : j->n;
    pthread_mutex_unlock(&j->mu);
    return i;
}

typedef struct index_worker {
    index_job *j;
    unsigned id;
} index_worker;

static void *index_work(void *arg)
{
    index_worker *w = arg;
    for (size_t i; (i = index_take(w->j)) < w->j->n;)
        if (index_one(w->j, w->id, i) != FKVF_OK) {
            pthread_mutex_lock(&w->j->mu);
            if (i < w->j->fail)
                w->j->fail = i;
            pthread_mutex_unlock(&w->j->mu);
        }
    return NULL;
}

/* Every item on nw workers (the calling thread being worker 0; nw 1 starts
 * no thread); returns the lowest failed item, n when none did. A thread
 * that cannot be started leaves its share to the others. */
static size_t index_run(index_job *j, unsigned nw)
{
    j->next = 0;
    j->fail = j->n;
    index_worker w[CLI_THREADS_MAX];
    pthread_t tid[CLI_THREADS_MAX];
    unsigned started = 0;
    if (nw <= 1) {
        for (size_t i = 0; i < j->n; i++)
            if (index_one(j, 0, i) != FKVF_OK)
                return i;
        return j->n;
    }
    for (unsigned k = 1; k < nw; k++) {
        w[k].j = j;
        w[k].id = k;
        if (pthread_create(&tid[started], NULL, index_work, &w[k]) != 0)
            break;
        started++;
    }
    w[0].j = j;
    w[0].id = 0;
    index_work(&w[0]);
    for (unsigned k = 0; k < started; k++)
        pthread_join(tid[k], NULL);
    return j->fail;
}

/* The readers of workers 1 .. nw - 1 (rs[0] is the command's); returns
 * how many workers have one (a reader that cannot be opened: fewer
 * workers, the same result). */
static unsigned index_readers(fkvf_reader **rs, unsigned nw, const char *path)
{
    for (unsigned w = 1; w < nw; w++)
        if (cli_open_path_or_url(&rs[w], path) != FKVF_OK) {
            fkvf_reader_free(rs[w]);
            rs[w] = NULL;
            return w;
        }
    return nw;
}

/* The streams to index (named, when nid, and not too short or unnamed)
 * into it[0 .. *n); the others counted in rep. 0, or 1 when a stream
 * named does not exist (reported). */
static int index_plan(fkvf_reader *r, const char *path, const uint64_t *ids, size_t nid,
                      int missing_ok, index_item *it, size_t *n, index_report *rep)
{
    size_t ns = 0;
    fkvf_reader_stream_count(r, &ns);
    for (size_t k = 0; k < nid && !missing_ok; k++) { /* every stream named exists */
        size_t idx;
        if (!find_stream(r, path, ids[k], &idx))
            return 1;
    }
    *n = 0;
    for (size_t i = 0; i < ns; i++) {
        fkvf_stream_info si;
        fkvf_reader_stream_info(r, i, &si);
        int want = !nid;
        for (size_t k = 0; k < nid; k++)
            want |= ids[k] == si.id;
        if (!want)
            continue;
        if (si.id == FKVF_STREAM_ID_UNNAMED) {
            rep->unnamed++;
            continue;
        }
        uint64_t u = si.align ? si.align : 1, cover = si.length / u * u;
        if (cover == 0) {
            rep->short_++;
            continue;
        }
        memset(&it[*n], 0, sizeof it[*n]);
        it[*n].stream = i;
        it[*n].cover = cover;
        ++*n;
    }
    return 0;
}

/* The error of a failed build, with its worker's reader's message. */
static int index_fail(fkvf_reader *r, const index_item *it, const char *path)
{
    fkvf_stream_info si;
    char nm[64], pre[80];
    fkvf_reader_stream_info(r, it->stream, &si);
    cli_stream_name(si.id, nm, sizeof nm);
    snprintf(pre, sizeof pre, "stream %s: ", nm);
    if (it->rc == FKVF_E_NOMEM)
        return cli_fail(CLI_USAGE, it->rc, path, "%sout of memory", pre);
    return cli_fail_reader(it->rc, r, path, pre);
}

/* Append the built indexes as one commit. */
static int index_commit(const char *path, const fkvf_section_add *secs, size_t n, int nosync)
{
    fkvf_archive_op *op = NULL;
    int rc = fkvf_archive_append_sections(&op, path, secs, n,
                                          nosync ? FKVF_SYNC_NONE : FKVF_SYNC_COMMIT);
    int ret = CLI_OK;
    if (rc) {
        fkvf_error_info e;
        int have = fkvf_archive_op_error(op, &e) == FKVF_OK && e.code != FKVF_OK;
        ret = cli_fail_lib(rc, have ? &e : NULL, path, "");
    }
    fkvf_archive_op_free(op);
    return ret;
}

/* Index the streams named (all when nid = 0) of the archive at path in one
 * new commit, skipping those whose index in effect is current (so that a
 * second run changes nothing) and those too short to index. A stream named
 * that the archive does not have is an error unless missing_ok. The
 * streams are built on cli_threads() workers. Returns an exit status;
 * *rep reports. */
static int index_file(const char *path, const uint64_t *ids, size_t nid, int missing_ok,
                      int nosync, index_report *rep)
{
    memset(rep, 0, sizeof *rep);
    fkvf_reader *rs[CLI_THREADS_MAX] = {NULL};
    int ret = cli_open_archive(&rs[0], path);
    if (ret != CLI_OK)
        return ret;
    size_t ns = 0, n = 0, nb = 0;
    fkvf_reader_stream_count(rs[0], &ns);
    index_job j = {rs, calloc(ns ? ns : 1, sizeof *j.it), 0, PTHREAD_MUTEX_INITIALIZER, 0, 0};
    fkvf_section_add *secs = calloc(ns ? ns : 1, sizeof *secs);
    unsigned nw = 1;
    ret = CLI_USAGE;
    if (!j.it || !secs) {
        ret = cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
        goto out;
    }
    if (index_plan(rs[0], path, ids, nid, missing_ok, j.it, &n, rep)) {
        ret = CLI_INVALID;
        goto out;
    }
    j.n = n;
    nw = cli_threads() < n ? cli_threads() : (n ? (unsigned)n : 1);
    nw = index_readers(rs, nw, path);
    size_t f = index_run(&j, nw);
    if (f < n) {
        ret = index_fail(rs[j.it[f].worker], &j.it[f], path);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (!j.it[i].built) {
            rep->current++;
            continue;
        }
        secs[nb].type = FKVF_SECTION_ZPOS;
        secs[nb].flags = 0;
        secs[nb].key = j.it[i].key;
        secs[nb].data = j.it[i].data;
        secs[nb].size = j.it[i].size;
        rep->bytes += j.it[i].size;
        rep->entries += j.it[i].cover;
        nb++;
    }
    for (unsigned w = 0; w < nw; w++) { /* before appending */
        fkvf_reader_free(rs[w]);
        rs[w] = NULL;
    }
    if (nb && (ret = index_commit(path, secs, nb, nosync)) != CLI_OK)
        goto out;
    rep->built = nb;
    ret = CLI_OK;
out:
    for (size_t i = 0; i < n; i++)
        fkvf_search_buffer_free(j.it[i].data, NULL);
    free(j.it);
    free(secs);
    for (unsigned w = 0; w < nw; w++)
        fkvf_reader_free(rs[w]);
    return ret;
}

/* fkvf pack: index the token stream (tokens_only; none: nothing to do) or
 * every stream (--index) of a freshly written archive. *bytes: the index
 * bytes written. */
int fkvf_cli_index_file(const char *path, int tokens_only, int nosync, uint64_t *bytes)
{
    index_report rep;
    const uint64_t tok = FKVF_STREAM_ID_TOKENS;
    int ret = tokens_only ? index_file(path, &tok, 1, 1, nosync, &rep)
                          : index_file(path, NULL, 0, 0, nosync, &rep);
    *bytes = ret == CLI_OK ? rep.bytes : 0;
    return ret;
}

typedef struct index_opts {
    const char *path;
    uint64_t ids[256]; /* --stream, each once (none: every stream) */
    size_t nid;
    int nosync, json;
} index_opts;

/* Returns -1 to go on, else the exit status (help printed, usage error). */
static int index_parse(int argc, char **argv, index_opts *o)
{
    if (want_help(argc, argv, index_help))
        return CLI_OK;
    memset(o, 0, sizeof *o);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--no-sync"))
            o->nosync = 1;
        else if (!strcmp(a, "--json"))
            o->json = 1;
        else if (!strcmp(a, "--stream") && i + 1 < argc && o->nid < 256 &&
                 cli_parse_stream_name(argv[i + 1], &o->ids[o->nid])) {
            size_t k = 0;
            while (k < o->nid && o->ids[k] != o->ids[o->nid])
                k++;
            o->nid += k == o->nid; /* a stream named twice is indexed once */
            i++;
        }
        else if (a[0] != '-' && !o->path)
            o->path = a;
        else
            return cli_usage("bad argument '%s' (see fkvf index --help)", a);
    }
    if (!o->path)
        return cli_usage("give ARCHIVE (see fkvf index --help)");
    return -1;
}

static void index_print(const index_opts *o, const index_report *rep)
{
    if (o->json) {
        printf("{\"archive\":");
        cli_json_cstr(stdout, o->path);
        printf(",\"streams\":%zu,\"entries\":%" PRIu64 ",\"bytes\":%" PRIu64
               ",\"current\":%zu,\"too_short\":%zu,\"changed\":%s,\"unnamed\":%zu}\n",
               rep->built, rep->entries, rep->bytes, rep->current, rep->short_,
               rep->built ? "true" : "false", rep->unnamed);
        return;
    }
    cli_text_cstr(stdout, o->path); /* a name for the terminal: escaped */
    if (rep->built)
        printf(": indexed %zu stream%s (%" PRIu64 " positions in all), %" PRIu64
               " index bytes in one new commit",
               rep->built, rep->built == 1 ? "" : "s", rep->entries, rep->bytes);
    else
        printf(": nothing to do, the file is unchanged");
    if (rep->current)
        printf("; %zu stream%s already %s a current index", rep->current,
               rep->current == 1 ? "" : "s", rep->current == 1 ? "has" : "have");
    if (rep->short_)
        printf("; %zu stream%s shorter than %s alignment unit (nothing to index)", rep->short_,
               rep->short_ == 1 ? " is" : "s are", rep->short_ == 1 ? "its" : "their");
    if (rep->unnamed)
        printf("; %zu index stream%s not indexed: %s named by the layer table of the external "
               "codebook, which this command does not read",
               rep->unnamed, rep->unnamed == 1 ? "" : "s", rep->unnamed == 1 ? "it is" : "they are");
    printf("\n");
}

int fkvf_cli_index(int argc, char **argv)
{
    index_opts o;
    int ret = index_parse(argc, argv, &o);
    if (ret >= 0)
        return ret;
    index_report rep;
    ret = index_file(o.path, o.ids, o.nid, 0, o.nosync, &rep);
    if (ret == CLI_OK)
        index_print(&o, &rep);
    return ret;
}
