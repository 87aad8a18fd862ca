"""Shared CLI plumbing: user errors become one line on stderr and exit code 2, never a traceback."""
from __future__ import annotations

import argparse
import functools
import sys

from ..errors import DFlashError


def user_errors(main):
    @functools.wraps(main)
    def wrapped(argv=None):
        try:
            return main(argv)
        except DFlashError as e:
            from ..distributed import is_driver_process

            if is_driver_process():  # under mpirun every rank fails alike: one line, from rank 0
                print(f"error: {e}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130
    return wrapped


def add_engine_args(p, default_max_tokens: int = 256, tensor_parallel: bool = False) -> None:
    p.add_argument("model", nargs="?", help="engine directory from dflash-build, or a target checkpoint "
                   "directory (default: the embedded SmolLM2-135M pair)")
    p.add_argument("--target", help="Hugging Face target checkpoint directory")
    p.add_argument("--draft", help="DFlash drafter directory (z-lab format)")
    p.add_argument("--max-draft-len", type=int, help="draft tokens per step (<= block_size - 1)")
    p.add_argument("--draft-len-policy", choices=("adaptive", "fixed"), help="adaptive (default): each request's "
                   "draft length from its acceptance and this machine's step costs, 0 where drafting would be slower "
                   "than plain decoding; fixed: max-draft-len every step, as TensorRT-LLM drafts")
    p.add_argument("--spec", choices=("dflash", "ngram", "none"), help="speculative method: dflash (the "
                   "drafter; default), ngram (prompt lookup: drafts copied from the request's own earlier tokens, no "
                   "drafter needed), none (autoregressive)")
    p.add_argument("--no-spec", action="store_true", help="plain autoregressive decoding (= --spec none)")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16")
    p.add_argument("--device", help="cpu | cuda (default: cuda when available)")
    # None: the engine directory's engine.json value, else the engine default (loader.engine_settings)
    p.add_argument("--max-batch-size", type=int, help="default: engine.json's, else 32")
    p.add_argument("--max-num-tokens", type=int, help="default: engine.json's, else 2048")
    p.add_argument("--max-seq-len", type=int, help="default: engine.json's, else 4096")
    if tensor_parallel:
        p.add_argument("--tp-size", type=int, help="tensor-parallel ranks (default: engine.json's tp_size, "
                       "else the MPI world size: `mpirun -n 2 dflash-generate ...`)")
    add_load_args(p)


def add_load_args(p) -> None:
    """KV-cache size, the target's weight format and load-time checks: dflash-generate, dflash-serve and
    dflash-bench."""
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--kv-cache-bytes", type=byte_size, metavar="SIZE", help="KV cache bytes, target and drafter "
                    "pools together (512M, 4G, 2GiB or a number; default: max-batch-size sequences of max-seq-len, "
                    "at most 2 GiB and half the memory free at start less the weights)")
    kv.add_argument("--kv-cache-fraction", type=float, metavar="F", help="give the KV cache this fraction (0..1] "
                    "of the memory free at start, less the weights")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=None, help="share the "
                   "cache blocks of common prompt prefixes between requests (default: on, except for targets no "
                   "shared block can serve: hybrid linear-attention and sliding-window pools)")
    p.add_argument("--weights", metavar="FORMAT", help="the target's weights on CPU: auto (as the checkpoint "
                   "loads; default) | bf16 | int8 | w8a8 | fp8 (per-channel, quantised at load, 1 byte per weight; "
                   "w8a8 also quantises activations per row for integer dot products; the drafter keeps its own)")
    p.add_argument("--draft-weights", metavar="FORMAT", help="the drafter's own linears and draft head on CPU, "
                   "as --weights (default: what --weights says, and w8a8 where --weights is auto and the CPU has "
                   "integer dot products; auto: the checkpoint's)")
    p.add_argument("--verify-files", choices=("sha256", "size", "none"), default="sha256", help="before loading: "
                   "sha256 (default): an engine directory's target/ and draft/ files against engine.json, and "
                   "every weights file's size against its header; size: the sizes only; none: nothing (trusted "
                   "storage)")


def byte_size(text: str) -> int:
    """'4G', '512MiB', '1.5GB', '1073741824' -> bytes (powers of 1024: a cache is laid out in them)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    try:
        n = float(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write e.g. 512M, 4G or 1073741824") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the size must be positive")
    return int(n)


def load_kwargs(args) -> dict:
    kw = {"verify_files": args.verify_files}
    if args.prefix_caching is not None:
        kw["enable_prefix_caching"] = args.prefix_caching
    if args.kv_cache_bytes is not None:
        kw["kv_cache_bytes"] = args.kv_cache_bytes
    if args.kv_cache_fraction is not None:
        kw["kv_cache_fraction"] = args.kv_cache_fraction
    if args.weights is not None:  # checked by EngineConfig, in one line
        kw["weights"] = args.weights
    if args.draft_weights is not None:
        kw["draft_weights"] = args.draft_weights
    return kw


def engine_kwargs(args) -> dict:
    kw = dict(dtype=args.dtype, device=args.device)
    for k in ("max_batch_size", "max_num_tokens", "max_seq_len"):
        if getattr(args, k) is not None:
            kw[k] = getattr(args, k)
    if args.max_draft_len is not None:
        kw["max_draft_len"] = args.max_draft_len
    if args.draft_len_policy is not None:
        kw["draft_len_policy"] = args.draft_len_policy
    if getattr(args, "tp_size", None) is not None:
        kw["tp_size"] = args.tp_size
    return kw


def make_llm(args, **extra):
    from ..llm import LLM
    from ..loader import report_stages

    report_stages()
    return LLM(args.model, target=args.target, draft=args.draft, speculative=spec_method(args),
               **engine_kwargs(args), **load_kwargs(args), **extra)


def spec_method(args):
    """LLM's `speculative` from --spec / --no-spec."""
    if args.no_spec or args.spec == "none":
        return False
    return args.spec or True
