"""builder/vocab_trim.py: the fewest frequent label tokens covering a share, written beside a copy of the drafter."""
import json
import os

import pytest
import torch

from dflash_trt.builder.vocab_trim import covering_ids, label_counts, main, trim
from dflash_trt.draft_vocab import load_draft_vocab, save_draft_vocab
from tiny import VOCAB, make_drafter, make_target


def test_covering_ids_are_the_fewest_most_frequent():
    counts = torch.tensor([0, 50, 30, 10, 5, 5, 0, 0])
    assert covering_ids(counts, 0.5).tolist() == [1]
    assert covering_ids(counts, 0.8).tolist() == [1, 2]
    assert covering_ids(counts, 0.9).tolist() == [1, 2, 3]
    assert covering_ids(counts, 0.95).tolist() == [1, 2, 3, 4]  # a tie goes to the lower id
    assert covering_ids(counts, 1.0).tolist() == [1, 2, 3, 4, 5]  # never an id the labels do not use
    assert covering_ids(counts, 0.9, allowed=torch.tensor([2, 3, 4, 5])).tolist() == [2, 3, 4]


def test_trim_writes_a_drafter_whose_vocab_covers_the_labels(tmp_path):
    target = make_target(str(tmp_path / "t"))
    drafter = make_drafter(str(tmp_path / "d"), target)
    save_draft_vocab(drafter, torch.arange(4, 40), "test")
    gen = torch.Generator().manual_seed(0)
    data = tmp_path / "data.jsonl"
    with open(data, "w") as f:
        for i in range(40):  # a skewed label distribution over ids 4..39 and a few ids outside the vocab
            out = (torch.multinomial(torch.arange(VOCAB, 0, -1).float() ** 4, 60, True, generator=gen) % 45) + 4
            f.write(json.dumps({"id": i, "kind": "magpie-1", "prompt": f"request number {i} about {i * 7}",
                                "prompt_ids": [1, 2, 3], "output_ids": out.tolist()}) + "\n")
    out_dir = str(tmp_path / "trimmed")
    rep = trim(drafter, str(data), 0.9, out_dir, log=lambda *_: None)
    ids = load_draft_vocab(out_dir, VOCAB)
    assert 0 < rep["rows_after"] == ids.numel() < 36 and bool(((ids >= 4) & (ids < 40)).all())
    assert sorted(os.listdir(out_dir)) == sorted(os.listdir(drafter))
    from dflash_trt.builder.training.features import read_records
    from dflash_trt.builder.training.split import split_records
    train = split_records(read_records(str(data), VOCAB))[1]
    counts = label_counts(train, VOCAB)
    inside = counts[4:40].sum()
    least = ids[counts[ids].argmin()]
    assert counts[ids].sum() >= 0.9 * inside > counts[ids].sum() - counts[least]  # the fewest that reach 0.9


def test_bad_input_is_one_line(tmp_path, capsys):
    target = make_target(str(tmp_path / "t"))
    drafter = make_drafter(str(tmp_path / "d"), target)
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"id": 0, "prompt_ids": [1], "output_ids": [5, 6]}) + "\n")
    assert main([drafter, "--data", str(data), "--coverage", "1.5", "--output", str(tmp_path / "o")]) == 2
    assert "--coverage 1.5" in capsys.readouterr().err and not (tmp_path / "o").exists()
    assert main([drafter, "--data", str(data), "--output", drafter]) == 2
    assert "exists" in capsys.readouterr().err
