"""Writing archives and codebook files: fkvf.pack and fkvf.train.

``fkvf.pack(cache, path)`` does what ``fkvf pack CACHE -o PATH`` does, and
``fkvf.train(caches, path)`` what ``fkvf train CACHE... -o PATH`` does, with the same
defaults, the same rules (the library's: fkvf_codebook_auto_k, fkvf_codebook_pays) and the
same files: ``fkvf pack --codebooks`` takes a codebook file trained here, and
``fkvf.pack(codebooks=...)`` one trained by the CLI. The cache is taken through
fkvf._cache (every form it accepts: NumPy, torch, DLPack; (K, V) pairs, per-layer pairs,
DynamicCache-like objects; "hnd" / "nhd").
"""

from __future__ import annotations

import ctypes
import math
import os
import warnings
from ctypes import (POINTER, Structure, byref, c_char_p, c_double, c_int, c_size_t, c_uint,
                    c_uint8, c_uint32, c_uint64, c_void_p)
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

import numpy as np

from . import _cache, _lib
from ._lib import lib
from .errors import FkvfError, make

PathLike = Union[str, "os.PathLike[str]"]

# ---- structures and prototypes (fkvf.h) -----------------------------------------


class _Shape(Structure):  # fkvf_codebook_shape
    _fields_ = [("n_layers", c_uint32), ("n_heads", c_uint32), ("key_dim", c_uint32),
                ("value_dim", c_uint32), ("k", c_uint32), ("k_stages", c_uint8),
                ("v_stages", c_uint8), ("dtype", c_int), ("pooled", c_uint8)]


class _Rope(Structure):  # fkvf_rope
    _fields_ = [("layout", c_uint8), ("rope_dims", c_uint32), ("theta", c_double)]


class _Rows(Structure):  # fkvf_rows
    _fields_ = [("data", c_void_p), ("n_rows", c_size_t), ("dtype", c_int),
                ("first_position", c_uint64)]


class _RvqParams(Structure):  # fkvf_rvq_params
    _fields_ = [("n_layers", c_uint32), ("n_kv_heads", c_uint32), ("key_dim", c_uint32),
                ("value_dim", c_uint32), ("k", c_uint32), ("k_stages", c_uint8),
                ("v_stages", c_uint8), ("pooled", c_uint8), ("table_dtype", c_int),
                ("seed", c_uint64), ("max_iters", c_uint32),
                ("samples_per_centroid", c_uint32), ("key_rope", POINTER(_Rope)),
                ("progress", c_void_p), ("progress_opaque", c_void_p)]


class _WriterOptions(Structure):  # fkvf_writer_options
    _fields_ = [("required_features", c_uint64), ("optional_features", c_uint64),
                ("block_size", c_uint32), ("deflate_level", c_int), ("sync", c_uint),
                ("no_replace", c_int), ("mode", c_uint)]


class _StreamSpec(Structure):  # fkvf_stream_spec
    _fields_ = [("profile", c_int), ("symbol_bits", c_uint), ("alphabet", c_uint32),
                ("r", c_double), ("span_symbols", c_uint32)]


class _KeySettings(Structure):  # fkvf_key_settings
    _fields_ = [("pre_rope", c_uint8), ("no_rope", c_uint8), ("layout", c_uint8),
                ("dims", c_uint32), ("theta", c_double), ("keys_set", c_uint8),
                ("theta_set", c_uint8), ("dims_set", c_uint8), ("layout_set", c_uint8),
                ("layout_taken", c_uint8)]


class _KeyClash(Structure):  # fkvf_key_clash
    _fields_ = [("setting", c_char_p), ("trained", ctypes.c_char * 32),
                ("given", ctypes.c_char * 32)]


# the argument of fkvf.pack each setting of fkvf_key_clash is
_CLASH_ARG = {"keys": "keys", "rope_theta": "rope theta", "rope_dims": "rope dims",
              "rope_layout": "rope layout"}

_W = c_void_p  # fkvf_writer *
_Q = c_void_p  # fkvf_rvq *
_R = c_void_p  # fkvf_reader *

