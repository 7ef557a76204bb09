#!/bin/sh
# CLI: defaults that compress (issue 12, item 8). fkvf pack --train picks k
# from the number of archived rows when --k is not given (the largest power
# of two 16..256 whose codebook stays within 1/4 of the fp16 bytes of those
# rows, k <= rows / 4), stores every position exact when even k = 16 costs
# more than the rows, warns about a codebook that is larger than the rows or
# memorises them (pack --k, train), and prints the ratio vs fp16 with the
# codebook counted and without it. fkvf append --create --train takes its k
# by the same rule, for the rows it trains on. Caches of 64, 128, 300 and 512 positions
# are cut from testdata/train-cache.safetensors with the CLI itself.
# usage: cli_defaults.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
TRAIN=$SRC/testdata/train-cache.safetensors
. "$(dirname "$0")/cli_lib.sh"
size_of() { wc -c <"$1" | tr -d ' '; }
# smaller NAME A B: file A has fewer bytes than file B
smaller() {
    if [ "$(size_of "$2")" -lt "$(size_of "$3")" ]; then pass=$((pass + 1)); else
        echo "FAIL $1: $2 ($(size_of "$2") bytes) not smaller than $3 ($(size_of "$3") bytes)"
        fails=$((fails + 1))
    fi
}
# empty NAME FILE
empty() {
    if [ -s "$2" ]; then echo "FAIL $1: not empty:"; cat "$2"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
}
# approx NAME GOT WANT: equal to 2 decimals
approx() {
    if awk -v g="$2" -v w="$3" 'BEGIN { d = g - w; exit !(d < 0.006 && d > -0.006) }'; then
        pass=$((pass + 1))
    else
        echo "FAIL $1: $2, want $3"; fails=$((fails + 1))
    fi
}
# fp16 bytes of a cache of stories260K's shape: 5 layers x 4 heads x (8 + 8) x 2
fp16() { echo $(($1 * 640)); }

for n in 64 128 300 512; do
    check cut-$n 0 "$FKVF" append --create "$T/e$n.fkvf" "$TRAIN" --exact-only --positions 0:$n
    check cut-$n-unpack 0 "$FKVF" unpack "$T/e$n.fkvf" -o "$T/c$n.safetensors"
done

# 300 positions (264 archived): k = 16, the archive much smaller than the
# cache (the old default, k = 256, made it 2.9x larger)
check pack-300 0 "$FKVF" pack "$T/c300.safetensors" -o "$T/a300.fkvf"
grep_in pack-300-k "(36 exact, 264 archived)" "$T/out"
grep_in pack-300-k "with the embedded codebook (k = 16, " "$T/out"
empty pack-300-quiet "$T/err"
smaller pack-300-smaller "$T/a300.fkvf" "$T/c300.safetensors"
# the printed ratios, recomputed: fp16 / bytes, fp16 / (bytes - codebook)
bytes=$(size_of "$T/a300.fkvf")
cbb=$(sed -n 's/.*embedded codebook (k = [0-9]*, \([0-9]*\) bytes).*/\1/p' "$T/out")
with=$(sed -n 's/.*ratio vs fp16 \([0-9.]*\)x with the embedded.*/\1/p' "$T/out")
without=$(sed -n 's/.*bytes), \([0-9.]*\)x without it.*/\1/p' "$T/out")
approx pack-300-ratio-with "$with" "$(awk -v f="$(fp16 300)" -v b="$bytes" 'BEGIN { print f / b }')"
approx pack-300-ratio-without "$without" "$(awk -v f="$(fp16 300)" -v b="$bytes" -v c="$cbb" 'BEGIN { print f / (b - c) }')"
grep_in pack-300-fp16 "fp16 cache $(fp16 300) bytes" "$T/out"
check info-300 0 "$FKVF" info "$T/a300.fkvf" --json
grep_in info-300-cb "\"codebooks\":$cbb," "$T/out"
# and it still reconstructs: keys within 10% relative MSE
check unpack-300 0 "$FKVF" unpack "$T/a300.fkvf" -o "$T/r300.safetensors"
check compare-300 0 "$FKVF" compare "$T/c300.safetensors" "$T/r300.safetensors" --sinks 4 --recent 32 --json
k=$(sed -n 's/.*"keys":{"rel_mse":\([^,]*\),.*/\1/p' "$T/out")
if awk -v v="$k" 'BEGIN { exit !(v > 0 && v < 0.1) }'; then pass=$((pass + 1)); else
    echo "FAIL compare-300-keys: rel_mse '$k'"; fails=$((fails + 1)); fi
