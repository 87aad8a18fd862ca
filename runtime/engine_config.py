"""Engine settings, validated once."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from .errors import DFlashError
from .int8_weights import check_weights
from .spec.config import SpecConfig

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


@dataclass
class EngineConfig:
    spec: SpecConfig = field(default_factory=SpecConfig)  # the speculative method and its draft-length policy
    max_batch_size: int = 32
    max_num_tokens: int = 2048  # rows per iteration: prefill chunks + (K+1) per decoding request
    max_seq_len: int = 4096
    page_size: int = 16  # positions per cache block
    kv_cache_bytes: int | None = None  # default: enough for max_batch_size sequences of max_seq_len, capped
    enable_chunked_prefill: bool = True
    # sliding-window layers in a pool of their own whose blocks are freed as they leave the window (kv_cache.py)
    window_cache: bool = True
    dtype: str = "float32"
    device: str | None = None
    trace: bool = False
    use_plugins: bool = True  # compiled DFlash ops (plugins/) when they build here; False: pure PyTorch
    # batch-invariant CPU kernels (bitwise-identical rows in any batch); False: MKL/PyTorch numerics
    invariant_kernels: bool = True
    # requests without a seed of their own draw one from this engine's generator: seeded, the same requests in
    # the same order sample the same tokens run after run; None: fresh randomness
    seed: int | None = None
    # FP8 targets on CPU: keep weights in FP8 (bitwise the dequantised results, 1/4 of the bytes); False: fp32
    fp8_weights: bool = True
    # FP8 targets: native FP8 GEMMs (weights and activations in e4m3, as TensorRT-LLM runs them); default: on
    # GPUs with FP8 tensor cores (compute capability >= 8.9), off elsewhere; True forces them (CPU too)
    fp8_compute: bool | None = None
    # the target's weights on CPU (runtime/int8_weights.py): "auto" (as the checkpoint loads), "bf16", "int8",
    # "w8a8" (int8 weights and per-row int8 activations, integer dot products) or "fp8" (per-channel,
    # quantised at load; fewer bytes per decode step, the logits move by the rounding)
    weights: str = "auto"
    # the drafter's own linears and its draft-vocabulary head: None follows `weights`, except that a target kept
    # as loaded ("auto") drafts in "w8a8" on CPUs with integer dot products (int8_weights.draft_weights_for);
    # "auto" keeps the checkpoint's (drafts move with the rounding, the output never does)
    draft_weights: str | None = None
    # draft among the drafter's draft_vocab.json tokens when it has one (runtime/draft_vocab.py)
    draft_vocab: bool = True
    # share the cache blocks of common prompt prefixes between requests (kv_cache.BlockManager); None: on where
    # the target allows it (not with a sliding-window pool or linear-attention state, which no block holds)
    enable_prefix_caching: bool | None = None
    # linear-attention hybrids: what a verify pass keeps to roll each request's state back to its accepted prefix
    # (models/gated_deltanet.py LinearBatch): "states" (the state after every row), "inputs" (each row's recurrence
    # inputs, replayed at commit), or "auto": states when their scratch is small beside the KV cache
    linear_rollback: str = "auto"
    # tensor parallelism over the ranks mpirun started (default: engine.json's tp_size, else the world size)
    tp_size: int | None = None

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise DFlashError(f"unknown dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        if self.max_batch_size < 1 or self.max_num_tokens < 1 or self.max_seq_len < 2:
            raise DFlashError("max_batch_size, max_num_tokens and max_seq_len must be positive")
        if self.device is None:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        check_weights(self.weights)
        if self.draft_weights is not None:
            check_weights(self.draft_weights, "draft_weights (--draft-weights)")
        for name in ("weights", "draft_weights"):
            mode = getattr(self, name)
            if mode not in (None, "auto") and not (str(self.device).startswith("cpu") and self.invariant_kernels):
                raise DFlashError(f"{name}={mode!r} packs the batch-invariant CPU kernels' weights: it needs "
                                  f"device cpu with invariant_kernels on (or {name}='auto')")
        if self.linear_rollback not in ("auto", "states", "inputs"):
            raise DFlashError(f"linear_rollback must be auto, states or inputs, got {self.linear_rollback!r}")
        if self.tp_size is not None and (not isinstance(self.tp_size, int) or self.tp_size < 1):
            raise DFlashError(f"tp_size must be a positive integer, got {self.tp_size!r}")

    @classmethod
    def from_kwargs(cls, speculative: bool | str | None = True, **kwargs) -> "EngineConfig":
        """The flat keyword form `LLM(...)` takes: the speculative settings (SpecConfig's names) go into `spec`.
        speculative: True (DFlash), a method name ("dflash", "ngram"), or False / None (autoregressive)."""
        names = {f.name for f in fields(cls)}
        bad = sorted(set(kwargs) - names - SpecConfig.names() - {"spec"})
        if bad:
            raise DFlashError(f"unknown engine option {bad[0]!r}: see EngineConfig and SpecConfig for the options")
        method = "dflash" if speculative is True else (speculative or None)
        flat = {k: kwargs.pop(k) for k in list(kwargs) if k in SpecConfig.names()}
        given = kwargs.pop("spec", None)
        if given is not None and flat:
            raise DFlashError(f"pass {sorted(flat)[0]!r} inside spec=SpecConfig(...) or as a keyword, not both")
        return cls(spec=given or SpecConfig(**{"method": method, **flat}), **kwargs)

    @property
    def speculative(self) -> bool:
        return self.spec.method is not None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
