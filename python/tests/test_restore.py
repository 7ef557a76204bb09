"""Archive.restore (fkvf_reader_restore's rows) and Archive.exact, against fkvf unpack of the
same archive and fkvf info; expected rows are assembled here element by element."""

import numpy as np
import pytest

from conftest import SAMPLE, cli_info, run_cli


def rows_by_loops(k, v):
    L, H, T, _ = k.shape
    out = []
    for t in range(T):
        row = []
        for layer in range(L):
            for h in range(H):
                row.extend(k[layer, h, t].tolist())
            for h in range(H):
                row.extend(v[layer, h, t].tolist())
        out.append(row)
    return np.array(out, dtype=k.dtype)


@pytest.mark.parametrize("dt", ["f16", "f32", "bf16"])
def test_restore_equals_unpack(fkvf, sample_unpacked, dt):
    k, v, _ = sample_unpacked[dt]
    want = rows_by_loops(k, v)
    with fkvf.open(SAMPLE) as a:
        got = a.restore(dtype=dt)
        assert got.shape == want.shape and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(a.restore(slice(10, 40), dtype=dt), want[10:40])
        np.testing.assert_array_equal(a.restore(slice(-5, None), dtype=dt), want[-5:])
        assert a.restore(slice(7, 7)).shape == (0, want.shape[1])


def test_restore_refuses_selections(fkvf):
    with fkvf.open(SAMPLE) as a:
        with pytest.raises(ValueError, match="step 1"):
            a.restore(slice(0, 10, 2))
        with pytest.raises(TypeError, match="slice"):
            a.restore([1, 2, 3])
        with pytest.raises(ValueError, match="dtype"):
            a.restore(dtype="int8")
    with pytest.raises(ValueError, match="closed"):
        a.restore()


def test_exact_mask_matches_info_and_is_exact(fkvf, tmp_path):
    info = cli_info(SAMPLE)
    with fkvf.open(SAMPLE) as a:
        m = a.exact
        assert m.dtype == bool and m.shape == (a.n_positions,)
        assert [a.is_exact(t) for t in range(a.n_positions)] == m.tolist()
    # the sample: 4 sinks, then the archived positions, then the recent window
    assert int(m.sum()) == info["positions"] - info["archived"]
    assert m[:4].all() and not m[4:4 + info["archived"]].any() and m[4 + info["archived"]:].all()
    # a lossless archive: every position exact
    out = tmp_path / "lossless.fkvf"
    run_cli("unpack", SAMPLE, "-o", tmp_path / "s.safetensors")
    run_cli("pack", tmp_path / "s.safetensors", "-o", out, "--sinks", "1000000", "--no-rope")
    with fkvf.open(out) as a:
        assert a.exact.all()
