"""Every pluggy hook ascend_patch calls: the one contract between it and its plugins.

A plugin is any module or object with functions marked ``@hookimpl`` whose names
are those below. Built-in plugins register through the same path as third-party
ones, which are found through the entry-point group ``ascend_patch``::

    [project.entry-points.ascend_patch]
    myfamily = "myfamily_plugin"

All hooks collect results from every plugin (none is ``firstresult``). ascend_patch
calls each plugin separately through pluggy, so a plugin that raises is reported with
its name and does not stop the others, and ``@hookimpl(wrapper=True)`` (or
``hookwrapper=True``) plugins wrap each plugin's call. Hook arguments are typed with
the Protocols below, which ascend_patch's own classes satisfy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import pluggy

if TYPE_CHECKING:
    import torch

    from .config import Settings
    from .patch import Patch

__all__ = [
    "PROJECT",
    "AscendPatchSpec",
    "CheckpointFormat",
    "FlagRuleLike",
    "KernelLookup",
    "ModelSpecLike",
    "PackageVersion",
    "PatchSink",
    "Target",
    "hookimpl",
    "hookspec",
]

PROJECT = "ascend_patch"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- what hooks receive and return (ascend_patch's own classes satisfy these) -----------------

class KernelLookup(Protocol):
    """The target's fused kernels by name (:class:`ascend_patch.backend.KernelTable`)."""

    def get(self, name: str) -> Callable[..., Any] | None: ...

    def names(self) -> list[str]: ...

    def __contains__(self, name: object) -> bool: ...


class Target(Protocol):
    """The target a process is patched for (:class:`ascend_patch.backend.Backend`)."""

    name: str  # "npu" or "cpu"
    device_type: str  # what "cuda" becomes in a torch.device
    dist_backend: str  # what "nccl" becomes: "hccl" or "gloo"
    device_module: Any  # shaped like torch.cuda: torch.npu, or the cpu target's emulation
    kernels: KernelLookup
    keeps_index: bool  # cuda:N -> npu:N keeps N; the cpu target has one device
    reason: str

    def device(self, index: int | None = None) -> torch.device:
        """The torch.device that ``cuda`` / ``cuda:index`` becomes on this target."""
        ...


class PackageVersion(NamedTuple):
    """A package's version as the process uses it, and where that was read."""

    version: str
    origin: str  # "installed distribution", or e.g. "checkout /src/megatron/core, shadows the wheel 0.16.1"


class PatchSink(Protocol):
    """The manager's registry, which old-style ``ascend_patch_register_patches`` hooks add to (deprecated)."""

    backend: Target
    settings: Settings

    def add(self, patch: Patch) -> None:
        """Add one patch (ignored when ``patch.backends`` excludes the target)."""
        ...

    def extend(self, patches: Iterable[Patch]) -> None:
        """Add each of ``patches``."""
        ...


class ModelSpecLike(Protocol):
    """A model family (:class:`ascend_patch.models.registry.ModelSpec`)."""

    @property
    def name(self) -> str: ...

    @property
    def aliases(self) -> tuple[str, ...]: ...


class CheckpointFormat(Protocol):
    """A checkpoint loader or saver (:mod:`ascend_patch.loaders.formats`), found by name or alias."""

    name: str
    aliases: tuple[str, ...]


class FlagRuleLike(Protocol):
    """One entry of the MindSpeed-LLM migration table (:class:`ascend_patch.migrate.FlagRule`)."""

    flag: str  # "--padded-vocab-size", or an environment variable ("HCCL_*" patterns allowed)
    megatron: str  # the megatron-core releases it is true for: a fact of ascend_patch.migrate.facts, or a PEP 440 range
    mindspeed_llm: str  # PEP 440 range of the MindSpeed-LLM releases whose flag it describes


class AscendPatchSpec:
    """The hook specifications."""

    @hookspec(warn_on_impl_args={"registry": DeprecationWarning(
        "ascend_patch_register_patches(registry=...) is deprecated: return the patches instead "
        "(registry.add/extend still work in this release)")})
    def ascend_patch_register_patches(self, backend: Target, settings: Settings,
                                      registry: PatchSink) -> Iterable[Patch] | None:
        """Return the patch records (:mod:`ascend_patch.patch`) this plugin adds for ``backend``.

        Called once per ``apply()``, after the target is chosen, for every plugin. Declare
        per-target behaviour with ``Patch.backends`` or by looking at ``backend.name``;
        ``settings`` are the ones being applied. Two ``Wrap`` records on one target compose
        (the one collected first is innermost; plugins are called in pluggy's order); any other
        pair claiming one target is an error naming both plugins. ``registry`` is deprecated.
        """

    @hookspec
    def ascend_patch_package_version(self, package: str) -> PackageVersion | None:
        """The version of distribution ``package`` this process will use, or None (not this plugin's).

        Asked once per ``apply()`` for each package a patch's ``versions``/``needed`` range names,
        before the installed distribution's metadata, which a source checkout first on
        ``sys.path`` makes wrong. The first answer that is not None wins.
        """

    @hookspec
    def ascend_patch_model_specs(self) -> Iterable[ModelSpecLike]:
        """Return model specs (:class:`ascend_patch.models.registry.ModelSpec`).

        Called when a spec is first looked up (``--spec``, the converter, ``args``).
        Names and aliases must be unique across all plugins.
        """

    @hookspec
    def ascend_patch_checkpoint_loaders(self) -> Iterable[CheckpointFormat]:
        """Return checkpoint loaders (:class:`ascend_patch.loaders.formats.CheckpointLoader`).

        Called when the converter first resolves a ``--loader``/``--load-model-type`` name.
        """

    @hookspec
    def ascend_patch_checkpoint_savers(self) -> Iterable[CheckpointFormat]:
        """Return checkpoint savers (:class:`ascend_patch.loaders.formats.CheckpointSaver`).

        Called when the converter first resolves a ``--saver``/``--save-model-type`` name.
        """

    @hookspec
    def ascend_patch_migrate_flags(self) -> Iterable[FlagRuleLike]:
        """Return rules for the MindSpeed-LLM migration table (:class:`ascend_patch.migrate.FlagRule`).

        Called when ``ascend-patch migrate`` runs and when Megatron-LM parses a command line that
        stock Megatron-LM would reject (the in-process translation). Every plugin's rules are used:
        for a flag, the first rule whose releases and values match wins, and third-party rules come
        before the built-in table, so a plugin can add a flag, a newer release, or correct an entry.
        """
