#!/bin/sh
# Line and branch coverage of libfkvf (gcc --coverage, gcov) over the whole
# ctest suite. Configures its own build directory (build-cov: -O0, tools and
# tests, no benchmarks), runs every test, then runs gcov on the objects of
# libfkvf/src and adds up the counts per source file itself (gcovr / lcov
# are not needed): a line or branch counts as covered when any object that
# compiled it (the static and the shared library, a header inlined into
# several files) executed it.
#
# usage: scripts/coverage.sh [--json] [--no-build] [--no-tests] [-j N] [CTEST_ARGS...]
#   --json      print the figures as JSON instead of a table
#   --no-build  reuse build-cov as it is (no configure, no build)
#   --no-tests  do not run ctest (report the counters already collected)
#   -j N        build and test jobs (default 2)
# Extra arguments go to ctest (e.g. -R test_inject). Without --no-tests the
# old counters are removed first, so the figures are those of this run.
# Needs gcc, gcov, python3. Exit status: that of ctest (figures printed either way).
set -eu
cd "$(dirname "$0")/.."
SRC=$(pwd)
B=${FKVF_COV_DIR:-$SRC/build-cov}
json=0 build=1 tests=1 jobs=2
while [ $# -gt 0 ]; do
    case $1 in
    --json) json=1 ;;
    --no-build) build=0 ;;
    --no-tests) tests=0 ;;
    -j) jobs=$2; shift ;;
    *) break ;;
    esac
    shift
done

if [ "$build" -eq 1 ]; then
    cmake -S "$SRC" -B "$B" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=gcc \
        -DCMAKE_C_FLAGS="--coverage -O0" -DCMAKE_EXE_LINKER_FLAGS=--coverage \
        -DCMAKE_SHARED_LINKER_FLAGS=--coverage -DFKVF_BUILD_BENCH=OFF \
        -DFKVF_BUILD_TOOLS=ON -DFKVF_BUILD_TESTS=ON -DFKVF_SANITIZE=OFF >/dev/null
    cmake --build "$B" -j"$jobs" >"$B/build.log" 2>&1 || { tail -50 "$B/build.log"; exit 1; }
fi

status=0
if [ "$tests" -eq 1 ]; then
    find "$B" -name '*.gcda' -delete
    # install_consumer builds a consumer of the installed library without
    # --coverage, which cannot link the instrumented objects; valgrind_cli runs
    # the CLI tests again, slowly, for memcheck; readme_commands builds and
    # runs its own uninstrumented copy: all three left out.
    ctest --test-dir "$B" -j"$jobs" --output-on-failure \
        -E '^(install_consumer|valgrind_cli|readme_commands)$' "$@" \
        >"$B/ctest.log" 2>&1 || status=$?
    tail -n 30 "$B/ctest.log" >&2
fi

objdirs="$B/libfkvf/CMakeFiles/fkvf_static.dir/src $B/libfkvf/CMakeFiles/fkvf_shared.dir/src"
GCOVJ=$(mktemp -d)
trap 'rm -rf "$GCOVJ"' EXIT
i=0
for d in $objdirs; do
    [ -d "$d" ] || continue
    for f in $(find "$d" -name '*.gcda' | sort); do
        i=$((i + 1))
        # one JSON document per object, on stdout
        (cd "$(dirname "$f")" && gcov --json-format --stdout --branch-probabilities \
            -o "$(dirname "$f")" "$f") >"$GCOVJ/$i.json" 2>/dev/null || true
    done
done
if [ "$i" -eq 0 ]; then
    echo "coverage: no .gcda files under $B/libfkvf: did the tests run?" >&2
    exit 1
fi

python3 - "$SRC/libfkvf/src" "$json" "$GCOVJ" <<'EOF'
import json, os, sys
root, as_json, d = os.path.realpath(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
lines = {}     # file -> {line: count}
branches = {}  # file -> {(line, function, i): count}
for name in sorted(os.listdir(d)):
    text = open(os.path.join(d, name)).read()
    dec = json.JSONDecoder()
    pos = 0
    while pos < len(text):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        doc, pos = dec.raw_decode(text, pos)
        cwd = doc.get("current_working_directory", "")
        for f in doc.get("files", []):
            path = os.path.realpath(os.path.join(cwd, f["file"]))
            if not path.startswith(root + os.sep):
                continue
            rel = os.path.relpath(path, root)
            L = lines.setdefault(rel, {})
            B = branches.setdefault(rel, {})
            for ln in f.get("lines", []):
                n = ln["line_number"]
                L[n] = L.get(n, 0) + ln["count"]
                fn = ln.get("function_name", "")
                for bi, br in enumerate(ln.get("branches", [])):
                    if br.get("throw"):
                        continue
                    k = (n, fn, bi)
                    B[k] = B.get(k, 0) + br["count"]
rows = []
for rel in sorted(lines):
    L, B = lines[rel], branches[rel]
    rows.append((rel, sum(1 for c in L.values() if c > 0), len(L),
                 sum(1 for c in B.values() if c > 0), len(B)))
lh = sum(r[1] for r in rows); lt = sum(r[2] for r in rows)
bh = sum(r[3] for r in rows); bt = sum(r[4] for r in rows)
pct = lambda a, b: 100.0 * a / b if b else 100.0
if as_json:
    out = {"files": [{"file": "libfkvf/src/" + r[0], "lines_hit": r[1], "lines": r[2],
                      "line_pct": round(pct(r[1], r[2]), 2), "branches_hit": r[3],
                      "branches": r[4], "branch_pct": round(pct(r[3], r[4]), 2)} for r in rows],
           "total": {"lines_hit": lh, "lines": lt, "line_pct": round(pct(lh, lt), 2),
                     "branches_hit": bh, "branches": bt, "branch_pct": round(pct(bh, bt), 2)}}
    print(json.dumps(out, indent=1))
else:
    print("%-28s %15s %8s %15s %8s" % ("libfkvf/src", "lines", "%", "branches", "%"))
    for r in rows:
        print("%-28s %7d/%-7d %7.2f%% %7d/%-7d %7.2f%%" % (r[0], r[1], r[2], pct(r[1], r[2]),
                                                        r[3], r[4], pct(r[3], r[4])))
    print("%-28s %7d/%-7d %7.2f%% %7d/%-7d %7.2f%%" % ("TOTAL", lh, lt, pct(lh, lt), bh, bt,
                                                    pct(bh, bt)))
EOF
exit "$status"
