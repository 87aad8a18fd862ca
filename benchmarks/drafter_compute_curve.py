"""Decode tau of each shipped embedded drafter against the CPU-hours spent on it, the log-linear fit, and the
compute that fit says the [drafter] targets would take.

    python benchmarks/drafter_compute_curve.py POINTS.csv [--png drafter_compute_curve.png]
        [--targets 2.15,1.75]

POINTS.csv: `drafter,cpu_hours,humaneval,mtbench` per shipped drafter: cumulative CPU-hours (training, feature
extraction and data generation, A/B arms included) and decode tau at K = 7, teacher-forced, on the target's own
answers to the first 32 prompts, to EOS (benchmarks/drafter_report.py). Each set is fitted as
tau = a + b log2(hours): b is the gain per doubling of compute.
"""
from __future__ import annotations

import argparse
import csv
import math


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b log2(x)."""
    lx = [math.log2(x) for x in xs]
    mx, my = sum(lx) / len(lx), sum(ys) / len(ys)
    b = sum((u - mx) * (v - my) for u, v in zip(lx, ys)) / sum((u - mx) ** 2 for u in lx)
    return my - b * mx, b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("points")
    ap.add_argument("--png", default="drafter_compute_curve.png")
    ap.add_argument("--targets", default="2.15,1.75", help="the issue's decode-tau targets: HumanEval,MT-Bench")
    args = ap.parse_args()
    with open(args.points) as f:
        rows = list(csv.DictReader(f))
    hours = [float(r["cpu_hours"]) for r in rows]
    targets = dict(zip(("humaneval", "mtbench"), (float(t) for t in args.targets.split(","))))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    print("| set | gain per doubling | last | target | CPU-hours the fit needs |\n|---|---:|---:|---:|---:|")
    for key, label, colour in (("humaneval", "HumanEval", "tab:blue"), ("mtbench", "MT-Bench", "tab:orange")):
        ys = [float(r[key]) for r in rows]
        a, b = fit(hours, ys)
        need = 2 ** ((targets[key] - a) / b) if b > 0 else math.inf
        print(f"| {label} | {b:+.3f} | {ys[-1]:.3f} | {targets[key]:.2f} | {need:,.0f} |")
        ax.plot(hours, ys, "o-", color=colour, label=f"{label} (fit {b:+.3f} per doubling)")
        span = [min(hours), max(need, max(hours)) if need < 1e4 else 1e4]
        grid = [span[0] * (span[1] / span[0]) ** (i / 50) for i in range(51)]
        ax.plot(grid, [a + b * math.log2(x) for x in grid], ":", color=colour)
        ax.axhline(targets[key], color=colour, lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("CPU-hours spent on the drafter (cumulative)")
    ax.set_ylabel("decode tau, K = 7 (first 32 prompts, to EOS)")
    ax.set_title("Embedded drafter: acceptance per CPU-hour (dashed: the targets)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
