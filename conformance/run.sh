#!/bin/sh
# Runs a reader over the FKVF conformance suite (conformance/README.md).
#
#   conformance/run.sh --impl 'CMD {file}' [--timeout S] [--mode verify|open]
#                      [--suite DIR] [--quiet]
#
# {file} is replaced by the path of a suite file, {codebook} by the path of
# the codebook file the manifest names for it (empty when none; rows that
# name one are skipped when the template has no {codebook}). The reader
# exits 0 to accept, 1 to reject; any other status (or the timeout) is a
# crash. It may print "digest HEX" (16 hex digits) when it accepts and
# "class NAME" when it rejects; both are then checked against the manifest.
# Prints a matrix (one line per file) and a summary line; exits 0 when
# every file passed, 1 otherwise, 2 on usage errors.
set -u
here=$(cd "$(dirname "$0")" && pwd)
impl= timeout_s=10 mode=verify suite=$here quiet=0
usage() { echo "usage: $0 --impl 'CMD {file}' [--timeout S] [--mode verify|open] [--suite DIR] [--quiet]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
        --impl) [ $# -ge 2 ] || usage; impl=$2; shift 2 ;;
        --timeout) [ $# -ge 2 ] || usage; timeout_s=$2; shift 2 ;;
        --mode) [ $# -ge 2 ] || usage; mode=$2; shift 2 ;;
        --suite) [ $# -ge 2 ] || usage; suite=$2; shift 2 ;;
        --quiet) quiet=1; shift ;;
        *) usage ;;
    esac
done
[ -n "$impl" ] || usage
case $mode in verify|open) ;; *) usage ;; esac
manifest=$suite/manifest.tsv
[ -r "$manifest" ] || { echo "$0: no manifest at $manifest" >&2; exit 2; }
case $impl in *'{codebook}'*) has_cb=1 ;; *) has_cb=0 ;; esac
cmd=$(printf '%s' "$impl" | sed 's/{file}/"$CONF_FILE"/g; s/{codebook}/"$CONF_CODEBOOK"/g')
if command -v timeout >/dev/null 2>&1; then tmo="timeout $timeout_s"; else tmo=; fi
tab=$(printf '\t')
out=$(mktemp) || exit 2
trap 'rm -f "$out"' EXIT
total=0 pass=0 fail=0 skip=0
[ $quiet = 1 ] || printf '%-40s %-7s %-10s %-7s %-10s %s\n' FILE EXPECT CLASS RESULT GOT NOTE
while IFS=$tab read -r name verify open class clause digest codebook prov; do
    [ "$name" = name ] && continue
    [ -n "$name" ] || continue
    total=$((total + 1))
    if [ "$mode" = verify ]; then expect=$verify; else expect=$open; fi
    cbk=
    if [ "$codebook" != - ]; then
        if [ $has_cb = 0 ]; then
            skip=$((skip + 1))
            [ $quiet = 1 ] || printf '%-40s %-7s %-10s %-7s %-10s %s\n' "$name" "$expect" "$class" SKIP - "needs {codebook}"
            continue
        fi
        cbk=$suite/files/$codebook
    fi
    CONF_FILE=$suite/files/$name CONF_CODEBOOK=$cbk $tmo sh -c "$cmd" >"$out" 2>/dev/null </dev/null
    rc=$?
    # the first "digest HEX" and "class NAME" lines (read without forking)
    got_digest= got_class=
    while IFS= read -r line || [ -n "$line" ]; do
        case $line in
            "digest "*)
                d=${line#digest }
                case $d in
                    *[!0-9a-fA-F]*) ;;
                    ????????????????) [ -n "$got_digest" ] || got_digest=$d ;;
                esac ;;
            "class "*)
                c=${line#class }
                case $c in
                    *[!A-Z_]* | "") ;;
                    *) [ -n "$got_class" ] || got_class=$c ;;
                esac ;;
        esac
    done <"$out"
    case $got_digest in *[A-F]*) got_digest=$(printf '%s' "$got_digest" | tr 'A-F' 'a-f') ;; esac
    note=
    case $rc in
        0) got=accept ;;
        1) got=reject ;;
        124) got=timeout ;;
        *) got="crash($rc)" ;;
    esac
    ok=0
    case $expect:$got in
        accept:accept)
            ok=1
            if [ -n "$got_digest" ] && [ "$digest" != - ] && [ "$got_digest" != "$digest" ]; then
                ok=0 note="digest $got_digest != $digest"
            fi ;;
        reject:reject)
            ok=1
            if [ -n "$got_class" ] && [ "$got_class" != "$class" ]; then
                ok=0 note="class $got_class != $class"
            fi ;;
        either:accept|either:reject) ok=1 ;;
    esac
    if [ $ok = 1 ]; then pass=$((pass + 1)); res=PASS; else fail=$((fail + 1)); res=FAIL; fi
    if [ $quiet = 0 ] || [ $ok = 0 ]; then
        printf '%-40s %-7s %-10s %-7s %-10s %s\n' "$name" "$expect" "$class" "$res" "$got${got_class:+ $got_class}" "$note"
    fi
done <"$manifest"
echo "conformance ($mode): $total files, $pass passed, $fail failed, $skip skipped"
[ $fail = 0 ] && [ $total -gt 0 ]
