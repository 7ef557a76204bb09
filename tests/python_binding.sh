#!/bin/sh
# The Python binding's pytest suite (python/tests) on the package of the
# source tree (PYTHONPATH=SRC_DIR/python) over the build's libfkvf.so, with
# the interpreter the binding is built for (FKVF_PYTHON: /usr/bin/python3).
# Skipped (77) when that Python lacks numpy or pytest (Debian's
# python3-numpy, python3-pytest: scripts/install-deps.sh).
# usage: python_binding.sh PYTHON LIBFKVF_SO FKVF_CLI SRC_DIR
set -u
. "$(dirname "$0")/python_lib.sh"
py_need python_binding numpy pytest
# no __pycache__ or .pytest_cache in the source tree
cd "$S" && exec env PYTHONPATH="$S/python" PYTHONDONTWRITEBYTECODE=1 FKVF_LIBRARY="$LIB" \
    FKVF_CLI="$CLI" FKVF_SRCDIR="$S" "$PY" -m pytest -q -p no:cacheprovider "$S/python/tests"
