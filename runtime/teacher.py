"""Teacher-forced target passes over whole sequences (logit checks, drafter training features)."""
from __future__ import annotations

import torch

from .attention import AttentionBatch
from .kv_cache import allocate_caches
from .models.target import TargetModel


@torch.inference_mode()
def teacher_forward(target: TargetModel, seqs: list[list[int]], capture: bool = False, page: int = 16,
                    logits: bool = True):
    """Runs every sequence from position 0 in one packed pass with a scratch cache.

    Returns (final-normed hidden [T, H], logits [T, V] or None, captured features [T, n*H] or None), rows in
    packed order.
    """
    cfg = target.cfg
    dev = target.head_weight.device
    blocks = [-(-len(s) // page) for s in seqs]
    caches = allocate_caches(sum(blocks), page, cfg.cache_layers(),
                             target.head_weight.dtype, dev)
    meta, first = [], 0
    for s, nb in zip(seqs, blocks):
        meta.append((len(s), len(s), list(range(first, first + nb))))
        first += nb
    batch = AttentionBatch.build(meta, page, dev)
    ids = torch.tensor([t for s in seqs for t in s], device=dev)
    pos = torch.tensor([i for s in seqs for i in range(len(s))], device=dev)
    hidden, feats = target(ids, pos, caches, batch, capture=capture)
    return hidden, (target.logits(hidden) if logits else None), feats
