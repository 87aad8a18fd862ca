"""The packed CPU weights moved into one arena of transparent huge pages.

A decode step streams every packed weight once. On 4 KiB pages that is a TLB miss every 4 KiB, and the hardware
prefetchers stop at each page boundary. With 2 MiB pages both go away: on the 2-core Zen 4 of session 17 a cold
sweep of the embedded target's linears at one row went from 8.23 to 7.59 ms, and at 8 verify rows from 14.30 to
12.38 ms. Linux gives anonymous memory huge pages where THP is `always`, or where it is `madvise` and the
region asks for them (madvise(MADV_HUGEPAGE) before the pages are touched); most distributions ship
`madvise`, and torch's allocator never asks.

The move copies each weight storage into the arena and re-points every tensor on it (`Tensor.set_`), views
and the C++ layer states' handles included (they share the tensor objects), so nothing holding a weight sees
another value, and the bits of every result are unchanged.
"""
from __future__ import annotations

import mmap

import torch

HUGE = 2 << 20
ALIGN = 64  # the kernels' panel loads; torch's own allocations are 64-byte aligned as well


def thp_mode() -> str:
    """Linux's transparent huge page mode: always, madvise or never ('' where it cannot be read)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return ""
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else ""


def packed_tensors(*models) -> list[torch.Tensor]:
    """Every packed weight tensor the models' modules hold (PackedLinear data and scales, the fused stacks
    whose member views the member Linears hold, and the greedy head screen's codes), each tensor object once."""
    from .greedy_head import GreedyHead
    from .plugins.invariant import PackedLinear
    from .models.target import FusedProjection

    seen: dict[int, torch.Tensor] = {}

    def add(p):
        for t in (p.data, p.scale):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                seen.setdefault(id(t), t)

    for model in models:
        if model is None:
            continue
        for module in model.modules():
            for value in vars(module).values():
                if isinstance(value, PackedLinear):
                    add(value)
                elif isinstance(value, FusedProjection):
                    add(value.packed)
                elif isinstance(value, GreedyHead):  # a step streams its codes as well
                    add(value.screen)
    return list(seen.values())


def _aligned(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) // ALIGN * ALIGN


class Arena:
    """One anonymous mapping that asked for huge pages; the storages carved from it keep it alive."""

    def __init__(self, nbytes: int):
        self.map = mmap.mmap(-1, nbytes + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self.map.madvise(mmap.MADV_HUGEPAGE)
        self.bytes = torch.frombuffer(self.map, dtype=torch.uint8)
        self.at = (-self.bytes.data_ptr()) % HUGE  # start on a huge page boundary
        self.storage = self.bytes.untyped_storage()

    def take(self, nbytes: int) -> int:
        """Byte offset of a fresh ALIGN-aligned range of nbytes."""
        off = self.at
        self.at += _aligned(nbytes)
        return off


def move_to_huge_pages(*models) -> int:
    """Moves the models' packed weights into a huge-page arena; returns the bytes moved (0 where Linux gives
    no huge pages)."""
    if thp_mode() not in ("always", "madvise"):
        return 0
    groups: dict[int, list[torch.Tensor]] = {}
    for t in packed_tensors(*models):
        groups.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    if not groups:
        return 0
    olds = [ts[0].untyped_storage() for ts in groups.values()]
    arena = Arena(sum(_aligned(old.nbytes()) for old in olds))
    with torch.no_grad():
        for old, ts in zip(olds, groups.values()):
            off = arena.take(old.nbytes())
            arena.bytes[off:off + old.nbytes()].copy_(torch.empty(0, dtype=torch.uint8).set_(old))
            for t in ts:
                t.set_(arena.storage, off // t.element_size() + t.storage_offset(), t.size(), t.stride())
    return sum(old.nbytes() for old in olds)
