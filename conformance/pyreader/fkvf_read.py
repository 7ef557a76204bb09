#!/usr/bin/env python3
"""fkvf_read.py: a second, independent FKVF reader (Python 3 standard library
only), written from spec/fkvf-v1.md and conformance/README.md alone.

    python3 fkvf_read.py [--mode verify|open] [--codebook FILE] FILE

Exit 0: accepted, prints "digest HEX" (the conformance digest).
Exit 1: rejected, prints "class NAME"; stderr names the offset, the field
and the clause. Exit 2: usage or environment error (not a format class).

Mode "verify" is full verification (§1.3.3); mode "open" is the ordinary
access path (§1.3.2): open non-strict, decode every exact row, every archived
position's index symbols and every token id (what the digest covers).
"""

import argparse
import math
import os
import struct
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xxh3 import xxh3_64, xxh3_128_canonical  # noqa: E402

MAGIC = b"\x89FKVF\r\n\x1a\n"
TRL_MAGIC = b"\x89FKVTRL\n"
P48 = 1 << 48
P40 = 1 << 40
U64MAX = (1 << 64) - 1
F_REQUIRED = 1
F_DEFLATE = 2
FEAT_NGON = 1
FEAT_DEFLATE = 2
FEAT_EXTCB = 4
FEAT_LAYER = 8    # LAYER_STAGES (version 1.1): per-layer stage counts (§3.4, §13.1)
FEAT_KNOWN = FEAT_NGON | FEAT_DEFLATE | FEAT_EXTCB | FEAT_LAYER
KNOWN = (b"DESC", b"META", b"VTXS", b"CBK1", b"CBRF", b"EXAC", b"STRM", b"ZIDX", b"ZPOS",
         b"CMET")
SEARCH_INDEX = (b"ZIDX", b"ZPOS")  # §20: keys and positions; positions only (§20.7)
CMET = b"CMET"    # the encoder metric (version 1.2, §13.8): optional, REQUIRED clear
METRIC_MAX_DIM = 1024   # §13.8 check 3, §15
MUST_REQUIRED = (b"DESC", b"VTXS", b"CBK1", b"CBRF", b"EXAC", b"STRM")
ESIZE = {1: 2, 2: 2, 3: 4}


class Reject(Exception):
    def __init__(self, cls, off, what, clause):
        Exception.__init__(self, cls)
        self.cls = cls
        self.off = off
        self.what = what
        self.clause = clause

    def message(self):
        off = "-" if self.off is None else "%d (0x%x)" % (self.off, self.off)
        return "%s at offset %s: %s (spec %s)" % (self.cls, off, self.what,
                                                   self.clause)


def align64(x):
    return (x + 63) // 64 * 64


def u8(b, o):
    return b[o]


def u16(b, o):
    return struct.unpack_from("<H", b, o)[0]


def u32(b, o):
    return struct.unpack_from("<I", b, o)[0]


def u64(b, o):
    return struct.unpack_from("<Q", b, o)[0]


def f64(b, o):
    return struct.unpack_from("<d", b, o)[0]


def is_zero(b):
    return not any(b)


def utf8_ok(b):
    try:
        bytes(b).decode("utf-8", "strict")
        return True
    except UnicodeDecodeError:
        return False


def gcd(a, b):
    return math.gcd(a, b)


def fbits(x):
    return struct.pack("<d", x)


# --------------------------------------------------------------- structures

class Trailer:
    __slots__ = ("T", "seq", "dir_offset", "dir_size", "prev", "entry_count",
                 "n_positions", "n_archived")


class Entry:
    __slots__ = ("type", "flags", "offset", "stored", "size", "key", "checksum",
                 "commit", "order", "eoff", "_data", "_ok", "_seg")

    def tname(self):
        return self.type.decode("latin-1")


class Segment:
    pass


class Vtx:
    pass


class Cbk:
    """A parsed CBK1 (§13.1-§13.2). lks[l], lvs[l]: the stage counts of layer
    l (ks(l), vs(l); the header's for every layer when layer_stages = 0);
    T: the size of the layer table; data: the section contents."""

    def stages(self, l):
        return self.lks[l], self.lvs[l]

    def prefix(self, H, l):
        """§11.2: P(l) = n_kv_heads * (m(0) + ... + m(l-1)), m = ks + vs;
        P(n_layers) is the number of index streams."""
        return H * self._msum[l]

    def stream_j(self, H, l, h, kv, s):
        """§11.2: the canonical number j of index stream (l, h, kv, s)."""
        ks, vs = self.lks[l], self.lvs[l]
        return H * self._msum[l] + h * (ks + vs) + (s if kv == 0 else ks + s)

    def base(self, l, h):
        """§13.2: base(l, h) = 64 + T + n_heads * (per_head(0) + ... +
        per_head(l-1)) + h * per_head(l)."""
        return 64 + self.T + self.nh * self._psum[l] + h * self._per_head[l]

    def key_row(self, l, h, s, c):
        """§13.2: offset of row c of K[l][h][s] in the contents."""
        return self.base(l, h) + (s * self.k + c) * self.dk * self.es

    def value_row(self, l, h, s, c):
        """§13.2: offset of row c of V[l][h][s] in the contents."""
        return self.base(l, h) + self.lks[l] * self.k * self.dk * self.es \
            + (s * self.k + c) * self.dv * self.es

    def row(self, kv, l, h, s, c):
        """Row c of K[l][h][s] (kv 0) or V[l][h][s] (kv 1) as floats."""
        if kv == 0:
            o, n = self.key_row(l, h, s, c), self.dk
        else:
            o, n = self.value_row(l, h, s, c), self.dv
        return struct.unpack_from("<%d%s" % (n, "e" if self.dtype == 1 else "f"), self.data, o)


def parse_cbk1_contents(d, o, req):
    """§13.1-§13.2: check and parse the contents d of a CBK1 section at file
    offset o, in a file whose required_features are req; returns a Cbk or
    raises Reject. The order: the fixed header (TRUNCATED), its fields
    (CORRUPT), the layer table's presence (TRUNCATED), its counts and
    padding (CORRUPT: fields come before the size checks that use them,
    §16.2), then the size (LIMIT, TRUNCATED, CORRUPT)."""
    if len(d) < 64:
        raise Reject("TRUNCATED", o, "CBK1 shorter than 64 bytes", "§13.2")
    nl, nh, dk, dv, k = struct.unpack_from("<5I", d, 0)
    ks, vs, dt, pooled, ls = d[20], d[21], d[22], d[23], d[24]
    if not is_zero(d[25:64]) or not (1 <= nl <= 1024 and 1 <= nh <= 1024 and 1 <= dk <= 16384
                                     and 1 <= dv <= 16384) \
            or not (16 <= k <= 4096 and k & (k - 1) == 0) or ks > 16 or vs > 16 \
            or dt not in (1, 3) or pooled not in (0, 1) or (pooled == 1 and nh != 1):
        raise Reject("CORRUPT", o, "CBK1 header field out of range or reserved bytes", "§13.1, §13.2")
    if ls > 1:
        raise Reject("CORRUPT", o + 24, "CBK1 layer_stages %d > 1" % ls, "§13.1")
    if ls == 1 and not req & FEAT_LAYER:
        raise Reject("CORRUPT", o + 24, "CBK1 layer_stages 1 without the LAYER_STAGES feature",
                     "§3.3, §13.1")
    if ls == 1:
        T = align64(2 * nl)
        if len(d) < 64 + T:
            raise Reject("TRUNCATED", o, "CBK1 of %d bytes shorter than its layer table (64 + %d)"
                         % (len(d), T), "§13.1")
        lks = list(d[64:64 + 2 * nl:2])
        lvs = list(d[65:64 + 2 * nl:2])
        for l in range(nl):
            if lks[l] > 16 or lvs[l] > 16:
                raise Reject("CORRUPT", o + 64 + 2 * l, "CBK1 layer %d stage counts %d + %d above 16"
                             % (l, lks[l], lvs[l]), "§13.1, §15")
        if max(lks) != ks or max(lvs) != vs:
            raise Reject("CORRUPT", o + 20, "CBK1 k_stages %d, v_stages %d are not the largest layer "
                         "counts %d, %d" % (ks, vs, max(lks), max(lvs)), "§13.1")
        if not is_zero(d[64 + 2 * nl:64 + T]):
            raise Reject("CORRUPT", o + 64 + 2 * nl, "CBK1 layer table padding not zero", "§13.1")
    else:
        T = 0
        lks, lvs = [ks] * nl, [vs] * nl
    es = ESIZE[dt]
    per_head = [k * (lks[l] * dk + lvs[l] * dv) * es for l in range(nl)]
    psum, msum = [0], [0]
    for l in range(nl):
        psum.append(psum[-1] + per_head[l])
        msum.append(msum[-1] + lks[l] + lvs[l])
    size = 64 + T + nh * psum[nl]
    # 2^48 whether deflated or not: a deflated section's contents are
    # at most 2^40 bytes (§4.4), so a larger size is TRUNCATED below
    if size > P48:
        raise Reject("LIMIT", o, "CBK1 size %d beyond the limit" % size, "§13.2, §15")
    if len(d) < size:
        raise Reject("TRUNCATED", o, "CBK1 of %d bytes shorter than %d" % (len(d), size), "§13.2")
    if len(d) > size:
        raise Reject("CORRUPT", o, "CBK1 of %d bytes longer than %d" % (len(d), size), "§13.2")
    c = Cbk()
    c.nl, c.nh, c.dk, c.dv, c.k, c.ks, c.vs, c.dtype, c.pooled = nl, nh, dk, dv, k, ks, vs, dt, pooled
    c.layer_stages, c.T, c.lks, c.lvs, c.es = ls, T, lks, lvs, es
    c._per_head, c._psum, c._msum = per_head, psum, msum
    c.data = d
    c.size = size
    return c


