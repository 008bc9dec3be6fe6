"""The cpu target's device module: ``torch.cuda``'s API with meaningful host behaviour.

The host is presented as ``device_count()`` virtual devices (the entries of
``CUDA_VISIBLE_DEVICES`` when set, else ``LOCAL_WORLD_SIZE`` when a launcher set it,
else 1) so that ``torch.cuda.set_device(local_rank)`` works for every worker; all
of them are the same host memory. Events really time (wall clock), memory
statistics come from the process (resident set and its high-water mark), the RNG
functions act on the generator that host tensors use, and a stream context works
(there is one execution queue, so waiting and synchronising return at once).

Each public callable carries an ``__ascend_action__`` of ``emulated`` or ``no-op``:
the migration report says what a call did.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from .backend import UnsupportedOnTarget

__all__ = ["CpuDeviceModule", "CpuEvent", "CpuStream", "nvtx"]

F = TypeVar("F", bound=Callable[..., Any])


def _action(kind: str) -> Callable[[F], F]:
    def mark(fn: F) -> F:
        fn.__ascend_action__ = kind  # type: ignore[attr-defined]
        return fn

    return mark


_emulated = _action("emulated")
_noop = _action("no-op")


def _visible_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() != "":
        return len([v for v in visible.split(",") if v.strip() != ""])
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


class _State(threading.local):
    def __init__(self) -> None:
        self.index = 0
        self.stream: CpuStream | None = None


_state = _State()


def _index(device: Any = None) -> int:
    """The virtual device index a ``device`` argument names (None: the current one)."""
    if device is None:
        return _state.index
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        return _state.index if device.index is None else device.index
    raise TypeError(f"expected a device index, str or torch.device, got {type(device).__name__}")


def _check(index: int) -> int:
    count = _visible_count()
    if not 0 <= index < count:
        raise RuntimeError(
            f"invalid device ordinal {index}: the cpu target has {count} virtual device(s) "
            "(CUDA_VISIBLE_DEVICES, else LOCAL_WORLD_SIZE, else 1)"
        )
    return index


# --- memory: from the process -------------------------------------------------------

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_observed = [0]  # the largest resident set size a caller has seen since the last reset


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            value = int(f.read().split()[1]) * _PAGE
    except OSError:
        import resource

        value = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    if value > _observed[0]:
        _observed[0] = value
    return value


def _peak_rss() -> int:
    # The kernel's high-water mark is kept from lazily synced counters, so it can trail a
    # value already reported; the peak is never below anything reported.
    peak = _rss()
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) * 1024)
                    break
    except OSError:
        pass
    return max(peak, _observed[0])


def _reset_peak() -> None:
    _observed[0] = 0
    try:  # Linux: writing 5 resets the peak resident set size (VmHWM)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _meminfo() -> tuple[int, int]:
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
            raise _unsupported_error("torch.cuda.Event(interprocess=True)",
                                     "events cannot be shared between processes on the host")
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
        raise _unsupported_error("torch.cuda.Event.ipc_handle", "events cannot be shared between processes")

    def __repr__(self) -> str:
        return f"<CpuEvent recorded={self._time is not None} timing={self.enable_timing}>"


class CpuStream(torch.Stream):
    """A CUDA-style stream on the host. Work runs in order, so waits return at once."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> CpuStream:
        return super().__new__(cls, device="cpu", priority=priority)

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.virtual_index = _index(device)
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


def _default_stream(index: int) -> CpuStream:
    with _streams_lock:
        stream = _default_streams.get(index)
        if stream is None:
            stream = _default_streams[index] = CpuStream(index)
        return stream


class _StreamContext:
    """``with torch.cuda.stream(s):`` — makes ``s`` the current stream inside the block."""

    def __init__(self, stream: CpuStream | None) -> None:
        self.stream = stream
        self._saved: CpuStream | None = None

    def __enter__(self) -> CpuStream | None:
        self._saved = _state.stream
        if self.stream is not None:
            _state.stream = self.stream
        return self.stream

    def __exit__(self, *exc: object) -> None:
        _state.stream = self._saved


class _DeviceContext:
    """``with torch.cuda.device(i):`` — makes ``i`` the current virtual device inside the block."""

    def __init__(self, device: Any) -> None:
        self.index = -1 if device is None else _index(device)
        self._saved = 0

    def __enter__(self) -> None:
        self._saved = _state.index
        if self.index >= 0:
            _state.index = _check(self.index)

    def __exit__(self, *exc: object) -> None:
        _state.index = self._saved


# --- nvtx: onto the profiler ------------------------------------------------------------