_lib.bind({
    "fkvf_codebook_size": (c_uint64, [POINTER(_Shape)]),
    "fkvf_codebook_auto_k": (c_uint32, [POINTER(_Shape), c_uint32, c_uint64]),
    "fkvf_codebook_pays": (c_int, [POINTER(_Shape), c_uint32, c_uint64, c_uint64,
                                   POINTER(c_double)]),
    "fkvf_quad_bits_for": (c_uint, [c_uint64]),
    "fkvf_rvq_params_init": (None, [POINTER(_RvqParams)]),
    "fkvf_rvq_train": (c_int, [POINTER(_Q), POINTER(_RvqParams), POINTER(_Rows), c_size_t,
                               c_void_p]),
    "fkvf_rvq_from_tables": (c_int, [POINTER(_Q), POINTER(_Shape), c_uint32, c_void_p,
                                     c_size_t, c_void_p]),
    "fkvf_rvq_free": (None, [_Q]),
    "fkvf_rvq_shape": (None, [_Q, POINTER(_Shape), POINTER(c_uint32)]),
    "fkvf_rvq_tables_size": (c_size_t, [_Q]),
    "fkvf_rvq_tables": (c_int, [_Q, c_void_p, c_size_t]),
    "fkvf_rvq_codes_per_position": (c_size_t, [_Q]),
    "fkvf_rvq_encode": (c_int, [_Q, POINTER(_Rows), POINTER(_Rope), c_uint, c_void_p,
                                c_size_t, c_size_t]),
    "fkvf_writer_options_init": (None, [POINTER(_WriterOptions)]),
    "fkvf_writer_create_file": (c_int, [POINTER(_W), c_char_p, POINTER(_WriterOptions),
                                        c_void_p]),
    "fkvf_writer_free": (None, [_W]),
    "fkvf_writer_error": (c_int, [_W, POINTER(_lib.ErrorInfo)]),
    "fkvf_writer_set_desc": (c_int, [_W, POINTER(_lib.Desc)]),
    "fkvf_writer_meta_u64": (c_int, [_W, c_char_p, c_uint64]),
    "fkvf_writer_meta_i64": (c_int, [_W, c_char_p, ctypes.c_int64]),
    "fkvf_writer_meta_f64": (c_int, [_W, c_char_p, c_double]),
    "fkvf_writer_meta_bool": (c_int, [_W, c_char_p, c_int]),
    "fkvf_writer_meta_utf8": (c_int, [_W, c_char_p, c_char_p]),
    "fkvf_writer_meta_bytes": (c_int, [_W, c_char_p, c_void_p, c_size_t]),
    "fkvf_writer_add_exact": (c_int, [_W, c_uint64, c_uint64, c_void_p, c_size_t, c_uint]),
    "fkvf_writer_add_index_segment": (c_int, [_W, POINTER(_StreamSpec), c_uint64, c_uint64,
                                              c_void_p, c_size_t, c_size_t]),
    "fkvf_writer_add_token_segment": (c_int, [_W, POINTER(_StreamSpec), c_uint64, c_void_p,
                                              c_size_t]),
    "fkvf_writer_add_codebooks": (c_int, [_W, POINTER(_Shape), c_void_p, c_size_t, c_uint]),
    "fkvf_writer_add_codebook_ref": (c_int, [_W, POINTER(_Shape), POINTER(c_uint8),
                                             c_char_p]),
    "fkvf_writer_set_positions": (c_int, [_W, c_uint64, c_uint64]),
    "fkvf_writer_finish": (c_int, [_W]),
    "fkvf_reader_codebook": (c_int, [_R, POINTER(_Shape), POINTER(c_void_p),
                                     POINTER(c_size_t), POINTER(c_uint8)]),
    "fkvf_codebook_key_settings": (c_int, [_R, c_uint32, POINTER(_KeySettings),
                                           POINTER(_KeyClash)]),
})

_FEAT_NGON, _FEAT_DEFLATE, _FEAT_EXTERNAL_CODEBOOK = 1, 2, 4
_OPTFEAT_TOKEN_STREAM = 1
_SECTION_DEFLATE = 2
_PROFILE_QUAD, _PROFILE_NGON = 1, 2
_ROPE_INTERLEAVED, _ROPE_HALF_SPLIT = 1, 2
_LAYOUT_NAMES = {"interleaved": _ROPE_INTERLEAVED, "half-split": _ROPE_HALF_SPLIT}
_MAX_BEAM = 64
_ENCODE_CHUNK = 256  # rows per fkvf_rvq_encode call, as fkvf pack


class Rope(NamedTuple):
    """How the cache's keys are rotated (RoPE): base theta, rotated dims (even; None = every
    key dim) and pair layout ("interleaved" pairs (2i, 2i+1), or "half-split" pairs
    (i, i + dims/2) as Hugging Face's rotate_half). A field left None takes the default:
    a --codebooks file's train.* setting, else 10000 / key_dim / the cache form's layout."""
    theta: Optional[float] = None
    dims: Optional[int] = None
    layout: Optional[str] = None


# ---- errors ---------------------------------------------------------------------

def _code_error(code: int, message: str, path: Optional[str]) -> FkvfError:
    name = _lib.text(lib.fkvf_error_name(code)) or ""
    text = f"{message}: {_lib.text(lib.fkvf_strerror(code))}"
    return make(code, name, lib.fkvf_error_class(code),
                f"{path}: {text}" if path else text, path)


def _handle_error(getter: Any, handle: Optional[int], code: int, path: Optional[str],
                  prefix: str = "") -> FkvfError:
    """The error of a writer / reader handle (fkvf_*_error): file, offset, clause, field."""
    if handle:
        info = _lib.ErrorInfo()
        if getter(handle, byref(info)) == _lib.OK and info.code != _lib.OK:
            c = info.code
            offset = None if info.offset == _lib.ERROR_NO_OFFSET else int(info.offset)
            return make(c, _lib.text(lib.fkvf_error_name(c)) or "", lib.fkvf_error_class(c),
                        prefix + (_lib.text(info.message) or ""), _lib.text(info.file) or path,
                        offset, _lib.text(info.clause), _lib.text(info.field))
    return _code_error(code, prefix.rstrip(": ") or "failed", path)


def _writer_error(w: Optional[int], code: int, path: str, stage: str = "") -> FkvfError:
    return _handle_error(lib.fkvf_writer_error, w, code, path,
                         f"writing the {stage} failed: " if stage else "")


def _reader_error(r: Optional[int], code: int, path: str, prefix: str = "") -> FkvfError:
    return _handle_error(lib.fkvf_reader_error, r, code, path, prefix)


