#!/bin/sh
# ctest quality_smoke: fkvf-quality on 2 sequences of 64 positions (the exact
# cache, RVQ k=256 K x4 V x2 pre-RoPE with the appender check, KIVI-2), and
# the exact cache's NLL of sequence 0 against fkvf-engine --force of the same
# ids. Exit 77 (skipped) where the model is absent.
# usage: quality_smoke.sh FKVF_QUALITY FKVF_ENGINE MODEL
q=$1
e=$2
m=$3
if [ ! -f "$m" ]; then
    echo "quality_smoke: $m not found, skipping"
    exit 77
fi
out=$("$q" --model "$m" --set smoke --seqs 2 --tokens 64 --train 8 --print-ids 2>&1)
st=$?
echo "$out"
if [ $st -ne 0 ]; then
    echo "quality_smoke: fkvf-quality exit status $st"
    exit 1
fi
ids=$(echo "$out" | sed -n 's/^ids: //p')
want=$(echo "$out" | sed -n 's/^exact mean-nll sequence 0: \([0-9.]*\) .*/\1/p')
got=$("$e" --model "$m" --force "$ids" --quiet | sed -n 's/^mean-nll: \([0-9.]*\) .*/\1/p')
if [ -z "$want" ] || [ "$want" != "$got" ]; then
    echo "quality_smoke: exact-cache mean NLL '$want' but fkvf-engine --force gives '$got'"
    exit 1
fi
echo "$out" | grep -q "identical bit for bit" || { echo "quality_smoke: no appender check"; exit 1; }
for row in "exact cache" "K x4 V x2, keys pre-RoPE" "KIVI-2"; do
    echo "$out" | grep -q "^| $row\|^| .*$row" || { echo "quality_smoke: no row '$row'"; exit 1; }
done
echo "quality_smoke: OK (exact mean NLL $want = fkvf-engine's)"
