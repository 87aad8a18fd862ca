"""Sampling parameters and the per-row sampler.

Random numbers are counter-based (Philox-4x32-10 keyed by the request seed, counter = the absolute position
of the token being sampled). A token therefore depends only on (seed, position, distribution): the same
request gives the same tokens whatever else is in the batch, and DFlash's exact-match acceptance against the
target's own sample reproduces the autoregressive sampled output token for token.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .errors import DFlashError


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0  # 0 or -1: off
    top_p: float = 1.0
    seed: int | None = None  # None: the engine draws one (EngineConfig.seed makes the draws repeatable)
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# The sampling maths (Philox, uniforms, the filtered distribution) live once, in the plugins' PyTorch reference:
# the compiled ops are tested against it and the runtime's PyTorch path uses it.
from .plugins.reference import filtered_probs, philox4x32, uniforms  # noqa: E402,F401


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
