"""fkvf.pack against `fkvf pack` of the same cache: the same sections (every one but the
metadata, compared by `fkvf dump --json` checksums), the same restored bits (`fkvf
unpack`), the same automatic k and all-exact rule; its errors; torch inputs."""

import json
import os
import struct

import numpy as np
import pytest

from conftest import SRCDIR, load_safetensors, run_cli, unpack

CACHE = os.path.join(SRCDIR, "testdata", "sample-cache.safetensors")
TRAIN = os.path.join(SRCDIR, "testdata", "train-cache.safetensors")


def load(path=CACHE):
    t = load_safetensors(path)
    n = sum(1 for k in t if k.endswith(".key"))
    return (np.stack([t[f"layers.{i}.key"] for i in range(n)]),
            np.stack([t[f"layers.{i}.value"] for i in range(n)]), t.get("tokens"))


def write_safetensors(path, k, v, tokens=None):
    """A cache file for the CLI, written here: layers.{i}.key / .value [H, T, D] (F16 or
    F32), tokens [T] I64."""
    names = {np.dtype("<f2"): "F16", np.dtype("<f4"): "F32"}
    tensors = []
    for i in range(k.shape[0]):
        tensors += [(f"layers.{i}.key", k[i]), (f"layers.{i}.value", v[i])]
    if tokens is not None:
        tensors.append(("tokens", np.asarray(tokens, dtype="<i8")))
    header, blobs, off = {}, [], 0
    for name, a in tensors:
        b = np.ascontiguousarray(a).tobytes()
        dt = "I64" if a.dtype == np.dtype("<i8") else names[a.dtype]
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def sections(path):
    """Every section but the metadata: (type, key, size, stored size, checksum). The
    search index of the second commit (spec 20.7) follows the metadata, whose size differs
    between writers, so its checksum (seeded by its offset) would too: its stored bytes
    instead."""
    d = json.loads(run_cli("dump", "--json", path).stdout)
    data = open(path, "rb").read()
    return [(s["type"], s["key"], s["size"], s["stored_size"],
             data[s["offset"]:s["offset"] + s["stored_size"]] if s["type"] == "ZPOS"
             else s["checksum"])
            for s in d["sections"] if s["type"] != "META"]


def metadata(path):
    return json.loads(run_cli("info", "--json", path).stdout)["metadata"]


def cli_pack(src, out, *args):
    return json.loads(run_cli("pack", src, "-o", out, "--json", *args).stdout)


def same_restore(tmp_path, a, b, extra=()):
    ka, va, ta = unpack(tmp_path, a, extra=("--layout", "hnd", *extra))
    kb, vb, tb = unpack(tmp_path, b, extra=("--layout", "hnd", *extra))
    assert ka.dtype == kb.dtype
    assert ka.tobytes() == kb.tobytes() and va.tobytes() == vb.tobytes()
    assert (ta is None) == (tb is None)
    if ta is not None:
        assert np.array_equal(ta, tb)


RESULT_KEYS = ("positions", "exact", "archived", "fp16_bytes", "codebook_bytes", "k",
               "codebooks")


