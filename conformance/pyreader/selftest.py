#!/usr/bin/env python3
"""Self-test of the second FKVF reader: the hash test vectors of spec §2.6,
the header checksums of §2.7, the one-commit file of §7.8, the stream
segment of §11.9, and the worked
examples of §12.1.6 (quad points), §12.2.9 (ngon span) and §20.6 (ZIDX
order). Every expected value below is taken from the spec text, not from
the code under test. Exit 0 when all pass.

Per-layer stage counts (LAYER_STAGES, version 1.1, §13.1-§13.2, §11.2):
the layout of a small codebook (3 layers with the pairs (2, 1), (0, 1),
(0, 0); 2 heads, k 16, key_dim = value_dim = 4, f16) is computed by hand
below from the formulas of §11.2 and §13.2, its CBK1 bytes are built by
hand, and the reader (and the writer, fkvf_write.py) must agree with them;
the reader's checks of §13.1, §11.2 step 6, §11.8, §13.5 and §20 are then
exercised on files built with fkvf_write.py, each expected class taken from
the clause cited.

The encoder metric (CMET, version 1.2, §13.8): check 7 (finite, symmetric,
binary64 Cholesky pivots above zero) on 2 x 2 matrices worked by hand, and
a file of the Python writer with a CMET, its hash changed (CORRUPT in full
verification only) and its REQUIRED flag set (SECTION in both modes)."""

import math
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xxh3 import xxh3_64, xxh3_128, xxh3_128_canonical  # noqa: E402
import fkvf_read as R  # noqa: E402
import fkvf_write as W  # noqa: E402

failures = []


def check(name, got, want):
    if got != want:
        failures.append(name)
        print("FAIL %s: got %r, want %r" % (name, got, want))
    else:
        print("ok   %s" % name)


# §2.6
check("XXH3-64 empty", xxh3_64(b"", 0), 0x2D06800538D394C2)
check("XXH3-64 FKVF", xxh3_64(b"FKVF", 0), 0x5C976DB85D8CCF05)
check("XXH3-64 FKVF seed 64", xxh3_64(b"FKVF", 64), 0x0BB66A889FEC8EC6)
check("XXH3-64 64 zeros", xxh3_64(bytes(64), 0), 0x2FFB6918C12C256E)
check("XXH3-64 64 zeros seed 64", xxh3_64(bytes(64), 64), 0xB0160506D04CBC27)
check("XXH3-64 1000 bytes seed 4096", xxh3_64(bytes(i % 256 for i in range(1000)), 4096),
      0x0BF0AE4CA7A22B72)
check("XXH3-64 stored bytes", struct.pack("<Q", xxh3_64(b"FKVF", 64)),
      bytes.fromhex("c68eec9f886ab60b"))
check("XXH3-128 empty", xxh3_128(b""), (0x99AA06D3014798D8, 0x6001C324468D497F))
check("XXH3-128 FKVF", xxh3_128(b"FKVF"), (0x8FA164C58A47CBAB, 0xBFEAAAAEB18E5B40))
check("XXH3-128 canonical", xxh3_128_canonical(b"FKVF"),
      bytes.fromhex("8fa164c58a47cbabbfeaaaaeb18e5b40"))

# §2.7
hdr = bytearray(bytes.fromhex("89464b56460d0a1a0a00010000004000" "0d0c0b0a") + bytes(40))
check("§2.7 header checksum", xxh3_64(bytes(hdr[:56]), 0), 0xF9B97CBF2D77F179)
hdr[24] = 3
hdr[32] = 1
check("§2.7 header checksum, features", xxh3_64(bytes(hdr[:56]), 0), 0xD320A4286AC70E07)

# §7.8
F78 = bytes.fromhex(
    "89464b56460d0a1a0a000100000040000d0c0b0a000000000000000000000000"
    "00000000000000000000000000000000000000000000000079f1772dbf7cb9f9"
    "0100000001000000010000000100000001000000000000000000000000000000"
    "0400000020000000040000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000"
    "64656d6f00000000000000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000"
    "0000000000000000020000000000000001000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000"
    "003c00c000380042000000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000"
    "4449524302000000010000000000000002000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000"
    "4445534301000000400000000000000084000000000000008400000000000000"
    "0000000000000000f77c1f95b79fcaf300000000000000000000000000000000"
    "4558414301000000000100000000000048000000000000004800000000000000"
    "0000000000000000cf984455601c838200000000000000000000000000000000"
    "89464b5654524c0a01000000000000008001000000000000c000000000000000"
    "f3e814e7e0e7592300000000000000008002000000000000c03f41ad4e6f5c5b"
)
check("§7.8 length", len(F78), 640)
check("§7.8 DESC checksum", xxh3_64(F78[64:196], 64), 0xF3CA9FB7951F7CF7)
check("§7.8 EXAC checksum", xxh3_64(F78[256:328], 256), 0x82831C60554498CF)
check("§7.8 directory checksum", xxh3_64(F78[384:576], 384), 0x2359E7E0E714E8F3)
check("§7.8 trailer checksum", xxh3_64(F78[576:632], 576), 0x5B5C6F4EAD413FC0)
# §11.9: the token stream segment given byte for byte (tokens 3 1 4 1 5,
# quad b = 8, block_size 64, at offset 256)
S119 = bytes.fromhex(
    "0100000000000000010800000000000000000000000000000500000000000000"
    "000000004000000000000000000000000100000000000000493d2ecffbd7035f"
    "ac6b54682fe2b461000000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000"
    "03010401050000000000000000000000"
)
check("§11.9 segment size", len(S119), 144)
check("§11.9 header fields", struct.unpack_from("<QBBBBIQQII", S119, 0),
      (1, 1, 8, 0, 0, 0, 0, 5, 0, 64))
