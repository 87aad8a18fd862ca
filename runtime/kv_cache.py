"""Paged caches: pools of fixed-size blocks addressed by per-sequence block tables.

A block of the main pool holds `block_size` consecutive positions of one sequence in BOTH the target KV cache
and the drafter's context cache (the drafter's context length always equals the target's committed length), so
one block table and one free list serve both. Targets with sliding-window layers (gpt-oss, Gemma 3, windowed
Qwen3-MoE) keep those layers in a second, small pool (`WindowBlockManager`): a request's blocks there are freed
as soon as every position they hold has left the window, so those layers cost a window's worth of blocks per
request instead of a whole sequence's.
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


class WindowBlockManager(BlockManager):
    """The sliding-window layers' pool. A table keeps one entry per logical block; entries that fell out of the
    window point at block 0, a reserved block nobody writes (the kernels never read out-of-window keys, and the
    PyTorch path masks them), so the tables stay position-indexed like the main pool's."""

    NULL = 0

    def __init__(self, num_blocks: int, block_size: int, window: int):
        super().__init__(num_blocks, block_size)
        self.free.remove(self.NULL)
        self.num_blocks -= 1  # usable blocks
        self.window = window

    def release(self, table: list[int]) -> None:
        self.free.extend(b for b in reversed(table) if b != self.NULL)
        table.clear()

    def trim(self, table: list[int], num_computed: int) -> None:
        """Free the blocks no future row can see: the next row is at num_computed and sees keys from
        num_computed - window + 1 on."""
        dead = max(0, num_computed - self.window + 1) // self.block_size
        for i in range(min(dead, len(table))):
            if table[i] != self.NULL:
                self.free.append(table[i])
                table[i] = self.NULL

    def in_use(self, table: list[int]) -> int:
        return sum(b != self.NULL for b in table)


class CacheBlocks:
    """A request's blocks in every pool: what the scheduler grows, trims and frees."""

    def __init__(self, main: BlockManager, window: WindowBlockManager | None = None):
        self.main, self.window = main, window
        self.block_size = main.block_size

    @property
    def num_blocks(self) -> int:
        return self.main.num_blocks + (self.window.num_blocks if self.window else 0)

    @property
    def num_free(self) -> int:
        return self.main.num_free + (self.window.num_free if self.window else 0)

    def can_grow(self, seq, num_tokens: int) -> bool:
        return self.main.can_grow(seq.block_table, num_tokens) and (
            self.window is None or self.window.can_grow(seq.window_table, num_tokens))

    def grow(self, seq, num_tokens: int) -> None:
        """Cover positions 0..num_tokens-1 (callers check can_grow first)."""
        self.main.grow(seq.block_table, num_tokens)
        if self.window is not None:
            self.window.grow(seq.window_table, num_tokens)

    def trim(self, seq) -> None:
        if self.window is not None:
            self.window.trim(seq.window_table, seq.num_computed)

    def release(self, seq) -> None:
        seq.ctx_pending = []  # drafter context waiting for these blocks (model_runner.py) goes with them
        self.main.release(seq.block_table)
        if self.window is not None:
            self.window.release(seq.window_table)


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
