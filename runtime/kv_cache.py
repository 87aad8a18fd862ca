"""Paged caches: one pool of fixed-size blocks addressed by per-sequence block tables.

A block holds `block_size` consecutive positions of one sequence in BOTH the target KV cache and the
drafter's context cache (the drafter's context length always equals the target's committed length), so one
block table and one free list serve both.
"""
from __future__ import annotations

import torch

from .errors import DFlashError


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self.free)

    def blocks_needed(self, table: list[int], num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - len(table))

    def can_grow(self, table: list[int], num_tokens: int) -> bool:
        return self.blocks_needed(table, num_tokens) <= len(self.free)

    def grow(self, table: list[int], num_tokens: int) -> None:
        """Extend `table` in place to cover positions 0..num_tokens-1."""
        n = self.blocks_needed(table, num_tokens)
        if n > len(self.free):
            raise MemoryError("KV cache exhausted")
        for _ in range(n):
            table.append(self.free.pop())

    def release(self, table: list[int]) -> None:
        self.free.extend(reversed(table))
        table.clear()


def _dims(layer: tuple[int, ...]) -> tuple[int, int, int]:
    """(kv_heads, head_dim) -> K and V of head_dim; (kv_heads, k_dim, v_dim) as given (v_dim 0: no V cache, the
    layer keeps its values in the K cache, as MLA's latent does)."""
    return (layer[0], layer[1], layer[1]) if len(layer) == 2 else tuple(layer)


def bytes_per_block(block_size: int, layers: list[tuple[int, ...]], dtype: torch.dtype) -> int:
    """layers: (kv_heads, head_dim) or (kv_heads, k_dim, v_dim) per cached layer."""
    elem = torch.empty(0, dtype=dtype).element_size()
    return sum(block_size * kvh * (dk + dv) * elem for kvh, dk, dv in map(_dims, layers))


def allocate_caches(num_blocks: int, block_size: int, layers: list[tuple[int, ...]], dtype, device):
    if num_blocks < 1:
        raise DFlashError("KV cache budget holds no block: raise kv_cache_bytes or lower max_seq_len")
    return [(torch.zeros(num_blocks, block_size, kvh, dk, dtype=dtype, device=device),
             torch.zeros(num_blocks, block_size, kvh, dv, dtype=dtype, device=device))
            for kvh, dk, dv in map(_dims, layers)]
