#!/usr/bin/env python3
"""Seed inputs for fuzz_llama_state: small llama.cpp state files (the layout
of tools/llama_state.h), written into the directory given (default
fuzz/corpus/llama_state). Valid files of every supported kind, type and V
layout, empty states, and a few well-formed files the reader refuses
(quantized type, a cell in two sequences, a gap in positions).
Usage: fuzz/llama_state_seeds.py [OUT_DIR]"""
import os
import struct
import sys

F32, F16, BF16, Q8_0 = 0, 1, 30, 8
EL = {F32: 4, F16: 2, BF16: 2, Q8_0: 2}


def state(kind="seq", tokens=True, arch=b"llama", n_stream=1, stream=0, T=2, L=2, H=1, Dk=2,
          Dv=2, kt=F16, vt=F16, v_trans=0, seq=0, n_seq=None, pos=None):
    b = bytearray()
    u32 = lambda v: b.extend(struct.pack("<I", v & 0xFFFFFFFF))
    u32(0x67677371 if kind == "seq" else 0x6767736E)
    u32(3 if kind == "seq" else 10)
    u32(T if tokens else 0)
    for t in range(T if tokens else 0):
        u32(t * 7 + 1)
    if kind == "session":
        u32(len(arch))
        b.extend(arch)
    u32(n_stream)
    for s in range(n_stream):
        n = T if s == stream else 0
        u32(n)
        if not n:
            continue
        for t in range(n):
            u32(pos[t] if pos else t)
            k = n_seq[t] if n_seq else 1
            u32(k)
            for i in range(k):
                u32(seq + i)
        u32(v_trans)
        u32(L)
        x = 0
        for _ in range(L):
            u32(kt)
            b.extend(struct.pack("<Q", H * Dk * EL[kt]))
            for _ in range(n * H * Dk * EL[kt]):
                b.append(x & 0xFF)
                x += 37
        for _ in range(L):
            u32(vt)
            if v_trans:
                u32(EL[vt])
                u32(H * Dv)
            else:
                b.extend(struct.pack("<Q", H * Dv * EL[vt]))
            for _ in range(n * H * Dv * EL[vt]):
                b.append(x & 0xFF)
                x += 53
    return bytes(b)


SEEDS = {
    "seq-f16-v0": state(),
    "seq-f32-v1": state(kt=F32, vt=F32, v_trans=1, T=3),
    "seq-bf16-v0-notok": state(kt=BF16, vt=BF16, tokens=False),
    "seq-f16k-f32v-v1": state(kt=F16, vt=F32, v_trans=1),
    "seq-2stream-1": state(n_stream=2, stream=1, seq=1),
    "seq-2head": state(H=2, Dk=3, Dv=2, L=1, T=2, v_trans=1),
    "seq-empty": state(T=0),
    "session-f16-v1": state(kind="session", v_trans=1),
    "session-bf16-2stream": state(kind="session", arch=b"qwen2", kt=BF16, vt=F16, n_stream=2, stream=1),
    "session-empty": state(kind="session", T=0, n_stream=2),
    "refused-q8_0": state(kt=Q8_0),
    "refused-two-seqs": state(n_seq=[1, 2]),
    "refused-pos-gap": state(pos=[0, 2]),
}

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus", "llama_state")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print("llama_state_seeds: %d files in %s" % (len(SEEDS), out))