# --train given without --k: the same rule
check pack-300-train 0 "$FKVF" pack "$T/c300.safetensors" -o "$T/b300.fkvf" --train
check same-300 0 cmp "$T/a300.fkvf" "$T/b300.fkvf"

# 512 positions (476 archived): k = 32; 256 positions (220): k = 16
check pack-512 0 "$FKVF" pack "$T/c512.safetensors" -o "$T/a512.fkvf"
grep_in pack-512-k "with the embedded codebook (k = 32, " "$T/out"
smaller pack-512-smaller "$T/a512.fkvf" "$T/c512.safetensors"
check pack-sample 0 "$FKVF" pack "$SRC/testdata/sample-cache.safetensors" -o "$T/s.fkvf"
grep_in pack-sample-k "(36 exact, 220 archived), .* (k = 16, " "$T/out"

# 128 positions (92 archived): even k = 16 breaks the rule: k = 16 and a
# warning pointing to a shared codebook
check pack-128 0 "$FKVF" pack "$T/c128.safetensors" -o "$T/a128.fkvf"
grep_in pack-128-k "(k = 16, " "$T/out"
grep_in pack-128-warn "warning: .*: 92 archived positions: even k = 16" "$T/err"
grep_in pack-128-advice "fkvf train .* --codebooks" "$T/err"
smaller pack-128-smaller "$T/a128.fkvf" "$T/c128.safetensors"

# 64 positions (28 archived): a codebook would cost more than the rows:
# every position exact, bit for bit, with a note
check pack-64 0 "$FKVF" pack "$T/c64.safetensors" -o "$T/a64.fkvf"
grep_in pack-64-exact "(64 exact, 0 archived)" "$T/out"
grep_in pack-64-nocb "no codebook (every position exact)" "$T/out"
grep_in pack-64-note "note: .*: 28 archived positions are too few .* every position stored exact" "$T/err"
grep_in pack-64-note-append "every position a later fkvf append adds to the archive is stored exact too" "$T/err"
grep_in pack-64-note-advice "--k N forces a codebook; .*(fkvf train CACHE... -o CODEBOOKS) and pack with --codebooks" "$T/err"
check unpack-64 0 "$FKVF" unpack "$T/a64.fkvf" -o "$T/r64.safetensors"
check compare-64 0 "$FKVF" compare "$T/c64.safetensors" "$T/r64.safetensors" --sinks 64
grep_in compare-64-exact "64 of 64 bit-identical" "$T/out"
check verify-64 0 "$FKVF" verify "$T/a64.fkvf"
# appending to it: still every position exact, and a note says so, once
# (not once per commit)
cp "$T/a64.fkvf" "$T/g64.fkvf"
check append-64 0 "$FKVF" append "$T/g64.fkvf" "$T/c128.safetensors" --new --commit-every 16
grep_in append-64-exact "now 128 positions (0 archived, 128 exact)" "$T/out"
grep_in append-64-note "note: .*g64.fkvf has no codebook: the positions that leave its recent window stay exact (92 of its 128 positions are outside its 4 sinks and 32 recent positions, all stored exact)" "$T/err"
grep_in append-64-note-advice "fkvf pack --k N, or a shared codebook from fkvf train and --codebooks FILE" "$T/err"
n_notes=$(grep -c "has no codebook" "$T/err")
if [ "$n_notes" = 1 ]; then pass=$((pass + 1)); else echo "FAIL append-64-note-once: $n_notes notes"; fails=$((fails + 1)); fi
# nothing appended, nothing said; an archive with a codebook: no note
check append-64-nothing 0 "$FKVF" append "$T/g64.fkvf" "$T/c128.safetensors" --new
empty append-64-nothing-quiet "$T/err"
cp "$T/a300.fkvf" "$T/g300.fkvf"
check append-300 0 "$FKVF" append "$T/g300.fkvf" "$T/c512.safetensors" --new
empty append-300-quiet "$T/err"
# a given --k is used as given: a codebook, with a warning
check pack-64-k16 0 "$FKVF" pack "$T/c64.safetensors" -o "$T/k64.fkvf" --k 16
grep_in pack-64-k16-archived "(36 exact, 28 archived)" "$T/out"
grep_in pack-64-k16-warn "warning: .*: the codebook (k = 16, [0-9]* bytes) is [0-9.]*x the 17920 fp16 bytes of the 28 archived rows" "$T/err"
check pack-300-k256 0 "$FKVF" pack "$T/c300.safetensors" -o "$T/k300.fkvf" --k 256
grep_in pack-300-k256-k "(k = 256, " "$T/out"
grep_in pack-300-k256-warn "warning: .*: the codebook (k = 256, 491584 bytes) is 2.9x the 168960 fp16 bytes" "$T/err"
grep_in pack-300-k256-advice "fkvf train .* --codebooks" "$T/err"
check pack-512-k256 0 "$FKVF" pack "$T/c512.safetensors" -o "$T/k512.fkvf" --k 64
empty pack-512-k64-quiet "$T/err"

