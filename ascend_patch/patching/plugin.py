"""The engine's own plugin: a patched process's child processes are patched too."""

from __future__ import annotations

from ..config import Settings
from ..hookspec import hookimpl
from ..patch import Patch

__all__ = ["ascend_patch_register_patches"]


@hookimpl
def ascend_patch_register_patches(settings: Settings) -> list[Patch]:
    from .processes import process_patches

    return process_patches(settings)
