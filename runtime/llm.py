"""The public API, shaped like vLLM's and TensorRT-LLM's `LLM`: `LLM(...).generate(prompts, SamplingParams)`."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .engine import LLMEngine
from .engine_config import EngineConfig
from .errors import DFlashError
from .loader import engine_settings, mib, resolve_paths, stage
from .loader import verify_files as check_files
from .memory import check_device, kv_budget, kv_pool_bytes
from .spmd import SPMD
from .sampling import SamplingParams
from .sequence import Sequence


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    finished: bool
    steps: int = 0  # decoding steps (after the prefill's first token), drafted or not
    num_drafts: int = 0  # steps that verified drafts (vLLM's num_drafts)
    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # draft tokens accepted
    # drafting steps that accepted position 0, 1, ... (on the final output; streamed deltas leave it empty)
    accepted_per_pos: list[int] = field(default_factory=list)
    tau: float | None = None  # tokens per drafting step (1 + accepted / num_drafts); None: nothing was drafted
    acceptance_rate: float | None = None  # accepted / drafted; None: nothing was drafted
    trace: list | None = None
    ttft: float | None = None
    latency: float | None = None
    tpot: float | None = None  # mean seconds per output token after the first
    cached_tokens: int = 0  # prompt tokens read from the prefix cache instead of computed
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)

    def stats(self) -> dict:
        return {"steps": self.steps, "num_drafts": self.num_drafts, "drafted": self.drafted,
                "accepted": self.accepted, "accepted_per_pos": list(self.accepted_per_pos), "tau": self.tau,
                "acceptance_rate": self.acceptance_rate}


def decoding_steps(seq: Sequence) -> int:
    """Decoding steps so far, drafted or not. Each commits one token of the target's own plus its accepted
    drafts, and the target's cache grows by all of them (`num_computed`), even by drafts accepted past an EOS
    that ended the request, which the output drops: so the cache length, not the output's, counts exactly."""
    if seq.num_output == 0:
        return 0
    if seq.in_prefill:  # recomputing after a preemption: nothing was dropped (only a finishing step drops)
        return seq.num_output - 1 - seq.accepted
    return seq.num_computed - seq.num_prompt - seq.accepted


def accepted_per_position(accept_hist: list[int]) -> list[int]:
    """Drafting steps that accepted the draft at position i (0-based), as vLLM's num_accepted_tokens_per_pos:
    a step that accepted a drafts counts at positions 0..a-1."""
    out = [0] * max(accept_hist, default=0)
    for a in accept_hist:
        for i in range(a):
            out[i] += 1
    return out


def encode_prompt(tokenizer, prompt, chat: bool = False, where: str = "the target") -> list[int]:
    """Token ids for a prompt: ids pass through, chat messages or `chat=True` use the chat template."""
    if isinstance(prompt, (list, tuple)) and (not prompt or isinstance(prompt[0], int)):
        return list(prompt)
    if tokenizer is None:
        raise DFlashError(f"{where} has no tokenizer: pass token ids instead of text")
    if isinstance(prompt, (list, tuple)):  # chat messages
        chat, messages = True, list(prompt)
    else:
        messages = [{"role": "user", "content": prompt}]
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise DFlashError(f"{where} has no chat template: send plain prompts instead")
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
    return list(tokenizer.encode(prompt))


