"""The ctypes structures of fkvf/_lib.py against fkvf.h: a small C program compiled here
prints sizeof and offsetof of every field bound (skipped when no C compiler is installed);
every Structure and every prototype of the package lives in _lib.py, and bind refuses a
second, different prototype of a name."""

import ctypes
import glob
import os
import re
import shutil
import subprocess

import pytest

from conftest import SRCDIR

def test_struct_layout_matches_header(fkvf, tmp_path):
    STRUCTS = fkvf._lib.STRUCTS
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to read the layout of fkvf.h")
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "fkvf.h"', "int main(void) {"]
    for py, c in STRUCTS.items():
        lines.append(f'printf("{py} sizeof %zu\\n", sizeof({c}));')  # not a field name
        for name, _ in getattr(fkvf._lib, py)._fields_:
            lines.append(f'printf("{py} {name} %zu %zu\\n", offsetof({c}, {name}), '
                         f'sizeof((({c} *)0)->{name}));')
    lines += ["return 0; }"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    inc = os.path.join(SRCDIR, "libfkvf", "include")
    subprocess.run([cc, "-std=c11", "-I", inc, str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    seen = 0
    for line in out.splitlines():
        parts = line.split()
        cls = getattr(fkvf._lib, parts[0])
        if len(parts) == 3 and parts[1] == "sizeof":
            assert ctypes.sizeof(cls) == int(parts[2]), parts[0]
        else:
            field = getattr(cls, parts[1])
            assert (field.offset, field.size) == (int(parts[2]), int(parts[3])), parts[:2]
        seen += 1
    assert seen == sum(1 + len(getattr(fkvf._lib, p)._fields_) for p in STRUCTS)


def test_every_structure_is_checked(fkvf):
    """Each ctypes Structure of _lib.py is in STRUCTS (so the layout test covers it)."""
    mine = {n for n, c in vars(fkvf._lib).items()
            if isinstance(c, type) and issubclass(c, ctypes.Structure)
            and c.__module__ == fkvf._lib.__name__}
    assert mine == set(fkvf._lib.STRUCTS)
    assert len(mine) == 27


def test_structures_and_bindings_only_in_lib(fkvf):
    """No other module of the package defines a Structure or binds a C function."""
    pkg = os.path.dirname(fkvf.__file__)
    files = sorted(glob.glob(os.path.join(pkg, "*.py")))
    assert len(files) >= 7
    for f in files:
        if os.path.basename(f) == "_lib.py":
            continue
        src = open(f, encoding="utf-8").read()
        assert not re.search(r"\(\s*(ctypes\.)?Structure\s*\)", src), f
        assert "bind(" not in src and "argtypes" not in src and "restype" not in src, f


def test_bind_refuses_a_second_different_prototype(fkvf):
    lib = fkvf._lib
    # the prototype the package bound, again: accepted, nothing changes
    lib.bind({"fkvf_reader_codebook": lib._PROTOS["fkvf_reader_codebook"]})
    assert lib.lib.fkvf_reader_codebook.argtypes[1] is ctypes.POINTER(lib.CodebookShape)

    class OtherShape(ctypes.Structure):
        _fields_ = lib.CodebookShape._fields_

    other = (ctypes.c_int, [lib.Reader, ctypes.POINTER(OtherShape), ctypes.POINTER(ctypes.c_void_p),
                            ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_uint8)])
    with pytest.raises(TypeError, match="fkvf_reader_codebook bound twice"):
        lib.bind({"fkvf_reader_codebook": other})
    # the first binding stands: a call with the package's structure still works
    assert lib.lib.fkvf_reader_codebook.argtypes[1] is ctypes.POINTER(lib.CodebookShape)
    with pytest.raises(TypeError, match="fkvf_version_number bound twice"):
        lib.bind({"fkvf_version_number": (ctypes.c_int, [])})
    assert lib.lib.fkvf_version_number.restype is ctypes.c_uint


def test_every_bound_function_exists_and_is_bound(fkvf):
    """Each prototype of _PROTOS names a function of the library, bound as written."""
    lib = fkvf._lib
    for name, (res, args) in lib._PROTOS.items():
        f = getattr(lib.lib, name)
        assert f.restype is res or (res is None and f.restype is None), name
        assert list(f.argtypes) == list(args), name
