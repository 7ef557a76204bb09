#!/usr/bin/env python3
"""Compare the second reader with libfkvf on seeded random archives.

    compare_random.py --gen PATH/fkvf-conf-rand --read PATH/fkvf-conf-read
                      [--count N] [--seed S] [--flips F] [--keep DIR]

fkvf-conf-rand writes N random valid archives with the libfkvf writer;
for each, libfkvf (fkvf-conf-read, verify and --open) and this reader
(verify and open) must all accept it with the same digest. Then F copies
with one flipped bit (a random archive, a random byte, a random bit) are
given to both readers in verify mode: both must reject. A class that
differs between the two is printed; it fails the run unless both classes
are in the set the spec allows for that byte (see ALLOWED below).
Exit 0 when everything agrees.
"""

import argparse
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fkvf_read as R  # noqa: E402


def py_read(path, mode, cb):
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        return "accept", "%016x" % R.Reader(memoryview(data), mode, cb).run()
    except R.Reject as e:
        return "reject", e.cls + ": " + e.message()


def c_read(tool, path, mode, cb):
    cmd = [tool]
    if mode == "open":
        cmd.append("--open")
    cmd += ["--codebooks", cb or "", path]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = p.stdout.split()
    if p.returncode == 0 and len(out) >= 2 and out[0] == "digest":
        return "accept", out[1]
    if p.returncode == 1 and len(out) >= 2 and out[0] == "class":
        return "reject", out[1] + ": " + p.stderr.strip()
    return "error", "exit %d: %s %s" % (p.returncode, p.stdout.strip(), p.stderr.strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gen", required=True)
    ap.add_argument("--read", required=True)
    ap.add_argument("--count", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--flips", type=int, default=20)
    ap.add_argument("--keep", help="write the archives here (default: a temporary directory)")
    a = ap.parse_args()
    tmp = None
    if a.keep:
        d = a.keep
        os.makedirs(d, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="fkvf-rand-")
        d = tmp.name
    g = subprocess.run([a.gen, d, str(a.count), str(a.seed)], stdout=subprocess.PIPE, text=True)
    rows = [ln.split("\t") for ln in g.stdout.splitlines() if ln.strip()]
    bad = 0
    if g.returncode != 0 or len(rows) != a.count:
        print("FAIL generator: exit %d, %d of %d archives" % (g.returncode, len(rows), a.count))
        bad += 1
    archives = []
    for name, cbn, desc in rows:
        path = os.path.join(d, name)
        cb = os.path.join(d, cbn) if cbn != "-" else None
        archives.append((path, cb))
        res = {}
        for mode in ("verify", "open"):
            res["libfkvf " + mode] = c_read(a.read, path, mode, cb)
            res["python " + mode] = py_read(path, mode, cb)
        vals = set(res.values())
        if len(vals) != 1 or next(iter(vals))[0] != "accept":
            bad += 1
            print("FAIL %s (%s)" % (name, desc))
            for k, v in sorted(res.items()):
                print("    %-15s %s %s" % (k, v[0], v[1]))
        else:
            print("ok   %s digest %s  %s" % (name, next(iter(vals))[1], desc))
    rng = random.Random(a.seed)
    differ = 0
    for i in range(a.flips if archives else 0):
        path, cb = archives[rng.randrange(len(archives))]
        with open(path, "rb") as fh:
            data = bytearray(fh.read())
        off = rng.randrange(len(data))
        bit = rng.randrange(8)
        data[off] ^= 1 << bit
        fp = os.path.join(d, "flip_%03d.fkvf" % i)
        with open(fp, "wb") as fh:
            fh.write(data)
        c = c_read(a.read, fp, "verify", cb)
        p = py_read(fp, "verify", cb)
        what = "%s byte %d bit %d" % (os.path.basename(path), off, bit)
        if c[0] != "reject" or p[0] != "reject":
            bad += 1
            print("FAIL flip %s: libfkvf %s %s; python %s %s" % (what, c[0], c[1], p[0], p[1]))
            continue
        cc, pc = c[1].split(":")[0], p[1].split(":")[0]
        if cc != pc:
            differ += 1
            print("DIFF flip %s: libfkvf %s; python %s" % (what, c[1], p[1]))
        else:
            print("ok   flip %s: both %s" % (what, cc))
        os.unlink(fp)
    print("random: %d archives, %d flips, %d failures, %d class differences"
          % (len(archives), a.flips, bad, differ))
    return 1 if bad or differ else 0


if __name__ == "__main__":
    sys.exit(main())
