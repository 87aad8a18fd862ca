"""dflash-train's recipe options: D-PACE and exp position weights, the WSD schedule, --init-from, bf16 autocast,
and a run's recipe kept across --resume."""
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_trt.builder.training.trainer import (TrainConfig, autocast, block_loss, dpace_weights, lr_at,
                                                 position_weights)


def _dpace_by_definition(ce, valid, alpha):
    """D-PACE (arXiv:2605.18810 Eq. 7-8, as NVIDIA ModelOpt's DFlash trainer states it), one row at a time:
    q~_i = alpha + (1 - alpha) exp(-ce_i), C_j = prod_{i<=j} q~_i, w_j = sum_{m>=j} C_m; rows without a label
    leave the product unchanged and add nothing."""
    out = torch.zeros_like(ce)
    for n in range(ce.shape[0]):
        c = []
        prod = 1.0
        for j in range(ce.shape[1]):
            if valid[n, j]:
                prod *= alpha + (1 - alpha) * math.exp(-ce[n, j].item())
                c.append(prod)
            else:
                c.append(0.0)
        for j in range(ce.shape[1]):
            out[n, j] = sum(c[j:])
    return out


def test_dpace_and_exp_weights_are_the_published_formulas():
    g = torch.Generator().manual_seed(0)
    ce = torch.rand(3, 7, generator=g) * 4
    valid = torch.ones(3, 7, dtype=torch.bool)
    valid[2, 5:] = False  # a block running past the end of its sequence
    for alpha in (0.5, 0.3, 1.0):
        assert torch.allclose(dpace_weights(ce, valid, alpha), _dpace_by_definition(ce, valid, alpha), atol=1e-6)
    assert torch.allclose(dpace_weights(ce, valid, 1.0)[0], torch.arange(7, 0, -1).float())  # alpha 1: no signal
    assert torch.allclose(position_weights(8, 2.0), torch.exp(-torch.arange(7) / 2.0))  # --gamma 2
    assert torch.allclose(position_weights(5), torch.exp(-torch.arange(4) / 2.5))  # no GAMMA entry: block / 2

    # in the loss: sum(ce * w) / sum(w), w fixed (no gradient through the weights)
    head = torch.randn(50, 8, generator=g)
    hidden = torch.randn(3, 7, 8, generator=g, requires_grad=True)
    labels = torch.randint(0, 50, (3, 7), generator=g)
    labels[2, 5:] = -100
    loss, _ = block_loss(hidden, labels, head, None, dpace_alpha=0.5)
    logits = hidden.reshape(-1, 8) @ head.T
    ce_ref = torch.nn.functional.cross_entropy(logits, labels.flatten(), reduction="none",
                                               ignore_index=-100).view(3, 7)
    w = _dpace_by_definition(ce_ref.detach(), labels != -100, 0.5)
    ref = (ce_ref * w).sum() / w.sum()
    assert torch.allclose(loss, ref, atol=1e-5)
    (g1,) = torch.autograd.grad(loss, hidden)
    (g2,) = torch.autograd.grad(ref, hidden)
    assert torch.allclose(g1, g2, atol=1e-6)


def test_wsd_schedule_at_its_key_steps_and_cosine_unchanged():
    cfg = TrainConfig(lr=1.0, max_steps=100, warmup_frac=0.1, schedule="wsd", decay_frac=0.2)
    got = {s: lr_at(s, cfg) for s in (0, 4, 9, 10, 50, 79, 80, 90, 99)}
    want = {0: 0.1, 4: 0.5, 9: 1.0, 10: 1.0, 50: 1.0, 79: 1.0, 80: 1.0, 90: 0.5, 99: 0.05}
    assert all(abs(got[s] - want[s]) < 1e-9 for s in want), got
    cos = TrainConfig(lr=1.0, max_steps=100, warmup_frac=0.1)
    assert abs(lr_at(10, cos) - 1.0) < 1e-9 and abs(lr_at(55, cos) - 0.5) < 1e-9
    assert lr_at(99, cos) < 1e-3


