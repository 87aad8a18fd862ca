"""Reading safetensors checkpoints (single file or sharded with an index) without transformers."""
from __future__ import annotations

import glob
import hashlib
import json
import os
from typing import Iterator

import torch
from safetensors import safe_open

from .errors import CheckpointError


def safetensors_files(path: str, what: str) -> list[str]:
    if not os.path.isdir(path):
        raise CheckpointError(f"{what} directory not found: {path}")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"{what} index {index} is unreadable: {e}") from None
        files = [os.path.join(path, s) for s in shards]
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise CheckpointError(f"{what} shard missing: {missing[0]} (listed in model.safetensors.index.json)")
        return files
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise CheckpointError(f"{what} directory {path} has no *.safetensors weights")
    return files


def size_problem(file: str) -> str | None:
    """What is wrong with a safetensors file's size against its own header (8-byte length, JSON, then the data
    the header's largest offset ends), or None: a truncated or padded file, read without loading it."""
    size = os.path.getsize(file)
    try:
        with open(file, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < n <= size - 8:
                return f"{size} bytes: too short for its header"
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        return f"unreadable header ({e})"
    want = 8 + n + end
    return None if size == want else f"{size} bytes where its header says {want}"


def iter_tensors(path: str, what: str) -> Iterator[tuple[str, "safe_open", str]]:
    """Yields (name, handle, file) so callers can read whole tensors or slices (tensor parallelism)."""
    for file in safetensors_files(path, what):
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    yield name, f, file
        except CheckpointError:
            raise
        except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
            raise CheckpointError(f"{what} weights {file} are unreadable: {e}") from None


def load_state_dict(path: str, what: str, strip_prefix: str = "") -> dict[str, torch.Tensor]:
    out = {}
    for name, f, _ in iter_tensors(path, what):
        key = name[len(strip_prefix):] if strip_prefix and name.startswith(strip_prefix) else name
        out[key] = f.get_tensor(name)
    return out


def tensor_shapes(path: str, what: str) -> dict[str, tuple[list[int], str]]:
    """Names, shapes and dtypes without reading data: for validation before heavy work."""
    out = {}
    for name, f, _ in iter_tensors(path, what):
        sl = f.get_slice(name)
        out[name] = (list(sl.get_shape()), sl.get_dtype())
    return out


def sha256_file(path: str, advance=None) -> str:
    """The file's hex sha256, read in 4 MiB chunks; advance(n) after each (a progress bar's)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
            if advance is not None:
                advance(len(chunk))
    return h.hexdigest()
