"""Sliding-window layers in a pool of their own (runtime/kv_cache.py WindowBlockManager): a request holds only a
window's worth of blocks for those layers, the blocks are freed as positions leave the window, and the tokens
are exactly those of the single-pool engine and of autoregressive decoding."""
import pytest

import families
from dflash_trt import LLM, SamplingParams
from dflash_trt.config import DraftConfig, TargetConfig
from test_families_gemma3 import WINDOW as G_WINDOW, gemma3
from test_families_gpt_oss import WINDOW, gpt_oss, gpt_oss_drafter

PAGE = 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("window_cache")
    t = gpt_oss(str(root / "t"))
    return t, gpt_oss_drafter(str(root / "d"), t)


def cache_bytes(llm) -> int:
    e = llm.engine
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size()
               for k, v in e.runner.target_caches + e.proposer.caches)


def run_tracking(llm, prompts, sp):
    """Generate step by step; return outputs and the most window-pool blocks a request held between steps (after
    the trim the scheduler does first thing in the next step; trimming twice changes nothing)."""
    eng = llm.engine
    seqs = [llm.add_request(p, sp) for p in prompts]
    most = 0
    while eng.has_unfinished():
        eng.step()
        for s in seqs:
            if not s.is_finished:
                eng.blocks.trim(s)
                most = max(most, eng.blocks.window.in_use(s.window_table))
    return [s.output_ids for s in seqs], most


def test_window_layers_hold_a_window_of_blocks_and_decode_the_same_tokens(pair):
    t, d = pair
    prompts = families.prompts(6, seed=11, lo=20, hi=50)
    sp = SamplingParams(max_tokens=48, ignore_eos=True)
    common = dict(page_size=PAGE, max_batch_size=4, max_num_tokens=32, max_seq_len=256)
    ar = [o.token_ids for o in LLM(target=t, speculative=False, window_cache=False, **common).generate(prompts, sp)]
    single = LLM(target=t, draft=d, draft_len_policy="fixed", window_cache=False, **common)
    assert single.engine.blocks.window is None
    assert [o.token_ids for o in single.generate(prompts, sp)] == ar
    pooled = LLM(target=t, draft=d, draft_len_policy="fixed", **common)
    eng = pooled.engine
    assert eng.blocks.window is not None and eng.blocks.window.window == WINDOW
    outs, most = run_tracking(pooled, prompts, sp)
    assert outs == ar  # lossless through the window pool, prompts and outputs far beyond the window
    # positions num_computed - WINDOW + 1 .. num_computed + K at most (the last verify's rows were allocated)
    assert 0 < most <= -(-(WINDOW + 7) // PAGE) + 1, most
    assert eng.blocks.num_free == eng.blocks.num_blocks  # every pool back to free
    assert sum(o.accepted for o in pooled.generate(prompts[:2], sp)) > 0
    # half of gpt-oss's layers are windowed: their cache shrinks from whole sequences to windows
    assert cache_bytes(pooled) < 0.75 * cache_bytes(single)
    # the drafter's layers (its sliding_attention one too: it reads its whole context and masks) and the target's
    # full-attention layers stay in the main pool; only the target's windowed layers use the window pool
    r, main, win = eng.runner, eng.blocks.main.num_blocks, eng.blocks.window.num_blocks + 1  # + the null block
    assert DraftConfig.from_dir(d).layer_types[0] == "sliding_attention"
    d_blocks = main + eng.kv_plan.draft_scratch_blocks  # and the fused drafter pass's scratch pages
    assert [k.shape[0] for k, _ in eng.proposer.caches] == [d_blocks] * len(eng.proposer.caches)
    assert [k.shape[0] for k, _ in r.target_caches] == [win if i % 2 == 0 else main for i in range(4)]


@pytest.mark.parametrize("invariant", [True, False], ids=["cpu_kernels", "pytorch"])
def test_evicted_and_free_window_blocks_are_never_read(pair, invariant):
    """Before every step the null block and every free block of the window pool are filled with 1e3: if any
    attention read an evicted position (the kernels' key lists, the PyTorch path's masks), the tokens would
    change. AR and DFlash through the poisoned pool still equal single-pool AR."""
    t, d = pair
    windowed = [i for i in range(4) if TargetConfig.from_dir(t).window(i)]
    prompts = families.prompts(4, seed=14, lo=20, hi=40)
    sp = SamplingParams(max_tokens=32, ignore_eos=True)
    common = dict(page_size=PAGE, max_batch_size=4, max_num_tokens=32, max_seq_len=128, invariant_kernels=invariant)
    ar = [o.token_ids for o in LLM(target=t, speculative=False, window_cache=False, **common).generate(prompts, sp)]
    for spec in (False, True):
        llm = LLM(target=t, draft=d if spec else None, speculative=spec, draft_len_policy="fixed", **common)
        eng, pool = llm.engine, llm.engine.blocks.window
        seqs = [llm.add_request(p, sp) for p in prompts]
        evicted = 0
        while eng.has_unfinished():
            dead = [pool.NULL] + list(pool.free)
            for i in windowed:
                for c in eng.runner.target_caches[i]:
                    c[dead] = 1e3
            eng.step()
            evicted = max(evicted, sum(b == pool.NULL for s in seqs for b in s.window_table))
        assert [s.output_ids for s in seqs] == ar, f"speculative={spec}"
        assert evicted > 4  # positions really left the window (their table entries point at the null block)


def test_preemption_and_chunked_prefill_with_the_window_pool(pair):
    t, d = pair
    prompts = families.prompts(8, seed=12, lo=30, hi=70)
    sp = SamplingParams(max_tokens=40, ignore_eos=True)
    ar = [o.token_ids for o in LLM(target=t, speculative=False, page_size=PAGE).generate(prompts, sp)]
    small = LLM(target=t, draft=d, page_size=PAGE, max_batch_size=6, max_num_tokens=24, max_seq_len=128,
                kv_cache_bytes=230_000, draft_len_policy="fixed")  # ~40 main blocks
    assert [o.token_ids for o in small.generate(prompts, sp)] == ar
    assert small.engine.scheduler.num_preemptions > 0  # the main pool ran out and requests were recomputed
    assert small.engine.blocks.num_free == small.engine.blocks.num_blocks


def test_gemma3_window_pool_and_long_windows_stay_in_one_pool(tmp_path):
    t = gemma3(str(tmp_path / "g"))
    prompts = families.prompts(4, seed=13, lo=20, hi=40)
    sp = SamplingParams(max_tokens=30, ignore_eos=True)
    a = LLM(target=t, speculative=False, page_size=PAGE)
    b = LLM(target=t, speculative=False, page_size=PAGE, window_cache=False)
    assert a.engine.blocks.window is not None and a.engine.blocks.window.window == G_WINDOW
    assert [o.token_ids for o in a.generate(prompts, sp)] == [o.token_ids for o in b.generate(prompts, sp)]
    # three of its four layers windowed: most of the KV memory goes
    assert cache_bytes(a) < 0.5 * cache_bytes(b), (cache_bytes(a), cache_bytes(b))
    # a window as long as the sequences saves nothing: one pool
    assert LLM(target=t, speculative=False, page_size=PAGE, max_seq_len=G_WINDOW).engine.blocks.window is None
