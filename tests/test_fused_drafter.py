"""The fused CPU drafter pass (DFlashDrafter with cache scratch rows): every drafter layer in one
fused_decoder_stack, each block attending non-causally to its request's context slots and its own rows, whose
K/V go to scratch rows outside every block table.

It must give the module path's hidden rows (a different attention kernel: equal within rounding), leave every
cached context row as it was, and keep DFlash token-identical to AR. A fused pass that attends causally, or
whose scratch rows overlap the context, fails these tests.
"""
import pytest
import torch

import tiny
from dflash_trt import LLM, SamplingParams, ops

PROMPTS = [[5, 9, 14, 3, 22], list(range(3, 40)), [7, 7, 8]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    assert ops.enable_invariant(), "the batch-invariant kernels must build here"
    root = tmp_path_factory.mktemp("fused_drafter")
    t = tiny.make_target(str(root / "t"), kind="qwen3", head_dim=32, boost_tokens=(11,), boost=5.0)
    d = tiny.make_drafter(str(root / "d"), t, layers=2, block_size=8, mask_token_id=tiny.mask_proposing(t, 11),
                          residual_scale=0.3)
    return t, d


def passes(pair, dtype, *, scratch_at=None):
    """Run DFlash over PROMPTS; at every drafter pass compare the fused pass with the module path on the same
    inputs. Returns (max |difference| / max |hidden|, passes, whether any context row changed, outputs)."""
    t, d = pair
    llm = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=7, dtype=dtype, max_batch_size=4,
              draft_weights="auto")
    prop = llm.engine.proposer
    drafter = prop.drafter
    assert prop.scratch is not None and all(layer.fusable for layer in drafter.layers)
    free = torch.ones(prop.caches[0][0].view(-1, *prop.caches[0][0].shape[-2:]).shape[0], dtype=torch.bool)
    free[prop.scratch] = False  # every row but the plan's scratch rows
    if scratch_at is not None:  # a broken plan: scratch rows inside the pool, over other requests' context
        prop.scratch = torch.arange(scratch_at, scratch_at + prop.scratch.numel())
    forward, worst, count, moved = drafter.forward, [0.0], [0], [False]

    def both(x, pos, caches, slices, scratch=None):
        assert scratch is not None, "the proposer passes its scratch rows"
        ref = forward(x, pos, caches, slices, None)
        before = [c.clone() for layer in caches for c in layer]
        out = forward(x, pos, caches, slices, scratch)
        after = [c for layer in caches for c in layer]
        for b, a in zip(before, after):  # only scratch rows may change
            if not torch.equal(b.flatten(0, 1)[free], a.flatten(0, 1)[free]):
                moved[0] = True
        worst[0] = max(worst[0], ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item())
        count[0] += 1
        return out

    drafter.forward = both
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    assert drafter._stack[1] is not None, "the drafter layers did not run as one stack op"
    return worst[0], count[0], moved[0], [o.token_ids for o in outs]


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_fused_drafter_pass_matches_the_module_path(pair, dtype, tol):
    worst, count, moved, outs = passes(pair, dtype)
    assert count >= 5
    assert worst < tol, f"fused drafter pass differs from the module path by {worst:.3g} (relative)"
    assert not moved, "the fused pass wrote outside its scratch rows"
    ar = LLM(target=pair[0], speculative=False, dtype=dtype).generate(
        PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    assert outs == [o.token_ids for o in ar], "DFlash with the fused drafter differs from AR"


def test_a_causal_fused_pass_would_be_caught(pair, monkeypatch):
    """The comparison above sees a fused pass whose blocks attend causally (the target's mask)."""
    from dflash_trt.plugins import layer

    make = layer.make_state
    monkeypatch.setattr(layer, "make_state", lambda **kw: make(**{**kw, "causal": True}))
    worst, count, _, _ = passes(pair, "float32")
    assert count >= 5 and worst > 1e-3


def test_scratch_over_the_context_would_be_caught(pair):
    """... and one whose block K/V land on cached context rows."""
    _, count, moved, _ = passes(pair, "float32", scratch_at=0)
    assert count >= 5 and moved


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_context_kv_in_one_call_writes_the_layers_own_bits(pair, dtype):
    """write_context projects every drafter layer's context K/V in one kernel call (`context_kv`, the context
    rows being every layer's input): the caches it writes are bit for bit those of each layer's own k and v
    calls, and a layer whose k weight is replaced afterwards is noticed (the fusion is rebuilt from it)."""
    import dataclasses

    t, d = pair
    eng = LLM(target=t, draft=d, dtype=dtype, draft_weights="auto").engine
    dr, caches = eng.proposer.drafter, eng.proposer.caches
    assert dr.context_kv is not None
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(5, dr.fc.weight.shape[1], generator=g).to(dr.fc.weight.dtype)
    pos, slots = torch.arange(10, 15), torch.arange(40, 45)

    def written(fused: bool):
        for layer in caches:
            for c in layer:
                c.zero_()
        saved, calls = dr.context_kv, []
        if not fused:
            dr.context_kv = None
        else:
            real = dr._context_kv
            dr._context_kv = lambda c: calls.append(1) or real(c)
        try:
            dr.write_context(feats, pos, slots, caches)
        finally:
            dr.context_kv = saved
            dr.__dict__.pop("_context_kv", None)
        assert calls == ([1] if fused else [])
        return [c.clone() for layer in caches for c in layer]

    def same(a, b):
        return all(torch.equal(x.view(torch.int16 if x.element_size() == 2 else torch.int32),
                               y.view(torch.int16 if y.element_size() == 2 else torch.int32)) for x, y in zip(a, b))

    one = written(True)
    assert any(c.abs().sum() > 0 for c in one)
    assert same(one, written(False))
    k = dr.layers[1].self_attn.k_proj  # another weight of the same format: its columns in another order
    k.packed = dataclasses.replace(k.packed, data=k.packed.data.flip(-1).contiguous())
    moved = written(True)
    assert same(moved, written(False)) and not same(moved, one)
