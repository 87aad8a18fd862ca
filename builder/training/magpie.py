"""Requests the target writes itself (Magpie, Xu et al. 2024): given the chat template only up to the start of a
user turn, an instruct model continues with a plausible user request. Sampled, they are far more varied than
templated prompts and in the target's own distribution, which is what a drafter must predict; they come from no
evaluation set. Each request is sampled with its own seed, so a run regenerates the same requests.
"""
from __future__ import annotations

import json
import os

from ...errors import DFlashError

MARK = "\x00REQUEST\x00"
ID_BASE = 1_000_000  # record ids of these requests: never collide with the templated prompts' 0..N


# System prompts that steer the request the target writes towards one domain (the request only: its answer is
# generated under the default system prompt, as users and benchmarks run the model). Without them ~40% of the
# requests are everyday chat; a drafter is judged on code, maths and long-form writing too.
DOMAINS = [
    "You are a helpful assistant. The user is a Python programmer asking for code.",
    "You are a patient maths tutor. The user is a student with a maths problem.",
    "You are a writing assistant. The user wants a piece of writing: an essay, a story, an email or a poem.",
    "You are an expert at step-by-step reasoning. The user asks a question that needs careful thought.",
    "You are playing a character in a role-play the user sets up.",
    "You extract and summarise information. The user pastes a text and asks for facts, a summary or a table.",
    "You are a science and engineering expert. The user asks about physics, chemistry, biology or engineering.",
    "You are a humanities scholar. The user asks about history, philosophy, literature or the arts.",
]


def user_turn_prefix(tokenizer, system: str | None = None) -> str:
    """The chat template's text up to where a user's words begin (the default system prompt unless given)."""
    turns = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": MARK}]
    text = tokenizer.apply_chat_template(turns, tokenize=False)
    return text[:text.index(MARK)]


def magpie_prompts(target: str, n: int, out_path: str, seed: int = 0, batch: int = 48, max_tokens: int = 96,
                   domains: bool = False, id_base: int = ID_BASE, log=print) -> list[dict]:
    """n distinct requests as prompt records ({id, kind, prompt}), cached in out_path (resumable). domains: sample
    seed s under the system prompt DOMAINS[s % len(DOMAINS)] (kind "magpie-<i>")."""
    from ...llm import LLM
    from ...sampling import SamplingParams

    have: list[dict] = []
    if os.path.isfile(out_path):
        with open(out_path) as f:
            have = [json.loads(line) for line in f if line.strip().endswith("}")]
    if len(have) >= n:
        return have[:n]
    llm = LLM(target=target, speculative=False, max_batch_size=batch, max_num_tokens=4096, max_seq_len=512)
    systems = DOMAINS if domains else [None]
    prefixes = [llm.tokenizer.encode(user_turn_prefix(llm.tokenizer, s), add_special_tokens=False) for s in systems]
    seen = {r["prompt"] for r in have}
    tried = have[-1]["seed"] + 1 if have else 0  # a seed always gives the same request: resume past the last kept
    limit = tried + 20 * n + batch  # a target whose user turns never end would sample forever
    with open(out_path, "a") as f:
        while len(have) < n:
            if tried >= limit:
                raise DFlashError(f"{target} wrote only {len(have)} usable requests in {tried} samples: Magpie "
                                  "needs an instruct model whose chat template ends a user turn with its EOS")
            seeds = list(range(tried, tried + batch))
            tried += batch
            params = [SamplingParams(max_tokens=max_tokens, temperature=1.0, top_p=0.95, seed=seed * 10**7 + s)
                      for s in seeds]
            for s, out in zip(seeds, llm.generate([prefixes[s % len(systems)] for s in seeds], params)):
                text = out.text.strip()
                # kept: the request ended its turn, is long enough to ask something, and is new
                if out.finish_reason != "stop" or len(text) < 16 or text in seen:
                    continue
                seen.add(text)
                kind = f"magpie-{s % len(systems)}" if domains else "magpie"
                rec = {"id": id_base + len(have), "kind": kind, "prompt": text, "seed": s}
                have.append(rec)
                f.write(json.dumps(rec) + "\n")
                f.flush()
                if len(have) >= n:
                    break
            log(f"magpie: {len(have)}/{n} requests ({tried} sampled)")
    return have
