#!/bin/sh
# What resuming from a quantized archive costs in next-token loss.
# For S seeded sampled sequences (temperature 1): an uninterrupted run of P + M
# tokens; a run of P tokens saved with --save (4 sinks + 32 recent exact, the
# rest RVQ-archived with a codebook trained by fkvf train on
# testdata/train-cache.safetensors, another sequence); --resume and teacher-force
# the uninterrupted run's next M tokens. Reported: the mean NLL of those M x S
# tokens with the exact cache (the uninterrupted run) and after each resume, and
# the perplexity delta. Only the P restored positions carry reconstruction
# error: the M new positions are computed exactly by the engine.
# METRIC_DIR (a directory with key-metric.npy and value-metric.npy, e.g. from
# fkvf-quality --metric-out): also a pre-RoPE codebook trained under that
# encoder metric (fkvf train --key-metric --value-metric, format 1.2); the
# engine's appender encodes under it. Its delta against the plain pre-RoPE
# codebook is also given paired by sequence, with its standard error.
# usage: [TRAIN_CACHES="a.safetensors b.safetensors ..."] [METRIC_DIR=DIR] \
#        resume_quality.sh FKVF_ENGINE FKVF SRCDIR [S P M] [K...]
#        (defaults S=16 P=256 M=128; K: codebook sizes, default 64 256;
#        training caches default testdata/train-cache.safetensors; evaluation
#        sequences use sampling seeds 100..100+S-1)
E=$1 F=$2 SRC=$3
S=${4:-16} P=${5:-256} M=${6:-128}
if [ $# -ge 6 ]; then shift 6; else shift $#; fi
KS=${*:-"64 256"}
MODEL=$SRC/../shared/models/stories260K.bin
[ -f "$MODEL" ] || { echo "resume_quality: $MODEL not found"; exit 77; }
TRAIN=${TRAIN_CACHES:-$SRC/testdata/train-cache.safetensors}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
VARIANTS="pre-rope as-is"
for k in $KS; do
    for keys in pre-rope as-is; do
        # shellcheck disable=SC2086
        "$F" train $TRAIN -o "$T/cb-$k-$keys.fkvf" --k "$k" \
            --keys "$keys" >/dev/null || exit 1
    done
    if [ -n "${METRIC_DIR:-}" ]; then
        # shellcheck disable=SC2086
        "$F" train $TRAIN -o "$T/cb-$k-metric.fkvf" --k "$k" --keys pre-rope \
            --key-metric "$METRIC_DIR/key-metric.npy" \
            --value-metric "$METRIC_DIR/value-metric.npy" >/dev/null || exit 1
    fi
done
[ -n "${METRIC_DIR:-}" ] && VARIANTS="pre-rope as-is metric"
nll_col() { grep '^step ' "$1" | sed 's/.*nll=\([0-9.]*\).*/\1/'; }
: >"$T/exact"
s=0
while [ $s -lt "$S" ]; do
    seed=$((100 + s))
    "$E" --model "$MODEL" --generate $((P + M)) --temperature 1 --seed $seed >"$T/full" || exit 1
    nll_col "$T/full" | tail -n "$M" >>"$T/exact"
    grep '^step ' "$T/full" | tail -n "$M" | sed 's/.*id=\([0-9]*\).*/\1/' | paste -sd, - >"$T/force"
    for k in $KS; do
        for keys in $VARIANTS; do
            a=$T/q.fkvf
            rm -f "$a"
            "$E" --model "$MODEL" --generate "$P" --temperature 1 --seed $seed --save "$a" \
                --codebooks "$T/cb-$k-$keys.fkvf" --commit-every 64 --sync none --quiet \
                >/dev/null || exit 1
            "$E" --model "$MODEL" --resume "$a" --force "$(cat "$T/force")" --sync none \
                >"$T/res" || exit 1
            nll_col "$T/res" >>"$T/q-$k-$keys"
        done
    done
    s=$((s + 1))
done
mean() { awk '{s += $1} END {printf "%.4f", s / NR}' "$1"; }
ex=$(mean "$T/exact")
echo "resume_quality: codebooks trained on: $TRAIN"
echo "resume_quality: $S sequences, $P positions saved ($((P + 1 - 36)) archived), $M forced tokens each"
printf '%-28s %9s %11s %9s\n' "cache" "mean NLL" "perplexity" "delta"
awk -v m="$ex" 'BEGIN {printf "%-28s %9.4f %11.3f %9s\n", "exact", m, exp(m), "-"}'
for k in $KS; do
    for keys in $VARIANTS; do
        q=$(mean "$T/q-$k-$keys")
        n="k=$k K4 V2 keys $keys"
        [ "$keys" = metric ] && n="k=$k K4 V2 pre-rope, metric"
        awk -v m="$q" -v e="$ex" -v n="$n" \
            'BEGIN {printf "%-28s %9.4f %11.3f %+8.2f%%\n", n, m, exp(m), (exp(m - e) - 1) * 100}'
    done
    if [ -n "${METRIC_DIR:-}" ]; then
        # metric minus plain pre-RoPE: per sequence the mean NLL difference of
        # its M tokens, then the mean and standard error over the S sequences
        paste "$T/q-$k-metric" "$T/q-$k-pre-rope" | awk -v m="$M" -v k="$k" '
            { d[int((NR - 1) / m)] += ($1 - $2) / m }
            END { n = 0; s = 0; for (i in d) { n++; s += d[i] }; mu = s / n; v = 0
                  for (i in d) v += (d[i] - mu) ^ 2
                  se = n > 1 ? sqrt(v / (n - 1) / n) : 0
                  printf "k=%s metric - plain pre-rope: dNLL %+.4f +- %.4f (paired, %d sequences)\n", k, mu, se, n }'
    fi
done
