"""Self-distillation of user data: the target answers the prompts itself (greedy), the DFlash recipe; the drafter
then learns the target's own distribution rather than whatever model wrote the data set.

Backends: our runtime (always), vLLM or TensorRT-LLM when installed (imported only when asked for). Resumable:
records already in the output file are skipped, and each batch is appended as it finishes.
"""
from __future__ import annotations

import json
import os
import time

from ...errors import DFlashError
from .datagen import done_ids

BACKENDS = ("runtime", "vllm", "trtllm")


def _runtime(target_dir: str, max_tokens: int, batch: int, max_seq_len: int):
    from ...llm import LLM
    from ...sampling import SamplingParams

    llm = LLM(target=target_dir, speculative=False, max_batch_size=batch, max_seq_len=max_seq_len)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0)

    def gen(prompts):
        return [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, sp)]
    return gen


def _vllm(target_dir: str, max_tokens: int, batch: int, max_seq_len: int):
    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except ImportError:
        raise DFlashError("--regenerate vllm: vLLM is not installed here (pip install vllm), or use "
                          "--regenerate runtime") from None
    llm = LLM(model=target_dir, max_num_seqs=batch, max_model_len=max_seq_len)
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens)

    def gen(prompts):
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
        return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outs]
    return gen


def _trtllm(target_dir: str, max_tokens: int, batch: int, max_seq_len: int):
    try:
        from tensorrt_llm import LLM, SamplingParams
    except ImportError:
        raise DFlashError("--regenerate trtllm: TensorRT-LLM is not installed here, or use --regenerate "
                          "runtime") from None
    llm = LLM(model=target_dir, max_batch_size=batch, max_seq_len=max_seq_len)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0)

    def gen(prompts):
        return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in llm.generate(prompts, sp)]
    return gen


def regenerate(records: list[dict], target_dir: str, out_path: str, backend: str = "runtime",
               max_tokens: int = 512, batch: int = 32, max_seq_len: int = 2048, log=print) -> None:
    """Append {id, prompt, prompt_ids, output_ids, finish_reason} for each record not yet in out_path."""
    have = done_ids(out_path)
    todo = [r for r in records if r["id"] not in have]
    long = [r for r in todo if len(r["prompt_ids"]) + max_tokens > max_seq_len]
    todo = [r for r in todo if len(r["prompt_ids"]) + max_tokens <= max_seq_len]
    log(f"regenerate ({backend}): {len(have)} responses present, {len(todo)} to write -> {out_path}"
        + (f"; {len(long)} prompts longer than {max_seq_len - max_tokens} tokens skipped" if long else ""))
    gen = None
    if todo:  # the backend first: a missing one is refused before anything is written
        gen = {"runtime": _runtime, "vllm": _vllm, "trtllm": _trtllm}[backend](target_dir, max_tokens, batch,
                                                                               max_seq_len)
    meta = out_path + ".meta.json"
    if not os.path.isfile(meta):  # marks the file as generated: a torn last line is skipped, not an error
        with open(meta, "w") as f:
            json.dump({"made_by": f"dflash-train --regenerate {backend}", "target": os.path.abspath(target_dir),
                       "num_prompts": len(have) + len(todo), "max_tokens": max_tokens, "decoding": "greedy"}, f,
                      indent=1)
    if gen is None:
        return
    t0, tokens = time.time(), 0
    with open(out_path, "a") as f:
        for i in range(0, len(todo), batch):
            group = todo[i:i + batch]
            for r, (out, why) in zip(group, gen([r["prompt_ids"] for r in group])):
                rec = {k: v for k, v in r.items() if k != "output_ids"}
                f.write(json.dumps(dict(rec, output_ids=list(out), finish_reason=why)) + "\n")
                tokens += len(out)
            f.flush()
            log(f"regenerate: {min(i + batch, len(todo))}/{len(todo)} prompts, {tokens / (time.time() - t0):.0f} "
                "tokens/s")
