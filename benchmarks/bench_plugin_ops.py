"""Latency of the DFlash custom ops against their pure-PyTorch versions (plugins/reference.py; for greedy
verification also the runtime's current path: argmax, then acceptance on the host).

    python benchmarks/bench_plugin_ops.py                   # CUDA when available, else CPU
    python benchmarks/bench_plugin_ops.py --device cpu --batch 1 16 --vocab 49152

Batches of B requests with K = 15 drafts each (B * 16 verify rows), bf16 logits on CUDA, float32 on CPU.
Sampling rows use temperature 0.8 with top-p 0.9 (the sort path) unless --top-p 1.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

try:
    from dflash_trt.plugins import dflash_ops, reference as ref
except ImportError:  # not installed: the repository's plugins/ folder
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from plugins import dflash_ops, reference as ref  # type: ignore[no-redef]


def timed(fn, device: str, budget_s: float, max_reps: int = 50) -> float:
    """Median milliseconds per call: at least one rep, more while the budget lasts."""
    fn()  # warm-up (and the JIT build's first call)
    if device == "cuda":
        torch.cuda.synchronize()
    times, spent = [], 0.0
    while len(times) < max_reps and (not times or spent < budget_s):
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
    return statistics.median(times) * 1e3


def runtime_greedy(d, lens, logits, offs):
    """What ModelRunner does today: argmax on the device, .tolist(), dflash_trt.spec.accept per request."""
    from dflash_trt.spec import accept

    choice = torch.argmax(logits, -1).tolist()
    return [accept(dr[:k], choice[o:o + k + 1]) for k, o, dr in zip(lens.tolist(), offs.tolist(), d.tolist())]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936])
    ap.add_argument("--k", type=int, default=15)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--budget", type=float, default=0.5, help="seconds of timing per measurement")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    if not dflash_ops.available():
        print(f"the extension did not build: {dflash_ops.load_error()}")
        return 1
    if dev == "cuda" and not dflash_ops.has_cuda_kernels():
        print("torch has CUDA but the extension was built without CUDA kernels")
        return 1
    ops = torch.ops.dflash_trt
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    g = torch.Generator().manual_seed(0)
    print(f"device {dev} ({torch.cuda.get_device_name() if dev == 'cuda' else f'{torch.get_num_threads()} threads'}),"
          f" torch {torch.__version__}, K = {args.k}, logits {str(dtype).split('.')[-1]}")
    head = f"{'op':<22}{'batch':>6}{'vocab':>8}{'op ms':>10}{'torch ms':>10}{'speedup':>9}  torch version"
    print(head)
    print("-" * len(head))

    def row(name, b, v, op_ms, torch_ms, what):
        print(f"{name:<22}{b:>6}{v:>8}{op_ms:>10.3f}{torch_ms:>10.3f}{torch_ms / op_ms:>8.1f}x  {what}", flush=True)

    k = args.k
    for vocab in args.vocab:
        for b in args.batch:
            n = b * (k + 1)
            lens = torch.full((b,), k, dtype=torch.int64, device=dev)
            offs = torch.arange(b, dtype=torch.int64, device=dev) * (k + 1)
            logits = (torch.randn(n, vocab, generator=g) * 3).to(dtype).to(dev)
            choice = logits.argmax(-1).cpu()
            d = torch.stack([choice[i * (k + 1):i * (k + 1) + k] for i in range(b)])
            for i in range(b):  # accept a different number of drafts per request
                d[i, i % (k + 1):] = (d[i, i % (k + 1):] + 1) % vocab
            d = d.to(dev)
            op_ms = timed(lambda: ops.dflash_greedy_verify(d, lens, logits, offs), dev, args.budget)
            row("greedy_verify", b, vocab, op_ms, timed(lambda: runtime_greedy(d, lens, logits, offs), dev,
                                                        args.budget), "argmax + host accept (runtime)")
            sp = (torch.arange(b, device=dev) * 1000, torch.arange(b, device=dev) + 1,
                  torch.full((b,), 0.8, dtype=torch.float64, device=dev), torch.zeros(b, dtype=torch.int64, device=dev),
                  torch.full((b,), args.top_p, dtype=torch.float64, device=dev))
            op_ms = timed(lambda: ops.dflash_sampling_verify(d, lens, logits, offs, *sp), dev, args.budget)
            row("sampling_verify", b, vocab, op_ms,
                timed(lambda: ref.sampling_verify(d, lens, logits, offs, *sp), dev, args.budget, 3),
                f"reference (T=0.8, top_p={args.top_p})")
    for b in args.batch:  # drafter-side ops: 2048 context tokens per request, Qwen3-8B drafter shapes
        ctx, page = 2048, 16
        starts = torch.full((b,), ctx, dtype=torch.int64, device=dev)
        tables = torch.randperm(b * ctx // page).view(b, ctx // page).to(dev)
        last = torch.zeros(b, dtype=torch.int64, device=dev)
        op_ms = timed(lambda: ops.dflash_prepare_draft_blocks(last, starts, tables, 16, 151669, page, b * ctx), dev,
                      args.budget)
        row("prepare_draft_blocks", b, 0, op_ms,
            timed(lambda: ref.prepare_draft_blocks(last, starts, tables, 16, 151669, page, b * ctx), dev, args.budget),
            f"reference (ctx {ctx})")
        t, kvh, dim = b * (k + 1), 8, 128
        kk, vv = (torch.randn(t, kvh, dim, dtype=dtype, device=dev) for _ in range(2))
        w = torch.ones(dim, dtype=dtype, device=dev)
        cos, sin = (torch.rand(t, dim, dtype=dtype, device=dev) for _ in range(2))
        slots = torch.randperm(4096 * 16, device=dev)[:t]
        kc, vc = (torch.zeros(4096, 16, kvh, dim, dtype=dtype, device=dev) for _ in range(2))
        op_ms = timed(lambda: ops.dflash_context_append(kk, vv, w, cos, sin, slots, kc, vc, 1e-6), dev, args.budget)
        row("context_append", b, 0, op_ms,
            timed(lambda: ref.context_append(kk, vv, w, cos, sin, slots, kc, vc, 1e-6), dev, args.budget),
            f"reference (T={t}, 8x128 heads, one layer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
