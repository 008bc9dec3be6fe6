"""torch.cuda.* on the cpu target: meaningful host behaviour, clear errors for what cannot work."""

from __future__ import annotations

import time

import pytest
import torch

from ascend_patch.backend import UnsupportedOnTarget


def test_is_available_and_switch(patched):
    assert torch.cuda.is_available() is True
    assert torch.cuda.is_initialized() is True


def test_is_available_can_be_turned_off():
    import ascend_patch
    from ascend_patch.config import Settings

    with ascend_patch.patched(Settings(device="cpu", cuda_is_available=False)):
        assert torch.cuda.is_available() is False
        assert torch.zeros(1, device="cuda").device.type == "cpu"  # translation still works


def test_virtual_devices_follow_local_world_size(patched, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert torch.cuda.device_count() == 4
    torch.cuda.set_device(3)
    try:
        assert torch.cuda.current_device() == 3
        torch.cuda.set_device(torch.device("cuda", 1))
        assert torch.cuda.current_device() == 1
        with torch.cuda.device(2):
            assert torch.cuda.current_device() == 2
        assert torch.cuda.current_device() == 1
        with pytest.raises(RuntimeError, match="invalid device ordinal 4: the cpu target has 4 virtual device"):
            torch.cuda.set_device(4)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
        assert torch.cuda.device_count() == 2
    finally:
        torch.cuda.set_device(0)


def test_an_mp_spawn_child_s_local_world_is_its_nprocs(patched, monkeypatch):
    from ascend_patch.cpu_host import SPAWN_NPROCS

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # inherited from a launcher that started the parent
    monkeypatch.setenv(SPAWN_NPROCS, "3")  # what the spawn patch gives the children
    assert torch.cuda.device_count() == torch.accelerator.device_count() == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # explicit devices win
    assert torch.cuda.device_count() == 2
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv(SPAWN_NPROCS, "junk")
    assert torch.cuda.device_count() == 1  # LOCAL_WORLD_SIZE again


def test_device_properties(patched):
    props = torch.cuda.get_device_properties(0)
    assert props.total_memory > 1024**3
    assert props.name == torch.cuda.get_device_name() == "cpu (ascend_patch cpu target)"
    assert torch.cuda.get_device_capability() == (8, 0)
    assert torch.cuda.is_bf16_supported() is True


def test_seeds_and_rng_state_drive_device_randomness(patched):
    torch.cuda.manual_seed(1234)
    a = torch.randn(5, device="cuda")
    torch.cuda.manual_seed_all(1234)
    b = torch.randn(5, device="cuda")
    assert torch.equal(a, b)
    assert torch.cuda.initial_seed() == 1234
    state = torch.cuda.get_rng_state()
    c = torch.randn(5, device="cuda")
    torch.cuda.set_rng_state(state)
    assert torch.equal(torch.randn(5, device="cuda"), c)
    states = torch.cuda.get_rng_state_all()
    assert len(states) == torch.cuda.device_count()
    assert torch.cuda.default_generators[0] is torch.default_generator


def test_fork_rng_over_cuda(patched):
    torch.manual_seed(7)
    with torch.random.fork_rng(device_type="cuda"):
        torch.randn(3)
    after_fork = torch.randn(3)
    torch.manual_seed(7)
    assert torch.equal(torch.randn(3), after_fork)


def test_memory_statistics_come_from_the_process(patched):
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    big = torch.ones(64 * 1024 * 1024 // 4 * 4, device="cuda")  # 256 MiB, touched
    during = torch.cuda.memory_allocated()
    assert during - before > 200 * 1024**2
    assert torch.cuda.max_memory_allocated() >= during
    del big
    stats = torch.cuda.memory_stats()
    assert stats["allocated_bytes.all.peak"] >= during
    nested = torch.cuda.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["peak"] == stats["allocated_bytes.all.peak"]
    assert torch.cuda.memory_allocated() < during - 200 * 1024**2  # the 256 MiB went back
    torch.cuda.reset_peak_memory_stats()
    peak = torch.cuda.max_memory_allocated()
    assert peak < during - 200 * 1024**2  # the reset peak no longer holds the freed 256 MiB
    assert peak >= torch.cuda.memory_allocated() - 16 * 1024**2
    assert torch.cuda.memory_stats()["allocated_bytes.all.peak"] < during - 200 * 1024**2
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total
    assert "current" in torch.cuda.memory_summary()
    assert torch.cuda.empty_cache() is None


def test_events_really_time(patched):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    time.sleep(0.02)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 19.0
    assert isinstance(start, torch.cuda.Event) and start.query()
    untimed = torch.cuda.Event()
    untimed.record()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        untimed.elapsed_time(end)
    with pytest.raises(RuntimeError, match="must be recorded"):
        torch.cuda.Event(enable_timing=True).elapsed_time(end)


def test_stream_context(patched):
    default = torch.cuda.current_stream()
    assert default is torch.cuda.default_stream()
    side = torch.cuda.Stream()
    assert isinstance(side, torch.cuda.Stream) and isinstance(side, torch.Stream)
    with torch.cuda.stream(side):
        assert torch.cuda.current_stream() is side
        side.wait_stream(default)
        x = torch.ones(3, device="cuda") * 2
        x.record_stream(side)
        event = side.record_event()
    assert torch.cuda.current_stream() is default
    default.wait_event(event)
    torch.cuda.synchronize()
    assert x.tolist() == [2.0, 2.0, 2.0]


def test_nvtx_ranges_reach_the_profiler(patched):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.cuda.nvtx.range_push("outer_range")
        torch.ones(2) + 1
        torch.cuda.nvtx.range_pop()
        with torch.cuda.nvtx.range("inner_{}", 7):
            torch.ones(2) * 2
        torch.cuda.nvtx.mark("a_mark")
    names = {e.name for e in prof.events()}
    assert {"outer_range", "inner_7", "a_mark"} <= names


@pytest.mark.parametrize("call", [
    lambda: torch.cuda.CUDAGraph(),
    lambda: torch.cuda.graph(None),
    lambda: torch.cuda.make_graphed_callables(lambda x: x, (torch.ones(1),)),
    lambda: torch.cuda.graph_pool_handle(),
])
def test_cuda_graphs_raise_naming_api_and_target(patched, call):
    with pytest.raises(UnsupportedOnTarget, match=r"torch\.cuda\.\w+ is not supported on the cpu target: CUDA graphs"):
        call()
    assert torch.cuda.is_current_stream_capturing() is False


def test_every_public_cuda_callable_is_covered(patched):
    """Each name in torch.cuda.__all__ is either patched or deliberately left (types, modules)."""
    import types

    from ascend_patch.patching.manager import manager

    covered = {s.patch.attribute for s in manager.statuses if s.patch.module == "torch.cuda"}
    for name in torch.cuda.__all__:
        obj = getattr(torch.cuda, name)
        legacy = name.endswith(("Tensor", "Storage"))
        exception = isinstance(obj, type) and issubclass(obj, BaseException)
        if isinstance(obj, types.ModuleType) or legacy or exception or not callable(obj):
            continue
        assert name in covered, name


def test_removal_restores_torch_cuda(cpu_settings):
    import ascend_patch

    before = {n: getattr(torch.cuda, n) for n in ("is_available", "set_device", "Event", "Stream", "CUDAGraph")}
    with ascend_patch.patched(cpu_settings):
        assert torch.cuda.is_available() is True
    after = {n: getattr(torch.cuda, n) for n in before}
    assert all(after[n] is before[n] for n in before)
    assert torch.cuda.is_available() is False
