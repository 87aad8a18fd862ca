"""Gemma 4 text models (`gemma4_text`; the `gemma4` multimodal wrapper served text-only), dense and MoE, as
transformers 5.24 defines them.

What differs from Gemma 3: RMSNorms scale by w (not 1 + w), in fp32; attention has no softmax scale (q and k
are RMS-normed per head, v by a norm without weight); sliding and full layers have their own head_dim, kv heads
and RoPE (full layers: proportional RoPE, only the first `partial_rotary_factor` of the frequencies turn);
`attention_k_eq_v` full layers take their values from k_proj (before k_norm and RoPE); the last
`num_kv_shared_layers` layers compute no K/V and attend over the cache of the last earlier layer of their type
(they neither own nor write a cache: Gemma4Config.cached_layers); per-layer input embeddings (PLE) add a gated
residual after each layer's MLP; each layer's output is scaled by its `layer_scalar`; MoE layers
(`enable_moe_block`) add routed experts beside the dense MLP, each with its own norms.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import ops
from ..attention import paged_attention
from ..family_configs import Gemma4Config
from ..rope import RotaryTable, apply_rope
from .family import FamilyBackbone, rowwise
from .gemma3 import GemmaMLP, gelu_tanh
from .target import Linear, TargetModel


class Gemma4RMSNorm(nn.Module):
    """transformers' Gemma4RMSNorm: (x.float() normed) * w.float(), back to x's dtype; `fold` keeps w in fp32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def fold(self) -> None:
        self.weight.data = self.weight.data.float()

    def forward(self, x):
        return ops.rms_norm(x.float(), self.weight, self.eps).to(x.dtype)


