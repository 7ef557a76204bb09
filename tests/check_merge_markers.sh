#!/bin/sh
# No file of the repository holds a line a merge left behind ("<<<<<<< "
# or ">>>>>>> " at the start of a line): docs/cli.md carried one from a
# merge of session 20 until it was found. Before the tree, a file with such
# a line is checked and must be found.
# usage: check_merge_markers.sh SRCDIR
set -u
src=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# marked DIR...: the files under DIR... with a merge line (one a line)
marked() {
    find "$@" -type f ! -path '*/.git/*' ! -path '*/build*/*' \
        \( -name '*.md' -o -name '*.[ch]' -o -name '*.sh' -o -name '*.py' -o -name '*.txt' \
        -o -name '*.mjs' -o -name '*.cmake' -o -name '*.tsv' -o -name '*.json' -o -name 'run' \) \
        -exec grep -lE '^(<<<<<<<|>>>>>>>) ' {} +
}
printf 'text\n<<<<<<< HEAD\nmine\n=======\ntheirs\n>>>>>>> branch\n' >"$tmp/self.md"
if [ "$(marked "$tmp")" != "$tmp/self.md" ]; then
    echo "FAIL: the check does not find the merge lines of its own example"
    exit 1
fi
found=$(marked "$src/docs" "$src/spec" "$src/libfkvf" "$src/tools" "$src/tests" "$src/bench" \
    "$src/conformance" "$src/fuzz" "$src/python" "$src/scripts" "$src/examples" "$src/cmake" \
    "$src/.ci" "$src/README.md" "$src/CMakeLists.txt" 2>/dev/null)
if [ -n "$found" ]; then
    echo "FAIL: lines a merge left behind in:"
    echo "$found"
    exit 1
fi
echo "ok: no merge lines"
