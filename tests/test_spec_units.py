"""The speculative method's parts without a model: the policy's K rules and their precedence, the verify
dispatch (every back end agrees), the scheduler's postprocess (each finish path, stop strings split across
steps, aborts), KV-pool planning and the block manager, incremental detokenization, n-gram lookup."""
from __future__ import annotations

import random

import pytest
import torch

from dflash_trt.detokenizer import DetokState, Detokenizer
from dflash_trt.engine_config import EngineConfig
from dflash_trt.errors import DFlashError
from dflash_trt.kv_cache import BlockManager, CacheBlocks, WindowBlockManager, allocate_pools, plan_kv_pools
from dflash_trt.sampling import SamplingParams
from dflash_trt.scheduler import Scheduled, Scheduler
from dflash_trt.sequence import Sequence, Status
from dflash_trt.spec.config import SpecConfig
from dflash_trt.spec.ngram import NGramProposer, lookup
from dflash_trt.spec.policy import CPU_MIN_CONFIDENCE, SpecPolicy, StepCosts
from dflash_trt.spec.verify import Verifier, VerifyItem, accept

FREE = StepCosts(row=0.0, draft=0.0, draft_row=0.0)  # drafting costs nothing: adaptive drafts the cap
DEAR = StepCosts(row=1.0, draft=5.0, draft_row=1.0)  # drafting never pays


def seq_with(out=0, max_tokens=64, prompt=8, **kw):
    s = Sequence(list(range(1, prompt + 1)), SamplingParams(max_tokens=max_tokens, seed=0, **kw))
    s.token_ids += [1] * out
    return s


# ------------------------------------------------------------------------------------------------- policy
def policy(costs=FREE, k=7, **spec):
    return SpecPolicy(SpecConfig(**spec), k, "cpu", costs)


def test_policy_cap_schedule_and_room():
    p = policy(draft_len_schedule={1: 7, 4: 3, 16: 1})
    s = seq_with(out=1)
    p.new_request(s)
    assert p.begin_iteration(1) == 7 and p.begin_iteration(3) == 3 and p.begin_iteration(40) == 1
    assert p.draft_len(s, 7, 1, 4096) == 7  # free drafting: the adaptive model drafts the whole cap
    assert p.draft_len(s, 3, 1, 4096) == 3  # the schedule's cap wins over the model
    near_end = seq_with(out=60, max_tokens=64)  # 4 tokens left: a step commits K + 1 <= 4
    p.new_request(near_end)
    assert p.draft_len(near_end, 7, 1, 4096) == 3
    no_room = seq_with(out=1)
    p.new_request(no_room)
    assert p.draft_len(no_room, 7, 1, len(no_room.token_ids) + 2) == 2  # max_seq_len bounds K too


def test_policy_gate_precedes_everything_and_fixed_ignores_costs():
    p = policy(DEAR, min_acceptance=1.0, acceptance_window=2, draft_len_policy="fixed")
    s = seq_with(out=1)
    p.new_request(s)
    assert p.draft_len(s, 7, 1, 4096) == 7  # fixed: the cap, whatever drafting costs
    p.observe(s, 7, 0)
    assert s.spec_enabled
    p.observe(s, 7, 1)
    assert not s.spec_enabled  # mean 0.5 over the window < 1.0: speculation off for good
    assert p.draft_len(s, 7, 1, 4096) == 0
    assert policy(DEAR).draft_len(_new(policy(DEAR)), 7, 1, 4096) in (0, 1)  # adaptive: not worth drafting


def _new(p):
    s = seq_with(out=1)
    p.new_request(s)
    return s


def test_policy_no_drafter_drafts_nothing():
    p = SpecPolicy(SpecConfig(method=None), 0, "cpu", FREE)
    s = seq_with(out=1)
    p.new_request(s)
    assert s.acceptance is None and p.begin_iteration(1) == 0 and p.draft_len(s, 7, 1, 4096) == 0


def test_policy_confidence_cut_defaults_and_rule():
    assert policy().min_confidence == CPU_MIN_CONFIDENCE
    assert policy(draft_len_policy="fixed").min_confidence == 0.0
    assert SpecPolicy(SpecConfig(), 7, "cuda", FREE).min_confidence == 0.0
    assert policy(min_draft_confidence=0.3, draft_len_policy="fixed").min_confidence == 0.3
    assert SpecPolicy(SpecConfig(), 7, "cpu", FREE, supports_confidence=False).min_confidence == 0.0
    p = policy(min_draft_confidence=0.5)
    lens = {1: 3, 2: 3, 3: 1}
    conf = {1: [0.1, 0.9, 0.2], 2: [0.9, 0.4, 0.9], 3: [0.01]}
    # the first draft always stays (the drafter pass is paid); each block ends before its first doubted one
    assert p.cut(lens, conf) == {1: 2, 2: 1, 3: 1}
    assert p.cut(lens, None) == lens


