"""Finding and loading libfkvf with ctypes, and the prototypes of the functions bound.

Search order (the first that exists and loads wins):
  1. FKVF_LIBRARY: a path to the shared library (when set, only that one);
  2. the build tree: FKVF_BUILD_DIR/libfkvf/libfkvf.so, then ../build/libfkvf/libfkvf.so
     relative to this package (python/fkvf in the source tree);
  3. an installed copy: what ``cmake --install`` records in fkvf/_paths.py (LIBRARY, the
     path of the library, or LIBDIR, the directory holding libfkvf.so / libfkvf.so.0.4),
     then ctypes.util.find_library("fkvf").

The structures mirror libfkvf/include/fkvf.h field for field.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int64,
                    c_size_t, c_uint, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p)
from typing import List, Optional

_SONAME = "libfkvf.so"


def _candidates() -> List[str]:
    out: List[str] = []
    build = os.environ.get("FKVF_BUILD_DIR")
    if build:
        out.append(os.path.join(build, "libfkvf", _SONAME))
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, os.pardir, os.pardir)
    if os.path.exists(os.path.join(src, "libfkvf", "include", "fkvf.h")):  # the source tree
        out.append(os.path.join(src, "build", "libfkvf", _SONAME))
    try:
        from . import _paths  # type: ignore[attr-defined]
        lib = getattr(_paths, "LIBRARY", None)
        if lib:
            out.append(os.fspath(lib))
        libdir = getattr(_paths, "LIBDIR", None)
        if libdir:
            d = os.fspath(libdir)
            # the development link, then the runtime names (libfkvf.so.0.4, ...)
            out += [os.path.join(d, _SONAME)] + sorted(
                glob.glob(os.path.join(glob.escape(d), _SONAME + ".*")), reverse=True)
    except ImportError:
        pass
    found = ctypes.util.find_library("fkvf")
    if found:
        out.append(found)
    else:
        out.append("")  # "": the dynamic loader found none (_load says so)
    return out


def _load() -> ctypes.CDLL:
    env = os.environ.get("FKVF_LIBRARY")
    # an explicit FKVF_LIBRARY that does not load is an error, not a fallback to another copy
    candidates = [env] if env else _candidates()
    tried = []
    for path in candidates:
        if path == "":
            tried.append("the dynamic loader's search path: no libfkvf (install it, or add "
                         "its directory to LD_LIBRARY_PATH)")
            continue
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


class CompactOptions(Structure):
    _fields_ = [("in_place", c_int), ("no_replace", c_int), ("mode", c_uint), ("sync", c_uint),
                ("codebook_file", c_void_p), ("alloc", c_void_p), ("progress", c_void_p),
                ("progress_opaque", c_void_p), ("n_threads", c_uint)]


class CompactResult(Structure):
    _fields_ = [("path", c_char_p), ("commits_before", c_uint64), ("size_before", c_uint64),
                ("torn_bytes", c_uint64), ("positions", c_uint64), ("archived", c_uint64),
                ("exact", c_uint64), ("size", c_uint64), ("search_indexes", c_size_t)]


class ReadRequest(Structure):
    _fields_ = [("first", c_uint64), ("count", c_uint64), ("layer_first", c_uint32),
                ("layer_count", c_uint32), ("head_first", c_uint32), ("head_count", c_uint32),
                ("parts", c_uint), ("dtype", c_int), ("layout", c_int)]


class SectionInfo(Structure):
    _fields_ = [("type", c_uint32), ("flags", c_uint32), ("offset", c_uint64),
                ("stored_size", c_uint64), ("size", c_uint64), ("key", c_uint64),
                ("checksum", c_uint64), ("commit_seq", c_uint64)]


class SectionAdd(Structure):
    _fields_ = [("type", c_uint32), ("flags", c_uint32), ("key", c_uint64),
                ("data", c_void_p), ("size", c_size_t)]


class Match(Structure):
    _fields_ = [("position", c_uint64), ("length", c_uint64)]


class KeyQuery(Structure):
    _fields_ = [("layer", c_uint32), ("head", c_uint32), ("query", c_void_p), ("dim", c_size_t),
                ("first", c_uint64), ("end", c_uint64), ("m", c_size_t),
                ("candidates", c_uint32), ("chunk", c_uint64)]


class KeyHit(Structure):
    _fields_ = [("position", c_uint64), ("score", c_double)]


class KeyStats(Structure):
    _fields_ = [("centroids_scored", c_uint64), ("symbols_searched", c_uint64),
                ("candidates", c_uint64)]


class PrefixReuse(Structure):
    _fields_ = [("prefix_len", c_uint64), ("match_end", c_uint64), ("match_len", c_uint64),
                ("archive_positions", c_uint64)]


class CodebookShape(Structure):
    _fields_ = [("n_layers", c_uint32), ("n_heads", c_uint32), ("key_dim", c_uint32),
                ("value_dim", c_uint32), ("k", c_uint32), ("k_stages", c_uint8),
                ("v_stages", c_uint8), ("dtype", c_int), ("pooled", c_uint8),
                ("layer_stages", POINTER(c_uint8))]


class Rope(Structure):
    _fields_ = [("layout", c_uint8), ("rope_dims", c_uint32), ("theta", c_double)]


class Rows(Structure):
    _fields_ = [("data", c_void_p), ("n_rows", c_size_t), ("dtype", c_int),
                ("first_position", c_uint64)]


class RvqMetric(Structure):
    # the encoder metric (spec 13.8): per codebook table a D x D binary32 matrix, row-major
    _fields_ = [("keys", POINTER(c_float)), ("values", POINTER(c_float))]


class RvqParams(Structure):
    _fields_ = [("n_layers", c_uint32), ("n_kv_heads", c_uint32), ("key_dim", c_uint32),
                ("value_dim", c_uint32), ("k", c_uint32), ("k_stages", c_uint8),
                ("v_stages", c_uint8), ("pooled", c_uint8), ("table_dtype", c_int),
                ("seed", c_uint64), ("max_iters", c_uint32),
                ("samples_per_centroid", c_uint32), ("key_rope", POINTER(Rope)),
                ("progress", c_void_p), ("progress_opaque", c_void_p),
                ("layer_stages", POINTER(c_uint8)), ("metric", POINTER(RvqMetric)),
                ("n_threads", c_uint32)]


class WriterOptions(Structure):
    _fields_ = [("required_features", c_uint64), ("optional_features", c_uint64),
                ("block_size", c_uint32), ("deflate_level", c_int), ("sync", c_uint),
                ("no_replace", c_int), ("mode", c_uint)]


class StreamSpec(Structure):
    _fields_ = [("profile", c_int), ("symbol_bits", c_uint), ("alphabet", c_uint32),
                ("r", c_double), ("span_symbols", c_uint32)]


class KeySettings(Structure):
    _fields_ = [("pre_rope", c_uint8), ("no_rope", c_uint8), ("layout", c_uint8),
                ("dims", c_uint32), ("theta", c_double), ("keys_set", c_uint8),
                ("theta_set", c_uint8), ("dims_set", c_uint8), ("layout_set", c_uint8),
                ("layout_taken", c_uint8)]


class KeyClash(Structure):
    _fields_ = [("setting", c_char_p), ("trained", c_char * 32), ("given", c_char * 32)]


class AppendOptions(Structure):
    _fields_ = [("sync", c_uint), ("beam_width", c_uint), ("block_size", c_uint32),
                ("codebook_file", c_void_p), ("recover", c_int), ("io", c_void_p),
                ("compact_ratio", c_double), ("no_auto_compact", c_int), ("n_threads", c_uint)]


class AppendCreate(Structure):
    _fields_ = [("desc", POINTER(Desc)), ("codebook", c_void_p),
                ("codebook_ref", c_void_p), ("codebook_name", c_char_p),
                ("index_codec", StreamSpec), ("token_codec", StreamSpec)]


class AppendInfo(Structure):
    _fields_ = [("n_positions", c_uint64), ("n_archived", c_uint64), ("pending", c_uint64),
                ("commit_seq", c_uint64), ("file_size", c_uint64),
                ("recovered_bytes", c_uint64), ("has_tokens", c_int), ("has_codebook", c_int)]


# each Structure above and the fkvf.h type it mirrors (python/tests/test_abi.py checks
# every one's size and field offsets against the header)
STRUCTS = {
    "ErrorInfo": "fkvf_error_info", "ArchiveInfo": "fkvf_archive_info", "Desc": "fkvf_desc",
    "MetaEntry": "fkvf_meta_entry", "StreamInfo": "fkvf_stream_info",
    "ReadRequest": "fkvf_read_request", "SectionInfo": "fkvf_section_info",
    "SectionAdd": "fkvf_section_add",
    "CompactOptions": "fkvf_compact_options", "CompactResult": "fkvf_compact_result",
    "Match": "fkvf_match", "PrefixReuse": "fkvf_prefix_reuse",
    "KeyQuery": "fkvf_key_query", "KeyHit": "fkvf_key_hit", "KeyStats": "fkvf_key_stats",
    "CodebookShape": "fkvf_codebook_shape", "Rope": "fkvf_rope", "Rows": "fkvf_rows",
    "RvqMetric": "fkvf_rvq_metric", "RvqParams": "fkvf_rvq_params",
    "WriterOptions": "fkvf_writer_options",
    "StreamSpec": "fkvf_stream_spec", "KeySettings": "fkvf_key_settings",
    "KeyClash": "fkvf_key_clash", "AppendOptions": "fkvf_append_options",
    "AppendCreate": "fkvf_append_create", "AppendInfo": "fkvf_append_info",
}


# ---- constants (fkvf.h) --------------------------------------------------------

OK = 0
E_INVALID_ARG = 1
E_RANGE = 5
E_NOT_FOUND = 6
E_EXISTS = 8
E_CODEBOOK = 37
ERROR_NO_OFFSET = 2**64 - 1
OPEN_STRICT = 1
OPEN_READ = 2  # FKVF_OPEN_READ: the file read into memory the reader owns, not mapped
DTYPE_F16, DTYPE_BF16, DTYPE_F32 = 1, 2, 3
PART_KEYS, PART_VALUES = 1, 2
LAYOUT_ROWS, LAYOUT_HEADS = 0, 1
META_U64, META_I64, META_F64, META_BOOL, META_UTF8, META_BYTES = 1, 2, 3, 4, 5, 6
STREAM_ID_TOKENS = 1 << 56
PROFILE_QUAD, PROFILE_NGON = 1, 2
ROPE_INTERLEAVED, ROPE_HALF_SPLIT = 1, 2
ROPE_LAYOUTS = {"interleaved": ROPE_INTERLEAVED, "half-split": ROPE_HALF_SPLIT}
FEAT_NGON, FEAT_DEFLATE, FEAT_EXTERNAL_CODEBOOK, FEAT_LAYER_STAGES = 1, 2, 4, 8
OPTFEAT_TOKEN_STREAM, OPTFEAT_ENCODER_METRIC = 1, 2
METRIC_DIM_MAX = 1024  # the largest key_dim / value_dim of a metric's part (spec 13.8)
# fkvf_metric_matrix_check's findings (fkvf.h)
METRIC_NONFINITE = 1
METRIC_NOT_PD = 3
SECTION_DEFLATE = 2
SECTION_EXAC = 0x43415845  # FKVF_FOURCC('E', 'X', 'A', 'C')
SECTION_ZPOS = 0x534F505A  # FKVF_FOURCC('Z', 'P', 'O', 'S'): fkvf_search_index_build's type
SYNC_COMMIT, SYNC_NONE = 0, 1

lib = _load()
Reader = c_void_p  # fkvf_reader *, opaque
Writer = c_void_p  # fkvf_writer *
Rvq = c_void_p  # fkvf_rvq *
Search = c_void_p  # fkvf_search *
KeySearch = c_void_p  # fkvf_key_search *
Appender = c_void_p  # fkvf_appender *
ArchiveOp = c_void_p  # fkvf_archive_op *
KEY_CANDIDATES_MAX = 1024  # FKVF_KEY_CANDIDATES_MAX

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
    "fkvf_compact_options_init": (None, [POINTER(CompactOptions)]),
    "fkvf_archive_compact": (c_int, [POINTER(ArchiveOp), c_char_p, c_char_p,
                                     POINTER(CompactOptions), POINTER(CompactResult)]),
    "fkvf_archive_op_error": (c_int, [ArchiveOp, POINTER(ErrorInfo)]),
    "fkvf_archive_op_free": (None, [ArchiveOp]),
    "fkvf_archive_append_sections": (c_int, [POINTER(ArchiveOp), c_char_p, POINTER(SectionAdd),
                                             c_size_t, c_uint]),
    "fkvf_search_index_build": (c_int, [Reader, c_size_t, POINTER(c_void_p), POINTER(c_size_t),
                                        POINTER(c_uint64), c_void_p]),
    "fkvf_search_buffer_free": (None, [c_void_p, c_void_p]),
    "fkvf_reader_restore": (c_int, [Reader, c_uint64, c_uint64, c_int, c_void_p, c_size_t]),
    "fkvf_reader_set_threads": (c_int, [Reader, c_uint]),
    "fkvf_reader_is_exact": (c_int, [Reader, c_uint64, POINTER(c_int)]),
    "fkvf_reader_verify": (c_int, [Reader]),
    "fkvf_reader_codebook": (c_int, [Reader, POINTER(CodebookShape), POINTER(c_void_p),
                                     POINTER(c_size_t), POINTER(c_uint8)]),
    "fkvf_codebook_key_settings": (c_int, [Reader, c_uint32, POINTER(KeySettings),
                                           POINTER(KeyClash)]),
    "fkvf_reader_section": (c_int, [Reader, c_size_t, POINTER(SectionInfo)]),
    "fkvf_reader_section_data": (c_int, [Reader, c_size_t, POINTER(c_void_p),
                                         POINTER(c_size_t)]),
    "fkvf_reader_exact_row": (c_int, [Reader, c_uint64, POINTER(c_void_p),
                                      POINTER(c_size_t)]),
    # search
    "fkvf_search_open": (c_int, [POINTER(Search), Reader, c_size_t, c_uint, c_void_p]),
    "fkvf_search_free": (None, [Search]),
    "fkvf_search_error": (c_int, [Search, POINTER(ErrorInfo)]),
    "fkvf_search_suffix": (c_int, [Search, POINTER(c_uint32), c_size_t, POINTER(c_uint64),
                                   c_size_t, POINTER(c_uint64)]),
    "fkvf_search_longest": (c_int, [Search, POINTER(c_uint32), c_size_t, c_size_t,
                                    POINTER(Match), POINTER(c_size_t)]),
    "fkvf_search_context": (c_int, [Reader, c_size_t, c_uint64, c_size_t, POINTER(c_uint32),
                                    POINTER(c_size_t)]),
    "fkvf_search_prefix_reuse": (c_int, [Reader, POINTER(c_uint32), c_size_t,
                                         POINTER(PrefixReuse)]),
    "fkvf_search_keys_open": (c_int, [POINTER(KeySearch), Reader, c_void_p]),
    "fkvf_search_keys_free": (None, [KeySearch]),
    "fkvf_search_keys_error": (c_int, [KeySearch, POINTER(ErrorInfo)]),
    "fkvf_search_keys": (c_int, [KeySearch, POINTER(KeyQuery), POINTER(KeyHit),
                                 POINTER(c_size_t), POINTER(KeyStats)]),
    # codebooks and RVQ
    "fkvf_codebook_size": (c_uint64, [POINTER(CodebookShape)]),
    "fkvf_codebook_tables_offset": (c_uint64, [POINTER(CodebookShape)]),
    "fkvf_codebook_auto_k": (c_uint32, [POINTER(CodebookShape), c_uint32, c_uint64]),
    "fkvf_codebook_pays": (c_int, [POINTER(CodebookShape), c_uint32, c_uint64, c_uint64,
                                   POINTER(c_double)]),
    "fkvf_quad_bits_for": (c_uint, [c_uint64]),
    "fkvf_rvq_params_init": (None, [POINTER(RvqParams)]),
    "fkvf_rvq_train": (c_int, [POINTER(Rvq), POINTER(RvqParams), POINTER(Rows), c_size_t,
                               c_void_p]),
    "fkvf_rvq_from_tables": (c_int, [POINTER(Rvq), POINTER(CodebookShape), c_uint32,
                                     c_void_p, c_size_t, c_void_p]),
    "fkvf_rvq_free": (None, [Rvq]),
    "fkvf_rvq_set_threads": (c_int, [Rvq, c_uint]),
    "fkvf_cpu_count": (c_uint, []),
    "fkvf_rvq_shape": (None, [Rvq, POINTER(CodebookShape), POINTER(c_uint32)]),
    "fkvf_rvq_tables_size": (c_size_t, [Rvq]),
    "fkvf_rvq_tables": (c_int, [Rvq, c_void_p, c_size_t]),
    "fkvf_rvq_codes_per_position": (c_size_t, [Rvq]),
    "fkvf_rvq_encode": (c_int, [Rvq, POINTER(Rows), POINTER(Rope), c_uint, c_void_p,
                                c_size_t, c_size_t]),
    "fkvf_rvq_set_metric": (c_int, [Rvq, POINTER(RvqMetric)]),
    "fkvf_metric_matrix_check": (c_int, [c_void_p, c_uint32, POINTER(c_size_t)]),
    "fkvf_rvq_get_metric": (c_int, [Rvq, POINTER(RvqMetric)]),
    "fkvf_reader_metric": (c_int, [Reader, POINTER(RvqMetric)]),
    # writer
    "fkvf_writer_options_init": (None, [POINTER(WriterOptions)]),
    "fkvf_writer_create_file": (c_int, [POINTER(Writer), c_char_p, POINTER(WriterOptions),
                                        c_void_p]),
    "fkvf_writer_free": (None, [Writer]),
    "fkvf_writer_error": (c_int, [Writer, POINTER(ErrorInfo)]),
    "fkvf_writer_set_desc": (c_int, [Writer, POINTER(Desc)]),
    "fkvf_writer_meta_u64": (c_int, [Writer, c_char_p, c_uint64]),
    "fkvf_writer_meta_i64": (c_int, [Writer, c_char_p, c_int64]),
    "fkvf_writer_meta_f64": (c_int, [Writer, c_char_p, c_double]),
    "fkvf_writer_meta_bool": (c_int, [Writer, c_char_p, c_int]),
    "fkvf_writer_meta_utf8": (c_int, [Writer, c_char_p, c_char_p]),
    "fkvf_writer_meta_bytes": (c_int, [Writer, c_char_p, c_void_p, c_size_t]),
    "fkvf_writer_add_exact": (c_int, [Writer, c_uint64, c_uint64, c_void_p, c_size_t, c_uint]),
    "fkvf_writer_add_index_segment": (c_int, [Writer, POINTER(StreamSpec), c_uint64, c_uint64,
                                              c_void_p, c_size_t, c_size_t]),
    "fkvf_writer_add_token_segment": (c_int, [Writer, POINTER(StreamSpec), c_uint64, c_void_p,
                                              c_size_t]),
    "fkvf_writer_add_codebooks": (c_int, [Writer, POINTER(CodebookShape), c_void_p, c_size_t,
                                          c_uint]),
    "fkvf_writer_add_codebook_ref": (c_int, [Writer, POINTER(CodebookShape), POINTER(c_uint8),
                                             c_char_p]),
    "fkvf_writer_add_metric": (c_int, [Writer, POINTER(RvqMetric), c_uint]),
    "fkvf_writer_set_positions": (c_int, [Writer, c_uint64, c_uint64]),
    "fkvf_writer_finish": (c_int, [Writer]),
    # appender
    "fkvf_append_options_init": (None, [POINTER(AppendOptions)]),
    "fkvf_appender_create": (c_int, [POINTER(Appender), c_char_p, POINTER(AppendCreate),
                                     POINTER(AppendOptions), c_void_p]),
    "fkvf_appender_open": (c_int, [POINTER(Appender), c_char_p, POINTER(AppendOptions),
                                   c_void_p]),
    "fkvf_appender_append": (c_int, [Appender, c_void_p, c_size_t, c_size_t, c_void_p]),
    "fkvf_appender_commit": (c_int, [Appender]),
    "fkvf_appender_sync": (c_int, [Appender]),
    "fkvf_appender_info": (c_int, [Appender, POINTER(AppendInfo)]),
    "fkvf_appender_error": (c_int, [Appender, POINTER(ErrorInfo)]),
    "fkvf_appender_free": (None, [Appender]),
    # conversion
    "fkvf_convert": (c_int, [c_int, c_void_p, c_int, c_void_p, c_size_t]),
}



_BOUND: dict = {}


def bind(protos: dict) -> None:
    """Set restype and argtypes of each function named in protos ({name: (restype,
    [argtypes])}). Every prototype of the package is in _PROTOS, bound here once; a second
    binding of a name with another prototype raises TypeError (at import: two modules
    would each break the other's calls), the same prototype again is a no-op."""
    for name, proto in protos.items():
        res, args = proto
        proto = (res, tuple(args))
        old = _BOUND.get(name)
        if old is not None:
            if old != proto:
                raise TypeError(f"fkvf: {name} bound twice with different prototypes: "
                                f"{old} and {proto}")
            continue
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = list(args)
        _BOUND[name] = proto


bind(_PROTOS)

# The structures above are those of fkvf.h 0.4 (fkvf_codebook_shape and
# fkvf_rvq_params grew in 0.2.0, again in 0.3.0 (its metric) and 0.4.0 (n_threads;
# fkvf_append_options and fkvf_compact_options too): a
# library of another 0.x release has other layouts, and calls through them would
# read and write past its structs.
_ABI = (0, 4)
_v = lib.fkvf_version_number()
if (_v // 10000, _v // 100 % 100) != _ABI:
    raise ImportError(f"fkvf: the loaded libfkvf is {_v // 10000}.{_v // 100 % 100}."
                      f"{_v % 100}, this binding needs {_ABI[0]}.{_ABI[1]}.x (set FKVF_LIBRARY to "
                      "the path of a matching libfkvf.so)")


def version() -> str:
    """The version string of the loaded libfkvf (e.g. "0.4.0")."""
    return lib.fkvf_version_string().decode()


def text(p: Optional[bytes]) -> Optional[str]:
    """A C string (bytes or None) as str, invalid UTF-8 replaced."""
    return None if p is None else p.decode("utf-8", "replace")
