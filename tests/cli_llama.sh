#!/bin/sh
# fkvf import-llama / export-llama / info on llama.cpp state files, with
# state files and GGUF headers written by this suite's own builders
# (tests/mkllstate.py, tests/mkgguf.py; independent of tools/llama_state.c
# and tools/gguf.c): lossless round trips byte for byte over types, V
# layouts, kinds, streams and token ids; layout and type changes on export;
# incremental appends of later saves; archived imports; every refusal with
# its message; truncated and bit-flipped state files and GGUF headers (no
# crash, an error line). The real llama.cpp is in tests/llama_*.sh.
# usage: cli_llama.sh FKVF SRCDIR
FKVF=$1
SRC=$2
PY=/usr/bin/python3
[ -x "$PY" ] || { echo "cli_llama: SKIPPED: $PY not found"; exit 77; }
. "$SRC/tests/cli_lib.sh"
ST="$PY $SRC/tests/mkllstate.py"
# FKVF_TEST_SPARSE=1 (the sanitizer run of scripts/test.sh, where every fkvf
# run costs about five times more and the damaged inputs below took 150 of
# the test's 165 s): every third damaged input, in the structure fields (the
# first 64 bytes / 512 bits) as after them; the plain build runs them all,
# and fuzz_llama_state / fuzz_gguf take the parsers through ASan in-process
SPARSE=${FKVF_TEST_SPARSE:-0}
if [ "$SPARSE" = 1 ]; then SP=3; else SP=1; fi
GG="$PY $SRC/tests/mkgguf.py"

# a llama-like model: 3 layers, 8 heads, 2 KV heads (GQA), head dim 8
$GG "$T/m.gguf" --arch llama --name tiny-llama --layers 3 --embd 64 --heads 8 --kv-heads 2 --vocab 512
SHAPE="--layers 3 --heads 2 --dim 8"

# ---- lossless round trips ----------------------------------------------------
n=0
for ty in f16 f32 bf16; do
    for vt in 0 1; do
        for kind in seq session; do
            n=$((n + 1))
            $ST "$T/s$n.bin" $SHAPE --cells 17 --type "$ty" --v-trans "$vt" --kind "$kind" --seed "$n"
            check "import $ty v$vt $kind" 0 "$FKVF" import-llama "$T/s$n.bin" --model "$T/m.gguf" -o "$T/a$n.fkvf"
            check "export $ty v$vt $kind" 0 "$FKVF" export-llama "$T/a$n.fkvf" -o "$T/e$n.bin"
            check "same bytes $ty v$vt $kind" 0 cmp "$T/s$n.bin" "$T/e$n.bin"
        done
    done
done
# two streams (the cells in the second), no token ids, another sequence id
$ST "$T/st.bin" $SHAPE --cells 9 --n-stream 2 --stream 1 --tokens 0 --seq-id 3
check "import 2 streams" 0 "$FKVF" import-llama "$T/st.bin" --model "$T/m.gguf" -o "$T/st.fkvf"
check "export 2 streams" 0 "$FKVF" export-llama "$T/st.fkvf" -o "$T/st2.bin"
check "same bytes 2 streams" 0 cmp "$T/st.bin" "$T/st2.bin"
# K f16 and V f32: archived as f32, exported back to the two types
$ST "$T/mx.bin" $SHAPE --cells 11 --type f16 --vtype f32
check "import mixed types" 0 "$FKVF" import-llama "$T/mx.bin" --model "$T/m.gguf" -o "$T/mx.fkvf" --json
grep_in "mixed: positions" '"positions":11' "$T/out"
check "export mixed types" 0 "$FKVF" export-llama "$T/mx.fkvf" -o "$T/mx2.bin"
check "same bytes mixed types" 0 cmp "$T/mx.bin" "$T/mx2.bin"
# an empty state (no cells) is refused: nothing to archive
$ST "$T/empty.bin" $SHAPE --cells 0 --tokens 0
check "empty state" 1 "$FKVF" import-llama "$T/empty.bin" --model "$T/m.gguf" -o "$T/empty.fkvf"