def test_policy_break_even_shortcut_is_exact():
    """drafts_at skips the cost model only where nothing pays: it equals best_draft_len everywhere, at every
    batch, cap and margin, for straight-line costs and measured curves alike; a shortcut that cut at the
    bisection's high end would draft nothing just above the true break-even."""
    from dflash_trt.spec import policy as P

    measured = StepCosts(row=0.17, draft=0.3, draft_row=0.17,
                         curve=((1, 1.17), (4, 1.64), (16, 3.76), (32, 6.03)), draft_curve=((1, 0.47), (4, 0.92), (16, 3.1)))
    for costs in (StepCosts.for_device("cpu"), measured, FREE, DEAR):
        lengths = P.DraftLengthPolicy("adaptive", costs)
        for batch in (1, 2, 4, 16, 32):
            for k_cap in (1, 3, 7):
                for margin in (0.0, P.MARGIN):
                    for i in range(401):
                        p = i / 400
                        assert lengths.drafts_at(p, k_cap, batch, margin) == \
                            P.best_draft_len(p, k_cap, batch, costs, margin), (costs, batch, k_cap, margin, p)
    lengths = P.DraftLengthPolicy("adaptive", measured)
    edge = lengths._nothing_pays_up_to(7, 1, P.MARGIN)
    assert 0 < edge < 1 and P.best_draft_len(edge, 7, 1, measured, P.MARGIN) == 0
    assert P.best_draft_len(edge + 1e-6, 7, 1, measured, P.MARGIN) > 0


def test_policy_pass_free_proposers_draft_for_free():
    cfg = SpecConfig(method="ngram")
    p = SpecPolicy.for_device(cfg, 7, "cpu", {"row": 0.1, "draft": 0.4, "draft_row": 0.2}, pass_cost=False)
    assert (p.costs.row, p.costs.draft, p.costs.draft_row) == (0.1, 0.0, 0.0)


def test_spec_settings_are_validated_and_routed():
    cfg = EngineConfig.from_kwargs(speculative="ngram", max_draft_len=3, max_batch_size=4)
    assert (cfg.spec.method, cfg.spec.max_draft_len, cfg.max_batch_size) == ("ngram", 3, 4)
    assert EngineConfig.from_kwargs(speculative=False).spec.method is None
    with pytest.raises(DFlashError, match="unknown speculative method"):
        EngineConfig.from_kwargs(speculative="medusa")
    with pytest.raises(DFlashError, match="unknown engine option 'max_draft'"):
        EngineConfig.from_kwargs(max_draft=3)
    with pytest.raises(DFlashError, match="ngram_min"):
        SpecConfig(ngram_min=3, ngram_max=2)


# ------------------------------------------------------------------------------------------------- verify
def _verify_case(rng, vocab, greedy):
    items, rows = [], 0
    for _ in range(rng.randint(1, 6)):
        k = rng.randint(0, 5)
        sp = SamplingParams(seed=rng.randrange(1 << 40)) if greedy else SamplingParams(
            temperature=rng.choice([0.0, 0.7, 1.3]), top_k=rng.choice([0, 5]), top_p=rng.choice([1.0, 0.8]),
            seed=rng.randrange(1 << 40))
        items.append(VerifyItem(sp, [rng.randrange(vocab) for _ in range(k)], rows, rng.randint(0, 100)))
        rows += k + 1
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))) * 3
    for it in items:  # make most drafts right, so every acceptance length occurs
        for j, d in enumerate(it.drafts):
            if rng.random() < 0.7:
                logits[it.offset + j, d] += 50.0
    return items, logits


