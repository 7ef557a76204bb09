"""A KV cache given by the caller, as the rows libfkvf writes (spec 14.2).

Every writer of the package (fkvf.pack, fkvf.train, fkvf.Appender.append) takes the cache
through here, so that the forms it accepts and how they are laid out are one rule:

* arrays: NumPy arrays, anything with ``__dlpack__`` or ``__array__``, and PyTorch tensors
  (detached and moved to the CPU; bfloat16 taken as its bits);
* a cache: a ``(keys, values)`` pair of ``[L, H, T, D]`` arrays; a sequence of one
  ``(k, v)`` pair per layer (the Hugging Face "legacy" cache), each ``[1, H, T, D]`` or
  ``[H, T, D]``; or an object with ``key_cache`` / ``value_cache`` lists (a transformers
  ``DynamicCache``) or ``layers`` whose items have ``keys`` / ``values``;
* layout "hnd" (heads first: ``[H, T, D]`` per layer, the Hugging Face order, default) or
  "nhd" (positions first: ``[T, H, D]`` per layer, as vLLM and flash-attention keep it).

The rows: position t is one row holding, for each layer in order, the keys of every head
then the values of every head (spec 14.2), in the archive's dtype.
"""

from __future__ import annotations

import warnings
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import _lib
from ._lib import lib

# the element type of each fkvf dtype in NumPy: bf16 has none, its bits are uint16
NP_OF = {_lib.DTYPE_F16: np.dtype("<f2"), _lib.DTYPE_BF16: np.dtype("<u2"),
         _lib.DTYPE_F32: np.dtype("<f4")}
NAME_OF = {_lib.DTYPE_F16: "f16", _lib.DTYPE_BF16: "bf16", _lib.DTYPE_F32: "f32"}



class Tensor(NamedTuple):
    """An array as NumPy, with its fkvf dtype (bf16: the array holds the bits as uint16;
    0 for a dtype fkvf does not store, such as float64, which writers convert)."""
    array: np.ndarray
    dtype: int


def dtype_code(dtype: Any) -> int:
    """np.float16 / np.float32 / "f16" / "bf16" / "f32" (and torch's) as an fkvf dtype."""
    if isinstance(dtype, str):
        table = {"f16": _lib.DTYPE_F16, "float16": _lib.DTYPE_F16, "bf16": _lib.DTYPE_BF16,
                 "bfloat16": _lib.DTYPE_BF16, "f32": _lib.DTYPE_F32, "float32": _lib.DTYPE_F32}
        code = table.get(dtype.lower())
        if code is not None:
            return code
    elif type(dtype).__module__.startswith("torch"):
        name = str(dtype).rsplit(".", 1)[-1]
        if name in ("float16", "bfloat16", "float32"):
            return dtype_code(name)
    else:
        try:
            d = np.dtype(dtype)
        except TypeError:
            d = None
        if d is not None and d.name in ("float16", "float32", "bfloat16"):
            return dtype_code(d.name)
    raise ValueError(f"dtype {dtype!r}: expected np.float16, np.float32 or 'bf16'")


def tensor(x: Any, what: str) -> Tensor:
    """x as a NumPy array without a copy where possible (torch CPU tensors, DLPack,
    __array__), and the fkvf dtype of its elements."""
    if type(x).__module__.startswith("torch"):
        import torch  # only for a torch tensor, which means torch is there
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{what}: a {type(x).__name__}, expected a tensor or an array")
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            return Tensor(t.contiguous().view(torch.int16).numpy().view(np.uint16),
                          _lib.DTYPE_BF16)
        return _numpy_tensor(t.numpy(), what)
    if isinstance(x, np.ndarray):
        return _numpy_tensor(x, what)
    if hasattr(x, "__dlpack__"):
        try:
            return _numpy_tensor(np.from_dlpack(x), what)
        except (TypeError, RuntimeError, BufferError, AttributeError):
            pass  # a DLPack NumPy cannot take (a device, a dtype): try __array__
    if hasattr(x, "__array__"):
        return _numpy_tensor(np.asarray(x), what)
    raise TypeError(f"{what}: a {type(x).__name__}, expected an array (NumPy, a torch tensor, "
                    "or anything with __dlpack__ or __array__)")


def _numpy_tensor(a: np.ndarray, what: str) -> Tensor:
    if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16 (JAX): its bits
        return Tensor(a.view(np.uint16), _lib.DTYPE_BF16)
    if a.dtype.byteorder == (">" if np.little_endian else "<"):
        a = a.astype(a.dtype.newbyteorder("="))  # big-endian input: native order, same values
    if a.dtype == np.float16:
        return Tensor(a, _lib.DTYPE_F16)
    if a.dtype == np.float32:
        return Tensor(a, _lib.DTYPE_F32)
    if a.dtype == np.uint16:
        # the bits of bf16 values, as fkvf read(dtype="bf16") returns them and as every
        # cache file of docs/cache-files.md holds bf16 (NumPy has no bf16)
        return Tensor(a, _lib.DTYPE_BF16)
    if a.dtype.kind in "fiu":
        return Tensor(a, 0)  # float64 (integers: ids, see cache_rows) converted by writers
    raise TypeError(f"{what}: elements of type {a.dtype}, expected floating point")


