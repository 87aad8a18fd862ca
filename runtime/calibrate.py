"""Measures the draft-length policy's step costs on this machine, with these models, at engine start.

The policy (runtime/draft_policy.py) weighs committed tokens against what a step costs: `fixed` for a target
pass, `row` per verify row, `draft` per drafter pass and `draft_row` per drafting request. Those ratios move a lot
with the device, the thread count and the model size (on this 2-core CPU `row` is 0.09 of a step at one thread
and 0.055 at two), so constants measured once elsewhere send requests to the wrong K. Real engine steps and
drafter passes on scratch requests, the fastest of a few tries each (the others met a busy machine), give them:

    1 request decoding (1 row): F + r         8 requests decoding (8 rows): F + 8r
    drafter pass for 1 request: D + d         drafter pass for 8 requests:  D + 8d
"""
from __future__ import annotations

import time

from .sampling import SamplingParams
from .scheduler import Scheduled
from .sequence import Sequence

CONTEXT = 48  # cached positions of each scratch request (attention cost of a short chat turn)
N = 8  # requests of the wide measurements


def _fastest(fn, seqs: list[Sequence], tries: int) -> float:
    best = float("inf")
    for _ in range(tries + 1):  # the first run warms up
        for s in seqs:
            s.num_computed = CONTEXT
        t0 = time.perf_counter()
        fn(seqs)
        best = min(best, time.perf_counter() - t0)
    return best


def measure_step_costs(runner, blocks, token_id: int, k: int = 3, tries: int = 3) -> dict | None:
    """Returns {"row", "draft", "draft_row"} in units of a one-row target pass, or None without cache room."""
    seqs: list[Sequence] = []

    def decode(group):
        runner.execute([Scheduled(s, 1, 0, False) for s in group])

    def draft(group):
        runner.draft([Scheduled(s, k + 1, k, False) for s in group])

    try:
        for _ in range(N):
            s = Sequence([token_id] * CONTEXT, SamplingParams(max_tokens=k + 1, seed=0))
            s.token_ids.append(token_id)  # one output token: the next step is a decode step
            if not blocks.can_grow(s, CONTEXT + k + 1):
                return None
            blocks.grow(s, CONTEXT + k + 1)
            seqs.append(s)
        one, wide = _fastest(decode, seqs[:1], tries), _fastest(decode, seqs, tries)
        d_one, d_wide = _fastest(draft, seqs[:1], tries), _fastest(draft, seqs, tries)
    finally:
        for s in seqs:
            blocks.release(s)
    r = max((wide - one) / (N - 1), 0.0)
    fixed = max(one - r, 1e-6)
    d = max((d_wide - d_one) / (N - 1), 0.0)
    return {"row": r / fixed, "draft": max(d_one - d, 0.0) / fixed, "draft_row": d / fixed}
