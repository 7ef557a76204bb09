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
import os
import warnings
from ctypes import POINTER, byref, c_uint8, c_uint32
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _cache, _lib
from ._lib import lib
from ._codebook import CodebookFile
from ._keys import KeyOpts as _KeyOpts
from ._keys import threads_arg as _threads_arg
from ._keys import choice as _choice, int_arg as _int_arg, path_arg as _path_arg, \
    str_arg as _str_arg
from .errors import FkvfError, from_code, from_handle

PathLike = Union[str, "os.PathLike[str]"]

_Shape = _lib.CodebookShape
_Rope = _lib.Rope
_Rows = _lib.Rows
_RvqParams = _lib.RvqParams
_WriterOptions = _lib.WriterOptions
_StreamSpec = _lib.StreamSpec
_W, _Q, _R = _lib.Writer, _lib.Rvq, _lib.Reader
_FEAT_NGON, _FEAT_DEFLATE = _lib.FEAT_NGON, _lib.FEAT_DEFLATE
_FEAT_EXTERNAL_CODEBOOK = _lib.FEAT_EXTERNAL_CODEBOOK
_FEAT_LAYER_STAGES = _lib.FEAT_LAYER_STAGES
_OPTFEAT_TOKEN_STREAM = _lib.OPTFEAT_TOKEN_STREAM
_OPTFEAT_ENCODER_METRIC = _lib.OPTFEAT_ENCODER_METRIC
_SECTION_DEFLATE = _lib.SECTION_DEFLATE
_PROFILE_QUAD, _PROFILE_NGON = _lib.PROFILE_QUAD, _lib.PROFILE_NGON
_MAX_BEAM = 64
_ENCODE_CHUNK = 256  # rows per fkvf_rvq_encode call and thread, as fkvf pack


# ---- errors ---------------------------------------------------------------------

_code_error = from_code


def _writer_error(w: Optional[int], code: int, path: str, stage: str = "") -> FkvfError:
    return from_handle(lib.fkvf_writer_error, w, code, path,
                       f"writing the {stage} failed: " if stage else "")


def _reader_error(r: Optional[int], code: int, path: str, prefix: str = "") -> FkvfError:
    return from_handle(lib.fkvf_reader_error, r, code, path, prefix)


# ---- arguments --------------------------------------------------------------------

def _k_arg(k: Any) -> int:
    k = _int_arg("k", k, 16, 4096, "a power of two from 16 to 4096")
    if k & (k - 1):
        raise ValueError(f"k: {k} is not a power of two from 16 to 4096")
    return k


def _check_stages(k_stages: Any, v_stages: Any) -> Tuple[int, int]:
    ks = _int_arg("k_stages", k_stages, 0, 16, "a stage count 0..16")
    vs = _int_arg("v_stages", v_stages, 0, 16, "a stage count 0..16")
    if ks + vs == 0:
        raise ValueError("k_stages and v_stages: both 0; a codebook needs a stage")
    return ks, vs


def _layer_stages_arg(layer_stages: Any, n_layers: int, ks: int, vs: int
                      ) -> Tuple[int, int, Any]:
    """k_stages, v_stages and the C layer table (spec 13.1, format 1.1) of a layer_stages
    argument: None (the uniform ks, vs), or one (key stages, value stages) pair per layer.
    Pairs all equal are the uniform codebook (no table); else the counts are the maxima."""
    if layer_stages is None:
        return ks, vs, None
    pairs = list(layer_stages)
    if len(pairs) != n_layers:
        raise ValueError(f"layer_stages: {len(pairs)} pairs, the cache has {n_layers} layers")
    flat: List[int] = []
    for i, p in enumerate(pairs):
        if not isinstance(p, (tuple, list)) or len(p) != 2:
            raise ValueError(f"layer_stages[{i}]: not a (key stages, value stages) pair")
        flat += [_int_arg(f"layer_stages[{i}][0]", p[0], 0, 16, "a stage count 0..16"),
                 _int_arg(f"layer_stages[{i}][1]", p[1], 0, 16, "a stage count 0..16")]
    mk, mv = max(flat[0::2]), max(flat[1::2])
    if mk + mv == 0:
        raise ValueError("layer_stages: no stage in any layer; a codebook needs a stage")
    if all(flat[2 * i] == flat[0] and flat[2 * i + 1] == flat[1] for i in range(n_layers)):
        return flat[0], flat[1], None
    return mk, mv, (c_uint8 * len(flat))(*flat)


