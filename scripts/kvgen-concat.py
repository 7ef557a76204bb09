#!/usr/bin/python3
"""Concatenate kvgen .kvc sequences (examples/engine/kvgen.c) into one cache
longer than the model's context: the real pre-RoPE keys (K_pre) and values
of the sequences one after another, the keys rotated at their position in
the long cache (interleaved pairs, theta from the header), written as
FKVF-named safetensors (layers.{i}.key/.value [H, T, D] f16, tokens I32).
Used for the long caches of docs/codebooks.md.
usage: kvgen-concat.py T OUT.safetensors IN.kvc..."""
import json, math, struct, sys
T = int(sys.argv[1]); out = sys.argv[2]; ins = sys.argv[3:]
L = G = D = None; theta = None
keys = None; vals = None; toks = []
for path in ins:
    b = open(path, 'rb').read()
    assert b[:8] == b'KVGENRAW'
    l, g, d, p = struct.unpack_from('<4I', b, 16)
    th = struct.unpack_from('<f', b, 40)[0]
    if L is None:
        L, G, D, theta = l, g, d, th
        keys = [[[] for _ in range(G)] for _ in range(L)]
        vals = [[[] for _ in range(G)] for _ in range(L)]
    off = 64
    tk = struct.unpack_from('<%dI' % (p + 1), b, off); off += 4 * (p + 1)
    off += 4 * p
    toks.extend(tk[:p])
    n = g * p * d
    for li in range(l):
        off += 4 * n  # K after RoPE: skipped, re-rotated below
        kp = struct.unpack_from('<%df' % n, b, off); off += 4 * n
        v = struct.unpack_from('<%df' % n, b, off); off += 4 * n
        for h in range(g):
            for t in range(p):
                keys[li][h].append(kp[(h * p + t) * d:(h * p + t + 1) * d])
                vals[li][h].append(v[(h * p + t) * d:(h * p + t + 1) * d])
    if len(toks) >= T:
        break
assert len(toks) >= T, 'not enough positions'
toks = toks[:T]
def rot(k, pos):
    k = list(k)
    for i in range(0, D, 2):
        a = pos / theta ** (i / D)
        c, s = math.cos(a), math.sin(a)
        x, y = k[i], k[i + 1]
        k[i], k[i + 1] = x * c - y * s, x * s + y * c
    return k
tensors = {}
data = bytearray()
def add(name, dtype, shape, raw):
    tensors[name] = {'dtype': dtype, 'shape': shape, 'data_offsets': [len(data), len(data) + len(raw)]}
    data.extend(raw)
for li in range(L):
    kb = bytearray(); vb = bytearray()
    for h in range(G):
        for t in range(T):
            kb += struct.pack('<%de' % D, *rot(keys[li][h][t], t))
            vb += struct.pack('<%de' % D, *vals[li][h][t])
    add('layers.%d.key' % li, 'F16', [G, T, D], bytes(kb))
    add('layers.%d.value' % li, 'F16', [G, T, D], bytes(vb))
add('tokens', 'I32', [T], struct.pack('<%di' % T, *toks))
hdr = json.dumps(tensors).encode()
hdr += b' ' * (-len(hdr) % 8)
with open(out, 'wb') as f:
    f.write(struct.pack('<Q', len(hdr))); f.write(hdr); f.write(data)
