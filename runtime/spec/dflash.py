"""The DFlash proposer: one drafter pass drafts a whole block for every drafting request, conditioned on the
target's features of the request's committed tokens, which the drafter keeps as K/V in its own paged cache
(the same block tables as the target's).

The drafter's context is written lazily: the committed rows' features wait in a queue keyed by request, and
are written right before the request's next draft, or once CONTEXT_BATCH rows wait. A request that is not
drafting (the policy found it does not pay, or the batch is too large) then costs a context write every
CONTEXT_BATCH rows, not a ~1 ms call of 7 small GEMMs every step, and nothing at all if it finishes first.
Rejected rows never enter the queue, so nothing needs rolling back: only lengths move on rejection.
"""
from __future__ import annotations

import torch

from ..models.draft import DFlashDrafter, DraftSlice
from .interface import Proposal, Proposer, TargetPass


class DFlashProposer(Proposer):
    name = "dflash"
    needs_target_features = True
    pass_cost = True
    supports_confidence = True
    CONTEXT_BATCH = 64

    def __init__(self, drafter: DFlashDrafter, target, caches, page_size: int, device, ops=None):
        self.drafter, self.target, self.caches = drafter, target, caches
        self.page, self.device, self.ops = page_size, torch.device(device), ops
        self.feature_layers = list(drafter.cfg.target_layer_ids)
        self.tp_head = getattr(target, "tp", None)  # vocab-split head under tensor parallelism
        # seq_id -> committed rows whose context is not written yet: (features, positions, slots)
        self.pending: dict[int, list] = {}
        drafter.ops = ops

    def max_draft_len(self, requested: int | None) -> int:
        return requested or self.block_size - 1  # the pair's validation bounds `requested` by the block

    @property
    def block_size(self) -> int:
        return self.drafter.block_size

    def slots(self, table: list[int], start: int, end: int) -> torch.Tensor:
        pos = torch.arange(start, end)
        bt = torch.tensor(table, dtype=torch.int64)
        return (bt[pos // self.page] * self.page + pos % self.page).to(self.device)

    def pending_rows(self, seq_id: int) -> int:
        return sum(p[0].shape[0] for p in self.pending.get(seq_id, ()))

    @torch.inference_mode()
    def propose(self, work, want_confidence: bool = False) -> Proposal:
        work = [w for w in work if w.draft_len > 0]
        if not work:
            return Proposal()
        self.write_context([w.seq.seq_id for w in work])  # their whole context before the drafter reads it
        ids_t, pos_t, slices = self._blocks(work)
        d, b = self.drafter, self.block_size
        hidden = d(self.target.embed(ids_t), pos_t, self.caches, slices)
        rows = torch.tensor([i * b + 1 + j for i, w in enumerate(work) for j in range(w.draft_len)],
                            device=self.device)
        head_rows = hidden.index_select(0, rows)
        conf = None
        if want_confidence and self.tp_head is None:
            toks, c = d.draft_tokens(head_rows, self.target.logits, confidence=True)
            conf = c.tolist()
        else:
            toks = d.draft_tokens(head_rows, self.target.logits,
                                  self.tp_head.argmax if self.tp_head is not None else None)
        toks = toks.tolist()
        out, confidence, at = Proposal(), {} if conf is not None else None, 0
        for w in work:
            out.drafts[w.seq.seq_id] = toks[at:at + w.draft_len]
            if conf is not None:
                confidence[w.seq.seq_id] = conf[at:at + w.draft_len]
            at += w.draft_len
        out.confidence = confidence
        return out

    def _blocks(self, work):
        """[bonus, MASK x (b-1)] per request at positions start..start+b-1, and each one's context slots."""
        d, b = self.drafter, self.block_size
        starts = [w.seq.num_computed for w in work]
        if self.ops is not None:
            width = max(len(w.seq.block_table) for w in work)
            tables = torch.tensor([w.seq.block_table + [0] * (width - len(w.seq.block_table)) for w in work],
                                  dtype=torch.int32, device=self.device)
            ids_t, pos_t, ctx, _ = self.ops.prepare_draft_blocks(
                torch.tensor([w.seq.token_ids[-1] for w in work], device=self.device),
                torch.tensor(starts, device=self.device), tables, block_size=b, mask_token_id=d.mask_token_id,
                page_size=self.page, num_ctx_slots=sum(starts))
            offs = [0]
            for st in starts:
                offs.append(offs[-1] + st)
            return ids_t, pos_t, [DraftSlice(i * b, b, ctx[offs[i]:offs[i + 1]]) for i in range(len(work))]
        ids, pos, slices = [], [], []
        for i, (w, start) in enumerate(zip(work, starts)):
            ids += [w.seq.token_ids[-1]] + [d.mask_token_id] * (b - 1)
            pos += range(start, start + b)
            slices.append(DraftSlice(i * b, b, self.slots(w.seq.block_table, 0, start)))
        return torch.tensor(ids, device=self.device), torch.tensor(pos, device=self.device), slices

    def observe(self, work, target_pass: TargetPass, committed_rows: dict[int, int]) -> None:
        """Queue the committed rows' features (slices copied: the step's whole buffer is not kept)."""
        for w in work:
            sid = w.seq.seq_id
            first, _ = target_pass.rows[sid]
            end = first + committed_rows[sid]
            self.pending.setdefault(sid, []).append((target_pass.features[first:end].clone(),
                                                     target_pass.positions[first:end],
                                                     target_pass.slot_mapping[first:end]))
        self.write_context([w.seq.seq_id for w in work if self.pending_rows(w.seq.seq_id) >= self.CONTEXT_BATCH])

    @torch.inference_mode()
    def write_context(self, seq_ids) -> None:
        parts = [p for sid in seq_ids for p in self.pending.pop(sid, ())]
        if not parts:
            return
        self.drafter.write_context(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]),
                                   torch.cat([p[2] for p in parts]), self.caches)

    def release(self, seq, keep_cache: bool = False) -> None:
        if keep_cache:
            self.write_context([seq.seq_id])
        self.pending.pop(seq.seq_id, None)  # its blocks are gone: the context waiting for them goes too

    def context_written(self, seq) -> int:
        return seq.num_computed - self.pending_rows(seq.seq_id)