# ---- arguments --------------------------------------------------------------------

def _int_arg(name: str, v: Any, lo: int, hi: int, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: a {type(v).__name__}, expected an int ({what})")
    if not lo <= int(v) <= hi:
        raise ValueError(f"{name}: {v} is not {what}")
    return int(v)


def _k_arg(k: Any) -> int:
    k = _int_arg("k", k, 16, 4096, "a power of two from 16 to 4096")
    if k & (k - 1):
        raise ValueError(f"k: {k} is not a power of two from 16 to 4096")
    return k


def _choice(name: str, v: Any, choices: Tuple[str, ...]) -> str:
    if not isinstance(v, str) or v not in choices:
        raise ValueError(f"{name}: {v!r} is not " + " or ".join(repr(c) for c in choices))
    return v


def _path_arg(name: str, p: Any) -> str:
    if not isinstance(p, (str, os.PathLike)):
        raise TypeError(f"{name}: a {type(p).__name__}, expected a path (str or os.PathLike)")
    s = os.fspath(p)
    if not isinstance(s, str) or not s:
        raise ValueError(f"{name}: {p!r} is not a path")
    return s


class _KeyOpts:
    """The key options as the CLI's cli_key_opts: each setting and whether it was given
    (a given one is checked against a codebook file's training, one not given taken from
    it)."""

    def __init__(self, keys: Optional[str], rope: Any) -> None:
        self.keys_set = keys is not None
        self.pre_rope = _choice("keys", keys, ("pre-rope", "as-is")) == "pre-rope" \
            if keys is not None else True
        self.no_rope = rope is False
        self.theta, self.dims, self.layout = 10000.0, None, _ROPE_INTERLEAVED
        self.theta_set = self.dims_set = self.layout_set = False
        self.layout_cb = False
        if rope is None or rope is False:
            return
        if isinstance(rope, dict):
            extra = set(rope) - {"theta", "dims", "layout"}
            if extra:
                raise ValueError(f"rope: unknown keys {sorted(extra)} (theta, dims, layout)")
            rope = Rope(**rope)
        if not isinstance(rope, Rope):
            raise TypeError(f"rope: a {type(rope).__name__}, expected None, False, a dict or "
                            "fkvf.Rope(theta=..., dims=..., layout=...)")
        if rope.theta is not None:
            if isinstance(rope.theta, bool) or not isinstance(rope.theta, (int, float)) or \
                    not math.isfinite(rope.theta) or rope.theta <= 0:
                raise ValueError(f"rope theta: {rope.theta!r} is not a positive number")
            self.theta, self.theta_set = float(rope.theta), True
        if rope.dims is not None:
            d = _int_arg("rope dims", rope.dims, 2, 65536, "an even number >= 2")
            if d % 2:
                raise ValueError(f"rope dims: {d} is not an even number >= 2")
            self.dims, self.dims_set = d, True
        if rope.layout is not None:
            self.layout = _LAYOUT_NAMES[_choice("rope layout", rope.layout,
                                                tuple(_LAYOUT_NAMES))]
            self.layout_set = True

    def hf_default(self, hf: bool) -> None:
        """Per-layer pairs and DynamicCache-like caches: half-split pairs (Hugging Face's
        rotate_half), as the CLI for Hugging Face tensor names."""
        if hf and not (self.layout_set or self.layout_cb or self.no_rope):
            self.layout = _ROPE_HALF_SPLIT

    def rope_for(self, key_dim: int) -> Tuple[_Rope, bool]:
        """The RoPE settings and whether keys are archived un-rotated (cli_key_rope)."""
        dims = self.dims if self.dims else key_dim
        if not self.no_rope and not self.dims and key_dim % 2:
            raise ValueError(f"rope: key_dim {key_dim} is odd, and RoPE rotates pairs of dims: "
                             f"give rope=fkvf.Rope(dims=N) (even, at most {key_dim - 1}) or "
                             "rope=False")
        if not self.no_rope and (dims > key_dim or dims % 2):
            raise ValueError(f"rope dims {dims} does not fit key_dim {key_dim} (even, at most "
                             "key_dim)")
        return _Rope(self.layout, dims, self.theta), self.pre_rope and not self.no_rope

    def from_codebook(self, r: int, cbpath: str, key_dim: int) -> None:
        """The codebook file's train.* settings taken where not given; a given one that
        contradicts them refused (the library's rule, fkvf_codebook_key_settings, as
        fkvf pack --codebooks: its centroids are keys handled the other way)."""
        k = _KeySettings(int(self.pre_rope), int(self.no_rope), self.layout, self.dims or 0,
                         self.theta, int(self.keys_set), int(self.theta_set),
                         int(self.dims_set), int(self.layout_set), 0)
        clash = _KeyClash()
        rc = lib.fkvf_codebook_key_settings(r, key_dim, byref(k), byref(clash))
        self.pre_rope, self.layout = bool(k.pre_rope), k.layout
        self.dims, self.theta = k.dims or None, k.theta
        self.layout_cb = bool(k.layout_taken)
        if rc == _lib.OK:
            return
        if not clash.setting:
            raise _code_error(rc, "the codebook's key settings", cbpath)
        opt = _CLASH_ARG.get(clash.setting.decode(), clash.setting.decode())
        trained, given = clash.trained.decode(), clash.given.decode()
        raise _code_error(
            rc, f"trained with {opt} {trained}, and {opt} {given} was given: its centroids "
            f"are keys handled the other way; leave {opt} out (the codebook's setting is "
            "used), or train a codebook with it (fkvf.train)", cbpath)


def _check_stages(k_stages: Any, v_stages: Any) -> Tuple[int, int]:
    ks = _int_arg("k_stages", k_stages, 0, 16, "a stage count 0..16")
    vs = _int_arg("v_stages", v_stages, 0, 16, "a stage count 0..16")
    if ks + vs == 0:
        raise ValueError("k_stages and v_stages: both 0; a codebook needs a stage")
    return ks, vs


def _meta_items(metadata: Any) -> List[Tuple[str, Any]]:
    if metadata is None:
        return []
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata: a {type(metadata).__name__}, expected a dict "
                        "{str: str | int | float | bool | bytes}")
    out = []
    for key, v in metadata.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"metadata: key {key!r} is not a non-empty str")
        if isinstance(v, (np.integer, np.floating, np.bool_)):
            v = v.item()
        if isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**64:
            raise ValueError(f"metadata[{key!r}]: {v} does not fit 64 bits")
        if not isinstance(v, (str, int, float, bool, bytes, bytearray, memoryview)):
            raise TypeError(f"metadata[{key!r}]: a {type(v).__name__}, expected str, int, "
                            "float, bool or bytes")
        out.append((key, v))
    return out


