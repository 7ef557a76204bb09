"""FkvfError and one subclass per FKVF_E_* code of fkvf.h.

Every error the library reports is raised as the subclass of its code, so callers can catch
one kind (``except fkvf.ChecksumError``) or all (``except fkvf.FkvfError``). The fields come
from fkvf_error_info: code, name ("FKVF_E_CORRUPT"), error class ("usage", "format",
"encode"), message (names the file, offset and field), file, offset (None when the error
has none), clause (spec clause such as "11.4", or None) and field (or None).
"""

from __future__ import annotations

from typing import Dict, Optional, Type

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
    code = 1
class StateError(FkvfError):
    code = 2
class NoMemError(FkvfError):
    code = 3
class IoError(FkvfError):
    """FKVF_E_IO (not "IOError": that is a builtin alias of OSError)."""
    code = 4
class RangeError(FkvfError):
    code = 5
class NotFoundError(FkvfError):
    code = 6
class UnsupportedError(FkvfError):
    code = 7
class ExistsError(FkvfError):
    code = 8
class BadMagicError(FkvfError):
    code = 20
class VersionError(FkvfError):
    code = 21
class FeatureError(FkvfError):
    code = 22
class ByteOrderError(FkvfError):
    code = 23
class TruncatedError(FkvfError):
    code = 24
class ChecksumError(FkvfError):
    code = 25
class AlignError(FkvfError):
    code = 26
class BoundsError(FkvfError):
    code = 27
class OverlapError(FkvfError):
    code = 28
class PaddingError(FkvfError):
    code = 29
class SectionError(FkvfError):
    code = 30
class CorruptError(FkvfError):
    code = 31
class DupKeyError(FkvfError):
    code = 32
class SymbolError(FkvfError):
    code = 33
class SpanError(FkvfError):
    code = 34
class TornError(FkvfError):
    code = 35
class LimitError(FkvfError):
    code = 36
class CodebookError(FkvfError):
    code = 37
class DeflateError(FkvfError):
    code = 38
class ChainError(FkvfError):
    code = 39
class CodecError(FkvfError):
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
