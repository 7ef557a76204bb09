"""fkvf.compact: an archive rewritten as one commit (fkvf_archive_compact, `fkvf compact`)."""

from __future__ import annotations

import os
from ctypes import byref
from typing import Any, Dict, Optional, Union

from . import _lib
from ._lib import lib
from ._keys import threads_arg
from .archive import Archive
from .errors import from_handle

PathLike = Union[str, bytes, "os.PathLike[str]"]


def compact(path: PathLike, out: Optional[PathLike] = None, *, in_place: bool = False,
            codebooks: Optional[PathLike] = None, overwrite: bool = False,
            sync: bool = True, threads: Optional[int] = None) -> Dict[str, Any]:
    """Rewrite the archive at path as one commit into out, as ``fkvf compact PATH -o OUT``
    does: the same positions, the same restored bits, without what later commits superseded
    (the exact rows of positions that have left the recent window since, older directories
    and trailers). An archive grown by an Appender one commit per token keeps every such
    row, so it can be larger than the raw cache until it is compacted.

    out: the new file (never path itself; an existing file is ExistsError unless
    overwrite=True). in_place=True (out None): replace path itself, atomically (locked as an
    Appender locks it: IoError while one has it open). codebooks: the codebook file of an
    archive that refers to one (default: found as fkvf.open finds it). sync: the result is
    made durable before it is renamed into place. threads: the threads the search indexes
    are rebuilt on (fkvf_compact_options.n_threads): None is the environment's
    FKVF_THREADS, else every CPU the process may run on; the file is the same for every
    count.

    Returns fkvf_compact_result as a dict: path (the file written), commits_before,
    size_before, torn_bytes, positions, archived, exact, size, search_indexes. Errors: the
    FkvfError of the library's error (the reader's, the writer's), with its file and offset;
    on failure out (or path in place) is untouched."""
    src = os.fsdecode(os.fspath(path))
    if in_place and out is not None:
        raise ValueError("compact: out= and in_place=True exclude each other")
    if not in_place and out is None:
        raise ValueError("compact: give out= (a new file) or in_place=True")
    dst = None if out is None else os.fsdecode(os.fspath(out))
    nthreads = threads_arg(threads)
    # the archive opened as fkvf.open opens it, for its codebook file (found by hash or
    # given); its errors (not an archive, no codebook file) are the open's
    with Archive(src, codebooks=codebooks) as arch:
        if arch.descriptor is None:
            raise ValueError(f"{src}: a codebook file, not an archive")
        if arch._codebook_error is not None:
            raise arch._codebook_error  # its codebook file was not found (NotFoundError)
        opts = _lib.CompactOptions()
        lib.fkvf_compact_options_init(byref(opts))
        opts.in_place = 1 if in_place else 0
        opts.no_replace = 0 if overwrite or in_place else 1
        opts.sync = _lib.SYNC_COMMIT if sync else _lib.SYNC_NONE
        opts.codebook_file = arch._cb
        opts.n_threads = nthreads
        res = _lib.CompactResult()
        op = _lib.ArchiveOp()
        try:
            rc = lib.fkvf_archive_compact(byref(op), os.fsencode(src),
                                          None if dst is None else os.fsencode(dst),
                                          byref(opts), byref(res))
            if rc != _lib.OK:
                raise from_handle(lib.fkvf_archive_op_error, op.value, rc, dst or src)
            out_d = {name: getattr(res, name) for name, _ in res._fields_}
            out_d["path"] = _lib.text(res.path) or (dst or src)
            return out_d
        finally:
            lib.fkvf_archive_op_free(op)
