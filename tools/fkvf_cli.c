/* fkvf - command-line tool for FKVF archives: the command table, the
 * top-level --help and main. Each command is in its own file (commands.h).
 * Uses the public API only. */
#include <stdio.h>
#include <string.h>

#include "cli_util.h"
#include "cli_remote.h"
#include "commands.h"
#include "fkvf.h"

static const char *const prog = CLI_PROG;

/* ---- the command table ----------------------------------------------------- */

/* A subcommand: its name, its arguments and summary in the top-level --help
 * (a '\n' in the summary continues it on an indented line), its entry. */
typedef struct cli_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *args;
    const char *summary;
    int threads; /* 1: takes --threads N (cli_threads) */
} cli_command;

static const cli_command commands[] = {
    {"info", fkvf_cli_info, "ARCHIVE [--json]", "header, commits, cache shape, codecs, sizes, metadata", 0},
    {"verify", fkvf_cli_verify, "ARCHIVE [--json]",
     "full structure and checksum pass\n(exit 0 valid, 1 invalid, 2 usage or I/O error)", 1},
    {"validate", fkvf_cli_validate, "[--strict] FILE...", "every violation of the spec, with its clause", 0},
    {"dump", fkvf_cli_dump, "ARCHIVE [--json]", "directory and section details", 0},
    {"pack", fkvf_cli_pack, "CACHE -o ARCHIVE", "archive a raw cache (.safetensors, .npy, .npz)", 1},
    {"unpack", fkvf_cli_unpack, "ARCHIVE -o CACHE", "restore every position into a raw cache file", 1},
    {"train", fkvf_cli_train, "CACHE... -o FILE", "train a shared codebook file", 1},
    {"import-llama", fkvf_cli_import_llama, "STATE --model M",
     "archive a llama.cpp state file (-o ARCHIVE,\nlossless by default; --append ARCHIVE)", 1},
    {"export-llama", fkvf_cli_export_llama, "ARCHIVE -o STATE", "write a llama.cpp state file back", 1},
    {"compare", fkvf_cli_compare, "ORIG RESTORED", "reconstruction error of a restored cache", 0},
    {"append", fkvf_cli_append, "ARCHIVE CACHE",
     "append a raw cache's positions as new commits\n(--create: start a new archive)", 1},
    {"compact", fkvf_cli_compact, "ARCHIVE -o OUT", "rewrite a many-commit archive as one commit", 1},
    {"recover", fkvf_cli_recover, "ARCHIVE", "cut off a torn tail (an append that did not complete)", 0},
    {"search", fkvf_cli_search, "ARCHIVE --tokens L", "suffix search: where did these symbols occur?", 0},
    {"keys", fkvf_cli_keys, "ARCHIVE --layer L ...",
     "the archived positions a query vector's\nattention weighs most", 0},
    {"context", fkvf_cli_context, "ARCHIVE --at T", "decode the symbols before a position", 0},
    {"index", fkvf_cli_index, "ARCHIVE", "append a commit with ZIDX search indexes", 1},
    {"plot", fkvf_cli_plot, "ARCHIVE --stream S", "PNG of a stream's chaos-game points", 0},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const cli_command *find_command(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(name, commands[i].name))
            return &commands[i];
    return NULL;
}

static void usage_main(FILE *f)
{
    fprintf(f, "usage: %s [--help] [--version] COMMAND [ARGS]\n\nCommands:\n", prog);
    for (size_t i = 0; i < N_COMMANDS; i++) {
        char synopsis[64];
        snprintf(synopsis, sizeof synopsis, "%s %s", commands[i].name, commands[i].args);
        fprintf(f, "  %-25s ", synopsis);
        for (const char *c = commands[i].summary; *c; c++) {
            fputc(*c, f);
            if (*c == '\n')
                fprintf(f, "%28s", "");
        }
        fputc('\n', f);
    }
    fprintf(f,
            "\n"
            "Every command: exit status 0 ok, 1 invalid input data, 2 usage or\n"
            "environment (bad option, missing or unreadable path, out of memory);\n"
            "errors as 'fkvf COMMAND: FILE: what' on stderr, and with --json one JSON\n"
            "object on stdout (on failure {\"error\":{...}}; docs/cli.md). Commands\n"
            "that write a file never replace an input and, without --force, never an\n"
            "existing file.\n"
            "\n"
            "Commands that read an archive or codebook file (info, verify, dump,\n"
            "unpack, search, context, plot, export-llama, --codebooks) also take an\n"
            "http:// or https:// URL: only the byte ranges needed are requested\n"
            "(docs/remote.md); --max-bytes N caps what one command transfers.\n"
            "\n"
            "Commands that encode, train, restore, verify or index (pack, unpack,\n"
            "train, append, import-llama, export-llama, verify, index, compact)\n"
            "take --threads N: N threads (default: every CPU this process may use,\n"
            "or FKVF_THREADS); the output is byte-identical for every N.\n"
            "\n"
            "Run '%s COMMAND --help' for a command's options.\n",
            prog);
}

static int run(int argc, char **argv);

int main(int argc, char **argv)
{
    /* every error line names the command; --json anywhere asks for the
     * error object too (cli_finish), usage errors included */
    int json = 0;
    for (int i = 1; i < argc; i++)
        json |= !strcmp(argv[i], "--json");
    const cli_command *c = argc >= 2 ? find_command(argv[1]) : NULL;
    cli_set_command(prog, c ? c->name : NULL, json); /* an unknown command too: its usage error */
    return cli_finish(run(argc, argv));
}

static int run(int argc, char **argv)
{
    if (argc < 2) {
        usage_main(stderr);
        return CLI_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage_main(stdout);
        return CLI_OK;
    }
    if (!strcmp(cmd, "--version")) {
        printf("fkvf %s (libfkvf %s, format %d.%d)\n", FKVF_VERSION_STRING, fkvf_version_string(),
               FKVF_FORMAT_MAJOR, FKVF_FORMAT_MINOR);
        return CLI_OK;
    }
    const cli_command *c = find_command(cmd);
    if (c) {
        /* --max-bytes N, for every command that reads URLs (docs/remote.md),
         * and --threads N, for the commands that use threads: taken out
         * before the command parses its own options */
        int n = 0;
        for (int i = 2; i < argc; i++) {
            if (!strcmp(argv[i], "--max-bytes")) {
                uint64_t v;
                if (i + 1 >= argc || cli_parse_u64(argv[i + 1], UINT64_MAX, &v) || v == 0)
                    return cli_usage("--max-bytes needs a positive number of bytes");
                cli_remote_set_max_bytes(v);
                i++;
                continue;
            }
            if (!strcmp(argv[i], "--threads") && c->threads) {
                if (i + 1 >= argc || cli_set_threads(argv[i + 1]))
                    return cli_usage("--threads needs a number of threads, 1 to %u",
                                     CLI_THREADS_MAX);
                i++;
                continue;
            }
            argv[2 + n++] = argv[i];
        }
        argv[2 + n] = NULL; /* as after the last argument */
        if (c->threads && cli_threads_setup() != CLI_OK)
            return CLI_USAGE;
        return c->run(n, argv + 2);
    }
    cli_usage("unknown command '%s'", cmd);
    usage_main(stderr);
    return CLI_USAGE;
}
