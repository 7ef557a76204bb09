"""fkvf.train against `fkvf train` of the same caches: the same codebook section (its
`fkvf dump --json` checksum), the same content hash and train.* metadata; its errors."""

import json
import os

import numpy as np
import pytest

from conftest import run_cli
from test_pack import CACHE, TRAIN, load, metadata, sections, write_safetensors


def cli_train(out, *args):
    return json.loads(run_cli("train", *args, "-o", out, "--json").stdout)


def check_same(py_path, cli_path, r, c):
    assert sections(py_path) == sections(cli_path)
    assert metadata(py_path) == metadata(cli_path)
    for key in ("layers", "heads", "pooled", "k", "k_stages", "v_stages", "layer_stages",
                "dtype", "bytes", "content_hash"):
        assert r[key] == c[key], key
    if "metric" in c:  # the encoder metric (spec 13.8), once the CLI prints it
        assert r["metric"] == c["metric"]
    assert r["bytes"] == os.path.getsize(py_path)


@pytest.mark.parametrize("py, cli", [
    ({"k": 16}, ["--k", "16"]),
    ({"k": 32, "k_stages": 2, "v_stages": 1, "seed": 9, "iters": 4, "f32_tables": True},
     ["--k", "32", "--k-stages", "2", "--v-stages", "1", "--seed", "9", "--iters", "4",
      "--f32"]),
    ({"k": 16, "pooled": True}, ["--k", "16", "--pooled"]),
    # stage counts per layer (format 1.1): the same table either way
    ({"k": 16, "layer_stages": [(0, 1), (3, 2), (2, 2), (2, 1), (1, 1)]},
     ["--k", "16", "--layer-stages", "0:1,3:2,2:2,2:1,1:1"]),
    ({"k": 16, "keys": "as-is"}, ["--k", "16", "--keys", "as-is"]),
    ({"k": 16, "rope": False}, ["--k", "16", "--no-rope"]),
    ({"k": 16, "rope": {"theta": 1e6, "dims": 6, "layout": "half-split"}},
     ["--k", "16", "--rope-theta", "1000000", "--rope-dims", "6", "--rope-layout",
      "half-split"]),
])
def test_same_as_cli(fkvf, tmp_path, py, cli):
    k, v, _ = load(TRAIN)
    r = fkvf.train((k, v), tmp_path / "py.fkvf", **py)
    c = cli_train(tmp_path / "cli.fkvf", TRAIN, *cli)
    check_same(tmp_path / "py.fkvf", tmp_path / "cli.fkvf", r, c)
    assert r["n_caches"] == 1 and r["out"] == str(tmp_path / "py.fkvf")


@pytest.mark.parametrize("n, seed", [(128, 0), (192, 3), (512, 0), (0, 0)])
def test_sample_same_as_cli(fkvf, tmp_path, n, seed):
    """max_train_positions: the sample of fkvf train --max-train-positions (runs of 64
    chosen by the seed, keys un-rotated at their true positions): the same codebook"""
    k, v, _ = load(TRAIN)
    r = fkvf.train((k, v), tmp_path / "py.fkvf", k=16, seed=seed, max_train_positions=n)
    c = cli_train(tmp_path / "cli.fkvf", TRAIN, "--k", "16", "--seed", str(seed),
                  "--max-train-positions", str(n))
    check_same(tmp_path / "py.fkvf", tmp_path / "cli.fkvf", r, c)
    full = cli_train(tmp_path / "full.fkvf", TRAIN, "--k", "16", "--seed", str(seed))
    assert (c["content_hash"] == full["content_hash"]) == (n in (0, 512))


def test_sample_several_caches(fkvf, tmp_path):
    k, v, _ = load(TRAIN)
    k2, v2, _ = load(CACHE)
    write_safetensors(tmp_path / "b.safetensors", k2[:, :, :100], v2[:, :, :100])
    r = fkvf.train([(k, v), (k2[:, :, :100], v2[:, :, :100])], tmp_path / "py.fkvf", k=16,
                   seed=4, max_train_positions=256)
    c = cli_train(tmp_path / "cli.fkvf", TRAIN, tmp_path / "b.safetensors", "--k", "16",
                  "--seed", "4", "--max-train-positions", "256")
    check_same(tmp_path / "py.fkvf", tmp_path / "cli.fkvf", r, c)


