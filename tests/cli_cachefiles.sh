#!/bin/sh
# Reading the user's cache files right (issue 12, items 4-7), on twins of
# the bundled sample cache made by tests/cachefiles.py (Python standard
# library only, independent of tools/cacheio*.c): positions-first layouts
# (--layout), the Hugging Face RoPE pair-layout default and the RoPE check
# (--check-rope), companions and unknown tensor names, unpack --hf/--names
# with token ids, shapes and safetensors __metadata__ through an archive.
# usage: cli_cachefiles.sh FKVF_BIN SRCDIR   (exit 77: skipped, no python3)
set -u
FKVF=$1
SRC=$2
CACHE=$SRC/testdata/sample-cache.safetensors
TRAIN=$SRC/testdata/train-cache.safetensors
PY=/usr/bin/python3
if ! [ -x "$PY" ]; then
    echo "cli_cachefiles: SKIP: $PY is missing (scripts/install-deps.sh installs python3)"
    exit 77
fi
. "$(dirname "$0")/cli_lib.sh"
GEN() { "$PY" "$SRC/tests/cachefiles.py" "$@"; }
Q="--k 16 --k-stages 2 --v-stages 1"
no_grep() { # no_grep NAME PATTERN FILE
    if grep -q -- "$2" "$3"; then echo "FAIL $1: '$2' in $3:"; cat "$3"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
}
# same NAME FILE1 FILE2: byte-identical
same() {
    if cmp -s "$2" "$3"; then pass=$((pass + 1)); else echo "FAIL $1: $2 and $3 differ"; fails=$((fails + 1)); fi
}
# keys_snr FILE: the keys SNR of a compare --json output
keys_snr() { sed -n 's/.*"keys":{[^}]*"snr_db":\([^,}]*\).*/\1/p' "$1"; }

# ---- item 4: heads-first and positions-first --------------------------------
GEN convert "$CACHE" "$T/hnd.safetensors"
GEN convert "$CACHE" "$T/nhd.safetensors" --nhd
GEN convert "$CACHE" "$T/nhd.npz" --nhd --batch
GEN convert "$CACHE" "$T/hnd.npy" --no-tokens
GEN convert "$CACHE" "$T/nhd.npy" --nhd --no-tokens
GEN convert "$CACHE" "$T/nhd-nt.safetensors" --nhd --no-tokens
GEN convert "$CACHE" "$T/short.safetensors" --positions 2
grep_in gen-nhd '"layers.0.key": {"dtype": "F16", "shape": \[256, 4, 8\]}' "$(GEN header "$T/nhd.safetensors" >"$T/h" && echo "$T/h")"