# ---- layout, type and kind changes on export ---------------------------------
$ST "$T/v0.bin" $SHAPE --cells 13 --v-trans 0 --seed 7
$ST "$T/v1.bin" $SHAPE --cells 13 --v-trans 1 --seed 7
check "import v0" 0 "$FKVF" import-llama "$T/v0.bin" --model "$T/m.gguf" -o "$T/v0.fkvf"
check "export --v-trans 1" 0 "$FKVF" export-llama "$T/v0.fkvf" -o "$T/v0t.bin" --v-trans 1 --json
grep_in "export json v_trans" '"v_trans":1' "$T/out"
check "v_trans 1 = the transposed file" 0 cmp "$T/v1.bin" "$T/v0t.bin"
check "export --dtype f32" 0 "$FKVF" export-llama "$T/v0.fkvf" -o "$T/v0f32.bin" --dtype f32
check "import the f32 export" 0 "$FKVF" import-llama "$T/v0f32.bin" --model "$T/m.gguf" -o "$T/v0f32.fkvf"
check "export back to f16" 0 "$FKVF" export-llama "$T/v0f32.fkvf" -o "$T/v0f16.bin" --dtype f16
check "f16 -> f32 -> f16 is exact" 0 cmp "$T/v0.bin" "$T/v0f16.bin"
check "export --session" 0 "$FKVF" export-llama "$T/v0.fkvf" -o "$T/v0s.bin" --session
check "info: a session" 0 "$FKVF" info "$T/v0s.bin"
grep_in "info session" "session" "$T/out"
grep_in "info session arch" "architecture  llama" "$T/out"
check "import the session" 0 "$FKVF" import-llama "$T/v0s.bin" --model "$T/m.gguf" -o "$T/v0s.fkvf"
check "export --seq" 0 "$FKVF" export-llama "$T/v0s.fkvf" -o "$T/v0q.bin" --seq
check "seq -> session -> seq is exact" 0 cmp "$T/v0.bin" "$T/v0q.bin"

# ---- info ------------------------------------------------------------------------
check "info on a state file" 0 "$FKVF" info "$T/v1.bin"
grep_in "info names it" "llama.cpp sequence state" "$T/out"
grep_in "info says how" "fkvf import-llama" "$T/out"
check "info --json" 0 "$FKVF" info "$T/v1.bin" --json
grep_in "info json" '"format":"llama.cpp"' "$T/out"
grep_in "info json cells" '"cells":13' "$T/out"
check "info on the archive" 0 "$FKVF" info "$T/v0.fkvf"
grep_in "archive model id" "tiny-llama" "$T/out"

