#!/bin/sh
# fkvf unpack writes the same bytes, exit status and messages as before it
# streamed (issue 16 row 2): every archive of the set below, unpacked to
# .safetensors, .npz and .npy with each --dtype and with the default, Hugging
# Face and positions-first names/layouts, against the table
# tests/unpack_expected.tsv (archive, options, exit status, SHA-256 of the
# output or '-' when there is none, SHA-256 of stderr with the scratch path
# replaced by $T and the source tree's by $SRC, so that the table holds
# in any checkout). The table was recorded with the fkvf of main before the
# change (commit e80c818, which built the whole cache in memory and wrote
# it with kvio_write):
#   sh tests/cli_unpack.sh OLD_FKVF SRCDIR --record > tests/unpack_expected.tsv
# A failure also leaves no output and no temporary file behind. Every other
# line unpacks in small chunks (FKVF_TEST_UNPACK_CHUNK): a group of layers a
# pass, a position a chunk; the bytes must not change.
# usage: cli_unpack.sh FKVF_BIN SRCDIR [--record]
set -u
FKVF=$1
SRC=$2
REC=${3:-}
. "$(dirname "$0")/cli_lib.sh"
CF=$SRC/conformance/files
EXPECTED=$SRC/tests/unpack_expected.tsv
command -v sha256sum >/dev/null || { echo "SKIP: no sha256sum"; exit 77; }

# the archives: the bundled sample and every readable conformance archive
# (GQA, pooled, f16/bf16/f32, RoPE or not, key_dim != value_dim, 0 and 1
# positions, all exact, 32-bit tokens, several commits, an external codebook)
ARCHIVES="testdata/sample.fkvf"
for f in valid_quad_f16_rope valid_ngon_f16 valid_quad_f32 valid_quad_bf16_pooled valid_deflate \
    valid_multicommit3 valid_cbrf valid_tokens32_block64 edge_no_positions edge_one_position \
    edge_window_only edge_window_gt_cache edge_no_tokens_no_meta edge_max_strings edge_max_stages \
    edge_k4096 valid_appender_4commits valid_zidx future_minor_optional future_optional_section \
    codebook_hash_mismatch codebook_wrong_file; do
    ARCHIVES="$ARCHIVES conformance/files/$f.fkvf"
done

hash_of() { if [ -e "$1" ]; then sha256sum <"$1" | cut -c1-64; else echo -; fi; }

# FKVF_TEST_SPARSE=1 (the sanitizer run of scripts/test.sh, where every fkvf
# run costs several times more): every third line of the table (each
# archive, format and option still met across the lines); the plain build
# runs them all
SPARSE=${FKVF_TEST_SPARSE:-0}
k=0 ran=0

# one ARCHIVE EXT OPTIONS...: one line of the table for this unpack
one() {
    a=$1 ext=$2
    shift 2
    k=$((k + 1))
    if [ "$SPARSE" = 1 ] && [ -z "$REC" ] && [ $((k % 3)) -ne 1 ]; then return; fi
    ran=$((ran + 1))
    rm -f "$T"/o.* "$T"/o.*.tmp-*
    cb=
    case $a in *valid_cbrf*|*codebook_*) cb="--codebooks $CF/valid_codebook_file.fkvf" ;; esac
    # every other line in small chunks (FKVF_TEST_UNPACK_CHUNK, bytes a
    # chunk; docs/testing.md): layers a pass at a time, several passes,
    # chunks of one position; the same bytes
    chunk=0
    [ $((k % 2)) -eq 0 ] && chunk=$(((k / 2) % 5 * 700 + 1))
    # shellcheck disable=SC2086
    FKVF_TEST_UNPACK_CHUNK=$chunk "$FKVF" unpack "$SRC/$a" -o "$T/o.$ext" $cb "$@" \
        >"$T/out" 2>"$T/err"
    rc=$?
    sed -e "s|$T|\$T|g" -e "s|$SRC|\$SRC|g" "$T/err" >"$T/err.n"
    opts=$(echo "$ext $*" | tr ' ' ,)
    line="$a	$opts	$rc	$(hash_of "$T/o.$ext")	$(hash_of "$T/err.n")"
    if [ -n "$REC" ]; then
        echo "$line"
        return
    fi
    want=$(awk -F'\t' -v a="$a" -v o="$opts" '$1 == a && $2 == o' "$EXPECTED")
    if [ "$line" = "$want" ]; then
        pass=$((pass + 1))
    else
        echo "FAIL $a $opts:"; echo " got  $line"; echo " want $want"; cat "$T/err"
        fails=$((fails + 1))
    fi
    left=$(ls "$T" | grep -c 'tmp-' || true)
    if [ "$rc" -ne 0 ] && { [ -e "$T/o.$ext" ] || [ "$left" -ne 0 ]; }; then
        echo "FAIL $a $opts: exit $rc left a file behind:"; ls "$T"; fails=$((fails + 1))
    fi
}

for a in $ARCHIVES; do
    for ext in safetensors npz npy; do
        for dt in "" "--dtype f16" "--dtype bf16" "--dtype f32"; do
            # shellcheck disable=SC2086
            one "$a" "$ext" $dt
            # shellcheck disable=SC2086
            one "$a" "$ext" $dt --hf --layout nhd
            if [ "$a" = testdata/sample.fkvf ]; then
                for nl in "--names fkvf" "--names hf" "--layout hnd" "--layout nhd" \
                    "--names fkvf --layout nhd" "--names hf --layout hnd"; do
                    # shellcheck disable=SC2086
                    one "$a" "$ext" $dt $nl
                done
            fi
        done
    done
done
[ -n "$REC" ] && exit 0
# a write that fails half-way (the file size limit; SIGXFSZ ignored, so the
# write returns EFBIG): exit 2, the file and byte offset named, no output
# and no temporary file left
for ext in safetensors npz npy; do
    rm -f "$T"/o.*
    (trap '' XFSZ; ulimit -f 40; exec "$FKVF" unpack "$SRC/testdata/sample.fkvf" -o "$T/o.$ext") \
        >"$T/out" 2>"$T/err"
    rc=$?
    if [ "$rc" -eq 2 ]; then pass=$((pass + 1)); else
        echo "FAIL efbig-$ext: exit $rc, want 2"; cat "$T/err"; fails=$((fails + 1)); fi
    grep_in "efbig-$ext" "o.$ext.*at byte offset [0-9]* failed: File too large" "$T/err"
    if ls "$T" | grep -q '^o\.'; then echo "FAIL efbig-$ext: left"; ls "$T"; fails=$((fails + 1)); fi
done
n_extra=6
# the table covers every line asked for (none skipped by a mismatch of names)
n=$(wc -l <"$EXPECTED")
[ "$k" -eq "$n" ] || { echo "FAIL: $k lines asked for, the table has $n"; fails=$((fails + 1)); }
if [ "$pass" -ne $((ran + n_extra)) ] && [ "$fails" -eq 0 ]; then
    echo "FAIL: $pass of $ran lines matched (the table has $n)"; fails=$((fails + 1))
fi
finish cli_unpack
