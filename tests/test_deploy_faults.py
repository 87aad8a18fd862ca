"""dflash-build under faults: a build killed outright, a disk that fills up, an output nothing can be written to.
Each ends as one line naming the path and the fix, exit 2, and nothing left behind."""
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import tiny
import dflash_trt.builder.build as build_mod
from dflash_trt.builder.cli import main as build_main

HOST = build_mod._host()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    t = tiny.make_target(str(root / "t"), "llama")
    d = tiny.make_drafter(str(root / "d"), t, block_size=8)
    return t, d


def scratch(parent):
    return sorted(n for n in os.listdir(parent) if ".dflash-" in n)


def one_line(err):
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


# -- a build killed mid-way ------------------------------------------------------------------------------------
def test_a_killed_build_leaves_scratch_that_the_next_build_clears(pair, tmp_path):
    """A real build process SIGKILLs itself while writing the drafter (nothing can clean up after SIGKILL); its
    temporary directory stays beside --output, named after its host and pid. The next build of that output removes
    it, and is not fooled into removing a live build's or another output's."""
    t, d = pair
    out = tmp_path / "engine"
    child = textwrap.dedent(f"""
        import os, signal, sys
        import dflash_trt.builder.build as b
        def killed(*a, **k):
            os.kill(os.getpid(), signal.SIGKILL)
        b.write_draft = killed
        from dflash_trt.builder.cli import main
        sys.exit(main(["--target", {t!r}, "--draft", {d!r}, "--output", {str(out)!r}, "--quiet"]))
    """)
    r = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL
    left = scratch(tmp_path)
    assert len(left) == 1 and left[0].startswith(f".engine.dflash-tmp-{HOST}-") and not out.exists()
    assert os.path.isdir(tmp_path / left[0] / "target")  # a real half-written engine

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        keep = [f".engine.dflash-tmp-{HOST}-{live.pid}-abcd1234",       # a build still running
                f".engine.dflash-tmp-otherhost-{os.getpid()}-abcd1234",  # another machine's: its pid means nothing
                f".other.dflash-tmp-{HOST}-999999999-abcd1234"]          # another output's
        for name in keep:
            os.makedirs(tmp_path / name)
        os.makedirs(tmp_path / ".engine.dflash-tmp-q1w2e3r4")  # an older dflash-build's: no owner recorded
        dead_old = f".engine.dflash-old-{HOST}-999999999-zz"  # a --force swap of a dead build
        os.makedirs(tmp_path / dead_old)
        r2 = subprocess.run([sys.executable, "-m", "dflash_trt.builder.cli", "--target", t, "--draft", d,
                             "--output", str(out), "--quiet"], capture_output=True, text=True, timeout=300)
    finally:
        live.kill()
        live.wait()
    assert r2.returncode == 0, r2.stderr
    assert r2.stderr.splitlines() == [
        f"warning: {tmp_path}/.engine.dflash-tmp-q1w2e3r4 was left by an earlier dflash-build that recorded no "
        "owner: remove it if no build is running"]
    assert scratch(tmp_path) == sorted(keep + [".engine.dflash-tmp-q1w2e3r4"])
    assert json.loads((out / "engine.json").read_text())["max_draft_len"] == 7


# -- a full disk -----------------------------------------------------------------------------------------------
def test_enospc_mid_build_is_one_line_and_leaves_nothing(pair, tmp_path, monkeypatch, capsys):
    """ENOSPC raised by a writer (as the kernel raises it): exit 2, the path and the space needed, no scratch, and
    with --force the previous engine survives."""
    t, d = pair
    out = tmp_path / "engine"
    assert build_main(["--target", t, "--draft", d, "--output", str(out), "--quiet", "--max-draft-len", "3"]) == 0
    capsys.readouterr()

    def full(plan, dst, progress):
        os.makedirs(dst)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(dst, "model.safetensors"))

    monkeypatch.setattr(build_mod, "write_draft", full)
    assert build_main(["--target", t, "--draft", d, "--output", str(out), "--quiet", "--force"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"error: no space left writing {out}/draft/model.safetensors (No space left on device): "
                           "the engine needs about ")
    assert f"in {tmp_path} (free: " in line and "free some space or choose another --output" in line
    assert scratch(tmp_path) == [] and json.loads((out / "engine.json").read_text())["max_draft_len"] == 3

    # safetensors' Rust writer reports it as a SafetensorError "... (os error 28)", not an OSError
    class SafetensorError(Exception):
        pass

    def rust_full(plan, dst, progress):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(build_mod, "write_draft", rust_full)
    fresh = tmp_path / "fresh" / "engine"
    assert build_main(["--target", t, "--draft", d, "--output", str(fresh), "--quiet"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"error: no space left writing {fresh} (No space left on device): the engine needs about")
    assert not (tmp_path / "fresh").exists()  # the parent this build created is gone too


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem of a given size (tmpfs; needs root), unmounted afterwards."""
    mounted = []

    def make(size_bytes):
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(where)],
                           capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); the injected ENOSPC test covers it")
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", str(where)], check=True)


def test_a_disk_too_small_is_refused_before_any_work(pair, small_disk, capsys):
    t, d = pair
    disk = small_disk(256 * 1024)
    out = disk / "engine"
    assert build_main(["--target", t, "--draft", d, "--output", str(out), "--quiet"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"error: not enough space for --output {out}: the engine needs about ")
    assert f"{disk} has 0.2 MiB free" in line
    assert os.listdir(disk) == []


def test_a_disk_that_fills_during_the_build(pair, small_disk, monkeypatch, capsys):
    """Room at the start, none when the drafter is written (another writer filled the disk): the real ENOSPC of
    the real safetensors writer, reported in one line; the build's files are gone, the other writer's stay."""
    t, d = pair
    disk = small_disk(4 << 20)
    out = disk / "engine"
    real = build_mod.write_draft

    def another_writer_fills_the_disk(plan, dst, progress):
        with open(disk / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC
        return real(plan, dst, progress)

    monkeypatch.setattr(build_mod, "write_draft", another_writer_fills_the_disk)
    assert build_main(["--target", t, "--draft", d, "--output", str(out), "--quiet"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"error: no space left writing {out}") and "the engine needs about" in line
    assert os.listdir(disk) == ["filler"]


def test_an_output_on_a_pseudo_filesystem(pair, tmp_path, capsys):
    t, d = pair
    for out in ("/proc/dflash-x", "/sys/dflash-x"):
        rc = build_main(["--target", t, "--draft", d, "--output", out, "--quiet"])
        line = one_line(capsys.readouterr().err)
        assert rc == 2 and line.startswith(f"error: cannot write --output {out}: {out}: "), line
        assert "internal failure" not in line and not os.path.exists(out)
