#!/bin/sh
# CLI append / compact / recover on the bundled real sample cache
# (testdata/sample-cache.safetensors, 256 positions): an archive grown in
# many commits restores exactly like one packed in one go, mismatched caches
# are refused with the archive left byte for byte unchanged, compact keeps
# every restored bit, torn tails are refused, reported and recovered.
# usage: cli_append.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
CACHE=$SRC/testdata/sample-cache.safetensors
TRAIN=$SRC/testdata/train-cache.safetensors
. "$(dirname "$0")/cli_lib.sh"
Q="--k 16 --k-stages 2 --v-stages 1"
# json_ok NAME: $T/out is one JSON object (python3 if present, else its
# shape); $T/out is kept for the greps that follow
json_ok() {
    cp "$T/out" "$T/json"
    if command -v python3 >/dev/null 2>&1; then
        check "$1-json" 0 python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$T/json"
    else
        grep_in "$1-json" '^{.*}$' "$T/json"
    fi
    cp "$T/json" "$T/out"
}
# same NAME A B: files identical
same() { check "$1" 0 cmp "$2" "$3"; }
size_of() { wc -c <"$1" | tr -d ' '; }

# help and usage errors
for c in append compact recover; do
    check "$c-help" 0 "$FKVF" $c --help
    grep_in "$c-help-text" "usage: fkvf $c" "$T/out"
    check "$c-noarg" 2 "$FKVF" $c
    check "$c-badopt" 2 "$FKVF" $c --bogus
done
check help-lists 0 "$FKVF" --help
grep_in help-lists-append "append ARCHIVE CACHE" "$T/out"
grep_in help-lists-compact "compact ARCHIVE" "$T/out"
grep_in help-lists-recover "recover ARCHIVE" "$T/out"
check append-one-arg 2 "$FKVF" append "$T/x.fkvf"
check append-create-opt-without-create 2 "$FKVF" append "$T/x.fkvf" "$CACHE" --sinks 2
check append-bad-every 2 "$FKVF" append "$T/x.fkvf" "$CACHE" --commit-every 0
check append-bad-sync 2 "$FKVF" append "$T/x.fkvf" "$CACHE" --sync sometimes
check append-bad-positions 2 "$FKVF" append "$T/x.fkvf" "$CACHE" --positions 9:3
check append-create-both 2 "$FKVF" append --create "$T/x.fkvf" "$CACHE" --train --exact-only
check append-embed-alone 2 "$FKVF" append --create "$T/x.fkvf" "$CACHE" --embed
check compact-noout 2 "$FKVF" compact "$T/x.fkvf"
check append-missing-archive 2 "$FKVF" append "$T/nonexistent.fkvf" "$CACHE"
check append-missing-cache 2 "$FKVF" append "$T/x.fkvf" "$T/nonexistent.safetensors"

# the reference: the whole cache packed in one go with a shared codebook file
check train 0 "$FKVF" train "$TRAIN" -o "$T/cb.fkvf" $Q
check pack-ref 0 "$FKVF" pack "$CACHE" -o "$T/ref.fkvf" --codebooks "$T/cb.fkvf"
check unpack-ref 0 "$FKVF" unpack "$T/ref.fkvf" -o "$T/ref.safetensors"

# create with the first 100 positions, then append in several commits
check create 0 "$FKVF" append --create "$T/a.fkvf" "$CACHE" --codebooks "$T/cb.fkvf" --positions 0:100
grep_in create-msg "created" "$T/out"
grep_in create-count "appended 100 positions" "$T/out"
check create-exists 2 "$FKVF" append --create "$T/a.fkvf" "$CACHE" --codebooks "$T/cb.fkvf"
check append-2 0 "$FKVF" append "$T/a.fkvf" "$CACHE" --positions 100:180 --commit-every 16
grep_in append-2-commits "in 5 commit(s)" "$T/out"
check append-3 0 "$FKVF" append "$T/a.fkvf" "$CACHE" --new --commit-every 7 --sync none --json
json_ok append-3
grep_in append-3-json '"appended":76,"commits":11,"commit_seq":18,"positions":256,"archived":220,"exact":36,"tokens":true' "$T/out"
check append-nothing-new 0 "$FKVF" append "$T/a.fkvf" "$CACHE" --new
grep_in append-nothing-new "appended 0 positions" "$T/out"
check info-a 0 "$FKVF" info "$T/a.fkvf"
grep_in info-a-commits "in 18 commit(s)" "$T/out"
grep_in info-a-positions "256 (220 archived, 36 exact" "$T/out"
check info-a-json 0 "$FKVF" info "$T/a.fkvf" --json
json_ok info-a
grep_in info-a-json '"torn_bytes":0,"commits":18,"positions":256' "$T/out"
check verify-a 0 "$FKVF" verify "$T/a.fkvf"
grep_in verify-a "OK (18 commit(s)" "$T/out"
check unpack-a 0 "$FKVF" unpack "$T/a.fkvf" -o "$T/a.safetensors"
check compare-a 0 "$FKVF" compare "$CACHE" "$T/a.safetensors" --sinks 4 --recent 32 --json
grep_in compare-a-exact '"exact_positions":36,"exact_identical":36,' "$T/out"
grep_in compare-a-tokens '"tokens_identical":true' "$T/out"
# appended in 18 commits == packed in one: the same codes, the same rows
same append-equals-pack "$T/ref.safetensors" "$T/a.safetensors"