class _Nvtx:
    """``torch.cuda.nvtx`` onto ``torch.profiler.record_function`` (ranges show in traces)."""

    def __init__(self) -> None:
        self._stack: list[Any] = []

    @_emulated
    def range_push(self, msg: str) -> int:
        ctx = torch.profiler.record_function(msg)
        ctx.__enter__()
        self._stack.append(ctx)
        return len(self._stack) - 1

    @_emulated
    def range_pop(self) -> int:
        if not self._stack:
            return -1
        self._stack.pop().__exit__(None, None, None)
        return len(self._stack)

    @_emulated
    def range_start(self, msg: str) -> int:
        return self.range_push(msg)

    @_emulated
    def range_end(self, range_id: int) -> None:
        self.range_pop()

    @_emulated
    def mark(self, msg: str) -> None:
        with torch.profiler.record_function(msg):
            pass

    @_emulated
    @contextlib.contextmanager
    def range(self, msg: str, *args: Any, **kwargs: Any) -> Iterator[None]:
        with torch.profiler.record_function(msg.format(*args, **kwargs)):
            yield


nvtx = _Nvtx()


def _unsupported_error(api: str, why: str, target: str = "cpu") -> UnsupportedOnTarget:
    return UnsupportedOnTarget(f"{api} is not supported on the {target} target: {why}")


class _Properties:
    def __init__(self, index: int) -> None:
        avail, total = _meminfo()
        self.name = "cpu (ascend_patch cpu target)"
        self.index = index
        self.total_memory = total
        self.major, self.minor = CpuDeviceModule.CAPABILITY
        self.multi_processor_count = os.cpu_count() or 1
        self.is_integrated = True
        self.is_multi_gpu_board = False
        self.uuid = "cpu"
        # fields CUDA/ROCm property objects carry that libraries read (inductor hashes gcnArchName)
        self.gcnArchName = "cpu"
        self.warp_size = 1
        self.max_threads_per_multi_processor = 1
        self.regs_per_multiprocessor = 0
        self.L2_cache_size = 0
        self.pci_bus_id = self.pci_device_id = self.pci_domain_id = 0

    def __repr__(self) -> str:
        return (f"_CpuDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1024 * 1024)}MB, "
                f"multi_processor_count={self.multi_processor_count})")


