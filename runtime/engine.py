"""The engine loop: requests in, one scheduled speculative (or autoregressive) iteration per step, deltas out.

A step: the scheduler picks the batch and each request's draft length (spec/policy.py), the proposer drafts
(spec/), the target runs once over every prefill chunk and verify block (model_runner.py), verification keeps
each block's longest correct prefix (spec/verify.py), the proposer observes what was committed, and the
scheduler's postprocess commits the tokens and finishes requests.
"""
from __future__ import annotations

import gc
import random
import time
from dataclasses import dataclass, field, replace

from . import tensor_parallel
from .detokenizer import Detokenizer
from .engine_config import EngineConfig
from .errors import DFlashError
from .kv_cache import allocate_pools, plan_kv_pools
from .huge_pages import move_to_huge_pages
from .loader import ModelPaths, load_configs, load_models, prepare_for_device
from .memory import keep_freed_heap
from .model_runner import ModelRunner, load_plugin_ops
from .models.gated_deltanet import choose_rollback
from .sampling import SamplingParams
from .scheduler import Scheduler, StepOutput
from .sequence import Sequence
from .spec import make_proposer
from .spec.calibrate import N as CALIBRATION_REQUESTS, measure_step_costs
from .spec.interface import Proposal
from .spec.policy import SpecPolicy, min_confidence_for
from .spec.verify import Verifier

__all__ = ["LLMEngine", "StepOutput", "IterationStats", "EngineMetrics"]


@dataclass
class IterationStats:
    batch_size: int
    num_rows: int  # target rows: prefill chunks + verify rows
    num_tokens: int  # tokens committed to outputs
    drafted: int
    accepted: int
    seconds: float


@dataclass
class EngineMetrics:
    iterations: list[IterationStats] = field(default_factory=list)
    keep: int = 10000

    def record(self, it: IterationStats) -> None:
        self.iterations.append(it)
        if len(self.iterations) > self.keep:
            del self.iterations[: len(self.iterations) - self.keep]


