# Sourced by the ctest scripts of the Python binding (python_binding.sh,
# example_python.sh): their common arguments PYTHON LIBFKVF_SO FKVF_CLI
# SRC_DIR into PY, LIB, CLI and S (paths made absolute: the tests run in
# scratch directories), and py_need NAME MODULE...: exit 77 (skipped, with
# the Debian package to install) when PY cannot import a MODULE.
PY=$1
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
LIB=$(abs "$2")
CLI=$(abs "$3")
S=$(abs "$4")
py_need() {
    who=$1
    shift
    for m in "$@"; do
        if ! "$PY" -c "import $m" >/dev/null 2>&1; then
            echo "$who: SKIPPED: $PY has no $m (Debian: apt-get install python3-$m, scripts/install-deps.sh)"
            exit 77
        fi
    done
}
