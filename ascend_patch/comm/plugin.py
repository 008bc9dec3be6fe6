"""The built-in communication plugin: collective backends, process groups and NCCL settings on the target."""

from __future__ import annotations

from typing import Any

from ..hookspec import hookimpl

__all__ = ["ascend_patch_register_patches"]


@hookimpl
def ascend_patch_register_patches(registry: Any, backend: Any) -> None:
    from ..devices import DeviceMap
    from . import backend_names, collectives, dtensor_attention, env, teardown

    registry.extend(backend_names.backend_name_patches(backend, DeviceMap(backend)))
    registry.extend(env.env_patches(backend.name))
    registry.extend(collectives.collective_patches())  # cpu only (Patch.backends)
    registry.extend(teardown.teardown_patches())
    registry.extend(dtensor_attention.dtensor_attention_patches())
    env.note_unmapped(backend.name)
