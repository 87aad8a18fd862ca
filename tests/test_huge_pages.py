"""Packed CPU weights moved into a transparent-huge-page arena (runtime/huge_pages.py): the same values, every
holder (views, fused stacks) re-pointed, and the arena really backed by 2 MiB pages."""
import pytest
import torch
from torch import nn

from dflash_trt import ops
from dflash_trt.huge_pages import move_to_huge_pages, packed_tensors, thp_mode
from dflash_trt.models.target import FusedProjection, Linear
from dflash_trt.plugins import invariant


def huge_kib(ptr: int) -> int:
    """AnonHugePages of the mapping that holds address ptr."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= ptr < hi
            elif inside and line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a, self.b, self.c = (Linear(1024, 1024) for _ in range(3))
        for m in (self.a, self.b, self.c):
            m.weight.data = torch.randn(1024, 1024, generator=g)
            m.packed = invariant.pack_linear(m.weight.data)
        self.ab = FusedProjection.build([self.a, self.b])  # a and b become views of the fused panels
        self.c.packed = invariant.pack_linear_int8(self.c.weight.data)  # int8 panels and their scales


@pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="this kernel gives no transparent huge pages")
def test_packed_weights_move_to_huge_pages_with_every_holder_repointed():
    was = ops.invariant_enabled()
    assert ops.enable_invariant()
    try:
        check_move()
    finally:
        ops.enable_invariant(was)


def check_move():
    m = Model()
    assert m.ab is not None
    x = torch.randn(3, 1024)
    ys = [m.ab(x)[0], m.ab(x)[1], m.a(x), m.c(x)]
    tensors = packed_tensors(m)
    assert len(tensors) == 5  # the fused panels, the two views, c's panels and its scales, each once
    before = [t.clone() for t in tensors]
    old = [t.data_ptr() for t in tensors]
    moved = move_to_huge_pages(m)
    assert moved >= 3 * 1024 * 1024 * 4 // 4
    for t, b, p in zip(tensors, before, old):
        assert torch.equal(t, b) and t.data_ptr() != p
    # the views still alias the fused panels
    assert m.a.packed.data.untyped_storage().data_ptr() == m.ab.packed.data.untyped_storage().data_ptr()
    assert all(torch.equal(u, v) for u, v in zip([m.ab(x)[0], m.ab(x)[1], m.a(x), m.c(x)], ys))
    assert huge_kib(m.ab.packed.data.data_ptr()) >= 2048, "the arena got no huge pages"


@pytest.mark.skipif(thp_mode() not in ("always", "madvise"), reason="this kernel gives no transparent huge pages")
def test_the_greedy_head_screen_moves_with_the_engines_weights(tmp_path):
    # every decode step streams the screen's int8 codes as it streams the linears: they join the same arena
    import tiny
    from dflash_trt import LLM

    t = tiny.make_target(str(tmp_path / "t"), hidden=128, vocab=512)
    target = LLM(target=t, speculative=False, dtype="bfloat16").engine.target
    screen = target.greedy_screen.screen
    arena = target.head_packed.data.untyped_storage().data_ptr()
    assert screen.data.untyped_storage().data_ptr() == arena
    assert screen.scale.untyped_storage().data_ptr() == arena
