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
check create 0 "$FKVF" append --create "$T/a.fkvf" "$CACHE" --codebooks "$T/cb.fkvf" --positions 0:100 --no-auto-compact
grep_in create-msg "created" "$T/out"
grep_in create-count "appended 100 positions" "$T/out"
check create-exists 1 "$FKVF" append --create "$T/a.fkvf" "$CACHE" --codebooks "$T/cb.fkvf"
check append-2 0 "$FKVF" append "$T/a.fkvf" "$CACHE" --positions 100:180 --commit-every 16 --no-auto-compact
grep_in append-2-commits "in 5 commit(s)" "$T/out"
check append-3 0 "$FKVF" append "$T/a.fkvf" "$CACHE" --new --commit-every 7 --sync none --json --no-auto-compact
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
# (as .npz: pack keeps the cache's safetensors __metadata__, append does not)
check unpack-ref-npz 0 "$FKVF" unpack "$T/ref.fkvf" -o "$T/ref.npz"
check unpack-a-npz 0 "$FKVF" unpack "$T/a.fkvf" -o "$T/a.npz"
same append-equals-pack "$T/ref.npz" "$T/a.npz"

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
check append-codebook-file-missing 2 "$FKVF" append "$T/a.fkvf" "$CACHE" --codebooks "$T/nonexistent.fkvf" --positions 0:1
same append-nocb-unchanged "$T/a.fkvf" "$T/a.before"

# a cache's position p is sequence position p (issue 12, item 3): an append
# continues the archive at the cache position equal to its count N; an
# overlap or a gap is refused (exit 1, archive untouched, the message says
# what the archive holds and what to pass) unless --continues
check pr-create 0 "$FKVF" append --create "$T/pr.fkvf" "$CACHE" --codebooks "$T/cb.fkvf" --positions 0:50
cp "$T/pr.fkvf" "$T/pr.before"
check pr-overlap 1 "$FKVF" append "$T/pr.fkvf" "$CACHE" --positions 40:60
grep_in pr-overlap-holds "fkvf append: $CACHE: --positions starts at cache position 40, but the archive $T/pr.fkvf holds positions 0..49: cache positions 40..49 are in it already (an overlap)" "$T/err"
grep_in pr-overlap-next "must start at cache position 50: append what is new with --positions 50:B (or --new)" "$T/err"
grep_in pr-overlap-continues "cache position 40 becomes position 50), add --continues" "$T/err"
same pr-overlap-unchanged "$T/pr.fkvf" "$T/pr.before"
check pr-gap 1 "$FKVF" append "$T/pr.fkvf" "$CACHE" --positions 60:70
grep_in pr-gap-msg "positions 50..59 would be missing (a gap)" "$T/err"
same pr-gap-unchanged "$T/pr.fkvf" "$T/pr.before"
check pr-plain 1 "$FKVF" append "$T/pr.fkvf" "$CACHE"
grep_in pr-plain-msg "the whole cache (positions 0..255) would follow them" "$T/err"
same pr-plain-unchanged "$T/pr.fkvf" "$T/pr.before"
check pr-overlap-json 1 "$FKVF" append "$T/pr.fkvf" "$CACHE" --positions 40:60 --json
cp "$T/out" "$T/pr.json"
check pr-overlap-json-error 0 /usr/bin/python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))["error"]
assert e["name"] == "FKVF_E_RANGE" and e["code"] == 5 and e["class"] == "input", e
assert e["file"] == sys.argv[2] and "--continues" in e["message"], e
' "$T/pr.json" "$CACHE"
# the cache position equal to the archive's count: accepted
check pr-aligned 0 "$FKVF" append "$T/pr.fkvf" "$CACHE" --positions 50:60 --json
cp "$T/pr.fkvf" "$T/pr3.fkvf"
cp "$T/out" "$T/pr.json"
check pr-aligned-json 0 /usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["first"] == 50 and d["archive_first"] == 50 and d["continues"] is False, d
assert d["appended"] == 10 and d["positions"] == 60, d
' "$T/pr.json"
# --continues: the cache's positions 0..9 are new ones, archive positions 60..69
check pr-continues 0 "$FKVF" append "$T/pr.fkvf" "$CACHE" --positions 0:10 --continues --json
grep_in pr-continues-note "warning: .*cache positions 0..9 become positions 60..69 of .*pr.fkvf; keys are un-rotated at the archive's positions" "$T/err"
cp "$T/out" "$T/pr.json"
check pr-continues-json 0 /usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["first"] == 0 and d["archive_first"] == 60 and d["continues"] is True, d
assert d["positions"] == 70, d
' "$T/pr.json"
# --new follows the archive's count, the cache holding the sequence so far
check pr-new 0 "$FKVF" append "$T/pr3.fkvf" "$CACHE" --new
grep_in pr-new-msg "appended 196 positions (60..255 of" "$T/out"
# ... which pr.fkvf is not any more: its positions 60..69 are the cache's 0..9
cp "$T/pr.fkvf" "$T/pr.before"
check pr-new-after-continues 1 "$FKVF" append "$T/pr.fkvf" "$CACHE" --new
grep_in pr-new-after-continues-msg "token id [0-9]* at cache position 60, the archive $T/pr.fkvf has token id [0-9]* at position 60: the cache is not the sequence the archive holds (its positions 0..69 must be the archive's" "$T/err"
same pr-new-after-continues-unchanged "$T/pr.fkvf" "$T/pr.before"
# usage: an empty range, --new with --continues
check pr-empty-range 2 "$FKVF" append "$T/pr.fkvf" "$CACHE" --positions 10:10
check pr-new-continues 2 "$FKVF" append "$T/pr.fkvf" "$CACHE" --new --continues
# --create: the cache's first appended position is the archive's position 0
check pr-create-offset 1 "$FKVF" append --create "$T/pr2.fkvf" "$CACHE" --exact-only --positions 10:20
grep_in pr-create-offset-msg "holds no positions yet" "$T/err"
if [ -e "$T/pr2.fkvf" ]; then echo "FAIL pr-create-offset: the archive was created"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
check pr-create-continues 0 "$FKVF" append --create "$T/pr2.fkvf" "$CACHE" --exact-only --positions 10:20 --continues
grep_in pr-create-continues-msg "now 10 positions" "$T/out"

