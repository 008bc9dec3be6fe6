"""The built-in device plugin: every patch that moves CUDA code onto the target."""

from __future__ import annotations

from ...config import Settings
from ...hookspec import Target, hookimpl
from ...patch import Patch

__all__ = ["ascend_patch_register_patches"]


@hookimpl
def ascend_patch_register_patches(backend: Target, settings: Settings) -> list[Patch]:
    from ...devices import DeviceMap
    from . import (accelerator, amp, backend_flags, compile, cuda_namespace, data, data_parallel, environment,
                   factories, generator, launchers, legacy, loading, tensors)

    dmap = DeviceMap(backend)
    launchers.warn_about_this_launch(backend)
    return [*environment.environment_patches(), *cuda_namespace.cuda_namespace_patches(backend, settings),
            *accelerator.accelerator_patches(backend, settings, dmap), *factories.factory_patches(dmap),
            *tensors.tensor_patches(backend, dmap), *loading.load_patches(dmap), *generator.generator_patches(dmap),
            *amp.amp_patches(backend, dmap), *data.data_patches(backend),
            *data_parallel.data_parallel_patches(backend, dmap), *legacy.legacy_patches(backend, dmap),
            *backend_flags.backend_flag_patches(backend),
            *launchers.launcher_patches(), *compile.compile_patches(backend)]
