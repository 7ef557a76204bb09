#!/bin/sh
# Prints the structure figures the closing notes of refactorings compare:
# the largest functions by cyclomatic complexity (pmccabe), lines per module,
# the public functions without documentation, and the layering check; and,
# where the developers' `duplicates` command is on PATH, its pair count for
# libfkvf and tools.
# usage: scripts/metrics.sh [TOP]   (from the repository root; TOP = 15)
# pmccabe comes from scripts/install-deps.sh.
set -eu
top=${1:-15}
cd "$(dirname "$0")/.."
command -v pmccabe >/dev/null 2>&1 || { echo "metrics: pmccabe not found (scripts/install-deps.sh installs it)" >&2; exit 2; }

echo "== largest functions (modified CC, statements, lines, where)"
# shellcheck disable=SC2046
pmccabe $(git ls-files 'libfkvf/*.c' 'tools/*.c') 2>/dev/null |
    sort -k1,1nr | head -n "$top" | awk -F'\t' '{ printf "%4s %4s %5s  %s\n", $1, $3, $5, $6 }'

echo "== functions with CC > 40 / > 20"
# shellcheck disable=SC2046
pmccabe $(git ls-files 'libfkvf/*.c' 'tools/*.c') 2>/dev/null |
    awk '$1 > 40 { a++ } $1 > 20 { b++ } END { printf "libfkvf+tools: %d / %d\n", a, b }'

echo "== lines per module"
for d in libfkvf/include $(git ls-files 'libfkvf/src/*' | sed 's,/[^/]*$,,' | sort -u) tools tests; do
    # shellcheck disable=SC2046
    n=$(cat $(git ls-files "$d/*.c" "$d/*.h") 2>/dev/null | wc -l)
    printf "%7d  %s\n" "$n" "$d"
done
echo "== largest files"
# shellcheck disable=SC2046
wc -l $(git ls-files 'libfkvf/*.[ch]' 'tools/*.[ch]' 'tests/*.c') | sort -nr | sed -n '2,9p'

echo "== public API"
/usr/bin/python3 scripts/api_docs.py libfkvf/include/fkvf.h

echo "== layering"
sh tests/check_layering.sh .

if command -v duplicates >/dev/null 2>&1; then
    echo "== duplicates (pairs of six or more shared lines)"
    for d in libfkvf tools; do
        printf "%s: " "$d"
        duplicates --repo "$d" --seconds 60 | head -n 1
    done
fi
