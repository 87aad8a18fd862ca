"""gpt-oss (20b / 120b): attention with biases and per-head sinks, sliding-window / full layers alternating,
YaRN RoPE, and a MoE whose router picks top-k logits (softmax over those k) and whose experts use a clamped
SwiGLU: (clamp(up, -L, L) + 1) * g * sigmoid(alpha * g) with g = clamp(gate, max=L).

Checkpoints hold fused expert tensors ([E, H, 2I] with gate/up interleaved by column, [E, I, H], biases), either
as bf16 or as the MXFP4 release (`*_blocks` / `*_scales`), dequantised on load.
"""
from __future__ import annotations

import re

import torch
from torch import nn

from ..attention import paged_attention
from ..config import TargetConfig
from ..errors import CheckpointError
from ..rope import apply_rope
from .family import FamilyModel, rowwise
from .moe import SparseMoe, split_fused_experts
from .target import Attention, Linear, RMSNorm


class SinkAttention(Attention):
    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__(cfg)
        self.window = cfg.window(layer)
        self.sinks = nn.Parameter(torch.zeros(cfg.num_attention_heads), requires_grad=False)

    def forward(self, x, cos, sin, kv_cache, batch):
        t = x.shape[0]
        q = apply_rope(self.q_proj(x).view(t, -1, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(t, -1, self.head_dim), cos, sin)
        v = self.v_proj(x).view(t, -1, self.head_dim)
        o = paged_attention(q, k, v, kv_cache[0], kv_cache[1], batch, self.scale, window=self.window,
                            sinks=self.sinks)
        return self.o_proj(o.reshape(t, -1))


class ClampedSwiGLU(nn.Module):
    def __init__(self, hidden: int, inter: int, alpha: float, limit: float):
        super().__init__()
        self.gate_proj = Linear(hidden, inter, bias=True)
        self.up_proj = Linear(hidden, inter, bias=True)
        self.down_proj = Linear(inter, hidden, bias=True, row_parallel=True)
        self.alpha, self.limit = alpha, limit

    def forward(self, x):
        gate = self.gate_proj(x).clamp(max=self.limit)
        up = self.up_proj(x).clamp(min=-self.limit, max=self.limit)
        glu = gate * rowwise(torch.sigmoid, gate * self.alpha)
        return self.down_proj((up + 1) * glu)


class GptOssLayer(nn.Module):
    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__()
        m = cfg.moe
        self.self_attn = SinkAttention(cfg, layer)
        self.mlp = SparseMoe(cfg, lambda: ClampedSwiGLU(cfg.hidden_size, m.intermediate_size, m.swiglu_alpha,
                                                        m.swiglu_limit), router_name="router")
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv_cache, batch):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


FP4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 as the gpt-oss release stores it: blocks [E, out, G, 16] uint8 (two e2m1 values a byte, low nibble
    first), scales [E, out, G] uint8 (a power of two, bias 127) per 32 values. Returns [E, in, out] float32,
    the fused (transposed) layout of the bf16 checkpoints."""
    if blocks.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise CheckpointError(f"unsupported MXFP4 expert tensors: blocks {list(blocks.shape)} {blocks.dtype}, "
                              f"scales {list(scales.shape)} (expected [E, out, G, 16] uint8 and [E, out, G])")
    lo, hi = FP4_VALUES[(blocks & 0x0F).long()], FP4_VALUES[(blocks >> 4).long()]
    vals = torch.stack([lo, hi], -1).flatten(-2)  # [E, out, G, 32]
    vals = torch.ldexp(vals, scales.to(torch.int32)[..., None] - 127)
    return vals.flatten(-2).transpose(1, 2).contiguous()


_SINKS = re.compile(r"^model\.layers\.(\d+)\.self_attn\.sinks$")


class GptOssModel(FamilyModel):
    def __init__(self, cfg: TargetConfig, max_positions: int = 4096):
        super().__init__(cfg, max_positions, GptOssLayer)

    def convert_checkpoint(self, state):
        for name in [n for n in state if n.endswith("_blocks")]:
            base = name[:-len("_blocks")]
            if base + "_scales" not in state:
                raise CheckpointError(f"gpt_oss MXFP4 tensor {name} has no {base}_scales")
            state[base] = dequantize_mxfp4(state.pop(name), state.pop(base + "_scales"))
        for i in range(self.cfg.num_hidden_layers):
            p = f"model.layers.{i}.mlp.experts."
            if p + "0.down_proj.weight" in state:
                continue  # experts already one by one
            for kind in ("gate_up_proj", "down_proj"):
                if p + kind not in state:
                    raise CheckpointError(f"gpt_oss checkpoint lacks {p}{kind} (layer {i}'s fused expert weights, "
                                          f"or their MXFP4 {kind}_blocks / {kind}_scales): a truncated checkpoint?")
        have = {int(m.group(1)) for m in map(_SINKS.match, state) if m}
        missing = [i for i in range(self.cfg.num_hidden_layers) if i not in have]
        if missing:
            raise CheckpointError(f"gpt_oss checkpoint has no attention sinks for layers {missing} "
                                  "(model.layers.N.self_attn.sinks): not a gpt-oss checkpoint, or a truncated one")
        return split_fused_experts(state, transposed=True, interleaved=True, bias=True)