check("§11.9 head_checksum", xxh3_64(S119[:56], 256), 0x5F03D7FBCF2E3D49)
check("§11.9 head_checksum stored", struct.unpack_from("<Q", S119, 56)[0], 0x5F03D7FBCF2E3D49)
check("§11.9 block checksum", xxh3_64(S119[128:144], 384), 0x61B4E22F68546BAC)
check("§11.9 block checksum stored", struct.unpack_from("<Q", S119, 64)[0], 0x61B4E22F68546BAC)
check("§11.9 section checksum", xxh3_64(S119, 256), 0x685FFE4321BB2932)
check("§11.9 symbols", list(S119[128:133]), [3, 1, 4, 1, 5])
# the digest as spec Annex A defines it, from the rows §7.8 lists
want = xxh3_64(struct.pack("<Q", 2) + bytes(16) + b"\x00" + bytes.fromhex("003c00c0")
               + b"\x00" + bytes.fromhex("00380042") + struct.pack("<Q", 0), 0)
for mode in ("verify", "open"):
    check("§7.8 file accepted, digest (%s)" % mode, R.Reader(F78, mode).run(), want)


# §13.5, §16.3: a candidate codebook file that cannot be read is an
# environment failure (exit 2), not CODEBOOK
SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "files")
check("§13.5 unreadable candidate: exit 2",
      R.main(["--codebook", os.path.join(SUITE, "no-such-codebook.fkvf"),
              os.path.join(SUITE, "valid_cbrf.fkvf")]), 2)


def cls_of(data, mode="verify"):
    try:
        R.Reader(bytes(data), mode).run()
        return "accept"
    except R.Reject as e:
        return e.cls


bad = bytearray(F78)
bad[0x141] ^= 1          # a row byte of EXAC
check("§7.8 EXAC byte flipped", cls_of(bad), "CHECKSUM")
check("§7.8 cut to 639 bytes", cls_of(F78[:639]), "TRUNCATED")
check("§7.8 + 64 zero bytes (verify)", cls_of(F78 + bytes(64)), "TORN")
check("§7.8 + 64 zero bytes (open)", cls_of(F78 + bytes(64), "open"), "accept")
check("§7.8 header only", cls_of(F78[:64]), "TRUNCATED")
# §3.4: bit 3 (LAYER_STAGES, version 1.1) is defined, bit 4 is the first
# reserved one (FEATURE, §3.1 step 8); a bit MAY be set for a feature no
# commit uses (§3.3): the §7.8 file with bit 3 set is valid, same digest
for bit, want_cls in ((3, "accept"), (4, "FEATURE")):
    bad = bytearray(F78)
    bad[24] = 1 << bit
    bad[56:64] = struct.pack("<Q", xxh3_64(bytes(bad[:56]), 0))
    check("§3.4 §7.8 file with required bit %d" % bit, cls_of(bad), want_cls)
bad = bytearray(F78)
bad[0x150] = 1           # padding after EXAC (ends at 0x148)
check("§7.8 padding byte (verify)", cls_of(bad), "PADDING")
check("§7.8 padding byte (open)", cls_of(bad, "open"), "accept")

# §12.1.6: z_0 = 0x1B << 120, z_1 = 0xE41B << 112
check("§12.1.6 quad points", R.quad_points([0x1B, 0xE4], 8), [0x1B << 120, 0xE41B << 112])

# §12.2.9: N = 4, r = 0.5, span [1, 2, 3]
V4 = [(1.0, 0.0), (0.0, 1.0), (-1.0, 0.0), (0.0, -1.0)]
px, py = R.encode([1, 2, 3], V4, 0.5)
anchor = struct.pack("<dd", px, py)
check("§12.2.9 anchor", anchor, bytes.fromhex("000000000000d0bf000000000000d8bf"))
check("§12.2.9 decode", R.decode_span(anchor, 3, V4, 0.5, 0), [1, 2, 3])
try:
    R.decode_span(bytes.fromhex("000000000000d0bf000000000000d9bf"), 3, V4, 0.5, 0)
    check("§12.2.5 damaged anchor", "accept", "SPAN")
