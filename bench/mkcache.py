#!/usr/bin/python3
"""Writes a synthetic KV cache as .npy, [L, 2, H, T, D] f16 (keys then values),
the layout `fkvf pack` reads from a 5-D .npy. The benchmarks' shared input
(bench/compare.sh and the benches it calls), so that every figure comes from
the same bytes.

Per (layer, K|V, head): vectors drawn from a mixture of C Gaussian clusters
with per-dimension scales, plus noise, so that vector quantization and
general-purpose compressors meet data with structure, not white noise.
Deterministic for a given --seed. Memory stays bounded (written in chunks of
positions through a memory map).

    /usr/bin/python3 bench/mkcache.py -o FILE.npy [--positions 8192]
        [--layers 12] [--heads 12] [--dim 64] [--clusters 32] [--seed 0]
"""
import argparse
import os
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", required=True, help="the .npy file (must not exist)")
    ap.add_argument("--positions", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--clusters", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if os.path.exists(a.output):
        sys.exit(f"mkcache.py: {a.output} exists; remove it first")
    L, H, T, D, C = a.layers, a.heads, a.positions, a.dim, a.clusters
    if min(L, H, T, D, C) < 1:
        sys.exit("mkcache.py: every size must be at least 1")
    rng = np.random.default_rng(a.seed)
    tmp = a.output + ".tmp.npy"
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float16, shape=(L, 2, H, T, D))
    chunk = 2048
    for l in range(L):
        for kv in range(2):
            for h in range(H):
                scale = rng.uniform(0.2, 2.0, size=D).astype(np.float32)
                centres = rng.standard_normal((C, D), dtype=np.float32) * scale
                for t0 in range(0, T, chunk):
                    n = min(chunk, T - t0)
                    pick = rng.integers(0, C, size=n)
                    noise = rng.standard_normal((n, D), dtype=np.float32) * (0.35 * scale)
                    out[l, kv, h, t0:t0 + n] = (centres[pick] + noise).astype(np.float16)
    out.flush()
    del out
    os.replace(tmp, a.output)


if __name__ == "__main__":
    main()
