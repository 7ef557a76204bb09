"""The package's version: the C library's, FKVF_VERSION_STRING of
libfkvf/include/fkvf.h beside this directory (everything else is in
pyproject.toml)."""
import os
import re

from setuptools import setup

HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                      "libfkvf", "include", "fkvf.h")


def c_library_version() -> str:
    try:
        with open(HEADER, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SystemExit(f"fkvf setup: cannot read the version from {HEADER}: {e} "
                         "(build from the repository's python/ directory)")
    m = re.search(r'^#define FKVF_VERSION_STRING "([0-9]+\.[0-9]+\.[0-9]+)"', text, re.M)
    if not m:
        raise SystemExit(f"fkvf setup: {HEADER}: no FKVF_VERSION_STRING \"X.Y.Z\"")
    return m.group(1)


setup(version=c_library_version())
