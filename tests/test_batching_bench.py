"""benchmarks/batching.py runs end to end on a tiny pair and prints a figure per engine and concurrency."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tiny

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("extra,name", [(["--fixed-too"], "fixed K"), (["--draft-weights-too", "auto"], "draft auto")])
def test_batching_benchmark_prints_every_concurrency(tmp_path, extra, name):
    t, d = tiny.accepting_pair(str(tmp_path))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "batching.py"), "--target", t, "--draft", d,
                          "--concurrency", "1,3", "--num-requests", "6", "--max-tokens", "6", "--threads", "1",
                          *extra], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {int(m.group(1)): [float(x) for x in m.group(2).split()]
            for m in re.finditer(r"^\s+(\d+)\s+([\d.x ]+)$", out.stdout.replace("x", ""), re.M)}
    assert sorted(rows) == [1, 3]
    for figures in rows.values():
        # 3 aggregates, 2 ratios, 2 taus (adaptive: 0 when it never drafted), 3 per-user rates
        assert len(figures) == 10 and all(f > 0 for f in figures[:5] + figures[7:])
        if name == "fixed K":
            assert figures[5] == 0 or figures[5] >= 1 and figures[6] >= 1  # fixed K drafts every step
        assert abs(figures[3] - figures[1] / figures[0]) < 0.01 + 0.01 * figures[3]
    assert re.search(r"^DFlash/AR aggregate: c=1 [\d.]+x, c=3 [\d.]+x$", out.stdout, re.M)
    assert re.search(rf"^{name}/AR aggregate: c=1 [\d.]+x, c=3 [\d.]+x$", out.stdout, re.M)
    assert re.search(r"^AR scaling: concurrency 3 vs 1 = [\d.]+x$", out.stdout, re.M)
