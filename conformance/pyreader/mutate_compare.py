#!/usr/bin/env python3
"""Differential test of libfkvf and the second reader on re-sealed mutants.

    mutate_compare.py --read PATH/fkvf-conf-read [--count N] [--seed S]
                      [--show-agree] ARCHIVE[:CODEBOOK] ...

Each mutant is one of the given archives with one byte changed (in a
section's contents, a directory, a trailer or the header) and every checksum
that covers the byte recomputed ("re-sealed": the section checksum in its
directory entry, a STRM segment's header and block checksums, the directory
checksum in its trailer, the trailer and header checksums), so that the
change reaches the checks behind the checksums. Both readers read every
mutant in verify and open mode; the outcomes (accept + digest, or reject +
class) are compared. A mutant can have several independent faults (a
changed dimension breaks several sections), where the spec lets readers
report any of them (§16.2), so differences are listed for a human to judge;
the exit status is 1 when one reader accepts what the other rejects, or
when both accept with different digests, except on the access path ("open")
for a fault that both find with the same class in full verification (the
spec lets that path skip bytes it does not serve; printed as OPEN-EITHER).
"""

import argparse
import os
import random
import struct
import subprocess
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fkvf_read as R  # noqa: E402
from xxh3 import xxh3_64  # noqa: E402


def layout(data):
    """Commits and entries of a valid file, from the second reader."""
    rd = R.Reader(memoryview(bytes(data)), "open")
    head, commits, torn = rd.open()
    rd.commits = commits
    rd.load_directories()
    return commits, rd.entries


def reseal(buf, commits, entries, inflated):
    """Recompute every checksum of buf (a bytearray) in place."""
    for e in entries:
        o = e.offset
        if e.type == b"STRM" and e.stored >= 64:
            struct.pack_into("<Q", buf, o + 56, xxh3_64(bytes(buf[o:o + 56]), o))
            s = getattr(e, "_seg", None)
            if s is not None:
                for i in range(s.n_blocks):
                    a = s.data_start + i * s.bs
                    end = s.data_start + min((i + 1) * s.bs, s.data_bytes)
                    struct.pack_into("<Q", buf, o + 64 + 8 * i, xxh3_64(bytes(buf[a:end]), a))
        if e.flags & R.F_DEFLATE and e in inflated:
            z = zlib.compress(bytes(inflated[e]), 6)
            if len(z) == e.stored:
                buf[o:o + e.stored] = z
        struct.pack_into("<Q", buf, e.eoff + 40, xxh3_64(bytes(buf[o:o + e.stored]), o))
    for t in commits:
        struct.pack_into("<Q", buf, t.T + 32,
                         xxh3_64(bytes(buf[t.dir_offset:t.dir_offset + t.dir_size]), t.dir_offset))
        struct.pack_into("<Q", buf, t.T + 56, xxh3_64(bytes(buf[t.T:t.T + 56]), t.T))
    struct.pack_into("<Q", buf, 56, xxh3_64(bytes(buf[0:56]), 0))


def py_read(data, mode, cb):
    try:
        return ("accept", "%016x" % R.Reader(memoryview(bytes(data)), mode, cb).run()), ""
    except R.Reject as e:
        return ("reject", e.cls), e.message()


