"""Tensor parallelism: `mpirun -n 2` ranks reproduce TP=1 greedy (and seeded sampled) outputs exactly."""
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

HERE = os.path.dirname(os.path.abspath(__file__))
needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None,
                                  reason="mpirun not on PATH (pip install mpi4py mpich)")


def prompts(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, tiny.VOCAB, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.fixture(scope="module")
def tp_pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    out = {}
    for name, kw in {"llama": dict(kind="llama"), "qwen3": dict(kind="qwen3", head_dim=32)}.items():
        t = tiny.make_target(str(root / f"{name}_t"), boost_tokens=(11,), boost=5.0, **kw)  # 4 heads, 2 kv heads
        d = tiny.make_drafter(str(root / f"{name}_d"), t, block_size=8, mask_token_id=tiny.mask_proposing(t, 11),
                              residual_scale=0.3)
        out[name] = (t, d)
    return out, root


def run_mpi(root, spec: dict, n: int = 2) -> dict:
    sp, op = root / f"spec_{os.getpid()}.json", root / f"out_{os.getpid()}.json"
    sp.write_text(json.dumps(spec))
    if op.exists():
        op.unlink()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(["mpirun", "-n", str(n), sys.executable, os.path.join(HERE, "tp_worker.py"), str(sp), str(op)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(op.read_text())


@pytest.mark.mpi
@needs_mpirun
@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_tp2_equals_tp1_batched(tp_pairs, name):
    pairs, root = tp_pairs
    t, d = pairs[name]
    ps = prompts(6, seed=len(name))
    if name == "llama":  # greedy only
        sampling = [dict(max_tokens=20, ignore_eos=True)] * len(ps)
    else:  # greedy rows use the distributed argmax, seeded sampled rows gather their full logits
        sampling = [dict(max_tokens=20, ignore_eos=True, **({} if i % 2 else dict(temperature=0.8, top_p=0.9,
                                                                                       seed=i)))
                    for i in range(len(ps))]
    engine = dict(max_draft_len=7, max_batch_size=4, max_num_tokens=48,  # batched, chunked, queued
                  draft_len_policy="fixed",  # every step drafts: the traces compare real drafts
                  draft_weights="auto")  # a sharded drafter keeps its checkpoint's weights; so does the reference
    got = run_mpi(root, {"target": t, "draft": d, "prompts": ps, "sampling": sampling, "engine": engine})
    ref_llm = LLM(target=t, draft=d, trace=True, **engine)
    ref = ref_llm.generate(ps, [SamplingParams(**s) for s in sampling])
    assert got["tp_size"] == 2
    assert got["token_ids"] == [o.token_ids for o in ref]
    assert got["trace"] == [[[list(dr), a] for dr, a in o.trace] for o in ref]  # same drafts, same acceptance
    assert got["accepted"] > 0 and got["accepted"] == sum(o.accepted for o in ref)
    # each rank holds about half the weights (norms, the drafter's fc and the rotary tables are replicated)
    full = ref_llm.engine.weight_bytes
    per_rank = got["weight_bytes_per_rank"]
    assert len(per_rank) == 2 and all(0.45 * full <= b <= 0.6 * full for b in per_rank), (per_rank, full)
    assert got["bytes_per_step"] > 0


@pytest.mark.mpi
@needs_mpirun
def test_mpirun_cli_prints_on_rank0_only(tp_pairs):
    pairs, _ = tp_pairs
    t, d = pairs["llama"]
    ref = LLM(target=t, draft=d).generate(["hello"], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    r = subprocess.run(["mpirun", "-n", "2", sys.executable, "-m", "dflash_trt.cli.generate", "--target", t,
                        "--draft", d, "--prompt", "hello", "--max-tokens", "8", "--json"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 1 and lines[0]["token_ids"] == ref.token_ids


def test_bad_tp_sizes_are_one_line_errors(tp_pairs, tmp_path, capsys):
    pairs, _ = tp_pairs
    t, d = pairs["llama"]
    with pytest.raises(DFlashError, match=r"tp_size 3 is not supported") as e:
        LLM(target=t, draft=d, tp_size=3)
    assert "\n" not in str(e.value)
    with pytest.raises(DFlashError, match=r"tp_size is 2 but 1 rank\(s\) are running: launch with `mpirun -n 2"):
        LLM(target=t, draft=d, tp_size=2)
    one_kv = tiny.make_target(str(tmp_path / "one_kv"), kv_heads=1)
    with pytest.raises(DFlashError, match=r"tp_size 2 does not divide the target's num_key_value_heads 1"):
        LLM(target=one_kv, speculative=False, tp_size=2)
    from dflash_trt.cli.generate import main

    capsys.readouterr()
    assert main(["--target", t, "--draft", d, "--tp-size", "3", "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: tp_size 3 is not supported"), err
