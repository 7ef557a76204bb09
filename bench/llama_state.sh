#!/bin/sh
# bench/llama_state.sh: llama.cpp state files against FKVF archives of them.
#
#   sh bench/llama_state.sh BUILD_DIR [WORK_DIR]
#
# BUILD_DIR holds tools/fkvf (a Release or RelWithDebInfo build: the script
# prints which). WORK_DIR (default BUILD_DIR/bench-llama) receives the state
# files, archives and codebooks; generated inputs are kept there and reused
# by later runs. Prints Markdown tables on stdout (bench/README.md, section
# "llama.cpp state files"), progress on stderr.
#
# 1. Real state files: node-llama-cpp (bench/llama_save.mjs; node_modules from
#    $FKVF_NODE_DIR, or REPO/build-deps/node) saves sequences of both models of
#    ../shared/models (or $FKVF_MODELS_DIR) at 64, 128 and 250 tokens, f16
#    cache, flash attention off and on, context 256; codebooks (k = 256) are
#    trained on 8 states of other prompts. Skipped, saying so, without
#    node-llama-cpp.
# 2. Synthetic state files (tests/mkllstate.py) of the hd64 model's shape with
#    $FKVF_BENCH_CELLS cells (default "2000 20000 50000") for throughput.
# 3. Sizes of every real state: the state file, gzip -1, zstd -1, FKVF
#    lossless, lossless --deflate, archived (K x4 V x2 with the trained
#    codebooks; and --train). Every lossless archive is exported and compared
#    with the state file byte for byte.
# 4. Throughput of import and export, lossless and archived, each run paired
#    with a cp of the same state file, $FKVF_BENCH_REPS (default 5) rounds.
#
# Needs: POSIX sh, awk, cmp, python3 (for the synthetic states); node for
# the real ones; gzip and zstd are measured when installed.
set -eu

die() { echo "llama_state.sh: $*" >&2; exit 1; }
say() { echo "llama_state.sh: $*" >&2; }

[ $# -ge 1 ] || die "usage: sh bench/llama_state.sh BUILD_DIR [WORK_DIR]"
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BUILD=$(cd "$1" && pwd) || die "no build directory $1"
FKVF=$BUILD/tools/fkvf
[ -x "$FKVF" ] || die "$FKVF not built (cmake --build $1 --target fkvf)"
W=${2:-$BUILD/bench-llama}
mkdir -p "$W"
W=$(cd "$W" && pwd)
MODELS=${FKVF_MODELS_DIR:-$REPO/../shared/models}
REPS=${FKVF_BENCH_REPS:-5}
CELLS=${FKVF_BENCH_CELLS:-2000 20000 50000}
STORIES=$MODELS/stories260K.gguf
SHAKE=$MODELS/shakespeare-hd64.gguf
TEXT=$MODELS/shakespeare.txt
for f in "$STORIES" "$SHAKE" "$TEXT"; do
    [ -f "$f" ] || { echo "llama_state.sh: skipped: $f not found (set FKVF_MODELS_DIR)" >&2; exit 77; }
done
ERR=$W/stderr.log
: > "$ERR"

size() { wc -c < "$1" | tr -d ' '; }
now() { date +%s.%N; }
# run CMD...: runs it quietly (its stderr to $ERR), dies on failure.
run() { "$@" > /dev/null 2>> "$ERR" || die "failed (see $ERR): $*"; }
# timed CMD...: as run, in a subshell; the elapsed seconds in $T, the CPU
# seconds (user + system) of the processes it started in $C (from `times`).
timed() {
    t0=$(now)
    ( "$@" > /dev/null 2>> "$ERR" || exit 1; times ) > "$W/t.cpu" || die "failed (see $ERR): $*"
    t1=$(now)
    T=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f", b - a }')
    C=$(awk 'function sec(s, p) { sub(/s$/, "", s); split(s, p, "m"); return p[1] * 60 + p[2] }
             NR == 2 { printf "%.3f", sec($1) + sec($2) }' "$W/t.cpu")
}
# ratio A B: A / B to 2 decimals; x A B: B / A (how many times smaller).
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
x() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b / a }'; }

# --- the machine -------------------------------------------------------------
btype=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || true)
cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || true)
ccv=$("${cc:-cc}" --version 2>/dev/null | head -n 1 || true)
cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1 || true)
echo "Machine: ${cpu:-unknown CPU}, $(nproc 2>/dev/null || echo ?) CPUs, load average" \
    "$(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null || echo ?); $(uname -sr);" \
    "$ccv; fkvf build type ${btype:-unknown} ($BUILD)."
