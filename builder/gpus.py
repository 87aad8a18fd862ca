"""`dflash-build --gpu NAME`: what the serving GPU supports, as data.

The drafter's pooled-context cross-attention in TensorRT-LLM 1.4.0rc1 has three backends
(DFlashDecodingConfig.attention_backend): FA4 (FlashAttention-4, Hopper SM90), TRTLLM (trtllm-gen FMHA kernels,
Blackwell SM100/SM103) and VANILLA (FlashAttention with a contiguous cache, any GPU). The fast two exist only on
their own architectures, so the builder picks one only when told the GPU; without --gpu the YAML stays portable.
"""
from __future__ import annotations

from .errors import BuildError

# name -> compute capability (major * 10 + minor)
GPUS = {
    "a100": 80, "l4": 89, "l40s": 89,
    "h20": 90, "h100": 90, "h200": 90, "gh200": 90,
    "b200": 100, "gb200": 100, "b300": 103, "gb300": 103,
}
PORTABLE = "VANILLA"
_FAMILY = {80: "Ampere", 89: "Ada", 90: "Hopper", 100: "Blackwell", 103: "Blackwell Ultra"}


def drafter_attention(gpu: str | None) -> tuple[str, str]:
    """(attention_backend, why) for the drafter on this GPU; VANILLA when the GPU is not named."""
    if gpu is None:
        return PORTABLE, "portable default; pass --gpu to use the fastest backend your GPU has"
    sm = GPUS[gpu]
    where = f"--gpu {gpu}: {_FAMILY[sm]} SM{sm}"
    if sm == 90:
        return "FA4", where
    if sm in (100, 103):
        return "TRTLLM", where
    return PORTABLE, f"{where} has neither FA4 (SM90) nor trtllm-gen (SM100/SM103) kernels"


def check_gpu(gpu: str | None, quantization: str) -> None:
    """Refuse a target format the named GPU has no tensor cores for (the engine could not be served there)."""
    if gpu is None:
        return
    if gpu not in GPUS:
        raise BuildError(f"--gpu {gpu!r} is unknown: use one of {', '.join(GPUS)} (or leave --gpu out for a "
                         "portable build)")
    sm = GPUS[gpu]
    if quantization == "nvfp4" and sm not in (100, 103):
        instead = "fp8" if sm >= 89 else "bf16"
        raise BuildError(f"--quantization nvfp4 needs Blackwell (SM100/SM103) tensor cores, --gpu {gpu} is "
                         f"SM{sm}: use --quantization {instead}")
    if quantization == "fp8" and sm < 89:
        raise BuildError(f"--quantization fp8 needs FP8 tensor cores (SM89+), --gpu {gpu} is SM{sm}: use "
                         "--quantization bf16")
