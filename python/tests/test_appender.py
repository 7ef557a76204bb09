"""fkvf.Appender: creating and growing archives, checked with the CLI (fkvf verify, fkvf
unpack, fkvf append of the same rows), the context manager, errors, and an archive grown
by an Appender in another process while this one reads it."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from appender_child import seeded_cache
from conftest import SRCDIR, load_safetensors, run_cli, unpack

SAMPLE_CACHE = os.path.join(SRCDIR, "testdata", "sample-cache.safetensors")
TRAIN_CACHE = os.path.join(SRCDIR, "testdata", "train-cache.safetensors")
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "appender_child.py")


def rand_cache(seed, L=2, H=2, T=5, Dk=8, Dv=6, dtype=np.float16):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((L, H, T, Dk)).astype(dtype),
            rng.standard_normal((L, H, T, Dv)).astype(dtype))


def sample_cache():
    t = load_safetensors(SAMPLE_CACHE)
    n = sum(1 for k in t if k.endswith(".key"))
    k = np.stack([t[f"layers.{i}.key"] for i in range(n)])
    v = np.stack([t[f"layers.{i}.value"] for i in range(n)])
    return k, v, t["tokens"]


@pytest.fixture(scope="module")
def codebook(tmp_path_factory):
    """A codebook file trained by the CLI on testdata/train-cache.safetensors."""
    p = tmp_path_factory.mktemp("cb") / "cb.fkvf"
    run_cli("train", TRAIN_CACHE, "-o", p)
    return p


def bits(a):
    return a.view(np.uint16) if a.dtype == np.float16 else a


# ---- creating and growing -----------------------------------------------------

def test_create_append_in_pieces_commits_unpack(fkvf, tmp_path):
    p = tmp_path / "a.fkvf"
    k, v = rand_cache(1, T=40)
    toks = np.arange(40, dtype=np.uint32) * 3 + 1
    a = fkvf.Appender(p, create=True, recent=8, sinks=2, auto_compact=False)  # the commits
    a.append(k[:, :, :7], v[:, :, :7], tokens=toks[:7])
    assert not p.exists()  # shape from the first append: the file comes at the first commit
    a.commit()
    assert a.n_positions == 7 and a.info["commit_seq"] == 2  # commit 1: the descriptor
    a.append(k[:, :, 7:10], v[:, :, 7:10], tokens=toks[7:10])
    a.append(k[:, :, 10:25], v[:, :, 10:25], tokens=list(toks[10:25]))
    assert a.info["pending"] == 18 and a.n_positions == 7
    a.commit()
    a.close()
    run_cli("verify", p)
    uk, uv, ut = unpack(tmp_path, p)
    np.testing.assert_array_equal(bits(uk), bits(k[:, :, :25]))
    np.testing.assert_array_equal(bits(uv), bits(v[:, :, :25]))
    np.testing.assert_array_equal(ut, toks[:25])
    # reopened: more positions, in per-layer (k, v) form [1, H, t, D]
    with fkvf.Appender(p, auto_compact=False) as a:
        assert a.n_positions == 25 and a.info["has_tokens"]
        a.append([k[i:i + 1, :, 25:] for i in range(2)], [v[i:i + 1, :, 25:] for i in range(2)],
                  tokens=toks[25:])
    run_cli("verify", p)
    uk, uv, ut = unpack(tmp_path, p)
    np.testing.assert_array_equal(bits(uk), bits(k))
    np.testing.assert_array_equal(bits(uv), bits(v))
    np.testing.assert_array_equal(ut, toks)
    with fkvf.open(p) as r:
        assert r.info["n_commits"] == 4 and r.n_positions == 40


def test_nhd_layout_and_dtype_conversion(fkvf, tmp_path):
    p = tmp_path / "a.fkvf"
    k, v = rand_cache(2, T=6, dtype=np.float32)
    with fkvf.Appender(p, create=True, dtype=np.float16, layout="nhd") as a:
        a.append(k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3))  # [L, T, H, D]
    uk, uv, _ = unpack(tmp_path, p)
    assert uk.dtype == np.float16
    # f32 -> f16 rounds to nearest even, as NumPy's cast does
    np.testing.assert_array_equal(bits(uk), bits(k.astype(np.float16)))
    np.testing.assert_array_equal(bits(uv), bits(v.astype(np.float16)))


def test_shape_given_creates_at_once(fkvf, tmp_path):
    p = tmp_path / "a.fkvf"
    a = fkvf.Appender(p, create=True, shape=(2, 2, 8, 6), dtype="f32", model_id="m",
                      tokenizer_id="t", rope=False)
    assert p.exists()
    with fkvf.open(p) as r:
        d = r.descriptor
        assert r.n_positions == 0 and r.tokens is None
        assert (d["n_layers"], d["n_kv_heads"], d["key_dim"], d["value_dim"], d["dtype"]) == \
            (2, 2, 8, 6, "f32")
        assert (d["model_id"], d["tokenizer_id"], d["key_transform"]) == ("m", "t", 0)
    k, v = rand_cache(3, dtype=np.float32)
    a.append(k, v)
    a.commit()
    a.close()
    with fkvf.open(p) as r:
        rk, rv = r.read()
    np.testing.assert_array_equal(rk, k)
    np.testing.assert_array_equal(rv, v)


def test_deferred_create_without_commit_leaves_nothing(fkvf, tmp_path):
    p = tmp_path / "a.fkvf"
    k, v = rand_cache(4)
    a = fkvf.Appender(p, create=True)
    a.append(k, v)
    assert a.info["pending"] == 5 and a.n_positions == 0
    a.close()
    assert not p.exists()
    with fkvf.Appender(p, create=True) as a:  # nothing appended: nothing to create
        pass
    assert not p.exists()


def test_token_width_follows_ids_and_vocab_size(fkvf, tmp_path):
    k, v = rand_cache(5, T=3)
    p = tmp_path / "wide.fkvf"
    with fkvf.Appender(p, create=True, tokens=True) as a:
        a.append(k, v, tokens=[1, 70000, 2])  # needs more than the default 16 bits
    with fkvf.open(p) as r:
        assert [s["symbol_bits"] for s in r.streams if s["kind"] == "tokens"] == [18]
        np.testing.assert_array_equal(r.tokens, [1, 70000, 2])
    p2 = tmp_path / "vocab.fkvf"
    with fkvf.Appender(p2, create=True, vocab_size=512) as a:
        # 512 ids 0..511 need 10 bits (quad widths are even): ids up to 1023 fit
        with pytest.raises(ValueError, match=r"tokens: id 1024 .*ids 0\.\.1023"):
            a.append(k, v, tokens=[0, 1024, 3])  # refused before the file exists
        a.append(k, v, tokens=[0, 1023, 3])
    with fkvf.open(p2) as r:
        assert [s["symbol_bits"] for s in r.streams if s["kind"] == "tokens"] == [10]
    with fkvf.Appender(p2) as a:  # the width of an opened archive's stream is known too
        with pytest.raises(ValueError, match=r"ids 0\.\.1023"):
            a.append(k, v, tokens=[0, 1024, 3])


def test_codebook_file_same_bytes_as_cli_append(fkvf, tmp_path, codebook):
    K, V, T = sample_cache()
    n = K.shape[2]
    cli = tmp_path / "cli.fkvf"
    run_cli("append", "--create", cli, SAMPLE_CACHE, "--codebooks", codebook, "--positions",
            "0:150", "--commit-every", "60")
    run_cli("append", cli, SAMPLE_CACHE, "--codebooks", codebook, "--positions", "150:",
            "--commit-every", "60")
    py = tmp_path / "py.fkvf"
    with fkvf.Appender(py, create=True, codebooks=codebook) as a:
        for s in range(0, 150, 60):
            e = min(s + 60, 150)
            a.append(K[:, :, s:e], V[:, :, s:e], tokens=T[s:e])
            a.commit()
        assert a.info["has_codebook"] and a.info["n_archived"] > 0
    with fkvf.Appender(py, codebooks=codebook) as a:
        for s in range(150, n, 60):
            a.append(K[:, :, s:s + 60], V[:, :, s:s + 60], tokens=T[s:s + 60])
            a.commit()
        archived = a.info["n_archived"]
    assert archived == n - 4 - 32
    assert py.read_bytes() == cli.read_bytes()
    run_cli("verify", py, "--codebooks", codebook)
    # the exact positions are the input bit for bit
    uk, uv, ut = unpack(tmp_path, py, extra=("--codebooks", codebook))
    for sl in (slice(0, 4), slice(n - 32, n)):
        np.testing.assert_array_equal(bits(uk[:, :, sl]), bits(K[:, :, sl]))
        np.testing.assert_array_equal(bits(uv[:, :, sl]), bits(V[:, :, sl]))
    np.testing.assert_array_equal(ut, T)


def test_codebook_found_next_to_archive_or_given(fkvf, tmp_path, codebook):
    K, V, T = sample_cache()
    d1 = tmp_path / "d1"
    d1.mkdir()
    shutil.copyfile(codebook, d1 / "cb.fkvf")
    p = d1 / "a.fkvf"
    with fkvf.Appender(p, create=True, codebooks=d1 / "cb.fkvf", tokens=False) as a:
        a.append(K[:, :, :50], V[:, :, :50])
    with fkvf.Appender(p) as a:  # found by its content hash next to the archive
        a.append(K[:, :, 50:100], V[:, :, 50:100])
    d2 = tmp_path / "d2"
    d2.mkdir()
    shutil.move(str(p), d2 / "a.fkvf")
    with pytest.raises(fkvf.FkvfError) as e:
        fkvf.Appender(d2 / "a.fkvf")
    assert "codebook" in str(e.value).lower()
    with fkvf.Appender(d2 / "a.fkvf", codebooks=codebook) as a:
        a.append(K[:, :, 100:], V[:, :, 100:])
        assert a.info["n_archived"] == 100 - 36  # committed; the queue is not
    with fkvf.open(d2 / "a.fkvf", codebooks=codebook) as r:
        assert r.info["n_archived"] == K.shape[2] - 36
    run_cli("verify", d2 / "a.fkvf", "--codebooks", codebook)


def test_codebook_settings_win_contradictions_refused(fkvf, tmp_path, codebook):
    K, V, _ = sample_cache()
    p = tmp_path / "a.fkvf"
    # the CLI's codebook was trained pre-rope, interleaved, theta 10000
    with pytest.raises(fkvf.CodebookError, match="rope layout half-split was given"):
        fkvf.Appender(p, create=True, codebooks=codebook, rope=fkvf.Rope(layout="half-split"))
    with pytest.raises(fkvf.CodebookError, match="keys"):
        fkvf.Appender(p, create=True, codebooks=codebook, keys="as-is")
    with pytest.raises(fkvf.CodebookError, match="rope theta 500000 was given"):
        fkvf.Appender(p, create=True, codebooks=codebook, rope=fkvf.Rope(theta=500000.0))
    assert not p.exists()
    # its shape must fit the cache
    a = fkvf.Appender(p, create=True, codebooks=codebook)
    with pytest.raises(fkvf.CodebookError, match="does not fit"):
        a.append(K[:3], V[:3])
    a.close()
    with pytest.raises(fkvf.InvalidArgError, match="not a codebook file"):
        fkvf.Appender(p, create=True, codebooks=os.path.join(SRCDIR, "testdata", "sample.fkvf"))
    assert not p.exists()


def test_recover_torn_tail(fkvf, tmp_path):
    p = tmp_path / "a.fkvf"
    k, v = rand_cache(6, T=10)
    with fkvf.Appender(p, create=True) as a:
        a.append(k[:, :, :5], v[:, :, :5])
    size = p.stat().st_size
    with open(p, "ab") as f:
        f.write(b"\x5a" * 100)  # a commit that did not complete
    with pytest.raises(fkvf.TornError):
        fkvf.Appender(p)
    with fkvf.Appender(p, recover=True) as a:
        assert a.info["recovered_bytes"] == 100 and a.info["file_size"] == size
        a.append(k[:, :, 5:], v[:, :, 5:])
    run_cli("verify", p)
    uk, _, _ = unpack(tmp_path, p)
    np.testing.assert_array_equal(bits(uk), bits(k))


# ---- the context manager ------------------------------------------------------

def test_exception_leaves_last_commit(fkvf, tmp_path):
    p = tmp_path / "a.fkvf"
    k, v = rand_cache(7, T=20)
    with fkvf.Appender(p, create=True) as a:
        a.append(k[:, :, :8], v[:, :, :8])
    before = p.read_bytes()

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with fkvf.Appender(p) as a:
            a.append(k[:, :, 8:], v[:, :, 8:])
            raise Boom()
    assert a.closed
    assert p.read_bytes() == before
    with fkvf.open(p, strict=True) as r:
        assert r.n_positions == 8 and r.info["torn_bytes"] == 0
        r.verify()
    run_cli("verify", p)
    # a clean exit commits what is queued
    with fkvf.Appender(p) as a:
        a.append(k[:, :, 8:], v[:, :, 8:])
    with fkvf.open(p) as r:
        assert r.n_positions == 20
        np.testing.assert_array_equal(r.read()[0], k)


# ---- errors ---------------------------------------------------------------------

def test_auto_compaction_keeps_contents_and_footprint(fkvf, tmp_path, codebook):
    """compact_at= compacts as it goes (the file stays a few commits long and within the
    ratio of its compaction), with the contents of an archive grown without it."""
    K, V, T = sample_cache()
    n = K.shape[2]
    on, off = tmp_path / "on.fkvf", tmp_path / "off.fkvf"
    seqs = []
    with fkvf.Appender(on, create=True, codebooks=codebook, compact_at=1.1) as a, \
            fkvf.Appender(off, create=True, codebooks=codebook, auto_compact=False) as b:
        for s in range(0, n, 8):
            for x in (a, b):
                x.append(K[:, :, s:s + 8], V[:, :, s:s + 8], tokens=T[s:s + 8])
                x.commit()
            seqs.append(a.info["commit_seq"])
            c = tmp_path / "c.fkvf"
            run_cli("compact", on, "-o", c, "--force", "--codebooks", codebook)
            assert os.path.getsize(on) <= 1.1 * os.path.getsize(c) + 1
        assert b.info["commit_seq"] == 1 + len(range(0, n, 8))
    assert seqs.count(1) >= 3 and max(seqs) < len(seqs)
    assert not [f for f in os.listdir(tmp_path) if ".autocompact" in f]
    for x, y in zip(unpack(tmp_path, on, extra=("--codebooks", codebook)),
                    unpack(tmp_path, off, extra=("--codebooks", codebook))):
        np.testing.assert_array_equal(bits(x), bits(y))


def test_auto_compaction_arguments(fkvf, tmp_path):
    p = tmp_path / "a.fkvf"
    for bad in (1, 0.5, -2, 1e7):
        with pytest.raises(ValueError, match="compact_at"):
            fkvf.Appender(p, create=True, compact_at=bad)
    with pytest.raises(TypeError, match="compact_at"):
        fkvf.Appender(p, create=True, compact_at="1.5")
    with pytest.raises(TypeError, match="auto_compact"):
        fkvf.Appender(p, create=True, auto_compact=1)
    with pytest.raises(ValueError, match="exclude"):
        fkvf.Appender(p, create=True, compact_at=1.5, auto_compact=False)
    assert not p.exists()


def test_second_appender_refused(fkvf, tmp_path):
    p = tmp_path / "a.fkvf"
    k, v = rand_cache(8)
    with fkvf.Appender(p, create=True) as a:
        a.append(k, v)
        a.commit()
        with pytest.raises(fkvf.IoError) as e:
            fkvf.Appender(p)
        assert e.value.file == str(p) and str(p) in str(e.value)
        assert "another appender" in str(e.value)
        a.append(k, v)  # the first is unaffected
    with fkvf.Appender(p) as b:  # free again once closed
        assert b.n_positions == 10


def test_closed_appender_raises(fkvf, tmp_path):
    p = tmp_path / "a.fkvf"
    k, v = rand_cache(9)
    a = fkvf.Appender(p, create=True)
    a.append(k, v)
    a.commit()
    a.close()
    a.close()  # idempotent
    for call in (lambda: a.append(k, v), a.commit, a.sync, lambda: a.info,
                 lambda: a.n_positions):
        with pytest.raises(ValueError, match="closed appender"):
            call()
    with pytest.raises(ValueError, match="closed appender"):
        with a:
            pass


def test_bad_appends(fkvf, tmp_path):
    p = tmp_path / "a.fkvf"
    k, v = rand_cache(10, T=4)
    with fkvf.Appender(p, create=True, tokens=True) as a:
        a.append(k, v, tokens=[1, 2, 3, 4])
        with pytest.raises(ValueError, match="tokens: .*token stream"):
            a.append(k, v)  # missing
        with pytest.raises(ValueError, match=r"tokens: shape \(3,\)"):
            a.append(k, v, tokens=[1, 2, 3])
        with pytest.raises(ValueError, match="n_layers is 1"):
            a.append(k[:1], v[:1], tokens=[1, 2, 3, 4])
        with pytest.raises(ValueError, match="n_kv_heads is 1"):
            a.append(k[:, :1], v[:, :1], tokens=[1, 2, 3, 4])
        with pytest.raises(ValueError, match="key_dim is 4"):
            a.append(k[..., :4], v, tokens=[1, 2, 3, 4])
        with pytest.raises(ValueError, match="value_dim is 5"):
            a.append(k, v[..., :5], tokens=[1, 2, 3, 4])
        with pytest.raises(ValueError, match="4 dimensions"):
            a.append(k[0], v[0], tokens=[1, 2, 3, 4])
        with pytest.raises(TypeError, match="keys"):
            a.append("keys", v, tokens=[1, 2, 3, 4])
        with pytest.raises(TypeError, match="complex"):
            a.append(k.astype(np.complex64), v, tokens=[1, 2, 3, 4])
        assert a.info["pending"] == 4  # the first append only: none of these queued
    with fkvf.open(p) as r:
        assert r.n_positions == 4
    with fkvf.Appender(p) as a:
        with pytest.raises(ValueError, match="tokens: .*token stream"):
            a.append(k, v)
    p2 = tmp_path / "b.fkvf"
    with fkvf.Appender(p2, create=True, tokens=False) as a:
        with pytest.raises(ValueError, match="no token stream"):
            a.append(k, v, tokens=[1, 2, 3, 4])
        a.append(k, v)
    with fkvf.Appender(p2) as a:
        with pytest.raises(ValueError, match="no token stream"):
            a.append(k, v, tokens=[1, 2, 3, 4])


def test_bad_arguments(fkvf, tmp_path):
    p = tmp_path / "a.fkvf"
    k, v = rand_cache(11)
    with fkvf.Appender(p, create=True) as a:
        a.append(k, v)
    for kw, exc, msg in (({"sync": "always"}, ValueError, "sync"),
                         ({"beam": 0}, ValueError, "beam"),
                         ({"beam": 1.5}, TypeError, "beam"),
                         ({"layout": "thd"}, ValueError, "layout"),
                         ({"sinks": 2}, ValueError, "sinks= is an option of create"),
                         ({"shape": (1, 1, 1, 1)}, ValueError, "shape= is an option")):
        with pytest.raises(exc, match=msg):
            fkvf.Appender(p, **kw)
    q = tmp_path / "new.fkvf"
    for kw, exc, msg in (({"sinks": -1}, ValueError, "sinks"),
                         ({"recent": "32"}, TypeError, "recent"),
                         ({"codec": "zip"}, ValueError, "codec"),
                         ({"keys": "rotated"}, ValueError, "keys"),
                         ({"rope": fkvf.Rope(layout="split")}, ValueError, "rope layout"),
                         ({"rope": fkvf.Rope(theta=-1.0)}, ValueError, "rope theta"),
                         ({"rope": {"base": 1.0}}, ValueError, "unknown keys"),
                         ({"rope": True}, TypeError, "rope"),
                         ({"rope_theta": 10000.0}, TypeError, "rope_theta"),
                         ({"token_bits": 7}, ValueError, "token_bits"),
                         ({"token_bits": 8, "vocab_size": 256}, ValueError, "exclude"),
                         ({"tokens": False, "token_bits": 8}, ValueError, "tokens=False"),
                         ({"shape": (2, 2, 8)}, TypeError, "shape"),
                         ({"shape": (2, 0, 8, 8), "dtype": "f16"}, ValueError, "n_kv_heads"),
                         ({"shape": (2, 2, 8, 8)}, ValueError, "dtype="),
                         ({"shape": (2, 2, 7, 8), "dtype": "f16"}, ValueError, "odd"),
                         ({"dtype": "f64"}, ValueError, "dtype"),
                         ({"model_id": "a\0b"}, ValueError, "model_id"),
                         ({"tokenizer_id": 7}, TypeError, "tokenizer_id")):
        with pytest.raises(exc, match=msg):
            fkvf.Appender(q, create=True, **kw)
        assert not q.exists()


def test_create_over_existing_file_refused(fkvf, tmp_path, sample_copy):
    before = sample_copy.read_bytes()
    with pytest.raises(fkvf.ExistsError) as e:
        fkvf.Appender(sample_copy, create=True)
    assert str(sample_copy) in str(e.value)
    with pytest.raises(fkvf.ExistsError):
        fkvf.Appender(sample_copy, create=True, shape=(5, 4, 8, 8), dtype="f16")
    assert sample_copy.read_bytes() == before
    # a file that appears before the first commit of a deferred create: not replaced
    p = tmp_path / "late.fkvf"
    k, v = rand_cache(12)
    a = fkvf.Appender(p, create=True)
    a.append(k, v)
    p.write_bytes(b"mine")
    with pytest.raises(fkvf.ExistsError):
        a.commit()
    assert p.read_bytes() == b"mine"
    with pytest.raises(fkvf.ExistsError):  # the failed appender fails every later call
        a.append(k, v)
    assert "failed: FKVF_E_EXISTS" in repr(a)
    a.close()


def test_torch_tensors(fkvf, tmp_path):
    torch = pytest.importorskip("torch", reason="PyTorch (Debian's python3-torch) not installed")
    k, v = rand_cache(13, T=6, dtype=np.float32)
    p = tmp_path / "f16.fkvf"
    with fkvf.Appender(p, create=True) as a:
        # a DynamicCache-like list of per-layer (k, v) [1, H, t, D], in two pieces
        for s, e in ((0, 2), (2, 6)):
            a.append([torch.from_numpy(k[i:i + 1, :, s:e]).half() for i in range(2)],
                     [torch.from_numpy(v[i:i + 1, :, s:e]).half() for i in range(2)],
                     tokens=torch.arange(s, e))
            a.commit()
    uk, uv, ut = unpack(tmp_path, p)
    np.testing.assert_array_equal(bits(uk), bits(k.astype(np.float16)))
    np.testing.assert_array_equal(ut, np.arange(6))
    # bf16: stored as the tensor's bits
    kb, vb = torch.from_numpy(k).bfloat16(), torch.from_numpy(v).bfloat16()
    p2 = tmp_path / "bf16.fkvf"
    with fkvf.Appender(p2, create=True) as a:
        a.append(kb, vb)
    with fkvf.open(p2) as r:
        assert r.descriptor["dtype"] == "bf16"
        rk, rv = r.read()
    np.testing.assert_array_equal(rk, kb.view(torch.int16).numpy().view(np.uint16))
    np.testing.assert_array_equal(rv, vb.view(torch.int16).numpy().view(np.uint16))


# ---- across processes -----------------------------------------------------------

PER = 3


def child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(SRCDIR, "python")] + ([env["PYTHONPATH"]] if "PYTHONPATH" in env else []))
    return env


def start_child(path, seed, first, n, pause, per=PER, sync="none"):
    return subprocess.Popen([sys.executable, CHILD, str(path), str(seed), str(first), str(per),
                             str(n), str(pause), sync], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env())


def new_archive(fkvf, path, seed, per=PER):
    """An archive of the child's shape holding its first commit (per positions)."""
    k, v, t = seeded_cache(seed, 0, per)
    with fkvf.Appender(path, create=True, tokens=True, recent=6) as a:
        a.append(k, v, tokens=t)
    return k, v


