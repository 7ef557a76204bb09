#!/bin/sh
# Files written on one architecture read on another (issue 20): the same
# pack / train / append / index / unpack / search / keys work done by the
# native fkvf (x86-64) and by a cross-built one under qemu user-mode, and
# every archive, codebook file, restored cache and answer compared byte for
# byte; archives written by each are read, appended to and restored by the
# other. Run by scripts/test-cross.sh:
#   tests/cross_roundtrip.sh NATIVE_FKVF 'EMULATOR... TARGET_FKVF' SRCDIR
# Exits 0 when all is identical, 1 (naming the first difference) otherwise.
set -u
[ $# -eq 3 ] || { echo "usage: $0 NATIVE_FKVF 'EMULATOR... TARGET_FKVF' SRCDIR" >&2; exit 2; }
N=$1 T=$2 SRC=$3
CACHE=$SRC/testdata/sample-cache.safetensors
TRAIN=$SRC/testdata/train-cache.safetensors
W=$(mktemp -d) || exit 2
trap 'rm -rf "$W"' EXIT
fail() { echo "cross_roundtrip: FAIL: $*" >&2; exit 1; }
checks=0
# run NAME ARGS...: the same fkvf command by both, outputs in $W/n and $W/t;
# stdout compared (stderr kept for a failure)
mkdir -p "$W/n" "$W/t"
run() {
    what=$1; shift
    (cd "$W/n" && "$N" "$@" >"$W/n.out" 2>"$W/n.err"); rn=$?
    # shellcheck disable=SC2086
    (cd "$W/t" && $T "$@" >"$W/t.out" 2>"$W/t.err"); rt=$?
    [ $rn -eq $rt ] || { cat "$W/n.err" "$W/t.err" >&2; fail "$what: exit $rn native, $rt target"; }
    [ $rn -eq 0 ] || { cat "$W/n.err" >&2; fail "$what: exit $rn"; }
    cmp -s "$W/n.out" "$W/t.out" || { diff "$W/n.out" "$W/t.out" | head -20 >&2; fail "$what: output differs"; }
    checks=$((checks + 1))
}
same() { # same FILE...: byte-identical in $W/n and $W/t
    for f in "$@"; do
        cmp "$W/n/$f" "$W/t/$f" >&2 || fail "$f differs between the architectures"
        checks=$((checks + 1))
    done
}

# 1. pack with a trained, embedded codebook (k-means, RoPE un-rotation,
#    RVQ encoding, codecs, deflate, token stream, checksums)
run "pack" pack "$CACHE" -o a.fkvf
same a.fkvf
run "pack f32 tables, beam" pack "$CACHE" -o b.fkvf --f32 --beam 4 --k 32 --no-rope
same b.fkvf
# 2. a codebook file trained on another cache, and archives referring to it
run "train" train "$TRAIN" -o cb.fkvc --k 64 --iters 8
same cb.fkvc
run "pack --codebooks" pack "$CACHE" -o c.fkvf --codebooks cb.fkvc
same c.fkvf
# 3. append: a new archive in commits of 64, then more positions
run "append --create" append --create d.fkvf "$CACHE" --positions 0:160 --commit-every 64 --sync none
same d.fkvf
run "append" append d.fkvf "$CACHE" --positions 160: --sync none
same d.fkvf
# 4. search indexes, then searches and key retrieval over them
run "index" index d.fkvf
same d.fkvf
run "search tokens" search d.fkvf --tokens 1,2,3 --json
run "search stream" search a.fkvf --stream L1.H2.K.0 --symbols 3,1,4,1 --k 3 --json
run "search radius" search a.fkvf --stream L0.H0.V.0 --symbols 5,9 --radius auto --json
run "keys" keys a.fkvf --layer 2 --head 1 --query 0.5,-1,0.25,2,-0.75,1,0,-0.5 -m 8 --json
# 5. restores: every archive by both, in every dtype
for a in a b c d; do
    cb=""
    [ $a = c ] && cb="--codebooks cb.fkvc"
    for dt in f16 bf16 f32; do
        # shellcheck disable=SC2086
        run "unpack $a $dt" unpack $a.fkvf -o $a.$dt.safetensors --dtype $dt $cb
        same $a.$dt.safetensors
    done
    run "info $a" info $a.fkvf --json
    run "verify $a" verify $a.fkvf --json
done
# 6. each side reads and extends the other's files (they are the same
#    bytes by now, so this is belt and braces against a shortcut that
#    compares a file with itself)
cp "$W/n/d.fkvf" "$W/t/e.fkvf"
cp "$W/t/d.fkvf" "$W/n/e.fkvf"
run "append to the other's archive" append e.fkvf "$CACHE" --continues --positions 0:32 --sync none
same e.fkvf
run "unpack the other's archive" unpack e.fkvf -o e.safetensors
same e.safetensors
run "compact" compact e.fkvf -o f.fkvf
same f.fkvf
echo "cross_roundtrip: $checks checks, every file and answer identical"
