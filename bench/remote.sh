#!/bin/sh
# What reading an archive over HTTP range requests transfers and costs
# (issue 18, docs/remote.md): bytes and requests per operation against the
# archive's size, and wall time against the same operation on the local file.
#
#   bench/remote.sh [--positions N] [--reps N] [--bin DIR] [--quick] [--raw FILE]
#
# Builds (unless --bin DIR, a build directory with tools/fkvf and
# bench/bench_remote) the Release directory build-bench, writes a cache
# with bench/mkcache.py (GPT-2-small shape, 12 layers x 12 KV heads x 64,
# --positions, default 2048; --quick: 2 layers x 4 heads, 512), packs it
# twice (codebook embedded: fkvf pack --k 256; codebook in a separate file:
# fkvf train + fkvf pack --codebooks), starts nginx on 127.0.0.1 on a free
# port (scripts/nginx-local.sh) serving them, and runs bench_remote on each
# (--reps repetitions, default 5): open, one position, one layer, a full
# restore, each from a fresh reader on the URL and on the file. The table's
# bytes and requests are the URL reader's (libcurl's counts; nginx's access
# log agrees, and its total is printed as a check); times are medians of
# wall time over loopback. Needs /usr/bin/python3 with numpy, nginx, cmake.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
py=/usr/bin/python3
positions="" reps=5 bin="" quick=0 raw=""
while [ $# -gt 0 ]; do
    case "$1" in
        --positions) positions=$2; shift ;;
        --reps) reps=$2; shift ;;
        --bin) bin=$2; shift ;;
        --raw) raw=$2; shift ;;
        --quick) quick=1 ;;
        -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "remote.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
    shift
done
if [ $quick = 1 ]; then
    shape="--layers 2 --heads 4"
    : "${positions:=512}"
else
    shape=""
    : "${positions:=2048}"
fi
for n in "$positions" "$reps"; do
    case "$n" in "" | *[!0-9]* | 0*) echo "remote.sh: '$n' is not a count" >&2; exit 2 ;; esac
done

if [ -z "$bin" ]; then
    build="$root/build-bench"
    [ -f "$build/CMakeCache.txt" ] ||
        cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFKVF_BUILD_BENCH=ON >&2
    cmake --build "$build" -j2 --target fkvf bench_remote >&2
    bin=$build
fi
fkvf="$bin/tools/fkvf"
[ -x "$fkvf" ] && [ -x "$bin/bench/bench_remote" ] ||
    { echo "remote.sh: no $fkvf or $bin/bench/bench_remote" >&2; exit 2; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/fkvf-remote.XXXXXX")
. "$root/scripts/nginx-local.sh"
trap 'nginx_local_stop "$dir"; rm -rf "$dir"' EXIT
mkdir "$dir/www"
echo "remote: bench/mkcache.py: $positions positions" >&2
# shellcheck disable=SC2086
"$py" "$root/bench/mkcache.py" -o "$dir/cache.npy" --positions "$positions" $shape >&2
"$fkvf" pack "$dir/cache.npy" --k 256 --iters 1 -o "$dir/www/embedded.fkvf" >&2
"$fkvf" train "$dir/cache.npy" --k 256 --iters 1 -o "$dir/codebooks.fkvf" >&2
"$fkvf" pack "$dir/cache.npy" --codebooks "$dir/codebooks.fkvf" -o "$dir/www/shared.fkvf" >&2

st=0
nginx_local_start "$dir" "$dir/www" || st=$?
[ $st = 0 ] || { echo "remote.sh: nginx did not start (status $st)" >&2; exit 2; }
echo "remote: $(date -u +%FT%TZ), $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), load $(cut -d' ' -f1-3 /proc/loadavg), $NGINX_URL" >&2

# --raw FILE: the REMOTE lines (with the archive's name and size) also into
# FILE (tests/bench_remote_quick.sh reads them)
table() { # ARCHIVE [--codebooks FILE]
    name=$1
    shift
    size=$(wc -c <"$dir/www/$name")
    : >"$dir/logs/bytes.log"
    "$bin/bench/bench_remote" "$NGINX_URL/$name" "$dir/www/$name" --reps "$reps" "$@" >"$dir/out"
    [ "$(grep -c '^REMOTE ' "$dir/out")" = 4 ] || { echo "remote.sh: bench_remote printed no table" >&2; exit 1; }
    logged=$(awk '{ s += $3 } END { print s + 0 }' "$dir/logs/bytes.log")
    [ -z "$raw" ] || sed "s|^REMOTE |REMOTE archive=$name size=$size logged=$logged |" "$dir/out" | grep '^REMOTE ' >>"$raw"
    echo
    echo "$name: $size bytes; nginx sent $logged bytes in $(wc -l <"$dir/logs/bytes.log") requests in all (URL side of every repetition)"
    echo
    echo "| operation | bytes transferred | share of the archive | requests | URL ms (median) | file ms (median) | URL / file |"
    echo "|---|---|---|---|---|---|---|"
    awk 'function commas(n,  s) { s = sprintf("%d", n); while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]($|,)/, ",&", s); return s }
    /^REMOTE / {
        for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        printf "| %s | %s | %.2f%% | %s | %.1f | %.1f | %.1f |\n", v["op"], commas(v["bytes"]),
            100 * v["share"], v["requests"], v["url_ms"], v["file_ms"],
            (v["file_ms"] > 0 ? v["url_ms"] / v["file_ms"] : 0)
    }' "$dir/out"
}
echo "# bench/remote.sh: $positions positions${shape:+ ($shape)}, $reps repetitions, nginx on 127.0.0.1"
table embedded.fkvf
table shared.fkvf --codebooks "$dir/codebooks.fkvf"
