"""A drafter's optional draft vocabulary: `draft_vocab.json` ({"token_ids": [sorted ids]}) beside its weights.

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
    if directory is None or not os.path.isfile(path):
        return None
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
