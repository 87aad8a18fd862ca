"""The CPU engine keeps freed buffers in the heap (runtime/memory.py keep_freed_heap): a step's buffers of the
same sizes as the last step's must not come back as freshly faulted pages."""
import subprocess
import sys

import pytest

CHURN = """
import resource, sys, torch
from dflash_trt.memory import keep_freed_heap
if sys.argv[1] == "keep":
    assert keep_freed_heap()
def step():  # 50 one-MiB buffers written and freed, as a decode step's rows and logits are
    bufs = [torch.empty(1 << 18).fill_(1.0) for _ in range(50)]
    del bufs
step()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 10)
"""


def faults_per_step(mode: str) -> float:
    env = {"PATH": "/usr/bin:/bin"}  # no MALLOC_* tuning of the caller's
    out = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_buffers_are_reused_without_page_faults():
    pages = 50 * (1 << 20) // 4096  # what one step touches
    default, kept = faults_per_step("default"), faults_per_step("keep")
    assert default > 0.1 * pages, f"glibc's defaults faulted only {default} pages a step: the check shows nothing"
    assert kept < 0.1 * pages, f"{kept} page faults a step with the freed heap kept ({pages} pages touched)"


def test_the_users_malloc_settings_stand(monkeypatch):
    from dflash_trt.memory import keep_freed_heap

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert keep_freed_heap() is False
