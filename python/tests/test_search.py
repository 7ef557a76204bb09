"""Archive.search / find / prefix_reuse / context against answers computed here by brute force
from the token ids, on archives packed by the CLI: one with a known token sequence full of
repeats (with and without a ZIDX search index), and the real stories260K sample cache."""

import gc
import weakref

import numpy as np
import pytest

from conftest import SRCDIR, run_cli

L, H, T, D = 2, 2, 300, 8


def known_tokens():
    """A sequence over a small alphabet with planted repeats of a longer phrase."""
    rng = np.random.default_rng(7)
    t = rng.integers(0, 6, size=T).astype(np.int64)
    phrase = np.array([40, 41, 42, 43, 44, 45])
    for at in (20, 150, 290 - len(phrase)):
        t[at:at + len(phrase)] = phrase
    t[100:104] = phrase[2:]  # a shorter copy: the phrase's last 4 ids
    t[5] = 70000             # an id above 16 bits
    return t


def pack_npz(tmp_path, name, tokens=None, extra=()):
    rng = np.random.default_rng(1)
    arrays = {}
    for i in range(L):
        arrays[f"layers.{i}.key"] = rng.standard_normal((H, T, D)).astype(np.float16)
        arrays[f"layers.{i}.value"] = rng.standard_normal((H, T, D)).astype(np.float16)
    if tokens is not None:
        arrays["tokens"] = tokens
    src = tmp_path / f"{name}.npz"
    np.savez(src, **arrays)
    out = tmp_path / f"{name}.fkvf"
    run_cli("pack", src, "-o", out, "--no-rope", "--sinks", 4, "--recent", 32, *extra)
    return str(out)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("search")
    sample = d / "sample.fkvf"
    run_cli("pack", f"{SRCDIR}/testdata/sample-cache.safetensors", "-o", sample)
    return {"known": pack_npz(d, "known", known_tokens()),
            "indexed": pack_npz(d, "indexed", known_tokens(), ("--index",)),
            "notokens": pack_npz(d, "notokens"),
            "sample": str(sample)}


# ---- brute force ----

def suffix_lengths(tokens, q):
    """For every position t, the length of the longest common suffix of tokens[..t] and q."""
    tokens = np.asarray(tokens, dtype=np.int64)
    n = tokens.size
    lengths = np.zeros(n, dtype=np.int64)
    alive = np.ones(n, dtype=bool)
    t = np.arange(n)
    for j in range(len(q)):
        idx = t - j
        ok = idx >= 0
        alive &= ok & (tokens[np.where(ok, idx, 0)] == int(q[-1 - j]))
        lengths += alive
    return lengths


def brute_longest(tokens, q, k):
    lengths = suffix_lengths(tokens, q)
    order = sorted((-int(l), int(t)) for t, l in enumerate(lengths) if l >= 1)
    return [(t, -nl) for nl, t in order[:k]]


def brute_find(tokens, q):
    return np.flatnonzero(suffix_lengths(tokens, q) == len(q)).astype(np.uint64)


def brute_prefix_reuse(tokens, prompt):
    tokens = np.asarray(tokens, dtype=np.int64)
    prompt = np.asarray(prompt, dtype=np.int64)
    m = min(tokens.size, prompt.size)
    diff = np.flatnonzero(tokens[:m] != prompt[:m])
    prefix = int(diff[0]) if diff.size else m
    best = brute_longest(tokens, prompt, 1) if prompt.size else []
    end, length = best[0] if best else (0, 0)
    return {"prefix_len": prefix, "match_end": end, "match_len": length,
            "archive_positions": int(tokens.size)}


