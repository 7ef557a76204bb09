#!/bin/sh
# Installs the build into a temporary prefix (cmake --install --prefix, not
# the configured one) and consumes the installed package as a user would:
#  - the files: fkvf.h, the fkvf CLI, libfkvf.so / .a, libfkvf.pc, fkvfConfig.cmake
#  - find_package(fkvf): the examples project (examples/CMakeLists.txt)
#    builds read_archive with fkvf::fkvf (shared), read_archive_static with
#    fkvf::fkvf_static, restore_archive with fkvf::fkvf; each runs
#  - pkg-config without --define-variable: --cflags and --libs name the
#    temporary prefix; a consumer links with --libs (shared) and with
#    -static and --static --libs (every dependency listed)
#  - the installed CLI and restore_archive run tests/example_restore.sh
# usage: install_test.sh BUILD_DIR SRC_DIR C_COMPILER
set -u
B=$1
S=$2
CC=$3
. "$(dirname "$0")/cli_lib.sh"
P=$T/prefix
SAMPLE=$S/testdata/sample.fkvf
# needed_libs FILE: the DT_NEEDED entries of an executable, one a line
needed_libs() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p'; }

check install 0 cmake --install "$B" --prefix "$P"
for f in include/fkvf.h bin/fkvf; do
    check "installed-$f" 0 test -f "$P/$f"
done
LIBDIR=$(dirname "$(find "$P" -name libfkvf.a | head -n 1)")
check installed-libfkvf.so 0 test -e "$LIBDIR/libfkvf.so"
check installed-libfkvf.pc 0 test -f "$LIBDIR/pkgconfig/libfkvf.pc"
check installed-config 0 test -f "$LIBDIR/cmake/fkvf/fkvfConfig.cmake"
check installed-cli 0 "$P/bin/fkvf" --version

# find_package(fkvf): shared and static targets
check ex-configure 0 cmake -S "$S/examples" -B "$T/ex" -DCMAKE_PREFIX_PATH="$P" \
    -DCMAKE_C_COMPILER="$CC"
check ex-build 0 cmake --build "$T/ex"
check ex-shared-run 0 env LD_LIBRARY_PATH="$LIBDIR" "$T/ex/read_archive" "$SAMPLE"
grep_in ex-shared-out "5 layers, 4 KV heads" "$T/out"
cp "$T/out" "$T/want"
check ex-shared-needs-so 0 sh -c "readelf -d '$T/ex/read_archive' | grep -q 'NEEDED.*libfkvf.so'"
check ex-static-run 0 "$T/ex/read_archive_static" "$SAMPLE"
cp "$T/out" "$T/got"
check ex-static-same 0 cmp "$T/want" "$T/got"
needed_libs "$T/ex/read_archive_static" >"$T/needed"
check ex-static-no-so 1 grep -q libfkvf "$T/needed"

# pkg-config, no --define-variable: the paths are the install prefix's
PC="env PKG_CONFIG_PATH=$LIBDIR/pkgconfig pkg-config"
check pc-exists 0 $PC --exists libfkvf
check pc-cflags 0 $PC --cflags libfkvf
grep_in pc-cflags-prefix "^-I$P/include *\$" "$T/out"
check pc-libs 0 $PC --libs libfkvf
grep_in pc-libs-prefix "^-L$LIBDIR -lfkvf *\$" "$T/out"
check pc-static-libs 0 $PC --static --libs libfkvf
for l in -lfkvf -lxxhash -lz -lm; do
    grep_in "pc-static-libs$l" " $l\\( \\|\$\\)" "$T/out"
done
# shellcheck disable=SC2046
check pc-shared-build 0 "$CC" -o "$T/pc_shared" "$S/examples/read_archive.c" \
    $($PC --cflags --libs libfkvf)
check pc-shared-run 0 env LD_LIBRARY_PATH="$LIBDIR" "$T/pc_shared" "$SAMPLE"
cp "$T/out" "$T/got"
check pc-shared-same 0 cmp "$T/want" "$T/got"
# a fully static executable: links only if --static --libs lists every dependency
# shellcheck disable=SC2046
check pc-static-build 0 "$CC" -static -o "$T/pc_static" "$S/examples/read_archive.c" \
    $($PC --cflags --static --libs libfkvf)
check pc-static-run 0 "$T/pc_static" "$SAMPLE"
cp "$T/out" "$T/got"
check pc-static-same 0 cmp "$T/want" "$T/got"

# the README's library example (an external codebook) with the installed CLI
check example-restore 0 env LD_LIBRARY_PATH="$LIBDIR" sh "$S/tests/example_restore.sh" \
    "$P/bin/fkvf" "$T/ex/restore_archive" "$S"
grep_in example-restore-ran "example_restore: [1-9][0-9]* passed, 0 failed" "$T/out"
finish install_test