# --new and --positions N: continue the archive's sequence: the cache's
# token ids 0..N-1 must be the archive's (train-cache is another sequence:
# its position 0 is BOS too, position 1 differs); --continues overlaps nothing
check tok-create 0 "$FKVF" append --create "$T/tok.fkvf" "$CACHE" --exact-only --positions 0:50
cp "$T/tok.fkvf" "$T/tok2.fkvf"
cp "$T/tok.fkvf" "$T/tok.before"
check tok-new 1 "$FKVF" append "$T/tok.fkvf" "$TRAIN" --new
grep_in tok-new-msg "fkvf append: $TRAIN: token id 306 at cache position 1, the archive $T/tok.fkvf has token id 356 at position 1: the cache is not the sequence the archive holds (its positions 0..49 must be the archive's" "$T/err"
grep_in tok-new-hint "nothing appended. If the cache's positions are new ones that continue the archive, add --continues" "$T/err"
same tok-new-unchanged "$T/tok.fkvf" "$T/tok.before"
check tok-positions 1 "$FKVF" append "$T/tok.fkvf" "$TRAIN" --positions 50:
grep_in tok-positions-msg "token id 306 at cache position 1" "$T/err"
check tok-positions-json 1 "$FKVF" append "$T/tok.fkvf" "$TRAIN" --positions 50:60 --json
cp "$T/out" "$T/tok.json"
check tok-positions-json-error 0 /usr/bin/python3 -c '
import json, sys
e = json.load(open(sys.argv[1]))["error"]
assert e["name"] == "FKVF_E_INVALID_ARG" and e["class"] == "input", e
assert e["file"] == sys.argv[2] and "cache position 1" in e["message"], e
' "$T/tok.json" "$TRAIN"
same tok-positions-unchanged "$T/tok.fkvf" "$T/tok.before"
# nothing new (a 50-position cache of the other sequence), still not the
# archive's sequence: refused too
check tok-cut 0 "$FKVF" append --create "$T/tok50.fkvf" "$TRAIN" --exact-only --positions 0:50
check tok-cut-unpack 0 "$FKVF" unpack "$T/tok50.fkvf" -o "$T/tok50.safetensors"
check tok-nothing-new 1 "$FKVF" append "$T/tok.fkvf" "$T/tok50.safetensors" --new
grep_in tok-nothing-new-msg "token id 306 at cache position 1" "$T/err"
same tok-nothing-new-unchanged "$T/tok.fkvf" "$T/tok.before"
# --continues: the cache's positions are new ones, no overlap to compare
check tok-continues 0 "$FKVF" append "$T/tok.fkvf" "$TRAIN" --positions 0:10 --continues
grep_in tok-continues-msg "now 60 positions" "$T/out"
# the archive's own sequence: --new appends the rest
check tok-new-same 0 "$FKVF" append "$T/tok2.fkvf" "$CACHE" --new

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
check compact-self 1 "$FKVF" compact "$T/a.fkvf" -o "$T/a.fkvf"
same compact-self-unchanged "$T/a.fkvf" "$T/a.before"
cp "$T/a.fkvf" "$T/ip.fkvf"
chmod 600 "$T/ip.fkvf"
check compact-in-place 0 "$FKVF" compact "$T/ip.fkvf" --in-place
same compact-in-place-bytes "$T/ip.fkvf" "$T/c.fkvf"
# the compacted file keeps the permissions of the one it replaces (a private
# archive stays private whatever the umask)
m=$(stat -c %a "$T/ip.fkvf")
[ "$m" = 600 ] && pass=$((pass + 1)) || { echo "FAIL compact-in-place-mode: $m, want 600"; fails=$((fails + 1)); }
# --in-place through a symbolic link: the file it points to is compacted,
# the link stays the same link (the rename used to replace the link with a
# regular file and leave the target as it was)
mkdir "$T/ln"
cp "$T/a.fkvf" "$T/ln/target.fkvf"
ln -s target.fkvf "$T/ln/link.fkvf"
check compact-link 0 "$FKVF" compact "$T/ln/link.fkvf" --in-place --codebooks "$T/cb.fkvf" --json
grep_in compact-link-out "\"out\":\"[^\"]*/ln/target.fkvf\",\"in_place\":true" "$T/out"
if [ -L "$T/ln/link.fkvf" ] && [ "$(readlink "$T/ln/link.fkvf")" = target.fkvf ]; then pass=$((pass + 1)); else
    echo "FAIL compact-link-still-link: $(ls -l "$T/ln")"; fails=$((fails + 1)); fi
