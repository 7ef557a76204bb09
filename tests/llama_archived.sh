#!/bin/sh
# Archived (codebook-quantized) llama.cpp states against the real llama.cpp
# (tests/llama/driver.mjs, node-llama-cpp 3.21.1; f16 cache, flash off,
# context 256): codebooks trained (fkvf train on llama.cpp state files) on
# the caches of six prompts of 200 tokens; then for four other prompts of
# 180 tokens: llama.cpp saves; fkvf import-llama --codebooks (the defaults:
# 4 sinks and the 32 most recent positions exact, the 144 others archived);
# export-llama; a fresh llama.cpp process loads the export and is fed a
# continuation of 60 tokens, whose mean NLL (the 59 after the first) is
# compared with the same continuation's after the exact state. A table per
# model and configuration (sinks + recent exact); each difference must be
# within its bound:
#  - shakespeare-hd64 (head dim 64), 4 + 32: 0.004 nats. Measured: -0.0014
#    to +0.0004, mean |d| 0.0006 (archived rows zeroed in a throwaway build
#    gave up to 0.0125: caught);
#  - shakespeare-hd64, 4 + 2 (the model README's small window, where
#    attention reads archived rows hard): 0.03 nats. Measured: -0.011 to
#    +0.001, mean |d| 0.0049; and the negative control: a coarse codebook
#    (k 16, one key and one value stage) must move the NLL at least twice as
#    much (measured mean |d| 0.021, 4.2 times), else the test could not tell
#    a worse archive from a good one. The differences have both signs: on
#    this small model, noise in old positions can help a continuation;
#  - stories260K (head dim 8), 4 + 32: 1.0 nats. Measured: +0.22 to +0.65, mean
#    +0.49, as expected: docs/quality.md measures K x4 V x2 pre-RoPE on this
#    model at +0.40 +- 0.01 nats (64 sequences), and these codebooks see only
#    1,200 positions (K x8 V x4 on them still costs +0.10 to +0.50).
#  - stories260K: prompts and continuations are fixed samples of the model
#    (tests/llama/stories-samples.txt: train1-6 for the codebooks, eval1-4);
#  - shakespeare-hd64: text, a token per byte (3 + byte, BOS first): the
#    codebooks from the first 90% of shakespeare.txt (the model's training
#    text), the prompts from the last 10% (text it never saw).
# usage: llama_archived.sh FKVF SRCDIR
F=$1 SRC=$2
SUITE=llama_archived
. "$SRC/tests/cli_lib.sh"
. "$SRC/tests/llama/lib.sh"
need_model stories260K.gguf
need_model shakespeare-hd64.gguf
# |archived NLL - exact NLL| per prompt, nats (MEASURED above)
bound_of() { # bound_of MODEL CONFIG
    case $1:$2 in
    stories260K:*) echo 1.0 ;;
    shakespeare-hd64:default) echo 0.004 ;;
    shakespeare-hd64:recent2) echo 0.03 ;;
    esac
}
COARSE_FACTOR=2
for m in stories260K shakespeare-hd64; do
    M=$MODELS/$m.gguf

    o="--model $M --kv f16 --flash 0"
    train=""
    for i in 1 2 3 4 5 6; do
        P=$(model_ids $m train$i $((i * 150000 - 140000)) 199)
        # shellcheck disable=SC2086
        job $m-train$i.save save $o --prompt "$P" --state "$T/$m-train$i.state"
        train="$train $T/$m-train$i.state"
    done
    for i in 1 2 3 4; do
        ALL=$(model_ids $m eval$i $((1003854 + (i - 1) * 25000)) 239)
        ids_range "$ALL" 181 240 >"$T/$m-eval$i.cont"
        # shellcheck disable=SC2086
        job $m-eval$i.save save $o --prompt "$(ids_range "$ALL" 1 180)" --state "$T/$m-eval$i.state"
    done
    jobs_run
    cb=$T/$m.cb
    # shellcheck disable=SC2086
    check "$m: fkvf train on 6 llama.cpp states" 0 "$F" train $train --model "$M" -o "$cb"
    # the negative control: a coarse codebook (k 16, one stage each), which
    # must cost clearly more than the good one where archived rows are read
    # hard (2 recent exact): a test that could not tell it from the good
    # one could not tell a broken archive either
    # shellcheck disable=SC2086
    check "$m: fkvf train, coarse" 0 "$F" train $train --model "$M" -o "$cb.coarse" --k 16 \
        --k-stages 1 --v-stages 1
    # configurations: NAME:SINKS:RECENT:CODEBOOK
    if [ $m = stories260K ]; then
        CONFS="default:4:32:$cb"
    else
        CONFS="default:4:32:$cb recent2:4:2:$cb coarse2:4:2:$cb.coarse"
    fi
    for conf in $CONFS; do
        cn=${conf%%:*} rest=${conf#*:}
        si=${rest%%:*} rest=${rest#*:}
        re=${rest%%:*} cbf=${rest#*:}
        for i in 1 2 3 4; do
            s=$T/$m-eval$i
            check "$m eval$i $cn: import-llama --codebooks" 0 \
                "$F" import-llama "$s.state" --model "$M" --codebooks "$cbf" --sinks "$si" \
                --recent "$re" -o "$s.$cn.fkvf" --json
            want=$((180 - si - re))
            counts_are "$m eval$i $cn" 180 "$want"
            check "$m eval$i $cn: export-llama" 0 "$F" export-llama "$s.$cn.fkvf" -o "$s.$cn.archived" --codebooks "$cbf"
            cmp -s "$s.state" "$s.$cn.archived" && bad "$m eval$i $cn: the archived export is the exact state"
            # shellcheck disable=SC2086
            job $m-eval$i.$cn.arch nll $o --state "$s.$cn.archived" --tokens "$(cat "$s.cont")"
        done
    done
    for i in 1 2 3 4; do
        s=$T/$m-eval$i
        # shellcheck disable=SC2086
        job $m-eval$i.exact nll $o --state "$s.state" --tokens "$(cat "$s.cont")"
    done
    jobs_run
    for conf in $CONFS; do
        cn=${conf%%:*} rest=${conf#*:}
        si=${rest%%:*} rest=${rest#*:}
        re=${rest%%:*}
        echo "$m $cn: continuation NLL (nats/token) after 180 tokens, exact state vs archived"
        echo "  ($si sinks + $re recent exact, $((180 - si - re)) archived; codebooks from 6 other prompts: $(basename "${conf##*:}"))"
        printf '  %-6s %6s %10s %10s %10s\n' prompt tokens exact archived diff
        sum=0
        for i in 1 2 3 4; do
            s=$T/$m-eval$i
            e=$(json_num "$s.exact" mean_nll)
            a=$(json_num "$s.$cn.arch" mean_nll)
            k=$(json_num "$s.$cn.arch" scored)
            sum=$(awk -v s="$sum" -v e="$e" -v a="$a" 'BEGIN { d = a - e; printf "%.9f", s + (d < 0 ? -d : d) }')
            awk -v p="eval$i" -v k="$k" -v e="$e" -v a="$a" \
                'BEGIN { printf "  %-6s %6s %10.5f %10.5f %+10.5f\n", p, k, e, a, a - e }'
            case $cn in coarse*) continue ;; esac
            if awk -v e="$e" -v a="$a" -v b="$(bound_of $m $cn)" 'BEGIN { d = a - e; exit !(e > 0 && a > 0 && (d < 0 ? -d : d) < b) }'; then
                ok
            else
                bad "$m eval$i $cn: archived NLL '$a' vs exact '$e': not within $(bound_of $m $cn)"
            fi
        done
        echo "  mean absolute difference $(awk -v s="$sum" 'BEGIN { printf "%.5f", s / 4 }')"
        eval "mean_$cn=$sum"
    done
    if [ $m = shakespeare-hd64 ]; then
        # the coarse codebook moves the NLL at least COARSE_FACTOR times as
        # much as the good one (mean absolute differences)
        # shellcheck disable=SC2154
        if awk -v g="$mean_recent2" -v c="$mean_coarse2" -v f="$COARSE_FACTOR" 'BEGIN { exit !(c > f * g) }'; then
            ok
        else
            bad "$m: the coarse codebook's NLL differences (sum of |d| $mean_coarse2) are not $COARSE_FACTOR times the good one's ($mean_recent2): the test cannot tell a worse archive"
        fi
    fi
done
finish "$SUITE"
