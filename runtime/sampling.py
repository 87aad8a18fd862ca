"""Sampling parameters and the per-row sampler.

Random numbers are counter-based (Philox-4x32-10 keyed by the request seed, counter = the absolute position
of the token being sampled). A token therefore depends only on (seed, position, distribution): the same
request gives the same tokens whatever else is in the batch, and DFlash's exact-match acceptance against the
target's own sample reproduces the autoregressive sampled output token for token.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from .errors import DFlashError


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0  # 0 or -1: off
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise DFlashError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise DFlashError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise DFlashError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise DFlashError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k}")
        if self.seed is None:
            self.seed = random.getrandbits(63)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
_MASK = 0xFFFFFFFF


def philox4x32(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Philox-4x32-10. counter: [N, 4], key: [N, 2], both int64 holding uint32 values. Returns [N, 4]."""
    c0, c1, c2, c3 = (counter[:, i].clone() for i in range(4))
    k0, k1 = key[:, 0].clone(), key[:, 1].clone()
    for _ in range(10):
        p0, p1 = c0 * _M0, c2 * _M1  # < 2^64: wraps in int64, the low 64 bits stay exact
        hi0, lo0 = (p0 >> 32) & _MASK, p0 & _MASK
        hi1, lo1 = (p1 >> 32) & _MASK, p1 & _MASK
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    return torch.stack([c0, c1, c2, c3], 1)


def uniforms(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One float64 uniform in [0, 1) per (seed, position)."""
    seeds, positions = seeds.to(torch.int64), positions.to(torch.int64)
    counter = torch.stack([positions & _MASK, (positions >> 32) & _MASK,
                           torch.zeros_like(positions), torch.zeros_like(positions)], 1)
    key = torch.stack([seeds & _MASK, (seeds >> 32) & _MASK], 1)
    r = philox4x32(counter, key)
    bits53 = ((r[:, 0] << 21) | (r[:, 1] >> 11))  # 32 + 21 bits
    return bits53.to(torch.float64) * (2.0 ** -53)


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The target distribution after temperature, top-k and top-p (float64, rows sum to 1)."""
    scores = logits.double() / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        sp, order = probs.sort(dim=-1, descending=True)
        keep = (sp.cumsum(-1) - sp) < top_p  # smallest prefix whose mass reaches top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sp * keep)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], positions: list[int]) -> torch.Tensor:
    """logits: [N, V]; one token per row; row i samples the token at absolute position positions[i]."""
    out = torch.argmax(logits, dim=-1)
    rand_rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rand_rows:
        return out
    seeds = torch.tensor([params[i].seed for i in rand_rows], dtype=torch.int64)
    u = uniforms(seeds, torch.tensor([positions[i] for i in rand_rows], dtype=torch.int64))
    for j, i in enumerate(rand_rows):
        p = params[i]
        probs = filtered_probs(logits[i:i + 1], p.temperature, p.top_k, p.top_p)[0]
        cdf = probs.cumsum(0)
        tok = int(torch.searchsorted(cdf, u[j] * cdf[-1], right=True))
        out[i] = min(tok, probs.shape[0] - 1)
    return out
