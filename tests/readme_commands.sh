#!/bin/sh
# Runs the commands of README.md as written, in order, in a scratch copy of
# the repository (HOME a scratch directory too, so that "$HOME/.local" is
# scratch), and fails on the first command that exits non-zero.
#
# Convention (README.md):
#  - every fenced block tagged sh (```sh) is a block of commands, run from
#    the repository root; all of them run in one shell, in README order, so
#    a directory made or a variable exported in one block holds in the next;
#  - a line <!-- readme-test: skip (why) --> as the last non-blank line
#    before the fence leaves that block out (the set-up scripts that install
#    packages and run everything);
#  - a fenced block tagged c after <!-- readme-test: excerpt FILE --> must be
#    an excerpt of FILE: leading and trailing blanks and blank lines aside,
#    its lines are FILE's lines in the same order, and a line "..." stands
#    for lines left out (lines left out without one are an error);
#  - a command-like line (fkvf, ./, cmake, cc at its start) in an untagged
#    fenced block or an indented block is an error: tag the block sh (run)
#    or text (not run), so that no command is skipped by accident.
# usage: readme_commands.sh SRCDIR
set -u
SRC=$1
. "$(dirname "$0")/cli_lib.sh"

# 1. the blocks
awk -v T="$T" '
function trim(x) { sub(/^[ \t]+/, "", x); sub(/[ \t]+$/, "", x); return x }
function cmdlike(x) { x = trim(x); return x ~ /^(fkvf |\.\/|cmake |cc )/ }
BEGIN { infence = 0; prev = ""; nex = 0; blank = 1 }
{
    if (!infence && $0 ~ /^```/) {
        infence = 1; tag = trim(substr($0, 4)); start = NR; mode = ""
        if (tag == "sh") {
            if (prev ~ /^<!-- readme-test: skip/) { mode = "skip"; print "skip README.md:" NR > (T "/skipped") }
            else { mode = "run"; printf "echo \"== README.md:%d\" >&2\n", NR > (T "/run.sh") }
        } else if (tag == "c" && prev ~ /^<!-- readme-test: excerpt /) {
            mode = "excerpt"; nex++
            f = prev; sub(/^<!-- readme-test: excerpt /, "", f); sub(/ *-->.*$/, "", f)
            print f > (T "/excerpt." nex ".file"); print NR > (T "/excerpt." nex ".line")
            printf "" > (T "/excerpt." nex)
        } else if (tag == "") {
            mode = "untagged"
        }
        next
    }
    if (infence && $0 ~ /^```[ \t]*$/) {
        infence = 0; prev = "```"; blank = 0; next
    }
    if (infence) {
        if (mode == "run") print > (T "/run.sh")
        else if (mode == "excerpt" && trim($0) != "") print trim($0) > (T "/excerpt." nex)
        else if (mode == "untagged" && cmdlike($0))
            print "README.md:" NR ": a command in an untagged block (line " start "): tag it sh or text" > (T "/errors")
        next
    }
    # indented code block: four spaces after a blank line (or more of it)
    if ($0 ~ /^    / && (blank || inindent)) {
        inindent = 1
        if (cmdlike($0))
            print "README.md:" NR ": a command in an indented block: fence it as sh or text" > (T "/errors")
    } else if ($0 !~ /^[ \t]*$/) {
        inindent = 0
    }
    blank = ($0 ~ /^[ \t]*$/)
    if (!blank) prev = $0
}
END { if (infence) print "README.md: fence opened at line " start " not closed" > (T "/errors") }
' "$SRC/README.md"
if [ -s "$T/errors" ]; then
    cat "$T/errors"
    fails=$((fails + 1))
fi
check blocks-found 0 test -s "$T/run.sh"

# 2. excerpts: the lines between two "..." lines (a run) are consecutive
# non-blank lines of the file, and the runs occur in the file in order: a
# line left out without a "..." in its place is an error
n=1
while [ -f "$T/excerpt.$n" ]; do
    f=$(cat "$T/excerpt.$n.file")
    line=$(cat "$T/excerpt.$n.line")
    check "excerpt-README.md:$line-$f" 0 awk -v want="$T/excerpt.$n" '
        function trim(x) { sub(/^[ \t]+/, "", x); sub(/[ \t]+$/, "", x); return x }
        BEGIN {
            nr = 1; len[1] = 0
            while ((getline l < want) > 0) {
                if (l == "...") { if (len[nr] > 0) { nr++; len[nr] = 0 } }
                else w[nr, ++len[nr]] = l
            }
            if (len[nr] == 0) nr--
        }
        trim($0) != "" { F[++nf] = trim($0) }
        END {
            pos = 1
            for (r = 1; r <= nr; r++) {
                found = 0
                for (p = pos; p + len[r] - 1 <= nf && !found; p++) {
                    ok = 1
                    for (k = 1; k <= len[r] && ok; k++) ok = F[p + k - 1] == w[r, k]
                    if (ok) { found = 1; pos = p + len[r] }
                }
                if (!found) {
                    print "not in the file as consecutive lines, after the part before: " w[r, 1] " ... (" len[r] " lines; a line left out needs a \"...\" in its place)"
                    exit 1
                }
            }
        }' "$SRC/$f"
    n=$((n + 1))
done

# 3. the commands, in a scratch copy (no build trees, no .git)
if [ -s "$T/run.sh" ]; then
    mkdir "$T/repo" "$T/home"
    (cd "$SRC" && tar --exclude='./build*' --exclude=./.git --exclude=./demo -cf - .) |
        (cd "$T/repo" && tar -xf -)
    # ../shared (the models) beside the copy, as beside the repository
    [ -d "$SRC/../shared" ] && ln -s "$(cd "$SRC/../shared" && pwd)" "$T/shared"
    check copy 0 test -f "$T/repo/README.md"
    (cd "$T/repo" && HOME="$T/home" sh -e -x "$T/run.sh") >"$T/log" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "FAIL commands: exit $rc; the last lines (sh -x trace and output):"
        tail -n 40 "$T/log"
        fails=$((fails + 1))
    else
        pass=$((pass + 1))
    fi
    echo "ran $(grep -c '^echo "== README.md:' "$T/run.sh") blocks;" \
        "$(tr '\n' ' ' <"$T/skipped" 2>/dev/null)"
fi
finish readme_commands
