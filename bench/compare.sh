#!/bin/bash
# bench/compare.sh: FKVF against its anchors on the same data in one run, one
# markdown ratio table on stdout (issue 16; bench/README.md "compare.sh").
#
#   bench/compare.sh [--quick] [--runs N] [--keep DIR] [--json FILE]
#                    [--bin DIR | --build DIR] [--positions N]
#                    [--train-positions N] [--train-iters N]
#                    [--subset-positions N] [--timeout S]
#
# Builds (unless --bin) the fkvf CLI and the bench programs it runs in a
# Release build directory of its own (default: build-bench in the
# repository; only those targets), writes the input with bench/mkcache.py
# (GPT-2-small shape: 12 layers x 12 KV heads x 64, f16, 8192 positions),
# then bench/compare.py measures and prints the table.
#   --quick           small sizes (2 layers x 4 heads, 512 positions), 3
#                     pairs, the other engineers' programs skipped: for the
#                     smoke test bench_compare_quick (structure, not speed)
#   --runs N          pairs per paired row (default 5)
#   --keep DIR        write the data into DIR and keep it (default: a
#                     temporary directory under $TMPDIR, removed at the end)
#   --json FILE       also write the rows as JSON
#   --bin DIR         use the binaries of this build directory, build nothing
#   --build DIR       the build directory to configure and build (Release)
#   --positions N     positions of the cache (8192)
#   --train-positions N, --train-iters N   the `fkvf train` run: its first N
#                     positions (1024) and iterations (25); training all 8192
#                     positions takes many minutes on today's code
#   --subset-positions N   positions for zstd -19 and xz -6 (1024)
#   --timeout S       seconds per bench program (300)
# Needs /usr/bin/python3 with numpy, zstd, lz4, gzip, xz, cmake.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
py=/usr/bin/python3

quick=0 runs="" keep="" json="" bin="" build="$root/build-bench" timeout=300
positions="" tpos="" titers="" spos=""
usage() {
    sed -n '4,8p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --runs | --keep | --json | --bin | --build | --positions | --train-positions | \
            --train-iters | --subset-positions | --timeout)
            [ $# -ge 2 ] || usage
            v=$2
            case "$1" in
                --runs) runs=$v ;; --keep) keep=$v ;; --json) json=$v ;; --bin) bin=$v ;;
                --build) build=$v ;; --positions) positions=$v ;; --train-positions) tpos=$v ;;
                --train-iters) titers=$v ;; --subset-positions) spos=$v ;; --timeout) timeout=$v ;;
            esac
            shift ;;
        -h | --help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "compare.sh: unknown argument '$1'" >&2; usage ;;
    esac
    shift
done
for n in "$runs" "$positions" "$tpos" "$titers" "$spos" "$timeout"; do
    case "$n" in "" | *[!0-9]* | 0*) [ -z "$n" ] || { echo "compare.sh: '$n' is not a count" >&2; exit 2; } ;; esac
done

if [ $quick = 1 ]; then
    shape=(--layers 2 --heads 4)
    : "${positions:=512}" "${tpos:=256}" "${titers:=3}" "${spos:=128}" "${runs:=3}"
else
    shape=()
    : "${positions:=8192}" "${tpos:=1024}" "${titers:=25}" "${spos:=1024}" "${runs:=5}"
fi

# the programs compare.py runs when they exist (bench/compare.py PROGRAMS)
progs=(bench_anchor bench_restore_pread bench_random bench_access bench_encode bench_train
    bench_append bench_search)
if [ -z "$bin" ]; then
    if [ ! -f "$build/CMakeCache.txt" ]; then
        cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFKVF_BUILD_BENCH=ON >&2
    fi
    nice cmake --build "$build" -j2 --target fkvf >&2
    for p in "${progs[@]}"; do
        # a program another branch has not merged yet is no target here:
        # its rows say "not built"
        if [ -f "$root/bench/$p.c" ] && ! nice cmake --build "$build" -j2 --target "$p" >&2; then
            echo "compare.sh: $p did not build; its rows say not built" >&2
            rm -f "$build/bench/$p"
        fi
    done
    bin=$build
fi
[ -x "$bin/tools/fkvf" ] || { echo "compare.sh: no $bin/tools/fkvf" >&2; exit 2; }

if [ -n "$keep" ]; then
    mkdir -p "$keep"
    dir=$(cd "$keep" && pwd)
else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/fkvf-compare.XXXXXX")
    trap 'rm -rf "$dir"' EXIT
fi
raw="$dir/cache.npy"
rm -f "$raw"
echo "compare: bench/mkcache.py: $positions positions -> $raw" >&2
"$py" "$root/bench/mkcache.py" -o "$raw" --positions "$positions" "${shape[@]}"

args=(--bin "$bin" --src "$root" --dir "$dir" --raw "$raw" --positions "$positions"
    --runs "$runs" --train-positions "$tpos" --train-iters "$titers"
    --subset-positions "$spos" --timeout "$timeout")
[ $quick = 0 ] || args+=(--quick)
[ -z "$json" ] || args+=(--json "$json")
echo "compare: $(date -u +%FT%TZ), $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$py" "$here/compare.py" "${args[@]}"
echo "compare: done $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
