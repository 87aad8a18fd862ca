"""A dense decoder layer in one op on the batch-invariant CPU kernels, and the fused projections it runs.

A decode step of a small model spends as long in Python and in thousands of small PyTorch ops (rope, the K/V
write, views, casts, 7 linear calls per layer) as in streaming the weights. `fused_decoder_layer`
(csrc/invariant_layer.cpp) runs a whole Llama/Qwen3 layer from C++, calling the same dflash_trt::bi_* kernels
as the op-by-op path, so its output is bitwise that path's (fp32 and bf16 activations).

Fused projections: q/k/v (and gate/up) are packed as one PackedLinear by stacking their panels. The kernel
computes every output column from that column's weights alone, so one call gives each member's bits exactly;
a member whose size is not a multiple of the 32-column panel is followed by zero padding columns in the
fused output, which the views skip.
"""
from __future__ import annotations

import dataclasses

import torch

from dflash_trt.plugins import invariant
from dflash_trt.plugins.build import load_extension
from dflash_trt.plugins.invariant import PANEL, PackedLinear

_SOURCE = "invariant_layer.cpp"
_state: dict[str, object] = {}
_KNOWN_FIELDS = {"data", "n", "k", "scale"}
_NONE = torch.empty(0)  # stands for an absent tensor in FusedLayer's constructor


def load() -> None:
    """Build (first time) and load the extension; raises when its kernels cannot be reached."""
    if "op" in _state:
        return
    invariant.load()  # registers the dflash_trt::bi_* ops the layer calls
    load_extension("dflash_layer", [_SOURCE])
    problem = torch.ops.dflash_trt.fused_layer_ready()
    if problem:
        raise RuntimeError(f"fused_decoder_layer cannot reach the invariant kernels: {problem}")
    _state["op"] = invariant.binding("fused_decoder_layer")
    _state["stack"] = invariant.binding("fused_decoder_stack")


def available() -> bool:
    """Whether the fused layer op can run here (built and loaded once; False without a compiler)."""
    if "ok" not in _state:
        try:
            load()
            _state["ok"] = True
        except Exception:  # no compiler, or kernels whose signatures changed: the op-by-op path runs
            _state["ok"] = False
    return bool(_state["ok"])


# ---- fused projections --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Concat:
    packed: PackedLinear  # all members' panels, in order
    cols: list[int]  # first output column of each member in the fused output
    views: list[PackedLinear]  # each member's own PackedLinear, a view of the fused panels (no copy)


def concat_packed(packs: list) -> Concat | None:
    """Stack PackedLinears with the same K and storage into one; None when they cannot share a kernel call."""
    if not packs or any(not isinstance(p, PackedLinear) for p in packs):
        return None
    first = packs[0]
    for p in packs:
        extra = {f.name for f in dataclasses.fields(p)} - _KNOWN_FIELDS
        if any(getattr(p, name) is not None for name in extra):  # a storage this stacking does not know
            return None
        if (p.k != first.k or p.data.dtype != first.data.dtype or p.data.shape[1:] != first.data.shape[1:]
                or (p.scale is None) != (first.scale is None)):
            return None
    data = torch.cat([p.data for p in packs]).contiguous()
    scale = None if first.scale is None else torch.cat([p.scale for p in packs]).contiguous()
    cols, views, p0 = [], [], 0
    for p in packs:
        p1 = p0 + p.data.shape[0]
        cols.append(p0 * PANEL)
        views.append(dataclasses.replace(p, data=data[p0:p1],
                                         scale=None if scale is None else scale[p0 * PANEL:p1 * PANEL]))
        p0 = p1
    return Concat(dataclasses.replace(first, data=data, n=p0 * PANEL, scale=scale), cols, views)


def concat_bias(biases: list, sizes: list[int], cols: list[int], total: int) -> torch.Tensor | None:
    """Members' biases laid out at their fused columns (zeros in the padding); None when none has one."""
    if all(b is None for b in biases):
        return None
    ref = next(b for b in biases if b is not None)
    out = torch.zeros(total, dtype=ref.dtype, device=ref.device)
    for b, n, c in zip(biases, sizes, cols):
        if b is not None:
            out[c:c + n] = b.detach()
    return out


# ---- the layer op ---------------------------------------------------------------------------------------------

def _t(x) -> torch.Tensor:
    return _NONE if x is None else x


def make_state(*, in_norm, post_norm, q_norm, k_norm, eps: float, qk_eps: float, attn_scale: float,
               heads: int, kv_heads: int, head_dim: int, qkv, qkv_bias, qkv_cols: list[int], o, o_bias,
               o_k_splits: int, gate_up, gate_up_bias, up_col: int, inter: int, down, down_bias,
               down_k_splits: int, causal: bool = True):
    """The constant part of one layer for fused_decoder_layer: norm weights, packed projections, sizes.
    causal False: each row attends to all of its sequence's keys (a DFlash drafter's block)."""
    load()
    tensors = [in_norm, post_norm, _t(q_norm), _t(k_norm)]
    for p, b in ((qkv, qkv_bias), (o, o_bias), (gate_up, gate_up_bias), (down, down_bias)):
        tensors += [p.data, _t(b), _t(p.scale)]
    ints = [heads, kv_heads, head_dim, qkv_cols[1], qkv_cols[2], inter, up_col, qkv.n, o.n, gate_up.n, down.n,
            o_k_splits, down_k_splits, int(causal)]
    args = (tensors, ints, [float(eps), float(qk_eps), float(attn_scale)])
    return LayerState(torch.classes.dflash_trt.FusedLayer(*args), args)


@dataclasses.dataclass(frozen=True, eq=False)
class LayerState:
    op_state: object  # torch.classes.dflash_trt.FusedLayer
    args: tuple  # what built it: (tensors, ints, floats), for a FusedStack of several layers


def make_stack(states: list[LayerState], final_norm: torch.Tensor | None = None, eps: float = 0.0):
    """Consecutive layers' states as one fused_decoder_stack state; final_norm: the weight of an RMSNorm the op
    applies after the last layer (the model's own, with its eps)."""
    stack = torch.classes.dflash_trt.FusedStack(*[sum((list(s.args[j]) for s in states), []) for j in range(3)])
    if final_norm is not None:
        stack.set_final_norm(final_norm, float(eps))
    return stack


def run(state: LayerState, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache, batch) -> torch.Tensor:
    """One decoder layer: x [T, hidden] -> x + attention + MLP, K/V of the rows written at batch.slot_mapping."""
    a = batch.kernel_args
    return _state["op"](state.op_state, x, cos, sin, kv_cache[0], kv_cache[1], batch.slot_mapping, a[0], a[1], a[2],
                        a[3], a[4])


def run_stack(stack, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_caches, batch,
              capture: list[int]) -> list[torch.Tensor]:
    """Every layer of a make_stack state in one op: [the last output (after the stack's final norm, if it has
    one), then, when capture is not empty, the outputs of the layers in capture side by side (the last layer's
    after the final norm)]."""
    a = batch.kernel_args
    return _state["stack"](stack, x, cos, sin, [c[0] for c in kv_caches], [c[1] for c in kv_caches],
                           batch.slot_mapping, a[0], a[1], a[2], a[3], a[4], capture)


__all__ = ["available", "concat_packed", "concat_bias", "make_state", "make_stack", "run", "run_stack", "load",
           "LayerState"]