def _metric_arg(name: str, m: Any, n_layers: int, n_heads: int, pooled: bool, dim: int,
                dim_name: str) -> Optional[np.ndarray]:
    """A key_metric / value_metric argument of fkvf.train as the C layout (spec 13.8,
    fkvf_rvq_metric): None, or contiguous float32 [n_layers, n_heads, dim, dim] (n_heads
    the codebook's: 1 when pooled, where [n_layers, dim, dim] is taken too). Its shape is
    checked here, and each matrix (after the rounding to float32) by the library's one
    rule (fkvf_metric_matrix_check: its symmetric part finite and positive definite),
    naming the first that fails."""
    if m is None:
        return None
    try:
        a = np.asarray(m)
    except Exception as e:  # an object NumPy cannot take (a CUDA tensor, ...)
        raise TypeError(f"{name}: a {type(m).__name__}, expected an array of "
                        f"[n_layers, n_heads, {dim_name}, {dim_name}] matrices ({e})") from None
    if a.dtype.kind not in "iuf":
        raise TypeError(f"{name}: dtype {a.dtype}, expected real numbers")
    want = (n_layers, n_heads, dim, dim)
    if pooled and a.ndim == 3:
        a = a[:, None]
    if a.shape != want:
        heads = "1 (pooled)" if pooled else f"{n_heads} (the cache's KV heads)"
        alt = f" or ({n_layers}, {dim}, {dim})" if pooled else ""
        raise ValueError(f"{name}: shape {tuple(np.shape(m))}, expected {want}{alt}: one "
                         f"{dim_name} x {dim_name} matrix per layer and codebook head "
                         f"[n_layers, n_heads, {dim_name}, {dim_name}], n_heads {heads}")
    if dim > _lib.METRIC_DIM_MAX:
        raise ValueError(f"{name}: {dim_name} {dim} is above {_lib.METRIC_DIM_MAX}, the "
                         "largest dimension an encoder metric may have (spec 13.8)")
    with np.errstate(over="ignore"):
        a = np.ascontiguousarray(a, dtype=np.float32)
    bad = ctypes.c_size_t()
    for l in range(n_layers):
        for h in range(n_heads):
            v = lib.fkvf_metric_matrix_check(a[l, h].ctypes.data, dim, byref(bad))
            if v < 0:
                raise MemoryError(f"{name}: no memory to check the matrix [{l}, {h}]")
            if v > 0:
                i, j = divmod(bad.value, dim)
                what = (f"element ({i}, {j}) is {a[l, h, i, j]} and ({j}, {i}) "
                        f"{a[l, h, j, i]} (as float32): not finite"
                        if v == _lib.METRIC_NONFINITE else
                        f"not positive definite (the Cholesky pivot of column {j} is not "
                        "above zero)")
                raise ValueError(f"{name}[{l}, {h}]: {what}; a metric must be positive "
                                 "definite (its symmetric part (M + M^T) / 2 is taken; "
                                 "spec 13.8)")
    return a


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
        _str_arg(f"metadata key {key!r}", key)
        if isinstance(v, str):
            _str_arg(f"metadata[{key!r}]", v)
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
        return lib.fkvf_writer_meta_utf8(w, k, v.encode("utf-8"))
    b = bytes(v)
    return lib.fkvf_writer_meta_bytes(w, k, b, len(b))


