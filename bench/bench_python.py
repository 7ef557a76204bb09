"""Speed of the Python binding against C (issue 15: read within 1.2x of the C restore of the
same positions, pack within 1.2x of `fkvf pack`). Run by bench/python.sh; not a test.

A GPT-2-shaped cache (12 layers, 12 KV heads, head dim 64, f16, --positions positions,
NumPy's default_rng(0) normals) is saved as .npy and packed with the CLI (4 sinks + 32 recent
exact, the rest archived with a codebook trained on the cache, automatic k, seed 0), once per
work directory. Each comparison is measured in pairs: a C measurement (bench_restore in its
own process, or the CLI) and a Python one, in alternating order, --pairs times; each
measurement is one warm-up call and the median of --reps calls on a freshly opened archive,
timed inside its process (C writes into buffers allocated once, Python returns new arrays
each call). The table gives the median of the per-pair ratios Python / C (so
that it holds on a loaded machine) and the medians of the times.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

L, H, D = 12, 12, 64


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cli", required=True, help="the fkvf CLI")
    p.add_argument("--bench-restore", required=True, help="build/bench/bench_restore")
    p.add_argument("--workdir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                     "fkvf-bench-python"))
    p.add_argument("--positions", type=int, default=2048)
    p.add_argument("--pairs", type=int, default=7, help="pairs per comparison (>= 7)")
    p.add_argument("--pack-pairs", type=int, default=7, help="pairs for pack (>= 7)")
    p.add_argument("--no-pack", action="store_true", help="time the reads only")
    p.add_argument("--c-fresh", action="store_true",
                   help="C mallocs its output in every timed call (default: once, outside "
                        "the timing: the C library's best case)")
    p.add_argument("--reps", type=int, default=0,
                   help="calls timed per measurement (0: by case, 5 to 50)")
    a = p.parse_args()
    if a.pairs < 7 or a.pack_pairs < 7:
        p.error("at least 7 pairs")
    if a.positions < 4 + 32 + 64 + 1000:
        p.error("--positions: at least 1100 (the 64-position slice starts at 1000)")
    return a


def make_archive(args):
    os.makedirs(args.workdir, exist_ok=True)
    npy = os.path.join(args.workdir, f"cache-{args.positions}.npy")
    arc = os.path.join(args.workdir, f"archive-{args.positions}.fkvf")
    if not os.path.exists(npy):
        rng = np.random.default_rng(0)
        cache = rng.standard_normal((L, 2, H, args.positions, D), dtype=np.float32)
        np.save(npy + ".tmp.npy", cache.astype(np.float16))
        os.replace(npy + ".tmp.npy", npy)
    if not os.path.exists(arc) or os.path.getmtime(arc) < os.path.getmtime(npy):
        print(f"packing {npy} (once per work directory) ...", flush=True)
        subprocess.run([args.cli, "pack", npy, "-o", arc + ".tmp", "--sinks", "4", "--recent",
                        "32", "--seed", "0", "--force"], check=True, capture_output=True)
        os.replace(arc + ".tmp", arc)
    return npy, arc


def c_time(args, arc, mode, first, count, reps):
    cmd = [args.bench_restore, arc, mode, str(first), str(count), str(reps)]
    out = subprocess.run(cmd + (["fresh"] if args.c_fresh else []), check=True,
                         capture_output=True, text=True).stdout
    return float(out)


def py_time(fkvf, arc, sel, copy, reps):
    """copy None: Archive.restore (rows, as fkvf_reader_restore); else Archive.read."""
    with fkvf.open(arc) as a:
        call = ((lambda: a.restore(sel)) if copy is None
                else (lambda: a.read(positions=sel, copy=copy)))
        call()  # warm-up, as the C side
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            call()
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def paired(n, first, second):
    """n pairs, alternating which of the two runs first; (ratios, times1, times2)."""
    r, t1, t2 = [], [], []
    for i in range(n):
        if i % 2 == 0:
            a = first()
            b = second()
        else:
            b = second()
            a = first()
        t1.append(a)
        t2.append(b)
        r.append(a / b)
    return r, t1, t2


def main():
    args = parse()
    import fkvf
    npy, arc = make_archive(args)
    n = args.positions
    with fkvf.open(arc) as a:
        info, desc = a.info, a.descriptor
    print(f"archive: {n} positions ({info['n_archived']} archived, "
          f"{n - info['n_archived']} exact), {L} layers x {H} KV heads x {D}, "
          f"{desc['dtype']}, {info['file_size']} bytes; fkvf {fkvf.__version__}")
    print(f"{args.pairs} pairs per row, order alternating; each measurement the median of "
          "its calls after one warm-up\n")
    cases = [
        ("read() all positions", None, True, 0, n, 5),
        ("read(positions=slice(1000, 1064))", slice(1000, 1064), True, 1000, 64, 30),
        ("read(positions=window)", slice(n - 32, n), True, n - 32, 32, 50),
        ("read(positions=window, copy=False)", slice(n - 32, n), False, n - 32, 32, 50),
        # the rows as the C restore gives them: [T, row], no rearranging
        ("restore() all positions", None, None, 0, n, 5),
        ("restore(window)", slice(n - 32, n), None, n - 32, 32, 50),
    ]
    rows = []
    for name, sel, copy, first, count, reps in cases:
        reps = args.reps or reps
        for mode in (("restore",) if copy is None else ("restore", "read")):
            r, tp, tc = paired(args.pairs, lambda: py_time(fkvf, arc, sel, copy, reps),
                               lambda: c_time(args, arc, mode, first, count, reps))
            rows.append((name, f"C fkvf_reader_{mode}", statistics.median(tp),
                         statistics.median(tc), statistics.median(r), min(r), max(r)))
            print(f"  {name} vs {mode}: ratio {statistics.median(r):.3f}", flush=True)
    if args.no_pack:
        print("fkvf.pack: not timed (--no-pack)")
    elif hasattr(fkvf, "pack"):
        cache = np.load(npy)
        # K and V as a caller holds them: each its own C-contiguous [L, H, T, D] array
        kv = (np.ascontiguousarray(cache[:, 0]), np.ascontiguousarray(cache[:, 1]))
        del cache
        out_py = os.path.join(args.workdir, "pack-py.fkvf")
        out_cli = os.path.join(args.workdir, "pack-cli.fkvf")

        def py_pack():
            t0 = time.perf_counter()
            fkvf.pack(kv, out_py, sinks=4, recent=32, seed=0, k=None, overwrite=True)
            return time.perf_counter() - t0

        def cli_pack():
            t0 = time.perf_counter()
            subprocess.run([args.cli, "pack", npy, "-o", out_cli, "--sinks", "4", "--recent",
                            "32", "--seed", "0", "--force"], check=True, capture_output=True)
            return time.perf_counter() - t0

        r, tp, tc = paired(args.pack_pairs, py_pack, cli_pack)
        rows.append(("fkvf.pack(cache) (in memory)", "`fkvf pack cache.npy` (process)",
                     statistics.median(tp), statistics.median(tc), statistics.median(r),
                     min(r), max(r)))
    else:
        print("\npack: skipped (this fkvf has no fkvf.pack yet)")
    print("\n| Python | C | Python s | C s | ratio (median) | min | max |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, c, tp, tc, r, lo, hi in rows:
        print(f"| `{name}` | {c} | {tp:.6f} | {tc:.6f} | {r:.3f} | {lo:.3f} | {hi:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
