"""Appender: grow an FKVF archive one commit at a time, over libfkvf's appender
(fkvf_appender_create / open / append / commit / sync / info / error / free)."""

from __future__ import annotations

import operator
import os
import threading
from ctypes import byref, pointer
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _cache, _lib
from ._lib import lib
from ._codebook import CodebookFile
from ._keys import KeyOpts, str_arg, threads_arg
from .archive import Archive, PathLike
from .errors import FkvfError, from_code, from_handle

SYNC_COMMIT, SYNC_NONE = _lib.SYNC_COMMIT, _lib.SYNC_NONE
_SYNC = {"commit": SYNC_COMMIT, "none": SYNC_NONE}
_TOKEN_BITS_DEFAULT = 16  # as fkvf append --create: wider when the ids need it
_U32 = 2**32 - 1
_H = _lib.Appender


def _appender_error(h: Optional[int], code: int, path: str) -> FkvfError:
    """The FkvfError of a failed call on appender h (errors.from_handle)."""
    return from_handle(lib.fkvf_appender_error, h, code, path)


def _count(value: Any, what: str, lo: int = 0, hi: int = _U32) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what}: a bool, expected an int")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{what}: a {type(value).__name__}, expected an int") from None
    if not lo <= n <= hi:
        raise ValueError(f"{what} {n}: expected {lo}..{hi}")
    return n


def _choice(value: Any, table: Dict[str, int], what: str) -> int:
    if value not in table:
        raise ValueError(f"{what} {value!r}: expected " + " or ".join(map(repr, table)))
    return table[value]


