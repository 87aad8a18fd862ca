"""`dflash-build`: a TensorRT-LLM DFlash engine directory from a target + drafter pair, and `--check` of one.

Every user mistake ends as ONE line `error: <problem>: <fix>` on stderr with exit code 2, no traceback, and no
output directory left behind. Unexpected failures print one line too (exit 1); DFLASH_DEBUG=1 shows the traceback.
"""
from __future__ import annotations

import argparse
import os
import sys

EXIT_USAGE = 2
EXIT_INTERNAL = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints usage + error on two lines; keep it to one
        sys.stderr.write(f"error: {message} (see dflash-build --help)\n")
        sys.exit(EXIT_USAGE)


def _tp(value: str) -> int:
    # the supported sizes are the native runtime's (validate.check_flags): only the syntax is checked here
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tp-size {value!r} is not an integer: use 1, 2, 4 or 8") from None


def _int_at_least(flag: str, lo: int, what: str):
    def parse(value: str) -> int:
        try:
            v = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {value!r} is not an integer") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{flag} {v} must be {what}")
        return v
    return parse


def _positive(flag: str):
    return _int_at_least(flag, 1, "a positive integer")


def _nonnegative(flag: str):
    return _int_at_least(flag, 0, "0 or more")


def make_parser() -> argparse.ArgumentParser:
    from .gpus import GPUS
    from .trtllm_schema import TRTLLM_VERSION

    p = _Parser(prog="dflash-build",
                description=f"Build a TensorRT-LLM {TRTLLM_VERSION} DFlash deployment directory: the target "
                            "(BF16, or quantized with NVIDIA ModelOpt), the BF16 drafter, the LLM-API YAML and the "
                            "serve/bench scripts. Or verify one with --check.")
    p.add_argument("--target", metavar="DIR", help="target model: Hugging Face checkpoint directory (Llama, Qwen3, Qwen3-MoE, gpt-oss, Gemma 3 / 4, "
                        "DeepSeek-V3, Kimi K2 / K2.5, MiniMax-M2, Qwen3.5 / Qwen3-Next; docs/families.md)")
    p.add_argument("--draft", metavar="DIR", help="DFlash drafter directory (z-lab or vLLM speculators format; written in the z-lab format)")
    p.add_argument("--output", metavar="DIR", help="engine directory to write (atomically)")
    p.add_argument("--quantization", choices=("bf16", "fp8", "nvfp4"), default="bf16",
                   help="target weights: bf16 copy, or ModelOpt FP8 (Hopper+) / NVFP4 (Blackwell) (default bf16)")
    p.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto",
                   help="fp8 calibrates k/v scales with ModelOpt and sets kv_cache_config.dtype (default auto)")
    p.add_argument("--tp-size", type=_tp, default=1, metavar="N", help="tensor parallel size: 1, 2, 4 or 8 (default 1)")
    p.add_argument("--ep-size", type=_positive("--ep-size"), default=1, metavar="N",
                   help="MoE targets: expert parallel size, a divisor of --tp-size (default 1)")
    p.add_argument("--max-draft-len", type=_positive("--max-draft-len"), metavar="K",
                   help="draft tokens per step, < drafter block_size (default block_size - 1)")
    p.add_argument("--max-seq-len", type=_positive("--max-seq-len"), metavar="N",
                   help="max tokens per request (default min(8192, max_position_embeddings))")
    p.add_argument("--max-batch-size", type=_positive("--max-batch-size"), default=32, metavar="N",
                   help="max concurrent requests (default 32)")
    p.add_argument("--max-num-tokens", type=_positive("--max-num-tokens"), metavar="N",
                   help="max tokens per iteration (default max(min(max_seq_len, 8192), batch x (K+1)))")
    p.add_argument("--calib-data", metavar="PATH",
                   help="calibration JSONL, one {\"text\": ..} or {\"prompt\": ..} per line (default: built-in set)")
    p.add_argument("--calib-samples", type=_positive("--calib-samples"), default=64, metavar="N",
                   help="calibration samples to use (default 64)")
    p.add_argument("--gpu", choices=tuple(GPUS), metavar="GPU",
                   help=f"the serving GPU ({', '.join(GPUS)}): picks the drafter attention backend it has (FA4 on "
                        "Hopper, TRTLLM on Blackwell); default: the portable VANILLA")
    p.add_argument("--kv-cache-reuse", action="store_true",
                   help="prefix caching (TensorRT-LLM block reuse, with a context_recompute_tail for the drafter)")
    p.add_argument("--context-recompute-tail", type=_nonnegative("--context-recompute-tail"), metavar="N",
                   help="with --kv-cache-reuse: prompt tokens recomputed after a cache hit so the drafter has "
                        "context (default 256)")
    p.add_argument("--no-rejection-sampling", dest="rejection_sampling", action="store_false",
                   help="T > 0 requests accept drafts that match the sampled token instead of by rejection "
                        "sampling (use_rejection_sampling: false)")
    p.add_argument("--force", action="store_true", help="replace an existing --output directory")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--check", metavar="ENGINE_DIR",
                   help="verify an engine directory (sha256 of every file, pair validation) and exit")
    return p


