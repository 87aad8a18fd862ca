"""The DFlash proposer: one drafter pass drafts a whole block for every drafting request, conditioned on the
target's features of the request's committed tokens, which the drafter keeps as K/V in its own paged cache
(the same block tables as the target's).

The drafter's context is written lazily: the committed rows' features wait in a queue keyed by request, and
are written right before the request's next draft, before the next draft of another request that reads its
blocks through the prefix cache (`share`), or once the queue holds PENDING_BYTES. A request that is not drafting
(the policy found it does not pay, or the batch is too large) then costs one large context write every
PENDING_BYTES of features, and nothing at all if it finishes first: at 16-32 requests that do not draft, writing
every committed row cost ~1.5% of the throughput. When a request leaves, the rows it owes blocks the prefix cache
keeps stay parked per block until a request that hit the block drafts (then written), the block's space is
reused (`evict`: dropped), or the parked rows pass PARKED_BYTES (the oldest written). A hit itself writes
nothing: where requests do not draft, writing each hit's context at admission cost the drafter what the prefix
cache saved the target. Rejected rows never enter the queue, so nothing needs rolling back: only lengths move on
rejection.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import accumulate

import torch

from ..models.draft import DFlashDrafter, DraftSlice
from .interface import Proposal, Proposer, TargetPass


@dataclass
class ContextQueue:
    """One request's committed rows whose drafter context is not written yet: its last `rows` positions."""
    seq: object  # the request (its block table and length)
    parts: list = field(default_factory=list)  # ((features, positions, slots) of a step, first row, rows)
    rows: int = 0