@pytest.mark.filterwarnings("ignore:.*even k = 16")  # f32 tables: as the CLI warns
@pytest.mark.parametrize("py, cli", [
    ({"seed": 3}, ["--seed", "3"]),
    ({"k": 32, "k_stages": 2, "v_stages": 3, "sinks": 8, "recent": 16, "iters": 5},
     ["--k", "32", "--k-stages", "2", "--v-stages", "3", "--sinks", "8", "--recent", "16",
      "--iters", "5"]),
    ({"codec": "ngon", "beam": 3, "deflate": True, "f32_tables": True},
     ["--codec", "ngon", "--beam", "3", "--deflate", "--f32"]),
    ({"keys": "as-is"}, ["--keys", "as-is"]),
    ({"rope": False}, ["--no-rope"]),
    ({"rope": {"theta": 500000.0, "dims": 4, "layout": "half-split"}},
     ["--rope-theta", "500000", "--rope-dims", "4", "--rope-layout", "half-split"]),
    ({"sinks": 300}, ["--sinks", "300"]),  # every position a sink
    ({"model_id": "stories260K", "tokenizer_id": "tok"},
     ["--model-id", "stories260K", "--tokenizer-id", "tok"]),
    # the embedded codebook trained on fkvf pack's sample (runs of 64 by the seed)
    ({"max_train_positions": 128, "seed": 2}, ["--max-train-positions", "128", "--seed", "2"]),
    ({"max_train_positions": 64}, ["--max-train-positions", "64"]),
    ({"max_train_positions": 0}, ["--max-train-positions", "all"]),
])
def test_same_as_cli(fkvf, tmp_path, py, cli):
    k, v, tok = load()
    r = fkvf.pack((k, v), tmp_path / "py.fkvf", tokens=tok, **py)
    c = cli_pack(CACHE, tmp_path / "cli.fkvf", *cli)
    assert sections(tmp_path / "py.fkvf") == sections(tmp_path / "cli.fkvf")
    same_restore(tmp_path, tmp_path / "py.fkvf", tmp_path / "cli.fkvf")
    assert {x: r[x] for x in RESULT_KEYS} == {x: c[x] for x in RESULT_KEYS}
    assert r["archive"] == str(tmp_path / "py.fkvf")
    assert r["bytes"] == os.path.getsize(tmp_path / "py.fkvf")
    run_cli("verify", tmp_path / "py.fkvf")


def test_metadata(fkvf, tmp_path):
    k, v, _ = load()
    fkvf.pack((k, v), tmp_path / "a.fkvf", seed=7, beam=2,
              metadata={"note": "hi", "n": 5, "neg": -2, "x": 0.5, "flag": True,
                        "raw": b"\x00\x01"})
    m = metadata(tmp_path / "a.fkvf")
    assert m["pack.tool"] == f"fkvf-python {fkvf.__version__}"
    assert m["pack.layout"] == "hnd" and m["pack.beam"] == 2 and m["pack.seed"] == 7
    assert "pack.names" not in m and "pack.codebooks" not in m
    assert m["note"] == "hi" and m["n"] == 5 and m["neg"] == -2 and m["x"] == 0.5
    assert m["flag"] is True
    with fkvf.open(tmp_path / "a.fkvf") as a:
        assert a.metadata["raw"] == b"\x00\x01"


def test_reads_back(fkvf, tmp_path):
    k, v, tok = load()
    r = fkvf.pack((k, v), tmp_path / "a.fkvf", tokens=tok)
    run_cli("verify", tmp_path / "a.fkvf")
    with fkvf.open(tmp_path / "a.fkvf") as a:
        assert a.n_positions == 256 and r["archived"] == 220
        assert np.array_equal(a.tokens, tok)
        exact = np.r_[0:4, 224:256]
        ka, va = a.read(positions=exact)
        assert ka.tobytes() == np.ascontiguousarray(k[:, :, exact]).tobytes()
        assert va.tobytes() == np.ascontiguousarray(v[:, :, exact]).tobytes()
        ka, _ = a.read(positions=slice(4, 224), dtype="f32")
        # archived positions: close to the input, not equal
        err = np.mean((ka - k[:, :, 4:224].astype(np.float32)) ** 2)
        assert 0 < err < np.mean(k[:, :, 4:224].astype(np.float32) ** 2) / 2


# The automatic k and the all-exact rule on the sample's shape (5 layers, 4 heads,
# key_dim = value_dim = 8, K x4 V x2, f16 tables): a codebook is 64 + 5*4*k*48*2 = 64 +
# 1920k bytes and A archived rows 640A fp16 bytes; k qualifies when 4 (64 + 1920k) <= 640A
# and 4k <= A: k = 16 from A = 193, 32 from A = 385. Below 193, k = 16 when its codebook
# (30784 bytes) plus 60 index bytes a row (20 heads x 6 stages x 4 bits) are fewer than the
# 640A bytes of the rows: A >= 54; A <= 53: every position exact.
@pytest.mark.parametrize("src, archived, want_k, want_archived", [
    (CACHE, 53, 0, 0), (CACHE, 54, 16, 54), (CACHE, 192, 16, 192), (CACHE, 193, 16, 193),
    (TRAIN, 384, 16, 384), (TRAIN, 385, 32, 385)])
