"""read(copy=False): read-only views into the reader's mapping where the layout allows, equal
to `fkvf unpack`'s bytes and to read(); a copy where it must be; the reader kept alive by its
views after close() and freed when the last one goes."""

import gc
import weakref

import numpy as np
import pytest

from conftest import SAMPLE, run_cli, unpack

L, H, T, D = 5, 4, 100, 8   # testdata/sample.fkvf: f16, 4 sinks, 64 archived, 32 recent


def bits(a):
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def same(a, b):
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))


def is_view(a):
    """True when a's memory is a window of a reader's mapping (its base chain ends there)."""
    b = a
    while isinstance(b, np.ndarray) and b.base is not None:
        b = b.base
    return type(b).__name__ == "_Mapping"


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    return unpack(tmp_path_factory.mktemp("views"), SAMPLE)


SELECTIONS = [
    dict(positions=slice(68, 100)),                 # the whole recent window
    dict(positions=slice(0, 4)),                    # the sinks
    dict(positions=70),                             # one position
    dict(positions=-1),
    dict(positions=slice(70, 99, 3)),               # a progression
    dict(positions=np.array([80, 82, 84])),
    dict(positions=slice(68, 100), layers=slice(1, 4)),
    dict(positions=slice(68, 100), layers=[0, 2, 4], heads=slice(1, None, 2)),
    dict(positions=slice(90, 95), layers=3, heads=2),
    dict(positions=slice(90, 95), layers=[2, 2], heads=[1, 1, 1]),  # repeats: stride 0
    dict(positions=slice(90, 95), part="k"),
    dict(positions=slice(90, 95), part="v", heads=[3]),
    dict(positions=slice(68, 100), dtype=np.float16),  # the archive's own dtype
]


