"""The one rule for key / RoPE options (fkvf.pack, fkvf.train, fkvf.Appender) and the
argument checks they share.

keys: None (default "pre-rope": keys archived un-rotated), "pre-rope" or "as-is".
rope: None (theta 10000 on every key dim; half-split pairs for a cache given as per-layer
pairs or DynamicCache-like, else interleaved), a dict or fkvf.Rope(theta, dims, layout)
(fields left None take those defaults), or False (the keys carry no RoPE). With a codebook
file its train.* settings are taken where none was given and a given one that contradicts
them is a CodebookError (fkvf_codebook_key_settings, the library's rule).
"""

from __future__ import annotations

import math
import os
from ctypes import byref
from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np

from . import _lib
from ._lib import lib
from .errors import from_code

# the argument each setting of fkvf_key_clash is
_CLASH_ARG = {"keys": "keys", "rope_theta": "rope theta", "rope_dims": "rope dims",
              "rope_layout": "rope layout"}


class Rope(NamedTuple):
    """How the cache's keys are rotated (RoPE): base theta, rotated dims (even; None = every
    key dim) and pair layout ("interleaved" pairs (2i, 2i+1), or "half-split" pairs
    (i, i + dims/2) as Hugging Face's rotate_half). A field left None takes the default:
    a --codebooks file's train.* setting, else 10000 / key_dim / the cache form's layout."""
    theta: Optional[float] = None
    dims: Optional[int] = None
    layout: Optional[str] = None


