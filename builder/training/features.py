"""Stage 1 of training: the frozen target's context features for every position, computed once.

Each shard is a safetensors file holding, for a group of sequences, the packed token ids, the per-sequence
offsets and prompt lengths, and the outputs of the drafter's target layers (float16, [T, n*H]).
Shards are written atomically and skipped when present, so the stage resumes where it stopped.
"""
from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file


def read_records(path: str) -> list[dict]:
    recs = []
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("output_ids"):
                recs.append(r)
    recs.sort(key=lambda r: r["id"])
    return recs


def build_feature_shards(target_dir: str, records: list[dict], layer_ids: list[int], out_dir: str,
                         seqs_per_shard: int = 64, max_len: int = 1024, log=print) -> list[str]:
    from ...config import TargetConfig
    from ...loader import ModelPaths, load_models
    from ...teacher import teacher_forward

    os.makedirs(out_dir, exist_ok=True)
    tcfg = TargetConfig.from_dir(target_dir)
    target = None
    paths = []
    for s in range(0, len(records), seqs_per_shard):
        path = os.path.join(out_dir, f"shard_{s // seqs_per_shard:05d}.safetensors")
        paths.append(path)
        if os.path.isfile(path):
            continue
        if target is None:
            target, _ = load_models(ModelPaths(target_dir, None), tcfg, None, torch.float32, "cpu")
            target.capture_ids = list(layer_ids)
        group = records[s:s + seqs_per_shard]
        seqs = [(r["prompt_ids"] + r["output_ids"])[:max_len] for r in group]
        feats = []
        for i in range(0, len(seqs), 8):  # 8 sequences per pass bounds the scratch cache
            _, _, f = teacher_forward(target, seqs[i:i + 8], capture=True, logits=False)
            feats.append(f.half())
        lens = torch.tensor([len(q) for q in seqs])
        tensors = {"ids": torch.tensor([t for q in seqs for t in q], dtype=torch.int32),
                   "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]),
                   "prompt_lens": torch.tensor([len(r["prompt_ids"]) for r in group]),
                   "features": torch.cat(feats)}
        tmp = path + ".tmp"
        save_file(tensors, tmp, metadata={"layer_ids": json.dumps(list(layer_ids))})
        os.replace(tmp, path)
        log(f"features: shard {len(paths)} ({int(lens.sum())} tokens)")
    return paths


def load_shard(path: str) -> list[dict]:
    t = load_file(path)
    out, off = [], t["offsets"].tolist()
    for i in range(len(off) - 1):
        out.append({"ids": t["ids"][off[i]:off[i + 1]].long(), "features": t["features"][off[i]:off[i + 1]],
                    "prompt_len": int(t["prompt_lens"][i])})
    return out
