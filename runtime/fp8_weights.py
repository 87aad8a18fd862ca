"""FP8 targets on CPU with their weights kept in FP8: 1 byte per weight instead of 4, and the same bits.

A ModelOpt FP8 export stores each linear's weight as float8_e4m3fn with a per-tensor (or per-channel) fp32
scale. The loader dequantises every weight first (so every code path works); with the batch-invariant kernels
on, each FP8 linear is then re-packed from the checkpoint as e4m3 panels (plugins/invariant.py
`pack_linear_fp8`) and its fp32 copy freed. The kernel widens e4m3 exactly and multiplies by the scale once,
which is exactly the dequantised weight, so logits are bitwise those of the dequantised path while a decode
step streams a quarter of the bytes (decode on CPU is memory-bound).
"""
from __future__ import annotations

import torch
from torch import nn

from .checkpoint import iter_tensors


def keep_fp8_weights(model: nn.Module, target_dir: str) -> int:
    """Re-pack the model's FP8 linears from `target_dir` as e4m3 panels; returns how many. No-op (0) unless the
    invariant kernels packed the model."""
    from .models.target import Linear
    from .plugins import invariant

    linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear) and m.packed is not None}
    if not linears:
        return 0
    fp8, scales = {}, {}
    for name, handle, _ in iter_tensors(target_dir, "target"):
        if not name.endswith((".weight", ".weight_scale")):
            continue
        base, kind = name.rsplit(".", 1)
        if base not in linears:
            continue
        sl = handle.get_slice(name)
        if kind == "weight" and sl.get_dtype() == "F8_E4M3":
            fp8[base] = handle.get_tensor(name)
        elif kind == "weight_scale":
            scales[base] = handle.get_tensor(name)
    count = 0
    for base, w in fp8.items():
        lin = linears[base]
        if base not in scales or tuple(w.shape) != tuple(lin.weight.shape):
            continue  # the dequantising loader already refused incomplete exports; shapes differ under TP
        lin.packed = invariant.pack_linear_fp8(w, scales[base])
        lin.weight.data = torch.empty(0, dtype=lin.weight.dtype)  # only the packed panels are used now
        count += 1
    return count
