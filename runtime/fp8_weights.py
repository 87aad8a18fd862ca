"""FP8 targets kept in FP8: 1 byte per weight instead of 4, two ways.

A ModelOpt FP8 export stores each linear's weight as float8_e4m3fn with a per-tensor (or per-channel) fp32
`weight_scale` and a static `input_scale`. The loader dequantises every weight first (so every code path works);
then the engine keeps the FP8 linears in FP8 in one of two ways:

- CPU, batch-invariant kernels (`keep_fp8_weights`): each FP8 linear is re-packed from the checkpoint as e4m3
  panels (plugins/invariant.py `pack_linear_fp8`). The kernel widens e4m3 exactly, sums over the codes' values
  and scales each chunk's sum once, so logits are those of the dequantised path to fp32 rounding (no scale
  multiply per weight) while a memory-bound decode step streams a quarter of the bytes.
- native FP8 GEMMs (`use_fp8_matmul`, GPUs with FP8 tensor cores, or forced with `fp8_compute=True`): weight
  and activations in e4m3 through `torch._scaled_mm` (runtime/ops.py `fp8_linear`), as TensorRT-LLM runs the
  same checkpoint. Activations are rounded to e4m3 too, so logits move by the format's error, not bitwise.

The dequantised fp32 copy of every converted linear is freed. Under tensor parallelism a rank's linears are
shards of different shapes: those stay dequantised.

NVFP4 targets are not kept packed: on CPU the loader dequantises them to the compute dtype (fp32 by default, ~7x
the bytes of the packed 4.5 bits per weight; bf16 with dtype="bfloat16"), and they run as plain linears. There
is no NVFP4 GEMM on CPU, so a packed weight would have to be dequantised layer by layer on every step:
unpacking the e2m1 nibbles and applying both scales costs far more than reading the fp32/bf16 weight it
produces (a 1536x576 SmolLM2 MLP weight: ~16 ms to dequantise in PyTorch against ~0.3 ms for its fp32
matrix-vector product, one thread). For models this runtime serves on CPU, memory is not the constraint.
"""
from __future__ import annotations

import torch
from torch import nn

from .checkpoint import iter_tensors


def read_fp8_linears(model: nn.Module, target_dir: str, packed_only: bool = False) -> dict:
    """{module name: (Linear, e4m3 weight, weight_scale, input_scale or None)} for the model's FP8 linears."""
    from .models.target import Linear

    linears = {name: m for name, m in model.named_modules()
               if isinstance(m, Linear) and (m.packed is not None or not packed_only)}
    if not linears:
        return {}
    fp8, scales, inputs = {}, {}, {}
    for name, handle, _ in iter_tensors(target_dir, "target"):
        if not name.endswith((".weight", ".weight_scale", ".input_scale")):
            continue
        base, kind = name.rsplit(".", 1)
        if base not in linears:
            continue
        if kind == "weight" and handle.get_slice(name).get_dtype() == "F8_E4M3":
            fp8[base] = handle.get_tensor(name)
        elif kind == "weight_scale":
            scales[base] = handle.get_tensor(name)
        elif kind == "input_scale":
            inputs[base] = handle.get_tensor(name)
    out = {}
    for base, w in fp8.items():
        lin = linears[base]
        if base in scales and tuple(w.shape) == tuple(lin.weight.shape):  # shapes differ under TP
            out[base] = (lin, w, scales[base].float(), inputs[base].float() if base in inputs else None)
    return out


def keep_fp8_weights(model: nn.Module, target_dir: str) -> int:
    """Re-pack the model's FP8 linears from `target_dir` as e4m3 panels; returns how many. No-op (0) unless the
    invariant kernels packed the model."""
    from .plugins import invariant

    found = read_fp8_linears(model, target_dir, packed_only=True)
    for lin, w, scale, _ in found.values():
        lin.packed = invariant.pack_linear_fp8(w, scale)
        lin.weight.data = torch.empty(0, dtype=lin.weight.dtype)  # only the packed panels are used now
    return len(found)


def use_fp8_matmul(model: nn.Module, target_dir: str) -> int:
    """Run the model's FP8 linears as native FP8 GEMMs; returns how many. Linears whose dimensions the FP8 GEMM
    cannot tile (not multiples of 16) stay dequantised."""
    count = 0
    for lin, w, scale, in_scale in read_fp8_linears(model, target_dir).values():
        n, k = w.shape
        if n % 16 or k % 16:
            continue
        dev = lin.weight.device
        lin.fp8 = (w.to(dev), scale.to(dev), None if in_scale is None else in_scale.to(dev))
        lin.packed = None
        lin.weight.data = torch.empty(0, dtype=lin.weight.dtype, device=dev)
        count += 1
    return count
