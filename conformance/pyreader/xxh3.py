"""XXH3-64 (any seed) and XXH3-128 (seed 0 and any seed), xxHash 0.8, in
pure Python 3 for the FKVF second reader (spec/fkvf-v1.md §2.3, §2.6).

Written from the published description of the XXH3 algorithm; checked
against the test vectors of spec §2.6 by selftest.py.
"""

import struct

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1

P32_1 = 0x9E3779B1
P32_2 = 0x85EBCA77
P32_3 = 0xC2B2AE3D
P64_1 = 0x9E3779B185EBCA87
P64_2 = 0xC2B2AE3D27D4EB4F
P64_3 = 0x165667B19E3779F9
P64_4 = 0x85EBCA77C2B2AE63
P64_5 = 0x27D4EB2F165667C5
PMX1 = 0x165667919E3779F9
PMX2 = 0x9FB21C651E98DF25

# The 192-byte default secret of XXH3.
SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1c"
    "ded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221"
    "b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea3"
    "71644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d"
    "8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb"
    "170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce"
    "45cb3a8f95160428afd7fbcabb4b407e")
assert len(SECRET) == 192

_u64 = struct.Struct("<Q").unpack_from
_u32 = struct.Struct("<I").unpack_from


def _r64(b, o):
    return _u64(b, o)[0]


def _r32(b, o):
    return _u32(b, o)[0]


def _swap64(x):
    return int.from_bytes(x.to_bytes(8, "little"), "big")


def _swap32(x):
    return int.from_bytes(x.to_bytes(4, "little"), "big")


def _rotl64(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _rotl32(x, r):
    return ((x << r) | (x >> (32 - r))) & M32


def _fold(a, b):
    p = a * b
    return (p ^ (p >> 64)) & M64


def _xxh64_aval(h):
    h ^= h >> 33
    h = (h * P64_2) & M64
    h ^= h >> 29
    h = (h * P64_3) & M64
    return h ^ (h >> 32)


def _aval(h):
    h ^= h >> 37
    h = (h * PMX1) & M64
    return h ^ (h >> 32)


def _rrmxmx(h, n):
    h ^= _rotl64(h, 49) ^ _rotl64(h, 24)
    h = (h * PMX2) & M64
    h ^= (h >> 35) + n
    h = (h * PMX2) & M64
    return h ^ (h >> 28)


def _mix16(d, o, s, so, seed):
    lo = _r64(d, o)
    hi = _r64(d, o + 8)
    return _fold(lo ^ ((_r64(s, so) + seed) & M64),
                 hi ^ ((_r64(s, so + 8) - seed) & M64))


def _custom_secret(seed):
    if seed == 0:
        return SECRET
    w = struct.unpack("<24Q", SECRET)
    out = []
    for i in range(12):
        out.append((w[2 * i] + seed) & M64)
        out.append((w[2 * i + 1] - seed) & M64)
    return struct.pack("<24Q", *out)


def _long_accs(d, secret):
    """The eight accumulators of the long-input path (> 240 bytes)."""
    n = len(d)
    acc = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1]
    sw = struct.unpack("<24Q", secret)          # secret words at 8-byte steps
    scr = sw[16:24]                             # scramble key: secret + 128
    stripes_per_block = 16
    block_len = 1024
    nb_blocks = (n - 1) // block_len
    unpack_block = struct.Struct("<128Q").unpack_from

    def accumulate(words, base, nstripes, a0, a1, a2, a3, a4, a5, a6, a7):
        for s in range(nstripes):
            w = base + 8 * s
            d0, d1, d2, d3, d4, d5, d6, d7 = words[w:w + 8]
            k0 = d0 ^ sw[s]
            k1 = d1 ^ sw[s + 1]
            k2 = d2 ^ sw[s + 2]
            k3 = d3 ^ sw[s + 3]
            k4 = d4 ^ sw[s + 4]
            k5 = d5 ^ sw[s + 5]
            k6 = d6 ^ sw[s + 6]
            k7 = d7 ^ sw[s + 7]
            a0 = (a0 + d1 + (k0 & M32) * (k0 >> 32)) & M64
            a1 = (a1 + d0 + (k1 & M32) * (k1 >> 32)) & M64
            a2 = (a2 + d3 + (k2 & M32) * (k2 >> 32)) & M64
            a3 = (a3 + d2 + (k3 & M32) * (k3 >> 32)) & M64
            a4 = (a4 + d5 + (k4 & M32) * (k4 >> 32)) & M64
            a5 = (a5 + d4 + (k5 & M32) * (k5 >> 32)) & M64
            a6 = (a6 + d7 + (k6 & M32) * (k6 >> 32)) & M64
            a7 = (a7 + d6 + (k7 & M32) * (k7 >> 32)) & M64
        return a0, a1, a2, a3, a4, a5, a6, a7

    a = tuple(acc)
    for b in range(nb_blocks):
        words = unpack_block(d, b * block_len)
        a = accumulate(words, 0, stripes_per_block, *a)
        a = tuple(
            (((x ^ (x >> 47)) ^ scr[i]) * P32_1) & M64 for i, x in enumerate(a))
    # last partial block
    start = nb_blocks * block_len
    nstripes = ((n - 1) - start) // 64
    if nstripes:
        words = struct.unpack_from("<%dQ" % (8 * nstripes), d, start)
        a = accumulate(words, 0, nstripes, *a)
    # last stripe, secret + 192 - 64 - 7
    acc = list(a)
    last = struct.unpack_from("<8Q", d, n - 64)
    ls = struct.unpack_from("<8Q", secret, 192 - 64 - 7)
    for i in range(8):
        dv = last[i]
        dk = dv ^ ls[i]
        acc[i ^ 1] = (acc[i ^ 1] + dv) & M64
        acc[i] = (acc[i] + (dk & M32) * (dk >> 32)) & M64
    return acc


