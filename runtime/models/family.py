"""Shared scaffolding for target families beyond dense Llama/Qwen3: the TargetModel contract (packed rows, paged
KV cache, AttentionBatch, capture of the drafter's target layers) with family-specific decoder layers.

Subclasses of TargetModel, so logits / pack / load_weights / the engine's expectations stay those of target.py;
only the construction of the layers differs (a factory, so no dense layer is ever allocated and thrown away).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..config import TargetConfig
from ..rope import RotaryTable
from .target import Linear, RMSNorm, TargetModel

# at::parallel_for's grain for elementwise ops: below it a tensor is processed by one thread
_GRAIN = 32768
# ATen's vectorised loops step by TWO vectors and leave the rest to a scalar loop: 2 x 16 floats with AVX-512,
# 2 x 32 for bf16/fp16 (2 x 8 / 2 x 16 with AVX2). Rows padded to a multiple of 64 elements never reach a tail.
_LANES = 64


def rowwise(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn (a PyTorch elementwise op with a vectorised body and a scalar tail, e.g. sigmoid, tanh, gelu) applied
    so that every element of a row takes the same path whatever the number of rows: rows padded to whole
    vectors, and chunks of rows small enough to run on one thread (thread boundaries would move scalar tails).
    That keeps autoregressive and verify passes bitwise equal on CPU, as the invariant kernels do."""
    if x.device.type != "cpu" or x.dim() != 2:
        return fn(x)
    t, n = x.shape
    width = -(-n // _LANES) * _LANES
    xp = x if width == n else torch.nn.functional.pad(x, (0, width - n))
    step = max(1, _GRAIN // width)
    if t <= step:
        return fn(xp.contiguous())[:, :n]
    return torch.cat([fn(xp[i:i + step].contiguous()) for i in range(0, t, step)])[:, :n]


class FamilyBackbone(nn.Module):
    def __init__(self, cfg: TargetConfig, make_layer, norm):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(make_layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = norm(cfg.hidden_size, cfg.rms_norm_eps)


class FamilyModel(TargetModel):
    """make_layer(cfg, index) -> a module called as layer(x, cos, sin, kv_cache, batch), like DecoderLayer."""

    def __init__(self, cfg: TargetConfig, max_positions: int, make_layer, norm=RMSNorm):
        nn.Module.__init__(self)  # TargetModel.__init__ would build (and allocate) dense layers first
        self.cfg = cfg
        self.model = FamilyBackbone(cfg, make_layer, norm)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size)
        self.rotary = RotaryTable(cfg.rope, cfg.head_dim, max_positions)
        self.capture_ids: list[int] = []
        self.head_packed = None

    def convert_checkpoint(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Checkpoint names/layouts -> this module's parameter names (fused experts, packed formats)."""
        return state

    def load_weights(self, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        super().load_weights(self.convert_checkpoint(dict(state)), dtype)