# ---- incremental: later saves of one sequence appended -----------------------------
$ST "$T/i1.bin" $SHAPE --cells 20 --seed 9
$ST "$T/i2.bin" $SHAPE --cells 35 --seed 9
$ST "$T/i3.bin" $SHAPE --cells 50 --seed 9
check "incr import" 0 "$FKVF" import-llama "$T/i1.bin" --model "$T/m.gguf" -o "$T/i.fkvf"
check "incr append 2" 0 "$FKVF" import-llama "$T/i2.bin" --model "$T/m.gguf" --append "$T/i.fkvf"
check "incr append 3" 0 "$FKVF" import-llama "$T/i3.bin" --model "$T/m.gguf" --append "$T/i.fkvf" --json
check "incr export" 0 "$FKVF" export-llama "$T/i.fkvf" -o "$T/i3e.bin"
check "incr = last save" 0 cmp "$T/i3.bin" "$T/i3e.bin"
check "incr: the same save again appends nothing" 0 "$FKVF" import-llama "$T/i3.bin" --model "$T/m.gguf" --append "$T/i.fkvf"
check "incr export again" 0 "$FKVF" export-llama "$T/i.fkvf" -o "$T/i3f.bin"
check "incr still = last save" 0 cmp "$T/i3.bin" "$T/i3f.bin"
# token ids above the first save's: the token stream is as wide as the
# model's vocabulary (512), not the first save's largest id
$ST "$T/w1.bin" $SHAPE --cells 10 --seed 5
$ST "$T/w2.bin" $SHAPE --cells 200 --seed 5
check "wide: import 10" 0 "$FKVF" import-llama "$T/w1.bin" --model "$T/m.gguf" -o "$T/w.fkvf"
check "wide: append 200 (ids up to 258)" 0 "$FKVF" import-llama "$T/w2.bin" --model "$T/m.gguf" --append "$T/w.fkvf"
check "wide: export" 0 "$FKVF" export-llama "$T/w.fkvf" -o "$T/w2e.bin"
check "wide: = last save" 0 cmp "$T/w2.bin" "$T/w2e.bin"
# a later save of another sequence without token ids: its rows differ
$ST "$T/n1.bin" $SHAPE --cells 20 --seed 9 --tokens 0
$ST "$T/n2.bin" $SHAPE --cells 35 --seed 77 --tokens 0
check "no tokens: import" 0 "$FKVF" import-llama "$T/n1.bin" --model "$T/m.gguf" -o "$T/n.fkvf"
check "no tokens: another sequence" 1 "$FKVF" import-llama "$T/n2.bin" --model "$T/m.gguf" --append "$T/n.fkvf"
grep_in "another sequence named" "position 0 differs" "$T/err"
$ST "$T/n3.bin" $SHAPE --cells 35 --seed 9 --tokens 0
check "no tokens: the same sequence" 0 "$FKVF" import-llama "$T/n3.bin" --model "$T/m.gguf" --append "$T/n.fkvf"
# the same token ids, other rows (seed 78): refused
$ST "$T/o2.bin" $SHAPE --cells 60 --seed 78
check "same tokens, other rows" 1 "$FKVF" import-llama "$T/o2.bin" --model "$T/m.gguf" --append "$T/i.fkvf"
# a save of another context (V layout, streams, sequence id): refused
$ST "$T/c2.bin" $SHAPE --cells 60 --seed 9 --v-trans 1
check "other v_trans" 1 "$FKVF" import-llama "$T/c2.bin" --model "$T/m.gguf" --append "$T/i.fkvf"
grep_in "other v_trans named" "llama.v_trans is 1" "$T/err"
$ST "$T/c3.bin" $SHAPE --cells 60 --seed 9 --n-stream 2 --stream 1 --seq-id 1
check "other streams" 1 "$FKVF" import-llama "$T/c3.bin" --model "$T/m.gguf" --append "$T/i.fkvf"
check "still = last save" 0 "$FKVF" export-llama "$T/i.fkvf" -o "$T/i3g.bin"
check "refusals changed nothing" 0 cmp "$T/i3.bin" "$T/i3g.bin"
# another sequence (other tokens) is refused
$ST "$T/other.bin" $SHAPE --cells 60 --seed 9 --token-salt 5
check "append another sequence" 1 "$FKVF" import-llama "$T/other.bin" --model "$T/m.gguf" --append "$T/i.fkvf"
# another model (same shape, other file: other weights hash) is refused
$GG "$T/m2.gguf" --arch llama --name other-llama --layers 3 --embd 64 --heads 8 --kv-heads 2
check "append with another model" 1 "$FKVF" import-llama "$T/i3.bin" --model "$T/m2.gguf" --append "$T/i.fkvf"
grep_in "another model named" "another model" "$T/err"
# the same through fkvf append
cp "$T/i.fkvf" "$T/j.fkvf"
$ST "$T/i4.bin" $SHAPE --cells 64 --seed 9
check "fkvf append --model --new" 0 "$FKVF" append "$T/j.fkvf" "$T/i4.bin" --model "$T/m.gguf" --new
check "export after fkvf append" 0 "$FKVF" export-llama "$T/j.fkvf" -o "$T/i4e.bin"
check "fkvf append = last save" 0 cmp "$T/i4.bin" "$T/i4e.bin"

