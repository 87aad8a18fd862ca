"""The adaptive draft length: the cost model's choices, the acceptance estimate, and the engine using both."""
import pytest

import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.spec.policy import (CPU_COSTS, CPU_MIN_CONFIDENCE, MARGIN, AcceptanceEstimate, DraftLengthPolicy,
                                     StepCosts, best_draft_len, confident_prefixes, expected_tokens, monotone_curve,
                                     pays)
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


def test_cost_curves_interpolate_and_go_on_with_their_end_slopes():
    c = StepCosts(row=9.0, draft=9.0, draft_row=9.0, curve=((1, 2.0), (4, 2.3), (16, 3.5), (32, 7.5)),
                  draft_curve=((1, 0.3), (4, 0.6), (16, 1.8)))
    assert [c.target(n) for n in (1, 2, 10, 16, 24, 32)] == pytest.approx([2.0, 2.1, 2.9, 3.5, 5.5, 7.5])
    assert c.target(64) == pytest.approx(7.5 + 0.25 * 32) and c.target(0) == pytest.approx(1.9)  # end slopes
    assert [c.drafter(n) for n in (0, 1, 2, 16, 32)] == pytest.approx([0.0, 0.3, 0.4, 1.8, 3.4])
    assert StepCosts(row=0.5, draft=0.25, draft_row=0.125).target(8) == 5.0  # no curve: the straight line
    assert StepCosts(row=0.5, draft=0.25, draft_row=0.125).drafter(2) == 0.5
    # a noisy measurement that makes more rows look cheaper does not make drafting look free
    assert monotone_curve([(16, 3.0), (4, 3.2), (1, 2.0)]) == ((1, 2.0), (4, 3.2), (16, 3.2))


# a CPU's pass (units of its fixed cost): rows nearly free while the weights stream (to 16 rows), then each one
# costs its compute; a drafter pass of 0.1 + 0.02 per request
ROOFLINE = StepCosts(row=0.02, draft=0.1, draft_row=0.02, curve=((1, 1.02), (4, 1.08), (16, 1.32), (32, 5.32)),
                     draft_curve=((1, 0.12), (16, 0.42)))


def true_cost(rows):
    return 1 + 0.02 * rows if rows <= 16 else 1.32 + 0.25 * (rows - 16)


def test_the_cost_curve_drafts_only_where_drafting_beats_autoregressive_decoding():
    p = 0.7
    for b in (1, 2, 4, 8, 16, 32):
        rates = [1 / true_cost(b)] + [expected_tokens(p, k) / (true_cost(b * (k + 1)) + 0.1 + 0.02 * b)
                                      for k in range(1, 8)]
        assert best_draft_len(p, 7, b, ROOFLINE) == rates.index(max(rates)), b
    assert best_draft_len(p, 7, 1, ROOFLINE) == 7  # 8 rows of one request: still nearly free
    assert best_draft_len(p, 7, 4, ROOFLINE) == 3  # 16 rows of four: the last nearly free block
    assert best_draft_len(p, 7, 16, ROOFLINE) == 0  # 16 AR rows cost 1.32, any verify block 5.32 or more
    # the straight line through the 1- and 16-row points (what calibration used to fit) drafts at 16 requests,
    # at well under the autoregressive rate
    line = StepCosts(row=0.02, draft=0.1, draft_row=0.02)
    k = best_draft_len(p, 7, 16, line)
    assert k > 0 and expected_tokens(p, k) / (true_cost(16 * (k + 1)) + 0.42) < 0.5 / true_cost(16)


def test_estimate_is_the_geometric_mle_and_follows_the_text():
    e = AcceptanceEstimate(prior_p=0.5, prior_weight=0.0, decay=1.0)
    for k, a in [(7, 2), (7, 7), (3, 0), (7, 1)]:
        e.update(k, a)
    assert e.p == pytest.approx(10 / (10 + 3))  # successes / (successes + observed failures)
    f = AcceptanceEstimate(prior_p=0.9)
    for _ in range(30):
        f.update(7, 0)
    assert f.p < 0.05


# the step costs a bf16 engine measured at its start on a 2-core CPU, one thread
BF16_1T = StepCosts(row=0.135, draft=0.207, draft_row=0.222, curve=((1, 1.14), (4, 1.45), (16, 3.17), (32, 5.52)),
                    draft_curve=((1, 0.43), (4, 0.94), (16, 3.77)))


