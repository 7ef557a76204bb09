#!/usr/bin/env python3
"""Check the spec-only Python writer (fkvf_write.py) against libfkvf and
the second reader (issue 17, point 12).

    writer_check.py --fkvf PATH/fkvf [--conf-read PATH/fkvf-conf-read] [--keep DIR]
                    [--c-layer-stages]

Writes the demonstration files of fkvf_write.py twice (the bytes must be
the same: the writer is deterministic), then, for every file:

* `fkvf validate --strict` accepts it (exit 0; with --json: valid, no
  violation), and `fkvf verify --json` too, with the expected number of
  commits, no torn bytes and the committed size = the file size;
* `fkvf info --json` reports the shape, positions, archived positions,
  commits, streams (§11.1 identifiers, widths, lengths) and metadata the
  writer was given;
* `fkvf unpack` restores every position: exact rows byte for byte as the
  writer was given them, archived rows equal to the sum of the centroids
  the writer chose (the demonstration codebooks make that sum exact, so no
  tolerance is needed), and the token ids;
* libfkvf (fkvf-conf-read, when given, full verification and the access
  path) and the second reader (fkvf_read.py, both modes) accept it with the
  conformance digest (spec Annex A) computed from what the writer
  was given: the rows, the index symbols in canonical order, the tokens;
  and the second reader restores every position (§14.4, §13.6) to the row
  the writer expects;
* the header has LAYER_STAGES exactly when the codebook has a layer table
  and the optional bit ENCODER_METRIC exactly when the file holds a CMET
  (§3.4, §13.8), and format_minor the lowest version defining its bits: 2
  with ENCODER_METRIC, else 1 with LAYER_STAGES, else 0 (§1.3.1);
* the encoder metric (pyw_metric*.fkvf) changes the symbols of some
  archived positions (compared with the Euclidean choice).

The files with per-layer stage counts (pyw_layers*.fkvf, LAYER_STAGES,
spec version 1.1) are checked by libfkvf (validate, verify, info, unpack,
fkvf-conf-read) like the others (C_LAYER_STAGES below, --c-layer-stages);
the second reader checks them always. The files with an encoder metric
(pyw_metric*.fkvf, CMET, spec version 1.2) are checked by libfkvf too
(C_METRIC below, on since libfkvf 0.3.0; --c-metric) and by the second
reader always (its full verification checks §13.8).

Then negative controls show that these checks can fail: a changed expected
row, symbol or token is noticed; a flipped byte is rejected by validate,
verify and the second reader (CHECKSUM); a header with a reserved optional
feature bit (re-sealed) passes plain validation but not --strict; the
appender refuses a torn file, and appending left the earlier commit's bytes
untouched (§7.4); a CMET with an asymmetric matrix (re-sealed) fails the
second reader's full verification but not its access path, and the
appender refuses to encode with it (§13.8). Exit 0 when everything holds,
1 otherwise.
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fkvf_read as R  # noqa: E402
import fkvf_write as W  # noqa: E402
from xxh3 import xxh3_64  # noqa: E402

failures = []
# libfkvf reads files with per-layer stage counts (LAYER_STAGES, spec 1.1)
# since it implements format 1.1: the C checks run on the pyw_layers* files
C_LAYER_STAGES = True
# the encoder metric (CMET, spec 1.2, §13.8): libfkvf implements it (0.3.0),
# so the C checks run on the pyw_metric* files too
C_METRIC = True


def check(name, ok, detail=""):
    if ok:
        print("ok   %s" % name)
    else:
        failures.append(name)
        print("FAIL %s%s" % (name, ": " + detail if detail else ""))


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p.returncode, p.stdout, p.stderr


def run_json(cmd):
    rc, out, err = run(cmd)
    try:
        return rc, json.loads(out), err
    except ValueError:
        return rc, None, "not JSON: %r %s" % (out[:200], err)


# ------------------------------------------------------------- expectations

def digest(e):
    """The conformance digest (spec/fkvf-v1.md, Annex A) of what the
    writer was given: n, the codebook's content hash, every position (exact:
    0 and its row; archived: 1 and its u32 symbols in canonical order), the
    token ids."""
    parts = [struct.pack("<Q", e.n),
             e.codebook.content_hash() if e.codebook is not None else bytes(16)]
    S = e.desc.S
    for t in range(e.n):
        if S <= t < S + e.A:
            syms = e.archived[t - S]
            parts.append(b"\x01" + struct.pack("<%dI" % len(syms), *syms))
        else:
            parts.append(b"\x00" + e.rows[t])
    toks = e.tokens or []
    parts.append(struct.pack("<Q", len(toks)) + struct.pack("<%dI" % len(toks), *toks))
    return "%016x" % xxh3_64(b"".join(parts), 0)


def expected_tensors(e):
    """The safetensors tensors of `fkvf unpack --names fkvf --layout hnd`
    (docs/cache-files.md): layers.{l}.key [H, T, Dk], layers.{l}.value
    [H, T, Dv] in the archive's dtype, tokens [T] as i64."""
    d = e.desc
    es = W.ESIZE[d.dtype]
    per_layer = d.H * (d.Dk + d.Dv) * es
    out = {}
    for l in range(d.L):
        for kv, dim in (("key", d.Dk), ("value", d.Dv)):
            buf = bytearray()
            for h in range(d.H):
                for t in range(e.n):
                    row = e.rows[t]
                    if kv == "key":
                        o = l * per_layer + h * d.Dk * es
                    else:
                        o = l * per_layer + d.H * d.Dk * es + h * d.Dv * es
                    buf += row[o:o + dim * es]
            out["layers.%d.%s" % (l, kv)] = ([d.H, e.n, dim], bytes(buf))
    if e.tokens is not None:
        out["tokens"] = ([e.n], struct.pack("<%dq" % e.n, *e.tokens))
    return out


