"""One command for a machine with an NVIDIA GPU and a CUDA build of torch:

    python -m dflash_trt.plugins.gpu_check            # or: python plugins/gpu_check.py
    python -m dflash_trt.plugins.gpu_check --cases 300 --bandwidth 4800

1. builds the ops with their CUDA kernels (JIT, cached), 2. checks every CUDA op against the CPU op (itself
checked against plugins/reference.py by tests/test_plugin_ops.py) on random batches and edge cases, under
CUDA-graph capture, and for run-to-run determinism, 3. times each op against its memory-bound floor (bytes it
must move / HBM bandwidth) and against the pure-PyTorch version on the same GPU, and prints one table.
Exit status: the number of failed checks (0: all good).

Without a GPU, `--emulate` runs the same checks on the CPU emulation of the very same kernels
(csrc/dflash_ops_cuda_emu.h: CTAs as fibers, barriers and warp intrinsics checked for divergence), smaller
and slower (about a second per sampled row); it proves the kernels' logic, not their speed or memory model.

Sampling: a CUDA token may differ from the CPU token only on ties (the CPU top-p sort orders equal
probabilities in an implementation-defined way, the kernel by index: the token must then be the one of the
index-ordered distribution) or when u * total falls within float64 rounding of a CDF step; such differences
are counted and shown, any other difference fails.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

if __package__:
    from . import dflash_ops, reference as ref
else:  # run as a file: python plugins/gpu_check.py
    try:
        from dflash_trt.plugins import dflash_ops, reference as ref
    except ImportError:  # not installed: the repository's plugins/ folder as a package
        import os

        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from plugins import dflash_ops, reference as ref  # type: ignore[no-redef]

# HBM bandwidth by device name (GB/s, vendor peak); others are measured with a device-to-device copy.
PEAK_GBS = {"H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "H200": 4800, "GH200": 4000, "B200": 8000,
            "B300": 8000, "GB200": 8000, "GB300": 8000, "A100": 2039}


# ------------------------------------------------------------------------------------------ batches
def ragged(g, r, k_max, gaps=False):
    lens = torch.randint(0, k_max + 1, (r,), generator=g)
    if r:
        lens[0] = k_max
    offs, at = [], 0
    for k in lens.tolist():
        at += int(torch.randint(0, 3, (1,), generator=g)) if gaps else 0
        offs.append(at)
        at += k + 1
    return lens, torch.tensor(offs, dtype=torch.int64), at


def drafts_for(g, choice, lens, offs, k_max, vocab, mode="random"):
    d = torch.randint(0, max(vocab, 1), (lens.shape[0], k_max), generator=g)
    for i, (k, o) in enumerate(zip(lens.tolist(), offs.tolist())):
        a = k if mode == "all" else 0 if mode == "none" else int(torch.randint(0, k + 1, (1,), generator=g))
        d[i, :a] = choice[o:o + a]
        if a < k:
            d[i, a] = (choice[o + a] + 1) % max(vocab, 2)
    return d


def logits_for(g, n, vocab, dtype, kind="randn"):
    if kind == "ties":
        x = torch.randint(-2, 3, (n, vocab), generator=g).float()
    elif kind == "peaked":
        x = torch.randn(n, vocab, generator=g) * 12
    else:
        x = torch.randn(n, vocab, generator=g) * 3
    return x.to(dtype)


def sampling_params(g, r, vocab):
    pick = lambda xs: xs[int(torch.randint(0, len(xs), (1,), generator=g))]  # noqa: E731
    return (torch.randint(0, 100000, (r,), generator=g),
            torch.randint(-2 ** 62, 2 ** 62, (r,), generator=g),
            torch.tensor([pick([0.0, 1e-3, 0.3, 0.7, 1.0, 1.6]) for _ in range(r)], dtype=torch.float64),
            torch.tensor([pick([0, 1, 2, 20, 50, vocab - 1, vocab]) for _ in range(r)]),
            torch.tensor([pick([1.0, 0.99, 0.9, 0.5, 0.05]) for _ in range(r)], dtype=torch.float64))


class Report:
    def __init__(self, verbose=True):
        self.failures, self.verbose, self.notes = 0, verbose, []

    def check(self, ok: bool, what: str):
        if not ok:
            self.failures += 1
            print(f"FAIL {what}", flush=True)

    def note(self, line: str):
        self.notes.append(line)
        if self.verbose:
            print(line, flush=True)


class Target:
    """Where the kernels under test run: the GPU (torch.ops.dflash_trt on CUDA tensors) or their CPU emulation
    (torch.ops.dflash_emu on CPU tensors)."""

    def __init__(self, emulate: bool):
        self.emulate = emulate
        self.ops = load_emulated() if emulate else torch.ops.dflash_trt

    def put(self, xs):
        if self.emulate:
            return list(xs)
        return [x.cuda() if isinstance(x, torch.Tensor) else x for x in xs]


def load_emulated():
    """Builds (cached) the CPU emulation of the CUDA kernels + the CUDA glue: ops torch.ops.dflash_emu.*."""
    import hashlib
    import importlib
    import os

    build = importlib.import_module(dflash_ops.__package__ + ".build")
    CSRC, build_dir, load_extension = build.CSRC, build.build_dir, build.load_extension

    if hasattr(torch.ops.dflash_emu, "dflash_greedy_verify"):
        return torch.ops.dflash_emu
    parts = ["dflash_ops_cuda.cu", "dflash_ops_cuda.cuh", "dflash_ops_cuda_glue.cpp", "dflash_ops_cuda_emu.h",
             "dflash_ops.h", "dflash_ops_common.h"]
    h = hashlib.sha256(b"".join(open(os.path.join(CSRC, f), "rb").read() for f in parts)).hexdigest()[:16]
    d = build_dir("dflash_ops_emu_src", [])
    wrappers = []
    for name, src in (("emu_kernels.cpp", "dflash_ops_cuda.cu"), ("emu_glue.cpp", "dflash_ops_cuda_glue.cpp")):
        path = os.path.join(d, name)
        with open(path, "w") as f:  # the hash makes the build directory follow the included sources
            f.write(f"// sources {h}\n#define DFLASH_CUDA_EMU 1\n#include \"{os.path.join(CSRC, src)}\"\n")
        wrappers.append(path)
    load_extension("dflash_ops_emu", wrappers, extra_cflags=[f"-I{CSRC}", "-DDFLASH_CUDA_EMU", "-fno-strict-aliasing"])
    return torch.ops.dflash_emu


def _same(a, b):
    return all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b))


# --------------------------------------------------------------------------------------------- checks
def check_prepare(g, rep: Report, cases: int, dev: Target):
    ops = torch.ops.dflash_trt
    for case in range(cases):
        r = int(torch.randint(0, 70, (1,), generator=g)) if case % 10 else 0
        page = int(torch.randint(1, 65, (1,), generator=g))
        starts = torch.randint(0, 3000 if case % 7 else 100000, (r,), generator=g)
        mb = max(1, int((starts.max() if r else 0) + page - 1) // page)
        tables = torch.randint(0, 100000, (r, mb), generator=g, dtype=torch.int64)
        if case % 2:
            tables = tables.int()
        args = (torch.randint(0, 150000, (r,), generator=g), starts, tables, 16, 151669, page,
                int(starts.sum()) + int(torch.randint(0, 50, (1,), generator=g)))
        rep.check(_same(dev.ops.dflash_prepare_draft_blocks(*dev.put(args)), ops.dflash_prepare_draft_blocks(*args)),
                  f"prepare_draft_blocks case {case}")


def check_greedy(g, rep: Report, cases: int, dev: Target):
    ops = torch.ops.dflash_trt
    configs = [(1, 15, 151936), (16, 15, 49152), (64, 15, 151936), (7, 1, 1000), (5, 3, 1)]
    if dev.emulate:
        configs = [(1, 15, 151936), (2, 15, 49152), (7, 1, 1000), (5, 3, 1)]
    most_r, most_v = (8, 20000) if dev.emulate else (40, 70000)
    for case in range(cases):
        r, k_max, vocab = configs[case % len(configs)] if case < 2 * len(configs) else (
            int(torch.randint(1, most_r, (1,), generator=g)), [1, 4, 15][case % 3],
            int(torch.randint(1, most_v, (1,), generator=g)))
        dtype = [torch.bfloat16, torch.float32, torch.float16, torch.float64][case % 4]
        lens, offs, n = ragged(g, r, k_max, gaps=case % 3 == 0)
        logits = logits_for(g, n, vocab, dtype, ["randn", "ties", "peaked"][case % 3])
        if case % 11 == 5:
            logits[0, vocab // 2] = float("nan")
            logits[-1] = float("-inf")
        if case % 2:  # rows that start off 16-byte alignment: a row-strided view
            logits = torch.cat([logits, logits[:, :3]], 1)[:, 1:vocab + 1]
        choice = torch.argmax(logits, -1)
        d = drafts_for(g, choice, lens, offs, k_max, vocab, ["random", "all", "none"][case % 3])
        args = (d, lens, logits, offs)
        rep.check(_same(dev.ops.dflash_greedy_verify(*dev.put(args)), ops.dflash_greedy_verify(*args)),
                  f"greedy_verify case {case} (R={r} K={k_max} V={vocab} {dtype})")
    empty = (torch.zeros(0, 4, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), torch.zeros(0, 50),
             torch.zeros(0, dtype=torch.int64))
    rep.check([t.shape for t in dev.ops.dflash_greedy_verify(*dev.put(empty))] == [(0,), (0,), (0, 5), (0,)],
              "greedy_verify on an empty batch")


def _legit_difference(logits_row, tok_gpu, tok_cpu, temp, top_k, top_p, seed, pos) -> str | None:
    """Why a device token may differ from the CPU token: 'tie' when it is the token of the same distribution
    with equal probabilities at the top-p cut ordered by index (the CPU sort orders them its own way),
    'rounding' when u * total or the top-p mass lies within float64 rounding of a step; None otherwise."""
    if tok_gpu == ref.sample_one(logits_row, temp, top_k, top_p, seed, pos, stable=True):
        return "tie"
    probs = ref.filtered_probs(logits_row[None], temp, top_k, top_p, stable=True)[0]
    cdf = probs.cumsum(0)
    u = float(ref.uniforms(torch.tensor([seed]), torch.tensor([pos]))[0])
    lo, hi = min(tok_gpu, tok_cpu), max(tok_gpu, tok_cpu)
    if ((cdf[lo:hi + 1] - u * float(cdf[-1])).abs() < 1e-12).any():
        return "rounding"
    full = ref.filtered_probs(logits_row[None], temp, top_k, 1.0)[0].sort(descending=True).values.cumsum(0)
    if top_p < 1 and ((full - top_p).abs() < 1e-12).any():
        return "rounding"
    return None


def check_sampling(g, rep: Report, cases: int, dev: Target):
    ops = torch.ops.dflash_trt
    rows = same = ties = rounding = 0
    configs = [(1, 15, 151936), (16, 15, 49152), (4, 15, 151936), (5, 3, 1)]
    if dev.emulate:  # about a second per emulated row
        configs = [(1, 2, 151936), (2, 3, 700), (3, 1, 1)]
    most_r, most_k, most_v = (3, 3, 1500) if dev.emulate else (12, 15, 5000)
    for case in range(cases):
        r, k_max, vocab = configs[case % len(configs)] if case < 2 * len(configs) else (
            int(torch.randint(1, most_r + 1, (1,), generator=g)), [1, 4, 15][case % 3] if most_k > 3 else
            [1, 2, 3][case % 3], int(torch.randint(1, most_v, (1,), generator=g)))
        dtype = [torch.bfloat16, torch.float32, torch.float16][case % 3]
        lens, offs, n = ragged(g, r, k_max, gaps=case % 4 == 0)
        logits = logits_for(g, n, vocab, dtype, ["randn", "ties", "peaked", "randn"][case % 4])
        sp = sampling_params(g, r, vocab)
        want0 = ops.dflash_sampling_verify(torch.zeros(r, k_max, dtype=torch.int64), lens, logits, offs, *sp)[0]
        d = drafts_for(g, want0, lens, offs, k_max, vocab, ["random", "all", "none"][case % 3])
        args = (d, lens, logits, offs) + sp
        want = ops.dflash_sampling_verify(*args)
        got = [t.cpu() for t in dev.ops.dflash_sampling_verify(*dev.put(args))]
        again = [t.cpu() for t in dev.ops.dflash_sampling_verify(*dev.put(args))] if not dev.emulate else got
        rep.check(_same(got, again), f"sampling_verify case {case}: not deterministic")
        # acceptance must follow the GPU's own choices exactly
        rep.check(_same(got[1:], ref._accept(d, lens, offs, got[0])), f"sampling_verify case {case}: acceptance")
        rows += n
        diff = (got[0] != want[0]).nonzero().flatten().tolist()
        same += n - len(diff)
        owners = ref.row_owners(lens, offs, n)
        for i in diff:
            rr, j = owners[i]
            why = None
            if rr >= 0 and float(sp[2][rr]) > 0:
                why = _legit_difference(logits[i], int(got[0][i]), int(want[0][i]), float(sp[2][rr]),
                                        int(sp[3][rr]), float(sp[4][rr]), int(sp[1][rr]), int(sp[0][rr]) + j + 1)
            ties += why == "tie"
            rounding += why == "rounding"
            rep.check(why is not None, f"sampling_verify case {case} row {i}: device {int(got[0][i])} vs CPU "
                                       f"{int(want[0][i])}")
    rep.note(f"sampling_verify: {same}/{rows} rows identical to the CPU op; of the others {ties} are top-p ties "
             f"taken in index order, {rounding} within float64 rounding of a step")


def check_context_append(g, rep: Report, cases: int, dev: Target):
    ops = torch.ops.dflash_trt
    worst = 0.0
    for case in range(cases):
        xt, wt, ct, cache_t = [(torch.bfloat16,) * 4, (torch.float32,) * 4, (torch.float16,) * 4,
                               (torch.bfloat16, torch.float32, torch.bfloat16, torch.bfloat16)][case % 4]
        t, kvh, d = int(torch.randint(0, 300, (1,), generator=g)), [1, 2, 8][case % 3], [64, 128, 256][case % 3]
        blocks, page = 64, 16
        t = min(t, blocks * page)
        k = (torch.randn(t, kvh, d, generator=g) * 2).to(xt)
        v = torch.randn(t, kvh, d, generator=g).to(xt)
        w = (1 + 0.3 * torch.randn(d, generator=g)).to(wt)
        ang = torch.rand(t, d // 2, generator=g) * 1000
        cos, sin = torch.cat([ang.cos()] * 2, -1).to(ct), torch.cat([ang.sin()] * 2, -1).to(ct)
        slots = torch.randperm(blocks * page, generator=g)[:t]
        slots[torch.rand(t, generator=g) < 0.1] = -1
        kc, vc = (torch.randn(blocks, page, kvh, d, generator=g).to(cache_t) for _ in range(2))
        kg, vg = dev.put([kc.clone(), vc.clone()])
        ops.dflash_context_append(k, v, w, cos, sin, slots, kc, vc, 1e-6)
        dev.ops.dflash_context_append(*dev.put([k, v, w, cos, sin, slots]), kg, vg, 1e-6)
        rep.check(torch.equal(vg.cpu(), vc), f"context_append case {case}: v")
        diff = (kg.cpu().float() - kc.float()).abs().max().item() if kc.numel() else 0.0
        worst = max(worst, diff)
        tol = {torch.float32: 1e-4, torch.bfloat16: 2 ** -4, torch.float16: 2 ** -7}[cache_t]
        rep.check(diff <= tol, f"context_append case {case}: k differs by {diff}")
    rep.note(f"context_append: worst |CUDA - CPU| on k = {worst:.3g} (summation order of the mean of squares)")


def check_graph_capture(g, rep: Report):
    """The ops record into a CUDA graph and replay with new inputs copied into the same buffers."""
    ops = torch.ops.dflash_trt
    r, k_max, vocab = 8, 15, 49152
    lens, offs, n = ragged(g, r, k_max)
    logits = logits_for(g, n, vocab, torch.bfloat16).cuda()
    sp = [x.cuda() for x in sampling_params(g, r, vocab)]
    d = torch.zeros(r, k_max, dtype=torch.int64, device="cuda")
    lens, offs = lens.cuda(), offs.cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            ops.dflash_greedy_verify(d, lens, logits, offs)
            ops.dflash_sampling_verify(d, lens, logits, offs, *sp)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g = ops.dflash_greedy_verify(d, lens, logits, offs)
        out_s = ops.dflash_sampling_verify(d, lens, logits, offs, *sp)
    logits.copy_(logits_for(g, n, vocab, torch.bfloat16).cuda())
    d.copy_(drafts_for(g, logits.argmax(-1).cpu(), lens.cpu(), offs.cpu(), k_max, vocab).cuda())
    graph.replay()
    torch.cuda.synchronize()
    rep.check(_same(out_g, ops.dflash_greedy_verify(d, lens, logits, offs)), "greedy_verify under CUDA graph replay")
    rep.check(_same(out_s, ops.dflash_sampling_verify(d, lens, logits, offs, *sp)),
              "sampling_verify under CUDA graph replay")


def run_checks(cases: int = 200, verbose: bool = True, seed: int = 0, emulate: bool = False) -> int:
    dflash_ops.load()
    if not emulate and not dflash_ops.has_cuda_kernels():
        print("FAIL the extension has no CUDA kernels (torch without CUDA, or CUDA_HOME not found)")
        return 1
    dev = Target(emulate)
    g = torch.Generator().manual_seed(seed)
    rep = Report(verbose)
    t0 = time.time()
    check_prepare(g, rep, cases, dev)
    check_greedy(g, rep, cases, dev)
    check_sampling(g, rep, max(cases // (8 if emulate else 2), 4), dev)
    check_context_append(g, rep, max(cases // 2, 8), dev)
    if not emulate:
        check_graph_capture(g, rep)
        torch.cuda.synchronize()
    rep.note(f"checks: {rep.failures} failed ({time.time() - t0:.1f} s)")
    return rep.failures


# --------------------------------------------------------------------------------------------- timing
def bandwidth_gbs(override: float | None) -> tuple[float, str]:
    if override:
        return override, "given"
    name = torch.cuda.get_device_name()
    for key in sorted(PEAK_GBS, key=len, reverse=True):
        if key in name:
            return float(PEAK_GBS[key]), f"{key} peak"
    x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB copy: read + write
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    t = cuda_time(lambda: y.copy_(x), 10)
    return 2 * x.numel() * 4 / t / 1e3, "measured copy"


def cuda_time(fn, reps: int = 50) -> float:
    """Median microseconds per call (CUDA events)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def torch_greedy(d, lens, logits, offs):
    """The pure-PyTorch step the runtime does today: argmax on the device, then acceptance on the host."""
    choice = torch.argmax(logits, -1).tolist()
    out = []
    for k, o, dr in zip(lens.tolist(), offs.tolist(), d.tolist()):
        a = 0
        while a < k and dr[a] == choice[o + a]:
            a += 1
        out.append(dr[:a] + [choice[o + a]])
    return out


