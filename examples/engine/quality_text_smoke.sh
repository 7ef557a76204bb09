#!/bin/sh
# ctest quality_text_smoke: fkvf-quality on a head-dim-64 model with real
# text (issue 19 A.1): 2 sequences of 64 bytes of shakespeare.txt's last
# tenth, codebooks trained on 8 sequences of its first nine tenths; the
# exact cache, RVQ k=256 K x4 V x2 pre-RoPE (with the appender check: an
# archive written and restored gives the study's rows bit for bit) and
# KIVI-2; a query- and output-aware codebook row, also through the
# library's encoder metric (--metric-native), and the metrics written for
# fkvf train (--metric-out); per-layer stage counts (--alloc). Then the argument checks: a range without --text, a range too
# short, a malformed range. Exit 77 (skipped) where the model is absent.
# usage: quality_text_smoke.sh FKVF_QUALITY MODEL_DIR
q=$1
d=$2
m=$d/shakespeare-hd64.bin
t=$d/shakespeare.txt
if [ ! -f "$m" ] || [ ! -f "$t" ]; then
    echo "quality_text_smoke: $m or $t not found, skipping"
    exit 77
fi
out=$("$q" --model "$m" --text "$t" --set smoke --seqs 2 --tokens 64 --train 8 2>&1)
st=$?
echo "$out"
[ $st -eq 0 ] || { echo "quality_text_smoke: exit status $st"; exit 1; }
echo "$out" | grep -q "head dim 64" || { echo "quality_text_smoke: not head dim 64"; exit 1; }
echo "$out" | grep -q "^--text .*range \[1003855, 1115394)" ||
    { echo "quality_text_smoke: not the last tenth"; exit 1; }
echo "$out" | grep -q "identical bit for bit" || { echo "quality_text_smoke: no appender check"; exit 1; }
for row in "exact cache" "K x4 V x2, keys pre-RoPE" "KIVI-2"; do
    echo "$out" | grep -q "^| $row\|^| .*$row" || { echo "quality_text_smoke: no row '$row'"; exit 1; }
done
# a byte-level model on its own held-out text: well below the ~5.5 nats of a
# uniform guess over 256 bytes (the README's validation loss is 1.52)
nll=$(echo "$out" | sed -n 's/^| exact cache | [^|]* | [^|]* | \([0-9.]*\) |.*/\1/p')
awk -v n="$nll" 'BEGIN { exit !(n > 0.3 && n < 2.5) }' ||
    { echo "quality_text_smoke: exact mean NLL '$nll' out of range"; exit 1; }
# the metric codebooks (issue 19 B): query- and output-aware K x4 V x2 runs and
# stays near the exact cache (tiny training: a loose bound)
row="query- and output-aware: RVQ per-head k=256 K x4 V x2, keys pre-RoPE"
mo=$("$q" --model "$m" --text "$t" --set metric --seqs 1 --tokens 32 --train 8 --iters 3 --only exact \
    --only "$row" 2>&1)
st=$?
echo "$mo" | grep "^| "
[ $st -eq 0 ] || { echo "$mo"; echo "quality_text_smoke: the metric run failed ($st)"; exit 1; }
mn=$(echo "$mo" | grep -F "| $row |" | cut -d'|' -f5 | tr -d ' ')
me=$(echo "$mo" | grep -F "| exact cache |" | cut -d'|' -f5 | tr -d ' ')
awk -v n="$mn" -v e="$me" 'BEGIN { exit !(n > 0.3 && e > 0.3 && n < e + 0.5) }' ||
    { echo "quality_text_smoke: metric row mean NLL '$mn' (exact '$me')"; exit 1; }
# the same row through the library's own encoder metric (--metric-native:
# fkvf_rvq_params.metric, format 1.2) instead of the study's transformed rows
mo=$("$q" --model "$m" --text "$t" --set metric --seqs 1 --tokens 32 --train 8 --iters 3 --only exact \
    --only "$row" --metric-native 2>&1)
