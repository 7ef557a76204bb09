"""The install paths of the Python package (pypkg): `pip install
--no-build-isolation` of python/ (offline, Debian's setuptools) and the site
directory `cmake --install` chooses (cmake/python_site_dir.py). The cmake
install itself, with fkvf/_paths.py, is checked by tests/install_test.sh.
Environment (tests/python_binding.sh): FKVF_SRCDIR, FKVF_LIBRARY."""
import ctypes
import os
import shutil
import subprocess
import sys

import pytest

SRC = os.environ.get("FKVF_SRCDIR") or os.path.join(os.path.dirname(__file__), "..", "..")
SITE_DIR_PY = os.path.join(SRC, "cmake", "python_site_dir.py")


def library_version() -> str:
    """fkvf_version_string() of the library under test, called directly."""
    path = os.environ.get("FKVF_LIBRARY")
    if not path:
        pytest.skip("FKVF_LIBRARY not set (tests/python_binding.sh sets it)")
    lib = ctypes.CDLL(path)
    lib.fkvf_version_string.restype = ctypes.c_char_p
    lib.fkvf_version_string.argtypes = []
    return lib.fkvf_version_string().decode("ascii")


@pytest.fixture
def source_copy(tmp_path):
    """python/ and the header its version comes from, in a scratch tree
    (pip builds in the source directory: keep the repository clean)."""
    root = tmp_path / "src"
    shutil.copytree(os.path.join(SRC, "python"), root / "python",
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests"))
    (root / "libfkvf" / "include").mkdir(parents=True)
    shutil.copy(os.path.join(SRC, "libfkvf", "include", "fkvf.h"), root / "libfkvf" / "include")
    return root


def pip_install(source_copy, target):
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.fail(f"{sys.executable} has no pip: the documented install needs it "
                    "(Debian: python3-pip)")
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
         "--no-index", "--target", str(target), str(source_copy / "python")],
        capture_output=True, text=True, cwd=str(source_copy))


def test_pip_install_offline_gives_the_c_library_version(source_copy, tmp_path):
    want = library_version()
    target = tmp_path / "site"
    r = pip_install(source_copy, target)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / f"fkvf-{want}.dist-info" / "METADATA").is_file(), sorted(os.listdir(target))
    meta = (target / f"fkvf-{want}.dist-info" / "METADATA").read_text()
    assert f"\nVersion: {want}\n" in meta
    assert "\nRequires-Dist: numpy" in meta
    # every module of the package is installed, and nothing else of python/
    src_mods = sorted(f for f in os.listdir(os.path.join(SRC, "python", "fkvf")) if f.endswith(".py")
                      and f != "_paths.py")
    got_mods = sorted(f for f in os.listdir(target / "fkvf") if f.endswith(".py"))
    assert got_mods == src_mods
    assert sorted(p for p in os.listdir(target) if not p.endswith(".dist-info")) == ["fkvf"]


def test_pip_installed_package_imports_from_its_site(source_copy, tmp_path):
    want = library_version()
    target = tmp_path / "site"
    r = pip_install(source_copy, target)
    assert r.returncode == 0, r.stdout + r.stderr
    env = dict(os.environ, PYTHONPATH=str(target), PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", "import fkvf; print(fkvf.__file__); print(fkvf.__version__)"],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    file, version = r.stdout.split()
    assert file == str(target / "fkvf" / "__init__.py")
    assert version == want


def test_pip_install_without_the_header_says_why(source_copy, tmp_path):
    os.remove(source_copy / "libfkvf" / "include" / "fkvf.h")
    r = pip_install(source_copy, tmp_path / "site")
    assert r.returncode != 0
    assert "cannot read the version from" in r.stdout + r.stderr
    assert "fkvf.h" in r.stdout + r.stderr


def site_dir(prefix, pythonpath=None):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    r = subprocess.run([sys.executable, SITE_DIR_PY, str(prefix)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_cmake_site_dir_of_a_prefix_python_does_not_search(tmp_path):
    v = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert site_dir(tmp_path / "prefix") == f"lib/{v}/site-packages"


def test_cmake_site_dir_is_the_one_python_searches(tmp_path):
    # a dist-packages directory of the prefix on the search path wins
    d = tmp_path / "prefix" / "lib" / "python3" / "dist-packages"
    d.mkdir(parents=True)
    assert site_dir(tmp_path / "prefix", str(d)) == "lib/python3/dist-packages"
    # but not a directory of another prefix below it, nor one that is not a site directory
    other = tmp_path / "prefix" / "local" / "lib" / "python3" / "dist-packages"
    other.mkdir(parents=True)
    plain = tmp_path / "prefix" / "lib" / "python3"
    v = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert site_dir(tmp_path / "prefix", f"{other}:{plain}") == f"lib/{v}/site-packages"


@pytest.mark.skipif(not os.path.isdir("/usr/lib/python3/dist-packages")
                    or "/usr/lib/python3/dist-packages" not in sys.path,
                    reason="not Debian's layout (/usr/lib/python3/dist-packages not searched)")
def test_cmake_site_dir_for_usr_is_debians():
    assert site_dir("/usr") == "lib/python3/dist-packages"
