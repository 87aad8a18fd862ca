"""Every draft-length decision, in one place: how many tokens each request drafts this step.

The order of the rules (`SpecPolicy.draft_len`): the request's gate (speculation off after it kept missing, with
`min_acceptance`), the schedule's cap for the batch size (`draft_len_schedule`, capped by `max_draft_len`), the
room left (max_tokens, max_seq_len), then the adaptive cost model below (or the cap itself, with "fixed"). After
the proposer drafted, the confidence cut (`min_draft_confidence`) may end a block early.

The adaptive rule: the K that maximises committed tokens per unit of time.

A request's drafts are accepted position by position with some probability p (estimated from its own history,
starting from the engine-wide rate), so K drafts commit E(K) = 1 + p + ... + p^K tokens per step. What a step
costs depends on the machine and the load: a target pass over n rows costs T(n), and drafting for B requests
adds a drafter pass D(B) (D(B, K) where the pass has only the rows K drafts need: DFlashProposer.block_rows).
Autoregressive decoding of the same batch B commits 1 token per request for T(B), so a request drafts K > 0 only
when E(K) / (T(B (K+1)) + D(B)) beats 1 / T(B), by a margin that grows with B (margin_for): DFlash never runs
where it would be slower than plain decoding.
In a batch of two or more, the requests that may draft are priced together instead, and draft one K
(`SpecPolicy.plan`, `batch_draft_len`).

T is not a straight line on a CPU: a pass streams the weights once, so rows are nearly free while the matmuls
are memory-bound and cost their full compute once they are not, a one-row pass may take a kernel path of its
own, and verify blocks attend with several query rows. A straight line through two batch sizes then misprices
the others (the 64+ rows of 16 requests verifying K = 3, or the 2-8 rows of one), and the policy drafts where it
loses or declines where it would win. So T and D are measured at a few points (runtime/spec/
calibrate.py) and interpolated piecewise linearly, extrapolated by the last segment's slope (`StepCosts`); the
straight lines `row`, `draft` and `draft_row` (all in units of a pass's fixed cost) are the fallback where
nothing is measured or the costs are given. On a GPU rows are nearly free at small batch and K stays at the
maximum. The costs are measured once at engine start (rank 0's figures on every tensor-parallel rank); after
that the policy uses only token statistics, never clocks, so every rank chooses the same K. Outputs never
depend on K: greedy and seeded sampled tokens are the target's own whatever is drafted.
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import SpecConfig

# fallbacks when nothing is measured. CPU: the development machine (2-core Xeon, embedded SmolLM2-135M pair,
# fp32, one thread): target step ~60 ms, +5.5 ms per verify row, drafter pass ~8 ms + ~3 ms per request.
CPU_COSTS = {"row": 0.09, "draft": 0.13, "draft_row": 0.05}
GPU_COSTS = {"row": 0.002, "draft": 0.08, "draft_row": 0.002}


def piecewise(points, x: float) -> float:
    """The broken line through `points` ((x, y), x ascending, at least two) at x: interpolated between them,
    extended by the first segment below the first point and by the last segment above the last."""
    for i in range(1, len(points)):
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        if x <= x1:
            break
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def monotone_curve(points) -> tuple:
    """Measured (x, cost) points as a curve: sorted, one point per x, costs never falling as x grows (a noisy
    measurement that makes more rows look cheaper would make the policy draft for nothing)."""
    out = []
    for x, y in sorted(points):
        y = max(y, out[-1][1]) if out else y
        if out and x == out[-1][0]:
            out[-1] = (x, y)
        elif not out or x > out[-1][0]:
            out.append((float(x), float(y)))
    return tuple(out)


@dataclass
class StepCosts:
    row: float
    draft: float
    draft_row: float
    # measured (rows, cost) of target passes and (drafting requests, cost) of drafter passes, in the same units
    # (a pass's fixed cost); where given they replace the straight lines above
    curve: tuple = ()
    draft_curve: tuple = ()
    # rows per request of the measured drafter passes of several requests when such a pass has only the rows
    # its drafts need (the proposer's trim: 1 + K); D of two or more requests then follows their rows, read at
    # requests * (1 + K) / draft_rows (a trimmed pass costs what its rows cost, whichever requests they are
    # of). 0: whole blocks, whatever K
    draft_rows: int = 0

    def __post_init__(self):
        self.curve = monotone_curve(self.curve) if len(self.curve) >= 2 else ()
        self.draft_curve = monotone_curve(self.draft_curve) if len(self.draft_curve) >= 2 else ()

    def target(self, rows: int) -> float:
        """T(rows): one target pass over `rows` rows."""
        return piecewise(self.curve, rows) if self.curve else 1.0 + self.row * rows

    def drafter(self, requests: int, k: int = 0) -> float:
        """D(requests, K): one drafter pass drafting K tokens for each of `requests` requests (0 when nothing
        drafts)."""
        if requests <= 0:
            return 0.0
        x = requests * (1 + k) / self.draft_rows if self.draft_rows and k > 0 and requests > 1 else requests
        return max(piecewise(self.draft_curve, x), 0.0) if self.draft_curve else self.draft + self.draft_row * x

    @classmethod
    def for_device(cls, device: str, override: dict | None = None) -> "StepCosts":
        base = dict(CPU_COSTS if str(device).startswith("cpu") else GPU_COSTS)
        base.update(override or {})
        return cls(**base)


def expected_tokens(p: float, k: int) -> float:
    return float(k + 1) if p >= 1.0 else (1.0 - p ** (k + 1)) / (1.0 - p)


# the best per-position acceptance a drafter plausibly keeps up: where even that would not pay at this batch
# size, a request that gave up drafting does not probe either (a probe costs a drafter pass and verify rows)
HOPEFUL_P = 0.9


# drafting must beat autoregressive decoding by this much under the model: the model's own error (costs measured
# once, acceptance estimated from few steps) is of that order, and a draft that only breaks even on paper loses
MARGIN = 0.05
# and by this much more for every request in the batch beside the first. The model prices one step of a steady,
# full batch; a loaded batch's drafting returns its tokens unevenly (requests finish at their own pace, so slots
# stand empty or prefill while the rest go on), and its step sits past the turn where rows cost their compute,
# where the measured curve is extrapolated. Chosen where a loaded CPU batch put the model's error (fixed K at 16
# requests against plain decoding: docs/cpu_performance.md, "Session 30")
MARGIN_PER_REQUEST = 0.01


def margin_for(batch: int) -> float:
    """How much drafting must beat autoregressive decoding under the model at this batch size."""
    return MARGIN + MARGIN_PER_REQUEST * max(batch - 1, 0)


# the batch size from which a batch prices each request at its estimate's lower bound (one standard error below)
# rather than at the estimate (between: the part of the way there its size has come). A loaded batch drafts for
# all its requests in one step, whose rows sit past the turn where they cost their compute, so a wrong guess costs
# it the most; and a request with little history of its own carries mostly the engine-wide prior, learned at
# other loads on other text: priced at that alone, a fresh batch of 16 drafted in bursts that ran slower than
# plain decoding (docs/cpu_performance.md, "Session 32")
TRUST_BATCH = 16


def trusted_p(est: "AcceptanceEstimate", batch: int) -> float:
    """The acceptance a batch of `batch` requests prices a request at: its estimate, less a share of the
    estimate's standard error that grows with the batch (all of it from TRUST_BATCH requests on)."""
    return est.lower(min(1.0, max(batch - 1, 0) / (TRUST_BATCH - 1)))


