"""Our runtime and the z-lab reference (`pip install --no-deps dflash==0.1.0`) on the same drafter: the same tokens
and the same acceptance length at every step, greedy, K = block_size - 1 (our draft_len_policy="fixed").

    python benchmarks/zlab_check.py [--target DIR --draft DIR] [--max-tokens 64] [--threads 2]

Default: the embedded pair (SmolLM2-135M-Instruct + the shipped drafter). The reference runs Hugging Face
modules on MKL, we run batch-invariant kernels: an fp32 near-tie can split two long outputs, so each prompt
reports how far both agree; every step before a split must match exactly.
"""
from __future__ import annotations

import argparse

import torch

PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "Explain the difference between a list and a tuple in Python.",
           "What is the capital of France? Answer in one sentence.",
           "Give me three tips for writing clean code."]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import dflash.model as zm
    from transformers import AutoModelForCausalLM

    from dflash_trt import LLM, SamplingParams
    from dflash_trt.embedded import embedded_paths

    if args.target is None:
        args.target, shipped = embedded_paths()
        args.draft = args.draft or shipped
    ours = LLM(target=args.target, draft=args.draft, draft_len_policy="fixed", trace=True, draft_vocab=False)
    zm._cuda_time = lambda: 0.0  # its timer synchronises CUDA
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    drafter = zm.DFlashDraftModel.from_pretrained(args.draft, dtype=torch.float32).eval()
    ok = 0
    for p in PROMPTS:
        o = ours.generate([p], SamplingParams(max_tokens=args.max_tokens, ignore_eos=True), chat=True)[0]
        ids = o.prompt_token_ids
        st = zm.dflash_generate(drafter, target, torch.tensor([ids]), args.max_tokens, None, 0.0, return_stats=True)
        ref = st.output_ids[0, len(ids):].tolist()[:args.max_tokens]
        same = next((i for i, (a, b) in enumerate(zip(o.token_ids, ref)) if a != b), min(len(ref), len(o.token_ids)))
        ours_acc = [a + 1 for _, a in o.trace]  # tokens committed per step
        ref_acc = list(st.acceptance_lengths)
        k = ours.engine.max_draft_len
        # near the end our scheduler drafts only as many tokens as max_tokens leaves (the reference drafts a
        # full block and truncates): compare the steps where both drafted K
        full_k = [len(dr) == k for dr, _ in o.trace]
        steps, n = 0, 0  # steps fully inside the agreeing prefix
        for a, b, fk in zip(ours_acc, ref_acc, full_k):
            if not fk or n + max(a, b) > same or a != b:
                break
            steps, n = steps + 1, n + a
        full = same == args.max_tokens and steps == sum(full_k)
        ok += full
        print(f"{p[:48]!r:52s} same tokens {same}/{args.max_tokens}, same acceptance in {steps}/{sum(full_k)} "
              f"full-K steps "
              f"(ours tau {sum(ours_acc) / len(ours_acc):.2f}, z-lab {sum(ref_acc) / len(ref_acc):.2f})"
              f"{'' if full else '  <- differs'}")
    print(f"{ok}/{len(PROMPTS)} prompts identical in tokens and in the acceptance length of every full-K step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