@pytest.mark.parametrize("sel", SELECTIONS, ids=range(len(SELECTIONS)))
def test_views_equal_copies_and_cli(fkvf, unpacked, sel):
    ek, ev, _ = unpacked
    with fkvf.open(SAMPLE) as a:
        got = a.read(copy=False, **sel)
        ref = a.read(**sel)
    parts = got if isinstance(got, tuple) else (got,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    part = sel.get("part", "kv")
    expect = [e for p, e in (("k", ek), ("v", ev)) if p in part]
    pos = np.arange(T)[sel["positions"]]
    lay = np.arange(L)[sel.get("layers", slice(None))]
    hed = np.arange(H)[sel.get("heads", slice(None))]
    for g, r, e in zip(parts, refs, expect):
        assert is_view(g) and not is_view(r)
        assert not g.flags.writeable
        with pytest.raises(ValueError):
            g[...] = 0
        assert same(g, r)
        want = e[np.ix_(np.atleast_1d(lay), np.atleast_1d(hed), np.atleast_1d(pos))]
        assert same(g, want)


def test_two_views_share_memory(fkvf):
    with fkvf.open(SAMPLE) as a:
        k1, v1 = a.read(positions=slice(70, 80), copy=False)
        k2, _ = a.read(positions=slice(75, 76), layers=2, copy=False)
        c, _ = a.read(positions=slice(70, 80))
        assert np.shares_memory(k1, k2)
        assert not np.shares_memory(k1, v1)  # keys and values are disjoint parts of a row
        assert not np.shares_memory(k1, c)


def test_hf_layout_views(fkvf, unpacked):
    ek, ev, _ = unpacked
    with fkvf.open(SAMPLE) as a:
        past = a.read(positions=slice(68, 100), layout="hf", copy=False)
    assert len(past) == L
    for i, (k, v) in enumerate(past):
        assert k.shape == (1, H, 32, D) and is_view(k) and is_view(v)
        assert same(k[0], ek[i, :, 68:100]) and same(v[0], ev[i, :, 68:100])


def test_view_survives_close_del_gc(fkvf, unpacked):
    ek, ev, _ = unpacked
    a = fkvf.open(SAMPLE)
    k, v = a.read(positions=slice(68, 100), copy=False)
    a.close()
    del a
    gc.collect()
    # the mapping is still there: reading it does not fault and gives the archive's bits
    assert same(k, ek[:, :, 68:100]) and same(v, ev[:, :, 68:100])
    assert float(np.abs(k.astype(np.float32)).sum()) > 0


def test_reader_freed_after_last_view(fkvf):
    a = fkvf.open(SAMPLE)
    r = a._reader
    k, v = a.read(positions=slice(68, 100), copy=False)
    hf = a.read(positions=slice(0, 4), layout="hf", copy=False)
    one = hf[3][1]
    del hf
    a.close()
    assert a.closed and not r.freed and r.views > 0
    with pytest.raises(ValueError, match="closed archive"):
        a.read(copy=False)
    del k
    gc.collect()
    assert not r.freed  # v and one still view the mapping
    del v
    gc.collect()
    assert not r.freed
    del one
    gc.collect()
    assert r.freed and r.views == 0 and r.h is None
    w = weakref.ref(r)
    del r, a
    gc.collect()
    assert w() is None


def test_close_without_views_frees_at_once(fkvf):
    a = fkvf.open(SAMPLE)
    r = a._reader
    k, _ = a.read(positions=slice(68, 100))  # a copy holds nothing
    c, _ = a.read(positions=slice(0, 10), copy=False)  # archived positions: a copy too
    assert not is_view(k) and not is_view(c) and r.views == 0
    a.close()
    assert r.freed


def test_views_die_before_close(fkvf):
    a = fkvf.open(SAMPLE)
    r = a._reader
    k, v = a.read(positions=slice(68, 100), copy=False)
    del k, v
    gc.collect()
    assert r.views == 0 and not r.freed  # the archive is still open
    assert a.read(positions=0, copy=False)[0].shape == (L, H, 1, D)
    a.close()
    gc.collect()
    assert r.freed


@pytest.mark.parametrize("sel", [
    dict(positions=slice(0, 10)),              # sinks and archived positions
    dict(positions=slice(3, 5)),               # the last sink and the first archived
    dict(positions=slice(60, 70)),             # archived and recent
    dict(positions=None),                      # everything
    dict(positions=[0, 70]),                   # exact, but a sink and a recent row: 2 runs
    dict(positions=slice(68, 100), dtype=np.float32),   # a conversion
    dict(positions=slice(68, 100), dtype="bf16"),
    dict(positions=np.array([80, 70])),        # descending
    dict(positions=np.array([70, 71, 73])),    # not a progression
    dict(positions=slice(70, 80), layers=[3, 1]),
    dict(positions=slice(70, 80), heads=[0, 1, 3]),
    dict(positions=slice(70, 70)),             # empty
])
def test_falls_back_to_copy(fkvf, sel):
    with fkvf.open(SAMPLE) as a:
        got = a.read(copy=False, **sel)
        ref = a.read(**sel)
        assert a._reader.views == 0
    for g, r in zip(got, ref):
        assert not is_view(g) and g.flags.writeable and g.flags.c_contiguous
        assert same(g, r)


def test_deflated_section_is_copied(fkvf, tmp_path):
    out = tmp_path / "deflated.fkvf"
    src = tmp_path / "cache.safetensors"
    run_cli("unpack", SAMPLE, "-o", src)
    run_cli("pack", src, "-o", out, "--deflate")
    plain = tmp_path / "plain.fkvf"
    run_cli("pack", src, "-o", plain)
    with fkvf.open(out) as a, fkvf.open(plain) as b:
        n = a.n_positions
        sel = dict(positions=slice(n - 32, n))
        k, v = a.read(copy=False, **sel)
        assert not is_view(k) and not is_view(v) and a._reader.views == 0
        kp, vp = b.read(copy=False, **sel)
        assert is_view(kp) and is_view(vp)
        assert same(k, kp) and same(v, vp)


def test_bf16_archive_view(fkvf, tmp_path):
    # an archive stored in bf16: the view is of its uint16 bits
    src = tmp_path / "cache.safetensors"
    run_cli("unpack", SAMPLE, "-o", src, "--dtype", "bf16")
    out = tmp_path / "bf16.fkvf"
    run_cli("pack", src, "-o", out)
    ek, ev, _ = unpack(tmp_path, out)
    with fkvf.open(out) as a:
        assert a.descriptor["dtype"] == "bf16"
        n = a.n_positions
        k, v = a.read(positions=slice(n - 8, n), copy=False)
        assert is_view(k) and k.dtype == np.uint16
        assert np.array_equal(k, ek[:, :, n - 8:]) and np.array_equal(v, ev[:, :, n - 8:])
        k2, _ = a.read(positions=slice(n - 8, n), dtype="bf16", copy=False)
        assert is_view(k2)
        k3, _ = a.read(positions=slice(n - 8, n), dtype=np.float16, copy=False)
        assert not is_view(k3)


def test_rows_in_two_sections(fkvf, tmp_path):
    # pack 80 positions, append 20 more: the recent window 68..99 is then rows 68..79 of the
    # first EXAC section and 80..99 of the appended one; a view lies in one section only
    k, v, tok = unpack(tmp_path, SAMPLE)

    def npz(path, n):
        arrays = {f"layers.{i}.{p}": x[i, :, :n] for i in range(L) for p, x in
                  (("key", k), ("value", v))}
        np.savez(path, tokens=tok[:n].astype(np.int64), **arrays)

    npz(tmp_path / "first.npz", 80)
    npz(tmp_path / "all.npz", T)
    arc = tmp_path / "grown.fkvf"
    run_cli("pack", tmp_path / "first.npz", "-o", arc, "--k", 16)
    run_cli("append", arc, tmp_path / "all.npz", "--new")
    ek, ev, _ = unpack(tmp_path, arc)
    with fkvf.open(arc) as a:
        assert a.n_positions == T and a.info["n_archived"] == 64
        for sel, view in ((slice(68, 80), True), (slice(80, 100), True), (slice(75, 85), False),
                          (slice(68, 100), False), (79, True), (80, True)):
            gk, gv = a.read(positions=sel, copy=False)
            assert is_view(gk) == view and is_view(gv) == view, sel
            pos = np.atleast_1d(np.arange(T)[sel])
            assert same(gk, ek[:, :, pos]) and same(gv, ev[:, :, pos])


def test_later_section_overriding_rows_is_copied(fkvf):
    # the CLI writes no file where a later EXAC section holds rows of positions an earlier one
    # holds too (a truncation then an append would); the decision is checked on the section
    # table with such a later section added by hand: rows 80..84 of it would win (spec 7.3)
    with fkvf.open(SAMPLE) as a:
        secs = a._exact_section_list()
        assert [(first, count) for _, _, first, count in secs] == [(0, 4), (68, 32)]
        a._exact_sections = secs + [(len(secs) + 100, 0, 80, 5)]
        k, _ = a.read(positions=slice(68, 100), copy=False)
        assert not is_view(k)
        k, _ = a.read(positions=slice(78, 81), copy=False)
        assert not is_view(k)
        k, _ = a.read(positions=slice(85, 100), copy=False)
        assert is_view(k)
        k, _ = a.read(positions=slice(68, 80), copy=False)
        assert is_view(k)
