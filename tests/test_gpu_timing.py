"""benchmarks/gpu_timing.py on the CPU with tiny shapes: the same code path the GPU run takes (our TargetModel and
DFlashDrafter built from configs, paged caches, the three steps, floors, speed-up bounds), checked through its
JSON report. A few seconds on an idle core."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_timing.py")
MODELS = ["llama3.1-8b", "qwen3-8b", "llama3.1-8b-fp8"]
BATCHES = [1, 8, 32]
KS = [7, 15]  # verify K+1 = 8 and 16 rows; drafts of K tokens


def test_gpu_timing_tiny_cpu_report(tmp_path):
    out = tmp_path / "timing.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--tiny", "--reps", "1", "--threads", "1",
                        "--json", str(out)], capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "DFlash speed-up bound" in r.stdout and "plugin ops" in r.stdout
    rep = json.loads(out.read_text())
    assert rep["schema"] == "dflash-gpu-timing/1"
    assert rep["tiny"] is True and rep["device"] == "cpu" and rep["dtype"] == "bfloat16"
    assert rep["batches"] == BATCHES and rep["verify_rows"] == [8, 16] and rep["taus"] == [3, 5, 7]
    assert rep["bandwidth_gbs"] == 4800.0 and rep["context_tokens"] > 0 and rep["block_size"] == 16

    # one row per model, step, batch and K, each timed with positive floors
    want = {(m, "ar", b, 0) for m in MODELS for b in BATCHES}
    want |= {(m, s, b, k) for m in MODELS for s in ("verify", "draft") for b in BATCHES for k in KS}
    keys = [(r["model"], r["step"], r["batch"], r["k"]) for r in rep["rows"]]
    assert sorted(keys) == sorted(want)
    for row in rep["rows"]:
        assert row["ms"] > 0, row
        for f in ("bytes", "flops", "mem_floor_ms", "flop_floor_ms", "floor_ms", "pct_of_floor"):
            assert row[f] > 0, (f, row)
        assert row["floor_ms"] == max(row["mem_floor_ms"], row["flop_floor_ms"])
        assert abs(row["pct_of_floor"] - 100 * row["floor_ms"] / row["ms"]) < 1e-6 * row["pct_of_floor"]
        assert row["bound_by"] in ("memory", "compute")
        assert row["mode"] == "eager" and "CUDA" in row["note"]  # no graphs on a CPU, and it says so
        assert row["rows_per_seq"] == {"ar": 1, "verify": row["k"] + 1, "draft": 16}[row["step"]]
    by = {k: row for k, row in zip(keys, rep["rows"])}
    for m in MODELS:
        info = rep["models"][m]
        assert info["target"]["params"] > 0 and info["drafter"]["layers"] == 2 and info["drafter"]["block_size"] == 16
        for b in BATCHES:
            ar, v8, v16 = by[(m, "ar", b, 0)], by[(m, "verify", b, 7)], by[(m, "verify", b, 15)]
            # every step reads all target weights; more rows write more KV and do more arithmetic
            assert ar["bytes"] >= info["target"]["weight_bytes"] - info["target"]["vocab_size"] * \
                info["target"]["hidden_size"] * 2
            assert ar["bytes"] < v8["bytes"] < v16["bytes"] and ar["flops"] < v8["flops"] < v16["flops"]
            assert by[(m, "draft", b, 7)]["flops"] < by[(m, "draft", b, 15)]["flops"]
    fp8, bf16 = rep["models"]["llama3.1-8b-fp8"]["target"], rep["models"]["llama3.1-8b"]["target"]
    assert fp8["fp8_linears"] and not bf16["fp8_linears"] and fp8["params"] == bf16["params"]
    assert fp8["weight_bytes"] < bf16["weight_bytes"]  # decoder-layer linears at 1 byte per weight
    assert by[("llama3.1-8b-fp8", "ar", 1, 0)]["bytes"] < by[("llama3.1-8b", "ar", 1, 0)]["bytes"]
    assert rep["models"]["qwen3-8b"]["target"]["qk_norm"] is True
    assert rep["models"]["llama3.1-8b"]["target"]["rope_type"] == "llama3"

    # tau * t_ar / (t_draft(K) + t_verify(K+1)) for every model, batch and K
    bounds = {(s["model"], s["batch"], s["k"]): s for s in rep["speedup_bounds"]}
    assert set(bounds) == {(m, b, k) for m in MODELS for b in BATCHES for k in KS}
    for (m, b, k), s in bounds.items():
        assert s["verify_rows"] == k + 1
        t_ar, t_d, t_v = by[(m, "ar", b, 0)]["ms"], by[(m, "draft", b, k)]["ms"], by[(m, "verify", b, k)]["ms"]
        assert (s["t_ar_ms"], s["t_draft_ms"], s["t_verify_ms"]) == (t_ar, t_d, t_v)
        assert set(s["bound"]) == set(s["bound_at_floor"]) == {"3", "5", "7"}
        for tau in (3, 5, 7):
            assert abs(s["bound"][str(tau)] - tau * t_ar / (t_d + t_v)) < 1e-9 * s["bound"][str(tau)]
            assert s["bound_at_floor"][str(tau)] > 0

    # the plugin ops need CUDA: skipped with a reason, not an error
    assert rep["plugins"]["status"] == "skipped" and rep["plugins"]["rows"] == []
    assert rep["elapsed_s"] > 0
