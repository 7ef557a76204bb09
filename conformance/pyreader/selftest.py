#!/usr/bin/env python3
"""Self-test of the second FKVF reader: the hash test vectors of spec §2.6,
the header checksums of §2.7, the one-commit file of §7.8, the stream
segment of §11.9, and the worked
examples of §12.1.6 (quad points), §12.2.9 (ngon span) and §20.6 (ZIDX
order). Every expected value below is taken from the spec text, not from
the code under test. Exit 0 when all pass."""

import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xxh3 import xxh3_64, xxh3_128, xxh3_128_canonical  # noqa: E402
import fkvf_read as R  # noqa: E402

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

print("selftest: %d failed" % len(failures))
sys.exit(1 if failures else 0)
