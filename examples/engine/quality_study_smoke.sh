#!/bin/sh
# ctest quality_study_smoke: quality_study.sh --smoke (issue 19 A.2) on both
# shared models at the three windows, and its part B on shakespeare-hd64 at 4 + 2 (per-layer stage
# counts, plain / metric / metric with beam 8): every run ends with a table holding the
# exact row and KIVI-2 (at 4 + 2 and 4 + 8 KIVI's key groups of 32 complete
# after positions leave the window: fkvf-quality stops on a row read before it
# is computed, the bug this guards against) and the appender check; the
# codebooks are trained by the first window's run and loaded by the others.
# Exit 77 (skipped) where the models are absent.
# usage: quality_study_smoke.sh FKVF_QUALITY MODEL_DIR STUDY_SCRIPT
q=$1
d=$2
s=$3
for m in stories260K.bin shakespeare-hd64.bin shakespeare.txt; do
    if [ ! -f "$d/$m" ]; then
        echo "quality_study_smoke: $d/$m not found, skipping"
        exit 77
    fi
done
o=$(mktemp -d) || exit 1
trap 'rm -rf "$o"' EXIT
sh "$s" "$q" "$d" "$o" --smoke --part a || exit 1
sh "$s" "$q" "$d" "$o" --smoke --part b --windows 2 --models shakespeare-hd64 || exit 1
fails=0
for m in stories260K shakespeare-hd64; do
    for w in 2 8 32; do
        f=$o/$m-w$w.md
        grep -q "exact window: 4 sinks + $w recent" "$f" || { echo "$f: no window $w"; fails=1; }
        for row in "exact cache" "RVQ per-head k=256 K x4 V x2, keys pre-RoPE" "KIVI-2"; do
            grep -q "^| $row" "$f" || { echo "$f: no row '$row'"; fails=1; }
        done
        grep -q "identical bit for bit" "$f" || { echo "$f: no appender check"; fails=1; }
        [ "$w" = 2 ] && [ "$m" = shakespeare-hd64 ] || continue
        # part B: the per-layer rows, plain, metric and metric with beam 8
        for b in 1 2 3; do
            grep -q "^| RVQ per-head k=256.* per-layer .*layer 0 from the token table" "$o/$m-w$w-b$b.md" ||
                { echo "$m-w$w-b$b.md: no per-layer row"; fails=1; }
        done
        grep -q "beam 8" "$o/$m-w$w-b3.md" || { echo "$m-w$w-b3.md: no beam row"; fails=1; }
        if [ "$w" = 2 ]; then
            grep -q "trained in" "$o/$m-w$w.log" || { echo "$m: codebook not trained"; fails=1; }
        else
            grep -q "loaded" "$o/$m-w$w.log" || { echo "$m w$w: codebook not reused"; fails=1; }
        fi
    done
done
[ $fails -eq 0 ] || { cat "$o"/*.md; exit 1; }
echo "quality_study_smoke: OK"
