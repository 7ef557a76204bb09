#!/bin/sh
# CLI search / context / index / plot on archives packed from the bundled
# real sample cache (testdata/sample-cache.safetensors, with token ids):
# answers against the decoded stream, identical with and without an index,
# the index commit verifies, PNG output, usage errors.
# usage: cli_search.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
CACHE=$SRC/testdata/sample-cache.safetensors
. "$(dirname "$0")/cli_lib.sh"
Q="--train --k 16 --k-stages 2 --v-stages 1"

# help and usage errors
for c in search context index plot; do
    check "$c-help" 0 "$FKVF" $c --help
    grep_in "$c-help-text" "usage: fkvf $c" "$T/out"
    check "$c-noarg" 2 "$FKVF" $c
    check "$c-badopt" 2 "$FKVF" $c "$T/none.fkvf" --bogus x
done
check help-lists-search 0 "$FKVF" --help
grep_in help-lists-search "search ARCHIVE" "$T/out"

check pack-quad 0 "$FKVF" pack "$CACHE" -o "$T/q.fkvf" $Q
check pack-ngon 0 "$FKVF" pack "$CACHE" -o "$T/n.fkvf" $Q --codec ngon
check missing-file 2 "$FKVF" search "$T/none.fkvf" --tokens 1,2
check bad-list 2 "$FKVF" search "$T/q.fkvf" --tokens 1,,2
check bad-list2 2 "$FKVF" search "$T/q.fkvf" --tokens 1,x
check both-queries 2 "$FKVF" search "$T/q.fkvf" --tokens 1 --symbols 2
check symbols-no-stream 2 "$FKVF" search "$T/q.fkvf" --symbols 2
check bad-stream 2 "$FKVF" search "$T/q.fkvf" --stream L1.X2 --symbols 1
check no-stream 1 "$FKVF" search "$T/q.fkvf" --stream L9.H0.K.0 --symbols 1
check stream-l0 0 "$FKVF" search "$T/q.fkvf" --stream L0.H0.K.0 --symbols 1
check bad-stream-wrap 2 "$FKVF" search "$T/q.fkvf" --stream L4294967296.H0.K.0 --symbols 1
check bad-stream-blank 2 "$FKVF" search "$T/q.fkvf" --stream "L 0.H0.K.0" --symbols 1
check bad-radius 2 "$FKVF" search "$T/q.fkvf" --tokens 1 --radius -1
check bad-radius-blank 2 "$FKVF" search "$T/q.fkvf" --tokens 1 --radius " 0.5"

# context: the decoded symbols up to a position
check context 0 "$FKVF" context "$T/q.fkvf" --at 100 --len 10
n=$(tr ',' '\n' <"$T/out" | wc -l)
[ "$n" -eq 10 ] && pass=$((pass + 1)) || { echo "FAIL context-len: $n symbols"; fails=$((fails + 1)); }
cp "$T/out" "$T/ctx100"
check context-start 0 "$FKVF" context "$T/q.fkvf" --at 2 --len 10 --json
grep_in context-start '"first":0,"symbols":\[[0-9]*,[0-9]*,[0-9]*\]' "$T/out"
check context-range 1 "$FKVF" context "$T/q.fkvf" --at 256 --len 4
check context-index-stream 0 "$FKVF" context "$T/q.fkvf" --at 50 --len 5 --stream L1.H3.V.0