def test_a_thin_gain_needs_an_estimate_that_has_seen_enough():
    pol = DraftLengthPolicy("adaptive", BF16_1T)
    lucky = AcceptanceEstimate(prior_p=0.5, prior_weight=2.0)
    for _ in range(2):
        lucky.update(3, 3)  # two landed blocks: p 0.8, from 8 observations
    assert best_draft_len(lucky.p, 7, 4, BF16_1T, MARGIN) > 0  # the point estimate alone would draft
    assert lucky.p_low < lucky.p and not pays(lucky.p_low, best_draft_len(lucky.p, 7, 4, BF16_1T, MARGIN), 4,
                                              BF16_1T, MARGIN)
    assert pol.choose(AcceptanceEstimate(prior_p=lucky.p, prior_weight=8.0), 7, 4) > 0  # a new request drafts
    lucky.idle = 1  # but one that gave up and probed its way up to the same p does not resume
    assert pol.choose(lucky, 7, 4) == 0
    steady = AcceptanceEstimate(prior_p=0.5, prior_weight=2.0, decay=1.0)
    for _ in range(60):
        steady.update(3, 3)
    steady.update(3, 2)
    steady.idle = 1
    assert steady.p == pytest.approx(lucky.p, abs=0.2) and pol.choose(steady, 7, 4) > 0  # seen enough: it drafts
    # one request: verify rows nearly free, drafting pays even at the lower bound
    lucky.idle = 1
    assert pol.choose(lucky, 7, 1) == best_draft_len(lucky.p, 7, 1, BF16_1T, MARGIN) > 0
    assert AcceptanceEstimate(prior_p=0.5, prior_weight=0.0).p_low == 0.0


def test_policy_probes_after_giving_up_and_fixed_mode_keeps_k():
    pol = DraftLengthPolicy("adaptive", CPU, probe_every=4, max_gap=16)
    e = AcceptanceEstimate(prior_p=0.01)
    late = AcceptanceEstimate(prior_p=0.01)
    ks, ks_late = [], []
    for i in range(60):  # every probe misses: the gaps double, 4, 8, then the engine's probe every max_gap
        pol.begin_iteration()
        ks.append(pol.choose(e, 7, 1))
        if ks[-1]:
            pol.observe(e, ks[-1], 0)
        if i >= 5:  # a request that gave up later probes on the same iterations as the first
            ks_late.append(pol.choose(late, 7, 1))
            if ks_late[-1]:
                pol.observe(late, ks_late[-1], 0)
    # a request's own probe drafts one token and does not count as teaching the engine-wide rate: with nothing else
    # drafting, the engine probes the request itself every max_gap iterations, with its K
    assert [(i + 1, k) for i, k in enumerate(ks) if k] == [(4, 1), (12, 1), (16, 7), (32, 7), (48, 7)]
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
    sp = SamplingParams(max_tokens=64, ignore_eos=True)
    ar = [o.token_ids for o in LLM(target=t, speculative=False).generate(prompts, sp)]
    for right in (True, False):
        for pol in ("adaptive", "fixed"):
            # the CPU constants of a real model: a tiny model's drafter pass costs as much as its target pass
            llm = LLM(target=t, draft=d, trace=True, draft_len_policy=pol, step_costs=dict(CPU_COSTS))
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
    # CPU defaults for a real model (a tiny pass's row figures are mostly timer noise: only their signs are sure)
    assert c.row >= 0 and c.drafter(1) > 0.1 and c.draft_row >= 0, c
    # the curves' points: target passes over 1 decode row, one verify block of K + 1 = 4 rows, 16 decode rows and
    # 8 requests' verify blocks, drafter passes for 1, 4 and 16 requests, costs never falling
    assert [n for n, _ in c.curve] == [1, 4, 8, 12, 16, 32] and [n for n, _ in c.draft_curve] == [1, 4, 16], c
    assert c.curve[0][1] >= 1 and all(a[1] <= b[1] for a, b in zip(c.curve, c.curve[1:])), c
    assert c.target(1) == pytest.approx(c.curve[0][1]) and c.drafter(16) == pytest.approx(c.draft_curve[-1][1])
    assert eng.blocks.num_free == eng.blocks.num_blocks
    given = LLM(target=t, draft=d, step_costs={"row": 0.5, "draft": 0.25, "draft_row": 0.125}).engine.policy.costs
    assert (given.row, given.draft, given.draft_row, given.curve) == (0.5, 0.25, 0.125, ())  # the straight lines
    from dflash_trt.spec.calibrate import measure_step_costs
    from dflash_trt.kv_cache import BlockManager, CacheBlocks
    assert measure_step_costs(eng.runner, eng.proposer, CacheBlocks(BlockManager(2, eng.blocks.block_size)), 0) is None


