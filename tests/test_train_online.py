"""The loss over the vocabulary head in chunks, online target features, and the GPU step benchmark's CPU side."""
import json
import os
import subprocess
import sys

import torch

import tiny
from dflash_trt.builder.training.trainer import block_loss, plain_block_loss, position_weights

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "train_gpu_step.py")


def test_chunked_cross_entropy_is_the_plain_one_in_value_and_gradient():
    g = torch.Generator().manual_seed(0)
    n, k, h, v = 3, 5, 16, 97
    hidden = torch.randn(n, k, h, generator=g, dtype=torch.float64, requires_grad=True)
    head = torch.randn(v, h, generator=g, dtype=torch.float64)
    labels = torch.randint(0, v, (n, k), generator=g)
    labels[1, 3:] = -100  # past the end of a sequence
    w = position_weights(k + 1).double()
    ref = plain_block_loss(hidden, labels, head, w, 0.7)
    (g_ref,) = torch.autograd.grad(ref, hidden)
    for chunk in (1, 4, 7, 1000):  # chunks that split rows unevenly, and one chunk for all
        loss, correct = block_loss(hidden, labels, head, w, 0.7, chunk=chunk)
        (g_chunk,) = torch.autograd.grad(loss * 3.0, hidden)  # a scaled upstream gradient reaches every row
        assert torch.allclose(loss, ref, rtol=1e-12, atol=1e-12)
        assert torch.allclose(g_chunk, 3.0 * g_ref, rtol=1e-10, atol=1e-12)
        pred = (hidden.detach().reshape(-1, h) @ head.T).argmax(-1).view(n, k)
        assert torch.equal(correct, (pred == labels) & (labels != -100))
    with torch.no_grad():  # evaluation: no gradient kept, same value
        assert torch.allclose(block_loss(hidden, labels, head, w, 0.7, chunk=4)[0], ref)


def test_chunked_cross_entropy_over_a_bf16_head_keeps_float32_rows_and_gradients():
    """The GPU layout: a bf16 head, float32 drafter rows; logits and softmax in float32, the gradient back in the
    rows' dtype."""
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 7, 32, generator=g, requires_grad=True)
    head = (torch.randn(300, 32, generator=g) * 0.5).bfloat16()
    labels = torch.randint(0, 300, (2, 7), generator=g)
    w = position_weights(8)
    loss, _ = block_loss(hidden, labels, head, w, chunk=5)
    (grad,) = torch.autograd.grad(loss, hidden)
    assert loss.dtype == torch.float32 and grad.dtype == torch.float32
    ref = plain_block_loss(hidden.bfloat16().float(), labels, head.float(), w)
    assert abs(loss.item() - ref.item()) < 1e-2 * ref.item()
    (g_ref,) = torch.autograd.grad(plain_block_loss(hidden, labels, head.float(), w), hidden)
    assert torch.allclose(grad, g_ref, atol=2e-2 * g_ref.abs().max().item())


def _pair(tmp_path):
    from dflash_trt import LLM, SamplingParams
    t = tiny.make_target(str(tmp_path / "t"), layers=3, hidden=32, heads=2, kv_heads=1)
    d = tiny.make_drafter(str(tmp_path / "d"), t, layers=1, block_size=4, target_layer_ids=[0, 2])
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, 128, (4 + i,), generator=g).tolist() for i in range(6)]
    outs = LLM(target=t, speculative=False).generate(prompts, SamplingParams(max_tokens=14, ignore_eos=True))
    recs = [{"id": i, "prompt_ids": p, "output_ids": o.token_ids} for i, (p, o) in enumerate(zip(prompts, outs))]
    return t, d, recs


def test_online_features_give_the_loss_of_cached_features(tmp_path):
    from dflash_trt.builder.train_cli import record_seqs
    from dflash_trt.builder.training.features import build_feature_shards, load_shard
    from dflash_trt.builder.training.online import OnlineFeatures
    from dflash_trt.builder.training.trainer import TrainConfig, Trainer
    from dflash_trt.checkpoint import load_state_dict
    from dflash_trt.config import DraftConfig, TargetConfig
    from dflash_trt.loader import ModelPaths, load_models
    from dflash_trt.models.draft import DFlashDrafter

    t, d, recs = _pair(tmp_path)
    tcfg = TargetConfig.from_dir(t)
    dcfg = DraftConfig.from_dir(d, num_target_layers=tcfg.num_hidden_layers)
    shards = build_feature_shards(t, recs, list(dcfg.target_layer_ids), str(tmp_path / "f"), log=lambda *_: None)
    cached = [s for p in shards for s in load_shard(p)]
    target, _ = load_models(ModelPaths(t, None), tcfg, None, torch.float32, "cpu")
    online = OnlineFeatures(target, list(dcfg.target_layer_ids))
    seqs = record_seqs(recs, 1024)
    feats = online(seqs)
    for s, c, f in zip(seqs, cached, feats):
        assert torch.equal(s["ids"], c["ids"]) and f.shape == c["features"].shape
        assert torch.allclose(f, c["features"].float(), rtol=2e-3, atol=2e-3)  # the cache holds float16
    cfg = TrainConfig(block_size=4, anchors_per_seq=8, seqs_per_step=3, max_steps=10)
    losses = []
    for s_list, provider in ((cached, None), (seqs, online)):
        drafter = DFlashDrafter(dcfg)
        drafter.load_weights(load_state_dict(d, "drafter"), torch.float32)
        tr = Trainer(drafter, target.model.embed_tokens.weight.detach(), target.head_weight.detach(), s_list, cfg,
                     str(tmp_path / "c"), log=lambda *_: None, features=provider)
        losses.append([tr.train_step()[0] for _ in range(3)])  # same batches: same seed, same data order
    assert losses[0][0] > 0.5
    for a, b in zip(*losses):
        assert abs(a - b) < 2e-3 * a, losses


def test_feature_mode_follows_the_size_of_a_cache():
    from dflash_trt.builder.training.online import choose_mode
    mode, why = choose_mode("auto", 4096, 5, 10 ** 9)  # Qwen3-8B, 5 tapped layers, a billion tokens
    assert mode == "online" and "41.0 KB/token" in why and "41.0 TB" in why
    assert choose_mode("auto", 576, 5, 100_000)[0] == "cache"  # SmolLM2-135M, a small data set
    assert choose_mode("cache", 4096, 5, 10 ** 9)[0] == "cache"
    assert choose_mode("online", 576, 5, 10)[0] == "online"


def test_gpu_step_benchmark_runs_its_tiny_shapes_on_a_cpu(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, BENCH, "--tiny", "--device", "cpu", "--steps", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["drafter_layers"] == 5 and res["tokens_per_step"] > 0
    assert res["tokens_per_s"] > 0 and res["step_s"] > 0
    assert res["loss"] > 0 and res["features"] == "online"
    assert "tokens/s" in r.stdout
