#!/bin/sh
# The CLI contract (issue 12, items 10, 11), table-driven over every command:
# the same bad inputs (a file that is not an archive or cache, a path that
# does not exist, a codebook file where an archive or a cache is expected, a
# bad option, a missing argument) give the same exit status everywhere (0 ok,
# 1 invalid input data, 2 usage or environment) and an error line
# "fkvf CMD: FILE: what"; with --json stdout is exactly one JSON object, the
# error object (code, name, class, message, file, offset, clause, field) on failure,
# checked with python3; data faults (a stream or position that does not
# exist, a search without a token stream) are exit 1; every --help states
# the exit statuses.
# usage: cli_exit.sh FKVF_BIN SRCDIR [ADD_SECTION_BIN]
set -u
FKVF=$1
SRC=$2
ADDSEC=${3:-}
CACHE=$SRC/testdata/sample-cache.safetensors
CB=$SRC/conformance/files/valid_codebook_file.fkvf
MANIFEST=$SRC/conformance/manifest.tsv
PY=/usr/bin/python3
. "$(dirname "$0")/cli_lib.sh"
# the scratch directory's name holds the words of the argument templates
# below (NT, OUT, CACHE): their placeholders (%NT, %OUT, %CACHE) must not
# match inside a path (a mktemp name holding "NT" broke 15 cases)
T0=$T
T=$T0/NT-OUT-CACHE
mkdir "$T"
trap 'rm -rf "$T0"' EXIT
Q="--k 16 --k-stages 2 --v-stages 1 --iters 3"
printf 'not an archive, not a cache: just text that is long enough to look at\n' >"$T/junk"
NONE=$T/does-not-exist.fkvf
check setup-pack 0 "$FKVF" pack "$CACHE" -o "$T/a.fkvf" $Q

# The error object on stdout ($T/out, copied first: check rewrites it):
#   jerr NAME EXIT FILE NAME_OR_- CLASS_OR_- [OFFSET CLAUSE]
# asserts: one JSON object, {"error": {...}} or a result object with an
# "error" member; the eight fields; class agrees with the exit status; the
# file; the code's name and class when given; the stderr line carries the
# message.
JERR='
import json, sys
out, err, ex, path, name, cls = sys.argv[1:7]
rest = sys.argv[7:]
text = open(out).read()
d = json.loads(text)  # one JSON value, nothing after it ("Extra data" otherwise)
assert isinstance(d, dict) and text.endswith("}\n"), text
e = d["error"]
assert set(e) == {"code", "name", "class", "message", "file", "offset", "clause", "field"}, e
# the field is the one the message names, never a system call of an I/O error
assert e["field"] is None or (e["field"] + ": ") in e["message"], e
assert e["field"] is None or e["class"] != "environment", e
assert isinstance(e["code"], int) and e["message"], e
ex = int(ex)
assert e["class"] in (("usage", "environment") if ex == 2 else ("format", "input")), (ex, e)
if path != "-":
    assert e["file"] == path, (e["file"], path)
if name != "-":
    assert e["name"] == name, e
if cls != "-":
    assert e["class"] == cls, e
if e["name"].startswith("FKVF_E_") and e["class"] == "format":
    assert 20 <= e["code"] < 50, e
if rest:
    assert e["offset"] == int(rest[0]) and e["clause"] == rest[1], e
else:
    assert e["offset"] is None or isinstance(e["offset"], int), e
stderr = open(err).read()
assert e["message"] in stderr, (e["message"], stderr)
'
jerr() {
    cp "$T/out" "$T/j.out"
    cp "$T/err" "$T/j.err"
    n=$1
    shift
    check "$n-json" 0 "$PY" -c "$JERR" "$T/j.out" "$T/j.err" "$@"
}
# first_line NAME CMD: the first stderr line starts "fkvf CMD: "
first_line() {
    if head -n 1 "$T/err" | grep -q "^fkvf $2: "; then pass=$((pass + 1)); else
        echo "FAIL $1-style: first error line is not 'fkvf $2: ...':"; cat "$T/err"; fails=$((fails + 1)); fi
}

