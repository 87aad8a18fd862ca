"""Gemma 3 (text): (1 + w) RMSNorms in fp32 (four per layer: around attention and around the MLP), embeddings
times sqrt(hidden), q/k norms, softmax scale query_pre_attn_scalar ** -0.5, sliding-window layers with their own
RoPE base (the global ones may carry linear scaling), gelu-tanh MLP, optional final logit soft-capping."""
from __future__ import annotations

import torch
from torch import nn

from .. import ops
from ..attention import paged_attention
from ..config import TargetConfig
from ..rope import RotaryTable, apply_rope
from .family import FamilyModel, rowwise
from .target import Attention, Linear, RMSNorm


class GemmaRMSNorm(RMSNorm):
    """x_normed * (1 + w), computed in fp32: `fold` turns the checkpoint's w into the fp32 factor once."""

    def fold(self) -> None:
        self.weight.data = 1.0 + self.weight.data.float()

    def forward(self, x):
        return ops.rms_norm(x.float(), self.weight, self.eps).to(x.dtype)


def gelu_tanh(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


class GemmaMLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = Linear(hidden, inter)
        self.up_proj = Linear(hidden, inter)
        self.down_proj = Linear(inter, hidden, row_parallel=True)

    def forward(self, x):
        return self.down_proj(rowwise(gelu_tanh, self.gate_proj(x)) * self.up_proj(x))


class GemmaAttention(Attention):
    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__(cfg)
        self.q_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.scale = cfg.attn_scale
        self.window = cfg.window(layer)

    def forward(self, x, cos, sin, kv_cache, batch):
        t = x.shape[0]
        q = apply_rope(self.q_norm(self.q_proj(x).view(t, -1, self.head_dim)), cos, sin)
        k = apply_rope(self.k_norm(self.k_proj(x).view(t, -1, self.head_dim)), cos, sin)
        v = self.v_proj(x).view(t, -1, self.head_dim)
        o = paged_attention(q, k, v, kv_cache[0], kv_cache[1], batch, self.scale, window=self.window)
        return self.o_proj(o.reshape(t, -1))


class Gemma3Layer(nn.Module):
    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.is_local = cfg.window(layer) is not None
        self.self_attn = GemmaAttention(cfg, layer)
        self.mlp = GemmaMLP(h, cfg.intermediate_size)
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, x, cos, sin, kv_cache, batch):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, batch))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma3Model(FamilyModel):
    def __init__(self, cfg: TargetConfig, max_positions: int = 4096):
        super().__init__(cfg, max_positions, Gemma3Layer, norm=GemmaRMSNorm)
        self.rotary_local = RotaryTable(cfg.rope_local or cfg.rope, cfg.head_dim, max_positions)

    def embed(self, ids):
        w = self.model.embed_tokens.weight
        # transformers rounds sqrt(hidden) to the weight dtype before multiplying
        return self.model.embed_tokens(ids) * torch.tensor(self.cfg.embed_scale, dtype=w.dtype)

    def logits(self, hidden):
        logits = super().logits(hidden)
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else rowwise(torch.tanh, logits / cap) * cap

    def load_weights(self, state, dtype):
        super().load_weights(state, dtype)
        for m in self.modules():
            if isinstance(m, GemmaRMSNorm):
                m.fold()

    def forward(self, ids, positions, kv_caches, batch, capture: bool = False):
        x = self.embed(ids)
        rope = {False: self.rotary(positions, x.dtype), True: self.rotary_local(positions, x.dtype)}
        captured = {}
        want = set(self.capture_ids) if capture else ()
        for i, layer in enumerate(self.model.layers):
            x = layer(x, *rope[layer.is_local], kv_caches[i], batch)
            if i in want:
                captured[i] = x
        return self.finish(x, captured, capture)
