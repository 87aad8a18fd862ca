"""The in-flight batching runtime under load for the target families: staggered arrivals, chunked prefill mixed
with verify blocks, a small cache that forces preemption and recompute; every request's tokens (and, for
speculative decoding, its drafts position by position) equal those it gets alone. Sequences run well past the
sliding windows (gpt-oss and Gemma 3: 8, windowed Qwen3-MoE: 6), whose layers use the window pool; DeepSeek-V3
runs its compressed latent cache."""
import pytest

import families
from dflash_trt import LLM, SamplingParams
from test_batching import Probe, alone_with_drafts, outputs, run_with_arrivals, same_drafts, workload

PAGE = 4


def _gpt_oss(root):
    from test_families_gpt_oss import WINDOW, gpt_oss, gpt_oss_drafter

    t = gpt_oss(str(root / "t"))
    return t, gpt_oss_drafter(str(root / "d"), t), WINDOW


def _gemma3(root):
    from test_families_gemma3 import WINDOW, gemma3

    t = gemma3(str(root / "t"))
    return t, families.drafter_for(str(root / "d"), t, block_size=16, extra={
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": WINDOW}), WINDOW


def _qwen3_moe(root):
    from test_families_qwen3_moe import qwen3_moe

    t = qwen3_moe(str(root / "t"), seed=1, use_sliding_window=True, sliding_window=6, norm_topk_prob=False,
                  decoder_sparse_step=2, mlp_only_layers=[])
    return t, families.drafter_for(str(root / "d"), t, block_size=16), 6


def _deepseek_v3(root):
    from test_families_deepseek_v3 import SECOND, deepseek_v3

    t = deepseek_v3(str(root / "t"), seed=1, **SECOND)
    return t, families.drafter_for(str(root / "d"), t, block_size=8), 0


PAIRS = {"gpt_oss": _gpt_oss, "gemma3": _gemma3, "qwen3_moe_windowed": _qwen3_moe, "deepseek_v3": _deepseek_v3}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            made[name] = PAIRS[name](tmp_path_factory.mktemp(name))
        return made[name]
    return get


def family_workload(window: int, n: int = 16, seed: int = 0):
    """test_batching's workload, outputs at least two windows long, arrivals packed closer (fewer requests)."""
    return [(p, SamplingParams(max_tokens=max(sp.max_tokens, 2 * window, 16), ignore_eos=True), at // 3)
            for p, sp, at in workload(n, seed)]


def main_block_budget(t, d, pages, **engine):
    """kv_cache_bytes for `pages` main-pool blocks of this engine layout (target layers in the main pool plus the
    drafter's), on top of the window pool (and state pool) the engine sizes itself. Read from an engine's own
    plan, so MLA's latent rows and the window split are counted as the engine counts them."""
    plan = LLM(target=t, draft=d, **engine).engine.kv_plan
    return pages * plan.bytes_per_block + plan.window_bytes + plan.state_bytes


@pytest.mark.parametrize("name", list(PAIRS))
def test_lossless_under_load_with_chunking_and_preemption(pairs, name):
    t, d, window = pairs(name)
    reqs = family_workload(window)
    alone, alone_drafts = alone_with_drafts(t, d, reqs, page_size=PAGE)
    assert sum(len(a) for a in alone) > 16 * 2 * max(window, 8) * 0.9
    # tight budgets: 40 rows per iteration (chunked prefill mixed with verify blocks), at most 4 running
    loaded = LLM(target=t, draft=d, draft_len_policy="fixed", max_num_tokens=40, max_batch_size=4,
                 page_size=PAGE, max_seq_len=160)
    assert (loaded.engine.blocks.window is not None) == (window > 0)  # windowed layers in their own pool
    probe = Probe(loaded.engine)
    assert outputs(run_with_arrivals(loaded, reqs)) == alone
    its = probe.iters
    assert max(i["rows"] for i in its) <= 40 and max(i["running"] for i in its) == 4
    assert sum(i["partial"] for i in its) > 0 and any(i["prefill"] and i["decode"] for i in its)
    assert all(i["target"] == 1 and i["drafter"] <= 1 for i in its)
    # a 40-page main pool: preemption and recompute, through the window pool too
    small_cfg = dict(max_num_tokens=64, max_batch_size=16, page_size=PAGE, max_seq_len=128)
    small = LLM(target=t, draft=d, draft_len_policy="fixed", trim_draft_block=False, **small_cfg,  # drafts compared
                kv_cache_bytes=main_block_budget(t, d, 40, **small_cfg))
    assert small.engine.blocks.main.num_blocks == 40
    probe = Probe(small.engine)
    seqs = run_with_arrivals(small, reqs)
    assert outputs(seqs) == alone
    assert small.engine.scheduler.num_preemptions > 0, "the small cache was meant to force preemption"
    # the drafter's context survives preemption: the same drafts as alone, position by position
    compared, preempted = same_drafts(probe, alone_drafts, seqs)
    assert compared > 200 and preempted > 100, (compared, preempted)
    assert sum(s.accepted for s in seqs) > 0  # drafts were accepted: multi-token commits under load