def _write_meta(w: int, key: str, v: Any) -> int:
    k = key.encode()
    if isinstance(v, bool):
        return lib.fkvf_writer_meta_bool(w, k, int(v))
    if isinstance(v, int):
        return lib.fkvf_writer_meta_u64(w, k, v) if v >= 0 else lib.fkvf_writer_meta_i64(w, k, v)
    if isinstance(v, float):
        return lib.fkvf_writer_meta_f64(w, k, v)
    if isinstance(v, str):
        b = v.encode("utf-8")
        if b"\0" in b:
            raise ValueError(f"metadata[{key!r}]: a str with a NUL character")
        return lib.fkvf_writer_meta_utf8(w, k, b)
    b = bytes(v)
    return lib.fkvf_writer_meta_bytes(w, k, b, len(b))


def _shape(sh: "_cache.Shape", k: int, ks: int, vs: int, f32: bool, pooled: bool) -> _Shape:
    return _Shape(sh.n_layers, 1 if pooled else sh.n_kv_heads, sh.key_dim, sh.value_dim, k,
                  ks, vs, _lib.DTYPE_F32 if f32 else _lib.DTYPE_F16, int(pooled))


def _rows_of(cache: Any, layout: Optional[str], dtype: Any, what: str
             ) -> Tuple[np.ndarray, "_cache.Shape", int, bool]:
    """rows, shape, dtype code and whether the cache came in a Hugging Face form (per-layer
    pairs, DynamicCache-like)."""
    keys, values = _cache.split_cache(cache)
    rows, shape, code = _cache.cache_rows(keys, values, layout, dtype)
    if shape.n_positions == 0:
        raise ValueError(f"{what}: the cache holds no positions")
    if shape.n_positions > 0xFFFFFFFF:
        raise ValueError(f"{what}: {shape.n_positions} positions, at most 2**32-1")
    return rows, shape, code, isinstance(keys, list)


def _create_writer(path: str, wo: _WriterOptions) -> int:
    w = _W()
    rc = lib.fkvf_writer_create_file(byref(w), path.encode(), byref(wo), None)
    if rc != _lib.OK:
        err = _writer_error(w.value, rc, path)
        lib.fkvf_writer_free(w)
        raise err
    return w.value


def _check_not_input(path: str, inp: Optional[str], what: str) -> None:
    if inp and os.path.exists(path) and os.path.exists(inp) and os.path.samefile(path, inp):
        raise ValueError(f"path: {path} is the {what} {inp}, an input: never replaced")


def _train_q(blocks: List[Tuple[np.ndarray, int]], shape: "_cache.Shape", k: int, ks: int,
             vs: int, f32: bool, pooled: bool, seed: int, iters: int,
             krope: Optional[_Rope], path: str) -> int:
    prm = _RvqParams()
    lib.fkvf_rvq_params_init(byref(prm))
    prm.n_layers, prm.n_kv_heads = shape.n_layers, shape.n_kv_heads
    prm.key_dim, prm.value_dim = shape.key_dim, shape.value_dim
    prm.k, prm.k_stages, prm.v_stages, prm.pooled = k, ks, vs, int(pooled)
    prm.table_dtype = _lib.DTYPE_F32 if f32 else _lib.DTYPE_F16
    prm.seed, prm.max_iters = seed, iters
    prm.key_rope = ctypes.pointer(krope) if krope is not None else None
    arr = (_Rows * len(blocks))()
    for i, (rows, code) in enumerate(blocks):
        arr[i] = _Rows(rows.ctypes.data, rows.shape[0], code, 0)
    q = _Q()
    rc = lib.fkvf_rvq_train(byref(q), byref(prm), arr, len(blocks), None)
    if rc != _lib.OK:
        lib.fkvf_rvq_free(q)
        raise _code_error(rc, "training failed", path)
    return q.value