def queries(tokens):
    t = [int(x) for x in tokens]
    return [
        [40, 41, 42, 43, 44, 45],        # planted 3 times
        [42, 43, 44, 45],                # planted 4 times
        [0, 40, 41, 42, 43, 44, 45],     # longer than any occurrence
        [9, 9, 44, 45],                  # partial suffix only
        t[0:3], t[-5:], t[1:12], [t[5]], # from the sequence itself, incl. the 70000 id
        [3], [5, 5], [60, 61],           # frequent short ones, and absent ids
        [45, 2**32 - 1],                 # the largest id: outside the stream's alphabet
        [2**32 - 1, 45],                 # ... before the ids that match
    ]


# ---- tests ----

@pytest.mark.parametrize("which", ["known", "indexed", "sample"])
def test_search_and_find_match_brute_force(fkvf, paths, which):
    with fkvf.open(paths[which]) as a:
        tokens = a.tokens
        assert tokens is not None and tokens.size == a.n_positions
        if which != "sample":
            assert np.array_equal(tokens, known_tokens())
        for q in queries(tokens):
            for k in (1, 3, 5, 50):
                assert a.search(q, k=k) == brute_longest(tokens, q, k), (q, k)
            got = a.find(q)
            assert got.dtype == np.uint64
            assert np.array_equal(got, brute_find(tokens, q)), q


def test_search_known_answers(fkvf, paths):
    # by hand from known_tokens(): the phrase ends at 25, 155 and 289; its last 4 ids also
    # at 103
    with fkvf.open(paths["known"]) as a:
        assert list(a.find([40, 41, 42, 43, 44, 45])) == [25, 155, 289]
        assert list(a.find([42, 43, 44, 45])) == [25, 103, 155, 289]
        assert a.search([40, 41, 42, 43, 44, 45], k=4) == [(25, 6), (155, 6), (289, 6), (103, 4)]
        assert a.search([7, 41, 42], k=3) == [(22, 2), (152, 2), (286, 2)]
        assert list(a.find([70000])) == [5]
        assert a.search(np.array([60, 61]), k=5) == []
        assert list(a.find([60])) == []


def test_find_beyond_first_buffer(fkvf, tmp_path):
    # 600 positions of one id: the exact search finds 600, more than one call's buffer
    tokens = np.zeros(600, dtype=np.int64)
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "zeros.npz", tokens=tokens,
             **{"layers.0.key": rng.standard_normal((1, 600, 8)).astype(np.float16),
                "layers.0.value": rng.standard_normal((1, 600, 8)).astype(np.float16)})
    run_cli("pack", tmp_path / "zeros.npz", "-o", tmp_path / "zeros.fkvf", "--no-rope")
    with fkvf.open(tmp_path / "zeros.fkvf") as a:
        assert np.array_equal(a.find([0]), np.arange(600, dtype=np.uint64))
        assert np.array_equal(a.find([0, 0, 0]), np.arange(2, 600, dtype=np.uint64))
        assert a.search([0, 0, 0], k=2) == [(2, 3), (3, 3)]


@pytest.mark.parametrize("which", ["known", "sample"])
def test_prefix_reuse_matches_brute_force(fkvf, paths, which):
    with fkvf.open(paths[which]) as a:
        tokens = a.tokens
        t = [int(x) for x in tokens]
        prompts = [t[:10], t[:10] + [999, 3], t, t + [1, 2, 3], [t[0] + 1] + t[1:40],
                   t[50:60], [60, 61], [40, 41, 42, 43, 44, 45, 1], []]
        for p in prompts:
            assert a.prefix_reuse(p) == brute_prefix_reuse(tokens, p), p


def test_prefix_reuse_known(fkvf, paths):
    with fkvf.open(paths["known"]) as a:
        t = [int(x) for x in a.tokens]
        r = a.prefix_reuse(t[:30] + [7, 40, 41, 42])  # 7 is in no context
        assert r["prefix_len"] == 30 and r["archive_positions"] == T
        assert (r["match_end"], r["match_len"]) == (22, 3)
        assert a.prefix_reuse([]) == {"prefix_len": 0, "match_end": 0, "match_len": 0,
                                      "archive_positions": T}