def test_calibration_times_passes_as_the_engine_runs_them_with_the_greedy_screen_armed(tmp_path, monkeypatch):
    """The target's greedy head screen arms on the first rows the head sees and then serves every pass of a few
    rows; the calibration arms it before its timed rounds, so no timed pass carries the whole head where serving
    would not (and the wider passes it does not take, which read it whole, do not look cheap beside them)."""
    from dflash_trt.spec import calibrate as cal

    t = tiny.make_target(str(tmp_path / "t"))
    d = tiny.make_drafter(str(tmp_path / "d"), t, block_size=8)
    eng = LLM(target=t, draft=d, draft_len_policy="fixed").engine  # fixed: nothing measured at start
    screen = eng.target.prepare_greedy_head()
    assert screen is not None and not screen.armed
    armed_at_rounds, rounds = [], cal._timed_rounds

    def timed_rounds(*a, **k):
        armed_at_rounds.append(screen.armed)
        return rounds(*a, **k)

    monkeypatch.setattr(cal, "_timed_rounds", timed_rounds)
    assert cal.measure_step_costs(eng.runner, eng.proposer, eng.blocks, 0) is not None
    assert armed_at_rounds == [True]


def test_calibration_takes_each_rounds_own_ratios_so_a_spell_of_the_machine_moves_nothing():
    """The costs are each round's ratios, their median over rounds: a round that met a busy machine (every run
    slower) and one in which a single run met a fast spell leave the figures where the steady rounds put them."""
    from dflash_trt.spec import calibrate as cal

    runs = {"one": (None, 1, 1), "block": (None, 1, 4), "wide": (None, 16, 16), "verify": (None, 8, 32),
            "d_one": (None, 1, 0), "d_mid": (None, 4, 0), "d_wide": (None, 16, 0)}
    steady = {"one": 0.020, "block": 0.025, "wide": 0.050, "verify": 0.090, "d_one": 0.008, "d_mid": 0.016,
              "d_wide": 0.048}
    busy = {name: 1.6 * v for name, v in steady.items()}
    lucky = dict(steady, verify=0.045)  # only the verify point ran in a fast spell
    want = cal._costs(steady, runs, True)
    got = cal._median([cal._costs(t, runs, True) for t in (steady, busy, lucky, steady, steady)])
    assert got["curve"] == pytest.approx(want["curve"]) and got["draft_curve"] == pytest.approx(want["draft_curve"])
    assert (got["row"], got["draft"], got["draft_row"]) == pytest.approx((want["row"], want["draft"], want["draft_row"]))
    assert [n for n, _ in got["curve"]] == [1, 4, 16, 32] and [n for n, _ in got["draft_curve"]] == [1, 4, 16]


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


def probe_len(pol: DraftLengthPolicy, est: AcceptanceEstimate, k_cap: int, batch: int) -> int:
    """The K `choose` gives the request, or that of the shadow probe it gives instead (drafts not verified)."""
    return pol.choose(est, k_cap, batch) or pol.shadow_len(est)


def test_probes_are_rare_where_drafting_does_not_pay_at_the_engine_rate():
    """At a batch whose verify rows cost, a request that gave up probes after max_gap steps when drafting would
    not pay even at the engine-wide acceptance, and after probe_every when it would."""
    def probes(engine_p):
        pol = DraftLengthPolicy("adaptive", BF16_1T, probe_every=8, max_gap=64)
        pol.engine_rate = AcceptanceEstimate(prior_p=engine_p, prior_weight=1000.0, decay=1.0)
        e, at = AcceptanceEstimate(prior_p=0.3), []
        for i in range(200):
            pol.begin_iteration()
            k = probe_len(pol, e, 7, 4)
            if k:
                at.append(pol.iteration)
                pol.observe(e, k, 0)
        return at
    assert best_draft_len(0.6, 7, 4, BF16_1T) == 0 < best_draft_len(0.9, 7, 4, BF16_1T)
    assert probes(0.6) == [64, 128, 192]
    assert probes(0.9)[:3] == [8, 24, 56]  # the doubling waits: 8, 16, 32


