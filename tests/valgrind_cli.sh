#!/bin/sh
# The CLI test scripts with every fkvf, fkvf-mksample and kvc2cache run under
# valgrind memcheck. The scripts take the binary as an argument, so they get
# a wrapper that runs the real one under valgrind with its own log file. Fails
# when a script fails (a memcheck error exits 99, which no check expects) or
# when any log does not end with "ERROR SUMMARY: 0 errors" (also catches runs
# whose exit status no check looks at). Definite and indirect leaks are errors.
#
# usage: valgrind_cli.sh VALGRIND BINDIR SRCDIR [SUITE...]
#   BINDIR: where fkvf, fkvf-mksample, kvc2cache are (the build's tools/)
#   SUITE:  cli_smoke cli_search cli_append cli_pack cli_cachefiles cli_codebooks
#           cli_defaults, run side by side
#           (default: cli_smoke cli_append, as the ctest; cli_pack trains
#           codebooks, which takes minutes under valgrind)
set -u
VG=$1
BIN=$2
SRC=$3
shift 3
[ $# -gt 0 ] || set -- cli_smoke cli_append
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir "$W/bin" "$W/logs"
for b in fkvf fkvf-mksample kvc2cache; do
    [ -x "$BIN/$b" ] || continue
    cat >"$W/bin/$b" <<EOF
#!/bin/sh
log=\$(mktemp "$W/logs/$b.XXXXXX")
exec "$VG" --tool=memcheck --error-exitcode=99 --leak-check=full \\
    --errors-for-leak-kinds=definite,indirect --show-leak-kinds=definite,indirect \\
    --log-file="\$log" "$BIN/$b" "\$@"
EOF
    chmod +x "$W/bin/$b"
done

# the suites run side by side (each is a sequence of short processes)
for s in "$@"; do
    case $s in
    cli_smoke) args="$W/bin/fkvf $W/bin/fkvf-mksample $SRC" ;;
    cli_search | cli_append | cli_pack | cli_cachefiles | cli_codebooks | cli_defaults) args="$W/bin/fkvf $SRC" ;;
    *) echo "valgrind_cli: unknown suite $s"; exit 2 ;;
    esac
    (
        start=$(date +%s)
        # shellcheck disable=SC2086
        sh "$HERE/$s.sh" $args >"$W/$s.out" 2>&1
        echo "$? $(($(date +%s) - start))" >"$W/$s.status"
    ) &
done
wait
failed=0
for s in "$@"; do
    read -r st secs <"$W/$s.status"
    if [ "$st" -eq 0 ]; then
        echo "$s: passed under valgrind (${secs} s): $(tail -n 1 "$W/$s.out")"
    else
        echo "$s: FAILED under valgrind:"
        cat "$W/$s.out"
        failed=$((failed + 1))
    fi
done

runs=0 bad=0
for log in "$W"/logs/*; do
    [ -f "$log" ] || continue
    runs=$((runs + 1))
    if ! grep -q "ERROR SUMMARY: 0 errors" "$log"; then
        bad=$((bad + 1))
        echo "== memcheck errors: $log"
        cat "$log"
    fi
done
echo "valgrind_cli: $runs runs under memcheck, $bad with errors, $failed suites failed"
[ "$runs" -gt 0 ] || { echo "valgrind_cli: nothing ran"; exit 1; }
[ "$bad" -eq 0 ] && [ "$failed" -eq 0 ]