def draft_rate(p: float, k: int, batch: int, costs: StepCosts) -> float:
    """Committed tokens per request per unit time when `batch` requests each draft K (> 0) at acceptance p."""
    return expected_tokens(p, k) / (costs.target(batch * (k + 1)) + costs.drafter(batch, k))


def pays(p: float, k: int, batch: int, costs: StepCosts, margin: float = 0.0) -> bool:
    """Whether drafting K for each of `batch` requests beats autoregressive decoding by `margin` at acceptance p."""
    return draft_rate(p, k, batch, costs) > (1.0 + margin) / costs.target(batch) * (1.0 + 1e-9)


def best_draft_len(p: float, k_max: int, batch: int, costs: StepCosts, margin: float = 0.0) -> int:
    """The K in 0..k_max with the most tokens per unit time when `batch` requests at acceptance p decode together
    (K > 0 only when it beats autoregressive decoding by `margin`): batch_draft_len at equal estimates, priced once
    per K instead of once per request and K (the break-even bisection calls it some thirty times)."""
    best_k, best = 0, batch * (1.0 + margin) / costs.target(batch)
    for k in range(1, k_max + 1):
        rate = batch * expected_tokens(p, k) / (costs.target(batch * (k + 1)) + costs.drafter(batch, k))
        if rate > best * (1.0 + 1e-9):
            best_k, best = k, rate
    return best_k


