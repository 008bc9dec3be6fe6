"""Which virtual device is current (per thread), how many there are, and the report markers."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["check_index", "device_index", "emulated", "noop", "state", "visible_count"]

F = TypeVar("F", bound=Callable[..., Any])


def action_marker(kind: str) -> Callable[[F], F]:
    def mark(fn: F) -> F:
        fn.__ascend_action__ = kind  # type: ignore[attr-defined]
        return fn

    return mark


emulated = action_marker("emulated")
noop = action_marker("no-op")


def visible_count() -> int:
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
        self.stream: Any = None  # the current CpuStream inside a `with torch.cuda.stream(s):` block


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
            "(CUDA_VISIBLE_DEVICES, else LOCAL_WORLD_SIZE, else 1)"
        )
    return index