check pack-hnd 0 "$FKVF" pack "$T/hnd.safetensors" -o "$T/hnd.fkvf" $Q
no_grep pack-hnd-nowarn "layout" "$T/err"
check pack-nhd 0 "$FKVF" pack "$T/nhd.safetensors" --layout nhd -o "$T/nhd.fkvf" $Q
grep_in pack-nhd-positions "256 positions (36 exact, 220 archived)" "$T/out"
no_grep pack-nhd-nowarn "warning" "$T/err"
# the same archive contents: every restored position and the token ids
check unpack-hnd 0 "$FKVF" unpack "$T/hnd.fkvf" -o "$T/r-hnd.safetensors"
check unpack-nhd-as-hnd 0 "$FKVF" unpack "$T/nhd.fkvf" --layout hnd -o "$T/r-nhd.safetensors"
same nhd-same-contents "$T/r-hnd.safetensors" "$T/r-nhd.safetensors"
check pack-nhd-npz 0 "$FKVF" pack "$T/nhd.npz" --layout nhd -o "$T/nhdz.fkvf" $Q
check unpack-nhd-npz 0 "$FKVF" unpack "$T/nhdz.fkvf" --layout hnd -o "$T/r-nhdz.safetensors"
same nhd-npz-same-contents "$T/r-hnd.safetensors" "$T/r-nhdz.safetensors"
check pack-hnd-npy 0 "$FKVF" pack "$T/hnd.npy" -o "$T/hndy.fkvf" $Q
check pack-nhd-npy 0 "$FKVF" pack "$T/nhd.npy" --layout nhd -o "$T/nhdy.fkvf" $Q
check unpack-hnd-npy 0 "$FKVF" unpack "$T/hndy.fkvf" -o "$T/r-hndy.npy"
check unpack-nhd-npy 0 "$FKVF" unpack "$T/nhdy.fkvf" --layout hnd -o "$T/r-nhdy.npy"
same nhd-npy-same-contents "$T/r-hndy.npy" "$T/r-nhdy.npy"
# unpack writes positions-first back, as packed; compare reads both layouts
check unpack-nhd-default 0 "$FKVF" unpack "$T/nhd.fkvf" -o "$T/r-nhd2.safetensors"
grep_in unpack-nhd-note "positions-first tensors \[T, H, D\], as packed" "$T/err"
GEN header "$T/r-nhd2.safetensors" >"$T/h"
grep_in unpack-nhd-shape '"layers.4.value": {"dtype": "F16", "shape": \[256, 4, 8\]}' "$T/h"
check compare-nhd 0 "$FKVF" compare "$T/nhd.safetensors" "$T/r-nhd2.safetensors" --layout nhd --sinks 4 --recent 32 --json
grep_in compare-nhd-exact '"exact_positions":36,"exact_identical":36,' "$T/out"
grep_in compare-nhd-tokens '"tokens_identical":true' "$T/out"
check compare-mixed 0 "$FKVF" compare "$T/nhd.safetensors" "$T/r-hnd.safetensors" --layout nhd,hnd --sinks 4 --recent 32 --json
grep_in compare-mixed-exact '"exact_positions":36,"exact_identical":36,' "$T/out"
check compare-badlayout 2 "$FKVF" compare "$T/nhd.safetensors" "$T/r-hnd.safetensors" --layout nhd,xyz
# without --layout: a warning naming the option (no token ids), or a refusal
# that asks (token ids give the transposition away)
check pack-nhd-nolayout 0 "$FKVF" pack "$T/nhd-nt.safetensors" -o "$T/x.fkvf" --force $Q
grep_in pack-nhd-warn "read heads-first as 256 KV heads x 4 positions" "$T/err"
grep_in pack-nhd-warn-option "pass --layout nhd" "$T/err"
grep_in pack-nhd-warn-64 "more KV heads than models have" "$T/err"
check pack-nhd-tokens-nolayout 1 "$FKVF" pack "$T/nhd.safetensors" -o "$T/x.fkvf" --force $Q
grep_in pack-nhd-tokens-hint "256 token ids for 4 positions (are the key/value tensors positions-first" "$T/err"
check pack-nhd-hnd 0 "$FKVF" pack "$T/nhd-nt.safetensors" --layout hnd -o "$T/x.fkvf" --force $Q
no_grep pack-nhd-hnd-quiet "warning" "$T/err"
# a short heads-first cache (4 heads, 2 positions) is real: warned, packed
check pack-short 0 "$FKVF" pack "$T/short.safetensors" -o "$T/x.fkvf" --force $Q
grep_in pack-short-warn "4 KV heads x 2 positions; if" "$T/err"
no_grep pack-short-warn-64 "than models have" "$T/err"
check pack-badlayout 2 "$FKVF" pack "$T/hnd.safetensors" -o "$T/x.fkvf" --force --layout thd
# train and append read positions-first too
check train-hnd 0 "$FKVF" train "$T/hnd.safetensors" -o "$T/cb-hnd.fkvf" $Q
check train-nhd 0 "$FKVF" train "$T/nhd.safetensors" --layout nhd -o "$T/cb-nhd.fkvf" $Q
same train-nhd-same "$T/cb-hnd.fkvf" "$T/cb-nhd.fkvf"
check append-nhd 0 "$FKVF" append --create "$T/live.fkvf" "$T/nhd.safetensors" --layout nhd --codebooks "$T/cb-hnd.fkvf"
grep_in append-nhd-positions "appended 256 positions" "$T/out"
check unpack-live 0 "$FKVF" unpack "$T/live.fkvf" -o "$T/r-live.safetensors"
check compare-live 0 "$FKVF" compare "$T/hnd.safetensors" "$T/r-live.safetensors" --sinks 4 --recent 32 --json
grep_in compare-live-exact '"exact_positions":36,"exact_identical":36,' "$T/out"

