"""Quantized targets vs the BF16 target: teacher-forced top-1 agreement and tau.

    python benchmarks/quantized_agreement.py [--target DIR --draft DIR] [--work DIR] [--formats fp8,nvfp4]
                                             [--num-prompts N] [--max-tokens 96] [--threads 2]
    python benchmarks/quantized_agreement.py --weights bf16,int8,fp8 [--target DIR --draft DIR] [...]

Builds bf16 / fp8 / nvfp4 engine directories with `dflash-build` (ModelOpt on CPU) from the embedded pair (or
--target/--draft), then on the BF16 engine's own greedy answers to N prompts measures (a) how often each
quantized target's argmax equals the BF16 target's at every position (teacher forcing, our runtime's model code)
and (b) DFlash tau with each engine at the engine's fixed max_draft_len. Engines already in --work are reused.
Only the table goes to stdout; build progress goes to stderr.

--weights instead measures the runtime's load-time weight formats (EngineConfig `weights`, runtime/int8_weights.py)
on the checkpoint itself, against its fp32 run ("auto") and Hugging Face transformers in fp32: the largest
|logit - HF logit| over every teacher-forced position, top-1 agreement with the fp32 target, DFlash tau, and
whether greedy DFlash output is token-identical to AR at the same weights.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import torch

PROMPTS = ["Write a Python function that returns the n-th triangular number.",
           "Explain in a paragraph how rainbows form.",
           "Give three tips for writing clear documentation.",
           "Write a Python function that checks whether a string is a palindrome.",
           "What is the difference between a list and a tuple in Python?",
           "Summarise the causes of the French Revolution in a few sentences.",
           "Write a short poem about the sea.",
           "How do vaccines train the immune system?",
           "Write a SQL query that counts the orders per customer.",
           "Explain recursion to a ten-year-old.",
           "Give a recipe for a simple tomato soup.",
           "Write a Python class for a stack with push, pop and peek.",
           "Why is the sky blue?",
           "List the planets of the solar system in order from the sun.",
           "Write an email asking a colleague to review a pull request.",
           "What are the pros and cons of working from home?"]
FORMATS = ("fp8", "nvfp4")
WEIGHT_FORMATS = ("bf16", "int8", "w8a8", "fp8")


def build(fmt: str, target: str, draft: str, out: str, calib_samples: int) -> str:
    """The engine directory for `fmt`, built unless --work already holds one from the same pair."""
    from dflash_trt.builder.cli import main as build_main

    argv = ["--target", target, "--draft", draft, "--output", out, "--quantization", fmt,
            "--calib-samples", str(calib_samples)]
    try:
        with open(os.path.join(out, "engine.json")) as f:
            rec = json.load(f)
        src = rec["sources"]
        if (src["target"], src["draft"], rec["quantization"]) == (target, draft, fmt):
            return out
        argv.append("--force")  # another pair's engine: replace it
    except (OSError, ValueError, KeyError):
        pass
    with contextlib.redirect_stdout(sys.stderr):  # the build summary is not part of the table
        rc = build_main(argv)
    if rc:
        raise SystemExit(rc)  # dflash-build printed its one-line error
    return out


def tau(outs) -> float:
    steps = sum(o.num_drafts for o in outs)
    return sum(o.accepted + o.num_drafts for o in outs) / max(1, steps)


def run(args) -> list[dict]:
    from dflash_trt import LLM, SamplingParams
    from dflash_trt.teacher import teacher_forward

    if args.target:
        target, draft = os.path.abspath(args.target), os.path.abspath(args.draft)
    else:
        from dflash_trt.embedded import embedded_paths
        target, draft = embedded_paths()
    formats = ["bf16"] + [f for f in args.formats.split(",") if f]
    engines = {f: build(f, target, draft, os.path.join(args.work, f), args.calib_samples) for f in formats}
    prompts = PROMPTS[:args.num_prompts]
    sp = SamplingParams(max_tokens=args.max_tokens)
    # tau at one K for every engine (the adaptive policy's per-machine step costs would make it incomparable)
    ref_llm = LLM(engines["bf16"], draft_len_policy="fixed")
    ref = ref_llm.generate(prompts, sp, chat=True)
    seqs = [o.prompt_token_ids + o.token_ids for o in ref]
    _, ref_logits, _ = teacher_forward(ref_llm.engine.target, seqs)
    ref_top = ref_logits.argmax(-1)
    rows = []
    for fmt, path in engines.items():
        llm = ref_llm if fmt == "bf16" else LLM(path, draft_len_policy="fixed")
        _, logits, _ = teacher_forward(llm.engine.target, seqs)
        outs = ref if fmt == "bf16" else llm.generate(prompts, sp, chat=True)
        rows.append({"format": fmt, "agreement": (logits.argmax(-1) == ref_top).float().mean().item(),
                     "tau": tau(outs), "k": llm.engine.max_draft_len, "positions": ref_top.numel()})
        del llm
    base = rows[0]["tau"]
    print(f"{len(prompts)} prompts, {rows[0]['positions']} teacher-forced positions, "
          f"K = {rows[0]['k']} (fixed), max_tokens {args.max_tokens}")
    print(f"{'format':8s} {'top-1 agreement':>16s} {'tau':>6s} {'tau change':>11s}")
    for r in rows:
        print(f"{r['format']:8s} {r['agreement']:16.4f} {r['tau']:6.2f} {r['tau'] - base:+11.2f}")
    return rows


def hf_logits(target: str, seqs: list[list[int]]) -> torch.Tensor:
    """transformers' fp32 logits of every sequence, rows concatenated in order (teacher_forward's packing)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.cat([model(torch.tensor([s])).logits[0].float() for s in seqs])


