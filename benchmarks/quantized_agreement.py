"""Quantized targets vs the BF16 target on the embedded pair: teacher-forced top-1 agreement and tau.

    python benchmarks/quantized_agreement.py [--work DIR] [--formats fp8,nvfp4] [--max-tokens 96]

Builds bf16 / fp8 / nvfp4 engine directories with `dflash-build` (ModelOpt on CPU), then on the BF16 engine's own
greedy answers to a few prompts measures (a) how often each quantized target's argmax equals the BF16 target's
at every position (teacher forcing, our runtime's model code) and (b) DFlash tau with each engine.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch

PROMPTS = ["Write a Python function that returns the n-th triangular number.",
           "Explain in a paragraph how rainbows form.",
           "Give three tips for writing clear documentation."]


def build(fmt, target, draft, out):
    if not os.path.isfile(os.path.join(out, "engine.json")):
        subprocess.run([sys.executable, "-m", "dflash_trt.builder.cli", "--target", target, "--draft", draft,
                        "--output", out, "--quantization", fmt, "--calib-samples", "32"], check=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--work", default="/tmp/dflash_quant_bench")
    ap.add_argument("--formats", default="fp8,nvfp4")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from dflash_trt import LLM, SamplingParams
    from dflash_trt.embedded import embedded_paths
    from dflash_trt.teacher import teacher_forward

    target, draft = embedded_paths()
    engines = {f: build(f, target, draft, os.path.join(args.work, f)) for f in ["bf16"] + args.formats.split(",")}
    sp = SamplingParams(max_tokens=args.max_tokens)
    ref_llm = LLM(engines["bf16"], draft_len_policy="fixed")  # tau at one K: comparable across engines
    ref = ref_llm.generate(PROMPTS, sp, chat=True)
    seqs = [o.prompt_token_ids + o.token_ids for o in ref]
    _, ref_logits, _ = teacher_forward(ref_llm.engine.target, seqs)
    ref_top = ref_logits.argmax(-1)
    print(f"{'format':8s} {'top-1 agreement':>16s} {'tau':>6s} {'tau change':>11s}")
    base_tau = sum(o.accepted + o.steps for o in ref) / max(1, sum(o.steps for o in ref))
    for fmt, path in engines.items():
        llm = ref_llm if fmt == "bf16" else LLM(path, draft_len_policy="fixed")
        _, logits, _ = teacher_forward(llm.engine.target, seqs)
        agree = (logits.argmax(-1) == ref_top).float().mean().item()
        outs = llm.generate(PROMPTS, sp, chat=True)
        tau = sum(o.accepted + o.steps for o in outs) / max(1, sum(o.steps for o in outs))
        print(f"{fmt:8s} {agree:16.4f} {tau:6.2f} {tau - base_tau:+11.2f}")


if __name__ == "__main__":
    main()
