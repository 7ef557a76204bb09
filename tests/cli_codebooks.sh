#!/bin/sh
# CLI: an archive that refers to an external codebook, used from another
# directory (issue 12, item 9). The codebook is found by content hash in the
# archive's directory (name hint first) and in FKVF_CODEBOOK_PATH, by
# unpack, verify, info, append and compact through one helper; one exit
# status (1) for a codebook that is missing or wrong; the messages name the
# hash, the hint and every directory searched.
# usage: cli_codebooks.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
CACHE=$SRC/testdata/sample-cache.safetensors
TRAIN=$SRC/testdata/train-cache.safetensors
. "$(dirname "$0")/cli_lib.sh"
case $FKVF in /*) ;; *) FKVF=$(pwd)/$FKVF ;; esac
case $CACHE in /*) ;; *) CACHE=$(pwd)/$CACHE TRAIN=$(pwd)/$TRAIN ;; esac
Q="--k 16 --k-stages 2 --v-stages 1 --iters 5"
same() { check "$1" 0 cmp "$2" "$3"; }

mkdir "$T/arch" "$T/cbs" "$T/work" "$T/other"
check train 0 "$FKVF" train "$TRAIN" -o "$T/cbs/cb.fkvf" $Q
hash=$(sed -n 's/^content hash \([0-9a-f]*\)$/\1/p' "$T/out")
check train-other 0 "$FKVF" train "$TRAIN" -o "$T/other/cb.fkvf" $Q --seed 9
check pack 0 "$FKVF" pack "$CACHE" -o "$T/arch/a.fkvf" --codebooks "$T/cbs/cb.fkvf"
check unpack-given 0 "$FKVF" unpack "$T/arch/a.fkvf" -o "$T/ref.safetensors" --codebooks "$T/cbs/cb.fkvf"

# from another directory, nothing to find: exit 1, the message names the
# hash, the name hint and the directory searched
cd "$T/work" || exit 2
check unpack-missing 1 "$FKVF" unpack ../arch/a.fkvf -o x.safetensors
grep_in unpack-missing-hash "$hash" "$T/err"
grep_in unpack-missing-hint '(name hint "cb.fkvf")' "$T/err"
grep_in unpack-missing-dir "in \.\./arch (the archive's directory)" "$T/err"
grep_in unpack-missing-advice "FKVF_CODEBOOK_PATH" "$T/err"

# FKVF_CODEBOOK_PATH: each directory in turn (a missing one is listed and
# skipped), found by its hash
check unpack-path 0 env FKVF_CODEBOOK_PATH="$T/nonexistent:$T/cbs" "$FKVF" unpack ../arch/a.fkvf -o p.safetensors
same unpack-path-same "$T/ref.safetensors" p.safetensors
check unpack-path-missing 1 env FKVF_CODEBOOK_PATH="$T/nonexistent::$T/other" "$FKVF" unpack ../arch/a.fkvf -o q.safetensors
grep_in unpack-path-missing-dirs "\.\./arch (the archive's directory), $T/nonexistent (missing), $T/other" "$T/err"
# the right name, the wrong hash (other/cb.fkvf): skipped; the right file
# under another name in a later directory: found
mv "$T/cbs/cb.fkvf" "$T/cbs/renamed-codebook"
check unpack-by-hash 0 env FKVF_CODEBOOK_PATH="$T/other:$T/cbs" "$FKVF" unpack ../arch/a.fkvf -o h.safetensors
same unpack-by-hash-same "$T/ref.safetensors" h.safetensors
# next to the archive under another name: found without a path
cp "$T/cbs/renamed-codebook" "$T/arch/shared.bin"
check unpack-archive-dir 0 "$FKVF" unpack ../arch/a.fkvf -o d.safetensors
same unpack-archive-dir-same "$T/ref.safetensors" d.safetensors
rm "$T/arch/shared.bin"

# verify: without the codebook, a note and the other checks (exit 0); with
# it found, no note
check verify-missing 0 "$FKVF" verify ../arch/a.fkvf
grep_in verify-missing-note "note: .*$hash.*not made" "$T/err"
check verify-path 0 env FKVF_CODEBOOK_PATH="$T/cbs" "$FKVF" verify ../arch/a.fkvf
if [ -s "$T/err" ]; then echo "FAIL verify-path-quiet: $(cat "$T/err")"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
# --codebooks "": none and not looked up (no note either)
check verify-none 0 env FKVF_CODEBOOK_PATH="$T/cbs" "$FKVF" verify ../arch/a.fkvf --codebooks ""
if [ -s "$T/err" ]; then echo "FAIL verify-none-quiet: $(cat "$T/err")"; fails=$((fails + 1)); else pass=$((pass + 1)); fi

# info: the ratio with the codebook file counted when it is found
check info-missing 0 "$FKVF" info ../arch/a.fkvf
grep_in info-missing-ratio "x without the codebook file (content hash $hash, not found" "$T/out"
cbsize=$(wc -c <"$T/cbs/renamed-codebook" | tr -d ' ')
check info-path 0 env FKVF_CODEBOOK_PATH="$T/cbs" "$FKVF" info ../arch/a.fkvf
grep_in info-path-ratio "x with the codebook file ($cbsize bytes, content hash $hash), .*x without it" "$T/out"
check info-path-json 0 env FKVF_CODEBOOK_PATH="$T/cbs" "$FKVF" info ../arch/a.fkvf --json
grep_in info-path-json-bytes "\"codebook_file\":$cbsize}" "$T/out"

# compact and append from elsewhere
check compact-missing 1 "$FKVF" compact ../arch/a.fkvf -o c.fkvf
grep_in compact-missing-hash "$hash" "$T/err"
check compact-path 0 env FKVF_CODEBOOK_PATH="$T/cbs" "$FKVF" compact ../arch/a.fkvf -o c.fkvf
cp "$T/cbs/renamed-codebook" "$T/cbs/cb.fkvf"
check create 0 "$FKVF" append --create ../arch/live.fkvf "$CACHE" --codebooks "$T/cbs/cb.fkvf" --positions 0:100
cp ../arch/live.fkvf live.before
check append-missing 1 "$FKVF" append ../arch/live.fkvf "$CACHE" --positions 100:180
same append-missing-unchanged ../arch/live.fkvf live.before
check append-path 0 env FKVF_CODEBOOK_PATH="$T/cbs" "$FKVF" append ../arch/live.fkvf "$CACHE" --positions 100:180
grep_in append-path-count "appended 80 positions" "$T/out"

# one exit status in every command for a --codebooks FILE that is not a
# codebook or the wrong one (1: invalid input), and one for a FILE that does
# not exist (2, as any path that does not exist: docs/cli.md)
cp ../arch/live.fkvf live.before2
for f in "$T/nonexistent.fkvf" "$CACHE" "$T/other/cb.fkvf"; do
    n=$(basename "$f")
    want=1
    [ -e "$f" ] || want=2
    check unpack-given-bad-$n $want "$FKVF" unpack ../arch/a.fkvf -o z.safetensors --codebooks "$f"
    sed -n 's/^fkvf unpack: //p' "$T/err" >unpack.err
    check compact-given-bad-$n $want "$FKVF" compact ../arch/a.fkvf -o z.fkvf --codebooks "$f"
    check append-given-bad-$n $want "$FKVF" append ../arch/live.fkvf "$CACHE" --positions 180:200 --codebooks "$f"
    check verify-given-bad-$n $want "$FKVF" verify ../arch/a.fkvf --codebooks "$f"
    grep_in given-bad-$n-hash "$hash" "$T/err"
    # verify opens the given FILE through the helper the other commands use
    # (cli_open_codebook): the same error line
    sed -n 's/^fkvf verify: //p' "$T/err" >verify.err
    same verify-given-bad-$n-line unpack.err verify.err
done
same append-given-bad-unchanged ../arch/live.fkvf live.before2
# verify --json: the top level has the library's code and message of the
# codebook file, the error object its offset and clause as in the other commands
check verify-given-json 1 "$FKVF" verify --json ../arch/a.fkvf --codebooks "$CACHE"
cp "$T/out" verify.json
check verify-given-json-fields 0 /usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["valid"] is False and d["code"] == d["error"]["code"], d
assert d["error"]["name"] == "FKVF_E_CODEBOOK" and "not an FKVF file" in d["message"], d
assert d["error"]["offset"] == 0 and d["error"]["clause"] == "3.1", d
' verify.json
# stage counts per layer (format 1.1): train, pack against it, unpack; the
# table in the text and JSON outputs; the archive declares the feature;
# refusals of a malformed table and of one for another number of layers
cd "$T" || exit 2
check layers-train 0 "$FKVF" train "$TRAIN" -o "$T/lay.fkvf" --k 16 --iters 5 \
    --layer-stages 0:1,3:2,2:2,2:1,1:1
grep_in layers-train-text "K x0,3,2,2,1 V x1,2,2,1,1" "$T/out"
check layers-info 0 "$FKVF" info "$T/lay.fkvf"
grep_in layers-info-format "FKVF 1.1, required features 0x8 layer-stages" "$T/out"
check layers-pack 0 "$FKVF" pack "$CACHE" -o "$T/lay-a.fkvf" --codebooks "$T/lay.fkvf"
check layers-info-archive 0 "$FKVF" info "$T/lay-a.fkvf"
grep_in layers-archive-features "external-codebook layer-stages" "$T/out"
check layers-verify 0 "$FKVF" verify "$T/lay-a.fkvf" --codebooks "$T/lay.fkvf"
check layers-unpack 0 "$FKVF" unpack "$T/lay-a.fkvf" -o "$T/lay-u.safetensors" --codebooks "$T/lay.fkvf"
check layers-compare 0 "$FKVF" compare "$CACHE" "$T/lay-u.safetensors" --sinks 4 --recent 32
grep_in layers-exact "exact positions: 36 of 36 bit-identical" "$T/out"
check layers-json 0 "$FKVF" train "$TRAIN" -o "$T/lay2.fkvf" --k 16 --iters 5 --json \
    --layer-stages 0:1,3:2,2:2,2:1,1:1
grep_in layers-json-table '"layer_stages":\[\[0,1\],\[3,2\],\[2,2\],\[2,1\],\[1,1\]\]' "$T/out"
check layers-embedded 0 "$FKVF" pack "$CACHE" -o "$T/lay-e.fkvf" --k 16 --layer-stages 1:1,2:1,2:1,2:1,1:0
check layers-embedded-verify 0 "$FKVF" verify "$T/lay-e.fkvf"
check layers-uniform 0 "$FKVF" train "$TRAIN" -o "$T/lay-u.fkvf" --k 16 --iters 5 --layer-stages 2:1,2:1,2:1,2:1,2:1
check layers-uniform-info 0 "$FKVF" info "$T/lay-u.fkvf"
grep_in layers-uniform-is-1.0 "FKVF 1.0, required features 0x0" "$T/out"
check layers-syntax 2 "$FKVF" train "$TRAIN" -o "$T/x.fkvf" --layer-stages 1:1,2
grep_in layers-syntax-message "is not a list of KEY:VALUE stage counts" "$T/err"
check layers-count17 2 "$FKVF" train "$TRAIN" -o "$T/x.fkvf" --layer-stages 17:1,1:1,1:1,1:1,1:1
check layers-number 2 "$FKVF" train "$TRAIN" -o "$T/x.fkvf" --layer-stages 1:1,1:1
grep_in layers-number-message "gives 2 layers, the cache has 5" "$T/err"
check layers-number-pack 2 "$FKVF" pack "$CACHE" -o "$T/x.fkvf" --layer-stages 1:1
check layers-and-k-stages 2 "$FKVF" train "$TRAIN" -o "$T/x.fkvf" --layer-stages 1:1,1:1,1:1,1:1,1:1 --k-stages 2
grep_in layers-and-k-stages-message "exclude each other" "$T/err"
check layers-and-v-stages-pack 2 "$FKVF" pack "$CACHE" -o "$T/x.fkvf" --v-stages 1 --layer-stages 1:1,1:1,1:1,1:1,1:1
check layers-with-codebooks 0 "$FKVF" pack "$CACHE" -o "$T/x.fkvf" --codebooks "$T/lay.fkvf" --layer-stages 1:1,1:1,1:1,1:1,1:1
grep_in layers-with-codebooks-warned "is an option of --train, ignored" "$T/err"

# the encoder metric (format 1.2, spec 13.8): fkvf train --key-metric /
# --value-metric take float32 .npy arrays of [layers, heads, dim, dim]; the
# codebook file keeps them (info), fkvf pack and fkvf append encode under
# them (the archive differs from one packed with the same tables under the
# Euclidean metric, which is what the identity metric gives); refusals
npy() { # npy OUT KIND: spd (anisotropic, per table), id (identity), asym (spd with
       # (0, 1) of table 0 doubled and (1, 0) zeroed: the same symmetric part),
       # indef (table 0 indefinite), shape (3 heads)
    /usr/bin/python3 - "$1" "$2" <<'PY'
import struct, sys, random
out, kind = sys.argv[1], sys.argv[2]
L, H, D = 5, (3 if kind == "shape" else 4), 8
vals = []
for t in range(L * H):
    rnd = random.Random(t + 1)
    b = [[(rnd.random() - 0.5) * 4.0 / (1.0 + 3.0 * j) for j in range(D)] for _ in range(D)]
    for i in range(D):
        for j in range(D):
            if kind == "id":
                v = 1.0 if i == j else 0.0
            else:
                v = sum(b[i][p] * b[j][p] for p in range(D)) + (0.05 if i == j else 0.0)
            vals.append(v)
# exactly symmetric as float32: the lower triangle copies the upper
for t in range(L * H):
    for i in range(D):
        for j in range(i):
            vals[t * D * D + i * D + j] = vals[t * D * D + j * D + i]
if kind == "asym":
    vals[1], vals[D] = 2.0 * vals[1], 0.0
if kind == "indef":
    for i in range(D):
        for j in range(D):
            vals[i * D + j] = (1.0 if i == j else 0.0) if i < D - 1 or j != i else -1.0
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d, %d, %d), }" % (L, H, D, D)
hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
with open(out, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
    f.write(struct.pack("<%df" % len(vals), *vals))
PY
}
npy "$T/mk.npy" spd
npy "$T/mid.npy" id
npy "$T/masym.npy" asym
npy "$T/mindef.npy" indef
npy "$T/mshape.npy" shape
check metric-train 0 "$FKVF" train "$TRAIN" -o "$T/met.fkvf" $Q --key-metric "$T/mk.npy" --value-metric "$T/mk.npy"
grep_in metric-train-text "encoder metric: keys+values" "$T/out"
check metric-info 0 "$FKVF" info "$T/met.fkvf"
grep_in metric-info-line "encoder metric  keys+values" "$T/out"
grep_in metric-info-optional "(optional: encoder-metric)" "$T/out"
check metric-info-json 0 "$FKVF" info --json "$T/met.fkvf"
grep_in metric-info-json-key '"metric":"keys+values"' "$T/out"
check metric-verify 0 "$FKVF" verify "$T/met.fkvf"
check metric-json 0 "$FKVF" train "$TRAIN" -o "$T/met-k.fkvf" $Q --key-metric "$T/mk.npy" --json
grep_in metric-json-key '"metric":"keys"' "$T/out"
check metric-json-none 0 "$FKVF" train "$TRAIN" -o "$T/met-n.fkvf" $Q --json
grep_in metric-json-null '"metric":null' "$T/out"
# the identity metric trains the same tables as none (same content hash)
check metric-identity 0 "$FKVF" train "$TRAIN" -o "$T/met-id.fkvf" $Q --key-metric "$T/mid.npy" --value-metric "$T/mid.npy" --json
grep_in metric-identity-hash "$hash" "$T/out"
# packing encodes under the file's metric: the same tables without their
# metric (the identity) give another archive; with their metric, the same
# archive as the appender's
check metric-pack 0 "$FKVF" pack "$CACHE" -o "$T/met-a.fkvf" --codebooks "$T/met.fkvf"
check metric-pack-verify 0 "$FKVF" verify "$T/met-a.fkvf" --codebooks "$T/met.fkvf"
check metric-pack-id 0 "$FKVF" pack "$CACHE" -o "$T/met-b.fkvf" --codebooks "$T/met-id.fkvf"
check metric-pack-plain 0 "$FKVF" pack "$CACHE" -o "$T/met-c.fkvf" --codebooks "$T/cbs/renamed-codebook"
check metric-unpack-id 0 "$FKVF" unpack "$T/met-b.fkvf" -o "$T/met-b.safetensors" --codebooks "$T/met-id.fkvf"
check metric-unpack-plain 0 "$FKVF" unpack "$T/met-c.fkvf" -o "$T/met-c.safetensors" --codebooks "$T/cbs/renamed-codebook"
same metric-pack-id-is-plain "$T/met-b.safetensors" "$T/met-c.safetensors"
check metric-unpack 0 "$FKVF" unpack "$T/met-a.fkvf" -o "$T/met-a.safetensors" --codebooks "$T/met.fkvf"
check metric-compare 0 "$FKVF" compare "$CACHE" "$T/met-a.safetensors" --sinks 4 --recent 32
grep_in metric-compare-exact "exact positions: 36 of 36 bit-identical" "$T/out"
# other tables (trained under the metric), other archived rows
if cmp -s "$T/met-a.safetensors" "$T/met-c.safetensors"; then echo "FAIL metric-pack-differs"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
# a matrix is taken as its symmetric part: the same codebook file
check metric-asym 0 "$FKVF" train "$TRAIN" -o "$T/met-asym.fkvf" $Q --key-metric "$T/masym.npy" --value-metric "$T/mk.npy"
same metric-asym-same "$T/met.fkvf" "$T/met-asym.fkvf"
check metric-refuse-indef 1 "$FKVF" train "$TRAIN" -o "$T/mx.fkvf" $Q --key-metric "$T/mindef.npy"
grep_in metric-refuse-indef-message "matrix of layer 0, head 0 is not positive definite (elements \[7, 7\] = -1 and" "$T/err"
check metric-refuse-shape 1 "$FKVF" train "$TRAIN" -o "$T/mx.fkvf" $Q --value-metric "$T/mshape.npy"
grep_in metric-refuse-shape-message "needs \[layers, heads, dim, dim\] = \[5, 4, 8, 8\]" "$T/err"
check metric-refuse-missing 2 "$FKVF" train "$TRAIN" -o "$T/mx.fkvf" $Q --key-metric "$T/none.npy"
check metric-refuse-cache 1 "$FKVF" train "$TRAIN" -o "$T/mx.fkvf" $Q --key-metric "$TRAIN"
if [ -e "$T/mx.fkvf" ]; then echo "FAIL metric-refusals-wrote: $T/mx.fkvf"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
finish cli_codebooks
