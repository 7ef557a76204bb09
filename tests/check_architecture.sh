#!/bin/sh
# Keeps docs/architecture.md honest: every path it names under a directory
# of the repository (libfkvf/, tools/, tests/, conformance/, fuzz/, docs/,
# spec/, scripts/, examples/, bench/, testdata/, python/, cmake/) exists, a glob such as
# tests/test_container*.c matches at least one file, a module path such as
# read/chain.c exists under libfkvf/src/, a file name in backquotes
# without its directory (`load.c`) is some file's, and every identifier in
# backquotes with an underscore in it (fkvf_reader_open_file, rd_enter,
# FKVF_HANDLE_OPEN) occurs in the sources; and every libfkvf/src/MODULE/FILE
# is named, as `MODULE/FILE`. So a rename, a move or a new source file cannot
# leave the map stale. Before the page, the same checks are run on a line
# that names a missing file and a missing function, which must fail.
# usage: check_architecture.sh SRCDIR [DOC]   (DOC: docs/architecture.md)
# shellcheck disable=SC2016 # the backquotes in single quotes are the page's own
set -u
src=$1
doc=${2:-$src/docs/architecture.md}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
top='libfkvf|tools|tests|conformance|fuzz|docs|spec|scripts|examples|bench|testdata|python|cmake'
mods='common|codec|format|quant|read|write|append|search|validate'

# every word of the sources, once (not of this script: its self-check names
# a function that must not exist)
find "$src/libfkvf" "$src/tools" "$src/tests" "$src/conformance" "$src/fuzz" \
    "$src/examples" "$src/bench" "$src/python" "$src/cmake" -type f \
    \( -name '*.[ch]' -o -name '*.sh' -o -name '*.py' -o -name 'CMakeLists.txt' -o -name '*.cmake' \) \
    ! -name check_architecture.sh -exec grep -ohE '[A-Za-z_][A-Za-z0-9_]*' {} + |
    sort -u >"$tmp/words"
# the name of every file, for file names without their directory (`load.c`)
find "$src/libfkvf" "$src/tools" "$src/tests" "$src/conformance" "$src/fuzz" \
    "$src/examples" "$src/bench" "$src/docs" "$src/spec" "$src/scripts" "$src/python" "$src/cmake" -type f |
    sed 's,.*/,,' | sort -u >"$tmp/files"

# spans FILE: the text of FILE's backquoted spans, one a line (outside code
# blocks; a span may go on over a line break)
spans() {
    awk '/^```/ { f = !f; next } !f' "$1" | tr '\n' ' ' | grep -oE '`[^`]+`' | tr -d '`'
}

# check FILE: prints each name of FILE that does not exist; the count of
# names checked in $tmp/n. A part <like-this> of a name is a placeholder,
# and so is a * : it must stand for something that exists
# (tools/cacheio_<fmt>.c, `fkvf_cli_<name>`, `cli_fail*`).
check() {
    # paths from a top-level directory, not preceded by a path character
    grep -oE "(^|[^A-Za-z0-9_./<>-])($top)/[A-Za-z0-9_.*/+<>-]*" "$1" |
        sed -E 's/^[^A-Za-z]//; s/[.,:;]+$//' | sort -u >"$tmp/paths"
    # module paths relative to libfkvf/src (read/chain.c)
    grep -oE "(^|[^A-Za-z0-9_./<>-])($mods)/[A-Za-z0-9_<>]+\.[ch]" "$1" |
        sed -E 's/^[^a-z]//' | sort -u >"$tmp/mpaths"
    # identifiers in backquotes, outside paths
    spans "$1" | tr -c 'A-Za-z0-9_./*<>\n-' '\n' |
        grep -vE '[/.]' | grep -E '^[A-Za-z0-9_*<>]*_[A-Za-z0-9_*<>]*$' | grep -E '[A-Za-z]' |
        sort -u >"$tmp/ids"
    # file names in backquotes without a directory
    spans "$1" | tr -c 'A-Za-z0-9_./*<>\n-' '\n' |
        grep -E '^[A-Za-z0-9_*<>-]+\.(c|h|sh|py|md|cmake)$' | sort -u >"$tmp/names"
    : >"$tmp/bad"
    while read -r p; do
        g=$(printf '%s' "$p" | sed -E 's/<[^>]*>/*/g')
        case $g in
        *'*'*) # shellcheck disable=SC2086
            set -- $src/$g
            [ -e "$1" ] || echo "no file matches $p" >>"$tmp/bad" ;;
        *) [ -e "$src/$g" ] || echo "no such path: $p" >>"$tmp/bad" ;;
        esac
    done <"$tmp/paths"
    while read -r p; do
        g=$(printf '%s' "$p" | sed -E 's/<[^>]*>/*/g')
        # shellcheck disable=SC2086
        set -- $src/libfkvf/src/$g
        [ -e "$1" ] || echo "no such module file: libfkvf/src/$p" >>"$tmp/bad"
    done <"$tmp/mpaths"
    while read -r w; do
        case $w in
        *'<'* | *'*'*)
            re=$(printf '%s' "$w" | sed -E 's/<[^>]*>/[A-Za-z0-9_]+/g; s/\*/[A-Za-z0-9_]*/g')
            grep -qxE "$re" "$tmp/words" || echo "nothing in the sources is $w" >>"$tmp/bad" ;;
        *) grep -qxF "$w" "$tmp/words" || echo "not in the sources: $w" >>"$tmp/bad" ;;
        esac
    done <"$tmp/ids"
    while read -r f; do
        re=$(printf '%s' "$f" | sed -E 's/\./\\./g; s/<[^>]*>/[A-Za-z0-9_-]+/g; s/\*/[A-Za-z0-9_-]*/g')
        grep -qxE "$re" "$tmp/files" || echo "no file is named $f" >>"$tmp/bad"
    done <"$tmp/names"
    cat "$tmp/paths" "$tmp/mpaths" "$tmp/ids" "$tmp/names" | wc -l | tr -d ' ' >"$tmp/n"
    cat "$tmp/bad"
}

# the checks catch what they are for
printf '%s\n' 'See `libfkvf/src/read/no_such_file.c`, read/gone.c,' \
    'tests/test_gone*.c, `gone.c` and (a span over a line break) `a' \
    'fkvf_no_such_function`.' >"$tmp/self.md"
selfbad=$(check "$tmp/self.md" | wc -l)
if [ "$selfbad" -ne 5 ]; then
    echo "architecture: the self-check found $selfbad of 5 missing names"
    echo "architecture: 0 passed, 1 failed"
    exit 1
fi

bad=$(check "$doc")
n=$(cat "$tmp/n")
# and every source file of libfkvf is on the map (its module table)
for f in "$src"/libfkvf/src/*/*.[ch]; do
    m=${f#"$src"/libfkvf/src/}
    grep -qF "\`$m\`" "$doc" || bad="$bad${bad:+
}libfkvf/src/$m is not in the module table"
done
if [ -n "$bad" ]; then
    echo "$bad" | sed "s,^,architecture: $doc: ,"
    echo "architecture: 0 passed, 1 failed"
    exit 1
fi
if [ "$n" -lt 100 ]; then # the page names far more; fewer means the extraction broke
    echo "architecture: only $n names found in $doc"
    echo "architecture: 0 passed, 1 failed"
    exit 1
fi
echo "architecture: $n names checked; 1 passed, 0 failed"
exit 0