def test_auto_k_as_cli(fkvf, tmp_path, src, archived, want_k, want_archived):
    k, v, _ = load(src)
    T = archived + 36
    k, v = k[:, :, :T], v[:, :, :T]
    write_safetensors(tmp_path / "c.safetensors", k, v)
    if want_k == 16 and archived < 193:  # k = 16 although it breaks the rule: a warning
        with pytest.warns(UserWarning, match="even k = 16 gives a codebook of 30784 bytes"):
            r = fkvf.pack((k, v), tmp_path / "py.fkvf")
    else:
        r = fkvf.pack((k, v), tmp_path / "py.fkvf")
    c = cli_pack(tmp_path / "c.safetensors", tmp_path / "cli.fkvf")
    assert (r["k"], r["archived"]) == (want_k, want_archived)
    assert (c["k"], c["archived"]) == (want_k, want_archived)
    assert r["codebooks"] == ("embedded" if want_k else None)
    assert sections(tmp_path / "py.fkvf") == sections(tmp_path / "cli.fkvf")
    if not want_k:
        with fkvf.open(tmp_path / "py.fkvf") as a:
            assert all(a.is_exact(p) for p in range(T))
            assert a.descriptor["n_sinks"] == 4  # the policy, not every position


def test_given_k_used_as_given(fkvf, tmp_path):
    k, v, _ = load()
    r = fkvf.pack((k[:, :, :60], v[:, :, :60]), tmp_path / "a.fkvf", k=64)
    assert r["k"] == 64 and r["archived"] == 24


@pytest.fixture(scope="module")
def cli_codebook(tmp_path_factory):
    d = tmp_path_factory.mktemp("cb")
    run_cli("train", TRAIN, "-o", d / "cli-cb.fkvf", "--k", "32", "--seed", "2")
    return d / "cli-cb.fkvf"


def test_cli_trained_codebook(fkvf, tmp_path, cli_codebook):
    k, v, tok = load()
    r = fkvf.pack((k, v), tmp_path / "py.fkvf", codebooks=cli_codebook, tokens=tok)
    c = cli_pack(CACHE, tmp_path / "cli.fkvf", "--codebooks", cli_codebook)
    assert sections(tmp_path / "py.fkvf") == sections(tmp_path / "cli.fkvf")
    same_restore(tmp_path, tmp_path / "py.fkvf", tmp_path / "cli.fkvf",
                 ("--codebooks", cli_codebook))
    assert r["codebooks"] == {"external": str(cli_codebook)} and r["k"] == 32
    assert r["codebook_bytes"] == os.path.getsize(cli_codebook) == c["codebook_bytes"]
    m = metadata(tmp_path / "py.fkvf")
    assert m["pack.codebooks"] == "cli-cb.fkvf" and "pack.seed" not in m
    with fkvf.open(tmp_path / "py.fkvf", codebooks=cli_codebook) as a:
        a.verify()


def test_python_trained_codebook_in_cli(fkvf, tmp_path):
    k, v, tok = load()
    fkvf.train(load(TRAIN)[:2], tmp_path / "py-cb.fkvf", k=16)
    fkvf.pack((k, v), tmp_path / "py.fkvf", codebooks=tmp_path / "py-cb.fkvf", tokens=tok)
    cli_pack(CACHE, tmp_path / "cli.fkvf", "--codebooks", tmp_path / "py-cb.fkvf")
    assert sections(tmp_path / "py.fkvf") == sections(tmp_path / "cli.fkvf")
    same_restore(tmp_path, tmp_path / "py.fkvf", tmp_path / "cli.fkvf",
                 ("--codebooks", tmp_path / "py-cb.fkvf"))