def _shape(sh: "_cache.Shape", k: int, ks: int, vs: int, f32: bool, pooled: bool,
           lst: Any = None) -> _Shape:
    """The codebook shape (lst: a layer table from _layer_stages_arg, kept alive by the
    caller while the shape is used)."""
    out = _Shape(sh.n_layers, 1 if pooled else sh.n_kv_heads, sh.key_dim, sh.value_dim, k,
                 ks, vs, _lib.DTYPE_F32 if f32 else _lib.DTYPE_F16, int(pooled))
    if lst is not None:
        out.layer_stages = ctypes.cast(lst, POINTER(c_uint8))
    return out


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


# at least this many rows per centroid (fkvf.h FKVF_AUTO_K_ROWS_PER_K), else a codebook
# memorises its rows
_ROWS_PER_K = 4


def _warn_codebook(who: str, k: int, cb_bytes: int, fp16_bytes: int, n_rows: int,
                   per_table: int, noun: str, advice: str) -> None:
    """The CLI's warning about a codebook that will not serve other rows (tools/cli_codebook.c
    cli_warn_codebook): larger than the fp16 bytes of the rows it is for, or k above a
    quarter of the rows each table is trained on."""
    big, few = cb_bytes > fp16_bytes, k * _ROWS_PER_K > per_table
    if not big and not few:
        return
    if big:
        what = (f"the codebook (k = {k}, {cb_bytes} bytes) is {cb_bytes / max(fp16_bytes, 1):.1f}x "
                f"the {fp16_bytes} fp16 bytes of the {n_rows} {noun}"
                + (", and k is more than a quarter of them" if few else ""))
    else:
        what = (f"k = {k} is more than a quarter of the {per_table} {noun} (fewer than "
                f"{_ROWS_PER_K} per centroid: the codebook memorises them)")
    warnings.warn(f"{who}: {what}; {advice}", stacklevel=3)


def _train_q(blocks: List[Tuple[np.ndarray, int, int]], shape: "_cache.Shape", k: int, ks: int,
             vs: int, f32: bool, pooled: bool, seed: int, iters: int,
             krope: Optional[_Rope], path: str, lst: Any = None,
             metric: Optional[Tuple[Optional[np.ndarray], Optional[np.ndarray]]] = None,
             threads: int = 1) -> int:
    """Train an rvq on blocks of (rows, dtype code, first position) (metric: the (keys,
    values) matrices of _metric_arg, not
    both None, or None: Euclidean; a matrix the library refuses as not positive definite:
    a ValueError naming it)."""
    prm = _RvqParams()
    lib.fkvf_rvq_params_init(byref(prm))
    prm.n_layers, prm.n_kv_heads = shape.n_layers, shape.n_kv_heads
    prm.key_dim, prm.value_dim = shape.key_dim, shape.value_dim
    prm.k, prm.k_stages, prm.v_stages, prm.pooled = k, ks, vs, int(pooled)
    if lst is not None:
        prm.layer_stages = ctypes.cast(lst, POINTER(c_uint8))
    prm.table_dtype = _lib.DTYPE_F32 if f32 else _lib.DTYPE_F16
    prm.seed, prm.max_iters = seed, iters
    prm.n_threads = threads
    prm.key_rope = ctypes.pointer(krope) if krope is not None else None
    if metric is not None:
        prm.metric = ctypes.pointer(_metric_struct(*metric))
    arr = (_Rows * len(blocks))()
    for i, (rows, code, first) in enumerate(blocks):
        arr[i] = _Rows(rows.ctypes.data, rows.shape[0], code, first)
    q = _Q()
    rc = lib.fkvf_rvq_train(byref(q), byref(prm), arr, len(blocks), None)
    if rc != _lib.OK:
        lib.fkvf_rvq_free(q)
        raise _code_error(rc, "training failed", path)
    return q.value


SAMPLE_RUN = 64
_M64 = (1 << 64) - 1


def _max_train_arg(v: Optional[int]) -> int:
    """max_train_positions: None or 0 -> 0 (every position), else a count >= 64"""
    n = 0 if v is None else _int_arg("max_train_positions", v, 0, 2**64 - 2,
                                     "0 or a count >= 64")
    if 0 < n < SAMPLE_RUN:
        raise ValueError(f"max_train_positions: {n} is not 0 or a count >= 64 (a run)")
    return n


