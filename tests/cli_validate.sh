#!/bin/sh
# fkvf validate: --help, exit codes (0 valid, 1 violations, 2 usage or I/O),
# the line format, --json (parses, one object per file), --strict,
# --max-violations, --codebooks, several files at once.
# usage: cli_validate.sh FKVF_BIN SRCDIR
set -u
FKVF=$1
SRC=$2
. "$(dirname "$0")/cli_lib.sh"
C="$SRC/conformance/files"

check help 0 "$FKVF" validate --help
grep_in help "validate \[--strict\]" "$T/out"
grep_in help "Exit status" "$T/out"
check main-help 0 "$FKVF" --help
grep_in main-help "validate \[--strict\]" "$T/out"
check noarg 2 "$FKVF" validate
check badopt 2 "$FKVF" validate --bogus "$C/valid_quad_f16_rope.fkvf"
check maxv-zero 2 "$FKVF" validate --max-violations 0 "$C/valid_quad_f16_rope.fkvf"
check maxv-missing 2 "$FKVF" validate "$C/valid_quad_f16_rope.fkvf" --max-violations
check missing-file 2 "$FKVF" validate "$T/nonexistent.fkvf"
check missing-codebook 2 "$FKVF" validate --codebooks "$T/nonexistent.fkvf" "$C/valid_cbrf.fkvf"
# a --codebooks FILE that is not a codebook file is invalid input (exit 1, as
# verify --codebooks), not a usage error; --json says so in its error object
printf 'not an FKVF file at all, just some text of more than 64 bytes in length......\n' >"$T/junk.fkvf"
check junk-codebook 1 "$FKVF" validate --codebooks "$T/junk.fkvf" "$C/valid_cbrf.fkvf"
check junk-codebook-json 1 "$FKVF" validate --json --codebooks "$T/junk.fkvf" "$C/valid_cbrf.fkvf"
cp "$T/out" "$T/junk.json"
check junk-codebook-json-obj 0 /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); e=d["error"]; assert e["name"]=="FKVF_E_CODEBOOK" and e["class"]=="format", e' "$T/junk.json"

# valid files: exit 0, strict too
check valid 0 "$FKVF" validate "$C/valid_quad_f16_rope.fkvf"
grep_in valid "valid_quad_f16_rope.fkvf: valid" "$T/out"
check valid-strict 0 "$FKVF" validate --strict "$C/valid_ngon_f16.fkvf" "$C/valid_multicommit3.fkvf"
check valid-sample 0 "$FKVF" validate --strict "$SRC/testdata/sample.fkvf"
check valid-cbrf 0 "$FKVF" validate --strict --codebooks "$C/valid_codebook_file.fkvf" "$C/valid_cbrf.fkvf"

# a violation: the line names file, offset, clause and class; exit 1
check padding 1 "$FKVF" validate "$C/padding_before_directory.fkvf"
grep_in padding "padding_before_directory.fkvf: offset 0x[0-9a-f]*: \[clause 4.1\] PADDING: " "$T/out"
grep_in padding "1 violation" "$T/out"
check torn 1 "$FKVF" validate "$C/torn_partial_append.fkvf"
grep_in torn "\[clause 7.2\] TORN" "$T/out"
check hash 1 "$FKVF" validate --codebooks "$C/valid_codebook_file.fkvf" "$C/codebook_hash_mismatch.fkvf"
grep_in hash "\[clause 13.5\] CODEBOOK" "$T/out"
# valid and invalid together: 1, both reported
check mixed 1 "$FKVF" validate "$C/valid_quad_f32.fkvf" "$C/checksum_DESC.fkvf"
grep_in mixed "valid_quad_f32.fkvf: valid" "$T/out"
grep_in mixed "checksum_DESC.fkvf: offset 0x[0-9a-f]*: \[clause 4.6\] CHECKSUM" "$T/out"
# an I/O error wins over violations: 2
check mixed-io 2 "$FKVF" validate "$C/checksum_DESC.fkvf" "$T/nonexistent.fkvf"
# whatever its place (each file still gets its result), with --json too
check mixed-io-first 2 "$FKVF" validate "$T/nonexistent.fkvf" "$C/checksum_DESC.fkvf"
grep_in mixed-io-first "checksum_DESC.fkvf: 1 violation" "$T/out"
check mixed-io-json 2 "$FKVF" validate --json "$T/nonexistent.fkvf" "$C/checksum_DESC.fkvf"
cp "$T/out" "$T/mixed.json"
check mixed-io-json-obj 0 /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); f=d["files"]; assert len(f)==2 and "error" in f[0] and f[1]["valid"] is False and d["error"]["class"]=="environment", d' "$T/mixed.json"

