"""Regression tests of bugs found in review and in a newcomer's trial of the binding, each
named after the bug; expected values from the CLI or built here, not from the package."""

import os
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest

from conftest import SRCDIR, run_cli, unpack
from test_pack import CACHE, load, write_safetensors


def test_uint16_input_is_bf16_bits_as_the_cli_takes_it(fkvf, tmp_path):
    """uint16 arrays were converted as integers (bf16 bits 48737 stored as 48737.0)."""
    k, v, _ = load()
    k, v = k[:, :, :40], v[:, :, :40]
    # bf16 bits of the sample, made by the CLI: unpack of a lossless pack, --dtype bf16
    write_safetensors(tmp_path / "c.safetensors", k, v)
    run_cli("pack", tmp_path / "c.safetensors", "-o", tmp_path / "l.fkvf", "--sinks", "1000",
            "--no-rope")
    kb, vb, _ = unpack(tmp_path, tmp_path / "l.fkvf", "bf16")
    assert kb.dtype == np.uint16
    fkvf.pack((kb, vb), tmp_path / "py.fkvf", sinks=1000, rope=False)
    with fkvf.open(tmp_path / "py.fkvf") as a:
        assert a.descriptor["dtype"] == "bf16"
    k2, v2, _ = unpack(tmp_path, tmp_path / "py.fkvf", "bf16")
    np.testing.assert_array_equal(k2, kb)
    np.testing.assert_array_equal(v2, vb)
    # the Appender too
    with fkvf.Appender(tmp_path / "ap.fkvf", create=True, rope=False) as ap:
        ap.append(kb, vb)
    k3, v3, _ = unpack(tmp_path, tmp_path / "ap.fkvf", "bf16")
    np.testing.assert_array_equal(k3, kb)
    np.testing.assert_array_equal(v3, vb)
    # other integers are no cache
    with pytest.raises(TypeError, match="floating point"):
        fkvf.pack((kb.astype(np.int32), vb.astype(np.int32)), tmp_path / "i.fkvf")
    assert not (tmp_path / "i.fkvf").exists()


def test_pair_of_per_layer_lists_is_refused_not_misread(fkvf, tmp_path):
    """(keys list, values list) of 4 layers was read as 2 layers of (k, v) pairs."""
    ks = [np.zeros((1, 2, 50, 8), np.float16) + i for i in range(4)]
    vs = [np.zeros((1, 2, 50, 8), np.float16) - i for i in range(4)]
    with pytest.raises(TypeError, match="zip"):
        fkvf.pack((ks, vs), tmp_path / "a.fkvf")
    with pytest.raises(TypeError, match=r"cache\[0\]"):
        fkvf.pack([(ks[0], vs[0], ks[0])], tmp_path / "a.fkvf")  # a triple is no (k, v) pair
    assert not (tmp_path / "a.fkvf").exists()
    r = fkvf.pack(list(zip(ks, vs)), tmp_path / "a.fkvf", sinks=50)
    assert r["positions"] == 50
    with fkvf.open(tmp_path / "a.fkvf") as a:
        assert a.descriptor["n_layers"] == 4


def test_nul_in_ids_and_metadata_refused(fkvf, tmp_path):
    """fkvf.pack cut a str at a NUL ('llama\\0-7b' stored as 'llama'), the Appender refused it."""
    k, v, _ = load()
    kv = (k[:, :, :40], v[:, :, :40])
    for kwargs in ({"model_id": "llama\0-7b"}, {"tokenizer_id": "t\0x"},
                   {"metadata": {"user.a\0hidden": 1}}, {"metadata": {"user.a": "x\0y"}}):
        with pytest.raises(ValueError, match="NUL"):
            fkvf.pack(kv, tmp_path / "a.fkvf", **kwargs)
        assert not (tmp_path / "a.fkvf").exists()


def test_no_layers_is_a_value_error(fkvf, tmp_path):
    """An [0, H, T, D] cache raised a bare IndexError."""
    z = np.zeros((0, 2, 10, 8), np.float16)
    with pytest.raises(ValueError, match="no layers"):
        fkvf.pack((z, z), tmp_path / "a.fkvf")
    with fkvf.Appender(tmp_path / "b.fkvf", create=True) as ap:
        with pytest.raises(ValueError, match="no layers"):
            ap.append(z, z)


def test_big_endian_input_keeps_its_dtype(fkvf, tmp_path):
    """'>f2' arrays made an f32 archive (twice the size)."""
    k, v, _ = load()
    k, v = k[:, :, :40], v[:, :, :40]
    fkvf.pack((k.astype(">f2"), v.astype(">f2")), tmp_path / "be.fkvf", sinks=1000, rope=False)
    fkvf.pack((k, v), tmp_path / "le.fkvf", sinks=1000, rope=False)
    with fkvf.open(tmp_path / "be.fkvf") as a:
        assert a.descriptor["dtype"] == "f16"
        kr, vr = a.read()
    np.testing.assert_array_equal(kr, k)
    np.testing.assert_array_equal(vr, v)
    fkvf.pack((k.astype(">f4"), v.astype(">f4")), tmp_path / "be32.fkvf", sinks=1000,
              rope=False)
    with fkvf.open(tmp_path / "be32.fkvf") as a:
        assert a.descriptor["dtype"] == "f32"


def test_slice_with_a_huge_step(fkvf):
    """slice(0, 2**80, 2**70) (range(n)[it] == [0]) was refused as not an index."""
    with fkvf.open(os.path.join(SRCDIR, "testdata", "sample.fkvf")) as a:
        k, _ = a.read(positions=slice(0, 2**80, 2**70))
        k0, _ = a.read(positions=[0])
        np.testing.assert_array_equal(k, k0)
        assert a.read(positions=slice(2**80, None, 2**70), part="k").shape[2] == 0


