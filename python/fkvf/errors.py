"""FkvfError and one subclass per FKVF_E_* code of fkvf.h.

Every error the library reports is raised as the subclass of its code, so callers can catch
one kind (``except fkvf.ChecksumError``) or all (``except fkvf.FkvfError``). The fields come
from fkvf_error_info: code, name ("FKVF_E_CORRUPT"), error class ("usage", "format",
"encode"), message (names the file, offset and field), file, offset (None when the error
has none), clause (spec clause such as "11.4", or None) and field (or None).
"""

from __future__ import annotations

from ctypes import byref
from typing import Any, Callable, Dict, Optional, Type

from . import _lib

_CLASS_NAMES = {1: "usage", 2: "format", 3: "encode"}


class FkvfError(Exception):
    """An error reported by libfkvf."""

    code: int = -1

    def __init__(self, code: int, name: str, error_class: str, message: str,
                 file: Optional[str] = None, offset: Optional[int] = None,
                 clause: Optional[str] = None, field: Optional[str] = None) -> None:
        super().__init__(message)
        self.code = code
        self.name = name
        self.error_class = error_class
        self.message = message
        self.file = file
        self.offset = offset
        self.clause = clause
        self.field = field

    def __str__(self) -> str:
        # libfkvf's messages end with the error name already
        return self.message if self.name in self.message else f"{self.message} [{self.name}]"


class InvalidArgError(FkvfError):
    """FKVF_E_INVALID_ARG (1): bad argument (NULL, out of range, inconsistent)."""

    code = 1


class StateError(FkvfError):
    """FKVF_E_STATE (2): handle in the wrong state, or not a handle of this kind."""

    code = 2


class NoMemError(FkvfError):
    """FKVF_E_NOMEM (3): allocation failed."""

    code = 3


class IoError(FkvfError):
    """FKVF_E_IO (4): operating-system I/O error.

    Not named "IOError": that is a builtin alias of OSError."""

    code = 4


class RangeError(FkvfError):
    """FKVF_E_RANGE (5): position, index or stream out of range."""

    code = 5


class NotFoundError(FkvfError):
    """FKVF_E_NOT_FOUND (6): no such section, stream, key, file."""

    code = 6


class UnsupportedError(FkvfError):
    """FKVF_E_UNSUPPORTED (7): valid request this build cannot do."""

    code = 7


class ExistsError(FkvfError):
    """FKVF_E_EXISTS (8): the output file exists and was not to be replaced
    (fkvf_writer_options.no_replace, fkvf_appender_create)."""

    code = 8


class BadMagicError(FkvfError):
    """FKVF_E_BAD_MAGIC (20): not an FKVF file (spec 3.1)."""

    code = 20


class VersionError(FkvfError):
    """FKVF_E_VERSION (21): format major version not supported (spec 3.1, 17)."""

    code = 21


class FeatureError(FkvfError):
    """FKVF_E_FEATURE (22): unknown required feature bit (spec 3.1)."""

    code = 22


class ByteOrderError(FkvfError):
    """FKVF_E_BYTE_ORDER (23): byte-order check failed (spec 3.1)."""

    code = 23


class TruncatedError(FkvfError):
    """FKVF_E_TRUNCATED (24): file or structure ends early (spec 7.2)."""

    code = 24


class ChecksumError(FkvfError):
    """FKVF_E_CHECKSUM (25): an XXH3 checksum does not match."""

    code = 25


class AlignError(FkvfError):
    """FKVF_E_ALIGN (26): structure not at a multiple of 64 (spec 4.1)."""

    code = 26


class BoundsError(FkvfError):
    """FKVF_E_BOUNDS (27): section outside the file or its commit region (spec 4.5)."""

    code = 27


class OverlapError(FkvfError):
    """FKVF_E_OVERLAP (28): sections overlap or are out of order (spec 4.5)."""

    code = 28


class PaddingError(FkvfError):
    """FKVF_E_PADDING (29): padding or unused bits not zero (spec 4.1, 11.7)."""

    code = 29


class SectionError(FkvfError):
    """FKVF_E_SECTION (30): unknown required section type (spec 4.3)."""

    code = 30


