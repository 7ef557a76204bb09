/* fkvf validate: check files against every rule of the spec and report
 * every violation with its clause (fkvf_validate_file). Public API only. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "commands.h"
#include "fkvf.h"

static const char *validate_help =
    "usage: fkvf validate [--strict] [--json] [--codebooks FILE] [--max-violations N] FILE...\n"
    "\n"
    "Check each FILE against every rule of the FKVF spec that can be checked from\n"
    "the file, and report EVERY violation found (fkvf verify stops at the first),\n"
    "one line each:\n"
    "\n"
    "  FILE: offset 0x...: [clause 4.1] CLASS: message (check ID)\n"
    "\n"
    "then a summary line per file. Without --strict the rules are those of full\n"
    "verification (spec 1.3.3); --strict adds the writer-side rules a reader may\n"
    "be lenient about (reserved optional feature bits, fkvf. metadata keys, zero\n"
    "rope_theta bytes, every commit a valid state on its own).\n"
    "spec/requirements.md maps every requirement of the spec to its check.\n"
    "\n"
    "  --strict            add the writer-side rules\n"
    "  --json              one JSON object: {\"files\": [{\"file\", \"valid\",\n"
    "                      \"violations\": [{\"offset\", \"clause\", \"class\", \"code\",\n"
    "                      \"check\", \"writer_rule\", \"section\", \"section_type\",\n"
    "                      \"message\"}], \"valid\", \"count\", \"capped\"}],\n"
    "                      \"error\": null or the error object of docs/cli.md}\n"
    "                      (a file that cannot be validated has \"error\" instead\n"
    "                      of its results)\n"
    "  --codebooks FILE    the codebook file of archives with an external codebook\n"
    "                      (content hash, shape and symbols are then checked too)\n"
    "  --max-violations N  stop a file after N violations (default 1000)\n"
    "\n"
    "Exit status: 0 every file valid, 1 some file has violations, 2 usage or I/O\n"
    "error (also: a FILE or the --codebooks FILE does not exist).\n";

typedef struct vstate {
    const char *path;
    int json;
    size_t n;
    /* the first violation: the error line (and error object) of the file */
    int code;
    uint64_t offset;
    char clause[32], check[32], message[512];
} vstate;

static const char *class_name(int code)
{
    const char *n = fkvf_error_name(code);
    return strncmp(n, "FKVF_E_", 7) == 0 ? n + 7 : n;
}

static int on_violation(void *opaque, const fkvf_violation *v)
{
    vstate *s = opaque;
    if (!s->n) {
        s->code = v->code;
        s->offset = v->offset;
        snprintf(s->clause, sizeof s->clause, "%s", v->clause);
        snprintf(s->check, sizeof s->check, "%s", v->check);
        snprintf(s->message, sizeof s->message, "%s", v->message);
    }
    if (s->json) {
        printf("%s\n      {\"offset\": ", s->n ? "," : "");
        if (v->offset == FKVF_VALIDATE_NO_OFFSET)
            printf("null");
        else
            printf("%" PRIu64, v->offset);
        printf(", \"clause\": ");
        cli_json_cstr(stdout, v->clause);
        printf(", \"class\": ");
        cli_json_cstr(stdout, class_name(v->code));
        printf(", \"code\": %d, \"check\": ", v->code);
        cli_json_cstr(stdout, v->check);
        printf(", \"writer_rule\": %s, \"section\": %ld, \"section_type\": ",
               v->writer_rule ? "true" : "false", v->section);
        if (v->section_type) {
            char t[4];
            for (int k = 0; k < 4; k++)
                t[k] = (char)((v->section_type >> (8 * k)) & 0xFF);
            cli_json_str(stdout, t, 4);
        } else {
            printf("null");
        }
        printf(", \"message\": ");
        cli_json_cstr(stdout, v->message);
        printf("}");
    } else {
        printf("%s: ", s->path);
        if (v->offset == FKVF_VALIDATE_NO_OFFSET)
            printf("offset -: ");
        else
            printf("offset 0x%" PRIx64 ": ", v->offset);
        printf("[clause %s] %s: ", v->clause, class_name(v->code));
        cli_text_cstr(stdout, v->message);
        printf(" (check %s%s)\n", v->check, v->writer_rule ? ", writer rule" : "");
    }
    s->n++;
    return 0;
}

typedef struct validate_opts {
    int json, strict;
    const char *cbpath;  /* --codebooks FILE (NULL: none, or "") */
    uint64_t maxv;       /* --max-violations (0: no cap) */
    char **files;        /* malloc'd */
    int nfiles;
} validate_opts;

/* Returns -1 to go on, else the exit status (help printed, usage error);
 * o->files is to free either way. */
