"""Attention over a paged KV cache for a packed batch of sequences.

A packed batch is the concatenation of every sequence's new rows (prefill chunk, verify block or one decode
token). Each sequence's K/V live in fixed-size pages addressed by its block table; `kv_slots` lists the flat
cache slots of positions 0..kv_len-1 so one gather reads a whole sequence.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class SeqSlice:
    q_start: int  # first row of this sequence in the packed batch
    q_len: int  # new rows (their positions are kv_len - q_len .. kv_len - 1)
    kv_len: int  # keys visible to the last row, new rows included
    kv_slots: torch.Tensor  # [kv_len] flat cache slots of positions 0..kv_len-1


@dataclass
class AttentionBatch:
    seqs: list[SeqSlice]
    slot_mapping: torch.Tensor  # [T] flat slot where each new row's K/V is written

    @staticmethod
    def build(rows: list[tuple[int, int, list[int]]], block_size: int, device) -> "AttentionBatch":
        """rows: (q_len, kv_len, block_table) per sequence, in packed order."""
        seqs, mapping, start = [], [], 0
        for q_len, kv_len, table in rows:
            n_blocks = (kv_len + block_size - 1) // block_size
            bt = torch.tensor(table[:n_blocks], dtype=torch.int64)
            slots = (bt[:, None] * block_size + torch.arange(block_size)).flatten()[:kv_len]
            seqs.append(SeqSlice(start, q_len, kv_len, slots.to(device)))
            mapping.append(slots[kv_len - q_len:])
            start += q_len
        sm = torch.cat(mapping) if mapping else torch.zeros(0, dtype=torch.int64)
        return AttentionBatch(seqs, sm.to(device))


def causal_mask(q_len: int, kv_len: int, device) -> torch.Tensor | None:
    if q_len == 1:
        return None
    qpos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    return torch.arange(kv_len, device=device)[None, :] <= qpos


def paged_attention(q, k, v, k_cache, v_cache, batch: AttentionBatch, scale: float) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, KVH, D] new rows; caches: [num_blocks, block_size, KVH, D]. Causal."""
    kvh, d = k_cache.shape[-2], k_cache.shape[-1]
    kc, vc = k_cache.view(-1, kvh, d), v_cache.view(-1, kvh, d)
    kc.index_copy_(0, batch.slot_mapping, k.to(kc.dtype))
    vc.index_copy_(0, batch.slot_mapping, v.to(vc.dtype))
    out = torch.empty_like(q)
    for s in batch.seqs:
        keys = kc.index_select(0, s.kv_slots).to(q.dtype)
        vals = vc.index_select(0, s.kv_slots).to(q.dtype)
        qs = q[s.q_start:s.q_start + s.q_len]
        o = F.scaled_dot_product_attention(
            qs.transpose(0, 1)[None], keys.transpose(0, 1)[None], vals.transpose(0, 1)[None],
            attn_mask=causal_mask(s.q_len, s.kv_len, q.device), scale=scale, enable_gqa=True)
        out[s.q_start:s.q_start + s.q_len] = o[0].transpose(0, 1)
    return out
