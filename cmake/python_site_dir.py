"""Prints where `cmake --install --prefix PREFIX` puts the Python package
fkvf for the interpreter running this script, relative to PREFIX:

  1. the first directory of the interpreter's own search path that is
     PREFIX/lib/<python...>/site-packages or dist-packages (Debian: prefix
     /usr gives lib/python3/dist-packages, /usr/local gives
     lib/python3.X/dist-packages; ~/.local the user site once it exists);
  2. otherwise the posix_prefix scheme's purelib for PREFIX
     (lib/python3.X/site-packages: the user site for ~/.local, and for
     another prefix the directory to put on PYTHONPATH).
usage: python3 python_site_dir.py PREFIX"""
import os
import sys
import sysconfig


def site_dir(prefix: str) -> str:
    prefix = os.path.realpath(prefix)
    for entry in sys.path:
        if not entry:
            continue
        rel = os.path.relpath(os.path.realpath(entry), prefix)
        parts = rel.split(os.sep)
        if (len(parts) == 3 and parts[0] == "lib" and parts[1].startswith("python")
                and parts[2] in ("site-packages", "dist-packages")):
            return rel
    purelib = sysconfig.get_path("purelib", "posix_prefix",
                                 vars={"base": prefix, "platbase": prefix})
    return os.path.relpath(purelib, prefix)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python_site_dir.py PREFIX")
    print(site_dir(sys.argv[1]))
