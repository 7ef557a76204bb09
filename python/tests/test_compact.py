"""fkvf.compact against fkvf compact of the same archive (the same bytes), on an archive an
Appender grew one commit per position (which keeps every superseded exact row)."""

import os
import shutil

import numpy as np
import pytest

from conftest import SRCDIR, load_safetensors, run_cli

CACHE = os.path.join(SRCDIR, "testdata", "sample-cache.safetensors")
TRAIN = os.path.join(SRCDIR, "testdata", "train-cache.safetensors")


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """An archive of the sample cache's first 80 positions, one commit per position, with a
    codebook file from fkvf train (both in one directory)."""
    d = tmp_path_factory.mktemp("grown")
    cb = d / "cb.fkvf"
    run_cli("train", TRAIN, "-o", cb, "--k", "16")
    t = load_safetensors(CACHE)
    k = np.stack([t[f"layers.{i}.key"] for i in range(5)])
    v = np.stack([t[f"layers.{i}.value"] for i in range(5)])
    import fkvf
    path = d / "grown.fkvf"
    with fkvf.Appender(path, create=True, codebooks=cb, recent=8,
                       auto_compact=False) as ap:  # 81 commits, to compact here
        for p in range(80):
            ap.append(k[:, :, p:p + 1], v[:, :, p:p + 1])
            ap.commit()
    return path, cb


def test_compact_is_fkvf_compact(fkvf, grown, tmp_path):
    path, cb = grown
    before = os.path.getsize(path)
    with fkvf.open(path) as a:
        rows = a.restore()
        n_commits = a.info["n_commits"]
    out = tmp_path / "py.fkvf"
    r = fkvf.compact(path, out, codebooks=cb)
    assert r["path"] == str(out) and r["positions"] == 80 and r["commits_before"] == n_commits
    assert r["size"] == os.path.getsize(out) < before / 2
    assert r["archived"] == 80 - 4 - 8 and r["exact"] == 4 + 8  # 4 sinks, 8 recent
    # the CLI's compaction of the same file: the same bytes
    cli_out = tmp_path / "cli.fkvf"
    run_cli("compact", path, "-o", cli_out, "--codebooks", cb)
    assert out.read_bytes() == cli_out.read_bytes()
    run_cli("verify", out, "--codebooks", cb)
    with fkvf.open(out, codebooks=cb) as a:
        assert a.info["n_commits"] == 1
        np.testing.assert_array_equal(a.restore(), rows)
    # the source is untouched
    assert os.path.getsize(path) == before


def test_compact_in_place_and_refusals(fkvf, grown, tmp_path):
    path, cb = grown
    work = tmp_path / "w.fkvf"
    shutil.copyfile(path, work)
    shutil.copyfile(cb, tmp_path / "cb.fkvf")  # found by content hash next to the archive
    with fkvf.open(work) as a:
        rows = a.restore()
    size = os.path.getsize(work)
    r = fkvf.compact(work, in_place=True)
    assert r["size"] == os.path.getsize(work) < size
    with fkvf.open(work) as a:
        np.testing.assert_array_equal(a.restore(), rows)
    existing = tmp_path / "exists.fkvf"
    existing.write_bytes(b"keep me")
    with pytest.raises(fkvf.ExistsError):
        fkvf.compact(work, existing)
    assert existing.read_bytes() == b"keep me"
    fkvf.compact(work, existing, overwrite=True)
    with fkvf.open(existing) as a:
        np.testing.assert_array_equal(a.restore(), rows)
    with pytest.raises(ValueError, match="exclude"):
        fkvf.compact(work, tmp_path / "x.fkvf", in_place=True)
    with pytest.raises(ValueError, match="out="):
        fkvf.compact(work)
    with pytest.raises(fkvf.InvalidArgError):
        fkvf.compact(work, work)  # dst names src
    # an appender holds the file: in place is refused, the file unchanged
    before = work.read_bytes()
    with fkvf.Appender(work):
        with pytest.raises(fkvf.IoError, match="lock"):
            fkvf.compact(work, in_place=True)
    assert work.read_bytes() == before


def test_compact_needs_the_codebook(fkvf, grown, tmp_path):
    path, _ = grown
    alone = tmp_path / "alone.fkvf"
    shutil.copyfile(path, alone)  # no codebook file next to it
    with pytest.raises(fkvf.NotFoundError):
        fkvf.compact(alone, tmp_path / "o.fkvf")
    assert not (tmp_path / "o.fkvf").exists()
    with pytest.raises(fkvf.BadMagicError):
        fkvf.compact(CACHE, tmp_path / "o2.fkvf")
