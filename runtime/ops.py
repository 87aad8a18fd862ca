"""The numeric primitives every model calls, in one place.

Two implementations: plain PyTorch (autograd, GPUs, the trainer) and the batch-invariant CPU kernels of
plugins/invariant.py, which compute every output element of a row with one fixed sequence of operations
whatever the batch, the row's position and the thread count. The engine switches the latter on for CPU
inference (`enable_invariant`): that is what makes greedy DFlash output bitwise identical to autoregressive
decoding, alone or batched, chunked or not (a BLAS rounds a row differently depending on M).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_bi = None  # plugins.invariant when enabled


def enable_invariant(enabled: bool = True) -> bool:
    """Turn the batch-invariant kernels on (returns False when the extension cannot be built here)."""
    global _bi
    if not enabled:
        _bi = None
        return False
    try:
        from .plugins import invariant

        invariant.load()
        _bi = invariant
    except Exception:  # no compiler: stay on PyTorch
        _bi = None
    return _bi is not None


def invariant_enabled() -> bool:
    return _bi is not None


def _use_bi(x: torch.Tensor) -> bool:
    return _bi is not None and x.device.type == "cpu" and not (torch.is_grad_enabled() and x.requires_grad)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _use_bi(x) and not weight.requires_grad:
        return _bi.rms_norm(x, weight, eps)
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, packed=None,
           k_splits: int = 1) -> torch.Tensor:
    if packed is not None and _use_bi(x):
        return _bi.linear(x, packed, bias, k_splits)
    return F.linear(x, weight, bias)


def head_argmax(x: torch.Tensor, packed, ids: torch.Tensor | None = None, confidence: bool = False):
    """(argmax(linear(x, packed), -1) through ids, and with confidence its softmax probability, else None), in
    one op of the batch-invariant CPU kernels."""
    return _bi.head_argmax(x, packed, ids, confidence)


E4M3_MAX = 448.0


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, w_scale: torch.Tensor, in_scale: torch.Tensor | None,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """W8A8 FP8 GEMM (torch._scaled_mm: the tensor cores of Hopper/Blackwell/Ada, or PyTorch's CPU kernel).

    weight: [N, K] float8_e4m3fn; w_scale: per-tensor or per-output-channel fp32. Activations are quantised to
    e4m3 with the checkpoint's static `input_scale` (ModelOpt FP8, what TensorRT-LLM runs), else with one
    dynamic scale per row (FP8_PER_CHANNEL_PER_TOKEN): never one scale for the whole batch, which would make a
    row's result depend on the other rows and break DFlash's bitwise agreement with autoregressive decoding.
    """
    shape, k = x.shape, x.shape[-1]
    x2 = x.reshape(-1, k).float()
    if in_scale is not None:
        xs = in_scale.float().reshape(1, 1).to(x.device)
    else:
        xs = (x2.abs().amax(dim=1, keepdim=True) / E4M3_MAX).clamp_min(1e-12)
    xq = (x2 / xs).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    one = torch.ones((), dtype=torch.float32, device=x.device)
    # unit scales in the GEMM and the real ones after, in fp32: one code path for per-tensor and per-channel
    # weight scales and static or per-row activation scales, on every device _scaled_mm supports
    y = torch._scaled_mm(xq, weight.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    y = y * xs * w_scale.float().reshape(1, -1)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*shape[:-1], weight.shape[0])


def fp8_matmul_available(device) -> bool:
    """FP8 tensor cores: compute capability 8.9 (Ada) and up."""
    dev = torch.device(device)
    return dev.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(dev) >= (8, 9)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if _use_bi(gate):
        return _bi.silu_mul(gate, up)
    return F.silu(gate) * up


def pack(weight: torch.Tensor):
    """Panels for the invariant linear. A float32 weight whose values are all bfloat16 numbers (a bf16
    checkpoint run in fp32) is packed as bf16: the kernel widens bf16 exactly, so the results are bitwise the
    same while a memory-bound decode step streams half the bytes. A bfloat16 weight (a model run in bf16, whose
    activations are bf16) gets k-pair panels (bf16 x bf16 products) where vdpbf16ps does twice the
    multiply-adds of an fp32 FMA, which keeps verification rows cheap; elsewhere widened bf16 panels."""
    if _bi is None or weight.device.type != "cpu":
        return None
    w = weight.detach()
    if w.dtype == torch.bfloat16 and w.shape[1] % 16 == 0 and _bi.bf16_pairs_pay():  # even chunks, any k_splits
        return _bi.pack_linear_bf16_pairs(w)
    if w.dtype == torch.bfloat16 or torch.equal(w.to(torch.bfloat16).float(), w):
        return _bi.pack_linear(w, torch.bfloat16)
    return _bi.pack_linear(w)


def attention_args(q_lens: list[int], kv_lens: list[int], blocks: list[int], block_size: int) -> list[torch.Tensor]:
    """The paged attention kernel's batch arguments (plugins/invariant.py attention_args)."""
    return _bi.attention_args(q_lens, kv_lens, blocks, block_size)


def paged_attention_kernel():
    return _bi.paged_attention if _bi is not None else None