st=$?
echo "$mo" | grep "^| "
[ $st -eq 0 ] || { echo "$mo"; echo "quality_text_smoke: the native metric run failed ($st)"; exit 1; }
echo "$mo" | grep -q "the library's encoder metric" || { echo "quality_text_smoke: not native"; exit 1; }
mn=$(echo "$mo" | grep -F "| $row |" | cut -d'|' -f5 | tr -d ' ')
awk -v n="$mn" -v e="$me" 'BEGIN { exit !(n > 0.3 && n < e + 0.5) }' ||
    { echo "quality_text_smoke: native metric row mean NLL '$mn' (exact '$me')"; exit 1; }
# --metric-out: the metrics as float32 .npy of [4, 2, 64, 64] (fkvf train's)
md=$(mktemp -d)
"$q" --model "$m" --text "$t" --tokens 32 --train 8 --metric-out "$md" >/dev/null 2>&1 ||
    { rm -rf "$md"; echo "quality_text_smoke: --metric-out failed"; exit 1; }
for part in key value; do
    f=$md/$part-metric.npy
    n=$(wc -c <"$f" 2>/dev/null || echo 0)
    hdr=$(head -c 128 "$f" 2>/dev/null | tr -d '\000' | tr -c '[:print:]' '.')
    case $hdr in *"'descr': '<f4', 'fortran_order': False, 'shape': (4, 2, 64, 64)"*) ;;
    *) rm -rf "$md"; echo "quality_text_smoke: $part-metric.npy header '$hdr'"; exit 1 ;; esac
    [ "$n" -eq $((128 + 4 * 2 * 64 * 64 * 4)) ] ||
        { rm -rf "$md"; echo "quality_text_smoke: $part-metric.npy is $n bytes"; exit 1; }
done
rm -rf "$md"
# per-layer stage counts (issue 19 B.5, B.6): --alloc 48 (24 stage units of 2
# bytes) prints the per-layer costs and two rows within the budget, the second
# with no stage for layer 0 (the token table)
ao=$("$q" --model "$m" --text "$t" --set exact --seqs 1 --tokens 32 --train 8 --iters 3 --alloc 48 \
    --alloc-cal 1 --no-verify 2>&1)
st=$?
echo "$ao" | grep "^| "
[ $st -eq 0 ] || { echo "$ao"; echo "quality_text_smoke: --alloc failed ($st)"; exit 1; }
echo "$ao" | grep -q "^| 3 | V |" || { echo "quality_text_smoke: no per-layer costs"; exit 1; }
[ "$(echo "$ao" | grep -c "^| RVQ per-head k=256 per-layer .* | 48.0 | 42.67x |")" -eq 2 ] ||
    { echo "quality_text_smoke: --alloc rows not at 48 bytes"; exit 1; }
echo "$ao" | grep -q "^| RVQ per-head k=256 per-layer K x0,[0-9,]* V x0,.*layer 0 from the token" ||
    { echo "quality_text_smoke: layer 0 takes stages with the token table"; exit 1; }
"$q" --model "$m" --text "$t" --set exact --seqs 1 --tokens 32 --train 8 --iters 3 --alloc 8 \
    --alloc-cal 1 >/dev/null 2>&1
[ $? -eq 2 ] || { echo "quality_text_smoke: a budget under a stage a part not refused"; exit 1; }
fails=0
"$q" --model "$m" --eval-bytes 0:100 --set exact >/dev/null 2>&1
[ $? -eq 2 ] || { echo "quality_text_smoke: --eval-bytes without --text not refused"; fails=1; }
err=$("$q" --model "$m" --text "$t" --eval-bytes 0:100 --set exact --seqs 2 --tokens 64 2>&1 >/dev/null)
st=$?
[ $st -eq 2 ] && echo "$err" | grep -q "holds 1 sequences of 63 bytes; 2 needed" ||
    { echo "quality_text_smoke: a 100-byte range for 2 sequences not refused ($st: $err)"; fails=1; }
"$q" --model "$m" --text "$t" --train-bytes 5:3 --set exact >/dev/null 2>&1
[ $? -eq 2 ] || { echo "quality_text_smoke: a malformed range not refused"; fails=1; }
[ $fails -eq 0 ] || exit 1
echo "quality_text_smoke: OK (exact mean NLL $nll on held-out text)"
