#!/bin/sh
# Installs the real llama.cpp that the tests against llama.cpp run
# (tests/llama_*.sh through tests/llama/driver.mjs): the npm package
# node-llama-cpp 3.21.1 with its prebuilt CPU build for Linux x86-64, and
# nothing optional (no CUDA or Vulkan builds: 83 MB instead of about 730).
# No install script runs: the prebuilt library needs no build or download.
#
# Into $FKVF_NODE_DIR, default build-deps/node under the repository root
# (ignored by git). The package.json there is written here; npm's lock file
# stays there and is never committed.
#
# Never fails: without node, npm or the network it says why and exits 0,
# and the llama.cpp tests then skip with that reason. Quiet and offline when
# the packages are already there. Called by scripts/install-deps.sh.
set -u
VERSION=3.21.1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${FKVF_NODE_DIR:-$ROOT/build-deps/node}

have_version() { # have_version PACKAGE_DIR: its package.json says $VERSION
    [ -f "$1/package.json" ] &&
        grep -q "\"version\": *\"$VERSION\"" "$1/package.json"
}
if have_version "$DIR/node_modules/node-llama-cpp" &&
    have_version "$DIR/node_modules/@node-llama-cpp/linux-x64"; then
    echo "install-llama: node-llama-cpp $VERSION present in $DIR"
    exit 0
fi
skip() {
    echo "install-llama: $*; node-llama-cpp not installed, the llama.cpp tests will skip"
    exit 0
}
[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] ||
    skip "the prebuilt llama.cpp used is for Linux x86-64 only, this is $(uname -s)-$(uname -m)"
command -v node >/dev/null 2>&1 || skip "node not found"
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null)
[ "${major:-0}" -ge 20 ] 2>/dev/null || skip "node $(node --version 2>&1) is older than 20, which node-llama-cpp needs"
command -v npm >/dev/null 2>&1 || skip "npm not found"
mkdir -p "$DIR" || skip "cannot create $DIR"
cat >"$DIR/package.json" <<EOF || skip "cannot write $DIR/package.json"
{
  "name": "fkvf-llama-test-deps",
  "private": true,
  "description": "node-llama-cpp for the FKVF tests against llama.cpp (written by scripts/install-llama.sh)"
}
EOF
echo "install-llama: npm install node-llama-cpp@$VERSION into $DIR"
if ! (cd "$DIR" && npm install -E --omit=optional --ignore-scripts --no-audit --no-fund \
    "node-llama-cpp@$VERSION" "@node-llama-cpp/linux-x64@$VERSION") >"$DIR/npm.log" 2>&1; then
    tail -n 5 "$DIR/npm.log" | sed 's/^/install-llama: npm: /'
    skip "npm install failed (full log: $DIR/npm.log)"
fi
have_version "$DIR/node_modules/@node-llama-cpp/linux-x64" ||
    skip "npm install did not give @node-llama-cpp/linux-x64 $VERSION (log: $DIR/npm.log)"
echo "install-llama: node-llama-cpp $VERSION installed in $DIR"
