"""DeepSeek-V3 architecture (DeepSeek-V3 / R1, Kimi K2, and Kimi K2.5 / K2.6 served text-only): multi-head latent attention (MLA) over a compressed
paged cache, and a MoE with shared experts and group-limited sigmoid routing; the first `first_k_dense_replace`
layers have a dense MLP.

MLA, as transformers computes it: q = q_b_proj(norm(q_a_proj(x))) (or q_proj(x)), split per head into a nope
part and a rope part; kv_a_proj_with_mqa(x) = [latent c (kv_lora_rank), shared key k_rot (qk_rope_head_dim)];
c is normed; kv_b_proj(c) gives each head's k_nope and v. Key = [k_nope, k_rot] (k_rot shared by all heads).

Here the cache holds, per position, only [c, rope(k_rot)]: one 'head' of kv_lora_rank + qk_rope_head_dim (the
compressed cache). kv_b_proj is absorbed into the query and the output:
    q_h . k_h = (W_UK_h^T q_nope_h) . c + q_rot_h . k_rot,     o_h = W_UV_h (sum_j p_j c_j)
so attention runs as MQA with query [W_UK_h^T q_nope_h, q_rot_h] against the cache row, the value being that same
row (its first kv_lora_rank entries are c). The per-head products go through the batch-invariant linear on CPU,
so a row's bits never depend on the batch and DFlash stays bitwise equal to autoregressive decoding.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import ops
from ..attention import paged_attention
from ..config import TargetConfig
from ..rope import apply_rope
from .family import FamilyModel, rowwise
from .moe import split_fused_experts
from .target import MLP, Linear, RMSNorm, TargetModel

LATENT_NORM_EPS = 1e-6  # transformers builds q_a_layernorm / kv_a_layernorm with the default eps


class _Weight(nn.Module):
    """A checkpoint weight used only through derived tensors (kv_b_proj): not a Linear, so never packed."""

    def __init__(self, out_f: int, in_f: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_f, in_f), requires_grad=False)


def head_linear(x: torch.Tensor, w: torch.Tensor, packed: list | None) -> torch.Tensor:
    """Per-head matmul: x [T, H, in], w [H, out, in] -> [T, H, out]. With packed panels (CPU kernels) each head
    runs the batch-invariant linear; otherwise one batched matmul."""
    if packed is not None and ops.invariant_enabled() and x.device.type == "cpu":
        return torch.stack([ops.linear(x[:, h].contiguous(), w[h], packed=packed[h]) for h in range(w.shape[0])], 1)
    return torch.einsum("thi,hoi->tho", x, w.to(x.dtype))


class MlaAttention(nn.Module):
    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__()
        a = cfg.mla
        h, heads, b = cfg.hidden_size, cfg.num_attention_heads, cfg.attention_bias
        self.heads, self.a = heads, a
        if a.q_lora_rank is None:
            self.q_proj = Linear(h, heads * a.qk_head_dim)
        else:
            self.q_a_proj = Linear(h, a.q_lora_rank, b)
            self.q_a_layernorm = RMSNorm(a.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = Linear(a.q_lora_rank, heads * a.qk_head_dim)
        self.kv_a_proj_with_mqa = Linear(h, a.kv_lora_rank + a.qk_rope_head_dim, b)
        self.kv_a_layernorm = RMSNorm(a.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = _Weight(heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank)
        self.o_proj = Linear(heads * a.v_head_dim, h, b, row_parallel=True)
        self.scale = cfg.attn_scale
        r = a.qk_rope_head_dim
        # interleaved rotary pairs (x0, x1), (x2, x3), ... -> rotate-half layout; q and k get the same permutation,
        # so their dot products (all attention sees) are those of transformers' interleaved formula, bit for bit
        self.register_buffer("rope_perm", torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2)])
                             if a.rope_interleave else None, persistent=False)
        self.register_buffer("w_uk", None, persistent=False)  # [H, kv_lora_rank, nope]: q_nope -> latent
        self.register_buffer("w_uv", None, persistent=False)  # [H, v_head_dim, kv_lora_rank]: latent -> v
        self.uk_packed = self.uv_packed = None

    def absorb(self) -> None:
        """Split kv_b_proj per head (after loading): W_UK_h^T for the query, W_UV_h for the output."""
        a = self.a
        w = self.kv_b_proj.weight.data.view(self.heads, a.qk_nope_head_dim + a.v_head_dim, a.kv_lora_rank)
        self.w_uk = w[:, :a.qk_nope_head_dim].transpose(1, 2).contiguous()
        self.w_uv = w[:, a.qk_nope_head_dim:].contiguous()
        self.kv_b_proj.weight.data = w.new_empty(0)  # only the per-head copies are used (Kimi K2: 1 GB in bf16)

    def pack(self) -> None:
        uk = [ops.pack(self.w_uk[h]) for h in range(self.heads)]
        uv = [ops.pack(self.w_uv[h]) for h in range(self.heads)]
        self.uk_packed = uk if all(p is not None for p in uk) else None
        self.uv_packed = uv if all(p is not None for p in uv) else None

    def forward(self, x, cos, sin, kv_cache, batch):
        a, t = self.a, x.shape[0]
        q = self.q_proj(x) if a.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_nope, q_rot = q.view(t, self.heads, a.qk_head_dim).split([a.qk_nope_head_dim, a.qk_rope_head_dim], -1)
        c, k_rot = self.kv_a_proj_with_mqa(x).split([a.kv_lora_rank, a.qk_rope_head_dim], -1)
        c = self.kv_a_layernorm(c.contiguous())
        k_rot = k_rot.reshape(t, 1, a.qk_rope_head_dim)
        if self.rope_perm is not None:
            q_rot, k_rot = q_rot.index_select(-1, self.rope_perm), k_rot.index_select(-1, self.rope_perm)
        q_rot, k_rot = apply_rope(q_rot, cos, sin), apply_rope(k_rot, cos, sin)
        q_lat = head_linear(q_nope, self.w_uk, self.uk_packed)  # [T, H, kv_lora_rank]
        query = torch.cat([q_lat, q_rot.to(q_lat.dtype)], -1)
        key = torch.cat([c.view(t, 1, a.kv_lora_rank), k_rot.to(c.dtype)], -1)  # the cache row, also the value
        o = paged_attention(query, key, key, kv_cache[0], kv_cache[0], batch, self.scale)
        o = head_linear(o[..., :a.kv_lora_rank], self.w_uv, self.uv_packed)  # [T, H, v_head_dim]
        return self.o_proj(o.reshape(t, -1))


class GroupLimitedRouter(Linear):
    """`mlp.gate`: fp32 logits (its weight is kept in fp32, as transformers does), sigmoid scores; experts are
    chosen by scores + e_score_correction_bias within the top `topk_group` groups (a group's score: its two best);
    the weights are the uncorrected scores, renormalised with norm_topk_prob, times routed_scaling_factor."""

    def __init__(self, cfg: TargetConfig):
        m = cfg.moe
        super().__init__(cfg.hidden_size, m.num_experts)
        self.e_score_correction_bias = nn.Parameter(torch.zeros(m.num_experts), requires_grad=False)
        self.m = m

    def forward(self, x):
        m = self.m
        scores = rowwise(torch.sigmoid, ops.linear(x.float(), self.weight, packed=self.packed))
        choice = scores + self.e_score_correction_bias
        t = choice.shape[0]
        group_scores = choice.view(t, m.n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=m.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        mask = group_mask.bool()[:, :, None].expand(-1, -1, m.num_experts // m.n_group).reshape(t, -1)
        idx = torch.topk(choice.masked_fill(~mask, float("-inf")), k=m.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, idx)
        if m.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * m.routed_scaling_factor, idx


class DeepseekMoe(nn.Module):
    """Routed experts (summed in ascending expert id, weights in fp32 as transformers does) + shared experts."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        m = cfg.moe
        self.gate = GroupLimitedRouter(cfg)
        self.experts = nn.ModuleList(MLP(cfg.hidden_size, m.intermediate_size) for _ in range(m.num_experts))
        self.shared_experts = MLP(cfg.hidden_size, m.shared_intermediate_size) if m.shared_intermediate_size else None

    def forward(self, x):
        weights, idx = self.gate(x)
        out = torch.zeros_like(x)
        for e in torch.unique(idx).tolist():
            rows, slot = torch.where(idx == e)
            y = self.experts[e](x.index_select(0, rows))
            out.index_add_(0, rows, (y * weights[rows, slot, None]).to(out.dtype))
        return out if self.shared_experts is None else out + self.shared_experts(x)


class DeepseekV3Layer(nn.Module):
    def __init__(self, cfg: TargetConfig, layer: int):
        super().__init__()
        self.self_attn = MlaAttention(cfg, layer)
        if layer in cfg.moe.dense_layers:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        else:
            self.mlp = DeepseekMoe(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv_cache, batch):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


class DeepseekV3Model(FamilyModel):
    def __init__(self, cfg: TargetConfig, max_positions: int = 4096):
        super().__init__(cfg, max_positions, DeepseekV3Layer)

    def convert_checkpoint(self, state):
        # checkpoints store experts one by one; transformers 5's in-memory fused layout is accepted too
        return split_fused_experts(state, transposed=False, interleaved=False)

    def load_weights(self, state, dtype):
        state = self.convert_checkpoint(dict(state))  # once: the router fix-up below reads converted names
        TargetModel.load_weights(self, state, dtype)
        for name, m in self.named_modules():
            if isinstance(m, GroupLimitedRouter):  # router weight and bias stay fp32 (bf16 values widen exactly)
                m.weight.data = state[name + ".weight"].float()
                m.e_score_correction_bias.data = state[name + ".e_score_correction_bias"].float()
            elif isinstance(m, MlaAttention):
                m.absorb()

    def pack(self) -> None:
        super().pack()
        for m in self.modules():
            if isinstance(m, MlaAttention):
                m.pack()


# Kimi K2.5 / K2.6 language-model weights, as the release names them (remote code), as transformers 5.24's
# save_pretrained writes them (its load-time rename blocks -> layers is undone on save, so layers come out as
# `blocks`), and as transformers holds them in memory. Anything else (vision_tower, mm_projector) is not loaded.
_KIMI_K25_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                      ("language_model.lm_head.", "lm_head."), ("lm_head.", "lm_head."))


class KimiK25Model(DeepseekV3Model):
    """Kimi_K25ForConditionalGeneration served text-only: its DeepSeek-V3 language model under the wrapper's
    prefix; the vision tower and projector are skipped."""

    def __init__(self, cfg: TargetConfig, max_positions: int = 4096):
        super().__init__(cfg, max_positions)
        self.register_buffer("media_ids", torch.tensor(cfg.media_token_ids, dtype=torch.int64), persistent=False)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        # Kimi_K25Model zeroes the image / video placeholder ids before its embedding lookup, media or not
        return super().embed(torch.where(torch.isin(ids, self.media_ids.to(ids.device)), 0, ids))

    def convert_checkpoint(self, state):
        out = {}
        for name, t in state.items():
            for old, new in _KIMI_K25_PREFIXES:
                if name.startswith(old):
                    key = new + name[len(old):]
                    if key.startswith("model.blocks."):
                        key = "model.layers." + key[len("model.blocks."):]
                    out[key] = t
                    break
        return super().convert_checkpoint(out)
