"""Batch-1 autoregressive decode tokens/s: our engine vs Hugging Face `generate`, same model, same threads.

    python benchmarks/ar_vs_hf.py [--target DIR] [--threads 2] [--max-tokens 128]

Default model: the embedded SmolLM2-135M-Instruct. Decode rate excludes prefill (time after the first token).
"""
from __future__ import annotations

import argparse
import time

import torch

PROMPTS = ["Write a Python function that merges two sorted lists.",
           "Explain how a hash table works.",
           "List three uses of the Fourier transform."]


def ours(target, prompts, max_tokens, dtype):
    from dflash_trt import LLM, SamplingParams

    llm = LLM(target=target, speculative=False, max_batch_size=1, dtype=dtype)
    llm.generate(prompts[0], SamplingParams(max_tokens=8), chat=True)  # warm-up
    rates = []
    for p in prompts:
        o = llm.generate(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True), chat=True)[0]
        rates.append((len(o.token_ids) - 1) / (o.latency - o.ttft))
    return sum(rates) / len(rates)


def hf(target, prompts, max_tokens, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, dtype)).eval()
    rates = []
    for p in [prompts[0]] + prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, do_sample=False)
            t1 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
            t2 = time.perf_counter()
        n = out.shape[1] - ids.shape[1]
        rates.append((n - 1) / ((t2 - t1) - (t1 - t0)))
    return sum(rates[1:]) / len(prompts)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = args.target
    if target is None:
        from dflash_trt.embedded import ensure_target
        target = ensure_target()
    a = ours(target, PROMPTS, args.max_tokens, args.dtype)
    b = hf(target, PROMPTS, args.max_tokens, args.dtype)
    print(f"threads {args.threads}, {args.dtype}, {args.max_tokens} new tokens, batch 1")
    print(f"ours AR        {a:7.1f} tokens/s")
    print(f"HF generate    {b:7.1f} tokens/s")
    print(f"ratio ours/HF  {a / b:7.2f}x")


if __name__ == "__main__":
    main()
