"""The child process of test_appender.py's cross-process tests: opens an existing archive
with fkvf.Appender and appends the rows of seeded_cache(seed, ...) commit after commit,
printing "committing" before each commit and "committed N" (N: positions committed)
after it.

    python3 appender_child.py ARCHIVE SEED FIRST PER_COMMIT N_COMMITS SLEEP_SECONDS SYNC

Also imported by the test for seeded_cache, so that both sides make the same rows."""

import sys
import time

import numpy as np

SHAPE = (2, 3, 8, 4)  # n_layers, n_kv_heads, key_dim, value_dim


def seeded_cache(seed, first, count):
    """Keys [L, H, count, Dk], values [L, H, count, Dv] (f16) and token ids of positions
    [first, first + count) of the sequence of seed: each element is an integer function
    of (seed, position, element index), so any range is the same rows on both sides."""
    L, H, Dk, Dv = SHAPE
    pos = np.arange(first, first + count, dtype=np.uint64)

    def part(n_elems, salt):
        idx = np.arange(n_elems, dtype=np.uint64)
        x = (pos[:, None] * np.uint64(2654435761) + idx[None, :] * np.uint64(40503) +
             np.uint64(seed * 97 + salt)) % np.uint64(4093)
        # [count, L*H*D] -> [L, H, count, D]; values -2..2 in steps of 1/1023, exact in f16
        a = (x.astype(np.float32) - 2046) / 1023
        return a.astype(np.float16).reshape(count, L, H, -1).transpose(1, 2, 0, 3).copy()

    toks = (pos * 7 + seed) % 30000
    return part(L * H * Dk, 0), part(L * H * Dv, 1), toks.astype(np.uint32)


def main(argv):
    path, seed, first, per, n, pause = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), \
        int(argv[4]), float(argv[5])
    import fkvf
    with fkvf.Appender(path, sync=argv[6]) as a:
        assert a.n_positions == first, (a.n_positions, first)
        for c in range(n):
            k, v, t = seeded_cache(seed, first + c * per, per)
            a.append(k, v, tokens=t)
            print("committing", flush=True)  # the parent may kill it from here on
            a.commit()
            print("committed", a.n_positions, flush=True)
            if pause:
                time.sleep(pause)


if __name__ == "__main__":
    main(sys.argv[1:])