def test_probes_price_at_the_batchs_margin_and_a_fresh_engines_rate_one_error_up():
    """At 16 requests an engine-wide acceptance that pays only without the batch's margin cannot lift the batch into
    drafting (plan prices at that margin), so its requests wait max_gap before probing, as where drafting does not
    pay at all; a fresh engine's rate (its prior, two pseudo-steps) is taken one standard error up, so it probes
    early and finds out."""
    from dflash_trt.spec.policy import margin_for

    def probes(engine_p, weight, batch=16):
        pol = DraftLengthPolicy("adaptive", BF16_C16, probe_every=8, max_gap=64)
        pol.engine_rate = AcceptanceEstimate(prior_p=engine_p, prior_weight=weight, decay=1.0)
        e, at = AcceptanceEstimate(prior_p=0.3), []
        for i in range(130):
            pol.begin_iteration()
            k = probe_len(pol, e, 7, batch)
            if k:
                at.append(pol.iteration)
                pol.observe(e, k, 0)
        return at
    assert best_draft_len(0.64, 7, 16, BF16_C16) > 0 == best_draft_len(0.64, 7, 16, BF16_C16, margin_for(16))
    assert probes(0.64, 1000.0) == [64, 128]
    assert probes(0.64, 2.0)[0] == 8  # then its rate has seen a miss
    assert probes(0.95, 1000.0)[:2] == [8, 24]


def test_the_engine_probes_where_requests_are_too_short_to_wait_max_gap():
    """Requests of 20 steps never wait max_gap: without the engine's own probe every max_gap iterations the
    engine-wide acceptance (every new request's prior) would never learn what the drafter does on this traffic."""
    pol = DraftLengthPolicy("adaptive", BF16_1T, probe_every=8, max_gap=64)
    pol.engine_rate = AcceptanceEstimate(prior_p=0.6, prior_weight=1000.0, decay=1.0)
    at = []
    for _ in range(10):  # one request after another, 20 decode steps each, in a batch of 4
        e = pol.new_estimate()
        for _ in range(20):
            pol.begin_iteration()
            k = probe_len(pol, e, 7, 4)
            if k:
                at.append((pol.iteration, k))
                pol.observe(e, k, 0)
    assert at == [(64, 7), (128, 7), (192, 7)]  # the request's K, unverified in a batch


def test_the_engines_own_probe_falls_across_the_batch_not_on_its_oldest_request():
    """Where requests arrive together and alike, the oldest is at the same point of its text at each of the engine's
    own probes: probing it every time, the engine-wide rate samples one stretch of text instead of the batch. The
    engine's probe falls on a request picked by the iteration (the same on every rank), one a probe."""
    def run():
        pol, seqs = policy_batch(4, 0.3, 1000.0)
        pol.lengths.engine_rate = AcceptanceEstimate(prior_p=0.3, prior_weight=1000.0, decay=1.0)
        age, probed = [0, 5, 10, 15], []  # a batch of 4 requests of 20 steps, one finishing every 5 steps
        for _ in range(64 * 12):
            k = pol.begin_iteration(len(seqs))
            if k and not pol.quiet_iteration(seqs, k, 4096):
                pol.plan(seqs, k, 4096)
                lens = [pol.draft_len(s, k, len(seqs), 4096) + pol.shadow_len(s) for s in seqs]
                if any(lens):
                    probed.append([i for i, n in enumerate(lens) if n])
            age = [a + 1 for a in age]
            while age[0] >= 20:  # the oldest finishes and a new request joins at the end, as the scheduler orders them
                age.pop(0)
                seqs.pop(0)
                seqs.append(policy_batch(1, 0.3, 1000.0)[1][0])
                age.append(0)
        return probed
    probed = run()
    assert len(probed) == 12 and all(len(p) == 1 for p in probed), probed  # one probe every max_gap iterations
    assert len({p[0] for p in probed}) >= 3, probed  # not always the oldest (index 0)
    assert run() == probed  # picked by the iteration alone