# ---- item 5: RoPE pair layout of Hugging Face caches, the RoPE check -------
GEN convert "$CACHE" "$T/hf-il.safetensors" --names hf --batch            # HF names, adjacent pairs rotated
GEN convert "$CACHE" "$T/hf-hs.safetensors" --names hf --batch --rerotate # HF names, rotate_half
GEN convert "$CACHE" "$T/fk-hs.safetensors" --rerotate
GEN convert "$CACHE" "$T/dyn-hs.npz" --names hf-dynamic --batch --rerotate
GEN convert "$CACHE" "$T/leg-hs.safetensors" --names hf-legacy --rerotate
GEN convert "$CACHE" "$T/nr.safetensors" --unrotate
GEN convert "$TRAIN" "$T/train-hf-hs.safetensors" --names hf --batch --rerotate
check pack-hf-hs 0 "$FKVF" pack "$T/hf-hs.safetensors" -o "$T/hf-hs.fkvf" $Q
grep_in pack-hf-hs-note "Hugging Face tensor names (hf): RoPE pairs taken as half-split" "$T/err"
no_grep pack-hf-hs-right "look wrong" "$T/err"
check info-hf-hs 0 "$FKVF" info "$T/hf-hs.fkvf" --json
grep_in info-hf-hs-layout '"layout":"half-split"' "$T/out"
check pack-dyn-hs 0 "$FKVF" pack "$T/dyn-hs.npz" -o "$T/x.fkvf" --force $Q
grep_in pack-dyn-hs-note "Hugging Face tensor names (hf-dynamic)" "$T/err"
no_grep pack-dyn-hs-right "look wrong" "$T/err"
check pack-leg-hs 0 "$FKVF" pack "$T/leg-hs.safetensors" -o "$T/x.fkvf" --force $Q
grep_in pack-leg-hs-note "Hugging Face tensor names (hf-legacy)" "$T/err"
# FKVF names keep the interleaved default: a half-split cache is warned about
check pack-fk-hs 0 "$FKVF" pack "$T/fk-hs.safetensors" -o "$T/x.fkvf" --force $Q
no_grep pack-fk-hs-nonote "Hugging Face" "$T/err"
grep_in pack-fk-hs-warn "the RoPE settings look wrong" "$T/err"
grep_in pack-fk-hs-try "try --rope-layout half-split" "$T/err"
# HF names on adjacent-pair keys (a llama.cpp-style cache): the default is warned about
check pack-hf-il 0 "$FKVF" pack "$T/hf-il.safetensors" -o "$T/x.fkvf" --force $Q
grep_in pack-hf-il-try "try --rope-layout interleaved" "$T/err"
check pack-hf-il-given 0 "$FKVF" pack "$T/hf-il.safetensors" -o "$T/x.fkvf" --force $Q --rope-layout interleaved
no_grep pack-hf-il-given-nonote "Hugging Face tensor names" "$T/err"
no_grep pack-hf-il-given-right "look wrong" "$T/err"
# a codebook file's train.* settings win over the default
check pack-hf-cb 0 "$FKVF" pack "$T/hf-il.safetensors" -o "$T/hf-cb.fkvf" --codebooks "$T/cb-hnd.fkvf"
no_grep pack-hf-cb-nonote "Hugging Face tensor names" "$T/err"
check info-hf-cb 0 "$FKVF" info "$T/hf-cb.fkvf" --json
grep_in info-hf-cb-layout '"layout":"interleaved"' "$T/out"
# train (every cache HF-named) and append --create take the default too
check train-hf 0 "$FKVF" train "$T/train-hf-hs.safetensors" -o "$T/cb-hf.fkvf" $Q
grep_in train-hf-note "RoPE pairs taken as half-split" "$T/err"
check info-cb-hf 0 "$FKVF" info "$T/cb-hf.fkvf"
grep_in info-cb-hf-layout "train.rope_layout = half-split" "$T/out"
check append-hf 0 "$FKVF" append --create "$T/live-hf.fkvf" "$T/hf-hs.safetensors" $Q
grep_in append-hf-note "RoPE pairs taken as half-split" "$T/err"
no_grep append-hf-right "look wrong" "$T/err"
# what the default is for: keys of the half-split twin, codebooks trained on
# the half-split twin of the training cache, come back better than with
# the interleaved layout forced
check train-hf-il 0 "$FKVF" train "$T/train-hf-hs.safetensors" -o "$T/cb-hf-il.fkvf" $Q --rope-layout interleaved
for cb in hf hf-il; do
    check pack-snr-$cb 0 "$FKVF" pack "$T/hf-hs.safetensors" -o "$T/snr-$cb.fkvf" --codebooks "$T/cb-$cb.fkvf"
    cp "$T/err" "$T/snr-$cb.err"
    check unpack-snr-$cb 0 "$FKVF" unpack "$T/snr-$cb.fkvf" -o "$T/snr-$cb.safetensors"
    check compare-snr-$cb 0 "$FKVF" compare "$T/hf-hs.safetensors" "$T/snr-$cb.safetensors" --sinks 4 --recent 32 --json
    keys_snr "$T/out" >"$T/snr-$cb"