class LLMEngine:
    def __init__(self, paths: ModelPaths, cfg: EngineConfig, tokenizer=None):
        self.cfg, spec = cfg, cfg.spec
        self._seeds = random.Random(cfg.seed) if cfg.seed is not None else random.SystemRandom()
        tcfg, dcfg = load_configs(paths, spec.max_draft_len)
        if spec.method != "dflash":
            dcfg = None
        self.target_config, self.draft_config = tcfg, dcfg
        # tensor parallelism (runtime/tensor_parallel.py): None alone, else the group of the mpirun ranks
        self.dist = tensor_parallel.setup(cfg, paths, tcfg, dcfg)
        self.tp_size = self.dist.world_size if self.dist is not None else 1
        self.target, self.drafter = load_models(paths, tcfg, dcfg, cfg.torch_dtype, cfg.device,
                                                max_positions=cfg.max_seq_len + 32, dist=self.dist)
        cpu = str(cfg.device).startswith("cpu")
        self.fp8_linears, self.fp8_native = prepare_for_device(self.target, self.drafter, paths, cfg,
                                                               sharded=self.dist is not None)
        if cpu:
            move_to_huge_pages(self.target, self.drafter)  # every step streams them: fewer TLB misses
        self.ops = load_plugin_ops(cfg.use_plugins)
        d_layers = [(dcfg.num_key_value_heads // self.tp_size, dcfg.head_dim)] * dcfg.num_hidden_layers if dcfg else []
        state_bytes = self.target.state_bytes_per_request()
        self.kv_plan = plan_kv_pools(
            tcfg.cache_layers(self.tp_size), d_layers, [tcfg.window(i) for i in tcfg.cached_layers],
            page=cfg.page_size, max_seq_len=cfg.max_seq_len, max_batch_size=cfg.max_batch_size,
            max_num_tokens=cfg.max_num_tokens, dtype=cfg.torch_dtype, budget=cfg.kv_cache_bytes,
            window_cache=cfg.window_cache, state_bytes_per_request=state_bytes,
            # a CPU drafter pass runs fused over cache slots: room for the blocks of every request it drafts for
            # (the batch, or the step-cost calibration's scratch requests)
            draft_scratch_rows=max(cfg.max_batch_size, CALIBRATION_REQUESTS) * dcfg.block_size if dcfg and cpu else 0)
        self.prefix_caching = self._prefix_caching(state_bytes)
        self.blocks, t_caches, d_caches = allocate_pools(self.kv_plan, cfg.torch_dtype, cfg.device,
                                                         self.prefix_caching)
        self.proposer = make_proposer(spec, self.target, self.drafter, d_caches, cfg.page_size, cfg.device, self.ops,
                                      scratch=self.kv_plan.draft_scratch)
        self.max_draft_len = self.proposer.max_draft_len(spec.max_draft_len)
        # a hybrid target's linear-attention states: one slot per running request (kv_cache.CacheBlocks hands
        # them out), rolled back after each verify block (ModelRunner.commit)
        states = self.target.new_state_pool(self.kv_plan.state_slots, cfg.device) if state_bytes else None
        self.linear_rollback = choose_rollback(cfg.linear_rollback, state_bytes, cfg.max_batch_size,
                                               self.max_draft_len + 1, self.kv_plan.total_bytes)
        # the chunked delta rule's bits depend on where chunks start, which scheduling decides: the CPU's
        # batch-invariant runs (DFlash == AR bit for bit) keep every prefill on the recurrent kernel
        chunked_min = None if cpu else 64
        self.runner = ModelRunner(self.target, t_caches, cfg.page_size, cfg.device,
                                  window_pool=bool(self.kv_plan.windowed),
                                  capture=self.proposer.needs_target_features, states=states,
                                  rollback=self.linear_rollback, chunked_min=chunked_min)
        self.verifier = Verifier(self.ops, getattr(self.target, "tp", None))
        confidence = self.proposer.supports_confidence and self.dist is None  # a vocab-split head has no softmax
        measured = self._measured_costs(min_confidence_for(spec, cfg.device, confidence) > 0)
        self.policy = SpecPolicy.for_device(spec, self.max_draft_len, cfg.device, measured,
                                            self.proposer.pass_cost, confidence, self.proposer.samples_drafts)
        self.scheduler = Scheduler(cfg, self.blocks, self.policy, self.proposer, tcfg.eos_token_ids,
                                   Detokenizer(tokenizer))
        self.metrics = EngineMetrics()
        self.sequences: dict[str, Sequence] = {}
        self.weight_bytes = tensor_parallel.weight_bytes(self.target, self.drafter)
        # what is loaded now lives as long as the engine: out of the cyclic collector's sight, a full collection
        # walks only what requests allocate, not the ~330K objects of torch, transformers and the models (one
        # walk of those cost ~150 ms, ~2.5 ms a step at 32 requests), as vLLM does after start-up
        gc.collect()
        gc.freeze()
        if cpu:
            keep_freed_heap()

    def _prefix_caching(self, state_bytes: int) -> bool:
        why = ("its linear-attention layers keep a per-request state that no cache block holds" if state_bytes
               else "its sliding-window layers' pool frees blocks as they leave the window"
               if self.kv_plan.windowed else None)
        if self.cfg.enable_prefix_caching and why:
            raise DFlashError(f"prefix caching is not supported for this {self.target_config.model_type} target: "
                              f"{why}; turn it off (--no-prefix-caching)")
        return why is None if self.cfg.enable_prefix_caching is None else bool(self.cfg.enable_prefix_caching)

    def _measured_costs(self, confidence: bool) -> dict | None:
        """The adaptive policy's cost model, measured here and now (spec/calibrate.py) unless given."""
        spec = self.cfg.spec
        if spec.step_costs is not None or spec.draft_len_policy != "adaptive" or not self.max_draft_len:
            return None
        measured = measure_step_costs(self.runner, self.proposer, self.blocks, token_id=0,
                                      k=min(3, self.max_draft_len), confidence=confidence)
        if self.dist is not None:  # every rank must choose the same K: rank 0's figures for all
            measured = self.dist.broadcast_object(measured)
        return measured

    # -- requests -------------------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> Sequence:
        if not prompt_ids:
            raise DFlashError("empty prompt: give at least one token")
        cfg = self.cfg
        if len(prompt_ids) >= cfg.max_seq_len:
            raise DFlashError(f"prompt has {len(prompt_ids)} tokens, max_seq_len is {cfg.max_seq_len}: "
                              "shorten the prompt or raise max_seq_len")
        if len(prompt_ids) > cfg.max_num_tokens and not cfg.enable_chunked_prefill:
            raise DFlashError(f"prompt has {len(prompt_ids)} tokens, more than max_num_tokens "
                              f"({cfg.max_num_tokens}) with chunked prefill off: raise max_num_tokens or "
                              "enable chunked prefill")
        vocab = self.target_config.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise DFlashError(f"prompt token ids must be in 0..{vocab - 1}")
        if request_id in self.sequences:
            raise DFlashError(f"duplicate request id {request_id!r}")
        if params.seed is None:
            params = replace(params, seed=self._seeds.getrandbits(63))
        seq = Sequence(list(prompt_ids), params, request_id=request_id or "",
                       trace=[] if cfg.trace else None)
        self.sequences[seq.request_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id: str) -> None:
        """Cancel a request: its cache blocks are freed at once."""
        seq = self.sequences.pop(request_id, None)
        if seq is not None:
            self.scheduler.abort(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def release(self, seq: Sequence) -> None:
        self.sequences.pop(seq.request_id, None)

    # the serving loop's calls, which only the tensor-parallel driver (spmd.SPMD) gives meaning to
    def idle_wait_s(self, heartbeat_s: float) -> float | None:
        return None  # alone, an idle loop may sleep until a request arrives

    def heartbeat(self) -> None:
        pass

    def set_lease(self, seconds: float | None) -> None:
        pass

    def shutdown(self) -> None:
        pass

    # -- one iteration --------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        t0 = time.perf_counter()
        work = self.scheduler.schedule()
        if not work:
            if self.scheduler.has_work():
                raise DFlashError("scheduler made no progress: max_num_tokens or the KV cache is too small "
                                  "for the waiting requests")
            return []
        # the requests that draft, and those that draft without verifying (a shadow probe), in one drafter pass
        shadowing = [replace(w, draft_len=w.shadow_len) for w in work if w.shadow_len]
        asked = [w for w in work if w.draft_len > 0] + shadowing
        proposal = self.proposer.propose(asked, self.policy.min_confidence > 0) if asked else Proposal()
        keep = self.policy.cut({i: len(d) for i, d in proposal.drafts.items()}, proposal.confidence)
        drafts = {i: d[:keep[i]] for i, d in proposal.drafts.items()}
        shadows = {w.seq.seq_id: drafts.pop(w.seq.seq_id) for w in shadowing if w.seq.seq_id in drafts}
        out = self.runner.run(work, drafts)
        for sid, dist in (proposal.dists or {}).items():  # sampled drafts' distributions (DFlash2): rejection
            if sid in drafts:                              # sampling verifies them
                out.verify[sid].draft_dist = dist
        committed = dict(zip(out.verify, self.verifier(list(out.verify.values()), out.logits, out.greedy)))
        self.runner.commit(work, out, committed)
        self.proposer.observe(work, out.target_pass, {
            w.seq.seq_id: w.num_rows if w.is_prefill else len(committed[w.seq.seq_id]) for w in work})
        now = time.perf_counter()
        outs = self.scheduler.postprocess(work, drafts, committed, now, shadows)
        drafted = sum(len(d) for d in drafts.values())
        accepted = sum(len(committed[i]) - 1 for i, d in drafts.items() if d)
        self.metrics.record(IterationStats(len(work), sum(out.target_pass.rows[w.seq.seq_id][1] for w in work),
                                           sum(len(o.new_token_ids) for o in outs), drafted, accepted, now - t0))
        return outs

    def stats(self) -> dict:
        b = self.blocks
        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "cache_blocks_total": b.num_blocks, "cache_blocks_free": b.num_free,
                "cache_usage": 1 - b.num_free / b.num_blocks, "preemptions": self.scheduler.num_preemptions,
                "prefix_cache_queries": b.main.queried_tokens, "prefix_cache_hits": b.main.hit_tokens,
                "iterations": len(self.metrics.iterations)}
