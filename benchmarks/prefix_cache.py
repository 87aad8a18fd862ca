"""Prefix caching on a chat workload with a long shared system prompt: the same requests through one engine with
the cache off and one with it on, in one run; prints hits, time to first token, throughput and whether the
outputs are identical (they must be: a hit reuses rows the request would have computed bit for bit).

    OMP_NUM_THREADS=2 python benchmarks/prefix_cache.py --num 16 --max-tokens 64
(default: the embedded SmolLM2-135M pair; --target/--draft for another)
"""
from __future__ import annotations

import argparse
import statistics
import time

from dflash_trt import LLM, SamplingParams

SYSTEM = ("You are a careful assistant for a software team. Answer in plain English, keep answers short, use "
          "code blocks for code, say when you are unsure, never invent APIs, prefer the standard library, "
          "explain trade-offs in one sentence each, and end with a one-line summary. ") * 6
QUESTIONS = ["How do I reverse a list in Python?", "What is a context manager?", "Explain list comprehensions.",
             "How do I read a file line by line?", "What does __init__ do?", "How do I sort a dict by value?",
             "What is the difference between a tuple and a list?", "How do I time a function?",
             "What is a generator?", "How do I merge two dicts?", "What is a lambda?", "How do I parse JSON?",
             "What does enumerate return?", "How do I remove duplicates from a list?", "What is a decorator?",
             "How do I check if a file exists?"]


def run(llm: LLM, prompts: list[list[int]], sp: SamplingParams, stagger: int) -> dict:
    """Requests join one every `stagger` steps (a stream of users, so later ones find earlier ones' blocks)."""
    eng, seqs, step = llm.engine, [], 0
    t0 = time.perf_counter()
    queue = list(prompts)
    while queue or eng.has_unfinished():
        if queue and step % stagger == 0:
            seqs.append(eng.add_request(queue.pop(0), sp))
        eng.step()
        step += 1
    wall = time.perf_counter() - t0
    tokens = sum(s.num_output for s in seqs)
    st = eng.stats()
    return {"ttft": statistics.mean(s.first_token_time - s.arrival_time for s in seqs), "tok_s": tokens / wall,
            "wall": wall, "outputs": [s.output_ids for s in seqs], "hits": st["prefix_cache_hits"],
            "queries": st["prefix_cache_queries"], "prompt_tokens": sum(len(p) for p in prompts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--num", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--stagger", type=int, default=4, help="engine steps between arrivals")
    ap.add_argument("--no-spec", action="store_true", help="autoregressive engines")
    a = ap.parse_args()
    kw = dict(target=a.target, draft=a.draft) if a.target else {}
    sp = SamplingParams(max_tokens=a.max_tokens, temperature=0.0)
    res = {}
    for caching in (False, True):
        llm = LLM(**kw, speculative=not a.no_spec, enable_prefix_caching=caching, max_batch_size=8)
        prompts = [llm.encode([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}], chat=True)
                   for q in (QUESTIONS * (a.num // len(QUESTIONS) + 1))[:a.num]]
        run(llm, prompts[:2], sp, a.stagger)  # warm-up (its blocks are dropped with the engine below)
        llm = LLM(**kw, speculative=not a.no_spec, enable_prefix_caching=caching, max_batch_size=8)
        res[caching] = run(llm, prompts, sp, a.stagger)
    off, on = res[False], res[True]
    print(f"{a.num} requests, {off['prompt_tokens'] // a.num} prompt tokens each (shared system prompt), "
          f"{a.max_tokens} new tokens, {'AR' if a.no_spec else 'DFlash'}")
    print(f"prefix cache off: TTFT {off['ttft'] * 1e3:7.1f} ms   {off['tok_s']:6.1f} tok/s   wall {off['wall']:.1f} s")
    print(f"prefix cache on:  TTFT {on['ttft'] * 1e3:7.1f} ms   {on['tok_s']:6.1f} tok/s   wall {on['wall']:.1f} s   "
          f"hits {on['hits']} of {on['queries']} queried tokens ({on['hits'] / max(on['queries'], 1):.0%})")
    print(f"TTFT {off['ttft'] / on['ttft']:.2f}x lower, throughput {on['tok_s'] / off['tok_s']:.2f}x; "
          f"outputs identical: {on['outputs'] == off['outputs']}")


if __name__ == "__main__":
    main()