# the drafter probability below which a draft (past the first) is not worth its verify row on a CPU: chosen on
# the embedded pair's held-out records (benchmarks/draft_confidence.py; benchmarks/results/2026-11-30-session6/
# draft_confidence_heldout.txt): speed is flat from 0.3 to 0.5, 3% above the best fixed K
CPU_MIN_CONFIDENCE = 0.4


def batch_draft_len(ps: list[float], caps: list[int], others: int, k_max: int, costs: StepCosts,
                    margin: float = 0.0) -> int:
    """The one K (0..k_max) that the requests of a batch which may draft (acceptance estimates `ps`, at most
    `caps` drafts each) all draft, beside `others` that cannot, with the most tokens per unit time for the whole
    batch; K > 0 only when it beats autoregressive decoding of the batch by `margin`."""
    batch = len(ps) + others
    best_k, best = 0, batch * (1.0 + margin) / costs.target(batch)
    for k in range(1, k_max + 1):
        tokens, rows, drafting = float(others), batch, 0
        for p, cap in zip(ps, caps):
            kk = min(k, cap)
            tokens += expected_tokens(p, kk)
            rows += kk
            drafting += kk > 0
        rate = tokens / (costs.target(rows) + costs.drafter(drafting, k))
        if rate > best * (1.0 + 1e-9):
            best_k, best = k, rate
    return best_k


def confident_prefixes(conf: list[float], lens: list[int], threshold: float) -> list[int]:
    """How many of each request's drafts to verify: all of them up to the first after the first whose
    probability under the drafter is below `threshold`. A draft the drafter itself doubts is seldom accepted,
    and neither is anything after it, so its verify rows cost more than they return where rows are not free;
    the first is kept because the drafter pass is paid already. conf: request after request, lens[i] each."""
    out, at = [], 0
    for k in lens:
        out.append(next((j for j in range(1, k) if conf[at + j] < threshold), k))
        at += k
    return out