# ---- the table: command, arguments (@ = the input), exit for a junk file,
# ---- a path that does not exist, a codebook file
while read -r cmd args w_junk w_none w_cb; do
    for kind in junk none cb; do
        case $kind in
        junk) X=$T/junk want=$w_junk ;;
        none) X=$NONE want=$w_none ;;
        cb) X=$CB want=$w_cb ;;
        esac
        a=$(printf '%s' "$args" | tr '_' ' ' | sed "s#@#$X#g; s#%OUT#$T/o-$cmd-$kind#g; s#%CACHE#$CACHE#g")
        # shellcheck disable=SC2086
        check "$cmd-$kind" "$want" "$FKVF" $cmd $a
        [ "$want" -eq 0 ] && continue
        first_line "$cmd-$kind" "$cmd"
        grep_in "$cmd-$kind-names-file" "$X" "$T/err"
        # shellcheck disable=SC2086
        check "$cmd-$kind-json" "$want" "$FKVF" $cmd $a --json
        case $kind in
        none) jerr "$cmd-$kind" "$want" "$X" FKVF_E_IO environment ;;
        junk)
            case $cmd in
            pack | train | compare) jerr "$cmd-$kind" "$want" "$X" KVIO_E_FORMAT input ;;
            *) jerr "$cmd-$kind" "$want" "$X" FKVF_E_BAD_MAGIC format 0 3.1 ;;
            esac ;;
        cb) jerr "$cmd-$kind" "$want" "$X" - input ;;
        esac
    done
    # a bad option, a missing argument: 2, usage, FKVF_E_INVALID_ARG
    check "$cmd-badopt" 2 "$FKVF" $cmd --bogus-option
    first_line "$cmd-badopt" "$cmd"
    check "$cmd-badopt-json" 2 "$FKVF" $cmd --bogus-option --json
    jerr "$cmd-badopt" 2 - FKVF_E_INVALID_ARG usage
    check "$cmd-noarg" 2 "$FKVF" $cmd
    first_line "$cmd-noarg" "$cmd"
    check "$cmd-noarg-json" 2 "$FKVF" $cmd --json
    jerr "$cmd-noarg" 2 - FKVF_E_INVALID_ARG usage
    # every --help states the exit statuses
    check "$cmd-help" 0 "$FKVF" $cmd --help
    grep_in "$cmd-help-exit" "Exit status: 0 " "$T/out"
done <<EOF
info @ 1 2 0
verify @ 1 2 0
validate @ 1 2 0
dump @ 1 2 0
pack @_-o_%OUT.fkvf 1 2 1
unpack @_-o_%OUT.safetensors 1 2 1
train @_-o_%OUT.fkvf 1 2 1
compare @_%CACHE 1 2 1
append @_%CACHE 1 2 1
compact @_-o_%OUT.fkvf 1 2 1
recover @ 1 2 0
search @_--tokens_1 1 2 1
context @_--at_0_--len_1 1 2 1
index @ 1 2 1
plot @_--stream_tokens_-o_%OUT.png 1 2 1
EOF
check main-help 0 "$FKVF" --help
grep_in main-help-exit "exit status 0 ok, 1 invalid input data, 2 usage" "$T/out"
check unknown-command 2 "$FKVF" frobnicate
grep_in unknown-command-msg "^fkvf: unknown command 'frobnicate'" "$T/err"
# with --json, an unknown command (or --json alone) is one JSON error object too
for args in "frobnicate --json" "--json"; do
    n=$(echo "$args" | tr -c 'a-z\n' _)
    check "unknown-command-$n" 2 "$FKVF" $args
    cp "$T/out" "$T/uc.json"
    check "unknown-command-$n-obj" 0 "$PY" -c 'import json,sys; e=json.load(open(sys.argv[1]))["error"]; assert e["name"]=="FKVF_E_INVALID_ARG" and e["class"]=="usage" and "unknown command" in e["message"], e' "$T/uc.json"
