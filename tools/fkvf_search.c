/* fkvf search | context | index | plot: retrieval on an archive's streams
 * (spec 12.1.5, 12.2.7, 20). Uses the public API only (fkvf.h) and zlib for
 * the PNG of `plot`. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "cli_util.h"
#include "fkvf.h"

int fkvf_cli_search_main(const char *cmd, int argc, char **argv);

static const char *search_help =
    "usage: fkvf search ARCHIVE (--tokens LIST | --stream NAME --symbols LIST) [options]\n"
    "\n"
    "Finds where the query's symbols occurred in a stream, without decoding the\n"
    "archive: LIST is comma-separated symbols, oldest first (the last one is the\n"
    "most recent). NAME is 'tokens' or Lx.Hy.K|V.stage (e.g. L3.H2.K.0).\n"
    "Prints the positions whose context ends with the whole query (exact), the\n"
    "k positions sharing the longest suffix with it (longest), and with\n"
    "--radius the paper's plane query: points within D of the query's point,\n"
    "verified by decoding (candidates, verified, false positives).\n"
    "Positions are stream positions t; for index streams the cache position is\n"
    "n_sinks + t. For --tokens, 'prefix' is how many of the query's first tokens\n"
    "the archive holds at the same positions: the cached rows an engine can reuse\n"
    "for that prompt.\n"
    "\n"
    "  --k N          longest matches to show (5)\n"
    "  --radius D     plane radius; 'auto' = the bound that holds every match\n"
    "  --context N    show the N symbols up to each longest match (0)\n"
    "  --max N        exact positions to print (20; the count is always exact)\n"
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
    "scanned until the next 'fkvf index'. --json: one JSON object (on failure\n"
    "{\"error\":{...}}, docs/cli.md).\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (not an archive, a codebook file, no\n"
    "such stream, a torn tail), 2 usage or I/O error (ARCHIVE does not exist or\n"
    "cannot be written, an appender has it open).\n";

static const char *plot_help =
    "usage: fkvf plot ARCHIVE --stream NAME -o FILE.png [--size PIXELS] [--force] [--json]\n"
    "\n"
    "Draws the chaos-game points of a stream (one per position) as a grayscale\n"
    "density image (log scale, darker = more points): the unit square for quad\n"
    "streams, the unit disc's square for ngon streams. --size 512 by default.\n"
    "--force replaces FILE.png if it exists (default: refused; ARCHIVE is never\n"
    "replaced). --json: one JSON object (on failure {\"error\":{...}},\n"
    "docs/cli.md).\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (not an archive, no such stream;\n"
    "FILE.png exists without --force or is ARCHIVE), 2 usage or I/O error\n"
    "(ARCHIVE does not exist, FILE.png cannot be written).\n";

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

/* A search handle's error (or rc alone). */
static int search_fail(int rc, const fkvf_search *s, const char *path)
{
    fkvf_error_info e;
    int have = s && fkvf_search_error(s, &e) == FKVF_OK && e.code != FKVF_OK;
    return cli_fail_lib(rc, have ? &e : NULL, path, "");
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
    int rc = fkvf_search_open(&s, r, idx, noidx ? FKVF_SEARCH_NO_INDEX : 0, NULL);
    if (rc) {
        ret = search_fail(rc, s, path);
        goto out;
    }
    fkvf_search_info inf;
    fkvf_search_info_get(s, &inf);
    pos = malloc((size_t)(maxp ? maxp : 1) * sizeof *pos);
    m = malloc((size_t)k * sizeof *m);
    cbuf = malloc((size_t)(ctx ? ctx : 1) * sizeof *cbuf);
    if (!pos || !m || !cbuf) {
        ret = cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
        goto out;
    }
    uint64_t nf;
    size_t nm;
    fkvf_search_info ia;
    fkvf_radius_result rr;
    memset(&rr, 0, sizeof rr);
    if ((rc = fkvf_search_suffix(s, q, qn, pos, (size_t)maxp, &nf)) ||
        (fkvf_search_info_get(s, &ia), rc = fkvf_search_longest(s, q, qn, (size_t)k, m, &nm))) {
        ret = search_fail(rc, s, path);
        goto out;
    }
    if (do_rad) {
        if ((rc = fkvf_search_radius(s, q, qn, rad, NULL, 0, &rr))) {
            ret = search_fail(rc, s, path);
            goto out;
        }
    }
    /* token queries: how much of the query the archive holds at the same
     * positions (prefix reuse for engines) */
    fkvf_prefix_reuse pr;
    int has_pr = id == FKVF_STREAM_ID_TOKENS && fkvf_search_prefix_reuse(r, q, qn, &pr) == FKVF_OK;
    uint64_t S = sinks_of(r, id);
    char nm_s[64];
    cli_stream_name(id, nm_s, sizeof nm_s);
    size_t shown = nf < maxp ? (size_t)nf : (size_t)maxp;
    if (json) {
        printf("{\"stream\":\"%s\",\"length\":%" PRIu64 ",\"n_indexed\":%" PRIu64
               ",\"cache_offset\":%" PRIu64 ",\"query\":[",
               nm_s, inf.length, inf.n_indexed, S);
        print_syms(q, qn);
        printf("],\"exact\":{\"count\":%" PRIu64 ",\"candidates\":%" PRIu64 ",\"positions\":[", nf,
               ia.candidates);
        for (size_t i = 0; i < shown; i++)
            printf("%s%" PRIu64, i ? "," : "", pos[i]);
        printf("]},\"longest\":[");
        for (size_t i = 0; i < nm; i++) {
            printf("%s{\"position\":%" PRIu64 ",\"length\":%" PRIu64, i ? "," : "", m[i].position,
                   m[i].length);
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
        printf("stream      %s, %" PRIu64 " positions, %" PRIu64 " indexed%s\n", nm_s, inf.length,
               inf.n_indexed, inf.n_indexed ? "" : " (scan)");
        printf("query       %zu symbols: ", qn);
        print_syms(q, qn < 32 ? qn : 32);
        printf("%s\n", qn > 32 ? ",..." : "");
        printf("exact       %" PRIu64 " position%s", nf, nf == 1 ? "" : "s");
        if (shown) {
            printf(":");
            for (size_t i = 0; i < shown; i++)
                printf(" %" PRIu64, pos[i]);
            if (nf > shown)
                printf(" ...");
        }
        printf("\n");
        printf("longest     %zu match%s (k = %" PRIu64 ")\n", nm, nm == 1 ? "" : "es", k);
        for (size_t i = 0; i < nm; i++) {
            printf("  t=%-10" PRIu64 " length %-6" PRIu64, m[i].position, m[i].length);
            if (S)
                printf(" cache position %" PRIu64, S + m[i].position);
            if (ctx) {
                size_t got = 0;
                fkvf_search_context(r, idx, m[i].position, (size_t)ctx, cbuf, &got);
                printf(" context ");
                print_syms(cbuf, got);
            }
            printf("\n");
        }
        if (has_pr)
            printf("prefix      the archive holds the first %" PRIu64 " query tokens at positions "
                   "0..%" PRIu64 " (reusable cache rows)\n",
                   pr.prefix_len, pr.prefix_len ? pr.prefix_len - 1 : 0);
        if (do_rad)
            printf("radius      %.6g: %" PRIu64 " candidates, %" PRIu64 " verified, %" PRIu64
                   " false positives\n",
                   rr.radius, rr.candidates, rr.verified, rr.candidates - rr.verified);
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

/* Index the streams named (all when nid = 0) of the archive at path in one
 * new commit. Returns an exit status; *n_out, *pos_out, *bytes_out report. */
static int index_file(const char *path, const uint64_t *ids, size_t nid, int nosync, size_t *n_out,
                      uint64_t *pos_out, uint64_t *bytes_out)
{
    fkvf_reader *r = NULL;
    int ret = cli_open_archive(&r, path);
    if (ret != CLI_OK)
        return ret;
    size_t ns = 0;
    fkvf_reader_stream_count(r, &ns);
    fkvf_section_add *secs = calloc(ns ? ns : 1, sizeof *secs);
    size_t n = 0;
    uint64_t bytes = 0, positions = 0;
    ret = CLI_USAGE;
    if (!secs) {
        ret = cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
        goto out;
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
        void *d;
        size_t sz;
        uint64_t key;
        int rc = fkvf_search_index_build(r, i, &d, &sz, &key);
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
        bytes += sz;
        positions = (sz - 64) / (si.profile == FKVF_PROFILE_QUAD ? 24 : 32);
        n++;
    }
    if (nid && n != nid) {
        ret = cli_fail(CLI_INVALID, FKVF_E_NOT_FOUND, path, "%zu of the %zu streams named exist",
                       n, nid);
        goto out;
    }
    fkvf_reader_free(r); /* before appending */
    r = NULL;
    if (n) {
        char msg[512];
        int rc = fkvf_archive_append_sections(path, secs, n, nosync ? FKVF_SYNC_NONE : FKVF_SYNC_COMMIT,
                                              msg, sizeof msg);
        if (rc) {
            ret = cli_fail(cli_fkvf_exit(rc), rc, path, "%s", msg);
            goto out;
        }
    }
    *n_out = n;
    *pos_out = positions;
    *bytes_out = bytes;
    ret = CLI_OK;
out:
    for (size_t i = 0; i < n; i++)
        fkvf_search_buffer_free((void *)secs[i].data);
    free(secs);
    fkvf_reader_free(r);
    return ret;
}

/* fkvf pack --index: index every stream of a freshly written archive. */
int fkvf_cli_index_file(const char *path, int nosync);
int fkvf_cli_index_file(const char *path, int nosync)
{
    size_t n;
    uint64_t p, b;
    return index_file(path, NULL, 0, nosync, &n, &p, &b);
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
                 cli_parse_stream_name(argv[i + 1], &ids[nid]))
            nid++, i++;
        else if (a[0] != '-' && !path)
            path = a;
        else
            return cli_usage("bad argument '%s' (see fkvf index --help)", a);
    }
    if (!path)
        return cli_usage("give ARCHIVE (see fkvf index --help)");
    size_t n = 0;
    uint64_t positions = 0, bytes = 0;
    int ret = index_file(path, ids, nid, nosync, &n, &positions, &bytes);
    if (ret != CLI_OK)
        return ret;
    if (json) {
        printf("{\"archive\":");
        cli_json_cstr(stdout, path);
        printf(",\"streams\":%zu,\"positions\":%" PRIu64 ",\"bytes\":%" PRIu64 "}\n", n,
               positions, bytes);
    }
    else
        printf("%s: indexed %zu stream%s (the last of %" PRIu64 " positions), %" PRIu64
               " index bytes in one new commit\n",
               path, n, n == 1 ? "" : "s", positions, bytes);
    return CLI_OK;
}

/* ---- plot --------------------------------------------------------------- */

static void be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static int png_chunk(FILE *f, const char *type, const unsigned char *data, uint32_t n)
{
    unsigned char h[8];
    be32(h, n);
    memcpy(h + 4, type, 4);
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, h + 4, 4);
    if (n)
        crc = crc32(crc, data, n);
    unsigned char c[4];
    be32(c, (uint32_t)crc);
    return fwrite(h, 1, 8, f) == 8 && (!n || fwrite(data, 1, n, f) == n) && fwrite(c, 1, 4, f) == 4;
}

