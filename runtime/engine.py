"""The engine loop: requests in, one scheduled DFlash (or autoregressive) iteration per step, deltas out."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from . import ops, tensor_parallel
from .draft_policy import CPU_MIN_CONFIDENCE, DraftLengthPolicy, StepCosts
from .calibrate import measure_step_costs
from .draft_vocab import load_draft_vocab
from .engine_config import EngineConfig
from .errors import DFlashError
from .fp8_weights import keep_fp8_weights, use_fp8_matmul
from .kv_cache import BlockManager, CacheBlocks, WindowBlockManager, allocate_caches, bytes_per_block
from .loader import ModelPaths, load_configs, load_models
from .model_runner import ModelRunner
from .models.target import pack_linears
from .quantized import is_quantized
from .sampling import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence


@dataclass
class StepOutput:
    """What one request gained in one iteration."""
    seq: Sequence
    new_token_ids: list[int]
    finished: bool


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
    def __init__(self, paths: ModelPaths, cfg: EngineConfig):
        torch.manual_seed(0)
        self.cfg = cfg
        tcfg, dcfg = load_configs(paths, cfg.max_draft_len)
        if not cfg.speculative:
            dcfg = None
        self.target_config, self.draft_config = tcfg, dcfg
        # tensor parallelism (runtime/tensor_parallel.py): None alone, else the group of the mpirun ranks
        self.dist = tensor_parallel.setup(cfg, paths, tcfg, dcfg)
        self.tp_size = self.dist.world_size if self.dist is not None else 1
        if self.dist is not None:
            self.target, self.drafter = tensor_parallel.load_models_tp(
                paths, tcfg, dcfg, cfg.torch_dtype, cfg.device, self.dist, max_positions=cfg.max_seq_len + 32)
        else:
            self.target, self.drafter = load_models(paths, tcfg, dcfg, cfg.torch_dtype, cfg.device,
                                                    max_positions=cfg.max_seq_len + 32)
        self.fp8_linears, self.fp8_native = 0, False
        if str(cfg.device).startswith("cpu") and cfg.invariant_kernels and ops.enable_invariant():
            self.target.pack()
            if self.drafter is not None:
                pack_linears(self.drafter)
        if cfg.fp8_weights and self.dist is None and is_quantized(paths.target):
            native = cfg.fp8_compute if cfg.fp8_compute is not None else ops.fp8_matmul_available(cfg.device)
            if native:
                self.fp8_linears, self.fp8_native = use_fp8_matmul(self.target, paths.target), True
            else:
                self.fp8_linears = keep_fp8_weights(self.target, paths.target)
        if self.drafter is not None and self.dist is None and cfg.draft_vocab:  # TP keeps the vocab-split head
            ids = load_draft_vocab(paths.draft, tcfg.vocab_size)
            if ids is not None:
                self.drafter.use_vocab(ids, self.target.head_weight)
        self.max_draft_len = 0
        if dcfg is not None:
            self.max_draft_len = cfg.max_draft_len or dcfg.block_size - 1
        self.eos_ids = set(tcfg.eos_token_ids)
        page = cfg.page_size
        tp = self.tp_size  # caches hold this rank's kv heads only
        t_layers = tcfg.cache_layers(tp)  # per layer (kv_heads, k_dim, v_dim): MLA keeps one latent 'head'
        d_layers = [(dcfg.num_key_value_heads // tp, dcfg.head_dim)] * dcfg.num_hidden_layers if dcfg else []
        # sliding-window target layers get their own small pool when the window is shorter than a sequence
        windowed = [i for i in range(len(t_layers)) if tcfg.window(i)] if cfg.window_cache else []
        window = max((tcfg.window(i) for i in windowed), default=0)
        per_seq = -(-cfg.max_seq_len // page) + 1
        if windowed and -(-window // page) + 2 >= per_seq:
            windowed = []
        main_layers = [t for i, t in enumerate(t_layers) if i not in windowed]
        per_block = bytes_per_block(page, main_layers + d_layers, cfg.torch_dtype)
        w_blocks = w_bytes = 0
        if windowed:  # every running request's window plus one step's rows, and the reserved null block
            w_blocks = cfg.max_batch_size * (-(-window // page) + 2) + -(-cfg.max_num_tokens // page) + 1
            w_bytes = w_blocks * bytes_per_block(page, [t_layers[i] for i in windowed], cfg.torch_dtype)
        budget = cfg.kv_cache_bytes or min(2 << 30, per_block * cfg.max_batch_size * per_seq) + w_bytes
        # every layer windowed and no drafter: the main pool holds no bytes, its tables only count positions
        num_blocks = max(budget - w_bytes, 0) // per_block if per_block else cfg.max_batch_size * per_seq
        if num_blocks * page < cfg.max_seq_len + page:
            raise DFlashError(f"KV cache of {budget} bytes holds {num_blocks * page} positions, fewer than "
                              f"max_seq_len {cfg.max_seq_len}: raise kv_cache_bytes or lower max_seq_len")
        self.blocks = CacheBlocks(BlockManager(num_blocks, page),
                                  WindowBlockManager(w_blocks, page, window) if windowed else None)
        main_caches = iter(allocate_caches(num_blocks, page, main_layers, cfg.torch_dtype, cfg.device))
        win_caches = iter(allocate_caches(w_blocks, page, [t_layers[i] for i in windowed], cfg.torch_dtype,
                                          cfg.device) if windowed else [])
        t_caches = [next(win_caches) if i in windowed else next(main_caches) for i in range(len(t_layers))]
        d_caches = allocate_caches(num_blocks, page, d_layers, cfg.torch_dtype, cfg.device) if dcfg else []
        self.runner = ModelRunner(self.target, self.drafter, t_caches, d_caches, page, cfg.device,
                                  use_plugins=cfg.use_plugins, window_pool=bool(windowed))
        self.runner.min_confidence = self._min_draft_confidence()
        self.policy = DraftLengthPolicy(cfg.draft_len_policy, self._step_costs())
        self.scheduler = Scheduler(cfg, self.blocks, self.max_draft_len, self.policy)
        self.metrics = EngineMetrics()
        self.sequences: dict[str, Sequence] = {}
        self.weight_bytes = tensor_parallel.weight_bytes(self.target, self.drafter)
        self.spmd = tensor_parallel.SPMD(self) if self.dist is not None else None

    def _min_draft_confidence(self) -> float:
        cfg = self.cfg
        if cfg.min_draft_confidence is not None:
            return cfg.min_draft_confidence
        cpu = str(cfg.device).startswith("cpu")
        return CPU_MIN_CONFIDENCE if cpu and cfg.draft_len_policy == "adaptive" else 0.0

    def _step_costs(self) -> StepCosts:
        """The adaptive policy's cost model: measured here and now (runtime/calibrate.py) unless given."""
        cfg, measured = self.cfg, None
        if cfg.step_costs is None and cfg.draft_len_policy == "adaptive" and self.max_draft_len:
            measured = measure_step_costs(self.runner, self.blocks, token_id=0, k=min(3, self.max_draft_len))
            if self.dist is not None:  # every rank must choose the same K: rank 0's figures for all
                measured = self.dist.broadcast_object(measured)
        return StepCosts.for_device(cfg.device, measured or cfg.step_costs)

    # -- requests -------------------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> Sequence:
        if not prompt_ids:
            raise DFlashError("empty prompt: give at least one token")
        if len(prompt_ids) >= self.cfg.max_seq_len:
            raise DFlashError(f"prompt has {len(prompt_ids)} tokens, max_seq_len is {self.cfg.max_seq_len}: "
                              "shorten the prompt or raise max_seq_len")
        if len(prompt_ids) > self.cfg.max_num_tokens and not self.cfg.enable_chunked_prefill:
            raise DFlashError(f"prompt has {len(prompt_ids)} tokens, more than max_num_tokens "
                              f"({self.cfg.max_num_tokens}) with chunked prefill off: raise max_num_tokens or "
                              "enable chunked prefill")
        vocab = self.target_config.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise DFlashError(f"prompt token ids must be in 0..{vocab - 1}")
        seq = Sequence(list(prompt_ids), params, request_id=request_id or "")
        if self.cfg.trace:
            seq.trace = []
        if self.max_draft_len:
            seq.acceptance = self.policy.new_estimate()
        if seq.request_id in self.sequences:
            raise DFlashError(f"duplicate request id {seq.request_id!r}")
        self.sequences[seq.request_id] = seq
        self.scheduler.add(seq)
        if self.spmd is not None:
            self.spmd.record("add", list(prompt_ids), params, seq.request_id)
        return seq

    def abort(self, request_id: str) -> None:
        """Cancel a request: its cache blocks are freed at once."""
        if self.spmd is not None:
            self.spmd.record("abort", request_id)
        seq = self.sequences.pop(request_id, None)
        if seq is not None and not seq.is_finished:
            seq.finish_reason = "abort"
            seq.finish_time = time.perf_counter()
            self.scheduler.finish(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # -- one iteration --------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        if self.spmd is None:
            return self._step()
        with self.spmd.lock:  # no shutdown from another thread between the ranks' collectives of this step
            self.spmd.send()  # rank 0 sends this iteration's new requests and aborts to the others
            return self._step()

    def follow(self) -> None:
        """Non-driver ranks under tensor parallelism: mirror rank 0's engine until it shuts down."""
        self.spmd.follow()

    def shutdown(self) -> None:
        if self.spmd is not None:
            self.spmd.shutdown()

    def _step(self) -> list[StepOutput]:
        t0 = time.perf_counter()
        work = self.scheduler.schedule()
        if not work:
            if self.scheduler.running or self.scheduler.waiting:
                raise DFlashError("scheduler made no progress: max_num_tokens or the KV cache is too small "
                                  "for the waiting requests")
            return []
        results = self.runner.execute(work)
        now = time.perf_counter()
        outs, drafted, accepted = [], 0, 0
        for w in work:
            seq, res = w.seq, results[w.seq.seq_id]
            if res.drafts is not None:
                seq.steps += 1
                seq.drafted += len(res.drafts)
                seq.accepted += res.accepted
                seq.accept_hist.append(res.accepted)
                if seq.acceptance is not None:
                    self.policy.observe(seq.acceptance, len(res.drafts), res.accepted)
                drafted += len(res.drafts)
                accepted += res.accepted
                if seq.trace is not None:
                    seq.trace.append((list(res.drafts), res.accepted))
                self._maybe_disable_spec(seq)
            if not res.new_tokens:
                continue
            new = self._commit(seq, res.new_tokens)
            if seq.first_token_time is None:
                seq.first_token_time = now
            if seq.is_finished:
                seq.finish_time = now
            outs.append(StepOutput(seq, new, seq.is_finished))
        self.metrics.record(IterationStats(len(work), sum(w.num_rows for w in work),
                                           sum(len(o.new_token_ids) for o in outs), drafted, accepted, now - t0))
        return outs

    def _maybe_disable_spec(self, seq: Sequence) -> None:
        cfg = self.cfg
        if cfg.min_acceptance > 0 and len(seq.accept_hist) >= cfg.acceptance_window:
            recent = seq.accept_hist[-cfg.acceptance_window:]
            if sum(recent) / len(recent) < cfg.min_acceptance:
                seq.spec_enabled = False

    def _commit(self, seq: Sequence, tokens: list[int]) -> list[int]:
        """Append tokens up to the first stop condition; finish the request if one is met."""
        p, taken = seq.params, []
        for tok in tokens:
            seq.token_ids.append(tok)
            taken.append(tok)
            if (not p.ignore_eos and tok in self.eos_ids) or tok in p.stop_token_ids:
                return self._finish(seq, "stop", taken)
            if seq.num_output >= p.max_tokens:
                return self._finish(seq, "length", taken)
            if len(seq.token_ids) >= self.cfg.max_seq_len:
                return self._finish(seq, "length", taken)
        return taken

    def _finish(self, seq: Sequence, reason: str, taken: list[int]) -> list[int]:
        seq.finish_reason = reason
        self.scheduler.finish(seq)
        return taken

    def finish_on_stop_string(self, seq: Sequence, text_pos: int) -> None:
        """Called by the detokenizer when a stop string appears in the output text."""
        if self.spmd is not None:
            self.spmd.record("stop", seq.request_id, text_pos)
        if not seq.is_finished:
            seq.stop_text_pos = text_pos
            seq.finish_reason = "stop"
            seq.finish_time = time.perf_counter()
            self.scheduler.finish(seq)

    def stats(self) -> dict:
        b = self.blocks
        return {"running": len(self.scheduler.running), "waiting": len(self.scheduler.waiting),
                "cache_blocks_total": b.num_blocks, "cache_blocks_free": b.num_free,
                "cache_usage": 1 - b.num_free / b.num_blocks, "preemptions": self.scheduler.num_preemptions,
                "iterations": len(self.metrics.iterations)}

    def release(self, seq: Sequence) -> None:
        self.sequences.pop(seq.request_id, None)
