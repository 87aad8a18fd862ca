"""The held-out tau of a dflash-train run against training time: a PNG and a markdown table.

    python benchmarks/tau_curve.py RUN_DIR [--png tau_curve.png]

Reads RUN_DIR/checkpoint/history.json (written when a run ends) or, mid-run, the history inside
trainer_state.pt. tau is teacher-forced greedy acceptance on the held-out records over random anchors (the
training distribution; runs with a split.json score a sample of their task-held-out set spread over record kinds,
benchmarks/drafter_report.py scores all of it per kind); decode tau, logged by runs since session 6, follows the anchors greedy decoding visits
and is what decoding at K=7 measures (builder/training/trainer.py, decode_anchors).
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
    print("| step | training minutes (summed step time) | held-out tau (K=7) | held-out decode tau | held-out loss |")
    print("|---:|---:|---:|---:|---:|")
    for h in hist:
        dec = f"{h['tau_decode']:.3f}" if "tau_decode" in h else "-"
        print(f"| {h['step']} | {h['minutes']:.0f} | {h['tau']:.3f} | {dec} | {h['eval_loss']:.3f} |")
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    ax.plot([h["minutes"] for h in hist], [h["tau"] for h in hist], "o-", label="tau, random anchors")
    dec = [h for h in hist if "tau_decode" in h]
    if dec:
        ax.plot([h["minutes"] for h in dec], [h["tau_decode"] for h in dec], "s-", label="decode tau")
        ax.legend()
    ax.set_xlabel("training time (minutes of summed step time, 1-2 threads)")
    ax.set_ylabel("held-out tau (tokens per step, K=7)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.png)
    print(f"\nplot: {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