def _sample_runs(n_pos: List[int], max_pos: int, seed: int) -> List[Tuple[int, int, int]]:
    """The training sample of fkvf train --max-train-positions max_pos (docs/codebooks.md,
    "Training on a sample of positions"; tools/cli_sample.c): (input, first, n) runs of
    at most max_pos of the positions of inputs of n_pos positions, by seed."""
    if sum(n_pos) <= max_pos:
        return [(i, 0, n) for i, n in enumerate(n_pos) if n]
    runs = [(i, p, min(SAMPLE_RUN, n - p)) for i, n in enumerate(n_pos)
            for p in range(0, n, SAMPLE_RUN)]
    u, m = len(runs), max_pos // SAMPLE_RUN
    s, got, out = seed, 0, []  # type: ignore[var-annotated]
    for t, (i, p, n) in enumerate(runs):
        if got == m:
            break
        s = (s + 0x9E3779B97F4A7C15) & _M64  # splitmix64
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        if (z ^ (z >> 31)) % (u - t) >= m - got:
            continue
        got += 1
        if out and out[-1][0] == i and out[-1][1] + out[-1][2] == p:
            out[-1] = (i, out[-1][1], out[-1][2] + n)
        else:
            out.append((i, p, n))
    return out


def _metric_struct(keys: Optional[np.ndarray], values: Optional[np.ndarray]
                   ) -> "_lib.RvqMetric":
    """fkvf_rvq_metric over the arrays (the caller keeps them alive while it is used)."""
    fp = POINTER(ctypes.c_float)
    return _lib.RvqMetric(ctypes.cast(keys.ctypes.data, fp) if keys is not None else None,
                          ctypes.cast(values.ctypes.data, fp) if values is not None else None)


def _tables(q: int) -> np.ndarray:
    n = lib.fkvf_rvq_tables_size(q)
    t = np.empty(max(n, 1), dtype=np.uint8)
    rc = lib.fkvf_rvq_tables(q, t.ctypes.data, n)
    if rc != _lib.OK:
        raise _code_error(rc, "codebook tables", None)
    return t[:n]


def _load_codebook(cbpath: str, shape: "_cache.Shape", keys: _KeyOpts
                   ) -> Tuple[CodebookFile, int]:
    """The codebook file (fitting the cache, the key options settled by its training) and
    an rvq of its tables, under the file's encoder metric when it holds one. The caller
    closes the one and frees the other."""
    cb = CodebookFile(cbpath)
    q = _Q()
    try:
        cb.check_fit(shape.n_layers, shape.n_kv_heads, shape.key_dim, shape.value_dim)
        cb.settle_keys(keys)
        to = lib.fkvf_codebook_tables_offset(byref(cb.shape))  # after a layer table
        rc = lib.fkvf_rvq_from_tables(byref(q), byref(cb.shape), shape.n_kv_heads,
                                      cb.contents + to, cb.size - to, None)
        if rc != _lib.OK:
            raise _code_error(rc, "cannot load the codebook tables", cbpath)
        # the codebook's encoder metric (spec 13.8), if its file holds one: packing
        # encodes under it, as the C appender does (spec 13.8: encoders SHOULD)
        m = _lib.RvqMetric()
        rc = lib.fkvf_reader_metric(cb.handle, byref(m))
        if rc == _lib.OK:
            rc = lib.fkvf_rvq_set_metric(q, byref(m))
            if rc != _lib.OK:
                raise _code_error(rc, "the codebook's encoder metric cannot be used", cbpath)
        elif rc != _lib.E_NOT_FOUND:
            raise _reader_error(cb.handle, rc, cbpath, "the codebook's encoder metric: ")
        return cb, q.value
    except BaseException:
        lib.fkvf_rvq_free(q)
        cb.close()
        raise


# ---- fkvf.pack ----------------------------------------------------------------------

