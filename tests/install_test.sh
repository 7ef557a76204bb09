#!/bin/sh
# Installs the build into a temporary prefix, then builds the example against
# it twice: with find_package(fkvf) and with pkg-config; runs both on the sample.
# usage: install_test.sh BUILD_DIR SRC_DIR C_COMPILER
set -eu
B=$1
S=$2
CC=$3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cmake --install "$B" --prefix "$T/prefix" >/dev/null
test -f "$T/prefix/include/fkvf.h"
cmake -S "$S/examples" -B "$T/ex" -DCMAKE_PREFIX_PATH="$T/prefix" -DCMAKE_C_COMPILER="$CC" >/dev/null
cmake --build "$T/ex" >/dev/null
LD_LIBRARY_PATH="$T/prefix/lib:$T/prefix/lib64:${LD_LIBRARY_PATH:-}" "$T/ex/read_archive" "$S/testdata/sample.fkvf" >"$T/out1"
grep -q "5 layers, 4 KV heads" "$T/out1"
PCDIR=$(dirname "$(find "$T/prefix" -name libfkvf.pc | head -n 1)")
PC="pkg-config --define-variable=prefix=$T/prefix"
PKG_CONFIG_PATH="$PCDIR" $PC --exists libfkvf
# shellcheck disable=SC2046
"$CC" -o "$T/ex2" "$S/examples/read_archive.c" $(PKG_CONFIG_PATH="$PCDIR" $PC --cflags libfkvf) \
    "$(dirname "$PCDIR")/libfkvf.a" $(pkg-config --libs libxxhash zlib) -lm
"$T/ex2" "$S/testdata/sample.fkvf" >"$T/out2"
cmp "$T/out1" "$T/out2"
echo "install_test: 1 passed, 0 failed"