class DFlashProposer(Proposer):
    name = "dflash"
    needs_target_features = True
    pass_cost = True
    supports_confidence = True
    PENDING_BYTES = 8 << 20  # a request's queued features before they are written anyway (memory bound)
    PARKED_BYTES = 64 << 20  # features finished requests owe cached blocks, all requests together

    def __init__(self, drafter: DFlashDrafter, target, caches, page_size: int, device, ops=None,
                 scratch: tuple[int, int] = (0, 0), trim: bool = False):
        self.drafter, self.target, self.caches = drafter, target, caches
        self.trim = trim  # block_rows: only the rows the longest draft needs
        # drafter cache rows outside every block table, where a fused CPU pass writes its blocks' K/V
        self.scratch = torch.arange(scratch[0], sum(scratch), device=device) if scratch[1] else None
        self.page, self.device, self.ops = page_size, torch.device(device), ops
        self.feature_layers = list(drafter.cfg.target_layer_ids)
        self.tp_head = getattr(target, "tp", None)  # vocab-split head under tensor parallelism
        self.pending: dict[int, ContextQueue] = {}  # seq_id -> its queue, while not empty
        row_bytes = len(self.feature_layers) * drafter.cfg.hidden_size * 4  # fp32 at most
        self.max_pending = max(64, self.PENDING_BYTES // row_bytes)
        # cached block -> the parts ((features, positions, slots), first row, rows) of the rows its finished owner
        # still owes it, oldest first
        self.parked: OrderedDict[int, tuple] = OrderedDict()
        self.parked_rows, self.max_parked = 0, max(64, self.PARKED_BYTES // row_bytes)
        # seq_id -> the cache blocks it reads through the prefix cache, until its first draft writes what they owe
        self.hits: dict[int, list[int]] = {}
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

    def block_rows(self, work) -> int:
        """Rows of each request's block in this pass: the drafter's block, or with `trim`, where several requests
        draft, the bonus row and one MASK row per draft of the longest draft asked for. A pass of several blocks
        costs its rows where they are not free (a CPU), and a block cut after the last row a draft is read from
        drafts nearly as well: its rows still attend to the whole context and to each other, only the MASK rows
        past the last draft are missing."""
        if not self.trim or len(work) < 2:  # one request's block: its rows cost next to nothing on the weights' stream
            return self.block_size
        return min(self.block_size, 1 + max(w.draft_len for w in work))

    def pending_rows(self, seq_id: int) -> int:
        q = self.pending.get(seq_id)
        return q.rows if q is not None else 0

    @torch.inference_mode()
    def propose(self, work, want_confidence: bool = False) -> Proposal:
        work = [w for w in work if w.draft_len > 0]
        if not work:
            return Proposal()
        # their whole context before the drafter reads it, in one write: what the blocks they hit owe, and their
        # own queues
        ids = [w.seq.seq_id for w in work]
        owners, parked = self._hit_debts(ids)
        self.write_context(owners + ids, parked)
        d, b = self.drafter, self.block_rows(work)
        ids_t, pos_t, slices = self._blocks(work, b)
        hidden = d(self.target.embed(ids_t), pos_t, self.caches, slices, self.scratch)
        if len(work) == 1:  # its drafts' rows follow the bonus row: a view, no gather
            head_rows = hidden[1:1 + work[0].draft_len]
        else:
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

    def _blocks(self, work, b: int):
        """[bonus, MASK x (b-1)] per request at positions start..start+b-1, and each one's context slots."""
        d = self.drafter
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
        """Queue the committed rows' features: a range of the step's buffer per request (a verify block's committed
        rows lead its block). Where several requests share the step and some rows were rejected, the committed
        rows are gathered first: other requests' queues may keep the buffer long after a drafting request's next
        draft wrote its own rows, and it should not hold rejected rows that long. A lone request's buffer lives
        until its next draft, so it is kept as it is."""
        feats, pos, slots = target_pass.features, target_pass.positions, target_pass.slot_mapping
        rows = target_pass.rows  # seq_id -> (first row, rows)
        if len(work) > 1 and sum(committed_rows.values()) < feats.shape[0]:
            spans = [(w.seq.seq_id, rows[w.seq.seq_id][0], committed_rows[w.seq.seq_id]) for w in work]
            idx = torch.cat([torch.arange(first, first + n) for _, first, n in spans]).to(feats.device)
            feats, pos, slots = feats.index_select(0, idx), pos.index_select(0, idx), slots.index_select(0, idx)
            rows = {sid: (at, n) for (sid, _, n), at in zip(spans, accumulate((n for _, _, n in spans), initial=0))}
        step, full = (feats, pos, slots), []
        for w in work:  # every step, every request: one call each, and no list built unless a queue fills
            sid = w.seq.seq_id
            if self.queue(w.seq, step, rows[sid][0], committed_rows[sid]):
                full.append(sid)
        if full:
            self.write_context(full)

    def queue(self, seq, step: tuple, first: int = 0, rows: int | None = None) -> bool:
        """Rows first .. first + rows - 1 (all by default) of a step's (features, positions, slots), whose context
        the next write_context of the request writes; True when its queue is full. The step's tensors and the
        range are kept, not slices: a request that never drafts costs no tensor op per step."""
        rows = step[0].shape[0] - first if rows is None else rows
        q = self.pending.get(seq.seq_id)
        if q is None:
            q = self.pending[seq.seq_id] = ContextQueue(seq)
        q.parts.append((step, first, rows))
        q.rows += rows
        return q.rows >= self.max_pending

    @staticmethod
    def _rows(parts) -> tuple:
        """(features, positions, slots) of the parts' rows, one after another."""
        return tuple(torch.cat([t[i][a:a + n] for t, a, n in parts]) for i in range(3))

    @staticmethod
    def _span(parts, lo: int, hi: int) -> list:
        """The parts of rows lo .. hi - 1 of a queue (its rows counted in the order they were queued)."""
        out, at = [], 0
        for t, a, n in parts:
            s, e = max(lo, at), min(hi, at + n)
            if s < e:
                out.append((t, a + s - at, e - s))
            at += n
            if at >= hi:
                break
        return out

    def share(self, seq) -> None:
        """The request reads its first num_computed rows' blocks through the prefix cache: what they owe is written
        before its first draft (`_hit_debts`), not now."""
        n = -(-seq.num_computed // self.page)
        if n:
            self.hits[seq.seq_id] = seq.block_table[:n]

    def _hit_debts(self, seq_ids) -> tuple[list, list]:
        """What the blocks these requests hit still owe, taken for writing before they draft: (the owners whose
        queued rows cover a hit block, a request's queue holding its last rows, positions num_computed - rows ..
        num_computed - 1; the parts parked for hit blocks). The blocks stay allocated while a request that hit them
        lives, so their parked rows are still theirs."""
        blocks = [b for sid in seq_ids for b in self.hits.pop(sid, ())]
        if not blocks:
            return [], []
        hit = set(blocks)
        owners = [sid for sid, q in self.pending.items()
                  if hit.intersection(q.seq.block_table[(q.seq.num_computed - q.rows) // self.page:])]
        return owners, [self._unpark(b) for b in blocks if b in self.parked]

    @torch.inference_mode()
    def write_context(self, seq_ids, parked=()) -> None:
        parts = [p for sid in seq_ids if sid in self.pending for p in self.pending.pop(sid).parts]
        parts += [p for block_parts in parked for p in block_parts]
        if not parts:
            return
        self.drafter.write_context(*self._rows(parts), self.caches)

    def release(self, seq, cached_blocks=frozenset()) -> None:
        self.hits.pop(seq.seq_id, None)
        q = self.pending.pop(seq.seq_id, None)  # the context waiting for blocks that go goes too
        if q is None or not cached_blocks:
            return
        start, page = seq.num_computed - q.rows, self.page
        for i in range(start // page, -(-seq.num_computed // page)):
            b = seq.block_table[i]
            if b in cached_blocks:  # the block's rows, as parts of the queue: no tensor op until they are written
                lo, hi = max(start, i * page) - start, min(seq.num_computed, (i + 1) * page) - start
                self.parked[b] = self._span(q.parts, lo, hi)
                self.parked_rows += hi - lo
        spill = []
        while self.parked_rows > self.max_parked:
            spill.append(self._unpark(next(iter(self.parked))))
        self.write_context((), spill)

    def evict(self, block: int) -> None:
        if block in self.parked:
            self._unpark(block)

    def _unpark(self, block: int) -> list:
        parts = self.parked.pop(block)
        self.parked_rows -= sum(n for _, _, n in parts)
        return parts