class CorruptError(FkvfError):
    """FKVF_E_CORRUPT (31): a field holds an invalid value."""

    code = 31


class DupKeyError(FkvfError):
    """FKVF_E_DUP_KEY (32): duplicate metadata key (spec 9.2)."""

    code = 32


class SymbolError(FkvfError):
    """FKVF_E_SYMBOL (33): symbol out of its alphabet."""

    code = 33


class SpanError(FkvfError):
    """FKVF_E_SPAN (34): ngon span does not decode back to its anchor (spec 12.2)."""

    code = 34


class TornError(FkvfError):
    """FKVF_E_TORN (35): torn tail after the last valid commit (strict open, spec 7.2)."""

    code = 35


class LimitError(FkvfError):
    """FKVF_E_LIMIT (36): a limit of spec 15 is exceeded."""

    code = 36


class CodebookError(FkvfError):
    """FKVF_E_CODEBOOK (37): codebook missing or content hash mismatch (spec 13)."""

    code = 37


class DeflateError(FkvfError):
    """FKVF_E_DEFLATE (38): deflate stream invalid or wrong length (spec 4.4)."""

    code = 38


class ChainError(FkvfError):
    """FKVF_E_CHAIN (39): commit chain broken (spec 7.1)."""

    code = 39


class CodecError(FkvfError):
    """FKVF_E_CODEC (50): the writer refused data the codec cannot store exactly."""

    code = 50


BY_CODE: Dict[int, Type[FkvfError]] = {
    c.code: c for c in list(globals().values())
    if isinstance(c, type) and issubclass(c, FkvfError) and c is not FkvfError
}


def class_name(error_class: int) -> str:
    return _CLASS_NAMES.get(error_class, "unknown")


def make(code: int, name: str, error_class: int, message: str, file: Optional[str] = None,
         offset: Optional[int] = None, clause: Optional[str] = None,
         field: Optional[str] = None) -> FkvfError:
    """The FkvfError subclass of code (FkvfError itself for a code this module does not know)."""
    cls = BY_CODE.get(code, FkvfError)
    return cls(code, name, class_name(error_class), message, file, offset, clause, field)


def from_code(code: int, message: Optional[str] = None, path: Optional[str] = None
              ) -> FkvfError:
    """The FkvfError of a bare status code: "PATH: MESSAGE [FKVF_E_...]", as the library's
    messages end, or "PATH: <fkvf_strerror>" without a message (PATH left out when None).
    The generic text of the code is not added to a message that says what is wrong: for
    FKVF_E_CODEBOOK it reads "codebook missing or hash mismatch", wrong for a shape."""
    lib = _lib.lib
    name = _lib.text(lib.fkvf_error_name(code)) or ""
    text = f"{message} [{name}]" if message else (_lib.text(lib.fkvf_strerror(code)) or name)
    return make(code, name, lib.fkvf_error_class(code), f"{path}: {text}" if path else text,
                path)


def from_handle(get_error: Callable[[Any, Any], int], handle: Optional[int], code: int,
                path: Optional[str], prefix: str = "") -> FkvfError:
    """The FkvfError of a failed call on a libfkvf handle: get_error is the handle's
    fkvf_*_error function (fkvf_reader_error, fkvf_writer_error, fkvf_appender_error,
    fkvf_search_error); its fkvf_error_info gives the code, message, file (else path),
    offset, clause and field. prefix goes before the message. Without a handle or an error
    recorded in it: the prefix and fkvf_strerror's text of the code."""
    lib = _lib.lib
    if handle:
        info = _lib.ErrorInfo()
        if get_error(handle, byref(info)) == _lib.OK and info.code != _lib.OK:
            c = info.code
            offset = None if info.offset == _lib.ERROR_NO_OFFSET else int(info.offset)
            return make(c, _lib.text(lib.fkvf_error_name(c)) or "", lib.fkvf_error_class(c),
                        prefix + (_lib.text(info.message) or ""), _lib.text(info.file) or path,
                        offset, _lib.text(info.clause), _lib.text(info.field))
    if prefix:  # "writing the X failed: " + what the code means
        return from_code(code, prefix + (_lib.text(lib.fkvf_strerror(code)) or ""), path)
    return from_code(code, None, path)