def test_context(fkvf, paths):
    with fkvf.open(paths["known"]) as a:
        t = a.tokens
        assert list(a.context(25, 6)) == [40, 41, 42, 43, 44, 45]
        assert np.array_equal(a.context(100, 10), t[91:101])
        # at the start: fewer than asked
        assert list(a.context(0, 5)) == [int(t[0])]
        assert np.array_equal(a.context(2, 10), t[:3])
        # at the end, counted like read's
        assert np.array_equal(a.context(T - 1, 4), t[-4:])
        assert np.array_equal(a.context(-1, 4), t[-4:])
        assert np.array_equal(a.context(-T, 3), t[:1])
        assert np.array_equal(a.context(T - 1, 10**6), t)
        c = a.context(10, 0)
        assert c.dtype == np.uint32 and c.size == 0
        assert a.context(5, 1).dtype == np.uint32 and list(a.context(5, 1)) == [70000]
        for at in (T, -T - 1, 2**64):
            with pytest.raises(IndexError, match="out of range"):
                a.context(at, 3)
        with pytest.raises(ValueError, match="length -1"):
            a.context(3, -1)
        with pytest.raises(TypeError):
            a.context(1.5, 2)
        with pytest.raises(TypeError):
            a.context(True, 2)


def test_bad_queries(fkvf, paths):
    with fkvf.open(paths["known"]) as a:
        for call in (a.search, a.find):
            with pytest.raises(ValueError, match="empty"):
                call([])
            with pytest.raises(ValueError, match="1-D"):
                call([[1, 2], [3, 4]])
            with pytest.raises(ValueError, match="out of range"):
                call([1, -1])
            with pytest.raises(ValueError, match="out of range"):
                call([2**32])
            with pytest.raises(ValueError, match="out of range"):
                call(np.array([2**63], dtype=np.uint64))
            with pytest.raises(ValueError, match="out of range"):
                call([1, 2**70])
            with pytest.raises(ValueError, match="out of range"):
                call([-2**70])
            with pytest.raises(TypeError, match="integers"):
                call([1, "2"])
            with pytest.raises(TypeError, match="integers"):
                call([1.0, 2.0])
            with pytest.raises(TypeError, match="integers"):
                call(np.array([True, False]))
            with pytest.raises(TypeError):
                call(True)
        assert a.search(42) == a.search([42])  # one id is a query of length 1
        with pytest.raises(ValueError, match="k 0"):
            a.search([1], k=0)
        with pytest.raises(TypeError):
            a.search([1], k=2.0)
        with pytest.raises(ValueError, match="out of range"):
            a.prefix_reuse([2**32])
        with pytest.raises(ValueError, match="1-D"):
            a.prefix_reuse(np.zeros((2, 2), dtype=np.int64))


def test_no_token_stream(fkvf, paths):
    p = paths["notokens"]
    with fkvf.open(p) as a:
        assert a.tokens is None
        for call in (lambda: a.search([1]), lambda: a.find([1]),
                     lambda: a.prefix_reuse([1]), lambda: a.context(0, 1)):
            with pytest.raises(fkvf.NotFoundError) as e:
                call()
            assert e.value.file == p and p in str(e.value) and "token stream" in str(e.value)


def test_closed_archive(fkvf, paths):
    a = fkvf.open(paths["known"])
    assert a.search([1]) != []
    r = a._reader
    assert r.search is not None  # opened by the first query
    a.close()
    assert r.search is None and r.freed  # search handle and reader freed by close()
    for call in (lambda: a.search([1]), lambda: a.find([1]), lambda: a.prefix_reuse([1]),
                 lambda: a.context(0, 1)):
        with pytest.raises(ValueError, match="closed archive"):
            call()


def test_search_handle_freed_with_archive(fkvf, paths):
    a = fkvf.open(paths["known"])
    a.find([1])
    w = weakref.ref(a._reader)
    del a
    gc.collect()
    assert w() is None


