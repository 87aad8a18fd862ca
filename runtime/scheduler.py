"""Iteration-level scheduling: which requests run this step, with how many rows, and their cache blocks.

Every iteration: decoding requests first (K+1 verify rows each, K from the draft-length schedule capped by
the request's own draft-length policy), then
prefill chunks of running and newly admitted requests within the `max_num_tokens` row budget. When the cache
runs out, the most recently admitted request is preempted (its blocks freed, recomputed later).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .draft_policy import DraftLengthPolicy
from .engine_config import EngineConfig
from .kv_cache import CacheBlocks
from .sequence import Sequence, Status


@dataclass
class Scheduled:
    seq: Sequence
    num_rows: int  # rows in this step's target pass
    draft_len: int  # K for a decoding request (0: plain autoregressive step)
    is_prefill: bool


class Scheduler:
    def __init__(self, cfg: EngineConfig, blocks: CacheBlocks, max_draft_len: int,
                 policy: DraftLengthPolicy | None = None):
        self.cfg, self.blocks, self.max_draft_len, self.policy = cfg, blocks, max_draft_len, policy
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        seq.status = Status.FINISHED
        self.blocks.release(seq)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def _preempt(self, victim: Sequence) -> None:
        self.running.remove(victim)
        self.blocks.release(victim)
        victim.num_computed = 0
        victim.status = Status.WAITING
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)

    def _draft_len(self, seq: Sequence, k: int, batch: int) -> int:
        if not seq.spec_enabled:
            return 0
        left = seq.params.max_tokens - seq.num_output  # tokens still allowed; a step commits up to K+1
        room = self.cfg.max_seq_len - len(seq.token_ids)
        k = max(0, min(k, left - 1, room))
        return self.policy.choose(seq.acceptance, k, batch) if self.policy is not None else k

    def schedule(self) -> list[Scheduled]:
        budget, out = self.cfg.max_num_tokens, []
        decoding = [s for s in self.running if not s.in_prefill]
        k = self.cfg.draft_len_for(len(decoding), self.max_draft_len) if self.max_draft_len else 0
        if self.policy is not None:
            self.policy.begin_iteration()
        for seq in list(self.running):
            if seq.in_prefill or seq not in self.running or budget < 1:
                continue
            kk = min(self._draft_len(seq, k, len(decoding)), budget - 1)
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
            out.append(Scheduled(seq, kk + 1, kk, False))
            budget -= kk + 1
        # prefill: running requests mid-prompt first, then admissions in arrival order
        candidates = [s for s in self.running if s.in_prefill]
        for seq in candidates + list(self.waiting):
            if budget < 1:
                break
            admitting = seq.status == Status.WAITING
            if admitting and len(self.running) >= self.cfg.max_batch_size:
                break
            n = seq.prefill_target - seq.num_computed
            # without chunked prefill a prompt waits for a whole budget; a preempted request's recompute (prompt
            # and output) may exceed any budget, so it is always chunked
            if n > budget and not self.cfg.enable_chunked_prefill and not seq.num_preemptions:
                break
            n = min(n, budget)
            self.blocks.trim(seq)
            if not self.blocks.can_grow(seq, seq.num_computed + n):
                break
            self.blocks.grow(seq, seq.num_computed + n)
            if admitting:
                self.waiting.remove(seq)
                seq.status = Status.RUNNING
                self.running.append(seq)
            out.append(Scheduled(seq, n, 0, True))
            budget -= n
        return out
