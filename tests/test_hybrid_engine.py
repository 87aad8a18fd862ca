"""Hybrid linear-attention targets (Qwen3.5 / Qwen3.6 / Qwen3-Next) in the engine: DFlash == AR for every family
and acceptance length, under load (staggered arrivals, chunked prefill, preemption, cancellation), greedy and
seeded sampling, with both rollback modes; and each request's linear-attention state after every step equal,
bit for bit, to a from-scratch prefill of the tokens it has committed. A rollback that keeps one rejected row
too many is caught by that check."""
import random

import pytest
import torch

import families
import test_families_qwen3_5 as hyb_tests
import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import DFlashError
from dflash_trt.models.qwen3_5 import HybridRunner
from test_batching import Probe, outputs, run_with_arrivals

DRAFT_LAYERS = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    made = {}

    def get(kind, block_size=10):
        if (kind, block_size) not in made:
            root = tmp_path_factory.mktemp(kind)
            t = families.save_hf(hyb_tests.hf_model(kind), str(root / "t"))
            d = families.drafter_for(str(root / "d"), t, block_size=block_size, extra=DRAFT_LAYERS)
            made[kind, block_size] = (t, d)
        return made[kind, block_size]
    return get


@pytest.mark.parametrize("kind,block", [("qwen3_5", 16), ("qwen3_5_moe", 10), ("qwen3_next", 10),
                                        ("qwen3_5_vl", 10)])
def test_dflash_equals_ar(pairs, kind, block):
    t, d = pairs(kind, block)
    eng = LLM(target=t, draft=d).engine
    assert eng.runner.states is not None and len(eng.runner.target_caches) == len(
        eng.target_config.cached_layers) < eng.target_config.num_hidden_layers  # KV for full attention only
    assert families.assert_lossless(t, d, families.prompts(6, seed=len(kind)), max_tokens=20,
                                    draft_lens=(3, block - 1)) > 0


def _state_of(eng, slot):
    pool = eng.runner.states
    return pool.conv[:, slot].clone(), pool.rec[:, slot].clone()


class StateCheck:
    """After engine steps, each sampled decoding request's state slot against a from-scratch prefill of its
    committed tokens (positions 0..num_computed-1) through the same model, bitwise."""

    def __init__(self, eng, every=4, per_step=1):
        self.eng, self.every, self.per_step, self.steps, self.checked = eng, every, per_step, 0, 0
        self.ref = HybridRunner(eng.target, max_seqs=1, max_len=eng.cfg.max_seq_len + 16)

    def __call__(self):
        self.steps += 1
        if self.steps % self.every:
            return
        live = [s for s in self.eng.scheduler.running if not s.in_prefill and s.num_computed > 0]
        for s in live[:self.per_step]:
            self.ref.prefill(0, s.token_ids[:s.num_computed])
            conv, rec = _state_of(self.eng, s.state_slot)
            assert torch.equal(conv, self.ref.pool.conv[:, 0]) and torch.equal(rec, self.ref.pool.rec[:, 0]), \
                f"request {s.request_id}: state after {s.num_computed} committed tokens != its recompute"
            self.checked += 1


def _stepping(eng, check):
    step = eng.step

    def stepped():
        out = step()
        check()
        return out
    eng.step = stepped


def _small(t, d, **kw):
    """48 pages of 4 positions beside the state slots, 48 rows per iteration, 8 running: chunked prefill mixed
    with verify blocks, and preemption."""
    probe = LLM(target=t, draft=d, speculative=d is not None, max_num_tokens=48, max_batch_size=8, page_size=4,
                max_seq_len=128).engine.kv_plan
    return LLM(target=t, draft=d, speculative=d is not None, max_num_tokens=48, max_batch_size=8, page_size=4,
               max_seq_len=128, kv_cache_bytes=48 * probe.bytes_per_block + probe.state_bytes, **kw)


def _workload(n, seed):
    rng = random.Random(seed)
    return [([rng.randrange(4, hyb_tests.VOCAB) for _ in range(rng.randint(1, 50))],
             SamplingParams(max_tokens=rng.randint(1, 36), ignore_eos=True), rng.randint(0, 40)) for _ in range(n)]