# ---- key retrieval (Archive.search_keys, fkvf_search_keys) ----

def _top(keys, q, lo, hi, m):
    """The brute-force top m of q . k over positions [lo, hi): (position, score), best
    first, then by position."""
    s = keys[lo:hi].astype(np.float64) @ np.asarray(q, dtype=np.float32).astype(np.float64)
    order = sorted(range(hi - lo), key=lambda i: (-s[i], i))[:m]
    return [(lo + i, float(s[i])) for i in order]


@pytest.mark.parametrize("rope", [False, True])
def test_search_keys_against_brute_force(fkvf, tmp_path, rope):
    """With candidates covering the range the hits are the brute-force top m over the keys
    Archive.read decodes (f32); with the default they lie in the range, best first, each
    scored as its decoded key."""
    path = pack_npz(tmp_path, "k")  # --no-rope: keys archived as given
    if rope:  # keys with RoPE, archived before rotation (the pack default)
        src = tmp_path / "k.npz"
        path = str(tmp_path / "kr.fkvf")
        run_cli("pack", src, "-o", path, "--sinks", 4, "--recent", 32)
    rng = np.random.default_rng(3)
    with fkvf.open(path) as a:
        lo, hi = 4, T - 32
        for layer in range(L):
            for head in range(H):
                keys = a.read(layers=layer, heads=head, part="k", dtype=np.float32)[0, 0]
                q = rng.standard_normal(D).astype(np.float32)
                got = a.search_keys(layer, head, q, m=7, candidates=1024)
                want = _top(keys, q, lo, hi, 7)
                assert [p for p, _ in got] == [p for p, _ in want]
                assert np.allclose([s for _, s in got], [s for _, s in want], rtol=1e-6)
                got = a.search_keys(layer, head, q, m=5, first=50, end=90, candidates=1024,
                                    chunk=16)
                assert [p for p, _ in got] == [p for p, _ in _top(keys, q, 50, 90, 5)]
                got = a.search_keys(layer, head, q.astype(np.float64), m=9)
                assert len(got) == 9
                full = dict(_top(keys, q, lo, hi, hi - lo))
                for p, s in got:
                    assert lo <= p < hi and abs(full[p] - s) <= 1e-6 * (1 + abs(s))
                assert all((x[1], -x[0]) > (y[1], -y[0]) for x, y in zip(got, got[1:]))
        assert a.search_keys(0, 0, np.ones(D), first=hi) == []
        assert a.search_keys(0, 0, np.ones(D), end=0) == []


def test_search_keys_errors(fkvf, tmp_path):
    path = pack_npz(tmp_path, "e")
    with fkvf.open(path) as a:
        with pytest.raises(ValueError, match="components"):
            a.search_keys(0, 0, np.ones(D - 1))
        with pytest.raises(ValueError, match="finite"):
            a.search_keys(0, 0, np.r_[np.ones(D - 1), np.nan])
        with pytest.raises(TypeError):
            a.search_keys(0, 0, np.ones((2, D)))
        with pytest.raises(TypeError):
            a.search_keys(0, 0, np.array(["a"] * D))
        with pytest.raises(IndexError, match="layers"):
            a.search_keys(L, 0, np.ones(D))
        with pytest.raises(IndexError):
            a.search_keys(0, H, np.ones(D))
        with pytest.raises(ValueError, match="m 0"):
            a.search_keys(0, 0, np.ones(D), m=0)
        with pytest.raises(ValueError, match="candidates"):
            a.search_keys(0, 0, np.ones(D), candidates=1025)
        with pytest.raises(TypeError):
            a.search_keys(True, 0, np.ones(D))
        assert len(a.search_keys(0, 0, np.ones(D), m=3)) == 3
    with pytest.raises(ValueError, match="closed"):
        a.search_keys(0, 0, np.ones(D))
