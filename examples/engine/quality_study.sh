#!/bin/sh
# The quality study of issue 19 A.2 (docs/quality.md, "Head dim 64"): fkvf-quality
# on both shared models at three exact windows (4 sinks + 32, 8 and 2 recent),
# every configuration (--set full), one codebook cache per model so that each
# codebook is trained once and reused by the three windows. Writes one
# Markdown table a run: OUT/<model>-w<recent>.md (stdout of fkvf-quality) and
# .log (its stderr: training and per-row times).
#
# Part B (issue 19 B, --part b): at the budget of uniform K x4 V x2 (stories260K
# 120 bytes, shakespeare-hd64 48), the query- and output-aware rows (--set
# metric) and per-layer stage counts (--alloc): plain, with the metric
# codebook, and with it and beam 8: OUT/<model>-w<recent>-b{1,2,3}.md.
#
# usage: quality_study.sh FKVF_QUALITY MODEL_DIR OUT [--smoke] [--models "a b"]
#                         [--windows "2 8 32"] [--part a|b|ab]
#   --smoke    tiny sizes (2 sequences of 64 positions, part B 32; 8 training
#              sequences, 3 Lloyd iterations, --set smoke, one calibration
#              sequence): checks the pipeline, measures nothing
#   --models   which of stories260K shakespeare-hd64 (default both)
#   --windows  recent window sizes (default "2 8 32")
# Full sizes: stories260K 32 sampled sequences of 512 positions, codebooks
# from 64 (k = 4096: 128) other sampled sequences; shakespeare-hd64 96
# sequences of 255 bytes of shakespeare.txt's last tenth, codebooks from 256
# (k = 4096: 512) sequences of its first nine tenths. Run it under nice: part A
# took about 70 minutes for stories260K and several hours for shakespeare-hd64
# (its k = 4096 codebook and rows) on the 2-core development machine.
set -u
q=$1
d=$2
out=$3
shift 3
smoke=0
models="stories260K shakespeare-hd64"
windows="2 8 32"
part=ab
while [ $# -gt 0 ]; do
    case $1 in
    --smoke) smoke=1 ;;
    --models) models=$2; shift ;;
    --windows) windows=$2; shift ;;
    --part) part=$2; shift ;;
    *) echo "quality_study: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$out" || exit 1
# run OUT_BASE ARGS...: one fkvf-quality run of $model into OUT_BASE.md / .log
run() {
    o=$1
    shift
    "$q" --model "$d/$model.bin" "$@" --cache-dir "$out/cb-$model" >"$o.md" 2>"$o.log" ||
        { echo "quality_study: failed, see $o.log"; tail -5 "$o.log"; exit 1; }
}
for model in $models; do
    case $model in
    stories260K) args="--seqs 32 --tokens 512 --train 64 --train4096 128"; budget=120 ;;
    shakespeare-hd64)
        args="--text $d/shakespeare.txt --seqs 96 --tokens 256 --train 256 --train4096 512"
        budget=48 ;;
    *) echo "quality_study: unknown model $model" >&2; exit 2 ;;
    esac
    if [ ! -f "$d/$model.bin" ]; then
        echo "quality_study: $d/$model.bin not found"
        exit 77
    fi
    set="--set full"
    metric="--set metric"
    cal=16
    if [ $smoke -eq 1 ]; then
        args=$(echo "$args" | sed 's/--seqs [0-9]*/--seqs 2/; s/--tokens [0-9]*/--tokens 64/;
                                   s/--train [0-9]*/--train 8/; s/--train4096 [0-9]*/--train4096 8/')
        args="$args --iters 3"
        set="--set smoke"
        metric="--set exact"
        cal=1
    fi
    for w in $windows; do
        f=$out/$model-w$w
        case $part in *a*)
            echo "quality_study: $model, 4 sinks + $w recent -> $f.md"
            # shellcheck disable=SC2086 # args and set are word lists
            run "$f" $args $set --recent "$w" ;;
        esac
        case $part in *b*)
            echo "quality_study: $model, 4 sinks + $w recent, part B -> $f-b{1,2,3}.md"
            bargs=$args
            [ $smoke -eq 0 ] || bargs=$(echo "$args" | sed 's/--tokens [0-9]*/--tokens 32/')
            # shellcheck disable=SC2086
            run "$f-b1" $bargs $metric --recent "$w" --alloc $budget --alloc-cal $cal --no-verify
            # shellcheck disable=SC2086
            run "$f-b2" $bargs --set exact --recent "$w" --alloc $budget --alloc-cal $cal \
                --alloc-metric
            # shellcheck disable=SC2086
            run "$f-b3" $bargs --set exact --recent "$w" --alloc $budget --alloc-cal $cal \
                --alloc-metric --alloc-beam 8 ;;
        esac
    done
done
echo "quality_study: done"
