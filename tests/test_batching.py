"""In-flight batching: lossless under load, arrival order, chunked prefill, preemption, seeds, no leaks."""
import asyncio
import random

import pytest
import torch

import tiny
from dflash_trt import LLM, SamplingParams


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny.accepting_pair(str(tmp_path_factory.mktemp("batching")))  # 4 heads, 2 kv heads


def workload(n=64, seed=0):
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        prompt = [rng.randrange(4, tiny.VOCAB) for _ in range(rng.randint(1, 60))]
        reqs.append((prompt, SamplingParams(max_tokens=rng.randint(1, 40), ignore_eos=True), rng.randint(0, 30)))
    return reqs


class Probe:
    """Records what every iteration of an engine did: the scheduler's work and the model passes it ran."""

    def __init__(self, eng):
        self.iters, self.drafts = [], {}  # drafts: (seq_id, position) -> draft tokens
        sched, runner, proposer = eng.scheduler, eng.runner, eng.proposer
        schedule, target_fwd, draft = sched.schedule, runner.target.forward, proposer.propose

        def scheduled():
            work = schedule()
            self.iters.append(dict(
                rows=sum(w.num_rows for w in work), running=len(sched.running), target=0, drafter=0,
                prefill=any(w.is_prefill for w in work), decode=any(not w.is_prefill for w in work),
                partial=sum(w.is_prefill and w.seq.num_computed + w.num_rows < w.seq.prefill_target
                            for w in work)))
            return work

        def target(*a, **kw):
            self.iters[-1]["target"] += 1
            return target_fwd(*a, **kw)

        def drafted(work, want_confidence=False):
            work = [w for w in work if w.draft_len > 0]
            if not work:
                return draft(work, want_confidence)
            self.iters[-1]["drafter"] += 1
            out = draft(work, want_confidence)
            for w in work:
                self.drafts[(w.seq.seq_id, w.seq.num_computed)] = out.drafts[w.seq.seq_id]
            return out

        sched.schedule, runner.target.forward, proposer.propose = scheduled, target, drafted


def run_with_arrivals(llm, reqs, aborts=None):
    """Requests join at their arrival iteration; returns the sequences. aborts(engine, seqs, iteration) may
    cancel requests between iterations."""
    eng, seqs, it = llm.engine, {}, 0
    pending = sorted(range(len(reqs)), key=lambda i: reqs[i][2])
    while pending or eng.has_unfinished():
        while pending and reqs[pending[0]][2] <= it:
            i = pending.pop(0)
            seqs[i] = eng.add_request(reqs[i][0], reqs[i][1])
        if aborts is not None:
            aborts(eng, seqs, it)
        eng.step()
        it += 1
    assert eng.blocks.num_free == eng.blocks.num_blocks, "cache blocks leaked"
    return [seqs[i] for i in range(len(reqs))]


def alone_with_drafts(t, d, reqs, **engine):
    """Each request alone (fixed K): its tokens, and its drafts keyed by (request index, position)."""
    solo = LLM(target=t, draft=d, draft_len_policy="fixed", **engine)
    probe = Probe(solo.engine)
    index, tokens = {}, []
    for i, (p, sp, _) in enumerate(reqs):
        seq = solo.engine.add_request(p, sp)
        index[seq.seq_id] = i
        while solo.engine.has_unfinished():
            solo.engine.step()
        tokens.append(seq.output_ids)
    return tokens, {(index[sid], pos): dr for (sid, pos), dr in probe.drafts.items()}


def same_drafts(probe, alone_drafts, seqs) -> tuple[int, int]:
    """Asserts every draft under load equals the one made alone at the same position (the shorter a prefix of
    the longer: the row budget may cut K); returns (positions compared, those of preempted requests)."""
    row = {s.seq_id: i for i, s in enumerate(seqs)}
    compared = preempted = 0
    for (sid, pos), dr in probe.drafts.items():
        ref = alone_drafts.get((row[sid], pos))
        if ref is None or not dr:
            continue
        n = min(len(dr), len(ref))
        assert dr[:n] == ref[:n], f"request {row[sid]} drafted differently at position {pos}"
        compared += 1
        preempted += seqs[row[sid]].num_preemptions > 0
    return compared, preempted


def outputs(seqs):
    return [s.output_ids for s in seqs]


