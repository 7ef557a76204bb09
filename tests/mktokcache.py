"""A .safetensors cache with token ids for the memory tests (cli_memory.sh,
cli_unpack_memory.sh): layers.{i}.key / .value [H, T, D] f16 of standard
normals (keys optionally scaled by 1 + d / 16 along the head dim), tokens [T]
int64 in [0, 50000), written a tensor at a time in the order layer 0's keys,
its values, ..., tokens, from numpy's default_rng(SEED).

usage: mktokcache.py OUT --layers L --heads H --positions T --dim D --seed S
                     [--key-ramp] [--meta KEY=VALUE]
"""
import argparse
import json
import struct

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--positions", type=int, required=True)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--key-ramp", action="store_true",
                    help="keys scaled by 1 + d / 16 along the head dim")
    ap.add_argument("--meta", action="append", default=[], help="KEY=VALUE __metadata__ entry")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    L, H, T, D = a.layers, a.heads, a.positions, a.dim
    ts = {}
    for l in range(L):
        k = rng.standard_normal((H, T, D))
        if a.key_ramp:
            k = k * (1 + np.arange(D) / 16)
        ts[f"layers.{l}.key"] = k.astype(np.float16)
        ts[f"layers.{l}.value"] = rng.standard_normal((H, T, D)).astype(np.float16)
    ts["tokens"] = rng.integers(0, 50000, T).astype(np.int64)
    hdr, off = {}, 0
    if a.meta:
        hdr["__metadata__"] = dict(m.split("=", 1) for m in a.meta)
    for name, v in ts.items():
        hdr[name] = {"dtype": "F16" if v.dtype == np.float16 else "I64", "shape": list(v.shape),
                     "data_offsets": [off, off + v.nbytes]}
        off += v.nbytes
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(a.out, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for v in ts.values():
            f.write(v.tobytes())


if __name__ == "__main__":
    main()
