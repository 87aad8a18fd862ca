"""Engine settings, validated once."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .errors import DFlashError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


@dataclass
class EngineConfig:
    speculative: bool = True
    max_draft_len: int | None = None  # default: block_size - 1
    # batch size -> draft length (TensorRT-LLM's field and rule, see draft_len_for)
    draft_len_schedule: dict[int, int] | None = None
    max_batch_size: int = 32
    max_num_tokens: int = 2048  # rows per iteration: prefill chunks + (K+1) per decoding request
    max_seq_len: int = 4096
    page_size: int = 16  # positions per cache block
    kv_cache_bytes: int | None = None  # default: enough for max_batch_size sequences of max_seq_len, capped
    enable_chunked_prefill: bool = True
    # sliding-window layers in a pool of their own whose blocks are freed as they leave the window (kv_cache.py)
    window_cache: bool = True
    # turn speculation off for a request whose mean accepted drafts per step stays below this
    min_acceptance: float = 0.0
    acceptance_window: int = 8
    # "adaptive": per request, the K (<= the schedule's) with the most tokens per unit time under a step-cost
    # model (runtime/draft_policy.py); "fixed": always the schedule's K, as TensorRT-LLM does
    draft_len_policy: str = "adaptive"
    # a request's drafts end before the first one (past the first) whose drafter probability is below this, so
    # doubted drafts cost no verify rows (draft_policy.confident_prefixes). Default: CPU_MIN_CONFIDENCE on a CPU
    # with the adaptive policy, where a verify row costs ~7% of a step; 0 (off) on GPUs, where rows are nearly
    # free, and with the fixed policy (exactly K drafts, as TensorRT-LLM). Not under tensor parallelism.
    min_draft_confidence: float | None = None
    # the cost model's row / draft / draft_row (runtime/draft_policy.py); default: measured at engine start
    step_costs: dict | None = None
    dtype: str = "float32"
    device: str | None = None
    trace: bool = False
    use_plugins: bool = True  # compiled DFlash ops (plugins/) when they build here; False: pure PyTorch
    # batch-invariant CPU kernels (bitwise-identical rows in any batch); False: MKL/PyTorch numerics
    invariant_kernels: bool = True
    seed: int | None = None
    # FP8 targets on CPU: keep weights in FP8 (bitwise the dequantised results, 1/4 of the bytes); False: fp32
    fp8_weights: bool = True
    # FP8 targets: native FP8 GEMMs (weights and activations in e4m3, as TensorRT-LLM runs them); default: on
    # GPUs with FP8 tensor cores (compute capability >= 8.9), off elsewhere; True forces them (CPU too)
    fp8_compute: bool | None = None
    # draft among the drafter's draft_vocab.json tokens when it has one (runtime/draft_vocab.py)
    draft_vocab: bool = True
    # tensor parallelism over the ranks mpirun started (default: engine.json's tp_size, else the world size)
    tp_size: int | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise DFlashError(f"unknown dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        if self.max_batch_size < 1 or self.max_num_tokens < 1 or self.max_seq_len < 2:
            raise DFlashError("max_batch_size, max_num_tokens and max_seq_len must be positive")
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.tp_size is not None and (not isinstance(self.tp_size, int) or self.tp_size < 1):
            raise DFlashError(f"tp_size must be a positive integer, got {self.tp_size!r}")
        if self.draft_len_policy not in ("adaptive", "fixed"):
            raise DFlashError(f"unknown draft_len_policy {self.draft_len_policy!r}: use adaptive or fixed")
        if self.step_costs is not None:
            bad = sorted(set(self.step_costs) - {"row", "draft", "draft_row"})
            if bad or any(not isinstance(v, (int, float)) or v < 0 for v in self.step_costs.values()):
                raise DFlashError("step_costs takes non-negative numbers for row, draft and draft_row only")
        if self.min_draft_confidence is not None and not 0.0 <= self.min_draft_confidence < 1.0:
            raise DFlashError(f"min_draft_confidence must be in [0, 1), got {self.min_draft_confidence!r}")
        if self.draft_len_schedule:
            self.draft_len_schedule = {int(k): int(v) for k, v in self.draft_len_schedule.items()}

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

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
