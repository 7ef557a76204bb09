#!/usr/bin/python3
"""Makes and inspects raw KV-cache files for tests/cli_cachefiles.sh, with the
Python standard library only (no numpy): writes .safetensors, .npy and .npz
the way safetensors and numpy.save/savez lay them out, independently of
the CLI's readers and writers (tools/cacheio*.c).

usage: cachefiles.py COMMAND ...
  convert IN.safetensors OUT [options]   rewrite a cache written by fkvf
      --nhd            key/value tensors positions-first [T, H, D]
      --names fkvf|hf|hf-legacy|hf-dynamic|odd   tensor names (fkvf;
                       odd: k{i}, v{i}, ids, which no scheme accepts)
      --batch          a leading batch dimension of 1
      --heads N        keep the first N KV heads only
      --positions N    keep the first N positions only
      --dtype f16|bf16 element type (f16; bf16 from the f16 values)
      --rerotate       keys interleaved-rotated (theta 10000) -> un-rotated and
                       rotated half-split (a Hugging Face-style twin)
      --unrotate       keys un-rotated (interleaved, theta 10000): no RoPE
      --retheta X      keys un-rotated and rotated again interleaved with theta X
      --extra NAME     an extra int64 tensor [1, T] named NAME (repeatable)
      --meta KEY=VALUE a __metadata__ entry (repeatable; .safetensors only)
      --no-tokens      leave out the token ids
    OUT: .safetensors, .npz (one NAME.npy member per tensor) or .npy
    ([L, 2, (1,) H, T, D], or [L, 2, (1,) T, H, D] with --nhd).
  header FILE.safetensors    print the header as JSON (sorted keys)
  tokens FILE.safetensors NAME   print the int64 values of tensor NAME
"""
import io
import json
import math
import struct
import sys
import zipfile

DT = {"F16": ("e", 2), "BF16": ("H", 2), "F32": ("f", 4), "I64": ("q", 8), "I32": ("i", 4)}


