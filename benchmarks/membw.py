"""The floor under a decode step: how fast this machine reads memory and multiplies, and what a step must read
and compute. A memory-bound step cannot beat (weight bytes it reads) / (read bandwidth); a verify block of R
rows cannot beat (its FLOPs) / (the peak rate of its dot products). Other benchmarks import the probes and the
counts; the CLI prints the probes.

    python benchmarks/membw.py [--threads 2] [--mib 512] [--repeats 5]

Read bandwidth is STREAM-like: the best of `repeats` full passes of torch.sum over an fp32 buffer many times the
last-level cache (a reduction reads every byte once and writes nothing). Peak rates are the best of a big
torch matmul at the same thread count, one per kind of dot product a pass's kernels run (`dot_kind`): fp32
(SGEMM), bf16 (bf16 x bf16 -> fp32, what a bf16 model's k-pair kernels run) and int8 (torch._int_mm, what the
W8A8 kernels run): attainable rates, not the data-sheet ones. Best-of-N because a shared machine only ever
slows a pass down.
"""
from __future__ import annotations

import argparse
import time

import torch

GB = 1e9


def _best(fn, repeats: int) -> float:
    fn()  # first touch, page faults, thread pool start
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def read_bandwidth(threads: int | None = None, mib: int = 512, repeats: int = 5) -> float:
    """Bytes per second that one pass of torch.sum reads from a `mib` MiB fp32 buffer (best of `repeats`)."""
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        x = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
        t = _best(lambda: x.sum(), repeats)
        return x.numel() * 4 / t
    finally:
        torch.set_num_threads(old)


KINDS = ("fp32", "bf16", "int8")


def _matmul(kind: str, n: int):
    if kind == "int8":
        a = torch.randint(-127, 128, (n, n), dtype=torch.int8)
        b = torch.randint(-127, 128, (n, n), dtype=torch.int8)
        return lambda: torch._int_mm(a, b)
    a, b = torch.randn(n, n), torch.randn(n, n)
    if kind == "bf16":
        a, b = a.bfloat16(), b.bfloat16()
    return lambda: torch.matmul(a, b)


def _rate(kind: str, n: int, repeats: int) -> float:
    """FLOP/s (2 per multiply-add) of an n x n x n torch matmul of `kind`, best of `repeats`; 0 where this build
    has no such matmul."""
    try:
        return 2.0 * n ** 3 / _best(_matmul(kind, n), repeats)
    except RuntimeError:
        return 0.0


def peaks(kinds, threads: int | None = None, repeats: int = 5, n: int = 1024) -> dict:
    """{kind: peak FLOP/s} for each kind named (KINDS). None below the fp32 rate, probed once: where the CPU
    has no bf16 or int8 dot products (or torch no int8 matmul), our kernels run those formats on fp32 FMAs."""
    assert all(k in KINDS for k in kinds), kinds
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        fp32 = _rate("fp32", n, repeats)
        return {k: fp32 if k == "fp32" else max(_rate(k, n, repeats), fp32) for k in dict.fromkeys(kinds)}
    finally:
        torch.set_num_threads(old)


def _pack_kind(data: torch.Tensor) -> str:
    # bf16 k-pair panels are int16, W8A8 k-quads int32; fp32, widened-bf16, int8 (W8A16) and fp8 panels are
    # widened to fp32 in registers
    return {torch.int16: "bf16", torch.int32: "int8"}.get(data.dtype, "fp32")


def dot_kind(model, *extra) -> str:
    """The dot products that most of a model's packed weight bytes run (KINDS); extra: more PackedLinears read
    in the same pass (a head)."""
    from dflash_trt.plugins.invariant import PackedLinear

    packs = [m.packed for m in model.modules() if isinstance(getattr(m, "packed", None), PackedLinear)]
    by: dict[str, int] = {}
    for p in packs + [p for p in extra if p is not None]:
        kind = _pack_kind(p.data)
        by[kind] = by.get(kind, 0) + p.nbytes()
    return max(by, key=by.get) if by else "fp32"


# -- what a step reads and computes --------------------------------------------------------------------------
def _tensor_bytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _linear_bytes(m) -> int:
    """What the kernel reads for one linear: its packed panels (+ scales) when packed, its native-FP8 weight
    when it has one, else its weight; plus its bias."""
    if getattr(m, "fp8", None) is not None:
        w = _tensor_bytes(m.fp8[0])
    elif getattr(m, "packed", None) is not None:
        w = m.packed.nbytes()
    else:
        w = _tensor_bytes(m.weight)
    return w + _tensor_bytes(getattr(m, "bias", None))


def module_weight_bytes(model: torch.nn.Module, skip=()) -> int:
    """Weight bytes one forward pass over `model` reads: every linear as its kernel reads it, every other
    module's own parameters (norms, router gates), nothing for embedding tables (a step reads one row of them).
    skip: modules left out (a head counted separately)."""
    skipped = {id(m) for m in skip if m is not None}
    total = 0
    for m in model.modules():
        if id(m) in skipped or isinstance(m, torch.nn.Embedding):
            continue
        if hasattr(m, "packed") and isinstance(getattr(m, "weight", None), torch.Tensor):
            total += _linear_bytes(m)
        else:
            total += sum(_tensor_bytes(p) for p in m.parameters(recurse=False))
    return total


