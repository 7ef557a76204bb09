"""Shared fixtures: the library (FKVF_LIBRARY), the CLI (FKVF_CLI), the source tree
(FKVF_SRCDIR), and readers of the CLI's output files that do not use the code under test."""

import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

SRCDIR = os.path.abspath(os.environ.get(
    "FKVF_SRCDIR", os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))
sys.path.insert(0, os.path.join(SRCDIR, "python"))
CLI = os.environ.get("FKVF_CLI", os.path.join(SRCDIR, "build", "tools", "fkvf"))
SAMPLE = os.path.join(SRCDIR, "testdata", "sample.fkvf")


def run_cli(*args, check=True):
    if not os.path.exists(CLI):
        pytest.skip(f"the fkvf CLI is not built ({CLI}; set FKVF_CLI)")
    p = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"fkvf {' '.join(map(str, args))}: exit {p.returncode}: {p.stderr}")
    return p


def cli_info(path):
    return json.loads(run_cli("info", "--json", path).stdout)


_ST_DTYPES = {"F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F32": np.dtype("<f4"),
              "I32": np.dtype("<i4"), "I64": np.dtype("<i8"), "U32": np.dtype("<u4")}


def load_safetensors(path):
    """The tensors of a .safetensors file, parsed here (8-byte length, JSON header, data)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[base + a:base + b], dtype=_ST_DTYPES[t["dtype"]]).reshape(
            t["shape"])
    return out


def unpack(tmp_path, archive, dtype=None, fmt="safetensors", extra=()):
    """fkvf unpack of archive: ([L, H, T, Dk] keys, [L, H, T, Dv] values, tokens or None)."""
    out = tmp_path / f"unpacked-{dtype or 'native'}-{len(list(tmp_path.iterdir()))}.{fmt}"
    args = ["unpack", archive, "-o", out, "--names", "fkvf", *extra]
    if dtype:
        args += ["--dtype", dtype]
    run_cli(*args)
    t = load_safetensors(out) if fmt == "safetensors" else dict(np.load(out))
    n_layers = sum(1 for k in t if k.endswith(".key"))
    k = np.stack([t[f"layers.{i}.key"] for i in range(n_layers)])
    v = np.stack([t[f"layers.{i}.value"] for i in range(n_layers)])
    if fmt == "npz" and dtype == "bf16":
        k, v = k.view(np.uint16), v.view(np.uint16)
    return k, v, t.get("tokens")


@pytest.fixture(scope="session")
def fkvf():
    import fkvf as mod
    return mod


@pytest.fixture(scope="session")
def sample_unpacked(tmp_path_factory):
    d = tmp_path_factory.mktemp("unpack")
    return {dt: unpack(d, SAMPLE, dt) for dt in ("f16", "f32", "bf16")}


@pytest.fixture
def sample_copy(tmp_path):
    p = tmp_path / "sample.fkvf"
    shutil.copyfile(SAMPLE, p)
    return p
