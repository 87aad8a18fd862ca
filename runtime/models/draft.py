"""The DFlash block-diffusion drafter (z-lab format): Qwen3-style layers whose keys/values are the projected
target context followed by the block, attended NON-causally; no embedding or head of its own.

The context part of every layer's K/V is computed once per committed token (fc -> hidden_norm -> k_proj ->
k_norm -> RoPE, and v_proj) and kept in a paged cache that shares the target's block tables.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DraftConfig
from ..errors import CheckpointError
from ..rope import RotaryTable, apply_rope
from .. import ops
from ..attention import AttentionBatch
from .target import MLP, FusableLayer, FusedProjection, Linear, RMSNorm, fuse_layer, stack_state


@dataclass
class DraftSlice:
    q_start: int  # first block row in the packed batch
    q_len: int  # block rows of this sequence
    ctx_slots: torch.Tensor  # flat draft-cache slots of context positions 0..ctx_len-1


def block_batch(slices: list[DraftSlice], scratch: torch.Tensor) -> AttentionBatch:
    """A drafter pass's rows as the fused layer op addresses them (slot_mapping and kernel_args): each block
    writes its K/V to scratch slots and attends (non-causally) to its request's context slots, then to those."""
    rows = sum(s.q_len for s in slices)
    mapping = scratch[:rows]
    kv = [t for s in slices for t in (s.ctx_slots, mapping[s.q_start:s.q_start + s.q_len])]
    lens = [s.ctx_slots.numel() + s.q_len for s in slices]
    meta = torch.tensor([[s.q_start, s.q_len, n] for s, n in zip(slices, lens)], dtype=torch.int64).T.contiguous()
    offs = torch.tensor(list(accumulate(lens[:-1], initial=0)), dtype=torch.int64)
    return AttentionBatch([], mapping, kernel_args=(meta[0], meta[1], meta[2], torch.cat(kv), offs))


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig, window: int | None):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h, b = cfg.hidden_size, cfg.attention_bias
        self.q_proj = Linear(h, self.n_heads * self.head_dim, b)
        self.k_proj = Linear(h, self.n_kv * self.head_dim, b)
        self.v_proj = Linear(h, self.n_kv * self.head_dim, b)
        self.o_proj = Linear(self.n_heads * self.head_dim, h, b, row_parallel=True)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.scale = self.head_dim ** -0.5
        self.window = window  # sliding_attention layers: causal within a window, as the reference does
        # the reference's `is_causal` (None: sliding layers causal); DFlash2 drafters set it false: their sliding
        # layers see the window on both sides
        self.causal = window is not None
        self.qkv = None  # q/k/v as one packed weight (target.fuse_layer), for the fused CPU pass

    def kv(self, x, cos, sin):
        t = x.shape[0]
        k = apply_rope(self.k_norm(self.k_proj(x).view(t, -1, self.head_dim)), cos, sin)
        return k, self.v_proj(x).view(t, -1, self.head_dim)

    def forward(self, x, cos, sin, cache, slices: list[DraftSlice], positions):
        t = x.shape[0]
        q = apply_rope(self.q_norm(self.q_proj(x).view(t, -1, self.head_dim)), cos, sin)
        k_blk, v_blk = self.kv(x, cos, sin)
        kc = cache[0].view(-1, self.n_kv, self.head_dim)
        vc = cache[1].view(-1, self.n_kv, self.head_dim)
        out = torch.empty_like(q)
        for s in slices:
            rows = slice(s.q_start, s.q_start + s.q_len)
            keys = torch.cat([kc.index_select(0, s.ctx_slots).to(q.dtype), k_blk[rows]])
            vals = torch.cat([vc.index_select(0, s.ctx_slots).to(q.dtype), v_blk[rows]])
            mask = None
            if self.window is not None or self.causal:
                ctx = s.ctx_slots.numel()
                kpos = torch.cat([torch.arange(ctx, device=x.device), positions[rows]])
                ahead = kpos[None, :] - positions[rows][:, None]  # key position - query position
                mask = ahead <= 0 if self.causal else torch.ones_like(ahead, dtype=torch.bool)
                if self.window is not None:
                    mask = mask & (-ahead < self.window) & (ahead < self.window)
            o = F.scaled_dot_product_attention(
                q[rows].transpose(0, 1)[None], keys.transpose(0, 1)[None], vals.transpose(0, 1)[None],
                attn_mask=mask, scale=self.scale, enable_gqa=True)
            out[rows] = o[0].transpose(0, 1)
        return self.o_proj(out.reshape(t, -1))