def head_bytes(target) -> int:
    """The target's head as the kernels read it: its packed panels, else its weight (the tied embedding
    matrix when the embeddings are tied)."""
    if getattr(target, "head_packed", None) is not None:
        return target.head_packed.nbytes()
    return _tensor_bytes(target.head_weight)


def target_step_bytes(target) -> int:
    """Weight bytes of one target pass (any number of rows): the layers plus the head."""
    return module_weight_bytes(target, skip=(getattr(target, "lm_head", None),)) + head_bytes(target)


def drafter_step_bytes(drafter, target) -> int:
    """Weight bytes of one drafter pass: its layers plus the head rows it drafts with (its draft vocabulary's
    rows of the target's head when it has one, else the whole head)."""
    if getattr(drafter, "vocab_packed", None) is not None:
        head = drafter.vocab_packed.nbytes()
    elif getattr(drafter, "vocab_head", None) is not None:
        head = _tensor_bytes(drafter.vocab_head)
    else:
        head = head_bytes(target)
    return module_weight_bytes(drafter) + head


def linear_macs(model: torch.nn.Module) -> int:
    """Multiply-adds per row of every linear in `model` (out x in of each weight, packed or not)."""
    total = 0
    for m in model.modules():
        if not (hasattr(m, "packed") and isinstance(getattr(m, "weight", None), torch.Tensor)):
            continue
        if m.packed is not None:
            total += m.packed.n * m.packed.k
        elif m.weight.dim() == 2:
            total += m.weight.numel()
    return total


def target_block_flops(target, rows: int) -> float:
    """FLOPs of one target pass over `rows` rows: 2 per multiply-add of its linears and head. Attention is
    left out (a few percent at a few hundred positions), so this is a floor."""
    w = target.head_weight
    head = w.shape[0] * w.shape[1] if getattr(target, "lm_head", None) is None else 0  # an untied head is a linear
    return 2.0 * rows * (linear_macs(target) + head)


def drafter_block_flops(drafter, target, block: int, drafts: int) -> float:
    """FLOPs of one drafter pass: its linears over the `block` rows plus the head over the `drafts` rows it
    drafts from (its draft vocabulary's rows when it has one)."""
    vocab = drafter.vocab_ids.numel() if getattr(drafter, "vocab_ids", None) is not None \
        else target.head_weight.shape[0]
    return 2.0 * (linear_macs(drafter) * block + vocab * target.head_weight.shape[1] * drafts)


def floor_s(nbytes: float, bandwidth: float, flops: float = 0.0, peak: float | None = None) -> float:
    """Roofline floor of one pass: the longer of reading its bytes and computing its FLOPs."""
    return max(nbytes / bandwidth, flops / peak if peak else 0.0)


def pass_peak(peak, kind: str = "fp32") -> float | None:
    """The peak a pass of `kind` runs at: `peak` itself when it is one rate, else peak[kind]."""
    return peak.get(kind, peak.get("fp32")) if isinstance(peak, dict) else peak


def per_token_floor_s(passes, bandwidth: float, peak, tokens_per_step: float = 1.0) -> float:
    """The floor of one decoded token: the floors of a step's passes [(bytes, FLOPs)] or [(bytes, FLOPs, kind)]
    over the tokens a step commits (1 for autoregressive decoding, tau for speculative). peak: one rate for
    every pass, or {kind: rate} (a pass without a kind is fp32)."""
    return sum(floor_s(p[0], bandwidth, p[1], pass_peak(peak, p[2] if len(p) > 2 else "fp32"))
               for p in passes) / tokens_per_step


# -- GGUF files (llama.cpp peers) ----------------------------------------------------------------------------
def gguf_counts(path: str) -> dict:
    """What a llama.cpp pass over this GGUF reads and multiplies: bytes and multiply-adds per row of every
    tensor, the token embedding left out when the model has an output matrix of its own (then it is only
    looked up by row); head_bytes / head_macs: the output matrix (the embedding when tied), 0 without one."""
    from gguf import GGUFReader

    tensors = {t.name: (int(t.n_bytes), int(t.n_elements), len(t.shape)) for t in GGUFReader(path).tensors}
    head = tensors.get("output.weight") or tensors.get("token_embd.weight") or (0, 0, 0)
    if "output.weight" in tensors:
        tensors.pop("token_embd.weight", None)
    return {"bytes": sum(b for b, _, _ in tensors.values()),
            "macs": sum(n for _, n, d in tensors.values() if d == 2),
            "head_bytes": head[0], "head_macs": head[1]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mib", type=int, default=512, help="buffer size (many times the last-level cache)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.threads < 1 or args.mib < 1 or args.repeats < 1:
        raise SystemExit("membw: --threads, --mib and --repeats must be positive")
    bw = read_bandwidth(args.threads, args.mib, args.repeats)
    rates = peaks(KINDS, args.threads, args.repeats)
    print(f"{args.threads} thread(s): read bandwidth {bw / GB:.1f} GB/s (torch.sum over {args.mib} MiB fp32), peak "
          + ", ".join(f"{k} {r / 1e9:.0f}" for k, r in rates.items()) + " GFLOP/s (1024^3 torch matmuls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
