#!/usr/bin/python3
"""Counts the public functions of fkvf.h that have no documentation.

A function (a line starting with FKVF_API and an opening parenthesis) is
documented when a comment ends on the line right above its declaration,
when it belongs to a run of declarations (no blank line between them) under
a comment that names it, or when a comment follows it on its own line.

usage: api_docs.py HEADER [--list]
Prints "public functions: N, undocumented: M" and, with --list, their names.
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
            trailing = "/*" in lines[ln]
            ok = trailing or bool(above) and (idx == 0 or name in above)
            if not ok:
                missing.append(name)
        i = j if j > i else i + 1
    print(f"public functions: {total}, undocumented: {len(missing)}")
    if "--list" in argv:
        for n in missing:
            print("  " + n)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
