#!/bin/sh
# Builds FKVF and runs the whole test suite twice: a normal build and an
# ASan+UBSan build; then every fuzz target for 60 s (scripts/fuzz-ci.sh,
# when clang is there). Installs the Debian packages it needs first.
# Usage (as root on Debian 12): ./scripts/test.sh
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
JOBS=$(nproc 2>/dev/null || echo 2)

echo "== normal build =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$JOBS"
ctest --test-dir build --output-on-failure -j"$JOBS"

echo "== ASan+UBSan build =="
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFKVF_SANITIZE=ON -DFKVF_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j"$JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$JOBS"

echo "== fuzzing (libFuzzer, clang, 60 s per target, two at a time) =="
if command -v clang >/dev/null 2>&1; then
    ./scripts/fuzz-ci.sh 60
else
    echo "fuzz: SKIPPED: clang not found (scripts/install-deps.sh installs it)"
fi
