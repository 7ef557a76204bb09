#!/bin/bash
# bench_compare_quick: bench/compare.sh --quick produces its table: exit 0,
# every row once with all its cells, the same rows in the JSON, the sizes it
# reports equal to the files it kept, and figures (not "-") in the rows this
# build can measure. Structure, not speed: no timing is asserted.
#   tests/bench_compare_quick.sh SOURCE_DIR BUILD_DIR
set -u
src=$1 bin=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/bench_compare_quick.XXXXXX")
trap 'rm -rf "$work"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

if ! bash "$src/bench/compare.sh" --quick --bin "$bin" --keep "$work/data" \
    --json "$work/rows.json" >"$work/table.md" 2>"$work/stderr"; then
    cat "$work/stderr"
    echo "FAIL: compare.sh --quick exited non-zero"
    exit 1
fi

# every row of issue 16's table and of the anchors: measured by compare.sh
# itself (figures expected), or parsed from a bench program's RESULT line
own=(train size.raw size.shared size.codebook size.shared+cb size.embedded size.zstd-3 size.lz4
    size.gzip-6 size.zstd-19 size.xz-6 pack.pos_per_s pack.vs_zstd unpack.vs_cp.wall
    unpack.vs_cp.cpu unpack.vs_zstd unpack.peak)
anchor=(restore_vs_pread restore_vs_memcpy restore_gbps random_us random_vs_pread random_vs_memcpy)
others=(encode_pos_per_s encode_speedup cbload_share cbload_f32_share cbload_layout_share
    live_peak_ratio live_final_ratio append_slowdown zidx_bytes_per_pos search_new_vs_old)

grep -q '^| id | row | FKVF | anchor | ratio or figure, median | min | target | met | notes |$' \
    "$work/table.md" || fail "no table header"
cell() { # cell ID N: the Nth cell (1-based) of row ID
    awk -F' [|] ' -v id="$1" -v n="$2" '$1 == "| " id { print $n }' "$work/table.md"
}
for id in "${own[@]}" "${anchor[@]}" "${others[@]}"; do
    n=$(grep -c "^| $id | " "$work/table.md")
    [ "$n" = 1 ] || { fail "row $id appears $n times"; continue; }
    cells=$(grep "^| $id | " "$work/table.md" | awk -F' [|] ' '{ print NF }')
    [ "$cells" = 9 ] || fail "row $id has $cells cells, not 9"
done
rows=$(grep '^| [a-z]' "$work/table.md" | grep -vc '^| id | ')
want=$((${#own[@]} + ${#anchor[@]} + ${#others[@]}))
[ "$rows" = "$want" ] || fail "$rows rows, expected $want"
for id in "${own[@]}" "${anchor[@]}"; do
    v=$(cell "$id" 5)
    case "$v" in [0-9]*) ;; *) fail "row $id: no figure ('$v')" ;; esac
done
# the byte counts are those of the files compare.sh kept
bytes() { cell "$1" 3 | sed 's/ B$//; s/,//g'; }
[ "$(bytes size.raw)" = "$(stat -c %s "$work/data/cache.npy")" ] || fail "size.raw != cache.npy"
[ "$(bytes size.shared)" = "$(stat -c %s "$work/data/archive.fkvf")" ] ||
    fail "size.shared != archive.fkvf"
[ "$(bytes size.codebook)" = "$(stat -c %s "$work/data/codebooks.fkvf")" ] ||
    fail "size.codebook != codebooks.fkvf"
[ "$(bytes size.embedded)" = "$(stat -c %s "$work/data/embedded.fkvf")" ] ||
    fail "size.embedded != embedded.fkvf"
# the archive it measured restores: fkvf verify passes
"$bin/tools/fkvf" verify "$work/data/archive.fkvf" >/dev/null || fail "archive.fkvf does not verify"
# the JSON holds the same rows, in the same order
/usr/bin/python3 - "$work/rows.json" "$work/table.md" <<'EOF' || fail "JSON differs from the table"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
md = [l.split(" | ")[0][2:] for l in open(sys.argv[2]) if l.startswith("| ") and
      not l.startswith("| id ") and not l.startswith("|---")]
ids = [r["id"] for r in rows]
if ids != md:
    sys.exit("json ids %s != table ids %s" % (ids, md))
EOF
[ $fails = 0 ] || { cat "$work/table.md"; exit 1; }
echo "bench_compare_quick: $rows rows, all present"
