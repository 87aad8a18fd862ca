"""A drafter's optional draft vocabulary: `draft_vocab.json` ({"token_ids": [sorted ids]}) beside its weights, or
the pruned vocabulary of a speculators-format drafter (`draft_vocab_size` below the target's, `d2t` / `t2d` in its
safetensors).

The tokens the drafter was trained to propose (dflash-train writes the tokens its labels used). Our runtime then
drafts with only those rows of the target's head; the z-lab reference and TensorRT-LLM ignore the file and use
the full head. Output is unaffected either way: drafts are only proposals. JSON, not safetensors, because
TensorRT-LLM reads every *.safetensors of a checkpoint directory as weights.
"""
from __future__ import annotations

import json
import os

import torch

from .errors import CheckpointError

FILE = "draft_vocab.json"


def save_draft_vocab(directory: str, token_ids: torch.Tensor, note: str = "") -> None:
    tmp = os.path.join(directory, FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"note": note, "token_ids": [int(t) for t in token_ids.tolist()]}, f)
    os.replace(tmp, os.path.join(directory, FILE))


def load_draft_vocab(directory: str | None, vocab_size: int) -> torch.Tensor | None:
    path = os.path.join(directory or "", FILE)
    if directory is None:
        return None
    if not os.path.isfile(path):
        return speculators_vocab(directory, vocab_size)
    fix = "fix or delete the file to draft with the full vocabulary"
    try:
        with open(path) as f:
            ids = torch.tensor(json.load(f)["token_ids"], dtype=torch.int64)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"{path} is unreadable ({type(e).__name__}: {e}): {fix}") from None
    if ids.dim() != 1 or ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size \
            or not bool((ids[1:] > ids[:-1]).all()):
        raise CheckpointError(f"{path}: token_ids must be a non-empty sorted list of unique ids below the "
                              f"target's vocabulary size {vocab_size}: {fix}")
    return ids


def speculators_vocab(directory: str, vocab_size: int) -> torch.Tensor | None:
    """The target ids a speculators drafter drafts among, or None when it does not prune. Its lm_head is the
    target head's rows at those ids (speculators loads it from the verifier through t2d and keeps it frozen), so
    drafting from the target's rows, as with draft_vocab.json, gives its drafts. d2t holds offsets: draft index i
    is target id i + d2t[i] (EAGLE-3's convention, which vLLM applies); t2d marks the same ids."""
    from .checkpoint import iter_tensors
    from .config import read_json

    raw = read_json(os.path.join(directory, "config.json"), what="drafter")
    if raw.get("speculators_model_type") is None:
        return None
    n = raw.get("draft_vocab_size")
    if n is None or n == vocab_size:
        return None
    where = f"{directory} (speculators draft_vocab_size {n})"
    maps = {name: f.get_tensor(name) for name, f, _ in iter_tensors(directory, "drafter") if name in ("d2t", "t2d")}
    if "d2t" not in maps:
        raise CheckpointError(f"{where}: the weights have no d2t map from draft to target ids: give the "
                              "checkpoint's d2t / t2d tensors, or a draft_vocab_size equal to the target's vocabulary")
    ids = torch.arange(int(n), dtype=torch.int64) + maps["d2t"].to(torch.int64).flatten()
    ok = maps["d2t"].numel() == n and 0 < n < vocab_size and int(ids.min()) >= 0 and int(ids.max()) < vocab_size \
        and bool((ids[1:] > ids[:-1]).all())
    t2d = maps.get("t2d")
    if ok and t2d is not None:
        ok = t2d.numel() == vocab_size and torch.equal(t2d.flatten().bool().nonzero().flatten(), ids)
    if not ok:
        raise CheckpointError(f"{where}: d2t must hold {n} offsets mapping draft ids to increasing target ids "
                              f"below {vocab_size}, and t2d mark exactly those ids: the maps are corrupt")
    return ids