except R.Reject as e:
    check("§12.2.5 damaged anchor", e.cls, "SPAN")

# §20.6: the sorted order of the 16 points
c = [7, 1, 2, 7, 1, 2, 3, 7, 1, 2, 7, 1, 2, 7, 1, 5]
z = R.quad_points(c, 8)
order = sorted(range(16), key=lambda t: (z[t], t))
check("§20.6 ZIDX order", order, [1, 4, 14, 11, 8, 2, 5, 12, 9, 6, 15, 0, 3, 13, 10, 7])
check("§20.6 entry 5 key", z[2].to_bytes(16, "little"), bytes(13) + bytes([7, 1, 2]))

# §20.3 Q and morton
check("§20.3 Q(-1), Q(1), Q(0)", (R.qz(-1.0), R.qz(1.0), R.qz(0.0)), (0, 4294967295, 2147483648))
check("§20.3 morton", R.morton(0xFFFFFFFF, 0), 0x5555555555555555)

# ---------------------------------------------------------------------------
# LAYER_STAGES (version 1.1): per-layer stage counts, §13.1, §13.2, §11.2.
# The example: n_layers 3 with the layer table (2, 1), (0, 1), (0, 0);
# n_heads = n_kv_heads 2, k 16, key_dim 4, value_dim 4, f16 (e = 2).
# By hand, from the spec's formulas:
#   header k_stages = max ks = 2, v_stages = max vs = 1 (§13.1)
#   T = align64(2 x 3) = 64
#   per_head(0) = 16 x (2 x 4 + 1 x 4) x 2 = 384
#   per_head(1) = 16 x (0 x 4 + 1 x 4) x 2 = 128
#   per_head(2) = 0
#   base(0,0) = 64 + 64 = 128         base(0,1) = 128 + 384 = 512
#   base(1,0) = 128 + 2 x 384 = 896   base(1,1) = 896 + 128 = 1024
#   base(2,h) = 128 + 2 x (384 + 128) + h x 0 = 1152
#   size = 64 + 64 + 2 x (384 + 128 + 0) = 1152
#   (the same header with layer_stages 0: 64 + 3 x 2 x 384 = 2368)
#   K[0][1][1] row 3  at base(0,1) + (1 x 16 + 3) x 4 x 2 = 664
#   V[0][0][0] row 5  at base(0,0) + 2 x 16 x 4 x 2 + 5 x 4 x 2 = 424
#   V[1][0][0] row 0  at base(1,0) + 0 = 896
#   V[1][1][0] row 15 at base(1,1) + 0 + 15 x 4 x 2 = 1144 (the last row: 1144 + 8 = size)
#   m = 3, 1, 0: P(0) = 0, P(1) = 2 x 3 = 6, P(2) = 6 + 2 x 1 = 8,
#   P(3) = 8 = n_streams (a uniform 2 + 1 codebook: 3 x 2 x 3 = 18)
#   j = P(l) + h x m(l) + (kv = 0 ? s : ks(l) + s):
#   (0,0,K,0) 0, (0,0,K,1) 1, (0,0,V,0) 2, (0,1,K,0) 3, (0,1,K,1) 4,
#   (0,1,V,0) 5, (1,0,V,0) 6, (1,1,V,0) 7
LT = [(2, 1), (0, 1), (0, 0)]
# the CBK1 contents by hand: the header (byte 24 layer_stages = 1), the
# table's pairs and 58 zero bytes, then 512 f16 elements whose values are
# their own index (exact in f16), so a row's values tell where it was read
cbk_hand = (struct.pack("<5I", 3, 2, 4, 4, 16) + bytes([2, 1, 1, 0, 1]) + bytes(39)
            + bytes([2, 1, 0, 1, 0, 0]) + bytes(58)
            + struct.pack("<512e", *[float(i) for i in range(512)]))
