#!/usr/bin/python3
"""Write a GGUF file that holds only metadata (no tensors), for tests of
the tools that read a model's shape from it (fkvf import-llama --model).
This script's own reading of GGUF v3, independent of tools/gguf.c.

usage: mkgguf.py OUT --arch A --layers L --embd E --heads H [--kv-heads K]
       [--key-length N] [--value-length N] [--rope-dims N] [--theta X]
       [--name S] [--scaling TYPE] [--version V] [--vocab N]
Standard library only.
"""
import argparse
import struct


def s(b, text):
    t = text.encode()
    b.extend(struct.pack("<Q", len(t)))
    b.extend(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--embd", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--key-length", type=int)
    ap.add_argument("--value-length", type=int)
    ap.add_argument("--rope-dims", type=int)
    ap.add_argument("--theta", type=float)
    ap.add_argument("--name")
    ap.add_argument("--scaling")
    ap.add_argument("--version", type=int, default=3)
    ap.add_argument("--vocab", type=int, help="ARCH.vocab_size")
    a = ap.parse_args()
    kv = []  # (key, type, packed value)
    def u32(key, v):
        kv.append((key, 4, struct.pack("<I", v)))
    def st(key, v):
        b = bytearray()
        s(b, v)
        kv.append((key, 8, bytes(b)))
    st("general.architecture", a.arch)
    if a.name:
        st("general.name", a.name)
    p = a.arch + "."
    u32(p + "block_count", a.layers)
    u32(p + "embedding_length", a.embd)
    u32(p + "attention.head_count", a.heads)
    if a.kv_heads is not None:
        u32(p + "attention.head_count_kv", a.kv_heads)
    if a.key_length is not None:
        u32(p + "attention.key_length", a.key_length)
    if a.value_length is not None:
        u32(p + "attention.value_length", a.value_length)
    if a.vocab is not None:
        u32(p + "vocab_size", a.vocab)
    if a.rope_dims is not None:
        u32(p + "rope.dimension_count", a.rope_dims)
    if a.theta is not None:
        kv.append((p + "rope.freq_base", 6, struct.pack("<f", a.theta)))
    if a.scaling:
        st(p + "rope.scaling.type", a.scaling)
    b = bytearray(b"GGUF")
    b.extend(struct.pack("<IQQ", a.version, 0, len(kv)))
    for key, t, v in kv:
        s(b, key)
        b.extend(struct.pack("<I", t))
        b.extend(v)
    with open(a.out, "wb") as f:
        f.write(b)


if __name__ == "__main__":
    main()
