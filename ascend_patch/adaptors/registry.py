"""The registry plugins add their patch records to (``ascend_patch_register_patches``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ..config import Settings
from ..hookspec import Target
from ..patch import Patch
from .appliers import applier_for

__all__ = ["PatchConflict", "PatchRegistry"]


class PatchConflict(RuntimeError):
    """Two patches claim the same target."""


class PatchRegistry:
    """What plugins add their patches to; satisfies :class:`ascend_patch.hookspec.PatchSink`.

    ``owner`` is the plugin whose hook is running (the plugin manager says so before
    each call); a patch without an owner gets it. Two patches claiming one target are
    recorded in :attr:`conflicts`, naming both plugins.
    """

    def __init__(self, backend: Target, settings: Settings | None = None) -> None:
        self.backend = backend
        self.settings = settings if settings is not None else Settings()
        self.owner = ""
        self._patches: dict[str, Patch] = {}
        self.conflicts: list[str] = []

    def add(self, patch: Patch) -> None:
        """Add one patch; ignored when it is not for this target. A record no applier knows raises."""
        applier_for(patch)  # TypeError now, in the plugin's hook (recorded as its failure), not at apply
        if self.backend.name not in patch.backends:
            return
        if not patch.owner:
            patch = dataclasses.replace(patch, owner=self.owner)
        existing = self._patches.get(patch.target)
        if existing is not None:
            self.conflicts.append(
                f"two patches claim {patch.target}: plugin {existing.owner!r} ({existing.reason}) "
                f"and plugin {patch.owner!r} ({patch.reason}); disable one with "
                "ASCEND_PATCH_DISABLE_PLUGINS")
            return
        self._patches[patch.target] = patch

    def extend(self, patches: Iterable[Patch]) -> None:
        """Add each of ``patches``."""
        for patch in patches:
            self.add(patch)

    def patches(self) -> list[Patch]:
        return list(self._patches.values())