check("LS hand CBK1 length", len(cbk_hand), 1152)
try:
    c = R.parse_cbk1_contents(cbk_hand, 0, R.FEAT_LAYER)
    check("LS §13.1 T, size, header maxima", (c.T, c.size, c.ks, c.vs, c.layer_stages),
          (64, 1152, 2, 1, 1))
    check("LS §13.1 layer counts", [c.stages(l) for l in range(3)], LT)
    check("LS §13.2 base(l, h)", [c.base(l, h) for l in range(3) for h in range(2)],
          [128, 512, 896, 1024, 1152, 1152])
    check("LS §13.2 row offsets", (c.key_row(0, 0, 0, 0), c.key_row(0, 1, 1, 3), c.value_row(0, 0, 0, 5),
                                   c.value_row(1, 0, 0, 0), c.value_row(1, 1, 0, 15)),
          (128, 664, 424, 896, 1144))
    check("LS §13.2 K[0][1][1] row 3 read", list(c.row(0, 0, 1, 1, 3)), [268.0, 269.0, 270.0, 271.0])
    check("LS §13.2 V[1][1][0] row 15 read", list(c.row(1, 1, 1, 0, 15)), [508.0, 509.0, 510.0, 511.0])
    check("LS §11.2 P(0..3)", [c.prefix(2, l) for l in range(4)], [0, 6, 8, 8])
    check("LS §11.2 canonical j", [c.stream_j(2, 0, 0, 0, 0), c.stream_j(2, 0, 0, 0, 1),
                                    c.stream_j(2, 0, 0, 1, 0), c.stream_j(2, 0, 1, 0, 0),
                                    c.stream_j(2, 0, 1, 0, 1), c.stream_j(2, 0, 1, 1, 0),
                                    c.stream_j(2, 1, 0, 1, 0), c.stream_j(2, 1, 1, 1, 0)],
          [0, 1, 2, 3, 4, 5, 6, 7])
except R.Reject as x:
    check("LS hand CBK1 accepted", x.message(), "accepted")

# the writer lays the same codebook out byte for byte (tables filled in
# the order §13.2 lists them: element values 0, 1, 2, ...)
ctr = iter(range(512))
wtabs = [[[[[[float(next(ctr)) for _ in range(4)] for _ in range(16)] for _ in range(n)]
           for n in LT[l]] for _h in range(2)] for l in range(3)]
wcb = W.Codebook(3, 2, 4, 4, 16, None, None, W.DT_F16, 0, wtabs, layer_stages=LT)
check("LS writer CBK1 = the hand-built bytes", wcb.pack() == cbk_hand, True)
wd = W.Desc(3, 2, 4, 4, W.DT_F16, n_sinks=1, window=2)
check("LS writer n_streams, P(l)", (wcb.n_streams(wd), [wcb.prefix(wd, l) for l in range(4)]),
      (8, [0, 6, 8, 8]))
check("LS writer canonical j", [wcb.stream_index(wd, 0, 1, 1, 0), wcb.stream_index(wd, 1, 0, 1, 0),
                                 wcb.stream_index(wd, 1, 1, 1, 0)], [5, 6, 7])
check("LS writer: equal pairs stored uniform (§13.1 SHOULD)",
      W.Codebook(3, 2, 4, 4, 16, None, None, W.DT_F16, 0,
                 [[[[[[0.0] * 4] * 16] * 2, [[[0.0] * 4] * 16]] for _h in range(2)] for _l in range(3)],
                 layer_stages=[(2, 1)] * 3).pack()[24], 0)


def cbk_class(d, req=R.FEAT_LAYER):
    try:
        R.parse_cbk1_contents(bytes(d), 0, req)
        return "accept"
    except R.Reject as x:
        return x.cls


def cbk_mut(pos, val, base=cbk_hand):
    b = bytearray(base)
    b[pos] = val
    return b


# §13.1 reader checks
check("LS §13.1 layer_stages 2", cbk_class(cbk_mut(24, 2)), "CORRUPT")
check("LS §3.3 layer_stages 1 without LAYER_STAGES", cbk_class(cbk_hand, 0), "CORRUPT")
check("LS §13.1 a count of 17", cbk_class(cbk_mut(64 + 3, 17)), "CORRUPT")
check("LS §13.1 k_stages not the largest (3)", cbk_class(cbk_mut(20, 3)), "CORRUPT")
check("LS §13.1 k_stages not the largest (1)", cbk_class(cbk_mut(20, 1)), "CORRUPT")
check("LS §13.1 v_stages not the largest (0)", cbk_class(cbk_mut(21, 0)), "CORRUPT")
check("LS §13.1 table padding byte", cbk_class(cbk_mut(64 + 6, 1)), "CORRUPT")
check("LS §13.1 table padding, last byte", cbk_class(cbk_mut(127, 1)), "CORRUPT")
check("LS §13.1 reserved byte 25", cbk_class(cbk_mut(25, 1)), "CORRUPT")
check("LS §13.1 shorter than 64 + T", cbk_class(cbk_hand[:127]), "TRUNCATED")
check("LS §13.1 the header alone", cbk_class(cbk_hand[:64]), "TRUNCATED")
check("LS §13.2 one byte short", cbk_class(cbk_hand[:1151]), "TRUNCATED")
check("LS §13.2 one byte long", cbk_class(cbk_hand + b"\x00"), "CORRUPT")
check("LS §13.2 layer_stages 0: the uniform size 2368", cbk_class(cbk_mut(24, 0), 0), "TRUNCATED")
# a count above 16 in the table comes before the size check that uses it (§16.2)
check("LS §16.2 count 17 in a short section", cbk_class(cbk_mut(64, 17)[:200]), "CORRUPT")


