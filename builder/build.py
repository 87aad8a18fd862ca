"""Writing an engine directory atomically: a temporary directory beside the output, renamed into place at the end.

Layout:
  engine.json          what was built, from what, for which TensorRT-LLM, and the sha256 of every other file
  target/              the target (BF16 copy or ModelOpt FP8/NVFP4 export) + tokenizer files + config
  draft/               the drafter, BF16, z-lab format
  trtllm/dflash.yaml   LLM-API options (speculative_config DFlash, ...), for --config / --extra_llm_api_options
  trtllm/serve.sh, trtllm/serve_multinode.sh, trtllm/bench.sh
  vllm/serve.sh, sglang/serve.sh   the same target/ and draft/ on vLLM and SGLang (stacks.py)
On any error (or Ctrl-C) the temporary directory, and any parent directory this build created, are removed: no
partial output is ever left behind. With --force an existing output is replaced only once the new one is complete.

A build killed outright (SIGKILL, a crash, power loss) cannot clean up, so the temporary directory's name records
its owner, `.NAME.dflash-tmp-HOST-PID-XXXX`: the next build of NAME removes those whose process is gone. A disk
that fills up is reported as the path, the space the engine needs and the space there was (exit 2); the free
space is checked before any heavy work too.
"""
from __future__ import annotations

import datetime
import errno
import json
import os
import re
import shutil
import socket
import sys
import tempfile

from . import FORMAT_VERSION, stacks, trtllm
from dflash_trt.checkpoint import sha256_file

from .calib import Tokenize
from .draft import write_draft
from .errors import BuildError
from .progress import Progress
from .quantize import write_target_bf16, write_target_modelopt
from .gpus import drafter_attention
from .validate import BuildPlan, validate_plan

ENGINE_JSON = "engine.json"
SCRIPTS = ("serve.sh", "serve_multinode.sh", "bench.sh")
# what a build writes beside --output while it runs: a temporary engine, and a replaced one (--force)
_SCRATCH_KINDS = ("tmp", "old")
GiB = 1 << 30
# the weights ModelOpt quantizes: every decoder projection (attention, MLP, experts); lm_head stays excluded
QUANTIZED_WEIGHT = re.compile(r"^model\.layers\.\d+\..*_proj\.weight$")