class AcceptanceEstimate:
    """Per-position acceptance probability from (drafted K, accepted a) steps: each accepted draft is a
    success, and a step that stopped before K shows one failure (the maximum-likelihood estimate of a
    geometric acceptance run), with older steps decaying so the estimate follows the text."""

    def __init__(self, prior_p: float = 0.5, prior_weight: float = 2.0, decay: float = 0.9):
        self.succ, self.fail = prior_p * prior_weight, (1.0 - prior_p) * prior_weight
        self.decay = decay
        self.idle = 0  # consecutive steps without drafting
        self.probe_gap = 0  # steps between probes (0: not set yet)
        self.probing = False
        self.engine_probe = False  # the probe under way is the engine's own (DraftLengthPolicy.choose)
        # a probe that drafts without verifying (DraftLengthPolicy.choose): the iteration it was chosen for, then
        # (position of its first draft, drafts) until the committed tokens settle it (SpecPolicy.settle)
        self.shadow_at, self.shadow_k = 0, 0
        self.shadow: tuple[int, list[int]] | None = None

    def update(self, k: int, accepted: int) -> None:
        self.succ = self.succ * self.decay + accepted
        self.fail = self.fail * self.decay + (1.0 if accepted < k else 0.0)

    @property
    def p(self) -> float:
        total = self.succ + self.fail
        return self.succ / total if total > 0 else 0.0

    @property
    def p_low(self) -> float:
        """p less one standard error of it (the decayed counts as the sample): what the estimate can be trusted
        to, given how much it has seen."""
        return self.lower(1.0)

    def lower(self, z: float) -> float:
        """p less z standard errors of it."""
        return max(0.0, self.p - z * self.std_error) if self.succ + self.fail > 0 else 0.0

    def upper(self, z: float) -> float:
        """p plus z standard errors of it."""
        return min(1.0, self.p + z * self.std_error) if self.succ + self.fail > 0 else 1.0

    @property
    def std_error(self) -> float:
        """p's standard error, the decayed counts as the sample (positive counts only)."""
        p = self.p
        return (p * (1.0 - p) / (self.succ + self.fail)) ** 0.5