def _tables(q: int) -> np.ndarray:
    n = lib.fkvf_rvq_tables_size(q)
    t = np.empty(max(n, 1), dtype=np.uint8)
    rc = lib.fkvf_rvq_tables(q, t.ctypes.data, n)
    if rc != _lib.OK:
        raise _code_error(rc, "codebook tables", None)
    return t[:n]


def _load_codebook(cbpath: str, shape: "_cache.Shape", keys: _KeyOpts
                   ) -> Tuple[int, int, _Shape, bytes]:
    """(reader, rvq, shape, content hash) of a codebook file that fits the cache; the key
    options settled by its training. The caller frees both handles."""
    r = _R()
    rc = lib.fkvf_reader_open_file(byref(r), cbpath.encode(), 0, None)
    q = _Q()
    try:
        if rc != _lib.OK:
            raise _reader_error(r.value, rc, cbpath)
        info = _lib.ArchiveInfo()
        rc = lib.fkvf_reader_info(r, byref(info))
        if rc != _lib.OK:
            raise _reader_error(r.value, rc, cbpath)
        if info.has_desc:
            raise _code_error(_lib.E_INVALID_ARG, "not a codebook file (it holds a cache "
                              "descriptor: an archive? see fkvf.train)", cbpath)
        sh, contents, size = _Shape(), c_void_p(), c_size_t()
        h = (c_uint8 * 16)()
        rc = lib.fkvf_reader_codebook(r, byref(sh), byref(contents), byref(size), h)
        if rc != _lib.OK:
            raise _reader_error(r.value, _lib.E_CODEBOOK if rc == _lib.E_NOT_FOUND else rc,
                                cbpath, "no codebook: ")
        if (sh.n_layers, sh.key_dim, sh.value_dim) != (shape.n_layers, shape.key_dim,
                                                       shape.value_dim) or \
                (not sh.pooled and sh.n_heads != shape.n_kv_heads):
            raise _code_error(
                _lib.E_CODEBOOK, f"codebook shape {sh.n_layers} layers x {sh.n_heads} heads, "
                f"dims {sh.key_dim}/{sh.value_dim} does not fit the cache ({shape.n_layers} "
                f"layers x {shape.n_kv_heads} heads, dims {shape.key_dim}/{shape.value_dim})",
                cbpath)
        keys.from_codebook(r.value, cbpath, shape.key_dim)
        rc = lib.fkvf_rvq_from_tables(byref(q), byref(sh), shape.n_kv_heads,
                                      contents.value + 64, size.value - 64, None)
        if rc != _lib.OK:
            raise _code_error(rc, "cannot load the codebook tables", cbpath)
        return r.value, q.value, sh, bytes(h)
    except BaseException:
        lib.fkvf_rvq_free(q)
        lib.fkvf_reader_free(r)
        raise


# ---- fkvf.pack ----------------------------------------------------------------------

