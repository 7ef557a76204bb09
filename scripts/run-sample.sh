#!/bin/sh
# The main job on bundled sample data: builds the tools, trains a shared
# codebook file on testdata/train-cache.safetensors, packs the real sample
# cache testdata/sample-cache.safetensors (stories260K, 256 other positions)
# with it, shows and verifies the archive, unpacks it and prints the
# reconstruction error against the original. The outputs in build/ are
# replaced on every run (--force: fkvf never replaces a file without it).
# Usage (as root on Debian 12): ./scripts/run-sample.sh
set -eu
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)" --target fkvf fkvf-mksample
set -x
./build/tools/fkvf train testdata/train-cache.safetensors -o build/sample-codebook.fkvf --k 64 --force
./build/tools/fkvf pack testdata/sample-cache.safetensors -o build/sample-pack.fkvf \
    --codebooks build/sample-codebook.fkvf --force
./build/tools/fkvf info build/sample-pack.fkvf
./build/tools/fkvf verify build/sample-pack.fkvf
./build/tools/fkvf unpack build/sample-pack.fkvf -o build/sample-restored.safetensors --force
./build/tools/fkvf compare testdata/sample-cache.safetensors build/sample-restored.safetensors \
    --sinks 4 --recent 32
