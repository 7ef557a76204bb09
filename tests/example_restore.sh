#!/bin/sh
# examples/restore_archive.c (the README's library example) on the sample
# data: a codebook file from fkvf train, an archive that refers to it from
# fkvf pack --codebooks, then the example restores every position, and
# tests/check_restored.py compares the rows with the original cache without
# libfkvf (exact window bit for bit, SNR of the archived positions). Without
# the right codebook file the example fails with exit 1, naming the hash
# (exit 2 for a codebook path that does not exist, as any path).
# usage: example_restore.sh FKVF_BIN RESTORE_ARCHIVE_BIN SRCDIR
# (install_test.sh runs it with the installed fkvf and an example built
# against the installed package; ctest example_restore with the build's)
set -u
FKVF=$1
RESTORE=$2
SRC=$3
. "$(dirname "$0")/cli_lib.sh"
CACHE=$SRC/testdata/sample-cache.safetensors
check train 0 "$FKVF" train "$SRC/testdata/train-cache.safetensors" -o "$T/cb.fkvf" --k 64
check pack 0 "$FKVF" pack "$CACHE" -o "$T/a.fkvf" --codebooks "$T/cb.fkvf"
check restore 0 "$RESTORE" "$T/a.fkvf" "$T/cb.fkvf" "$T/rows.f32"
grep_in restore-count "restored 256 positions (220 from the codebook), 1280 bytes each" "$T/out"
hash=$(sed -n 's/^codebook .*: \([0-9a-f]\{32\}\)$/\1/p' "$T/out")
grep_in restore-hint "name hint \"cb.fkvf\"" "$T/out"
# the figures of fkvf compare on the same data are keys 14.84 dB, values 8.08 dB
check rows-match-original 0 /usr/bin/python3 "$SRC/tests/check_restored.py" "$CACHE" \
    "$T/rows.f32" 4 32 12 6
# an archive is not a codebook file: exit 1, the message names the expected hash
check wrong-codebook 1 "$RESTORE" "$T/a.fkvf" "$SRC/testdata/sample.fkvf" "$T/rows2.f32"
grep_in wrong-codebook-hash "expected codebook ${hash:-NO-HASH-PRINTED}" "$T/err"
check missing-codebook 2 "$RESTORE" "$T/a.fkvf" "$T/nothing.fkvf" "$T/rows2.f32"
grep_in missing-codebook-msg "nothing.fkvf" "$T/err"
check not-an-archive 1 "$RESTORE" "$CACHE" "$T/cb.fkvf" "$T/rows2.f32"
# "-": the library finds the codebook by content hash (fkvf_reader_find_codebook),
# in the archive's directory under another name, or in FKVF_CODEBOOK_PATH
mkdir "$T/arch" "$T/books"
cp "$T/a.fkvf" "$T/arch/a.fkvf"
cp "$T/cb.fkvf" "$T/arch/renamed-codebook"
check find-archive-dir 0 env -u FKVF_CODEBOOK_PATH "$RESTORE" "$T/arch/a.fkvf" - "$T/rows3.f32"
grep_in find-archive-dir-path "codebook $T/arch/renamed-codebook (name hint \"cb.fkvf\")" "$T/out"
check find-archive-dir-same 0 cmp "$T/rows.f32" "$T/rows3.f32"
mv "$T/arch/renamed-codebook" "$T/books/shared"
check find-not-found 1 env -u FKVF_CODEBOOK_PATH "$RESTORE" "$T/arch/a.fkvf" - "$T/rows4.f32"
grep_in find-not-found-hash "${hash:-NO-HASH-PRINTED}" "$T/err"
check find-path 0 env FKVF_CODEBOOK_PATH="$T/nowhere:$T/books" "$RESTORE" "$T/arch/a.fkvf" - "$T/rows4.f32"
check find-path-same 0 cmp "$T/rows.f32" "$T/rows4.f32"
check usage 2 "$RESTORE" "$T/a.fkvf"
# the output is a new file: an existing one (here the codebook itself, which
# it truncated while it was mapped: SIGBUS, codebook lost) is refused
cp "$T/cb.fkvf" "$T/cb.copy"
check output-exists 2 "$RESTORE" "$T/a.fkvf" "$T/cb.fkvf" "$T/cb.fkvf"
check output-exists-kept 0 cmp "$T/cb.fkvf" "$T/cb.copy"
check output-exists-rows 2 "$RESTORE" "$T/a.fkvf" "$T/cb.fkvf" "$T/rows.f32"
finish example_restore