class SplitHead:
    """A vocabulary split over `parts` shards, each shard's logits seen separately (what tensor parallelism
    gives each rank), with the distributed argmax's rule: the first maximum over the shards in order."""

    def __init__(self, full, parts):
        self.full, self.parts = full, parts

    def argmax(self, local):
        shards = torch.tensor_split(local, self.parts, dim=1)
        vals = torch.stack([s.max(-1).values for s in shards])
        offs = torch.tensor([0] + [s.shape[1] for s in shards]).cumsum(0)[:-1]
        idx = torch.stack([s.argmax(-1) + o for s, o in zip(shards, offs)])
        return idx.gather(0, vals.argmax(0)[None])[0]

    def gather(self, local):
        return torch.cat(torch.tensor_split(local, self.parts, dim=1), dim=1)


@pytest.mark.parametrize("greedy", [True, False])
def test_every_verify_backend_agrees(greedy):
    from dflash_trt.plugins import dflash_ops

    ops = dflash_ops if dflash_ops.available() else None
    rng = random.Random(7 + greedy)
    for _ in range(40):
        items, logits = _verify_case(rng, 97, greedy)
        ref = Verifier()(items, logits)
        assert Verifier(tp_head=SplitHead(logits, 3))(items, logits) == ref
        if ops is not None:
            assert Verifier(ops)(items, logits) == ref
        for it, got in zip(items, ref):  # and each one is accept() of the target's own choices
            assert got[:-1] == it.drafts[:len(got) - 1] and 1 <= len(got) <= len(it.drafts) + 1
    assert ops is not None, "the plugins' CPU ops should build here"


def test_accept_is_the_longest_agreeing_prefix():
    assert accept([5, 6, 7], [5, 6, 9, 1]) == (2, [5, 6, 9])
    assert accept([], [4]) == (0, [4])
    assert accept([1, 2], [1, 2, 3]) == (2, [1, 2, 3])


