"""fkvf._cache: the forms of a cache a caller gives and the rows they become (spec 14.2).

Expected rows are built here element by element with plain loops (position t, then for each
layer the keys of every head, then the values of every head), not with the code under test."""

import struct
import types

import numpy as np
import pytest

from fkvf import _cache, _lib

L, H, T, DK, DV = 2, 3, 5, 4, 2


def kv(dtype=np.float32):
    rng = np.random.default_rng(7)
    k = rng.standard_normal((L, H, T, DK)).astype(dtype)
    v = rng.standard_normal((L, H, T, DV)).astype(dtype)
    return k, v


def expected_rows(k, v):
    """[T, row] by loops over [L, H, T, D] keys and values."""
    rows = []
    for t in range(k.shape[2]):
        row = []
        for layer in range(k.shape[0]):
            for h in range(k.shape[1]):
                row.extend(k[layer, h, t, d] for d in range(k.shape[3]))
            for h in range(v.shape[1]):
                row.extend(v[layer, h, t, d] for d in range(v.shape[3]))
        rows.append(row)
    return np.array(rows, dtype=k.dtype)


def bf16_bits(x):
    """bf16 bits of float32 values, round to nearest even, by hand (finite values)."""
    out = []
    for f in np.asarray(x, dtype=np.float32).ravel():
        (u,) = struct.unpack("<I", struct.pack("<f", float(f)))
        out.append((u + 0x7FFF + ((u >> 16) & 1)) >> 16)
    return np.array(out, dtype=np.uint16).reshape(np.shape(x))


def test_pair_of_lhtd_arrays():
    k, v = kv()
    rows, shape, code = _cache.cache_rows(k, v)
    assert shape == (L, H, T, DK, DV)
    assert code == _lib.DTYPE_F32
    assert rows.flags.c_contiguous and rows.shape == (T, L * H * (DK + DV))
    np.testing.assert_array_equal(rows, expected_rows(k, v))