def read_safetensors(path):
    with open(path, "rb") as fh:
        data = fh.read()
    hl = struct.unpack_from("<Q", data, 0)[0]
    head = json.loads(data[8:8 + hl])
    base = 8 + hl
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], data[base + a:base + b])
    return out


DT_NAME = {W.DT_F16: "F16", W.DT_BF16: "BF16", W.DT_F32: "F32"}


def compare_unpacked(e, got):
    """Mismatches between the unpacked tensors and the expectation: a list
    of strings naming the tensor, (head, position) and the kind of position."""
    bad = []
    want = expected_tensors(e)
    if sorted(got) != sorted(want):
        return ["tensors %s, expected %s" % (sorted(got), sorted(want))]
    d = e.desc
    es = W.ESIZE[d.dtype]
    for name, (shape, wbytes) in want.items():
        dt, gshape, gbytes = got[name]
        wdt = "I64" if name == "tokens" else DT_NAME[d.dtype]
        if dt != wdt or gshape != shape:
            bad.append("%s: %s %s, expected %s %s" % (name, dt, gshape, wdt, shape))
            continue
        if gbytes == wbytes:
            continue
        if name == "tokens":
            bad.append("tokens differ")
            continue
        dim = shape[2]
        for h in range(shape[0]):
            for t in range(shape[1]):
                o = (h * shape[1] + t) * dim * es
                if gbytes[o:o + dim * es] != wbytes[o:o + dim * es]:
                    kind = "archived" if d.S <= t < d.S + e.A else "exact"
                    bad.append("%s head %d position %d (%s): %s, expected %s"
                               % (name, h, t, kind,
                                  W.decode_elems(gbytes[o:o + dim * es], d.dtype),
                                  W.decode_elems(wbytes[o:o + dim * es], d.dtype)))
    return bad


def expected_streams(e):
    """§11.1 stream identifiers -> (bits, symbols) of the file's streams."""
    out = {}
    cb, d = e.codebook, e.desc
    if cb is not None and e.A:
        b = W.quad_bits_for(cb.k)
        for l in range(d.L):
            for h in range(d.H):
                for kv, stages in zip((0, 1), cb.stages(l)):   # the layer's counts (§11.1)
                    for s in range(stages):
                        out[l | h << 16 | kv << 32 | s << 40] = (b, e.A)
    if e.tokens is not None:
        out[1 << 56] = (16, e.n)
    return out


# ------------------------------------------------------------------ checks

def layered(e):
    return e.codebook is not None and e.codebook.layer_table is not None


