"""Writing an engine directory atomically: a temporary directory beside the output, renamed into place at the end.

Layout:
  engine.json          what was built, from what, for which TensorRT-LLM, and the sha256 of every other file
  target/              the target (BF16 copy or ModelOpt FP8/NVFP4 export) + tokenizer files + config
  draft/               the drafter, BF16, z-lab format
  trtllm/dflash.yaml   LLM-API options (speculative_config DFlash, ...), for --config / --extra_llm_api_options
  trtllm/serve.sh, trtllm/serve_multinode.sh, trtllm/bench.sh
On any error (or Ctrl-C) the temporary directory, and any parent directory this build created, are removed: no
partial output is ever left behind. With --force an existing output is replaced only once the new one is complete.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import sys
import tempfile

from . import FORMAT_VERSION, trtllm
from .calib import Tokenize
from .draft import write_draft
from .errors import BuildError
from .progress import Progress
from .quantize import write_target_bf16, write_target_modelopt
from .validate import BuildPlan, validate_plan

ENGINE_JSON = "engine.json"
SCRIPTS = ("serve.sh", "serve_multinode.sh", "bench.sh")


def list_files(root: str) -> list[str]:
    """Every regular file under root, relative, '/'-separated, sorted; engine.json itself excluded."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
            if rel != ENGINE_JSON:
                out.append(rel)
    return sorted(out)


