"""The built-in communication plugin: collective backends and process groups on the target."""

from __future__ import annotations

from typing import Any

from ..hookspec import hookimpl

__all__ = ["ascend_patch_register_patches"]


@hookimpl
def ascend_patch_register_patches(registry: Any, backend: Any) -> None:
    from ..devices import DeviceMap
    from . import backend_names

    registry.extend(backend_names.backend_name_patches(backend, DeviceMap(backend)))