def run_weights(args) -> list[dict]:
    from dflash_trt import LLM, SamplingParams
    from dflash_trt.teacher import teacher_forward

    if args.target:
        target, draft = os.path.abspath(args.target), os.path.abspath(args.draft)
    else:
        from dflash_trt.embedded import embedded_paths
        target, draft = embedded_paths()
    prompts = PROMPTS[:args.num_prompts]
    sp = SamplingParams(max_tokens=args.max_tokens)
    rows, seqs, ref_top, hf = [], None, None, None
    for mode in ["auto"] + [w for w in args.weights.split(",") if w]:
        llm = LLM(target=target, draft=draft, draft_len_policy="fixed", weights=mode)
        outs = llm.generate(prompts, sp, chat=True)
        if seqs is None:  # the fp32 target's own answers are the teacher-forced text
            seqs = [o.prompt_token_ids + o.token_ids for o in outs]
            hf = hf_logits(target, seqs)
        with torch.no_grad():
            logits = teacher_forward(llm.engine.target, seqs)[1]
        top = logits.argmax(-1)
        ref_top = top if ref_top is None else ref_top
        head = llm.engine.target.head_packed
        ar = LLM(target=target, speculative=False, weights=mode).generate(prompts, sp, chat=True)
        rows.append({"weights": mode, "bytes": (round(head.data.numel() * head.data.element_size() / (head.data.shape[0] * 32 * head.k))
                                           if head is not None else 4),  # per weight: w8a8 packs 4 in an int32
                     "max_err": (logits - hf).abs().max().item(), "agreement": (top == ref_top).float().mean().item(),
                     "tau": tau(outs), "ar_equal": [o.token_ids for o in outs] == [o.token_ids for o in ar],
                     "k": llm.engine.max_draft_len, "positions": top.numel()})
        del llm
    print(f"{len(prompts)} prompts, {rows[0]['positions']} teacher-forced positions, K = {rows[0]['k']} (fixed), "
          f"max_tokens {args.max_tokens}; max |logit| of transformers fp32: {hf.abs().max().item():.2f}")
    print(f"{'weights':8s} {'B/weight':>8s} {'max |dlogit| vs HF':>19s} {'top-1 vs fp32':>14s} {'tau':>6s} "
          f"{'DFlash == AR':>13s}")
    for r in rows:
        print(f"{r['weights']:8s} {r['bytes']:8d} {r['max_err']:19.4f} {r['agreement']:14.4f} {r['tau']:6.2f} "
              f"{'yes' if r['ar_equal'] else 'NO':>13s}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="target checkpoint (default: the embedded SmolLM2-135M)")
    ap.add_argument("--draft", help="drafter directory (with --target)")
    ap.add_argument("--work", default="/tmp/dflash_quant_bench", help="where the engine directories go")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--num-prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default="", help="instead: these runtime weight formats (comma-separated: bf16, "
                    "int8, w8a8, fp8) against the fp32 target and transformers")
    args = ap.parse_args(argv)
    bad = [f for f in args.formats.split(",") if f and f not in FORMATS]
    bad_w = [w for w in args.weights.split(",") if w and w not in WEIGHT_FORMATS]
    problem = (f"--formats {','.join(bad)}: use fp8 and/or nvfp4" if bad else
               f"--weights {','.join(bad_w)}: use bf16, int8 and/or fp8" if bad_w else
               "--target and --draft go together" if bool(args.target) != bool(args.draft) else
               f"--num-prompts must be 1..{len(PROMPTS)}" if not 1 <= args.num_prompts <= len(PROMPTS) else None)
    if problem:
        sys.stderr.write(f"error: {problem}\n")
        return 2
    torch.set_num_threads(args.threads)
    run_weights(args) if args.weights else run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