# whole files, built with fkvf_write.py: the example's shape, S 1, W 2,
# 40 positions (37 archived), 4-bit quad index streams (k 16)
def ls_file(d, rows, cb, req=None, extra=0, cbrf=None, zpos=None, split=None):
    """The bytes of a one-commit archive; extra > 0 adds zero streams to
    the index segment, < 0 drops its last ones; zpos: (stream_id,
    contents) of a ZPOS section after it; split: the index group as two
    segments, symbols [0, 32) of every stream, then [32, A) with `split`
    added streams (as extra)."""
    S, n = d.S, len(rows)
    A = W.archived_after(S, d.W, n, 0)
    syms = [cb.quantize(d, rows[p]) for p in range(S, S + A)]
    streams = [[syms[a][j] for a in range(A)] for j in range(cb.n_streams(d))]
    more = None
    if split is not None:
        more = [x[32:] for x in streams]
        more = (more + [[0] * (A - 32)] * max(0, split))[:len(more) + split]
        streams = [x[:32] for x in streams]
    streams = (streams + [[0] * A] * max(0, extra))[:len(streams) + extra]
    r = cb.required_features()
    secs = [W.Section(b"DESC", 0, d.pack())]
    if cbrf is None:
        secs.append(W.Section(b"CBK1", 0, cb.pack()))
    else:
        r |= W.REQ_EXTERNAL_CODEBOOK
        secs.append(W.Section(b"CBRF", 0, W.sec_cbrf(cb, cbrf)))
    secs.append(W.Section(b"STRM", 0, W._strm(0, W.quad_bits_for(cb.k), cb.ks, cb.vs, 0, streams, 64)))
    if more is not None:
        secs.append(W.Section(b"STRM", 0, W._strm(0, W.quad_bits_for(cb.k), cb.ks, cb.vs, 32, more, 64)))
    if zpos is not None:
        secs.append(W.Section(b"ZPOS", zpos[0], zpos[1], required=False))
    secs += W._exac_runs(d, [p for p in range(n) if p < S or p >= S + A], rows.__getitem__)
    body, trl = W.build_commit(64, secs, 1, n, A)
    return W.file_header(r if req is None else req, 0) + body + trl, syms


def read(data, mode="verify", cbpath=None):
    try:
        rd = R.Reader(memoryview(bytes(data)), mode, cbpath)
        return "%016x" % rd.run(), rd
    except R.Reject as x:
        return x.cls, None


rng = W.Rng(31)
lrows = [W.random_row(rng, wd) for _ in range(40)]
lcb = W.random_codebook(rng, wd, 16, None, None, W.DT_F16, layer_stages=LT)
F1, lsyms = ls_file(wd, lrows, lcb)
dg1, rd1 = read(F1)
dg1o, rd1o = read(F1, "open")
check("LS file accepted, both modes, one digest", (rd1 is not None, dg1o), (True, dg1))
if rd1 is not None:
    st = [e for e in rd1.entries if e.type == b"STRM"][0].offset
    cbo = [e for e in rd1.entries if e.type == b"CBK1"][0].offset
    check("LS file header: format_minor 1, required_features 8 (§1.3.1, §3.4)",
          (struct.unpack_from("<H", F1, 12)[0], struct.unpack_from("<Q", F1, 24)[0]), (1, 8))
    check("LS file CBK1: layer_stages 1, the pairs, padding",
          (F1[cbo + 24], F1[cbo + 64:cbo + 70], F1[cbo + 70:cbo + 128]),
          (1, bytes([2, 1, 0, 1, 0, 0]), bytes(58)))
    check("LS file STRM: k_stages 2, v_stages 1, n_streams P(3) = 8",
          (F1[st + 10], F1[st + 11], struct.unpack_from("<I", F1, st + 48)[0]), (2, 1, 8))
    # §13.6 with the layer's counts: layer 1 has no key stage, layer 2 no
    # stage; row layout §14.2 (bytes): layer l at l x 2 x (4 + 4) x 2 = 32 l,
    # its keys [32 l, 32 l + 16), values [32 l + 16, 32 l + 32)
    t = wd.S + 5
    row = rd1o.restore(t)
    check("LS §13.6 restored row = the writer's centroid sums", row, lcb.reconstruct(wd, lsyms[5]))
    check("LS §13.6 layer 1 keys and layer 2 zero vectors (zero stages)",
          (row[32:48], row[64:96]), (bytes(16), bytes(32)))
    check("LS §13.6 layer 1 values not zero (one stage)", row[48:64] != bytes(16), True)
    # head 1 of layer 0: K stages 0 and 1 (j 3, 4) and V stage 0 (j 5), by hand
    k = [a + b for a, b in zip(lcb.tables[0][1][0][0][lsyms[5][3]], lcb.tables[0][1][0][1][lsyms[5][4]])]
    v = lcb.tables[0][1][1][0][lsyms[5][5]]
    check("LS §13.6 layer 0 head 1 from streams j = 3, 4 and 5",
          (row[8:16], row[24:32]), (struct.pack("<4e", *k), struct.pack("<4e", *v)))