@pytest.mark.parametrize("spec", [True, False])
def test_lossless_under_load_with_chunking_and_preemption(pair, spec):
    t, d = pair
    reqs = workload()
    alone_llm = LLM(target=t, draft=d if spec else None, speculative=spec)
    alone = [alone_llm.generate([p], sp)[0].token_ids for p, sp, _ in reqs]
    ar = LLM(target=t, speculative=False)
    assert alone == [ar.generate([p], sp)[0].token_ids for p, sp, _ in reqs]  # spec == AR request by request
    # tight budgets: 24 rows per iteration (chunked prefill mixed with decoding), at most 8 running requests
    loaded = LLM(target=t, draft=d if spec else None, speculative=spec, max_num_tokens=24, max_batch_size=8,
                 page_size=4, max_seq_len=160)
    probe = Probe(loaded.engine)
    assert outputs(run_with_arrivals(loaded, reqs)) == alone
    its = probe.iters
    assert max(i["rows"] for i in its) <= 24 and max(i["running"] for i in its) == 8  # both budgets bind
    assert sum(i["partial"] for i in its) > 0 and any(i["prefill"] and i["decode"] for i in its)
    assert all(i["target"] == 1 and i["drafter"] <= 1 for i in its)  # one pass each, whatever the batch
    # a cache of 48 pages of 4 positions: preemption (recompute)
    # whole drafter blocks: a trimmed block's drafts follow the longest draft of its batch, and the drafts are
    # compared with each request's alone below
    small = LLM(target=t, draft=d if spec else None, speculative=spec, max_num_tokens=64, max_batch_size=32,
                draft_len_policy="fixed", trace=True, trim_draft_block=False,
                page_size=4, max_seq_len=128, kv_cache_bytes=_bytes_for(t, d if spec else None, pages=48, page=4))
    assert small.engine.blocks.num_blocks == 48
    probe = Probe(small.engine)
    seqs = run_with_arrivals(small, reqs)
    assert outputs(seqs) == alone
    assert small.engine.scheduler.num_preemptions > 0, "the small cache was meant to force preemption"
    if spec:  # the drafter's context survives preemption and recompute: the same drafts as alone, position by position
        _, solo = alone_with_drafts(t, d, reqs)
        compared, preempted = same_drafts(probe, solo, seqs)
        assert compared > 200 and preempted > 50


def test_drafts_cut_where_the_drafter_doubts_stay_lossless_under_load(pair):
    """min_draft_confidence cuts each block's drafts to a prefix (the same drafter pass); the verify rows that
    remain, packed with prefill chunks and other blocks, must still give the target's own tokens."""
    from collections import Counter

    t, d = pair
    reqs = workload(seed=2)
    ar = LLM(target=t, speculative=False)
    alone = [ar.generate([p], sp)[0].token_ids for p, sp, _ in reqs]
    cut = LLM(target=t, draft=d, draft_len_policy="fixed", min_draft_confidence=0.2, max_num_tokens=24,
              max_batch_size=8, page_size=4, max_seq_len=160, trim_draft_block=False)  # drafts compared below
    probe = Probe(cut.engine)
    seqs = run_with_arrivals(cut, reqs)
    assert outputs(seqs) == alone
    lens = Counter(len(dr) for dr in probe.drafts.values())
    assert all(lens[k] > 0 for k in range(1, 8)), lens  # cut to every length, and some kept whole
    assert any(i["prefill"] and i["decode"] for i in probe.iters)
    _, whole = alone_with_drafts(t, d, reqs, max_seq_len=160)  # no cut (fixed policy)
    compared, _ = same_drafts(probe, whole, seqs)  # each cut block is a prefix of the whole one
    assert compared > 200


def _bytes_for(t, d, pages, page):
    from dflash_trt.config import DraftConfig, TargetConfig
    from dflash_trt.kv_cache import bytes_per_block

    tc = TargetConfig.from_dir(t)
    layers = [(tc.num_key_value_heads, tc.head_dim)] * tc.num_hidden_layers
    if d:
        dc = DraftConfig.from_dir(d)
        layers += [(dc.num_key_value_heads, dc.head_dim)] * dc.num_hidden_layers
    return pages * bytes_per_block(page, layers, torch.float32)


def test_seeded_sampling_independent_of_batch(pair):
    t, d = pair
    llm = LLM(target=t, draft=d)
    sp = SamplingParams(max_tokens=25, temperature=0.9, top_p=0.95, seed=42, ignore_eos=True)
    alone = llm.generate([[7, 8, 9]], sp)[0].token_ids
    others = [SamplingParams(max_tokens=30, temperature=1.0, seed=i, ignore_eos=True) for i in range(10)]
    outs = llm.generate([[4, 5]] * 5 + [[7, 8, 9]] + [[12]] * 5, others[:5] + [sp] + others[5:])
    assert outs[5].token_ids == alone