def int_arg(name: str, v: Any, lo: int, hi: int, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: a {type(v).__name__}, expected an int ({what})")
    if not lo <= int(v) <= hi:
        raise ValueError(f"{name}: {v} is not {what}")
    return int(v)


THREADS_MAX = 1024


def threads_arg(v: Any) -> int:
    """The thread count of a call that encodes, trains or restores, as the fkvf commands
    take it: an int 1..1024, or None for the environment's FKVF_THREADS, else every CPU
    the process may run on (fkvf_cpu_count). Results never depend on it."""
    if v is None:
        env = os.environ.get("FKVF_THREADS", "")
        if not env:
            return int(_lib.lib.fkvf_cpu_count())
        if not env.isdigit() or not 1 <= int(env) <= THREADS_MAX:
            raise ValueError(f"FKVF_THREADS={env!r} is not a number of threads, 1 to "
                             f"{THREADS_MAX}")
        return int(env)
    return int_arg("threads", v, 1, THREADS_MAX, f"a number of threads, 1 to {THREADS_MAX}")


def choice(name: str, v: Any, choices: Tuple[str, ...]) -> str:
    if not isinstance(v, str) or v not in choices:
        raise ValueError(f"{name}: {v!r} is not " + " or ".join(repr(c) for c in choices))
    return v


def str_arg(name: str, s: Any) -> str:
    """s, a str that can be a C string (no NUL character: it would end it): descriptor ids,
    metadata keys and values."""
    if not isinstance(s, str):
        raise TypeError(f"{name}: a {type(s).__name__}, expected a str")
    if "\0" in s:
        raise ValueError(f"{name}: holds a NUL character")
    return s


def path_arg(name: str, p: Any) -> str:
    if not isinstance(p, (str, os.PathLike)):
        raise TypeError(f"{name}: a {type(p).__name__}, expected a path (str or os.PathLike)")
    s = os.fspath(p)
    if not isinstance(s, str) or not s:
        raise ValueError(f"{name}: {p!r} is not a path")
    return s



class KeyOpts:
    """The key options as the CLI's cli_key_opts: each setting and whether it was given
    (a given one is checked against a codebook file's training, one not given taken from
    it)."""

    def __init__(self, keys: Optional[str], rope: Any) -> None:
        self.keys_set = keys is not None
        self.pre_rope = choice("keys", keys, ("pre-rope", "as-is")) == "pre-rope" \
            if keys is not None else True
        self.no_rope = rope is False
        self.theta, self.dims, self.layout = 10000.0, None, _lib.ROPE_INTERLEAVED
        self.theta_set = self.dims_set = self.layout_set = False
        self.layout_cb = False
        if rope is None or rope is False:
            return
        if isinstance(rope, dict):
            extra = set(rope) - {"theta", "dims", "layout"}
            if extra:
                raise ValueError(f"rope: unknown keys {sorted(extra)} (theta, dims, layout)")
            rope = Rope(**rope)
        if not isinstance(rope, Rope):
            raise TypeError(f"rope: a {type(rope).__name__}, expected None, False, a dict or "
                            "fkvf.Rope(theta=..., dims=..., layout=...)")
        if rope.theta is not None:
            if isinstance(rope.theta, bool) or not isinstance(rope.theta, (int, float)) or \
                    not math.isfinite(rope.theta) or rope.theta <= 0:
                raise ValueError(f"rope theta: {rope.theta!r} is not a positive number")
            self.theta, self.theta_set = float(rope.theta), True
        if rope.dims is not None:
            d = int_arg("rope dims", rope.dims, 2, 65536, "an even number >= 2")
            if d % 2:
                raise ValueError(f"rope dims: {d} is not an even number >= 2")
            self.dims, self.dims_set = d, True
        if rope.layout is not None:
            self.layout = _lib.ROPE_LAYOUTS[choice("rope layout", rope.layout,
                                                tuple(_lib.ROPE_LAYOUTS))]
            self.layout_set = True

    def hf_default(self, hf: bool) -> None:
        """Per-layer pairs and DynamicCache-like caches: half-split pairs (Hugging Face's
        rotate_half), as the CLI for Hugging Face tensor names."""
        if hf and not (self.layout_set or self.layout_cb or self.no_rope):
            self.layout = _lib.ROPE_HALF_SPLIT

    def rope_for(self, key_dim: int) -> Tuple[_lib.Rope, bool]:
        """The RoPE settings and whether keys are archived un-rotated (cli_key_rope)."""
        dims = self.dims if self.dims else key_dim
        if not self.no_rope and not self.dims and key_dim % 2:
            raise ValueError(f"rope: key_dim {key_dim} is odd, and RoPE rotates pairs of dims: "
                             f"give rope=fkvf.Rope(dims=N) (even, at most {key_dim - 1}) or "
                             "rope=False")
        if not self.no_rope and (dims > key_dim or dims % 2):
            raise ValueError(f"rope dims {dims} does not fit key_dim {key_dim} (even, at most "
                             "key_dim)")
        return _lib.Rope(self.layout, dims, self.theta), self.pre_rope and not self.no_rope

    def from_codebook(self, r: int, cbpath: str, key_dim: int) -> None:
        """The codebook file's train.* settings taken where not given; a given one that
        contradicts them refused (the library's rule, fkvf_codebook_key_settings, as
        fkvf pack --codebooks: its centroids are keys handled the other way)."""
        k = _lib.KeySettings(int(self.pre_rope), int(self.no_rope), self.layout, self.dims or 0,
                         self.theta, int(self.keys_set), int(self.theta_set),
                         int(self.dims_set), int(self.layout_set), 0)
        clash = _lib.KeyClash()
        rc = lib.fkvf_codebook_key_settings(r, key_dim, byref(k), byref(clash))
        self.pre_rope, self.layout = bool(k.pre_rope), k.layout
        self.dims, self.theta = k.dims or None, k.theta
        self.layout_cb = bool(k.layout_taken)
        if rc == _lib.OK:
            return
        if not clash.setting:
            raise from_code(rc, "the codebook's key settings", cbpath)
        opt = _CLASH_ARG.get(clash.setting.decode(), clash.setting.decode())
        trained, given = clash.trained.decode(), clash.given.decode()
        raise from_code(
            rc, f"trained with {opt} {trained}, and {opt} {given} was given: its centroids "
            f"are keys handled the other way; leave {opt} out (the codebook's setting is "
            "used), or train a codebook with it (fkvf.train)", cbpath)

    def desc_fields(self, key_dim: int) -> Dict[str, Any]:
        """The descriptor's key fields (spec 8) for these settings (rope_for's checks)."""
        if self.no_rope:
            return dict(key_transform=0, rope_layout=0, rope_dims=0, rope_theta=0.0,
                        key_storage=0)
        r, un_rotated = self.rope_for(key_dim)
        return dict(key_transform=1, rope_layout=r.layout, rope_dims=r.rope_dims,
                    rope_theta=r.theta, key_storage=1 if un_rotated else 0)
