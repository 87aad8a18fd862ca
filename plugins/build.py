"""Just-in-time builds of the C++ extensions (torch.utils.cpp_extension.load), cached per torch version.

Why JIT: building at install time makes pip fetch an unpinned (multi-GB CUDA) torch into its isolated build
environment; a JIT build uses the torch already installed and is cached, so it costs ~10 s once.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import threading

import torch

CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
_lock = threading.Lock()
_loaded: dict[str, object] = {}


def _headers(sources: list[str]) -> list[str]:
    dirs = sorted({os.path.dirname(s) for s in sources})
    return [os.path.join(d, f) for d in dirs for f in sorted(os.listdir(d)) if f.endswith((".h", ".cuh"))]


def build_dir(name: str, sources: list[str]) -> str:
    h = hashlib.sha256(torch.__version__.encode())
    for s in sources + _headers(sources):
        with open(s, "rb") as f:
            h.update(f.read())
    root = os.environ.get("DFLASH_TRT_BUILD") or os.path.join(
        os.environ.get("DFLASH_TRT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dflash_trt"),
        "build")
    d = os.path.join(root, f"{name}-{h.hexdigest()[:12]}")
    os.makedirs(d, exist_ok=True)
    return d


def staged_sources(d: str, sources: list[str]) -> list[str]:
    """Copies of the sources, and the headers beside them, in the build directory: the compile commands then
    name the same files whichever checkout or install the package runs from, so two of them share one build
    instead of rebuilding it for each other (torch rebuilds when a command's paths change). Files are written
    only when their bytes differ, so an unchanged build stays up to date."""
    src = os.path.join(d, "src")
    os.makedirs(src, exist_ok=True)
    out = []
    for path in sources + _headers(sources):
        dst = os.path.join(src, os.path.basename(path))
        with open(path, "rb") as f:
            data = f.read()
        if not os.path.isfile(dst) or open(dst, "rb").read() != data:
            tmp = f"{dst}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, dst)
        if path in sources:
            out.append(dst)
    return out


def load_extension(name: str, sources: list[str], extra_cflags: list[str] | None = None,
                   with_cuda: bool = False):
    """Build (once) and load a torch extension whose ops register themselves through TORCH_LIBRARY."""
    with _lock:
        if name in _loaded:
            return _loaded[name]
        from torch.utils.cpp_extension import load

        paths = [s if os.path.isabs(s) else os.path.join(CSRC, s) for s in sources]
        flags = ["-O3", "-fopenmp", "-ffp-contract=off"] + (extra_cflags or [])
        d = build_dir(name, paths)
        # torch's own build lock is a plain file (FileBaton) that a build killed mid-way leaves behind, and every
        # later load then waits on it forever. An flock dies with its process, so holding one means no live
        # build owns that file and it can go.
        with open(os.path.join(d, "build.flock"), "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            stale = os.path.join(d, "lock")
            if os.path.exists(stale):
                os.remove(stale)
            mod = load(name=name, sources=staged_sources(d, paths), extra_cflags=flags, extra_ldflags=["-fopenmp"],
                       build_directory=d, is_python_module=False, with_cuda=with_cuda, verbose=False)
        _loaded[name] = mod
        return mod
