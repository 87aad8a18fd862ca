"""Drafting in a batch: the adaptive policy prices a batch's K together (SpecPolicy.plan, batch_draft_len), and
a drafter pass of several requests has only the rows their drafts need (DFlashProposer.block_rows, trim_draft_block).

Priced alone, each request of a batch pays for the whole drafter pass, and estimates scattered around the
break-even send some requests to K = 0 while the pass runs for the others anyway; priced together, the batch
drafts one K. A trimmed pass must draft each request exactly as a lone pass over blocks of the same rows does,
and output stays the target's whatever the rows (test_batching.py runs the default engine under load).
"""
import pytest
from test_fused_drafter import pair  # noqa: F401  (the tiny dense pair, fused drafter and all)

from dflash_trt import LLM, SamplingParams
from dflash_trt.spec.policy import MARGIN, StepCosts, batch_draft_len, best_draft_len, expected_tokens

# a CPU-like curve: rows nearly free up to a row tile of 12, then each costs
COSTS = StepCosts(row=0.1, draft=0.25, draft_row=0.05,
                  curve=((1, 1.0), (4, 1.04), (8, 1.1), (12, 1.18), (16, 1.7), (32, 3.3)),
                  draft_curve=((1, 0.25), (4, 0.3), (16, 0.8)))


def rate(ps, ks, costs):
    """Modelled tokens per unit time of a batch whose requests draft ks (0: none)."""
    drafting = [k for k in ks if k]
    tokens = sum(expected_tokens(p, k) for p, k in zip(ps, ks))
    return tokens / (costs.target(len(ps) + sum(ks)) + costs.drafter(len(drafting), max(drafting, default=0)))


def test_batch_pricing_picks_the_k_that_serves_the_whole_batch_best():
    for ps in ([0.62, 0.47, 0.58, 0.45], [0.3, 0.35, 0.2, 0.4], [0.9, 0.85, 0.95, 0.8], [0.7] * 8):
        k = batch_draft_len(ps, [7] * len(ps), 0, 7, COSTS, MARGIN)
        ar = len(ps) / COSTS.target(len(ps))
        rates = [rate(ps, [kk] * len(ps), COSTS) for kk in range(1, 8)]
        if max(rates) > ar * (1 + MARGIN):
            assert k == 1 + rates.index(max(rates)), ps
        else:
            assert k == 0, ps
    # equal estimates: the per-request rule's K
    for b in (2, 4, 8, 16):
        for p in (0.3, 0.5, 0.6, 0.75, 0.9):
            assert batch_draft_len([p] * b, [7] * b, 0, 7, COSTS, MARGIN) == best_draft_len(p, 7, b, COSTS, MARGIN)
    # requests that cannot draft still decode one row each, and caps bound each request's K
    assert batch_draft_len([0.9], [7], 0, 7, COSTS, MARGIN) == 7
    assert batch_draft_len([0.9], [7], 7, 7, COSTS, MARGIN) == 4  # 8 + 4 rows: the last of the cheap row tile
    capped = batch_draft_len([0.9, 0.9], [1, 7], 0, 7, COSTS, MARGIN)
    assert capped > 1


def test_estimates_scattered_around_the_break_even_draft_together():
    """Priced alone, two of four requests give up and the pass runs for the other two; priced together all four
    draft one K, which the model rates higher than the split."""
    ps = [0.5, 0.33, 0.45, 0.34]
    alone = [best_draft_len(p, 7, 4, COSTS, MARGIN) for p in ps]
    assert 0 in alone and any(alone), alone
    k = batch_draft_len(ps, [7] * 4, 0, 7, COSTS, MARGIN)
    assert k > 0 and rate(ps, [k] * 4, COSTS) > rate(ps, alone, COSTS)