def list_files(root: str) -> list[str]:
    """Every regular file under root, relative, '/'-separated, sorted; engine.json itself excluded."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
            if rel != ENGINE_JSON:
                out.append(rel)
    return sorted(out)


def sha256_files(root: str, rels: list[str], progress: Progress, description: str = "hashing") -> dict[str, str]:
    sizes = {r: os.path.getsize(os.path.join(root, r)) for r in rels}
    out = {}
    with progress.task(description, total=sum(sizes.values()) or 1, unit="bytes") as advance:
        for r in rels:
            out[r] = sha256_file(os.path.join(root, r), advance)
    return out


def _write_trtllm(plan: BuildPlan, dst: str, final_output: str) -> None:
    from dflash_trt import __version__

    os.makedirs(dst)
    d = plan.dcfg
    ep = plan.ep_size if plan.tcfg.moe is not None else None  # dense targets: no MoE settings at all
    attention, why = drafter_attention(plan.gpu)
    opts = trtllm.llm_api_options(
        draft_dir=os.path.join(final_output, "draft"), max_draft_len=plan.max_draft_len,
        mask_token_id=d.mask_token_id, target_layer_ids=d.target_layer_ids, max_seq_len=plan.max_seq_len,
        max_batch_size=plan.max_batch_size, max_num_tokens=plan.max_num_tokens, kv_cache_dtype=plan.kv_cache_dtype,
        ep_size=ep, drafter_attention=attention, kv_cache_reuse=plan.kv_cache_reuse,
        context_recompute_tail=plan.context_recompute_tail, rejection_sampling=plan.rejection_sampling,
        hybrid=plan.tcfg.hybrid is not None)
    trtllm.check_options(opts)
    header = (f"# TensorRT-LLM {trtllm.TRTLLM_VERSION} LLM-API options written by dflash-build {__version__}.\n"
              f"# trtllm-serve serve <engine>/target --backend pytorch --tp_size {plan.tp_size} --config dflash.yaml\n"
              f"# drafter attention_backend {attention}: {why}.\n")
    with open(os.path.join(dst, "dflash.yaml"), "w") as f:
        f.write(header + trtllm.to_yaml(opts, comments=trtllm.yaml_comments(opts)))
    common = dict(tool_version=__version__, tp_size=plan.tp_size, max_seq_len=plan.max_seq_len,
                  max_batch_size=plan.max_batch_size, max_num_tokens=plan.max_num_tokens, ep_size=ep)
    scripts = {
        "serve.sh": trtllm.serve_script(**common),
        "serve_multinode.sh": trtllm.serve_multinode_script(**common),
        "bench.sh": trtllm.bench_script(tool_version=__version__, model_name=os.path.basename(plan.target),
                                        tp_size=plan.tp_size, max_batch_size=plan.max_batch_size, ep_size=ep),
    }
    _write_scripts(dst, scripts)


def _write_scripts(dst: str, scripts: dict[str, str]) -> None:
    os.makedirs(dst, exist_ok=True)
    for name, text in scripts.items():
        path = os.path.join(dst, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)


def _write_other_stacks(plan: BuildPlan, root: str, which: tuple[str, ...]) -> None:
    from dflash_trt import __version__

    common = dict(tool_version=__version__, tp_size=plan.tp_size, max_draft_len=plan.max_draft_len,
                  max_seq_len=plan.max_seq_len, max_batch_size=plan.max_batch_size,
                  kv_cache_dtype=plan.kv_cache_dtype, kv_cache_reuse=plan.kv_cache_reuse)
    if "vllm" in which:
        _write_scripts(os.path.join(root, "vllm"), {
            "serve.sh": stacks.vllm_serve_script(**common, max_num_tokens=plan.max_num_tokens)})
    if "sglang" in which:
        _write_scripts(os.path.join(root, "sglang"), {"serve.sh": stacks.sglang_serve_script(**common)})


def plan_stacks(plan: BuildPlan) -> tuple[str, ...]:
    return stacks.stacks_for(plan.dcfg.raw.get("architectures"))


def engine_record(plan: BuildPlan, target_info: dict, files: dict[str, str]) -> dict:
    from dflash_trt import __version__

    t, d = plan.tcfg, plan.dcfg
    return {
        "format_version": FORMAT_VERSION,
        "tool": {"name": "dflash-build", "version": __version__},
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tensorrt_llm_version": trtllm.TRTLLM_VERSION,
        "sources": {"target": plan.target, "draft": plan.draft,
                    "calib_data": (plan.calib_data or "builtin") if plan.uses_modelopt else None},
        "architecture": plan.architecture,
        "model_type": t.model_type,
        "quantization": plan.quantization,
        "kv_cache_dtype": plan.kv_cache_dtype,
        "tp_size": plan.tp_size,
        "ep_size": plan.ep_size if t.moe is not None else None,
        "moe": None if t.moe is None else {"num_experts": t.moe.num_experts, "experts_per_token": t.moe.top_k},
        "sliding_window": t.sliding_window if t.layer_types and "sliding_attention" in t.layer_types else None,
        "linear_attention_layers": None if t.hybrid is None else list(t.hybrid.linear_layers),
        "block_size": d.block_size,
        "max_draft_len": plan.max_draft_len,
        "target_layer_ids": list(d.target_layer_ids),
        "mask_token_id": d.mask_token_id,
        "max_seq_len": plan.max_seq_len,
        "max_batch_size": plan.max_batch_size,
        "max_num_tokens": plan.max_num_tokens,
        "draft_dtype": "bfloat16",
        "gpu": plan.gpu,
        "drafter_attention_backend": drafter_attention(plan.gpu)[0],
        "kv_cache_reuse": plan.kv_cache_reuse,
        "context_recompute_tail": plan.context_recompute_tail,
        "rejection_sampling": plan.rejection_sampling,
        "stacks": list(plan_stacks(plan)),
        "modelopt": target_info.get("modelopt"),
        "calibration": target_info.get("calibration"),
        "files": files,
    }


def _normalise_modes(root: str) -> None:
    """mkdtemp makes the directory 0700 and safetensors writes 0600: give the usual umask-based modes instead."""
    umask = os.umask(0)
    os.umask(umask)
    for d, _, files in os.walk(root):
        os.chmod(d, 0o777 & ~umask)
        for f in files:
            p = os.path.join(d, f)
            os.chmod(p, (0o777 if os.access(p, os.X_OK) else 0o666) & ~umask)


def _make_parents(path: str) -> list[str]:
    """mkdir -p, returning the directories it created (deepest last) so a failed build can remove them."""
    created = []
    probe = path
    while probe and not os.path.exists(probe):
        created.append(probe)
        probe = os.path.dirname(probe)
    for d in reversed(created):
        os.mkdir(d)
    return list(reversed(created))


def _host() -> str:
    # a name part: no separators, so the owner can be read back from a directory name
    return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:40] or "host"


def scratch_prefix(output: str, kind: str) -> str:
    """`.NAME.dflash-KIND-HOST-PID-`: the owner of a scratch directory, for stale_scratch."""
    return f".{os.path.basename(output)}.dflash-{kind}-{_host()}-{os.getpid()}-"


def _make_scratch(output: str, kind: str) -> str:
    return tempfile.mkdtemp(prefix=scratch_prefix(output, kind), dir=os.path.dirname(output))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def stale_scratch(output: str) -> tuple[list[str], list[str]]:
    """(ours and dead: safe to remove, unknown owner: left alone) scratch directories of this output's builds.

    Only this host's entries can be judged (a pid means nothing on another machine sharing the filesystem);
    a directory named by an older dflash-build, without an owner, is reported but never removed."""
    parent, name = os.path.dirname(output), os.path.basename(output)
    pattern = re.compile(rf"^\.{re.escape(name)}\.dflash-(?:{'|'.join(_SCRATCH_KINDS)})-(.+)$")
    owned = re.compile(rf"^{re.escape(_host())}-(\d+)-[^-]+$")
    dead, unknown = [], []
    try:
        entries = sorted(os.listdir(parent))
    except OSError:
        return [], []
    for entry in entries:
        m = pattern.match(entry)
        if not m:
            continue
        who = owned.match(m.group(1))
        path = os.path.join(parent, entry)
        if who is None:
            if not re.match(r"^[^-]+-\d+-[^-]+$", m.group(1)):  # no owner recorded at all
                unknown.append(path)
            continue
        if int(who.group(1)) != os.getpid() and not _pid_alive(int(who.group(1))):
            dead.append(path)
    return dead, unknown


def clear_stale_scratch(output: str) -> list[str]:
    """Remove the scratch of this output's killed builds; returns the warnings to print."""
    dead, unknown = stale_scratch(output)
    for path in dead:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except OSError:
                pass
    return [f"{path} was left by an earlier dflash-build that recorded no owner: remove it if no build is running"
            for path in unknown]


