#!/usr/bin/python3
"""Counts the public functions of fkvf.h that have no documentation.

A function (a line starting with FKVF_API and an opening parenthesis) is
documented when a comment ends on the line right above its declaration,
when it belongs to a run of declarations (no blank line between them) under
a comment that names it, or when a comment follows it on its own line.

The header has two tiers: the stable API, then (after the line that tests
FKVF_STATIC_LINKING_ONLY) the second tier, not ABI-stable. Both count.

usage: api_docs.py HEADER [--list]
Prints "public functions: N, undocumented: M", then the same per tier, and,
with --list, the undocumented names.
"""
import re
import sys


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    lines = open(argv[1], encoding="utf-8").read().split("\n")
    name_re = re.compile(r"\b(fkvf_\w+)\s*\(")
    total = 0
    missing = []
    tier2_at = next((n for n, l in enumerate(lines)
                     if l.startswith("#if") and "FKVF_STATIC_LINKING_ONLY" in l), len(lines))
    per_tier = [[0, 0], [0, 0]]  # [functions, undocumented] of tier 1, tier 2
    i = 0
    while i < len(lines):
        if not lines[i].startswith("FKVF_API"):
            i += 1
            continue
        # the run of declarations this one starts
        run = []
        j = i
        while j < len(lines) and lines[j].strip() and not lines[j].lstrip().startswith("/*"):
            if lines[j].startswith("FKVF_API"):
                m = name_re.search(lines[j])
                if m:
                    run.append((j, m.group(1)))
            j += 1
        above = ""
        k = i - 1
        if k >= 0 and lines[k].rstrip().endswith("*/"):
            while k >= 0:
                above = lines[k] + "\n" + above
                if "/*" in lines[k]:
                    break
                k -= 1
        for idx, (ln, name) in enumerate(run):
            total += 1
            tier = per_tier[1 if ln > tier2_at else 0]
            tier[0] += 1
            trailing = "/*" in lines[ln]
            ok = trailing or bool(above) and (idx == 0 or name in above)
            if not ok:
                missing.append(name)
                tier[1] += 1
        i = j if j > i else i + 1
    print(f"public functions: {total}, undocumented: {len(missing)}")
    print(f"  stable tier: {per_tier[0][0]}, undocumented: {per_tier[0][1]}")
    print(f"  FKVF_STATIC_LINKING_ONLY tier: {per_tier[1][0]}, undocumented: {per_tier[1][1]}")
    if "--list" in argv:
        for n in missing:
            print("  " + n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
