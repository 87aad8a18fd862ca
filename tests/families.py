"""Helpers for the target-family tests: tiny transformers models saved as real checkpoints, logit parity with
transformers, DFlash-vs-AR losslessness through the public LLM API."""
from __future__ import annotations

import torch

import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.config import TargetConfig
from dflash_trt.loader import ModelPaths, load_models
from dflash_trt.teacher import teacher_forward

VOCAB = 256


def save_hf(model, path: str, boost_tokens=(11,), boost: float = 5.0, norm_noise: float = 0.1) -> str:
    """Perturb the norms (so every weight matters), boost a few head rows (peaked logits, a random drafter then
    agrees often enough for multi-token acceptance), save with save_pretrained plus a tokenizer."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * norm_noise)
        head = model.get_output_embeddings().weight
        head[list(boost_tokens)] *= boost
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(path)
    tiny.add_tokenizer(path, model.config.get_text_config().vocab_size)  # multimodal wrappers: their text part's
    return path


def max_rel_logit_error(tdir: str, lengths=(1, 7, 150), seed: int = 0, invariant: bool = True) -> float:
    """Teacher-forced logits of our model vs transformers, fp32, max |diff| / max |ref| over all sequences.

    invariant: our CPU kernels (the engine's default) or the plain PyTorch path (what GPUs run)."""
    from dflash_trt import ops

    was = ops.invariant_enabled()
    ops.enable_invariant(invariant)
    try:
        return _max_rel_logit_error(tdir, lengths, seed)
    finally:
        ops.enable_invariant(was)


def hf_model(tdir: str):
    """transformers' model of a checkpoint, fp32: its causal LM, or for a multimodal wrapper served text-only
    (Kimi K2.5) its image-text-to-text model, whose logits and hidden states are those of the text part."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    cls = AutoModelForCausalLM
    if type(AutoConfig.from_pretrained(tdir)) not in AutoModelForCausalLM._model_mapping:
        cls = AutoModelForImageTextToText
    return cls.from_pretrained(tdir, dtype=torch.float32).eval()


def _max_rel_logit_error(tdir, lengths, seed):
    tcfg = TargetConfig.from_dir(tdir)
    target, _ = load_models(ModelPaths(tdir, None), tcfg, None, torch.float32, "cpu")
    hf = hf_model(tdir)
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, tcfg.vocab_size, (n,), generator=g).tolist() for n in lengths]
    _, logits, _ = teacher_forward(target, seqs)
    worst, at = 0.0, 0
    for s in seqs:
        with torch.no_grad():
            ref = hf(torch.tensor([s])).logits[0].float()
        ours = logits[at:at + len(s)]
        at += len(s)
        worst = max(worst, ((ours - ref).abs().max() / ref.abs().max()).item())
    return worst


def prompts(n: int, seed: int, lo: int = 1, hi: int = 40, vocab: int = VOCAB) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def drafter_for(path: str, target_dir: str, block_size: int = 8, wanted: int = 11, **kw) -> str:
    """A random z-lab drafter whose mask embedding proposes the boosted token (so drafts get accepted)."""
    target_dir = text_view(target_dir, path + ".target_text")
    return tiny.make_drafter(path, target_dir, block_size=block_size, mask_token_id=tiny.mask_proposing(target_dir, wanted),
                             residual_scale=0.3, **kw)


def text_view(target_dir: str, view: str) -> str:
    """target_dir itself, or for a multimodal wrapper (config.json with a text_config) a directory that tiny's
    drafter helpers can read: the text config at top level, and the embedding and head as our loader reads them
    from the wrapper's own weight names."""
    import json
    import os

    from safetensors.torch import save_file

    with open(os.path.join(target_dir, "config.json")) as f:
        raw = json.load(f)
    if "text_config" not in raw:
        return target_dir
    target, _ = load_models(ModelPaths(target_dir, None), TargetConfig.from_dir(target_dir), None, torch.float32, "cpu")
    os.makedirs(view, exist_ok=True)
    with open(os.path.join(view, "config.json"), "w") as f:
        json.dump(raw["text_config"], f)
    save_file({"model.embed_tokens.weight": target.model.embed_tokens.weight.contiguous(),
               "lm_head.weight": target.head_weight.clone()}, os.path.join(view, "model.safetensors"))
    return view


def assert_lossless(t: str, d: str | None, ps, max_tokens: int = 24, draft_lens=(1, 3, 7), **engine) -> int:
    """Greedy DFlash == our AR path token for token, for several K; returns the number of accepted drafts.
    d None: t is an engine directory (its own drafter)."""
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    pair = dict(target=t, draft=d) if d is not None else dict(model=t)
    single = dict(target=t) if d is not None else dict(model=t)
    ar = [o.token_ids for o in LLM(**single, speculative=False, **engine).generate(ps, sp)]
    accepted = 0
    for k in draft_lens:
        llm = LLM(**pair, max_draft_len=k, draft_len_policy="fixed", **engine)  # exactly K drafts per step
        outs = llm.generate(ps, sp)
        for i, o in enumerate(outs):
            assert o.token_ids == ar[i], f"K={k} prompt {i}: DFlash {o.token_ids} != AR {ar[i]}"
            accepted += o.accepted
        assert llm.engine.blocks.num_free == llm.engine.blocks.num_blocks
    return accepted


def build_engines(target: str, draft: str, root, flags: dict[str, list[str]]) -> dict[str, str]:
    """dflash-build (in process) one engine per entry of flags; fp8 entries need ModelOpt."""
    import pytest

    from dflash_trt.builder.cli import main as build

    out = {}
    for name, extra in flags.items():
        if "--quantization" in extra:
            pytest.importorskip("modelopt")
        out[name] = str(root / name)
        assert build(["--target", target, "--draft", draft, "--output", out[name], "--quiet"] + extra) == 0
    return out


def assert_build_refused(capsys, args: list[str], match: str) -> None:
    """dflash-build exits 2 with one stderr line containing `match` and leaves no output directory."""
    import os

    from dflash_trt.builder.cli import main as build

    out = args[args.index("--output") + 1]
    assert build(args + ["--quiet"]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1, err
    assert not os.path.exists(out)


def target_tensor(engine: str, name: str) -> torch.Tensor:
    import glob
    import os

    from safetensors import safe_open

    for f in sorted(glob.glob(os.path.join(engine, "target", "*.safetensors"))):
        with safe_open(f, "pt") as h:
            if name in h.keys():
                return h.get_tensor(name)
    raise KeyError(name)


def assert_tp_refused(target: str, model_type: str) -> None:
    """Tensor parallelism covers dense Llama/Qwen3 only: other families get one line naming their type."""
    import pytest

    from dflash_trt.errors import DFlashError
    with pytest.raises(DFlashError, match=f"tensor parallelism supports dense Llama/Qwen3 targets, not {model_type}") as e:
        LLM(target=target, speculative=False, tp_size=2)
    assert "\n" not in str(e.value)


def max_rel_capture_error(tdir: str, capture_ids=None, length: int = 37) -> float:
    """The drafter's context features vs transformers' hidden_states[id + 1] (test_model_parity's contract: the
    last layer's entry is after the final norm), fp32, max over the captured layers of max |diff| / max |ref|.
    capture_ids default: [0, 2, 2, last], duplicates included as drafters may list them."""
    from dflash_trt.teacher import teacher_forward

    tcfg = TargetConfig.from_dir(tdir)
    last = tcfg.num_hidden_layers - 1
    target, _ = load_models(ModelPaths(tdir, None), tcfg, None, torch.float32, "cpu")
    target.capture_ids = list(capture_ids) if capture_ids is not None else [0, 2, 2, last]
    seq = list(range(3, 3 + length))
    _, _, feats = teacher_forward(target, [seq], capture=True, logits=False)
    with torch.no_grad():
        hs = hf_model(tdir)(torch.tensor([seq]), output_hidden_states=True).hidden_states
    assert len(hs) == last + 2, f"transformers gave {len(hs)} hidden states for {last + 1} layers"
    worst = 0.0
    for got, i in zip(feats.split(tcfg.hidden_size, -1), target.capture_ids):
        ref = hs[i + 1][0]
        worst = max(worst, ((got - ref).abs().max() / ref.abs().max()).item())
    return worst