# ------------------------------------------------------------------- reader

class Reader:
    def __init__(self, data, mode, codebook_path=None, name="file"):
        self.F = data
        self.n = len(data)
        self.full = (mode == "verify")
        self.mode = mode
        self.codebook_path = codebook_path
        self.name = name
        self._trl = {}
        self.vtx = {}
        self.cbk = None       # the codebook (Cbk) once known

    # ---- §3.1 header
    def check_header(self):
        F = self.F
        m = min(9, self.n)
        if F[:m] != MAGIC[:m]:
            raise Reject("BAD_MAGIC", 0, "magic does not match", "§3.1 step 1")
        if self.n < 64:
            raise Reject("TRUNCATED", self.n, "file shorter than a header (%d bytes)" % self.n,
                         "§3.1 step 2")
        major = u16(F, 10)
        if major != 1:
            raise Reject("VERSION", 10, "format_major is %d, not 1" % major, "§3.1 step 3")
        if F[16:20] != b"\x0d\x0c\x0b\x0a":
            extra = " (written with the wrong byte order)" if F[16:20] == b"\x0a\x0b\x0c\x0d" else ""
            raise Reject("BYTE_ORDER", 16, "byte_order is %s%s" % (F[16:20].hex(), extra),
                         "§3.1 step 4")
        if u64(F, 56) != xxh3_64(F[0:56], 0):
            raise Reject("CHECKSUM", 56, "header_checksum mismatch", "§3.1 step 5")
        if u16(F, 14) != 64:
            raise Reject("CORRUPT", 14, "header_size is %d, not 64" % u16(F, 14), "§3.1 step 6")
        if F[9] != 0 or u32(F, 20) != 0 or not is_zero(F[40:56]):
            raise Reject("CORRUPT", 9, "header byte 9, flags or reserved bytes [40,56) not zero",
                         "§3.1 step 7")
        self.req = u64(F, 24)
        self.opt = u64(F, 32)
        if self.req & ~FEAT_KNOWN:
            raise Reject("FEATURE", 24, "required_features has unknown bits 0x%x"
                         % (self.req & ~FEAT_KNOWN), "§3.1 step 8")

    # ---- §6.2 trailer checks; returns a Trailer or raises Reject
    def trailer(self, T):
        if T in self._trl:
            r = self._trl[T]
            if isinstance(r, Reject):
                raise r
            return r
        try:
            r = self._trailer(T)
        except Reject as e:
            self._trl[T] = e
            raise
        self._trl[T] = r
        return r

    def _trailer(self, T):
        F = self.F
        if F[T:T + 8] != TRL_MAGIC:
            raise Reject("TRUNCATED", T, "no trailer magic", "§6.2 step 1")
        if u64(F, T + 56) != xxh3_64(F[T:T + 56], T):
            raise Reject("CHECKSUM", T + 56, "trailer_checksum mismatch", "§6.2 step 2")
        seq, dof, dsz, dck, prev, fsz = struct.unpack_from("<6Q", F, T + 8)
        if fsz != T + 64:
            raise Reject("CORRUPT", T + 48, "trailer file_size %d != %d" % (fsz, T + 64),
                         "§6.2 step 3")
        if seq < 1:
            raise Reject("CORRUPT", T + 8, "commit_seq 0", "§6.2 step 4")
        if seq > 1 << 24:
            raise Reject("LIMIT", T + 8, "commit_seq %d > 2^24" % seq, "§6.2 step 4")
        if dof % 64:
            raise Reject("ALIGN", T + 16, "dir_offset %d not a multiple of 64" % dof, "§6.2 step 5")
        if not (dof >= 64 and dsz >= 64 and dsz % 64 == 0 and dof + dsz <= T
                and T - (dof + dsz) < 64):
            raise Reject("BOUNDS", T + 16, "directory [%d, +%d) does not end at the trailer %d"
                         % (dof, dsz, T), "§6.2 step 6")
        if seq == 1:
            if prev != 0:
                raise Reject("CHAIN", T + 40, "commit 1 has prev_trailer %d" % prev, "§6.2 step 7")
        else:
            if prev % 64 or prev < 128 or prev + 64 > dof:
                raise Reject("CHAIN", T + 40, "prev_trailer %d malformed" % prev, "§6.2 step 7")
        if dsz > 64 + 64 * (1 << 20):
            raise Reject("LIMIT", T + 24, "dir_size %d too large" % dsz, "§6.2 step 8")
        if dck != xxh3_64(F[dof:dof + dsz], dof):
            raise Reject("CHECKSUM", T + 32, "dir_checksum mismatch (directory at %d)" % dof,
                         "§6.2 step 9")
        # §5.3
        if F[dof:dof + 4] != b"DIRC":
            raise Reject("CORRUPT", dof, "directory magic is not DIRC", "§5.3")
        if not is_zero(F[dof + 32:dof + 64]):
            raise Reject("CORRUPT", dof + 32, "directory reserved bytes not zero", "§5.3")
        ec = u32(F, dof + 4)
        dseq, npos, narch = struct.unpack_from("<3Q", F, dof + 8)
        if ec > 1 << 20:
            raise Reject("LIMIT", dof + 4, "entry_count %d > 2^20" % ec, "§5.3")
        if narch > npos:
            raise Reject("CORRUPT", dof + 24, "n_archived %d > n_positions %d" % (narch, npos),
                         "§5.3")
        if dseq != seq:
            raise Reject("CHAIN", dof + 8, "directory commit_seq %d != trailer's %d" % (dseq, seq),
                         "§5.3")
        if dsz != 64 + 64 * ec:
            raise Reject("CORRUPT", T + 24, "dir_size %d != 64 + 64 x %d" % (dsz, ec), "§5.2, §5.3")
        t = Trailer()
        t.T, t.seq, t.dir_offset, t.dir_size, t.prev = T, seq, dof, dsz, prev
        t.entry_count, t.n_positions, t.n_archived = ec, npos, narch
        return t

    def chain(self, head):
        """§7.1: list of trailers oldest first; raises CHAIN."""
        out = [head]
        cur = head
        while cur.seq > 1:
            try:
                p = self.trailer(cur.prev)
            except Reject as e:
                raise Reject("CHAIN", cur.prev, "earlier trailer invalid: " + e.message(), "§7.1")
            if p.seq != cur.seq - 1:
                raise Reject("CHAIN", cur.prev + 8, "commit_seq %d, expected %d"
                             % (p.seq, cur.seq - 1), "§7.1")
            out.append(p)
            cur = p
        out.reverse()
        return out

    # ---- §7.2 open
    def open(self):
        n = self.n
        self.check_header()
        if n > 1 << 62:
            raise Reject("LIMIT", None, "file longer than 2^62", "§7.2")
        if n < 192:
            raise Reject("TRUNCATED", n, "file of %d bytes is shorter than 192" % n, "§7.2")
        tail_error = None
        if n % 64:
            tail_error = Reject("TRUNCATED", n, "length %d is not a multiple of 64" % n, "§7.2")
        else:
            try:
                head = self.trailer(n - 64)
            except Reject as e:
                tail_error = e
            else:
                return head, self.chain(head), 0
        T = 64 * ((n - 64) // 64)
        while T >= 128:
            if T != n - 64 and self.F[T:T + 8] == TRL_MAGIC:
                try:
                    head = self.trailer(T)
                    ch = self.chain(head)
                except Reject:
                    pass
                else:
                    return head, ch, n - (T + 64)
            T -= 64
        raise tail_error

    # ---- §4.2-§4.5 directories
    def load_directories(self):
        total = sum(t.entry_count for t in self.commits)
        if total > 1 << 22:
            raise Reject("LIMIT", None, "%d directory entries over the chain > 2^22" % total, "§4.5")
        F = self.F
        self.entries = []
        order = 0
        for ci, t in enumerate(self.commits):
            region_start = 64 if t.seq == 1 else t.prev + 64
            prev_end = None
            for i in range(t.entry_count):
                eo = t.dir_offset + 64 + 64 * i
                e = Entry()
                e.eoff = eo
                e.type = bytes(F[eo:eo + 4])
                e.flags = u32(F, eo + 4)
                e.offset, e.stored, e.size, e.key, e.checksum = struct.unpack_from("<5Q", F, eo + 8)
                e.commit = ci
                e.order = order
                e._data = None
                e._ok = False
                order += 1
                tn = e.type.decode("latin-1")
                if e.flags & ~3:
                    raise Reject("CORRUPT", eo + 4, "entry %s flags 0x%x" % (tn, e.flags), "§4.2")
                if not is_zero(F[eo + 48:eo + 64]):
                    raise Reject("CORRUPT", eo + 48, "entry reserved bytes not zero", "§4.2")
                if e.type == b"DIRC":
                    raise Reject("CORRUPT", eo, "entry type DIRC", "§4.2")
                if e.offset % 64:
                    raise Reject("ALIGN", eo + 8, "section offset %d not a multiple of 64"
                                 % e.offset, "§4.1, §4.2")
                if e.stored > P48 or e.size > P48:
                    raise Reject("LIMIT", eo + 16, "section size above 2^48", "§4.2")
                if e.offset < region_start or e.offset + e.stored > t.dir_offset:
                    raise Reject("BOUNDS", eo + 8, "section [%d, +%d) outside region [%d, %d)"
                                 % (e.offset, e.stored, region_start, t.dir_offset), "§4.5")
                if prev_end is not None and e.offset < prev_end:
                    raise Reject("OVERLAP", eo + 8, "section at %d overlaps the previous one ending at %d"
                                 % (e.offset, prev_end), "§4.5")
                prev_end = e.offset + e.stored
                if e.flags & F_DEFLATE:
                    if not self.req & FEAT_DEFLATE:
                        raise Reject("CORRUPT", eo + 4, "DEFLATE flag without the DEFLATE feature",
                                     "§3.3, §4.2")
                    if e.size > P40 or e.size > 1032 * e.stored + 64:
                        raise Reject("LIMIT", eo + 24, "deflated size %d too large for %d stored bytes"
                                     % (e.size, e.stored), "§4.4")
                elif e.size != e.stored:
                    raise Reject("CORRUPT", eo + 24, "size %d != stored_size %d" % (e.size, e.stored),
                                 "§4.2")
                if e.type not in KNOWN and e.flags & F_REQUIRED:
                    raise Reject("SECTION", eo, "unknown section type %r with REQUIRED" % tn, "§4.3")
                if e.type in SEARCH_INDEX and e.flags & F_REQUIRED:
                    # rejected as a reader without §20 rejects it (§20.1, §20.7)
                    raise Reject("SECTION", eo, "%r section with REQUIRED" % tn, "§20.1")
                if e.type == CMET and e.flags & F_REQUIRED:
                    # as a reader of 1.0 or 1.1 rejects it, in every mode (§13.8)
                    raise Reject("SECTION", eo, "CMET section with REQUIRED", "§13.8, §20.1")
                if e.type == b"STRM" and e.flags & F_DEFLATE:
                    raise Reject("CORRUPT", eo + 4, "STRM with DEFLATE", "§4.4")
                if e.type in (b"DESC", b"META", b"CBK1", b"CBRF") and e.key != 0:
                    raise Reject("CORRUPT", eo + 32, "%s key %d != 0" % (tn, e.key), "§4.3")
                self.entries.append(e)

    def check_tiling(self):
        """§4.1: gaps shorter than 64 bytes and zero (full verification)."""
        F = self.F
        for t in self.commits:
            cur = 64 if t.seq == 1 else t.prev + 64
            starts = [(e.offset, e.offset + e.stored, "section " + e.tname())
                      for e in self.entries if self.commits[e.commit] is t]
            starts.append((t.dir_offset, t.dir_offset + t.dir_size, "directory"))
            for s, end, what in starts:
                if s - cur >= 64:
                    raise Reject("CORRUPT", cur, "gap of %d bytes before %s at %d" % (s - cur, what, s),
                                 "§4.1")
                if not is_zero(F[cur:s]):
                    raise Reject("PADDING", cur, "non-zero padding before %s at %d" % (what, s), "§4.1")
                cur = end

    # ---- section contents (§4.4, §4.6)
    def verify_checksum(self, e):
        if not e._ok:
            if xxh3_64(self.F[e.offset:e.offset + e.stored], e.offset) != e.checksum:
                raise Reject("CHECKSUM", e.offset, "%s section checksum mismatch" % e.tname(), "§4.6")
            e._ok = True

    def contents(self, e):
        if e._data is not None:
            return e._data
        self.verify_checksum(e)
        raw = self.F[e.offset:e.offset + e.stored]
        if not e.flags & F_DEFLATE:
            e._data = raw
            return raw
        where = "%s section at %d" % (e.tname(), e.offset)
        if len(raw) < 2 or raw[1] & 0x20:
            raise Reject("DEFLATE", e.offset, "%s: no zlib header or a preset dictionary" % where, "§4.4")
        d = zlib.decompressobj(15)
        try:
            out = d.decompress(bytes(raw), e.size)
            if len(out) < e.size:
                raise Reject("DEFLATE", e.offset, "%s inflates to %d < %d bytes"
                             % (where, len(out), e.size), "§4.4")
            if not d.eof:
                more = d.decompress(d.unconsumed_tail, 1)
                if more:
                    raise Reject("DEFLATE", e.offset, "%s inflates to more than %d bytes"
                                 % (where, e.size), "§4.4")
                if not d.eof:
                    raise Reject("DEFLATE", e.offset, "%s: zlib stream incomplete" % where, "§4.4")
            if d.unused_data or d.unconsumed_tail:
                raise Reject("DEFLATE", e.offset, "%s: bytes after the zlib stream" % where, "§4.4")
        except zlib.error as x:
            raise Reject("DEFLATE", e.offset, "%s: invalid zlib stream (%s)" % (where, x), "§4.4")
        e._data = out
        return out

    # ---- §8 DESC
    def parse_desc(self, e):
        d = self.contents(e)
        o = e.offset
        if len(d) < 128:
            raise Reject("TRUNCATED", o, "DESC shorter than 128 bytes", "§8.2")
        nl, H, dk, dv = struct.unpack_from("<4I", d, 0)
        dtype, kt, rl, ks = d[16], d[17], d[18], d[19]
        rdims = u32(d, 20)
        theta = f64(d, 24)
        S, W, ml, tl = struct.unpack_from("<4I", d, 32)
        whk = d[48]
        if ml > 4096 or tl > 4096:
            raise Reject("LIMIT", o + 40, "model_id_len %d or tokenizer_id_len %d > 4096" % (ml, tl),
                         "§8.2")
        if len(d) < 128 + ml + tl:
            raise Reject("TRUNCATED", o, "DESC shorter than its strings", "§8.2")
        bad = None
        if not is_zero(d[49:56]) or not is_zero(d[88:128]):
            bad = "reserved bytes not zero"
        elif not (1 <= nl <= 1024 and 1 <= H <= 1024 and 1 <= dk <= 16384 and 1 <= dv <= 16384):
            bad = "dimension out of range"
        elif dtype not in (1, 2, 3) or kt not in (0, 1) or rl not in (0, 1, 2) or ks not in (0, 1) \
                or whk not in (0, 1, 2):
            bad = "dtype, key_transform, rope_layout, key_storage or weights_hash_kind out of range"
        elif kt == 1 and (rdims % 2 or rdims == 0 or rdims > dk):
            bad = "rope_dims %d invalid" % rdims
        elif kt == 1 and not (math.isfinite(theta) and theta > 0):
            bad = "rope_theta not finite and > 0"
        elif kt == 1 and rl == 0:
            bad = "rope_layout 0 with key_transform 1"
        elif kt == 0 and (rl or ks or rdims or theta != 0.0):  # -0.0 is zero (§8.2)
            bad = "non-zero RoPE field with key_transform 0"
        elif not is_zero(d[56 + (0, 32, 16)[whk]:88]):
            bad = "weights_hash bytes beyond the hash length not zero"
        elif len(d) > 128 + ml + tl:
            bad = "DESC longer than 128 + model_id_len + tokenizer_id_len"
        elif not utf8_ok(d[128:128 + ml]) or not utf8_ok(d[128 + ml:128 + ml + tl]):
            bad = "model_id or tokenizer_id not valid UTF-8"
        if bad:
            raise Reject("CORRUPT", o, "DESC: " + bad, "§8.2")
        self.nl, self.H, self.dk, self.dv, self.dtype = nl, H, dk, dv, dtype
        self.S = S
        self.rope = (rl, ks, rdims, theta) if kt == 1 else None
        self.row_bytes = nl * H * (dk + dv) * ESIZE[dtype]

    # ---- §10 VTXS
    def load_vtxs(self, e):
        if e.key in self.vtx:
            return self.vtx[e.key]
        d = self.contents(e)
        o = e.offset
        if len(d) < 8:
            raise Reject("TRUNCATED", o, "VTXS shorter than 8 bytes", "§10.1")
        N = u32(d, 0)
        if 2 <= N <= 65536 and len(d) < 8 + 16 * N:
            raise Reject("TRUNCATED", o, "VTXS shorter than 8 + 16 x %d" % N, "§10.1")
        if not (2 <= N <= 65536) or N != e.key or u32(d, 4) != 0 or len(d) != 8 + 16 * N:
            raise Reject("CORRUPT", o, "VTXS: N %d out of range, != key %d, reserved or size" % (N, e.key),
                         "§10.1")
        vals = struct.unpack_from("<%dd" % (2 * N), d, 8)
        V = [(vals[2 * c], vals[2 * c + 1]) for c in range(N)]
        if bytes(d[8:24]) != b"\x00" * 6 + b"\xf0\x3f" + b"\x00" * 8:
            raise Reject("CORRUPT", o + 8, "VTXS V(0) is not (+1.0, +0.0)", "§10.2")
        lo, hi = 1.0 - 2.0 ** -40, 1.0 + 2.0 ** -40
        for c, (x, y) in enumerate(V):
            if not (math.isfinite(x) and math.isfinite(y)):
                raise Reject("CORRUPT", o + 8 + 16 * c, "VTXS V(%d) not finite" % c, "§10.2")
            m = x * x + y * y
            if not (lo <= m <= hi):
                raise Reject("CORRUPT", o + 8 + 16 * c, "VTXS |V(%d)|^2 = %r off the unit circle"
                             % (c, m), "§10.2")
        s = 1.0
        for k in range(1, N // 4 + 1):
            s = s + V[k][0]
        v = Vtx()
        v.N = N
        v.V = V
        v.inv_rN = 2.0 * s
        self.vtx[e.key] = v
        return v

    # ---- §11.2 segment header
    def parse_strm(self, e):
        F = self.F
        o = e.offset
        if e.stored < 64:
            raise Reject("TRUNCATED", o, "STRM shorter than 64 bytes", "§11.2 step 1")
        if u64(F, o + 56) != xxh3_64(F[o:o + 56], o):
            raise Reject("CHECKSUM", o + 56, "STRM head_checksum mismatch", "§11.2 step 2")
        g = u64(F, o)
        prof, b, ks, vs = F[o + 8], F[o + 9], F[o + 10], F[o + 11]
        N = u32(F, o + 12)
        first, cnt = struct.unpack_from("<2Q", F, o + 16)
        L, bs = struct.unpack_from("<2I", F, o + 32)
        rb = bytes(F[o + 40:o + 48])
        r = f64(F, o + 40)
        ns = u32(F, o + 48)

        def corrupt(what, off=o):
            raise Reject("CORRUPT", off, "STRM segment header: " + what, "§11.2 step 3")
        if u32(F, o + 52) != 0:
            corrupt("reserved field not zero", o + 52)
        if g == 0:
            if ks > 16 or vs > 16 or ks + vs < 1:
                corrupt("stage counts %d + %d" % (ks, vs), o + 10)
            if ns > 1 << 25:
                corrupt("n_streams %d > 2^25" % ns, o + 48)
        elif g == 1:
            if ks or vs:
                corrupt("token group with stages", o + 10)
            if ns != 1:
                corrupt("token group n_streams %d" % ns, o + 48)
        else:
            corrupt("group %d" % g, o)
        if prof == 1:
            if b % 2 or not (2 <= b <= 32) or N != 0 or L != 0 or rb != bytes(8):
                corrupt("quad fields (symbol_bits %d, alphabet, span_symbols, r)" % b, o + 9)
            u = 128 // gcd(b, 128)
        elif prof == 2:
            if b != 0 or not (2 <= N <= 65536) or not (1 <= L <= 44) or \
                    not (math.isfinite(r) and 0 < r <= 0.5):
                corrupt("ngon fields (alphabet %d, span_symbols %d, r %r)" % (N, L, r), o + 9)
            u = L
        else:
            corrupt("profile %d" % prof, o + 8)
        if first % u:
            corrupt("first_symbol %d not a multiple of %d" % (first, u), o + 16)
        if bs % 64 or not (64 <= bs <= 1 << 20):
            corrupt("block_size %d" % bs, o + 36)
        if prof == 1:
            sb = (cnt * b + 127) // 128 * 16
        else:
            sb = (cnt + L - 1) // L * 16
        db = ns * sb
        nb = (db + bs - 1) // bs
        doff = align64(64 + 8 * nb)
        if doff + db > P48:
            raise Reject("LIMIT", o, "STRM derived size %d > 2^48" % (doff + db), "§11.2 step 4")
        if e.stored < doff + db:
            raise Reject("TRUNCATED", o, "STRM of %d bytes shorter than %d" % (e.stored, doff + db),
                         "§11.2 step 5")
        if e.stored > doff + db:
            raise Reject("CORRUPT", o, "STRM of %d bytes longer than %d" % (e.stored, doff + db),
                         "§11.2 step 5")
        if g != e.key:
            raise Reject("CORRUPT", o, "STRM group %d != directory key %d" % (g, e.key), "§11.2 step 6")
        if g == 0:
            if not self.has_desc:
                raise Reject("CORRUPT", o, "index segment in a file without DESC", "§11.2, §13.4")
            want = self.nl * self.H * (ks + vs)
            if self.req & FEAT_LAYER:
                # per-layer stage counts: at most the uniform count here,
                # exactly the codebook's P(n_layers) once it is known (§11.8)
                if ns > want:
                    raise Reject("CORRUPT", o + 48, "n_streams %d > %d" % (ns, want), "§11.2 step 6")
            elif ns != want:
                raise Reject("CORRUPT", o + 48, "n_streams %d != %d" % (ns, want), "§11.2 step 6")
        s = Segment()
        if prof == 2:
            if not self.req & FEAT_NGON:
                raise Reject("CORRUPT", o + 8, "ngon segment without the NGON feature", "§3.3, §11.2")
            ve = None
            for x in self.entries:
                if x.type == b"VTXS" and x.key == N and x.commit <= e.commit:
                    ve = x
            if ve is None:
                raise Reject("CORRUPT", o + 12, "no VTXS for N = %d" % N, "§10.3")
            v = self.load_vtxs(ve)
            if not (r * v.inv_rN <= 1.0):
                raise Reject("CORRUPT", o + 40, "r %r above r_N (inv_rN %r)" % (r, v.inv_rN),
                             "§12.2.1")
            q = 1.0 / r
            p = 1.0
            lmax = 0
            while p * q <= 17592186044416.0:
                p = p * q
                lmax += 1
            if L > lmax:
                raise Reject("CORRUPT", o + 32, "span_symbols %d > L_max %d" % (L, lmax), "§12.2.2")
            s.vtx = v
        s.e = e
        s.group, s.profile, s.b, s.ks, s.vs, s.N = g, prof, b, ks, vs, N
        s.first, s.count, s.L, s.bs, s.rbytes, s.r, s.ns = first, cnt, L, bs, rb, r, ns
        s.u, s.stream_bytes, s.data_bytes, s.n_blocks, s.data_off = u, sb, db, nb, doff
        s.data_start = o + doff
        s.ok_blocks = set()
        s.spans = {}
        return s

    def verify_block(self, s, i):
        if i in s.ok_blocks:
            return
        F = self.F
        a = s.data_start + i * s.bs
        end = s.data_start + min((i + 1) * s.bs, s.data_bytes)
        want = u64(F, s.e.offset + 64 + 8 * i)
        if xxh3_64(F[a:end], a) != want:
            raise Reject("CHECKSUM", a, "STRM block %d checksum mismatch" % i, "§11.4")
        s.ok_blocks.add(i)

    def verify_range(self, s, rel0, rel1):
        """Verify the blocks covering data bytes [rel0, rel1)."""
        if rel1 <= rel0:
            return
        for i in range(rel0 // s.bs, (rel1 - 1) // s.bs + 1):
            self.verify_block(s, i)

    def quad_symbols(self, s, j, cnt):
        P = j * s.stream_bytes
        nbytes = (cnt * s.b + 7) // 8
        self.verify_range(s, P, P + nbytes)
        a = s.data_start + P
        buf = self.F[a:a + nbytes]
        b = s.b
        if b == 8:
            return list(buf)
        if b == 16:
            return list(struct.unpack("<%dH" % cnt, buf))
        if b == 32:
            return list(struct.unpack("<%dI" % cnt, buf))
        u = s.u
        cb = u * b // 8
        mask = (1 << b) - 1
        out = []
        ap = out.append
        for off in range(0, nbytes, cb):
            v = int.from_bytes(buf[off:off + cb], "little")
            for _ in range(u):
                ap(v & mask)
                v >>= b
        del out[cnt:]
        return out

    def ngon_span(self, s, j, q):
        key = (j, q)
        if key in s.spans:
            return s.spans[key]
        P = j * s.stream_bytes
        self.verify_range(s, P + 16 * q, P + 16 * q + 16)
        a = s.data_start + P + 16 * q
        ln = min(s.L, s.count - q * s.L)
        syms = decode_span(self.F[a:a + 16], ln, s.vtx.V, s.r, a)
        s.spans[key] = syms
        return syms

    def ngon_symbols(self, s, j, cnt):
        out = []
        for q in range((cnt + s.L - 1) // s.L):
            out.extend(self.ngon_span(s, j, q))
        del out[cnt:]
        return out

    def seg_symbols(self, s, j, cnt):
        if s.profile == 1:
            return self.quad_symbols(s, j, cnt)
        return self.ngon_symbols(s, j, cnt)

    def stream_symbols(self, g, j):
        out = []
        for s, lo, hi in self.pieces[g]:
            out.extend(self.seg_symbols(s, j, hi - lo))
        return out

    # ---- §11.6 apply segments
    def apply_segments(self):
        self.pieces = {0: [], 1: []}
        self.first_seg = {}
        self.glen = {}
        self.segs = []
        for e in self.entries:
            if e.type != b"STRM":
                continue
            s = self.parse_strm(e)
            self.segs.append(s)
            g = s.group
            f0 = self.first_seg.get(g)
            if f0 is None:
                self.first_seg[g] = s
                self.glen[g] = 0
                if s.first != 0:
                    raise Reject("CORRUPT", e.offset + 16, "first segment of group %d starts at %d"
                                 % (g, s.first), "§11.6")
            else:
                # n_streams too: step 6 of §11.2 fixes it for a uniform
                # codebook; with LAYER_STAGES every segment must have the
                # codebook's one P(n_layers) (§11.8), so two values cannot
                # both be right, with or without the codebook
                if (s.profile, s.b, s.N, s.L, s.rbytes, s.ks, s.vs, s.ns) != \
                        (f0.profile, f0.b, f0.N, f0.L, f0.rbytes, f0.ks, f0.vs, f0.ns):
                    raise Reject("CORRUPT", e.offset, "segment parameters differ from the group's first",
                                 "§11.6")
                if s.first > self.glen[g]:
                    raise Reject("CORRUPT", e.offset + 16, "first_symbol %d beyond stream length %d"
                                 % (s.first, self.glen[g]), "§11.6")
            pcs = []
            for (ps, lo, hi) in self.pieces[g]:
                if lo < s.first:
                    pcs.append((ps, lo, min(hi, s.first)))
            if s.count:
                pcs.append((s, s.first, s.first + s.count))
            self.pieces[g] = pcs
            self.glen[g] = s.first + s.count
            s.order = e.order

    # ---- §13 codebooks
    def parse_cbk1(self, e):
        # the layer table (layer_stages = 1) needs this file's LAYER_STAGES bit (§3.3)
        return parse_cbk1_contents(self.contents(e), e.offset, self.req)

    def check_cbk_finite(self, c, off, cls="CORRUPT"):
        fmt = "<%d%s" % ((c.size - 64 - c.T) // ESIZE[c.dtype], "e" if c.dtype == 1 else "f")
        for x in struct.unpack_from(fmt, c.data, 64 + c.T):
            if not math.isfinite(x):
                raise Reject(cls, off, "CBK1 holds a non-finite centroid element", "§13.2")

    def parse_cbrf(self, e):
        d = self.contents(e)
        o = e.offset
        if len(d) < 24:
            raise Reject("TRUNCATED", o, "CBRF shorter than 24 bytes", "§13.5")
        nlen = u32(d, 16)
        if nlen > 4096:
            raise Reject("LIMIT", o + 16, "CBRF name_len %d > 4096" % nlen, "§13.5")
        if len(d) < 24 + nlen:
            raise Reject("TRUNCATED", o, "CBRF shorter than 24 + name_len", "§13.5")
        if u32(d, 20) != 0 or len(d) > 24 + nlen or not utf8_ok(d[24:24 + nlen]):
            raise Reject("CORRUPT", o, "CBRF reserved field, size or name", "§13.5")
        return bytes(d[0:16])

    def match_codebook(self, c, cls, off):
        if c.nl != self.nl or c.dk != self.dk or c.dv != self.dv or \
                c.nh != (1 if c.pooled else self.H):
            raise Reject(cls, off, "codebook shape does not match the descriptor", "§13.7")
        if c.layer_stages and not self.req & FEAT_LAYER:
            # only a candidate gets here (§13.5: CODEBOOK); an embedded CBK1
            # with a layer table is CORRUPT in such a file (§3.3, §13.1)
            raise Reject(cls, off, "codebook with a layer table for an archive without the "
                         "LAYER_STAGES feature", "§13.5, §3.4")
        s0 = self.first_seg.get(0)
        if s0 is not None and (s0.ks, s0.vs) != (c.ks, c.vs):
            raise Reject(cls, off, "codebook stages %d+%d != index group's %d+%d"
                         % (c.ks, c.vs, s0.ks, s0.vs), "§11.8")
        # every segment of the group has the first one's n_streams (§11.6 above)
        if s0 is not None and s0.ns != c.prefix(self.H, c.nl):
            raise Reject(cls, off, "index group n_streams %d != the codebook's P(n_layers) = %d"
                         % (s0.ns, c.prefix(self.H, c.nl)), "§11.8, §11.2")

    # ---- §9 META
    def check_meta(self, e):
        d = self.contents(e)
        o = e.offset
        n = len(d)
        if n < 8:
            raise Reject("TRUNCATED", o, "META shorter than 8 bytes", "§9.1")
        count = u32(d, 0)
        if count > 65536:
            raise Reject("LIMIT", o, "META count %d > 65536" % count, "§9.1")
        if count * 9 > n - 8:
            raise Reject("TRUNCATED", o, "META count %d cannot fit" % count, "§9.1")
        if u32(d, 4):
            raise Reject("CORRUPT", o + 4, "META reserved field", "§9.1")
        p = 8
        keys = set()
        for i in range(count):
            if p + 8 > n:
                raise Reject("TRUNCATED", o + p, "META entry %d past the end" % i, "§9.1")
            kl = u16(d, p)
            vt, rsv = d[p + 2], d[p + 3]
            vl = u32(d, p + 4)
            if rsv:
                raise Reject("CORRUPT", o + p + 3, "META entry reserved byte", "§9.1")
            if not 1 <= kl <= 255:
                raise Reject("CORRUPT", o + p, "META key_len %d" % kl, "§9.1")
            if vt not in (1, 2, 3, 4, 5, 6):
                raise Reject("CORRUPT", o + p + 2, "META value_type %d" % vt, "§9.1")
            if vl > 1 << 24 or (vt in (1, 2, 3) and vl != 8) or (vt == 4 and vl != 1):
                raise Reject("CORRUPT", o + p + 4, "META value_len %d for type %d" % (vl, vt), "§9.1")
            if p + 8 + kl + vl > n:
                raise Reject("TRUNCATED", o + p, "META entry %d past the end" % i, "§9.1")
            key = bytes(d[p + 8:p + 8 + kl])
            val = d[p + 8 + kl:p + 8 + kl + vl]
            if 0 in key or not utf8_ok(key):
                raise Reject("CORRUPT", o + p + 8, "META key not valid UTF-8 or holds 0x00", "§9.1")
            if vt == 4 and val[0] > 1:
                raise Reject("CORRUPT", o + p + 8 + kl, "META bool %d" % val[0], "§9.1")
            if vt == 5 and not utf8_ok(val):
                raise Reject("CORRUPT", o + p + 8 + kl, "META utf8 value invalid", "§9.1")
            if key in keys:
                raise Reject("DUP_KEY", o + p + 8, "META key %r twice" % key, "§9.2")
            keys.add(key)
            p += 8 + kl + vl
        if p != n:
            raise Reject("CORRUPT", o + p, "META has %d bytes after the last entry" % (n - p), "§9.1")

    # ---- §14 EXAC
    def parse_exac(self, e):
        d = self.contents(e)
        o = e.offset
        if len(d) < 64:
            raise Reject("TRUNCATED", o, "EXAC shorter than 64 bytes", "§14.2")
        fp, cnt = struct.unpack_from("<2Q", d, 0)
        if fp != e.key:
            raise Reject("CORRUPT", o, "EXAC first_position %d != key %d" % (fp, e.key), "§14.2")
        if d[16] != self.dtype:
            raise Reject("CORRUPT", o + 16, "EXAC dtype %d != descriptor's %d" % (d[16], self.dtype),
                         "§14.2")
        if not is_zero(d[17:64]):
            raise Reject("CORRUPT", o + 17, "EXAC reserved bytes", "§14.2")
        if fp + cnt > U64MAX or 64 + cnt * self.row_bytes > P48:
            raise Reject("LIMIT", o + 8, "EXAC count %d beyond the limits" % cnt, "§14.2")
        want = 64 + cnt * self.row_bytes
        if len(d) < want:
            raise Reject("TRUNCATED", o, "EXAC of %d bytes shorter than %d" % (len(d), want), "§14.2")
        if len(d) > want:
            raise Reject("CORRUPT", o, "EXAC of %d bytes longer than %d" % (len(d), want), "§14.2")
        return fp, cnt

    # ---- §13.8 CMET (version 1.2): full verification only; the ordinary
    # path ignores it beyond its directory entry (§7.5)
    def check_cmet(self, cmets, c):
        """cmets: the chain's CMET entries, oldest first; c: the CBK1 the
        chain holds (already checked by §13.1-§13.2), or None. The checks
        of §13.8 in its order: 1-4 on each section, then 5 (one per chain,
        only with a CBK1), 6 (bound to that CBK1) and 7 (the matrices)."""
        hdrs = []
        for e in cmets:
            d = self.contents(e)
            o = e.offset
            if len(d) < 64:
                raise Reject("TRUNCATED", o, "CMET of %d bytes shorter than 64" % len(d), "§13.8 check 1")
            nl, nh, dk, dv = struct.unpack_from("<4I", d, 16)
            parts, dtype = d[32], d[33]
            if e.key != 0:
                raise Reject("CORRUPT", e.eoff + 32, "CMET key %d != 0" % e.key, "§13.8 check 2")
            if not is_zero(d[34:64]):
                raise Reject("CORRUPT", o + 34, "CMET reserved bytes not zero", "§13.8 check 2")
            if parts not in (1, 2, 3):
                raise Reject("CORRUPT", o + 32, "CMET parts %d not 1, 2 or 3" % parts, "§13.8 check 2")
            if dtype != 3:
                raise Reject("CORRUPT", o + 33, "CMET dtype %d != 3 (f32)" % dtype, "§13.8 check 2")
            if not (1 <= nl <= 1024 and 1 <= nh <= 1024 and 1 <= dk <= 16384 and 1 <= dv <= 16384):
                raise Reject("CORRUPT", o + 16, "CMET n_layers %d, n_heads %d, key_dim %d, value_dim %d "
                             "outside the ranges of §13.1" % (nl, nh, dk, dv), "§13.8 check 2")
            b0, b1 = parts & 1, parts >> 1 & 1
            if (b0 and dk > METRIC_MAX_DIM) or (b1 and dv > METRIC_MAX_DIM):
                raise Reject("LIMIT", o + 24, "CMET key_dim %d / value_dim %d of a part it holds above %d"
                             % (dk, dv, METRIC_MAX_DIM), "§13.8 check 3, §15")
            size = 64 + nl * nh * (b0 * dk * dk + b1 * dv * dv) * 4
            if len(d) < size:
                raise Reject("TRUNCATED", o, "CMET of %d bytes shorter than %d" % (len(d), size),
                             "§13.8 check 4")
            if len(d) > size:
                raise Reject("CORRUPT", o, "CMET of %d bytes longer than %d" % (len(d), size),
                             "§13.8 check 4")
            hdrs.append((e, d, nl, nh, dk, dv, b0, b1))
        if not hdrs:
            return
        if len(hdrs) > 1:
            raise Reject("CORRUPT", hdrs[1][0].eoff, "a second CMET in the chain", "§13.8 check 5")
        e, d, nl, nh, dk, dv, b0, b1 = hdrs[0]
        o = e.offset
        if c is None:
            raise Reject("CORRUPT", e.eoff, "a CMET in a chain that holds no CBK1", "§13.8 check 5")
        if bytes(d[0:16]) != xxh3_128_canonical(bytes(c.data)):
            raise Reject("CORRUPT", o, "CMET content_hash is not the CBK1's", "§13.8 check 6, §13.3")
        if (nl, nh, dk, dv) != (c.nl, c.nh, c.dk, c.dv):
            raise Reject("CORRUPT", o + 16, "CMET shape %d x %d, key_dim %d, value_dim %d differs from the "
                         "CBK1's %d x %d, %d, %d" % (nl, nh, dk, dv, c.nl, c.nh, c.dk, c.dv),
                         "§13.8 check 6")
        p = 64
        for l in range(nl):
            for h in range(nh):
                for part, n, present in ((0, dk, b0), (1, dv, b1)):
                    if not present:
                        continue
                    what = "CMET %s[%d][%d]" % ("MK" if part == 0 else "MV", l, h)
                    bad = metric_fault(struct.unpack_from("<%df" % (n * n), d, p), n)
                    if bad is not None:
                        raise Reject("CORRUPT", o + p, "%s %s" % (what, bad), "§13.8 check 7")
                    p += 4 * n * n

    # ---- §20 ZIDX, §20.7 ZPOS
    def check_zidx(self, e):
        o = e.offset
        zpos = e.type == b"ZPOS"
        tn = e.type.decode()
        cl = "§20.7" if zpos else "§20.2"
        if e.flags & F_DEFLATE:
            raise Reject("CORRUPT", e.eoff + 4, "%s with DEFLATE" % tn, "§20.1")
        d = self.contents(e)
        if len(d) < 64:
            raise Reject("TRUNCATED", o, "%s shorter than 64 bytes" % tn, cl + " step 1")
        sid = u64(d, 0)
        prof, b, esz, N = d[8], d[9], u16(d, 10), u32(d, 12)
        ni = u64(d, 16)
        rb = bytes(d[24:32])
        r = f64(d, 24)
        L = u32(d, 32)
        ok = is_zero(d[36:64]) and sid == e.key
        if zpos:  # §20.7: u32 positions up to 2^32 entries, u64 beyond
            want_q = want_n = 4 if ni <= 1 << 32 else 8
        else:
            want_q, want_n = 24, 32
        if prof == 1:
            ok = ok and b % 2 == 0 and 2 <= b <= 32 and esz == want_q and N == 0 and rb == bytes(8) \
                and L == 0
        elif prof == 2:
            ok = ok and b == 0 and esz == want_n and 2 <= N <= 65536 and math.isfinite(r) and \
                0 < r <= 0.5 and 1 <= L <= 44
        else:
            ok = False
        if not ok:
            raise Reject("CORRUPT", o, "%s header fields" % tn, cl + " step 2")
        if 64 + ni * esz > P48:
            raise Reject("LIMIT", o + 16, "%s size above 2^48" % tn, cl + " step 3")
        if len(d) < 64 + ni * esz:
            raise Reject("TRUNCATED", o, "%s shorter than 64 + n_indexed x entry_size" % tn,
                         cl + " step 4")
        if len(d) > 64 + ni * esz:
            raise Reject("CORRUPT", o, "%s longer than 64 + n_indexed x entry_size" % tn,
                         cl + " step 4")
        # step 5: the stream
        kind = sid >> 56
        g = None
        if (sid >> 48) & 0xFF == 0:
            if kind == 1 and sid & ((1 << 48) - 1) == 0:
                g, j = 1, 0
            elif kind == 0 and self.has_desc:
                layer, head, kv, stage = sid & 0xFFFF, (sid >> 16) & 0xFFFF, (sid >> 32) & 0xFF, \
                    (sid >> 40) & 0xFF
                s0 = self.first_seg.get(0)
                if s0 is not None and layer < self.nl and head < self.H and kv < 2 and \
                        stage < (s0.ks if kv == 0 else s0.vs):
                    if not self.req & FEAT_LAYER:
                        g = 0
                        j = (layer * self.H + head) * (s0.ks + s0.vs) + \
                            (stage if kv == 0 else s0.ks + stage)
                    elif self.cbk is not None:
                        # names follow the codebook's layer counts (§11.2)
                        lk, lv = self.cbk.stages(layer)
                        if stage < (lk if kv == 0 else lv):
                            g = 0
                            j = self.cbk.stream_j(self.H, layer, head, kv, stage)
                    else:
                        # an external codebook without a candidate: which
                        # index stream the id names needs its layer table
                        # (§11.2, §13.5); every check that does not need
                        # the stream's symbols is still made
                        g, j = 0, None
        s0 = self.first_seg.get(g) if g is not None else None
        if s0 is None:
            raise Reject("CORRUPT", o, "%s stream_id 0x%016x names no stream" % (tn, sid),
                         cl + " step 5")
        if prof != s0.profile or (prof == 1 and b != s0.b) or \
                (prof == 2 and (N != s0.N or rb != s0.rbytes or L != s0.L)) or ni % s0.u:
            raise Reject("CORRUPT", o, "%s codec parameters or n_indexed differ from the stream's" % tn,
                         cl + " step 5")
        # §20.3 entries (ZIDX: stored keys; ZPOS: positions only, keys from the stream)
        ents = []
        if zpos:
            fmt = "<%d%s" % (ni, "I" if esz == 4 else "Q")
            for i, pos in enumerate(struct.unpack_from(fmt, d, 64)):
                if pos >= ni:
                    raise Reject("CORRUPT", o + 64 + esz * i, "ZPOS position %d >= n_indexed %d"
                                 % (pos, ni), "§20.7")
                ents.append((None, pos, None))
        elif prof == 1:
            for i in range(ni):
                klo, khi, pos = struct.unpack_from("<3Q", d, 64 + 24 * i)
                ents.append(((khi << 64) | klo, pos, None))
        else:
            for i in range(ni):
                key, pos = struct.unpack_from("<2Q", d, 64 + 32 * i)
                ents.append((key, pos, bytes(d[64 + 32 * i + 16:64 + 32 * i + 32])))
        prev = None
        for i, (key, pos, _) in enumerate(ents if not zpos else ()):
            if pos >= ni:
                raise Reject("CORRUPT", o + 64 + esz * i, "ZIDX position %d >= n_indexed %d" % (pos, ni),
                             "§20.3")
            if prev is not None and not (prev < (key, pos)):
                raise Reject("CORRUPT", o + 64 + esz * i, "ZIDX entries not in ascending order", "§20.3")
            prev = (key, pos)
        # §20.4 in effect?
        stale = ni > self.glen.get(g, 0) or any(ps.first < ni and ps.order > e.order
                                                for (ps, lo, hi) in self.pieces[g])
        if stale or j is None:
            # stale, or (j None) an index stream whose symbols cannot be
            # named without the codebook: the keys are not compared
            if zpos:  # §20.7: a stale ZPOS still lists each position once
                seen = set()
                for i, (_, pos, _) in enumerate(ents):
                    if pos in seen:
                        raise Reject("CORRUPT", o + 64 + esz * i, "%sZPOS repeats position %d"
                                     % ("stale " if stale else "", pos),
                                     "§20.7")
                    seen.add(pos)
            return
        syms = self.stream_symbols(g, j)[:ni]
        if zpos:  # the order of (key computed from the stream, position)
            if prof == 1:
                keys = quad_points(syms, b)
            else:
                V = s0.vtx.V
                keys = []
                for t in range(ni):
                    px, py = encode(syms[max(0, t - L + 1):t + 1], V, s0.r)
                    keys.append(morton(qz(px), qz(py)))
            prev = None
            for i, (_, pos, _) in enumerate(ents):
                cur = (keys[pos], pos)
                if prev is not None and not (prev < cur):
                    raise Reject("CORRUPT", o + 64 + esz * i, "ZPOS entry %d (position %d) not above "
                                 "the previous in (key, position) order" % (i, pos), "§20.7")
                prev = cur
        elif prof == 1:
            want = quad_points(syms, b)
            for i, (key, pos, _) in enumerate(ents):
                if key != want[pos]:
                    raise Reject("CORRUPT", o + 64 + esz * i, "ZIDX key of position %d differs from the stream"
                                 % pos, "§20.3")
        else:
            V = s0.vtx.V
            for i, (key, pos, xy) in enumerate(ents):
                px, py = encode(syms[max(0, pos - L + 1):pos + 1], V, s0.r)
                if xy != struct.pack("<dd", px, py) or key != morton(qz(px), qz(py)):
                    raise Reject("CORRUPT", o + 64 + esz * i, "ZIDX point of position %d differs from the stream"
                                 % pos, "§20.3")

    # ---- full-verification checks of a segment
    def verify_segment_full(self, s):
        F = self.F
        e = s.e
        self.verify_checksum(e)
        o = e.offset
        if not is_zero(F[o + 64 + 8 * s.n_blocks:s.data_start]):
            raise Reject("PADDING", o + 64 + 8 * s.n_blocks, "STRM padding after the block table not zero",
                         "§11.3")
        for i in range(s.n_blocks):
            self.verify_block(s, i)
        for j in range(s.ns):
            if s.profile == 1:
                used = s.count * s.b
                P = s.data_start + j * s.stream_bytes
                endbit = 8 * s.stream_bytes
                if used < endbit:
                    b0 = used // 8
                    part = int.from_bytes(F[P + b0:P + s.stream_bytes], "little") >> (used - 8 * b0)
                    if part:
                        raise Reject("PADDING", P + b0, "STRM stream %d unused bits not zero" % j, "§11.7")
            else:
                for q in range((s.count + s.L - 1) // s.L):
                    self.ngon_span(s, j, q)

    # ---- main
    def run(self):
        head, self.commits, torn = self.open()
        self.torn = torn
        self.load_directories()
        if self.full:
            self.check_tiling()
        E = self.entries
        last = self.commits[-1]
        npos, narch = last.n_positions, last.n_archived
        descs = [e for e in E if e.type == b"DESC"]
        cbs = [e for e in E if e.type in (b"CBK1", b"CBRF")]
        for e in E:
            if e.type == b"CBRF" and not self.req & FEAT_EXTCB:
                raise Reject("CORRUPT", e.eoff, "CBRF without the EXTERNAL_CODEBOOK feature", "§3.3, §13.5")
        if len(descs) > 1 or (descs and descs[0].commit != 0):
            raise Reject("CORRUPT", descs[-1].eoff, "second DESC or DESC after commit 1", "§8.3")
        if len(cbs) > 1:
            raise Reject("CORRUPT", cbs[1].eoff, "more than one codebook section", "§13.7")
        seen = set()
        for e in E:
            if e.type == b"VTXS":
                if e.key in seen:
                    raise Reject("CORRUPT", e.eoff, "second VTXS for N = %d" % e.key, "§10.3")
                seen.add(e.key)
        if self.full:
            for e in E:
                if e.type in MUST_REQUIRED and not e.flags & F_REQUIRED:
                    raise Reject("CORRUPT", e.eoff + 4, "%s entry without REQUIRED" % e.tname(), "§4.3")
        self.has_desc = bool(descs)
        if not descs:
            return self.run_codebook_file(E, npos, narch)
        self.parse_desc(descs[0])
        if self.full:
            for e in E:
                if e.type == b"VTXS":
                    self.load_vtxs(e)
        self.apply_segments()
        if 0 in self.first_seg and not cbs:
            raise Reject("CORRUPT", self.first_seg[0].e.eoff, "index streams without a codebook", "§11.8")
        if narch > 0 and 0 not in self.first_seg:
            raise Reject("CORRUPT", last.dir_offset + 24, "n_archived %d without index streams" % narch, "§11.8")
        if 0 in self.glen and self.glen[0] != narch:
            raise Reject("CORRUPT", last.dir_offset + 24, "index streams have %d symbols, n_archived is %d"
                         % (self.glen[0], narch), "§11.6")
        if 1 in self.glen and self.glen[1] != npos:
            raise Reject("CORRUPT", last.dir_offset + 16, "token stream has %d symbols, n_positions is %d"
                         % (self.glen[1], npos), "§11.6")
        # EXAC headers and coverage (§14.3)
        S, A, n = self.S, narch, npos
        if A and S + A > n:
            raise Reject("CORRUPT", last.dir_offset + 24, "S + A = %d > n = %d" % (S + A, n), "§14.3")
        exacs = []
        for e in E:
            if e.type == b"EXAC":
                fp, cnt = self.parse_exac(e)
                exacs.append((e, fp, cnt))
        exact_ranges = [(0, min(S, n)), (S + A, n)] if A else [(0, n)]
        rows = {}
        for lo, hi in exact_ranges:
            for t in range(lo, hi):
                src = None
                for (e, fp, cnt) in reversed(exacs):
                    if fp <= t < fp + cnt:
                        src = (e, fp)
                        break
                if src is None:
                    raise Reject("CORRUPT", None, "exact position %d not covered by any EXAC" % t, "§14.3")
                rows[t] = src
        # codebook
        cbhash = bytes(16)
        cbk = None
        if cbs:
            ce = cbs[0]
            if ce.type == b"CBK1":
                cbk = self.parse_cbk1(ce)
                self.match_codebook(cbk, "CORRUPT", ce.offset)
                # finite values (§13.2): full verification checks them; the
                # ordinary path when it restores archived rows
                if self.full or A:
                    self.check_cbk_finite(cbk, ce.offset)
                cbhash = xxh3_128_canonical(bytes(cbk.data))
            else:
                cbhash = self.parse_cbrf(ce)
                cbk = self.external_codebook(cbhash, ce.offset, A)
                if cbk is not None and (self.full or A):
                    self.check_cbk_finite(cbk, ce.offset, "CODEBOOK")
        if A and cbk is None and not self.full:
            # restoring archived rows needs the codebook; full verification
            # checks everything else without it (§13.5)
            raise Reject("CODEBOOK", None, "archived positions need the external codebook; none given",
                         "§13.5")
        # decode
        idx = []
        if A:
            s0 = self.first_seg[0]
            for j in range(s0.ns):
                syms = self.stream_symbols(0, j)
                if cbk is not None and max(syms) >= cbk.k:
                    a = max(range(len(syms)), key=syms.__getitem__)
                    raise Reject("SYMBOL", None, "index stream %d symbol %d is %d >= k = %d"
                                 % (j, a, syms[a], cbk.k), "§11.8")
                idx.append(syms)
        self.cbk, self._exact, self._idx = cbk, rows, idx   # for restore()
        toks = self.stream_symbols(1, 0) if 1 in self.first_seg else []
        parts = [struct.pack("<Q", n), cbhash]
        rb = self.row_bytes
        pk = struct.Struct("<%dI" % len(idx)).pack if A else None
        for t in range(n):
            if t in rows:
                e, fp = rows[t]
                d = self.contents(e)
                parts.append(b"\x00")
                parts.append(bytes(d[64 + (t - fp) * rb:64 + (t - fp + 1) * rb]))
            else:
                a = t - S
                parts.append(b"\x01")
                parts.append(pk(*[x[a] for x in idx]))
        parts.append(struct.pack("<Q", len(toks)))
        parts.append(struct.pack("<%dI" % len(toks), *toks))
        digest = xxh3_64(b"".join(parts), 0)
        if self.full:
            self.verify_rest(E, cbk.k if cbk is not None else None,
                             cbk if cbs and cbs[0].type == b"CBK1" else None)
        return digest

    def verify_rest(self, E, k=None, chain_cbk=None):
        """The checks only full verification makes, after the ordinary
        path's; chain_cbk: the CBK1 the chain itself holds (embedded, or the
        codebook file's own), None for a CBRF archive or one without a
        codebook (§13.8 check 5)."""
        for s in getattr(self, "segs", []):
            self.verify_segment_full(s)
            # every stored index symbol below k, also in parts later
            # segments cut away (§11.8, full verification); k is None
            # without a codebook (an external one not given, §13.5)
            if s.group == 0 and k is not None:
                for j in range(s.ns):
                    syms = self.seg_symbols(s, j, s.count)
                    if syms and max(syms) >= k:
                        raise Reject("SYMBOL", s.e.offset, "STRM section stream %d holds symbol %d >= k = %d"
                                     % (j, max(syms), k), "§11.8")
        for e in E:
            if e.type == b"META":
                self.check_meta(e)
            elif e.type not in KNOWN:
                self.contents(e)
            elif e.type in SEARCH_INDEX:
                self.check_zidx(e)
        self.check_cmet([e for e in E if e.type == CMET], chain_cbk)
        if self.torn:
            raise Reject("TORN", self.n - self.torn, "%d torn bytes after the last valid commit" % self.torn,
                         "§7.2, §1.3.3")

    def restore(self, t):
        """§14.4: the row of position t (bytes, §14.2 layout), after run().
        An exact row as stored; an archived one reconstructed by §13.6 with
        the layer's stage counts ks(l), vs(l) and the reference computation
        (centroids to binary32, summed from +0.0 in stage order, each sum a
        binary32 operation; for key_storage 1 the rotation of §8.1 in
        binary64; rounded to the descriptor's dtype at the end). The digest
        does not cover archived rows (Annex A): this is for tools and tests
        (writer_check.py compares it with the writer's own sums)."""
        if not 0 <= t < self.commits[-1].n_positions:
            raise IndexError("position %d beyond n_positions" % t)
        if t in self._exact:
            e, fp = self._exact[t]
            rb = self.row_bytes
            return bytes(self.contents(e)[64 + (t - fp) * rb:64 + (t - fp + 1) * rb])
        c = self.cbk
        if c is None:
            raise Reject("CODEBOOK", None, "archived position %d needs the external codebook; none given"
                         % t, "§13.5")
        a = t - self.S
        out = bytearray()
        for l in range(self.nl):
            ks, vs = c.stages(l)
            keys, values = [], []
            for h in range(self.H):
                hh = 0 if c.pooled else h
                vecs = []
                for kv, stages, dim in ((0, ks, self.dk), (1, vs, self.dv)):
                    acc = [0.0] * dim          # zero stages: the zero vector
                    for st in range(stages):
                        sym = self._idx[c.stream_j(self.H, l, h, kv, st)][a]
                        acc = [f32r(x + y) for x, y in zip(acc, c.row(kv, l, hh, st, sym))]
                    vecs.append(acc)
                if self.rope is not None and self.rope[1] == 1:
                    vecs[0] = rope_rotate(vecs[0], t, self.rope)
                keys.append(vecs[0])
                values.append(vecs[1])
            for v in keys + values:
                out += pack_elems(v, self.dtype)
        return bytes(out)

    def run_codebook_file(self, E, npos, narch):
        for e in E:
            if e.type in (b"CBRF", b"STRM", b"EXAC"):
                raise Reject("CORRUPT", e.eoff, "a file without DESC holds a %s section" % e.tname(), "§13.4")
        cb = [e for e in E if e.type == b"CBK1"]
        if not cb:
            raise Reject("CORRUPT", None, "a file without DESC has no CBK1", "§13.4")
        if npos or narch:
            raise Reject("CORRUPT", self.commits[-1].dir_offset + 16,
                         "a codebook file with non-zero position counts", "§13.4")
        self.first_seg, self.glen, self.pieces, self.segs = {}, {}, {0: [], 1: []}, []
        c = self.parse_cbk1(cb[0])
        if self.full:
            self.check_cbk_finite(c, cb[0].offset)  # §13.2
            for e in E:
                if e.type == b"VTXS":
                    self.load_vtxs(e)
        self.cbk = c
        digest = xxh3_64(bytes(c.data), 0)
        if self.full:
            self.verify_rest(E, None, c)
        return digest

    def external_codebook(self, want, off, A):
        p = self.codebook_path
        if not p:
            return None
        # a candidate that cannot be read is an environment failure, not a
        # format class (§13.5, §16.3): the OSError reaches main (exit 2)
        with open(p, "rb") as fh:
            data = fh.read()
        # opened by §7.2 (non-strict: a torn candidate serves its last
        # commit), with the checks of the ordinary path only; any failure is
        # CODEBOOK whatever its own class; its values are checked by the
        # caller (§13.2)
        sub = Reader(memoryview(data), "open", None, p)
        try:
            sub.run()
        except Reject as x:
            raise Reject("CODEBOOK", off, "the codebook file is not valid: " + x.message(), "§13.5")
        if sub.has_desc:
            raise Reject("CODEBOOK", off, "the codebook file %s is not a codebook file (it has DESC)" % p,
                         "§13.5")
        c = sub.cbk
        if xxh3_128_canonical(bytes(c.data)) != want:
            raise Reject("CODEBOOK", off, "the codebook file's content hash differs from the CBRF's",
                         "§13.5")
        self.match_codebook(c, "CODEBOOK", off)
        return c


# ------------------------------------------------------ encoder metric (§13.8)

def metric_fault(m, n):
    """Check 7 of §13.8 on the n x n matrix m (row-major, the f32 values as
    binary64): None when every element is finite, element (i, j) equals
    element (j, i) in value, and the Cholesky factorization M = L L^T in
    binary64 (column by column, L(j,j)^2 = M(j,j) - sum_{p<j} L(j,p)^2, the
    sums in increasing p) has every pivot greater than zero; else what
    fails. O(n^3) in Python: fine for the small matrices of the suite."""
    for i, x in enumerate(m):
        if not math.isfinite(x):
            return "element (%d, %d) is not finite (%r)" % (i // n, i % n, x)
    for i in range(n):
        for j in range(i + 1, n):
            if m[i * n + j] != m[j * n + i]:
                return "not symmetric: element (%d, %d) = %r, (%d, %d) = %r" \
                    % (i, j, m[i * n + j], j, i, m[j * n + i])
    L = [[0.0] * n for _ in range(n)]
    for j in range(n):
        Lj = L[j]
        s = m[j * n + j]
        for p in range(j):
            s -= Lj[p] * Lj[p]
        if not s > 0.0:
            return "not positive definite: Cholesky pivot %d is %r" % (j, s)
        r = math.sqrt(s)
        Lj[j] = r
        for i in range(j + 1, n):
            Li = L[i]
            t = m[i * n + j]
            for p in range(j):
                t -= Li[p] * Lj[p]
            Li[j] = t / r
    return None


# ------------------------------------------------- element types (§2.1, §13.6)

def f32r(x):
    """x rounded to binary32 (nearest even); beyond its range an infinity."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def pack_elems(vals, dtype):
    """Little-endian elements of dtype, each rounded to nearest even: f16
    beyond its range an infinity, bf16 the rounded upper half of the
    binary32 (§13.6)."""
    out = bytearray()
    for v in vals:
        if dtype == 3:
            out += struct.pack("<f", f32r(v))
        elif dtype == 1:
            try:
                out += struct.pack("<e", v)
            except OverflowError:
                out += struct.pack("<e", math.copysign(math.inf, v))
        else:
            u = struct.unpack("<I", struct.pack("<f", f32r(v)))[0]
            if (u & 0x7F800000) == 0x7F800000 and u & 0x7FFFFF:
                h = (u >> 16) | 0x40          # a NaN stays a NaN
            else:
                h = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
            out += struct.pack("<H", h & 0xFFFF)
    return bytes(out)


def rope_rotate(key, t, rope):
    """§8.1: R(+angle(t, .)) applied to every pair of key, in binary64."""
    layout, _storage, dims, theta = rope
    half = dims // 2
    out = list(key)
    for i in range(half):
        j0, j1 = (2 * i, 2 * i + 1) if layout == 1 else (i, i + half)
        ang = t * theta ** (-2.0 * i / dims)
        c, s = math.cos(ang), math.sin(ang)
        out[j0] = key[j0] * c - key[j1] * s
        out[j1] = key[j0] * s + key[j1] * c
    return out


# ------------------------------------------------------------ codec helpers

def encode(syms, V, r):
    px = 0.0
    py = 0.0
    for c in syms:
        vx, vy = V[c]
        px = vx + r * (px - vx)
        py = vy + r * (py - vy)
    return px, py


def decode_span(anchor, ln, V, r, off):
    ax, ay = struct.unpack("<dd", anchor)
    if not (math.isfinite(ax) and math.isfinite(ay)):
        raise Reject("SPAN", off, "ngon anchor not finite", "§12.2.4")
    px, py = ax, ay
    out = [0] * ln
    rng = range(len(V))
    for m in range(ln - 1, -1, -1):
        ds = [(px - vx) * (px - vx) + (py - vy) * (py - vy) for vx, vy in V]
        best = min(rng, key=ds.__getitem__)
        out[m] = best
        vx, vy = V[best]
        px = vx + (px - vx) / r
        py = vy + (py - vy) / r
    ex, ey = encode(out, V, r)
    if struct.pack("<dd", ex, ey) != bytes(anchor):
        raise Reject("SPAN", off, "ngon anchor does not re-encode to itself", "§12.2.5")
    return out


def quad_points(syms, b):
    out = []
    z = 0
    sh = 128 - b
    for c in syms:
        z = (z >> b) | (c << sh)
        out.append(z)
    return out


def qz(v):
    w = (v + 1.0) * 2147483648.0
    if not (w > 0.0):
        return 0
    if w >= 4294967295.0:
        return 4294967295
    return math.floor(w)


_SPREAD = [0] * 256
for _i in range(256):
    _v = 0
    for _k in range(8):
        if _i >> _k & 1:
            _v |= 1 << (2 * _k)
    _SPREAD[_i] = _v


def morton(a, b):
    r = 0
    for k in range(4):
        r |= (_SPREAD[(a >> (8 * k)) & 255] | (_SPREAD[(b >> (8 * k)) & 255] << 1)) << (16 * k)
    return r


# -------------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Second FKVF reader (spec/fkvf-v1.md): verify or open a file and print its "
                    "conformance digest (exit 0) or the error class (exit 1).")
    ap.add_argument("--mode", choices=("verify", "open"), default="verify",
                    help="verify: full verification (§1.3.3, default); open: the ordinary access path")
    ap.add_argument("--codebook", default="", metavar="FILE",
                    help="codebook file for an external codebook reference (CBRF, §13.5); empty = none")
    ap.add_argument("file", help="the FKVF file")
    a = ap.parse_args(argv)
    try:
        with open(a.file, "rb") as fh:
            data = fh.read()
    except OSError as x:
        print("fkvf_read: %s" % x, file=sys.stderr)
        return 2
    rd = Reader(memoryview(data), a.mode, a.codebook or None, a.file)
    try:
        digest = rd.run()
    except OSError as x:  # the codebook file could not be read (§16.3)
        print("fkvf_read: %s" % x, file=sys.stderr)
        return 2
    except Reject as x:
        print("class %s" % x.cls)
        print("%s: %s" % (a.file, x.message()), file=sys.stderr)
        return 1
    print("digest %016x" % digest)
    if rd.torn:
        print("%s: torn tail of %d bytes ignored (§7.2)" % (a.file, rd.torn), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
