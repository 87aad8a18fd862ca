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


def _token_list(v, vocab_size: int | None) -> str | None:
    """Why v is not a list of token ids, or None when it is one."""
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        return "not a list of integer token ids"
    bad = [t for t in v if t < 0 or (vocab_size is not None and t >= vocab_size)]
    if bad:
        return f"token id {bad[0]} outside the target's vocabulary (0..{vocab_size - 1})" if vocab_size else \
            f"negative token id {bad[0]}"
    return None


def read_records(path: str, vocab_size: int | None = None, log=None) -> list[dict]:
    """The usable records of a JSONL data file ({prompt_ids, output_ids}, optional id / kind / prompt), sorted by
    id; records without an id get their line number. A line that is not a record is an error naming it, except in
    data made by --make-data (a .meta.json beside it), where a kill mid-write can leave a torn line that later
    appends continue: those are skipped and counted. Records with no answer tokens are skipped."""
    from ...errors import DFlashError

    generated = os.path.isfile(path + ".meta.json")
    recs, torn, empty, line_of = [], [], 0, {}
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise DFlashError(f"cannot read training data {path}: {e.strerror}") from None
    with f:
        lines = f.read().split("\n")
    last = len(lines) - (1 if lines and lines[-1] == "" else 0)
    for n, line in enumerate(lines[:last], 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError:
            r = None
        if not isinstance(r, dict):
            if generated or n == last:  # a torn write: the last line, or a line appends continued
                torn.append(n)
                continue
            raise DFlashError(f"{path} line {n} is not a JSON object: each line must be one record "
                              '{"prompt_ids": [...], "output_ids": [...]}')
        for field in ("prompt_ids", "output_ids"):
            why = "missing" if field not in r else _token_list(r[field], vocab_size)
            if why:
                raise DFlashError(f"{path} line {n}: {field} {why}; each record needs prompt_ids and output_ids, "
                                  "lists of the target's token ids")
        if not r["output_ids"]:
            empty += 1
            continue
        rid = r.setdefault("id", n - 1)
        if not isinstance(rid, int) or isinstance(rid, bool):
            raise DFlashError(f"{path} line {n}: id {rid!r} is not an integer")
        if rid in line_of:
            raise DFlashError(f"{path} line {n}: id {rid} is also the id of line {line_of[rid]}; ids must be unique")
        line_of[rid] = n
        recs.append(r)
    if log and torn:
        log(f"{path}: skipped {len(torn)} torn line(s) (line {', '.join(map(str, torn[:5]))}"
            f"{', ...' if len(torn) > 5 else ''}): a write interrupted there")
    if log and empty:
        log(f"{path}: skipped {empty} record(s) with no output_ids")
    recs.sort(key=lambda r: r["id"])
    return recs


def build_feature_shards(target_dir: str, records: list[dict], layer_ids: list[int], out_dir: str,
                         seqs_per_shard: int = 64, max_len: int = 1024, full_only: bool = False,
                         log=print, target=None) -> list[str]:
    """Every record in exactly one shard: shards already written are kept (and skipped), the records none of them
    holds go to new shards numbered after them. Membership is read from each shard (its record ids, or for shards
    of older runs its token sequences), not from positions: data that grows out of id order (newest-first prompts,
    Magpie requests) would otherwise shift records between shards. full_only (data still growing): no partial last
    shard, unless there is no shard yet. target: the loaded target to run (on its device; default: loaded here,
    float32 on the CPU). Features are stored in float16, or bfloat16 for a bfloat16 target (whose residual stream
    can exceed float16's range)."""
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
            feats.append((f if f.dtype == torch.bfloat16 else f.half()).cpu())
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


def load_shard(path: str, by_tokens: dict[tuple, int] | None = None) -> list[dict]:
    """The shard's sequences; each with its record_id when the shard records them (or by_tokens finds them)."""
    t = load_file(path)
    out, off = [], t["offsets"].tolist()
    rids = t["record_ids"].tolist() if "record_ids" in t else None
    for i in range(len(off) - 1):
        s = {"ids": t["ids"][off[i]:off[i + 1]].long(), "features": t["features"][off[i]:off[i + 1]],
             "prompt_len": int(t["prompt_lens"][i])}
        if rids is not None:
            s["record_id"] = rids[i]
        elif by_tokens is not None:
            s["record_id"] = by_tokens.get(tuple(s["ids"].tolist()))
        out.append(s)
    return out
