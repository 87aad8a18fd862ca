"""Prefix caching: requests with a common prefix share its cache blocks (target KV and drafter context), and the
output stays exactly what each request gets without the cache, alone or under load, through eviction,
preemption and cancellation; the drafter's drafts are the same position by position."""
import random

import pytest

import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import DFlashError
from test_batching import Probe, outputs, run_with_arrivals

PAGE = 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny.accepting_pair(str(tmp_path_factory.mktemp("prefix")))


def shared_prefix_workload(n=32, seed=0):
    """Chat-like: a few long system prompts, each request one of them plus its own turn; arrivals spread out so
    later requests find earlier ones' blocks published (some still running, some finished). Every other request
    samples (seeded)."""
    rng = random.Random(seed)
    systems = [[rng.randrange(4, tiny.VOCAB) for _ in range(rng.randint(13, 30))] for _ in range(3)]
    return [(rng.choice(systems) + [rng.randrange(4, tiny.VOCAB) for _ in range(rng.randint(0, 9))],
             SamplingParams(max_tokens=rng.randint(1, 24), ignore_eos=True, **({"temperature": 0.8, "seed": i}
                                                                              if i % 2 else {})),
             rng.randint(0, 60)) for i in range(n)]


def _engine(t, d, caching, **kw):
    # whole drafter blocks: the drafts are compared, and a trimmed block's follow the longest draft of its batch
    return LLM(target=t, draft=d, speculative=d is not None, draft_len_policy="fixed", page_size=PAGE,
               max_num_tokens=48, max_batch_size=8, max_seq_len=96, enable_prefix_caching=caching,
               trim_draft_block=False, **kw)


@pytest.mark.parametrize("spec", [True, False])
def test_prefix_hits_change_nothing_but_the_rows_computed(pair, spec):
    t, d = pair
    reqs = shared_prefix_workload()
    off = _engine(t, d if spec else None, False)
    assert not off.engine.prefix_caching
    p_off = Probe(off.engine)
    seqs_off = run_with_arrivals(off, reqs)
    on = _engine(t, d if spec else None, True)
    p_on = Probe(on.engine)
    seqs = run_with_arrivals(on, reqs)  # asserts every block is back (free or evictable)
    assert outputs(seqs) == outputs(seqs_off)
    stats = on.engine.stats()
    assert stats["prefix_cache_hits"] >= 12 * PAGE * 8, stats  # most requests found their system prompt
    assert sum(i["rows"] for i in p_on.iters) < sum(i["rows"] for i in p_off.iters) - stats["prefix_cache_hits"] // 2
    if spec:  # the drafter read the shared pages' context: the same drafts as without the cache
        index_off = {s.seq_id: i for i, s in enumerate(seqs_off)}
        index_on = {s.seq_id: i for i, s in enumerate(seqs)}
        ref = {(index_off[sid], pos): dr for (sid, pos), dr in p_off.drafts.items()}
        compared = 0
        for (sid, pos), dr in p_on.drafts.items():
            other = ref.get((index_on[sid], pos))
            if other is not None and dr:  # the shorter a prefix of the longer: the row budget may cut K
                n = min(len(dr), len(other))
                assert dr[:n] == other[:n], f"request {index_on[sid]} drafted differently at {pos} with a prefix hit"
                compared += 1
        assert compared > 50
        assert sum(s.accepted for s in seqs) > 0


def _alone(t, d, prompt, sp):
    """The request alone on an engine without the cache: (its sequence, a probe of its drafts)."""
    ref = _engine(t, d, False)
    probe = Probe(ref.engine)
    seq = ref.engine.add_request(prompt, sp)
    while ref.engine.has_unfinished():
        ref.engine.step()
    return seq, probe


def _never_drafts(eng, seq):
    draft_len = eng.policy.draft_len
    eng.policy.draft_len = lambda s, *rest: 0 if s is seq else draft_len(s, *rest)


def _drafts_of(probe, seq):
    return {pos: dr for (sid, pos), dr in probe.drafts.items() if sid == seq.seq_id}


def test_a_hit_on_a_request_that_does_not_draft_reads_its_written_context(pair):
    """The drafter's context is written lazily: a request that does not draft queues its rows. Another request
    that hits its published blocks must find their context written when it first drafts (the proposer's share,
    not at the hit itself), so it drafts what it drafts without the cache."""
    t, d = pair
    system = list(range(20, 20 + 4 * PAGE))
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    alone, p_ref = _alone(t, d, system + [9], sp)
    llm = _engine(t, d, True)
    eng = llm.engine
    p_on = Probe(eng)
    a = eng.add_request(system + [7], sp)
    _never_drafts(eng, a)
    while a.in_prefill or a.num_output < 3:
        eng.step()
    assert eng.proposer.pending_rows(a.seq_id) >= 4 * PAGE  # its prompt's context is still queued
    b = eng.add_request(system + [9], sp)
    eng.step()
    assert b.num_cached_tokens == 4 * PAGE and eng.proposer.pending_rows(a.seq_id) >= 4 * PAGE  # the hit wrote none
    while not _drafts_of(p_on, b):
        eng.step()
    assert eng.proposer.pending_rows(a.seq_id) == 1  # b's first draft wrote a's queue; a committed one row since
    while eng.has_unfinished():
        eng.step()
    assert b.output_ids == alone.output_ids
    on, off = _drafts_of(p_on, b), _drafts_of(p_ref, alone)
    assert len(on) >= 3 and on == {pos: off[pos] for pos in on}


