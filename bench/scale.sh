#!/bin/bash
# bench/scale.sh: FKVF's cost against positions at three model shapes, with
# its anchors in the same run (bench/README.md "scale.sh").
#
#   bench/scale.sh [--quick] [--bin DIR | --build DIR] [--shapes LIST]
#                  [--positions LIST] [--runs N] [--threads-all N]
#                  [--json FILE] [--png FILE] [--keep DIR] [--max-disk-gb G]
#
# Shapes (layers x KV heads x head dim, f16): gpt2 12x12x64, llama8b
# 32x8x128, llama70b 80x8x128. Per shape one codebook is trained (fkvf train
# --k 256 --iters 5 on the first min(P, 4096) positions of the first cache,
# once at 1 thread and once at all threads); per (shape, positions) a
# synthetic cache is written with bench/mkcache.py and removed after, and
# these commands run, in alternating pairs with their anchors:
#   pack     fkvf pack --codebooks         vs  zstd -3 -T0 of the same .npy
#   unpack   fkvf unpack (to .npy; fsyncs) vs  cp + sync of the copy
#   verify   fkvf verify --codebooks       (no anchor)
#   restore  bench_restore ARCHIVE restore 0 P 1: fkvf_reader_restore of
#            every position into memory    vs  dd of the .npy to /dev/null
#                                              (bs=16M, page cache warm)
#   read     bench_restore ARCHIVE read FIRST 1 101: one random archived
#            position, all layers and heads, K and V (median of 101 calls)
# pack, unpack, verify and restore at 1 and ALL threads (restore:
# bench_restore with FKVF_THREADS); read runs on one thread. When BIN has
# bench/bench_anchor, it also runs once per (shape, positions) (in-process pairs: pread + memcpy of the
# raw bytes vs restore, one position vs one row's pread) and its wall ratios
# fill the "in-process" column of the restore and read rows.
#   --quick           smoke test: 2 layers (4 for llama70b), positions
#                     256,512, 2 pairs, k 64 and 2 iterations (structure,
#                     not speed)
#   --bin DIR         use DIR/tools/fkvf and DIR/bench/*, build nothing
#   --build DIR       the build directory to configure and build (Release;
#                     default build-bench in the repository)
#   --shapes LIST     comma-separated, of gpt2,llama8b,llama70b (all)
#   --positions LIST  comma-separated position counts (4096,16384,32768)
#   --runs N          pairs per row (3)
#   --threads-all N   the "all threads" count (nproc)
#   --json FILE       also write the rows as JSON
#   --png FILE        also plot wall time and peak RSS against positions
#                     (needs matplotlib in /usr/bin/python3; else skipped)
#   --keep DIR        work (and keep the records) in DIR instead of a
#                     temporary directory under $TMPDIR removed at the end;
#                     the caches are removed either way
#   --max-disk-gb G   never use more than G GB of disk at once: a (shape,
#                     positions) whose files would not fit in min(G, free
#                     space) is a "skipped (disk)" row
# Needs /usr/bin/python3 with numpy, GNU time at /usr/bin/time, zstd, cmake.
# Per-command timings: wall from bash's EPOCHREALTIME around the command
# (process start included), user, system and peak RSS from /usr/bin/time -f
# "%U %S %M"; the restore and read walls are the seconds per call that
# bench_restore prints (restore: one call after a warm-up; read: the median
# of 101), the process start and open not included.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
py=/usr/bin/python3
TIME=/usr/bin/time

quick=0 bin="" build="$root/build-bench" shapes="gpt2,llama8b,llama70b"
positions="" runs="" tall="" json="" png="" keep="" maxgb=""
usage() {
    sed -n '6,8p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --bin | --build | --shapes | --positions | --runs | --threads-all | --json | --png | \
            --keep | --max-disk-gb)
            [ $# -ge 2 ] || usage
            v=$2
            case "$1" in
                --bin) bin=$v ;; --build) build=$v ;; --shapes) shapes=$v ;;
                --positions) positions=$v ;; --runs) runs=$v ;; --threads-all) tall=$v ;;
                --json) json=$v ;; --png) png=$v ;; --keep) keep=$v ;; --max-disk-gb) maxgb=$v ;;
            esac
            shift ;;
        -h | --help) sed -n '2,53p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "scale.sh: unknown argument '$1'" >&2; usage ;;
    esac
    shift