def verify_snapshot(fkvf, r):
    """r.verify() passes (1), or r's open caught bytes after the last complete commit
    (a commit being written, or torn by a kill), which fkvf_reader_verify reports as a
    torn tail at the committed size (0)."""
    if r.info["torn_bytes"] == 0:
        r.verify()
        return 1
    with pytest.raises(fkvf.TornError) as e:
        r.verify()
    assert e.value.offset == r.info["committed_size"]
    return 0


def check_prefix(fkvf, r, seed, per=PER):
    """What r reads is positions 0..n-1 of the child's sequence, n a whole number of
    commits."""
    n = r.n_positions
    assert n % per == 0
    k, v, t = seeded_cache(seed, 0, n)
    rk, rv = r.read()
    np.testing.assert_array_equal(rk.view(np.uint16), k.view(np.uint16))
    np.testing.assert_array_equal(rv.view(np.uint16), v.view(np.uint16))
    np.testing.assert_array_equal(r.tokens, t)
    return n


def test_reader_while_another_process_appends(fkvf, tmp_path):
    p = tmp_path / "grow.fkvf"
    seed, n_commits = 5, 40
    new_archive(fkvf, p, seed)
    snapshot = fkvf.open(p)
    child = start_child(p, seed, PER, n_commits, 0.01)
    try:
        seen, verified = [], 0
        while child.poll() is None or not seen or seen[-1] < PER * (n_commits + 1):
            with fkvf.open(p) as r:
                seen.append(check_prefix(fkvf, r, seed))
                verified += verify_snapshot(fkvf, r)
            if child.poll() is not None and seen[-1] == PER * (n_commits + 1):
                break
            assert len(seen) < 100000
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert seen == sorted(seen)  # monotone
    assert len(set(seen)) > 2  # the growth was seen in between
    assert verified > 0
    committed = [int(line.split()[1]) for line in out.splitlines() if line.startswith("committed ")]
    assert committed == [PER * (c + 2) for c in range(n_commits)]
    assert set(seen) <= set(committed) | {PER}
    # the archive opened before the growth reads its own snapshot
    assert snapshot.n_positions == PER
    assert check_prefix(fkvf, snapshot, seed) == PER
    snapshot.verify()
    snapshot.close()
    run_cli("verify", p)


