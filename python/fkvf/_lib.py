"""Finding and loading libfkvf with ctypes, and the prototypes of the functions bound.

Search order (the first that exists and loads wins):
  1. FKVF_LIBRARY: a path to the shared library (when set, only that one);
  2. the build tree: FKVF_BUILD_DIR/libfkvf/libfkvf.so, then ../build/libfkvf/libfkvf.so
     relative to this package (python/fkvf in the source tree);
  3. an installed copy: what ``cmake --install`` records in fkvf/_paths.py (LIBRARY, the
     path of the library, or LIBDIR, the directory holding libfkvf.so / libfkvf.so.0),
     then ctypes.util.find_library("fkvf").

The structures mirror libfkvf/include/fkvf.h field for field.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_int, c_int64, c_size_t,
                    c_uint, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p)
from typing import List, Optional

_SONAME = "libfkvf.so"


def _candidates() -> List[str]:
    out: List[str] = []
    build = os.environ.get("FKVF_BUILD_DIR")
    if build:
        out.append(os.path.join(build, "libfkvf", _SONAME))
    here = os.path.dirname(os.path.abspath(__file__))
    out.append(os.path.join(here, os.pardir, os.pardir, "build", "libfkvf", _SONAME))
    try:
        from . import _paths  # type: ignore[attr-defined]
        lib = getattr(_paths, "LIBRARY", None)
        if lib:
            out.append(os.fspath(lib))
        libdir = getattr(_paths, "LIBDIR", None)
        if libdir:
            out += [os.path.join(os.fspath(libdir), _SONAME),
                    os.path.join(os.fspath(libdir), _SONAME + ".0")]
    except ImportError:
        pass
    found = ctypes.util.find_library("fkvf")
    if found:
        out.append(found)
    return out


def _load() -> ctypes.CDLL:
    env = os.environ.get("FKVF_LIBRARY")
    # an explicit FKVF_LIBRARY that does not load is an error, not a fallback to another copy
    candidates = [env] if env else _candidates()
    tried = []
    for path in candidates:
        # a bare soname from find_library is not a path: the loader searches for it
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path}: no such file")
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError("fkvf: cannot load libfkvf (set FKVF_LIBRARY to the path of "
                      "libfkvf.so); tried: " + "; ".join(tried or ["nothing"]))


# ---- structures (fkvf.h) ------------------------------------------------------

class ErrorInfo(Structure):
    _fields_ = [("code", c_int), ("offset", c_uint64), ("clause", c_char_p),
                ("file", c_char_p), ("message", c_char_p), ("field", c_char_p)]


class ArchiveInfo(Structure):
    _fields_ = [("format_major", c_uint16), ("format_minor", c_uint16),
                ("required_features", c_uint64), ("optional_features", c_uint64),
                ("file_size", c_uint64), ("committed_size", c_uint64),
                ("torn_bytes", c_uint64), ("n_commits", c_uint64),
                ("n_positions", c_uint64), ("n_archived", c_uint64),
                ("n_sections", c_size_t), ("n_streams", c_size_t), ("has_desc", c_int)]


class Desc(Structure):
    # fkvf_dtype is a C enum: int-sized with GCC/Clang on every ABI we target
    _fields_ = [("n_layers", c_uint32), ("n_kv_heads", c_uint32), ("key_dim", c_uint32),
                ("value_dim", c_uint32), ("dtype", c_int), ("key_transform", c_uint8),
                ("rope_layout", c_uint8), ("key_storage", c_uint8), ("rope_dims", c_uint32),
                ("rope_theta", c_double), ("n_sinks", c_uint32), ("window", c_uint32),
                ("model_id", c_char_p), ("tokenizer_id", c_char_p),
                ("weights_hash_kind", c_uint8), ("weights_hash", c_uint8 * 32)]


class MetaEntry(Structure):
    _fields_ = [("key", POINTER(c_char)), ("key_len", c_size_t), ("type", c_int),
                ("value", c_void_p), ("value_len", c_size_t), ("u64", c_uint64),
                ("i64", c_int64), ("f64", c_double)]


class StreamInfo(Structure):
    _fields_ = [("id", c_uint64), ("profile", c_int), ("symbol_bits", c_uint),
                ("alphabet", c_uint32), ("span_symbols", c_uint32), ("r", c_double),
                ("align", c_uint32), ("length", c_uint64), ("n_segments", c_size_t),
                ("stored_bytes", c_uint64)]


class ReadRequest(Structure):
    _fields_ = [("first", c_uint64), ("count", c_uint64), ("layer_first", c_uint32),
                ("layer_count", c_uint32), ("head_first", c_uint32), ("head_count", c_uint32),
                ("parts", c_uint), ("dtype", c_int), ("layout", c_int)]


# ---- constants (fkvf.h) --------------------------------------------------------

OK = 0
E_INVALID_ARG = 1
E_RANGE = 5
E_NOT_FOUND = 6
E_CODEBOOK = 37
ERROR_NO_OFFSET = 2**64 - 1
OPEN_STRICT = 1
DTYPE_F16, DTYPE_BF16, DTYPE_F32 = 1, 2, 3
PART_KEYS, PART_VALUES = 1, 2
LAYOUT_ROWS, LAYOUT_HEADS = 0, 1
META_U64, META_I64, META_F64, META_BOOL, META_UTF8, META_BYTES = 1, 2, 3, 4, 5, 6
STREAM_ID_TOKENS = 1 << 56

lib = _load()
Reader = c_void_p  # fkvf_reader *, opaque

_PROTOS = {
    "fkvf_version_number": (c_uint, []),
    "fkvf_version_string": (c_char_p, []),
    "fkvf_strerror": (c_char_p, [c_int]),
    "fkvf_error_name": (c_char_p, [c_int]),
    "fkvf_error_class": (c_int, [c_int]),
    "fkvf_reader_open_file": (c_int, [POINTER(Reader), c_char_p, c_uint, c_void_p]),
    "fkvf_reader_free": (None, [Reader]),
    "fkvf_reader_error": (c_int, [Reader, POINTER(ErrorInfo)]),
    "fkvf_reader_file_name": (c_char_p, [Reader]),
    "fkvf_reader_info": (c_int, [Reader, POINTER(ArchiveInfo)]),
    "fkvf_reader_desc": (c_int, [Reader, POINTER(Desc)]),
    "fkvf_reader_meta_count": (c_int, [Reader, POINTER(c_size_t)]),
    "fkvf_reader_meta": (c_int, [Reader, c_size_t, POINTER(MetaEntry)]),
    "fkvf_reader_stream_count": (c_int, [Reader, POINTER(c_size_t)]),
    "fkvf_reader_stream_info": (c_int, [Reader, c_size_t, POINTER(StreamInfo)]),
    "fkvf_reader_stream_find": (c_int, [Reader, c_uint64, POINTER(c_size_t)]),
    "fkvf_reader_stream_read": (c_int, [Reader, c_size_t, c_uint64, POINTER(c_uint32),
                                        c_size_t]),
    "fkvf_reader_codebook_ref": (c_int, [Reader, POINTER(c_int), POINTER(c_uint8),
                                         POINTER(c_char_p)]),
    "fkvf_reader_attach_codebook": (c_int, [Reader, Reader]),
    "fkvf_reader_find_codebook": (c_int, [Reader, c_char_p, POINTER(Reader)]),
    "fkvf_reader_row_bytes": (c_int, [Reader, c_int, POINTER(c_size_t)]),
    "fkvf_reader_read_size": (c_int, [Reader, POINTER(ReadRequest), POINTER(c_size_t)]),
    "fkvf_reader_read": (c_int, [Reader, POINTER(ReadRequest), c_void_p, c_size_t]),
    "fkvf_reader_is_exact": (c_int, [Reader, c_uint64, POINTER(c_int)]),
    "fkvf_reader_verify": (c_int, [Reader]),
}



def bind(protos: dict) -> None:
    """Set restype and argtypes of each function named in protos ({name: (restype,
    [argtypes])}). Each module binds the functions it calls (archive: the reader's, here)."""
    for name, (res, args) in protos.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


bind(_PROTOS)


def version() -> str:
    """The version string of the loaded libfkvf (e.g. "0.1.0")."""
    return lib.fkvf_version_string().decode()


def text(p: Optional[bytes]) -> Optional[str]:
    """A C string (bytes or None) as str, invalid UTF-8 replaced."""
    return None if p is None else p.decode("utf-8", "replace")