def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    data = b[8 + n:]
    meta = head.pop("__metadata__", {})
    out = {}
    for k, v in head.items():
        s, e = v["data_offsets"]
        f, w = DT[v["dtype"]]
        out[k] = (v["dtype"], v["shape"], list(struct.unpack("<%d%s" % ((e - s) // w, f), data[s:e])))
    return out, meta


def to_bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16 & 0xFFFF


def rotate(vec, t, layout, inverse, theta=10000.0):
    d = len(vec)
    v = list(vec)
    for i in range(d // 2):
        ang = t * theta ** (-2.0 * i / d) * (-1.0 if inverse else 1.0)
        c, s = math.cos(ang), math.sin(ang)
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + d // 2)
        x, y = v[a], v[b]
        v[a], v[b] = x * c - y * s, x * s + y * c
    return v


NAMES = {
    "fkvf": ("layers.%d.key", "layers.%d.value", "tokens"),
    "hf": ("past_key_values.%d.key", "past_key_values.%d.value", "input_ids"),
    "hf-legacy": ("past_key_values.%d.0", "past_key_values.%d.1", "input_ids"),
    "hf-dynamic": ("key_cache.%d", "value_cache.%d", "input_ids"),
    "odd": ("k%d", "v%d", "ids"),  # no scheme fkvf accepts
}


def npy_bytes(descr, shape, raw):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, ", ".join(str(x) for x in shape) + ("," if len(shape) == 1 else ""))
    pad = 64 - (10 + len(d) + 1) % 64
    d = d + " " * (pad % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + raw


def convert(args):
    src, dst = args[0], args[1]
    opt = {"nhd": False, "names": "fkvf", "batch": False, "heads": None, "positions": None,
           "dtype": "f16", "rerotate": False, "unrotate": False, "retheta": None, "extra": [], "meta": {},
           "tokens": True}
    i = 2
    while i < len(args):
        a = args[i]
        if a in ("--nhd", "--batch", "--rerotate", "--unrotate"):
            opt[a[2:]] = True
        elif a == "--no-tokens":
            opt["tokens"] = False
        elif a in ("--names", "--heads", "--positions", "--dtype", "--retheta"):
            i += 1
            opt[a[2:]] = args[i] if a in ("--names", "--dtype") else \
                float(args[i]) if a == "--retheta" else int(args[i])
        elif a == "--extra":
            i += 1
            opt["extra"].append(args[i])
        elif a == "--meta":
            i += 1
            k, v = args[i].split("=", 1)
            opt["meta"][k] = v
        else:
            sys.exit("cachefiles.py: unknown option " + a)
        i += 1
    t, _ = read_st(src)
    L = len([k for k in t if k.endswith(".key")])
    _, (H, T, D), _ = t["layers.0.key"]
    h2 = opt["heads"] or H
    t2 = opt["positions"] or T
    tensors = []  # (name, dtype, shape, values)
    kname, vname, tname = NAMES[opt["names"]]
    for l in range(L):
        for kv in (0, 1):
            _, _, vals = t[("layers.%d.value" if kv else "layers.%d.key") % l]
            rows = {}
            for h in range(h2):
                for p in range(t2):
                    r = vals[(h * T + p) * D:(h * T + p + 1) * D]
                    if kv == 0 and opt["rerotate"]:
                        r = rotate(rotate(r, p, "interleaved", True), p, "half-split", False)
                    elif kv == 0 and opt["unrotate"]:
                        r = rotate(r, p, "interleaved", True)
                    elif kv == 0 and opt["retheta"]:
                        r = rotate(rotate(r, p, "interleaved", True), p, "interleaved", False,
                                   opt["retheta"])
                    rows[h, p] = r
            order = [(h, p) for p in range(t2) for h in range(h2)] if opt["nhd"] else \
                [(h, p) for h in range(h2) for p in range(t2)]
            flat = [x for hp in order for x in rows[hp]]
            shape = [t2, h2, D] if opt["nhd"] else [h2, t2, D]
            if opt["batch"]:
                shape = [1] + shape
            tensors.append(((vname if kv else kname) % l, opt["dtype"], shape, flat))
    if opt["tokens"] and "tokens" in t:
        toks = t["tokens"][2][:t2]
        tensors.append((tname, "i64", [1, t2] if opt["names"] != "fkvf" else [t2], toks))
    for e in opt["extra"]:
        tensors.append((e, "i64", [1, t2], list(range(t2))))

    def raw(dtype, vals):
        if dtype == "f16":
            return struct.pack("<%de" % len(vals), *vals)
        if dtype == "bf16":
            return struct.pack("<%dH" % len(vals), *[to_bf16(x) for x in vals])
        return struct.pack("<%dq" % len(vals), *vals)

    if dst.endswith(".safetensors"):
        head, blobs, off = {}, [], 0
        if opt["meta"]:
            head["__metadata__"] = opt["meta"]
        for name, dtype, shape, vals in tensors:
            b = raw(dtype, vals)
            head[name] = {"dtype": {"f16": "F16", "bf16": "BF16", "i64": "I64"}[dtype],
                          "shape": shape, "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        h = json.dumps(head, separators=(",", ":")).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        open(dst, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    elif dst.endswith(".npz"):
        with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
            for name, dtype, shape, vals in tensors:
                descr = {"f16": "<f2", "bf16": "<u2", "i64": "<i8"}[dtype]
                z.writestr(name + ".npy", npy_bytes(descr, shape, raw(dtype, vals)))
    elif dst.endswith(".npy"):
        kv = [x for x in tensors if x[1] != "i64"]
        shape = [L, 2] + kv[0][2]
        vals = [x for tt in kv for x in tt[3]]
        open(dst, "wb").write(npy_bytes({"f16": "<f2", "bf16": "<u2"}[opt["dtype"]], shape,
                                        raw(opt["dtype"], vals)))
    else:
        sys.exit("cachefiles.py: unknown output format " + dst)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "convert":
        convert(args)
    elif cmd == "header":
        b = open(args[0], "rb").read()
        n = struct.unpack("<Q", b[:8])[0]
        head = json.loads(b[8:8 + n])
        for v in head.values():
            v.pop("data_offsets", None)
        print(json.dumps(head, sort_keys=True))
    elif cmd == "tokens":
        t, _ = read_st(args[0])
        print(",".join(str(x) for x in t[args[1]][2]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
