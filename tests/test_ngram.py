"""The n-gram (prompt lookup) proposer: output equals the same engine's autoregressive path, greedy and seeded
sampling, batched with staggered arrivals, chunked prefill and preemption; it drafts only from the request's
own tokens and needs no drafter."""
import random

import pytest

import tiny
from dflash_trt import LLM, SamplingParams
from test_batching import run_with_arrivals


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    # a boosted token makes the tiny model repeat itself, as real models repeat their input: drafts land
    return tiny.make_target(str(tmp_path_factory.mktemp("ngram") / "t"), boost_tokens=(11,), boost=3.0)


def workload(n=24, seed=0, sampled=False):
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        motif = [rng.randrange(4, tiny.VOCAB) for _ in range(rng.randint(2, 6))]
        prompt = (motif * 12)[:rng.randint(8, 60)]  # input-grounded text: the answer can copy from it
        sp = SamplingParams(max_tokens=rng.randint(8, 40), ignore_eos=True,
                            temperature=0.8 if sampled else 0.0, top_k=20 if sampled else 0, seed=1000 + i)
        reqs.append((prompt, sp, rng.randint(0, 20)))
    return reqs


def solo(llm, reqs):
    return [llm.generate([p], sp)[0].token_ids for p, sp, _ in reqs]


@pytest.mark.parametrize("sampled", [False, True])
def test_ngram_equals_ar_under_load(target, sampled):
    reqs = workload(n=16, sampled=sampled)
    ar = solo(LLM(target=target, speculative=False), reqs)
    # fixed K: every step with a match drafts the whole lookup, the most verify rows to get wrong
    for engine in (dict(), dict(max_num_tokens=24, max_batch_size=8, page_size=4, max_seq_len=160),
                   dict(max_num_tokens=7, page_size=4, max_seq_len=128)):  # chunks of 7 rows
        llm = LLM(target=target, speculative="ngram", draft_len_policy="fixed", trace=True, **engine)
        seqs = run_with_arrivals(llm, reqs)
        assert [s.output_ids for s in seqs] == ar
        assert sum(s.accepted for s in seqs) > 0 and sum(s.drafted - s.accepted for s in seqs) > 0


@pytest.mark.parametrize("sampled", [False, True])
def test_ngram_survives_preemption(target, sampled):
    reqs = workload(n=16, seed=3, sampled=sampled)
    ar = solo(LLM(target=target, speculative=False), reqs)
    probe = LLM(target=target, speculative=False, page_size=4, max_seq_len=128)
    per_page = probe.engine.kv_plan.bytes_per_block
    small = LLM(target=target, speculative="ngram", draft_len_policy="fixed", page_size=4, max_seq_len=128,
                max_num_tokens=64, kv_cache_bytes=per_page * 48)
    seqs = run_with_arrivals(small, reqs)
    assert [s.output_ids for s in seqs] == ar
    assert small.engine.scheduler.num_preemptions > 0, "the small cache was meant to force preemption"
    assert sum(s.accepted for s in seqs) > 0


def test_ngram_drafts_come_from_the_request_itself(target):
    llm = LLM(target=target, speculative="ngram", draft_len_policy="fixed", max_draft_len=4, trace=True)
    prompt = [20, 21, 22, 23, 24, 25] * 4
    out = llm.generate([prompt], SamplingParams(max_tokens=24, ignore_eos=True))[0]
    seen = prompt + out.token_ids
    assert out.trace and llm.engine.drafter is None and llm.engine.proposer.name == "ngram"
    for drafts, _ in out.trace:
        assert 1 <= len(drafts) <= 4
        # every draft is a run of tokens that occurs in the request's own text
        assert any(seen[i:i + len(drafts)] == drafts for i in range(len(seen)))


def test_adaptive_ngram_stops_drafting_when_lookups_miss(target):
    """Prompts without repeats: lookups rarely find anything and what they find rarely lands; the adaptive
    policy, costing the verify rows, then drafts less than the fixed one."""
    rng = random.Random(5)
    ps = [[rng.randrange(4, tiny.VOCAB) for _ in range(30)] for _ in range(6)]
    sp = SamplingParams(max_tokens=30, ignore_eos=True)
    costs = {"row": 0.09, "draft": 0.0, "draft_row": 0.0}  # a real model's verify rows on a CPU
    fixed = LLM(target=target, speculative="ngram", draft_len_policy="fixed", step_costs=costs).generate(ps, sp)
    adaptive = LLM(target=target, speculative="ngram", step_costs=costs).generate(ps, sp)
    assert [o.token_ids for o in fixed] == [o.token_ids for o in adaptive]
    wasted = lambda outs: sum(o.drafted - o.accepted for o in outs)  # noqa: E731
    assert wasted(adaptive) < wasted(fixed)