def torch_sampling(d, lens, logits, offs, starts, seeds, temp, top_k, top_p):
    """dflash_trt.plugins.reference.sampling_verify (per-row filtered_probs on the device)."""
    return ref.sampling_verify(d, lens, logits, offs, starts, seeds, temp, top_k, top_p)


def timing_table(bw_override: float | None, reps: int = 50):
    ops = torch.ops.dflash_trt
    g = torch.Generator().manual_seed(1)
    bw, bw_src = bandwidth_gbs(bw_override)
    rows = []

    def add(op, cfg, nbytes, fn, torch_fn=None, torch_reps=5):
        us = cuda_time(fn, reps)
        floor = nbytes / (bw * 1e3)
        tus = cuda_time(torch_fn, torch_reps) if torch_fn else float("nan")
        rows.append((op, cfg, nbytes, floor, us, tus))

    for vocab in (49152, 151936):
        for batch in (1, 16, 64):
            k = 15
            lens = torch.full((batch,), k, dtype=torch.int64)
            offs = torch.arange(batch, dtype=torch.int64) * (k + 1)
            n = batch * (k + 1)
            logits = logits_for(g, n, vocab, torch.bfloat16).cuda()
            d = drafts_for(g, logits.argmax(-1).cpu(), lens, offs, k, vocab).cuda()
            lens_c, offs_c = lens.cuda(), offs.cuda()
            cfg = f"B={batch} K={k} V={vocab} bf16"
            nbytes = n * vocab * 2
            add("greedy_verify", cfg, nbytes, lambda: ops.dflash_greedy_verify(d, lens_c, logits, offs_c),
                lambda: torch_greedy(d, lens_c, logits, offs_c))
            for label, tk, tp in (("T=0.8", 0, 1.0), ("T=0.8 top_p=0.9", 0, 0.9), ("T=0.8 top_k=50", 50, 1.0)):
                sp = (torch.arange(batch) * 100, torch.arange(batch) + 7,
                      torch.full((batch,), 0.8, dtype=torch.float64), torch.full((batch,), tk),
                      torch.full((batch,), tp, dtype=torch.float64))
                sp_c = [x.cuda() for x in sp]
                add("sampling_verify", f"{cfg} {label}", nbytes,
                    lambda: ops.dflash_sampling_verify(d, lens_c, logits, offs_c, *sp_c),
                    (lambda: torch_sampling(d, lens_c, logits, offs_c, *sp_c)) if batch == 1 else None, 2)
    for batch in (1, 16, 64):
        ctx = 4096
        starts = torch.full((batch,), ctx, dtype=torch.int64).cuda()
        tables = torch.randperm(batch * ctx // 16).view(batch, ctx // 16).cuda()
        last = torch.zeros(batch, dtype=torch.int64).cuda()
        nbytes = batch * ctx * 8 + tables.numel() * 8 + batch * 16 * 16 + batch * 8 * 3
        add("prepare_draft_blocks", f"B={batch} ctx={ctx} page=16 B=16", nbytes,
            lambda: ops.dflash_prepare_draft_blocks(last, starts, tables, 16, 151669, 16, batch * ctx),
            lambda: ref.prepare_draft_blocks(last, starts, tables, 16, 151669, 16, batch * ctx), 3)
    for t in (16, 256, 1024):
        kvh, dim = 8, 128
        k, v = (torch.randn(t, kvh, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w = torch.ones(dim, device="cuda", dtype=torch.bfloat16)
        cos, sin = (torch.rand(t, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        slots = torch.randperm(4096, device="cuda")[:t]
        kc, vc = (torch.zeros(256, 16, kvh, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        nbytes = 4 * t * kvh * dim * 2 + 2 * t * dim * 2 + t * 8
        add("context_append", f"T={t} KVH={kvh} D={dim} bf16", nbytes,
            lambda: ops.dflash_context_append(k, v, w, cos, sin, slots, kc, vc, 1e-6),
            lambda: ref.context_append(k, v, w, cos, sin, slots, kc, vc, 1e-6))
    print(f"\n{torch.cuda.get_device_name()}, HBM {bw:.0f} GB/s ({bw_src}); floor = bytes moved / bandwidth; "
          "torch = the pure-PyTorch version on the same GPU")
    head = f"{'op':<21}{'config':<38}{'MB':>9}{'floor us':>10}{'op us':>10}{'of floor':>10}{'torch us':>11}"
    print(head)
    print("-" * len(head))
    for op, cfg, nbytes, floor, us, tus in rows:
        t = f"{tus:>10.1f}" if tus == tus else f"{'-':>10}"
        print(f"{op:<21}{cfg:<38}{nbytes / 1e6:>9.2f}{floor:>10.1f}{us:>10.1f}{floor / us:>9.0%} {t}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=200, help="random cases per op (default 200)")
    ap.add_argument("--bandwidth", type=float, default=None, help="HBM GB/s for the floor (default: by name)")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--emulate", action="store_true",
                    help="no GPU: run the checks on the CPU emulation of the CUDA kernels (no timing)")
    args = ap.parse_args(argv)
    if args.emulate:
        t0 = time.time()
        load_emulated()
        print(f"built/loaded the emulated kernels in {time.time() - t0:.1f} s", flush=True)
        failures = run_checks(args.cases if args.cases != 200 else 40, emulate=True)
        print(f"\n{'OK' if failures == 0 else 'FAILED'}: {failures} failed checks (CPU emulation)")
        return min(failures, 125)
    if not torch.cuda.is_available():
        print("no CUDA device: run this on a GPU machine with a CUDA build of torch")
        return 1
    t0 = time.time()
    dflash_ops.load()
    print(f"built/loaded the extension in {time.time() - t0:.1f} s; torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}", flush=True)
    failures = run_checks(args.cases)
    if not args.no_timing:
        timing_table(args.bandwidth, args.reps)
    print(f"\n{'OK' if failures == 0 else 'FAILED'}: {failures} failed checks")
    return min(failures, 125)


if __name__ == "__main__":
    sys.exit(main())
