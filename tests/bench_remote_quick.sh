#!/bin/sh
# bench_remote_quick: bench/remote.sh --quick (nginx on 127.0.0.1) prints
# its two tables, and what they say holds: the bytes the URL readers
# counted are the bytes nginx logged, open reads a small part of the
# embedded archive, a restore reads every byte of the archive once (one
# more for the size probe). Structure and byte counts, not speed: no time
# is asserted (bench/remote.sh without --quick gives the figures).
#   tests/bench_remote_quick.sh SOURCE_DIR BUILD_DIR
set -u
src=$1 bin=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/bench_remote_quick.XXXXXX")
trap 'rm -rf "$work"' EXIT
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { echo "SKIP: no nginx"; exit 77; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
if ! sh "$src/bench/remote.sh" --quick --reps 2 --bin "$bin" --raw "$work/raw" >"$work/table.md" 2>"$work/err"; then
    cat "$work/err"
    echo "FAIL: remote.sh --quick exited non-zero"
    exit 1
fi
[ "$(grep -c '^| open |' "$work/table.md")" = 2 ] || fail "two open rows"
[ "$(grep -c '^| restore |' "$work/table.md")" = 2 ] || fail "two restore rows"
[ "$(grep -c '^REMOTE ' "$work/raw")" = 8 ] || fail "8 raw lines"
# field VALUE of the line of archive A, operation OP
get() { grep "^REMOTE archive=$1 .* op=$2 " "$work/raw" | tr ' ' '\n' | sed -n "s/^$3=//p"; }
for a in embedded.fkvf shared.fkvf; do
    size=$(get "$a" open size)
    # the URL side of every repetition of the 4 operations: what nginx sent
    sum=$(grep "^REMOTE archive=$a " "$work/raw" | tr ' ' '\n' | sed -n 's/^bytes=//p' |
        awk '{ s += $1 } END { print s * 2 }')
    logged=$(get "$a" open logged)
    [ "$sum" = "$logged" ] || fail "$a: counted $sum bytes, nginx logged $logged"
    r=$(get "$a" restore bytes)
    [ "$r" = $((size + 1)) ] || fail "$a: restore read $r bytes of $size (+1)"
done
o=$(get embedded.fkvf open bytes) s=$(get embedded.fkvf open size)
[ "$o" -lt $((s / 10)) ] || fail "open read $o of $s bytes"
[ $fails = 0 ] || { cat "$work/table.md"; exit 1; }
echo "bench_remote_quick: ok"
