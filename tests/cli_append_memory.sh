#!/bin/sh
# fkvf append runs in bounded memory (issue 37, part 2): a 256 MiB cache (8
# layers x 8 heads x dim 128, 8192 positions, f16, 32 KiB a position;
# bench/mkcache.py) appended in one commit with a small shared codebook,
# --create and to an existing archive, each with a peak RSS (GNU time %M)
# under 128 MiB, half the cache: the CLI hands the appender 16 MiB of rows
# at a time and the appender writes what is decided once 64 MiB are queued
# (fkvf.h fkvf_appender_append). main before this (ab29b93) read the whole
# cache into one buffer and the appender queued a copy of it: 540 MB here.
# The one-commit archive holds many index segments in that commit, and its
# compaction is byte for byte that of the same cache appended 1024
# positions a commit (32 MiB, below the queue's bound: written at the
# commit, as before), so every symbol and exact row is the same. --threads
# 1 and 2 give the same file. An archive without a codebook (--exact-only)
# grows in bounded memory too, and a compaction writes index segments of
# at most 32 MiB of codes.
# usage: cli_append_memory.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
. "$(dirname "$0")/cli_lib.sh"
PY=/usr/bin/python3
[ -x /usr/bin/time ] || { echo "SKIP: no GNU time at /usr/bin/time"; exit 77; }
"$PY" -c 'import numpy' 2>/dev/null || { echo "SKIP: $PY has no numpy"; exit 77; }
BOUND_KIB=$((128 * 1024))
# under ASan the shadow memory and the allocator's quarantine inflate the RSS:
# FKVF_TEST_SANITIZER (tests/CMakeLists.txt, FKVF_SANITIZE builds) turns the
# bound off and keeps every other check
under_bound() { [ -n "${FKVF_TEST_SANITIZER:-}" ] || [ "$1" -lt "$BOUND_KIB" ]; }
peak_ok() { # peak_ok NAME: the peak of the last timed run under the bound
    peak=$(tail -1 "$T/time")
    echo "$1: peak RSS $peak KiB"
    if under_bound "$peak"; then pass=$((pass + 1)); else
        echo "FAIL $1: peak RSS $peak KiB, bound $BOUND_KIB KiB"; fails=$((fails + 1)); fi
}
shape="--layers 8 --heads 8 --dim 128"
# shellcheck disable=SC2086
"$PY" "$SRC/bench/mkcache.py" -o "$T/raw.npy" --positions 8192 $shape >/dev/null || exit 1
# shellcheck disable=SC2086
"$PY" "$SRC/bench/mkcache.py" -o "$T/train.npy" --positions 256 --seed 1 $shape >/dev/null || exit 1
raw=$(wc -c <"$T/raw.npy")
if [ "$raw" -gt $((2 * BOUND_KIB * 1024)) ]; then pass=$((pass + 1)); else
    echo "FAIL: the cache ($raw bytes) is not larger than twice the bound"; fails=$((fails + 1)); fi
check train 0 "$FKVF" train "$T/train.npy" -o "$T/cb.fkvf" --k 16 --k-stages 2 --v-stages 1 \
    --iters 1 --no-rope
rm -f "$T/train.npy"

# one commit of the whole cache, a new archive
check create 0 /usr/bin/time -o "$T/time" -f %M "$FKVF" append --create "$T/a.fkvf" "$T/raw.npy" \
    --codebooks "$T/cb.fkvf" --no-rope --threads 2
peak_ok create
grep_in create-one-commit 'appended 8192 positions (0..8191 of .*) in 1 commit(s); now 8192 positions (8156 archived, 36 exact)' "$T/out"
check verify 0 "$FKVF" verify "$T/a.fkvf"
# commit 1 (descriptor, codebook reference, the empty index group; no
# token ids in a .npy) and, had the commit been written at once, 3 sections
# (one index segment, the sinks' and the window's EXAC): 6 (main's file).
# Written in pieces (256 MiB of rows, 64 MiB at a time): index segments
# more
secs=$(sed -n 's/.*commit(s), \([0-9]*\) sections.*/\1/p' "$T/out")
if [ "${secs:-0}" -ge 8 ]; then pass=$((pass + 1)); else
    echo "FAIL pieces: $secs sections"; cat "$T/out"; fails=$((fails + 1)); fi

# the same positions, 1024 a commit (each below the queue's bound)
check create-every 0 "$FKVF" append --create "$T/r.fkvf" "$T/raw.npy" --codebooks "$T/cb.fkvf" \
    --no-rope --commit-every 1024 --no-auto-compact
check compact-a 0 "$FKVF" compact "$T/a.fkvf" -o "$T/ac.fkvf"
check compact-r 0 "$FKVF" compact "$T/r.fkvf" -o "$T/rc.fkvf"
if cmp -s "$T/ac.fkvf" "$T/rc.fkvf"; then pass=$((pass + 1)); else
    echo "FAIL same: the compactions of the one-commit and the 1024-a-commit archives differ"
    fails=$((fails + 1)); fi
rm -f "$T/r.fkvf" "$T/rc.fkvf"

# any thread count: the same file
check create-1 0 "$FKVF" append --create "$T/a1.fkvf" "$T/raw.npy" --codebooks "$T/cb.fkvf" \
    --no-rope --threads 1
if cmp -s "$T/a.fkvf" "$T/a1.fkvf"; then pass=$((pass + 1)); else
    echo "FAIL threads: --threads 1 and 2 wrote different files"; fails=$((fails + 1)); fi
rm -f "$T/a1.fkvf"

