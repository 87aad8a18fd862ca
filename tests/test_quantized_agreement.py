"""benchmarks/quantized_agreement.py end to end on a tiny pair: one row per format, bf16 agrees with itself."""
import importlib.util
import os

import pytest

import tiny

pytest.importorskip("modelopt", reason="needs nvidia-modelopt")
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "quantized_agreement.py")


def _script():
    spec = importlib.util.spec_from_file_location("quantized_agreement", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_table_on_a_tiny_pair(tmp_path, capsys):
    qa = _script()
    t, d = tiny.accepting_pair(str(tmp_path))
    work = str(tmp_path / "work")
    argv = ["--target", t, "--draft", d, "--work", work, "--num-prompts", "2", "--max-tokens", "8",
            "--calib-samples", "4", "--threads", "1"]
    assert qa.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("2 prompts, ") and "K = 7 (fixed)" in out[0]
    assert out[1].split() == ["format", "top-1", "agreement", "tau", "tau", "change"]
    rows = {r.split()[0]: [float(x) for x in r.split()[1:]] for r in out[2:]}
    assert list(rows) == ["bf16", "fp8", "nvfp4"] and len(out) == 5  # one row per format, nothing else
    for fmt, (agree, tau, change) in rows.items():
        assert 0.0 <= agree <= 1.0 and tau >= 1.0, fmt
    assert rows["bf16"][0] == 1.0 and rows["bf16"][2] == 0.0  # the reference agrees with itself
    assert rows["fp8"][0] > 0.5  # a broken dequantisation would agree by chance only (1/128)
    assert sorted(os.listdir(work)) == ["bf16", "fp8", "nvfp4"]


def test_bad_flags_are_one_line_errors(tmp_path, capsys):
    qa = _script()
    for argv, fragment in ((["--formats", "int4"], "--formats int4"), (["--target", str(tmp_path)], "go together"),
                           (["--num-prompts", "0"], "--num-prompts must be")):
        assert qa.main([*argv, "--work", str(tmp_path / "w")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err, err
    assert not (tmp_path / "w").exists()