# search for the context of position 100: it is found, with its full length
for a in q n; do
    CTX=$(cat "$T/ctx100")
    check "search-$a" 0 "$FKVF" search "$T/$a.fkvf" --tokens "$CTX" --radius auto --json
    grep_in "search-$a-exact" '"positions":\[[0-9,]*100' "$T/out"
    grep_in "search-$a-longest" '{"position":100,"length":10}' "$T/out"
    cnt=$(sed -n 's/.*"exact":{"count":\([0-9]*\).*/\1/p' "$T/out")
    grep_in "search-$a-radius" "\"verified\":$cnt," "$T/out"
    sed 's/"n_indexed":[0-9]*,//' "$T/out" >"$T/before-$a"
    # an index stream query, before the index
    "$FKVF" context "$T/$a.fkvf" --at 150 --len 3 --stream L2.H1.K.1 >"$T/ictx"
    check "search-$a-stream" 0 "$FKVF" search "$T/$a.fkvf" --stream L2.H1.K.1 --symbols "$(cat "$T/ictx")" --k 4 --context 3 --json
    grep_in "search-$a-stream-found" '"positions":\[[0-9,]*150' "$T/out"
    sed 's/"n_indexed":[0-9]*,//' "$T/out" >"$T/sbefore-$a"

    # index: one new commit, valid, same answers
    check "index-$a" 0 "$FKVF" index "$T/$a.fkvf" --no-sync
    grep_in "index-$a-msg" "indexed 61 streams" "$T/out"
    check "verify-$a" 0 "$FKVF" verify "$T/$a.fkvf"
    check "info-$a" 0 "$FKVF" info "$T/$a.fkvf"
    grep_in "info-$a-commits" "in 2 commit" "$T/out"
    check "search-$a-indexed" 0 "$FKVF" search "$T/$a.fkvf" --tokens "$CTX" --radius auto --json
    grep_in "search-$a-uses-index" '"n_indexed":2' "$T/out"
    sed 's/"n_indexed":[0-9]*,//' "$T/out" >"$T/after-$a"
    check "search-$a-same" 0 cmp "$T/before-$a" "$T/after-$a"
    check "search-$a-stream-indexed" 0 "$FKVF" search "$T/$a.fkvf" --stream L2.H1.K.1 --symbols "$(cat "$T/ictx")" --k 4 --context 3 --json
    sed 's/"n_indexed":[0-9]*,//' "$T/out" >"$T/safter-$a"
    check "search-$a-stream-same" 0 cmp "$T/sbefore-$a" "$T/safter-$a"
    check "search-$a-noindex" 0 "$FKVF" search "$T/$a.fkvf" --tokens "$CTX" --radius auto --json --no-index
    grep_in "search-$a-noindex-n" '"n_indexed":0' "$T/out"
    sed 's/"n_indexed":[0-9]*,//' "$T/out" >"$T/scan-$a"
    check "search-$a-scan-same" 0 cmp "$T/before-$a" "$T/scan-$a"
    # one stream only
    check "index-$a-one" 0 "$FKVF" index "$T/$a.fkvf" --stream tokens --no-sync --json
    grep_in "index-$a-one-json" '"streams":1,' "$T/out"
    check "verify-$a-2" 0 "$FKVF" verify "$T/$a.fkvf"
    check "index-$a-nosuch" 1 "$FKVF" index "$T/$a.fkvf" --stream L99.H0.K.0

    # plot: a PNG
    check "plot-$a" 0 "$FKVF" plot "$T/$a.fkvf" --stream L0.H0.K.0 -o "$T/$a.png" --size 64
    sig=$(od -An -tx1 -N8 "$T/$a.png" | tr -d ' \n')
    [ "$sig" = "89504e470d0a1a0a" ] && pass=$((pass + 1)) || { echo "FAIL plot-$a-sig: $sig"; fails=$((fails + 1)); }
    check "plot-$a-tokens" 0 "$FKVF" plot "$T/$a.fkvf" --stream tokens -o "$T/$a-t.png"
done
check plot-bad-size 2 "$FKVF" plot "$T/q.fkvf" --stream tokens -o "$T/x.png" --size 3
check plot-no-out 2 "$FKVF" plot "$T/q.fkvf" --stream tokens
check plot-unwritable 2 "$FKVF" plot "$T/q.fkvf" --stream tokens -o "$T/nodir/x.png"
# pack --index: the archive comes with its index (two commits), same answers
check pack-index 0 "$FKVF" pack "$CACHE" -o "$T/pi.fkvf" $Q --index
check pack-index-verify 0 "$FKVF" verify "$T/pi.fkvf"
check pack-index-info 0 "$FKVF" info "$T/pi.fkvf"
grep_in pack-index-commits "in 2 commit" "$T/out"
check pack-index-search 0 "$FKVF" search "$T/pi.fkvf" --tokens "$(cat "$T/ctx100")" --radius auto --json
grep_in pack-index-used '"n_indexed":2' "$T/out"
sed 's/"n_indexed":[0-9]*,//' "$T/out" >"$T/pi-out"
check pack-index-same 0 cmp "$T/before-q" "$T/pi-out"
# prefix reuse: the archive's own first tokens as a prompt
"$FKVF" context "$T/q.fkvf" --at 29 --len 30 >"$T/pfx"
check prefix 0 "$FKVF" search "$T/q.fkvf" --tokens "$(cat "$T/pfx"),4000000000" --json
grep_in prefix-json '"prefix_len":30' "$T/out"
check prefix-text 0 "$FKVF" search "$T/q.fkvf" --tokens "$(cat "$T/pfx")"
grep_in prefix-text "holds the first 30 query tokens" "$T/out"
# a query that never occurs
check search-none 0 "$FKVF" search "$T/q.fkvf" --tokens 4000000000 --json
grep_in search-none '"exact":{"count":0,' "$T/out"
grep_in search-none-longest '"longest":\[\]' "$T/out"
finish cli_search