def test_one_token_probes_that_land_do_not_lift_the_engine_wide_rate():
    """A block's first draft lands far more often than its later ones. Text where every first draft lands and every
    second misses (a block's rate per position 0.5): the requests' own one-token probes all land, and counted
    engine-wide they lifted the rate probe by probe past the 16-request break-even, so every request probed every
    few steps and the batch drafted where it did not pay. Only the engine's probes (the request's K: a block) and
    drafting steps teach the engine-wide rate; it stays below the break-even and the requests wait max_gap."""
    pol, seqs = policy_batch(16, 0.6, 50.0)
    for seq in seqs:
        seq.params.max_tokens = 10**6
    pol.lengths.engine_rate = AcceptanceEstimate(prior_p=0.6, prior_weight=50.0, decay=0.98)
    probes, steps = 0, 64 * 30
    for _ in range(steps):
        k = pol.begin_iteration(16)
        if k and not pol.quiet_iteration(seqs, k, 4096):
            pol.plan(seqs, k, 4096)
            for seq in seqs:
                n = pol.draft_len(seq, k, 16, 4096) or pol.shadow_len(seq)
                probes += n > 0 and seq.acceptance.probing
                if n:
                    pol.observe(seq, n, min(n, 1))
    rate = pol.lengths.engine_rate
    assert rate.upper(1.0) < pol.lengths.floor(7, 16), (rate.p, pol.lengths.floor(7, 16))
    assert probes <= 16 * steps // 64 + steps // 64, probes  # each request's own every max_gap, the engine's


# the adaptive engine's start-up costs with the embedded pair in bf16 at 16 slots, as measured beside a fixed K
# (benchmarks/results/2026-12-06-session29/c16_fixed_k_bf16.txt)
BF16_C16 = StepCosts(row=0.026, draft=0.192, draft_row=0.023,
                     curve=((1, 1.03), (4, 1.06), (8, 1.15), (12, 1.28), (16, 1.51), (32, 1.91)),
                     draft_curve=((1, 0.23), (4, 0.28), (16, 0.59)), draft_rows=4)


def policy_batch(n: int, p: float, weight: float):
    """A fresh adaptive policy priced by BF16_C16 and n requests whose estimates sit at p with `weight` steps of
    history."""
    from dflash_trt.sequence import Sequence
    from dflash_trt.spec.config import SpecConfig
    from dflash_trt.spec.policy import SpecPolicy

    pol, seqs = SpecPolicy(SpecConfig(), 7, "cpu", BF16_C16), []
    for _ in range(n):
        seq = Sequence([1, 2, 3], SamplingParams(max_tokens=64))
        pol.new_request(seq)
        seq.acceptance = AcceptanceEstimate(prior_p=p, prior_weight=weight)
        seqs.append(seq)
    return pol, seqs


def test_a_loaded_batch_drafts_only_past_a_wider_margin():
    """At 16 requests a fixed K = 1 at acceptance 0.64 (tau 1.64) ran 6-7% slower than plain decoding although the
    model priced it 8% faster (and K = 2, which a flat margin picks, 13% slower): a batch's margin grows with its
    requests, so that batch does not draft, while the same acceptance still drafts at 1 and 4 requests and a far
    better one still drafts at 16."""
    from dflash_trt.spec.policy import batch_draft_len, margin_for

    assert margin_for(1) == MARGIN < margin_for(4) < margin_for(16)
    assert batch_draft_len([0.64] * 16, [7] * 16, 0, 7, BF16_C16, MARGIN) > 0  # what a flat margin chose

    def planned(batch, p):
        pol, seqs = policy_batch(batch, p, 50.0)
        k = pol.begin_iteration(batch)
        pol.plan(seqs, k, 4096)
        return [pol.draft_len(s, k, batch, 4096) for s in seqs]

    assert planned(16, 0.64) == [0] * 16
    assert min(planned(16, 0.9)) > 0
    assert min(planned(4, 0.64)) > 0 and planned(1, 0.64)[0] > 0


def test_a_loaded_batch_trusts_an_estimate_only_as_far_as_it_has_seen():
    """A fresh request's estimate is mostly the engine-wide prior: 16 of them at p = 0.9 with no history of their
    own do not draft (priced at the estimate's lower bound), while the same p after a long history does, and at 4
    requests (a step whose rows are nearly free) the prior alone still drafts."""
    from dflash_trt.spec.policy import trusted_p

    def planned(batch, p, weight):
        pol, seqs = policy_batch(batch, p, weight)
        k = pol.begin_iteration(batch)
        pol.plan(seqs, k, 4096)
        return [pol.draft_len(s, k, batch, 4096) for s in seqs]

    assert planned(16, 0.9, 2.0) == [0] * 16
    assert min(planned(16, 0.9, 50.0)) > 0
    assert min(planned(4, 0.9, 2.0)) > 0
    est = AcceptanceEstimate(prior_p=0.9, prior_weight=2.0)
    assert trusted_p(est, 1) == est.p > trusted_p(est, 4) > trusted_p(est, 16) == est.p_low == trusted_p(est, 32)


