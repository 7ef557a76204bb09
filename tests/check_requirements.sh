#!/bin/sh
# spec/requirements.md must keep up with spec/fkvf-v1.md and validate.c:
#  1. every clause of the spec with a requirement word (MUST, SHALL, REQUIRED
#     outside `code`, or a "reject" rule, spec 2.4) has a row in the inventory;
#  2. every clause the inventory names exists in the spec;
#  3. every check id the validator reports is in the inventory, and every
#     check id the inventory names is one the validator reports.
# usage: check_requirements.sh SRCDIR
set -u
SRC=$1
SPEC="$SRC/spec/fkvf-v1.md"
INV="$SRC/spec/requirements.md"
VAL="$SRC/libfkvf/src/validate/validate.c"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
pass=0

# clauses of the spec (headings "## 4. ...", "### 4.1 ...", "#### 12.2.1 ...")
awk '/^##+ [0-9]/ { c = $2; sub(/\.$/, "", c); print c }' "$SPEC" | sort -u >"$T/clauses"
# clauses with a requirement word: text outside backticks
awk '
    /^##+ [0-9]/ { c = $2; sub(/\.$/, "", c); next }
    {
        t = $0
        gsub(/`[^`]*`/, "", t)
        if (c != "" && (t ~ /(^|[^A-Za-z])(MUST|SHALL|REQUIRED)([^A-Za-z]|$)/ || t ~ /(^|[^A-Za-z])reject/))
            print c
    }' "$SPEC" | sort -u >"$T/need"
# clauses of the inventory: first cell of the table rows
sed -n 's/^| \([0-9][0-9.]*\) |.*/\1/p' "$INV" | sort -u >"$T/have"

missing=$(comm -23 "$T/need" "$T/have")
if [ -n "$missing" ]; then
    echo "FAIL: clauses with requirements missing from spec/requirements.md:" $missing
    fails=$((fails + 1))
else
    pass=$((pass + 1))
fi
unknown=$(comm -13 "$T/clauses" "$T/have")
if [ -n "$unknown" ]; then
    echo "FAIL: spec/requirements.md names clauses the spec does not have:" $unknown
    fails=$((fails + 1))
else
    pass=$((pass + 1))
fi
# at least the clauses known today (guards against an empty extraction)
n_need=$(wc -l <"$T/need")
if [ "$n_need" -lt 60 ]; then
    echo "FAIL: only $n_need clauses with requirements found in the spec"; fails=$((fails + 1))
else
    pass=$((pass + 1))
fi

# check ids: string literals "ABC-DEF" in validate.c, tokens in the inventory
grep -o '"[A-Z][A-Z0-9]*\(-[A-Z0-9]\{1,\}\)\{1,\}"' "$VAL" | tr -d '"' | sort -u >"$T/ids_val"
sed -n 's/^| [0-9][0-9.]* |.*| \([^|]*\) |$/\1/p' "$INV" |
    grep -o '[A-Z][A-Z0-9]*\(-[A-Z0-9]\{1,\}\)\{1,\}' | grep -v -x 'UTF-8\|XXH3-64\|XXH3-128' |
    sort -u >"$T/ids_inv"
a=$(comm -23 "$T/ids_val" "$T/ids_inv")
b=$(comm -13 "$T/ids_val" "$T/ids_inv")
if [ -n "$a" ] || [ -n "$b" ]; then
    [ -n "$a" ] && echo "FAIL: check ids of validate.c not in spec/requirements.md:" $a
    [ -n "$b" ] && echo "FAIL: check ids in spec/requirements.md that validate.c does not report:" $b
    fails=$((fails + 1))
else
    pass=$((pass + 1))
fi
echo "requirements_inventory: $pass passed, $fails failed ($n_need clauses with requirements)"
[ "$fails" -eq 0 ]
