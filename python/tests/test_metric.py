"""The encoder metric (spec 13.8) from Python: fkvf.train(key_metric=, value_metric=)
writes it (a CMET, ENCODER_METRIC), fkvf.pack(codebooks=) and the Appender encode under
it; the refusals; the ABI check against a 0.2 library."""

import ctypes
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import SRCDIR, run_cli
from test_pack import CACHE, TRAIN, load

OPTFEAT_ENCODER_METRIC = 2


def spd(rng, n, d, decay=0.5, ridge=0.05):
    """n strongly anisotropic symmetric positive definite d x d matrices: B B^T + ridge I
    with the columns of B decaying by `decay`."""
    b = rng.standard_normal((n, d, d)) * decay ** np.arange(d)
    return b @ b.transpose(0, 2, 1) + ridge * np.eye(d)


def metrics(seed=0):
    k, v, _ = load(TRAIN)
    L, H, _, Dk = k.shape
    rng = np.random.default_rng(seed)
    return (spd(rng, L * H, Dk).reshape(L, H, Dk, Dk),
            spd(rng, L * H, v.shape[3]).reshape(L, H, v.shape[3], v.shape[3]))


def reader_metric(fkvf, path):
    """(keys, values) of the file's CMET through fkvf_reader_metric (None: a part it does
    not hold), or None when it has none (FKVF_E_NOT_FOUND)."""
    lib = fkvf._lib
    r = lib.Reader()
    assert lib.lib.fkvf_reader_open_file(ctypes.byref(r), os.fsencode(path), 0, None) == 0
    try:
        sh, h = lib.CodebookShape(), (ctypes.c_uint8 * 16)()
        assert lib.lib.fkvf_reader_codebook(r, ctypes.byref(sh), None, None, h) == 0
        m = lib.RvqMetric()
        rc = lib.lib.fkvf_reader_metric(r, ctypes.byref(m))
        if rc == lib.E_NOT_FOUND:
            return None
        assert rc == 0
        out = []
        for p, d in ((m.keys, sh.key_dim), (m.values, sh.value_dim)):
            n = sh.n_layers * sh.n_heads * d * d
            out.append(None if not p else np.ctypeslib.as_array(p, (n,)).reshape(
                sh.n_layers, sh.n_heads, d, d).copy())
        return tuple(out)
    finally:
        lib.lib.fkvf_reader_free(r)


def strip_metric(fkvf, src, dst):
    """A copy of codebook file src without its CMET: the same CBK1 (so the same content
    hash) and train.* metadata, written here with the library's writer."""
    lib, L = fkvf._lib, fkvf._lib.lib
    by = ctypes.byref
    r, w = lib.Reader(), lib.Writer()
    assert L.fkvf_reader_open_file(by(r), os.fsencode(src), 0, None) == 0
    try:
        sh, data, size = lib.CodebookShape(), ctypes.c_void_p(), ctypes.c_size_t()
        assert L.fkvf_reader_codebook(r, by(sh), by(data), by(size), None) == 0
        off = L.fkvf_codebook_tables_offset(by(sh))
        wo = lib.WriterOptions()
        L.fkvf_writer_options_init(by(wo))
        assert L.fkvf_writer_create_file(by(w), os.fsencode(dst), by(wo), None) == 0
        meta = json.loads(run_cli("info", "--json", src).stdout)["metadata"]
        for key, val in meta.items():
            key = key.encode()
            rc = (L.fkvf_writer_meta_utf8(w, key, val.encode()) if isinstance(val, str) else
                  L.fkvf_writer_meta_f64(w, key, val) if key == b"train.rope_theta" else
                  L.fkvf_writer_meta_u64(w, key, val))
            assert rc == 0
        assert L.fkvf_writer_add_codebooks(w, by(sh), data.value + off, size.value - off,
                                           0) == 0
        assert L.fkvf_writer_finish(w) == 0
    finally:
        L.fkvf_writer_free(w)
        L.fkvf_reader_free(r)


def restored(fkvf, path):
    with fkvf.open(path) as a:
        return a.read(dtype=np.float32)


def metric_error(x, xr, m):
    """sum over positions of e^T M e, per (layer, head): [L, H, T, D] rows, M [L, H, D, D]."""
    e = (x.astype(np.float64) - xr.astype(np.float64))
    return np.einsum("lhti,lhij,lhtj->", e, m, e)


