# Shared by the tests against the real llama.cpp (tests/llama_*.sh; sourced
# after tests/cli_lib.sh, with F the fkvf binary and SRC the source
# directory set): the driver (tests/llama/driver.mjs), the models, the
# prompts as token ids, and the skip (exit 77) when node-llama-cpp is not
# installed (scripts/install-llama.sh) or a model is absent.
DRIVER=$SRC/tests/llama/driver.mjs
MODELS=$SRC/../shared/models
SUITE=${SUITE:-llama}

llama_skip() { # llama_skip REASON
    echo "$SUITE: $*, skipping"
    exit 77
}
# skipped only without node or node-llama-cpp; installed but failing to
# load is a failure (of the first jobs_run)
command -v node >/dev/null 2>&1 || llama_skip "node not found (scripts/install-deps.sh installs it)"
node "$DRIVER" check >"$T/check" 2>"$T/check.err"
case $? in
0) ;;
77) llama_skip "$(sed 's/^driver: //' "$T/check.err")" ;;
*)
    echo "FAIL $SUITE: driver check:"
    cat "$T/check.err"
    exit 1
    ;;
esac

need_model() { # need_model NAME.gguf: its path, or the skip
    [ -f "$MODELS/$1" ] || llama_skip "$MODELS/$1 not found"
}

ok() { pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
job() { # job OUT COMMAND ARGS...: a driver command for the next jobs_run, its JSON to $T/OUT
    out=$1
    shift
    rm -f "$T/$out"
    echo "$T/$out $*" >>"$T/jobs"
}
jobs_run() { # the commands queued by job, in one driver process (paths without spaces)
    if ! node "$DRIVER" batch "$T/jobs" 2>"$T/jobs.err"; then
        bad "driver batch:"
        cat "$T/jobs.err"
    fi
    rm -f "$T/jobs"
}
same() { # same NAME FILE1 FILE2: byte for byte
    if cmp -s "$2" "$3"; then ok; else bad "$1: $2 and $3 differ"; cmp "$2" "$3" | head -3; fi
}
json_num() { # json_num FILE KEY: the first number of that key in a JSON file
    sed -n "s/.*\"$2\": *\(-\{0,1\}[0-9][0-9.e+-]*\).*/\1/p" "$1" | head -n 1
}
sample_ids() { # sample_ids NAME FROM TO: BOS then ids FROM..TO (1-based) of a fixed stories260K sample
    printf '1,'
    sed -n "s/^$1 //p" "$SRC/tests/llama/stories-samples.txt" | cut -d, -f"$2-$3"
}
text_ids() { # text_ids OFFSET LEN: bytes of shakespeare.txt as ids (3 + byte), comma list
    od -An -v -tu1 -j "$1" -N "$2" "$MODELS/shakespeare.txt" |
        awk '{ for (i = 1; i <= NF; i++) printf "%s%d", (n++ ? "," : ""), $i + 3 } END { print "" }'
}
ids_range() { # ids_range LIST FROM TO: fields FROM..TO (1-based) of a comma list
    echo "$1" | cut -d, -f"$2-$3"
}
model_ids() { # model_ids MODEL SAMPLE OFFSET N: BOS then N prompt ids for that model: the
    # stories260K sample SAMPLE (stories-samples.txt), or N bytes of shakespeare.txt at OFFSET
    if [ "$1" = stories260K ]; then
        sample_ids "$2" 1 "$4"
    else
        printf '1,'
        text_ids "$3" "$4"
    fi
}
config_vars() { # config_vars MODEL KV:FLASH: kv, fl, the case name c and the file stem s
    kv=${2%:*} fl=${2#*:}
    c="$1 kv $kv flash $fl"
    s=$T/$1-$kv-$fl
}
counts_are() { # counts_are NAME POSITIONS ARCHIVED: those counts in the --json result $T/out
    [ "$(json_num "$T/out" positions):$(json_num "$T/out" archived)" = "$2:$3" ] && ok ||
        bad "$1: import-llama --json: $(cat "$T/out") (want $2 positions, $3 archived)"
}
