"""The DFlash2 drafter (`DFlash2DraftModel`, z-lab format): the DFlash backbone plus, in every layer, a grouped
dynamic causal convolution around the attention and around the MLP, and a candidate selector that turns the
block's rows into one coherent path of drafts instead of independent argmaxes.

Definitions (the z-lab reference `dflash.model`, with the vLLM / SGLang / MLX ports agreeing):
- Convolution, per sublayer: one projection of the sublayer's (normed) input gives two sets of per-group kernel
  corrections `dyn[side][t, o, g]`. With `base[side][o, c]` learned per channel, `conv(x, side)[t, c] =
  sum_o (base[side][o, c] + dyn[side][t, o, g(c)]) * x[t - o, c]`, rows of the same block only (x before the
  block's first row is zero: the anchor has no in-block predecessor). The sublayer sees `conv(input, 0)`; its
  output becomes `conv(output, 1)` with side 1's corrections, still those of the sublayer's input. The target
  context (K/V injection) is not convolved: the context cache is the same as DFlash's.
- Selector: per draft row, the top-k tokens of the drafter's logits (after output_multiplier and soft-capping)
  with their logits as unary scores; walking from the anchor (the block's row-0 token), row j scores each
  candidate c as `unary[c] + <P[prev] * W h_j, S[c]>` (P, S: predecessor / successor codebooks, W: hidden
  projection, prev: the token chosen at row j-1). Greedy takes the best; T > 0 samples from
  softmax(scores / T), which is the draft distribution verification needs (spec/verify.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
from torch import nn

from ..config import DraftConfig
from ..errors import CheckpointError
from .draft import DFlashDrafter, DraftLayer
from .target import Linear

ARCHITECTURE = "DFlash2DraftModel"
DEFAULT_TOP_K = 16
CODEBOOKS = ("predecessor_codebook", "successor_codebook")


def is_dflash2_config(raw: dict) -> bool:
    """A drafter config.json (as a dict) describes a DFlash2 drafter: the reference dispatches on the
    architecture name, and so do we."""
    return ARCHITECTURE in (raw.get("architectures") or [])


def is_dflash2(draft_dir: str) -> bool:
    """Whether the drafter directory holds a DFlash2 drafter (False when it has no readable config.json: the
    loader's own checks report that)."""
    try:
        with open(os.path.join(draft_dir, "config.json")) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and is_dflash2_config(raw)


@dataclass
class DFlash2Settings:
    conv_kernel_size: int
    conv_group_size: int
    selector_rank: int
    selector_top_k: int
    is_causal: bool | None  # None: sliding layers causal, full layers not (the reference's default)

    @classmethod
    def from_config(cls, dcfg: DraftConfig, where: str = "drafter") -> "DFlash2Settings":
        raw = dcfg.raw
        nested = raw.get("dflash_config") or {}

        def pick(name, default=None):  # dflash_config wins over the top level, as in the reference
            return nested.get(name, raw.get(name, default))

        missing = [k for k in ("conv_kernel_size", "conv_group_size", "selector_rank") if pick(k) is None]
        if missing:
            raise CheckpointError(f"{where}/config.json is a {ARCHITECTURE} without {', '.join(missing)} "
                                  "(dflash_config): a DFlash2 drafter needs its convolution and selector sizes")
        out = cls(int(pick("conv_kernel_size")), int(pick("conv_group_size")), int(pick("selector_rank")),
                  int(pick("selector_top_k", DEFAULT_TOP_K)),
                  # a top-level field only: the reference reads it from the config object, not dflash_config
                  None if raw.get("is_causal") is None else bool(raw["is_causal"]))
        if out.conv_kernel_size < 1 or out.conv_group_size < 1 or dcfg.hidden_size % out.conv_group_size:
            raise CheckpointError(f"{where}/config.json: conv_kernel_size {out.conv_kernel_size} must be >= 1 and "
                                  f"conv_group_size {out.conv_group_size} must divide hidden_size {dcfg.hidden_size}")
        if out.selector_rank < 1 or out.selector_top_k < 1:
            raise CheckpointError(f"{where}/config.json: selector_rank {out.selector_rank} and selector_top_k "
                                  f"{out.selector_top_k} must be >= 1")
        if dcfg.vocab_size is not None and out.selector_top_k > dcfg.vocab_size:
            raise CheckpointError(f"{where}/config.json: selector_top_k {out.selector_top_k} exceeds vocab_size "
                                  f"{dcfg.vocab_size}")
        return out


def block_offsets(slices, rows: int, device) -> torch.Tensor:
    """Each packed row's index inside its own block (the convolution never reaches across blocks)."""
    off = torch.zeros(rows, dtype=torch.int64, device=device)
    for s in slices:
        off[s.q_start:s.q_start + s.q_len] = torch.arange(s.q_len, device=device)
    return off


class GroupedDynamicConv(nn.Module):
    def __init__(self, hidden: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size, self.groups = kernel_size, group_size, hidden // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden), requires_grad=False)
        self.kernel_projection = Linear(hidden, 2 * kernel_size * self.groups)

    def prepare(self, x: torch.Tensor, offsets: torch.Tensor):
        """The sublayer's input convolved (side 0), and side 1's corrections for its output."""
        dyn = self.kernel_projection(x).view(x.shape[0], 2, self.kernel_size, self.groups)
        return self._convolve(x, dyn[:, 0], 0, offsets), dyn[:, 1]

    def finish(self, y: torch.Tensor, dyn: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self._convolve(y, dyn, 1, offsets)

    def _convolve(self, x, dyn, side: int, offsets):
        rows = x.shape[0]
        xg = x.view(rows, self.groups, self.group_size)
        base = self.base_kernel[side].to(x.dtype).view(self.kernel_size, self.groups, self.group_size)
        out = torch.zeros_like(xg)
        for o in range(self.kernel_size):
            if o == 0:
                v = xg
            else:
                v = torch.zeros_like(xg)
                v[o:] = xg[:-o]
                v = v * (offsets >= o).to(x.dtype)[:, None, None]
            out = out + base[o] * v  # base then correction, per tap, as the reference accumulates
            out = out + dyn[:, o, :, None] * v
        return out.view_as(x)


class DFlash2Layer(DraftLayer):
    def __init__(self, cfg: DraftConfig, window: int | None, s: DFlash2Settings):
        super().__init__(cfg, window)
        self.self_attn.causal = (window is not None) if s.is_causal is None else s.is_causal
        self.attention_conv = GroupedDynamicConv(cfg.hidden_size, s.conv_kernel_size, s.conv_group_size)
        self.mlp_conv = GroupedDynamicConv(cfg.hidden_size, s.conv_kernel_size, s.conv_group_size)

    def forward(self, x, cos, sin, cache, slices, positions, offsets):
        h, dyn = self.attention_conv.prepare(self.input_layernorm(x), offsets)
        x = x + self.attention_conv.finish(self.self_attn(h, cos, sin, cache, slices, positions), dyn, offsets)
        h, dyn = self.mlp_conv.prepare(self.post_attention_layernorm(x), offsets)
        return x + self.mlp_conv.finish(self.mlp(h), dyn, offsets)


@dataclass
class Walk:
    """The selector's path for a batch of requests, each padded to the longest: tokens[i, j] is request i's
    draft j; scores/probs[i, j] its candidates' scores and draft distribution (probs: sampled requests only,
    else one-hot on the chosen candidate); candidates[i, j] the candidates' token ids."""
    tokens: torch.Tensor  # [n, K] int64
    candidates: torch.Tensor  # [n, K, top_k] int64
    scores: torch.Tensor  # [n, K, top_k] float32
    probs: torch.Tensor  # [n, K, top_k] float64
    choice: torch.Tensor  # [n, K] int64: the chosen candidate's index


class CandidateSelector(nn.Module):
    def __init__(self, hidden: int, vocab: int, s: DFlash2Settings):
        super().__init__()
        self.top_k = s.selector_top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab, s.selector_rank), requires_grad=False)
        self.successor_codebook = nn.Parameter(torch.empty(vocab, s.selector_rank), requires_grad=False)
        self.hidden_projection = Linear(hidden, s.selector_rank)

    def candidates(self, hidden, logits, token_ids=None):
        """Per draft row: the top-k logits (unary scores), their token ids, and the projected hidden state."""
        unary, cand = torch.topk(logits.float(), min(self.top_k, logits.shape[-1]), dim=-1)
        if token_ids is not None:
            cand = token_ids[cand]
        return unary, cand, self.hidden_projection(hidden).float()

    def score(self, proj, unary, cand, prev):
        """Candidates' scores at one row, given the token chosen before it: unary + <P[prev] * proj, S[cand]>."""
        return unary + torch.einsum("nr,nkr->nk", self.predecessor_codebook.float()[prev] * proj,
                                    self.successor_codebook.float()[cand])

    def walk(self, hidden, logits, token_ids, rows, anchors, temperatures, uniforms) -> Walk:
        """hidden / logits: the draft rows [R, H] / [R, V']; token_ids: the vocabulary id of each logit column
        (None: the column index); rows: [n, K] indices into the draft rows (padding repeats a valid row);
        anchors: [n] row-0 tokens; temperatures: per request (0: greedy); uniforms: [n, K] float64 draws for
        the sampled requests' draft choices."""
        unary, cand, proj = self.candidates(hidden, logits, token_ids)
        n, k_max = rows.shape
        temps = torch.tensor(temperatures, dtype=torch.float64, device=hidden.device)
        sampled = temps > 0
        prev = anchors
        toks, scores, probs, choices = [], [], [], []
        for j in range(k_max):
            r = rows[:, j]
            c = cand[r]
            s = self.score(proj[r], unary[r], c, prev)
            pick = s.argmax(-1)
            q = torch.nn.functional.one_hot(pick, s.shape[-1]).to(torch.float64)
            if bool(sampled.any()):
                qs = torch.softmax(s.double() / temps.clamp_min(1e-30)[:, None], -1)
                cdf = qs.cumsum(-1)
                drawn = torch.searchsorted(cdf, (uniforms[:, j] * cdf[:, -1])[:, None], right=True)[:, 0]
                pick = torch.where(sampled, drawn.clamp_max(s.shape[-1] - 1), pick)
                q = torch.where(sampled[:, None], qs, q)
            prev = c.gather(1, pick[:, None])[:, 0]
            toks.append(prev)
            scores.append(s)
            probs.append(q)
            choices.append(pick)
        return Walk(torch.stack(toks, 1), cand[rows], torch.stack(scores, 1), torch.stack(probs, 1),
                    torch.stack(choices, 1))


class DFlash2Drafter(DFlashDrafter):
    def __init__(self, cfg: DraftConfig, max_positions: int = 4096):
        super().__init__(cfg, max_positions)
        self.settings = DFlash2Settings.from_config(cfg)
        if cfg.vocab_size is None:
            raise CheckpointError(f"{ARCHITECTURE} config.json has no vocab_size: the selector's codebooks need it")
        types = cfg.layer_types or ["full_attention"] * cfg.num_hidden_layers
        self.layers = nn.ModuleList(
            DFlash2Layer(cfg, cfg.sliding_window if types[i] == "sliding_attention" else None, self.settings)
            for i in range(cfg.num_hidden_layers))
        self.candidate_selector = CandidateSelector(cfg.hidden_size, cfg.vocab_size, self.settings)

    def forward(self, block_embeds, positions, caches, slices) -> torch.Tensor:
        x = block_embeds.to(self.fc.weight.dtype) * self.cfg.input_embedding_scale
        cos, sin = self.rotary(positions, x.dtype)
        offsets = block_offsets(slices, x.shape[0], x.device)
        for layer, cache in zip(self.layers, caches):
            x = layer(x, cos, sin, cache, slices, positions, offsets)
        return self.norm(x)

    def selector_logits(self, hidden: torch.Tensor, head):
        """The unary scores' source: the drafter's logits over the draft vocabulary when there is one (with the
        vocabulary ids of its columns), else over the whole vocabulary (ids None)."""
        if self.vocab_ids is not None:
            from .. import ops

            logits = ops.linear(hidden, self.vocab_head, packed=self.vocab_packed).float()
            return self._softcap(logits * self.cfg.output_multiplier), self.vocab_ids
        return self.logits(hidden, head), None

    def load_weights(self, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        # z-lab checkpoints store the codebooks without a `.weight` suffix (its from_pretrained maps them onto
        # nn.Embedding weights); a checkpoint saved through transformers carries the suffix
        fixed = {}
        for name, t in state.items():
            for cb in CODEBOOKS:
                if name.endswith(f"candidate_selector.{cb}.weight"):
                    name = name[:-len(".weight")]
            fixed[name] = t
        super().load_weights(fixed, dtype)


def build_drafter(dcfg: DraftConfig, max_positions: int = 4096) -> DFlashDrafter:
    """The drafter module a config describes: DFlash2 for `DFlash2DraftModel`, else DFlash."""
    cls = DFlash2Drafter if is_dflash2_config(dcfg.raw) else DFlashDrafter
    return cls(dcfg, max_positions)