def test_stop_strings_ids_and_max_tokens(pair):
    t, d = pair
    llm = LLM(target=t, draft=d)
    free = llm.generate([[20, 21, 22]], SamplingParams(max_tokens=30, ignore_eos=True))[0]
    text = free.text
    assert len(text) > 6
    stop = text[3:5]
    o = llm.generate([[20, 21, 22]], SamplingParams(max_tokens=30, ignore_eos=True, stop=[stop]))[0]
    assert o.finish_reason == "stop" and o.text == text[:text.find(stop)]
    tok = free.token_ids[4]
    o = llm.generate([[20, 21, 22]], SamplingParams(max_tokens=30, ignore_eos=True, stop_token_ids=[tok]))[0]
    assert o.token_ids == free.token_ids[:free.token_ids.index(tok) + 1] and o.finish_reason == "stop"
    o = llm.generate([[20, 21, 22]], SamplingParams(max_tokens=7, ignore_eos=True))[0]
    assert o.token_ids == free.token_ids[:7] and o.finish_reason == "length"


def test_async_streaming_and_cancellation(pair):
    from dflash_trt.async_llm import AsyncLLM

    t, d = pair
    llm = LLM(target=t, draft=d)
    ref = llm.generate([[30, 31, 32]], SamplingParams(max_tokens=40, ignore_eos=True))[0]
    alm = AsyncLLM(llm)

    async def main():
        tokens, text, n = [], "", 0
        async for out in alm.generate([30, 31, 32], SamplingParams(max_tokens=40, ignore_eos=True)):
            tokens += out.delta_token_ids
            text += out.delta_text
            n += 1
        assert tokens == ref.token_ids and text == ref.text and n > 1

        async def cancelled():
            async for out in alm.generate([30, 31, 32], SamplingParams(max_tokens=400, ignore_eos=True)):
                if len(out.token_ids) > 5:
                    break  # leaving the iterator aborts the request
        await asyncio.gather(cancelled(), cancelled(), cancelled())

        async def consume():  # cancelled from outside, as a server does when its client goes away
            async for _ in alm.generate([30, 31, 32], SamplingParams(max_tokens=400, ignore_eos=True)):
                pass
        task = asyncio.ensure_future(consume())
        while alm.num_unfinished == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if alm.num_unfinished == 0 and not llm.engine.has_unfinished():
                break
            await asyncio.sleep(0.02)
        assert llm.engine.blocks.num_free == llm.engine.blocks.num_blocks

    asyncio.run(main())
    alm.shutdown()


def _small(t, d, **kw):
    """Tight row budget and a 48-page cache: chunked prefill and preemption."""
    return LLM(target=t, draft=d, speculative=d is not None, max_num_tokens=64, max_batch_size=32, page_size=4,
               max_seq_len=128, kv_cache_bytes=_bytes_for(t, d, pages=48, page=4), **kw)


def test_every_acceptance_length_under_load_with_stops_inside_accepted_runs(pair):
    t, d = pair
    reqs = workload(seed=1)
    ar = LLM(target=t, speculative=False)
    free = [ar.generate([p], sp)[0].token_ids for p, sp, _ in reqs]
    rng = random.Random(5)
    for i, (p, sp, arrival) in enumerate(reqs):  # a third stop on a token of their free-running answer
        if i % 3 == 0 and len(free[i]) > 4:
            stop = free[i][rng.randrange(2, len(free[i]))]
            reqs[i] = (p, SamplingParams(max_tokens=sp.max_tokens, ignore_eos=True, stop_token_ids=[stop]), arrival)
    alone = [ar.generate([p], sp)[0].token_ids for p, sp, _ in reqs]
    llm = _small(t, d, draft_len_policy="fixed", max_draft_len=7, trace=True)
    eng, truth = llm.engine, {tuple(p): a for (p, _, _), a in zip(reqs, alone)}
    eng.proposer.propose = tiny.as_propose(tiny.OracleDrafter(lambda s: truth[tuple(s.prompt_ids)]))
    seqs = run_with_arrivals(llm, reqs)
    assert outputs(seqs) == alone
    assert eng.scheduler.num_preemptions > 0
    assert {acc for s in seqs for dr, acc in s.trace if len(dr) == 7} == set(range(8))
    stopped_in_run = 0
    for s, (p, sp, _), f in zip(seqs, reqs, free):
        if sp.stop_token_ids:
            stop = sp.stop_token_ids[0]
            assert s.finish_reason == "stop" and s.output_ids == f[:f.index(stop) + 1]
            last_drafts, last_acc = s.trace[-1] if s.trace else ([], 0)
            stopped_in_run += stop in last_drafts[:last_acc]  # the stop came inside an accepted run
    assert stopped_in_run > 0


