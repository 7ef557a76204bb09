#!/bin/sh
# --threads and FKVF_THREADS (docs/library.md "Threads the library starts"):
# every command that encodes, trains or restores writes the same bytes for
# 1, 2, 3 and 7 threads and for the default (every CPU): pack (trained and
# with a codebook file, keys un-rotated, beam search), train, unpack in
# every dtype, append (--create, then a commit with archived positions),
# index (every stream), compact (the indexes rebuilt), verify's JSON (OK,
# and the first of several damaged search indexes) and, where the model is
# there, import-llama / export-llama. Bad counts
# are usage errors naming the option or variable; --threads on a command
# that runs on one thread is an unknown option.
# usage: cli_threads.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
TR=$SRC/testdata/train-cache.safetensors
SC=$SRC/testdata/sample-cache.safetensors
. "$(dirname "$0")/cli_lib.sh"
same() { # same NAME FILE_A FILE_B
    if cmp -s "$2" "$3"; then pass=$((pass + 1)); else echo "FAIL $1: $2 and $3 differ"; fails=$((fails + 1)); fi
}
unset FKVF_THREADS

for n in 1 2 3 7 default; do
    if [ "$n" = default ]; then opt=""; else opt="--threads $n"; fi
    # shellcheck disable=SC2086 # $opt is two words or none
    check "train-$n" 0 "$FKVF" train "$TR" --k 32 --k-stages 3 --v-stages 2 $opt -o "$T/cb-$n.fkvf"
    check "pack-train-$n" 0 "$FKVF" pack "$TR" --k 32 $opt -o "$T/pt-$n.fkvf"
    check "pack-cb-$n" 0 "$FKVF" pack "$SC" --codebooks "$T/cb-1.fkvf" --beam 4 $opt \
        -o "$T/pc-$n.fkvf"
    for dt in f16 bf16 f32; do
        check "unpack-$dt-$n" 0 "$FKVF" unpack "$T/pt-1.fkvf" --dtype "$dt" $opt \
            -o "$T/u-$dt-$n.safetensors"
    done
    check "append-create-$n" 0 "$FKVF" append "$T/ap-$n.fkvf" "$SC" --create \
        --codebooks "$T/cb-1.fkvf" --recent 8 $opt
    check "append-$n" 0 "$FKVF" append "$T/ap-$n.fkvf" "$TR" --continues --codebooks "$T/cb-1.fkvf" $opt
    # index (every stream), verify (OK, and with flipped bytes in several
    # search indexes: the first one's checksum), compact (rebuilds them)
    cp "$T/pt-1.fkvf" "$T/ix-$n.fkvf"
    check "index-$n" 0 "$FKVF" index "$T/ix-$n.fkvf" --no-sync $opt
    if [ "$n" = 1 ]; then
        cp "$T/ix-1.fkvf" "$T/bad.fkvf"
        "$FKVF" dump "$T/ix-1.fkvf" | awk '$2 == "ZPOS" && ++k % 3 == 2 { print $4 + 80 }' >"$T/zpos"
        [ "$(wc -l <"$T/zpos")" -ge 3 ] && pass=$((pass + 1)) || { echo "FAIL: too few ZPOS sections"; fails=$((fails + 1)); }
        while read -r off; do
            printf '\252' | dd of="$T/bad.fkvf" bs=1 seek="$off" conv=notrunc 2>/dev/null
        done <"$T/zpos"
    fi
    check "verify-$n" 0 "$FKVF" verify "$T/ix-1.fkvf" --json $opt
    cp "$T/out" "$T/verify-$n.json"
    check "verify-bad-$n" 1 "$FKVF" verify "$T/bad.fkvf" --json $opt
    cp "$T/out" "$T/verify-bad-$n.json"
    grep_in "verify-bad-checksum-$n" '"code":25,' "$T/out"
    check "compact-$n" 0 "$FKVF" compact "$T/ix-1.fkvf" -o "$T/cp-$n.fkvf" $opt
    if [ "$n" != 1 ]; then
        same "train-same-$n" "$T/cb-1.fkvf" "$T/cb-$n.fkvf"
        same "pack-train-same-$n" "$T/pt-1.fkvf" "$T/pt-$n.fkvf"
        same "pack-cb-same-$n" "$T/pc-1.fkvf" "$T/pc-$n.fkvf"
        for dt in f16 bf16 f32; do
            same "unpack-$dt-same-$n" "$T/u-$dt-1.safetensors" "$T/u-$dt-$n.safetensors"
        done
        same "append-same-$n" "$T/ap-1.fkvf" "$T/ap-$n.fkvf"
        same "index-same-$n" "$T/ix-1.fkvf" "$T/ix-$n.fkvf"
        same "verify-same-$n" "$T/verify-1.json" "$T/verify-$n.json"
        same "verify-bad-same-$n" "$T/verify-bad-1.json" "$T/verify-bad-$n.json"
        same "compact-same-$n" "$T/cp-1.fkvf" "$T/cp-$n.fkvf"
    fi