def convert(t: Tensor, to: int, what: str) -> np.ndarray:
    """t's elements in fkvf dtype `to` (bf16 as uint16 bits). f16 / bf16 / f32 to another
    of them go through libfkvf (round to nearest even, as the C tools); float64 is cast by
    NumPy straight to f16 or f32 (one rounding), and to bf16 through f32."""
    a, frm = t.array, t.dtype
    if frm == to:
        return a
    if frm == 0:
        if to == _lib.DTYPE_F32 or to == _lib.DTYPE_F16:
            return a.astype(NP_OF[to])
        a, frm = np.ascontiguousarray(a, dtype=np.float32), _lib.DTYPE_F32
        if frm == to:
            return a
    src = np.ascontiguousarray(a)
    out = np.empty(src.shape, dtype=NP_OF[to])
    if src.size:
        rc = lib.fkvf_convert(to, out.ctypes.data, frm, src.ctypes.data, src.size)
        if rc != _lib.OK:
            raise ValueError(f"{what}: cannot convert {NAME_OF.get(frm, frm)} to "
                             f"{NAME_OF.get(to, to)} (fkvf_convert: {rc})")
    return out


class Shape(NamedTuple):
    n_layers: int
    n_kv_heads: int
    n_positions: int
    key_dim: int
    value_dim: int

    def row_elems(self) -> int:
        return self.n_layers * self.n_kv_heads * (self.key_dim + self.value_dim)


def split_cache(cache: Any) -> Tuple[Any, Any]:
    """(keys, values) of a cache: a (K, V) pair of [L, H, T, D] arrays stays as it is; a
    sequence of per-layer (k, v) pairs, a DynamicCache (key_cache / value_cache) or an object
    with layers[i].keys / .values becomes (list of k, list of v)."""
    if hasattr(cache, "key_cache") and hasattr(cache, "value_cache"):
        return list(cache.key_cache), list(cache.value_cache)
    layers = getattr(cache, "layers", None)
    if layers is not None and not isinstance(cache, (list, tuple)):
        layers = list(layers)
        if all(hasattr(x, "keys") and hasattr(x, "values") and not isinstance(x, dict)
               for x in layers):
            return [x.keys for x in layers], [x.values for x in layers]
    if hasattr(cache, "to_legacy_cache"):
        cache = cache.to_legacy_cache()
    if isinstance(cache, dict) or not isinstance(cache, Sequence):
        raise TypeError(f"cache: a {type(cache).__name__}, expected a (keys, values) pair of "
                        "[L, H, T, D] arrays or a sequence of per-layer (k, v) pairs")
    items = list(cache)
    if len(items) == 2 and all(_is_array(x) for x in items):
        return items[0], items[1]
    if not items:
        raise ValueError("cache: no layers")
    ks, vs = [], []
    if len(items) == 2 and all(isinstance(x, Sequence) and len(x) != 2 and
                               all(_is_array(y) for y in x) for x in items):
        # (keys per layer, values per layer): not a 2-layer cache of (k, v) pairs; refused
        # rather than guessed (with 2 layers the two forms cannot be told apart)
        raise TypeError("cache: a pair of per-layer lists (keys, values); give one (k, v) "
                        "pair per layer: list(zip(keys, values)) (Appender.append takes "
                        "append(keys, values))")
    for i, pair in enumerate(items):
        if _is_array(pair) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise TypeError(f"cache[{i}]: expected a (k, v) pair of arrays")
        ks.append(pair[0])
        vs.append(pair[1])
    return ks, vs


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or hasattr(x, "__dlpack__") or (
        hasattr(x, "__array__") and hasattr(x, "shape"))


def _layers(part: Any, what: str, layout: str) -> List[Tensor]:
    """One 3-D array per layer, [H, T, D] (hnd) or [T, H, D] (nhd), from an [L, ...] 4-D
    array or a sequence of per-layer arrays ([1, ...] or [...])."""
    if _is_array(part):
        t = tensor(part, what)
        if t.array.ndim != 4:
            raise ValueError(f"{what}: shape {t.array.shape}, expected 4 dimensions "
                             f"[L, {'H, T' if layout == 'hnd' else 'T, H'}, D]")
        if t.array.shape[0] == 0:
            raise ValueError(f"{what}: shape {t.array.shape}: no layers")
        return [Tensor(t.array[i], t.dtype) for i in range(t.array.shape[0])]
    if not isinstance(part, Sequence) or isinstance(part, (str, bytes)):
        raise TypeError(f"{what}: a {type(part).__name__}, expected an array or a "
                        "sequence of per-layer arrays")
    out = []
    for i, x in enumerate(part):
        t = tensor(x, f"{what}[{i}]")
        a = t.array
        if a.ndim == 4:
            if a.shape[0] != 1:
                raise ValueError(f"{what}[{i}]: shape {a.shape}: a batch of {a.shape[0]}; "
                                 "an archive holds one sequence (batch 1)")
            a = a[0]
        if a.ndim != 3:
            raise ValueError(f"{what}[{i}]: shape {a.shape}, expected "
                             f"[1, {'H, T' if layout == 'hnd' else 'T, H'}, D] or 3 dimensions")
        out.append(Tensor(a, t.dtype))
    if not out:
        raise ValueError(f"{what}: no layers")
    return out


