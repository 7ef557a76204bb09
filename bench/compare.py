#!/usr/bin/python3
"""The measuring half of bench/compare.sh (which builds the binaries, writes
the input with bench/mkcache.py and calls this): runs FKVF and its anchors
on the same files, paired, and prints one markdown ratio table (and writes
the same figures as JSON with --json).

Pairs: the anchor and the FKVF command alternate (anchor first in even
pairs, FKVF first in odd ones); each pair gives one ratio FKVF / anchor;
the table shows the median and the min of the per-pair ratios. Times of a
child process come from os.wait4: wall (monotonic clock around the child),
CPU (user + system of the child) and peak RSS (ru_maxrss).

Rows measured here from the CLI: sizes, pack --codebooks vs zstd -3, unpack
vs cp / zstd -d, train. Rows measured in-process by the C bench programs:
every program of PROGRAMS present in BIN is run (with TMPDIR = the scratch
directory) and its last line starting `RESULT ` parsed (key=value pairs).
Targets: TARGETS below, the ones of issue 16.

    bench/compare.py --combine RUN1.json RUN2.json ...
prints one table of several runs (min and median over the runs).
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

# The issue 16 targets: key -> (what, comparison, threshold). A row is "met"
# when its median satisfies the comparison.
TARGETS = {
    "restore_vs_pread": ("<=", 3.0),
    "restore_gbps": (">=", 2.0),
    "unpack_vs_cp": ("<=", 2.0),
    "unpack_peak_mib": ("<=", 64.0),
    "random_us": ("<=", 20.0),
    "random_vs_pread": ("<=", 3.0),
    "encode_pos_per_s": (">=", 2500.0),
    "encode_speedup": (">=", 2.0),
    "cbload_share": ("<=", 0.05),
    "train_cpu_s": ("<=", 60.0),
    "live_peak_ratio": ("<=", 1.5),
    "live_final_ratio": ("<=", 1.5),
    "zidx_bytes_per_pos": ("<=", 8.0),
}

# RESULT keys: (row text, the programs that print it, in order of preference:
# the first one present and run wins).
KEYS = [
    ("restore_vs_pread", "restore all positions (f16): CPU / pread CPU of the raw file",
     ["bench_restore_pread", "bench_anchor"]),
    ("restore_vs_memcpy", "restore all positions (f16): CPU / memcpy CPU of the raw bytes",
     ["bench_restore_pread", "bench_anchor"]),
    ("restore_gbps", "restore all positions: GB/s of output per CPU second",
     ["bench_restore_pread", "bench_anchor"]),
    ("random_us", "one random position, all heads, K+V (fkvf_reader_read), us warm (CPU)",
     ["bench_random", "bench_access", "bench_anchor"]),
    ("random_vs_pread", "one random position / one row pread (CPU)",
     ["bench_random", "bench_access", "bench_anchor"]),
    ("random_vs_memcpy", "one random position / one row memcpy (CPU)",
     ["bench_random", "bench_access", "bench_anchor"]),
    ("encode_pos_per_s", "encode in-process, positions/s/core", ["bench_encode"]),
    ("encode_speedup", "encode: old path CPU / new path CPU", ["bench_encode"]),
    ("cbload_share", "codebook load for encoding (f16 in place, as pack): share of a "
     "256-position pack", ["bench_encode"]),
    ("cbload_f32_share", "the same with binary32 tables (fkvf_rvq_from_tables)",
     ["bench_encode"]),
    ("cbload_layout_share", "the binary32 load's search layout alone: share of the same",
     ["bench_encode"]),
    ("live_peak_ratio", "live archive (commit every 8): peak footprint / compacted",
     ["bench_append"]),
    ("live_final_ratio", "live archive: final footprint / compacted", ["bench_append"]),
    ("append_slowdown", "append with auto-compaction / without (positions/s)",
     ["bench_append"]),
    ("zidx_bytes_per_pos", "search index bytes per indexed position", ["bench_search"]),
    ("search_new_vs_old", "suffix query: new index / old ZIDX (time)", ["bench_search"]),
]

RSS_DIR = "."  # set to the scratch directory by main()

# The programs and how they are called ({raw}, {archive}, {codebooks},
# {pairs} are substituted). Restore and random access come from bench_anchor,
# on this script's own archive and codebook; bench_restore_pread and
# bench_random measure the same on data of their own and are not run here
# (twice the time for the same rows). The train row is this script's own
# `fkvf train`; unpack is measured here directly (rows unpack.*), so
# bench/unpack.sh is not run either.
PROGRAMS = {
    "bench_encode": ["--pairs", "3"],
    "bench_append": ["--live", "--pairs", "1"],
    "bench_search": ["--quick"],
    "bench_anchor": ["{raw}", "{archive}", "--codebooks", "{codebooks}", "--pairs", "{pairs}"],
}


def run(cmd, out=None):
    """Runs cmd (a list) to completion: (wall s, CPU s, peak RSS KiB).
    stdout goes to `out` (a path) or nowhere; a failure raises with its
    stderr. CPU: user + system of the child and its descendants (os.wait4).
    Peak RSS: /usr/bin/time -f %M around the command (the ru_maxrss of a
    child of this process would count the forked copy of python)."""
    rssf = os.path.join(RSS_DIR, "rss.txt")
    so = open(out, "wb") if out else subprocess.DEVNULL
    try:
        t0 = time.monotonic()
        p = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", rssf] + cmd, stdout=so,
                             stderr=subprocess.PIPE)
        err = p.stderr.read()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if out:
            so.close()
    if p.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(map(shlex.quote, cmd)), p.returncode,
                                               err.decode(errors="replace").strip()[-2000:]))
    with open(rssf) as f:
        rss = int(f.read().split()[-1])
    return wall, ru.ru_utime + ru.ru_stime, rss


def paired(n, anchors, fkvf, prepare=None):
    """n pairs of the commands in `anchors` (name -> cmd) and the FKVF
    command `fkvf` (name, cmd); the order flips every pair. prepare(), if
    given, runs before every command (e.g. removes the outputs). Returns
    {name: [(wall, cpu, rss), ...]}."""
    res = {name: [] for name in list(anchors) + [fkvf[0]]}
    for i in range(n):
        order = list(anchors.items()) + [fkvf]
        if i % 2:
            order.reverse()
        for name, cmd in order:
            if prepare:
                prepare()
            res[name].append(run(cmd))
    return res


def ratios(res, a, b, field):
    """per-pair ratios res[a][i][field] / res[b][i][field]"""
    return [x[field] / y[field] for x, y in zip(res[a], res[b]) if y[field] > 0]


def med_min(v):
    return (statistics.median(v), min(v)) if v else (None, None)


def fmt(x, nd=2):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if abs(x) >= 1000:
        return "{:,.0f}".format(x)
    if abs(x) < 1:
        return "%.3f" % x
    return "%.*f" % (nd, x)


class Table:
    def __init__(self, quick=False):
        self.rows = []
        self.quick = quick  # small shapes: the targets do not apply

    def add(self, rid, what, value, anchor, med=None, mn=None, target_key=None, note="",
            source="compare.sh", judge=None):
        """judge: the figure the target is checked on (default med)."""
        target, met = "-", "-"
        if target_key in TARGETS:
            op, thr = TARGETS[target_key]
            target = "%s %s" % (op, fmt(thr))
            x = med if judge is None else judge
            if self.quick:
                met = "n/a (--quick)"
            elif isinstance(x, (int, float)):
                ok = x <= thr if op == "<=" else x >= thr
                met = "met" if ok else "not met"
        self.rows.append(dict(id=rid, row=what, value=value, anchor=anchor, median=med, min=mn,
                              target=target, met=met, note=note, source=source))

    def markdown(self):
        out = ["| id | row | FKVF | anchor | ratio or figure, median | min | target | met "
               "| notes |", "|---|---|---|---|---|---|---|---|---|"]
        for r in self.rows:
            out.append("| %s |" % " | ".join([
                r["id"], r["row"], r["value"], r["anchor"], fmt(r["median"]), fmt(r["min"]),
                r["target"], r["met"], r["note"] or "-"]))
        return "\n".join(out)


def mib(kib):
    return kib / 1024.0


def npy_subset(src, dst, positions):
    """dst: the first `positions` positions of the [L, 2, H, T, D] .npy src
    (the same bytes, not a new draw)"""
    import numpy as np
    a = np.load(src, mmap_mode="r")
    np.save(dst, np.ascontiguousarray(a[:, :, :, :positions, :]))


def result_line(path):
    last = None
    with open(path, "rb") as f:
        for line in f.read().decode(errors="replace").splitlines():
            if line.startswith("RESULT "):
                last = line
    if last is None:
        return None
    kv = {}
    for tok in last.split()[1:]:
        k, _, v = tok.partition("=")
        try:
            kv[k] = float(v)
        except ValueError:
            pass
    return kv


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="build directory with tools/fkvf, bench/*")
    ap.add_argument("--src", required=True, help="the repository (bench/unpack.sh, sources)")
    ap.add_argument("--dir", required=True, help="scratch directory (the data)")
    ap.add_argument("--raw", required=True, help="the cache .npy (bench/mkcache.py)")
    ap.add_argument("--positions", type=int, required=True)
    ap.add_argument("--runs", type=int, default=5, help="pairs per paired row")
    ap.add_argument("--train-positions", type=int, required=True)
    ap.add_argument("--train-iters", type=int, default=25)
    ap.add_argument("--subset-positions", type=int, required=True,
                    help="positions for the slow compressors (zstd -19, xz -6)")
    ap.add_argument("--quick", action="store_true", help="skip the others' programs")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per bench program")
    ap.add_argument("--json", help="write the rows as JSON here")
    a = ap.parse_args()

    global RSS_DIR
    fkvf = os.path.join(a.bin, "tools", "fkvf")
    d = RSS_DIR = a.dir
    raw = a.raw
    P = a.positions
    N = a.runs
    rawb = os.path.getsize(raw)
    t = Table(a.quick)
    t0 = time.monotonic()
    log = lambda *m: print("compare: %4.0f s:" % (time.monotonic() - t0), *m, file=sys.stderr,
                           flush=True)

    # ---- train: a codebook file from the first train-positions positions
    tp = min(a.train_positions, P)
    trsrc = raw if tp == P else os.path.join(d, "train.npy")
    if tp != P:
        npy_subset(raw, trsrc, tp)
    cb = os.path.join(d, "codebooks.fkvf")
    log("train: %d positions, %d iterations" % (tp, a.train_iters))
    w, c, m = run([fkvf, "train", trsrc, "-o", cb, "--k", "256", "--iters",
                   str(a.train_iters), "--force"])
    full = (tp >= 8192 and a.train_iters >= 25)
    t.add("train", "fkvf train, k 256 (CPU s; one run)", "%.1f s CPU, %.1f s wall" % (c, w),
          "-", c, None, "train_cpu_s",
          note="%d positions x %d iterations%s" %
          (tp, a.train_iters, "" if full else "; the target is for 8192 x 25"))
    if not full and not a.quick:
        t.rows[-1]["met"] = "n/a (subset)"

    # ---- sizes
    arch = os.path.join(d, "archive.fkvf")
    run([fkvf, "pack", raw, "--codebooks", cb, "-o", arch, "--force"])
    archb, cbb = os.path.getsize(arch), os.path.getsize(cb)
    emb = os.path.join(d, "embedded.fkvf")
    log("pack --train (embedded codebook)")
    run([fkvf, "pack", raw, "--train", "--k", "256", "--iters", "1", "-o", emb, "--force"])
    embb = os.path.getsize(emb)
    t.add("size.raw", "raw f16 cache (.npy)", "{:,} B".format(rawb), "-", 1.0, None,
          note="%d positions" % P)
    t.add("size.shared", "fkvf pack --codebooks: archive / raw (codebook not counted)",
          "{:,} B".format(archb), "{:,} B".format(rawb), archb / rawb, None,
          note="raw/archive %.2fx" % (rawb / archb))
    t.add("size.codebook", "the shared codebook file / raw", "{:,} B".format(cbb),
          "{:,} B".format(rawb), cbb / rawb, None,
          note="counted once for any number of archives")
    t.add("size.shared+cb", "archive + codebook file / raw", "{:,} B".format(archb + cbb),
          "{:,} B".format(rawb), (archb + cbb) / rawb, None,
          note="raw/(archive+codebook) %.2fx" % (rawb / (archb + cbb)))
    t.add("size.embedded", "fkvf pack --train (codebook embedded) / raw", "{:,} B".format(embb),
          "{:,} B".format(rawb), embb / rawb, None,
          note="raw/archive %.2fx; --iters 1 (the size does not depend on it)" % (rawb / embb))

    # the compressors: full file for the fast ones, a subset for the slow ones
    sub = os.path.join(d, "subset.npy")
    sp = min(a.subset_positions, P)
    npy_subset(raw, sub, sp)
    subb = os.path.getsize(sub)
    # name, compress (src, out), decompress (out, back), extension, on the subset
    comps = [
        ("zstd -3", lambda i, o: ["zstd", "-3", "-q", "-f", i, "-o", o],
         lambda i, o: ["zstd", "-d", "-q", "-f", i, "-o", o], ".zst", False),
        ("lz4", lambda i, o: ["lz4", "-q", "-f", i, o],
         lambda i, o: ["lz4", "-d", "-q", "-f", i, o], ".lz4", False),
        ("gzip -6", lambda i, o: ["gzip", "-6", "-c", i], lambda i, o: ["gzip", "-d", "-c", i],
         ".gz", False),
        ("zstd -19", lambda i, o: ["zstd", "-19", "-q", "-f", i, "-o", o],
         lambda i, o: ["zstd", "-d", "-q", "-f", i, "-o", o], ".19.zst", True),
        ("xz -6", lambda i, o: ["xz", "-6", "-T1", "-c", i], lambda i, o: ["xz", "-d", "-T1", "-c", i],
         ".xz", True)]
    zst = None
    for name, ccmd, dcmd, ext, slow in comps:
        src = sub if slow else raw
        srcb = subb if slow else rawb
        out = os.path.join(d, os.path.basename(src) + ext)
        back = out + ".back"
        log("size: " + name)
        tostdout = "-c" in ccmd(src, out)
        wc, cc, _ = run(ccmd(src, out), out=out if tostdout else None)
        wd, cd, _ = run(dcmd(out, back), out=back if tostdout else None)
        ob = os.path.getsize(out)
        os.unlink(back)
        if name == "zstd -3":
            zst = out
        t.add("size." + name.replace(" ", ""), "%s of the raw file / raw" % name,
              "{:,} B".format(ob), "{:,} B".format(srcb), ob / srcb, None,
              note="%scompress %.0f MB/s, decompress %.0f MB/s CPU (one run)" %
              ("first %d positions (%.1f MB); " % (sp, srcb / 1e6) if slow else "",
               srcb / 1e6 / max(cc, 1e-9), srcb / 1e6 / max(cd, 1e-9)))

    # ---- encode: pack --codebooks vs zstd -3 of the same file, paired
    log("pack --codebooks vs zstd -3: %d pairs" % N)
    pk = os.path.join(d, "pairs.fkvf")
    zz = os.path.join(d, "pairs.zst")
    res = paired(N, {"zstd": ["zstd", "-3", "-q", "-f", raw, "-o", zz]},
                 ("pack", [fkvf, "pack", raw, "--codebooks", cb, "-o", pk, "--force"]))
    pps = [P / x[1] for x in res["pack"]]
    zps = [P / x[1] for x in res["zstd"]]
    r_cpu = ratios(res, "pack", "zstd", 1)
    t.add("pack.pos_per_s", "fkvf pack --codebooks: positions/s/core (CPU)",
          "%s pos/s" % fmt(statistics.median(pps)),
          "zstd -3: %s pos/s" % fmt(statistics.median(zps)), statistics.median(pps), min(pps),
          "encode_pos_per_s", note="whole command: read, codebook load, encode, write")
    t.add("pack.vs_zstd", "fkvf pack --codebooks CPU / zstd -3 CPU (same file)",
          "%.2f s" % statistics.median(x[1] for x in res["pack"]),
          "%.2f s" % statistics.median(x[1] for x in res["zstd"]), *med_min(r_cpu))

    # ---- unpack vs cp and zstd -d, paired (three commands, order flipped)
    log("unpack vs cp / zstd -d: %d pairs" % N)
    cpo, zo, uo = (os.path.join(d, x) for x in ("cp.npy", "zstd-d.npy", "unpack.npy"))

    def clean():
        for f in (cpo, zo, uo):
            if os.path.exists(f):
                os.unlink(f)
    res = paired(N, {"cp": ["cp", raw, cpo], "zstd -d": ["zstd", "-d", "-q", "-f", zst, "-o", zo]},
                 ("unpack", [fkvf, "unpack", arch, "-o", uo, "--codebooks", cb, "--force"]),
                 prepare=clean)
    clean()
    med = lambda name, f: statistics.median(x[f] for x in res[name])
    t.add("unpack.vs_cp.wall", "fkvf unpack / cp of the raw file (wall)",
          "%.2f s" % med("unpack", 0), "%.2f s" % med("cp", 0),
          *med_min(ratios(res, "unpack", "cp", 0)), "unpack_vs_cp")
    t.add("unpack.vs_cp.cpu", "fkvf unpack / cp of the raw file (CPU)",
          "%.2f s" % med("unpack", 1), "%.2f s" % med("cp", 1),
          *med_min(ratios(res, "unpack", "cp", 1)))
    t.add("unpack.vs_zstd", "fkvf unpack / zstd -d of the zstd -3 file (wall)",
          "%.2f s" % med("unpack", 0), "%.2f s" % med("zstd -d", 0),
          *med_min(ratios(res, "unpack", "zstd -d", 0)))
    peak = max(mib(x[2]) for x in res["unpack"])
    t.add("unpack.peak", "fkvf unpack peak RSS (MiB; max of the runs)", "%.0f MiB" % peak,
          "zstd -d %.0f MiB, cp %.0f MiB" % (max(mib(x[2]) for x in res["zstd -d"]),
                                             max(mib(x[2]) for x in res["cp"])),
          peak, min(mib(x[2]) for x in res["unpack"]), "unpack_peak_mib",
          note="raw cache %.0f MB" % (rawb / 1e6))

    # ---- the in-process programs
    got = {}
    status = {}
    for prog, args in PROGRAMS.items():
        if prog.endswith(".sh"):
            path = os.path.join(a.src, "bench", prog)
            cmd = ["bash", path] + args
            src = path
        else:
            path = os.path.join(a.bin, "bench", prog)
            cmd = [path] + args
            src = os.path.join(a.src, "bench", prog + ".c")
        if not os.path.exists(path):
            status[prog] = "not in the tree" if prog.endswith(".sh") else "not built"
            continue
        if prog != "bench_anchor":
            if a.quick:
                status[prog] = "skipped (--quick)"
                continue
            try:
                with open(src, "rb") as f:
                    has = b"RESULT " in f.read()
            except OSError:
                has = False
            if not has:
                status[prog] = "no RESULT line (this version): not run"
                continue
        sub_ = {"raw": raw, "archive": arch, "codebooks": cb, "pairs": str(N)}
        cmd = [x.format(**sub_) for x in cmd]
        out = os.path.join(d, prog + ".out")
        log("run " + " ".join(cmd))
        env = dict(os.environ, TMPDIR=d)
        try:
            with open(out, "wb") as f:
                p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                   timeout=a.timeout)
            kv = result_line(out)
            if p.returncode != 0:
                status[prog] = "failed (exit %d, %s)" % (p.returncode, out)
            elif kv is None:
                status[prog] = "no RESULT line (%s)" % out
            else:
                got[prog] = kv
                status[prog] = "ok"
        except subprocess.TimeoutExpired:
            status[prog] = "timed out after %d s" % a.timeout
    for key, what, progs in KEYS:
        src = next((p for p in progs if p in got and key in got[p]), None)
        if src is None:
            why = "; ".join("%s: %s" % (p, status.get(p, "not built")) for p in progs)
            t.add(key, what, "-", "-", None, None, key, note=why, source="-")
            t.rows[-1]["met"] = "-"  # no figure
            continue
        kv = got[src]
        mn = kv.get(key + "_min")
        wall = kv.get(key + "_wall")
        t.add(key, what, "-", "-", kv[key], mn, key, source=src,
              note="from %s%s%s" % (src, " (this script's baseline)"
                                    if src == "bench_anchor" else "",
                                    "; wall: %s" % fmt(wall) if wall is not None else ""))
    print(t.markdown())
    print("\n%d positions, %d pairs per paired row (median and min of per-pair ratios FKVF / "
          "anchor); train %d positions x %d iterations; slow compressors on %d positions" %
          (P, N, tp, a.train_iters, sp))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"positions": P, "pairs": N, "train_positions": tp,
                       "train_iters": a.train_iters, "subset_positions": sp,
                       "programs": status, "rows": t.rows}, f, indent=1)
            f.write("\n")


def combine(paths):
    """The table of several runs' JSON (issue 16: run it three times, report
    min and median): per row, the min and the median over the runs of each
    run's median figure."""
    runs = [json.load(open(p)) for p in paths]
    print("| id | row | target | min of %d runs | median of %d runs | runs | met (median) |"
          % (len(runs), len(runs)))
    print("|---|---|---|---|---|---|---|")
    for i, r in enumerate(runs[0]["rows"]):
        vals = [x["rows"][i]["median"] for x in runs
                if i < len(x["rows"]) and x["rows"][i]["id"] == r["id"]]
        vals = [v for v in vals if isinstance(v, (int, float))]
        med = statistics.median(vals) if vals else None
        met = r["met"]
        if vals and r["target"] != "-" and not met.startswith("n/a"):
            op, thr = r["target"].split()[0], float(r["target"].split()[1].replace(",", ""))
            met = "met" if (med <= thr if op == "<=" else med >= thr) else "not met"
        print("| %s | %s | %s | %s | %s | %s | %s |" % (
            r["id"], r["row"], r["target"], fmt(min(vals)) if vals else "-", fmt(med),
            " / ".join(fmt(v) for v in vals) or "-", met))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--combine":
        combine(sys.argv[2:])
        sys.exit(0)
    try:
        main()
    except (RuntimeError, OSError) as e:
        sys.exit("compare.py: %s" % e)
