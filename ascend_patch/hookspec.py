"""Every pluggy hook ascend_patch calls: the one contract between it and its plugins.

A plugin is any module or object with functions marked ``@hookimpl`` whose names
are those below. Built-in plugins register through the same path as third-party
ones, which are found through the entry-point group ``ascend_patch``::

    [project.entry-points.ascend_patch]
    myfamily = "myfamily_plugin"

All hooks collect results from every plugin (none is ``firstresult``); a plugin
that raises is reported with its name and does not stop the others.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .backend import Backend

__all__ = ["PROJECT", "hookimpl", "hookspec", "AscendPatchSpec"]

PROJECT = "ascend_patch"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class AscendPatchSpec:
    """The hook specifications."""

    @hookspec
    def ascend_patch_register_patches(self, registry: Any, backend: Backend) -> None:
        """Add :class:`ascend_patch.patch.Patch` records with ``registry.add(patch)``.

        Called once per ``apply()``, after the target is chosen, for every plugin.
        ``backend`` is the target; declare per-target behaviour with
        ``Patch.backends`` or by looking at ``backend.name``. Two plugins claiming
        one target is an error naming both.
        """

    @hookspec
    def ascend_patch_model_specs(self) -> Iterable[Any]:
        """Return model specs (:class:`ascend_patch.models.registry.ModelSpec`).

        Called when a spec is first looked up (``--spec``, the converter, ``args``).
        Names and aliases must be unique across all plugins.
        """

    @hookspec
    def ascend_patch_checkpoint_loaders(self) -> Iterable[Any]:
        """Return checkpoint loaders (:class:`ascend_patch.loaders.formats.CheckpointLoader`).

        Called when the converter first resolves a ``--loader``/``--load-model-type`` name.
        """

    @hookspec
    def ascend_patch_checkpoint_savers(self) -> Iterable[Any]:
        """Return checkpoint savers (:class:`ascend_patch.loaders.formats.CheckpointSaver`).

        Called when the converter first resolves a ``--saver``/``--save-model-type`` name.
        """
