#!/bin/sh
# Progress bars (tools/cli_util.c): under a pseudo-terminal (script(1) from
# util-linux) a long 'fkvf train' draws its bar with the elapsed time and an
# ETA and ends with a final "done in" line; a large cache file (a sparse
# 64 MiB .safetensors) is read with a bar of bytes; with stderr on a file or
# a pipe no bar is ever drawn. Skipped (77) without script(1) or python3.
# usage: cli_progress.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
TR=$SRC/testdata/train-cache.safetensors
. "$(dirname "$0")/cli_lib.sh"
if ! command -v script >/dev/null 2>&1; then
    echo "cli_progress: script(1) not found: skipped"
    exit 77
fi
# tty NAME EXPECTED_EXIT CMDLINE: run CMDLINE (one string, for sh -c) on a
# pseudo-terminal; everything it wrote to the terminal is in $T/tty
tty() {
    check "$1" "$2" script -qec "$3" /dev/null
    tr '\r' '\n' <"$T/out" >"$T/tty"
}
absent() { # absent NAME PATTERN FILE
    if grep -q -- "$2" "$3"; then echo "FAIL $1: '$2' in $3:"; cat "$3"; fails=$((fails + 1)); else pass=$((pass + 1)); fi
}
BAR='\[[# ]*\]'

# a training run of a second or two: the bar, then elapsed time and an ETA
# (the training cache given 8 times: 4096 rows, about 1.6 s of CPU in a
# Release build; once alone it took 0.25 s, the ETA's threshold, and the
# ETA did not show on an idle machine)
LONG="'$FKVF' train '$TR' '$TR' '$TR' '$TR' '$TR' '$TR' '$TR' '$TR' --k 512 --k-stages 8"
tty train-tty 0 "$LONG -o '$T/cb.fkvf'"
grep_in train-tty-eta "^train  $BAR *[0-9]*%  [0-9.]*s elapsed, ETA [0-9][0-9hms.]*\$" "$T/tty"
grep_in train-tty-final "^train  \[##############################\] 100%  done in [0-9][0-9hms.]* *\$" "$T/tty"
grep_in train-tty-result "cb.fkvf: 5 layers x 4 heads, k = 512" "$T/tty"

# stderr on a file, on a terminal or not: no bar
SHORT="'$FKVF' train '$TR' --k 16 --k-stages 1 --v-stages 1"
check train-file 0 sh -c "$SHORT -o '$T/cb2.fkvf'"
absent train-file-nobar "$BAR" "$T/err"
absent train-file-noeta "ETA" "$T/err"
tty train-tty-file 0 "$SHORT -o '$T/cb3.fkvf' 2>'$T/err2'"
absent train-tty-file-nobar "$BAR" "$T/err2"
absent train-tty-file-tty "$BAR" "$T/tty"
grep_in train-tty-file-result "cb3.fkvf: 5 layers x 4 heads, k = 16" "$T/tty"
# stderr on a pipe
tty train-tty-pipe 0 "$SHORT -o '$T/cb4.fkvf' 2>&1 | cat"
absent train-tty-pipe-nobar "$BAR" "$T/tty"
grep_in train-tty-pipe-result "cb4.fkvf: 5 layers x 4 heads, k = 16" "$T/tty"

# a large input is read with a bar (64 MiB of f16 zeros, sparse on disk)
if command -v python3 >/dev/null 2>&1; then
    python3 - "$T/big.safetensors" <<'EOF'
import json, struct, sys
T = 1 << 20  # positions: 1 layer, 1 head, dim 16, keys and values 32 MiB each
n = T * 16 * 2
hdr = {"layers.0.key": {"dtype": "F16", "shape": [1, T, 16], "data_offsets": [0, n]},
       "layers.0.value": {"dtype": "F16", "shape": [1, T, 16], "data_offsets": [n, 2 * n]}}
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    f.truncate(8 + len(h) + 2 * n)
EOF
    BIG="'$FKVF' train '$T/big.safetensors' --k 16 --k-stages 1 --v-stages 0"
    tty read-tty 0 "$BIG -o '$T/big.fkvf'"
    grep_in read-tty-bar "^read   \[####################\] 100%  64.0/64.0 MiB  done in [0-9.]*s *\$" "$T/tty"
    grep_in read-tty-result "big.fkvf: 1 layers* x 1 heads*, k = 16" "$T/tty"
    check read-file 0 sh -c "$BIG -o '$T/big2.fkvf'"
    absent read-file-nobar "$BAR" "$T/err"
    check read-same 0 cmp "$T/big.fkvf" "$T/big2.fkvf"
else
    echo "cli_progress: python3 not found: large-input bar not checked"
fi
finish cli_progress
