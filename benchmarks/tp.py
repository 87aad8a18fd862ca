"""TP=1 vs TP=2 on this CPU (one thread per rank): tokens/s, bytes communicated per engine step, per-rank weights.

    python benchmarks/tp.py [--hidden 512 --layers 8 --prompts 8 --max-tokens 64]

Builds a random Llama-style target (GQA, heads split evenly) and a random DFlash drafter in a temporary
directory, runs the same batched greedy requests once alone and once under `mpirun -n 2`, checks the outputs
are identical and prints the figures. Needs mpirun on PATH (pip install mpi4py mpich).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(spec_path: str, out_path: str) -> None:
    import torch

    torch.set_num_threads(1)
    from dflash_trt import LLM, SamplingParams

    with open(spec_path) as f:
        spec = json.load(f)
    llm = LLM(target=spec["target"], draft=spec["draft"], **spec["engine"])  # ranks > 0 stay inside
    eng, sp = llm.engine, SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True)
    llm.generate(spec["prompts"][:2], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    dist = eng.dist
    b0, c0 = (dist.bytes_communicated, dist.num_collectives) if dist else (0, 0)
    it0 = len(eng.metrics.iterations)
    t0 = time.perf_counter()
    outs = llm.generate(spec["prompts"], sp)
    dt = time.perf_counter() - t0
    steps = len(eng.metrics.iterations) - it0
    res = {"tp": eng.tp_size, "seconds": dt, "tokens": sum(len(o.token_ids) for o in outs), "steps": steps,
           "token_ids": [o.token_ids for o in outs], "tau": sum(o.accepted for o in outs) / max(1, steps),
           "bytes_per_step": (dist.bytes_communicated - b0) / max(1, steps) if dist else 0,
           "collectives_per_step": (dist.num_collectives - c0) / max(1, steps) if dist else 0,
           "weight_bytes_per_rank": getattr(eng, "weight_bytes_per_rank", [eng.weight_bytes])}
    with open(out_path, "w") as f:
        json.dump(res, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-draft-len", type=int, default=7)
    ap.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(*args.worker)
    if shutil.which("mpirun") is None:
        sys.exit("mpirun not on PATH: pip install mpi4py mpich")
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import torch
    import tiny

    root = tempfile.mkdtemp(prefix="dflash_tp_bench_")
    try:
        t = tiny.make_target(os.path.join(root, "t"), layers=args.layers, hidden=args.hidden, heads=args.heads,
                             kv_heads=args.kv_heads, vocab=args.vocab, init_std=0.05, boost_tokens=(11,), boost=5.0)
        d = tiny.make_drafter(os.path.join(root, "d"), t, block_size=8, heads=args.heads, kv_heads=args.kv_heads,
                              std=0.05, mask_token_id=tiny.mask_proposing(t, 11), residual_scale=0.3)
        g = torch.Generator().manual_seed(0)
        ps = [torch.randint(3, args.vocab, (32,), generator=g).tolist() for _ in range(args.prompts)]
        spec = {"target": t, "draft": d, "prompts": ps, "max_tokens": args.max_tokens,
                "engine": {"max_draft_len": args.max_draft_len, "max_seq_len": 512}}
        sp = os.path.join(root, "spec.json")
        with open(sp, "w") as f:
            json.dump(spec, f)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        res = {}
        for n in (1, 2):
            out = os.path.join(root, f"out{n}.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", sp, out]
            subprocess.run((["mpirun", "-n", str(n)] if n > 1 else []) + cmd, check=True, env=env)
            with open(out) as f:
                res[n] = json.load(f)
        same = res[1]["token_ids"] == res[2]["token_ids"]
        print(f"model: hidden {args.hidden}, {args.layers} layers, {args.heads} heads / {args.kv_heads} kv heads, "
              f"vocab {args.vocab}; {args.prompts} prompts x {args.max_tokens} tokens, greedy, K={args.max_draft_len}")
        print(f"{'TP':>3} {'tok/s':>8} {'steps':>6} {'tokens/step':>11} {'bytes/step':>11} {'colls/step':>10} "
              f"{'weights/rank (MB)':>18}")
        for n, r in res.items():
            w = "/".join(f"{b / 1e6:.2f}" for b in r["weight_bytes_per_rank"])
            print(f"{n:>3} {r['tokens'] / r['seconds']:>8.1f} {r['steps']:>6} {r['tokens'] / r['steps']:>11.2f} "
                  f"{r['bytes_per_step']:>11.0f} {r['collectives_per_step']:>10.1f} {w:>18}")
        print(f"outputs identical: {same}; speed-up TP=2/TP=1: "
              f"{(res[2]['tokens'] / res[2]['seconds']) / (res[1]['tokens'] / res[1]['seconds']):.2f}x "
              f"(bytes/step: sent + received by one rank, all collectives)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
