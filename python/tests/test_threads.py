"""threads= of fkvf.pack, fkvf.train, fkvf.open, fkvf.Appender and fkvf.compact
(fkvf_rvq_set_threads, fkvf_rvq_params.n_threads, fkvf_reader_set_threads,
fkvf_append_options.n_threads, fkvf_compact_options.n_threads): the same files, rows
and verify() errors for 1, 2, 3 and 7 threads and for the default (FKVF_THREADS, else
every CPU); bad counts refused."""

import os

import numpy as np
import pytest

from conftest import SRCDIR, load_safetensors

TRAIN = os.path.join(SRCDIR, "testdata", "train-cache.safetensors")


def load(path=TRAIN):
    t = load_safetensors(path)
    n = sum(1 for k in t if k.endswith(".key"))
    return (np.stack([t[f"layers.{i}.key"] for i in range(n)]),
            np.stack([t[f"layers.{i}.value"] for i in range(n)]))


def data(p):
    with open(p, "rb") as f:
        return f.read()


COUNTS = [1, 2, 3, 7, None]


def test_train_pack_open_same_for_every_count(fkvf, tmp_path):
    k, v = load()
    cbs, packs, trained, rows = [], [], [], []
    for i, t in enumerate(COUNTS):
        cb = tmp_path / f"cb{i}.fkvf"
        fkvf.train((k, v), cb, k=32, k_stages=3, v_stages=2, iters=5, threads=t)
        cbs.append(data(cb))
        a = tmp_path / f"p{i}.fkvf"
        fkvf.pack((k, v), a, codebooks=tmp_path / "cb0.fkvf", threads=t)
        packs.append(data(a))
        e = tmp_path / f"e{i}.fkvf"
        fkvf.pack((k, v), e, k=32, threads=t)  # trains its own, then encodes
        trained.append(data(e))
        with fkvf.open(tmp_path / "p0.fkvf", threads=t) as ar:
            rows.append(ar.restore())
    for i in range(1, len(COUNTS)):
        assert cbs[i] == cbs[0], COUNTS[i]
        assert packs[i] == packs[0], COUNTS[i]
        assert trained[i] == trained[0], COUNTS[i]
        assert rows[i].tobytes() == rows[0].tobytes(), COUNTS[i]


def test_appender_same_for_every_count(fkvf, tmp_path):
    k, v = load()
    fkvf.train((k, v), tmp_path / "cb.fkvf", k=32, k_stages=2, v_stages=1, iters=3)
    files = []
    for i, t in enumerate([1, 3]):
        p = tmp_path / f"a{i}.fkvf"
        with fkvf.Appender(p, create=True, codebooks=tmp_path / "cb.fkvf", recent=8,
                           auto_compact=False, sync="none", threads=t) as a:
            for lo, hi in ((0, 100), (100, 300), (300, k.shape[2])):
                a.append(k[:, :, lo:hi], v[:, :, lo:hi])
                a.commit()
        files.append(data(p))
    assert files[1] == files[0]


def test_verify_compact_same_for_every_count(fkvf, tmp_path):
    from conftest import run_cli
    k, v = load()
    a = tmp_path / "a.fkvf"
    fkvf.pack((k, v), a, k=32)
    run_cli("index", a, "--no-sync", "--threads", "1")  # every stream's search index
    bad = tmp_path / "bad.fkvf"
    b = bytearray(data(a))
    zpos = [int(ln.split()[3]) for ln in run_cli("dump", a).stdout.splitlines()
            if ln.split()[1:2] == ["ZPOS"]]
    assert len(zpos) > 100
    for off in zpos[1::3]:  # every third search index: the first one's checksum error
        b[off + 80] ^= 0x5A
    bad.write_bytes(bytes(b))
    files, errs = [], []
    for i, t in enumerate(COUNTS):
        with fkvf.open(a, threads=t) as ar:
            ar.verify()
        with fkvf.open(bad, threads=t) as ar:
            with pytest.raises(fkvf.FkvfError) as e:
                ar.verify()
            errs.append((type(e.value), str(e.value)))
            assert f"offset {zpos[1]}: section ZPOS" in errs[-1][1], errs[-1][1]
        out = tmp_path / f"c{i}.fkvf"
        assert fkvf.compact(a, out, threads=t)["search_indexes"] > 100
        files.append(data(out))
    for i in range(1, len(COUNTS)):
        assert files[i] == files[0], COUNTS[i]
        assert errs[i] == errs[0], COUNTS[i]


def test_env_and_refusals(fkvf, tmp_path, monkeypatch):
    k, v = load()
    monkeypatch.setenv("FKVF_THREADS", "3")
    fkvf.pack((k, v), tmp_path / "env.fkvf", k=32)
    fkvf.pack((k, v), tmp_path / "one.fkvf", k=32, threads=1)
    assert data(tmp_path / "env.fkvf") == data(tmp_path / "one.fkvf")
    for bad in ("0", "x", "2000"):
        monkeypatch.setenv("FKVF_THREADS", bad)
        with pytest.raises(ValueError, match="FKVF_THREADS"):
            fkvf.pack((k, v), tmp_path / "bad.fkvf", k=32)
    monkeypatch.delenv("FKVF_THREADS")
    for bad, err in ((0, ValueError), (1025, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(err, match="threads"):
            fkvf.train((k, v), tmp_path / "bad.fkvf", k=32, threads=bad)
    assert not os.path.exists(tmp_path / "bad.fkvf")
    with pytest.raises(ValueError, match="threads"):
        fkvf.open(tmp_path / "one.fkvf", threads=0)
