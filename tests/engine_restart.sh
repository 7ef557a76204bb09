#!/bin/sh
# Restart tests of examples/engine/fkvf-engine on the real model
# (../shared/models/stories260K.bin; skipped with exit 77 when it is absent):
#  (a) lossless archive (exact-only): save N, stop, resume M: the ids and the
#      logits (a digest of their bits, per step) equal an uninterrupted N+M run;
#      prefix reuse with a diverging prompt equals a fresh run of that prompt;
#  (b) SIGKILL mid-generation (a commit every token): the archive's token
#      stream is a prefix of the uninterrupted run, no printed (committed)
#      token is lost, and the continuation equals the uninterrupted run;
#  (c) quantized archive (codebook from fkvf train on the bundled training
#      cache): resume works; the continuation's mean NLL on the uninterrupted
#      run's tokens is reported next to the exact cache's.
# usage: engine_restart.sh FKVF_ENGINE FKVF SRCDIR
E=$1 F=$2 SRC=$3
MODEL=$SRC/../shared/models/stories260K.bin
if [ ! -f "$MODEL" ]; then
    echo "engine_restart: $MODEL not found, skipping"
    exit 77
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
pass=0
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
run() { # run OUT ARGS...: the engine, stdout to $T/OUT
    out=$1
    shift
    if ! "$E" --model "$MODEL" "$@" >"$T/$out" 2>"$T/$out.err"; then
        bad "fkvf-engine $* (exit $?)"
        cat "$T/$out.err"
    fi
}
steps() { grep '^step ' "$T/$1"; }           # the per-step lines (pos, id, nll, digest)
ids_of() { grep '^ids:' "$T/$1" | cut -c6-; } # the generated ids
same() { # same NAME FILE1 FILE2
    if cmp -s "$2" "$3"; then ok; else bad "$1: differs"; diff "$2" "$3" | head -5; fi
}

# ---- the model README check: 64 greedy ids, mean NLL of 65 picks 0.8781 ----
run readme --generate 65 --quiet
README_IDS="461 461 401 401 401 461 378 455 473 456 435 299 362 409 283 264 283 452 288 13 \
431 431 431 431 431 431 431 431 431 431 431 431 431 293 430 417 363 416 315 342 418 424 400 442 \
402 303 266 299 374 466 396 303 271 362 390 469 306 469 423 314 347 305 356 333"
got_ids=$(ids_of readme | cut -d' ' -f1-64)
[ "$got_ids" = "$README_IDS" ] && ok || bad "README ids: $got_ids"
grep -q '^mean-nll: 0.8781[0-9]* over 65 tokens' "$T/readme" && ok ||
    bad "README NLL: $(grep '^mean-nll' "$T/readme")"

