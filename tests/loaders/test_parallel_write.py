"""The output written by several threads: identical bytes, every tensor once, errors and events in the caller."""

from __future__ import annotations

import filecmp
import os
import threading

import pytest

from ascend_patch.loaders import engine, parallel_write
from ascend_patch.loaders.engine import convert
from ascend_patch.loaders.formats import ConvertOptions, TargetFile
from ascend_patch.models.weightmap import TensorPlan


def _files(root):
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names)


def _same_tree(a, b):
    assert _files(a) == _files(b)
    for rel in _files(a):
        assert filecmp.cmp(os.path.join(a, rel), os.path.join(b, rel), shallow=False), rel


@pytest.fixture
def small_units(monkeypatch):
    monkeypatch.setattr(parallel_write, "UNIT_BYTES", 1)  # every tensor its own unit: workers share each file


@pytest.mark.parametrize("layout", [dict(target_tp=1, target_pp=1), dict(target_tp=2, target_pp=2)],
                         ids=["tp1pp1", "tp2pp2"])
def test_any_number_of_workers_writes_the_same_bytes(tmp_path, hf_checkpoint, small_units, layout):
    hf, _ = hf_checkpoint("qwen3")
    outs = {}
    for workers in (1, 2, 5):
        outs[workers] = str(tmp_path / f"mg{workers}")
        convert(hf, outs[workers], "hf", "mg", ConvertOptions(workers=workers, **layout))
        back = str(tmp_path / f"hf{workers}")
        convert(outs[workers], back, "mg", "hf", ConvertOptions(workers=workers))
        outs[f"hf{workers}"] = back
    for workers in (2, 5):
        _same_tree(outs[1], outs[workers])
        _same_tree(outs["hf1"], outs[f"hf{workers}"])


def test_units_cover_every_tensor_once_in_order():
    def target(sizes):
        return TargetFile(relpath="x", format="torch", dtype="float32",
                          tensors=[TensorPlan(f"t{i}", (n,), ()) for i, n in enumerate(sizes)])

    groups = [[target([10, 10, 10, 10, 10])] * 2, [target([100])], [target([])]]
    spans = parallel_write.units(groups, unit_bytes=160)  # 2 files x 4 bytes x 10 = 80 bytes per tensor index
    assert spans == [(0, 0, 2), (0, 2, 4), (0, 4, 5), (1, 0, 1), (2, 0, 0)]


def test_progress_events_arrive_in_the_calling_thread(tmp_path, hf_checkpoint, small_units):
    hf, _ = hf_checkpoint("llama")
    seen = []

    def on_progress(event, info):
        seen.append((event, info.get("written"), threading.current_thread() is threading.main_thread()))

    result = convert(hf, str(tmp_path / "mg"), "hf", "mg", ConvertOptions(target_tp=2, target_pp=2, workers=3),
                     on_progress=on_progress)
    assert all(main for *_, main in seen)
    written = [w for e, w, _ in seen if e == "tensor"]
    assert written == sorted(written) and written[-1] == result.bytes_written == result.plan.nbytes
    files = [w for e, w, _ in seen if e == "file"]
    assert len(files) == len(result.plan.files) == 4 and files == sorted(files)


def test_a_failing_worker_stops_the_conversion_and_leaves_nothing(tmp_path, hf_checkpoint, small_units, monkeypatch):
    hf, _ = hf_checkpoint("qwen3")
    calls = {"n": 0}
    real = engine._write_tensor

    def failing(*args):
        calls["n"] += 1
        if calls["n"] == 7:
            raise OSError(28, "No space left on device")
        return real(*args)

    monkeypatch.setattr(engine, "_write_tensor", failing)
    save = tmp_path / "mg"
    with pytest.raises(OSError, match="No space left"):
        convert(hf, str(save), "hf", "mg", ConvertOptions(target_tp=2, target_pp=2, workers=3))
    assert not save.exists()
    assert os.listdir(tmp_path) == []  # the staging directory is gone too
    assert not [t for t in threading.enumerate() if t.name.startswith("ascend_patch-convert")]  # workers stopped


def test_default_workers_follow_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert parallel_write.default_workers() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert parallel_write.default_workers() == 8


def test_workers_leave_signals_to_the_calling_thread(tmp_path, hf_checkpoint, monkeypatch):
    """A process-directed SIGINT/SIGTERM must reach the thread that can act on it (and interrupt its waits)."""
    import signal

    hf, _ = hf_checkpoint("qwen3")
    masks = []
    real = engine._write_tensor

    def recording(*args):
        masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))
        return real(*args)

    monkeypatch.setattr(engine, "_write_tensor", recording)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    convert(hf, str(tmp_path / "mg"), "hf", "mg", ConvertOptions(target_tp=2, target_pp=2, workers=2))
    assert masks and all({signal.SIGINT, signal.SIGTERM, signal.SIGHUP} <= mask for mask in masks)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before  # the caller's own mask is untouched


def test_the_summary_counts_data_files_and_times_the_whole_conversion_and_every_output_is_synced(
        tmp_path, hf_checkpoint, monkeypatch):
    """The closing line counted the tracker as a data file and timed only the writing; and the output must reach
    the disk (fsync of every file and folder) before it is published, or a power loss can publish empty files."""
    import re

    hf, _ = hf_checkpoint("qwen3")
    out = tmp_path / "mg"
    synced, real_fsync = [], os.fsync

    def recording_fsync(fd):  # the real fsync, and which file or folder it was for, and whether it was published yet
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), out.exists()))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    result = convert(hf, str(out), "hf", "mg", ConvertOptions(target_tp=2, target_pp=2))
    line = result.summary().splitlines()[2]
    assert re.fullmatch(rf"wrote 4 data files \({result.bytes_written / 1e6:.1f} MB\) and 1 small file to {out} in "
                        r"([\d.]+) s \(prepare ([\d.]+) s, streaming ([\d.]+) s, fsync ([\d.]+) s, publish ([\d.]+) s; "
                        r"streaming \d+ MB/s\)", line), line
    # the whole conversion, not the writing alone (fsync is summed over the writer threads, so it is apart)
    assert result.seconds >= result.phases["prepare"] + result.phases["streaming"] + result.phases["publish"]
    assert not [p for p, published in synced[:-1] if published]  # all but the parent folder: before publishing
    files = {os.path.basename(os.path.dirname(p)) + "/" + os.path.basename(p) for p, _ in synced if p.endswith(".pt")}
    assert files == {f"mp_rank_{t:02d}_{p:03d}/model_optim_rng.pt" for t in range(2) for p in range(2)}
    assert any(p.endswith("latest_checkpointed_iteration.txt") for p, _ in synced)
    assert sum(p.endswith("iter_0000001") for p, _ in synced) == 1  # the folders too, each once
    assert synced[-1] == (str(tmp_path), True)  # the rename itself, in the parent folder