def check_file(e, path, a, tmp):
    nm = e.name
    req = e.codebook.required_features() if e.codebook is not None else 0
    with open(path, "rb") as fh:
        data = fh.read()
    minor, = struct.unpack_from("<H", data, 12)
    freq, fopt = struct.unpack_from("<QQ", data, 24)
    want_minor = 2 if e.metric is not None else 1 if layered(e) else 0
    check("%s: header format_minor %d, required_features 0x%x (§1.3.1, §3.4)"
          % (nm, want_minor, req),
          minor == want_minor and freq == req, "minor %d, required 0x%x" % (minor, freq))
    check("%s: optional_features 0x%x (§3.4)" % (nm, opt_bits(e)), fopt == opt_bits(e),
          "0x%x" % fopt)
    check_second_reader(e, data)
    if e.metric is not None:
        d, S = e.desc, e.desc.S
        euclid = sum(e.codebook.quantize(d, e.rows_in[p]) != e.archived[p - S]
                     for p in range(S, S + e.A))
        check("%s: the metric changes the symbols of some archived positions (%d of %d)"
              % (nm, euclid, e.A), euclid > 0)
    if layered(e) and not a.c_layer_stages:
        print("skip %s: libfkvf checks (validate, verify, info, unpack, fkvf-conf-read): "
              "LAYER_STAGES not enabled for libfkvf (--c-layer-stages)" % nm)
        return
    if e.metric is not None and not a.c_metric:
        print("skip %s: libfkvf checks (validate, verify, info, unpack, fkvf-conf-read): "
              "the encoder metric (CMET, §13.8) not enabled for libfkvf (--c-metric)" % nm)
        return
    check_file_c(e, path, a, tmp, req)


def opt_bits(e):
    """The optional feature bits the writer sets (§3.4)."""
    return (W.OPT_TOKEN_STREAM if e.tokens is not None else 0) | \
        (W.OPT_ENCODER_METRIC if e.metric is not None else 0)


def check_second_reader(e, data):
    """The second reader: both modes accept with the expected digest, and
    every position restores to the row the writer expects."""
    nm = e.name
    want = digest(e)
    for mode in ("verify", "open"):
        try:
            rd = R.Reader(memoryview(data), mode)
            got = "%016x" % rd.run()
            check("%s: second reader (%s) digest %s" % (nm, mode, want), got == want,
                  "digest %s" % got)
        except R.Reject as x:
            check("%s: second reader (%s)" % (nm, mode), False, x.message())
            continue
        if mode == "open":
            try:
                bad = [t for t in range(e.n) if rd.restore(t) != e.rows[t]]
            except R.Reject as x:
                bad = ["rejected: " + x.message()]
            check("%s: second reader restores the %d positions (%d archived)" % (nm, e.n, e.A),
                  not bad, "positions %r" % bad[:5])


def check_file_c(e, path, a, tmp, req):
    nm = e.name
    size = os.path.getsize(path)
    rc, out, err = run([a.fkvf, "validate", "--strict", path])
    check("%s: fkvf validate --strict" % nm, rc == 0, "exit %d %s %s" % (rc, out, err))
    rc, js, err = run_json([a.fkvf, "validate", "--strict", "--json", path])
    f = (js or {}).get("files", [{}])[0]
    check("%s: fkvf validate --strict --json: no violation" % nm,
          rc == 0 and js is not None and js.get("strict") is True and f.get("valid") is True
          and f.get("violations") == [] and f.get("count") == 0,
          "exit %d %s %s" % (rc, js, err))
    rc, js, err = run_json([a.fkvf, "verify", "--json", path])
    check("%s: fkvf verify" % nm,
          rc == 0 and js is not None and js["valid"] is True and js["commits"] == e.commits
          and js["torn_bytes"] == 0 and js["committed_size"] == size,
          "exit %d %s %s" % (rc, js, err))

    rc, js, err = run_json([a.fkvf, "info", "--json", path])
    d = e.desc
    want_cache = {"layers": d.L, "kv_heads": d.H, "key_dim": d.Dk, "value_dim": d.Dv,
                  "dtype": {1: "f16", 2: "bf16", 3: "f32"}[d.dtype], "sinks": d.S,
                  "window": d.W, "model_id": d.model_id.decode(),
                  "tokenizer_id": d.tokenizer_id.decode()}
    ok = rc == 0 and js is not None
    detail = "exit %d %s" % (rc, err)
    if ok:
        got_cache = {k: js["cache"].get(k) for k in want_cache}
        streams = {s["id"]: (s["bits"], s["symbols"]) for s in js["stream_list"]
                   if s["profile"] == "quad"}
        meta = {k: (bytes(v).hex() if t == "bytes" else v) for k, t, v in (e.meta or [])}
        want = (want_cache, e.n, e.A, e.commits, expected_streams(e), meta, opt_bits(e), req)
        got = (got_cache, js["positions"], js["archived"], js["commits"], streams,
               js.get("metadata", {}), js["optional_features"], js["required_features"])
        ok = got == want and len(js["stream_list"]) == len(streams)
        detail = "got %r, expected %r" % (got, want)
        if ok and d.rope is not None:
            r = js["cache"]["rope"] or {}
            ok = (r.get("dims") == d.rope[1] and r.get("theta") == d.rope[2]
                  and r.get("layout") == {1: "interleaved", 2: "half-split"}[d.rope[0]])
            detail = "rope %r, expected %r" % (r, d.rope)
    check("%s: fkvf info: shape, positions, commits, streams, metadata" % nm, ok, detail)

    st = os.path.join(tmp, nm + ".safetensors")
    rc, out, err = run([a.fkvf, "unpack", path, "-o", st, "--names", "fkvf", "--layout", "hnd",
                        "--force"])
    if rc != 0:
        check("%s: fkvf unpack" % nm, False, "exit %d %s %s" % (rc, out, err))
    else:
        bad = compare_unpacked(e, read_safetensors(st))
        check("%s: fkvf unpack: %d exact rows byte for byte, %d archived rows = the "
              "codebook sums, %s token ids" % (nm, len(e.exact), e.A,
                                                e.n if e.tokens is not None else "no"),
              not bad, "; ".join(bad[:5]))

    want = digest(e)
    if a.conf_read:
        for mode in ("verify", "open"):
            cmd = [a.conf_read] + (["--open"] if mode == "open" else []) + [path]
            rc, out, err = run(cmd)
            check("%s: libfkvf (fkvf-conf-read, %s) digest %s" % (nm, mode, want),
                  rc == 0 and out.split() == ["digest", want],
                  "exit %d %s %s" % (rc, out.strip(), err.strip()))


