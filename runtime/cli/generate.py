"""dflash-generate: run prompts through DFlash (or autoregressive) decoding and print text or JSON."""
from __future__ import annotations

import argparse
import json
import sys

from ..sampling import SamplingParams
from .common import add_engine_args, make_llm, user_errors


@user_errors
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dflash-generate", description=__doc__)
    add_engine_args(p, tensor_parallel=True)
    p.add_argument("--prompt", action="append", help="prompt text (repeatable); default: read stdin lines")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="one JSON object per request")
    p.add_argument("--trace", action="store_true", help="include per-step drafts and accepted lengths")
    args = p.parse_args(argv)
    if not args.prompt and sys.stdin.isatty():
        print("dflash-generate: reading prompts from stdin, one per line (end with Ctrl-D; or pass --prompt)",
              file=sys.stderr, flush=True)
    prompts = args.prompt or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not prompts:
        p.error("no prompt: pass --prompt TEXT or lines on stdin")
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                        top_p=args.top_p, seed=args.seed, stop=args.stop)
    llm = make_llm(args, trace=args.trace)
    for o in llm.generate(prompts, sp, chat=args.chat):
        if args.json:
            rec = {"prompt": o.prompt, "text": o.text, "token_ids": o.token_ids, "finish_reason": o.finish_reason,
                   **o.stats()}
            if args.trace:
                rec["trace"] = [{"drafts": d, "accepted": a} for d, a in (o.trace or [])]
            print(json.dumps(rec), flush=True)
        else:
            print(o.text)
            if o.num_drafts:
                print(f"[steps {o.steps}, drafts {o.num_drafts}, tau {o.tau:.2f}, acceptance rate "
                      f"{o.acceptance_rate:.2f}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
