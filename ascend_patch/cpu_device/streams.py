"""Streams and events on the host: events really time (wall clock); there is one execution
queue, so waiting and synchronising return at once."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from ..unsupported import unsupported
from .state import check_index, device_index, state

__all__ = ["CpuEvent", "CpuStream", "DeviceContext", "StreamContext", "default_stream"]

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