# §11.2 step 6 and §11.8: n_streams
check("LS §11.8 n_streams 9 (<= 18, != P(3) = 8), embedded", read(ls_file(wd, lrows, lcb, extra=1)[0])[0],
      "CORRUPT")
check("LS §11.8 n_streams 7, embedded", read(ls_file(wd, lrows, lcb, extra=-1)[0])[0], "CORRUPT")
check("LS §11.2 step 6 n_streams 19 > 18", read(ls_file(wd, lrows, lcb, extra=11)[0])[0], "CORRUPT")
check("LS §3.3 bit clear, layer table", read(ls_file(wd, lrows, lcb, req=0)[0])[0], "CORRUPT")
check("LS §3.3 bit clear, layer table (open)", read(ls_file(wd, lrows, lcb, req=0)[0], "open")[0],
      "CORRUPT")
# a uniform codebook in a file with the bit set is valid (§3.3: a bit MAY be
# set for an unused feature); n_streams is then the uniform 18
ucb = W.random_codebook(W.Rng(32), wd, 16, 2, 1, W.DT_F16)
Fu = ls_file(wd, lrows, ucb, req=R.FEAT_LAYER)[0]
check("LS bit set, uniform codebook: accepted, the digest of the file without the bit",
      (read(Fu)[1] is not None, read(Fu)[0]), (True, read(ls_file(wd, lrows, ucb)[0])[0]))
check("LS bit set, uniform codebook, n_streams 17", read(ls_file(wd, lrows, ucb, req=R.FEAT_LAYER,
                                                                 extra=-1)[0])[0], "CORRUPT")

# §20 (ZPOS, §20.7) naming an index stream with the layer's counts:
# (l 1, h 1, values, stage 0) is j = 7; n_indexed 32 (u = 32 for b = 4)


def sid(l, h, kv, s):
    return l | h << 16 | kv << 32 | s << 40


def zpos_of(stream, ident, ni=32):
    z = R.quad_points(stream[:ni], 4)
    order = sorted(range(ni), key=lambda t: (z[t], t))
    return ident, struct.pack("<QBBHIQ8sI28x", ident, 1, 4, 4, 0, ni, bytes(8), 0) + \
        struct.pack("<%dI" % ni, *order)


col = [[lsyms[a][j] for a in range(len(lsyms))] for j in range(8)]
check("LS ZPOS test: streams 6 and 7 sort differently",
      zpos_of(col[6], 0)[1] != zpos_of(col[7], 0)[1], True)
Fz = ls_file(wd, lrows, lcb, zpos=zpos_of(col[7], sid(1, 1, 1, 0)))[0]
check("LS §20.7 ZPOS of (1, 1, V, 0) = j 7: accepted, digest unchanged", read(Fz)[0], dg1)
check("LS §20.7 ZPOS of (1, 1, V, 0) in stream 6's order",
      read(ls_file(wd, lrows, lcb, zpos=zpos_of(col[6], sid(1, 1, 1, 0)))[0])[0], "CORRUPT")
check("LS §20.2 step 5 ZPOS of (1, 0, K, 0): layer 1 has no key stage",
      read(ls_file(wd, lrows, lcb, zpos=zpos_of(col[7], sid(1, 0, 0, 0)))[0])[0], "CORRUPT")
check("LS §20.2 step 5 ZPOS of (2, 0, V, 0): layer 2 has no stage",
      read(ls_file(wd, lrows, lcb, zpos=zpos_of(col[7], sid(2, 0, 1, 0)))[0])[0], "CORRUPT")

# an external codebook (§13.5): a codebook file with the layer table
tmpd = tempfile.mkdtemp(prefix="fkvf-selftest-")
cbf = os.path.join(tmpd, "ls_codebook.fkvf")
W.create_codebook_file(cbf, lcb, sync=False)
with open(cbf, "rb") as fh:
    CB = fh.read()
check("LS codebook file: format_minor 1, LAYER_STAGES; digest = XXH3-64 of the CBK1 (Annex A)",
      (struct.unpack_from("<H", CB, 12)[0], struct.unpack_from("<Q", CB, 24)[0], read(CB)[0]),
      (1, 8, "%016x" % xxh3_64(lcb.pack(), 0)))
Fx = ls_file(wd, lrows, lcb, cbrf="ls_codebook.fkvf")[0]
check("LS CBRF archive with the candidate: the embedded file's digest (verify, open)",
      (read(Fx, "verify", cbf)[0], read(Fx, "open", cbf)[0]), (dg1, dg1))
if read(Fx, "open", cbf)[1] is not None:
    check("LS CBRF archive: restored row from the candidate", read(Fx, "open", cbf)[1].restore(wd.S + 5),
          lcb.reconstruct(wd, lsyms[5]))
