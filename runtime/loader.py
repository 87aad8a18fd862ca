"""Loading a target + drafter pair (or an engine directory) into our model code, validated first."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from .checkpoint import load_state_dict, tensor_shapes
from .config import DraftConfig, TargetConfig, validate_pair
from .errors import CheckpointError
from .models.draft import DFlashDrafter
from .models.registry import build_target
from .quantized import is_quantized, load_quantized_state_dict


@dataclass
class ModelPaths:
    target: str
    draft: str | None
    engine: dict | None = None  # engine.json of a dflash-build directory


def resolve_paths(model: str | None, target: str | None, draft: str | None) -> ModelPaths:
    """`model` may be an engine directory (engine.json) or a plain target directory."""
    if model is not None:
        if target is not None:
            raise CheckpointError("give either an engine/model directory or --target, not both")
        spec = os.path.join(model, "engine.json")
        if os.path.isfile(spec):
            with open(spec) as f:
                eng = json.load(f)
            d = os.path.join(model, "draft")
            return ModelPaths(os.path.join(model, "target"), draft or (d if os.path.isdir(d) else None), eng)
        target = model
    if target is None:
        raise CheckpointError("no model given: pass an engine directory, or --target DIR [--draft DIR]")
    for what, d in (("target", target), ("drafter", draft)):
        if d is not None and not os.path.isdir(d):
            raise CheckpointError(f"{what} directory not found: {d}")
    return ModelPaths(target, draft)


def load_configs(paths: ModelPaths, max_draft_len: int | None = None):
    tcfg = TargetConfig.from_dir(paths.target)
    dcfg = None
    if paths.draft is not None:
        dcfg = DraftConfig.from_dir(paths.draft, num_target_layers=tcfg.num_hidden_layers)
        fc = tensor_shapes(paths.draft, "drafter")
        fc_shape = next((s for n, (s, _) in fc.items() if n in ("fc.weight", "model.fc.weight")), None)
        if fc_shape is None:
            raise CheckpointError(f"drafter {paths.draft} has no fc.weight: not a DFlash drafter checkpoint")
        validate_pair(tcfg, dcfg, fc_in_features=fc_shape[1], max_draft_len=max_draft_len)
    return tcfg, dcfg


def _native_mxfp4(target_dir: str) -> bool:
    with open(os.path.join(target_dir, "config.json")) as f:
        q = json.load(f).get("quantization_config") or {}
    return q.get("quant_method") == "mxfp4"


def load_models(paths: ModelPaths, tcfg: TargetConfig, dcfg: DraftConfig | None, dtype: torch.dtype, device,
                max_positions: int = 4096):
    target = build_target(tcfg, max_positions)
    # ModelOpt FP8/NVFP4 exports: dequantised on load; gpt-oss MXFP4 experts are the model's own business
    quantized = is_quantized(paths.target) and not _native_mxfp4(paths.target)
    target.load_weights(load_quantized_state_dict(paths.target, dtype) if quantized
                        else load_state_dict(paths.target, "target"), dtype)
    target.to(device).eval()
    target.rotary.to(device)
    drafter = None
    if dcfg is not None:
        drafter = DFlashDrafter(dcfg, max_positions)
        drafter.load_weights(load_state_dict(paths.draft, "drafter"), dtype)
        drafter.to(device).eval()
        drafter.rotary.to(device)
        target.capture_ids = list(dcfg.target_layer_ids)
    return target, drafter
