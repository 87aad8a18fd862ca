"""Iteration-level scheduling and the one writer of request state after admission.

`schedule`: decoding requests first (K+1 verify rows each, K from the speculative policy), then prefill chunks
of running and newly admitted requests within the `max_num_tokens` row budget. When the cache runs out, the most
recently admitted request is preempted (its blocks freed, recomputed later).

`postprocess`: after the target pass and verification, commits each request's tokens, advances its cached
length, records its statistics and finishes it on the first stop condition: EOS, a stop token id, a stop string
(found in the incrementally detokenized text where the tokens are committed), max_tokens or max_seq_len.
`abort` is the same finish path with reason "abort", for waiting, running and preempted requests alike.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from .detokenizer import Detokenizer, find_stop
from .engine_config import EngineConfig
from .kv_cache import CacheBlocks
from .sequence import Sequence, Status


@dataclass
class Scheduled:
    seq: Sequence
    num_rows: int  # rows in this step's target pass
    draft_len: int  # K for a decoding request (0: plain autoregressive step)
    is_prefill: bool
    shadow_len: int = 0  # tokens it drafts without verifying them (a shadow probe: spec/policy.py)


@dataclass
class StepOutput:
    """What one request gained in one iteration."""
    seq: Sequence
    new_token_ids: list[int]
    finished: bool


class Scheduler:
    def __init__(self, cfg: EngineConfig, blocks: CacheBlocks, policy=None, proposer=None,
                 eos_ids=(), detokenizer: Detokenizer | None = None):
        self.cfg, self.blocks, self.policy, self.proposer = cfg, blocks, policy, proposer
        if proposer is not None:
            blocks.main.on_evict = proposer.evict
        self.eos_ids = set(eos_ids)
        self.detok = detokenizer or Detokenizer(None)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        if self.policy is not None:
            self.policy.new_request(seq)
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- freeing ------------------------------------------------------------------------------------
    def _free(self, seq: Sequence) -> None:
        self.blocks.publish(seq, seq.num_computed)
        if self.proposer is not None:
            # with prefix caching some of the request's blocks outlive it: the proposer keeps what it owes them
            self.proposer.release(seq, self.blocks.published(seq))
        self.blocks.release(seq)

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        """The one finish path: EOS, stop ids, stop strings, length and abort all end here."""
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        seq.finish_time = now
        self.detok.update(seq.detok, seq.output_ids, final=True)
        self._free(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def abort(self, seq: Sequence) -> None:
        if not seq.is_finished:
            self._finish(seq, "abort", time.perf_counter())

    def _preempt(self, victim: Sequence) -> None:
        self.running.remove(victim)
        self._free(victim)
        victim.num_computed = 0
        victim.status = Status.WAITING
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)

    # -- scheduling ---------------------------------------------------------------------------------
    def schedule(self) -> list[Scheduled]:
        budget, out = self.cfg.max_num_tokens, []
        decoding = [s for s in self.running if not s.in_prefill]
        k = self.policy.begin_iteration(len(decoding)) if self.policy is not None else 0
        if k and self.policy.quiet_iteration(decoding, k, self.cfg.max_seq_len):
            k = 0
        if k:
            self.policy.plan(decoding, k, self.cfg.max_seq_len)
        for seq in list(self.running):
            if seq.in_prefill or seq not in self.running or budget < 1:
                continue
            kk = self.policy.draft_len(seq, k, len(decoding), self.cfg.max_seq_len) if k else 0
            kk = min(kk, budget - 1)
            need = seq.num_computed + kk + 1
            self.blocks.trim(seq)
            while not self.blocks.can_grow(seq, need):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq not in self.running:
                continue
            self.blocks.grow(seq, need)
            out.append(Scheduled(seq, kk + 1, kk, False, self.policy.shadow_len(seq) if k else 0))
            budget -= kk + 1
        # prefill: running requests mid-prompt first, then admissions in arrival order
        candidates = [s for s in self.running if s.in_prefill]
        for seq in candidates + list(self.waiting):
            if budget < 1:
                break
            admitting = seq.status == Status.WAITING
            if admitting and len(self.running) >= self.cfg.max_batch_size:
                break
            if admitting and seq.num_computed == 0:
                seq.num_computed = self.blocks.cached_prefix(seq)  # rows another request already computed
                if seq.num_computed and self.proposer is not None:
                    self.proposer.share(seq)
                if not seq.num_preemptions:
                    seq.num_cached_tokens = seq.num_computed
            n = seq.prefill_target - seq.num_computed
            # without chunked prefill a prompt waits for a whole budget; a preempted request's recompute (prompt
            # and output) may exceed any budget, so it is always chunked
            if n > budget and not self.cfg.enable_chunked_prefill and not seq.num_preemptions:
                self._unadmit(seq, admitting)
                break
            n = min(n, budget)
            self.blocks.trim(seq)
            if not self.blocks.can_grow(seq, seq.num_computed + n):
                self._unadmit(seq, admitting)
                break
            self.blocks.grow(seq, seq.num_computed + n)
            if admitting:
                self.waiting.remove(seq)
                seq.status = Status.RUNNING
                self.running.append(seq)
            out.append(Scheduled(seq, n, 0, True))
            budget -= n
        return out

    def _unadmit(self, seq: Sequence, admitting: bool) -> None:
        """A request that stays waiting gives back the cached blocks its admission took."""
        if admitting and seq.block_table:
            self.blocks.release(seq)
            seq.num_computed = 0
            if not seq.num_preemptions:
                seq.num_cached_tokens = 0

    # -- after the step -----------------------------------------------------------------------------
    def postprocess(self, work: list[Scheduled], drafts: dict[int, list[int]], committed: dict[int, list[int]],
                    now: float, shadows: dict[int, list[int]] | None = None) -> list[StepOutput]:
        """committed: seq_id -> the tokens verification committed (absent for prefill chunks that did not
        complete a prompt); shadows: seq_id -> the drafts of a shadow probe (not verified)."""
        outs = []
        for w in work:
            seq, toks = w.seq, committed.get(w.seq.seq_id, [])
            if shadows and seq.seq_id in shadows:
                self.policy.shadow(seq, shadows[seq.seq_id])
            seq.num_computed += w.num_rows if w.is_prefill else len(toks)
            self.blocks.publish(seq, seq.num_computed)
            if not w.is_prefill and w.draft_len:
                dr = drafts.get(seq.seq_id, [])
                if dr:  # a speculative step: drafts were verified (a proposer may find none worth verifying)
                    seq.steps += 1
                    seq.drafted += len(dr)
                    seq.accepted += len(toks) - 1
                    if self.policy is not None:
                        self.policy.observe(seq, len(dr), len(toks) - 1)
                    if seq.trace is not None:
                        seq.trace.append((list(dr), len(toks) - 1))
            if not toks:
                continue
            new = self._commit(seq, toks, now)
            if seq.acceptance is not None and seq.acceptance.shadow is not None:
                self.policy.settle(seq)
            if seq.first_token_time is None:
                seq.first_token_time = now
            outs.append(StepOutput(seq, new, seq.is_finished))
        return outs

    def _commit(self, seq: Sequence, tokens: list[int], now: float) -> list[int]:
        """Append tokens up to the first stop condition; finish the request if one is met."""
        p, taken, reason = seq.params, [], None
        for tok in tokens:
            seq.token_ids.append(tok)
            taken.append(tok)
            if (not p.ignore_eos and tok in self.eos_ids) or tok in p.stop_token_ids:
                reason = "stop"
            elif seq.num_output >= p.max_tokens or len(seq.token_ids) >= self.cfg.max_seq_len:
                reason = "length"
            if reason:
                break
        if p.stop and self.detok.tok is not None:
            # new text can complete a stop string that began up to len(stop) - 1 characters before it
            start = max(0, len(seq.detok.text) - max(len(s) for s in p.stop) + 1)
            self.detok.update(seq.detok, seq.output_ids, final=reason is not None)
            pos = find_stop(seq.detok.text, p.stop, start)
            if pos is not None:
                seq.stop_text_pos = pos
                reason = "stop"
        else:
            self.detok.update(seq.detok, seq.output_ids)
        if reason:
            self._finish(seq, reason, now)
        return taken