class DraftLengthPolicy:
    """K per request: adaptive (the cost model above) or fixed (the schedule's K, as TensorRT-LLM does).
    A request the model sends to K = 0 still drafts 1 token after `probe_every` steps so its estimate can
    recover when the text becomes predictable; each probe doubles the wait (up to `max_gap`) unless it lifts the
    estimate to where drafting pays again (a probe that merely lands, at an acceptance that does not pay, used to
    reset the wait: on hard text at batch 4-8 those probes cost ~4% of the throughput). Where drafting would not
    pay even at the engine-wide acceptance, the wait is `max_gap` from the first: at a batch whose verify rows
    cost, a probe (a drafter pass and verify rows for one likely token) is bought only for the chance that this
    request's text is far easier than the rest, and requests of a few dozen steps never recover its cost. The
    engine itself probes one request every `max_gap` iterations in which nothing drafted (requests' own probes do
    not count: they do not teach the engine-wide rate, see observe), so that rate, every new request's prior, still
    learns where requests are too short to wait `max_gap` or only probe on their own. Probes
    fall on iterations that are multiples of `probe_every`, so requests that gave up share one drafter pass
    instead of each paying its fixed cost on a different step.

    A probe in a batch drafts without verifying (a shadow probe): the request decodes on as before, and the tokens
    it commits next settle whether verification would have accepted the drafts (`SpecPolicy.settle`), the same
    outcome, since a committed token is the target's own whatever was drafted. A verified probe in a batch commits
    one more token of the batch's B at the price of a verify row, and leaves its request a token ahead of the rest,
    so requests that started together no longer finish together (the batch ends on a step of one request, the next
    arrivals prefill apart). Alone, a request probes by verifying its draft: the
    verify row rides on a pass that streams the weights for one row anyway, and a landed draft saves it a whole
    step. A request's own probe drafts one token, not its K, in either case: requests that gave up together probe
    together, and a trimmed drafter pass costs the rows its longest draft needs for every request in it. The
    engine's probe drafts the request's K (it is its pass's only request), and only its outcome and drafting
    steps teach the engine-wide rate (observe)."""

    def __init__(self, mode: str, costs: StepCosts, probe_every: int = 8, max_gap: int = 64):
        self.mode, self.costs, self.probe_every, self.max_gap = mode, costs, probe_every, max_gap
        self.engine_rate = AcceptanceEstimate(decay=0.98)  # the prior of new requests
        self.iteration = 0
        self.last_draft = 0  # the last iteration in which a request drafted or the engine probed one
        self.engine_turn: AcceptanceEstimate | None = None  # the request the engine's own probe falls on (None: any)
        self._break_even: dict[tuple, float] = {}  # (k_cap, batch, margin) -> p at or below which nothing pays

    def begin_iteration(self) -> None:
        self.iteration += 1
        self.engine_turn = None

    @property
    def engine_probes_now(self) -> bool:
        """Whether this iteration is one on which the engine probes a request itself (see choose)."""
        return self.iteration % self.probe_every == 0 and self.iteration - self.last_draft >= self.max_gap

    def pick_engine_turn(self, ests: list) -> None:
        """Where the engine probes this iteration (ests: the estimates of the requests that may draft), the request
        it probes: one picked by a hash of the iteration, the same on every rank. The engine-wide rate so samples the
        batch, where the first that may (the oldest) would be at the same point of its text at every probe when
        requests arrive together and alike."""
        if ests:  # gathered only where the engine probes now (SpecPolicy.plan)
            self.engine_turn = ests[((self.iteration * 2654435761) >> 16) % len(ests)]

    def new_estimate(self) -> AcceptanceEstimate:
        return AcceptanceEstimate(prior_p=self.engine_rate.p)

    def observe(self, est: AcceptanceEstimate, k: int, accepted: int) -> None:
        # A request's own probe drafts one token, and a block's first draft lands far more often than the rate per
        # position that the block's later drafts show: counted engine-wide, probes that land would lift the rate
        # probe by probe until a batch where drafting does not pay probes together and drafts. The request's own
        # estimate takes it (it decides whether the request resumes; its blocks then correct the estimate).
        teaches_engine = not est.probing or est.engine_probe
        if est.probing:  # every probe doubles the wait; one that lifts the estimate enough resumes drafting
            est.probing = est.engine_probe = False
            est.probe_gap = min(2 * est.probe_gap, self.max_gap)
        est.update(k, accepted)
        if teaches_engine:
            self.engine_rate.update(k, accepted)

    def drafts_at(self, p: float, k_cap: int, batch: int, margin: float = 0.0) -> int:
        """best_draft_len(p, k_cap, batch, costs, margin), without its cost model where p is at or below the
        acceptance at which nothing pays: a loaded batch's requests that do not draft then cost the policy one
        comparison each instead of pricing every K on the model's piecewise lines."""
        return 0 if p <= self.floor(k_cap, batch, margin) else best_draft_len(p, k_cap, batch, self.costs, margin)

    def pays_at_all(self, k_cap: int, batch: int) -> bool:
        """Whether some K <= k_cap pays at this batch size at some acceptance (False: every request's K is 0,
        whatever its estimate)."""
        return self.mode == "fixed" or self.floor(k_cap, batch) < 1.0

    def floor(self, k_cap: int, batch: int, margin: float | None = None) -> float:
        """An acceptance at or below which no K <= k_cap pays at this batch size by `margin` (margin_for the batch
        where not given; cached per arguments)."""
        margin = margin_for(batch) if margin is None else margin
        key = (k_cap, batch, margin)
        lo = self._break_even.get(key)
        if lo is None:
            lo = self._break_even[key] = self._nothing_pays_up_to(k_cap, batch, margin)
        return lo

    def _nothing_pays_up_to(self, k_cap: int, batch: int, margin: float) -> float:
        """An acceptance at or below which no K pays (a K's rate grows with p, so 'some K pays' is monotone in
        p): the low end of a bisection, never above the true break-even, so `drafts_at` stays exact."""
        lo, hi = 0.0, 1.0
        if best_draft_len(hi, k_cap, batch, self.costs, margin) == 0:
            return hi
        if best_draft_len(lo, k_cap, batch, self.costs, margin) > 0:
            return -1.0
        for _ in range(30):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if best_draft_len(mid, k_cap, batch, self.costs, margin) > 0 else (mid, hi)
        return lo

    def choose(self, est: AcceptanceEstimate | None, k_cap: int, batch: int, planned: int | None = None,
               shadow: bool = True) -> int:
        """planned: the K the request's batch chose (SpecPolicy.plan), in place of the request's own pricing.
        shadow: a probe in a batch may draft without verifying (False where matching the committed tokens would
        not count what verification accepts: drafts that rejection sampling verifies)."""
        if self.mode == "fixed" or k_cap <= 0 or est is None:
            return k_cap
        margin = margin_for(batch)
        if planned is not None:
            k = min(planned, k_cap)
        else:
            k = self.drafts_at(est.p, k_cap, batch, margin)
            # A request that gave up drafting resumes only when the K pays at the estimate's lower bound too.
            # Else one landed probe lifts p over a thin gain (a batch whose verify rows cost), drafting resumes,
            # the text goes on as before and the steps cost more than they commit, until p falls again.
            if k > 0 and est.idle > 0 and not pays(est.p_low, k, batch, self.costs, margin):
                k = 0
        if k > 0:
            est.idle = est.probe_gap = 0  # drafting pays again: a later give-up starts from short waits
            self.last_draft = self.iteration
        else:
            est.idle += 1
            wait = est.probe_gap or self.probe_every
            # the cost model runs only on a probe iteration past the shortest wait, not every idle step. Both
            # rules price at the batch's margin, as its drafting does: a probe at a batch whose drafting needs a
            # margin the engine-wide rate does not reach cannot lift the batch into drafting, and at a loaded
            # batch the requests that gave up together probe together (their context writes, a drafter pass and
            # a verify row each). The engine-wide rate is taken one standard error up: a fresh engine's rate is
            # its prior, not a measurement, and must not stop it from finding out
            if (self.iteration % self.probe_every == 0 and est.idle >= wait
                    and self.drafts_at(self.engine_rate.upper(1.0), k_cap, batch, margin) == 0):
                wait = self.max_gap  # drafting does not pay at the rate the drafter keeps on this traffic
            # the engine probes one request itself every max_gap iterations in which nothing taught its rate (the
            # prior of every new request): requests shorter than max_gap never probe on their own, and their own
            # probes do not teach it (observe)
            engine_probe = self.engine_probes_now and (self.engine_turn is None or self.engine_turn is est)
            if ((est.idle >= wait or engine_probe) and self.iteration % self.probe_every == 0 and est.shadow is None
                    and self.drafts_at(HOPEFUL_P, k_cap, batch, margin) > 0):
                est.idle, est.probing, est.engine_probe = 0, True, engine_probe
                est.probe_gap = est.probe_gap or self.probe_every
                if engine_probe:  # a request's own probe does not teach the engine-wide rate (observe)
                    self.last_draft = self.iteration
                # the engine's probe, one request's drafter pass, drafts the request's K: a block, read without
                # bias by the estimate per position that the engine-wide rate is (see observe)
                n = k_cap if engine_probe else 1
                if shadow and batch > 1:
                    est.shadow_at, est.shadow_k = self.iteration, n
                else:
                    k = n
        return k

    def shadow_len(self, est: AcceptanceEstimate | None) -> int:
        """Tokens of the shadow probe `choose` gave the request in this iteration (0: none)."""
        return est.shadow_k if est is not None and est.shadow_at == self.iteration else 0


