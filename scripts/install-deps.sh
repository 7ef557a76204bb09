#!/bin/sh
# Installs the Debian 12 packages that building, testing, benchmarking and
# fuzzing FKVF need. Run as root (or with sudo). Idempotent.
set -eu
PKGS="build-essential cmake pkg-config zlib1g-dev libxxhash-dev libarchive-dev check libsubunit-dev clang python3 valgrind pmccabe"
# archives over HTTP (tools only, docs/remote.md): libcurl, and nginx for the
# tests, which start their own on 127.0.0.1 (nginx-light starts no service)
PKGS="$PKGS libcurl4-openssl-dev nginx-light"
# the Python binding (python/fkvf, issue 15): NumPy with a fast BLAS, pytest,
# setuptools, pip and venv for an offline pip install (README "Python")
PKGS="$PKGS python3-numpy python3-pytest python3-setuptools python3-pip python3-venv libopenblas0-pthread"
# PyTorch (CPU) for the binding's tensor tests and matplotlib for its example
# (examples/python): python3-torch is a large install (about 200 packages)
PKGS="$PKGS python3-torch python3-matplotlib"
# node and npm for the tests against llama.cpp (scripts/install-llama.sh):
# Debian's nodejs (node-llama-cpp wants 20 or later; Debian 12 has 18, the
# build machine runs 20), and only where no node is installed, so that a
# node from elsewhere (whose npm Debian's would conflict with) is kept.
command -v node >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "install-deps: all packages present"
else
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -q --no-install-recommends $missing
fi
"$(dirname "$0")/install-llama.sh"