def pack(cache: Any, path: PathLike, *, codebooks: Optional[PathLike] = None,
         k: Optional[int] = None, k_stages: int = 4, v_stages: int = 2, seed: int = 0,
         iters: int = 25, f32_tables: bool = False, sinks: int = 4, recent: int = 32,
         keys: Optional[str] = None, rope: Any = None, layout: Optional[str] = None,
         dtype: Any = None, tokens: Any = None, codec: str = "quad", beam: int = 1,
         deflate: bool = False, model_id: str = "", tokenizer_id: str = "",
         metadata: Optional[Dict[str, Any]] = None, overwrite: bool = False
         ) -> Dict[str, Any]:
    """Archive a KV cache at path, as ``fkvf pack CACHE -o PATH`` does.

    The first min(sinks, T) and the last `recent` positions are stored exact, those
    between as per-head RVQ indices. Without `codebooks` a codebook is trained on this
    cache's rows (k, k_stages, v_stages, seed, iters, f32_tables) and embedded; k None is
    the automatic k (fkvf_codebook_auto_k), and when even k = 16 would cost more than the
    rows it encodes (fkvf_codebook_pays) every position is stored exact. With
    ``codebooks=FILE`` (from fkvf.train or ``fkvf train``) the archive refers to that file
    by content hash; its shape must fit and its train.* key settings are used (a given
    `keys` / `rope` setting that contradicts them is a CodebookError).

    cache: anything fkvf._cache takes ((K, V) of [L, H, T, D], per-layer (k, v) pairs,
    DynamicCache-like; NumPy, torch, DLPack; `layout` "hnd" or "nhd"; `dtype` the archive's
    element type, default the input's). keys: "pre-rope" (default: archive keys
    un-rotated) or "as-is". rope: None (theta 10000 on every key dim, half-split pairs for
    per-layer pairs and DynamicCache-like caches, else interleaved), a dict or
    fkvf.Rope(theta, dims, layout), or False (keys not rotated). tokens: one id per
    position. metadata: extra {str: str | int | float | bool | bytes} entries.
    An existing path is refused (fkvf.ExistsError) unless overwrite=True; the codebooks
    file is never replaced. Returns what ``fkvf pack --json`` prints, as a dict.
    """
    path = _path_arg("path", path)
    cbpath = _path_arg("codebooks", codebooks) if codebooks is not None else None
    kk = _k_arg(k) if k is not None else None
    ks, vs = _check_stages(k_stages, v_stages)
    seed = _int_arg("seed", seed, 0, 2**64 - 1, "0..2**64-1")
    iters = _int_arg("iters", iters, 1, 100000, "1..100000")
    S_opt = _int_arg("sinks", sinks, 0, 2**32 - 1, "a count 0..2**32-1")
    W_opt = _int_arg("recent", recent, 0, 2**32 - 1, "a count 0..2**32-1")
    beam = _int_arg("beam", beam, 1, _MAX_BEAM, f"1..{_MAX_BEAM}")
    ngon = _choice("codec", codec, ("quad", "ngon")) == "ngon"
    for name, s in (("model_id", model_id), ("tokenizer_id", tokenizer_id)):
        if not isinstance(s, str):
            raise TypeError(f"{name}: a {type(s).__name__}, expected a str")
    meta = _meta_items(metadata)
    kopts = _KeyOpts(keys, rope)
    lay = _cache.check_layout(layout)
    rows, shape, code, hf = _rows_of(cache, layout, dtype, "cache")
    tok = _cache.tokens_array(tokens, shape.n_positions)
    if cbpath is not None:
        _check_not_input(path, cbpath, "codebooks file")
        if k is not None or f32_tables:
            warnings.warn(f"{'k' if k is not None else 'f32_tables'} is an option of "
                          f"training, ignored: the codebooks file {cbpath} has its own k, "
                          "stages and tables", stacklevel=2)
    P = shape.n_positions
    S = min(S_opt, P)
    W = min(W_opt, P - S)
    A = P - S - W
    S_policy = S
    rb = rows.shape[1] * rows.itemsize
    handles: Dict[str, int] = {}
    try:
        cbhash = None
        if cbpath is not None:
            handles["cbr"], handles["q"], cbshape, cbhash = _load_codebook(cbpath, shape, kopts)
        kopts.hf_default(hf)
        rope_c, un_rotated = kopts.rope_for(shape.key_dim)
        krope = rope_c if un_rotated else None
        # the writer first: an existing path is refused before any work
        wo = _WriterOptions()
        lib.fkvf_writer_options_init(byref(wo))
        if cbpath is not None:
            wo.required_features |= _FEAT_EXTERNAL_CODEBOOK
        if (A > 0 or cbpath is not None) and ngon:
            wo.required_features |= _FEAT_NGON
        if deflate:
            wo.required_features |= _FEAT_DEFLATE
        if tok is not None:
            wo.optional_features |= _OPTFEAT_TOKEN_STREAM
        wo.no_replace = 0 if overwrite else 1
        handles["w"] = w = _create_writer(path, wo)
        if cbpath is None and A > 0:
            if kk is None:
                kk = lib.fkvf_codebook_auto_k(byref(_shape(shape, 16, ks, vs, f32_tables,
                                                           False)), shape.n_kv_heads, A)
                if not kk:
                    kk = 16
                    sh16 = _shape(shape, kk, ks, vs, f32_tables, False)
                    if not lib.fkvf_codebook_pays(byref(sh16), shape.n_kv_heads, A, rb, None):
                        S, W, A = P, 0, 0  # every position exact, no codebook
                    else:
                        warnings.warn(
                            f"{path}: {A} archived positions: even k = 16 gives a codebook "
                            f"of {lib.fkvf_codebook_size(byref(sh16))} bytes, more than 1/4 "
                            f"of the {A * shape.row_elems() * 2} fp16 bytes of those rows; for "
                            "small caches a shared codebook compresses better (fkvf.train "
                            "once, then fkvf.pack(..., codebooks=FILE))", stacklevel=2)
            if A > 0:
                handles["q"] = _train_q([(rows, code)], shape, kk, ks, vs, f32_tables, False,
                                        seed, iters, krope, path)
                cbshape = _Shape()
                lib.fkvf_rvq_shape(handles["q"], byref(cbshape), byref(c_uint32()))
        codes = None
        if A > 0:
            q = handles["q"]
            ncodes = lib.fkvf_rvq_codes_per_position(q)
            codes = np.empty((ncodes, A), dtype=np.uint16)  # one array per index stream
            for i in range(0, A, _ENCODE_CHUNK):
                n = min(_ENCODE_CHUNK, A - i)
                part = _Rows(rows.ctypes.data + (S + i) * rb, n, code, S + i)
                rc = lib.fkvf_rvq_encode(q, byref(part), byref(krope) if krope else None,
                                         beam, codes.ctypes.data + 2 * i, 1, A)
                if rc != _lib.OK:
                    raise _code_error(rc, "encoding failed", path)
        stage = "descriptor"
        d = _lib.Desc()
        d.n_layers, d.n_kv_heads = shape.n_layers, shape.n_kv_heads
        d.key_dim, d.value_dim, d.dtype = shape.key_dim, shape.value_dim, code
        if not kopts.no_rope:
            d.key_transform, d.rope_layout = 1, rope_c.layout
            d.rope_dims, d.rope_theta = rope_c.rope_dims, rope_c.theta
            d.key_storage = 1 if krope is not None else 0
        d.n_sinks = S_policy
        d.window = W_opt
        d.model_id = model_id.encode() if model_id else None
        d.tokenizer_id = tokenizer_id.encode() if tokenizer_id else None
        rc = lib.fkvf_writer_set_desc(w, byref(d))
        if rc == _lib.OK:
            stage = "metadata"
            entries: List[Tuple[str, Any]] = [("pack.tool", f"fkvf-python {_lib.version()}"),
                                              ("pack.layout", lay)]
            if hf:
                entries.append(("pack.names", "hf"))
            if A > 0:
                entries.append(("pack.beam", beam))
                if cbpath is None:
                    entries.append(("pack.seed", seed))
                else:
                    entries.append(("pack.codebooks", os.path.basename(cbpath)))
            for key, v in entries + meta:
                rc = _write_meta(w, key, v)
                if rc != _lib.OK:
                    stage = f"metadata entry {key!r}"
                    break
        xflags = _SECTION_DEFLATE if deflate else 0
        if rc == _lib.OK and S > 0:
            stage = "exact rows"
            rc = lib.fkvf_writer_add_exact(w, 0, S, rows.ctypes.data, S * rb, xflags)
        if rc == _lib.OK and W > 0:
            stage = "exact rows"
            rc = lib.fkvf_writer_add_exact(w, S + A, W, rows.ctypes.data + (S + A) * rb,
                                           W * rb, xflags)
        if rc == _lib.OK and (A > 0 or cbpath is not None):
            stage = "codebooks"
            if cbpath is not None:
                rc = lib.fkvf_writer_add_codebook_ref(
                    w, byref(cbshape), (c_uint8 * 16)(*cbhash),
                    os.path.basename(cbpath).encode())
            else:
                t = _tables(handles["q"])
                rc = lib.fkvf_writer_add_codebooks(w, byref(cbshape), t.ctypes.data, t.size, 0)
            if rc == _lib.OK:
                stage = "index streams"
                sp = _StreamSpec()
                if ngon:
                    sp.profile, sp.alphabet = _PROFILE_NGON, cbshape.k
                else:
                    sp.profile = _PROFILE_QUAD
                    sp.symbol_bits = lib.fkvf_quad_bits_for(cbshape.k - 1)
                if codes is None:
                    codes = np.empty((1, 0), dtype=np.uint16)
                rc = lib.fkvf_writer_add_index_segment(w, byref(sp), 0, A, codes.ctypes.data,
                                                       1, A)
        if rc == _lib.OK and tok is not None:
            stage = "token stream"
            sp = _StreamSpec()
            sp.profile = _PROFILE_QUAD
            sp.symbol_bits = lib.fkvf_quad_bits_for(int(tok.max()) if tok.size else 0)
            rc = lib.fkvf_writer_add_token_segment(w, byref(sp), 0, tok.ctypes.data, tok.size)
        if rc == _lib.OK:
            stage = "commit"
            rc = lib.fkvf_writer_set_positions(w, P, A)
        if rc == _lib.OK:
            rc = lib.fkvf_writer_finish(w)
        if rc != _lib.OK:
            raise _writer_error(w, rc, path, stage)
        k_out = cbshape.k if (A > 0 or cbpath is not None) else 0
        cbb = lib.fkvf_codebook_size(byref(cbshape)) if A > 0 and cbpath is None else 0
    finally:
        lib.fkvf_writer_free(handles.get("w"))
        lib.fkvf_rvq_free(handles.get("q"))
        lib.fkvf_reader_free(handles.get("cbr"))
    return _pack_result(path, cbpath, P, A, shape, cbb, k_out)


