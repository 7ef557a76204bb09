#!/usr/bin/env python3
"""Independent checks of the PNG files `fkvf plot` writes (tests/cli_search.sh).

Reads a PNG with the standard library only: signature, every chunk's CRC,
IHDR (8-bit RGB, no interlace), IDAT inflated and unfiltered (all five
filter types), IEND last. Then answers one question about the pixels:

  png_check.py size FILE                  print "W H"
  png_check.py ink FILE X0 Y0 X1 Y1       some pixel of [X0,X1) x [Y0,Y1) is not white
  png_check.py diff A B AX0 AY0 AX1 AY1 X0 Y0 X1 Y1 R G B
                                          A and B (same size) differ inside the area
                                          [AX0,AX1) x [AY0,AY1), every pixel that differs
                                          there lies in [X0,X1) x [Y0,Y1), and some of
                                          them have colour (R, G, B); print how many
  png_check.py quadcell X0 Y0 P BITS SYM  print the pixel rectangle of the cell of the
                                          last symbol SYM of a quad stream (spec 12.1:
                                          its base-4 digits, least significant first,
                                          pick the corners (q & 1, q >> 1)) in a plot
                                          area of P x P pixels at (X0, Y0), y up
  png_check.py ngondisc X0 Y0 P N R SYM   the same for the disc of radius R around
                                          (1 - R) V(SYM), V(c) = (cos 2 pi c/N,
                                          sin 2 pi c/N) (spec 10.2, 12.2), in a plot
                                          of [-1.25, 1.25]^2
Exit 0 when the answer is yes (or printed), 1 when no, 2 for a malformed file.
"""
import math
import struct
import sys
import zlib


def fail(msg, code=2):
    print("png_check: " + msg, file=sys.stderr)
    sys.exit(code)


def read_png(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("%s: no PNG signature" % path)
    pos, chunks = 8, []
    while pos < len(data):
        if pos + 12 > len(data):
            fail("%s: truncated chunk at %d" % (path, pos))
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        typ = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if len(body) != n or pos + 12 + n > len(data):
            fail("%s: chunk %r runs past the end" % (path, typ))
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        if zlib.crc32(typ + body) & 0xFFFFFFFF != crc:
            fail("%s: bad CRC in chunk %r at %d" % (path, typ, pos))
        chunks.append((typ, body))
        pos += 12 + n
    if not chunks or chunks[0][0] != b"IHDR" or chunks[-1][0] != b"IEND":
        fail("%s: IHDR first and IEND last expected" % path)
    w, h, depth, ctype, comp, filt, inter = struct.unpack(">IIBBBBB", chunks[0][1])
    if (depth, ctype, comp, filt, inter) != (8, 2, 0, 0, 0) or w == 0 or h == 0:
        fail("%s: not an 8-bit RGB image without interlace" % path)
    raw = zlib.decompress(b"".join(b for t, b in chunks if t == b"IDAT"))
    stride = 3 * w
    if len(raw) != h * (stride + 1):
        fail("%s: %d bytes of image data, want %d" % (path, len(raw), h * (stride + 1)))
    rows, prev = [], bytearray(stride)
    for y in range(h):
        ft = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride if ft else 0):
            a = line[i - 3] if i >= 3 else 0
            b = prev[i]
            c = prev[i - 3] if i >= 3 else 0
            if ft == 1:
                line[i] = (line[i] + a) & 255
            elif ft == 2:
                line[i] = (line[i] + b) & 255
            elif ft == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pr) & 255
            elif ft != 0:
                fail("%s: row %d: filter type %d" % (path, y, ft))
        rows.append(bytes(line))
        prev = line
    return w, h, rows


def pixel(rows, x, y):
    return tuple(rows[y][3 * x:3 * x + 3])


def main(argv):
    if len(argv) < 2:
        fail(__doc__)
    cmd = argv[1]
    if cmd == "size":
        w, h, _ = read_png(argv[2])
        print(w, h)
        return 0
    if cmd == "ink":
        w, h, rows = read_png(argv[2])
        x0, y0, x1, y1 = (int(v) for v in argv[3:7])
        for y in range(max(0, y0), min(h, y1)):
            for x in range(max(0, x0), min(w, x1)):
                if pixel(rows, x, y) != (255, 255, 255):
                    return 0
        print("png_check: no ink in [%d,%d) x [%d,%d)" % (x0, x1, y0, y1), file=sys.stderr)
        return 1
    if cmd == "diff":
        wa, ha, ra = read_png(argv[2])
        wb, hb, rb = read_png(argv[3])
        ax0, ay0, ax1, ay1, x0, y0, x1, y1, r, g, b = (int(v) for v in argv[4:15])
        if (wa, ha) != (wb, hb):
            print("png_check: sizes differ", file=sys.stderr)
            return 1
        n = hits = 0
        for y in range(max(0, ay0), min(ha, ay1)):
            if ra[y] == rb[y]:
                continue
            for x in range(max(0, ax0), min(wa, ax1)):
                pa, pb = pixel(ra, x, y), pixel(rb, x, y)
                if pa == pb:
                    continue
                n += 1
                if not (x0 <= x < x1 and y0 <= y < y1):
                    print("png_check: pixel (%d, %d) differs outside [%d,%d) x [%d,%d)"
                          % (x, y, x0, x1, y0, y1), file=sys.stderr)
                    return 1
                hits += (r, g, b) in (pa, pb)
        print(n)
        if n == 0 or hits == 0:
            print("png_check: %d pixels differ, %d of colour (%d, %d, %d)" % (n, hits, r, g, b),
                  file=sys.stderr)
            return 1
        return 0
    if cmd == "quadcell":
        x0, y0, p, bits, sym = (int(v) for v in argv[2:7])
        d = bits // 2
        cx = cy = 0
        for i in range(d):  # digit i, fed i-th: ends up i levels above the finest
            q = (sym >> (2 * i)) & 3
            cx |= (q & 1) << i
            cy |= (q >> 1) << i
        side = p / (1 << d)
        print(int(x0 + cx * side), int(y0 + p - (cy + 1) * side),
              int(math.ceil(x0 + (cx + 1) * side)), int(math.ceil(y0 + p - cy * side)))
        return 0
    if cmd == "ngondisc":
        x0, y0, p = (int(v) for v in argv[2:5])
        n, rr, sym = int(argv[5]), float(argv[6]), int(argv[7])
        a = 2 * math.pi * sym / n
        cx, cy = (1 - rr) * math.cos(a), (1 - rr) * math.sin(a)
        sc = p / 2.5
        px, py, rad = x0 + (cx + 1.25) * sc, y0 + p - (cy + 1.25) * sc, rr * sc
        print(int(px - rad), int(py - rad), int(math.ceil(px + rad)), int(math.ceil(py + rad)))
        return 0
    fail("unknown command %r" % cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