# ---- archived imports ----------------------------------------------------------
$ST "$T/big.bin" $SHAPE --cells 120 --seed 11
check "import --train" 0 "$FKVF" import-llama "$T/big.bin" --model "$T/m.gguf" -o "$T/big.fkvf" --train --k 16 --recent 8 --json
grep_in "archived positions" '"archived":108' "$T/out"
check "import --train, a short state" 0 "$FKVF" import-llama "$T/v0.bin" --model "$T/m.gguf" -o "$T/v0t.fkvf" --train --k 16 --sinks 1 --recent 2
grep_in "--train advice in import-llama's words" "fkvf train STATE... --model MODEL.gguf" "$T/err"
check "export archived" 0 "$FKVF" export-llama "$T/big.fkvf" -o "$T/bige.bin"
check "archived: same size" 0 test "$(wc -c <"$T/big.bin")" -eq "$(wc -c <"$T/bige.bin")"
check "archived export is a state file" 0 "$FKVF" info "$T/bige.bin"
check "compare the states" 0 "$FKVF" compare "$T/big.bin" "$T/bige.bin" --model "$T/m.gguf" --sinks 4 --recent 8 --json
grep_in "compare: exact positions" '"exact_identical":12' "$T/out"
for i in 1 2 3; do $ST "$T/tr$i.bin" $SHAPE --cells 80 --seed $((20 + i)); done
check "train on state files" 0 "$FKVF" train "$T/tr1.bin" "$T/tr2.bin" "$T/tr3.bin" --model "$T/m.gguf" -o "$T/cb.fkvf" --k 16
check "import --codebooks" 0 "$FKVF" import-llama "$T/big.bin" --model "$T/m.gguf" -o "$T/bigc.fkvf" --codebooks "$T/cb.fkvf"
check "--k with --codebooks" 0 "$FKVF" import-llama "$T/big.bin" --model "$T/m.gguf" -o "$T/bigk.fkvf" --codebooks "$T/cb.fkvf" --k 64
grep_in "--k with --codebooks warned" "is an option of --train, ignored" "$T/err"
check "export with the codebook file" 0 "$FKVF" export-llama "$T/bigc.fkvf" -o "$T/bigce.bin"
check "codebooks: same size" 0 test "$(wc -c <"$T/big.bin")" -eq "$(wc -c <"$T/bigce.bin")"

