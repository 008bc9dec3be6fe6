"""The host as the cpu target's devices: the current virtual device, memory statistics,
streams and events, nvtx ranges (everything ``cpu_device.CpuDeviceModule`` is built from).

The host is presented as ``visible_count()`` virtual devices, all the same host memory.
Events really time (wall clock); there is one execution queue, so waiting and
synchronising return at once. Memory statistics come from the process (its resident
set and high-water mark). nvtx ranges become ``torch.profiler.record_function`` ranges.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from .unsupported import unsupported

__all__ = [
    "CpuEvent",
    "CpuStream",
    "CPU_DEVICES",
    "DeviceContext",
    "Nvtx",
    "StreamContext",
    "check_index",
    "default_stream",
    "device_index",
    "device_source",
    "emulated",
    "meminfo",
    "noop",
    "nvtx",
    "peak_rss",
    "reset_peak",
    "rss",
    "SPAWN_NPROCS",
    "state",
    "visible_count",
]

F = TypeVar("F", bound=Callable[..., Any])


def action_marker(kind: str) -> Callable[[F], F]:
    def mark(fn: F) -> F:
        fn.__ascend_action__ = kind  # type: ignore[attr-defined]
        return fn

    return mark


emulated = action_marker("emulated")
noop = action_marker("no-op")


# Set by ascend_patch in the environment of ``torch.multiprocessing.spawn``'s children: the
# ``nprocs`` they were started with (internal; not an ASCEND_PATCH_* setting).
SPAWN_NPROCS = "_ASCEND_PATCH_SPAWN_NPROCS"


def _positive(raw: str | None) -> int | None:
    try:
        value = int(raw) if raw is not None else 0
    except ValueError:
        return None
    return value if value > 0 else None


CPU_DEVICES = "ASCEND_PATCH_CPU_DEVICES"  # the one documented way to say how many devices a node has


def device_source(environ: Any = None) -> tuple[int, str]:
    """The number of virtual devices and the rule that gave it (what the report and doctor print).

    In order: the entries of ``CUDA_VISIBLE_DEVICES`` (as on a GPU node, it narrows what the
    process sees); ``ASCEND_PATCH_CPU_DEVICES`` (the node's device count, for every patched
    process: launchers and workers); in a child of ``torch.multiprocessing.spawn``, its
    ``nprocs``; ``LOCAL_WORLD_SIZE`` (torchrun sets it); else 1.
    """
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() != "":
        return len([v for v in visible.split(",") if v.strip() != ""]), f"CUDA_VISIBLE_DEVICES={visible.strip()}"
    for name, why in ((CPU_DEVICES, "{name}={value}"), (SPAWN_NPROCS, "torch.multiprocessing.spawn(nprocs={value})"),
                      ("LOCAL_WORLD_SIZE", "{name}={value}, from the launcher")):
        value = _positive(env.get(name))
        if value is not None:
            return value, why.format(name=name, value=value)
    return 1, f"the default: none of CUDA_VISIBLE_DEVICES, {CPU_DEVICES}, an mp.spawn nprocs or LOCAL_WORLD_SIZE is set"


def visible_count() -> int:
    """The number of virtual devices (see :func:`device_source` for the rule).

    So ``set_device(local_rank)`` works for every worker of each launch idiom, and
    ``device_count()``, ``torch.accelerator`` and ``nn.DataParallel`` agree on the count.
    """
    return device_source()[0]


class _State(threading.local):
    def __init__(self) -> None:
        self.index = 0
        self.stream: CpuStream | None = None  # inside `with torch.cuda.stream(s):`


state = _State()


def device_index(device: Any = None) -> int:
    """The virtual device index a ``device`` argument names (None: the current one)."""
    if device is None:
        return state.index
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        return state.index if device.index is None else device.index
    raise TypeError(f"expected a device index, str or torch.device, got {type(device).__name__}")


def check_index(index: int) -> int:
    count = visible_count()
    if not 0 <= index < count:
        raise RuntimeError(
            f"invalid device ordinal {index}: the cpu target has {count} virtual device(s) "
            f"({device_source()[1]}); set {CPU_DEVICES}=N to present N"
        )
    return index


# --- memory: from the process -------------------------------------------------------

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_observed = [0]  # the largest resident set size a caller has seen since the last reset


def rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            value = int(f.read().split()[1]) * _PAGE
    except OSError:
        import resource

        value = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    if value > _observed[0]:
        _observed[0] = value
    return value


def peak_rss() -> int:
    # The kernel's high-water mark is kept from lazily synced counters, so it can trail a
    # value already reported; the peak is never below anything reported.
    peak = rss()
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) * 1024)
                    break
    except OSError:
        pass
    return max(peak, _observed[0])


def reset_peak() -> None:
    _observed[0] = 0
    try:  # Linux: writing 5 resets the peak resident set size (VmHWM)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def meminfo() -> tuple[int, int]:
    total = avail = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
                elif line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    return avail, total


# --- streams and events --------------------------------------------------------------

class CpuEvent:
    """A CUDA-style event on the host: ``record()`` stamps the wall clock."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False) -> None:
        if interprocess:
            raise unsupported("torch.cuda.Event(interprocess=True)",
                              "events cannot be shared between processes on the host", "cpu")
        self.enable_timing = enable_timing
        self.blocking = blocking
        self._time: float | None = None

    def record(self, stream: Any = None) -> None:
        self._time = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end_event: CpuEvent) -> float:
        """Milliseconds between this event's and ``end_event``'s records."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Events were not created with enable_timing=True; elapsed_time needs both")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        return (end_event._time - self._time) * 1000.0

    def ipc_handle(self) -> Any:
        raise unsupported("torch.cuda.Event.ipc_handle", "events cannot be shared between processes", "cpu")

    def __repr__(self) -> str:
        return f"<CpuEvent recorded={self._time is not None} timing={self.enable_timing}>"


class CpuStream(torch.Stream):
    """A CUDA-style stream on the host. Work runs in order, so waits return at once."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> CpuStream:
        return super().__new__(cls, device="cpu", priority=priority)

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.virtual_index = device_index(device)
        self.stream_priority = priority

    def wait_event(self, event: Any) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def record_event(self, event: CpuEvent | None = None) -> CpuEvent:
        event = CpuEvent() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    @property
    def cuda_stream(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"<CpuStream device=cpu virtual_index={self.virtual_index} priority={self.stream_priority}>"


_default_streams: dict[int, CpuStream] = {}
_streams_lock = threading.Lock()


def default_stream(index: int) -> CpuStream:
    with _streams_lock:
        stream = _default_streams.get(index)
        if stream is None:
            stream = _default_streams[index] = CpuStream(index)
        return stream


class StreamContext:
    """``with torch.cuda.stream(s):`` — makes ``s`` the current stream inside the block."""

    def __init__(self, stream: CpuStream | None) -> None:
        self.stream = stream
        self._saved: CpuStream | None = None

    def __enter__(self) -> CpuStream | None:
        self._saved = state.stream
        if self.stream is not None:
            state.stream = self.stream
        return self.stream

    def __exit__(self, *exc: object) -> None:
        state.stream = self._saved


class DeviceContext:
    """``with torch.cuda.device(i):`` — makes ``i`` the current virtual device inside the block."""

    def __init__(self, device: Any) -> None:
        self.index = -1 if device is None else device_index(device)
        self._saved = 0

    def __enter__(self) -> None:
        self._saved = state.index
        if self.index >= 0:
            state.index = check_index(self.index)

    def __exit__(self, *exc: object) -> None:
        state.index = self._saved


# --- nvtx: onto the profiler ------------------------------------------------------------

class Nvtx:
    """``torch.cuda.nvtx`` onto ``torch.profiler.record_function`` (ranges show in traces)."""

    def __init__(self) -> None:
        self._stack: list[Any] = []

    @emulated
    def range_push(self, msg: str) -> int:
        ctx = torch.profiler.record_function(msg)
        ctx.__enter__()
        self._stack.append(ctx)
        return len(self._stack) - 1

    @emulated
    def range_pop(self) -> int:
        if not self._stack:
            return -1
        self._stack.pop().__exit__(None, None, None)
        return len(self._stack)

    @emulated
    def range_start(self, msg: str) -> int:
        return self.range_push(msg)

    @emulated
    def range_end(self, range_id: int) -> None:
        self.range_pop()

    @emulated
    def mark(self, msg: str) -> None:
        with torch.profiler.record_function(msg):
            pass

    @emulated
    @contextlib.contextmanager
    def range(self, msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:
        with torch.profiler.record_function(msg.format(*args, **kwargs)):
            yield


nvtx = Nvtx()
