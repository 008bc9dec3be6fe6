"""The built-in device plugin: every patch that moves CUDA code onto the target."""

from __future__ import annotations

from ...hookspec import PatchSink, Target, hookimpl

__all__ = ["ascend_patch_register_patches"]


@hookimpl
def ascend_patch_register_patches(registry: PatchSink, backend: Target) -> None:
    from . import (accelerator, amp, backend_flags, compile, cuda_namespace, data, data_parallel, environment,
                   factories, generator, launchers, legacy, loading, tensors)
    from ...devices import DeviceMap

    settings = registry.settings
    dmap = DeviceMap(backend)
    registry.extend(environment.environment_patches())
    registry.extend(cuda_namespace.cuda_namespace_patches(backend, settings))
    registry.extend(accelerator.accelerator_patches(backend, settings, dmap))
    registry.extend(factories.factory_patches(dmap))
    registry.extend(tensors.tensor_patches(backend, dmap))
    registry.extend(loading.load_patches(dmap))
    registry.extend(generator.generator_patches(dmap))
    registry.extend(amp.amp_patches(backend, dmap))
    registry.extend(data.data_patches(backend))
    registry.extend(data_parallel.data_parallel_patches(backend, dmap))
    registry.extend(legacy.legacy_patches(backend, dmap))
    registry.extend(backend_flags.backend_flag_patches(backend))
    registry.extend(launchers.launcher_patches())
    registry.extend(compile.compile_patches(backend))
    launchers.warn_about_this_launch(backend)
