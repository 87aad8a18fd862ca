"""`dflash-serve --backend trtllm`: hand a dflash-build engine directory to `trtllm-serve` (PyTorch backend).

The command is the one the engine's own `trtllm/serve.sh` runs (same flags, taken from the builder's
`dflash_trt.builder.trtllm`, and the same values, read from engine.json), with the same relocation rule: the
drafter is named by absolute path in `trtllm/dflash.yaml`, so an engine directory that was moved (or mounted
elsewhere, as in a container) is served with a rewritten copy of the YAML naming its `draft/` where it is now.
Overrides (--max-batch-size, --max-num-tokens, --max-seq-len, --max-draft-len) go into that copy too, since
trtllm-serve lets the --config file win over its own flags.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import tempfile
from dataclasses import dataclass

from ..errors import DFlashError

ENGINE_JSON = "engine.json"
CONFIG = os.path.join("trtllm", "dflash.yaml")


@dataclass
class TrtllmLaunch:
    argv: list[str]
    config_path: str  # trtllm/dflash.yaml itself, or a rewritten copy
    config_text: str  # what trtllm-serve reads with --config
    rewritten: bool  # config_path is a copy (moved engine directory, or overrides)
    engine: dict  # engine.json

    def command(self) -> str:
        return shlex.join(self.argv)


def read_engine(engine_dir: str) -> dict:
    path = os.path.join(engine_dir, ENGINE_JSON)
    if not os.path.isfile(path):
        raise DFlashError(f"{engine_dir} is not a dflash-build engine directory (no {ENGINE_JSON}): build one with "
                          "`dflash-build --target DIR --draft DIR --output ENGINE_DIR`, or use --backend native")
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise DFlashError(f"cannot read {path}: {e}") from None
    for need in ("target", "draft", CONFIG):
        if not os.path.exists(os.path.join(engine_dir, need)):
            raise DFlashError(f"{engine_dir} has no {need}: the engine directory is incomplete, rebuild it "
                              "with dflash-build")
    return rec


def _yaml_value(raw: str) -> str:
    raw = raw.strip()
    if raw.startswith('"'):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def rewrite_config(text: str, *, draft_dir: str, overrides: dict) -> tuple[str, bool]:
    """dflash.yaml with speculative_model = draft_dir and the given top-level / speculative overrides.

    The builder writes block-style YAML with two-space nesting (builder/trtllm.py: to_yaml); this edits those
    lines in place, like serve.sh's sed, so comments and layout stay as written. Returns (text, changed).
    """
    out, section, changed = [], None, False
    for line in text.splitlines(keepends=True):
        m = re.match(r"^( *)([A-Za-z_][A-Za-z0-9_]*):(.*?)(\r?\n)?$", line)
        if m and not line.lstrip().startswith("#"):
            indent, key, value, nl = len(m.group(1)), m.group(2), m.group(3), m.group(4) or ""
            if indent == 0:
                section = key
            new = None
            if section == "speculative_config" and indent == 2 and key == "speculative_model":
                if _yaml_value(value) != draft_dir:
                    new = json.dumps(draft_dir)  # a JSON string is a valid YAML double-quoted scalar
            elif section == "speculative_config" and indent == 2 and key == "max_draft_len":
                new = overrides.get("max_draft_len")
            elif indent == 0 and key in ("max_seq_len", "max_batch_size", "max_num_tokens"):
                new = overrides.get(key)
            elif section == "cuda_graph_config" and indent == 2 and key == "max_batch_size":
                new = overrides.get("max_batch_size")
            if new is not None and _yaml_value(value) != str(new):
                line = f"{m.group(1)}{key}: {new}{nl}"
                changed = True
        out.append(line)
    return "".join(out), changed


def launch_plan(engine_dir: str, *, host: str, port: int, tp_size: int | None = None,
                max_batch_size: int | None = None, max_num_tokens: int | None = None,
                max_seq_len: int | None = None, max_draft_len: int | None = None,
                served_model_name: str | None = None, extra_args: list[str] | tuple = (),
                tmpdir: str | None = None) -> TrtllmLaunch:
    """The exact trtllm-serve command line (and the YAML it reads). Writes the rewritten YAML copy when needed."""
    from ..builder import trtllm as files  # the flags serve.sh uses; a light module (no torch, no builder deps)

    engine = os.path.abspath(engine_dir)
    rec = read_engine(engine)
    values = {"tp_size": tp_size, "max_seq_len": max_seq_len, "max_batch_size": max_batch_size,
              "max_num_tokens": max_num_tokens}
    for k in values:
        if values[k] is None:
            values[k] = rec.get(k)
            if not isinstance(values[k], int):
                raise DFlashError(f"{engine}/{ENGINE_JSON} has no integer {k!r}: rebuild the engine with dflash-build")
        elif values[k] < 1:
            raise DFlashError(f"--{k.replace('_', '-')} {values[k]} must be a positive integer")
    block = rec.get("block_size")
    if max_draft_len is not None and isinstance(block, int) and not 1 <= max_draft_len < block:
        raise DFlashError(f"--max-draft-len {max_draft_len} must be in 1..{block - 1} (the drafter's block_size "
                          f"is {block})")
    config = os.path.join(engine, CONFIG)
    with open(config) as f:
        original = f.read()
    overrides = {k: v for k, v in (("max_seq_len", max_seq_len), ("max_batch_size", max_batch_size),
                                   ("max_num_tokens", max_num_tokens), ("max_draft_len", max_draft_len))
                 if v is not None}
    text, changed = rewrite_config(original, draft_dir=os.path.join(engine, "draft"), overrides=overrides)
    if changed:
        fd, config = tempfile.mkstemp(prefix="dflash-", suffix=".yaml", dir=tmpdir)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    flags = shlex.split(files._common_flags(values["tp_size"], values["max_seq_len"], values["max_batch_size"],
                                            values["max_num_tokens"]))
    argv = ["trtllm-serve", "serve", os.path.join(engine, "target"), *flags, "--config", config,
            "--host", host, "--port", str(port)]
    if served_model_name:
        argv += ["--served_model_name", served_model_name]
    argv += list(extra_args)
    return TrtllmLaunch(argv, config, text, changed, rec)


def trtllm_version() -> str | None:
    for dist in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_available() -> None:
    """Raises DFlashError (one line) unless TensorRT-LLM is importable and trtllm-serve is on PATH."""
    from ..builder.trtllm import TRTLLM_VERSION

    where = f"run inside nvcr.io/nvidia/tensorrt-llm/release:{TRTLLM_VERSION} (see Dockerfile), or use --backend native"
    if importlib.util.find_spec("tensorrt_llm") is None:
        raise DFlashError(f"--backend trtllm needs TensorRT-LLM {TRTLLM_VERSION}, and tensorrt_llm is not "
                          f"importable here: {where}")
    if shutil.which("trtllm-serve") is None:
        raise DFlashError(f"--backend trtllm: tensorrt_llm is installed but trtllm-serve is not on PATH: {where}")


def exec_plan(plan: TrtllmLaunch) -> None:  # pragma: no cover - replaces this process
    os.execvp(plan.argv[0], plan.argv)
