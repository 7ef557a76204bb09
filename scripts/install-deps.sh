#!/bin/sh
# Installs the Debian 12 packages that building, testing, benchmarking and
# fuzzing FKVF need. Run as root (or with sudo). Idempotent.
set -eu
PKGS="build-essential cmake pkg-config zlib1g-dev libxxhash-dev libarchive-dev check libsubunit-dev clang python3 valgrind pmccabe"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -z "$missing" ]; then
    echo "install-deps: all packages present"
    exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# shellcheck disable=SC2086
$SUDO apt-get install -y -q --no-install-recommends $missing
