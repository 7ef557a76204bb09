"""fkvf.open and what it reports: .info, .descriptor, .tokens, .metadata, .streams against
`fkvf info --json` of the same archive (catches a ctypes struct that does not match fkvf.h)."""

import gc
import os

import numpy as np
import pytest

from conftest import SAMPLE, cli_info


def test_version(fkvf):
    assert fkvf.__version__.count(".") == 2
    assert fkvf.__version__ == fkvf._lib.version()


def test_info_matches_cli(fkvf):
    j = cli_info(SAMPLE)
    with fkvf.open(SAMPLE) as a:
        i = a.info
        assert f"{i['format_major']}.{i['format_minor']}" == j["format"]
        for mine, cli in [("required_features", "required_features"),
                          ("optional_features", "optional_features"),
                          ("file_size", "file_size"), ("committed_size", "committed_size"),
                          ("torn_bytes", "torn_bytes"), ("n_commits", "commits"),
                          ("n_positions", "positions"), ("n_archived", "archived"),
                          ("n_sections", "sections"), ("n_streams", "streams")]:
            assert i[mine] == j[cli], mine
        assert i["has_desc"] == 1
        assert a.n_positions == j["positions"] == 100
        assert i["file_size"] == os.path.getsize(SAMPLE)


def test_descriptor_matches_cli(fkvf):
    c = cli_info(SAMPLE)["cache"]
    with fkvf.open(SAMPLE) as a:
        d = a.descriptor
    assert (d["n_layers"], d["n_kv_heads"], d["key_dim"], d["value_dim"]) == (
        c["layers"], c["kv_heads"], c["key_dim"], c["value_dim"])
    assert d["dtype"] == c["dtype"]
    assert (d["n_sinks"], d["window"]) == (c["sinks"], c["window"])
    assert d["model_id"] == c["model_id"] and d["tokenizer_id"] == c["tokenizer_id"]
    assert d["weights_hash"] is None and c["weights_hash"] is None
    rope = c["rope"]
    assert d["key_transform"] == 1
    assert d["rope_theta"] == rope["theta"] and d["rope_dims"] == rope["dims"]
    assert d["rope_layout"] == {"interleaved": 1, "half-split": 2}[rope["layout"]]
    assert d["key_storage"] == {"pre-rope": 1, "as-is": 0}[rope["keys"]]


def test_metadata_matches_cli(fkvf):
    j = cli_info(SAMPLE)["metadata"]
    with fkvf.open(SAMPLE) as a:
        m = a.metadata
    assert m == j
    assert m["sample.synthetic"] is True and m["sample.generator"] == "fkvf-mksample"


def test_streams_match_cli(fkvf):
    j = cli_info(SAMPLE)["stream_list"]
    with fkvf.open(SAMPLE) as a:
        s = a.streams
    assert len(s) == len(j) == 121
    for mine, cli in zip(s, j):
        assert mine["name"] == cli["name"]
        assert mine["id"] == cli["id"]
        assert mine["profile"] == cli["profile"]
        assert mine["length"] == cli["symbols"]
        assert mine["symbol_bits"] == cli["bits"] and mine["alphabet"] == cli["alphabet"]
        assert mine["span_symbols"] == cli["span"]
        assert mine["stored_bytes"] == cli["bytes"]
    assert s[-1]["kind"] == "tokens" and s[0]["kind"] == "index"
    assert (s[6]["layer"], s[6]["head"], s[6]["part"], s[6]["stage"]) == (0, 1, "k", 0)


def test_tokens_match_unpack(fkvf, sample_unpacked):
    _, _, toks = sample_unpacked["f16"]
    with fkvf.open(SAMPLE) as a:
        t = a.tokens
        assert t is a.tokens  # read once
    assert t.dtype == np.uint32 and t.shape == (100,)
    assert toks is not None and np.array_equal(t, toks.reshape(-1).astype(np.uint32))
    assert t[0] == 1  # BOS of the llama2.c tokenizer, as written by fkvf-mksample


def test_is_exact(fkvf):
    with fkvf.open(SAMPLE) as a:
        # 4 sinks, a recent window of 32: positions 0..3 and 68..99 exact
        assert [a.is_exact(p) for p in (0, 3, 4, 67, 68, 99)] == [True, True, False, False,
                                                                  True, True]


def test_context_manager_and_close(fkvf):
    with fkvf.open(SAMPLE) as a:
        assert not a.closed
    assert a.closed
    a.close()  # idempotent
    assert "closed" in repr(a)


def test_closed_archive_raises(fkvf):
    a = fkvf.open(SAMPLE)
    a.close()
    for call in (lambda: a.info, lambda: a.descriptor, lambda: a.n_positions,
                 lambda: a.tokens, lambda: a.streams, lambda: a.metadata, lambda: a.read(),
                 lambda: a.verify(), lambda: a.is_exact(0)):
        with pytest.raises(ValueError, match="closed"):
            call()
    with pytest.raises(ValueError, match="closed"):
        with a:
            pass


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def _mappings_of(path):
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith(real))


def test_no_leak_open_close_1000(fkvf):
    before = _open_fds()
    maps_before = _mappings_of(SAMPLE)
    for _ in range(1000):
        a = fkvf.open(SAMPLE)
        a.read(positions=0, layers=0)
        a.close()
    for _ in range(200):
        fkvf.open(SAMPLE)  # dropped without close: __del__ frees it
    gc.collect()
    assert _open_fds() <= before + 1
    assert _mappings_of(SAMPLE) == maps_before
    with fkvf.open(SAMPLE):
        assert _mappings_of(SAMPLE) == maps_before + 1  # the check can see a mapping


def test_verify_ok(fkvf):
    with fkvf.open(SAMPLE, strict=True) as a:
        assert a.verify() is None


def _import_in_child(env_overrides):
    import subprocess
    import sys
    from conftest import SRCDIR
    env = {k: v for k, v in os.environ.items() if k not in ("FKVF_LIBRARY", "FKVF_BUILD_DIR")}
    env.update(env_overrides)
    env["PYTHONPATH"] = os.path.join(SRCDIR, "python")
    return subprocess.run([sys.executable, "-c", "import fkvf; print(fkvf._lib.lib._name)"],
                          capture_output=True, text=True, env=env, cwd="/")


def test_library_from_fkvf_library(fkvf):
    lib = os.environ.get("FKVF_LIBRARY")
    if not lib:
        pytest.skip("FKVF_LIBRARY not set")
    p = _import_in_child({"FKVF_LIBRARY": os.path.abspath(lib)})
    assert p.returncode == 0 and p.stdout.strip() == os.path.abspath(lib)


def test_library_missing_is_import_error(fkvf, tmp_path):
    missing = str(tmp_path / "libfkvf.so")
    p = _import_in_child({"FKVF_LIBRARY": missing})
    assert p.returncode != 0
    assert "ImportError" in p.stderr and missing in p.stderr and "FKVF_LIBRARY" in p.stderr
