"""ascend-patch demo: every stage's result checked on small settings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import child_env

pytestmark = pytest.mark.slow


def test_demo_runs_every_stage(tmp_path, capsys, monkeypatch):
    from ascend_patch.demo import run_demo

    for name in [n for n in os.environ if n.startswith("ASCEND_PATCH")]:
        monkeypatch.delenv(name)
    workdir = tmp_path / "demo"
    result = run_demo(str(workdir), device="cpu", nproc=4, tp=2, pp=2, steps=25)
    out = capsys.readouterr().out
    assert result.loss_fell and result.losses[-1] < result.losses[0] - 1.0  # from ~ln 256 down
    assert len(result.losses) == 25
    assert result.round_trip_tensors == 46  # every tensor of the tiny Qwen3, bit-identical
    assert result.hf_loss < 4.0  # transformers runs the trained weights: far below random (5.5)
    assert result.generated  # generation ran
    for stage in range(1, 7):
        assert f"[{stage}/6]" in out
    assert "OK: no errors" in out and "verify OK" in out
    assert result.kept and os.path.isdir(workdir / "trained") and os.path.isdir(workdir / "hf-trained")

    # a second run reuses its own workdir; a foreign non-empty directory is refused
    from ascend_patch.demo import DemoError

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(DemoError, match="not empty and was not made by ascend-patch demo"):
        run_demo(str(foreign), device="cpu")
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_demo_command_cleans_its_temporary_directory(tmp_path):
    env = child_env(TMPDIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "ascend_patch.cli", "demo", "--device", "cpu", "--steps", "6",
                           "--nproc", "2", "--tp", "2", "--pp", "1"], capture_output=True, text=True, env=env,
                          timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "(removed; --keep keeps them)" in done.stdout
    assert not [p for p in os.listdir(tmp_path) if p.startswith("ascend-patch-demo-")]


def test_demo_refuses_a_layout_the_workers_cannot_form(capsys):
    from ascend_patch.demo import DemoError, run_demo

    with pytest.raises(DemoError, match="--nproc 3 is not a multiple of --tp 2 x --pp 2"):
        run_demo(None, nproc=3)