def test_codebook_key_settings(fkvf, tmp_path):
    """keys and RoPE come from the codebook's train.* metadata; a given setting that
    contradicts them is refused, as fkvf pack --codebooks refuses it."""
    k, v, _ = load()
    run_cli("train", TRAIN, "-o", tmp_path / "hs.fkvf", "--k", "16", "--rope-layout",
            "half-split", "--rope-theta", "500000")
    run_cli("train", TRAIN, "-o", tmp_path / "asis.fkvf", "--k", "16", "--keys", "as-is")
    fkvf.pack((k, v), tmp_path / "a.fkvf", codebooks=tmp_path / "hs.fkvf")
    rope = json.loads(run_cli("info", "--json", tmp_path / "a.fkvf").stdout)["cache"]["rope"]
    assert rope["layout"] == "half-split" and rope["theta"] == 500000
    fkvf.pack((k, v), tmp_path / "b.fkvf", codebooks=tmp_path / "asis.fkvf")
    rope = json.loads(run_cli("info", "--json", tmp_path / "b.fkvf").stdout)["cache"]["rope"]
    assert rope["keys"] == "as-is"
    for cb, kw, cli in [("hs.fkvf", {"rope": {"layout": "interleaved"}},
                         ["--rope-layout", "interleaved"]),
                        ("hs.fkvf", {"rope": fkvf.Rope(theta=10000)}, ["--rope-theta", "10000"]),
                        ("asis.fkvf", {"keys": "pre-rope"}, ["--keys", "pre-rope"])]:
        with pytest.raises(fkvf.CodebookError) as e:
            fkvf.pack((k, v), tmp_path / "x.fkvf", codebooks=tmp_path / cb, **kw)
        assert str(tmp_path / cb) in str(e.value) and e.value.file == str(tmp_path / cb)
        assert "trained with" in str(e.value) and "was given" in str(e.value)
        assert not os.path.exists(tmp_path / "x.fkvf")
        p = run_cli("pack", CACHE, "-o", tmp_path / "x.fkvf", "--codebooks", tmp_path / cb,
                    *cli, check=False)
        assert p.returncode == 1 and "trained with" in p.stderr


def test_codebook_shape_mismatch(fkvf, tmp_path, cli_codebook):
    k, v, _ = load()
    with pytest.raises(fkvf.CodebookError, match="does not fit the cache"):
        fkvf.pack((k[:4], v[:4]), tmp_path / "x.fkvf", codebooks=cli_codebook)
    with pytest.raises(fkvf.CodebookError, match="does not fit"):
        fkvf.pack((k[:, :2], v[:, :2]), tmp_path / "x.fkvf", codebooks=cli_codebook)
    with pytest.raises(fkvf.InvalidArgError, match="not a codebook file"):
        fkvf.pack((k, v), tmp_path / "x.fkvf",
                  codebooks=os.path.join(SRCDIR, "testdata", "sample.fkvf"))
    with pytest.raises(fkvf.IoError, match="missing.fkvf"):
        fkvf.pack((k, v), tmp_path / "x.fkvf", codebooks=tmp_path / "missing.fkvf")
    with pytest.warns(UserWarning, match="k is an option of training, ignored"):
        fkvf.pack((k, v), tmp_path / "w.fkvf", codebooks=cli_codebook, k=64)
    os.remove(tmp_path / "w.fkvf")
    with pytest.raises(ValueError, match="never replaced"):
        fkvf.pack((k, v), cli_codebook, codebooks=cli_codebook, overwrite=True)
    assert os.listdir(tmp_path) == []


def test_layouts_and_strides(fkvf, tmp_path):
    """Transposed, non-contiguous and nhd inputs give the same archive as the plain one."""
    k, v, _ = load()
    fkvf.pack((k, v), tmp_path / "ref.fkvf")
    ref = sections(tmp_path / "ref.fkvf")
    nk, nv = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [L, T, H, D] views
    fkvf.pack((nk, nv), tmp_path / "nhd.fkvf", layout="nhd")
    big = np.zeros(k.shape[:3] + (16,), dtype=k.dtype)
    big[..., ::2] = k
    fkvf.pack((big[..., ::2], np.asfortranarray(v)), tmp_path / "strided.fkvf")
    fkvf.pack((np.ascontiguousarray(nk).transpose(0, 2, 1, 3), v), tmp_path / "t.fkvf")
    for name in ("nhd", "strided", "t"):
        assert sections(tmp_path / f"{name}.fkvf") == ref, name
    assert metadata(tmp_path / "nhd.fkvf")["pack.layout"] == "nhd"


