"""The held-out tau of a dflash-train run against training time: a PNG and a markdown table.

    python benchmarks/tau_curve.py RUN_DIR [--png tau_curve.png]

Reads RUN_DIR/checkpoint/history.json (written when a run ends) or, mid-run, the history inside
trainer_state.pt. tau is teacher-forced greedy acceptance on the held-out records with the full head: what
DFlash decoding measures on the target's own greedy text.
"""
from __future__ import annotations

import argparse
import json
import os


def load_history(run: str) -> list[dict]:
    path = os.path.join(run, "checkpoint", "history.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    import torch
    return torch.load(os.path.join(run, "checkpoint", "trainer_state.pt"), weights_only=False)["history"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--png", default="tau_curve.png")
    args = ap.parse_args()
    hist = load_history(args.run)
    print("| step | training minutes (summed step time) | held-out tau (K=7) | held-out loss |")
    print("|---:|---:|---:|---:|")
    for h in hist:
        print(f"| {h['step']} | {h['minutes']:.0f} | {h['tau']:.3f} | {h['eval_loss']:.3f} |")
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    ax.plot([h["minutes"] for h in hist], [h["tau"] for h in hist], "o-")
    ax.set_xlabel("training time (minutes of one CPU core)")
    ax.set_ylabel("held-out tau (tokens per step, K=7)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.png)
    print(f"\nplot: {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
