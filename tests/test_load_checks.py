"""What is checked before anything loads, each failure one line naming the file or flag and the fix (exit 2, no
output): engine files against engine.json's sha256 and every weights file against its safetensors header (a
flipped bit, a truncated file), a corrupt engine.json, `--draft` without `--target`, `--device cuda` without a
GPU, a tensor-parallel size that does not divide the heads; and the KV cache's size options."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import DFlashError


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from dflash_trt.builder.cli import main as build_main

    root = tmp_path_factory.mktemp("checks")
    t = tiny.make_target(str(root / "t"))
    d = tiny.make_drafter(str(root / "d"), t)
    out = str(root / "engine")
    assert build_main(["--target", t, "--draft", d, "--output", out, "--quiet"]) == 0
    return out


def copy_engine(engine, tmp_path) -> str:
    dst = str(tmp_path / "engine")
    shutil.copytree(engine, dst)
    return dst


def generate(*args):
    r = subprocess.run([sys.executable, "-m", "dflash_trt.cli.generate", *args, "--prompt", "hi", "--max-tokens",
                        "2"], capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr.strip()


def one_line_error(rc, out, err, *needles):
    assert rc == 2 and out == "" and "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith("error: ") and all(n in last for n in needles), err
    return last


def flip_a_weight_bit(path: str) -> None:
    """One bit in the tensor data (past the header): the file still parses, its numbers differ."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        f.seek(8 + n + 100)
        b = f.read(1)[0]
        f.seek(8 + n + 100)
        f.write(bytes([b ^ 0x10]))


def test_an_intact_engine_loads_after_its_hashes_are_checked(engine, capsys):
    from dflash_trt.loader import report_stages

    report_stages(sys.stderr)
    try:
        LLM(engine, max_seq_len=128)
    finally:
        report_stages(None)
    err = capsys.readouterr().err
    n = sum(1 for r in json.load(open(os.path.join(engine, "engine.json")))["files"] if r.split("/")[0] in
            ("target", "draft"))
    assert f"sha256 of {n} engine files" in err and "loaded the target" in err and "loaded the drafter" in err
    assert "KV cache: " in err and "B/token) + " in err  # target and drafter context, bytes per token


@pytest.mark.parametrize("which", ["draft/model.safetensors", "target/model.safetensors"])
def test_a_flipped_bit_is_refused_at_load(engine, tmp_path, which):
    e = copy_engine(engine, tmp_path)
    flip_a_weight_bit(os.path.join(e, which))
    with pytest.raises(DFlashError) as ex:
        LLM(e, max_seq_len=128)
    msg = str(ex.value)
    assert which in msg and "sha256" in msg and "dflash-build --force" in msg and "--verify-files none" in msg
    assert "\n" not in msg
    one_line_error(*generate(e), which, "does not match")
    LLM(e, max_seq_len=128, verify_files="size")  # the size is right: only the hash catches a flipped bit
    LLM(e, max_seq_len=128, verify_files="none")  # trusted storage: nothing checked, it loads


def test_a_truncated_weights_file_is_refused_in_every_mode_but_none(engine, tmp_path):
    e = copy_engine(engine, tmp_path)
    path = os.path.join(e, "target", "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 64)
    for mode in ("sha256", "size"):
        with pytest.raises(DFlashError, match=f"target/model.safetensors is unreadable or damaged \\({size - 64} "
                                              f"bytes where its header says {size}\\)"):
            LLM(e, max_seq_len=128, verify_files=mode)
    # a plain checkpoint directory (no engine.json): the header check still runs
    with pytest.raises(DFlashError, match="model.safetensors is unreadable or damaged.*copy or download it again"):
        LLM(target=os.path.join(e, "target"), speculative=False, max_seq_len=128)


def test_corrupt_engine_json_is_one_line(engine, tmp_path):
    e = copy_engine(engine, tmp_path)
    with open(os.path.join(e, "engine.json"), "w") as f:
        f.write('{"format_version": 1, "files": {')
    one_line_error(*generate(e), "engine.json is unreadable", "dflash-build --force")
    with open(os.path.join(e, "engine.json"), "w") as f:
        f.write("[1, 2]")
    one_line_error(*generate(e), "not an engine record")


def test_flag_mistakes_are_one_line(engine):
    one_line_error(*generate("--draft", os.path.join(engine, "draft")), "needs its target", "--target")
    if not torch.cuda.is_available():
        one_line_error(*generate(engine, "--device", "cuda"), "--device cuda: no CUDA GPU", "--device cpu")
    one_line_error(*generate(engine, "--device", "tpu"), "--device tpu")
    r = subprocess.run([sys.executable, "-m", "dflash_trt.cli.generate", engine, "--kv-cache-bytes", "lots",
                        "--prompt", "hi"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "'lots' is not a size" in r.stderr and "Traceback" not in r.stderr


def test_tp_size_that_does_not_divide_the_heads_names_the_sizes_that_do(tmp_path):
    from dflash_trt.config import TargetConfig
    from dflash_trt.tensor_parallel import validate_tp

    nine = TargetConfig.from_dir(tiny.make_target(str(tmp_path / "nine"), hidden=72, heads=9, kv_heads=3))
    with pytest.raises(DFlashError) as ex:
        validate_tp(2, nine, None)
    assert "num_attention_heads 9" in str(ex.value) and "use tp_size 1 (`mpirun -n 1`" in str(ex.value)
    twelve = TargetConfig.from_dir(tiny.make_target(str(tmp_path / "twelve"), hidden=96, heads=12, kv_heads=6))
    with pytest.raises(DFlashError, match="use tp_size 1 or 2 "):
        validate_tp(4, twelve, None)


def test_kv_cache_bytes_fraction_and_the_memory_capped_default(engine, monkeypatch):
    from dflash_trt import memory

    sp = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    ref = LLM(engine, max_seq_len=128, max_batch_size=2)
    small = LLM(engine, max_seq_len=128, max_batch_size=2, kv_cache_bytes=1 << 18)
    assert small.engine.kv_plan.total_bytes <= 1 << 18 < ref.engine.kv_plan.total_bytes
    assert small.generate([[5, 6, 7]], sp)[0].token_ids == ref.generate([[5, 6, 7]], sp)[0].token_ids
    # the default is the workload's: max_batch_size sequences of max_seq_len (+ one block each)
    plan = ref.engine.kv_plan
    assert plan.num_blocks == 2 * (128 // plan.page + 1)
    weights = memory.weight_file_bytes(ref.paths)
    monkeypatch.setattr(memory, "free_bytes", lambda device: weights + (8 << 20))  # a machine with 8 MiB to spare
    frac = LLM(engine, max_seq_len=128, max_batch_size=2, kv_cache_fraction=0.25)
    assert frac.config.kv_cache_bytes == 2 << 20 and frac.engine.kv_plan.total_bytes <= 2 << 20
    big = LLM(engine, max_seq_len=128, max_batch_size=64)  # the workload wants more than half of what is free
    assert big.config.kv_cache_bytes == 4 << 20 and big.engine.kv_plan.total_bytes <= 4 << 20
    with pytest.raises(DFlashError, match="kv_cache_fraction .* must be in"):
        LLM(engine, kv_cache_fraction=1.5)
    with pytest.raises(DFlashError, match="not both"):
        LLM(engine, kv_cache_fraction=0.5, kv_cache_bytes=1 << 20)