def test_dtype_conversion(fkvf, tmp_path):
    k, v, _ = load()
    r = fkvf.pack((k.astype(np.float64), v.astype(np.float64)), tmp_path / "a.fkvf",
                  dtype=np.float16)
    fkvf.pack((k, v), tmp_path / "b.fkvf")
    assert sections(tmp_path / "a.fkvf") == sections(tmp_path / "b.fkvf") and r["k"] == 16
    fkvf.pack((k, v), tmp_path / "c.fkvf", dtype="f32")
    with fkvf.open(tmp_path / "c.fkvf") as a:
        assert a.descriptor["dtype"] == "f32"
        ka, _ = a.read(positions=slice(0, 4), dtype="f32")
        assert np.array_equal(ka, k[:, :, :4].astype(np.float32))


def test_per_layer_pairs_half_split(fkvf, tmp_path):
    """Per-layer (k, v) pairs (Hugging Face): RoPE pairs half-split, as fkvf pack takes
    Hugging Face names; pack.names hf."""
    k, v, tok = load()
    pairs = [(k[i][None], v[i][None]) for i in range(k.shape[0])]
    fkvf.pack(pairs, tmp_path / "py.fkvf", seed=1, tokens=tok)
    cli_pack(CACHE, tmp_path / "cli.fkvf", "--seed", "1", "--rope-layout", "half-split")
    assert sections(tmp_path / "py.fkvf") == sections(tmp_path / "cli.fkvf")
    assert metadata(tmp_path / "py.fkvf")["pack.names"] == "hf"
    fkvf.pack(pairs, tmp_path / "il.fkvf", seed=1, rope={"layout": "interleaved"})
    fkvf.pack((k, v), tmp_path / "kv.fkvf", seed=1)
    assert sections(tmp_path / "il.fkvf") == sections(tmp_path / "kv.fkvf")


def test_overwrite(fkvf, tmp_path):
    k, v, _ = load()
    p = tmp_path / "a.fkvf"
    p.write_bytes(b"keep")
    with pytest.raises(fkvf.ExistsError) as e:
        fkvf.pack((k, v), p)
    assert e.value.file == str(p)
    assert p.read_bytes() == b"keep" and sorted(os.listdir(tmp_path)) == ["a.fkvf"]
    fkvf.pack((k, v), p, overwrite=True)
    run_cli("verify", p)


@pytest.mark.parametrize("kw, exc, match", [
    ({"k": 24}, ValueError, "^k: 24"), ({"k": 8}, ValueError, "^k: "),
    ({"k": 8192}, ValueError, "^k: "), ({"k": 16.0}, TypeError, "^k: "),
    ({"k_stages": 17}, ValueError, "^k_stages"), ({"v_stages": -1}, ValueError, "^v_stages"),
    ({"k_stages": 0, "v_stages": 0}, ValueError, "k_stages and v_stages"),
    ({"sinks": -1}, ValueError, "^sinks"), ({"recent": 2**32}, ValueError, "^recent"),
    ({"sinks": "4"}, TypeError, "^sinks"), ({"beam": 0}, ValueError, "^beam"),
    ({"beam": 65}, ValueError, "^beam"), ({"iters": 0}, ValueError, "^iters"),
    ({"seed": -1}, ValueError, "^seed"), ({"codec": "zip"}, ValueError, "^codec"),
    ({"keys": "after"}, ValueError, "^keys"), ({"rope": True}, TypeError, "^rope"),
    ({"rope": {"theta": -1}}, ValueError, "^rope theta"),
    ({"rope": {"dims": 3}}, ValueError, "^rope dims"),
    ({"rope": {"dims": 16}}, ValueError, "rope dims 16 does not fit key_dim 8"),
    ({"rope": {"layout": "zigzag"}}, ValueError, "^rope layout"),
    ({"rope": {"base": 1}}, ValueError, "^rope: unknown"),
    ({"layout": "thd"}, ValueError, "^layout"), ({"dtype": np.int8}, ValueError, "^dtype"),
    ({"metadata": [("a", 1)]}, TypeError, "^metadata"),
    ({"metadata": {"a": [1]}}, TypeError, r"^metadata\['a'\]"),
    ({"metadata": {1: "a"}}, TypeError, "^metadata: key"),
    ({"metadata": {"a": 2**64}}, ValueError, r"^metadata\['a'\]"),
    ({"metadata": {"pack.tool": "x"}}, "DupKeyError", "metadata entry 'pack.tool'"),
    ({"metadata": {"fkvf.x": "reserved"}}, "InvalidArgError", "reserved"),
    ({"model_id": 5}, TypeError, "^model_id"),
    ({"tokens": np.arange(255)}, ValueError, "^tokens"),
    ({"tokens": np.full(256, -1)}, ValueError, "^tokens"),
    ({"tokens": np.full(256, 2**32)}, ValueError, "^tokens"),
    ({"tokens": np.zeros(256, dtype=np.float32)}, TypeError, "^tokens"),
])
def test_bad_arguments(fkvf, tmp_path, kw, exc, match):
    k, v, _ = load()
    with pytest.raises(getattr(fkvf, exc) if isinstance(exc, str) else exc, match=match):
        fkvf.pack((k, v), tmp_path / "x.fkvf", **kw)
    assert os.listdir(tmp_path) == []


