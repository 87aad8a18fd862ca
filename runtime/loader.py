"""Loading a target + drafter pair (or an engine directory) into our model code, validated first."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from .checkpoint import load_state_dict, tensor_shapes
from .config import DraftConfig, TargetConfig, validate_pair
from .errors import CheckpointError
from .models.dflash2 import build_drafter
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


# engine.json's serving limits, applied by every entry point (LLM, dflash-generate, dflash-serve, dflash-bench)
ENGINE_SETTINGS = ("max_batch_size", "max_num_tokens", "max_seq_len", "max_draft_len")


def engine_settings(paths: ModelPaths, explicit: dict) -> dict:
    """Engine keywords: those given explicitly (not None), else the engine directory's engine.json values."""
    out = {k: v for k, v in explicit.items() if v is not None or k not in ENGINE_SETTINGS}
    for k in ENGINE_SETTINGS:
        v = (paths.engine or {}).get(k)
        if k not in out and isinstance(v, int) and v > 0:
            out[k] = v
    return out


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
                max_positions: int = 4096, dist=None):
    """Build the models, shard them across the ranks when `dist` is given (tensor_parallel.py: modules are
    split after they are built, the model code knows nothing of it), then read only this rank's weights."""
    target = build_target(tcfg, max_positions)
    if dist is not None:
        from .tensor_parallel import read_target_state, shard_target

        shard_target(target, dist)
        state = read_target_state(paths, target, dist, dtype)
    else:
        # ModelOpt FP8/NVFP4 exports: dequantised on load; gpt-oss MXFP4 experts are the model's own business
        quantized = is_quantized(paths.target) and not _native_mxfp4(paths.target)
        state = load_quantized_state_dict(paths.target, dtype) if quantized else load_state_dict(paths.target,
                                                                                                "target")
    target.load_weights(state, dtype)
    target.to(device).eval()
    target.rotary.to(device)
    drafter = None
    if dcfg is not None:
        drafter = build_drafter(dcfg, max_positions)  # DFlash or DFlash2, as config.json's architecture says
        if dist is not None:
            from .tensor_parallel import read_draft_state, shard_drafter

            shard_drafter(drafter, dist)
            state = read_draft_state(paths, drafter, dist)
        else:
            state = load_state_dict(paths.draft, "drafter")
        drafter.load_weights(state, dtype)
        drafter.to(device).eval()
        drafter.rotary.to(device)
        target.capture_ids = list(dcfg.target_layer_ids)
    return target, drafter


def prepare_for_device(target, drafter, paths: ModelPaths, cfg, sharded: bool = False) -> tuple[int, bool]:
    """What the loaded models become for this device: packed weights for the batch-invariant CPU kernels, FP8
    weights kept in FP8 (or native FP8 GEMMs), the drafter's draft vocabulary. Returns (FP8 linears, native)."""
    from . import ops
    from .draft_vocab import load_draft_vocab
    from .fp8_weights import keep_fp8_weights, use_fp8_matmul
    from .models.target import pack_linears

    if str(cfg.device).startswith("cpu") and cfg.invariant_kernels and ops.enable_invariant():
        target.pack()
        if drafter is not None:
            pack_linears(drafter)
    fp8 = (0, False)
    if cfg.fp8_weights and not sharded and is_quantized(paths.target):
        native = cfg.fp8_compute if cfg.fp8_compute is not None else ops.fp8_matmul_available(cfg.device)
        fp8 = (use_fp8_matmul(target, paths.target), True) if native else (keep_fp8_weights(target, paths.target),
                                                                          False)
    if drafter is not None and not sharded and cfg.draft_vocab:  # TP keeps the vocab-split head
        ids = load_draft_vocab(paths.draft, target.cfg.vocab_size)
        if ids is not None:
            drafter.use_vocab(ids, target.head_weight)
    return fp8
