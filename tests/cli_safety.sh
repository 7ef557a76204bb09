#!/bin/sh
# Output safety of every command that writes a file (issue 12, items 1, 2):
# an output that is the same file as an input (the same path, another
# spelling of it, a symbolic link, a hard link; the codebook file too) is
# refused with exit 1, even with --force, and the input keeps its bytes; an
# existing output is refused without --force (exit 1, untouched) and replaced
# with it; an FKVF file named like another format gets a warning.
# usage: cli_safety.sh FKVF_BIN SRCDIR   (kvc2cache and fkvf-mksample next to fkvf)
set -u
FKVF=$1
SRC=$2
BIN=$(dirname "$FKVF")
CACHE=$SRC/testdata/sample-cache.safetensors
. "$(dirname "$0")/cli_lib.sh"
Q="--k 16 --k-stages 2 --v-stages 1 --iters 3"
# unchanged NAME FILE COPY: FILE has the bytes of COPY
unchanged() { check "$1-unchanged" 0 cmp "$2" "$3"; }
# refused NAME CMD...: exit 1, a message naming the output as an input
refused_same() {
    name=$1
    shift
    check "$name" 1 "$@"
    grep_in "$name-msg" "is the same file as" "$T/err"
}

mkdir "$T/d"
cp "$CACHE" "$T/d/c.safetensors"
cp "$T/d/c.safetensors" "$T/c.orig"
C=$T/d/c.safetensors

# an output that is a directory: a usage error that says so (it said "exists;
# give --force", and --force then failed with "rename into place")
mkdir "$T/outdir"
for f in "" --force; do
    check "pack-dir$f" 2 "$FKVF" pack "$C" -o "$T/outdir" $Q $f
    grep_in "pack-dir$f-msg" "fkvf pack: $T/outdir: is a directory: give the name of the file to write" "$T/err"
    check "unpack-dir$f" 2 "$FKVF" unpack "$SRC/testdata/sample.fkvf" -o "$T/outdir/" $f
done
check dir-untouched 0 test -z "$(ls -A "$T/outdir")"

# ---- the same file as an input, in every spelling, with and without --force
ln -s c.safetensors "$T/d/sym.safetensors"
ln "$C" "$T/d/hard.safetensors"
for spelling in "$C" "$T/d/../d/c.safetensors" "$T/d/sym.safetensors" "$T/d/hard.safetensors"; do
    for f in "" --force; do
        refused_same "pack-self$f" "$FKVF" pack "$C" -o "$spelling" $Q $f
        unchanged "pack-self$f" "$C" "$T/c.orig"
        refused_same "train-self$f" "$FKVF" train "$C" -o "$spelling" $Q $f
        unchanged "train-self$f" "$C" "$T/c.orig"
    done
done
# the message names both paths: the output as given and the input
check pack-self-msg 1 "$FKVF" pack "$C" -o "$T/d/sym.safetensors" --force
grep_in pack-self-msg-out "fkvf pack: $T/d/sym.safetensors: is the same file as the input $C" "$T/err"
# train: any of its inputs
check train-second-input 1 "$FKVF" train "$CACHE" "$C" -o "$T/d/hard.safetensors" $Q --force
unchanged train-second-input "$C" "$T/c.orig"