CHILD = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
import fkvf
a = fkvf.open(sys.argv[2], mmap=sys.argv[3] == "1")
before = a.read(part="k").copy()
os.truncate(sys.argv[2], 0)
after = a.read(part="k")
print("same" if (after == before).all() else "differ")
"""


@pytest.mark.parametrize("mmap", [False, True])
def test_truncated_under_an_open_reader(fkvf, tmp_path, mmap):
    """A file truncated under an open (mapped) reader killed the interpreter with SIGBUS
    and there was no way to open it unmapped: mmap=False reads it into memory at open."""
    p = tmp_path / "t.fkvf"
    k, v, _ = load()
    fkvf.pack((k[:, :, :40], v[:, :, :40]), p, sinks=1000, rope=False)
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", CHILD, os.path.join(SRCDIR, "python"), str(p),
                        "1" if mmap else "0"], capture_output=True, text=True, env=env,
                       timeout=120)
    if mmap:  # the documented risk of the default
        assert r.returncode == -signal.SIGBUS, (r.returncode, r.stderr)
    else:
        assert r.returncode == 0 and r.stdout.strip() == "same", r.stderr


def test_fifo_is_refused_not_waited_on(fkvf, tmp_path):
    """fkvf.open of a FIFO waited forever in open(2) for a writer."""
    p = tmp_path / "fifo"
    os.mkfifo(p)
    with pytest.raises(fkvf.IoError, match="not a regular file"):
        fkvf.open(p)


def test_read_nhd_and_as_torch(fkvf):
    """No way to get positions-first [L, T, H, D] back, or bf16 as torch.bfloat16."""
    with fkvf.open(os.path.join(SRCDIR, "testdata", "sample.fkvf")) as a:
        k, v = a.read(dtype="f32")
        kn, vn = a.read(layout="nhd", dtype="f32")
        np.testing.assert_array_equal(kn, k.transpose(0, 2, 1, 3))
        kv, _ = a.read(positions=-1, layout="nhd", copy=False)  # a view, one position
        assert kv.shape == (5, 1, 4, 8)
        np.testing.assert_array_equal(kv, a.read(positions=-1)[0].transpose(0, 2, 1, 3))
        with pytest.raises(ValueError, match="copy=True"):
            a.read(as_torch=True, copy=False)
        torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) not installed")
        kb, _ = a.read(dtype="bf16")  # bf16 bits, uint16
        t = a.read(layout="hf", dtype="bf16", as_torch=True)
        assert t[0][0].dtype == torch.bfloat16 and tuple(t[0][0].shape) == (1, 4, 100, 8)
        np.testing.assert_array_equal(t[0][0].view(torch.int16).numpy().view(np.uint16),
                                      kb[0][None])
        # what torch makes of the f32 values rounds the same (to nearest even)
        assert torch.equal(t[0][0], torch.from_numpy(k[0][None]).bfloat16())
        r = a.restore(dtype="bf16", as_torch=True)
        assert r.dtype == torch.bfloat16 and tuple(r.shape) == (100, 320)


def test_appender_takes_a_cache_as_pack_does(fkvf, tmp_path):
    """ap.append(past) with a list of (k, v) pairs was a TypeError (v missing)."""
    k, v, _ = load()
    past = [(k[i][None, :, :30], v[i][None, :, :30]) for i in range(k.shape[0])]
    with fkvf.Appender(tmp_path / "a.fkvf", create=True, rope=False) as ap:
        ap.append(past)
    with fkvf.open(tmp_path / "a.fkvf") as a:
        k2, v2 = a.read()
    np.testing.assert_array_equal(k2, k[:, :, :30])
    np.testing.assert_array_equal(v2, v[:, :, :30])


def test_silent_lossless_pack_and_oversized_codebooks_warn(fkvf, tmp_path):
    """fkvf pack notes that a short cache is stored exact and warns about a k too large for
    its rows; fkvf.pack and fkvf.train said nothing."""
    k, v, _ = load()
    with pytest.warns(UserWarning, match="too few for an embedded codebook"):
        r = fkvf.pack((k[:, :, :60], v[:, :, :60]), tmp_path / "a.fkvf")
    assert r["k"] == 0 and r["archived"] == 0
    with pytest.warns(UserWarning, match="more than a quarter"):
        fkvf.pack((k[:, :, :100], v[:, :, :100]), tmp_path / "b.fkvf", k=64)
    with pytest.warns(UserWarning, match="fp16 bytes of the 100 training rows"):
        fkvf.train((k[:, :, :100], v[:, :, :100]), tmp_path / "c.cbk", k=256)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the automatic k on enough rows: no warning
        fkvf.pack((k, v), tmp_path / "d.fkvf")


def test_codebook_shape_message_says_what_is_wrong(fkvf, tmp_path):
    """The message ended in the code's generic text, 'codebook missing or hash mismatch'."""
    k, v, _ = load()
    run_cli("train", os.path.join(SRCDIR, "testdata", "train-cache.safetensors"), "-o",
            tmp_path / "cb.fkvf", "--k", "16")
    with pytest.raises(fkvf.CodebookError) as e:
        fkvf.pack((k[:, :2], v[:, :2]), tmp_path / "a.fkvf", codebooks=tmp_path / "cb.fkvf")
    assert "does not fit the cache" in str(e.value)
    assert "missing or hash mismatch" not in str(e.value)
    assert str(e.value).endswith("[FKVF_E_CODEBOOK]")
