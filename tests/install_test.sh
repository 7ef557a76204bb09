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
#  - the Python package (when PYTHON is not "none": FKVF_INSTALL_PYTHON):
#    fkvf/ in PREFIX/lib/python3.X/site-packages with _paths.py naming the
#    installed libfkvf; imported from there (PYTHONPATH, no FKVF_LIBRARY,
#    outside the source tree) it loads the installed library, not the build
#    tree's, gives its version, and reads testdata/sample.fkvf when the
#    package has fkvf.open (skipped when PYTHON lacks numpy)
# usage: install_test.sh BUILD_DIR SRC_DIR C_COMPILER [PYTHON|none]
set -u
B=$1
S=$2
CC=$3
PY=${4:-none}
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
# the Python package, imported from the prefix's site directory
if [ "$PY" != none ]; then
    SITE=$P/lib/$("$PY" -c 'import sys; print("python%d.%d" % sys.version_info[:2])')/site-packages
    check py-installed 0 test -f "$SITE/fkvf/__init__.py"
    check py-paths 0 test -f "$SITE/fkvf/_paths.py"
    find "$P" -name '*.py' -path '*/fkvf/*' | sed "s,^$SITE/fkvf/,," | sort >"$T/pyfiles"
    (cd "$S/python/fkvf" && ls -- *.py) | sort >"$T/pywant"
    echo _paths.py >>"$T/pywant"
    sort -o "$T/pywant" "$T/pywant"
    check py-files 0 cmp "$T/pywant" "$T/pyfiles"
    grep_in py-paths-library "^LIBRARY = \"$LIBDIR/libfkvf\.so\.0\.4\"\$" "$SITE/fkvf/_paths.py"
    # DESTDIR (a packager's staging directory) with prefix /usr: Debian's
    # /usr/lib/python3/dist-packages when that Python searches it
    if "$PY" -c 'import sys; sys.exit("/usr/lib/python3/dist-packages" not in sys.path)'; then
        check py-destdir-install 0 env DESTDIR="$T/dd" cmake --install "$B" --prefix /usr
        grep_in py-destdir-paths "^LIBRARY = \"/usr/.*/libfkvf\.so\.0\.4\"\$" \
            "$T/dd/usr/lib/python3/dist-packages/fkvf/_paths.py"
        check py-destdir-init 0 test -f "$T/dd/usr/lib/python3/dist-packages/fkvf/__init__.py"
    fi
    if ! "$PY" -c 'import numpy' >/dev/null 2>&1; then
        echo "install_test: the import of the Python package SKIPPED: $PY has no numpy"
    else
        "$P/bin/fkvf" --version >"$T/cliver"
        libver=$(sed -n 's/.*(libfkvf \([^,]*\),.*/\1/p' "$T/cliver")
        "$P/bin/fkvf" info --json "$SAMPLE" >"$T/info.json"
        cat >"$T/import.py" <<'PYEOF'
import json, sys
import fkvf
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libfkvf" in l})
for l in libs:
    print("mapped", l)
print("version", fkvf.__version__)
print("file", fkvf.__file__)
with fkvf.open(sys.argv[1]) as a:
    print("n_positions", a.n_positions)
want = json.load(open(sys.argv[2]))
print("want_n_positions", want["positions"])
PYEOF
        check py-import 0 sh -c "cd '$T' && env -u FKVF_LIBRARY -u FKVF_BUILD_DIR PYTHONDONTWRITEBYTECODE=1 \
            PYTHONPATH='$SITE' '$PY' import.py '$SAMPLE' info.json"
        cp "$T/out" "$T/pyout"
        grep_in py-import-file "^file $SITE/fkvf/__init__.py\$" "$T/pyout"
        grep_in py-import-version "^version $libver\$" "$T/pyout"
        grep_in py-loads-installed "^mapped $LIBDIR/libfkvf\.so" "$T/pyout"
        check py-loads-only-installed 1 sh -c "grep '^mapped' '$T/pyout' | grep -qv '^mapped $LIBDIR/'"
        want=$(sed -n 's/^want_n_positions //p' "$T/pyout")
        grep_in py-read-sample "^n_positions ${want:-none}\$" "$T/pyout"
    fi
fi
finish install_test
