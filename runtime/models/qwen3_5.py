"""Hybrid linear-attention targets: Qwen3.5 / Qwen3.6 (`qwen3_5`, dense), their MoE releases (`qwen3_5_moe`) and
Qwen3-Next / Qwen3-Coder-Next (`qwen3_next`), as transformers 5 defines them.

`layer_types` interleaves Gated DeltaNet layers (gated_deltanet.py; a per-sequence state, no KV cache) with
full-attention layers that keep the project's paged KV cache: Qwen3 attention with zero-centred q/k norms, a
per-head sigmoid output gate produced by q_proj, and RoPE on the first `partial_rotary_factor` of each head.
Every RMSNorm outside the linear-attention output is zero-centred (weight 1 + w). MoE layers add a shared
expert scaled by sigmoid(shared_expert_gate(x)) to the routed experts. MTP heads in the checkpoint are ignored.

The forward takes the usual packed batch (AttentionBatch) plus a LinearBatch naming each segment's state slot;
see docs/hybrid.md for how an engine drives it (HybridRunner below is the executable version of that contract).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from torch import nn

from .. import ops
from ..attention import AttentionBatch, paged_attention
from ..config import MoeConfig, RopeConfig
from ..errors import CheckpointError
from ..rope import RotaryTable, apply_rope
from .gated_deltanet import DeltaNetDims, GatedDeltaNet, LinearBatch, LinearStatePool, _rows
from .moe import SparseMoe, split_fused_experts
from .target import MLP, Linear, TargetModel

FAMILIES = {"qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5", "qwen3_5_moe": "qwen3_5_moe",
            "qwen3_5_moe_text": "qwen3_5_moe", "qwen3_next": "qwen3_next"}
HYBRID_LAYER_TYPES = ("linear_attention", "full_attention")
# checkpoint entries that are not part of the text decoder: multi-token-prediction heads, the vision tower
_IGNORED = ("mtp.", "model.mtp.", "model.visual.", "visual.")


@dataclass
class HybridConfig:
    model_type: str  # as in config.json (the multimodal wrapper's when there is one)
    family: str  # qwen3_5 | qwen3_5_moe | qwen3_next
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rotary_dim: int  # int(head_dim * partial_rotary_factor): RoPE on these leading dims, the rest pass through
    rope: RopeConfig
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    layer_types: list[str]
    deltanet: DeltaNetDims
    moe: MoeConfig | None = None
    shared_expert_intermediate_size: int = 0
    weight_prefix: str = "model."  # "model.language_model." for the multimodal checkpoints
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str = "bfloat16"

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "full_attention"]

    @property
    def linear_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == "linear_attention"]

    def cache_layers(self) -> list[tuple[int, int, int]]:
        """(kv_heads, k_dim, v_dim) of the paged cache for each FULL-attention layer, in layer order."""
        return [(self.num_key_value_heads, self.head_dim, self.head_dim)] * len(self.attention_layers)

    def kv_bytes_per_token(self, dtype: torch.dtype = torch.bfloat16) -> int:
        size = torch.empty((), dtype=dtype).element_size()
        return sum(k * (a + b) * size for k, a, b in self.cache_layers())

    def state_bytes_per_request(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """The linear layers' conv + recurrent state of one request: fixed, whatever its length."""
        return len(self.linear_layers) * self.deltanet.state_bytes(dtype)

    @classmethod
    def from_dir(cls, path: str) -> "HybridConfig":
        from transformers import AutoConfig

        try:
            hf = AutoConfig.from_pretrained(path)
        except Exception as e:  # transformers' validators: one line
            first = str(e).strip().splitlines()
            raise CheckpointError(f"{path}/config.json is invalid: {first[-1].strip() if first else e}") from None
        return cls.from_hf(hf)

    @classmethod
    def from_hf(cls, hf) -> "HybridConfig":
        outer = hf.model_type
        text = getattr(hf, "text_config", None)
        t, prefix = (text, "model.language_model.") if text is not None else (hf, "model.")
        family = FAMILIES.get(t.model_type) or FAMILIES.get(outer)
        if family is None:
            raise CheckpointError(f"unsupported hybrid model_type {outer!r}; supported: {', '.join(FAMILIES)}")
        if t.hidden_act != "silu":
            raise CheckpointError(f"unsupported {outer} hidden_act {t.hidden_act!r}: only silu")
        n = t.num_hidden_layers
        types = list(t.layer_types)
        if len(types) != n or any(x not in HYBRID_LAYER_TYPES for x in types):
            raise CheckpointError(f"{outer}: layer_types must list {n} entries among "
                                  f"{', '.join(HYBRID_LAYER_TYPES)}, got {types}")
        heads, kv = t.num_attention_heads, t.num_key_value_heads
        head_dim = getattr(t, "head_dim", None) or t.hidden_size // heads
        rp = dict(t.rope_parameters or {})
        rotary = int(head_dim * float(rp.get("partial_rotary_factor", 1.0)))
        if heads % kv or rotary % 2 or not 0 < rotary <= head_dim:
            raise CheckpointError(f"unsupported {outer} attention layout: {heads} heads, {kv} kv heads, rotary "
                                  f"dim {rotary} of head_dim {head_dim}")
        d = DeltaNetDims(hidden_size=t.hidden_size, num_k_heads=t.linear_num_key_heads,
                         num_v_heads=t.linear_num_value_heads, head_k_dim=t.linear_key_head_dim,
                         head_v_dim=t.linear_value_head_dim, conv_kernel=t.linear_conv_kernel_dim,
                         eps=t.rms_norm_eps, fused_qkvz=family == "qwen3_next")
        if d.num_v_heads % d.num_k_heads or d.conv_kernel < 2:
            raise CheckpointError(f"unsupported {outer} linear-attention layout: {d.num_v_heads} value heads "
                                  f"over {d.num_k_heads} key heads, conv kernel {d.conv_kernel}")
        moe, shared = None, 0
        if family != "qwen3_5":
            ne, k, inter = t.num_experts, t.num_experts_per_tok, t.moe_intermediate_size
            if family == "qwen3_next":
                only, step = set(t.mlp_only_layers or []), t.decoder_sparse_step
                dense = [i for i in range(n) if i in only or ne == 0 or (i + 1) % step]
                norm = bool(t.norm_topk_prob)
            else:  # Qwen3.5-MoE: every layer sparse, weights always renormalised
                dense, norm = [], True
            if len(dense) < n and not (ne and k and inter and 1 <= k <= ne):
                raise CheckpointError(f"unsupported {outer} MoE layout: {ne} experts, {k} per token, expert "
                                      f"intermediate size {inter}")
            moe = MoeConfig(num_experts=ne, top_k=k, intermediate_size=inter, router="softmax_topk",
                            norm_topk_prob=norm, dense_layers=dense)
            shared = int(t.shared_expert_intermediate_size or 0)
        eos = t.eos_token_id if t.eos_token_id is not None else getattr(hf, "eos_token_id", None)
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        dtype = getattr(t, "dtype", None) or getattr(hf, "dtype", None) or "bfloat16"
        return cls(model_type=outer, family=family, vocab_size=t.vocab_size, hidden_size=t.hidden_size,
                   intermediate_size=getattr(t, "intermediate_size", 0) or 0, num_hidden_layers=n,
                   num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, rotary_dim=rotary,
                   rope=RopeConfig.from_hf(rp, max_pos=t.max_position_embeddings), rms_norm_eps=t.rms_norm_eps,
                   max_position_embeddings=t.max_position_embeddings,
                   tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
                   attention_bias=bool(getattr(t, "attention_bias", False)), layer_types=types, deltanet=d,
                   moe=moe, shared_expert_intermediate_size=shared, weight_prefix=prefix,
                   bos_token_id=getattr(t, "bos_token_id", None), eos_token_ids=eos,
                   torch_dtype=str(dtype).replace("torch.", ""))