def _merge(acc, secret, so, start):
    r = start & M64
    for i in range(4):
        r = (r + _fold(acc[2 * i] ^ _r64(secret, so + 16 * i),
                       acc[2 * i + 1] ^ _r64(secret, so + 16 * i + 8))) & M64
    return _aval(r)


def xxh3_64(data, seed=0):
    """XXH3_64bits_withSeed(data, len(data), seed)."""
    d = bytes(data) if not isinstance(data, (bytes, bytearray, memoryview)) else data
    n = len(d)
    seed &= M64
    s = SECRET
    if n == 0:
        return _xxh64_aval(seed ^ _r64(s, 56) ^ _r64(s, 64))
    if n <= 3:
        c1, c2, c3 = d[0], d[n >> 1], d[n - 1]
        comb = (c1 << 16) | (c2 << 24) | c3 | (n << 8)
        flip = ((_r32(s, 0) ^ _r32(s, 4)) + seed) & M64
        return _xxh64_aval(comb ^ flip)
    if n <= 8:
        sd = seed ^ (_swap32(seed & M32) << 32)
        i1 = _r32(d, 0)
        i2 = _r32(d, n - 4)
        flip = ((_r64(s, 8) ^ _r64(s, 16)) - sd) & M64
        return _rrmxmx(((i2 + (i1 << 32)) & M64) ^ flip, n)
    if n <= 16:
        f1 = ((_r64(s, 24) ^ _r64(s, 32)) + seed) & M64
        f2 = ((_r64(s, 40) ^ _r64(s, 48)) - seed) & M64
        lo = _r64(d, 0) ^ f1
        hi = _r64(d, n - 8) ^ f2
        return _aval((n + _swap64(lo) + hi + _fold(lo, hi)) & M64)
    if n <= 128:
        acc = (n * P64_1) & M64
        if n > 32:
            if n > 64:
                if n > 96:
                    acc += _mix16(d, 48, s, 96, seed)
                    acc += _mix16(d, n - 64, s, 112, seed)
                acc += _mix16(d, 32, s, 64, seed)
                acc += _mix16(d, n - 48, s, 80, seed)
            acc += _mix16(d, 16, s, 32, seed)
            acc += _mix16(d, n - 32, s, 48, seed)
        acc += _mix16(d, 0, s, 0, seed)
        acc += _mix16(d, n - 16, s, 16, seed)
        return _aval(acc & M64)
    if n <= 240:
        acc = (n * P64_1) & M64
        rounds = n // 16
        for i in range(8):
            acc += _mix16(d, 16 * i, s, 16 * i, seed)
        acc = _aval(acc & M64)
        for i in range(8, rounds):
            acc += _mix16(d, 16 * i, s, 16 * (i - 8) + 3, seed)
        acc += _mix16(d, n - 16, s, 136 - 17, seed)
        return _aval(acc & M64)
    sec = _custom_secret(seed)
    acc = _long_accs(d, sec)
    return _merge(acc, sec, 11, n * P64_1)


