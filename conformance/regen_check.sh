#!/bin/sh
# Regenerates the suite into a temporary directory and checks that it is
# byte-identical to the committed one: regen_check.sh GENERATOR SUITE_DIR
set -u
gen=$1 suite=$2
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
"$gen" "$tmp" || { echo "regen_check: the generator failed" >&2; exit 1; }
if diff -r "$tmp/files" "$suite/files" && cmp "$tmp/manifest.tsv" "$suite/manifest.tsv"; then
    echo "regen_check: $(ls "$tmp/files" | wc -l) files and the manifest regenerate byte for byte"
else
    echo "regen_check: the committed suite differs from what the generator writes" >&2
    echo "(rebuild it: fkvf-conf-gen $suite, see conformance/README.md)" >&2
    exit 1
fi