# an archive, a codebook file, and an archive that refers to it
check train 0 "$FKVF" train "$CACHE" -o "$T/d/cb.fkvf" $Q
check pack-ext 0 "$FKVF" pack "$CACHE" -o "$T/d/e.fkvf" --codebooks "$T/d/cb.fkvf"
check pack-emb 0 "$FKVF" pack "$CACHE" -o "$T/d/a.fkvf" $Q
for f in cb e a; do cp "$T/d/$f.fkvf" "$T/$f.orig"; done
# pack: the codebook file is an input too
refused_same pack-cb-out "$FKVF" pack "$CACHE" -o "$T/d/cb.fkvf" --codebooks "$T/d/cb.fkvf" --force
unchanged pack-cb-out "$T/d/cb.fkvf" "$T/cb.orig"
# compact -o: the archive (any spelling; also with --force) and its codebook
# file, found next to it or given
check compact-self 1 "$FKVF" compact "$T/d/a.fkvf" -o "$T/d/./a.fkvf" --force
grep_in compact-self-msg "use --in-place" "$T/err"
unchanged compact-self "$T/d/a.fkvf" "$T/a.orig"
ln -s a.fkvf "$T/d/a-link.fkvf"
check compact-link 1 "$FKVF" compact "$T/d/a.fkvf" -o "$T/d/a-link.fkvf" --force
unchanged compact-link "$T/d/a.fkvf" "$T/a.orig"
refused_same compact-cb-hint "$FKVF" compact "$T/d/e.fkvf" -o "$T/d/cb.fkvf" --force
unchanged compact-cb-hint "$T/d/cb.fkvf" "$T/cb.orig"
refused_same compact-cb-given "$FKVF" compact "$T/d/e.fkvf" -o "$T/d/cb.fkvf" --codebooks "$T/d/cb.fkvf" --force
unchanged compact-cb-given "$T/d/cb.fkvf" "$T/cb.orig"
# compact --in-place replaces its archive (that is what it is for)
cp "$T/d/a.fkvf" "$T/d/ip.fkvf"
check compact-in-place 0 "$FKVF" compact "$T/d/ip.fkvf" --in-place
# unpack: the archive, and its codebook file when that has a cache name
check train-npz 0 "$FKVF" train "$CACHE" -o "$T/d/cb2.npz" $Q
grep_in train-npz-warns "warning: .*cb2.npz: the name ends in .npz, but the file written is an FKVF codebook file" "$T/err"
check pack-cb2 0 "$FKVF" pack "$CACHE" -o "$T/d/e2.fkvf" --codebooks "$T/d/cb2.npz"
cp "$T/d/cb2.npz" "$T/cb2.orig"
refused_same unpack-cb-hint "$FKVF" unpack "$T/d/e2.fkvf" -o "$T/d/cb2.npz" --force
unchanged unpack-cb-hint "$T/d/cb2.npz" "$T/cb2.orig"
refused_same unpack-cb-given "$FKVF" unpack "$T/d/e2.fkvf" -o "$T/d/cb2.npz" --codebooks "$T/d/cb2.npz" --force
unchanged unpack-cb-given "$T/d/cb2.npz" "$T/cb2.orig"
# also when no position is archived (the codebook is not needed to restore,
# but it is the archive's input all the same)
check pack-cb2-exact 0 "$FKVF" pack "$CACHE" -o "$T/d/e3.fkvf" --codebooks "$T/d/cb2.npz" --recent 300
grep_in pack-cb2-exact-all "256 positions (256 exact, 0 archived)" "$T/out"
refused_same unpack-cb-exact "$FKVF" unpack "$T/d/e3.fkvf" -o "$T/d/cb2.npz" --force
unchanged unpack-cb-exact "$T/d/cb2.npz" "$T/cb2.orig"
cp "$T/d/a.fkvf" "$T/d/a.npz"
cp "$T/d/a.npz" "$T/anpz.orig"
refused_same unpack-self "$FKVF" unpack "$T/d/a.npz" -o "$T/d/a.npz" --force
unchanged unpack-self "$T/d/a.npz" "$T/anpz.orig"
# append --create: the new archive must not be the cache or the codebook file
refused_same append-create-self "$FKVF" append --create "$C" "$C" --exact-only
unchanged append-create-self "$C" "$T/c.orig"
refused_same append-create-cb "$FKVF" append --create "$T/d/cb.fkvf" "$CACHE" --codebooks "$T/d/cb.fkvf"
unchanged append-create-cb "$T/d/cb.fkvf" "$T/cb.orig"
# plot: the archive
cp "$T/d/a.fkvf" "$T/d/a.png"
cp "$T/d/a.png" "$T/apng.orig"
refused_same plot-self "$FKVF" plot "$T/d/a.png" --stream tokens -o "$T/d/a.png" --force
unchanged plot-self "$T/d/a.png" "$T/apng.orig"
# the helper tools
if [ -x "$BIN/kvc2cache" ]; then
    printf 'KVGENRAW' >"$T/d/k.safetensors"
    cp "$T/d/k.safetensors" "$T/k.orig"
    refused_same kvc-self "$BIN/kvc2cache" "$T/d/k.safetensors" "$T/d/k.safetensors" --force
    unchanged kvc-self "$T/d/k.safetensors" "$T/k.orig"
