"""Attention over a paged KV cache for a packed batch of sequences.

A packed batch is the concatenation of every sequence's new rows (prefill chunk, verify block or one decode
token). Each sequence's K/V live in fixed-size pages addressed by its block table; `kv_slots` lists the flat
cache slots of positions 0..kv_len-1 so one gather reads a whole sequence.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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
    # kernel arguments for sliding-window / sink layers, built once per step and shared by those layers
    variants: dict = field(default_factory=dict, repr=False)
    # the same rows addressed through the sliding-window layers' own pool (kv_cache.WindowBlockManager), if any
    windowed: "AttentionBatch | None" = None

    @staticmethod
    def build(rows: list[tuple[int, int, list[int]]], block_size: int, device) -> "AttentionBatch":
        """rows: (q_len, kv_len, block_table) per sequence, in packed order."""
        if rows and ops.paged_attention_kernel() is not None and torch.device(device).type == "cpu":
            # the fused kernel's arguments, made in one op, and no padded groups
            blocks = [b for _, kv_len, table in rows for b in table[:(kv_len + block_size - 1) // block_size]]
            sm, q_start, q_len, kv_len, kv_slots, kv_offsets = ops.attention_args(
                [r[0] for r in rows], [r[1] for r in rows], blocks, block_size)
            seqs, start, at = [], 0, 0
            for q, kv, _ in rows:
                seqs.append(SeqSlice(start, q, kv, kv_slots[at:at + kv]))
                start, at = start + q, at + kv
            return AttentionBatch(seqs, sm, kernel_args=(q_start, q_len, kv_len, kv_slots, kv_offsets))
        seqs, mapping, start = [], [], 0
        for q_len, kv_len, table in rows:
            n_blocks = (kv_len + block_size - 1) // block_size
            bt = torch.tensor(table[:n_blocks], dtype=torch.int64)
            slots = (bt[:, None] * block_size + torch.arange(block_size)).flatten()[:kv_len]
            seqs.append(SeqSlice(start, q_len, kv_len, slots.to(device)))
            mapping.append(slots[kv_len - q_len:])
            start += q_len
        sm = torch.cat(mapping) if mapping else torch.zeros(0, dtype=torch.int64)
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


def causal_mask(q_len: int, kv_len: int, device, window: int | None = None) -> torch.Tensor | None:
    """Row i (position kv_len - q_len + i) sees keys at positions <= its own and, with a window, > pos - window."""
    if q_len == 1 and window is None:
        return None
    qpos = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    kpos = torch.arange(kv_len, device=device)[None, :]
    mask = kpos <= qpos
    return mask if window is None else mask & (kpos > qpos - window)


def paged_attention(q, k, v, k_cache, v_cache, batch: AttentionBatch, scale: float, window: int | None = None,
                    sinks: torch.Tensor | None = None, write: bool = True) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, KVH, D] new rows; caches: [num_blocks, block_size, KVH, D]. Causal.

    window: a sliding-window layer; a row at position p sees only keys at p - window + 1 .. p (HF semantics).
    sinks: [H] per-head logits of a virtual key with a zero value (gpt-oss): they join the softmax denominator.
    write False: the new rows' K/V are already in the cache (a layer reading another layer's cache, Gemma 4's
    shared KV); k and v are ignored.
    """
    if window is not None and batch.windowed is not None:  # this layer's cache is the window pool's
        batch = batch.windowed
    kvh, d = k_cache.shape[-2], k_cache.shape[-1]
    kc, vc = k_cache.view(-1, kvh, d), v_cache.view(-1, kvh, d)
    if write:
        kc.index_copy_(0, batch.slot_mapping, k.to(kc.dtype))
        vc.index_copy_(0, batch.slot_mapping, v.to(vc.dtype))
    kernel = ops.paged_attention_kernel()
    if kernel is not None and q.device.type == "cpu" and batch.kernel_args is not None:
        if window is None and sinks is None:
            return kernel(q, kc, vc, *batch.kernel_args, scale, True)
        return _kernel_variant(kernel, q, kc, vc, batch, scale, window, sinks)
    if window is not None or sinks is not None:
        return _sdpa_variant(q, kc, vc, batch, scale, window, sinks)
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


