"""The OpenAI wire format: request validation (every mistake is a 400 naming the field) and response bodies.

Only what the engine can honour is accepted: one choice (`n` 1), no logprobs / echo / penalties / tools; fields
it does not know are ignored, as OpenAI-compatible servers usually do. Extensions: `top_k`, `ignore_eos`,
`stop_token_ids`, and a `dflash` object (steps, drafts, drafted, accepted, accepted_per_position, tau, acceptance_rate;
tau and acceptance_rate null when nothing was drafted) in every response.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

from ..sampling import SamplingParams

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the context left
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
INT64 = 1 << 63


class APIError(Exception):
    """An error answered as OpenAI does: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise APIError(f"the request body is not valid JSON ({e}): send a JSON object",
                       code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(f"the request body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    return body


# -- field checks ---------------------------------------------------------------------------------------------
def _kind(v) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def _bad(name: str, want: str, v) -> APIError:
    return APIError(f"'{name}' must be {want}, got {_kind(v)} {json.dumps(v)[:60]}", param=name,
                    code="invalid_type")


def get_int(body: dict, name: str, lo: int | None = None, hi: int | None = None, default=None):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer():  # JSON writers sometimes send 16.0
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(name, "an integer", v)
    if lo is not None and v < lo:
        raise APIError(f"'{name}' must be >= {lo}, got {v}", param=name, code="invalid_value")
    if hi is not None and v > hi:
        raise APIError(f"'{name}' must be <= {hi}, got {v}", param=name, code="invalid_value")
    return v


def get_float(body: dict, name: str, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(name, "a finite number", v)
    return float(v)


def get_bool(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _bad(name, "a boolean", v)
    return v


def _unsupported(body: dict, name: str, allowed, why: str) -> None:
    v = body.get(name)
    if v is not None and v not in allowed:
        raise APIError(f"'{name}' {json.dumps(v)[:40]} is not supported: {why}", param=name, code="unsupported")


# -- requests -------------------------------------------------------------------------------------------------
@dataclass
class Limits:
    model_names: tuple[str, ...]
    max_seq_len: int
    vocab_size: int


@dataclass
class ParsedRequest:
    kind: str  # "completion" | "chat"
    model: str
    prompt: object  # str | list[int] (completion) or list of messages (chat)
    stream: bool
    include_usage: bool
    max_tokens: int | None
    sampling: dict = field(default_factory=dict)


def parse_request(body: dict, kind: str, limits: Limits) -> ParsedRequest:
    """Checks every field a request may carry; the prompt is checked again once tokenized (see finalize)."""
    model = body.get("model")
    if model is None:
        model = limits.model_names[0]
    elif not isinstance(model, str):
        raise _bad("model", "a string", model)
    elif model not in limits.model_names:
        raise APIError(f"model {model!r} does not exist: this server serves {', '.join(map(repr, limits.model_names))}",
                       param="model", code="model_not_found")
    n = get_int(body, "n", default=1)
    if n != 1:
        raise APIError(f"'n' must be 1 (one choice per request), got {n}", param="n", code="unsupported")
    if kind == "completion":
        if get_int(body, "best_of", default=1) != 1:
            raise APIError("'best_of' must be 1", param="best_of", code="unsupported")
        _unsupported(body, "echo", (False,), "echo is not supported")
        _unsupported(body, "suffix", ("",), "suffix (insertion) is not supported")
        _unsupported(body, "logprobs", (0, False), "logprobs are not returned")
        prompt = _completion_prompt(body)
        max_tokens = get_int(body, "max_tokens", lo=1)
    else:
        _unsupported(body, "logprobs", (False,), "logprobs are not returned")
        _unsupported(body, "top_logprobs", (0,), "logprobs are not returned")
        _unsupported(body, "tools", ([],), "tool calls are not supported")
        _unsupported(body, "functions", ([],), "function calls are not supported")
        _unsupported(body, "tool_choice", ("none", "auto"), "tool calls are not supported")
        rf = body.get("response_format")
        if rf is not None and rf != {"type": "text"}:
            raise APIError("'response_format' must be {\"type\": \"text\"}: structured output is not supported",
                           param="response_format", code="unsupported")
        prompt = _messages(body)
        max_tokens = get_int(body, "max_completion_tokens", lo=1)
        if max_tokens is None:
            max_tokens = get_int(body, "max_tokens", lo=1)
    for name, neutral in (("presence_penalty", 0), ("frequency_penalty", 0), ("repetition_penalty", 1)):
        v = get_float(body, name, neutral)
        if v != neutral:
            raise APIError(f"'{name}' must be {neutral}: penalties would change the target's distribution, "
                           "which speculative decoding reproduces exactly", param=name, code="unsupported")
    lb = body.get("logit_bias")
    if lb not in (None, {}):
        raise APIError("'logit_bias' is not supported", param="logit_bias", code="unsupported")
    stream = get_bool(body, "stream")
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not isinstance(so, dict):
            raise _bad("stream_options", "an object", so)
        if not stream:
            raise APIError("'stream_options' is only allowed with 'stream': true", param="stream_options")
        include_usage = get_bool(so, "include_usage")
    sampling = _sampling(body, limits)
    return ParsedRequest(kind, model, prompt, stream, include_usage, max_tokens, sampling)


def _completion_prompt(body: dict):
    if "prompt" not in body or body["prompt"] is None:
        raise APIError("'prompt' is required: a string or an array of token ids", param="prompt",
                       code="missing_field")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        if not p:
            raise APIError("'prompt' is empty: give at least one character", param="prompt", code="invalid_value")
        return p
    if isinstance(p, list):
        if not p:
            raise APIError("'prompt' is an empty array: give at least one token id", param="prompt",
                           code="invalid_value")
        if all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            return list(p)
        if all(isinstance(t, (str, list)) for t in p):
            raise APIError(f"'prompt' holds {len(p)} prompts: send one prompt per request", param="prompt",
                           code="unsupported")
    raise _bad("prompt", "a string or an array of integer token ids", p)


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if msgs is None:
        raise APIError("'messages' is required: an array of {role, content} objects", param="messages",
                       code="missing_field")
    if not isinstance(msgs, list):
        raise _bad("messages", "an array of {role, content} objects", msgs)
    if not msgs:
        raise APIError("'messages' is empty: give at least one message", param="messages", code="invalid_value")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, "an object with 'role' and 'content'", m)
        role = m.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise APIError(f"'{where}.role' must be one of {', '.join(CHAT_ROLES)}, got {json.dumps(role)}",
                           param=f"{where}.role", code="invalid_value")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(f"'{where}.content[{j}]' must be a {{\"type\": \"text\", \"text\": ...}} part: "
                                   "only text is supported", param=f"{where}.content", code="unsupported")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise _bad(f"{where}.content", "a string or an array of text parts", content)
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def _sampling(body: dict, limits: Limits) -> dict:
    temperature = get_float(body, "temperature", 1.0)  # OpenAI's default: send 0 for greedy decoding
    if temperature < 0:
        raise APIError(f"'temperature' must be >= 0, got {temperature}", param="temperature", code="invalid_value")
    top_p = get_float(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise APIError(f"'top_p' must be in (0, 1], got {top_p}", param="top_p", code="invalid_value")
    top_k = get_int(body, "top_k", lo=-1, default=0)
    seed = get_int(body, "seed", lo=-INT64, hi=INT64 - 1)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise _bad("stop", "a string or an array of strings", stop)
    if any(s == "" for s in stop):
        raise APIError("'stop' holds an empty string, which would stop at once", param="stop", code="invalid_value")
    ignore_eos = get_bool(body, "ignore_eos")
    stop_ids = body.get("stop_token_ids") or []
    if not (isinstance(stop_ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids)):
        raise _bad("stop_token_ids", "an array of integer token ids", stop_ids)
    if any(not 0 <= t < limits.vocab_size for t in stop_ids):
        raise APIError(f"'stop_token_ids' must be in 0..{limits.vocab_size - 1}", param="stop_token_ids",
                       code="invalid_value")
    return dict(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=stop, ignore_eos=ignore_eos,
                stop_token_ids=list(stop_ids))


def finalize(req: ParsedRequest, prompt_ids: list[int], limits: Limits) -> SamplingParams:
    """Length checks on the tokenized prompt, then the engine's SamplingParams."""
    param = "prompt" if req.kind == "completion" else "messages"
    n, msl = len(prompt_ids), limits.max_seq_len
    if n == 0:
        raise APIError(f"'{param}' tokenizes to no tokens: give a longer prompt", param=param, code="invalid_value")
    bad = [t for t in prompt_ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise APIError(f"'prompt' token id {bad[0]} is out of range: ids must be in 0..{limits.vocab_size - 1}",
                       param="prompt", code="invalid_value")
    if n >= msl:
        raise APIError(f"this model's maximum context length is {msl} tokens, but the {param} has {n} tokens: "
                       f"shorten it to at most {msl - 1} tokens", param=param, code="context_length_exceeded")
    room = msl - n
    max_tokens = req.max_tokens
    if max_tokens is None:
        max_tokens = min(COMPLETION_DEFAULT_MAX_TOKENS, room) if req.kind == "completion" else room
    elif max_tokens > room:
        name = "max_tokens" if req.kind == "completion" else "max_tokens' / 'max_completion_tokens"
        raise APIError(f"this model's maximum context length is {msl} tokens, but you requested {n + max_tokens} "
                       f"tokens ({n} in the {param}, {max_tokens} for the completion): set '{name}' to at most "
                       f"{room}", param="max_tokens", code="context_length_exceeded")
    return SamplingParams(max_tokens=max_tokens, **req.sampling)


# -- responses ------------------------------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; prompt_tokens_details.cached_tokens: prompt tokens read from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def dflash_stats(out) -> dict:
    """The request's speculative statistics. steps: every decoding step after the first token; drafts: the steps
    that verified drafts; tau (tokens per drafting step) and acceptance_rate are null when nothing was drafted."""
    def r(v):
        return None if v is None else round(v, 4)
    return {"steps": out.steps, "drafts": out.num_drafts, "drafted": out.drafted, "accepted": out.accepted,
            "accepted_per_position": list(out.accepted_per_pos), "tau": r(out.tau),
            "acceptance_rate": r(out.acceptance_rate)}


def completion_response(rid: str, model: str, out, created: int | None = None) -> dict:
    return {"id": rid, "object": "text_completion", "created": created or int(time.time()), "model": model,
            "choices": [{"index": 0, "text": out.text, "logprobs": None, "finish_reason": out.finish_reason}],
            "usage": usage(len(out.prompt_token_ids), len(out.token_ids), out.cached_tokens),
            "dflash": dflash_stats(out)}


def chat_response(rid: str, model: str, out, created: int | None = None) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created or int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text}, "logprobs": None,
                         "finish_reason": out.finish_reason}],
            "usage": usage(len(out.prompt_token_ids), len(out.token_ids), out.cached_tokens),
            "dflash": dflash_stats(out)}


def completion_chunk(rid: str, model: str, created: int, text: str, reason: str | None = None) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]}


def chat_chunk(rid: str, model: str, created: int, delta: dict, reason: str | None = None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}


def sse(data) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"
