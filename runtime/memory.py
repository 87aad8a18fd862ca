"""Memory at start: the device asked for, the KV cache's budget (given in bytes, as a fraction of the free memory,
or sized from the workload and capped by that memory) and what the pools it became hold, target and drafter."""
from __future__ import annotations

import ctypes
import os
import sys

import torch

from .errors import DFlashError
from .kv_cache import bytes_per_block

GIB = 1 << 30
DEFAULT_SHARE = 0.5  # of the memory free at start, less the weights: the most the default KV cache takes


def check_device(device: str) -> None:
    """One line for a device this machine does not have, before anything is loaded."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise DFlashError(f"--device {device} is not a device this runtime runs on: use cpu or cuda (cuda:N)")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DFlashError(f"--device {device}: no CUDA GPU is usable here (torch {torch.__version__}, "
                              f"cuda {torch.version.cuda or 'not built'}): use --device cpu, or run where "
                              "nvidia-smi lists a GPU with a CUDA build of torch")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DFlashError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here "
                              f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")


def free_bytes(device: str) -> int:
    """Memory free now: the GPU's (cudaMemGetInfo), or the host's MemAvailable on CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.mem_get_info(dev.index or 0)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def weight_file_bytes(paths) -> int:
    from .checkpoint import safetensors_files

    return sum(os.path.getsize(f) for what, d in (("target", paths.target), ("drafter", paths.draft))
               if d is not None for f in safetensors_files(d, what))


def workload_bytes(paths, cfg) -> int:
    """The KV bytes the engine's default plans (kv_cache.plan_kv_pools: max_batch_size sequences of max_seq_len,
    at most 2 GiB), estimated from the configs with every layer full-attention (an upper bound)."""
    from .config import DraftConfig, TargetConfig

    tcfg = TargetConfig.from_dir(paths.target)
    layers = list(tcfg.cache_layers(cfg.tp_size or 1))
    if paths.draft is not None and cfg.spec.method == "dflash":
        d = DraftConfig.from_dir(paths.draft, num_target_layers=tcfg.num_hidden_layers)
        layers += [(max(1, d.num_key_value_heads // (cfg.tp_size or 1)), d.head_dim)] * d.num_hidden_layers
    page = cfg.page_size
    per_seq = -(-cfg.max_seq_len // page) + 1
    return min(2 * GIB, bytes_per_block(page, layers, cfg.torch_dtype) * cfg.max_batch_size * per_seq)


def kv_budget(paths, cfg, fraction: float | None) -> int | None:
    """kv_cache_bytes for the engine: `fraction` of (free memory - weights), or None (the engine's workload
    default) unless that default would take more than DEFAULT_SHARE of it, which is then the budget."""
    from .loader import mib, stage

    if fraction is not None and not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise DFlashError(f"kv_cache_fraction (--kv-cache-fraction) must be in (0, 1], got {fraction!r}")
    free, weights = free_bytes(cfg.device), weight_file_bytes(paths)
    room = free - weights
    if fraction is not None:
        budget = int(fraction * room)
        if budget <= 0:
            raise DFlashError(f"--kv-cache-fraction {fraction}: {mib(free)} free less {mib(weights)} of weights "
                              "leaves nothing for the KV cache: pass --kv-cache-bytes, or free memory")
        stage(f"KV cache budget {mib(budget)}: {fraction:g} of {mib(free)} free less {mib(weights)} of weights",
              defer=True)
        return budget
    need = workload_bytes(paths, cfg)
    cap = int(DEFAULT_SHARE * room)
    if need <= cap:
        return None
    if cap <= 0:
        raise DFlashError(f"{mib(free)} free holds the {mib(weights)} of weights but no KV cache: free memory, or "
                          "pass --kv-cache-bytes")
    stage(f"KV cache budget {mib(cap)} (the workload, max_batch_size {cfg.max_batch_size} x max_seq_len "
          f"{cfg.max_seq_len}, would take {mib(need)}: capped at {DEFAULT_SHARE:g} of {mib(free)} free less the "
          "weights; --kv-cache-bytes or --kv-cache-fraction decide)", defer=True)
    return cap


def kv_pool_bytes(engine) -> dict[str, dict[str, int]]:
    """Bytes of the KV cache pools, and per cached token, of the target and of the drafter's context (whose
    pages follow the target's block table, so both pools hold the same number of blocks; the drafter's caches
    also hold the fused pass's scratch rows)."""
    plan, dtype = engine.kv_plan, engine.cfg.torch_dtype
    main = [t for i, t in enumerate(plan.target_layers) if i not in plan.windowed]
    win = [plan.target_layers[i] for i in plan.windowed]
    t_pool = plan.num_blocks * bytes_per_block(plan.page, main, dtype) + plan.window_bytes + plan.state_bytes
    d_pool = (plan.num_blocks + plan.draft_scratch_blocks) * bytes_per_block(plan.page, plan.draft_layers, dtype)
    return {"target": {"bytes": t_pool, "bytes_per_token": bytes_per_block(1, main + win, dtype)},
            "drafter": {"bytes": d_pool, "bytes_per_token": bytes_per_block(1, plan.draft_layers, dtype)}}


# glibc gives a freed buffer above its mmap threshold, and free heap top above its trim threshold, back to the
# kernel; the next step's buffer of that size (logits, verify rows, drafter blocks) then arrives as fresh pages,
# each zeroed in a page fault, several microseconds a page in a VM: 0.35 ms of a bf16 verify step's 2 ms head
# on the embedded pair. Kept in the heap (as jemalloc and tcmalloc keep them), they cost at most the trim
# threshold of resident memory.
MMAP_THRESHOLD = 32 << 20  # glibc's largest
TRIM_THRESHOLD = 256 << 20


def keep_freed_heap() -> bool:
    """Whether glibc's malloc now keeps freed buffers for reuse (process-wide; where the user set
    MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_, theirs stand)."""
    if not sys.platform.startswith("linux") or any(
            k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(mallopt(-3, MMAP_THRESHOLD)) and bool(mallopt(-1, TRIM_THRESHOLD))  # M_MMAP_, M_TRIM_THRESHOLD