def _sdpa_variant(q, kc, vc, batch, scale, window, sinks):
    """The PyTorch path (GPUs): a sink is one more key whose value is zero and whose score is its logit."""
    out = torch.empty_like(q)
    for s in batch.seqs:
        keys = kc.index_select(0, s.kv_slots).to(q.dtype)
        vals = vc.index_select(0, s.kv_slots).to(q.dtype)
        mask = causal_mask(s.q_len, s.kv_len, q.device, window)
        if mask is None:
            mask = torch.ones(1, s.kv_len, dtype=torch.bool, device=q.device)
        if sinks is not None:
            keys = torch.cat([keys, keys.new_zeros(1, *keys.shape[1:])])
            vals = torch.cat([vals, vals.new_zeros(1, *vals.shape[1:])])
            bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
            sink = sinks.to(q.dtype)[:, None, None].expand(-1, s.q_len, 1)
            mask = torch.cat([bias[None].expand(sinks.numel(), -1, -1), sink], -1)[None]
        qs = q[s.q_start:s.q_start + s.q_len]
        o = F.scaled_dot_product_attention(
            qs.transpose(0, 1)[None], keys.transpose(0, 1)[None], vals.transpose(0, 1)[None],
            attn_mask=mask, scale=scale, enable_gqa=True)
        out[s.q_start:s.q_start + s.q_len] = o[0].transpose(0, 1)
    return out


def _variant_args(batch: AttentionBatch, window: int | None, sink: bool):
    """Fused-kernel arguments for a window and/or sinks, and (sink only) which cache slots to gather.

    Windowed layers get one kernel item per row (q_len 1, exactly its window's keys): the kernel computes a row
    from its key list alone, so a row gives the same bits in a decode step, a verify block or a prefill chunk.
    With sinks, keys are gathered into a compact buffer whose last row is the sink key; every item lists it first.
    """
    key = (window, sink)
    if key in batch.variants:
        return batch.variants[key]
    q_start, q_len, kv_len, lists, gather = [], [], [], [], []
    base = 0
    for s in batch.seqs:
        first = s.kv_len - s.q_len  # position of the sequence's first new row
        lo_seq = 0 if window is None else max(0, first - window + 1)
        if sink:  # compact index of position x: base + x - lo_seq
            gather.append(s.kv_slots[lo_seq:])
            keys_of = torch.arange(base - lo_seq, base - lo_seq + s.kv_len, device=s.kv_slots.device)
            base += s.kv_len - lo_seq
        else:
            keys_of = s.kv_slots
        if window is None:
            q_start.append(s.q_start), q_len.append(s.q_len), kv_len.append(s.kv_len + sink)
            lists.append(keys_of)
            continue
        pos = torch.arange(first, s.kv_len)
        lo = (pos - window + 1).clamp(min=0)
        n = pos - lo + 1
        idx = lo[:, None] + torch.arange(int(n.max()))[None, :]
        lists.append(keys_of[idx[idx <= pos[:, None]]])
        q_start += range(s.q_start, s.q_start + s.q_len)
        q_len += [1] * s.q_len
        kv_len += (n + sink).tolist()
    dev = batch.slot_mapping.device
    counts = torch.tensor(kv_len, dtype=torch.int64)
    offsets = torch.cumsum(counts, 0) - counts
    slots = torch.cat(lists).to(dev) if lists else torch.zeros(0, dtype=torch.int64, device=dev)
    if sink:  # insert the sink's compact index (= base, one past the gathered keys) before each item's keys
        sink_at = offsets.to(dev)
        full = torch.full((slots.numel() + len(kv_len),), base, dtype=torch.int64, device=dev)
        real = torch.ones_like(full, dtype=torch.bool)
        real[sink_at] = False
        full[real] = slots
        slots = full
    args = (torch.tensor(q_start), torch.tensor(q_len), counts, slots, offsets)
    out = (args, torch.cat(gather) if sink else None)
    batch.variants[key] = out
    return out


def _kernel_variant(kernel, q, kc, vc, batch, scale, window, sinks):
    args, gather = _variant_args(batch, window, sinks is not None)
    if sinks is None:
        return kernel(q, kc, vc, *args, scale, True)
    # The sink as a real key: G = H / KVH extra dims, one-hot per query head in q and the sink logit / scale in
    # the sink key (zero for real keys and for every value), so the kernel's own softmax includes the sink.
    t, h, d = q.shape
    kvh = kc.shape[1]
    g = h // kvh
    keys = torch.zeros(gather.numel() + 1, kvh, d + g, dtype=torch.float32, device=q.device)
    vals = torch.zeros_like(keys)
    keys[:-1, :, :d] = kc.index_select(0, gather)
    vals[:-1, :, :d] = vc.index_select(0, gather)
    keys[-1, :, d:] = sinks.float().view(kvh, g) / scale
    qx = torch.zeros(t, h, d + g, dtype=q.dtype, device=q.device)
    qx[..., :d] = q
    qx[:, torch.arange(h), d + torch.arange(h) % g] = 1
    return kernel(qx, keys, vals, *args, scale, True)[..., :d].contiguous()