done

# ---- data faults are invalid input (1), not usage (2) -----------------------
A=$T/a.fkvf
check unpack-npy 0 "$FKVF" unpack "$A" -o "$T/nt.npy"
check pack-no-tokens 0 "$FKVF" pack "$T/nt.npy" -o "$T/nt.fkvf" $Q
while read -r name want ename args; do
    a=$(printf '%s' "$args" | tr '_' ' ' | sed "s#@#$A#g; s#%NT#$T/nt.fkvf#g; s#%OUT#$T/o-$name#g")
    # shellcheck disable=SC2086
    check "$name" "$want" "$FKVF" $a
    first_line "$name" "${a%% *}"
    # shellcheck disable=SC2086
    check "$name-json" "$want" "$FKVF" $a --json
    jerr "$name" "$want" - "$ename" -
done <<EOF
search-no-such-stream 1 FKVF_E_NOT_FOUND search_@_--stream_L99.H0.K.0_--symbols_1
search-no-token-stream 1 FKVF_E_NOT_FOUND search_%NT_--tokens_1,2
context-no-token-stream 1 FKVF_E_NOT_FOUND context_%NT_--at_0_--len_1
context-no-such-stream 1 FKVF_E_NOT_FOUND context_@_--at_0_--len_1_--stream_L0.H9.V.0
context-outside 1 FKVF_E_RANGE context_@_--at_256_--len_2
plot-no-such-stream 1 FKVF_E_NOT_FOUND plot_@_--stream_L99.H0.K.0_-o_%OUT.png
index-no-such-stream 1 FKVF_E_NOT_FOUND index_@_--stream_L99.H0.K.0
search-bad-list 2 FKVF_E_INVALID_ARG search_@_--tokens_1,,2
search-bad-stream-name 2 FKVF_E_INVALID_ARG search_@_--stream_L1.X2_--symbols_1
EOF
check search-no-token-stream-text 1 "$FKVF" search "$T/nt.fkvf" --tokens 1,2
grep_in search-no-token-stream-msg "fkvf search: $T/nt.fkvf: no stream tokens in the archive" "$T/err"
# caches that do not fit: layers 5 x heads 4 read as 4 x 5 (same bytes)
LC_ALL=C sed 's/(5, 2, 4, /(4, 2, 5, /' "$T/nt.npy" >"$T/other-shape.npy"
check compare-shapes 1 "$FKVF" compare "$T/nt.npy" "$T/other-shape.npy" --json
jerr compare-shapes 1 "$T/other-shape.npy" FKVF_E_INVALID_ARG input
check append-positions 1 "$FKVF" append "$A" "$CACHE"
first_line append-positions append
grep_in append-positions-msg "holds positions 0..255" "$T/err"
check append-positions-json 1 "$FKVF" append "$A" "$CACHE" --json
jerr append-positions 1 "$CACHE" FKVF_E_RANGE input
# an archive whose codebook file is not found: invalid input (1); a given
# --codebooks FILE that does not exist: a path that does not exist (2)
mkdir "$T/sub" "$T/cbdir"
check train-cb 0 "$FKVF" train "$CACHE" -o "$T/cbdir/cb.fkvf" $Q
check pack-ext 0 "$FKVF" pack "$CACHE" -o "$T/cbdir/e.fkvf" --codebooks "$T/cbdir/cb.fkvf"
cp "$T/cbdir/e.fkvf" "$T/sub/e.fkvf"
for c in "unpack @ -o $T/sub/u.safetensors" "compact @ -o $T/sub/c.fkvf" "append @ $CACHE --new"; do
    n=${c%% *}
    a=$(printf '%s' "$c" | sed "s#@#$T/sub/e.fkvf#")
    # shellcheck disable=SC2086
    check "$n-cb-not-found" 1 "$FKVF" $a --json
    # the line names the code it is reported with, not the lookup's NOT_FOUND
    if grep -q "FKVF_E_NOT_FOUND" "$T/err"; then
        echo "FAIL $n-cb-not-found-tag: FKVF_E_NOT_FOUND in a FKVF_E_CODEBOOK error:"; cat "$T/err"; fails=$((fails + 1))
    else pass=$((pass + 1)); fi
    jerr "$n-cb-not-found" 1 "$T/sub/e.fkvf" FKVF_E_CODEBOOK format
    # the offset and clause of the lookup's fault (the CBRF section, spec 13.5)
    check "$n-cb-not-found-where" 0 "$PY" -c 'import json,sys; e=json.load(open(sys.argv[1]))["error"]; assert e["clause"]=="13.5" and isinstance(e["offset"], int) and e["offset"] > 0, e' "$T/j.out"
    # a wrong --codebooks FILE (an archive): one "fkvf CMD: ARCHIVE: " prefix,
    # then the library's words
    cn=${c%% *}
    # shellcheck disable=SC2086
    check "$cn-cb-wrong" 1 "$FKVF" $a --codebooks "$SRC/testdata/sample.fkvf"
    grep_in "$cn-cb-wrong-msg" "^fkvf $cn: $T/sub/e.fkvf: $SRC/testdata/sample.fkvf is not a codebook file; expected codebook" "$T/err"
    # shellcheck disable=SC2086
    check "$n-cb-missing-path" 2 "$FKVF" $a --codebooks "$T/nope-cb.fkvf" --json
    jerr "$n-cb-missing-path" 2 "$T/nope-cb.fkvf" FKVF_E_IO environment