echo

# --- 1. real llama.cpp state files ------------------------------------------
NODE_DIR=
for d in "${FKVF_NODE_DIR:-}" "${FKVF_NODE_DIR:-}/node_modules" "$REPO/build-deps/node/node_modules"; do
    if [ -n "$d" ] && [ -f "$d/node-llama-cpp/dist/index.js" ]; then NODE_DIR=$d; break; fi
done
REAL=
if [ -z "$NODE_DIR" ]; then
    say "skipping the real llama.cpp states: node-llama-cpp not installed" \
        "(set FKVF_NODE_DIR or run scripts/install-llama.sh)"
elif ! command -v node > /dev/null 2>&1; then
    say "skipping the real llama.cpp states: node not found"
else
    REAL=1
fi
LENS="64 128 250"
NTRAIN=8

# text_ids OFFSET N OUT: BOS then N-1 bytes of shakespeare.txt from OFFSET, as 3 + byte.
text_ids() {
    { echo 1; tail -c +"$(($1 + 1))" "$TEXT" | head -c "$(($2 - 1))" | od -An -v -tu1 |
        awk '{ for (i = 1; i <= NF; i++) print $i + 3 }'; } > "$3"
}

if [ -n "$REAL" ]; then
    SAVE="node $HERE/llama_save.mjs $NODE_DIR"
    # Token ids. stories260K: sequences sampled from the model (temperature 1):
    # seed 1 for the measured states, seeds 101.. for training. shakespeare:
    # text from the held-out last 10% (offset 1003854) for the measured states,
    # from the first 90% for training.
    for m in stories shake; do
        ids=$W/$m-eval.ids
        if [ ! -s "$ids" ]; then
            if [ $m = stories ]; then run $SAVE sample "$STORIES" 1 250 "$ids"
            else text_ids 1003854 250 "$ids"; fi
        fi
        for n in $LENS; do head -n "$n" "$ids" > "$W/$m-eval$n.ids"; done
        i=1
        while [ $i -le $NTRAIN ]; do
            t=$W/$m-train$i.ids
            if [ ! -s "$t" ]; then
                if [ $m = stories ]; then run $SAVE sample "$STORIES" $((100 + i)) 250 "$t"
                else text_ids $((i * 100000)) 250 "$t"; fi
            fi
            i=$((i + 1))
        done
    done
    for m in stories shake; do
        if [ $m = stories ]; then model=$STORIES; else model=$SHAKE; fi
        for fa in 0 1; do
            args=
            for n in $LENS; do
                s=$W/$m-fa$fa-n$n.state
                [ -s "$s" ] || args="$args $s $W/$m-eval$n.ids"
            done
            if [ $fa = 0 ]; then
                i=1
                while [ $i -le $NTRAIN ]; do
                    s=$W/$m-train$i.state
                    [ -s "$s" ] || args="$args $s $W/$m-train$i.ids"
                    i=$((i + 1))
                done
            fi
            if [ -n "$args" ]; then
                say "saving $m states, flash attention $fa"
                # shellcheck disable=SC2086
                run $SAVE save "$model" $fa 256 $args
            fi
        done
        cb=$W/$m.codebook
        if [ ! -s "$cb" ]; then
            say "training $m codebooks (k 256) on $NTRAIN states of other prompts"
            # shellcheck disable=SC2046
            run "$FKVF" train $(i=1; while [ $i -le $NTRAIN ]; do echo "$W/$m-train$i.state"; i=$((i + 1)); done) \
                --model "$model" -o "$cb" --k 256 --force
        fi
    done
fi

# --- 2. synthetic state files -------------------------------------------------
for c in $CELLS; do
    s=$W/synth-hd64-c$c-vt1.bin
    if [ ! -s "$s" ]; then
        say "writing $s (tests/mkllstate.py: slow, minutes)"
        run python3 "$REPO/tests/mkllstate.py" "$s.tmp" --layers 4 --heads 2 --dim 64 \
            --cells "$c" --v-trans 1 --seed 7
        mv "$s.tmp" "$s"
    fi
done

HAVE_GZIP=; command -v gzip > /dev/null 2>&1 && HAVE_GZIP=1
HAVE_ZSTD=; command -v zstd > /dev/null 2>&1 && HAVE_ZSTD=1

