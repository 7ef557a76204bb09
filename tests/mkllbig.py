#!/usr/bin/python3
"""Write a large llama.cpp sequence state quickly (NumPy), for the memory
tests and benchmarks of import-llama / export-llama: f16 K and V, either V
layout, token ids, the layout of docs/llamacpp.md section 5 (as
tests/mkllstate.py writes it, whose element values it does not reproduce:
these are random f16 of magnitude below 2). Written a layer's block at a
time, so memory stays near one layer's rows whatever the size.

usage: mkllbig.py OUT --layers L --heads H --dim D --cells N [--v-trans 0|1]
       [--seed S]
"""
import argparse
import struct

import numpy as np


def block(rng, rows, cols):
    # random f16 bit patterns with the exponent's top bit cleared: finite,
    # |x| < 2 (no NaN, no infinity)
    return (rng.integers(0, 1 << 16, size=(rows, cols), dtype=np.uint16) & 0xBFFF).astype("<u2")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--cells", type=int, required=True)
    ap.add_argument("--v-trans", type=int, default=0, choices=(0, 1))
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    n, row = a.cells, a.heads * a.dim
    with open(a.out, "wb") as f:
        f.write(struct.pack("<III", 0x67677371, 3, n))
        f.write(((np.arange(n, dtype=np.int64) * 37 + 5) % 32000).astype("<i4").tobytes())
        f.write(struct.pack("<II", 1, n))
        cells = np.zeros((n, 3), dtype="<i4")
        cells[:, 0] = np.arange(n)
        cells[:, 1] = 1
        f.write(cells.tobytes())
        f.write(struct.pack("<II", a.v_trans, a.layers))
        for _ in range(a.layers):
            f.write(struct.pack("<iQ", 1, row * 2))
            f.write(block(rng, n, row).tobytes())
        for _ in range(a.layers):
            if a.v_trans:
                f.write(struct.pack("<iII", 1, 2, row))
                f.write(block(rng, row, n).tobytes())  # channel-major
            else:
                f.write(struct.pack("<iQ", 1, row * 2))
                f.write(block(rng, n, row).tobytes())


if __name__ == "__main__":
    main()
