#!/bin/sh
# The table of docs/codebooks.md: for each cache, fkvf pack with --k 16..256
# and with the automatic k, then archive bytes, codebook bytes, ratio vs
# fp16 (codebook included) and the SNR of the archived positions (fkvf
# compare --sinks 4 --recent 32). Prints a Markdown table.
# usage: scripts/codebook-k-grid.sh CACHE...   (FKVF=path/to/fkvf, default build/tools/fkvf)
set -eu
FKVF=${FKVF:-build/tools/fkvf}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
echo "| cache | P | A | k | bytes | codebook | ratio | K dB | V dB |"
echo "|---|---|---|---|---|---|---|---|---|"
for f in "$@"; do
    n=$(basename "$f" .safetensors)
    for k in 16 32 64 128 256 auto; do
        if [ "$k" = auto ]; then kk=""; else kk="--k $k"; fi
        # shellcheck disable=SC2086
        nice "$FKVF" pack "$f" -o "$W/g.fkvf" $kk >"$W/pack" 2>/dev/null
        nice "$FKVF" unpack "$W/g.fkvf" -o "$W/g.safetensors" >/dev/null
        nice "$FKVF" compare "$f" "$W/g.safetensors" --sinks 4 --recent 32 --json >"$W/cmp"
        nice "$FKVF" info --json "$W/g.fkvf" >"$W/info"
        /usr/bin/python3 - "$n" "$k" "$W" <<'PY'
import json, re, sys
n, k, w = sys.argv[1:4]
info = json.load(open(w + '/info')); cmp = json.load(open(w + '/cmp'))
P, A, by = info['positions'], info['archived'], info['file_size']
cb, fp16 = info['bytes']['codebooks'], info['bytes']['fp16_equivalent']
db = lambda x: 'inf' if x is None else '%.2f' % x
if k == 'auto':
    m = re.search(r'k = (\d+)', open(w + '/pack').read())
    k = '**auto: %s**' % (m.group(1) if m else 'exact')
kd = db(cmp['keys']['snr_db']) if A else '-'
vd = db(cmp['values']['snr_db']) if A else '-'
print('| %s | %d | %d | %s | %d | %d | %.2fx | %s | %s |' % (n, P, A, k, by, cb, fp16 / by, kd, vd))
PY
    done
done
