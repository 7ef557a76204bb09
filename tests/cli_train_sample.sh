#!/bin/sh
# CLI: training on a sample of positions (issue 37, part 2; docs/codebooks.md,
# "Training on a sample of positions"). fkvf train, pack --train and append
# --create --train take --max-train-positions N|all; beyond N positions they
# train on runs of 64 consecutive positions chosen by the seed, and say so.
# Expected values: the content hashes and archive digests of full training
# were made by the build before the sample existed (commit ab29b93); the
# runs of the sample by a separate Python implementation of the documented
# rule (tests/test_cli_sample.c has more of them).
# usage: cli_train_sample.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
CACHE=$SRC/testdata/sample-cache.safetensors
TRAIN=$SRC/testdata/train-cache.safetensors
. "$(dirname "$0")/cli_lib.sh"
PY=/usr/bin/python3
Q="--k 16 --k-stages 2 --v-stages 1 --iters 5"
hash_of() { sed -n 's/^content hash \([0-9a-f]*\)$/\1/p' "$T/out"; }
is() { # is NAME GOT WANT
    if [ "$2" = "$3" ]; then pass=$((pass + 1)); else echo "FAIL $1: got '$2', want '$3'"; fails=$((fails + 1)); fi
}
isnt() { # isnt NAME GOT OTHER
    if [ -n "$2" ] && [ "$2" != "$3" ]; then pass=$((pass + 1)); else echo "FAIL $1: '$2' (must differ from '$3')"; fails=$((fails + 1)); fi
}
sha() { sha256sum "$1" | cut -c1-64; }
no_note() { # no_note NAME: no sample note on stderr
    if grep -q "training on a sample" "$T/err"; then echo "FAIL $1: a sample note:"; cat "$T/err"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
}

# full training as before the sample existed (ab29b93): the default budget
# (1 GiB of rows) holds these caches whole; all, 0 and a budget above the
# positions are the same training, byte for byte, without a note
FULL1=ded8f4ddf21fcde49afc70f1e4ea94cb  # train-cache, $Q
FULL2=61600b14d726833a1448f1afd5978ccf  # train-cache + sample-cache, $Q
for opt in "" "--max-train-positions all" "--max-train-positions 0" "--max-train-positions 512" \
    "--max-train-positions 100000"; do
    check "train-full[$opt]" 0 "$FKVF" train "$TRAIN" -o "$T/f.fkvf" --force $Q $opt
    is "train-full-hash[$opt]" "$(hash_of)" $FULL1
    no_note "train-full-note[$opt]"
done
check train-full2 0 "$FKVF" train "$TRAIN" "$CACHE" -o "$T/f2.fkvf" $Q --max-train-positions 768
is train-full2-hash "$(hash_of)" $FULL2
check pack-full 0 "$FKVF" pack "$CACHE" -o "$T/p.fkvf" $Q --max-train-positions all
is pack-full-bytes "$(sha "$T/p.fkvf")" fe986691bf405b85da660d6e4750f70e927609ae81aca79dd350fdeca0a5f0da
check pack-full-budget 0 "$FKVF" pack "$CACHE" -o "$T/p2.fkvf" $Q --max-train-positions 256
is pack-full-budget-bytes "$(sha "$T/p2.fkvf")" fe986691bf405b85da660d6e4750f70e927609ae81aca79dd350fdeca0a5f0da
no_note pack-full-note
check append-full 0 "$FKVF" append --create "$T/a.fkvf" "$CACHE" $Q --max-train-positions all
is append-full-bytes "$(sha "$T/a.fkvf")" 3533e8b129845b61e4b0c490eb6908fdc82cbd47cff7c10ecc7427be31495dc5

