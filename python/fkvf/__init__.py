"""fkvf: FKVF archives of transformer KV caches, over libfkvf (ctypes) and NumPy.

    import fkvf
    with fkvf.open("cache.fkvf") as a:
        k, v = a.read(positions=slice(0, 64), dtype="f32")   # [L, H, T, D] each

docs/python.md describes the API.
"""

from . import errors
from ._lib import version as _version
from .appender import Appender
from .archive import Archive, open
from .compact import compact
from ._keys import Rope
from .pack import pack, train
from .errors import (
    FkvfError, InvalidArgError, StateError, NoMemError, IoError, RangeError,
    NotFoundError, UnsupportedError, ExistsError, BadMagicError, VersionError,
    FeatureError, ByteOrderError, TruncatedError, ChecksumError, AlignError,
    BoundsError, OverlapError, PaddingError, SectionError, CorruptError, DupKeyError,
    SymbolError, SpanError, TornError, LimitError, CodebookError, DeflateError,
    ChainError, CodecError)

__version__ = _version()

__all__ = [
    "open", "Archive", "Appender", "pack", "train", "Rope", "compact", "errors", "__version__",
    "FkvfError", "InvalidArgError",
    "StateError", "NoMemError", "IoError", "RangeError", "NotFoundError",
    "UnsupportedError", "ExistsError", "BadMagicError", "VersionError", "FeatureError",
    "ByteOrderError", "TruncatedError", "ChecksumError", "AlignError", "BoundsError",
    "OverlapError", "PaddingError", "SectionError", "CorruptError", "DupKeyError",
    "SymbolError", "SpanError", "TornError", "LimitError", "CodebookError",
    "DeflateError", "ChainError", "CodecError"]