# ---- (a) lossless save / stop / resume --------------------------------------
for mode in "greedy:--temperature 0" "sampled:--temperature 1 --seed 5"; do
    name=${mode%%:*}
    opts=${mode#*:}
    N=60 M=40
    # shellcheck disable=SC2086
    run full.$name --generate $((N + M)) $opts
    for K in 1 7; do
        a=$T/a-$name-$K.fkvf
        # shellcheck disable=SC2086
        run save.$name.$K --generate $N $opts --save "$a" --exact-only --commit-every $K
        # shellcheck disable=SC2086
        run resume.$name.$K --generate $M $opts --resume "$a"
        steps full.$name | tail -n $M >"$T/want"
        steps resume.$name.$K >"$T/got"
        same "(a) $name K=$K: resumed steps (ids, NLL, logits digest)" "$T/want" "$T/got"
        steps full.$name | head -n $N >"$T/want"
        steps save.$name.$K >"$T/got"
        same "(a) $name K=$K: saved steps" "$T/want" "$T/got"
        grep_n=$(grep -c '^step ' "$T/resume.$name.$K")
        [ "$grep_n" -eq "$M" ] && ok || bad "(a) $name K=$K: $grep_n steps, want $M"
        grep -q "reused $N, recomputed 1" "$T/resume.$name.$K" && ok ||
            bad "(a) $name K=$K: not a full reuse: $(grep '^resume:' "$T/resume.$name.$K")"
        "$F" verify "$a" >/dev/null 2>&1 && ok || bad "(a) $name K=$K: fkvf verify $a"
    done
done
echo "(a) checked: lossless resume, greedy and sampled, commits of 1 and 7: steps bit-identical"

# prefix reuse with a diverging prompt: 30 archived tokens + 3 new ones; a new
# archive (--save) is written from the reused rows
P=$(grep '^archive-tokens:' "$T/resume.sampled.1" | cut -d' ' -f2-31 | tr ' ' ,),7,8,9
run fresh --prompt "$P" --generate 20 --temperature 1 --seed 9
run reuse --prompt "$P" --generate 20 --temperature 1 --seed 9 \
    --resume "$T/a-sampled-1.fkvf" --save "$T/new.fkvf" --exact-only
steps fresh >"$T/want"
steps reuse >"$T/got"
same "(a) diverging prompt: steps after reusing 30 positions" "$T/want" "$T/got"
grep -q "prefix_len 30, reused 30, recomputed 3" "$T/reuse" && ok ||
    bad "(a) diverging prompt: $(grep '^resume:' "$T/reuse")"
grep -q "new.fkvf: 53 positions" "$T/reuse" && ok || bad "(a) new archive: $(grep '^archive:' "$T/reuse")"
echo "(a) checked: prefix reuse (30 of 33 prompt tokens) equals a fresh run"

# an archive is refused by a model with other weights (descriptor weights hash)
cp "$MODEL" "$T/other.bin"
chmod u+w "$T/other.bin"
printf '\125' | dd of="$T/other.bin" bs=1 seek=28 conv=notrunc 2>/dev/null
if "$E" --model "$T/other.bin" --resume "$T/a-greedy-1.fkvf" --generate 1 >"$T/other" 2>&1; then
    bad "(a) an archive of another model was resumed"
else
    grep -q 'saved with other model weights' "$T/other" && ok || { bad "(a) other model:"; cat "$T/other"; }
fi

# ---- (b) SIGKILL mid-generation ---------------------------------------------
G=300
run kfull --generate $G --temperature 1 --seed 11
# two rounds: 3 ms between steps, killed after 80 printed steps (lands between
# commits or in one); no delay, each step bound by its commit's fsyncs, killed
# after 30 (more often inside a commit)
for round in 3:80 0:30; do
delay=${round%%:*}
want_steps=${round#*:}
b=$T/kill-$delay.fkvf
# each round its own output file, made empty before the engine starts: the
# shell truncates a redirection only once the background job runs, and the
# loop below, reading the previous round's 80 steps meanwhile, killed the
# engine before it had made its archive (the "archive 0, printed up to 79"
# failures seen under load)
K=$T/killed-$delay
: >"$K"
"$E" --model "$MODEL" --generate $G --temperature 1 --seed 11 --save "$b" --exact-only \
    --commit-every 1 --delay-ms "$delay" >>"$K" 2>"$K.err" &
pid=$!
i=0
while :; do
    c=$(grep -c '^step ' "$K" 2>/dev/null)
    # up to 120 s: on a loaded machine the engine may take long to print its
    # first step (killed before it made the archive, the probe below fails)
    [ "${c:-0}" -ge "$want_steps" ] || [ $i -ge 12000 ] && break
    sleep 0.01
    i=$((i + 1))
done
kill -KILL $pid
wait $pid 2>/dev/null
seen=$(grep -c '^step ' "$K")
last=$(grep '^step ' "$K" | tail -n 1 | sed 's/^step pos=\([0-9]*\).*/\1/')
grep -q '^ids:' "$K" && bad "(b) the engine finished before the kill"
# the archive as it was left (torn tail or not): its token stream
run probe --resume "$b" --generate 0
torn=$(grep '^resume: cut a torn tail' "$T/probe" | sed 's/.*tail of \([0-9]*\).*/\1/')
grep '^archive-tokens:' "$T/probe" | cut -d' ' -f2- | tr ' ' '\n' >"$T/arch"
n=$(wc -l <"$T/arch")
{ echo 1; ids_of kfull | tr ' ' '\n'; } | head -n "$n" >"$T/want"
same "(b) archive token stream is a prefix of the uninterrupted run" "$T/want" "$T/arch"
# step pos=P was printed after position P was committed
[ "$n" -ge $((last + 1)) ] && ok || bad "(b) committed positions lost: archive $n, printed up to $last"
run kresume --resume "$b" --generate $((G + 1 - n)) --temperature 1 --seed 11
steps kfull | tail -n $((G + 1 - n)) >"$T/want"
steps kresume >"$T/got"
same "(b) continuation after SIGKILL" "$T/want" "$T/got"
"$F" verify "$b" >/dev/null 2>&1 && ok || bad "(b) fkvf verify after the resume"
echo "(b) checked: delay ${delay} ms, SIGKILL after $seen printed steps (last pos $last): archive held $n positions, continuation of $((G + 1 - n)) steps bit-identical; torn tail cut: ${torn:-0} bytes"
done

# ---- (c) quantized archive --------------------------------------------------
cb=$T/cb.fkvf
if ! "$F" train "$SRC/testdata/train-cache.safetensors" -o "$cb" --k 64 >"$T/train" 2>&1; then
    bad "(c) fkvf train"
    cat "$T/train"
fi
N=100 M=60
run qfull --generate $((N + M)) --temperature 1 --seed 21
run qsave --generate $N --temperature 1 --seed 21 --save "$T/q.fkvf" --codebooks "$cb" \
    --sinks 4 --recent 32
steps qfull | head -n $N >"$T/want"
steps qsave >"$T/got"
same "(c) saving does not change the run" "$T/want" "$T/got"
FORCE=$(steps qfull | tail -n $M | sed 's/.*id=\([0-9]*\).*/\1/' | paste -sd, -)
# no --codebooks: the codebook is found next to the archive by the name it stores
run qresume --resume "$T/q.fkvf" --force "$FORCE"
grep -q "reused $N" "$T/qresume" && ok || bad "(c) $(grep '^resume:' "$T/qresume")"
grep -q "archive: .*q.fkvf: $((N + M + 1)) positions ($((N + M + 1 - 36)) archived)" "$T/qresume" && ok ||
    bad "(c) $(grep '^archive:' "$T/qresume")"
exact=$(steps qfull | tail -n $M | sed 's/.*nll=\([0-9.]*\).*/\1/' |
    awk '{s += $1} END {printf "%.6f", s / NR}')
quant=$(grep '^mean-nll:' "$T/qresume" | cut -d' ' -f2)
agree=$(steps qresume | sed 's/.*pos=\([0-9]*\) id=\([0-9]*\).*/\1 \2/' >"$T/g1"
    steps qfull | tail -n $M | sed 's/.*pos=\([0-9]*\) id=\([0-9]*\).*/\1 \2/' >"$T/g2"
    cmp -s "$T/g1" "$T/g2" && echo yes || echo no)
[ "$agree" = yes ] && ok || bad "(c) the forced tokens are not the uninterrupted run's"
echo "(c) quantized archive (k=64, K x4 V x2, keys pre-RoPE, 4 sinks + 32 recent exact):"
echo "    continuation of $M tokens after resuming $N positions ($((N + 1 - 36)) archived):"
echo "    mean NLL $quant (exact cache: $exact)"
awk -v q="$quant" -v e="$exact" 'BEGIN {exit !(q > 0 && q < e + 3)}' && ok ||
    bad "(c) mean NLL $quant implausible (exact $exact)"
run qgreedy --resume "$T/q.fkvf" --generate 20
grep -q '^ids:' "$T/qgreedy" && ok || bad "(c) sampling after a quantized resume"

echo "engine_restart: $pass passed, $fails failed"
[ "$fails" -eq 0 ]