def check_layout(layout: Optional[str]) -> str:
    if layout is None:
        return "hnd"
    if layout not in ("hnd", "nhd"):
        raise ValueError(f"layout {layout!r}: expected 'hnd' (heads first, [H, T, D] per "
                         "layer) or 'nhd' (positions first, [T, H, D])")
    return layout


def cache_rows(keys: Any, values: Any, layout: Optional[str] = None,
               dtype: Any = None) -> Tuple[np.ndarray, Shape, int]:
    """(rows, shape, dtype code): the cache's rows, a C-contiguous [T, row elements] array
    of the archive's element type (uint16 for bf16), its shape, and its dtype (the given
    one, else the input's; float64 becomes f32, uint16 is bf16 bits, other integers are
    refused). Keys and values must agree
    in layers, heads, positions and dtype (unless dtype is given)."""
    lay = check_layout(layout)
    kl = _layers(keys, "keys", lay)
    vl = _layers(values, "values", lay)
    if len(kl) != len(vl):
        raise ValueError(f"keys have {len(kl)} layers, values {len(vl)}")
    ho, to = (0, 1) if lay == "hnd" else (1, 0)
    k0, v0 = kl[0].array.shape, vl[0].array.shape
    H, T, Dk, Dv = k0[ho], k0[to], k0[2], v0[2]
    for i, (k, v) in enumerate(zip(kl, vl)):
        ks, vs = k.array.shape, v.array.shape
        if (ks[ho], ks[to], ks[2]) != (H, T, Dk):
            raise ValueError(f"keys of layer {i}: shape {ks}, layer 0's is {k0}")
        if (vs[ho], vs[to]) != (H, T) or vs[2] != Dv:
            raise ValueError(f"values of layer {i}: shape {vs}, expected heads and "
                             f"positions as the keys' ({H} heads, {T} positions) and "
                             f"value_dim {Dv}")
    if layout is None and H > T and T > 0:
        warnings.warn(f"cache: {H} heads and {T} positions read heads first ([H, T, D], "
                      "layout='hnd'); if the arrays are [T, H, D], pass layout='nhd'",
                      stacklevel=3)
    for name, part in (("keys", kl), ("values", vl)):
        for t in part:
            if t.dtype == 0 and t.array.dtype.kind in "iu":
                raise TypeError(f"{name}: elements of type {t.array.dtype}: a cache holds "
                                "floating point (uint16 is taken as bf16 bits)")
    in_types = {t.dtype for t in kl + vl}
    if dtype is not None:
        code = dtype_code(dtype)
    elif len(in_types) == 1:
        code = in_types.pop() or _lib.DTYPE_F32
    else:
        names = sorted(NAME_OF.get(c, "float64/int") for c in in_types)
        raise ValueError(f"keys and values of different dtypes ({', '.join(names)}): pass "
                         "dtype= to store them in one")
    if min(H, Dk, Dv) == 0 and T > 0:
        raise ValueError(f"cache: {H} heads, key_dim {Dk}, value_dim {Dv}: none may be 0")
    shape = Shape(len(kl), H, T, Dk, Dv)
    rows = np.empty((T, shape.n_layers, H * (Dk + Dv)), dtype=NP_OF[code])
    for i, (k, v) in enumerate(zip(kl, vl)):
        # rows[t, i] = keys of every head, then values of every head
        # (views of rows: setting .shape raises rather than copy)
        dst_k, dst_v = rows[:, i, :H * Dk], rows[:, i, H * Dk:]
        dst_k.shape, dst_v.shape = (T, H, Dk), (T, H, Dv)
        ka, va = convert(k, code, "keys"), convert(v, code, "values")
        if lay == "hnd":
            ka, va = ka.transpose(1, 0, 2), va.transpose(1, 0, 2)
        dst_k[...] = ka
        dst_v[...] = va
    return rows.reshape(T, shape.row_elems()), shape, code  # -1 fails for T = 0


def tokens_array(tokens: Any, n: int, what: str = "tokens") -> Optional[np.ndarray]:
    """tokens (None, or n ints 0..2**32-1) as a C-contiguous uint32 array."""
    if tokens is None:
        return None
    t = tensor(tokens, what).array if not isinstance(tokens, (list, tuple)) else np.asarray(
        tokens)
    if t.ndim == 2 and t.shape[0] == 1:
        t = t[0]  # a [1, T] batch of input ids
    if t.ndim != 1 or t.shape[0] != n:
        raise ValueError(f"{what}: shape {t.shape}, expected ({n},): one id per position")
    if t.size and not np.issubdtype(t.dtype, np.integer):
        raise TypeError(f"{what}: elements of type {t.dtype}, expected integers")
    if t.size and (int(t.min()) < 0 or int(t.max()) > 0xFFFFFFFF):
        raise ValueError(f"{what}: ids must be 0..2**32-1")
    return np.ascontiguousarray(t, dtype=np.uint32)
