"""Loading a target + drafter pair (or an engine directory) into our model code, validated first."""
from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from .checkpoint import load_state_dict, safetensors_files, sha256_file, size_problem, tensor_shapes
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
    engine_dir: str | None = None


# -- stage lines ----------------------------------------------------------------------------------------------
_stage_out = None  # where stage lines go (the CLIs: stderr); None: silent, as a library should be


def report_stages(stream=sys.stderr) -> None:
    """Print one line per loading stage (the CLIs call this: loading a large model is otherwise silent)."""
    global _stage_out
    _stage_out = stream
    _deferred.clear()


_deferred: list[str] = []


def stage(message: str, defer: bool = False) -> None:
    """defer: hold the line until the next stage, so a bad config (checked after it) still fails in one line."""
    from .distributed import is_driver_process

    if _stage_out is None or not is_driver_process():
        return
    if defer:
        _deferred.append(message)
        return
    for m in [*_deferred, message]:
        print(f"dflash: {m}", file=_stage_out, flush=True)
    _deferred.clear()


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n < 10 << 30 else f"{n / (1 << 30):.1f} GiB"


REBUILD = "rebuild it with dflash-build --force"


def resolve_paths(model: str | None, target: str | None, draft: str | None) -> ModelPaths:
    """`model` may be an engine directory (engine.json) or a plain target directory."""
    if model is not None:
        if target is not None:
            raise CheckpointError("give either an engine/model directory or --target, not both")
        spec = os.path.join(model, "engine.json")
        if os.path.isfile(spec):
            eng = _engine_record(spec)
            d = os.path.join(model, "draft")
            return ModelPaths(os.path.join(model, "target"), draft or (d if os.path.isdir(d) else None), eng,
                              engine_dir=model)
        target = model
    if target is None:
        if draft is not None:
            raise CheckpointError(f"--draft {draft} needs its target: pass --target DIR too (or an engine directory "
                                  "from dflash-build)")
        raise CheckpointError("no model given: pass an engine directory, or --target DIR [--draft DIR]")
    for what, d in (("target", target), ("drafter", draft)):
        if d is not None and not os.path.isdir(d):
            raise CheckpointError(f"{what} directory not found: {d}")
    return ModelPaths(target, draft)


def _engine_record(path: str) -> dict:
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is unreadable ({e}): the engine directory is corrupted, {REBUILD}") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("files", {}), dict):
        raise CheckpointError(f"{path} is not an engine record (a JSON object with a 'files' table): the engine "
                              f"directory is corrupted, {REBUILD}")
    return rec


# -- what is checked at load ------------------------------------------------------------------------------------
VERIFY_MODES = ("sha256", "size", "none")


def verify_files(paths: ModelPaths, mode: str = "sha256") -> None:
    """Before any weight is loaded. "size": every safetensors file of the target and drafter against its own
    header (truncated or padded files). "sha256" also, for an engine directory, every file under target/ and
    draft/ against the sha256 engine.json recorded at build time, hashed in parallel (the reads warm the page
    cache the load then reads from). A plain checkpoint directory records no hashes: sizes only. Not checked:
    bytes changed after this check, in memory or on disk (`dflash-build --check` re-hashes on demand)."""
    if mode not in VERIFY_MODES:
        raise CheckpointError(f"verify_files must be one of {', '.join(VERIFY_MODES)}, got {mode!r}")
    if mode == "none":
        return
    t0 = time.perf_counter()
    skip = "pass --verify-files none (verify_files=\"none\") to skip this check on trusted storage"
    root = paths.engine_dir
    files = [f for what, d in (("target", paths.target), ("drafter", paths.draft)) if d is not None
             for f in safetensors_files(d, what)]
    for f in files:
        why = size_problem(f)
        if why is not None:
            name = os.path.relpath(f, root) if root else f
            fix = f"the engine directory is corrupted, {REBUILD}" if root else "copy or download it again"
            raise CheckpointError(f"weights file {name} is unreadable or damaged ({why}): {fix}; or {skip}")
    listed = (paths.engine or {}).get("files") or {}
    rels = sorted(r for r in listed if r.split("/")[0] in ("target", "draft")) if root and mode == "sha256" else []
    missing = [r for r in rels if not os.path.isfile(os.path.join(root, r))]
    if missing:
        raise CheckpointError(f"engine file {missing[0]} is missing (listed in engine.json): the engine directory is "
                              f"incomplete, {REBUILD}")
    with ThreadPoolExecutor(max_workers=max(1, min(4, len(rels)))) as pool:
        got = dict(zip(rels, pool.map(lambda r: sha256_file(os.path.join(root, r)), rels)))
    bad = [r for r in rels if got[r] != listed[r]]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise CheckpointError(f"engine file {bad[0]}{more} does not match the sha256 engine.json recorded at build "
                              f"time: the engine directory is corrupted or was edited, {REBUILD}; or {skip}")
    nbytes = sum(os.path.getsize(f) for f in files)
    what = f"sha256 of {len(rels)} engine files" if rels else "sizes against their headers"
    stage(f"checked {len(files)} weight files ({mib(nbytes)}): {what}, in {time.perf_counter() - t0:.1f} s",
          defer=True)


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
    t0 = time.perf_counter()
    tcfg = TargetConfig.from_dir(paths.target)
    dcfg = None
    if paths.draft is not None:
        dcfg = DraftConfig.from_dir(paths.draft, num_target_layers=tcfg.num_hidden_layers)
        fc = tensor_shapes(paths.draft, "drafter")
        fc_shape = next((s for n, (s, _) in fc.items() if n in ("fc.weight", "model.fc.weight")), None)
        if fc_shape is None:
            raise CheckpointError(f"drafter {paths.draft} has no fc.weight: not a DFlash drafter checkpoint")
        validate_pair(tcfg, dcfg, fc_in_features=fc_shape[1], max_draft_len=max_draft_len)
        from .draft_vocab import FILE, load_draft_vocab

        if os.path.isfile(os.path.join(paths.draft, FILE)):  # a broken one fails here, before weights are read
            load_draft_vocab(paths.draft, tcfg.vocab_size)
    stage(f"read the configs: target {tcfg.num_hidden_layers} layers, hidden {tcfg.hidden_size}, vocab "
          f"{tcfg.vocab_size}" + (f"; drafter {dcfg.num_hidden_layers} layers, block {dcfg.block_size}" if dcfg else "")
          + f" ({time.perf_counter() - t0:.2f} s)")
    return tcfg, dcfg


