#!/bin/sh
# Builds seed corpora for the fuzz targets into OUT/<target>/ (default
# build-fuzz/seeds), from the conformance suite, the committed corpora and
# small generated files:
#   open, decode, search   conformance/files, tiny quad/ngon samples from
#                          fkvf-mksample, the committed corpus/open|search;
#                          decode also the same files with the first byte
#                          0x88 (checksums recomputed by the target) and
#                          random "recipes" (bytes without the magic)
#   codec, quant, append   random bytes (the targets read parameters from
#                          any input) of a few sizes
#   safetensors, npy, npz  the tiny samples unpacked with `fkvf unpack` in
#                          f16 / bf16 / f32, plus the committed corpora
#   cli_numbers            strings for each parser (first byte picks it)
#   gguf                   small GGUF headers from fuzz/gguf_seeds.py (its
#                          own writer; no model file is copied)
#   llama_state            fuzz/llama_state_seeds.py (small state files)
# Then run the fuzzers on OUT/<t> and minimize into fuzz/corpus/<t> with
# -merge=1 (see fuzz/README.md). Needs an ordinary build with the tools.
# Usage: fuzz/seed.sh [BUILD_DIR [OUT]]   (BUILD_DIR default: build)
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
OUT=${2:-build-fuzz/seeds}
FKVF=$B/tools/fkvf
MK=$B/tools/fkvf-mksample
[ -x "$FKVF" ] && [ -x "$MK" ] || {
    echo "seed.sh: build $B first (targets fkvf, fkvf-mksample)" >&2
    exit 2
}
rm -rf "$OUT"
for t in open decode codec quant append search safetensors npy npz cli_numbers; do
    mkdir -p "$OUT/$t"
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# archives
"$MK" --tiny -o "$tmp/tiny.fkvf"
"$MK" --tiny --ngon -o "$tmp/tiny-ngon.fkvf"
for t in open decode search; do
    cp conformance/files/*.fkvf "$OUT/$t/"
    cp "$tmp/tiny.fkvf" "$tmp/tiny-ngon.fkvf" "$OUT/$t/"
done
# decode: the same files with the first magic byte 0x88, which makes the
# target recompute their checksums before opening them
for f in conformance/files/*.fkvf "$tmp/tiny.fkvf" "$tmp/tiny-ngon.fkvf"; do
    { printf '\210'; tail -c +2 "$f"; } >"$OUT/decode/fix-$(basename "$f" .fkvf)"
done
cp fuzz/corpus/open/* "$OUT/open/" 2>/dev/null || true
cp fuzz/corpus/search/* "$OUT/search/" 2>/dev/null || true
cp fuzz/corpus/decode/* "$OUT/decode/" 2>/dev/null || true

# random inputs for the structured targets (and decode recipes)
i=0
for n in 8 16 32 64 128 256 512 1024 2048 4096; do
    for t in codec quant append decode; do
        head -c "$n" /dev/urandom >"$OUT/$t/rnd-$n-$i"
        # decode recipes must not start with the FKVF magic byte
        [ "$t" = decode ] && printf '\001' | dd of="$OUT/$t/rnd-$n-$i" bs=1 count=1 conv=notrunc 2>/dev/null
    done
    i=$((i + 1))
done
for t in codec quant append; do
    cp fuzz/corpus/$t/* "$OUT/$t/" 2>/dev/null || true
done

# raw caches
for a in tiny tiny-ngon; do
    for d in f16 bf16 f32; do
        for e in safetensors npy npz; do
            "$FKVF" unpack "$tmp/$a.fkvf" -o "$tmp/$a-$d.$e" --dtype "$d" >/dev/null
            cp "$tmp/$a-$d.$e" "$OUT/$e/"
        done
    done
done
for t in safetensors npy npz; do
    cp fuzz/corpus/$t/* "$OUT/$t/" 2>/dev/null || true
done

# CLI number strings: selector byte then the string
c=$OUT/cli_numbers
k=0
for s in 0 1 16 4096 18446744073709551615 18446744073709551616 " 1" "-1" "+1" 007; do
    printf '\000\377\377\377\377\377\377\377\377%s' "$s" >"$c/u64-$k"
    printf '\002%s' "$s" >"$c/opt-$k"
    k=$((k + 1))
done
for s in 1.5 1e308 1e309 1e-310 0x1p3 inf nan " 2" "2 " -0 10000; do
    printf '\001%s' "$s" >"$c/f64-$k"
    k=$((k + 1))
done
for s in 1 "1,2,3" "4294967295,0" "4294967296" "1,,2" "1," ",1" ""; do
    printf '\003%s' "$s" >"$c/list-$k"
    k=$((k + 1))
done
for s in tokens L0.H0.K.0 L1.H2.V.3 L65535.H65535.V.255 L65536.H0.K.0 "L 1.H1.K.1" "L1.H1.X.1" L1.H1.K.1x; do
    printf '\004%s' "$s" >"$c/name-$k"
    k=$((k + 1))
done
# GGUF metadata headers
python3 fuzz/gguf_seeds.py "$OUT/gguf"
# llama.cpp state files (tools/llama_state.c): small generated files
python3 fuzz/llama_state_seeds.py "$OUT/llama_state" >/dev/null
for t in open decode codec quant append search safetensors npy npz cli_numbers gguf llama_state; do
    echo "seed.sh: $t: $(ls "$OUT/$t" | wc -l) files"
done
