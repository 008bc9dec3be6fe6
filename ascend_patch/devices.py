"""Exact device translation: ``cuda``, ``cuda:N``, ``torch.device("cuda", N)`` and, where an
API takes a device index, an int. Nothing else is rewritten: a string that merely
contains "cuda" (a file path, say) passes through untouched.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from .backend import Backend

__all__ = ["DeviceMap", "NOT_A_DEVICE"]

_CUDA = re.compile(r"cuda(?::(\d+))?\Z")
NOT_A_DEVICE = object()
_CACHE_LIMIT = 512


class DeviceMap:
    """Maps CUDA device designations onto the target; results are cached per value."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.device_type = backend.device_type
        self._cache: dict[Any, Any] = {}
        self.type_names = {"cuda": backend.device_type}

    def _compute(self, device: Any, ints: bool) -> Any:
        kind = type(device)
        if kind is str:
            m = _CUDA.match(device)
            if m is None:
                return NOT_A_DEVICE
            return self.backend.device(None if m.group(1) is None else int(m.group(1)))
        if kind is torch.device:
            if device.type != "cuda":
                return NOT_A_DEVICE
            return self.backend.device(device.index)
        if ints and kind is int:  # bool is not a device index
            return self.backend.device(device)
        return NOT_A_DEVICE

    def lookup(self, device: Any, ints: bool = True) -> Any:
        """The target device for a CUDA designation, or NOT_A_DEVICE."""
        kind = type(device)
        if kind is int and not ints:
            return NOT_A_DEVICE
        try:
            return self._cache[device]
        except KeyError:
            pass
        except TypeError:  # unhashable: not a device
            return NOT_A_DEVICE
        if kind is not str and kind is not torch.device and kind is not int:
            return NOT_A_DEVICE  # never cache tensors or other objects
        mapped = self._compute(device, True)
        if len(self._cache) < _CACHE_LIMIT:
            self._cache[device] = mapped
        return mapped

    @property
    def cache(self) -> dict[Any, Any]:
        """Value -> mapped device for every designation seen (hot paths read it directly).

        Keys are str, torch.device and int; a bool or float equal to a cached int would hit
        that int's entry, which is harmless: torch rejects them as devices anyway.
        """
        return self._cache

    def __call__(self, device: Any, ints: bool = True) -> Any:
        """``device`` translated onto the target, or unchanged when it is not a CUDA device."""
        mapped = self.lookup(device, ints)
        return device if mapped is NOT_A_DEVICE else mapped

    def location(self, location: str) -> str:
        """A serialized storage location (``"cuda:3"``) onto the target, as a string."""
        mapped = self.lookup(location, ints=False)
        return location if mapped is NOT_A_DEVICE else str(mapped)

    def device_type_name(self, device_type: Any) -> Any:
        """A device *type* argument (``"cuda"``) onto the target's type name."""
        if device_type == "cuda":
            return self.device_type
        if isinstance(device_type, torch.device) and device_type.type == "cuda":
            return self.device_type
        return device_type