# -------------------------------------------------------------------------------------- scheduler postprocess
class CharTokenizer:
    """Token id i is the character chr(ord('a') + i % 26); 0 is a special token with no text."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("" if i == 0 else chr(ord("a") + i % 26) for i in ids)


def scheduler(blocks=64, tokenizer=None, **cfg):
    c = EngineConfig.from_kwargs(speculative=False, max_seq_len=cfg.pop("max_seq_len", 256), **cfg)
    return Scheduler(c, CacheBlocks(BlockManager(blocks, 16)), eos_ids=[2], detokenizer=Detokenizer(tokenizer))


def run_prefill(sch, seq):
    sch.add(seq)
    work = sch.schedule()
    assert [w.seq for w in work] == [seq] and work[0].is_prefill
    return sch.postprocess(work, {}, {seq.seq_id: [3]}, 0.0)


def decode(sch, seq, toks, drafts=None):
    """One decoding step of `seq` that verified `drafts` and committed `toks`."""
    drafts = drafts or []
    work = [Scheduled(w.seq, len(drafts) + 1, len(drafts), False) for w in sch.schedule() if w.seq is seq]
    return sch.postprocess(work, {seq.seq_id: drafts}, {seq.seq_id: toks}, 1.0)


@pytest.mark.parametrize("case", ["eos", "stop_id", "max_tokens", "max_seq_len", "ignore_eos"])
def test_each_finish_reason(case):
    sp = dict(max_tokens=6)
    if case == "stop_id":
        sp["stop_token_ids"] = [9]
    if case == "ignore_eos":
        sp["ignore_eos"] = True
    sch = scheduler(max_seq_len=12 if case == "max_seq_len" else 256)
    s = Sequence([1] * 8, SamplingParams(seed=0, **sp))
    run_prefill(sch, s)
    toks = {"eos": [4, 2, 5], "stop_id": [4, 9, 5], "max_tokens": [4, 4, 4, 4, 4, 4],
            "max_seq_len": [4, 4, 4, 4], "ignore_eos": [2, 2]}[case]
    decode(sch, s, toks)
    if case == "ignore_eos":
        assert not s.is_finished and s.output_ids == [3, 2, 2]
        return
    want = {"eos": ([3, 4, 2], "stop"), "stop_id": ([3, 4, 9], "stop"), "max_tokens": ([3, 4, 4, 4, 4, 4], "length"),
            "max_seq_len": ([3, 4, 4, 4], "length")}[case]
    assert (s.output_ids, s.finish_reason, s.status) == (*want, Status.FINISHED)
    assert sch.blocks.num_free == 64 and not sch.running  # blocks back at the moment it finished


def test_stop_string_split_across_steps_and_cut_from_the_text():
    sch = scheduler(tokenizer=CharTokenizer())
    s = Sequence([1] * 4, SamplingParams(seed=0, stop=["xyz"], max_tokens=50))
    run_prefill(sch, s)  # "d"
    decode(sch, s, [4, 23])  # "dex"
    assert not s.is_finished
    decode(sch, s, [24, 25, 5])  # "dexyzf": the stop string spans the two steps
    assert s.finish_reason == "stop" and s.text == "de" and s.output_ids == [3, 4, 23, 24, 25, 5]


def test_postprocess_records_the_speculative_step():
    sch = scheduler()
    s = Sequence([1] * 4, SamplingParams(seed=0, max_tokens=50), trace=[])
    run_prefill(sch, s)
    before = s.num_computed
    decode(sch, s, [7, 8, 9], drafts=[7, 8, 1, 1])  # 2 of 4 drafts accepted + the target's token
    assert (s.steps, s.drafted, s.accepted, s.trace) == (1, 4, 2, [([7, 8, 1, 1], 2)])
    assert s.num_computed == before + 3  # the bonus row and the two accepted drafts' rows are committed
    decode(sch, s, [5])  # a plain step: no drafts, no speculative statistics
    assert (s.steps, s.drafted, s.tau) == (1, 4, 3.0)


def step_all(sch):
    """One iteration where every decode row and every completed prompt commits the token 3."""
    work = sch.schedule()
    done = {w.seq.seq_id: [3] for w in work
            if not w.is_prefill or w.seq.num_computed + w.num_rows == w.seq.prefill_target}
    return sch.postprocess(work, {}, done, 0.0)


@pytest.mark.parametrize("where", ["waiting", "running", "preempted"])
def test_abort_frees_everything_wherever_the_request_is(where):
    sch = scheduler(blocks=3, max_num_tokens=64)  # pages of 16 positions
    a = Sequence([1] * 30, SamplingParams(seed=0, max_tokens=40))  # 2 pages
    b = Sequence([1] * 14, SamplingParams(seed=0, max_tokens=40))  # 1 page
    sch.add(a)
    if where == "waiting":
        sch.abort(a)
        assert not sch.waiting
    else:
        step_all(sch)
        assert a.status == Status.RUNNING and sch.blocks.num_free == 1
        if where == "preempted":
            sch.add(b)
            for _ in range(3):  # a grows into a third page: b, admitted last, gives its page back
                step_all(sch)
            assert sch.num_preemptions == 1 and b.status == Status.WAITING and b.num_preemptions == 1
            sch.abort(b)
            assert b.finish_reason == "abort" and b.is_finished and b not in sch.waiting
        sch.abort(a)
    assert a.finish_reason == "abort" and a.is_finished and sch.blocks.num_free == 3 and not sch.has_work()


# ----------------------------------------------------------------------------------- KV planning and blocks
def test_kv_plan_sizes_pools_from_the_budget():
    layers, draft = [(2, 8)] * 4, [(2, 8)] * 2
    per_block = 16 * 2 * (8 + 8) * 4 * 6  # page * kv heads * (k + v) * fp32 * layers
    plan = plan_kv_pools(layers, draft, [None] * 4, page=16, max_seq_len=64, max_batch_size=2, max_num_tokens=32,
                         dtype=torch.float32)
    assert plan.bytes_per_block == per_block and plan.num_blocks == 2 * (64 // 16 + 1) and not plan.windowed
    plan = plan_kv_pools(layers, draft, [None] * 4, page=16, max_seq_len=64, max_batch_size=2,
                         max_num_tokens=32, dtype=torch.float32, budget=per_block * 9 + 5)
    assert plan.num_blocks == 9
    with pytest.raises(DFlashError, match="raise kv_cache_bytes"):
        plan_kv_pools(layers, draft, [None] * 4, page=16, max_seq_len=64, max_batch_size=2, max_num_tokens=32,
                      dtype=torch.float32, budget=per_block * 4)
    # the fused drafter pass's scratch rows: whole pages past the pool in the drafter's caches only, outside
    # the budget and every block table
    plan = plan_kv_pools(layers, draft, [None] * 4, page=16, max_seq_len=64, max_batch_size=2, max_num_tokens=32,
                         dtype=torch.float32, budget=per_block * 9 + 5, draft_scratch_rows=40)
    assert plan.num_blocks == 9 and plan.draft_scratch_blocks == 3 and plan.draft_scratch == (9 * 16, 48)
    blocks, t_caches, d_caches = allocate_pools(plan, torch.float32, "cpu")
    assert [k.shape[0] for k, _ in t_caches] == [9] * 4 and [k.shape[0] for k, _ in d_caches] == [12] * 2
    assert blocks.num_blocks == 9


def test_kv_plan_gives_short_windows_a_pool_of_their_own():
    layers = [(1, 4)] * 4
    windows = [16, None, 16, None]
    plan = plan_kv_pools(layers, [], windows, page=8, max_seq_len=256, max_batch_size=3, max_num_tokens=16,
                         dtype=torch.float32)
    assert plan.windowed == [0, 2] and plan.window == 16
    assert plan.window_blocks == 3 * (2 + 2) + 2 + 1  # each request's window + a step's rows + the null block
    blocks, t_caches, d_caches = allocate_pools(plan, torch.float32, "cpu")
    assert [k.shape[0] for k, _ in t_caches] == [plan.window_blocks, plan.num_blocks] * 2 and d_caches == []
    assert isinstance(blocks.window, WindowBlockManager)
    long_window = plan_kv_pools(layers, [], [1024, None, 1024, None], page=8, max_seq_len=256, max_batch_size=3,
                                max_num_tokens=16, dtype=torch.float32)
    assert long_window.windowed == []  # a window as long as a sequence saves nothing


def test_block_manager_counts_stay_exact():
    rng = random.Random(0)
    bm = BlockManager(20, 4)
    tables = [[] for _ in range(5)]
    for _ in range(500):
        t = rng.choice(tables)
        if rng.random() < 0.3:
            bm.release(t)
        else:
            n = len(t) * 4 + rng.randint(0, 9)
            if bm.can_grow(t, n):
                bm.grow(t, n)
                assert len(t) == -(-n // 4)
        used = [b for t in tables for b in t]
        assert len(used) == len(set(used)) and len(used) + bm.num_free == 20
    with pytest.raises(MemoryError):
        bm.grow([], 21 * 4)


def test_window_blocks_leave_the_window():
    wb = WindowBlockManager(10, 4, window=8)
    t = []
    wb.grow(t, 20)
    assert wb.in_use(t) == 5 and wb.num_free == 4
    wb.trim(t, 20)  # the next row sees positions 13.. on: blocks 0-2 (positions 0-11) are dead
    assert t[:3] == [wb.NULL] * 3 and wb.in_use(t) == 2 and wb.num_free == 7
    wb.release(t)
    assert wb.num_free == 9 and t == []


# -------------------------------------------------------------------------------------- detokenizer, n-gram
def byte_bpe_tokenizer():
    """A byte-level BPE (GPT-2 / SmolLM2 style) trained here: tokens may hold parts of a UTF-8 character, the
    case incremental detokenization must not print as replacement characters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    text = ["def f(x):\n    return x + 1  # naïve café — 東京 ünïcödé ✓", "The quick brown fox jumps over 🦊 lazy"] * 50
    tk.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")