done
# a codebook trained interleaved, keys rotated half-split: the warning says
# to train another codebook (an option alone would not fit this one), and an
# option that contradicts the training is refused (it was taken and made
# keys worse: 9.6 -> 3.8 dB in a user's trial)
grep_in pack-snr-hf-il-warn "they are those .*cb-hf-il.fkvf was trained with: train a codebook with --rope-layout half-split" "$T/snr-hf-il.err"
check pack-cb-clash 1 "$FKVF" pack "$T/hf-hs.safetensors" -o "$T/clash.fkvf" --codebooks "$T/cb-hf-il.fkvf" --rope-layout half-split
grep_in pack-cb-clash-msg "cb-hf-il.fkvf: trained with --rope-layout interleaved, and --rope-layout half-split was given" "$T/err"
[ ! -e "$T/clash.fkvf" ] && pass=$((pass + 1)) || { echo "FAIL pack-cb-clash-file: written"; fails=$((fails + 1)); }
check pack-cb-agree 0 "$FKVF" pack "$T/hf-hs.safetensors" -o "$T/agree.fkvf" --codebooks "$T/cb-hf-il.fkvf" --rope-layout interleaved
check pack-cb-clash-keys 1 "$FKVF" pack "$T/hf-hs.safetensors" -o "$T/clash.fkvf" --codebooks "$T/cb-hf-il.fkvf" --keys as-is
grep_in pack-cb-clash-keys-msg "trained with --keys pre-rope, and --keys as-is was given" "$T/err"
check append-cb-clash 1 "$FKVF" append --create "$T/clash.fkvf" "$T/hf-hs.safetensors" --codebooks "$T/cb-hf-il.fkvf" --rope-theta 500000
grep_in append-cb-clash-msg "trained with --rope-theta 10000, and --rope-theta 500000 was given" "$T/err"
if awk -v a="$(cat "$T/snr-hf")" -v b="$(cat "$T/snr-hf-il")" 'BEGIN { exit !(a > b + 1) }'; then
    pass=$((pass + 1))
