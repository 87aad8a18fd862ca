"""Settings every entry point applies alike: an engine directory's engine.json limits (explicit arguments win),
and the engine seed (requests without a seed of their own draw theirs from it)."""
import json
import shutil

import pytest

import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.cli.common import add_engine_args, engine_kwargs
from dflash_trt.loader import engine_settings, resolve_paths


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny.make_target(str(tmp_path_factory.mktemp("settings") / "t"))


def engine_dir(tmp_path, target, **limits):
    d = tmp_path / "engine"
    shutil.copytree(target, d / "target")
    with open(d / "engine.json", "w") as f:
        json.dump({"format_version": 1, **limits}, f)
    return str(d)


def test_engine_json_limits_apply_unless_given(tmp_path, target):
    e = engine_dir(tmp_path, target, max_seq_len=200, max_batch_size=3, max_num_tokens=96)
    cfg = LLM(e, speculative=False).config
    assert (cfg.max_seq_len, cfg.max_batch_size, cfg.max_num_tokens) == (200, 3, 96)
    cfg = LLM(e, speculative=False, max_seq_len=150).config
    assert (cfg.max_seq_len, cfg.max_batch_size) == (150, 3)  # the explicit argument wins, the rest still apply
    # the CLIs pass only the flags given, so the same reader decides there
    import argparse

    p = argparse.ArgumentParser()
    add_engine_args(p)
    kw = engine_settings(resolve_paths(e, None, None), engine_kwargs(p.parse_args([e, "--max-batch-size", "5"])))
    assert (kw["max_seq_len"], kw["max_batch_size"], kw["max_num_tokens"]) == (200, 5, 96)


def test_a_seeded_engine_samples_the_same_tokens_run_after_run(target):
    ps = [[5, 6, 7, 8], [9, 10, 11]]
    sp = SamplingParams(temperature=2.0, max_tokens=16, ignore_eos=True)  # no seed of its own; flat
    runs = [[o.token_ids for o in LLM(target=target, speculative=False, seed=s).generate(ps, sp)]
            for s in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    unseeded = [[o.token_ids for o in LLM(target=target, speculative=False).generate(ps, sp)] for _ in range(2)]
    assert unseeded[0] != unseeded[1]  # without an engine seed, fresh randomness
