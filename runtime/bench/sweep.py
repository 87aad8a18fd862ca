"""The concurrency sweep: for each mode (ar, dflash) x draft length, one engine, reused across concurrencies; for
each concurrency a closed loop keeps that many requests in flight (a new one joins when one finishes).

All model/engine construction goes through `build_llm`. Under `mpirun -n N dflash-bench ...` the engine is
tensor parallel (SPMD, runtime/tensor_parallel.py): rank 0 drives the loop and is the only one that prints and
writes; the other ranks mirror each engine inside `LLM(...)` until rank 0 shuts it down, then go on to the next
variant (every rank walks the same variant list, so the engines pair up).
"""
from __future__ import annotations

import gc
import time
from collections import deque
from dataclasses import dataclass, field

from ..errors import DFlashError
from ..sampling import SamplingParams
from .metrics import RequestRecord, record_from_sequence, summarize


def world_size() -> int:
    """Ranks the launcher started (mpirun: OMPI_COMM_WORLD_SIZE / PMI_SIZE; torchrun: WORLD_SIZE), else 1."""
    from ..distributed import env_world

    return env_world()[1]


def is_main_process() -> bool:
    """Rank 0 (mpirun: OMPI_COMM_WORLD_RANK / PMI_RANK), or not launched by mpirun/torchrun at all."""
    from ..distributed import is_driver_process

    return is_driver_process()


@dataclass
class ModelSpec:
    """What to load: an engine directory, or a target (+ drafter); `embedded` marks the default pair."""
    model: str | None = None
    target: str | None = None
    draft: str | None = None
    embedded: bool = False
    engine_kwargs: dict = field(default_factory=dict)  # EngineConfig options shared by every engine


@dataclass
class Variant:
    mode: str  # "ar" | "dflash" | "ngram"
    draft_len: int | None  # None: the drafter's default (block_size - 1); ignored for ar

    @property
    def policy(self) -> str:
        """A swept draft length runs fixed (TensorRT-LLM's behaviour, what --recommend needs); the default
        runs the runtime's adaptive policy with block_size - 1 as its cap."""
        return "fixed" if self.draft_len is not None else "adaptive"


def build_llm(spec: ModelSpec, variant: Variant, max_batch_size: int, max_seq_len: int):
    """The one place that constructs models and engines. Returns None on a tensor-parallel follower rank once
    rank 0 has shut the engine down (LLM(...) ends such ranks with SystemExit(0))."""
    from ..llm import LLM

    kw = dict(spec.engine_kwargs)
    kw.update(max_batch_size=max_batch_size, max_seq_len=max_seq_len, trace=True)
    spec_on = variant.mode != "ar"
    if spec_on and variant.draft_len is not None:
        kw["max_draft_len"] = variant.draft_len
    if spec_on:
        kw["draft_len_policy"] = variant.policy
    try:
        return LLM(spec.model, target=spec.target, draft=spec.draft if variant.mode == "dflash" else None,
                   speculative=variant.mode if spec_on else False, **kw)
    except SystemExit:
        if is_main_process():
            raise
        return None


class Encoder:
    """LLM.encode (chat template included) on the target's tokenizer alone: prompt lengths are known before any
    engine is sized or loaded."""

    def __init__(self, spec: ModelSpec):
        from ..llm import LLM
        from ..loader import resolve_paths

        self.paths = resolve_paths(spec.model, spec.target, spec.draft)
        self.tokenizer = LLM._load_tokenizer(self.paths.target)

    def encode(self, prompt, chat: bool = False) -> list[int]:
        from ..llm import encode_prompt

        return encode_prompt(self.tokenizer, prompt, chat, self.paths.target)


@dataclass
class Prepared:
    task_id: str
    input_ids: list[int]
    max_tokens: int


def encode_requests(llm, requests, default_max_tokens: int, max_tokens: int | None, chat: bool) -> list[Prepared]:
    """Token ids with the chat template applied (LLM.encode(..., chat=True)); ready ids pass through."""
    out = []
    for r in requests:
        ids = list(r.input_ids) if r.input_ids is not None else llm.encode(r.prompt, chat=chat)
        n = max_tokens or r.output_tokens or default_max_tokens
        out.append(Prepared(r.task_id, ids, int(n)))
    return out


