"""Killing a conversion mid-way never leaves an output that looks like a valid checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ascend_patch.loaders.blocks import CorruptCheckpoint
from ascend_patch.loaders.engine import convert
from ascend_patch.loaders.formats import ConvertOptions
from ascend_patch.loaders.megatron import MegatronLoader
from loaders_tiny import child_env

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "interrupt_worker.py")


def _run_and_kill(load, save, loader, saver, sig, tp=2, pp=2):
    proc = subprocess.Popen([sys.executable, WORKER, load, save, loader, saver, str(tp), str(pp)],
                            env=child_env(ASCEND_PATCH="0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("PAUSED .ascend_patch-partial-"), (line, proc.stderr.read()[-2000:])
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    return proc


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_interrupted_hf_to_mg_leaves_nothing_valid(tmp_path, hf_checkpoint, sig):
    hf, _ = hf_checkpoint("qwen3")
    save = str(tmp_path / "mg")
    _run_and_kill(hf, save, "hf", "mg", sig)
    assert not os.path.exists(save)
    with pytest.raises(CorruptCheckpoint):
        MegatronLoader().open(save, ConvertOptions())
    staged = [e for e in os.listdir(tmp_path) if e.startswith(".ascend_patch-partial-")]
    if sig == signal.SIGKILL:
        assert len(staged) == 1  # nothing can clean up after SIGKILL ...
        found = {n for _, _, files in os.walk(tmp_path / staged[0]) for n in files}
        assert "latest_checkpointed_iteration.txt" not in found  # ... but the tracker is never there early
    else:
        assert staged == []  # SIGTERM / Ctrl-C remove the staging directory
    convert(hf, save, "hf", "mg", ConvertOptions(target_tp=2, target_pp=2))  # the next run succeeds
    MegatronLoader().open(save, ConvertOptions())
    assert not [e for e in os.listdir(tmp_path) if e.startswith(".ascend_patch-partial-")]


def test_interrupted_mg_to_hf_over_an_existing_output(tmp_path, hf_checkpoint):
    hf, _ = hf_checkpoint("llama")
    mg = str(tmp_path / "mg")
    convert(hf, mg, "hf", "mg", ConvertOptions(target_tp=2))
    out = tmp_path / "hf"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, WORKER, mg, str(out), "mg", "hf", "1", "1"],
                            env=child_env(ASCEND_PATCH="0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("PAUSED"), proc.stderr.read()[-2000:]
    proc.kill()
    proc.wait(timeout=60)
    assert os.listdir(out) == []  # no config.json, no shards: nothing transformers would try to load
