"""Archive: a read-only FKVF archive opened through libfkvf (fkvf_reader_*)."""

from __future__ import annotations

import ctypes
import operator
import os
import threading
from ctypes import byref, c_char_p, c_int, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from ._lib import lib
from . import _cache
from ._keys import threads_arg
from .errors import FkvfError, from_handle, make

# at most this many contiguous runs of an index array are read one call each; more are read
# as the one range that covers them
_MAX_RUNS = 32
# ... and a span read at once holds at most this many times the positions asked for
_MAX_SPAN_FACTOR = 4

_SUBHDR = 64  # bytes of an EXAC header before its rows (spec 14.1)

PathLike = Union[str, bytes, "os.PathLike[str]"]
Selector = Union[None, int, slice, Sequence[int], np.ndarray]


def _error_from(handle: Optional[int], code: int, path: Optional[str]) -> FkvfError:
    """The error of a failed call on reader handle (errors.from_handle)."""
    return from_handle(lib.fkvf_reader_error, handle, code, path)


def _select(sel: Selector, n: int, what: str) -> Tuple[int, int, Optional[np.ndarray]]:
    """A selection of range(n) as (first, count, take): read [first, first+count) and then,
    when take is not None, keep the entries take (indices relative to first)."""
    if sel is None:
        return 0, n, None
    if isinstance(sel, slice):
        start, stop, step = sel.indices(n)
        if step == 1:
            return start, max(0, stop - start), None
        # the indices of range(n)[sel] (a step beyond int64 gives at most one index)
        sel = np.array(range(start, stop, step), dtype=np.int64)
    if isinstance(sel, (bool, np.bool_)):
        raise TypeError(f"{what}: a bool is not an index")
    if isinstance(sel, (int, np.integer)):
        i = int(sel)
        if not -n <= i < n:
            raise IndexError(f"{what} {i} out of range (0..{n - 1})")
        i %= n
        return i, 1, None
    arr = np.asarray(sel)
    if arr.dtype == bool:
        if arr.shape != (n,):
            raise IndexError(f"{what}: boolean mask of shape {arr.shape}, expected ({n},)")
        arr = np.flatnonzero(arr)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise IndexError(f"{what}: expected None, an int, a slice or a 1-D array of ints")
    # the range is checked before any cast: a uint64 index of 2**64 - 1 must
    # not wrap to -1 (the last position)
    if arr.size and (int(arr.min()) < -n or int(arr.max()) >= n):
        raise IndexError(f"{what}: index out of range (0..{n - 1})")
    arr = arr.astype(np.int64)
    arr = np.where(arr < 0, arr + n, arr)
    if arr.size == 0:
        return 0, 0, arr
    first = int(arr.min())
    count = int(arr.max()) - first + 1
    if count == arr.size and np.array_equal(arr, np.arange(first, first + count)):
        return first, count, None
    return first, count, arr - first


class _Reader:
    """The C handles of one open archive: the reader, the codebook file it borrows, the
    search handle on its token stream and the key search. The search handles go when the
    archive is closed; the reader (and the codebook file) when the archive is closed and no
    zero-copy view of the reader's mapping is alive any more, or when this object is
    collected."""

    def __init__(self, h: int) -> None:
        self._lock = threading.RLock()
        self.h: Optional[int] = h
        self.cb: Optional[int] = None
        self.search: Optional[int] = None
        self.key_search: Optional[int] = None
        self.archive_open = True
        self.views = 0        # live _Mapping objects
        self.freed = False    # the reader has been freed (the tests look)

    def _free_searches(self) -> None:
        s, self.search = self.search, None
        if s:
            lib.fkvf_search_free(s)
        ks, self.key_search = self.key_search, None
        if ks:
            lib.fkvf_search_keys_free(ks)

    def close(self) -> None:
        """The archive is closed: free the search handles now, the reader once no view is
        alive."""
        with self._lock:
            self._free_searches()
            self.archive_open = False
            if self.views == 0:
                self._free()

    def view_born(self) -> None:
        with self._lock:
            self.views += 1

    def view_died(self) -> None:
        with self._lock:
            self.views -= 1
            if self.views == 0 and not self.archive_open:
                self._free()

    def _free(self) -> None:
        with self._lock:
            h, cb = self.h, self.cb
            self.h = self.cb = None
            if h:
                lib.fkvf_reader_free(h)
            if cb:
                lib.fkvf_reader_free(cb)
            if h or cb:
                self.freed = True

    def __del__(self) -> None:
        try:
            self.archive_open = False
            self._free_searches()
            self._free()
        except Exception:
            pass


class _Mapping:
    """A read-only window [addr, addr + nbytes) of a reader's mapping (one EXAC section's
    bytes). NumPy arrays made from it keep it, and through it the reader, alive."""

    def __init__(self, owner: _Reader, addr: int, nbytes: int) -> None:
        self._owner = owner
        self.__array_interface__ = {"data": (addr, True), "shape": (nbytes,),
                                    "typestr": "|u1", "version": 3}
        owner.view_born()

    def __del__(self) -> None:
        try:
            self._owner.view_died()
        except Exception:
            pass


