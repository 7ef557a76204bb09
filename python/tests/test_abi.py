"""The ctypes structures of fkvf/_lib.py against fkvf.h: a small C program compiled here
prints sizeof and offsetof of every field bound (skipped when no C compiler is installed)."""

import ctypes
import os
import shutil
import subprocess

import pytest

from conftest import SRCDIR

STRUCTS = {
    "ErrorInfo": "fkvf_error_info",
    "ArchiveInfo": "fkvf_archive_info",
    "Desc": "fkvf_desc",
    "MetaEntry": "fkvf_meta_entry",
    "StreamInfo": "fkvf_stream_info",
    "ReadRequest": "fkvf_read_request",
}


def test_struct_layout_matches_header(fkvf, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to read the layout of fkvf.h")
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "fkvf.h"', "int main(void) {"]
    for py, c in STRUCTS.items():
        lines.append(f'printf("{py} size %zu\\n", sizeof({c}));')
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
        if parts[1] == "size":
            assert ctypes.sizeof(cls) == int(parts[2]), parts[0]
        else:
            field = getattr(cls, parts[1])
            assert (field.offset, field.size) == (int(parts[2]), int(parts[3])), parts[:2]
        seen += 1
    assert seen == sum(1 + len(getattr(fkvf._lib, p)._fields_) for p in STRUCTS)