class ScalelessRMSNorm(nn.Module):
    """Gemma4RMSNorm(with_scale=False): no weight in the checkpoint; a unit fp32 factor for the shared kernel."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.register_buffer("unit", torch.ones(dim), persistent=False)
        self.eps = eps

    def forward(self, x):
        return ops.rms_norm(x.float(), self.unit, self.eps).to(x.dtype)


class ProportionalRotary(RotaryTable):
    """transformers' proportional RoPE: head_dim // 2 frequencies, the first int(partial * head_dim // 2) of them
    theta ** (-2i / head_dim) and the rest 0 (those dims pass unrotated), all divided by `factor`. partial 1 is
    the default rule (factor 1) or linear scaling."""

    def __init__(self, theta: float, factor: float, partial: float, head_dim: int, max_positions: int):
        turned = int(partial * head_dim // 2)
        inv = 1.0 / (theta ** (torch.arange(0, 2 * turned, 2, dtype=torch.int64).float() / head_dim))
        self.inv_freq = torch.cat([inv, torch.zeros(head_dim // 2 - turned)]) / factor
        self.scale = 1.0
        self.device = torch.device("cpu")
        self.cos = self.sin = None
        self._grow(max_positions)


class Gemma4Attention(nn.Module):
    def __init__(self, cfg: Gemma4Config, layer: int):
        super().__init__()
        h, b = cfg.hidden_size, cfg.attention_bias
        self.head_dim, self.n_kv = cfg.layer_head_dims[layer], cfg.layer_kv_heads[layer]
        d, heads, eps = self.head_dim, cfg.num_attention_heads, cfg.rms_norm_eps
        self.window = cfg.window(layer)
        self.shared = cfg.kv_source[layer] != layer  # reads another layer's cache: no K/V weights of its own
        self.q_proj = Linear(h, heads * d, b)
        self.q_norm = Gemma4RMSNorm(d, eps)
        self.o_proj = Linear(heads * d, h, b, row_parallel=True)
        if not self.shared:
            self.k_proj = Linear(h, self.n_kv * d, b)
            self.v_proj = None if cfg.attention_k_eq_v and self.window is None else Linear(h, self.n_kv * d, b)
            self.k_norm = Gemma4RMSNorm(d, eps)
            self.v_norm = ScalelessRMSNorm(d, eps)

    def forward(self, x, cos, sin, kv_cache, batch):
        t, d = x.shape[0], self.head_dim
        q = apply_rope(self.q_norm(self.q_proj(x).view(t, -1, d)), cos, sin)
        if self.shared:  # the source layer wrote this step's rows already
            o = paged_attention(q, None, None, kv_cache[0], kv_cache[1], batch, 1.0, window=self.window,
                                write=False)
        else:
            k = self.k_proj(x).view(t, -1, d)
            v = k if self.v_proj is None else self.v_proj(x).view(t, -1, d)
            k, v = apply_rope(self.k_norm(k), cos, sin), self.v_norm(v)
            o = paged_attention(q, k, v, kv_cache[0], kv_cache[1], batch, 1.0, window=self.window)
        return self.o_proj(o.reshape(t, -1))


class Gemma4Router(nn.Module):
    """Scaleless RMSNorm, times `scale` and hidden ** -0.5, a linear to the experts; fp32 softmax, top-k
    renormalised to 1, times each chosen expert's `per_expert_scale`."""

    def __init__(self, cfg: Gemma4Config):
        super().__init__()
        h, e = cfg.hidden_size, cfg.moe.num_experts
        self.norm = ScalelessRMSNorm(h, cfg.rms_norm_eps)
        self.proj = Linear(h, e)
        self.scale = nn.Parameter(torch.ones(h), requires_grad=False)
        self.per_expert_scale = nn.Parameter(torch.ones(e), requires_grad=False)
        self.root = h ** -0.5
        self.top_k = cfg.moe.top_k

    def forward(self, x):
        probs = torch.softmax(self.proj(self.norm(x) * self.scale * self.root), dim=-1, dtype=torch.float32)
        top, idx = torch.topk(probs, self.top_k, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        return top * self.per_expert_scale[idx], idx


class Gemma4Layer(nn.Module):
    def __init__(self, cfg: Gemma4Config, layer: int):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.layer_type = cfg.layer_types[layer]
        self.self_attn = Gemma4Attention(cfg, layer)
        self.mlp = GemmaMLP(h, cfg.layer_intermediate[layer])
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            setattr(self, name, Gemma4RMSNorm(h, eps))
        self.layer_scalar = nn.Parameter(torch.ones(1), requires_grad=False)
        self.moe = cfg.moe is not None
        if self.moe:
            self.router = Gemma4Router(cfg)
            self.experts = nn.ModuleList(GemmaMLP(h, cfg.moe.intermediate_size) for _ in range(cfg.moe.num_experts))
            for name in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
                setattr(self, name, Gemma4RMSNorm(h, eps))
        self.ple = cfg.ple_dim > 0
        if self.ple:
            self.per_layer_input_gate = Linear(h, cfg.ple_dim)
            self.per_layer_projection = Linear(cfg.ple_dim, h)
            self.post_per_layer_input_norm = Gemma4RMSNorm(h, eps)

    def experts_out(self, x):
        """The routed experts on x (the layer's post-attention residual): each row sums its experts in ascending
        expert id, whatever the batch, as transformers does."""
        weights, idx = self.router(x)
        y = self.pre_feedforward_layernorm_2(x)
        out = torch.zeros_like(y)
        for e in torch.unique(idx).tolist():
            rows, slot = torch.where(idx == e)
            part = self.experts[e](y.index_select(0, rows)) * weights[rows, slot, None]
            out.index_add_(0, rows, part.to(out.dtype))
        return self.post_feedforward_layernorm_2(out)

    def forward(self, x, cos, sin, kv_cache, batch, per_layer_input=None):
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, batch))
        h = self.mlp(self.pre_feedforward_layernorm(x))
        if self.moe:
            h = self.post_feedforward_layernorm_1(h) + self.experts_out(x)
        x = x + self.post_feedforward_layernorm(h)
        if self.ple:
            g = rowwise(gelu_tanh, self.per_layer_input_gate(x)) * per_layer_input
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(g))
        return x * self.layer_scalar


