"""Runs the target once per engine iteration over a packed batch: every prefill chunk and every verify block
(the bonus token and the request's drafts), with the target's features captured when the proposer needs them.
Returns the logits of the rows whose next token must be chosen: verify blocks, and prompts that complete now.
Only lengths move on rejection: rejected rows' K/V stay in the pages and are overwritten later. A hybrid
target's linear-attention state cannot be truncated that way: each request's state slot starts from zero with
its first prefill row, prefill chunks and plain decode rows write their new state at once, and a verify block
leaves its slot at the pre-verify state until `commit` sets it to the state after the committed rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import AttentionBatch
from .models.gated_deltanet import LinearBatch
from .models.target import TargetModel
from .scheduler import Scheduled
from .spec.interface import TargetPass
from .spec.verify import VerifyItem


def load_plugin_ops(enabled: bool):
    """The compiled DFlash ops (plugins/), or None for the pure-PyTorch path (also the tests' oracle)."""
    if not enabled:
        return None
    from .plugins import dflash_ops

    return dflash_ops if dflash_ops.available() else None


@dataclass
class TargetOutput:
    target_pass: TargetPass
    verify: dict[int, VerifyItem]  # seq_id -> its verify rows (offsets into `logits`)
    logits: torch.Tensor | None
    linear: LinearBatch | None = None  # a hybrid target's step: verify segments wait for commit
    greedy: torch.Tensor | None = None  # every chosen row greedy: their argmax tokens, in place of logits


class ModelRunner:
    def __init__(self, target: TargetModel, caches, page_size: int, device, window_pool: bool = False,
                 capture: bool = False, states=None, rollback: str = "states", chunked_min: int | None = None):
        self.target, self.target_caches = target, caches
        self.layer_caches = target.layer_caches(caches)
        # a hybrid target's state pool (None otherwise), what its verify passes keep for the rollback, and the row
        # count from which a prefill uses the chunked delta rule (None: always the batch-invariant recurrent one)
        self.states, self.rollback, self.chunked_min = states, rollback, chunked_min
        self.window_pool = window_pool  # sliding-window layers address their own pool (seq.window_table)
        self.page, self.device = page_size, torch.device(device)
        self.capture = capture  # the proposer reads the target's features (needs_target_features)

    @torch.inference_mode()
    def run(self, work: list[Scheduled], drafts: dict[int, list[int]]) -> TargetOutput:
        ids, pos, meta, wmeta, rows, at = [], [], [], [], {}, 0
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
            rows[s.seq_id] = (at, len(toks))
            at += len(toks)
        batch = AttentionBatch.build(meta, self.page, self.device)
        if self.window_pool:
            batch.windowed = AttentionBatch.build(wmeta, self.page, self.device)
        pos_t = torch.tensor(pos, device=self.device)
        lb, extra = None, {}
        if self.states is not None:
            for w in work:
                if w.is_prefill and w.seq.num_computed == 0:  # a new or recomputed request: no state yet
                    self.states.clear(w.seq.state_slot)
            lb = LinearBatch.from_attention(batch, [w.seq.state_slot for w in work],
                                            [bool(drafts.get(w.seq.seq_id)) and not w.is_prefill for w in work],
                                            self.chunked_min)
            lb.rollback = self.rollback
            extra = {"states": self.states, "linear": lb}
        hidden, feats = self.target(torch.tensor(ids, device=self.device), pos_t, self.layer_caches, batch,
                                    capture=self.capture, **extra)
        # requests whose next tokens we need: verify blocks, and prompts that complete now (K = 0)
        verify, picked = {}, []
        for w in work:
            s = w.seq
            first, n = rows[s.seq_id]
            if not w.is_prefill:
                dr = drafts.get(s.seq_id, [])
                verify[s.seq_id] = VerifyItem(s.params, dr, len(picked), s.num_computed)
                picked += range(first, first + n)
            elif s.num_computed + n == s.prefill_target and s.num_output == 0:
                verify[s.seq_id] = VerifyItem(s.params, [], len(picked), s.num_computed + n - 1)
                picked.append(first + n - 1)
        logits = greedy = None
        if picked:
            # decode and verify steps pick every row, in order
            chosen = hidden if len(picked) == hidden.shape[0] and picked[-1] == len(picked) - 1 else \
                hidden.index_select(0, torch.tensor(picked, device=self.device))
            if all(it.params.greedy for it in verify.values()):  # argmax tokens are all the step needs
                greedy = self.target.greedy_tokens(chosen)
            if greedy is None:
                logits = self.target.logits(chosen)
        return TargetOutput(TargetPass(rows, feats, pos_t, batch.slot_mapping), verify, logits, lb, greedy)

    def commit(self, work: list[Scheduled], out: TargetOutput, committed: dict[int, list[int]]) -> None:
        """After verification: each verify block's state slot becomes the state after its committed rows (the
        bonus row and the accepted drafts). Targets without recurrent state keep only lengths: nothing to do."""
        lb = out.linear
        if lb is None:
            return
        for segment, w in enumerate(work):
            if lb.keep[segment]:
                self.target.commit(self.states, lb, segment, len(committed[w.seq.seq_id]))
