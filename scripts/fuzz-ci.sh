#!/usr/bin/env bash
# Builds every libFuzzer target (clang, ASan+UBSan) in build-fuzz and runs
# each for SECONDS (default 60), two at a time, on a copy of its committed
# corpus (fuzz/corpus/<t>; the repository is never modified). Exits 1 if
# any target finds a crash, leak, timeout or out-of-memory, printing the
# reproducer; 2 when clang or the build is missing.
#
# Usage: scripts/fuzz-ci.sh [SECONDS]
# Environment (for long runs, fuzz/README.md):
#   FKVF_FUZZ_TARGETS  targets to run (default: all of fuzz/targets.cmake)
#   FKVF_FUZZ_CORPUS   where the starting corpora are (default fuzz/corpus)
#   FKVF_FUZZ_WORK     work directory to keep (default: a temporary one);
#                      it gets corpus/<t> (grown), artifacts/<t>, logs/<t>.log
#   FKVF_FUZZ_NICE     nice level of the fuzzers (default 0)
#   FKVF_FUZZ_JOBS     fuzzers at once (default 2)
set -eu
cd "$(dirname "$0")/.."
SECS=${1:-60}
JOBS=${FKVF_FUZZ_JOBS:-2}
NICE=${FKVF_FUZZ_NICE:-0}
SRC=${FKVF_FUZZ_CORPUS:-fuzz/corpus}
command -v clang >/dev/null || { echo "fuzz-ci: clang not found" >&2; exit 2; }

ALL=$(sed -n 's/^set(FKVF_FUZZ_TARGETS \(.*\))$/\1/p; s/^ *list(APPEND FKVF_FUZZ_TARGETS \([^)]*\)).*$/\1/p' \
    fuzz/targets.cmake | tr '\n' ' ')
TARGETS=${FKVF_FUZZ_TARGETS:-$ALL}

echo "== fuzz build (clang, ASan+UBSan, libFuzzer) =="
t0=$(date +%s)
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFKVF_BUILD_FUZZERS=ON \
    -DFKVF_BUILD_TESTS=OFF -DFKVF_BUILD_BENCH=OFF -DFKVF_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build-fuzz -j"$JOBS" --target fuzzers >/dev/null
echo "fuzz-ci: built in $(($(date +%s) - t0)) s"

if [ -n "${FKVF_FUZZ_WORK:-}" ]; then
    W=$FKVF_FUZZ_WORK
    mkdir -p "$W"
else
    W=$(mktemp -d)
    trap 'rm -rf "$W"' EXIT
fi
mkdir -p "$W/logs" "$W/artifacts" "$W/corpus"

dict_of() {
    case $1 in
    open | decode | search) echo fuzz/fkvf.dict ;;
    safetensors | npy | npz | cli_numbers | gguf) echo "fuzz/$1.dict" ;;
    *) echo "" ;;
    esac
}

run_one() {
    local t=$1 d
    d=$(dict_of "$t")
    rm -rf "$W/corpus/$t" "$W/artifacts/$t"
    mkdir -p "$W/corpus/$t" "$W/artifacts/$t"
    if [ -d "$SRC/$t" ]; then
        find "$SRC/$t" -maxdepth 1 -type f ! -name '.*' -exec cp {} "$W/corpus/$t/" \;
    fi
    # the archive targets start from the conformance suite too (their
    # committed corpora only hold what adds coverage beyond it)
    case $t in
    open | decode | search) cp conformance/files/*.fkvf "$W/corpus/$t/" ;;
    esac
    # -timeout: one input may take at most 30 s; -rss_limit_mb: per process;
    # -entropic=0: clang 14's entropic schedule spent most of the time in
    # UpdateFeatureFrequency here (fuzz_decode: 28 exec/s with it, 133 without)
    nice -n "$NICE" "build-fuzz/fuzz/fuzz_$t" -max_total_time="$SECS" -timeout=30 -entropic=0 \
        -rss_limit_mb=2560 -print_final_stats=1 -artifact_prefix="$W/artifacts/$t/" \
        ${d:+-dict=$d} "$W/corpus/$t" >"$W/logs/$t.log" 2>&1
}

summary() {
    local t=$1 log=$W/logs/$1.log
    local last execs eps
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 | sed 's/ *lim:.*//; s/ *exec\/s:.*//')
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    echo "fuzz-ci: $t: ${execs:-?} execs, ${eps:-?} exec/s, $last, corpus $(ls "$W/corpus/$t" | wc -l) files"
}

failed=0
set -- $TARGETS
t0=$(date +%s)
while [ $# -gt 0 ]; do
    pids=() names=()
    for _ in $(seq 1 "$JOBS"); do
        [ $# -gt 0 ] || break
        run_one "$1" &
        pids+=($!)
        names+=("$1")
        shift
    done
    for i in "${!pids[@]}"; do
        t=${names[$i]}
        if wait "${pids[$i]}"; then
            summary "$t"
        else
            failed=1
            summary "$t"
            echo "fuzz-ci: $t FAILED; log $W/logs/$t.log" >&2
            grep -E '^(==[0-9]+==ERROR|SUMMARY|.*fuzz property failed|.*Test unit written)' \
                "$W/logs/$t.log" | head -5 >&2 || true
            for a in "$W/artifacts/$t"/*; do
                [ -e "$a" ] || continue
                mkdir -p build-fuzz/fuzz-ci-artifacts/"$t"
                cp "$a" build-fuzz/fuzz-ci-artifacts/"$t"/
                echo "fuzz-ci: reproducer: build-fuzz/fuzz-ci-artifacts/$t/$(basename "$a")" \
                    "(build-fuzz/fuzz/fuzz_$t FILE)" >&2
            done
        fi
    done
done
echo "fuzz-ci: fuzzing took $(($(date +%s) - t0)) s"
if [ $failed -ne 0 ]; then
    echo "fuzz-ci: FAILED" >&2
    exit 1
fi
echo "fuzz-ci: all targets clean"
