#!/usr/bin/python3
"""The quality cost of training codebooks on a sample of positions
(--max-train-positions; docs/codebooks.md, "Training on a sample of
positions"): codebooks trained on every position of TRAIN and on samples of
1/2, 1/4, 1/8 and 1/16 of its positions (runs of 64 chosen by the seed),
each used to pack every EVAL cache (fkvf pack --codebooks), restored
(fkvf unpack) and compared (fkvf compare --sinks 4 --recent 32). Prints a
markdown table: the relative MSE of the archived keys and values, averaged
over the EVAL caches, and its change against full training.

    bench/train_sample_quality.py FKVF TRAIN.safetensors EVAL... [--k 256]
        [--iters 25] [--seed 0] [--fractions 1,2,4,8,16] [--no-rope]

EVAL may include TRAIN itself (in-sample: what pack --train sees)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    return r.stdout


def positions(path):
    """positions of a cache: a 5-D heads-first .npy [L, 2, H, T, D] or a
    safetensors file of [H, T, D] tensors"""
    if path.endswith(".npy"):
        import numpy as np
        return int(np.load(path, mmap_mode="r").shape[3])
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head = json.loads(f.read(n))
    return max(t["shape"][1] for k, t in head.items()
               if k != "__metadata__" and len(t["shape"]) == 3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fkvf")
    ap.add_argument("train")
    ap.add_argument("evals", nargs="+")
    ap.add_argument("--k", default="256")
    ap.add_argument("--iters", default="25")
    ap.add_argument("--seed", default="0")
    ap.add_argument("--fractions", default="1,2,4,8,16")
    ap.add_argument("--no-rope", action="store_true")
    a = ap.parse_args()
    keys = ["--no-rope"] if a.no_rope else []
    with tempfile.TemporaryDirectory() as tmp:
        P = positions(a.train)
        print("| sample | positions | keys rel. MSE | keys dB | values rel. MSE | values dB |"
              " keys vs full | values vs full |")
        print("|---|---|---|---|---|---|---|---|")
        full = None
        for f in [int(x) for x in a.fractions.split(",")]:
            n = P // f
            cb = os.path.join(tmp, "cb.fkvf")
            run([a.fkvf, "train", a.train, "-o", cb, "--force", "--k", a.k, "--iters", a.iters,
                 "--seed", a.seed, "--max-train-positions", "all" if f == 1 else str(n)] + keys)
            km = vm = 0.0
            for e in a.evals:
                arc = os.path.join(tmp, "a.fkvf")
                res = os.path.join(tmp, "r.safetensors")
                run([a.fkvf, "pack", e, "-o", arc, "--force", "--codebooks", cb, "--no-index"])
                run([a.fkvf, "unpack", arc, "-o", res, "--force"])
                c = json.loads(run([a.fkvf, "compare", e, res, "--sinks", "4", "--recent", "32",
                                    "--json"]))
                km += c["keys"]["rel_mse"] / len(a.evals)
                vm += c["values"]["rel_mse"] / len(a.evals)
            if full is None:
                full = (km, vm)
            db = lambda m: -10 * __import__("math").log10(m)
            print("| %s | %d | %.5f | %.2f | %.5f | %.2f | %+.1f%% | %+.1f%% |" % (
                "all" if f == 1 else "1/%d" % f, n, km, db(km), vm, db(vm),
                100 * (km / full[0] - 1), 100 * (vm / full[1] - 1)), flush=True)


if __name__ == "__main__":
    main()
