#!/bin/sh
# Archives read over HTTP range requests (issue 18, docs/remote.md), from a
# real server: nginx, started here on 127.0.0.1 on a free port, serving a
# temporary directory, stopped at the end. Checks that the read-only
# commands give the same results on a URL as on the file, how many bytes
# they transfer (nginx's access log: a small part of the file for info), and
# that server faults give a clear error, never wrong data.
# usage: cli_remote.sh FKVF SRCDIR
set -u
FKVF=$1
SRC=$2
. "$(dirname "$0")/cli_lib.sh"
PY=/usr/bin/python3
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] ||
    { echo "SKIP: no nginx (scripts/install-deps.sh installs nginx-light)"; exit 77; }
"$PY" -c 'import numpy' 2>/dev/null || { echo "SKIP: $PY has no numpy"; exit 77; }

# an archive of a few MB with an embedded codebook, and one with an external
shape="--layers 4 --heads 4 --dim 64"
"$PY" "$SRC/bench/mkcache.py" -o "$T/raw.npy" --positions 4096 $shape >/dev/null || exit 1
"$PY" "$SRC/bench/mkcache.py" -o "$T/train.npy" --positions 512 $shape >/dev/null || exit 1
mkdir "$T/www" "$T/logs"
check train 0 "$FKVF" train "$T/train.npy" -o "$T/www/cb.fkvf" --k 64 --k-stages 2 --v-stages 2 --iters 1
check pack 0 "$FKVF" pack "$T/raw.npy" --k 256 --k-stages 2 --v-stages 2 --iters 1 --sinks 4 --recent 8 -o "$T/www/a.fkvf"
check pack-ext 0 "$FKVF" pack "$T/raw.npy" --codebooks "$T/www/cb.fkvf" --sinks 4 --recent 8 -o "$T/www/x.fkvf"
cp "$T/www/a.fkvf" "$T/www/norange.fkvf"
size=$(wc -c <"$T/www/a.fkvf")

# nginx on 127.0.0.1, its own config and logs in $T (scripts/nginx-local.sh)
. "$SRC/scripts/nginx-local.sh"
nginx_local_start "$T" "$T/www" '        location = /norange.fkvf { max_ranges 0; }
        location = /err.fkvf { return 500; }'
st=$?
[ $st -eq 77 ] && { echo "SKIP: no nginx"; exit 77; }
[ $st -eq 0 ] || { echo "FAIL nginx"; exit 1; }
stop() { nginx_local_stop "$T"; rm -rf "$T"; }
trap stop EXIT
URL=$NGINX_URL
# bytes sent since the mark (the log's lines for one command)
mark() { : >"$T/logs/bytes.log"; }
sent() { awk '{ s += $3 } END { print s + 0 }' "$T/logs/bytes.log"; }
requests() { wc -l <"$T/logs/bytes.log"; }

# info: the same as the file's (but for the name), a small part of the file
check info-file 0 "$FKVF" info --json "$T/www/a.fkvf"
sed "s|$T/www/a.fkvf|NAME|g" "$T/out" >"$T/info-file.json"
mark
check info-url 0 "$FKVF" info --json "$URL/a.fkvf"
sed "s|$URL/a.fkvf|NAME|g" "$T/out" >"$T/info-url.json"
if cmp -s "$T/info-file.json" "$T/info-url.json"; then pass=$((pass + 1)); else
    echo "FAIL info-same: URL and file differ"; diff "$T/info-file.json" "$T/info-url.json" | head; fails=$((fails + 1)); fi
info_bytes=$(sent)
info_req=$(requests)
if [ "$info_bytes" -gt 0 ] && [ "$info_bytes" -lt $((size / 10)) ]; then pass=$((pass + 1)); else
    echo "FAIL info-bytes: $info_bytes of $size bytes transferred"; fails=$((fails + 1)); fi

# verify and unpack: the same results; unpack transfers the file about once
mark
check verify-url 0 "$FKVF" verify "$URL/a.fkvf"
verify_bytes=$(sent)
check unpack-file 0 "$FKVF" unpack "$T/www/a.fkvf" -o "$T/file.npy"
mark
check unpack-url 0 "$FKVF" unpack "$URL/a.fkvf" -o "$T/url.npy"
unpack_bytes=$(sent)
unpack_req=$(requests)
if cmp -s "$T/file.npy" "$T/url.npy"; then pass=$((pass + 1)); else echo "FAIL unpack-same"; fails=$((fails + 1)); fi
if [ "$unpack_bytes" -le $((size + 4096)) ]; then pass=$((pass + 1)); else
    echo "FAIL unpack-bytes: $unpack_bytes for a file of $size"; fails=$((fails + 1)); fi
# an external codebook given as a URL too
check unpack-ext 0 "$FKVF" unpack "$URL/x.fkvf" --codebooks "$URL/cb.fkvf" -o "$T/ext.npy"
check verify-ext 0 "$FKVF" verify "$URL/x.fkvf" --codebooks "$URL/cb.fkvf"
# context: a few symbols before a position, a few blocks
check context-file 0 "$FKVF" context "$T/www/a.fkvf" --at 2000 --len 8 --stream L1.H2.V.1
cp "$T/out" "$T/ctx-file"
mark
check context-url 0 "$FKVF" context "$URL/a.fkvf" --at 2000 --len 8 --stream L1.H2.V.1
if cmp -s "$T/ctx-file" "$T/out"; then pass=$((pass + 1)); else echo "FAIL context-same"; fails=$((fails + 1)); fi
context_bytes=$(sent)