def min_confidence_for(cfg: SpecConfig, device: str, supports_confidence: bool = True) -> float:
    """The confidence cut: given, else CPU_MIN_CONFIDENCE on a CPU with the adaptive policy, else off."""
    if not supports_confidence:
        return 0.0
    if cfg.min_draft_confidence is not None:
        return cfg.min_draft_confidence
    return CPU_MIN_CONFIDENCE if str(device).startswith("cpu") and cfg.draft_len_policy == "adaptive" else 0.0


class SpecPolicy:
    """The policy of one engine: the settings (SpecConfig), the proposer's capabilities and the device decide
    the defaults; `draft_len` and `cut` are the only places a request's K is set, `observe` the only place its
    acceptance statistics change."""

    def __init__(self, cfg: SpecConfig, max_draft_len: int, device: str, costs: StepCosts,
                 supports_confidence: bool = True, samples_drafts: bool = False):
        self.cfg, self.max_draft_len, self.costs = cfg, max_draft_len, costs
        self.samples_drafts = samples_drafts  # sampled requests' drafts are verified by rejection sampling
        self.lengths = DraftLengthPolicy(cfg.draft_len_policy, costs)
        self.planned: int | None = None  # this iteration's K, priced for the whole batch (plan); None: per request
        self.min_confidence = min_confidence_for(cfg, device, supports_confidence)

    @classmethod
    def for_device(cls, cfg: SpecConfig, max_draft_len: int, device: str, measured: dict | None = None,
                   pass_cost: bool = True, supports_confidence: bool = True,
                   samples_drafts: bool = False) -> "SpecPolicy":
        """Costs: given (step_costs), else measured, else the device's fallbacks; a proposer without a model
        pass (n-gram lookup) drafts for free."""
        costs = StepCosts.for_device(device, cfg.step_costs or measured)
        if not pass_cost:
            costs.draft = costs.draft_row = 0.0
            costs.draft_curve = ()
        return cls(cfg, max_draft_len, device, costs, supports_confidence, samples_drafts)

    @property
    def adaptive(self) -> bool:
        return self.cfg.draft_len_policy == "adaptive"

    def begin_iteration(self, num_decoding: int) -> int:
        """The schedule's K for this iteration's batch of decoding requests; 0 where no K pays at this batch size
        even if every draft were accepted, so no request is priced (nor counts the iteration as idle)."""
        self.lengths.begin_iteration()
        self.planned = None
        k = self.cfg.draft_len_for(num_decoding, self.max_draft_len) if self.max_draft_len else 0
        return k if k and self.lengths.pays_at_all(k, num_decoding) else 0

    def quiet_iteration(self, decoding: list, k: int, max_seq_len: int) -> bool:
        """Whether no request drafts this iteration whatever its turn: no probe falls on it and every estimate, at
        the acceptance the batch prices it at (`trusted_p`: `plan` for two or more, the estimate itself for one),
        is at or below the acceptance at which no K <= k pays at this batch size. Each request's step is then
        counted as `draft_len` would count it (an idle step where it could have drafted), with no request priced
        one by one: at a loaded batch that pricing cost about as much as the rest of the scheduling."""
        lengths = self.lengths
        if not self.adaptive or lengths.iteration % lengths.probe_every == 0:
            return False
        batch = len(decoding)
        floor, idle = lengths.floor(k, batch), []
        for seq in decoding:
            est = seq.acceptance
            if est is None or not seq.spec_enabled:
                continue
            if est.p > floor and trusted_p(est, batch) > floor:  # trusted_p is never above est.p
                return False
            if self._cap(seq, k, max_seq_len) > 0:
                idle.append(est)
        for est in idle:
            est.idle += 1
        return True

    def plan(self, decoding: list, k: int, max_seq_len: int) -> None:
        """One K for every request of a batch of two or more that may draft, priced together over their estimates
        (`batch_draft_len`, each at `trusted_p`), in place of each request's own pricing. Priced alone, each
        request pays for the drafter pass as if it were the pass's only reason to run, and where acceptance sits
        near the break-even the estimates scatter to either side of it: some requests stop drafting, the pass
        runs for the others anyway, and the batch commits less than it would at any one K. Priced together, the
        pass's cost is shared and the estimates' noise averages out. Where every estimate is at or below the
        break-even of equal estimates, no K pays for the batch either (its tokens grow with each estimate, and
        trusted_p is never above it), so the quiet iteration's shortcut stays exact."""
        if not self.adaptive or len(decoding) < 2:
            return
        able, ests, others = [], [], 0
        turn = self.lengths.engine_probes_now  # the requests' estimates are gathered only where the engine probes
        for seq in decoding:
            cap = self._cap(seq, k, max_seq_len) if seq.spec_enabled and seq.acceptance is not None else 0
            if cap > 0:
                able.append((trusted_p(seq.acceptance, len(decoding)), cap))
                if turn:
                    ests.append(seq.acceptance)
            else:
                others += 1
        self.lengths.pick_engine_turn(ests)
        if able and max(a[0] for a in able) <= self.lengths.floor(k, len(decoding)):
            self.planned = 0  # no K pays at these estimates (as in quiet_iteration), so none is priced
        elif able:
            self.planned = batch_draft_len([a[0] for a in able], [a[1] for a in able], others, k, self.costs,
                                           margin_for(len(decoding)))

    def new_request(self, seq) -> None:
        if self.max_draft_len:
            seq.acceptance = self.lengths.new_estimate()

    def draft_len(self, seq, k_cap: int, batch: int, max_seq_len: int) -> int:
        if not self.max_draft_len or not seq.spec_enabled:
            return 0
        return self.lengths.choose(seq.acceptance, self._cap(seq, k_cap, max_seq_len), batch, self.planned,
                                   shadow=seq.params.greedy or not self.samples_drafts)

    def shadow_len(self, seq) -> int:
        """How many tokens the request drafts this iteration without verifying them (a shadow probe; 0: none)."""
        return self.lengths.shadow_len(seq.acceptance)

    @staticmethod
    def _cap(seq, k_cap: int, max_seq_len: int) -> int:
        """k_cap within what the request may still commit (a step commits up to K + 1 tokens) and its room."""
        return max(0, min(k_cap, seq.params.max_tokens - seq.num_output - 1, max_seq_len - len(seq.token_ids)))

    def cut(self, lens: dict[int, int], confidence: dict[int, list[float]] | None) -> dict[int, int]:
        """How many of each request's drafts to verify (confident_prefixes), seq_id -> count."""
        if self.min_confidence <= 0 or confidence is None:
            return lens
        ids = list(lens)
        conf = [c for i in ids for c in confidence[i][:lens[i]]]
        return dict(zip(ids, confident_prefixes(conf, [lens[i] for i in ids], self.min_confidence)))

    def shadow(self, seq, drafts: list[int]) -> None:
        """A shadow probe's drafts, before the step commits its token: they stand for the request's next tokens."""
        seq.acceptance.shadow = (len(seq.token_ids), drafts)

    def settle(self, seq) -> None:
        """After a commit: a pending shadow probe whose drafts the committed tokens now decide (a draft that differs
        from its token, or all of them matched, or the request finished) counts as the verified step it stands for:
        the drafts up to the first that differs are accepted. Tokens a finished request never committed decide
        nothing, so all-matched drafts cut short by its end count as that many drafted, all accepted."""
        est = seq.acceptance
        start, drafts = est.shadow
        got = seq.token_ids[start:start + len(drafts)]
        a = 0
        while a < len(got) and drafts[a] == got[a]:
            a += 1
        if a == len(got) and len(got) < len(drafts) and not seq.is_finished:
            return
        est.shadow = None
        if got:
            self.observe(seq, len(drafts) if a < len(got) else len(got), a)

    def observe(self, seq, drafted: int, accepted: int) -> None:
        """A verified step of `drafted` drafts with `accepted` of them accepted."""
        if seq.acceptance is not None:
            self.lengths.observe(seq.acceptance, drafted, accepted)
        seq.accept_hist.append(accepted)
        w = self.cfg.acceptance_window
        if self.cfg.min_acceptance > 0 and len(seq.accept_hist) >= w:
            recent = seq.accept_hist[-w:]
            if sum(recent) / len(recent) < self.cfg.min_acceptance:
                seq.spec_enabled = False
