"""The speculative settings, one nested object (`EngineConfig.spec`), validated once."""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import DFlashError

METHODS = ("dflash", "ngram")


@dataclass
class SpecConfig:
    # "dflash" (a drafter), "ngram" (prompt lookup, no drafter) or None (autoregressive)
    method: str | None = "dflash"
    max_draft_len: int | None = None  # default: the drafter's block_size - 1; n-gram: NGRAM_DEFAULT_K
    # batch size -> draft length (TensorRT-LLM's field and rule, see draft_len_for)
    draft_len_schedule: dict[int, int] | None = None
    # "adaptive": per request, the K (<= the schedule's) with the most tokens per unit time under a step-cost
    # model (spec/policy.py); "fixed": always the schedule's K, as TensorRT-LLM does
    draft_len_policy: str = "adaptive"
    # turn speculation off for a request whose mean accepted drafts per step stays below this
    min_acceptance: float = 0.0
    acceptance_window: int = 8
    # a request's drafts end before the first one (past the first) whose drafter probability is below this, so
    # doubted drafts cost no verify rows (policy.confident_prefixes). Default: CPU_MIN_CONFIDENCE on a CPU with
    # the adaptive policy, where a verify row costs ~7% of a step; 0 (off) on GPUs, where rows are nearly free,
    # and with the fixed policy (exactly K drafts, as TensorRT-LLM). DFlash only, not under tensor parallelism.
    min_draft_confidence: float | None = None
    # a drafter pass over each request's bonus row and one MASK row per draft (the longest draft's) instead of the
    # whole block (DFlashProposer.block_rows). Default: on a CPU, where a pass costs its rows; off on GPUs, where
    # rows are nearly free and the whole block drafts a little better
    trim_draft_block: bool | None = None
    # the cost model's row / draft / draft_row (spec/policy.py); default: measured at engine start
    step_costs: dict | None = None
    # n-gram proposer: the longest and shortest suffix matched against the request's earlier tokens
    ngram_max: int = 4
    ngram_min: int = 1

    def __post_init__(self):
        if self.method not in METHODS + (None,):
            raise DFlashError(f"unknown speculative method {self.method!r}: use one of {', '.join(METHODS)} "
                              "(or none)")
        if self.draft_len_policy not in ("adaptive", "fixed"):
            raise DFlashError(f"unknown draft_len_policy {self.draft_len_policy!r}: use adaptive or fixed")
        if self.step_costs is not None:
            bad = sorted(set(self.step_costs) - {"row", "draft", "draft_row"})
            if bad or any(not isinstance(v, (int, float)) or v < 0 for v in self.step_costs.values()):
                raise DFlashError("step_costs takes non-negative numbers for row, draft and draft_row only")
        if self.min_draft_confidence is not None and not 0.0 <= self.min_draft_confidence < 1.0:
            raise DFlashError(f"min_draft_confidence must be in [0, 1), got {self.min_draft_confidence!r}")
        if self.max_draft_len is not None and (not isinstance(self.max_draft_len, int) or self.max_draft_len < 0):
            raise DFlashError(f"max_draft_len must be a non-negative integer, got {self.max_draft_len!r}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise DFlashError(f"ngram_min {self.ngram_min} and ngram_max {self.ngram_max} must satisfy "
                              "1 <= ngram_min <= ngram_max")
        if self.draft_len_schedule:
            self.draft_len_schedule = {int(k): int(v) for k, v in self.draft_len_schedule.items()}

    @classmethod
    def names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def draft_len_for(self, batch_size: int, default: int) -> int:
        """TensorRT-LLM's rule: the first threshold >= batch size applies; past the last, the last value."""
        if not self.draft_len_schedule:
            return default
        items = sorted(self.draft_len_schedule.items())
        value = items[-1][1]
        for threshold, v in items:
            if batch_size <= threshold:
                value = v
                break
        return max(0, min(default, value))
