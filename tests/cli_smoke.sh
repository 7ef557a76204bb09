#!/bin/sh
# CLI smoke tests: commands, --help, exit codes, JSON output, and that the
# bundled sample is exactly what the generator writes.
# usage: cli_smoke.sh FKVF_BIN MKSAMPLE_BIN SRCDIR
set -u
FKVF=$1
MK=$2
SRC=$3
. "$(dirname "$0")/cli_lib.sh"

check version 0 "$FKVF" --version
grep_in version "format 1.2" "$T/out"
check help 0 "$FKVF" --help
grep_in help "verify ARCHIVE" "$T/out"
for c in info verify dump; do
    check "$c-help" 0 "$FKVF" $c --help
    check "$c-noarg" 2 "$FKVF" $c
    check "$c-badopt" 2 "$FKVF" $c --bogus x
done
check nocmd 2 "$FKVF"
check badcmd 2 "$FKVF" frobnicate
check mksample-help 0 "$MK" --help

# the bundled sample is reproducible byte for byte
check mksample 0 "$MK" -o "$T/s.fkvf"
check sample-identical 0 cmp "$T/s.fkvf" "$SRC/testdata/sample.fkvf"
check mksample-ngon 0 "$MK" --ngon -o "$T/n.fkvf"
check verify-ngon 0 "$FKVF" verify "$T/n.fkvf"

# untrusted text reaches the terminal escaped (spec 18.7): ESC, BEL, DEL, C1 CSI
check mksample-escapes 0 "$MK" --model-id "$(printf 'm\033]0;owned\007\033[2J\177\302\233x')" -o "$T/esc.fkvf"
check info-escapes 0 "$FKVF" info "$T/esc.fkvf"
if LC_ALL=C grep -q "$(printf '[\033\007\177\233]')" "$T/out"; then
    echo "FAIL info-escapes: control characters in the output"; fails=$((fails + 1))
else
    pass=$((pass + 1))
fi
grep_in info-escapes 'model           m\\x1b]0;owned\\x07\\x1b\[2J\\x7f\\u009bx' "$T/out"
check info-escapes-json 0 "$FKVF" info --json "$T/esc.fkvf"
grep_in info-escapes-json '"model_id":"m\\u001b]0;owned\\u0007' "$T/out"

check info 0 "$FKVF" info "$SRC/testdata/sample.fkvf"
grep_in info "5 layers x 4 KV heads" "$T/out"
grep_in info "sample.generator = fkvf-mksample" "$T/out"
check info-json 0 "$FKVF" info --json "$SRC/testdata/sample.fkvf"
grep_in info-json '"positions":100' "$T/out"
cp "$T/out" "$T/info.json"
if command -v python3 >/dev/null; then
    check info-json-parses 0 python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["archived"]==64 and len(d["stream_list"])==121' "$T/info.json"
fi
check verify 0 "$FKVF" verify "$SRC/testdata/sample.fkvf"
check verify-json 0 "$FKVF" verify --json "$SRC/testdata/sample.fkvf"
grep_in verify-json '"valid":true' "$T/out"
check dump 0 "$FKVF" dump "$SRC/testdata/sample.fkvf"
grep_in dump "DESC" "$T/out"
check dump-json 0 "$FKVF" dump --json "$SRC/testdata/sample.fkvf"

# invalid inputs: exit 1 with a message naming the clause; missing file: exit 2
check verify-missing 2 "$FKVF" verify "$T/does-not-exist"
printf 'hello world' >"$T/bad"
check verify-badmagic 1 "$FKVF" verify "$T/bad"
grep_in verify-badmagic "spec 3.1" "$T/err"
size=$(wc -c <"$SRC/testdata/sample.fkvf")
head -c $((size - 10)) "$SRC/testdata/sample.fkvf" >"$T/trunc"
check verify-truncated 1 "$FKVF" verify "$T/trunc"
grep_in verify-truncated "FKVF_E_TRUNCATED" "$T/err"
cp "$SRC/testdata/sample.fkvf" "$T/flip"
printf '\377' | dd of="$T/flip" bs=1 seek=1000 conv=notrunc 2>/dev/null
check verify-flip 1 "$FKVF" verify "$T/flip"
grep_in verify-flip "FKVF_E_CHECKSUM" "$T/err"
check verify-flip-json 1 "$FKVF" verify --json "$T/flip"
grep_in verify-flip-json '"valid":false' "$T/out"

finish cli_smoke