def _progression(sel: Tuple[int, int, Optional[np.ndarray]]) -> Optional[Tuple[int, int, int]]:
    """A selection of _select as (start, n, step >= 0) when it is an arithmetic progression
    (what strides can express), else None. Empty: None."""
    first, count, take = sel
    if take is None:
        return (first, count, 1) if count > 0 else None
    n = int(take.size)
    if n == 0:
        return None
    if n == 1:
        return first + int(take[0]), 1, 0
    step = int(take[1]) - int(take[0])
    if step < 0 or not np.array_equal(np.diff(take), np.full(n - 1, step)):
        return None
    return first + int(take[0]), n, step


def _to_torch(a: np.ndarray, dt: int) -> Any:
    """A torch tensor sharing a's memory (a writable array the caller owns); bf16 bits
    (uint16) become torch.bfloat16."""
    try:
        import torch
    except ImportError:
        raise ImportError("as_torch=True needs PyTorch (Debian's python3-torch)") from None
    if dt == _lib.DTYPE_BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


class Archive:
    """An FKVF archive opened for reading. Use as a context manager or call close()."""

    def __init__(self, path: PathLike, codebooks: Optional[PathLike] = None,
                 strict: bool = False, mmap: bool = True, threads: Optional[int] = None) -> None:
        self._h: Optional[int] = None
        self._cb: Optional[int] = None
        self._reader: Optional[_Reader] = None
        # the EXAC sections as (index, flags, first position, count), read when a view is asked
        self._exact_sections: Optional[List[Tuple[int, int, int, int]]] = None
        self._codebook_error: Optional[FkvfError] = None
        self._lock = threading.RLock()
        self._tokens: Optional[np.ndarray] = None
        self._tokens_read = False
        self.path = os.fsdecode(os.fspath(path))
        flags = (_lib.OPEN_STRICT if strict else 0) | (0 if mmap else _lib.OPEN_READ)
        nthreads = threads_arg(threads)
        self._h = self._open_reader(self.path, flags)
        self._reader = _Reader(self._h)
        lib.fkvf_reader_set_threads(self._h, nthreads)
        try:
            self._info = self._read_info()
            self._desc = self._read_desc() if self._info["has_desc"] else None
            self._resolve_codebook(codebooks, flags)
        except BaseException:
            self.close()
            raise

    # ---- opening and closing ----

    @staticmethod
    def _open_reader(path: str, flags: int) -> int:
        h = _lib.Reader()
        rc = lib.fkvf_reader_open_file(byref(h), os.fsencode(path), flags, None)
        if rc != _lib.OK:
            err = _error_from(h.value, rc, path)
            lib.fkvf_reader_free(h)
            raise err
        return h.value

    def _resolve_codebook(self, codebooks: Optional[PathLike], flags: int) -> None:
        if self._desc is None:
            return
        is_ext = c_int(0)
        hash_ = (c_uint8 * 16)()
        name = c_char_p()
        rc = lib.fkvf_reader_codebook_ref(self._h, byref(is_ext), hash_, byref(name))
        if rc != _lib.OK:
            raise _error_from(self._h, rc, self.path)
        if not is_ext.value:
            if codebooks is not None:
                raise ValueError(f"{self.path}: codebooks= given, and the archive refers to no "
                                 "codebook file (its codebook is embedded, or it has none)")
            return
        if codebooks is not None:
            cb_path = os.fsdecode(os.fspath(codebooks))
            self._cb = self._reader.cb = self._open_reader(cb_path, flags)
            rc = lib.fkvf_reader_attach_codebook(self._h, self._cb)
            if rc != _lib.OK:
                raise _error_from(self._h, rc, self.path)
            return
        found = _lib.Reader()
        search = os.environ.get("FKVF_CODEBOOK_PATH")
        rc = lib.fkvf_reader_find_codebook(self._h, os.fsencode(search) if search else None,
                                           byref(found))
        if rc == _lib.OK:
            self._cb = self._reader.cb = found.value
        elif rc == _lib.E_NOT_FOUND:
            # the archive stays readable at its exact positions; archived ones raise this
            self._codebook_error = _error_from(self._h, rc, self.path)
        else:
            raise _error_from(self._h, rc, self.path)

    def close(self) -> None:
        """Close the archive: every later call raises ValueError. Frees the search handle,
        and the reader (and the codebook file it borrowed) unless a zero-copy view of its
        mapping (read(copy=False)) is alive: then the last such view to be collected frees
        it. Idempotent."""
        with self._lock:
            self._h = self._cb = None
            reader, self._reader = self._reader, None
            if reader is not None:
                reader.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "Archive":
        self._handle()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._h is None

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._info['n_positions']} positions"
        return f"<fkvf.Archive {self.path!r} {state}>"

    def _handle(self) -> int:
        if self._h is None:
            raise ValueError(f"{self.path}: operation on a closed archive")
        return self._h

    def _check(self, rc: int) -> None:
        if rc != _lib.OK:
            if rc == _lib.E_CODEBOOK and self._codebook_error is not None:
                raise self._codebook_error
            raise _error_from(self._h, rc, self.path)

    # ---- what the open found ----

    def _read_info(self) -> Dict[str, int]:
        info = _lib.ArchiveInfo()
        self._check(lib.fkvf_reader_info(self._h, byref(info)))
        return {name: int(getattr(info, name)) for name, _ in info._fields_}

    def _read_desc(self) -> Dict[str, Any]:
        d = _lib.Desc()
        self._check(lib.fkvf_reader_desc(self._h, byref(d)))
        out: Dict[str, Any] = {name: getattr(d, name) for name, _ in d._fields_}
        out["dtype"] = _cache.NAME_OF.get(d.dtype, str(d.dtype))
        out["model_id"] = _lib.text(d.model_id) or ""
        out["tokenizer_id"] = _lib.text(d.tokenizer_id) or ""
        out["weights_hash"] = bytes(d.weights_hash) if d.weights_hash_kind else None
        out["rope_theta"] = float(d.rope_theta)
        return out

    @property
    def info(self) -> Dict[str, int]:
        """fkvf_archive_info as a dict (format_major, ..., n_positions, n_archived, ...)."""
        self._handle()
        return dict(self._info)

    @property
    def descriptor(self) -> Optional[Dict[str, Any]]:
        """The cache descriptor (spec 8) as a dict; None for a codebook file."""
        self._handle()
        return None if self._desc is None else dict(self._desc)

    @property
    def n_positions(self) -> int:
        self._handle()
        return self._info["n_positions"]

    @property
    def tokens(self) -> Optional[np.ndarray]:
        """The token ids (uint32, one per position), or None without a token stream."""
        with self._lock:
            h = self._handle()
            if not self._tokens_read:
                idx = c_size_t()
                rc = lib.fkvf_reader_stream_find(h, _lib.STREAM_ID_TOKENS, byref(idx))
                if rc == _lib.E_NOT_FOUND:
                    self._tokens = None
                else:
                    self._check(rc)
                    si = _lib.StreamInfo()
                    self._check(lib.fkvf_reader_stream_info(h, idx.value, byref(si)))
                    toks = np.empty(si.length, dtype=np.uint32)
                    if si.length:
                        self._check(lib.fkvf_reader_stream_read(
                            h, idx.value, 0, toks.ctypes.data_as(ctypes.POINTER(c_uint32)),
                            si.length))
                    toks.setflags(write=False)
                    self._tokens = toks
                self._tokens_read = True
            return self._tokens

    @property
    def streams(self) -> List[Dict[str, Any]]:
        """Every stream (spec 11) in reader order: index streams in code order, then tokens."""
        with self._lock:
            h = self._handle()
            n = c_size_t()
            self._check(lib.fkvf_reader_stream_count(h, byref(n)))
            out = []
            for i in range(n.value):
                si = _lib.StreamInfo()
                self._check(lib.fkvf_reader_stream_info(h, i, byref(si)))
                d: Dict[str, Any] = {name: getattr(si, name) for name, _ in si._fields_}
                d["index"] = i
                d["profile"] = {1: "quad", 2: "ngon"}.get(si.profile, str(si.profile))
                sid = si.id
                kind = sid >> 56
                if sid == 2**64 - 1:  # FKVF_STREAM_ID_UNNAMED: an external codebook's layer
                    # table names it (spec 11.2), and that codebook is not attached
                    d.update(kind="index", layer=None, head=None, part=None, stage=None,
                             name="unnamed")
                elif kind == 0:
                    layer, head = sid & 0xFFFF, (sid >> 16) & 0xFFFF
                    part, stage = "kv"[(sid >> 32) & 0xFF], (sid >> 40) & 0xFFFF
                    d.update(kind="index", layer=layer, head=head, part=part, stage=stage,
                             name=f"L{layer}.H{head}.{part.upper()}.{stage}")
                else:
                    d.update(kind="tokens" if sid == _lib.STREAM_ID_TOKENS else str(kind),
                             name="tokens" if sid == _lib.STREAM_ID_TOKENS else f"id{sid}")
                out.append(d)
            return out

    @property
    def metadata(self) -> Dict[str, Any]:
        """The META entries (spec 9): key -> int, float, bool, str or bytes."""
        with self._lock:
            h = self._handle()
            n = c_size_t()
            self._check(lib.fkvf_reader_meta_count(h, byref(n)))
            out: Dict[str, Any] = {}
            for i in range(n.value):
                e = _lib.MetaEntry()
                self._check(lib.fkvf_reader_meta(h, i, byref(e)))
                key = ctypes.string_at(e.key, e.key_len).decode("utf-8", "replace")
                raw = ctypes.string_at(e.value, e.value_len) if e.value_len else b""
                if e.type == _lib.META_U64:
                    val: Any = int(e.u64)
                elif e.type == _lib.META_I64:
                    val = int(e.i64)
                elif e.type == _lib.META_F64:
                    val = float(e.f64)
                elif e.type == _lib.META_BOOL:
                    val = bool(e.u64)
                elif e.type == _lib.META_UTF8:
                    val = raw.decode("utf-8", "replace")
                else:
                    val = raw
                out[key] = val
            return out

    # ---- reading ----

    def _read_block(self, first: int, count: int, l0: int, nl: int, h0: int, nh: int,
                    part_flag: int, dt: int, dim: int) -> np.ndarray:
        """One fkvf_reader_read call in FKVF_LAYOUT_HEADS: [nl, nh, count, dim]."""
        req = _lib.ReadRequest(first, count, l0, nl, h0, nh, part_flag, dt, _lib.LAYOUT_HEADS)
        out = np.empty((nl, nh, count, dim), dtype=_cache.NP_OF[dt])
        if out.size == 0:
            return out
        self._check(lib.fkvf_reader_read(self._h, byref(req), out.ctypes.data, out.nbytes))
        return out

    def _read_positions(self, pos: Tuple[int, int, Optional[np.ndarray]], l0: int, nl: int,
                        h0: int, nh: int, part_flag: int, dt: int, dim: int) -> np.ndarray:
        first, count, take = pos
        if take is None or take.size == 0:
            return self._read_block(first, count if take is None else 0, l0, nl, h0, nh,
                                    part_flag, dt, dim)
        # runs of consecutive requested positions, in request order
        breaks = np.flatnonzero(np.diff(take) != 1) + 1
        starts = np.concatenate(([0], breaks))
        ends = np.concatenate((breaks, [take.size]))
        if starts.size > _MAX_RUNS and count <= _MAX_SPAN_FACTOR * take.size:
            # many short runs close together: one read of the span they cover
            # (at most _MAX_SPAN_FACTOR times the positions asked for), then a pick
            block = self._read_block(first, count, l0, nl, h0, nh, part_flag, dt, dim)
            return np.ascontiguousarray(block[:, :, take, :])
        out = np.empty((nl, nh, take.size, dim), dtype=_cache.NP_OF[dt])
        for s, e in zip(starts.tolist(), ends.tolist()):
            out[:, :, s:e, :] = self._read_block(first + int(take[s]), e - s, l0, nl, h0, nh,
                                                 part_flag, dt, dim)
        return out

    # ---- zero-copy views ----

    def _exact_section_list(self) -> List[Tuple[int, int, int, int]]:
        """The EXAC sections in section order as (index, flags, first position, count): from
        the section table, no I/O (count from the section's size, spec 14.2)."""
        if self._exact_sections is None:
            row = c_size_t()
            self._check(lib.fkvf_reader_row_bytes(self._h, self._desc_dtype(), byref(row)))
            out = []
            for i in range(self._info["n_sections"]):
                si = _lib.SectionInfo()
                self._check(lib.fkvf_reader_section(self._h, i, byref(si)))
                if si.type == _lib.SECTION_EXAC and si.size >= _SUBHDR and row.value:
                    out.append((i, int(si.flags), int(si.key),
                                (int(si.size) - _SUBHDR) // row.value))
            self._exact_sections = out
        return self._exact_sections

    def _desc_dtype(self) -> int:
        return {"f16": _lib.DTYPE_F16, "bf16": _lib.DTYPE_BF16,
                "f32": _lib.DTYPE_F32}[self._desc["dtype"]]

    def _all_exact(self, lo: int, hi: int) -> bool:
        """Every position of [lo, hi] is exact (spec 14.3)."""
        a, s = self._info["n_archived"], self._desc["n_sinks"]
        return a == 0 or hi < s or lo >= s + a

    def _views(self, pos: Tuple[int, int, Optional[np.ndarray]],
               lsel: Tuple[int, int, Optional[np.ndarray]],
               hsel: Tuple[int, int, Optional[np.ndarray]], part: str,
               dt: int) -> Optional[List[np.ndarray]]:
        """Read-only views [nl, nh, T, D] (one per part) into the one EXAC section that holds
        every selected row, or None when the selection cannot be a view (read copies then)."""
        if dt != self._desc_dtype():
            return None
        pp, lp, hp = _progression(pos), _progression(lsel), _progression(hsel)
        if pp is None or lp is None or hp is None:
            return None
        p0, n, pstep = pp
        lo, hi = p0, p0 + (n - 1) * pstep
        if not self._all_exact(lo, hi):
            return None
        h = self._h
        ptr, size = c_void_p(), c_size_t()
        self._check(lib.fkvf_reader_exact_row(h, lo, byref(ptr), byref(size)))
        a_lo, rowb = int(ptr.value or 0), int(size.value)
        self._check(lib.fkvf_reader_exact_row(h, hi, byref(ptr), byref(size)))
        a_hi = int(ptr.value or 0)
        secs = self._exact_section_list()
        chosen = None
        for j, (idx, flags, first, count) in enumerate(secs):
            if flags & _lib.SECTION_DEFLATE or not (first <= lo and hi < first + count):
                continue
            data, dsize = c_void_p(), c_size_t()
            self._check(lib.fkvf_reader_section_data(h, idx, byref(data), byref(dsize)))
            base = int(data.value or 0)
            if (a_lo == base + _SUBHDR + (lo - first) * rowb
                    and a_hi == base + _SUBHDR + (hi - first) * rowb
                    and base + _SUBHDR + (hi - first + 1) * rowb <= base + dsize.value):
                chosen = (j, base, int(dsize.value))
        if chosen is None:
            return None
        j, base, dsize = chosen
        # a later EXAC section holding any of [lo, hi] would win for those rows (spec 7.3)
        if any(first <= hi and lo < first + count for _, _, first, count in secs[j + 1:]):
            return None
        desc = self._desc
        e = _cache.NP_OF[dt].itemsize
        H, dk, dv = desc["n_kv_heads"], desc["key_dim"], desc["value_dim"]
        layer_b = H * (dk + dv) * e
        l0, nl, lstep = lp
        h0, nh, hstep = hp
        mem = np.asarray(_Mapping(self._reader, base, dsize))
        row0 = a_lo - base  # offset of row lo in the section
        out = []
        for p, dim, part_off in (("k", dk, 0), ("v", dv, H * dk * e)):
            if p not in part:
                continue
            arr = np.ndarray((nl, nh, n, dim), dtype=_cache.NP_OF[dt], buffer=mem,
                             offset=row0 + l0 * layer_b + part_off + h0 * dim * e,
                             strides=(lstep * layer_b, hstep * dim * e, pstep * rowb, e))
            arr.flags.writeable = False
            out.append(arr)
        return out

    def read(self, positions: Selector = None, layers: Selector = None, heads: Selector = None,
             part: str = "kv", dtype: Any = None, layout: str = "lhtd",
             copy: bool = True, as_torch: bool = False) -> Any:
        """Read a selection of the cache, bit-identical to fkvf_reader_restore.

        positions, layers, heads: None (all), an int (that one; the axis is kept, length 1),
        a slice, or a 1-D array of ints (any order, repeats allowed) or a boolean mask.
        part: "k", "v" or "kv". dtype: np.float16, np.float32 or "bf16" (bf16 bits as uint16);
        None = the archive's. layout: "lhtd" -> [L, H, T, D] arrays (a (k, v) pair for
        "kv"); "hf" -> a list per layer of (k, v) pairs [1, H, T, D] (of k or v arrays for
        part "k" / "v"); "nhd" -> [L, T, H, D] arrays (positions first, as the cache
        fkvf.pack(layout="nhd") took).

        as_torch=True: torch tensors (CPU, sharing the arrays' memory; bf16 as
        torch.bfloat16) instead of NumPy arrays; needs PyTorch, and copy=True (a tensor
        cannot be read-only, and a view is).

        copy=False: where the layout allows it, read-only views into the reader's mapping
        instead of copies: the positions are exact, an arithmetic progression (a slice,
        an int) stored uncompressed in one EXAC section that no later section overrides,
        dtype is the archive's, and layers and heads are progressions with a step >= 0
        (None, an int, a slice with step > 0). Otherwise the result is a copy, as with
        copy=True (np.shares_memory or .base tell which). A view keeps the reader alive
        after close() until the last view is collected.
        """
        if part not in ("k", "v", "kv"):
            raise ValueError(f"part {part!r}: expected 'k', 'v' or 'kv'")
        if layout not in ("lhtd", "hf", "nhd"):
            raise ValueError(f"layout {layout!r}: expected 'lhtd', 'hf' or 'nhd'")
        if as_torch and not copy:
            raise ValueError("as_torch=True needs copy=True: a torch tensor cannot be "
                             "read-only, and a view of the archive is")
        with self._lock:
            self._handle()
            if self._desc is None:
                raise ValueError(f"{self.path}: a codebook file holds no cache to read")
            desc = self._desc
            dt = _cache.dtype_code(dtype) if dtype is not None else int(
                {"f16": 1, "bf16": 2, "f32": 3}[desc["dtype"]])
            pos = _select(positions, self._info["n_positions"], "position")
            l0, nl, ltake = _select(layers, desc["n_layers"], "layer")
            h0, nh, htake = _select(heads, desc["n_kv_heads"], "head")
            views = None if copy else self._views(pos, (l0, nl, ltake), (h0, nh, htake),
                                                   part, dt)
            if views is not None:
                if layout == "nhd":
                    views = [a.transpose(0, 2, 1, 3) for a in views]
                return self._shape_result(views, layout, False, dt)
            result = []
            for p, flag, dim in (("k", _lib.PART_KEYS, desc["key_dim"]),
                                 ("v", _lib.PART_VALUES, desc["value_dim"])):
                if p not in part:
                    continue
                arr = self._read_positions(pos, l0, nl, h0, nh, flag, dt, dim)
                if ltake is not None:
                    arr = arr[ltake]
                if htake is not None:
                    arr = arr[:, htake]
                if layout == "nhd":
                    arr = arr.transpose(0, 2, 1, 3)
                result.append(np.ascontiguousarray(arr))
        return self._shape_result(result, layout, as_torch, dt)

    @staticmethod
    def _shape_result(result: List[np.ndarray], layout: str, as_torch: bool, dt: int) -> Any:
        if as_torch:
            result = [_to_torch(a, dt) for a in result]
        if layout == "hf":
            if len(result) == 2:
                return [(result[0][i][None], result[1][i][None]) for i in range(len(result[0]))]
            return [result[0][i][None] for i in range(len(result[0]))]
        return result[0] if len(result) == 1 else (result[0], result[1])

    def restore(self, positions: Optional[slice] = None, dtype: Any = None,
                as_torch: bool = False) -> Any:
        """The rows of a range of positions as fkvf_reader_restore gives them: a [T, row]
        array, row = for each layer the keys of every head then the values of every head
        (spec 14.2), the layout every writer of the package takes apart again and the fastest
        whole-cache read (no rearranging). positions: None (all) or a slice with step 1
        (negative bounds count from the end). dtype and as_torch as read's."""
        with self._lock:
            h = self._handle()
            if self._desc is None:
                raise ValueError(f"{self.path}: a codebook file holds no cache to restore")
            if positions is not None and not isinstance(positions, slice):
                raise TypeError("positions: None or a slice with step 1 (use read() for a "
                                "selection)")
            first, count, take = _select(positions, self._info["n_positions"], "position")
            if take is not None:
                raise ValueError("positions: a slice with step 1 (use read() for a selection)")
            dt = _cache.dtype_code(dtype) if dtype is not None else self._desc_dtype()
            d = self._desc
            elems = d["n_layers"] * d["n_kv_heads"] * (d["key_dim"] + d["value_dim"])
            out = np.empty((count, elems), dtype=_cache.NP_OF[dt])
            if out.size:
                self._check(lib.fkvf_reader_restore(h, first, count, dt, out.ctypes.data,
                                                    out.nbytes))
            return _to_torch(out, dt) if as_torch else out

    @property
    def exact(self) -> np.ndarray:
        """A bool array, one per position: True where the position is stored exactly (the
        sinks and the recent window; spec 14.3: the archived positions are the n_archived
        after the first n_sinks), what is_exact answers for one position."""
        self._handle()
        n, a = self._info["n_positions"], self._info["n_archived"]
        mask = np.ones(n, dtype=bool)
        if self._desc is not None and a:
            s = self._desc["n_sinks"]
            mask[s:s + a] = False
        return mask

    def is_exact(self, position: int) -> bool:
        """True when position is stored exactly (a sink or in the recent window).

        position is an int counted like read's (negative: from the end); IndexError
        outside the archive's positions, TypeError for what is not an int."""
        with self._lock:
            h = self._handle()
            if isinstance(position, (bool, np.bool_)):
                raise TypeError("position: a bool is not an index")
            p = operator.index(position)
            n = self._info["n_positions"]
            if not -n <= p < n:
                raise IndexError(f"position {p} out of range (0..{n - 1})")
            v = c_int()
            self._check(lib.fkvf_reader_is_exact(h, p % n, byref(v)))
            return bool(v.value)

    def verify(self) -> None:
        """Full verification (every checksum, padding, span); raises the first error."""
        with self._lock:
            self._check(lib.fkvf_reader_verify(self._handle()))

    # ---- searching the token stream ----

    def _token_stream(self) -> int:
        """The index of the token stream; NotFoundError (naming the file) without one."""
        idx = c_size_t()
        rc = lib.fkvf_reader_stream_find(self._handle(), _lib.STREAM_ID_TOKENS, byref(idx))
        if rc == _lib.E_NOT_FOUND:
            raise make(rc, _lib.text(lib.fkvf_error_name(rc)) or "", lib.fkvf_error_class(rc),
                       f"{self.path}: the archive has no token stream (spec 11.1) to search",
                       self.path)
        self._check(rc)
        return idx.value

    def _search(self) -> int:
        """The search handle on the token stream, opened on first use, freed by close()."""
        reader = self._reader
        assert reader is not None
        if reader.search is None:
            idx = self._token_stream()
            s = c_void_p()
            rc = lib.fkvf_search_open(byref(s), self._h, idx, 0, None)
            if rc != _lib.OK:
                err = self._search_error(s.value, rc)
                lib.fkvf_search_free(s)
                raise err
            reader.search = s.value
        return reader.search

    def _search_error(self, s: Optional[int], rc: int) -> FkvfError:
        """The error of search handle s (its file is "search": this archive's path instead)."""
        info = _lib.ErrorInfo()
        if s and lib.fkvf_search_error(s, byref(info)) == _lib.OK and info.code != _lib.OK:
            code = info.code
            file = _lib.text(info.file)
            offset = None if info.offset == _lib.ERROR_NO_OFFSET else int(info.offset)
            message = _lib.text(info.message) or ""
            if file in (None, "search"):
                file = self.path
                message = f"{self.path}: {message}"
            return make(code, _lib.text(lib.fkvf_error_name(code)) or "",
                        lib.fkvf_error_class(code), message, file, offset,
                        _lib.text(info.clause), _lib.text(info.field))
        return _error_from(self._h, rc, self.path)

    @staticmethod
    def _query(tokens: Any, what: str, allow_empty: bool = False) -> np.ndarray:
        """Token ids as a C-contiguous uint32 array: 1-D, integers in 0 .. 2**32-1 (checked
        before the cast), non-empty unless allow_empty."""
        if isinstance(tokens, (bool, np.bool_)):
            raise TypeError(f"{what}: a bool is not a token id")
        if isinstance(tokens, (int, np.integer)):
            tokens = [tokens]
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise ValueError(f"{what}: expected a 1-D sequence of token ids, got shape "
                             f"{arr.shape}")
        if arr.size == 0:
            if allow_empty:
                return np.zeros(0, dtype=np.uint32)
            raise ValueError(f"{what}: empty (at least one token id)")
        if arr.dtype == object and all(isinstance(x, (int, np.integer))
                                       and not isinstance(x, (bool, np.bool_)) for x in arr):
            # Python ints beyond int64 (2**64, -2**70): range-checked as ints below
            lo, hi = min(int(x) for x in arr), max(int(x) for x in arr)
        elif arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{what}: token ids must be integers, got dtype {arr.dtype}")
        else:
            lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > 0xFFFFFFFF:
            raise ValueError(f"{what}: token id out of range (0 .. 2**32-1)")
        return np.ascontiguousarray(arr, dtype=np.uint32)

    def search(self, tokens: Any, k: int = 5) -> List[Tuple[int, int]]:
        """The k positions whose context (the token ids up to and including the position)
        shares the longest suffix with tokens, as (position, length) pairs: longest first,
        then by position (fkvf_search_longest, as `fkvf search`'s longest matches). length
        >= 1; fewer than k pairs when fewer positions match at all."""
        if isinstance(k, (bool, np.bool_)):
            raise TypeError("k: a bool is not a count")
        k = operator.index(k)
        if k < 1:
            raise ValueError(f"k {k}: expected at least 1")
        q = self._query(tokens, "tokens")
        with self._lock:
            self._handle()
            s = self._search()
            k = min(k, max(self._info["n_positions"], 1))
            out = (_lib.Match * k)()
            n = c_size_t()
            rc = lib.fkvf_search_longest(s, q.ctypes.data_as(ctypes.POINTER(c_uint32)), q.size,
                                         k, out, byref(n))
            if rc != _lib.OK:
                raise self._search_error(s, rc)
            return [(int(out[i].position), int(out[i].length)) for i in range(n.value)]

    def find(self, tokens: Any) -> np.ndarray:
        """The positions where tokens occur exactly, as the position of their last token
        (uint64, ascending; fkvf_search_suffix)."""
        q = self._query(tokens, "tokens")
        with self._lock:
            self._handle()
            s = self._search()
            qp = q.ctypes.data_as(ctypes.POINTER(c_uint32))
            cap = 256
            while True:
                out = np.empty(cap, dtype=np.uint64)
                n = c_uint64()
                rc = lib.fkvf_search_suffix(s, qp, q.size,
                                            out.ctypes.data_as(ctypes.POINTER(c_uint64)), cap,
                                            byref(n))
                if rc != _lib.OK:
                    raise self._search_error(s, rc)
                if n.value <= cap:
                    return out[:n.value].copy()
                cap = int(n.value)

    def search_keys(self, layer: int, head: int, query: Any, m: int = 16, first: int = 0,
                    end: Optional[int] = None, candidates: int = 0,
                    chunk: int = 0) -> List[Tuple[int, float]]:
        """The m archived positions whose keys the query vector weighs most (key retrieval,
        fkvf_search_keys; `fkvf keys`): (position, q . k) pairs, best first, k the key the
        archive decodes for the position. query: key_dim finite numbers (as attention
        applies it: after RoPE at the query's position). layer, head: the KV head. first,
        end: search the archived positions in [first, end) (end None: to the last).
        candidates: keys decoded and ranked per position returned (0: 4; at most 1024;
        with candidates * m at least the positions searched the answer is exact). chunk:
        keys archived before rotation are scored per chunk of this many positions (0: the
        library's default, 1024). The exact window is not searched."""
        for name, v in (("layer", layer), ("head", head), ("m", m), ("first", first),
                        ("candidates", candidates), ("chunk", chunk)):
            if isinstance(v, (bool, np.bool_)):
                raise TypeError(f"{name}: a bool is not an int")
        layer, head, m = operator.index(layer), operator.index(head), operator.index(m)
        first, candidates, chunk = (operator.index(first), operator.index(candidates),
                                    operator.index(chunk))
        if end is not None:
            if isinstance(end, (bool, np.bool_)):
                raise TypeError("end: a bool is not an int")
            end = operator.index(end)
        if m < 1:
            raise ValueError(f"m {m}: expected at least 1")
        if not 0 <= candidates <= _lib.KEY_CANDIDATES_MAX:
            raise ValueError(f"candidates {candidates}: expected 0 .. {_lib.KEY_CANDIDATES_MAX}")
        bounds = [("first", first), ("chunk", chunk)]
        if end is not None:
            bounds.append(("end", end))
        for name, v in bounds:
            if not 0 <= v < 2 ** 64:
                raise ValueError(f"{name} {v}: expected 0 .. 2**64-1")
        if end == 0:
            return []  # [first, 0): nothing (end 0 means "to the last" in C)
        q = np.asarray(query)
        if q.ndim != 1 or not (np.issubdtype(q.dtype, np.floating) or
                               np.issubdtype(q.dtype, np.integer)) or q.dtype == bool:
            raise TypeError(f"query: expected a 1-D array of numbers, got {q.dtype} {q.shape}")
        q = np.ascontiguousarray(q, dtype=np.float32)
        if not np.all(np.isfinite(q)):
            raise ValueError("query: every component must be finite")
        with self._lock:
            h = self._handle()
            desc = self._desc
            if desc is None:
                raise ValueError(f"{self.path}: a codebook file has no archived positions")
            if not (0 <= layer < desc["n_layers"] and 0 <= head < desc["n_kv_heads"]):
                raise IndexError(f"layer {layer}, head {head}: the archive has "
                                 f"{desc['n_layers']} layers of {desc['n_kv_heads']} KV heads")
            if q.size != desc["key_dim"]:
                raise ValueError(f"query: {q.size} components; the archive's keys have "
                                 f"{desc['key_dim']}")
            reader = self._reader
            assert reader is not None
            if reader.key_search is None:
                ks = c_void_p()
                rc = lib.fkvf_search_keys_open(byref(ks), h, None)
                if rc != _lib.OK:
                    err = self._key_search_error(ks.value, rc)
                    lib.fkvf_search_keys_free(ks)
                    raise err
                reader.key_search = ks.value
            ks = reader.key_search
            kq = _lib.KeyQuery(layer, head, q.ctypes.data, q.size, first,
                               0 if end is None else end, m, candidates, chunk)
            out = (_lib.KeyHit * m)()
            n = c_size_t()
            rc = lib.fkvf_search_keys(ks, byref(kq), out, byref(n), None)
            if rc != _lib.OK:
                raise self._key_search_error(ks, rc)
            return [(int(out[i].position), float(out[i].score)) for i in range(n.value)]

    def _key_search_error(self, ks: Optional[int], rc: int) -> FkvfError:
        """The error of key search handle ks, naming this archive."""
        info = _lib.ErrorInfo()
        if ks and lib.fkvf_search_keys_error(ks, byref(info)) == _lib.OK and info.code != _lib.OK:
            code = info.code
            message = _lib.text(info.message) or ""
            if self.path not in message:
                message = f"{self.path}: {message}"
            return make(code, _lib.text(lib.fkvf_error_name(code)) or "",
                        lib.fkvf_error_class(code), message, self.path)
        return _error_from(self._h, rc, self.path)

    def prefix_reuse(self, prompt: Any) -> Dict[str, int]:
        """Compare a new prompt (token ids; may be empty) with the archive's token stream
        (fkvf_search_prefix_reuse): prefix_len (the prompt's longest prefix the archive
        holds at the same positions: those cached rows can be reused as they are),
        match_end / match_len (the longest earlier occurrence of the prompt's last tokens;
        0 / 0 when none), archive_positions (the token stream's length)."""
        q = self._query(prompt, "prompt", allow_empty=True)
        with self._lock:
            h = self._handle()
            self._token_stream()
            res = _lib.PrefixReuse()
            self._check(lib.fkvf_search_prefix_reuse(
                h, q.ctypes.data_as(ctypes.POINTER(c_uint32)), q.size, byref(res)))
            return {name: int(getattr(res, name)) for name, _ in res._fields_}

    def context(self, at: int, length: int) -> np.ndarray:
        """The token ids of the `length` positions ending at position `at` (counted like
        read's: negative from the end), oldest first: at most `length`, fewer at the start
        of the archive (fkvf_search_context). uint32."""
        for name, v in (("at", at), ("length", length)):
            if isinstance(v, (bool, np.bool_)):
                raise TypeError(f"{name}: a bool is not an int")
        at, length = operator.index(at), operator.index(length)
        if length < 0:
            raise ValueError(f"length {length}: expected >= 0")
        with self._lock:
            h = self._handle()
            idx = self._token_stream()
            n = self._info["n_positions"]
            if not -n <= at < n:
                raise IndexError(f"position {at} out of range (0..{n - 1})")
            at %= n
            m = min(length, at + 1)
            out = np.empty(m, dtype=np.uint32)
            got = c_size_t()
            self._check(lib.fkvf_search_context(h, idx, at, m,
                                                out.ctypes.data_as(ctypes.POINTER(c_uint32)),
                                                byref(got)))
            return out[:got.value]


def open(path: PathLike, codebooks: Optional[PathLike] = None, strict: bool = False,
         mmap: bool = True, threads: Optional[int] = None) -> Archive:
    """Open the archive at path. codebooks: the codebook file of an archive that refers to
    an external one (default: found by content hash next to the archive, then in each
    directory of FKVF_CODEBOOK_PATH). strict: a torn tail is an error (TornError).

    mmap=True (default): the file is mapped, read only where a call needs it. A file that
    another process truncates or rewrites while it is open (not what an Appender does: it
    only adds after the last commit) can then kill the interpreter with SIGBUS on the next
    read. mmap=False reads the whole file into memory the reader owns at open
    (FKVF_OPEN_READ): safe against that, at the cost of the memory and a full read (the
    codebook file too); zero-copy views then view that copy.

    threads: the threads restore() decodes archived positions with and verify() checks with
    (fkvf_reader_set_threads): None is the environment's FKVF_THREADS, else every CPU the
    process may run on; the rows, and verify()'s error, are the same for every count."""
    return Archive(path, codebooks=codebooks, strict=strict, mmap=mmap, threads=threads)
