"""The JIT extension build survives a build killed mid-way (as the end of a session kills it): torch's lock file
left behind must not make every later load wait forever (it once hung CI for 90 minutes). A half-written object
or library needs nothing of ours: ninja logs a command only once it completes, and rebuilds what it has not logged."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

SOURCE = r"""
#include <ATen/ATen.h>
#include <torch/library.h>
at::Tensor twice(const at::Tensor& x) { return x.mul(2); }
TORCH_LIBRARY(dflash_build_test, m) { m.def("twice(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(dflash_build_test, CPU, m) { m.impl("twice", twice); }
"""
LOAD = ("import sys, torch; from dflash_trt.plugins import build; build.load_extension('dflash_build_test', "
        "[sys.argv[1]]); print(build.build_dir('dflash_build_test', [sys.argv[1]])); "
        "assert torch.ops.dflash_build_test.twice(torch.ones(2)).tolist() == [2.0, 2.0]")


def _load(src: str, root: str) -> str:
    out = subprocess.run([sys.executable, "-c", LOAD, src], env=dict(os.environ, DFLASH_TRT_BUILD=root),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ext")
    src = tmp / "twice.cpp"
    src.write_text(SOURCE)
    root = str(tmp / "build")
    return str(src), root, _load(str(src), root)


def test_stale_torch_lock_does_not_block_load(built):
    src, root, d = built
    with open(os.path.join(d, "lock"), "w"):
        pass  # what a killed torch.utils.cpp_extension.load leaves
    assert _load(src, root) == d
    assert not os.path.exists(os.path.join(d, "lock"))