def test_bad_caches(fkvf, tmp_path):
    k, v, _ = load()
    bad = [
        ((k[0], v[0]), ValueError, "expected 4 dimensions"),
        ((k, v[:4]), ValueError, "keys have 5 layers, values 4"),
        ((k, v[:, :, :100]), ValueError, "values of layer 0"),
        ((k, v[:, :2]), ValueError, "values of layer 0"),
        ([(k[i][None].repeat(2, 0), v[i][None].repeat(2, 0)) for i in range(5)], ValueError,
         "a batch of 2"),
        ((k.astype(np.int16).view(np.complex64), v), TypeError, "floating point"),
        ((k[:, :, :0], v[:, :, :0]), ValueError, "no positions"),
        ("cache", TypeError, "cache"), ({"k": k}, TypeError, "cache"),
        ((k, v.astype(np.float32)), ValueError, "different dtypes"),
    ]
    for cache, exc, match in bad:
        with pytest.raises(exc, match=match):
            fkvf.pack(cache, tmp_path / "x.fkvf")
    with pytest.raises(TypeError, match="^path"):
        fkvf.pack((k, v), 5)
    assert os.listdir(tmp_path) == []


def test_nonfinite_is_a_library_error(fkvf, tmp_path):
    k, v, _ = load()
    k = k.copy()
    k[0, 0, 100, 0] = np.inf
    with pytest.raises(fkvf.InvalidArgError, match="training failed"):
        fkvf.pack((k, v), tmp_path / "x.fkvf")
    assert os.listdir(tmp_path) == []


# ---- torch ----------------------------------------------------------------------------

