"""`dflash-build --check ENGINE_DIR`: re-hash every file against engine.json and re-validate the pair."""
from __future__ import annotations

import json
import os

from . import FORMAT_VERSION
from .build import ENGINE_JSON, list_files, sha256_files
from .errors import BuildError
from .progress import Progress
from .validate import QUANTIZATIONS, BuildPlan, check_draft, check_lengths, check_tp

REQUIRED = ("target/config.json", "draft/config.json", "draft/model.safetensors")


def required_files(rec: dict) -> tuple[str, ...]:
    """Engines from before the vLLM / SGLang files record no "stacks": they hold the TensorRT-LLM files only."""
    from .stacks import STACK_FILES

    stacks = rec.get("stacks", ["trtllm"])
    if not isinstance(stacks, list) or any(s not in STACK_FILES for s in stacks):
        raise BuildError(f"engine.json stacks {stacks!r} is malformed: {FIX}")
    return REQUIRED + tuple(f for s in stacks for f in STACK_FILES[s])
FIX = "rebuild it with dflash-build --force"


def _read_record(engine_dir: str) -> dict:
    if not os.path.isdir(engine_dir):
        raise BuildError(f"--check {engine_dir}: directory not found (give a directory written by dflash-build)")
    path = os.path.join(engine_dir, ENGINE_JSON)
    if not os.path.isfile(path):
        raise BuildError(f"--check {engine_dir} has no {ENGINE_JSON}: not an engine directory written by "
                         "dflash-build")
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError) as e:
        raise BuildError(f"{path} is unreadable ({e}): the engine directory is corrupted, {FIX}") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("files"), dict):
        raise BuildError(f"{path} has no 'files' table: the engine directory is corrupted, {FIX}")
    if not isinstance(rec.get("format_version"), int) or rec["format_version"] > FORMAT_VERSION:
        raise BuildError(f"{path} has format_version {rec.get('format_version')!r}, this dflash-build reads up to "
                         f"{FORMAT_VERSION}: upgrade dflash-trt or {FIX}")
    return rec


def _verify_hashes(engine_dir: str, rec: dict, progress: Progress) -> int:
    listed = rec["files"]
    present = set(list_files(engine_dir))
    problems = [f"{r} (missing)" for r in sorted(set(listed) - present)]
    problems += [f"{r} (not listed in engine.json)" for r in sorted(present - set(listed))]
    problems += [f"{r} (listed in engine.json, required)" for r in required_files(rec) if r not in listed]
    got = sha256_files(engine_dir, sorted(present & set(listed)), progress, "verifying sha256")
    problems += [f"{r} (sha256 differs)" for r, h in got.items() if h != listed[r]]
    if problems:
        shown = ", ".join(problems[:5]) + (f" and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise BuildError(f"{len(problems)} file(s) in {engine_dir} do not match engine.json: {shown}; "
                         f"the engine directory is corrupted or was edited, {FIX}")
    return len(got)


def _verify_formats(engine_dir: str, rec: dict, plan: BuildPlan) -> None:
    from dflash_trt.checkpoint import tensor_shapes
    from dflash_trt.quantized import is_quantized, quant_config

    target = os.path.join(engine_dir, "target")
    quant, kv = rec.get("quantization"), rec.get("kv_cache_dtype")
    if quant not in QUANTIZATIONS:
        raise BuildError(f"engine.json quantization {quant!r} is unknown: {FIX}")
    q = quant_config(target) if is_quantized(target) else None
    algo = (q or {}).get("quant_algo")
    want = {"bf16": None, "fp8": "FP8", "nvfp4": "NVFP4"}[quant]
    if algo != want:
        raise BuildError(f"engine.json says {quant} but target/ holds quant_algo {algo!r}: {FIX}")
    kv_algo = (q or {}).get("kv_cache_quant_algo")
    if (kv == "fp8") != (kv_algo == "FP8"):
        raise BuildError(f"engine.json kv_cache_dtype {kv!r} but target/ holds kv_cache_quant_algo {kv_algo!r}: {FIX}")
    not_bf16 = [n for n, (_, dt) in tensor_shapes(os.path.join(engine_dir, "draft"), "drafter").items()
                if dt not in ("BF16",)]
    if not_bf16:
        raise BuildError(f"drafter tensor {not_bf16[0]} is not bfloat16: TensorRT-LLM needs a BF16 drafter, {FIX}")
    d = plan.dcfg
    for key, have in (("block_size", d.block_size), ("mask_token_id", d.mask_token_id),
                      ("target_layer_ids", list(d.target_layer_ids))):
        if rec.get(key) != have:
            raise BuildError(f"engine.json {key} {rec.get(key)!r} != drafter config {have!r}: {FIX}")
    if "trtllm" not in rec.get("stacks", ["trtllm"]):
        return
    with open(os.path.join(engine_dir, "trtllm", "dflash.yaml")) as f:
        yaml_text = f.read()
    for needle in ("decoding_type: DFlash", f"max_draft_len: {rec.get('max_draft_len')}",
                   f"max_seq_len: {rec.get('max_seq_len')}"):
        if needle not in yaml_text:
            raise BuildError(f"trtllm/dflash.yaml lacks '{needle}' (engine.json disagrees with it): {FIX}")


def check_engine(engine_dir: str, progress: Progress | None = None) -> dict:
    """Raises a DFlashError on any mismatch; returns a summary dict."""
    progress = progress or Progress(enabled=False)
    engine_dir = os.path.abspath(engine_dir)
    rec = _read_record(engine_dir)
    n_files = _verify_hashes(engine_dir, rec, progress)
    from dflash_trt.loader import ModelPaths, load_configs

    try:
        plan = BuildPlan(target=os.path.join(engine_dir, "target"), draft=os.path.join(engine_dir, "draft"),
                         output=engine_dir, quantization=rec.get("quantization", "bf16"),
                         kv_cache_dtype=rec.get("kv_cache_dtype", "auto"), tp_size=int(rec.get("tp_size", 1)),
                         max_draft_len=rec.get("max_draft_len"), max_seq_len=rec.get("max_seq_len"),
                         max_batch_size=int(rec.get("max_batch_size", 32)), max_num_tokens=rec.get("max_num_tokens"))
    except (TypeError, ValueError) as e:
        raise BuildError(f"engine.json has a malformed field ({e}): {FIX}") from None
    plan.tcfg, plan.dcfg = load_configs(ModelPaths(plan.target, plan.draft))  # validate_pair runs inside
    check_draft(plan)
    check_lengths(plan)
    check_tp(plan)
    _verify_formats(engine_dir, rec, plan)
    return {"engine": engine_dir, "files": n_files, "quantization": plan.quantization,
            "kv_cache_dtype": plan.kv_cache_dtype, "tp_size": plan.tp_size, "architecture": rec.get("architecture"),
            "block_size": plan.dcfg.block_size, "max_draft_len": plan.max_draft_len,
            "max_seq_len": plan.max_seq_len, "tensorrt_llm_version": rec.get("tensorrt_llm_version")}
