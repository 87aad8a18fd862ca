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


def export_drafter(drafter, out_dir: str, dtype=torch.bfloat16, vocab=None, recipe: dict | None = None) -> None:
    """z-lab format: config.json + model.safetensors (no `model.` prefix, no embedding/head), atomically;
    plus draft_vocab.safetensors (the tokens the labels used) when training scored only those, and the run's
    recipe options (recipe.json, for a model card)."""
    from safetensors.torch import save_file

    cfg = dict(drafter.cfg.raw)
    cfg["torch_dtype"] = str(dtype).replace("torch.", "")
    cfg["block_size"] = drafter.cfg.block_size
    cfg.setdefault("dflash_config", {})
    cfg["dflash_config"].update({"mask_token_id": drafter.cfg.mask_token_id,
                                 "target_layer_ids": list(drafter.cfg.target_layer_ids)})
    os.makedirs(out_dir, exist_ok=True)
    tensors = {k: v.detach().to(dtype).contiguous().cpu() for k, v in drafter.state_dict().items()}
    tmp = os.path.join(out_dir, "model.safetensors.tmp")
    save_file(tensors, tmp)
    os.replace(tmp, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json.tmp"), "w") as f:
        json.dump(cfg, f, indent=2)
    os.replace(os.path.join(out_dir, "config.json.tmp"), os.path.join(out_dir, "config.json"))
    if recipe is not None:
        with open(os.path.join(out_dir, "recipe.json.tmp"), "w") as f:
            json.dump(recipe, f, indent=1)
        os.replace(os.path.join(out_dir, "recipe.json.tmp"), os.path.join(out_dir, RECIPE_FILE))
    if vocab is not None:
        from ..draft_vocab import save_draft_vocab
        save_draft_vocab(out_dir, vocab, "dflash-train: the tokens its training labels used")


def data_complete(path: str, n: int) -> bool:
    meta = path + ".meta.json"
    if not os.path.isfile(meta):
        return True  # user data: take it as it is
    with open(meta) as f:
        return n >= json.load(f).get("num_prompts", 0)


SPLIT_FILE = "split.json"  # how a run holds records out, fixed at its start (resumes keep it)


def split_rule(out: str, asked: str | None, resume: bool) -> dict:
    """The held-out rule of this run: what OUTPUT/split.json recorded, else `tasks` for a new run and `first` for
    a run trained before split.json existed (its checkpoint was trained on the other records: switching would
    move them into its held-out set)."""
    from .training.split import FRACTIONS, SALT

    path = os.path.join(out, SPLIT_FILE)
    if resume and os.path.isfile(path):
        with open(path) as f:
            rule = json.load(f)
        if asked and asked != rule["rule"]:
            raise DFlashError(f"{out} holds records out by `{rule['rule']}` ({path}): drop --split {asked}, or "
                              "start a new --output")
        return rule
    trained = os.path.isfile(os.path.join(out, "checkpoint", "trainer_state.pt"))
    if resume and trained:
        if asked == "tasks":
            raise DFlashError(f"{out} was trained with the first --eval-records records held out: --split tasks "
                              "would evaluate it on records it trained on; start a new --output for it")
        return {"rule": "first"}
    name = asked or "tasks"
    return {"rule": name, "salt": SALT, "fractions": FRACTIONS} if name == "tasks" else {"rule": name}


RECIPE_FILE = "recipe.json"  # the recipe options of a run, fixed at its start (resumes keep them)
RECIPE_DEFAULTS = {"loss_weights": "exp", "gamma": None, "dpace_alpha": 0.5, "schedule": "cosine",
                   "warmup_frac": 0.04, "decay_frac": 0.2, "autocast": None, "init_from": None}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def run_recipe(args, out: str, resume: bool, device: torch.device) -> dict:
    """The recipe options of this run: what OUTPUT/recipe.json recorded (a flag that asks otherwise is refused),
    else the flags given over RECIPE_DEFAULTS. autocast resolves to the device's default: bf16 on a GPU, float32
    on a CPU."""
    asked = {k: getattr(args, k) for k in RECIPE_DEFAULTS if getattr(args, k) is not None}
    path = os.path.join(out, RECIPE_FILE)
    if resume and os.path.isfile(path):
        with open(path) as f:
            rec = json.load(f)
        for k, v in asked.items():
            if k != "init_from" and v != rec.get(k, RECIPE_DEFAULTS[k]):
                raise DFlashError(f"{out} was trained with {_flag(k)} {rec.get(k)} ({path}): drop {_flag(k)} {v}, "
                                  "or start a new --output")
        return dict(RECIPE_DEFAULTS, **rec)
    rec = dict(RECIPE_DEFAULTS, **asked)
    if rec["autocast"] is None:
        rec["autocast"] = "bf16" if device.type == "cuda" else "float32"
    if rec["loss_weights"] == "dpace" and rec["gamma"] is not None:
        raise DFlashError("--gamma sets the exp position weights: drop it, or use --loss-weights exp")
    if rec["loss_weights"] == "exp" and "dpace_alpha" in asked:
        raise DFlashError("--dpace-alpha sets the D-PACE position weights: drop it, or use --loss-weights dpace")
    if not 0.0 < rec["dpace_alpha"] <= 1.0:
        raise DFlashError(f"--dpace-alpha {rec['dpace_alpha']}: give a value in (0, 1] (0.5 usual)")
    if rec["gamma"] is not None and rec["gamma"] <= 0:
        raise DFlashError(f"--gamma {rec['gamma']}: give a positive value (4 for block 8, 7 for block 16 usual)")
    for k in ("warmup_frac", "decay_frac"):
        if not 0.0 <= rec[k] <= 1.0:
            raise DFlashError(f"{_flag(k)} {rec[k]}: give a fraction of --max-steps in [0, 1]")
    if rec["schedule"] == "wsd" and rec["warmup_frac"] + rec["decay_frac"] > 1.0:
        raise DFlashError(f"--warmup-frac {rec['warmup_frac']} + --decay-frac {rec['decay_frac']} exceed the whole "
                          "schedule: make them add to 1 or less")
    if rec["schedule"] == "cosine" and "decay_frac" in asked:
        raise DFlashError("--decay-frac sets the cooldown of --schedule wsd: drop it, or add --schedule wsd")
    if rec["init_from"] is not None:
        rec["init_from"] = os.path.abspath(rec["init_from"])
    return rec


def init_from_defaults(args) -> None:
    """--init-from DIR: the drafter shape flags not given are the source drafter's (block size included: the
    weights do not depend on it, so a different --block-size is allowed)."""
    from ..config import DraftConfig

    src = args.init_from
    if not os.path.isfile(os.path.join(src, "config.json")):
        raise DFlashError(f"--init-from {src}: no drafter there (config.json missing): give a drafter directory, "
                          "e.g. OUTPUT/drafter of another run")
    scfg = DraftConfig.from_dir(src)
    if args.block_size is None:
        args.block_size = scfg.block_size
    if args.num_layers is None:
        args.num_layers = scfg.num_hidden_layers
    if args.target_layer_ids is None:
        args.target_layer_ids = list(scfg.target_layer_ids)
    if args.mask_token_id is None:
        args.mask_token_id = scfg.mask_token_id


def copy_init_weights(src: str, init_dir: str) -> None:
    """Replace the fresh drafter in init_dir with src's weights, refused in one line unless every tensor of the
    drafter init_dir describes is in src with the same shape and src reads the same target layers."""
    from safetensors.torch import save_file

    from ..checkpoint import load_state_dict
    from ..config import DraftConfig

    own = load_state_dict(init_dir, "drafter")
    theirs = {(k[6:] if k.startswith("model.") else k): v for k, v in load_state_dict(src, "drafter").items()}
    ids_src, ids_own = DraftConfig.from_dir(src).target_layer_ids, DraftConfig.from_dir(init_dir).target_layer_ids
    if list(ids_src) != list(ids_own):
        raise DFlashError(f"--init-from {src} reads target layers {list(ids_src)}, this run {list(ids_own)}: drop "
                          "--target-layer-ids, or start from random weights")
    for k, v in own.items():
        if k not in theirs or tuple(theirs[k].shape) != tuple(v.shape):
            got = list(theirs[k].shape) if k in theirs else "nothing"
            raise DFlashError(f"--init-from {src} does not fit this run's drafter: {k} is {got} there, "
                              f"{list(v.shape)} here: drop --num-layers / --target-layer-ids, or start from random "
                              "weights")
    extra = sorted(k for k in theirs if k not in own and not k.startswith(("embed_tokens", "lm_head")))
    if extra:
        raise DFlashError(f"--init-from {src} does not fit this run's drafter: {extra[0]} has no place here: drop "
                          "--num-layers, or start from random weights")
    save_file({k: theirs[k].to(torch.float32).contiguous() for k in own}, os.path.join(init_dir, "model.safetensors"))


def check_block_size(args, tcfg) -> None:
    """What the runtime refuses, refused before anything is written or trained."""
    from ..config import validate_pair

    if args.block_size < 2:
        raise DFlashError(f"--block-size {args.block_size}: a block is the bonus token and at least one draft, and "
                          "every runtime refuses a drafter with fewer: use --block-size 2 or more (8 or 16 usual)")
    if args.num_layers < 1:
        raise DFlashError(f"--num-layers {args.num_layers}: a drafter needs at least one layer")
    if args.eval_records < 1:
        raise DFlashError(f"--eval-records {args.eval_records}: give 1 or more")
    from ..config import DraftConfig
    from ..errors import PairError

    raw = {"hidden_size": tcfg.hidden_size, "intermediate_size": tcfg.intermediate_size,
           "num_hidden_layers": args.num_layers, "num_attention_heads": tcfg.num_attention_heads,
           "num_key_value_heads": tcfg.num_key_value_heads, "head_dim": tcfg.head_dim,
           "vocab_size": tcfg.vocab_size, "num_target_layers": tcfg.num_hidden_layers,
           "block_size": args.block_size,
           "mask_token_id": tcfg.vocab_size - 1 if args.mask_token_id is None else args.mask_token_id}
    if args.target_layer_ids:
        raw["target_layer_ids"] = args.target_layer_ids
    try:  # the runtime's own pair check, on the drafter init_drafter_from_target would write
        validate_pair(tcfg, DraftConfig.from_dict(raw, num_target_layers=tcfg.num_hidden_layers))
    except PairError as e:
        raise DFlashError(f"the drafter these flags ask for would be refused by the runtime: {e}") from None


def load_data(data: str, vocab_size: int, target_dir: str, regenerate: bool = False) -> list[dict]:
    from .training.data_formats import is_token_data, read_chat
    from .training.features import read_records

    if not os.path.isfile(data):
        raise DFlashError(f"no training data at {data}: pass --data JSONL or --make-data N")
    if is_token_data(data):
        records = read_records(data, vocab_size, log=log)
    else:
        records = read_chat(data, target_dir, regenerate=regenerate, log=log)
    if len(records) < 2:
        raise DFlashError(f"{data} holds {len(records)} usable record(s) (with output_ids): need at least 2, one to "
                          "train on and one to hold out; --make-data N generates them")
    return records


def split_seqs(seqs: list[dict], records: list[dict], rule: dict, n_eval: int, data: str):
    """(training, evaluated during training) sequences, and a one-line summary."""
    import collections

    from .training.split import eval_sample, split_records

    if rule["rule"] == "first":  # runs from before split.json: their first records by shard position
        n = min(n_eval, len(seqs) // 2)
        return seqs[n:], seqs[:n], f"{n} held out (the first --eval-records records: this run's rule)"
    held, train = split_records(records, rule.get("fractions"))
    if not held or not train:
        raise DFlashError(f"{data}: its {len(records)} records are all one task, so none can be held out without "
                          "its twins in training: give more varied data, or --split first (the first "
                          "--eval-records records held out)")
    held_ids, sample = {r["id"] for r in held}, eval_sample(held, n_eval)
    sample_ids = {r["id"] for r in sample}
    by_kind = collections.Counter(r.get("kind") or "-" for r in held)
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items()))
    return ([s for s in seqs if s.get("record_id") is not None and s["record_id"] not in held_ids],
            [s for s in seqs if s.get("record_id") in sample_ids],
            f"{len(held)} held out by task ({kinds}), {len(sample)} of them scored during training")