def estimate_bytes(plan: BuildPlan) -> int:
    """About what the engine directory will hold: the target in its output format, the BF16 drafter, the rest."""
    item = {"F64": 8, "F32": 4, "I64": 8, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "U8": 1, "I8": 1,
            "F8_E4M3": 1, "F8_E5M2": 1, "BOOL": 1}
    per_weight = {"bf16": 2.0, "fp8": 1.0, "nvfp4": 0.5 + 1 / 16}[plan.quantization]
    total = 0
    for name, (shape, dtype) in plan.target_shapes.items():
        n = 1
        for dim in shape:
            n *= dim
        floating = dtype in ("F64", "F32", "F16", "BF16")
        if floating and QUANTIZED_WEIGHT.match(name):
            total += int(n * per_weight)
        else:
            total += n * (2 if floating else item.get(dtype, 4))
    from dflash_trt.checkpoint import tensor_shapes

    for shape, dtype in tensor_shapes(plan.draft, "drafter").values():
        n = 1
        for dim in shape:
            n *= dim
        total += n * (2 if dtype in ("F64", "F32", "F16", "BF16") else item.get(dtype, 4))
    side = sum(os.path.getsize(os.path.join(plan.target, f)) for f in os.listdir(plan.target)
               if not f.endswith((".safetensors", ".bin", ".pt")) and os.path.isfile(os.path.join(plan.target, f)))
    return total + side + total // 100 + (1 << 20)  # safetensors headers, configs, scripts, engine.json


def _existing_dir(path: str) -> str:
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    return path or "."


def _fmt(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / (1 << 20):.1f} MiB"


def check_space(plan: BuildPlan, need: int) -> None:
    """Refuse a build that cannot fit before any heavy work."""
    where = _existing_dir(os.path.dirname(plan.output))
    free = shutil.disk_usage(where).free
    if free < need:
        raise BuildError(f"not enough space for --output {plan.output}: the engine needs about {_fmt(need)}, "
                         f"{where} has {_fmt(free)} free: free some space or choose another --output")


def _io_errno(e: BaseException) -> int | None:
    """The errno of a failed file operation: an OSError, or a Rust I/O error (safetensors' SafetensorError says
    "I/O error: ... (os error 28)")."""
    if isinstance(e, OSError):
        return e.errno
    m = re.search(r"\(os error (\d+)\)", str(e))
    return int(m.group(1)) if m else None


