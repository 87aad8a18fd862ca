"""Verification: the target's choice for every verify row, then tree-free acceptance, for any proposer.

`posterior[j]` is the target's own choice for the token after verify row j (argmax, or its seeded sample).
Accepting exactly the drafts that equal the target's choice keeps the output identical to the target's own
decoding; for T > 0 it equals speculative rejection sampling with a one-hot draft, so proposers that draft
deterministically (DFlash's argmax, n-gram lookup) keep the target's sampling distribution exactly.

One dispatch, three back ends that must agree token for token (tests/test_spec_verify.py):
- "torch": per-row sampling (runtime/sampling.py) and `accept` in Python: the reference;
- "ops": the compiled greedy / sampling verify kernels (plugins/), one call for the whole batch;
- "tp": a vocabulary-split head under tensor parallelism: a distributed argmax for greedy rows (no logits
  gathered), full logits gathered only for sampled rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import SamplingParams, sample_rows


def accept(drafts: list[int], posterior: list[int]) -> tuple[int, list[int]]:
    """Returns (accepted draft count a, committed tokens d_1..d_a + posterior[a])."""
    a = 0
    while a < len(drafts) and drafts[a] == posterior[a]:
        a += 1
    return a, drafts[:a] + [posterior[a]]


@dataclass
class VerifyItem:
    """One request's verify rows: logits rows `offset .. offset + len(drafts)`; row j chooses the token at
    position start + j + 1."""
    params: SamplingParams
    drafts: list[int]
    offset: int
    start: int


class Verifier:
    def __init__(self, ops=None, tp_head=None):
        # ops: the compiled plugin ops or None; tp_head: the vocab-split head (tensor_parallel.VocabParallelHead)
        self.ops, self.tp_head = ops, tp_head
        self.backend = "tp" if tp_head is not None else "ops" if ops is not None else "torch"

    def __call__(self, items: list[VerifyItem], logits: torch.Tensor) -> list[list[int]]:
        """Committed tokens per item (accepted drafts + the target's own next token)."""
        if not items:
            return []
        if self.backend == "ops":
            return self._kernels(items, logits)
        params = [it.params for it in items for _ in range(len(it.drafts) + 1)]
        pos = [it.start + j + 1 for it in items for j in range(len(it.drafts) + 1)]
        choice = self._tp_choices(logits, params, pos) if self.backend == "tp" else \
            sample_rows(logits, params, pos).tolist()
        return [accept(it.drafts, choice[it.offset:it.offset + len(it.drafts) + 1])[1] for it in items]

    def _tp_choices(self, local_logits, params, pos) -> list[int]:
        choice = [0] * len(params)
        greedy = [i for i, p in enumerate(params) if p.greedy]
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if greedy:
            idx = torch.tensor(greedy, device=local_logits.device)
            for i, t in zip(greedy, self.tp_head.argmax(local_logits.index_select(0, idx)).tolist()):
                choice[i] = t
        if sampled:
            idx = torch.tensor(sampled, device=local_logits.device)
            full = self.tp_head.gather(local_logits.index_select(0, idx))
            for i, t in zip(sampled, sample_rows(full, [params[i] for i in sampled], [pos[i] for i in sampled])
                            .tolist()):
                choice[i] = t
        return choice

    def _kernels(self, items, logits) -> list[list[int]]:
        dev = logits.device
        kmax = max(len(it.drafts) for it in items)
        drafts = torch.tensor([it.drafts + [-1] * (kmax - len(it.drafts)) for it in items], dtype=torch.int64,
                              device=dev).view(len(items), kmax)
        lens = torch.tensor([len(it.drafts) for it in items], dtype=torch.int64, device=dev)
        offs = torch.tensor([it.offset for it in items], dtype=torch.int64, device=dev)
        ps = [it.params for it in items]
        if all(p.greedy for p in ps):
            _, _, com, num = self.ops.greedy_verify(drafts, lens, logits, offs)
        else:
            _, _, com, num = self.ops.sampling_verify(
                drafts, lens, logits, offs, torch.tensor([it.start for it in items], device=dev),
                torch.tensor([p.seed for p in ps], dtype=torch.int64, device=dev),
                torch.tensor([p.temperature for p in ps], dtype=torch.float64, device=dev),
                torch.tensor([max(p.top_k, 0) for p in ps], dtype=torch.int64, device=dev),
                torch.tensor([p.top_p for p in ps], dtype=torch.float64, device=dev))
        com, num = com.tolist(), num.tolist()
        return [com[i][:num[i]] for i in range(len(items))]