def test_train_writes_the_metric(fkvf, tmp_path):
    k, v, _ = load(TRAIN)
    mk, mv = metrics()
    for kw, want in (({"key_metric": mk}, "keys"), ({"value_metric": mv}, "values"),
                     ({"key_metric": mk, "value_metric": mv}, "keys+values")):
        p = tmp_path / f"{want}.fkvf"
        r = fkvf.train((k, v), p, k=16, **kw)
        assert r["metric"] == want
        info = json.loads(run_cli("info", "--json", p).stdout)
        assert info["optional_features"] & OPTFEAT_ENCODER_METRIC
        assert info["format"] == "1.2"  # the bit came with 1.2 (spec 1.3.1)
        got = reader_metric(fkvf, p)
        for given, read in zip((kw.get("key_metric"), kw.get("value_metric")), got):
            if given is None:
                assert read is None
            else:
                assert read.dtype == np.float32
                np.testing.assert_array_equal(read, given.astype(np.float32))
        run_cli("verify", p)
    r = fkvf.train((k, v), tmp_path / "none.fkvf", k=16)
    assert r["metric"] is None
    assert reader_metric(fkvf, tmp_path / "none.fkvf") is None
    info = json.loads(run_cli("info", "--json", tmp_path / "none.fkvf").stdout)
    assert not info["optional_features"] & OPTFEAT_ENCODER_METRIC


def test_pooled_metric_shapes(fkvf, tmp_path):
    k, v, _ = load(TRAIN)
    L, Dk = k.shape[0], k.shape[3]
    m = spd(np.random.default_rng(3), L, Dk)
    fkvf.train((k, v), tmp_path / "a.fkvf", k=16, pooled=True, key_metric=m)  # [L, D, D]
    fkvf.train((k, v), tmp_path / "b.fkvf", k=16, pooled=True,
               key_metric=m[:, None].tolist())  # [L, 1, D, D], a nested list
    ra, rb = (reader_metric(fkvf, tmp_path / n) for n in ("a.fkvf", "b.fkvf"))
    np.testing.assert_array_equal(ra[0], m[:, None].astype(np.float32))
    np.testing.assert_array_equal(ra[0], rb[0])
    assert open(tmp_path / "a.fkvf", "rb").read() == open(tmp_path / "b.fkvf", "rb").read()
    with pytest.raises(ValueError, match=r"key_metric: shape \(5, 4, 8, 8\), expected "
                       r"\(5, 1, 8, 8\) or \(5, 8, 8\)"):
        fkvf.train((k, v), tmp_path / "x.fkvf", k=16, pooled=True,
                   key_metric=np.broadcast_to(m[:, None], (L, 4, Dk, Dk)))


def test_identity_metric_changes_nothing(fkvf, tmp_path):
    """Under M = I the trained tables and the packed archive are those of no metric."""
    k, v, _ = load(TRAIN)
    kc, vc, _ = load(CACHE)
    L, H, _, Dk = k.shape
    eye = np.broadcast_to(np.eye(Dk), (L, H, Dk, Dk))
    os.mkdir(tmp_path / "m")
    os.mkdir(tmp_path / "e")
    ri = fkvf.train((k, v), tmp_path / "m" / "cb.fkvf", k=16, key_metric=eye, value_metric=eye)
    re = fkvf.train((k, v), tmp_path / "e" / "cb.fkvf", k=16)
    assert ri["content_hash"] == re["content_hash"]
    for d in ("m", "e"):
        fkvf.pack((kc, vc), tmp_path / d / "a.fkvf", codebooks=tmp_path / d / "cb.fkvf",
                  model_id="same")
    assert open(tmp_path / "m" / "a.fkvf", "rb").read() == \
        open(tmp_path / "e" / "a.fkvf", "rb").read()


def test_metric_is_its_symmetric_part(fkvf, tmp_path):
    """A matrix that is not symmetric to the last bit (a Gram matrix computed in floating
    point often is not) is taken as (M + M^T) / 2: the same codebook and the same stored
    matrices as giving that part."""
    k, v, _ = load(TRAIN)
    mk, _ = metrics(3)
    mk = mk.astype(np.float32)
    asym = mk.copy()  # (0, 5) doubled, (5, 0) zeroed: the same part (2a + 0) / 2 = a, exactly
    asym[1, 2, 0, 5] *= 2
    asym[1, 2, 5, 0] = 0
    ra = fkvf.train((k, v), tmp_path / "a.fkvf", k=16, key_metric=asym)
    rs = fkvf.train((k, v), tmp_path / "s.fkvf", k=16, key_metric=mk)
    assert ra["content_hash"] == rs["content_hash"]
    ka, _ = reader_metric(fkvf, tmp_path / "a.fkvf")
    ks, _ = reader_metric(fkvf, tmp_path / "s.fkvf")
    assert np.array_equal(ka, ks) and np.array_equal(ka, mk)
    assert open(tmp_path / "a.fkvf", "rb").read() == open(tmp_path / "s.fkvf", "rb").read()