def test_a_batch_where_no_k_pays_prices_no_request():
    """Where no K pays at the batch size even if every draft were accepted, the iteration's K is 0 before any
    request is priced (a loaded batch costs the policy nothing per request, and no request counts the iteration
    as one it gave up); where some K could pay, or the policy is fixed, the schedule's K stands."""
    from dflash_trt.sequence import Sequence
    from dflash_trt.spec.config import SpecConfig
    from dflash_trt.spec.policy import SpecPolicy, margin_for

    assert best_draft_len(1.0, 7, 12, BF16_1T, margin_for(12)) > 0 == best_draft_len(1.0, 7, 32, BF16_1T,
                                                                                margin_for(32))
    pol = SpecPolicy(SpecConfig(), 7, "cpu", BF16_1T)
    assert pol.begin_iteration(12) == 7 and pol.begin_iteration(32) == 0
    assert SpecPolicy(SpecConfig(draft_len_policy="fixed"), 7, "cpu", BF16_1T).begin_iteration(32) == 7
    seq = Sequence([1, 2, 3], SamplingParams(max_tokens=64))
    pol.new_request(seq)
    seq.acceptance.update(7, 0)  # hopeless so far: priced at batch 12, it stays at K = 0 and counts an idle step
    idle = seq.acceptance.idle
    assert pol.draft_len(seq, pol.begin_iteration(12), 12, 4096) == 0 and seq.acceptance.idle == idle + 1
    assert pol.draft_len(seq, pol.begin_iteration(32), 32, 4096) == 0 and seq.acceptance.idle == idle + 1


def test_a_batch_that_trusts_no_estimate_enough_to_draft_is_quiet():
    """Fresh requests at p = 0.9 in a batch of 16 do not draft (plan prices them at their estimates' lower bound),
    though each estimate is above the break-even: the iteration is quiet, so no request is priced one by one, and
    each K and idle count comes out as plan and draft_len make them; the same requests after a long history, or
    alone, are not quiet."""
    def batch(n, weight):
        pol, seqs = policy_batch(n, 0.9, weight)
        pol.begin_iteration(n)  # iteration 1: no probe falls on the next
        return pol, seqs, pol.begin_iteration(n)

    pol, seqs, k = batch(16, 2.0)
    assert k > 0 and all(s.acceptance.p > pol.lengths.floor(k, 16) for s in seqs)
    assert pol.quiet_iteration(seqs, k, 4096) and [s.acceptance.idle for s in seqs] == [1] * 16
    pol, seqs, k = batch(16, 2.0)
    pol.plan(seqs, k, 4096)  # what pricing them would have made of the iteration
    assert [pol.draft_len(s, k, 16, 4096) for s in seqs] == [0] * 16 and [s.acceptance.idle for s in seqs] == [1] * 16
    pol, seqs, k = batch(16, 50.0)
    assert not pol.quiet_iteration(seqs, k, 4096)
    pol, seqs, k = batch(1, 2.0)
    assert not pol.quiet_iteration(seqs, k, 4096)


def test_a_plan_that_skips_pricing_below_the_break_even_plans_what_pricing_would():
    """plan prices no K where every request's trusted acceptance is at or below the break-even of equal estimates
    (SpecPolicy.plan's shortcut): over random batches (estimates of little and much history, requests capped near
    their max_tokens, some unable to draft) its K is batch_draft_len's own."""
    import random

    from dflash_trt.sequence import Sequence
    from dflash_trt.spec.config import SpecConfig
    from dflash_trt.spec.policy import SpecPolicy, batch_draft_len, margin_for, trusted_p

    r, skipped = random.Random(1), 0
    for _ in range(400):
        n = r.randint(2, 24)
        pol = SpecPolicy(SpecConfig(), 7, "cpu", BF16_C16)
        seqs = []
        for _ in range(n):
            seq = Sequence([1, 2, 3], SamplingParams(max_tokens=r.choice([1, 3, 5, 64])))
            pol.new_request(seq)
            seq.acceptance = AcceptanceEstimate(prior_p=r.random(), prior_weight=r.choice([2.0, 10.0, 50.0]))
            seqs.append(seq)
        k = pol.begin_iteration(n)
        if not k:
            continue
        pol.plan(seqs, k, 4096)
        able = [(trusted_p(s.acceptance, n), pol._cap(s, k, 4096)) for s in seqs]
        others, able = sum(1 for a in able if a[1] == 0), [a for a in able if a[1] > 0]
        if not able:
            assert pol.planned is None
            continue
        skipped += max(p for p, _ in able) <= pol.lengths.floor(k, n)
        assert pol.planned == batch_draft_len([p for p, _ in able], [c for _, c in able], others, k, BF16_C16,
                                              margin_for(n))
    assert skipped > 20  # the shortcut was taken, and agreed


