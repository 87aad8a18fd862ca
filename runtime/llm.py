"""The public API, shaped like vLLM's and TensorRT-LLM's `LLM`: `LLM(...).generate(prompts, SamplingParams)`."""
from __future__ import annotations

from dataclasses import dataclass, field

from .engine import LLMEngine
from .engine_config import EngineConfig
from .errors import DFlashError
from .loader import engine_settings, resolve_paths
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
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    tau: float = 0.0
    acceptance_rate: float = 0.0
    trace: list | None = None
    ttft: float | None = None
    latency: float | None = None
    tpot: float | None = None  # mean seconds per output token after the first
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)

    def stats(self) -> dict:
        return {"steps": self.steps, "drafted": self.drafted, "accepted": self.accepted, "tau": self.tau,
                "acceptance_rate": self.acceptance_rate}


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
                 speculative: bool | str = True, tokenizer: str | None = None, **engine_kwargs):
        """speculative: True or "dflash" (needs a drafter), "ngram" (prompt lookup, no drafter), False (AR)."""
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
        self.tokenizer = self._load_tokenizer(tokenizer or paths.target)
        engine = LLMEngine(paths, self.config, self.tokenizer)
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
        return RequestOutput(
            request_id=seq.request_id, prompt=prompt if isinstance(prompt, str) else None,
            prompt_token_ids=list(seq.prompt_ids), text=seq.text, token_ids=list(seq.output_ids),
            finish_reason=seq.finish_reason, finished=seq.is_finished, steps=seq.steps, drafted=seq.drafted,
            accepted=seq.accepted, tau=seq.tau, acceptance_rate=seq.accepted / seq.drafted if seq.drafted else 0.0,
            trace=seq.trace,
            ttft=None if seq.first_token_time is None else seq.first_token_time - seq.arrival_time,
            latency=None if seq.finish_time is None else seq.finish_time - seq.arrival_time, tpot=seq.tpot)

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