def test_child_killed_mid_commits(fkvf, tmp_path):
    """SIGKILL at a random moment of a run of commits (5 runs; with sync="commit" most
    land inside a commit here, leaving a torn tail): the file opens at the last complete
    commit and a new Appender continues it."""
    per, seed, rng = 50, 9, np.random.default_rng(0)
    torn = 0
    for trial in range(5):
        p = tmp_path / f"kill{trial}.fkvf"
        new_archive(fkvf, p, seed, per)
        child = start_child(p, seed, per, 100000, 0, per, "commit")
        try:
            for _ in range(20):  # 10 commits, then a kill wherever it is
                line = child.stdout.readline()
                assert line, child.stderr.read()
            time.sleep(float(rng.uniform(0, 0.003)))
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == -signal.SIGKILL
        with fkvf.open(p) as r:
            n = check_prefix(fkvf, r, seed, per)
            assert n >= per * 10
            verify_snapshot(fkvf, r)
            torn += r.info["torn_bytes"] > 0
        with pytest.raises(fkvf.TornError) if torn_now(fkvf, p) else contextlib.nullcontext():
            fkvf.Appender(p).close()
        # a new Appender continues from the last complete commit (a torn tail cut off)
        with fkvf.Appender(p, recover=True) as a:
            assert a.n_positions == n
            k, v, t = seeded_cache(seed, n, 2 * per)
            a.append(k, v, tokens=t)
        with fkvf.open(p, strict=True) as r:
            assert check_prefix(fkvf, r, seed, per) == n + 2 * per
            r.verify()
        run_cli("verify", p)
    print(f"{torn} of 5 kills left a torn tail")


