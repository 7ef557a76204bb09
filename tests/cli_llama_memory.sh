#!/bin/sh
# fkvf import-llama and export-llama in bounded memory (issue 37): a 256 MiB
# llama.cpp sequence state of Llama-3-8B's cache shape (32 layers x 8 KV
# heads x 128 dims, f16, 2048 cells, V transposed: flash attention off;
# tests/mkllbig.py) imported archived (--codebooks) and lossless, each with
# a peak RSS (GNU time %M) under 100 MiB, and the archived archive exported
# under the same bound. The state is read a chunk of cells at a time (a lazy
# cache over the file) and written a chunk at a time at its offsets; before
# (main at ab29b93) the three peaked at 535, 535 and 541 MB. The lossless
# import runs with --no-index: the search index pass maps the finished
# archive (256 MiB of file pages counted in the RSS; not this code's
# memory). The lossless archive exports to the state byte for byte, with a
# peak under the archive's size + 64 MiB (the reader maps the archive; the
# state itself is streamed; before: 780 MB).
# usage: cli_llama_memory.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
. "$(dirname "$0")/cli_lib.sh"
PY=/usr/bin/python3
[ -x /usr/bin/time ] || { echo "SKIP: no GNU time at /usr/bin/time"; exit 77; }
"$PY" -c 'import numpy' 2>/dev/null || { echo "SKIP: $PY has no numpy"; exit 77; }
BOUND_KIB=$((100 * 1024))
# under ASan the shadow memory and the allocator's quarantine inflate the RSS:
# FKVF_TEST_SANITIZER turns the bounds off and keeps every other check
under() { [ -n "${FKVF_TEST_SANITIZER:-}" ] || [ "$1" -lt "$2" ]; }
peak_under() { # NAME BOUND_KIB: the peak of the last run
    peak=$(tail -1 "$T/time")
    echo "$1: peak RSS $peak KiB"
    if under "$peak" "$2"; then pass=$((pass + 1)); else
        echo "FAIL $1: peak RSS $peak KiB, bound $2 KiB"; fails=$((fails + 1)); fi
}
"$PY" "$SRC/tests/mkgguf.py" "$T/m.gguf" --arch llama --name big-llama --layers 32 --embd 4096 \
    --heads 32 --kv-heads 8 --vocab 32000 || exit 1
big="--layers 32 --heads 8 --dim 128 --v-trans 1"
# shellcheck disable=SC2086
"$PY" "$SRC/tests/mkllbig.py" "$T/s.bin" $big --cells 2048 --seed 1 || exit 1
# shellcheck disable=SC2086
"$PY" "$SRC/tests/mkllbig.py" "$T/t.bin" $big --cells 256 --seed 2 || exit 1
size=$(wc -c <"$T/s.bin")
if [ "$size" -gt $((2 * BOUND_KIB * 1024)) ]; then pass=$((pass + 1)); else
    echo "FAIL: the state ($size bytes) is not larger than twice the bound"; fails=$((fails + 1)); fi
check train 0 "$FKVF" train "$T/t.bin" --model "$T/m.gguf" -o "$T/cb.fkvf" --k 16 --k-stages 2 \
    --v-stages 1 --iters 1 --threads 1
check "import archived" 0 /usr/bin/time -o "$T/time" -f %M "$FKVF" import-llama "$T/s.bin" \
    --model "$T/m.gguf" -o "$T/a.fkvf" --codebooks "$T/cb.fkvf" --threads 1
peak_under "import archived" $BOUND_KIB
check "export archived" 0 /usr/bin/time -o "$T/time" -f %M "$FKVF" export-llama "$T/a.fkvf" \
    -o "$T/a.bin" --threads 1
peak_under "export archived" $BOUND_KIB
check "exported size" 0 test "$(wc -c <"$T/a.bin")" -eq "$size"
rm -f "$T/a.bin" "$T/a.fkvf"
check "import lossless" 0 /usr/bin/time -o "$T/time" -f %M "$FKVF" import-llama "$T/s.bin" \
    --model "$T/m.gguf" -o "$T/l.fkvf" --no-index --threads 1
peak_under "import lossless" $BOUND_KIB
check "export lossless" 0 /usr/bin/time -o "$T/time" -f %M "$FKVF" export-llama "$T/l.fkvf" \
    -o "$T/l.bin" --threads 1
peak_under "export lossless" $(($(wc -c <"$T/l.fkvf") / 1024 + 64 * 1024))
check "the same bytes" 0 cmp "$T/s.bin" "$T/l.bin"
rm -f "$T"/*.bin "$T"/*.fkvf
finish cli_llama_memory
