#!/bin/sh
# CLI pack / unpack / train / compare on the bundled real sample cache
# (testdata/sample-cache.safetensors): round trips, exact window bit for bit,
# external codebooks (and a wrong one), codecs, key modes, output formats,
# exit codes.
# usage: cli_pack.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
CACHE=$SRC/testdata/sample-cache.safetensors
. "$(dirname "$0")/cli_lib.sh"
Q="--k 16 --k-stages 2 --v-stages 1"
# relmse_below NAME BOUND: the keys and values rel_mse of the last compare --json
relmse_below() {
    for kv in keys values; do
        v=$(sed -n "s/.*\"$kv\":{\"rel_mse\":\([^,]*\),.*/\1/p" "$T/out")
        if [ -n "$v" ] && awk -v v="$v" -v b="$2" 'BEGIN { exit !(v < b) }'; then
            pass=$((pass + 1))
        else
            echo "FAIL $1: $kv rel_mse '$v' not below $2"; cat "$T/out"; fails=$((fails + 1))
        fi
    done
}
# roundtrip NAME ARCHIVE OUT SINKS RECENT: unpack, compare, exact positions identical
roundtrip() {
    check "$1-unpack" 0 "$FKVF" unpack "$2" -o "$3"
    check "$1-compare" 0 "$FKVF" compare "$CACHE" "$3" --sinks "$4" --recent "$5" --json
    n=$(( $4 + $5 ))
    grep_in "$1-exact" "\"exact_positions\":$n,\"exact_identical\":$n," "$T/out"
}

# help and usage errors
for c in pack unpack train compare; do
    check "$c-help" 0 "$FKVF" $c --help
    grep_in "$c-help-text" "usage: fkvf $c" "$T/out"
    check "$c-noarg" 2 "$FKVF" $c
    check "$c-badopt" 2 "$FKVF" $c --bogus x
done
check help-lists-pack 0 "$FKVF" --help
grep_in help-lists-pack "pack CACHE" "$T/out"
check pack-noout 2 "$FKVF" pack "$CACHE"
check pack-badk 2 "$FKVF" pack "$CACHE" -o "$T/x.fkvf" --k 100
# numbers: digits only (strtoull would take " -1" as 2^64-1, "+4" as 4)
check pack-seed-neg 2 "$FKVF" pack "$CACHE" -o "$T/x.fkvf" --seed " -1"
check pack-sinks-blankneg 2 "$FKVF" pack "$CACHE" -o "$T/x.fkvf" --sinks " -0"
check pack-k-plus 2 "$FKVF" pack "$CACHE" -o "$T/x.fkvf" --k "+16"
check pack-theta-blank 2 "$FKVF" pack "$CACHE" -o "$T/x.fkvf" --rope-theta " 10000"
check train-seed-neg 2 "$FKVF" train "$CACHE" -o "$T/x.fkvf" --seed " -1"
check compare-recent-neg 2 "$FKVF" compare "$CACHE" "$CACHE" --recent " -1"
check pack-badcodec 2 "$FKVF" pack "$CACHE" -o "$T/x.fkvf" --codec zip
check pack-both 2 "$FKVF" pack "$CACHE" -o "$T/x.fkvf" --train --codebooks "$T/cb.fkvf"
check pack-missing 2 "$FKVF" pack "$T/nonexistent.safetensors" -o "$T/x.fkvf"
check unpack-badext 2 "$FKVF" unpack "$T/x.fkvf" -o "$T/out.bin"
check unpack-baddtype 2 "$FKVF" unpack "$T/x.fkvf" -o "$T/out.npz" --dtype f8

# corrupt input caches: exit 1, message names the file
head -c 1000 "$CACHE" >"$T/trunc.safetensors"
check pack-truncated 1 "$FKVF" pack "$T/trunc.safetensors" -o "$T/x.fkvf"
grep_in pack-truncated-msg "trunc.safetensors" "$T/err"
printf 'not a cache at all, just some text that is long enough\n' >"$T/junk.safetensors"
check pack-junk 1 "$FKVF" pack "$T/junk.safetensors" -o "$T/x.fkvf"
check train-truncated 1 "$FKVF" train "$T/trunc.safetensors" -o "$T/x.fkvf"
check compare-truncated 1 "$FKVF" compare "$CACHE" "$T/trunc.safetensors"

