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
from . import families
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


def release_name(plan: BuildPlan):
    """The tensor name TensorRT-LLM reads for each checkpoint name, or None where the source's names are it.
    Kimi K2.5: its KimiK25ForConditionalGeneration strips `language_model.` and hands the rest to DeepSeek-V3,
    so the language model goes under the release's `language_model.model.layers.*` / `language_model.lm_head.*`
    whatever layout the source has (transformers' save_pretrained writes `blocks`, ModelOpt's export transformers'
    in-memory `model.language_model.*`); other tensors (vision tower, projector) keep their names."""
    if plan.tcfg is None or plan.tcfg.model_type != families.KIMI:
        return None
    src = families.WeightNames(families.KIMI, plan.target_shapes)

    def rename(name: str, names: families.WeightNames = src) -> str:
        c = names.canonical(name)
        return name if c is None else names.spell(c, layout=families.KIMI_RELEASE)
    return rename


def write_target_bf16(plan: BuildPlan, dst: str, progress: Progress) -> dict:
    """Same tensor names (or the names TensorRT-LLM reads: release_name) and sharding as the source, every
    floating tensor in bfloat16."""
    import torch
    from safetensors.torch import save_file

    from dflash_trt.checkpoint import iter_tensors, safetensors_files

    os.makedirs(dst)
    rename = release_name(plan) or (lambda n: n)
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
            tensors[rename(name)] = (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
        flush()
    index = os.path.join(plan.target, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            idx = json.load(f)
        idx.setdefault("metadata", {})["total_size"] = total
        idx["weight_map"] = {rename(k): v for k, v in idx.get("weight_map", {}).items()}
        with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
            json.dump(idx, f, indent=2)
    cfg = set_dtype(plan.target_raw, "bfloat16")
    cfg.setdefault("architectures", [plan.architecture])
    if plan.tcfg is not None and plan.tcfg.model_type in families.TRTLLM_ARCHITECTURE:
        cfg["architectures"] = [plan.architecture]
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
    """A tensor of a layer past num_hidden_layers (DeepSeek-V3's multi-token-prediction layers) or of Qwen3.5's
    `mtp.` block: not part of the model: transformers' own patterns ignore them, and so does our runtime."""
    if name.startswith(("mtp.", "model.mtp.")):
        return True
    m = re.match(r"(?:model\.|model\.language_model\.|language_model\.model\.)(?:layers|blocks)\.(\d+)\.", name)
    return m is not None and int(m.group(1)) >= num_layers


def check_loading_info(plan: BuildPlan, info: dict, cls: str) -> None:
    """Refuse to quantize a model transformers did not fill from the checkpoint: a missing weight is randomly
    initialised (and would be exported as such), an unexpected one means the checkpoint was misread."""
    raw = plan.target_raw or {}
    layers = raw.get("num_hidden_layers") or (raw.get("text_config") or {}).get("num_hidden_layers") or 0
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


def _modelopt_config(mtq, quantization: str, kv_cache_dtype: str, excluded: list | None = None) -> dict:
    if quantization == "fp8":
        cfg = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    elif quantization == "nvfp4":
        cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    else:  # bf16 weights, FP8 KV cache only
        cfg = {"quant_cfg": None, "algorithm": "max"}
    if kv_cache_dtype == "fp8":
        cfg = mtq.update_quant_cfg_with_kv_cache_quant(cfg, copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"]))
    if excluded and isinstance(cfg.get("quant_cfg"), list):  # last: ModelOpt applies the list in order
        cfg["quant_cfg"] = cfg["quant_cfg"] + families.disable_entries(excluded)
    return cfg


def _release_layout(plan: BuildPlan, dst: str) -> None:
    """Rewrite a Kimi K2.5 export into the layout TensorRT-LLM reads (release_name): the language model renamed,
    the vision tower and projector copied from the source as they are there (BF16, unquantized), the
    exclude lists of hf_quant_config.json / config.json renamed to match, and the wrapper's TensorRT-LLM name."""
    import glob

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from dflash_trt.checkpoint import iter_tensors

    rename = release_name(plan)
    if rename is None:
        return
    exported = families.WeightNames(families.KIMI, ["model.language_model.embed_tokens.weight"])
    out_name = lambda n: rename(n, exported)  # noqa: E731
    files = sorted(glob.glob(os.path.join(dst, "*.safetensors")))
    src_names = families.WeightNames(families.KIMI, plan.target_shapes)
    weight_map = {}
    for i, file in enumerate(files):
        with safe_open(file, "pt") as h:
            tensors = {out_name(k): h.get_tensor(k) for k in h.keys() if exported.canonical(k) is not None}
        if i == 0:  # the source's non-language tensors, as released
            for name, handle, _ in iter_tensors(plan.target, "target"):
                if src_names.canonical(name) is None:
                    t = handle.get_tensor(name)
                    tensors[name] = (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
        save_file(tensors, file, metadata={"format": "pt"})
        weight_map |= {k: os.path.basename(file) for k in tensors}
    index = os.path.join(dst, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            idx = json.load(f)
        idx["weight_map"] = dict(sorted(weight_map.items()))
        with open(index, "w") as f:
            json.dump(idx, f, indent=2)

    def module(m: str) -> str:
        for old, new in (("model.vision_tower", "vision_tower"), ("model.mm_projector", "mm_projector")):
            if m.startswith(old):
                return new + m[len(old):]
        c = exported.canonical(m + ".x")  # module names: map as a tensor of the module would be
        return m if c is None else exported.spell(c, layout=families.KIMI_RELEASE)[:-2]

    hf_quant = os.path.join(dst, "hf_quant_config.json")
    with open(hf_quant) as f:
        hq = json.load(f)
    q = hq.get("quantization", {})
    q["exclude_modules"] = [module(m) for m in q.get("exclude_modules", [])]
    with open(hf_quant, "w") as f:
        json.dump(hq, f, indent=2)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    qc = cfg.get("quantization_config") or {}
    if isinstance(qc.get("ignore"), list):
        qc["ignore"] = [module(m) for m in qc["ignore"]]
    if isinstance(qc.get("exclude_modules"), list):
        qc["exclude_modules"] = [module(m) for m in qc["exclude_modules"]]
    cfg["architectures"] = [plan.architecture]
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def write_target_modelopt(plan: BuildPlan, dst: str, texts: list[str], tokenize: Tokenize,
                          progress: Progress) -> dict:
    import torch

    with warnings.catch_warnings(), quiet_stdout():
        warnings.simplefilter("ignore")
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        import modelopt
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint

        cuda = torch.cuda.is_available()
        with progress.task("target: loading (bf16)"), transformers_view(plan) as path:
            auto = getattr(transformers, families.loader_class(plan.tcfg.model_type))
            model, info = auto.from_pretrained(path, dtype=torch.bfloat16, output_loading_info=True,
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

        excluded = families.exclusions(plan.tcfg, plan.quantization)
        cfg = _modelopt_config(mtq, plan.quantization, plan.kv_cache_dtype, excluded)
        mtq.quantize(model, cfg, forward_loop)
        with progress.task("target: ModelOpt export"):
            export_hf_checkpoint(model, export_dir=dst)
    del model
    _release_layout(plan, dst)
    hf_quant = os.path.join(dst, "hf_quant_config.json")
    if not os.path.isfile(hf_quant):
        raise BuildError("ModelOpt export wrote no hf_quant_config.json: upgrade nvidia-modelopt (0.47 tested)")
    with open(hf_quant) as f:
        q = json.load(f).get("quantization", {})
    copy_tokenizer_files(plan.target, dst)
    return {
        "modelopt": {"version": modelopt.__version__, "quant_algo": q.get("quant_algo"),
                     "kv_cache_quant_algo": q.get("kv_cache_quant_algo"),
                     "exclude_modules": q.get("exclude_modules", []),
                     "kept_unquantized": [{"modules": e.modules, "why": e.why} for e in
                                          excluded + families.default_exclusions(plan.tcfg, plan.quantization)]},
        "calibration": {"source": plan.calib_data or "builtin", "samples": len(samples), "tokens": n_tokens,
                        "tokenizer": tokenize.kind, "max_tokens_per_sample": plan.calib_max_tokens},
    }
