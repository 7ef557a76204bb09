#!/bin/sh
# Checks that run.sh catches wrong readers: runner_selftest.sh READER SUITE_DIR
# (READER: fkvf-conf-read). Uses a two-file copy of the suite.
set -u
reader=$1 suite=$2
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/files"
head -n 1 "$suite/manifest.tsv" >"$tmp/manifest.tsv"
for f in valid_quad_f16_rope.fkvf hdr_bad_magic.fkvf; do
    grep "^$f	" "$suite/manifest.tsv" >>"$tmp/manifest.tsv"
    cp "$suite/files/$f" "$tmp/files/"
done
fails=0
check() { # expected-status pattern impl [runner args]
    want=$1 pat=$2 impl=$3
    shift 3
    out=$(sh "$here/run.sh" --suite "$tmp" --impl "$impl" "$@" 2>&1)
    st=$?
    if [ $st -ne "$want" ] || ! printf '%s\n' "$out" | grep -q -- "$pat"; then
        echo "runner_selftest: FAILED for impl '$impl' (status $st, want $want, pattern '$pat'):"
        printf '%s\n' "$out"
        fails=$((fails + 1))
    fi
}
check 0 '2 passed, 0 failed' "'$reader' {file}"
check 1 'hdr_bad_magic.*FAIL' 'true'
check 1 'crash(' 'kill -SEGV $$'
check 1 'timeout' 'sleep 5' --timeout 1
check 1 'digest 0000000000000000 !=' 'echo digest 0000000000000000; case {file} in *valid*) exit 0;; esac; exit 1'
check 1 'class CHECKSUM != BAD_MAGIC' 'echo class CHECKSUM; case {file} in *valid*) exit 0;; esac; exit 1'
# the reader itself: a candidate codebook file that cannot be read is an
# environment failure (exit 2, no class), not CODEBOOK (spec 13.5, 16.3)
out=$("$reader" --codebooks "$tmp/no-such-codebook.fkvf" "$suite/files/valid_cbrf.fkvf" 2>&1)
st=$?
if [ $st -ne 2 ] || printf '%s\n' "$out" | grep -q '^class '; then
    echo "runner_selftest: FAILED: a missing codebook file gave status $st (want 2, no class):"
    printf '%s\n' "$out"
    fails=$((fails + 1))
fi
[ $fails = 0 ] && echo "runner_selftest: run.sh catches wrong results, crashes, timeouts, digests and classes"
[ $fails = 0 ]
