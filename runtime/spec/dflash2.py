"""The DFlash2 proposer: DFlash's block pass and context cache (spec/dflash.py), then the drafter's candidate
selector walks each request's rows from its bonus token (models/dflash2.py).

Greedy requests get the selector's best path. A sampled request (T > 0) draws each draft from the selector's
softmax(scores / T) with its own counter-based uniforms (the DRAFT stream of spec/verify.py, keyed by the
request's seed and the draft's position), and the proposal carries those distributions: verification then runs
speculative rejection sampling against them, so the output keeps exactly the target's distribution.

Confidence (the policy's cut of doubted drafts) is the selector's probability of its choice for greedy
requests. Sampled requests report 1.0: a cut that looked at sampled drafts would verify a draft only when it
came out confident, i.e. from another distribution than the one verification divides by.
"""
from __future__ import annotations

import torch

from ..errors import DFlashError
from ..models.dflash2 import DFlash2Drafter
from .dflash import DFlashProposer
from .interface import Proposal
from .verify import DRAFT_STREAM, DraftDist, stream_uniforms


class DFlash2Proposer(DFlashProposer):
    name = "dflash2"
    samples_drafts = True

    def __init__(self, drafter: DFlash2Drafter, target, caches, page_size: int, device, ops=None):
        if getattr(target, "tp", None) is not None:
            raise DFlashError("DFlash2 drafters do not run under tensor parallelism: use tp_size 1")
        super().__init__(drafter, target, caches, page_size, device, ops)

    @torch.inference_mode()
    def propose(self, work, want_confidence: bool = False) -> Proposal:
        work = [w for w in work if w.draft_len > 0]
        if not work:
            return Proposal()
        self.write_context([w.seq.seq_id for w in work])
        d, b = self.drafter, self.block_size  # whole blocks: trimming is measured for DFlash drafters only
        ids_t, pos_t, slices = self._blocks(work, b)
        hidden = d(self.target.embed(ids_t), pos_t, self.caches, slices)
        flat = [i * b + 1 + j for i, w in enumerate(work) for j in range(w.draft_len)]
        head_rows = hidden.index_select(0, torch.tensor(flat, device=self.device))
        logits, vocab_ids = d.selector_logits(head_rows, self.target.logits)
        k_max = max(w.draft_len for w in work)
        rows, at = [], 0
        for w in work:  # request i's draft j is head row at + j; padding repeats its last row
            rows.append([at + min(j, w.draft_len - 1) for j in range(k_max)])
            at += w.draft_len
        rows_t = torch.tensor(rows, device=self.device)
        temps = [w.seq.params.temperature for w in work]
        u = torch.zeros(len(work), k_max, dtype=torch.float64)
        sampled = [i for i, t in enumerate(temps) if t > 0]
        if sampled:
            start = [w.seq.num_computed for w in work]  # the bonus token's position: draft j sits at start + j
            seeds = torch.tensor([work[i].seq.params.seed for i in sampled for _ in range(k_max)])
            pos = torch.tensor([start[i] + 1 + j for i in sampled for j in range(k_max)])
            u[sampled] = stream_uniforms(seeds, pos, DRAFT_STREAM).view(len(sampled), k_max)
        anchors = torch.tensor([w.seq.token_ids[-1] for w in work], device=self.device)
        walk = d.candidate_selector.walk(head_rows, logits, vocab_ids, rows_t, anchors, temps, u.to(self.device))
        toks = walk.tokens.tolist()
        out = Proposal(dists={})
        conf = {} if want_confidence else None
        if want_confidence:
            greedy_p = torch.softmax(walk.scores.double(), -1).gather(2, walk.choice[..., None])[..., 0].tolist()
        for i, w in enumerate(work):
            sid, k = w.seq.seq_id, w.draft_len
            out.drafts[sid] = toks[i][:k]
            if temps[i] > 0:
                out.dists[sid] = DraftDist(walk.candidates[i, :k].cpu(), walk.probs[i, :k].cpu())
            if conf is not None:
                conf[sid] = [1.0] * k if temps[i] > 0 else greedy_p[i][:k]
        out.confidence = conf
        return out