def sha256_files(root: str, rels: list[str], progress: Progress, description: str = "hashing") -> dict[str, str]:
    sizes = {r: os.path.getsize(os.path.join(root, r)) for r in rels}
    out = {}
    with progress.task(description, total=sum(sizes.values()) or 1, unit="bytes") as advance:
        for r in rels:
            h = hashlib.sha256()
            with open(os.path.join(root, r), "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    h.update(chunk)
                    advance(len(chunk))
            out[r] = h.hexdigest()
    return out


def _write_trtllm(plan: BuildPlan, dst: str, final_output: str) -> None:
    from dflash_trt import __version__

    os.makedirs(dst)
    d = plan.dcfg
    ep = plan.ep_size if plan.tcfg.moe is not None else None  # dense targets: no MoE settings at all
    opts = trtllm.llm_api_options(
        draft_dir=os.path.join(final_output, "draft"), max_draft_len=plan.max_draft_len,
        mask_token_id=d.mask_token_id, target_layer_ids=d.target_layer_ids, max_seq_len=plan.max_seq_len,
        max_batch_size=plan.max_batch_size, max_num_tokens=plan.max_num_tokens, kv_cache_dtype=plan.kv_cache_dtype,
        ep_size=ep)
    header = (f"# TensorRT-LLM {trtllm.TRTLLM_VERSION} LLM-API options written by dflash-build {__version__}.\n"
              f"# trtllm-serve serve <engine>/target --backend pytorch --tp_size {plan.tp_size} --config dflash.yaml\n")
    with open(os.path.join(dst, "dflash.yaml"), "w") as f:
        f.write(header + trtllm.to_yaml(opts))
    common = dict(tool_version=__version__, tp_size=plan.tp_size, max_seq_len=plan.max_seq_len,
                  max_batch_size=plan.max_batch_size, max_num_tokens=plan.max_num_tokens, ep_size=ep)
    scripts = {
        "serve.sh": trtllm.serve_script(**common),
        "serve_multinode.sh": trtllm.serve_multinode_script(**common),
        "bench.sh": trtllm.bench_script(tool_version=__version__, model_name=os.path.basename(plan.target),
                                        tp_size=plan.tp_size, max_batch_size=plan.max_batch_size, ep_size=ep),
    }
    for name, text in scripts.items():
        path = os.path.join(dst, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)


def engine_record(plan: BuildPlan, target_info: dict, files: dict[str, str]) -> dict:
    from dflash_trt import __version__

    t, d = plan.tcfg, plan.dcfg
    return {
        "format_version": FORMAT_VERSION,
        "tool": {"name": "dflash-build", "version": __version__},
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tensorrt_llm_version": trtllm.TRTLLM_VERSION,
        "sources": {"target": plan.target, "draft": plan.draft,
                    "calib_data": (plan.calib_data or "builtin") if plan.uses_modelopt else None},
        "architecture": plan.architecture,
        "model_type": t.model_type,
        "quantization": plan.quantization,
        "kv_cache_dtype": plan.kv_cache_dtype,
        "tp_size": plan.tp_size,
        "ep_size": plan.ep_size if t.moe is not None else None,
        "moe": None if t.moe is None else {"num_experts": t.moe.num_experts, "experts_per_token": t.moe.top_k},
        "sliding_window": t.sliding_window if t.layer_types and "sliding_attention" in t.layer_types else None,
        "block_size": d.block_size,
        "max_draft_len": plan.max_draft_len,
        "target_layer_ids": list(d.target_layer_ids),
        "mask_token_id": d.mask_token_id,
        "max_seq_len": plan.max_seq_len,
        "max_batch_size": plan.max_batch_size,
        "max_num_tokens": plan.max_num_tokens,
        "draft_dtype": "bfloat16",
        "modelopt": target_info.get("modelopt"),
        "calibration": target_info.get("calibration"),
        "files": files,
    }


def _normalise_modes(root: str) -> None:
    """mkdtemp makes the directory 0700 and safetensors writes 0600: give the usual umask-based modes instead."""
    umask = os.umask(0)
    os.umask(umask)
    for d, _, files in os.walk(root):
        os.chmod(d, 0o777 & ~umask)
        for f in files:
            p = os.path.join(d, f)
            os.chmod(p, (0o777 if os.access(p, os.X_OK) else 0o666) & ~umask)


def _make_parents(path: str) -> list[str]:
    """mkdir -p, returning the directories it created (deepest last) so a failed build can remove them."""
    created = []
    probe = path
    while probe and not os.path.exists(probe):
        created.append(probe)
        probe = os.path.dirname(probe)
    for d in reversed(created):
        os.mkdir(d)
    return list(reversed(created))


def _commit(tmp: str, output: str, force: bool) -> None:
    if not os.path.lexists(output):
        os.rename(tmp, output)
        return
    if not force:  # appeared while we were building
        raise BuildError(f"output {output} already exists: pass --force to replace it, or choose another --output")
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.dflash-old-", dir=os.path.dirname(output))
    os.rmdir(old)
    os.rename(output, old)
    try:
        os.rename(tmp, output)
    except BaseException:
        os.rename(old, output)  # put the previous build back
        raise
    if os.path.isdir(old) and not os.path.islink(old):
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.remove(old)


def build_engine(plan: BuildPlan, progress: Progress | None = None) -> dict:
    """Validate, then write the engine directory. Returns the engine.json record."""
    progress = progress or Progress(enabled=False)
    validate_plan(plan)
    for line in plan.warnings:
        sys.stderr.write(f"warning: {line}\n")
    tokenize = None
    if plan.uses_modelopt:  # the tokenizer is loaded (and checked) before any heavy work
        tokenize = Tokenize(plan.target, plan.tcfg.vocab_size, plan.calib_max_tokens)
    elif plan.calib_data is not None:
        progress.log("note: --calib-data is unused: a bf16 build with --kv-cache-dtype auto needs no calibration")
    output = plan.output
    created = _make_parents(os.path.dirname(output))
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.dflash-tmp-", dir=os.path.dirname(output))
    try:
        if plan.uses_modelopt:
            info = write_target_modelopt(plan, os.path.join(tmp, "target"), plan.calib_texts, tokenize, progress)
        else:
            info = write_target_bf16(plan, os.path.join(tmp, "target"), progress)
        write_draft(plan, os.path.join(tmp, "draft"), progress)
        _write_trtllm(plan, os.path.join(tmp, "trtllm"), output)
        files = sha256_files(tmp, list_files(tmp), progress)
        record = engine_record(plan, info, files)
        with open(os.path.join(tmp, ENGINE_JSON), "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
        _normalise_modes(tmp)
        _commit(tmp, output, plan.force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in reversed(created):
            try:
                os.rmdir(d)
            except OSError:
                pass
        raise
    return record
