#!/bin/sh
# The main job on bundled sample data: builds the tools, then shows and
# verifies the sample archive testdata/sample.fkvf.
# Usage (as root on Debian 12): ./scripts/run-sample.sh
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)" --target fkvf fkvf-mksample
set -x
./build/tools/fkvf info testdata/sample.fkvf
./build/tools/fkvf verify testdata/sample.fkvf
