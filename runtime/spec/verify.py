"""Verification: the target's choice for every verify row, then tree-free acceptance, for any proposer.

`posterior[j]` is the target's own choice for the token after verify row j (argmax, or its seeded sample).
Accepting exactly the drafts that equal the target's choice keeps the output identical to the target's own
decoding; for T > 0 it equals speculative rejection sampling with a one-hot draft, so proposers that draft
deterministically (DFlash's argmax, n-gram lookup) keep the target's sampling distribution exactly.

A proposer that samples its drafts (DFlash2's selector at T > 0) hands over the distribution q each draft came
from (`VerifyItem.draft_dist`), and those rows get speculative rejection sampling: draft d at a row with target
distribution p is accepted when u * q(d) < p(d); the first rejected row takes a sample of norm(max(p - q, 0)),
and a block accepted whole takes its bonus from p. Each row's three draws are independent Philox streams of
(seed, position): the proposer's draft draw (DRAFT_STREAM), the acceptance draw (ACCEPT_STREAM) and the
residual or bonus draw (stream 0, the autoregressive sampler's own). A position's draws only ever decide that
position, so every committed token is distributed exactly as the target's (tests/test_dflash2.py).

One dispatch, three back ends that must agree token for token (tests/test_spec_verify.py):
- "torch": per-row sampling (runtime/sampling.py) and `accept` in Python: the reference;
- "ops": the compiled greedy / sampling verify kernels (plugins/), one call for the whole batch;
- "tp": a vocabulary-split head under tensor parallelism: a distributed argmax for greedy rows (no logits
  gathered), full logits gathered only for sampled rows.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..sampling import SamplingParams, filtered_probs, philox4x32, sample_rows, uniforms

DRAFT_STREAM, ACCEPT_STREAM = 1, 2  # Philox counter word 2: 0 is the sampler's stream (runtime/sampling.py)


def stream_uniforms(seeds: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """One float64 uniform in [0, 1) per (seed, position) from Philox stream `stream` (counter word 2), as
    sampling.uniforms does for stream 0."""
    if stream == 0:
        return uniforms(seeds, positions)
    seeds, positions = seeds.to(torch.int64).reshape(-1), positions.to(torch.int64).reshape(-1)
    mask = 0xFFFFFFFF
    counter = torch.stack([positions & mask, (positions >> 32) & mask, torch.full_like(positions, stream),
                           torch.zeros_like(positions)], 1)
    r = philox4x32(counter, torch.stack([seeds & mask, (seeds >> 32) & mask], 1))
    return ((r[:, 0] << 21) | (r[:, 1] >> 11)).to(torch.float64) * (2.0 ** -53)


@dataclass
class DraftDist:
    """The distribution each draft of a request was sampled from: row j puts probs[j, c] on token
    candidates[j, c] (distinct tokens; the rest of the vocabulary has probability 0)."""
    candidates: torch.Tensor  # [K, C] int64
    probs: torch.Tensor  # [K, C] float64


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
    draft_dist: DraftDist | None = None  # sampled drafts' distribution (rows beyond len(drafts) are unused)


class Verifier:
    def __init__(self, ops=None, tp_head=None):
        # ops: the compiled plugin ops or None; tp_head: the vocab-split head (tensor_parallel.VocabParallelHead)
        self.ops, self.tp_head = ops, tp_head
        self.backend = "tp" if tp_head is not None else "ops" if ops is not None else "torch"

    def __call__(self, items: list[VerifyItem], logits: torch.Tensor | None,
                 greedy: torch.Tensor | None = None) -> list[list[int]]:
        """Committed tokens per item (accepted drafts + the target's own next token). greedy: every row's argmax
        token, given in place of logits when every item is greedy."""
        if not items:
            return []
        if greedy is not None:
            g = greedy.tolist()
            return [accept(it.drafts, g[it.offset:it.offset + len(it.drafts) + 1])[1] for it in items]
        rejection = [i for i, it in enumerate(items) if it.draft_dist is not None and it.drafts
                     and not it.params.greedy]
        if rejection:
            rest = [i for i in range(len(items)) if i not in set(rejection)]
            out = [None] * len(items)
            if rest:  # the other items verify as usual, over their own rows (the back ends read rows in order)
                sub, rows, at = [], [], 0
                for i in rest:
                    n = len(items[i].drafts) + 1
                    sub.append(replace(items[i], offset=at))
                    rows += range(items[i].offset, items[i].offset + n)
                    at += n
                for i, toks in zip(rest, self(sub, logits.index_select(0, torch.tensor(rows, device=logits.device)))):
                    out[i] = toks
            # every rejection-sampled row's acceptance and token draws in two Philox calls
            seeds = torch.tensor([items[i].params.seed for i in rejection for _ in range(len(items[i].drafts) + 1)])
            pos = torch.tensor([items[i].start + 1 + j for i in rejection for j in range(len(items[i].drafts) + 1)])
            u_acc = stream_uniforms(seeds, pos, ACCEPT_STREAM).tolist()
            u_tok = stream_uniforms(seeds, pos, 0).tolist()
            at = 0
            for i in rejection:
                n = len(items[i].drafts) + 1
                out[i] = self._rejection(items[i], logits, u_acc[at:at + n], u_tok[at:at + n])
                at += n
            return out
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

    def _rejection(self, it: VerifyItem, logits: torch.Tensor, u_acc: list[float], u_tok: list[float]) -> list[int]:
        """Speculative rejection sampling of one request's sampled drafts against their distribution; u_acc /
        u_tok: the acceptance and token draws of its rows."""
        p_ = it.params
        k = len(it.drafts)
        rows = logits[it.offset:it.offset + k + 1]
        if self.backend == "tp":
            rows = self.tp_head.gather(rows)
        probs = filtered_probs(rows, p_.temperature, max(p_.top_k, 0), p_.top_p)  # [k + 1, V] float64
        cand = it.draft_dist.candidates.to(probs.device)
        q = it.draft_dist.probs.to(probs.device, torch.float64)
        for j, d in enumerate(it.drafts):
            q_d = float(q[j][cand[j] == d].sum())
            if u_acc[j] * q_d < float(probs[j, d]):
                continue
            return it.drafts[:j] + [_inverse_cdf(residual(probs[j], cand[j], q[j]), u_tok[j])]
        return list(it.drafts) + [_inverse_cdf(probs[k], u_tok[k])]


def residual(p: torch.Tensor, cand: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What a rejected row samples from: max(p - q, 0) (normalised by the sampler); p itself where that is
    empty, which happens only when p == q."""
    r = p.index_add(0, cand, -q).clamp_min(0)
    return r if float(r.sum()) > 0 else p


def _inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The token whose cumulative probability interval holds u (of the total mass), as sample_rows draws."""
    cdf = probs.cumsum(0)
    return min(int(torch.searchsorted(cdf, u * cdf[-1], right=True)), probs.shape[0] - 1)
