"""One rule for key / RoPE options (fkvf._keys): fkvf.pack and fkvf.Appender(create=True)
take the same forms (keys=, rope=None | fkvf.Rope | dict | False) and write the same
descriptor fields for the same cache form; a codebook file's train.* settings win where
none was given. Expected descriptor values are written out here (spec 8: rope_layout 1
interleaved, 2 half-split; key_storage 1 un-rotated)."""

import os

import numpy as np
import pytest

from conftest import SRCDIR, load_safetensors

KEYS = ("key_transform", "rope_layout", "rope_dims", "rope_theta", "key_storage")


def rand_cache(seed, L=2, H=2, T=5, Dk=8, Dv=6):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((L, H, T, Dk)).astype(np.float16),
            rng.standard_normal((L, H, T, Dv)).astype(np.float16))


def key_fields(fkvf, path):
    with fkvf.open(path) as r:
        d = r.descriptor
    return tuple(d[k] for k in KEYS)


def via_pack(fkvf, path, cache, **kw):
    fkvf.pack(cache, path, **kw)
    return key_fields(fkvf, path)


def via_appender(fkvf, path, k, v, **kw):
    with fkvf.Appender(path, create=True, **kw) as a:
        a.append(k, v)
    return key_fields(fkvf, path)


@pytest.mark.parametrize("kw, want", [
    ({}, None),  # the cache form's default, below
    ({"rope": False}, (0, 0, 0, 0.0, 0)),
    ({"keys": "as-is"}, "as-is"),
    ({"rope": None}, None),
    ({"rope": {"theta": 500000.0, "dims": 4}}, "custom"),
    ({"rope": "Rope"}, "rope-obj"),
])
def test_pack_and_appender_same_descriptor(fkvf, tmp_path, kw, want):
    if kw.get("rope") == "Rope":
        kw = {"rope": fkvf.Rope(theta=2.5, dims=6, layout="half-split")}
    k, v = rand_cache(1)
    pairs_k = [k[i] for i in range(k.shape[0])]  # per-layer [H, T, D]
    pairs_v = [v[i] for i in range(v.shape[0])]
    for form, layout in (("4d", 1), ("layers", 2)):
        if want is None:
            expect = (1, layout, 8, 10000.0, 1)
        elif want == "as-is":
            expect = (1, layout, 8, 10000.0, 0)
        elif want == "custom":
            expect = (1, layout, 4, 500000.0, 1)
        elif want == "rope-obj":
            expect = (1, 2, 6, 2.5, 1)  # a given layout wins over the form's
        else:
            expect = want
        if form == "4d":
            got_p = via_pack(fkvf, tmp_path / f"p{form}.fkvf", (k, v), **kw)
            got_a = via_appender(fkvf, tmp_path / f"a{form}.fkvf", k, v, **kw)
        else:
            got_p = via_pack(fkvf, tmp_path / f"p{form}.fkvf",
                             list(zip(pairs_k, pairs_v)), **kw)
            got_a = via_appender(fkvf, tmp_path / f"a{form}.fkvf", pairs_k, pairs_v, **kw)
        assert got_p == expect, (form, kw)
        assert got_a == expect, (form, kw)


def test_shape_given_is_interleaved_unless_given(fkvf, tmp_path):
    with fkvf.Appender(tmp_path / "a.fkvf", create=True, shape=(2, 2, 8, 6), dtype="f16"):
        pass
    assert key_fields(fkvf, tmp_path / "a.fkvf") == (1, 1, 8, 10000.0, 1)
    with fkvf.Appender(tmp_path / "b.fkvf", create=True, shape=(2, 2, 8, 6), dtype="f16",
                       rope=fkvf.Rope(layout="half-split", dims=2)):
        pass
    assert key_fields(fkvf, tmp_path / "b.fkvf") == (1, 2, 2, 10000.0, 1)


def test_same_argument_errors(fkvf, tmp_path):
    k, v = rand_cache(2)
    for kw, exc, msg in (({"rope": fkvf.Rope(layout="split")}, ValueError, "rope layout"),
                         ({"rope": fkvf.Rope(theta=0.0)}, ValueError, "rope theta"),
                         ({"rope": fkvf.Rope(dims=3)}, ValueError, "rope dims"),
                         ({"rope": {"base": 2.0}}, ValueError, "unknown keys"),
                         ({"rope": True}, TypeError, "rope"),
                         ({"rope": fkvf.Rope(dims=10)}, ValueError, "does not fit key_dim"),
                         ({"keys": "rotated"}, ValueError, "keys")):
        with pytest.raises(exc, match=msg):
            fkvf.pack((k, v), tmp_path / "p.fkvf", **kw)
        with pytest.raises(exc, match=msg):
            a = fkvf.Appender(tmp_path / "a.fkvf", create=True, **kw)
            try:
                a.append(k, v)  # a setting checked against key_dim fails here
            finally:
                a.close()
        assert not os.path.exists(tmp_path / "p.fkvf")
        assert not os.path.exists(tmp_path / "a.fkvf")


@pytest.fixture(scope="module")
def sample(fkvf):
    t = load_safetensors(os.path.join(SRCDIR, "testdata", "sample-cache.safetensors"))
    n = sum(1 for name in t if name.endswith(".key"))
    return (np.stack([t[f"layers.{i}.key"] for i in range(n)]),
            np.stack([t[f"layers.{i}.value"] for i in range(n)]))


def test_codebook_settings_win_in_both(fkvf, tmp_path, sample):
    k, v = sample
    cb = tmp_path / "cb.fkvf"
    fkvf.train((k, v), cb, k=16, iters=2, rope=fkvf.Rope(theta=500000.0, layout="half-split"))
    # a (K, V) 4-D pair defaults to interleaved; the codebook's half-split and theta win
    Dk = k.shape[3]
    want = (1, 2, Dk, 500000.0, 1)
    assert via_pack(fkvf, tmp_path / "p.fkvf", (k, v), codebooks=cb) == want
    assert via_appender(fkvf, tmp_path / "a.fkvf", k, v, codebooks=cb) == want
    # a contradicting given setting: the same CodebookError naming the setting in both
    for kw, msg in (({"rope": fkvf.Rope(theta=10000.0)}, "rope theta 10000 was given"),
                    ({"rope": fkvf.Rope(layout="interleaved")},
                     "rope layout interleaved was given"),
                    ({"keys": "as-is"}, "keys as-is was given")):
        with pytest.raises(fkvf.CodebookError, match=msg):
            fkvf.pack((k, v), tmp_path / "p2.fkvf", codebooks=cb, **kw)
        with pytest.raises(fkvf.CodebookError, match=msg):
            fkvf.Appender(tmp_path / "a2.fkvf", create=True, codebooks=cb, **kw)