def test_plan_sets_every_requests_k_and_a_lone_request_is_priced_alone():
    from dflash_trt.sequence import Sequence
    from dflash_trt.spec.config import SpecConfig
    from dflash_trt.spec.policy import SpecPolicy

    pol = SpecPolicy(SpecConfig(), 7, "cpu", COSTS)
    seqs = [Sequence([1, 2, 3], SamplingParams(max_tokens=64 if i else 2)) for i in range(4)]
    for s, (succ, k) in zip(seqs, [(5, 7), (1, 3), (4, 6), (1, 4)]):
        pol.new_request(s)
        s.acceptance.update(k, succ)
    k = pol.begin_iteration(4)
    pol.plan(seqs, k, 4096)
    want = batch_draft_len([s.acceptance.p for s in seqs], [1, 7, 7, 7], 0, 7, COSTS, MARGIN)
    assert pol.planned == want > 1
    ks = [pol.draft_len(s, k, 4, 4096) for s in seqs]
    assert ks == [1] + [want] * 3  # the first may commit two more tokens: one draft
    # the next iteration has one request: no plan, its own pricing
    k = pol.begin_iteration(1)
    pol.plan(seqs[1:2], k, 4096)
    assert pol.planned is None
    alone = best_draft_len(seqs[1].acceptance.p, 7, 1, COSTS, MARGIN)
    assert pol.draft_len(seqs[1], k, 1, 4096) == alone != want
    # the fixed policy never plans
    fixed = SpecPolicy(SpecConfig(draft_len_policy="fixed"), 7, "cpu", COSTS)
    fixed.plan(seqs, fixed.begin_iteration(4), 4096)
    assert fixed.planned is None


def test_a_trimmed_drafter_pass_is_read_in_rows():
    lone = StepCosts(row=0.1, draft=0.25, draft_row=0.05, draft_curve=((1, 0.3), (4, 0.6), (16, 1.8)), draft_rows=4)
    assert lone.drafter(1, 7) == lone.drafter(1, 1) == pytest.approx(0.3)  # a lone request's block is whole
    assert lone.drafter(4, 3) == pytest.approx(0.6) and lone.drafter(4, 1) == pytest.approx(0.4)
    assert lone.drafter(8, 7) == pytest.approx(1.8)  # 64 rows: the 16 x 4-row point
    whole = StepCosts(row=0.1, draft=0.25, draft_row=0.05, draft_curve=((1, 0.3), (4, 0.6), (16, 1.8)))
    assert whole.drafter(4, 1) == whole.drafter(4, 7) == pytest.approx(0.6)


def test_a_trimmed_pass_drafts_each_request_as_a_lone_pass_over_its_rows(pair):
    from dflash_trt.scheduler import Scheduled

    t, d = pair
    assert not LLM(target=t, draft=d, trim_draft_block=False).engine.proposer.trim
    llm = LLM(target=t, draft=d, draft_len_policy="fixed", max_batch_size=4)
    eng = llm.engine
    prop = eng.proposer
    assert prop.trim, "trimmed by default on a CPU"
    seqs = [eng.add_request(p, SamplingParams(max_tokens=40, ignore_eos=True))
            for p in ([5, 9, 14, 3, 22], list(range(3, 30)))]
    while any(s.num_output < 3 for s in seqs):
        eng.step()
    rows, forward = [], prop.drafter.forward

    def counted(x, *args, **kw):
        rows.append(x.shape[0])
        return forward(x, *args, **kw)

    prop.drafter.forward = counted
    a, b = seqs
    both = prop.propose([Scheduled(a, 2, 1, False), Scheduled(b, 4, 3, False)])
    assert rows == [2 * 4], rows  # two blocks of 1 + 3 rows, not of 8
    prop.block_rows = lambda work: 4  # a lone request's block of the same rows
    lone_a = prop.propose([Scheduled(a, 4, 3, False)]).drafts[a.seq_id]
    lone_b = prop.propose([Scheduled(b, 4, 3, False)]).drafts[b.seq_id]
    assert both.drafts[a.seq_id] == lone_a[:1] and both.drafts[b.seq_id] == lone_b
    del prop.block_rows
    whole = prop.propose([Scheduled(b, 8, 7, False)])  # the longest draft asks for the whole block
    assert rows[-1] == 8 and len(whole.drafts[b.seq_id]) == 7