done
check verify-cb-missing-path 2 "$FKVF" verify "$T/sub/e.fkvf" --codebooks "$T/nope-cb.fkvf"
check verify-cb-not-a-codebook 1 "$FKVF" verify "$T/sub/e.fkvf" --codebooks "$T/junk"
check verify-cb-wrong 1 "$FKVF" verify "$T/sub/e.fkvf" --codebooks "$SRC/testdata/sample.fkvf"
grep_in verify-cb-wrong-msg "^fkvf verify: $T/sub/e.fkvf: $SRC/testdata/sample.fkvf is not a codebook file; expected codebook" "$T/err"

# ---- dump --json of an optional section whose type is spelled with a quote
# ---- and a backslash (tests/add_section.c): still one valid JSON object
if [ -n "$ADDSEC" ]; then
    cp "$T/a.fkvf" "$T/odd-type.fkvf"
    check add-odd-section 0 "$ADDSEC" "$T/odd-type.fkvf" 'q"\z'
    check dump-odd-type 0 "$FKVF" dump "$T/odd-type.fkvf" --json
    cp "$T/out" "$T/odd.json"
    check dump-odd-type-json 0 "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert any(s["type"] == "q\"\\z" for s in d["sections"]), [s["type"] for s in d["sections"]]' "$T/odd.json"
else
    echo "cli_exit: dump of an odd section type SKIPPED (no add_section binary given)"
fi