class DraftLayer(FusableLayer):
    def __init__(self, cfg: DraftConfig, window: int | None):
        super().__init__()
        self.self_attn = DraftAttention(cfg, window)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self._fused = None  # (its sources, plugins/layer.py state): target.fused_layer_state

    def forward(self, x, cos, sin, cache, slices, positions):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, slices, positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DraftConfig, max_positions: int = 4096):
        super().__init__()
        self.cfg = cfg
        n_ctx = len(cfg.target_layer_ids)
        self.fc = Linear(n_ctx * cfg.hidden_size, cfg.hidden_size)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        types = cfg.layer_types or ["full_attention"] * cfg.num_hidden_layers
        self.layers = nn.ModuleList(
            DraftLayer(cfg, cfg.sliding_window if types[i] == "sliding_attention" else None)
            for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryTable(cfg.rope, cfg.head_dim, max_positions)
        self.ops = None  # compiled plugin ops, set by the model runner
        # optional draft vocabulary (draft_vocab.json): the head rows drafts may use. Proposals only, so
        # output stays the target's; a 49K-row head read per draft step costs as much as several layers on CPU
        self.vocab_ids: torch.Tensor | None = None
        self.vocab_head: torch.Tensor | None = None
        self.vocab_packed = None
        self.context_kv: FusedProjection | None = None  # set by fuse

    @property
    def block_size(self) -> int:
        return self.cfg.block_size

    @property
    def mask_token_id(self) -> int:
        return self.cfg.mask_token_id

    def project_context(self, feats: torch.Tensor) -> torch.Tensor:
        return self.hidden_norm(self.fc(feats))

    def write_context(self, feats, positions, slot_mapping, caches) -> None:
        """Append committed rows' context K/V (feats: [T, n*H] target layer outputs) to the draft cache."""
        if feats.shape[0] == 0:
            return
        c = self.project_context(feats.to(self.fc.weight.dtype))
        cos, sin = self.rotary(positions, c.dtype)
        kv = self._context_kv(c)
        t = c.shape[0]
        for i, (layer, cache) in enumerate(zip(self.layers, caches)):
            att = layer.self_attn
            if self.ops is not None:  # fused k_norm + RoPE + paged scatter (plugins/)
                k, v = kv[2 * i:2 * i + 2] if kv else (att.k_proj(c), att.v_proj(c))
                self.ops.context_append(k.view(t, -1, att.head_dim), v.view(t, -1, att.head_dim),
                                        att.k_norm.weight, cos, sin, slot_mapping, cache[0], cache[1], att.k_norm.eps)
                continue
            k, v = att.kv(c, cos, sin)
            kvh, d = cache[0].shape[-2:]
            cache[0].view(-1, kvh, d).index_copy_(0, slot_mapping, k.to(cache[0].dtype))
            cache[1].view(-1, kvh, d).index_copy_(0, slot_mapping, v.to(cache[1].dtype))

    def fuse(self) -> None:
        """After pack_linears: each layer's q/k/v and gate/up as one packed weight, and the layers marked for the
        C++ layer op (a pass given cache scratch rows then runs all of them in one fused_decoder_stack); and
        every layer's k/v projections of the context rows as one more (`_context_kv`)."""
        for layer in self.layers:
            fuse_layer(layer, DraftAttention)
        self.context_kv = FusedProjection.build(self._kv_members(), share=False)

    def _kv_members(self) -> list:
        return [p for layer in self.layers for p in (layer.self_attn.k_proj, layer.self_attn.v_proj)]

    def _context_kv(self, c: torch.Tensor) -> list | None:
        """Every layer's k and v projections of the context rows from one kernel call, or None (the layers'
        own calls then). The context rows are the same input to all layers, and at the few rows a step commits
        a projection's cost is its call, not its arithmetic. The fusion holds a copy of the weights, since
        k/v are already views of their layer's fused q/k/v."""
        if self.context_kv is None or not ops._use_bi(c):
            return None
        if not self.context_kv.current():
            self.context_kv = FusedProjection.build(self._kv_members(), share=False)
            if self.context_kv is None:
                return None
        return self.context_kv(c)

    def forward(self, block_embeds, positions, caches, slices: list[DraftSlice],
                scratch: torch.Tensor | None = None) -> torch.Tensor:
        """block_embeds: target embeddings of [bonus, MASK...] rows; returns final-normed hidden rows.
        scratch: cache slots outside every block table, one per block row at least: the fused CPU pass writes
        the blocks' K/V there and attends to context and block in one kernel."""
        x = block_embeds.to(self.fc.weight.dtype) * self.cfg.input_embedding_scale
        cos, sin = self.rotary(positions, x.dtype)
        stack = self._fused_stack(x, cos, caches, scratch)
        if stack is not None:
            from ..plugins import layer as fused

            return fused.run_stack(stack, x, cos, sin, caches, block_batch(slices, scratch), [])[0]  # normed
        for layer, cache in zip(self.layers, caches):
            x = layer(x, cos, sin, cache, slices, positions)
        return self.norm(x)

    def _fused_stack(self, x, cos, caches, scratch):
        """The fused_decoder_stack state when the pass can run as one op, else None."""
        if (scratch is None or x.dim() != 2 or x.shape[0] > scratch.numel() or not ops._use_bi(x)
                or type(self.norm) is not RMSNorm):
            return None
        return stack_state(self, self.layers, x, cos, caches, self.norm)

    def logits(self, hidden: torch.Tensor, head) -> torch.Tensor:
        """head: the target's output head (TargetModel.logits)."""
        return self._softcap(head(hidden) * self.cfg.output_multiplier)

    def _softcap(self, logits: torch.Tensor) -> torch.Tensor:
        cap = self.cfg.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    def use_vocab(self, token_ids: torch.Tensor, head_weight: torch.Tensor) -> None:
        """Draft only among `token_ids` (sorted, unique) with those rows of the target's head."""
        self.vocab_ids = token_ids.to(head_weight.device, torch.int64)
        self.vocab_head = head_weight.index_select(0, self.vocab_ids).contiguous()
        self.vocab_packed = ops.pack(self.vocab_head)

    def draft_tokens(self, hidden: torch.Tensor, head, argmax=None, confidence: bool = False):
        """Greedy draft token per row. head: the target's head (TargetModel.logits); argmax: the distributed
        argmax of a vocab-split head (tensor parallelism). confidence: also return each row's probability of its
        token under the drafter (over the draft vocabulary when there is one; not under tensor parallelism,
        whose head is split)."""
        if self.vocab_ids is not None:
            if (self.cfg.output_multiplier == 1.0 and not self.cfg.final_logit_softcapping
                    and self.vocab_packed is not None and ops._use_bi(hidden)):
                tokens, conf = ops.head_argmax(hidden, self.vocab_packed, self.vocab_ids, confidence)
                return (tokens, conf) if confidence else tokens
            logits = ops.linear(hidden, self.vocab_head, packed=self.vocab_packed).float()
            if self.cfg.output_multiplier != 1.0:
                logits = logits * self.cfg.output_multiplier
            if not confidence:  # softcapping is monotonic: it cannot move an argmax
                return self.vocab_ids[logits.argmax(-1)]
            logits = self._softcap(logits)
            best, idx = logits.max(-1)
            return self.vocab_ids[idx], self._top_probability(logits, best)
        logits = self.logits(hidden, head)
        if not confidence:
            return argmax(logits) if argmax is not None else logits.argmax(-1)
        best, tokens = logits.max(-1)
        return tokens, self._top_probability(logits, best)

    @staticmethod
    def _top_probability(logits: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
        """p(argmax) = 1 / sum exp(logit - max) per row: one exp pass over the logits, no [rows, vocab]
        probabilities kept (logsumexp plus a separate amax read them three times)."""
        return torch.exp(logits - best[:, None]).sum(-1).reciprocal()

    def load_weights(self, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        own = dict(self.named_parameters())
        seen = set()
        for name, t in state.items():
            key = name[6:] if name.startswith("model.") else name
            if key not in own:
                if key.startswith(("embed_tokens", "lm_head", "rotary", "verifier_")) or key in ("d2t", "t2d"):
                    # tolerated: the drafter uses the target's embedding and head; speculators checkpoints also
                    # carry the verifier's head and norm (training only) and the draft vocabulary's maps, which
                    # runtime/draft_vocab.py reads
                    continue
                raise CheckpointError(f"drafter weight {name!r} is not part of a DFlash drafter "
                                      "(z-lab format expected: fc, hidden_norm, norm, layers.*)")
            if tuple(own[key].shape) != tuple(t.shape):
                raise CheckpointError(f"drafter weight {key} has shape {list(t.shape)}, config implies "
                                      f"{list(own[key].shape)}: config.json does not match the weights")
            own[key].data = t.to(dtype)
            seen.add(key)
        missing = sorted(set(own) - seen)
        if missing:
            raise CheckpointError(f"drafter checkpoint lacks {len(missing)} weights, e.g. {missing[0]}")