def test_sample_runs_rule(fkvf):
    """the rule itself, against runs computed by hand from docs/codebooks.md (the same
    cases as tests/test_cli_sample.c)"""
    from fkvf.pack import _sample_runs
    assert _sample_runs([1000], 256, 0) == [(0, 64, 64), (0, 640, 128), (0, 832, 64)]
    assert _sample_runs([300, 70, 1000], 320, 42) == \
        [(0, 0, 64), (0, 128, 64), (2, 512, 64), (2, 768, 128)]
    assert _sample_runs([130, 130], 128, 1) == [(1, 64, 66)]
    assert _sample_runs([300, 0, 70], 370, 5) == [(0, 0, 300), (2, 0, 70)]


@pytest.mark.parametrize("bad, exc", [(63, ValueError), (-1, ValueError), (1.5, TypeError),
                                      ("all", TypeError)])
def test_sample_bad_values(fkvf, tmp_path, bad, exc):
    k, v, _ = load(TRAIN)
    with pytest.raises(exc, match="max_train_positions"):
        fkvf.train((k, v), tmp_path / "bad.fkvf", k=16, max_train_positions=bad)
    assert not (tmp_path / "bad.fkvf").exists()


def test_defaults_and_metadata(fkvf, tmp_path):
    k, v, _ = load(TRAIN)
    r = fkvf.train((k, v), tmp_path / "a.fkvf")
    assert (r["k"], r["k_stages"], r["v_stages"], r["dtype"], r["pooled"]) == \
        (256, 4, 2, "f16", False)
    assert metadata(tmp_path / "a.fkvf") == {
        "train.keys": "pre-rope", "train.rope_theta": 10000, "train.rope_dims": 8,
        "train.rope_layout": "interleaved", "train.seed": 0, "train.caches": 1}


def test_several_caches(fkvf, tmp_path):
    k, v, _ = load(TRAIN)
    k2, v2, _ = load(CACHE)
    write_safetensors(tmp_path / "b.safetensors", k2[:, :, :100], v2[:, :, :100])
    caches = [(k, v), (k2[:, :, :100], v2[:, :, :100])]
    r = fkvf.train(caches, tmp_path / "py.fkvf", k=32, seed=4)
    c = cli_train(tmp_path / "cli.fkvf", TRAIN, tmp_path / "b.safetensors", "--k", "32",
                  "--seed", "4")
    check_same(tmp_path / "py.fkvf", tmp_path / "cli.fkvf", r, c)
    assert r["n_caches"] == 2 and metadata(tmp_path / "py.fkvf")["train.caches"] == 2
    # per-layer pairs: one cache, Hugging Face form (half-split pairs); a list of them:
    # several
    pairs = [(k[i][None], v[i][None]) for i in range(5)]
    r1 = fkvf.train(pairs, tmp_path / "pairs.fkvf", k=16)
    assert r1["n_caches"] == 1
    assert metadata(tmp_path / "pairs.fkvf")["train.rope_layout"] == "half-split"
    r2 = fkvf.train([pairs, pairs], tmp_path / "pairs2.fkvf", k=16)
    assert r2["n_caches"] == 2