fi

# ---- an existing output: refused without --force, replaced with it
printf 'precious\n' >"$T/p.orig"
for cmd in "pack $CACHE -o @.fkvf $Q" "train $CACHE -o @.fkvf $Q" \
           "unpack $T/d/a.fkvf -o @.safetensors" "compact $T/d/a.fkvf -o @.fkvf" \
           "plot $T/d/a.fkvf --stream tokens -o @.png --size 64"; do
    c=${cmd%% *}
    out=$(printf '%s\n' "$cmd" | sed "s#.*-o \\([^ ]*\\).*#\\1#" | sed "s#@#$T/d/x-$c#")
    args=$(printf '%s\n' "$cmd" | sed "s#@#$T/d/x-$c#")
    cp "$T/p.orig" "$out"
    # shellcheck disable=SC2086
    check "$c-exists" 1 "$FKVF" $args
    grep_in "$c-exists-msg" "fkvf $c: $out: exists; not replaced (give --force to replace it)" "$T/err"
    unchanged "$c-exists" "$out" "$T/p.orig"
    # shellcheck disable=SC2086
    check "$c-force" 0 "$FKVF" $args --force
    if cmp -s "$out" "$T/p.orig"; then echo "FAIL $c-force: not replaced"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
    # a dangling symbolic link is a file too
    rm -f "$out"
    ln -s "$T/d/nothing-here" "$out"
    # shellcheck disable=SC2086
    check "$c-dangling" 1 "$FKVF" $args
    rm -f "$out"
done
# append --create never replaces a file, and has no --force
cp "$T/p.orig" "$T/d/x-create.fkvf"
check append-create-exists 1 "$FKVF" append --create "$T/d/x-create.fkvf" "$CACHE" --exact-only
grep_in append-create-exists-msg "never replaces a file" "$T/err"
unchanged append-create-exists "$T/d/x-create.fkvf" "$T/p.orig"
check append-create-force 2 "$FKVF" append --create "$T/d/x-create.fkvf" "$CACHE" --exact-only --force
if [ -x "$BIN/kvc2cache" ]; then
    cp "$T/p.orig" "$T/d/x-kvc.safetensors"
    check kvc-exists 1 "$BIN/kvc2cache" "$T/nothing.kvc" "$T/d/x-kvc.safetensors"
    unchanged kvc-exists "$T/d/x-kvc.safetensors" "$T/p.orig"
    check kvc-force-missing-input 2 "$BIN/kvc2cache" "$T/nothing.kvc" "$T/d/x-kvc.safetensors" --force
fi
if [ -x "$BIN/fkvf-mksample" ]; then
    cp "$T/p.orig" "$T/d/x-mk.fkvf"
    check mksample-exists 1 "$BIN/fkvf-mksample" -o "$T/d/x-mk.fkvf"
    unchanged mksample-exists "$T/d/x-mk.fkvf" "$T/p.orig"
    check mksample-force 0 "$BIN/fkvf-mksample" -o "$T/d/x-mk.fkvf" --force
    check mksample-force-same 0 cmp "$T/d/x-mk.fkvf" "$SRC/testdata/sample.fkvf"
fi
# nothing was left behind: no temporary files next to the outputs
if ls "$T/d" | grep -q '\.tmp-'; then echo "FAIL no-temp-files: $(ls "$T/d")"; fails=$((fails + 1)); else pass=$((pass + 1)); fi

