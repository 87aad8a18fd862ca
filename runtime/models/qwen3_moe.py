"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B, Qwen3-235B-A22B): Qwen3 attention (q/k norms) with sparse MoE
MLPs (softmax router, top-k, optional renormalisation); `mlp_only_layers` / `decoder_sparse_step` layers dense."""
from __future__ import annotations

from torch import nn

from ..config import TargetConfig
from .family import FamilyModel
from .moe import SparseMoe, split_fused_experts
from .target import MLP, Attention, RMSNorm


class WindowAttention(Attention):
    """target.py's attention with the layer's sliding window (None: full)."""

    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__(cfg)
        self.window = cfg.window(layer)


class Qwen3MoeLayer(nn.Module):
    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__()
        self.self_attn = WindowAttention(cfg, layer)
        if layer in cfg.moe.dense_layers:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        else:
            self.mlp = SparseMoe(cfg, router_name="gate")
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv_cache, batch):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3MoeModel(FamilyModel):
    def __init__(self, cfg: TargetConfig, max_positions: int = 4096):
        super().__init__(cfg, max_positions, Qwen3MoeLayer)

    def convert_checkpoint(self, state):
        # checkpoints store experts one by one; transformers 5's in-memory fused layout is accepted too
        return split_fused_experts(state, transposed=False, interleaved=False)