def c_read(tool, path, mode, cb):
    cmd = [tool] + (["--open"] if mode == "open" else []) + ["--codebooks", cb or "", path]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = p.stdout.split()
    if p.returncode == 0 and out[:1] == ["digest"]:
        return ("accept", out[1]), ""
    if p.returncode == 1 and out[:1] == ["class"]:
        return ("reject", out[1]), p.stderr.strip()
    return ("error", str(p.returncode)), p.stderr.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--read", required=True)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--show-agree", action="store_true")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    bases = []
    for f in a.files:
        path, _, cb = f.partition(":")
        with open(path, "rb") as fh:
            data = fh.read()
        commits, entries = layout(data)
        # segment layouts for re-sealing block checksums
        for e in entries:
            if e.type == b"STRM":
                e._seg = seg_layout(data, e)
        bases.append((path, cb or None, data, commits, entries))
    tmp = tempfile.TemporaryDirectory(prefix="fkvf-mut-")
    hard = soft = same = either = 0
    for i in range(a.count):
        path, cb, data, commits, entries = bases[rng.randrange(len(bases))]
        buf = bytearray(data)
        inflated = {}
        vtxs = [e for e in entries if e.type == b"VTXS" and not e.flags & R.F_DEFLATE]
        kind = rng.choice(["section"] * 6 + ["directory", "trailer", "header"] +
                          (["vtxs"] * 2 if vtxs else []))
        if kind == "vtxs":
            # a vertex table that is no longer a regular polygon (§10.2, §12.2.5):
            # one coordinate moved by a few units in the last place
            e = rng.choice(vtxs)
            nv = (e.stored - 8) // 16
            c = rng.randrange(1, nv)
            o = e.offset + 8 + 16 * c + 8 * rng.randrange(2)
            bits = struct.unpack_from("<q", buf, o)[0] + rng.choice([1, -1, 2, -2, 16, -16, 4096])
            struct.pack_into("<q", buf, o, bits)
            reseal(buf, commits, entries, inflated)
            old = new = 0
            where = "VTXS@%d V(%d) moved" % (e.offset, c)
        elif kind == "section":
            e = rng.choice(entries)
            if e.flags & R.F_DEFLATE:
                z = zlib.decompress(bytes(data[e.offset:e.offset + e.stored]))
                inflated[e] = bytearray(z)
                tgt, base = inflated[e], 0
            else:
                tgt, base = buf, e.offset
            n = len(z) if e.flags & R.F_DEFLATE else e.stored
            if n == 0:
                continue
            off = base + rng.randrange(min(n, 128) if rng.random() < 0.6 else n)
            where = "%s@%d+%d" % (e.type.decode("latin-1"), e.offset, off - base)
        elif kind == "directory":
            t = rng.choice(commits)
            rel = rng.randrange(t.dir_size)
            if rel >= 64 and (rel - 64) % 64 in range(40, 48):
                continue
            tgt, off = buf, t.dir_offset + rel
            where = "directory@%d+%d" % (t.dir_offset, rel)
        elif kind == "trailer":
            t = rng.choice(commits)
            rel = rng.randrange(8, 56)
            tgt, off = buf, t.T + rel
            where = "trailer@%d+%d" % (t.T, rel)
        else:
            rel = rng.randrange(9, 56)
            tgt, off = buf, rel
            where = "header+%d" % rel
        if kind != "vtxs":
            old = tgt[off]
            choice = rng.random()
            if choice < 0.3:
                new = old ^ (1 << rng.randrange(8))
            elif choice < 0.5:
                new = (old + rng.choice([1, -1])) & 255
            elif choice < 0.7:
                new = rng.choice([0, 255, 1, 0x80])
            else:
                new = rng.randrange(256)
            if new == old:
                continue
            tgt[off] = new
            reseal(buf, commits, entries, inflated)
        mp = os.path.join(tmp.name, "m.fkvf")
        with open(mp, "wb") as fh:
            fh.write(buf)
        res = {}
        for mode in ("verify", "open"):
            res[mode] = (c_read(a.read, mp, mode, cb), py_read(buf, mode, cb))
        desc = "%s %s" % (os.path.basename(path), where)
        if kind != "vtxs":
            desc += " %02x->%02x" % (old, new)
        diff = [m for m in res if res[m][0][0] != res[m][1][0]]
        if not diff:
            same += 1
            if a.show_agree:
                print("same %s: %s" % (desc, " ".join("%s=%s" % (m, res[m][0][0]) for m in res)))
            continue
        severe = any(res[m][0][0][0] != res[m][1][0][0] or res[m][0][0][0] == "accept" for m in diff)
        # A fault both readers find in full verification (same class) that
        # only one of them meets on the access path: the spec lets that path
        # skip checks of bytes it does not use (padding, a span whose
        # symbols are not served, META, ZIDX: conformance/README.md "Modes")
        # but does not forbid a reader to look further.
        vc, vp = res["verify"]
        open_either = diff == ["open"] and vc[0] == vp[0] and vc[0][0] == "reject" and \
            "reject" in (res["open"][0][0][0], res["open"][1][0][0])
        if open_either:
            severe = False
            either += 1
            label = "OPEN-EITHER"
        elif severe:
            hard += 1
            label = "DISAGREE"
        else:
            soft += 1
            label = "CLASS"
        print("%s %s" % (label, desc))
        for m in diff:
            (c, cm), (p, pm) = res[m]
            print("    %-6s libfkvf %-8s %-16s %s" % (m, c[0], c[1], cm[:200]))
            print("    %-6s python  %-8s %-16s %s" % (m, p[0], p[1], pm[:200]))
    print("mutants: %d same outcome, %d class differences, %d open-path-only differences, "
          "%d accept/reject or digest disagreements" % (same, soft, either, hard))
    return 1 if hard else 0


def seg_layout(data, e):
    """Block layout of a STRM segment from its header (no checks)."""
    o = e.offset
    if e.stored < 64:
        return None
    prof, b = data[o + 8], data[o + 9]
    ns = struct.unpack_from("<I", data, o + 48)[0]
    cnt = struct.unpack_from("<Q", data, o + 24)[0]
    L, bs = struct.unpack_from("<2I", data, o + 32)
    if prof == 1:
        sb = (cnt * b + 127) // 128 * 16
    elif L:
        sb = (cnt + L - 1) // L * 16
    else:
        return None
    s = R.Segment()
    s.data_bytes = ns * sb
    s.bs = bs
    s.n_blocks = (s.data_bytes + bs - 1) // bs
    s.data_start = o + R.align64(64 + 8 * s.n_blocks)
    return s


if __name__ == "__main__":
    sys.exit(main())
