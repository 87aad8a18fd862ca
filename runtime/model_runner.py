"""Runs one engine iteration on the models: one drafter pass over every drafting request's block, one target
pass over all prefill chunks and verify rows, then acceptance, commit and the drafter context update.
Only lengths move on rejection: rejected rows' K/V stay in the pages and are overwritten later.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import AttentionBatch
from .models.draft import DFlashDrafter, DraftSlice
from .models.target import TargetModel
from .sampling import sample_rows
from .scheduler import Scheduled
from .spec import accept


@dataclass
class StepResult:
    new_tokens: list[int]
    drafts: list[int] | None = None  # the step's draft tokens (speculative steps only)
    accepted: int = 0


class ModelRunner:
    def __init__(self, target: TargetModel, drafter: DFlashDrafter | None, target_caches, draft_caches,
                 page_size: int, device):
        self.target, self.drafter = target, drafter
        self.target_caches, self.draft_caches = target_caches, draft_caches
        self.page, self.device = page_size, torch.device(device)

    def _slots(self, table: list[int], start: int, end: int) -> torch.Tensor:
        pos = torch.arange(start, end)
        bt = torch.tensor(table, dtype=torch.int64)
        return (bt[pos // self.page] * self.page + pos % self.page).to(self.device)

    @torch.inference_mode()
    def draft(self, work: list[Scheduled]) -> dict[int, list[int]]:
        """One drafter forward over the full block of every drafting request; returns K drafts each."""
        d, b = self.drafter, self.drafter.block_size
        ids, pos, slices = [], [], []
        for i, w in enumerate(work):
            s, start = w.seq, w.seq.num_computed
            ids += [s.token_ids[-1]] + [d.mask_token_id] * (b - 1)
            pos += range(start, start + b)
            slices.append(DraftSlice(i * b, b, self._slots(s.block_table, 0, start)))
        ids_t = torch.tensor(ids, device=self.device)
        hidden = d(self.target.embed(ids_t), torch.tensor(pos, device=self.device), self.draft_caches, slices)
        rows = torch.tensor([i * b + 1 + j for i, w in enumerate(work) for j in range(w.draft_len)],
                            device=self.device)
        toks = d.logits(hidden.index_select(0, rows), self.target.head_weight).argmax(-1).tolist()
        out, at = {}, 0
        for w in work:
            out[w.seq.seq_id] = toks[at:at + w.draft_len]
            at += w.draft_len
        return out

    @torch.inference_mode()
    def execute(self, work: list[Scheduled]) -> dict[int, StepResult]:
        drafting = [w for w in work if w.draft_len > 0]
        drafts = self.draft(drafting) if drafting else {}
        ids, pos, meta = [], [], []
        for w in work:
            s = w.seq
            if w.is_prefill:
                toks = s.token_ids[s.num_computed:s.num_computed + w.num_rows]
            else:
                toks = [s.token_ids[-1]] + drafts.get(s.seq_id, [])
            ids += toks
            pos += range(s.num_computed, s.num_computed + len(toks))
            meta.append((len(toks), s.num_computed + len(toks), s.block_table))
        batch = AttentionBatch.build(meta, self.page, self.device)
        pos_t = torch.tensor(pos, device=self.device)
        capture = self.drafter is not None
        hidden, feats = self.target(torch.tensor(ids, device=self.device), pos_t, self.target_caches, batch,
                                    capture=capture)
        # rows whose next token we need: verify rows, and the last row of a prompt that completes now
        logit_rows, params, sample_pos, owners = [], [], [], []
        row = 0
        for w in work:
            s, n = w.seq, w.num_rows
            if not w.is_prefill or (s.num_computed + n == s.prefill_target and s.num_output == 0):
                first = row if not w.is_prefill else row + n - 1
                for r in range(first, row + n):
                    logit_rows.append(r)
                    params.append(s.params)
                    sample_pos.append(s.num_computed + (r - row) + 1)
                    owners.append(s.seq_id)
            row += n
        choice = []
        if logit_rows:
            logits = self.target.logits(hidden.index_select(0, torch.tensor(logit_rows, device=self.device)))
            choice = sample_rows(logits, params, sample_pos).tolist()
        by_seq: dict[int, list[int]] = {}
        for sid, tok in zip(owners, choice):
            by_seq.setdefault(sid, []).append(tok)
        results, ctx_rows, row = {}, [], 0
        for w in work:
            s, n = w.seq, w.num_rows
            if w.is_prefill:
                ctx_rows += range(row, row + n)
                s.num_computed += n
                results[s.seq_id] = StepResult(by_seq.get(s.seq_id, []))
            else:
                dr = drafts.get(s.seq_id, [])
                a, committed = accept(dr, by_seq[s.seq_id])
                ctx_rows += range(row, row + a + 1)
                s.num_computed += a + 1
                results[s.seq_id] = StepResult(committed, dr if w.draft_len else None, a)
            row += n
        if capture and ctx_rows:
            idx = torch.tensor(ctx_rows, device=self.device)
            self.drafter.write_context(feats.index_select(0, idx), pos_t.index_select(0, idx),
                                       batch.slot_mapping.index_select(0, idx), self.draft_caches)
        return results