def pack(cache: Any, path: PathLike, *, codebooks: Optional[PathLike] = None,
         k: Optional[int] = None, k_stages: int = 4, v_stages: int = 2, seed: int = 0,
         iters: int = 25, f32_tables: bool = False, sinks: int = 4, recent: int = 32,
         keys: Optional[str] = None, rope: Any = None, layout: Optional[str] = None,
         dtype: Any = None, tokens: Any = None, codec: str = "quad", beam: int = 1,
         deflate: bool = False, model_id: str = "", tokenizer_id: str = "",
         metadata: Optional[Dict[str, Any]] = None, overwrite: bool = False,
         index: bool = True, layer_stages: Any = None,
         threads: Optional[int] = None,
         max_train_positions: Optional[int] = None) -> Dict[str, Any]:
    """Archive a KV cache at path, as ``fkvf pack CACHE -o PATH`` does.
    layer_stages: as fkvf.train, for the embedded codebook (``--layer-stages``).
    threads: threads of the training and the encoding (``--threads``): None is the
    environment's FKVF_THREADS, else every CPU the process may run on; the archive is the
    same for every count. max_train_positions: as fkvf.train, for the embedded codebook
    (``--max-train-positions N``; None or 0, the default: every position).

    The first min(sinks, T) and the last `recent` positions are stored exact, those
    between as per-head RVQ indices. Without `codebooks` a codebook is trained on this
    cache's rows (k, k_stages, v_stages, seed, iters, f32_tables) and embedded; k None is
    the automatic k (fkvf_codebook_auto_k), and when even k = 16 would cost more than the
    rows it encodes (fkvf_codebook_pays) every position is stored exact. With
    ``codebooks=FILE`` (from fkvf.train or ``fkvf train``) the archive refers to that file
    by content hash; its shape must fit and its train.* key settings are used (a given
    `keys` / `rope` setting that contradicts them is a CodebookError), and the archived
    positions are encoded under its encoder metric when it holds one (fkvf.train's
    key_metric / value_metric).

    cache: anything fkvf._cache takes ((K, V) of [L, H, T, D], per-layer (k, v) pairs,
    DynamicCache-like; NumPy, torch, DLPack; `layout` "hnd" or "nhd"; `dtype` the archive's
    element type, default the input's). keys: "pre-rope" (default: archive keys
    un-rotated) or "as-is". rope: None (theta 10000 on every key dim, half-split pairs for
    per-layer pairs and DynamicCache-like caches, else interleaved), a dict or
    fkvf.Rope(theta, dims, layout), or False (keys not rotated). tokens: one id per
    position. metadata: extra {str: str | int | float | bool | bytes} entries.
    An existing path is refused (fkvf.ExistsError) unless overwrite=True; the codebooks
    file is never replaced. index: with tokens, a second commit holds the token stream's
    search index (spec 20.7, 4 bytes per position), as ``fkvf pack`` writes by default;
    False is ``fkvf pack --no-index`` (one commit). Returns what ``fkvf pack --json``
    prints, as a dict.
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
    nthreads = _threads_arg(threads)
    max_pos = _max_train_arg(max_train_positions)
    ngon = _choice("codec", codec, ("quad", "ngon")) == "ngon"
    for name, s in (("model_id", model_id), ("tokenizer_id", tokenizer_id)):
        _str_arg(name, s)
    meta = _meta_items(metadata)
    kopts = _KeyOpts(keys, rope)
    lay = _cache.check_layout(layout)
    rows, shape, code, hf = _rows_of(cache, layout, dtype, "cache")
    ks, vs, lst = _layer_stages_arg(layer_stages, shape.n_layers, ks, vs)
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
    cb: Optional[CodebookFile] = None
    try:
        if cbpath is not None:
            cb, handles["q"] = _load_codebook(cbpath, shape, kopts)
            cbshape = cb.shape
        kopts.hf_default(hf)
        rope_c, un_rotated = kopts.rope_for(shape.key_dim)
        krope = rope_c if un_rotated else None
        # the writer first: an existing path is refused before any work
        wo = _WriterOptions()
        lib.fkvf_writer_options_init(byref(wo))
        if cbpath is not None:
            wo.required_features |= _FEAT_EXTERNAL_CODEBOOK
            if cb is not None and cb.shape.layer_stages:
                wo.required_features |= _FEAT_LAYER_STAGES
        elif A > 0 and lst is not None:
            wo.required_features |= _FEAT_LAYER_STAGES
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
                                                           False, lst)), shape.n_kv_heads, A)
                if not kk:
                    kk = 16
                    sh16 = _shape(shape, kk, ks, vs, f32_tables, False, lst)
                    if not lib.fkvf_codebook_pays(byref(sh16), shape.n_kv_heads, A, rb, None):
                        warnings.warn(
                            f"{path}: {A} archived positions are too few for an embedded "
                            f"codebook (k = 16: {lib.fkvf_codebook_size(byref(sh16))} codebook "
                            f"bytes and the indices take at least the {A * rb} bytes of the "
                            "rows): every position stored exact, no codebook, and every "
                            "position an Appender adds later is stored exact too; k=N forces "
                            "a codebook; for small caches a shared codebook compresses "
                            "better (fkvf.train once, then fkvf.pack(..., codebooks=FILE))",
                            stacklevel=2)
                        S, W, A = P, 0, 0  # every position exact, no codebook
                    else:
                        warnings.warn(
                            f"{path}: {A} archived positions: even k = 16 gives a codebook "
                            f"of {lib.fkvf_codebook_size(byref(sh16))} bytes, more than 1/4 "
                            f"of the {A * shape.row_elems() * 2} fp16 bytes of those rows; for "
                            "small caches a shared codebook compresses better (fkvf.train "
                            "once, then fkvf.pack(..., codebooks=FILE))", stacklevel=2)
            elif k is not None:
                _warn_codebook(path, kk, lib.fkvf_codebook_size(byref(_shape(
                    shape, kk, ks, vs, f32_tables, False, lst))), A * shape.row_elems() * 2, A, A,
                    "archived rows it encodes", "for small caches a shared codebook "
                    "compresses better (fkvf.train once, then fkvf.pack(..., codebooks=FILE))")
            if A > 0:
                blocks = [(rows[p:p + n], code, p)
                          for _, p, n in _sample_runs([P], max_pos or 2**64 - 1, seed)]
                handles["q"] = _train_q(blocks, shape, kk, ks, vs, f32_tables, False,
                                        seed, iters, krope, path, lst, threads=nthreads)
                cbshape = _Shape()
                lib.fkvf_rvq_shape(handles["q"], byref(cbshape), byref(c_uint32()))
        codes = None
        if A > 0:
            q = handles["q"]
            ncodes = lib.fkvf_rvq_codes_per_position(q)
            codes = np.empty((ncodes, A), dtype=np.uint16)  # one array per index stream
            lib.fkvf_rvq_set_threads(q, nthreads)
            chunk = _ENCODE_CHUNK * nthreads  # each thread encodes a range of a call's rows
            for i in range(0, A, chunk):
                n = min(chunk, A - i)
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
                    w, byref(cbshape), (c_uint8 * 16)(*cb.content_hash),
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
        if cb is not None:
            cb.close()
    indexed = bool(index) and tok is not None and _index_tokens(path)
    return _pack_result(path, cbpath, P, A, shape, cbb, k_out, indexed)


def _index_tokens(path: str) -> bool:
    """The token stream's search index appended to the archive at path in one commit, as
    ``fkvf pack`` does (fkvf_search_index_build, fkvf_archive_append_sections with
    SYNC_COMMIT): True when one was written (False: no token stream, or shorter than its
    alignment unit)."""
    r = _lib.Reader()
    rc = lib.fkvf_reader_open_file(byref(r), os.fsencode(path), 0, None)
    data = ctypes.c_void_p()
    try:
        if rc != _lib.OK:
            raise from_handle(lib.fkvf_reader_error, r.value, rc, path)
        si = ctypes.c_size_t()
        if lib.fkvf_reader_stream_find(r, _lib.STREAM_ID_TOKENS, byref(si)) != _lib.OK:
            return False
        info = _lib.StreamInfo()
        rc = lib.fkvf_reader_stream_info(r, si, byref(info))
        if rc == _lib.OK and info.length < max(info.align, 1):
            return False
        size, key = ctypes.c_size_t(), ctypes.c_uint64()
        if rc == _lib.OK:
            rc = lib.fkvf_search_index_build(r, si, byref(data), byref(size), byref(key), None)
        if rc != _lib.OK:
            raise from_handle(lib.fkvf_reader_error, r.value, rc, path)
        lib.fkvf_reader_free(r)
        r = _lib.Reader()
        sec = _lib.SectionAdd(_lib.SECTION_ZPOS, 0, key.value, data.value, size.value)
        op = _lib.ArchiveOp()
        try:
            rc = lib.fkvf_archive_append_sections(byref(op), os.fsencode(path), byref(sec), 1,
                                                  _lib.SYNC_COMMIT)
            if rc != _lib.OK:
                raise from_handle(lib.fkvf_archive_op_error, op.value, rc, path)
        finally:
            lib.fkvf_archive_op_free(op)
        return True
    finally:
        lib.fkvf_search_buffer_free(data, None)
        lib.fkvf_reader_free(r)


def _pack_result(path: str, cbpath: Optional[str], P: int, A: int, shape: "_cache.Shape",
                 cbb: int, k: int, indexed: bool = False) -> Dict[str, Any]:
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
            "ratio_fp16_without_codebook": r_without, "indexed": indexed}


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
          dtype: Any = None, overwrite: bool = False,
          layer_stages: Any = None, key_metric: Any = None,
          value_metric: Any = None, threads: Optional[int] = None,
          max_train_positions: Optional[int] = None) -> Dict[str, Any]:
    """Train per-head RVQ codebooks on one or more caches of one shape and write a codebook
    file at path, as ``fkvf train CACHE... -o PATH`` does (the same train.* metadata, so
    ``fkvf pack --codebooks PATH`` and fkvf.pack(codebooks=PATH) take it).

    caches: one cache (any form fkvf.pack takes) or a list of caches (a list whose items
    are caches: (K, V) pairs of [L, H, T, D] arrays with L > 1, lists of per-layer pairs,
    DynamicCache-like objects; a list of per-layer (k, v) pairs is one cache). keys / rope
    as fkvf.pack (half-split pairs when every cache is per-layer pairs or DynamicCache-
    like). threads: as fkvf.pack (the codebook is the same for every count).
    max_train_positions: None (default) or 0: every position (the arrays are in memory
    already); an int >= 64: at most that many, as ``fkvf train --max-train-positions N``
    (the same sample, so the same codebook as the command for the same caches: runs of
    64 consecutive positions chosen by seed when the caches hold more; docs/codebooks.md;
    the command's default budget is 1 GiB of rows). pooled: one
    table set per layer shared by all heads. layer_stages: one (key
    stages, value stages) pair per layer instead of k_stages / v_stages, as ``fkvf train
    --layer-stages`` (format 1.1: FKVF 1.0 readers refuse the file; pairs all equal give
    the uniform codebook).

    key_metric, value_metric: train, and have every later encoder encode, under an
    encoder metric (spec 13.8, an optional section of FKVF 1.2 that older readers skip;
    docs/codebooks.md): the codebook minimises
    e^T M e instead of e^T e for a vector's error e. Each an array-like of shape
    [n_layers, n_heads, dim, dim] (n_heads: the cache's KV heads, 1 when pooled, where
    [n_layers, dim, dim] is taken too; dim: key_dim or value_dim, at most 1024) of
    positive definite matrices, converted to float32 (each taken as its symmetric part
    (M + M^T) / 2, all that e^T M e depends on): for keys typically the
    second moment of the queries that read the KV head (query-aware; in the frame of the
    stored keys, un-rotated with keys="pre-rope"), for values W_o^T W_o over the query
    heads that read it (output-aware). None (default): that part Euclidean. The file
    holds the matrices (a CMET section, the optional feature ENCODER_METRIC); packing
    against it (fkvf.pack(codebooks=), an Appender) encodes under them, decoding is
    unchanged. A wrong shape, a non-finite value, a matrix whose symmetric part is not
    positive definite: ValueError naming it.

    An existing path is refused (fkvf.ExistsError) unless overwrite=True. Returns what
    ``fkvf train --json`` prints (without "caches": the number of caches is "n_caches";
    "metric": None, "keys", "values" or "keys+values").
    """
    path = _path_arg("path", path)
    kk = _k_arg(k)
    ks, vs = _check_stages(k_stages, v_stages)
    seed = _int_arg("seed", seed, 0, 2**64 - 1, "0..2**64-1")
    iters = _int_arg("iters", iters, 1, 100000, "1..100000")
    nthreads = _threads_arg(threads)
    max_pos = _max_train_arg(max_train_positions)
    kopts = _KeyOpts(keys, rope)
    _cache.check_layout(layout)
    items = caches if _is_cache_list(caches) else [caches]
    blocks: List[Tuple[np.ndarray, int, int]] = []
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
        blocks.append((rows, code, 0))
        all_hf &= hf
    if max_pos:
        runs = _sample_runs([int(b[0].shape[0]) for b in blocks], max_pos, seed)
        blocks = [(blocks[i][0][p:p + n], blocks[i][1], p) for i, p, n in runs]
    shape = shapes[0]
    ks, vs, lst = _layer_stages_arg(layer_stages, shape.n_layers, ks, vs)
    cb_heads = 1 if pooled else shape.n_kv_heads
    mk = _metric_arg("key_metric", key_metric, shape.n_layers, cb_heads, bool(pooled),
                     shape.key_dim, "key_dim")
    mv = _metric_arg("value_metric", value_metric, shape.n_layers, cb_heads, bool(pooled),
                     shape.value_dim, "value_dim")
    metric = (mk, mv) if mk is not None or mv is not None else None
    kopts.hf_default(all_hf)
    rope_c, un_rotated = kopts.rope_for(shape.key_dim)
    wo = _WriterOptions()
    lib.fkvf_writer_options_init(byref(wo))
    wo.no_replace = 0 if overwrite else 1
    if lst is not None:
        wo.required_features |= _FEAT_LAYER_STAGES
    if metric is not None:
        wo.optional_features |= _OPTFEAT_ENCODER_METRIC
    w = _create_writer(path, wo)
    q = r = None
    try:
        q = _train_q(blocks, shape, kk, ks, vs, f32_tables, bool(pooled), seed, iters,
                     rope_c if un_rotated else None, path, lst, metric, threads=nthreads)
        cbshape = _Shape()
        lib.fkvf_rvq_shape(q, byref(cbshape), byref(c_uint32()))
        # the layer table lives in q: copied before q is freed
        table = ([[cbshape.layer_stages[2 * i], cbshape.layer_stages[2 * i + 1]]
                  for i in range(cbshape.n_layers)] if cbshape.layer_stages else None)
        n_rows = sum(int(b[0].shape[0]) for b in blocks)
        _warn_codebook(path, kk, lib.fkvf_codebook_size(byref(cbshape)),
                       n_rows * shape.row_elems() * 2, n_rows,
                       n_rows * (shape.n_kv_heads if pooled else 1),
                       "training vectors (rows x heads: pooled)" if pooled else "training rows",
                       "train on more positions (several caches) or give a smaller k")
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
        qm = _lib.RvqMetric()
        if rc == _lib.OK and lib.fkvf_rvq_get_metric(q, byref(qm)):
            stage = "encoder metric"  # the matrices q trained under (spec 13.8)
            rc = lib.fkvf_writer_add_metric(w, byref(qm), 0)
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
            "layer_stages": table,
            "metric": None if metric is None else "+".join(
                n for n, m in zip(("keys", "values"), metric) if m is not None),
            "dtype": _cache.NAME_OF.get(cbshape.dtype, str(cbshape.dtype)),
            "bytes": os.path.getsize(path), "content_hash": bytes(h).hex()}