# beyond the budget: a note naming the counts, a different codebook
check train-sample 0 "$FKVF" train "$TRAIN" -o "$T/s.fkvf" $Q --max-train-positions 128
s1=$(hash_of)
isnt train-sample-differs "$s1" $FULL1
grep_in train-sample-note "note: .*training on a sample of 128 of the 512 positions (--max-train-positions 128): runs of 64 consecutive positions chosen by the training seed 0" "$T/err"
grep_in train-sample-advice "'all' trains on every position" "$T/err"
check train-sample2 0 "$FKVF" train "$TRAIN" "$CACHE" -o "$T/s2.fkvf" $Q --max-train-positions 256 --json
grep_in train-sample2-note "training on a sample of 256 of the 768 positions of the caches" "$T/err"
grep_in train-sample2-json '"positions":768,"trained_positions":256}' "$T/out"
check train-sample-seed 0 "$FKVF" train "$TRAIN" -o "$T/s3.fkvf" $Q --max-train-positions 128 --seed 3
isnt train-sample-seed-differs "$(hash_of)" "$s1"

# the same codebook for every thread count and run
for n in 1 2 3 1; do
    check "train-sample-threads$n" 0 "$FKVF" train "$TRAIN" -o "$T/t$n.fkvf" --force $Q --max-train-positions 128 --threads $n
    is "train-sample-threads$n-hash" "$(hash_of)" "$s1"
done
check pack-sample1 0 "$FKVF" pack "$CACHE" -o "$T/ps1.fkvf" $Q --max-train-positions 64 --threads 1
grep_in pack-sample-note "sample-cache.safetensors: training on a sample of 64 of the 256 positions" "$T/err"
check pack-sample3 0 "$FKVF" pack "$CACHE" -o "$T/ps3.fkvf" $Q --max-train-positions 64 --threads 3
check pack-sample-same 0 cmp "$T/ps1.fkvf" "$T/ps3.fkvf"
isnt pack-sample-differs "$(sha "$T/ps1.fkvf")" fe986691bf405b85da660d6e4750f70e927609ae81aca79dd350fdeca0a5f0da
check append-sample 0 "$FKVF" append --create "$T/as.fkvf" "$CACHE" $Q --max-train-positions 128
grep_in append-sample-note "training on a sample of 128 of the 256 positions" "$T/err"
grep_in append-sample-count "codebook trained on 128 positions, k = 16" "$T/out"

# the rows trained on are the rule's: with keys as cached (no RoPE, so a
# block's first position does not matter), the sample of train-cache
# (seed 0, 128 positions: positions 64..127 and 320..383, computed
# independently) cut out into a cache of its own trains the same codebook
$PY - "$TRAIN" "$T/cut.safetensors" <<'PYEOF'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
head = json.loads(b[8:8 + n])
keep = list(range(64, 128)) + list(range(320, 384))
out, blobs, off = {}, [], 0
for name, t in head.items():
    if name == "__metadata__":
        out[name] = t
        continue
    s0, s1 = t["data_offsets"]
    raw = b[8 + n + s0:8 + n + s1]
    shape = t["shape"]
    es = {"F16": 2, "BF16": 2, "F32": 4, "I32": 4, "I64": 8}[t["dtype"]]
    if len(shape) == 3:  # [H, T, D]
        H, P, D = shape
        rows = [raw[(h * P + p) * D * es:(h * P + p + 1) * D * es] for h in range(H) for p in keep]
        shape = [H, len(keep), D]
    else:  # token ids [T]
        rows = [raw[p * es:(p + 1) * es] for p in keep]
        shape = [len(keep)]
    data = b"".join(rows)
    out[name] = {"dtype": t["dtype"], "shape": shape, "data_offsets": [off, off + len(data)]}
    blobs.append(data)
    off += len(data)
h = json.dumps(out).encode()
h += b" " * (-len(h) % 8)
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PYEOF
check cut-train 0 "$FKVF" train "$T/cut.safetensors" -o "$T/cut.fkvf" $Q --no-rope
cut=$(hash_of)
check cut-sample 0 "$FKVF" train "$TRAIN" -o "$T/cs.fkvf" $Q --no-rope --max-train-positions 128
is cut-sample-same-rows "$(hash_of)" "$cut"
isnt cut-hash "$cut" ""

