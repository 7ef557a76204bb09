# Shared by the CLI test scripts (sourced, not run): a scratch directory $T
# removed on exit, pass/fail counters, and the assertions.
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
pass=0
unset FKVF_CODEBOOK_PATH # each test says where codebooks are found
check() { # check NAME EXPECTED_EXIT CMD... (stdout in $T/out, stderr in $T/err)
    name=$1 want=$2
    shift 2
    "$@" >"$T/out" 2>"$T/err"
    got=$?
    if [ "$got" -ne "$want" ]; then
        echo "FAIL $name: exit $got, want $want"; cat "$T/out" "$T/err"; fails=$((fails + 1))
    else
        pass=$((pass + 1))
    fi
}
grep_in() { # grep_in NAME PATTERN FILE
    if grep -q -- "$2" "$3"; then pass=$((pass + 1)); else echo "FAIL $1: '$2' not in $3:"; cat "$3"; fails=$((fails + 1)); fi
}
finish() { # finish SUITE: the closing line and the exit status
    echo "$1: $pass passed, $fails failed"
    [ "$fails" -eq 0 ]
}
