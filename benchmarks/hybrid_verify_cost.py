"""Verify-block cost of a hybrid (Gated DeltaNet + full attention) layer stack against an attention-only stack of
the same width, the two ways to roll the linear-attention state back, and the state bytes per request.

    OMP_NUM_THREADS=1 python benchmarks/hybrid_verify_cost.py [--hidden 512 --layers 8 --ctx 1024 --k 15]

Random weights, batch-invariant CPU kernels (the engine's CPU default). Contexts are not prefilled: the KV rows
and recurrent states hold whatever is there, which costs the same as real ones. Each part is timed on its own
(best of --reps) and the strategies' totals are sums: a verify step plus its commit, with half the drafts
accepted in the replay timings. Rollback strategies:
  states   verify records the state after every row; commit copies the accepted one (vLLM, TensorRT-LLM)
  inputs   verify records each linear layer's per-row conv input and gate logits; commit re-runs conv, gates and
           recurrence (no GEMM) over the accepted rows from the snapshot
  none     verify records nothing; the accepted a+1 rows run through the whole model again
"""
from __future__ import annotations

import argparse
import time

import torch

from dflash_trt import ops
from dflash_trt.models import qwen3_5 as hyb


def config(hidden: int, layers: int, interval: int, kind: str):
    from transformers import Qwen3_5TextConfig

    heads = max(1, hidden // 128)
    lin = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    types = lin if kind == "hybrid" else ["full_attention"] * layers
    hf = Qwen3_5TextConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                           num_attention_heads=heads, num_key_value_heads=max(1, heads // 4), head_dim=128,
                           linear_num_key_heads=max(1, hidden // 128), linear_num_value_heads=max(1, hidden // 64),
                           linear_key_head_dim=64, linear_value_head_dim=64, layer_types=types,
                           max_position_embeddings=1 << 16)
    return hyb.HybridConfig.from_hf(hf)


def build(cfg, seed=0):
    torch.manual_seed(seed)
    m = hyb.HybridModel(cfg, max_positions=1 << 14)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("A_log"):
                p.uniform_(0, 2)
            elif "norm" in n or n.endswith("dt_bias"):
                p.zero_()
            else:
                p.normal_(0, 0.02)
    m.pack()
    return m.eval()


def timed(fn, reps):
    """Best of reps, in ms. One thread: CPU time of this process, which other jobs on a shared machine do not
    inflate (wall time does, by the time we are descheduled); several threads: wall time."""
    clock = time.process_time if torch.get_num_threads() == 1 else time.perf_counter
    fn()
    best = float("inf")
    for _ in range(reps):
        t = clock()
        fn()
        best = min(best, clock() - t)
    return best * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--interval", type=int, default=4, help="full_attention_interval of the hybrid stack")
    ap.add_argument("--ctx", type=int, default=1024, help="committed tokens before the verify block")
    ap.add_argument("--k", type=int, default=15, help="drafts per block (K+1 verify rows)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if not ops.enable_invariant():
        print("note: invariant kernels unavailable, timing the PyTorch path")
    k1, acc = args.k + 1, args.k // 2 + 1  # rows verified; rows kept in the replay timings (half accepted)
    print(f"hidden {args.hidden}, {args.layers} layers, ctx {args.ctx}, K+1 = {k1} verify rows, "
          f"threads {torch.get_num_threads()}")
    rows = {}
    for kind in ("attention", "hybrid"):
        cfg = config(args.hidden, args.layers, args.interval, kind)
        m = build(cfg)
        for b in args.batch:
            r = hyb.HybridRunner(m, max_seqs=b, max_len=args.ctx + 2 * k1)
            block = list(range(3, 3 + k1))

            def verify(rollback="states"):
                for s in range(b):
                    r.length[s] = args.ctx
                return r.step([(s, block, True) for s in range(b)], rollback=rollback)

            def decode():
                for s in range(b):
                    r.length[s] = args.ctx
                return r.step([(s, [5], False) for s in range(b)])

            t_dec = timed(decode, args.reps)
            t_ver = timed(verify, args.reps)
            line = dict(decode=t_dec, verify=t_ver)
            if kind == "hybrid":
                def commit():
                    for s in range(b):
                        r.length[s] = args.ctx
                        r.accept(s, acc)

                def replay():
                    for s in range(b):
                        r.length[s] = args.ctx
                    r.step([(s, block[:acc], False) for s in range(b)])

                for mode in ("states", "inputs"):
                    t = timed(lambda: verify(mode), args.reps)
                    verify(mode)  # leaves what commit() needs
                    line[f"{mode}: verify+commit"] = t + timed(commit, args.reps)
                t = timed(lambda: verify("none"), args.reps)
                line["none: verify+replay"] = t + timed(replay, args.reps)
            rows[(kind, b)] = line
        d = cfg.deltanet
        state = cfg.state_bytes_per_request(torch.bfloat16)
        kv = cfg.kv_bytes_per_token(torch.bfloat16)
        inter = len(cfg.linear_layers) * k1 * d.state_bytes(torch.bfloat16)
        inputs = len(cfg.linear_layers) * k1 * (d.conv_dim + 2 * d.num_v_heads) * 2
        print(f"{kind:9s}: {len(cfg.linear_layers)} linear + {len(cfg.attention_layers)} attention layers; "
              f"bf16 KV {kv} B/token -> {kv * args.ctx / 2**20:.2f} MiB at ctx {args.ctx}; linear state "
              f"{state / 2**20:.2f} MiB/request; verify scratch: states {inter / 2**20:.2f} MiB/request, inputs "
              f"{inputs / 2**10:.0f} KiB/request")
    for (kind, b), line in rows.items():
        extra = "".join(f", {k} {v:.1f}" for k, v in line.items() if k not in ("decode", "verify"))
        print(f"{kind:9s} batch {b}: decode {line['decode']:.1f} ms, verify {line['verify']:.1f} ms{extra} "
              f"(ms per step)")
    for b in args.batch:
        a, h = rows[("attention", b)], rows[("hybrid", b)]
        print(f"batch {b}: hybrid / attention-only verify {h['verify'] / a['verify']:.2f}x, "
              f"verify / decode: attention {a['verify'] / a['decode']:.2f}x, hybrid {h['verify'] / h['decode']:.2f}x")


if __name__ == "__main__":
    main()