# a cache that does not match: clear error, archive byte for byte unchanged
cp "$T/a.fkvf" "$T/a.before"
check unpack-f32 0 "$FKVF" unpack "$T/a.fkvf" -o "$T/f32.safetensors" --dtype f32
check append-dtype 1 "$FKVF" append "$T/a.fkvf" "$T/f32.safetensors"
grep_in append-dtype-msg "f32.safetensors: dtype is f32, the archive .*a.fkvf has f16" "$T/err"
same append-dtype-unchanged "$T/a.fkvf" "$T/a.before"
check unpack-npy 0 "$FKVF" unpack "$T/a.fkvf" -o "$T/x.npy"
# layers 5 x heads 4 -> 4 x 5: same bytes, another shape
LC_ALL=C sed 's/(5, 2, 4, /(4, 2, 5, /' "$T/x.npy" >"$T/y.npy"
check append-shape 1 "$FKVF" append "$T/a.fkvf" "$T/y.npy"
grep_in append-shape-msg "y.npy: layers is 4, the archive .*a.fkvf has 5" "$T/err"
same append-shape-unchanged "$T/a.fkvf" "$T/a.before"
# no token ids for an archive with a token stream (.npy holds none)
check append-no-tokens 1 "$FKVF" append "$T/a.fkvf" "$T/x.npy"
grep_in append-no-tokens-msg "token stream" "$T/err"
same append-no-tokens-unchanged "$T/a.fkvf" "$T/a.before"
check append-range 1 "$FKVF" append "$T/a.fkvf" "$CACHE" --positions 10:300
same append-range-unchanged "$T/a.fkvf" "$T/a.before"
check append-codebook-file-missing 1 "$FKVF" append "$T/a.fkvf" "$CACHE" --codebooks "$T/nonexistent.fkvf" --positions 0:1
same append-nocb-unchanged "$T/a.fkvf" "$T/a.before"

# compact: one commit, smaller, every position restores identically
check compact 0 "$FKVF" compact "$T/a.fkvf" -o "$T/c.fkvf"
grep_in compact-msg "18 commit(s), .* bytes -> .*c.fkvf: 1 commit" "$T/out"
check compact-verify 0 "$FKVF" verify "$T/c.fkvf"
grep_in compact-verify "OK (1 commit(s)" "$T/out"
check compact-unpack 0 "$FKVF" unpack "$T/c.fkvf" -o "$T/c.safetensors"
same compact-identical "$T/a.safetensors" "$T/c.safetensors"
if [ "$(size_of "$T/c.fkvf")" -lt "$(size_of "$T/a.fkvf")" ]; then pass=$((pass + 1)); else
    echo "FAIL compact-smaller: $(size_of "$T/c.fkvf") >= $(size_of "$T/a.fkvf")"; fails=$((fails + 1)); fi
