"""All per-request state in one object: tokens, cache bookkeeping, status, acceptance statistics."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

from .detokenizer import DetokState
from .sampling import SamplingParams

_ids = itertools.count()


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


# eq=False: a request is itself, not its fields: the scheduler tests list membership and removes requests every
# step, and comparing every field of every pair costs ~1,000 tuple comparisons a step at 32 requests
@dataclass(eq=False)
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    request_id: str = ""
    seq_id: int = field(default_factory=lambda: next(_ids))
    token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # target KV and drafter context hold positions 0..num_computed-1
    block_table: list[int] = field(default_factory=list)
    window_table: list[int] = field(default_factory=list)  # sliding-window layers' pool (kv_cache.py), if any
    block_digests: list[bytes] = field(default_factory=list, repr=False)  # published prefix (kv_cache.py)
    num_cached_tokens: int = 0  # prompt positions its first admission found in the prefix cache
    state_slot: int = -1  # a hybrid target's linear-attention state pool slot while running (kv_cache.py)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    stop_text_pos: int | None = None  # where a stop string begins in the output text
    detok: DetokState = field(default_factory=DetokState, repr=False)  # the output's text so far (scheduler)
    spec_enabled: bool = True
    # statistics
    steps: int = 0  # speculative steps (drafts verified)
    drafted: int = 0
    accepted: int = 0
    accept_hist: list[int] = field(default_factory=list)  # accepted draft tokens per step
    acceptance: object | None = None  # spec.policy.AcceptanceEstimate of a speculating request
    trace: list[tuple[list[int], int]] | None = None  # (draft tokens, accepted length) per step
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0

    def __post_init__(self):
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)
        self.request_id = self.request_id or str(self.seq_id)

    @property
    def text(self) -> str:
        """The output's text so far, cut where a stop string begins."""
        t = self.detok.text
        return t if self.stop_text_pos is None else t[:self.stop_text_pos]

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - len(self.prompt_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids):]

    @property
    def prefill_target(self) -> int:
        """Positions the target must have cached before decoding: all but the pending bonus token."""
        return len(self.token_ids) - (1 if self.num_output else 0)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prefill_target

    @property
    def is_finished(self) -> bool:
        return self.status == Status.FINISHED

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first (None until finished with two or more tokens)."""
        if self.finish_time is None or self.first_token_time is None or self.num_output < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.num_output - 1)

    @property
    def tau(self) -> float:
        """Mean tokens committed per speculative step (accepted drafts + bonus)."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0