@pytest.mark.parametrize("spec", [True, False])
def test_seeded_sampling_under_load_matches_each_request_alone(pair, spec):
    t, d = pair
    reqs = [(p, SamplingParams(max_tokens=sp.max_tokens, ignore_eos=True, temperature=0.9, top_p=0.95, seed=i), a)
            for i, (p, sp, a) in enumerate(workload(32, seed=2))]
    solo = LLM(target=t, draft=d if spec else None, speculative=spec)
    alone = [solo.generate([p], sp)[0].token_ids for p, sp, _ in reqs]
    llm = _small(t, d if spec else None)
    assert outputs(run_with_arrivals(llm, reqs)) == alone
    assert llm.engine.scheduler.num_preemptions > 0


def test_cancel_waiting_running_and_preempted_requests_frees_their_blocks_at_once(pair):
    t, d = pair
    reqs = workload(seed=3)
    llm = _small(t, d)
    eng, cancelled = llm.engine, {}

    def held(seq):
        return len(seq.block_table)

    def aborts(eng, seqs, it):
        kinds = {"waiting": [s for s in eng.scheduler.waiting if s.num_preemptions == 0],
                 "running": [s for s in eng.scheduler.running if s.num_output > 0],
                 "preempted": [s for s in eng.scheduler.waiting if s.num_preemptions > 0]}
        for kind, cands in kinds.items():
            if kind not in cancelled and cands:
                seq, free = cands[-1], eng.blocks.num_free
                n = held(seq)
                eng.abort(seq.request_id)
                assert seq.finish_reason == "abort" and held(seq) == 0 and eng.blocks.num_free == free + n
                assert seq not in eng.scheduler.waiting and seq not in eng.scheduler.running
                cancelled[kind] = seq

    seqs = run_with_arrivals(llm, reqs, aborts)  # asserts that no block leaked
    assert set(cancelled) == {"waiting", "running", "preempted"}
    ar = LLM(target=t, speculative=False)
    for s, (p, sp, _) in zip(seqs, reqs):
        if s not in cancelled.values():
            assert s.output_ids == ar.generate([p], sp)[0].token_ids


def test_draft_len_schedule_caps_the_draft_length_by_batch_size(pair):
    t, d = pair
    llm = LLM(target=t, draft=d, draft_len_policy="fixed", trace=True, draft_len_schedule={1: 7, 4: 2, 64: 0})
    sp = SamplingParams(max_tokens=30, ignore_eos=True)

    def lengths(n):
        return {len(dr) for o in llm.generate([[20 + i, 21] for i in range(n)], sp) for dr, _ in o.trace}

    assert 7 in lengths(1) and max(lengths(1)) == 7
    assert max(lengths(3)) == 2
    assert lengths(8) == set()  # no drafting at all past 4 requests


def test_min_acceptance_turns_speculation_off_for_a_request_whose_drafts_miss(pair):
    t, d = pair
    prompt, sp = [40, 41, 42], SamplingParams(max_tokens=40, ignore_eos=True)
    ar = LLM(target=t, speculative=False).generate([prompt], sp)[0].token_ids
    llm = LLM(target=t, draft=d, draft_len_policy="fixed", trace=True, min_acceptance=0.5, acceptance_window=4)
    eng = llm.engine
    seq = eng.add_request(prompt, sp)
    right = tiny.OracleDrafter(lambda s: ar)
    eng.proposer.propose = tiny.as_propose(
        lambda work: {k: [(x + 1) % tiny.VOCAB for x in v] for k, v in right(work).items()})
    while eng.has_unfinished():
        eng.step()
    assert seq.output_ids == ar
    assert len(seq.trace) == 4 and not seq.spec_enabled  # four missed steps, then plain decoding