# dump, search and plot: the same output from the URL as from the file
check dump-file 0 "$FKVF" dump "$T/www/a.fkvf"
sed "s|$T/www/a.fkvf|NAME|g" "$T/out" >"$T/dump-file"
check dump-url 0 "$FKVF" dump "$URL/a.fkvf"
sed "s|$URL/a.fkvf|NAME|g" "$T/out" >"$T/dump-url"
if cmp -s "$T/dump-file" "$T/dump-url"; then pass=$((pass + 1)); else echo "FAIL dump-same"; diff "$T/dump-file" "$T/dump-url" | head; fails=$((fails + 1)); fi
check search-file 0 "$FKVF" search "$T/www/a.fkvf" --stream L1.H2.V.1 --symbols 3,7
cp "$T/out" "$T/search-file"
check search-url 0 "$FKVF" search "$URL/a.fkvf" --stream L1.H2.V.1 --symbols 3,7
if cmp -s "$T/search-file" "$T/out"; then pass=$((pass + 1)); else echo "FAIL search-same"; fails=$((fails + 1)); fi
check plot-file 0 "$FKVF" plot "$T/www/a.fkvf" --stream L0.H0.K.0 -o "$T/file.png"
check plot-url 0 "$FKVF" plot "$URL/a.fkvf" --stream L0.H0.K.0 -o "$T/url.png"
if cmp -s "$T/file.png" "$T/url.png"; then pass=$((pass + 1)); else echo "FAIL plot-same"; fails=$((fails + 1)); fi

# export-llama: a llama.cpp state file (this suite's own builders) imported,
# then exported from the URL: the same bytes as the state file
"$PY" "$SRC/tests/mkgguf.py" "$T/m.gguf" --arch llama --name tiny-llama --layers 3 --embd 64 \
    --heads 8 --kv-heads 2 --vocab 512
"$PY" "$SRC/tests/mkllstate.py" "$T/st.bin" --layers 3 --heads 2 --dim 8 --cells 17 --type f16 \
    --v-trans 0 --kind seq --seed 5
check import-llama 0 "$FKVF" import-llama "$T/st.bin" --model "$T/m.gguf" -o "$T/www/ll.fkvf"
check export-llama-url 0 "$FKVF" export-llama "$URL/ll.fkvf" -o "$T/st2.bin"
check export-llama-same 0 cmp "$T/st.bin" "$T/st2.bin"

# faults: a server that ignores Range, a 500, a missing object, --max-bytes
check norange 2 "$FKVF" info "$URL/norange.fkvf"
grep_in norange "ignores Range" "$T/err"
mark
check err500 2 "$FKVF" info "$URL/err.fkvf"
grep_in err500 "server error.*after retries" "$T/err"
[ "$(requests)" -eq 4 ] && pass=$((pass + 1)) || { echo "FAIL err500: $(requests) requests, want 4 (retries)"; fails=$((fails + 1)); }
check missing 2 "$FKVF" info "$URL/nothing.fkvf"
grep_in missing "refused.*404" "$T/err"
check maxbytes 2 "$FKVF" unpack "$URL/a.fkvf" -o "$T/cap.npy" --max-bytes 100000
grep_in maxbytes "max-bytes 100000" "$T/err"
[ -e "$T/cap.npy" ] && { echo "FAIL maxbytes: output left behind"; fails=$((fails + 1)); } || pass=$((pass + 1))
check maxbytes-bad 2 "$FKVF" info "$URL/a.fkvf" --max-bytes 0
# faults nginx does not make (tests/http_faults.py, also on 127.0.0.1 only):
# resets and cut bodies are retried and the result is the file's; an object
# replaced after the open (after as many requests as info made; same size,
# other bytes) fails its checksums, one
# whose size changed is refused: never wrong data
"$PY" - "$T/www/a.fkvf" "$T/www/a.fkvf.swap" <<'EOF2'
import sys
d = bytearray(open(sys.argv[1], "rb").read())
for i in range(len(d) // 4, len(d) // 4 * 3):
    d[i] ^= 0x5A
open(sys.argv[2], "wb").write(bytes(d))
EOF2
"$PY" "$SRC/tests/http_faults.py" "$T/www" --after "$info_req" --seconds 240 >"$T/faults.port" 2>"$T/faults.err" &
fpid=$!
stop() { kill "$fpid" 2>/dev/null; nginx_local_stop "$T"; rm -rf "$T"; }
i=0
until [ -s "$T/faults.port" ]; do
    i=$((i + 1)); [ $i -lt 50 ] || { echo "FAIL http_faults.py did not start"; cat "$T/faults.err"; exit 1; }; sleep 0.1
done
F="http://127.0.0.1:$(cat "$T/faults.port")"
check flaky 0 "$FKVF" unpack "$F/flaky/a.fkvf" -o "$T/flaky.npy"
if cmp -s "$T/file.npy" "$T/flaky.npy"; then pass=$((pass + 1)); else echo "FAIL flaky-same"; fails=$((fails + 1)); fi
check swap 1 "$FKVF" unpack "$F/swap/a.fkvf" -o "$T/swap.npy"
grep_in swap "CHECKSUM" "$T/err"
[ -e "$T/swap.npy" ] && { echo "FAIL swap: output left behind"; fails=$((fails + 1)); } || pass=$((pass + 1))
check grow 2 "$FKVF" unpack "$F/grow/a.fkvf" -o "$T/grow.npy"
grep_in grow "changed size" "$T/err"

echo "remote: file $size bytes; info $info_bytes bytes in $info_req requests; verify $verify_bytes;" \
    "unpack $unpack_bytes in $unpack_req requests; context $context_bytes"
finish cli_remote