check compact-json 0 "$FKVF" compact "$T/a.fkvf" -o "$T/c2.fkvf" --json
json_ok compact
grep_in compact-json '"commits_before":18,"commits":1,"positions":256,"archived":220,"exact":36' "$T/out"
same compact-deterministic "$T/c.fkvf" "$T/c2.fkvf"
check compact-self 2 "$FKVF" compact "$T/a.fkvf" -o "$T/a.fkvf"
same compact-self-unchanged "$T/a.fkvf" "$T/a.before"
cp "$T/a.fkvf" "$T/ip.fkvf"
check compact-in-place 0 "$FKVF" compact "$T/ip.fkvf" --in-place
same compact-in-place-bytes "$T/ip.fkvf" "$T/c.fkvf"
# the external codebook is needed for its shape: next to the archive, or --codebooks
mkdir "$T/sub"
cp "$T/a.fkvf" "$T/sub/a.fkvf"
check compact-no-codebook 1 "$FKVF" compact "$T/sub/a.fkvf" -o "$T/sub/c.fkvf"
grep_in compact-no-codebook-msg "pass --codebooks FILE" "$T/err"
check compact-codebooks 0 "$FKVF" compact "$T/sub/a.fkvf" -o "$T/sub/c.fkvf" --codebooks "$T/cb.fkvf"
same compact-codebooks-bytes "$T/sub/c.fkvf" "$T/c.fkvf"
# a compacted archive takes further appends
check compact-append 0 "$FKVF" append "$T/c.fkvf" "$TRAIN" --positions 0:40 --commit-every 13
check compact-append-verify 0 "$FKVF" verify "$T/c.fkvf"
check append-more 0 "$FKVF" append "$T/a.fkvf" "$TRAIN" --positions 0:40 --commit-every 13
check unpack-more-a 0 "$FKVF" unpack "$T/a.fkvf" -o "$T/ma.safetensors"
check unpack-more-c 0 "$FKVF" unpack "$T/c.fkvf" -o "$T/mc.safetensors"
same append-after-compact-identical "$T/ma.safetensors" "$T/mc.safetensors"

# embedded codebooks (trained by --create), ngon codec, compact of those
check create-train 0 "$FKVF" append --create "$T/e.fkvf" "$CACHE" $Q --codec ngon --positions 0:50 --recent 16 --sinks 2
check append-e 0 "$FKVF" append "$T/e.fkvf" "$CACHE" --new --commit-every 40
check verify-e 0 "$FKVF" verify "$T/e.fkvf"
check info-e-json 0 "$FKVF" info "$T/e.fkvf" --json
grep_in info-e-ngon '"profile":"ngon"' "$T/out"
check compact-e 0 "$FKVF" compact "$T/e.fkvf" -o "$T/ec.fkvf"
check unpack-e 0 "$FKVF" unpack "$T/e.fkvf" -o "$T/e.npz"
check unpack-ec 0 "$FKVF" unpack "$T/ec.fkvf" -o "$T/ec.npz"
same compact-e-identical "$T/e.npz" "$T/ec.npz"
check compare-e 0 "$FKVF" compare "$CACHE" "$T/e.npz" --sinks 2 --recent 16
grep_in compare-e "18 of 18 bit-identical" "$T/out"
# every position exact (no codebook)
check create-exact 0 "$FKVF" append --create "$T/x.fkvf" "$CACHE" --exact-only --commit-every 100 --no-tokens
check unpack-x 0 "$FKVF" unpack "$T/x.fkvf" -o "$T/x.safetensors"
check compare-x 0 "$FKVF" compare "$CACHE" "$T/x.safetensors" --sinks 256 --recent 0
grep_in compare-x "256 of 256 bit-identical" "$T/out"

# torn tails: cut inside the last commit
cp "$T/a.fkvf" "$T/t.fkvf"
n=$(size_of "$T/t.fkvf")
head -c $((n - 100)) "$T/a.fkvf" >"$T/t.fkvf"
cp "$T/t.fkvf" "$T/t.before"
check info-torn 0 "$FKVF" info "$T/t.fkvf"
grep_in info-torn "TORN TAIL: .* bytes after commit" "$T/out"
grep_in info-torn-hint "run fkvf recover" "$T/out"
check verify-torn 1 "$FKVF" verify "$T/t.fkvf"
grep_in verify-torn-hint "recoverable: run fkvf recover" "$T/err"
check verify-torn-json 1 "$FKVF" verify "$T/t.fkvf" --json
json_ok verify-torn
grep_in verify-torn-json '"recoverable_torn_tail":true' "$T/out"
grep_in verify-torn-json-bytes '"torn_bytes":[1-9][0-9]*,' "$T/out"
grep_in verify-torn-json-commit '"commit_served":' "$T/out"
check append-torn 1 "$FKVF" append "$T/t.fkvf" "$CACHE" --positions 0:4
grep_in append-torn-msg "torn tail" "$T/err"
same append-torn-unchanged "$T/t.fkvf" "$T/t.before"
check recover-dry 0 "$FKVF" recover "$T/t.fkvf" --dry-run
grep_in recover-dry "would remove" "$T/out"
same recover-dry-unchanged "$T/t.fkvf" "$T/t.before"
check recover 0 "$FKVF" recover "$T/t.fkvf" --json
json_ok recover
grep_in recover-json '"action":"truncated","torn_bytes":[1-9]' "$T/out"
check verify-recovered 0 "$FKVF" verify "$T/t.fkvf"
check recover-clean 0 "$FKVF" recover "$T/t.fkvf"
grep_in recover-clean "clean" "$T/out"
cp "$T/t.fkvf" "$T/t.clean"
check recover-clean-json 0 "$FKVF" recover "$T/t.fkvf" --json
grep_in recover-clean-json '"action":"none"' "$T/out"
same recover-clean-unchanged "$T/t.fkvf" "$T/t.clean"
# the recovered file serves the last complete commit; appending continues
check append-recovered 0 "$FKVF" append "$T/t.fkvf" "$CACHE" --positions 0:4
check verify-append-recovered 0 "$FKVF" verify "$T/t.fkvf"
# --recover on append does both in one go
cp "$T/t.before" "$T/t2.fkvf"
check append-recover 0 "$FKVF" append "$T/t2.fkvf" "$CACHE" --positions 0:4 --recover
grep_in append-recover "recovered" "$T/out"
same append-recover-equals "$T/t.fkvf" "$T/t2.fkvf"
# not an FKVF file at all
printf 'not an archive, just text that is long enough to look at\n' >"$T/junk.fkvf"
check recover-junk 1 "$FKVF" recover "$T/junk.fkvf"
grep_in recover-junk-msg "not an FKVF file" "$T/err"
check recover-missing 2 "$FKVF" recover "$T/nonexistent.fkvf"
check append-junk 1 "$FKVF" append "$T/junk.fkvf" "$CACHE"