def torn_now(fkvf, p):
    with fkvf.open(p) as r:
        return r.info["torn_bytes"] > 0


FAIL_SCRIPT = r"""
import resource, signal, sys
import numpy as np
import fkvf
path, size = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG, no signal
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 2000, resource.RLIM_INFINITY))
k = np.ones((2, 2, 400, 8), dtype=np.float16)
a = fkvf.Appender(path)
a.append(k, k)
first = None
try:
    a.commit()
except fkvf.IoError as e:
    first = e
    print("commit", type(e).__name__, e.file == path, flush=True)
for call in (lambda: a.append(k, k), a.commit, a.sync):
    try:
        call()
        print("no error")
    except fkvf.IoError as e2:
        print("later", type(e2).__name__, str(e2) == str(first))
i = a.info  # fkvf_appender_info still answers: the last commit, and what it did not write
print("info", i["n_positions"], i["pending"], i["file_size"] == size)
a.close()
"""


def test_failed_commit_fails_the_handle(fkvf, tmp_path):
    """A commit the file system refuses (RLIMIT_FSIZE in a child process): IoError naming
    the file, the file cut back to the previous commit, and every later call on the handle
    raises the same error."""
    p = tmp_path / "a.fkvf"
    k, v = rand_cache(14, Dv=8)
    with fkvf.Appender(p, create=True) as a:
        a.append(k, v)
    before = p.read_bytes()
    out = subprocess.run([sys.executable, "-c", FAIL_SCRIPT, str(p), str(len(before))],
                         capture_output=True, text=True, env=child_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n") == ["commit IoError True"] + ["later IoError True"] * 3 + [
        "info 5 400 True", ""]  # pending: the 400 the failed commit did not write
    assert p.read_bytes() == before
    with fkvf.open(p, strict=True) as r:
        assert r.n_positions == 5
        r.verify()