done
count_ok() { case "$1" in "" | *[!0-9]* | 0*) return 1 ;; esac; }
if [ $quick = 1 ]; then
    : "${positions:=256,512}" "${runs:=2}"
    k=64 iters=2
else
    : "${positions:=4096,16384,32768}" "${runs:=3}"
    k=256 iters=5
fi
: "${tall:=$(nproc)}"
for n in "$runs" "$tall"; do
    count_ok "$n" || { echo "scale.sh: '$n' is not a count" >&2; exit 2; }
done
IFS=, read -r -a plist <<<"$positions"
IFS=, read -r -a slist <<<"$shapes"
for p in "${plist[@]}"; do
    count_ok "$p" || { echo "scale.sh: '$p' is not a position count" >&2; exit 2; }
    [ "$p" -gt 64 ] || { echo "scale.sh: $p positions: at least 65 (4 sinks, 32 recent)" >&2; exit 2; }
done
if [ -n "$maxgb" ]; then
    case "$maxgb" in "" | *[!0-9.]* | *.*.*) echo "scale.sh: --max-disk-gb '$maxgb' is not a number" >&2; exit 2 ;; esac
fi
# shape NAME -> "layers heads dim"
shape_dims() {
    case "$1" in
        gpt2) echo "12 12 64" ;;
        llama8b) echo "32 8 128" ;;
        llama70b) echo "80 8 128" ;;
        *) return 1 ;;
    esac
}
for s in "${slist[@]}"; do
    shape_dims "$s" >/dev/null || { echo "scale.sh: unknown shape '$s' (gpt2, llama8b, llama70b)" >&2; exit 2; }
done
[ -x "$TIME" ] || { echo "scale.sh: needs GNU time at $TIME" >&2; exit 2; }
command -v zstd >/dev/null || { echo "scale.sh: needs zstd" >&2; exit 2; }

if [ -z "$bin" ]; then
    if [ ! -f "$build/CMakeCache.txt" ]; then
        cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFKVF_BUILD_BENCH=ON >&2
    fi
    nice cmake --build "$build" -j2 --target fkvf bench_restore >&2
    # optional: the in-process pread anchor
    if [ -f "$root/bench/bench_anchor.c" ] && ! nice cmake --build "$build" -j2 --target bench_anchor >&2; then
        echo "scale.sh: bench_anchor did not build; no in-process column" >&2
        rm -f "$build/bench/bench_anchor"
    fi
    bin=$build
fi
fkvf=$bin/tools/fkvf
brestore=$bin/bench/bench_restore
banchor=$bin/bench/bench_anchor
[ -x "$fkvf" ] || { echo "scale.sh: no $fkvf" >&2; exit 2; }
[ -x "$brestore" ] || { echo "scale.sh: no $brestore (cmake --build $bin --target bench_restore)" >&2; exit 2; }
[ -x "$banchor" ] || { echo "scale.sh: no $banchor: the in-process column stays empty" >&2; banchor=""; }

if [ -n "$keep" ]; then
    mkdir -p "$keep"
    dir=$(cd "$keep" && pwd)
    trap 'rm -f "$dir"/*.npy "$dir"/*.zst "$dir"/*.fkvf "$dir"/x.*' EXIT
else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/fkvf-scale.XXXXXX")
    trap 'rm -rf "$dir"' EXIT
