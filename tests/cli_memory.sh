#!/bin/sh
# fkvf pack runs in bounded memory (issue 37, part 2): it reads the cache's
# rows from the file a chunk at a time (cacheio's lazy caches), writes exact
# rows in sections of one chunk and the index streams in segments of at most
# 32 MiB of codes. A 128 MiB cache (4 layers x 4 heads x dim 64, 32768
# positions, f16; bench/mkcache.py) is packed under a peak RSS (GNU time %M)
# of 64 MiB: with a codebook file (heads-first .npy), with every position
# exact (all 128 MiB as exact sections), and positions-first (a .safetensors
# with Hugging Face names, --layout nhd), and with token ids (the default
# second commit indexes them through a reader of the new archive); verify
# and info of that lossless archive stay under the bound too (the reader
# lets go of the pages of the sections it only checks). Reading whole, main
# (56acfe0) held the cache: 146-273 MiB; its verify 142 MiB. The positions-first cache gives the rows
# the heads-first one gives; the lossless archive restores the cache bit for
# bit; an archive of many index segments (FKVF_TEST_PACK_SEGMENT, positions
# per segment) restores the same rows as one of one segment, verifies, takes
# a search index and keeps its rows. A .npz of the cache, stored and
# deflated, packs under the bound too (its members' data go to a file in
# $TMPDIR, not to memory) into an archive of the same rows.
# usage: cli_memory.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
. "$(dirname "$0")/cli_lib.sh"
PY=/usr/bin/python3
[ -x /usr/bin/time ] || { echo "SKIP: no GNU time at /usr/bin/time"; exit 77; }
"$PY" -c 'import numpy' 2>/dev/null || { echo "SKIP: $PY has no numpy"; exit 77; }
BOUND_KIB=$((64 * 1024))
# ASan's shadow memory and quarantine inflate the RSS: FKVF_TEST_SANITIZER
# (tests/CMakeLists.txt, FKVF_SANITIZE builds) turns the bound off
under_bound() { [ -n "${FKVF_TEST_SANITIZER:-}" ] || [ "$1" -lt "$BOUND_KIB" ]; }
bounded() { # bounded NAME CMD...: exit 0 and a peak RSS under the bound
    name=$1
    shift
    check "$name" 0 /usr/bin/time -o "$T/time" -f %M "$@"
    peak=$(tail -1 "$T/time")
    echo "$name: peak RSS $peak KiB"
    if under_bound "$peak"; then pass=$((pass + 1)); else
        echo "FAIL $name: peak RSS $peak KiB, bound $BOUND_KIB KiB"; fails=$((fails + 1)); fi
}
same() { # same NAME A B
    if cmp -s "$2" "$3"; then pass=$((pass + 1)); else
        echo "FAIL $1: $2 and $3 differ"; fails=$((fails + 1)); fi
}
shape="--layers 4 --heads 4 --dim 64"
# shellcheck disable=SC2086
"$PY" "$SRC/bench/mkcache.py" -o "$T/raw.npy" --positions 32768 $shape >/dev/null || exit 1
# shellcheck disable=SC2086
"$PY" "$SRC/bench/mkcache.py" -o "$T/train.npy" --positions 512 $shape >/dev/null || exit 1
raw=$(wc -c <"$T/raw.npy")
if [ "$raw" -gt $((2 * BOUND_KIB * 1024)) ]; then pass=$((pass + 1)); else
    echo "FAIL: the cache ($raw bytes) is not larger than twice the bound"; fails=$((fails + 1)); fi
check train 0 "$FKVF" train "$T/train.npy" -o "$T/cb.fkvf" --k 16 --k-stages 2 --v-stages 1 \
    --iters 1 --no-rope
