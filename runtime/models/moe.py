"""Sparse mixture-of-experts MLP: a router picks top-k experts per token; their outputs are summed with the
router weights. Experts are plain Linear SwiGLU blocks, so they use the batch-invariant kernels like the rest.

Each token's sum runs over its experts in ascending expert id (as transformers does), whatever the batch: a
token's output never depends on which other tokens share the step.
"""
from __future__ import annotations

import re

import torch
from torch import nn

from ..config import TargetConfig
from ..errors import CheckpointError
from .family import rowwise
from .target import MLP, Linear


def route_softmax_topk(logits: torch.Tensor, k: int, norm: bool, bias=None):
    """Qwen3-MoE: softmax over all experts in fp32, top-k, optionally renormalised."""
    probs = torch.softmax(logits.float(), dim=-1)
    top, idx = torch.topk(probs, k, dim=-1)
    if norm:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(logits.dtype), idx


def route_topk_softmax(logits: torch.Tensor, k: int, norm: bool, bias=None):
    """gpt-oss: top-k of the raw logits, softmax over those k."""
    top, idx = torch.topk(logits, k, dim=-1)
    return torch.softmax(top, dim=-1, dtype=top.dtype), idx


def route_sigmoid_bias(logits: torch.Tensor, k: int, norm: bool, bias: torch.Tensor):
    """MiniMax-M2: sigmoid scores in fp32 (rowwise: a row's bits never depend on the batch); experts chosen by
    scores + bias, weighted by their uncorrected scores renormalised to sum 1. The weights stay fp32: transformers
    multiplies the expert outputs by them in fp32 before casting back."""
    scores = rowwise(torch.sigmoid, logits.float())
    idx = torch.topk(scores + bias, k, dim=-1, sorted=False)[1]
    top = scores.gather(1, idx)
    return (top / top.sum(dim=-1, keepdim=True) if norm else top), idx


ROUTERS = {"softmax_topk": route_softmax_topk, "topk_softmax": route_topk_softmax, "sigmoid_bias": route_sigmoid_bias}


class SparseMoe(nn.Module):
    """router_name: the checkpoint's name for the router (Qwen3-MoE `gate`, gpt-oss `router`). The sigmoid_bias
    router's correction bias belongs to the block (`mlp.e_score_correction_bias`, MiniMax-M2's name), not to the
    router; it is held in the model dtype, as transformers holds that buffer."""

    def __init__(self, cfg: TargetConfig, make_expert=None, router_name: str = "gate"):
        super().__init__()
        m = cfg.moe
        self.top_k, self.norm_topk = m.top_k, m.norm_topk_prob
        self.route = ROUTERS[m.router]
        self.router_name = router_name
        setattr(self, router_name, Linear(cfg.hidden_size, m.num_experts, bias=m.bias))
        self.e_score_correction_bias = (nn.Parameter(torch.zeros(m.num_experts), requires_grad=False)
                                        if m.router == "sigmoid_bias" else None)
        make_expert = make_expert or (lambda: MLP(cfg.hidden_size, m.intermediate_size, m.bias))
        self.experts = nn.ModuleList(make_expert() for _ in range(m.num_experts))

    def forward(self, x):
        bias = None if self.e_score_correction_bias is None else self.e_score_correction_bias.float()
        weights, idx = self.route(getattr(self, self.router_name)(x), self.top_k, self.norm_topk, bias)
        out = torch.zeros_like(x)
        for e in torch.unique(idx).tolist():
            rows, slot = torch.where(idx == e)
            y = self.experts[e](x.index_select(0, rows))
            out.index_add_(0, rows, (y * weights[rows, slot, None]).to(out.dtype))
        return out


_FUSED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def split_fused_experts(state: dict[str, torch.Tensor], transposed: bool, interleaved: bool,
                        bias: bool = False) -> dict[str, torch.Tensor]:
    """Fused 3-D expert tensors -> per-expert `experts.{e}.{gate,up,down}_proj.weight/bias`.

    transformers 5 layout (Qwen3-MoE in memory): gate_up_proj [E, 2I, H] (gate rows then up rows), down_proj
    [E, H, I]. gpt-oss checkpoints: transposed ([E, H, 2I], [E, I, H]) with gate/up interleaved by column.
    """
    out = {}
    for name, t in state.items():
        m = _FUSED.match(name)
        if m is None:
            if not (name.endswith("_proj_bias") and _FUSED.match(name[:-5])):
                out[name] = t
            continue
        prefix, kind = m.groups()
        if t.dim() != 3:
            raise CheckpointError(f"unsupported MoE layout: {name} has shape {list(t.shape)}, expected "
                                  "[experts, in, out] fused expert weights")
        b = state.get(name + "_bias")
        if bias and b is None:
            raise CheckpointError(f"unsupported MoE layout: {name} has no {name}_bias (this family's experts "
                                  "have biases)")
        for e in range(t.shape[0]):
            w = t[e].T if transposed else t[e]  # -> [out, in]
            p = f"{prefix}.{e}."
            if kind == "down_proj":
                out[p + "down_proj.weight"] = w.contiguous()
                if b is not None:
                    out[p + "down_proj.bias"] = b[e]
                continue
            if interleaved:
                gate, up = w[0::2], w[1::2]
                gb, ub = (b[e][0::2], b[e][1::2]) if b is not None else (None, None)
            else:
                half = w.shape[0] // 2
                gate, up = w[:half], w[half:]
                gb, ub = (b[e][:half], b[e][half:]) if b is not None else (None, None)
            out[p + "gate_proj.weight"], out[p + "up_proj.weight"] = gate.contiguous(), up.contiguous()
            if gb is not None:
                out[p + "gate_proj.bias"], out[p + "up_proj.bias"] = gb.contiguous(), ub.contiguous()
    return out