# ---- --force replaces the name, atomically, never the contents of a file:
# a hard link keeps the other file's bytes, a symbolic link is replaced by a
# regular file and its target kept, a failed write keeps the old file
mkdir "$T/o"
printf 'other\n' >"$T/other.orig"
for cmd in "unpack $T/d/a.fkvf -o @.safetensors" "plot $T/d/a.fkvf --stream tokens -o @.png --size 64"; do
    c=${cmd%% *}
    out=$(printf '%s\n' "$cmd" | sed "s#.*-o \\([^ ]*\\).*#\\1#" | sed "s#@#$T/o/$c#")
    args=$(printf '%s\n' "$cmd" | sed "s#@#$T/o/$c#")
    cp "$T/other.orig" "$T/o/$c-other"
    ln "$T/o/$c-other" "$out"
    # shellcheck disable=SC2086
    check "$c-force-hardlink" 0 "$FKVF" $args --force
    unchanged "$c-force-hardlink-other" "$T/o/$c-other" "$T/other.orig"
    if cmp -s "$out" "$T/other.orig"; then echo "FAIL $c-force-hardlink: not replaced"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
    rm -f "$out"
    cp "$T/other.orig" "$T/o/$c-target"
    ln -s "$c-target" "$out"
    # shellcheck disable=SC2086
    check "$c-force-symlink" 0 "$FKVF" $args --force
    unchanged "$c-force-symlink-target" "$T/o/$c-target" "$T/other.orig"
    if [ -f "$out" ] && [ ! -L "$out" ]; then pass=$((pass + 1)); else echo "FAIL $c-force-symlink: $(ls -l "$out")"; fails=$((fails + 1)); fi
    # a write that fails (the file size limit: EFBIG, not the signal) keeps
    # the old file: exit 2, a message naming the output
    cp "$T/other.orig" "$out"
    # shellcheck disable=SC2086
    check "$c-force-efbig" 2 sh -c 'trap "" XFSZ; ulimit -f 1; exec "$@"' sh "$FKVF" $args --force
    grep_in "$c-force-efbig-msg" "fkvf $c: $out: .*File too large" "$T/err"
    unchanged "$c-force-efbig" "$out" "$T/other.orig"
    rm -f "$out"
done
if ls "$T/o" | grep -q '\.tmp-'; then echo "FAIL no-temp-files-o: $(ls "$T/o")"; fails=$((fails + 1)); else pass=$((pass + 1)); fi

# ---- outputs get the mode fopen would give: 0666 less the umask
for m in 077:600 022:644 002:664; do
    (umask "${m%%:*}" && "$FKVF" unpack "$T/d/a.fkvf" -o "$T/o/m.safetensors" >/dev/null 2>&1 &&
        "$FKVF" plot "$T/d/a.fkvf" --stream tokens -o "$T/o/m.png" --size 64 >/dev/null 2>&1)
    for f in m.safetensors m.png; do
        got=$(stat -c %a "$T/o/$f" 2>/dev/null)
        if [ "$got" = "${m##*:}" ]; then pass=$((pass + 1)); else echo "FAIL mode-umask-${m%%:*}: $f is ${got:-missing}, want ${m##*:}"; fails=$((fails + 1)); fi
    done
    rm -f "$T/o/m.safetensors" "$T/o/m.png"
done

# ---- FKVF files named like another format: a warning, the file still written
for e in safetensors npz npy pt bin gguf; do
    check "pack-name-$e" 0 "$FKVF" pack "$CACHE" -o "$T/n.$e" $Q
    grep_in "pack-name-$e-warns" "fkvf pack: warning: $T/n.$e: the name ends in .$e, but the file written is an FKVF archive, not a $e file (name it .fkvf)" "$T/err"
    check "pack-name-$e-verify" 0 "$FKVF" verify "$T/n.$e"
done
check pack-name-upper 0 "$FKVF" pack "$CACHE" -o "$T/n.NPZ" $Q
grep_in pack-name-upper-warns "warning: .*n.NPZ: the name ends in .NPZ" "$T/err"
check pack-name-fkvf 0 "$FKVF" pack "$CACHE" -o "$T/n.fkvf" $Q
if grep -q warning "$T/err"; then echo "FAIL pack-name-fkvf: a warning for .fkvf"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
check compact-name 0 "$FKVF" compact "$T/n.fkvf" -o "$T/n2.npy"
grep_in compact-name-warns "fkvf compact: warning: .*n2.npy: the name ends in .npy" "$T/err"
check create-name 0 "$FKVF" append --create "$T/n3.safetensors" "$CACHE" --exact-only
grep_in create-name-warns "fkvf append: warning: .*n3.safetensors: the name ends in .safetensors" "$T/err"
# --json: the warning stays on stderr, stdout is the one object
check pack-name-json 0 "$FKVF" pack "$CACHE" -o "$T/n4.npy" $Q --json
grep_in pack-name-json-warns "warning" "$T/err"
cp "$T/out" "$T/j.json"
check pack-name-json-parses 0 /usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["archive"].endswith("n4.npy") and d["positions"] == 256, d
' "$T/j.json"

finish cli_safety
