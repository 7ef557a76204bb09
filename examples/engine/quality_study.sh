#!/bin/sh
# The quality study of issue 19 A.2 (docs/quality.md, "Head dim 64"): fkvf-quality
# on both shared models at three exact windows (4 sinks + 32, 8 and 2 recent),
# every configuration (--set full), one codebook cache per model so that each
# codebook is trained once and reused by the three windows. Writes one
# Markdown table a run: OUT/<model>-w<recent>.md (stdout of fkvf-quality) and
# .log (its stderr: training and per-row times).
#
# usage: quality_study.sh FKVF_QUALITY MODEL_DIR OUT [--smoke] [--models "a b"]
#                         [--windows "2 8 32"]
#   --smoke    tiny sizes (2 sequences of 64 positions, 8 training
#              sequences, --set smoke): checks the pipeline, measures nothing
#   --models   which of stories260K shakespeare-hd64 (default both)
#   --windows  recent window sizes (default "2 8 32")
# Full sizes: stories260K 32 sampled sequences of 512 positions, codebooks
# from 64 (k = 4096: 128) other sampled sequences; shakespeare-hd64 96
# sequences of 255 bytes of shakespeare.txt's last tenth, codebooks from 256
# (k = 4096: 512) sequences of its first nine tenths. Run it under nice: it
# takes about an hour a model on one core of the development machine.
set -u
q=$1
d=$2
out=$3
shift 3
smoke=0
models="stories260K shakespeare-hd64"
windows="2 8 32"
while [ $# -gt 0 ]; do
    case $1 in
    --smoke) smoke=1 ;;
    --models) models=$2; shift ;;
    --windows) windows=$2; shift ;;
    *) echo "quality_study: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$out" || exit 1
for model in $models; do
    case $model in
    stories260K) args="--seqs 32 --tokens 512 --train 64 --train4096 128" ;;
    shakespeare-hd64)
        args="--text $d/shakespeare.txt --seqs 96 --tokens 256 --train 256 --train4096 512" ;;
    *) echo "quality_study: unknown model $model" >&2; exit 2 ;;
    esac
    if [ ! -f "$d/$model.bin" ]; then
        echo "quality_study: $d/$model.bin not found"
        exit 77
    fi
    set="--set full"
    if [ $smoke -eq 1 ]; then
        args=$(echo "$args" | sed 's/--seqs [0-9]*/--seqs 2/; s/--tokens [0-9]*/--tokens 64/;
                                   s/--train [0-9]*/--train 8/; s/--train4096 [0-9]*/--train4096 8/')
        set="--set smoke"
    fi
    for w in $windows; do
        f=$out/$model-w$w
        echo "quality_study: $model, 4 sinks + $w recent -> $f.md"
        # shellcheck disable=SC2086 # args and set are word lists
        "$q" --model "$d/$model.bin" $args $set --recent "$w" --cache-dir "$out/cb-$model" \
            >"$f.md" 2>"$f.log" || { echo "quality_study: failed, see $f.log"; tail -5 "$f.log"; exit 1; }
    done
done
echo "quality_study: done"