/* 8-bit grayscale PNG: signature, IHDR, one IDAT (zlib), IEND. Without
 * force a file at path (even one made since the check) is not replaced. */
static int write_png(const char *path, const unsigned char *pix, uint32_t w, uint32_t h,
                     int force)
{
    size_t raw_n = (size_t)h * (w + 1);
    unsigned char *raw = malloc(raw_n);
    uLongf zn = compressBound((uLong)raw_n);
    unsigned char *z = malloc(zn);
    int ok = raw && z;
    if (ok) {
        for (uint32_t y = 0; y < h; y++) {
            raw[(size_t)y * (w + 1)] = 0; /* filter: none */
            memcpy(raw + (size_t)y * (w + 1) + 1, pix + (size_t)y * w, w);
        }
        ok = compress2(z, &zn, raw, (uLong)raw_n, 9) == Z_OK;
    }
    FILE *f = ok ? fopen(path, force ? "wb" : "wbx") : NULL;
    if (f) {
        static const unsigned char sig[8] = {137, 80, 78, 71, 13, 10, 26, 10};
        unsigned char ihdr[13];
        be32(ihdr, w);
        be32(ihdr + 4, h);
        ihdr[8] = 8;  /* bit depth */
        ihdr[9] = 0;  /* grayscale */
        ihdr[10] = 0; /* deflate */
        ihdr[11] = 0; /* adaptive filtering */
        ihdr[12] = 0; /* no interlace */
        ok = fwrite(sig, 1, 8, f) == 8 && png_chunk(f, "IHDR", ihdr, 13) &&
             png_chunk(f, "IDAT", z, (uint32_t)zn) && png_chunk(f, "IEND", NULL, 0);
        ok = (fclose(f) == 0) && ok;
    } else {
        ok = 0;
    }
    free(raw);
    free(z);
    return ok;
}