fi
rec=$dir/records.tsv   # shape layers heads dim positions cmd threads pair wall user sys rss_kib bytes
ext=$dir/anchor.tsv    # shape positions key value (bench_anchor RESULT fields, skips)
: >"$rec"
: >"$ext"
log=$dir/log
RANDOM=1   # the random positions of the read rows, the same every run

say() { echo "scale: $*" >&2; }
fail() {
    say "FAILED: $*"
    tail -n 20 "$log" >&2 || true
    exit 1
}
# timed SHAPE P CMD THREADS PAIR BYTES -- COMMAND...: one run under
# /usr/bin/time, one record; the command's stdout in $dir/out
timed() {
    local s=$1 p=$2 c=$3 th=$4 pair=$5 bytes=$6
    shift 7
    local t0 t1 w u sy m
    t0=${EPOCHREALTIME:-}
    "$TIME" -f "%e %U %S %M" -o "$dir/t" "$@" >"$dir/out" 2>"$log" || fail "$c: $*"
    t1=${EPOCHREALTIME:-}
    read -r w u sy m <"$dir/t"
    # wall to the microsecond where bash has EPOCHREALTIME (5.0 on), else
    # %e (10 ms); it includes starting the process
    [ -z "$t0" ] || w=$(awk -v a="${t0/,/.}" -v b="${t1/,/.}" 'BEGIN { printf "%.6f", b - a }')
    # a command that prints its own wall (bench_restore: seconds per call)
    if [ "$c" = restore ] || [ "$c" = read ]; then
        local reps=1 own
        [ "$c" = restore ] || reps=101
        own=$(tail -n 1 "$dir/out")
        # CPU per call: the process's, over the warm-up and timed calls
        # (an upper bound: it includes opening and the codebook load)
        u=$(awk -v u="$u" -v r="$reps" 'BEGIN { printf "%.6f", u / (r + 1) }')
        sy=$(awk -v s="$sy" -v r="$reps" 'BEGIN { printf "%.6f", s / (r + 1) }')
        w=$own
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "$L" "$H" "$D" "$p" "$c" "$th" \
        "$pair" "$w" "$u" "$sy" "$m" "$bytes" >>"$rec"
}
# skip SHAPE P WHY [KEY]: a skipped (shape, positions) (KEY "skipped"), or
# a part of it (KEY "note")
skip() {
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "${4:-skipped}" "$3" >>"$ext"
    say "$1 $2 positions: skipped ($3)"
}
# free bytes where the files go, capped by --max-disk-gb
disk_free() {
    local free
    free=$(df -Pk "$dir" | awk 'NR == 2 { print $4 * 1024 }')
    if [ -n "$maxgb" ]; then
        awk -v f="$free" -v g="$maxgb" 'BEGIN { c = g * 1e9; printf "%.0f\n", f < c ? f : c }'
    else
        echo "$free"
    fi
}
mem_avail() { awk '/^MemAvailable:/ { print $2 * 1024 }' /proc/meminfo; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }
# pairs CMD THREADS BYTES ANCHOR ANCHOR_BYTES -- FKVF_CMD... -- ANCHOR_CMD...:
# RUNS alternating pairs (anchor first in even pairs), outputs removed
# before each command ($dir/x.* are every command's outputs)
pairs() {
    local c=$1 th=$2 bytes=$3 an=$4 abytes=$5
    shift 6
    local f=() a=()
    while [ "$1" != -- ]; do f+=("$1"); shift; done
    shift
    a=("$@")
    local i=0
    while [ $i -lt "$runs" ]; do
        rm -f "$dir"/x.*
        if [ $((i % 2)) -eq 0 ]; then
            [ ${#a[@]} -eq 0 ] || timed "$shape" "$P" "$an" "$th" $i "$abytes" -- "${a[@]}"
            rm -f "$dir"/x.*
            timed "$shape" "$P" "$c" "$th" $i "$bytes" -- "${f[@]}"
        else
            timed "$shape" "$P" "$c" "$th" $i "$bytes" -- "${f[@]}"
            rm -f "$dir"/x.*
            [ ${#a[@]} -eq 0 ] || timed "$shape" "$P" "$an" "$th" $i "$abytes" -- "${a[@]}"
        fi
        i=$((i + 1))
    done
    rm -f "$dir"/x.*
}

threads=(1)
[ "$tall" -eq 1 ] || threads+=("$tall")
say "$(date -u +%FT%TZ), $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), bin $bin, $(nproc) CPUs, threads ${threads[*]}, load $(cut -d' ' -f1-3 /proc/loadavg)"
t_start=$(date +%s)
npy=$dir/cache.npy
arch=$dir/a.fkvf
cb=$dir/cb.fkvf
for shape in "${slist[@]}"; do
    read -r L H D <<<"$(shape_dims "$shape")"
    if [ $quick = 1 ]; then
        L=$([ "$shape" = llama70b ] && echo 4 || echo 2)
    fi
    rowb=$((L * 2 * H * D * 2)) # fp16 bytes of one position
    rm -f "$cb"
    for P in "${plist[@]}"; do
        raw=$((rowb * P))
        # the cache, one output of the same size (unpack's, cp's or zstd's),
        # the archive and codebook (well under a quarter), a margin
        need=$(awk -v r="$raw" 'BEGIN { printf "%.0f\n", r * 2.3 + 64 * 1048576 }')
        free=$(disk_free)
        if ! ge "$free" "$need"; then
            skip "$shape" "$P" "disk: needs $((need / 1048576)) MiB, $((free / 1048576)) MiB usable"
            continue
        fi
        say "$shape (${L}x${H}x${D}) $P positions: bench/mkcache.py, $((raw / 1048576)) MiB"
        rm -f "$npy"
        nice "$py" "$here/mkcache.py" -o "$npy" --layers "$L" --heads "$H" --dim "$D" \
            --positions "$P" >"$log" 2>&1 || fail "mkcache.py"
        if [ ! -f "$cb" ]; then
            # once per shape: the first min(P, 4096) positions of this cache
            tp=$((P < 4096 ? P : 4096))
            "$py" - "$npy" "$dir/train.npy" "$tp" <<'EOF' || fail "training slice"
import sys
import numpy as np
src = np.load(sys.argv[1], mmap_mode="r")
n = int(sys.argv[3])
out = np.lib.format.open_memmap(sys.argv[2], mode="w+", dtype=src.dtype,
                                shape=src.shape[:3] + (n,) + src.shape[4:])
for layer in range(src.shape[0]):   # one layer at a time: bounded memory
    out[layer] = src[layer, :, :, :n]
out.flush()
EOF
            say "$shape: fkvf train --k $k --iters $iters on $tp positions"
            for th in "${threads[@]}"; do
                rm -f "$dir/cb$th.fkvf"
                timed "$shape" "$tp" train "$th" 0 $((rowb * tp)) -- \
                    "$fkvf" train "$dir/train.npy" -o "$dir/cb$th.fkvf" --k "$k" --iters "$iters" \
                    --threads "$th"
            done
            if [ "$tall" -ne 1 ] && ! cmp -s "$dir/cb1.fkvf" "$dir/cb$tall.fkvf"; then
                fail "train: the codebooks of 1 and $tall threads differ"
            fi
            mv "$dir/cb1.fkvf" "$cb"
            rm -f "$dir"/cb[0-9]*.fkvf "$dir/train.npy"
        fi
        for th in "${threads[@]}"; do
            say "$shape $P: pack vs zstd -3 -T0, $th thread(s)"
            pairs pack "$th" "$raw" "zstd -3 -T0" "$raw" -- \
                "$fkvf" pack "$npy" --codebooks "$cb" -o "$dir/x.fkvf" --threads "$th" -- \
                zstd -3 -T0 -q -f "$npy" -o "$dir/x.zst"
        done
        rm -f "$arch"
        "$fkvf" pack "$npy" --codebooks "$cb" -o "$arch" >"$log" 2>&1 || fail "pack"
        abytes=$(wc -c <"$arch")
        printf '%s\t%s\tarchive_bytes\t%s\n' "$shape" "$P" "$abytes" >>"$ext"
        printf '%s\t%s\tcodebook_bytes\t%s\n' "$shape" "$P" "$(wc -c <"$cb")" >>"$ext"
        for th in "${threads[@]}"; do
            say "$shape $P: unpack vs cp + sync, $th thread(s)"
            # shellcheck disable=SC2016 # $1 and $2 are sh -c's
            pairs unpack "$th" "$raw" "cp + sync" "$raw" -- \
                "$fkvf" unpack "$arch" --codebooks "$cb" -o "$dir/x.npy" --threads "$th" -- \
                sh -c 'cp "$1" "$2" && sync "$2"' sh "$npy" "$dir/x.copy"
        done
        for th in "${threads[@]}"; do
            say "$shape $P: verify, $th thread(s)"
            pairs verify "$th" "$raw" "" 0 -- "$fkvf" verify "$arch" --codebooks "$cb" \
                --threads "$th" --
        done
        # into memory: the output buffer (bench_restore), twice for bench_anchor
        if ge "$(mem_avail)" "$(awk -v r="$raw" 'BEGIN { print r * 1.2 + 268435456 }')"; then
            for th in "${threads[@]}"; do
                say "$shape $P: restore vs dd, $th thread(s)"
                pairs restore "$th" "$raw" "pread (dd)" "$raw" -- \
                    env FKVF_THREADS="$th" "$brestore" "$arch" restore 0 "$P" 1 -- \
                    dd if="$npy" of=/dev/null bs=16M status=none
            done
        else
            skip "$shape" "$P" "restore: $((raw / 1048576)) MiB do not fit in memory" note_restore
        fi
        say "$shape $P: one random position"
        i=0
        while [ $i -lt "$runs" ]; do
            first=$((4 + (RANDOM * 32768 + RANDOM) % (P - 36)))
            timed "$shape" "$P" read 1 $i "$rowb" -- "$brestore" "$arch" read "$first" 1 101
            i=$((i + 1))
        done
        if [ -n "$banchor" ] && ! ge "$(mem_avail)" "$(awk -v r="$raw" 'BEGIN { print r * 2.4 + 268435456 }')"; then
            skip "$shape" "$P" "bench_anchor: 2 x $((raw / 1048576)) MiB do not fit in memory" note_anchor
        elif [ -n "$banchor" ]; then
            say "$shape $P: bench_anchor (in-process pread anchor)"
            "$banchor" "$npy" "$arch" --codebooks "$cb" --pairs "$((runs < 3 ? 3 : runs))" \
                --reads 200 >"$dir/out" 2>"$log" || fail "bench_anchor"
            grep '^RESULT ' "$dir/out" | tail -n 1 | tr ' ' '\n' | grep '=' |
                awk -F= -v s="$shape" -v p="$P" '{ printf "%s\t%s\t%s\t%s\n", s, p, $1, $2 }' >>"$ext"
        fi
        rm -f "$npy" "$arch" "$dir"/x.*
    done
    rm -f "$cb"
done
t_end=$(date +%s)
say "done $(date -u +%FT%TZ) ($((t_end - t_start)) s), load $(cut -d' ' -f1-3 /proc/loadavg)"

args=(--records "$rec" --extra "$ext" --threads-all "$tall" --runs "$runs"
    --meta "commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
    --meta "date=$(date -u +%FT%TZ)" --meta "seconds=$((t_end - t_start))"
    --meta "quick=$quick" --meta "cpus=$(nproc)" --meta "k=$k" --meta "iters=$iters")
[ -z "$json" ] || args+=(--json "$json")
[ -z "$png" ] || args+=(--png "$png")
"$py" "$here/scale_report.py" "${args[@]}"
