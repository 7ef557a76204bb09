#!/bin/sh
# CLI keys (key retrieval, fkvf_search_keys) on an archive packed from the
# bundled sample cache (keys archived before rotation): with --candidates
# covering the archived range the hits are exactly the top m of q . k over
# the keys 'fkvf unpack --dtype f32' restores (checked with numpy, by
# position and score); the default query's hits are archived positions in
# the range, best first, each scored as its restored key scores; --json,
# --query-file, --first/--end and an index give what they should; usage and
# input errors exit 2 and 1.
# usage: cli_keys.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
CACHE=$SRC/testdata/sample-cache.safetensors
. "$(dirname "$0")/cli_lib.sh"
PY=/usr/bin/python3

check help 0 "$FKVF" keys --help
grep_in help-text "usage: fkvf keys" "$T/out"
check help-lists-keys 0 "$FKVF" --help
grep_in help-lists-keys "keys ARCHIVE" "$T/out"
check noarg 2 "$FKVF" keys
check badopt 2 "$FKVF" keys "$T/none.fkvf" --bogus x
check no-query 2 "$FKVF" keys "$T/none.fkvf" --layer 0 --head 0
check missing-file 2 "$FKVF" keys "$T/none.fkvf" --layer 0 --head 0 --query 1,2,3,4,5,6,7,8

check pack 0 "$FKVF" pack "$CACHE" -o "$T/q.fkvf" --train --k 16 --k-stages 2 --v-stages 1 --no-index
check unpack 0 "$FKVF" unpack "$T/q.fkvf" -o "$T/u.safetensors" --dtype f32
Q=1,0.5,-0.3,0.2,0,0.1,0.4,-1
check bad-query 2 "$FKVF" keys "$T/q.fkvf" --layer 0 --head 0 --query 1,,2
check bad-query2 2 "$FKVF" keys "$T/q.fkvf" --layer 0 --head 0 --query 1,x
check bad-query-inf 2 "$FKVF" keys "$T/q.fkvf" --layer 0 --head 0 --query 1,2,3,4,5,6,7,inf
check short-query 1 "$FKVF" keys "$T/q.fkvf" --layer 0 --head 0 --query 1,2,3
grep_in short-query-msg "the archive's keys have 8" "$T/err"
check bad-layer 1 "$FKVF" keys "$T/q.fkvf" --layer 5 --head 0 --query $Q
grep_in bad-layer-msg "5 layers of 4 KV heads" "$T/err"
check bad-m 2 "$FKVF" keys "$T/q.fkvf" --layer 0 --head 0 --query $Q -m 0
check bad-cand 2 "$FKVF" keys "$T/q.fkvf" --layer 0 --head 0 --query $Q --candidates 1025