else
    echo "FAIL hf-default-snr: keys SNR $(cat "$T/snr-hf") dB (half-split) not 1 dB above $(cat "$T/snr-hf-il") dB (interleaved)"
    fails=$((fails + 1))
fi
# --check-rope: the table, exit 1 when the settings look wrong
check check-rope-right 0 "$FKVF" pack "$CACHE" --check-rope
grep_in check-rope-right-table "0.8746 .* interleaved pairs, theta 10000  <- chosen, lowest" "$T/out"
grep_in check-rope-right-verdict "verdict: the chosen settings look right" "$T/out"
check check-rope-hf 0 "$FKVF" pack "$T/hf-hs.safetensors" --check-rope
check check-rope-wrong 1 "$FKVF" pack "$T/fk-hs.safetensors" --check-rope
grep_in check-rope-wrong-verdict "look wrong; try --rope-layout half-split" "$T/out"
check check-rope-wrong-o 1 "$FKVF" pack "$T/fk-hs.safetensors" --check-rope -o "$T/cr.fkvf" --force
grep_in check-rope-wrong-o-msg "not written" "$T/err"
# --no-rope wins over --keys pre-rope: the advice drops it (following
# "try --keys pre-rope ..." with --no-rope still given changes nothing)
check check-rope-norope 1 "$FKVF" pack "$CACHE" --check-rope --no-rope
grep_in check-rope-norope-advice "look wrong; try dropping --no-rope, with --rope-layout interleaved --rope-theta 10000\$" "$T/out"
check check-rope-asis 1 "$FKVF" pack "$CACHE" --check-rope --keys as-is
grep_in check-rope-asis-advice "look wrong; try --keys pre-rope --rope-layout interleaved --rope-theta 10000\$" "$T/out"
# --check-rope --json without -o: one JSON object
check check-rope-json 0 "$FKVF" pack "$CACHE" --check-rope --json
cp "$T/out" "$T/cr.json"
check check-rope-json-obj 0 /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["verdict"]=="right" and any(c["chosen"] and c["lowest"] for c in d["candidates"]), d' "$T/cr.json"
if [ -e "$T/cr.fkvf" ]; then echo "FAIL check-rope-wrong-o: cr.fkvf written"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
check check-rope-ok-o 0 "$FKVF" pack "$T/fk-hs.safetensors" --check-rope --rope-layout half-split -o "$T/cr.fkvf" --force $Q
grep_in check-rope-ok-o-packed "256 positions (36 exact, 220 archived)" "$T/out"
check check-rope-norope 1 "$FKVF" pack "$T/nr.safetensors" --check-rope
grep_in check-rope-norope-try "try --no-rope" "$T/out"
check pack-norope 0 "$FKVF" pack "$T/nr.safetensors" --no-rope -o "$T/x.fkvf" --force $Q
no_grep pack-norope-quiet "look wrong" "$T/err"
check check-rope-short 0 "$FKVF" pack "$T/short.safetensors" --check-rope
grep_in check-rope-short-verdict "cannot tell (fewer than 16 positions)" "$T/out"

