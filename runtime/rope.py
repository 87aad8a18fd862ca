"""Rotary position embeddings (rotate-half) with default, linear, llama3 and YaRN frequency rules."""
from __future__ import annotations

import math

import torch

from .config import RopeConfig


def inv_freq_and_scale(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    base = rope.theta
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.rope_type == "default":
        return inv, 1.0
    if rope.rope_type == "linear":
        return inv / rope.factor, 1.0
    if rope.rope_type == "llama3":
        old = rope.original_max_position_embeddings
        low_wl, high_wl = old / rope.low_freq_factor, old / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        out = torch.where(wavelen > low_wl, inv / rope.factor, inv)
        smooth = (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * out / rope.factor + smooth * out
        medium = (wavelen >= high_wl) & (wavelen <= low_wl)
        return torch.where(medium, smoothed, out), 1.0
    if rope.rope_type in ("yarn", "deepseek_yarn"):
        factor = rope.factor
        old = rope.original_max_position_embeddings

        def get_mscale(scale, mscale=1.0):
            return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

        if rope.attention_factor is not None:
            attn = float(rope.attention_factor)
        elif rope.rope_type == "deepseek_yarn":
            # vLLM's name for DeepSeek's YaRN (Kimi K2.6's drafter): the same frequencies, cos/sin scaled by
            # mscale(factor, mscale) / mscale(factor, mscale_all_dim) with defaults 1 and 0
            attn = get_mscale(factor, 1.0 if rope.mscale is None else rope.mscale) / get_mscale(
                factor, rope.mscale_all_dim or 0.0)
        elif rope.mscale and rope.mscale_all_dim:
            attn = get_mscale(factor, rope.mscale) / get_mscale(factor, rope.mscale_all_dim)
        else:
            attn = get_mscale(factor)

        def corr_dim(n_rot):
            return (head_dim * math.log(old / (n_rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = corr_dim(rope.beta_fast), corr_dim(rope.beta_slow)
        if rope.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        extrap_factor = 1 - ramp
        pos_freqs = base ** (torch.arange(0, head_dim, 2).float() / head_dim)
        interp, extrap = 1.0 / (factor * pos_freqs), 1.0 / pos_freqs
        return interp * (1 - extrap_factor) + extrap * extrap_factor, attn
    raise ValueError(rope.rope_type)


class RotaryTable:
    """cos/sin rows per absolute position, computed once: a row never depends on which batch asks for it."""

    def __init__(self, rope: RopeConfig, head_dim: int, max_positions: int = 4096, device="cpu"):
        self.inv_freq, self.scale = inv_freq_and_scale(rope, head_dim)
        self.device = torch.device(device)
        self.cos = self.sin = None
        self._cast: dict = {}  # dtype -> (cos, sin) rounded to it once: a row's rounding is the same either way
        self._grow(max_positions)

    def _grow(self, n: int) -> None:
        pos = torch.arange(n, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = (emb.cos() * self.scale).to(self.device)
        self.sin = (emb.sin() * self.scale).to(self.device)
        self._cast = {}

    def to(self, device) -> "RotaryTable":
        self.device = torch.device(device)
        self.cos, self.sin = self.cos.to(self.device), self.sin.to(self.device)
        self._cast = {}
        return self

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype):
        if positions.device != self.device:  # tables a loader did not move (e.g. a family's second table)
            self.to(positions.device)
        # engines size the table for max_seq_len up front; the growth check reads positions back to the host,
        # which a CUDA graph being captured forbids
        capturing = positions.is_cuda and torch.cuda.is_current_stream_capturing()
        need = int(positions.max()) + 1 if positions.numel() and not capturing else 0
        if need > self.cos.shape[0]:
            self._grow(max(need, 2 * self.cos.shape[0]))
        tables = self._cast.get(dtype)
        if tables is None:
            tables = self._cast[dtype] = (self.cos.to(dtype), self.sin.to(dtype))
        return tables[0][positions], tables[1][positions]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; cos/sin: [T, head_dim]."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]
