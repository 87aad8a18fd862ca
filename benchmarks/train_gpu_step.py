"""Time one dflash-train step at a real target's shapes: random weights of Qwen3-8B's shapes (bf16), a 5-layer
drafter (float32 master weights, bf16 autocast), online target features, the chunked loss over the full
151,936-row head. Nothing is downloaded. Prints tokens/s and peak GPU memory (and a JSON record with --json).

    python benchmarks/train_gpu_step.py                      # on the GPU
    python benchmarks/train_gpu_step.py --tiny --device cpu  # the same code at toy shapes (the test runs this)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

import torch
from torch import nn

QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "max_position_embeddings": 40960, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
TINY = dict(QWEN3_8B, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=1000)
DRAFT_LAYERS = 5


def randomize(module: nn.Module, std: float, gen: torch.Generator) -> None:
    """Random weights in place (norm scales 1): the shapes and the work of a real checkpoint, no download."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name.rsplit(".", 2)[-2]:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=gen)


def build(cfg: dict, device: torch.device, seed: int = 0):
    from dflash_trt.config import DraftConfig, TargetConfig
    from dflash_trt.models.draft import DFlashDrafter
    from dflash_trt.models.registry import build_target
    from dflash_trt.rope import RotaryTable

    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        tcfg = TargetConfig.from_dir(d)
    n = cfg["num_hidden_layers"]
    layer_ids = [round(1 + i * (n - 3) / (DRAFT_LAYERS - 1)) for i in range(DRAFT_LAYERS)]  # spread, as z-lab's
    draw = {k: cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                "head_dim", "vocab_size", "rms_norm_eps", "rope_theta")}
    dcfg = DraftConfig.from_dict(dict(draw, num_hidden_layers=DRAFT_LAYERS, block_size=16, num_target_layers=n,
                                      target_layer_ids=layer_ids, mask_token_id=cfg["vocab_size"] - 1),
                                 num_target_layers=n)
    gen = torch.Generator(device=device).manual_seed(seed)
    # built straight on the device in its dtype: an 8B target never exists as a float32 copy
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if device.type == "cuda" else torch.float32)
    try:
        with torch.device(device):
            target = build_target(tcfg, 4096)
    finally:
        torch.set_default_dtype(default)
    with torch.device(device):
        drafter = DFlashDrafter(dcfg, 4096)
    randomize(target, 0.02, gen)
    randomize(drafter, 0.02, gen)
    target.rotary = RotaryTable(tcfg.rope, tcfg.head_dim, 4096, device=device)
    drafter.rotary = RotaryTable(dcfg.rope, dcfg.head_dim, 4096, device=device)
    target.eval()
    return target, drafter, dcfg


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="toy shapes (a CPU check of this script)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default 2048; 64 with --tiny)")
    p.add_argument("--seqs-per-step", type=int, default=4)
    p.add_argument("--anchors-per-seq", type=int, help="blocks per sequence (default 256; 8 with --tiny)")
    p.add_argument("--steps", type=int, default=5, help="timed steps, after one warm-up step")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: no CUDA device here; --tiny --device cpu checks the script on a CPU",
              file=sys.stderr)
        return 2
    seq_len = args.seq_len or (64 if args.tiny else 2048)
    anchors = args.anchors_per_seq or (8 if args.tiny else 256)

    from dflash_trt.builder.training.online import OnlineFeatures
    from dflash_trt.builder.training.trainer import TrainConfig, Trainer

    cfg = TINY if args.tiny else QWEN3_8B
    target, drafter, dcfg = build(cfg, dev)
    weights_gb = torch.cuda.memory_allocated(dev) / 2 ** 30 if dev.type == "cuda" else None
    gen = torch.Generator().manual_seed(0)
    seqs = [{"ids": torch.randint(0, cfg["vocab_size"] - 1, (seq_len,), generator=gen), "prompt_len": seq_len // 8}
            for _ in range(max(8, args.seqs_per_step))]
    online = OnlineFeatures(target, list(dcfg.target_layer_ids))
    spent = {"features": 0.0}

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def timed_features(batch):
        sync()
        t0 = time.perf_counter()
        out = online(batch)
        sync()
        spent["features"] += time.perf_counter() - t0
        return out

    tcfg = TrainConfig(block_size=dcfg.block_size, anchors_per_seq=anchors, seqs_per_step=args.seqs_per_step,
                       max_steps=1000, full_head=True)
    with tempfile.TemporaryDirectory() as out:
        tr = Trainer(drafter, target.model.embed_tokens.weight.detach(), target.head_weight.detach(), seqs, tcfg,
                     out, log=lambda *_: None, features=timed_features)
        loss = tr.train_step()[0]  # warm-up: allocator, kernels, optimizer state
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        spent["features"] = 0.0
        sync()
        t0 = time.perf_counter()
        rows = tokens = 0
        for _ in range(args.steps):
            loss, r, t = tr.train_step()
            rows, tokens = rows + r, tokens + t
        sync()
        dt = (time.perf_counter() - t0) / args.steps
    res = {"target": "Qwen3-8B shapes (random)" if not args.tiny else "tiny", "device": str(dev),
           "drafter_layers": DRAFT_LAYERS, "block_size": dcfg.block_size, "seq_len": seq_len,
           "seqs_per_step": args.seqs_per_step, "anchors_per_seq": anchors, "tokens_per_step": tokens // args.steps,
           "label_rows_per_step": rows // args.steps, "step_s": dt, "tokens_per_s": tokens / args.steps / dt,
           "target_features_share": spent["features"] / args.steps / dt, "loss": loss, "features": "online",
           "vocab_rows": cfg["vocab_size"]}
    if dev.type == "cuda":
        res["peak_memory_gb"] = torch.cuda.max_memory_allocated(dev) / 2 ** 30
        res["weights_memory_gb"] = weights_gb
        res["gpu"] = torch.cuda.get_device_name(dev)
    else:
        res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    mem = (f"peak GPU memory {res['peak_memory_gb']:.1f} GiB (weights {weights_gb:.1f} GiB)" if dev.type == "cuda"
           else f"peak RSS {res['peak_rss_gb']:.2f} GiB")
    print(f"{res['target']}, {DRAFT_LAYERS}-layer drafter, {args.seqs_per_step} x {seq_len} tokens, {anchors} blocks "
          f"of {dcfg.block_size} per sequence on {dev}: {dt * 1000:.0f} ms/step, {res['tokens_per_s']:.0f} tokens/s "
          f"({rows / args.steps / dt:.0f} label rows/s), target features {100 * res['target_features_share']:.0f}% "
          f"of the step; {mem}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