class CpuDeviceModule:
    """What ``torch.cuda.<name>`` becomes on the cpu target, name for name."""

    # Claims Ampere-level features (bf16, flash attention through the shims); not fp8.
    CAPABILITY = (8, 0)

    Event = CpuEvent
    Stream = CpuStream
    StreamContext = _StreamContext
    device = _DeviceContext
    nvtx = nvtx
    has_half = True
    has_magma = False

    # device management
    @_emulated
    def is_available(self) -> bool:
        return True

    @_emulated
    def is_initialized(self) -> bool:
        return True

    @_noop
    def init(self) -> None:
        return None

    @_emulated
    def device_count(self) -> int:
        return _visible_count()

    @_emulated
    def current_device(self) -> int:
        return _state.index

    @_emulated
    def set_device(self, device: Any) -> None:
        index = _index(device)
        if index >= 0:  # CUDA ignores negative indices
            _state.index = _check(index)

    @_emulated
    def device_of(self, obj: Any) -> _DeviceContext:
        return _DeviceContext(None)

    @_noop
    def synchronize(self, device: Any = None) -> None:
        return None

    @_emulated
    def get_device_name(self, device: Any = None) -> str:
        return _Properties(_index(device)).name

    @_emulated
    def get_device_capability(self, device: Any = None) -> tuple[int, int]:
        return self.CAPABILITY

    @_emulated
    def get_device_properties(self, device: Any = None) -> _Properties:
        return _Properties(_check(_index(device)))

    @_emulated
    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        return True

    @_emulated
    def is_tf32_supported(self) -> bool:
        return False

    @_emulated
    def get_arch_list(self) -> list[str]:
        return []

    @_emulated
    def get_gencode_flags(self) -> str:
        return ""

    @_emulated
    def can_device_access_peer(self, device: Any, peer_device: Any) -> bool:
        return True  # every virtual device is the same host memory

    @_noop
    def ipc_collect(self) -> None:
        return None

    @_emulated
    def get_sync_debug_mode(self) -> int:
        return 0

    @_noop
    def set_sync_debug_mode(self, debug_mode: Any) -> None:
        return None

    @_emulated
    def is_current_stream_capturing(self) -> bool:
        return False  # graph capture is never under way on the host

    @_emulated
    def _lazy_call(self, callable: Callable[[], Any], **kwargs: Any) -> None:
        callable()  # the host is always initialised

    # streams
    @_emulated
    def current_stream(self, device: Any = None) -> CpuStream:
        return _state.stream if _state.stream is not None else _default_stream(_index(device))

    @_emulated
    def default_stream(self, device: Any = None) -> CpuStream:
        return _default_stream(_index(device))

    @_emulated
    def set_stream(self, stream: CpuStream) -> None:
        _state.stream = stream

    @_emulated
    def stream(self, stream: CpuStream | None) -> _StreamContext:
        return _StreamContext(stream)

    # RNG: the generator host tensors draw from
    @property
    def default_generators(self) -> tuple[torch.Generator, ...]:
        return (torch.default_generator,) * _visible_count()

    @_emulated
    def manual_seed(self, seed: int) -> None:
        torch.default_generator.manual_seed(int(seed))

    @_emulated
    def manual_seed_all(self, seed: int) -> None:
        torch.default_generator.manual_seed(int(seed))

    @_emulated
    def seed(self) -> None:
        torch.default_generator.seed()

    @_emulated
    def seed_all(self) -> None:
        torch.default_generator.seed()

    @_emulated
    def initial_seed(self) -> int:
        return torch.default_generator.initial_seed()

    @_emulated
    def get_rng_state(self, device: Any = "cuda") -> torch.Tensor:
        return torch.default_generator.get_state()

    @_emulated
    def set_rng_state(self, new_state: torch.Tensor, device: Any = "cuda") -> None:
        torch.default_generator.set_state(new_state)

    @_emulated
    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [torch.default_generator.get_state() for _ in range(_visible_count())]

    @_emulated
    def set_rng_state_all(self, new_states: Any) -> None:
        for state in new_states:
            torch.default_generator.set_state(state)

    # memory: the process's resident set
    @_emulated
    def memory_allocated(self, device: Any = None) -> int:
        return _rss()

    @_emulated
    def max_memory_allocated(self, device: Any = None) -> int:
        return _peak_rss()

    @_emulated
    def memory_reserved(self, device: Any = None) -> int:
        return _rss()

    @_emulated
    def max_memory_reserved(self, device: Any = None) -> int:
        return _peak_rss()

    memory_cached = memory_reserved
    max_memory_cached = max_memory_reserved

    @_emulated
    def device_memory_used(self, device: Any = None) -> int:
        return _rss()

    @_emulated
    def reset_peak_memory_stats(self, device: Any = None) -> None:
        _reset_peak()

    reset_max_memory_allocated = reset_peak_memory_stats
    reset_max_memory_cached = reset_peak_memory_stats

    @_noop
    def reset_accumulated_memory_stats(self, device: Any = None) -> None:
        return None

    @_emulated
    def memory_stats(self, device: Any = None) -> dict[str, int]:
        cur, peak = _rss(), _peak_rss()
        stats: dict[str, int] = {}
        for kind in ("allocated_bytes", "reserved_bytes", "active_bytes"):
            stats[f"{kind}.all.current"] = cur
            stats[f"{kind}.all.peak"] = peak
        stats["num_alloc_retries"] = 0
        stats["num_ooms"] = 0
        return stats

    @_emulated
    def memory_stats_as_nested_dict(self, device: Any = None) -> dict[str, Any]:
        nested: dict[str, Any] = {}
        for key, value in self.memory_stats(device).items():
            node = nested
            *path, last = key.split(".")
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
        return nested

    @_emulated
    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str:
        mib = 1024 * 1024
        return (f"cpu target memory (process resident set): current {_rss() / mib:.1f} MiB, "
                f"peak {_peak_rss() / mib:.1f} MiB")

    @_emulated
    def memory_snapshot(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    @_emulated
    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return _meminfo()

    @_noop
    def empty_cache(self) -> None:
        return None

    @_noop
    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        return None

    @_emulated
    def get_per_process_memory_fraction(self, device: Any = None) -> float:
        return 1.0

    @_emulated
    def get_allocator_backend(self) -> str:
        return "native"

    @_emulated
    def list_gpu_processes(self, device: Any = None) -> str:
        return f"cpu target: one process (pid {os.getpid()}), resident set {_rss() // (1024 * 1024)} MiB"

    @_emulated
    def host_memory_stats(self) -> dict[str, int]:
        return {}

    @_noop
    def reset_peak_host_memory_stats(self) -> None:
        return None

    @_noop
    def reset_accumulated_host_memory_stats(self) -> None:
        return None