def record_seqs(records: list[dict], max_len: int) -> list[dict]:
    """Sequences without features (online mode: the target computes them in the loop)."""
    return [{"ids": torch.tensor((r["prompt_ids"] + r["output_ids"])[:max_len]), "prompt_len": len(r["prompt_ids"]),
             "record_id": r["id"]} for r in records]


def pick_device(asked: str, group) -> torch.device:
    if group is not None:
        return group.device
    return torch.device(asked)


@user_errors
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dflash-train", description=__doc__,
                                epilog="Exit status: 0 trained to the end of its schedule or budget; 2 a user error "
                                       "(one line, nothing left behind); 128 + the signal (143 SIGTERM, 130 Ctrl-C) "
                                       "stopped early after saving its checkpoint and drafter: --resume continues. "
                                       "Data parallel: torchrun --nproc_per_node N -m dflash_trt.builder.train_cli "
                                       "... (docs/training.md).")
    p.add_argument("--target", help="Hugging Face target directory (default: the embedded SmolLM2-135M)")
    p.add_argument("--output", required=True, help="directory for the drafter, checkpoints and logs")
    p.add_argument("--block-size", type=int, help="default 16, or the --init-from drafter's")
    p.add_argument("--num-layers", type=int, help="default 3, or the --init-from drafter's")
    p.add_argument("--target-layer-ids", type=int, nargs="+")
    p.add_argument("--mask-token-id", type=int)
    p.add_argument("--data", help="JSONL of {prompt_ids, output_ids}, chat `messages` / ShareGPT `conversations`, "
                                  "or {prompt, response} (docs/training.md); made by --make-data when absent")
    p.add_argument("--regenerate", choices=("runtime", "vllm", "trtllm"),
                   help="self-distillation of --data: the target answers its prompts (greedy) through our runtime, "
                        "vLLM or TensorRT-LLM, written to OUTPUT/data.jsonl; the data's own responses are ignored")
    p.add_argument("--regenerate-max-tokens", type=int, default=512)
    p.add_argument("--make-data", type=int, default=0, metavar="N", help="generate N self-distillation records")
    p.add_argument("--magpie", type=int, default=0, metavar="N",
                   help="with --make-data: also N requests the target writes itself (Magpie), answered first")
    p.add_argument("--magpie-domains", type=int, default=0, metavar="N",
                   help="with --make-data: also N Magpie requests steered by domain system prompts (code, maths, "
                        "writing, reasoning, role-play, extraction, STEM, humanities)")
    p.add_argument("--code-stubs", type=int, default=0, metavar="N",
                   help="generate data: also N HumanEval-shaped function stubs to complete (standard library, sympy "
                        "and networkx signatures and docstrings), answered first")
    p.add_argument("--split", choices=("tasks", "first"),
                   help="held-out records: `tasks` (new runs) holds out whole tasks of every record kind, chosen by "
                        "a hash of the task, so the set is fixed as data grows (builder/training/split.py); "
                        "`first`: the first --eval-records records, the rule of runs begun before split.json "
                        "(a resumed run keeps its own rule)")
    p.add_argument("--eval-records", type=int, default=64,
                   help="held-out records whose tau and loss are logged during training (with --split tasks a "
                        "sample spread over kinds; benchmarks/drafter_report.py scores them all)")
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--time-budget", type=float, help="minutes of training (this run included, resumes add)")
    p.add_argument("--session-minutes", type=float, help="stop this invocation after M minutes (resume later)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--schedule", choices=("cosine", "wsd"),
                   help="learning rate after --warmup-frac: cosine to 0 (default), or wsd: constant, then a linear "
                        "decay to 0 over the last --decay-frac of --max-steps")
    p.add_argument("--warmup-frac", type=float, help="linear warmup over this fraction of --max-steps (0.04)")
    p.add_argument("--decay-frac", type=float, help="--schedule wsd: the cooldown's fraction of --max-steps (0.2)")
    p.add_argument("--loss-weights", choices=("exp", "dpace"),
                   help="weights of a block's rows: exp(-(k-1)/gamma) (default), or dpace: the drafter's own "
                        "confidence in the rows before (D-PACE, NVIDIA ModelOpt's default)")
    p.add_argument("--gamma", type=float, help="--loss-weights exp: gamma (default 4 for block 8, 5 for 10, 7 for 16, "
                                               "else block/2)")
    p.add_argument("--dpace-alpha", type=float, help="--loss-weights dpace: confidence smoothing in (0, 1] (0.5)")
    p.add_argument("--autocast", choices=("bf16", "float32"),
                   help="the drafter's forward in bfloat16 autocast (default on cuda) or float32 (default on cpu)")
    p.add_argument("--init-from", metavar="DIR",
                   help="start a new run from this drafter's weights (e.g. runtime/assets/smollm2-dflash) instead "
                        "of the target's top layers; --block-size may differ from its own; --resume ignores it")
    p.add_argument("--anchors-per-seq", type=int, default=48)
    p.add_argument("--seqs-per-step", type=int, default=4,
                   help="sequences per optimizer step over all ranks (a multiple of the number of ranks)")
    p.add_argument("--max-seq-len", type=int, default=1024, help="tokens of a record trained on (prompt first)")
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--save-every", type=int, default=100, help="steps between checkpoints")
    p.add_argument("--log-every", type=int, default=10, help="steps between progress lines")
    p.add_argument("--seed", type=int, default=0, help="data order and anchors")
    p.add_argument("--full-head", action="store_true",
                   help="train against every vocabulary row (default: only the tokens the training labels use)")
    p.add_argument("--features", choices=("auto", "cache", "online"), default="auto",
                   help="target features: an offline cache on disk computed once, or the target run in the "
                        "training loop; auto: the cache while it fits --feature-cache-limit")
    p.add_argument("--feature-cache-limit", type=float, default=20.0, metavar="GB")
    p.add_argument("--device", default="cpu", help="cpu or cuda (bf16 target, bf16 autocast, float32 drafter "
                                                   "weights); under torchrun each rank takes cuda:LOCAL_RANK")
    p.add_argument("--dist-timeout", type=float, default=60.0, metavar="MIN",
                   help="under torchrun: minutes the ranks wait for each other (rank 0 alone builds a feature cache "
                        "or regenerates data before training; do long regenerations in a single-process run first)")
    p.add_argument("--progress", action="store_true", help="a progress bar (default: when stderr is a terminal)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --output")
    p.add_argument("--threads", type=int)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for flag in ("save_every", "log_every", "eval_every", "max_seq_len", "seqs_per_step", "regenerate_max_tokens"):
        if getattr(args, flag) < 1:
            raise DFlashError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: give 1 or more")
    if args.regenerate and not args.data:
        raise DFlashError("--regenerate needs --data: the prompts for the target to answer")

    from .training.distributed import init_group, launched_world
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise DFlashError(f"--device {args.device}: this machine has no CUDA device torch can use; use --device cpu")
    if args.seqs_per_step % launched_world():
        raise DFlashError(f"--seqs-per-step {args.seqs_per_step} does not split over {launched_world()} ranks: "
                          f"give a multiple of {launched_world()}")
    group = init_group(args.device, args.dist_timeout)
    try:
        rc = _train(args, group)
    except BaseException:
        if group is not None:
            group.close()
        raise
    if group is not None:
        group.close(together=True)
    return rc