def negative_controls(exps, d1, a, tmp):
    """Each of the checks above can fail."""
    by = {e.name: e for e in exps}
    e = by["pyw_appended.fkvf"]
    path = os.path.join(d1, e.name)
    st = os.path.join(tmp, e.name + ".safetensors")
    got = read_safetensors(st)
    # a wrong expectation is noticed: an exact row, an archived row, a token
    for what, p in (("exact", e.exact[-1]), ("archived", e.desc.S + e.A - 1)):
        saved = e.rows[p]
        e.rows[p] = bytes([saved[0] ^ 1]) + saved[1:]
        bad = compare_unpacked(e, got)
        e.rows[p] = saved
        check("control: a changed %s row is noticed" % what,
              len(bad) == 1 and ("position %d (%s)" % (p, what)) in bad[0], repr(bad))
    e.tokens[3] += 1
    bad = compare_unpacked(e, got)
    dg = digest(e)
    e.tokens[3] -= 1
    check("control: a changed token id is noticed", bad == ["tokens differ"] and dg != digest(e),
          repr(bad))
    e.archived[5][1] ^= 1
    dg = digest(e)
    e.archived[5][1] ^= 1
    check("control: a changed index symbol changes the digest", dg != digest(e))

    # a flipped byte in the last exact row of commit 2 (not re-sealed)
    with open(path, "rb") as fh:
        data = bytearray(fh.read())
    o = W.Opened(bytes(data))
    exac = [x for x in o.entries if x[0] == b"EXAC"][-1]
    off = exac[2] + exac[3] - 1
    data[off] ^= 0x40
    bad_path = os.path.join(tmp, "flipped.fkvf")
    with open(bad_path, "wb") as fh:
        fh.write(data)
    rc, js, err = run_json([a.fkvf, "validate", "--strict", "--json", bad_path])
    classes = [v["class"] for v in ((js or {}).get("files", [{}])[0].get("violations") or [])]
    check("control: a flipped EXAC byte fails fkvf validate --strict (CHECKSUM)",
          rc == 1 and "CHECKSUM" in classes, "exit %d %s" % (rc, classes))
    rc, out, err = run([a.fkvf, "verify", bad_path])
    check("control: ... and fkvf verify", rc == 1, "exit %d" % rc)
    try:
        R.Reader(memoryview(bytes(data)), "verify").run()
        check("control: ... and the second reader", False, "accepted")
    except R.Reject as x:
        check("control: ... and the second reader (CHECKSUM)", x.cls == "CHECKSUM", x.message())

    # a reserved optional feature bit (§3.4: writers write 0; bit 2, the
    # first one version 1.2 leaves reserved), header re-sealed: a reader
    # ignores it, --strict flags it as a writer rule
    with open(os.path.join(d1, "pyw_exact.fkvf"), "rb") as fh:
        data = bytearray(fh.read())
    data[32] |= 4
    data[56:64] = struct.pack("<Q", xxh3_64(bytes(data[:56]), 0))
    opt_path = os.path.join(tmp, "optbit.fkvf")
    with open(opt_path, "wb") as fh:
        fh.write(data)
    rc1, _, _ = run([a.fkvf, "validate", opt_path])
    rc2, _, _ = run([a.fkvf, "validate", "--strict", opt_path])
    check("control: a reserved optional bit passes validate, fails validate --strict",
          rc1 == 0 and rc2 == 1, "exit %d, --strict exit %d" % (rc1, rc2))

    # appending never rewrites (§7.4): commit 1 of the appended files is the
    # one-commit file byte for byte
    for one, more in (("pyw_archive.fkvf", "pyw_appended.fkvf"),
                      ("pyw_multi.fkvf", "pyw_multi_appended.fkvf"),
                      ("pyw_layers.fkvf", "pyw_layers_appended.fkvf"),
                      ("pyw_metric.fkvf", "pyw_metric_appended.fkvf")):
        with open(os.path.join(d1, one), "rb") as fh:
            a1 = fh.read()
        with open(os.path.join(d1, more), "rb") as fh:
            a2 = fh.read()
        check("%s begins with %s byte for byte (§7.4)" % (more, one),
              len(a2) > len(a1) and a2[:len(a1)] == a1)

    # a layer table in a file whose LAYER_STAGES bit is clear (header
    # re-sealed, format_minor left at 1) is CORRUPT (§3.3, §13.1)
    with open(os.path.join(d1, "pyw_layers.fkvf"), "rb") as fh:
        data = bytearray(fh.read())
    data[24] &= ~W.REQ_LAYER_STAGES & 0xFF
    data[56:64] = struct.pack("<Q", xxh3_64(bytes(data[:56]), 0))
    nobit = os.path.join(tmp, "layers_nobit.fkvf")
    with open(nobit, "wb") as fh:
        fh.write(data)
    for mode in ("verify", "open"):
        try:
            R.Reader(memoryview(bytes(data)), mode).run()
            check("control: a layer table without LAYER_STAGES, second reader (%s)" % mode, False,
                  "accepted")
        except R.Reject as x:
            check("control: a layer table without LAYER_STAGES, second reader (%s): CORRUPT" % mode,
                  x.cls == "CORRUPT", x.message())
    if a.c_layer_stages:
        rc, out, err = run([a.fkvf, "verify", nobit])
        check("control: a layer table without LAYER_STAGES, fkvf verify", rc == 1,
              "exit %d %s %s" % (rc, out, err))
        if a.conf_read:
            rc, out, err = run([a.conf_read, nobit])
            check("control: a layer table without LAYER_STAGES, fkvf-conf-read: CORRUPT",
                  rc == 1 and out.split()[:2] == ["class", "CORRUPT"], "exit %d %s" % (rc, out))

    # a CMET matrix made asymmetric (one unit in the last place of element
    # (0, 1) of the first matrix; section, directory and trailer re-sealed):
    # full verification rejects it (CORRUPT), the access path ignores the
    # CMET (§7.5), and the appender refuses to encode with it (§13.8)
    with open(os.path.join(d1, "pyw_metric.fkvf"), "rb") as fh:
        data = bytearray(fh.read())
    reseal_section(data, b"CMET", lambda off: data.__setitem__(
        slice(off + 68, off + 72),
        struct.pack("<I", struct.unpack_from("<I", data, off + 68)[0] + 1)))
    for mode, want in (("verify", "CORRUPT"), ("open", None)):
        try:
            R.Reader(memoryview(bytes(data)), mode).run()
            got = None
        except R.Reject as x:
            got = x.cls
        check("control: an asymmetric CMET matrix, second reader (%s): %s"
              % (mode, want or "accepted"), got == want, "got %s" % got)
    asym = os.path.join(tmp, "metric_asym.fkvf")
    with open(asym, "wb") as fh:
        fh.write(data)
    e = by["pyw_metric.fkvf"]
    try:
        W.append(asym, [e.rows_in[36]], new_tokens=[1], sync=False)
        refused = False
    except W.WriteError:
        refused = True
    with open(asym, "rb") as fh:
        check("control: the appender refuses a file whose CMET fails §13.8 and leaves it "
              "unchanged", refused and fh.read() == bytes(data))

    # the appender refuses a torn file (§7.7) and leaves it unchanged
    torn = os.path.join(tmp, "torn.fkvf")
    with open(os.path.join(d1, "pyw_archive.fkvf"), "rb") as fh:
        data = fh.read()
    with open(torn, "wb") as fh:
        fh.write(data + bytes(100))
    try:
        W.append(torn, [e.rows[0]], new_tokens=[1], sync=False)
        refused = False
    except W.WriteError:
        refused = True
    with open(torn, "rb") as fh:
        check("control: the appender refuses a torn file and leaves it unchanged",
              refused and fh.read() == data + bytes(100))


