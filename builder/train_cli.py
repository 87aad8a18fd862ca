"""dflash-train: train a DFlash drafter for a target on this machine, end to end and resumable.

Stages (each resumable): self-distillation data (the target answers our prompts through our runtime),
target features (computed once), training (checkpoints every few minutes), export in the z-lab format.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import torch

from ..cli.common import user_errors
from ..errors import DFlashError


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def export_drafter(drafter, out_dir: str, dtype=torch.bfloat16, vocab=None) -> None:
    """z-lab format: config.json + model.safetensors (no `model.` prefix, no embedding/head), atomically;
    plus draft_vocab.safetensors (the tokens the labels used) when training scored only those."""
    from safetensors.torch import save_file

    cfg = dict(drafter.cfg.raw)
    cfg["torch_dtype"] = str(dtype).replace("torch.", "")
    cfg["block_size"] = drafter.cfg.block_size
    cfg.setdefault("dflash_config", {})
    cfg["dflash_config"].update({"mask_token_id": drafter.cfg.mask_token_id,
                                 "target_layer_ids": list(drafter.cfg.target_layer_ids)})
    os.makedirs(out_dir, exist_ok=True)
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in drafter.state_dict().items()}
    tmp = os.path.join(out_dir, "model.safetensors.tmp")
    save_file(tensors, tmp)
    os.replace(tmp, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json.tmp"), "w") as f:
        json.dump(cfg, f, indent=2)
    os.replace(os.path.join(out_dir, "config.json.tmp"), os.path.join(out_dir, "config.json"))
    if vocab is not None:
        from ..draft_vocab import save_draft_vocab
        save_draft_vocab(out_dir, vocab, "dflash-train: the tokens its training labels used")


def data_complete(path: str, n: int) -> bool:
    meta = path + ".meta.json"
    if not os.path.isfile(meta):
        return True  # user data: take it as it is
    with open(meta) as f:
        return n >= json.load(f).get("num_prompts", 0)


@user_errors
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dflash-train", description=__doc__)
    p.add_argument("--target", help="Hugging Face target directory (default: the embedded SmolLM2-135M)")
    p.add_argument("--output", required=True, help="directory for the drafter, checkpoints and logs")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-layers", type=int, default=3)
    p.add_argument("--target-layer-ids", type=int, nargs="+")
    p.add_argument("--mask-token-id", type=int)
    p.add_argument("--data", help="JSONL of {prompt_ids, output_ids} (made by --make-data when absent)")
    p.add_argument("--make-data", type=int, default=0, metavar="N", help="generate N self-distillation records")
    p.add_argument("--magpie", type=int, default=0, metavar="N",
                   help="with --make-data: also N requests the target writes itself (Magpie), answered first")
    p.add_argument("--magpie-domains", type=int, default=0, metavar="N",
                   help="with --make-data: also N Magpie requests steered by domain system prompts (code, maths, "
                        "writing, reasoning, role-play, extraction, STEM, humanities)")
    p.add_argument("--eval-records", type=int, default=64,
                   help="the first N records are held out (tau and loss during training); fixed as data grows")
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--time-budget", type=float, help="minutes of training (this run included, resumes add)")
    p.add_argument("--session-minutes", type=float, help="stop this invocation after M minutes (resume later)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--anchors-per-seq", type=int, default=48)
    p.add_argument("--seqs-per-step", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--full-head", action="store_true",
                   help="train against every vocabulary row (default: only the tokens the training labels use)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --output")
    p.add_argument("--threads", type=int)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from ..config import DraftConfig, TargetConfig
    from ..draft_init import init_drafter_from_target
    from ..loader import ModelPaths, load_models
    from ..models.draft import DFlashDrafter
    from .training.features import build_feature_shards, load_shard, read_records
    from .training.trainer import TrainConfig, Trainer

    target_dir = args.target
    if target_dir is None:
        from ..embedded import EMBEDDED_MASK_ID, ensure_target
        target_dir = ensure_target()
        if args.mask_token_id is None:
            args.mask_token_id = EMBEDDED_MASK_ID
    tcfg = TargetConfig.from_dir(target_dir)
    out = args.output
    if os.path.isdir(out) and os.listdir(out) and not args.resume:
        raise DFlashError(f"{out} is not empty: pass --resume to continue that run, or choose a new --output")
    os.makedirs(out, exist_ok=True)

    data = args.data or os.path.join(out, "data.jsonl")
    if args.make_data:
        from .training.datagen import generate_data
        generate_data(target_dir, data, args.make_data, magpie=args.magpie, magpie_domains=args.magpie_domains,
                      log=log)
    if not os.path.isfile(data):
        raise DFlashError(f"no training data at {data}: pass --data JSONL or --make-data N")

    init_dir = os.path.join(out, "init")
    if not os.path.isfile(os.path.join(init_dir, "config.json")):
        init_drafter_from_target(target_dir, init_dir, num_layers=args.num_layers, block_size=args.block_size,
                                 mask_token_id=args.mask_token_id, target_layer_ids=args.target_layer_ids)
    dcfg = DraftConfig.from_dir(init_dir, num_target_layers=tcfg.num_hidden_layers)
    target, _ = load_models(ModelPaths(target_dir, None), tcfg, None, torch.float32, "cpu")
    drafter = DFlashDrafter(dcfg)
    from ..checkpoint import load_state_dict
    drafter.load_weights(load_state_dict(init_dir, "drafter"), torch.float32)

    records = read_records(data)
    n_eval = min(args.eval_records, len(records) // 2)
    if n_eval < 1:
        raise DFlashError(f"{data} holds {len(records)} usable records: need at least 2")
    shard = 64
    # data still growing: only full shards, so a later resume adds shards without redoing any
    shards = build_feature_shards(target_dir, records, dcfg.target_layer_ids, os.path.join(out, "features"),
                                  seqs_per_shard=shard, full_only=not data_complete(data, len(records)), log=log)
    seqs = [s for path in shards for s in load_shard(path)]
    eval_seqs, train_seqs = seqs[:n_eval], seqs[n_eval:]
    log(f"{len(train_seqs)} training sequences, {len(eval_seqs)} held out, "
        f"{sum(s['ids'].numel() for s in train_seqs)} tokens")
    cfg = TrainConfig(block_size=dcfg.block_size, anchors_per_seq=args.anchors_per_seq,
                      seqs_per_step=args.seqs_per_step, lr=args.lr, max_steps=args.max_steps,
                      time_budget_min=args.time_budget, session_min=args.session_minutes,
                      eval_every=args.eval_every, full_head=args.full_head)
    embed_w = target.model.embed_tokens.weight.detach()
    head_w = target.head_weight.detach()
    trainer = Trainer(drafter, embed_w, head_w, train_seqs, cfg, os.path.join(out, "checkpoint"), log=log)
    if args.resume:
        trainer.resume()
    final = os.path.join(out, "drafter")
    trainer.run(lambda d: export_drafter(d, final, vocab=trainer.vocab), eval_seqs)
    log(f"drafter written to {final}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
