#!/bin/sh
# Speed of the Python binding against C: fkvf.Archive.read vs fkvf_reader_restore /
# fkvf_reader_read of the same positions (bench_restore), fkvf.pack vs `fkvf pack`
# (bench/bench_python.py; bench/README.md "Python binding").
#
#   sh bench/python.sh [BUILD_DIR] [bench_python.py options]
#
# BUILD_DIR (default: build) must hold libfkvf/libfkvf.so, tools/fkvf and
# bench/bench_restore (cmake --build BUILD_DIR --target fkvf_shared fkvf bench_restore).
# Uses Debian's /usr/bin/python3 (NumPy); PYTHON overrides it.
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=build
case "${1:-}" in
    ""|-*) ;;
    *) build=$1; shift ;;
esac
case "$build" in
    /*) ;;
    *) build=$PWD/$build ;;
esac
py=${PYTHON:-/usr/bin/python3}
for f in libfkvf/libfkvf.so tools/fkvf bench/bench_restore; do
    if [ ! -e "$build/$f" ]; then
        echo "python.sh: $build/$f is missing: cmake --build $build --target fkvf_shared fkvf bench_restore" >&2
        exit 2
    fi
done
export FKVF_LIBRARY="$build/libfkvf/libfkvf.so"
export PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" "$src/bench/bench_python.py" --cli "$build/tools/fkvf" \
    --bench-restore "$build/bench/bench_restore" "$@"
