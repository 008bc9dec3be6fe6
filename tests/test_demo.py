"""ascend-patch demo: every stage's result checked on small settings."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

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

    # a second run reuses its own workdir (starting afresh); a foreign non-empty directory is refused
    from ascend_patch.demo import DemoError

    (workdir / "logs" / "stale.log").write_text("from the first run")
    again = run_demo(str(workdir), device="cpu", nproc=2, tp=2, pp=1, steps=6)
    assert again.kept and len(again.losses) == 6 and not (workdir / "logs" / "stale.log").exists()

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(DemoError, match="not empty and was not made by ascend-patch demo"):
        run_demo(str(foreign), device="cpu")
    assert (foreign / "notes.txt").read_text() == "keep me"


def _readme_main_command() -> list[str]:
    """The README's first command, after its set-up part (``.venv/bin/ascend-patch demo``)."""
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")) as f:
        block = f.read().split("```bash\n", 1)[1].split("```", 1)[0]
    words = block.splitlines()[0].split("&&")[-1].split()
    assert words[0] == ".venv/bin/ascend-patch", words
    return [os.path.join(os.path.dirname(sys.executable), "ascend-patch"), *words[1:]]


def test_readme_main_command_as_written(tmp_path):
    """No arguments: auto target, 4 workers at TP2 x PP2, 150 steps; its temporary directory is removed."""
    env = child_env(TMPDIR=str(tmp_path))
    for name in [n for n in env if n.startswith("ASCEND_PATCH")]:
        del env[name]
    done = subprocess.run(_readme_main_command(), capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "4 workers (TP=2 x PP=2 x DP=1), 150 training steps" in done.stdout
    loss = next(line for line in done.stdout.splitlines() if line.strip().startswith("loss:"))
    first, last = (float(x) for x in loss.split(":")[1].split()[0:3:2])
    assert last < first - 3.0, loss  # ln 256 = 5.5 at random init; trained well below 2
    assert "(removed; --keep keeps them)" in done.stdout
    assert not [p for p in os.listdir(tmp_path) if p.startswith("ascend-patch-demo-")]


def test_demo_keep_keeps_its_temporary_directory(tmp_path):
    env = child_env(TMPDIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "ascend_patch.cli", "demo", "--device", "cpu", "--steps", "6",
                           "--nproc", "2", "--tp", "2", "--pp", "1", "--keep"], capture_output=True, text=True,
                          env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    kept = [p for p in os.listdir(tmp_path) if p.startswith("ascend-patch-demo-")]
    assert len(kept) == 1 and f"artefacts: {tmp_path / kept[0]}" in done.stdout
    assert {"hf", "mg", "trained", "hf-trained", "logs"} <= set(os.listdir(tmp_path / kept[0]))


def test_a_failed_stage_keeps_the_evidence_and_names_the_stage(tmp_path, monkeypatch, capsys):
    from ascend_patch.demo import DemoError, pipeline

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where run_demo's temporary directory goes
    real = pipeline._run

    def failing_training(cmd, log, *args, **kwargs):
        if "torch.distributed.run" in cmd:
            with open(log, "w") as f:
                f.write("RuntimeError: out of memory\n")
            raise DemoError(f"torchrun exited with 1; the last lines of {log}:\nRuntimeError: out of memory")
        return real(cmd, log, *args, **kwargs)

    monkeypatch.setattr(pipeline, "_run", failing_training)
    with pytest.raises(DemoError) as info:
        pipeline.run_demo(None, device="cpu", nproc=2, tp=2, pp=1, steps=2)
    message = str(info.value)
    assert message.startswith("[4/6] train with megatron-core under torchrun (2 workers) failed")
    kept = [p for p in os.listdir(tmp_path) if p.startswith("ascend-patch-demo-")]
    assert len(kept) == 1 and f"the artefacts are kept in {tmp_path / kept[0]}" in message
    assert (tmp_path / kept[0] / "logs" / "train.log").read_text() == "RuntimeError: out of memory\n"
    assert os.path.isdir(tmp_path / kept[0] / "mg")  # the earlier stages' results are there too


def test_demo_refuses_a_layout_the_workers_cannot_form(capsys):
    from ascend_patch.demo import DemoError, run_demo

    with pytest.raises(DemoError, match="--nproc 3 is not a multiple of --tp 2 x --pp 2"):
        run_demo(None, nproc=3)
