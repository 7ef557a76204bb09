#!/usr/bin/python3
"""Checks restored cache rows against the original cache, independently of
libfkvf: reads the original .safetensors (FKVF names layers.{i}.key/value,
[H, T, D], f16/bf16/f32) with the standard library only, and the restored
rows as little-endian binary32 in the row layout of spec 14.2 (per position,
per layer the keys of heads 0..H-1, then their values).

usage: check_restored.py ORIGINAL.safetensors ROWS.f32 SINKS RECENT MIN_KEY_DB MIN_VALUE_DB

Asserts: the rows file holds exactly T rows; the SINKS first and RECENT last
positions are bit-identical to the original (converted to binary32); the
other positions have an SNR (signal over error energy) of at least
MIN_KEY_DB for the keys and MIN_VALUE_DB for the values. Prints the figures; exit 1 on
any failure."""
import json
import math
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack_from("<Q", raw, 0)
    head = json.loads(raw[8:8 + hlen])
    head.pop("__metadata__", None)
    base = 8 + hlen
    fmt = {"F16": ("e", 2), "F32": ("f", 4), "BF16": (None, 2)}
    out = {}
    for name, t in head.items():
        if not (name.startswith("layers.") and name.endswith((".key", ".value"))):
            continue
        code, size = fmt[t["dtype"]]
        a, b = t["data_offsets"]
        buf = raw[base + a:base + b]
        n = len(buf) // size
        if code:
            vals = struct.unpack("<%d%s" % (n, code), buf)
        else:  # bf16: the top half of a binary32
            vals = [struct.unpack("<f", b"\0\0" + buf[2 * i:2 * i + 2])[0] for i in range(n)]
        out[name] = (t["shape"], vals)
    return out


def main():
    if len(sys.argv) != 7:
        print(__doc__)
        return 2
    orig, rows_path, sinks, recent = sys.argv[1:5]
    sinks, recent = int(sinks), int(recent)
    min_snr = {"key": float(sys.argv[5]), "value": float(sys.argv[6])}
    tensors = load(orig)
    n_layers = len(tensors) // 2
    h, t_len, dk = tensors["layers.0.key"][0]
    dv = tensors["layers.0.value"][0][2]
    row_floats = n_layers * h * (dk + dv)
    with open(rows_path, "rb") as f:
        data = f.read()
    fails = []
    if len(data) != t_len * row_floats * 4:
        print("rows file: %d bytes, expected %d positions x %d floats"
              % (len(data), t_len, row_floats))
        return 1
    got = struct.unpack("<%df" % (t_len * row_floats), data)
    f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
    sig = {"key": 0.0, "value": 0.0}
    err = {"key": 0.0, "value": 0.0}
    exact_bad = 0
    for t in range(t_len):
        exact = t < sinks or t >= t_len - recent
        i = t * row_floats
        for layer in range(n_layers):
            for kind, d in (("key", dk), ("value", dv)):
                vals = tensors["layers.%d.%s" % (layer, kind)][1]
                for head in range(h):
                    src = (head * t_len + t) * d
                    for c in range(d):
                        want, have = vals[src + c], got[i]
                        i += 1
                        if exact:
                            if struct.pack("<f", f32(want)) != struct.pack("<f", have):
                                exact_bad += 1
                        else:
                            sig[kind] += want * want
                            err[kind] += (want - have) ** 2
    n_exact = min(t_len, sinks + recent)
    print("%d exact positions: %d elements differ" % (n_exact, exact_bad))
    if exact_bad:
        fails.append("exact positions differ")
    for kind in ("key", "value"):
        snr = 10 * math.log10(sig[kind] / err[kind]) if err[kind] > 0 else math.inf
        print("%s SNR over the %d archived positions: %.2f dB (at least %.1f)"
              % (kind, t_len - n_exact, snr, min_snr[kind]))
        if not snr >= min_snr[kind]:
            fails.append("%s SNR %.2f dB below %.1f" % (kind, snr, min_snr[kind]))
    for f in fails:
        print("FAIL: " + f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