def test_pack_encodes_under_the_metric(fkvf, tmp_path):
    """The same tables with and without their metric (a copy of the codebook file without
    the CMET): packing against the metric's file gives other symbols, of lower metric error
    and higher Euclidean error; the Appender (the C library's encoder) picks the same ones."""
    k, v, _ = load(TRAIN)
    kc, vc, _ = load(CACHE)
    mk, mv = metrics(1)
    os.mkdir(tmp_path / "m")
    os.mkdir(tmp_path / "e")
    fkvf.train((k, v), tmp_path / "m" / "cb.fkvf", k=16, key_metric=mk, value_metric=mv,
               rope=False)
    strip_metric(fkvf, tmp_path / "m" / "cb.fkvf", tmp_path / "e" / "cb.fkvf")
    assert reader_metric(fkvf, tmp_path / "e" / "cb.fkvf") is None
    out = {}
    for d in ("m", "e"):
        p = tmp_path / d / "a.fkvf"
        res = fkvf.pack((kc, vc), p, codebooks=tmp_path / d / "cb.fkvf", sinks=0, recent=0)
        assert res["archived"] == kc.shape[2]
        run_cli("verify", p, "--codebooks", tmp_path / d / "cb.fkvf")
        out[d] = restored(fkvf, p)
    # the archives refer to one codebook (the same content hash): either file opens both
    with fkvf.open(tmp_path / "e" / "a.fkvf", codebooks=tmp_path / "m" / "cb.fkvf") as a:
        np.testing.assert_array_equal(a.read(dtype=np.float32)[0], out["e"][0])
    (km, vm), (ke, ve) = out["m"], out["e"]
    assert not np.array_equal(km, ke) and not np.array_equal(vm, ve)
    # keys without RoPE (rope=False): both parts are encoded in the frame they are stored in
    for x, m, xm, xe in ((kc, mk, km, ke), (vc, mv, vm, ve)):
        assert metric_error(x, xm, m) < metric_error(x, xe, m)
        x = x.astype(np.float64)
        assert np.sum((x - xm) ** 2) > np.sum((x - xe) ** 2)
    # the Appender (the C library's encoder, reading the metric from the codebook file when
    # it creates the archive and when it opens it again) encodes alike
    half = kc.shape[2] // 2
    with fkvf.Appender(tmp_path / "m" / "ap.fkvf", create=True, sinks=0, recent=0,
                       codebooks=tmp_path / "m" / "cb.fkvf") as ap:
        ap.append(kc[:, :, :half], vc[:, :, :half])
    with fkvf.Appender(tmp_path / "m" / "ap.fkvf", codebooks=tmp_path / "m" / "cb.fkvf") as ap:
        ap.append(kc[:, :, half:], vc[:, :, half:])
    kap, vap = restored(fkvf, tmp_path / "m" / "ap.fkvf")
    np.testing.assert_array_equal(kap, km)
    np.testing.assert_array_equal(vap, vm)


def test_anisotropic_metric_beats_euclidean_training(fkvf, tmp_path):
    """A codebook trained under a strongly anisotropic value metric has a lower metric
    error on a held-out cache than one trained Euclidean with the same settings."""
    k, v, _ = load(TRAIN)
    kc, vc, _ = load(CACHE)
    _, mv = metrics(2)
    errs = {}
    for name, kw in (("m", {"value_metric": mv}), ("e", {})):
        fkvf.train((k, v), tmp_path / f"{name}.cb", k=16, **kw)
        fkvf.pack((kc, vc), tmp_path / f"{name}.fkvf", codebooks=tmp_path / f"{name}.cb",
                  sinks=0, recent=0)
        errs[name] = metric_error(vc, restored(fkvf, tmp_path / f"{name}.fkvf")[1], mv)
    assert errs["m"] < 0.5 * errs["e"], errs


