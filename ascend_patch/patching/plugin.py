"""The engine's own plugin: a patched process's child processes are patched too."""

from __future__ import annotations

from ..hookspec import PatchSink, Target, hookimpl

__all__ = ["ascend_patch_register_patches"]


@hookimpl
def ascend_patch_register_patches(registry: PatchSink, backend: Target) -> None:
    from .processes import process_patches

    registry.extend(process_patches(registry.settings))