# --- 3. sizes -----------------------------------------------------------------
if [ -n "$REAL" ]; then
    echo "### Sizes: real llama.cpp states (f16 cache, context 256)"
    echo
    for m in stories shake; do
        if [ $m = stories ]; then model=$STORIES; else model=$SHAKE; fi
        cb=$W/$m.codebook
        echo "$(basename "$model"): codebook file $(basename "$cb") $(size "$cb") bytes" \
            "(k 256, K x4 V x2, f16 tables, trained on $NTRAIN states of 250 tokens of other prompts)."
        echo
        echo "| flash attn | tokens | state bytes | gzip -1 | zstd -1 | FKVF lossless | lossless --deflate | archived positions | archived --codebooks (file not counted) | --train (codebook embedded) |"
        echo "|---|---|---|---|---|---|---|---|---|---|"
        for fa in 0 1; do
            for n in $LENS; do
                s=$W/$m-fa$fa-n$n.state
                a=$W/$m-fa$fa-n$n
                sb=$(size "$s")
                gz=-; zs=-
                if [ -n "$HAVE_GZIP" ]; then gzip -1 -c "$s" > "$a.gz"; gz="$(size "$a.gz") ($(x "$(size "$a.gz")" "$sb")x)"; fi
                if [ -n "$HAVE_ZSTD" ]; then zstd -q -1 -c "$s" > "$a.zst"; zs="$(size "$a.zst") ($(x "$(size "$a.zst")" "$sb")x)"; fi
                run "$FKVF" import-llama "$s" --model "$model" -o "$a.lossless.fkvf" --force
                run "$FKVF" import-llama "$s" --model "$model" -o "$a.deflate.fkvf" --deflate --force
                "$FKVF" import-llama "$s" --model "$model" -o "$a.cb.fkvf" --codebooks "$cb" --force --json \
                    > "$a.cb.json" 2>> "$ERR" || die "failed (see $ERR): import-llama --codebooks $s"
                carch=$(sed -n 's/.*"archived":\([0-9]*\).*/\1/p' "$a.cb.json")
                # --train with its defaults: it stores every position exact
                # when an embedded codebook would cost more than the rows.
                "$FKVF" import-llama "$s" --model "$model" -o "$a.train.fkvf" --train --force --json \
                    > "$a.train.json" 2>> "$ERR" || die "failed (see $ERR): import-llama --train $s"
                tarch=$(sed -n 's/.*"archived":\([0-9]*\).*/\1/p' "$a.train.json")
                tk=$(sed -n 's/.*"k":\([0-9]*\).*/\1/p' "$a.train.json")
                for v in lossless deflate; do
                    run "$FKVF" export-llama "$a.$v.fkvf" -o "$a.$v.state" --force
                    cmp -s "$s" "$a.$v.state" || die "$a.$v.fkvf does not export $s byte for byte"
                done
                run "$FKVF" export-llama "$a.cb.fkvf" -o "$a.cb.state" --codebooks "$cb" --force
                [ "$(size "$a.cb.state")" = "$sb" ] || die "$a.cb.state: not the size of $s"
                l=$(size "$a.lossless.fkvf"); d=$(size "$a.deflate.fkvf")
                c=$(size "$a.cb.fkvf"); t=$(size "$a.train.fkvf")
                echo "| $(if [ $fa = 1 ]; then echo on; else echo off; fi) | $n | $sb | $gz | $zs" \
                    "| $l ($(x "$l" "$sb")x) | $d ($(x "$d" "$sb")x) | $carch | $c ($(x "$c" "$sb")x) | $t ($(x "$t" "$sb")x), k $tk, $tarch archived |"
            done
        done
        echo
    done
fi