def test_pack_refuses_a_damaged_metric(fkvf, tmp_path):
    """A codebook file whose CMET fails its checks: fkvf.pack raises the reader's error
    naming the file (no archive written), never packs Euclidean instead."""
    k, v, _ = load(TRAIN)
    kc, vc, _ = load(CACHE)
    fkvf.train((k, v), tmp_path / "cb.fkvf", k=16, key_metric=metrics()[0])
    cmet = [s for s in json.loads(run_cli("dump", "--json", tmp_path / "cb.fkvf").stdout)
            ["sections"] if s["type"] == "CMET"]
    assert len(cmet) == 1 and not cmet[0]["required"]
    data = bytearray((tmp_path / "cb.fkvf").read_bytes())
    data[cmet[0]["offset"] + 70] ^= 1  # a matrix element
    (tmp_path / "bad.fkvf").write_bytes(bytes(data))
    with pytest.raises(fkvf.ChecksumError, match="^the codebook's encoder metric: .*bad.fkvf: "
                       "offset .*section CMET") as e:
        fkvf.pack((kc, vc), tmp_path / "a.fkvf", codebooks=tmp_path / "bad.fkvf")
    assert e.value.file == str(tmp_path / "bad.fkvf")
    assert not (tmp_path / "a.fkvf").exists()


def test_refusals(fkvf, tmp_path):
    k, v, _ = load(TRAIN)
    mk, mv = metrics()
    L, H, _, Dk = k.shape
    x = tmp_path / "x.fkvf"
    with pytest.raises(ValueError, match=r"^key_metric: shape \(5, 8, 8\), expected "
                       r"\(5, 4, 8, 8\): one key_dim x key_dim matrix per layer and codebook "
                       r"head .*n_heads 4 \(the cache's KV heads\)"):
        fkvf.train((k, v), x, k=16, key_metric=mk[:, 0])
    with pytest.raises(ValueError, match=r"^value_metric: shape \(5, 4, 8, 7\)"):
        fkvf.train((k, v), x, k=16, value_metric=mv[..., :7])
    bad = mk.copy()
    bad[2, 1, 3, 4] = bad[2, 1, 4, 3] = np.inf
    with pytest.raises(ValueError, match=r"^key_metric\[2, 1\]: element \(3, 4\) is inf .*"
                       "finite"):
        fkvf.train((k, v), x, k=16, key_metric=bad)
    bad = mv.copy()
    bad[0, 0, 0, 0] = 1e39  # finite in binary64, not in float32
    with pytest.raises(ValueError, match=r"^value_metric\[0, 0\]: element \(0, 0\) is inf"):
        fkvf.train((k, v), x, k=16, value_metric=bad)
    bad = mv.copy()
    bad[3, 2] = np.diag([1.0] * 7 + [-1e-3])  # symmetric, one negative eigenvalue
    with pytest.raises(ValueError, match=r"^value_metric\[3, 2\]: not positive definite"):
        fkvf.train((k, v), x, k=16, key_metric=mk, value_metric=bad)
    bad[3, 2] = 0.0  # positive semi-definite only
    with pytest.raises(ValueError, match=r"^value_metric\[3, 2\]: not positive definite"):
        fkvf.train((k, v), x, k=16, value_metric=bad)
    with pytest.raises(TypeError, match="^key_metric: dtype complex128"):
        fkvf.train((k, v), x, k=16, key_metric=mk.astype(complex))
    with pytest.raises(TypeError, match="^key_metric: dtype"):
        fkvf.train((k, v), x, k=16, key_metric="identity")
    assert os.listdir(tmp_path) == []  # no file left behind by any refusal


def test_abi_check_refuses_a_0_2_library(fkvf):
    """A library of another 0.x (0.2: its fkvf_rvq_params has no metric) is refused at
    import, naming both versions."""
    lib = os.environ.get("FKVF_LIBRARY") or fkvf._lib.lib._name
    code = (
        "import ctypes\n"
        "real = ctypes.CDLL\n"
        "class Old(real):\n"
        "    def __getattr__(self, name):\n"
        "        f = real.__getattr__(self, name)\n"
        "        if name == 'fkvf_version_number':\n"
        "            g = lambda: 205\n"  # 0.2.5: major * 10000 + minor * 100 + patch
        "            g.restype, g.argtypes = f.restype, f.argtypes\n"
        "            setattr(self, name, g)\n"
        "            return g\n"
        "        return f\n"
        "ctypes.CDLL = Old\n"
        "import fkvf\n")
    env = dict(os.environ, FKVF_LIBRARY=os.path.abspath(lib),
               PYTHONPATH=os.path.join(SRCDIR, "python"))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd="/")
    assert p.returncode != 0
    assert "ImportError: fkvf: the loaded libfkvf is 0.2.5, this binding needs 0.4.x (set " \
        "FKVF_LIBRARY to the path of a matching libfkvf.so)" in p.stderr, p.stderr