# ---- item 6: companions and unknown names -----------------------------------
GEN convert "$CACHE" "$T/hf-extra.safetensors" --names hf --batch --extra attention_mask --extra position_ids --extra cache_position --extra lm_head.bias
GEN convert "$CACHE" "$T/odd.safetensors" --names odd
GEN convert "$CACHE" "$T/hf-extra.npz" --names hf --batch --extra attention_mask
check pack-companions 0 "$FKVF" pack "$T/hf-extra.safetensors" -o "$T/x.fkvf" --force $Q --rope-layout interleaved
grep_in companion-mask "ignored tensor 'attention_mask' (a companion of a Hugging Face cache" "$T/err"
grep_in companion-pos "ignored tensor 'position_ids' (a companion" "$T/err"
grep_in companion-cpos "ignored tensor 'cache_position' (a companion" "$T/err"
grep_in extra-unknown "ignored tensor 'lm_head.bias' (not a cache tensor name" "$T/err"
check pack-companions-npz 0 "$FKVF" pack "$T/hf-extra.npz" -o "$T/x.fkvf" --force $Q --rope-layout interleaved
grep_in companion-npz "ignored tensor 'attention_mask' (a companion" "$T/err"
check pack-odd 1 "$FKVF" pack "$T/odd.safetensors" -o "$T/x.fkvf" --force $Q
grep_in odd-msg "odd.safetensors: no key/value tensors" "$T/err"
grep_in odd-schemes "layers.{i}.key/.value (FKVF), past_key_values.{i}.key/.value, past_key_values.{i}.0/.1 or key_cache.{i}/value_cache.{i}" "$T/err"
grep_in odd-found "the file holds 'k0', 'v0', 'k1', 'v1' and 7 more" "$T/err"

# ---- item 7: unpack: token ids, Hugging Face names and shapes, metadata ----
check unpack-npy-tokens 0 "$FKVF" unpack "$T/hnd.fkvf" -o "$T/r.npy"
grep_in unpack-npy-tokens-warn "the archive's 256 token ids are not written (a .npy file holds one array" "$T/err"
check unpack-npy-notokens 0 "$FKVF" unpack "$T/hndy.fkvf" -o "$T/r2.npy"
no_grep unpack-npy-notokens-quiet "token ids" "$T/err"
# a HF cache, bf16, 2 KV heads, with __metadata__, input_ids and a companion
GEN convert "$CACHE" "$T/hfb.safetensors" --names hf --batch --heads 2 --dtype bf16 \
    --meta format=pt --meta 'note=a "quoted" caf'"$(printf '\303\251')" --meta empty= --extra attention_mask