def test_a_hit_on_a_finished_request_reads_the_context_it_left_parked(pair):
    """A request that leaves without drafting owes its cached blocks their drafter context: the rows stay parked
    until a request that hit those blocks drafts (not at the hit: a request that never drafts costs the drafter
    nothing), and it must draft what it drafts without the cache."""
    t, d = pair
    system = list(range(20, 20 + 4 * PAGE))
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    alone, p_ref = _alone(t, d, system + [9], sp)
    eng = _engine(t, d, True).engine
    p_on = Probe(eng)
    a = eng.add_request(system + [7], SamplingParams(max_tokens=3, ignore_eos=True))
    _never_drafts(eng, a)
    while eng.has_unfinished():
        eng.step()
    assert eng.proposer.pending_rows(a.seq_id) == 0 and eng.proposer.parked_rows >= 4 * PAGE  # not written
    b = eng.add_request(system + [9], sp)
    eng.step()
    assert b.num_cached_tokens == 4 * PAGE and eng.proposer.parked_rows >= 4 * PAGE  # the hit wrote nothing
    while not _drafts_of(p_on, b):
        eng.step()
    assert eng.proposer.parked_rows < 4 * PAGE  # b's first draft wrote the rows its blocks owed
    while eng.has_unfinished():
        eng.step()
    assert b.output_ids == alone.output_ids
    on, off = _drafts_of(p_on, b), _drafts_of(p_ref, alone)
    assert len(on) >= 3 and on == {pos: off[pos] for pos in on}


def test_parked_context_goes_with_its_evicted_block(pair):
    """Parked rows belong to a block's old contents: once its space is reused they are dropped, never written
    over the rows of its new owner (whose blocks later requests hit)."""
    t, d = pair
    llm = _engine(t, d, True)
    eng = llm.engine
    a = eng.add_request(list(range(20, 20 + 6 * PAGE)) + [7], SamplingParams(max_tokens=3, ignore_eos=True))
    _never_drafts(eng, a)
    while eng.has_unfinished():
        eng.step()
    parked = {b: eng.blocks.main.digest_of[b] for b in eng.proposer.parked}
    assert len(parked) >= 6
    rng = random.Random(5)
    prefixes = [[rng.randrange(4, tiny.VOCAB) for _ in range(80)] for _ in range(12)]  # > the 200 blocks
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    ref = _engine(t, d, False)
    p_on, p_ref = Probe(eng), Probe(ref.engine)
    for q in prefixes:  # the first of each pair fills the cache (evicting), the second hits its blocks
        for tail in ([5], [6]):
            s_on, s_ref = eng.add_request(q + tail, sp), ref.engine.add_request(q + tail, sp)
            while eng.has_unfinished():
                eng.step()
            while ref.engine.has_unfinished():
                ref.engine.step()
            assert s_on.output_ids == s_ref.output_ids
            assert _drafts_of(p_on, s_on) == _drafts_of(p_ref, s_ref)
    assert all(eng.blocks.main.digest_of.get(b) != dg for b, dg in parked.items())  # all reused
    assert not set(parked).intersection(eng.proposer.parked)


def test_shared_blocks_survive_the_other_requests_cancellation_and_eviction(pair):
    t, d = pair
    llm = _engine(t, d, True)
    eng = llm.engine
    system = list(range(20, 20 + 4 * PAGE))
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = [o.token_ids for o in _engine(t, d, False).generate([system + [7], system + [9]], sp)]
    a = eng.add_request(system + [7], sp)
    while a.in_prefill or a.num_output < 3:
        eng.step()
    b = eng.add_request(system + [9], sp)
    eng.step()
    assert b.block_table[:4] == a.block_table[:4], "the second request should read the first one's blocks"
    assert b.num_cached_tokens == 4 * PAGE and llm.output(b).cached_tokens == 4 * PAGE
    shared = a.block_table[:4]
    assert all(eng.blocks.main.ref[x] == 2 for x in shared)
    eng.abort(a.request_id)
    assert all(eng.blocks.main.ref[x] == 1 for x in shared)
    while eng.has_unfinished():
        eng.step()
    assert b.output_ids == alone[1]
    # released, the published blocks wait in the LRU; a cache-filling load evicts them and stays exact
    assert eng.blocks.main.lru and eng.blocks.num_free == eng.blocks.num_blocks
    rng = random.Random(3)
    fill = [[rng.randrange(4, tiny.VOCAB) for _ in range(60)] for _ in range(12)]
    outs = llm.generate(fill, SamplingParams(max_tokens=8, ignore_eos=True))
    ref = _engine(t, d, False).generate(fill, SamplingParams(max_tokens=8, ignore_eos=True))
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    assert eng.blocks.num_free == eng.blocks.num_blocks


def test_preempted_requests_recompute_from_their_own_published_blocks(pair):
    t, d = pair
    reqs = shared_prefix_workload(24, seed=4)
    ref = outputs(run_with_arrivals(_engine(t, d, False), reqs))
    probe = LLM(target=t, draft=d, page_size=PAGE, max_seq_len=96).engine.kv_plan
    small = _engine(t, d, True, kv_cache_bytes=40 * probe.bytes_per_block)
    seqs = run_with_arrivals(small, reqs)
    assert outputs(seqs) == ref
    assert small.engine.scheduler.num_preemptions > 0
    assert small.engine.stats()["prefix_cache_hits"] > 0


def test_targets_without_shareable_blocks_refuse_it_in_one_line(tmp_path):
    from test_families_gemma3 import gemma3

    t = gemma3(str(tmp_path / "g"))  # sliding-window layers in their own pool
    assert not LLM(target=t, speculative=False, page_size=PAGE, max_seq_len=256).engine.prefix_caching
    with pytest.raises(DFlashError, match="prefix caching is not supported.*sliding-window.*--no-prefix-caching"):
        LLM(target=t, speculative=False, page_size=PAGE, max_seq_len=256, enable_prefix_caching=True)