def test_nhd_layout_and_transposed_views():
    k, v = kv(np.float16)
    rows_nhd, shape, code = _cache.cache_rows(k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
                                              layout="nhd")
    assert code == _lib.DTYPE_F16 and shape.n_kv_heads == H and shape.n_positions == T
    np.testing.assert_array_equal(rows_nhd, expected_rows(k, v))
    # a non-contiguous view in the default layout gives the same rows
    kk = np.ascontiguousarray(k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    assert not kk.flags.c_contiguous
    np.testing.assert_array_equal(_cache.cache_rows(kk, v)[0], expected_rows(k, v))


def test_per_layer_pairs_and_dynamic_cache_like():
    k, v = kv()
    want = expected_rows(k, v)
    pairs = [(k[i][None], v[i][None]) for i in range(L)]
    np.testing.assert_array_equal(_cache.cache_rows(*_cache.split_cache(pairs))[0], want)
    three_d = [(k[i], v[i]) for i in range(L)]
    np.testing.assert_array_equal(_cache.cache_rows(*_cache.split_cache(three_d))[0], want)
    dyn = types.SimpleNamespace(key_cache=[k[i][None] for i in range(L)],
                                value_cache=[v[i][None] for i in range(L)])
    np.testing.assert_array_equal(_cache.cache_rows(*_cache.split_cache(dyn))[0], want)
    layered = types.SimpleNamespace(layers=[types.SimpleNamespace(keys=k[i][None],
                                                                  values=v[i][None])
                                            for i in range(L)])
    np.testing.assert_array_equal(_cache.cache_rows(*_cache.split_cache(layered))[0], want)


def test_two_layer_pairs_are_not_taken_for_a_kv_pair():
    k, v = kv()
    two = ((k[0][None], v[0][None]), (k[1][None], v[1][None]))
    keys, values = _cache.split_cache(two)
    assert len(keys) == 2 and len(values) == 2
    np.testing.assert_array_equal(_cache.cache_rows(keys, values)[0], expected_rows(k, v))


def test_dtype_conversions():
    k, v = kv()
    rows16, _, code = _cache.cache_rows(k, v, dtype=np.float16)
    assert code == _lib.DTYPE_F16
    np.testing.assert_array_equal(rows16, expected_rows(k, v).astype(np.float16))
    rowsbf, _, code = _cache.cache_rows(k, v, dtype="bf16")
    assert code == _lib.DTYPE_BF16 and rowsbf.dtype == np.uint16
    np.testing.assert_array_equal(rowsbf, bf16_bits(expected_rows(k, v)))
    # float64 input: stored as f32 by default
    rows64, _, code = _cache.cache_rows(k.astype(np.float64), v.astype(np.float64))
    assert code == _lib.DTYPE_F32
    np.testing.assert_array_equal(rows64, expected_rows(k, v))


def test_refusals():
    k, v = kv()
    with pytest.raises(ValueError, match="4 dimensions"):
        _cache.cache_rows(k[0], v[0])
    with pytest.raises(ValueError, match="layers"):
        _cache.cache_rows(k, v[:1])
    with pytest.raises(ValueError, match="positions"):
        _cache.cache_rows(k, v[:, :, :2])
    with pytest.raises(ValueError, match="batch of 2"):
        _cache.cache_rows([np.stack([k[0], k[0]])], [np.stack([v[0], v[0]])])
    with pytest.raises(ValueError, match="different dtypes"):
        _cache.cache_rows(k, v.astype(np.float16))
    with pytest.raises(ValueError, match="layout"):
        _cache.cache_rows(k, v, layout="thd")
    with pytest.raises(TypeError, match="floating point"):
        _cache.cache_rows(k.astype(np.complex64), v.astype(np.complex64))
    with pytest.raises(TypeError):
        _cache.split_cache({"k": k})
    with pytest.raises(ValueError, match="no layers"):
        _cache.split_cache([])
    with pytest.raises(ValueError, match="dtype"):
        _cache.dtype_code("int8")


def test_more_heads_than_positions_warns_unless_layout_is_given():
    k = np.zeros((1, 8, 2, 4), np.float32)
    with pytest.warns(UserWarning, match="layout='nhd'"):
        _cache.cache_rows(k, k)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _cache.cache_rows(k, k, layout="hnd")


def test_tokens():
    np.testing.assert_array_equal(_cache.tokens_array([1, 2, 3], 3), [1, 2, 3])
    assert _cache.tokens_array(None, 3) is None
    assert _cache.tokens_array(np.array([[4, 5]]), 2).dtype == np.uint32
    with pytest.raises(ValueError, match=r"\(3,\)"):
        _cache.tokens_array([1, 2], 3)
    with pytest.raises(ValueError, match="2\\*\\*32"):
        _cache.tokens_array([2**32], 1)
    with pytest.raises(ValueError, match="2\\*\\*32"):
        _cache.tokens_array([-1], 1)
    with pytest.raises(TypeError, match="integers"):
        _cache.tokens_array([1.5], 1)


def test_torch_tensors_including_bf16():
    torch = pytest.importorskip("torch", reason="PyTorch (Debian's python3-torch) not installed")
    k, v = kv()
    kt = torch.tensor(k, requires_grad=True)
    rows, _, code = _cache.cache_rows(kt, torch.tensor(v))
    assert code == _lib.DTYPE_F32
    np.testing.assert_array_equal(rows, expected_rows(k, v))
    kb, vb = torch.tensor(k).to(torch.bfloat16), torch.tensor(v).to(torch.bfloat16)
    rows, _, code = _cache.cache_rows([kb[i][None] for i in range(L)],
                                      [vb[i][None] for i in range(L)])
    assert code == _lib.DTYPE_BF16
    # torch's own bf16 rounding is to nearest even too: the bits must be the hand-computed ones
    np.testing.assert_array_equal(rows, bf16_bits(expected_rows(k, v)))
    assert _cache.dtype_code(torch.float16) == _lib.DTYPE_F16
    assert _cache.dtype_code(torch.bfloat16) == _lib.DTYPE_BF16
    toks = _cache.tokens_array(torch.tensor([[1, 2, 3]]), 3)
    np.testing.assert_array_equal(toks, [1, 2, 3])