def _mix32(lo, hi, d, o1, o2, s, so, seed):
    lo = (lo + _mix16(d, o1, s, so, seed)) & M64
    lo ^= (_r64(d, o2) + _r64(d, o2 + 8)) & M64
    hi = (hi + _mix16(d, o2, s, so + 16, seed)) & M64
    hi ^= (_r64(d, o1) + _r64(d, o1 + 8)) & M64
    return lo, hi


def xxh3_128(data, seed=0):
    """XXH3_128bits_withSeed as (high64, low64)."""
    d = data
    n = len(d)
    seed &= M64
    s = SECRET
    if n == 0:
        lo = _xxh64_aval(seed ^ _r64(s, 64) ^ _r64(s, 72))
        hi = _xxh64_aval(seed ^ _r64(s, 80) ^ _r64(s, 88))
        return hi, lo
    if n <= 3:
        c1, c2, c3 = d[0], d[n >> 1], d[n - 1]
        cl = (c1 << 16) | (c2 << 24) | c3 | (n << 8)
        ch = _rotl32(_swap32(cl), 13)
        fl = ((_r32(s, 0) ^ _r32(s, 4)) + seed) & M64
        fh = ((_r32(s, 8) ^ _r32(s, 12)) - seed) & M64
        return _xxh64_aval(ch ^ fh), _xxh64_aval(cl ^ fl)
    if n <= 8:
        sd = seed ^ (_swap32(seed & M32) << 32)
        ilo = _r32(d, 0)
        ihi = _r32(d, n - 4)
        i64 = (ilo + (ihi << 32)) & M64
        flip = ((_r64(s, 16) ^ _r64(s, 24)) + sd) & M64
        keyed = i64 ^ flip
        p = keyed * ((P64_1 + (n << 2)) & M64)
        mlo, mhi = p & M64, p >> 64
        mhi = (mhi + (mlo << 1)) & M64
        mlo ^= mhi >> 3
        mlo ^= mlo >> 35
        mlo = (mlo * PMX2) & M64
        mlo ^= mlo >> 28
        return _aval(mhi), mlo
    if n <= 16:
        fl = ((_r64(s, 32) ^ _r64(s, 40)) - seed) & M64
        fh = ((_r64(s, 48) ^ _r64(s, 56)) + seed) & M64
        ilo = _r64(d, 0)
        ihi = _r64(d, n - 8)
        p = (ilo ^ ihi ^ fl) * P64_1
        mlo, mhi = p & M64, p >> 64
        mlo = (mlo + ((n - 1) << 54)) & M64
        ihi ^= fh
        mhi = (mhi + ihi + (ihi & M32) * (P32_2 - 1)) & M64
        mlo ^= _swap64(mhi)
        p = mlo * P64_2
        hlo, hhi = p & M64, p >> 64
        hhi = (hhi + mhi * P64_2) & M64
        return _aval(hhi), _aval(hlo)
    if n <= 240:
        lo, hi = (n * P64_1) & M64, 0
        if n <= 128:
            if n > 32:
                if n > 64:
                    if n > 96:
                        lo, hi = _mix32(lo, hi, d, 48, n - 64, s, 96, seed)
                    lo, hi = _mix32(lo, hi, d, 32, n - 48, s, 64, seed)
                lo, hi = _mix32(lo, hi, d, 16, n - 32, s, 32, seed)
            lo, hi = _mix32(lo, hi, d, 0, n - 16, s, 0, seed)
        else:
            rounds = n // 32
            for i in range(4):
                lo, hi = _mix32(lo, hi, d, 32 * i, 32 * i + 16, s, 32 * i, seed)
            lo, hi = _aval(lo), _aval(hi)
            for i in range(4, rounds):
                lo, hi = _mix32(lo, hi, d, 32 * i, 32 * i + 16, s,
                                3 + 32 * (i - 4), seed)
            lo, hi = _mix32(lo, hi, d, n - 16, n - 32, s, 136 - 17 - 16,
                            (-seed) & M64)
        rlo = (lo + hi) & M64
        rhi = (lo * P64_1 + hi * P64_4 + ((n - seed) & M64) * P64_2) & M64
        return (-_aval(rhi)) & M64, _aval(rlo)
    sec = _custom_secret(seed)
    acc = _long_accs(d, sec)
    lo = _merge(acc, sec, 11, n * P64_1)
    hi = _merge(acc, sec, 192 - 64 - 11, ~(n * P64_2) & M64)
    return hi, lo


def xxh3_128_canonical(data):
    """The 16 stored bytes of XXH3-128(data, seed 0) (spec §2.3)."""
    hi, lo = xxh3_128(data, 0)
    return hi.to_bytes(8, "big") + lo.to_bytes(8, "big")