# embedded codebooks (--train), default window 4 + 32
check pack-train 0 "$FKVF" pack "$CACHE" -o "$T/a.fkvf" --train $Q --deflate --model-id stories260K
grep_in pack-summary "256 positions (36 exact, 220 archived)" "$T/out"
grep_in pack-ratio "ratio vs fp16" "$T/out"
check verify-a 0 "$FKVF" verify "$T/a.fkvf"
check info-a 0 "$FKVF" info "$T/a.fkvf"
grep_in info-a-meta "pack.source" "$T/out"
roundtrip train-st "$T/a.fkvf" "$T/a.safetensors" 4 32
relmse_below train-st 0.5
grep_in tokens '"tokens_identical":true' "$T/out"
roundtrip train-npz "$T/a.fkvf" "$T/a.npz" 4 32
roundtrip train-npy "$T/a.fkvf" "$T/a.npy" 4 32
check unpack-f32 0 "$FKVF" unpack "$T/a.fkvf" -o "$T/a32.safetensors" --dtype f32
check compare-f32 0 "$FKVF" compare "$CACHE" "$T/a32.safetensors" --sinks 4 --recent 32
grep_in compare-f32 "36 of 36 bit-identical" "$T/out"

# other windows: none, and larger than the cache (all exact, no codebook)
check pack-nowindow 0 "$FKVF" pack "$CACHE" -o "$T/n.fkvf" $Q --sinks 0 --recent 0
roundtrip nowindow "$T/n.fkvf" "$T/n.safetensors" 0 0
relmse_below nowindow 0.5
check pack-allexact 0 "$FKVF" pack "$CACHE" -o "$T/x.fkvf" --sinks 100 --recent 1000
grep_in allexact "(256 exact, 0 archived)" "$T/out"
check verify-allexact 0 "$FKVF" verify "$T/x.fkvf"
check unpack-allexact 0 "$FKVF" unpack "$T/x.fkvf" -o "$T/x.safetensors"
check compare-allexact 0 "$FKVF" compare "$CACHE" "$T/x.safetensors" --sinks 256
grep_in compare-allexact "256 of 256 bit-identical" "$T/out"

# codec ngon, keys as-is, beam
check pack-ngon 0 "$FKVF" pack "$CACHE" -o "$T/g.fkvf" $Q --codec ngon
check verify-ngon 0 "$FKVF" verify "$T/g.fkvf"
check info-ngon 0 "$FKVF" info "$T/g.fkvf"
grep_in info-ngon "ngon" "$T/out"
roundtrip ngon "$T/g.fkvf" "$T/g.safetensors" 4 32
check pack-asis 0 "$FKVF" pack "$CACHE" -o "$T/s.fkvf" $Q --keys as-is --beam 4
check info-asis 0 "$FKVF" info "$T/s.fkvf"
grep_in info-asis "as cached" "$T/out"
roundtrip asis "$T/s.fkvf" "$T/s.safetensors" 4 32
relmse_below asis 0.5

# external codebook file: train -> pack --codebooks -> unpack with and without --codebooks
mkdir -p "$T/cb" "$T/other"
check train 0 "$FKVF" train "$CACHE" "$CACHE" -o "$T/cb/books.fkvf" $Q --iters 10
grep_in train-hash "content hash [0-9a-f]\{32\}" "$T/out"
hash=$(sed -n 's/^content hash \([0-9a-f]*\)$/\1/p' "$T/out")
check verify-cb 0 "$FKVF" verify "$T/cb/books.fkvf"
check pack-ext 0 "$FKVF" pack "$CACHE" -o "$T/cb/e.fkvf" --codebooks "$T/cb/books.fkvf"
check verify-ext 0 "$FKVF" verify "$T/cb/e.fkvf"
check info-ext 0 "$FKVF" info "$T/cb/e.fkvf"
# the codebook file next to it, found by hash and counted in the ratio
cbsize=$(wc -c <"$T/cb/books.fkvf" | tr -d ' ')
grep_in info-ext "with the codebook file ($cbsize bytes, content hash $hash), .*x without it" "$T/out"
roundtrip ext-hint "$T/cb/e.fkvf" "$T/e1.safetensors" 4 32
relmse_below ext-hint 0.5
cp "$T/cb/e.fkvf" "$T/other/e.fkvf"
check unpack-ext-missing 1 "$FKVF" unpack "$T/other/e.fkvf" -o "$T/e2.safetensors"
grep_in unpack-ext-missing-hash "$hash" "$T/err"
check unpack-ext-given 0 "$FKVF" unpack "$T/other/e.fkvf" -o "$T/e2.safetensors" --codebooks "$T/cb/books.fkvf"
check compare-ext 0 "$FKVF" compare "$T/e1.safetensors" "$T/e2.safetensors"
grep_in compare-ext-same "relative MSE 0 " "$T/out"
check train-other 0 "$FKVF" train "$CACHE" -o "$T/wrong.fkvf" $Q --iters 3 --seed 7
check unpack-ext-wrong 1 "$FKVF" unpack "$T/other/e.fkvf" -o "$T/e3.safetensors" --codebooks "$T/wrong.fkvf"
grep_in unpack-ext-wrong-hash "$hash" "$T/err"
check unpack-ext-notcb 1 "$FKVF" unpack "$T/other/e.fkvf" -o "$T/e3.safetensors" --codebooks "$T/a.fkvf"
grep_in unpack-ext-notcb-hash "$hash" "$T/err"
check pack-cb-notcb 1 "$FKVF" pack "$CACHE" -o "$T/x.fkvf" --codebooks "$T/a.fkvf"
check unpack-cbfile 1 "$FKVF" unpack "$T/cb/books.fkvf" -o "$T/x.safetensors"