# keys un-rotated at their true positions: the sample of seed 3 is
# positions 320..447 (one block starting at 320); a codebook trained on it
# encodes the sample cache's keys at 6.2 dB, one that un-rotated them as if
# they started at 0 at 3.4 dB (measured); 5 dB tells them apart
check rope-sample 0 "$FKVF" train "$TRAIN" -o "$T/r.fkvf" $Q --max-train-positions 128 --seed 3
check rope-pack 0 "$FKVF" pack "$CACHE" -o "$T/r-a.fkvf" --codebooks "$T/r.fkvf"
keys_db_at_least() { # keys_db_at_least NAME ARCHIVE DB: restored keys' SNR >= DB
    check "$1-unpack" 0 "$FKVF" unpack "$2" -o "$T/k.safetensors" --force
    check "$1-compare" 0 "$FKVF" compare "$CACHE" "$T/k.safetensors" --sinks 4 --recent 32 --json
    kdb=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["keys"]["snr_db"])' "$T/out")
    check "$1-keys-snr($kdb)" 0 $PY -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' "$kdb" "$3"
}
keys_db_at_least rope-train "$T/r-a.fkvf" 5.0
# the same for pack --train and append --create --train: seed 2's sample of
# the sample cache is positions 128..255; 7.4 dB, un-rotated from 0 3.5 dB
check rope-pack-train 0 "$FKVF" pack "$CACHE" -o "$T/r-p.fkvf" $Q --max-train-positions 128 --seed 2
keys_db_at_least rope-pack-train "$T/r-p.fkvf" 5.5
check rope-append-train 0 "$FKVF" append --create "$T/r-ap.fkvf" "$CACHE" $Q --max-train-positions 128 --seed 2
keys_db_at_least rope-append-train "$T/r-ap.fkvf" 5.5

# llama.cpp state files (read whole, not lazily: opened, closed, read again
# for the sample): two copies of a 64-position state, a sample of one run
# is one whole copy, whichever: the codebook of one copy (ab29b93's hash)
MODEL=$SRC/../shared/models/stories260K.gguf
if [ -f "$MODEL" ]; then
    STATE=$SRC/testdata/llama-stories260K.bin
    check llama-sample 0 "$FKVF" train "$STATE" "$STATE" --model "$MODEL" -o "$T/ll.fkvf" --k 16 --max-train-positions 64
    is llama-sample-hash "$(hash_of)" 3ec90f48b37cbe93eb26e15ea6c0bc0b
    grep_in llama-sample-note "training on a sample of 64 of the 128 positions of the caches" "$T/err"
else
    echo "note: $MODEL missing: the llama.cpp state case skipped"
fi

# bad values: usage errors (exit 2), nothing written
for v in 63 1 -1 abc 1.5 "" 18446744073709551616 all0; do
    check "bad[$v]" 2 "$FKVF" train "$TRAIN" -o "$T/bad.fkvf" --max-train-positions "$v"
    grep_in "bad-msg[$v]" "max-train-positions" "$T/err"
done
check bad-pack 2 "$FKVF" pack "$CACHE" -o "$T/bad.fkvf" --max-train-positions 10
check bad-append 2 "$FKVF" append --create "$T/bad.fkvf" "$CACHE" --max-train-positions x
check bad-missing 2 "$FKVF" train "$TRAIN" -o "$T/bad.fkvf" --max-train-positions
if [ -e "$T/bad.fkvf" ]; then echo "FAIL bad: a file written"; fails=$((fails + 1)); fi
# an option of --create only, and of --train only
check append-not-create 2 "$FKVF" append "$T/a.fkvf" "$CACHE" --new --max-train-positions 64
check pack-codebooks 0 "$FKVF" pack "$CACHE" -o "$T/pc.fkvf" --codebooks "$T/f2.fkvf" --max-train-positions 64
grep_in pack-codebooks-ignored "max-train-positions is an option of --train, ignored" "$T/err"

finish cli_train_sample