# train: k = 256 on 512 rows memorises them (warned); k = 64 does not
check train-256 0 "$FKVF" train "$TRAIN" -o "$T/cb256.fkvf" --iters 2
grep_in train-256-warn "warning: .*: the codebook (k = 256, [0-9]* bytes) is 1.5x the 327680 fp16 bytes of the 512 training rows, and k is more than a quarter" "$T/err"
check train-64 0 "$FKVF" train "$TRAIN" -o "$T/cb64.fkvf" --k 64 --iters 5
empty train-64-quiet "$T/err"
check train-few 0 "$FKVF" train "$T/c64.safetensors" -o "$T/cbf.fkvf" --k 32 --k-stages 1 --v-stages 1 --iters 2
grep_in train-few-warn "k = 32 is more than a quarter of the 64 training rows" "$T/err"

# append --create --train (its default) takes k by the same rule, for the
# rows it trains on (the old k = 256 made a 256-position live archive 3x
# the fp16 cache), and warns as pack does
SAMPLE=$SRC/testdata/sample-cache.safetensors
check append-create-256 0 "$FKVF" append --create "$T/live256.fkvf" "$SAMPLE"
grep_in append-create-256-k "created (commit 1: descriptor, codebook trained on 256 positions, k = 16)" "$T/out"
empty append-create-256-quiet "$T/err"
smaller append-create-256-smaller "$T/live256.fkvf" "$SAMPLE"
check append-create-512 0 "$FKVF" append --create "$T/live512.fkvf" "$TRAIN" --iters 5
grep_in append-create-512-k "trained on 512 positions, k = 32)" "$T/out"
check append-create-128 0 "$FKVF" append --create "$T/live128.fkvf" "$T/c128.safetensors" --iters 5
grep_in append-create-128-k "trained on 128 positions, k = 16)" "$T/out"
grep_in append-create-128-warn "warning: .*c128.safetensors: 128 positions to train the codebook on: even k = 16 gives a codebook of 30784 bytes" "$T/err"
grep_in append-create-128-advice "every later append; .*(fkvf train .* --codebooks" "$T/err"
# a given --k is used as given, with pack's warning
check append-create-k256 0 "$FKVF" append --create "$T/livek.fkvf" "$SAMPLE" --k 256 --iters 2
grep_in append-create-k256-k "k = 256)" "$T/out"
grep_in append-create-k256-warn "warning: .*: the codebook (k = 256, 491584 bytes) is 3.0x the 163840 fp16 bytes of the 256 rows it is trained on" "$T/err"
check append-create-k16 0 "$FKVF" append --create "$T/livek16.fkvf" "$TRAIN" --k 16 --iters 2
empty append-create-k16-quiet "$T/err"
check append-help 0 "$FKVF" append --help
grep_in append-help-k "k by the rule of fkvf" "$T/out"

# --codebooks: the ratio with the shared file counted, and without it
check pack-ext 0 "$FKVF" pack "$T/c300.safetensors" -o "$T/x300.fkvf" --codebooks "$T/cb64.fkvf"
fb=$(size_of "$T/cb64.fkvf")
bytes=$(size_of "$T/x300.fkvf")
grep_in pack-ext-file "x with the codebook file (cb64.fkvf, $fb bytes), [0-9.]*x without it" "$T/out"
with=$(sed -n 's/.*ratio vs fp16 \([0-9.]*\)x with the codebook file.*/\1/p' "$T/out")
without=$(sed -n 's/.*bytes), \([0-9.]*\)x without it.*/\1/p' "$T/out")
approx pack-ext-ratio-with "$with" "$(awk -v f="$(fp16 300)" -v b="$bytes" -v c="$fb" 'BEGIN { print f / (b + c) }')"
approx pack-ext-ratio-without "$without" "$(awk -v f="$(fp16 300)" -v b="$bytes" 'BEGIN { print f / b }')"
# info: the same two ratios (the file found next to the archive)
check info-ext 0 "$FKVF" info "$T/x300.fkvf"
grep_in info-ext-ratio "ratio vs fp16   $with""x with the codebook file ($fb bytes" "$T/out"
finish cli_defaults
