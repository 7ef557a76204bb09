#!/usr/bin/python3
"""Write a llama.cpp state file for tests, from this script's own reading of
the layout (docs/llamacpp.md section 5), independent of tools/llama_state.c.

usage: mkllstate.py OUT --layers L --heads H --dim D [--vdim DV] --cells N
       [--type f16|bf16|f32] [--vtype ...] [--v-trans 0|1] [--kind seq|session]
       [--arch NAME] [--n-stream S] [--stream I] [--seq-id Q] [--tokens 0|1]
       [--seed X] [--pos-start P] [--n-seq-id K]

Element values are pseudo-random (a hash of the seed, layer, K|V, cell and
element), small enough for f16; a file with more cells and the same seed
continues one with fewer, cell for cell (an engine's later save). --pos-start and --n-seq-id make the unsupported files the tests
check are refused (positions not from 0; cells in K sequences).
Standard library only.
"""
import argparse
import struct

GGML = {"f32": 0, "f16": 1, "bf16": 30}
SIZE = {"f32": 4, "f16": 2, "bf16": 2}


M64 = 0xFFFFFFFFFFFFFFFF


def value(seed, layer, kv, cell, e):
    """The element (layer, K=0/V=1, cell, e): a hash of them, so that a
    longer file of the same seed continues a shorter one cell for cell."""
    x = (seed * 0x9E3779B97F4A7C15 + layer * 0xBF58476D1CE4E5B9 + kv * 0x94D049BB133111EB
         + cell * 0x2545F4914F6CDD1D + e * 0x632BE59BD9B4E019) & M64
    x ^= x >> 31
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 29
    return ((x >> 40) / float(1 << 24)) * 4.0 - 2.0  # [-2, 2)


def elem(t, v):
    if t == "f32":
        return struct.pack("<f", v)
    if t == "f16":
        return struct.pack("<e", v)
    # bf16: the top half of the f32 bits (truncation is fine for test data)
    return struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--vdim", type=int)
    ap.add_argument("--cells", type=int, required=True)
    ap.add_argument("--type", default="f16", choices=GGML)
    ap.add_argument("--vtype", choices=GGML)
    ap.add_argument("--v-trans", type=int, default=0, choices=(0, 1))
    ap.add_argument("--kind", default="seq", choices=("seq", "session"))
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--n-stream", type=int, default=1)
    ap.add_argument("--stream", type=int, default=0)
    ap.add_argument("--seq-id", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=1, choices=(0, 1))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pos-start", type=int, default=0)
    ap.add_argument("--n-seq-id", type=int, default=1)
    ap.add_argument("--token-salt", type=int, default=0)
    a = ap.parse_args()
    kt, vt = a.type, a.vtype or a.type
    dv = a.vdim or a.dim
    n = a.cells
    b = bytearray()
    u32 = lambda v: b.extend(struct.pack("<I", v))
    i32 = lambda v: b.extend(struct.pack("<i", v))
    if a.kind == "seq":
        u32(0x67677371)
        u32(3)
    else:
        u32(0x6767736E)
        u32(10)
    ntok = n if a.tokens else 0
    u32(ntok)
    for t in range(ntok):
        i32(1 if t == 0 else 3 + (t * 37 + a.token_salt) % 256)
    if a.kind == "session":
        name = a.arch.encode()
        u32(len(name))
        b.extend(name)
    u32(a.n_stream)
    for s in range(a.n_stream):
        if s != a.stream:
            u32(0)
            continue
        u32(n)
        if n == 0:
            continue  # an empty stream: its cell count only
        for c in range(n):
            i32(a.pos_start + c)
            u32(a.n_seq_id)
            for q in range(a.n_seq_id):
                i32(a.seq_id + q)
        u32(a.v_trans)
        u32(a.layers)
        krow = a.heads * a.dim
        for l in range(a.layers):
            i32(GGML[kt])
            b.extend(struct.pack("<Q", krow * SIZE[kt]))
            for c in range(n):
                for e in range(krow):
                    b.extend(elem(kt, value(a.seed, l, 0, c, e)))
        vrow = a.heads * dv
        for l in range(a.layers):
            i32(GGML[vt])
            if a.v_trans:
                u32(SIZE[vt])
                u32(vrow)
                for j in range(vrow):  # channel-major: channel j of every cell
                    for c in range(n):
                        b.extend(elem(vt, value(a.seed, l, 1, c, j)))
            else:
                b.extend(struct.pack("<Q", vrow * SIZE[vt]))
                for c in range(n):
                    for e in range(vrow):
                        b.extend(elem(vt, value(a.seed, l, 1, c, e)))
    with open(a.out, "wb") as f:
        f.write(b)


if __name__ == "__main__":
    main()