check("LS CBRF archive without a candidate: verify accepts, open CODEBOOK (§13.5)",
      (read(Fx)[0], read(Fx, "open")[0]), (dg1, "CODEBOOK"))
Fx9 = ls_file(wd, lrows, lcb, cbrf="ls_codebook.fkvf", extra=1)[0]
check("LS §11.8 n_streams 9 with the candidate: CODEBOOK (verify, open)",
      (read(Fx9, "verify", cbf)[0], read(Fx9, "open", cbf)[0]), ("CODEBOOK", "CODEBOOK"))
check("LS §11.2 step 6 n_streams 9 without a candidate: verify accepts (at most 18)",
      read(Fx9)[1] is not None, True)
# two segments of the group with different n_streams: no codebook makes
# both P(n_layers) (§11.8), so the reader rejects it without one (§11.6)
check("LS two index segments, 8 streams each: the one-segment digest",
      read(ls_file(wd, lrows, lcb, cbrf="ls_codebook.fkvf", split=0)[0])[0], dg1)
check("LS two index segments, 8 then 9 streams, no candidate: CORRUPT",
      read(ls_file(wd, lrows, lcb, cbrf="ls_codebook.fkvf", split=1)[0])[0], "CORRUPT")
# the candidate's own LAYER_STAGES bit (§3.3): clear, it is not a valid file
nb = bytearray(CB)
nb[24] = 0
nb[56:64] = struct.pack("<Q", xxh3_64(bytes(nb[:56]), 0))
cbf0 = os.path.join(tmpd, "ls_codebook_nobit.fkvf")
with open(cbf0, "wb") as fh:
    fh.write(nb)
check("LS codebook file with a layer table, bit clear: CORRUPT", read(nb)[0], "CORRUPT")
check("LS ... as the candidate: CODEBOOK", read(Fx, "verify", cbf0)[0], "CODEBOOK")
# ZPOS of an index stream when the codebook is not known: the name needs
# the layer table (§11.2, §13.5); what can be checked still is
Fxz = ls_file(wd, lrows, lcb, cbrf="ls_codebook.fkvf", zpos=zpos_of(col[6], sid(1, 1, 1, 0)))[0]
check("LS CBRF + ZPOS in the wrong order: CORRUPT with the candidate", read(Fxz, "verify", cbf)[0],
      "CORRUPT")
check("LS ... not checkable without it", read(Fxz)[0], dg1)
check("LS CBRF + ZPOS of layer 3 (n_layers 3): CORRUPT without a candidate",
      read(ls_file(wd, lrows, lcb, cbrf="ls_codebook.fkvf", zpos=zpos_of(col[7], sid(3, 0, 0, 0)))[0])[0],
      "CORRUPT")
# an archive without LAYER_STAGES naming a codebook with a layer table
# (§3.4: the archive then uses the feature; here every layer has the
# same counts, so n_streams is the uniform 18 and §11.2 step 6 passes)
fcb = W.random_codebook(W.Rng(33), wd, 16, None, None, W.DT_F16, layer_stages=[(2, 1)] * 3)
fcb = W.Codebook(fcb.L, fcb.H, fcb.Dk, fcb.Dv, fcb.k, None, None, fcb.dtype, 0, fcb.tables,
                 layer_stages=[(2, 1)] * 3, force_table=True)
cbf2 = os.path.join(tmpd, "ls_codebook_flat.fkvf")
W.create_codebook_file(cbf2, fcb, sync=False)
Fn = ls_file(wd, lrows, fcb, cbrf="ls_codebook_flat.fkvf", req=W.REQ_EXTERNAL_CODEBOOK)[0]
check("LS archive without LAYER_STAGES, candidate with a layer table: CODEBOOK (§3.4, §13.5)",
      read(Fn, "verify", cbf2)[0], "CODEBOOK")
check("LS ... the same archive with the bit: accepted",
      read(ls_file(wd, lrows, fcb, cbrf="ls_codebook_flat.fkvf")[0], "verify", cbf2)[1] is not None, True)
for f in (cbf, cbf0, cbf2):
    os.remove(f)
os.rmdir(tmpd)

# pooled f32 codebook with a layer table, bf16 rows; and key_storage 1:
# the rotation of §8.1 (interleaved, rope_dims 2: pair 0 at angle t x
# theta^0 = t) applied to the restored key
pd = W.Desc(3, 2, 4, 4, W.DT_BF16, n_sinks=1, window=2, rope=(1, 2, 10000.0, 1))
prng = W.Rng(34)
prows = [W.random_row(prng, pd) for _ in range(12)]
pcb = W.random_codebook(prng, pd, 16, None, None, W.DT_F32, pooled=True,
                       layer_stages=[(1, 1), (0, 2), (3, 0)])
