#!/usr/bin/env python3
"""fkvf_write.py: a minimal FKVF writer (Python 3 standard library only),
written from spec/fkvf-v1.md alone, to show that the spec suffices to write
files that libfkvf and `fkvf validate --strict` accept (issue 17, point 12).

    python3 fkvf_write.py OUTDIR

writes the demonstration files below into OUTDIR (deterministically: seeded
pseudo-random data, no clock) and prints, for each, the positions it holds:

    pyw_exact.fkvf            exact rows only (DESC, META, one EXAC), one commit
    pyw_archive.fkvf          an embedded CBK1 (k = 16, 1 key + 1 value stage),
                              the index group as one quad STRM segment, a token
                              stream, EXAC sinks and recent window; one commit
    pyw_appended.fkvf         pyw_archive.fkvf plus an appended commit (§7.4,
                              §7.6): new positions, partial quad unit re-stored
    pyw_multi.fkvf            2 layers x 2 heads, 2 key + 1 value stages, k = 32
                              (6-bit quad symbols), f32 rows, RoPE described but
                              keys archived as cached (key_storage 0)
    pyw_multi_appended.fkvf   pyw_multi.fkvf plus two appended commits, the
                              second one archiving new positions directly
    pyw_layers.fkvf           per-layer stage counts (LAYER_STAGES, spec 1.1):
                              4 layers x 2 heads, the layer table (2, 1),
                              (0, 1), (0, 0), (1, 2) (a layer without key
                              stages, one without any stage), 14 index
                              streams, a token stream; format_minor 1
    pyw_layers_appended.fkvf  pyw_layers.fkvf plus two appended commits
    pyw_metric.fkvf           an encoder metric (CMET, spec 1.2, §13.8): key and
                              value matrices for an embedded codebook, the
                              ENCODER_METRIC optional bit; the encoder chooses
                              symbols by e^T M e
    pyw_metric_appended.fkvf  pyw_metric.fkvf plus an appended commit encoded
                              with the metric read back from the file

What it writes: the header (§3), sections tiled at 64-byte boundaries with
zero padding (§4.1), DESC (§8), META (§9), CBK1 (§13.1-§13.2, with or
without a layer table: a codebook with a layer table sets the LAYER_STAGES
required bit and format_minor 1, §3.4, §1.3.1, and numbers its index
streams with P(l), §11.2), EXAC (§14), STRM segments of the quad profile
(§11.2-§11.4, §12.1.4: the data is the packed symbols), one directory and
one trailer per commit (§5, §6, §7.6); as a library also a codebook file
(§13.4, with or without a CMET) and an archive that refers to it with a
CBRF (§13.5), not among the demonstration files (appending to such an
archive is not supported); CMET (§13.8, version 1.2) with an embedded
codebook or in a codebook file, the appender using (and checking) it.
What it does not write: ngon streams, VTXS, deflated sections, ZIDX /
ZPOS (all optional for a writer). Appending (§7.4, §7.6.1) opens the file
from its end, refuses a torn or damaged one (§7.7), reads the DESC, the
codebook, the effective streams and the exact rows it needs, and appends
only new bytes.

The module is also a library for writer_check.py, which checks the files
with libfkvf (`fkvf validate --strict`, `fkvf verify`, `fkvf info`,
`fkvf unpack`) and with the second reader (fkvf_read.py).
"""

import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xxh3 import xxh3_64, xxh3_128_canonical  # noqa: E402

try:  # advisory lock while appending (§18.5); POSIX only
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

MAGIC = b"\x89FKVF\r\n\x1a\n"          # §3
TRL_MAGIC = b"\x89FKVTRL\n"            # §6
F_REQUIRED = 1                         # §4.2 entry flags
F_DEFLATE = 2
OPT_TOKEN_STREAM = 1                   # §3.4 optional_features bit 0
OPT_ENCODER_METRIC = 2                 # §3.4 optional_features bit 1 (version 1.2, §13.8)
METRIC_MAX_DIM = 1024                  # §13.8, §15: key_dim, value_dim of a part a CMET holds
REQ_EXTERNAL_CODEBOOK = 4              # §3.4 required_features bit 2
REQ_LAYER_STAGES = 8                   # §3.4 required_features bit 3 (version 1.1)
DT_F16, DT_BF16, DT_F32 = 1, 2, 3      # §8 dtype
ESIZE = {DT_F16: 2, DT_BF16: 2, DT_F32: 4}
GROUP_INDEX, GROUP_TOKEN = 0, 1        # §11


class WriteError(Exception):
    """The writer refuses (bad arguments, a file it must not append to)."""


def align64(x):
    return (x + 63) // 64 * 64


# ------------------------------------------------------------ random data