check pack-hfb 0 "$FKVF" pack "$T/hfb.safetensors" -o "$T/hfb.fkvf" $Q --rope-layout interleaved
check info-hfb 0 "$FKVF" info "$T/hfb.fkvf"
grep_in info-hfb-names "pack.names = hf" "$T/out"
grep_in info-hfb-layout "pack.layout = hnd" "$T/out"
grep_in info-hfb-meta "safetensors.format = pt" "$T/out"
check unpack-hfb 0 "$FKVF" unpack "$T/hfb.fkvf" -o "$T/hfb-out.safetensors"
grep_in unpack-hfb-note "Hugging Face names and shapes (past_key_values.{i}.key \[1, H, T, D\], input_ids), as packed" "$T/err"
# with --layout nhd the note names the positions-first shape it writes
check unpack-hfb-nhd 0 "$FKVF" unpack "$T/hfb.fkvf" -o "$T/hfb-nhd.safetensors" --layout nhd
grep_in unpack-hfb-nhd-note "past_key_values.{i}.key \[1, T, H, D\], input_ids), as packed (--names fkvf for layers.{i}.key \[T, H, D\])" "$T/err"
GEN header "$T/hfb.safetensors" >"$T/h-in"
GEN header "$T/hfb-out.safetensors" >"$T/h-out"
# the same names, shapes, dtypes and __metadata__ (the companion aside)
check hfb-header 0 "$PY" -c 'import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
a.pop("attention_mask")
assert a == b, (a, b)
assert b["past_key_values.4.value"] == {"dtype": "BF16", "shape": [1, 2, 256, 8]}, b
assert b["input_ids"] == {"dtype": "I64", "shape": [1, 256]}, b
assert b["__metadata__"]["note"] == "a \"quoted\" caf\u00e9" and b["__metadata__"]["empty"] == "", b' "$T/h-in" "$T/h-out"
GEN tokens "$T/hfb.safetensors" input_ids >"$T/t-in"
GEN tokens "$T/hfb-out.safetensors" input_ids >"$T/t-out"
same hfb-input-ids "$T/t-in" "$T/t-out"
check compare-hfb 0 "$FKVF" compare "$T/hfb.safetensors" "$T/hfb-out.safetensors" --sinks 4 --recent 32 --json
grep_in compare-hfb-exact '"exact_positions":36,"exact_identical":36,' "$T/out"
grep_in compare-hfb-tokens '"tokens_identical":true' "$T/out"
# --names fkvf overrides what was packed; --hf gives any archive HF names
check unpack-hfb-fkvf 0 "$FKVF" unpack "$T/hfb.fkvf" --names fkvf -o "$T/hfb-f.safetensors"
no_grep unpack-hfb-fkvf-nonote "as packed" "$T/err"
GEN header "$T/hfb-f.safetensors" >"$T/h"
grep_in unpack-hfb-fkvf-names '"layers.0.key": {"dtype": "BF16", "shape": \[2, 256, 8\]}' "$T/h"
grep_in unpack-hfb-fkvf-tokens '"tokens": {"dtype": "I64", "shape": \[256\]}' "$T/h"
grep_in unpack-hfb-fkvf-meta '"format": "pt"' "$T/h"
check unpack-hf-flag 0 "$FKVF" unpack "$T/hnd.fkvf" --hf -o "$T/h.safetensors"
GEN header "$T/h.safetensors" >"$T/h"
grep_in unpack-hf-flag-names '"past_key_values.0.key": {"dtype": "F16", "shape": \[1, 4, 256, 8\]}' "$T/h"
grep_in unpack-hf-flag-ids '"input_ids": {"dtype": "I64", "shape": \[1, 256\]}' "$T/h"
check unpack-hf-npy 0 "$FKVF" unpack "$T/hndy.fkvf" --hf -o "$T/h.npy"
grep_in unpack-hf-npy-shape "'shape': (5, 2, 1, 4, 256, 8)" "$T/h.npy"
check unpack-hfb-npz 0 "$FKVF" unpack "$T/hfb.fkvf" -o "$T/hfb.npz"
grep_in unpack-hfb-npz-meta "the archive's 3 safetensors __metadata__ entries are not written" "$T/err"
check unpack-badnames 2 "$FKVF" unpack "$T/hfb.fkvf" --names torch -o "$T/x.safetensors" --force
check unpack-nolayout 2 "$FKVF" unpack "$T/hfb.fkvf" -o "$T/x.safetensors" --force --layout
# the bundled sample's own __metadata__ survives pack + unpack
check pack-sample 0 "$FKVF" pack "$CACHE" -o "$T/s.fkvf" $Q
check unpack-sample 0 "$FKVF" unpack "$T/s.fkvf" -o "$T/s.safetensors"
GEN header "$CACHE" >"$T/h-in"
GEN header "$T/s.safetensors" >"$T/h-out"
same sample-header "$T/h-in" "$T/h-out"

# help texts document the new options
check pack-help 0 "$FKVF" pack --help
grep_in pack-help-layout "--layout hnd|nhd" "$T/out"
grep_in pack-help-check "--check-rope" "$T/out"
check unpack-help 0 "$FKVF" unpack --help
grep_in unpack-help-names "--names fkvf|hf" "$T/out"
grep_in unpack-help-hf "--hf" "$T/out"
grep_in unpack-help-layout "--layout hnd|nhd" "$T/out"
for c in train compare append; do
    check $c-help 0 "$FKVF" $c --help
    grep_in $c-help-layout "--layout" "$T/out"
done

echo "cli_cachefiles: keys SNR of the half-split twin $(cat "$T/snr-hf") dB with the HF default, $(cat "$T/snr-hf-il") dB with interleaved forced"
finish cli_cachefiles