# --json: parses, one entry per file, fields present; --max-violations caps
check json 1 "$FKVF" validate --json --strict "$C/valid_quad_f16_rope.fkvf" "$C/overlap_sections.fkvf"
cp "$T/out" "$T/v.json"
grep_in json '"clause": "4.5"' "$T/v.json"
grep_in json '"class": "OVERLAP"' "$T/v.json"
if command -v python3 >/dev/null 2>&1; then
    check json-parses 0 python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
f = d["files"]
assert d["strict"] is True and len(f) == 2
assert f[0]["valid"] is True and f[0]["violations"] == [] and f[0]["count"] == 0
assert f[1]["valid"] is False and f[1]["count"] == len(f[1]["violations"]) >= 1
v = f[1]["violations"][0]
assert v["clause"] == "4.5" and v["class"] == "OVERLAP" and v["code"] == 28
assert isinstance(v["offset"], int) and v["check"] and v["message"]
assert v["writer_rule"] is False and v["section"] >= 0 and len(v["section_type"]) == 4
' "$T/v.json"
fi
check cap 1 "$FKVF" validate --max-violations 1 --json "$C/overlap_sections.fkvf"
grep_in cap '"count": 1, "capped": true' "$T/out"
check cap-text 1 "$FKVF" validate --max-violations 1 "$C/overlap_sections.fkvf"
grep_in cap-text "stopped at the cap" "$T/out"

# every file of the suite: exit 0 for accept rows, 1 for reject rows (verify mode)
tail -n +2 "$SRC/conformance/manifest.tsv" | while IFS='	' read -r name ver open cls clause digest cb prov; do
    cbo=""
    [ "$cb" = "-" ] || cbo="--codebooks $C/$cb"
    want=1
    [ "$ver" = accept ] && want=0
    # the one accepted row that breaks a writer rule: it pins the split of
    # spec 7.3 (readers accept, --strict reports the invalid earlier commit)
    strict_only=0
    [ "$name" = commit_state_earlier_invalid.fkvf ] && want=1 strict_only=1
    # shellcheck disable=SC2086
    "$FKVF" validate --strict $cbo "$C/$name" >"$T/o" 2>&1
    got=$?
    if [ "$got" -ne "$want" ]; then echo "FAIL suite $name: exit $got, want $want"; cat "$T/o"; echo x >>"$T/suitefail"; fi
    if [ "$strict_only" = 1 ]; then
        grep -q "W-COMMIT-STATE, writer rule" "$T/o" || { echo "FAIL suite $name: no W-COMMIT-STATE"; cat "$T/o"; echo x >>"$T/suitefail"; }
        # shellcheck disable=SC2086
        "$FKVF" validate $cbo "$C/$name" >"$T/o" 2>&1 || { echo "FAIL suite $name: invalid without --strict"; cat "$T/o"; echo x >>"$T/suitefail"; }
        continue
    fi
    # a candidate that fails its own open stops validation with an error
    # line of class CODEBOOK (spec 13.5), not a violation line
    if [ "$want" = 1 ] && ! grep -q "\] $cls: " "$T/o" &&
        ! { [ "$cls" = CODEBOOK ] && grep -q "not a usable codebook file (CODEBOOK, spec 13.5)" "$T/o"; }; then
        echo "FAIL suite $name: no $cls violation"; cat "$T/o"; echo x >>"$T/suitefail"
    fi
done
if [ -s "$T/suitefail" ]; then fails=$((fails + 1)); else pass=$((pass + 1)); fi

finish cli_validate