# compact rebuilds the search indexes (spec 20) of an indexed archive in its
# one commit, after the stream segments (else they would be stale, 20.4)
check zx-create 0 "$FKVF" append --create "$T/zx.fkvf" "$CACHE" --codebooks "$T/cb.fkvf" --positions 0:100
check zx-index 0 "$FKVF" index "$T/zx.fkvf"
check zx-more 0 "$FKVF" append "$T/zx.fkvf" "$CACHE" --positions 100:200 --commit-every 16
check zx-compact 0 "$FKVF" compact "$T/zx.fkvf" -o "$T/zxc.fkvf"
grep_in zx-compact-msg "search index(es) rebuilt" "$T/out"
check zx-verify 0 "$FKVF" verify "$T/zxc.fkvf" --json
grep_in zx-verify-commits '"commits":1' "$T/out"
"$FKVF" dump "$T/zx.fkvf" >"$T/zx.dump"; "$FKVF" dump "$T/zxc.fkvf" >"$T/zxc.dump"
n_in=$(grep ZIDX "$T/zx.dump" | wc -l); n_out=$(grep ZIDX "$T/zxc.dump" | wc -l)
if [ "$n_in" -gt 0 ] && [ "$n_in" = "$n_out" ]; then pass=$((pass + 1)); else echo "FAIL zx-count: $n_in ZIDX in, $n_out out"; fails=$((fails + 1)); fi
# the rebuilt index covers all 200 positions (the old one only the first 96)
check zx-search 0 "$FKVF" search "$T/zxc.fkvf" --tokens 1 --json
grep_in zx-search-covered '"n_indexed":200' "$T/out"
cp "$T/out" "$T/zx.idx.json"
check zx-search-scan 0 "$FKVF" search "$T/zxc.fkvf" --tokens 1 --json --no-index
sed 's/"n_indexed":[0-9]*//' "$T/zx.idx.json" >"$T/a.j"; sed 's/"n_indexed":[0-9]*//' "$T/out" >"$T/b.j"
same zx-search-same "$T/a.j" "$T/b.j"

# fkvf verify --codebooks: an archive that refers to an external codebook is
# checked against the file (hash, shape, index symbols below k)
check verify-cb 0 "$FKVF" verify "$T/zxc.fkvf" --codebooks "$T/cb.fkvf"
check verify-cb-missing 1 "$FKVF" verify "$T/zxc.fkvf" --codebooks "$T/nonexistent-cb.fkvf"
check verify-cb-wrong-train 0 "$FKVF" train "$TRAIN" -o "$T/cb-other.fkvf" $Q --seed 9
check verify-cb-wrong 1 "$FKVF" verify "$T/zxc.fkvf" --codebooks "$T/cb-other.fkvf"
grep_in verify-cb-wrong-msg "FKVF_E_CODEBOOK" "$T/err"
check verify-cb-none 0 "$FKVF" verify "$T/zxc.fkvf" --codebooks ""
check verify-cb-noarg 2 "$FKVF" verify "$T/zxc.fkvf" --codebooks

finish cli_append