# to an existing archive: 1000 positions, then the other 7192 in one commit
check create-part 0 "$FKVF" append --create "$T/b.fkvf" "$T/raw.npy" --positions 0:1000 \
    --codebooks "$T/cb.fkvf" --no-rope
check append 0 /usr/bin/time -o "$T/time" -f %M "$FKVF" append "$T/b.fkvf" "$T/raw.npy" \
    --positions 1000: --codebooks "$T/cb.fkvf"
peak_ok append
grep_in append-one-commit 'appended 7192 positions (1000..8191 of .*) in 1 commit(s)' "$T/out"
check compact-b 0 "$FKVF" compact "$T/b.fkvf" -o "$T/bc.fkvf"
if cmp -s "$T/ac.fkvf" "$T/bc.fkvf"; then pass=$((pass + 1)); else
    echo "FAIL same-append: the compactions of the created and the appended archives differ"
    fails=$((fails + 1)); fi
rm -f "$T/a.fkvf" "$T/b.fkvf" "$T/bc.fkvf"

# an archive without a codebook (every position exact) of 2048 positions
# (64 MiB), grown by 2048 more: the appender kept every exact row of such an
# archive in memory (loaded at open), and the new ones; now none of the
# committed ones. Opening the archive maps it and checks every EXAC
# section's checksum (spec 7.5), then lets go of the checked pages
# (docs/library.md): the append stays under the bound, and fkvf info's
# open takes less than a third of it (main: info 75 MiB, the append 200
# MiB more)
check create-exact 0 "$FKVF" append --create "$T/e.fkvf" "$T/raw.npy" --positions 0:2048 --exact-only
check info-exact 0 /usr/bin/time -o "$T/time" -f %M "$FKVF" info "$T/e.fkvf"
open_kib=$(tail -1 "$T/time")
check append-exact 0 /usr/bin/time -o "$T/time" -f %M "$FKVF" append "$T/e.fkvf" "$T/raw.npy" \
    --positions 2048:4096
peak=$(tail -1 "$T/time")
echo "append-exact: peak RSS $peak KiB, fkvf info $open_kib KiB"
if [ -n "${FKVF_TEST_SANITIZER:-}" ] ||
    { [ "$peak" -lt "$BOUND_KIB" ] && [ "$open_kib" -lt $((BOUND_KIB / 3)) ]; }; then
    pass=$((pass + 1)); else
    echo "FAIL append-exact: peak RSS $peak KiB, fkvf info $open_kib KiB (bound $BOUND_KIB KiB)"
    fails=$((fails + 1)); fi
check verify-exact 0 "$FKVF" verify "$T/e.fkvf"
# its compaction: 128 MiB of exact rows in EXAC sections of <= 8 MiB (main:
# one section, held in memory twice), restoring the same rows
check compact-exact 0 "$FKVF" compact "$T/e.fkvf" -o "$T/ec.fkvf"
check verify-exact-c 0 "$FKVF" verify "$T/ec.fkvf"
grep_in compact-exact-pieces 'OK (1 commit(s), 17 sections' "$T/out"
check unpack-e 0 "$FKVF" unpack "$T/e.fkvf" -o "$T/e.u.npy"
check unpack-ec 0 "$FKVF" unpack "$T/ec.fkvf" -o "$T/ec.u.npy"
if cmp -s "$T/e.u.npy" "$T/ec.u.npy"; then pass=$((pass + 1)); else
    echo "FAIL compact-exact-same: the compaction restores other rows"; fails=$((fails + 1)); fi
rm -f "$T/ec.fkvf" "$T/e.u.npy" "$T/ec.u.npy"
rm -f "$T/e.fkvf" "$T/raw.npy"

# compaction (fkvf compact, and the appender's automatic one) holds a piece
# at a time too: an archive of 512 index streams (32 layers x 8 heads x dim
# 1, one key and one value stage) and 40000 positions has 40 MiB of codes,
# compacted into two index segments of <= 32 MiB (main: one); the same rows
"$PY" "$SRC/bench/mkcache.py" -o "$T/d1.npy" --positions 40000 --layers 32 --heads 8 --dim 1 \
    >/dev/null || exit 1
"$PY" "$SRC/bench/mkcache.py" -o "$T/d1t.npy" --positions 256 --layers 32 --heads 8 --dim 1 \
    --seed 1 >/dev/null || exit 1
check train-d1 0 "$FKVF" train "$T/d1t.npy" -o "$T/d1cb.fkvf" --k 16 --k-stages 1 --v-stages 1 \
    --iters 1 --no-rope
check create-d1 0 "$FKVF" append --create "$T/d1.fkvf" "$T/d1.npy" --codebooks "$T/d1cb.fkvf" \
    --no-rope
check compact-d1 0 "$FKVF" compact "$T/d1.fkvf" -o "$T/d1c.fkvf"
check verify-d1 0 "$FKVF" verify "$T/d1c.fkvf"
# DESC, CBRF, the sinks' and the window's EXAC, and the index segments
grep_in compact-pieces 'OK (1 commit(s), 6 sections' "$T/out"
check unpack-d1 0 "$FKVF" unpack "$T/d1.fkvf" -o "$T/d1.u.npy"
check unpack-d1c 0 "$FKVF" unpack "$T/d1c.fkvf" -o "$T/d1c.u.npy"
if cmp -s "$T/d1.u.npy" "$T/d1c.u.npy"; then pass=$((pass + 1)); else
    echo "FAIL compact-same: the compaction restores other rows"; fails=$((fails + 1)); fi
finish cli_append_memory