# ---- refusals --------------------------------------------------------------------
check "no --model" 2 "$FKVF" import-llama "$T/v0.bin" -o "$T/x.fkvf"
grep_in "no --model message" "model" "$T/err"
check "pack without --model" 2 "$FKVF" pack "$T/v0.bin" -o "$T/x.fkvf"
grep_in "pack says --model" "give --model" "$T/err"
check "STATE is the GGUF" 1 "$FKVF" import-llama "$T/m.gguf" --model "$T/m.gguf" -o "$T/x.fkvf"
grep_in "GGUF named" "GGUF" "$T/err"
$GG "$T/m4.gguf" --arch llama --layers 4 --embd 64 --heads 8 --kv-heads 2
check "model with other layers" 1 "$FKVF" import-llama "$T/v0.bin" --model "$T/m4.gguf" -o "$T/x.fkvf"
$GG "$T/mh.gguf" --arch llama --layers 3 --embd 64 --heads 8 --kv-heads 4
check "model with other heads" 1 "$FKVF" import-llama "$T/v0.bin" --model "$T/mh.gguf" -o "$T/x.fkvf"
$ST "$T/shift.bin" $SHAPE --cells 10 --pos-start 4
check "positions not from 0" 1 "$FKVF" import-llama "$T/shift.bin" --model "$T/m.gguf" -o "$T/x.fkvf"
grep_in "positions named" "pos" "$T/err"
$ST "$T/multi.bin" $SHAPE --cells 10 --n-seq-id 2
check "cells in two sequences" 1 "$FKVF" import-llama "$T/multi.bin" --model "$T/m.gguf" -o "$T/x.fkvf"
grep_in "sequences named" "sequence" "$T/err"
check "output exists" 1 "$FKVF" import-llama "$T/v0.bin" --model "$T/m.gguf" -o "$T/v0.fkvf"
cp "$T/m.gguf" "$T/keep.gguf"
check "output is the model" 1 "$FKVF" import-llama "$T/v0.bin" --model "$T/m.gguf" -o "$T/m.gguf" --force
check "train output is the model" 1 "$FKVF" train "$T/tr1.bin" --model "$T/m.gguf" -o "$T/m.gguf" --force
check "the model is untouched" 0 cmp "$T/m.gguf" "$T/keep.gguf"
check "archived options, lossless" 2 "$FKVF" import-llama "$T/v0.bin" --model "$T/m.gguf" -o "$T/x.fkvf" --recent 8
grep_in "archived options named" "add --codebooks FILE or --train" "$T/err"
check "STATE is a directory" 2 "$FKVF" import-llama "$T" --model "$T/m.gguf" -o "$T/x.fkvf"
$ST "$T/sq.bin" $SHAPE --cells 10 --kind session --arch qwen2
check "session of another architecture" 1 "$FKVF" import-llama "$T/sq.bin" --model "$T/m.gguf" -o "$T/x.fkvf"
grep_in "architecture named" "architecture 'qwen2'" "$T/err"
$GG "$T/vl.gguf" --arch qwen2vl --layers 3 --embd 64 --heads 8 --kv-heads 2
check "M-RoPE model" 1 "$FKVF" import-llama "$T/v0.bin" --model "$T/vl.gguf" -o "$T/x.fkvf"
grep_in "M-RoPE named" "M-RoPE" "$T/err"
$GG "$T/unk.gguf" --arch notanarch --layers 3 --embd 64 --heads 8 --kv-heads 2
check "unknown architecture: lossless" 0 "$FKVF" import-llama "$T/v0.bin" --model "$T/unk.gguf" -o "$T/unk.fkvf"
grep_in "unknown architecture noted" "not one fkvf knows" "$T/err"
check "unknown architecture: info" 0 "$FKVF" info "$T/unk.fkvf"
cp "$T/out" "$T/info-unk"
check "unknown architecture: no RoPE recorded" 1 grep -q "^keys .*RoPE" "$T/info-unk"
check "unknown architecture: info has its cache" 0 grep -q "^cache " "$T/info-unk"
check "llama: RoPE recorded" 0 "$FKVF" info "$T/v0.fkvf"
grep_in "llama: interleaved pairs" "interleaved pairs" "$T/out"
$GG "$T/sc.gguf" --arch llama --layers 3 --embd 64 --heads 8 --kv-heads 2 --scaling yarn
check "scaled RoPE" 0 "$FKVF" import-llama "$T/v0.bin" --model "$T/sc.gguf" -o "$T/sc.fkvf" --train --k 16
grep_in "scaled RoPE noted" "scaled" "$T/err"
check "export output exists" 1 "$FKVF" export-llama "$T/v0.fkvf" -o "$T/v1.bin"
check "export over its input" 1 "$FKVF" export-llama "$T/v0.fkvf" -o "$T/v0.fkvf" --force
check "export bad --v-trans" 2 "$FKVF" export-llama "$T/v0.fkvf" -o "$T/x.bin" --v-trans 2
check "export bad --dtype" 2 "$FKVF" export-llama "$T/v0.fkvf" -o "$T/x.bin" --dtype q8_0
"$FKVF" pack "$SRC/testdata/sample-cache.safetensors" -o "$T/plain.fkvf" >/dev/null 2>&1
check "export a plain archive" 1 "$FKVF" export-llama "$T/plain.fkvf" -o "$T/x.bin"
grep_in "plain archive named" "not imported from a llama.cpp" "$T/err"
check "verify on a state file" 1 "$FKVF" verify "$T/v0.bin"
grep_in "verify says what it is" "is a llama.cpp sequence state file, not an FKVF archive" "$T/err"
check "export-llama on a state file" 1 "$FKVF" export-llama "$T/v0.bin" -o "$T/x.bin"
grep_in "export says import first" "fkvf import-llama" "$T/err"
check "import-llama on an archive" 1 "$FKVF" import-llama "$T/v0.fkvf" --model "$T/m.gguf" -o "$T/x.fkvf"
grep_in "import says export" "it is an FKVF archive; fkvf export-llama" "$T/err"
check "--model given a state file" 1 "$FKVF" import-llama "$T/v0.bin" --model "$T/v1.bin" -o "$T/x.fkvf"
grep_in "--model says GGUF" "takes the GGUF model" "$T/err"
check "append an earlier save" 1 "$FKVF" import-llama "$T/i1.bin" --model "$T/m.gguf" --append "$T/i.fkvf"
grep_in "earlier save named" "an earlier save" "$T/err"
"$FKVF" unpack "$T/v0.fkvf" -o "$T/v0.safetensors" >/dev/null 2>&1
"$FKVF" pack "$T/v0.safetensors" -o "$T/plain0.fkvf" --sinks 13 >/dev/null 2>&1
check "append a state to a pack archive" 1 "$FKVF" append "$T/plain0.fkvf" "$T/i3.bin" --model "$T/m.gguf" --new
grep_in "pack archive named" "not imported from a llama.cpp state file" "$T/err"
touch "$T/m.gguf" # another mtime: hashed again, the same weights
check "append after the model was touched" 0 "$FKVF" import-llama "$T/i4.bin" --model "$T/m.gguf" --append "$T/j.fkvf"
check "import --help" 0 "$FKVF" import-llama --help
grep_in "import help" "usage: fkvf import-llama" "$T/out"
check "export --help" 0 "$FKVF" export-llama --help
grep_in "export help" "usage: fkvf export-llama" "$T/out"
check "import json error" 2 "$FKVF" import-llama "$T/v0.bin" -o "$T/x.fkvf" --json
grep_in "json error object" '"error":{' "$T/out"

