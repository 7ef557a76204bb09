#!/bin/sh
# ctest rehydrate_smoke: fkvf-rehydrate (issue 19 C.10) on stories260K, 2
# sequences of 80 positions, key-symbol codebooks of k = 16 on 2 sequences
# (pre-RoPE rules in chunks of 8 positions).
# Checks what holds by definition: with m = 128 no step has more than m
# archived positions, so every rule sees the full cache and its change is
# exactly +0.0% (the hooks leave the logits bit-identical); the window alone
# costs more than the oracle (the m positions each head weighs most) at
# m = 16; the table has every rule's row. Then the argument
# checks. Exit 77 (skipped) where the model is absent.
# usage: rehydrate_smoke.sh FKVF_REHYDRATE MODEL
a=$1
m=$2
if [ ! -f "$m" ]; then
    echo "rehydrate_smoke: $m not found, skipping"
    exit 77
fi
out=$("$a" --model "$m" --seqs 2 --tokens 80 --m 16 --m 128 --train 2 --k 16 --chunk 8 2>&1)
st=$?
echo "$out"
[ $st -eq 0 ] || { echo "rehydrate_smoke: exit status $st"; exit 1; }
echo "$out" | awk -F'|' '
    /^window only/ { split($0, f, ": "); w = f[2] + 0 }
    /^\| / && !/^\| rule/ && !/---/ {
        name = $2; gsub(/^ +| +$/, "", name); n++
        d16[name] = $3 + 0
        c = $4; gsub(/^ +| +$/, "", c)
        if (c != "+0.0% (+0.000 +- 0.000)") { print name ": m = 128 is not the full cache: " c; bad = 1 }
    }
    END {
        if (n != 11) { print "expected 11 rules, got " n; bad = 1 }
        o = d16["oracle top-m a head"]
        if (!(w > o)) { print "the window alone (" w ") is not worse than the oracle (" o ")"; bad = 1 }
        exit bad
    }' || { echo "rehydrate_smoke: an invariant fails"; exit 1; }
fails=0
"$a" --model "$m" --rule bogus >/dev/null 2>&1
[ $? -eq 2 ] || { echo "rehydrate_smoke: --rule bogus not refused"; fails=1; }
"$a" --model "$m" --rule keysym --train 0 >/dev/null 2>&1
[ $? -eq 2 ] || { echo "rehydrate_smoke: a key-symbol rule without codebooks not refused"; fails=1; }
"$a" --model "$m" --eval-bytes 0:10 >/dev/null 2>&1
[ $? -eq 2 ] || { echo "rehydrate_smoke: --eval-bytes without --text not refused"; fails=1; }
"$a" --model "$m" --tokens 100000 >/dev/null 2>&1
[ $? -eq 2 ] || { echo "rehydrate_smoke: --tokens beyond the model not refused"; fails=1; }
[ $fails -eq 0 ] || exit 1
echo "rehydrate_smoke: OK"
