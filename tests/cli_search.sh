#!/bin/sh
# CLI search / context / index / plot on archives packed from the bundled
# real sample cache (testdata/sample-cache.safetensors, with token ids):
# answers against the decoded stream, identical with and without an index,
# the index commit verifies, a second 'fkvf index' leaves the file unchanged,
# occurrences printed as [first, end), symbols outside the alphabet refused,
# PNG output (valid, of the stated size, title and legend drawn, query
# matches ringed in the cell or disc of their last symbol), usage errors.
# usage: cli_search.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
CACHE=$SRC/testdata/sample-cache.safetensors
. "$(dirname "$0")/cli_lib.sh"
PNG=$(dirname "$0")/png_check.py
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

check pack-quad 0 "$FKVF" pack "$CACHE" -o "$T/q.fkvf" $Q --no-index
check pack-ngon 0 "$FKVF" pack "$CACHE" -o "$T/n.fkvf" $Q --codec ngon --no-index
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
    # an occurrence is the positions it covers, [first, end): 91..100
    grep_in "search-$a-exact" '"matches":\[.*{"first":91,"end":101}' "$T/out"
    grep_in "search-$a-longest" '{"first":91,"end":101,"length":10}' "$T/out"
    cnt=$(sed -n 's/.*"exact":{"count":\([0-9]*\).*/\1/p' "$T/out")
    grep_in "search-$a-radius" "\"verified\":$cnt," "$T/out"
    sed 's/"n_indexed":[0-9]*,//' "$T/out" >"$T/before-$a"
    check "search-$a-text" 0 "$FKVF" search "$T/$a.fkvf" --tokens "$CTX"
    grep_in "search-$a-text-query" "^query       10 tokens: $CTX\$" "$T/out"
    grep_in "search-$a-text-exact" '^exact       [0-9]* occurrences*, positions \[first, end):.* \[91, 101)' "$T/out"
    grep_in "search-$a-text-longest" '^  \[91, 101) *10 tokens (the whole query)$' "$T/out"
    # an index stream query, before the index
    "$FKVF" context "$T/$a.fkvf" --at 150 --len 3 --stream L2.H1.K.1 >"$T/ictx"
    check "search-$a-stream" 0 "$FKVF" search "$T/$a.fkvf" --stream L2.H1.K.1 --symbols "$(cat "$T/ictx")" --k 4 --context 3 --json
    grep_in "search-$a-stream-found" '"matches":\[.*{"first":148,"end":151}' "$T/out"
    sed 's/"n_indexed":[0-9]*,//' "$T/out" >"$T/sbefore-$a"
    # symbols outside the stream's alphabet (k = 16) are a usage error
    check "search-$a-alphabet" 2 "$FKVF" search "$T/$a.fkvf" --stream L2.H1.K.1 --symbols 3,16
    grep_in "search-$a-alphabet-msg" "symbol 16 (item 2 of the query) is outside stream L2.H1.K.1's alphabet 0..15" "$T/err"
    check "search-$a-alphabet-top" 0 "$FKVF" search "$T/$a.fkvf" --stream L2.H1.K.1 --symbols 3,15
    grep_in "search-$a-alphabet-text" '^stream      L2.H1.K.1: 220 positions (cache positions 4..223), no index (scan)$' "$T/out"

    # index: one new commit, valid, same answers
    check "index-$a" 0 "$FKVF" index "$T/$a.fkvf" --no-sync
    grep_in "index-$a-msg" "indexed 61 streams" "$T/out"
    # a second run finds every index current: no commit, the file unchanged
    cp "$T/$a.fkvf" "$T/$a-once.fkvf"
    check "index-$a-again" 0 "$FKVF" index "$T/$a.fkvf" --no-sync
    grep_in "index-$a-again-msg" "nothing to do, the file is unchanged; 61 streams already have a current index" "$T/out"
    check "index-$a-again-same" 0 cmp "$T/$a.fkvf" "$T/$a-once.fkvf"
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
    grep_in "index-$a-one-json" '"streams":0,"entries":0,"bytes":0,"current":1,"too_short":0,"changed":false' "$T/out"
    check "index-$a-one-same" 0 cmp "$T/$a.fkvf" "$T/$a-once.fkvf"
    check "verify-$a-2" 0 "$FKVF" verify "$T/$a.fkvf"
    check "index-$a-nosuch" 1 "$FKVF" index "$T/$a.fkvf" --stream L99.H0.K.0
    # the stream that does not exist is named; a stream named twice is one
    check "index-$a-nosuch2" 1 "$FKVF" index "$T/$a.fkvf" --stream tokens --stream L99.H0.K.0
    grep_in "index-$a-nosuch2-msg" "no stream L99.H0.K.0 in the archive" "$T/err"
    check "index-$a-twice" 0 "$FKVF" index "$T/$a.fkvf" --stream tokens --stream tokens --no-sync --json
    grep_in "index-$a-twice-json" '"streams":0,"entries":0,"bytes":0,"current":1,' "$T/out"

    # plot: a valid PNG (every CRC, the pixels: tests/png_check.py) of the
    # stated size, with a title and a legend
    check "plot-$a" 0 "$FKVF" plot "$T/$a.fkvf" --stream L0.H0.K.0 -o "$T/$a.png" --size 64
    grep_in "plot-$a-msg" "^$T/$a.png: 210x130 pixels (plot 64x64 at 42,32), 220 points of L0.H0.K.0" "$T/out"
    check "plot-$a-valid" 0 python3 "$PNG" size "$T/$a.png"
    grep_in "plot-$a-size" "^210 130\$" "$T/out"
    check "plot-$a-tokens" 0 "$FKVF" plot "$T/$a.fkvf" --stream tokens -o "$T/$a-t.png"
    grep_in "plot-$a-tokens-msg" "804x644 pixels (plot 512x512 at 84,64), 256 points of tokens" "$T/out"
    check "plot-$a-tokens-valid" 0 python3 "$PNG" size "$T/$a-t.png"
    grep_in "plot-$a-tokens-size" "^804 644\$" "$T/out"
    check "plot-$a-title" 0 python3 "$PNG" ink "$T/$a-t.png" 0 0 804 30
    check "plot-$a-legend" 0 python3 "$PNG" ink "$T/$a-t.png" 600 64 804 576
    check "plot-$a-below" 0 python3 "$PNG" ink "$T/$a-t.png" 84 580 596 644
    # the matches of a query: rings in the cell (quad) or disc (ngon) of its
    # last symbol, placed by png_check.py from the spec, nowhere else
    sym=$("$FKVF" context "$T/$a.fkvf" --stream L0.H0.K.0 --at 100 --len 1)
    nmatch=$("$FKVF" search "$T/$a.fkvf" --stream L0.H0.K.0 --symbols "$sym" --json | sed -n 's/.*"exact":{"count":\([0-9]*\).*/\1/p')
    check "plot-$a-base" 0 "$FKVF" plot "$T/$a.fkvf" --stream L0.H0.K.0 -o "$T/$a-base.png" --size 256
    check "plot-$a-hl" 0 "$FKVF" plot "$T/$a.fkvf" --stream L0.H0.K.0 -o "$T/$a-hl.png" --size 256 --highlight-symbols "$sym"
    grep_in "plot-$a-hl-count" ", $nmatch match\(es\)\{0,1\} highlighted\$" "$T/out"
    if [ $a = q ]; then
        set -- $(python3 "$PNG" quadcell 42 32 256 4 "$sym")
    else
        r=$("$FKVF" info "$T/$a.fkvf" | sed -n 's/.*L0.H0.K.0 *ngon N=16 r=\([0-9.e-]*\).*/\1/p')
        set -- $(python3 "$PNG" ngondisc 42 32 256 16 "$r" "$sym")
    fi
    check "plot-$a-hl-where" 0 python3 "$PNG" diff "$T/$a-base.png" "$T/$a-hl.png" 42 32 298 288 $(($1 - 10)) $(($2 - 10)) $(($3 + 10)) $(($4 + 10)) 0 190 60
    check "plot-$a-hl-legend" 0 python3 "$PNG" ink "$T/$a-hl.png" 300 32 402 288
    check "plot-$a-hl-alphabet" 2 "$FKVF" plot "$T/$a.fkvf" --stream L0.H0.K.0 -o "$T/$a-x.png" --highlight-symbols 16
