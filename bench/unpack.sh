#!/bin/sh
# fkvf unpack against cp of the raw cache it restores (issue 16 row 2): wall
# time, CPU time and peak memory, in alternating pairs on the same files.
#
# usage: bench/unpack.sh FKVF_BIN [POSITIONS [PAIRS]]
#   FKVF_BIN   the fkvf CLI to measure (e.g. build/tools/fkvf)
#   POSITIONS  positions of the synthetic GPT-2-small-shape cache (8192:
#              12 layers x 12 KV heads x head dim 64, f16, 302 MB)
#   PAIRS      alternating pairs of cp / unpack (5)
# Needs /usr/bin/python3 with numpy (bench/mkcache.py) and GNU time
# (/usr/bin/time). Files go to a directory under $TMPDIR (default /tmp),
# removed at the end.
#
# Builds: the cache (bench/mkcache.py), a codebook (fkvf train, k = 256,
# K x4 V x2, one Lloyd iteration on the first 1024 positions), the archive
# (fkvf pack --codebooks) and, as the raw file cp copies, the .safetensors
# unpack writes. Then PAIRS pairs of `cp raw.safetensors x.safetensors` and
# `fkvf unpack archive -o y.safetensors` (the order swapped every other
# pair), each under /usr/bin/time -f "%e %U %S %M", and with each pair a
# copy that is on disk when it ends as unpack's output is (unpack fsyncs
# before it renames): `dd ... conv=fsync`. Prints one line per pair and,
# last on stdout:
#   RESULT unpack_vs_cp=<median wall ratio> unpack_cpu_vs_cp=<median CPU
#   ratio> unpack_peak_mib=<largest peak RSS of unpack, MiB>
#   cp_peak_mib=<largest of cp> unpack_vs_cp_fsync=<median wall ratio to
#   the dd copy>
set -eu
FKVF=${1:?usage: bench/unpack.sh FKVF_BIN [POSITIONS [PAIRS]]}
POS=${2:-8192}
PAIRS=${3:-5}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
TIME=/usr/bin/time
[ -x "$TIME" ] || { echo "bench/unpack.sh: needs GNU time at $TIME" >&2; exit 2; }
W=$(mktemp -d "${TMPDIR:-/tmp}/fkvf-unpack-bench.XXXXXX")
trap 'rm -rf "$W"' EXIT

echo "# cache: $POS positions, GPT-2-small shape (12 x 12 x 64, f16)" >&2
"$PY" "$HERE/mkcache.py" -o "$W/raw.npy" --positions "$POS" >&2
TRAIN=$((POS < 1024 ? POS : 1024))
"$PY" "$HERE/mkcache.py" -o "$W/train.npy" --positions "$TRAIN" >&2
"$FKVF" train "$W/train.npy" -o "$W/cb.fkvf" --k 256 --k-stages 4 --v-stages 2 --iters 1 \
    >/dev/null 2>&1
"$FKVF" pack "$W/raw.npy" --codebooks "$W/cb.fkvf" -o "$W/a.fkvf" >/dev/null 2>&1
rm -f "$W/raw.npy" "$W/train.npy"
"$FKVF" unpack "$W/a.fkvf" -o "$W/raw.safetensors" >/dev/null 2>&1
echo "# raw $(wc -c <"$W/raw.safetensors") bytes, archive $(wc -c <"$W/a.fkvf") bytes" >&2

# run NAME CMD...: one timed run; its "%e %U %S %M" appended to $W/NAME
run() {
    name=$1
    shift
    rm -f "$W/x.safetensors" "$W/y.safetensors"
    "$TIME" -f "%e %U %S %M" -o "$W/t" "$@" >/dev/null 2>&1
    cat "$W/t" >>"$W/$name"
}
i=0
while [ "$i" -lt "$PAIRS" ]; do
    if [ $((i % 2)) -eq 0 ]; then
        run cp cp "$W/raw.safetensors" "$W/x.safetensors"
        run unpack "$FKVF" unpack "$W/a.fkvf" -o "$W/y.safetensors"
        run cpf dd if="$W/raw.safetensors" of="$W/x.safetensors" bs=1M conv=fsync status=none
    else
        run cpf dd if="$W/raw.safetensors" of="$W/x.safetensors" bs=1M conv=fsync status=none
        run unpack "$FKVF" unpack "$W/a.fkvf" -o "$W/y.safetensors"
        run cp cp "$W/raw.safetensors" "$W/x.safetensors"
    fi
    i=$((i + 1))
done
rm -f "$W/x.safetensors" "$W/y.safetensors"
# per pair: wall and CPU (user + system) ratios; medians; peaks
paste -d' ' "$W/cp" "$W/unpack" "$W/cpf" | awk '
function median(a, n,   i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
    n++
    cw = $1 < 0.01 ? 0.01 : $1; cc = $2 + $3 < 0.01 ? 0.01 : $2 + $3
    w[n] = $5 / cw; c[n] = ($6 + $7) / cc; f[n] = $5 / ($9 < 0.01 ? 0.01 : $9)
    if ($8 > up) up = $8
    if ($4 > cpk) cpk = $4
    printf "pair %d: cp %.2fs (cpu %.2fs, %d KiB)  unpack %.2fs (cpu %.2fs, %d KiB)  ratio wall %.2f cpu %.2f  dd+fsync %.2fs ratio %.2f\n", n, $1, $2 + $3, $4, $5, $6 + $7, $8, w[n], c[n], $9, f[n]
}
END {
    printf "RESULT unpack_vs_cp=%.2f unpack_cpu_vs_cp=%.2f unpack_peak_mib=%.1f cp_peak_mib=%.1f unpack_vs_cp_fsync=%.2f\n", median(w, n), median(c, n), up / 1024, cpk / 1024, median(f, n)
}'