# the brute force: q . k over the restored keys of (layer, head), archived
# positions [4, 224) (4 sinks, 32 recent of 256), in [first, end)
brute() { # brute LAYER HEAD FIRST END M
    "$PY" - "$T/u.safetensors" "$Q" "$@" <<'PYEOF'
import json, struct, sys
import numpy as np
path, q, layer, head, first, end, m = sys.argv[1:8]
b = open(path, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
t = h['layers.%s.key' % layer]
o0, o1 = t['data_offsets']
k = np.frombuffer(b[8 + n + o0:8 + n + o1], dtype='<f4').reshape(t['shape'])[int(head)]
q = np.array([float(x) for x in q.split(',')], dtype=np.float32).astype(np.float64)
lo, hi = max(int(first), 4), min(int(end) if int(end) else 224, 224)
s = k[lo:hi].astype(np.float64) @ q
order = sorted(range(hi - lo), key=lambda i: (-s[i], i))[:int(m)]
print(json.dumps([[lo + i, float(s[i])] for i in order]))
PYEOF
}
hits() { # the hits of --json output as [[position, score], ...]
    "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps([[h["position"], h["score"]] for h in d["hits"]]))' "$T/out"
}
same() { # same NAME EXPECTED GOT: positions equal, scores within 1e-5
    if "$PY" -c '
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ok = len(a) == len(b) and all(x[0] == y[0] and abs(x[1] - y[1]) <= 1e-5 * (1 + abs(x[1])) for x, y in zip(a, b))
sys.exit(0 if ok else 1)' "$2" "$3"; then pass=$((pass + 1)); else echo "FAIL $1: want $2, got $3"; fails=$((fails + 1)); fi
}
for lh in "0 0" "1 2" "4 3"; do
    set -- $lh
    check "exact-$1-$2" 0 "$FKVF" keys "$T/q.fkvf" --layer $1 --head $2 --query $Q -m 8 --candidates 1024 --json
    grep_in "exact-$1-$2-cost" '"candidates":220' "$T/out"
    same "exact-$1-$2" "$(brute $1 $2 0 0 8)" "$(hits)"
    check "range-$1-$2" 0 "$FKVF" keys "$T/q.fkvf" --layer $1 --head $2 --query $Q -m 4 --first 50 --end 90 --candidates 1024 --json
    same "range-$1-$2" "$(brute $1 $2 50 90 4)" "$(hits)"
    # the default: hits in the range, ordered, each scored as its restored key
    check "default-$1-$2" 0 "$FKVF" keys "$T/q.fkvf" --layer $1 --head $2 --query $Q -m 8 --json
    if "$PY" -c '
import json, sys
d = json.load(open(sys.argv[1])); full = dict((p, s) for p, s in json.loads(sys.argv[2]))
h = [(x["position"], x["score"]) for x in d["hits"]]
ok = len(h) == 8 and d["candidates"] >= 32 and d["centroids_scored"] == 16
ok = ok and all(4 <= p < 224 and abs(full[p] - s) <= 1e-5 * (1 + abs(s)) for p, s in h)
ok = ok and all((a[1], -a[0]) > (b[1], -b[0]) for a, b in zip(h, h[1:]))
sys.exit(0 if ok else 1)' "$T/out" "$(brute $1 $2 0 0 220)"; then pass=$((pass + 1)); else echo "FAIL default-$1-$2:"; cat "$T/out"; fails=$((fails + 1)); fi
done
# the query as a float32 file gives the same answer as the list
"$PY" -c 'import numpy as np, sys; np.array([float(x) for x in sys.argv[1].split(",")], dtype="<f4").tofile(sys.argv[2])' "$Q" "$T/q.f32"
check list 0 "$FKVF" keys "$T/q.fkvf" --layer 1 --head 1 --query $Q -m 6
cp "$T/out" "$T/list.out"
check file 0 "$FKVF" keys "$T/q.fkvf" --layer 1 --head 1 --query-file "$T/q.f32" -m 6
if cmp -s "$T/out" "$T/list.out"; then pass=$((pass + 1)); else echo "FAIL file-vs-list"; fails=$((fails + 1)); fi
head -c 30 "$T/q.f32" >"$T/bad.f32"
check file-odd 1 "$FKVF" keys "$T/q.fkvf" --layer 1 --head 1 --query-file "$T/bad.f32"
check file-missing 2 "$FKVF" keys "$T/q.fkvf" --layer 1 --head 1 --query-file "$T/none.f32"
# an index on every stream: the same answer
check index 0 "$FKVF" index "$T/q.fkvf"
check indexed 0 "$FKVF" keys "$T/q.fkvf" --layer 1 --head 1 --query $Q -m 6
if cmp -s "$T/out" "$T/list.out"; then pass=$((pass + 1)); else echo "FAIL indexed-vs-scan"; cat "$T/out" "$T/list.out"; fails=$((fails + 1)); fi
# nothing archived in the range: no hits, exit 0
check empty-range 0 "$FKVF" keys "$T/q.fkvf" --layer 1 --head 1 --query $Q --first 230 --json
grep_in empty-range '"hits":\[\]' "$T/out"
# a codebook file is not an archive: exit 1, said so
check train 0 "$FKVF" train "$CACHE" -o "$T/cb.fkvf" --k 16 --k-stages 2 --v-stages 1
check codebook-file 1 "$FKVF" keys "$T/cb.fkvf" --layer 0 --head 0 --query $Q
grep_in codebook-file-msg "codebook file" "$T/err"
check codebook-file-json 1 "$FKVF" keys "$T/cb.fkvf" --layer 0 --head 0 --query $Q --json
grep_in codebook-file-json '"error"' "$T/out"
# an archive that refers to that codebook file: found next to it, or given
check pack-ref 0 "$FKVF" pack "$CACHE" -o "$T/r.fkvf" --codebooks "$T/cb.fkvf"
check ref 0 "$FKVF" keys "$T/r.fkvf" --layer 2 --head 1 --query $Q -m 3 --json
grep_in ref '"hits":\[{"position"' "$T/out"
mkdir "$T/away" && mv "$T/cb.fkvf" "$T/away/"
check ref-missing 1 "$FKVF" keys "$T/r.fkvf" --layer 2 --head 1 --query $Q
check ref-given 0 "$FKVF" keys "$T/r.fkvf" --layer 2 --head 1 --query $Q --codebooks "$T/away/cb.fkvf"
finish cli_keys
