"""Reading an NVIDIA ModelOpt unified Hugging Face export (FP8 / NVFP4 target) into plain dequantised weights.

transformers cannot reload these checkpoints correctly on CPU, so the runtime reads them itself. The export keeps
the original HF tensor names and adds per-linear scales:

- FP8:   `weight` float8_e4m3fn, `weight_scale` fp32 (scalar, or one per output channel), `input_scale` fp32.
- NVFP4: `weight` uint8 [N, K/2] (two E2M1 codes per byte, low nibble = even element), `weight_scale`
  float8_e4m3fn [N, K/16] (one per 16-element block), `weight_scale_2` fp32 scalar, `input_scale` fp32.
  Dequantised weight = e2m1 * weight_scale * weight_scale_2.
- FP8 KV cache: `k_proj.k_scale` / `v_proj.v_scale` fp32 scalars.

`load_quantized_state_dict` returns the weights under the plain HF names, dequantised to `dtype`, and drops every
scale tensor (activation and KV scales only matter to FP8/FP4 kernels, which this runtime does not use).
"""
from __future__ import annotations

import json
import os

import torch

from .checkpoint import load_state_dict
from .errors import CheckpointError

# Weight formats this reader understands; anything else (AWQ, INT8 SmoothQuant, block-wise FP8) is refused.
SUPPORTED_QUANT_ALGOS = {None, "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "NVFP4", "MIXED_PRECISION"}
# Tensors that only carry scales for quantized kernels: never part of the dequantised state dict.
SCALE_SUFFIXES = (".weight_scale", ".weight_scale_2", ".input_scale", ".output_scale", ".k_scale", ".v_scale")
NVFP4_BLOCK = 16
# E2M1 code -> value: bit 3 is the sign, bits 0..2 index the magnitudes.
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_VALUES = torch.tensor(_E2M1 + tuple(-v for v in _E2M1), dtype=torch.float32)


def quant_config(target_dir: str) -> dict | None:
    """The `quantization` block of hf_quant_config.json (or config.json's quantization_config); None if plain."""
    hf_quant = os.path.join(target_dir, "hf_quant_config.json")
    if os.path.isfile(hf_quant):
        try:
            with open(hf_quant) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{hf_quant} is unreadable: {e} (re-export the target with dflash-build)") from None
        q = data.get("quantization") if isinstance(data, dict) else None
        if not isinstance(q, dict):
            raise CheckpointError(f"{hf_quant} has no 'quantization' object: not a ModelOpt export")
        return q
    cfg_path = os.path.join(target_dir, "config.json")
    if not os.path.isfile(cfg_path):
        return None
    try:
        with open(cfg_path) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None  # the config reader reports unreadable configs with its own message
    q = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    if not q:
        return None
    method = q.get("quant_method")
    if method != "modelopt":
        raise CheckpointError(f"target {target_dir} is quantized with {method!r}, which this runtime cannot read: "
                              "give a bf16/fp32 checkpoint or a ModelOpt FP8/NVFP4 export (dflash-build)")
    return {"quant_algo": q.get("quant_algo"), "kv_cache_quant_algo": None, "group_size": q.get("group_size")}


def is_quantized(target_dir: str) -> bool:
    """True for a ModelOpt export (hf_quant_config.json, or config.json with a quantization_config)."""
    if os.path.isfile(os.path.join(target_dir, "hf_quant_config.json")):
        return True
    cfg_path = os.path.join(target_dir, "config.json")
    try:
        with open(cfg_path) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and bool(cfg.get("quantization_config"))


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """float8_e4m3fn weight times its fp32 scale (a scalar, or one per output row)."""
    s = scale.float()
    if s.numel() > 1:
        if s.numel() != weight.shape[0]:
            raise CheckpointError(f"FP8 weight_scale has {s.numel()} values for a weight of shape "
                                  f"{list(weight.shape)}: expected a scalar or one per output row")
        s = s.reshape(-1, *([1] * (weight.dim() - 1)))
    return (weight.float() * s).to(dtype)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> float32 [..., K]; the low nibble holds the even element."""
    lo = (packed & 0x0F).long()
    hi = (packed >> 4).long()
    codes = torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    return E2M1_VALUES[codes]


def dequantize_nvfp4(packed: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor,
                     dtype: torch.dtype = torch.float32, block_size: int = NVFP4_BLOCK) -> torch.Tensor:
    """NVFP4: e2m1 codes * per-block fp8 scale * per-tensor fp32 scale_2."""
    if packed.dtype != torch.uint8:
        raise CheckpointError(f"NVFP4 weight must be uint8 (packed e2m1), got {packed.dtype}")
    values = unpack_e2m1(packed)
    k = values.shape[-1]
    blocks = -(-k // block_size)
    if tuple(scale.shape) != (*values.shape[:-1], blocks):
        raise CheckpointError(f"NVFP4 weight_scale has shape {list(scale.shape)}, expected "
                              f"{[*values.shape[:-1], blocks]} for a weight of {k} input features")
    per_block = scale.float() * scale_2.float()
    full = per_block.repeat_interleave(block_size, dim=-1)[..., :k]
    return (values * full).to(dtype)


def load_quantized_state_dict(target_dir: str, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A ModelOpt export's weights, dequantised to `dtype`, under the plain Hugging Face names."""
    q = quant_config(target_dir) or {}
    algo = q.get("quant_algo")
    if algo not in SUPPORTED_QUANT_ALGOS:
        raise CheckpointError(f"target {target_dir} uses ModelOpt quant_algo {algo!r}, which this runtime cannot "
                              "read: rebuild it with dflash-build --quantization fp8 or nvfp4")
    raw = load_state_dict(target_dir, "target")
    out: dict[str, torch.Tensor] = {}
    for name, t in raw.items():
        if name.endswith(SCALE_SUFFIXES):
            continue
        if name.endswith(".pre_quant_scale"):
            raise CheckpointError(f"target tensor {name} is an AWQ/SmoothQuant pre-scale, which this runtime "
                                  "cannot read: rebuild with dflash-build --quantization fp8 or nvfp4")
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if t.dtype == torch.uint8:
            scale, scale_2 = raw.get(f"{base}.weight_scale"), raw.get(f"{base}.weight_scale_2")
            if base is None or scale is None or scale_2 is None:
                raise CheckpointError(f"target tensor {name} is packed uint8 but its weight_scale/weight_scale_2 "
                                      "are missing: the export is incomplete, re-run dflash-build")
            out[name] = dequantize_nvfp4(t, scale, scale_2, dtype, int(q.get("group_size") or NVFP4_BLOCK))
        elif t.dtype == torch.float8_e4m3fn:
            # fused 3-D expert tensors (gpt-oss `experts.gate_up_proj`) carry `<name>_weight_scale`
            scale = raw.get(f"{base}.weight_scale") if base else raw.get(f"{name}_weight_scale")
            if scale is None:
                raise CheckpointError(f"target tensor {name} is float8 but {base}.weight_scale is missing: "
                                      "the export is incomplete, re-run dflash-build")
            out[name] = dequantize_fp8(t, scale, dtype)
        elif t.is_floating_point():
            out[name] = t.to(dtype)
        else:
            raise CheckpointError(f"target tensor {name} has dtype {t.dtype}, which no supported ModelOpt "
                                  "format uses: rebuild with dflash-build --quantization fp8 or nvfp4")
    return out