# a codebook file remembers how its keys were trained: pack follows it
check train-asis 0 "$FKVF" train "$CACHE" -o "$T/cb/asis.fkvf" $Q --iters 3 --keys as-is
check pack-ext-asis 0 "$FKVF" pack "$CACHE" -o "$T/cb/ea.fkvf" --codebooks "$T/cb/asis.fkvf"
check info-ext-asis 0 "$FKVF" info "$T/cb/ea.fkvf"
grep_in info-ext-asis "archived as cached" "$T/out"
roundtrip ext-asis "$T/cb/ea.fkvf" "$T/ea.npz" 4 32
relmse_below ext-asis 0.5

# kvc2cache: a kvgen header whose array size 12*L*G*P*D wraps to 0 mod 2^64
# (L = 2^20, G = D = 2^21, P = 1) must not match a 76-byte file; bad options
KVC=$(dirname "$FKVF")/kvc2cache
if [ -x "$KVC" ]; then
    # "KVGENRAW", version 1, hs 64, L, G, D, P, f32 flag 1, padding; then 3 u32
    printf 'KVGENRAW\001\000\000\000\100\000\000\000\000\000\020\000\000\000\040\000\000\000\040\000\001\000\000\000\001\000\000\000' >"$T/wrap.kvc"
    head -c 40 /dev/zero >>"$T/wrap.kvc"
    check kvc-wrap 1 "$KVC" "$T/wrap.kvc" "$T/wrap.safetensors"
    grep_in kvc-wrap-msg "header sizes do not match" "$T/err"
    check kvc-baddtype 2 "$KVC" "$T/wrap.kvc" "$T/w.safetensors" --dtype f8
    check kvc-badpositions 2 "$KVC" "$T/wrap.kvc" "$T/w.safetensors" --positions -1
    # a valid file (L 1, G 2, D 2, P 3; K = i, K_pre = 100 + i, V = 200 + i
    # for the i-th element of each tensor): the first --positions 2 of keys
    # as cached, values and tokens, with where they came from
    check kvc-make 0 /usr/bin/python3 -c '
import struct, sys
L, G, D, P = 1, 2, 2, 3
h = b"KVGENRAW" + struct.pack("<7I", 1, 64, L, G, D, P, 1) + b"\0" * 4 + struct.pack("<f", 500000.0)
h += b"\0" * (64 - len(h))
body = struct.pack("<%dI" % (P + 1), 7, 8, 9, 10) + struct.pack("<%dI" % P, 0, 0, 0)
n = G * P * D
for base in (0, 100, 200):
    body += struct.pack("<%df" % n, *[base + i for i in range(n)])
