"""benchmarks/drafter_report.py: a row per held-out kind and family, over exactly dflash-train's held-out set."""
import collections
import json
import os
import random
import subprocess
import sys

import tiny
from dflash_trt.builder.training.prompts import make_prompts
from dflash_trt.builder.training.split import family, split_records

REPORT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "drafter_report.py")


def test_report_rows_are_the_held_out_set_per_kind(tmp_path):
    t = tiny.make_target(str(tmp_path / "t"), layers=2, hidden=32, heads=2, kv_heads=1)
    d = tiny.make_drafter(str(tmp_path / "d"), t, block_size=4)
    rng = random.Random(0)
    recs = [dict(p, prompt_ids=[rng.randrange(4, 128) for _ in range(4)],
                 output_ids=[rng.randrange(4, 20) for _ in range(10)]) for p in make_prompts(200, 0)]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in recs))
    r = subprocess.run([sys.executable, REPORT, d, "--data", str(data), "--target", t, "--no-bench", "--threads", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = {c[1]: int(c[2]) for c in (line.split(" | ") for line in r.stdout.splitlines()) if len(c) > 4
            and c[0] == "| held out"}
    held = collections.Counter(x["kind"] for x in split_records(recs)[0])
    assert rows.pop("all") == sum(held.values())
    assert {k: n for k, n in rows.items() if " / " in k} == {f"{family(k)} / {k}": n for k, n in held.items()}
    for fam in {family(k) for k in held}:  # family totals where a family has several kinds
        kinds = [k for k in held if family(k) == fam]
        assert rows.get(f"{fam} (all)", sum(held[k] for k in kinds)) == sum(held[k] for k in kinds)
