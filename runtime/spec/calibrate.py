"""Measures the draft-length policy's step costs on this machine, with these models, at engine start.

The policy (spec/policy.py) weighs committed tokens against what a step costs: `fixed` for a target
pass, `row` per verify row, `draft` per drafter pass and `draft_row` per drafting request. Those ratios move a lot
with the device, the thread count and the model size (on this 2-core CPU `row` is 0.09 of a step at one thread
and 0.055 at two), so constants measured once elsewhere send requests to the wrong K. Real engine steps and
drafter passes on scratch requests, the fastest of a few tries each (the others met a busy machine), give them:

    1 request decoding (1 row): F + r         16 requests decoding (16 rows): F + 16r
    drafter pass for 1 request: D + d         drafter pass for 16 requests:  D + 16d
    (a drafter pass here includes writing the K+1 context rows the request's last step committed)
"""
from __future__ import annotations

import time

import torch

from ..sampling import SamplingParams
from ..scheduler import Scheduled
from ..sequence import Sequence

CONTEXT = 48  # cached positions of each scratch request (attention cost of a short chat turn)
N = 16  # requests of the wide measurements (more rows: a difference well above the noise)


def _fastest(runs: dict, tries: int) -> dict:
    """The fastest of `tries` timings of each run (after one warm-up round). The runs take turns, so a busy spell
    of the machine slows one try of each rather than every try of one, and cannot skew their differences."""
    best = {name: float("inf") for name in runs}
    for i in range(tries + 1):
        for name, (fn, seqs) in runs.items():
            for s in seqs:
                s.num_computed = CONTEXT
            t0 = time.perf_counter()
            fn(seqs)
            if i:
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


def measure_step_costs(runner, proposer, blocks, token_id: int, k: int = 3, tries: int = 4,
                       confidence: bool = False) -> dict | None:
    """Returns {"row", "draft", "draft_row"} in units of a one-row target pass, or None without cache room.
    A proposer without a model pass (pass_cost False) drafts for free: only `row` is measured. confidence: time
    the drafts as the engine will make them (with the drafter's probabilities, for the confidence cut)."""
    seqs: list[Sequence] = []

    def decode(group):
        runner.run([Scheduled(s, 1, 0, False) for s in group], {})

    def draft(group):  # what a drafting request adds to a step: its last K+1 rows' context, then the drafter
        for s in group:
            pos = torch.arange(CONTEXT - k - 1, CONTEXT)
            table = torch.tensor(s.block_table)
            slots = table[pos // blocks.block_size] * blocks.block_size + pos % blocks.block_size
            w = proposer.drafter.fc.weight
            proposer.pending[s.seq_id] = [(torch.zeros(k + 1, w.shape[1], dtype=w.dtype, device=runner.device),
                                           pos.to(runner.device), slots.to(runner.device))]
        proposer.propose([Scheduled(s, k + 1, k, False) for s in group], want_confidence=confidence)

    runs = {"one": decode, "wide": decode}
    if proposer.pass_cost:
        runs.update(d_one=draft, d_wide=draft)
    try:
        for _ in range(N):
            s = Sequence([token_id] * CONTEXT, SamplingParams(max_tokens=k + 1, seed=0))
            s.token_ids.append(token_id)  # one output token: the next step is a decode step
            if not blocks.can_grow(s, CONTEXT + k + 1):
                return None
            blocks.grow(s, CONTEXT + k + 1)
            seqs.append(s)
        t = _fastest({name: (fn, seqs[:1] if name in ("one", "d_one") else seqs) for name, fn in runs.items()},
                     tries)
    finally:
        for s in seqs:
            blocks.release(s)
            proposer.release(s)
    one, wide = t["one"], t["wide"]
    r = max((wide - one) / (N - 1), 0.0)
    fixed = max(one - r, 1e-6)
    if not proposer.pass_cost:
        return {"row": r / fixed, "draft": 0.0, "draft_row": 0.0}
    d_one, d_wide = t["d_one"], t["d_wide"]
    d = max((d_wide - d_one) / (N - 1), 0.0)
    return {"row": r / fixed, "draft": max(d_one - d, 0.0) / fixed, "draft_row": d / fixed}