def test_stops_and_lengths_hold_inside_a_mixed_batch(pair):
    t, d = pair
    llm = LLM(target=t, draft=d)
    prompt, others = [20, 21, 22], [[30 + i, 31] for i in range(5)]
    free = llm.generate([prompt], SamplingParams(max_tokens=30, ignore_eos=True))[0]
    stop, tok = free.text[3:5], free.token_ids[4]
    params = [SamplingParams(max_tokens=30, ignore_eos=True, stop=[stop]),
              SamplingParams(max_tokens=30, ignore_eos=True, stop_token_ids=[tok]),
              SamplingParams(max_tokens=7, ignore_eos=True)]
    batch = llm.generate([prompt] * 3 + others, params + [SamplingParams(max_tokens=25, ignore_eos=True)] * 5)
    assert batch[0].finish_reason == "stop" and batch[0].text == free.text[:free.text.find(stop)]
    assert batch[1].finish_reason == "stop" and batch[1].token_ids == free.token_ids[:free.token_ids.index(tok) + 1]
    assert batch[2].finish_reason == "length" and batch[2].token_ids == free.token_ids[:7]
    assert all(len(o.token_ids) == 25 for o in batch[3:])


def test_metrics_add_up_per_iteration_per_request_and_cache(pair):
    t, d = pair
    llm = LLM(target=t, draft=d, draft_len_policy="fixed")
    eng = llm.engine
    sp = SamplingParams(max_tokens=20, ignore_eos=True)
    seqs = [llm.add_request([50 + i, 51, 52], sp) for i in range(6)]
    usage = []
    while eng.has_unfinished():
        eng.step()
        usage.append(eng.stats()["cache_usage"])
    outs = [llm.output(s) for s in seqs]
    its = eng.metrics.iterations
    assert sum(it.num_tokens for it in its) == sum(len(o.token_ids) for o in outs) == 120
    assert sum(it.drafted for it in its) == sum(o.drafted for o in outs) > 0
    assert sum(it.accepted for it in its) == sum(o.accepted for o in outs)
    assert max(it.batch_size for it in its) == 6 and all(it.num_rows >= it.batch_size for it in its)
    for o in outs:
        assert 0 < o.ttft <= o.latency and 0 < o.tpot <= o.latency
        assert o.tau == (pytest.approx(1 + o.accepted / o.num_drafts) if o.num_drafts else None)
    assert max(usage) > 0 and eng.stats()["cache_usage"] == 0


def test_without_chunked_prefill_long_prompts_are_refused_and_recomputes_still_chunk(pair):
    from dflash_trt.errors import DFlashError

    t, d = pair
    rng = random.Random(4)  # all at once, long answers: the cache fills when requests are past 32 tokens
    reqs = [([rng.randrange(4, tiny.VOCAB) for _ in range(rng.randint(20, 30))],
             SamplingParams(max_tokens=40, ignore_eos=True), 0) for _ in range(8)]
    llm = LLM(target=t, draft=d, enable_chunked_prefill=False, max_num_tokens=32, max_batch_size=32, page_size=4,
              max_seq_len=128, kv_cache_bytes=_bytes_for(t, d, pages=48, page=4))
    with pytest.raises(DFlashError, match="more than max_num_tokens .32. with chunked prefill off"):
        llm.engine.add_request(list(range(4, 40)), SamplingParams(max_tokens=4))
    # a preempted request recomputes prompt + output, which may exceed the row budget: it is chunked
    sched, lengths = llm.engine.scheduler, []
    preempt = sched._preempt
    sched._preempt = lambda victim: (lengths.append(len(victim.token_ids)), preempt(victim))
    seqs = run_with_arrivals(llm, reqs)
    assert max(lengths) > 32
    solo = LLM(target=t, speculative=False)
    assert outputs(seqs) == [solo.generate([p], sp)[0].token_ids for p, sp, _ in reqs]


def test_cache_budget_too_small_for_one_sequence_is_a_one_line_error(pair):
    from dflash_trt.errors import DFlashError

    t, d = pair
    with pytest.raises(DFlashError, match="fewer than max_seq_len 128: raise kv_cache_bytes or lower max_seq_len"):
        LLM(target=t, draft=d, page_size=4, max_seq_len=128, kv_cache_bytes=_bytes_for(t, d, pages=16, page=4))
    llm = LLM(target=t, draft=d, page_size=4, max_seq_len=128, kv_cache_bytes=_bytes_for(t, d, pages=33, page=4))
    assert llm.engine.blocks.num_blocks == 33  # sized from the budget: max_seq_len plus one page fits
