"""The built-in communication plugin: collective backends, process groups and NCCL settings on the target."""

from __future__ import annotations

from ..hookspec import Target, hookimpl
from ..patch import Patch

__all__ = ["ascend_patch_register_patches"]


@hookimpl
def ascend_patch_register_patches(backend: Target) -> list[Patch]:
    from ..devices import DeviceMap
    from . import backend_names, collectives, dtensor_attention, env, teardown

    env.note_unmapped(backend.name)
    return [*backend_names.backend_name_patches(backend, DeviceMap(backend)), *env.env_patches(backend.name),
            *collectives.collective_patches(), *teardown.teardown_patches(),
            *dtensor_attention.dtensor_attention_patches()]  # the collectives: cpu only (Patch.backends)
