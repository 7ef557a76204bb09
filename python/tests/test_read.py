"""Archive.read against `fkvf unpack` of the same archive, bit for bit: every position,
slices, index arrays, layer and head subsets, parts, dtypes, the HF layout."""

import numpy as np
import pytest

from conftest import SAMPLE, unpack

L, H, T, D = 5, 4, 100, 8
EXACT = np.r_[0:4, 68:100]  # 4 sinks and the recent window of 32 (fkvf info: 36 exact)


def bits(a):
    """The bit patterns of an array (so NaN == NaN and -0 != +0)."""
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def same(a, b):
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))


@pytest.fixture(scope="module")
def arc(fkvf):
    a = fkvf.open(SAMPLE)
    yield a
    a.close()


@pytest.mark.parametrize("dt,npdt", [("f16", np.float16), ("f32", np.float32),
                                     ("bf16", "bf16")])
def test_all_positions_equal_cli_restore(arc, sample_unpacked, dt, npdt):
    ek, ev, _ = sample_unpacked[dt]
    k, v = arc.read(dtype=npdt)
    assert k.shape == (L, H, T, D) and v.shape == (L, H, T, D)
    assert k.dtype == {"f16": np.float16, "f32": np.float32, "bf16": np.uint16}[dt]
    assert k.flags.c_contiguous and v.flags.c_contiguous
    assert same(k, ek) and same(v, ev)


def test_default_dtype_is_the_archives(arc, sample_unpacked):
    k, v = arc.read()
    assert k.dtype == np.float16
    ek, ev, _ = sample_unpacked["f16"]
    assert same(k, ek) and same(v, ev)


def test_exact_positions_are_the_packed_bits(fkvf, arc, tmp_path):
    # the original cache the sample was packed from is not in the tree, so the exact rows
    # are checked against unpack to .npz (another writer path of the CLI) and for not being
    # reconstructions: an archived position reads differently at f16 and via f32 -> f16
    ek, ev, _ = unpack(tmp_path, SAMPLE, None, fmt="npz")
    k, v = arc.read(positions=EXACT)
    assert same(k, ek[:, :, EXACT]) and same(v, ev[:, :, EXACT])
    k32, _ = arc.read(positions=EXACT, dtype=np.float32)
    assert same(k32.astype(np.float16), k)  # f16 -> f32 widening is exact


def test_slices(arc, sample_unpacked):
    ek, ev, _ = sample_unpacked["f16"]
    for s in (slice(0, 10), slice(3, 70), slice(60, 100), slice(None, None, 3),
              slice(90, 10, -7), slice(-5, None), slice(50, 50)):
        k, v = arc.read(positions=s)
        assert same(k, ek[:, :, s]) and same(v, ev[:, :, s]), s


def test_index_arrays_and_ints(arc, sample_unpacked):
    ek, ev, _ = sample_unpacked["f16"]
    rng = np.random.default_rng(7)
    for idx in ([5], [99, 0, 50, 50, 3], np.arange(10, 20), rng.integers(0, T, 80),
                np.array([-1, -100]), [], np.arange(T) % 2 == 0):
        k, v = arc.read(positions=idx)
        want = np.asarray(idx)
        want = want if want.dtype == bool else want.astype(np.int64)
        assert same(k, ek[:, :, want]) and same(v, ev[:, :, want]), idx
    k, v = arc.read(positions=42)
    assert same(k, ek[:, :, 42:43]) and same(v, ev[:, :, 42:43])


def sel(s, n):
    """The indices a selector means, computed with NumPy's own indexing."""
    if s is None:
        return np.arange(n)
    if isinstance(s, int):
        return np.array([s])
    return np.arange(n)[s]


def test_layers_heads_subsets(arc, sample_unpacked):
    ek, ev, _ = sample_unpacked["f32"]
    for layers, heads in ((2, None), (slice(1, 4), slice(2, 4)), ([4, 0], [3, 1, 1]),
                          (None, 0), ([1], slice(None, None, 2))):
        k, v = arc.read(layers=layers, heads=heads, dtype=np.float32)
        li, hi = sel(layers, L), sel(heads, H)
        assert same(k, ek[li][:, hi]) and same(v, ev[li][:, hi]), (layers, heads)
    k, v = arc.read(positions=[7, 80], layers=[3], heads=[2], dtype=np.float32)
    assert same(k, ek[3:4, 2:3][:, :, [7, 80]]) and same(v, ev[3:4, 2:3][:, :, [7, 80]])


def test_parts(arc, sample_unpacked):
    ek, ev, _ = sample_unpacked["bf16"]
    k = arc.read(part="k", dtype="bf16", positions=slice(0, 70))
    v = arc.read(part="v", dtype="bf16", positions=slice(0, 70))
    assert isinstance(k, np.ndarray) and isinstance(v, np.ndarray)
    assert same(k, ek[:, :, :70]) and same(v, ev[:, :, :70])


def test_hf_layout(arc, sample_unpacked):
    ek, ev, _ = sample_unpacked["f16"]
    hf = arc.read(layout="hf")
    assert isinstance(hf, list) and len(hf) == L
    for i, (k, v) in enumerate(hf):
        assert k.shape == (1, H, T, D) and v.shape == (1, H, T, D)
        assert same(k[0], ek[i]) and same(v[0], ev[i])
    ks = arc.read(layout="hf", part="k", layers=[1, 3])
    assert len(ks) == 2 and same(ks[1][0], ek[3])


def test_bad_arguments(arc):
    with pytest.raises(IndexError):
        arc.read(positions=100)
    with pytest.raises(IndexError):
        arc.read(positions=[0, 100])
    with pytest.raises(IndexError):
        arc.read(layers=5)
    with pytest.raises(IndexError):
        arc.read(heads=[4])
    with pytest.raises(IndexError):
        arc.read(positions=[[1, 2]])
    with pytest.raises(IndexError):
        arc.read(positions=[1.5])
    with pytest.raises(TypeError):
        arc.read(positions=True)
    with pytest.raises(ValueError, match="part"):
        arc.read(part="q")
    with pytest.raises(ValueError, match="dtype"):
        arc.read(dtype=np.int8)
    with pytest.raises(ValueError, match="dtype"):
        arc.read(dtype="f64")
    with pytest.raises(ValueError, match="layout"):
        arc.read(layout="thd")


def test_threads_share_one_archive(fkvf, sample_unpacked):
    # calls on one Archive are serialised by its lock: concurrent reads all get the right rows
    import threading
    ek, _, _ = sample_unpacked["f32"]
    errors = []
    with fkvf.open(SAMPLE) as a:
        def work(seed):
            rng = np.random.default_rng(seed)
            try:
                for _ in range(50):
                    idx = rng.integers(0, T, 5)
                    k = a.read(positions=idx, part="k", dtype=np.float32)
                    if not same(k, ek[:, :, idx]):
                        errors.append(seed)
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)
        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