def test_a_quiet_iteration_counts_and_chooses_as_pricing_every_request_would():
    """The scheduler skips pricing requests one by one on an iteration where none can draft
    (SpecPolicy.quiet_iteration): every request's K, idle count and probe wait come out as if each had been priced."""
    from dflash_trt.sequence import Sequence
    from dflash_trt.spec.config import SpecConfig
    from dflash_trt.spec.policy import SpecPolicy

    def run(shortcut: bool):
        pol = SpecPolicy(SpecConfig(), 7, "cpu", BF16_1T)
        seqs = [Sequence([1, 2, 3], SamplingParams(max_tokens=30 + 9 * i)) for i in range(12)]
        for i, s in enumerate(seqs):
            pol.new_request(s)
            s.acceptance.update(7, 7 if i < 2 else i % 3)  # two easy texts, the rest hard
        ks, quiet = [], 0
        for it in range(140):
            batch = [s for s in seqs[:12 - it // 20] if s.num_output < s.params.max_tokens]  # the batch shrinks
            k = pol.begin_iteration(len(batch))
            if shortcut and k and pol.quiet_iteration(batch, k, 4096):
                k, quiet = 0, quiet + 1
            if k:
                pol.plan(batch, k, 4096)
            step = [pol.draft_len(s, k, len(batch), 4096) if k else 0 for s in batch]
            for s, kk in zip(batch, step):
                if kk:
                    pol.observe(s, kk, 0)  # every draft rejected
                s.token_ids.append(5)
            ks.append((step, [(s.acceptance.idle, s.acceptance.probe_gap, s.acceptance.probing) for s in seqs]))
        return ks, quiet

    (fast, quiet), (priced, _) = run(True), run(False)
    assert quiet > 20 and any(any(step) for step, _ in priced), "the run must have quiet and drafting iterations"
    assert fast == priced


def test_a_probe_in_a_batch_drafts_without_verifying_and_alone_verifies_one_draft():
    """In a batch a probe is a shadow: choose gives the request K = 0 and a shadow of one token, for this iteration
    only; alone, or where its draft would be verified by rejection sampling, it verifies one draft. A request whose
    shadow is still pending does not probe again."""
    pol = DraftLengthPolicy("adaptive", BF16_1T, probe_every=8, max_gap=64)

    def at_probe(batch, shadow=True):
        e = AcceptanceEstimate(prior_p=0.05)
        while True:
            pol.begin_iteration()
            k = pol.choose(e, 5, batch, shadow=shadow)
            if k or pol.shadow_len(e):
                return e, k

    e, k = at_probe(4)
    assert (k, pol.shadow_len(e), e.probing) == (0, 1, True)
    pol.begin_iteration()
    assert pol.shadow_len(e) == 0  # the shadow was this iteration's
    assert at_probe(1)[1] == 1 and pol.shadow_len(at_probe(1)[0]) == 0
    assert at_probe(4, shadow=False)[1] == 1
    e, _ = at_probe(4)
    e.shadow = (10, [1])  # drafted, not settled yet: its next probe waits for the token
    for _ in range(200):
        pol.begin_iteration()
        assert pol.choose(e, 5, 4) == 0 and pol.shadow_len(e) == 0


def test_a_shadow_probe_counts_what_verifying_its_drafts_would_have_accepted():
    """The tokens committed after a shadow probe settle it as the verified step it stands for (spec/verify.accept of
    its drafts against them): once a draft differs or all have matched, not before; a request that finishes first
    counts the drafts its tokens decided, all accepted."""
    from dflash_trt.sequence import Sequence, Status
    from dflash_trt.spec.config import SpecConfig
    from dflash_trt.spec.policy import SpecPolicy
    from dflash_trt.spec.verify import accept

    pol = SpecPolicy(SpecConfig(), 7, "cpu", BF16_C16)
    seen = []
    observe = pol.observe
    pol.observe = lambda seq, k, a: (seen.append((k, a)), observe(seq, k, a))

    def settled(drafts, tokens, finish=False):
        seq = Sequence([1, 2, 3], SamplingParams(max_tokens=64))
        pol.new_request(seq)
        seen.clear()
        pol.shadow(seq, drafts)  # as postprocess does: before the step commits its token
        for i, tok in enumerate(tokens):
            assert not seen, "settled before its tokens decided it"
            seq.token_ids.append(tok)
            if finish and i == len(tokens) - 1:
                seq.status = Status.FINISHED
            pol.settle(seq)
            if seq.acceptance.shadow is None:
                break
        assert seq.acceptance.shadow is None and len(seen) == 1 and seq.accept_hist == [seen[0][1]]
        return seen[0]

    for tokens in ([9, 9, 9, 9], [5, 9, 9, 9], [5, 6, 9, 9], [5, 6, 7, 9], [5, 6, 7, 8]):
        assert settled([5, 6, 7, 8], tokens) == (4, accept([5, 6, 7, 8], tokens + [0])[0])
    assert settled([5, 6, 7, 8], [5, 6], finish=True) == (2, 2)
    assert settled([5, 6, 7, 8], [5, 9], finish=True) == (4, 1)


def test_requests_that_gave_up_in_a_batch_find_easier_text_by_shadow_probes(tmp_path):
    """Four requests whose drafts all miss for their first 48 tokens give up drafting; after that the drafts are the
    target's own tokens. Their probes draft without verifying: a shadow iteration has no verify row, each shadow is
    settled as verifying its drafts against the target's tokens would have settled it, and the probes that find the
    text easy bring the requests back to drafting. The output is the target's own throughout."""
    from dflash_trt.spec.verify import accept

    t = tiny.make_target(str(tmp_path / "t"))
    d = tiny.make_drafter(str(tmp_path / "d"), t, block_size=8)
    prompts = [[11, 11, 5], [11, 4, 11, 6], [7, 11], [4, 4, 9]]
    sp = SamplingParams(max_tokens=200, ignore_eos=True)
    ar = [o.token_ids for o in LLM(target=t, speculative=False).generate(prompts, sp)]
    llm = LLM(target=t, draft=d, trace=True, step_costs=dict(CPU_COSTS))
    eng = llm.engine
    truth, shadows, settled, shadow_steps = {}, {}, [], set()

    def oracle(work):
        out = {}
        for w in work:
            s = w.seq
            full = truth.setdefault(s.seq_id, s.prompt_ids + ar[prompts.index(s.prompt_ids)])
            dr = full[len(s.token_ids):][:w.draft_len]
            out[s.seq_id] = [(x + 1) % tiny.VOCAB for x in dr] if s.num_output < 48 else dr
            if eng.policy.shadow_len(s):
                shadows.setdefault(s.seq_id, []).append((len(s.token_ids), out[s.seq_id]))
                shadow_steps.add(len(eng.metrics.iterations))
        return out

    eng.proposer.propose = tiny.as_propose(oracle)
    settle, observe = eng.policy.settle, eng.policy.observe
    eng.policy.settle = lambda seq: settle(seq) if seq.acceptance.shadow is None else \
        (setattr(eng.policy, "observe", lambda s, k, a: (settled.append((s.seq_id, k, a)), observe(s, k, a))),
         settle(seq), setattr(eng.policy, "observe", observe))
    outs = llm.generate(prompts, sp)
    assert [o.token_ids for o in outs] == ar
    assert len(settled) >= 4 and sum(a for _, _, a in settled) > 0 and any(a < k for _, k, a in settled), settled
    for sid, k, a in settled:  # each in the order its request's shadows were drafted
        start, drafts = shadows[sid].pop(0)
        full = truth[sid]
        assert (k, a) == (len(drafts), accept(drafts, full[start:start + len(drafts)] + [-1])[0])
    only = [eng.metrics.iterations[i] for i in sorted(shadow_steps)]  # iterations whose drafts were all shadows'
    only = [it for it in only if it.drafted == 0]
    assert only and all(it.num_rows == it.batch_size > 1 and it.num_tokens == it.batch_size for it in only), only
    for o in outs:  # back to drafting once the text is easy: long verified blocks late in every request
        late = [len(dr) for dr, _ in o.trace][-5:]
        assert len(o.trace) >= 5 and min(late) > 1, [len(dr) for dr, _ in o.trace]