class ZeroCentredRMSNorm(nn.Module):
    """transformers' Qwen3_5RMSNorm / Qwen3NextRMSNorm: (normed x.float() * (1 + w.float())).to(x.dtype)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x):
        return ops.rms_norm(x.float(), 1.0 + self.weight.float(), self.eps).to(x.dtype)


class GatedAttention(nn.Module):
    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h, b, d = cfg.hidden_size, cfg.attention_bias, cfg.head_dim
        self.q_proj = Linear(h, self.n_heads * d * 2, b)  # per head: [query | gate]
        self.k_proj = Linear(h, self.n_kv * d, b)
        self.v_proj = Linear(h, self.n_kv * d, b)
        self.o_proj = Linear(self.n_heads * d, h, b, row_parallel=True)
        self.q_norm = ZeroCentredRMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = ZeroCentredRMSNorm(d, cfg.rms_norm_eps)
        self.rotary_dim = cfg.rotary_dim
        self.scale = d ** -0.5

    def _rope(self, x, cos, sin):
        r = self.rotary_dim
        if r == x.shape[-1]:
            return apply_rope(x, cos, sin)
        return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], -1)

    def forward(self, x, cos, sin, kv_cache, batch: AttentionBatch):
        t, d = x.shape[0], self.head_dim
        qg = self.q_proj(x).view(t, self.n_heads, 2 * d)
        q, gate = qg[..., :d].contiguous(), qg[..., d:].reshape(t, -1)
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x).view(t, self.n_kv, d))
        v = self.v_proj(x).view(t, self.n_kv, d)
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        o = paged_attention(q, k, v, kv_cache[0], kv_cache[1], batch, self.scale)
        return self.o_proj(o.reshape(t, -1) * _rows(torch.sigmoid, gate))


class SharedExpertMoe(SparseMoe):
    """Routed experts (softmax top-k) plus a shared expert weighted by sigmoid(shared_expert_gate(x))."""

    def __init__(self, cfg: HybridConfig):
        super().__init__(SimpleNamespace(hidden_size=cfg.hidden_size, moe=cfg.moe), router_name="gate")
        self.shared_expert = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = Linear(cfg.hidden_size, 1)

    def forward(self, x):
        shared = _rows(torch.sigmoid, self.shared_expert_gate(x)) * self.shared_expert(x)
        return super().forward(x) + shared


class HybridLayer(nn.Module):
    def __init__(self, cfg: HybridConfig, layer: int):
        super().__init__()
        self.linear = cfg.layer_types[layer] == "linear_attention"
        if self.linear:
            self.linear_attn = GatedDeltaNet(cfg.deltanet)
        else:
            self.self_attn = GatedAttention(cfg)
        if cfg.moe is not None and layer not in cfg.moe.dense_layers:
            self.mlp = SharedExpertMoe(cfg)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = ZeroCentredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = ZeroCentredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, kv_cache, batch, lb, pool, ordinal):
        h = self.input_layernorm(x)
        h = self.linear_attn(h, lb, pool, ordinal) if self.linear else self.self_attn(h, cos, sin, kv_cache, batch)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class HybridBackbone(nn.Module):
    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(HybridLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = ZeroCentredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class HybridModel(TargetModel):
    """TargetModel's contract (embed / logits / pack / capture_ids / finish) with hybrid layers. forward also
    needs the linear-attention state pool and this step's LinearBatch; kv_caches is indexed by layer (entries of
    linear layers are ignored)."""

    def __init__(self, cfg: HybridConfig, max_positions: int = 4096):
        nn.Module.__init__(self)  # TargetModel.__init__ would build dense layers from a TargetConfig
        self.cfg = cfg
        self.model = HybridBackbone(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size)
        self.rotary = RotaryTable(cfg.rope, cfg.rotary_dim, max_positions)
        self.capture_ids: list[int] = []
        self.head_packed = None
        self.ordinal = {layer: i for i, layer in enumerate(cfg.linear_layers)}

    def new_state_pool(self, slots: int, device="cpu") -> LinearStatePool:
        dtype = self.model.embed_tokens.weight.dtype
        return LinearStatePool(self.cfg.deltanet, len(self.ordinal), slots, dtype, device)

    def state_bytes_per_request(self) -> int:
        return self.cfg.state_bytes_per_request(self.model.embed_tokens.weight.dtype)

    def layer_caches(self, caches: list) -> list:
        """The engine allocates KV for the full-attention layers only: None at the linear ones."""
        it = iter(caches)
        return [None if t == "linear_attention" else next(it) for t in self.cfg.layer_types]

    def forward(self, ids, positions, kv_caches, batch: AttentionBatch, capture: bool = False, *,
                states: LinearStatePool, linear: LinearBatch):
        x = self.embed(ids)
        cos, sin = self.rotary(positions, x.dtype)
        captured = {}
        want = set(self.capture_ids) if capture else ()
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, None if layer.linear else kv_caches[i], batch, linear, states,
                      self.ordinal.get(i))
            if i in want:
                captured[i] = x
        return self.finish(x, captured, capture)

    def commit(self, pool: LinearStatePool, lb: LinearBatch, segment: int, rows: int) -> None:
        """After verification: the first `rows` rows of verify segment `segment` of step `lb` are accepted; its
        slot's state becomes the state after row rows - 1 in every linear layer."""
        if lb.rollback == "states" or rows == 0:
            return pool.commit(lb, segment, rows)
        if lb.rollback != "inputs":
            raise ValueError(f"rollback {lb.rollback!r}: the caller replays the accepted rows itself")
        slot = lb.slots[segment]
        for layer, ordinal in self.ordinal.items():
            mixed, b, a = lb.pending[ordinal][segment]
            conv, rec = self.model.layers[layer].linear_attn.replay(
                mixed[:rows], b[:rows], a[:rows], pool.conv[ordinal, slot], pool.rec[ordinal, slot])
            pool.conv[ordinal, slot], pool.rec[ordinal, slot] = conv, rec

    def convert_checkpoint(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        prefix = self.cfg.weight_prefix
        out = {}
        for name, t in state.items():
            if name.startswith(_IGNORED):
                continue
            if prefix != "model." and name.startswith(prefix):
                name = "model." + name[len(prefix):]
            out[name] = t
        if self.cfg.moe is not None:
            out = split_fused_experts(out, transposed=False, interleaved=False)
        return out

    def load_weights(self, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        super().load_weights(self.convert_checkpoint(dict(state)), dtype)


def load_hybrid(path: str, dtype: torch.dtype = torch.float32, device="cpu",
                max_positions: int = 4096) -> HybridModel:
    """A hybrid checkpoint directory -> HybridModel (text decoder only)."""
    from ..checkpoint import load_state_dict

    cfg = HybridConfig.from_dir(path)
    model = HybridModel(cfg, max_positions)
    model.load_weights(load_state_dict(path, "target"), dtype)
    return model.to(device).eval()


class HybridRunner:
    """Drives a HybridModel as an engine would: a paged KV cache for the full-attention layers (pages of slot
    s are a fixed contiguous run here), one state-pool slot per request, committed lengths on the host. It is
    the reference for the engine integration and what the tests and the benchmark run."""

    def __init__(self, model: HybridModel, max_seqs: int = 8, max_len: int = 512, block_size: int = 16):
        cfg, dev = model.cfg, model.model.embed_tokens.weight.device
        dtype = model.model.embed_tokens.weight.dtype
        self.model, self.block_size, self.device = model, block_size, dev
        self.pages = -(-max_len // block_size)
        n = max_seqs * self.pages
        self.kv = [None if t == "linear_attention" else
                   (torch.zeros(n, block_size, cfg.num_key_value_heads, cfg.head_dim, dtype=dtype, device=dev),
                    torch.zeros(n, block_size, cfg.num_key_value_heads, cfg.head_dim, dtype=dtype, device=dev))
                   for t in cfg.layer_types]
        self.pool = model.new_state_pool(max_seqs, dev)
        self.length = [0] * max_seqs
        self.last: LinearBatch | None = None

    def reset(self, slot: int) -> None:
        self.length[slot] = 0
        self.pool.clear(slot)

    def step(self, segments, capture: bool = False, chunked_min: int | None = None, rollback: str = "states"):
        """segments: (slot, tokens, verify) per request. Non-verify segments are committed at once; a verify
        segment waits for accept() (rollback "states" / "inputs", see LinearBatch) or replay() ("none").
        Returns per segment its fp32 logits [L, V] and captured features (or None)."""
        rows, ids, pos = [], [], []
        for slot, toks, _ in segments:
            start = self.length[slot]
            table = list(range(slot * self.pages, (slot + 1) * self.pages))
            rows.append((len(toks), start + len(toks), table))
            ids += list(toks)
            pos += range(start, start + len(toks))
        batch = AttentionBatch.build(rows, self.block_size, self.device)
        lb = LinearBatch.from_attention(batch, [s for s, _, _ in segments], [v for _, _, v in segments],
                                        chunked_min)
        lb.rollback = rollback
        with torch.no_grad():
            h, feats = self.model(torch.tensor(ids, device=self.device), torch.tensor(pos, device=self.device),
                                  self.kv, batch, capture, states=self.pool, linear=lb)
            logits = self.model.logits(h)
        self.last = lb
        out, at = [], 0
        for slot, toks, verify in segments:
            n = len(toks)
            out.append((logits[at:at + n], None if feats is None else feats[at:at + n]))
            at += n
            if not verify:
                self.length[slot] += n
        return out

    def accept(self, segment: int, rows: int) -> None:
        """After verifying, keep the first `rows` rows of segment `segment` of the last step (KV beyond them is
        dead and overwritten later; the linear state becomes the one after row rows - 1)."""
        self.model.commit(self.pool, self.last, segment, rows)
        self.length[self.last.slots[segment]] += rows

    def replay(self, slot: int, tokens) -> None:
        """Snapshot-and-replay commit of a verify step run with rollback "none": the slot still holds the
        pre-verify state, so running the accepted tokens again as a plain segment brings the state (and the KV
        rows, rewritten with the same values) to the committed prefix."""
        if tokens:
            self.step([(slot, list(tokens), False)])

    def prefill(self, slot: int, tokens, chunk: int | None = None, chunked_min: int | None = None):
        """Fresh request: prefill `tokens` (in chunks of `chunk` rows, if given); returns the last chunk's
        output."""
        self.reset(slot)
        chunk = chunk or max(1, len(tokens))
        res = None
        for a in range(0, len(tokens), chunk):
            res = self.step([(slot, tokens[a:a + chunk], False)], chunked_min=chunked_min)[0]
        return res


def hybrid_model_type(path: str) -> str | None:
    """The hybrid family of a checkpoint directory, or None (for the registry's dispatch)."""
    import json

    try:
        with open(os.path.join(path, "config.json")) as f:
            raw = json.load(f)
    except OSError:
        return None
    return FAMILIES.get(raw.get("model_type"))