def _pack_result(path: str, cbpath: Optional[str], P: int, A: int, shape: "_cache.Shape",
                 cbb: int, k: int) -> Dict[str, Any]:
    """What fkvf pack --json prints (pack_print), without "cache" (no input file)."""
    size = os.path.getsize(path)
    fp16 = float(P * shape.row_elems() * 2)
    fb = os.path.getsize(cbpath) if cbpath else 0
    if cbpath:
        r_with, r_without = fp16 / (size + fb), (fp16 / size if size else 0.0)
    elif cbb and cbb < size:
        r_with, r_without = fp16 / size, fp16 / (size - cbb)
    else:
        r_with = r_without = fp16 / size if size else 0.0
    return {"archive": path, "positions": P, "exact": P - A, "archived": A, "bytes": size,
            "fp16_bytes": int(fp16), "codebook_bytes": fb if cbpath else cbb, "k": k,
            "codebooks": {"external": cbpath} if cbpath else ("embedded" if A > 0 else None),
            "ratio_fp16": fp16 / size if size else 0.0, "ratio_fp16_with_codebook": r_with,
            "ratio_fp16_without_codebook": r_without, "indexed": False}


# ---- fkvf.train ---------------------------------------------------------------------

def _is_cache_list(caches: Any) -> bool:
    """A list of caches (not one cache): a list whose items are each a cache other than
    one layer's (k, v) pair: DynamicCache-like objects, sequences of per-layer pairs, or
    (K, V) pairs of 4-D [L, ...] arrays with L > 1."""
    if not isinstance(caches, list) or not caches:
        return False
    for c in caches:
        if hasattr(c, "key_cache") or hasattr(c, "layers") or hasattr(c, "to_legacy_cache"):
            continue
        if not isinstance(c, (list, tuple)) or len(c) < 2:
            return False
        first = c[0]
        if isinstance(first, (list, tuple)):
            continue  # a cache of per-layer pairs
        shp = getattr(first, "shape", None)
        if shp is None or len(shp) != 4 or shp[0] == 1:
            return False  # one layer's (k, v) pair: caches is one cache
    return True


