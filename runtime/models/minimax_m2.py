"""MiniMax-M2 / M2.5 / M2.7 (`minimax_m2`): every layer a sparse MoE with a sigmoid router whose expert choice adds
a correction bias; attention with q/k RMSNorms over the WHOLE projection (all heads together, not per head) and
partial RoPE (the first rotary_dim dims of each head rotate, the rest pass through), as transformers defines it.

Checkpoints spell the MoE block `block_sparse_moe` with Mixtral's expert names (w1 gate, w3 up, w2 down);
transformers 5 holds it as `mlp` with fused gate_up_proj / down_proj. Both load.
"""
from __future__ import annotations

import re

import torch

from ..attention import paged_attention
from ..config import TargetConfig
from ..rope import RotaryTable, apply_rope
from .family import FamilyModel
from .moe import SparseMoe, split_fused_experts
from .target import Attention, RMSNorm


def partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int) -> torch.Tensor:
    if rot == x.shape[-1]:
        return apply_rope(x, cos, sin)
    return torch.cat([apply_rope(x[..., :rot], cos, sin), x[..., rot:]], -1)


class MiniMaxM2Attention(Attention):
    def __init__(self, cfg: TargetConfig):
        super().__init__(cfg)
        # one norm over all heads' dims: its mean square couples the heads, so it runs before the head split
        self.q_norm = RMSNorm(self.n_heads * self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.n_kv * self.head_dim, cfg.rms_norm_eps)
        self.rot = cfg.rotary_dim or self.head_dim

    def forward(self, x, cos, sin, kv_cache, batch):
        t = x.shape[0]
        q = self.q_norm(self.q_proj(x)).view(t, -1, self.head_dim)
        k = self.k_norm(self.k_proj(x)).view(t, -1, self.head_dim)
        v = self.v_proj(x).view(t, -1, self.head_dim)
        q, k = partial_rope(q, cos, sin, self.rot), partial_rope(k, cos, sin, self.rot)
        o = paged_attention(q, k, v, kv_cache[0], kv_cache[1], batch, self.scale)
        return self.o_proj(o.reshape(t, -1))


class MiniMaxM2Layer(torch.nn.Module):
    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__()
        self.self_attn = MiniMaxM2Attention(cfg)
        self.mlp = SparseMoe(cfg, router_name="gate")
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv_cache, batch):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


_MIXTRAL_EXPERT = re.compile(r"^(.*\.mlp\.experts\.\d+)\.(w1|w2|w3)\.(weight)$")
_MIXTRAL_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


class MiniMaxM2Model(FamilyModel):
    def __init__(self, cfg: TargetConfig, max_positions: int = 4096):
        super().__init__(cfg, max_positions, MiniMaxM2Layer)
        self.rotary = RotaryTable(cfg.rope, cfg.rotary_dim or cfg.head_dim, max_positions)

    def convert_checkpoint(self, state):
        out = {}
        for name, t in state.items():
            name = name.replace(".block_sparse_moe.", ".mlp.")
            m = _MIXTRAL_EXPERT.match(name)
            if m is not None:
                name = f"{m.group(1)}.{_MIXTRAL_NAMES[m.group(2)]}.{m.group(3)}"
            out[name] = t
        return split_fused_experts(out, transposed=False, interleaved=False)