def _one_line(msg: str) -> str:
    return " ".join(str(msg).split())


def _print_summary(title: str, rows: list[tuple[str, object]]) -> None:
    width = max(len(k) for k, _ in rows)
    print(title)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")


def _run(args) -> int:
    from .progress import Progress

    progress = Progress(enabled=not args.quiet)
    if args.check is not None:
        build_flags = [f"--{f.replace('_', '-')}" for f in ("target", "draft", "output", "calib_data")
                       if getattr(args, f) is not None]
        if build_flags:
            from .errors import BuildError
            raise BuildError(f"--check verifies an existing engine directory and takes no {', '.join(build_flags)}: "
                             "run the check and the build separately")
        from .check import check_engine

        s = check_engine(args.check, progress)
        _print_summary(f"OK: {s['engine']} matches engine.json", [
            ("files verified", s["files"]), ("architecture", s["architecture"]),
            ("quantization", s["quantization"]), ("kv cache", s["kv_cache_dtype"]), ("tp size", s["tp_size"]),
            ("block size", s["block_size"]), ("max draft len", s["max_draft_len"]),
            ("max seq len", s["max_seq_len"]), ("TensorRT-LLM", s["tensorrt_llm_version"])])
        return 0
    from .errors import BuildError

    missing = [f"--{f}" for f in ("target", "draft", "output") if getattr(args, f) is None]
    if missing:
        raise BuildError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required: "
                         "dflash-build --target DIR --draft DIR --output DIR (or --check ENGINE_DIR)")
    from .build import build_engine
    from .validate import BuildPlan

    plan = BuildPlan(target=args.target, draft=args.draft, output=args.output, quantization=args.quantization,
                     kv_cache_dtype=args.kv_cache_dtype, tp_size=args.tp_size, ep_size=args.ep_size,
                     max_draft_len=args.max_draft_len,
                     max_seq_len=args.max_seq_len, max_batch_size=args.max_batch_size,
                     max_num_tokens=args.max_num_tokens, calib_data=args.calib_data,
                     calib_samples=args.calib_samples, force=args.force, gpu=args.gpu,
                     kv_cache_reuse=args.kv_cache_reuse, context_recompute_tail=args.context_recompute_tail,
                     rejection_sampling=args.rejection_sampling)
    rec = build_engine(plan, progress)
    out = plan.output
    _print_summary(f"built {out}", [
        ("architecture", rec["architecture"]), ("quantization", rec["quantization"]),
        ("kv cache", rec["kv_cache_dtype"]), ("tp size", rec["tp_size"]),
        ("block size / max draft len", f"{rec['block_size']} / {rec['max_draft_len']}"),
        ("max seq len / batch / tokens", f"{rec['max_seq_len']} / {rec['max_batch_size']} / {rec['max_num_tokens']}"),
        ("drafter attention", rec["drafter_attention_backend"]),
        ("kv cache reuse", f"on, recompute tail {rec['context_recompute_tail']}" if rec["kv_cache_reuse"] else "off"),
        ("files (sha256 in engine.json)", len(rec["files"])), ("TensorRT-LLM", rec["tensorrt_llm_version"]),
        *[(f"serve ({s})", os.path.join(out, s, "serve.sh")) for s in rec["stacks"]],
        ("verify", f"dflash-build --check {out}")])
    return 0


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        from dflash_trt.errors import DFlashError
    except Exception as e:  # a broken install: still one line
        sys.stderr.write(f"error: cannot import dflash_trt ({_one_line(e)}): reinstall dflash-trt\n")
        return EXIT_INTERNAL
    try:
        return _run(args)
    except DFlashError as e:
        sys.stderr.write(f"error: {_one_line(e)}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted: nothing was written\n")
        return 130
    except Exception as e:
        if os.environ.get("DFLASH_DEBUG"):
            raise
        sys.stderr.write(f"error: internal failure: {type(e).__name__}: {_one_line(e)[:400]} "
                         "(set DFLASH_DEBUG=1 for the traceback, and report it)\n")
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
