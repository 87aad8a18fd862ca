"""A drafter with a smaller draft vocabulary: the most frequent label tokens that cover a share of the labels.

    python -m dflash_trt.builder.vocab_trim DRAFTER --data DATA.jsonl --coverage 0.995 --output DIR

On a CPU the drafter's head is a large part of its pass: every drafted row scores every draft_vocab.json row (16,847
for the embedded pair, 39 MB of fp32 weights read per pass). Answers spend most of their tokens on few ids, so the
rows that cover 99.5% of the label tokens are a fraction of the rows the labels ever used; the rest cost a pass
each time and win a draft rarely. Frequencies come from the training records of DATA (dflash-train's task split,
builder/training/split.py), and coverage is reported on its held-out records too. DIR gets the drafter's files and the
trimmed draft_vocab.json; output is unchanged (drafts are proposals), only acceptance and speed move.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import torch

from ..draft_vocab import FILE, load_draft_vocab, save_draft_vocab
from ..errors import DFlashError


def label_counts(records: list[dict], vocab_size: int) -> torch.Tensor:
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for r in records:
        counts += torch.bincount(torch.tensor(r["output_ids"], dtype=torch.int64), minlength=vocab_size)
    return counts


def covering_ids(counts: torch.Tensor, coverage: float, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """The fewest ids (sorted) whose counts reach `coverage` of all counts, among `allowed` ids when given; ties in
    count go to the lower id, so the result is a pure function of the counts."""
    if not 0.0 < coverage <= 1.0:
        raise DFlashError(f"--coverage {coverage}: give a share in (0, 1], e.g. 0.995")
    c = counts.clone()
    if allowed is not None:
        mask = torch.zeros_like(c, dtype=torch.bool)
        mask[allowed] = True
        c[~mask] = 0
    total = int(c.sum())
    if total == 0:
        raise DFlashError("the data has no label tokens among the drafter's vocabulary: give the target's answers")
    order = torch.sort(-c, stable=True).indices  # stable: equal counts stay in id order
    cum = torch.cumsum(c[order], 0)
    n = int(torch.searchsorted(cum, torch.tensor(coverage * total, dtype=cum.dtype), right=False)) + 1
    return torch.sort(order[:min(n, int((c > 0).sum()))]).values


def covered(counts: torch.Tensor, ids: torch.Tensor) -> float:
    total = int(counts.sum())
    return float(counts[ids].sum()) / total if total else 1.0


def trim(drafter: str, data: str, coverage: float, output: str, log=print) -> dict:
    from ..config import read_json
    from .training.features import read_records
    from .training.split import split_records

    if os.path.exists(output):
        raise DFlashError(f"--output {output} exists: give a new directory")
    vocab_size = int(read_json(os.path.join(drafter, "config.json"), what="drafter")["vocab_size"])
    held, train = split_records(read_records(data, vocab_size))
    if not train:
        raise DFlashError(f"{data} has no training records to count label tokens in")
    before = load_draft_vocab(drafter, vocab_size)
    counts = label_counts(train, vocab_size)
    ids = covering_ids(counts, coverage, before)
    held_counts = label_counts(held, vocab_size)
    report = {"rows_before": vocab_size if before is None else int(before.numel()), "rows_after": int(ids.numel()),
              "train_coverage": covered(counts, ids), "heldout_coverage": covered(held_counts, ids),
              "heldout_coverage_before": covered(held_counts, before) if before is not None else 1.0,
              "train_records": len(train), "heldout_records": len(held)}
    parent = os.path.dirname(os.path.abspath(output))
    tmp = tempfile.mkdtemp(prefix=".vocab_trim-", dir=parent)
    try:
        for name in os.listdir(drafter):
            src = os.path.join(drafter, name)
            if name != FILE and os.path.isfile(src):
                shutil.copy2(src, os.path.join(tmp, name))
        save_draft_vocab(tmp, ids, f"vocab_trim: the {ids.numel()} label tokens of {os.path.basename(data)}'s "
                                   f"training split covering {report['train_coverage']:.4f} of its labels")
        os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"draft vocabulary {report['rows_before']} -> {report['rows_after']} rows; label coverage "
        f"{report['train_coverage']:.4f} training, {report['heldout_coverage']:.4f} held out "
        f"(was {report['heldout_coverage_before']:.4f}) -> {output}")
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drafter")
    ap.add_argument("--data", required=True, help="the target's answers (JSONL dflash-train reads)")
    ap.add_argument("--coverage", type=float, default=0.995)
    ap.add_argument("--output", required=True)
    args = ap.parse_args(argv)
    try:
        trim(args.drafter, args.data, args.coverage, args.output)
    except DFlashError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