def test_torch_caches(fkvf, tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch (Debian's python3-torch) not installed")
    k, v, _ = load(TRAIN)
    fkvf.train((k, v), tmp_path / "np.fkvf", k=16)
    fkvf.train((torch.from_numpy(k.copy()), torch.from_numpy(v.copy())), tmp_path / "t.fkvf",
               k=16)
    assert sections(tmp_path / "np.fkvf") == sections(tmp_path / "t.fkvf")


def test_layer_stages(fkvf, tmp_path):
    """A codebook with stage counts per layer: a format 1.1 codebook file (LAYER_STAGES),
    packed against by both packs, restored; an all-equal table is the uniform codebook
    (a 1.0 file); bad tables refused."""
    k, v, _ = load(TRAIN)
    table = [(0, 1), (3, 2), (2, 2), (2, 1), (1, 1)]
    r = fkvf.train((k, v), tmp_path / "cb.fkvf", k=16, layer_stages=table)
    assert (r["k_stages"], r["v_stages"]) == (3, 2)  # the maxima
    assert r["layer_stages"] == [list(p) for p in table]
    info = json.loads(run_cli("info", "--json", tmp_path / "cb.fkvf").stdout)
    assert info["format"] == "1.1" and info["required_features"] & 8
    run_cli("pack", CACHE, "-o", tmp_path / "a.fkvf", "--codebooks", tmp_path / "cb.fkvf")
    fkvf.pack(load(CACHE)[:2], tmp_path / "b.fkvf", codebooks=tmp_path / "cb.fkvf",
              rope={"layout": "interleaved"})
    for name in ("a.fkvf", "b.fkvf"):
        run_cli("verify", tmp_path / name, "--codebooks", tmp_path / "cb.fkvf")
        info = json.loads(run_cli("info", "--json", tmp_path / name).stdout)
        assert info["required_features"] & 8, name
    # embedded, trained by fkvf.pack; every position restores within the quantizer's error
    kc, vc, _ = load(CACHE)
    fkvf.pack((kc, vc), tmp_path / "e.fkvf", k=16, layer_stages=table, recent=0, sinks=0)
    run_cli("verify", tmp_path / "e.fkvf")
    with fkvf.open(tmp_path / "e.fkvf") as a:
        kr, vr = a.read()
    assert kr.shape == kc.shape and vr.shape == vc.shape
    assert np.all(kr[0] == 0)  # layer 0 has no key stage: its keys restore as zeros
    assert np.all(vr[4] != 0)
    # pairs all equal: the uniform codebook, a 1.0 file
    fkvf.train((k, v), tmp_path / "u.fkvf", k=16, layer_stages=[(2, 1)] * 5)
    info = json.loads(run_cli("info", "--json", tmp_path / "u.fkvf").stdout)
    assert info["format"] == "1.0" and not info["required_features"] & 8
    for bad, msg in (([(1, 1)] * 4, "5 layers"), ([(17, 1)] * 5, "0..16"),
                     ([(0, 0)] * 5, "no stage"), ([1, 2, 3, 4, 5], "pair")):
        with pytest.raises(ValueError, match=msg):
            fkvf.train((k, v), tmp_path / "x.fkvf", k=16, layer_stages=bad)


def test_cli_pack_takes_it(fkvf, tmp_path):
    k, v, _ = load(TRAIN)
    fkvf.train((k, v), tmp_path / "cb.fkvf", k=16, rope={"layout": "half-split"})
    run_cli("pack", CACHE, "-o", tmp_path / "a.fkvf", "--codebooks", tmp_path / "cb.fkvf")
    info = json.loads(run_cli("info", "--json", tmp_path / "a.fkvf").stdout)
    assert info["cache"]["rope"]["layout"] == "half-split"  # the codebook's, taken
    run_cli("verify", tmp_path / "a.fkvf")


def test_errors(fkvf, tmp_path):
    k, v, _ = load(TRAIN)
    for kw, exc, match in [({"k": 100}, ValueError, "^k: 100"), ({"k": 2}, ValueError, "^k"),
                           ({"k_stages": 20}, ValueError, "^k_stages"),
                           ({"iters": 0}, ValueError, "^iters"),
                           ({"keys": "x"}, ValueError, "^keys"),
                           ({"rope": {"dims": 10}}, ValueError, "rope dims 10"),
                           ({"layout": "x"}, ValueError, "^layout")]:
        with pytest.raises(exc, match=match):
            fkvf.train((k, v), tmp_path / "x.fkvf", **kw)
    with pytest.raises(ValueError, match=r"caches\[1\]: shape 5 layers x 2 heads"):
        fkvf.train([(k, v), (k[:, :2], v[:, :2])], tmp_path / "x.fkvf")
    with pytest.raises(ValueError, match="no positions"):
        fkvf.train((k[:, :, :0], v[:, :, :0]), tmp_path / "x.fkvf")
    bad = k.astype(np.float32)
    bad[1, 1, 7, 3] = np.nan
    with pytest.raises(fkvf.InvalidArgError, match="training failed"):
        fkvf.train((bad, v.astype(np.float32)), tmp_path / "x.fkvf", k=16)
    assert os.listdir(tmp_path) == []
    (tmp_path / "x.fkvf").write_bytes(b"keep")
    with pytest.raises(fkvf.ExistsError):
        fkvf.train((k, v), tmp_path / "x.fkvf", k=16)
    assert (tmp_path / "x.fkvf").read_bytes() == b"keep"
    assert os.listdir(tmp_path) == ["x.fkvf"]
    fkvf.train((k, v), tmp_path / "x.fkvf", k=16, overwrite=True)
    run_cli("verify", tmp_path / "x.fkvf")
