"""Archives packed by the CLI from testdata/sample-cache.safetensors: exact positions are the
cache's own bits; external codebooks attached by path, found by content hash, or missing."""

import os

import numpy as np
import pytest

from conftest import SRCDIR, load_safetensors, run_cli, unpack

CACHE = os.path.join(SRCDIR, "testdata", "sample-cache.safetensors")
TRAIN = os.path.join(SRCDIR, "testdata", "train-cache.safetensors")
EXACT = np.r_[0:4, 224:256]  # 256 positions, 4 sinks + 32 recent (the CLI's default policy)


def original():
    t = load_safetensors(CACHE)
    n = sum(1 for k in t if k.endswith(".key"))
    return (np.stack([t[f"layers.{i}.key"] for i in range(n)]),
            np.stack([t[f"layers.{i}.value"] for i in range(n)]))


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    d = tmp_path_factory.mktemp("packed")
    run_cli("pack", CACHE, "-o", d / "embedded.fkvf", "--k", "16")
    (d / "cb").mkdir()
    (d / "arc").mkdir()
    (d / "elsewhere").mkdir()
    run_cli("train", TRAIN, "-o", d / "cb" / "cb.fkvf", "--k", "16")
    run_cli("train", TRAIN, "-o", d / "cb" / "other.fkvf", "--k", "16", "--seed", "5")
    run_cli("pack", CACHE, "--codebooks", d / "cb" / "cb.fkvf", "-o", d / "arc" / "ext.fkvf")
    return d


def test_exact_positions_are_the_cache_bits(fkvf, packed):
    ok, ov = original()
    with fkvf.open(packed / "embedded.fkvf") as a:
        assert [p for p in range(a.n_positions) if a.is_exact(p)] == EXACT.tolist()
        k, v = a.read(positions=EXACT)
        assert k.view(np.uint16).tobytes() == ok[:, :, EXACT].view(np.uint16).tobytes()
        assert v.view(np.uint16).tobytes() == ov[:, :, EXACT].view(np.uint16).tobytes()
        # archived positions are reconstructions: close to the cache, not its bits
        k_all, _ = a.read(dtype=np.float32)
        arch = np.setdiff1d(np.arange(256), EXACT)
        assert not np.array_equal(k_all[:, :, arch].astype(np.float16), ok[:, :, arch])


def test_embedded_all_positions_equal_unpack(fkvf, packed, tmp_path):
    ek, ev, _ = unpack(tmp_path, packed / "embedded.fkvf", "f32")
    with fkvf.open(packed / "embedded.fkvf") as a:
        k, v = a.read(dtype=np.float32)
    assert k.view(np.uint32).tobytes() == ek.view(np.uint32).tobytes()
    assert v.view(np.uint32).tobytes() == ev.view(np.uint32).tobytes()


def test_external_codebook_by_path(fkvf, packed, tmp_path):
    ek, ev, _ = unpack(tmp_path, packed / "arc" / "ext.fkvf", "f16",
                       extra=("--codebooks", packed / "cb" / "cb.fkvf"))
    with fkvf.open(packed / "arc" / "ext.fkvf", codebooks=packed / "cb" / "cb.fkvf") as a:
        assert a.info["required_features"] & 4  # FKVF_FEAT_EXTERNAL_CODEBOOK
        k, v = a.read()
    assert k.view(np.uint16).tobytes() == ek.view(np.uint16).tobytes()
    assert v.view(np.uint16).tobytes() == ev.view(np.uint16).tobytes()


def test_external_codebook_found_by_hash(fkvf, packed, monkeypatch):
    monkeypatch.setenv("FKVF_CODEBOOK_PATH", str(packed / "elsewhere") + ":" +
                       str(packed / "cb"))
    with fkvf.open(packed / "arc" / "ext.fkvf") as a:
        with fkvf.open(packed / "arc" / "ext.fkvf", codebooks=packed / "cb" / "cb.fkvf") as b:
            assert np.array_equal(a.read(part="k"), b.read(part="k"))


def test_external_codebook_missing(fkvf, packed, monkeypatch):
    monkeypatch.delenv("FKVF_CODEBOOK_PATH", raising=False)
    with fkvf.open(packed / "arc" / "ext.fkvf") as a:
        ok, _ = original()
        k = a.read(positions=EXACT, part="k")  # exact rows need no codebook
        assert k.view(np.uint16).tobytes() == ok[:, :, EXACT].view(np.uint16).tobytes()
        with pytest.raises(fkvf.NotFoundError) as e:
            a.read(positions=[10])
        assert e.value.file.endswith("ext.fkvf")
        assert "codebook" in e.value.message
        assert e.value.name == "FKVF_E_NOT_FOUND" and e.value.error_class == "usage"


def test_wrong_codebook(fkvf, packed):
    with pytest.raises(fkvf.CodebookError) as e:
        fkvf.open(packed / "arc" / "ext.fkvf", codebooks=packed / "cb" / "other.fkvf")
    assert e.value.code == 37 and "hash" in e.value.message


def test_codebook_file_missing_path(fkvf, packed):
    with pytest.raises(fkvf.IoError) as e:
        fkvf.open(packed / "arc" / "ext.fkvf", codebooks=packed / "nope.fkvf")
    assert e.value.file.endswith("nope.fkvf")


def test_codebook_file_itself(fkvf, packed):
    with fkvf.open(packed / "cb" / "cb.fkvf") as a:
        assert a.descriptor is None and a.info["has_desc"] == 0
        with pytest.raises(ValueError, match="codebook file"):
            a.read()
