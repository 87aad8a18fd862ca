"""Prompts whose answers repeat their input: "add type hints to this function" over Python standard-library
functions (no evaluation set), for the n-gram proposer, written as a dflash-bench JSONL dataset.

    python benchmarks/input_grounded.py --num 16 --output /tmp/typehints.jsonl
    dflash-bench --dataset jsonl:/tmp/typehints.jsonl --modes ar,ngram --concurrency 1 --respect-eos \\
        --max-tokens 256 --num-requests 16
"""
from __future__ import annotations

import argparse
import inspect
import json
import textwrap

MODULES = ("textwrap", "shlex", "fnmatch", "colorsys", "bisect", "heapq", "statistics", "string", "calendar",
           "posixpath", "glob", "difflib", "base64", "html", "quopri", "netrc", "sched", "graphlib")


def functions(num: int, max_lines: int = 25) -> list[str]:
    """Short, self-contained module-level functions, in a fixed order."""
    import importlib

    out = []
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        for fname, fn in sorted(vars(mod).items()):
            if fname.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != name:
                continue
            try:
                src = textwrap.dedent(inspect.getsource(fn))
            except (OSError, TypeError):
                continue
            if 4 <= src.count("\n") <= max_lines:
                out.append(src)
            if len(out) >= num:
                return out
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num", type=int, default=16)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    srcs = functions(args.num)
    with open(args.output, "w") as f:
        for src in srcs:
            prompt = f"Rewrite this Python function with type hints. Keep everything else the same.\n\n{src}"
            f.write(json.dumps({"prompt": prompt}) + "\n")
    print(f"{len(srcs)} prompts -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