# ---- offset and clause as fields: known-corrupt files of the conformance
# ---- suite (class and clause from its manifest, offset from spec 3's table)
for row in "hdr_byte_order.fkvf 16" "hdr_major_2.fkvf 10"; do
    f=${row% *}
    off=${row#* }
    cls=$(awk -F '\t' -v f="$f" '$1 == f { print $4 }' "$MANIFEST")
    clause=$(awk -F '\t' -v f="$f" '$1 == f { print $5 }' "$MANIFEST" | sed 's/^§\([0-9.]*\).*/\1/')
    for c in info verify dump search index; do
        extra=""
        [ $c = search ] && extra="--tokens 1"
        # shellcheck disable=SC2086
        check "$c-$f" 1 "$FKVF" $c "$SRC/conformance/files/$f" $extra --json
        jerr "$c-$f" 1 "$SRC/conformance/files/$f" "FKVF_E_$cls" format "$off" "$clause"
    done
done
# verify keeps its own result object and adds the error object
check verify-own-json 1 "$FKVF" verify --json "$SRC/conformance/files/checksum_STRM_block.fkvf"
cp "$T/out" "$T/v.json"
check verify-own-json-fields 0 "$PY" -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["valid"] is False and d["code"] == 25 and d["message"], d
e = d["error"]
assert e["name"] == "FKVF_E_CHECKSUM" and e["code"] == 25 and e["class"] == "format", e
assert isinstance(e["offset"], int) and e["offset"] > 0 and e["clause"] == "4.6", e
' "$T/v.json"

# ---- --json on success: one JSON object on stdout, for every command ------
# jok NAME EXPR: $T/out is one JSON object d for which EXPR holds
jok() {
    cp "$T/out" "$T/ok.json"
    check "$1-json" 0 "$PY" -c '
import json, sys
text = open(sys.argv[1]).read()
d = json.loads(text)
assert isinstance(d, dict) and text.endswith("}\n"), text
assert eval(sys.argv[2]), (sys.argv[2], d)
' "$T/ok.json" "$2" "${3:-}"
}
check ok-pack 0 "$FKVF" pack "$CACHE" -o "$T/p.fkvf" $Q --json
jok ok-pack 'd["positions"] == 256 and d["exact"] == 36 and d["archived"] == 220 and d["bytes"] > 0 and d["codebooks"] == "embedded" and d["ratio_fp16"] > 0'
check ok-unpack 0 "$FKVF" unpack "$T/p.fkvf" -o "$T/p.npz" --json
jok ok-unpack 'd["positions"] == 256 and d["format"] == "npz" and d["dtype"] == "f16" and d["tokens"] is True and d["out"].endswith("p.npz")'
check ok-train 0 "$FKVF" train "$CACHE" -o "$T/t.fkvf" $Q --json
jok ok-train 'd["k"] == 16 and d["k_stages"] == 2 and d["v_stages"] == 1 and d["layers"] == 5 and len(d["content_hash"]) == 32 and d["caches"] == [sys.argv[3]]' "$CACHE"
check ok-compare 0 "$FKVF" compare "$CACHE" "$T/p.npz" --json
jok ok-compare 'd["positions"] == 256 and d["tokens_identical"] is True'
check ok-plot 0 "$FKVF" plot "$T/p.fkvf" --stream tokens -o "$T/p.png" --size 64 --json
jok ok-plot 'd["points"] == 256 and d["plot"]["size"] == 64 and d["width"] > 64 and d["stream"] == "tokens"'
check ok-search 0 "$FKVF" search "$T/p.fkvf" --tokens 1 --json
jok ok-search 'd["stream"] == "tokens" and "exact" in d'
check ok-context 0 "$FKVF" context "$T/p.fkvf" --at 10 --len 3 --json
jok ok-context 'len(d["symbols"]) == 3 and d["first"] == 8'
check ok-index 0 "$FKVF" index "$T/p.fkvf" --json
jok ok-index 'd["streams"] >= 1 and d["archive"].endswith("p.fkvf")'
check ok-info 0 "$FKVF" info "$T/p.fkvf" --json
jok ok-info 'd["positions"] == 256 and d["error"] is None'
check ok-verify 0 "$FKVF" verify "$T/p.fkvf" --json
jok ok-verify 'd["valid"] is True and d["error"] is None'
check ok-dump 0 "$FKVF" dump "$T/p.fkvf" --json
jok ok-dump 'len(d["sections"]) > 0'
check ok-validate 0 "$FKVF" validate "$T/p.fkvf" --json
jok ok-validate 'd["files"][0]["valid"] is True and d["error"] is None'
check ok-compact 0 "$FKVF" compact "$T/p.fkvf" -o "$T/pc.fkvf" --json
jok ok-compact 'd["commits"] == 1 and d["positions"] == 256'
check ok-recover 0 "$FKVF" recover "$T/pc.fkvf" --json
jok ok-recover 'd["action"] == "none"'
check ok-append 0 "$FKVF" append --create "$T/ap.fkvf" "$CACHE" --exact-only --json
jok ok-append 'd["appended"] == 256 and d["created"] is True'

finish cli_exit
