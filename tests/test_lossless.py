"""Greedy DFlash output is token-identical to the same engine's autoregressive path."""
import pytest
import torch

import tiny
from dflash_trt import LLM, SamplingParams


def prompts(n, seed, vocab=tiny.VOCAB):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(torch.randint(1, 40, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.fixture(scope="module")
def b16_pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("b16")
    out = {}
    for name, kw in {"llama": dict(kind="llama"), "qwen3": dict(kind="qwen3", head_dim=32),
                     "llama_tied": dict(kind="llama", tied=True, kv_heads=1)}.items():
        t = tiny.make_target(str(root / f"{name}_t"), boost_tokens=(11,), boost=5.0, **kw)
        d = tiny.make_drafter(str(root / f"{name}_d"), t, block_size=16, mask_token_id=tiny.mask_proposing(t, 11),
                              residual_scale=0.3)
        out[name] = (t, d)
    return out


@pytest.mark.parametrize("name", ["llama", "qwen3", "llama_tied"])
def test_dflash_equals_ar_every_draft_len(b16_pairs, name):
    t, d = b16_pairs[name]
    ps = prompts(20, seed=len(name))
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    ar = [o.token_ids for o in LLM(target=t, speculative=False).generate(ps, sp)]
    accepted_any = 0
    for k in range(1, 16):
        llm = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=k)
        outs = llm.generate(ps, sp)
        for i, o in enumerate(outs):
            assert o.token_ids == ar[i], f"{name} K={k} prompt {i}"
            accepted_any += o.accepted
        assert llm.engine.blocks.num_free == llm.engine.blocks.num_blocks
    assert accepted_any > 0


@pytest.mark.parametrize("k", [1, 2, 3, 7, 15])
def test_every_acceptance_length_is_exercised(b16_pairs, k):
    t, d = b16_pairs["llama"]
    ps = prompts(8, seed=k)
    sp = SamplingParams(max_tokens=40, ignore_eos=True)
    ar = LLM(target=t, speculative=False).generate(ps, sp)
    llm = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=k, trace=True)
    eng = llm.engine
    seqs = [eng.add_request(p, sp) for p in ps]
    truth = {s.seq_id: a.token_ids for s, a in zip(seqs, ar)}
    oracle = tiny.OracleDrafter(lambda s: truth[s.seq_id])
    eng.proposer.propose = tiny.as_propose(oracle)
    while eng.has_unfinished():
        eng.step()
    lengths = set()
    for s, a in zip(seqs, ar):
        assert s.output_ids == a.token_ids
        lengths |= {acc for drafts, acc in s.trace if len(drafts) == k}
    assert lengths == set(range(k + 1)), f"acceptance lengths seen: {sorted(lengths)}"
    assert eng.blocks.num_free == eng.blocks.num_blocks


def test_batch_and_arrival_do_not_change_output(b16_pairs):
    t, d = b16_pairs["qwen3"]
    ps = prompts(12, seed=7)
    sp = SamplingParams(max_tokens=30, ignore_eos=True)
    alone = [LLM(target=t, draft=d, draft_len_policy="fixed").generate([p], sp)[0].token_ids for p in ps[:4]]
    together = LLM(target=t, draft=d, draft_len_policy="fixed", max_num_tokens=24, max_batch_size=3).generate(ps, sp)  # chunked, queued
    assert [o.token_ids for o in together[:4]] == alone


def test_compiled_ops_are_the_default_and_match_the_pytorch_path(b16_pairs):
    t, d = b16_pairs["qwen3"]
    ps = prompts(6, seed=3)
    compiled = LLM(target=t, draft=d, draft_len_policy="fixed", trace=True)
    assert compiled.engine.ops is not None, "the plugins' CPU ops should build and be used by default"
    torch_path = LLM(target=t, draft=d, draft_len_policy="fixed", trace=True, use_plugins=False)
    assert torch_path.engine.ops is None
    for sp in (SamplingParams(max_tokens=20, ignore_eos=True),
               SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.7, top_p=0.9, seed=5)):
        a, b = compiled.generate(ps, sp), torch_path.generate(ps, sp)
        assert [(o.token_ids, o.trace) for o in a] == [(o.token_ids, o.trace) for o in b]


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_bfloat16_dflash_equals_ar(b16_pairs, dtype):
    t, d = b16_pairs["llama"]
    ps = prompts(8, seed=11)
    sp = SamplingParams(max_tokens=20, ignore_eos=True)
    ar = LLM(target=t, speculative=False, dtype=dtype).generate(ps, sp)
    spec = LLM(target=t, draft=d, draft_len_policy="fixed", dtype=dtype, max_draft_len=7).generate(ps, sp)
    assert [o.token_ids for o in spec] == [o.token_ids for o in ar]
    assert sum(o.accepted for o in spec) > 0
