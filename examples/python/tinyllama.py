"""A llama2.c "legacy" checkpoint in PyTorch (CPU, float32) with an explicit KV cache.

The file layout and the forward pass are the ones ../shared/models/README.md describes
(shakespeare-hd64.bin and stories260K.bin both load): RMSNorm (eps 1e-5), RoPE on
interleaved pairs (2i, 2i+1) with theta 10000, grouped-query attention, SwiGLU, and a
classifier that shares the token embedding (a negative vocab_size in the header means a
separate classifier follows the two legacy RoPE tables).

The cache is in the Hugging Face layout: a list with one (k, v) pair per layer, each
[1, n_kv_heads, T, head_size]; the keys are stored after RoPE, as Hugging Face caches them.
Tokens are ids: 1 is BOS, byte b is id 3 + b.

    model = load("shakespeare-hd64.bin")
    logits, cache = model.forward(torch.tensor([1, 3 + ord("T")]))       # a prompt
    logits, cache = model.forward(torch.tensor([3 + ord("o")]), cache)   # one more token
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

Cache = List[Tuple[torch.Tensor, torch.Tensor]]
BOS = 1
BYTE0 = 3  # id of byte 0


@dataclass(frozen=True)
class Config:
    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    shared_classifier: bool

    @property
    def head_size(self) -> int:
        return self.dim // self.n_heads


def text_ids(data: bytes) -> List[int]:
    """Byte-level token ids of data (no BOS)."""
    return [BYTE0 + b for b in data]


def ids_text(ids: Sequence[int]) -> str:
    """The bytes of byte tokens as text (other ids are dropped)."""
    return bytes(i - BYTE0 for i in ids if BYTE0 <= i < BYTE0 + 256).decode("utf-8", "replace")


class TinyLlama:
    """The model; forward() runs a block of new tokens after a cache."""

    def __init__(self, cfg: Config, weights: dict) -> None:
        self.cfg = cfg
        self.w = weights
        hs = cfg.head_size
        # interleaved RoPE: the pair (2i, 2i+1) turns at f_i = 10000^(-2i / head_size)
        self.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))

    @staticmethod
    def _rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [n, heads, head_size] rotated pair by pair by the angle pos * f_i."""
        ang = pos.to(torch.float64)[:, None] * self.inv_freq[None, :]       # [n, hs/2]
        cos = torch.cos(ang).to(x.dtype)[:, None, :]
        sin = torch.sin(ang).to(x.dtype)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, cache: Optional[Cache] = None
                ) -> Tuple[torch.Tensor, Cache]:
        """Logits [n, vocab] of n new tokens ids (1-D) that follow the cache (None: position
        0), and the cache extended by them (a new list; the given one is not changed)."""
        cfg, w = self.cfg, self.w
        hs, nh, nkv = cfg.head_size, cfg.n_heads, cfg.n_kv_heads
        t0 = 0 if not cache else int(cache[0][0].shape[2])
        ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        n = int(ids.numel())
        pos = torch.arange(t0, t0 + n)
        # query i (at position t0 + i) sees positions 0 .. t0 + i
        mask = torch.arange(t0 + n)[None, :] > pos[:, None]                  # [n, t0 + n]
        x = w["emb"][ids]                                                      # [n, dim]
        out_cache: Cache = []
        for layer in range(cfg.n_layers):
            xb = self._rmsnorm(x, w["att_norm"][layer])
            q = self._rope((xb @ w["wq"][layer].T).view(n, nh, hs), pos)
            k = self._rope((xb @ w["wk"][layer].T).view(n, nkv, hs), pos)
            v = (xb @ w["wv"][layer].T).view(n, nkv, hs)
            k = k.transpose(0, 1).unsqueeze(0)                                 # [1, nkv, n, hs]
            v = v.transpose(0, 1).unsqueeze(0)
            if cache:
                k = torch.cat((cache[layer][0], k), dim=2)
                v = torch.cat((cache[layer][1], v), dim=2)
            out_cache.append((k, v))
            # query head h reads KV head h // (nh / nkv)
            kk = k[0].repeat_interleave(nh // nkv, dim=0)                      # [nh, T, hs]
            vv = v[0].repeat_interleave(nh // nkv, dim=0)
            scores = q.transpose(0, 1) @ kk.transpose(1, 2) / math.sqrt(hs)    # [nh, n, T]
            scores = scores.masked_fill(mask[None], float("-inf"))
            att = torch.softmax(scores, dim=-1) @ vv                           # [nh, n, hs]
            x = x + att.transpose(0, 1).reshape(n, cfg.dim) @ w["wo"][layer].T
            xb = self._rmsnorm(x, w["ffn_norm"][layer])
            h1 = xb @ w["w1"][layer].T
            x = x + (torch.nn.functional.silu(h1) * (xb @ w["w3"][layer].T)) @ w["w2"][layer].T
        x = self._rmsnorm(x, w["final_norm"])
        return x @ w["cls"].T, out_cache

    def greedy(self, ids: Sequence[int], steps: int, cache: Optional[Cache] = None
               ) -> Tuple[List[int], float, Cache]:
        """Feed ids after the cache, then pick the argmax steps times, feeding each pick.
        Returns the picks, their mean negative log-likelihood (nats) and the final cache
        (which holds every pick but the last)."""
        logits, cache = self.forward(torch.as_tensor(list(ids)), cache)
        last = logits[-1]
        picks: List[int] = []
        nll = 0.0
        for step in range(steps):
            tok = int(torch.argmax(last))
            nll -= float(torch.log_softmax(last.double(), dim=-1)[tok])
            picks.append(tok)
            if step + 1 < steps:
                logits, cache = self.forward(torch.tensor([tok]), cache)
                last = logits[-1]
        return picks, nll / max(1, steps), cache

    def score(self, feed: Sequence[int], targets: Sequence[int], cache: Optional[Cache] = None
              ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Teacher forcing: feed the tokens feed after the cache in one pass; returns the
        log-probability [n] that each position gives to its target (targets[i] is the token
        after feed[i]) and the logits [n, vocab]."""
        logits, _ = self.forward(torch.as_tensor(list(feed)), cache)
        tgt = torch.as_tensor(list(targets), dtype=torch.long)
        if tgt.shape != (logits.shape[0],):
            raise ValueError(f"{len(tgt)} targets for {logits.shape[0]} fed tokens")
        logp = torch.log_softmax(logits.double(), dim=-1)
        return logp.gather(1, tgt[:, None])[:, 0], logits


def load(path: str) -> TinyLlama:
    """Read a llama2.c legacy checkpoint (seven int32, then float32 arrays)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(28)
    if len(head) != 28:
        raise ValueError(f"{path}: {len(head)} bytes, shorter than the 28-byte header")
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("<7i", head)
    shared = vocab > 0
    vocab = abs(vocab)
    if min(dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len) <= 0 or dim % n_heads \
            or n_heads % n_kv:
        raise ValueError(f"{path}: header {dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len}"
                         " is not a llama2.c model")
    cfg = Config(dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len, shared)
    hs, kv_dim = cfg.head_size, n_kv * cfg.head_size
    shapes = [("emb", (vocab, dim)), ("att_norm", (n_layers, dim)),
              ("wq", (n_layers, dim, dim)), ("wk", (n_layers, kv_dim, dim)),
              ("wv", (n_layers, kv_dim, dim)), ("wo", (n_layers, dim, dim)),
              ("ffn_norm", (n_layers, dim)), ("w1", (n_layers, hidden, dim)),
              ("w2", (n_layers, dim, hidden)), ("w3", (n_layers, hidden, dim)),
              ("final_norm", (dim,)), ("rope_tables", (2, seq_len, hs // 2))]
    if not shared:
        shapes.append(("cls", (vocab, dim)))
    need = 28 + 4 * sum(int(np.prod(s)) for _, s in shapes)
    if size != need:
        raise ValueError(f"{path}: {size} bytes, the header {cfg} needs {need}")
    data = np.fromfile(path, dtype="<f4", offset=28)
    weights = {}
    off = 0
    for name, shape in shapes:
        count = int(np.prod(shape))
        weights[name] = torch.from_numpy(data[off:off + count].reshape(shape).copy())
        off += count
    del weights["rope_tables"]
    if shared:
        weights["cls"] = weights["emb"]
    return TinyLlama(cfg, weights)
