"""Self-distillation data: the target answers our prompts through OUR batching runtime (greedy, chat template).

Resumable: records already in the output file are skipped, so an interrupted run loses at most one batch.
"""
from __future__ import annotations

import json
import os
import time

from .prompts import make_prompts

DOMAIN_ID_BASE = 2_000_000  # record ids of the domain-steered Magpie requests
MAX_SEQ_LEN = 1024  # prompt + answer; longer prompts are skipped (and logged), not truncated


def done_ids(path: str) -> set[int]:
    ids = set()
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a torn last line from an interrupted write
                if "id" in rec:
                    ids.add(rec["id"])
    return ids


def generate_data(target: str, out_path: str, num_prompts: int, seed: int = 0, max_tokens: int = 256,
                  batch: int = 32, newest_first: bool = False, magpie: int = 0, magpie_domains: int = 0,
                  code_stubs: int = 0, log=print) -> None:
    """newest_first: highest prompt ids first, so that after raising num_prompts the prompt kinds that only
    exist past the first 8,000 arrive before the older mix. magpie: also answer that many requests the target
    writes itself (magpie.py; cached beside out_path), before the templated prompts. magpie_domains: that many
    more, each written under one of magpie.DOMAINS' system prompts, answered first of all. code_stubs: that many
    HumanEval-shaped function stubs (stubs.py), answered before everything else."""
    from ...llm import LLM
    from ...sampling import SamplingParams

    prompts = make_prompts(num_prompts, seed)
    have = done_ids(out_path)
    todo = [p for p in prompts if p["id"] not in have]
    if newest_first:
        todo.reverse()
    if magpie:
        from .magpie import magpie_prompts
        asks = magpie_prompts(target, magpie, out_path + ".magpie.jsonl", seed, batch, log=log)
        todo = [p for p in asks if p["id"] not in have] + todo
    if magpie_domains:
        from .magpie import magpie_prompts
        asks = magpie_prompts(target, magpie_domains, out_path + ".magpie-domains.jsonl", seed, batch, domains=True,
                              id_base=DOMAIN_ID_BASE, log=log)
        todo = [p for p in asks if p["id"] not in have] + todo
    if code_stubs:
        from .stubs import code_stub_prompts
        todo = [p for p in code_stub_prompts(code_stubs, seed) if p["id"] not in have] + todo
    log(f"{len(have)} records present, {len(todo)} to generate -> {out_path}")
    if not todo:
        return
    llm = LLM(target=target, speculative=False, max_batch_size=batch, max_num_tokens=4096,
              max_seq_len=MAX_SEQ_LEN)
    meta_path = out_path + ".meta.json"
    if not os.path.isfile(meta_path):
        with open(meta_path, "w") as f:
            json.dump({"made_by": "dflash-train --make-data", "target": os.path.abspath(target),
                       "num_prompts": num_prompts, "seed": seed, "max_tokens": max_tokens,
                       "decoding": "greedy, chat template, dflash_trt batching runtime (autoregressive)",
                       "prompts": "dflash_trt.builder.training.prompts.make_prompts (stdlib docstrings, "
                                  "templated tasks, maths, explanations; no evaluation set)"}, f, indent=1)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    # continuous batching: a finished request's slot is refilled at once and its record written, so the batch
    # stays full (generating fixed groups leaves the batch draining while the longest answer finishes: ~3x slower)
    eng, queue, live = llm.engine, list(todo), []
    t0, tokens, done, skipped = time.time(), 0, len(have), 0
    with open(out_path, "a") as f:
        while queue or live:
            while queue and len(live) < batch:
                p = queue.pop(0)
                ids = llm.encode(p["prompt"], chat=True)
                if len(ids) + max_tokens > MAX_SEQ_LEN:  # a long stdlib docstring: no room for an answer
                    skipped += 1
                    continue
                live.append((p, llm.add_request(ids, sp)))
            eng.step()
            for p, seq in [x for x in live if x[1].is_finished]:
                live.remove((p, seq))
                rec = dict(p, prompt_ids=list(seq.prompt_ids), output_ids=list(seq.output_ids),
                           finish_reason=seq.finish_reason)
                f.write(json.dumps(rec) + "\n")
                f.flush()  # a kill loses at most the requests in flight, never finished ones
                tokens += seq.num_output
                done += 1
                eng.release(seq)
                if done % batch == 0:
                    log(f"{done}/{num_prompts} prompts, {tokens} new tokens, "
                        f"{tokens / (time.time() - t0):.0f} tokens/s")
    if skipped:
        log(f"skipped {skipped} prompts longer than {MAX_SEQ_LEN - max_tokens} tokens")