def _train(args, group) -> int:
    global log
    rank0 = group is None or group.rank == 0
    if not rank0:
        log = lambda *_: None  # noqa: E731 - rank 0 speaks for the run
    sync = group.barrier if group is not None else (lambda: None)
    device = pick_device(args.device, group)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    from ..config import DraftConfig, TargetConfig
    from ..draft_init import init_drafter_from_target
    from ..loader import ModelPaths, load_models
    from ..models.draft import DFlashDrafter
    from .training.features import build_feature_shards, load_shard
    from .training.online import OnlineFeatures, choose_mode
    from .training.trainer import TrainConfig, Trainer

    out = args.output
    if os.path.isdir(out) and os.listdir(out) and not args.resume:
        raise DFlashError(f"{out} is not empty: pass --resume to continue that run, or choose a new --output")
    if os.path.exists(out) and not os.path.isdir(out):
        raise DFlashError(f"--output {out} is a file: give a directory")
    init_dir = os.path.join(out, "init")
    fresh = not os.path.isfile(os.path.join(init_dir, "config.json"))
    if args.init_from and not fresh:
        log(f"--init-from {args.init_from} ignored: {out} continues from its own checkpoint")
        args.init_from = None
    recipe = run_recipe(args, out, args.resume, device)
    if fresh and recipe["init_from"]:
        args.init_from = recipe["init_from"]
        init_from_defaults(args)
    args.block_size = 16 if args.block_size is None else args.block_size
    args.num_layers = 3 if args.num_layers is None else args.num_layers
    target_dir = args.target
    if target_dir is None:
        from ..embedded import EMBEDDED_MASK_ID, ensure_target
        target_dir = ensure_target()
        if args.mask_token_id is None:
            args.mask_token_id = EMBEDDED_MASK_ID
    tcfg = TargetConfig.from_dir(target_dir)
    if fresh:
        check_block_size(args, tcfg)
    data = args.data or os.path.join(out, "data.jsonl")
    records = user = None
    making = bool(args.make_data or args.code_stubs)  # the target answers our own prompts into DATA
    if args.regenerate:  # the user's prompts, checked now; the target's answers go to OUTPUT/data.jsonl
        user = load_data(args.data, tcfg.vocab_size, target_dir, regenerate=True)
        data = os.path.join(out, "data.jsonl")
    elif not making:  # user data: every fault found before OUTPUT is touched
        records = load_data(data, tcfg.vocab_size, target_dir)
    rule = split_rule(out, args.split, args.resume)
    sync()  # every rank has looked at OUTPUT before rank 0 writes to it

    # Anything this invocation creates before training starts is removed again if it fails, so that the same
    # command works again without --resume; a run's own files (a resumed OUTPUT) are never touched.
    created = [] if os.path.isdir(out) else [out]
    try:
        if rank0:
            os.makedirs(out, exist_ok=True)
            if making:
                from .training.datagen import generate_data
                generate_data(target_dir, data, args.make_data, magpie=args.magpie,
                              magpie_domains=args.magpie_domains, code_stubs=args.code_stubs, log=log)
            if args.regenerate:
                from .training.regenerate import regenerate
                regenerate(user, target_dir, data, args.regenerate, args.regenerate_max_tokens,
                           max_seq_len=max(args.max_seq_len, 2048), log=log)
            if not os.path.isfile(os.path.join(init_dir, "config.json")):
                created.append(init_dir)
                init_drafter_from_target(target_dir, init_dir, num_layers=args.num_layers,
                                         block_size=args.block_size, mask_token_id=args.mask_token_id,
                                         target_layer_ids=args.target_layer_ids)
                if recipe["init_from"]:
                    copy_init_weights(recipe["init_from"], init_dir)
                    log(f"starting from the weights of {recipe['init_from']} (block size {args.block_size})")
            if not os.path.isfile(os.path.join(out, RECIPE_FILE)):
                created.append(os.path.join(out, RECIPE_FILE))
                with open(os.path.join(out, RECIPE_FILE), "w") as f:
                    json.dump(recipe, f, indent=1)
            if not os.path.isfile(os.path.join(out, SPLIT_FILE)):
                created.append(os.path.join(out, SPLIT_FILE))
                with open(os.path.join(out, SPLIT_FILE), "w") as f:
                    json.dump(rule, f, indent=1)
        sync()
        if records is None:
            records = load_data(data, tcfg.vocab_size, target_dir)
        dcfg = DraftConfig.from_dir(init_dir, num_target_layers=tcfg.num_hidden_layers)
        tokens = sum(min(len(r["prompt_ids"]) + len(r["output_ids"]), args.max_seq_len) for r in records)
        mode, why = choose_mode(args.features, tcfg.hidden_size, len(dcfg.target_layer_ids), tokens,
                                args.feature_cache_limit)
        fdir = os.path.join(out, "features")
        if args.resume and mode == "online" and args.features == "auto" and os.path.isdir(fdir):
            mode, why = "cache", "offline cache (this run's own, in OUTPUT/features)"
        log(f"features: {why}")
        target, _ = load_models(ModelPaths(target_dir, None), tcfg, None, dtype, device)
        drafter = DFlashDrafter(dcfg)
        from ..checkpoint import load_state_dict
        drafter.load_weights(load_state_dict(init_dir, "drafter"), torch.float32)

        if mode == "cache":
            if rank0:
                # data still growing: only full shards, so a later resume adds shards without redoing any
                build_feature_shards(target_dir, records, dcfg.target_layer_ids, fdir, seqs_per_shard=64,
                                     max_len=args.max_seq_len, full_only=not data_complete(data, len(records)),
                                     log=log, target=target)
            sync()
            shards = sorted(os.path.join(fdir, f) for f in os.listdir(fdir)
                            if f.startswith("shard_") and f.endswith(".safetensors"))
            by_tokens = None
            if rule["rule"] == "tasks" and not all(_has_record_ids(path) for path in shards):
                by_tokens = {tuple((r["prompt_ids"] + r["output_ids"])[:args.max_seq_len]): r["id"] for r in records}
            seqs = [s for path in shards for s in load_shard(path, by_tokens)]
            features = None
        else:
            seqs = record_seqs(records, args.max_seq_len)
            features = OnlineFeatures(target, list(dcfg.target_layer_ids))
        train_seqs, eval_seqs, said = split_seqs(seqs, records, rule, args.eval_records, data)
    except DFlashError:
        for path in reversed(created):
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
        raise
    world = group.world if group is not None else 1
    log(f"{len(train_seqs)} training sequences, {said}, {sum(s['ids'].numel() for s in train_seqs)} tokens; "
        f"{world} rank(s) on {device.type}")
    cfg = TrainConfig(block_size=dcfg.block_size, anchors_per_seq=args.anchors_per_seq,
                      seqs_per_step=args.seqs_per_step, lr=args.lr, max_steps=args.max_steps,
                      time_budget_min=args.time_budget, session_min=args.session_minutes,
                      eval_every=args.eval_every, save_every=args.save_every, seed=args.seed,
                      full_head=args.full_head, log_every=args.log_every, loss_weights=recipe["loss_weights"],
                      gamma=recipe["gamma"], dpace_alpha=recipe["dpace_alpha"], schedule=recipe["schedule"],
                      warmup_frac=recipe["warmup_frac"], decay_frac=recipe["decay_frac"],
                      autocast=recipe["autocast"])
    unused = {"dpace_alpha"} if recipe["loss_weights"] == "exp" else {"gamma"}
    unused |= {"decay_frac"} if recipe["schedule"] == "cosine" else set()
    log("recipe: " + ", ".join(f"{_flag(k)} {v}" for k, v in recipe.items() if v is not None and k not in unused))
    embed_w = target.model.embed_tokens.weight.detach()
    head_w = target.head_weight.detach()
    trainer = Trainer(drafter, embed_w, head_w, train_seqs, cfg, os.path.join(out, "checkpoint"), log=log,
                      features=features, dist=group)
    if args.resume:
        trainer.resume()
    final = os.path.join(out, "drafter")
    stopped = trainer.run(lambda d: export_drafter(d, final, vocab=trainer.vocab, recipe=recipe), eval_seqs,
                          progress=args.progress or sys.stderr.isatty())
    if stopped:
        # not 0: a script must tell a run cut short from a finished one (128 + signal, as a shell reports it)
        log(f"drafter of step {trainer.step} written to {final}; stopped by signal {stopped}: exit {128 + stopped}")
        return 128 + stopped
    log(f"drafter written to {final}")
    return 0


def _has_record_ids(path: str) -> bool:
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        return "record_ids" in f.keys()


if __name__ == "__main__":
    sys.exit(main())