bounded pack-codebooks "$FKVF" pack "$T/raw.npy" --codebooks "$T/cb.fkvf" --no-rope -o "$T/a.fkvf"
check unpack-a 0 "$FKVF" unpack "$T/a.fkvf" -o "$T/a.npy"
# .npz (stored as numpy.savez writes it, and deflated as savez_compressed):
# the key and value members are inflated into an unlinked file in $TMPDIR
# and read from it a chunk at a time as a .npy's; the same archive rows
"$PY" -c "
import sys, numpy as np
a = np.load(sys.argv[1], mmap_mode='r')
d = {}
for l in range(a.shape[0]):
    d['layers.%d.key' % l] = a[l, 0]
    d['layers.%d.value' % l] = a[l, 1]
np.savez(sys.argv[2], **d)
np.savez_compressed(sys.argv[3], **d)
" "$T/raw.npy" "$T/s.npz" "$T/c.npz" || exit 1
mkdir -p "$T/spill"
for z in s c; do
    TMPDIR=$T/spill bounded "pack-npz-$z" "$FKVF" pack "$T/$z.npz" --codebooks "$T/cb.fkvf" \
        --no-rope -o "$T/z$z.fkvf"
    check "unpack-npz-$z" 0 "$FKVF" unpack "$T/z$z.fkvf" -o "$T/z$z.npy"
    same "npz-$z-rows" "$T/a.npy" "$T/z$z.npy"
    rm -f "$T/z$z.npy" "$T/z$z.fkvf"
done
if [ -z "$(ls "$T/spill")" ]; then pass=$((pass + 1)); else
    echo "FAIL: files left in TMPDIR:"; ls -la "$T/spill"; fails=$((fails + 1)); fi
# no room for the spill file: the error names the directory
TMPDIR=$T/no-such-dir check npz-no-tmpdir 2 "$FKVF" pack "$T/s.npz" --codebooks "$T/cb.fkvf" \
    --no-rope -o "$T/zx.fkvf"
grep_in npz-no-tmpdir "temporary file in $T/no-such-dir" "$T/err"
rm -f "$T/s.npz" "$T/c.npz"
# every position exact: 128 MiB of exact rows, written a chunk at a time
bounded pack-lossless "$FKVF" pack "$T/raw.npy" --sinks 32768 -o "$T/x.fkvf"
check unpack-x 0 "$FKVF" unpack "$T/x.fkvf" -o "$T/x.npy"
check compare-x 0 "$FKVF" compare "$T/raw.npy" "$T/x.npy" --json
grep_in lossless '"max_abs_err":0[,}]' "$T/out"
# with token ids: the default second commit indexes them, through a reader
# of the new archive, whose open checks every EXAC section (128 MiB) and
# lets go of its pages; verify reads every section once, info opens
"$PY" "$SRC/tests/mktokcache.py" "$T/tok.safetensors" --layers 4 --heads 4 --positions 32768 \
    --dim 64 --seed 3 || exit 1
bounded pack-lossless-tokens "$FKVF" pack "$T/tok.safetensors" --sinks 32768 --no-rope -o "$T/t.fkvf"
rm -f "$T/tok.safetensors"
bounded verify-lossless "$FKVF" verify "$T/t.fkvf"
bounded info-lossless "$FKVF" info "$T/t.fkvf"
# compact copies the exact rows in sections of 8 MiB, letting go of the
# source's pages between them (it held the rows twice and the file: 404 MiB)
bounded compact-lossless "$FKVF" compact "$T/t.fkvf" -o "$T/tc.fkvf"
check verify-compacted 0 "$FKVF" verify "$T/tc.fkvf"
# unpack lets go of the archive's pages after each chunk it restores
bounded unpack-lossless "$FKVF" unpack "$T/t.fkvf" -o "$T/t.npy"
check unpack-tc 0 "$FKVF" unpack "$T/tc.fkvf" -o "$T/tc.npy"
same compacted-rows "$T/t.npy" "$T/tc.npy"
rm -f "$T/t.fkvf" "$T/tc.fkvf" "$T/t.npy" "$T/tc.npy"
# positions-first with Hugging Face names: the same rows, so the same codes
check unpack-nhd 0 "$FKVF" unpack "$T/x.fkvf" -o "$T/n.safetensors" --hf --layout nhd
rm -f "$T/x.fkvf" "$T/x.npy"
bounded pack-nhd "$FKVF" pack "$T/n.safetensors" --layout nhd --codebooks "$T/cb.fkvf" --no-rope \
    -o "$T/n.fkvf"
