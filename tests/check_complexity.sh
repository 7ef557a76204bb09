#!/bin/sh
# Keeps every function of libfkvf at a cyclomatic complexity of at most 40
# (pmccabe's first column, the modified complexity: a switch counts once):
# each function of every libfkvf/src/**/*.c above it is listed with its
# file:line and its number. A file pmccabe cannot parse (it complains on
# stderr and may leave functions out) fails too. The files are git's
# (tracked, and new ones not ignored) in a git checkout, else find's. Before
# the sources, the same measurement is run on a function of complexity 41,
# which must fail.
# usage: check_complexity.sh SRCDIR
# Exit 77 (skipped) without pmccabe (scripts/install-deps.sh installs it).
set -u
src=$1
limit=40
if ! command -v pmccabe >/dev/null 2>&1; then
    echo "complexity: pmccabe not found (scripts/install-deps.sh installs it): skipped"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# measure FILE...: pmccabe's lines into $tmp/out, its complaints into $tmp/err
measure() {
    : >"$tmp/out"
    : >"$tmp/err"
    for f in "$@"; do
        pmccabe "$f" >>"$tmp/out" 2>"$tmp/one.err"
        if [ -s "$tmp/one.err" ]; then
            echo "complexity: pmccabe cannot parse $f:" >>"$tmp/err"
            cat "$tmp/one.err" >>"$tmp/err"
        fi
    done
}
# over: the functions above the limit of $tmp/out, as FILE:LINE: NAME CC
over() {
    awk -F'\t' -v limit=$limit '$1 > limit {
        loc = $6; name = loc; sub(/\): .*/, "", loc); sub(/^.*\): /, "", name)
        sub(/\(/, ":", loc); printf "%s: %s %d (above %d)\n", loc, name, $1, limit }' "$tmp/out"
}

# the self-check: 40 ifs and the function itself make 41
{
    echo 'int too_complex(int a);'
    echo 'int too_complex(int a)'
    echo '{'
    i=0
    while [ $i -lt 40 ]; do echo "    if (a == $i) return $i;"; i=$((i + 1)); done
    echo '    return -1;'
    echo '}'
} >"$tmp/too_complex.c"
measure "$tmp/too_complex.c"
if [ -s "$tmp/err" ] || [ "$(over | wc -l)" -ne 1 ]; then
    echo "complexity: a function of complexity 41 passes (the check broke):"
    cat "$tmp/err" "$tmp/out"
    echo "complexity: 0 passed, 1 failed"
    exit 1
fi

cd "$src" || exit 1
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 &&
    [ -n "$(git ls-files libfkvf/src 2>/dev/null | head -n 1)" ]; then
    git ls-files --cached --others --exclude-standard 'libfkvf/src/*.c' >"$tmp/files"
else
    find libfkvf/src -name '*.c' | sort >"$tmp/files"
fi
# a file git lists but the work tree lacks (deleted, not yet committed)
files=$(while read -r f; do [ -f "$f" ] && echo "$f"; done <"$tmp/files")
if [ -z "$files" ]; then
    echo "complexity: no libfkvf/src/**/*.c under $src (the check broke)"
    echo "complexity: 0 passed, 1 failed"
    exit 1
fi
# shellcheck disable=SC2086 # the paths of libfkvf/src have no blanks
measure $files
n=$(wc -l <"$tmp/out")
over >"$tmp/over"
bad=$(wc -l <"$tmp/over")
errs=$(grep -c '^complexity: pmccabe cannot parse' "$tmp/err")
if [ "$bad" -gt 0 ]; then
    echo "complexity: functions of libfkvf above $limit (cut them into named steps):"
    cat "$tmp/over"
fi
cat "$tmp/err"
echo "complexity: $n functions in $(echo "$files" | wc -l) files, at most $limit each"
echo "complexity: $((n - bad)) passed, $((bad + errs)) failed"
[ "$bad" -eq 0 ] && [ "$errs" -eq 0 ]
