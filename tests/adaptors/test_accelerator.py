"""``torch.accelerator`` answers what the patched ``torch.cuda`` answers (cpu target)."""

from __future__ import annotations

import pytest
import torch
import torch.accelerator as accelerator
import torch.distributed as dist

from ascend_patch.config import Settings

NAMES = ("is_available", "current_accelerator", "device_count", "current_device_index", "set_device_index",
         "synchronize", "current_stream", "device_index", "memory_allocated", "get_memory_info")


def test_the_cpu_target_is_the_cuda_accelerator(patched, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    assert accelerator.is_available() is True and torch.cuda.is_available() is True
    assert accelerator.current_accelerator() == torch.device("cuda")
    assert accelerator.current_accelerator(check_available=True) == torch.device("cuda")
    assert accelerator.device_count() == torch.cuda.device_count() == 3
    assert dist.get_default_backend_for_device(accelerator.current_accelerator()) == "nccl"  # gloo underneath
    x = torch.ones(2, device=accelerator.current_accelerator())
    assert x.device == torch.device("cpu")
    assert torch.get_device_module() is torch.get_device_module(accelerator.current_accelerator()) is torch.cuda
    assert torch.get_device_module("cpu") is torch.cpu


def test_the_current_index_is_torch_cuda_s(patched, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    accelerator.set_device_index(2)
    assert torch.cuda.current_device() == accelerator.current_device_index() == 2
    accelerator.set_device_index("cuda:1")
    assert torch.cuda.current_device() == 1
    torch.cuda.set_device(0)
    assert accelerator.current_device_index() == 0
    with accelerator.device_index(2):
        assert torch.cuda.current_device() == 2
    assert accelerator.current_device_index() == 0
    try:
        accelerator.set_device_index(3)
    except RuntimeError as exc:
        assert "invalid device ordinal 3: the cpu target has 3 virtual device(s)" in str(exc)
    else:
        raise AssertionError("device 3 of 3 was accepted")


def test_streams_memory_and_capability(patched):
    assert accelerator.current_stream() == torch.cuda.current_stream()
    assert accelerator.current_stream().is_capturing() is False  # what optimizer.step() asks on cuda
    accelerator.synchronize()
    accelerator.synchronize("cuda:0")
    assert accelerator.current_stream(torch.ones(1).device) == torch.cuda.current_stream()  # where tensors are
    with pytest.raises(ValueError, match="meta doesn't match the current accelerator"):
        accelerator.current_stream(torch.device("meta"))
    assert accelerator.memory_allocated() > 0
    free, total = accelerator.get_memory_info()
    assert 0 < free <= total
    assert accelerator.memory_stats()["allocated_bytes.all.current"] > 0
    assert {torch.float32, torch.bfloat16, torch.float16} <= accelerator.get_device_capability()["supported_dtypes"]
    model = torch.nn.Linear(2, 2).to(accelerator.current_accelerator())
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    before = model.weight.detach().clone()
    opt.step()
    assert not torch.equal(before, model.weight)


def test_device_generic_events_time_on_the_host(patched):
    import time

    start, end = torch.Event(enable_timing=True), torch.Event(device="cuda:0", enable_timing=True)
    start.record()
    time.sleep(0.02)
    end.record()
    accelerator.synchronize()
    assert 15 <= start.elapsed_time(end) < 2000  # milliseconds, as CUDA events report
    assert isinstance(start, torch.Event) and isinstance(torch.cuda.Event(), torch.Event)


def test_cuda_not_available_means_no_accelerator():
    import ascend_patch

    before = torch.cuda.device_count
    with ascend_patch.patched(Settings(device="cpu", cuda_is_available=False)):
        assert accelerator.is_available() is False and torch.cuda.is_available() is False
        assert accelerator.current_accelerator() is None
        assert accelerator.device_count() == 0
        assert torch.cuda.device_count() == 0  # the two agree, as on a machine without a GPU
        assert torch.get_device_module() is torch.cpu
    assert torch.cuda.device_count is before


def test_remove_restores_every_function_by_identity():
    import ascend_patch

    originals = {name: getattr(accelerator, name) for name in NAMES}
    event, get_device_module = torch.Event, torch.get_device_module
    with ascend_patch.patched(Settings(device="cpu")):
        assert all(getattr(accelerator, name) is not originals[name] for name in NAMES)
        assert torch.Event is not event and torch.get_device_module is not get_device_module
    assert all(getattr(accelerator, name) is originals[name] for name in NAMES)
    assert torch.Event is event and torch.get_device_module is get_device_module
    assert accelerator.is_available() is False and accelerator.current_accelerator() is None