open(sys.argv[1], "wb").write(h + body)
' "$T/ok.kvc"
    check kvc-ok 0 "$KVC" "$T/ok.kvc" "$T/kvc.safetensors" --dtype f32 --positions 2
    grep_in kvc-ok-line "kvc.safetensors: 1 layers x 2 heads x 2 positions x 2 dims, f32" "$T/out"
    check kvc-ok-content 0 /usr/bin/python3 -c '
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
data = b[8 + n:]
def t(name):
    e = h[name]
    s, f = e["data_offsets"]
    raw = data[s:f]
    fmt = {"F32": "f", "I64": "q", "I32": "i"}[e["dtype"]]
    return e["shape"], list(struct.unpack("<%d%s" % (len(raw) // struct.calcsize(fmt), fmt), raw))
assert t("layers.0.key") == ([2, 2, 2], [0, 1, 2, 3, 6, 7, 8, 9]), t("layers.0.key")
assert t("layers.0.value") == ([2, 2, 2], [200, 201, 202, 203, 206, 207, 208, 209]), t("layers.0.value")
assert t("tokens")[1] == [7, 8], t("tokens")
m = h["__metadata__"]
assert m["rope_theta"] == "500000" and m["keys"] == "after RoPE (as cached)", m
' "$T/kvc.safetensors"
fi

# NaN in the original (first f16 key element := 0x7e00): --json stays JSON
# (null, not nan), the text does not claim "relative MSE 0, SNR inf dB"
hl=$(od -A n -t u4 -N 4 "$CACHE" | tr -d ' ')
cp "$CACHE" "$T/nan.safetensors"
printf '\000\176' | dd of="$T/nan.safetensors" bs=1 seek=$((8 + hl)) conv=notrunc 2>/dev/null
check compare-nan-json 0 "$FKVF" compare "$T/nan.safetensors" "$CACHE" --json
grep_in compare-nan-json '"keys":{"rel_mse":null,"snr_db":null,"max_abs_err":null}' "$T/out"
if grep -qi 'nan' "$T/out"; then echo "FAIL compare-nan-json: nan in JSON"; cat "$T/out"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
check compare-nan-text 0 "$FKVF" compare "$T/nan.safetensors" "$CACHE"
grep_in compare-nan-text "keys    relative MSE nan  SNR nan dB" "$T/out"

# compare a cache with itself
check compare-same 0 "$FKVF" compare "$CACHE" "$CACHE"
grep_in compare-same "relative MSE 0 " "$T/out"

# mkst OUT JSON DATABYTES: a tiny safetensors file (u64 header length, JSON,
# zero data) without any tool but printf
mkst() {
    n=$(printf '%s' "$2" | wc -c)
    printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $((n % 256)) $((n / 256 % 256)) 0 0)" >"$1"
    printf '\000\000\000\000' >>"$1"
    printf '%s' "$2" >>"$1"
    head -c "$3" /dev/zero >>"$1"
}
# 1 layer, 1 head, 40 positions, key_dim 3, value_dim 2, f16
mkst "$T/odd.safetensors" '{"layers.0.key":{"dtype":"F16","shape":[1,40,3],"data_offsets":[0,240]},"layers.0.value":{"dtype":"F16","shape":[1,40,2],"data_offsets":[240,400]}}' 400
# odd key_dim without --rope-dims: the message does not name an option the
# user did not give
check pack-odd-keydim 2 "$FKVF" pack "$T/odd.safetensors" -o "$T/odd.fkvf" $Q
grep_in pack-odd-keydim-msg "key_dim 3 is odd" "$T/err"
check pack-odd-keydim-norope 0 "$FKVF" pack "$T/odd.safetensors" -o "$T/odd.fkvf" $Q --no-rope
# .npy needs key_dim = value_dim: refused before restoring, nothing written
check unpack-npy-dims 2 "$FKVF" unpack "$T/odd.fkvf" -o "$T/odd.npy"
grep_in unpack-npy-dims-msg "key_dim 3 and value_dim 2 must be equal" "$T/err"
if [ -e "$T/odd.npy" ]; then echo "FAIL unpack-npy-dims: output written"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
# a codebook file is checked even when nothing ends up archived (all exact)
printf 'not a codebook' >"$T/bad-cb.fkvf"
check pack-bad-cb-all-exact 1 "$FKVF" pack "$CACHE" -o "$T/allexact.fkvf" --codebooks "$T/bad-cb.fkvf" --sinks 4 --recent 100000
# a --codebooks FILE that does not exist is a path that does not exist (2),
# as for every command (an archive whose codebook is not found is 1, above)
check unpack-cb-missing 2 "$FKVF" unpack "$T/other/e.fkvf" -o "$T/e3.safetensors" --codebooks "$T/nonexistent-cb.fkvf"

finish cli_pack
