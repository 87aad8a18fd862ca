"""dflash-bench: a concurrency sweep of DFlash against autoregressive decoding on benchmark prompts.

    dflash-bench [ENGINE_DIR | --target DIR --draft DIR] --dataset humaneval|mtbench|speed-bench:PATH|jsonl:PATH
                 --concurrency 1,2,4,8,16,32 --num-requests N --max-tokens N [--temperature T]
                 [--modes ar,dflash] [--draft-lens 3,7,15] --output DIR [--recommend]
                 [--export-trtllm-bench FILE] [--threads N]

No model arguments: the embedded SmolLM2-135M pair. For each mode x draft length one engine is loaded and reused
across concurrencies; each point is a closed loop keeping `concurrency` requests in flight over the prompts.
Writes OUTPUT/report.json (schema dflash-bench v1), OUTPUT/table.txt, OUTPUT/pareto.png and, with --recommend,
OUTPUT/draft_len_schedule.json (+ .yaml, a TensorRT-LLM speculative_config fragment). Under mpirun every rank
runs the (tensor-parallel) engines; only rank 0 drives the loop, prints and writes.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..cli.common import add_load_args, load_kwargs, user_errors
from ..errors import DFlashError
from . import datasets as D
from .metrics import DEFINITIONS
from .recommend import recommend, schedule_json, trtllm_yaml
from .report import build_report, plot_pareto, table_text, make_table, validate_report, write_json
from .sweep import (Encoder, ModelSpec, SweepConfig, Variant, encode_requests, is_main_process, run_sweep,
                    world_size)

DEFAULT_MAX_TOKENS = 256
MODES = ("ar", "dflash", "ngram")


def int_list(text: str, flag: str) -> list[int]:
    try:
        vals = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise DFlashError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise DFlashError(f"{flag} takes positive integers, got {text!r}")
    return sorted(set(vals))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dflash-bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="engine directory from dflash-build, or a target checkpoint directory "
                   "(default: the embedded SmolLM2-135M pair)")
    p.add_argument("--target", help="Hugging Face target checkpoint directory")
    p.add_argument("--draft", help="DFlash drafter directory (z-lab format)")
    p.add_argument("--dataset", default="humaneval", help="humaneval | mtbench | speed-bench:PATH | jsonl:PATH")
    p.add_argument("--category", help="keep only prompts of this category (mtbench, speed-bench, jsonl)")
    p.add_argument("--concurrency", default="1,2,4,8", help="requests kept in flight, comma-separated")
    p.add_argument("--num-requests", type=int, default=32, help="requests per point (the dataset is cycled if "
                   "shorter)")
    p.add_argument("--max-tokens", type=int, help=f"output tokens per request (default: the dataset's "
                   f"output_tokens, else {DEFAULT_MAX_TOKENS})")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0, help="request i samples with seed SEED+i")
    p.add_argument("--respect-eos", action="store_true", help="stop at EOS (default: ignore it, so every request "
                   "makes exactly its output tokens, as trtllm-bench does)")
    p.add_argument("--no-chat", action="store_true", help="do not apply the chat template to text prompts")
    p.add_argument("--modes", default="ar,dflash", help="comma-separated: ar, dflash, ngram (prompt lookup, no drafter)")
    p.add_argument("--draft-lens", help="DFlash draft lengths, comma-separated (default: block_size - 1)")
    p.add_argument("--output", default="dflash-bench-out", help="output directory")
    p.add_argument("--recommend", action="store_true", help="write the best draft length per batch size as a "
                   "draft_len_schedule")
    p.add_argument("--export-trtllm-bench", metavar="FILE", help="also write the requests as a trtllm-bench "
                   "dataset (JSONL)")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16")
    p.add_argument("--device", help="cpu | cuda (default: cuda when available)")
    p.add_argument("--max-num-tokens", type=int, default=2048, help="rows per engine iteration")
    p.add_argument("--max-seq-len", type=int, help="default: the longest prompt + its output, page-rounded")
    p.add_argument("--tp-size", type=int, help="tensor-parallel ranks (default: engine.json's tp_size, else the "
                   "number of ranks mpirun started)")
    p.add_argument("--min-draft-confidence", type=float, help="cut drafts before the first the drafter doubts "
                   "(default: the engine's, 0.4 on CPU with the adaptive policy; 0 turns it off)")
    add_load_args(p)
    return p


def model_spec(args, modes: list[str]) -> ModelSpec:
    kw = dict(dtype=args.dtype, device=args.device, max_num_tokens=args.max_num_tokens)
    if args.tp_size is not None:
        kw["tp_size"] = args.tp_size
    if args.min_draft_confidence is not None:
        kw["min_draft_confidence"] = args.min_draft_confidence
    kw.update(load_kwargs(args))
    if args.model or args.target:
        return ModelSpec(model=args.model, target=args.target, draft=args.draft, engine_kwargs=kw)
    if args.draft:
        raise DFlashError("--draft needs --target (or an engine directory)")
    from ..embedded import embedded_paths

    target, draft = embedded_paths("dflash" in modes)
    return ModelSpec(target=target, draft=draft, embedded=True, engine_kwargs=kw)


def model_info(spec: ModelSpec, enc: Encoder) -> dict:
    trained = None
    if spec.embedded:
        from ..embedded import drafter_is_trained
        trained = drafter_is_trained()
    absp = lambda p: None if p is None else os.path.abspath(p)  # noqa: E731
    return {"target": absp(enc.paths.target), "draft": absp(enc.paths.draft),
            "engine_dir": absp(spec.model) if enc.paths.engine else None, "embedded": spec.embedded,
            "drafter_trained": trained}


def parse_modes(args) -> list[str]:
    modes = [m.strip().lower() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise DFlashError(f"--modes takes {', '.join(MODES)} (comma-separated), got {args.modes!r}")
    if args.recommend and "dflash" not in modes:
        raise DFlashError("--recommend compares draft lengths: include dflash in --modes")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise DFlashError("--max-tokens must be >= 1")
    return [m for m in MODES if m in modes]


def run_config(args, conc, modes, draft_lens, reqs) -> dict:
    import torch

    return {"dataset": args.dataset, "category": args.category, "num_requests": len(reqs),
            "max_tokens": args.max_tokens, "temperature": args.temperature, "concurrency": conc, "modes": modes,
            "draft_lens": [k if k is not None else "default" for k in draft_lens], "seed": args.seed,
            "ignore_eos": not args.respect_eos, "chat": not args.no_chat, "threads": torch.get_num_threads(),
            "device": args.device or ("cuda" if torch.cuda.is_available() else "cpu"), "dtype": args.dtype,
            "num_devices": world_size(), "max_num_tokens": args.max_num_tokens,
            "min_draft_confidence": args.min_draft_confidence}


@user_errors
def main(argv=None) -> int:
    args = parser().parse_args(argv)
    conc = int_list(args.concurrency, "--concurrency")
    modes = parse_modes(args)
    draft_lens = int_list(args.draft_lens, "--draft-lens") if args.draft_lens else [None]
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    main_proc = is_main_process()
    say = (lambda *a, **k: print(*a, **k, file=sys.stderr, flush=True)) if main_proc else (lambda *a, **k: None)

    from ..loader import report_stages

    report_stages()
    spec = model_spec(args, modes)
    ds = D.load_dataset(args.dataset, args.category)
    chosen, cycled = D.select(ds.requests, args.num_requests)
    if cycled:
        say(f"[dflash-bench] {ds.name} has {len(ds.requests)} prompts: cycled {cycled} time(s) to make "
            f"{args.num_requests} requests")
    enc = Encoder(spec)
    reqs = encode_requests(enc, chosen, DEFAULT_MAX_TOKENS, args.max_tokens, chat=not args.no_chat)
    out = os.path.abspath(args.output)
    files = {"report": os.path.join(out, "report.json"), "table": os.path.join(out, "table.txt"),
             "pareto": os.path.join(out, "pareto.png")}
    if main_proc:
        os.makedirs(out, exist_ok=True)
        if args.export_trtllm_bench:
            D.write_trtllm_bench(args.export_trtllm_bench, [r.input_ids for r in reqs], [r.max_tokens for r in reqs])
            files["trtllm_bench_dataset"] = os.path.abspath(args.export_trtllm_bench)
            say(f"[dflash-bench] trtllm-bench dataset: {files['trtllm_bench_dataset']}")
    if max(conc) > len(reqs):
        say(f"[dflash-bench] note: concurrency {max(conc)} > {len(reqs)} requests: those points never fill up")

    variants = [Variant("ar", None)] if "ar" in modes else []
    variants += [Variant(m, k) for m in ("dflash", "ngram") if m in modes for k in draft_lens]
    lens = [len(r.input_ids) for r in reqs]
    config = run_config(args, conc, modes, draft_lens, reqs)
    dataset = {"name": ds.name, "source": ds.source, "num_prompts": len(ds.requests),
               "rejected_placeholders": ds.rejected, "cycled": cycled, "notes": ds.notes,
               "prompt_tokens": {"mean": sum(lens) / len(lens), "min": min(lens), "max": max(lens)}}
    model = model_info(spec, enc)
    if spec.embedded and model["drafter_trained"] is False and "dflash" in modes:
        say("[dflash-bench] NOTE: the embedded drafter is UNTRAINED: expect tau ~1 and DFlash slower than AR")

    def report(points, rec, complete):
        return build_report(config, model, dataset, points, rec, files, complete, DEFINITIONS)

    def on_point(point):
        if main_proc:
            write_json(files["report"], report(points_so_far + [point], None, False))
        points_so_far.append(point)

    points_so_far: list[dict] = []
    from tqdm import tqdm

    total = len(variants) * len(conc) * len(reqs)
    with tqdm(total=total, unit="req", disable=not main_proc, file=sys.stderr, dynamic_ncols=True) as bar:
        points = run_sweep(spec, SweepConfig(conc, variants, args.temperature, args.seed, not args.respect_eos,
                                             args.max_seq_len, world_size()), reqs, on_point=on_point,
                           progress=bar)
    if not main_proc:
        return 0
    write_outputs(args, points, report, files, config, model, ds, reqs, out)
    return 0


def write_outputs(args, points, report, files, config, model, ds, reqs, out) -> None:
    """report.json, table.txt, pareto.png (and the recommended schedule), then the table on stdout."""
    rec = None
    if args.recommend:
        rec = recommend(points)
        files["draft_len_schedule"] = os.path.join(out, "draft_len_schedule.json")
        files["draft_len_schedule_yaml"] = os.path.join(out, "draft_len_schedule.yaml")
        rec = {**rec, "draft_len_schedule_json": schedule_json(rec["draft_len_schedule"]),
               "trtllm_yaml": trtllm_yaml(rec, model["draft"])}
    title = f"dflash-bench: {ds.name}, {len(reqs)} requests x {args.max_tokens or 'dataset'} tokens, " \
            f"T={args.temperature}, {config['threads']} threads, {config['device']}"
    rep = report(points, rec, True)
    errs = validate_report(rep)
    if errs:  # a bug here, not a user error: say so loudly but keep the data
        print("[dflash-bench] WARNING: report schema problems: " + "; ".join(errs[:5]), file=sys.stderr)
    write_json(files["report"], rep)
    with open(files["table"], "w", encoding="utf-8") as f:
        f.write(table_text(points, title))
    plot_pareto(points, files["pareto"], title=f"{os.path.basename(model['target'])} on {ds.name} "
                f"({config['device']}, {config['threads']} threads)")
    if rec is not None:
        write_json(files["draft_len_schedule"], rec["draft_len_schedule_json"])
        with open(files["draft_len_schedule_yaml"], "w", encoding="utf-8") as f:
            f.write(rec["trtllm_yaml"])
    from rich.console import Console

    con = Console(width=None if sys.stdout.isatty() else 130)
    con.print(make_table(points, title))
    if rec is not None:
        con.print(f"recommended draft_len_schedule (max_draft_len {rec['max_draft_len']}): "
                  f"{rec['draft_len_schedule_json']}")
        for n in rec["notes"]:
            con.print(f"  note: {n}")
    for k, v in files.items():
        con.print(f"{k}: {v}")


if __name__ == "__main__":
    sys.exit(main())
