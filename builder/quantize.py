"""The target half of an engine directory: a BF16 copy, or a ModelOpt FP8 / NVFP4 unified HF export.

ModelOpt 0.47 on CPU (see shared/docs/environment.md), worked around here:
- `import modelopt.torch.quantization` needs `requests` (checked before any work, in validate.check_modelopt);
- `export_hf_checkpoint` needs `model.config.architectures` (set from model_type when the config lacks it);
- NVFP4: calibration and export work on CPU, but any forward AFTER `mtq.quantize` asserts "amax must be a CUDA
  tensor": the forward loop runs only inside `mtq.quantize`, and nothing runs the quantized model afterwards;
- ModelOpt prints to stdout and warns about untested transformers versions: stdout goes to stderr, warnings off.
transformers cannot reload these exports correctly, so nothing here reads them back through transformers
(the runtime uses dflash_trt.quantized).
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import tempfile
import warnings

from .calib import TOKENIZER_FILES, Tokenize
from .errors import BuildError
from .progress import Progress, quiet_stdout
from .validate import BuildPlan


def copy_tokenizer_files(src: str, dst: str, overwrite: bool = False) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        s, d = os.path.join(src, name), os.path.join(dst, name)
        if os.path.isfile(s) and (overwrite or not os.path.exists(d)):
            shutil.copyfile(s, d)
            copied.append(name)
    return copied


def set_dtype(cfg: dict, dtype: str) -> dict:
    cfg = dict(cfg)
    cfg["dtype"] = dtype
    if "torch_dtype" in cfg:
        cfg["torch_dtype"] = dtype
    return cfg


def write_target_bf16(plan: BuildPlan, dst: str, progress: Progress) -> dict:
    """Same tensor names and sharding as the source, every floating tensor in bfloat16."""
    import torch
    from safetensors.torch import save_file

    from dflash_trt.checkpoint import iter_tensors, safetensors_files

    os.makedirs(dst)
    files = safetensors_files(plan.target, "target")
    total = 0
    with progress.task("target: bf16 copy", total=len(files)) as advance:
        current, tensors = None, {}

        def flush():
            nonlocal total
            if current is not None:
                save_file(tensors, os.path.join(dst, os.path.basename(current)), metadata={"format": "pt"})
                total += sum(t.numel() * t.element_size() for t in tensors.values())
                advance()

        for name, handle, file in iter_tensors(plan.target, "target"):
            if file != current:
                flush()
                current, tensors = file, {}
            t = handle.get_tensor(name)
            tensors[name] = (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
        flush()
    index = os.path.join(plan.target, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            idx = json.load(f)
        idx.setdefault("metadata", {})["total_size"] = total
        with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
            json.dump(idx, f, indent=2)
    cfg = set_dtype(plan.target_raw, "bfloat16")
    cfg.setdefault("architectures", [plan.architecture])
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    copy_tokenizer_files(plan.target, dst)
    return {"modelopt": None, "calibration": None}


@contextlib.contextmanager
def transformers_view(plan: BuildPlan):
    """The directory transformers loads the target from. transformers picks its checkpoint -> model weight
    conversion (DeepSeek-V3: per-expert tensors -> fused gate_up_proj / down_proj) by the config's model_type, and
    has none for `kimi_k2` (the release ships remote code): loaded as is, Kimi K2's routed experts come out MISSING
    and randomly initialised. So a kimi_k2 target is shown as what it is, a deepseek_v3 checkpoint: a temporary
    directory whose config.json says so (without the remote-code auto_map) and whose other files are symlinks."""
    raw = plan.target_raw or {}
    if raw.get("model_type") != "kimi_k2":
        yield plan.target
        return
    with tempfile.TemporaryDirectory(prefix="dflash-kimi-k2-as-deepseek-v3-") as tmp:
        for name in os.listdir(plan.target):
            if name != "config.json":
                os.symlink(os.path.join(plan.target, name), os.path.join(tmp, name))
        cfg = {k: v for k, v in raw.items() if k != "auto_map"}
        cfg["model_type"] = "deepseek_v3"
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        yield tmp


def _extra_layer(name: str, num_layers: int) -> bool:
    """A tensor of a layer past num_hidden_layers (DeepSeek-V3's multi-token-prediction layers): not part of the
    model: transformers' own pattern ignores the release's (layer 61), and our runtime ignores them."""
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return m is not None and int(m.group(1)) >= num_layers


def check_loading_info(plan: BuildPlan, info: dict, cls: str) -> None:
    """Refuse to quantize a model transformers did not fill from the checkpoint: a missing weight is randomly
    initialised (and would be exported as such), an unexpected one means the checkpoint was misread."""
    layers = (plan.target_raw or {}).get("num_hidden_layers") or 0
    missing = sorted(info.get("missing_keys") or [])
    unexpected = sorted(k for k in info.get("unexpected_keys") or [] if not _extra_layer(k, layers))
    mismatched = sorted(str(k[0] if isinstance(k, (tuple, list)) else k) for k in info.get("mismatched_keys") or [])
    problems = [f"{len(v)} {what} (e.g. {v[0]})" for what, v in (("missing", missing), ("unexpected", unexpected),
                                                                ("mis-shaped", mismatched)) if v]
    if problems:
        raise BuildError(f"--target {plan.target} does not load cleanly into transformers' {cls} for quantization "
                         f"({', '.join(problems)} weights): transformers would initialise the missing ones randomly "
                         "and the export would hold them, so nothing was written (give a complete Hugging Face "
                         "checkpoint whose tensor names match its model_type)")


def _modelopt_config(mtq, quantization: str, kv_cache_dtype: str) -> dict:
    if quantization == "fp8":
        cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    elif quantization == "nvfp4":
        cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    else:  # bf16 weights, FP8 KV cache only
        cfg = {"quant_cfg": None, "algorithm": "max"}
    if kv_cache_dtype == "fp8":
        cfg = mtq.update_quant_cfg_with_kv_cache_quant(cfg, copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"]))
    return cfg


def write_target_modelopt(plan: BuildPlan, dst: str, texts: list[str], tokenize: Tokenize,
                          progress: Progress) -> dict:
    import torch

    with warnings.catch_warnings(), quiet_stdout():
        warnings.simplefilter("ignore")
        import transformers
        from transformers import AutoModelForCausalLM

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        import modelopt
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint

        cuda = torch.cuda.is_available()
        with progress.task("target: loading (bf16)"), transformers_view(plan) as path:
            model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, output_loading_info=True,
                                                               device_map="auto" if cuda else None)
            check_loading_info(plan, info, type(model).__name__)
            model.eval()
        if not getattr(model.config, "architectures", None):
            model.config.architectures = [plan.architecture]  # export_hf_checkpoint crashes without it
        device = next(model.parameters()).device
        samples = [ids for ids in (tokenize(t) for t in texts) if ids]
        if not samples:
            raise BuildError("calibration texts tokenized to nothing: give --calib-data with longer texts")
        n_tokens = sum(len(s) for s in samples)

        def forward_loop(m):
            # The ONLY forward passes on the quantized model: NVFP4's fake-quant forward needs CUDA after this.
            with torch.no_grad(), progress.task(f"calibrating ({n_tokens} tokens)", total=len(samples)) as adv:
                for ids in samples:
                    m(torch.tensor([ids], dtype=torch.long, device=device))
                    adv()

        cfg = _modelopt_config(mtq, plan.quantization, plan.kv_cache_dtype)
        mtq.quantize(model, cfg, forward_loop)
        with progress.task("target: ModelOpt export"):
            export_hf_checkpoint(model, export_dir=dst)
    del model
    hf_quant = os.path.join(dst, "hf_quant_config.json")
    if not os.path.isfile(hf_quant):
        raise BuildError("ModelOpt export wrote no hf_quant_config.json: upgrade nvidia-modelopt (0.47 tested)")
    with open(hf_quant) as f:
        q = json.load(f).get("quantization", {})
    copy_tokenizer_files(plan.target, dst)
    return {
        "modelopt": {"version": modelopt.__version__, "quant_algo": q.get("quant_algo"),
                     "kv_cache_quant_algo": q.get("kv_cache_quant_algo"),
                     "exclude_modules": q.get("exclude_modules", [])},
        "calibration": {"source": plan.calib_data or "builtin", "samples": len(samples), "tokens": n_tokens,
                        "tokenizer": tokenize.kind, "max_tokens_per_sample": plan.calib_max_tokens},
    }