# ---- hostile inputs: no crash, an error line ----------------------------------------
# (every truncation and bit flip in process: test_llama_state, test_gguf)
crash() { # crash NAME STATUS: a signal (>= 128) or no error line on failure
    if [ "$2" -ge 128 ]; then
        echo "FAIL $1: exit $2 (a signal)"; fails=$((fails + 1))
    elif [ "$2" -ne 0 ] && ! grep -q "fkvf import-llama: " "$T/err"; then
        echo "FAIL $1: exit $2 without an error line"; cat "$T/err"; fails=$((fails + 1))
    else
        pass=$((pass + 1))
    fi
}
$ST "$T/small.bin" --layers 3 --heads 2 --dim 8 --cells 3 --v-trans 1
size=$(wc -c <"$T/small.bin")
cut=0
while [ "$cut" -lt "$size" ]; do
    head -c "$cut" "$T/small.bin" >"$T/cut.bin"
    "$FKVF" import-llama "$T/cut.bin" --model "$T/m.gguf" -o "$T/cut.fkvf" >/dev/null 2>"$T/err"
    st=$?
    rm -f "$T/cut.fkvf"
    if [ "$st" -ne 1 ] && [ "$st" -ne 2 ]; then
        echo "FAIL truncated state at $cut: exit $st"; cat "$T/err"; fails=$((fails + 1))
    else
        crash "truncated state at $cut" "$st"
    fi
    if [ "$cut" -lt 64 ]; then cut=$((cut + SP)); else cut=$((cut + 37 * SP)); fi
done
# bit flips of the state's structure fields (the first 64 bytes: header,
# tokens, cells) and of every 29th bit after them (every third, and every
# 87th, under FKVF_TEST_SPARSE); flips() writes them all
flips() { # flips FILE DIR STEP_AFTER_512 STEP_IN_512: one file per flipped bit in DIR
    mkdir -p "$2"
    $PY - "$1" "$2" "$3" "$4" <<'PYEOF'
import sys
src, out, step, dense = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
b = open(src, "rb").read()
i = 0
while i < len(b) * 8:
    f = bytearray(b)
    f[i >> 3] ^= 1 << (i & 7)
    open("%s/%06d" % (out, i), "wb").write(f)
    i += dense if i < 512 else step
PYEOF
}
flips "$T/small.bin" "$T/sflip" $((29 * SP)) $SP
for f in "$T"/sflip/*; do
    "$FKVF" import-llama "$f" --model "$T/m.gguf" -o "$T/flip.fkvf" >/dev/null 2>"$T/err"
    crash "state bit ${f##*/}" $?
    rm -f "$T/flip.fkvf"
done
gsize=$(wc -c <"$T/m.gguf")
cut=0
while [ "$cut" -lt "$gsize" ]; do
    head -c "$cut" "$T/m.gguf" >"$T/cut.gguf"
    "$FKVF" import-llama "$T/small.bin" --model "$T/cut.gguf" -o "$T/cut.fkvf" >/dev/null 2>"$T/err"
    st=$?
    rm -f "$T/cut.fkvf"
    if [ "$st" -ne 1 ] && [ "$st" -ne 2 ]; then
        echo "FAIL truncated GGUF at $cut: exit $st"; cat "$T/err"; fails=$((fails + 1))
    else
        crash "truncated GGUF at $cut" "$st"
    fi
    cut=$((cut + 3 * SP))
done
flips "$T/m.gguf" "$T/gflip" $((7 * SP)) $SP
for f in "$T"/gflip/*; do
    "$FKVF" import-llama "$T/small.bin" --model "$f" -o "$T/flip.fkvf" >/dev/null 2>"$T/err"
    crash "GGUF bit ${f##*/}" $?
    rm -f "$T/flip.fkvf"
done

finish cli_llama
