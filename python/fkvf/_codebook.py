"""A codebook file given by a caller (fkvf.pack(codebooks=), fkvf.Appender(create=True,
codebooks=)): opened, checked and fitted to a cache by one rule."""

from __future__ import annotations

import os
from ctypes import byref, c_size_t, c_uint8, c_void_p
from typing import Optional

from . import _lib
from ._keys import KeyOpts
from ._lib import lib
from .errors import from_code, from_handle


class CodebookFile:
    """An opened codebook file (from fkvf.train or ``fkvf train``): its reader handle,
    codebook shape, contents (address and size, owned by the reader) and content hash.
    Not a codebook file (an archive: it holds a cache descriptor): InvalidArgError; no
    codebook in it: CodebookError. close() frees the reader (idempotent)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = os.path.basename(path)
        r = _lib.Reader()
        rc = lib.fkvf_reader_open_file(byref(r), os.fsencode(path), 0, None)
        self.handle: Optional[int] = r.value
        try:
            if rc != _lib.OK:
                raise from_handle(lib.fkvf_reader_error, r.value, rc, path)
            info = _lib.ArchiveInfo()
            rc = lib.fkvf_reader_info(r, byref(info))
            if rc != _lib.OK:
                raise from_handle(lib.fkvf_reader_error, r.value, rc, path)
            if info.has_desc:
                raise from_code(_lib.E_INVALID_ARG, "not a codebook file (it holds a cache "
                                "descriptor: an archive? see fkvf.train)", path)
            self.shape = _lib.CodebookShape()
            contents, size = c_void_p(), c_size_t()
            h = (c_uint8 * 16)()
            rc = lib.fkvf_reader_codebook(r, byref(self.shape), byref(contents), byref(size), h)
            if rc != _lib.OK:
                raise from_handle(lib.fkvf_reader_error, r.value,
                                  _lib.E_CODEBOOK if rc == _lib.E_NOT_FOUND else rc, path,
                                  "no codebook: ")
            self.contents, self.size, self.content_hash = contents.value, size.value, bytes(h)
        except BaseException:
            self.close()
            raise

    def check_fit(self, n_layers: int, n_heads: int, key_dim: int, value_dim: int) -> None:
        """CodebookError unless the codebook fits a cache of this shape (a pooled one fits
        any head count)."""
        s = self.shape
        if (s.n_layers, s.key_dim, s.value_dim) != (n_layers, key_dim, value_dim) or \
                (not s.pooled and s.n_heads != n_heads):
            raise from_code(_lib.E_CODEBOOK, f"codebook shape {s.n_layers} layers x "
                            f"{s.n_heads} heads, dims {s.key_dim}/{s.value_dim} does not fit "
                            f"the cache ({n_layers} layers x {n_heads} heads, dims "
                            f"{key_dim}/{value_dim})", self.path)

    def settle_keys(self, keys: KeyOpts) -> None:
        """The key options settled by the codebook's training (KeyOpts.from_codebook)."""
        keys.from_codebook(self.handle, self.path, self.shape.key_dim)

    def close(self) -> None:
        h, self.handle = self.handle, None
        if h:
            lib.fkvf_reader_free(h)