same compact-link-target "$T/ln/target.fkvf" "$T/c.fkvf"
check compact-link-info 0 "$FKVF" info "$T/ln/link.fkvf" --json
grep_in compact-link-commits '"commits":1,' "$T/out"
# the external codebook is needed for its shape: next to the archive, or --codebooks
mkdir "$T/sub"
cp "$T/a.fkvf" "$T/sub/a.fkvf"
check compact-no-codebook 1 "$FKVF" compact "$T/sub/a.fkvf" -o "$T/sub/c.fkvf"
grep_in compact-no-codebook-msg "pass --codebooks FILE" "$T/err"
check compact-codebooks 0 "$FKVF" compact "$T/sub/a.fkvf" -o "$T/sub/c.fkvf" --codebooks "$T/cb.fkvf"
same compact-codebooks-bytes "$T/sub/c.fkvf" "$T/c.fkvf"
# a compacted archive takes further appends
check compact-append 0 "$FKVF" append "$T/c.fkvf" "$TRAIN" --positions 0:40 --commit-every 13 --continues
check compact-append-verify 0 "$FKVF" verify "$T/c.fkvf"
check append-more 0 "$FKVF" append "$T/a.fkvf" "$TRAIN" --positions 0:40 --commit-every 13 --continues
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
# a file another process holds locked (as an appender does, spec 7.4):
# recover, compact --in-place and append all refuse it with the one message
# of the lock they share, exit 2, the file unchanged; a dry run needs no lock
if command -v flock >/dev/null 2>&1; then
    cp "$T/t.before" "$T/lk.fkvf"
    rm -f "$T/lk.ready" "$T/lk.release"
    flock -x "$T/lk.fkvf" sh -c 'touch "$1.ready"; i=0; while [ ! -e "$1.release" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done' sh "$T/lk" &
    lkpid=$!
    i=0; while [ ! -e "$T/lk.ready" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
    for c in "recover" "compact --in-place" "append"; do
        n=$(echo "$c" | tr -d ' -')
        # shellcheck disable=SC2086
        if [ "$c" = append ]; then set -- "$CACHE" --positions 0:4 --continues --recover; else set --; fi
        # shellcheck disable=SC2086
        check "locked-$n" 2 "$FKVF" $c "$T/lk.fkvf" "$@"
        grep_in "locked-$n-msg" "lk.fkvf: cannot lock the file (.*): another appender has it open (spec 7.4)" "$T/err"
        # shellcheck disable=SC2086
        check "locked-$n-json" 2 "$FKVF" $c "$T/lk.fkvf" "$@" --json
        grep_in "locked-$n-json-clause" '"name":"FKVF_E_IO",.*"clause":"7.4"' "$T/out"
        same "locked-$n-unchanged" "$T/lk.fkvf" "$T/t.before"
    done
    check locked-recover-dry 0 "$FKVF" recover "$T/lk.fkvf" --dry-run
    touch "$T/lk.release"
    wait "$lkpid"
    rm -f "$T/lk.fkvf" "$T/lk.ready" "$T/lk.release"
else
    echo "cli_append: locked-file refusals SKIPPED (no flock)"
fi
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
check append-recovered 0 "$FKVF" append "$T/t.fkvf" "$CACHE" --positions 0:4 --continues
check verify-append-recovered 0 "$FKVF" verify "$T/t.fkvf"
# --recover on append does both in one go
cp "$T/t.before" "$T/t2.fkvf"
check append-recover 0 "$FKVF" append "$T/t2.fkvf" "$CACHE" --positions 0:4 --recover --continues
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
n_in=$(grep -E "ZIDX|ZPOS" "$T/zx.dump" | wc -l); n_out=$(grep -E "ZIDX|ZPOS" "$T/zxc.dump" | wc -l)
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
check verify-cb-missing 2 "$FKVF" verify "$T/zxc.fkvf" --codebooks "$T/nonexistent-cb.fkvf"
check verify-cb-wrong-train 0 "$FKVF" train "$TRAIN" -o "$T/cb-other.fkvf" $Q --seed 9
check verify-cb-wrong 1 "$FKVF" verify "$T/zxc.fkvf" --codebooks "$T/cb-other.fkvf"
grep_in verify-cb-wrong-msg "FKVF_E_CODEBOOK" "$T/err"
check verify-cb-none 0 "$FKVF" verify "$T/zxc.fkvf" --codebooks ""
check verify-cb-noarg 2 "$FKVF" verify "$T/zxc.fkvf" --codebooks

# automatic compaction (docs/appending.md): the options, and an archive that
# stays within the ratio of its compaction with the contents of one grown
# without it
check ac-help 0 "$FKVF" append --help
grep_in ac-help-at "--compact-at RATIO" "$T/out"
grep_in ac-help-off "--no-auto-compact" "$T/out"
for bad in 1 0.5 abc -2 1e7; do
    check "ac-bad-$bad" 2 "$FKVF" append "$T/ac.fkvf" "$CACHE" --compact-at "$bad"
done
grep_in ac-bad-msg "--compact-at: '1e7' is not a ratio > 1" "$T/err"
check ac-both 2 "$FKVF" append "$T/ac.fkvf" "$CACHE" --compact-at 1.5 --no-auto-compact
grep_in ac-both-msg "exclude each other" "$T/err"
check ac-create 0 "$FKVF" append --create "$T/ac.fkvf" "$CACHE" --codebooks "$T/cb.fkvf" --positions 0:100 --commit-every 8 --compact-at 1.1
check ac-more 0 "$FKVF" append "$T/ac.fkvf" "$CACHE" --new --commit-every 8 --compact-at 1.1 --sync none --json
grep_in ac-more-json '"positions":256,"archived":220' "$T/out"
check ac-info 0 "$FKVF" info "$T/ac.fkvf" --json
if grep -q '"commits":[0-9],' "$T/out"; then pass=$((pass + 1)); else
    echo "FAIL ac-few-commits: $(grep -o '"commits":[0-9]*' "$T/out")"; fails=$((fails + 1)); fi
check ac-compact 0 "$FKVF" compact "$T/ac.fkvf" -o "$T/acc.fkvf"
if [ "$(size_of "$T/ac.fkvf")" -le $(( $(size_of "$T/acc.fkvf") * 11 / 10 + 1 )) ]; then
    pass=$((pass + 1)); else
    echo "FAIL ac-footprint: $(size_of "$T/ac.fkvf") > 1.1 x $(size_of "$T/acc.fkvf")"; fails=$((fails + 1)); fi
check ac-ref-create 0 "$FKVF" append --create "$T/acr.fkvf" "$CACHE" --codebooks "$T/cb.fkvf" --positions 0:100 --commit-every 8 --no-auto-compact
check ac-ref-more 0 "$FKVF" append "$T/acr.fkvf" "$CACHE" --new --commit-every 8 --no-auto-compact
# the same contents as grown without it: their compactions are the same bytes
check ac-ref-compact 0 "$FKVF" compact "$T/acr.fkvf" -o "$T/acrc.fkvf"
same ac-compactions-same-bytes "$T/acc.fkvf" "$T/acrc.fkvf"
if ls "$T" | grep -q autocompact; then echo "FAIL ac-no-temp: $(ls "$T" | grep autocompact)"; fails=$((fails + 1)); else pass=$((pass + 1)); fi

finish cli_append
