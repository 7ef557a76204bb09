"""fkvf: FKVF archives of transformer KV caches, over libfkvf (ctypes) and NumPy.

    import fkvf
    with fkvf.open("cache.fkvf") as a:
        k, v = a.read(positions=slice(0, 64), dtype="f32")   # [L, H, T, D] each
"""

from . import errors
from ._lib import version as _version
from .archive import Archive, open
from .errors import *  # noqa: F401,F403  (FkvfError and its subclasses)
from .errors import FkvfError

__version__ = _version()

__all__ = ["open", "Archive", "FkvfError", "errors", "__version__"] + [
    c.__name__ for c in errors.BY_CODE.values()]
