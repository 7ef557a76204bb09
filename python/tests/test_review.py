"""Regression tests from the review of the reading side: unsigned indices that
would wrap, is_exact's range, a sparse index array over a long span (read run by
run, not the whole span), keys and values of different widths, and codebooks=
for an archive that refers to none."""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import SAMPLE, SRCDIR, run_cli, unpack

PY = sys.executable


@pytest.fixture
def arc(fkvf):
    with fkvf.open(SAMPLE) as a:
        yield a


def test_uint64_index_does_not_wrap(arc):
    n = arc.n_positions
    with pytest.raises(IndexError):
        arc.read(positions=np.array([2**64 - 1], dtype=np.uint64), part="k")
    with pytest.raises(IndexError):
        arc.read(positions=np.array([n], dtype=np.uint32), part="k")
    k = arc.read(positions=np.array([n - 1], dtype=np.uint64), part="k")
    assert np.array_equal(k, arc.read(positions=[n - 1], part="k"))


def test_is_exact_range(arc, sample_unpacked):
    n = arc.n_positions
    for bad in (n, 2**64, 2**64 + 1, -n - 1):
        with pytest.raises(IndexError):
            arc.is_exact(bad)
    with pytest.raises(TypeError):
        arc.is_exact(1.7)
    with pytest.raises(TypeError):
        arc.is_exact(True)
    assert arc.is_exact(-1) == arc.is_exact(n - 1)
    assert arc.is_exact(0)  # a sink of the sample archive (exact 0-3 and 68-99)


def test_sparse_index_array(arc, sample_unpacked):
    # 40 runs of one position spread over the whole archive: more runs than
    # the span read takes (32) and a span over 4 times their count
    k_all, v_all, _ = sample_unpacked["f16"]
    take = np.arange(0, arc.n_positions, 2)[:40]
    assert take.size == 40
    k, v = arc.read(positions=take)
    assert np.array_equal(k.view(np.uint16), k_all[:, :, take, :].view(np.uint16))
    assert np.array_equal(v.view(np.uint16), v_all[:, :, take, :].view(np.uint16))


def test_key_and_value_widths_differ(fkvf, tmp_path):
    # a lossless llama.cpp import with key_length 8, value_length 4
    st, gg = tmp_path / "s.bin", tmp_path / "m.gguf"
    subprocess.run([PY, os.path.join(SRCDIR, "tests", "mkllstate.py"), str(st), "--layers", "2",
                    "--heads", "2", "--dim", "8", "--vdim", "4", "--cells", "9"], check=True)
    subprocess.run([PY, os.path.join(SRCDIR, "tests", "mkgguf.py"), str(gg), "--layers", "2",
                    "--embd", "16", "--heads", "2", "--kv-heads", "2", "--key-length", "8",
                    "--value-length", "4"], check=True)
    a_path = tmp_path / "a.fkvf"
    run_cli("import-llama", st, "--model", gg, "-o", a_path)
    k_ref, v_ref, _ = unpack(tmp_path, a_path)
    assert k_ref.shape[-1] == 8 and v_ref.shape[-1] == 4
    with fkvf.open(a_path) as a:
        k, v = a.read()
        assert k.shape == k_ref.shape and v.shape == v_ref.shape
        assert np.array_equal(k.view(np.uint16), k_ref.view(np.uint16))
        assert np.array_equal(v.view(np.uint16), v_ref.view(np.uint16))
        assert np.array_equal(a.read(part="v", positions=[3, 1]).view(np.uint16),
                              v_ref[:, :, [3, 1], :].view(np.uint16))


def test_codebooks_for_an_archive_that_refers_to_none(fkvf, tmp_path):
    with pytest.raises(ValueError, match="refers to no codebook file"):
        fkvf.open(SAMPLE, codebooks=tmp_path / "none.fkvf")
