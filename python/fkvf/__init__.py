"""STAND-IN (pypkg) for the packaging tests, replaced by pycore's package:
loads libfkvf with ctypes and gives its version."""
import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _library_path() -> str:
    env = os.environ.get("FKVF_LIBRARY")
    if env:
        return env
    build = os.path.join(_HERE, os.pardir, os.pardir, "build", "libfkvf", "libfkvf.so")
    if os.path.exists(build):
        return build
    from . import _paths  # written by cmake --install
    return _paths.LIBRARY


_lib = ctypes.CDLL(_library_path())
_lib.fkvf_version_string.restype = ctypes.c_char_p
_lib.fkvf_version_string.argtypes = []
__version__ = _lib.fkvf_version_string().decode("ascii")