class Gemma4Model(TargetModel):
    def __init__(self, cfg: Gemma4Config, max_positions: int = 4096):
        nn.Module.__init__(self)
        self.cfg = cfg
        self.model = FamilyBackbone(cfg, Gemma4Layer, Gemma4RMSNorm)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size)
        self.capture_ids: list[int] = []
        self.head_packed = None
        tables = {}
        for kind, rope in (("full_attention", cfg.rope), ("sliding_attention", cfg.rope_local)):
            layers = [i for i, t in enumerate(cfg.layer_types) if t == kind]
            if layers:
                tables[kind] = ProportionalRotary(rope.theta, rope.factor, cfg.rope_partial[kind],
                                                  cfg.layer_head_dims[layers[0]], max_positions)
        # the loader moves `rotary`; RotaryTable moves the sliding layers' table to the positions' device on use
        self.rotary, self.tables = tables["full_attention"], tables
        if cfg.ple_dim:
            n, p = cfg.num_hidden_layers, cfg.ple_dim
            self.model.embed_tokens_per_layer = nn.Embedding(cfg.ple_vocab, n * p)
            self.model.embed_tokens_per_layer.weight.requires_grad_(False)
            self.model.per_layer_model_projection = Linear(cfg.hidden_size, n * p)
            self.model.per_layer_projection_norm = Gemma4RMSNorm(p, cfg.rms_norm_eps)
        self.register_buffer("media_ids", torch.tensor(cfg.media_token_ids, dtype=torch.int64), persistent=False)
        # cached layer -> its index in the engine's cache list (Gemma4Config.cached_layers order)
        self._cache_index = {layer: k for k, layer in enumerate(cfg.cached_layers)}

    def _text_ids(self, ids):
        # Gemma4Model swaps media placeholders for the pad token before both embedding lookups, media or not
        if not self.cfg.media_token_ids:
            return ids
        return torch.where(torch.isin(ids, self.media_ids.to(ids.device)), self.cfg.pad_token_id, ids)

    def embed(self, ids):
        w = self.model.embed_tokens.weight
        # transformers rounds sqrt(hidden) to the weight dtype before multiplying
        return self.model.embed_tokens(self._text_ids(ids)) * torch.tensor(self.cfg.embed_scale, dtype=w.dtype)

    def per_layer_inputs(self, ids, x):
        """PLE: [T, layers, ple_dim] = (norm(proj(x) / sqrt(hidden)) + embed_per_layer(ids) sqrt(ple_dim)) / sqrt 2."""
        cfg, m = self.cfg, self.model
        t, n, p = x.shape[0], cfg.num_hidden_layers, cfg.ple_dim
        w = m.embed_tokens_per_layer.weight
        tok = m.embed_tokens_per_layer(self._text_ids(ids)) * torch.tensor(p ** 0.5, dtype=w.dtype)
        proj = m.per_layer_projection_norm((m.per_layer_model_projection(x) * cfg.hidden_size ** -0.5).view(t, n, p))
        return (proj + tok.view(t, n, p)) * 2.0 ** -0.5

    def logits(self, hidden):
        logits = super().logits(hidden)
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else rowwise(torch.tanh, logits / cap) * cap

    def layer_caches(self, caches: list) -> list:
        """Per layer, the cache it attends over (a shared-KV layer: its source layer's), from the cached layers'
        list; a per-layer list passes through."""
        if len(caches) == self.cfg.num_hidden_layers:
            return caches
        return [caches[self._cache_index[s]] for s in self.cfg.kv_source]

    def forward(self, ids, positions, kv_caches, batch, capture: bool = False):
        x = self.embed(ids)
        ple = self.per_layer_inputs(ids, x) if self.cfg.ple_dim else None
        rope = {kind: table(positions, x.dtype) for kind, table in self.tables.items()}
        kv_caches = self.layer_caches(kv_caches)
        captured = {}
        want = set(self.capture_ids) if capture else ()
        for i, layer in enumerate(self.model.layers):
            x = layer(x, *rope[layer.layer_type], kv_caches[i], batch, None if ple is None else ple[:, i])
            if i in want:
                captured[i] = x
        return self.finish(x, captured, capture)

    def convert_checkpoint(self, state):
        """Text weights under `model.` (the wrapper's under model.language_model.); fused experts split per expert;
        shared-KV layers' K/V weights (transformers ignores them too) dropped; a missing layer_scalar is 1, the
        value transformers initialises it to."""
        prefix, cfg = self.cfg.weight_prefix, self.cfg
        out = {}
        for name, t in state.items():
            if name.startswith(prefix):
                out["model." + name[len(prefix):]] = t
            elif name == "lm_head.weight":
                out[name] = t
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            if cfg.kv_source[i] != i:
                for w in ("k_proj", "v_proj", "k_norm", "v_norm"):
                    for k in [k for k in out if k.startswith(p + f"self_attn.{w}.")]:
                        del out[k]
            out.setdefault(p + "layer_scalar", torch.ones(1))
            if cfg.moe is None:
                continue
            gate_up, down = out.pop(p + "experts.gate_up_proj", None), out.pop(p + "experts.down_proj", None)
            if gate_up is None or down is None:
                continue  # load_weights names the missing per-expert weights
            inter = cfg.moe.intermediate_size
            for e in range(gate_up.shape[0]):
                q = p + f"experts.{e}."
                out[q + "gate_proj.weight"] = gate_up[e, :inter].contiguous()
                out[q + "up_proj.weight"] = gate_up[e, inter:].contiguous()
                out[q + "down_proj.weight"] = down[e].contiguous()
        return out

    def load_weights(self, state, dtype):
        super().load_weights(self.convert_checkpoint(dict(state)), dtype)
        for m in self.modules():
            if isinstance(m, Gemma4RMSNorm):
                m.fold()
