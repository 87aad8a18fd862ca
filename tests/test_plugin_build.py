"""The JIT extension build survives a build killed mid-way: torch's lock file left behind must not make every
later load wait forever (it once hung CI for 90 minutes)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from dflash_trt.plugins import build, invariant


def test_stale_torch_lock_does_not_block_load(tmp_path):
    invariant.load()  # the cached build, so the copy below is up to date and nothing recompiles
    src = build.build_dir("dflash_bi", [os.path.join(build.CSRC, "invariant.cpp")])
    root = tmp_path / "build"
    dst = root / os.path.basename(src)
    shutil.copytree(src, dst)
    (dst / "lock").write_text("")  # what a killed torch.utils.cpp_extension.load leaves
    env = dict(os.environ, DFLASH_TRT_BUILD=str(root))
    code = ("import os; from dflash_trt.plugins import invariant, build; invariant.load(); "
            "print(build.build_dir('dflash_bi', [os.path.join(build.CSRC, 'invariant.cpp')]))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(dst)
    assert not (dst / "lock").exists()