static int validate_parse(int argc, char **argv, validate_opts *o)
{
    memset(o, 0, sizeof *o);
    o->files = malloc((size_t)(argc > 0 ? argc : 1) * sizeof *o->files);
    if (!o->files)
        return cli_fail(CLI_USAGE, FKVF_E_NOMEM, NULL, "out of memory");
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(validate_help, stdout);
            return CLI_OK;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--strict")) {
            o->strict = 1;
        } else if (!strcmp(a, "--codebooks") || !strcmp(a, "--max-violations")) {
            if (i + 1 >= argc)
                return cli_usage("%s needs a value", a);
            const char *val = argv[++i];
            if (a[2] == 'c')
                o->cbpath = *val ? val : NULL; /* "" = none */
            else if (cli_parse_u64(val, 1000000000u, &o->maxv) || o->maxv == 0)
                return cli_usage("--max-violations: '%s' is not 1..1e9", val);
        } else if (a[0] == '-' && a[1]) {
            return cli_usage("unknown option '%s' (see fkvf validate --help)", a);
        } else {
            o->files[o->nfiles++] = argv[i];
        }
    }
    if (!o->nfiles)
        return cli_usage("no FILE (see fkvf validate --help)");
    return -1;
}

/* One file validated and its result printed. Returns its exit status. */
static int validate_one(const validate_opts *o, const fkvf_validate_options *opt, int f)
{
    const char *file = o->files[f];
    vstate s;
    memset(&s, 0, sizeof s);
    s.path = file;
    s.json = o->json;
    if (o->json) {
        printf("%s\n  {\"file\": ", f ? "," : "");
        cli_json_cstr(stdout, file);
        printf(", \"violations\": [");
    }
    fkvf_validate_result res;
    int rc = fkvf_validate_file(file, opt, on_violation, &s, &res);
    if (rc != FKVF_OK) {
        int ec = cli_fail(CLI_USAGE, rc, file, "cannot validate: %s", fkvf_strerror(rc));
        if (o->json) {
            char m[1200];
            snprintf(m, sizeof m, "%s: cannot validate: %s", file, fkvf_strerror(rc));
            printf("], \"error\": ");
            cli_json_error_object(stdout, CLI_USAGE, rc, file, m);
            printf("}");
        }
        return ec;
    }
    int ec = CLI_OK;
    if (res.violations) {
        /* on stderr too, as every command's errors: the file, the count
         * and the first violation (with its offset and clause) */
        char at[32] = "-";
        if (s.offset != FKVF_VALIDATE_NO_OFFSET)
            snprintf(at, sizeof at, "0x%" PRIx64, s.offset);
        ec = cli_fail_at(CLI_INVALID, s.code, file, s.offset, s.clause,
                         "invalid: %zu violation%s%s, the first at offset %s: [clause %s] %s: %s "
                         "(check %s)",
                         res.violations, res.violations == 1 ? "" : "s",
                         res.capped ? " (capped)" : "", at, s.clause, class_name(s.code),
                         s.message, s.check);
    }
    if (o->json) {
        printf("%s], \"valid\": %s, \"count\": %zu, \"capped\": %s}", s.n ? "\n    " : "",
               res.violations ? "false" : "true", res.violations, res.capped ? "true" : "false");
    } else if (res.violations) {
        printf("%s: %zu violation%s%s%s\n", file, res.violations, res.violations == 1 ? "" : "s",
               res.capped ? " (stopped at the cap)" : "", o->strict ? " (strict)" : "");
    } else {
        printf("%s: valid%s\n", file, o->strict ? " (strict: writer rules too)" : "");
    }
    return ec;
}

/* Every file validated (with the codebook file cb, or NULL). Returns the
 * exit status: 2 when a file could not be validated, else 1 when one has
 * a violation, else 0. */
static int validate_run(const validate_opts *o, fkvf_reader *cb)
{
    fkvf_validate_options opt;
    memset(&opt, 0, sizeof opt);
    opt.flags = o->strict ? FKVF_VALIDATE_STRICT : 0;
    opt.max_violations = (size_t)o->maxv;
    opt.codebook = cb;
    int ec = CLI_OK;
    if (o->json)
        printf("{\"strict\": %s, \"files\": [", o->strict ? "true" : "false");
    for (int f = 0; f < o->nfiles; f++) {
        int fe = validate_one(o, &opt, f);
        if (fe == CLI_USAGE || (fe == CLI_INVALID && ec == CLI_OK))
            ec = fe;
    }
    if (o->json) {
        printf("\n]");
        cli_json_error_member(stdout, ec);
        printf("}\n");
        cli_json_done();
    }
    return ec;
}

int fkvf_cli_validate(int argc, char **argv)
{
    validate_opts o;
    int ex = validate_parse(argc, argv, &o);
    if (ex >= 0) {
        free(o.files);
        return ex;
    }
    fkvf_reader *cb = NULL;
    if (o.cbpath) {
        int rc = fkvf_reader_open_file(&cb, o.cbpath, 0, NULL);
        if (rc != FKVF_OK) {
            /* a --codebooks FILE that cannot be used stops before any result
             * (the files are not validated): exit 2 when it does not exist or
             * cannot be read, as any path; 1 when it is not a codebook file,
             * as in verify and unpack, with the class spec 13.5 gives an
             * unusable candidate, whatever its own open said (which the
             * message names) */
            int env = rc == FKVF_E_IO || rc == FKVF_E_NOMEM;
            ex = cli_fail_reader(env ? rc : FKVF_E_CODEBOOK, cb, o.cbpath,
                                 env ? "--codebooks: "
                                     : "--codebooks: not a usable codebook file (CODEBOOK, spec "
                                       "13.5): ");
            fkvf_reader_free(cb);
            free(o.files);
            return ex;
        }
    }
    ex = validate_run(&o, cb);
    fkvf_reader_free(cb);
    free(o.files);
    return ex;
}