rm -f "$T/n.safetensors"
check unpack-n 0 "$FKVF" unpack "$T/n.fkvf" -o "$T/n.npy" --layout hnd --names fkvf
same nhd-rows "$T/a.npy" "$T/n.npy"
rm -f "$T/n.fkvf" "$T/n.npy"
# many index segments (992 positions each: 1000 rounded down to the
# alignment of 4-bit symbols, 32): the rows of one segment
FKVF_TEST_PACK_SEGMENT=1000 bounded pack-segments "$FKVF" pack "$T/raw.npy" \
    --codebooks "$T/cb.fkvf" --no-rope -o "$T/s.fkvf"
segments() { # segments ARCHIVE: its index STRM sections (group key 0)
    "$FKVF" dump "$1" | awk '$2 == "STRM" && $7 == "0"' | wc -l
}
n=$(segments "$T/s.fkvf")
m=$(segments "$T/a.fkvf")
if [ "$n" -eq 33 ] && [ "$m" -eq 1 ]; then pass=$((pass + 1)); else
    echo "FAIL segments: $n and $m index segments, want 33 and 1"; fails=$((fails + 1)); fi
check verify-s 0 "$FKVF" verify "$T/s.fkvf" --codebooks "$T/cb.fkvf"
check unpack-s 0 "$FKVF" unpack "$T/s.fkvf" -o "$T/s.npy"
same segment-rows "$T/a.npy" "$T/s.npy"
check index-s 0 "$FKVF" index "$T/s.fkvf"
check verify-si 0 "$FKVF" verify "$T/s.fkvf" --codebooks "$T/cb.fkvf"
rm -f "$T/s.npy"
check unpack-si 0 "$FKVF" unpack "$T/s.fkvf" -o "$T/s.npy"
same indexed-rows "$T/a.npy" "$T/s.npy"
# compact writes the index streams in segments of at most 32 MiB of codes:
# 2,048 streams (32 layers x 8 heads, K x4 V x4) of 9,000 archived
# positions are two segments (8,192 positions each at most), which restore
# the rows of the one-segment archive
# shellcheck disable=SC2086
"$PY" "$SRC/bench/mkcache.py" -o "$T/wide.npy" --positions 9036 --layers 32 --heads 8 --dim 8 \
    >/dev/null || exit 1
check train-wide 0 "$FKVF" train "$T/wide.npy" -o "$T/cbw.fkvf" --k 16 --k-stages 4 --v-stages 4 \
    --iters 1 --no-rope
check pack-wide 0 "$FKVF" pack "$T/wide.npy" --codebooks "$T/cbw.fkvf" --no-rope -o "$T/w.fkvf"
n=$(segments "$T/w.fkvf")
if [ "$n" -eq 2 ]; then pass=$((pass + 1)); else
    echo "FAIL wide-pack-segments: $n index segments, want 2"; fails=$((fails + 1)); fi
FKVF_TEST_PACK_SEGMENT=64 check pack-wide-64 0 "$FKVF" pack "$T/wide.npy" --codebooks \
    "$T/cbw.fkvf" --no-rope -o "$T/w64.fkvf"
check compact-wide 0 "$FKVF" compact "$T/w64.fkvf" -o "$T/wc.fkvf"
n=$(segments "$T/wc.fkvf")
if [ "$n" -eq 2 ]; then pass=$((pass + 1)); else
    echo "FAIL wide-compact-segments: $n index segments, want 2"; fails=$((fails + 1)); fi
check unpack-w 0 "$FKVF" unpack "$T/w.fkvf" -o "$T/w.npy"
check unpack-wc 0 "$FKVF" unpack "$T/wc.fkvf" -o "$T/wc.npy"
same wide-compacted-rows "$T/w.npy" "$T/wc.npy"
finish cli_memory