def test_bf16_autocast_on_cpu_is_asked_for_not_default():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with autocast("cpu"):
        assert (a @ b).dtype == torch.float32
    with autocast("cpu", "bf16"):
        assert (a @ b).dtype == torch.bfloat16
    with autocast("cpu", "float32"):
        assert (a @ b).dtype == torch.float32


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from test_train import _tiny_run_inputs
    return _tiny_run_inputs(tmp_path_factory.mktemp("levers"))


def _source_drafter(tmp_path, t, layers):
    """A drafter directory whose weights are not what a new run would start from (the target's top layers)."""
    from dflash_trt.draft_init import init_drafter_from_target
    src = str(tmp_path / f"src{layers}")
    init_drafter_from_target(t, src, num_layers=layers, block_size=4, mask_token_id=3, target_layer_ids=[0, 1])
    g = torch.Generator().manual_seed(1)
    w = {k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in load_file(src + "/model.safetensors").items()}
    save_file(w, src + "/model.safetensors")
    return src, w


def test_init_from_starts_from_the_source_weights_at_another_block_size_and_refuses_a_misfit(tiny_run, tmp_path,
                                                                                             capsys):
    from dflash_trt.builder.train_cli import main

    t, data = tiny_run
    src, w = _source_drafter(tmp_path, t, layers=2)
    run = tmp_path / "run"
    assert main(["--target", t, "--output", str(run), "--data", str(data), "--eval-records", "1", "--split", "first",
                 "--init-from", src, "--block-size", "6", "--max-steps", "0"]) == 0
    cfg = json.load(open(run / "init" / "config.json"))
    assert cfg["block_size"] == 6 and cfg["num_hidden_layers"] == 2 and cfg["dflash_config"]["mask_token_id"] == 3
    start = torch.load(run / "checkpoint" / "trainer_state.pt", weights_only=False)["model"]
    assert set(start) == set(w) and all(torch.equal(start[k], w[k]) for k in w)  # step 0's weights: the source's
    assert json.load(open(run / "drafter" / "recipe.json"))["init_from"] == src

    capsys.readouterr()
    bad = tmp_path / "bad"
    rc = main(["--target", t, "--output", str(bad), "--data", str(data), "--eval-records", "1", "--split", "first",
               "--init-from", src, "--num-layers", "1", "--max-steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("error: --init-from") and "Traceback" not in "".join(err), err
    assert not bad.exists()  # nothing left behind: the same command works once fixed


def test_recipe_options_survive_resume_and_a_contrary_flag_is_refused(tiny_run, tmp_path, capsys):
    from dflash_trt.builder.train_cli import main

    t, data = tiny_run
    run = tmp_path / "r"
    common = ["--target", t, "--output", str(run), "--data", str(data), "--block-size", "4", "--num-layers", "1",
              "--mask-token-id", "3", "--eval-records", "1", "--split", "first", "--lr", "1e-3", "--log-every", "1"]
    recipe = ["--schedule", "wsd", "--decay-frac", "0.5", "--loss-weights", "dpace", "--dpace-alpha", "0.4",
              "--autocast", "bf16", "--warmup-frac", "0.1"]
    assert main(common + recipe + ["--max-steps", "4"]) == 0
    rec = json.load(open(run / "recipe.json"))
    assert (rec["schedule"], rec["decay_frac"], rec["loss_weights"], rec["dpace_alpha"], rec["autocast"],
            rec["warmup_frac"]) == ("wsd", 0.5, "dpace", 0.4, "bf16", 0.1)
    capsys.readouterr()
    assert main(common + ["--max-steps", "6", "--resume"]) == 0
    err = capsys.readouterr().err
    assert "--loss-weights dpace" in err and "--schedule wsd" in err and "--autocast bf16" in err, err
    # the step-5 line shows the next step's rate: wsd over 6 steps, 3 of cooldown: 1e-3 * (6 - 5) / 3
    assert "step 5 loss" in err and "lr 3.33e-04" in err, err
    assert torch.load(run / "checkpoint" / "trainer_state.pt", weights_only=False)["step"] == 6
    rc = main(common + ["--max-steps", "8", "--resume", "--loss-weights", "exp"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and line.startswith("error:") and "--loss-weights dpace" in line, line
