#!/bin/sh
# Incremental archiving of llama.cpp saves (tests/llama/driver.mjs,
# node-llama-cpp 3.21.1): llama.cpp evaluates one sequence and saves it at
# 40, 70 and 100 tokens (one process, so each save extends the one before);
# fkvf import-llama the first, then --append the second and the third (each
# append adds only the new positions); the archive's export equals the last
# save byte for byte, and after the first append it equals the second save.
# `fkvf append A STATE --model M --new` gives the same archive contents. A
# save whose first tokens differ from the archive's is refused (exit 1) and
# leaves the archive as it was. f16 with flash off (V transposed) and f32
# with flash on (V as rows), stories260K and shakespeare-hd64.
# usage: llama_incremental.sh FKVF SRCDIR
F=$1 SRC=$2
SUITE=llama_incremental
. "$SRC/tests/cli_lib.sh"
. "$SRC/tests/llama/lib.sh"
need_model stories260K.gguf
need_model shakespeare-hd64.gguf

CONFIGS="f16:0 f32:1"

append_save() { # append_save PREV NEXT: import-llama --append of the NEXT-token save of $s
    # after the PREV-token one: only the new positions are written, NEXT - PREV of them,
    # in at most their bytes in the state file (rows, cells, tokens) and a commit's 4 KiB;
    # the export is then the NEXT-token save
    check "$c: import-llama --append $2" 0 "$F" import-llama "$s.$2" --model "$M" --append "$s.fkvf" --json
    grow=$(($(wc -c <"$s.$2") - $(wc -c <"$s.$1") + 4096))
    [ "$(json_num "$T/out" appended)" = $(($2 - $1)) ] && [ "$(json_num "$T/out" bytes_added)" -le $grow ] && ok ||
        bad "$c: --append $2 --json: $(cat "$T/out") (want $(($2 - $1)) appended, at most $grow bytes added)"
    check "$c: export-llama after $2" 0 "$F" export-llama "$s.fkvf" -o "$s.e$2"
    same "$c: the export after appending the $2-token save is that save" "$s.$2" "$s.e$2"
}
for m in stories260K shakespeare-hd64; do
    M=$MODELS/$m.gguf
    P=$(model_ids $m eval2 1010000 99)
    # the same prompt with token 21 changed: another sequence from 20 on
    t=$(ids_range "$P" 21 21)
    D=$(ids_range "$P" 1 20),$((t == 50 ? 51 : 50)),$(ids_range "$P" 22 100)
    for cf in $CONFIGS; do
        config_vars $m "$cf"
        job $m-$kv-$fl.save save --model "$M" --kv $kv --flash $fl --prompt "$P" --at 40,70,100 \
            --state "$T/$m-$kv-$fl"
        job $m-$kv-$fl.other save --model "$M" --kv $kv --flash $fl --prompt "$D" --at 70 \
            --state "$T/$m-$kv-$fl-other"
    done
    jobs_run
    for cf in $CONFIGS; do
        config_vars $m "$cf"
        check "$c: import-llama 40" 0 "$F" import-llama "$s.40" --model "$M" -o "$s.fkvf" --json
        counts_are "$c" 40 0
        cp "$s.fkvf" "$s-b.fkvf"
        cp "$s.fkvf" "$s-c.fkvf"
        append_save 40 70
        append_save 70 100
        # the same append as fkvf append --new
        check "$c: fkvf append --new 70" 0 "$F" append "$s-b.fkvf" "$s.70" --model "$M" --new
        check "$c: export-llama after append --new" 0 "$F" export-llama "$s-b.fkvf" -o "$s.b70"
        same "$c: fkvf append --new gives the same archive contents" "$s.70" "$s.b70"
        # another sequence's save is refused, the archive unchanged
        check "$c: --append of another sequence's save (exit 1)" 1 \
            "$F" import-llama "$s-other.70" --model "$M" --append "$s-c.fkvf"
        check "$c: export-llama after the refused append" 0 "$F" export-llama "$s-c.fkvf" -o "$s.c40"
        same "$c: the refused append left the archive as it was" "$s.40" "$s.c40"
        echo "$c: saves of 40, 70, 100 tokens ($(wc -c <"$s.40"), $(wc -c <"$s.70"), $(wc -c <"$s.100") bytes)" \
            "imported, appended, appended; archive $(wc -c <"$s.fkvf") bytes"
    done
done
finish "$SUITE"
