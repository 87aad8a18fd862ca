"""Measures the draft-length policy's step costs on this machine, with these models, at engine start.

The policy (spec/policy.py) weighs committed tokens against what a step costs: T(n) for a target pass over n
rows and D(B) for a drafter pass drafting for B requests. Those costs move a lot with the device, the thread
count and the model size, and on a CPU T is not a straight line (rows are nearly free while the matmuls stream
the weights, and cost their full compute once they turn compute-bound), so constants measured once elsewhere, or
a slope taken between two small batches, send requests to the wrong K. Real engine steps and drafter passes on
scratch requests give the curves' points, each the median over a few rounds of that round's own figure: a round
runs every point within a fraction of a second, so a busy (or a fast) spell of a shared machine moves its points
together and their ratios little, where the fastest try of each point apart mixed spells and moved the curve by
20-50% from one engine start to the next:

    target pass: 1 request decoding (1 row), 1 request verifying K and 2K+1 drafts (K+1 and 2 (K+1) rows),
                 4 requests verifying K-1 drafts each (4 K rows), 16 requests decoding (16 rows), and 8
                 requests verifying K drafts each (8 (K+1) rows: what a loaded batch verifies, query blocks
                 and all; beyond it the curve goes on with that last slope). The kernels' row tiles keep a
                 pass's cost nearly flat up to some rows and then step it up, so a line from K+1 rows straight
                 to 16 misprices every batch in between (a few requests verifying a short K most)
    drafter pass: for 1, 4 and 16 requests (each including writing the K+1 context rows its last step committed;
                  with a trimming proposer, K+1 block rows each, and the curve is read in those units)

Before the rounds the target's greedy head screen is armed (`_arm_screen`), as it is once an engine has served a
few steps: the passes are timed as the engine runs them.

The returned figures are in units of a pass's fixed cost (the 1..16-row line's value at 0 rows): `row`, `draft`
and `draft_row` are those straight lines, `curve` and `draft_curve` the measured points.
"""
from __future__ import annotations

import time
from statistics import median

import torch

from ..greedy_head import ARM_ROWS
from ..sampling import SamplingParams
from ..scheduler import Scheduled
from ..sequence import Sequence

CONTEXT = 48  # cached positions of each scratch request (attention cost of a short chat turn)
N = 16  # requests of the wide measurements (more rows: a difference well above the noise)
MID = 4  # requests of the middle points (a drafter pass; a target pass verifying K-1 drafts each)
VERIFY = 8  # requests of the verify point: past the CPU's turn to compute-bound, and half the start time of 16


def _timed_rounds(runs: dict, tries: int) -> list[dict]:
    """`tries` rounds (after one warm-up round) of every run in turn: each round's timings, name -> seconds."""
    rounds = []
    for i in range(tries + 1):
        t = {}
        for name, (fn, seqs) in runs.items():
            t0 = time.perf_counter()
            _run(fn, seqs)
            t[name] = time.perf_counter() - t0
        if i:
            rounds.append(t)
    return rounds


def _run(fn, seqs) -> None:
    """One pass of the scratch requests, each from the same cached length."""
    for s in seqs:
        s.num_computed = CONTEXT
    fn(seqs)


