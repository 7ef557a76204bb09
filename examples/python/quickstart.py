"""Quick start of the fkvf Python package on the bundled sample data (README "Python").

Two real KV caches of the stories260K model (testdata/, f16, keys as cached after RoPE with
interleaved pairs): a shared codebook is trained on one, the other is archived with it, read
back and compared, then grown by 16 positions with an Appender and searched.

    /usr/bin/python3 examples/python/quickstart.py [OUT_DIR]

Without OUT_DIR the files go to a temporary directory that is removed at the end. Without an
installed fkvf it uses the package in python/ (which finds build/libfkvf/libfkvf.so).
"""

import json
import os
import struct
import sys
import tempfile

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir)
try:
    import fkvf  # installed (cmake --install, pip)
except ModuleNotFoundError:  # else the source tree's python/, with build/libfkvf/libfkvf.so
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import fkvf


def load_cache(path):
    """A cache file of docs/cache-files.md (layers.N.key / .value [H, T, D], tokens), read
    with NumPy: ((K, V) as [L, H, T, D] arrays, token ids)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    types = {"F16": np.float16, "F32": np.float32, "I32": np.int32, "I64": np.int64}

    def tensor(name):
        t = header[name]
        a, b = t["data_offsets"]
        return np.frombuffer(raw[8 + n + a:8 + n + b], dtype=types[t["dtype"]]).reshape(
            t["shape"])

    n_layers = sum(1 for name in header if name.endswith(".key"))
    k = np.stack([tensor(f"layers.{i}.key") for i in range(n_layers)])
    v = np.stack([tensor(f"layers.{i}.value") for i in range(n_layers)])
    return (k, v), tensor("tokens")


def main(out):
    (k, v), tokens = load_cache(os.path.join(ROOT, "testdata", "sample-cache.safetensors"))
    train_kv, _ = load_cache(os.path.join(ROOT, "testdata", "train-cache.safetensors"))
    L, H, T, D = k.shape
    print(f"cache: {L} layers x {H} KV heads x {T} positions x {D} dims, {k.dtype}")

    # 1. a shared codebook, trained on another cache of the same model (keys un-rotated with
    #    the model's RoPE before training: interleaved pairs, theta 10000)
    rope = fkvf.Rope(theta=10000, layout="interleaved")
    cb = fkvf.train(train_kv, os.path.join(out, "stories.cbk"), k=64, rope=rope)
    print(f"codebook: k = {cb['k']}, {cb['bytes']} bytes")

    # 2. the archive: 4 sinks + 32 recent positions exact, the rest as RVQ indices
    r = fkvf.pack((k, v), os.path.join(out, "sample.fkvf"), codebooks=cb["out"],
                  sinks=4, recent=32, tokens=tokens, rope=rope)
    print(f"archive: {r['positions']} positions ({r['archived']} archived), {r['bytes']} bytes, "
          f"{r['ratio_fp16_without_codebook']:.2f}x smaller than fp16 without the shared codebook")

    # 3. read it back: exact positions bit for bit, archived ones close
    with fkvf.open(r["archive"]) as a:
        a.verify()
        k2, v2 = a.read()
        exact = np.array([a.is_exact(t) for t in range(a.n_positions)])
    assert np.array_equal(k2[:, :, exact], k[:, :, exact])
    assert np.array_equal(v2[:, :, exact], v[:, :, exact])
    for name, x, y in (("keys", k, k2), ("values", v, v2)):
        x, y = x[:, :, ~exact].astype(np.float32), y[:, :, ~exact].astype(np.float32)
        print(f"{name}: relative MSE of the archived positions "
              f"{np.sum((x - y) ** 2) / np.sum(x ** 2):.4f}; exact positions bit-identical")

    # 4. grow it: 16 more positions (here: the first 16 again) in one commit
    with fkvf.Appender(r["archive"]) as ap:
        ap.append(k[:, :, :16], v[:, :, :16], tokens=tokens[:16])
    with fkvf.open(r["archive"]) as a:
        print(f"after the append: {a.n_positions} positions")
        # 5. where has the archive seen its first 8 tokens before?
        print("the first 8 tokens end at positions", a.find(a.tokens[:8]).tolist())


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.makedirs(sys.argv[1], exist_ok=True)
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(d)