PF, psyms = ls_file(pd, prows, pcb)
pg, prd = read(PF, "open")
if prd is None:
    check("LS pooled, key_storage 1: accepted", pg, "accepted")
else:
    t = pd.S + 4
    got = W.decode_elems(prd.restore(t), W.DT_BF16)
    nd = W.Desc(3, 2, 4, 4, W.DT_F32, n_sinks=1, window=2)        # the sums, unrotated, in f32
    want = W.decode_elems(pcb.reconstruct(nd, psyms[4]), W.DT_F32)
    for l in range(3):
        for h in range(2):
            ko = l * 16 + h * 4           # key of (l, h) in the row, in elements (§14.2)
            k0, k1 = want[ko], want[ko + 1]
            want[ko] = k0 * math.cos(t) - k1 * math.sin(t)
            want[ko + 1] = k0 * math.sin(t) + k1 * math.cos(t)
    want = W.decode_elems(W.encode_elems(want, W.DT_BF16), W.DT_BF16)
    check("LS pooled f32 codebook, bf16 rows, key_storage 1: restored row", got, want)

# the encoder metric (§13.8, version 1.2): check 7 on matrices worked by
# hand; Cholesky pivots of [[4, 2], [2, 3]]: 4, then 3 - (2/2)^2 = 2
check("CMET §13.8 [[4, 2], [2, 3]] positive definite", R.metric_fault([4.0, 2.0, 2.0, 3.0], 2), None)
check("CMET §13.8 [[1, 2], [2, 1]]: pivot 1 is 1 - 2^2 = -3",
      R.metric_fault([1.0, 2.0, 2.0, 1.0], 2), "not positive definite: Cholesky pivot 1 is -3.0")
check("CMET §13.8 zero diagonal: pivot 0 is 0 (not > 0)",
      R.metric_fault([0.0, 0.0, 0.0, 1.0], 2), "not positive definite: Cholesky pivot 0 is 0.0")
check("CMET §13.8 (0, 1) != (1, 0)", (R.metric_fault([2.0, 0.5, 0.25, 2.0], 2) or "")[:14],
      "not symmetric:")
check("CMET §13.8 +Inf on the diagonal (the pivots alone would pass)",
      (R.metric_fault([1.0, 0.0, 0.0, float("inf")], 2) or "")[:22], "element (1, 1) is not ")
check("CMET §13.8 -0.0 and +0.0 are equal in value", R.metric_fault([1.0, -0.0, 0.0, 1.0], 2), None)
# a file: the Python writer's CMET, accepted; its hash changed, CORRUPT in
# full verification only; the REQUIRED flag set, SECTION in both modes
mdsc = W.Desc(1, 2, 3, 2, W.DT_F16, n_sinks=1, window=2)
mrng = W.Rng(35)
mcb = W.random_codebook(mrng, mdsc, 16, 1, 1, W.DT_F16)
met = W.random_metric(mrng, mcb, 3)
mrows = [W.random_row(mrng, mdsc) for _ in range(8)]
mfd, mtmp = tempfile.mkstemp(suffix=".fkvf")
os.close(mfd)
try:
    W.create(mtmp, mdsc, mrows, codebook=mcb, metric=met, sync=False)
    with open(mtmp, "rb") as fh:
        MF = fh.read()
finally:
    if os.path.exists(mtmp):
        os.remove(mtmp)


def metric_mut(fn):
    """MF with fn(data, entry offset, section offset) applied, the CMET,
    directory and trailer re-sealed."""
    d = bytearray(MF)
    T = len(d) - 64
    dof, dsz = struct.unpack_from("<QQ", d, T + 16)
    for i in range(struct.unpack_from("<I", d, dof + 4)[0]):
        eo = dof + 64 + 64 * i
        if d[eo:eo + 4] == b"CMET":
            off, st = struct.unpack_from("<QQ", d, eo + 8)
            fn(d, eo, off)
            struct.pack_into("<Q", d, eo + 40, xxh3_64(bytes(d[off:off + st]), off))
    struct.pack_into("<Q", d, T + 32, xxh3_64(bytes(d[dof:dof + dsz]), dof))
    struct.pack_into("<Q", d, T + 56, xxh3_64(bytes(d[T:T + 56]), T))
    return bytes(d)


check("CMET file of the Python writer (verify)", cls_of(MF), "accept")
mh = metric_mut(lambda d, eo, off: d.__setitem__(off, d[off] ^ 1))
check("CMET content_hash changed (verify)", cls_of(mh), "CORRUPT")
check("CMET content_hash changed (open: ignored)", cls_of(mh, "open"), "accept")
mr = metric_mut(lambda d, eo, off: struct.pack_into("<I", d, eo + 4, 1))
check("CMET with REQUIRED (verify)", cls_of(mr), "SECTION")
check("CMET with REQUIRED (open)", cls_of(mr, "open"), "SECTION")

print("selftest: %d failed" % len(failures))
sys.exit(1 if failures else 0)
