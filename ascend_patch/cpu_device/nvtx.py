"""``torch.cuda.nvtx`` on the host: ranges become ``torch.profiler.record_function`` ranges."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .state import emulated

__all__ = ["Nvtx", "nvtx"]

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