class Rng:
    """splitmix64: seeded, identical on every platform and Python version."""

    def __init__(self, seed):
        self.s = seed & 0xFFFFFFFFFFFFFFFF

    def next64(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    def below(self, n):
        return self.next64() % n

    def between(self, lo, hi):
        """An integer in [lo, hi]."""
        return lo + self.below(hi - lo + 1)


# -------------------------------------------------------- element types (§2.1)

def f32(x):
    """x rounded to binary32 (round to nearest even)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def encode_elems(vals, dtype):
    """Little-endian elements of dtype; f16 and f32 rounded to nearest even
    by struct, bf16 as the rounded upper half of the binary32 (§2.1, §13.6)."""
    if dtype == DT_F16:
        return struct.pack("<%de" % len(vals), *vals)
    if dtype == DT_F32:
        return struct.pack("<%df" % len(vals), *vals)
    if dtype == DT_BF16:
        out = bytearray()
        for v in vals:
            u = struct.unpack("<I", struct.pack("<f", v))[0]
            if (u & 0x7F800000) == 0x7F800000 and u & 0x7FFFFF:
                h = (u >> 16) | 0x40          # NaN stays NaN
            else:
                h = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
            out += struct.pack("<H", h & 0xFFFF)
        return bytes(out)
    raise WriteError("unknown dtype %d" % dtype)


def decode_elems(b, dtype):
    n = len(b) // ESIZE[dtype]
    if dtype == DT_F16:
        return list(struct.unpack("<%de" % n, b))
    if dtype == DT_F32:
        return list(struct.unpack("<%df" % n, b))
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0]
            for h in struct.unpack("<%dH" % n, b)]


# ------------------------------------------------------------- descriptor (§8)

class Desc:
    """The cache descriptor: the shape of a row and the window policy."""

    def __init__(self, n_layers, n_kv_heads, key_dim, value_dim, dtype, n_sinks, window,
                 model_id="", tokenizer_id="", rope=None):
        self.L, self.H, self.Dk, self.Dv = n_layers, n_kv_heads, key_dim, value_dim
        self.dtype = dtype
        self.S, self.W = n_sinks, window
        self.model_id = model_id.encode("utf-8")
        self.tokenizer_id = tokenizer_id.encode("utf-8")
        # rope: None (key_transform 0), or (layout, rope_dims, theta, key_storage)
        self.rope = rope
        if not (1 <= self.L <= 1024 and 1 <= self.H <= 1024 and 1 <= self.Dk <= 16384
                and 1 <= self.Dv <= 16384 and dtype in ESIZE):
            raise WriteError("descriptor field out of range (§8)")
        if len(self.model_id) > 4096 or len(self.tokenizer_id) > 4096:
            raise WriteError("model_id or tokenizer_id longer than 4096 bytes (§8)")
        if rope is not None:
            layout, dims, theta, storage = rope
            if layout not in (1, 2) or dims % 2 or not 2 <= dims <= key_dim or not theta > 0 \
                    or storage not in (0, 1):
                raise WriteError("RoPE fields out of range (§8, §8.2)")

    def row_bytes(self):
        """§14.2: n_layers * n_kv_heads * (key_dim + value_dim) * e."""
        return self.L * self.H * (self.Dk + self.Dv) * ESIZE[self.dtype]

    def pack(self):
        """The DESC section contents (§8): a 128-byte fixed part and the ids."""
        if self.rope is None:
            # key_transform 0: every RoPE field zero, rope_theta eight zero bytes
            kt, layout, storage, dims, theta = 0, 0, 0, 0, 0.0
        else:
            layout, dims, theta, storage = self.rope
            kt = 1
        fixed = struct.pack("<IIIIBBBBIdIIIIB7x32s40x",
                            self.L, self.H, self.Dk, self.Dv, self.dtype, kt, layout, storage,
                            dims, theta, self.S, self.W, len(self.model_id),
                            len(self.tokenizer_id), 0, bytes(32))
        assert len(fixed) == 128
        return fixed + self.model_id + self.tokenizer_id

    @staticmethod
    def unpack(b):
        """Parse a DESC (of a file this module appends to); checks the fields
        it relies on."""
        if len(b) < 128:
            raise WriteError("DESC shorter than 128 bytes")
        (L, H, Dk, Dv, dtype, kt, layout, storage, dims, theta, S, W, ml, tl,
         _kind) = struct.unpack_from("<IIIIBBBBIdIIIIB", b, 0)
        if len(b) != 128 + ml + tl:
            raise WriteError("DESC size does not match its id lengths (§8)")
        rope = (layout, dims, theta, storage) if kt == 1 else None
        return Desc(L, H, Dk, Dv, dtype, S, W, b[128:128 + ml].decode("utf-8"),
                    b[128 + ml:128 + ml + tl].decode("utf-8"), rope)

    # A row (§14.2): per layer, the keys of heads 0..H-1, then their values.
    def split_row(self, row):
        """Row bytes -> {(l, h): (key floats, value floats)}."""
        e = ESIZE[self.dtype]
        out = {}
        per_layer = self.H * (self.Dk + self.Dv)
        for l in range(self.L):
            base = l * per_layer
            for h in range(self.H):
                k0 = (base + h * self.Dk) * e
                v0 = (base + self.H * self.Dk + h * self.Dv) * e
                out[(l, h)] = (decode_elems(row[k0:k0 + self.Dk * e], self.dtype),
                               decode_elems(row[v0:v0 + self.Dv * e], self.dtype))
        return out

    def join_row(self, parts):
        """{(l, h): (key floats, value floats)} -> row bytes (§14.2)."""
        out = bytearray()
        for l in range(self.L):
            for h in range(self.H):
                out += encode_elems(parts[(l, h)][0], self.dtype)
            for h in range(self.H):
                out += encode_elems(parts[(l, h)][1], self.dtype)
        return bytes(out)


# -------------------------------------------------------------- codebook (§13)

class Codebook:
    """An RVQ codebook: tables[l][h][kv][s] is a list of k centroid rows.

    layer_stages, if given, is the layer table of §13.1 (version 1.1): one
    (ks, vs) pair per layer, layer l having ks key and vs value stages
    (tables[l][h][0] then holds ks stages, tables[l][h][1] vs). k_stages and
    v_stages are then the largest counts (None: computed). A table whose
    pairs are all equal is stored as a uniform codebook (layer_stages 0, as
    §13.1 recommends) unless force_table is set."""

    def __init__(self, n_layers, n_heads, key_dim, value_dim, k, k_stages, v_stages,
                 dtype, pooled, tables, layer_stages=None, force_table=False):
        if k < 16 or k > 4096 or k & (k - 1):
            raise WriteError("codebook k must be a power of two in 16..4096 (§13.1)")
        if layer_stages is not None:
            layer_stages = [(int(a), int(b)) for a, b in layer_stages]
            if len(layer_stages) != n_layers or \
                    not all(0 <= a <= 16 and 0 <= b <= 16 for a, b in layer_stages):
                raise WriteError("layer table: one (ks, vs) pair per layer, each 0..16 (§13.1)")
            mk = max(a for a, _ in layer_stages)
            mv = max(b for _, b in layer_stages)
            if (k_stages is not None and k_stages != mk) or (v_stages is not None and v_stages != mv):
                raise WriteError("with a layer table, k_stages and v_stages are the largest "
                                 "layer counts (§13.1)")
            k_stages, v_stages = mk, mv
            if not force_table and len(set(layer_stages)) == 1:
                layer_stages = None        # the same counts everywhere: uniform (§13.1 SHOULD)
        elif k_stages is None or v_stages is None:
            raise WriteError("k_stages and v_stages are needed without a layer table (§13.1)")
        if dtype not in (DT_F16, DT_F32) or not (0 <= k_stages <= 16 and 0 <= v_stages <= 16):
            raise WriteError("codebook dtype or stage count out of range (§13.1)")
        if pooled and n_heads != 1:
            raise WriteError("a pooled codebook has n_heads = 1 (§13.1)")
        self.L, self.H, self.Dk, self.Dv = n_layers, n_heads, key_dim, value_dim
        self.k, self.ks, self.vs = k, k_stages, v_stages
        self.dtype, self.pooled = dtype, pooled
        self.layer_table = layer_stages    # None: uniform (layer_stages = 0)
        self.tables = tables
        self._msum = [0]                   # m(0) + ... + m(l-1), l = 0 .. n_layers
        for l in range(n_layers):
            self._msum.append(self._msum[-1] + sum(self.stages(l)))
        for l in range(n_layers):
            lk, lv = self.stages(l)
            for h in range(n_heads):
                if len(tables[l][h][0]) != lk or len(tables[l][h][1]) != lv:
                    raise WriteError("layer %d head %d: tables for %d + %d stages, the counts "
                                     "are %d + %d" % (l, h, len(tables[l][h][0]),
                                                      len(tables[l][h][1]), lk, lv))

    def stages(self, l):
        """(ks(l), vs(l)): layer l's key and value stage counts (§13.1)."""
        if self.layer_table is None:
            return self.ks, self.vs
        return self.layer_table[l]

    def required_features(self):
        """The required feature bits a file holding (or naming) this codebook
        sets (§3.4): LAYER_STAGES when it has a layer table."""
        return REQ_LAYER_STAGES if self.layer_table is not None else 0

    def pack(self):
        """The CBK1 section contents (§13.1 header and layer table, §13.2
        tables)."""
        out = bytearray(struct.pack("<IIIIIBBBBB39x", self.L, self.H, self.Dk, self.Dv, self.k,
                                    self.ks, self.vs, self.dtype, self.pooled,
                                    0 if self.layer_table is None else 1))
        if self.layer_table is not None:
            # n_layers (ks, vs) pairs, zero bytes up to T = align64(2 n_layers)
            for lk, lv in self.layer_table:
                out += struct.pack("<BB", lk, lv)
            out += bytes(align64(2 * self.L) - 2 * self.L)
        for l in range(self.L):
            lk, lv = self.stages(l)
            for h in range(self.H):
                for kv, stages in ((0, lk), (1, lv)):
                    for s in range(stages):
                        for row in self.tables[l][h][kv][s]:
                            out += encode_elems(row, self.dtype)
        return bytes(out)

    @staticmethod
    def unpack(b):
        if len(b) < 64:
            raise WriteError("CBK1 shorter than its header")
        L, H, Dk, Dv, k, ks, vs, dtype, pooled, ls = struct.unpack_from("<IIIIIBBBBB", b, 0)
        e = ESIZE.get(dtype, 0)
        if ls == 1:
            T = align64(2 * L)
            if len(b) < 64 + T:
                raise WriteError("CBK1 shorter than its layer table (§13.1)")
            table = [(b[64 + 2 * l], b[65 + 2 * l]) for l in range(L)]
        elif ls == 0:
            T, table = 0, None
        else:
            raise WriteError("CBK1 layer_stages %d (§13.1)" % ls)
        counts = table if table is not None else [(ks, vs)] * L
        if dtype not in (DT_F16, DT_F32) or \
                len(b) != 64 + T + H * k * sum(lk * Dk + lv * Dv for lk, lv in counts) * e:
            raise WriteError("CBK1 dtype or size does not match its header (§13.2)")
        o = 64 + T
        tables = []
        for l in range(L):
            per_h = []
            for _h in range(H):
                per_kv = []
                for stages, dim in ((counts[l][0], Dk), (counts[l][1], Dv)):
                    st = []
                    for _s in range(stages):
                        rows = []
                        for _c in range(k):
                            rows.append(decode_elems(b[o:o + dim * e], dtype))
                            o += dim * e
                        st.append(rows)
                    per_kv.append(st)
                per_h.append(per_kv)
            tables.append(per_h)
        return Codebook(L, H, Dk, Dv, k, ks, vs, dtype, pooled, tables, layer_stages=table,
                        force_table=True)

    def content_hash(self):
        """§13.3: XXH3-128 of the CBK1 contents, canonical form."""
        return xxh3_128_canonical(self.pack())

    def matches(self, d):
        """§13.7: the codebook fits the descriptor."""
        return (self.L == d.L and self.Dk == d.Dk and self.Dv == d.Dv
                and self.H == (1 if self.pooled else d.H))

    def prefix(self, d, l):
        """§11.2: P(l) = n_kv_heads * (m(0) + ... + m(l-1)), m = ks + vs: the
        number of index streams of the layers before l."""
        return d.H * self._msum[l]

    def n_streams(self, d):
        """§11.2: P(n_layers); n_layers * n_kv_heads * (k_stages + v_stages)
        for a uniform codebook."""
        return self.prefix(d, d.L)

    def stream_index(self, d, l, h, kv, s):
        """§11.2 canonical order: per layer and head, key stages then value
        stages: j = P(l) + h * m(l) + (kv = 0 ? s : ks(l) + s)."""
        lk, lv = self.stages(l)
        return self.prefix(d, l) + h * (lk + lv) + (s if kv == 0 else lk + s)

    def quantize(self, d, row, metric=None):
        """Greedy residual quantization of one row: the symbol of every index
        stream, in canonical order (the encoder is not specified, §1.1).
        Each stage picks the centroid c that minimises the error e = res - c
        of the residual res: e^T e, or e^T M e with M the matrix of the
        part (layer, codebook head, key or value) in `metric` (a Metric,
        §13.8) when it holds one."""
        parts = d.split_row(row)
        syms = [0] * self.n_streams(d)
        for (l, h), vecs in parts.items():
            hh = 0 if self.pooled else h
            for kv, stages in zip((0, 1), self.stages(l)):
                res = list(vecs[kv])
                M = metric.matrix(kv, l, hh) if metric is not None else None
                for s in range(stages):
                    best, bestd = 0, None
                    for c, cen in enumerate(self.tables[l][hh][kv][s]):
                        e = [a - b for a, b in zip(res, cen)]
                        if M is None:
                            dist = sum(x * x for x in e)
                        else:
                            dist = sum(x * sum(m * y for m, y in zip(Mi, e)) for x, Mi in zip(e, M))
                        if bestd is None or dist < bestd:
                            best, bestd = c, dist
                    res = [a - b for a, b in zip(res, self.tables[l][hh][kv][s][best])]
                    syms[self.stream_index(d, l, h, kv, s)] = best
        return syms

    def reconstruct(self, d, syms):
        """§13.6 reference computation, without RoPE (key_storage 0): the sum
        of the selected centroids in binary32, in stage order, converted to the
        descriptor's dtype. Returns the row bytes (§14.2 layout)."""
        if d.rope is not None and d.rope[3] == 1:
            raise WriteError("reconstruct: key_storage 1 (rotation) is not implemented here")
        parts = {}
        for l in range(d.L):
            for h in range(d.H):
                hh = 0 if self.pooled else h
                vecs = []
                for kv, stages, dim in zip((0, 1), self.stages(l), (d.Dk, d.Dv)):
                    acc = [0.0] * dim                # zero stages: the zero vector (§13.6)
                    for s in range(stages):
                        cen = self.tables[l][hh][kv][s][syms[self.stream_index(d, l, h, kv, s)]]
                        acc = [f32(a + f32(c)) for a, c in zip(acc, cen)]
                    vecs.append(acc)
                parts[(l, h)] = (vecs[0], vecs[1])
        return d.join_row(parts)


def random_codebook(rng, d, k, k_stages, v_stages, dtype, pooled=False, layer_stages=None):
    """Centroids of stage s are multiples of 2^-(3+3s) below 2^(1-3s) in
    magnitude: every sum of one centroid per stage is then exact in binary32
    and in f16 (at most 3 stages here), so the restored values do not depend
    on the summation order a reader uses (§13.6 only RECOMMENDS one).
    layer_stages: a layer table, one (ks, vs) pair per layer (§13.1, version
    1.1); k_stages and v_stages are then its maxima (or None)."""
    counts = layer_stages if layer_stages is not None else [(k_stages, v_stages)] * d.L
    if len(counts) != d.L:
        raise WriteError("random_codebook: one (ks, vs) pair per layer")
    if any(a > 3 or b > 3 for a, b in counts):
        raise WriteError("random_codebook: at most 3 stages (exact sums)")
    H = 1 if pooled else d.H
    tables = []
    for l in range(d.L):
        per_h = []
        for _h in range(H):
            per_kv = []
            for stages, dim in ((counts[l][0], d.Dk), (counts[l][1], d.Dv)):
                st = []
                for s in range(stages):
                    scale = 2.0 ** -(3 + 3 * s)
                    st.append([[rng.between(-16, 16) * scale for _ in range(dim)]
                               for _ in range(k)])
                per_kv.append(st)
            per_h.append(per_kv)
        tables.append(per_h)
    return Codebook(d.L, H, d.Dk, d.Dv, k, k_stages, v_stages, dtype, 1 if pooled else 0, tables,
                    layer_stages=layer_stages)


def random_row(rng, d):
    """A row of d.dtype elements in [-2, 2] (exact in every dtype)."""
    n = d.L * d.H * (d.Dk + d.Dv)
    if d.dtype == DT_F32:
        vals = [rng.between(-(1 << 20), 1 << 20) / float(1 << 19) for _ in range(n)]
    else:  # f16 / bf16: 8 significant bits fit both
        vals = [rng.between(-256, 256) / 128.0 for _ in range(n)]
    return encode_elems(vals, d.dtype)


# ------------------------------------------------- encoder metric (§13.8, 1.2)

def metric_fault(m):
    """Why the n x n matrix m (rows of numbers) may not be written or used
    (§13.8 check 7), or None: an element that is not finite, element (i, j)
    not equal to element (j, i), or a Cholesky pivot (binary64, column by
    column, L(j,j)^2 = M(j,j) - sum_{p<j} L(j,p)^2) not greater than zero."""
    n = len(m)
    for i in range(n):
        for j in range(n):
            if not math.isfinite(m[i][j]):
                return "element (%d, %d) is not finite" % (i, j)
    for i in range(n):
        for j in range(i):
            if m[i][j] != m[j][i]:
                return "elements (%d, %d) and (%d, %d) differ" % (i, j, j, i)
    L = [[0.0] * n for _ in range(n)]
    for j in range(n):
        piv = m[j][j]
        for p in range(j):
            piv -= L[j][p] * L[j][p]
        if not piv > 0.0:
            return "not positive definite (Cholesky pivot %d is %r)" % (j, piv)
        L[j][j] = math.sqrt(piv)
        for i in range(j + 1, n):
            t = m[i][j]
            for p in range(j):
                t -= L[i][p] * L[j][p]
            L[i][j] = t / L[j][j]
    return None


class Metric:
    """The encoder metric of a codebook (a CMET section, §13.8, version 1.2):
    mk[l][h] (key_dim x key_dim, parts bit 0) and mv[l][h] (value_dim x
    value_dim, parts bit 1) for every layer l and codebook head h (one per
    layer when the codebook is pooled), each a list of rows; the values are
    rounded to binary32 (dtype 3) and every matrix must be symmetric and
    positive definite (§13.8: writers MUST; WriteError otherwise)."""

    def __init__(self, codebook, mk=None, mv=None):
        cb = codebook
        self.parts = (1 if mk is not None else 0) | (2 if mv is not None else 0)
        if not self.parts:
            raise WriteError("a CMET holds key matrices, value matrices or both (§13.8)")
        if (mk is not None and cb.Dk > METRIC_MAX_DIM) or (mv is not None and cb.Dv > METRIC_MAX_DIM):
            raise WriteError("CMET matrices of more than %d rows (§13.8, §15)" % METRIC_MAX_DIM)
        self.L, self.H, self.Dk, self.Dv = cb.L, cb.H, cb.Dk, cb.Dv
        self.hash = cb.content_hash()
        self.m = {}
        for kv, mats, n in ((0, mk, cb.Dk), (1, mv, cb.Dv)):
            if mats is None:
                continue
            for l in range(cb.L):
                for h in range(cb.H):
                    m = mats[l][h]
                    if len(m) != n or any(len(r) != n for r in m):
                        raise WriteError("CMET %s[%d][%d] is not %d x %d (§13.8)"
                                         % ("MK" if kv == 0 else "MV", l, h, n, n))
                    m = [[f32(x) for x in r] for r in m]
                    bad = metric_fault(m)
                    if bad is not None:
                        raise WriteError("CMET %s[%d][%d]: %s (§13.8: writers write symmetric "
                                         "positive definite matrices)"
                                         % ("MK" if kv == 0 else "MV", l, h, bad))
                    self.m[(kv, l, h)] = m

    def matrix(self, kv, l, h):
        """The matrix of part kv (0 keys, 1 values), layer l, codebook head
        h, or None (Euclidean)."""
        return self.m.get((kv, l, h))

    def pack(self):
        """The CMET contents: the 64-byte header, then per layer and head MK
        and/or MV, f32, row-major (§13.8)."""
        out = bytearray(self.hash + struct.pack("<IIIIBB30x", self.L, self.H, self.Dk, self.Dv,
                                                self.parts, DT_F32))
        for l in range(self.L):
            for h in range(self.H):
                for kv in (0, 1):
                    m = self.m.get((kv, l, h))
                    if m is not None:
                        for r in m:
                            out += struct.pack("<%df" % len(r), *r)
        return bytes(out)

    @staticmethod
    def unpack(b, codebook):
        """The metric in CMET contents b for `codebook`, with the checks of
        §13.8 an encoder makes (a metric that fails them MUST NOT be used:
        WriteError)."""
        cb = codebook
        if len(b) < 64:
            raise WriteError("CMET shorter than 64 bytes (§13.8)")
        L, H, Dk, Dv, parts, dtype = struct.unpack_from("<IIIIBB", b, 16)
        if any(b[34:64]) or parts not in (1, 2, 3) or dtype != DT_F32:
            raise WriteError("CMET reserved bytes, parts or dtype (§13.8)")
        if bytes(b[:16]) != cb.content_hash() or (L, H, Dk, Dv) != (cb.L, cb.H, cb.Dk, cb.Dv):
            raise WriteError("the CMET does not describe this codebook (hash or shape, §13.8)")
        if (parts & 1 and Dk > METRIC_MAX_DIM) or (parts & 2 and Dv > METRIC_MAX_DIM):
            raise WriteError("CMET dimension above %d (§13.8, §15)" % METRIC_MAX_DIM)
        size = 64 + L * H * ((Dk * Dk if parts & 1 else 0) + (Dv * Dv if parts & 2 else 0)) * 4
        if len(b) != size:
            raise WriteError("CMET of %d bytes, its header says %d (§13.8)" % (len(b), size))
        mk = [[None] * H for _ in range(L)] if parts & 1 else None
        mv = [[None] * H for _ in range(L)] if parts & 2 else None
        o = 64
        for l in range(L):
            for h in range(H):
                for mats, n in ((mk, Dk), (mv, Dv)):
                    if mats is not None:
                        vals = struct.unpack_from("<%df" % (n * n), b, o)
                        mats[l][h] = [list(vals[i * n:(i + 1) * n]) for i in range(n)]
                        o += 4 * n * n
        return Metric(cb, mk, mv)


def random_metric(rng, codebook, parts):
    """A metric for codebook with the given parts (1 keys, 2 values, 3
    both): each matrix A A^T + I with A of integers in [-2, 2] (symmetric,
    positive definite, exact in binary32)."""
    cb = codebook

    def one(n):
        a = [[rng.between(-2, 2) for _ in range(n)] for _ in range(n)]
        return [[float(sum(a[i][p] * a[j][p] for p in range(n)) + (1 if i == j else 0))
                 for j in range(n)] for i in range(n)]

    mk = [[one(cb.Dk) for _ in range(cb.H)] for _ in range(cb.L)] if parts & 1 else None
    mv = [[one(cb.Dv) for _ in range(cb.H)] for _ in range(cb.L)] if parts & 2 else None
    return Metric(cb, mk, mv)


# -------------------------------------------------------------- sections

def sec_meta(entries):
    """A META section (§9.1) from (key, type, value) triples, in order.
    Types: "u64", "i64", "f64", "bool", "utf8", "bytes"."""
    out = bytearray(struct.pack("<II", len(entries), 0))
    seen = set()
    for key, typ, val in entries:
        kb = key.encode("utf-8")
        if not 1 <= len(kb) <= 255 or b"\x00" in kb:
            raise WriteError("META key length 1..255, no NUL (§9.1)")
        if kb.startswith(b"fkvf."):
            raise WriteError("META keys starting with 'fkvf.' are reserved (§9.2)")
        if kb in seen:
            raise WriteError("META key %r twice (§9.2)" % key)
        seen.add(kb)
        code, vb = {
            "u64": lambda v: (1, struct.pack("<Q", v)),
            "i64": lambda v: (2, struct.pack("<q", v)),
            "f64": lambda v: (3, struct.pack("<d", v)),
            "bool": lambda v: (4, b"\x01" if v else b"\x00"),
            "utf8": lambda v: (5, v.encode("utf-8")),
            "bytes": lambda v: (6, bytes(v)),
        }[typ](val)
        out += struct.pack("<HBBI", len(kb), code, 0, len(vb)) + kb + vb
    return bytes(out)


def sec_exac(d, first, rows):
    """An EXAC section (§14.1-§14.2): rows of positions first, first+1, ..."""
    rb = d.row_bytes()
    for r in rows:
        if len(r) != rb:
            raise WriteError("row of %d bytes, the descriptor needs %d" % (len(r), rb))
    return struct.pack("<QQB47x", first, len(rows), d.dtype) + b"".join(rows)


def quad_bits_for(k):
    """§11.8: the smallest even b with 2^b >= k."""
    b = 2
    while (1 << b) < k:
        b += 2
    return b


def quad_unit(b):
    """§11.6: the alignment unit u = 128 / gcd(b, 128)."""
    return 128 // math.gcd(b, 128)


def pack_quad(syms, b):
    """§12.1.4: the symbols packed little-endian at b bits each, zero-padded
    to a multiple of 128 bits (16-byte spans)."""
    z = 0
    for i, c in enumerate(syms):
        if not 0 <= c < (1 << b):
            raise WriteError("symbol %d does not fit %d bits" % (c, b))
        z |= c << (i * b)
    nbytes = (len(syms) * b + 127) // 128 * 16
    return z.to_bytes(nbytes, "little")


def sec_strm_quad(offset, group, b, k_stages, v_stages, first, streams, block_size):
    """A quad STRM segment (§11.2-§11.4) at absolute file offset `offset`
    (the header and block checksums are seeded with absolute offsets):
    `streams` lists the symbols [first, first + count) of every stream of
    the group, in canonical order."""
    count = len(streams[0]) if streams else 0
    if any(len(s) != count for s in streams):
        raise WriteError("the streams of a segment hold the same symbol range (§11)")
    if first % quad_unit(b):
        raise WriteError("first_symbol not a multiple of u (§11.6)")
    if block_size % 64 or not 64 <= block_size <= 1 << 20:
        raise WriteError("block_size: a multiple of 64 in 64..2^20 (§11.2)")
    data = b"".join(pack_quad(s, b) for s in streams)   # stream parts, canonical order
    n_blocks = (len(data) + block_size - 1) // block_size
    data_off = align64(64 + 8 * n_blocks)
    data_start = offset + data_off
    head = struct.pack("<QBBBBIQQII8sII", group, 1, b, k_stages, v_stages, 0, first, count,
                       0, block_size, bytes(8), len(streams), 0)
    head += struct.pack("<Q", xxh3_64(head, offset))
    table = b"".join(
        struct.pack("<Q", xxh3_64(data[i * block_size:(i + 1) * block_size],
                                  data_start + i * block_size))
        for i in range(n_blocks))
    out = head + table
    out += bytes(data_off - len(out))               # zero padding up to data_off (§11.3)
    return out + data


# ------------------------------------------------------- header, commit (§3, §7.6)

def file_header(required, optional):
    """The 64-byte header (§3): format_minor the lowest minor version that
    defines every bit it sets: 2 with ENCODER_METRIC (1.2), else 1 with
    LAYER_STAGES (1.1), else 0 (§1.3.1, §17.2)."""
    minor = 2 if optional & OPT_ENCODER_METRIC else 1 if required & REQ_LAYER_STAGES else 0
    h = MAGIC + b"\x00" + struct.pack("<HHHIIQQ16x", 1, minor, 64, 0x0A0B0C0D, 0, required,
                                      optional)
    return h + struct.pack("<Q", xxh3_64(h, 0))


class Section:
    """A section to lay out: its directory fields and its contents, which
    may depend on the absolute offset (STRM)."""

    def __init__(self, typ, key, contents, required=True):
        self.type, self.key, self.required = typ, key, required
        self.contents = contents      # bytes, or a function offset -> bytes


def build_commit(L0, sections, seq, n_positions, n_archived):
    """§7.6: the bytes of one commit appended to a file of length L0 (a
    multiple of 64, the end of the last trailer, or 64 after the header):
    sections tiled from L0, the directory, the trailer."""
    assert L0 % 64 == 0 and L0 >= 64
    out = bytearray()
    entries = []
    pos = L0
    for s in sections:
        off = align64(pos)
        out += bytes(off - pos)                           # padding (zeros, §4.1)
        body = s.contents(off) if callable(s.contents) else s.contents
        if len(body) > 1 << 48:
            raise WriteError("section larger than 2^48 bytes (§15)")
        out += body
        entries.append(struct.pack("<4sIQQQQQ16x", s.type, F_REQUIRED if s.required else 0,
                                   off, len(body), len(body), s.key, xxh3_64(body, off)))
        pos = off + len(body)
    dir_off = align64(pos)
    out += bytes(dir_off - pos)
    directory = struct.pack("<4sIQQQ32x", b"DIRC", len(entries), seq, n_positions,
                            n_archived) + b"".join(entries)
    out += directory
    T = dir_off + len(directory)                          # already a multiple of 64
    prev = 0 if seq == 1 else L0 - 64
    trl = struct.pack("<8sQQQQQQ", TRL_MAGIC, seq, dir_off, len(directory),
                      xxh3_64(directory, dir_off), prev, T + 64)
    trl += struct.pack("<Q", xxh3_64(trl, T))
    return bytes(out), trl


def archived_after(S, W, n, A):
    """The window policy of an appender (§14.3): keep at most W positions
    after the sinks and the archive exact; archive the oldest ones."""
    return max(A, n - S - W, 0)


# ---------------------------------------------------------- a new file (§7.6)

def create(path, d, rows, tokens=None, codebook=None, meta=None, block_size=4096,
           token_bits=16, sync=True, codebook_ref=None, metric=None):
    """Write a new one-commit archive: rows[p] is the row of position p
    (d.dtype elements, §14.2 layout). Positions [S, S + A) with
    A = archived_after(S, W, n, 0) are archived with `codebook` (required
    when A > 0); the others are stored exact. The codebook is embedded (a
    CBK1), or, when codebook_ref (a name hint) is given, referred to by a
    CBRF (§13.5; the codebook file is create_codebook_file's). A codebook
    with a layer table sets LAYER_STAGES and format_minor 1 (§3.4, §1.3.1).
    metric (a Metric of the embedded codebook): written as a CMET section
    with the ENCODER_METRIC optional bit (format_minor 2), and the encoder
    uses it (§13.8, §1.3.1). Returns (n, A)."""
    n = len(rows)
    S = d.S
    A = archived_after(S, d.W, n, 0) if codebook is not None else 0
    if codebook is not None and not codebook.matches(d):
        raise WriteError("the codebook does not fit the descriptor (§13.7)")
    if A > 0 and codebook.ks + codebook.vs == 0:
        raise WriteError("a codebook without stages cannot archive a position (§11.8)")
    if tokens is not None and len(tokens) != n:
        raise WriteError("one token id per position (§11.1)")
    if metric is not None and (codebook is None or codebook_ref is not None
                               or metric.hash != codebook.content_hash()):
        raise WriteError("a CMET goes with the CBK1 it describes: an embedded codebook, or the "
                         "codebook file of a CBRF (§13.8)")
    opt = OPT_TOKEN_STREAM if tokens is not None else 0
    if metric is not None:
        opt |= OPT_ENCODER_METRIC
    req = codebook.required_features() if codebook is not None else 0
    secs = [Section(b"DESC", 0, d.pack())]
    if meta is not None:
        secs.append(Section(b"META", 0, sec_meta(meta), required=False))
    if codebook is not None:
        if codebook_ref is None:
            secs.append(Section(b"CBK1", 0, codebook.pack()))
            if metric is not None:   # optional: REQUIRED clear (§13.8)
                secs.append(Section(b"CMET", 0, metric.pack(), required=False))
        else:
            req |= REQ_EXTERNAL_CODEBOOK
            secs.append(Section(b"CBRF", 0, sec_cbrf(codebook, codebook_ref)))
        if A > 0:
            # the index group: one segment, every stream's symbols [0, A)
            b = quad_bits_for(codebook.k)
            per_pos = [codebook.quantize(d, rows[p], metric) for p in range(S, S + A)]
            streams = [[per_pos[a][j] for a in range(A)]
                       for j in range(codebook.n_streams(d))]
            secs.append(Section(b"STRM", GROUP_INDEX, _strm(GROUP_INDEX, b, codebook.ks,
                                                            codebook.vs, 0, streams,
                                                            block_size)))
    if tokens is not None:
        secs.append(Section(b"STRM", GROUP_TOKEN, _strm(GROUP_TOKEN, token_bits, 0, 0, 0,
                                                        [list(tokens)], block_size)))
    secs += _exac_runs(d, [p for p in range(n) if p < S or p >= S + A], rows.__getitem__)
    body, trl = build_commit(64, secs, 1, n, A)
    _write_new(path, file_header(req, opt), body, trl, sync)
    return n, A


def create_codebook_file(path, codebook, sync=True, metric=None):
    """Write a codebook file (§13.4): one commit holding the CBK1 (and the
    CMET of `metric`, a Metric of this codebook, with the ENCODER_METRIC
    optional bit, §13.8), n_positions = n_archived = 0; LAYER_STAGES set
    (and format_minor 1) when the codebook has a layer table (§3.4)."""
    secs = [Section(b"CBK1", 0, codebook.pack())]
    if metric is not None:
        if metric.hash != codebook.content_hash():
            raise WriteError("the metric describes another codebook (§13.8)")
        secs.append(Section(b"CMET", 0, metric.pack(), required=False))
    body, trl = build_commit(64, secs, 1, 0, 0)
    _write_new(path, file_header(codebook.required_features(),
                                 OPT_ENCODER_METRIC if metric is not None else 0), body, trl, sync)


def sec_cbrf(codebook, name):
    """A CBRF section (§13.5): the codebook's content hash and a name hint."""
    nb = name.encode("utf-8")
    if len(nb) > 4096:
        raise WriteError("CBRF name longer than 4096 bytes (§13.5)")
    return codebook.content_hash() + struct.pack("<II", len(nb), 0) + nb


def _write_new(path, header, body, trl, sync):
    # written under a temporary name and renamed into place once durable (§7.6)
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(header)
        fh.write(body)
        _sync(fh, sync)          # sections and directory before the trailer
        fh.write(trl)
        _sync(fh, sync)
    os.replace(tmp, path)


def _strm(group, b, ks, vs, first, streams, block_size):
    return lambda off: sec_strm_quad(off, group, b, ks, vs, first, streams, block_size)


def _exac_runs(d, positions, row_of):
    """One EXAC section per run of consecutive positions (§14)."""
    secs = []
    run = []
    for p in positions + [None]:
        if run and (p is None or p != run[-1] + 1):
            secs.append(Section(b"EXAC", run[0], sec_exac(d, run[0], [row_of(q) for q in run])))
            run = []
        if p is not None:
            run.append(p)
    return secs


def _sync(fh, sync):
    fh.flush()
    if sync:
        os.fsync(fh.fileno())


# ------------------------------------------------------- appending (§7.4-§7.7)

class Opened:
    """What an appender needs of an existing archive, read from the file by
    §7.2 (clean case only) and §7.3."""

    def __init__(self, F):
        self.F = F
        n = len(F)
        if F[:9] != MAGIC or len(F) < 192:
            raise WriteError("not an FKVF file")
        if struct.unpack_from("<H", F, 10)[0] != 1 or F[16:20] != b"\x0d\x0c\x0b\x0a" \
                or struct.unpack_from("<Q", F, 56)[0] != xxh3_64(F[:56], 0):
            raise WriteError("unsupported or damaged header (§3.1)")
        self.required, self.optional = struct.unpack_from("<QQ", F, 24)
        if self.required & ~REQ_LAYER_STAGES:
            # this writer implements no other required feature when it
            # appends (ngon, deflate, external codebook), so it must not
            # append to such files (§17.5)
            raise WriteError("required feature bits 0x%x: not supported by this writer"
                             % (self.required & ~REQ_LAYER_STAGES))
        # §7.2 step 1: the last 64 bytes must be a valid trailer; a writer
        # never appends after a torn tail (§7.7)
        if n % 64 or self._trailer(n - 64) is None:
            raise WriteError("the file does not end with a valid trailer: torn or damaged "
                             "(§7.7: recover it first)")
        chain = []
        T = n - 64
        while True:
            t = self._trailer(T)
            if t is None or (chain and t[0] != chain[-1][0] - 1) or (t[0] == 1 and t[4] != 0):
                raise WriteError("broken commit chain at offset %d (§7.1)" % T)
            chain.append(t)
            if t[0] == 1:
                break
            T = t[4]
        chain.reverse()
        self.commits = chain
        self.seq = chain[-1][0]
        self.head = n - 64
        self.n, self.A = chain[-1][5], chain[-1][6]
        # every directory entry in section order (§7.3)
        self.entries = []
        for seq, dof, dsz, _dck, _prev, _n, _A in chain:
            cnt = struct.unpack_from("<I", F, dof + 4)[0]
            for i in range(cnt):
                typ, flags, off, stored, size, key, ck = struct.unpack_from(
                    "<4sIQQQQQ", F, dof + 64 + 64 * i)
                if flags & F_DEFLATE:
                    raise WriteError("deflated sections are not supported by this writer")
                self.entries.append((typ, key, off, stored, ck))
        descs = [e for e in self.entries if e[0] == b"DESC"]
        if len(descs) != 1:
            raise WriteError("not an archive: %d DESC sections" % len(descs))
        self.desc = Desc.unpack(self.contents(descs[0]))
        cbs = [e for e in self.entries if e[0] in (b"CBK1", b"CBRF")]
        self.codebook = None
        if cbs:
            if cbs[0][0] != b"CBK1":
                raise WriteError("an external codebook (CBRF) is not supported by this writer")
            self.codebook = Codebook.unpack(self.contents(cbs[0]))
            if self.codebook.required_features() & ~self.required:
                # a layer table in a file without LAYER_STAGES (§3.3)
                raise WriteError("the codebook has a layer table but the header lacks "
                                 "LAYER_STAGES (§3.3)")
        # the encoder metric (§13.8): at most one, only with the CBK1; an
        # encoder MUST NOT use one that fails its checks (and refuses the file)
        cmets = [e for e in self.entries if e[0] == b"CMET"]
        self.metric = None
        if len(cmets) > 1 or (cmets and self.codebook is None):
            raise WriteError("a second CMET, or a CMET without the CBK1 it describes (§13.8)")
        if cmets:
            if cmets[0][1] != 0:
                raise WriteError("CMET key %d != 0 (§13.8)" % cmets[0][1])
            self.metric = Metric.unpack(self.contents(cmets[0]), self.codebook)
        self.groups = {}
        for e in self.entries:
            if e[0] == b"STRM":
                self._apply_segment(e)
        metas = [e for e in self.entries if e[0] == b"META"]
        self.meta_entry = metas[-1] if metas else None

    def _trailer(self, T):
        """The trailer at T if it passes the checks of §6.2 this writer
        relies on, else None: (seq, dir_offset, dir_size, dir_checksum,
        prev_trailer, n_positions, n_archived)."""
        F = self.F
        if T < 128 or F[T:T + 8] != TRL_MAGIC or \
                struct.unpack_from("<Q", F, T + 56)[0] != xxh3_64(F[T:T + 56], T):
            return None
        seq, dof, dsz, dck, prev, fsz = struct.unpack_from("<6Q", F, T + 8)
        if fsz != T + 64 or dof % 64 or dof + dsz != T or dsz < 64 or \
                xxh3_64(F[dof:dof + dsz], dof) != dck or F[dof:dof + 4] != b"DIRC":
            return None
        cs, n, A = struct.unpack_from("<QQQ", F, dof + 8)
        if cs != seq or dsz != 64 + 64 * struct.unpack_from("<I", F, dof + 4)[0]:
            return None
        return seq, dof, dsz, dck, prev, n, A

    def contents(self, e):
        """A section's bytes after its checksum was verified (§4.6)."""
        _typ, _key, off, stored, ck = e
        b = self.F[off:off + stored]
        if len(b) != stored or xxh3_64(b, off) != ck:
            raise WriteError("section at %d fails its checksum (§4.6)" % off)
        return b

    def _apply_segment(self, e):
        """§11.6: cut the group's streams to first_symbol, then append the
        segment's symbols (quad only)."""
        b = self.contents(e)
        group, profile, bits, ks, vs, _alph, first, count, _L, bs, _r, ns = \
            struct.unpack_from("<QBBBBIQQII8sI", b, 0)
        if profile != 1:
            raise WriteError("ngon streams are not supported by this writer")
        stream_bytes = (count * bits + 127) // 128 * 16
        n_blocks = (ns * stream_bytes + bs - 1) // bs
        data_off = align64(64 + 8 * n_blocks)
        g = self.groups.setdefault(group, {"bits": bits, "ks": ks, "vs": vs,
                                           "streams": [[] for _ in range(ns)]})
        mask = (1 << bits) - 1
        for j in range(ns):
            z = int.from_bytes(b[data_off + j * stream_bytes:data_off + (j + 1) * stream_bytes],
                               "little")
            g["streams"][j][first:] = [(z >> (i * bits)) & mask for i in range(count)]

    def exact_row(self, p):
        """Position p's row from the last EXAC section that covers it (§14.3)."""
        rb = self.desc.row_bytes()
        for e in reversed(self.entries):
            if e[0] == b"EXAC":
                b = self.contents(e)
                first, count = struct.unpack_from("<QQ", b, 0)
                if first <= p < first + count:
                    return bytes(b[64 + (p - first) * rb:64 + (p - first + 1) * rb])
        raise WriteError("position %d has no EXAC row" % p)


def append(path, new_rows, new_tokens=None, meta=None, block_size=4096, sync=True):
    """Append one commit that adds the positions new_rows (and their token
    ids, when the archive has a token stream), archiving the positions that
    leave the window (§7.6.1). `meta`, if given, is the complete new
    metadata (a META replaces every earlier one, §9.3). Only bytes after the
    current end of the file are written (§7.4). Returns (n, A) after it."""
    with open(path, "r+b") as fh:
        if fcntl is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)   # one appender (§18.5)
        F = fh.read()
        o = Opened(F)
        d, cb = o.desc, o.codebook
        S, n0, A0 = d.S, o.n, o.A
        n1 = n0 + len(new_rows)
        A1 = archived_after(S, d.W, n1, A0) if cb is not None else A0
        if A1 > A0 and cb is None:
            raise WriteError("positions to archive but no codebook")
        if A1 > A0 and cb.ks + cb.vs == 0:
            raise WriteError("a codebook without stages cannot archive a position (§11.8)")

        def row(p):                   # the original bits of position p
            return new_rows[p - n0] if p >= n0 else o.exact_row(p)

        secs = []
        if meta is not None:
            secs.append(Section(b"META", 0, sec_meta(meta), required=False))
        if A1 > A0:
            # one index segment from the last multiple of u not above A0: the
            # symbols already stored there again, then the new ones (§11.6)
            g = o.groups.get(GROUP_INDEX)
            b = g["bits"] if g else quad_bits_for(cb.k)
            u = quad_unit(b)
            first = A0 // u * u
            new = [cb.quantize(d, row(p), o.metric) for p in range(S + A0, S + A1)]
            streams = []
            for j in range(cb.n_streams(d)):
                old = g["streams"][j][first:A0] if g else []
                streams.append(old + [new[a][j] for a in range(A1 - A0)])
            secs.append(Section(b"STRM", GROUP_INDEX,
                                _strm(GROUP_INDEX, b, cb.ks, cb.vs, first, streams, block_size)))
        tg = o.groups.get(GROUP_TOKEN)
        if (tg is None) != (new_tokens is None) or \
                (new_tokens is not None and len(new_tokens) != len(new_rows)):
            raise WriteError("token ids: one per new position exactly when the archive "
                             "has a token stream (§11.8)")
        if tg is not None:
            u = quad_unit(tg["bits"])
            first = n0 // u * u
            secs.append(Section(b"STRM", GROUP_TOKEN,
                                _strm(GROUP_TOKEN, tg["bits"], 0, 0, first,
                                      [tg["streams"][0][first:n0] + list(new_tokens)],
                                      block_size)))
        # EXAC: the new positions that are exact after the commit (new sinks
        # and the recent window), one section per contiguous run
        exact = [p for p in range(n0, n1) if p < S or p >= S + A1]
        secs += _exac_runs(d, exact, row)
        body, trl = build_commit(len(F), secs, o.seq + 1, n1, A1)
        fh.seek(len(F))
        fh.write(body)
        _sync(fh, sync)                # sections and directory before the trailer (§7.6)
        fh.write(trl)
        _sync(fh, sync)
    return n1, A1