def train(caches: Any, path: PathLike, *, k: int = 256, k_stages: int = 4, v_stages: int = 2,
          seed: int = 0, iters: int = 25, f32_tables: bool = False, pooled: bool = False,
          keys: Optional[str] = None, rope: Any = None, layout: Optional[str] = None,
          dtype: Any = None, overwrite: bool = False) -> Dict[str, Any]:
    """Train per-head RVQ codebooks on one or more caches of one shape and write a codebook
    file at path, as ``fkvf train CACHE... -o PATH`` does (the same train.* metadata, so
    ``fkvf pack --codebooks PATH`` and fkvf.pack(codebooks=PATH) take it).

    caches: one cache (any form fkvf.pack takes) or a list of caches (a list whose items
    are caches: (K, V) pairs of [L, H, T, D] arrays with L > 1, lists of per-layer pairs,
    DynamicCache-like objects; a list of per-layer (k, v) pairs is one cache). keys / rope
    as fkvf.pack (half-split pairs when every cache is per-layer pairs or DynamicCache-
    like). pooled: one table set per layer shared by all heads. An existing path is
    refused (fkvf.ExistsError) unless overwrite=True. Returns what ``fkvf train --json``
    prints (without "caches": the number of caches is "n_caches").
    """
    path = _path_arg("path", path)
    kk = _k_arg(k)
    ks, vs = _check_stages(k_stages, v_stages)
    seed = _int_arg("seed", seed, 0, 2**64 - 1, "0..2**64-1")
    iters = _int_arg("iters", iters, 1, 100000, "1..100000")
    kopts = _KeyOpts(keys, rope)
    _cache.check_layout(layout)
    items = caches if _is_cache_list(caches) else [caches]
    blocks: List[Tuple[np.ndarray, int]] = []
    shapes, all_hf = [], True
    for i, c in enumerate(items):
        what = f"caches[{i}]" if items is caches else "cache"
        rows, sh, code, hf = _rows_of(c, layout, dtype, what)
        if shapes and (sh.n_layers, sh.n_kv_heads, sh.key_dim, sh.value_dim) != \
                (shapes[0].n_layers, shapes[0].n_kv_heads, shapes[0].key_dim,
                 shapes[0].value_dim):
            s0 = shapes[0]
            raise ValueError(f"{what}: shape {sh.n_layers} layers x {sh.n_kv_heads} heads, "
                             f"dims {sh.key_dim}/{sh.value_dim} differs from caches[0]'s "
                             f"({s0.n_layers} x {s0.n_kv_heads}, {s0.key_dim}/{s0.value_dim})")
        shapes.append(sh)
        blocks.append((rows, code))
        all_hf &= hf
    shape = shapes[0]
    kopts.hf_default(all_hf)
    rope_c, un_rotated = kopts.rope_for(shape.key_dim)
    wo = _WriterOptions()
    lib.fkvf_writer_options_init(byref(wo))
    wo.no_replace = 0 if overwrite else 1
    w = _create_writer(path, wo)
    q = r = None
    try:
        q = _train_q(blocks, shape, kk, ks, vs, f32_tables, bool(pooled), seed, iters,
                     rope_c if un_rotated else None, path)
        cbshape = _Shape()
        lib.fkvf_rvq_shape(q, byref(cbshape), byref(c_uint32()))
        t = _tables(q)
        entries: List[Tuple[str, Any]] = [("train.keys", "pre-rope" if un_rotated else "as-is")]
        if un_rotated:
            entries += [("train.rope_theta", float(rope_c.theta)),
                        ("train.rope_dims", int(rope_c.rope_dims)),
                        ("train.rope_layout", "interleaved" if rope_c.layout == 1
                         else "half-split")]
        entries += [("train.seed", seed), ("train.caches", len(items))]
        rc, stage = _lib.OK, "metadata"
        for key, v in entries:
            rc = _write_meta(w, key, v)
            if rc != _lib.OK:
                break
        if rc == _lib.OK:
            stage = "codebooks"
            rc = lib.fkvf_writer_add_codebooks(w, byref(cbshape), t.ctypes.data, t.size, 0)
        if rc == _lib.OK:
            stage = "commit"
            rc = lib.fkvf_writer_finish(w)
        if rc != _lib.OK:
            raise _writer_error(w, rc, path, stage)
        rr = _R()
        h = (c_uint8 * 16)()
        rc = lib.fkvf_reader_open_file(byref(rr), path.encode(), 0, None)
        r = rr.value
        if rc == _lib.OK:
            rc = lib.fkvf_reader_codebook(rr, None, None, None, h)
        if rc != _lib.OK:
            raise _reader_error(r, rc, path, "cannot read back: ")
    finally:
        lib.fkvf_writer_free(w)
        lib.fkvf_rvq_free(q)
        lib.fkvf_reader_free(r)
    return {"out": path, "n_caches": len(items), "layers": cbshape.n_layers,
            "heads": 1 if cbshape.pooled else cbshape.n_heads, "pooled": bool(cbshape.pooled),
            "k": cbshape.k, "k_stages": cbshape.k_stages, "v_stages": cbshape.v_stages,
            "dtype": "f32" if cbshape.dtype == _lib.DTYPE_F32 else "f16",
            "bytes": os.path.getsize(path), "content_hash": bytes(h).hex()}
