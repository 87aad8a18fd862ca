"""Tensor parallelism applied to built models, gpt-fast style: the model files know almost nothing of it.

Target and drafter layers: attention heads split (q/k/v rows by head, o_proj columns), MLP intermediate split
(gate/up rows, down_proj columns). The row-parallel o_proj/down_proj compute, on each rank, the batch-invariant
partial sum of their local K slice (`linear_partial`, k_splits=8 fixed chunks), all-gather the fp32 partials
and add them with `tree_sum` in rank order: bitwise the TP=1 `linear` (plugins/invariant.py), so every rank
holds exactly the TP=1 hidden states. The embedding is vocab-parallel (each rank looks up the ids it owns;
the owner's row is selected after an all-gather, exact); the output head is vocab-parallel too, and greedy
choices use a distributed argmax (local max + index, all-gather, max with the lowest global index on ties:
torch.argmax of the full logits) so full logits are only gathered for sampled rows. The drafter's fc and
norms are replicated (small). Each rank reads only its slices of the safetensors files.
"""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from . import ops
from .checkpoint import iter_tensors
from .config import DraftConfig, TargetConfig
from .distributed import Distributed
from .errors import DFlashError
from .models.draft import DFlashDrafter
from .models.target import Linear, TargetModel

TP_SIZES = (1, 2, 4, 8)


def validate_tp(tp: int, tcfg: TargetConfig, dcfg: DraftConfig | None) -> None:
    """One-line DFlashErrors for sizes the models cannot be split by."""
    if tp not in TP_SIZES:
        raise DFlashError(f"tp_size {tp} is not supported: use 1, 2, 4 or 8 (row-parallel sums are split in 8 "
                          "fixed chunks so every size reproduces TP=1 bitwise)")
    if tp > 1:
        from .models.registry import target_class
        from .models.target import TargetModel
        if target_class(tcfg.model_type) is not TargetModel:
            raise DFlashError(f"tensor parallelism supports dense Llama/Qwen3 targets, not {tcfg.model_type}: "
                              "run it with tp_size 1")
    sizes = [(what, field, getattr(cfg, field)) for what, cfg in (("target", tcfg), ("drafter", dcfg))
             if cfg is not None for field in ("num_attention_heads", "num_key_value_heads", "intermediate_size")]
    for what, field, n in sizes:
        if n % tp:
            ok = [t for t in TP_SIZES if all(m % t == 0 for _, _, m in sizes)]
            raise DFlashError(f"tp_size {tp} does not divide the {what}'s {field} {n}: use tp_size "
                              f"{' or '.join(map(str, ok))} (`mpirun -n {ok[-1]}`; of the supported sizes "
                              f"{', '.join(map(str, TP_SIZES))}, the ones that divide every head count and "
                              "intermediate size of the pair)")


def resolve_tp_size(flag: int | None, engine_json: dict | None, world_size: int) -> tuple[int, str]:
    """The flag, else engine.json's tp_size, else the MPI world size; with where it came from."""
    if flag is not None:
        return int(flag), "tp_size"
    if engine_json and engine_json.get("tp_size") is not None:
        return int(engine_json["tp_size"]), "engine.json tp_size"
    return world_size, "the MPI world size"


# ---- modules ----------------------------------------------------------------------------------------------------

class RowParallelLinear(Linear):
    """y = x_local @ W[:, K slice].T summed over ranks (bias once): bitwise TP=1 with the invariant kernels."""

    def __init__(self, base: Linear, dist: Distributed):
        nn.Module.__init__(self)
        self.weight, self.bias, self.packed, self.k_splits = base.weight, base.bias, None, base.k_splits
        self.dist = dist
        self.tp = dist.world_size

    def forward(self, x):
        if self.packed is not None and ops._use_bi(x):
            ks = self.k_splits // self.tp
            part = ops._bi.linear_partial(x, self.packed, 0, ks, ks)
        else:  # PyTorch / GPU path: close to TP=1, not bitwise
            part = F.linear(x.float(), self.weight.float())
        parts = self.dist.all_gather(part)
        from .plugins.invariant import tree_sum  # pure PyTorch, needs no extension

        return tree_sum(parts, self.bias, x.dtype)