def _native_mxfp4(target_dir: str) -> bool:
    with open(os.path.join(target_dir, "config.json")) as f:
        q = json.load(f).get("quantization_config") or {}
    return q.get("quant_method") == "mxfp4"


def load_models(paths: ModelPaths, tcfg: TargetConfig, dcfg: DraftConfig | None, dtype: torch.dtype, device,
                max_positions: int = 4096, dist=None):
    """Build the models, shard them across the ranks when `dist` is given (tensor_parallel.py: modules are
    split after they are built, the model code knows nothing of it), then read only this rank's weights."""
    t0 = time.perf_counter()
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
    stage(f"loaded the target ({_param_bytes(target)}, {dtype}, {device}) in {time.perf_counter() - t0:.1f} s")
    drafter = None
    if dcfg is not None:
        t0 = time.perf_counter()
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
        stage(f"loaded the drafter ({_param_bytes(drafter)}) in {time.perf_counter() - t0:.1f} s")
    return target, drafter


def _param_bytes(module) -> str:
    seen, n = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            n += t.numel() * t.element_size()
    return mib(n)


def prepare_for_device(target, drafter, paths: ModelPaths, cfg, sharded: bool = False) -> tuple[int, bool]:
    """What the loaded models become for this device: packed weights for the batch-invariant CPU kernels, FP8
    weights kept in FP8 (or native FP8 GEMMs), the target's `weights` format, the drafter's draft vocabulary.
    Returns (FP8 linears, native)."""
    from . import ops
    from .draft_vocab import load_draft_vocab
    from .fp8_weights import keep_fp8_weights, use_fp8_matmul
    from .models.target import pack_linears

    if str(cfg.device).startswith("cpu") and cfg.invariant_kernels and ops.enable_invariant():
        target.pack()
        if drafter is not None:
            pack_linears(drafter)
            drafter.fuse()
    fp8 = (0, False)
    if cfg.fp8_weights and not sharded and is_quantized(paths.target):
        native = cfg.fp8_compute if cfg.fp8_compute is not None else ops.fp8_matmul_available(cfg.device)
        fp8 = (use_fp8_matmul(target, paths.target), True) if native else (keep_fp8_weights(target, paths.target),
                                                                          False)
    if cfg.weights != "auto":  # fewer bytes per weight than the checkpoint's (int8_weights.py)
        from .int8_weights import repack_target

        n = repack_target(target, cfg.weights, sharded)
        stage(f"packed {n} target linears as {cfg.weights} weights")
    if drafter is not None and not sharded and cfg.draft_vocab:  # TP keeps the vocab-split head
        ids = load_draft_vocab(paths.draft, target.cfg.vocab_size)
        if ids is not None:
            drafter.use_vocab(ids, target.head_weight)
    from .int8_weights import draft_weights_for, repack_drafter

    draft_mode = draft_weights_for(cfg.weights, cfg.draft_weights)
    if drafter is not None and draft_mode != "auto" and target.head_packed is not None and not sharded:
        stage(f"packed {repack_drafter(drafter, draft_mode)} drafter linears as {draft_mode} weights")
    if not sharded and getattr(target, "head_packed", None) is not None:
        target.prepare_greedy_head()  # the greedy head screen's codes and norms (greedy_head.py), made now
    return fp8
