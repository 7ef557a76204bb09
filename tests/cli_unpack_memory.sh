#!/bin/sh
# fkvf unpack runs in bounded memory (issue 16 row 2): a 128 MiB cache (4
# layers x 4 heads x dim 64, 32768 positions, f16; bench/mkcache.py) packed
# with a small codebook, unpacked to .safetensors, .npz and .npy with a peak
# RSS (GNU time %M) under 64 MiB each. The whole-cache unpack of main
# (e80c818) peaked at 151 MiB on this archive, the streaming one at 23-25 MiB
# (16 MiB of them the chunk of restored rows). Each output also compares
# equal in shape to the cache (fkvf compare exit 0) and its exact positions
# (the first 4 and last 32, pack's defaults) are bit-identical.
# Then a cache with token ids and metadata, 2 x 2 x 64 x 70001 positions (70
# MB: five chunks of rows, two of token ids), packed with an embedded
# codebook, unpacked to each format heads-first, positions-first with HF
# names, and as f32: under the bound, and UNPACK_CHECK (tests/unpack_check.c)
# finds every element equal to fkvf_reader_restore's and every token id to
# the archive's. Under a pseudo-terminal (script(1), when there is one)
# unpack draws its progress bar with an ETA and a final "done in" line; with
# stderr on a file, none. An unpack killed by SIGTERM or SIGHUP leaves no
# temporary file.
# usage: cli_unpack_memory.sh FKVF_BIN SRCDIR UNPACK_CHECK
set -u
FKVF=$1
SRC=$2
CHECK=$3
. "$(dirname "$0")/cli_lib.sh"
PY=/usr/bin/python3
[ -x /usr/bin/time ] || { echo "SKIP: no GNU time at /usr/bin/time"; exit 77; }
"$PY" -c 'import numpy' 2>/dev/null || { echo "SKIP: $PY has no numpy"; exit 77; }
BOUND_KIB=$((64 * 1024))
# under ASan the shadow memory and the allocator's quarantine inflate the RSS
# (72 MiB seen for the .npz case): FKVF_TEST_SANITIZER (set by
# tests/CMakeLists.txt in an FKVF_SANITIZE build) turns the bound off and
# keeps every other check
under_bound() { [ -n "${FKVF_TEST_SANITIZER:-}" ] || [ "$1" -lt "$BOUND_KIB" ]; }
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
    if under_bound "$peak"; then pass=$((pass + 1)); else
        echo "FAIL unpack-$ext: peak RSS $peak KiB, bound $BOUND_KIB KiB"; fails=$((fails + 1)); fi
    echo "unpack to .$ext: peak RSS $peak KiB"
    check "compare-$ext" 0 "$FKVF" compare "$T/raw.npy" "$T/y.$ext" --sinks 4 --recent 32 --json
    grep_in "exact-$ext" '"exact_positions":36,"exact_identical":36,' "$T/out"
    rm -f "$T/y.$ext"
done
# an unpack ended by SIGTERM or SIGHUP while it streams (its temporary file
# exists from the start) leaves nothing behind: the tools' handler removes
# the temporary name and the process dies of the signal (exit 128 + n).
# (SIGINT is ignored by a background job of a non-interactive shell, and a
# handler is only installed for a signal at its default disposition.)
mkdir "$T/k"
for sig in TERM HUP; do
    for ext in safetensors npz npy; do
        "$FKVF" unpack "$T/a.fkvf" -o "$T/k/y.$ext" >/dev/null 2>&1 &
        pid=$!
        n=0
        while [ $n -lt 1000 ] && ! ls "$T/k" | grep -q 'tmp-'; do
            sleep 0.01
            n=$((n + 1))
        done
        seen=$(ls "$T/k" | grep -c 'tmp-')
        kill -s "$sig" "$pid" 2>/dev/null
        wait "$pid"
        rc=$?
        left=$(ls -A "$T/k")
        if [ "$seen" -ge 1 ] && [ "$rc" -gt 128 ] && [ -z "$left" ]; then pass=$((pass + 1)); else
            echo "FAIL sig$sig-$ext: temporary file seen $seen, exit $rc, left: '$left'"
            fails=$((fails + 1))
        fi
        rm -f "$T"/k/*
    done
done
# the cache with token ids: layers.{i}.key/.value [H, T, D] f16, tokens [T] int64
"$PY" "$SRC/tests/mktokcache.py" "$T/tok.safetensors" --layers 2 --heads 2 --positions 70001 \
    --dim 64 --seed 1 --key-ramp --meta model=synthetic || exit 1
check pack-tok 0 "$FKVF" pack "$T/tok.safetensors" -o "$T/tok.fkvf" --k 16 --k-stages 2 --v-stages 1 \
    --iters 2 --no-rope
rm -f "$T/tok.safetensors"
if command -v script >/dev/null 2>&1; then
    check progress-tty 0 script -qec "'$FKVF' unpack '$T/tok.fkvf' -o '$T/p.safetensors'" /dev/null
    tr '\r' '\n' <"$T/out" >"$T/tty"
    grep_in progress-tty-final '^unpack \[##############################\] 100%  done in [0-9][0-9hms.]* *$' "$T/tty"
    rm -f "$T/p.safetensors"
    check progress-file 0 "$FKVF" unpack "$T/tok.fkvf" -o "$T/p.safetensors"
    if grep -q 'unpack \[' "$T/err"; then echo "FAIL progress-file: a bar on a file"; fails=$((fails + 1)); else
        pass=$((pass + 1)); fi
    rm -f "$T/p.safetensors"
fi
for ext in safetensors npz npy; do
    for opts in "" "--hf --layout nhd" "--dtype f32"; do
        lay=hnd
        case $opts in *nhd*) lay=nhd ;; esac
        # shellcheck disable=SC2086
        check "unpack-tok-$ext$opts" 0 /usr/bin/time -o "$T/time" -f %M "$FKVF" unpack "$T/tok.fkvf" \
            -o "$T/y.$ext" $opts
        peak=$(tail -1 "$T/time")
        if under_bound "$peak"; then pass=$((pass + 1)); else
            echo "FAIL unpack-tok-$ext$opts: peak RSS $peak KiB, bound $BOUND_KIB KiB"; fails=$((fails + 1)); fi
        check "restore-equal-$ext$opts" 0 "$CHECK" "$T/tok.fkvf" "$T/y.$ext" $lay
        want="token ids"
        [ "$ext" = npy ] && want="no token ids"
        grep_in "restore-equal-$ext$opts" "ok 70001 positions, .*, $want\$" "$T/out"
        rm -f "$T/y.$ext"
    done
done
finish cli_unpack_memory