def reseal_section(data, typ, change):
    """Apply change(offset) to the first section of type typ in the last
    commit of data (a bytearray), then re-seal its checksum, the directory
    checksum and the trailer (§4.6, §6)."""
    T = len(data) - 64
    dof, dsz = struct.unpack_from("<QQ", data, T + 16)
    cnt, = struct.unpack_from("<I", data, dof + 4)
    for i in range(cnt):
        eo = dof + 64 + 64 * i
        if bytes(data[eo:eo + 4]) == typ:
            off, stored = struct.unpack_from("<QQ", data, eo + 8)
            change(off)
            struct.pack_into("<Q", data, eo + 40, xxh3_64(bytes(data[off:off + stored]), off))
            struct.pack_into("<Q", data, T + 32, xxh3_64(bytes(data[dof:dof + dsz]), dof))
            struct.pack_into("<Q", data, T + 56, xxh3_64(bytes(data[T:T + 56]), T))
            return
    raise ValueError("no %r section in the last commit" % typ)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fkvf", required=True, help="the fkvf command-line tool")
    ap.add_argument("--conf-read", help="fkvf-conf-read (libfkvf digest), optional")
    ap.add_argument("--keep", help="write the files here (default: a temporary directory)")
    ap.add_argument("--c-layer-stages", action="store_true", default=C_LAYER_STAGES,
                    help="check the LAYER_STAGES files (pyw_layers*) with libfkvf too")
    ap.add_argument("--c-metric", action="store_true", default=C_METRIC,
                    help="check the encoder-metric files (pyw_metric*, CMET) with libfkvf too")
    a = ap.parse_args()
    tmpd = tempfile.mkdtemp(prefix="fkvf-pywrite-")
    try:
        d1 = a.keep or os.path.join(tmpd, "a")
        d2 = os.path.join(tmpd, "b")
        # the worked segment of spec §11.9 (its bytes copied from the spec):
        # the writer, whose files libfkvf accepts, produces exactly them
        spec_119 = bytes.fromhex(
            "0100000000000000010800000000000000000000000000000500000000000000"
            "000000004000000000000000000000000100000000000000493d2ecffbd7035f"
            "ac6b54682fe2b461000000000000000000000000000000000000000000000000"
            "0000000000000000000000000000000000000000000000000000000000000000"
            "03010401050000000000000000000000")
        check("spec §11.9 segment written byte for byte",
              W.sec_strm_quad(256, 1, 8, 0, 0, 0, [[3, 1, 4, 1, 5]], 64) == spec_119)
        exps = W.write_demo(d1)
        W.write_demo(d2)
        for e in exps:
            with open(os.path.join(d1, e.name), "rb") as f1, \
                    open(os.path.join(d2, e.name), "rb") as f2:
                check("%s: written twice, the same bytes" % e.name, f1.read() == f2.read())
        for e in exps:
            try:
                check_file(e, os.path.join(d1, e.name), a, tmpd)
            except (OSError, ValueError, KeyError, TypeError) as x:   # output not as expected
                check("%s: checks completed" % e.name, False, repr(x))
        try:
            negative_controls(exps, d1, a, tmpd)
        except (OSError, ValueError, KeyError, TypeError) as x:
            check("negative controls completed", False, repr(x))
    finally:
        shutil.rmtree(tmpd, ignore_errors=True)
    print("python writer: %d files, %d failures" % (len(exps), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
