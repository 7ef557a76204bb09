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
#    an excerpt of FILE: its lines, leading and trailing blanks aside, occur
#    in FILE in the same order (a line "..." stands for lines left out);
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

# 2. excerpts: every line of the block occurs in the file, in order
n=1
while [ -f "$T/excerpt.$n" ]; do
    f=$(cat "$T/excerpt.$n.file")
    line=$(cat "$T/excerpt.$n.line")
    check "excerpt-README.md:$line-$f" 0 awk -v want="$T/excerpt.$n" '
        function trim(x) { sub(/^[ \t]+/, "", x); sub(/[ \t]+$/, "", x); return x }
        BEGIN { while ((getline l < want) > 0) if (l != "...") w[++nw] = l; i = 1 }
        i <= nw && trim($0) == w[i] { i++ }
        END { if (i <= nw) { print "not in order in the file: " w[i]; exit 1 } }' "$SRC/$f"
    n=$((n + 1))
done

# 3. the commands, in a scratch copy (no build trees, no .git)
if [ -s "$T/run.sh" ]; then
    mkdir "$T/repo" "$T/home"
    (cd "$SRC" && tar --exclude='./build*' --exclude=./.git --exclude=./demo -cf - .) |
        (cd "$T/repo" && tar -xf -)
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