class VocabParallelEmbedding(nn.Module):
    """Rows [v0, v1) of the embedding on this rank; the owner rank's row is picked after an all-gather."""

    def __init__(self, base: nn.Embedding, dist: Distributed, shard: int):
        super().__init__()
        self.weight = base.weight
        self.dist, self.shard = dist, shard
        self.v0 = dist.rank * shard

    def forward(self, ids):
        local = ids - self.v0
        mine = (local >= 0) & (local < self.weight.shape[0])
        rows = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight) * mine[:, None]
        stacked = torch.stack(self.dist.all_gather(rows))  # [tp, T, H]
        owner = (ids // self.shard).clamp(max=self.dist.world_size - 1)
        return stacked[owner, torch.arange(ids.shape[0], device=ids.device)]


class VocabParallelHead:
    """What the model runner needs of a vocab-split head: the distributed argmax and full-logit gathers."""

    def __init__(self, dist: Distributed, shard: int, vocab: int):
        self.dist, self.shard, self.vocab = dist, shard, vocab

    def argmax(self, local_logits: torch.Tensor) -> torch.Tensor:
        """torch.argmax of the full logits (lowest index among equal maxima), without gathering them."""
        val, idx = local_logits.float().max(-1)  # first maximal local index
        idx = idx + self.dist.rank * self.shard
        vals = torch.stack(self.dist.all_gather(val))  # [tp, R]
        idxs = torch.stack(self.dist.all_gather(idx))
        best = vals.argmax(0)  # first rank holding the max: the lowest global index
        return idxs.gather(0, best[None])[0]

    def gather(self, local_logits: torch.Tensor) -> torch.Tensor:
        """The full [R, V] logits (only for sampled rows)."""
        pad = self.shard - local_logits.shape[1]
        if pad:  # the last shard is short when tp does not divide the vocabulary
            local_logits = F.pad(local_logits, (0, pad), value=float("-inf"))
        return self.dist.all_gather_cat(local_logits.contiguous(), dim=1)[:, :self.vocab]


# ---- sharding plans ---------------------------------------------------------------------------------------------

def _plan(cfg, tp: int, rank: int) -> dict:
    """name suffix -> (dim, start, end) for this rank; names not listed are replicated."""
    hd = cfg.head_dim
    qh, kvh, inter = cfg.num_attention_heads // tp, cfg.num_key_value_heads // tp, cfg.intermediate_size // tp
    q = (rank * qh * hd, (rank + 1) * qh * hd)
    kv = (rank * kvh * hd, (rank + 1) * kvh * hd)
    it = (rank * inter, (rank + 1) * inter)
    return {"self_attn.q_proj.weight": (0, *q), "self_attn.q_proj.bias": (0, *q),
            "self_attn.k_proj.weight": (0, *kv), "self_attn.k_proj.bias": (0, *kv),
            "self_attn.v_proj.weight": (0, *kv), "self_attn.v_proj.bias": (0, *kv),
            "self_attn.o_proj.weight": (1, *q),
            "mlp.gate_proj.weight": (0, *it), "mlp.gate_proj.bias": (0, *it),
            "mlp.up_proj.weight": (0, *it), "mlp.up_proj.bias": (0, *it),
            "mlp.down_proj.weight": (1, *it)}


_LAYER = re.compile(r"^(?:model\.)?layers\.\d+\.(.+)$")


def _slice_of(name: str, plan: dict, vocab: tuple[int, int] | None):
    if vocab is not None and name in ("model.embed_tokens.weight", "lm_head.weight"):
        return (0, *vocab)
    m = _LAYER.match(name)
    return plan.get(m.group(1)) if m else None


def read_slices(path: str, what: str, wanted, plan: dict, vocab: tuple[int, int] | None) -> dict:
    """This rank's slices of the checkpoint tensors named in `wanted` (callable on the stored name)."""
    out = {}
    for name, f, _ in iter_tensors(path, what):
        if not wanted(name):
            continue
        s = _slice_of(name, plan, vocab)
        if s is None:
            out[name] = f.get_tensor(name)
            continue
        dim, a, b = s
        sl = f.get_slice(name)
        out[name] = sl[a:b] if dim == 0 else sl[:, a:b]
    return out


def _resize(p: nn.Parameter, shape) -> None:
    p.data = torch.empty(shape, dtype=p.dtype)


def _shard_layers(layers, cfg, dist: Distributed) -> None:
    tp = dist.world_size
    for layer in layers:
        att, mlp = layer.self_attn, layer.mlp
        for lin in (att.q_proj, att.k_proj, att.v_proj, mlp.gate_proj, mlp.up_proj):
            out_f = lin.weight.shape[0] // tp
            _resize(lin.weight, (out_f, lin.weight.shape[1]))
            if lin.bias is not None:
                _resize(lin.bias, (out_f,))
        for parent, name in ((att, "o_proj"), (mlp, "down_proj")):
            lin = getattr(parent, name)
            if lin.k_splits % tp:
                raise DFlashError(f"{name} has {lin.weight.shape[1]} inputs, not a multiple of 8: "
                                  "it cannot be split bitwise-exactly over ranks")
            _resize(lin.weight, (lin.weight.shape[0], lin.weight.shape[1] // tp))
            setattr(parent, name, RowParallelLinear(lin, dist))
        att.n_heads //= tp
        att.n_kv //= tp


def shard_target(target: TargetModel, dist: Distributed) -> None:
    tp, cfg = dist.world_size, target.cfg
    _shard_layers(target.model.layers, cfg, dist)
    shard = -(-cfg.vocab_size // tp)
    rows = max(0, min(cfg.vocab_size, (dist.rank + 1) * shard) - dist.rank * shard)
    emb = target.model.embed_tokens
    _resize(emb.weight, (rows, cfg.hidden_size))
    target.model.embed_tokens = VocabParallelEmbedding(emb, dist, shard)
    if target.lm_head is not None:
        _resize(target.lm_head.weight, (rows, cfg.hidden_size))
    target.tp = VocabParallelHead(dist, shard, cfg.vocab_size)
    target.tp_vocab = (dist.rank * shard, dist.rank * shard + rows)


def shard_drafter(drafter: DFlashDrafter, dist: Distributed) -> None:
    _shard_layers(drafter.layers, drafter.cfg, dist)


def read_target_state(paths, target: TargetModel, dist: Distributed, dtype) -> dict:
    """This rank's slices of the (sharded) target's weights."""
    from .quantized import is_quantized, load_quantized_state_dict

    own = set(dict(target.named_parameters()))
    plan = _plan(target.cfg, dist.world_size, dist.rank)
    if not is_quantized(paths.target):
        return read_slices(paths.target, "target", lambda n: n in own, plan, target.tp_vocab)
    state = {}  # quantized: dequantised whole on load, then sliced
    for n, t in load_quantized_state_dict(paths.target, dtype).items():
        if n in own:
            s = _slice_of(n, plan, target.tp_vocab)
            state[n] = t if s is None else (t[s[1]:s[2]] if s[0] == 0 else t[:, s[1]:s[2]])
    return state


def read_draft_state(paths, drafter: DFlashDrafter, dist: Distributed) -> dict:
    own = set(dict(drafter.named_parameters()))
    return read_slices(paths.draft, "drafter", lambda n: (n[6:] if n.startswith("model.") else n) in own,
                       _plan(drafter.cfg, dist.world_size, dist.rank), None)


def weight_bytes(*models) -> int:
    """Bytes of this rank's parameters (the packed copies of the invariant kernels excluded)."""
    return sum(p.numel() * p.element_size() for m in models if m is not None for p in m.parameters())


# ---- engine: SPMD ---------------------------------------------------------------------------------------------

def setup(cfg, paths, tcfg: TargetConfig, dcfg: DraftConfig | None) -> Distributed | None:
    """Resolve and validate the TP size; join the ranks' group when it is > 1 (None when alone)."""
    from .distributed import env_world, init_distributed

    world = env_world()[1]
    tp, source = resolve_tp_size(cfg.tp_size, paths.engine, world)
    validate_tp(tp, tcfg, dcfg)
    if tp != world:
        raise DFlashError(f"{source} is {tp} but {world} rank(s) are running: launch with `mpirun -n {tp} ...`"
                          + (f" or pass --tp-size {world}" if world in TP_SIZES else ""))
    if tp == 1:
        return None
    return init_distributed(cfg.device)
