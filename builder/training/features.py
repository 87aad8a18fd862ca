"""Stage 1 of training: the frozen target's context features for every position, computed once.

Each shard is a safetensors file holding, for a group of sequences, the packed token ids, the per-sequence
offsets and prompt lengths, and the outputs of the drafter's target layers (float16, [T, n*H]).
Shards are written atomically and skipped when present, so the stage resumes where it stopped.
"""
from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open
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
                         seqs_per_shard: int = 64, max_len: int = 1024, full_only: bool = False,
                         log=print) -> list[str]:
    """Every record in exactly one shard: shards already written are kept (and skipped), the records none of them
    holds go to new shards numbered after them. Membership is read from each shard (its record ids, or for shards
    of older runs its token sequences), not from positions: data that grows out of id order (newest-first prompts,
    Magpie requests) would otherwise shift records between shards. full_only (data still growing): no partial last
    shard, unless there is no shard yet."""
    from ...config import TargetConfig
    from ...loader import ModelPaths, load_models
    from ...teacher import teacher_forward

    os.makedirs(out_dir, exist_ok=True)
    seq_of = lambda r: (r["prompt_ids"] + r["output_ids"])[:max_len]  # noqa: E731
    paths = sorted(os.path.join(out_dir, f) for f in os.listdir(out_dir)
                   if f.startswith("shard_") and f.endswith(".safetensors"))
    by_tokens = {tuple(seq_of(r)): r["id"] for r in records}
    held = set()
    for path in paths:
        held.update(shard_record_ids(path, by_tokens))
    todo = [r for r in records if r["id"] not in held]
    nxt = int(os.path.basename(paths[-1])[6:11]) + 1 if paths else 0
    tcfg = TargetConfig.from_dir(target_dir)
    target = None
    for s in range(0, len(todo), seqs_per_shard):
        group = todo[s:s + seqs_per_shard]
        if full_only and len(group) < seqs_per_shard and paths:
            break
        if target is None:
            target, _ = load_models(ModelPaths(target_dir, None), tcfg, None, torch.float32, "cpu")
            target.capture_ids = list(layer_ids)
        seqs = [seq_of(r) for r in group]
        feats = []
        for i in range(0, len(seqs), 8):  # 8 sequences per pass bounds the scratch cache
            _, _, f = teacher_forward(target, seqs[i:i + 8], capture=True, logits=False)
            feats.append(f.half())
        lens = torch.tensor([len(q) for q in seqs])
        tensors = {"ids": torch.tensor([t for q in seqs for t in q], dtype=torch.int32),
                   "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]),
                   "prompt_lens": torch.tensor([len(r["prompt_ids"]) for r in group]),
                   "record_ids": torch.tensor([r["id"] for r in group], dtype=torch.long),
                   "features": torch.cat(feats)}
        path = os.path.join(out_dir, f"shard_{nxt:05d}.safetensors")
        nxt += 1
        save_file(tensors, path + ".tmp", metadata={"layer_ids": json.dumps(list(layer_ids))})
        os.replace(path + ".tmp", path)
        paths.append(path)
        log(f"features: shard {len(paths)} ({int(lens.sum())} tokens)")
    return paths


def shard_record_ids(path: str, by_tokens: dict[tuple, int]) -> list[int]:
    """The record ids a shard holds; shards written before record_ids existed are matched by their tokens."""
    with safe_open(path, "pt") as f:
        if "record_ids" in f.keys():
            return f.get_tensor("record_ids").tolist()
        ids, off = f.get_tensor("ids").tolist(), f.get_tensor("offsets").tolist()
    found = (by_tokens.get(tuple(ids[off[i]:off[i + 1]])) for i in range(len(off) - 1))
    return [r for r in found if r is not None]


def load_shard(path: str) -> list[dict]:
    t = load_file(path)
    out, off = [], t["offsets"].tolist()
    for i in range(len(off) - 1):
        out.append({"ids": t["ids"][off[i]:off[i + 1]].long(), "features": t["features"][off[i]:off[i + 1]],
                    "prompt_len": int(t["prompt_lens"][i])})
    return out
