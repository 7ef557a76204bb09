#!/bin/sh
# Builds FKVF the ways users build it and runs the test suite:
#  1. gcc RelWithDebInfo (the default build type): every test;
#  2. gcc Debug with ASan+UBSan, at -O1 (the level ASan's documentation
#     recommends; the suite ran in 408 s instead of 522-531 s at -O0, and
#     -O1 found a -Wformat-truncation in a test that no other build showed;
#     gcc's warnings at -O0 are its front end's, which it gives at -O1 too,
#     so the plain Debug build stays covered): every test but
#     quality_study_smoke (the study driver script: about 100 s under ASan;
#     the fkvf-quality code it runs is run under ASan by quality_text_smoke);
#  3. gcc Release (-O3, where -Wformat-truncation and the optimizer's other
#     warnings appear): the whole project built, every test but those whose
#     result does not depend on how the project was compiled, which the
#     first build runs: valgrind_cli (memcheck of the CLI tests, slow),
#     readme_commands (builds its own copy) and the Python-only conformance
#     runs (conformance_python_verify|open|selftest); for time, the two
#     slowest CLI suites, cli_llama and cli_unpack (builds 1 and 2 run them),
#     and the Python tests of the binding and example, python_binding and
#     example_python (the library calls they make are the Check suites');
#  4. clang RelWithDebInfo: the whole project built (clang's warnings; the
#     fuzz build below is clang too, but of the fuzz targets only), no tests;
#  5. cross builds for s390x (big-endian) and armhf (32-bit) under qemu
#     user-mode emulation (scripts/test-cross.sh, issue 20);
#  then every fuzz target for 15 s (scripts/fuzz-ci.sh 15, when clang is
#  there; fuzz/README.md has the longer runs).
# Warnings are errors in every build (FKVF_WERROR, on by default).
# Installs the Debian packages it needs first.
#
# Time: CI gives 90 minutes and the project keeps the run under 30. Each
# step's heading shows the seconds since the start. A fresh clone on the
# 2-core build machine, otherwise idle, with the packages installed
# (2026-12-07, commit 1542912): 27.7 min in all: the package check 13 s,
# build 1 70 s + its ctest 375 s, build 2 87 + 415 s, build 3 67 + 128 s,
# build 4 66 s, step 5 276 s (29 s of it unpacking the two targets'
# libraries), fuzzing 162 s (its build 44 s). Every ctest run is CPU-bound
# (the tests' seconds add up to twice its wall time). On a fresh machine the
# package installations come on top.
# Usage (as root on Debian 12): ./scripts/test.sh
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
JOBS=$(nproc 2>/dev/null || echo 2)
# each step's heading carries the seconds since the start (after the
# package installation), so that a run's log shows where its time went
t0=$(date +%s)
step() { echo "== $* ($(($(date +%s) - t0)) s) =="; }

step "normal build (gcc RelWithDebInfo)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$JOBS"
ctest --test-dir build --output-on-failure -j"$JOBS"

step "ASan+UBSan build (gcc Debug, -O1)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DFKVF_SANITIZE=ON \
    -DFKVF_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j"$JOBS"
# FKVF_TEST_SPARSE: every third of cli_llama's damaged state files and GGUF
# headers and of cli_unpack's table lines, test_threads' 3 threads against 1
# on every other variant (all of them in build 1)
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    FKVF_TEST_SPARSE=1 ctest --test-dir build-asan --output-on-failure -j"$JOBS" -E '^quality_study_smoke$'

step "Release build (gcc -O3)"
CC=gcc cmake -S . -B build-gcc-release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-gcc-release -j"$JOBS"
ctest --test-dir build-gcc-release --output-on-failure -j"$JOBS" \
    -E '^(valgrind_cli|readme_commands|conformance_python_(verify|open|selftest)|cli_llama|cli_unpack|python_binding|example_python)$'

step "clang build (RelWithDebInfo, build only)"
if command -v clang >/dev/null 2>&1; then
    CC=clang cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build build-clang -j"$JOBS"
else
    echo "clang build: SKIPPED: clang not found (scripts/install-deps.sh installs it)"
fi

step "cross builds under qemu: s390x (big-endian), armhf (32-bit)"
# scripts/test-cross.sh: every target's build, its Check suites but the
# slowest under emulation (scripts/test-cross.sh --full runs them all), the
# conformance suite in both modes and files byte-identical across
# architectures (issue 20)
./scripts/test-cross.sh

step "fuzzing (libFuzzer, clang, 15 s per target, two at a time)"
if command -v clang >/dev/null 2>&1; then
    ./scripts/fuzz-ci.sh 15
else
    echo "fuzz: SKIPPED: clang not found (scripts/install-deps.sh installs it)"
fi
step "test.sh: passed"
