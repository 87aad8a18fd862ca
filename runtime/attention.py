"""Attention over a paged KV cache for a packed batch of sequences.

A packed batch is the concatenation of every sequence's new rows (prefill chunk, verify block or one decode
token). Each sequence's K/V live in fixed-size pages addressed by its block table; `kv_slots` lists the flat
cache slots of positions 0..kv_len-1 so one gather reads a whole sequence.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import ops


@dataclass
class SeqSlice:
    q_start: int  # first row of this sequence in the packed batch
    q_len: int  # new rows (their positions are kv_len - q_len .. kv_len - 1)
    kv_len: int  # keys visible to the last row, new rows included
    kv_slots: torch.Tensor  # [kv_len] flat cache slots of positions 0..kv_len-1


@dataclass
class DecodeGroup:
    """Single-row sequences attended in one padded batch (one gather and one SDPA per layer)."""
    rows: torch.Tensor  # [G] packed row of each sequence
    slots: torch.Tensor  # [G, Lmax] cache slots, padded with slot 0
    mask: torch.Tensor  # [G, 1, 1, Lmax] valid keys


@dataclass
class AttentionBatch:
    seqs: list[SeqSlice]
    slot_mapping: torch.Tensor  # [T] flat slot where each new row's K/V is written
    decode: DecodeGroup | None = None
    multi: list[SeqSlice] | None = None  # sequences with several new rows (prefill chunks, verify blocks)
    kernel_args: tuple | None = None  # (q_start, q_len, kv_len, kv_slots, kv_offsets) for the fused kernel

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
        if seqs and ops.paged_attention_kernel() is not None and torch.device(device).type == "cpu":
            offs = [0]
            for s in seqs:
                offs.append(offs[-1] + s.kv_len)
            meta = torch.tensor([[s.q_start, s.q_len, s.kv_len] for s in seqs], dtype=torch.int64).T.contiguous()
            args = (meta[0], meta[1], meta[2], torch.cat([s.kv_slots for s in seqs]), torch.tensor(offs[:-1]))
            return AttentionBatch(seqs, sm, kernel_args=args)  # the fused kernel needs no padded groups
        single = [s for s in seqs if s.q_len == 1]
        decode = None
        if len(single) > 1:
            lmax = max(s.kv_len for s in single)
            slots = torch.zeros(len(single), lmax, dtype=torch.int64, device=device)
            mask = torch.zeros(len(single), 1, 1, lmax, dtype=torch.bool, device=device)
            for i, s in enumerate(single):
                slots[i, :s.kv_len] = s.kv_slots
                mask[i, ..., :s.kv_len] = True
            rows = torch.tensor([s.q_start for s in single], device=device)
            decode = DecodeGroup(rows, slots, mask)
        multi = [s for s in seqs if s.q_len > 1 or decode is None]
        return AttentionBatch(seqs, sm.to(device), decode, multi)


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
    kernel = ops.paged_attention_kernel()
    if kernel is not None and q.device.type == "cpu" and batch.kernel_args is not None:
        return kernel(q, kc, vc, *batch.kernel_args, scale, True)
    out = torch.empty_like(q)
    g = batch.decode
    if g is not None:
        n, lmax = g.slots.shape
        keys = kc.index_select(0, g.slots.flatten()).view(n, lmax, kvh, d).transpose(1, 2).to(q.dtype)
        vals = vc.index_select(0, g.slots.flatten()).view(n, lmax, kvh, d).transpose(1, 2).to(q.dtype)
        qs = q.index_select(0, g.rows)[:, :, None, :]  # [G, H, 1, D]
        o = F.scaled_dot_product_attention(qs, keys, vals, attn_mask=g.mask, scale=scale, enable_gqa=True)
        out.index_copy_(0, g.rows, o[:, :, 0, :])
    for s in batch.multi if batch.multi is not None else batch.seqs:
        keys = kc.index_select(0, s.kv_slots).to(q.dtype)
        vals = vc.index_select(0, s.kv_slots).to(q.dtype)
        qs = q[s.q_start:s.q_start + s.q_len]
        o = F.scaled_dot_product_attention(
            qs.transpose(0, 1)[None], keys.transpose(0, 1)[None], vals.transpose(0, 1)[None],
            attn_mask=causal_mask(s.q_len, s.kv_len, q.device), scale=scale, enable_gqa=True)
        out[s.q_start:s.q_start + s.q_len] = o[0].transpose(0, 1)
    return out