done
# FKVF_THREADS: the same bytes again; --threads wins over it
FKVF_THREADS=3 check env-pack 0 "$FKVF" pack "$TR" --k 32 -o "$T/pt-env.fkvf"
same env-pack-same "$T/pt-1.fkvf" "$T/pt-env.fkvf"
FKVF_THREADS=bad check env-overridden 0 "$FKVF" unpack "$T/pt-1.fkvf" --threads 2 \
    -o "$T/u-env.safetensors"

# a llama.cpp state file, where the model is there
MODEL=$SRC/../shared/models/stories260K.gguf
if [ -f "$MODEL" ]; then
    ST=$SRC/testdata/llama-stories260K.bin
    for n in 1 3; do
        check "import-$n" 0 "$FKVF" import-llama "$ST" --model "$MODEL" --codebooks "$T/cb-1.fkvf" \
            --threads "$n" -o "$T/ll-$n.fkvf"
        check "export-$n" 0 "$FKVF" export-llama "$T/ll-$n.fkvf" --codebooks "$T/cb-1.fkvf" \
            --threads "$n" -o "$T/ll-$n.bin"
    done
    same import-same "$T/ll-1.fkvf" "$T/ll-3.fkvf"
    same export-same "$T/ll-1.bin" "$T/ll-3.bin"
else
    echo "cli_threads: $MODEL not found: import-llama / export-llama not checked"
fi

# refusals
check threads-zero 2 "$FKVF" pack "$TR" --threads 0 -o "$T/x.fkvf"
grep_in threads-zero-msg "fkvf pack: --threads needs a number of threads, 1 to 1024" "$T/err"
check threads-word 2 "$FKVF" unpack "$T/pt-1.fkvf" --threads many -o "$T/x.safetensors"
check threads-missing 2 "$FKVF" train "$TR" -o "$T/x.fkvf" --threads
check threads-huge 2 "$FKVF" train "$TR" --threads 1025 -o "$T/x.fkvf"
FKVF_THREADS=0 check env-zero 2 "$FKVF" train "$TR" -o "$T/x.fkvf"
grep_in env-zero-msg "FKVF_THREADS='0' is not a number of threads, 1 to 1024" "$T/err"
FKVF_THREADS=2x check env-junk 2 "$FKVF" pack "$TR" -o "$T/x.fkvf"
FKVF_THREADS=2x check env-ignored-by-info 0 "$FKVF" info "$T/pt-1.fkvf"
check threads-info 2 "$FKVF" info "$T/pt-1.fkvf" --threads 2
[ ! -e "$T/x.fkvf" ] && pass=$((pass + 1)) || { echo "FAIL: a refused command wrote x.fkvf"; fails=$((fails + 1)); }
# --help names the option
check help-pack 0 "$FKVF" pack --help
grep_in help-pack-threads "--threads N" "$T/out"
for c in verify index compact; do
    check "help-$c" 0 "$FKVF" "$c" --help
    grep_in "help-$c-threads" "--threads N" "$T/out"
done
check help-main 0 "$FKVF" --help
grep_in help-main-threads "take --threads N" "$T/out"
finish cli_threads