def _arm_screen(target, run, rows: int) -> None:
    """Runs `run` (a pass of `rows` greedy rows) until the target's greedy head screen is armed, where it has one.
    The screen arms on the first rows the head sees (runtime/greedy_head.py) and from then on reads the head for
    every pass it takes (GreedyHead.takes) at a fraction of its cost: measured unarmed, those passes carry the whole
    head, and a wider pass it does not take looks cheap beside them (bf16 at four requests: a verify of twelve rows
    against their plain step)."""
    prepare = getattr(target, "prepare_greedy_head", None)
    screen = prepare() if prepare is not None else None
    for _ in range(-(-ARM_ROWS // rows)):  # the rows it arms after, if it sees all of them
        if screen is None or screen.armed:
            return
        run()


def _costs(t: dict, runs: dict, pass_cost: bool) -> dict:
    """One round's timings as the policy's figures, in units of that round's fixed cost."""
    one, wide = t["one"], t["wide"]
    r = max((wide - one) / (N - 1), 0.0)
    fixed = max(one - r, 1e-6)
    out = {"row": r / fixed, "draft": 0.0, "draft_row": 0.0,
           "curve": [(rows, t[name] / fixed) for name, (fn, _, rows) in runs.items() if rows]}
    if pass_cost:
        d_one, d_wide = t["d_one"], t["d_wide"]
        d = max((d_wide - d_one) / (N - 1), 0.0)
        out.update(draft=max(d_one - d, 0.0) / fixed, draft_row=d / fixed,
                   draft_curve=[(n, t[name] / fixed) for name, (_, n, rows) in runs.items() if not rows])
    return out


def _median(rounds: list[dict]) -> dict:
    """Each figure's median over the rounds (the curves point by point)."""
    out = {}
    for key, v in rounds[0].items():
        if isinstance(v, list):
            out[key] = [(x, median(r[key][i][1] for r in rounds)) for i, (x, _) in enumerate(v)]
        else:
            out[key] = median(r[key] for r in rounds)
    return out


def measure_step_costs(runner, proposer, blocks, token_id: int, k: int = 3, tries: int = 5,
                       confidence: bool = False) -> dict | None:
    """Returns {"row", "draft", "draft_row", "curve", "draft_curve"} in units of a pass's fixed cost, or None
    without cache room. A proposer without a model pass (pass_cost False) drafts for free: only the target's
    costs are measured. confidence: time the drafts as the engine will make them (with the drafter's
    probabilities, for the confidence cut)."""
    seqs: list[Sequence] = []

    def decode(group):
        runner.run([Scheduled(s, 1, 0, False) for s in group], {})

    def verify(group, drafts: int = k):
        runner.run([Scheduled(s, drafts + 1, drafts, False) for s in group],
                   {s.seq_id: [token_id] * drafts for s in group})

    def verify_long(group):  # a lone request's longer block
        verify(group, 2 * k + 1)

    def verify_short(group):  # a few requests' shorter blocks
        verify(group, k - 1)

    def draft(group):  # what a drafting request adds to a step: its last K+1 rows' context, then the drafter
        for s in group:
            pos = torch.arange(CONTEXT - k - 1, CONTEXT)
            table = torch.tensor(s.block_table)
            slots = table[pos // blocks.block_size] * blocks.block_size + pos % blocks.block_size
            d = proposer.drafter
            width = len(d.cfg.target_layer_ids) * d.cfg.hidden_size  # fc's input (8-bit packing empties fc.weight)
            proposer.queue(s, (torch.zeros(k + 1, width, dtype=d.fc.weight.dtype, device=runner.device),
                               pos.to(runner.device), slots.to(runner.device)))
        proposer.propose([Scheduled(s, k + 1, k, False) for s in group], want_confidence=confidence)

    # name: (what runs, requests, target rows)
    # a pass's cost follows its requests as well as its rows (each has its own attention and bookkeeping), so
    # each point is measured as the policy uses it: one request verifying K drafts is the batch-of-one choice
    runs = {"one": (decode, 1, 1), "block": (verify, 1, k + 1), "long": (verify_long, 1, 2 * (k + 1)),
            "few": (verify_short, MID, MID * k), "wide": (decode, N, N), "verify": (verify, VERIFY, VERIFY * (k + 1))}
    if proposer.pass_cost:  # drafter passes: no target rows
        runs.update(d_one=(draft, 1, 0), d_mid=(draft, MID, 0), d_wide=(draft, N, 0))
    try:
        for _ in range(N):
            s = Sequence([token_id] * CONTEXT, SamplingParams(max_tokens=2 * (k + 1), seed=0))
            s.token_ids.append(token_id)  # one output token: the next step is a decode step
            if not blocks.can_grow(s, CONTEXT + 2 * (k + 1)):
                return None
            blocks.grow(s, CONTEXT + 2 * (k + 1))
            seqs.append(s)
        _arm_screen(runner.target, lambda: _run(verify_long, seqs[:1]), 2 * (k + 1))
        rounds = _timed_rounds({name: (fn, seqs[:n]) for name, (fn, n, _) in runs.items()}, tries)
    finally:
        for s in seqs:
            blocks.release(s)
            proposer.release(s)
    out = _median([_costs(t, runs, proposer.pass_cost) for t in rounds])
    if proposer.pass_cost and getattr(proposer, "trim", False):
        out["draft_rows"] = k + 1  # the passes above had 1 + K rows per request
    return out