@pytest.mark.parametrize("rollback", ["states", "inputs"])
def test_every_acceptance_length_under_load_with_preemption_and_cancellation(pairs, rollback):
    t, d = pairs("qwen3_5", 10)
    reqs = _workload(64, seed=1)
    # the AR reference batched at once: a row's tokens do not depend on its batch (the invariant kernels)
    alone = [o.token_ids for o in LLM(target=t, speculative=False, max_batch_size=64).generate(
        [p for p, _, _ in reqs], [sp for _, sp, _ in reqs])]
    llm = _small(t, d, draft_len_policy="fixed", max_draft_len=7, trace=True, linear_rollback=rollback)
    eng = llm.engine
    assert eng.linear_rollback == rollback and eng.kv_plan.state_slots == 8
    truth = {tuple(p): a for (p, _, _), a in zip(reqs, alone)}
    eng.proposer.propose = tiny.as_propose(tiny.OracleDrafter(lambda s: truth[tuple(s.prompt_ids)]))
    probe = Probe(eng)
    check = StateCheck(eng)
    _stepping(eng, check)
    cancelled = {}

    def aborts(eng, seqs, it):  # one waiting, one running mid-output, one preempted request
        kinds = {"waiting": [s for s in eng.scheduler.waiting if s.num_preemptions == 0],
                 "running": [s for s in eng.scheduler.running if s.num_output > 2],
                 "preempted": [s for s in eng.scheduler.waiting if s.num_preemptions > 0]}
        for kind, cands in kinds.items():
            if kind not in cancelled and cands and it > 10:
                eng.abort(cands[-1].request_id)
                assert cands[-1].state_slot == -1
                cancelled[kind] = cands[-1]

    seqs = run_with_arrivals(llm, reqs, aborts)
    assert set(cancelled) == {"waiting", "running", "preempted"}
    assert eng.blocks.slots is not None and sorted(eng.blocks.slots) == list(range(8)), "state slots leaked"
    for s, a in zip(seqs, alone):
        if s not in cancelled.values():
            assert s.output_ids == a
    assert eng.scheduler.num_preemptions > 0
    assert {acc for s in seqs for dr, acc in s.trace if len(dr) == 7} == set(range(8))
    assert check.checked > 10
    its = probe.iters  # prefill chunks (some partial), verify blocks and decode rows shared iterations
    assert sum(i["partial"] for i in its) > 0 and sum(i["prefill"] and i["decode"] for i in its) > 10


def test_seeded_sampling_under_load_equals_ar_alone(pairs):
    t, d = pairs("qwen3_next", 10)
    reqs = [(p, SamplingParams(max_tokens=sp.max_tokens, ignore_eos=True, temperature=0.9, top_p=0.95, seed=i), a)
            for i, (p, sp, a) in enumerate(_workload(64, seed=2))]
    alone = [o.token_ids for o in LLM(target=t, speculative=False, max_batch_size=64).generate(
        [p for p, _, _ in reqs], [sp for _, sp, _ in reqs])]
    llm = _small(t, d)
    assert outputs(run_with_arrivals(llm, reqs)) == alone
    assert llm.engine.scheduler.num_preemptions > 0


def test_a_rollback_that_keeps_a_rejected_row_is_caught(pairs):
    """The deliberately broken commit: one row past the accepted prefix. Tokens may survive it for a while (the
    tiny model's argmax is robust); the state check does not."""
    t, d = pairs("qwen3_5", 10)
    llm = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=7, linear_rollback="states")
    eng = llm.engine
    ps = families.prompts(4, seed=9)
    sp = SamplingParams(max_tokens=30, ignore_eos=True)
    truth = {tuple(p): o.token_ids for p, o in zip(ps, LLM(target=t, speculative=False).generate(ps, sp))}
    eng.proposer.propose = tiny.as_propose(tiny.OracleDrafter(lambda s: truth[tuple(s.prompt_ids)]))
    commit = eng.target.commit
    eng.target.commit = lambda pool, lb, seg, rows: commit(pool, lb, seg, min(rows + 1, lb.lens[seg]))
    _stepping(eng, StateCheck(eng, every=1))
    with pytest.raises(AssertionError, match="!= its recompute"):
        llm.generate(ps, sp)


def test_state_pool_is_counted_in_the_cache_budget_and_tp_and_prefix_caching_are_refused(pairs):
    t, d = pairs("qwen3_5", 10)
    base = dict(target=t, draft=d, max_batch_size=6, page_size=4, max_seq_len=64)
    eng = LLM(**base).engine
    plan, per_req = eng.kv_plan, eng.target.state_bytes_per_request()
    assert per_req > 0 and plan.state_slots == 6 and plan.state_bytes == 6 * per_req
    assert eng.runner.states.bytes_per_slot() == per_req
    budget = 40 * plan.bytes_per_block + plan.state_bytes
    assert LLM(**base, kv_cache_bytes=budget).engine.kv_plan.num_blocks == 40
    with pytest.raises(DFlashError, match="tensor parallelism"):
        LLM(**base, tp_size=2)
    assert not eng.prefix_caching  # unset: off for a target whose state no cache block holds
    with pytest.raises(DFlashError, match="prefix caching is not supported.*linear-attention"):
        LLM(**base, enable_prefix_caching=True)
