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


def _threads_taking(pid, sig):
    """The threads of ``pid`` other than the main one that do not block ``sig``."""
    found = []
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            blocked = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
        if tid != pid and not blocked & (1 << (sig - 1)):
            found.append(tid)
    return found


def test_a_sigterm_another_thread_takes_still_stops_the_conversion(tmp_path, hf_checkpoint):
    """The kernel may hand a process's signal to any thread that does not block it: here, deliberately
    (tgkill), to one of OpenBLAS's pool threads, which import numpy starts and which do not block
    signals. The conversion still stops and cleans up (the signal wakes the waiting main thread)."""
    import ctypes
    import time

    hf, _ = hf_checkpoint("qwen3")
    save = str(tmp_path / "mg")
    proc = subprocess.Popen([sys.executable, WORKER, hf, save, "hf", "mg", "2", "2"],
                            env=child_env(ASCEND_PATCH="0", OPENBLAS_NUM_THREADS="2"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("PAUSED"), proc.stderr.read()[-2000:]
        others = _threads_taking(proc.pid, signal.SIGTERM)
        assert others, "no thread besides the main one takes SIGTERM (OpenBLAS started no pool thread)"
        start = time.monotonic()
        assert ctypes.CDLL(None, use_errno=True).tgkill(proc.pid, others[0], signal.SIGTERM) == 0
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0 and time.monotonic() - start < 60
    assert "Interrupted: conversion interrupted by signal SIGTERM" in proc.stderr.read()
    assert not os.path.exists(save) and not [e for e in os.listdir(tmp_path) if e.startswith(".ascend_patch-partial-")]


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
