"""dflash-train under a real `torchrun --nproc_per_node 2` (gloo, one thread a rank) on a tiny pair: ranks stay
bitwise equal, the run is the single-process run over the same global batches, SIGTERM + --resume continue at the
same step with the same data order, and the exported drafter loads in our runtime and the z-lab reference."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

import tiny

STEPS = 40


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from dflash_trt import LLM, SamplingParams

    root = tmp_path_factory.mktemp("ddp")
    t = tiny.make_target(str(root / "t"), kind="qwen3", layers=2, hidden=32, heads=2, kv_heads=1, head_dim=16,
                         boost_tokens=(11,), boost=5.0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 128, (5,), generator=g).tolist() for _ in range(9)]
    outs = LLM(target=t, speculative=False).generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    data = root / "d.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt_ids": p, "output_ids": o.token_ids}) + "\n"
                            for i, (p, o) in enumerate(zip(prompts, outs))))
    return t, str(data), prompts, outs


def flags(t, data, out):
    return ["--target", t, "--output", str(out), "--data", data, "--block-size", "4", "--num-layers", "1",
            "--mask-token-id", "3", "--split", "first", "--eval-records", "1", "--seqs-per-step", "4",
            "--anchors-per-seq", "8", "--max-steps", str(STEPS), "--save-every", "2", "--log-every", "1",
            "--eval-every", "1000", "--features", "online", "--threads", "1", "--lr", "3e-3"]


def torchrun(args, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "dflash_trt.builder.train_cli", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def state(out):
    return torch.load(os.path.join(out, "checkpoint", "trainer_state.pt"), weights_only=False)


def single_process(t, data, init_dir, tmp_path):
    """The same run in one process, on the trainer directly: per-step losses and final weights."""
    from dflash_trt.builder.train_cli import record_seqs
    from dflash_trt.builder.training.features import read_records
    from dflash_trt.builder.training.online import OnlineFeatures
    from dflash_trt.builder.training.trainer import TrainConfig, Trainer
    from dflash_trt.checkpoint import load_state_dict
    from dflash_trt.config import DraftConfig, TargetConfig
    from dflash_trt.loader import ModelPaths, load_models
    from dflash_trt.models.draft import DFlashDrafter

    tcfg = TargetConfig.from_dir(t)
    dcfg = DraftConfig.from_dir(init_dir, num_target_layers=tcfg.num_hidden_layers)
    target, _ = load_models(ModelPaths(t, None), tcfg, None, torch.float32, "cpu")
    drafter = DFlashDrafter(dcfg)
    drafter.load_weights(load_state_dict(init_dir, "drafter"), torch.float32)
    seqs = record_seqs(read_records(data), 1024)[1:]  # --split first --eval-records 1
    cfg = TrainConfig(block_size=4, anchors_per_seq=8, seqs_per_step=4, lr=3e-3, max_steps=STEPS)
    tr = Trainer(drafter, target.model.embed_tokens.weight.detach(), target.head_weight.detach(), seqs, cfg,
                 str(tmp_path / "single"), log=lambda *_: None, features=OnlineFeatures(target, dcfg.target_layer_ids))
    losses = [tr.train_step()[0] for _ in range(STEPS)]
    return losses, {k: v.detach().clone() for k, v in drafter.state_dict().items()}


def losses_logged(log):
    return {int(m[1]): float(m[2]) for m in re.finditer(r"\bstep (\d+) loss ([\d.]+)", log)}


def test_two_ranks_match_one_process_resume_and_export(pair, tmp_path):
    t, data, prompts, outs = pair
    run = tmp_path / "run"
    # SIGTERM to torchrun mid-run (as Slurm preempts): every rank stops at the same step, rank 0 saves
    proc = torchrun(flags(t, data, run), start_new_session=True)
    ckpt = run / "checkpoint" / "trainer_state.pt"
    deadline = time.time() + 240
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGTERM)
    first = proc.communicate(timeout=120)[0]
    stopped = state(run)["step"]
    assert 2 <= stopped < STEPS, first
    assert f"weights identical on all 2 ranks at step {stopped}" in first, first
    assert "features: online" in first and "2 rank(s) on cpu" in first
    # --resume: the same step on every rank, the data order of an unbroken run
    proc = torchrun(flags(t, data, run) + ["--resume"])
    second = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, second
    assert f"resumed at step {stopped}" in second and f"weights identical on all 2 ranks at step {STEPS}" in second
    before, after = losses_logged(first), losses_logged(second)
    assert sorted(before) == list(range(1, stopped + 1)) and sorted(after) == list(range(stopped + 1, STEPS + 1))

    # one process over the same global batches: the same losses at every step, before and after the resume, and
    # the same weights (a resume that drew other batches would leave both)
    losses, weights = single_process(t, data, str(run / "init"), tmp_path)
    for step, loss in {**before, **after}.items():
        assert abs(loss - losses[step - 1]) < 2e-3, (step, loss, losses[step - 1])
    assert losses[-1] < losses[0] * 0.8, losses  # it learned: the comparison is not of two idle runs
    st = state(run)
    assert st["step"] == STEPS and st["world"] == 2
    for k, v in weights.items():
        assert torch.allclose(st["model"][k], v, atol=1e-4, rtol=1e-3), k

    # the exported drafter: our runtime (lossless) and the z-lab reference load it
    from dflash_trt import LLM, SamplingParams
    d = str(run / "drafter")
    spec = LLM(target=t, draft=d, draft_len_policy="fixed").generate(prompts[:2], SamplingParams(max_tokens=16,
                                                                                               ignore_eos=True))
    assert [o.token_ids for o in spec] == [o.token_ids for o in outs[:2]]
    assert sum(o.accepted for o in spec) > 0
    ref = pytest.importorskip("dflash.model", reason="z-lab reference `dflash` not installed")
    draft = ref.DFlashDraftModel.from_pretrained(d, dtype=torch.float32)
    theirs = dict(draft.named_parameters())
    assert set(theirs) == set(st["model"])
    for k, v in st["model"].items():
        assert torch.equal(theirs[k], v.to(torch.bfloat16).float()), k