# --------------------------------------------------------- demonstration files

class Expect:
    """What a demonstration file holds, derived from the writer's inputs
    (the original rows, the codebook and the window policy), not from the
    file: writer_check.py compares libfkvf and the second reader with it."""

    def __init__(self, name, d, cb, rows, tokens, n, A, commits, meta, metric=None):
        self.name, self.desc, self.codebook, self.metric = name, d, cb, metric
        self.n, self.A, self.commits = n, A, commits
        self.tokens = list(tokens[:n]) if tokens is not None else None
        self.meta = meta
        S = d.S
        self.rows_in = rows     # the rows the writer was given
        self.rows = []          # the row a reader restores, per position (§14.4)
        self.archived = []      # per archived position: its symbols, canonical order
        for p in range(n):
            if S <= p < S + A:
                syms = cb.quantize(d, rows[p], metric)
                self.archived.append(syms)
                self.rows.append(cb.reconstruct(d, syms))
            else:
                self.rows.append(rows[p])
        self.exact = [p for p in range(n) if not S <= p < S + A]


def write_demo(outdir, sync=False):
    """Write the demonstration files into outdir; returns their Expects."""
    os.makedirs(outdir, exist_ok=True)
    out = []

    def path(name):
        return os.path.join(outdir, name)

    # (a) exact rows only: 2 layers x 2 heads, Dk 4 != Dv 3, f16, 6 positions
    rng = Rng(17)
    d = Desc(2, 2, 4, 3, DT_F16, n_sinks=4, window=16, model_id="pyw exact-only demo")
    rows = [random_row(rng, d) for _ in range(6)]
    meta = [("org.example.writer", "utf8", "fkvf_write.py"), ("org.example.seed", "u64", 17),
            ("org.example.offset", "i64", -3), ("org.example.temperature", "f64", 0.75),
            ("org.example.greedy", "bool", True), ("org.example.blob", "bytes", b"\x00\xff")]
    n, A = create(path("pyw_exact.fkvf"), d, rows, meta=meta, sync=sync)
    out.append(Expect("pyw_exact.fkvf", d, None, rows, None, n, A, 1, meta))

    # (b) an archive: 1 layer, 1 head, k = 16 (4-bit quad, u = 32), 1 key and
    # 1 value stage; S = 2, W = 4; 46 positions, so 40 archived; token ids
    rng = Rng(18)
    d = Desc(1, 1, 8, 8, DT_F16, n_sinks=2, window=4, model_id="pyw archive demo",
             tokenizer_id="pyw-synthetic-50k")
    cb = random_codebook(rng, d, k=16, k_stages=1, v_stages=1, dtype=DT_F16)
    rows = [random_row(rng, d) for _ in range(56)]
    tokens = [rng.below(50000) for _ in range(56)]
    meta_b = [("org.example.writer", "utf8", "fkvf_write.py"), ("org.example.commit", "u64", 1)]
    n, A = create(path("pyw_archive.fkvf"), d, rows[:46], tokens=tokens[:46], codebook=cb,
                  meta=meta_b, block_size=64, sync=sync)
    out.append(Expect("pyw_archive.fkvf", d, cb, rows, tokens, n, A, 1, meta_b))

    # (c) (b) plus a commit of 10 positions: positions 42..51 leave the
    # window (A 40 -> 50, index segment from 32 = the last multiple of u
    # not above 40), 52..55 are the new window; token segment from 40
    with open(path("pyw_archive.fkvf"), "rb") as fh:
        data = fh.read()
    with open(path("pyw_appended.fkvf"), "wb") as fh:
        fh.write(data)
    meta_c = [("org.example.writer", "utf8", "fkvf_write.py"), ("org.example.commit", "u64", 2)]
    n, A = append(path("pyw_appended.fkvf"), rows[46:56], new_tokens=tokens[46:56],
                  meta=meta_c, block_size=64, sync=sync)
    out.append(Expect("pyw_appended.fkvf", d, cb, rows, tokens, n, A, 2, meta_c))

    # (d) 2 layers x 2 heads, Dk 8, Dv 4, f32 rows; k = 32 (6-bit quad,
    # u = 64), 2 key + 1 value stages, f32 codebook; RoPE described
    # (half-split, 4 dims) but keys archived as cached (key_storage 0);
    # S = 3, W = 5, 80 positions: 72 archived (one unit and 8 more)
    rng = Rng(19)
    d = Desc(2, 2, 8, 4, DT_F32, n_sinks=3, window=5, model_id="pyw multi demo",
             rope=(2, 4, 10000.0, 0))
    cb = random_codebook(rng, d, k=32, k_stages=2, v_stages=1, dtype=DT_F32)
    rows = [random_row(rng, d) for _ in range(160)]
    n, A = create(path("pyw_multi.fkvf"), d, rows[:80], codebook=cb, block_size=128, sync=sync)
    out.append(Expect("pyw_multi.fkvf", d, cb, rows, None, n, A, 1, None))

    # (e) (d) plus two commits: 3 positions (A 72 -> 75: segment from 64,
    # 6-bit symbols re-stored across the segment boundary), then 77
    # positions, more than the window: most are archived without ever
    # having been stored exact
    with open(path("pyw_multi.fkvf"), "rb") as fh:
        data = fh.read()
    with open(path("pyw_multi_appended.fkvf"), "wb") as fh:
        fh.write(data)
    append(path("pyw_multi_appended.fkvf"), rows[80:83], block_size=128, sync=sync)
    n, A = append(path("pyw_multi_appended.fkvf"), rows[83:160], block_size=64, sync=sync)
    out.append(Expect("pyw_multi_appended.fkvf", d, cb, rows, None, n, A, 3, None))

    # (f) per-layer stage counts (LAYER_STAGES, version 1.1): 4 layers x 2
    # heads, Dk 4, Dv 6, f16 rows; k = 16 (4-bit quad, u = 32); the layer
    # table (2, 1), (0, 1), (0, 0), (1, 2): layer 1 has no key stage, layer
    # 2 no stage at all (its keys and values restore as zero vectors);
    # header k_stages 2, v_stages 2; m = 3, 1, 0, 3, so P(0..4) = 0, 6, 8,
    # 8, 14 and n_streams = P(4) = 14 (32 for a uniform 2 + 2 codebook);
    # S = 2, W = 3, 40 positions: 35 archived; token ids
    rng = Rng(20)
    d = Desc(4, 2, 4, 6, DT_F16, n_sinks=2, window=3, model_id="pyw layer-stages demo",
             tokenizer_id="pyw-synthetic-1k")
    cb = random_codebook(rng, d, k=16, k_stages=None, v_stages=None, dtype=DT_F16,
                         layer_stages=LAYERS_DEMO)
    rows = [random_row(rng, d) for _ in range(70)]
    tokens = [rng.below(1000) for _ in range(70)]
    n, A = create(path("pyw_layers.fkvf"), d, rows[:40], tokens=tokens[:40], codebook=cb,
                  block_size=64, sync=sync)
    out.append(Expect("pyw_layers.fkvf", d, cb, rows, tokens, n, A, 1, None))

    # (g) (f) plus two commits: 2 positions (A 35 -> 37: index segment from
    # 32, the partial unit re-stored), then 28 (A -> 65)
    with open(path("pyw_layers.fkvf"), "rb") as fh:
        data = fh.read()
    with open(path("pyw_layers_appended.fkvf"), "wb") as fh:
        fh.write(data)
    append(path("pyw_layers_appended.fkvf"), rows[40:42], new_tokens=tokens[40:42],
           block_size=64, sync=sync)
    n, A = append(path("pyw_layers_appended.fkvf"), rows[42:70], new_tokens=tokens[42:70],
                  block_size=128, sync=sync)
    out.append(Expect("pyw_layers_appended.fkvf", d, cb, rows, tokens, n, A, 3, None))

    # (h) an encoder metric (CMET, version 1.2, §13.8): 2 layers x 2 heads,
    # Dk 4, Dv 3, f16; k = 16, 2 key + 1 value stages; a CMET with key and
    # value matrices (parts 3), which the encoder uses (e^T M e); S = 2,
    # W = 3, 36 positions: 31 archived; token ids
    rng = Rng(21)
    d = Desc(2, 2, 4, 3, DT_F16, n_sinks=2, window=3, model_id="pyw encoder-metric demo",
             tokenizer_id="pyw-synthetic-1k")
    cb = random_codebook(rng, d, k=16, k_stages=2, v_stages=1, dtype=DT_F16)
    met = random_metric(rng, cb, 3)
    rows = [random_row(rng, d) for _ in range(60)]
    tokens = [rng.below(1000) for _ in range(60)]
    n, A = create(path("pyw_metric.fkvf"), d, rows[:36], tokens=tokens[:36], codebook=cb,
                  block_size=64, sync=sync, metric=met)
    out.append(Expect("pyw_metric.fkvf", d, cb, rows, tokens, n, A, 1, None, met))

    # (i) (h) plus a commit of 24 positions: the appender reads the CMET
    # from the file and encodes the newly archived positions with it
    with open(path("pyw_metric.fkvf"), "rb") as fh:
        data = fh.read()
    with open(path("pyw_metric_appended.fkvf"), "wb") as fh:
        fh.write(data)
    n, A = append(path("pyw_metric_appended.fkvf"), rows[36:60], new_tokens=tokens[36:60],
                  block_size=64, sync=sync)
    out.append(Expect("pyw_metric_appended.fkvf", d, cb, rows, tokens, n, A, 2, None, met))
    return out


# the layer table of the LAYER_STAGES demonstration files (§13.1)
LAYERS_DEMO = [(2, 1), (0, 1), (0, 0), (1, 2)]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: fkvf_write.py OUTDIR   (writes pyw_*.fkvf, see the module docstring)",
              file=sys.stderr)
        return 2
    try:
        exps = write_demo(argv[0], sync=True)
    except (WriteError, OSError) as x:
        print("fkvf_write: %s" % x, file=sys.stderr)
        return 1
    for e in exps:
        S, A, n = e.desc.S, e.A, e.n
        arch = "[%d, %d)" % (S, S + A) if A else "none"
        print("%-24s %d commit(s), %d positions: exact %s, archived %s%s"
              % (e.name, e.commits, n, _runs(e.exact), arch,
                 ", %d token ids" % len(e.tokens) if e.tokens is not None else ""))
    return 0


def _runs(ps):
    """[0, 1, 2, 5, 6] -> "[0, 3) [5, 7)"."""
    out = []
    for p in ps:
        if out and out[-1][1] == p:
            out[-1][1] = p + 1
        else:
            out.append([p, p + 1])
    return " ".join("[%d, %d)" % (a, b) for a, b in out) or "none"


if __name__ == "__main__":
    sys.exit(main())
