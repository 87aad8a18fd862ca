"""The target's weights in fewer bytes on CPU, chosen at load: `weights=` (EngineConfig) / `--weights`.

A memory-bound decode step reads every weight once, so its time follows the weight bytes. After the
batch-invariant kernels have packed the target (4 bytes per weight from an fp32 checkpoint), its linears and
its head (lm_head, or the tied embedding matrix as a head) are packed again:

- "int8": per-output-channel symmetric int8 (scale = max|w_row| / 127, round to nearest), 1 byte per weight,
  dequantised in registers inside the same linear kernel (W8A16: activations and accumulation stay fp32).
- "w8a8": the same int8 weights laid out for integer dot products (AVX-512 VNNI; pmaddwd on AVX2), and the
  activations quantised to int8 inside the kernel, per row and K chunk (max|x| / 127): never one scale for
  the batch, so a row's result stays independent of its batch. The integer sums are exact on every path; a
  verify block of many rows costs little more than one row. Matrices whose K is not a multiple of 4 stay W8A16.
- "fp8": per-output-channel e4m3 (scale = max|w_row| / 448, round to nearest even), the panels FP8
  checkpoints keep (fp8_weights.py), 1 byte per weight.
- "bf16": the weights rounded once to bf16 (round to nearest even), 2 bytes per weight; a model run in bf16
  keeps the panels `auto` gives it (bf16 k-pairs where they pay).
- "auto": as the checkpoint loads (fp32 panels, bf16 panels for bf16-valued weights, kept FP8 checkpoints).

The 8-bit W8A16 ones sum over the codes and scale each K chunk's sum once (the dequantised weight to fp32
rounding, without a multiply per weight), and all of them are batch-invariant (a row's result never depends
on the other rows, their number or the threads), so greedy DFlash stays token-identical to AR at the same setting; the logits move by the format's rounding of the weights (what
it costs: benchmarks/quantized_agreement.py --weights). Embeddings looked up by token and norms keep the
checkpoint's values; the drafter's own linears and draft-vocabulary head are packed as `draft_weights_for`
says (it shares the target's head otherwise, as always). Linears a kept FP8
checkpoint already holds in FP8 stay as they are. Under tensor parallelism only "bf16" applies: a row-parallel
shard's rows are slices, and per-row scales of slices would differ from the unsharded model's.
"""
from __future__ import annotations

import torch

from .errors import DFlashError

WEIGHTS = ("auto", "bf16", "int8", "w8a8", "fp8")
E4M3_MAX = 448.0


def check_weights(mode: str, what: str = "weights (--weights)") -> None:
    if mode not in WEIGHTS:
        raise DFlashError(f"{what} must be one of {', '.join(WEIGHTS)}, got {mode!r}")


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-row e4m3: (codes float8_e4m3fn [N, K], scale float32 [N]), scale = max|w_row| / 448."""
    w = weight.detach().to(device="cpu", dtype=torch.float32)
    scale = w.abs().amax(dim=1) / E4M3_MAX if w.shape[1] else w.new_zeros(w.shape[0])
    div = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (w / div[:, None]).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def _packer(mode: str):
    from .plugins import invariant as bi

    if mode == "int8":
        return bi.pack_linear_int8
    if mode == "w8a8":
        return lambda w: bi.pack_linear_w8a8(w) if w.shape[1] % 4 == 0 else bi.pack_linear_int8(w)
    if mode == "fp8":
        return lambda w: bi.pack_linear_fp8(*quantize_fp8(w))
    from . import ops

    # a model run in bf16 (bf16 weights and activations) keeps the panels ops.pack gives it (k-pairs where
    # vdpbf16ps pays); fp32 activations get widened bf16 panels, which leave x unrounded
    return lambda w: ops.pack(w) if w.dtype == torch.bfloat16 else bi.pack_linear(w, torch.bfloat16)


def repack_target(target, mode: str, sharded: bool = False) -> int:
    """Re-pack the packed target's fp32/bf16 linears and head as `mode`; returns how many linears (head
    included). The linears' unpacked copies are freed; the head's stays (the drafter's draft vocabulary
    slices it)."""
    check_weights(mode)
    if mode == "auto":
        return 0
    if getattr(target, "head_packed", None) is None:
        raise DFlashError(f"weights={mode!r} repacks the batch-invariant CPU kernels' weights, which this target "
                          "does not use here: run on device cpu with invariant_kernels on, or weights='auto'")
    if sharded and mode != "bf16":
        raise DFlashError(f"weights={mode!r} is not available under tensor parallelism (per-row scales of a "
                          "row-parallel shard differ from the whole model's): use weights 'bf16' or 'auto', or one "
                          "rank")
    pack = _packer(mode)
    head = getattr(target, "lm_head", None)
    count = _repack_linears(target, pack, keep=head)
    if head is not None and head.packed is not None:
        target.head_packed = head.packed
    else:
        target.head_packed = pack(target.head_weight.data)
        count += 1
    from .models.target import fuse_projections

    fuse_projections(target)  # q/k/v and gate/up fused again from the new panels (the old fused ones go)
    return count


def _repack_linears(model, pack, keep=None) -> int:
    """Re-pack every fp32/bf16-packed Linear (bf16 k-pairs included) of model (unpacked ones and kept FP8 ones stay); their unpacked
    copies are freed, except keep's. Returns how many."""
    from .models.target import Linear

    count = 0
    for m in model.modules():
        if not (isinstance(m, Linear) and m.packed is not None and m.weight.numel()
                and m.packed.dtype in (torch.float32, torch.bfloat16, torch.int16)):
            continue
        m.packed = pack(m.weight.data)
        if m is not keep:
            m.weight.data = torch.empty(0, dtype=m.weight.dtype)  # only the panels are used now
        count += 1
    return count


def draft_weights_for(weights: str, draft_weights: str | None) -> str:
    """The drafter's packing: as given; else the target's `weights`, except that a target kept as loaded ("auto")
    drafts in W8A8 where the CPU has integer dot products. A drafter pass is several rows per request, where the
    kernels are compute-bound and integer dot products do twice the bf16 work per instruction
    (docs/cpu_performance.md). Its drafts move with the rounding; the output never does."""
    if draft_weights is not None:
        return draft_weights
    if weights != "auto":
        return weights
    from .plugins import invariant as bi

    return "w8a8" if bi.int8_dots_pay() else "auto"


def repack_drafter(drafter, mode: str) -> int:
    """Re-pack the packed drafter's own linears and its draft-vocabulary head (after use_vocab) as `mode`;
    returns how many. Its embedding, norms and the target's head it shares are untouched."""
    check_weights(mode)
    if mode == "auto":
        return 0
    pack = _packer(mode)
    # W8A8 leaves fc as it is: it projects the target's raw hidden states, whose outlier dimensions a per-row
    # int8 activation scale blurs, and it runs on committed rows only
    count = _repack_linears(drafter.layers if mode == "w8a8" else drafter, pack)
    if getattr(drafter, "vocab_packed", None) is not None:
        drafter.vocab_packed = pack(drafter.vocab_head)
        count += 1
    return count