class LLM:
    """DFlash LLM. `LLM()` runs the embedded default pair; `LLM(ENGINE_DIR)`, `LLM(target=..., draft=...)`."""

    def __init__(self, model: str | None = None, *, target: str | None = None, draft: str | None = None,
                 speculative: bool | str = True, tokenizer: str | None = None, verify_files: str = "sha256",
                 kv_cache_fraction: float | None = None, **engine_kwargs):
        """speculative: True or "dflash" (needs a drafter), "ngram" (prompt lookup, no drafter), False (AR).
        verify_files: what is checked before loading (loader.verify_files): "sha256" (an engine directory's
        files against engine.json; sizes for a plain checkpoint), "size", or "none" (trusted storage).
        kv_cache_fraction: the KV cache gets this fraction of the memory free at start, less the weights
        (memory.kv_budget); without it or kv_cache_bytes, the workload's need, capped at half of that memory."""
        if model is None and target is None and draft is not None:
            raise DFlashError(f"draft={draft} needs its target: pass target=DIR too (--target), or an engine "
                              "directory")
        if model is None and target is None:
            from .embedded import embedded_paths  # the embedded default: SmolLM2-135M + our drafter
            model = embedded_paths(draft is None)
            if isinstance(model, tuple):
                target, draft = model
                model = None
        paths = resolve_paths(model, target, draft)
        self.paths = paths
        self.config = EngineConfig.from_kwargs(speculative=speculative, **engine_settings(paths, engine_kwargs))
        if self.config.spec.method == "dflash" and paths.draft is None:
            raise DFlashError("DFlash needs a drafter: pass draft=DIR, speculative=\"ngram\" (prompt lookup, no "
                              "drafter) or speculative=False")
        check_device(self.config.device)
        check_files(paths, verify_files)
        if self.config.kv_cache_bytes is None:
            self.config.kv_cache_bytes = kv_budget(paths, self.config, kv_cache_fraction)
        elif kv_cache_fraction is not None:
            raise DFlashError("give kv_cache_bytes or kv_cache_fraction, not both")
        self.tokenizer = self._load_tokenizer(tokenizer or paths.target)
        t0 = time.perf_counter()
        engine = LLMEngine(paths, self.config, self.tokenizer)
        kv = kv_pool_bytes(engine)
        stage(f"KV cache: {engine.kv_plan.num_blocks} blocks of {engine.kv_plan.page} tokens, "
              f"{mib(kv['target']['bytes'])} target ({kv['target']['bytes_per_token']} B/token)"
              + (f" + {mib(kv['drafter']['bytes'])} drafter context ({kv['drafter']['bytes_per_token']} B/token)"
                 if kv["drafter"]["bytes"] else "")
              + f"; engine ready {time.perf_counter() - t0:.1f} s after loading began")
        self.engine = engine if engine.dist is None else SPMD(engine)
        if engine.dist is not None and not engine.dist.is_driver:
            # tensor parallelism: ranks > 0 mirror rank 0's engine, then end with it (only rank 0 returns)
            self.engine.follow()
            raise SystemExit(0)

    @staticmethod
    def _load_tokenizer(path: str):
        try:
            from transformers import AutoTokenizer
            return AutoTokenizer.from_pretrained(path)
        except Exception:  # a bare checkpoint without tokenizer files still generates token ids
            return None

    # -- prompts --------------------------------------------------------------------------------------
    def encode(self, prompt, chat: bool = False) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, chat, self.paths.target)

    # -- generation -----------------------------------------------------------------------------------
    def add_request(self, prompt, params: SamplingParams, chat: bool = False, request_id: str | None = None):
        return self.engine.add_request(self.encode(prompt, chat), params, request_id)

    def output(self, seq: Sequence, prompt=None) -> RequestOutput:
        """The request as it stands (text cut at a stop string)."""
        drafts = seq.steps  # the scheduler counts a step only when it verified drafts
        return RequestOutput(
            request_id=seq.request_id, prompt=prompt if isinstance(prompt, str) else None,
            prompt_token_ids=list(seq.prompt_ids), text=seq.text, token_ids=list(seq.output_ids),
            finish_reason=seq.finish_reason, finished=seq.is_finished, steps=decoding_steps(seq),
            num_drafts=drafts, drafted=seq.drafted, accepted=seq.accepted,
            accepted_per_pos=accepted_per_position(seq.accept_hist) if seq.is_finished else [],
            tau=1 + seq.accepted / drafts if drafts else None,
            acceptance_rate=seq.accepted / seq.drafted if seq.drafted else None, trace=seq.trace,
            ttft=None if seq.first_token_time is None else seq.first_token_time - seq.arrival_time,
            latency=None if seq.finish_time is None else seq.finish_time - seq.arrival_time, tpot=seq.tpot,
            cached_tokens=seq.num_cached_tokens)

    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None, chat: bool = False,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int))
        if single:
            prompts = [prompts]
        params = params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        seqs = [self.add_request(p, sp, chat) for p, sp in zip(prompts, plist)]
        while self.engine.has_unfinished():
            self.engine.step()
        outs = [self.output(s, p) for s, p in zip(seqs, prompts)]
        for s in seqs:
            self.engine.release(s)
        return outs
