"""The adaptive draft length: the cost model's choices, the acceptance estimate, and the engine using both."""
import pytest

import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.spec.policy import (CPU_MIN_CONFIDENCE, AcceptanceEstimate, DraftLengthPolicy, StepCosts,
                                     best_draft_len, confident_prefixes, expected_tokens)
from dflash_trt.errors import DFlashError

CPU = StepCosts.for_device("cpu")
GPU = StepCosts.for_device("cuda")


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 7) == 8 and expected_tokens(0.0, 7) == 1


def test_choice_follows_acceptance_and_load():
    assert best_draft_len(0.02, 7, 1, CPU) == 0, "hopeless drafts: decode autoregressively"
    assert best_draft_len(0.95, 7, 1, CPU) == 7
    ks = [best_draft_len(p / 20, 15, 1, CPU) for p in range(20)]
    assert ks == sorted(ks) and ks[0] == 0 and ks[-1] > 4, ks  # more acceptance, longer drafts
    loads = [best_draft_len(0.6, 15, b, CPU) for b in (1, 4, 16, 64)]
    assert loads == sorted(loads, reverse=True) and loads[0] > loads[-1], loads  # CPU rows cost: shrink
    assert best_draft_len(0.6, 15, 16, GPU) > best_draft_len(0.6, 15, 16, CPU)
    # never slower than AR under the model: the chosen K's rate is at least the autoregressive one
    for p in (0.1, 0.3, 0.5, 0.8):
        for b in (1, 8, 32):
            k = best_draft_len(p, 15, b, CPU)
            ar = 1 / (1 + CPU.row * b)
            if k:
                assert expected_tokens(p, k) / (1 + CPU.row * b * (k + 1) + CPU.draft + CPU.draft_row * b) > ar


def test_estimate_is_the_geometric_mle_and_follows_the_text():
    e = AcceptanceEstimate(prior_p=0.5, prior_weight=0.0, decay=1.0)
    for k, a in [(7, 2), (7, 7), (3, 0), (7, 1)]:
        e.update(k, a)
    assert e.p == pytest.approx(10 / (10 + 3))  # successes / (successes + observed failures)
    f = AcceptanceEstimate(prior_p=0.9)
    for _ in range(30):
        f.update(7, 0)
    assert f.p < 0.05


def test_policy_probes_after_giving_up_and_fixed_mode_keeps_k():
    pol = DraftLengthPolicy("adaptive", CPU, probe_every=4, max_gap=16)
    e = AcceptanceEstimate(prior_p=0.01)
    late = AcceptanceEstimate(prior_p=0.01)
    ks, ks_late = [], []
    for i in range(60):  # every probe misses: the gaps double, 4, 8, 16, 16
        pol.begin_iteration()
        ks.append(pol.choose(e, 7, 1))
        if ks[-1]:
            pol.observe(e, ks[-1], 0)
        if i >= 5:  # a request that gave up later probes on the same iterations as the first
            ks_late.append(pol.choose(late, 7, 1))
            if ks_late[-1]:
                pol.observe(late, ks_late[-1], 0)
    assert [i + 1 for i, k in enumerate(ks) if k] == [4, 12, 28, 44, 60] and set(ks) == {0, 1}
    assert all((i + 6) % 4 == 0 for i, k in enumerate(ks_late) if k) and sum(ks_late) >= 2
    e.idle = e.probe_gap - 1
    while pol.iteration % 4:
        pol.begin_iteration()
    assert pol.choose(e, 7, 1) == 1
    pol.observe(e, 1, 1)  # a probe that lands, but drafting still would not pay: the wait keeps growing
    assert e.probe_gap == 16 and pol.choose(e, 7, 1) == 0
    for _ in range(6):
        e.update(7, 7)  # the text became predictable
    assert pol.choose(e, 7, 1) > 1 and e.probe_gap == 0 and e.idle == 0  # drafting again, short waits next time
    assert DraftLengthPolicy("fixed", CPU).choose(e, 7, 1) == 7
    from dflash_trt.spec.config import SpecConfig
    with pytest.raises(DFlashError, match="draft_len_policy"):
        SpecConfig(draft_len_policy="greedy")
    with pytest.raises(DFlashError, match="step_costs"):
        SpecConfig(step_costs={"rows": 0.1})


