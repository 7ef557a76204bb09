#!/bin/sh
# fkvf unpack runs in bounded memory (issue 16 row 2): a 128 MiB cache (4
# layers x 4 heads x dim 64, 32768 positions, f16; bench/mkcache.py) packed
# with a small codebook, unpacked to .safetensors, .npz and .npy with a peak
# RSS (GNU time %M) under 64 MiB each. The whole-cache unpack of main
# (e80c818) peaked at 151 MiB on this archive, the streaming one at 23-25 MiB
# (16 MiB of them the chunk of restored rows). Each output also compares
# equal in shape to the cache (fkvf compare exit 0) and its exact positions
# (the first 4 and last 32, pack's defaults) are bit-identical.
# usage: cli_unpack_memory.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
. "$(dirname "$0")/cli_lib.sh"
PY=/usr/bin/python3
[ -x /usr/bin/time ] || { echo "SKIP: no GNU time at /usr/bin/time"; exit 77; }
"$PY" -c 'import numpy' 2>/dev/null || { echo "SKIP: $PY has no numpy"; exit 77; }
BOUND_KIB=$((64 * 1024))
shape="--layers 4 --heads 4 --dim 64"
# shellcheck disable=SC2086
"$PY" "$SRC/bench/mkcache.py" -o "$T/raw.npy" --positions 32768 $shape >/dev/null || exit 1
# shellcheck disable=SC2086
"$PY" "$SRC/bench/mkcache.py" -o "$T/train.npy" --positions 512 $shape >/dev/null || exit 1
check train 0 "$FKVF" train "$T/train.npy" -o "$T/cb.fkvf" --k 16 --k-stages 2 --v-stages 1 --iters 1
check pack 0 "$FKVF" pack "$T/raw.npy" --codebooks "$T/cb.fkvf" -o "$T/a.fkvf"
raw=$(wc -c <"$T/raw.npy")
if [ "$raw" -gt $((2 * BOUND_KIB * 1024)) ]; then pass=$((pass + 1)); else
    echo "FAIL: the cache ($raw bytes) is not larger than twice the bound"; fails=$((fails + 1)); fi
for ext in safetensors npz npy; do
    check "unpack-$ext" 0 /usr/bin/time -o "$T/time" -f %M "$FKVF" unpack "$T/a.fkvf" -o "$T/y.$ext"
    peak=$(tail -1 "$T/time")
    if [ "$peak" -lt "$BOUND_KIB" ]; then pass=$((pass + 1)); else
        echo "FAIL unpack-$ext: peak RSS $peak KiB, bound $BOUND_KIB KiB"; fails=$((fails + 1)); fi
    echo "unpack to .$ext: peak RSS $peak KiB"
    check "compare-$ext" 0 "$FKVF" compare "$T/raw.npy" "$T/y.$ext" --sinks 4 --recent 32 --json
    grep_in "exact-$ext" '"exact_positions":36,"exact_identical":36,' "$T/out"
    rm -f "$T/y.$ext"
done
finish cli_unpack_memory
