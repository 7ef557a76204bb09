#!/bin/sh
# ctest attention_smoke: fkvf-attention (issue 19 C.8, C.9) on stories260K, 2
# sequences of 128 positions, m = 8 and 16, key-symbol codebooks of k = 16
# trained on 2 sequences (pre-RoPE rules in chunks of 8 positions). Checks
# what holds by definition:
# every mass is in [0, 1]; the mass on all archived positions bounds every
# rule; the oracle of a head (the best m positions for that head) bounds every
# rule of m positions (the shared oracle, most recent, random, key norm, heavy
# hitters, the four key-symbol rules); suffix matches and their successors
# pick at most m; the key-symbol rules score at least the k = 16 centroids
# and at most 16 x 12 centroids (at most 92 archived positions: 12 chunks)
# plus 4 m keys. Then the argument checks. Exit 77 (skipped) where the model
# is absent.
# usage: attention_smoke.sh FKVF_ATTENTION MODEL
a=$1
m=$2
if [ ! -f "$m" ]; then
    echo "attention_smoke: $m not found, skipping"
    exit 77
fi
out=$("$a" --model "$m" --seqs 2 --tokens 128 --m 8 --m 16 --train 2 --k 16 --chunk 8 2>&1)
st=$?
echo "$out"
[ $st -eq 0 ] || { echo "attention_smoke: exit status $st"; exit 1; }
echo "$out" | awk -F'|' '
    /^\| / && !/^\| rule/ && !/---/ && NF >= 4 && !bylayer && !cost {
        name = $2; gsub(/^ +| +$/, "", name)
        for (i = 3; i <= 4; i++) {
            split($i, f, /[()]/); v = f[1] + 0; n = f[2] + 0
            mass[name, i] = v; cnt[name, i] = n
            if (v < 0 || v > 1.000001) { print "mass out of range: " name " " v; bad = 1 }
        }
        names[++k] = name
    }
    /^Cost/ { cost = 1 }
    cost && /^\| key symbols/ {
        name = $2; gsub(/^ +| +$/, "", name)
        for (i = 3; i <= 4; i++) {
            mm = (i == 3) ? 8 : 16; v = $i + 0
            if (v < 16 || v > 16 * 12 + 4 * mm) { print "cost out of range: " name " " v; bad = 1 }
        }
        ncost++
    }
    /^By layer/ { bylayer = 1; cost = 0 }
    END {
        if (k != 13) { print "expected 13 rules, got " k; bad = 1 }
        if (ncost != 4) { print "expected the cost of 4 key-symbol rules, got " ncost; bad = 1 }
        for (i = 3; i <= 4; i++) {
            mm = (i == 3) ? 8 : 16
            for (j = 1; j <= k; j++) {
                nm = names[j]
                if (mass[nm, i] > mass["all archived", i] + 1e-9) { print nm " above all archived"; bad = 1 }
                if (nm != "all archived" && nm != "oracle top-m a head" && mass[nm, i] > mass["oracle top-m a head", i] + 1e-9) {
                    print nm " above the oracle of a head (m = " mm ")"; bad = 1
                }
                if (nm != "all archived" && cnt[nm, i] > mm + 1e-9) { print nm " picked more than m"; bad = 1 }
            }
        }
        exit bad
    }' || { echo "attention_smoke: an invariant fails"; exit 1; }
fails=0
"$a" --model "$m" --eval-bytes 0:10 >/dev/null 2>&1
[ $? -eq 2 ] || { echo "attention_smoke: --eval-bytes without --text not refused"; fails=1; }
"$a" --model "$m" --tokens 100000 >/dev/null 2>&1
[ $? -eq 2 ] || { echo "attention_smoke: --tokens beyond the model not refused"; fails=1; }
"$a" --model "$m" --m 0 >/dev/null 2>&1
[ $? -eq 2 ] || { echo "attention_smoke: --m 0 not refused"; fails=1; }
"$a" --model "$m" --k 100 >/dev/null 2>&1
[ $? -eq 2 ] || { echo "attention_smoke: --k 100 (not a power of two) not refused"; fails=1; }
"$a" --model "$m" --train-bytes 0:10 >/dev/null 2>&1
[ $? -eq 2 ] || { echo "attention_smoke: --train-bytes without --text not refused"; fails=1; }
[ $fails -eq 0 ] || exit 1
echo "attention_smoke: OK"