def test_engine_drafts_long_when_drafts_land_and_stops_when_they_do_not(tmp_path):
    t = tiny.make_target(str(tmp_path / "t"))
    d = tiny.make_drafter(str(tmp_path / "d"), t, block_size=8)
    prompts = [[11, 11, 5], [11, 4, 11, 6], [7, 11]]
    sp = SamplingParams(max_tokens=40, ignore_eos=True)
    ar = [o.token_ids for o in LLM(target=t, speculative=False).generate(prompts, sp)]
    for right in (True, False):
        for pol in ("adaptive", "fixed"):
            # the CPU constants of a real model: a tiny model's drafter pass costs as much as its target pass
            llm = LLM(target=t, draft=d, trace=True, draft_len_policy=pol, step_costs=vars(CPU))
            truth = {}

            def oracle(work):  # the target's own continuation, or always-wrong tokens
                out = {}
                for w in work:
                    s = w.seq
                    full = truth.setdefault(s.seq_id, s.prompt_ids + ar[prompts.index(s.prompt_ids)])
                    dr = (full[len(s.token_ids):] + [3] * 8)[:w.draft_len]
                    out[s.seq_id] = dr if right else [(x + 1) % tiny.VOCAB for x in dr]
                return out

            llm.engine.proposer.propose = tiny.as_propose(oracle)
            outs = llm.generate(prompts, sp)
            assert [o.token_ids for o in outs] == ar  # lossless whatever K
            ks = [len(dr) for o in outs for dr, _ in o.trace]
            if pol == "fixed":
                assert ks.count(7) > len(ks) // 2, ks
            elif right:
                assert sum(ks) / len(ks) > 5, ks
            else:
                for o in outs:  # after a few misses: no drafts (untraced steps), rarer and rarer 1-token probes
                    late = [len(dr) for dr, _ in o.trace][4:]
                    assert len(late) <= 3 and all(k <= 1 for k in late), late


def test_engine_measures_its_step_costs_and_frees_the_scratch_blocks(tmp_path):
    t = tiny.make_target(str(tmp_path / "t"))
    d = tiny.make_drafter(str(tmp_path / "d"), t, block_size=8)
    eng = LLM(target=t, draft=d).engine
    c = eng.policy.costs
    # a tiny target pass costs about what a tiny drafter pass does: drafting is far from free here, unlike the
    # CPU defaults for a real model; verify rows are cheap next to the fixed cost of a pass
    assert 0 <= c.row < 1 and c.draft > 0.1 and c.draft_row >= 0, c
    assert eng.blocks.num_free == eng.blocks.num_blocks
    given = LLM(target=t, draft=d, step_costs={"row": 0.5, "draft": 0.25, "draft_row": 0.125}).engine.policy.costs
    assert (given.row, given.draft, given.draft_row) == (0.5, 0.25, 0.125)
    from dflash_trt.spec.calibrate import measure_step_costs
    from dflash_trt.kv_cache import BlockManager, CacheBlocks
    assert measure_step_costs(eng.runner, eng.proposer, CacheBlocks(BlockManager(2, eng.blocks.block_size)), 0) is None


def test_confident_prefixes_cut_before_the_first_doubted_draft_after_the_first():
    conf = [0.1, 0.9, 0.3, 0.8,   0.9, 0.5, 0.45,   0.2,   0.9, 0.9]
    lens = [4, 3, 1, 2]
    # request 0: its first draft stays however doubted; the cut falls before 0.3. Request 1: 0.45 < 0.5 cuts it.
    assert confident_prefixes(conf, lens, 0.5) == [2, 2, 1, 2]
    assert confident_prefixes(conf, lens, 0.0) == lens
    assert confident_prefixes(conf, lens, 0.95) == [1, 1, 1, 1]


def test_min_draft_confidence_defaults_to_on_for_cpu_adaptive_only(tmp_path):
    t, d = tiny.accepting_pair(str(tmp_path))
    assert LLM(target=t, draft=d).engine.policy.min_confidence == CPU_MIN_CONFIDENCE > 0
    assert LLM(target=t, draft=d, draft_len_policy="fixed").engine.policy.min_confidence == 0.0
    assert LLM(target=t, draft=d, draft_len_policy="fixed", min_draft_confidence=0.3).engine.policy.min_confidence == 0.3
    with pytest.raises(DFlashError, match="min_draft_confidence must be in"):
        LLM(target=t, draft=d, min_draft_confidence=1.5)
