"""dflash-bench: concurrency sweeps of DFlash vs autoregressive decoding on benchmark prompts (HumanEval, MT-Bench,
SPEED-Bench, any JSONL), with per-request TTFT/TPOT/acceptance, a versioned JSON report, a text table, a Pareto
plot, draft_len_schedule recommendations and trtllm-bench dataset export. Entry point: `dflash_trt.bench.cli`."""
from .datasets import BenchRequest, Dataset, load_dataset  # noqa: F401
from .metrics import RequestRecord, summarize  # noqa: F401
from .recommend import recommend  # noqa: F401