def sampling_for(i: int, p: Prepared, temperature: float, seed: int, ignore_eos: bool) -> SamplingParams:
    # a per-request seed: AR and DFlash (and every concurrency) sample the same tokens for the same request
    return SamplingParams(max_tokens=p.max_tokens, temperature=temperature, seed=seed + i, ignore_eos=ignore_eos)


def run_closed_loop(llm, reqs: list[Prepared], concurrency: int, temperature: float = 0.0, seed: int = 0,
                    ignore_eos: bool = True, on_done=None) -> tuple[list[RequestRecord], dict]:
    """Keep `concurrency` requests in flight over `reqs`; returns per-request records and engine counters."""
    eng = llm.engine
    eng.metrics.iterations.clear()
    todo, live, records = deque(range(len(reqs))), {}, []
    steps = 0
    while todo or live:
        while todo and len(live) < concurrency:
            i = todo.popleft()
            seq = eng.add_request(reqs[i].input_ids, sampling_for(i, reqs[i], temperature, seed, ignore_eos))
            live[seq.request_id] = (i, seq)
        eng.step()
        steps += 1
        for rid, (i, seq) in list(live.items()):
            if seq.is_finished:
                records.append(record_from_sequence(i, reqs[i].task_id, seq))
                eng.release(seq)
                del live[rid]
                if on_done is not None:
                    on_done()
    its = eng.metrics.iterations
    counters = {"iterations": steps,
                "mean_batch_size": sum(it.batch_size for it in its) / len(its) if its else None,
                "mean_iteration_s": sum(it.seconds for it in its) / len(its) if its else None}
    records.sort(key=lambda r: r.index)
    return records, counters


def warm_up(llm, reqs: list[Prepared], temperature: float) -> None:
    """One short request: compiled ops, allocator and caches are ready before anything is timed."""
    p = Prepared("warmup", reqs[0].input_ids, min(8, reqs[0].max_tokens))
    run_closed_loop(llm, [p], 1, temperature)


def required_seq_len(reqs: list[Prepared], page: int = 16) -> int:
    """Room for the longest prompt + its output (the scheduler shortens drafts near the end), page-rounded."""
    need = max(len(r.input_ids) + r.max_tokens for r in reqs) + 32
    return -(-need // page) * page


@dataclass
class SweepConfig:
    concurrency: list[int]
    variants: list[Variant]
    temperature: float = 0.0
    seed: int = 0
    ignore_eos: bool = True
    max_seq_len: int | None = None
    num_devices: int = 1


def run_sweep(spec: ModelSpec, cfg: SweepConfig, reqs: list[Prepared], on_point=None, progress=None) -> list[dict]:
    """Every variant x concurrency, one engine per variant. on_point(point) is called after each point
    (incremental reports); progress: a tqdm-like bar (set_description, update) or None."""
    points = []
    max_c = max(cfg.concurrency)
    seq_len = cfg.max_seq_len or required_seq_len(reqs)
    for variant in cfg.variants:
        llm = build_llm(spec, variant, max_c, seq_len)
        if llm is None:  # a tensor-parallel follower: it ran this variant inside LLM(...)
            continue
        k = llm.engine.max_draft_len if variant.mode != "ar" else 0
        if variant.mode == "dflash" and k == 0:
            raise DFlashError("the DFlash engine has no drafter")
        warm_up(llm, reqs, cfg.temperature)
        for c in cfg.concurrency:
            if progress is not None:
                progress.set_description(f"{variant.mode} K={k} c={c}")
            t = time.perf_counter()
            records, counters = run_closed_loop(llm, reqs, c, cfg.temperature, cfg.seed, cfg.ignore_eos,
                                                on_done=progress.update if progress is not None else None)
            summary = summarize(records, cfg.num_devices)
            t0 = min(r.arrival for r in records)
            name = {"dflash": "DFlash", "ngram": "n-gram"}.get(variant.mode, "AR")
            label = "AR" if k == 0 else (f"{name} K={k}" if variant.policy == "fixed" else f"{name} K<={k} adaptive")
            point = {"mode": variant.mode, "draft_len": k, "label": label,
                     "draft_len_policy": variant.policy if variant.mode != "ar" else None,
                     "concurrency": c, **summary, **counters, "elapsed_s": time.perf_counter() - t,
                     "requests": [r.to_json(t0) for r in records]}
            points.append(point)
            if on_point is not None:
                on_point(point)
        llm.engine.shutdown()  # tensor parallel: releases the follower ranks (a no-op alone)
        del llm
        gc.collect()
    return points
