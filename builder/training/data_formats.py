"""Training data in the shapes users have, turned into dflash-train records {id, prompt, prompt_ids, output_ids}.

Per JSONL line, one of:
  {"prompt_ids": [...], "output_ids": [...]}            token ids (what --make-data writes; features.read_records)
  {"messages": [{"role": ..., "content": ...}, ...]}    OpenAI / UltraChat exports
  {"conversations": [{"from": ..., "value": ...}, ...]} ShareGPT exports
  {"prompt": "...", "response": "..."}                  (also instruction/output, question/answer)
The response trained on is the last assistant turn; the turns before it are the prompt, rendered with the target's
chat template by transformers. With regeneration the responses are the target's own (regenerate.py) and a
conversation may end on a user turn.
"""
from __future__ import annotations

import json
import os

from ...errors import DFlashError

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
                  "system": "system", "tool": "tool", "function_call": "assistant", "observation": "tool"}
PAIRS = (("prompt", "response"), ("instruction", "output"), ("question", "answer"))
SHAPES = ('{"prompt_ids", "output_ids"}, {"messages": [{"role", "content"}]}, {"conversations": [{"from", '
          '"value"}]} or {"prompt", "response"}')


def first_record(path: str) -> dict | None:
    """The first line of the file that is a JSON object, or None."""
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise DFlashError(f"cannot read training data {path}: {e.strerror}") from None
    with f:
        for line in f:
            if line.strip():
                try:
                    r = json.loads(line)
                except ValueError:
                    return None
                return r if isinstance(r, dict) else None
    return None


def is_token_data(path: str) -> bool:
    r = first_record(path)
    return os.path.isfile(path + ".meta.json") or r is None or "prompt_ids" in r


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if p.get("type", "text") == "text")
    raise DFlashError(f"{where} is not text (a string, or a list of {{\"type\": \"text\", \"text\": ...}} parts)")


def conversation(r: dict, where: str) -> list[dict]:
    """The record as [{"role", "content"}] messages."""
    if "messages" in r:
        msgs = r["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise DFlashError(f"{where}: messages is not a non-empty list of {{\"role\", \"content\"}} turns")
        out = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
                raise DFlashError(f"{where}: messages[{i}] needs a string \"role\" and a \"content\"")
            out.append({"role": m["role"], "content": _text(m["content"], f"{where}: messages[{i}] content")})
        return out
    if "conversations" in r:
        turns = r["conversations"]
        if not isinstance(turns, list) or not turns:
            raise DFlashError(f"{where}: conversations is not a non-empty list of {{\"from\", \"value\"}} turns")
        out = []
        for i, m in enumerate(turns):
            if not isinstance(m, dict) or "from" not in m or "value" not in m:
                raise DFlashError(f"{where}: conversations[{i}] needs \"from\" and \"value\" (ShareGPT)")
            role = SHAREGPT_ROLES.get(str(m["from"]).lower())
            if role is None:
                raise DFlashError(f"{where}: conversations[{i}] is from {m['from']!r}; ShareGPT turns are from "
                                  f"{', '.join(sorted(SHAREGPT_ROLES))}")
            out.append({"role": role, "content": _text(m["value"], f"{where}: conversations[{i}] value")})
        return out
    for p, a in PAIRS:
        if p in r:
            out = [{"role": "user", "content": _text(r[p], f"{where}: {p}")}]
            if a in r:
                out.append({"role": "assistant", "content": _text(r[a], f"{where}: {a}")})
            return out
    raise DFlashError(f"{where} has none of the training data shapes: each line is one of {SHAPES}")


def split_turns(msgs: list[dict], where: str, regenerate: bool) -> tuple[list[dict], dict | None]:
    """(prompt turns, the response turn or None). The response is the last assistant turn; regenerating, the
    target answers the turns before it (or all of them when the conversation ends on a user turn)."""
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
    if regenerate:
        cut = last if last is not None and last == len(msgs) - 1 else len(msgs)
        prompt = msgs[:cut]
        if not any(m["role"] == "user" for m in prompt):
            raise DFlashError(f"{where}: no user turn for the target to answer")
        return prompt, None
    if last is None:
        raise DFlashError(f"{where}: no assistant turn to train on; add the response, or pass --regenerate to "
                          "have the target write it")
    if not any(m["role"] == "user" for m in msgs[:last]):
        raise DFlashError(f"{where}: the assistant turn answers no user turn")
    return msgs[:last], msgs[last]


def tokenize(tok, prompt: list[dict], answer: dict | None) -> tuple[list[int], list[int]]:
    """(prompt_ids, output_ids): the prompt turns with the generation prompt, and the answer's tokens as the
    template renders them after it (through its end-of-turn token)."""
    p = list(tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False))
    if answer is None:
        return p, []
    full = list(tok.apply_chat_template(prompt + [answer], tokenize=True, return_dict=False))
    if full[:len(p)] == p:
        out = full[len(p):]
    else:  # templates that rewrite earlier turns once an answer follows (thinking blocks): the answer alone
        out = list(tok.encode(answer["content"], add_special_tokens=False))
        out.append(tok.eos_token_id)
    # stop at the end-of-turn token, as generation does: what the template adds after it is not the answer's
    vocab = tok.get_vocab()
    ends = {vocab[t] for t in (tok.eos_token, "<|im_end|>", "<|eot_id|>", "<end_of_turn>") if t in vocab}
    for i, t in enumerate(out):
        if t in ends:
            return p, out[:i + 1]
    return p, out


def load_tokenizer(target_dir: str):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(target_dir)
    except (OSError, ValueError) as e:
        raise DFlashError(f"chat data needs the target's tokenizer and there is none in {target_dir} "
                          f"({str(e).splitlines()[0][:120]}); pass token ids (prompt_ids / output_ids)") from None
    if not getattr(tok, "chat_template", None):
        raise DFlashError(f"the tokenizer in {target_dir} has no chat template: add one to its tokenizer_config.json, "
                          "or pass token ids (prompt_ids / output_ids)")
    return tok


def read_chat(path: str, target_dir: str, regenerate: bool = False, log=None) -> list[dict]:
    """Chat records tokenized with the target's template; sorted by id (the line number unless given)."""
    tok = load_tokenizer(target_dir)
    recs, seen, empty = [], {}, 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path} line {n}"
            try:
                r = json.loads(line)
            except ValueError as e:
                raise DFlashError(f"{where} is not JSON ({e.msg}): each line must be one record, {SHAPES}") from None
            if not isinstance(r, dict):
                raise DFlashError(f"{where} is not a JSON object: each line must be one record, {SHAPES}")
            prompt, answer = split_turns(conversation(r, where), where, regenerate)
            rid = r.get("id", n - 1)
            if not isinstance(rid, int) or isinstance(rid, bool):
                rid = n - 1  # exports carry string ids: the line number is ours
            if rid in seen:
                raise DFlashError(f"{where}: id {rid} is also the id of line {seen[rid]}; ids must be unique")
            seen[rid] = n
            pids, oids = tokenize(tok, prompt, answer)
            if not regenerate and not oids:
                empty += 1
                continue
            users = [m["content"] for m in prompt if m["role"] == "user"]
            recs.append({"id": rid, "prompt": users[-1], "prompt_ids": pids, "output_ids": oids,
                         **({"kind": r["kind"]} if isinstance(r.get("kind"), str) else {})})
    if log and empty:
        log(f"{path}: skipped {empty} record(s) whose response is empty")
    recs.sort(key=lambda r: r["id"])
    return recs