static int cmd_plot(int argc, char **argv)
{
    if (want_help(argc, argv, plot_help))
        return CLI_OK;
    const char *path = NULL, *stream = NULL, *out = NULL;
    uint64_t size = 512;
    int force = 0, json = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--force"))
            force = 1;
        else if (!strcmp(a, "--json"))
            json = 1;
        else if (!strcmp(a, "--stream") && v)
            stream = argv[++i];
        else if (!strcmp(a, "-o") && v)
            out = argv[++i];
        else if (!strcmp(a, "--size") && v && !cli_parse_u64(v, 8192, &size) && size >= 16)
            i++;
        else if (a[0] != '-' && !path)
            path = a;
        else
            return cli_usage("bad argument '%s' (see fkvf plot --help)", a);
    }
    uint64_t id;
    if (!path || !stream || !out || !cli_parse_stream_name(stream, &id))
        return cli_usage("give ARCHIVE, --stream NAME and -o FILE.png (see fkvf plot --help)");
    int ret = cli_check_output(out, &path, 1, force);
    if (ret != CLI_OK)
        return ret;
    fkvf_reader *r = NULL;
    if ((ret = cli_open_archive(&r, path)) != CLI_OK)
        return ret;
    ret = CLI_INVALID;
    size_t idx;
    uint32_t W = (uint32_t)size;
    uint32_t *cnt = calloc((size_t)W * W, sizeof *cnt);
    unsigned char *pix = malloc((size_t)W * W);
    if (!cnt || !pix) {
        ret = cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
        goto out;
    }
    if (!find_stream(r, path, id, &idx))
        goto out;
    fkvf_stream_info si;
    fkvf_reader_stream_info(r, idx, &si);
    uint32_t mx = 0;
    for (uint64_t t = 0; t < si.length; t++) {
        fkvf_point p;
        int rc = fkvf_reader_stream_point(r, idx, t, &p);
        if (rc) {
            ret = cli_fail_reader(rc, r, path, "");
            goto out;
        }
        double x, y;
        if (si.profile == FKVF_PROFILE_QUAD) {
            x = ldexp((double)p.x, -64);
            y = ldexp((double)p.y, -64);
        } else {
            x = (p.fx + 1.0) / 2.0;
            y = (p.fy + 1.0) / 2.0;
        }
        long px = (long)(x * W), py = (long)((1.0 - y) * W); /* y up */
        if (px < 0)
            px = 0;
        if (px >= (long)W)
            px = (long)W - 1;
        if (py < 0)
            py = 0;
        if (py >= (long)W)
            py = (long)W - 1;
        uint32_t *c = &cnt[(size_t)py * W + (size_t)px];
        if (*c < UINT32_MAX)
            (*c)++;
        if (*c > mx)
            mx = *c;
    }
    double lm = log1p((double)mx);
    for (size_t i = 0; i < (size_t)W * W; i++)
        pix[i] = cnt[i] ? (unsigned char)(200.0 - 200.0 * log1p((double)cnt[i]) / lm) : 255;
    errno = 0;
    if (!write_png(out, pix, W, W, force)) {
        int e = errno;
        if (e == EEXIST)
            ret = cli_fail(CLI_INVALID, FKVF_E_EXISTS, out,
                           "appeared while the plot was drawn; not replaced");
        else
            ret = cli_fail(CLI_USAGE, FKVF_E_IO, out, "cannot write: %s",
                           e ? strerror(e) : "error");
        goto out;
    }
    char nm[64];
    cli_stream_name(id, nm, sizeof nm);
    if (json) {
        printf("{\"archive\":");
        cli_json_cstr(stdout, path);
        printf(",\"stream\":\"%s\",\"out\":", nm);
        cli_json_cstr(stdout, out);
        printf(",\"points\":%" PRIu64 ",\"size\":%u,\"densest\":%u}\n", si.length, W, mx);
    } else {
        printf("%s: %" PRIu64 " points of %s, %ux%u pixels, densest pixel %u\n", out, si.length,
               nm, W, W, mx);
    }
    ret = CLI_OK;
out:
    free(cnt);
    free(pix);
    fkvf_reader_free(r);
    return ret;
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
        return cmd_plot(argc, argv);
    return -1;
}
