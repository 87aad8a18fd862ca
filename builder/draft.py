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


def write_draft(plan: BuildPlan, dst: str, progress: Progress) -> dict:
    import torch
    from safetensors.torch import save_file

    from dflash_trt.checkpoint import iter_tensors

    os.makedirs(dst)
    tensors = {}
    with progress.task("drafter: bf16 copy"):
        for name, handle, _ in iter_tensors(plan.draft, "drafter"):
            key = name[len("model."):] if name.startswith("model.") else name
            t = handle.get_tensor(name)
            tensors[key] = (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
        save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(set_dtype(plan.dcfg.raw, "bfloat16"), f, indent=2)
    for name in sorted(os.listdir(plan.draft)):  # modeling code for auto_map, README, licence, ...
        src = os.path.join(plan.draft, name)
        if name in SKIP or name.endswith(WEIGHT_SUFFIXES) or not os.path.isfile(src) or name.startswith("."):
            continue
        shutil.copyfile(src, os.path.join(dst, name))
    return {"tensors": len(tensors)}