def test_torch(fkvf, tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch (Debian's python3-torch) not installed")
    k, v, tok = load()
    fkvf.pack((k, v), tmp_path / "np.fkvf", tokens=tok)
    ref = sections(tmp_path / "np.fkvf")
    tk, tv = torch.from_numpy(k.copy()), torch.from_numpy(v.copy())
    fkvf.pack((tk, tv), tmp_path / "t.fkvf", tokens=torch.from_numpy(tok.copy()))
    assert sections(tmp_path / "t.fkvf") == ref
    g = tk.float().requires_grad_(True)
    fkvf.pack((g, tv.float()), tmp_path / "g.fkvf", dtype="f16", tokens=tok)
    assert sections(tmp_path / "g.fkvf") == ref
    # a DynamicCache-like list of (k, v) [1, H, T, D] and an object with key_cache lists:
    # Hugging Face forms, half-split pairs
    pairs = [(tk[i][None], tv[i][None]) for i in range(5)]
    fkvf.pack(pairs, tmp_path / "pairs.fkvf")

    class Dyn:
        key_cache = [p[0] for p in pairs]
        value_cache = [p[1] for p in pairs]
    fkvf.pack(Dyn(), tmp_path / "dyn.fkvf")
    fkvf.pack((k, v), tmp_path / "hs.fkvf", rope={"layout": "half-split"})
    assert sections(tmp_path / "pairs.fkvf") == sections(tmp_path / "dyn.fkvf") == \
        sections(tmp_path / "hs.fkvf")
    # nhd tensors [L, T, H, D]
    fkvf.pack((tk.transpose(1, 2), tv.transpose(1, 2)), tmp_path / "nhd.fkvf", layout="nhd",
              tokens=tok)
    assert sections(tmp_path / "nhd.fkvf") == ref


def test_torch_bf16_and_gqa(fkvf, tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch (Debian's python3-torch) not installed")
    g = torch.Generator().manual_seed(5)
    # GQA: 2 KV heads, key_dim 16, value_dim 8
    k = torch.randn(3, 2, 200, 16, generator=g).to(torch.bfloat16)
    v = torch.randn(3, 2, 200, 8, generator=g).to(torch.bfloat16)
    with pytest.warns(UserWarning, match="even k = 16"):  # 164 rows: k = 16 is too big
        r = fkvf.pack([(k[i][None], v[i][None]) for i in range(3)], tmp_path / "a.fkvf")
    run_cli("verify", tmp_path / "a.fkvf")
    assert r["archived"] == 200 - 36
    with fkvf.open(tmp_path / "a.fkvf") as a:
        d = a.descriptor
        assert (d["dtype"], d["n_kv_heads"], d["key_dim"], d["value_dim"]) == ("bf16", 2, 16, 8)
        ka, va = a.read(positions=np.r_[0:4, 168:200], dtype="bf16")
    bits = lambda t: t.contiguous().view(torch.int16).numpy().view(np.uint16)  # noqa: E731
    exact = np.r_[0:4, 168:200]
    assert np.array_equal(ka.view(np.uint16), bits(k)[:, :, exact])
    assert np.array_equal(va.view(np.uint16), bits(v)[:, :, exact])
    # the CLI restores the same bits at every position
    kk, vv, _ = unpack(tmp_path, tmp_path / "a.fkvf", "bf16", extra=("--layout", "hnd"))
    assert np.array_equal(kk[:, :, exact], bits(k)[:, :, exact])


def test_index_default_and_off(fkvf, tmp_path):
    """fkvf.pack indexes the token stream as fkvf pack does (a second commit with one ZPOS
    section, the same bytes); index=False is --no-index (one commit, no index section)."""
    k, v, tok = load()
    r = fkvf.pack((k, v), tmp_path / "py.fkvf", tokens=tok, seed=3)
    c = cli_pack(CACHE, tmp_path / "cli.fkvf", "--seed", "3")
    assert r["indexed"] is True and c["indexed"] is True
    s = sections(tmp_path / "py.fkvf")
    assert [x[0] for x in s].count("ZPOS") == 1 and s == sections(tmp_path / "cli.fkvf")
    r = fkvf.pack((k, v), tmp_path / "py0.fkvf", tokens=tok, seed=3, index=False)
    c = cli_pack(CACHE, tmp_path / "cli0.fkvf", "--seed", "3", "--no-index")
    assert r["indexed"] is False and c["indexed"] is False
    s = sections(tmp_path / "py0.fkvf")
    assert "ZPOS" not in [x[0] for x in s] and s == sections(tmp_path / "cli0.fkvf")
    info = json.loads(run_cli("info", "--json", tmp_path / "py.fkvf").stdout)
    assert info["commits"] == 2 and info["bytes"]["search_index"] == 64 + 4 * info["positions"]
    assert json.loads(run_cli("info", "--json", tmp_path / "py0.fkvf").stdout)["commits"] == 1
    # the index: <= 8 bytes per indexed position, its commit included
    grown = os.path.getsize(tmp_path / "py.fkvf") - os.path.getsize(tmp_path / "py0.fkvf")
    assert 0 < grown <= 8 * info["positions"]
