#!/usr/bin/env python3
"""Writes small GGUF metadata headers (no tensors) as seeds for fuzz_gguf
into OUT (default build-fuzz/seeds/gguf): llama-like and qwen2-like models,
GQA, head-count arrays, rope scaling, M-RoPE sections, nested and string
arrays, every value type once, and a few that are refused (version 1,
duplicate key, odd rope dims). Its own writer, after the layout in
tools/gguf.h. Usage: fuzz/gguf_seeds.py [OUT]"""
import os
import struct
import sys

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
       BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def val(t, v):
    if t == STR:
        return s(v)
    if t == ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(val(et, i) for i in items)
    return struct.pack(FMT[t], v)


def gguf(pairs, version=3, n_tensors=0):
    body = b"".join(s(k) + struct.pack("<I", t) + val(t, v) for k, t, v in pairs)
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(pairs)) + body


def model(arch, L, E, H, KV=None, extra=()):
    p = [("general.architecture", STR, arch), ("general.name", STR, arch + "-seed"),
         (arch + ".block_count", U32, L), (arch + ".embedding_length", U32, E),
         (arch + ".attention.head_count", U32, H)]
    if KV is not None:
        p.append((arch + ".attention.head_count_kv", U32, KV))
    return p + list(extra)


SEEDS = {
    "llama": gguf(model("llama", 5, 64, 8, 4, [("llama.context_length", U32, 512),
                                             ("llama.rope.dimension_count", U32, 8),
                                             ("llama.rope.freq_base", F32, 10000.0)])),
    "qwen2": gguf(model("qwen2", 24, 896, 14, 2, [("qwen2.attention.key_length", U64, 64),
                                                ("qwen2.attention.value_length", I32, 64),
                                                ("qwen2.rope.freq_base", F64, 1e6)]), version=2),
    "arch-last": gguf(model("phi3", 2, 96, 4)[1:] + [("general.architecture", STR, "phi3")]),
    "gpt2": gguf(model("gpt2", 2, 48, 4)),
    "head-arrays": gguf(model("llama", 3, 64, 8)[:4] + [
        ("llama.attention.head_count", ARR, (I32, [8, 8, 8])),
        ("llama.attention.head_count_kv", ARR, (U32, [2, 2, 2]))]),
    "scaling": gguf(model("llama", 2, 64, 8, 8, [("llama.rope.scaling.type", STR, "linear"),
                                               ("llama.rope.scaling.factor", F32, 4.0),
                                               ("llama.rope.scale_linear", F64, 1.0)])),
    "yarn": gguf(model("qwen3", 2, 64, 4, 2, [("qwen3.rope.scaling.type", STR, "yarn")])),
    "mrope": gguf(model("glm4", 2, 128, 2, 1, [("glm4.rope.dimension_sections", ARR,
                                              (I32, [8, 12, 12, 0]))])),
    "all-types": gguf(model("llama", 1, 16, 2, 1, [
        ("t.u8", U8, 1), ("t.i8", I8, -1), ("t.u16", U16, 2), ("t.i16", I16, -2),
        ("t.u32", U32, 3), ("t.i32", I32, -3), ("t.f32", F32, 1.5), ("t.bool", BOOL, True),
        ("t.str", STR, "x"), ("t.u64", U64, 4), ("t.i64", I64, -4), ("t.f64", F64, 2.5),
        ("t.strs", ARR, (STR, ["a", "bc", ""])),
        ("t.nest", ARR, (ARR, [(U8, [1, 2]), (STR, ["z"])]))])),
    "version1": gguf(model("llama", 1, 16, 2), version=1),
    "duplicate": gguf(model("llama", 1, 16, 2, 1, [("llama.block_count", U32, 1)])),
    "odd-rope": gguf(model("llama", 1, 16, 2, 1, [("llama.rope.dimension_count", U32, 7)])),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build-fuzz/seeds/gguf"
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name + ".gguf"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
