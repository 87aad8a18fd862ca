"""The contract between the engine and a speculative method (a proposer).

Each iteration the engine asks the proposer for drafts for the scheduled decoding requests (`propose`), runs
the target once over every prefill chunk and verify block, verifies (spec/verify.py), then tells the proposer
what was committed (`observe`) so it can keep whatever per-request state it needs for the next proposal. A
proposer never writes request state: the scheduler's postprocess does, from the verified tokens.

Capabilities are queried, never inferred from the method's name:
- `needs_target_features`: the target pass must capture the hidden states of `feature_layers` (DFlash);
- `pass_cost`: a proposal runs a model (its cost enters the policy's cost model); False: it is nearly free;
- `supports_confidence`: proposals carry the proposer's own probability per draft (the policy's confidence cut);
- `samples_drafts`: a sampled request's drafts are drawn from a distribution (`Proposal.dists`) and verified by
  rejection sampling, so a draft that differs from the target's token might still have been accepted;
- `needs_state_rollback`: the proposer keeps state past the accepted prefix that must be rolled back after
  verification (a recurrent drafter); `observe`'s committed row counts say where
  each request's state must end. A target with recurrent layers (hybrid attention) asks the same of the
  target's state pool, not of the proposer.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Proposal:
    drafts: dict[int, list[int]] = field(default_factory=dict)  # seq_id -> draft tokens (<= its draft_len)
    confidence: dict[int, list[float]] | None = None  # seq_id -> the proposer's probability of each draft
    # seq_id -> the distribution its drafts were sampled from (spec/verify.DraftDist), for a proposer that
    # samples its drafts at T > 0 (DFlash2): verification then runs rejection sampling against it
    dists: dict | None = None


@dataclass
class TargetPass:
    """What one target pass produced, for the proposer's observation: the packed rows of each request."""
    rows: dict[int, tuple[int, int]]  # seq_id -> (first packed row, rows)
    features: object | None  # [rows, n * hidden] captured target features (needs_target_features only)
    positions: object  # [rows] absolute positions
    slot_mapping: object  # [rows] flat cache slots


class Proposer:
    name = "none"
    needs_target_features = False
    pass_cost = False
    supports_confidence = False
    samples_drafts = False
    needs_state_rollback = False
    feature_layers: list[int] = []
    caches: list = []  # the proposer's own KV caches (the DFlash drafter's context), allocated by the engine

    def max_draft_len(self, requested: int | None) -> int:
        """The most tokens one request may draft per step (0: this proposer never drafts)."""
        return 0

    def propose(self, work: list, want_confidence: bool = False) -> Proposal:
        """Drafts for every scheduled request with draft_len > 0 (at most draft_len tokens each; fewer, or none,
        when the proposer has nothing worth verifying)."""
        return Proposal()

    def observe(self, work: list, target_pass: TargetPass, committed_rows: dict[int, int]) -> None:
        """After verification: how many of each request's packed rows are committed (a prefill chunk: all of
        them; a verify block: the bonus row and the accepted drafts' rows). Rows past them were rejected."""

    def release(self, seq, cached_blocks=frozenset()) -> None:
        """The request finished, was aborted or preempted: drop what the proposer keeps for it. cached_blocks:
        those of its blocks the prefix cache keeps readable for later requests; the proposer keeps the rows it
        still owes them until a hit reads them (share) or the space goes (evict)."""

    def evict(self, block: int) -> None:
        """A cached block's space goes to another use: whatever the proposer kept for it is void."""

    def share(self, seq) -> None:
        """The request now reads its first num_computed rows' cache blocks through the prefix cache (a hit): whatever
        rows of them the proposer's own caches still owe must be written before it drafts from them. Blocks are
        published once the target's rows in them are final; a proposer with caches may write its rows later
        (DFlash writes them lazily)."""