# --- 4. throughput -------------------------------------------------------------
# median FILE: the median of the numbers in FILE, one a line; best FILE: the least.
median() { sort -g "$1" | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.6f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
best() { sort -g "$1" | head -n 1; }

op_cp() { cp "$S" "$W/t.copy"; }
op_cpsync() { cp "$S" "$W/t.copy" && sync "$W/t.copy"; }
op_gzip() { gzip -1 -c "$S" > "$W/t.gz"; }
op_zstd() { zstd -q -1 -c "$S" > "$W/t.zst"; }
op_import_lossless() { "$FKVF" import-llama "$S" --model "$TM" -o "$W/t.lossless.fkvf" --force; }
op_import_archived() { "$FKVF" import-llama "$S" --model "$TM" -o "$W/t.cb.fkvf" --codebooks "$TCB" --force; }
op_export_lossless() { "$FKVF" export-llama "$W/t.lossless.fkvf" -o "$W/t.lossless.state" --force; }
op_export_archived() { "$FKVF" export-llama "$W/t.cb.fkvf" -o "$W/t.cb.state" --codebooks "$TCB" --force; }

OPS="cpsync import_lossless import_archived export_lossless export_archived"
[ -n "$HAVE_GZIP" ] && OPS="$OPS gzip"
[ -n "$HAVE_ZSTD" ] && OPS="$OPS zstd"

TCB=$W/shake.codebook
if [ ! -s "$TCB" ]; then
    # No real states to train on: train on a synthetic state of the same shape.
    first=$(echo "$CELLS" | awk '{ print $1 }')
    say "training throughput codebooks on a synthetic state"
    run "$FKVF" train "$W/synth-hd64-c$first-vt1.bin" --model "$SHAKE" -o "$W/synth.codebook" --k 256 --force
    TCB=$W/synth.codebook
fi
TM=$SHAKE
tp_files=
[ -n "$REAL" ] && tp_files="$W/shake-fa0-n250.state"
for c in $CELLS; do tp_files="$tp_files $W/synth-hd64-c$c-vt1.bin"; done

echo "### Throughput (MB/s of state-file bytes; $REPS rounds, each run right after a cp of the same file)"
echo
echo "Codebooks: $(basename "$TCB") ($(size "$TCB") bytes), model $(basename "$TM")."
echo
for S in $tp_files; do
    sb=$(size "$S")
    cells=$("$FKVF" info "$S" 2>/dev/null | awk '$1 == "cells" { print $2 }')
    say "timing $(basename "$S") ($sb bytes)"
    for o in cp $OPS; do : > "$W/t.$o.times"; : > "$W/t.$o.cpu"; : > "$W/t.$o.ratios"; done
    # warm: page cache, and the archives the exports read
    run op_cp; run op_import_lossless; run op_import_archived
    r=1
    while [ "$r" -le "$REPS" ]; do
        for o in $OPS; do
            timed op_cp; tc=$T; echo "$tc" >> "$W/t.cp.times"; echo "$C" >> "$W/t.cp.cpu"
            timed "op_$o"; echo "$T" >> "$W/t.$o.times"; echo "$C" >> "$W/t.$o.cpu"
            ratio "$T" "$tc" >> "$W/t.$o.ratios"; echo >> "$W/t.$o.ratios"
        done
        r=$((r + 1))
    done
    cmp -s "$S" "$W/t.lossless.state" || die "$W/t.lossless.fkvf does not export $S byte for byte"
    echo "$(basename "$S"): $sb bytes, $cells cells; FKVF lossless $(size "$W/t.lossless.fkvf") bytes," \
        "archived $(size "$W/t.cb.fkvf") bytes."
    echo
    echo "| operation | MB/s best | MB/s median | time / cp (median of pairs) | time / (cp + sync) (medians) | CPU s median | MB/s per CPU s |"
    echo "|---|---|---|---|---|---|---|"
    for o in cp $OPS; do
        case $o in
            cp) label="cp (baseline; $(awk 'END { print NR }' "$W/t.cp.times") runs)";;
            cpsync) label="cp + sync FILE (fsync)";;
            gzip) label="gzip -1";;
            zstd) label="zstd -1";;
            import_lossless) label="import-llama, lossless";;
            import_archived) label="import-llama --codebooks (archived)";;
            export_lossless) label="export-llama, lossless";;
            export_archived) label="export-llama, archived";;
        esac
        b=$(best "$W/t.$o.times"); md=$(median "$W/t.$o.times")
        rr=-; [ "$o" = cp ] || rr=$(median "$W/t.$o.ratios")
        cpu=$(median "$W/t.$o.cpu")
        mbc=-; [ "$(awk -v c="$cpu" 'BEGIN { print (c > 0) }')" = 1 ] &&
            mbc=$(awk -v s="$sb" -v t="$cpu" 'BEGIN { printf "%.0f", s / t / 1e6 }')
        echo "| $label | $(awk -v s="$sb" -v t="$b" 'BEGIN { printf "%.0f", s / t / 1e6 }')" \
            "| $(awk -v s="$sb" -v t="$md" 'BEGIN { printf "%.0f", s / t / 1e6 }') | $rr" \
            "| $(ratio "$md" "$(median "$W/t.cpsync.times")") | $cpu | $mbc |"
    done
    echo
done
rm -f "$W"/t.*
say "done; inputs kept in $W"
