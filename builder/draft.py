"""The drafter half of an engine directory: the z-lab format in BF16, never quantized.

TensorRT-LLM slices the drafter's raw projection weights (it fuses K/V across layers), so a quantized drafter would
be misread: every floating tensor is cast to bfloat16 and written under the z-lab names (no `model.` prefix).
"""
from __future__ import annotations

import json
import os
import shutil

from .progress import Progress
from .quantize import set_dtype
from .validate import BuildPlan

SKIP = {"config.json", "model.safetensors.index.json"}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack", ".onnx")
# A speculators-format drafter's tensors that are not drafter weights: the verifier's embedding and head rows it
# keeps beside the body (TensorRT-LLM and z-lab share the target's), and the pruned vocabulary's maps
SPECULATORS_NOT_WEIGHTS = ("embed_tokens.weight", "lm_head.weight", "d2t", "t2d")
# Top-level keys of the speculators layout that the z-lab layout does not have
SPECULATORS_KEYS = ("speculators_model_type", "speculators_version", "speculators_config", "transformer_layer_config",
                    "aux_hidden_state_layer_ids", "draft_vocab_size", "target_hidden_size", "sample_from_anchor",
                    "sliding_window_non_causal", "mask_token_id")


def zlab_config(plan: BuildPlan) -> dict:
    """The drafter's config.json in the z-lab layout TensorRT-LLM reads (DFlashForCausalLM: the decoder fields at
    top level, `block_size` there, `mask_token_id` / `target_layer_ids` in `dflash_config`, 0-based decoder layer
    ids used as they are). A speculators drafter (DraftConfig already read its nested layout, taps as transformers
    hidden_states indices, i.e. z-lab ids + 1) is rewritten so; a z-lab one is kept as released."""
    d = plan.dcfg
    raw = d.raw
    if "speculators_model_type" not in raw:
        return set_dtype(raw, "bfloat16")
    from transformers import AutoConfig

    tl = raw["transformer_layer_config"]
    cfg = AutoConfig.for_model(tl.get("model_type", "qwen3"),
                               **{k: v for k, v in tl.items() if k != "model_type"}).to_dict()
    for k in [k for k in cfg if k in SPECULATORS_KEYS or k.startswith("_")]:
        del cfg[k]
    cfg.update({"architectures": ["DFlashDraftModel"], "block_size": d.block_size,
                "num_target_layers": plan.tcfg.num_hidden_layers,
                "dflash_config": {"mask_token_id": d.mask_token_id, "target_layer_ids": list(d.target_layer_ids)}})
    return set_dtype(cfg, "bfloat16")


def write_draft(plan: BuildPlan, dst: str, progress: Progress) -> dict:
    import torch
    from safetensors.torch import save_file

    from dflash_trt.checkpoint import iter_tensors

    os.makedirs(dst)
    tensors = {}
    speculators = "speculators_model_type" in plan.dcfg.raw
    with progress.task("drafter: bf16 copy"):
        for name, handle, _ in iter_tensors(plan.draft, "drafter"):
            key = name[len("model."):] if name.startswith("model.") else name
            if speculators and (key in SPECULATORS_NOT_WEIGHTS or key.startswith("verifier")):
                continue
            t = handle.get_tensor(name)
            tensors[key] = (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
        save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(zlab_config(plan), f, indent=2)
    for name in sorted(os.listdir(plan.draft)):  # modeling code for auto_map, README, licence, ...
        src = os.path.join(plan.draft, name)
        if name in SKIP or name.endswith(WEIGHT_SUFFIXES) or not os.path.isfile(src) or name.startswith("."):
            continue
        shutil.copyfile(src, os.path.join(dst, name))
    return {"tensors": len(tensors)}
