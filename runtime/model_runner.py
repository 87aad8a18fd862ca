"""Runs one engine iteration on the models: one drafter pass over every drafting request's block, one target
pass over all prefill chunks and verify rows, then acceptance, commit and the drafter context update (lazy:
see write_context).
Only lengths move on rejection: rejected rows' K/V stay in the pages and are overwritten later.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import AttentionBatch
from .draft_policy import confident_prefixes
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


def load_plugin_ops(enabled: bool):
    """The compiled DFlash ops (plugins/), or None for the pure-PyTorch path (also the tests' oracle)."""
    if not enabled:
        return None
    from .plugins import dflash_ops

    return dflash_ops if dflash_ops.available() else None


class ModelRunner:
    def __init__(self, target: TargetModel, drafter: DFlashDrafter | None, target_caches, draft_caches,
                 page_size: int, device, use_plugins: bool = True, window_pool: bool = False):
        self.target, self.drafter = target, drafter
        self.window_pool = window_pool  # sliding-window layers address their own pool (seq.window_table)
        self.target_caches, self.draft_caches = target_caches, draft_caches
        self.page, self.device = page_size, torch.device(device)
        self.ops = load_plugin_ops(use_plugins)
        self.min_confidence = 0.0  # drafts end before the first later one the drafter doubts (confident_prefixes)
        # tensor parallelism: the head is vocab-split (runtime/tensor_parallel.py); its logits are local
        self.tp = getattr(target, "tp", None)
        if drafter is not None:
            drafter.ops = self.ops

    def _slots(self, table: list[int], start: int, end: int) -> torch.Tensor:
        pos = torch.arange(start, end)
        bt = torch.tensor(table, dtype=torch.int64)
        return (bt[pos // self.page] * self.page + pos % self.page).to(self.device)

    @torch.inference_mode()
    def draft(self, work: list[Scheduled]) -> dict[int, list[int]]:
        """One drafter forward over the full block of every drafting request; returns K drafts each."""
        d, b = self.drafter, self.drafter.block_size
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
            slices = [DraftSlice(i * b, b, ctx[offs[i]:offs[i + 1]]) for i in range(len(work))]
        else:
            ids, pos, slices = [], [], []
            for i, (w, start) in enumerate(zip(work, starts)):
                ids += [w.seq.token_ids[-1]] + [d.mask_token_id] * (b - 1)
                pos += range(start, start + b)
                slices.append(DraftSlice(i * b, b, self._slots(w.seq.block_table, 0, start)))
            ids_t, pos_t = torch.tensor(ids, device=self.device), torch.tensor(pos, device=self.device)
        hidden = d(self.target.embed(ids_t), pos_t, self.draft_caches, slices)
        rows = torch.tensor([i * b + 1 + j for i, w in enumerate(work) for j in range(w.draft_len)],
                            device=self.device)
        head_rows = hidden.index_select(0, rows)
        if self.min_confidence > 0 and self.tp is None:
            toks, conf = d.draft_tokens(head_rows, self.target.logits, confidence=True)
            keep = confident_prefixes(conf.tolist(), [w.draft_len for w in work], self.min_confidence)
        else:
            toks = d.draft_tokens(head_rows, self.target.logits, self.tp.argmax if self.tp is not None else None)
            keep = [w.draft_len for w in work]
        toks = toks.tolist()
        out, at = {}, 0
        for w, k in zip(work, keep):
            out[w.seq.seq_id] = toks[at:at + k]
            at += w.draft_len
        return out

    @torch.inference_mode()
    def execute(self, work: list[Scheduled]) -> dict[int, StepResult]:
        drafting = [w for w in work if w.draft_len > 0]
        if drafting:
            self.write_context([w.seq for w in drafting])  # their whole context before the drafter reads it
        drafts = self.draft(drafting) if drafting else {}
        ids, pos, meta, wmeta = [], [], [], []
        for w in work:
            s = w.seq
            if w.is_prefill:
                toks = s.token_ids[s.num_computed:s.num_computed + w.num_rows]
            else:
                toks = [s.token_ids[-1]] + drafts.get(s.seq_id, [])
            ids += toks
            pos += range(s.num_computed, s.num_computed + len(toks))
            meta.append((len(toks), s.num_computed + len(toks), s.block_table))
            wmeta.append((len(toks), s.num_computed + len(toks), s.window_table))
        batch = AttentionBatch.build(meta, self.page, self.device)
        if self.window_pool:
            batch.windowed = AttentionBatch.build(wmeta, self.page, self.device)
        pos_t = torch.tensor(pos, device=self.device)
        capture = self.drafter is not None
        hidden, feats = self.target(torch.tensor(ids, device=self.device), pos_t, self.target_caches, batch,
                                    capture=capture)
        # rows actually packed: a verify block is 1 + its drafts, which confident_prefixes may have cut below K
        rows_of = [w.num_rows if w.is_prefill else 1 + len(drafts.get(w.seq.seq_id, [])) for w in work]
        # requests whose next tokens we need: verify blocks, and prompts that complete now (K = 0)
        verify, row = [], 0  # (work item, first logits row in the packed batch, drafts)
        for w, n in zip(work, rows_of):
            s = w.seq
            if not w.is_prefill:
                verify.append((w, row, drafts.get(s.seq_id, [])))
            elif s.num_computed + n == s.prefill_target and s.num_output == 0:
                verify.append((w, row + n - 1, []))
            row += n
        committed = self._verify(verify, hidden) if verify else {}
        results, row = {}, 0
        for w, n in zip(work, rows_of):
            s = w.seq
            if w.is_prefill:
                committed_rows = n
                results[s.seq_id] = StepResult(committed.get(s.seq_id, []))
            else:
                dr = drafts.get(s.seq_id, [])
                toks = committed[s.seq_id]
                committed_rows = len(toks)
                results[s.seq_id] = StepResult(toks, dr if w.draft_len else None, len(toks) - 1)
            s.num_computed += committed_rows
            if capture:  # committed rows are contiguous: slices (features copied, not the step's whole buffer kept)
                end = row + committed_rows
                s.ctx_pending.append((feats[row:end].clone(), pos_t[row:end], batch.slot_mapping[row:end]))
            row += n
        if capture:
            self.write_context([w.seq for w in work if w.seq.ctx_pending_rows >= self.CONTEXT_BATCH])
        return results

    # The drafter's context (its K/V of the target features of committed rows) is written lazily: right before
    # the request's next draft, or once CONTEXT_BATCH rows wait. A request that is not drafting (the policy
    # found it does not pay, or the batch is too large) then costs a context write every CONTEXT_BATCH rows,
    # not a ~1 ms call of 7 small GEMMs every step, and nothing at all if it finishes first.
    CONTEXT_BATCH = 64

    def write_context(self, seqs) -> None:
        parts = [p for s in seqs for p in s.ctx_pending]
        if not parts:
            return
        self.drafter.write_context(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]),
                                   torch.cat([p[2] for p in parts]), self.draft_caches)
        for s in seqs:
            s.ctx_pending = []

    def _tp_choices(self, local_logits, params, pos) -> list[int]:
        """Greedy rows: distributed argmax (no logits gathered); sampled rows: their full logits gathered."""
        choice = [0] * len(params)
        greedy = [i for i, p in enumerate(params) if p.greedy]
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if greedy:
            idx = torch.tensor(greedy, device=local_logits.device)
            for i, t in zip(greedy, self.tp.argmax(local_logits.index_select(0, idx)).tolist()):
                choice[i] = t
        if sampled:
            idx = torch.tensor(sampled, device=local_logits.device)
            full = self.tp.gather(local_logits.index_select(0, idx))
            toks = sample_rows(full, [params[i] for i in sampled], [pos[i] for i in sampled]).tolist()
            for i, t in zip(sampled, toks):
                choice[i] = t
        return choice

    def _verify(self, verify, hidden) -> dict[int, list[int]]:
        """Target choices for every verify row, then tree-free acceptance: seq_id -> committed tokens."""
        rows, offsets = [], []
        for w, first, dr in verify:
            offsets.append(len(rows))
            rows += range(first, first + len(dr) + 1)
        logits = self.target.logits(hidden.index_select(0, torch.tensor(rows, device=self.device)))
        # the position of each request's row 0: the bonus (verify) or the prompt's last token (prefill)
        starts = [w.seq.num_computed + (w.num_rows - 1 if w.is_prefill else 0) for w, _, _ in verify]
        if self.ops is None or self.tp is not None:
            out = {}
            params = [w.seq.params for w, _, dr in verify for _ in range(len(dr) + 1)]
            pos = [st + j + 1 for (w, _, dr), st in zip(verify, starts) for j in range(len(dr) + 1)]
            if self.tp is not None:
                choice = self._tp_choices(logits, params, pos)
            else:
                choice = sample_rows(logits, params, pos).tolist()
            for (w, _, dr), off in zip(verify, offsets):
                out[w.seq.seq_id] = accept(dr, choice[off:off + len(dr) + 1])[1]
            return out
        kmax = max(len(dr) for _, _, dr in verify)
        dev = self.device
        drafts = torch.tensor([dr + [-1] * (kmax - len(dr)) for _, _, dr in verify], dtype=torch.int64,
                              device=dev).view(len(verify), kmax)
        lens = torch.tensor([len(dr) for _, _, dr in verify], dtype=torch.int64, device=dev)
        offs = torch.tensor(offsets, dtype=torch.int64, device=dev)
        ps = [w.seq.params for w, _, _ in verify]
        if all(p.greedy for p in ps):
            _, _, com, num = self.ops.greedy_verify(drafts, lens, logits, offs)
        else:
            _, _, com, num = self.ops.sampling_verify(
                drafts, lens, logits, offs, torch.tensor(starts, device=dev),
                torch.tensor([p.seed for p in ps], dtype=torch.int64, device=dev),
                torch.tensor([p.temperature for p in ps], dtype=torch.float64, device=dev),
                torch.tensor([max(p.top_k, 0) for p in ps], dtype=torch.int64, device=dev),
                torch.tensor([p.top_p for p in ps], dtype=torch.float64, device=dev))
        com, num = com.tolist(), num.tolist()
        return {w.seq.seq_id: com[i][:num[i]] for i, (w, _, _) in enumerate(verify)}