def test_beam_and_sync_none_same_bytes_as_cli(fkvf, tmp_path, codebook):
    K, V, T = sample_cache()
    cli = tmp_path / "cli.fkvf"
    run_cli("append", "--create", cli, SAMPLE_CACHE, "--codebooks", codebook, "--beam", "4",
            "--sync", "none", "--no-tokens", "--positions", "0:120", "--commit-every", "40")
    py = tmp_path / "py.fkvf"
    with fkvf.Appender(py, create=True, codebooks=codebook, beam=4, sync="none",
                       tokens=False) as a:
        for s in range(0, 120, 40):
            a.append(K[:, :, s:s + 40], V[:, :, s:s + 40])
            a.commit()
        a.sync()
        assert a.info["n_archived"] == 120 - 36
    assert py.read_bytes() == cli.read_bytes()
    greedy = tmp_path / "greedy.fkvf"
    with fkvf.Appender(greedy, create=True, codebooks=codebook, tokens=False) as a:
        a.append(K[:, :, :120], V[:, :, :120])
    with fkvf.open(greedy, codebooks=codebook) as g, fkvf.open(py, codebooks=codebook) as b:
        # the beam chose other codes than greedy encoding for some archived rows
        assert not np.array_equal(g.read(positions=slice(4, 84))[0],
                                  b.read(positions=slice(4, 84))[0])