def test_incremental_text_equals_the_whole_decode():
    tok = byte_bpe_tokenizer()
    d, rng = Detokenizer(tok), random.Random(3)
    corpus = tok.encode("naïve café — 東京 🦊 ünïcödé ✓ def f(x): return x")
    for _ in range(40):
        ids, st, seen = [], DetokState(), []
        for _ in range(rng.randint(1, 12)):
            ids += [rng.choice(corpus) if rng.random() < 0.8 else rng.randrange(tok.vocab_size)
                    for _ in range(rng.randint(1, 4))]
            seen.append(d.update(st, ids))
        seen.append(d.update(st, ids, final=True))
        assert st.text == "".join(seen) == tok.decode(ids, skip_special_tokens=True)
        assert all(not piece.endswith("\ufffd") for piece in seen[:-1])  # never half a character mid-stream


def test_ngram_lookup():
    assert lookup([1, 2, 3, 9, 1, 2, 3], 3, 3, 1) == [9, 1, 2]  # the 3-gram [1, 2, 3] occurred before
    assert lookup([1, 2, 3, 7, 2, 3, 8, 2, 3], 2, 2, 1) == [8, 2]  # the most recent match wins
    assert lookup([5, 6, 7, 8], 4, 3, 1) == []
    assert lookup([4, 4], 3, 2, 1) == [4]
    p = NGramProposer(3, 1)
    s = seq_with()
    s.token_ids = [1, 2, 3, 4, 1, 2]
    out = p.propose([Scheduled(s, 3, 2, False), Scheduled(seq_with(), 4, 0, True)])
    assert out.drafts == {s.seq_id: [3, 4]} and out.confidence is None
