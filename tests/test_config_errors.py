"""Drafter config variants, and one clear line for every bad target/drafter pair."""
import json
import os
import subprocess
import sys

import pytest
import torch

import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.config import DraftConfig, default_target_layer_ids


def test_default_target_layer_ids_rule():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(32, 5) == [1, 8, 15, 22, 29]
    assert default_target_layer_ids(30, 1) == [15]


@pytest.mark.parametrize("layout", ["top", "all_nested", "default_ids"])
def test_config_variants_load_identically(tmp_path, layout):
    t = tiny.make_target(str(tmp_path / "t"), layers=6)
    ids = default_target_layer_ids(6, 2)
    ref = tiny.make_drafter(str(tmp_path / "ref"), t, layout="nested", target_layer_ids=ids)
    var = tiny.make_drafter(str(tmp_path / "var"), t, layout=layout, target_layer_ids=ids)
    a, b = DraftConfig.from_dir(ref), DraftConfig.from_dir(var)
    assert (a.block_size, a.mask_token_id, a.target_layer_ids) == (b.block_size, b.mask_token_id, b.target_layer_ids)
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    # fixed K: the adaptive policy's K follows step costs measured per engine (timings), not the config
    o1 = LLM(target=t, draft=ref, trace=True, draft_len_policy="fixed").generate([[4, 5, 6]], sp)[0]
    o2 = LLM(target=t, draft=var, trace=True, draft_len_policy="fixed").generate([[4, 5, 6]], sp)[0]
    assert o1.token_ids == o2.token_ids and o1.trace == o2.trace


def edit_config(d, **changes):
    tiny.edit_json(os.path.join(d, "config.json"), **changes)


def run_cli(*args):
    r = subprocess.run([sys.executable, "-m", "dflash_trt.cli.generate", *args, "--prompt", "hi",
                        "--max-tokens", "2"], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stderr.strip()


@pytest.fixture
def pair(tmp_path):
    t = tiny.make_target(str(tmp_path / "t"), layers=4)
    d = tiny.make_drafter(str(tmp_path / "d"), t, block_size=8)
    return t, d


BAD = {
    "hidden": (lambda t, d: edit_config(t, hidden_size=96, head_dim=16), "hidden_size"),
    "vocab": (lambda t, d: edit_config(d, vocab_size=999), "vocab_size"),
    "layer_ids": (lambda t, d: edit_config(d, dflash_config={"mask_token_id": 3, "target_layer_ids": [1, 9]}),
                  "out of range"),
    "mask": (lambda t, d: edit_config(d, dflash_config={"mask_token_id": 5000, "target_layer_ids": [1, 2]}),
             "mask_token_id 5000"),
    "no_mask": (lambda t, d: edit_config(d, dflash_config={"target_layer_ids": [1, 2]}), "mask_token_id"),
    "no_block": (lambda t, d: edit_config(d, block_size=None), "block_size"),
    "heads": (lambda t, d: edit_config(d, num_key_value_heads=3), "num_key_value_heads"),
    "fc": (lambda t, d: edit_config(d, dflash_config={"mask_token_id": 3, "target_layer_ids": [0, 1, 2]}),
           "fc.weight"),
    "arch": (lambda t, d: edit_config(t, model_type="gpt2"), "unsupported target model_type"),
    "no_weights": (lambda t, d: os.remove(os.path.join(d, "model.safetensors")), "no *.safetensors"),
    "corrupt": (lambda t, d: open(os.path.join(d, "model.safetensors"), "wb").write(b"garbage"), "unreadable"),
    "no_config": (lambda t, d: os.remove(os.path.join(t, "config.json")), "config not found"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_pair_one_line_error(pair, case):
    from dflash_trt.errors import DFlashError

    t, d = pair
    breaker, needle = BAD[case]
    breaker(t, d)
    with pytest.raises(DFlashError) as e:
        LLM(target=t, draft=d)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg


@pytest.mark.parametrize("case", ["mask", "corrupt"])
def test_cli_prints_one_line_and_exits_2(pair, case):
    t, d = pair
    breaker, needle = BAD[case]
    breaker(t, d)
    rc, err = run_cli("--target", t, "--draft", d)
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and needle in err, err


def test_max_draft_len_vs_block_size(pair):
    from dflash_trt.errors import DFlashError

    t, d = pair
    with pytest.raises(DFlashError, match="max_draft_len 8 must be between 1 and block_size - 1 = 7"):
        LLM(target=t, draft=d, max_draft_len=8)


def test_missing_directories(tmp_path):
    from dflash_trt.errors import DFlashError

    with pytest.raises(DFlashError, match="target directory not found"):
        LLM(target=str(tmp_path / "nope"), speculative=False)