class Appender:
    """An FKVF archive opened (or created) for appending new positions, one commit at a time.

    ``Appender(path)`` opens an existing archive; the file is locked while the appender is
    open (a second appender on it raises the library's IoError naming the file).
    ``Appender(path, create=True, ...)`` creates a new one (never replacing a file:
    ExistsError). Without ``shape=`` the shape and dtype come from the first append and the
    file is created at the first commit: nothing exists on disk (and nothing is locked)
    before it.

    ``append(k, v, tokens=None)`` queues positions, ``commit()`` writes what is queued as one
    commit; nothing reaches the file before a commit. As a context manager, a clean exit
    commits what is queued and closes; an exception closes without committing, so the file
    stays at its last commit. ``close()`` drops queued positions (idempotent).

    Errors of the library are FkvfError subclasses (file, offset, clause, field). A failed
    commit or sync cuts the file back to the previous commit and fails the handle (the
    library's rule): every later append, commit or sync raises the same error (``info``
    still reports the last commit); open a new Appender to continue. Bad arguments raise
    ValueError / TypeError naming the argument. One thread at a time per appender (calls are
    serialised by a lock).

    Options of both: recover (truncate a torn tail instead of TornError), codebooks (an
    opened archive's codebook file when it refers to one; default: found by content hash
    next to the archive, then in FKVF_CODEBOOK_PATH, as fkvf.open finds it), sync ("commit":
    a commit is durable when commit() returns; "none": after sync()), beam (RVQ beam width
    for archived positions, 1 = greedy), threads (of a commit's encoding: None is
    FKVF_THREADS, else every CPU the process may run on; the file is the same for every
    count), layout ("hnd" / "nhd" of the arrays appended),
    compact_at (the automatic compaction, docs/appending.md: after a commit that leaves the
    file larger than compact_at x its live bytes, it is rewritten as fkvf.compact would and
    renamed over the path; None: the library's default 1.4; a number > 1), auto_compact
    (False: never; the file keeps every commit until fkvf compact). A commit whose
    compaction failed (no space, ...) still stands: the appender goes on with the old file.

    Options of create=True, as ``fkvf append --create``:
      sinks (4), recent (32): the exact positions kept at the start and the end;
      codebooks: None (no codebook: every position stays exact) or a codebook file from
        ``fkvf train``, referred to by content hash; codec "quad" / "ngon" (index streams);
      tokens: True / False (a token stream); None: one when the first append gives ids (no
        stream when shape= is given); token_bits (even 2..32) or vocab_size imply True and
        set its width (default 16, or wider when the first ids need it);
      keys and rope as fkvf.pack (one rule, fkvf._keys): keys "pre-rope" (default) /
        "as-is"; rope None, a dict or fkvf.Rope(theta, dims, layout), or False (keys carry
        no RoPE); pairs half-split when the first append gives per-layer lists, else
        interleaved; with a codebook file its train.* settings are used where not given
        and a contradicting one is refused (CodebookError);
      model_id, tokenizer_id; shape ``(n_layers, n_kv_heads, key_dim, value_dim)`` with
        dtype (np.float16, np.float32, "bf16"): the file is created at once; dtype alone:
        the appended arrays are converted to it.
    """

    def __init__(self, path: PathLike, create: bool = False, *, recover: bool = False,
                 codebooks: Optional[PathLike] = None, sync: str = "commit", beam: int = 1,
                 layout: str = "hnd", compact_at: Optional[float] = None,
                 auto_compact: bool = True, sinks: int = 4, recent: int = 32,
                 codec: str = "quad",
                 tokens: Optional[bool] = None, token_bits: Optional[int] = None,
                 vocab_size: Optional[int] = None, keys: Optional[str] = None,
                 rope: Any = None,
                 model_id: str = "", tokenizer_id: str = "",
                 shape: Optional[Sequence[int]] = None, dtype: Any = None,
                 threads: Optional[int] = None) -> None:
        self._h: Optional[int] = None
        self._closed = False
        self._failed: Optional[FkvfError] = None
        self._lock = threading.RLock()
        self._queue: List[Tuple[np.ndarray, Optional[np.ndarray]]] = []
        self._cbfile: Optional[CodebookFile] = None
        self.path = os.fsdecode(os.fspath(path))
        self._layout = _cache.check_layout(layout)
        opts = _lib.AppendOptions()
        lib.fkvf_append_options_init(byref(opts))
        opts.sync = _choice(sync, _SYNC, "sync")
        opts.beam_width = _count(beam, "beam", 1, 64)
        opts.n_threads = threads_arg(threads)
        if not isinstance(auto_compact, (bool, np.bool_)):
            raise TypeError(f"auto_compact: a {type(auto_compact).__name__}, expected True or "
                            "False")
        if compact_at is not None:
            if isinstance(compact_at, (bool, np.bool_)) or not isinstance(
                    compact_at, (int, float, np.integer, np.floating)):
                raise TypeError(f"compact_at: a {type(compact_at).__name__}, expected a number")
            if not auto_compact:
                raise ValueError("compact_at= and auto_compact=False exclude each other")
            if not 1 < float(compact_at) <= 1e6:
                raise ValueError(f"compact_at {compact_at}: expected a ratio > 1 (and <= 1e6)")
            opts.compact_ratio = float(compact_at)
        opts.no_auto_compact = 0 if auto_compact else 1
        if not isinstance(create, (bool, np.bool_)):
            raise TypeError(f"create: a {type(create).__name__}, expected True or False")
        if not isinstance(recover, (bool, np.bool_)):
            raise TypeError(f"recover: a {type(recover).__name__}, expected True or False")
        self._opts = opts
        # the archive's shape (n_layers, n_kv_heads, key_dim, value_dim) and dtype code;
        # None until the first append of a create without shape=
        self._shape: Optional[Tuple[int, int, int, int]] = None
        self._dtype: Optional[int] = None
        self._has_tokens: Optional[bool] = None
        self._token_max: Optional[int] = None  # the largest id the token stream holds
        try:
            if create:
                self._init_create(codebooks, sinks, recent, codec, tokens, token_bits, vocab_size,
                                  keys, rope, model_id, tokenizer_id, shape, dtype)
            else:
                given = [n for n, v in (("sinks", sinks != 4), ("recent", recent != 32),
                                        ("codec", codec != "quad"), ("tokens", tokens is not None),
                                        ("token_bits", token_bits is not None),
                                        ("vocab_size", vocab_size is not None),
                                        ("keys", keys is not None), ("rope", rope is not None),
                                        ("model_id", model_id != ""),
                                        ("tokenizer_id", tokenizer_id != ""),
                                        ("shape", shape is not None), ("dtype", dtype is not None))
                         if v]
                if given:
                    raise ValueError(f"{given[0]}= is an option of create=True (an existing "
                                     "archive keeps its settings)")
                opts.recover = 1 if recover else 0
                self._init_open(codebooks)
        except BaseException:
            self.close()  # the codebook file opened for a create, if any
            raise

    # ---- opening ----

    def _init_open(self, codebooks: Optional[PathLike]) -> None:
        # the archive read once (fkvf.open's way, codebook resolution included) for its
        # descriptor, token stream and codebook file; the appender borrows the codebook
        # file during its open only
        with Archive(self.path, codebooks=codebooks) as arch:
            if arch.descriptor is None:
                raise ValueError(f"{self.path}: a codebook file, not an archive: nothing to "
                                 "append to")
            if arch._codebook_error is not None:
                raise arch._codebook_error
            d = arch.descriptor
            self._shape = (d["n_layers"], d["n_kv_heads"], d["key_dim"], d["value_dim"])
            self._dtype = _cache.dtype_code(d["dtype"])
            tok = [s for s in arch.streams if s["kind"] == "tokens"]
            self._has_tokens = bool(tok)
            if tok:
                self._token_max = _stream_max(tok[0])
            self._opts.codebook_file = arch._cb
            h = _H()
            rc = lib.fkvf_appender_open(byref(h), os.fsencode(self.path), byref(self._opts),
                                        None)
            self._opts.codebook_file = None
            if rc != _lib.OK:
                err = _appender_error(h.value, rc, self.path)
                lib.fkvf_appender_free(h)
                raise err
            self._h = h.value

    def _init_create(self, codebooks: Optional[PathLike], sinks: int, recent: int, codec: str,
                     tokens: Optional[bool], token_bits: Optional[int],
                     vocab_size: Optional[int], keys: Optional[str], rope: Any,
                     model_id: str, tokenizer_id: str,
                     shape: Optional[Sequence[int]], dtype: Any) -> None:
        self._sinks = _count(sinks, "sinks")
        self._recent = _count(recent, "recent")
        self._ngon = _choice(codec, {"quad": 0, "ngon": 1}, "codec")
        if tokens is not None and not isinstance(tokens, (bool, np.bool_)):
            raise TypeError(f"tokens: a {type(tokens).__name__}, expected True, False or None")
        if token_bits is not None and vocab_size is not None:
            raise ValueError("token_bits= and vocab_size= exclude each other")
        self._token_bits: Optional[int] = None
        if token_bits is not None:
            self._token_bits = _count(token_bits, "token_bits", 2, 32)
            if self._token_bits % 2:
                raise ValueError(f"token_bits {token_bits}: expected an even width 2..32")
        if vocab_size is not None:
            self._token_bits = int(lib.fkvf_quad_bits_for(_count(vocab_size, "vocab_size", 1,
                                                                 2**32) - 1))
        if (self._token_bits is not None) and tokens is False:
            raise ValueError("token_bits= / vocab_size= with tokens=False")
        if self._token_bits is not None:
            self._token_max = (1 << self._token_bits) - 1
        self._keys = KeyOpts(keys, rope)
        for what, s in (("model_id", model_id), ("tokenizer_id", tokenizer_id)):
            str_arg(what, s)
        self._ids = (model_id.encode(), tokenizer_id.encode())
        # token_bits / vocab_size say there are ids to store
        self._has_tokens = (True if self._token_bits is not None else None) if tokens is None \
            else bool(tokens)
        self._dtype = None if dtype is None else _cache.dtype_code(dtype)
        if shape is not None:
            if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or \
                    len(shape) != 4:
                raise TypeError("shape: expected (n_layers, n_kv_heads, key_dim, value_dim)")
            names = ("n_layers", "n_kv_heads", "key_dim", "value_dim")
            self._shape = tuple(_count(x, f"shape[{i}] ({names[i]})", 1)  # type: ignore
                                for i, x in enumerate(shape))
            if self._dtype is None:
                raise ValueError("shape= needs dtype= (np.float16, np.float32 or 'bf16')")
            if self._has_tokens is None:
                self._has_tokens = False
        if os.path.lexists(self.path):
            raise from_code(_lib.E_EXISTS, "exists; create=True never replaces a file (append "
                            "to it without create=True)", self.path)
        if codebooks is not None:
            cb = CodebookFile(os.fsdecode(os.fspath(codebooks)))
            self._cbfile = cb
            cb.settle_keys(self._keys)
        if self._shape is not None:
            self._keys.hf_default(False)  # no cache form: interleaved unless given
            self._create()

    def _fit_codebook(self, shape: Tuple[int, int, int, int]) -> None:
        """The codebook file of a create fits the cache's shape (CodebookError if not)."""
        if self._cbfile is not None:
            self._cbfile.check_fit(*shape)

    def _create(self) -> None:
        """fkvf_appender_create with the settings given and the shape known."""
        assert self._shape is not None and self._dtype is not None
        L, H, Dk, Dv = self._shape
        cb = self._cbfile
        self._fit_codebook(self._shape)
        d = _lib.Desc()
        d.n_layers, d.n_kv_heads, d.key_dim, d.value_dim = L, H, Dk, Dv
        d.dtype = self._dtype
        for name, value in self._keys.desc_fields(Dk).items():
            setattr(d, name, value)
        d.n_sinks, d.window = self._sinks, self._recent
        d.model_id, d.tokenizer_id = self._ids
        cr = _lib.AppendCreate()
        cr.desc = pointer(d)
        if cb is not None:
            cr.codebook_ref = cb.handle
            cr.codebook_name = cb.name.encode()
            if self._ngon:
                cr.index_codec.profile = _lib.PROFILE_NGON
                cr.index_codec.alphabet = cb.shape.k
        if self._has_tokens:
            bits = self._token_bits
            if bits is None:
                bits = _TOKEN_BITS_DEFAULT
                mx = max((int(t.max()) for _, t in self._queue if t is not None and t.size),
                         default=0)
                bits = max(bits, int(lib.fkvf_quad_bits_for(mx)))
            cr.token_codec.profile = _lib.PROFILE_QUAD
            cr.token_codec.symbol_bits = bits
            self._token_max = (1 << bits) - 1
        h = _H()
        rc = lib.fkvf_appender_create(byref(h), os.fsencode(self.path), byref(cr),
                                      byref(self._opts), None)
        if rc != _lib.OK:
            err = _appender_error(h.value, rc, self.path)
            lib.fkvf_appender_free(h)
            raise err
        self._h = h.value
        if cb is not None:  # borrowed during the create only
            self._cbfile = None
            cb.close()

    # ---- closing ----

    def close(self) -> None:
        """Free the appender: positions queued and not committed are dropped (as
        fkvf_appender_free), the lock is released. Idempotent."""
        with self._lock:
            self._closed = True
            h, self._h = self._h, None
            self._queue = []
            if h:
                lib.fkvf_appender_free(h)
            cb, self._cbfile = self._cbfile, None
            if cb is not None:
                cb.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "Appender":
        self._live()
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        try:
            if exc_type is None and not self._closed:
                self.commit()
        finally:
            self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        if self._closed:
            return f"<fkvf.Appender {self.path!r} closed>"
        try:
            i = self.info
        except FkvfError as e:
            return f"<fkvf.Appender {self.path!r} failed: {e.name}>"
        return (f"<fkvf.Appender {self.path!r} {i['n_positions']} positions, "
                f"{i['pending']} pending>")

    def _live(self) -> None:
        if self._closed:
            raise ValueError(f"{self.path}: operation on a closed appender")
        if self._failed is not None:
            raise self._failed

    def _check(self, rc: int) -> None:
        if rc != _lib.OK:
            raise _appender_error(self._h, rc, self.path)

    # ---- appending ----

    def append(self, k: Any, v: Any = None, tokens: Any = None) -> None:
        """Queue new positions: k and v of any form fkvf accepts for a cache ([L, H, t, D]
        arrays, or per-layer lists of [1, H, t, D] / [H, t, D]; NumPy, torch, DLPack; the
        appender's layout), converted to the archive's dtype; or, with v left out, k a whole
        cache as fkvf.pack takes one (a per-layer list of (k, v) pairs, a DynamicCache, a
        (K, V) pair). tokens: one id per position, required exactly when the archive has a
        token stream. The positions become part of the file at commit() (libfkvf writes a
        large queue ahead, past the committed end: a torn tail until then)."""
        if v is None:
            k, v = _cache.split_cache(k)
        with self._lock:
            self._live()
            rows, shape, code = _cache.cache_rows(
                k, v, self._layout, None if self._dtype is None else _cache.NAME_OF[self._dtype])
            got = (shape.n_layers, shape.n_kv_heads, shape.key_dim, shape.value_dim)
            if self._shape is not None:
                for name, g, want in zip(("n_layers", "n_kv_heads", "key_dim", "value_dim"),
                                         got, self._shape):
                    if g != want:
                        raise ValueError(f"k, v: {name} is {g}, the archive {self.path} has "
                                         f"{want}")
            T = shape.n_positions
            toks = _cache.tokens_array(tokens, T)
            has = self._has_tokens if self._has_tokens is not None else toks is not None
            if has and toks is None:
                raise ValueError(f"tokens: {self.path} has a token stream: give one id per "
                                 "position appended")
            if not has and toks is not None:
                raise ValueError(f"tokens: {self.path} has no token stream (create it with "
                                 "tokens=True to store ids)")
            if toks is not None and toks.size and self._token_max is not None and \
                    int(toks.max()) > self._token_max:
                raise ValueError(f"tokens: id {int(toks.max())} does not fit the token stream "
                                 f"of {self.path} (ids 0..{self._token_max})")
            if self._h is None:
                # a create waiting for its shape: it is this append's (committed first)
                self._fit_codebook(got)
                # per-layer lists (Hugging Face's form): half-split pairs unless given
                self._keys.hf_default(isinstance(k, (list, tuple)))
                self._keys.desc_fields(got[2])  # rope_dims against key_dim, before queuing
                self._shape, self._dtype, self._has_tokens = got, code, has
                if T:
                    self._queue.append((rows, toks))
                return
            if T == 0:
                return
            self._check(lib.fkvf_appender_append(
                self._h, rows.ctypes.data, rows.nbytes, T,
                None if toks is None else toks.ctypes.data))

    def commit(self) -> None:
        """Write the queued positions as one commit (nothing queued: nothing written). With
        sync="commit" the commit is durable when this returns. A create without shape= makes
        the file here, at its first commit."""
        with self._lock:
            self._live()
            if self._h is None:
                if not self._queue:
                    return
                try:
                    self._create()
                    for rows, toks in self._queue:
                        self._check(lib.fkvf_appender_append(
                            self._h, rows.ctypes.data, rows.nbytes, rows.shape[0],
                            None if toks is None else toks.ctypes.data))
                except FkvfError as e:
                    self._failed = e
                    raise
                finally:
                    self._queue = []
            self._check(lib.fkvf_appender_commit(self._h))

    def sync(self) -> None:
        """Make every commit durable (for sync="none"); a failed sync fails the handle."""
        with self._lock:
            self._live()
            if self._h is not None:
                self._check(lib.fkvf_appender_sync(self._h))

    @property
    def info(self) -> Dict[str, Any]:
        """fkvf_append_info as a dict: n_positions and n_archived (committed), pending
        (queued), commit_seq, file_size (committed bytes), recovered_bytes, has_tokens,
        has_codebook. Before a deferred create's first commit: zeros and what is queued."""
        with self._lock:
            self._live()
            if self._h is None:
                return dict(n_positions=0, n_archived=0,
                            pending=sum(r.shape[0] for r, _ in self._queue), commit_seq=0,
                            file_size=0, recovered_bytes=0, has_tokens=bool(self._has_tokens),
                            has_codebook=self._cbfile is not None)
            i = _lib.AppendInfo()
            self._check(lib.fkvf_appender_info(self._h, byref(i)))
            out: Dict[str, Any] = {n: int(getattr(i, n)) for n, _ in i._fields_}
            out["has_tokens"] = bool(i.has_tokens)
            out["has_codebook"] = bool(i.has_codebook)
            return out

    @property
    def n_positions(self) -> int:
        """Positions committed (queued ones are in info["pending"])."""
        return self.info["n_positions"]

    @property
    def pending(self) -> int:
        """Positions queued and not committed."""
        return self.info["pending"]


def _stream_max(si: Dict[str, Any]) -> int:
    """The largest symbol a stream's codec holds (Archive.streams entry)."""
    if si["profile"] == "ngon":
        return int(si["alphabet"]) - 1
    bits = int(si["symbol_bits"])
    return (1 << bits) - 1 if bits < 32 else _U32

