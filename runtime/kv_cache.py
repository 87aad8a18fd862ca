"""Paged caches: pools of fixed-size blocks addressed by per-sequence block tables.

A block of the main pool holds `block_size` consecutive positions of one sequence in BOTH the target KV cache
and the drafter's context cache (the drafter's context length always equals the target's committed length), so
one block table and one free list serve both. Targets with sliding-window layers (gpt-oss, Gemma 3, windowed
Qwen3-MoE) keep those layers in a second, small pool (`WindowBlockManager`): a request's blocks there are freed
as soon as every position they hold has left the window, so those layers cost a window's worth of blocks per
request instead of a whole sequence's. Hybrid linear-attention targets also give each running request a slot of
their fixed-size state pool (models/gated_deltanet.py LinearStatePool), taken and freed with its blocks.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass

import torch

from .errors import DFlashError


class BlockManager:
    """The main pool. With prefix caching, a full block whose rows are all written (target KV and drafter
    context) is published under a digest of its tokens and every token before them; blocks are reference
    counted, so requests with a common prefix share them, and a released published block stays readable in an
    LRU until its space is needed. A digest names the whole prefix (blake2b over the parent's digest and the
    block's token ids), so one lookup per block finds the longest cached prefix."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.prefix_caching = prefix_caching
        self.ref = [0] * num_blocks
        self.digest_of: dict[int, bytes] = {}  # published block -> its digest
        self.by_digest: dict[bytes, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()  # published blocks no request holds, oldest first
        self.queried_tokens = self.hit_tokens = 0  # prefix-cache lookups (vLLM's prefix_cache_queries / hits)
        self.on_evict = None  # called with a published block before its space goes to another use

    @property
    def num_free(self) -> int:
        return len(self.free) + len(self.lru)

    def _take(self) -> int:
        if self.free:
            b = self.free.pop()
        else:  # the least recently used published block gives its space up
            b, _ = self.lru.popitem(last=False)
            del self.by_digest[self.digest_of.pop(b)]
            if self.on_evict is not None:
                self.on_evict(b)
        self.ref[b] = 1
        return b

    @staticmethod
    def digest(parent: bytes, tokens) -> bytes:
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(array("q", tokens).tobytes())
        return h.digest()

    def match(self, tokens: list[int], max_blocks: int, digests: list[bytes]) -> list[int]:
        """The cached blocks of the longest published prefix of `tokens` (at most max_blocks), now held by the
        caller; `digests` receives their digests (the request's chain, continued by publish)."""
        page, table = self.block_size, []
        self.queried_tokens += max_blocks * page
        parent = b""
        for i in range(max_blocks):
            d = self.digest(parent, tokens[i * page:(i + 1) * page])
            b = self.by_digest.get(d)
            if b is None:
                break
            if self.ref[b] == 0:
                del self.lru[b]
            self.ref[b] += 1
            table.append(b)
            digests.append(d)
            parent = d
        self.hit_tokens += len(table) * page
        return table

    def publish(self, table: list[int], tokens: list[int], upto: int, digests: list[bytes]) -> None:
        """Publish the request's full blocks below position `upto` (rows written for every cache) that are not
        yet: `digests` holds the chain of those already published, in table order."""
        page = self.block_size
        for i in range(len(digests), min(upto // page, len(table))):
            d = self.digest(digests[-1] if digests else b"", tokens[i * page:(i + 1) * page])
            digests.append(d)
            b = table[i]
            if d not in self.by_digest and b not in self.digest_of:  # the same prefix computed twice: keep one
                self.by_digest[d] = b
                self.digest_of[b] = d

    def blocks_needed(self, table: list[int], num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - len(table))

    def can_grow(self, table: list[int], num_tokens: int) -> bool:
        return self.blocks_needed(table, num_tokens) <= self.num_free

    def grow(self, table: list[int], num_tokens: int) -> None:
        """Extend `table` in place to cover positions 0..num_tokens-1."""
        n = self.blocks_needed(table, num_tokens)
        if n > self.num_free:
            raise MemoryError("KV cache exhausted")
        for _ in range(n):
            table.append(self._take())

    def release(self, table: list[int]) -> None:
        for b in reversed(table):
            self.ref[b] -= 1
            if self.ref[b]:
                continue  # another request still reads it
            if b in self.digest_of:
                self.lru[b] = None
            else:
                self.free.append(b)
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
    """A request's blocks in every pool, and its state slot when the target has one: what the scheduler grows,
    trims and frees."""

    def __init__(self, main: BlockManager, window: WindowBlockManager | None = None, state_slots: int = 0):
        self.main, self.window = main, window
        self.block_size = main.block_size
        self.slots = list(range(state_slots - 1, -1, -1)) if state_slots else None

    @property
    def num_blocks(self) -> int:
        return self.main.num_blocks + (self.window.num_blocks if self.window else 0)

    @property
    def num_free(self) -> int:
        return self.main.num_free + (self.window.num_free if self.window else 0)

    def can_grow(self, seq, num_tokens: int) -> bool:
        return self.main.can_grow(seq.block_table, num_tokens) and (
            self.window is None or self.window.can_grow(seq.window_table, num_tokens)) and (
            self.slots is None or seq.state_slot >= 0 or bool(self.slots))

    def grow(self, seq, num_tokens: int) -> None:
        """Cover positions 0..num_tokens-1 (callers check can_grow first)."""
        self.main.grow(seq.block_table, num_tokens)
        if self.window is not None:
            self.window.grow(seq.window_table, num_tokens)
        if self.slots is not None and seq.state_slot < 0:
            seq.state_slot = self.slots.pop()

    def trim(self, seq) -> None:
        if self.window is not None:
            self.window.trim(seq.window_table, seq.num_computed)

    @property
    def prefix_caching(self) -> bool:
        return self.main.prefix_caching

    def cached_prefix(self, seq) -> int:
        """A request about to compute from position 0: take the blocks of its longest cached prefix into its
        table; returns the positions they cover. The last prompt row is always computed (its logits choose the
        first token), so a hit stops a block short of covering it."""
        if not self.prefix_caching or seq.block_table:
            return 0
        seq.block_table = self.main.match(seq.token_ids, (seq.prefill_target - 1) // self.block_size,
                                          seq.block_digests)
        return len(seq.block_table) * self.block_size

    def publish(self, seq, upto: int) -> None:
        """Positions 0..upto-1 of the request hold final rows in the target's caches: share its full blocks among
        requests (a proposer writes the rows its own caches still owe before a hit reads them: Proposer.share)."""
        if self.prefix_caching:  # rows past the last committed token (cut by a stop) hold no token of it
            self.main.publish(seq.block_table, seq.token_ids, min(upto, len(seq.token_ids)), seq.block_digests)

    def published(self, seq) -> set[int]:
        """The request's blocks that the prefix cache keeps readable once the request lets them go."""
        return {b for b in seq.block_table if b in self.main.digest_of} if self.prefix_caching else set()

    def release(self, seq) -> None:
        seq.block_digests.clear()
        self.main.release(seq.block_table)
        if self.window is not None:
            self.window.release(seq.window_table)
        if self.slots is not None and seq.state_slot >= 0:
            self.slots.append(seq.state_slot)
            seq.state_slot = -1


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


@dataclass
class KVPlan:
    """How the cache budget is split: blocks of the main pool (target layers outside the window pool, and the
    drafter's context layers, one block table for both), blocks of the window pool, and which target layers
    live there."""
    page: int
    num_blocks: int
    window_blocks: int
    window: int
    windowed: list[int]  # target layer indices in the window pool
    target_layers: list[tuple[int, ...]]
    draft_layers: list[tuple[int, ...]]
    bytes_per_block: int
    window_bytes: int
    state_slots: int = 0  # a hybrid target's state pool: one slot per running request
    state_bytes: int = 0  # ... and its bytes, counted in the budget
    # blocks past the main pool's in the drafter's caches, never in a block table: where a drafter pass writes
    # its blocks' own K/V (the fused CPU drafter attends to context and block in one kernel over cache slots).
    # Working memory of the pass, like its activations: not cache, not taken from the budget
    draft_scratch_blocks: int = 0

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block + self.window_bytes + self.state_bytes

    @property
    def draft_scratch(self) -> tuple[int, int]:
        """(first slot, slots) of the drafter caches' scratch rows."""
        return self.num_blocks * self.page, self.draft_scratch_blocks * self.page


def plan_kv_pools(target_layers: list[tuple[int, ...]], draft_layers: list[tuple[int, ...]],
                  windows: list[int | None], *, page: int, max_seq_len: int, max_batch_size: int,
                  max_num_tokens: int, dtype: torch.dtype, budget: int | None = None,
                  window_cache: bool = True, state_bytes_per_request: int = 0, draft_scratch_rows: int = 0) -> KVPlan:
    """target_layers: (kv_heads, k_dim[, v_dim]) per cached target layer (this rank's heads); windows: each
    cached layer's sliding window or None. budget: bytes for all pools (default: max_batch_size sequences of
    max_seq_len, the main pool capped at 2 GiB). state_bytes_per_request: a hybrid's fixed per-request state,
    max_batch_size slots of it taken from the budget first."""
    windowed = [i for i, w in enumerate(windows) if w] if window_cache else []
    window = max((windows[i] for i in windowed), default=0)
    per_seq = -(-max_seq_len // page) + 1
    if windowed and -(-window // page) + 2 >= per_seq:  # the window holds a whole sequence: no pool of its own
        windowed, window = [], 0
    main_layers = [t for i, t in enumerate(target_layers) if i not in windowed]
    per_block = bytes_per_block(page, main_layers + draft_layers, dtype)
    w_blocks = w_bytes = 0
    if windowed:  # every running request's window plus one step's rows, and the reserved null block
        w_blocks = max_batch_size * (-(-window // page) + 2) + -(-max_num_tokens // page) + 1
        w_bytes = w_blocks * bytes_per_block(page, [target_layers[i] for i in windowed], dtype)
    s_bytes = state_bytes_per_request * max_batch_size
    budget = budget or min(2 << 30, per_block * max_batch_size * per_seq) + w_bytes + s_bytes
    # every layer windowed and no drafter: the main pool holds no bytes, its tables only count positions
    num_blocks = max(budget - w_bytes - s_bytes, 0) // per_block if per_block else max_batch_size * per_seq
    if num_blocks * page < max_seq_len + page:
        raise DFlashError(f"KV cache of {budget} bytes holds {num_blocks * page} positions, fewer than "
                          f"max_seq_len {max_seq_len}: raise kv_cache_bytes or lower max_seq_len")
    scratch = -(-draft_scratch_rows // page) if draft_layers else 0
    return KVPlan(page, num_blocks, w_blocks, window, windowed, list(target_layers), list(draft_layers),
                  per_block, w_bytes, max_batch_size if s_bytes else 0, s_bytes, scratch)


def allocate_pools(plan: KVPlan, dtype, device, prefix_caching: bool = False):
    """The block managers and the caches: (CacheBlocks, target caches per layer, drafter caches per layer)."""
    page, windowed = plan.page, plan.windowed
    blocks = CacheBlocks(BlockManager(plan.num_blocks, page, prefix_caching),
                         WindowBlockManager(plan.window_blocks, page, plan.window) if windowed else None,
                         plan.state_slots)
    main = iter(allocate_caches(plan.num_blocks, page, [t for i, t in enumerate(plan.target_layers)
                                                          if i not in windowed], dtype, device))
    win = iter(allocate_caches(plan.window_blocks, page, [plan.target_layers[i] for i in windowed], dtype, device)
               if windowed else [])
    t_caches = [next(win) if i in windowed else next(main) for i in range(len(plan.target_layers))]
    d_caches = (allocate_caches(plan.num_blocks + plan.draft_scratch_blocks, page, plan.draft_layers, dtype, device)
                if plan.draft_layers else [])
    return blocks, t_caches, d_caches