def _os_error(e: BaseException, plan: BuildPlan, need: int) -> BuildError:
    """A failed file operation while building, as the one line a user can act on."""
    code = _io_errno(e)
    path = str(getattr(e, "filename", None) or plan.output)
    scratch = re.compile(rf"^{re.escape(os.path.dirname(plan.output))}/\.{re.escape(os.path.basename(plan.output))}"
                         r"\.dflash-(?:tmp|old)-[^/]+")
    path = scratch.sub(plan.output, path)  # the scratch directory is an implementation detail: name the output
    strerror = getattr(e, "strerror", None) or (os.strerror(code) if code else str(e))
    if code in (errno.ENOSPC, errno.EDQUOT):
        where = _existing_dir(os.path.dirname(plan.output))
        return BuildError(f"no space left writing {path} ({strerror}): the engine needs about {_fmt(need)} in "
                          f"{where} (free: {_fmt(shutil.disk_usage(where).free)} after cleaning up): free some "
                          "space or choose another --output; nothing was written")
    if not _is_within_dir(path, os.path.dirname(plan.output)):  # a source went missing or unreadable mid-build
        return BuildError(f"cannot read {path} while building --output {plan.output}: {strerror}: check the "
                          "--target / --draft files; nothing was written")
    return BuildError(f"cannot write --output {plan.output}: {path}: {strerror}: choose another --output "
                      "(a writable directory on a regular filesystem); nothing was written")


def _is_within_dir(path: str, parent: str) -> bool:
    path, parent = os.path.abspath(str(path)), os.path.abspath(parent)
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def _commit(tmp: str, output: str, force: bool) -> None:
    if not os.path.lexists(output):
        os.rename(tmp, output)
        return
    if not force:  # appeared while we were building
        raise BuildError(f"output {output} already exists: pass --force to replace it, or choose another --output")
    old = _make_scratch(output, "old")
    os.rmdir(old)
    os.rename(output, old)
    try:
        os.rename(tmp, output)
    except BaseException:
        os.rename(old, output)  # put the previous build back
        raise
    if os.path.isdir(old) and not os.path.islink(old):
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.remove(old)


def build_engine(plan: BuildPlan, progress: Progress | None = None) -> dict:
    """Validate, then write the engine directory. Returns the engine.json record."""
    progress = progress or Progress(enabled=False)
    validate_plan(plan)
    plan.warnings += clear_stale_scratch(plan.output)
    need = estimate_bytes(plan)
    output = plan.output
    which = plan_stacks(plan)
    created, tmp = [], None
    try:
        # the scratch directory first: an output where nothing can be written fails here, before any heavy work
        created = _make_parents(os.path.dirname(output))
        tmp = _make_scratch(output, "tmp")
        check_space(plan, need)
        for line in plan.warnings:
            sys.stderr.write(f"warning: {line}\n")
        if "trtllm" not in which:  # one line, even with --quiet: the directory has no trtllm/ on purpose
            others = ", ".join(f"{s}/serve.sh" for s in which)
            sys.stderr.write(f"note: TensorRT-LLM {trtllm.TRTLLM_VERSION} cannot run a "
                             f"{'/'.join(plan.dcfg.raw.get('architectures') or [])} drafter (DFlash2 has only an "
                             f"RFC there, TensorRT-LLM #18085), so no trtllm/ files are written: this engine directory "
                             f"serves natively (dflash-serve, dflash-generate) and with {others}\n")
        if plan.quantization != "bf16":  # what stays unquantized, and why: the build log says it too
            from .families import default_exclusions, exclusions
            for e in exclusions(plan.tcfg, plan.quantization) + default_exclusions(plan.tcfg, plan.quantization):
                progress.log(f"kept unquantized ({plan.quantization}): {e.modules}: {e.why}")
        if plan.gpu is not None:
            attention, why = drafter_attention(plan.gpu)
            sys.stderr.write(f"drafter attention: {attention} ({why})\n")
        tokenize = None
        if plan.uses_modelopt:  # the tokenizer is loaded (and checked) before any heavy work
            tokenize = Tokenize(plan.target, plan.tcfg.vocab_size, plan.calib_max_tokens)
        elif plan.calib_data is not None:
            progress.log("note: --calib-data is unused: a bf16 build with --kv-cache-dtype auto needs no "
                         "calibration")
        if plan.uses_modelopt:
            info = write_target_modelopt(plan, os.path.join(tmp, "target"), plan.calib_texts, tokenize, progress)
        else:
            info = write_target_bf16(plan, os.path.join(tmp, "target"), progress)
        write_draft(plan, os.path.join(tmp, "draft"), progress)
        if "trtllm" in which:
            _write_trtllm(plan, os.path.join(tmp, "trtllm"), output)
        _write_other_stacks(plan, tmp, which)
        files = sha256_files(tmp, list_files(tmp), progress)
        record = engine_record(plan, info, files)
        with open(os.path.join(tmp, ENGINE_JSON), "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
        _normalise_modes(tmp)
        _commit(tmp, output, plan.force)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for d in reversed(created):
            try:
                os.rmdir(d)
            except OSError:
                pass
        if not isinstance(e, BuildError) and _io_errno(e) is not None:
            raise _os_error(e, plan, need) from None
        raise
    return record