done
# index one stream, then all: only the others are indexed
check pack-part 0 "$FKVF" pack "$CACHE" -o "$T/part.fkvf" $Q --no-index
check index-part-tokens 0 "$FKVF" index "$T/part.fkvf" --stream tokens --no-sync --json
grep_in index-part-tokens-json '"streams":1,"entries":256,' "$T/out"
check index-part-all 0 "$FKVF" index "$T/part.fkvf" --no-sync
grep_in index-part-all-msg "indexed 60 streams .*; 1 stream already has a current index" "$T/out"
check index-part-info 0 "$FKVF" info "$T/part.fkvf"
grep_in index-part-commits "in 3 commit" "$T/out"
check index-part-verify 0 "$FKVF" verify "$T/part.fkvf"
# an archive that grew past its index is indexed again; then current again
check grow-create 0 "$FKVF" append --create "$T/g.fkvf" "$CACHE" --exact-only --positions 0:100
check grow-index 0 "$FKVF" index "$T/g.fkvf" --no-sync --json
grep_in grow-index-json '"streams":1,' "$T/out"
check grow-append 0 "$FKVF" append "$T/g.fkvf" "$CACHE" --new
check grow-reindex 0 "$FKVF" index "$T/g.fkvf" --no-sync --json
grep_in grow-reindex-json '"streams":1,"entries":256,.*"changed":true' "$T/out"
cp "$T/g.fkvf" "$T/g-once.fkvf"
check grow-again 0 "$FKVF" index "$T/g.fkvf" --no-sync
check grow-again-same 0 cmp "$T/g.fkvf" "$T/g-once.fkvf"
check grow-search 0 "$FKVF" search "$T/g.fkvf" --tokens "$(cat "$T/ctx100")" --json
grep_in grow-search-indexed '"n_indexed":256' "$T/out"
check plot-bad-size 2 "$FKVF" plot "$T/q.fkvf" --stream tokens -o "$T/x.png" --size 3
check plot-small 2 "$FKVF" plot "$T/q.fkvf" --stream tokens -o "$T/x.png" --size 63
check plot-large 2 "$FKVF" plot "$T/q.fkvf" --stream tokens -o "$T/x.png" --size 4097
# the output must be a .png name (any case); nothing is written otherwise
check plot-not-png 2 "$FKVF" plot "$T/q.fkvf" --stream tokens -o "$T/x.jpg"
grep_in plot-not-png-msg "x.jpg: the output is a PNG image: give a name ending in .png" "$T/err"
[ ! -e "$T/x.jpg" ] && pass=$((pass + 1)) || { echo "FAIL plot-not-png-file: $T/x.jpg written"; fails=$((fails + 1)); }
check plot-no-ext 2 "$FKVF" plot "$T/q.fkvf" --stream tokens -o "$T/png"
check plot-dot-png 2 "$FKVF" plot "$T/q.fkvf" --stream tokens -o "$T/.png"
check plot-upper 0 "$FKVF" plot "$T/q.fkvf" --stream tokens -o "$T/X.PNG" --size 64
# a control character in the output name is escaped on the terminal
check plot-ctl-name 0 "$FKVF" plot "$T/q.fkvf" --stream tokens -o "$T/$(printf 'ctl\001.png')" --size 64
grep_in plot-ctl-name-escaped 'ctl\\x01.png: 210x130 pixels' "$T/out"
check plot-both-hl 2 "$FKVF" plot "$T/q.fkvf" --stream tokens -o "$T/x.png" --highlight-tokens 1 --highlight-symbols 1
# a token query on an index stream: the point of each matched cache position
# (n_sinks + t) the stream holds; here one match, at cache position 130
"$FKVF" context "$T/q.fkvf" --at 130 --len 4 >"$T/tq"
check plot-hl-tokens-count 0 "$FKVF" search "$T/q.fkvf" --tokens "$(cat "$T/tq")" --json
grep_in plot-hl-tokens-one '"exact":{"count":1,.*{"first":127,"end":131}' "$T/out"
check plot-hl-tokens 0 "$FKVF" plot "$T/q.fkvf" --stream L0.H0.K.0 -o "$T/q-ht.png" --size 256 --highlight-tokens "$(cat "$T/tq")"
grep_in plot-hl-tokens-msg ", 1 match highlighted\$" "$T/out"
set -- $(python3 "$PNG" quadcell 42 32 256 4 "$("$FKVF" context "$T/q.fkvf" --stream L0.H0.K.0 --at 126 --len 1)")
check plot-hl-tokens-where 0 python3 "$PNG" diff "$T/q-base.png" "$T/q-ht.png" 42 32 298 288 $(($1 - 10)) $(($2 - 10)) $(($3 + 10)) $(($4 + 10)) 0 190 60
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
# pack indexes the token stream by default (a second commit, ZPOS: 4 bytes a
# position); --no-index writes one commit; the same answers either way
check pack-default 0 "$FKVF" pack "$CACHE" -o "$T/pd.fkvf" $Q --json
grep_in pack-default-json '"indexed":true' "$T/out"
check pack-default-info 0 "$FKVF" info "$T/pd.fkvf"
grep_in pack-default-commits "in 2 commit" "$T/out"
grep_in pack-default-info-index '^search index    1088 bytes (in other), 256 positions indexed in effect (4.25 B/position)$' "$T/out"
check pack-default-info-json 0 "$FKVF" info "$T/pd.fkvf" --json
grep_in pack-default-info-json-index '"search_index":1088,"search_index_positions":256' "$T/out"
check pack-default-dump 0 "$FKVF" dump "$T/pd.fkvf"
n=$(grep -c ZPOS "$T/out"); z=$(grep -c ZIDX "$T/out")
[ "$n" = 1 ] && [ "$z" = 0 ] && pass=$((pass + 1)) || { echo "FAIL pack-default-zpos: $n ZPOS, $z ZIDX"; fails=$((fails + 1)); }
check pack-default-verify 0 "$FKVF" verify "$T/pd.fkvf"
check pack-default-search 0 "$FKVF" search "$T/pd.fkvf" --tokens "$(cat "$T/ctx100")" --radius auto --json
grep_in pack-default-used '"n_indexed":256' "$T/out"
sed 's/"n_indexed":[0-9]*,//' "$T/out" >"$T/pd-out"
check pack-default-same 0 cmp "$T/before-q" "$T/pd-out"
check pack-noindex 0 "$FKVF" pack "$CACHE" -o "$T/pn.fkvf" $Q --no-index --json
grep_in pack-noindex-json '"indexed":false' "$T/out"
check pack-noindex-info 0 "$FKVF" info "$T/pn.fkvf"
grep_in pack-noindex-commits "in 1 commit" "$T/out"
grep_in pack-noindex-info-index '^search index    none' "$T/out"
check pack-noindex-info-json 0 "$FKVF" info "$T/pn.fkvf" --json
grep_in pack-noindex-info-json-index '"search_index":0,"search_index_positions":0' "$T/out"
check pack-noindex-search 0 "$FKVF" search "$T/pn.fkvf" --tokens "$(cat "$T/ctx100")" --radius auto --json
grep_in pack-noindex-scan '"n_indexed":0' "$T/out"
# the index costs <= 8 bytes per indexed position, its commit included
sd=$(wc -c <"$T/pd.fkvf"); sn=$(wc -c <"$T/pn.fkvf")
if [ $((sd - sn)) -gt 0 ] && [ $((sd - sn)) -le $((8 * 256)) ]; then pass=$((pass + 1)); else echo "FAIL pack-index-size: $sd - $sn bytes for 256 positions"; fails=$((fails + 1)); fi
# the index of the default equals what 'fkvf index --stream tokens' writes
check pack-noindex-then-index 0 "$FKVF" index "$T/pn.fkvf" --stream tokens --no-sync --json
grep_in pack-noindex-then-index-json '"streams":1,"entries":256,"bytes":1088,' "$T/out"
check pack-default-same-bytes 0 cmp "$T/pd.fkvf" "$T/pn.fkvf"
# prefix reuse: the archive's own first tokens as a prompt
"$FKVF" context "$T/q.fkvf" --at 29 --len 30 >"$T/pfx"
check prefix 0 "$FKVF" search "$T/q.fkvf" --tokens "$(cat "$T/pfx"),4000000000" --json
grep_in prefix-json '"prefix_len":30' "$T/out"
check prefix-text 0 "$FKVF" search "$T/q.fkvf" --tokens "$(cat "$T/pfx"),4000000000"
grep_in prefix-text "^prefix      the query's first 30 tokens match the archive's positions \[0, 30): 30 reusable cache rows$" "$T/out"
check prefix-one 0 "$FKVF" search "$T/q.fkvf" --tokens "$(cut -d, -f1 "$T/pfx")"
grep_in prefix-one "^query       1 token: [0-9]*$" "$T/out"
grep_in prefix-one-text "^prefix      the whole query (1 token) matches the archive's positions \[0, 1): 1 reusable cache row$" "$T/out"
# a query that never occurs
check search-none 0 "$FKVF" search "$T/q.fkvf" --tokens 4000000000 --json
grep_in search-none '"exact":{"count":0,' "$T/out"
grep_in search-none-longest '"longest":\[\]' "$T/out"
grep_in search-none-note "note: .*q.fkvf: token 4000000000 (item 1 of the query) is above the token stream's width (0..[0-9]*)" "$T/err"
check search-none-text 0 "$FKVF" search "$T/q.fkvf" --tokens 4000000000
grep_in search-none-exact "^exact       0 occurrences$" "$T/out"
grep_in search-none-prefix "^prefix      none: the query's first token is not the archive's first token" "$T/out"
# an embedded codebook bounds index symbols by its k (32 < the 6-bit alphabet)
check pack-k32 0 "$FKVF" pack "$CACHE" -o "$T/k32.fkvf" --train --k 32 --k-stages 1 --v-stages 1
check search-k32 2 "$FKVF" search "$T/k32.fkvf" --stream L0.H0.K.0 --symbols 32
grep_in search-k32-msg "symbol 32 (item 1 of the query) is outside stream L0.H0.K.0's alphabet 0..31, the codebook's k" "$T/err"
check search-k32-ok 0 "$FKVF" search "$T/k32.fkvf" --stream L0.H0.K.0 --symbols 31
finish cli_search
